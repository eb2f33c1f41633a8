//! The cloud registry: one row per cloud gpuprov knows (its name as spelled in
//! `gpuprov.toml`, its `[cloud.NAME]` settings type, and the factory that builds its
//! adapter), from which [`Cloud`] (the config's cloud names), [`Cloud::ALL`] and
//! [`Cloud::in_this_build`] are derived.
//!
//! Adding a cloud = its folder `provider/clouds/<cloud>/` + one row in [`clouds!`] below (+ its
//! conformance driver in the tests). A row without a factory is a cloud the config
//! accepts but this build cannot reach yet (`plan` says so).

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::provider::{CloudProvider, Lineage};

/// `[cloud.NAME]`: settings of one cloud.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CloudSettings {
    /// API base URL override (also `GPUPROV_<CLOUD>_ENDPOINT`; for AWS, `AWS_ENDPOINT_URL`).
    /// For docker, the Docker Engine address (for example `unix:///var/run/docker.sock`).
    pub endpoint: Option<String>,
    /// Docker only: image the sshd image is built from (default
    /// `gpuprov/debian-sshd-base:bookworm`, made by `scripts/build-base-image.sh`).
    pub base_image: Option<String>,
    /// GCP only: the project every call is about (else `GOOGLE_CLOUD_PROJECT`, else the
    /// credential's own project).
    pub project: Option<String>,
    /// Nebius only: the project of each region, `{ eu-north1 = "project-e00…" }` (a Nebius
    /// project lives in one region; gpuprov creates in the project of the offer's region).
    pub projects: Option<std::collections::BTreeMap<String, String>>,
    /// Keep this cloud's shared objects (the project SSH key; Hyperstack's environment
    /// per region) after the last machine using them is destroyed: gpuprov then neither
    /// deletes them nor drops their state records, and the next apply uses them again.
    /// Default `false`: a shared object gpuprov created goes with its last machine (one
    /// that existed before gpuprov, found by value, is never deleted either way).
    pub keep_shared: Option<bool>,
}

/// Builds one cloud's adapter from its `[cloud.NAME]` settings (plus the environment, which
/// each adapter reads for its credentials and endpoint override) and the state's lineage.
/// Does no I/O.
pub type Factory = fn(&CloudSettings, Lineage) -> Arc<dyn CloudProvider>;

macro_rules! clouds {
    ($( $(#[$doc:meta])* $variant:ident => $name:literal, $settings:ty, $factory:expr; )*) => {
        /// A cloud gpuprov knows, spelled as in `gpuprov.toml`.
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
            JsonSchema,
        )]
        #[serde(rename_all = "lowercase")]
        pub enum Cloud {
            $( $(#[$doc])* $variant, )*
        }

        impl Cloud {
            /// Every cloud gpuprov knows, in registry order.
            pub const ALL: &'static [Cloud] = &[$(Cloud::$variant),*];

            /// The name as spelled in `gpuprov.toml` (`[cloud.NAME]`, `clouds = [...]`).
            pub fn as_str(self) -> &'static str {
                match self { $(Cloud::$variant => $name,)* }
            }

            /// The factory of this cloud's adapter; `None` when this build has none.
            pub fn factory(self) -> Option<Factory> {
                match self { $(Cloud::$variant => $factory,)* }
            }

            /// The name of the `[cloud.NAME]` settings type (for docs and diagnostics).
            pub fn settings_type(self) -> &'static str {
                match self { $(Cloud::$variant => stringify!($settings),)* }
            }
        }
    };
}

clouds! {
    Aws => "aws", CloudSettings, Some(|s, lineage| {
        Arc::new(crate::provider::clouds::aws::AwsProvider::new(crate::provider::clouds::aws::AwsSettings::from_env_and_config(
            s.endpoint.clone(),
            lineage,
        )))
    });
    Gcp => "gcp", CloudSettings, Some(|s, lineage| {
        use crate::provider::clouds::gcp::{GcpProvider, GcpSettings};
        Arc::new(GcpProvider::new(GcpSettings::from_env_and_config(
            s.endpoint.clone(),
            s.project.clone(),
            lineage,
        )))
    });
    Massedcompute => "massedcompute", CloudSettings, Some(|s, lineage| {
        use crate::provider::clouds::massedcompute::{MassedComputeProvider, MassedComputeSettings};
        Arc::new(MassedComputeProvider::new(MassedComputeSettings::from_env_and_config(
            s.endpoint.clone(),
            lineage,
        )))
    });
    Hyperstack => "hyperstack", CloudSettings, Some(|s, lineage| {
        use crate::provider::clouds::hyperstack::{HyperstackProvider, HyperstackSettings};
        Arc::new(HyperstackProvider::new(HyperstackSettings::from_env_and_config(
            s.endpoint.clone(),
            lineage,
        )))
    });
    Lambda => "lambda", CloudSettings, Some(|s, lineage| {
        use crate::provider::clouds::lambda::{LambdaProvider, LambdaSettings};
        Arc::new(LambdaProvider::new(LambdaSettings::from_env_and_config(
            s.endpoint.clone(),
            lineage,
        )))
    });
    Digitalocean => "digitalocean", CloudSettings, Some(|s, lineage| {
        use crate::provider::clouds::digitalocean::{DigitalOceanProvider, DigitalOceanSettings};
        Arc::new(DigitalOceanProvider::new(DigitalOceanSettings::from_env_and_config(
            s.endpoint.clone(),
            lineage,
        )))
    });
    Nebius => "nebius", CloudSettings, Some(|s, lineage| {
        use crate::provider::clouds::nebius::{NebiusProvider, NebiusSettings};
        Arc::new(NebiusProvider::new(NebiusSettings::from_env_and_config(
            s.endpoint.clone(),
            s.projects.clone().unwrap_or_default(),
            lineage,
        )))
    });
    Verda => "verda", CloudSettings, Some(|s, lineage| {
        use crate::provider::clouds::verda::{VerdaProvider, VerdaSettings};
        Arc::new(VerdaProvider::new(VerdaSettings::from_env_and_config(
            s.endpoint.clone(),
            lineage,
        )))
    });
    Primeintellect => "primeintellect", CloudSettings, Some(|s, lineage| {
        use crate::provider::clouds::primeintellect::{PrimeIntellectProvider, PrimeIntellectSettings};
        Arc::new(PrimeIntellectProvider::new(PrimeIntellectSettings::from_env_and_config(
            s.endpoint.clone(),
            lineage,
        )))
    });
    Runpod => "runpod", CloudSettings, Some(|s, lineage| {
        use crate::provider::clouds::runpod::{RunpodProvider, RunpodSettings};
        Arc::new(RunpodProvider::new(RunpodSettings::from_env_and_config(
            s.endpoint.clone(),
            lineage,
        )))
    });
    /// The local Docker test cloud: containers with sshd, no GPUs, no Kubernetes.
    Docker => "docker", CloudSettings, Some(|s, lineage| {
        use crate::provider::clouds::docker::{DockerProvider, DockerSettings};
        Arc::new(DockerProvider::new(DockerSettings::from_env_and_config(
            s.endpoint.clone(),
            s.base_image.clone(),
            lineage,
        )))
    });
}

impl Cloud {
    /// The clouds this build has an adapter for, in registry order.
    pub fn in_this_build() -> impl Iterator<Item = Cloud> {
        Cloud::ALL.iter().copied().filter(|c| c.factory().is_some())
    }

    /// The cloud named `name` (as spelled in config), if gpuprov knows it.
    pub fn from_name(name: &str) -> Option<Cloud> {
        Cloud::ALL.iter().copied().find(|c| c.as_str() == name)
    }

    /// Every known name, comma-separated (for "known clouds: …" hints).
    pub fn known_names() -> String {
        Cloud::ALL
            .iter()
            .map(|c| c.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The adapter of this cloud for `settings` and `lineage`; `None` when this build has
    /// none.
    pub fn build(
        self,
        settings: &CloudSettings,
        lineage: Lineage,
    ) -> Option<Arc<dyn CloudProvider>> {
        self.factory().map(|f| f(settings, lineage))
    }
}

impl std::fmt::Display for Cloud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_is_spelled_as_serde_spells_it() {
        for c in Cloud::ALL {
            let json = serde_json::to_value(c).unwrap();
            assert_eq!(json, c.as_str(), "{c:?}");
            assert_eq!(Cloud::from_name(c.as_str()), Some(*c));
        }
        assert_eq!(Cloud::from_name("nimbus"), None);
    }

    #[test]
    fn every_factory_builds_an_adapter_of_its_own_name() {
        let lineage = Lineage::parse("0f0e0d0c-1111-4222-8333-444455556666").unwrap();
        let built: Vec<Cloud> = Cloud::in_this_build().collect();
        assert!(built.contains(&Cloud::Docker) && built.contains(&Cloud::Aws));
        for c in built {
            let p = c.build(&CloudSettings::default(), lineage.clone()).unwrap();
            assert_eq!(p.name(), c.as_str());
        }
    }
}
