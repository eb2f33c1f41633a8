//! Where the project key comes from on this machine, and the public identity the state
//! records so that every machine uses the same key (issue 14, item 4).
//!
//! The private key never enters the state: the state records only the key's
//! [`SshIdentity`] (fingerprint and public key). Another machine (a CI runner, a
//! colleague's laptop) supplies the private half, looked for in this order:
//!
//! 1. `GPUPROV_SSH_PRIVATE_KEY`: the private key's text (a CI secret), kept in memory;
//! 2. `--ssh-key PATH` / `GPUPROV_SSH_KEY_FILE`: an OpenSSH private key file, or a public
//!    key file (`.pub`) whose private half the SSH agent holds;
//! 3. the SSH agent (`SSH_AUTH_SOCK`): the identity whose public key is the recorded one;
//! 4. the per-project key file on this machine (`<GPUPROV_HOME>/projects/<lineage>/id_ed25519`).
//!
//! With a recorded identity the first source holding *that* key wins, and none holding
//! it is [`KeyError::NotAvailable`], naming the fingerprint and the ways to supply it:
//! a second key is never generated. Without one (a state that never had machines), the
//! first supplied key is used, else the per-project key, generated on first use. The
//! agent is not consulted then: a developer's personal key would silently become the
//! team's (point `--ssh-key` at the `.pub` file to start a project with an agent key).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use ssh2::Session;

use crate::provider::redact::Secret;

use super::keys::{ensure_project_key, ProjectKey, PRIVATE_KEY_FILE};
use super::{HostKey, SshError};

/// The environment variable holding the private key's text.
pub const ENV_PRIVATE_KEY: &str = "GPUPROV_SSH_PRIVATE_KEY";
/// The environment variable naming the private key file (same as `--ssh-key`).
pub const ENV_KEY_FILE: &str = "GPUPROV_SSH_KEY_FILE";
/// The SSH agent's socket, as OpenSSH names it.
pub const ENV_AGENT: &str = "SSH_AUTH_SOCK";

/// The ways to supply the key, for help texts.
pub const HOW_TO_SUPPLY: &str = "supply that private key in one of three ways: set \
    GPUPROV_SSH_PRIVATE_KEY to its text (for example from a CI secret); set \
    GPUPROV_SSH_KEY_FILE or pass --ssh-key PATH to name its file; or add it to the SSH agent \
    (ssh-add; SSH_AUTH_SOCK set). gpuprov never makes a second key for a state that records one";

/// The project key as the state records it: public data only.
///
/// JSON shape: `{"key_fingerprint": "SHA256:…", "public_key": "ssh-ed25519 AAAA…"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SshIdentity {
    /// `SHA256:` and the unpadded base64 SHA-256 of the public key blob, as
    /// `ssh-keygen -lf` prints it.
    pub key_fingerprint: String,
    /// The public key, `ALGORITHM BASE64` (no comment), as in `authorized_keys`.
    pub public_key: String,
    /// Fields a newer release added; kept on save.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl SshIdentity {
    /// The identity of `key`; `None` when its public line does not parse (only a key
    /// with no private half on this machine may lack one).
    pub fn of(key: &ProjectKey) -> Option<SshIdentity> {
        let hk = HostKey::from_public_key_line(&key.public_key_openssh).ok()?;
        Some(SshIdentity {
            key_fingerprint: hk.fingerprint,
            public_key: format!("{} {}", hk.algorithm, hk.key_base64),
            extra: Map::new(),
        })
    }
}

/// What this machine supplies (read by the CLI from its flags and environment).
#[derive(Debug, Clone, Default)]
pub struct KeySupply {
    /// `GPUPROV_SSH_PRIVATE_KEY`.
    pub private_key_text: Option<Secret>,
    /// `--ssh-key` or `GPUPROV_SSH_KEY_FILE`.
    pub key_file: Option<PathBuf>,
    /// `SSH_AUTH_SOCK`.
    pub agent_socket: Option<PathBuf>,
}

/// What the command asking for the key knows about the project.
#[derive(Debug, Clone, Copy)]
pub struct KeyRequest<'a> {
    /// The state's recorded identity, if any.
    pub recorded: Option<&'a SshIdentity>,
    /// Whether the state has any resource records (a state with machines but no
    /// recorded identity was written by an older gpuprov).
    pub has_machines: bool,
    /// The per-project directory on this machine (`<GPUPROV_HOME>/projects/<lineage>`).
    pub project_dir: &'a Path,
    /// The comment of a generated key.
    pub comment: &'a str,
    /// Whether a fresh project may generate its key here (`apply`); commands that only
    /// connect never do.
    pub may_generate: bool,
}

/// Why no key could be used. Never contains private key text.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum KeyError {
    /// The state records a key this machine does not have.
    #[error(
        "the SSH key of this state's machines is not available on this machine:\n    \
         {fingerprint}\n  looked for in:{tried}"
    )]
    #[diagnostic(code(gpuprov::ssh::key_not_available), help("{help}"))]
    NotAvailable {
        fingerprint: String,
        /// One indented line per source looked at.
        tried: String,
        help: String,
    },
    /// A state with machines, written before fingerprints were recorded, and no key
    /// here: a new key would not get into those machines.
    #[error(
        "this state records no SSH key fingerprint (an older gpuprov wrote it), and no key \
         was supplied or found at {path}"
    )]
    #[diagnostic(
        code(gpuprov::ssh::key_not_recorded),
        help(
            "supply the key the machines were created with: set GPUPROV_SSH_PRIVATE_KEY to \
              its text, or GPUPROV_SSH_KEY_FILE / --ssh-key to its file; gpuprov records its \
              fingerprint at the next apply"
        )
    )]
    NotRecorded { path: String },
    /// A supplied key cannot be used (unreadable, not a private key, encrypted …).
    #[error("cannot use the SSH key: {0}")]
    #[diagnostic(code(gpuprov::ssh::key_invalid))]
    Invalid(String),
}

impl From<SshError> for KeyError {
    fn from(e: SshError) -> Self {
        KeyError::Invalid(match e {
            SshError::Local(m) => m,
            other => other.to_string(),
        })
    }
}

/// Returns the key this machine logs in with for `request`, in the order of the module
/// docs.
///
/// Errors: [`KeyError::NotAvailable`] (a recorded identity no source holds; the message
/// names the fingerprint, each source looked at and what it holds, the help the ways to
/// supply it), [`KeyError::NotRecorded`], [`KeyError::Invalid`] (a supplied key is
/// unreadable or not an unencrypted OpenSSH private key; the agent cannot be asked).
pub fn resolve(supply: &KeySupply, request: &KeyRequest<'_>) -> Result<ProjectKey, KeyError> {
    let project_file = request.project_dir.join(PRIVATE_KEY_FILE);
    let Some(recorded) = request.recorded else {
        if let Some(key) = supplied(supply)? {
            return Ok(key);
        }
        if request.has_machines || !request.may_generate {
            // Never generate here: the machines (or the command) need an existing key.
            return match ProjectKey::load_file(&project_file) {
                Ok(k) => Ok(k),
                Err(_) if !project_file.exists() => Err(KeyError::NotRecorded {
                    path: project_file.display().to_string(),
                }),
                Err(e) => Err(e.into()),
            };
        }
        return Ok(ensure_project_key(request.project_dir, request.comment)?);
    };

    let want = recorded.key_fingerprint.as_str();
    // One line per source looked at; fingerprints on lines of their own, so a wrapped
    // message never breaks one.
    let mut tried: Vec<String> = Vec::new();
    let consider = |key: ProjectKey, tried: &mut Vec<String>| -> Option<ProjectKey> {
        let fp = key.fingerprint();
        if fp.as_deref() == Some(want) {
            return Some(key);
        }
        tried.push(format!(
            "{} holds another key:\n      {}",
            key.origin(),
            fp.unwrap_or_default()
        ));
        None
    };
    if let Some(text) = &supply.private_key_text {
        let key = ProjectKey::from_private_key_text(ENV_PRIVATE_KEY, text)?;
        if let Some(k) = consider(key, &mut tried) {
            return Ok(k);
        }
    }
    if let Some(path) = &supply.key_file {
        if let Some(k) = consider(key_file(path, supply)?, &mut tried) {
            return Ok(k);
        }
    }
    if let Some(socket) = &supply.agent_socket {
        match agent_holds(socket, &recorded.public_key) {
            Ok(true) => {
                return Ok(ProjectKey::in_agent(
                    recorded.public_key.clone(),
                    Some(socket.clone()),
                ))
            }
            Ok(false) => tried.push(format!(
                "the SSH agent at {} does not hold it",
                socket.display()
            )),
            // An agent that cannot be asked is one source fewer, not a failure.
            Err(e) => tried.push(format!(
                "the SSH agent at {} cannot be asked: {e}",
                socket.display()
            )),
        }
    }
    if project_file.exists() {
        if let Some(k) = consider(ProjectKey::load_file(&project_file)?, &mut tried) {
            return Ok(k);
        }
    } else {
        tried.push(format!("{} (no such file)", project_file.display()));
    }
    Err(KeyError::NotAvailable {
        fingerprint: want.to_string(),
        tried: tried.iter().map(|t| format!("\n  - {t}")).collect(),
        help: HOW_TO_SUPPLY.to_string(),
    })
}

/// The first key supplied explicitly (environment text, then key file), if any.
fn supplied(supply: &KeySupply) -> Result<Option<ProjectKey>, KeyError> {
    if let Some(text) = &supply.private_key_text {
        return Ok(Some(ProjectKey::from_private_key_text(
            ENV_PRIVATE_KEY,
            text,
        )?));
    }
    match &supply.key_file {
        Some(path) => Ok(Some(key_file(path, supply)?)),
        None => Ok(None),
    }
}

/// The key named by `--ssh-key` / `GPUPROV_SSH_KEY_FILE`: a private key file, or a public
/// key file whose private half the agent must hold. The path is made absolute (it goes
/// into the generated ssh config).
fn key_file(path: &Path, supply: &KeySupply) -> Result<ProjectKey, KeyError> {
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    // A public key is short; reading a little more than one line is enough to tell.
    let head = std::fs::read(&path)
        .map_err(|e| KeyError::Invalid(format!("{}: cannot read: {e}", path.display())))?;
    let text = String::from_utf8_lossy(&head);
    let line = text.trim();
    if !line.starts_with("-----BEGIN") && !line.contains('\n') {
        if let Ok(public) = HostKey::from_public_key_line(line) {
            let public = format!("{} {}", public.algorithm, public.key_base64);
            let Some(socket) = &supply.agent_socket else {
                return Err(KeyError::Invalid(format!(
                    "{} is a public key, so its private half must be in the SSH agent, but \
                     SSH_AUTH_SOCK is not set",
                    path.display()
                )));
            };
            return match agent_holds(socket, &public) {
                Ok(true) => Ok(ProjectKey::in_agent(public, Some(socket.clone()))),
                Ok(false) => Err(KeyError::Invalid(format!(
                    "{} is a public key and the SSH agent at {} does not hold its private \
                     half (add it with ssh-add)",
                    path.display(),
                    socket.display()
                ))),
                Err(e) => Err(KeyError::Invalid(format!(
                    "{} is a public key, and the SSH agent at {} cannot be asked for its \
                     private half: {e}",
                    path.display(),
                    socket.display()
                ))),
            };
        }
    }
    Ok(ProjectKey::load_file(&path)?)
}

/// Whether the agent at `socket` holds the identity whose public key is `public_key`
/// (`ALGORITHM BASE64`). Errors: the agent cannot be reached or listed (libssh2's
/// message).
fn agent_holds(socket: &Path, public_key: &str) -> Result<bool, String> {
    let want = HostKey::from_public_key_line(public_key)
        .ok()
        .and_then(|k| k.blob())
        .ok_or_else(|| "the recorded public key does not parse".to_string())?;
    let session = Session::new().map_err(|e| e.message().to_string())?;
    let mut agent = session.agent().map_err(|e| e.message().to_string())?;
    agent
        .set_identity_path(socket)
        .map_err(|e| e.message().to_string())?;
    agent.connect().map_err(|e| e.message().to_string())?;
    let found = agent
        .list_identities()
        .and_then(|()| agent.identities())
        .map(|ids| ids.iter().any(|id| id.blob() == want.as_slice()))
        .map_err(|e| e.message().to_string());
    let _ = agent.disconnect();
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ssh::keys::tests::{ED25519_VECTOR, ED25519_VECTOR_FP};
    use crate::ssh::keys::KeySource;
    use std::os::unix::fs::PermissionsExt;

    const VECTOR_PUBLIC: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA1SPVpvDj0WRdKGnQi2d2t21rwYGnMENEitx6cJ1cen";

    fn recorded() -> SshIdentity {
        SshIdentity {
            key_fingerprint: ED25519_VECTOR_FP.into(),
            public_key: VECTOR_PUBLIC.into(),
            extra: Map::new(),
        }
    }

    fn request<'a>(dir: &'a Path, recorded: Option<&'a SshIdentity>) -> KeyRequest<'a> {
        KeyRequest {
            recorded,
            has_machines: recorded.is_some(),
            project_dir: dir,
            comment: "gpuprov-test",
            may_generate: true,
        }
    }

    fn env(text: &str) -> KeySupply {
        KeySupply {
            private_key_text: Some(Secret::new(text)),
            ..KeySupply::default()
        }
    }

    fn files_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|d| {
                d.map(|e| e.unwrap().file_name().into_string().unwrap())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    #[test]
    fn identity_is_the_fingerprint_and_the_bare_public_key() {
        let key = ProjectKey::from_private_key_text("T", &Secret::new(ED25519_VECTOR)).unwrap();
        let id = SshIdentity::of(&key).unwrap();
        assert_eq!(id, recorded(), "no comment, ssh-keygen's fingerprint");
        let json = serde_json::to_value(&id).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"key_fingerprint": ED25519_VECTOR_FP, "public_key": VECTOR_PUBLIC})
        );
        assert_eq!(SshIdentity::of(&ProjectKey::unavailable("", "x")), None);
    }

    #[test]
    fn a_fresh_project_generates_its_key_once_unless_one_is_supplied() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("p");
        let key = resolve(&env(ED25519_VECTOR), &request(&dir, None)).unwrap();
        assert!(matches!(key.source(), KeySource::Memory(_)));
        assert!(files_in(&dir).is_empty(), "a supplied key writes nothing");

        let generated = resolve(&KeySupply::default(), &request(&dir, None)).unwrap();
        assert_eq!(
            generated.private_key_path(),
            Some(dir.join("id_ed25519").as_path())
        );
        let again = resolve(&KeySupply::default(), &request(&dir, None)).unwrap();
        assert_eq!(again, generated, "the same key, not a second one");

        // A command that only connects never generates.
        let other = tmp.path().join("q");
        let no_gen = KeyRequest {
            may_generate: false,
            ..request(&other, None)
        };
        assert!(matches!(
            resolve(&KeySupply::default(), &no_gen),
            Err(KeyError::NotRecorded { .. })
        ));
        assert!(!other.exists());
    }

    #[test]
    fn a_recorded_key_is_taken_from_the_first_source_that_holds_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("p");
        let rec = recorded();
        let key = resolve(&env(ED25519_VECTOR), &request(&dir, Some(&rec))).unwrap();
        assert!(matches!(key.source(), KeySource::Memory(_)));
        assert_eq!(key.fingerprint().as_deref(), Some(ED25519_VECTOR_FP));

        // A key file (relative paths are made absolute for the ssh config).
        let file = tmp.path().join("ci_key");
        std::fs::write(&file, ED25519_VECTOR).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let supply = KeySupply {
            key_file: Some(file.clone()),
            ..KeySupply::default()
        };
        let key = resolve(&supply, &request(&dir, Some(&rec))).unwrap();
        assert_eq!(key.private_key_path(), Some(file.as_path()));

        // A wrong key in the environment does not hide the right one further down.
        let wrong = ensure_project_key(&tmp.path().join("other"), "other").unwrap();
        let wrong_text = std::fs::read_to_string(wrong.private_key_path().unwrap()).unwrap();
        let supply = KeySupply {
            key_file: Some(file.clone()),
            ..env(&wrong_text)
        };
        let key = resolve(&supply, &request(&dir, Some(&rec))).unwrap();
        assert_eq!(key.private_key_path(), Some(file.as_path()));
        assert!(files_in(&dir).is_empty());
    }

    #[test]
    fn a_recorded_key_nobody_holds_is_an_error_naming_it_and_never_a_new_key() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("p");
        let rec = recorded();
        let wrong = ensure_project_key(&tmp.path().join("other"), "other").unwrap();
        let wrong_text = std::fs::read_to_string(wrong.private_key_path().unwrap()).unwrap();
        let supply = KeySupply {
            agent_socket: Some(tmp.path().join("no-agent.sock")),
            ..env(&wrong_text)
        };
        for supply in [KeySupply::default(), supply] {
            let err = resolve(&supply, &request(&dir, Some(&rec))).unwrap_err();
            let help = miette::Diagnostic::help(&err).unwrap().to_string();
            for way in [
                "GPUPROV_SSH_PRIVATE_KEY",
                "GPUPROV_SSH_KEY_FILE",
                "--ssh-key",
                "SSH agent",
            ] {
                assert!(help.contains(way), "names {way}: {help}");
            }
            let shown = err.to_string();
            assert!(shown.contains(ED25519_VECTOR_FP), "{shown}");
            assert!(shown.contains("id_ed25519 (no such file)"), "{shown}");
            if supply.private_key_text.is_some() {
                let other_fp = wrong.fingerprint().unwrap();
                assert!(
                    shown.contains(&format!(
                        "GPUPROV_SSH_PRIVATE_KEY holds another key:\n      {other_fp}"
                    )),
                    "{shown}"
                );
                assert!(shown.contains("no-agent.sock"), "{shown}");
                for l in wrong_text.lines().filter(|l| !l.starts_with("-----")) {
                    assert!(!shown.contains(l), "the key's text is in the error");
                }
            }
            assert!(!dir.exists(), "no key generated: {:?}", files_in(&dir));
        }
        // The per-project key of another project is not taken either.
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(wrong.private_key_path().unwrap(), dir.join("id_ed25519")).unwrap();
        let err = resolve(&KeySupply::default(), &request(&dir, Some(&rec))).unwrap_err();
        assert!(err.to_string().contains("holds another key"), "{err}");
    }

    #[test]
    fn a_state_with_machines_and_no_fingerprint_never_gets_a_generated_key() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("p");
        let legacy = KeyRequest {
            has_machines: true,
            ..request(&dir, None)
        };
        let err = resolve(&KeySupply::default(), &legacy).unwrap_err();
        assert!(matches!(err, KeyError::NotRecorded { .. }), "{err}");
        assert!(!dir.exists());
        // The key this machine made for it before is still used, as is a supplied one.
        let made = ensure_project_key(&dir, "c").unwrap();
        assert_eq!(resolve(&KeySupply::default(), &legacy).unwrap(), made);
        let key = resolve(&env(ED25519_VECTOR), &legacy).unwrap();
        assert_eq!(key.fingerprint().as_deref(), Some(ED25519_VECTOR_FP));
    }

    #[test]
    fn a_public_key_file_needs_the_agent() {
        let tmp = tempfile::tempdir().unwrap();
        let pub_file = tmp.path().join("k.pub");
        std::fs::write(&pub_file, format!("{VECTOR_PUBLIC} me@laptop\n")).unwrap();
        let supply = KeySupply {
            key_file: Some(pub_file.clone()),
            ..KeySupply::default()
        };
        let err = resolve(&supply, &request(&tmp.path().join("p"), None)).unwrap_err();
        assert!(
            err.to_string().contains("SSH_AUTH_SOCK is not set"),
            "{err}"
        );
        let supply = KeySupply {
            agent_socket: Some(tmp.path().join("nothing-here")),
            ..supply
        };
        let err = resolve(&supply, &request(&tmp.path().join("p"), None)).unwrap_err();
        assert!(err.to_string().contains("cannot be asked"), "{err}");
    }
}
