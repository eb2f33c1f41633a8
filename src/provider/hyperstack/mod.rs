//! Hyperstack (cloud name `hyperstack`), over NexGen Cloud's Infrahub API v1 (OpenAPI
//! 3.0.1 as published in the vendor's Go SDK, `../shared/vendor-apis/hyperstack/openapi.yaml`;
//! server `https://infrahub-api.nexgencloud.com/v1`).
//!
//! Mapping onto the contract (design 5):
//!
//! - `plan`: `GET /core/flavors` (per asked region, `?region=`) ⨝ `GET /core/stocks` ⨝
//!   `GET /pricebook`. One offer per flavor that matches the ask (GPU model, GPU count),
//!   sits in an asked region (exact names), has stock (`Flavor_Fields.stock_available` not
//!   false *and* the region's stock entry for the GPU model has a positive count for the
//!   flavor's `<N>x` configuration) and has a price. Id `hyperstack/<region>/<flavor>`.
//!   Hyperstack has no spot market in this API.
//! - `prepare`: refuses a flavor whose root disk is smaller than the VM's `disk_gb`
//!   (`Unavailable`: the next offer may be bigger), re-checks stock, finds or creates the
//!   project's environment in the region (`gpuprov-<lineage8>-<region>`), finds the project
//!   key pair in that environment by its public key *value*, else imports it under
//!   [`super::project_key_name`] (`gpuprov-<lineage8>-<fp12>`; a key pair holding that name
//!   with another value is never used: the import moves to `-2`, `-3`), and picks the image
//!   (the config's, else the newest Ubuntu CUDA image of the region).
//! - `create`: `POST /core/virtual-machines` (count 1) named `gpuprov-<vm>-<lineage8>`,
//!   labelled `gpuprov-vm-name=<vm>` and `gpuprov-lineage=<lineage>`, with a public IP
//!   (`assign_floating_ip`), port randomisation off (so SSH is on port 22: the API does not
//!   report a randomised port), ingress security rules for TCP 22 and the VM's ports, and
//!   the boot script as cloud-init `user_data`.
//! - `observe`: `GET /core/virtual-machines?environment=…&exact_environment_match=true&search=…`,
//!   keeping the VMs with the exact name, the environment of the region, and both labels.
//! - `delete`: `DELETE /core/virtual-machines/{id}`; 404 is success; a refusal because the
//!   VM is still being created is `Transient` (retry later), never success.
//! - `cleanup`: nothing. Security rules belong to the VM and go with it; the environment
//!   and the key pair are shared by the project's VMs in the region and are left in place
//!   (an empty environment costs nothing; proving it is empty *and* ours before deleting it
//!   would race with a concurrent create). Nothing else is created per VM, so no delete
//!   of a side resource can be refused as in use (`InUse`); the description documents no
//!   such answer for environments or key pairs either (their `DELETE`s declare only
//!   400/401/404/500).
//! - `start` ([`Feature::Start`]): `GET /core/virtual-machines/{id}/start`. A stopped VM is
//!   `SHUTOFF` (vendor docs, "VM states and statuses": stop `STOPPING → SHUTOFF`), observed
//!   as `Stopped`.
//!
//! Errors show a short cause: the envelope's `message` and `error_reason` when the body is
//! one, else [`super::cause::http_cause`] (status, content type, first line), never a
//! dumped page. A refused connection is `Unreachable` (the whole cloud), with the endpoint
//! redacted.
//!
//! Readiness: a VM is `Running` only when `status` is `ACTIVE`, `power_state` (when
//! reported) is `RUNNING`, and its public IP is attached (`floating_ip` set and
//! `floating_ip_status` `ATTACHED`). The description declares these three fields as free
//! strings without enums; the values are the vendor documentation's ("VM states and
//! statuses"; SOURCES.md). Until then the VM is `Pending` without an SSH endpoint.
//!
//! Credentials: the API key is read from the environment variable `HYPERSTACK_API_KEY`
//! (the name the vendor's Terraform provider and SDK examples use). Hyperstack publishes
//! no CLI with a configuration file, so no file is read. The key is sent as the `api_key`
//! header (security scheme `apiKey`) and never written to state, logs or error messages.
//!
//! SSH: host = `floating_ip`, port 22 (port randomisation disabled at create), user
//! `ubuntu`, the default user of Hyperstack's Ubuntu images (the default image gpuprov
//! picks); an `image` override with another OS may need another user.
//!
//! Rate limits are not in the description; a 429 is `Transient` with the server's
//! `Retry-After`, and the declared `max_concurrency` keeps the request rate modest.

mod errors;

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

pub use errors::{classify, ApiError, CAPACITY_PHRASES};

use super::{
    Capabilities, CloudProvider, ErrorKind, Feature, InstanceSpec, InstanceStatus, Lineage,
    Location, Observed, Offer, ProviderError, ResourceRequest, SshEndpoint, IDENTITY_LABEL,
    LINEAGE_LABEL,
};

/// The cloud name.
pub const CLOUD: &str = "hyperstack";
/// The API base URL when neither config nor environment overrides it (`servers[0].url`).
pub const DEFAULT_ENDPOINT: &str = "https://infrahub-api.nexgencloud.com/v1";
/// Environment variable overriding the endpoint (wins over `[cloud.hyperstack] endpoint`).
pub const ENDPOINT_ENV: &str = "GPUPROV_HYPERSTACK_ENDPOINT";
/// Environment variable holding the API key.
pub const API_KEY_ENV: &str = "HYPERSTACK_API_KEY";
/// SSH port: 22, because VMs are created with `enable_port_randomization: false`.
pub const SSH_PORT: u16 = 22;
/// Login user of Hyperstack's Ubuntu images (vendor docs; not in the API description).
pub const SSH_USER: &str = "ubuntu";
/// Longest VM, environment and key pair name the API accepts (`maxLength: 50` of
/// `Create_Instances_Payload.name`, `Create_Environment.name`, `Import_Keypair_Payload.name`).
pub const MAX_NAME_LEN: usize = 50;
/// Per-request timeout, seconds.
const REQUEST_TIMEOUT_SECS: u64 = 60;
/// Items requested per page of a list call.
const PAGE_SIZE: usize = 100;
/// Upper bound on pages read from one list call (10,000 items).
const MAX_PAGES: usize = 100;
/// Names tried for the project key pair: the derived name, then `-2` … `-N`.
const KEY_NAME_TRIES: usize = 3;

/// The credential; its `Debug` never shows the value.
pub use super::Secret as ApiKey;

/// Configuration of the Hyperstack adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HyperstackSettings {
    /// API base URL override, including the `/v1` prefix; `None` means [`DEFAULT_ENDPOINT`].
    pub endpoint: Option<String>,
    /// `None` when no key was found; calls then fail with `Credentials`.
    pub api_key: Option<ApiKey>,
    /// The state's lineage (a UUID): `observe` only sees VMs labelled with it. Must be set
    /// before `prepare`/`create`/`observe`.
    pub lineage: Lineage,
}

impl HyperstackSettings {
    /// Settings from `[cloud.hyperstack] endpoint` and the environment: endpoint precedence
    /// `GPUPROV_HYPERSTACK_ENDPOINT` (non-empty) > `endpoint` > [`DEFAULT_ENDPOINT`]; the key
    /// from `HYPERSTACK_API_KEY`. `lineage` is left empty: the caller sets it from the state.
    pub fn from_env_and_config(endpoint: Option<String>, lineage: Lineage) -> HyperstackSettings {
        HyperstackSettings {
            endpoint: super::endpoint_from(ENDPOINT_ENV, endpoint),
            api_key: super::env_nonempty(API_KEY_ENV).map(ApiKey::new),
            lineage,
        }
    }
}

/// The Hyperstack adapter. Construction does no I/O.
pub struct HyperstackProvider {
    settings: HyperstackSettings,
    http: reqwest::Client,
    capabilities: Option<Capabilities>,
}

// ---- API payloads (only the fields gpuprov reads; the description marks none required) ----

#[derive(Debug, Clone, Default, Deserialize)]
struct FlavorList {
    #[serde(default)]
    data: Vec<FlavorGroup>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct FlavorGroup {
    #[serde(default)]
    region_name: Option<String>,
    #[serde(default)]
    flavors: Vec<Flavor>,
}

/// `Flavor_Fields`.
#[derive(Debug, Clone, Default, Deserialize)]
struct Flavor {
    #[serde(default)]
    name: String,
    #[serde(default)]
    region_name: Option<String>,
    /// vCPUs.
    #[serde(default)]
    cpu: u32,
    /// RAM, GB.
    #[serde(default)]
    ram: f64,
    /// Root disk, GB.
    #[serde(default)]
    disk: u32,
    /// Ephemeral disk, GB.
    #[serde(default)]
    ephemeral: u32,
    /// GPU model as Hyperstack names it (`H100-80G-PCIe`); empty for CPU flavors.
    #[serde(default)]
    gpu: String,
    #[serde(default)]
    gpu_count: u32,
    #[serde(default)]
    stock_available: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct StockList {
    #[serde(default)]
    stocks: Vec<Stock>,
}

/// `New_Stock_Response`.
#[derive(Debug, Clone, Default, Deserialize)]
struct Stock {
    #[serde(default)]
    region: String,
    #[serde(default)]
    models: Vec<StockModel>,
}

/// `New_Model_Response`: `configurations` maps `1x`, `2x`, `4x`, `8x`, `10x` to the number
/// of such VMs that can be created now.
#[derive(Debug, Clone, Default, Deserialize)]
struct StockModel {
    #[serde(default)]
    model: String,
    #[serde(default)]
    configurations: BTreeMap<String, Option<i64>>,
}

/// `PricebookModel`: `value` is USD per hour (per GPU for a GPU model's entry).
#[derive(Debug, Clone, Default, Deserialize)]
struct Price {
    #[serde(default)]
    name: String,
    #[serde(default)]
    value: Value,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct Environment {
    #[serde(default)]
    name: String,
    #[serde(default)]
    region: String,
}

#[derive(Debug, Clone, Deserialize)]
struct EnvironmentResponse {
    environment: Environment,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct Keypair {
    #[serde(default)]
    name: String,
    #[serde(default)]
    public_key: String,
    #[serde(default)]
    environment: Option<Environment>,
}

#[derive(Debug, Clone, Deserialize)]
struct KeypairResponse {
    keypair: Keypair,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct ImageGroup {
    #[serde(default)]
    region_name: Option<String>,
    #[serde(default)]
    images: Vec<Image>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct Image {
    #[serde(default)]
    name: String,
    #[serde(default)]
    region_name: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct ImageList {
    #[serde(default)]
    images: Vec<ImageGroup>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct VmEnvironment {
    #[serde(default)]
    name: String,
    #[serde(default)]
    region: Option<String>,
}

/// `Instance_Fields`.
#[derive(Debug, Clone, Default, Deserialize)]
struct Vm {
    #[serde(default)]
    id: Option<i64>,
    #[serde(default)]
    name: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    power_state: Option<String>,
    #[serde(default)]
    floating_ip: Option<String>,
    #[serde(default)]
    floating_ip_status: Option<String>,
    #[serde(default)]
    environment: Option<VmEnvironment>,
    #[serde(default)]
    labels: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct CreateResponse {
    #[serde(default)]
    instances: Vec<Vm>,
}

// ---- pure helpers ----

/// A name reduced to uppercase letters and digits (`H100-80G-PCIe` → `H10080GPCIE`).
fn norm(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_uppercase())
        .collect()
}

/// The tokens of a GPU name: split on `-`, `_`, space; uppercase; `80GB` reads as `80G`.
fn gpu_tokens(s: &str) -> Vec<String> {
    s.split(['-', '_', ' '])
        .filter(|t| !t.is_empty())
        .map(|t| {
            let t = norm(t);
            match t.strip_suffix("GB") {
                Some(n) if n.chars().all(|c| c.is_ascii_digit()) && !n.is_empty() => {
                    format!("{n}G")
                }
                _ => t,
            }
        })
        .collect()
}

/// Whether the asked GPU model `want` names Hyperstack's `vendor` model: the ask's tokens
/// are a prefix of the vendor's (`H100` and `h100-80gb` match `H100-80G-PCIe`; `L40` does
/// not match `L40S`).
pub fn gpu_matches(want: &str, vendor: &str) -> bool {
    let w = gpu_tokens(want);
    let v = gpu_tokens(vendor);
    !w.is_empty() && w.len() <= v.len() && w.iter().zip(&v).all(|(a, b)| a == b)
}

/// The OpenSSH key without its comment (`type base64`), for comparing keys by value.
fn key_value(k: &str) -> String {
    k.split_whitespace().take(2).collect::<Vec<_>>().join(" ")
}

/// A `PricebookModel.value` as a number (the description says number; tolerate a numeric
/// string).
fn price_value(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
    .filter(|p| p.is_finite() && *p >= 0.0)
}

/// The hourly price of `flavor` in USD: a pricebook entry named exactly like the flavor
/// (a whole-VM price), else the entry of its GPU model (USD per GPU-hour) times its GPU
/// count. `None` when the pricebook has neither.
fn price_of(prices: &[Price], flavor: &Flavor) -> Option<f64> {
    if let Some(p) = prices
        .iter()
        .find(|p| p.name == flavor.name)
        .and_then(|p| price_value(&p.value))
    {
        return Some(p);
    }
    if flavor.gpu.is_empty() || flavor.gpu_count == 0 {
        return None;
    }
    prices
        .iter()
        .find(|p| norm(&p.name) == norm(&flavor.gpu))
        .and_then(|p| price_value(&p.value))
        .map(|per_gpu| (per_gpu * flavor.gpu_count as f64 * 10_000.0).round() / 10_000.0)
}

/// How many VMs of `gpu` × `count` the stock list says can be created in `region` now
/// (exact region name; `configurations["<count>x"]`).
fn stock_count(stocks: &[Stock], region: &str, gpu: &str, count: u32) -> i64 {
    let key = format!("{count}x");
    stocks
        .iter()
        .filter(|s| s.region == region)
        .flat_map(|s| &s.models)
        .filter(|m| norm(&m.model) == norm(gpu))
        .filter_map(|m| m.configurations.get(&key).copied().flatten())
        .max()
        .unwrap_or(0)
}

/// The region of a flavor: its own `region_name`, else its group's.
fn flavors_with_region(list: &FlavorList) -> Vec<(String, Flavor)> {
    list.data
        .iter()
        .flat_map(|g| {
            g.flavors.iter().filter_map(move |f| {
                let region = f.region_name.clone().or_else(|| g.region_name.clone())?;
                Some((region, f.clone()))
            })
        })
        .collect()
}

/// Whether a flavor has stock now: not marked out of stock, and for GPU flavors a positive
/// count in the stock list; CPU flavors need `stock_available: true`.
fn in_stock(stocks: &[Stock], region: &str, f: &Flavor) -> bool {
    if f.stock_available == Some(false) {
        return false;
    }
    if f.gpu_count == 0 || f.gpu.is_empty() {
        return f.stock_available == Some(true);
    }
    stock_count(stocks, region, &f.gpu, f.gpu_count) > 0
}

fn matches_ask(f: &Flavor, req: &ResourceRequest) -> bool {
    if let Some(want) = &req.gpu {
        if f.gpu_count == 0 || !gpu_matches(want, &f.gpu) {
            return false;
        }
    }
    req.gpu_count == 0 || f.gpu_count == req.gpu_count
}

/// Offers for the ask, in order: by the ask's region order when it names regions, then
/// price, then flavor name. Regions match as exact names (`CANADA-1` never matches
/// `CANADA-10`). Flavors without stock or without a price are left out.
fn offers_for(
    flavors: &[(String, Flavor)],
    stocks: &[Stock],
    prices: &[Price],
    req: &ResourceRequest,
) -> Vec<Offer> {
    let mut offers = Vec::new();
    for (region, f) in flavors {
        if !req.regions.is_empty() && !req.regions.contains(region) {
            continue;
        }
        if !matches_ask(f, req) || !in_stock(stocks, region, f) {
            continue;
        }
        let Some(price) = price_of(prices, f) else {
            continue;
        };
        offers.push(Offer {
            id: format!("{CLOUD}/{region}/{}", f.name),
            location: Location {
                cloud: CLOUD.to_string(),
                region: region.clone(),
                zone: None,
            },
            instance_type: f.name.clone(),
            gpu: (f.gpu_count > 0 && !f.gpu.is_empty()).then(|| f.gpu.clone()),
            gpu_count: f.gpu_count,
            spot: false,
            price_per_hour: price,
            detail: json!({
                "vcpus": f.cpu,
                "ram_gb": f.ram,
                "disk_gb": f.disk,
                "ephemeral_gb": f.ephemeral,
            }),
        });
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
    offers.dedup_by(|a, b| a.id == b.id);
    offers
}

/// Normalised status of a VM and, once it is ready, its SSH endpoint; `None` for a
/// deleted VM (gone). Ready = `status` `ACTIVE`, `power_state` `RUNNING` (when reported)
/// and the floating IP attached (`floating_ip` set, `floating_ip_status` `ATTACHED`).
fn status_of(vm: &Vm) -> Option<(InstanceStatus, Option<SshEndpoint>)> {
    let up = |s: &Option<String>| s.as_deref().unwrap_or_default().trim().to_uppercase();
    let status = vm.status.trim().to_uppercase();
    let s = match status.as_str() {
        "ACTIVE" => {
            let ip = vm
                .floating_ip
                .as_deref()
                .map(str::trim)
                .filter(|ip| !ip.is_empty());
            let power = up(&vm.power_state);
            let attached = up(&vm.floating_ip_status) == "ATTACHED";
            match ip {
                Some(ip) if attached && (power.is_empty() || power == "RUNNING") => {
                    return Some((
                        InstanceStatus::Running,
                        Some(SshEndpoint {
                            host: ip.to_string(),
                            port: SSH_PORT,
                            user: Some(SSH_USER.to_string()),
                        }),
                    ))
                }
                _ => InstanceStatus::Pending,
            }
        }
        "CREATING" | "BUILD" | "BUILDING" | "STARTING" | "REBOOTING" | "HARD_REBOOT"
        | "RESTORING" | "RESIZING" | "RESIZED" | "PENDING" => InstanceStatus::Pending,
        "STOPPING" | "HIBERNATING" => InstanceStatus::Stopping,
        "SHUTOFF" | "STOPPED" | "HIBERNATED" => InstanceStatus::Stopped,
        "DELETING" => InstanceStatus::Terminating,
        "DELETED" => return None,
        "ERROR" => InstanceStatus::Failed("ERROR".into()),
        other => InstanceStatus::Failed(format!("unknown Hyperstack status `{other}`")),
    };
    Some((s, None))
}

/// The label a VM carries for `key`: `key=value`.
fn label(key: &str, value: &str) -> String {
    format!("{key}={value}")
}

/// Whether a listed VM is `vm_name` of `lineage` at `region`: the exact gpuprov name, the
/// project's environment of the region, and (when the list shows labels) both identity
/// labels.
fn is_ours(vm: &Vm, env: &str, region: &str, vm_name: &str, lineage: &str) -> bool {
    if vm.name != HyperstackProvider::object_name(vm_name, lineage) {
        return false;
    }
    match &vm.environment {
        Some(e) if e.name == env && e.region.as_deref().is_none_or(|r| r == region) => {}
        Some(_) => return false,
        // Listed without its environment: the query already filtered on the exact
        // environment, but then the labels must prove it.
        None if vm.labels.is_empty() => return false,
        None => {}
    }
    if vm.labels.is_empty() {
        return true;
    }
    vm.labels.contains(&label(IDENTITY_LABEL, vm_name))
        && vm.labels.contains(&label(LINEAGE_LABEL, lineage))
}

/// Ingress rules for TCP 22 and `ports`, from anywhere (`Create_Security_Rule_Payload`).
fn security_rules(ports: &[u16]) -> Vec<Value> {
    let mut all: Vec<u16> = vec![22];
    all.extend(ports.iter().copied());
    all.sort_unstable();
    all.dedup();
    all.iter()
        .map(|p| {
            json!({
                "direction": "ingress",
                "ethertype": "IPv4",
                "protocol": "tcp",
                "remote_ip_prefix": "0.0.0.0/0",
                "port_range_min": p,
                "port_range_max": p,
            })
        })
        .collect()
}

/// The default image of a region: the greatest name among its Ubuntu images with CUDA,
/// else among its Ubuntu images (Hyperstack names them like
/// `Ubuntu Server 22.04 LTS R535 CUDA 12.2`, so the greatest name is the newest).
fn default_image(list: &ImageList, region: &str) -> Option<String> {
    let names: Vec<&str> = list
        .images
        .iter()
        .flat_map(|g| {
            g.images.iter().filter(move |i| {
                i.region_name
                    .as_deref()
                    .or(g.region_name.as_deref())
                    .is_none_or(|r| r == region)
            })
        })
        .map(|i| i.name.as_str())
        .filter(|n| n.to_lowercase().contains("ubuntu"))
        .collect();
    let cuda = names
        .iter()
        .filter(|n| n.to_lowercase().contains("cuda"))
        .max();
    cuda.or(names.iter().max()).map(|s| s.to_string())
}

fn short(lineage: &str) -> String {
    lineage.chars().take(8).collect()
}

fn invalid(msg: impl Into<String>) -> ProviderError {
    ProviderError::new(ErrorKind::InvalidRequest, msg)
}

impl HyperstackProvider {
    /// An adapter for `settings`. Never fails and does no I/O.
    pub fn new(settings: HyperstackSettings) -> HyperstackProvider {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(REQUEST_TIMEOUT_SECS))
            .user_agent(concat!("gpuprov/", env!("CARGO_PKG_VERSION")))
            .build()
            .unwrap_or_default();
        HyperstackProvider {
            settings,
            http,
            capabilities: None,
        }
    }

    /// Replaces the declared capabilities (tests use short timeouts and poll intervals).
    pub fn with_capabilities(mut self, caps: Capabilities) -> HyperstackProvider {
        self.capabilities = Some(caps);
        self
    }

    /// The capabilities gpuprov declares for Hyperstack (see [`CloudProvider::capabilities`]).
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
            delete_timeout: Duration::from_secs(15 * 60),
            poll_interval: Duration::from_secs(10),
            max_concurrency: 4,
            min_create_interval: Duration::ZERO,
            create_list_lag: Duration::from_secs(20),
            default_regions: Vec::new(),
            keeps_offer_order: false,
        }
    }

    pub fn settings(&self) -> &HyperstackSettings {
        &self.settings
    }

    /// The VM name: `gpuprov-<vm>-<first 8 chars of lineage>` (at most [`MAX_NAME_LEN`]).
    pub fn object_name(vm_name: &str, lineage: &str) -> String {
        format!("gpuprov-{vm_name}-{}", short(lineage))
    }

    /// The project's environment in `region`: `gpuprov-<lineage8>-<region, lowercase>`,
    /// cut to [`MAX_NAME_LEN`].
    pub fn environment_name(lineage: &str, region: &str) -> String {
        let mut n = format!("gpuprov-{}-{}", short(lineage), region.to_lowercase());
        n.truncate(MAX_NAME_LEN);
        n
    }

    /// The name the project key pair is imported under:
    /// [`super::project_key_name`] (`gpuprov-<lineage8>-<fp12>`, the key's fingerprint in
    /// it), so a key pair of the same lineage with another value has another name.
    pub fn key_name(lineage: &str, public_key: &str) -> String {
        super::project_key_name(lineage, public_key)
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

    /// One API call; returns the body or the error as Hyperstack reported it (a 2xx whose
    /// envelope says `status: false` is an error too).
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
                    "no Hyperstack API key: set {API_KEY_ENV} (looked in: the {API_KEY_ENV} \
                     environment variable; Hyperstack has no CLI configuration file)"
                ),
            ));
        };
        let url = format!("{}{path}", self.base());
        let mut req = self
            .http
            .request(method, &url)
            .header("api_key", key.expose());
        if !query.is_empty() {
            req = req.query(query);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let transport = |e: reqwest::Error| ApiError {
            status: None,
            message: format!("{} ({})", e.without_url(), super::redact::redact_url(&url)),
            reason: None,
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
                        "hyperstack: the API endpoint refused the connection ({})",
                        super::redact::redact_url(&url)
                    ),
                ))
            }
            Err(e) => return Ok(Err(transport(e))),
        };
        let status = resp.status().as_u16();
        let header = |name: reqwest::header::HeaderName| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let retry_after = header(reqwest::header::RETRY_AFTER);
        let content_type = header(reqwest::header::CONTENT_TYPE);
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
            )));
        }
        let v: Value = serde_json::from_str(&text).map_err(|e| {
            ProviderError::new(
                ErrorKind::Failed,
                format!("hyperstack {path}: unreadable response: {e}"),
            )
        })?;
        if v.get("status") == Some(&Value::Bool(false)) {
            return Ok(Err(ApiError::from_response(status, &text, None)));
        }
        Ok(Ok(v))
    }

    /// [`Self::call_raw`] with errors classified; parses the body into `T`.
    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
        what: &str,
    ) -> Result<T, ProviderError> {
        let v = self
            .call_raw(method, path, query, body)
            .await?
            .map_err(|e| self.classify(&e, what))?;
        serde_json::from_value(v).map_err(|e| {
            ProviderError::new(
                ErrorKind::Failed,
                format!("hyperstack {what}: unexpected response shape: {e}"),
            )
        })
    }

    /// Every item of a paginated list (`page`, `pageSize`; the items under `field`),
    /// reading pages until one comes back short or `count` items are in hand.
    async fn list_all<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
        field: &str,
        what: &str,
    ) -> Result<Vec<T>, ProviderError> {
        let mut out: Vec<T> = Vec::new();
        for page in 1..=MAX_PAGES {
            let mut q: Vec<(&str, String)> = query.to_vec();
            q.push(("page", page.to_string()));
            q.push(("pageSize", PAGE_SIZE.to_string()));
            let v: Value = self.call(Method::GET, path, &q, None, what).await?;
            let items: Vec<T> =
                serde_json::from_value(v.get(field).cloned().unwrap_or(Value::Array(vec![])))
                    .map_err(|e| {
                        ProviderError::new(
                            ErrorKind::Failed,
                            format!("hyperstack {what}: unexpected response shape: {e}"),
                        )
                    })?;
            let n = items.len();
            out.extend(items);
            let total = v.get("count").and_then(Value::as_u64).map(|c| c as usize);
            if n < PAGE_SIZE || n == 0 || total.is_some_and(|t| out.len() >= t) {
                break;
            }
        }
        Ok(out)
    }

    /// The flavors of `regions` (all regions when empty), with their regions.
    async fn flavors(&self, regions: &[String]) -> Result<Vec<(String, Flavor)>, ProviderError> {
        if regions.is_empty() {
            let l: FlavorList = self
                .call(Method::GET, "/core/flavors", &[], None, "list flavors")
                .await?;
            return Ok(flavors_with_region(&l));
        }
        let mut out = Vec::new();
        for r in regions {
            let l: FlavorList = self
                .call(
                    Method::GET,
                    "/core/flavors",
                    &[("region", r.clone())],
                    None,
                    &format!("list flavors of {r}"),
                )
                .await?;
            // The server filters; keep exact names only all the same.
            out.extend(
                flavors_with_region(&l)
                    .into_iter()
                    .filter(|(fr, _)| fr == r),
            );
        }
        Ok(out)
    }

    async fn stocks(&self) -> Result<Vec<Stock>, ProviderError> {
        match self
            .call_raw(Method::GET, "/core/stocks", &[], None)
            .await?
        {
            Ok(v) => serde_json::from_value::<StockList>(v)
                .map(|l| l.stocks)
                .map_err(|e| {
                    ProviderError::new(
                        ErrorKind::Failed,
                        format!("hyperstack list stocks: unexpected response shape: {e}"),
                    )
                }),
            // "Stocks Not Found": no stock anywhere.
            Err(e) if e.is_not_found() => Ok(vec![]),
            Err(e) => Err(self.classify(&e, "list stocks")),
        }
    }

    async fn prices(&self) -> Result<Vec<Price>, ProviderError> {
        self.call(Method::GET, "/pricebook", &[], None, "read the pricebook")
            .await
    }

    /// The project's environment in `region`, created when missing. Returns its name.
    async fn ensure_environment(
        &self,
        lineage: &str,
        region: &str,
    ) -> Result<String, ProviderError> {
        let name = Self::environment_name(lineage, region);
        let find = |envs: &[Environment]| envs.iter().any(|e| e.name == name && e.region == region);
        let envs: Vec<Environment> = self
            .list_all(
                "/core/environments",
                &[("search", name.clone())],
                "environments",
                "list environments",
            )
            .await?;
        if find(&envs) {
            return Ok(name);
        }
        if let Some(other) = envs.iter().find(|e| e.name == name) {
            return Err(invalid(format!(
                "a Hyperstack environment named {name} exists in region {} instead of {region}",
                other.region
            )));
        }
        let body = json!({ "name": name, "region": region });
        let what = format!("create environment {name} in {region}");
        match self
            .call_raw(Method::POST, "/core/environments", &[], Some(&body))
            .await?
        {
            Ok(v) => {
                let created: EnvironmentResponse = serde_json::from_value(v).map_err(|e| {
                    ProviderError::new(
                        ErrorKind::Failed,
                        format!("hyperstack {what}: unexpected response shape: {e}"),
                    )
                })?;
                Ok(created.environment.name)
            }
            // Created concurrently by another gpuprov run of the project: use it.
            Err(e) if e.status == Some(409) => Ok(name),
            Err(e) => Err(self.classify(&e, &what)),
        }
    }

    /// The name of the key pair in environment `env` whose value is `public_key` (whatever
    /// its name), importing it as [`Self::key_name`] when there is none. A key pair found
    /// under that name (or the old `gpuprov-<lineage8>`) with another value is never used
    /// and never stops the run: the import moves to `<name>-2`, `<name>-3`. A `409` on the
    /// import (Hyperstack refuses a name already taken; the description says only
    /// "Conflict") lists again: a concurrent run may have imported the same key, else the
    /// next name is tried.
    async fn ensure_key(
        &self,
        env: &str,
        public_key: &str,
        lineage: &str,
    ) -> Result<String, ProviderError> {
        let want = key_value(public_key);
        if want.is_empty() {
            return Err(invalid("the project's SSH public key is empty"));
        }
        let base = Self::key_name(lineage, public_key);
        let names: Vec<String> = std::iter::once(base.clone())
            .chain((2..=KEY_NAME_TRIES).map(|n| format!("{base}-{n}")))
            .collect();
        let mut taken: Vec<String> = Vec::new();
        let mut keys: Option<Vec<Keypair>> = None;
        for name in &names {
            if keys.is_none() {
                keys = Some(
                    self.list_all("/core/keypairs", &[], "keypairs", "list key pairs")
                        .await?,
                );
            }
            let in_env: Vec<&Keypair> = keys
                .iter()
                .flatten()
                .filter(|k| k.environment.as_ref().is_some_and(|e| e.name == env))
                .collect();
            if let Some(k) = in_env.iter().find(|k| key_value(&k.public_key) == want) {
                return Ok(k.name.clone());
            }
            if in_env.iter().any(|k| k.name == *name) {
                taken.push(name.clone());
                continue;
            }
            let body = json!({
                "environment_name": env,
                "name": name,
                "public_key": public_key.trim(),
            });
            let what = format!("import key pair {name} into {env}");
            match self
                .call_raw(Method::POST, "/core/keypairs", &[], Some(&body))
                .await?
            {
                Ok(v) => {
                    let created: KeypairResponse = serde_json::from_value(v).map_err(|e| {
                        ProviderError::new(
                            ErrorKind::Failed,
                            format!("hyperstack {what}: unexpected response shape: {e}"),
                        )
                    })?;
                    return Ok(created.keypair.name);
                }
                Err(e) if e.status == Some(409) => {
                    taken.push(name.clone());
                    keys = None;
                }
                Err(e) => return Err(self.classify(&e, &what)),
            }
        }
        Err(ProviderError::new(
            ErrorKind::Failed,
            format!(
                "hyperstack: environment {env} has key pairs named {} holding other public \
                 keys; gpuprov uses none of them and could not import the project's key \
                 under those names",
                taken.join(", ")
            ),
        ))
    }

    /// `spec_image` when set, else the region's default image (see [`default_image`]).
    async fn pick_image(
        &self,
        spec_image: Option<&str>,
        region: &str,
    ) -> Result<String, ProviderError> {
        if let Some(i) = spec_image.map(str::trim).filter(|s| !s.is_empty()) {
            return Ok(i.to_string());
        }
        let list: ImageList = self
            .call(
                Method::GET,
                "/core/images",
                &[("region", region.to_string())],
                None,
                &format!("list images of {region}"),
            )
            .await?;
        default_image(&list, region).ok_or_else(|| {
            ProviderError::new(
                ErrorKind::Unavailable,
                format!("hyperstack: no Ubuntu image in {region}; set `image` for this VM"),
            )
        })
    }
}

#[async_trait]
impl CloudProvider for HyperstackProvider {
    fn name(&self) -> &'static str {
        CLOUD
    }

    fn endpoint_override(&self) -> Option<String> {
        self.settings
            .endpoint
            .as_deref()
            .map(super::redact::redact_url)
    }

    /// Boot script (cloud-init `user_data`), firewall (security rules at create) and GPUs;
    /// no spot. The API documents no rate limits: `max_concurrency` 4 keeps gpuprov modest,
    /// and a 429 is retried after its `Retry-After`.
    fn capabilities(&self) -> Capabilities {
        self.capabilities
            .clone()
            .unwrap_or_else(Self::default_capabilities)
    }

    /// Offers from flavors ⨝ stocks ⨝ pricebook (see the module docs). An empty list means
    /// "no stock now". Errors: a spot ask, a VM name too long for Hyperstack's 50-character
    /// names, or no flavor with that GPU model and count → `InvalidRequest`.
    async fn plan(&self, req: &ResourceRequest) -> Result<Vec<Offer>, ProviderError> {
        if req.spot {
            return Err(invalid("Hyperstack has no spot VMs in its API"));
        }
        let name_len = Self::object_name(&req.vm_name, "00000000").len();
        if name_len > MAX_NAME_LEN {
            return Err(invalid(format!(
                "vm name {} is too long for Hyperstack: VM names are at most {MAX_NAME_LEN} \
                 characters and gpuprov adds 17 (gpuprov-<name>-<lineage8>)",
                req.vm_name
            )));
        }
        let flavors = self.flavors(&req.regions).await?;
        if !flavors.iter().any(|(_, f)| matches_ask(f, req)) {
            let mut have: Vec<String> = flavors
                .iter()
                .filter(|(_, f)| f.gpu_count > 0 && !f.gpu.is_empty())
                .map(|(_, f)| format!("{} x{}", f.gpu, f.gpu_count))
                .collect();
            have.sort();
            have.dedup();
            return Err(invalid(format!(
                "Hyperstack has no flavor with {} x{}{}; it has: {}",
                req.gpu.as_deref().unwrap_or("any GPU"),
                req.gpu_count,
                if req.regions.is_empty() {
                    String::new()
                } else {
                    format!(" in {}", req.regions.join(", "))
                },
                if have.is_empty() {
                    "none".to_string()
                } else {
                    have.join(", ")
                }
            )));
        }
        let stocks = self.stocks().await?;
        let prices = self.prices().await?;
        Ok(offers_for(&flavors, &stocks, &prices, req))
    }

    /// Checks the flavor's root disk against `spec.disk_gb` and re-checks stock (either
    /// short → `Unavailable`), then finds or creates the environment, finds or imports the
    /// key pair, and picks the image. Returns `{"environment_name", "key_name",
    /// "image_name"}`.
    async fn prepare(&self, offer: &Offer, spec: &InstanceSpec) -> Result<Value, ProviderError> {
        let lineage = self.lineage();
        let region = offer.location.region.as_str();
        let flavors = self.flavors(&[region.to_string()]).await?;
        let Some((_, flavor)) = flavors.iter().find(|(_, f)| f.name == offer.instance_type) else {
            return Err(ProviderError::new(
                ErrorKind::Unavailable,
                format!(
                    "hyperstack: flavor {} is no longer offered in {region}",
                    offer.instance_type
                ),
            ));
        };
        if let Some(want) = spec.disk_gb {
            if flavor.disk < want {
                return Err(ProviderError::new(
                    ErrorKind::Unavailable,
                    format!(
                        "hyperstack: flavor {} has a {} GB root disk, the VM asks for {want} GB",
                        flavor.name, flavor.disk
                    ),
                ));
            }
        }
        let stocks = self.stocks().await?;
        if !in_stock(&stocks, region, flavor) {
            return Err(ProviderError::new(
                ErrorKind::Unavailable,
                format!(
                    "hyperstack: no stock left for {} in {region}",
                    offer.instance_type
                ),
            ));
        }
        let env = self.ensure_environment(lineage, region).await?;
        let key = self.ensure_key(&env, &spec.ssh_public_key, lineage).await?;
        let image = self.pick_image(spec.image.as_deref(), region).await?;
        Ok(json!({
            "environment_name": env,
            "key_name": key,
            "image_name": image,
        }))
    }

    /// `POST /core/virtual-machines` (see the module docs). Returns the VM id.
    ///
    /// The API takes no idempotency token (`spec.client_token` is unused): a create
    /// repeated after a crash is avoided by the core's observe-before-create, which finds
    /// the VM by its exact name and labels.
    async fn create(
        &self,
        offer: &Offer,
        prepared: &Value,
        spec: &InstanceSpec,
    ) -> Result<String, ProviderError> {
        crate::provider::check_spec_lineage(CLOUD, &self.settings.lineage, spec)?;
        let lineage = self.settings.lineage.as_str();
        let field = |k: &str| {
            prepared
                .get(k)
                .and_then(Value::as_str)
                .ok_or_else(|| invalid(format!("prepared data has no {k}")))
        };
        let name = Self::object_name(&spec.vm_name, lineage);
        if name.len() > MAX_NAME_LEN {
            return Err(invalid(format!(
                "VM name {name} is longer than Hyperstack's {MAX_NAME_LEN} characters"
            )));
        }
        let mut body = json!({
            "name": name,
            "environment_name": field("environment_name")?,
            "flavor_name": offer.instance_type,
            "image_name": field("image_name")?,
            "key_name": field("key_name")?,
            "count": 1,
            "assign_floating_ip": true,
            "enable_port_randomization": false,
            "labels": [
                label(IDENTITY_LABEL, &spec.vm_name),
                label(LINEAGE_LABEL, lineage),
            ],
            "security_rules": security_rules(&spec.ports),
        });
        if let Some(b) = &spec.boot_script {
            body["user_data"] = Value::String(super::cloud_init_user_data(b)?);
        }
        let what = format!(
            "create VM {} in {}",
            offer.instance_type, offer.location.region
        );
        let r: CreateResponse = self
            .call(
                Method::POST,
                "/core/virtual-machines",
                &[],
                Some(&body),
                &what,
            )
            .await?;
        r.instances
            .iter()
            .find_map(|i| i.id)
            .map(|id| id.to_string())
            .ok_or_else(|| {
                ProviderError::new(
                    ErrorKind::Failed,
                    format!("hyperstack {what}: no VM id in the response"),
                )
            })
    }

    /// The VMs of the project's environment in `at.region` with the exact gpuprov name and
    /// both labels, except deleted ones, sorted by id (see [`status_of`] for readiness).
    async fn observe(&self, at: &Location, vm_name: &str) -> Result<Vec<Observed>, ProviderError> {
        let lineage = self.lineage();
        if at.cloud != CLOUD {
            return Ok(vec![]);
        }
        let env = Self::environment_name(lineage, &at.region);
        let name = Self::object_name(vm_name, lineage);
        let vms: Vec<Vm> = self
            .list_all(
                "/core/virtual-machines",
                &[
                    ("environment", env.clone()),
                    ("exact_environment_match", "true".to_string()),
                    ("search", name),
                ],
                "instances",
                "list VMs",
            )
            .await?;
        let mut out: Vec<Observed> = vms
            .iter()
            .filter(|v| is_ours(v, &env, &at.region, vm_name, lineage))
            .filter_map(|v| {
                let id = v.id?;
                let (status, ssh) = status_of(v)?;
                Some(Observed {
                    instance_id: id.to_string(),
                    status,
                    ssh,
                })
            })
            .collect();
        out.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
        out.dedup_by(|a, b| a.instance_id == b.instance_id);
        Ok(out)
    }

    /// `DELETE /core/virtual-machines/{id}` for each id. Not found (404), or an id that is
    /// not a Hyperstack VM id (not an integer), is success. A refusal because the VM is
    /// mid-transition (still `CREATING`; see [`ApiError::is_busy`]) is `Transient`: the
    /// core retries, and nothing is taken for deleted until `observe` no longer sees it.
    async fn delete(
        &self,
        _at: &Location,
        _vm_name: &str,
        instance_ids: &[String],
    ) -> Result<(), ProviderError> {
        for id in instance_ids {
            let Ok(n) = id.trim().parse::<i64>() else {
                continue;
            };
            let what = format!("delete VM {n}");
            match self
                .call_raw(
                    Method::DELETE,
                    &format!("/core/virtual-machines/{n}"),
                    &[],
                    None,
                )
                .await?
            {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) if e.is_busy() => {
                    let mut p = self.classify(&e, &what);
                    p.kind = ErrorKind::Transient;
                    p.msg = format!("{} (the VM is not deletable yet; will retry)", p.msg);
                    p.retry_after_secs = e.retry_after_secs;
                    return Err(p);
                }
                Err(e) => return Err(self.classify(&e, &what)),
            }
        }
        Ok(())
    }

    /// Nothing to do: the security rules go with the VM; the environment and the key pair
    /// are shared by the project's VMs in the region and stay (see the module docs).
    async fn cleanup(&self, _at: &Location, _vm_name: &str) -> Result<(), ProviderError> {
        Ok(())
    }

    /// `GET /core/virtual-machines/{id}/start` (`Start_VM`: "Initiates the startup of a
    /// virtual machine"; a stopped VM is `SHUTOFF`, then `STARTING` → `ACTIVE`). A refusal
    /// that is not classified capacity or quota is success when `GET
    /// /core/virtual-machines/{id}` shows the VM already `ACTIVE` or starting. Errors: as
    /// [`classify`] says: the description documents no capacity answer for a start (only
    /// `400 ErrorResponseModel` with free text), so a text naming stock or capacity is
    /// `Capacity`, one naming a quota is `Quota`, and anything else `Failed`; an id that
    /// is not a Hyperstack VM id → `InvalidRequest`; a VM that no longer exists (`404`) →
    /// `Failed`.
    async fn start(
        &self,
        _at: &Location,
        _vm_name: &str,
        instance_id: &str,
    ) -> Result<(), ProviderError> {
        let Ok(n) = instance_id.trim().parse::<i64>() else {
            return Err(invalid(format!(
                "{instance_id} is not a Hyperstack VM id (an integer)"
            )));
        };
        let what = format!("start VM {n}");
        let vm = format!("/core/virtual-machines/{n}");
        let refused = match self
            .call_raw(Method::GET, &format!("{vm}/start"), &[], None)
            .await?
        {
            Ok(_) => return Ok(()),
            Err(e) => e,
        };
        let mut err = self.classify(&refused, &what);
        if refused.is_not_found() {
            // Gone since it was observed: not a request gpuprov built wrongly.
            err.kind = ErrorKind::Failed;
            return Err(err);
        }
        if refused.status != Some(400) || err.kind != ErrorKind::Failed {
            return Err(err);
        }
        #[derive(Deserialize)]
        struct One {
            instance: Vm,
        }
        let now: One = self.call(Method::GET, &vm, &[], None, &what).await?;
        match now.instance.status.trim().to_uppercase().as_str() {
            "ACTIVE" | "STARTING" | "REBOOTING" | "HARD_REBOOT" => Ok(()),
            other => Err(ProviderError {
                msg: format!("{} (the VM is {other})", err.msg),
                ..err
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flavor(name: &str, gpu: &str, n: u32, stock: Option<bool>) -> Flavor {
        Flavor {
            name: name.into(),
            region_name: None,
            cpu: 28 * n,
            ram: 180.0 * n as f64,
            disk: 100,
            ephemeral: 750,
            gpu: gpu.into(),
            gpu_count: n,
            stock_available: stock,
        }
    }

    fn stock(region: &str, model: &str, cfg: &[(&str, i64)]) -> Stock {
        Stock {
            region: region.into(),
            models: vec![StockModel {
                model: model.into(),
                configurations: cfg.iter().map(|(k, v)| (k.to_string(), Some(*v))).collect(),
            }],
        }
    }

    fn price(name: &str, v: Value) -> Price {
        Price {
            name: name.into(),
            value: v,
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
    fn gpu_names_match_by_leading_tokens() {
        assert!(gpu_matches("H100", "H100-80G-PCIe"));
        assert!(gpu_matches("h100-80gb", "H100-80G-PCIe"));
        assert!(gpu_matches("H100-80G-SXM5", "H100-80G-SXM5"));
        assert!(!gpu_matches("H100-80G-SXM5", "H100-80G-PCIe"));
        assert!(!gpu_matches("L40", "L40S"));
        assert!(gpu_matches("RTX A6000", "RTX-A6000"));
        assert!(!gpu_matches("A100", "H100-80G-PCIe"));
        assert!(!gpu_matches("", "H100"));
    }

    #[test]
    fn offers_join_flavors_stock_and_prices_with_exact_regions() {
        let flavors = vec![
            (
                "CANADA-1".to_string(),
                flavor("n3-H100x8", "H100-80G-PCIe", 8, Some(true)),
            ),
            (
                "CANADA-10".to_string(),
                flavor("n3-H100x8", "H100-80G-PCIe", 8, Some(true)),
            ),
            (
                "NORWAY-1".to_string(),
                flavor("n3-H100x8", "H100-80G-PCIe", 8, Some(true)),
            ),
            (
                "CANADA-1".to_string(),
                flavor("n3-H100x1", "H100-80G-PCIe", 1, Some(true)),
            ),
            // Marked out of stock by the flavor list itself.
            (
                "US-1".to_string(),
                flavor("n3-H100x8", "H100-80G-PCIe", 8, Some(false)),
            ),
        ];
        let stocks = vec![
            stock("CANADA-1", "H100-80G-PCIe", &[("1x", 3), ("8x", 1)]),
            stock("CANADA-10", "H100-80G-PCIe", &[("8x", 2)]),
            stock("NORWAY-1", "H100-80G-PCIe", &[("8x", 0)]),
            stock("US-1", "H100-80G-PCIe", &[("8x", 5)]),
        ];
        let prices = vec![price("H100-80G-PCIe", json!(1.9))];
        let o = offers_for(
            &flavors,
            &stocks,
            &prices,
            &ask(Some("H100"), 8, &["CANADA-1"]),
        );
        let ids: Vec<&str> = o.iter().map(|o| o.id.as_str()).collect();
        assert_eq!(ids, ["hyperstack/CANADA-1/n3-H100x8"]);
        assert_eq!(o[0].price_per_hour, 15.2);
        assert_eq!(
            (o[0].gpu.as_deref(), o[0].gpu_count),
            (Some("H100-80G-PCIe"), 8)
        );
        assert_eq!(o[0].detail["vcpus"], 224);
        // No region named: every region with stock (NORWAY-1 has none, US-1 is marked out).
        let o = offers_for(&flavors, &stocks, &prices, &ask(Some("H100"), 8, &[]));
        let ids: Vec<&str> = o.iter().map(|o| o.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "hyperstack/CANADA-1/n3-H100x8",
                "hyperstack/CANADA-10/n3-H100x8"
            ]
        );
        assert!(offers_for(
            &flavors,
            &stocks,
            &prices,
            &ask(Some("H100"), 8, &["CANADA"])
        )
        .is_empty());
        // No price: no offer.
        assert!(offers_for(&flavors, &stocks, &[], &ask(Some("H100"), 8, &[])).is_empty());
    }

    #[test]
    fn a_flavor_price_wins_over_the_gpu_price_and_strings_parse() {
        let f = flavor("n3-A100x2", "A100-80G-PCIe", 2, Some(true));
        assert_eq!(
            price_of(&[price("A100-80G-PCIe", json!("1.35"))], &f),
            Some(2.7)
        );
        assert_eq!(
            price_of(
                &[
                    price("A100-80G-PCIe", json!(1.35)),
                    price("n3-A100x2", json!(2.5))
                ],
                &f
            ),
            Some(2.5)
        );
        assert_eq!(price_of(&[price("A100-80G-PCIe", json!(null))], &f), None);
    }

    fn vm(status: &str, power: Option<&str>, ip: Option<&str>, fip: Option<&str>) -> Vm {
        Vm {
            id: Some(7),
            name: "gpuprov-a-0f0e0d0c".into(),
            status: status.into(),
            power_state: power.map(str::to_string),
            floating_ip: ip.map(str::to_string),
            floating_ip_status: fip.map(str::to_string),
            environment: None,
            labels: vec![],
        }
    }

    #[test]
    fn ready_only_when_active_with_the_floating_ip_attached() {
        let s = |v: &Vm| status_of(v).map(|(s, e)| (s, e.is_some()));
        assert_eq!(
            s(&vm(
                "ACTIVE",
                Some("RUNNING"),
                Some("127.0.0.9"),
                Some("ATTACHED")
            )),
            Some((InstanceStatus::Running, true))
        );
        assert_eq!(
            s(&vm(
                "ACTIVE",
                Some("RUNNING"),
                Some("127.0.0.9"),
                Some("ATTACHING")
            )),
            Some((InstanceStatus::Pending, false))
        );
        assert_eq!(
            s(&vm("ACTIVE", Some("RUNNING"), None, Some("ATTACHED"))),
            Some((InstanceStatus::Pending, false))
        );
        assert_eq!(
            s(&vm(
                "ACTIVE",
                Some("SHUTDOWN"),
                Some("127.0.0.9"),
                Some("ATTACHED")
            )),
            Some((InstanceStatus::Pending, false))
        );
        assert_eq!(
            s(&vm("CREATING", None, None, None)),
            Some((InstanceStatus::Pending, false))
        );
        assert_eq!(
            s(&vm("BUILD", None, None, None)),
            Some((InstanceStatus::Pending, false))
        );
        assert_eq!(
            s(&vm("SHUTOFF", None, None, None)),
            Some((InstanceStatus::Stopped, false))
        );
        assert_eq!(
            s(&vm("DELETING", None, None, None)),
            Some((InstanceStatus::Terminating, false))
        );
        assert_eq!(
            s(&vm("ERROR", None, None, None)),
            Some((InstanceStatus::Failed("ERROR".into()), false))
        );
        assert_eq!(s(&vm("DELETED", None, None, None)), None);
        let (_, ssh) = status_of(&vm("ACTIVE", None, Some("127.0.0.9"), Some("ATTACHED"))).unwrap();
        let ssh = ssh.unwrap();
        assert_eq!((ssh.port, ssh.user.as_deref()), (22, Some("ubuntu")));
    }

    #[test]
    fn ownership_needs_name_environment_and_labels() {
        let lin = "0f0e0d0c-1111";
        let env = HyperstackProvider::environment_name(lin, "CANADA-1");
        assert_eq!(env, "gpuprov-0f0e0d0c-canada-1");
        let mut v = vm("ACTIVE", None, None, None);
        v.environment = Some(VmEnvironment {
            name: env.clone(),
            region: Some("CANADA-1".into()),
        });
        assert!(is_ours(&v, &env, "CANADA-1", "a", lin));
        assert!(!is_ours(&v, &env, "CANADA-10", "a", lin));
        assert!(!is_ours(&v, &env, "CANADA-1", "ab", lin));
        v.labels = vec![label(IDENTITY_LABEL, "a"), label(LINEAGE_LABEL, "zzz")];
        assert!(!is_ours(&v, &env, "CANADA-1", "a", lin));
        v.labels = vec![label(IDENTITY_LABEL, "a"), label(LINEAGE_LABEL, lin)];
        assert!(is_ours(&v, &env, "CANADA-1", "a", lin));
        v.environment = None;
        assert!(is_ours(&v, &env, "CANADA-1", "a", lin), "labels prove it");
        v.labels.clear();
        assert!(
            !is_ours(&v, &env, "CANADA-1", "a", lin),
            "nothing proves it"
        );
        v.environment = Some(VmEnvironment {
            name: "someone-else".into(),
            region: Some("CANADA-1".into()),
        });
        assert!(!is_ours(&v, &env, "CANADA-1", "a", lin));
    }

    #[test]
    fn rules_open_22_and_the_ports_once() {
        let r = security_rules(&[8080, 22]);
        let ports: Vec<Value> = r.iter().map(|r| r["port_range_min"].clone()).collect();
        assert_eq!(ports, [json!(22), json!(8080)]);
        assert_eq!(r[0]["direction"], "ingress");
        assert_eq!(r[0]["protocol"], "tcp");
    }

    #[test]
    fn the_default_image_is_the_newest_ubuntu_cuda_of_the_region() {
        let list = ImageList {
            images: vec![ImageGroup {
                region_name: Some("CANADA-1".into()),
                images: vec![
                    Image {
                        name: "Ubuntu Server 22.04 LTS".into(),
                        region_name: None,
                    },
                    Image {
                        name: "Ubuntu Server 22.04 LTS R535 CUDA 12.2".into(),
                        region_name: None,
                    },
                    Image {
                        name: "Ubuntu Server 24.04 LTS R570 CUDA 12.8".into(),
                        region_name: None,
                    },
                    Image {
                        name: "Windows Server 2022".into(),
                        region_name: None,
                    },
                ],
            }],
        };
        assert_eq!(
            default_image(&list, "CANADA-1").as_deref(),
            Some("Ubuntu Server 24.04 LTS R570 CUDA 12.8")
        );
        assert_eq!(default_image(&list, "NORWAY-1"), None);
    }

    #[test]
    fn keys_compare_by_value() {
        assert_eq!(
            key_value("ssh-ed25519 AAAAx me@laptop\n"),
            key_value("ssh-ed25519 AAAAx gpuprov")
        );
    }

    #[test]
    fn api_key_debug_is_redacted() {
        let s = HyperstackSettings {
            api_key: Some(ApiKey::new("secret_sentinel")),
            ..HyperstackSettings::from_env_and_config(None, Lineage::random())
        };
        assert!(!format!("{s:?}").contains("secret_sentinel"));
    }
}
