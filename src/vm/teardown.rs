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

use crate::machine::{Machine, RetryPolicy, Step, StepCx};
use crate::provider::{CloudProvider, ErrorKind, Location, Providers};

use super::Owned;

/// What to tear down.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Target {
    pub location: Location,
    pub vm_name: String,
    #[serde(default)]
    pub instance_ids: Vec<String>,
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
                location: target.location.clone(),
                instance_ids: target.instance_ids.clone(),
                vm: None,
            }),
            TeardownState::Leaked {
                location,
                instance_ids,
                ..
            } => Some(Owned {
                location: location.clone(),
                instance_ids: instance_ids.clone(),
                vm: None,
            }),
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
                    Ok(v) => v,
                    Err(e) if e.kind == ErrorKind::Transient => return retry_step(e),
                    Err(e) => return Step::Next(Self::leaked(target, e.msg)),
                };
                let ids = union(
                    &target.instance_ids,
                    seen.into_iter().map(|o| o.instance_id),
                );
                let target = Target {
                    instance_ids: ids,
                    ..target.clone()
                };
                if target.instance_ids.is_empty() {
                    return Step::Next(TeardownState::CleaningUp { target });
                }
                match p
                    .delete(&target.location, &target.vm_name, &target.instance_ids)
                    .await
                {
                    Ok(()) => Step::Next(TeardownState::AwaitingGone { target }),
                    Err(e) if e.kind == ErrorKind::Transient => retry_step(e),
                    Err(e) => Step::Next(Self::leaked(&target, e.msg)),
                }
            }
            TeardownState::AwaitingGone { target } => {
                let p = match self.provider(&target.location) {
                    Ok(p) => p,
                    Err(e) => return Step::Next(Self::leaked(target, e)),
                };
                let caps = p.capabilities();
                let seen = match p.observe(&target.location, &target.vm_name).await {
                    Ok(v) => v,
                    Err(e) if e.kind == ErrorKind::Transient => return retry_step(e),
                    Err(e) => return Step::Next(Self::leaked(target, e.msg)),
                };
                if seen.is_empty() {
                    return Step::Next(TeardownState::CleaningUp {
                        target: target.clone(),
                    });
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
                    Err(e) if e.kind == ErrorKind::Transient => retry_step(e),
                    Err(e) => {
                        Step::Next(Self::leaked(target, format!("cleanup failed: {}", e.msg)))
                    }
                }
            }
            TeardownState::Done | TeardownState::Leaked { .. } => Step::Next(s.clone()),
        }
    }
}

/// The executor step for a transient provider error, honouring its `Retry-After`.
pub(crate) fn retry_step<S>(e: crate::provider::ProviderError) -> Step<S> {
    Step::Retry {
        error: e.msg,
        after: e.retry_after_secs.map(Duration::from_secs),
    }
}
