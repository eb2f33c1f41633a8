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
//!   own ([`Lag`]); side resources of a failed prepare are cleaned up unless the next offer
//!   is in the same cloud and region (AWS zones share a security group).
//! - Every create token carries [`Search::nonce`], so a replacement never re-sends a token
//!   the cloud used. The vanish grace is the cloud's `create_list_lag`.
//! - A refused SSH key ends the wait at once on a machine this run did not just create,
//!   after [`LaunchMachine::auth_refused_grace`] otherwise; `ErrorKind::Unreachable`
//!   blocks the whole cloud at once.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::config::VmSpec;
use crate::machine::{Facts, Machine, Providers, RetryPolicy, Step, StepCx};
use crate::provider::{
    existing, BlockScope, CloudProvider, ErrorKind, Feature, InstanceSpec, InstanceStatus,
    Location, Observed, Offer, ProviderError, SshEndpoint,
};
use crate::ssh::{Connector, HostKey, SshError};

use super::teardown::{retry_step, Target, TeardownMachine, TeardownState};
use super::{offer_facts, vm_facts, Owned, Preemption, VmRecord};

/// One attempt on one offer, kept for `status` and for the final error message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    pub offer_id: String,
    pub outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ErrorKind>,
}

/// The failover cursor: ordered offers, the one being tried, what is blocked, and what
/// happened so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Search {
    pub offers: Vec<Offer>,
    pub cursor: usize,
    #[serde(default)]
    pub blocked: Vec<BlockScope>,
    #[serde(default)]
    pub history: Vec<Attempt>,
    /// Planning round (increases with each `--retry-until-up` re-plan); part of the
    /// idempotency token so a new round never reuses an old create.
    #[serde(default)]
    pub round: u32,
    /// Random per planning (8 hex digits), part of every create's idempotency token: a
    /// machine whose instance is gone (spot interruption, terminated in the console) is
    /// re-planned with a new nonce, so its replacement never re-sends a token the cloud
    /// already used (EC2 would answer with the dead instance). Journalled with the search,
    /// so it is stable across crashes of one attempt. Empty in journals written before it
    /// existed (their tokens stay as they were).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub nonce: String,
    /// The machine's recent spot preemptions (from its record, plus the one that ended
    /// it): planning ordered their (instance type, region) after every other offer, and
    /// the record of the machine this search brings up keeps them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preempted: Vec<Preemption>,
}

/// What a compensation may find that its ids do not name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lag {
    /// Nothing: the named instances are listed, or there are none.
    None,
    /// The named instance was created moments ago and may not be listed or deletable yet:
    /// wait the cloud's listing lag for it.
    Named,
    /// A create of this attempt may be at the cloud without an id (unlisted, or its
    /// answer lost): wait the listing lag and delete what carries the identity there.
    Sweep,
}

impl Lag {
    fn sweep_if(create_may_exist: bool) -> Lag {
        if create_may_exist {
            Lag::Sweep
        } else {
            Lag::None
        }
    }
}

/// The classified error of the first late-refused create in an `observe` answer.
fn refusal(seen: &[Observed]) -> Option<ProviderError> {
    seen.iter().find_map(|o| match &o.status {
        InstanceStatus::Refused(e) => Some((**e).clone()),
        _ => None,
    })
}

/// Blocks the error's scope and moves to the next offer, with nothing to compensate
/// (nothing was created, or nothing was sent).
fn skip_offer(search: &Search, e: &ProviderError, stage: &str) -> LaunchState {
    let scope = search.current().and_then(|o| e.scope_for(o));
    LaunchState::NextOffer {
        search: search
            .clone()
            .record(format!("{stage}: {}", e.msg), Some(e.kind), scope),
    }
}

/// A fresh [`Search::nonce`].
fn new_nonce() -> String {
    format!("{:08x}", rand::random::<u32>())
}

impl Search {
    /// The offer under the cursor.
    pub fn current(&self) -> Option<&Offer> {
        self.offers.get(self.cursor)
    }

    fn is_blocked(&self, o: &Offer) -> bool {
        self.blocked.iter().any(|b| b.covers(o))
    }

    /// The next offer after the cursor that no block covers.
    fn next_unblocked(&self) -> Option<&Offer> {
        self.offers
            .iter()
            .skip(self.cursor + 1)
            .find(|o| !self.is_blocked(o))
    }

    /// Records the outcome of the current offer and blocks `scope`.
    fn record(
        mut self,
        outcome: String,
        kind: Option<ErrorKind>,
        scope: Option<BlockScope>,
    ) -> Search {
        if let Some(o) = self.current() {
            self.history.push(Attempt {
                offer_id: o.id.clone(),
                outcome,
                kind,
            });
        }
        if let Some(s) = scope {
            if !self.blocked.contains(&s) {
                self.blocked.push(s);
            }
        }
        self
    }

    fn summary(&self) -> String {
        if self.history.is_empty() {
            return "no offer matched".into();
        }
        self.history
            .iter()
            .map(|a| format!("{}: {}", a.offer_id, a.outcome))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

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

    /// The cloud resources this state may own (a create may have happened from
    /// `Creating` on).
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
        let kept = |vm: &VmRecord| Owned {
            vm: Some(Box::new(vm.clone())),
            ..Owned::at(vm.location.clone(), vec![vm.instance_id.clone()])
        };
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
    /// offer needs before `prepare`. `None` (a machine run alone, in tests): the adapter's
    /// `prepare` finds or creates them itself.
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

    /// Tears down what the current attempt may own, then goes on as `after` says: `ids`,
    /// the side resources, and — only with [`Lag::Sweep`] (a create of this attempt may
    /// be at the cloud, unlisted or with its answer lost) — anything listed with the
    /// identity there, after the cloud's listing lag. Otherwise nothing but `ids` is
    /// deleted: an instance this run did not create is never swept. Side resources are
    /// kept when the next offer is in the same cloud and region (it reuses them).
    fn compensate(
        &self,
        search: Search,
        ids: Vec<String>,
        lag: Lag,
        reason: String,
        after: AfterCompensation,
    ) -> LaunchState {
        let location = search.current().map(|o| o.location.clone());
        let same_region_next = matches!(after, AfterCompensation::NextOffer)
            && match (search.current(), search.next_unblocked()) {
                (Some(a), Some(b)) => {
                    a.location.cloud == b.location.cloud && a.location.region == b.location.region
                }
                _ => false,
            };
        match location {
            Some(location) => LaunchState::Compensating {
                teardown: TeardownState::Requesting {
                    target: Target {
                        settle: lag != Lag::None,
                        keep_side_resources: same_region_next,
                        named_only: lag != Lag::Sweep,
                        ..Target::new(location, &self.vm.name, ids)
                    },
                },
                search,
                reason,
                after,
            },
            None => LaunchState::Aborted {
                reason,
                owned: None,
            },
        }
    }

    /// Compensation for an error on the current offer: record it, block its scope, tear
    /// down whatever may exist, then go on as the error kind says.
    fn on_offer_error(
        &self,
        search: Search,
        ids: Vec<String>,
        lag: Lag,
        e: &ProviderError,
        stage: &str,
    ) -> LaunchState {
        let offer = search.current().cloned();
        let scope = offer.as_ref().and_then(|o| e.scope_for(o));
        let search = search.record(format!("{stage}: {}", e.msg), Some(e.kind), scope);
        match e.kind {
            ErrorKind::InvalidRequest | ErrorKind::Credentials => {
                let reason = format!("{stage} failed ({:?}): {}", e.kind, e.text());
                self.compensate(
                    search,
                    ids,
                    lag,
                    reason.clone(),
                    AfterCompensation::Abort { reason },
                )
            }
            _ => self.compensate(
                search,
                ids,
                lag,
                format!("{stage}: {}", e.msg),
                AfterCompensation::NextOffer,
            ),
        }
    }

    /// Leaves an instance gpuprov did not create untouched, saying why and what to do.
    fn unowned(&self, search: &Search, instance_id: &str, why: &str) -> LaunchState {
        match search.current() {
            Some(o) => LaunchState::Unowned {
                location: o.location.clone(),
                instance_ids: vec![instance_id.to_string()],
                reason: format!(
                    "instance {instance_id} at {} carries this machine's identity but was not \
                     created by gpuprov; {why}; it was left untouched (apply takes it over once \
                     it runs and accepts the project key; `gpuprov destroy` deletes it)",
                    o.location
                ),
            },
            None => LaunchState::Aborted {
                reason: why.to_string(),
                owned: None,
            },
        }
    }

    /// Stops with the recorded machine `vm` kept (with its disk), never replaced.
    fn keep(&self, vm: &VmRecord, why: String) -> LaunchState {
        LaunchState::Aborted {
            reason: format!(
                "{why}; instance {} at {} was kept (apply tries again; `gpuprov destroy` \
                 removes it)",
                vm.instance_id, vm.location
            ),
            owned: Some(Owned {
                vm: Some(Box::new(vm.clone())),
                ..Owned::at(vm.location.clone(), vec![vm.instance_id.clone()])
            }),
        }
    }

    /// The end of an attempt state whose instance this run must not delete: a recorded
    /// machine being restarted or reconnected is kept, one found by identity is left
    /// `Unowned`. `None` when the state holds only what this run created.
    fn leave_unowned_or_kept(&self, s: &LaunchState, why: &str) -> Option<LaunchState> {
        match s {
            LaunchState::Starting { vm, .. } | LaunchState::Booting { kept: Some(vm), .. } => {
                Some(self.keep(vm, why.to_string()))
            }
            LaunchState::Booting {
                search,
                instance_id,
                adopted: true,
                ..
            }
            | LaunchState::Connecting {
                search,
                instance_id,
                adopted: true,
                ..
            } => Some(self.unowned(search, instance_id, why)),
            LaunchState::Connecting {
                search,
                instance_id,
                endpoint,
                pinned: Some(key),
                ..
            } => Some(
                match self.record_for(search, instance_id, endpoint, key.clone()) {
                    Some(vm) => self.keep(&vm, why.to_string()),
                    None => LaunchState::Aborted {
                        reason: why.to_string(),
                        owned: None,
                    },
                },
            ),
            _ => None,
        }
    }

    /// What an attempt state this run created may own, for its compensation: the search,
    /// the instance ids, what the listing may not show yet, and the stage's name.
    fn attempt<'s>(
        &self,
        s: &'s LaunchState,
    ) -> Option<(&'s Search, Vec<String>, Lag, &'static str)> {
        match s {
            LaunchState::Preparing { search } => Some((search, vec![], Lag::None, "prepare")),
            LaunchState::Creating { search, sent, .. } => {
                Some((search, vec![], Lag::sweep_if(*sent), "create"))
            }
            LaunchState::Booting {
                search,
                instance_id,
                ..
            } => Some((search, vec![instance_id.clone()], Lag::Named, "boot")),
            LaunchState::Connecting {
                search,
                instance_id,
                ..
            } => Some((search, vec![instance_id.clone()], Lag::None, "connect")),
            _ => None,
        }
    }

    fn record_for(
        &self,
        search: &Search,
        instance_id: &str,
        endpoint: &SshEndpoint,
        host_key: HostKey,
    ) -> Option<VmRecord> {
        let offer = search.current()?.clone();
        Some(VmRecord {
            instance_id: instance_id.to_string(),
            location: offer.location.clone(),
            offer,
            ssh: endpoint.clone(),
            user: endpoint.user.clone().unwrap_or_else(|| "root".into()),
            host_key,
            ready_at: chrono::Utc::now(),
            preemptions: search.preempted.clone(),
        })
    }

    async fn plan(&self, round: u32, preempted: &[Preemption]) -> Step<LaunchState> {
        let req = self.vm.request();
        let mut offers = Vec::new();
        let mut fatal = Vec::new();
        let mut other = Vec::new();
        for cloud in &self.vm.clouds {
            let Some(p) = self.provider(cloud.as_str()) else {
                fatal.push(format!("{cloud}: no adapter available"));
                continue;
            };
            match p.plan(&req).await {
                Ok(mut list) => {
                    crate::provider::offers::order(&mut list, &req, &p.capabilities());
                    offers.extend(list.into_iter().filter(|o| {
                        self.vm
                            .max_price_per_hour
                            .is_none_or(|max| o.price_per_hour <= max)
                    }))
                }
                Err(e) if e.kind == ErrorKind::Transient => return retry_step(e),
                Err(e) if matches!(e.kind, ErrorKind::InvalidRequest | ErrorKind::Credentials) => {
                    fatal.push(format!("{cloud}: {}", e.text()))
                }
                Err(e) => other.push(format!("{cloud}: {}", e.text())),
            }
        }
        let demoted: Vec<BlockScope> = preempted.iter().map(Preemption::scope).collect();
        crate::provider::offers::demote_preempted(&mut offers, &demoted);
        if offers.is_empty() {
            if !fatal.is_empty() && other.is_empty() {
                return Step::Next(LaunchState::Aborted {
                    reason: fatal.join("; "),
                    owned: None,
                });
            }
            let history = fatal
                .into_iter()
                .chain(other)
                .map(|m| Attempt {
                    offer_id: "plan".into(),
                    outcome: m,
                    kind: None,
                })
                .collect();
            return Step::Next(LaunchState::Exhausted {
                search: Search {
                    history,
                    round,
                    preempted: preempted.to_vec(),
                    ..Search::default()
                },
            });
        }
        Step::Next(LaunchState::Preparing {
            search: Search {
                offers,
                round,
                nonce: new_nonce(),
                preempted: preempted.to_vec(),
                ..Search::default()
            },
        })
    }

    async fn reconcile(&self, previous: &Option<Owned>, cx: &StepCx) -> Step<LaunchState> {
        let Some(prev) = previous else {
            return Step::Next(LaunchState::Planning {
                round: 0,
                preempted: vec![],
            });
        };
        let Some(p) = self.provider(&prev.location.cloud) else {
            return Step::Next(LaunchState::Leaked {
                location: prev.location.clone(),
                instance_ids: prev.instance_ids.clone(),
                reason: format!("no adapter for cloud '{}' in this run", prev.location.cloud),
            });
        };
        if prev.adopted {
            return self.reconcile_adopted(p.as_ref(), prev).await;
        }
        let history = prev
            .vm
            .as_ref()
            .map(|vm| vm.preemptions.clone())
            .unwrap_or_default();
        let stale = |preempted: Vec<Preemption>| {
            let search = Search {
                preempted,
                ..Search::default()
            };
            LaunchState::Compensating {
                teardown: TeardownState::Requesting {
                    // Only what the record names, unless a create of it may be unlisted.
                    target: Target {
                        named_only: !prev.unsettled,
                        ..Target::of(prev.clone(), &self.vm.name)
                    },
                },
                search,
                reason: "removing what an earlier run left behind".into(),
                after: AfterCompensation::Replan,
            }
        };
        let Some(vm) = &prev.vm else {
            return Step::Next(stale(history));
        };
        // It was up: reuse it when the cloud still runs it at the same place.
        let seen = match p.observe(&vm.location, &self.vm.name).await {
            Ok(v) => v,
            Err(e) if e.kind.retried_in_place() => return retry_step(e),
            Err(e) => {
                return Step::Next(LaunchState::Aborted {
                    reason: e.text(),
                    owned: Some(prev.clone()),
                })
            }
        };
        let search = Search {
            offers: vec![vm.offer.clone()],
            // A machine reconnected or restarted keeps its preemption history.
            preempted: vm.preemptions.clone(),
            ..Search::default()
        };
        let caps = p.capabilities();
        // Preempted: recorded, and replaced trying other offers first; a stopped one
        // (its disk kept) is deleted first, since a start would land on the same
        // reclaimed capacity.
        if let Some((signal, stopped)) = seen.iter().find_map(|o| match &o.status {
            InstanceStatus::Preempted { signal, stopped } if o.instance_id == vm.instance_id => {
                Some((signal.clone(), *stopped))
            }
            _ => None,
        }) {
            let history = Preemption::remember(&vm.preemptions, Preemption::of(vm, &signal));
            return Step::Next(if stopped {
                stale(history)
            } else {
                LaunchState::Planning {
                    round: 0,
                    preempted: history,
                }
            });
        }
        let seen = existing(seen);
        match seen.iter().find(|o| o.instance_id == vm.instance_id) {
            Some(o) if o.status == InstanceStatus::Running => {
                let endpoint = o.ssh.clone().unwrap_or_else(|| vm.ssh.clone());
                Step::Next(LaunchState::Connecting {
                    search,
                    instance_id: vm.instance_id.clone(),
                    endpoint,
                    pinned: Some(vm.host_key.clone()),
                    adopted: false,
                })
            }
            Some(o) if o.status == InstanceStatus::Pending => Step::Next(LaunchState::Booting {
                search,
                instance_id: vm.instance_id.clone(),
                adopted: false,
                kept: Some(vm.clone()),
            }),
            // Restart before replace: a stopped machine keeps its disk.
            Some(o) if o.status == InstanceStatus::Stopping => {
                if cx.in_state > caps.delete_timeout {
                    return Step::Next(self.keep(
                        vm,
                        format!(
                            "instance {} is still stopping after {}s",
                            vm.instance_id,
                            caps.delete_timeout.as_secs()
                        ),
                    ));
                }
                Step::poll(
                    caps.poll_interval,
                    format!("{} is stopping; waiting to start it again", vm.instance_id),
                )
            }
            Some(o) if o.status == InstanceStatus::Stopped => {
                if caps.supports(Feature::Start) {
                    Step::Next(LaunchState::Starting {
                        search,
                        vm: vm.clone(),
                    })
                } else {
                    Step::Next(self.keep(
                        vm,
                        format!(
                            "instance {} is stopped and {} cannot start instances through its \
                             API: start it yourself and apply again",
                            vm.instance_id, vm.location.cloud
                        ),
                    ))
                }
            }
            // Failing or going away: replace it.
            Some(_) => Step::Next(stale(history)),
            // Gone. Anything else listed with the identity is not this record's: the
            // create path adopts it instead of deleting it.
            None => Step::Next(LaunchState::Planning {
                round: 0,
                preempted: history,
            }),
        }
    }

    /// The next apply after [`LaunchState::Unowned`]: take the instance over once it runs,
    /// otherwise leave it untouched again; never delete it.
    async fn reconcile_adopted(&self, p: &dyn CloudProvider, prev: &Owned) -> Step<LaunchState> {
        let seen = match p.observe(&prev.location, &self.vm.name).await {
            Ok(v) => existing(v),
            Err(e) if e.kind.retried_in_place() => return retry_step(e),
            Err(e) => {
                return Step::Next(LaunchState::Aborted {
                    reason: e.text(),
                    owned: Some(prev.clone()),
                })
            }
        };
        let Some(o) = seen
            .iter()
            .find(|o| prev.instance_ids.contains(&o.instance_id))
        else {
            // Gone (deleted outside gpuprov): plan afresh.
            return Step::Next(LaunchState::Planning {
                round: 0,
                preempted: vec![],
            });
        };
        // The search the instance was adopted in is not journalled with the record: one
        // stand-in offer at its location keeps the attempt states well-formed.
        let search = Search {
            offers: vec![Offer {
                id: format!("adopted/{}", o.instance_id),
                location: prev.location.clone(),
                instance_type: String::new(),
                gpu: None,
                gpu_count: 0,
                spot: false,
                price_per_hour: 0.0,
                detail: serde_json::Value::Null,
                facts: Default::default(),
            }],
            ..Search::default()
        };
        match (&o.status, &o.ssh) {
            (InstanceStatus::Running, Some(ep)) => Step::Next(LaunchState::Connecting {
                search,
                instance_id: o.instance_id.clone(),
                endpoint: ep.clone(),
                pinned: None,
                adopted: true,
            }),
            (InstanceStatus::Pending | InstanceStatus::Running, _) => {
                Step::Next(LaunchState::Booting {
                    search,
                    instance_id: o.instance_id.clone(),
                    adopted: true,
                    kept: None,
                })
            }
            (status, _) => {
                Step::Next(self.unowned(&search, &o.instance_id, &format!("it is {status:?}")))
            }
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
            } => Facts {
                phase: "leaked",
                location: location.to_string(),
                instance_id: instance_ids.join(","),
                billing: true,
                ..Facts::default()
            },
            LaunchState::Unowned { .. } => offer_facts("unowned", None, "", false),
        }
    }

    fn retry_policy(&self, _s: &LaunchState) -> RetryPolicy {
        self.retry
    }

    fn on_retries_exhausted(&self, s: &LaunchState, last_error: String) -> LaunchState {
        let e = ProviderError::new(
            ErrorKind::Failed,
            format!("gave up after repeated errors: {last_error}"),
        );
        if let Some(end) = self.leave_unowned_or_kept(s, &e.text()) {
            return end;
        }
        if let Some((search, ids, lag, stage)) = self.attempt(s) {
            return self.on_offer_error(search.clone(), ids, lag, &e, stage);
        }
        match s {
            LaunchState::Reconciling { previous } => LaunchState::Aborted {
                reason: e.text(),
                owned: previous.clone(),
            },
            LaunchState::Planning { .. } => LaunchState::Aborted {
                reason: e.text(),
                owned: None,
            },
            LaunchState::Compensating { teardown, .. } => match teardown.owned() {
                Some(o) => LaunchState::Leaked {
                    location: o.location,
                    instance_ids: o.instance_ids,
                    reason: e.text(),
                },
                None => LaunchState::Aborted {
                    reason: e.text(),
                    owned: None,
                },
            },
            other => other.clone(),
        }
    }

    fn on_cancel(&self, s: &LaunchState) -> Option<LaunchState> {
        let reason = CANCELLED.to_string();
        if let Some(end) = self.leave_unowned_or_kept(s, &reason) {
            return Some(end);
        }
        if let Some((search, ids, lag, _)) = self.attempt(s) {
            return Some(self.compensate(
                search.clone(),
                ids,
                lag,
                reason.clone(),
                AfterCompensation::Abort { reason },
            ));
        }
        match s {
            LaunchState::Reconciling { previous } => Some(LaunchState::Aborted {
                reason,
                owned: previous.clone(),
            }),
            LaunchState::Planning { .. }
            | LaunchState::NextOffer { .. }
            | LaunchState::Exhausted { .. } => Some(LaunchState::Aborted {
                reason,
                owned: None,
            }),
            _ => None,
        }
    }

    async fn step(&self, s: &LaunchState, cx: &StepCx) -> Step<LaunchState> {
        match s {
            LaunchState::Reconciling { previous } => self.reconcile(previous, cx).await,
            LaunchState::Planning { round, preempted } => self.plan(*round, preempted).await,
            LaunchState::NextOffer { search } => {
                let mut search = search.clone();
                let next = (search.cursor + 1..search.offers.len())
                    .find(|&i| !search.is_blocked(&search.offers[i]));
                match next {
                    Some(i) => {
                        search.cursor = i;
                        Step::Next(LaunchState::Preparing { search })
                    }
                    None => Step::Next(LaunchState::Exhausted { search }),
                }
            }
            LaunchState::Exhausted { search } => {
                if cx.in_state >= self.exhausted_wait {
                    Step::Next(LaunchState::Planning {
                        round: search.round + 1,
                        preempted: search.preempted.clone(),
                    })
                } else {
                    Step::poll(
                        self.exhausted_wait - cx.in_state,
                        format!("no capacity ({}); retrying until up", search.summary()),
                    )
                }
            }
            LaunchState::Preparing { search } => {
                let Some(offer) = search.current() else {
                    return Step::Next(LaunchState::Exhausted {
                        search: search.clone(),
                    });
                };
                if search.is_blocked(offer) {
                    return Step::Next(LaunchState::NextOffer {
                        search: search.clone(),
                    });
                }
                let Some(p) = self.provider(&offer.location.cloud) else {
                    return Step::Next(LaunchState::Aborted {
                        reason: format!("no adapter for {}", offer.location.cloud),
                        owned: None,
                    });
                };
                let mut spec = self.instance_spec(search);
                let mut shared_error = None;
                if let Some(shared) = &self.shared {
                    // One preparation per object per run: the first machine that needs
                    // it prepares it, the others wait here for its answer.
                    for object in p.shared_objects(offer) {
                        match shared.ensure(&object).await {
                            Ok(found) => {
                                spec.shared.insert(object.kind.clone(), found);
                            }
                            Err(e) => {
                                shared_error = Some(e);
                                break;
                            }
                        }
                    }
                }
                let prepared = match shared_error {
                    Some(e) => Err(e),
                    None => p.prepare(offer, &spec).await,
                };
                match prepared {
                    Ok(prepared) => Step::Next(LaunchState::Creating {
                        sent: false,
                        search: search.clone(),
                        prepared,
                    }),
                    Err(e) if e.kind == ErrorKind::Transient => retry_step(e),
                    // Rejected credentials created nothing (and would fail the cleanup).
                    Err(e) if e.kind == ErrorKind::Credentials => {
                        Step::Next(LaunchState::Aborted {
                            reason: format!("prepare failed ({:?}): {}", e.kind, e.text()),
                            owned: None,
                        })
                    }
                    // Not offered here (by contract nothing was created), or the endpoint
                    // refused the connection (nothing was sent; the default scope blocks
                    // every region of the cloud at once): block and move on.
                    Err(e) if matches!(e.kind, ErrorKind::Unavailable | ErrorKind::Unreachable) => {
                        Step::Next(skip_offer(search, &e, "prepare"))
                    }
                    // Prepare may have created side resources (a security group, a
                    // firewall) before failing: they are cleaned up before the next offer
                    // (or kept for it when it is in the same region).
                    Err(e) => Step::Next(self.on_offer_error(
                        search.clone(),
                        vec![],
                        Lag::None,
                        &e,
                        "prepare",
                    )),
                }
            }
            LaunchState::Creating {
                search,
                prepared,
                sent,
            } => {
                let Some(offer) = search.current() else {
                    return Step::Next(LaunchState::Exhausted {
                        search: search.clone(),
                    });
                };
                let Some(p) = self.provider(&offer.location.cloud) else {
                    return Step::Next(LaunchState::Aborted {
                        reason: format!("no adapter for {}", offer.location.cloud),
                        owned: None,
                    });
                };
                let spec = self.instance_spec(search);
                // Journalled by this process and not sent yet: nothing listed now can be
                // this attempt's instance.
                let unsent_here = *sent
                    && self
                        .fresh_creates
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .contains(&spec.client_token);
                // Observe first: after a crash between create and its journal entry the
                // instance exists and must be adopted, not duplicated. One listed before
                // any create was sent is not this run's: it is never torn down by it.
                match p.observe(&offer.location, &self.vm.name).await {
                    // The create this process sent was refused late (its operation
                    // failed): the same as `create` returning the error.
                    Ok(seen)
                        if *sent
                            && !unsent_here
                            && !seen.iter().any(Observed::exists)
                            && refusal(&seen).is_some() =>
                    {
                        let e = refusal(&seen).expect("a refused entry");
                        return Step::Next(self.on_offer_error(
                            search.clone(),
                            vec![],
                            Lag::None,
                            &e,
                            "create",
                        ));
                    }
                    Ok(seen) => {
                        let seen = existing(seen);
                        let found = seen
                            .iter()
                            .find(|o| o.status == InstanceStatus::Running)
                            .or(seen.first());
                        if let Some(o) = found {
                            return Step::Next(LaunchState::Booting {
                                search: search.clone(),
                                instance_id: o.instance_id.clone(),
                                adopted: !*sent || unsent_here,
                                kept: None,
                            });
                        }
                    }
                    Err(e) if e.kind == ErrorKind::Unreachable && (!*sent || unsent_here) => {
                        return Step::Next(skip_offer(search, &e, "observe"));
                    }
                    Err(e) if e.kind.retried_in_place() => return retry_step(e),
                    Err(e) => {
                        return Step::Next(self.on_offer_error(
                            search.clone(),
                            vec![],
                            Lag::sweep_if(*sent),
                            &e,
                            "observe",
                        ))
                    }
                }
                // Journal the intent before the side effect; then send at once only if this
                // process journalled it. Otherwise a create may already be at the cloud
                // (its answer lost to a crash or an error), and clouds that ignore the
                // idempotency token would start a second instance: wait for the listing.
                let ours = {
                    let mut fresh = self.fresh_creates.lock().unwrap_or_else(|e| e.into_inner());
                    if *sent {
                        Some(fresh.remove(&spec.client_token))
                    } else {
                        fresh.insert(spec.client_token.clone());
                        None
                    }
                };
                let Some(ours) = ours else {
                    return Step::Next(LaunchState::Creating {
                        search: search.clone(),
                        prepared: prepared.clone(),
                        sent: true,
                    });
                };
                let caps = p.capabilities();
                if !ours && cx.in_state < caps.create_list_lag {
                    return Step::poll(
                        caps.poll_interval,
                        "an earlier create may be at the cloud; waiting for it to be listed",
                    );
                }
                match p.create(offer, prepared, &spec).await {
                    Ok(id) => Step::Next(LaunchState::Booting {
                        search: search.clone(),
                        instance_id: id,
                        adopted: false,
                        kept: None,
                    }),
                    // Refused before it was processed (a rate limit's `Retry-After`, or a
                    // connection the endpoint refused): nothing was created, so a retry
                    // may send at once. Any other error may have lost a create's answer.
                    Err(e)
                        if e.kind == ErrorKind::Transient && e.retry_after_secs.is_some()
                            || e.kind == ErrorKind::Unreachable =>
                    {
                        self.fresh_creates
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(spec.client_token.clone());
                        if e.kind == ErrorKind::Unreachable {
                            return Step::Next(skip_offer(search, &e, "create"));
                        }
                        retry_step(e)
                    }
                    Err(e) if e.kind == ErrorKind::Transient => retry_step(e),
                    Err(e) if e.kind == ErrorKind::Unavailable => {
                        Step::Next(skip_offer(search, &e, "create"))
                    }
                    Err(e) => Step::Next(self.on_offer_error(
                        search.clone(),
                        vec![],
                        Lag::None,
                        &e,
                        "create",
                    )),
                }
            }
            LaunchState::Starting { search, vm } => {
                let Some(p) = self.provider(&vm.location.cloud) else {
                    return Step::Next(self.keep(vm, "no adapter for its cloud".into()));
                };
                match p.start(&vm.location, &self.vm.name, &vm.instance_id).await {
                    Ok(()) => Step::Next(LaunchState::Booting {
                        search: search.clone(),
                        instance_id: vm.instance_id.clone(),
                        adopted: false,
                        kept: Some(vm.clone()),
                    }),
                    Err(e) if e.kind.retried_in_place() => retry_step(e),
                    // Never fail over into a second instance of a machine that exists.
                    Err(e) => Step::Next(self.keep(
                        vm,
                        format!(
                            "could not start stopped instance {} ({:?}): {}; no replacement \
                             was created",
                            vm.instance_id,
                            e.kind,
                            e.text()
                        ),
                    )),
                }
            }
            LaunchState::Booting {
                search,
                instance_id,
                adopted,
                kept,
            } => {
                let Some(offer) = search.current() else {
                    return Step::Next(LaunchState::Aborted {
                        reason: "booting without an offer".into(),
                        owned: None,
                    });
                };
                let Some(p) = self.provider(&offer.location.cloud) else {
                    return Step::Next(LaunchState::Leaked {
                        location: offer.location.clone(),
                        instance_ids: vec![instance_id.clone()],
                        reason: "no adapter".into(),
                    });
                };
                let caps = p.capabilities();
                let ids = vec![instance_id.clone()];
                // Only what this run created is compensated; the rest is kept or left.
                let fail = |e: ProviderError, stage: &str| {
                    Step::Next(match (kept, adopted) {
                        (Some(vm), _) => self.keep(vm, format!("{stage}: {}", e.text())),
                        (None, true) => self.unowned(search, instance_id, &e.text()),
                        (None, false) => {
                            self.on_offer_error(search.clone(), ids.clone(), Lag::Named, &e, stage)
                        }
                    })
                };
                let seen = match p.observe(&offer.location, &self.vm.name).await {
                    Ok(v) => v,
                    Err(e) if e.kind.retried_in_place() => return retry_step(e),
                    Err(e) => return fail(e, "observe"),
                };
                let failed = |msg: String| fail(ProviderError::new(ErrorKind::Failed, msg), "boot");
                let grace = self
                    .vanish_grace
                    .unwrap_or(caps.create_list_lag)
                    .max(caps.poll_interval);
                match seen.iter().find(|o| &o.instance_id == instance_id) {
                    Some(Observed {
                        status: InstanceStatus::Refused(e),
                        ..
                    }) => fail((**e).clone(), "create"),
                    Some(o) => match (&o.status, &o.ssh) {
                        (InstanceStatus::Running, Some(ep)) => {
                            Step::Next(LaunchState::Connecting {
                                search: search.clone(),
                                instance_id: instance_id.clone(),
                                endpoint: ep.clone(),
                                pinned: kept.as_ref().map(|vm| vm.host_key.clone()),
                                adopted: *adopted,
                            })
                        }
                        (InstanceStatus::Failed(r), _) => failed(format!("instance failed: {r}")),
                        (InstanceStatus::Preempted { signal, .. }, _) => {
                            failed(format!("instance preempted while booting: {signal}"))
                        }
                        (InstanceStatus::Stopped | InstanceStatus::Stopping, _) if *adopted => {
                            failed(format!("it is {:?}", o.status))
                        }
                        // A start was accepted; clouds report the instance stopped until
                        // it takes effect (DigitalOcean: `off` until power_on completes).
                        (InstanceStatus::Stopped | InstanceStatus::Stopping, _)
                            if kept.is_some() && cx.in_state <= caps.boot_timeout =>
                        {
                            Step::poll(
                                caps.poll_interval,
                                format!(
                                    "{instance_id} is {:?}; its start is in progress",
                                    o.status
                                ),
                            )
                        }
                        (
                            InstanceStatus::Stopped
                            | InstanceStatus::Stopping
                            | InstanceStatus::Terminating,
                            _,
                        ) => failed(format!("instance stopped while booting ({:?})", o.status)),
                        _ if cx.in_state > caps.boot_timeout => failed(format!(
                            "not running with an SSH endpoint after {}s",
                            caps.boot_timeout.as_secs()
                        )),
                        (status, _) => {
                            Step::poll(caps.poll_interval, format!("still booting ({status:?})"))
                        }
                    },
                    // Gone, and not by our hand: plan afresh (a new nonce, a new token).
                    None if (*adopted || kept.is_some()) && cx.in_state > grace => {
                        Step::Next(LaunchState::Planning {
                            round: search.round,
                            preempted: search.preempted.clone(),
                        })
                    }
                    // Clouds list a new instance with a lag: only a lasting absence counts.
                    None if cx.in_state > grace => {
                        failed(format!("instance {instance_id} vanished while booting"))
                    }
                    None => Step::poll(caps.poll_interval, "still booting (not listed yet)"),
                }
            }
            LaunchState::Connecting {
                search,
                instance_id,
                endpoint,
                pinned,
                adopted,
            } => {
                let Some(offer) = search.current() else {
                    return Step::Next(LaunchState::Aborted {
                        reason: "connecting without an offer".into(),
                        owned: None,
                    });
                };
                let caps = self
                    .provider(&offer.location.cloud)
                    .map(|p| p.capabilities())
                    .unwrap_or_default();
                let user = endpoint.user.clone().unwrap_or_else(|| "root".into());
                let owned_vm = |key: HostKey| Owned {
                    vm: self
                        .record_for(search, instance_id, endpoint, key)
                        .map(Box::new),
                    ..Owned::at(offer.location.clone(), vec![instance_id.clone()])
                };
                // A machine that was up, or one gpuprov did not create, is never deleted
                // because SSH fails; one this run created is compensated.
                let give_up = |msg: String| match (pinned, adopted) {
                    (Some(k), _) => Step::Next(LaunchState::Aborted {
                        reason: format!("{msg}; left running (`gpuprov destroy` removes it)"),
                        owned: Some(owned_vm(k.clone())),
                    }),
                    (None, true) => Step::Next(self.unowned(search, instance_id, &msg)),
                    (None, false) => {
                        let pe = ProviderError::new(ErrorKind::Failed, msg);
                        Step::Next(self.on_offer_error(
                            search.clone(),
                            vec![instance_id.clone()],
                            Lag::None,
                            &pe,
                            "connect",
                        ))
                    }
                };
                match self.connector.login(endpoint, &user, pinned.as_ref()).await {
                    Ok(key) => match self.record_for(search, instance_id, endpoint, key) {
                        Some(vm) => Step::Next(LaunchState::Ready { vm: Box::new(vm) }),
                        None => Step::Next(LaunchState::Aborted {
                            reason: "no offer".into(),
                            owned: None,
                        }),
                    },
                    Err(e @ SshError::HostKeyMismatch { .. }) => Step::Next(LaunchState::Aborted {
                        reason: e.to_string(),
                        owned: pinned.clone().map(owned_vm),
                    }),
                    Err(e @ SshError::Local(_)) => {
                        let reason = e.to_string();
                        match (pinned, adopted) {
                            (Some(k), _) => Step::Next(LaunchState::Aborted {
                                reason,
                                owned: Some(owned_vm(k.clone())),
                            }),
                            (None, true) => Step::Next(self.unowned(search, instance_id, &reason)),
                            (None, false) => Step::Next(self.compensate(
                                search.clone(),
                                vec![instance_id.clone()],
                                Lag::None,
                                reason.clone(),
                                AfterCompensation::Abort { reason },
                            )),
                        }
                    }
                    // A refused key is permanent for that key: at once on a machine this
                    // run did not just create, after a short grace on one it did
                    // (cloud-init may still be writing `authorized_keys`).
                    Err(e @ SshError::AuthRejected { .. })
                        if pinned.is_some()
                            || *adopted
                            || cx.in_state > self.auth_refused_grace.min(caps.ssh_timeout) =>
                    {
                        give_up(format!("key refused: {e}"))
                    }
                    Err(e) if cx.in_state > caps.ssh_timeout => give_up(format!(
                        "ssh not reachable after {}s: {e}",
                        caps.ssh_timeout.as_secs()
                    )),
                    // The expected wait while sshd starts: a note, not an error.
                    Err(e) => Step::poll(caps.poll_interval, format!("SSH not up yet ({e})")),
                }
            }
            LaunchState::Compensating {
                search,
                teardown,
                reason,
                after,
            } => match self.teardown.step(teardown, cx).await {
                Step::Next(TeardownState::Done) => match after {
                    AfterCompensation::NextOffer => Step::Next(LaunchState::NextOffer {
                        search: search.clone(),
                    }),
                    AfterCompensation::Replan => Step::Next(LaunchState::Planning {
                        round: search.round,
                        preempted: search.preempted.clone(),
                    }),
                    AfterCompensation::Abort { reason } => Step::Next(LaunchState::Aborted {
                        reason: reason.clone(),
                        owned: None,
                    }),
                },
                Step::Next(TeardownState::Leaked {
                    location,
                    instance_ids,
                    reason: why,
                }) => Step::Next(LaunchState::Leaked {
                    location,
                    instance_ids,
                    reason: format!("{reason}; teardown: {why}"),
                }),
                Step::Next(t) => Step::Next(LaunchState::Compensating {
                    search: search.clone(),
                    teardown: t,
                    reason: reason.clone(),
                    after: after.clone(),
                }),
                Step::Poll { after, note } => Step::Poll { after, note },
                Step::Retry { error, after } => Step::Retry { error, after },
            },
            LaunchState::Ready { .. }
            | LaunchState::Aborted { .. }
            | LaunchState::Leaked { .. }
            | LaunchState::Unowned { .. } => Step::Next(s.clone()),
        }
    }
}
