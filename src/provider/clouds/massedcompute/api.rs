//! Massed Compute's wire types (the vendor's OpenAPI 1.0.0,
//! `massedcompute/openapi-v1.0.0.mock-fixed.yaml`), only the fields gpuprov reads. Every
//! field the description does not require is optional here: the description lists no
//! `required` at all, so an answer without a field is read as "not given", never a panic.
//! The listing's `password` is never read.

use std::collections::BTreeMap;

use serde::Deserialize;

/// `GET /gpu-inventory` (`GPUInventoryV1`): product name → its entry.
#[derive(Debug, Clone, Deserialize, Default)]
pub(super) struct Inventory {
    #[serde(default)]
    pub gpu_inventory: BTreeMap<String, Product>,
}

/// One product of the inventory.
#[derive(Debug, Clone, Deserialize, Default)]
pub(super) struct Product {
    #[serde(default)]
    pub instance_type: InstanceType,
    #[serde(default)]
    pub regions_with_capacity_available: Vec<Region>,
    /// Machines of this product that can be launched now.
    #[serde(default)]
    pub capacity_available: Option<i64>,
}

/// `instance_type` of an inventory entry.
#[derive(Debug, Clone, Deserialize, Default)]
pub(super) struct InstanceType {
    /// For example `1x L40`, `8x H100 SXM5`.
    #[serde(default)]
    pub description: String,
    /// US cents per hour for the whole machine.
    #[serde(default)]
    pub price_cents_per_hour: Option<i64>,
}

/// A region name (`regions_with_capacity_available[]`).
#[derive(Debug, Clone, Deserialize, Default)]
pub(super) struct Region {
    #[serde(default)]
    pub name: String,
}

/// `GET /images` (`ImagesV1`).
#[derive(Debug, Clone, Deserialize, Default)]
pub(super) struct Images {
    #[serde(default)]
    pub images: Vec<Image>,
}

/// One image.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Image {
    pub vm_image_id: i64,
    #[serde(default)]
    pub vm_image_name: String,
}

/// `GET /instance` (`RetrieveAllRunningInstancesV1`).
#[derive(Debug, Clone, Deserialize, Default)]
pub(super) struct Running {
    #[serde(default, rename = "runningInstances")]
    pub running_instances: Vec<Instance>,
}

/// One running instance (`runningInstances[]`), without its `password`.
#[derive(Debug, Clone, Deserialize, Default)]
pub(super) struct Instance {
    #[serde(default)]
    pub uuid: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub ip: Option<String>,
    /// The login user (the description's example: `Ubuntu`).
    #[serde(default)]
    pub username: Option<String>,
    /// A free string: `rented`, `booting`, `terminated` in the description's examples.
    #[serde(default)]
    pub status: Option<String>,
    /// The product rented (its name is the offers' instance type).
    #[serde(default)]
    pub product: Option<InstanceProduct>,
    /// `created` (`2024-08-07T16:41:43.000Z` in the description), read leniently.
    #[serde(default)]
    pub created: Option<String>,
}

/// `runningInstances[].product`, the fields the listing reports.
#[derive(Debug, Clone, Deserialize, Default)]
pub(super) struct InstanceProduct {
    #[serde(default)]
    pub name: Option<String>,
    /// USD per hour: a string in the description (`"0.99"`), read as a number either way.
    #[serde(default)]
    pub price_hr: Option<Price>,
}

/// A price given as a JSON number or a numeric string.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(super) enum Price {
    Number(f64),
    Text(String),
    Other(serde::de::IgnoredAny),
}

impl Price {
    /// The price as a number; `None` when it is not one.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Price::Number(n) => Some(*n),
            Price::Text(s) => s.trim().parse().ok(),
            Price::Other(_) => None,
        }
    }
}

/// `GET /ssh-keys` (`SSHKey`).
#[derive(Debug, Clone, Deserialize, Default)]
pub(super) struct SshKeys {
    #[serde(default, rename = "sshKeys")]
    pub ssh_keys: Vec<SshKey>,
}

/// `SSHKeyItem`.
#[derive(Debug, Clone, Deserialize, Default)]
pub(super) struct SshKey {
    /// What `DELETE /ssh-keys/{id}` takes.
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub public_key: String,
}

/// `POST /ssh-keys` answer (`POSTSSHKey`).
#[derive(Debug, Clone, Deserialize, Default)]
pub(super) struct PostedKey {
    #[serde(default, rename = "sshKey")]
    pub ssh_key: Option<PostedKeyItem>,
}

/// `POSTSSHKey.sshKey`.
#[derive(Debug, Clone, Deserialize, Default)]
pub(super) struct PostedKeyItem {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
}

/// `POST /instance/launch` answer: the new instance's UUID.
#[derive(Debug, Clone, Deserialize, Default)]
pub(super) struct Launched {
    #[serde(default)]
    pub response: Option<String>,
}
