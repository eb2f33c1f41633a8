//! The k3s installer and the SSH tunnel against a real machine of the Docker test cloud.
//!
//! Each test launches its own container (its own lineage, a fresh UUID) through the
//! Docker adapter, logs in with a fresh project key (pinning the host key as the launch
//! machine does), and removes every container of its lineage on drop (`docker rm -f` by
//! label), even when an assertion fails or the test times out.
//!
//! The installer runs exactly as the k3s machine's SSH push runs it
//! ([`install_command`] + [`installer_stdin`] through [`SshNodeShell`]), with the k3s
//! install script pointed at `tests/doubles/k3s-install-double.sh` copied into the
//! container and `tests/doubles/systemctl-double` as `/usr/local/bin/systemctl` (the base
//! image has no systemd). No network beyond 127.0.0.1 is used.
//!
//! Needs a running Docker Engine with the base image (`scripts/build-base-image.sh`) and
//! the OpenSSH client; `GPUPROV_SKIP_DOCKER=1` skips, loudly.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use gpuprov::cluster::installer::{GpuMode, InstallerConfig, K3sSource, STATUS_PATH};
use gpuprov::cluster::kubeconfig::{ApiAccess, Kubeconfig};
use gpuprov::cluster::probe::{self, BootProbe, CloudInit, GpuState, K3sUnit, Marker};
use gpuprov::cluster::remote::{
    install_command, installer_stdin, read_kubeconfig_command, NodeShell, RemoteOutput,
    SshNodeShell,
};
use gpuprov::cluster::san::{SanInputs, SanList};
use gpuprov::cluster::tunnel::{Tunnel, TunnelError};
use gpuprov::provider::clouds::docker::{DockerProvider, DockerSettings};
use gpuprov::provider::{
    CloudProvider, InstanceSpec, InstanceStatus, Location, ResourceRequest, LINEAGE_LABEL,
};
use gpuprov::ssh::{ensure_project_key, Connector, HostKey, ProjectKey, Ssh2Connector, SshError};
use gpuprov::vm::VmRecord;

/// Bound on each whole test (launch included).
const TEST_TIMEOUT: Duration = Duration::from_secs(50);

/// Where the doubles go inside the container.
const DOUBLE_INSTALLER: &str = "/opt/gpuprov-test/k3s-install-double.sh";
const DOUBLE_ROOT: &str = "/var/lib/k3s-double";

fn skip(test: &str) -> bool {
    if std::env::var("GPUPROV_SKIP_DOCKER").as_deref() == Ok("1") {
        eprintln!("SKIP {test}: GPUPROV_SKIP_DOCKER=1, this Docker test did not run");
        return true;
    }
    false
}

/// Removes every container of `lineage` on drop (`docker rm -f -v`), whatever happened.
struct Teardown {
    lineage: String,
}

impl Drop for Teardown {
    fn drop(&mut self) {
        let filter = format!("label={LINEAGE_LABEL}={}", self.lineage);
        let Ok(out) = Command::new("docker")
            .args(["ps", "-aq", "--filter", &filter])
            .output()
        else {
            eprintln!("teardown of lineage {}: cannot run docker", self.lineage);
            return;
        };
        let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        if !ids.is_empty() {
            let _ = Command::new("docker")
                .args(["rm", "-f", "-v"])
                .args(&ids)
                .output();
        }
    }
}

/// A running Docker-cloud machine we can log in to. Field order matters: the key
/// directory goes after the container is removed.
struct Machine {
    vm: VmRecord,
    key: ProjectKey,
    _teardown: Teardown,
    _key_dir: tempfile::TempDir,
}

fn local() -> Location {
    Location {
        cloud: "docker".into(),
        region: "local".into(),
        zone: None,
    }
}

/// Launches one container through the Docker adapter, waits until it runs with an SSH
/// endpoint, and logs in once without a pin (as the launch machine's first login does)
/// to learn its host key.
async fn launch(vm_name: &str) -> Machine {
    let lineage = uuid::Uuid::new_v4().to_string();
    let teardown = Teardown {
        lineage: lineage.clone(),
    };
    let key_dir = tempfile::tempdir().unwrap();
    let key = ensure_project_key(&key_dir.path().join("keys"), "gpuprov-k3s-docker-test").unwrap();
    let p = DockerProvider::new(DockerSettings::from_env_and_config(
        None,
        None,
        lineage.parse().unwrap(),
    ));
    let offer = p
        .plan(&ResourceRequest {
            vm_name: vm_name.into(),
            regions: vec![],
            zones: vec![],
            gpu: None,
            gpu_count: 0,
            spot: false,
            max_price_per_hour: None,
            gpu_count_at_least: false,
        })
        .await
        .unwrap()
        .remove(0);
    let spec = InstanceSpec {
        vm_name: vm_name.into(),
        lineage: lineage.clone(),
        client_token: format!("{vm_name}-attempt-1"),
        image: None,
        disk_gb: None,
        ports: vec![],
        ssh_public_key: key.public_key_openssh.clone(),
        boot_script: None,
        shared: Default::default(),
    };
    let prepared = p.prepare(&offer, &spec).await.unwrap_or_else(|e| {
        panic!("prepare failed (Docker running? base image built with scripts/build-base-image.sh?): {e}")
    });
    let instance_id = p.create(&offer, &prepared, &spec).await.unwrap();

    let deadline = Instant::now() + Duration::from_secs(20);
    let endpoint = loop {
        let seen = p.observe(&local(), vm_name).await.unwrap();
        if let Some(o) = seen.first() {
            if o.status == InstanceStatus::Running {
                if let Some(ssh) = &o.ssh {
                    break ssh.clone();
                }
            }
        }
        assert!(Instant::now() < deadline, "{vm_name} not running: {seen:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(endpoint.host, "127.0.0.1", "only loopback is ever dialled");

    // sshd generates host keys and the entrypoint writes authorized_keys first: retry.
    let connector = Ssh2Connector::new(key.clone(), Duration::from_secs(5));
    let host_key = loop {
        match connector.login(&endpoint, "root", None).await {
            Ok(k) => break k,
            Err(e) => {
                assert!(Instant::now() < deadline, "no SSH login to {endpoint}: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    Machine {
        vm: VmRecord {
            instance_id,
            location: local(),
            offer,
            ssh: endpoint,
            user: "root".into(),
            host_key,
            ready_at: chrono::Utc::now(),
            preemptions: vec![],
        },
        key,
        _teardown: teardown,
        _key_dir: key_dir,
    }
}

/// Runs `command` on the machine and insists it exits 0.
async fn ok(shell: &SshNodeShell, vm: &VmRecord, command: &str, stdin: Option<Vec<u8>>) -> String {
    let out = shell.run(vm, command, stdin).await.unwrap();
    assert_eq!(
        out.status, 0,
        "`{command}` failed:\n{}{}",
        out.stdout, out.stderr
    );
    out.stdout
}

fn double(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/doubles/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn config(public_host: &str) -> InstallerConfig {
    InstallerConfig {
        tls_sans: SanList::for_vm(&SanInputs {
            public_host: Some(public_host.into()),
            ..Default::default()
        })
        .unwrap(),
        san_from_metadata: false,
        gpu: GpuMode::Off,
        k3s: K3sSource {
            install_url: Some(DOUBLE_INSTALLER.into()),
            version: Some("v0.0.0+double".into()),
        },
        wait_secs: Some(6),
        ..Default::default()
    }
}

/// The installer as the SSH push runs it.
async fn install(shell: &SshNodeShell, vm: &VmRecord, cfg: &InstallerConfig) -> RemoteOutput {
    shell
        .run(
            vm,
            &install_command(&vm.user),
            Some(installer_stdin(cfg).unwrap()),
        )
        .await
        .unwrap()
}

fn assert_installed(out: &RemoteOutput) {
    assert_eq!(
        out.status, 0,
        "installer failed:\n{}{}",
        out.stdout, out.stderr
    );
}

/// Returns and clears the doubles' call log on the machine.
async fn take_calls(shell: &SshNodeShell, vm: &VmRecord) -> Vec<String> {
    let out = ok(
        shell,
        vm,
        &format!("cat {DOUBLE_ROOT}/calls 2>/dev/null; rm -f {DOUBLE_ROOT}/calls"),
        None,
    )
    .await;
    out.lines().map(str::to_string).collect()
}

async fn marker_value(shell: &SshNodeShell, vm: &VmRecord, key: &str) -> Option<String> {
    let text = ok(shell, vm, &format!("cat {STATUS_PATH}"), None).await;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")).map(str::to_string))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installer_runs_over_ssh_on_a_docker_machine() {
    if skip("installer_runs_over_ssh_on_a_docker_machine") {
        return;
    }
    tokio::time::timeout(TEST_TIMEOUT, installer_scenario())
        .await
        .expect("the installer scenario did not finish within its time bound");
}

async fn installer_scenario() {
    let m = launch("k3sbox").await;
    let (vm, shell) = (&m.vm, SshNodeShell::new(m.key.clone()));

    // The doubles, copied over SSH; the install "takes" 2 s so the two runs overlap.
    ok(
        &shell,
        vm,
        "cat > /usr/local/bin/systemctl && chmod 755 /usr/local/bin/systemctl",
        Some(double("systemctl-double")),
    )
    .await;
    ok(
        &shell,
        vm,
        &format!(
            "mkdir -p /opt/gpuprov-test {DOUBLE_ROOT} && cat > {DOUBLE_INSTALLER} && \
             echo 2 > {DOUBLE_ROOT}/install-secs"
        ),
        Some(double("k3s-install-double.sh")),
    )
    .await;

    // Two concurrent first runs: serialised on the installer's flock, k3s installed once
    // (without the lock both would see no k3s during the 2 s install and install it).
    let cfg = config("203.0.113.7");
    let started = Instant::now();
    let (a, b) = tokio::join!(install(&shell, vm, &cfg), install(&shell, vm, &cfg));
    assert_installed(&a);
    assert_installed(&b);
    assert!(started.elapsed() >= Duration::from_secs(2));
    let installers = [&a, &b]
        .iter()
        .filter(|o| o.stderr.contains("installing k3s"))
        .count();
    assert_eq!(installers, 1, "runs:\n{}\n---\n{}", a.stderr, b.stderr);
    assert_eq!(
        take_calls(&shell, vm).await,
        [
            "install-start version=v0.0.0+double",
            "install-end",
            "start k3s"
        ]
    );
    let marker = ok(&shell, vm, &format!("cat {STATUS_PATH}"), None).await;
    assert!(marker.starts_with("state=done\n"), "{marker}");
    assert_eq!(
        ok(&shell, vm, "cat /etc/rancher/k3s/config.yaml", None).await,
        "# Managed by gpuprov (installer.sh); rewritten on every install run.\n\
         write-kubeconfig-mode: \"0600\"\ntls-san:\n  - \"203.0.113.7\"\n  \
         - \"127.0.0.1\"\n  - \"localhost\"\n"
    );

    // Same SAN list: nothing restarts.
    assert_installed(&install(&shell, vm, &cfg).await);
    assert_eq!(take_calls(&shell, vm).await, Vec::<String>::new());
    assert_eq!(
        marker_value(&shell, vm, "restarted").await.as_deref(),
        Some("0")
    );
    assert_eq!(
        marker_value(&shell, vm, "config_changed").await.as_deref(),
        Some("0")
    );

    // Changed SAN list: config rewritten, k3s restarted exactly once.
    assert_installed(&install(&shell, vm, &config("198.51.100.9")).await);
    assert_eq!(take_calls(&shell, vm).await, ["restart k3s"]);
    assert_eq!(
        marker_value(&shell, vm, "restarted").await.as_deref(),
        Some("1")
    );
    assert_eq!(
        marker_value(&shell, vm, "state").await.as_deref(),
        Some("done")
    );
    let k3s_config = ok(&shell, vm, "cat /etc/rancher/k3s/config.yaml", None).await;
    assert!(
        k3s_config.contains("  - \"198.51.100.9\"\n"),
        "{k3s_config}"
    );
    assert!(!k3s_config.contains("203.0.113.7"), "{k3s_config}");

    // The boot probe over SSH: marker done, k3s active (systemctl double), no GPU, and
    // the image has no cloud-init.
    let out = ok(&shell, vm, &probe::command(), None).await;
    let p = BootProbe::parse(&out);
    assert_eq!(p.marker, Marker::Done, "{out}");
    assert_eq!(p.k3s, K3sUnit::Active, "{out}");
    assert_eq!(p.gpu, GpuState::NoNvidiaSmi, "{out}");
    assert_eq!(p.cloud_init, CloudInit::NotInstalled, "{out}");

    // The kubeconfig the (double) k3s wrote: root-only, and usable by from_k3s.
    assert_eq!(
        ok(&shell, vm, "stat -c %a /etc/rancher/k3s/k3s.yaml", None)
            .await
            .trim(),
        "600"
    );
    let text = ok(&shell, vm, &read_kubeconfig_command(&vm.user), None).await;
    assert!(text.starts_with("# TEST DOUBLE"), "{text}");
    let k =
        Kubeconfig::from_k3s(&text, "k3sbox", &ApiAccess::SshTunnel { local_port: 16443 }).unwrap();
    assert_eq!(k.clusters[0].cluster.server, "https://127.0.0.1:16443");
    assert_eq!(k.current_context.as_deref(), Some("gpuprov-k3sbox"));
}

/// Reads the first line served on 127.0.0.1:`port` (bounded).
fn first_line(port: u16) -> std::io::Result<String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    Ok(line)
}

/// Whether 127.0.0.1:`port` still accepts connections, allowing the OS up to 2 s to
/// tear the listener down.
fn still_listening(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err() {
            return false;
        }
        if Instant::now() >= deadline {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnel_forwards_to_sshd_and_closes_on_drop() {
    if skip("tunnel_forwards_to_sshd_and_closes_on_drop") {
        return;
    }
    tokio::time::timeout(TEST_TIMEOUT, async {
        let m = launch("tunnelbox").await;

        // A port we let the tunnel pick: sshd's own banner comes through it.
        let t = Tunnel::open(&m.vm, &m.key, None, 22).await.unwrap();
        let port = t.local_port();
        assert_ne!(port, 0);
        assert_eq!(t.remote_port(), 22);
        let banner = tokio::task::spawn_blocking(move || first_line(port))
            .await
            .unwrap()
            .unwrap();
        assert!(banner.starts_with("SSH-2.0-"), "{banner:?}");
        drop(t);
        let closed = tokio::task::spawn_blocking(move || !still_listening(port));
        assert!(
            closed.await.unwrap(),
            "127.0.0.1:{port} still open after drop"
        );

        // A port we choose.
        let chosen = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut t = Tunnel::open(&m.vm, &m.key, Some(chosen), 22).await.unwrap();
        assert_eq!(t.local_port(), chosen);
        let banner = tokio::task::spawn_blocking(move || first_line(chosen))
            .await
            .unwrap()
            .unwrap();
        assert!(banner.starts_with("SSH-2.0-"), "{banner:?}");

        // A second tunnel on a port that is taken fails without starting ssh.
        let e = Tunnel::open(&m.vm, &m.key, Some(chosen), 22)
            .await
            .unwrap_err();
        assert!(
            matches!(e, TunnelError::LocalPortInUse { port, .. } if port == chosen),
            "{e}"
        );

        // `wait` returns once ssh is gone: remove the machine under the tunnel.
        drop(m);
        let status = tokio::time::timeout(Duration::from_secs(15), t.wait())
            .await
            .expect("ssh did not exit after the machine was removed")
            .unwrap();
        assert!(!status.success(), "{status}");
    })
    .await
    .expect("the tunnel scenario did not finish within its time bound");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_pinned_host_key_is_refused() {
    if skip("wrong_pinned_host_key_is_refused") {
        return;
    }
    tokio::time::timeout(TEST_TIMEOUT, async {
        let m = launch("impostor").await;
        // Another ed25519 key (same type as the server's, so OpenSSH compares them).
        let other_dir = tempfile::tempdir().unwrap();
        let other = ensure_project_key(other_dir.path(), "not-the-host").unwrap();
        let mut vm = m.vm.clone();
        vm.host_key = HostKey::from_public_key_line(&other.public_key_openssh).unwrap();
        assert_ne!(vm.host_key, m.vm.host_key);

        let e = Tunnel::open(&vm, &m.key, None, 22).await.unwrap_err();
        match &e {
            TunnelError::HostKeyRefused { pinned, stderr, .. } => {
                assert_eq!(pinned, &vm.host_key.fingerprint);
                assert!(stderr.contains("Host key verification failed"), "{stderr}");
            }
            other => panic!("expected HostKeyRefused, got {other:?}"),
        }
        assert!(
            e.to_string().contains("refused the server's host key"),
            "{e}"
        );
        let help = miette::Diagnostic::help(&e).map(|h| h.to_string());
        assert!(help.is_some_and(|h| h.contains("never trusts a new key")));

        // The libssh2 route refuses the same pin before authenticating.
        let err = SshNodeShell::new(m.key.clone())
            .run(&vm, "true", None)
            .await
            .unwrap_err();
        assert!(matches!(err, SshError::HostKeyMismatch { .. }), "{err}");
    })
    .await
    .expect("the host key scenario did not finish within its time bound");
}
