//! Lambda Cloud (cloud name `lambda`), over its REST API v1 (OpenAPI 1.8.3,
//! `../shared/vendor-apis/lambda/openapi-1.8.3.json`).
//!
//! Mapping onto the contract (design 5):
//!
//! - `plan`: `GET /api/v1/instance-types`; one offer per (instance type, region listed in
//!   `regions_with_capacity_available`), id `lambda/<region>/<type>`, price
//!   `price_cents_per_hour / 100` USD. Lambda has no spot market.
//! - `prepare`: re-checks capacity; finds the project key among `GET /api/v1/ssh-keys` by
//!   its public key *value* (type and base64, ignoring the comment), else registers it
//!   under [`super::project_key_name`] (`gpuprov-<lineage8>-<fp12>`, the key's fingerprint
//!   in it; a key merely named like ours is never used); when the VM asks for ports, finds
//!   or creates the firewall ruleset `gpuprov-<vm>-<lineage8>` in the region (TCP 22 and
//!   the ports, from anywhere).
//! - `create`: `POST /api/v1/instance-operations/launch`, named `gpuprov-<vm>-<lineage8>`,
//!   tagged `gpuprov-vm-name=<vm>` and `gpuprov-lineage=<lineage>`, with the ruleset and the
//!   boot script as cloud-init `user_data`.
//! - `observe`: `GET /api/v1/instances` (the list has no tag filter), filtered here by
//!   region and both tags (or, for an instance without tags, the name).
//! - `delete`: `POST /api/v1/instance-operations/terminate`; `cleanup` deletes the ruleset
//!   (still attached to an instance → `InUse`).
//! - no `start`: Lambda has `instance-operations/restart` (a reboot of a running
//!   instance) but no stopped state (`InstanceStatus` has none), so `Feature::Start` is not
//!   declared.
//!
//! Errors: a body that is not Lambda's envelope (a proxy's HTML page) is shown as one
//! short line (`provider::cause::http_cause`); a refused connection is `Unreachable`.
//!
//! Credentials: the API key is read from the environment variable `LAMBDA_API_KEY` only
//! (Lambda publishes no official CLI with a configuration file; third-party CLIs' files,
//! such as `~/.lambda/config.json`, are not read). It is sent as
//! `Authorization: Bearer`, and never written to state, logs or error messages.
//!
//! SSH: the host is `Instance.ip`; port 22 and user `ubuntu` are Lambda Stack's defaults
//! and are *not* in the API description.
//!
//! Rate limits: about one request per second, launch one per 12 s. They are declared in
//! [`CloudProvider::capabilities`] (`max_concurrency`, `min_create_interval`); the adapter
//! itself never sleeps (the core's `machine::limits` enforces them). A 429 is `Transient` with the server's `Retry-After`.

mod errors;

use std::time::Duration;

use async_trait::async_trait;
use reqwest::Method;
use serde::Deserialize;
use serde_json::{json, Value};

pub use errors::{classify, ApiError, INSUFFICIENT_CAPACITY};

use super::{
    Capabilities, CloudProvider, ErrorKind, Feature, InstanceSpec, InstanceStatus, Lineage,
    Location, Observed, Offer, ProviderError, ResourceRequest, SshEndpoint, IDENTITY_LABEL,
    LINEAGE_LABEL,
};

/// The cloud name.
pub const CLOUD: &str = "lambda";
/// The API base URL when neither config nor environment overrides it.
pub const DEFAULT_ENDPOINT: &str = "https://cloud.lambda.ai";
/// Environment variable overriding the endpoint (wins over `[cloud.lambda] endpoint`).
pub const ENDPOINT_ENV: &str = "GPUPROV_LAMBDA_ENDPOINT";
/// Environment variable holding the API key.
pub const API_KEY_ENV: &str = "LAMBDA_API_KEY";
/// SSH port of Lambda instances (not in the API description).
pub const SSH_PORT: u16 = 22;
/// Login user of Lambda Stack images (not in the API description).
pub const SSH_USER: &str = "ubuntu";
/// Per-request timeout, seconds.
const REQUEST_TIMEOUT_SECS: u64 = 60;

/// The credential; its `Debug` never shows the value.
pub use super::Secret as ApiKey;

/// Configuration of the Lambda adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LambdaSettings {
    /// API base URL override; `None` means [`DEFAULT_ENDPOINT`].
    pub endpoint: Option<String>,
    /// `None` when no key was found; calls then fail with `Credentials`.
    pub api_key: Option<ApiKey>,
    /// The state's lineage (a UUID): `observe` only sees instances tagged with it. Must be
    /// set before `prepare`/`create`/`observe`/`cleanup`.
    pub lineage: Lineage,
}

impl LambdaSettings {
    /// Settings from `[cloud.lambda] endpoint` and the environment: endpoint precedence
    /// `GPUPROV_LAMBDA_ENDPOINT` (non-empty) > `endpoint` > [`DEFAULT_ENDPOINT`]; the key
    /// from `LAMBDA_API_KEY`. `lineage` is left empty: the caller sets it from the state.
    pub fn from_env_and_config(endpoint: Option<String>, lineage: Lineage) -> LambdaSettings {
        LambdaSettings {
            endpoint: super::endpoint_from(ENDPOINT_ENV, endpoint),
            api_key: super::env_nonempty(API_KEY_ENV).map(ApiKey::new),
            lineage,
        }
    }
}

/// The Lambda Cloud adapter. Construction does no I/O.
pub struct LambdaProvider {
    settings: LambdaSettings,
    http: reqwest::Client,
    capabilities: Option<Capabilities>,
}

// ---- API payloads (only the fields gpuprov reads) ----

#[derive(Debug, Clone, Deserialize)]
struct TypesItem {
    instance_type: InstanceType,
    #[serde(default)]
    regions_with_capacity_available: Vec<Region>,
}

#[derive(Debug, Clone, Deserialize)]
struct InstanceType {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    gpu_description: String,
    price_cents_per_hour: i64,
    specs: Specs,
}

#[derive(Debug, Clone, Deserialize)]
struct Specs {
    #[serde(default)]
    gpus: u32,
}

#[derive(Debug, Clone, Deserialize)]
struct Region {
    name: String,
}

#[derive(Debug, Clone, Deserialize)]
struct SshKey {
    name: String,
    #[serde(default)]
    public_key: String,
}

#[derive(Debug, Clone, Deserialize)]
struct Ruleset {
    id: String,
    name: String,
    region: Region,
}

#[derive(Debug, Clone, Deserialize)]
struct Tag {
    key: String,
    value: String,
}

#[derive(Debug, Clone, Deserialize)]
struct Instance {
    id: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    ip: Option<String>,
    status: String,
    #[serde(default)]
    region: Option<Region>,
    #[serde(default)]
    tags: Option<Vec<Tag>>,
}

#[derive(Debug, Clone, Deserialize)]
struct LaunchResponse {
    instance_ids: Vec<String>,
}

/// The GPU model of an instance type: `gpu_description` up to ` (` (`"H100 (80 GB SXM5)"`
/// → `H100`, `"RTX 6000 (24 GB)"` → `RTX 6000`), else the token after `gpu_<N>x_` in the
/// name (`gpu_8x_h100_sxm5` → `H100`). `None` for types without GPUs.
pub fn gpu_model(gpu_description: &str, type_name: &str, gpus: u32) -> Option<String> {
    if gpus == 0 {
        return None;
    }
    let from_desc = gpu_description
        .split(" (")
        .next()
        .unwrap_or_default()
        .trim();
    if !from_desc.is_empty() {
        return Some(from_desc.to_string());
    }
    let mut parts = type_name.split('_');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("gpu"), Some(n), Some(model)) if n.ends_with('x') => Some(model.to_uppercase()),
        _ => None,
    }
}

/// A GPU name reduced to uppercase letters and digits, so `H100`, `h100` and `RTX 6000` /
/// `rtx6000` compare equal.
fn norm(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_uppercase())
        .collect()
}

/// Registration attempts of the project key (each lists the keys first).
const KEY_REGISTER_ATTEMPTS: usize = 3;

/// `base`, or the first of `base-2`, `base-3`, … that no key in `keys` is named (Lambda
/// key names are unique; at most 64 characters, `base` has 29).
fn free_key_name(base: &str, keys: &[SshKey]) -> String {
    let taken = |n: &str| keys.iter().any(|k| k.name == n);
    if !taken(base) {
        return base.to_string();
    }
    (2..)
        .map(|i| format!("{base}-{i}"))
        .find(|n| !taken(n))
        .unwrap_or_else(|| base.to_string())
}

/// The OpenSSH key without its comment (`type base64`), for comparing keys by value.
fn key_value(k: &str) -> String {
    k.split_whitespace().take(2).collect::<Vec<_>>().join(" ")
}

/// Normalised status of a Lambda `InstanceStatus`; `None` for `terminated` (gone).
fn status_of(s: &str) -> Option<InstanceStatus> {
    Some(match s {
        "booting" => InstanceStatus::Pending,
        "active" => InstanceStatus::Running,
        "unhealthy" => InstanceStatus::Failed("unhealthy".into()),
        "terminating" => InstanceStatus::Terminating,
        "preempted" => InstanceStatus::Failed("preempted".into()),
        "terminated" => return None,
        other => InstanceStatus::Failed(format!("unknown Lambda status `{other}`")),
    })
}

impl LambdaProvider {
    /// An adapter for `settings`. Never fails and does no I/O.
    pub fn new(settings: LambdaSettings) -> LambdaProvider {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(REQUEST_TIMEOUT_SECS))
            .user_agent(concat!("gpuprov/", env!("CARGO_PKG_VERSION")))
            .build()
            .unwrap_or_default();
        LambdaProvider {
            settings,
            http,
            capabilities: None,
        }
    }

    /// Replaces the declared capabilities (tests use short timeouts and poll intervals).
    pub fn with_capabilities(mut self, caps: Capabilities) -> LambdaProvider {
        self.capabilities = Some(caps);
        self
    }

    /// The capabilities Lambda's documentation implies (see [`CloudProvider::capabilities`]).
    pub fn default_capabilities() -> Capabilities {
        Capabilities {
            supported: vec![
                Feature::BootScript,
                Feature::Firewall,
                Feature::Gpu,
                Feature::Kubernetes,
            ],
            boot_timeout: Duration::from_secs(20 * 60),
            ssh_timeout: Duration::from_secs(10 * 60),
            delete_timeout: Duration::from_secs(15 * 60),
            poll_interval: Duration::from_secs(10),
            max_concurrency: 1,
            min_create_interval: Duration::from_secs(12),
            create_list_lag: Duration::from_secs(20),
            default_regions: Vec::new(),
            keeps_offer_order: false,
        }
    }

    pub fn settings(&self) -> &LambdaSettings {
        &self.settings
    }

    /// The per-VM object name: `gpuprov-<vm>-<first 8 chars of lineage>` (instance and
    /// firewall ruleset; at most 57 characters, Lambda allows 64).
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

    fn classify(&self, e: &ApiError, what: &str) -> ProviderError {
        classify(e, what, self.secret())
    }

    /// One API call; returns the envelope's `data` or the error as Lambda reported it.
    async fn call_raw(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Result<Value, ApiError>, ProviderError> {
        let Some(key) = &self.settings.api_key else {
            return Err(ProviderError::new(
                ErrorKind::Credentials,
                format!(
                    "no Lambda API key: set {API_KEY_ENV} (looked in: the {API_KEY_ENV} \
                     environment variable)"
                ),
            ));
        };
        let url = format!("{}{path}", self.base());
        let mut req = self.http.request(method, &url).bearer_auth(key.expose());
        if let Some(b) = body {
            req = req.json(b);
        }
        let transport = |e: reqwest::Error| ApiError {
            status: None,
            code: None,
            refused: super::cause::is_refused(&e),
            message: format!("{} ({})", e.without_url(), super::redact::redact_url(&url)),
            retry_after_secs: None,
        };
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => return Ok(Err(transport(e))),
        };
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
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
                retry_after.as_deref(),
            )));
        }
        let v: Value = serde_json::from_str(&text).map_err(|e| {
            ProviderError::new(
                ErrorKind::Failed,
                format!("lambda {path}: unreadable response: {e}"),
            )
        })?;
        Ok(Ok(v.get("data").cloned().unwrap_or(Value::Null)))
    }

    /// [`Self::call_raw`] with errors classified; parses `data` into `T`.
    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        what: &str,
    ) -> Result<T, ProviderError> {
        let data = self
            .call_raw(method, path, body)
            .await?
            .map_err(|e| self.classify(&e, what))?;
        serde_json::from_value(data).map_err(|e| {
            ProviderError::new(
                ErrorKind::Failed,
                format!("lambda {what}: unexpected response shape: {e}"),
            )
        })
    }

    async fn instance_types(&self) -> Result<Vec<TypesItem>, ProviderError> {
        let map: std::collections::BTreeMap<String, TypesItem> = self
            .call(
                Method::GET,
                "/api/v1/instance-types",
                None,
                "list instance types",
            )
            .await?;
        Ok(map.into_values().collect())
    }

    async fn rulesets(&self) -> Result<Vec<Ruleset>, ProviderError> {
        self.call(
            Method::GET,
            "/api/v1/firewall-rulesets",
            None,
            "list firewall rulesets",
        )
        .await
    }

    /// The name of the registered key whose value is `public_key` (compared without the
    /// comment), registering it when there is none under
    /// [`super::project_key_name`] (`gpuprov-<lineage8>-<fp12>`). A key is never taken
    /// for its name: one registered under the old `gpuprov-<lineage8>` or the derived name
    /// with another value is left alone. Lambda refuses a second key of the same name
    /// (HTTP 400 `global/invalid-parameters`, "Key name must be unique"), so when the
    /// derived name is taken by another value the next free `<name>-<n>` is used; a
    /// refusal on registration (a key registered meanwhile) lists again and retries.
    async fn ensure_key(&self, public_key: &str, lineage: &str) -> Result<String, ProviderError> {
        let want = key_value(public_key);
        if want.is_empty() {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                "the project's SSH public key is empty",
            ));
        }
        let base = super::project_key_name(lineage, public_key);
        let mut last = None;
        for _ in 0..KEY_REGISTER_ATTEMPTS {
            let keys: Vec<SshKey> = self
                .call(Method::GET, "/api/v1/ssh-keys", None, "list SSH keys")
                .await?;
            if let Some(k) = keys.iter().find(|k| key_value(&k.public_key) == want) {
                return Ok(k.name.clone());
            }
            let name = free_key_name(&base, &keys);
            let body = json!({ "name": name, "public_key": public_key.trim() });
            let what = format!("register SSH key {name}");
            match self
                .call_raw(Method::POST, "/api/v1/ssh-keys", Some(&body))
                .await?
            {
                Ok(data) => {
                    let created: SshKey = serde_json::from_value(data).map_err(|e| {
                        ProviderError::new(
                            ErrorKind::Failed,
                            format!("lambda {what}: unexpected response shape: {e}"),
                        )
                    })?;
                    return Ok(created.name);
                }
                // The name was taken between the listing and the registration.
                Err(e) if e.has_code(errors::INVALID_PARAMETERS) => {
                    last = Some(self.classify(&e, &what))
                }
                Err(e) => return Err(self.classify(&e, &what)),
            }
        }
        Err(last.unwrap_or_else(|| {
            ProviderError::new(ErrorKind::Failed, "lambda: could not register the SSH key")
        }))
    }

    /// The id of the VM's ruleset in `region`, created with TCP 22 and `ports` when missing.
    async fn ensure_ruleset(
        &self,
        name: &str,
        region: &str,
        ports: &[u16],
    ) -> Result<String, ProviderError> {
        if let Some(r) = self
            .rulesets()
            .await?
            .into_iter()
            .find(|r| r.name == name && r.region.name == region)
        {
            return Ok(r.id);
        }
        let mut all: Vec<u16> = vec![22];
        all.extend(ports.iter().copied());
        all.sort_unstable();
        all.dedup();
        let rules: Vec<Value> = all
            .iter()
            .map(|p| {
                json!({
                    "protocol": "tcp",
                    "port_range": [p, p],
                    "source_network": "0.0.0.0/0",
                    "description": format!("gpuprov: tcp {p}"),
                })
            })
            .collect();
        let body = json!({ "name": name, "region": region, "rules": rules });
        let created: Ruleset = self
            .call(
                Method::POST,
                "/api/v1/firewall-rulesets",
                Some(&body),
                &format!("create firewall ruleset {name} in {region}"),
            )
            .await?;
        Ok(created.id)
    }
}

/// Offers of `types` for the ask, in order: by the ask's region order when it names
/// regions, then price, then type name. Regions match as exact names (`us-east-1` never
/// matches `us-east-13`).
fn offers_for(types: &[TypesItem], req: &ResourceRequest) -> Vec<Offer> {
    let mut offers = Vec::new();
    for t in types {
        let it = &t.instance_type;
        let model = gpu_model(&it.gpu_description, &it.name, it.specs.gpus);
        if let Some(want) = &req.gpu {
            if model.as_deref().map(norm) != Some(norm(want)) {
                continue;
            }
        }
        if req.gpu_count > 0 && it.specs.gpus != req.gpu_count {
            continue;
        }
        for r in &t.regions_with_capacity_available {
            if !req.regions.is_empty() && !req.regions.contains(&r.name) {
                continue;
            }
            offers.push(Offer {
                id: format!("{CLOUD}/{}/{}", r.name, it.name),
                location: Location {
                    cloud: CLOUD.to_string(),
                    region: r.name.clone(),
                    zone: None,
                },
                instance_type: it.name.clone(),
                gpu: model.clone(),
                gpu_count: it.specs.gpus,
                spot: false,
                price_per_hour: it.price_cents_per_hour as f64 / 100.0,
                detail: json!({ "description": it.description }),
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
    offers
}

/// Whether a listed instance belongs to `vm_name` of `lineage` at `region`: both identity
/// tags, or (for an instance listed without tags) the gpuprov name.
fn is_ours(i: &Instance, region: &str, vm_name: &str, lineage: &str) -> bool {
    if i.region.as_ref().map(|r| r.name.as_str()) != Some(region) {
        return false;
    }
    match &i.tags {
        Some(tags) if !tags.is_empty() => {
            let has = |k: &str, v: &str| tags.iter().any(|t| t.key == k && t.value == v);
            has(IDENTITY_LABEL, vm_name) && has(LINEAGE_LABEL, lineage)
        }
        _ => i.name.as_deref() == Some(LambdaProvider::object_name(vm_name, lineage).as_str()),
    }
}

#[async_trait]
impl CloudProvider for LambdaProvider {
    fn name(&self) -> &'static str {
        CLOUD
    }

    fn endpoint_override(&self) -> Option<String> {
        self.settings
            .endpoint
            .as_deref()
            .map(super::redact::redact_url)
    }

    /// Boot script (cloud-init), firewall and GPUs; no spot. Lambda instances take several
    /// minutes to boot. `min_create_interval` is the documented launch limit (one per 12 s)
    /// and `max_concurrency` the general one (about one request per second).
    fn capabilities(&self) -> Capabilities {
        self.capabilities
            .clone()
            .unwrap_or_else(Self::default_capabilities)
    }

    /// Offers from `GET /api/v1/instance-types`: one per type matching the ask (GPU model
    /// compared ignoring case and punctuation, exact GPU count when asked) and region with
    /// capacity (exact names when the ask lists regions). An empty list means "no capacity
    /// now". Errors: a spot ask, or no type with that GPU model and count → `InvalidRequest`.
    async fn plan(&self, req: &ResourceRequest) -> Result<Vec<Offer>, ProviderError> {
        if req.spot {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                "Lambda has no spot instances",
            ));
        }
        let types = self.instance_types().await?;
        let exists = types.iter().any(|t| {
            let it = &t.instance_type;
            let model = gpu_model(&it.gpu_description, &it.name, it.specs.gpus);
            req.gpu
                .as_ref()
                .is_none_or(|g| model.as_deref().map(norm) == Some(norm(g)))
                && (req.gpu_count == 0 || it.specs.gpus == req.gpu_count)
        });
        if !exists {
            let mut have: Vec<String> = types
                .iter()
                .filter_map(|t| {
                    let it = &t.instance_type;
                    gpu_model(&it.gpu_description, &it.name, it.specs.gpus)
                        .map(|m| format!("{m} x{}", it.specs.gpus))
                })
                .collect();
            have.sort();
            have.dedup();
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "Lambda has no instance type with {} x{}; it has: {}",
                    req.gpu.as_deref().unwrap_or("any GPU"),
                    req.gpu_count,
                    have.join(", ")
                ),
            ));
        }
        Ok(offers_for(&types, req))
    }

    /// Re-checks capacity for the offer (gone → `Unavailable`), finds or registers the
    /// project key by value, and when `spec.ports` is non-empty finds or creates the VM's
    /// firewall ruleset in the region. Returns `{"ssh_key_name", "firewall_ruleset_id"?}`.
    async fn prepare(&self, offer: &Offer, spec: &InstanceSpec) -> Result<Value, ProviderError> {
        let lineage = self.lineage();
        let types = self.instance_types().await?;
        let available = types.iter().any(|t| {
            t.instance_type.name == offer.instance_type
                && t.regions_with_capacity_available
                    .iter()
                    .any(|r| r.name == offer.location.region)
        });
        if !available {
            return Err(ProviderError::new(
                ErrorKind::Unavailable,
                format!(
                    "lambda: no capacity left for {} in {}",
                    offer.instance_type, offer.location.region
                ),
            ));
        }
        let key_name = self.ensure_key(&spec.ssh_public_key, lineage).await?;
        let mut out = json!({ "ssh_key_name": key_name });
        if !spec.ports.is_empty() {
            let name = Self::object_name(&spec.vm_name, lineage);
            let id = self
                .ensure_ruleset(&name, &offer.location.region, &spec.ports)
                .await?;
            out["firewall_ruleset_id"] = Value::String(id);
        }
        Ok(out)
    }

    /// `POST /api/v1/instance-operations/launch` with the region, type, key, name
    /// `gpuprov-<vm>-<lineage8>`, both identity tags, the ruleset, `spec.image` as image
    /// family, and the boot script as `user_data`. Returns the first instance id.
    ///
    /// Lambda's launch takes no idempotency token (`spec.client_token` is unused): a launch
    /// repeated after a crash is avoided by the core's observe-before-create, which finds
    /// the instance by its tags.
    async fn create(
        &self,
        offer: &Offer,
        prepared: &Value,
        spec: &InstanceSpec,
    ) -> Result<String, ProviderError> {
        crate::provider::check_spec_lineage("lambda", &self.settings.lineage, spec)?;
        let lineage = self.settings.lineage.as_str();
        let key = prepared
            .get("ssh_key_name")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                ProviderError::new(
                    ErrorKind::InvalidRequest,
                    "prepared data has no ssh_key_name",
                )
            })?;
        let mut body = json!({
            "region_name": offer.location.region,
            "instance_type_name": offer.instance_type,
            "ssh_key_names": [key],
            "name": Self::object_name(&spec.vm_name, lineage),
            "tags": [
                { "key": IDENTITY_LABEL, "value": spec.vm_name },
                { "key": LINEAGE_LABEL, "value": lineage },
            ],
        });
        if let Some(id) = prepared.get("firewall_ruleset_id").and_then(Value::as_str) {
            body["firewall_rulesets"] = json!([{ "id": id }]);
        }
        if let Some(image) = spec.image.as_deref().filter(|s| !s.is_empty()) {
            body["image"] = json!({ "family": image });
        }
        if let Some(b) = &spec.boot_script {
            body["user_data"] = Value::String(super::cloud_init_user_data(b)?);
        }
        let what = format!(
            "launch {} in {}",
            offer.instance_type, offer.location.region
        );
        let r: LaunchResponse = self
            .call(
                Method::POST,
                "/api/v1/instance-operations/launch",
                Some(&body),
                &what,
            )
            .await?;
        r.instance_ids.into_iter().next().ok_or_else(|| {
            ProviderError::new(
                ErrorKind::Failed,
                format!("lambda {what}: no instance id in the response"),
            )
        })
    }

    /// `GET /api/v1/instances`, keeping the instances in `at.region` with both identity
    /// tags (or the gpuprov name when listed without tags), except `terminated` ones, sorted
    /// by id. Status: booting → Pending, active → Running, unhealthy / preempted →
    /// Failed, terminating → Terminating. SSH endpoint `ip:22`, user `ubuntu`, once `ip` is
    /// set.
    async fn observe(&self, at: &Location, vm_name: &str) -> Result<Vec<Observed>, ProviderError> {
        let lineage = self.lineage();
        if at.cloud != CLOUD {
            return Ok(vec![]);
        }
        let list: Vec<Instance> = self
            .call(Method::GET, "/api/v1/instances", None, "list instances")
            .await?;
        let mut out: Vec<Observed> = list
            .iter()
            .filter(|i| is_ours(i, &at.region, vm_name, lineage))
            .filter_map(|i| {
                let status = status_of(&i.status)?;
                let ssh =
                    i.ip.as_deref()
                        .filter(|ip| !ip.is_empty())
                        .map(|ip| SshEndpoint {
                            host: ip.to_string(),
                            port: SSH_PORT,
                            user: Some(SSH_USER.to_string()),
                        });
                Some(Observed {
                    instance_id: i.id.clone(),
                    status,
                    ssh,
                })
            })
            .collect();
        out.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
        Ok(out)
    }

    /// `POST /api/v1/instance-operations/terminate`. An unknown instance
    /// (`global/object-does-not-exist`) is success; with several ids, each is then
    /// terminated alone so the others still go.
    async fn delete(
        &self,
        _at: &Location,
        _vm_name: &str,
        instance_ids: &[String],
    ) -> Result<(), ProviderError> {
        if instance_ids.is_empty() {
            return Ok(());
        }
        let path = "/api/v1/instance-operations/terminate";
        let what = "terminate instances";
        let body = json!({ "instance_ids": instance_ids });
        match self.call_raw(Method::POST, path, Some(&body)).await? {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() && instance_ids.len() > 1 => {
                for id in instance_ids {
                    let body = json!({ "instance_ids": [id] });
                    match self.call_raw(Method::POST, path, Some(&body)).await? {
                        Ok(_) => {}
                        Err(e) if e.is_not_found() => {}
                        Err(e) => return Err(self.classify(&e, what)),
                    }
                }
                Ok(())
            }
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(self.classify(&e, what)),
        }
    }

    /// Deletes the VM's firewall ruleset in `at.region`, if any (not found → success; still
    /// attached to an instance, `firewall-rulesets/firewall-ruleset-in-use` → `InUse`). The project key stays registered:
    /// it is shared by the project's VMs.
    async fn cleanup(&self, at: &Location, vm_name: &str) -> Result<(), ProviderError> {
        let lineage = self.lineage();
        if at.cloud != CLOUD {
            return Ok(());
        }
        let name = Self::object_name(vm_name, lineage);
        for r in self
            .rulesets()
            .await?
            .into_iter()
            .filter(|r| r.name == name && r.region.name == at.region)
        {
            let path = format!("/api/v1/firewall-rulesets/{}", r.id);
            match self.call_raw(Method::DELETE, &path, None).await? {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(self.classify(&e, &format!("delete firewall ruleset {name}"))),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(name: &str, desc: &str, gpus: u32, cents: i64, regions: &[&str]) -> TypesItem {
        TypesItem {
            instance_type: InstanceType {
                name: name.into(),
                description: String::new(),
                gpu_description: desc.into(),
                price_cents_per_hour: cents,
                specs: Specs { gpus },
            },
            regions_with_capacity_available: regions
                .iter()
                .map(|r| Region { name: (*r).into() })
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

    #[test]
    fn gpu_models_from_description_then_name() {
        assert_eq!(
            gpu_model("H100 (80 GB SXM5)", "gpu_8x_h100_sxm5", 8).as_deref(),
            Some("H100")
        );
        assert_eq!(
            gpu_model("RTX 6000 (24 GB)", "gpu_1x_rtx6000", 1).as_deref(),
            Some("RTX 6000")
        );
        assert_eq!(
            gpu_model("", "gpu_8x_h100_sxm5", 8).as_deref(),
            Some("H100")
        );
        assert_eq!(gpu_model("", "cpu_4x_general", 0), None);
        assert_eq!(norm("rtx6000"), norm("RTX 6000"));
    }

    #[test]
    fn offers_filter_by_gpu_count_and_exact_region() {
        let types = vec![
            item(
                "gpu_8x_h100_sxm5",
                "H100 (80 GB SXM5)",
                8,
                2392,
                &["us-east-13", "us-east-1"],
            ),
            item(
                "gpu_1x_h100_pcie",
                "H100 (80 GB PCIe)",
                1,
                249,
                &["us-east-1"],
            ),
            item("gpu_8x_a100", "A100 (40 GB SXM4)", 8, 1032, &["us-east-1"]),
        ];
        let o = offers_for(&types, &ask(Some("h100"), 8, &["us-east-1"]));
        let ids: Vec<&str> = o.iter().map(|o| o.id.as_str()).collect();
        assert_eq!(ids, ["lambda/us-east-1/gpu_8x_h100_sxm5"]);
        assert_eq!(o[0].price_per_hour, 23.92);
        assert_eq!((o[0].gpu.as_deref(), o[0].gpu_count), (Some("H100"), 8));
        let o = offers_for(&types, &ask(Some("H100"), 8, &["us-east-13"]));
        assert_eq!(o.len(), 1);
        assert_eq!(o[0].location.region, "us-east-13");
        assert!(offers_for(&types, &ask(Some("H100"), 8, &["us-east"])).is_empty());
        // Region preference first, then price.
        let o = offers_for(&types, &ask(None, 8, &["us-east-13", "us-east-1"]));
        let ids: Vec<&str> = o.iter().map(|o| o.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "lambda/us-east-13/gpu_8x_h100_sxm5",
                "lambda/us-east-1/gpu_8x_a100",
                "lambda/us-east-1/gpu_8x_h100_sxm5"
            ]
        );
    }

    #[test]
    fn statuses_map_and_terminated_is_gone() {
        assert_eq!(status_of("booting"), Some(InstanceStatus::Pending));
        assert_eq!(status_of("active"), Some(InstanceStatus::Running));
        assert_eq!(
            status_of("unhealthy"),
            Some(InstanceStatus::Failed("unhealthy".into()))
        );
        assert_eq!(status_of("terminating"), Some(InstanceStatus::Terminating));
        assert_eq!(
            status_of("preempted"),
            Some(InstanceStatus::Failed("preempted".into()))
        );
        assert_eq!(status_of("terminated"), None);
    }

    #[test]
    fn a_taken_key_name_gets_the_next_free_suffix() {
        let key = |name: &str| SshKey {
            name: name.into(),
            public_key: "ssh-ed25519 AAAAother".into(),
        };
        assert_eq!(free_key_name("gpuprov-a-b", &[key("x")]), "gpuprov-a-b");
        assert_eq!(
            free_key_name("gpuprov-a-b", &[key("gpuprov-a-b"), key("gpuprov-a-b-2")]),
            "gpuprov-a-b-3"
        );
    }

    #[test]
    fn keys_compare_by_value_not_comment() {
        assert_eq!(
            key_value("ssh-ed25519 AAAAx me@laptop\n"),
            key_value("ssh-ed25519 AAAAx gpuprov")
        );
        assert_ne!(
            key_value("ssh-ed25519 AAAAx"),
            key_value("ssh-ed25519 AAAAy")
        );
    }

    #[test]
    fn ownership_needs_region_and_both_tags() {
        let inst = |region: &str, tags: Option<Vec<(&str, &str)>>, name: &str| Instance {
            id: "i".into(),
            name: Some(name.into()),
            ip: None,
            status: "active".into(),
            region: Some(Region {
                name: region.into(),
            }),
            tags: tags.map(|t| {
                t.into_iter()
                    .map(|(k, v)| Tag {
                        key: k.into(),
                        value: v.into(),
                    })
                    .collect()
            }),
        };
        let lin = "0f0e0d0c-1111";
        let both = Some(vec![(IDENTITY_LABEL, "a"), (LINEAGE_LABEL, lin)]);
        assert!(is_ours(
            &inst("us-east-1", both.clone(), "x"),
            "us-east-1",
            "a",
            lin
        ));
        assert!(!is_ours(
            &inst("us-east-13", both, "x"),
            "us-east-1",
            "a",
            lin
        ));
        let other_lineage = Some(vec![(IDENTITY_LABEL, "a"), (LINEAGE_LABEL, "zzz")]);
        assert!(!is_ours(
            &inst("us-east-1", other_lineage, "gpuprov-a-0f0e0d0c"),
            "us-east-1",
            "a",
            lin
        ));
        assert!(is_ours(
            &inst("us-east-1", None, "gpuprov-a-0f0e0d0c"),
            "us-east-1",
            "a",
            lin
        ));
    }

    #[test]
    fn api_key_debug_is_redacted() {
        let s = LambdaSettings {
            api_key: Some(ApiKey::new("secret_sentinel")),
            ..LambdaSettings::from_env_and_config(None, Lineage::random())
        };
        assert!(!format!("{s:?}").contains("secret_sentinel"));
    }
}
