//! SSH: the per-project key, logging in with host-key pinning, running commands, and the
//! ssh config file a user's `~/.ssh/config` can `Include`.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::provider::SshEndpoint;

/// A server's host key as seen on login; the public half only (not a secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostKey {
    /// OpenSSH algorithm name, for example `ssh-ed25519`.
    pub algorithm: String,
    /// The key blob, base64 as in `known_hosts`.
    pub key_base64: String,
    /// `SHA256:...` fingerprint as `ssh-keygen -l` prints it.
    pub fingerprint: String,
}

/// Why a login failed; decides whether the launch machine waits or gives up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SshError {
    /// Nothing answers yet, or the handshake broke: keep waiting until the deadline.
    #[error("ssh to {endpoint} not reachable yet: {msg}")]
    Unreachable { endpoint: String, msg: String },
    /// The server answered but refused the project key (may be transient while the
    /// instance writes `authorized_keys`).
    #[error("ssh to {endpoint} refused the project key: {msg}")]
    AuthRejected { endpoint: String, msg: String },
    /// The host key differs from the one pinned on first login: refused, never retried.
    #[error(
        "host key of {endpoint} changed: pinned {expected}, server offered {got}; \
         refusing to connect (possible man-in-the-middle, or the machine was replaced \
         outside gpuprov)"
    )]
    HostKeyMismatch {
        endpoint: String,
        expected: String,
        got: String,
    },
    /// Local problem (key file unreadable and so on).
    #[error("ssh: {0}")]
    Local(String),
}

/// Logs in to a booted instance; the launch machine's Connecting step calls it. A trait so
/// engine tests can script logins without a real server.
#[async_trait]
pub trait Connector: Send + Sync {
    /// Logs in at `endpoint` with the project key as `user` and returns the host key seen.
    /// With `pinned`, a different host key is [`SshError::HostKeyMismatch`].
    async fn login(
        &self,
        endpoint: &SshEndpoint,
        user: &str,
        pinned: Option<&HostKey>,
    ) -> Result<HostKey, SshError>;
}
