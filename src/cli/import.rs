//! `gpuprov import vm.NAME CLOUD/REGION/INSTANCE_ID`: adopts an instance created outside
//! gpuprov (Terraform's `import`). The instance must be in one of the machine's clouds and
//! regions; the adapter gives it the machine's identity where the cloud allows
//! ([`CloudProvider::import`](crate::provider::CloudProvider::import)), and the state records
//! it as *found*, not created: `apply` takes it over once it runs and accepts the project
//! key, and only `destroy` deletes it.

use miette::miette;

use crate::provider::Location;
use crate::state::{MachineRecord, ResourceRecord};
use crate::vm::LaunchState;

use super::args::{Cli, ImportArgs};
use super::error::{CmdResult, Exit};
use super::project::{lineage_of, Project};
use super::providers::build_providers;

pub(super) async fn run(cli: &Cli, project: &Project, a: &ImportArgs) -> CmdResult {
    let config = project.load_config()?;
    let name = a.address.strip_prefix("vm.").unwrap_or("");
    let Some(vm) = config.vms.get(name) else {
        return Err(miette!(
            code = "gpuprov::import::address",
            help = format!(
                "machines in the config: {}",
                config
                    .vms
                    .keys()
                    .map(|n| format!("vm.{n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "{} is not a machine of {} (addresses are vm.NAME)",
            a.address,
            project.config_path.display()
        )
        .into());
    };
    let mut parts = a.id.splitn(3, '/');
    let (Some(cloud), Some(region), Some(id)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(miette!(
            code = "gpuprov::import::id",
            help = "for example docker/local/3f2a1b7c9d0e",
            "{:?} is not CLOUD/REGION/INSTANCE_ID",
            a.id
        )
        .into());
    };
    if id.is_empty() || !vm.clouds.iter().any(|c| c.as_str() == cloud) {
        return Err(miette!(
            code = "gpuprov::import::cloud",
            help = format!(
                "vm.{name} runs on: {}",
                vm.clouds
                    .iter()
                    .map(|c| c.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "{} is not one of vm.{name}'s clouds (or the id is empty)",
            cloud
        )
        .into());
    }
    if !vm.regions.is_empty() && !vm.regions.iter().any(|r| r == region) {
        return Err(miette!(
            code = "gpuprov::import::region",
            help = format!("vm.{name}'s regions: {}", vm.regions.join(", ")),
            "{region} is not one of vm.{name}'s regions"
        )
        .into());
    }
    let _lock = project.lock("import", cli.lock_timeout)?;
    let (mut store, mut state) = project.open_state()?;
    if let Some(r) = state.resources.get(&a.address) {
        return Err(miette!(
            code = "gpuprov::import::exists",
            help = "`gpuprov state rm` forgets it (without destroying it) before an import",
            "{} is already in the state ({})",
            a.address,
            r.machine.label
        )
        .into());
    }
    let providers = build_providers(&config, &lineage_of(&state)?);
    let Some(p) = providers.get(cloud) else {
        return Err(miette!("no adapter for cloud {cloud} in this build").into());
    };
    let at = Location {
        cloud: cloud.to_string(),
        region: region.to_string(),
        zone: None,
    };
    let imported = p.import(&at, name, id).await.map_err(|e| {
        let help = e
            .help
            .clone()
            .unwrap_or_else(|| "check the id with the cloud's console or CLI".into());
        miette!(
            code = "gpuprov::import::refused",
            help = help,
            "cannot import {} as {}: {}",
            a.id,
            a.address,
            e.msg
        )
    })?;
    let instance_id = imported.observed.instance_id.clone();
    let found = LaunchState::Unowned {
        location: at.clone(),
        instance_ids: vec![instance_id.clone()],
        reason: format!(
            "imported ({}); apply takes it over once it runs and accepts the project key",
            imported.identity
        ),
    };
    let mut record = ResourceRecord::new(MachineRecord {
        kind: crate::record::LAUNCH.to_string(),
        state: crate::state::JsonText::encode(&found).map_err(|e| miette!("{e}"))?,
        label: "unowned: imported".into(),
        updated_at: chrono::Utc::now(),
    });
    record.push_event(format!("imported {instance_id} at {at}"));
    state.resources.insert(a.address.clone(), record);
    store.save(&mut state)?;
    outln!(
        "{}: imported {} at {} ({:?}); its identity: {}.",
        a.address,
        instance_id,
        at,
        imported.observed.status,
        imported.identity
    );
    outln!(
        "It is recorded as found, not created by gpuprov: `gpuprov apply` takes it over once \
         it runs and accepts the project key (until then it is left as it is), and only \
         `gpuprov destroy` deletes it."
    );
    Ok(Exit::Success)
}
