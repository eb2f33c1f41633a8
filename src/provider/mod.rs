//! The provider contract (design 4.1): the only boundary between the cloud-agnostic core
//! and a cloud's API.
//!
//! Architecture invariant: an adapter contains no loops, sleeps or retries beyond a single
//! API call's own pagination. It exposes small idempotent primitives and classifies its
//! errors into [`ErrorKind`]; the executor (`crate::machine`) owns retry, backoff, polling,
//! deadlines, cancellation and compensation.

pub mod aws;
pub mod cause;
pub mod digitalocean;
pub mod docker;
pub mod fake;
pub mod faulty;
pub mod hyperstack;
pub mod lambda;
pub mod runpod;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// The label (or tag) key every cloud object gpuprov creates carries, with the VM name as
/// value, so it can always be found again (brief: "Identity").
pub const IDENTITY_LABEL: &str = "gpuprov-vm-name";
/// The label key carrying the state's lineage (a UUID), so objects of two projects that use
/// the same VM name are never confused.
pub const LINEAGE_LABEL: &str = "gpuprov-lineage";

/// Every cloud name gpuprov knows, in the spelling used in `gpuprov.toml`.
pub const KNOWN_CLOUDS: &[&str] = &[
    "aws",
    "gcp",
    "massedcompute",
    "hyperstack",
    "lambda",
    "digitalocean",
    "nebius",
    "verda",
    "primeintellect",
    "runpod",
    "docker",
];

/// A credential (API key or token) held by an adapter; its `Debug` never shows the value,
/// so settings can be logged and errors formatted without leaking it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }
    /// The value, for the one place that sends it (an auth header).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(REDACTED)")
    }
}

/// An adapter's API endpoint override: environment variable `env` (for example
/// `GPUPROV_LAMBDA_ENDPOINT`) when set and not blank, else `[cloud.NAME] endpoint` when
/// not blank; `None` means the adapter's default.
pub fn endpoint_from(env: &str, config: Option<String>) -> Option<String> {
    env_nonempty(env).or(config.filter(|s| !s.trim().is_empty()))
}

/// The value of environment variable `name`, trimmed, when it is set and not blank.
pub fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// Where an instance lives: cloud, region and (optionally) zone.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Location {
    pub cloud: String,
    pub region: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.zone {
            Some(z) => write!(f, "{}/{}/{}", self.cloud, self.region, z),
            None => write!(f, "{}/{}", self.cloud, self.region),
        }
    }
}

/// One purchasable option returned by [`CloudProvider::plan`]: an instance type at a
/// location, with its price. Persisted in the journal, so it must stay small and stable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Offer {
    /// Stable identifier of the offer within its cloud (used for block scopes).
    pub id: String,
    pub location: Location,
    /// The cloud's own instance type name (for example `p5.48xlarge`).
    pub instance_type: String,
    /// GPU model (for example `H100`), `None` for CPU-only offers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    #[serde(default)]
    pub gpu_count: u32,
    pub spot: bool,
    /// List price in USD per hour.
    pub price_per_hour: f64,
    /// Driver-private detail carried from plan to prepare/create (design 3: "opaque
    /// `detail` JSON on the `Offer`, persisted").
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub detail: serde_json::Value,
}

/// What a VM asks for, derived from its `[vm.NAME]` table; the input of
/// [`CloudProvider::plan`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResourceRequest {
    pub vm_name: String,
    /// Regions to consider, in preference order; empty means the cloud's defaults.
    pub regions: Vec<String>,
    pub zones: Vec<String>,
    pub gpu: Option<String>,
    pub gpu_count: u32,
    pub spot: bool,
    /// Upper bound in USD per hour; offers above it are dropped by the core.
    pub max_price_per_hour: Option<f64>,
}

/// A boot script: shell text plus environment, rendered by each adapter in its own
/// format (cloud-init user-data or a startup script). The core never sees a cloud format.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BootScript {
    pub script: String,
    pub env: BTreeMap<String, String>,
}

/// A boot script as cloud-init `#cloud-config` user-data for the REST clouds that take it
/// (Lambda, DigitalOcean, Hyperstack), rendered by [`crate::cluster::userdata::render`].
/// Their SSH key travels through the API (a registered key), not the user-data.
///
/// Errors: [`ErrorKind::InvalidRequest`] for a boot script that cannot be rendered (an
/// environment name that is not a shell name).
pub fn cloud_init_user_data(b: &BootScript) -> Result<String, ProviderError> {
    crate::cluster::userdata::render(Some(b), &[])
        .map_err(|e| ProviderError::new(ErrorKind::InvalidRequest, format!("boot script: {e}")))
}

/// The name under which an adapter registers the project's SSH public key on clouds that
/// name keys: `gpuprov-<lineage8>-<fp12>`, where `fp12` is the first 12 hex digits of
/// the SHA-256 of the key's decoded blob (the digest of `ssh-keygen -l`'s `SHA256:`
/// fingerprint). A key of the
/// same lineage but another value (a rotated or foreign key) therefore has another name,
/// so a cloud that refuses duplicate names never blocks the run and an adapter never uses
/// a key it merely found by name.
pub fn project_key_name(lineage: &str, public_key: &str) -> String {
    use sha2::Digest as _;
    let short: String = lineage.chars().take(8).collect();
    let blob = public_key.split_whitespace().nth(1).unwrap_or(public_key);
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(blob)
        .unwrap_or_else(|_| blob.as_bytes().to_vec());
    let digest = sha2::Sha256::digest(&bytes);
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("gpuprov-{short}-{hex}")
}

/// What to create, independent of the offer. Holds no secret: only the project's public
/// SSH key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceSpec {
    pub vm_name: String,
    /// The state's lineage, attached to every object as [`LINEAGE_LABEL`].
    pub lineage: String,
    /// Idempotency token for this create attempt, derived from the VM identity and the
    /// attempt number, so a create repeated after a crash cannot start a second instance
    /// on clouds that accept one (EC2 `ClientToken`).
    pub client_token: String,
    /// Image override from config; `None` means the adapter's default.
    pub image: Option<String>,
    /// Root disk size in GiB; `None` means the adapter's default.
    pub disk_gb: Option<u32>,
    /// TCP ports to open to the world besides 22.
    pub ports: Vec<u16>,
    /// OpenSSH-format public key (`ssh-ed25519 AAAA... comment`).
    pub ssh_public_key: String,
    pub boot_script: Option<BootScript>,
}

/// Normalised instance status (design 4.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "status", content = "reason")]
pub enum InstanceStatus {
    Pending,
    Running,
    Stopping,
    Stopped,
    Terminating,
    Failed(String),
}

/// Where to log in: host, TCP port and, where the cloud decides it, the user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SshEndpoint {
    pub host: String,
    pub port: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

impl fmt::Display for SshEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.user {
            Some(u) => write!(f, "{u}@{}:{}", self.host, self.port),
            None => write!(f, "{}:{}", self.host, self.port),
        }
    }
}

/// One non-terminated instance carrying the VM identity, as the cloud reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observed {
    pub instance_id: String,
    pub status: InstanceStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<SshEndpoint>,
}

/// Features a cloud may or may not support; the core respects what is declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Feature {
    /// Runs a boot script at first boot (cloud-init or startup script).
    BootScript,
    /// Can open inbound ports through an API.
    Firewall,
    /// Can host a k3s cluster.
    Kubernetes,
    Spot,
    Gpu,
    /// Can start a stopped instance again ([`CloudProvider::start`]), so a recorded
    /// machine that was stopped (by the user, the vendor or a spot reclaim that stops) is
    /// restarted with its disk instead of being replaced.
    Start,
}

/// What the core must respect about a cloud (brief: "Capabilities").
#[derive(Debug, Clone, PartialEq)]
pub struct Capabilities {
    pub supported: Vec<Feature>,
    /// How long an instance may take from create to Running with an SSH endpoint.
    pub boot_timeout: Duration,
    /// How long SSH login may keep failing after the endpoint is known.
    pub ssh_timeout: Duration,
    /// How long deletion may take before the instance is declared leaked.
    pub delete_timeout: Duration,
    /// Interval between observe calls while waiting.
    pub poll_interval: Duration,
    /// Maximum concurrent API calls to this cloud from one gpuprov process.
    pub max_concurrency: usize,
    /// Minimum spacing between create calls (for example Lambda's launch endpoint).
    pub min_create_interval: Duration,
    /// How long a created instance may be missing from `observe` (cloud lists are
    /// eventually consistent). A create whose answer may have been lost (a crash or a
    /// retry after an error) is sent again only after the instance stayed unlisted this
    /// long, so clouds without an idempotency token never get a second instance.
    pub create_list_lag: Duration,
}

impl Capabilities {
    pub fn supports(&self, f: Feature) -> bool {
        self.supported.contains(&f)
    }
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities {
            supported: vec![],
            boot_timeout: Duration::from_secs(600),
            ssh_timeout: Duration::from_secs(300),
            delete_timeout: Duration::from_secs(600),
            poll_interval: Duration::from_secs(5),
            max_concurrency: 8,
            min_create_interval: Duration::ZERO,
            create_list_lag: Duration::from_secs(20),
        }
    }
}

/// How the core reacts to a provider error (design 4.1 table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// Retry the same step with backoff (budgeted).
    Transient,
    /// Out of capacity: compensate, block the offer, next offer.
    Capacity,
    /// Out of quota: compensate, block the whole region, next offer.
    Quota,
    /// Not offered here: block the offer, next offer, nothing to compensate. An adapter
    /// returns it only before it created anything (from `prepare`: before any side
    /// resource), since the core then cleans up nothing.
    Unavailable,
    /// The attempt failed: compensate, block the offer, next offer.
    Failed,
    /// The ask cannot be met as written: abort.
    InvalidRequest,
    /// Missing or rejected credentials: abort.
    Credentials,
    /// The API endpoint refused the connection (nothing was sent): the whole cloud is
    /// unreachable. Before anything exists (plan, prepare, create) the core blocks every
    /// offer of the cloud at once; on calls about something that exists (observe, delete,
    /// start, cleanup) it retries like `Transient`.
    Unreachable,
    /// A side resource is still in use (for example EC2 `DependencyViolation` deleting a
    /// security group): something still depends on it, so the core observes again (and
    /// deletes what it finds) before retrying.
    InUse,
}

impl ErrorKind {
    /// Whether a call about something that already exists (observe, delete, start,
    /// cleanup) is retried in place with backoff for this kind.
    pub fn retried_in_place(self) -> bool {
        matches!(
            self,
            ErrorKind::Transient | ErrorKind::Unreachable | ErrorKind::InUse
        )
    }
}

/// A set of offers that must not be tried again in this search.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "scope")]
pub enum BlockScope {
    Offer {
        id: String,
    },
    InstanceTypeInRegion {
        cloud: String,
        region: String,
        instance_type: String,
    },
    Region {
        cloud: String,
        region: String,
    },
    Cloud {
        cloud: String,
    },
}

impl BlockScope {
    /// Whether this scope covers `offer`.
    pub fn covers(&self, offer: &Offer) -> bool {
        match self {
            BlockScope::Offer { id } => *id == offer.id,
            BlockScope::InstanceTypeInRegion {
                cloud,
                region,
                instance_type,
            } => {
                *cloud == offer.location.cloud
                    && *region == offer.location.region
                    && *instance_type == offer.instance_type
            }
            BlockScope::Region { cloud, region } => {
                *cloud == offer.location.cloud && *region == offer.location.region
            }
            BlockScope::Cloud { cloud } => *cloud == offer.location.cloud,
        }
    }

    /// The default scope for an error kind (design 4.1), `None` for kinds that do not block.
    /// A `Failed` attempt on an offer split by zone (AWS) blocks the type in the whole
    /// region: a boot or SSH failure is not about the zone, and retrying it in every zone
    /// would repeat it; capacity is per zone and blocks only that offer.
    pub fn default_for(kind: ErrorKind, offer: &Offer) -> Option<BlockScope> {
        match kind {
            ErrorKind::Failed if offer.location.zone.is_some() => {
                Some(BlockScope::InstanceTypeInRegion {
                    cloud: offer.location.cloud.clone(),
                    region: offer.location.region.clone(),
                    instance_type: offer.instance_type.clone(),
                })
            }
            ErrorKind::Capacity | ErrorKind::Unavailable | ErrorKind::Failed => {
                Some(BlockScope::Offer {
                    id: offer.id.clone(),
                })
            }
            ErrorKind::Quota => Some(BlockScope::Region {
                cloud: offer.location.cloud.clone(),
                region: offer.location.region.clone(),
            }),
            ErrorKind::Unreachable => Some(BlockScope::Cloud {
                cloud: offer.location.cloud.clone(),
            }),
            _ => None,
        }
    }
}

/// An adapter's classified error. `msg` must never contain a secret.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
#[error("{kind:?}: {msg}")]
pub struct ProviderError {
    pub kind: ErrorKind,
    pub msg: String,
    /// Overrides the default block scope of `kind`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<BlockScope>,
    /// Server-requested delay before the next call (HTTP `Retry-After`), seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_secs: Option<u64>,
}

impl ProviderError {
    pub fn new(kind: ErrorKind, msg: impl Into<String>) -> Self {
        ProviderError {
            kind,
            msg: msg.into(),
            block: None,
            retry_after_secs: None,
        }
    }
    pub fn transient(msg: impl Into<String>) -> Self {
        Self::new(ErrorKind::Transient, msg)
    }
    pub fn with_block(mut self, scope: BlockScope) -> Self {
        self.block = Some(scope);
        self
    }
    /// The scope to block for this error on `offer`.
    pub fn scope_for(&self, offer: &Offer) -> Option<BlockScope> {
        self.block
            .clone()
            .or_else(|| BlockScope::default_for(self.kind, offer))
    }
}

/// The contract every cloud adapter implements (design 4.1). See the module docs for the
/// invariants; each primitive's semantics are in the design's table.
#[async_trait]
pub trait CloudProvider: Send + Sync {
    /// The cloud's name as spelled in config (one of [`KNOWN_CLOUDS`]).
    fn name(&self) -> &'static str;
    fn capabilities(&self) -> Capabilities;
    /// The API endpoint when it is overridden (config or environment), credentials
    /// redacted; `plan` shows it so nobody applies against the wrong API by accident.
    fn endpoint_override(&self) -> Option<String> {
        None
    }
    /// Ordered offers for the ask (preference = order). Creates nothing.
    /// Errors: `InvalidRequest` when the ask cannot be planned on this cloud.
    async fn plan(&self, req: &ResourceRequest) -> Result<Vec<Offer>, ProviderError>;
    /// Idempotent per-(VM, location) prerequisites; returns driver-private JSON that is
    /// persisted and handed to `create`.
    async fn prepare(
        &self,
        offer: &Offer,
        spec: &InstanceSpec,
    ) -> Result<serde_json::Value, ProviderError>;
    /// One creation attempt, labelled with the VM identity. Returns the instance id.
    /// Does not wait for the instance to run.
    async fn create(
        &self,
        offer: &Offer,
        prepared: &serde_json::Value,
        spec: &InstanceSpec,
    ) -> Result<String, ProviderError>;
    /// All non-terminated instances carrying the VM identity at `at`.
    async fn observe(&self, at: &Location, vm_name: &str) -> Result<Vec<Observed>, ProviderError>;
    /// Requests deletion; an unknown or already deleted instance is success. Does not wait.
    async fn delete(
        &self,
        at: &Location,
        vm_name: &str,
        instance_ids: &[String],
    ) -> Result<(), ProviderError>;
    /// Deletes per-VM side resources once the instances are gone. Idempotent.
    /// Errors: `InUse` when a side resource is still attached to something (the core
    /// observes again before retrying).
    async fn cleanup(&self, at: &Location, vm_name: &str) -> Result<(), ProviderError>;
    /// Requests that a stopped instance start again (restart before replace). Does not
    /// wait: `observe` reports it `Pending` and then `Running`. An instance already
    /// running or starting is success. Only called on clouds declaring
    /// [`Feature::Start`].
    ///
    /// Errors: `Quota` / `Capacity` when the cloud cannot start it now (the core keeps the
    /// stopped instance and never fails over into a second one); the default is
    /// `Unavailable` (this cloud cannot start instances).
    async fn start(
        &self,
        at: &Location,
        vm_name: &str,
        instance_id: &str,
    ) -> Result<(), ProviderError> {
        let _ = (at, vm_name, instance_id);
        Err(ProviderError::new(
            ErrorKind::Unavailable,
            format!("{} cannot start a stopped instance", self.name()),
        ))
    }
}

/// The lineage an adapter was configured with, or an `InvalidRequest` naming `cloud` when
/// it is empty (every adapter filters and labels by lineage, so it must be set).
pub fn require_lineage<'a>(cloud: &str, lineage: &'a str) -> Result<&'a str, ProviderError> {
    if lineage.trim().is_empty() {
        return Err(ProviderError::new(
            ErrorKind::InvalidRequest,
            format!("{cloud} provider has no lineage configured"),
        ));
    }
    Ok(lineage)
}

/// Refuses a create whose spec belongs to another lineage than the adapter's: `observe`
/// filters on the adapter's lineage, so such an instance would be invisible and leak.
pub fn check_spec_lineage(
    cloud: &str,
    lineage: &str,
    spec: &InstanceSpec,
) -> Result<(), ProviderError> {
    let lineage = require_lineage(cloud, lineage)?;
    if spec.lineage != lineage {
        return Err(ProviderError::new(
            ErrorKind::InvalidRequest,
            format!(
                "spec lineage {} differs from the provider's lineage {lineage}",
                spec.lineage
            ),
        ));
    }
    Ok(())
}

/// The adapters available to one run, by cloud name.
#[derive(Clone, Default)]
pub struct Providers {
    map: BTreeMap<String, Arc<dyn CloudProvider>>,
}

impl Providers {
    pub fn new() -> Self {
        Self::default()
    }
    /// Registers an adapter behind the core's limits for its declared capabilities
    /// (`max_concurrency`, `min_create_interval`; see `machine::limits`).
    pub fn insert(&mut self, p: Arc<dyn CloudProvider>) {
        self.map.insert(
            p.name().to_string(),
            Arc::new(crate::machine::limits::Governed::new(p)),
        );
    }
    pub fn get(&self, cloud: &str) -> Option<&Arc<dyn CloudProvider>> {
        self.map.get(cloud)
    }
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.map.keys().map(|s| s.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_attempt_in_one_zone_blocks_the_type_in_the_region() {
        let offer = |zone: Option<&str>| Offer {
            id: format!("aws/us-east-1/p5.48xlarge/{}", zone.unwrap_or("-")),
            location: Location {
                cloud: "aws".into(),
                region: "us-east-1".into(),
                zone: zone.map(str::to_string),
            },
            instance_type: "p5.48xlarge".into(),
            gpu: None,
            gpu_count: 0,
            spot: false,
            price_per_hour: 1.0,
            detail: serde_json::Value::Null,
        };
        let (a, b) = (offer(Some("us-east-1a")), offer(Some("us-east-1b")));
        let failed = BlockScope::default_for(ErrorKind::Failed, &a).unwrap();
        assert!(
            failed.covers(&b),
            "ssh/boot failures are not about the zone"
        );
        let capacity = BlockScope::default_for(ErrorKind::Capacity, &a).unwrap();
        assert!(!capacity.covers(&b), "capacity is per zone");
        let unzoned = BlockScope::default_for(ErrorKind::Failed, &offer(None)).unwrap();
        assert_eq!(unzoned, BlockScope::Offer { id: offer(None).id });
    }

    #[test]
    fn project_key_name_depends_on_the_key_value() {
        let a = project_key_name("0123456789ab", "ssh-ed25519 AAAAone= comment");
        let b = project_key_name("0123456789ab", "ssh-ed25519 AAAAtwo= comment");
        let a2 = project_key_name("0123456789ab", "ssh-ed25519 AAAAone= other-comment");
        assert!(a.starts_with("gpuprov-01234567-"), "{a}");
        assert_eq!(a.len(), "gpuprov-01234567-".len() + 12);
        assert_ne!(a, b, "another key value gets another name");
        assert_eq!(a, a2, "the comment does not change the name");
    }

    #[test]
    fn cloud_init_user_data_carries_the_boot_script() {
        let b = BootScript {
            script: "echo hi".into(),
            env: [("K".to_string(), "it's".to_string())].into(),
        };
        let u = cloud_init_user_data(&b).unwrap();
        assert!(u.starts_with("#cloud-config\n"), "{u}");
        assert!(
            !u.contains("ssh_authorized_keys"),
            "the key goes through the API"
        );
        let doc: serde_yaml::Value = serde_yaml::from_str(&u).unwrap();
        let content = doc["write_files"][0]["content"].as_str().unwrap();
        assert_eq!(
            crate::cluster::userdata::decode_gz_b64(content).unwrap(),
            b.to_shell().unwrap()
        );
        let bad = BootScript {
            script: "true".into(),
            env: [("NOT A NAME".to_string(), "x".to_string())].into(),
        };
        assert_eq!(
            cloud_init_user_data(&bad).unwrap_err().kind,
            ErrorKind::InvalidRequest
        );
    }
}
