//! Prime Intellect's wire types (`primeintellect/prime-intellect-compute-api-openapi.fixed.yml`,
//! the FastAPI-generated schemas as patched from the vendor CLI `prime` 0.18.0), only the
//! fields gpuprov reads. `sshConnection` and `ip` keep their raw JSON: the API answers a
//! string, a list (one entry per node, entries possibly null) or null.

use serde::Deserialize;
use serde_json::Value;

/// `AvailabilityResponse` (`GET /api/v1/availability/gpus`).
#[derive(Debug, Clone, Deserialize, Default)]
pub(super) struct Availability {
    #[serde(default)]
    pub items: Vec<GpuAvailability>,
    #[serde(default, rename = "totalCount")]
    pub total_count: Option<u64>,
}

/// `GpuAvailability`: one purchasable configuration.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct GpuAvailability {
    /// The provider's id of the configuration, "used for provisioning".
    pub cloud_id: String,
    /// `GPUType`, for example `H100_80GB`.
    pub gpu_type: String,
    #[serde(default)]
    pub socket: Option<String>,
    /// `ProviderTypeEnum`, for example `hyperstack`.
    #[serde(default)]
    pub provider: Option<String>,
    #[serde(default)]
    pub data_center: Option<String>,
    /// `Regions`, for example `united_states`.
    #[serde(default)]
    pub region: Option<String>,
    /// GPUs of the configuration.
    #[serde(default)]
    pub gpu_count: u32,
    /// `Available`, `Low`, `Medium`, `High` or `Unavailable`.
    #[serde(default)]
    pub stock_status: Option<String>,
    /// `secure_cloud` or `community_cloud`.
    #[serde(default)]
    pub security: Option<String>,
    #[serde(default)]
    pub prices: Prices,
    #[serde(default)]
    pub is_spot: Option<bool>,
    /// vCPUs (`CustomSpecValue`: the default count is what a create without a choice gets).
    #[serde(default)]
    pub vcpu: SpecValue,
    /// RAM, GB.
    #[serde(default)]
    pub memory: SpecValue,
    /// Disk, GB.
    #[serde(default)]
    pub disk: SpecValue,
}

/// `CustomSpecValue`: an adjustable size; gpuprov reads its default.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct SpecValue {
    #[serde(default)]
    pub default_count: Option<u32>,
}

/// `Prices`: hourly prices of the configuration.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct Prices {
    #[serde(default)]
    pub on_demand: Option<f64>,
    #[serde(default)]
    pub community_price: Option<f64>,
    /// `USD` or `EUR`.
    #[serde(default)]
    pub currency: Option<String>,
}

/// `GenericPaginationResponse[List[APISSHKeyConfig]]`.
#[derive(Debug, Clone, Deserialize, Default)]
pub(super) struct SshKeys {
    #[serde(default)]
    pub data: Vec<SshKey>,
    #[serde(default)]
    pub total_count: Option<u64>,
}

/// `APISSHKeyConfig`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SshKey {
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub public_key: String,
}

/// `GenericPaginationResponse[List[APIPodConfig]]`.
#[derive(Debug, Clone, Deserialize, Default)]
pub(super) struct Pods {
    #[serde(default)]
    pub data: Vec<Pod>,
    #[serde(default)]
    pub total_count: Option<u64>,
}

/// `APIPodConfig`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct Pod {
    pub id: String,
    #[serde(default)]
    pub name: String,
    /// `PodStatusEnum` (a free string in the vendor client).
    #[serde(default)]
    pub status: String,
    /// `InstallationStatusEnum`.
    #[serde(default)]
    pub installation_status: Option<String>,
    #[serde(default)]
    pub installation_failure: Option<String>,
    /// `"<user>@<host> -p <port>"`, a list of those (one per node), or null.
    #[serde(default)]
    pub ssh_connection: Value,
    #[serde(default)]
    pub prime_port_mapping: Option<Vec<PortMapping>>,
    /// `priceHr`: USD per hour.
    #[serde(default)]
    pub price_hr: Option<f64>,
    /// `createdAt` (date-time), read leniently.
    #[serde(default)]
    pub created_at: Option<String>,
}

/// `PortMapping`: a pod port and the public port it is reached on.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct PortMapping {
    #[serde(default)]
    pub internal: String,
    #[serde(default)]
    pub external: String,
    #[serde(default)]
    pub protocol: Option<String>,
    /// `SSH`, `JUPYTER_NOTEBOOK` or `WEB_SERVER`.
    #[serde(default)]
    pub used_by: Option<String>,
}
