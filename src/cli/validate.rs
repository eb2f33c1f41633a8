//! `gpuprov validate [-json]`: checks the config and reports which clouds are usable and
//! which machines no cloud offers anything for. Exit 1 when a cloud is unusable.

use std::collections::BTreeMap;

use super::args::ValidateArgs;
use super::error::{CmdResult, CommandError, Exit};
use super::preflight::preflight;
use super::project::Project;
use super::providers::{build_providers, docker_provider};
use super::view::json::{CloudCheck, JsonValidate};
use crate::config::Cloud;
use crate::provider::kit::CredentialReport;
use crate::provider::Lineage;

pub(super) async fn run(project: &Project, a: &ValidateArgs) -> CmdResult {
    let config = project.load_config()?;
    // Without a state yet (validate before the first apply) nothing is labelled, so any
    // lineage serves the credential and reachability checks.
    let lineage = project
        .open_state()
        .ok()
        .and_then(|(_, s)| Lineage::parse(&s.lineage).ok())
        .unwrap_or_else(Lineage::random);
    let providers = build_providers(&config, &lineage);
    let mut clouds = Vec::new();
    for cloud in config.clouds_in_use() {
        let (usable, detail) = match providers.get(cloud.as_str()) {
            Some(_) if cloud == Cloud::Docker => {
                match docker_provider(Some(&config), &lineage).ping().await {
                    Ok(where_) => (
                        true,
                        format!("usable (Docker Engine at {where_}; no credentials needed)"),
                    ),
                    Err(e) => (false, format!("NOT usable: {}", e.text())),
                }
            }
            Some(p) => match p.credentials().await {
                CredentialReport::Found(at) => (true, format!("credential found in {at}")),
                CredentialReport::NotNeeded(why) => (true, format!("adapter available ({why})")),
                CredentialReport::Missing(looked) => (
                    false,
                    format!(
                        "NO credential ({})",
                        crate::provider::kit::credentials::looked_in(&looked)
                    ),
                ),
            },
            None => (false, "no adapter in this build of gpuprov".to_string()),
        };
        clouds.push(CloudCheck {
            cloud: cloud.to_string(),
            usable,
            detail,
        });
    }
    let pre = preflight(&config, &providers).await?;
    let valid = clouds.iter().all(|c| c.usable);
    let exit = if valid { Exit::Success } else { Exit::Failure };
    if a.json.json {
        let out = JsonValidate {
            config: project.config_path.display().to_string(),
            valid,
            machines: config.vms.len(),
            clouds,
            notes: pre.notes,
            no_offers: pre.no_offers.into_iter().collect::<BTreeMap<_, _>>(),
        };
        outln!(
            "{}",
            serde_json::to_string_pretty(&out).map_err(CommandError::internal)?
        );
        return Ok(exit);
    }
    let n = config.vms.len();
    outln!(
        "{}: valid ({n} machine{})",
        project.config_path.display(),
        if n == 1 { "" } else { "s" }
    );
    for c in &clouds {
        outln!("  {}: {}", c.cloud, c.detail);
    }
    pre.notes.iter().for_each(|n| outln!("  note: {n}"));
    // A machine no cloud offers anything for cannot be created (a running one is kept).
    for (vm, why) in &pre.no_offers {
        outln!("  vm.{vm}: NO offers on any of its clouds:");
        for n in why {
            outln!("    {}: {}: {}", n.cloud, n.reason.as_str(), n.detail);
        }
    }
    Ok(exit)
}
