//! The steps that look at what the previous run left: `Reconciling` (reuse, restart or
//! replace the recorded machine; take over an instance left unowned) and `Starting`
//! (restart before replace).

use crate::machine::{Step, StepCx};
use crate::provider::{
    existing, CloudProvider, ErrorKind, Feature, InstanceStatus, Offer, ProviderError,
};

use super::super::teardown::{Target, TeardownState};
use super::super::{Owned, Preemption, VmRecord};
use super::compensate::{Failure, Keeping, Lag, Site};
use super::failover::{Fault, Holds, Stage};
use super::{AfterCompensation, LaunchMachine, LaunchState, Search};

impl LaunchMachine {
    /// `Reconciling`: plans afresh when nothing was left; otherwise reconnects to the
    /// recorded machine that still runs, restarts it when stopped, replaces it when it is
    /// failing or preempted, and tears down what an earlier run left half made.
    pub(super) async fn reconcile(
        &self,
        previous: &Option<Owned>,
        cx: &StepCx,
    ) -> Step<LaunchState> {
        let Some(prev) = previous else {
            return Step::Next(LaunchState::Planning {
                round: 0,
                preempted: vec![],
            });
        };
        let Some(p) = self.provider(&prev.location.cloud) else {
            let why = format!("no adapter for cloud '{}' in this run", prev.location.cloud);
            return self.fail(previous_site(prev), Failure::new(Fault::NoAdapter, why));
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
            Err(e) => return self.fail(previous_site(prev), Failure::of(e)),
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
                    let msg = format!(
                        "instance {} is still stopping after {}s",
                        vm.instance_id,
                        caps.delete_timeout.as_secs()
                    );
                    let e = ProviderError::new(ErrorKind::Failed, msg);
                    return self.fail(
                        Site::kept(Stage::Start, "start", &search, vm),
                        Failure::of(e),
                    );
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
                    // What `start` answers on such a cloud (the contract: `Unavailable`).
                    let msg = format!(
                        "instance {} is stopped and {} cannot start instances through its \
                         API: start it yourself and apply again",
                        vm.instance_id, vm.location.cloud
                    );
                    let e = ProviderError::new(ErrorKind::Unavailable, msg);
                    self.fail(
                        Site::kept(Stage::Start, "start", &search, vm),
                        Failure::of(e),
                    )
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
            Err(e) => return self.fail(previous_site(prev), Failure::of(e)),
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
            // It cannot boot as it is: what `Booting` does with an adopted instance
            // that stops.
            (status, _) => {
                let e = ProviderError::new(ErrorKind::Failed, format!("it is {status:?}"));
                let ids = vec![o.instance_id.clone()];
                let site =
                    Site::attempt(Stage::Boot, Holds::Adopted, "boot", &search, ids, Lag::None);
                self.fail(site, Failure::of(e))
            }
        }
    }

    /// `Starting`: starts the recorded machine that is stopped; a start that fails keeps
    /// it and never fails over into a second instance of the same machine.
    pub(super) async fn start(&self, search: &Search, vm: &VmRecord) -> Step<LaunchState> {
        let site = Site::kept(Stage::Start, "start", search, vm);
        let Some(p) = self.provider(&vm.location.cloud) else {
            return self.fail(
                site,
                Failure::new(Fault::NoAdapter, "no adapter for its cloud"),
            );
        };
        match p.start(&vm.location, &self.vm.name, &vm.instance_id).await {
            Ok(()) => Step::Next(LaunchState::Booting {
                search: search.clone(),
                instance_id: vm.instance_id.clone(),
                adopted: false,
                kept: Some(Box::new(vm.clone())),
            }),
            Err(e) => {
                let why = format!(
                    "could not start stopped instance {} ({:?}): {}; no replacement was created",
                    vm.instance_id,
                    e.kind,
                    e.text()
                );
                self.fail(site, Failure::of(e).why(why))
            }
        }
    }
}

/// The previous run's record `prev`, at `Reconciling`: an `Abort` keeps it as it was, a
/// `Leak` names it.
fn previous_site(prev: &Owned) -> Site {
    Site {
        stage: Stage::Reconcile,
        holds: if prev.adopted {
            Holds::Adopted
        } else {
            Holds::Kept
        },
        label: "observe",
        search: None,
        ids: prev.instance_ids.clone(),
        lag: Lag::None,
        record: Some(prev.clone()),
        keep: Keeping::Nothing,
    }
}
