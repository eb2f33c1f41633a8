//! The provider contract (design 4.1): the only boundary between the cloud-agnostic core
//! and a cloud's API.
//!
//! Architecture invariant: an adapter contains no loops, sleeps or retries beyond a single
//! API call's own pagination. It exposes small idempotent primitives and classifies its
//! errors into [`ErrorKind`]; the executor (`crate::machine`) owns retry, backoff, polling,
//! deadlines, cancellation and compensation.
//!
//! Long-running operations (GCP zone operations, Nebius operations): `create` returns as
//! soon as the cloud *accepted* the request, with the instance id (or, where the cloud
//! names the instance only later, an id from which `observe` can follow the operation,
//! for example `"<instance>@<operation>"`). Adapters never wait for an operation.
//! `observe` reports an instance whose create operation is still running as `Pending`,
//! and when the operation ended badly it lists the attempt once more with
//! [`InstanceStatus::Refused`] carrying the classified failure: a late capacity or quota
//! error (`ZONE_RESOURCE_POOL_EXHAUSTED`, `RESOURCE_EXHAUSTED`) is `Capacity` / `Quota`,
//! so the launch machine compensates and fails over exactly as if `create` had refused,
//! while teardown, refresh and a later create treat the entry as gone (nothing bills);
//! an operation that created an instance which then broke is `InstanceStatus::Failed`. An operation the cloud no longer knows
//! is judged by the instance alone. The same holds for deletes: `delete` returns once the
//! delete was accepted and `observe` shows the instance `Terminating` until it is gone.
//!
//! Adapters are built by the cloud registry ([`clouds::registry`]) from their settings and the
//! state's [`Lineage`]; the plumbing they share is the [`kit`]. What an adapter states
//! about itself (name, endpoint override, capabilities, credential report) is one
//! [`kit::Adapter`] it hands over through [`CloudProvider::adapter`]; the trait's
//! provided methods read it. Every call answers a [`Result`] whose error is a
//! [`ProviderError`].

pub mod boot;
pub mod cause;
pub mod clouds;
#[cfg(any(test, feature = "test-doubles"))]
pub mod doubles;
pub mod identity;
pub mod kit;
pub mod offers;
pub mod rate;
pub mod redact;
pub mod shared;

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use boot::{cloud_init_user_data, BootScript};
pub use identity::{
    check_spec_lineage, object_name, project_key_name, vm_of_object_name, Lineage, Naming, Shown,
    IDENTITY_LABEL, LINEAGE_LABEL,
};
pub use rate::{Admission, EndpointClass, Gate, RateLimit};
pub use redact::Secret;
pub use shared::{SharedFound, SharedObject};

/// The answer of a contract call: its error is a classified [`ProviderError`] unless said
/// otherwise, which keeps the trait's signatures short.
pub type Result<T, E = ProviderError> = std::result::Result<T, E>;

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
    /// What a user compares offers by besides the GPU: size and where the price comes
    /// from. Shown by `gpuprov offers`; never used to choose.
    #[serde(default, skip_serializing_if = "OfferFacts::is_empty")]
    pub facts: OfferFacts,
}

/// An offer's size and price provenance, as far as the cloud's catalog says (each field
/// `None` where it does not). Source: each adapter's catalog (its module docs name the
/// API field or the vendor page).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OfferFacts {
    /// vCPUs per machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u32>,
    /// Memory per machine, GiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gib: Option<f64>,
    /// Local (root or ephemeral) disk per machine, GiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_gib: Option<u32>,
    /// The date of gpuprov's built-in price list when the price comes from it
    /// (`YYYY-MM`), `None` when the cloud's API quoted it now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prices_as_of: Option<String>,
    /// A spot offer priced at the on-demand price because the cloud publishes no spot
    /// price: the real price is lower (this is an upper bound).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub spot_price_is_upper_bound: bool,
}

impl OfferFacts {
    /// Whether nothing is known (so the state and plan files omit it).
    pub fn is_empty(&self) -> bool {
        *self == OfferFacts::default()
    }
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
    /// GPUs per machine: exactly this many (0: any, or none without `gpu`), unless
    /// `gpu_count_at_least`. Adapters test it with [`kit::gpu::count_fits`].
    pub gpu_count: u32,
    pub spot: bool,
    /// Upper bound in USD per hour; offers above it are dropped by the core.
    pub max_price_per_hour: Option<f64>,
    /// `gpu_count` is a minimum (`gpuprov offers --min-gpu-count`), not an exact count.
    #[serde(default)]
    pub gpu_count_at_least: bool,
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
    /// The shared objects the core prepared for this machine ([`shared`]), by kind (for
    /// example `ssh_key`). The engine fills it before every `prepare`; a cloud that
    /// declares a kind missing here refuses `prepare` as `InvalidRequest`
    /// ([`kit::keys::prepared_key`]): adapters never register the project key themselves.
    pub shared: std::collections::BTreeMap<String, SharedFound>,
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
    /// A create the cloud accepted and then refused in its long-running operation (GCP's
    /// `ZONE_RESOURCE_POOL_EXHAUSTED` inside the zone operation, a Nebius operation
    /// ending `RESOURCE_EXHAUSTED`), classified like a refused `create`. Nothing exists or
    /// bills: the core fails over as if `create` had returned the error, and teardown,
    /// refresh and the next create treat it as gone (see the module docs).
    Refused(Box<ProviderError>),
    /// Reclaimed by the cloud: a spot or preemptible instance the cloud stopped or
    /// terminated to take its capacity back (EC2's `Server.SpotInstanceTermination`, GCP's
    /// preemption of a `SPOT` or preemptible VM). Never running. `stopped`: it still
    /// exists (stopped, its disk kept) and is deleted before it is replaced; otherwise it
    /// is gone, and listed only while the cloud still reports it, so refresh can say why.
    /// `signal` is the cloud's own words for it (a state reason, a status). The core
    /// records the preemption and tries every other offer before the preempted (instance
    /// type, region) next time (`provider::offers::demote_preempted`).
    Preempted {
        signal: String,
        stopped: bool,
    },
}

impl InstanceStatus {
    /// Whether the cloud reclaimed this instance ([`InstanceStatus::Preempted`]).
    pub fn is_preempted(&self) -> bool {
        matches!(self, InstanceStatus::Preempted { .. })
    }

    /// The status in one word, as it is serialised (`pending`, `running`, `stopping`,
    /// `stopped`, `terminating`, `failed`, `refused`, `preempted`): for tables and JSON.
    pub fn word(&self) -> &'static str {
        match self {
            InstanceStatus::Pending => "pending",
            InstanceStatus::Running => "running",
            InstanceStatus::Stopping => "stopping",
            InstanceStatus::Stopped => "stopped",
            InstanceStatus::Terminating => "terminating",
            InstanceStatus::Failed(_) => "failed",
            InstanceStatus::Refused(_) => "refused",
            InstanceStatus::Preempted { .. } => "preempted",
        }
    }
}

/// The status as a user reads it: its [`word`](InstanceStatus::word), with the cloud's
/// reason in a sentence where it has one ("preempted by the cloud, stopped with its disk
/// kept (…)").
impl fmt::Display for InstanceStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InstanceStatus::Failed(why) => write!(f, "failed ({why})"),
            InstanceStatus::Refused(e) => write!(
                f,
                "refused by the cloud after it accepted the create ({})",
                e.text()
            ),
            InstanceStatus::Preempted {
                signal,
                stopped: true,
            } => write!(
                f,
                "preempted by the cloud, stopped with its disk kept ({signal})"
            ),
            InstanceStatus::Preempted {
                signal,
                stopped: false,
            } => write!(f, "preempted by the cloud ({signal})"),
            other => f.write_str(other.word()),
        }
    }
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

impl Observed {
    /// Whether this is an instance at all: `false` for a create the cloud refused late
    /// ([`InstanceStatus::Refused`]) and for a preempted instance the cloud terminated
    /// ([`InstanceStatus::Preempted`] not `stopped`), which nothing needs to delete.
    pub fn exists(&self) -> bool {
        !matches!(
            self.status,
            InstanceStatus::Refused(_) | InstanceStatus::Preempted { stopped: false, .. }
        )
    }
}

/// The entries of an `observe` answer that are instances ([`Observed::exists`]).
pub fn existing(seen: Vec<Observed>) -> Vec<Observed> {
    seen.into_iter().filter(Observed::exists).collect()
}

/// One instance as a cloud's listing shows it at a location, whoever's it is: what
/// [`CloudProvider::instances`] answers. The adapter maps the vendor's fields; which VM
/// (if any) the instance belongs to is decided by the core's one identity rule
/// ([`identity::owner`]), never by the adapter.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub instance_id: String,
    /// The normalised status (design 4.1), including [`InstanceStatus::Refused`] for a
    /// create the cloud refused late and [`InstanceStatus::Preempted`].
    pub status: InstanceStatus,
    /// Where to log in, once the cloud says.
    pub ssh: Option<SshEndpoint>,
    /// The identity fields as the cloud shows them (labels or tags, name).
    pub identity: Shown,
    /// The cloud's instance type name, when the listing gives it.
    pub instance_type: Option<String>,
    /// The price the cloud bills for it, USD per hour, when the listing gives it.
    pub price_per_hour: Option<f64>,
    /// When the cloud created it, when the listing gives it.
    pub created_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The zone it runs in, on a cloud whose instances are zonal (GCP: the aggregated
    /// listing's `zones/<zone>` scope), when the listing gives it: a machine adopted from
    /// a region-wide listing is then observed and deleted in its zone.
    pub zone: Option<String>,
}

impl Seen {
    /// An entry with `id`, `status` and `identity`; nothing else known yet.
    pub fn new(id: impl Into<String>, status: InstanceStatus, identity: Shown) -> Seen {
        Seen {
            instance_id: id.into(),
            status,
            ssh: None,
            identity,
            instance_type: None,
            price_per_hour: None,
            created_at: None,
            zone: None,
        }
    }

    /// The entry as `observe` reports it.
    pub fn observed(self) -> Observed {
        Observed {
            instance_id: self.instance_id,
            status: self.status,
            ssh: self.ssh,
        }
    }
}

/// What [`CloudProvider::observe_location`] answers: per VM name, the entries `observe`
/// would give for it.
pub type Observations = std::collections::BTreeMap<String, Vec<Observed>>;

/// One instance at a location carrying gpuprov's identity labels, of any lineage: what
/// [`CloudProvider::list`] returns for discovery (`plan`), `gpuprov state recover` and
/// `gpuprov sweep`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Listed {
    /// The [`IDENTITY_LABEL`] value: the VM name the object was created for.
    pub vm_name: String,
    /// The [`LINEAGE_LABEL`] value: the state the object belongs to.
    pub lineage: String,
    /// The instance as `observe` would report it.
    pub observed: Observed,
    /// The cloud's instance type name, when the listing gives it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,
    /// When the cloud created it, when the listing gives it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The price the cloud bills for it, USD per hour, when the listing gives it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_per_hour: Option<f64>,
    /// The zone it runs in, when the cloud's instances are zonal ([`Seen::zone`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

/// What [`CloudProvider::import`] did: the instance as `observe` now reports it, and how
/// it carries the identity (said to the user: "labelled", "renamed to …").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Imported {
    pub observed: Observed,
    /// How the instance carries the identity now, in a few words.
    pub identity: String,
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
    /// Places instances in zones within a region, so `zones` in the config narrows its
    /// offers (AWS availability zones, GCP zones). On a cloud without it `zones` means
    /// nothing, and a machine whose clouds all lack it is rejected up front.
    Zones,
    /// Takes an instance created outside gpuprov into a VM ([`CloudProvider::import`]).
    Import,
    /// Reports vendor-native findings about an instance ([`CloudProvider::diagnose`]).
    Diagnose,
    /// Has objects machines share, such as a registered SSH key
    /// ([`CloudProvider::observe_shared`], `create_shared`, `delete_shared`).
    SharedObjects,
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
    /// Minimum spacing between `create` calls of the contract (the core's own spacing;
    /// a vendor's documented launch rate is declared in `rate_limits` instead).
    pub min_create_interval: Duration,
    /// The vendor's documented request rates, each with its source (empty: the vendor
    /// documents none). The core enforces them on every HTTP request the adapter sends
    /// ([`rate`]), whichever contract call sends it.
    pub rate_limits: Vec<RateLimit>,
    /// How long a created instance may be missing from `observe` (cloud lists are
    /// eventually consistent). A create whose answer may have been lost (a crash or a
    /// retry after an error) is sent again only after the instance stayed unlisted this
    /// long, so clouds without an idempotency token never get a second instance.
    pub create_list_lag: Duration,
    /// The cloud's own region preference when the ask names no regions (AWS: the regions
    /// with the broadest GPU offering, in order); empty means none, and the core then
    /// orders every region's offers by price alone (`vm::offers::order`).
    pub default_regions: Vec<String>,
    /// The adapter's own offer order is final and the core does not reorder it: the
    /// scripted `FakeProvider` (its tests script the preference), or a cloud whose API
    /// returns offers already ranked by its scheduler.
    pub keeps_offer_order: bool,
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
            rate_limits: Vec::new(),
            create_list_lag: Duration::from_secs(20),
            default_regions: Vec::new(),
            keeps_offer_order: false,
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
    /// This cloud's account refused: missing or rejected credentials, or billing (an HTTP
    /// 402, "insufficient balance"). The cloud is left out (its offers blocked) and the
    /// search goes on; the machine ends when no other cloud can take it.
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
    /// A create refused because the object exists already (a duplicate name, a key
    /// "already in use"): for a shared object, it was made meanwhile or before, so the
    /// core observes again and adopts it. Never a failed offer.
    Exists,
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
            // The whole account refused (credentials, billing): every offer of the cloud.
            ErrorKind::Unreachable | ErrorKind::Credentials => Some(BlockScope::Cloud {
                cloud: offer.location.cloud.clone(),
            }),
            _ => None,
        }
    }
}

/// An adapter's classified error. `msg` must never contain a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[error("{kind:?}: {msg}")]
pub struct ProviderError {
    pub kind: ErrorKind,
    pub msg: String,
    /// Overrides the default block scope of `kind` (boxed: errors travel in every
    /// `Result`, so they are kept small).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<Box<BlockScope>>,
    /// Server-requested delay before the next call (HTTP `Retry-After`), seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_secs: Option<u64>,
    /// What the user can do about it (which credential to check, where it is read),
    /// shown apart from the message. Never contains a secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub help: Option<String>,
}

impl ProviderError {
    pub fn new(kind: ErrorKind, msg: impl Into<String>) -> Self {
        ProviderError {
            kind,
            msg: msg.into(),
            block: None,
            retry_after_secs: None,
            help: None,
        }
    }
    /// Adds a hint for the user, shown apart from the message.
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }
    /// The message followed by the help, for places that show one line of text (a
    /// machine's abort reason): `"<msg>; <help>"`.
    pub fn text(&self) -> String {
        match &self.help {
            Some(h) => format!("{}; {h}", self.msg),
            None => self.msg.clone(),
        }
    }
    pub fn transient(msg: impl Into<String>) -> Self {
        Self::new(ErrorKind::Transient, msg)
    }
    pub fn with_block(mut self, scope: BlockScope) -> Self {
        self.block = Some(Box::new(scope));
        self
    }
    /// The scope to block for this error on `offer`.
    pub fn scope_for(&self, offer: &Offer) -> Option<BlockScope> {
        self.block
            .as_deref()
            .cloned()
            .or_else(|| BlockScope::default_for(self.kind, offer))
    }
}

/// The contract every cloud adapter implements (design 4.1). See the module docs for the
/// invariants; each primitive's semantics are in the design's table.
#[async_trait]
pub trait CloudProvider: Send + Sync {
    /// What the adapter states about itself ([`kit::Adapter`]); the four methods below
    /// read it. A wrapper around another adapter hands over the inner one's.
    fn adapter(&self) -> &kit::Adapter;
    /// The cloud's name as spelled in config (one of [`clouds::registry::Cloud`]).
    fn name(&self) -> &'static str {
        self.adapter().name()
    }
    fn capabilities(&self) -> Capabilities {
        self.adapter().capabilities.clone()
    }
    /// The API endpoint when it is overridden (config or environment), credentials
    /// redacted; `plan` shows it so nobody applies against the wrong API by accident.
    fn endpoint_override(&self) -> Option<String> {
        self.adapter().endpoint_override()
    }
    /// Whether a credential was found and where (never its value), for `gpuprov
    /// validate`; may resolve a credential chain (AWS, which overrides this), within a
    /// deadline, but sends nothing that creates or changes anything. The default is what
    /// the adapter found at construction ("no credential needed" unless it set one).
    async fn credentials(&self) -> kit::CredentialReport {
        self.adapter().credentials()
    }
    /// Ordered offers for the ask (preference = order). Creates nothing.
    /// Errors: `InvalidRequest` when the ask cannot be planned on this cloud.
    async fn plan(&self, req: &ResourceRequest) -> Result<Vec<Offer>>;
    /// The part of `plan` that depends on the machine itself, not on the catalog (a VM
    /// name too long for the cloud's names), answered without any call. The core shares
    /// one `plan` answer between machines with the same ask (`machine::coalesce`) and runs
    /// this check for every machine. Errors: `InvalidRequest`; the default accepts.
    fn check_request(&self, req: &ResourceRequest) -> Result<()> {
        let _ = req;
        Ok(())
    }
    /// Idempotent per-(VM, location) prerequisites; returns driver-private JSON that is
    /// persisted and handed to `create`.
    async fn prepare(&self, offer: &Offer, spec: &InstanceSpec) -> Result<serde_json::Value>;
    /// One creation attempt, labelled with the VM identity. Returns the instance id as
    /// soon as the cloud accepted the request (for a long-running operation, an id
    /// `observe` can follow; see the module docs). Never waits for the instance to run or
    /// for an operation to finish.
    async fn create(&self, offer: &Offer, prep: &Value, spec: &InstanceSpec) -> Result<String>;
    /// The adapter's one read: every non-terminated instance at `at` (region-wide when
    /// `at.zone` is `None`) that may carry gpuprov's identity, with the identity fields,
    /// status and endpoint as the cloud shows them ([`Seen`]). `only_vm` is a hint: an
    /// adapter whose API filters by label may ask only for that VM's instances, and may
    /// always answer more (the identity rule drops what is not the VM's). An instance
    /// whose create operation is still running is `Pending`; a create operation that
    /// failed late is listed as [`InstanceStatus::Refused`] (the module docs); a spot
    /// instance the cloud reclaimed is [`InstanceStatus::Preempted`], also when the cloud
    /// terminated it (as long as the cloud still lists it), so refresh can tell a
    /// preemption from a deletion. One listing: pagination is the only loop. Read-only.
    /// Called only for locations of this adapter's cloud: the provided methods answer
    /// another cloud's location with nothing, without asking.
    ///
    /// Errors: classified by the adapter's table, as every call.
    async fn instances(&self, at: &Location, only_vm: Option<&str>) -> Result<Vec<Seen>>;
    /// All non-terminated instances of VM `vm_name` at `at`: the [`instances`] entries
    /// the identity rule ([`identity::owner`]) gives to it, sorted by instance id.
    /// Callers that want instances only use [`existing`]. Adapters do not override it.
    ///
    /// [`instances`]: CloudProvider::instances
    async fn observe(&self, at: &Location, vm_name: &str) -> Result<Vec<Observed>> {
        if at.cloud != self.name() {
            return Ok(vec![]);
        }
        let lineage = self.adapter().lineage()?;
        let seen = self.instances(at, Some(vm_name)).await?;
        Ok(kit::listing::observed_for(seen, lineage, at, vm_name))
    }
    /// Every VM of this adapter's lineage at `at`, from one listing: for each VM name, the
    /// entries `observe(at, vm)` would answer at that moment (the same rule, order and
    /// statuses). A VM with nothing at `at` is absent from the map. The core serves the
    /// `observe` calls of many machines waiting at one location from one such listing
    /// (`machine::coalesce`), so the calls a fleet makes grow with its locations, not its
    /// machines. Always `Some`; adapters do not override it.
    ///
    /// Errors: as [`instances`](CloudProvider::instances).
    async fn observe_location(&self, at: &Location) -> Result<Option<Observations>> {
        if at.cloud != self.name() {
            return Ok(Some(Observations::new()));
        }
        let lineage = self.adapter().lineage()?;
        let seen = self.instances(at, None).await?;
        Ok(Some(kit::listing::observations(seen, lineage, at)))
    }
    /// Requests deletion of instances `ids` of VM `vm`; an unknown or already deleted
    /// instance is success. Does not wait.
    async fn delete(&self, at: &Location, vm: &str, ids: &[String]) -> Result<()>;
    /// Deletes per-VM side resources once the instances are gone. Idempotent.
    /// Errors: `InUse` when a side resource is still attached to something (the core
    /// observes again before retrying).
    async fn cleanup(&self, at: &Location, vm_name: &str) -> Result<()>;
    /// Every instance at `at` (region-wide when `at.zone` is `None`) that shows a whole
    /// identity, whatever its VM name and lineage ([`identity::listed_identity`]),
    /// excluding terminated ones, sorted by instance id. Read-only. Used by discovery (a
    /// machine of this lineage the state does not know), `state recover` (a lost state's
    /// machines) and `sweep` (objects no state knows). Adapters do not override it.
    ///
    /// Errors: as [`instances`](CloudProvider::instances).
    async fn list(&self, at: &Location) -> Result<Vec<Listed>> {
        if at.cloud != self.name() {
            return Ok(vec![]);
        }
        let lineage = self.adapter().lineage()?;
        let seen = self.instances(at, None).await?;
        Ok(kit::listing::listed(seen, lineage, at))
    }
    /// Takes instance `id` at `at`, created outside gpuprov, into VM `vm` (`gpuprov
    /// import`): checks it exists there and gives it this VM's identity where the cloud
    /// allows (labels or tags, else the identity name that `observe` also matches), so
    /// `observe`, refresh and teardown find it from then on. Changes nothing else.
    ///
    /// Errors: `InvalidRequest` when `id` names no instance at `at`, or one that carries
    /// another VM's or lineage's identity; the default is `Unavailable` (this cloud cannot
    /// import yet).
    async fn import(&self, at: &Location, vm: &str, id: &str) -> Result<Imported> {
        let _ = (at, vm, id);
        Err(ProviderError::new(
            ErrorKind::Unavailable,
            format!("{} cannot import instances yet", self.name()),
        ))
    }
    /// Requests that stopped instance `id` of VM `vm` start again (restart before
    /// replace). Does not wait: `observe` reports it `Pending` and then `Running`. An
    /// instance already running or starting is success. Only called on clouds declaring
    /// [`Feature::Start`].
    ///
    /// Errors: `Quota` / `Capacity` when the cloud cannot start it now (the core keeps the
    /// stopped instance and never fails over into a second one); the default is
    /// `Unavailable` (this cloud cannot start instances).
    async fn start(&self, at: &Location, vm: &str, id: &str) -> Result<()> {
        let _ = (at, vm, id);
        Err(ProviderError::new(
            ErrorKind::Unavailable,
            format!("{} cannot start a stopped instance", self.name()),
        ))
    }
    /// Vendor-native findings about instance `id` of VM `vm` at `at`, for `gpuprov health`
    /// (the design's optional `diagnose`): what the vendor knows beyond the
    /// [`InstanceStatus`] `observe` gives (a failing health check, an out-of-memory kill,
    /// a crash loop), each in one line without secrets. Read-only, one call, no waiting.
    /// The default finds nothing: the status from `observe` is all this cloud says.
    ///
    /// Errors: as `observe` (the API could not be asked); an instance that is gone is no
    /// error but no findings (`observe` says it is gone).
    async fn diagnose(&self, at: &Location, vm: &str, id: &str) -> Result<Vec<Finding>> {
        let _ = (at, vm, id);
        Ok(Vec::new())
    }
    /// The shared objects a machine launched at `offer` uses ([`shared`]): by default
    /// what [`shared::declared`] lists for this cloud. A wrapper hands over the inner
    /// adapter's.
    fn shared_objects(&self, offer: &Offer) -> Vec<SharedObject> {
        shared::for_offer(self.name(), offer)
    }
    /// The shared object `obj` as the cloud shows it, `None` when it does not exist.
    /// `public_key` is the project's OpenSSH public key (keys are found by value).
    /// Read-only.
    ///
    /// Errors: as `observe`; the default is `Unavailable` (this cloud shares nothing).
    async fn observe_shared(
        &self,
        obj: &SharedObject,
        public_key: &str,
    ) -> Result<Option<SharedFound>> {
        let _ = public_key;
        Err(ProviderError::new(
            ErrorKind::Unavailable,
            format!("{} declares no shared {}", self.name(), obj.kind),
        ))
    }
    /// Creates shared object `obj` under the name gpuprov derives for it. One call.
    ///
    /// Errors: `Exists` when the cloud refuses because it exists already (the core then
    /// observes again and adopts it); otherwise as `create`.
    async fn create_shared(&self, obj: &SharedObject, public_key: &str) -> Result<SharedFound> {
        let _ = public_key;
        Err(ProviderError::new(
            ErrorKind::Unavailable,
            format!("{} cannot create a shared {}", self.name(), obj.kind),
        ))
    }
    /// Deletes shared object `found` (only one gpuprov made: [`SharedFound::ours`]); one
    /// already gone is success. Does not wait.
    ///
    /// Errors: `InUse` while something still uses it; otherwise as `delete`.
    async fn delete_shared(&self, obj: &SharedObject, found: &SharedFound) -> Result<()> {
        let _ = found;
        Err(ProviderError::new(
            ErrorKind::Unavailable,
            format!("{} cannot delete a shared {}", self.name(), obj.kind),
        ))
    }
}

/// One vendor-native finding of [`CloudProvider::diagnose`]: how serious, and what in one
/// line (never a secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub severity: Severity,
    pub message: String,
}

impl Finding {
    pub fn new(severity: Severity, message: impl Into<String>) -> Finding {
        Finding {
            severity,
            message: message.into(),
        }
    }
}

/// How serious a [`Finding`] is: `Info` changes no verdict, `Warning` makes the cloud
/// check a warning, `Error` a failure. Ordered by seriousness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warning,
    Error,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_read_as_words_and_reasons_as_sentences() {
        assert_eq!(InstanceStatus::Stopped.to_string(), "stopped");
        assert_eq!(InstanceStatus::Stopped.word(), "stopped");
        let kept = InstanceStatus::Preempted {
            signal: "TERMINATED: Instance was preempted.".into(),
            stopped: true,
        };
        assert_eq!(kept.word(), "preempted");
        assert_eq!(
            kept.to_string(),
            "preempted by the cloud, stopped with its disk kept (TERMINATED: Instance was \
             preempted.)"
        );
        let failed = InstanceStatus::Failed("disk error".into());
        assert_eq!(failed.to_string(), "failed (disk error)");
        // The word is the serialised tag, so JSON readers and tables agree.
        for s in [InstanceStatus::Pending, kept, failed] {
            let v = serde_json::to_value(&s).unwrap();
            assert_eq!(v["status"], s.word(), "{s:?}");
        }
    }

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
            facts: Default::default(),
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
}
