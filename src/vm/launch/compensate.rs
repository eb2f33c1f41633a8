//! Carrying out a failover decision: a step that meets a fault describes where it stands
//! ([`Site`]) and what went wrong ([`Failure`]); [`LaunchMachine::react`] asks
//! [`failover::decide`] and builds the state its [`Reaction`] names. Also the
//! compensation itself (the embedded teardown machine) and its step.

use crate::machine::{Machine, Step, StepCx};
use crate::provider::{ErrorKind, ProviderError};

use super::super::teardown::{retry_step, Target, TeardownState};
use super::super::{Owned, VmRecord};
use super::failover::{self, Fault, Holds, Reaction, Stage};
use super::state::kept;
use super::{AfterCompensation, LaunchMachine, LaunchState, Search};

/// What a compensation may find that its ids do not name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lag {
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
    pub(super) fn sweep_if(create_may_exist: bool) -> Lag {
        if create_may_exist {
            Lag::Sweep
        } else {
            Lag::None
        }
    }
}

/// How a [`Reaction::Keep`] keeps the machine.
#[derive(Debug, Clone)]
pub(super) enum Keeping {
    /// Nothing to keep: the machine stops with what the site records.
    Nothing,
    /// The recorded machine, kept with its disk; apply tries it again.
    Kept(Box<VmRecord>),
    /// The machine that was up and is being reconnected: left running, as recorded.
    Running,
}

/// Where a fault happened: the inputs of [`failover::decide`] besides the fault, and what
/// each reaction acts on.
#[derive(Debug, Clone)]
pub(super) struct Site {
    pub stage: Stage,
    pub holds: Holds,
    /// The call that failed as the history and the reasons name it (`prepare`,
    /// `observe`, `create`, `boot`, `connect`).
    pub label: &'static str,
    /// The search of the attempt (`None` before planning).
    pub search: Option<Search>,
    /// The instances the attempt is about: what a compensation deletes, what is left
    /// unowned.
    pub ids: Vec<String>,
    /// What a compensation may find that `ids` do not name.
    pub lag: Lag,
    /// What the state records when the machine stops without deleting anything
    /// (`Abort`), and what `Leak` names.
    pub record: Option<Owned>,
    pub keep: Keeping,
}

impl Site {
    /// An attempt on the current offer of `search` that records nothing of its own.
    pub fn attempt(
        stage: Stage,
        holds: Holds,
        label: &'static str,
        search: &Search,
        ids: Vec<String>,
        lag: Lag,
    ) -> Site {
        Site {
            stage,
            holds,
            label,
            search: Some(search.clone()),
            ids,
            lag,
            record: None,
            keep: Keeping::Nothing,
        }
    }

    /// The recorded machine `vm` at `stage`: a `Keep` keeps it, an `Abort` records it.
    pub fn kept(stage: Stage, label: &'static str, search: &Search, vm: &VmRecord) -> Site {
        Site {
            record: Some(kept(vm)),
            keep: Keeping::Kept(Box::new(vm.clone())),
            ..Site::attempt(
                stage,
                Holds::Kept,
                label,
                search,
                vec![vm.instance_id.clone()],
                Lag::None,
            )
        }
    }
}

/// What went wrong: its class for [`failover::decide`], the error the history records
/// (and a retry reports), and the words of a reason that stops the machine.
#[derive(Debug, Clone)]
pub(super) struct Failure {
    pub fault: Fault,
    pub error: ProviderError,
    pub why: String,
}

impl Failure {
    /// A provider error; its text is the reason.
    pub fn of(error: ProviderError) -> Failure {
        Failure {
            fault: Fault::Provider(error.kind),
            why: error.text(),
            error,
        }
    }

    /// A fault of the launch's own, with its reason (recorded as `Failed` where it is
    /// recorded at all).
    pub fn new(fault: Fault, why: impl Into<String>) -> Failure {
        let why = why.into();
        Failure {
            fault,
            error: ProviderError::new(fault.kind().unwrap_or(ErrorKind::Failed), why.clone()),
            why,
        }
    }

    /// The same failure with other words for the reason that stops the machine.
    pub fn why(self, why: impl Into<String>) -> Failure {
        Failure {
            why: why.into(),
            ..self
        }
    }
}

impl LaunchMachine {
    /// What a step does about `f` at `site`: [`Self::react`], where carrying on means
    /// running the step again.
    pub(super) fn fail(&self, site: Site, f: Failure) -> Step<LaunchState> {
        let again = Step::Retry {
            error: f.why.clone(),
            after: None,
        };
        self.react(site, f).unwrap_or(again)
    }

    /// Decides what follows `f` at `site` ([`failover::decide`]) and builds it; `None`:
    /// nothing changes ([`Reaction::Continue`]).
    pub(super) fn react(&self, site: Site, f: Failure) -> Option<Step<LaunchState>> {
        let reaction = failover::decide(site.stage, f.fault, site.holds);
        let next = match reaction {
            Reaction::Continue => return None,
            Reaction::Retry => return Some(retry_step(f.error)),
            Reaction::Replan => {
                let search = site.search.unwrap_or_default();
                LaunchState::Planning {
                    round: search.round,
                    preempted: search.preempted,
                }
            }
            Reaction::Abort => LaunchState::Aborted {
                reason: f.why,
                owned: site.record,
            },
            Reaction::Keep => match site.keep {
                Keeping::Kept(vm) => self.keep(&vm, f.why),
                Keeping::Running => LaunchState::Aborted {
                    reason: format!("{}; left running (`gpuprov destroy` removes it)", f.why),
                    owned: site.record,
                },
                Keeping::Nothing => LaunchState::Aborted {
                    reason: f.why,
                    owned: site.record,
                },
            },
            Reaction::LeaveUnowned => match (&site.search, site.ids.first()) {
                (Some(search), Some(id)) => self.unowned(search, id, &f.why),
                _ => LaunchState::Aborted {
                    reason: f.why,
                    owned: None,
                },
            },
            Reaction::Leak => match site.record {
                Some(o) => LaunchState::Leaked {
                    location: o.location,
                    instance_ids: o.instance_ids,
                    reason: f.why,
                },
                None => LaunchState::Aborted {
                    reason: f.why,
                    owned: None,
                },
            },
            Reaction::Skip | Reaction::CompensateThenNext | Reaction::CompensateThenAbort => {
                let Some(search) = site.search else {
                    return Some(Step::Next(LaunchState::Aborted {
                        reason: f.why,
                        owned: None,
                    }));
                };
                let e = &f.error;
                // The offer's outcome, its scope blocked; a fault that is not the
                // offer's (Ctrl-C, SSH on this machine) records nothing.
                let search = match f.fault.kind() {
                    Some(_) => {
                        let scope = search.current().and_then(|o| e.scope_for(o));
                        let outcome = format!("{}: {}", site.label, e.text());
                        search.record(outcome, Some(e.kind), scope)
                    }
                    None => search,
                };
                match reaction {
                    Reaction::Skip => LaunchState::NextOffer { search },
                    Reaction::CompensateThenNext => self.compensate(
                        search,
                        site.ids,
                        site.lag,
                        format!("{}: {}", site.label, e.text()),
                        AfterCompensation::NextOffer,
                    ),
                    _ => {
                        let reason = match f.fault.kind() {
                            Some(_) => {
                                format!("{} failed ({:?}): {}", site.label, e.kind, e.text())
                            }
                            None => f.why,
                        };
                        self.compensate(
                            search,
                            site.ids,
                            site.lag,
                            reason.clone(),
                            AfterCompensation::Abort { reason },
                        )
                    }
                }
            }
        };
        Some(Step::Next(next))
    }

    /// Where state `s` stands, for a fault that is not its step's (Ctrl-C, a spent retry
    /// budget); `None` for the terminal states.
    pub(super) fn site_of(&self, s: &LaunchState) -> Option<Site> {
        let attempt = Site::attempt;
        Some(match s {
            LaunchState::Reconciling { previous } => Site {
                stage: Stage::Reconcile,
                holds: match previous {
                    None => Holds::Nothing,
                    Some(p) if p.adopted => Holds::Adopted,
                    Some(_) => Holds::Kept,
                },
                label: "reconcile",
                search: None,
                ids: vec![],
                lag: Lag::None,
                record: previous.clone(),
                keep: Keeping::Nothing,
            },
            LaunchState::Planning { .. } => Site {
                search: None,
                ..attempt(
                    Stage::Plan,
                    Holds::Nothing,
                    "plan",
                    &Search::default(),
                    vec![],
                    Lag::None,
                )
            },
            LaunchState::NextOffer { search } | LaunchState::Exhausted { search } => attempt(
                Stage::Plan,
                Holds::Nothing,
                "plan",
                search,
                vec![],
                Lag::None,
            ),
            LaunchState::Preparing { search } => attempt(
                Stage::Prepare,
                Holds::Nothing,
                "prepare",
                search,
                vec![],
                Lag::None,
            ),
            LaunchState::Creating { search, sent, .. } => {
                let holds = if *sent {
                    Holds::CreateSent
                } else {
                    Holds::Nothing
                };
                attempt(
                    Stage::Create,
                    holds,
                    "create",
                    search,
                    vec![],
                    Lag::sweep_if(*sent),
                )
            }
            LaunchState::Starting { search, vm } => Site::kept(Stage::Start, "start", search, vm),
            LaunchState::Booting {
                search,
                kept: Some(vm),
                ..
            } => Site::kept(Stage::Boot, "boot", search, vm),
            LaunchState::Booting {
                search,
                instance_id,
                adopted,
                ..
            } => {
                let holds = if *adopted {
                    Holds::Adopted
                } else {
                    Holds::Created
                };
                let ids = vec![instance_id.clone()];
                attempt(Stage::Boot, holds, "boot", search, ids, Lag::Named)
            }
            LaunchState::Connecting {
                search,
                instance_id,
                endpoint,
                pinned,
                adopted,
            } => {
                let ids = vec![instance_id.clone()];
                let site =
                    |holds| attempt(Stage::Connect, holds, "connect", search, ids, Lag::None);
                match (adopted, pinned) {
                    (true, _) => site(Holds::Adopted),
                    (false, Some(key)) => Site {
                        keep: self
                            .record_for(search, instance_id, endpoint, key.clone())
                            .map_or(Keeping::Nothing, |vm| Keeping::Kept(Box::new(vm))),
                        ..site(Holds::Kept)
                    },
                    (false, None) => site(Holds::Created),
                }
            }
            LaunchState::Compensating {
                search, teardown, ..
            } => Site {
                record: teardown.owned(),
                ..attempt(
                    Stage::Compensate,
                    Holds::Created,
                    "compensate",
                    search,
                    vec![],
                    Lag::None,
                )
            },
            LaunchState::Ready { .. }
            | LaunchState::Aborted { .. }
            | LaunchState::Leaked { .. }
            | LaunchState::Unowned { .. } => return None,
        })
    }

    /// Tears down what the current attempt may own, then goes on as `after` says: `ids`,
    /// the side resources, and — only with [`Lag::Sweep`] (a create of this attempt may
    /// be at the cloud, unlisted or with its answer lost) — anything listed with the
    /// identity there, after the cloud's listing lag. Otherwise nothing but `ids` is
    /// deleted: an instance this run did not create is never swept. Side resources are
    /// kept when the next offer is in the same cloud and region (it reuses them).
    pub(super) fn compensate(
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

    /// Leaves an instance gpuprov did not create untouched, saying why and what to do.
    pub(super) fn unowned(&self, search: &Search, instance_id: &str, why: &str) -> LaunchState {
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
    pub(super) fn keep(&self, vm: &VmRecord, why: String) -> LaunchState {
        LaunchState::Aborted {
            reason: format!(
                "{why}; instance {} at {} was kept (apply tries again; `gpuprov destroy` \
                 removes it)",
                vm.instance_id, vm.location
            ),
            owned: Some(kept(vm)),
        }
    }

    /// `Compensating`: one step of the embedded teardown, then what `after` says once it
    /// is done.
    pub(super) async fn compensating(
        &self,
        search: &Search,
        teardown: &TeardownState,
        reason: &str,
        after: &AfterCompensation,
        cx: &StepCx,
    ) -> Step<LaunchState> {
        match self.teardown.step(teardown, cx).await {
            Step::Next(TeardownState::Done) => Step::Next(match after {
                AfterCompensation::NextOffer => LaunchState::NextOffer {
                    search: search.clone(),
                },
                AfterCompensation::Replan => LaunchState::Planning {
                    round: search.round,
                    preempted: search.preempted.clone(),
                },
                AfterCompensation::Abort { reason } => LaunchState::Aborted {
                    reason: reason.clone(),
                    owned: None,
                },
            }),
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
                reason: reason.to_string(),
                after: after.clone(),
            }),
            Step::Poll { after, note } => Step::Poll { after, note },
            Step::Retry { error, after } => Step::Retry { error, after },
        }
    }
}
