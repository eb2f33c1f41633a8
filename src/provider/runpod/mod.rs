//! RunPod (cloud name `runpod`), over its REST API v2 (OpenAPI 3.1, API 2.0.0,
//! `../shared/vendor-apis/runpod/api-reference-v2/openapi.json`). RunPod rents GPU
//! *pods*: containers on a GPU host, not VMs. There is no boot script and no systemd, so
//! RunPod machines cannot host k3s.
//!
//! Mapping onto the contract (design 5):
//!
//! - `plan`: `GET /v2/catalog/gpus?include=AVAILABILITY&product=POD&count=N&cloud=TIER`,
//!   once per cloud tier (`SECURE`, `COMMUNITY`; `include=AVAILABILITY` requires `product`,
//!   and `count` / `cloud` are valid only with it). One offer per (GPU type, tier, data
//!   centre listed in `dataCenters` with availability other than `NONE`): region = the
//!   data centre id, id `runpod/<dc>/<tier>/<gpu type id>`, price = `price.<tier>` ×
//!   count USD per hour (the spec: `price` is per GPU, "the rate for a unit is the figure
//!   times `gpu.count`"). RunPod's v2 API has no interruptible (spot) pods.
//! - `prepare`: re-checks stock (`GET /v2/catalog/gpus/{id}` with the same filters); reads
//!   the account's SSH keys (`GET /v2/account/ssh-keys`) and, when the project key is not
//!   among them (compared by value, ignoring the comment), registers it with
//!   `PUT /v2/account/ssh-keys` carrying the existing keys *plus* the project key (the PUT
//!   replaces the whole set: "Existing keys not present in the request are removed").
//!   Returns the merged key set. The spec offers no conditional PUT (no ETag), so a key
//!   the user adds in the dashboard between that GET and PUT would be lost; the window is
//!   one round trip, and it only opens when the project key is not registered yet.
//! - `create`: `POST /v2/pods` with the GPU type id and count, the tier, the data centre
//!   (`dataCenterIds`), `ports` `22/tcp` (plus the VM's ports as `<p>/tcp`), `startSsh`,
//!   and `env` `PUBLIC_KEY` = the merged key set (one key per line; RunPod images install
//!   `PUBLIC_KEY` into `authorized_keys`, and `startSsh` leaves a `PUBLIC_KEY` the request
//!   sets alone), so the pod gets the project key even if the account's set changes
//!   between prepare and create. Pods have no tags or labels: the identity is the name
//!   `gpuprov-<vm>-<lineage8>` plus `env` `GPUPROV_VM_NAME`, `GPUPROV_LINEAGE` and
//!   `GPUPROV_DATA_CENTER` (`Pod.env` is returned by every read).
//! - `observe`: `GET /v2/pods` (no filter exists), kept when the identity env matches (or,
//!   for a pod without it, the name) and the pod's data centre (`dataCenterId`, null until
//!   the scheduler assigns it, else `GPUPROV_DATA_CENTER`) is the location's region.
//! - `delete`: `DELETE /v2/pods/{id}` (`204`; `404` is success). `cleanup` has nothing to
//!   do: a pod has no side resources, and the project key stays registered (it is shared
//!   by the project's pods).
//! - `start` ([`Feature::Start`]): `POST /v2/pods/{id}/action` `{"action": "start"}`. A
//!   stopped pod is `EXITED` (spec `PodStatus`: "container exited (stopped)"; `stop`
//!   "releas[es] GPU/CPU compute while keeping its disk"), observed as `Stopped`.
//!
//! Errors show a short cause: the problem document's `detail` when the body is one, else
//! [`super::cause::http_cause`] (status, content type, first line), never a dumped page.
//! A refused connection is `Unreachable` (the whole cloud), with the endpoint redacted.
//!
//! SSH: `Pod.ssh.direct` (host, port, username; "null unless `22/tcp` is in `ports` and
//! the running pod has been assigned a public port"), else the `runtime.ports` entry with
//! `private` 22 and type `tcp` once its `ip` and `public` port are set. While neither is
//! there the pod is reported without an endpoint, and the core keeps waiting: a pod whose
//! ports are not mapped yet is not an error. The user is `username` of `ssh.direct`, else
//! `root` (RunPod containers run as root). The proxy endpoint (`ssh.proxy`) is not used:
//! it carries an interactive shell only, no SFTP or port forwarding.
//!
//! Credentials: the API key from the environment variable `RUNPOD_API_KEY`, else
//! `~/.runpod/config.toml`, where runpodctl writes `apiKey = "..."` (any case) and the
//! runpod-python CLI writes `[default] api_key = "..."`. Sent as `Authorization: Bearer`
//! (spec `bearerAuth`), never written to state, logs, `Debug` output or error messages.
//!
//! Rate limits: 60 requests a minute, 3,000 an hour, 50,000 a day per user (spec
//! `RateLimitPolicyHeader` example). The core has no request-rate limiter, so the adapter
//! declares a low concurrency, creates at least 1 s apart and a 10 s poll interval, and
//! relies on `429` + `Retry-After` beyond that (classified `Transient` with the delay).

mod errors;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Method;
use serde::Deserialize;
use serde_json::{json, Value};

pub use errors::{classify, exhausted_window_secs, ApiError, Call};

use super::{
    Capabilities, CloudProvider, ErrorKind, Feature, InstanceSpec, InstanceStatus, Lineage,
    Location, Observed, Offer, ProviderError, ResourceRequest, SshEndpoint,
};

/// The cloud name.
pub const CLOUD: &str = "runpod";
/// The API base URL when neither config nor environment overrides it (spec `servers`).
pub const DEFAULT_ENDPOINT: &str = "https://api.runpod.io";
/// Environment variable overriding the endpoint (wins over `[cloud.runpod] endpoint`).
pub const ENDPOINT_ENV: &str = "GPUPROV_RUNPOD_ENDPOINT";
/// Environment variable holding the API key (RunPod's SDKs and CLIs read it too).
pub const API_KEY_ENV: &str = "RUNPOD_API_KEY";
/// The RunPod CLIs' configuration file, relative to the home directory.
pub const CONFIG_FILE: &str = ".runpod/config.toml";
/// The image when the VM names none: RunPod's official PyTorch image (the spec's
/// `createPod` example), which honours `PUBLIC_KEY` and starts sshd.
pub const DEFAULT_IMAGE: &str = "runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404";
/// Login user when `ssh.direct` names none: RunPod containers run as root.
pub const SSH_USER: &str = "root";
/// Identity env keys of a pod (RunPod has no tags): VM name, lineage, data centre asked.
pub const ENV_VM_NAME: &str = "GPUPROV_VM_NAME";
pub const ENV_LINEAGE: &str = "GPUPROV_LINEAGE";
pub const ENV_DATA_CENTER: &str = "GPUPROV_DATA_CENTER";
/// The env key RunPod images read authorized keys from (spec `startSsh`).
pub const ENV_PUBLIC_KEY: &str = "PUBLIC_KEY";
/// Per-request timeout, seconds.
const REQUEST_TIMEOUT_SECS: u64 = 60;

/// The credential; its `Debug` never shows the value.
pub use super::Secret as ApiKey;

/// Configuration of the RunPod adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunpodSettings {
    /// API base URL override; `None` means [`DEFAULT_ENDPOINT`].
    pub endpoint: Option<String>,
    /// `None` when no key was found; calls then fail with `Credentials`.
    pub api_key: Option<ApiKey>,
    /// Where the key was found (`RUNPOD_API_KEY` or the file's path), or where gpuprov
    /// looked when it was not: shown in the `Credentials` error, never the key itself.
    pub key_source: String,
    /// The state's lineage (a UUID): `observe` only sees pods carrying it. Must be set
    /// before `prepare`/`create`/`observe`.
    pub lineage: Lineage,
}

/// The API key in a RunPod CLI configuration file's text: top-level `apiKey` (runpodctl;
/// its keys are case-insensitive), else `api_key` of the `[default]` profile
/// (runpod-python's `runpod config`). `None` when the text is not TOML or holds neither.
pub fn api_key_from_config(text: &str) -> Option<String> {
    let table: toml::Table = text.parse().ok()?;
    let str_of = |v: &toml::Value| {
        v.as_str()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    table
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("apikey"))
        .and_then(|(_, v)| str_of(v))
        .or_else(|| {
            table
                .get("default")
                .and_then(|d| d.get("api_key"))
                .and_then(str_of)
        })
}

/// The API key and where it came from: `env_value` (the value of `RUNPOD_API_KEY`) when
/// non-empty, else `<home>/.runpod/config.toml`. Without a key, the source names every
/// place looked at. Never puts the key (or file text that may hold it) in the source.
pub fn find_api_key(env_value: Option<String>, home: Option<&Path>) -> (Option<ApiKey>, String) {
    if let Some(k) = env_value
        .map(|k| k.trim().to_string())
        .filter(|k| !k.is_empty())
    {
        return (
            Some(ApiKey::new(k)),
            format!("the {API_KEY_ENV} environment variable"),
        );
    }
    let Some(path) = home.map(|h| h.join(CONFIG_FILE)) else {
        return (
            None,
            format!("the {API_KEY_ENV} environment variable (no home directory to look in)"),
        );
    };
    let looked = |what: &str| {
        format!(
            "the {API_KEY_ENV} environment variable, {} ({what})",
            path.display()
        )
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => match api_key_from_config(&text) {
            Some(k) => (Some(ApiKey::new(k)), path.display().to_string()),
            None => (
                None,
                looked("no apiKey, and no api_key in [default], or not valid TOML"),
            ),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (None, looked("not found")),
        Err(e) => (None, looked(&format!("unreadable: {}", e.kind()))),
    }
}

impl RunpodSettings {
    /// Settings from `[cloud.runpod] endpoint` and the environment: endpoint precedence
    /// `GPUPROV_RUNPOD_ENDPOINT` (non-empty) > `endpoint` > [`DEFAULT_ENDPOINT`]; the key
    /// from [`find_api_key`] with the user's home directory. `lineage` is left empty: the
    /// caller sets it from the state.
    pub fn from_env_and_config(endpoint: Option<String>, lineage: Lineage) -> RunpodSettings {
        let home: Option<PathBuf> = dirs::home_dir();
        let (api_key, key_source) = find_api_key(std::env::var(API_KEY_ENV).ok(), home.as_deref());
        RunpodSettings {
            endpoint: super::endpoint_from(ENDPOINT_ENV, endpoint),
            api_key,
            key_source,
            lineage,
        }
    }
}

/// The RunPod adapter. Construction does no I/O.
pub struct RunpodProvider {
    settings: RunpodSettings,
    http: reqwest::Client,
    capabilities: Option<Capabilities>,
}

/// A RunPod cloud tier (spec `Cloud`: `SECURE` = RunPod-owned data centres, `COMMUNITY` =
/// community-hosted hardware).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tier {
    Secure,
    Community,
}

impl Tier {
    /// Both tiers, in the order offers of equal price are tried.
    pub const ALL: [Tier; 2] = [Tier::Secure, Tier::Community];

    /// The API spelling (`SECURE`, `COMMUNITY`).
    pub fn as_api(self) -> &'static str {
        match self {
            Tier::Secure => "SECURE",
            Tier::Community => "COMMUNITY",
        }
    }

    /// The tier an API spelling names.
    pub fn from_api(s: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|t| t.as_api() == s)
    }
}

// ---- API payloads (only the fields gpuprov reads) ----

#[derive(Debug, Clone, Deserialize)]
struct GpuList {
    gpus: Vec<GpuType>,
}

#[derive(Debug, Clone, Deserialize)]
struct GpuType {
    id: String,
    name: String,
    #[serde(default)]
    secure: bool,
    #[serde(default)]
    community: bool,
    price: PerTier<f64>,
    #[serde(rename = "maxCount")]
    max_count: PerTier<u32>,
    #[serde(default, rename = "dataCenters")]
    data_centers: Vec<DataCenterStock>,
}

#[derive(Debug, Clone, Deserialize)]
struct PerTier<T> {
    secure: T,
    community: T,
}

#[derive(Debug, Clone, Deserialize)]
struct DataCenterStock {
    id: String,
    availability: String,
}

impl GpuType {
    fn in_tier(&self, t: Tier) -> bool {
        match t {
            Tier::Secure => self.secure,
            Tier::Community => self.community,
        }
    }
    fn price(&self, t: Tier) -> f64 {
        match t {
            Tier::Secure => self.price.secure,
            Tier::Community => self.price.community,
        }
    }
    fn max_count(&self, t: Tier) -> u32 {
        match t {
            Tier::Secure => self.max_count.secure,
            Tier::Community => self.max_count.community,
        }
    }
    /// The data centres with stock (`availability` other than `NONE`).
    fn stocked(&self) -> impl Iterator<Item = &DataCenterStock> {
        self.data_centers
            .iter()
            .filter(|d| d.availability != "NONE")
    }
}

#[derive(Debug, Clone, Deserialize)]
struct SshKeys {
    keys: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct PodList {
    pods: Vec<Pod>,
}

#[derive(Debug, Clone, Deserialize)]
struct Pod {
    id: String,
    #[serde(default)]
    name: String,
    status: String,
    #[serde(default)]
    env: Option<BTreeMap<String, Value>>,
    #[serde(default, rename = "dataCenterId")]
    data_center_id: Option<String>,
    #[serde(default)]
    ssh: Option<PodSsh>,
    #[serde(default)]
    runtime: Option<PodRuntime>,
}

#[derive(Debug, Clone, Deserialize)]
struct PodSsh {
    #[serde(default)]
    direct: Option<PodSshEndpoint>,
}

#[derive(Debug, Clone, Deserialize)]
struct PodSshEndpoint {
    #[serde(default)]
    host: String,
    #[serde(default)]
    port: i64,
    #[serde(default)]
    username: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct PodRuntime {
    #[serde(default)]
    ports: Option<Vec<RuntimePort>>,
}

#[derive(Debug, Clone, Deserialize)]
struct RuntimePort {
    #[serde(default)]
    private: Option<i64>,
    #[serde(default)]
    public: Option<i64>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    ip: Option<String>,
}

impl Pod {
    fn env(&self, key: &str) -> Option<&str> {
        self.env.as_ref()?.get(key)?.as_str()
    }
}

/// A GPU name reduced to uppercase letters and digits (`RTX 4090` = `rtx4090`).
fn norm(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_uppercase())
        .collect()
}

/// Whether the ask's GPU model `want` names the catalog type `id` / `name`: the type id
/// exactly (ignoring case, `NVIDIA H100 80GB HBM3`), the name ignoring case and
/// punctuation (`rtx4090` = `RTX 4090`), or the name's leading words (`H100` names
/// `H100 SXM`, `H100 PCIe` and `H100 NVL`; whole words only, so `L40` never names `L40S`
/// and `A40` never names `A4000`).
pub fn gpu_matches(want: &str, id: &str, name: &str) -> bool {
    let want = want.trim();
    if want.is_empty() {
        return false;
    }
    if want.eq_ignore_ascii_case(id) || norm(want) == norm(name) {
        return true;
    }
    let w: Vec<String> = want.split_whitespace().map(norm).collect();
    let n: Vec<String> = name.split_whitespace().map(norm).collect();
    n.len() > w.len() && n[..w.len()] == w[..]
}

/// The OpenSSH key without its comment (`type base64`), for comparing keys by value.
fn key_value(k: &str) -> String {
    k.split_whitespace().take(2).collect::<Vec<_>>().join(" ")
}

/// A path segment percent-encoded (GPU type ids hold spaces: `NVIDIA H100 80GB HBM3`).
fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Normalised status of a RunPod `PodStatus`; `None` for `TERMINATED` (gone).
/// `PROVISIONING`/`STARTING` → Pending, `RUNNING` → Running, `EXITED` → Stopped,
/// `ERROR` → Failed.
fn status_of(s: &str) -> Option<InstanceStatus> {
    Some(match s {
        "PROVISIONING" | "STARTING" => InstanceStatus::Pending,
        "RUNNING" => InstanceStatus::Running,
        "EXITED" => InstanceStatus::Stopped,
        "ERROR" => InstanceStatus::Failed("container in an unrecoverable error state".into()),
        "TERMINATED" => return None,
        other => InstanceStatus::Failed(format!("unknown RunPod status `{other}`")),
    })
}

/// The pod's direct SSH endpoint: `ssh.direct`, else the published `22/tcp` mapping of
/// `runtime.ports`. `None` while the port is not mapped yet (null `direct`, null
/// `runtime`, a null `public` port or `ip`): not ready, not an error.
fn ssh_endpoint(p: &Pod) -> Option<SshEndpoint> {
    if let Some(d) = p.ssh.as_ref().and_then(|s| s.direct.as_ref()) {
        if let (false, Ok(port)) = (d.host.trim().is_empty(), u16::try_from(d.port)) {
            if port != 0 {
                let user = d
                    .username
                    .as_deref()
                    .map(str::trim)
                    .filter(|u| !u.is_empty())
                    .unwrap_or(SSH_USER);
                return Some(SshEndpoint {
                    host: d.host.trim().to_string(),
                    port,
                    user: Some(user.to_string()),
                });
            }
        }
    }
    let ports = p.runtime.as_ref()?.ports.as_ref()?;
    ports.iter().find_map(|m| {
        if m.private != Some(22) || m.kind.as_deref() != Some("tcp") {
            return None;
        }
        let host = m.ip.as_deref().map(str::trim).filter(|h| !h.is_empty())?;
        let port = u16::try_from(m.public?).ok().filter(|p| *p != 0)?;
        Some(SshEndpoint {
            host: host.to_string(),
            port,
            user: Some(SSH_USER.to_string()),
        })
    })
}

/// Whether a listed pod belongs to `vm_name` of `lineage` at data centre `region`: both
/// identity env values (or, for a pod without them, the gpuprov name), and the data
/// centre — `dataCenterId`, else the one asked for at create (`GPUPROV_DATA_CENTER`); a
/// pod with neither is seen everywhere rather than missed (a missed pod would be created
/// twice). Data centre ids compare as whole ids, ignoring case (`US-KS-2` ≠ `US-KS-20`).
fn is_ours(p: &Pod, region: &str, vm_name: &str, lineage: &str) -> bool {
    let identity = match (p.env(ENV_VM_NAME), p.env(ENV_LINEAGE)) {
        (Some(vm), Some(lin)) => vm == vm_name && lin == lineage,
        (None, None) => p.name == RunpodProvider::object_name(vm_name, lineage),
        _ => false,
    };
    let dc = p
        .data_center_id
        .as_deref()
        .filter(|d| !d.is_empty())
        .or_else(|| p.env(ENV_DATA_CENTER));
    identity && dc.is_none_or(|d| d.eq_ignore_ascii_case(region))
}

/// Offers of the catalog (`(tier, gpu types)` per tier) for the ask, in order: by the
/// ask's region order when it names regions, then price, then tier (secure first), then
/// GPU type and data centre. Regions match data centre ids as whole ids, ignoring case.
fn offers_for(catalog: &[(Tier, Vec<GpuType>)], req: &ResourceRequest, count: u32) -> Vec<Offer> {
    let mut offers = Vec::new();
    for (tier, gpus) in catalog {
        for g in gpus {
            if !g.in_tier(*tier) || g.max_count(*tier) < count {
                continue;
            }
            if let Some(want) = &req.gpu {
                if !gpu_matches(want, &g.id, &g.name) {
                    continue;
                }
            }
            for dc in g.stocked() {
                if !req.regions.is_empty()
                    && !req.regions.iter().any(|r| r.eq_ignore_ascii_case(&dc.id))
                {
                    continue;
                }
                offers.push(Offer {
                    id: format!(
                        "{CLOUD}/{}/{}/{}",
                        dc.id,
                        tier.as_api().to_ascii_lowercase(),
                        g.id
                    ),
                    location: Location {
                        cloud: CLOUD.to_string(),
                        region: dc.id.clone(),
                        zone: None,
                    },
                    instance_type: g.id.clone(),
                    gpu: Some(g.name.clone()),
                    gpu_count: count,
                    spot: false,
                    price_per_hour: g.price(*tier) * count as f64,
                    detail: json!({
                        "tier": tier.as_api(),
                        "gpu_type_id": g.id,
                        "availability": dc.availability,
                    }),
                });
            }
        }
    }
    let rank = |o: &Offer| {
        req.regions
            .iter()
            .position(|r| r.eq_ignore_ascii_case(&o.location.region))
            .unwrap_or(0)
    };
    let tier = |o: &Offer| {
        o.detail["tier"]
            .as_str()
            .and_then(Tier::from_api)
            .unwrap_or(Tier::Community)
    };
    offers.sort_by(|a, b| {
        rank(a)
            .cmp(&rank(b))
            .then(a.price_per_hour.total_cmp(&b.price_per_hour))
            .then(tier(a).cmp(&tier(b)))
            .then(a.instance_type.cmp(&b.instance_type))
            .then(a.location.region.cmp(&b.location.region))
    });
    offers
}

impl RunpodProvider {
    /// An adapter for `settings`. Never fails and does no I/O.
    pub fn new(settings: RunpodSettings) -> RunpodProvider {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(REQUEST_TIMEOUT_SECS))
            .user_agent(concat!("gpuprov/", env!("CARGO_PKG_VERSION")))
            .build()
            .unwrap_or_default();
        RunpodProvider {
            settings,
            http,
            capabilities: None,
        }
    }

    /// Replaces the declared capabilities (tests use short timeouts and poll intervals).
    pub fn with_capabilities(mut self, caps: Capabilities) -> RunpodProvider {
        self.capabilities = Some(caps);
        self
    }

    /// The capabilities RunPod's documentation implies (see [`CloudProvider::capabilities`]).
    pub fn default_capabilities() -> Capabilities {
        Capabilities {
            supported: vec![Feature::Gpu, Feature::Start],
            boot_timeout: Duration::from_secs(20 * 60),
            ssh_timeout: Duration::from_secs(10 * 60),
            delete_timeout: Duration::from_secs(10 * 60),
            poll_interval: Duration::from_secs(10),
            max_concurrency: 2,
            min_create_interval: Duration::from_secs(1),
            create_list_lag: Duration::from_secs(20),
            default_regions: Vec::new(),
            keeps_offer_order: false,
        }
    }

    pub fn settings(&self) -> &RunpodSettings {
        &self.settings
    }

    /// The pod name: `gpuprov-<vm>-<first 8 chars of lineage>`.
    pub fn object_name(vm_name: &str, lineage: &str) -> String {
        let short: String = lineage.chars().take(8).collect();
        format!("gpuprov-{vm_name}-{short}")
    }

    fn base(&self) -> &str {
        self.settings
            .endpoint
            .as_deref()
            .unwrap_or(DEFAULT_ENDPOINT)
            .trim_end_matches('/')
    }

    fn lineage(&self) -> &str {
        self.settings.lineage.as_str()
    }

    fn secret(&self) -> Option<&str> {
        self.settings.api_key.as_ref().map(ApiKey::expose)
    }

    fn classify(&self, e: &ApiError, call: Call, what: &str) -> ProviderError {
        classify(e, call, what, self.secret())
    }

    /// One API call; returns the JSON body (`Null` for an empty one, such as a `204`) or
    /// the error as RunPod reported it.
    async fn call_raw(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<Result<Value, ApiError>, ProviderError> {
        let Some(key) = &self.settings.api_key else {
            return Err(ProviderError::new(
                ErrorKind::Credentials,
                format!(
                    "no RunPod API key: set {API_KEY_ENV} or run `runpodctl config --apiKey …` \
                     (looked in: {})",
                    self.settings.key_source
                ),
            ));
        };
        let url = format!("{}{path}", self.base());
        let mut req = self.http.request(method, &url).bearer_auth(key.expose());
        if !query.is_empty() {
            req = req.query(query);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let transport = |e: reqwest::Error| ApiError {
            status: None,
            title: None,
            message: format!("{} ({})", e.without_url(), super::redact::redact_url(&url)),
            raw: false,
            retry_after_secs: None,
        };
        let resp = match req.send().await {
            Ok(r) => r,
            // Nothing was sent: the endpoint is unreachable for every region at once.
            Err(e) if super::cause::is_refused(&e) => {
                return Err(ProviderError::new(
                    ErrorKind::Unreachable,
                    format!(
                        "runpod: the API endpoint refused the connection ({})",
                        super::redact::redact_url(&url)
                    ),
                ))
            }
            Err(e) => return Ok(Err(transport(e))),
        };
        let status = resp.status().as_u16();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let retry_after = header("retry-after");
        let rate_limit = header("ratelimit");
        let content_type = header("content-type");
        let text = match resp.text().await {
            Ok(t) => t,
            Err(e) => return Ok(Err(transport(e))),
        };
        if !(200..300).contains(&status) {
            return Ok(Err(ApiError::from_http(
                status,
                content_type.as_deref(),
                &text,
                retry_after.as_deref(),
                rate_limit.as_deref(),
            )));
        }
        if text.trim().is_empty() {
            return Ok(Ok(Value::Null));
        }
        let v: Value = serde_json::from_str(&text).map_err(|e| {
            ProviderError::new(
                ErrorKind::Failed,
                format!("runpod {path}: unreadable response: {e}"),
            )
        })?;
        Ok(Ok(v))
    }

    /// [`Self::call_raw`] with errors classified as `call`; parses the body into `T`.
    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
        call: Call,
        what: &str,
    ) -> Result<T, ProviderError> {
        let v = self
            .call_raw(method, path, query, body)
            .await?
            .map_err(|e| self.classify(&e, call, what))?;
        serde_json::from_value(v).map_err(|e| {
            ProviderError::new(
                ErrorKind::Failed,
                format!("runpod {what}: unexpected response shape: {e}"),
            )
        })
    }

    /// The availability filters of a catalog read: `include=AVAILABILITY&product=POD`
    /// (the spec: `include=AVAILABILITY` requires `product`) with the GPU count and tier
    /// (valid only with `include`).
    fn stock_query(tier: Tier, count: u32) -> Vec<(&'static str, String)> {
        vec![
            ("include", "AVAILABILITY".into()),
            ("product", "POD".into()),
            ("count", count.max(1).to_string()),
            ("cloud", tier.as_api().into()),
        ]
    }

    /// The GPU catalog of `tier` with pod stock for `count` GPUs.
    async fn catalog(&self, tier: Tier, count: u32) -> Result<Vec<GpuType>, ProviderError> {
        let list: GpuList = self
            .call(
                Method::GET,
                "/v2/catalog/gpus",
                &Self::stock_query(tier, count),
                None,
                Call::Other,
                &format!("list GPU types ({} cloud)", tier.as_api()),
            )
            .await?;
        Ok(list.gpus)
    }

    /// The account's SSH keys, with the project key added (by value) through a `PUT` of
    /// the whole set when it is missing. Returns the account's set as it now stands.
    async fn ensure_key(&self, public_key: &str) -> Result<Vec<String>, ProviderError> {
        let want = key_value(public_key);
        if want.is_empty() {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                "the project's SSH public key is empty",
            ));
        }
        let have: SshKeys = self
            .call(
                Method::GET,
                "/v2/account/ssh-keys",
                &[],
                None,
                Call::Other,
                "list SSH keys",
            )
            .await?;
        let keys: Vec<String> = have
            .keys
            .into_iter()
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty())
            .collect();
        if keys.iter().any(|k| key_value(k) == want) {
            return Ok(keys);
        }
        // The PUT replaces the whole set: send every existing key plus ours.
        let mut merged = keys;
        merged.push(public_key.trim().to_string());
        let body = json!({ "keys": merged });
        let now: SshKeys = self
            .call(
                Method::PUT,
                "/v2/account/ssh-keys",
                &[],
                Some(&body),
                Call::Other,
                "register the project's SSH key",
            )
            .await?;
        Ok(now.keys)
    }
}

/// The tier and GPU type id an offer of this adapter carries in `detail`.
fn offer_tier(offer: &Offer) -> Result<(Tier, String), ProviderError> {
    let tier = offer.detail["tier"]
        .as_str()
        .and_then(Tier::from_api)
        .ok_or_else(|| {
            ProviderError::new(
                ErrorKind::InvalidRequest,
                format!("runpod offer {} has no cloud tier", offer.id),
            )
        })?;
    let id = offer.detail["gpu_type_id"]
        .as_str()
        .unwrap_or(&offer.instance_type)
        .to_string();
    Ok((tier, id))
}

#[async_trait]
impl CloudProvider for RunpodProvider {
    fn name(&self) -> &'static str {
        CLOUD
    }

    fn endpoint_override(&self) -> Option<String> {
        self.settings
            .endpoint
            .as_deref()
            .map(super::redact::redact_url)
    }

    /// GPUs only: no boot script (pods are containers started from an image), no firewall
    /// API (exposed ports are mapped to other public ports), no k3s, no spot. Pods pull
    /// their image while booting, so the boot timeout is generous. `max_concurrency` and
    /// `min_create_interval` keep one process well inside the documented 60 requests a
    /// minute; a 429 beyond that carries `Retry-After`.
    fn capabilities(&self) -> Capabilities {
        self.capabilities
            .clone()
            .unwrap_or_else(Self::default_capabilities)
    }

    /// Offers from the GPU catalog with pod stock, once per tier (see the module docs).
    /// A GPU count of 0 asks for 1. An empty list means "no stock now". Errors: a spot
    /// ask, or no GPU type with that model and count in any tier → `InvalidRequest`.
    async fn plan(&self, req: &ResourceRequest) -> Result<Vec<Offer>, ProviderError> {
        if req.spot {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                "RunPod's REST API v2 has no spot (interruptible) pods",
            ));
        }
        let count = req.gpu_count.max(1);
        let mut catalog = Vec::new();
        for tier in Tier::ALL {
            catalog.push((tier, self.catalog(tier, count).await?));
        }
        let exists = catalog.iter().any(|(tier, gpus)| {
            gpus.iter().any(|g| {
                g.in_tier(*tier)
                    && g.max_count(*tier) >= count
                    && req
                        .gpu
                        .as_ref()
                        .is_none_or(|w| gpu_matches(w, &g.id, &g.name))
            })
        });
        if !exists {
            let mut have: Vec<String> = catalog
                .iter()
                .flat_map(|(tier, gpus)| {
                    gpus.iter()
                        .filter(|g| g.in_tier(*tier))
                        .map(|g| format!("{} x{}", g.name, g.max_count(*tier)))
                })
                .collect();
            have.sort();
            have.dedup();
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "RunPod has no GPU type with {} x{count}; it has (name x max count): {}",
                    req.gpu.as_deref().unwrap_or("any GPU"),
                    have.join(", ")
                ),
            ));
        }
        Ok(offers_for(&catalog, req, count))
    }

    /// Re-checks the offer's stock (`GET /v2/catalog/gpus/{id}` with the offer's tier and
    /// count; gone → `Unavailable`), then makes sure the project key is registered on the
    /// account without dropping the user's keys. Returns `{"public_keys": [..]}`, the
    /// account's key set including the project key (public keys only).
    async fn prepare(&self, offer: &Offer, spec: &InstanceSpec) -> Result<Value, ProviderError> {
        self.lineage();
        let (tier, gpu_id) = offer_tier(offer)?;
        let path = format!("/v2/catalog/gpus/{}", encode_segment(&gpu_id));
        let what = format!("re-check stock of {gpu_id} ({} cloud)", tier.as_api());
        let query = Self::stock_query(tier, offer.gpu_count);
        let gone = || {
            ProviderError::new(
                ErrorKind::Unavailable,
                format!(
                    "runpod: no {} stock left for {gpu_id} x{} in {}",
                    tier.as_api(),
                    offer.gpu_count.max(1),
                    offer.location.region
                ),
            )
        };
        let gpu: GpuType = match self.call_raw(Method::GET, &path, &query, None).await? {
            Ok(v) => serde_json::from_value(v).map_err(|e| {
                ProviderError::new(
                    ErrorKind::Failed,
                    format!("runpod {what}: unexpected response shape: {e}"),
                )
            })?,
            Err(e) if e.is_not_found() => return Err(gone()),
            Err(e) => return Err(self.classify(&e, Call::Other, &what)),
        };
        if !gpu
            .stocked()
            .any(|d| d.id.eq_ignore_ascii_case(&offer.location.region))
        {
            return Err(gone());
        }
        let keys = self.ensure_key(&spec.ssh_public_key).await?;
        Ok(json!({ "public_keys": keys }))
    }

    /// `POST /v2/pods` (see the module docs for the body). Returns the pod id.
    ///
    /// `createPod` takes no idempotency token (`spec.client_token` is unused): a create
    /// repeated after a crash is avoided by the core's observe-before-create, which finds
    /// the pod by its identity env even before the scheduler assigns its data centre.
    /// Errors: a boot script → `InvalidRequest` (RunPod cannot run one).
    async fn create(
        &self,
        offer: &Offer,
        prepared: &Value,
        spec: &InstanceSpec,
    ) -> Result<String, ProviderError> {
        crate::provider::check_spec_lineage(CLOUD, &self.settings.lineage, spec)?;
        let lineage = self.settings.lineage.as_str();
        if spec.boot_script.is_some() {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                "RunPod pods cannot run a boot script (containers, no cloud-init)",
            ));
        }
        let (tier, gpu_id) = offer_tier(offer)?;
        let keys: Vec<&str> = prepared["public_keys"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let want = key_value(&spec.ssh_public_key);
        if !keys.iter().any(|k| key_value(k) == want) {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                "prepared data does not hold the project's SSH key",
            ));
        }
        let mut ports = vec!["22/tcp".to_string()];
        for p in &spec.ports {
            let entry = format!("{p}/tcp");
            if !ports.contains(&entry) {
                ports.push(entry);
            }
        }
        let region = &offer.location.region;
        let mut body = json!({
            "name": Self::object_name(&spec.vm_name, lineage),
            "image": spec
                .image
                .as_deref()
                .filter(|s| !s.trim().is_empty())
                .unwrap_or(DEFAULT_IMAGE),
            "gpu": { "id": gpu_id, "count": offer.gpu_count.max(1) },
            "cloud": tier.as_api(),
            "dataCenterIds": [region],
            "ports": ports,
            "startSsh": true,
            "env": {
                ENV_PUBLIC_KEY: keys.join("\n"),
                ENV_VM_NAME: spec.vm_name,
                ENV_LINEAGE: lineage,
                ENV_DATA_CENTER: region,
            },
        });
        if let Some(gb) = spec.disk_gb.filter(|g| *g > 0) {
            body["disk"] = json!(gb);
        }
        let what = format!(
            "create pod on {gpu_id} x{} ({} cloud) in {region}",
            offer.gpu_count.max(1),
            tier.as_api()
        );
        #[derive(Deserialize)]
        struct Created {
            id: String,
        }
        let pod: Created = self
            .call(
                Method::POST,
                "/v2/pods",
                &[],
                Some(&body),
                Call::CreatePod,
                &what,
            )
            .await?;
        Ok(pod.id)
    }

    /// `GET /v2/pods`, keeping this VM's pods at `at.region` (see [`is_ours`]) except
    /// `TERMINATED` ones, sorted by id, with the direct SSH endpoint once the pod's `22/tcp`
    /// is mapped (none before: the core keeps waiting).
    async fn observe(&self, at: &Location, vm_name: &str) -> Result<Vec<Observed>, ProviderError> {
        let lineage = self.lineage();
        if at.cloud != CLOUD {
            return Ok(vec![]);
        }
        let list: PodList = self
            .call(Method::GET, "/v2/pods", &[], None, Call::Other, "list pods")
            .await?;
        let mut out: Vec<Observed> = list
            .pods
            .iter()
            .filter(|p| is_ours(p, &at.region, vm_name, lineage))
            .filter_map(|p| {
                Some(Observed {
                    instance_id: p.id.clone(),
                    status: status_of(&p.status)?,
                    ssh: ssh_endpoint(p),
                })
            })
            .collect();
        out.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
        Ok(out)
    }

    /// `DELETE /v2/pods/{id}` for each id; `404` (unknown or already deleted) is success.
    async fn delete(
        &self,
        _at: &Location,
        _vm_name: &str,
        instance_ids: &[String],
    ) -> Result<(), ProviderError> {
        for id in instance_ids {
            let path = format!("/v2/pods/{}", encode_segment(id));
            match self.call_raw(Method::DELETE, &path, &[], None).await? {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(self.classify(&e, Call::Other, &format!("delete pod {id}"))),
            }
        }
        Ok(())
    }

    /// Nothing to clean: a pod has no side resources, and the project key stays registered
    /// on the account (it is shared by the project's pods).
    async fn cleanup(&self, _at: &Location, _vm_name: &str) -> Result<(), ProviderError> {
        Ok(())
    }

    /// `POST /v2/pods/{id}/action` with `{"action": "start"}` (spec `podAction`: "boot a
    /// stopped pod (`EXITED` or `ERROR`) back toward `RUNNING`"; `200` with the pod).
    /// A `409` ("not valid for the pod's current status") is success when `getPod` shows
    /// the pod already `RUNNING`, `STARTING` or `PROVISIONING`. Errors: `400` → `Capacity`
    /// (see [`classify`]: the spec documents no capacity answer for a start), others as
    /// [`classify`] says; a pod that no longer exists (`404`) → `Failed`.
    async fn start(
        &self,
        _at: &Location,
        _vm_name: &str,
        instance_id: &str,
    ) -> Result<(), ProviderError> {
        let what = format!("start pod {instance_id}");
        let pod = format!("/v2/pods/{}", encode_segment(instance_id));
        let body = json!({ "action": "start" });
        let refused = match self
            .call_raw(Method::POST, &format!("{pod}/action"), &[], Some(&body))
            .await?
        {
            Ok(_) => return Ok(()),
            Err(e) if e.status == Some(409) => e,
            Err(e) => return Err(self.classify(&e, Call::StartPod, &what)),
        };
        let now: Pod = self
            .call(Method::GET, &pod, &[], None, Call::Other, &what)
            .await?;
        match now.status.as_str() {
            "RUNNING" | "STARTING" | "PROVISIONING" => Ok(()),
            other => {
                let mut e = self.classify(&refused, Call::StartPod, &what);
                e.msg = format!("{} (the pod is {other})", e.msg);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(id: &str, name: &str, price: (f64, f64), max: (u32, u32), dcs: &[&str]) -> GpuType {
        GpuType {
            id: id.into(),
            name: name.into(),
            secure: max.0 > 0,
            community: max.1 > 0,
            price: PerTier {
                secure: price.0,
                community: price.1,
            },
            max_count: PerTier {
                secure: max.0,
                community: max.1,
            },
            data_centers: dcs
                .iter()
                .map(|d| DataCenterStock {
                    id: (*d).into(),
                    availability: "HIGH".into(),
                })
                .collect(),
        }
    }

    fn ask(gpu: Option<&str>, count: u32, regions: &[&str]) -> ResourceRequest {
        ResourceRequest {
            vm_name: "a".into(),
            regions: regions.iter().map(|r| (*r).into()).collect(),
            zones: vec![],
            gpu: gpu.map(str::to_string),
            gpu_count: count,
            spot: false,
            max_price_per_hour: None,
        }
    }

    fn pod(v: Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn gpu_models_match_by_id_name_or_leading_words() {
        assert!(gpu_matches("H100", "NVIDIA H100 80GB HBM3", "H100 SXM"));
        assert!(gpu_matches("h100 sxm", "NVIDIA H100 80GB HBM3", "H100 SXM"));
        assert!(gpu_matches(
            "nvidia h100 80gb hbm3",
            "NVIDIA H100 80GB HBM3",
            "H100 SXM"
        ));
        assert!(gpu_matches(
            "rtx4090",
            "NVIDIA GeForce RTX 4090",
            "RTX 4090"
        ));
        assert!(!gpu_matches("L40", "NVIDIA L40S", "L40S"));
        assert!(!gpu_matches("A40", "NVIDIA RTX A4000", "RTX A4000"));
        assert!(!gpu_matches("H100 SXM", "NVIDIA H100 NVL", "H100 NVL"));
        assert!(!gpu_matches("", "x", "y"));
    }

    #[test]
    fn offers_per_tier_and_data_centre_with_exact_regions() {
        let h100 = gpu(
            "NVIDIA H100 80GB HBM3",
            "H100 SXM",
            (2.99, 2.69),
            (8, 8),
            &["US-KS-2", "US-KS-20"],
        );
        let a100 = gpu(
            "NVIDIA A100 80GB PCIe",
            "A100 PCIe",
            (1.64, 1.19),
            (8, 0),
            &["US-KS-2"],
        );
        let catalog = vec![
            (Tier::Secure, vec![h100.clone(), a100.clone()]),
            (Tier::Community, vec![h100.clone(), a100.clone()]),
        ];
        let o = offers_for(&catalog, &ask(Some("H100"), 8, &["US-KS-2"]), 8);
        let ids: Vec<&str> = o.iter().map(|o| o.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "runpod/US-KS-2/community/NVIDIA H100 80GB HBM3",
                "runpod/US-KS-2/secure/NVIDIA H100 80GB HBM3"
            ]
        );
        assert!(
            (o[0].price_per_hour - 21.52).abs() < 1e-9,
            "{}",
            o[0].price_per_hour
        );
        assert_eq!(o[0].gpu.as_deref(), Some("H100 SXM"));
        assert_eq!(o[0].detail["tier"], "COMMUNITY");
        // `us-ks-2` names US-KS-2 only, never US-KS-20; `US-KS` names nothing.
        let o = offers_for(&catalog, &ask(Some("H100"), 8, &["us-ks-2"]), 8);
        assert!(o.iter().all(|o| o.location.region == "US-KS-2"));
        assert!(offers_for(&catalog, &ask(Some("H100"), 8, &["US-KS"]), 8).is_empty());
        // The A100 has no community machines: one secure offer.
        let o = offers_for(&catalog, &ask(Some("A100"), 2, &[]), 2);
        assert_eq!(o.len(), 1);
        assert_eq!(o[0].detail["tier"], "SECURE");
        // More GPUs than the largest machine: none.
        assert!(offers_for(&catalog, &ask(Some("A100"), 16, &[]), 16).is_empty());
        // Region preference first, then price.
        let o = offers_for(&catalog, &ask(None, 1, &["US-KS-20", "US-KS-2"]), 1);
        assert_eq!(o[0].location.region, "US-KS-20");
    }

    #[test]
    fn statuses_map_and_terminated_is_gone() {
        assert_eq!(status_of("PROVISIONING"), Some(InstanceStatus::Pending));
        assert_eq!(status_of("STARTING"), Some(InstanceStatus::Pending));
        assert_eq!(status_of("RUNNING"), Some(InstanceStatus::Running));
        assert_eq!(status_of("EXITED"), Some(InstanceStatus::Stopped));
        assert!(matches!(
            status_of("ERROR"),
            Some(InstanceStatus::Failed(_))
        ));
        assert_eq!(status_of("TERMINATED"), None);
    }

    #[test]
    fn ssh_endpoint_from_direct_then_runtime_ports_and_none_while_unmapped() {
        let base = json!({"id": "p", "name": "n", "status": "RUNNING"});
        let with = |extra: Value| {
            let mut v = base.clone();
            for (k, x) in extra.as_object().unwrap() {
                v[k] = x.clone();
            }
            pod(v)
        };
        let direct = with(json!({"ssh": {"proxy": null, "direct": {
            "host": "127.0.0.9", "port": 34446, "username": "root", "command": "ssh"}}}));
        assert_eq!(
            ssh_endpoint(&direct),
            Some(SshEndpoint {
                host: "127.0.0.9".into(),
                port: 34446,
                user: Some("root".into())
            })
        );
        let mapped = with(
            json!({"ssh": {"proxy": null, "direct": null}, "runtime": {"ports": [
            {"private": 8888, "public": 40000, "type": "http", "ip": "127.0.0.9"},
            {"private": 22, "public": 40022, "type": "tcp", "ip": "127.0.0.9"}]}}),
        );
        assert_eq!(ssh_endpoint(&mapped).unwrap().port, 40022);
        for unmapped in [
            json!({}),
            json!({"ssh": {"proxy": null, "direct": null}, "runtime": null}),
            json!({"runtime": {}}),
            json!({"runtime": {"ports": null}}),
            json!({"runtime": {"ports": []}}),
            json!({"runtime": {"ports": [{"private": 22, "public": null, "type": "tcp", "ip": null}]}}),
            json!({"runtime": {"ports": [{"private": 22, "public": 40022, "type": "tcp", "ip": null}]}}),
        ] {
            assert_eq!(ssh_endpoint(&with(unmapped.clone())), None, "{unmapped}");
        }
    }

    #[test]
    fn ownership_needs_identity_and_data_centre() {
        let lin = "0f0e0d0c-1111";
        let p = |env: Value, dc: Value, name: &str| {
            pod(
                json!({"id": "p", "name": name, "status": "RUNNING", "env": env, "dataCenterId": dc}),
            )
        };
        let ours = json!({ENV_VM_NAME: "a", ENV_LINEAGE: lin, ENV_DATA_CENTER: "US-KS-2"});
        assert!(is_ours(
            &p(ours.clone(), json!("US-KS-2"), "x"),
            "US-KS-2",
            "a",
            lin
        ));
        assert!(!is_ours(
            &p(ours.clone(), json!("US-KS-2"), "x"),
            "US-KS-20",
            "a",
            lin
        ));
        // Not yet scheduled: the data centre asked for at create decides.
        assert!(is_ours(
            &p(ours.clone(), Value::Null, "x"),
            "US-KS-2",
            "a",
            lin
        ));
        assert!(!is_ours(&p(ours, Value::Null, "x"), "EU-RO-1", "a", lin));
        let other = json!({ENV_VM_NAME: "a", ENV_LINEAGE: "zzz"});
        assert!(!is_ours(
            &p(other, json!("US-KS-2"), "gpuprov-a-0f0e0d0c"),
            "US-KS-2",
            "a",
            lin
        ));
        // No identity env: the gpuprov name.
        assert!(is_ours(
            &p(json!({}), json!("US-KS-2"), "gpuprov-a-0f0e0d0c"),
            "US-KS-2",
            "a",
            lin
        ));
        assert!(!is_ours(
            &p(json!({}), json!("US-KS-2"), "mine"),
            "US-KS-2",
            "a",
            lin
        ));
    }

    #[test]
    fn api_key_from_the_runpod_cli_config_files() {
        assert_eq!(
            api_key_from_config("apiUrl = \"https://api.runpod.io/graphql\"\napiKey = \"rpa_x\"\n")
                .as_deref(),
            Some("rpa_x")
        );
        assert_eq!(
            api_key_from_config("apikey = 'rpa_y'").as_deref(),
            Some("rpa_y")
        );
        assert_eq!(
            api_key_from_config("[default]\napi_key = \"rpa_z\"\n").as_deref(),
            Some("rpa_z")
        );
        assert_eq!(api_key_from_config("apiKey = \"\""), None);
        assert_eq!(api_key_from_config("not toml = = ="), None);

        let home = tempfile::tempdir().unwrap();
        let (k, src) = find_api_key(Some("  env_key ".into()), Some(home.path()));
        assert_eq!(k, Some(ApiKey::new("env_key")));
        assert!(src.contains(API_KEY_ENV));
        let (k, src) = find_api_key(None, Some(home.path()));
        assert_eq!(k, None);
        assert!(
            src.contains(API_KEY_ENV) && src.contains("config.toml"),
            "{src}"
        );
        std::fs::create_dir_all(home.path().join(".runpod")).unwrap();
        std::fs::write(home.path().join(CONFIG_FILE), "apiKey = \"file_key\"\n").unwrap();
        let (k, src) = find_api_key(Some(String::new()), Some(home.path()));
        assert_eq!(k, Some(ApiKey::new("file_key")));
        assert!(!src.contains("file_key"));
        std::fs::write(home.path().join(CONFIG_FILE), "apiKey = \"file_key\" junk").unwrap();
        let (k, src) = find_api_key(None, Some(home.path()));
        assert_eq!(k, None);
        assert!(!src.contains("file_key"), "{src}");
    }

    #[test]
    fn segments_are_percent_encoded() {
        assert_eq!(
            encode_segment("NVIDIA H100 80GB HBM3"),
            "NVIDIA%20H100%2080GB%20HBM3"
        );
        assert_eq!(encode_segment("abc-12_x.y"), "abc-12_x.y");
        assert_eq!(encode_segment("a/b"), "a%2Fb");
    }

    #[test]
    fn api_key_debug_is_redacted() {
        let s = RunpodSettings {
            api_key: Some(ApiKey::new("secret_sentinel")),
            ..RunpodSettings::from_env_and_config(None, Lineage::random())
        };
        assert!(!format!("{s:?}").contains("secret_sentinel"));
    }
}
