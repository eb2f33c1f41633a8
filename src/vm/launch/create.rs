//! The steps that get an instance: `Planning` (offers from every cloud), `NextOffer`,
//! `Exhausted`, `Preparing` (shared objects and side resources) and `Creating` (find by
//! identity, journal the intent, create).

use crate::machine::{Step, StepCx};
use crate::provider::{existing, BlockScope, ErrorKind, InstanceStatus, Observed, ProviderError};

use super::super::teardown::retry_step;
use super::super::Preemption;
use super::compensate::{Failure, Lag, Site};
use super::failover::{self, Fault, Holds, Reaction, Stage};
use super::search::new_nonce;
use super::{Attempt, LaunchMachine, LaunchState, Search};

/// The classified error of the first late-refused create in an `observe` answer.
fn refusal(seen: &[Observed]) -> Option<ProviderError> {
    seen.iter().find_map(|o| match &o.status {
        InstanceStatus::Refused(e) => Some((**e).clone()),
        _ => None,
    })
}

impl LaunchMachine {
    /// `Planning`: every cloud's offers for the ask, in the core's order, within the
    /// price cap, the recently preempted ones last. A cloud that fails is left out as
    /// [`failover::decide`] says; no offer at all ends `Exhausted`, or `Aborted` when
    /// every failing cloud said abort.
    pub(super) async fn plan(&self, round: u32, preempted: &[Preemption]) -> Step<LaunchState> {
        let req = self.vm.request();
        let mut offers = Vec::new();
        let mut fatal = Vec::new();
        let mut other = Vec::new();
        for cloud in &self.vm.clouds {
            let (fault, msg, error) = match self.provider(cloud.as_str()) {
                None => (
                    Fault::NoAdapter,
                    format!("{cloud}: no adapter available"),
                    None,
                ),
                Some(p) => match p.plan(&req).await {
                    Ok(mut list) => {
                        crate::provider::offers::order(&mut list, &req, &p.capabilities());
                        offers.extend(list.into_iter().filter(|o| {
                            self.vm
                                .max_price_per_hour
                                .is_none_or(|max| o.price_per_hour <= max)
                        }));
                        continue;
                    }
                    Err(e) => (
                        Fault::Provider(e.kind),
                        format!("{cloud}: {}", e.text()),
                        Some(e),
                    ),
                },
            };
            match failover::decide(Stage::Plan, fault, Holds::Nothing) {
                Reaction::Retry => {
                    return retry_step(error.unwrap_or_else(|| ProviderError::transient(msg)))
                }
                Reaction::Abort | Reaction::CompensateThenAbort => fatal.push(msg),
                _ => other.push(msg),
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

    /// `NextOffer`: the next offer no block covers, `Exhausted` when none is left, or
    /// `Aborted` when every attempt was refused by a cloud's account (no wait cures it).
    pub(super) fn next_offer(&self, search: &Search) -> Step<LaunchState> {
        Step::Next(match search.advanced() {
            Some(search) => LaunchState::Preparing { search },
            None if search.only_account_refusals() => LaunchState::Aborted {
                reason: format!("every cloud refused the account: {}", search.summary()),
                owned: None,
            },
            None => LaunchState::Exhausted {
                search: search.clone(),
            },
        })
    }

    /// `Exhausted` with `retry_until_up`: plans a new round after the wait.
    pub(super) fn exhausted(&self, search: &Search, cx: &StepCx) -> Step<LaunchState> {
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

    /// `Preparing`: the shared objects the offer needs, then the adapter's `prepare`
    /// (side resources such as a security group or a firewall).
    pub(super) async fn prepare(&self, search: &Search) -> Step<LaunchState> {
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
        // Prepare may have created side resources before failing: a compensation cleans
        // them up (or keeps them for a next offer in the same region).
        let site = Site::attempt(
            Stage::Prepare,
            Holds::Nothing,
            "prepare",
            search,
            vec![],
            Lag::None,
        );
        let Some(p) = self.provider(&offer.location.cloud) else {
            let why = format!("no adapter for {}", offer.location.cloud);
            return self.fail(site, Failure::new(Fault::NoAdapter, why));
        };
        let mut spec = self.instance_spec(search);
        let mut shared_error = None;
        if let Some(shared) = &self.shared {
            // One preparation per object per run: the first machine that needs it
            // prepares it, the others wait here for its answer.
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
            Err(e) => {
                let why = format!("prepare failed ({:?}): {}", e.kind, e.text());
                self.fail(site, Failure::of(e).why(why))
            }
        }
    }

    /// `Creating`: finds an instance carrying the identity first (a create whose answer
    /// was lost is adopted, never duplicated), journals the intent, then creates.
    pub(super) async fn create(
        &self,
        search: &Search,
        prepared: &serde_json::Value,
        sent: bool,
        cx: &StepCx,
    ) -> Step<LaunchState> {
        let Some(offer) = search.current() else {
            return Step::Next(LaunchState::Exhausted {
                search: search.clone(),
            });
        };
        let site =
            |stage, holds, label, lag| Site::attempt(stage, holds, label, search, vec![], lag);
        let Some(p) = self.provider(&offer.location.cloud) else {
            let holds = if sent {
                Holds::CreateSent
            } else {
                Holds::Nothing
            };
            let why = format!("no adapter for {}", offer.location.cloud);
            let site = site(Stage::Create, holds, "create", Lag::sweep_if(sent));
            return self.fail(site, Failure::new(Fault::NoAdapter, why));
        };
        let spec = self.instance_spec(search);
        // Journalled by this process and not sent yet: nothing listed now can be this
        // attempt's instance.
        let unsent_here = sent
            && self
                .fresh_creates
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&spec.client_token);
        let may_be_sent = sent && !unsent_here;
        // Observe first: after a crash between create and its journal entry the instance
        // exists and must be adopted, not duplicated. One listed before any create was
        // sent is not this run's: it is never torn down by it.
        let seen = match p.observe(&offer.location, &self.vm.name).await {
            Ok(seen) => seen,
            Err(e) => {
                let holds = if may_be_sent {
                    Holds::CreateSent
                } else {
                    Holds::Nothing
                };
                let site = site(Stage::Find, holds, "observe", Lag::sweep_if(sent));
                return self.fail(site, Failure::of(e));
            }
        };
        // The create this process sent was refused late (its operation failed): the
        // same as `create` returning the error.
        if may_be_sent && !seen.iter().any(Observed::exists) {
            if let Some(e) = refusal(&seen) {
                let site = site(Stage::Refused, Holds::CreateSent, "create", Lag::None);
                return self.fail(site, Failure::of(e));
            }
        }
        let seen = existing(seen);
        let found = seen
            .iter()
            .find(|o| o.status == InstanceStatus::Running)
            .or(seen.first());
        if let Some(o) = found {
            return Step::Next(LaunchState::Booting {
                search: search.clone(),
                instance_id: o.instance_id.clone(),
                adopted: !may_be_sent,
                kept: None,
            });
        }
        // Journal the intent before the side effect; then send at once only if this
        // process journalled it. Otherwise a create may already be at the cloud (its
        // answer lost to a crash or an error), and clouds that ignore the idempotency
        // token would start a second instance: wait for the listing.
        let ours = {
            let mut fresh = self.fresh_creates.lock().unwrap_or_else(|e| e.into_inner());
            if sent {
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
            Err(e) => {
                // Refused before it was processed (a rate limit's `Retry-After`, or a
                // connection the endpoint refused): nothing was created, so a retry may
                // send at once. Any other error may have lost a create's answer; a
                // classified refusal made nothing.
                let unprocessed = e.kind == ErrorKind::Transient && e.retry_after_secs.is_some()
                    || e.kind == ErrorKind::Unreachable;
                if unprocessed {
                    self.fresh_creates
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(spec.client_token.clone());
                }
                let answer_lost = e.kind == ErrorKind::Transient && !unprocessed;
                let holds = if answer_lost {
                    Holds::CreateSent
                } else {
                    Holds::Nothing
                };
                self.fail(
                    site(Stage::Create, holds, "create", Lag::None),
                    Failure::of(e),
                )
            }
        }
    }
}
