//! The GCP adapter's settings: lineage, endpoint, project and the credential found.

use super::auth::{self, GoogleCredential};
use super::{ENDPOINT_ENV, PROJECT_ENV};
use crate::provider::Lineage;

/// Configuration of the GCP adapter.
#[derive(Debug, Clone)]
pub struct GcpSettings {
    /// The state's lineage: the identity rule reads listings against it.
    pub lineage: Lineage,
    /// API root override; `None` means [`DEFAULT_ENDPOINT`](super::DEFAULT_ENDPOINT).
    pub endpoint: Option<String>,
    /// The project every call is about; `None`: `plan` works from the catalog alone and
    /// every other call is `InvalidRequest`.
    pub project: Option<String>,
    /// The credential found; `None`: calls fail with `Credentials`.
    pub credential: Option<GoogleCredential>,
    /// Every place looked at, for the report and the message.
    pub looked_in: Vec<String>,
    /// Why the credential found cannot be used (a file that is not a credential).
    pub unusable: Option<String>,
}

impl GcpSettings {
    /// Settings with `credential` (found at its source) and nothing else looked at, for
    /// callers that hold a credential already.
    pub fn with_credential(
        lineage: Lineage,
        endpoint: Option<String>,
        project: Option<String>,
        credential: Option<GoogleCredential>,
    ) -> GcpSettings {
        let project = project.or_else(|| {
            credential
                .as_ref()
                .and_then(|c| c.project().map(str::to_string))
        });
        GcpSettings {
            lineage,
            endpoint,
            project,
            credential,
            looked_in: vec![],
            unusable: None,
        }
    }

    /// Settings from `[cloud.gcp]` (`endpoint`, `project`) and the environment (see the
    /// module docs for the precedence). Reads the credential file it finds; dials nothing.
    pub fn from_env_and_config(
        endpoint: Option<String>,
        project: Option<String>,
        lineage: Lineage,
    ) -> GcpSettings {
        let env = |k: &str| crate::provider::env_nonempty(k);
        let adc = auth::adc_path(env(auth::CLOUDSDK_CONFIG_ENV));
        let found = auth::find(env, adc.as_deref(), auth::on_compute_engine());
        let (credential, unusable) = match found.credential {
            Ok(c) => (c, None),
            Err(why) => (None, Some(why)),
        };
        let project = project
            .filter(|p| !p.trim().is_empty())
            .or_else(|| env(PROJECT_ENV));
        GcpSettings {
            looked_in: found.looked_in,
            unusable,
            ..GcpSettings::with_credential(
                lineage,
                crate::provider::endpoint_from(ENDPOINT_ENV, endpoint),
                project,
                credential,
            )
        }
    }
}
