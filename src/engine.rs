//! Runs a plan: binds the executor's journal to the state file ([`StateJournal`]) and
//! runs one machine per resource, concurrently up to `--parallelism`, each machine only
//! after the machines it depends on are up. Never prints: progress goes out as
//! [`Progress`](crate::machine::Progress) events and results as [`Outcome`]s.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::{watch, Semaphore};

use crate::cluster::api::ApiConnector;
use crate::cluster::installer::InstallerConfig;
use crate::cluster::k3s::{K3sMachine, K3sState, K3sTimeouts};
use crate::cluster::remote::NodeShell;
use crate::config::VmSpec;
use crate::machine::{ExecError, Executor, Journal, JournalError, PrevRecord, Providers};
use crate::plan::{Action, Change, Plan};
use crate::record::{self, Record};
use crate::ssh::Connector;
use crate::state::{
    JournalOp, JournalStats, JournalWriter, JsonText, MachineRecord, StateError, StateFile,
    StateStore,
};
use crate::vm::shared::{SharedObjects, SharedTeardown, SharedTeardownState};
use crate::vm::{
    LaunchMachine, LaunchState, Owned, Target, TeardownMachine, TeardownState, VmRecord,
};

/// The executor's journal, backed by the state file: every transition is appended to the
/// run's write-ahead journal (`<state>.journal`) and fsynced before the executor runs the
/// next step (write-ahead); the state file itself is rewritten once, by
/// [`StateJournal::save_final`], which folds the journal into it. Concurrent transitions
/// share fsyncs (group commit, see [`crate::state::wal`]).
pub struct StateJournal {
    inner: Mutex<JournalInner>,
    writer: JournalWriter,
}

struct JournalInner {
    store: StateStore,
    state: StateFile,
    /// Desired snapshots to attach with the next record of each key.
    desired: HashMap<String, JsonText>,
}

impl StateJournal {
    /// Starts the run's journal for `state` (folding a journal an earlier run left).
    ///
    /// # Errors
    ///
    /// As [`StateStore::begin_journal`]: the journal cannot be created, or the earlier
    /// one cannot be folded into the state file.
    pub fn new(mut store: StateStore, mut state: StateFile) -> Result<Self, StateError> {
        let writer = store.begin_journal(&mut state)?;
        Ok(StateJournal {
            inner: Mutex::new(JournalInner {
                store,
                state,
                desired: HashMap::new(),
            }),
            writer,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, JournalInner> {
        // A panic while holding the lock is a bug; the files on disk are still whole.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of the state as it is now.
    pub fn snapshot(&self) -> StateFile {
        self.lock().state.clone()
    }

    /// The machine name `key`'s cloud objects carry when a move renamed the address
    /// ([`crate::state::ResourceRecord::cloud_name`]); `None` when it is the address's.
    pub fn cloud_name(&self, key: &str) -> Option<String> {
        self.lock()
            .state
            .resources
            .get(key)
            .and_then(|r| r.cloud_name.clone())
    }

    /// Figures of the run's journal so far (appends, fsync batches, bytes, time).
    pub fn stats(&self) -> JournalStats {
        self.writer.stats()
    }

    /// Records `desired` as the applied settings of `key` with its next transition.
    pub fn stage_desired(&self, key: &str, desired: &VmSpec) {
        if let Ok(v) = JsonText::encode(desired) {
            self.lock().desired.insert(key.to_string(), v);
        }
    }

    /// Applies `op` in memory and queues it, under one lock so that the journal's order
    /// is the memory's; then waits until it is durable.
    async fn commit(&self, op: JournalOp) -> Result<(), StateError> {
        let seq = {
            let mut g = self.lock();
            let seq = self.writer.queue(&op)?;
            op.apply(&mut g.state);
            seq
        };
        self.writer.wait_durable(seq).await
    }

    /// Replaces the applied settings of an existing record now (in-place update).
    pub async fn update_desired(&self, key: &str, desired: &VmSpec) -> Result<(), StateError> {
        let desired = JsonText::encode(desired).map_err(|source| StateError::Serialize {
            path: self.writer.path().to_path_buf(),
            source,
        })?;
        self.commit(JournalOp::Desired {
            key: key.to_string(),
            desired,
            at: chrono::Utc::now(),
        })
        .await
    }

    /// Drops a resource whose teardown the cloud confirmed.
    pub async fn remove(&self, key: &str) -> Result<(), StateError> {
        crate::crash::point("journal.before:remove").await;
        self.commit(JournalOp::Remove {
            key: key.to_string(),
        })
        .await?;
        crate::crash::point("journal.after:remove").await;
        Ok(())
    }

    /// The final save of a run: folds the journal into the state file (one atomic
    /// rewrite), then deletes the journal. If the save fails the state goes to the
    /// `.errored` file and the journal stays, so the next command still replays it.
    pub fn save_final(&self) -> Result<(), StateError> {
        let mut g = self.lock();
        let g = &mut *g;
        g.store.save_final(&mut g.state)?;
        self.writer.remove()
    }
}

#[async_trait]
impl Journal for StateJournal {
    async fn load(&self, key: &str) -> Result<Option<PrevRecord>, JournalError> {
        Ok(self
            .lock()
            .state
            .records_of(key)
            .get(key)
            .map(|r| PrevRecord {
                kind: r.machine.kind.clone(),
                state: r.machine.state.to_value(),
            }))
    }

    async fn record(
        &self,
        key: &str,
        kind: &str,
        state: &serde_json::Value,
        label: &str,
    ) -> Result<(), JournalError> {
        let desired = self.lock().desired.remove(key);
        let machine = MachineRecord {
            kind: kind.to_string(),
            state: JsonText::from_value(state),
            label: label.to_string(),
            updated_at: chrono::Utc::now(),
        };
        self.commit(JournalOp::Transition {
            key: key.to_string(),
            machine,
            desired,
        })
        .await
        .map_err(|e| JournalError::Write(e.to_string()))
    }
}

/// What happened to one resource in a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Ready(Box<VmRecord>),
    Updated,
    Unchanged,
    Destroyed,
    /// Ended in a failure state (aborted, exhausted, unowned), skipped, or not run at
    /// all: the [`Failure`] says of what kind and why.
    Failed(Failure),
    /// Leaked: the resource may still exist and bill; the next run resolves it.
    Leaked(String),
    Interrupted(String),
}

/// Why a resource failed in a run: its [`FailureKind`] (what the CLI reports it as, and
/// its exit code follows) and the text saying why. It reads as that text
/// (`Deref<Target = str>`), as the bare string it replaced did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub kind: FailureKind,
    pub why: String,
}

/// The kinds of [`Failure`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The machine reached a failed end (aborted, exhausted, unowned): the cloud's
    /// answers or the ask, which the user can act on.
    Ended,
    /// Ctrl-C stopped it, and what it was creating is torn down.
    Cancelled,
    /// Not started: a machine it waits for did not succeed.
    Skipped,
    /// Its state record cannot be read, so nothing was done to it.
    Record,
    /// The state could not be written (the journal).
    State,
    /// A bug in gpuprov: a task panicked, or the run reached a state it never should.
    Internal,
}

impl Failure {
    pub fn new(kind: FailureKind, why: impl Into<String>) -> Failure {
        Failure {
            kind,
            why: why.into(),
        }
    }

    /// The failed end a machine reached, by its label: [`FailureKind::Cancelled`] when
    /// Ctrl-C stopped it ([`crate::vm::launch::CANCELLED`]), else [`FailureKind::Ended`].
    fn ended(label: String) -> Failure {
        let kind = if label.ends_with(crate::vm::launch::CANCELLED) {
            FailureKind::Cancelled
        } else {
            FailureKind::Ended
        };
        Failure::new(kind, label)
    }

    /// The executor's error: the journal ([`FailureKind::State`]) or an unreadable
    /// record ([`FailureKind::Record`]).
    fn exec(e: &ExecError) -> Failure {
        let kind = match e {
            ExecError::BadRecord { .. } => FailureKind::Record,
            _ => FailureKind::State,
        };
        Failure::new(kind, e.to_string())
    }
}

impl std::ops::Deref for Failure {
    type Target = str;
    fn deref(&self) -> &str {
        &self.why
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

impl Outcome {
    /// The failure of `kind` saying `why`.
    pub fn failed(kind: FailureKind, why: impl Into<String>) -> Outcome {
        Outcome::Failed(Failure::new(kind, why))
    }

    pub fn is_success(&self) -> bool {
        matches!(
            self,
            Outcome::Ready(_) | Outcome::Updated | Outcome::Unchanged | Outcome::Destroyed
        )
    }
}

/// Everything a run needs besides the plan.
#[derive(Clone)]
pub struct Engine {
    pub providers: Providers,
    pub connector: Arc<dyn Connector>,
    pub journal: Arc<StateJournal>,
    pub executor: Executor,
    pub lineage: String,
    /// The project's OpenSSH public key (not a secret).
    pub ssh_public_key: String,
    pub parallelism: usize,
    /// `apply --retry-until-up`: every machine keeps re-planning while exhausted. A run
    /// option, not a setting: the recorded desired settings are not changed by it.
    pub retry_until_up: bool,
    /// How machines with `kubernetes = true` become clusters; `None`: k3s is not run.
    pub k3s: Option<K3sSetup>,
}

/// What the k3s machine needs besides the launch machine (design 4.5).
#[derive(Clone)]
pub struct K3sSetup {
    pub shell: Arc<dyn NodeShell>,
    pub api: Arc<dyn ApiConnector>,
    /// Where per-VM kubeconfigs go (`<dir>/<vm>.yaml`).
    pub kubeconfig_dir: std::path::PathBuf,
    pub installer: InstallerConfig,
    pub timeouts: K3sTimeouts,
}

/// The machine a record says is up; see [`crate::record::vm_of`], where it lives.
pub use crate::record::vm_of;

/// The owned resources of a journalled record, whichever machine wrote it.
///
/// Errors: a message when the record is of an unknown kind or does not parse; callers
/// must then refuse to act rather than treat the record as owning nothing.
pub fn owned_of(prev: &PrevRecord) -> Result<Option<Owned>, String> {
    Record::decode(&prev.kind, &prev.state.to_string())
        .map(|r| r.owned())
        .map_err(|e| e.to_string())
}

/// Whether `prev` is a teardown that has not finished (neither done nor leaked).
fn unfinished_teardown(prev: &PrevRecord) -> bool {
    matches!(
        Record::decode(&prev.kind, &prev.state.to_string()),
        Ok(Record::Teardown(s)) if !matches!(s, TeardownState::Done | TeardownState::Leaked { .. })
    )
}

type Signal = watch::Sender<Option<bool>>;

/// The outcome of a launch that ended leaked, `None` for any other state.
fn leaked_outcome(s: &LaunchState) -> Option<Outcome> {
    match s {
        LaunchState::Leaked {
            location,
            instance_ids,
            reason,
        } => Some(Outcome::Leaked(format!(
            "{} at {location}: {reason}",
            instance_ids.join(",")
        ))),
        _ => None,
    }
}

impl Engine {
    /// Applies `plan`: destroys first, then every other change in dependency order, then
    /// (when the plan destroyed something) the shared objects no machine uses any more.
    /// Returns one outcome per address; never panics on a machine failure.
    pub async fn apply(&self, plan: &Plan) -> BTreeMap<String, Outcome> {
        let destroys: Vec<String> = plan
            .changes
            .iter()
            .filter(|c| c.action == Action::Destroy)
            .map(|c| c.address.clone())
            .collect();
        let candidates = self.shared_of(&destroys);
        let mut out = self.destroy_machines(&destroys).await;
        let shared = self.shared_objects();
        let changes: BTreeMap<String, Change> = plan
            .changes
            .iter()
            .filter(|c| c.action != Action::Destroy)
            .map(|c| (c.address.clone(), c.clone()))
            .collect();
        let jobs = changes
            .values()
            .map(|c| {
                let deps = c
                    .desired
                    .as_ref()
                    .map(|d| d.depends_on.iter().map(|n| format!("vm.{n}")).collect());
                (c.address.clone(), deps.unwrap_or_default())
            })
            .collect();
        let changes = Arc::new(changes);
        let run = move |engine: Engine, address: String| {
            let changes = changes.clone();
            let shared = shared.clone();
            async move {
                match changes.get(&address) {
                    Some(c) => engine.run_change(c, &shared).await,
                    None => Outcome::failed(FailureKind::Internal, "internal: unknown change"),
                }
            }
        };
        out.extend(
            self.run_gated(
                jobs,
                |dep| format!("skipped: dependency {dep} did not come up"),
                run,
            )
            .await,
        );
        if !destroys.is_empty() || plan.shared.iter().any(|s| s.action == Action::Destroy) {
            out.extend(self.release_shared_with(candidates).await);
        }
        out
    }

    /// The run's single-flight guard of shared objects ([`crate::vm::shared`]).
    fn shared_objects(&self) -> Arc<SharedObjects> {
        Arc::new(SharedObjects::new(
            self.executor.clone(),
            self.providers.clone(),
            self.ssh_public_key.clone(),
        ))
    }

    /// Runs one job per address, at most `parallelism` at once, each only after every
    /// address it waits for (among the jobs) finished successfully; otherwise the job is
    /// skipped with `skipped(that address)`.
    async fn run_gated<F, Fut>(
        &self,
        jobs: Vec<(String, Vec<String>)>,
        skipped: fn(&str) -> String,
        run: F,
    ) -> BTreeMap<String, Outcome>
    where
        F: Fn(Engine, String) -> Fut + Clone + Send + Sync + 'static,
        Fut: std::future::Future<Output = Outcome> + Send,
    {
        let signals: HashMap<String, Signal> = jobs
            .iter()
            .map(|(a, _)| (a.clone(), watch::channel(None).0))
            .collect();
        let sem = Arc::new(Semaphore::new(self.parallelism.max(1)));
        let mut tasks = tokio::task::JoinSet::new();
        let mut addresses: HashMap<tokio::task::Id, String> = HashMap::new();
        for (address, waits_for) in jobs {
            let waits: Vec<(String, watch::Receiver<Option<bool>>)> = waits_for
                .into_iter()
                .filter_map(|w| signals.get(&w).map(|s| (w, s.subscribe())))
                .collect();
            let done = signals.get(&address).cloned();
            let (engine, sem, run) = (self.clone(), sem.clone(), run.clone());
            let name = address.clone();
            let task = tasks.spawn(async move {
                let mut result = None;
                for (w, mut rx) in waits {
                    let ok = rx
                        .wait_for(|v| v.is_some())
                        .await
                        .map(|v| *v == Some(true))
                        .unwrap_or(false);
                    if !ok {
                        result = Some(Outcome::failed(FailureKind::Skipped, skipped(&w)));
                        break;
                    }
                }
                let result = match result {
                    Some(r) => r,
                    None => match sem.acquire_owned().await {
                        // After a Ctrl-C nothing new starts; what runs winds down.
                        Ok(_) if engine.executor.cancel_token().level() > 0 => {
                            Outcome::Interrupted("not started".into())
                        }
                        Ok(_permit) => run(engine, address.clone()).await,
                        Err(_) => {
                            Outcome::failed(FailureKind::Internal, "internal: semaphore closed")
                        }
                    },
                };
                if let Some(tx) = &done {
                    tx.send_replace(Some(result.is_success()));
                }
                (address, result)
            });
            addresses.insert(task.id(), name);
        }
        let mut out = BTreeMap::new();
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok((address, outcome)) => {
                    out.insert(address, outcome);
                }
                // A panic is a bug; the resource it was about says where it happened.
                Err(e) => {
                    let address = addresses
                        .get(&e.id())
                        .cloned()
                        .unwrap_or_else(|| format!("task-{}", out.len()));
                    out.insert(
                        address,
                        Outcome::failed(FailureKind::Internal, format!("internal error: {e}")),
                    );
                }
            }
        }
        out
    }

    async fn run_change(&self, c: &Change, shared: &Arc<SharedObjects>) -> Outcome {
        let Some(want) = c.desired.clone() else {
            return Outcome::failed(
                FailureKind::Internal,
                "internal: change without desired settings",
            );
        };
        match c.action {
            Action::NoOp => Outcome::Unchanged,
            // `kubernetes` turned on for a machine that is up: the k3s machine reuses it.
            Action::Update
                if want.kubernetes
                    && self.k3s.is_some()
                    && self.k3s_capable(&want)
                    && self
                        .journal
                        .load(&c.address)
                        .await
                        .ok()
                        .flatten()
                        .is_some_and(|p| p.kind == record::LAUNCH) =>
            {
                self.launch(&c.address, want, shared).await
            }
            Action::Update => match self.journal.update_desired(&c.address, &want).await {
                Ok(()) => Outcome::Updated,
                Err(e) => Outcome::failed(FailureKind::State, e.to_string()),
            },
            // A preempted machine kept stopped: the launch machine deletes it itself and
            // records the preemption, which a teardown first would forget.
            Action::Replace if c.preempted_now => self.launch(&c.address, want, shared).await,
            Action::Replace => {
                match self.teardown(&c.address, &want.name).await {
                    Outcome::Destroyed => {}
                    other => return other,
                }
                self.launch(&c.address, want, shared).await
            }
            Action::Create | Action::Resume => {
                let seed = c.found.as_ref().map(|f| Owned {
                    adopted: true,
                    ..Owned::at(f.at(), vec![f.instance_id.clone()])
                });
                self.launch_from(&c.address, want, seed, shared).await
            }
            Action::Destroy => self.teardown(&c.address, &c.vm).await,
        }
    }

    async fn launch(&self, key: &str, want: VmSpec, shared: &Arc<SharedObjects>) -> Outcome {
        self.launch_from(key, want, None, shared).await
    }

    /// Runs the launch (or k3s) machine of `key`. A record that owns something starts
    /// from what it owns; otherwise `seed` (an instance found by identity that the state
    /// did not record: it is adopted, never created beside, never deleted on failure).
    async fn launch_from(
        &self,
        key: &str,
        want: VmSpec,
        seed: Option<Owned>,
        shared: &Arc<SharedObjects>,
    ) -> Outcome {
        // An interrupted destroy is finished before anything is created.
        let prev = self.journal.load(key).await.ok().flatten();
        if prev.as_ref().is_some_and(unfinished_teardown) {
            match self.teardown(key, &want.name).await {
                Outcome::Destroyed | Outcome::Leaked(_) => {}
                other => return other,
            }
        }
        self.journal.stage_desired(key, &want);
        let mut want = want;
        want.retry_until_up |= self.retry_until_up;
        // A moved machine keeps the name its cloud objects carry (the snapshot keeps the
        // config's): observe and cleanup must still find them.
        if let Some(n) = self.journal.cloud_name(key) {
            want.name = n;
        }
        let kubernetes = want.kubernetes && self.k3s_capable(&want);
        let mut m = LaunchMachine::new(
            want,
            self.lineage.clone(),
            self.ssh_public_key.clone(),
            self.providers.clone(),
            self.connector.clone(),
        );
        m.shared = Some(shared.clone());
        let start = move |prev: Option<PrevRecord>| {
            prev.as_ref()
                .and_then(|p| owned_of(p).ok().flatten())
                .or(seed.clone())
        };
        match (&self.k3s, kubernetes) {
            (Some(k), true) => {
                let mut m = K3sMachine::new(
                    m,
                    k.shell.clone(),
                    k.api.clone(),
                    k.kubeconfig_dir.clone(),
                    k.installer.clone(),
                );
                m.timeouts = k.timeouts;
                // Callers refuse unreadable records up front (plan::compute); the executor
                // itself rejects an unreadable record of its own kind.
                match self
                    .executor
                    .run(&m, key, |prev| K3sState::start(start(prev)))
                    .await
                {
                    Ok(K3sState::Ready { vm, .. }) => Outcome::Ready(vm),
                    Ok(s) => match s.leaked().and_then(leaked_outcome) {
                        Some(o) => o,
                        None => {
                            Outcome::Failed(Failure::ended(crate::machine::Machine::label(&m, &s)))
                        }
                    },
                    Err(ExecError::Interrupted { label, .. }) => Outcome::Interrupted(label),
                    Err(e) => Outcome::Failed(Failure::exec(&e)),
                }
            }
            _ => match self
                .executor
                .run(&m, key, |prev| LaunchState::start(start(prev)))
                .await
            {
                Ok(LaunchState::Ready { vm }) => Outcome::Ready(vm),
                Ok(s) => leaked_outcome(&s).unwrap_or_else(|| {
                    Outcome::Failed(Failure::ended(crate::machine::Machine::label(&m, &s)))
                }),
                Err(ExecError::Interrupted { label, .. }) => Outcome::Interrupted(label),
                Err(e) => Outcome::Failed(Failure::exec(&e)),
            },
        }
    }

    /// Whether any of the VM's clouds can host k3s (`Feature::Kubernetes`).
    fn k3s_capable(&self, vm: &VmSpec) -> bool {
        vm.clouds.iter().any(|c| {
            self.providers.get(c.as_str()).is_some_and(|p| {
                p.capabilities()
                    .supports(crate::provider::Feature::Kubernetes)
            })
        })
    }

    /// Tears down what `key`'s record owns; removes the record once the cloud confirms.
    async fn teardown(&self, key: &str, vm_name: &str) -> Outcome {
        let prev = self.journal.load(key).await.ok().flatten();
        let Some(prev) = prev else {
            return Outcome::Destroyed;
        };
        let resumable = unfinished_teardown(&prev);
        // A moved machine's cloud objects (and kubeconfig) still carry its old name.
        let cloud_name = self.journal.cloud_name(key);
        let vm_name = cloud_name.as_deref().unwrap_or(vm_name);
        // The cluster's kubeconfig (it holds the client key) goes with the VM: the file
        // gpuprov writes for this name, never a path read from the (editable) state.
        let kubeconfig = self
            .k3s
            .as_ref()
            .map(|k| k.kubeconfig_dir.join(format!("{vm_name}.yaml")));
        let owned = match owned_of(&prev) {
            Ok(o) => o,
            // Never drop a record we cannot read: it may be the only trace of a machine.
            Err(e) => {
                return Outcome::failed(
                    FailureKind::Record,
                    format!("refusing to destroy: the state record is {e}"),
                )
            }
        };
        if owned.is_none() && !resumable {
            return match self.journal.remove(key).await {
                Ok(()) => Outcome::Destroyed,
                Err(e) => Outcome::failed(FailureKind::State, e.to_string()),
            };
        }
        let m = TeardownMachine::new(self.providers.clone());
        let name = vm_name.to_string();
        let result = self
            .executor
            .run(&m, key, move |_| match owned {
                Some(o) => TeardownState::Requesting {
                    target: Target::of(o, &name),
                },
                None => TeardownState::Done,
            })
            .await;
        match result {
            Ok(TeardownState::Done) => {
                // Before the record goes: a crash in between must not leave the client
                // key behind with nothing in the state pointing at it.
                if let Some(path) = &kubeconfig {
                    let _ = std::fs::remove_file(path);
                }
                match self.journal.remove(key).await {
                    Ok(()) => Outcome::Destroyed,
                    Err(e) => Outcome::failed(FailureKind::State, e.to_string()),
                }
            }
            Ok(TeardownState::Leaked {
                location,
                instance_ids,
                reason,
            }) => Outcome::Leaked(format!(
                "{} at {location}: {reason}",
                instance_ids.join(",")
            )),
            Ok(other) => Outcome::failed(
                FailureKind::Internal,
                format!("teardown ended in {other:?}"),
            ),
            Err(ExecError::Interrupted { label, .. }) => Outcome::Interrupted(label),
            Err(e) => Outcome::Failed(Failure::exec(&e)),
        }
    }

    /// Destroys the given addresses concurrently (bounded by parallelism), each only
    /// after every machine that depends on it (per its applied `depends_on`) is gone;
    /// then the shared objects no remaining machine uses.
    pub async fn destroy(&self, addresses: &[String]) -> BTreeMap<String, Outcome> {
        let candidates = self.shared_of(addresses);
        let mut out = self.destroy_machines(addresses).await;
        out.extend(self.release_shared_with(candidates).await);
        out
    }

    /// The shared objects the machines at `addresses` used, by where they are recorded
    /// to be: how a state written before shared objects were resources (its machines
    /// used the project key without a record of it) still releases the key its release
    /// registered, found by identity.
    fn shared_of(&self, addresses: &[String]) -> Vec<crate::provider::SharedObject> {
        let snapshot = self.journal.snapshot();
        let mut out = Vec::new();
        for a in addresses {
            let Some(r) = snapshot.resources.get(a) else {
                continue;
            };
            let Some(o) = r.machine.owned().ok().flatten() else {
                continue;
            };
            let Some(p) = self.providers.get(&o.location.cloud) else {
                continue;
            };
            // Only the location matters to which objects a machine uses.
            let offer = crate::provider::Offer {
                id: String::new(),
                location: o.location.clone(),
                instance_type: String::new(),
                gpu: None,
                gpu_count: 0,
                spot: false,
                price_per_hour: 0.0,
                detail: serde_json::Value::Null,
                facts: Default::default(),
            };
            for obj in p.shared_objects(&offer) {
                if !out.contains(&obj) {
                    out.push(obj);
                }
            }
        }
        out
    }

    /// [`Engine::release_shared_with`] of the recorded objects alone.
    pub async fn release_shared(&self) -> BTreeMap<String, Outcome> {
        self.release_shared_with(Vec::new()).await
    }

    /// Tears down every shared object of the state that no remaining machine uses (the
    /// graph's order: after the last machine depending on it is gone), except those of a
    /// cloud set to `keep_shared` ([`Providers::keeps_shared`]). A machine uses an
    /// object when what it owns is at the object's cloud (and region), or when its applied
    /// settings may still launch it there. A cloud's kinds go in reverse declaration
    /// order ([`crate::provider::shared::declared`]: a key pair before the environment it
    /// lives in), and an object something still lives in (a later kind this release did
    /// not remove) is kept, `Leaked`, for the next run. Only objects gpuprov made are
    /// deleted (the user's own key is kept); the record leaves the state once the cloud
    /// confirms. Returns an outcome per object released or not.
    ///
    /// `candidates`: objects to release too when unrecorded (found by identity).
    pub async fn release_shared_with(
        &self,
        candidates: Vec<crate::provider::SharedObject>,
    ) -> BTreeMap<String, Outcome> {
        let snapshot = self.journal.snapshot();
        let mut out = BTreeMap::new();
        let mut todo: Vec<(String, Option<crate::provider::SharedObject>)> = snapshot
            .shared
            .iter()
            .map(|(address, rec)| {
                let prev = PrevRecord {
                    kind: rec.machine.kind.clone(),
                    state: rec.machine.state.to_value(),
                };
                (address.clone(), crate::vm::shared::object_of(&prev))
            })
            .collect();
        for c in candidates {
            if !snapshot.shared.contains_key(&c.address()) {
                todo.push((c.address(), Some(c)));
            }
        }
        // The graph's order backwards: a cloud's later kinds first (a Hyperstack key pair
        // before the environment it lives in). Unreadable records sort last.
        todo.sort_by_key(|(address, o)| match o {
            Some(o) => (
                false,
                o.cloud.clone(),
                std::cmp::Reverse(o.position()),
                address.clone(),
            ),
            None => (true, String::new(), std::cmp::Reverse(0), address.clone()),
        });
        // Objects this release tried and did not remove: what they live in stays too.
        let mut kept: Vec<crate::provider::SharedObject> = Vec::new();
        for (address, object) in &todo {
            let Some(object) = object else {
                // Never drop a record we cannot read.
                out.insert(
                    address.clone(),
                    Outcome::failed(
                        FailureKind::Record,
                        "refusing to release: the state record is unreadable",
                    ),
                );
                continue;
            };
            // `keep_shared = true`: the object and its record outlive the last machine.
            if self.providers.keeps_shared(&object.cloud) {
                continue;
            }
            let in_use = snapshot.resources.values().any(|r| {
                let at = r.machine.owned().ok().flatten().map(|o| o.location);
                let owned_here = at
                    .as_ref()
                    .is_some_and(|l| object.serves(&l.cloud, Some(&l.region)));
                let may_launch_here = r
                    .desired
                    .as_ref()
                    .and_then(|d| d.decode::<VmSpec>().ok())
                    .is_some_and(|v| {
                        v.clouds.iter().any(|c| c.as_str() == object.cloud)
                            && (v.regions.is_empty()
                                || v.regions
                                    .iter()
                                    .any(|reg| object.serves(&object.cloud, Some(reg))))
                    });
                owned_here || may_launch_here
            });
            if in_use {
                continue;
            }
            if let Some(inner) = kept.iter().find(|k| k.lives_in(object)) {
                out.insert(
                    address.clone(),
                    Outcome::Leaked(format!(
                        "kept: {} still lives in it; the next run releases both",
                        inner.address()
                    )),
                );
                kept.push(object.clone());
                continue;
            }
            let m = SharedTeardown {
                providers: self.providers.clone(),
                public_key: self.ssh_public_key.clone(),
            };
            let o = object.clone();
            let outcome = match self
                .executor
                .run(&m, address, move |_| SharedTeardownState::Observing {
                    object: o,
                })
                .await
            {
                Ok(SharedTeardownState::Deleted { .. }) => match self.journal.remove(address).await
                {
                    Ok(()) => Outcome::Destroyed,
                    Err(e) => Outcome::failed(FailureKind::State, e.to_string()),
                },
                Ok(SharedTeardownState::Leaked { reason, .. }) => Outcome::Leaked(reason),
                Ok(other) => {
                    Outcome::failed(FailureKind::Internal, format!("release ended in {other:?}"))
                }
                Err(ExecError::Interrupted { label, .. }) => Outcome::Interrupted(label),
                Err(e) => Outcome::Failed(Failure::exec(&e)),
            };
            if outcome != Outcome::Destroyed {
                kept.push(object.clone());
            }
            out.insert(address.clone(), outcome);
        }
        out
    }

    /// [`Engine::destroy`] of the machines alone.
    async fn destroy_machines(&self, addresses: &[String]) -> BTreeMap<String, Outcome> {
        let snapshot = self.journal.snapshot();
        let depends_on = |address: &str| -> Vec<String> {
            snapshot
                .resources
                .get(address)
                .and_then(|r| r.desired.as_ref())
                .and_then(|d| d.decode::<VmSpec>().ok())
                .map(|v| {
                    v.depends_on
                        .into_iter()
                        .map(|n| format!("vm.{n}"))
                        .collect()
                })
                .unwrap_or_default()
        };
        // A machine waits for its dependents: the machines whose depends_on names it.
        let jobs = addresses
            .iter()
            .map(|a| {
                let dependents = addresses
                    .iter()
                    .filter(|other| depends_on(other).contains(a))
                    .cloned()
                    .collect();
                (a.clone(), dependents)
            })
            .collect();
        let run = |engine: Engine, address: String| async move {
            let name = address.strip_prefix("vm.").unwrap_or(&address).to_string();
            engine.teardown(&address, &name).await
        };
        self.run_gated(
            jobs,
            |other| format!("skipped: {other}, which depends on it, was not destroyed"),
            run,
        )
        .await
    }
}
