//! Crash points on the real Docker test cloud through the real binary (issue 6): for a
//! representative subset (at least one point per launch and teardown state), the binary
//! runs with `GPUPROV_CRASH_AT=<point>`, parks there (it prints the marker line), and gets
//! a real `kill -9`; then `apply` again and `destroy` must leave exactly one container
//! while up and none at the end, with a state file the tool accepts.
//!
//! Also the lock checks that need a real holder process: a second `apply` waits up to
//! `--lock-timeout` then fails naming the holder; `status`, `list` and `state show` do not
//! wait on it; after the holder is killed its stale record is reported, and
//! `force-unlock ID` clears it. And the secret sweep of the journal a killed run leaves.
//!
//! Needs a running Docker Engine. `GPUPROV_SKIP_DOCKER=1` skips, loudly.

use crate::support::drive;
use crate::support::figures;
use crate::support::stores::{backend_config, named, Store};

use gpuprov::config::BackendSettings;
use std::sync::Arc;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub(crate) fn skip() -> bool {
    if std::env::var_os("GPUPROV_SKIP_DOCKER").is_some_and(|v| v == "1") {
        eprintln!("SKIP: GPUPROV_SKIP_DOCKER=1, the Docker crash tests did not run");
        return true;
    }
    false
}

pub(crate) fn ensure_base_image() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build-base-image.sh");
    let out = Command::new("bash").arg(script).output().unwrap();
    assert!(out.status.success(), "base image build failed");
}

/// One checkout running the real binary: its own directory and `GPUPROV_HOME` (a CI
/// runner), on the local state or on a backend (`settings`, reached through `env`).
pub(crate) struct Project {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) settings: Option<BackendSettings>,
}

impl Drop for Project {
    /// A failing assertion must not leave containers behind.
    fn drop(&mut self) {
        let _ = self.cmd(&["destroy", "--auto-approve"]).output();
        if let Some(l) = self.lineage() {
            let ids = docker_ps(&l);
            if !ids.is_empty() {
                let _ = Command::new("docker")
                    .args(["rm", "-f"])
                    .args(&ids)
                    .output();
            }
        }
    }
}

impl Project {
    pub(crate) fn new() -> Project {
        let dir = tempfile::tempdir().unwrap();
        let example = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/docker.toml"),
        )
        .unwrap();
        std::fs::write(dir.path().join("gpuprov.toml"), example).unwrap();
        Project {
            dir,
            env: vec![],
            settings: None,
        }
    }

    /// A checkout whose state lives in `store`, under its own `name` (an S3 key prefix,
    /// a PostgreSQL state name), selected through `GPUPROV_BACKEND_CONFIG` as CI does.
    pub(crate) fn on(store: &dyn Store, name: &str) -> Project {
        let mut p = Project::new();
        let settings = named(store.settings(), name);
        p.env = store.env();
        p.env
            .push(("GPUPROV_BACKEND_CONFIG".into(), backend_config(&settings)));
        p.settings = Some(settings);
        p
    }

    /// The backend of this checkout's state, opened from the test process.
    pub(crate) fn backend(&self) -> Arc<dyn gpuprov::state::Backend> {
        for (k, v) in &self.env {
            std::env::set_var(k, v);
        }
        let local = BackendSettings::default();
        gpuprov::state::open_backend(
            self.settings.as_ref().unwrap_or(&local),
            &self.state_path(),
            self.dir.path(),
        )
        .unwrap()
    }
    pub(crate) fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_gpuprov"));
        c.current_dir(self.dir.path())
            .env("GPUPROV_HOME", self.dir.path().join("home"))
            .env("NO_COLOR", "1")
            .env_remove("GPUPROV_CRASH_AT")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .args(args)
            .stdin(Stdio::null());
        c
    }
    pub(crate) fn run(&self, args: &[&str]) -> Output {
        let out = self.cmd(args).output().unwrap();
        eprintln!(
            "$ gpuprov {} -> {:?}\n{}{}",
            args.join(" "),
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
    pub(crate) fn state_path(&self) -> PathBuf {
        self.dir.path().join("gpuprov.state.json")
    }
    pub(crate) fn lineage(&self) -> Option<String> {
        let (store, st) = gpuprov::state::StateStore::open_in(self.backend()).ok()?;
        (store.original_bytes().is_some() || store.replayed_journal()).then_some(st.lineage)
    }
    /// Starts `args` armed at `point`; returns once it parked there (its stderr printed
    /// the marker), with the child still alive, and its stderr so far.
    pub(crate) fn park_at(&self, args: &[&str], point: &str) -> (Child, String) {
        let mut child = self
            .cmd(args)
            .env("GPUPROV_CRASH_AT", point)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut seen = String::new();
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                seen.push_str(&line);
                seen.push('\n');
                if line.starts_with(gpuprov::crash::REACHED_MARKER) {
                    let _ = tx.send(Ok(seen.clone()));
                }
            }
            let _ = tx.send(Err(seen));
        });
        match rx.recv_timeout(Duration::from_secs(40)) {
            Ok(Ok(seen)) => (child, seen),
            other => {
                let _ = child.kill();
                panic!("{args:?} never reached {point}: {other:?}")
            }
        }
    }
}

/// Containers carrying VM name `dev` and this lineage (any status), as `docker ps -a`.
pub(crate) fn docker_ps(lineage: &str) -> Vec<String> {
    containers_of(lineage, "dev")
}

/// Containers carrying VM name `vm` and `lineage` (any status), as `docker ps -a`.
fn containers_of(lineage: &str, vm: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=gpuprov-vm-name={vm}"),
            "--filter",
            &format!("label=gpuprov-lineage={lineage}"),
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

pub(crate) fn kill9(mut child: Child) {
    child.kill().unwrap(); // SIGKILL on Unix
    let status = child.wait().unwrap();
    assert!(!status.success());
}

/// The subset: at least one point per launch state and per teardown state, both sides of
/// the create, and the record removal. `true`: the point is reached in `destroy`.
const POINTS: &[(&str, bool)] = &[
    ("journal.after:launch:reconciling", false),
    ("journal.after:launch:planning", false),
    ("journal.after:launch:preparing", false),
    ("journal.after:launch:creating", false),
    ("provider.after:create", false),
    ("journal.after:launch:booting", false),
    ("journal.after:launch:connecting", false),
    ("journal.before:launch:ready", false),
    ("journal.after:teardown:requesting", true),
    ("provider.after:delete", true),
    ("journal.after:teardown:awaiting_gone", true),
    ("journal.after:teardown:cleaning_up", true),
    ("journal.after:teardown:done", true),
    ("journal.before:remove", true),
];

/// One point: (apply first when it is a destroy point,) run armed, kill -9 at the point,
/// then apply again and destroy. Returns problems found.
pub(crate) fn crash_once(point: &str, in_destroy: bool, store: Option<&dyn Store>) -> Vec<String> {
    let p = match store {
        Some(s) => Project::on(
            s,
            &format!("crash-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
        ),
        None => Project::new(),
    };
    let mut problems = vec![];
    if in_destroy {
        assert!(p.run(&["apply", "--auto-approve"]).status.success());
    }
    let args: &[&str] = if in_destroy {
        &["destroy", "--auto-approve"]
    } else {
        &["apply", "--auto-approve"]
    };
    let (child, _) = p.park_at(args, point);
    kill9(child);
    if let Err(e) = gpuprov::state::StateStore::open_in(p.backend()) {
        problems.push(format!("state refused after kill -9: {e}"));
    }
    // A remote lock outlives a killed holder (S3), or leaves its record (PostgreSQL):
    // what a CI job does next is `force-unlock` with the ID the lock error names.
    if let Ok(Some(info)) = p.backend().lock_info() {
        if !p.run(&["force-unlock", &info.id]).status.success() {
            problems.push("force-unlock after the crash failed".into());
        }
    }
    let lineage = p.lineage().expect("a lineage");
    if docker_ps(&lineage).len() > 1 {
        problems.push("duplicate after the crash".into());
    }
    if !p.run(&["apply", "--auto-approve"]).status.success() {
        problems.push("apply after the crash failed".into());
    }
    let up = docker_ps(&lineage).len();
    if up != 1 {
        problems.push(format!("duplicate: {up} containers after re-apply"));
    }
    if !p.run(&["destroy", "--auto-approve"]).status.success() {
        problems.push("destroy failed".into());
    }
    let left = docker_ps(&lineage);
    if !left.is_empty() {
        problems.push(format!("leaked: {left:?}"));
    }
    match gpuprov::state::StateStore::open_in(p.backend()) {
        Ok((store, _)) if store.original_bytes().is_some() && !store.replayed_journal() => {}
        Ok(_) => problems.push("no folded state after destroy".into()),
        Err(e) => problems.push(format!("state refused after destroy: {e}")),
    }
    problems
}

#[test]
fn docker_kill9_at_a_point_per_state_recovers_without_duplicates_or_leaks() {
    if skip() {
        return;
    }
    ensure_base_image();
    sweep(None, "crash_sweep_docker");
}

/// The same sweep with the state, journal and lock on S3 (moto): after each `kill -9`
/// the run's lock is left behind, cleared with `force-unlock ID` as CI would.
#[test]
fn docker_kill9_sweep_on_the_s3_backend() {
    if skip() {
        return;
    }
    ensure_base_image();
    let store = crate::support::stores::S3Store::start();
    sweep(Some(&store), "crash_sweep_docker_s3");
}

/// And on PostgreSQL: the lock dies with the killed run's session; its record is cleared.
#[test]
fn docker_kill9_sweep_on_the_postgres_backend() {
    if skip() {
        return;
    }
    ensure_base_image();
    let store = crate::support::stores::PgStore::start();
    sweep(Some(&store), "crash_sweep_docker_postgres");
}

/// Runs every point of [`POINTS`] (three at a time), writes the figures as `figure`, and
/// fails listing every point that leaked, duplicated or left a state the tool refuses.
fn sweep(store: Option<&(dyn Store + Sync)>, figure: &str) {
    let started = Instant::now();
    // Three at a time: the runs spend most of their time waiting on Docker and sshd.
    let results: Vec<(String, Vec<String>)> = std::thread::scope(|s| {
        POINTS
            .chunks(POINTS.len().div_ceil(3))
            .map(|chunk| {
                s.spawn(move || {
                    chunk
                        .iter()
                        .map(|(pt, d)| {
                            let store = store.map(|s| s as &dyn Store);
                            (pt.to_string(), crash_once(pt, *d, store))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let mut kinds: BTreeMap<&str, (u32, u32)> = BTreeMap::new();
    let mut failures = vec![];
    for (pt, problems) in &results {
        let kind = if pt.contains(":launch:") {
            "launch"
        } else if pt.contains(":teardown:") {
            "teardown"
        } else if pt.starts_with("provider.") {
            "provider calls"
        } else {
            "engine (record removal)"
        };
        let e = kinds.entry(kind).or_default();
        e.1 += 1;
        if problems.is_empty() {
            e.0 += 1;
        } else {
            failures.push(format!("{pt}: {}", problems.join("; ")));
        }
    }
    let count = |prefix: &str| {
        results
            .iter()
            .flat_map(|(_, p)| p)
            .filter(|p| p.starts_with(prefix))
            .count()
    };
    figures::write(
        figure,
        &serde_json::json!({
            "cloud": "docker",
            "backend": store.map(|s| s.settings().kind.as_str()).unwrap_or("local"),
            "kinds": kinds.iter().map(|(k, (c, t))| (k.to_string(), serde_json::json!({"covered": c, "total": t}))).collect::<serde_json::Map<_, _>>(),
            "crash_runs": results.len(),
            "leaks": count("leaked"),
            "duplicates": count("duplicate"),
            "failures": failures,
            "seconds": started.elapsed().as_secs_f64(),
        }),
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Two applys on one state, read-only commands during an apply, a killed holder's stale
/// lock, `force-unlock`; and no secret in the journal the killed run left.
#[test]
fn docker_lock_holder_stale_lock_force_unlock_and_torn_journal_secrets() {
    if skip() {
        return;
    }
    ensure_base_image();
    let mut p = Project::new();
    let sentinel = format!("SENTINEL{}", uuid::Uuid::new_v4().simple());
    p.env = [
        "AWS_SECRET_ACCESS_KEY",
        "LAMBDA_API_KEY",
        "RUNPOD_API_KEY",
        "DIGITALOCEAN_TOKEN",
        "HYPERSTACK_API_KEY",
    ]
    .iter()
    .map(|k| (k.to_string(), sentinel.clone()))
    .collect();
    p.env.push(("GPUPROV_LOG".into(), "debug".into()));

    // The holder parks right after the instance is journalled as booting.
    let (holder, mut outputs) =
        p.park_at(&["apply", "--auto-approve"], "journal.after:launch:booting");
    let holder_pid = holder.id();

    // A second apply waits --lock-timeout, then fails naming the holder.
    let t = Instant::now();
    let second = p.run(&["apply", "--auto-approve", "--lock-timeout", "1s"]);
    let waited = t.elapsed();
    let err = String::from_utf8_lossy(&second.stderr).to_string();
    outputs.push_str(&err);
    assert!(!second.status.success(), "the second apply must fail");
    assert!(waited >= Duration::from_millis(900), "waited {waited:?}");
    // ... and gives up about then: not a hang (a generous bound for a loaded 2-core box).
    assert!(
        waited < Duration::from_secs(15),
        "gave up only after {waited:?}"
    );
    assert!(
        err.contains(&holder_pid.to_string()),
        "names the holder pid: {err}"
    );
    assert!(err.contains("apply"), "names the holder's operation: {err}");
    let (_, st) = gpuprov::state::StateStore::open(p.state_path())
        .expect("the refused apply left the state readable");
    assert_eq!(
        st.resources["vm.dev"].machine.state.to_value()["state"],
        "booting",
        "and unchanged: the holder's last transition"
    );

    // Read-only commands answer at once, from the state with the live journal replayed.
    for args in [
        &["status"][..],
        &["list"][..],
        &["state", "show", "vm.dev"][..],
    ] {
        let t = Instant::now();
        let out = p.run(args);
        outputs.push_str(&String::from_utf8_lossy(&out.stdout));
        outputs.push_str(&String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{args:?}");
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{args:?} waited on the lock"
        );
    }

    // kill -9 the holder: its lock record is stale.
    kill9(holder);
    let info = gpuprov::state::lock::LockInfo::read(&p.state_path())
        .expect("the killed holder's record is still in the lock file");
    assert_eq!(info.pid, holder_pid);
    let journal_path = p.dir.path().join("gpuprov.state.json.journal");
    let torn_journal = std::fs::read_to_string(&journal_path).expect("the killed run's journal");
    assert!(torn_journal.contains("booting"), "{torn_journal}");

    // force-unlock with a wrong id is refused and names the real one; the right id clears.
    let out = p.run(&["force-unlock", "00000000-0000-4000-8000-000000000000"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains(&info.id));
    let out = p.run(&["force-unlock", &info.id]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("Cleared the stale lock") && err.contains(&holder_pid.to_string()),
        "{err}"
    );
    assert!(
        gpuprov::state::lock::LockInfo::read(&p.state_path()).is_none(),
        "cleared"
    );

    // A second killed holder: the next apply reports the stale record, then resumes.
    let (holder, seen) = p.park_at(
        &["apply", "--auto-approve"],
        "journal.after:launch:connecting",
    );
    outputs.push_str(&seen);
    let holder_pid = holder.id();
    kill9(holder);
    let out = p.run(&["apply", "--auto-approve"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    outputs.push_str(&String::from_utf8_lossy(&out.stdout));
    outputs.push_str(&err);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("was not released") && err.contains(&format!("pid {holder_pid}")),
        "the stale lock is reported with its holder: {err}"
    );
    let lineage = p.lineage().unwrap();
    assert_eq!(docker_ps(&lineage).len(), 1, "one container, adopted");
    let out = p.run(&["destroy", "--auto-approve"]);
    outputs.push_str(&String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success());
    assert!(docker_ps(&lineage).is_empty());

    // Secrets: none in the torn journal, the state, the lock file or any output; nor the
    // project's private key.
    let key_dir = p.dir.path().join("home/projects").join(&lineage);
    let private = std::fs::read_to_string(key_dir.join("id_ed25519")).unwrap();
    let key_lines: Vec<&str> = private
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() >= 16)
        .collect();
    assert!(!key_lines.is_empty());
    let mut hay = vec![("torn journal", torn_journal), ("output", outputs)];
    for f in ["gpuprov.state.json", "gpuprov.state.json.lock"] {
        hay.push((
            f,
            std::fs::read_to_string(p.dir.path().join(f)).unwrap_or_default(),
        ));
    }
    let mut hits = 0;
    for (name, text) in &hay {
        if text.contains(&sentinel) {
            hits += 1;
            eprintln!("sentinel found in {name}");
        }
        for l in &key_lines {
            if text.contains(l) {
                hits += 1;
                eprintln!("private key material found in {name}");
            }
        }
    }
    figures::write(
        "secrets_torn_journal",
        &serde_json::json!({
            "searched": hay.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            "sentinel_hits": hits,
        }),
    );
    assert_eq!(hits, 0);
}

/// The Docker cloud through the fault wrapper (`provider::doubles::faulty`), in process with the
/// real launch and teardown machines (millisecond retries): 25% of calls
/// fail before reaching Docker, 15% lose their answer after Docker acted, and the first
/// successful create's answer is always lost (it must be adopted, never duplicated). The
/// launch converges with exactly one container; the teardown leaves none. SSH is the fake
/// connector (the faults are the provider's here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_through_the_fault_wrapper_converges_with_one_container() {
    use std::sync::Arc;

    use gpuprov::config::{Cloud, VmSpec};
    use gpuprov::machine::{CancelToken, Executor, MemoryJournal, RetryPolicy};
    use gpuprov::provider::clouds::docker::{DockerProvider, DockerSettings};
    use gpuprov::provider::doubles::fake::FakeConnector;
    use gpuprov::provider::doubles::faulty::Faulty;
    use gpuprov::vm::{LaunchMachine, LaunchState, Target, TeardownMachine, TeardownState};

    /// Removes what the test may have left, even on panic.
    struct Guard(&'static str);
    impl Drop for Guard {
        fn drop(&mut self) {
            let ids = containers_of(drive::LINEAGE, self.0);
            if !ids.is_empty() {
                let _ = Command::new("docker")
                    .args(["rm", "-f"])
                    .args(&ids)
                    .output();
            }
        }
    }

    if skip() {
        return;
    }
    ensure_base_image();
    const VM: &str = "faultwrap";
    let _guard = Guard(VM);
    let settings = DockerSettings::from_env_and_config(None, None, drive::LINEAGE.parse().unwrap());
    let faulty = Arc::new(
        Faulty::new(Arc::new(DockerProvider::new(settings)), 0.25, 0.15, 42)
            .losing_first_create_answer(),
    );
    let mut vm = VmSpec::new(VM, vec![Cloud::Docker]);
    vm.regions = vec!["local".into()];
    let journal = Arc::new(MemoryJournal::new());
    // A budget of 12 attempts per state, 1-2 ms apart: at these rates a state gives up
    // only with odds of about 1e-5.
    let patient = RetryPolicy {
        max_attempts: 12,
        ..drive::FAST
    };
    let mut m = LaunchMachine::new(
        vm.clone(),
        drive::LINEAGE.into(),
        drive::PUBKEY.into(),
        drive::providers(faulty.clone()),
        Arc::new(FakeConnector::default()),
    );
    m.retry = patient;
    m.teardown.retry = patient;
    let ex = Executor::new(journal.clone(), CancelToken::new());
    let end = tokio::time::timeout(
        Duration::from_secs(60),
        ex.run(&m, "vm.faultwrap", |_| LaunchState::start(None)),
    )
    .await
    .expect("launch must not hang")
    .unwrap();
    let LaunchState::Ready { vm: rec } = &end else {
        panic!("{end:?}\n{:?}", drive::labels(&journal))
    };
    assert!(faulty.lost_a_create(), "a create's answer was lost");
    assert_eq!(
        containers_of(drive::LINEAGE, VM).len(),
        1,
        "exactly one container, the lost create adopted"
    );
    let target = Target::new(rec.location.clone(), VM, vec![rec.instance_id.clone()]);
    let mut t = TeardownMachine::new(drive::providers(faulty.clone()));
    t.retry = patient;
    let done = tokio::time::timeout(
        Duration::from_secs(60),
        ex.run(&t, "vm.faultwrap", |_| TeardownState::Requesting { target }),
    )
    .await
    .expect("teardown must not hang")
    .unwrap();
    assert_eq!(done, TeardownState::Done);
    assert!(containers_of(drive::LINEAGE, VM).is_empty(), "nothing left");
    let injected = faulty.injected();
    assert!(injected > 1, "faults were injected: {injected}");
    figures::write(
        "faults_docker_wrapper",
        &serde_json::json!({
            "fault": "Docker cloud via fault wrapper: 25% of calls fail before, 15% lose their answer, first create answer lost",
            "runs": 2,
            "faults_injected": injected,
            "outcomes": {"ready": 1, "destroyed": 1},
            "leaks_left": 0, "duplicates": 0,
        }),
    );
}
