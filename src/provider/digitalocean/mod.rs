//! DigitalOcean (cloud name `digitalocean`), over its public API v2 (vendor OpenAPI 3.0,
//! `../shared/vendor-apis/digitalocean/DigitalOcean-public.v2.gpuprov-subset.yaml`).
//!
//! Mapping onto the contract (design 5):
//!
//! - `plan`: `GET /v2/sizes` (all pages) × `GET /v2/regions` (all pages); one offer per
//!   (size, region) where the size is `available`, lists the region in `regions`, and the
//!   region is `available`. GPU asks take sizes with `gpu_info`; the price is
//!   `price_hourly` USD. Id `digitalocean/<region>/<size>`. DigitalOcean has no spot market.
//! - `prepare`: re-checks the size in the region (gone → `Unavailable`) and that its disk
//!   covers `disk_gb`; finds the project key among `GET /v2/account/keys` by its public key
//!   *value* (else registers it under [`super::project_key_name`],
//!   `gpuprov-<lineage8>-<fp12>`; a key merely named like ours is never used); creates the
//!   per-VM firewall tag
//!   (`POST /v2/tags`: a firewall may only name tags that exist, spec
//!   `existing_tags_array`) and finds or creates the per-VM cloud firewall
//!   `gpuprov-<vm>-<lineage8>-<region>` applied to that tag (inbound TCP 22 and the VM's
//!   ports from anywhere, outbound all: a DigitalOcean firewall drops any outbound traffic
//!   it does not allow); picks the image.
//! - `create`: `POST /v2/droplets` named `gpuprov-<vm>-<lineage8>`, tagged
//!   `gpuprov-vm-name:<vm>`, `gpuprov-lineage:<lineage>` and the firewall tag (tag names
//!   allow only letters, digits, `_`, `-` and `:`, so `:` replaces the `=` of the identity
//!   convention), with the key and the boot script as cloud-init `user_data`.
//! - `observe`: GPU droplets are listed only with `type=gpus`, which cannot be combined
//!   with `tag_name` (spec parameter `droplet_type`; also a field report). So `observe`
//!   lists `GET /v2/droplets?type=gpus` and filters by tags here, and lists
//!   `GET /v2/droplets?tag_name=gpuprov-vm-name:<vm>` for non-GPU droplets; both are then
//!   filtered by region slug (exact) and both identity tags.
//! - `delete`: `DELETE /v2/droplets/{id}` (404 = already gone); `cleanup` deletes the
//!   per-VM firewall, then its tag (`DELETE /v2/tags/{name}`; 404 = already gone). The
//!   project key stays. DigitalOcean documents no "still in use" answer for either
//!   (deleting a tag untags whatever carries it), so `cleanup` never reports `InUse`.
//! - `start`: `POST /v2/droplets/{id}/actions` `{"type": "power_on"}` for a droplet that
//!   is `off` (`Feature::Start`); one already `new` or `active` is left alone.
//!
//! Errors: a body that is not the `error` object (a proxy's HTML page) is shown as one
//! short line (`provider::cause::http_cause`); a refused connection is `Unreachable`.
//!
//! Image: GPU sizes get DigitalOcean's "AI/ML Ready" image (NVIDIA drivers and CUDA
//! preinstalled): `gpu-h100x1-base` (the spec's `gpu_droplets` example droplet runs it,
//! `AI/ML Ready H100x1`), `gpu-h100x8-base` for 8-GPU NVIDIA sizes and `gpu-amd-base` for
//! AMD sizes (both from DigitalOcean's GPU Droplet documentation, *not* in the spec). Other
//! sizes get `ubuntu-24-04-x64`. `image` in config overrides it.
//!
//! Credentials: the token comes from `DIGITALOCEAN_TOKEN`, then `DIGITALOCEAN_ACCESS_TOKEN`
//! (doctl's variable), then doctl's `config.yaml` (key `access-token`, or the current
//! `context` under `auth-contexts`) in the platform configuration directory
//! (`~/.config/doctl/` on Linux, `~/Library/Application Support/doctl/` on macOS). It is
//! sent as `Authorization: Bearer` and never written to state, logs, `Debug` output or
//! error messages.
//!
//! SSH: host = `networks.v4[]` entry of `type: public`; port 22 and user `root` are
//! DigitalOcean's conventions, *not* in the API description.
//!
//! Rate limits (spec "Rate Limit"): 5,000 requests per hour and 250 per minute per token.
//! The core enforces what [`Capabilities`] can express (`max_concurrency`); a 429 is
//! `Transient` with `retry-after`, else the wait until `ratelimit-reset`. The adapter
//! itself never sleeps.

mod errors;

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

pub use errors::{
    classify, ApiError, RateHeaders, Scope, REGION_UNAVAILABLE_PHRASES, SIZE_UNAVAILABLE_PHRASES,
};

use super::{
    BlockScope, Capabilities, CloudProvider, ErrorKind, Feature, InstanceSpec, InstanceStatus,
    Lineage, Location, Observed, Offer, ProviderError, ResourceRequest, SshEndpoint,
    IDENTITY_LABEL, LINEAGE_LABEL,
};

/// The cloud name.
pub const CLOUD: &str = "digitalocean";
/// The API base URL when neither config nor environment overrides it (spec `servers`).
pub const DEFAULT_ENDPOINT: &str = "https://api.digitalocean.com";
/// Environment variable overriding the endpoint (wins over `[cloud.digitalocean] endpoint`).
pub const ENDPOINT_ENV: &str = "GPUPROV_DIGITALOCEAN_ENDPOINT";
/// Environment variable holding the token (the API description's examples use it).
pub const TOKEN_ENV: &str = "DIGITALOCEAN_TOKEN";
/// doctl's environment variable for the token.
pub const ACCESS_TOKEN_ENV: &str = "DIGITALOCEAN_ACCESS_TOKEN";
/// SSH port of droplets (not in the API description).
pub const SSH_PORT: u16 = 22;
/// Login user of DigitalOcean images (not in the API description).
pub const SSH_USER: &str = "root";
/// Image of non-GPU sizes.
pub const DEFAULT_IMAGE: &str = "ubuntu-24-04-x64";
/// Items per page asked for in list calls (spec `per_page` maximum).
pub const PER_PAGE: u32 = 200;
/// Upper bound on pages followed in one listing (a guard against a looping `next` link).
const MAX_PAGES: u32 = 100;
/// Upper bound on offers for a CPU-only ask (every size × region would be hundreds).
const MAX_CPU_OFFERS: usize = 50;
/// Per-request timeout, seconds.
const REQUEST_TIMEOUT_SECS: u64 = 60;

/// The credential; its `Debug` never shows the value.
pub use super::Secret as Token;

/// Configuration of the DigitalOcean adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigitalOceanSettings {
    /// API base URL override; `None` means [`DEFAULT_ENDPOINT`].
    pub endpoint: Option<String>,
    /// `None` when no token was found; calls then fail with `Credentials`.
    pub token: Option<Token>,
    /// Where the token was found (an environment variable or a file path), or every place
    /// that was searched when none was found. Holds no secret.
    pub token_source: String,
    /// The state's lineage (a UUID): `observe` only sees droplets tagged with it. Must be
    /// set before `prepare`/`create`/`observe`/`cleanup`.
    pub lineage: Lineage,
}

impl DigitalOceanSettings {
    /// Settings from `[cloud.digitalocean] endpoint` and the environment: endpoint
    /// precedence `GPUPROV_DIGITALOCEAN_ENDPOINT` (non-empty) > `endpoint` >
    /// [`DEFAULT_ENDPOINT`]; the token as [`find_token`] finds it in the process
    /// environment and doctl's configuration directory. `lineage` is left empty: the caller
    /// sets it from the state.
    pub fn from_env_and_config(endpoint: Option<String>, lineage: Lineage) -> DigitalOceanSettings {
        let (token, token_source) = find_token(|k| std::env::var(k).ok(), &doctl_config_paths());
        DigitalOceanSettings {
            endpoint: super::endpoint_from(ENDPOINT_ENV, endpoint),
            token,
            token_source,
            lineage,
        }
    }
}

/// Where doctl keeps its configuration: `<config dir>/doctl/config.yaml`, the config dir
/// being Go's `os.UserConfigDir` (`$XDG_CONFIG_HOME` or `~/.config` on Linux,
/// `~/Library/Application Support` on macOS), which `dirs::config_dir` mirrors.
pub fn doctl_config_paths() -> Vec<PathBuf> {
    dirs::config_dir()
        .map(|d| vec![d.join("doctl").join("config.yaml")])
        .unwrap_or_default()
}

/// The token and where it was found: `DIGITALOCEAN_TOKEN`, then
/// `DIGITALOCEAN_ACCESS_TOKEN` (through `env`), then the first of `config_files` holding
/// one (see [`token_from_doctl_config`]). Without one, `None` and the list of places
/// searched, for the `Credentials` error.
pub fn find_token(
    env: impl Fn(&str) -> Option<String>,
    config_files: &[PathBuf],
) -> (Option<Token>, String) {
    for var in [TOKEN_ENV, ACCESS_TOKEN_ENV] {
        if let Some(t) = env(var)
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
        {
            return (Some(Token::new(t)), format!("environment variable {var}"));
        }
    }
    for path in config_files {
        if let Some(t) = std::fs::read_to_string(path)
            .ok()
            .and_then(|text| token_from_doctl_config(&text))
        {
            return (Some(Token::new(t)), path.display().to_string());
        }
    }
    let mut looked = vec![
        format!("the {TOKEN_ENV} environment variable"),
        format!("the {ACCESS_TOKEN_ENV} environment variable"),
    ];
    looked.extend(config_files.iter().map(|p| p.display().to_string()));
    (None, looked.join(", "))
}

/// The token in the text of doctl's `config.yaml`: the top-level `access-token` when the
/// `context` is absent or `default`, else the context's entry under `auth-contexts`.
/// doctl writes this file flat (viper): top-level `key: value` lines and one indented map.
pub fn token_from_doctl_config(text: &str) -> Option<String> {
    let unquote = |v: &str| {
        let v = v.trim();
        v.strip_prefix('"')
            .and_then(|s| s.strip_suffix('"'))
            .or_else(|| v.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')))
            .unwrap_or(v)
            .to_string()
    };
    let mut top = std::collections::BTreeMap::new();
    let mut contexts = std::collections::BTreeMap::new();
    let mut in_contexts = false;
    for line in text.lines() {
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let indented = line.starts_with(' ') || line.starts_with('\t');
        let Some((k, v)) = line.trim().split_once(':') else {
            continue;
        };
        if indented {
            if in_contexts {
                contexts.insert(unquote(k), unquote(v));
            }
        } else {
            in_contexts = k.trim() == "auth-contexts";
            top.insert(k.trim().to_string(), unquote(v));
        }
    }
    let token = match top.get("context").map(String::as_str) {
        None | Some("") | Some("default") => top.get("access-token").cloned(),
        Some(ctx) => contexts.get(ctx).cloned(),
    };
    token.filter(|t| !t.is_empty())
}

/// The DigitalOcean adapter. Construction does no I/O.
pub struct DigitalOceanProvider {
    settings: DigitalOceanSettings,
    http: reqwest::Client,
    capabilities: Option<Capabilities>,
}

// ---- API payloads (only the fields gpuprov reads) ----

/// A droplet size (spec `size`).
#[derive(Debug, Clone, Deserialize)]
struct Size {
    slug: String,
    /// MiB.
    #[serde(default)]
    memory: u64,
    #[serde(default)]
    vcpus: u32,
    /// GB.
    #[serde(default)]
    disk: u32,
    /// USD per hour.
    price_hourly: f64,
    #[serde(default)]
    regions: Vec<String>,
    #[serde(default = "yes")]
    available: bool,
    #[serde(default)]
    description: String,
    #[serde(default)]
    gpu_info: Option<GpuInfo>,
}

fn yes() -> bool {
    true
}

/// Spec `gpu_info`.
#[derive(Debug, Clone, Deserialize)]
struct GpuInfo {
    #[serde(default)]
    count: u32,
    #[serde(default)]
    model: String,
    #[serde(default)]
    vram: Option<Vram>,
}

#[derive(Debug, Clone, Deserialize)]
struct Vram {
    #[serde(default)]
    amount: u32,
    #[serde(default)]
    unit: String,
}

/// Spec `region`.
#[derive(Debug, Clone, Deserialize)]
struct Region {
    slug: String,
    #[serde(default)]
    available: bool,
}

/// Spec `sshKeys`.
#[derive(Debug, Clone, Deserialize)]
struct SshKey {
    id: i64,
    #[serde(default)]
    public_key: String,
}

/// Spec `firewall`.
#[derive(Debug, Clone, Deserialize)]
struct Firewall {
    id: String,
    #[serde(default)]
    name: String,
}

/// Spec `action`.
#[derive(Debug, Clone, Deserialize)]
struct Action {
    #[serde(default, rename = "type")]
    kind: String,
    #[serde(default)]
    status: String,
}

/// Spec `droplet`.
#[derive(Debug, Clone, Deserialize)]
struct Droplet {
    id: i64,
    status: String,
    #[serde(default)]
    networks: Networks,
    #[serde(default)]
    region: Option<DropletRegion>,
    #[serde(default)]
    tags: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct Networks {
    #[serde(default)]
    v4: Vec<NetworkV4>,
}

#[derive(Debug, Clone, Deserialize)]
struct NetworkV4 {
    #[serde(default)]
    ip_address: String,
    #[serde(default, rename = "type")]
    kind: String,
}

#[derive(Debug, Clone, Deserialize)]
struct DropletRegion {
    slug: String,
}

/// The GPU model of a size from `gpu_info.model` (`nvidia_h100` → `H100`, `amd_mi300x` →
/// `MI300X`, `nvidia_rtx_4000_ada` → `RTX 4000 ADA`): vendor prefix dropped, `_` as
/// spaces, uppercase. `None` for sizes without GPUs.
pub fn gpu_model(model: &str, count: u32) -> Option<String> {
    if count == 0 || model.trim().is_empty() {
        return None;
    }
    let m = model.trim().to_lowercase();
    let m = m
        .strip_prefix("nvidia_")
        .or_else(|| m.strip_prefix("amd_"))
        .unwrap_or(&m);
    Some(m.replace('_', " ").to_uppercase())
}

/// A GPU name reduced to uppercase letters and digits, so `H100`, `h100` and `RTX 6000` /
/// `rtx6000` compare equal.
fn norm(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_uppercase())
        .collect()
}

/// The OpenSSH key without its comment (`type base64`), for comparing keys by value.
fn key_value(k: &str) -> String {
    k.split_whitespace().take(2).collect::<Vec<_>>().join(" ")
}

/// Whether `tag` is a valid DigitalOcean tag name (`^[a-zA-Z0-9_\-\:]+$`, at most 255
/// characters; bundled spec, schema `tags.name`).
pub fn is_valid_tag(tag: &str) -> bool {
    !tag.is_empty()
        && tag.len() <= 255
        && tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | ':'))
}

/// The default image for a size: DigitalOcean's AI/ML-ready GPU images for GPU sizes (see
/// the module docs for the sources), `ubuntu-24-04-x64` otherwise.
pub fn default_image(gpu_model_raw: Option<&str>, gpu_count: u32) -> &'static str {
    match gpu_model_raw.map(str::to_lowercase) {
        Some(m) if gpu_count > 0 && m.starts_with("amd") => "gpu-amd-base",
        Some(_) if gpu_count >= 8 => "gpu-h100x8-base",
        Some(_) if gpu_count > 0 => "gpu-h100x1-base",
        _ => DEFAULT_IMAGE,
    }
}

/// Normalised status of a droplet `status` (spec enum `new, active, off, archive`):
/// `new` → Pending, `active` → Running, `off` → Stopped, `archive` → Failed (DigitalOcean
/// archived it; it takes no SSH and must be deleted), anything else → Failed naming it.
fn status_of(s: &str) -> InstanceStatus {
    match s {
        "new" => InstanceStatus::Pending,
        "active" => InstanceStatus::Running,
        "off" => InstanceStatus::Stopped,
        "archive" => InstanceStatus::Failed("archived by DigitalOcean".into()),
        other => InstanceStatus::Failed(format!("unknown DigitalOcean status `{other}`")),
    }
}

/// The page number of a `links.pages.next` URL (its `page` query parameter). Only the
/// number is used: the link's host is DigitalOcean's even behind an endpoint override, so
/// it is never dialled.
fn next_page(next: &str) -> Option<u32> {
    let query = next.split_once('?')?.1;
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "page")
        .and_then(|(_, v)| v.parse().ok())
}

fn now_epoch() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

impl DigitalOceanProvider {
    /// An adapter for `settings`. Never fails and does no I/O.
    pub fn new(settings: DigitalOceanSettings) -> DigitalOceanProvider {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(REQUEST_TIMEOUT_SECS))
            .user_agent(concat!("gpuprov/", env!("CARGO_PKG_VERSION")))
            .build()
            .unwrap_or_default();
        DigitalOceanProvider {
            settings,
            http,
            capabilities: None,
        }
    }

    /// Replaces the declared capabilities (tests use short timeouts and poll intervals).
    pub fn with_capabilities(mut self, caps: Capabilities) -> DigitalOceanProvider {
        self.capabilities = Some(caps);
        self
    }

    /// The capabilities DigitalOcean's documentation implies (see
    /// [`CloudProvider::capabilities`]).
    pub fn default_capabilities() -> Capabilities {
        Capabilities {
            supported: vec![
                Feature::BootScript,
                Feature::Firewall,
                Feature::Gpu,
                Feature::Kubernetes,
                Feature::Start,
            ],
            boot_timeout: Duration::from_secs(20 * 60),
            ssh_timeout: Duration::from_secs(10 * 60),
            delete_timeout: Duration::from_secs(10 * 60),
            poll_interval: Duration::from_secs(10),
            // 250 requests per minute per token (spec "Rate Limit"); a few calls in flight
            // keep a multi-VM apply well below it at one observe per 10 s per VM.
            max_concurrency: 4,
            min_create_interval: Duration::ZERO,
            create_list_lag: Duration::from_secs(20),
            default_regions: Vec::new(),
            keeps_offer_order: false,
        }
    }

    pub fn settings(&self) -> &DigitalOceanSettings {
        &self.settings
    }

    /// The droplet name: `gpuprov-<vm>-<first 8 chars of lineage>` (spec droplet name
    /// pattern `^[a-zA-Z0-9]?[a-z0-9A-Z.\-]*[a-z0-9A-Z]$`).
    pub fn object_name(vm_name: &str, lineage: &str) -> String {
        let short: String = lineage.chars().take(8).collect();
        format!("gpuprov-{vm_name}-{short}")
    }

    /// The per-VM firewall's name and tag, per region: `gpuprov-<vm>-<lineage8>-<region>`
    /// (valid as firewall name, spec `^[a-zA-Z0-9][a-zA-Z0-9\.-]+$`, and as tag). The
    /// region keeps a cleanup after a failover from removing the firewall of the VM's next
    /// attempt elsewhere.
    pub fn firewall_name(vm_name: &str, lineage: &str, region: &str) -> String {
        format!("{}-{region}", Self::object_name(vm_name, lineage))
    }

    /// The identity tag: `gpuprov-vm-name:<vm>`.
    pub fn identity_tag(vm_name: &str) -> String {
        format!("{IDENTITY_LABEL}:{vm_name}")
    }

    /// The lineage tag: `gpuprov-lineage:<lineage>`.
    pub fn lineage_tag(lineage: &str) -> String {
        format!("{LINEAGE_LABEL}:{lineage}")
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
        self.settings.token.as_ref().map(Token::expose)
    }

    /// The classified error, its region-wide scope applied against `region` when asked.
    fn classify_at(&self, e: &ApiError, what: &str, region: Option<&str>) -> ProviderError {
        let (err, scope) = classify(e, what, self.secret());
        match (scope, region) {
            (Scope::Region, Some(r)) => err.with_block(BlockScope::Region {
                cloud: CLOUD.to_string(),
                region: r.to_string(),
            }),
            _ => err,
        }
    }

    fn classify(&self, e: &ApiError, what: &str) -> ProviderError {
        self.classify_at(e, what, None)
    }

    /// One API call; returns the JSON body (`Null` for an empty one) or the error as
    /// DigitalOcean reported it.
    async fn call_raw(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<Result<Value, ApiError>, ProviderError> {
        let Some(token) = &self.settings.token else {
            return Err(ProviderError::new(
                ErrorKind::Credentials,
                format!(
                    "no DigitalOcean token: set {TOKEN_ENV} or log in with `doctl auth init` \
                     (looked in: {})",
                    self.settings.token_source
                ),
            ));
        };
        let url = format!("{}{path}", self.base());
        let mut req = self.http.request(method, &url).bearer_auth(token.expose());
        if !query.is_empty() {
            req = req.query(query);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let transport = |e: reqwest::Error| ApiError {
            status: None,
            id: None,
            refused: super::cause::is_refused(&e),
            message: format!("{} ({})", e.without_url(), super::redact::redact_url(&url)),
            retry_after_secs: None,
        };
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => return Ok(Err(transport(e))),
        };
        let status = resp.status().as_u16();
        let header = |n: &str| {
            resp.headers()
                .get(n)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let rate = RateHeaders {
            retry_after: header("retry-after"),
            remaining: header("ratelimit-remaining"),
            reset_epoch: header("ratelimit-reset"),
        };
        let content_type = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let text = match resp.text().await {
            Ok(t) => t,
            Err(e) => return Ok(Err(transport(e))),
        };
        if !(200..300).contains(&status) {
            return Ok(Err(ApiError::from_response(
                status,
                content_type.as_deref(),
                &text,
                rate,
                now_epoch(),
            )));
        }
        if text.trim().is_empty() {
            return Ok(Ok(Value::Null));
        }
        let v: Value = serde_json::from_str(&text).map_err(|e| {
            ProviderError::new(
                ErrorKind::Failed,
                format!("digitalocean {path}: unreadable response: {e}"),
            )
        })?;
        Ok(Ok(v))
    }

    /// [`Self::call_raw`] with errors classified.
    async fn call(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
        what: &str,
    ) -> Result<Value, ProviderError> {
        self.call_raw(method, path, query, body)
            .await?
            .map_err(|e| self.classify(&e, what))
    }

    /// Every item under `key` of a paginated listing: `per_page=200` (the maximum), then
    /// the page named by each `links.pages.next` until there is none.
    async fn list_all<T: DeserializeOwned>(
        &self,
        path: &str,
        key: &str,
        filter: &[(&str, String)],
        what: &str,
    ) -> Result<Vec<T>, ProviderError> {
        let mut out = Vec::new();
        let mut page = 1u32;
        for _ in 0..MAX_PAGES {
            let mut query: Vec<(&str, String)> = filter.to_vec();
            query.push(("per_page", PER_PAGE.to_string()));
            if page > 1 {
                query.push(("page", page.to_string()));
            }
            let v = self.call(Method::GET, path, &query, None, what).await?;
            let items: Vec<T> = serde_json::from_value(v.get(key).cloned().unwrap_or(json!([])))
                .map_err(|e| {
                    ProviderError::new(
                        ErrorKind::Failed,
                        format!("digitalocean {what}: unexpected response shape: {e}"),
                    )
                })?;
            out.extend(items);
            match v
                .pointer("/links/pages/next")
                .and_then(Value::as_str)
                .and_then(next_page)
            {
                Some(n) if n > page => page = n,
                _ => return Ok(out),
            }
        }
        Ok(out)
    }

    async fn sizes(&self) -> Result<Vec<Size>, ProviderError> {
        self.list_all("/v2/sizes", "sizes", &[], "list sizes").await
    }

    async fn regions(&self) -> Result<Vec<Region>, ProviderError> {
        self.list_all("/v2/regions", "regions", &[], "list regions")
            .await
    }

    /// The id of the registered key whose value is `public_key` (compared without the
    /// comment), registering it when there is none under [`super::project_key_name`]
    /// (`gpuprov-<lineage8>-<fp12>`). A key is never taken for its name: one registered
    /// under the old `gpuprov-<lineage8>` or the derived name with another value is left
    /// alone (DigitalOcean does not refuse a second key of the same name). DigitalOcean
    /// refuses a second key of the same *value* (HTTP 422 "SSH Key is already in use on
    /// your account"): then the key was registered meanwhile (or the listing lagged), so
    /// the keys are listed once more and the key found by value is used.
    async fn ensure_key(&self, public_key: &str, lineage: &str) -> Result<i64, ProviderError> {
        let want = key_value(public_key);
        if want.is_empty() {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                "the project's SSH public key is empty",
            ));
        }
        if let Some(id) = self.key_by_value(&want).await? {
            return Ok(id);
        }
        let name = super::project_key_name(lineage, public_key);
        let body = json!({ "name": name, "public_key": public_key.trim() });
        let what = format!("register SSH key {name}");
        let v = match self
            .call_raw(Method::POST, "/v2/account/keys", &[], Some(&body))
            .await?
        {
            Ok(v) => v,
            Err(e) if e.status == Some(422) && e.message.to_lowercase().contains("in use") => {
                return match self.key_by_value(&want).await? {
                    Some(id) => Ok(id),
                    None => Err(self.classify(&e, &what)),
                };
            }
            Err(e) => return Err(self.classify(&e, &what)),
        };
        v.pointer("/ssh_key/id")
            .and_then(Value::as_i64)
            .ok_or_else(|| {
                ProviderError::new(
                    ErrorKind::Failed,
                    format!("digitalocean {what}: no id in the response"),
                )
            })
    }

    /// The id of the registered key whose value (without comment) is `want`.
    async fn key_by_value(&self, want: &str) -> Result<Option<i64>, ProviderError> {
        let keys: Vec<SshKey> = self
            .list_all("/v2/account/keys", "ssh_keys", &[], "list SSH keys")
            .await?;
        Ok(keys
            .iter()
            .find(|k| key_value(&k.public_key) == want)
            .map(|k| k.id))
    }

    /// Creates tag `name` (`POST /v2/tags`); a tag that already exists is success.
    async fn ensure_tag(&self, name: &str) -> Result<(), ProviderError> {
        let body = json!({ "name": name });
        match self
            .call_raw(Method::POST, "/v2/tags", &[], Some(&body))
            .await?
        {
            Ok(_) => Ok(()),
            Err(e) if e.status == Some(422) && e.message.to_lowercase().contains("exist") => Ok(()),
            Err(e) => Err(self.classify(&e, &format!("create tag {name}"))),
        }
    }

    async fn firewalls(&self) -> Result<Vec<Firewall>, ProviderError> {
        self.list_all("/v2/firewalls", "firewalls", &[], "list firewalls")
            .await
    }

    /// The id of firewall `name`, created (applied to tag `name`) with inbound TCP 22 and
    /// `ports` from anywhere and all outbound traffic when missing.
    async fn ensure_firewall(&self, name: &str, ports: &[u16]) -> Result<String, ProviderError> {
        if let Some(f) = self.firewalls().await?.into_iter().find(|f| f.name == name) {
            return Ok(f.id);
        }
        let anywhere = json!({ "addresses": ["0.0.0.0/0", "::/0"] });
        let mut all: Vec<u16> = vec![22];
        all.extend(ports.iter().copied());
        all.sort_unstable();
        all.dedup();
        let inbound: Vec<Value> = all
            .iter()
            .map(|p| json!({ "protocol": "tcp", "ports": p.to_string(), "sources": anywhere }))
            .collect();
        // "0" = every port of the protocol (spec `firewall_rule_base.ports`).
        let outbound: Vec<Value> = ["tcp", "udp", "icmp"]
            .iter()
            .map(|p| json!({ "protocol": p, "ports": "0", "destinations": anywhere }))
            .collect();
        let body = json!({
            "name": name,
            "tags": [name],
            "inbound_rules": inbound,
            "outbound_rules": outbound,
        });
        let v = self
            .call(
                Method::POST,
                "/v2/firewalls",
                &[],
                Some(&body),
                &format!("create firewall {name}"),
            )
            .await?;
        v.pointer("/firewall/id")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| {
                ProviderError::new(
                    ErrorKind::Failed,
                    format!("digitalocean create firewall {name}: no id in the response"),
                )
            })
    }
}

/// Offers of `sizes` for the ask in the regions where both size and region are available,
/// in order: by the ask's region order when it names regions, then price, then size slug.
/// Regions match as exact slugs (`nyc1` never matches `nyc13`). A CPU-only ask keeps the
/// [`MAX_CPU_OFFERS`] first.
fn offers_for(sizes: &[Size], regions: &[Region], req: &ResourceRequest) -> Vec<Offer> {
    let wants_gpu = req.gpu.is_some() || req.gpu_count > 0;
    let mut offers = Vec::new();
    for s in sizes.iter().filter(|s| s.available && size_matches(s, req)) {
        let gpu = s.gpu_info.as_ref();
        let count = gpu.map(|g| g.count).unwrap_or(0);
        let model = gpu.and_then(|g| gpu_model(&g.model, g.count));
        for r in &s.regions {
            if !regions.iter().any(|x| x.slug == *r && x.available) {
                continue;
            }
            if !req.regions.is_empty() && !req.regions.contains(r) {
                continue;
            }
            offers.push(Offer {
                id: format!("{CLOUD}/{r}/{}", s.slug),
                location: Location {
                    cloud: CLOUD.to_string(),
                    region: r.clone(),
                    zone: None,
                },
                instance_type: s.slug.clone(),
                gpu: model.clone(),
                gpu_count: count,
                spot: false,
                price_per_hour: s.price_hourly,
                detail: json!({
                    "description": s.description,
                    "vcpus": s.vcpus,
                    "memory_mib": s.memory,
                    "disk_gb": s.disk,
                    "gpu_model": gpu.map(|g| g.model.clone()),
                    "gpu_vram": gpu.and_then(|g| g.vram.as_ref()).map(|v| format!("{} {}", v.amount, v.unit)),
                }),
            });
        }
    }
    let rank = |o: &Offer| {
        req.regions
            .iter()
            .position(|r| *r == o.location.region)
            .unwrap_or(0)
    };
    offers.sort_by(|a, b| {
        rank(a)
            .cmp(&rank(b))
            .then(a.price_per_hour.total_cmp(&b.price_per_hour))
            .then(a.instance_type.cmp(&b.instance_type))
            .then(a.location.region.cmp(&b.location.region))
    });
    if !wants_gpu {
        offers.truncate(MAX_CPU_OFFERS);
    }
    offers
}

/// Whether a size fits the ask: a GPU ask takes GPU sizes of that model (ignoring case and
/// punctuation, with or without the vendor prefix) and exact count when asked; a CPU-only
/// ask takes sizes without GPUs.
fn size_matches(s: &Size, req: &ResourceRequest) -> bool {
    let wants_gpu = req.gpu.is_some() || req.gpu_count > 0;
    match s.gpu_info.as_ref().filter(|g| g.count > 0) {
        None => !wants_gpu,
        Some(g) => {
            wants_gpu
                && (req.gpu_count == 0 || g.count == req.gpu_count)
                && req.gpu.as_ref().is_none_or(|want| {
                    let want = norm(want);
                    norm(&g.model) == want
                        || gpu_model(&g.model, g.count).is_some_and(|m| norm(&m) == want)
                })
        }
    }
}

/// Whether a listed droplet belongs to `vm_name` of `lineage` at `region`: region slug
/// (exact) and both identity tags.
fn is_ours(d: &Droplet, region: &str, vm_name: &str, lineage: &str) -> bool {
    d.region.as_ref().map(|r| r.slug.as_str()) == Some(region)
        && d.tags
            .contains(&DigitalOceanProvider::identity_tag(vm_name))
        && d.tags.contains(&DigitalOceanProvider::lineage_tag(lineage))
}

fn observed(d: &Droplet) -> Observed {
    let ssh = d
        .networks
        .v4
        .iter()
        .find(|n| n.kind == "public" && !n.ip_address.is_empty())
        .map(|n| SshEndpoint {
            host: n.ip_address.clone(),
            port: SSH_PORT,
            user: Some(SSH_USER.to_string()),
        });
    Observed {
        instance_id: d.id.to_string(),
        status: status_of(&d.status),
        ssh,
    }
}

#[async_trait]
impl CloudProvider for DigitalOceanProvider {
    fn name(&self) -> &'static str {
        CLOUD
    }

    fn endpoint_override(&self) -> Option<String> {
        self.settings
            .endpoint
            .as_deref()
            .map(super::redact::redact_url)
    }

    /// Boot script (cloud-init), firewall and GPUs; no spot, no k3s (as on Lambda).
    /// `max_concurrency` keeps calls under the documented 250 requests per minute; the
    /// hourly budget (5,000) and the 10-per-minute limit of `GET /v2/account/keys` cannot be
    /// declared and are answered by 429 + `retry-after` / `ratelimit-reset`.
    fn capabilities(&self) -> Capabilities {
        self.capabilities
            .clone()
            .unwrap_or_else(Self::default_capabilities)
    }

    /// Offers from `GET /v2/sizes` × `GET /v2/regions` (see [`offers_for`]). An empty list
    /// means "nothing available now". Errors: a spot ask, or no size with that GPU model
    /// and count → `InvalidRequest`.
    async fn plan(&self, req: &ResourceRequest) -> Result<Vec<Offer>, ProviderError> {
        if req.spot {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                "DigitalOcean has no spot droplets",
            ));
        }
        let sizes = self.sizes().await?;
        if !sizes.iter().any(|s| size_matches(s, req)) {
            let mut have: Vec<String> = sizes
                .iter()
                .filter_map(|s| {
                    let g = s.gpu_info.as_ref()?;
                    gpu_model(&g.model, g.count).map(|m| format!("{m} x{}", g.count))
                })
                .collect();
            have.sort();
            have.dedup();
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "DigitalOcean has no size with {} x{}; it has: {}",
                    req.gpu.as_deref().unwrap_or("any GPU"),
                    req.gpu_count,
                    have.join(", ")
                ),
            ));
        }
        let regions = self.regions().await?;
        Ok(offers_for(&sizes, &regions, req))
    }

    /// Re-checks that the size is still available in the region (else `Unavailable`) and
    /// that its disk (GB) covers `spec.disk_gb` (else `Unavailable`: sizes have fixed
    /// disks); finds or registers the project key; creates the firewall tag and finds or
    /// creates the per-VM firewall; picks the image. Returns `{"ssh_key_id",
    /// "firewall_id", "firewall_tag", "image"}`.
    async fn prepare(&self, offer: &Offer, spec: &InstanceSpec) -> Result<Value, ProviderError> {
        let lineage = self.lineage();
        let region = &offer.location.region;
        let sizes = self.sizes().await?;
        let size = sizes.iter().find(|s| {
            s.slug == offer.instance_type && s.available && s.regions.iter().any(|r| r == region)
        });
        let Some(size) = size else {
            return Err(ProviderError::new(
                ErrorKind::Unavailable,
                format!(
                    "digitalocean: size {} is no longer available in {region}",
                    offer.instance_type
                ),
            ));
        };
        if let Some(want) = spec.disk_gb.filter(|d| *d > size.disk) {
            return Err(ProviderError::new(
                ErrorKind::Unavailable,
                format!(
                    "digitalocean: size {} has a {} GB disk, disk_gb asks {want}",
                    size.slug, size.disk
                ),
            ));
        }
        let key_id = self.ensure_key(&spec.ssh_public_key, lineage).await?;
        let fw_name = Self::firewall_name(&spec.vm_name, lineage, region);
        self.ensure_tag(&fw_name).await?;
        let fw_id = self.ensure_firewall(&fw_name, &spec.ports).await?;
        let image = match spec.image.as_deref().filter(|s| !s.trim().is_empty()) {
            Some(i) => i.to_string(),
            None => {
                let g = size.gpu_info.as_ref();
                default_image(g.map(|g| g.model.as_str()), g.map(|g| g.count).unwrap_or(0))
                    .to_string()
            }
        };
        Ok(json!({
            "ssh_key_id": key_id,
            "firewall_id": fw_id,
            "firewall_tag": fw_name,
            "image": image,
        }))
    }

    /// `POST /v2/droplets` with the region, size, image, key, name
    /// `gpuprov-<vm>-<lineage8>`, the identity, lineage and firewall tags, and the boot
    /// script as `user_data`. Returns the droplet id.
    ///
    /// DigitalOcean's create takes no idempotency token (`spec.client_token` is unused): a
    /// create repeated after a crash is avoided by the core's observe-before-create, which
    /// finds the droplet by its tags.
    async fn create(
        &self,
        offer: &Offer,
        prepared: &Value,
        spec: &InstanceSpec,
    ) -> Result<String, ProviderError> {
        crate::provider::check_spec_lineage(CLOUD, &self.settings.lineage, spec)?;
        let lineage = self.lineage();
        let missing = |f: &str| {
            ProviderError::new(
                ErrorKind::InvalidRequest,
                format!("prepared data has no {f}"),
            )
        };
        let key = prepared
            .get("ssh_key_id")
            .and_then(Value::as_i64)
            .ok_or_else(|| missing("ssh_key_id"))?;
        let image = prepared
            .get("image")
            .and_then(Value::as_str)
            .ok_or_else(|| missing("image"))?;
        let fw_tag = prepared
            .get("firewall_tag")
            .and_then(Value::as_str)
            .ok_or_else(|| missing("firewall_tag"))?;
        let tags = [
            Self::identity_tag(&spec.vm_name),
            Self::lineage_tag(lineage),
            fw_tag.to_string(),
        ];
        if let Some(bad) = tags.iter().find(|t| !is_valid_tag(t)) {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                format!("`{bad}` is not a valid DigitalOcean tag"),
            ));
        }
        let mut body = json!({
            "name": Self::object_name(&spec.vm_name, lineage),
            "region": offer.location.region,
            "size": offer.instance_type,
            "image": image,
            "ssh_keys": [key],
            "tags": tags,
        });
        if let Some(b) = &spec.boot_script {
            body["user_data"] = Value::String(super::cloud_init_user_data(b)?);
        }
        let what = format!(
            "create {} in {}",
            offer.instance_type, offer.location.region
        );
        let v = self
            .call_raw(Method::POST, "/v2/droplets", &[], Some(&body))
            .await?
            .map_err(|e| self.classify_at(&e, &what, Some(&offer.location.region)))?;
        v.pointer("/droplet/id")
            .and_then(Value::as_i64)
            .map(|id| id.to_string())
            .ok_or_else(|| {
                ProviderError::new(
                    ErrorKind::Failed,
                    format!("digitalocean {what}: no droplet id in the response"),
                )
            })
    }

    /// The VM's droplets in `at.region`: GPU droplets from `GET /v2/droplets?type=gpus`
    /// (the only listing that shows them; `type` cannot be combined with `tag_name`),
    /// filtered here by both tags, plus non-GPU droplets from
    /// `GET /v2/droplets?tag_name=gpuprov-vm-name:<vm>`; sorted by id. Status: new →
    /// Pending, active → Running, off → Stopped, archive → Failed. SSH endpoint: the public
    /// IPv4 address, port 22, user `root`.
    async fn observe(&self, at: &Location, vm_name: &str) -> Result<Vec<Observed>, ProviderError> {
        let lineage = self.lineage();
        if at.cloud != CLOUD {
            return Ok(vec![]);
        }
        let gpus: Vec<Droplet> = self
            .list_all(
                "/v2/droplets",
                "droplets",
                &[("type", "gpus".to_string())],
                "list GPU droplets",
            )
            .await?;
        let tagged: Vec<Droplet> = self
            .list_all(
                "/v2/droplets",
                "droplets",
                &[("tag_name", Self::identity_tag(vm_name))],
                "list droplets by tag",
            )
            .await?;
        let mut out: Vec<Observed> = Vec::new();
        for d in gpus.iter().chain(&tagged) {
            if is_ours(d, &at.region, vm_name, lineage)
                && !out.iter().any(|o| o.instance_id == d.id.to_string())
            {
                out.push(observed(d));
            }
        }
        out.sort_by_key(|o| o.instance_id.parse::<i64>().unwrap_or_default());
        Ok(out)
    }

    /// `DELETE /v2/droplets/{id}` for each id. An unknown droplet (404) is success, and so
    /// is an id that is not a number (no droplet can have it).
    async fn delete(
        &self,
        _at: &Location,
        _vm_name: &str,
        instance_ids: &[String],
    ) -> Result<(), ProviderError> {
        for id in instance_ids {
            let Ok(n) = id.trim().parse::<u64>() else {
                continue;
            };
            let path = format!("/v2/droplets/{n}");
            match self.call_raw(Method::DELETE, &path, &[], None).await? {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(self.classify(&e, &format!("delete droplet {n}"))),
            }
        }
        Ok(())
    }

    /// Deletes the VM's firewall of `at.region`, if any, then its tag (404 = already gone,
    /// for both). The project key stays: it is shared by the project's VMs.
    async fn cleanup(&self, at: &Location, vm_name: &str) -> Result<(), ProviderError> {
        let lineage = self.lineage();
        if at.cloud != CLOUD {
            return Ok(());
        }
        let name = Self::firewall_name(vm_name, lineage, &at.region);
        for f in self
            .firewalls()
            .await?
            .into_iter()
            .filter(|f| f.name == name)
        {
            let path = format!("/v2/firewalls/{}", f.id);
            match self.call_raw(Method::DELETE, &path, &[], None).await? {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(self.classify(&e, &format!("delete firewall {name}"))),
            }
        }
        let path = format!("/v2/tags/{name}");
        match self.call_raw(Method::DELETE, &path, &[], None).await? {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(self.classify(&e, &format!("delete tag {name}"))),
        }
    }

    /// Powers a stopped droplet on: `GET /v2/droplets/{id}`, and when it is `off`,
    /// `POST /v2/droplets/{id}/actions` with `{"type": "power_on"}` (answered 201 with the
    /// `in-progress` action; the droplet turns `active` when it completes). A droplet
    /// already `new` or `active` is success without an action, and so is one whose
    /// power_on is still in progress (the repeated action is refused with 422; the
    /// droplet's actions, `GET /v2/droplets/{id}/actions`, show the one in progress). A droplet that no longer
    /// exists (404), or one `archive`d, is `Failed`: there is nothing to start.
    async fn start(
        &self,
        at: &Location,
        _vm_name: &str,
        instance_id: &str,
    ) -> Result<(), ProviderError> {
        let gone = |why: &str| {
            ProviderError::new(
                ErrorKind::Failed,
                format!("digitalocean start droplet {instance_id}: {why}"),
            )
        };
        let Ok(n) = instance_id.trim().parse::<u64>() else {
            return Err(gone("not a droplet id"));
        };
        let what = format!("start droplet {n}");
        let path = format!("/v2/droplets/{n}");
        let v = match self.call_raw(Method::GET, &path, &[], None).await? {
            Ok(v) => v,
            Err(e) if e.is_not_found() => return Err(gone("it no longer exists")),
            Err(e) => return Err(self.classify(&e, &what)),
        };
        match v.pointer("/droplet/status").and_then(Value::as_str) {
            Some("new" | "active") => return Ok(()),
            Some("off") => {}
            Some(other) => return Err(gone(&format!("its status is `{other}`"))),
            None => {
                return Err(ProviderError::new(
                    ErrorKind::Failed,
                    format!("digitalocean {what}: no droplet status in the response"),
                ))
            }
        }
        let body = json!({ "type": "power_on" });
        let actions = format!("{path}/actions");
        match self
            .call_raw(Method::POST, &actions, &[], Some(&body))
            .await?
        {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Err(gone("it no longer exists")),
            // The droplet stays `off` until its power_on completes, so a start repeated
            // meanwhile is refused ("Droplet already has a pending event."): success when
            // a power_on is in progress.
            Err(e) if e.status == Some(422) => {
                let listed: Vec<Action> = self
                    .list_all(
                        &actions,
                        "actions",
                        &[],
                        &format!("list actions of droplet {n}"),
                    )
                    .await?;
                if listed
                    .iter()
                    .any(|a| a.kind == "power_on" && a.status == "in-progress")
                {
                    Ok(())
                } else {
                    Err(self.classify_at(&e, &what, Some(&at.region)))
                }
            }
            Err(e) => Err(self.classify_at(&e, &what, Some(&at.region))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(slug: &str, gpu: Option<(&str, u32)>, price: f64, regions: &[&str]) -> Size {
        Size {
            slug: slug.into(),
            memory: 8192,
            vcpus: 4,
            disk: 100,
            price_hourly: price,
            regions: regions.iter().map(|r| r.to_string()).collect(),
            available: true,
            description: String::new(),
            gpu_info: gpu.map(|(m, c)| GpuInfo {
                count: c,
                model: m.into(),
                vram: None,
            }),
        }
    }

    fn region(slug: &str, available: bool) -> Region {
        Region {
            slug: slug.into(),
            available,
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

    #[test]
    fn gpu_models_drop_the_vendor_prefix() {
        assert_eq!(gpu_model("nvidia_h100", 1).as_deref(), Some("H100"));
        assert_eq!(gpu_model("amd_mi300x", 8).as_deref(), Some("MI300X"));
        assert_eq!(
            gpu_model("nvidia_rtx_4000_ada", 1).as_deref(),
            Some("RTX 4000 ADA")
        );
        assert_eq!(gpu_model("nvidia_h100", 0), None);
    }

    #[test]
    fn offers_filter_by_model_count_availability_and_exact_region() {
        let sizes = vec![
            size(
                "gpu-h100x1-80gb",
                Some(("nvidia_h100", 1)),
                3.39,
                &["tor1", "nyc2"],
            ),
            size(
                "gpu-h100x8-640gb",
                Some(("nvidia_h100", 8)),
                23.92,
                &["tor1"],
            ),
            size(
                "gpu-mi300x1-192gb",
                Some(("amd_mi300x", 1)),
                1.99,
                &["tor1"],
            ),
            size("s-2vcpu-4gb", None, 0.03, &["tor1", "nyc2"]),
        ];
        let regions = vec![
            region("tor1", true),
            region("nyc2", true),
            region("nyc3", false),
        ];
        let ids = |o: Vec<Offer>| o.into_iter().map(|o| o.id).collect::<Vec<_>>();
        assert_eq!(
            ids(offers_for(
                &sizes,
                &regions,
                &ask(Some("h100"), 1, &["nyc2", "tor1"])
            )),
            [
                "digitalocean/nyc2/gpu-h100x1-80gb",
                "digitalocean/tor1/gpu-h100x1-80gb"
            ]
        );
        assert_eq!(
            ids(offers_for(
                &sizes,
                &regions,
                &ask(Some("nvidia_h100"), 8, &[])
            )),
            ["digitalocean/tor1/gpu-h100x8-640gb"]
        );
        assert!(offers_for(&sizes, &regions, &ask(Some("H100"), 1, &["nyc"])).is_empty());
        assert!(offers_for(&sizes, &regions, &ask(Some("H100"), 1, &["tor"])).is_empty());
        // Any GPU, any count: cheapest first.
        let o = offers_for(&sizes, &regions, &ask(None, 1, &["tor1"]));
        assert_eq!(o[0].instance_type, "gpu-mi300x1-192gb");
        assert_eq!(o[0].gpu.as_deref(), Some("MI300X"));
        // CPU-only asks take only sizes without GPUs.
        let o = offers_for(&sizes, &regions, &ask(None, 0, &[]));
        assert!(o.iter().all(|o| o.gpu.is_none()), "{o:?}");
        assert_eq!(o.len(), 2);
        // A region that takes no droplets, or a size that is unavailable: no offer.
        let mut sizes2 = sizes.clone();
        sizes2[0].regions.push("nyc3".into());
        assert!(offers_for(&sizes2, &regions, &ask(Some("H100"), 1, &["nyc3"])).is_empty());
        sizes2[0].available = false;
        assert!(offers_for(&sizes2, &regions, &ask(Some("H100"), 1, &[])).is_empty());
    }

    #[test]
    fn statuses_map() {
        assert_eq!(status_of("new"), InstanceStatus::Pending);
        assert_eq!(status_of("active"), InstanceStatus::Running);
        assert_eq!(status_of("off"), InstanceStatus::Stopped);
        assert!(matches!(status_of("archive"), InstanceStatus::Failed(_)));
        assert!(matches!(status_of("weird"), InstanceStatus::Failed(_)));
    }

    #[test]
    fn tags_and_names_fit_digitaloceans_charsets() {
        let lin = "0f0e0d0c-1111-4222-8333-444455556666";
        for t in [
            DigitalOceanProvider::identity_tag("trainer-2"),
            DigitalOceanProvider::lineage_tag(lin),
            DigitalOceanProvider::firewall_name("trainer-2", lin, "tor1"),
        ] {
            assert!(is_valid_tag(&t), "{t}");
        }
        assert!(!is_valid_tag("gpuprov-vm-name=trainer"));
        assert!(!is_valid_tag(""));
        assert_eq!(
            DigitalOceanProvider::firewall_name("a", lin, "nyc2"),
            "gpuprov-a-0f0e0d0c-nyc2"
        );
    }

    #[test]
    fn next_page_reads_only_the_page_number() {
        assert_eq!(
            next_page("https://api.digitalocean.com/v2/sizes?page=3&per_page=200"),
            Some(3)
        );
        assert_eq!(next_page("https://api.digitalocean.com/v2/sizes"), None);
        assert_eq!(next_page("?per_page=2&page=x"), None);
    }

    #[test]
    fn default_images() {
        assert_eq!(default_image(Some("nvidia_h100"), 1), "gpu-h100x1-base");
        assert_eq!(default_image(Some("nvidia_h100"), 8), "gpu-h100x8-base");
        assert_eq!(default_image(Some("amd_mi300x"), 8), "gpu-amd-base");
        assert_eq!(default_image(None, 0), DEFAULT_IMAGE);
    }

    #[test]
    fn tokens_come_from_env_then_doctl_config() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("config.yaml");
        std::fs::write(&cfg, "access-token: dop_v1_file\ncontext: default\n").unwrap();
        let files = vec![dir.path().join("missing.yaml"), cfg.clone()];
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let (t, src) = find_token(
            env(&[(TOKEN_ENV, "dop_v1_a"), (ACCESS_TOKEN_ENV, "dop_v1_b")]),
            &files,
        );
        assert_eq!(
            (t, src.as_str()),
            (
                Some(Token::new("dop_v1_a")),
                "environment variable DIGITALOCEAN_TOKEN"
            )
        );
        let (t, _) = find_token(
            env(&[(TOKEN_ENV, " "), (ACCESS_TOKEN_ENV, "dop_v1_b")]),
            &files,
        );
        assert_eq!(t, Some(Token::new("dop_v1_b")));
        let (t, src) = find_token(env(&[]), &files);
        assert_eq!(t, Some(Token::new("dop_v1_file")));
        assert_eq!(src, cfg.display().to_string());
        let (t, looked) = find_token(env(&[]), &files[..1]);
        assert_eq!(t, None);
        assert!(looked.contains("DIGITALOCEAN_TOKEN"), "{looked}");
        assert!(looked.contains("DIGITALOCEAN_ACCESS_TOKEN"), "{looked}");
        assert!(looked.contains("missing.yaml"), "{looked}");
    }

    #[test]
    fn doctl_contexts_pick_their_token() {
        let text = "access-token: dop_v1_default\nauth-contexts:\n  work: \"dop_v1_work\"\n  home: dop_v1_home\ncontext: work\noutput: text\n";
        assert_eq!(
            token_from_doctl_config(text).as_deref(),
            Some("dop_v1_work")
        );
        let text = "access-token: \"\"\ncontext: default\n";
        assert_eq!(token_from_doctl_config(text), None);
        assert_eq!(
            token_from_doctl_config("access-token: 'x'\n").as_deref(),
            Some("x")
        );
        assert_eq!(
            token_from_doctl_config("context: gone\naccess-token: x\n"),
            None
        );
    }

    #[test]
    fn token_debug_is_redacted() {
        let s = DigitalOceanSettings {
            token: Some(Token::new("dop_v1_secret_sentinel")),
            ..DigitalOceanSettings::from_env_and_config(None, Lineage::random())
        };
        assert!(!format!("{s:?}").contains("dop_v1_secret_sentinel"));
    }
}
