//! The launch machine (design 4.3): Reconciling → Planning → [Preparing → Creating →
//! Booting → Connecting]* → Ready, with failover across offers, compensation through the
//! embedded teardown machine, and `Leaked` / `Aborted` / `Exhausted` as its other ends.
//!
//! The failover cursor ([`Search`]) travels in every attempt state, so it survives a crash.
//! Every step observes before it acts, so re-running a step after a crash is safe: in
//! particular `Creating` looks for an instance carrying the identity before it creates.
//!
//! Ownership (issue 12): a run tears down only what it created.
//! - An instance `Creating` lists before this attempt journalled its create intent is
//!   `adopted`: a failed boot, a refused key or a Ctrl-C leaves it [`LaunchState::Unowned`];
//!   only `destroy` deletes it.
//! - A recorded machine that was up is `kept` (`Booting { kept }`, `Connecting { pinned }`):
//!   failures abort with it kept. Stopped, it is started (`Starting`, on clouds with
//!   `Feature::Start`), never deleted first; a refused start keeps it and creates nothing.
//! - A compensation deletes only the ids it names, except after an unlisted create of its
//!   own (`compensate::Lag`); side resources of a failed prepare are cleaned up unless the next offer
//!   is in the same cloud and region (AWS zones share a security group).
//! - Every create token carries [`Search::nonce`], so a replacement never re-sends a token
//!   the cloud used. The vanish grace is the cloud's `create_list_lag`.
//! - A refused SSH key ends the wait at once on a machine this run did not just create,
//!   after [`LaunchMachine::auth_refused_grace`] otherwise; `ErrorKind::Unreachable`
//!   blocks the whole cloud at once.
//!
//! The module is cut as the machine is read:
//!
//! - `state.rs` — [`LaunchState`], the journalled (persisted) format;
//! - `search.rs` — [`Search`], the failover cursor: offers, blocks, history;
//! - [`failover`] — the one pure decision from (stage, fault, what the attempt holds) to
//!   a reaction: the table every fault of every step goes through;
//! - `compensate.rs` — carrying a reaction out (the state it names), and the
//!   compensation itself;
//! - the steps, by stage: `reconcile.rs` (`Reconciling`, `Starting`), `create.rs`
//!   (`Planning`, `NextOffer`, `Exhausted`, `Preparing`, `Creating`) and `boot.rs`
//!   (`Booting`, `Connecting`). They do the I/O; [`failover::decide`] says what a fault
//!   leads to, so `step` itself only dispatches.

mod boot;
mod compensate;
mod create;
pub mod failover;
mod reconcile;
mod search;
mod state;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::config::VmSpec;
use crate::machine::{Facts, Machine, Providers, RetryPolicy, Step, StepCx};
use crate::provider::{CloudProvider, InstanceSpec, Offer};
use crate::ssh::Connector;

use super::teardown::TeardownMachine;
use super::{offer_facts, vm_facts};
use compensate::Failure;
use failover::Fault;

pub use search::{Attempt, Search};
pub use state::{AfterCompensation, LaunchState};

/// Runs one machine's launch. Holds what the steps need; the state holds the progress.
pub struct LaunchMachine {
    pub vm: VmSpec,
    pub lineage: String,
    /// The project's OpenSSH public key (not a secret).
    pub ssh_public_key: String,
    pub providers: Providers,
    pub connector: Arc<dyn Connector>,
    pub retry: RetryPolicy,
    /// Wait between `--retry-until-up` rounds (design: 30 s).
    pub exhausted_wait: Duration,
    /// How long an instance that `create` returned may be missing from `observe` before
    /// it counts as vanished (clouds list new instances with a lag); `None`: the cloud's
    /// declared `create_list_lag` (its documented consistency window).
    pub vanish_grace: Option<Duration>,
    /// How long SSH may refuse the project key on an instance this run created before the
    /// wait ends with "key refused" (cloud-init may still be writing `authorized_keys`).
    /// An instance gpuprov did not create, or one that was up before, ends at once.
    pub auth_refused_grace: Duration,
    pub teardown: TeardownMachine,
    /// Run at first boot on clouds that support it (the k3s installer, design 4.5).
    pub boot_script: Option<crate::provider::BootScript>,
    /// Client tokens whose create intent this process journalled and has not sent yet:
    /// only for these may `Creating` call `create` without waiting (see
    /// [`LaunchState::Creating`]).
    fresh_creates: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The run's shared objects ([`super::shared`]): `Preparing` waits for the ones its
    /// offer needs before `prepare`. The engine always sets it; `None` (a machine run
    /// alone, in tests) prepares none, so `prepare` on a cloud that declares shared
    /// objects is refused (`InvalidRequest`): tests that drive such a cloud set it as the
    /// engine does.
    pub shared: Option<Arc<super::shared::SharedObjects>>,
}

impl LaunchMachine {
    pub fn new(
        vm: VmSpec,
        lineage: String,
        ssh_public_key: String,
        providers: Providers,
        connector: Arc<dyn Connector>,
    ) -> Self {
        LaunchMachine {
            vm,
            lineage,
            ssh_public_key,
            teardown: TeardownMachine::new(providers.clone()),
            providers,
            connector,
            retry: RetryPolicy::default(),
            exhausted_wait: Duration::from_secs(30),
            vanish_grace: None,
            auth_refused_grace: Duration::from_secs(30),
            boot_script: None,
            fresh_creates: Default::default(),
            shared: None,
        }
    }

    fn provider(&self, cloud: &str) -> Option<&Arc<dyn CloudProvider>> {
        self.providers.get(cloud)
    }

    /// The instance spec for the current attempt; the client token names the VM, the
    /// lineage, the planning's nonce, the round and the offer, so a repeated create of one
    /// attempt is recognisable and no two attempts share a token over the state's life.
    pub fn instance_spec(&self, search: &Search) -> InstanceSpec {
        let short: String = self.lineage.chars().take(8).collect();
        InstanceSpec {
            vm_name: self.vm.name.clone(),
            lineage: self.lineage.clone(),
            client_token: if search.nonce.is_empty() {
                format!(
                    "gpuprov-{short}-{}-r{}-o{}",
                    self.vm.name, search.round, search.cursor
                )
            } else {
                format!(
                    "gpuprov-{short}-{}-{}-r{}-o{}",
                    self.vm.name, search.nonce, search.round, search.cursor
                )
            },
            image: self.vm.image.clone(),
            disk_gb: self.vm.disk_gb,
            ports: self.vm.ports.clone(),
            ssh_public_key: self.ssh_public_key.clone(),
            boot_script: self.boot_script.clone(),
            shared: Default::default(),
        }
    }
}

/// The reason a launch ends with after Ctrl-C (`Machine::on_cancel`).
pub(crate) const CANCELLED: &str = "cancelled by the user";

#[async_trait]
impl Machine for LaunchMachine {
    type State = LaunchState;
    const KIND: &'static str = "launch";

    fn is_terminal(&self, s: &LaunchState) -> bool {
        match s {
            LaunchState::Ready { .. }
            | LaunchState::Aborted { .. }
            | LaunchState::Leaked { .. }
            | LaunchState::Unowned { .. } => true,
            LaunchState::Exhausted { .. } => !self.vm.retry_until_up,
            _ => false,
        }
    }

    fn offer<'a>(&self, s: &'a LaunchState) -> Option<&'a Offer> {
        s.offer()
    }

    fn label(&self, s: &LaunchState) -> String {
        let offer = |search: &Search| {
            search
                .current()
                .map(|o| format!("{} {}", o.location, o.instance_type))
                .unwrap_or_default()
        };
        match s {
            LaunchState::Reconciling { .. } => "reconciling".into(),
            LaunchState::Planning { round, .. } if *round > 0 => {
                format!("planning (round {})", round + 1)
            }
            LaunchState::Planning { .. } => "planning".into(),
            LaunchState::Preparing { search } => format!("preparing {}", offer(search)),
            LaunchState::Creating {
                search, sent: true, ..
            } => format!("creating {} (create sent)", offer(search)),
            LaunchState::Creating { search, .. } => format!("creating {}", offer(search)),
            LaunchState::Booting {
                instance_id,
                kept: Some(vm),
                ..
            } => format!("starting {instance_id} at {} (restart)", vm.location),
            LaunchState::Booting {
                search,
                instance_id,
                adopted,
                ..
            } => format!(
                "booting {instance_id} at {}{}",
                offer(search),
                if *adopted {
                    " (found, not created by gpuprov)"
                } else {
                    ""
                }
            ),
            LaunchState::Starting { vm, .. } => {
                format!("starting stopped {} at {}", vm.instance_id, vm.location)
            }
            LaunchState::Connecting { endpoint, .. } => format!("connecting ssh {endpoint}"),
            LaunchState::Ready { vm } => {
                format!("ready {} at {} ({})", vm.instance_id, vm.location, vm.ssh)
            }
            LaunchState::Compensating {
                reason, teardown, ..
            } => {
                format!("compensating ({}): {reason}", self.teardown.label(teardown))
            }
            LaunchState::NextOffer { .. } => "next offer".into(),
            LaunchState::Exhausted { search } => format!("exhausted: {}", search.summary()),
            LaunchState::Aborted { reason, .. } => format!("aborted: {reason}"),
            LaunchState::Leaked {
                location,
                instance_ids,
                reason,
            } => {
                format!("leaked {} at {location}: {reason}", instance_ids.join(","))
            }
            LaunchState::Unowned { reason, .. } => format!("unowned: {reason}"),
        }
    }

    fn facts(&self, s: &LaunchState) -> Facts {
        let at = |phase, search: &Search, id: &str, billing| {
            offer_facts(phase, search.current(), id, billing)
        };
        match s {
            LaunchState::Reconciling { .. } => offer_facts("reconciling", None, "", false),
            LaunchState::Planning { .. } => offer_facts("planning", None, "", false),
            LaunchState::Preparing { search } => at("preparing", search, "", false),
            LaunchState::Creating { search, .. } => at("creating", search, "", false),
            LaunchState::Booting {
                instance_id,
                kept: Some(vm),
                ..
            } => offer_facts("starting", Some(&vm.offer), instance_id, true),
            LaunchState::Booting {
                search,
                instance_id,
                ..
            } => at("booting", search, instance_id, true),
            LaunchState::Starting { vm, .. } => vm_facts("starting", vm),
            LaunchState::Connecting {
                search,
                instance_id,
                ..
            } => at("connecting", search, instance_id, true),
            LaunchState::Ready { vm } => vm_facts("ready", vm),
            LaunchState::Compensating {
                search, teardown, ..
            } => {
                let id = self.teardown.facts(teardown).instance_id;
                at("compensating", search, &id, true)
            }
            LaunchState::NextOffer { search } => at("next offer", search, "", false),
            LaunchState::Exhausted { .. } => offer_facts("exhausted", None, "", false),
            LaunchState::Aborted { owned, reason } => {
                let phase = if reason == CANCELLED {
                    "interrupted"
                } else {
                    "aborted"
                };
                match owned.as_ref().and_then(|o| o.vm.as_ref()) {
                    Some(vm) => vm_facts(phase, vm),
                    None => offer_facts(phase, None, "", false),
                }
            }
            LaunchState::Leaked {
                location,
                instance_ids,
                ..
            } => Facts::leaked(location, instance_ids),
            LaunchState::Unowned { .. } => offer_facts("unowned", None, "", false),
        }
    }

    fn retry_policy(&self, _s: &LaunchState) -> RetryPolicy {
        self.retry
    }
    fn on_retries_exhausted(&self, s: &LaunchState, last_error: String) -> LaunchState {
        // Between offers nothing is retried.
        if matches!(
            s,
            LaunchState::NextOffer { .. } | LaunchState::Exhausted { .. }
        ) {
            return s.clone();
        }
        let f = Failure::new(
            Fault::GaveUp,
            format!("gave up after repeated errors: {last_error}"),
        );
        match self.site_of(s).and_then(|site| self.react(site, f)) {
            Some(Step::Next(next)) => next,
            _ => s.clone(),
        }
    }

    fn on_cancel(&self, s: &LaunchState) -> Option<LaunchState> {
        let f = Failure::new(Fault::Cancelled, CANCELLED);
        match self.react(self.site_of(s)?, f)? {
            Step::Next(next) => Some(next),
            _ => None,
        }
    }

    async fn step(&self, s: &LaunchState, cx: &StepCx) -> Step<LaunchState> {
        match s {
            LaunchState::Reconciling { previous } => self.reconcile(previous, cx).await,
            LaunchState::Planning { round, preempted } => self.plan(*round, preempted).await,
            LaunchState::NextOffer { search } => self.next_offer(search),
            LaunchState::Exhausted { search } => self.exhausted(search, cx),
            LaunchState::Preparing { search } => self.prepare(search).await,
            LaunchState::Creating {
                search,
                prepared,
                sent,
            } => self.create(search, prepared, *sent, cx).await,
            LaunchState::Starting { search, vm } => self.start(search, vm).await,
            LaunchState::Booting {
                search,
                instance_id,
                adopted,
                kept,
            } => {
                self.boot(search, instance_id, *adopted, kept.as_deref(), cx)
                    .await
            }
            LaunchState::Connecting {
                search,
                instance_id,
                endpoint,
                pinned,
                adopted,
            } => {
                self.connect(search, instance_id, endpoint, pinned.as_ref(), *adopted, cx)
                    .await
            }
            LaunchState::Compensating {
                search,
                teardown,
                reason,
                after,
            } => self.compensating(search, teardown, reason, after, cx).await,
            LaunchState::Ready { .. }
            | LaunchState::Aborted { .. }
            | LaunchState::Leaked { .. }
            | LaunchState::Unowned { .. } => Step::Next(s.clone()),
        }
    }
}
