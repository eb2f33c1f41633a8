//! SSH: the project key (generated here, or supplied by the environment, a file or the
//! agent, see [`supply`]), logging in with host-key pinning, running commands, and the
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

pub mod client;
pub mod config_file;
pub mod keys;
pub mod supply;

pub use client::{exec, ExecIo, Ssh2Connector};
pub use config_file::{
    host_aliases, render_known_hosts, render_ssh_config, write_ssh_files, SshConfigEntry,
};
pub use keys::{ensure_project_key, KeySource, ProjectKey};
pub use supply::{KeyError, KeyRequest, KeySupply, SshIdentity};

use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use base64::Engine as _;
use sha2::{Digest, Sha256};

/// `SHA256:` followed by the unpadded base64 of the SHA-256 of `key_blob` (the raw
/// public key blob as sent in the SSH protocol), exactly as `ssh-keygen -l` prints it.
pub fn sha256_fingerprint(key_blob: &[u8]) -> String {
    format!(
        "SHA256:{}",
        STANDARD_NO_PAD.encode(Sha256::digest(key_blob))
    )
}

impl HostKey {
    /// Builds a host key from the raw public key blob a server sent. The algorithm is the
    /// name at the start of the blob (every SSH public key blob starts with it), so it is
    /// right even for types the SSH library has no name for.
    pub fn from_blob(key_blob: &[u8]) -> HostKey {
        HostKey {
            algorithm: blob_algorithm(key_blob).unwrap_or_else(|| "unknown".to_string()),
            key_base64: STANDARD.encode(key_blob),
            fingerprint: sha256_fingerprint(key_blob),
        }
    }

    /// Parses one public key line as in `known_hosts` or a `.pub` file
    /// (`ssh-ed25519 AAAA... [comment]`, optionally preceded by host names).
    ///
    /// Errors: [`SshError::Local`] when no `ALGORITHM BASE64` pair is found or the base64
    /// blob does not name the same algorithm.
    pub fn from_public_key_line(line: &str) -> Result<HostKey, SshError> {
        let words: Vec<&str> = line.split_whitespace().collect();
        for pair in words.windows(2) {
            if let Ok(blob) = STANDARD.decode(pair[1]) {
                if blob_algorithm(&blob).as_deref() == Some(pair[0]) {
                    return Ok(HostKey::from_blob(&blob));
                }
            }
        }
        Err(SshError::Local(format!(
            "not an SSH public key line: {line:?}"
        )))
    }

    /// The raw key blob, `None` if `key_base64` is not valid base64.
    pub fn blob(&self) -> Option<Vec<u8>> {
        STANDARD.decode(self.key_base64.trim()).ok()
    }
}

/// The algorithm name an SSH key blob starts with (a uint32 big-endian length, then the
/// name), if it is well-formed printable ASCII.
fn blob_algorithm(blob: &[u8]) -> Option<String> {
    let len = u32::from_be_bytes(blob.get(..4)?.try_into().ok()?) as usize;
    let name = blob.get(4..4usize.checked_add(len)?)?;
    if name.is_empty() || !name.iter().all(|b| b.is_ascii_graphic()) {
        return None;
    }
    String::from_utf8(name.to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Vector produced once with `ssh-keygen -t ed25519 -N '' -C vector -f k` and
    // `ssh-keygen -l -f k.pub`, which printed
    // `256 SHA256:wiyJ85rS7aA4naCnKGENpufz1GEZ/JpJDPYH9o+c7fQ vector (ED25519)`.
    const VECTOR_PUB: &str = "ssh-ed25519 \
        AAAAC3NzaC1lZDI1NTE5AAAAIP1aKkTwWv+35tVLGntrswkcNoa9s8je2SaiXHbxFOTP vector";
    const VECTOR_FP: &str = "SHA256:wiyJ85rS7aA4naCnKGENpufz1GEZ/JpJDPYH9o+c7fQ";

    #[test]
    fn fingerprint_matches_ssh_keygen_vector() {
        let hk = HostKey::from_public_key_line(VECTOR_PUB).unwrap();
        assert_eq!(hk.algorithm, "ssh-ed25519");
        assert_eq!(
            hk.key_base64,
            "AAAAC3NzaC1lZDI1NTE5AAAAIP1aKkTwWv+35tVLGntrswkcNoa9s8je2SaiXHbxFOTP"
        );
        assert_eq!(hk.fingerprint, VECTOR_FP);
    }

    #[test]
    fn public_key_line_parsing_accepts_known_hosts_and_rejects_garbage() {
        let hk = HostKey::from_public_key_line(&format!("[127.0.0.1]:2222 {VECTOR_PUB}"));
        assert_eq!(hk.unwrap().fingerprint, VECTOR_FP);
        assert!(HostKey::from_public_key_line("ssh-ed25519 notbase64!").is_err());
        // Algorithm word disagreeing with the blob's own name is not a key.
        let wrong = VECTOR_PUB.replace("ssh-ed25519", "ssh-rsa");
        assert!(HostKey::from_public_key_line(&wrong).is_err());
        assert_eq!(blob_algorithm(&[0, 0, 0, 200, b'a']), None);
    }
}
