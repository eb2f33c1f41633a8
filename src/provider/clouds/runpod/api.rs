//! RunPod REST v2 payloads (spec `components.schemas`), only the fields gpuprov reads.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::{ENV_DATA_CENTER, ENV_LINEAGE, ENV_VM_NAME, SSH_USER};
use crate::provider::{InstanceStatus, Naming, Seen, Shown, SshEndpoint};

#[derive(Debug, Clone, Deserialize)]
pub(super) struct GpuList {
    pub(super) gpus: Vec<GpuType>,
}

#[derive(Debug, Clone, Deserialize)]
pub(super) struct GpuType {
    pub(super) id: String,
    pub(super) name: String,
    #[serde(default)]
    pub(super) secure: bool,
    #[serde(default)]
    pub(super) community: bool,
    pub(super) price: PerTier<f64>,
    #[serde(rename = "maxCount")]
    pub(super) max_count: PerTier<u32>,
    #[serde(default, rename = "dataCenters")]
    pub(super) data_centers: Vec<DataCenterStock>,
}

#[derive(Debug, Clone, Deserialize)]
pub(super) struct PerTier<T> {
    pub(super) secure: T,
    pub(super) community: T,
}

#[derive(Debug, Clone, Deserialize)]
pub(super) struct DataCenterStock {
    pub(super) id: String,
    pub(super) availability: String,
}

impl GpuType {
    pub(super) fn in_tier(&self, t: Tier) -> bool {
        match t {
            Tier::Secure => self.secure,
            Tier::Community => self.community,
        }
    }
    pub(super) fn price(&self, t: Tier) -> f64 {
        match t {
            Tier::Secure => self.price.secure,
            Tier::Community => self.price.community,
        }
    }
    pub(super) fn max_count(&self, t: Tier) -> u32 {
        match t {
            Tier::Secure => self.max_count.secure,
            Tier::Community => self.max_count.community,
        }
    }
    /// The data centres with stock (`availability` other than `NONE`).
    pub(super) fn stocked(&self) -> impl Iterator<Item = &DataCenterStock> {
        self.data_centers
            .iter()
            .filter(|d| d.availability != "NONE")
    }
}

#[derive(Debug, Clone, Deserialize)]
pub(super) struct SshKeys {
    pub(super) keys: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub(super) struct PodList {
    pub(super) pods: Vec<Pod>,
}

#[derive(Debug, Clone, Deserialize)]
pub(super) struct Pod {
    pub(super) id: String,
    #[serde(default)]
    pub(super) name: String,
    pub(super) status: String,
    #[serde(default)]
    pub(super) env: Option<BTreeMap<String, Value>>,
    #[serde(default, rename = "dataCenterId")]
    pub(super) data_center_id: Option<String>,
    #[serde(default)]
    pub(super) ssh: Option<PodSsh>,
    #[serde(default)]
    pub(super) runtime: Option<PodRuntime>,
    /// `gpu`: present for GPU pods.
    #[serde(default)]
    pub(super) gpu: Option<PodGpu>,
    /// `cost`: USD per hour (0.0 when `EXITED`).
    #[serde(default)]
    pub(super) cost: Option<f64>,
    /// `createdAt` (date-time), read leniently.
    #[serde(default, rename = "createdAt")]
    pub(super) created_at: Option<String>,
}

/// `GpuConfig` of a pod: the GPU type id (the offers' instance type).
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(default)]
pub(super) struct PodGpu {
    pub(super) id: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub(super) struct PodSsh {
    #[serde(default)]
    direct: Option<PodSshEndpoint>,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(default)]
pub(super) struct PodSshEndpoint {
    host: String,
    port: i64,
    username: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub(super) struct PodRuntime {
    #[serde(default)]
    ports: Option<Vec<RuntimePort>>,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(default)]
pub(super) struct RuntimePort {
    private: Option<i64>,
    public: Option<i64>,
    #[serde(rename = "type")]
    kind: Option<String>,
    ip: Option<String>,
}

impl Pod {
    pub(super) fn env(&self, key: &str) -> Option<&str> {
        self.env.as_ref()?.get(key)?.as_str()
    }
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

/// A path segment percent-encoded (GPU type ids hold spaces: `NVIDIA H100 80GB HBM3`).
pub(super) fn encode_segment(s: &str) -> String {
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
pub(super) fn status_of(s: &str) -> Option<InstanceStatus> {
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
pub(super) fn ssh_endpoint(p: &Pod) -> Option<SshEndpoint> {
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

/// A listed pod as the contract's listing shows it, when it runs at data centre `region`
/// (`dataCenterId`, else the one asked for at create, `GPUPROV_DATA_CENTER`; ids compare
/// whole, ignoring case: `US-KS-2` ≠ `US-KS-20`) or has neither (seen everywhere rather
/// than missed: a missed pod would be created twice), and is not `TERMINATED`. The
/// identity is the env `GPUPROV_VM_NAME` and `GPUPROV_LINEAGE` (pods have no tags), and
/// the name `gpuprov-<vm>-<lineage8>`; type = the GPU type id, price = `cost`, with the
/// direct SSH endpoint once `22/tcp` is mapped (none before: the core keeps waiting).
pub(super) fn seen_at(p: &Pod, region: &str) -> Option<Seen> {
    let dc = p
        .data_center_id
        .as_deref()
        .filter(|d| !d.is_empty())
        .or_else(|| p.env(ENV_DATA_CENTER));
    if dc.is_some_and(|d| !d.eq_ignore_ascii_case(region)) {
        return None;
    }
    let name = Some(p.name.as_str()).filter(|n| !n.is_empty());
    let identity =
        Shown::labels(p.env(ENV_VM_NAME), p.env(ENV_LINEAGE)).named(name, Naming::Object);
    Some(Seen {
        ssh: ssh_endpoint(p),
        instance_type: p.gpu.as_ref().and_then(|g| g.id.clone()),
        price_per_hour: p.cost,
        created_at: p.created_at.as_deref().and_then(|t| t.parse().ok()),
        ..Seen::new(p.id.clone(), status_of(&p.status)?, identity)
    })
}
