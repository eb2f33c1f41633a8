//! gpuprov's benchmark harness (issue 7): prints a table of figures against the goals and
//! writes them as JSON. Figures, not pass/fail tests: shared machines are noisy, so each
//! figure is a median over repeated runs, and a comparison is a ratio measured in the
//! same run.
//!
//! ```sh
//! cargo bench --bench gpuprov                 # everything (a few minutes)
//! cargo bench --bench gpuprov -- --quick      # smaller sizes, fewer repeats
//! cargo bench --bench gpuprov -- --json PATH  # where the JSON goes
//! cargo bench --bench gpuprov -- --only actionable  # figure 6 alone, as JSON
//! cargo bench --bench gpuprov -- --only backends    # figure 2b alone
//! cargo bench --bench gpuprov -- --only plan        # figure 1 alone, up to 10,000 VMs
//! cargo bench --bench gpuprov -- --only cold        # figure 5 alone
//! ```
//!
//! 1. plan latency: `gpuprov plan --refresh=false` on N-VM configs with matching state,
//!    whole-process wall time and peak RSS (`wait4` rusage);
//! 2. journal cost: an apply of N VMs on the FakeProvider through the real
//!    [`StateJournal`] (fsync per batch), bytes written and time per transition, beside
//!    the bytes the previous whole-file rewrite per transition would have written; and
//!    (figure 2b, `gpuprov/backends.rs`) the same apply with the state on the local
//!    file, moto's S3 and a throwaway PostgreSQL, on loopback;
//! 3. apply concurrency: wall time of N VMs vs. one VM (the critical path) on the
//!    FakeProvider with API latency and boot time, and the call rate the provider saw
//!    under a declared limit;
//! 4. failover latency: from a Capacity error on offer k to the create on offer k+1;
//! 5. CLI cold start: `--version`, `status --refresh=false` on a 100-VM state, `plan` on
//!    a 1-VM config; beside them `sky` (SkyPilot) when installed (`GPUPROV_BENCH_SKY` or
//!    `sky` on PATH);
//! 6. failures a user can act on (issue 12): the time an apply spends on an SSH key the
//!    machine refuses and on a cloud endpoint that refuses connections, before and after
//!    the fix, on tokio's paused clock (virtual seconds of the real executor with the
//!    default retry policy and timeouts; no real waiting, so the figure is exact).

#[path = "gpuprov/backends.rs"]
mod backends;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuprov::config::Config;
use gpuprov::engine::{Engine, Outcome, StateJournal};
use gpuprov::machine::Providers;
use gpuprov::machine::{CancelToken, Executor};
use gpuprov::plan;
use gpuprov::provider::doubles::fake::{FakeConnector, FakeProvider, Op};
use gpuprov::provider::{
    Capabilities, EndpointClass, ErrorKind, Location, Offer, ProviderError, RateLimit, SshEndpoint,
};
use gpuprov::ssh::HostKey;
use gpuprov::state::{JournalOp, MachineRecord, ResourceRecord, StateFile, StateStore};
use gpuprov::vm::{LaunchState, VmRecord};
use serde_json::{json, Value};

struct Opts {
    quick: bool,
    json: PathBuf,
    /// `--only actionable`: just figure 6 (printed as JSON, the report file untouched).
    only_actionable: bool,
    /// `--only backends`: just figure 2b (printed as JSON, the report file untouched).
    only_backends: bool,
    /// `--only scale`: just figure 7 (issue 20; printed as JSON, the report file
    /// untouched).
    only_scale: bool,
    /// `--only plan`: figure 1 with 10, 100, 1,000 and 10,000 VMs (printed as JSON).
    only_plan: bool,
    /// `--only cold`: figure 5, with SkyPilot and dstack when installed (printed as JSON).
    only_cold: bool,
}

fn opts() -> Opts {
    let mut quick = false;
    let mut only_actionable = false;
    let mut only_backends = false;
    let mut only_scale = false;
    let mut only_plan = false;
    let mut only_cold = false;
    let mut json = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/target/gpuprov-bench.json"
    ));
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--only" => match args.next().as_deref() {
                Some("actionable") => only_actionable = true,
                Some("backends") => only_backends = true,
                Some("scale") => only_scale = true,
                Some("plan") => only_plan = true,
                Some("cold") => only_cold = true,
                other => panic!("--only actionable|backends|scale|plan|cold, not {other:?}"),
            },
            "--json" => json = args.next().map(PathBuf::from).expect("--json PATH"),
            _ => {} // cargo passes --bench
        }
    }
    Opts {
        quick,
        json,
        only_actionable,
        only_backends,
        only_scale,
        only_plan,
        only_cold,
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// Wall time (ms) and peak RSS (KiB) of one process run to completion.
fn run_measured(cmd: &mut Command) -> (f64, u64, std::process::ExitStatus) {
    let start = Instant::now();
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let pid = child.id() as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our direct child, not yet reaped; the pointers are valid.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall = start.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(r, pid, "wait4");
    std::mem::forget(child); // already reaped
    use std::os::unix::process::ExitStatusExt;
    (
        wall,
        usage.ru_maxrss as u64,
        std::process::ExitStatus::from_raw(status),
    )
}

fn gpuprov_bin() -> &'static str {
    env!("CARGO_BIN_EXE_gpuprov")
}

// ---- 1. plan latency -------------------------------------------------------------

fn config_text(n: usize) -> String {
    let mut s = String::from("[defaults]\nclouds = [\"docker\"]\n");
    for i in 0..n {
        s.push_str(&format!("\n[vm.m{i:05}]\n"));
    }
    s
}

fn docker_offer() -> Offer {
    gpuprov::provider::clouds::docker::offer()
}

/// A state in which every machine of `config` is up with the settings it asks for, so
/// a plan finds no changes.
fn matching_state(config: &Config) -> StateFile {
    let mut state = StateFile::new();
    let offer = docker_offer();
    for (i, vm) in config.vms.values().enumerate() {
        let rec = VmRecord {
            instance_id: format!("{:064x}", i),
            location: offer.location.clone(),
            offer: offer.clone(),
            ssh: SshEndpoint {
                host: "127.0.0.1".into(),
                port: 20000 + (i % 40000) as u16,
                user: Some("root".into()),
            },
            user: "root".into(),
            host_key: HostKey {
                algorithm: "ssh-ed25519".into(),
                key_base64: "AAAAC3NzaC1lZDI1NTE5AAAAIBenchBenchBenchBenchBenchBenchBenchBench"
                    .into(),
                fingerprint: "SHA256:benchbenchbenchbenchbenchbenchbenchbenchben".into(),
            },
            ready_at: chrono::Utc::now(),
            preemptions: vec![],
        };
        let machine = MachineRecord {
            kind: "launch".into(),
            state: gpuprov::state::JsonText::encode(&LaunchState::Ready { vm: Box::new(rec) })
                .unwrap(),
            label: "ready".into(),
            updated_at: chrono::Utc::now(),
        };
        let mut r = ResourceRecord::new(machine);
        r.desired = Some(gpuprov::state::JsonText::encode(vm).unwrap());
        r.push_event("ready");
        state.resources.insert(format!("vm.{}", vm.name), r);
    }
    state
}

fn write_project(dir: &Path, n: usize) {
    let text = config_text(n);
    std::fs::write(dir.join("gpuprov.toml"), &text).unwrap();
    let config = Config::parse(&dir.join("gpuprov.toml"), text).unwrap();
    let mut state = matching_state(&config);
    let (mut store, _) = StateStore::open(dir.join("gpuprov.state.json")).unwrap();
    store.save(&mut state).unwrap();
}

fn gpuprov(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(gpuprov_bin());
    c.current_dir(dir)
        .env("GPUPROV_HOME", dir.join("home"))
        .env("NO_COLOR", "1")
        .env_remove("GPUPROV_CONFIG")
        .env_remove("GPUPROV_STATE")
        .args(args);
    c
}

fn bench_plan(o: &Opts) -> Vec<Value> {
    let sizes: &[usize] = if o.quick {
        &[10, 100, 1000]
    } else {
        &[10, 100, 1000, 10_000]
    };
    bench_plan_sizes(o, sizes)
}

fn bench_plan_sizes(o: &Opts, sizes: &[usize]) -> Vec<Value> {
    let reps = if o.quick { 3 } else { 7 };
    let mut rows = Vec::new();
    // `GPUPROV_BENCH_KEEP=DIR` keeps each project in `DIR/<n>` (for callgrind, or for
    // timing another build on the same files).
    let keep = std::env::var_os("GPUPROV_BENCH_KEEP").map(PathBuf::from);
    for &n in sizes {
        let dir = tempfile::tempdir().unwrap();
        write_project(dir.path(), n);
        if let Some(keep) = &keep {
            let to = keep.join(n.to_string());
            std::fs::create_dir_all(&to).unwrap();
            for f in ["gpuprov.toml", "gpuprov.state.json"] {
                std::fs::copy(dir.path().join(f), to.join(f)).unwrap();
            }
        }
        // Check once that it really is a no-change plan.
        let out = gpuprov(
            dir.path(),
            &["plan", "--refresh=false", "--detailed-exitcode"],
        )
        .output()
        .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "plan of {n} VMs must find no changes: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut walls = Vec::new();
        let mut rss = Vec::new();
        for _ in 0..reps {
            let (w, r, st) = run_measured(&mut gpuprov(dir.path(), &["plan", "--refresh=false"]));
            assert!(st.success());
            walls.push(w);
            rss.push(r as f64);
        }
        let state_bytes = std::fs::metadata(dir.path().join("gpuprov.state.json"))
            .unwrap()
            .len();
        rows.push(json!({
            "vms": n,
            "wall_ms_median": median(walls),
            "peak_rss_mib_median": median(rss) / 1024.0,
            "state_file_bytes": state_bytes,
            "runs": reps,
        }));
    }
    rows
}

// ---- 2. journal cost & 3. apply concurrency ---------------------------------------

fn fake_cloud(
    latency: Duration,
    poll: Duration,
    boot_observes: u32,
    caps: Option<Capabilities>,
) -> Arc<FakeProvider> {
    let mut f = FakeProvider::new("aws")
        .with_offer("east", "us-east-1", "p5.48xlarge", 55.04)
        .with_offer("west", "us-west-2", "p5.48xlarge", 55.04)
        .with_latency(latency)
        .with_boot_observes(boot_observes);
    let mut c = caps.unwrap_or_else(|| f.capabilities_for_test());
    c.poll_interval = poll;
    c.boot_timeout = Duration::from_secs(120);
    f = f.with_capabilities(c);
    Arc::new(f)
}

fn fleet_config(n: usize) -> Config {
    let mut s = String::from("[defaults]\nclouds = [\"aws\"]\nkubernetes = false\n");
    for i in 0..n {
        s.push_str(&format!("\n[vm.m{i:05}]\n"));
    }
    Config::parse(Path::new("gpuprov.toml"), s).unwrap()
}

struct ApplyRun {
    wall: Duration,
    journal: gpuprov::state::JournalStats,
    journal_file: Vec<u8>,
    state_bytes: u64,
    ready: usize,
}

async fn apply_fleet(cloud: Arc<FakeProvider>, n: usize, parallelism: usize) -> ApplyRun {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpuprov.state.json");
    let backend: Arc<dyn gpuprov::state::Backend> =
        Arc::new(gpuprov::state::backend::local::LocalBackend::new(&path));
    let mut run = apply_fleet_on(backend.clone(), cloud, n, parallelism).await;
    run.journal_file = std::fs::read(gpuprov::state::journal_path(&path)).unwrap_or_default();
    run
}

/// An apply of `n` VMs whose state, journal and lock are on `backend`.
async fn apply_fleet_on(
    backend: Arc<dyn gpuprov::state::Backend>,
    cloud: Arc<FakeProvider>,
    n: usize,
    parallelism: usize,
) -> ApplyRun {
    let (store, state) = StateStore::open_in(backend.clone()).unwrap();
    let lineage = state.lineage.clone();
    let journal = Arc::new(StateJournal::new(store, state).unwrap());
    let mut providers = Providers::new();
    providers.insert(cloud.clone());
    let engine = Engine {
        providers,
        connector: Arc::new(FakeConnector::default()),
        journal: journal.clone(),
        executor: Executor::new(journal.clone(), CancelToken::new()),
        lineage,
        ssh_public_key: "ssh-ed25519 AAAAbench".into(),
        parallelism,
        retry_until_up: false,
        k3s: None,
    };
    let config = fleet_config(n);
    let plan = plan::compute(&config, &journal.snapshot(), None, &|_| Some(55.04)).unwrap();
    let start = Instant::now();
    let out = engine.apply(&plan).await;
    let wall = start.elapsed();
    let stats = journal.stats();
    journal.save_final().unwrap();
    let ready = out
        .values()
        .filter(|o| matches!(o, Outcome::Ready(_)))
        .count();
    ApplyRun {
        wall,
        journal: stats,
        journal_file: Vec::new(),
        state_bytes: backend
            .read_state()
            .unwrap()
            .map(|s| s.bytes.len() as u64)
            .unwrap_or(0),
        ready,
    }
}

/// Bytes the previous design would have written: the whole pretty-printed state after
/// every transition, replayed from this run's journal.
fn whole_file_rewrite_bytes(journal_file: &[u8]) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len() as u64;
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut state = StateFile::new();
    let mut total = Count(0);
    for line in journal_file.split(|b| *b == b'\n').skip(1) {
        if line.is_empty() {
            continue;
        }
        let op: JournalOp = serde_json::from_slice(line).unwrap();
        op.apply(&mut state);
        serde_json::to_writer_pretty(&mut total, &state).unwrap();
        total.0 += 1;
    }
    total.0
}

fn bench_journal(rt: &tokio::runtime::Runtime, o: &Opts) -> Vec<Value> {
    let sizes: &[usize] = if o.quick {
        &[10, 100]
    } else {
        &[10, 100, 1000]
    };
    let mut rows = Vec::new();
    for &n in sizes {
        let cloud = fake_cloud(Duration::ZERO, Duration::from_millis(1), 1, None);
        let run = rt.block_on(apply_fleet(cloud, n, n.min(1000)));
        assert_eq!(run.ready, n, "every VM comes up");
        let transitions = run.journal.appends.max(1);
        let record_bytes = run.state_bytes as f64 / n as f64;
        let journal_bytes = run.journal.bytes;
        let old = whole_file_rewrite_bytes(&run.journal_file);
        rows.push(json!({
            "vms": n,
            "transitions": run.journal.appends,
            "fsync_batches": run.journal.syncs,
            "journal_bytes": journal_bytes,
            "fold_bytes": run.state_bytes,
            "total_bytes": journal_bytes + run.state_bytes,
            "record_bytes": record_bytes,
            "total_over_n_records": (journal_bytes + run.state_bytes) as f64 / (n as f64 * record_bytes),
            "journal_ms_per_transition": run.journal.busy.as_secs_f64() * 1000.0 / transitions as f64,
            "apply_wall_ms": run.wall.as_secs_f64() * 1000.0,
            "whole_file_rewrite_bytes": old,
            "rewrite_over_journal": old as f64 / (journal_bytes + run.state_bytes) as f64,
        }));
    }
    rows
}

fn bench_apply(rt: &tokio::runtime::Runtime, o: &Opts) -> Value {
    let latency = Duration::from_millis(100);
    let poll = Duration::from_millis(250);
    let boot_observes = 12; // ≈ 3 s of booting at one observe per poll
    let sizes: &[usize] = if o.quick { &[10, 100] } else { &[10, 100, 500] };
    let reps = if o.quick { 1 } else { 3 };
    let unlimited = || Capabilities {
        max_concurrency: 100_000,
        ..FakeProvider::new("aws").capabilities_for_test()
    };
    let one = median(
        (0..reps)
            .map(|_| {
                let c = fake_cloud(latency, poll, boot_observes, Some(unlimited()));
                rt.block_on(apply_fleet(c, 1, 1)).wall.as_secs_f64() * 1000.0
            })
            .collect(),
    );
    let mut rows = Vec::new();
    for &n in sizes {
        let walls: Vec<f64> = (0..reps)
            .map(|_| {
                let c = fake_cloud(latency, poll, boot_observes, Some(unlimited()));
                let run = rt.block_on(apply_fleet(c, n, n));
                assert_eq!(run.ready, n);
                run.wall.as_secs_f64() * 1000.0
            })
            .collect();
        let w = median(walls);
        rows.push(
            json!({"vms": n, "parallelism": n, "wall_ms_median": w, "over_critical_path": w / one}),
        );
    }
    // Under a declared limit: at most 16 calls in flight and one create per 50 ms.
    let limited_n = if o.quick { 50 } else { 200 };
    let caps = Capabilities {
        max_concurrency: 16,
        min_create_interval: Duration::from_millis(50),
        ..FakeProvider::new("aws").capabilities_for_test()
    };
    let c = fake_cloud(latency, poll, boot_observes, Some(caps));
    let run = rt.block_on(apply_fleet(c.clone(), limited_n, limited_n));
    assert_eq!(run.ready, limited_n);
    let creates = c.call_times(Op::Create);
    let min_gap_ms = creates
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1000.0)
        .fold(f64::INFINITY, f64::min);
    // The busiest second of creates, as the provider saw them.
    let max_creates_per_s = creates
        .iter()
        .map(|t0| {
            creates
                .iter()
                .filter(|t| **t >= *t0 && **t - *t0 < Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap_or(0);
    json!({
        "api_latency_ms": latency.as_millis() as u64,
        "boot_ms_approx": (poll * boot_observes).as_millis() as u64,
        "critical_path_ms": one,
        "unlimited": rows,
        "limited": {
            "vms": limited_n,
            "parallelism": limited_n,
            "declared_max_concurrency": 16,
            "declared_min_create_interval_ms": 50,
            "observed_max_in_flight": c.max_in_flight(),
            "observed_min_create_gap_ms": min_gap_ms,
            "observed_max_creates_per_s": max_creates_per_s,
            "wall_ms": run.wall.as_secs_f64() * 1000.0,
        }
    })
}

// ---- 4. failover latency ----------------------------------------------------------

fn bench_failover(rt: &tokio::runtime::Runtime, o: &Opts) -> Value {
    let reps = if o.quick { 10 } else { 50 };
    let mut gaps = Vec::new();
    for _ in 0..reps {
        let c = Arc::new(
            FakeProvider::new("aws")
                .with_offer("east", "us-east-1", "p5.48xlarge", 55.04)
                .with_offer("west", "us-west-2", "p5.48xlarge", 55.04)
                .with_fault(
                    Op::Create,
                    Some("east"),
                    ProviderError::new(ErrorKind::Capacity, "InsufficientInstanceCapacity"),
                    1,
                ),
        );
        let run = rt.block_on(apply_fleet(c.clone(), 1, 1));
        assert_eq!(run.ready, 1);
        let creates = c.call_times(Op::Create);
        assert_eq!(creates.len(), 2, "one create per offer");
        // The fake answers at once, so the first create's start is its error's arrival;
        // everything until the second create is the core's own work (the compensation
        // makes no cloud call when nothing was created).
        gaps.push((creates[1] - creates[0]).as_secs_f64() * 1000.0);
    }
    json!({"runs": reps, "median_ms": median(gaps.clone()), "max_ms": gaps.iter().cloned().fold(0.0, f64::max)})
}

// ---- 6. failures a user can act on -----------------------------------------------------

/// Virtual seconds a launch of one machine takes to end on a paused clock.
fn virtual_launch_secs(
    providers: Providers,
    clouds: Vec<gpuprov::config::Cloud>,
    connector: Arc<FakeConnector>,
    tune: impl FnOnce(&mut gpuprov::vm::LaunchMachine),
) -> (f64, LaunchState) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async move {
        let mut m = gpuprov::vm::LaunchMachine::new(
            gpuprov::config::VmSpec::new("trainer", clouds),
            "0f0e0d0c-1111-4222-8333-444455556666".into(),
            "ssh-ed25519 AAAAbench gpuprov".into(),
            providers,
            connector,
        );
        tune(&mut m);
        let journal = Arc::new(gpuprov::machine::MemoryJournal::new());
        let ex = Executor::new(journal, CancelToken::new());
        let start = tokio::time::Instant::now();
        let end = ex
            .run(&m, "vm.trainer", |_| LaunchState::start(None))
            .await
            .unwrap();
        (start.elapsed().as_secs_f64(), end)
    })
}

/// A fake cloud with the contract's default timings (SSH timeout 300 s, polls of 5 s).
fn realistic(name: &'static str) -> FakeProvider {
    let c = FakeProvider::new(name);
    let caps = Capabilities {
        supported: vec![],
        ..Capabilities::default()
    };
    c.with_capabilities(caps)
}

fn bench_actionable() -> Value {
    let refused = || {
        let c = Arc::new(FakeConnector::default());
        c.fail_with(
            (0..10_000)
                .map(|_| gpuprov::ssh::SshError::AuthRejected {
                    endpoint: "127.0.0.1:22".into(),
                    msg: "publickey".into(),
                })
                .collect(),
        );
        c
    };
    let one_offer = || {
        let c = Arc::new(realistic("aws").with_offer("east", "us-east-1", "p5.48xlarge", 55.04));
        let mut p = Providers::new();
        p.insert(c);
        p
    };
    let aws = vec![gpuprov::config::Cloud::Aws];
    // Before: a refused key was retried like an unreachable host until the SSH timeout.
    let (key_before, _) = virtual_launch_secs(one_offer(), aws.clone(), refused(), |m| {
        m.auth_refused_grace = Capabilities::default().ssh_timeout;
    });
    let (key_after, _) = virtual_launch_secs(one_offer(), aws.clone(), refused(), |_| {});
    // A machine gpuprov did not create (found by identity): at once, and left alone.
    let found = Arc::new(realistic("aws").with_offer("east", "us-east-1", "p5.48xlarge", 55.04));
    found.insert_instance(
        "trainer",
        Location {
            cloud: "aws".into(),
            region: "us-east-1".into(),
            zone: None,
        },
        gpuprov::provider::InstanceStatus::Running,
    );
    let mut p = Providers::new();
    p.insert(found);
    let (key_found, _) = virtual_launch_secs(p, aws.clone(), refused(), |_| {});

    // An endpoint that refuses connections, four regions, and a second cloud that works.
    let unreachable = |kind: ErrorKind| {
        let a = Arc::new(
            realistic("aws")
                .with_offer("r1", "us-east-1", "p5.48xlarge", 55.04)
                .with_offer("r2", "us-east-2", "p5.48xlarge", 55.04)
                .with_offer("r3", "us-west-2", "p5.48xlarge", 55.04)
                .with_offer("r4", "eu-west-1", "p5.48xlarge", 55.04)
                .with_fault(
                    Op::Prepare,
                    None,
                    ProviderError::new(kind, "connection refused"),
                    u32::MAX,
                ),
        );
        let l = Arc::new(realistic("lambda").with_offer("l1", "us-tx-1", "gpu_1x_h100", 2.49));
        let mut p = Providers::new();
        p.insert(a.clone());
        p.insert(l);
        (p, a)
    };
    let both = vec![gpuprov::config::Cloud::Aws, gpuprov::config::Cloud::Lambda];
    // Before: a refused connection was a transient error, retried per region.
    let (p, a) = unreachable(ErrorKind::Transient);
    let (ep_before, end) =
        virtual_launch_secs(p, both.clone(), Arc::new(FakeConnector::default()), |_| {});
    assert!(end.ready().is_some());
    let before_calls = a.count(Op::Prepare);
    let (p, a) = unreachable(ErrorKind::Unreachable);
    let (ep_after, end) = virtual_launch_secs(p, both, Arc::new(FakeConnector::default()), |_| {});
    assert!(end.ready().is_some());
    json!({
        "refused_key_before_s": key_before,
        "refused_key_after_s": key_after,
        "refused_key_found_instance_s": key_found,
        "unreachable_before_s": ep_before,
        "unreachable_before_prepare_calls": before_calls,
        "unreachable_after_s": ep_after,
        "unreachable_after_prepare_calls": a.count(Op::Prepare),
    })
}

// ---- 5. CLI cold start -------------------------------------------------------------

/// A comparison CLI: the path in `env`, else `name` on PATH.
fn find_tool(name: &str, env: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn bench_cold_start(o: &Opts) -> Value {
    let reps = if o.quick { 5 } else { 21 };
    let big = tempfile::tempdir().unwrap();
    write_project(big.path(), 100);
    let small = tempfile::tempdir().unwrap();
    write_project(small.path(), 1);
    let time = |dir: &Path, args: &[&str]| -> f64 {
        median(
            (0..reps)
                .map(|_| {
                    let (w, _, st) = run_measured(&mut gpuprov(dir, args));
                    assert!(st.success(), "{args:?}");
                    w
                })
                .collect(),
        )
    };
    // The machine's own floor: spawning a process that does nothing (`/bin/true`), so a
    // figure can be read as that floor plus gpuprov's work on a slower or busier host.
    let floor = median(
        (0..reps)
            .map(|_| run_measured(Command::new("true").current_dir(big.path())).0)
            .collect(),
    );
    let version = time(big.path(), &["--version"]);
    let status = time(big.path(), &["status", "--refresh=false"]);
    let plan = time(small.path(), &["plan", "--refresh=false"]);
    let mut v = json!({
        "runs": reps,
        "spawn_floor_ms": floor,
        "version_ms": version,
        "status_100_vms_ms": status,
        "plan_1_vm_ms": plan,
    });
    if let Some(sky) = find_tool("sky", "GPUPROV_BENCH_SKY") {
        let home = tempfile::tempdir().unwrap();
        let sky_time = |args: &[&str], reps: usize| -> Option<f64> {
            let mut xs = Vec::new();
            for _ in 0..reps {
                let mut c = Command::new(&sky);
                c.args(args).env("HOME", home.path());
                let (w, _, st) = run_measured(&mut c);
                if !st.success() {
                    return None;
                }
                xs.push(w);
            }
            Some(median(xs))
        };
        let sky_version = sky_time(&["--version"], reps.min(5));
        // The first `sky status` starts SkyPilot's local API server (tens of seconds);
        // it is not counted, the warm runs after it are.
        let _ = sky_time(&["status"], 1);
        let sky_status = sky_time(&["status"], reps.min(5));
        let _ = Command::new(&sky)
            .args(["api", "stop"])
            .env("HOME", home.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        v["sky"] = json!({
            "path": sky.display().to_string(),
            "version_ms": sky_version,
            "version_ratio": sky_version.map(|s| s / version),
            "status_ms": sky_status,
            "status_ratio": sky_status.map(|s| s / status),
        });
    }
    // dstack's CLI: `--version` only. Its `ps` needs a dstack server, which is not
    // started here (it is a web service with its own background work; this bench
    // dials nothing outside loopback and does not vouch for what that server would).
    if let Some(dstack) = find_tool("dstack", "GPUPROV_BENCH_DSTACK") {
        let home = tempfile::tempdir().unwrap();
        let xs: Vec<f64> = (0..reps.min(5))
            .filter_map(|_| {
                let mut c = Command::new(&dstack);
                c.arg("--version").env("HOME", home.path());
                let (w, _, st) = run_measured(&mut c);
                st.success().then_some(w)
            })
            .collect();
        let dstack_version = (!xs.is_empty()).then(|| median(xs));
        v["dstack"] = json!({
            "path": dstack.display().to_string(),
            "version_ms": dstack_version,
            "version_ratio": dstack_version.map(|s| s / version),
        });
    }
    v
}

fn main() {
    let o = opts();
    if o.only_plan {
        // Figure 1 alone (with 10,000 VMs even with --quick): a release build's plan.
        let rows = bench_plan_sizes(&o, &[10, 100, 1000, 10_000]);
        println!("{}", serde_json::to_string_pretty(&rows).unwrap());
        return;
    }
    if o.only_cold {
        println!(
            "{}",
            serde_json::to_string_pretty(&bench_cold_start(&o)).unwrap()
        );
        return;
    }
    if o.only_actionable {
        println!(
            "{}",
            serde_json::to_string_pretty(&bench_actionable()).unwrap()
        );
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if o.only_scale {
        let rows = bench_scale(&o);
        println!("{}", serde_json::to_string_pretty(&rows).unwrap());
        return;
    }
    if o.only_backends {
        let rows = json!(backends::bench(&rt, &o));
        backends::print(&rows);
        println!("{}", serde_json::to_string_pretty(&rows).unwrap());
        return;
    }
    let mut report = BTreeMap::new();
    eprintln!("1/6 plan latency …");
    report.insert("plan", json!(bench_plan(&o)));
    eprintln!("2/6 journal cost …");
    report.insert("journal", json!(bench_journal(&rt, &o)));
    eprintln!("2b/6 journal cost per state backend …");
    report.insert("backends", json!(backends::bench(&rt, &o)));
    eprintln!("3/6 apply concurrency …");
    report.insert("apply", bench_apply(&rt, &o));
    eprintln!("4/6 failover latency …");
    report.insert("failover", bench_failover(&rt, &o));
    eprintln!("5/6 CLI cold start …");
    report.insert("cold_start", bench_cold_start(&o));
    eprintln!("6/6 failures a user can act on …");
    report.insert("actionable", bench_actionable());
    eprintln!("7 scale: API calls per poll, launch overhead, plan at 10,000 …");
    report.insert("scale", bench_scale(&o));
    report.insert(
        "machine",
        json!({
            "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            "quick": o.quick,
            "gpuprov_version": env!("CARGO_PKG_VERSION"),
        }),
    );
    let report = json!(report);
    print_table(&report);
    if let Some(p) = o.json.parent() {
        let _ = std::fs::create_dir_all(p);
    }
    std::fs::write(&o.json, serde_json::to_string_pretty(&report).unwrap()).unwrap();
    println!("\nJSON: {}", o.json.display());
}

fn f(v: &Value) -> String {
    match v.as_f64() {
        Some(x) if x >= 100.0 => format!("{x:.0}"),
        Some(x) if x >= 10.0 => format!("{x:.1}"),
        Some(x) => format!("{x:.2}"),
        None => "n/a".into(),
    }
}

fn print_table(r: &Value) {
    println!("\n1. plan latency (plan --refresh=false, matching state; goal ≤ 50 ms and ≤ 64 MiB at 1,000 VMs)");
    println!(
        "   {:>6}  {:>9}  {:>12}  {:>11}",
        "VMs", "wall ms", "peak RSS MiB", "state bytes"
    );
    for row in r["plan"].as_array().unwrap() {
        println!(
            "   {:>6}  {:>9}  {:>12}  {:>11}",
            row["vms"],
            f(&row["wall_ms_median"]),
            f(&row["peak_rss_mib_median"]),
            row["state_file_bytes"]
        );
    }
    println!("\n2. journal cost (apply on the FakeProvider; goal: total bytes within a small constant of N × record, ≤ 1 ms per transition at 1,000 VMs)");
    println!(
        "   {:>6}  {:>11}  {:>7}  {:>12}  {:>11}  {:>13}  {:>12}  {:>15}  {:>9}",
        "VMs",
        "transitions",
        "fsyncs",
        "total bytes",
        "N×record",
        "ms/transition",
        "total/N×rec",
        "rewrite bytes",
        "rewrite/×"
    );
    for row in r["journal"].as_array().unwrap() {
        println!(
            "   {:>6}  {:>11}  {:>7}  {:>12}  {:>11}  {:>13}  {:>12}  {:>15}  {:>9}",
            row["vms"],
            row["transitions"],
            row["fsync_batches"],
            row["total_bytes"],
            f(&json!(
                row["record_bytes"].as_f64().unwrap() * row["vms"].as_f64().unwrap()
            )),
            f(&row["journal_ms_per_transition"]),
            f(&row["total_over_n_records"]),
            row["whole_file_rewrite_bytes"],
            f(&row["rewrite_over_journal"]),
        );
    }
    backends::print(&r["backends"]);
    let a = &r["apply"];
    println!(
        "\n3. apply concurrency (API latency {} ms, boot ≈ {} ms; goal ≤ 1.2 × one VM's critical path of {} ms)",
        a["api_latency_ms"], a["boot_ms_approx"], f(&a["critical_path_ms"])
    );
    for row in a["unlimited"].as_array().unwrap() {
        println!(
            "   {:>6} VMs, parallelism {:>4}: {:>8} ms = {:>5} × critical path",
            row["vms"],
            row["parallelism"],
            f(&row["wall_ms_median"]),
            f(&row["over_critical_path"])
        );
    }
    let l = &a["limited"];
    println!(
        "   limited ({} VMs; declared ≤ {} in flight, ≥ {} ms between creates): saw {} in flight, min gap {} ms, ≤ {} creates/s",
        l["vms"], l["declared_max_concurrency"], l["declared_min_create_interval_ms"],
        l["observed_max_in_flight"], f(&l["observed_min_create_gap_ms"]), l["observed_max_creates_per_s"]
    );
    let fo = &r["failover"];
    println!(
        "\n4. failover latency (Capacity on offer k → create on k+1; goal ≤ 20 ms): median {} ms, max {} ms over {} runs",
        f(&fo["median_ms"]), f(&fo["max_ms"]), fo["runs"]
    );
    let c = &r["cold_start"];
    println!("\n5. CLI cold start (goal ≤ 10 ms for the first two)");
    println!(
        "   /bin/true (this machine's floor)   {:>8} ms",
        f(&c["spawn_floor_ms"])
    );
    println!(
        "   gpuprov --version                  {:>8} ms",
        f(&c["version_ms"])
    );
    println!(
        "   gpuprov status (100 VMs, no refresh) {:>6} ms",
        f(&c["status_100_vms_ms"])
    );
    println!(
        "   gpuprov plan (1 VM, no refresh)     {:>7} ms",
        f(&c["plan_1_vm_ms"])
    );
    match c.get("sky") {
        Some(s) => {
            println!(
                "   sky --version (SkyPilot)           {:>8} ms = {} × gpuprov --version",
                f(&s["version_ms"]),
                f(&s["version_ratio"])
            );
            println!(
                "   sky status (warm API server)       {:>8} ms = {} × gpuprov status",
                f(&s["status_ms"]),
                f(&s["status_ratio"])
            );
        }
        None => println!("   sky: not installed (pip install skypilot, or set GPUPROV_BENCH_SKY)"),
    }
    match c.get("dstack") {
        Some(s) => println!(
            "   dstack --version                   {:>8} ms = {} × gpuprov --version",
            f(&s["version_ms"]),
            f(&s["version_ratio"])
        ),
        None => {
            println!("   dstack: not installed (pip install dstack, or set GPUPROV_BENCH_DSTACK)")
        }
    }
    let x = &r["actionable"];
    println!("\n6. failures a user can act on (virtual seconds on a paused clock, default retry policy and timeouts)");
    println!(
        "   SSH key refused, new instance:      before {:>6} s, after {:>6} s",
        f(&x["refused_key_before_s"]),
        f(&x["refused_key_after_s"])
    );
    println!(
        "   SSH key refused, found instance:    after {:>6} s (left untouched)",
        f(&x["refused_key_found_instance_s"])
    );
    println!(
        "   endpoint refuses connections (4 regions, then another cloud): before {:>6} s ({} prepare calls), after {:>6} s ({} call)",
        f(&x["unreachable_before_s"]),
        x["unreachable_before_prepare_calls"],
        f(&x["unreachable_after_s"]),
        x["unreachable_after_prepare_calls"]
    );
}

// ---- 7. scale (issue 20) -------------------------------------------------------------

/// One fleet's apply and destroy on a paused clock (exact virtual seconds).
struct VirtualFleet {
    apply_s: f64,
    destroy_s: f64,
    /// Observe and listing calls the cloud received during the apply, and their bytes.
    observe_calls: usize,
    observe_bytes: u64,
    ready: usize,
    /// Requests the cloud received during the apply, by class, and those that broke a
    /// declared rate limit (measured at the fake cloud, not by the limiter).
    requests: BTreeMap<String, usize>,
    violations: usize,
    /// When the last launch request reached the cloud, seconds after the apply began.
    last_launch_s: f64,
}

/// `n` machines in one region of a fake cloud with `latency` per call, a boot of `boot`
/// after create (listed one observe late), a termination of `termination` after delete
/// and the adapter poll interval `poll`; `shared`: this build's shared observation and
/// fast-then-backoff polls, else the path before (one observe per machine and poll, each
/// poll the whole interval).
fn virtual_fleet(
    n: usize,
    shared: bool,
    latency: Duration,
    boot: Duration,
    termination: Duration,
    poll: Duration,
    rate_limits: Vec<RateLimit>,
) -> VirtualFleet {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async move {
        let caps = Capabilities {
            poll_interval: poll,
            max_concurrency: 100_000,
            keeps_offer_order: true,
            rate_limits,
            ..Capabilities::default()
        };
        let cloud = Arc::new(
            FakeProvider::new("aws")
                .with_offer("east", "us-east-1", "p5.48xlarge", 55.04)
                .with_latency(latency)
                .with_boot_observes(1)
                .with_boot_time(boot)
                .with_termination_time(termination)
                .with_list_lag(1)
                .with_capabilities(caps),
        );
        let dir = tempfile::tempdir().unwrap();
        let backend: Arc<dyn gpuprov::state::Backend> = Arc::new(
            gpuprov::state::backend::local::LocalBackend::new(dir.path().join("s.json")),
        );
        let (store, state) = StateStore::open_in(backend).unwrap();
        let lineage = state.lineage.clone();
        let journal = Arc::new(StateJournal::new(store, state).unwrap());
        let mut providers = match shared {
            true => Providers::new(),
            false => Providers::per_machine_observe(),
        };
        providers.insert(cloud.clone());
        let mut executor = Executor::new(journal.clone(), CancelToken::new());
        if !shared {
            executor = executor.with_fixed_polls();
        }
        let engine = Engine {
            providers,
            connector: Arc::new(FakeConnector::default()),
            journal: journal.clone(),
            executor,
            lineage,
            ssh_public_key: "ssh-ed25519 AAAAbench".into(),
            parallelism: n,
            retry_until_up: false,
            k3s: None,
        };
        let config = fleet_config(n);
        let plan = plan::compute(&config, &journal.snapshot(), None, &|_| Some(55.04)).unwrap();
        let start = tokio::time::Instant::now();
        let out = engine.apply(&plan).await;
        let apply_s = start.elapsed().as_secs_f64();
        let observe_calls = cloud.count(Op::Observe);
        let observe_bytes = cloud.answered_bytes();
        let violations = cloud.rate_violations();
        let times = cloud.request_times();
        let mut requests = BTreeMap::new();
        for (class, _) in &times {
            *requests.entry(format!("{class:?}")).or_insert(0) += 1;
        }
        let last_launch_s = times
            .iter()
            .filter(|(c, _)| *c == EndpointClass::Launch)
            .map(|(_, t)| t.duration_since(start).as_secs_f64())
            .fold(0.0, f64::max);
        let ready = out
            .values()
            .filter(|o| matches!(o, Outcome::Ready(_)))
            .count();
        let addresses: Vec<String> = journal.snapshot().resources.keys().cloned().collect();
        let start = tokio::time::Instant::now();
        let out = engine.destroy(&addresses).await;
        let destroy_s = start.elapsed().as_secs_f64();
        assert!(out.values().all(|o| *o == Outcome::Destroyed), "{out:?}");
        VirtualFleet {
            apply_s,
            destroy_s,
            observe_calls,
            observe_bytes,
            ready,
            requests,
            violations,
            last_launch_s,
        }
    })
}

/// Figure 7 (issue 20, item 3): a fleet of 500 machines applied under a vendor's declared
/// rate limits (the fake cloud declares them; the core enforces them per request), on the
/// paused clock: wall time, one machine's critical path under the same limits, the lower
/// bound the limits impose, and the requests that broke a limit, counted at the fake
/// cloud from the arrival times of its requests.
///
/// The lower bound: before its last launch, the fleet must send at least one catalog
/// read, one `prepare` and one launch per machine; a limit of `n` requests per `w`
/// covering `r` of those admits the last of them no earlier than `(⌈r / n⌉ − 1) · w`,
/// and that machine then needs what one machine needs after its launch.
fn fleet_under_rate_limits(
    latency: Duration,
    boot: Duration,
    termination: Duration,
    poll: Duration,
) -> Value {
    let n = 500;
    let secs = Duration::from_secs;
    let lambda = "shared/vendor-apis/lambda/openapi-1.8.3.json, info.description";
    let digitalocean = "shared/vendor-apis/digitalocean/DigitalOcean-public.v2.gpuprov-subset.yaml, \"Rate Limit\"";
    let cases = [
        (
            "lambda",
            vec![
                RateLimit::all(1, secs(1), lambda),
                RateLimit::of(EndpointClass::Launch, 1, secs(12), lambda),
            ],
        ),
        (
            "digitalocean",
            vec![
                RateLimit::all(250, secs(60), digitalocean),
                RateLimit::all(5000, secs(3600), digitalocean),
            ],
        ),
    ];
    let mut rows = Vec::new();
    for (vendor, limits) in cases {
        let one = virtual_fleet(1, true, latency, boot, termination, poll, limits.clone());
        let fleet = virtual_fleet(n, true, latency, boot, termination, poll, limits.clone());
        assert_eq!(fleet.ready, n);
        let after_launch = one.apply_s - one.last_launch_s;
        let needed = |class: Option<EndpointClass>| -> usize {
            match class {
                Some(EndpointClass::Launch) | Some(EndpointClass::Other) => n,
                Some(EndpointClass::Read) => 1,
                // The fake cloud here shares no SSH key: nothing lists keys.
                Some(EndpointClass::KeyListing) => 0,
                None => 2 * n + 1,
            }
        };
        let last_launch_bound = limits
            .iter()
            .map(|l| {
                let r = needed(l.class);
                r.div_ceil(l.requests as usize).saturating_sub(1) as f64 * l.per.as_secs_f64()
            })
            .fold(0.0, f64::max);
        let lower_bound = one.apply_s.max(last_launch_bound + after_launch);
        rows.push(json!({
            "vendor_limits": vendor,
            "declared": limits.iter().map(|l| json!({
                "class": l.class.map(|c| format!("{c:?}")),
                "requests": l.requests,
                "per_s": l.per.as_secs_f64(),
                "requests_per_s": l.per_second(),
                "source": l.source,
            })).collect::<Vec<_>>(),
            "vms": n,
            "apply_s": fleet.apply_s,
            "critical_path_s": one.apply_s,
            "lower_bound_s": lower_bound,
            "over_lower_bound": fleet.apply_s / lower_bound,
            "over_critical_path": fleet.apply_s / one.apply_s,
            "last_launch_s": fleet.last_launch_s,
            "requests": fleet.requests,
            "violations_at_provider": fleet.violations,
            "violations_at_provider_one_machine": one.violations,
        }));
    }
    json!(rows)
}

/// Figure 7 (issue 20): observe calls per poll interval and their bytes for 10 / 100 /
/// 500 machines in one region, before and after; one launch's overhead over the cloud's
/// boot and one destroy's over its termination (virtual time); plan at 1,000 and
/// 10,000 machines (wall clock, the real binary).
fn bench_scale(o: &Opts) -> Value {
    let latency = Duration::from_millis(100);
    let poll = Duration::from_secs(5);
    let boot = Duration::from_secs(3);
    let termination = Duration::from_secs(1);
    let mut calls = Vec::new();
    for n in [10, 100, 500] {
        for shared in [false, true] {
            let r = virtual_fleet(n, shared, latency, boot, termination, poll, vec![]);
            assert_eq!(r.ready, n);
            let intervals = r.apply_s / poll.as_secs_f64();
            calls.push(json!({
                "vms": n,
                "path": if shared { "after" } else { "before" },
                "apply_s": r.apply_s,
                "observe_calls": r.observe_calls,
                "observe_calls_per_poll_interval": r.observe_calls as f64 / intervals,
                "observe_bytes": r.observe_bytes,
                "observe_bytes_per_poll_interval": r.observe_bytes as f64 / intervals,
            }));
        }
    }
    // One launch with a 2 s boot, and one destroy with a 1 s termination, no API
    // latency: what is left over the cloud's own time is gpuprov's.
    let mut overhead = serde_json::Map::new();
    for shared in [false, true] {
        let boot = Duration::from_secs(2);
        let r = virtual_fleet(1, shared, Duration::ZERO, boot, termination, poll, vec![]);
        overhead.insert(
            (if shared { "after" } else { "before" }).into(),
            json!({
                "launch_s": r.apply_s,
                "launch_overhead_s": r.apply_s - boot.as_secs_f64(),
                "destroy_s": r.destroy_s,
                "termination_s": termination.as_secs_f64(),
            }),
        );
    }
    let sizes: &[usize] = if o.quick { &[1000] } else { &[1000, 10_000] };
    json!({
        "api_latency_ms": latency.as_millis() as u64,
        "poll_interval_s": poll.as_secs(),
        "boot_s": boot.as_secs(),
        "observe_calls": calls,
        "one_machine": overhead,
        "fleet_under_rate_limits": fleet_under_rate_limits(latency, boot, termination, poll),
        "plan": bench_plan_sizes(o, sizes),
    })
}
