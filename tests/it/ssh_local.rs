//! Real logins against a throwaway OpenSSH server on 127.0.0.1.
//!
//! Needs the `openssh-server` package (which brings `openssh-client`: `ssh`, `ssh-keygen`).
//! Without it these tests FAIL on purpose, so a CI image missing the package cannot turn
//! them into silent passes. Each test starts its own `sshd -D -e` on a free loopback port,
//! with a temporary host key and an `AuthorizedKeysFile` holding only the test's project
//! key, and kills it when done (even on panic).

use std::fs;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::openssh::{keygen, keygen_p521_short_scalar, Agent};
use gpuprov::provider::redact::Secret;
use gpuprov::provider::SshEndpoint;
use gpuprov::ssh::supply::{resolve, KeyRequest, KeySupply};
use gpuprov::ssh::{
    ensure_project_key, exec, write_ssh_files, Connector, ExecIo, HostKey, KeySource, ProjectKey,
    Ssh2Connector, SshConfigEntry, SshError, SshIdentity,
};

const SSHD: &str = "/usr/sbin/sshd";

/// A running sshd; killed and reaped on drop so no server outlives its test.
struct Sshd {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Sshd {
    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

fn require_openssh() {
    for tool in [SSHD, "/usr/bin/ssh-keygen", "/usr/bin/ssh"] {
        assert!(
            Path::new(tool).exists(),
            "{tool} not found: these tests need a real OpenSSH server and client; install \
             them with `apt-get install -y openssh-server` (CI installs it)"
        );
    }
}

/// A loopback port nobody listens on right now (the OS picked it free; released before
/// use, so there is a small race with other processes, acceptable in tests).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn current_user() -> String {
    let out = Command::new("id").arg("-un").output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Starts sshd on 127.0.0.1 only, with `host_key_dir/id_ed25519` as its only host key
/// and `authorized` as the authorized keys.
fn start_sshd(work: &Path, host_key: &ProjectKey, authorized: &ProjectKey) -> Sshd {
    require_openssh();
    // sshd refuses to start without its privilege separation directory, which a package
    // install in a container without systemd does not create.
    fs::create_dir_all("/run/sshd").expect("create /run/sshd (tests expect to run as root)");
    let authorized_keys = work.join("authorized_keys");
    fs::write(
        &authorized_keys,
        format!("{}\n", authorized.public_key_openssh),
    )
    .unwrap();
    let port = free_port();
    let config = work.join("sshd_config");
    fs::write(
        &config,
        format!(
            "Port {port}\n\
             ListenAddress 127.0.0.1\n\
             HostKey \"{host_key}\"\n\
             AuthorizedKeysFile \"{authorized_keys}\"\n\
             PidFile \"{pid}\"\n\
             StrictModes no\n\
             PermitRootLogin prohibit-password\n\
             PubkeyAuthentication yes\n\
             PasswordAuthentication no\n\
             KbdInteractiveAuthentication no\n\
             UsePAM no\n\
             LogLevel VERBOSE\n",
            host_key = host_key.private_key_path().unwrap().display(),
            authorized_keys = authorized_keys.display(),
            pid = work.join("sshd.pid").display(),
        ),
    )
    .unwrap();
    let log = work.join("sshd.log");
    let child = Command::new(SSHD)
        .args(["-D", "-e", "-f"])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .expect("start sshd");
    let mut sshd = Sshd { child, port, log };
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(status) = sshd.child.try_wait().unwrap() {
            panic!("sshd exited early ({status}):\n{}", sshd.log());
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sshd did not listen in time:\n{}",
            sshd.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    sshd
}

fn endpoint(port: u16) -> SshEndpoint {
    SshEndpoint {
        host: "127.0.0.1".into(),
        port,
        user: None,
    }
}

fn host_key_of(key: &ProjectKey) -> HostKey {
    HostKey::from_public_key_line(&key.public_key_openssh).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_sshd_login_exec_and_host_key_pinning() {
    require_openssh();
    let tmp = tempfile::tempdir().unwrap();
    let project = ensure_project_key(&tmp.path().join("project"), "gpuprov-test").unwrap();
    let host = ensure_project_key(&tmp.path().join("host"), "host").unwrap();
    let sshd = start_sshd(tmp.path(), &host, &project);
    let ep = endpoint(sshd.port);
    let user = current_user();
    let expected = host_key_of(&host);

    // Our fingerprint is the one ssh-keygen prints for the server's key.
    let keygen = Command::new("ssh-keygen")
        .args(["-l", "-E", "sha256", "-f"])
        .arg(host.private_key_path().unwrap().with_extension("pub"))
        .output()
        .unwrap();
    let keygen = String::from_utf8(keygen.stdout).unwrap();
    assert_eq!(
        keygen.split_whitespace().nth(1),
        Some(expected.fingerprint.as_str()),
        "{keygen}"
    );

    // First login: nothing pinned, the server's key is returned for pinning.
    let connector = Ssh2Connector::new(project.clone(), Duration::from_secs(10));
    let seen = connector
        .login(&ep, &user, None)
        .await
        .unwrap_or_else(|e| panic!("login failed: {e}\nsshd log:\n{}", sshd.log()));
    assert_eq!(seen, expected);
    assert_eq!(seen.algorithm, "ssh-ed25519");

    // Later login with the pin.
    assert_eq!(
        connector.login(&ep, &user, Some(&seen)).await.unwrap(),
        expected
    );

    // exec: output of both streams and the exit status come back.
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let status = exec(
        &ep,
        &user,
        &project,
        &seen,
        "echo hello; echo oops >&2; exit 3",
        ExecIo {
            stdin: None,
            stdout: &mut out,
            stderr: &mut err,
        },
    )
    .unwrap();
    assert_eq!(status, 3);
    assert_eq!(String::from_utf8(out).unwrap(), "hello\n");
    assert_eq!(String::from_utf8(err).unwrap(), "oops\n");

    // Large output on both streams at once is delivered completely.
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let status = exec(
        &ep,
        &user,
        &project,
        &seen,
        "head -c 3000000 /dev/zero; head -c 2000000 /dev/zero >&2",
        ExecIo {
            stdin: None,
            stdout: &mut out,
            stderr: &mut err,
        },
    )
    .unwrap();
    assert_eq!((status, out.len(), err.len()), (0, 3_000_000, 2_000_000));

    // A command killed by a signal reports 128 + signal, like a shell.
    let status = exec(
        &ep,
        &user,
        &project,
        &seen,
        "kill -KILL $$",
        ExecIo {
            stdin: None,
            stdout: &mut Vec::new(),
            stderr: &mut Vec::new(),
        },
    );
    assert_eq!(status.unwrap(), 137);

    // Wrong pin: refused by login and by exec, and exec's command never runs.
    let auth_lines_before = publickey_lines(&sshd.log());
    let other = ensure_project_key(&tmp.path().join("other"), "other").unwrap();
    let wrong = host_key_of(&other);
    match connector.login(&ep, &user, Some(&wrong)).await {
        Err(SshError::HostKeyMismatch {
            expected: e, got, ..
        }) => {
            assert_eq!(e, wrong.fingerprint);
            assert_eq!(got, expected.fingerprint);
        }
        r => panic!("expected HostKeyMismatch, got {r:?}"),
    }
    let marker = tmp.path().join("marker");
    let cmd = format!("touch {}", marker.display());
    let r = exec(
        &ep,
        &user,
        &project,
        &wrong,
        &cmd,
        ExecIo {
            stdin: None,
            stdout: &mut Vec::new(),
            stderr: &mut Vec::new(),
        },
    );
    assert!(matches!(r, Err(SshError::HostKeyMismatch { .. })), "{r:?}");
    assert!(!marker.exists(), "command ran despite a host key mismatch");
    // The mismatch is detected before authenticating: sshd never saw the key offered.
    assert_eq!(
        publickey_lines(&sshd.log()),
        auth_lines_before,
        "{}",
        sshd.log()
    );

    // A key the server does not know is rejected as such.
    let stranger = Ssh2Connector::new(other, Duration::from_secs(10));
    let r = stranger.login(&ep, &user, Some(&seen)).await;
    assert!(matches!(r, Err(SshError::AuthRejected { .. })), "{r:?}");

    // Nothing listening: unreachable (the launch machine keeps waiting).
    let dead = endpoint(free_port());
    let r = connector.login(&dead, &user, None).await;
    assert!(matches!(r, Err(SshError::Unreachable { .. })), "{r:?}");
    let r = exec(
        &dead,
        &user,
        &project,
        &seen,
        "true",
        ExecIo {
            stdin: None,
            stdout: &mut Vec::new(),
            stderr: &mut Vec::new(),
        },
    );
    assert!(matches!(r, Err(SshError::Unreachable { .. })), "{r:?}");
}

/// How many public key authentication events sshd logged (VERBOSE logs each offered key,
/// accepted or not).
fn publickey_lines(log: &str) -> usize {
    log.lines().filter(|l| l.contains("publickey")).count()
}

#[test]
fn generated_ssh_config_works_with_the_openssh_client() {
    require_openssh();
    // A space in every path checks the quoting against the real parser.
    let tmp = tempfile::Builder::new()
        .prefix("gpuprov ssh ")
        .tempdir()
        .unwrap();
    let project = ensure_project_key(&tmp.path().join("project keys"), "gpuprov-test").unwrap();
    let host = ensure_project_key(&tmp.path().join("host"), "host").unwrap();
    let sshd = start_sshd(tmp.path(), &host, &project);
    let entry = |host_key: HostKey| SshConfigEntry {
        host_alias: "gpuprov-box".into(),
        other_aliases: vec![],
        hostname: "127.0.0.1".into(),
        port: sshd.port,
        user: current_user(),
        identity_file: project.private_key_path().unwrap().to_path_buf(),
        host_key,
    };
    let run_ssh = |config: &Path| {
        Command::new("ssh")
            .arg("-F")
            .arg(config)
            .args(["-o", "BatchMode=yes", "gpuprov-box", "echo from-$((40+2))"])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };

    let files = tmp.path().join("ssh files");
    let config = write_ssh_files(&files, &[entry(host_key_of(&host))]).unwrap();
    let out = run_ssh(&config);
    assert!(
        out.status.success(),
        "ssh with the generated config failed: {}\nsshd log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        sshd.log()
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from-42\n");

    // With a different pinned key, OpenSSH refuses (StrictHostKeyChecking yes).
    let other = ensure_project_key(&tmp.path().join("other"), "other").unwrap();
    let config = write_ssh_files(&files, &[entry(host_key_of(&other))]).unwrap();
    let out = run_ssh(&config);
    assert_eq!(out.status.code(), Some(255));
    let mut stderr = String::new();
    out.stderr.as_slice().read_to_string(&mut stderr).unwrap();
    assert!(
        stderr.contains("HOST IDENTIFICATION HAS CHANGED"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}

/// A server that accepts TCP but never speaks SSH (a booting machine, a stuck port
/// forward) is unreachable after the connect timeout, not a hang.
#[tokio::test]
async fn silent_server_times_out_as_unreachable() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let ep = endpoint(listener.local_addr().unwrap().port());
    let tmp = tempfile::tempdir().unwrap();
    let key = ensure_project_key(tmp.path(), "t").unwrap();
    let connector = Ssh2Connector::new(key, Duration::from_millis(500));
    let started = Instant::now();
    let r = connector.login(&ep, "root", None).await;
    assert!(matches!(r, Err(SshError::Unreachable { .. })), "{r:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    drop(listener);
}

/// Issue 14: the fingerprint the state records is the one `ssh-keygen -lf` prints, for
/// every key type a user may supply, however it is supplied.
#[test]
fn fingerprints_of_supplied_keys_match_ssh_keygen() {
    require_openssh();
    let tmp = tempfile::tempdir().unwrap();
    for (name, args) in [
        ("ed25519", &["-t", "ed25519"][..]),
        ("ecdsa256", &["-t", "ecdsa", "-b", "256"]),
        ("ecdsa384", &["-t", "ecdsa", "-b", "384"]),
        ("ecdsa521", &["-t", "ecdsa", "-b", "521"]),
        ("rsa2048", &["-t", "rsa", "-b", "2048"]),
        ("ecdsa521-short", &[]),
    ] {
        let (path, fp) = if args.is_empty() {
            keygen_p521_short_scalar(tmp.path(), name)
        } else {
            keygen(tmp.path(), name, args)
        };
        let from_file = ProjectKey::load_file(&path).unwrap();
        let text = Secret::new(fs::read_to_string(&path).unwrap());
        let from_text =
            ProjectKey::from_private_key_text("GPUPROV_SSH_PRIVATE_KEY", &text).unwrap();
        assert_eq!(
            from_file.fingerprint().as_deref(),
            Some(fp.as_str()),
            "{name}"
        );
        assert_eq!(
            from_text.fingerprint().as_deref(),
            Some(fp.as_str()),
            "{name}"
        );
        let id = SshIdentity::of(&from_text).unwrap();
        assert_eq!(id.key_fingerprint, fp, "{name}");
        // The recorded public key is the .pub file's, without its comment.
        let pub_line = fs::read_to_string(path.with_extension("pub")).unwrap();
        let mut words = pub_line.split_whitespace();
        assert_eq!(
            id.public_key,
            format!("{} {}", words.next().unwrap(), words.next().unwrap()),
            "{name}"
        );
    }
}

fn run_true(
    ep: &gpuprov::provider::SshEndpoint,
    key: &ProjectKey,
    pin: &HostKey,
) -> Result<(i32, String), SshError> {
    let mut out = Vec::new();
    let status = exec(
        ep,
        &current_user(),
        key,
        pin,
        "echo logged-in",
        ExecIo {
            stdin: None,
            stdout: &mut out,
            stderr: &mut Vec::new(),
        },
    )?;
    Ok((status, String::from_utf8(out).unwrap()))
}

/// Issue 14: a key supplied as text (kept in memory) or held by the SSH agent logs in
/// through libssh2 (apply's logins, `gpuprov ssh NAME -- CMD`) and through OpenSSH (the
/// generated ssh config, the tunnel) like the project's key file; the text reaches the
/// disk only as a 0600 temporary copy for OpenSSH that goes with the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_from_the_environment_and_the_agent_log_in_like_the_key_file() {
    require_openssh();
    let tmp = tempfile::tempdir().unwrap();
    let host = ensure_project_key(&tmp.path().join("host"), "host").unwrap();
    let user = current_user();
    for (name, args) in [
        ("ed25519", &["-t", "ed25519"][..]),
        ("ecdsa", &["-t", "ecdsa", "-b", "256"]),
        // A short P-521 scalar, which ssh-key cannot decode (the public half then comes
        // from the container): libssh2 must still log in with it.
        ("ecdsa521-short", &[]),
        ("rsa", &["-t", "rsa", "-b", "3072"]),
    ] {
        let work = tmp.path().join(name);
        fs::create_dir_all(&work).unwrap();
        let (path, fp) = if args.is_empty() {
            keygen_p521_short_scalar(&work, "ci_key")
        } else {
            keygen(&work, "ci_key", args)
        };
        let text = fs::read_to_string(&path).unwrap();
        let file_key = ProjectKey::load_file(&path).unwrap();
        let sshd = start_sshd(&work, &host, &file_key);
        let ep = endpoint(sshd.port);
        let pin = host_key_of(&host);

        // In memory: libssh2 gets the text itself.
        let memory = ProjectKey::from_private_key_text(
            "GPUPROV_SSH_PRIVATE_KEY",
            &Secret::new(text.clone()),
        )
        .unwrap();
        let connector = Ssh2Connector::new(memory.clone(), Duration::from_secs(10));
        connector
            .login(&ep, &user, Some(&pin))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}\n{}", sshd.log()));
        assert_eq!(
            run_true(&ep, &memory, &pin).unwrap(),
            (0, "logged-in\n".into()),
            "{name}"
        );

        // OpenSSH with the generated config and the temporary copy.
        let identity = memory.openssh_identity().unwrap();
        let files = work.join("files");
        let config_naming = |identity_file: PathBuf| {
            let entry = SshConfigEntry {
                host_alias: "gpuprov-box".into(),
                other_aliases: vec![],
                hostname: "127.0.0.1".into(),
                port: sshd.port,
                user: user.clone(),
                identity_file,
                host_key: pin.clone(),
            };
            write_ssh_files(&files, &[entry]).unwrap()
        };
        let config = config_naming(identity.clone());
        let ssh = |config: &Path, agent: Option<&Path>| {
            let mut c = Command::new("ssh");
            c.arg("-F").arg(config).args([
                "-o",
                "BatchMode=yes",
                "gpuprov-box",
                "echo via-openssh",
            ]);
            match agent {
                Some(a) => c.env("SSH_AUTH_SOCK", a),
                None => c.env_remove("SSH_AUTH_SOCK"),
            };
            c.stdin(Stdio::null()).output().unwrap()
        };
        let out = ssh(&config, None);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "via-openssh\n");
        drop(connector);
        drop(memory);
        assert!(
            !identity.exists(),
            "{name}: the temporary copy goes with the key"
        );

        // The agent: found by the recorded fingerprint, used by libssh2 and OpenSSH.
        let agent = Agent::start(&work);
        agent.add(&path);
        let recorded = SshIdentity::of(&file_key).unwrap();
        assert_eq!(recorded.key_fingerprint, fp);
        let project_dir = work.join("project");
        let supply = KeySupply {
            agent_socket: Some(agent.socket.clone()),
            ..KeySupply::default()
        };
        let request = KeyRequest {
            recorded: Some(&recorded),
            has_machines: true,
            project_dir: &project_dir,
            comment: "c",
            may_generate: true,
        };
        let in_agent = resolve(&supply, &request).unwrap();
        assert!(
            matches!(in_agent.source(), KeySource::Agent(_)),
            "{in_agent:?}"
        );
        assert_eq!(run_true(&ep, &in_agent, &pin).unwrap().0, 0, "{name}");
        Ssh2Connector::new(in_agent.clone(), Duration::from_secs(10))
            .login(&ep, &user, Some(&pin))
            .await
            .unwrap();
        let pub_file = in_agent
            .config_identity_file(&project_dir)
            .unwrap()
            .unwrap();
        assert!(fs::read_to_string(&pub_file)
            .unwrap()
            .starts_with(&recorded.public_key));
        let config = config_naming(pub_file);
        let out = ssh(&config, Some(&agent.socket));
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Nothing private in the project directory: only the public half.
        for entry in fs::read_dir(&project_dir).unwrap() {
            let text = fs::read_to_string(entry.unwrap().path()).unwrap();
            assert!(!text.contains("PRIVATE KEY"));
        }

        // An agent without the key: not available, and nothing is generated.
        let empty = Agent::start(&work.join("files"));
        let supply = KeySupply {
            agent_socket: Some(empty.socket.clone()),
            ..KeySupply::default()
        };
        let err = resolve(&supply, &request).unwrap_err().to_string();
        assert!(
            err.contains(&fp) && err.contains("does not hold it"),
            "{err}"
        );
        assert!(!project_dir.join("id_ed25519").exists());
    }
}

/// Writes `work/gpuprov.toml` (one Docker machine `api`) and a state of `lineage` where
/// `vm.api` is up at `127.0.0.1:port` with `host_key`.
fn project_with_api_at(work: &Path, lineage: &str, port: u16, host_key: HostKey) {
    use gpuprov::provider::{Location, Offer};
    use gpuprov::state::{MachineRecord, ResourceRecord, StateStore};
    use gpuprov::vm::{LaunchState, VmRecord};
    fs::write(
        work.join("gpuprov.toml"),
        "[vm.api]\nclouds = [\"docker\"]\nkubernetes = false\n",
    )
    .unwrap();
    let (mut store, mut state) = StateStore::open(work.join("gpuprov.state.json")).unwrap();
    state.lineage = lineage.into();
    let location = Location {
        cloud: "docker".into(),
        region: "local".into(),
        zone: None,
    };
    let vm = VmRecord {
        instance_id: format!("c-{port}"),
        location: location.clone(),
        offer: Offer {
            id: "docker/local/container".into(),
            location,
            instance_type: "container".into(),
            gpu: None,
            gpu_count: 0,
            spot: false,
            price_per_hour: 0.0,
            detail: serde_json::Value::Null,
            facts: Default::default(),
        },
        ssh: endpoint(port),
        user: current_user(),
        host_key,
        ready_at: chrono::Utc::now(),
        preemptions: vec![],
    };
    let s = LaunchState::Ready { vm: Box::new(vm) };
    let rec = ResourceRecord::new(MachineRecord {
        kind: "launch".into(),
        state: gpuprov::state::JsonText::encode(&s).unwrap(),
        label: "ready".into(),
        updated_at: chrono::Utc::now(),
    });
    state.resources.insert("vm.api".into(), rec);
    store.save(&mut state).unwrap();
}

/// Issue 19: two projects on one machine each have a machine named `api`. Through the
/// `Include` of their generated configs, the system ssh client reaches each project's own
/// machine by `gpuprov-PROJECT-api`; the short `gpuprov-api` stays with the project that
/// had it first, and the second project is told it is taken.
#[test]
fn two_projects_with_a_machine_of_the_same_name_each_reach_their_own() {
    require_openssh();
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("gpuprov home");
    let key = ensure_project_key(&tmp.path().join("key"), "gpuprov-test").unwrap();
    let mut servers = Vec::new();
    for (i, lineage) in [
        "11111111-1111-4111-8111-111111111111",
        "22222222-2222-4222-8222-222222222222",
    ]
    .into_iter()
    .enumerate()
    {
        let work = tmp.path().join(format!("project {i}"));
        fs::create_dir_all(&work).unwrap();
        let host = ensure_project_key(&work.join("host"), "host").unwrap();
        let sshd = start_sshd(&work, &host, &key);
        project_with_api_at(&work, lineage, sshd.port, host_key_of(&host));
        let out = Command::new(env!("CARGO_BIN_EXE_gpuprov"))
            .current_dir(&work)
            .env("GPUPROV_HOME", &home)
            .env("NO_COLOR", "1")
            .env_remove("GPUPROV_SSH_PRIVATE_KEY")
            .env_remove("SSH_AUTH_SOCK")
            .args(["ssh", "--print-config", "--ssh-key"])
            .arg(key.private_key_path().unwrap())
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        );
        assert!(out.status.success(), "{stdout}{stderr}");
        let project = &lineage[..8];
        if i == 0 {
            assert!(
                stdout.contains(&format!("\nHost gpuprov-{project}-api gpuprov-api\n")),
                "{stdout}"
            );
            assert!(stderr.is_empty(), "{stderr}");
        } else {
            assert!(
                stdout.contains(&format!("\nHost gpuprov-{project}-api\n")),
                "the short alias is the first project's: {stdout}"
            );
            assert!(
                stderr.contains("warning: ssh alias gpuprov-api is taken by another project")
                    && stderr.contains(&format!("`ssh gpuprov-{project}-api`")),
                "{stderr}"
            );
        }
        assert!(stdout.contains("#   Include "), "{stdout}");
        servers.push((project.to_string(), sshd));
    }
    // The user's ~/.ssh/config, as the README says.
    let user_config = tmp.path().join("user ssh config");
    fs::write(
        &user_config,
        format!("Include \"{}/projects/*/ssh_config\"\n", home.display()),
    )
    .unwrap();
    let server_port = |alias: &str| {
        let out = Command::new("ssh")
            .arg("-F")
            .arg(&user_config)
            .args(["-o", "BatchMode=yes", alias, "echo $SSH_CONNECTION"])
            .env_remove("SSH_AUTH_SOCK")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ssh {alias}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // SSH_CONNECTION: client address, client port, server address, server port.
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .nth(3)
            .and_then(|p| p.parse::<u16>().ok())
            .unwrap_or_else(|| panic!("ssh {alias}: {out:?}"))
    };
    for (project, sshd) in &servers {
        assert_eq!(
            server_port(&format!("gpuprov-{project}-api")),
            sshd.port,
            "{project}'s machine: {}",
            sshd.log()
        );
    }
    assert_eq!(server_port("gpuprov-api"), servers[0].1.port);
}
