//! Lambda's wire types (OpenAPI 1.8.3 schemas), only the fields gpuprov reads.

use serde::Deserialize;

/// An entry of `GET /api/v1/instance-types` (`InstanceTypesItem`).
#[derive(Debug, Clone, Deserialize)]
pub(super) struct TypesItem {
    pub instance_type: InstanceType,
    #[serde(default)]
    pub regions_with_capacity_available: Vec<Region>,
}

/// `InstanceType`.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct InstanceType {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub gpu_description: String,
    pub price_cents_per_hour: i64,
    pub specs: Specs,
}

/// `InstanceTypeSpecs`.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Specs {
    #[serde(default)]
    pub gpus: u32,
    #[serde(default)]
    pub vcpus: Option<u32>,
    /// GiB.
    #[serde(default)]
    pub memory_gib: Option<f64>,
    /// GiB.
    #[serde(default)]
    pub storage_gib: Option<u32>,
}

/// `Region`.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Region {
    pub name: String,
}

/// `SSHKey`.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct SshKey {
    #[serde(default)]
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub public_key: String,
}

/// `FirewallRuleset`.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Ruleset {
    pub id: String,
    pub name: String,
    pub region: Region,
}

/// `TagEntry`.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Tag {
    pub key: String,
    pub value: String,
}

/// `Instance`.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Instance {
    pub id: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub ip: Option<String>,
    pub status: String,
    #[serde(default)]
    pub region: Option<Region>,
    #[serde(default)]
    pub tags: Option<Vec<Tag>>,
    /// `instance_type` (required by the spec; read leniently: only the name and price).
    #[serde(default)]
    pub instance_type: Option<TypeRef>,
}

/// The part of an instance's `InstanceType` that `list` reports.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct TypeRef {
    pub name: String,
    #[serde(default)]
    pub price_cents_per_hour: Option<i64>,
}

/// `InstanceLaunchResponse`.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct LaunchResponse {
    pub instance_ids: Vec<String>,
}
