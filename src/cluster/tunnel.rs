//! An SSH local port forward to a VM with the system OpenSSH client: what reaches a k3s
//! API that listens on the VM's loopback only (design 4.5, "access path").
//!
//! [`Tunnel::open`] runs
//! `ssh -N -L 127.0.0.1:LOCAL:127.0.0.1:REMOTE -p PORT -- user@host` with the project key
//! and a private known_hosts file that holds only the VM's pinned host key:
//!
//! - `StrictHostKeyChecking=yes`, `UserKnownHostsFile=<that file>`,
//!   `GlobalKnownHostsFile=/dev/null` and `HostKeyAlias`: OpenSSH accepts exactly the
//!   pinned key and never learns a new one; there is no switch to relax this;
//! - `IdentitiesOnly=yes -i <project key>` and `BatchMode=yes`: only the project key,
//!   never a password or passphrase prompt;
//! - `ExitOnForwardFailure=yes`: ssh exits instead of running without the forward;
//! - `-F none`: the user's and the system's ssh config are not read, so nothing there
//!   (a `ProxyCommand`, a `Host *` block) changes what the tunnel does.
//!
//! The forward listens on 127.0.0.1 only. ssh runs until [`Tunnel`] is dropped (it is
//! killed and reaped then) or it exits on its own ([`Tunnel::wait`]).

use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::ssh::{render_known_hosts, HostKey, ProjectKey, SshConfigEntry};
use crate::vm::VmRecord;

/// How long [`Tunnel::open`] waits for the forward to accept connections.
pub const DEFAULT_OPEN_TIMEOUT: Duration = Duration::from_secs(30);

/// The OpenSSH client run for tunnels (looked up on `PATH`).
pub const SSH_PROGRAM: &str = "ssh";

/// The name the VM's host key is recorded under in the tunnel's known_hosts file
/// (`HostKeyAlias`), so the lookup never depends on the address or port.
const HOST_KEY_ALIAS: &str = "gpuprov-tunnel";

/// How much of ssh's stderr is kept for error messages (the tail).
const STDERR_KEEP: usize = 16 * 1024;

/// Attempts with a fresh port when the caller let us pick one and another process took
/// it between our check and ssh's bind.
const AUTO_PORT_ATTEMPTS: usize = 3;

/// Why a tunnel could not be opened or waited for. Every variant that comes from ssh
/// carries the tail of its stderr.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum TunnelError {
    /// The VM record cannot be turned into a safe ssh command line, or the local files
    /// could not be prepared.
    #[error("cannot open a tunnel to {endpoint}: {msg}")]
    #[diagnostic(
        code(gpuprov::tunnel::setup),
        help("the machine record or the local temporary directory is unusable; `gpuprov status` shows the record")
    )]
    Setup { endpoint: String, msg: String },

    /// The OpenSSH client could not be started.
    #[error("cannot run `{program}` for the tunnel: {msg}")]
    #[diagnostic(
        code(gpuprov::tunnel::no_ssh),
        help("install the OpenSSH client (`apt-get install openssh-client`, or your OS's equivalent) and make sure `ssh` is on PATH")
    )]
    Spawn { program: String, msg: String },

    /// The local port asked for is taken.
    #[error("local port 127.0.0.1:{port} is already in use: {msg}")]
    #[diagnostic(
        code(gpuprov::tunnel::port_in_use),
        help("pick another local port, or let gpuprov choose a free one")
    )]
    LocalPortInUse { port: u16, msg: String },

    /// The server's host key is not the pinned one: refused, never retried.
    #[error(
        "ssh to {endpoint} refused the server's host key: it is not the key pinned on first \
         login ({pinned}); ssh said:\n{stderr}"
    )]
    #[diagnostic(
        code(gpuprov::tunnel::host_key),
        help("the machine answering at this address is not the one gpuprov set up (possible man-in-the-middle, or the machine was replaced outside gpuprov); gpuprov never trusts a new key: check the address, or destroy and re-create the machine")
    )]
    HostKeyRefused {
        endpoint: String,
        pinned: String,
        stderr: String,
    },

    /// The server refused the project key.
    #[error("ssh to {endpoint} refused the project key {key}; ssh said:\n{stderr}")]
    #[diagnostic(
        code(gpuprov::tunnel::auth),
        help("the machine does not trust this project's key (another project's machine, or authorized_keys was changed); `gpuprov ssh NAME` shows whether a plain login works")
    )]
    AuthRejected {
        endpoint: String,
        key: String,
        stderr: String,
    },

    /// ssh exited before the forward accepted connections, for another reason.
    #[error("ssh to {endpoint} exited ({status}) before the tunnel was up; ssh said:\n{stderr}")]
    #[diagnostic(
        code(gpuprov::tunnel::exited),
        help("check that the machine is up and reachable (`gpuprov status`, `gpuprov ssh NAME`)")
    )]
    Exited {
        endpoint: String,
        status: String,
        stderr: String,
    },

    /// The forward did not accept connections in time (ssh was killed).
    #[error(
        "the tunnel to {endpoint} did not accept connections on 127.0.0.1:{local_port} within \
         {secs}s; ssh said:\n{stderr}"
    )]
    #[diagnostic(
        code(gpuprov::tunnel::timeout),
        help("the machine may be slow to answer or unreachable; try again, or check it with `gpuprov ssh NAME`")
    )]
    Timeout {
        endpoint: String,
        local_port: u16,
        secs: u64,
        stderr: String,
    },

    /// Waiting for ssh failed locally.
    #[error("cannot wait for the tunnel's ssh process: {0}")]
    #[diagnostic(code(gpuprov::tunnel::io))]
    Io(String),
}

/// A running `ssh -N -L` forward from `127.0.0.1:local_port` to `127.0.0.1:remote_port`
/// on the VM. Dropping it kills ssh (and so closes the forward) and removes its
/// temporary known_hosts file.
#[derive(Debug)]
pub struct Tunnel {
    child: Option<Child>,
    local_port: u16,
    remote_port: u16,
    stderr: Arc<Mutex<Vec<u8>>>,
    dir: PathBuf,
}

impl Tunnel {
    /// Opens the forward with [`DEFAULT_OPEN_TIMEOUT`]; see [`Tunnel::open_with_timeout`].
    ///
    /// Errors: see [`Tunnel::open_with_timeout`].
    pub async fn open(
        vm: &VmRecord,
        key: &ProjectKey,
        local_port: Option<u16>,
        remote_port: u16,
    ) -> Result<Tunnel, TunnelError> {
        Self::open_with_timeout(vm, key, local_port, remote_port, DEFAULT_OPEN_TIMEOUT).await
    }

    /// Starts ssh forwarding `127.0.0.1:local_port` (a free port when `None`) to
    /// `127.0.0.1:remote_port` on `vm`, logging in as `vm.user` at `vm.ssh` with `key`
    /// and accepting only `vm.host_key`. Returns once the local port accepts TCP
    /// connections, waiting at most `timeout`.
    ///
    /// The readiness check connects once to the local port, which makes ssh open (and at
    /// once close) one connection to the remote port.
    ///
    /// Errors: [`TunnelError::Setup`] (user, host or key paths ssh cannot take safely, a
    /// pinned host key that is not a key, the temporary known_hosts file cannot be
    /// written); [`TunnelError::Spawn`] (no `ssh`); [`TunnelError::LocalPortInUse`]
    /// (`local_port` is taken; a port we picked is retried a few times first);
    /// [`TunnelError::HostKeyRefused`]; [`TunnelError::AuthRejected`];
    /// [`TunnelError::Exited`] (unreachable and everything else ssh gives up on);
    /// [`TunnelError::Timeout`].
    pub async fn open_with_timeout(
        vm: &VmRecord,
        key: &ProjectKey,
        local_port: Option<u16>,
        remote_port: u16,
        timeout: Duration,
    ) -> Result<Tunnel, TunnelError> {
        let endpoint = format!("{}@{}:{}", vm.user, vm.ssh.host, vm.ssh.port);
        let setup = |msg: String| TunnelError::Setup {
            endpoint: endpoint.clone(),
            msg,
        };
        check_word("user", &vm.user).map_err(setup)?;
        check_word("host", &vm.ssh.host).map_err(setup)?;
        // A key held in memory or by the agent gets a temporary file for as long as `key`.
        let identity_path = key.openssh_identity().map_err(|e| setup(e.to_string()))?;
        let identity = ssh_path(&identity_path, "project key path").map_err(setup)?;
        let pinned = vm
            .host_key
            .blob()
            .filter(|b| !b.is_empty())
            .map(|b| HostKey::from_blob(&b))
            .ok_or_else(|| setup("the pinned host key is not valid base64".into()))?;

        let dir = private_temp_dir().map_err(setup)?;
        // From here on `tunnel` owns `dir` (and later the child): an early return cleans up.
        let mut tunnel = Tunnel {
            child: None,
            local_port: 0,
            remote_port,
            stderr: Arc::new(Mutex::new(Vec::new())),
            dir,
        };
        let known_hosts = tunnel.dir.join("known_hosts");
        let line = render_known_hosts(&[SshConfigEntry {
            host_alias: HOST_KEY_ALIAS.into(),
            other_aliases: vec![],
            hostname: vm.ssh.host.clone(),
            port: vm.ssh.port,
            user: vm.user.clone(),
            identity_file: identity_path.clone(),
            host_key: pinned.clone(),
        }]);
        std::fs::write(&known_hosts, line)
            .map_err(|e| setup(format!("cannot write {}: {e}", known_hosts.display())))?;
        let known_hosts = ssh_path(&known_hosts, "temporary directory").map_err(setup)?;

        let attempts = if local_port.is_some() {
            1
        } else {
            AUTO_PORT_ATTEMPTS
        };
        let deadline = Instant::now() + timeout;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = match local_port {
                Some(p) => {
                    // Someone else listening there would answer our readiness check.
                    TcpListener::bind((Ipv4Addr::LOCALHOST, p)).map_err(|e| {
                        TunnelError::LocalPortInUse {
                            port: p,
                            msg: e.to_string(),
                        }
                    })?;
                    p
                }
                None => free_port().map_err(|e| setup(format!("no free local port: {e}")))?,
            };
            tunnel.local_port = port;
            tunnel.stderr = Arc::new(Mutex::new(Vec::new()));
            let args = ssh_args(vm, &identity, &known_hosts, port, remote_port);
            let mut child = Command::new(SSH_PROGRAM)
                .args(&args)
                // The key's text (if it came from the environment) stays with gpuprov.
                .env_remove(crate::ssh::supply::ENV_PRIVATE_KEY)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| TunnelError::Spawn {
                    program: SSH_PROGRAM.into(),
                    msg: e.to_string(),
                })?;
            let reader = child.stderr.take().map(|s| collect_tail(s, &tunnel.stderr));
            tunnel.child = Some(child);
            let outcome = tunnel.wait_ready(deadline).await?;
            if outcome == Ready::Up {
                return Ok(tunnel);
            }
            // ssh exited or was killed: its stderr is complete once the reader saw EOF.
            if let Some(r) = reader {
                let _ = r.join();
            }
            let stderr = tunnel.stderr();
            let e = match outcome {
                Ready::Exited(status) => classify_exit(
                    endpoint.clone(),
                    status,
                    stderr,
                    &pinned.fingerprint,
                    &key.origin(),
                    port,
                ),
                _ => TunnelError::Timeout {
                    endpoint: endpoint.clone(),
                    local_port: port,
                    secs: timeout.as_secs(),
                    stderr,
                },
            };
            let retry = matches!(e, TunnelError::LocalPortInUse { .. })
                && attempt < attempts
                && Instant::now() < deadline;
            if !retry {
                return Err(e);
            }
            tunnel.child = None;
        }
    }

    /// The local port the forward listens on (on 127.0.0.1).
    pub fn local_port(&self) -> u16 {
        self.local_port
    }

    /// The VM port the forward leads to (on the VM's 127.0.0.1).
    pub fn remote_port(&self) -> u16 {
        self.remote_port
    }

    /// What ssh has written to stderr so far (the last 16 KiB).
    pub fn stderr(&self) -> String {
        tail_text(&self.stderr)
    }

    /// Waits until ssh exits (the connection dropped, or it was killed) and returns its
    /// exit status. Returns at once if it already exited.
    ///
    /// Errors: [`TunnelError::Io`] when the process cannot be waited for.
    pub async fn wait(&mut self) -> Result<ExitStatus, TunnelError> {
        let Some(child) = self.child.as_mut() else {
            return Err(TunnelError::Io("the tunnel has no ssh process".into()));
        };
        loop {
            if let Some(status) = child
                .try_wait()
                .map_err(|e| TunnelError::Io(e.to_string()))?
            {
                return Ok(status);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Polls until the local port accepts a connection, ssh exits, or `deadline` (ssh is
    /// killed then).
    async fn wait_ready(&mut self, deadline: Instant) -> Result<Ready, TunnelError> {
        let port = self.local_port;
        loop {
            let child = self.child.as_mut().expect("child set before wait_ready");
            if let Some(status) = child
                .try_wait()
                .map_err(|e| TunnelError::Io(e.to_string()))?
            {
                return Ok(Ready::Exited(status.to_string()));
            }
            let up = tokio::task::spawn_blocking(move || {
                let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
                TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
            })
            .await
            .unwrap_or(false);
            if up {
                return Ok(Ready::Up);
            }
            if Instant::now() >= deadline {
                self.kill();
                return Ok(Ready::TimedOut);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn kill(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How waiting for the forward ended.
#[derive(Debug, PartialEq, Eq)]
enum Ready {
    Up,
    /// ssh exited with this status.
    Exited(String),
    TimedOut,
}

/// Sorts an ssh exit before the forward was up by the messages OpenSSH prints.
fn classify_exit(
    endpoint: String,
    status: String,
    stderr: String,
    pinned: &str,
    key: &str,
    local_port: u16,
) -> TunnelError {
    let has = |s: &str| stderr.contains(s);
    if has("Host key verification failed")
        || has("REMOTE HOST IDENTIFICATION HAS CHANGED")
        || has("host key is known for")
    {
        TunnelError::HostKeyRefused {
            endpoint,
            pinned: pinned.to_string(),
            stderr,
        }
    } else if has("Permission denied") {
        TunnelError::AuthRejected {
            endpoint,
            key: key.to_string(),
            stderr,
        }
    } else if has("Address already in use")
        || has("cannot listen to port")
        || has("Could not request local forwarding")
    {
        TunnelError::LocalPortInUse {
            port: local_port,
            msg: stderr,
        }
    } else {
        TunnelError::Exited {
            endpoint,
            status,
            stderr,
        }
    }
}

/// The ssh command line (without the program name).
fn ssh_args(
    vm: &VmRecord,
    identity: &str,
    known_hosts: &str,
    local_port: u16,
    remote_port: u16,
) -> Vec<String> {
    let mut args: Vec<String> = vec!["-N".into(), "-F".into(), "none".into()];
    for opt in [
        "ExitOnForwardFailure=yes".to_string(),
        "StrictHostKeyChecking=yes".to_string(),
        format!("UserKnownHostsFile=\"{known_hosts}\""),
        "GlobalKnownHostsFile=/dev/null".to_string(),
        format!("HostKeyAlias={HOST_KEY_ALIAS}"),
        "UpdateHostKeys=no".to_string(),
        "CheckHostIP=no".to_string(),
        "IdentitiesOnly=yes".to_string(),
        "BatchMode=yes".to_string(),
        "ConnectTimeout=15".to_string(),
        "ServerAliveInterval=15".to_string(),
        "ServerAliveCountMax=3".to_string(),
    ] {
        args.push("-o".into());
        args.push(opt);
    }
    args.extend([
        "-i".into(),
        identity.to_string(),
        "-L".into(),
        format!("127.0.0.1:{local_port}:127.0.0.1:{remote_port}"),
        "-p".into(),
        vm.ssh.port.to_string(),
        "--".into(),
        format!("{}@{}", vm.user, vm.ssh.host),
    ]);
    args
}

/// A user or host name ssh takes as one word that cannot be read as an option.
fn check_word(what: &str, v: &str) -> Result<(), String> {
    if v.is_empty()
        || v.starts_with('-')
        || v.chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '@' || c == '"')
    {
        return Err(format!("invalid {what} {v:?}"));
    }
    Ok(())
}

/// A path as ssh reads it after `-i` or inside a quoted `-o` value: `%` doubled
/// (OpenSSH expands `%` tokens in both); `"` and control characters are refused.
fn ssh_path(p: &Path, what: &str) -> Result<String, String> {
    let s = p
        .to_str()
        .ok_or_else(|| format!("{what} {} is not UTF-8", p.display()))?;
    if s.chars().any(|c| c == '"' || c.is_control()) {
        return Err(format!(
            "{what} {s:?} contains a quote or control character, which ssh cannot take"
        ));
    }
    Ok(s.replace('%', "%%"))
}

/// A new directory only we can read, for the tunnel's known_hosts file.
fn private_temp_dir() -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("gpuprov-tunnel-{}", uuid::Uuid::new_v4()));
    std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
        .create(&dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    Ok(dir)
}

/// A loopback port free right now (released before ssh binds it; a race with other
/// processes is possible and handled by retrying).
fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

/// Reads `from` until EOF on a thread, keeping the last [`STDERR_KEEP`] bytes in `into`
/// (ssh keeps writing, e.g. one line per refused remote connection, and must never block
/// on a full pipe).
fn collect_tail(
    mut from: impl Read + Send + 'static,
    into: &Arc<Mutex<Vec<u8>>>,
) -> std::thread::JoinHandle<()> {
    let into = Arc::clone(into);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let mut kept = into.lock().unwrap_or_else(|p| p.into_inner());
                    kept.extend_from_slice(&buf[..n]);
                    if kept.len() > STDERR_KEEP {
                        let cut = kept.len() - STDERR_KEEP;
                        kept.drain(..cut);
                    }
                }
            }
        }
    })
}

fn tail_text(buf: &Arc<Mutex<Vec<u8>>>) -> String {
    let kept = buf.lock().unwrap_or_else(|p| p.into_inner());
    String::from_utf8_lossy(&kept).trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{Location, Offer, SshEndpoint};

    fn vm(user: &str, host: &str) -> VmRecord {
        let offer: Offer = serde_json::from_value(serde_json::json!({
            "id": "o", "location": {"cloud": "docker", "region": "local"},
            "instance_type": "container", "gpu": null, "gpu_count": 0, "spot": false,
            "price_per_hour": 0.0
        }))
        .unwrap();
        VmRecord {
            instance_id: "i".into(),
            location: Location {
                cloud: "docker".into(),
                region: "local".into(),
                zone: None,
            },
            offer,
            ssh: SshEndpoint {
                host: host.into(),
                port: 2222,
                user: None,
            },
            user: user.into(),
            host_key: HostKey::from_public_key_line(
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIP1aKkTwWv+35tVLGntrswkcNoa9s8je2SaiXHbxFOTP",
            )
            .unwrap(),
            ready_at: chrono::Utc::now(),
            preemptions: vec![],
        }
    }

    #[test]
    fn command_line_pins_the_host_key_and_forwards_loopback_only() {
        let args = ssh_args(&vm("root", "127.0.0.1"), "/k/100%%/id", "/t/kh", 4000, 6443);
        let joined = args.join(" ");
        for needle in [
            "-N -F none",
            "-o StrictHostKeyChecking=yes",
            "-o UserKnownHostsFile=\"/t/kh\"",
            "-o GlobalKnownHostsFile=/dev/null",
            "-o HostKeyAlias=gpuprov-tunnel",
            "-o ExitOnForwardFailure=yes",
            "-o IdentitiesOnly=yes",
            "-o BatchMode=yes",
            "-i /k/100%%/id",
            "-L 127.0.0.1:4000:127.0.0.1:6443",
            "-p 2222 -- root@127.0.0.1",
        ] {
            assert!(joined.contains(needle), "{needle} missing from {joined}");
        }
        assert!(!joined.to_lowercase().contains("stricthostkeychecking=no"));
        assert_eq!(args.last().map(String::as_str), Some("root@127.0.0.1"));
    }

    #[test]
    fn unsafe_users_hosts_and_paths_are_refused() {
        assert!(check_word("user", "root").is_ok());
        for bad in ["", "-oProxyCommand=x", "a b", "a@b", "x\ny", "q\""] {
            assert!(check_word("user", bad).is_err(), "{bad:?}");
        }
        assert_eq!(ssh_path(Path::new("/a/50%/k"), "p").unwrap(), "/a/50%%/k");
        assert!(ssh_path(Path::new("/a/\"k"), "p").is_err());
        assert!(ssh_path(Path::new("/a/\nk"), "p").is_err());
    }

    #[test]
    fn exits_are_classified_by_what_ssh_printed() {
        let c = |s: &str| classify_exit("e".into(), "exit 255".into(), s.into(), "fp", "k", 1);
        assert!(matches!(
            c("@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@\nHost key verification failed."),
            TunnelError::HostKeyRefused { .. }
        ));
        assert!(matches!(
            c("root@127.0.0.1: Permission denied (publickey)."),
            TunnelError::AuthRejected { .. }
        ));
        assert!(matches!(
            c("bind [127.0.0.1]:1: Address already in use\nCould not request local forwarding."),
            TunnelError::LocalPortInUse { .. }
        ));
        assert!(matches!(
            c("ssh: connect to host 127.0.0.1 port 1: Connection refused"),
            TunnelError::Exited { .. }
        ));
    }

    #[tokio::test]
    async fn a_bad_pinned_key_fails_before_running_ssh() {
        let mut v = vm("root", "127.0.0.1");
        v.host_key.key_base64 = "not base64!".into();
        let key = ProjectKey::from_file("/nonexistent/id", "");
        let e = Tunnel::open(&v, &key, None, 22).await.unwrap_err();
        assert!(matches!(e, TunnelError::Setup { .. }), "{e}");
        let e = Tunnel::open(&vm("-oProxyCommand=x", "h"), &key, None, 22)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("invalid user"), "{e}");
    }
}
