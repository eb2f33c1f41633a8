//! Logging in and running commands with libssh2 (the `ssh2` crate, blocking).
//!
//! The host key is always checked against the pinned one right after the handshake and
//! BEFORE authenticating, so a man in the middle never sees a signature made with the
//! project key and never receives a command. There is no way to skip the check: the
//! first login (no pin yet) is the only time an unknown key is accepted, and that is the
//! caller's decision ([`Connector::login`] with `pinned = None`).

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use async_trait::async_trait;
use ssh2::{ErrorCode, MethodType, Session};

use super::keys::{KeySource, ProjectKey};
use super::{Connector, HostKey, SshError};
use crate::provider::SshEndpoint;

/// Bound on TCP connect, handshake and authentication used by [`exec`]; a server that
/// takes longer than this is treated as not reachable.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Host key algorithms in the order we ask for them. Fixed so that repeated logins to the
/// same server see the same key type (a pin only matches its own type); ed25519 first
/// because it is what images generate by default and what the known_hosts file we write
/// for OpenSSH records.
const HOST_KEY_ALGORITHMS: &[&str] = &[
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "rsa-sha2-512",
    "rsa-sha2-256",
    "ssh-rsa",
];

/// [`Connector`] over libssh2: logs in with the project key and pins host keys.
#[derive(Debug, Clone)]
pub struct Ssh2Connector {
    key: ProjectKey,
    connect_timeout: Duration,
}

impl Ssh2Connector {
    /// `connect_timeout` bounds the TCP connect (per resolved address) and then each
    /// blocking step of the handshake and authentication, so one login attempt takes at
    /// most a small multiple of it. Zero is treated as one millisecond, never as "no
    /// timeout".
    pub fn new(key: ProjectKey, connect_timeout: Duration) -> Self {
        Ssh2Connector {
            key,
            connect_timeout,
        }
    }

    /// The project key this connector logs in with.
    pub fn key(&self) -> &ProjectKey {
        &self.key
    }
}

#[async_trait]
impl Connector for Ssh2Connector {
    async fn login(
        &self,
        endpoint: &SshEndpoint,
        user: &str,
        pinned: Option<&HostKey>,
    ) -> Result<HostKey, SshError> {
        let (endpoint, user, pinned) = (endpoint.clone(), user.to_string(), pinned.cloned());
        let (key, timeout) = (self.key.clone(), self.connect_timeout);
        // libssh2 blocks the thread for up to `timeout` per step: keep it off the runtime.
        tokio::task::spawn_blocking(move || {
            let (session, host_key) =
                open_session(&endpoint, &user, &key, pinned.as_ref(), timeout)?;
            let _ = session.disconnect(None, "gpuprov login check done", None);
            Ok(host_key)
        })
        .await
        .map_err(|e| SshError::Local(format!("ssh login task failed: {e}")))?
    }
}

/// The local ends of a remote command: stdin to forward (`None`: closed at once), and
/// where its stdout and stderr go.
pub struct ExecIo<'a> {
    pub stdin: Option<Box<dyn Read + Send>>,
    pub stdout: &'a mut dyn Write,
    pub stderr: &'a mut dyn Write,
}

/// Runs `command` on the machine at `endpoint` as `user` and returns its exit status.
///
/// Connects with [`DEFAULT_CONNECT_TIMEOUT`], refuses with [`SshError::HostKeyMismatch`]
/// before authenticating when the server's host key is not `pinned`, then runs `command`
/// through the user's login shell, as `ssh host command` does. Remote stdout and stderr
/// are copied to `stdout` and `stderr` as they arrive. Once the command runs there is no
/// time limit (installs can be silent for many minutes).
///
/// Returns the remote exit status (0..=255); a command killed by a signal returns
/// 128 + the signal number, as a shell reports it (255 for a signal with no known number).
///
/// Errors: [`SshError::Unreachable`] (cannot connect, handshake failed, or the connection
/// dropped while the command ran, in which case it may have partly run),
/// [`SshError::AuthRejected`], [`SshError::HostKeyMismatch`], and [`SshError::Local`]
/// (key file unreadable, or writing to `stdout`/`stderr` failed).
pub fn exec(
    endpoint: &SshEndpoint,
    user: &str,
    key: &ProjectKey,
    pinned: &HostKey,
    command: &str,
    io: ExecIo<'_>,
) -> Result<i32, SshError> {
    let ExecIo {
        stdin,
        stdout,
        stderr,
    } = io;
    let (session, _) = open_session(endpoint, user, key, Some(pinned), DEFAULT_CONNECT_TIMEOUT)?;
    let ep = describe(endpoint, user);
    let lost = |e: ssh2::Error| SshError::Unreachable {
        endpoint: ep.clone(),
        msg: format!("connection lost while running a command: {}", e.message()),
    };
    session.set_timeout(0);
    let mut channel = session.channel_session().map_err(lost)?;
    channel.exec(command).map_err(lost)?;
    // Local stdin is read by a thread (reads block) and forwarded chunk by chunk; without
    // it, stdin is closed at once so commands that read it do not hang.
    let input = match stdin {
        Some(mut reader) => {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(4);
            std::thread::spawn(move || {
                let mut chunk = vec![0u8; 32 * 1024];
                loop {
                    match reader.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if tx.send(chunk[..n].to_vec()).is_err() {
                                break;
                            }
                        }
                    }
                }
            });
            Some(rx)
        }
        None => {
            channel.send_eof().map_err(lost)?;
            None
        }
    };
    let mut input = input;
    let mut pending: Vec<u8> = Vec::new();

    // Both streams are read in non-blocking mode and interleaved, so output appears live
    // and neither stream is held back until the other ends. ssh2 exposes no way to wait
    // on its socket, hence the short sleeps when both streams are idle.
    session.set_blocking(false);
    let mut buf = vec![0u8; 32 * 1024];
    let (mut out_done, mut err_done) = (false, false);
    let mut idle = Duration::from_millis(1);
    while !(out_done && err_done) {
        let mut progressed = false;
        let mut stdin_ended = false;
        if let Some(rx) = &input {
            if pending.is_empty() {
                match rx.try_recv() {
                    Ok(chunk) => pending = chunk,
                    Err(std::sync::mpsc::TryRecvError::Empty) => {}
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => stdin_ended = true,
                }
            }
        }
        if stdin_ended {
            // Local stdin ended: tell the remote side (retried while the session is busy;
            // -37 is libssh2's EAGAIN in non-blocking mode).
            match channel.send_eof() {
                Ok(()) => input = None,
                Err(e) if e.code() == ssh2::ErrorCode::Session(-37) => {}
                Err(e) => return Err(lost(e)),
            }
        }
        if !pending.is_empty() {
            match channel.write(&pending) {
                Ok(n) => {
                    pending.drain(..n);
                    progressed = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // The remote side no longer reads its stdin: drop the rest.
                Err(_) => {
                    pending.clear();
                    input = None;
                }
            }
        }
        for is_err in [false, true] {
            if (is_err && err_done) || (!is_err && out_done) {
                continue;
            }
            let read = if is_err {
                channel.stderr().read(&mut buf)
            } else {
                channel.read(&mut buf)
            };
            match read {
                Ok(0) => {
                    if is_err {
                        err_done = true
                    } else {
                        out_done = true
                    }
                }
                Ok(n) => {
                    progressed = true;
                    let sink: &mut dyn Write = if is_err { &mut *stderr } else { &mut *stdout };
                    sink.write_all(&buf[..n])
                        .and_then(|_| sink.flush())
                        .map_err(|e| {
                            SshError::Local(format!("cannot write the output of {ep}: {e}"))
                        })?;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    return Err(SshError::Unreachable {
                        endpoint: ep.clone(),
                        msg: format!("connection lost while running a command: {e}"),
                    })
                }
            }
        }
        if progressed {
            idle = Duration::from_millis(1);
        } else {
            std::thread::sleep(idle);
            idle = (idle * 2).min(Duration::from_millis(50));
        }
    }
    session.set_blocking(true);
    channel.wait_close().map_err(lost)?;
    let signal = channel.exit_signal().map_err(lost)?.exit_signal;
    let status = match signal {
        Some(name) => 128 + signal_number(&name).unwrap_or(127),
        None => channel.exit_status().map_err(lost)?,
    };
    let _ = session.disconnect(None, "done", None);
    Ok(status)
}

/// Runs `command` as [`exec`] does (the host key checked against `pinned` before
/// authenticating) but with every step bounded by `timeout` (TCP connect, handshake,
/// authentication and each read of the command's run), its stdin closed and its output
/// discarded: a check that must fail instead of waiting, as `gpuprov health`'s. Returns
/// the remote exit status.
///
/// Errors: as [`exec`]; a step that takes longer than `timeout` is
/// [`SshError::Unreachable`].
pub fn run_bounded(
    endpoint: &SshEndpoint,
    user: &str,
    key: &ProjectKey,
    pinned: &HostKey,
    command: &str,
    timeout: Duration,
) -> Result<i32, SshError> {
    let (session, _) = open_session(endpoint, user, key, Some(pinned), timeout)?;
    let ep = describe(endpoint, user);
    let lost = |msg: String| SshError::Unreachable {
        endpoint: ep.clone(),
        msg: format!("connection lost while running a command: {msg}"),
    };
    let ssh_lost = |e: ssh2::Error| lost(e.message().to_string());
    let mut channel = session.channel_session().map_err(ssh_lost)?;
    channel.exec(command).map_err(ssh_lost)?;
    channel.send_eof().map_err(ssh_lost)?;
    // Drained, not kept: a check only needs the status.
    io::copy(&mut channel, &mut io::sink()).map_err(|e| lost(e.to_string()))?;
    io::copy(&mut channel.stderr(), &mut io::sink()).map_err(|e| lost(e.to_string()))?;
    channel.wait_close().map_err(ssh_lost)?;
    let status = channel.exit_status().map_err(ssh_lost)?;
    let _ = session.disconnect(None, "gpuprov check done", None);
    Ok(status)
}

/// Connects, checks the host key against `pinned`, then authenticates with the project
/// key. Returns the authenticated session and the host key seen.
fn open_session(
    endpoint: &SshEndpoint,
    user: &str,
    key: &ProjectKey,
    pinned: Option<&HostKey>,
    timeout: Duration,
) -> Result<(Session, HostKey), SshError> {
    let ep = describe(endpoint, user);
    let unreachable = |msg: String| SshError::Unreachable {
        endpoint: ep.clone(),
        msg,
    };
    let timeout = timeout.max(Duration::from_millis(1));

    let tcp = connect_tcp(endpoint, timeout).map_err(|e| unreachable(e.to_string()))?;
    let mut session =
        Session::new().map_err(|e| SshError::Local(format!("cannot start libssh2: {e}")))?;
    session.set_timeout(timeout.as_millis().min(u32::MAX as u128) as u32);
    // Unsupported names are dropped by libssh2; if none remain it keeps its defaults,
    // which only means a pin of an unusual type may not match.
    let _ = session.method_pref(MethodType::HostKey, &host_key_prefs(pinned));
    session.set_tcp_stream(tcp);
    session
        .handshake()
        .map_err(|e| unreachable(format!("handshake failed: {}", e.message())))?;

    let (blob, _) = session
        .host_key()
        .ok_or_else(|| unreachable("the server sent no host key".to_string()))?;
    let seen = HostKey::from_blob(blob);
    if let Some(pinned) = pinned {
        // Compare the keys themselves; an undecodable pin matches nothing (refuse).
        if pinned.blob().as_deref() != Some(blob) {
            return Err(SshError::HostKeyMismatch {
                endpoint: ep,
                expected: pinned.fingerprint.clone(),
                got: seen.fingerprint,
            });
        }
    }

    authenticate(&session, user, key, &ep)?;
    if !session.authenticated() {
        return Err(SshError::AuthRejected {
            endpoint: ep,
            msg: "server did not complete authentication".to_string(),
        });
    }
    Ok((session, seen))
}

/// Authenticates `session` as `user` with `key`, wherever its private half is: a file, the
/// text in memory (never written to disk for libssh2), or the agent's identity with the
/// key's public blob.
fn authenticate(session: &Session, user: &str, key: &ProjectKey, ep: &str) -> Result<(), SshError> {
    match key.source() {
        KeySource::File(path) => session
            .userauth_pubkey_file(user, None, path, None)
            .map_err(|e| classify_auth_error(&e, ep, key)),
        KeySource::Memory(m) => session
            .userauth_pubkey_memory(user, None, m.text(), None)
            .map_err(|e| classify_auth_error(&e, ep, key)),
        KeySource::Agent(a) => {
            let agent_err = |what: &str, e: ssh2::Error| {
                SshError::Local(format!(
                    "cannot use {}: {what}: {}",
                    key.origin(),
                    e.message()
                ))
            };
            let want = key.public_blob().ok_or_else(|| {
                SshError::Local(format!("{}: the public key does not parse", key.origin()))
            })?;
            let mut agent = session
                .agent()
                .map_err(|e| agent_err("cannot start an agent client", e))?;
            if let Some(socket) = a.socket() {
                agent
                    .set_identity_path(socket)
                    .map_err(|e| agent_err("bad socket path", e))?;
            }
            agent
                .connect()
                .map_err(|e| agent_err("cannot connect", e))?;
            agent
                .list_identities()
                .map_err(|e| agent_err("cannot list its keys", e))?;
            let identity = agent
                .identities()
                .map_err(|e| agent_err("cannot list its keys", e))?
                .into_iter()
                .find(|id| id.blob() == want.as_slice())
                .ok_or_else(|| {
                    SshError::Local(format!(
                        "{} no longer holds the key {}",
                        key.origin(),
                        key.fingerprint().unwrap_or_default()
                    ))
                })?;
            let result = agent
                .userauth(user, &identity)
                .map_err(|e| classify_auth_error(&e, ep, key));
            let _ = agent.disconnect();
            result
        }
        KeySource::Unavailable(why) => Err(SshError::Local(why.clone())),
    }
}

fn connect_tcp(endpoint: &SshEndpoint, timeout: Duration) -> io::Result<TcpStream> {
    let addrs = (endpoint.host.as_str(), endpoint.port).to_socket_addrs()?;
    let mut last = io::Error::new(io::ErrorKind::NotFound, "host name resolved to no address");
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = io::Error::new(e.kind(), format!("{addr}: {e}")),
        }
    }
    Err(last)
}

fn host_key_prefs(pinned: Option<&HostKey>) -> String {
    let mut prefs: Vec<&str> = Vec::new();
    if let Some(p) = pinned {
        // Ask for the pinned type first, as OpenSSH does with known_hosts; otherwise a
        // server that also has an ed25519 key would look like a changed key.
        match p.algorithm.as_str() {
            "ssh-rsa" => prefs.extend(["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"]),
            a if !a.is_empty() && a.bytes().all(|b| b.is_ascii_graphic() && b != b',') => {
                prefs.push(a)
            }
            _ => {}
        }
    }
    for a in HOST_KEY_ALGORITHMS {
        if !prefs.contains(a) {
            prefs.push(a);
        }
    }
    prefs.join(",")
}

fn classify_auth_error(e: &ssh2::Error, ep: &str, key: &ProjectKey) -> SshError {
    use libssh2_codes::*;
    let msg = e.message().to_string();
    match e.code() {
        ErrorCode::Session(FILE) => SshError::Local(format!(
            "cannot use the project key {}: {msg}",
            key.origin()
        )),
        ErrorCode::Session(
            TIMEOUT | SOCKET_SEND | SOCKET_RECV | SOCKET_DISCONNECT | SOCKET_TIMEOUT | BAD_SOCKET,
        ) => SshError::Unreachable {
            endpoint: ep.to_string(),
            msg,
        },
        // The server answered and did not accept us (unknown key, or the user does not
        // exist yet): may be transient while the instance writes authorized_keys.
        _ => SshError::AuthRejected {
            endpoint: ep.to_string(),
            msg,
        },
    }
}

/// The libssh2 error codes we classify (`LIBSSH2_ERROR_*`; `libssh2-sys` is not a direct
/// dependency, and these values are part of libssh2's stable ABI).
mod libssh2_codes {
    pub const SOCKET_SEND: i32 = -7;
    pub const TIMEOUT: i32 = -9;
    pub const SOCKET_DISCONNECT: i32 = -13;
    pub const FILE: i32 = -16;
    pub const SOCKET_TIMEOUT: i32 = -30;
    pub const SOCKET_RECV: i32 = -43;
    pub const BAD_SOCKET: i32 = -45;
}

fn describe(endpoint: &SshEndpoint, user: &str) -> String {
    format!("{user}@{}:{}", endpoint.host, endpoint.port)
}

/// Linux signal numbers for the names SSH reports (RFC 4254 lists these without "SIG").
fn signal_number(name: &str) -> Option<i32> {
    Some(match name {
        "HUP" => 1,
        "INT" => 2,
        "QUIT" => 3,
        "ILL" => 4,
        "ABRT" => 6,
        "FPE" => 8,
        "KILL" => 9,
        "USR1" => 10,
        "SEGV" => 11,
        "USR2" => 12,
        "PIPE" => 13,
        "ALRM" => 14,
        "TERM" => 15,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pin(algorithm: &str) -> HostKey {
        HostKey {
            algorithm: algorithm.into(),
            key_base64: String::new(),
            fingerprint: String::new(),
        }
    }

    #[test]
    fn host_key_prefs_put_the_pinned_type_first_without_duplicates() {
        assert!(host_key_prefs(None).starts_with("ssh-ed25519,ecdsa-sha2-nistp256,"));
        let p = host_key_prefs(Some(&pin("ecdsa-sha2-nistp384")));
        assert!(p.starts_with("ecdsa-sha2-nistp384,ssh-ed25519,"), "{p}");
        assert_eq!(p.matches("ecdsa-sha2-nistp384").count(), 1);
        let p = host_key_prefs(Some(&pin("ssh-rsa")));
        assert!(
            p.starts_with("rsa-sha2-512,rsa-sha2-256,ssh-rsa,ssh-ed25519"),
            "{p}"
        );
        // A pin whose type could inject extra names is ignored for ordering.
        let p = host_key_prefs(Some(&pin("x,ssh-dss")));
        assert!(!p.contains("ssh-dss"), "{p}");
    }

    #[test]
    fn signals_map_to_shell_style_statuses() {
        assert_eq!(signal_number("KILL").map(|n| 128 + n), Some(137));
        assert_eq!(signal_number("TERM").map(|n| 128 + n), Some(143));
        assert_eq!(signal_number("NOPE"), None);
    }
}
