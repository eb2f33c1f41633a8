//! The adapters, one folder a cloud, and the registry that builds them
//! ([`registry`]): the only modules that speak a vendor's API. An adapter maps its
//! cloud onto the contract ([`crate::provider::CloudProvider`]) with the shared
//! [`crate::provider::kit`]; it names no other adapter (`src/tidy.rs` checks it).
//!
//! Adding a cloud = its folder here + one row in the registry's table.

pub mod aws;
pub mod digitalocean;
pub mod docker;
pub mod gcp;
pub mod hyperstack;
pub mod lambda;
pub mod massedcompute;
pub mod nebius;
pub mod primeintellect;
pub mod registry;
pub mod runpod;
pub mod verda;
