//! Shared prerequisites as resources of their own ([`crate::provider::shared`]): the
//! machine that prepares one (Observing → Creating → Ready), the one that tears it down
//! after the last machine using it is gone (Observing → Deleting → Deleted), and
//! [`SharedObjects`], the run's single-flight guard that lets exactly one launch prepare
//! each object while the others wait for it.
//!
//! Each object is journalled under its address (`shared.<cloud>.<kind>`, in the state's
//! `shared` records) like any resource, so the invariants hold: the intent to create is
//! durable before the create, every step observes before it acts (a create whose answer
//! was lost is found, not repeated), and only an object gpuprov made for this lineage
//! ([`SharedFound::ours`], decided by the name it derives) is ever deleted; the user's
//! own key, found by value, is used and kept.
//!
//! Why created on demand rather than planned per region: a machine's cloud and region
//! are chosen at launch, with failover, so the object a machine needs is known only
//! when it reaches `Preparing`. The first machine to need it runs its machine; the
//! others wait on the same guard (through the graph's edge, not by retrying a conflict).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::machine::{ExecError, Executor, Machine, PrevRecord, Providers, Step, StepCx};
use crate::provider::{CloudProvider, ErrorKind, ProviderError, SharedFound, SharedObject};

use super::teardown::retry_step;

/// The journal kind of a shared object's preparation.
pub const KIND: &str = "shared";
/// The journal kind of a shared object's teardown.
pub const TEARDOWN_KIND: &str = "shared_teardown";

/// The preparation of one shared object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum SharedState {
    /// Looking for it (by value or by the name gpuprov derives).
    Observing { object: SharedObject },
    /// Intent journalled: not found, creating it. Observes again first, so a create whose
    /// answer was lost is adopted; a conflict answer (`Exists`) is observed again too.
    Creating { object: SharedObject },
    /// It exists; machines use `found.id`.
    Ready {
        object: SharedObject,
        found: SharedFound,
    },
    /// It could not be prepared (`kind` is the last error's, so the machines waiting on
    /// it react as to a failed prepare). Holds nothing at the cloud that is not also
    /// found by observing.
    Failed {
        object: SharedObject,
        kind: ErrorKind,
        reason: String,
    },
}

impl SharedState {
    /// The object this record is about.
    pub fn object(&self) -> &SharedObject {
        match self {
            SharedState::Observing { object }
            | SharedState::Creating { object }
            | SharedState::Ready { object, .. }
            | SharedState::Failed { object, .. } => object,
        }
    }
}

/// Prepares one shared object through its adapter.
pub struct SharedMachine {
    pub providers: Providers,
    /// The project's OpenSSH public key (keys are found by value).
    pub public_key: String,
}

impl SharedMachine {
    fn provider(&self, object: &SharedObject) -> Result<&Arc<dyn CloudProvider>, String> {
        self.providers
            .get(&object.cloud)
            .ok_or_else(|| format!("no adapter for {}", object.cloud))
    }
}

fn failed(object: &SharedObject, e: &ProviderError) -> SharedState {
    SharedState::Failed {
        object: object.clone(),
        kind: e.kind,
        reason: e.text(),
    }
}

#[async_trait]
impl Machine for SharedMachine {
    type State = SharedState;
    const KIND: &'static str = KIND;

    fn is_terminal(&self, s: &SharedState) -> bool {
        matches!(s, SharedState::Ready { .. } | SharedState::Failed { .. })
    }

    fn label(&self, s: &SharedState) -> String {
        match s {
            SharedState::Observing { object } => format!("observing {}", object.address()),
            SharedState::Creating { object } => format!("creating {}", object.address()),
            SharedState::Ready { found, .. } if found.ours => format!("ready {}", found.name),
            SharedState::Ready { found, .. } => format!("using existing {}", found.name),
            SharedState::Failed { reason, .. } => format!("failed: {reason}"),
        }
    }

    async fn step(&self, s: &SharedState, _cx: &StepCx) -> Step<SharedState> {
        let object = s.object();
        let p = match self.provider(object) {
            Ok(p) => p,
            Err(reason) => {
                return Step::Next(SharedState::Failed {
                    object: object.clone(),
                    kind: ErrorKind::InvalidRequest,
                    reason,
                })
            }
        };
        match s {
            SharedState::Observing { .. } | SharedState::Creating { .. } => {
                match p.observe_shared(object, &self.public_key).await {
                    Ok(Some(found)) => {
                        return Step::Next(SharedState::Ready {
                            object: object.clone(),
                            found,
                        })
                    }
                    Ok(None) => {}
                    Err(e) if e.kind.retried_in_place() => return retry_step(e),
                    Err(e) => return Step::Next(failed(object, &e)),
                }
                if matches!(s, SharedState::Observing { .. }) {
                    // Write-ahead: the intent is durable before the create is sent.
                    return Step::Next(SharedState::Creating {
                        object: object.clone(),
                    });
                }
                match p.create_shared(object, &self.public_key).await {
                    Ok(found) => Step::Next(SharedState::Ready {
                        object: object.clone(),
                        found,
                    }),
                    // Made meanwhile (or the listing lags): observe again, with backoff.
                    Err(e) if e.kind == ErrorKind::Exists => retry_step(e),
                    Err(e) if e.kind.retried_in_place() => retry_step(e),
                    Err(e) => Step::Next(failed(object, &e)),
                }
            }
            SharedState::Ready { .. } | SharedState::Failed { .. } => Step::Next(s.clone()),
        }
    }

    fn on_retries_exhausted(&self, s: &SharedState, last_error: String) -> SharedState {
        SharedState::Failed {
            object: s.object().clone(),
            kind: ErrorKind::Failed,
            reason: last_error,
        }
    }
}

/// The teardown of one shared object once no machine uses it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum SharedTeardownState {
    /// Looking for it: only one gpuprov made ([`SharedFound::ours`]) is deleted.
    Observing { object: SharedObject },
    /// Deleting ours.
    Deleting {
        object: SharedObject,
        found: SharedFound,
    },
    /// Gone, or not ours to delete: the record leaves the state.
    Deleted { object: SharedObject },
    /// The delete failed: it may still exist; the record stays for the next run.
    Leaked {
        object: SharedObject,
        found: Option<SharedFound>,
        reason: String,
    },
}

impl SharedTeardownState {
    /// The object this record is about.
    pub fn object(&self) -> &SharedObject {
        match self {
            SharedTeardownState::Observing { object }
            | SharedTeardownState::Deleting { object, .. }
            | SharedTeardownState::Deleted { object }
            | SharedTeardownState::Leaked { object, .. } => object,
        }
    }
}

/// Tears down one shared object through its adapter.
pub struct SharedTeardown {
    pub providers: Providers,
    pub public_key: String,
}

#[async_trait]
impl Machine for SharedTeardown {
    type State = SharedTeardownState;
    const KIND: &'static str = TEARDOWN_KIND;

    fn is_terminal(&self, s: &SharedTeardownState) -> bool {
        matches!(
            s,
            SharedTeardownState::Deleted { .. } | SharedTeardownState::Leaked { .. }
        )
    }

    fn label(&self, s: &SharedTeardownState) -> String {
        match s {
            SharedTeardownState::Observing { object } => {
                format!("observing {} before delete", object.address())
            }
            SharedTeardownState::Deleting { found, .. } => format!("deleting {}", found.name),
            SharedTeardownState::Deleted { object } => format!("released {}", object.address()),
            SharedTeardownState::Leaked { reason, .. } => format!("leaked: {reason}"),
        }
    }

    async fn step(&self, s: &SharedTeardownState, _cx: &StepCx) -> Step<SharedTeardownState> {
        let object = s.object();
        let Some(p) = self.providers.get(&object.cloud) else {
            return Step::Next(SharedTeardownState::Leaked {
                object: object.clone(),
                found: None,
                reason: format!("no adapter for {}", object.cloud),
            });
        };
        match s {
            SharedTeardownState::Observing { .. } => {
                match p.observe_shared(object, &self.public_key).await {
                    Ok(Some(found)) if found.ours => Step::Next(SharedTeardownState::Deleting {
                        object: object.clone(),
                        found,
                    }),
                    // Gone, or the user's own: nothing of ours to delete.
                    Ok(_) => Step::Next(SharedTeardownState::Deleted {
                        object: object.clone(),
                    }),
                    Err(e) if e.kind.retried_in_place() => retry_step(e),
                    Err(e) => Step::Next(SharedTeardownState::Leaked {
                        object: object.clone(),
                        found: None,
                        reason: e.text(),
                    }),
                }
            }
            SharedTeardownState::Deleting { found, .. } => {
                match p.delete_shared(object, found).await {
                    // Observe again: only the cloud's confirmation removes the record.
                    Ok(()) => Step::Next(SharedTeardownState::Observing {
                        object: object.clone(),
                    }),
                    Err(e) if e.kind.retried_in_place() => retry_step(e),
                    Err(e) => Step::Next(SharedTeardownState::Leaked {
                        object: object.clone(),
                        found: Some(found.clone()),
                        reason: e.text(),
                    }),
                }
            }
            SharedTeardownState::Deleted { .. } | SharedTeardownState::Leaked { .. } => {
                Step::Next(s.clone())
            }
        }
    }

    fn on_retries_exhausted(
        &self,
        s: &SharedTeardownState,
        last_error: String,
    ) -> SharedTeardownState {
        let found = match s {
            SharedTeardownState::Deleting { found, .. } => Some(found.clone()),
            _ => None,
        };
        SharedTeardownState::Leaked {
            object: s.object().clone(),
            found,
            reason: last_error,
        }
    }
}

/// The object a journalled shared record is about, whichever of the two machines wrote
/// it; `None` for a record of another kind or one that does not parse.
pub fn object_of(prev: &PrevRecord) -> Option<SharedObject> {
    match prev.kind.as_str() {
        KIND => serde_json::from_value::<SharedState>(prev.state.clone())
            .ok()
            .map(|s| s.object().clone()),
        TEARDOWN_KIND => serde_json::from_value::<SharedTeardownState>(prev.state.clone())
            .ok()
            .map(|s| s.object().clone()),
        _ => None,
    }
}

type Slot = Arc<tokio::sync::Mutex<Option<Result<SharedFound, ProviderError>>>>;

/// The run's shared objects: each is prepared by one journalled [`SharedMachine`] at
/// most once per run, whatever the parallelism; every other launch that needs it waits
/// for that one and takes its answer (an error too: the run does not hammer a failing
/// object once per machine).
pub struct SharedObjects {
    executor: Executor,
    providers: Providers,
    public_key: String,
    slots: Mutex<HashMap<String, Slot>>,
}

impl SharedObjects {
    /// The guard of one run: machines journal through `executor`.
    pub fn new(executor: Executor, providers: Providers, public_key: String) -> SharedObjects {
        SharedObjects {
            executor,
            providers,
            public_key,
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// `object`, prepared (observed, created if missing) once in this run.
    ///
    /// Errors: the preparation's last error, with its kind (the launch treats it as a
    /// failed prepare); `Transient` when the run was interrupted or the journal failed
    /// (nothing is cached then).
    pub async fn ensure(&self, object: &SharedObject) -> Result<SharedFound, ProviderError> {
        let address = object.address();
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.entry(address.clone()).or_default().clone()
        };
        let mut answer = slot.lock().await;
        if let Some(a) = answer.as_ref() {
            return a.clone();
        }
        let m = SharedMachine {
            providers: self.providers.clone(),
            public_key: self.public_key.clone(),
        };
        let result = match self
            .executor
            .run(&m, &address, |_prev| SharedState::Observing {
                object: object.clone(),
            })
            .await
        {
            Ok(SharedState::Ready { found, .. }) => Ok(found),
            Ok(SharedState::Failed { kind, reason, .. }) => Err(ProviderError::new(
                kind,
                format!("{address} could not be prepared: {reason}"),
            )),
            Ok(other) => Err(ProviderError::new(
                ErrorKind::Failed,
                format!("{address} ended in {other:?}"),
            )),
            // Not cached: the next run resumes the journalled machine.
            Err(e @ (ExecError::Interrupted { .. } | ExecError::Journal { .. })) => {
                return Err(ProviderError::transient(e.to_string()))
            }
            Err(e) => Err(ProviderError::new(ErrorKind::Failed, e.to_string())),
        };
        *answer = Some(result.clone());
        result
    }
}
