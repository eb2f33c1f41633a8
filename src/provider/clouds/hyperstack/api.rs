//! Infrahub API v1 payloads (only the fields gpuprov reads; the description marks none
//! required) and the pure functions over them: GPU names, prices, stock, offers,
//! readiness, ownership, security rules, the default image.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Value};

use super::{CLOUD, SSH_PORT, SSH_USER};
use crate::provider::kit::gpu::{norm, same_model};
use crate::provider::{
    InstanceStatus, Location, Naming, Offer, ResourceRequest, Seen, Shown, SshEndpoint,
    IDENTITY_LABEL, LINEAGE_LABEL,
};

#[derive(Debug, Clone, Default, Deserialize)]
pub(super) struct FlavorList {
    #[serde(default)]
    pub(super) data: Vec<FlavorGroup>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(super) struct FlavorGroup {
    pub(super) region_name: Option<String>,
    pub(super) flavors: Vec<Flavor>,
}

/// `Flavor_Fields`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(super) struct Flavor {
    pub(super) name: String,
    pub(super) region_name: Option<String>,
    /// vCPUs.
    pub(super) cpu: u32,
    /// RAM, GB.
    pub(super) ram: f64,
    /// Root disk, GB.
    pub(super) disk: u32,
    /// Ephemeral disk, GB.
    pub(super) ephemeral: u32,
    /// GPU model as Hyperstack names it (`H100-80G-PCIe`); empty for CPU flavors.
    pub(super) gpu: String,
    pub(super) gpu_count: u32,
    pub(super) stock_available: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub(super) struct StockList {
    #[serde(default)]
    pub(super) stocks: Vec<Stock>,
}

/// `New_Stock_Response`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(super) struct Stock {
    pub(super) region: String,
    pub(super) models: Vec<StockModel>,
}

/// `New_Model_Response`: `configurations` maps `1x`, `2x`, `4x`, `8x`, `10x` to the number
/// of such VMs that can be created now.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(super) struct StockModel {
    pub(super) model: String,
    pub(super) configurations: BTreeMap<String, Option<i64>>,
}

/// `PricebookModel`: `value` is USD per hour (per GPU for a GPU model's entry).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(super) struct Price {
    pub(super) name: String,
    pub(super) value: Value,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(super) struct Environment {
    /// `Environment_Fields.id` (what `DELETE /core/environments/{id}` takes).
    pub(super) id: Option<i64>,
    pub(super) name: String,
    pub(super) region: String,
}

#[derive(Debug, Clone, Deserialize)]
pub(super) struct EnvironmentResponse {
    pub(super) environment: Environment,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(super) struct Keypair {
    /// `Keypair_Fields.id` (what `DELETE /core/keypair/{id}` takes).
    pub(super) id: Option<i64>,
    pub(super) name: String,
    pub(super) public_key: String,
    pub(super) environment: Option<Environment>,
}

#[derive(Debug, Clone, Deserialize)]
pub(super) struct KeypairResponse {
    pub(super) keypair: Keypair,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(super) struct ImageGroup {
    pub(super) region_name: Option<String>,
    pub(super) images: Vec<Image>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(super) struct Image {
    pub(super) name: String,
    pub(super) region_name: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub(super) struct ImageList {
    #[serde(default)]
    pub(super) images: Vec<ImageGroup>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(super) struct VmEnvironment {
    pub(super) name: String,
    pub(super) region: Option<String>,
}

/// `Instance_Fields`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(super) struct Vm {
    pub(super) id: Option<i64>,
    pub(super) name: String,
    pub(super) status: String,
    pub(super) power_state: Option<String>,
    pub(super) floating_ip: Option<String>,
    pub(super) floating_ip_status: Option<String>,
    pub(super) environment: Option<VmEnvironment>,
    pub(super) labels: Vec<String>,
    /// `flavor.name`: the VM's instance type.
    pub(super) flavor: Option<VmFlavor>,
    /// `created_at` (date-time), read leniently.
    pub(super) created_at: Option<String>,
}

/// The part of `Instance_Flavor_Fields` the listing reports.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(super) struct VmFlavor {
    pub(super) name: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub(super) struct CreateResponse {
    #[serde(default)]
    pub(super) instances: Vec<Vm>,
}

/// The tokens of a GPU name: split on `-`, `_`, space; uppercase; `80GB` reads as `80G`.
pub(super) fn gpu_tokens(s: &str) -> Vec<String> {
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

/// A `PricebookModel.value` as a number (the description says number; tolerate a numeric
/// string).
pub(super) fn price_value(v: &Value) -> Option<f64> {
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
pub(super) fn price_of(prices: &[Price], flavor: &Flavor) -> Option<f64> {
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
        .find(|p| same_model(&p.name, &flavor.gpu))
        .and_then(|p| price_value(&p.value))
        .map(|per_gpu| (per_gpu * flavor.gpu_count as f64 * 10_000.0).round() / 10_000.0)
}

/// How many VMs of `gpu` × `count` the stock list says can be created in `region` now
/// (exact region name; `configurations["<count>x"]`).
pub(super) fn stock_count(stocks: &[Stock], region: &str, gpu: &str, count: u32) -> i64 {
    let key = format!("{count}x");
    stocks
        .iter()
        .filter(|s| s.region == region)
        .flat_map(|s| &s.models)
        .filter(|m| same_model(&m.model, gpu))
        .filter_map(|m| m.configurations.get(&key).copied().flatten())
        .max()
        .unwrap_or(0)
}

/// The region of a flavor: its own `region_name`, else its group's.
pub(super) fn flavors_with_region(list: &FlavorList) -> Vec<(String, Flavor)> {
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
pub(super) fn in_stock(stocks: &[Stock], region: &str, f: &Flavor) -> bool {
    if f.stock_available == Some(false) {
        return false;
    }
    if f.gpu_count == 0 || f.gpu.is_empty() {
        return f.stock_available == Some(true);
    }
    stock_count(stocks, region, &f.gpu, f.gpu_count) > 0
}

/// Normalised status of a VM and, once it is ready, its SSH endpoint; `None` for a
/// deleted VM (gone). Ready = `status` `ACTIVE`, `power_state` `RUNNING` (when reported)
/// and the floating IP attached (`floating_ip` set, `floating_ip_status` `ATTACHED`).
pub(super) fn status_of(vm: &Vm) -> Option<(InstanceStatus, Option<SshEndpoint>)> {
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

/// The default image of a region: the greatest name among its Ubuntu images with CUDA,
/// else among its Ubuntu images (Hyperstack names them like
/// `Ubuntu Server 22.04 LTS R535 CUDA 12.2`, so the greatest name is the newest).
pub(super) fn default_image(list: &ImageList, region: &str) -> Option<String> {
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

pub(super) fn matches_ask(f: &Flavor, req: &ResourceRequest) -> bool {
    if let Some(want) = &req.gpu {
        if f.gpu_count == 0 || !gpu_matches(want, &f.gpu) {
            return false;
        }
    }
    crate::provider::kit::gpu::count_fits(req, f.gpu_count)
}

/// Offers for the ask, one per region and flavor, in the flavor list's order (the core
/// orders them: [`crate::provider::offers::order`]). Regions match as exact names (`CANADA-1`
/// never matches `CANADA-10`). Flavors without stock or without a price are left out.
pub(super) fn offers_for(
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
        let id = format!("{CLOUD}/{region}/{}", f.name);
        // A region asked twice lists its flavors twice: one offer each.
        if offers.iter().any(|o: &Offer| o.id == id) {
            continue;
        }
        offers.push(Offer {
            id,
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
            // Flavor `cpu`, `ram` (GB) and `disk` + `ephemeral` (GB).
            facts: crate::provider::OfferFacts {
                vcpus: Some(f.cpu).filter(|c| *c > 0),
                memory_gib: Some(f.ram).filter(|r| *r > 0.0),
                disk_gib: Some(f.disk + f.ephemeral).filter(|d| *d > 0),
                ..Default::default()
            },
        });
    }
    offers
}

/// The label a VM carries for `key`: `key=value`.
pub(super) fn label(key: &str, value: &str) -> String {
    format!("{key}={value}")
}

/// The value of a VM's `key=value` label (labels are bare strings on Hyperstack).
fn label_value<'v>(vm: &'v Vm, key: &str) -> Option<&'v str> {
    vm.labels
        .iter()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
}

/// A listed VM as the contract's listing shows it, when it is in environment `env` of
/// `region` (as the list shows its environment; listed without one, the query's exact
/// environment filter holds only when the VM's labels prove it is gpuprov's) and not
/// deleted: its `gpuprov-vm-name=` and `gpuprov-lineage=` labels, its name, flavor and
/// `created_at`, and (see [`status_of`]) its status and SSH endpoint once ready.
pub(super) fn seen_at(vm: &Vm, env: &str, region: &str) -> Option<Seen> {
    match &vm.environment {
        Some(e) if e.name == env && e.region.as_deref().is_none_or(|r| r == region) => {}
        Some(_) => return None,
        None if vm.labels.is_empty() => return None,
        None => {}
    }
    let (status, ssh) = status_of(vm)?;
    let identity = Shown::labels(
        label_value(vm, IDENTITY_LABEL),
        label_value(vm, LINEAGE_LABEL),
    )
    .named(
        Some(vm.name.as_str()).filter(|n| !n.is_empty()),
        Naming::Object,
    );
    Some(Seen {
        ssh,
        instance_type: vm.flavor.as_ref().map(|f| f.name.clone()),
        created_at: vm.created_at.as_deref().and_then(|t| t.parse().ok()),
        ..Seen::new(vm.id?.to_string(), status, identity)
    })
}

/// Ingress rules for TCP 22 and `ports`, from anywhere (`Create_Security_Rule_Payload`).
pub(super) fn security_rules(ports: &[u16]) -> Vec<Value> {
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

/// Why no flavor matches the ask: what was asked and which GPU flavors there are.
pub(super) fn no_flavor(flavors: &[(String, Flavor)], req: &ResourceRequest) -> String {
    let mut have: Vec<String> = flavors
        .iter()
        .filter(|(_, f)| f.gpu_count > 0 && !f.gpu.is_empty())
        .map(|(_, f)| format!("{} x{}", f.gpu, f.gpu_count))
        .collect();
    have.sort();
    have.dedup();
    format!(
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
    )
}
