//! What every adapter states about itself, in one place: its cloud name, its endpoint
//! override (redacted), its declared capabilities and where its credential was found.
//! An adapter holds one [`Adapter`] and hands it to the contract through
//! [`CloudProvider::adapter`](super::super::CloudProvider::adapter), whose provided
//! methods (`name`, `endpoint_override`, `capabilities`, `credentials`) read it, so no
//! adapter repeats that plumbing.

use std::time::Duration;

use super::super::redact::redact_url;
use super::super::{Capabilities, ErrorKind, Feature, Gate, Lineage, ProviderError};
use super::credentials::{Credential, CredentialReport, Source};

/// An adapter's self-description (see the module docs). Built once at construction; it
/// holds no secret (the endpoint is redacted, the credential reduced to its place).
#[derive(Debug, Clone, PartialEq)]
pub struct Adapter {
    name: &'static str,
    endpoint: Option<String>,
    /// The declared capabilities (`with_capabilities` replaces them in tests).
    pub capabilities: Capabilities,
    credentials: CredentialReport,
    /// Where the core's rate limiter is installed; the adapter's clients share it.
    gate: Gate,
    /// The state's lineage the adapter works for: the identity rule
    /// ([`owner`](super::super::identity::owner)) reads listings against it.
    lineage: Option<Lineage>,
}

impl Adapter {
    /// Cloud `name` with the endpoint override `endpoint` (redacted here) and
    /// `capabilities`; it needs no credential until [`with_credential`](Self::with_credential).
    pub fn new(name: &'static str, endpoint: Option<&str>, capabilities: Capabilities) -> Adapter {
        Adapter {
            name,
            endpoint: endpoint.map(redact_url),
            capabilities,
            credentials: CredentialReport::NotNeeded("no credential needed".into()),
            gate: Gate::default(),
            lineage: None,
        }
    }

    /// The adapter working for the state of `lineage`.
    pub fn with_lineage(mut self, lineage: &Lineage) -> Self {
        self.lineage = Some(lineage.clone());
        self
    }

    /// The lineage the adapter works for. Errors: `InvalidRequest` when it was built
    /// without one (a defect of its constructor: listings cannot be judged).
    pub fn lineage(&self) -> Result<&Lineage, ProviderError> {
        self.lineage.as_ref().ok_or_else(|| {
            ProviderError::new(
                ErrorKind::InvalidRequest,
                format!("{}: adapter built without a lineage", self.name),
            )
        })
    }

    /// The report of a credential found (`Some`) or not, having looked in `looked_in`.
    pub fn with_credential(mut self, found: Option<&Credential>, looked_in: &[String]) -> Self {
        self.credentials = CredentialReport::of(found, looked_in);
        self
    }

    /// The report of a credential that a token source exchanges for tokens (GCP, Nebius):
    /// where it was `found`, else every place in `looked_in` and why the one found cannot
    /// be used (`unusable`, a malformed file).
    pub fn with_credential_at(
        mut self,
        found: Option<&Source>,
        looked_in: &[String],
        unusable: Option<&str>,
    ) -> Self {
        self.credentials = match found {
            Some(source) => CredentialReport::Found(source.to_string()),
            None => CredentialReport::Missing(
                looked_in
                    .iter()
                    .cloned()
                    .chain(unusable.map(str::to_string))
                    .collect(),
            ),
        };
        self
    }

    /// The gate every request of this adapter passes (the core installs the limiter of
    /// `capabilities.rate_limits` in it; see [`crate::provider::rate`]). Clones share it:
    /// the adapter hands one to each client it makes.
    pub fn gate(&self) -> Gate {
        self.gate.clone()
    }

    /// The cloud's name as spelled in config.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The endpoint override, credentials redacted; `None` for the adapter's default.
    pub fn endpoint_override(&self) -> Option<String> {
        self.endpoint.clone()
    }

    /// Where the credential was found, or every place looked at.
    pub fn credentials(&self) -> CredentialReport {
        self.credentials.clone()
    }
}

/// The waits of a VM on a REST GPU cloud, the common ground of the vendor adapters'
/// declared capabilities: 20 minutes to boot (GPU images are large), 10 minutes for SSH
/// and for deletion, a poll every 10 seconds; each adapter sets what differs.
pub fn vm_capabilities(supported: &[Feature]) -> Capabilities {
    let minutes = |m: u64| Duration::from_secs(m * 60);
    Capabilities {
        supported: supported.to_vec(),
        boot_timeout: minutes(20),
        ssh_timeout: minutes(10),
        delete_timeout: minutes(10),
        poll_interval: Duration::from_secs(10),
        ..Capabilities::default()
    }
}
