//! The teardown machine (design 4.4): Requesting → AwaitingGone → CleaningUp → Done, or
//! Leaked. Used standalone by `destroy` and embedded by the launch machine's Compensating
//! state, so one teardown implementation serves both.
//!
//! Only the provider's confirmation (the instance is no longer observed at its location)
//! lets a resource leave the state: an unreachable API or a failing delete ends in
//! `Leaked`, never in `Done`.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::machine::{Facts, Machine, Providers, RetryPolicy, Step, StepCx};
use crate::provider::{CloudProvider, ErrorKind, Location};

use super::Owned;

/// What to tear down.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Target {
    pub location: Location,
    pub vm_name: String,
    #[serde(default)]
    pub instance_ids: Vec<String>,
    /// A create may be at the cloud but not listed yet (an interrupted or just-answered
    /// create): an empty listing, or a delete answered "not found", is trusted only once
    /// the cloud's `create_list_lag` has passed in `AwaitingGone`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub settle: bool,
    /// Leave the per-VM side resources (security group, firewall) in place: the launch
    /// machine's next offer is in the same cloud and region and reuses them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_side_resources: bool,
    /// Delete only `instance_ids`, never other instances listed with the identity (a
    /// compensation where this run created nothing unnamed: anything else listed there
    /// is not its to delete). Off for `destroy` and for a create that may be unlisted,
    /// which sweep every instance carrying the identity at the location.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub named_only: bool,
}

impl Target {
    /// Tears down `instance_ids` of `vm_name` at `location` and its side resources.
    pub fn new(location: Location, vm_name: &str, instance_ids: Vec<String>) -> Target {
        Target {
            location,
            vm_name: vm_name.to_string(),
            instance_ids,
            settle: false,
            keep_side_resources: false,
            named_only: false,
        }
    }

    /// Whether `id` is this teardown's to delete.
    fn covers(&self, id: &str) -> bool {
        !self.named_only || self.instance_ids.iter().any(|i| i == id)
    }

    /// What a record's [`Owned`] says to tear down.
    pub fn of(owned: Owned, vm_name: &str) -> Target {
        Target {
            settle: owned.unsettled,
            ..Target::new(owned.location, vm_name, owned.instance_ids)
        }
    }
}

/// The teardown machine's journalled state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum TeardownState {
    Requesting {
        target: Target,
    },
    AwaitingGone {
        target: Target,
    },
    CleaningUp {
        target: Target,
    },
    Done,
    /// Teardown could not be confirmed: the resources may still exist and bill. Terminal
    /// for this run; the next apply or destroy starts by tearing them down again.
    Leaked {
        location: Location,
        instance_ids: Vec<String>,
        reason: String,
    },
}

impl TeardownState {
    /// The resources this state may still own.
    pub fn owned(&self) -> Option<Owned> {
        match self {
            TeardownState::Requesting { target }
            | TeardownState::AwaitingGone { target }
            | TeardownState::CleaningUp { target } => Some(Owned {
                unsettled: target.settle,
                ..Owned::at(target.location.clone(), target.instance_ids.clone())
            }),
            TeardownState::Leaked {
                location,
                instance_ids,
                ..
            } => Some(Owned::at(location.clone(), instance_ids.clone())),
            TeardownState::Done => None,
        }
    }
}

/// Tears down one machine's instances and side resources.
pub struct TeardownMachine {
    pub providers: Providers,
    pub retry: RetryPolicy,
    /// Overrides the provider's `delete_timeout` (tests).
    pub delete_timeout: Option<Duration>,
}

impl TeardownMachine {
    pub fn new(providers: Providers) -> Self {
        TeardownMachine {
            providers,
            retry: RetryPolicy::default(),
            delete_timeout: None,
        }
    }

    fn provider(&self, loc: &Location) -> Result<&std::sync::Arc<dyn CloudProvider>, String> {
        self.providers.get(&loc.cloud).ok_or_else(|| {
            format!("no adapter for cloud '{}' is available in this run, so its resources cannot be removed", loc.cloud)
        })
    }

    /// Once the instances are gone: clean up the side resources unless the next offer
    /// reuses them.
    fn after_gone(target: Target) -> TeardownState {
        if target.keep_side_resources {
            TeardownState::Done
        } else {
            TeardownState::CleaningUp { target }
        }
    }

    fn leaked(target: &Target, reason: String) -> TeardownState {
        TeardownState::Leaked {
            location: target.location.clone(),
            instance_ids: target.instance_ids.clone(),
            reason,
        }
    }
}

fn union(a: &[String], b: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out = a.to_vec();
    for id in b {
        if !out.contains(&id) {
            out.push(id);
        }
    }
    out
}

#[async_trait]
impl Machine for TeardownMachine {
    type State = TeardownState;
    const KIND: &'static str = "teardown";

    fn is_terminal(&self, s: &TeardownState) -> bool {
        matches!(s, TeardownState::Done | TeardownState::Leaked { .. })
    }

    fn label(&self, s: &TeardownState) -> String {
        match s {
            TeardownState::Requesting { target } => format!("deleting at {}", target.location),
            TeardownState::AwaitingGone { target } => {
                format!(
                    "awaiting deletion of {} at {}",
                    target.instance_ids.join(","),
                    target.location
                )
            }
            TeardownState::CleaningUp { target } => format!("cleaning up at {}", target.location),
            TeardownState::Done => "destroyed".into(),
            TeardownState::Leaked {
                location,
                instance_ids,
                reason,
            } => {
                format!("leaked {} at {location}: {reason}", instance_ids.join(","))
            }
        }
    }

    fn facts(&self, s: &TeardownState) -> Facts {
        let at = |phase, target: &Target, billing| Facts {
            phase,
            location: target.location.to_string(),
            instance_id: target.instance_ids.join(","),
            billing,
            ..Facts::default()
        };
        match s {
            TeardownState::Requesting { target } => at("deleting", target, true),
            TeardownState::AwaitingGone { target } => at("deleting", target, true),
            TeardownState::CleaningUp { target } => at("cleaning up", target, false),
            TeardownState::Done => Facts {
                phase: "destroyed",
                ..Facts::default()
            },
            TeardownState::Leaked {
                location,
                instance_ids,
                ..
            } => Facts::leaked(location, instance_ids),
        }
    }

    fn retry_policy(&self, _s: &TeardownState) -> RetryPolicy {
        self.retry
    }

    fn on_retries_exhausted(&self, s: &TeardownState, last_error: String) -> TeardownState {
        match s {
            TeardownState::Requesting { target }
            | TeardownState::AwaitingGone { target }
            | TeardownState::CleaningUp { target } => Self::leaked(
                target,
                format!("gave up after repeated errors: {last_error}"),
            ),
            other => other.clone(),
        }
    }

    async fn step(&self, s: &TeardownState, cx: &StepCx) -> Step<TeardownState> {
        match s {
            TeardownState::Requesting { target } => {
                let p = match self.provider(&target.location) {
                    Ok(p) => p,
                    Err(e) => return Step::Next(Self::leaked(target, e)),
                };
                // Observe first: a crash may have left instances the record never heard of.
                let seen = match p.observe(&target.location, &target.vm_name).await {
                    Ok(v) => crate::provider::existing(v),
                    Err(e) if e.kind.retried_in_place() => return retry_step(e),
                    Err(e) => return Step::Next(Self::leaked(target, e.text())),
                };
                let ids = union(
                    &target.instance_ids,
                    seen.into_iter()
                        .map(|o| o.instance_id)
                        .filter(|id| target.covers(id)),
                );
                let target = Target {
                    instance_ids: ids,
                    ..target.clone()
                };
                if target.instance_ids.is_empty() {
                    // Nothing listed yet may still be a create the listing has not caught
                    // up with: wait for it in AwaitingGone.
                    return Step::Next(if target.settle && !target.named_only {
                        TeardownState::AwaitingGone { target }
                    } else {
                        Self::after_gone(target)
                    });
                }
                match p
                    .delete(&target.location, &target.vm_name, &target.instance_ids)
                    .await
                {
                    Ok(()) => Step::Next(TeardownState::AwaitingGone { target }),
                    Err(e) if e.kind.retried_in_place() => retry_step(e),
                    Err(e) => Step::Next(Self::leaked(&target, e.text())),
                }
            }
            TeardownState::AwaitingGone { target } => {
                let p = match self.provider(&target.location) {
                    Ok(p) => p,
                    Err(e) => return Step::Next(Self::leaked(target, e)),
                };
                let caps = p.capabilities();
                let seen: Vec<_> = match p.observe(&target.location, &target.vm_name).await {
                    Ok(v) => crate::provider::existing(v)
                        .into_iter()
                        .filter(|o| target.covers(&o.instance_id))
                        .collect(),
                    Err(e) if e.kind.retried_in_place() => return retry_step(e),
                    Err(e) => return Step::Next(Self::leaked(target, e.text())),
                };
                if seen.is_empty() {
                    // An instance created moments ago may be invisible to both the delete
                    // ("not found") and the listing: only a lasting absence counts.
                    if target.settle && cx.in_state < caps.create_list_lag {
                        return Step::poll(
                            caps.poll_interval,
                            "a create may not be listed yet; waiting before trusting an empty list",
                        );
                    }
                    return Step::Next(Self::after_gone(target.clone()));
                }
                if let Some(new) = seen
                    .iter()
                    .find(|o| !target.instance_ids.contains(&o.instance_id))
                {
                    // Something the delete request did not name (created by an interrupted
                    // attempt): request its deletion too.
                    let ids = union(&target.instance_ids, [new.instance_id.clone()]);
                    return Step::Next(TeardownState::Requesting {
                        target: Target {
                            instance_ids: ids,
                            ..target.clone()
                        },
                    });
                }
                let deadline = self.delete_timeout.unwrap_or(caps.delete_timeout);
                if cx.in_state > deadline {
                    return Step::Next(Self::leaked(
                        target,
                        format!(
                            "still present {}s after the delete request",
                            deadline.as_secs()
                        ),
                    ));
                }
                Step::poll(
                    caps.poll_interval,
                    format!("waiting for {} to go", target.instance_ids.join(",")),
                )
            }
            TeardownState::CleaningUp { target } => {
                let p = match self.provider(&target.location) {
                    Ok(p) => p,
                    Err(e) => return Step::Next(Self::leaked(target, e)),
                };
                match p.cleanup(&target.location, &target.vm_name).await {
                    Ok(()) => Step::Next(TeardownState::Done),
                    // Something still uses a side resource: evidence of an instance the
                    // listing did not show. Look again and delete it, else retry (budgeted).
                    Err(e) if e.kind == ErrorKind::InUse => {
                        match p.observe(&target.location, &target.vm_name).await {
                            Ok(seen)
                                if seen
                                    .iter()
                                    .any(|o| o.exists() && target.covers(&o.instance_id)) =>
                            {
                                Step::Next(TeardownState::Requesting {
                                    target: Target {
                                        instance_ids: union(
                                            &target.instance_ids,
                                            seen.into_iter()
                                                .map(|o| o.instance_id)
                                                .filter(|id| target.covers(id)),
                                        ),
                                        ..target.clone()
                                    },
                                })
                            }
                            // In use by an instance this teardown must leave alone: the
                            // side resources stay with it.
                            Ok(seen) if !seen.is_empty() => Step::Next(TeardownState::Done),
                            Ok(_) => retry_step(e),
                            Err(oe) if oe.kind.retried_in_place() => retry_step(oe),
                            Err(oe) => Step::Next(Self::leaked(target, oe.text())),
                        }
                    }
                    Err(e) if e.kind.retried_in_place() => retry_step(e),
                    Err(e) => Step::Next(Self::leaked(
                        target,
                        format!("cleanup failed: {}", e.text()),
                    )),
                }
            }
            TeardownState::Done | TeardownState::Leaked { .. } => Step::Next(s.clone()),
        }
    }
}

/// The executor step for a transient provider error, honouring its `Retry-After`.
pub(crate) fn retry_step<S>(e: crate::provider::ProviderError) -> Step<S> {
    Step::Retry {
        error: e.text(),
        after: e.retry_after_secs.map(Duration::from_secs),
    }
}
