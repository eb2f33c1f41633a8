//! Compute Engine v1 payloads (the fields gpuprov reads, as the discovery document names
//! them) and the pure functions over them: names, labels, filters, the insert and
//! firewall bodies, status and readiness.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Value};
use sha2::Digest as _;

use super::catalog::MachineType;
use super::errors::OperationError;
use super::{SSH_PORT, SSH_USER};
use crate::provider::{
    InstanceStatus, Lineage, Seen, Shown, SshEndpoint, IDENTITY_LABEL, LINEAGE_LABEL,
};

/// `Operation` (a long-running operation: insert, delete, start).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Operation {
    pub name: String,
    /// `PENDING`, `RUNNING` or `DONE`.
    pub status: String,
    pub operation_type: String,
    pub target_link: String,
    pub error: Option<OperationError>,
    pub http_error_status_code: Option<i64>,
}

impl Operation {
    /// Whether the operation has ended (`DONE`), well or badly.
    pub fn is_done(&self) -> bool {
        self.status == "DONE"
    }

    /// The last path segment of `targetLink` (the instance an insert is about).
    pub fn target_name(&self) -> &str {
        self.target_link.rsplit('/').next().unwrap_or_default()
    }

    /// The error of an operation that ended badly (`DONE` with `error.errors`).
    pub fn failure(&self) -> Option<&OperationError> {
        self.error
            .as_ref()
            .filter(|e| self.is_done() && !e.errors.is_empty())
    }
}

/// A page of a zonal list (`InstanceList`, `OperationList`): `items`, `nextPageToken`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Page<T> {
    #[serde(default = "Vec::new")]
    pub items: Vec<T>,
    #[serde(default)]
    pub next_page_token: Option<String>,
}

/// A page of an aggregated list (`InstanceAggregatedList`,
/// `AcceleratorTypeAggregatedList`): `items` maps a scope (`zones/us-central1-a`) to its
/// scoped list, whose field `field` holds the items.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AggregatedPage {
    pub items: BTreeMap<String, Value>,
    pub next_page_token: Option<String>,
}

impl AggregatedPage {
    /// `(zone, item)` for every item under `field` of a `zones/<zone>` scope.
    pub fn zonal<'a>(&'a self, field: &'a str) -> impl Iterator<Item = (&'a str, &'a Value)> + 'a {
        self.items.iter().flat_map(move |(scope, list)| {
            let zone = scope.strip_prefix("zones/");
            list[field]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(move |v| zone.map(|z| (z, v)))
        })
    }
}

/// `Instance` (name, status, labels, the external address, what tells a preempted spot
/// VM: `scheduling`, `statusMessage`; and what `list` shows: the machine type URL, the
/// attached accelerators, `creationTimestamp`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Instance {
    pub name: String,
    pub status: String,
    pub labels: BTreeMap<String, String>,
    pub network_interfaces: Vec<NetworkInterface>,
    pub scheduling: Scheduling,
    pub status_message: Option<String>,
    pub machine_type: String,
    pub guest_accelerators: Vec<AcceleratorConfig>,
    pub creation_timestamp: Option<String>,
}

/// `AcceleratorConfig`: an N1 host's attached GPUs (`acceleratorType` is a URL).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AcceleratorConfig {
    pub accelerator_type: String,
}

/// `Scheduling`: whether the VM is preemptible (`preemptible`, the older model) or spot
/// (`provisioningModel: SPOT`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Scheduling {
    pub preemptible: Option<bool>,
    pub provisioning_model: Option<String>,
}

impl Scheduling {
    /// Whether Compute Engine may preempt the VM.
    pub fn is_spot(&self) -> bool {
        self.preemptible == Some(true) || self.provisioning_model.as_deref() == Some("SPOT")
    }
}

/// `NetworkInterface` (its access configs carry the external address).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct NetworkInterface {
    pub access_configs: Vec<AccessConfig>,
}

/// `AccessConfig`: `natIP` is the external IPv4 address.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct AccessConfig {
    #[serde(rename = "natIP")]
    pub nat_ip: Option<String>,
}

/// `Image`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Image {
    pub self_link: String,
    pub name: String,
    pub status: String,
}

/// `Firewall` (the fields gpuprov compares).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Firewall {
    pub name: String,
    pub allowed: Vec<Allowed>,
    pub target_tags: Vec<String>,
    pub source_ranges: Vec<String>,
}

/// One `Firewall.allowed` entry: a protocol and its ports.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Allowed {
    #[serde(rename = "IPProtocol")]
    pub ip_protocol: String,
    pub ports: Vec<String>,
}

/// The prefix of every instance name of VM `vm` in `lineage`: `gpuprov-<vm>-<lineage8>-`.
pub fn name_prefix(vm: &str, lineage: &Lineage) -> String {
    format!("gpuprov-{vm}-{}-", lineage.short())
}

/// The instance name of one create attempt: [`name_prefix`] plus 4 hex digits of the
/// SHA-256 of the attempt's client token, at most 62 characters for a 40-character VM
/// name (instance names: `[a-z]([-a-z0-9]{0,61}[a-z0-9])?`, discovery `Instance.name`).
/// Each attempt has its own name, so an attempt never collides with an earlier one's
/// instance that is still being deleted in the same zone.
pub fn instance_name(vm: &str, lineage: &Lineage, client_token: &str) -> String {
    let d = sha2::Sha256::digest(client_token.as_bytes());
    format!("{}{:02x}{:02x}", name_prefix(vm, lineage), d[0], d[1])
}

/// Whether `name` is an instance name [`instance_name`] makes for `vm` in `lineage`
/// (exactly the prefix and 4 hex digits, so VM `a` never claims VM `a-b`'s instances).
pub fn is_instance_name(name: &str, vm: &str, lineage: &Lineage) -> bool {
    name.strip_prefix(&name_prefix(vm, lineage))
        .is_some_and(|rest| rest.len() == 4 && rest.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The VM whose [`instance_name`] `name` is in `lineage` (the inverse of
/// [`is_instance_name`]); `None` for any other name.
pub fn vm_of_instance_name<'a>(name: &'a str, lineage: &Lineage) -> Option<&'a str> {
    let rest = name.strip_prefix("gpuprov-")?;
    let (head, hex) = rest.split_at_checked(rest.len().checked_sub(4)?)?;
    let vm = head.strip_suffix(&format!("-{}-", lineage.short()))?;
    (!vm.is_empty() && is_instance_name(name, vm, lineage) && hex.len() == 4).then_some(vm)
}

/// The API path of the image `image` names: a family (`projects/P/global/images/family/F`,
/// or `P/F`) for `images.getFromFamily`, an image (`projects/P/global/images/NAME`) for
/// `images.get`, with or without the API's URL before it; `None` for any other form.
pub fn image_path(image: &str) -> Option<String> {
    let path = image
        .strip_prefix("https://www.googleapis.com/compute/v1/")
        .or_else(|| image.strip_prefix("https://compute.googleapis.com/compute/v1/"))
        .unwrap_or(image)
        .trim_start_matches('/');
    let parts: Vec<&str> = path.split('/').collect();
    match parts.as_slice() {
        ["projects", p, "global", "images", "family", f] => {
            Some(format!("/projects/{p}/global/images/family/{f}"))
        }
        ["projects", p, "global", "images", name] => {
            Some(format!("/projects/{p}/global/images/{name}"))
        }
        [p, f] if !p.is_empty() && !f.is_empty() => {
            Some(format!("/projects/{p}/global/images/family/{f}"))
        }
        _ => None,
    }
}

/// The per-VM firewall rule and network tag: `gpuprov-<vm>-<lineage8>` (at most 57
/// characters; firewall names and tags share the instance name syntax).
pub fn firewall_name(vm: &str, lineage: &Lineage) -> String {
    crate::provider::object_name(vm, lineage)
}

/// The `requestId` of an insert: a UUID made of the first 16 bytes of the SHA-256 of the
/// attempt's client token (laid out as version 4), so the same attempt always sends the
/// same id and GCP answers a resent insert with the first one's operation (discovery:
/// `instances.insert` `requestId` "must be a valid UUID").
pub fn request_id(client_token: &str) -> String {
    let d = sha2::Sha256::digest(client_token.as_bytes());
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[..16]);
    uuid::Builder::from_random_bytes(b).into_uuid().to_string()
}

/// The labels of every object: `gpuprov-vm-name` (a VM name `[a-z][a-z0-9-]{0,39}` is a
/// valid label value as it is) and `gpuprov-lineage` (a lowercase UUID). Label values
/// are `[a-z0-9_-]{0,63}` (Compute Engine "Labels"), so both are carried unchanged and
/// read back exactly.
pub fn labels(vm: &str, lineage: &Lineage) -> Value {
    json!({ IDENTITY_LABEL: vm, LINEAGE_LABEL: lineage.as_str().to_lowercase() })
}

/// The list `filter` selecting VM `vm` of `lineage` by its labels (Compute Engine list
/// filters: parenthesised expressions are ANDed; nested fields such as `labels.KEY`).
pub fn label_filter(vm: &str, lineage: &Lineage) -> String {
    format!(
        "(labels.{IDENTITY_LABEL} = \"{vm}\") (labels.{LINEAGE_LABEL} = \"{}\")",
        lineage.as_str().to_lowercase()
    )
}

/// A listed instance as the contract's listing shows it: its identity labels (GCP's
/// identity is its labels: every insert carries them and GCP imports nothing, so the
/// name is not shown to the rule, and the label-filtered `observe` and the location's
/// whole listing agree), status and endpoint ([`status_of`]), the instance type as an
/// offer names it (the machine type, `+<accelerator>` for an N1 host), the catalog's
/// list price for it (spot or on demand) and `creationTimestamp`.
pub fn seen(i: &Instance) -> Seen {
    let label = |k: &str| i.labels.get(k).map(String::as_str);
    let (status, ssh) = status_of(i);
    let last = |url: &str| url.rsplit('/').next().unwrap_or_default().to_string();
    let mut instance_type = last(&i.machine_type);
    if let Some(a) = i.guest_accelerators.first() {
        instance_type = format!("{instance_type}+{}", last(&a.accelerator_type));
    }
    let price = super::catalog::of_instance_type(&instance_type).map(|t| {
        if i.scheduling.is_spot() {
            t.spot
        } else {
            t.on_demand
        }
    });
    Seen {
        ssh,
        instance_type: (!i.machine_type.is_empty()).then_some(instance_type),
        price_per_hour: price,
        created_at: i
            .creation_timestamp
            .as_deref()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&chrono::Utc)),
        ..Seen::new(
            i.name.clone(),
            status,
            Shown::labels(label(IDENTITY_LABEL), label(LINEAGE_LABEL)),
        )
    }
}

/// The `filter` of the zone operations that are inserts.
pub const INSERT_OPERATIONS: &str = "operationType = \"insert\"";

/// Normalised status and, once it runs with an external address, the SSH endpoint
/// (discovery `Instance.status`; a stopped VM is `TERMINATED`, "Instance life cycle").
pub fn status_of(i: &Instance) -> (InstanceStatus, Option<SshEndpoint>) {
    let s = match i.status.as_str() {
        "RUNNING" => {
            let ip = i
                .network_interfaces
                .iter()
                .flat_map(|n| &n.access_configs)
                .find_map(|a| a.nat_ip.as_deref().map(str::trim).filter(|s| !s.is_empty()));
            return match ip {
                Some(ip) => (
                    InstanceStatus::Running,
                    Some(SshEndpoint {
                        host: ip.to_string(),
                        port: SSH_PORT,
                        user: Some(SSH_USER.to_string()),
                    }),
                ),
                None => (InstanceStatus::Pending, None),
            };
        }
        "PROVISIONING" | "STAGING" | "PENDING" | "REPAIRING" => InstanceStatus::Pending,
        "STOPPING" | "SUSPENDING" | "PENDING_STOP" | "DEPROVISIONING" => InstanceStatus::Stopping,
        // A stopped spot or preemptible VM: Compute Engine stops it when it preempts it
        // (`instanceTerminationAction: STOP`; gpuprov's own spot VMs are deleted instead).
        // The instance resource does not say who stopped it (only the
        // `compute.instances.preempted` operation does), so a stopped spot VM counts as
        // preempted: apply replaces it, trying other offers first.
        "TERMINATED" | "STOPPED" if i.scheduling.is_spot() => InstanceStatus::Preempted {
            signal: match i.status_message.as_deref().map(str::trim) {
                Some(m) if !m.is_empty() => format!("spot VM {}: {m}", i.status),
                _ => format!("spot VM {}", i.status),
            },
            stopped: true,
        },
        "TERMINATED" | "STOPPED" | "SUSPENDED" => InstanceStatus::Stopped,
        other => InstanceStatus::Failed(format!("unknown Compute Engine status `{other}`")),
    };
    (s, None)
}

/// The TCP ports as firewall `ports` strings: 22 and `ports`, ascending.
pub fn port_strings(ports: &[u16]) -> Vec<String> {
    crate::provider::kit::ports::with_ssh(ports)
        .iter()
        .map(u16::to_string)
        .collect()
}

/// The firewall rule of VM `vm`: TCP 22 and `ports` from anywhere to instances carrying
/// its network tag, on the project's `default` network. Firewalls carry no labels in
/// Compute v1 (discovery `Firewall` has none): the name and the description say whose it
/// is.
pub fn firewall_body(
    project: &str,
    name: &str,
    vm: &str,
    lineage: &Lineage,
    ports: &[u16],
) -> Value {
    json!({
        "name": name,
        "description": format!("gpuprov VM {vm} (lineage {lineage}): SSH and its ports"),
        "network": format!("projects/{project}/global/networks/default"),
        "direction": "INGRESS",
        "priority": 1000,
        "allowed": [{"IPProtocol": "tcp", "ports": port_strings(ports)}],
        "sourceRanges": ["0.0.0.0/0"],
        "targetTags": [name],
    })
}

/// Whether firewall `f` already opens exactly what VM `vm` needs.
pub fn firewall_matches(f: &Firewall, tag: &str, ports: &[u16]) -> bool {
    f.allowed
        == [Allowed {
            ip_protocol: "tcp".into(),
            ports: port_strings(ports),
        }]
        && f.target_tags == [tag]
        && f.source_ranges == ["0.0.0.0/0"]
}

/// What an insert needs beside the machine type.
pub struct InsertArgs<'a> {
    pub name: &'a str,
    pub zone: &'a str,
    pub vm: &'a str,
    pub lineage: &'a Lineage,
    pub image: &'a str,
    pub network_tag: &'a str,
    pub disk_gb: Option<u32>,
    pub spot: bool,
    pub ssh_public_key: &'a str,
    pub user_data: Option<String>,
}

/// The default boot disk size, GiB: room for a CUDA image and a model or two.
pub const DEFAULT_DISK_GB: u32 = 200;

/// The `Instance` body of an insert (Compute Engine "Create a VM with attached GPUs"):
/// the machine type; guest accelerators for N1 hosts; `onHostMaintenance: TERMINATE` (GPU
/// VMs cannot live-migrate); spot as `provisioningModel: SPOT` deleted on preemption
/// (nothing is left to bill), else restarted automatically; the boot disk from `image`
/// (`disk_gb`, default [`DEFAULT_DISK_GB`]); one interface on the `default` network with
/// an external address (gVNIC where the series needs it); the network tag of its
/// firewall; the identity labels on the VM and its disk; metadata `ssh-keys`
/// (`gpuprov:<key>`), `enable-oslogin=FALSE` (so the key is honoured where the project
/// turned OS Login on) and the cloud-init `user-data`.
pub fn insert_body(t: &MachineType, a: &InsertArgs<'_>) -> Value {
    let labels = labels(a.vm, a.lineage);
    let mut metadata = vec![
        json!({"key": "ssh-keys", "value": format!("{SSH_USER}:{}", a.ssh_public_key.trim())}),
        json!({"key": "enable-oslogin", "value": "FALSE"}),
    ];
    if let Some(u) = &a.user_data {
        metadata.push(json!({"key": "user-data", "value": u}));
    }
    let mut nic = json!({
        "network": "global/networks/default",
        "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}],
    });
    if t.gvnic {
        nic["nicType"] = json!("GVNIC");
    }
    let mut scheduling = json!({"onHostMaintenance": "TERMINATE"});
    if a.spot {
        scheduling["provisioningModel"] = json!("SPOT");
        scheduling["instanceTerminationAction"] = json!("DELETE");
        scheduling["automaticRestart"] = json!(false);
    } else {
        scheduling["provisioningModel"] = json!("STANDARD");
        scheduling["automaticRestart"] = json!(true);
    }
    let mut body = json!({
        "name": a.name,
        "description": format!("gpuprov VM {}", a.vm),
        "machineType": format!("zones/{}/machineTypes/{}", a.zone, t.name),
        "labels": labels,
        "tags": {"items": [a.network_tag]},
        "scheduling": scheduling,
        "disks": [{
            "boot": true,
            "autoDelete": true,
            "type": "PERSISTENT",
            "initializeParams": {
                "sourceImage": a.image,
                "diskSizeGb": a.disk_gb.unwrap_or(DEFAULT_DISK_GB).to_string(),
                "diskType": format!("zones/{}/diskTypes/{}", a.zone, t.disk.name()),
                "labels": labels,
            },
        }],
        "networkInterfaces": [nic],
        "metadata": {"items": metadata},
    });
    if t.attached {
        body["guestAccelerators"] = json!([{
            "acceleratorType": format!("zones/{}/acceleratorTypes/{}", a.zone, t.accelerator),
            "acceleratorCount": t.gpus,
        }]);
    }
    body
}
