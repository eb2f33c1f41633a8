//! DigitalOcean's wire types (schemas of the API description), only the fields gpuprov
//! reads.

use serde::Deserialize;

/// A droplet size (spec `size`).
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Size {
    pub slug: String,
    /// MiB.
    #[serde(default)]
    pub memory: u64,
    #[serde(default)]
    pub vcpus: u32,
    /// GB.
    #[serde(default)]
    pub disk: u32,
    /// USD per hour.
    pub price_hourly: f64,
    #[serde(default)]
    pub regions: Vec<String>,
    #[serde(default = "yes")]
    pub available: bool,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub gpu_info: Option<GpuInfo>,
}

fn yes() -> bool {
    true
}

/// Spec `gpu_info`.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct GpuInfo {
    #[serde(default)]
    pub count: u32,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub vram: Option<Vram>,
}

#[derive(Debug, Clone, Deserialize)]
pub(super) struct Vram {
    #[serde(default)]
    pub amount: u32,
    #[serde(default)]
    pub unit: String,
}

/// Spec `region`.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Region {
    pub slug: String,
    #[serde(default)]
    pub available: bool,
}

/// Spec `sshKeys`.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct SshKey {
    pub id: i64,
    #[serde(default)]
    pub public_key: String,
    #[serde(default)]
    pub name: String,
}

/// Spec `firewall`.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Firewall {
    pub id: String,
    #[serde(default)]
    pub name: String,
}

/// Spec `action`.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Action {
    #[serde(default, rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub status: String,
}

/// Spec `droplet`.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Droplet {
    pub id: i64,
    pub status: String,
    /// `name`: `gpuprov-<vm>-<lineage8>` for the droplets gpuprov creates.
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub networks: Networks,
    #[serde(default)]
    pub region: Option<DropletRegion>,
    #[serde(default)]
    pub tags: Vec<String>,
    /// `size_slug`: the droplet's size (its instance type).
    #[serde(default)]
    pub size_slug: Option<String>,
    /// `created_at` (RFC 3339).
    #[serde(default)]
    pub created_at: Option<chrono::DateTime<chrono::Utc>>,
    /// `size.price_hourly` (USD per hour).
    #[serde(default)]
    pub size: Option<DropletSize>,
}

/// The part of a droplet's `size` the listing reports.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct DropletSize {
    #[serde(default)]
    pub price_hourly: Option<f64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub(super) struct Networks {
    #[serde(default)]
    pub v4: Vec<NetworkV4>,
}

#[derive(Debug, Clone, Deserialize)]
pub(super) struct NetworkV4 {
    #[serde(default)]
    pub ip_address: String,
    #[serde(default, rename = "type")]
    pub kind: String,
}

#[derive(Debug, Clone, Deserialize)]
pub(super) struct DropletRegion {
    pub slug: String,
}
