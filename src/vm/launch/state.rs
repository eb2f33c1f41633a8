//! The launch machine's journalled state: [`LaunchState`] and what follows a
//! compensation. This is the persisted format (design 4.3): keep it small and stable;
//! `tests/fixtures/states/` holds a file per state written by earlier releases.

use serde::{Deserialize, Serialize};

use crate::provider::{Location, Offer, SshEndpoint};
use crate::ssh::HostKey;

use super::super::teardown::TeardownState;
use super::super::{Owned, Preemption, VmRecord};
use super::Search;

/// What follows a compensation that completes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "then", rename_all = "snake_case")]
pub enum AfterCompensation {
    /// Block the scope (already recorded in the search) and try the next offer.
    NextOffer,
    /// Search again from scratch (a stale record was cleared).
    Replan,
    /// Stop: a fatal error or a cancellation.
    Abort { reason: String },
}

/// The launch machine's journalled state (the persisted format: keep it small and stable).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum LaunchState {
    /// Looks at what the previous run left (`previous`) before planning.
    Reconciling {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        previous: Option<Owned>,
    },
    Planning {
        #[serde(default)]
        round: u32,
        /// The machine's recent spot preemptions: their (instance type, region) is tried
        /// after every other offer ([`crate::provider::offers::demote_preempted`]).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        preempted: Vec<Preemption>,
    },
    Preparing {
        search: Search,
    },
    /// `sent`: the intent to call `create` was journalled. A run that finds `sent` set
    /// and did not set it itself (it resumed after a crash, or retries after an error)
    /// cannot know whether the cloud got the create, so it waits the cloud's
    /// `create_list_lag` for the instance to be listed before sending another.
    Creating {
        search: Search,
        prepared: serde_json::Value,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        sent: bool,
    },
    /// Waits for the instance to run with an SSH endpoint.
    Booting {
        search: Search,
        instance_id: String,
        /// Found by identity, not created by this run: a failure or a Ctrl-C leaves it
        /// untouched ([`LaunchState::Unowned`]) instead of deleting it.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        adopted: bool,
        /// The recorded machine being restarted (or still starting): a failure keeps it,
        /// with its disk, instead of deleting it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kept: Option<Box<VmRecord>>,
    },
    Connecting {
        search: Search,
        instance_id: String,
        endpoint: SshEndpoint,
        /// Set when reusing a machine that was up: its host key must not change, and a
        /// failure leaves it running instead of deleting it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pinned: Option<HostKey>,
        /// Found by identity, not created by this run (see `Booting`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        adopted: bool,
    },
    /// Restart before replace: the recorded machine `vm` is stopped and the cloud can
    /// start it. A start that fails (quota, capacity, anything) keeps it and never fails
    /// over into a second instance of the same machine.
    Starting {
        search: Search,
        vm: Box<VmRecord>,
    },
    Ready {
        vm: Box<VmRecord>,
    },
    Compensating {
        search: Search,
        teardown: TeardownState,
        reason: String,
        after: AfterCompensation,
    },
    NextOffer {
        search: Search,
    },
    /// Every offer failed or is blocked. Terminal unless `retry_until_up`.
    Exhausted {
        search: Search,
    },
    /// Stopped by a fatal error or a cancellation. `owned` is set when a machine that
    /// was up is still there (for example its host key changed).
    Aborted {
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owned: Option<Owned>,
    },
    /// Compensation could not confirm the instances are gone. Terminal for this run;
    /// the next apply or destroy tears them down first.
    Leaked {
        location: Location,
        instance_ids: Vec<String>,
        reason: String,
    },
    /// Terminal: an instance carrying this machine's identity that gpuprov did not create
    /// (a stopped machine, one launched by a colleague with another key, one left from an
    /// older run) could not be taken over, and was left untouched. The next apply looks at
    /// it again (and adopts it once it runs and accepts the project key); only an explicit
    /// `gpuprov destroy` deletes it.
    Unowned {
        location: Location,
        instance_ids: Vec<String>,
        reason: String,
    },
}

impl LaunchState {
    /// A fresh start that first looks at what `previous` may own.
    pub fn start(previous: Option<Owned>) -> LaunchState {
        LaunchState::Reconciling { previous }
    }

    /// The offer this state is working on (the one being prepared, created, booted or
    /// connected to, or the one that is up), `None` between offers.
    pub fn offer(&self) -> Option<&Offer> {
        match self {
            LaunchState::Preparing { search }
            | LaunchState::Creating { search, .. }
            | LaunchState::Booting { search, .. }
            | LaunchState::Connecting { search, .. }
            | LaunchState::Compensating { search, .. }
            | LaunchState::NextOffer { search }
            | LaunchState::Starting { search, .. } => search.current(),
            LaunchState::Ready { vm } => Some(&vm.offer),
            _ => None,
        }
    }

    /// The cloud resources this state may own: side resources from `Preparing` on, an
    /// instance from `Creating` on (a create may have happened), marked `adopted` when
    /// gpuprov did not create it and `unsettled` when it may not be listed yet.
    pub fn owned(&self) -> Option<Owned> {
        let at =
            |s: &Search, ids: Vec<String>| s.current().map(|o| Owned::at(o.location.clone(), ids));
        match self {
            LaunchState::Reconciling { previous } => previous.clone(),
            LaunchState::Planning { .. }
            | LaunchState::NextOffer { .. }
            | LaunchState::Exhausted { .. } => None,
            // Prepare may have created side resources (security group, firewall) there.
            LaunchState::Preparing { search } => at(search, vec![]),
            LaunchState::Creating { search, sent, .. } => at(search, vec![]).map(|o| Owned {
                unsettled: *sent,
                ..o
            }),
            LaunchState::Booting { kept: Some(vm), .. } => Some(kept(vm)),
            LaunchState::Starting { vm, .. } => Some(kept(vm)),
            LaunchState::Booting {
                search,
                instance_id,
                adopted,
                ..
            } => at(search, vec![instance_id.clone()]).map(|o| Owned {
                adopted: *adopted,
                unsettled: !*adopted,
                ..o
            }),
            LaunchState::Connecting {
                search,
                instance_id,
                adopted,
                ..
            } => at(search, vec![instance_id.clone()]).map(|o| Owned {
                adopted: *adopted,
                ..o
            }),
            LaunchState::Ready { vm } => Some(kept(vm)),
            LaunchState::Compensating { teardown, .. } => teardown.owned(),
            LaunchState::Aborted { owned, .. } => owned.clone(),
            LaunchState::Leaked {
                location,
                instance_ids,
                ..
            } => Some(Owned::at(location.clone(), instance_ids.clone())),
            LaunchState::Unowned {
                location,
                instance_ids,
                ..
            } => Some(Owned {
                adopted: true,
                ..Owned::at(location.clone(), instance_ids.clone())
            }),
        }
    }

    /// The machine when it is up.
    pub fn ready(&self) -> Option<&VmRecord> {
        match self {
            LaunchState::Ready { vm } => Some(vm),
            _ => None,
        }
    }
}

/// What the recorded machine `vm` owns: its instance, with the record.
pub(super) fn kept(vm: &VmRecord) -> Owned {
    Owned {
        vm: Some(Box::new(vm.clone())),
        ..Owned::at(vm.location.clone(), vec![vm.instance_id.clone()])
    }
}
