//! The launch machine (design 4.3): Reconciling → Planning → [Preparing → Creating →
//! Booting → Connecting]* → Ready, with failover across offers, compensation through the
//! embedded teardown machine, and `Leaked` / `Aborted` / `Exhausted` as its other ends.
//!
//! The failover cursor ([`Search`]) travels in every attempt state, so it survives a crash.
//! Every step observes before it acts, so re-running a step after a crash is safe: in
//! particular `Creating` looks for an instance carrying the identity before it creates.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::config::VmSpec;
use crate::machine::{Machine, RetryPolicy, Step, StepCx};
use crate::provider::{
    BlockScope, CloudProvider, ErrorKind, InstanceSpec, InstanceStatus, Location, Offer,
    ProviderError, Providers, SshEndpoint,
};
use crate::ssh::{Connector, HostKey, SshError};

use super::teardown::{retry_step, Target, TeardownMachine, TeardownState};
use super::{Owned, VmRecord};

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
    Booting {
        search: Search,
        instance_id: String,
    },
    Connecting {
        search: Search,
        instance_id: String,
        endpoint: SshEndpoint,
        /// Set when reusing a machine that was up: its host key must not change, and a
        /// failure leaves it running instead of deleting it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pinned: Option<HostKey>,
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
}

impl LaunchState {
    /// A fresh start that first looks at what `previous` may own.
    pub fn start(previous: Option<Owned>) -> LaunchState {
        LaunchState::Reconciling { previous }
    }

    /// The cloud resources this state may own (a create may have happened from
    /// `Creating` on).
    pub fn owned(&self) -> Option<Owned> {
        let at = |s: &Search, ids: Vec<String>| {
            s.current().map(|o| Owned {
                location: o.location.clone(),
                instance_ids: ids,
                vm: None,
            })
        };
        match self {
            LaunchState::Reconciling { previous } => previous.clone(),
            LaunchState::Planning { .. }
            | LaunchState::Preparing { .. }
            | LaunchState::NextOffer { .. }
            | LaunchState::Exhausted { .. } => None,
            LaunchState::Creating { search, .. } => at(search, vec![]),
            LaunchState::Booting {
                search,
                instance_id,
            }
            | LaunchState::Connecting {
                search,
                instance_id,
                ..
            } => at(search, vec![instance_id.clone()]),
            LaunchState::Ready { vm } => Some(Owned {
                location: vm.location.clone(),
                instance_ids: vec![vm.instance_id.clone()],
                vm: Some(vm.clone()),
            }),
            LaunchState::Compensating { teardown, .. } => teardown.owned(),
            LaunchState::Aborted { owned, .. } => owned.clone(),
            LaunchState::Leaked {
                location,
                instance_ids,
                ..
            } => Some(Owned {
                location: location.clone(),
                instance_ids: instance_ids.clone(),
                vm: None,
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
    /// it counts as vanished (clouds list new instances with a lag).
    pub vanish_grace: Duration,
    pub teardown: TeardownMachine,
    /// Run at first boot on clouds that support it (the k3s installer, design 4.5).
    pub boot_script: Option<crate::provider::BootScript>,
    /// Client tokens whose create intent this process journalled and has not sent yet:
    /// only for these may `Creating` call `create` without waiting (see
    /// [`LaunchState::Creating`]).
    fresh_creates: std::sync::Mutex<std::collections::HashSet<String>>,
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
            vanish_grace: Duration::from_secs(20),
            boot_script: None,
            fresh_creates: Default::default(),
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
        }
    }

    fn compensate(
        &self,
        search: Search,
        ids: Vec<String>,
        reason: String,
        after: AfterCompensation,
    ) -> LaunchState {
        let location = search.current().map(|o| o.location.clone());
        match location {
            Some(location) => LaunchState::Compensating {
                teardown: TeardownState::Requesting {
                    target: Target {
                        location,
                        vm_name: self.vm.name.clone(),
                        instance_ids: ids,
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
        e: &ProviderError,
        stage: &str,
    ) -> LaunchState {
        let offer = search.current().cloned();
        let scope = offer.as_ref().and_then(|o| e.scope_for(o));
        let search = search.record(format!("{stage}: {}", e.msg), Some(e.kind), scope);
        match e.kind {
            ErrorKind::InvalidRequest | ErrorKind::Credentials => {
                let reason = format!("{stage} failed ({:?}): {}", e.kind, e.msg);
                self.compensate(
                    search,
                    ids,
                    reason.clone(),
                    AfterCompensation::Abort { reason },
                )
            }
            _ => self.compensate(
                search,
                ids,
                format!("{stage}: {}", e.msg),
                AfterCompensation::NextOffer,
            ),
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
        })
    }

    async fn plan(&self, round: u32) -> Step<LaunchState> {
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
                Ok(list) => offers.extend(list.into_iter().filter(|o| {
                    self.vm
                        .max_price_per_hour
                        .is_none_or(|max| o.price_per_hour <= max)
                })),
                Err(e) if e.kind == ErrorKind::Transient => return retry_step(e),
                Err(e) if matches!(e.kind, ErrorKind::InvalidRequest | ErrorKind::Credentials) => {
                    fatal.push(format!("{cloud}: {}", e.msg))
                }
                Err(e) => other.push(format!("{cloud}: {}", e.msg)),
            }
        }
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
                    ..Search::default()
                },
            });
        }
        Step::Next(LaunchState::Preparing {
            search: Search {
                offers,
                round,
                nonce: new_nonce(),
                ..Search::default()
            },
        })
    }

    async fn reconcile(&self, previous: &Option<Owned>) -> Step<LaunchState> {
        let Some(prev) = previous else {
            return Step::Next(LaunchState::Planning { round: 0 });
        };
        let Some(p) = self.provider(&prev.location.cloud) else {
            return Step::Next(LaunchState::Leaked {
                location: prev.location.clone(),
                instance_ids: prev.instance_ids.clone(),
                reason: format!("no adapter for cloud '{}' in this run", prev.location.cloud),
            });
        };
        let stale = || {
            let search = Search::default();
            LaunchState::Compensating {
                teardown: TeardownState::Requesting {
                    target: Target {
                        location: prev.location.clone(),
                        vm_name: self.vm.name.clone(),
                        instance_ids: prev.instance_ids.clone(),
                    },
                },
                search,
                reason: "removing what an earlier run left behind".into(),
                after: AfterCompensation::Replan,
            }
        };
        let Some(vm) = &prev.vm else {
            return Step::Next(stale());
        };
        // It was up: reuse it when the cloud still runs it at the same place.
        let seen = match p.observe(&vm.location, &self.vm.name).await {
            Ok(v) => v,
            Err(e) if e.kind == ErrorKind::Transient => return retry_step(e),
            Err(e) => {
                return Step::Next(LaunchState::Aborted {
                    reason: e.msg,
                    owned: Some(prev.clone()),
                })
            }
        };
        let search = Search {
            offers: vec![vm.offer.clone()],
            ..Search::default()
        };
        match seen.iter().find(|o| o.instance_id == vm.instance_id) {
            Some(o) if o.status == InstanceStatus::Running => {
                let endpoint = o.ssh.clone().unwrap_or_else(|| vm.ssh.clone());
                Step::Next(LaunchState::Connecting {
                    search,
                    instance_id: vm.instance_id.clone(),
                    endpoint,
                    pinned: Some(vm.host_key.clone()),
                })
            }
            Some(o) if o.status == InstanceStatus::Pending => Step::Next(LaunchState::Booting {
                search,
                instance_id: vm.instance_id.clone(),
            }),
            // Stopped, failing or going away: replace it.
            Some(_) => Step::Next(stale()),
            None if seen.is_empty() => Step::Next(LaunchState::Planning { round: 0 }),
            None => Step::Next(stale()),
        }
    }
}

#[async_trait]
impl Machine for LaunchMachine {
    type State = LaunchState;
    const KIND: &'static str = "launch";

    fn is_terminal(&self, s: &LaunchState) -> bool {
        match s {
            LaunchState::Ready { .. }
            | LaunchState::Aborted { .. }
            | LaunchState::Leaked { .. } => true,
            LaunchState::Exhausted { .. } => !self.vm.retry_until_up,
            _ => false,
        }
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
            LaunchState::Planning { round } if *round > 0 => {
                format!("planning (round {})", round + 1)
            }
            LaunchState::Planning { .. } => "planning".into(),
            LaunchState::Preparing { search } => format!("preparing {}", offer(search)),
            LaunchState::Creating {
                search, sent: true, ..
            } => format!("creating {} (create sent)", offer(search)),
            LaunchState::Creating { search, .. } => format!("creating {}", offer(search)),
            LaunchState::Booting {
                search,
                instance_id,
            } => format!("booting {instance_id} at {}", offer(search)),
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
        match s {
            LaunchState::Reconciling { previous } => match previous {
                Some(o) => LaunchState::Aborted {
                    reason: e.msg,
                    owned: Some(o.clone()),
                },
                None => LaunchState::Aborted {
                    reason: e.msg,
                    owned: None,
                },
            },
            LaunchState::Planning { .. } => LaunchState::Aborted {
                reason: e.msg,
                owned: None,
            },
            LaunchState::Preparing { search } => {
                let scope = search.current().and_then(|o| e.scope_for(o));
                LaunchState::NextOffer {
                    search: search.clone().record(
                        format!("prepare: {}", e.msg),
                        Some(e.kind),
                        scope,
                    ),
                }
            }
            LaunchState::Creating { search, .. } => {
                self.on_offer_error(search.clone(), vec![], &e, "create")
            }
            LaunchState::Booting {
                search,
                instance_id,
            } => self.on_offer_error(search.clone(), vec![instance_id.clone()], &e, "boot"),
            LaunchState::Connecting {
                search,
                instance_id,
                ..
            } => self.on_offer_error(search.clone(), vec![instance_id.clone()], &e, "connect"),
            LaunchState::Compensating { teardown, .. } => {
                let owned = teardown.owned();
                match owned {
                    Some(o) => LaunchState::Leaked {
                        location: o.location,
                        instance_ids: o.instance_ids,
                        reason: e.msg,
                    },
                    None => LaunchState::Aborted {
                        reason: e.msg,
                        owned: None,
                    },
                }
            }
            other => other.clone(),
        }
    }

    fn on_cancel(&self, s: &LaunchState) -> Option<LaunchState> {
        let reason = "cancelled by the user".to_string();
        match s {
            LaunchState::Reconciling { previous } => Some(LaunchState::Aborted {
                reason,
                owned: previous.clone(),
            }),
            LaunchState::Planning { .. }
            | LaunchState::Preparing { .. }
            | LaunchState::NextOffer { .. }
            | LaunchState::Exhausted { .. } => Some(LaunchState::Aborted {
                reason,
                owned: None,
            }),
            LaunchState::Connecting {
                search,
                instance_id,
                endpoint,
                pinned: Some(key),
            } => {
                // A machine that was up before this run stays up.
                let vm = self.record_for(search, instance_id, endpoint, key.clone());
                Some(LaunchState::Aborted {
                    reason,
                    owned: search.current().map(|o| Owned {
                        location: o.location.clone(),
                        instance_ids: vec![instance_id.clone()],
                        vm: vm.map(Box::new),
                    }),
                })
            }
            LaunchState::Creating { search, .. } => Some(self.compensate(
                search.clone(),
                vec![],
                reason.clone(),
                AfterCompensation::Abort { reason },
            )),
            LaunchState::Booting {
                search,
                instance_id,
            }
            | LaunchState::Connecting {
                search,
                instance_id,
                ..
            } => Some(self.compensate(
                search.clone(),
                vec![instance_id.clone()],
                reason.clone(),
                AfterCompensation::Abort { reason },
            )),
            _ => None,
        }
    }

    async fn step(&self, s: &LaunchState, cx: &StepCx) -> Step<LaunchState> {
        match s {
            LaunchState::Reconciling { previous } => self.reconcile(previous).await,
            LaunchState::Planning { round } => self.plan(*round).await,
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
                match p.prepare(offer, &self.instance_spec(search)).await {
                    Ok(prepared) => Step::Next(LaunchState::Creating {
                        sent: false,
                        search: search.clone(),
                        prepared,
                    }),
                    Err(e) if e.kind == ErrorKind::Transient => retry_step(e),
                    Err(e)
                        if matches!(e.kind, ErrorKind::InvalidRequest | ErrorKind::Credentials) =>
                    {
                        Step::Next(LaunchState::Aborted {
                            reason: format!("prepare failed ({:?}): {}", e.kind, e.msg),
                            owned: None,
                        })
                    }
                    // Nothing billable exists yet: block and move on.
                    Err(e) => {
                        let scope = e.scope_for(offer);
                        Step::Next(LaunchState::NextOffer {
                            search: search.clone().record(
                                format!("prepare: {}", e.msg),
                                Some(e.kind),
                                scope,
                            ),
                        })
                    }
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
                // Observe first: after a crash between create and its journal entry the
                // instance exists and must be adopted, not duplicated.
                match p.observe(&offer.location, &self.vm.name).await {
                    Ok(seen) => {
                        if let Some(o) = seen.into_iter().next() {
                            return Step::Next(LaunchState::Booting {
                                search: search.clone(),
                                instance_id: o.instance_id,
                            });
                        }
                    }
                    Err(e) if e.kind == ErrorKind::Transient => return retry_step(e),
                    Err(e) => {
                        return Step::Next(self.on_offer_error(
                            search.clone(),
                            vec![],
                            &e,
                            "observe",
                        ))
                    }
                }
                // Journal the intent before the side effect; then send at once only if this
                // process journalled it. Otherwise a create may already be at the cloud
                // (its answer lost to a crash or an error), and clouds that ignore the
                // idempotency token would start a second instance: wait for the listing.
                let spec = self.instance_spec(search);
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
                    }),
                    Err(e) if e.kind == ErrorKind::Transient => {
                        // A rate limit (`Retry-After`) refused the request before it
                        // was processed: nothing was created, so the retry may send at
                        // once. Any other error may have lost a create's answer.
                        if e.retry_after_secs.is_some() {
                            self.fresh_creates
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .insert(spec.client_token.clone());
                        }
                        retry_step(e)
                    }
                    Err(e) if e.kind == ErrorKind::Unavailable => {
                        let scope = e.scope_for(offer);
                        Step::Next(LaunchState::NextOffer {
                            search: search.clone().record(
                                format!("create: {}", e.msg),
                                Some(e.kind),
                                scope,
                            ),
                        })
                    }
                    Err(e) => Step::Next(self.on_offer_error(search.clone(), vec![], &e, "create")),
                }
            }
            LaunchState::Booting {
                search,
                instance_id,
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
                let seen = match p.observe(&offer.location, &self.vm.name).await {
                    Ok(v) => v,
                    Err(e) if e.kind == ErrorKind::Transient => return retry_step(e),
                    Err(e) => {
                        return Step::Next(self.on_offer_error(search.clone(), ids, &e, "observe"))
                    }
                };
                let fail = |msg: String| {
                    let e = ProviderError::new(ErrorKind::Failed, msg);
                    Step::Next(self.on_offer_error(search.clone(), ids.clone(), &e, "boot"))
                };
                match seen.iter().find(|o| &o.instance_id == instance_id) {
                    Some(o) => match (&o.status, &o.ssh) {
                        (InstanceStatus::Running, Some(ep)) => {
                            Step::Next(LaunchState::Connecting {
                                search: search.clone(),
                                instance_id: instance_id.clone(),
                                endpoint: ep.clone(),
                                pinned: None,
                            })
                        }
                        (InstanceStatus::Failed(r), _) => fail(format!("instance failed: {r}")),
                        (
                            InstanceStatus::Stopped
                            | InstanceStatus::Stopping
                            | InstanceStatus::Terminating,
                            _,
                        ) => fail(format!("instance stopped while booting ({:?})", o.status)),
                        _ if cx.in_state > caps.boot_timeout => fail(format!(
                            "not running with an SSH endpoint after {}s",
                            caps.boot_timeout.as_secs()
                        )),
                        (status, _) => {
                            Step::poll(caps.poll_interval, format!("{instance_id} is {status:?}"))
                        }
                    },
                    // Clouds list a new instance with a lag: only a lasting absence counts.
                    None if cx.in_state > self.vanish_grace.max(caps.poll_interval) => {
                        fail(format!("instance {instance_id} vanished while booting"))
                    }
                    None => Step::poll(caps.poll_interval, format!("{instance_id} not listed yet")),
                }
            }
            LaunchState::Connecting {
                search,
                instance_id,
                endpoint,
                pinned,
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
                    location: offer.location.clone(),
                    instance_ids: vec![instance_id.clone()],
                    vm: self
                        .record_for(search, instance_id, endpoint, key)
                        .map(Box::new),
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
                        match pinned {
                            Some(k) => Step::Next(LaunchState::Aborted {
                                reason,
                                owned: Some(owned_vm(k.clone())),
                            }),
                            None => Step::Next(self.compensate(
                                search.clone(),
                                vec![instance_id.clone()],
                                reason.clone(),
                                AfterCompensation::Abort { reason },
                            )),
                        }
                    }
                    Err(e) if cx.in_state > caps.ssh_timeout => {
                        let msg = format!(
                            "ssh not reachable after {}s: {e}",
                            caps.ssh_timeout.as_secs()
                        );
                        match pinned {
                            // Never delete a machine that was up just because SSH is down.
                            Some(k) => Step::Next(LaunchState::Aborted {
                                reason: format!(
                                    "{msg}; left running (`gpuprov destroy` removes it)"
                                ),
                                owned: Some(owned_vm(k.clone())),
                            }),
                            None => {
                                let pe = ProviderError::new(ErrorKind::Failed, msg);
                                Step::Next(self.on_offer_error(
                                    search.clone(),
                                    vec![instance_id.clone()],
                                    &pe,
                                    "connect",
                                ))
                            }
                        }
                    }
                    Err(e) => Step::poll(caps.poll_interval, e.to_string()),
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
            | LaunchState::Leaked { .. } => Step::Next(s.clone()),
        }
    }
}
