//! The cloud registry: one row per cloud gpuprov knows (its name as spelled in
//! `gpuprov.toml`, its own `[cloud.NAME]` settings type with the keys only it takes, and
//! the factory that builds its adapter), from which [`Cloud`] (the config's cloud names),
//! [`Cloud::ALL`], [`Cloud::in_this_build`] and [`CloudTables`] (the config's `[cloud]`
//! table) are derived.
//!
//! Adding a cloud = its folder `provider/clouds/<cloud>/` + one row in [`clouds!`] below (+ its
//! conformance driver in the tests). A row without a factory is a cloud the config
//! accepts but this build cannot reach yet (`plan` says so).

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::provider::{CloudProvider, Lineage};

/// The `[cloud.NAME]` keys every cloud takes, as the core reads them (the adapter reads
/// its own table whole through its factory).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommonSettings<'a> {
    /// `endpoint`: the API base URL override (redacted before it is shown).
    pub endpoint: Option<&'a str>,
    /// `keep_shared`: the cloud's shared objects outlive its last machine.
    pub keep_shared: bool,
}

macro_rules! clouds {
    ($(
        $(#[$doc:meta])*
        $variant:ident => $name:ident, $settings:ident {
            $( $(#[$field_doc:meta])* $field:ident : $field_ty:ty, )*
        }, $factory:expr;
    )*) => {
        /// A cloud gpuprov knows, spelled as in `gpuprov.toml`.
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
            JsonSchema,
        )]
        #[serde(rename_all = "lowercase")]
        pub enum Cloud {
            $( $(#[$doc])* $variant, )*
        }

        $(
            #[doc = concat!("`[cloud.", stringify!($name), "]`: the settings of ", stringify!($name),
                " (`endpoint` and `keep_shared`, as every cloud, and its own keys); any other key is a config error.")]
            #[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
            #[serde(deny_unknown_fields)]
            pub struct $settings {
                /// API base URL override (also `GPUPROV_<CLOUD>_ENDPOINT`; for AWS,
                /// `AWS_ENDPOINT_URL`). For docker, the Docker Engine address (for example
                /// `unix:///var/run/docker.sock`).
                #[serde(default, skip_serializing_if = "Option::is_none")]
                pub endpoint: Option<String>,
                /// Keep this cloud's shared objects (the project SSH key; Hyperstack's
                /// environment per region) after the last machine using them is destroyed:
                /// gpuprov then neither deletes them nor drops their state records, and the
                /// next apply uses them again. Default `false`: a shared object gpuprov
                /// created goes with its last machine (one that existed before gpuprov, found
                /// by value, is never deleted either way).
                #[serde(default, skip_serializing_if = "Option::is_none")]
                pub keep_shared: Option<bool>,
                $(
                    $(#[$field_doc])*
                    #[serde(default, skip_serializing_if = "Option::is_none")]
                    pub $field: $field_ty,
                )*
            }

            impl $settings {
                /// The keys this table takes, in declaration order (for diagnostics).
                pub const KEYS: &'static [&'static str] =
                    &["endpoint", "keep_shared" $(, stringify!($field))*];
            }
        )*

        /// `[cloud]`: one optional `[cloud.NAME]` table per cloud, each of its cloud's own
        /// type, so a key another cloud takes (`[cloud.lambda] project`) or an unknown
        /// cloud is a config error.
        #[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
        #[serde(deny_unknown_fields)]
        pub struct CloudTables {
            $(
                #[doc = concat!("`[cloud.", stringify!($name), "]`.")]
                #[serde(default, skip_serializing_if = "Option::is_none")]
                pub $name: Option<$settings>,
            )*
        }

        impl CloudTables {
            /// The common keys of `cloud`'s table (all unset when the config has none): the
            /// one accessor the core reads `endpoint` and `keep_shared` through.
            pub fn common(&self, cloud: Cloud) -> CommonSettings<'_> {
                match cloud {
                    $(Cloud::$variant => self.$name.as_ref().map(|s| CommonSettings {
                        endpoint: s.endpoint.as_deref(),
                        keep_shared: s.keep_shared == Some(true),
                    }),)*
                }
                .unwrap_or_default()
            }

            /// The clouds the config has a `[cloud.NAME]` table for, in registry order.
            pub fn present(&self) -> impl Iterator<Item = Cloud> + '_ {
                Cloud::ALL.iter().copied().filter(|c| match c {
                    $(Cloud::$variant => self.$name.is_some(),)*
                })
            }
        }

        impl Cloud {
            /// Every cloud gpuprov knows, in registry order.
            pub const ALL: &'static [Cloud] = &[$(Cloud::$variant),*];

            /// The name as spelled in `gpuprov.toml` (`[cloud.NAME]`, `clouds = [...]`).
            pub fn as_str(self) -> &'static str {
                match self { $(Cloud::$variant => stringify!($name),)* }
            }

            /// Whether this build has an adapter (a factory) for this cloud.
            pub fn has_adapter(self) -> bool {
                match self {
                    $(Cloud::$variant => {
                        let own: Option<fn(&$settings, Lineage) -> Arc<dyn CloudProvider>> =
                            $factory;
                        own.is_some()
                    })*
                }
            }

            /// The adapter of this cloud, built by its factory from its own table of
            /// `tables` (its defaults when the config has none; the adapter reads the
            /// environment for its credentials and endpoint override) for the state of
            /// `lineage`; `None` when this build has no adapter for it. Does no I/O.
            pub fn build(
                self,
                tables: &CloudTables,
                lineage: Lineage,
            ) -> Option<Arc<dyn CloudProvider>> {
                match self {
                    $(Cloud::$variant => {
                        let own: Option<fn(&$settings, Lineage) -> Arc<dyn CloudProvider>> =
                            $factory;
                        own.map(|f| f(tables.$name.as_ref().unwrap_or(&Default::default()), lineage))
                    })*
                }
            }

            /// The name of the `[cloud.NAME]` settings type (for docs and diagnostics).
            pub fn settings_type(self) -> &'static str {
                match self { $(Cloud::$variant => stringify!($settings),)* }
            }

            /// The keys `[cloud.NAME]` takes for this cloud.
            pub fn settings_keys(self) -> &'static [&'static str] {
                match self { $(Cloud::$variant => $settings::KEYS,)* }
            }
        }
    };
}

clouds! {
    Aws => aws, AwsCloudSettings {}, Some(|s, lineage| {
        Arc::new(crate::provider::clouds::aws::AwsProvider::new(crate::provider::clouds::aws::AwsSettings::from_env_and_config(
            s.endpoint.clone(),
            lineage,
        )))
    });
    Gcp => gcp, GcpCloudSettings {
        /// The project every call is about (else `GOOGLE_CLOUD_PROJECT`, else the
        /// credential's own project).
        project: Option<String>,
    }, Some(|s, lineage| {
        use crate::provider::clouds::gcp::{GcpProvider, GcpSettings};
        Arc::new(GcpProvider::new(GcpSettings::from_env_and_config(
            s.endpoint.clone(),
            s.project.clone(),
            lineage,
        )))
    });
    Massedcompute => massedcompute, MassedComputeCloudSettings {}, Some(|s, lineage| {
        use crate::provider::clouds::massedcompute::{MassedComputeProvider, MassedComputeSettings};
        Arc::new(MassedComputeProvider::new(MassedComputeSettings::from_env_and_config(
            s.endpoint.clone(),
            lineage,
        )))
    });
    Hyperstack => hyperstack, HyperstackCloudSettings {}, Some(|s, lineage| {
        use crate::provider::clouds::hyperstack::{HyperstackProvider, HyperstackSettings};
        Arc::new(HyperstackProvider::new(HyperstackSettings::from_env_and_config(
            s.endpoint.clone(),
            lineage,
        )))
    });
    Lambda => lambda, LambdaCloudSettings {}, Some(|s, lineage| {
        use crate::provider::clouds::lambda::{LambdaProvider, LambdaSettings};
        Arc::new(LambdaProvider::new(LambdaSettings::from_env_and_config(
            s.endpoint.clone(),
            lineage,
        )))
    });
    Digitalocean => digitalocean, DigitalOceanCloudSettings {}, Some(|s, lineage| {
        use crate::provider::clouds::digitalocean::{DigitalOceanProvider, DigitalOceanSettings};
        Arc::new(DigitalOceanProvider::new(DigitalOceanSettings::from_env_and_config(
            s.endpoint.clone(),
            lineage,
        )))
    });
    Nebius => nebius, NebiusCloudSettings {
        /// The project of each region, `{ eu-north1 = "project-e00…" }` (a Nebius project
        /// lives in one region; gpuprov creates in the project of the offer's region).
        projects: Option<std::collections::BTreeMap<String, String>>,
    }, Some(|s, lineage| {
        use crate::provider::clouds::nebius::{NebiusProvider, NebiusSettings};
        Arc::new(NebiusProvider::new(NebiusSettings::from_env_and_config(
            s.endpoint.clone(),
            s.projects.clone().unwrap_or_default(),
            lineage,
        )))
    });
    Verda => verda, VerdaCloudSettings {}, Some(|s, lineage| {
        use crate::provider::clouds::verda::{VerdaProvider, VerdaSettings};
        Arc::new(VerdaProvider::new(VerdaSettings::from_env_and_config(
            s.endpoint.clone(),
            lineage,
        )))
    });
    Primeintellect => primeintellect, PrimeIntellectCloudSettings {}, Some(|s, lineage| {
        use crate::provider::clouds::primeintellect::{PrimeIntellectProvider, PrimeIntellectSettings};
        Arc::new(PrimeIntellectProvider::new(PrimeIntellectSettings::from_env_and_config(
            s.endpoint.clone(),
            lineage,
        )))
    });
    Runpod => runpod, RunpodCloudSettings {}, Some(|s, lineage| {
        use crate::provider::clouds::runpod::{RunpodProvider, RunpodSettings};
        Arc::new(RunpodProvider::new(RunpodSettings::from_env_and_config(
            s.endpoint.clone(),
            lineage,
        )))
    });
    /// The local Docker test cloud: containers with sshd, no GPUs, no Kubernetes.
    Docker => docker, DockerCloudSettings {
        /// The image the sshd image is built from (default
        /// `gpuprov/debian-sshd-base:bookworm`, made by `scripts/build-base-image.sh`).
        base_image: Option<String>,
    }, Some(|s, lineage| {
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
        Cloud::ALL.iter().copied().filter(|c| c.has_adapter())
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
            let p = c.build(&CloudTables::default(), lineage.clone()).unwrap();
            assert_eq!(p.name(), c.as_str());
        }
    }
}
