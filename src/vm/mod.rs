//! The VM machines: launch (design 4.3) and teardown (design 4.4), plus what they own.

pub mod launch;
pub mod teardown;

use serde::{Deserialize, Serialize};

use crate::provider::{Location, Offer, SshEndpoint};
use crate::ssh::HostKey;

pub use launch::{LaunchMachine, LaunchState, Search};
pub use teardown::{Target, TeardownMachine, TeardownState};

/// A machine that is up: what `status`, `ssh` and the ssh config need. Holds no secret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmRecord {
    pub instance_id: String,
    pub location: Location,
    pub offer: Offer,
    pub ssh: SshEndpoint,
    /// The login user (the cloud's choice where it makes one, else the image default).
    pub user: String,
    /// Host key pinned on first login; later logins must present the same key.
    pub host_key: HostKey,
    pub ready_at: chrono::DateTime<chrono::Utc>,
}

/// Cloud resources a record may own: where, which instances, and the machine if it was
/// up. `instance_ids` may be empty when a create may have happened but returned no id, or
/// when only side resources (security group, firewall) may exist there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Owned {
    pub location: Location,
    #[serde(default)]
    pub instance_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm: Option<Box<VmRecord>>,
    /// The instances were found by identity, not created by gpuprov (a stopped machine,
    /// a colleague's, one from an older run): an apply never tears them down; only an
    /// explicit `destroy` does.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adopted: bool,
    /// A create may be at the cloud without being listed yet: a teardown trusts an empty
    /// listing only after the cloud's `create_list_lag`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unsettled: bool,
}

impl Owned {
    /// Owns `instance_ids` at `location`, created by gpuprov and listed.
    pub fn at(location: Location, instance_ids: Vec<String>) -> Owned {
        Owned {
            location,
            instance_ids,
            vm: None,
            adopted: false,
            unsettled: false,
        }
    }
}
