//! Verda's wire types (`verda/verda-from-sdk.openapi.yaml`, derived from the vendor's
//! Python SDK `verda` 1.25.0), only the fields gpuprov reads. Numbers the SDKs read through
//! `float()` or a "FlexibleFloat" (prices) may be numbers or numeric strings.

use serde::{Deserialize, Deserializer};

/// A price: a JSON number or a numeric string (`InstanceType.price_per_hour`,
/// `spot_price`); `None` when neither.
fn flexible<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    Ok(match v {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    })
}

/// `InstanceType` (`GET /instance-types?currency=usd`).
#[derive(Debug, Clone, Deserialize, Default)]
pub(super) struct InstanceType {
    pub instance_type: String,
    /// USD (the currency asked for) per hour for the whole instance.
    #[serde(default, deserialize_with = "flexible")]
    pub price_per_hour: Option<f64>,
    #[serde(default, deserialize_with = "flexible")]
    pub spot_price: Option<f64>,
    #[serde(default)]
    pub gpu: Gpu,
    #[serde(default)]
    pub cpu: Cpu,
    /// `SizeSpec`: `size_in_gigabytes`.
    #[serde(default)]
    pub memory: Size,
    /// The GPU model (`V100`, `H100`).
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub currency: String,
}

/// `InstanceType.cpu`.
#[derive(Debug, Clone, Deserialize, Default)]
pub(super) struct Cpu {
    #[serde(default)]
    pub number_of_cores: Option<u32>,
}

/// `SizeSpec`.
#[derive(Debug, Clone, Deserialize, Default)]
pub(super) struct Size {
    #[serde(default)]
    pub size_in_gigabytes: Option<f64>,
}

/// `InstanceType.gpu`.
#[derive(Debug, Clone, Deserialize, Default)]
pub(super) struct Gpu {
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub number_of_gpus: u32,
}

/// `LocationAvailability` (`GET /instance-availability`).
#[derive(Debug, Clone, Deserialize)]
pub(super) struct LocationAvailability {
    pub location_code: String,
    #[serde(default)]
    pub availabilities: Vec<String>,
}

/// `Image` (`GET /images`).
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Image {
    pub id: String,
    #[serde(default)]
    pub image_type: String,
}

/// `SshKey` (`GET /sshkeys`).
#[derive(Debug, Clone, Deserialize)]
pub(super) struct SshKey {
    pub id: String,
    #[serde(default)]
    pub name: String,
    /// The public key text.
    #[serde(default)]
    pub key: String,
}

/// `StartupScript` (`GET /scripts`).
#[derive(Debug, Clone, Deserialize)]
pub(super) struct StartupScript {
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub script: String,
}

/// `Instance` (`GET /instances`).
#[derive(Debug, Clone, Deserialize, Default)]
pub(super) struct Instance {
    pub id: String,
    #[serde(default)]
    pub instance_type: String,
    #[serde(default)]
    pub hostname: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub status: String,
    /// The public IPv4 (the SSH host); null until provisioned.
    #[serde(default)]
    pub ip: Option<String>,
    /// The location code (the SDKs' default `FIN-03` when absent).
    #[serde(default)]
    pub location: Option<String>,
    #[serde(default)]
    pub os_volume_id: Option<String>,
    /// Data volumes (the Go SDK's `volume_ids`).
    #[serde(default)]
    pub volume_ids: Option<Vec<String>>,
    /// `created_at`: ISO 8601 (the Go SDK's `time.Time`); kept as text, read leniently.
    #[serde(default)]
    pub created_at: Option<String>,
}

/// `Volume` (`GET /volumes`).
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Volume {
    pub id: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub location: Option<String>,
    #[serde(default)]
    pub instance_id: Option<String>,
}

/// `InstanceActionResult` (the Go SDK's reading of a 202 / 207 to `PUT /instances`).
#[derive(Debug, Clone, Deserialize)]
pub(super) struct ActionResult {
    #[serde(default, rename = "instanceId")]
    pub instance_id: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default, rename = "statusCode")]
    pub status_code: Option<u16>,
}
