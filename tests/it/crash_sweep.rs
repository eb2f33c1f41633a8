//! Crash sweep (issue 6) on the FakeProvider: every crash point a clean run passes
//! (journal writes of the launch and teardown machines, the engine's record removal, and
//! every provider side effect) is enumerated from a trace of clean runs; then, for each
//! point and each of its occurrences, a run dies there, and the next runs (a fresh engine,
//! the state reopened from disk) apply again and destroy. The cloud's own view is checked:
//! never two live instances for one VM, nothing left, and the state file is JSON that
//! `StateStore::open` accepts.
//!
//! "Dies" means: the armed point pends forever and notifies the test, which drops the
//! runtime and with it the engine, the journal handle and every task; the fake cloud and
//! the files on disk survive, as they would a `kill -9`.
//!
//! The same sweep also runs on the real Hyperstack and RunPod adapters over their
//! spec-checked local servers (issue 21, at the end of this file): their shared objects
//! (an environment and a key pair per region; the account's key set written by
//! read-modify-write) must survive a crash at every point.
//!
//! Needs the `crash-points` feature, which the self dev-dependency in Cargo.toml turns on
//! for every test build (this file does not compile without it).

use crate::support::clouds;
use crate::support::figures;
use crate::support::k3s as k3s_rig;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gpuprov::cluster::k3s::{K3sState, K3sTimeouts};
use gpuprov::config::Config;
use gpuprov::crash;
use gpuprov::engine::{Engine, K3sSetup, Outcome, StateJournal};
use gpuprov::machine::Providers;
use gpuprov::machine::{CancelToken, Executor};
use gpuprov::plan;
use gpuprov::provider::doubles::fake::{FakeConnector, FakeProvider, Op};
use gpuprov::provider::{ErrorKind, Feature, ProviderError};
use gpuprov::ssh::SshError;
use gpuprov::state::StateStore;

/// A scenario: how its fake cloud and SSH behave, and what a clean apply ends in.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Scenario {
    /// One VM, first offer works.
    Plain,
    /// The first offer has no capacity at create: compensation, then the next offer.
    Failover,
    /// The first SSH login fails locally: the new instance is torn down (compensation),
    /// the launch aborts.
    Compensation,
    /// Both offers are out of capacity once: the launch ends exhausted.
    Exhausted,
    /// As `Compensation`, but the compensating delete is refused once: the launch ends
    /// leaked, and the destroy resolves it.
    Leaked,
    /// A k3s cluster installed at boot (cloud-init): probe, API wait, kubeconfig,
    /// validation.
    K3sBoot,
    /// A k3s cluster on a cloud without boot scripts: the installer is pushed over SSH.
    K3sPush,
    /// A cloud that ignores the idempotency token and lists new instances late, as
    /// Lambda, DigitalOcean, RunPod and Hyperstack can.
    NoTokenListLag,
    /// A stopped instance carrying the machine's identity exists before the first
    /// apply (not in the state): apply leaves it untouched (`unowned`); only destroy
    /// deletes it.
    PreExisting,
    /// The recorded machine was stopped and its restart is refused (quota): apply keeps
    /// it and creates nothing; only destroy deletes it.
    RestartRefused,
    /// The first offer's prepare fails after creating its side resource: it is cleaned
    /// up before the next offer (another region) is tried.
    SideAbandoned,
    /// The state lost the machine (restored from an old backup): a running instance of
    /// its identity and lineage is in the cloud, discovery finds it, and apply adopts it
    /// instead of creating a second one (issue 18).
    Adopted,
    /// The cloud shares a project key between machines (issue 21): a journalled node of
    /// its own, created once, deleted after the last machine.
    SharedKey,
}

impl Scenario {
    fn cloud(self) -> FakeProvider {
        let c = FakeProvider::new("aws")
            .with_offer("east", "us-east-1", "p5.48xlarge", 98.0)
            .with_offer("west", "us-west-2", "p5.48xlarge", 99.0);
        match self {
            Scenario::Failover => c.with_fault(
                Op::Create,
                Some("east"),
                ProviderError::new(ErrorKind::Capacity, "no capacity"),
                1,
            ),
            Scenario::Exhausted => c
                .with_fault(
                    Op::Create,
                    Some("east"),
                    ProviderError::new(ErrorKind::Capacity, "no capacity"),
                    1,
                )
                .with_fault(
                    Op::Create,
                    Some("west"),
                    ProviderError::new(ErrorKind::Capacity, "no capacity"),
                    1,
                ),
            Scenario::Leaked => c.with_fault(
                Op::Delete,
                None,
                ProviderError::new(ErrorKind::Failed, "delete refused"),
                1,
            ),
            Scenario::K3sBoot => c.with_capabilities(caps(&[
                Feature::BootScript,
                Feature::Kubernetes,
                Feature::Firewall,
            ])),
            Scenario::K3sPush => c.with_capabilities(caps(&[Feature::Kubernetes])),
            Scenario::NoTokenListLag => c.with_list_lag(2),
            Scenario::RestartRefused => c.with_capabilities(caps(&[Feature::Start])),
            Scenario::SideAbandoned => c.with_fault(
                Op::Prepare,
                Some("east"),
                ProviderError::new(ErrorKind::Failed, "authorizing the security group failed"),
                1,
            ),
            Scenario::SharedKey => c.with_shared_key(None),
            _ => c,
        }
    }
    /// Whether the scenario starts with an instance that apply must never delete.
    fn has_kept_instance(self) -> bool {
        matches!(
            self,
            Scenario::PreExisting | Scenario::RestartRefused | Scenario::Adopted
        )
    }
    fn k3s(self) -> bool {
        matches!(self, Scenario::K3sBoot | Scenario::K3sPush)
    }
    fn connector(self) -> FakeConnector {
        let c = FakeConnector::default();
        if let Scenario::Compensation | Scenario::Leaked = self {
            c.fail_with(vec![SshError::Local("key file unreadable (test)".into())]);
        }
        c
    }
    /// Whether `o` is an acceptable end of an apply that was not interrupted.
    fn apply_ok(self, o: &Outcome) -> bool {
        match self {
            Scenario::Compensation => {
                matches!(o, Outcome::Ready(_))
                    || matches!(o, Outcome::Failed(m) if m.starts_with("aborted"))
            }
            Scenario::Exhausted => {
                matches!(o, Outcome::Ready(_))
                    || matches!(o, Outcome::Failed(m) if m.starts_with("exhausted"))
            }
            Scenario::Leaked => {
                matches!(o, Outcome::Ready(_) | Outcome::Leaked(_))
                    || matches!(o, Outcome::Failed(m) if m.starts_with("aborted"))
            }
            // Ready once a destroy (deliberately) removed the pre-existing instance.
            Scenario::PreExisting => {
                matches!(o, Outcome::Ready(_))
                    || matches!(o, Outcome::Failed(m) if m.starts_with("unowned"))
            }
            Scenario::RestartRefused => {
                matches!(o, Outcome::Ready(_))
                    || matches!(o, Outcome::Failed(m) if m.starts_with("aborted") && m.contains("no replacement"))
            }
            _ => matches!(o, Outcome::Ready(_)),
        }
    }
}

fn caps(features: &[Feature]) -> gpuprov::provider::Capabilities {
    let mut c = FakeProvider::new("aws").capabilities_for_test();
    c.supported = features.to_vec();
    c
}

/// The VM side of a k3s scenario: the scripted node and the API stand-in, which (like
/// the cloud) outlive every run; the API server runs on a runtime of its own.
struct K3sWorld {
    node: Arc<k3s_rig::Node>,
    connector: Arc<k3s_rig::StandIn>,
    _api: k3s_rig::ApiServer,
    _api_rt: tokio::runtime::Runtime,
}

impl K3sWorld {
    fn new(s: Scenario) -> K3sWorld {
        let pki = k3s_rig::Pki::new();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let api = rt.block_on(k3s_rig::ApiServer::start(
            &pki,
            &["127.0.0.1", "localhost"],
            1,
        ));
        let node = k3s_rig::Node::new(&pki);
        if s == Scenario::K3sBoot {
            node.installed_at_boot();
        }
        K3sWorld {
            connector: Arc::new(k3s_rig::StandIn {
                port: api.port,
                opened: Default::default(),
            }),
            node,
            _api: api,
            _api_rt: rt,
        }
    }
}

/// One project: a state file in a temp dir, one fake cloud that outlives every run.
struct World {
    dir: tempfile::TempDir,
    cloud: Arc<FakeProvider>,
    /// What the engine talks to: the fake itself, or a wrapper around it.
    provider: Arc<dyn gpuprov::provider::CloudProvider>,
    connector: Arc<FakeConnector>,
    k3s: Option<K3sWorld>,
    /// The instance apply must never delete ([`Scenario::has_kept_instance`]).
    kept: Option<String>,
    /// Apply plans with refresh (asks the cloud), as `gpuprov apply` does by default.
    refresh: bool,
    /// Apply folds discovery by identity into its plan, as `gpuprov apply` does with
    /// refresh.
    discover: bool,
    /// The machines' names: `dev` alone, or a fleet sharing one location
    /// ([`World::fleet`]).
    vms: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Phase {
    Apply,
    Destroy,
}

impl World {
    fn new(s: Scenario) -> World {
        let cloud = Arc::new(s.cloud());
        let mut w = World::bare(s, cloud);
        match s {
            Scenario::PreExisting => {
                let at = gpuprov::provider::Location {
                    cloud: "aws".into(),
                    region: "us-east-1".into(),
                    zone: None,
                };
                w.kept = Some(w.cloud.insert_instance(
                    "dev",
                    at,
                    gpuprov::provider::InstanceStatus::Stopped,
                ));
            }
            Scenario::RestartRefused => {
                // Set up before any crash point is armed or traced: the machine is up,
                // then stopped, and its restart is refused from now on.
                let out = w.run(Phase::Apply, None).expect("setup apply");
                assert!(matches!(out["vm.dev"], Outcome::Ready(_)), "{out:?}");
                let id = w.cloud.instances()[0].id.clone();
                w.cloud.stop_instance(&id);
                w.cloud.fault(
                    Op::Start,
                    None,
                    ProviderError::new(ErrorKind::Quota, "VcpuLimitExceeded"),
                    u32::MAX,
                );
                w.kept = Some(id);
            }
            Scenario::Adopted => {
                // A saved state (its lineage fixed), which does not know the instance.
                let (mut store, mut st) = StateStore::open(w.state_path()).unwrap();
                store.save(&mut st).unwrap();
                let at = gpuprov::provider::Location {
                    cloud: "aws".into(),
                    region: "us-east-1".into(),
                    zone: None,
                };
                w.kept = Some(w.cloud.insert_instance_of(
                    "dev",
                    &st.lineage,
                    at,
                    gpuprov::provider::InstanceStatus::Running,
                ));
            }
            _ => {}
        }
        w
    }

    fn bare(s: Scenario, cloud: Arc<FakeProvider>) -> World {
        World {
            dir: tempfile::tempdir().unwrap(),
            provider: match s {
                Scenario::NoTokenListLag => Arc::new(clouds::TestCloud {
                    inner: cloud.clone(),
                    no_token: true,
                    gate: None,
                }),
                _ => cloud.clone(),
            },
            cloud,
            connector: Arc::new(s.connector()),
            k3s: s.k3s().then(|| K3sWorld::new(s)),
            kept: None,
            refresh: s == Scenario::RestartRefused,
            discover: s == Scenario::Adopted,
            vms: vec!["dev".into()],
        }
    }

    /// `n` machines of scenario `s` with the same ask: every one's first offer is in
    /// us-east-1, so their observe calls share that location's listings.
    fn fleet(s: Scenario, n: usize) -> World {
        // A create is trusted gone only after 500 ms unlisted: the lag is counted in
        // listings, and 20 machines journalling on one thread may take longer than the
        // test cloud's 20 ms to make two.
        let mut caps = FakeProvider::new("aws").capabilities_for_test();
        caps.create_list_lag = Duration::from_millis(500);
        let mut w = World::bare(s, Arc::new(s.cloud().with_capabilities(caps)));
        w.vms = (0..n).map(|i| format!("m{i:02}")).collect();
        w
    }

    fn config(&self) -> String {
        let mut c = String::from("[defaults]\nclouds = [\"aws\"]\n");
        for vm in &self.vms {
            c.push_str(&format!("[vm.{vm}]\n"));
        }
        c
    }

    /// Whether the instance apply must never delete is still there.
    fn kept_alive(&self) -> bool {
        self.kept
            .as_ref()
            .is_none_or(|id| self.cloud.instances().iter().any(|i| &i.id == id))
    }

    fn state_path(&self) -> PathBuf {
        self.dir.path().join("gpuprov.state.json")
    }

    /// A fresh engine on the state as it is on disk (a new process would do the same).
    fn engine(&self) -> (Engine, Arc<StateJournal>) {
        let (store, state) = StateStore::open(self.state_path()).unwrap();
        let lineage = state.lineage.clone();
        let journal = Arc::new(StateJournal::new(store, state).unwrap());
        let mut providers = Providers::new();
        providers.insert(self.provider.clone());
        let engine = Engine {
            providers,
            connector: self.connector.clone(),
            journal: journal.clone(),
            executor: Executor::new(journal.clone(), CancelToken::new()),
            lineage,
            ssh_public_key: "ssh-ed25519 AAAAtest".into(),
            parallelism: self.vms.len().max(4),
            retry_until_up: false,
            k3s: self.k3s.as_ref().map(|k| K3sSetup {
                shell: k.node.clone(),
                api: k.connector.clone(),
                kubeconfig_dir: self.dir.path().join("kube"),
                installer: Default::default(),
                timeouts: K3sTimeouts {
                    boot_install: Duration::from_secs(5),
                    probe_interval: Duration::from_millis(2),
                    install: Duration::from_secs(5),
                    api: Duration::from_secs(2),
                    validate: Duration::from_secs(3),
                    api_poll: Duration::from_millis(2),
                },
            }),
        };
        (engine, journal)
    }

    /// Runs one phase in a runtime of its own. `None`: it died at the armed point (the
    /// runtime, engine and journal handle are dropped without a final save).
    fn run(&self, phase: Phase, hit: Option<&crash::Hit>) -> Option<BTreeMap<String, Outcome>> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let out = rt.block_on(async {
            let (engine, journal) = self.engine();
            let work = async {
                match phase {
                    Phase::Apply => {
                        let config =
                            Config::parse(Path::new("gpuprov.toml"), self.config()).unwrap();
                        let snapshot = journal.snapshot();
                        let observed = match self.refresh {
                            true => {
                                Some(plan::refresh(&snapshot, &engine.providers).await.unwrap())
                            }
                            false => None,
                        };
                        let mut plan =
                            plan::compute(&config, &snapshot, observed.as_ref(), &|_| Some(1.0))
                                .unwrap();
                        if self.discover {
                            let offered =
                                ["us-east-1", "us-west-2"].map(|r| gpuprov::provider::Location {
                                    cloud: "aws".into(),
                                    region: r.into(),
                                    zone: None,
                                });
                            let at = plan::discovery::locations(offered, &snapshot);
                            let found = plan::discovery::discover(&at, &engine.providers).await;
                            plan::discovery::fold(&mut plan, &snapshot, &found);
                        }
                        engine.apply(&plan).await
                    }
                    Phase::Destroy => {
                        let addresses: Vec<String> =
                            journal.snapshot().resources.keys().cloned().collect();
                        engine.destroy(&addresses).await
                    }
                }
            };
            let died = async {
                match hit {
                    Some(h) => h.wait().await,
                    None => std::future::pending().await,
                }
            };
            let res = tokio::time::timeout(Duration::from_secs(20), async {
                tokio::select! {
                    out = work => Some(out),
                    () = died => None,
                }
            })
            .await
            .unwrap_or_else(|_| panic!("{phase:?} hung"));
            if res.is_some() {
                journal.save_final().unwrap();
            }
            res
        });
        drop(rt);
        out
    }

    /// Live instances per VM name, as the cloud lists them.
    fn live(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for i in self.cloud.instances() {
            *m.entry(i.vm_name).or_insert(0) += 1;
        }
        m
    }

    /// The state on disk is JSON and the tool accepts it; returns its resource count.
    fn check_state(&self) -> Result<usize, String> {
        if let Ok(text) = std::fs::read_to_string(self.state_path()) {
            serde_json::from_str::<serde_json::Value>(&text)
                .map_err(|e| format!("state file is not JSON: {e}"))?;
        }
        let (_, st) =
            StateStore::open(self.state_path()).map_err(|e| format!("state refused: {e}"))?;
        Ok(st.resources.len() + st.shared.len())
    }
}

/// Runs apply then destroy cleanly, tracing every crash point passed.
fn clean_trace(s: Scenario) -> Vec<String> {
    clean_trace_of(s, World::new(s))
}

fn clean_trace_of(s: Scenario, w: World) -> Vec<String> {
    crash::disarm();
    crash::trace_start();
    let applied = w.run(Phase::Apply, None).expect("clean apply");
    let destroyed = w.run(Phase::Destroy, None).expect("clean destroy");
    let trace = crash::trace_take();
    assert_eq!(applied.len(), w.vms.len(), "{s:?}: {applied:?}");
    assert!(
        applied.values().all(|o| s.apply_ok(o)),
        "{s:?}: {applied:?}"
    );
    assert!(
        destroyed.values().all(|o| *o == Outcome::Destroyed),
        "{s:?}: {destroyed:?}"
    );
    assert!(w.cloud.instances().is_empty());
    assert!(w.cloud.side_resources().is_empty(), "{s:?}");
    assert!(w.cloud.shared_keys().is_empty(), "{s:?}");
    if s == Scenario::SharedKey {
        assert_eq!(
            w.cloud.shared_counts(),
            (1, 1),
            "created once, deleted once"
        );
    }
    trace
}

/// The machine kind a point belongs to, for the figures: the machine of a journal write
/// (`journal.before:<kind>:<state>`), `provider calls`, the engine's record removal, or
/// for any other point (for example the k3s layer's) the name up to its first `.` or `:`.
fn kind_of(point: &str) -> String {
    let mut parts = point.split(':');
    let head = parts.next().unwrap_or_default();
    match (head, parts.next()) {
        ("journal.before" | "journal.after", Some("remove")) => "engine (record removal)".into(),
        ("journal.before" | "journal.after", Some(kind)) => kind.into(),
        ("provider.before" | "provider.after", _) => "provider calls".into(),
        _ => head.split('.').next().unwrap_or(head).into(),
    }
}

/// Crashes at the `nth` hit of `point`, recovers, and returns what went wrong (empty:
/// nothing).
fn crash_and_recover(s: Scenario, point: &str, nth: u32) -> Vec<String> {
    crash_and_recover_in(s, World::new(s), point, nth)
}

fn crash_and_recover_in(s: Scenario, w: World, point: &str, nth: u32) -> Vec<String> {
    let mut problems = Vec::new();
    let hit = crash::arm(point, nth);
    let mut died = w.run(Phase::Apply, Some(&hit)).is_none();
    let died_in_apply = died;
    if !w.kept_alive() {
        problems.push("pre-existing destroyed by the crashed apply".into());
    }
    if !died {
        died = w.run(Phase::Destroy, Some(&hit)).is_none();
    }
    let at = crash::crashed();
    crash::disarm();
    if !died || at.as_deref() != Some(&format!("{point}#{nth}")) {
        return vec![format!(
            "never stopped at {point}#{nth} (stopped at {at:?})"
        )];
    }
    if let Err(e) = w.check_state() {
        problems.push(format!("after the crash: {e}"));
    }
    // The next runs: apply again, then destroy.
    match w.run(Phase::Apply, None) {
        // Unchanged: the crash came after the machine was recorded up, and it still is.
        Some(out)
            if out.len() == w.vms.len()
                && out
                    .values()
                    .all(|o| s.apply_ok(o) || *o == Outcome::Unchanged) => {}
        other => problems.push(format!("apply after the crash ended {other:?}")),
    }
    if w.live().values().any(|&n| n > 1) {
        problems.push(format!(
            "duplicate after re-apply: {:?}",
            w.cloud.instances()
        ));
    }
    // A destroy that ran (before its crash) may have removed it deliberately.
    if died_in_apply && !w.kept_alive() {
        problems.push("pre-existing destroyed by the apply after the crash".into());
    }
    // A cluster is whole again: recorded ready with its kubeconfig written.
    if s.k3s() {
        let kube = w.dir.path().join("kube/dev.yaml");
        let ready = StateStore::open(w.state_path())
            .ok()
            .and_then(|(_, st)| st.resources.get("vm.dev").cloned())
            .and_then(|r| r.machine.state.decode::<K3sState>().ok())
            .is_some_and(|k| {
                matches!(
                    k,
                    K3sState::Ready {
                        cluster: Some(_),
                        ..
                    }
                )
            });
        if !ready || !kube.exists() {
            problems.push(format!(
                "cluster not whole after re-apply (recorded ready: {ready}, kubeconfig: {})",
                kube.exists()
            ));
        }
    }
    // A teardown the cloud refused ends leaked; the next run resolves it (a scripted
    // refusal the crashed run never reached is met here).
    let mut destroyed = w.run(Phase::Destroy, None);
    if let Some(out) = &destroyed {
        if out.values().any(|o| matches!(o, Outcome::Leaked(_))) {
            destroyed = w.run(Phase::Destroy, None);
        }
    }
    match destroyed {
        Some(out) if out.values().all(|o| *o == Outcome::Destroyed) => {}
        other => problems.push(format!("destroy ended {other:?}")),
    }
    if w.cloud.peak_instances_per_vm() > 1 {
        problems.push(format!(
            "duplicate: {} live instances for one VM at once",
            w.cloud.peak_instances_per_vm()
        ));
    }
    if !w.cloud.instances().is_empty() {
        problems.push(format!("leaked: {:?}", w.cloud.instances()));
    }
    if !w.cloud.side_resources().is_empty() {
        problems.push(format!(
            "leaked side resources: {:?}",
            w.cloud.side_resources()
        ));
    }
    // One creation per life of the key: a crash in the apply leaves one apply and one
    // destroy in all (one creation); a crash in the destroy comes after a destroy that
    // may have deleted it, so the next apply creates it again (two).
    let (created, deleted) = w.cloud.shared_counts();
    let lives = if died_in_apply { 1 } else { 2 };
    if created > lives || created > deleted + 1 {
        problems.push(format!(
            "duplicate: shared key created {created} times ({deleted} deleted, {lives} allowed)"
        ));
    }
    if !w.cloud.shared_keys().is_empty() {
        problems.push(format!(
            "leaked shared objects after the last destroy: {:?}",
            w.cloud.shared_keys()
        ));
    }
    if w.dir.path().join("kube/dev.yaml").exists() {
        problems.push("the destroyed cluster's kubeconfig (client key) was left".into());
    }
    match w.check_state() {
        Ok(0) => {}
        Ok(n) => problems.push(format!("{n} resources left in the state")),
        Err(e) => problems.push(e),
    }
    problems
}

#[test]
fn every_crash_point_recovers_without_duplicates_or_leaks() {
    let scenarios = [
        ("plain", Scenario::Plain),
        ("failover", Scenario::Failover),
        ("compensation", Scenario::Compensation),
        ("exhausted", Scenario::Exhausted),
        ("leaked", Scenario::Leaked),
        ("k3s-boot", Scenario::K3sBoot),
        ("k3s-push", Scenario::K3sPush),
        ("no-token-list-lag", Scenario::NoTokenListLag),
        ("pre-existing", Scenario::PreExisting),
        ("restart-refused", Scenario::RestartRefused),
        ("side-abandoned", Scenario::SideAbandoned),
        ("adopted", Scenario::Adopted),
        ("shared-key", Scenario::SharedKey),
    ];
    let mut failures = Vec::new();
    // Per machine kind: every point name seen, and those whose every occurrence passed.
    let mut total: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut bad: BTreeSet<String> = BTreeSet::new();
    let (mut runs, mut leaks, mut duplicates, mut kept_destroyed) = (0u32, 0u32, 0u32, 0u32);
    let mut per_scenario = serde_json::Map::new();
    for (label, s) in scenarios {
        let trace = clean_trace(s);
        assert!(
            s.has_kept_instance() || trace.iter().any(|p| p == "provider.after:create"),
            "{label}: the trace covers a create call: {trace:?}"
        );
        let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
        for point in &trace {
            let nth = seen.entry(point).or_insert(0);
            *nth += 1;
            total
                .entry(kind_of(point))
                .or_default()
                .insert(point.clone());
            runs += 1;
            let problems = crash_and_recover(s, point, *nth);
            leaks += problems.iter().filter(|p| p.starts_with("leaked")).count() as u32;
            duplicates += problems
                .iter()
                .filter(|p| p.starts_with("duplicate"))
                .count() as u32;
            kept_destroyed += problems
                .iter()
                .filter(|p| p.starts_with("pre-existing destroyed"))
                .count() as u32;
            if !problems.is_empty() {
                bad.insert(point.clone());
                failures.push(format!("{label} {point}#{nth}: {}", problems.join("; ")));
            }
        }
        per_scenario.insert(label.into(), serde_json::json!(trace.len()));
    }
    let kinds: serde_json::Map<String, serde_json::Value> = total
        .iter()
        .map(|(k, names)| {
            let covered = names.iter().filter(|n| !bad.contains(*n)).count();
            (
                k.to_string(),
                serde_json::json!({"covered": covered, "total": names.len()}),
            )
        })
        .collect();
    figures::write(
        "crash_sweep_fake",
        &serde_json::json!({
            "cloud": "fake",
            "kinds": kinds,
            "crash_runs": runs,
            "occurrences_per_scenario": per_scenario,
            "leaks": leaks,
            "duplicates": duplicates,
            "pre_existing_destroyed": kept_destroyed,
            "failures": failures,
        }),
    );
    assert!(
        failures.is_empty(),
        "{} of {runs} crash runs went wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // The sweep must have covered both machines and the provider side effects.
    for k in [
        "launch",
        "teardown",
        "k3s",
        "provider calls",
        "engine (record removal)",
        "shared",
        "shared_teardown",
    ] {
        assert!(total.contains_key(k), "no crash point of {k} was traced");
    }
}

/// Issue 20: 20 machines sharing one location (their observe calls answered from shared
/// listings), on a cloud that ignores the idempotency token and lists new instances late:
/// a crash at each point a clean run passes (its first, a middle and its last occurrence)
/// leaves no duplicate and no leak after the next apply and destroy.
#[test]
fn twenty_machines_sharing_a_location_recover_from_every_crash_point() {
    const N: usize = 20;
    let s = Scenario::NoTokenListLag;
    let trace = clean_trace_of(s, World::fleet(s, N));
    let mut count: BTreeMap<&str, u32> = BTreeMap::new();
    for p in &trace {
        *count.entry(p.as_str()).or_insert(0) += 1;
    }
    assert!(
        count.get("provider.after:create").copied().unwrap_or(0) >= N as u32,
        "every machine created: {count:?}"
    );
    let mut failures = Vec::new();
    let (mut runs, mut missed) = (0, 0);
    for (point, &n) in &count {
        let mut nths: Vec<u32> = vec![1, n.div_ceil(2), n];
        nths.dedup();
        for nth in nths {
            runs += 1;
            let problems = crash_and_recover_in(s, World::fleet(s, N), point, nth);
            // 20 machines interleave differently each run: a late occurrence the clean
            // run passed may not come (fewer polls); that run proves nothing either way.
            if problems.len() == 1 && problems[0].starts_with("never stopped") {
                missed += 1;
                continue;
            }
            if !problems.is_empty() {
                failures.push(format!("{point}#{nth}: {}", problems.join("; ")));
            }
        }
    }
    assert!(runs > 10, "the sweep ran: {count:?}");
    assert!(
        missed * 5 <= runs,
        "{missed} of {runs} runs never reached their crash point"
    );
    assert!(
        failures.is_empty(),
        "{} of {runs} crash runs went wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

// Issue 21 on the real adapters: the sweep run against the spec-checked local servers of
// Hyperstack (an environment and a key pair per region, the key pair living in the
// environment) and RunPod (the account's whole key set, written by read-modify-write).
// The fake cloud above proves the core's machines; these prove that each adapter's
// observe, create and delete of its shared objects recover from a crash at every point
// (a create whose answer was lost is found, by name or by value, not made again).

use crate::support::drive::{LINEAGE as SPEC_LINEAGE, PUBKEY as SPEC_PUBKEY};
use crate::vendor::{hyperstack as hs, runpod as rp};

/// The adapters swept against their local servers.
#[derive(Clone, Copy, Debug, PartialEq)]
enum SpecCloud {
    Hyperstack,
    Runpod,
}

/// Machines per project: one. A crash run takes seconds here (the real adapter over
/// HTTP, each request checked against the vendor's description), so two machines, which
/// double the points, do not fit a test's time budget; machines meeting at the
/// single-flight guard are proven by `shared_objects` (20 machines, 20 rounds).
const SPEC_VMS: usize = 1;

/// One project on one local server. The server lives on a runtime of its own, so it
/// outlives every run, as the cloud outlives a `kill -9`.
struct SpecWorld {
    cloud: SpecCloud,
    dir: tempfile::TempDir,
    provider: Arc<dyn gpuprov::provider::CloudProvider>,
    hs: Option<hs::Fake>,
    rp: Option<rp::Fake>,
    rt: tokio::runtime::Runtime,
}

impl Drop for SpecWorld {
    fn drop(&mut self) {
        let _in = self.rt.enter();
        self.hs.take();
        self.rp.take();
    }
}

impl SpecWorld {
    fn new(cloud: SpecCloud) -> SpecWorld {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        // The local servers list a new instance at once: a create is trusted gone after
        // 1 s unlisted (the clouds' declared 20 s would make each crash run wait that).
        let caps = |defaults| gpuprov::provider::Capabilities {
            create_list_lag: Duration::from_secs(1),
            min_create_interval: Duration::ZERO,
            ..crate::support::drive::test_capabilities(defaults)
        };
        let lineage: gpuprov::provider::Lineage = SPEC_LINEAGE.parse().unwrap();
        let (hs, rp, provider): (_, _, Arc<dyn gpuprov::provider::CloudProvider>) = match cloud {
            SpecCloud::Hyperstack => {
                use gpuprov::provider::clouds::hyperstack::{
                    ApiKey, HyperstackProvider, HyperstackSettings,
                };
                let f = rt.block_on(hs::Fake::start(hs::h100_world()));
                let p = HyperstackProvider::new(HyperstackSettings {
                    endpoint: Some(format!("{}/v1", f.server.uri())),
                    api_key: Some(ApiKey::new(hs::SENTINEL)),
                    lineage,
                })
                .with_capabilities(caps(HyperstackProvider::default_capabilities()));
                (Some(f), None, Arc::new(p))
            }
            SpecCloud::Runpod => {
                use gpuprov::provider::clouds::runpod::{ApiKey, RunpodProvider, RunpodSettings};
                let f = rt.block_on(rp::Fake::start(rp::h100_world()));
                let p = RunpodProvider::new(RunpodSettings {
                    endpoint: Some(f.server.uri()),
                    api_key: Some(ApiKey::new(rp::SENTINEL)),
                    key_source: "the test".into(),
                    lineage,
                })
                .with_capabilities(caps(RunpodProvider::default_capabilities()));
                (None, Some(f), Arc::new(p))
            }
        };
        let dir = tempfile::tempdir().unwrap();
        // The adapters label with the test lineage: the state must carry it.
        let (mut store, mut st) = StateStore::open(dir.path().join("gpuprov.state.json")).unwrap();
        st.lineage = SPEC_LINEAGE.into();
        store.save(&mut st).unwrap();
        SpecWorld {
            cloud,
            dir,
            provider,
            hs,
            rp,
            rt,
        }
    }

    fn state_path(&self) -> PathBuf {
        self.dir.path().join("gpuprov.state.json")
    }

    fn config(&self) -> String {
        let (cloud, region) = match self.cloud {
            SpecCloud::Hyperstack => ("hyperstack", "CANADA-1"),
            SpecCloud::Runpod => ("runpod", "US-KS-2"),
        };
        let mut c = format!(
            "[defaults]\nclouds = [\"{cloud}\"]\nregions = [\"{region}\"]\ngpu = \"H100\"\ngpu_count = 8\n"
        );
        for i in 0..SPEC_VMS {
            c.push_str(&format!("[vm.m{i}]\n"));
        }
        c
    }

    fn engine(&self) -> (Engine, Arc<StateJournal>) {
        let (store, state) = StateStore::open(self.state_path()).unwrap();
        let journal = Arc::new(StateJournal::new(store, state).unwrap());
        let mut providers = Providers::new();
        providers.insert(self.provider.clone());
        let engine = Engine {
            providers,
            connector: Arc::new(FakeConnector::default()),
            journal: journal.clone(),
            executor: Executor::new(journal.clone(), CancelToken::new()),
            lineage: SPEC_LINEAGE.into(),
            ssh_public_key: SPEC_PUBKEY.into(),
            parallelism: SPEC_VMS,
            retry_until_up: false,
            k3s: None,
        };
        (engine, journal)
    }

    /// As [`World::run`]: one phase in a runtime of its own; `None` when it died at the
    /// armed point.
    fn run(&self, phase: Phase, hit: Option<&crash::Hit>) -> Option<BTreeMap<String, Outcome>> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let out = rt.block_on(async {
            let (engine, journal) = self.engine();
            let work = async {
                match phase {
                    Phase::Apply => {
                        let config =
                            Config::parse(Path::new("gpuprov.toml"), self.config()).unwrap();
                        let plan =
                            plan::compute(&config, &journal.snapshot(), None, &|_| Some(1.0))
                                .unwrap();
                        engine.apply(&plan).await
                    }
                    Phase::Destroy => {
                        let addresses: Vec<String> =
                            journal.snapshot().resources.keys().cloned().collect();
                        engine.destroy(&addresses).await
                    }
                }
            };
            let died = async {
                match hit {
                    Some(h) => h.wait().await,
                    None => std::future::pending().await,
                }
            };
            let res = tokio::time::timeout(Duration::from_secs(60), async {
                tokio::select! {
                    out = work => Some(out),
                    () = died => None,
                }
            })
            .await
            .unwrap_or_else(|_| panic!("{:?} {phase:?} hung", self.cloud));
            if res.is_some() {
                journal.save_final().unwrap();
            }
            res
        });
        drop(rt);
        out
    }

    fn server(&self) -> &crate::support::spec::SpecServer {
        match (&self.hs, &self.rp) {
            (Some(f), _) => &f.server,
            (_, Some(f)) => &f.server,
            _ => unreachable!("a world has one server"),
        }
    }

    /// Live instances per name, as the server lists them.
    fn live(&self) -> BTreeMap<String, usize> {
        let names: Vec<String> = match (&self.hs, &self.rp) {
            (Some(f), _) => f
                .world
                .lock()
                .unwrap()
                .vms
                .iter()
                .filter(|v| v["status"] != "DELETING" && v["status"] != "DELETED")
                .map(|v| v["name"].as_str().unwrap_or_default().to_string())
                .collect(),
            (_, Some(f)) => f
                .world
                .lock()
                .unwrap()
                .pods
                .iter()
                .map(|p| p["name"].as_str().unwrap_or_default().to_string())
                .collect(),
            _ => unreachable!(),
        };
        let mut m = BTreeMap::new();
        for n in names {
            *m.entry(n).or_insert(0) += 1;
        }
        m
    }

    /// Instance creates the server accepted or refused, per name.
    fn creates_per_name(&self) -> BTreeMap<String, usize> {
        let path = match self.cloud {
            SpecCloud::Hyperstack => hs::VMS,
            SpecCloud::Runpod => rp::PODS,
        };
        let mut m = BTreeMap::new();
        for r in self.server().requests_to("POST", path) {
            let name = r
                .body
                .as_ref()
                .and_then(|b| b["name"].as_str().map(str::to_string));
            *m.entry(name.unwrap_or_default()).or_insert(0) += 1;
        }
        m
    }

    /// Creations of each shared object the server saw: Hyperstack's environment and key
    /// pair imports (every `POST`), RunPod's writes of the key set that add the project
    /// key (a `PUT` holding it when the set before did not).
    fn shared_creates(&self) -> Vec<(&'static str, usize)> {
        let server = self.server();
        match self.cloud {
            SpecCloud::Hyperstack => vec![
                (
                    "environment",
                    server.requests_to("POST", "/v1/core/environments").len(),
                ),
                (
                    "key pair",
                    server.requests_to("POST", "/v1/core/keypairs").len(),
                ),
            ],
            SpecCloud::Runpod => {
                let project = gpuprov::provider::kit::keys::key_value(SPEC_PUBKEY);
                let holds = |keys: &[String]| {
                    keys.iter()
                        .any(|k| gpuprov::provider::kit::keys::key_value(k) == project)
                };
                let mut before = rp::h100_world().keys;
                let mut adds = 0;
                for r in server.requests_to("PUT", rp::KEYS) {
                    let after: Vec<String> = r
                        .body
                        .as_ref()
                        .and_then(|b| b["keys"].as_array().cloned())
                        .unwrap_or_default()
                        .into_iter()
                        .filter_map(|k| k.as_str().map(str::to_string))
                        .collect();
                    if holds(&after) && !holds(&before) {
                        adds += 1;
                    }
                    before = after;
                }
                vec![("project key in the key set", adds)]
            }
        }
    }

    /// gpuprov's shared objects still at the cloud.
    fn shared_left(&self) -> Vec<String> {
        match (&self.hs, &self.rp) {
            (Some(f), _) => {
                let w = f.world.lock().unwrap();
                w.environments
                    .iter()
                    .chain(&w.keypairs)
                    .map(|v| v["name"].as_str().unwrap_or_default().to_string())
                    .collect()
            }
            (_, Some(f)) => f
                .world
                .lock()
                .unwrap()
                .keys
                .iter()
                .filter(|k| k.as_str() != rp::USER_KEY)
                .cloned()
                .collect(),
            _ => unreachable!(),
        }
    }

    /// What the user had before gpuprov that must survive: RunPod's own key in the set.
    fn users_kept(&self) -> bool {
        match &self.rp {
            Some(f) => f
                .world
                .lock()
                .unwrap()
                .keys
                .iter()
                .any(|k| k == rp::USER_KEY),
            None => true,
        }
    }

    fn state_len(&self) -> Result<usize, String> {
        if let Ok(text) = std::fs::read_to_string(self.state_path()) {
            serde_json::from_str::<serde_json::Value>(&text)
                .map_err(|e| format!("state file is not JSON: {e}"))?;
        }
        let (_, st) =
            StateStore::open(self.state_path()).map_err(|e| format!("state refused: {e}"))?;
        Ok(st.resources.len() + st.shared.len())
    }
}

/// A clean apply and destroy of `cloud`, traced.
fn spec_clean_trace(cloud: SpecCloud) -> Vec<String> {
    let w = SpecWorld::new(cloud);
    crash::disarm();
    crash::trace_start();
    let applied = w.run(Phase::Apply, None).expect("clean apply");
    let destroyed = w.run(Phase::Destroy, None).expect("clean destroy");
    let trace = crash::trace_take();
    let vms = applied.keys().filter(|a| a.starts_with("vm.")).count();
    assert_eq!(vms, SPEC_VMS, "{cloud:?}: {applied:?}");
    assert!(
        applied.values().all(|o| matches!(o, Outcome::Ready(_))),
        "{cloud:?}: {applied:?}"
    );
    assert!(
        destroyed.values().all(|o| *o == Outcome::Destroyed),
        "{cloud:?}: {destroyed:?}"
    );
    assert!(
        w.live().is_empty() && w.shared_left().is_empty(),
        "{cloud:?}"
    );
    for (what, n) in w.shared_creates() {
        assert_eq!(n, 1, "{cloud:?}: {what} created once");
    }
    assert!(w.users_kept());
    trace
}

/// Crashes `cloud`'s project at the `nth` hit of `point`, recovers (apply, destroy) and
/// returns what went wrong.
fn spec_crash_and_recover(cloud: SpecCloud, point: &str, nth: u32) -> Vec<String> {
    let w = SpecWorld::new(cloud);
    let mut problems = Vec::new();
    let hit = crash::arm(point, nth);
    let mut died = w.run(Phase::Apply, Some(&hit)).is_none();
    let died_in_apply = died;
    if !died {
        died = w.run(Phase::Destroy, Some(&hit)).is_none();
    }
    let at = crash::crashed();
    crash::disarm();
    if !died || at.as_deref() != Some(&format!("{point}#{nth}")) {
        return vec![format!(
            "never stopped at {point}#{nth} (stopped at {at:?})"
        )];
    }
    if let Err(e) = w.state_len() {
        problems.push(format!("after the crash: {e}"));
    }
    match w.run(Phase::Apply, None) {
        Some(out)
            if out.keys().filter(|a| a.starts_with("vm.")).count() == SPEC_VMS
                && out.iter().all(|(a, o)| {
                    matches!(o, Outcome::Ready(_) | Outcome::Unchanged)
                        || (a.starts_with("shared.") && *o == Outcome::Destroyed)
                }) => {}
        other => problems.push(format!("apply after the crash ended {other:?}")),
    }
    if w.live().values().any(|&n| n > 1) {
        problems.push(format!("duplicate after re-apply: {:?}", w.live()));
    }
    let mut destroyed = w.run(Phase::Destroy, None);
    if let Some(out) = &destroyed {
        if out.values().any(|o| matches!(o, Outcome::Leaked(_))) {
            destroyed = w.run(Phase::Destroy, None);
        }
    }
    match destroyed {
        Some(out) if out.values().all(|o| *o == Outcome::Destroyed) => {}
        other => problems.push(format!("destroy ended {other:?}")),
    }
    if !w.live().is_empty() {
        problems.push(format!("leaked: {:?}", w.live()));
    }
    // One creation per life: a crash in the apply leaves one life in all; a crash in the
    // destroy may come after it deleted them, so the next apply makes them again.
    let lives = if died_in_apply { 1 } else { 2 };
    for (name, n) in w.creates_per_name() {
        if n > lives {
            problems.push(format!(
                "duplicate: {name} created {n} times ({lives} allowed)"
            ));
        }
    }
    for (what, n) in w.shared_creates() {
        if n > lives {
            problems.push(format!(
                "duplicate: shared {what} created {n} times ({lives} allowed)"
            ));
        }
    }
    if !w.shared_left().is_empty() {
        problems.push(format!(
            "leaked shared objects after the last destroy: {:?}",
            w.shared_left()
        ));
    }
    if !w.users_kept() {
        problems.push("the user's own key was removed".into());
    }
    let violations = w.server().violations();
    if !violations.is_empty() {
        problems.push(format!("requests off the spec: {violations:?}"));
    }
    match w.state_len() {
        Ok(0) => {}
        Ok(n) => problems.push(format!("{n} resources left in the state")),
        Err(e) => problems.push(e),
    }
    problems
}

/// Every crash point (each occurrence) of a clean apply and destroy of a machine on
/// `cloud`'s spec-checked server, through the real adapter: after the next apply and
/// destroy, no instance or shared object is left, none was made twice (per life),
/// RunPod's user key is still in the set, and the state is empty. `(part, parts)`: this
/// test sweeps the occurrences whose index in the trace is `part` modulo `parts` (a
/// sweep too long for one test's time budget is split over several). Figures in
/// `<target>/reliability/crash_sweep_spec_<cloud>[_<part>].json`.
fn spec_sweep(cloud: SpecCloud, (part, parts): (usize, usize)) {
    let started = std::time::Instant::now();
    let mut failures = Vec::new();
    let trace = spec_clean_trace(cloud);
    for p in [
        "provider.after:create_shared",
        "provider.after:delete_shared",
        "provider.after:create",
        "journal.before:shared:creating",
        "journal.before:shared_teardown:deleting",
    ] {
        assert!(
            trace.iter().any(|t| t == p),
            "{cloud:?}: {p} traced: {trace:?}"
        );
    }
    let (mut runs, mut missed, mut leaks, mut duplicates) = (0u32, 0u32, 0u32, 0u32);
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    for (i, point) in trace.iter().enumerate() {
        let nth = seen.entry(point).or_insert(0);
        *nth += 1;
        if i % parts != part {
            continue;
        }
        runs += 1;
        let problems = spec_crash_and_recover(cloud, point, *nth);
        // A later occurrence the clean run passed may not come again (fewer polls);
        // that run proves nothing either way.
        if problems.len() == 1 && problems[0].starts_with("never stopped") {
            missed += 1;
            continue;
        }
        leaks += problems.iter().filter(|p| p.starts_with("leaked")).count() as u32;
        duplicates += problems
            .iter()
            .filter(|p| p.starts_with("duplicate"))
            .count() as u32;
        if !problems.is_empty() {
            failures.push(format!("{point}#{nth}: {}", problems.join("; ")));
        }
    }
    let name = format!("{cloud:?}").to_lowercase();
    let file = match parts {
        1 => format!("crash_sweep_spec_{name}"),
        _ => format!("crash_sweep_spec_{name}_{part}"),
    };
    figures::write(
        &file,
        &serde_json::json!({
            "cloud": name,
            "part": format!("{} of {parts}", part + 1),
            "trace_points": trace.len(),
            "machines": SPEC_VMS,
            "crash_runs": runs,
            "missed": missed,
            "leaks": leaks,
            "duplicates": duplicates,
            "seconds": started.elapsed().as_secs(),
            "failures": failures,
        }),
    );
    assert!(
        missed * 5 <= runs,
        "{cloud:?}: {missed} of {runs} runs never reached their crash point"
    );
    assert!(
        failures.is_empty(),
        "{cloud:?}: {} of {runs} crash runs went wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Hyperstack: the environment and the key pair of the region (the key pair lives in
/// the environment, so it is prepared after it and deleted before it). Every request is
/// checked against Hyperstack's large description, so a crash run takes 2.5 to 5 s: the
/// 74 occurrences are split over four tests.
#[test]
fn hyperstack_shared_objects_recover_from_every_crash_point_1() {
    spec_sweep(SpecCloud::Hyperstack, (0, 4));
}

/// The second quarter of [`hyperstack_shared_objects_recover_from_every_crash_point_1`].
#[test]
fn hyperstack_shared_objects_recover_from_every_crash_point_2() {
    spec_sweep(SpecCloud::Hyperstack, (1, 4));
}

/// The third quarter of [`hyperstack_shared_objects_recover_from_every_crash_point_1`].
#[test]
fn hyperstack_shared_objects_recover_from_every_crash_point_3() {
    spec_sweep(SpecCloud::Hyperstack, (2, 4));
}

/// The last quarter of [`hyperstack_shared_objects_recover_from_every_crash_point_1`].
#[test]
fn hyperstack_shared_objects_recover_from_every_crash_point_4() {
    spec_sweep(SpecCloud::Hyperstack, (3, 4));
}

/// RunPod: the account's key set, written by read-modify-write (the user's own key in it
/// must survive every crash).
#[test]
fn runpod_key_set_recovers_from_every_crash_point() {
    spec_sweep(SpecCloud::Runpod, (0, 1));
}
