//! The VM machines: launch (design 4.3) and teardown (design 4.4), plus what they own.

pub mod launch;
pub mod shared;
pub mod teardown;

use serde::{Deserialize, Serialize};

use crate::provider::{BlockScope, Location, Offer, SshEndpoint};
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
    /// The machine's recent spot preemptions, oldest first, at most
    /// [`PREEMPTIONS_KEPT`]: each launch tries the preempted (instance type, region)
    /// after every other offer. Empty (and absent from the state) for a machine never
    /// preempted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preemptions: Vec<Preemption>,
}

/// How many preemptions a machine's record keeps (the oldest are dropped first).
pub const PREEMPTIONS_KEPT: usize = 4;

/// One spot preemption of a machine: which instance the cloud reclaimed, on which offer,
/// and when gpuprov found it (the cloud's own time is not read). Holds no secret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Preemption {
    pub instance_id: String,
    /// The offer the instance ran on (for example `aws/us-east-1/p5.48xlarge/us-east-1a`).
    pub offer_id: String,
    pub location: Location,
    pub instance_type: String,
    /// When refresh or apply found the instance preempted (UTC).
    pub at: chrono::DateTime<chrono::Utc>,
    /// The cloud's own words for it (a state reason, a status).
    pub signal: String,
}

impl Preemption {
    /// The preemption of `vm`'s instance, found now.
    pub fn of(vm: &VmRecord, signal: &str) -> Preemption {
        Preemption {
            instance_id: vm.instance_id.clone(),
            offer_id: vm.offer.id.clone(),
            location: vm.location.clone(),
            instance_type: vm.offer.instance_type.clone(),
            at: chrono::Utc::now(),
            signal: signal.to_string(),
        }
    }

    /// The offers it demotes: its instance type in its region (any zone).
    pub fn scope(&self) -> BlockScope {
        BlockScope::InstanceTypeInRegion {
            cloud: self.location.cloud.clone(),
            region: self.location.region.clone(),
            instance_type: self.instance_type.clone(),
        }
    }

    /// `history` with `p` appended (once per instance), bounded to [`PREEMPTIONS_KEPT`].
    pub fn remember(history: &[Preemption], p: Preemption) -> Vec<Preemption> {
        let mut out: Vec<Preemption> = history
            .iter()
            .filter(|h| h.instance_id != p.instance_id)
            .cloned()
            .collect();
        out.push(p);
        let drop = out.len().saturating_sub(PREEMPTIONS_KEPT);
        out.drain(..drop);
        out
    }
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

/// The live display's facts of a state at `offer` (none chosen yet: `None`).
pub(crate) fn offer_facts(
    phase: &'static str,
    offer: Option<&Offer>,
    instance_id: &str,
    billing: bool,
) -> crate::machine::Facts {
    crate::machine::Facts {
        phase,
        location: offer.map(|o| o.location.to_string()).unwrap_or_default(),
        instance_type: offer.map(|o| o.instance_type.clone()).unwrap_or_default(),
        instance_id: instance_id.to_string(),
        price_per_hour: offer.map(|o| o.price_per_hour),
        billing,
    }
}

/// The live display's facts of a state holding the machine that is up.
pub(crate) fn vm_facts(phase: &'static str, vm: &VmRecord) -> crate::machine::Facts {
    offer_facts(phase, Some(&vm.offer), &vm.instance_id, true)
}
