//! End to end on the real Docker test cloud, through the real binary: apply, a command
//! over SSH, an idempotent re-apply, a `kill -9` of apply mid-launch followed by an apply
//! that adopts the same container, and a destroy that leaves nothing carrying the label.
//!
//! Needs a running Docker Engine (CI has one). Builds the base image with
//! `scripts/build-base-image.sh` when it is missing. `GPUPROV_SKIP_DOCKER=1` skips, loudly.

use crate::support::figures;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use bollard::query_parameters::{
    ListContainersOptionsBuilder, ListNetworksOptionsBuilder, ListVolumesOptionsBuilder,
};
use bollard::Docker;

pub(crate) fn skip() -> bool {
    if std::env::var_os("GPUPROV_SKIP_DOCKER").is_some_and(|v| v == "1") {
        eprintln!("SKIP: GPUPROV_SKIP_DOCKER=1, the Docker end-to-end test did not run");
        return true;
    }
    false
}

pub(crate) struct Project {
    pub(crate) dir: tempfile::TempDir,
}

/// A failing assertion must not leave containers behind (their state file goes with the
/// temp dir): on drop, `gpuprov destroy` runs, then any container still carrying the
/// project's lineage label is removed directly.
impl Drop for Project {
    fn drop(&mut self) {
        let Ok(text) = std::fs::read_to_string(self.state_path()) else {
            return;
        };
        let Some(lineage) = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["lineage"].as_str().map(str::to_string))
        else {
            return;
        };
        let _ = self.cmd(&["destroy", "--auto-approve"]).output();
        // A runtime of its own: drop may run inside the test's runtime.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let docker = Docker::connect_with_defaults().ok()?;
                for id in containers(&lineage).await {
                    let opts = bollard::query_parameters::RemoveContainerOptionsBuilder::default()
                        .force(true)
                        .v(true)
                        .build();
                    let _ = docker.remove_container(&id, Some(opts)).await;
                }
                Some(())
            })
        })
        .join();
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
        Project { dir }
    }
    pub(crate) fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_gpuprov"));
        c.current_dir(self.dir.path())
            .env("GPUPROV_HOME", self.dir.path().join("home"))
            .env("NO_COLOR", "1")
            .args(args)
            .stdin(Stdio::null());
        c
    }
    pub(crate) fn run(&self, args: &[&str]) -> Output {
        let out = self.cmd(args).output().unwrap();
        eprintln!(
            "$ gpuprov {}\n-> {:?}\n{}{}",
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
    pub(crate) fn state(&self) -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(self.state_path()).unwrap()).unwrap()
    }
    /// The machine state of `address` as gpuprov sees it during a run: the state file
    /// with the run's write-ahead journal replayed (what `gpuprov status` shows).
    fn live_state_label(&self, address: &str) -> Option<String> {
        let (_, state) = gpuprov::state::StateStore::open(self.state_path()).ok()?;
        state.resources.get(address).and_then(|r| {
            r.machine.state.to_value()["state"]
                .as_str()
                .map(str::to_string)
        })
    }
    pub(crate) fn lineage(&self) -> String {
        self.state()["lineage"].as_str().unwrap().to_string()
    }
}

/// Containers carrying this lineage's label (any status).
pub(crate) async fn containers(lineage: &str) -> Vec<String> {
    let docker = Docker::connect_with_defaults().unwrap();
    let filters: HashMap<String, Vec<String>> = HashMap::from([(
        "label".to_string(),
        vec![format!("gpuprov-lineage={lineage}")],
    )]);
    let opts = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    docker
        .list_containers(Some(opts))
        .await
        .unwrap()
        .into_iter()
        .filter_map(|c| c.id)
        .collect()
}

pub(crate) async fn leftovers(lineage: &str) -> (usize, usize, usize) {
    let docker = Docker::connect_with_defaults().unwrap();
    let label = format!("gpuprov-lineage={lineage}");
    let filters: HashMap<String, Vec<String>> = HashMap::from([("label".to_string(), vec![label])]);
    let c = containers(lineage).await.len();
    let n = docker
        .list_networks(Some(
            ListNetworksOptionsBuilder::default()
                .filters(&filters)
                .build(),
        ))
        .await
        .unwrap()
        .len();
    let v = docker
        .list_volumes(Some(
            ListVolumesOptionsBuilder::default()
                .filters(&filters)
                .build(),
        ))
        .await
        .unwrap()
        .volumes
        .unwrap_or_default()
        .len();
    (c, n, v)
}

pub(crate) fn ensure_base_image() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build-base-image.sh");
    let out = Command::new("bash")
        .arg(script)
        .output()
        .expect("run scripts/build-base-image.sh");
    assert!(
        out.status.success(),
        "building the base image failed (is Docker running?):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_lifecycle_apply_ssh_reapply_kill9_adopt_destroy() {
    if skip() {
        return;
    }
    ensure_base_image();
    let p = Project::new();

    // 1. apply brings the machine up.
    let out = p.run(&["apply", "--auto-approve", "-c", "gpuprov.toml"]);
    assert!(out.status.success(), "apply failed");
    let lineage = p.lineage();
    let first = containers(&lineage).await;
    assert_eq!(first.len(), 1, "exactly one container after apply");
    assert_eq!(
        p.state()["resources"]["vm.dev"]["machine"]["state"]["state"],
        "ready"
    );

    // 2. a command over SSH runs in the container.
    let out = p.run(&["ssh", "dev", "--", "uname", "-a"]);
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("Linux "), "uname -a output: {stdout}");
    let out = p.run(&["ssh", "dev", "--", "exit 7"]);
    assert_eq!(
        out.status.code(),
        Some(7),
        "words are joined and run by the remote shell, as with ssh"
    );
    let out = p.run(&["ssh", "dev", "--", "echo", "a  b", "|", "wc", "-w"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "2",
        "as OpenSSH: joined, then parsed remotely"
    );
    let mut child = p
        .cmd(&["ssh", "dev", "--", "tr", "a-z", "A-Z"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"piped input\n").unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "PIPED INPUT\n",
        "piped stdin is forwarded"
    );

    // 3. nothing to change: plan exits 0 with --detailed-exitcode, apply is a no-op.
    let out = p.run(&["plan", "--detailed-exitcode"]);
    assert_eq!(out.status.code(), Some(0));
    let out = p.run(&["apply", "--auto-approve"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("No changes."));
    assert_eq!(
        containers(&lineage).await,
        first,
        "the same container, untouched"
    );

    // The ssh config a user can Include pins the host key.
    let ssh_config = std::fs::read_to_string(
        p.dir
            .path()
            .join("home/projects")
            .join(&lineage)
            .join("ssh_config"),
    )
    .unwrap();
    assert!(
        ssh_config.contains(&format!(
            "\nHost gpuprov-{}-dev gpuprov-dev\n",
            &lineage[..8]
        )) && ssh_config.contains("StrictHostKeyChecking yes"),
        "{ssh_config}"
    );

    // 4. destroy removes it; the state is empty of resources.
    let out = p.run(&["destroy", "--auto-approve"]);
    assert!(out.status.success());
    assert_eq!(
        leftovers(&lineage).await,
        (0, 0, 0),
        "no container, network or volume left"
    );
    assert_eq!(
        p.state()["resources"]
            .as_object()
            .map(|m| m.len())
            .unwrap_or(0),
        0
    );

    // 5. kill -9 while the instance is booting, then apply again: the same container is
    // adopted, never duplicated.
    let mut child = p
        .cmd(&["apply", "--auto-approve"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut killed_at = None;
    while Instant::now() < deadline {
        let label = p.live_state_label("vm.dev");
        if matches!(label.as_deref(), Some("booting") | Some("connecting")) {
            child.kill().unwrap(); // SIGKILL
            killed_at = label;
            break;
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = child.wait();
    let killed_at = killed_at.expect("apply was killed while booting or connecting");
    eprintln!("killed apply in state {killed_at}");
    let before = containers(&lineage).await;
    assert_eq!(
        before.len(),
        1,
        "the killed apply had created the container"
    );

    let out = p.run(&["apply", "--auto-approve"]);
    assert!(out.status.success(), "the second apply resumes");
    let after = containers(&lineage).await;
    assert_eq!(
        after, before,
        "exactly one container carries the label: the same one, adopted"
    );
    assert_eq!(
        p.state()["resources"]["vm.dev"]["machine"]["state"]["state"],
        "ready"
    );

    let out = p.run(&["destroy", "--auto-approve"]);
    assert!(out.status.success());
    assert_eq!(leftovers(&lineage).await, (0, 0, 0));

    // 6. one Ctrl-C (SIGINT) while the machine is being created: it is torn down, the
    // state says it was cancelled, and the exit status is 130.
    let child = p
        .cmd(&["apply", "--auto-approve"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut signalled = false;
    while Instant::now() < deadline && !signalled {
        let label = p.live_state_label("vm.dev");
        if matches!(
            label.as_deref(),
            Some("creating") | Some("booting") | Some("connecting")
        ) {
            assert!(Command::new("kill")
                .args(["-INT", &pid])
                .status()
                .unwrap()
                .success());
            signalled = true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(signalled, "apply reached creating/booting/connecting");
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("Interrupt received"), "{stderr}");
    let st = &p.state()["resources"]["vm.dev"]["machine"]["state"];
    assert_eq!(st["state"], "aborted", "{st}");
    assert!(st["reason"].as_str().unwrap().contains("cancelled"), "{st}");
    assert_eq!(
        leftovers(&lineage).await,
        (0, 0, 0),
        "the machine being created was torn down"
    );
}

/// No secret reaches the state file, its backup, a plan file, the ssh config, the lock
/// file, logs or any output: sentinel credentials in the environment, a sentinel password
/// in an endpoint URL, and the project's private key are searched for everywhere after
/// plan, apply, status, a failing apply and destroy.
#[tokio::test(flavor = "multi_thread")]
async fn no_secret_reaches_state_plan_files_logs_or_output() {
    if skip() {
        return;
    }
    ensure_base_image();
    let p = Project::new();
    let sentinel = format!("SENTINEL{}", uuid::Uuid::new_v4().simple());
    let config = format!(
        "{}\n[cloud.aws]\nendpoint = \"https://gpuprov:{sentinel}@127.0.0.1:1/\"\n",
        std::fs::read_to_string(p.dir.path().join("gpuprov.toml")).unwrap()
    );
    std::fs::write(p.dir.path().join("gpuprov.toml"), &config).unwrap();
    let env: Vec<(&str, String)> = [
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "LAMBDA_API_KEY",
        "RUNPOD_API_KEY",
        "DIGITALOCEAN_TOKEN",
        "HYPERSTACK_API_KEY",
    ]
    .into_iter()
    .map(|k| (k, sentinel.clone()))
    .collect();
    let outputs = std::cell::RefCell::new(String::new());
    let run = |args: &[&str]| -> Output {
        let out = p
            .cmd(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("GPUPROV_LOG", "debug")
            .output()
            .unwrap();
        let mut all = outputs.borrow_mut();
        all.push_str(&String::from_utf8_lossy(&out.stdout));
        all.push_str(&String::from_utf8_lossy(&out.stderr));
        out
    };
    assert!(run(&["plan", "-out", "saved.plan"]).status.success());
    assert!(
        outputs.borrow().contains("https://REDACTED@127.0.0.1:1/"),
        "the override is shown, redacted: {}",
        outputs.borrow()
    );
    assert!(
        run(&["apply", "--auto-approve", "saved.plan"])
            .status
            .success(),
        "{}",
        outputs.borrow()
    );
    assert!(run(&["status"]).status.success());
    assert!(run(&["list"]).status.success());
    assert!(run(&["ssh", "dev", "--", "true"]).status.success());
    // A failing apply: a base image that does not exist aborts in prepare.
    std::fs::write(
        p.dir.path().join("gpuprov.toml"),
        config.replace(
            "[vm.dev]",
            "[vm.bad]\nimage = \"no-such-base:1\"\n\n[vm.dev]",
        ),
    )
    .unwrap();
    assert!(
        !run(&["apply", "--auto-approve"]).status.success(),
        "{}",
        outputs.borrow()
    );
    assert!(
        outputs
            .borrow()
            .contains("vm.bad: FAILED: aborted: prepare failed"),
        "{}",
        outputs.borrow()
    );
    std::fs::write(p.dir.path().join("gpuprov.toml"), &config).unwrap();
    let lineage = p.lineage();
    assert!(
        run(&["destroy", "--auto-approve"]).status.success(),
        "{}",
        outputs.borrow()
    );

    let key_dir = p.dir.path().join("home/projects").join(&lineage);
    let private = std::fs::read_to_string(key_dir.join("id_ed25519")).unwrap();
    let key_lines: Vec<&str> = private
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() >= 16)
        .collect();
    assert!(!key_lines.is_empty());
    let mut haystacks = vec![("all command output".to_string(), outputs.borrow().clone())];
    for f in [
        "gpuprov.state.json",
        "gpuprov.state.json.backup",
        "gpuprov.state.json.lock",
        "saved.plan",
    ] {
        let path = p.dir.path().join(f);
        haystacks.push((
            f.to_string(),
            std::fs::read_to_string(&path).unwrap_or_else(|_| panic!("{f} exists")),
        ));
    }
    for f in ["ssh_config", "known_hosts"] {
        haystacks.push((
            f.to_string(),
            std::fs::read_to_string(key_dir.join(f)).unwrap(),
        ));
    }
    let hits: usize = haystacks
        .iter()
        .map(|(_, text)| {
            usize::from(text.contains(&sentinel))
                + key_lines.iter().filter(|l| text.contains(**l)).count()
        })
        .sum();
    figures::write(
        "secrets_e2e",
        &serde_json::json!({
            "searched": haystacks.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            "sentinel_hits": hits,
        }),
    );
    for (name, text) in &haystacks {
        assert!(
            !text.contains(&sentinel),
            "sentinel credential found in {name}"
        );
        for l in &key_lines {
            assert!(!text.contains(l), "private key material found in {name}");
        }
    }
    assert_eq!(leftovers(&lineage).await, (0, 0, 0));
}

/// Issue 12 on the real Docker cloud: a stopped recorded machine is started again (same
/// container, same disk) instead of replaced; a container carrying the machine's identity
/// that the state does not own is never deleted by apply — not when it refuses the project
/// key, not when it is stopped — and `destroy` removes it deliberately.
#[tokio::test(flavor = "multi_thread")]
async fn docker_restart_before_replace_and_found_machines_are_left_untouched() {
    if skip() {
        return;
    }
    ensure_base_image();
    let p = Project::new();
    let docker = Docker::connect_with_defaults().unwrap();
    let out = p.run(&["apply", "--auto-approve"]);
    assert!(out.status.success(), "apply failed");
    let lineage = p.lineage();
    let ids = containers(&lineage).await;
    assert_eq!(ids.len(), 1);
    let id = ids[0].clone();
    // Something on the machine's disk that a replacement would not have.
    let out = p.run(&["ssh", "dev", "--", "echo kept > /root/marker"]);
    assert!(out.status.success());

    // 1. Stopped outside gpuprov: plan says it starts it, apply starts the same container.
    docker
        .stop_container(&id, None::<bollard::query_parameters::StopContainerOptions>)
        .await
        .unwrap();
    let out = p.run(&["plan"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("apply starts it again"), "{text}");
    let out = p.run(&["apply", "--auto-approve"]);
    assert!(out.status.success(), "restart failed");
    assert_eq!(containers(&lineage).await, vec![id.clone()], "not replaced");
    let out = p.run(&["ssh", "dev", "--", "cat /root/marker"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "kept");
    // Paused (shown as stopped): apply unpauses it.
    docker.pause_container(&id).await.unwrap();
    let out = p.run(&["apply", "--auto-approve"]);
    assert!(out.status.success(), "unpause failed");
    assert_eq!(containers(&lineage).await, vec![id.clone()], "not replaced");

    // 2. The state forgets the machine (restored from an old copy, say) while the
    // container runs with another key: apply finds it by identity, is refused, and
    // leaves it running.
    let mut state = p.state();
    state["resources"].as_object_mut().unwrap().remove("vm.dev");
    std::fs::write(p.state_path(), serde_json::to_vec_pretty(&state).unwrap()).unwrap();
    let out = std::process::Command::new("docker")
        .args([
            "exec",
            &id,
            "sh",
            "-c",
            "echo 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIColleagueKeyNotOursAtAllxxxxxxxxxxxxxxxxx colleague' > /root/.ssh/authorized_keys",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let out = p.run(&["apply", "--auto-approve"]);
    assert!(
        !out.status.success(),
        "a machine it cannot log in to is not up"
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("not created by gpuprov"), "{text}");
    assert!(text.contains("key refused"), "{text}");
    assert_eq!(
        containers(&lineage).await,
        vec![id.clone()],
        "left untouched"
    );
    let out = p.run(&["status"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("unowned"),
        "status shows it"
    );
    let out = p.run(&["plan"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        text.contains("not created by gpuprov"),
        "plan shows it: {text}"
    );
    assert!(!text.contains("1 to add"), "nothing would be added: {text}");

    // 2b. Unknown to the state again, and the next apply fails in prepare (an image that
    // does not exist): its compensation deletes nothing it did not create.
    let mut state = p.state();
    state["resources"].as_object_mut().unwrap().remove("vm.dev");
    std::fs::write(p.state_path(), serde_json::to_vec_pretty(&state).unwrap()).unwrap();
    let config = p.dir.path().join("gpuprov.toml");
    let good = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        good.replace(
            "regions = [\"local\"]",
            "regions = [\"local\"]\nimage = \"gpuprov/does-not-exist:1\"",
        ),
    )
    .unwrap();
    let out = p.run(&["apply", "--auto-approve"]);
    assert!(!out.status.success());
    assert_eq!(
        containers(&lineage).await,
        vec![id.clone()],
        "left untouched"
    );
    std::fs::write(&config, good).unwrap();

    // 3. Stopped and unknown to the state: still never deleted by apply.
    docker
        .stop_container(&id, None::<bollard::query_parameters::StopContainerOptions>)
        .await
        .unwrap();
    let out = p.run(&["apply", "--auto-approve"]);
    assert!(!out.status.success());
    assert_eq!(
        containers(&lineage).await,
        vec![id.clone()],
        "left untouched"
    );

    // 4. destroy removes it deliberately.
    let out = p.run(&["destroy", "--auto-approve"]);
    assert!(out.status.success());
    assert!(containers(&lineage).await.is_empty());
}

/// Issue 20, gpuprov's own overhead on one launch on the Docker cloud: `apply` of one
/// machine through the real binary, while a probe beside it watches the container
/// (created at, by the Engine's clock) and its published SSH port (first `SSH-` banner,
/// polled every 10 ms). The cloud's own boot and SSH time is banner − created; what the
/// apply's wall time adds to it is gpuprov's (start-up, state, prepare, the create call,
/// polls, the SSH login and host-key pinning). A figure, not a timed assertion: written
/// to `<target>/reliability/launch_overhead_docker.json` for BENCHMARKS.md (goal ≤ 1 s
/// median).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launch_overhead_on_the_docker_cloud() {
    use tokio::io::AsyncReadExt as _;
    if skip() {
        return;
    }
    ensure_base_image();
    let docker = Docker::connect_with_defaults().unwrap();
    let mut rows = Vec::new();
    for run in 0..3 {
        let p = Project::new();
        // A name no other test uses, so the probe finds only this apply's container.
        let vm = format!("overhead{}-{run}", std::process::id());
        std::fs::write(
            p.dir.path().join("gpuprov.toml"),
            format!("[defaults]\nclouds = [\"docker\"]\n\n[vm.{vm}]\nregions = [\"local\"]\n"),
        )
        .unwrap();
        let mut apply = p.cmd(&["apply", "--auto-approve"]);
        apply.stdout(Stdio::null()).stderr(Stdio::null());
        let started = std::time::SystemTime::now();
        let t0 = Instant::now();
        let apply = std::thread::spawn(move || {
            let st = apply.status().unwrap();
            (st, t0.elapsed())
        });
        let filters: HashMap<String, Vec<String>> =
            HashMap::from([("label".to_string(), vec![format!("gpuprov-vm-name={vm}")])]);
        // The container and its SSH port, once the Engine has published it.
        let (id, port) = loop {
            assert!(t0.elapsed() < Duration::from_secs(120), "no container");
            let opts = ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build();
            let found = docker.list_containers(Some(opts)).await.unwrap();
            let port = found.first().and_then(|c| {
                c.ports
                    .iter()
                    .flatten()
                    .find(|p| p.private_port == 22 && p.public_port.is_some())
                    .and_then(|p| p.public_port)
            });
            if let (Some(c), Some(port)) = (found.first(), port) {
                break (c.id.clone().unwrap(), port);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let banner = loop {
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "sshd never answered"
            );
            if let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                let mut buf = [0u8; 4];
                let read = tokio::time::timeout(Duration::from_secs(1), s.read_exact(&mut buf));
                if matches!(read.await, Ok(Ok(_))) && &buf == b"SSH-" {
                    break t0.elapsed();
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let info = docker
            .inspect_container(
                &id,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
            .unwrap();
        let created = chrono::DateTime::parse_from_rfc3339(
            &info.created.expect("the Engine reports when it created it"),
        )
        .expect("RFC 3339 with nanoseconds");
        let created = (std::time::SystemTime::from(created)
            .duration_since(started)
            .unwrap_or_default())
        .as_secs_f64();
        let (status, wall) = apply.join().unwrap();
        assert!(status.success(), "apply failed");
        assert_eq!(
            p.state()["resources"][format!("vm.{vm}")]["machine"]["state"]["state"],
            "ready"
        );
        let cloud = banner.as_secs_f64() - created;
        rows.push(serde_json::json!({
            "apply_s": wall.as_secs_f64(),
            "container_created_at_s": created,
            "ssh_banner_at_s": banner.as_secs_f64(),
            "cloud_boot_and_ssh_s": cloud,
            "overhead_s": wall.as_secs_f64() - cloud,
        }));
        drop(p); // destroys it
    }
    let mut overheads: Vec<f64> = rows
        .iter()
        .map(|r| r["overhead_s"].as_f64().unwrap())
        .collect();
    overheads.sort_by(f64::total_cmp);
    figures::write(
        "launch_overhead_docker",
        &serde_json::json!({
            "runs": rows,
            "overhead_median_s": overheads[overheads.len() / 2],
        }),
    );
}
