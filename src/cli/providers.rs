//! The adapters of a run, built only by the cloud registry (`provider::clouds::registry`,
//! `Cloud::build`): one for each cloud the config uses or the state records (a machine
//! whose cloud left the config is torn down all the same).

use std::collections::BTreeSet;

use crate::config::{Cloud, CloudTables, Config};
use crate::machine::Providers;
use crate::plan;
use crate::provider::clouds::docker::{DockerProvider, DockerSettings};
use crate::provider::Lineage;
use crate::state::StateFile;

#[cfg(feature = "test-doubles")]
use super::fake_cloud;

/// The Docker adapter itself (not behind the registry's limits), for `validate`'s ping.
pub(super) fn docker_provider(config: Option<&Config>, lineage: &Lineage) -> DockerProvider {
    let s = config
        .and_then(|c| c.clouds.docker.clone())
        .unwrap_or_default();
    DockerProvider::new(DockerSettings::from_env_and_config(
        s.endpoint,
        s.base_image,
        lineage.clone(),
    ))
}

/// The adapters of the clouds the config uses (those this build has), from the cloud
/// registry (`provider::clouds::registry`). A run that may touch what the state records adds
/// those clouds' adapters with [`add_recorded_clouds`].
pub(super) fn build_providers(config: &Config, lineage: &Lineage) -> Providers {
    #[cfg(feature = "test-doubles")]
    if fake_cloud::enabled() {
        let mut p = fake_cloud::providers(config);
        keep_shared_of(config, &mut p);
        return p;
    }
    let mut p = Providers::new();
    for cloud in config.clouds_in_use() {
        if let Some(adapter) = cloud.build(&config.clouds, lineage.clone()) {
            p.insert(adapter);
        }
    }
    keep_shared_of(config, &mut p);
    p
}

/// Adds to `p` the adapter of each cloud of `recorded` (clouds the state holds something
/// on: [`recorded_clouds`]) that it lacks, from the registry: a machine whose cloud left
/// the config, or a `destroy` without a config, is torn down all the same. Its settings
/// are the config's `[cloud.NAME]` when there is one, else the defaults; the environment
/// (endpoint override, credentials) applies either way, as for any adapter. A name this
/// build has no adapter for is skipped: teardown then reports the machine leaked, naming
/// the cloud.
pub(super) fn add_recorded_clouds(
    p: &mut Providers,
    config: Option<&Config>,
    recorded: impl IntoIterator<Item = String>,
    lineage: &Lineage,
) {
    for name in recorded {
        if p.get(&name).is_some() {
            continue;
        }
        let Some(cloud) = Cloud::from_name(&name) else {
            continue;
        };
        #[cfg(feature = "test-doubles")]
        if fake_cloud::enabled() {
            p.insert(fake_cloud::provider(cloud));
            continue;
        }
        let none = CloudTables::default();
        let tables = config.map_or(&none, |c| &c.clouds);
        if let Some(adapter) = cloud.build(tables, lineage.clone()) {
            p.insert(adapter);
        }
    }
    if let Some(config) = config {
        keep_shared_of(config, p);
    }
}

/// The clouds `state` holds something on: those of its machine records (decoded in
/// `ahead`) and of its shared objects (`shared.<cloud>.…`), by name.
pub(super) fn recorded_clouds(state: &StateFile, ahead: &plan::ReadAhead<'_>) -> BTreeSet<String> {
    let mut out = ahead.clouds();
    out.extend(shared_clouds(state));
    out
}

/// The clouds of `state`'s shared objects, by name (from their addresses).
pub(super) fn shared_clouds(state: &StateFile) -> impl Iterator<Item = String> + '_ {
    state
        .shared
        .keys()
        .filter_map(|a| crate::provider::SharedObject::parse(a))
        .map(|o| o.cloud)
}

/// Marks the clouds set to `keep_shared` in any `[cloud.NAME]` section, also one no
/// machine uses any more (its objects are then exactly what destroy would release), as
/// the plan reads it.
pub(super) fn keep_shared_of(config: &Config, p: &mut Providers) {
    for cloud in config.clouds.present() {
        if config.clouds.common(cloud).keep_shared {
            p.keep_shared(cloud.as_str());
        }
    }
}

/// The "available clouds" hint for diagnostics.
pub(super) fn clouds_in_this_build() -> String {
    Cloud::in_this_build()
        .map(|c| c.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
