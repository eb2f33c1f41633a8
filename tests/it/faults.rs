//! Fault matrix (issue 6) on the FakeProvider, through the engine and the state-file
//! journal: transient errors at a seeded rate, 429 with Retry-After, calls slow enough to
//! pass the boot deadline, a delete that keeps failing (Leaked, shown by `status`, resolved
//! by the next run), many VMs in parallel, and an SSH-unreachable machine that must never
//! count as deleted. Every run has its own bound; every test checks the cloud's own view
//! (no duplicate, nothing left). Each test writes its figures to
//! `<target>/reliability/faults_<test>.json`.
//!
//! Field failures covered elsewhere (not repeated here):
//! - resumed run lists nothing right after a create:
//!   `tests/it/launch.rs::a_resumed_create_that_lists_nothing_yet_does_not_duplicate`;
//! - Ctrl-C while a create is in flight:
//!   `tests/it/launch.rs::cancel_while_a_create_is_in_flight_records_then_tears_down`;
//! - an instance vanishing while booting:
//!   `tests/it/launch.rs::an_instance_vanishing_while_booting_is_replaced`;
//! - an unreachable cloud API never counts as deleted:
//!   `tests/it/launch.rs::teardown_with_an_unreachable_api_is_leaked_never_done`.

use crate::support::figures;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gpuprov::config::Config;
use gpuprov::engine::{Engine, Outcome, StateJournal};
use gpuprov::machine::Providers;
use gpuprov::machine::{CancelToken, Executor};
use gpuprov::plan;
use gpuprov::provider::doubles::fake::{FakeConnector, FakeProvider, Op};
use gpuprov::provider::ProviderError;
use gpuprov::ssh::SshError;
use gpuprov::state::StateStore;

/// The bound on one apply or destroy: 30 minutes of the paused test clock, which costs
/// no real time. Retries back off for seconds each (up to 30 s), and a seeded 30% fault
/// rate can chain many of them; a hang would never finish at all.
const VIRTUAL_BOUND: Duration = Duration::from_secs(30 * 60);

struct Setup {
    dir: tempfile::TempDir,
    cloud: Arc<FakeProvider>,
    connector: Arc<FakeConnector>,
    parallelism: usize,
}

type Outcomes = BTreeMap<String, Outcome>;

impl Setup {
    fn new(cloud: FakeProvider) -> Setup {
        Setup {
            dir: tempfile::tempdir().unwrap(),
            cloud: Arc::new(cloud),
            connector: Arc::new(FakeConnector::default()),
            parallelism: 4,
        }
    }

    fn state_path(&self) -> std::path::PathBuf {
        self.dir.path().join("gpuprov.state.json")
    }

    fn engine(&self) -> (Engine, Arc<StateJournal>) {
        let (store, state) = StateStore::open(self.state_path()).unwrap();
        let lineage = state.lineage.clone();
        let journal = Arc::new(StateJournal::new(store, state).unwrap());
        let mut providers = Providers::new();
        providers.insert(self.cloud.clone());
        let engine = Engine {
            providers,
            connector: self.connector.clone(),
            journal: journal.clone(),
            executor: Executor::new(journal.clone(), CancelToken::new()),
            lineage,
            ssh_public_key: "ssh-ed25519 AAAAtest".into(),
            parallelism: self.parallelism,
            retry_until_up: false,
            k3s: None,
        };
        (engine, journal)
    }

    async fn apply(&self, toml: &str) -> Outcomes {
        self.apply_with(toml, false).await
    }

    /// Applies `toml`; with `resume`, every machine goes through its launch machine again
    /// (as when a refresh finds it needs looking at), even one recorded up.
    async fn apply_with(&self, toml: &str, resume: bool) -> Outcomes {
        let config = Config::parse(Path::new("gpuprov.toml"), toml.to_string()).unwrap();
        let (engine, journal) = self.engine();
        let mut plan = plan::compute(&config, &journal.snapshot(), None, &|_| Some(1.0)).unwrap();
        if resume {
            for c in &mut plan.changes {
                c.action = plan::Action::Resume;
            }
        }
        // The tests run on a paused clock: this bound is virtual time, and generous
        // because each retry backs off for seconds (a real hang never ends at all).
        let out = tokio::time::timeout(VIRTUAL_BOUND, engine.apply(&plan))
            .await
            .expect("apply must not hang");
        journal.save_final().unwrap();
        out
    }

    async fn destroy(&self) -> Outcomes {
        let (engine, journal) = self.engine();
        let addresses: Vec<String> = journal.snapshot().resources.keys().cloned().collect();
        let out = tokio::time::timeout(VIRTUAL_BOUND, engine.destroy(&addresses))
            .await
            .expect("destroy must not hang");
        journal.save_final().unwrap();
        out
    }

    fn on_disk(&self) -> gpuprov::state::StateFile {
        StateStore::open(self.state_path()).unwrap().1
    }
}

fn vms(n: usize) -> String {
    let mut s = String::from("[defaults]\nclouds = [\"aws\"]\n");
    for i in 0..n {
        s.push_str(&format!("[vm.m{i:02}]\n"));
    }
    s
}

fn cloud() -> FakeProvider {
    FakeProvider::new("aws")
        .with_offer("east", "us-east-1", "p5.48xlarge", 98.0)
        .with_offer("west", "us-west-2", "p5.48xlarge", 99.0)
}

/// A short name for an outcome, for the figures.
fn name(o: &Outcome) -> String {
    match o {
        Outcome::Ready(_) => "ready".into(),
        Outcome::Updated => "updated".into(),
        Outcome::Unchanged => "unchanged".into(),
        Outcome::Destroyed => "destroyed".into(),
        Outcome::Failed(m) => format!("failed: {}", m.split([':', ' ']).next().unwrap_or_default()),
        Outcome::Leaked(_) => "leaked".into(),
        Outcome::Interrupted(_) => "interrupted".into(),
    }
}

fn tally(into: &mut BTreeMap<String, u32>, out: &Outcomes) {
    for o in out.values() {
        *into.entry(name(o)).or_default() += 1;
    }
}

/// Destroys until the state is empty (a leaked teardown is retried by the next run), at
/// most `runs` times; returns how many destroy runs it took.
async fn destroy_until_empty(s: &Setup, runs: u32, tally_into: &mut BTreeMap<String, u32>) -> u32 {
    for i in 1..=runs {
        let out = s.destroy().await;
        tally(tally_into, &out);
        if s.on_disk().resources.is_empty() {
            return i;
        }
    }
    panic!(
        "state not empty after {runs} destroys: {:?}",
        s.on_disk().resources.keys()
    );
}

/// Transient errors on every primitive at a seeded 30% rate (paused clock: backoffs take
/// no wall time): every run ends in a named terminal outcome, never two instances for one
/// VM, and the next destroys leave nothing.
#[tokio::test(start_paused = true)]
async fn transient_errors_at_a_seeded_rate_converge_without_duplicates() {
    let mut outcomes = BTreeMap::new();
    let (mut runs, mut injected) = (0u32, 0u32);
    let (mut leaks_left, mut duplicates) = (0usize, 0usize);
    for seed in 0..12u64 {
        let s = Setup::new(cloud().with_transient_rate(0.3, seed));
        let out = s.apply(&vms(3)).await;
        runs += 1;
        tally(&mut outcomes, &out);
        for (k, o) in &out {
            assert!(
                !matches!(o, Outcome::Interrupted(_)),
                "seed {seed} {k}: {o:?}"
            );
        }
        runs += destroy_until_empty(&s, 5, &mut outcomes).await;
        assert!(
            s.cloud.instances().is_empty(),
            "seed {seed}: left {:?}",
            s.cloud.instances()
        );
        assert!(
            s.cloud.peak_instances_per_vm() <= 1,
            "seed {seed}: duplicate"
        );
        injected += s.cloud.transient_injected();
        leaks_left += s.cloud.instances().len();
        duplicates += usize::from(s.cloud.peak_instances_per_vm() > 1);
    }
    assert!(injected > 20, "the rate injected faults: {injected}");
    assert!(
        outcomes.get("ready").copied().unwrap_or(0) > 0,
        "{outcomes:?}"
    );
    figures::write(
        "faults_transient_rate",
        &serde_json::json!({
            "fault": "transient errors, 30% of calls, 12 seeds x 3 VMs",
            "runs": runs, "faults_injected": injected, "outcomes": outcomes,
            "leaks_left": leaks_left, "duplicates": duplicates,
        }),
    );
}

/// A 429 with `Retry-After: 7` on create: the executor waits at least that long (paused
/// clock) and the same machine comes up with one instance.
#[tokio::test(start_paused = true)]
async fn a_429_with_retry_after_is_waited_out() {
    let mut e = ProviderError::transient("429 Too Many Requests");
    e.retry_after_secs = Some(7);
    let s = Setup::new(cloud().with_fault(Op::Create, None, e, 1));
    let started = tokio::time::Instant::now();
    let out = s.apply(&vms(1)).await;
    let waited = started.elapsed();
    assert!(matches!(out["vm.m00"], Outcome::Ready(_)), "{out:?}");
    assert!(waited >= Duration::from_secs(7), "waited {waited:?}");
    assert_eq!(s.cloud.count(Op::Create), 2);
    assert_eq!(s.cloud.instances().len(), 1);
    let mut outcomes = BTreeMap::new();
    tally(&mut outcomes, &out);
    destroy_until_empty(&s, 1, &mut outcomes).await;
    assert!(s.cloud.instances().is_empty());
    figures::write(
        "faults_429_retry_after",
        &serde_json::json!({
            "fault": "429 with Retry-After 7 s on create",
            "runs": 2, "outcomes": outcomes, "waited_virtual_secs": waited.as_secs_f64(),
            "leaks_left": s.cloud.instances().len(),
            "duplicates": usize::from(s.cloud.peak_instances_per_vm() > 1),
        }),
    );
}

/// Every call takes 60 ms and instances never finish booting; the boot deadline is 50 ms:
/// each offer's attempt passes its deadline, is compensated (its instance deleted), and the
/// run ends in the named terminal state `exhausted`, with nothing left.
#[tokio::test]
async fn calls_slower_than_the_boot_deadline_end_exhausted_and_clean() {
    let base = cloud().with_boot_observes(u32::MAX);
    let mut caps = base.capabilities_for_test();
    caps.boot_timeout = Duration::from_millis(50);
    caps.poll_interval = Duration::from_millis(5);
    let s = Setup::new(
        base.with_capabilities(caps)
            .with_latency(Duration::from_millis(60)),
    );
    let out = s.apply(&vms(1)).await;
    assert!(
        matches!(&out["vm.m00"], Outcome::Failed(m) if m.starts_with("exhausted")),
        "{out:?}"
    );
    assert_eq!(s.cloud.count(Op::Create), 2, "one attempt per offer");
    assert!(
        s.cloud.instances().is_empty(),
        "both attempts were torn down"
    );
    let st = s.on_disk();
    assert_eq!(
        st.resources["vm.m00"].machine.state.to_value()["state"],
        "exhausted"
    );
    let mut outcomes = BTreeMap::new();
    tally(&mut outcomes, &out);
    destroy_until_empty(&s, 1, &mut outcomes).await;
    figures::write(
        "faults_slow_calls",
        &serde_json::json!({
            "fault": "60 ms calls, 50 ms boot deadline",
            "runs": 2, "outcomes": outcomes, "leaks_left": s.cloud.instances().len(),
            "duplicates": usize::from(s.cloud.peak_instances_per_vm() > 1),
        }),
    );
}

/// A delete that keeps failing (transient, paused clock) ends `Leaked`: the record stays
/// in the state, marked leaked, and `gpuprov status` shows it; once the cloud recovers the
/// next destroy removes the instance and the record.
#[tokio::test(start_paused = true)]
async fn a_delete_that_keeps_failing_is_leaked_shown_and_resolved_next_run() {
    let s = Setup::new(cloud());
    let out = s.apply(&vms(1)).await;
    assert!(matches!(out["vm.m00"], Outcome::Ready(_)), "{out:?}");
    s.cloud.fault(
        Op::Delete,
        None,
        ProviderError::transient("503 Service Unavailable"),
        u32::MAX,
    );
    let out = s.destroy().await;
    let mut outcomes = BTreeMap::new();
    tally(&mut outcomes, &out);
    assert!(matches!(&out["vm.m00"], Outcome::Leaked(_)), "{out:?}");
    assert_eq!(
        s.cloud.instances().len(),
        1,
        "still there: never counted as deleted"
    );
    let st = s.on_disk();
    let rec = &st.resources["vm.m00"].machine;
    assert_eq!(
        (rec.kind.as_str(), &rec.state.to_value()["state"]),
        ("teardown", &"leaked".into())
    );

    // `gpuprov status` and `gpuprov list` on that state show it as leaked (read-only, no
    // cloud call: `--refresh=false`).
    std::fs::write(s.dir.path().join("gpuprov.toml"), vms(1)).unwrap();
    for args in [&["status", "--refresh=false"][..], &["list"][..]] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpuprov"))
            .current_dir(s.dir.path())
            .env("GPUPROV_HOME", s.dir.path().join("home"))
            .env("NO_COLOR", "1")
            .args(args)
            .output()
            .unwrap();
        let shown = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(shown.contains("leaked"), "{args:?} shows the leak: {shown}");
    }

    s.cloud.clear_faults();
    destroy_until_empty(&s, 1, &mut outcomes).await;
    assert!(s.cloud.instances().is_empty(), "resolved by the next run");
    figures::write(
        "faults_delete_keeps_failing",
        &serde_json::json!({
            "fault": "delete fails until the cloud recovers",
            "runs": 3, "outcomes": outcomes, "leaks_left": s.cloud.instances().len(),
            "duplicates": usize::from(s.cloud.peak_instances_per_vm() > 1),
        }),
    );
}

/// 24 VMs at parallelism 8 with list lag, latency and 10% transient faults (paused
/// clock): never two live instances for one VM, and destroy leaves nothing.
#[tokio::test(start_paused = true)]
async fn many_vms_in_parallel_never_get_two_instances() {
    let mut s = Setup::new(
        cloud()
            .with_list_lag(1)
            .with_latency(Duration::from_millis(1))
            .with_transient_rate(0.1, 7),
    );
    s.parallelism = 8;
    let mut outcomes = BTreeMap::new();
    let out = s.apply(&vms(24)).await;
    tally(&mut outcomes, &out);
    assert_eq!(out.len(), 24);
    let live = s.cloud.instances();
    let mut per_vm: BTreeMap<String, u32> = BTreeMap::new();
    for i in &live {
        *per_vm.entry(i.vm_name.clone()).or_default() += 1;
    }
    assert!(per_vm.values().all(|&n| n == 1), "{per_vm:?}");
    assert!(
        s.cloud.peak_instances_per_vm() <= 1,
        "a duplicate existed at some point"
    );
    destroy_until_empty(&s, 3, &mut outcomes).await;
    assert!(s.cloud.instances().is_empty());
    figures::write(
        "faults_parallel",
        &serde_json::json!({
            "fault": "24 VMs, parallelism 8, list lag 1, 10% transient",
            "runs": 2, "outcomes": outcomes, "leaks_left": s.cloud.instances().len(),
            "duplicates": usize::from(s.cloud.peak_instances_per_vm() > 1),
        }),
    );
}

/// A machine that was up and is now unreachable over SSH is never treated as deleted:
/// the re-apply gives up on SSH, leaves it running and keeps it in the state; only the
/// cloud's confirmation (destroy) lets it leave.
#[tokio::test]
async fn an_instance_unreachable_over_ssh_is_never_treated_as_deleted() {
    let base = cloud();
    let mut caps = base.capabilities_for_test();
    caps.ssh_timeout = Duration::from_millis(30);
    caps.poll_interval = Duration::from_millis(5);
    let s = Setup::new(base.with_capabilities(caps));
    let out = s.apply(&vms(1)).await;
    let Outcome::Ready(vm) = &out["vm.m00"] else {
        panic!("{out:?}")
    };
    let id = vm.instance_id.clone();
    s.connector.fail_with(
        (0..10_000)
            .map(|_| SshError::Unreachable {
                endpoint: "127.0.0.1:22".into(),
                msg: "connection refused".into(),
            })
            .collect(),
    );
    let out = s.apply_with(&vms(1), true).await;
    assert!(
        matches!(&out["vm.m00"], Outcome::Failed(m) if m.contains("left running")),
        "{out:?}"
    );
    assert_eq!(s.cloud.count(Op::Delete), 0, "nothing was deleted");
    assert_eq!(s.cloud.instances().len(), 1);
    assert_eq!(s.cloud.instances()[0].id, id);
    assert!(
        s.on_disk().resources.contains_key("vm.m00"),
        "still in the state"
    );
    let mut outcomes = BTreeMap::new();
    tally(&mut outcomes, &out);
    destroy_until_empty(&s, 1, &mut outcomes).await;
    assert!(s.cloud.instances().is_empty());
    figures::write(
        "faults_ssh_unreachable",
        &serde_json::json!({
            "fault": "SSH unreachable on a machine that was up",
            "runs": 3, "outcomes": outcomes, "leaks_left": s.cloud.instances().len(),
            "duplicates": usize::from(s.cloud.peak_instances_per_vm() > 1),
        }),
    );
}
