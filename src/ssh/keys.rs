//! The per-project SSH key: one ed25519 key pair gpuprov creates on first use and reuses
//! for every machine of the project.
//!
//! Security notes (why the code looks the way it does):
//! - the private key file is created with mode 0600 at `open(2)` time, never chmod-ed
//!   afterwards, so there is no window in which another local user could read it;
//! - it is written to a temporary file first and hard-linked into place, which fails if
//!   the key already exists, so two gpuprov processes racing on first use end up with one
//!   key and nobody ever reads a half-written file;
//! - an existing key that does not parse is an error, never replaced: replacing it would
//!   lock the user out of every machine that trusts the old key;
//! - the private key text is held only inside this module's functions and never put in an
//!   error message; [`ProjectKey`] holds only the path and the public half.

use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ssh_key::rand_core::OsRng;
use ssh_key::{Algorithm, LineEnding, PrivateKey};

use crate::atomic_file;

use super::SshError;

/// File name of the private key inside the key directory; the public key is next to it
/// with a `.pub` suffix, as `ssh-keygen` lays them out.
pub const PRIVATE_KEY_FILE: &str = "id_ed25519";
/// File name of the public key inside the key directory.
pub const PUBLIC_KEY_FILE: &str = "id_ed25519.pub";

/// The project's key pair as gpuprov uses it: where the private key is (libssh2 and
/// OpenSSH read it from disk) and the public key to install on machines.
///
/// Deliberately holds no private key material, so deriving `Debug` is safe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectKey {
    /// Absolute or project-relative path of the OpenSSH-format private key (mode 0600).
    pub private_key_path: PathBuf,
    /// One line, `ssh-ed25519 AAAA... comment`, without a trailing newline.
    pub public_key_openssh: String,
}

/// Returns the project key kept in `dir`, creating it on first use.
///
/// First use creates `dir` (and missing parents) with mode 0700, an ed25519 key
/// `dir/id_ed25519` (OpenSSH private key format, unencrypted, mode 0600) whose comment is
/// `comment`, and `dir/id_ed25519.pub`. Later calls load the existing private key and
/// derive the public key from it; a missing or stale `.pub` file is rewritten (it is
/// derived data).
///
/// Errors ([`SshError::Local`], always naming the path, never containing key material):
/// the directory or files cannot be created or read; the existing private key does not
/// parse, is passphrase-protected, or is readable by group or others (OpenSSH itself
/// refuses such a key, so the generated ssh config would not work with it).
pub fn ensure_project_key(dir: &Path, comment: &str) -> Result<ProjectKey, SshError> {
    create_private_dir(dir)?;
    let private_key_path = dir.join(PRIVATE_KEY_FILE);
    let key = match load_private_key(&private_key_path)? {
        Some(key) => key,
        None => create_private_key(dir, &private_key_path, comment)?,
    };
    let public_key_openssh = key
        .public_key()
        .to_openssh()
        .map_err(|e| local(&private_key_path, "cannot encode the public key", e))?;
    write_public_key(&dir.join(PUBLIC_KEY_FILE), &public_key_openssh)?;
    Ok(ProjectKey {
        private_key_path,
        public_key_openssh,
    })
}

fn local(path: &Path, what: &str, e: impl std::fmt::Display) -> SshError {
    SshError::Local(format!("{}: {what}: {e}", path.display()))
}

fn create_private_dir(dir: &Path) -> Result<(), SshError> {
    // `mode` applies to every directory created here, so parents made on the way are
    // private too; an existing directory is left as it is (it may be the user's own).
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| local(dir, "cannot create the key directory", e))
}

/// `Ok(None)` when there is no key yet; every other problem is an error, so a damaged key
/// is never mistaken for a missing one and overwritten.
fn load_private_key(path: &Path) -> Result<Option<PrivateKey>, SshError> {
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(local(path, "cannot read the project's private key", e)),
    };
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(SshError::Local(format!(
            "{}: the project's private key is accessible by group or others (mode {:o}); \
             run `chmod 600` on it",
            path.display(),
            meta.permissions().mode() & 0o777
        )));
    }
    let text = fs::read_to_string(path)
        .map_err(|e| local(path, "cannot read the project's private key", e))?;
    // The parser's errors describe the format problem only (they never echo the input).
    let key = PrivateKey::from_openssh(text.as_bytes()).map_err(|e| {
        local(
            path,
            "is not a valid OpenSSH private key (not replaced; move it away to get a new \
             key, which must then be installed on existing machines)",
            e,
        )
    })?;
    if key.is_encrypted() {
        return Err(SshError::Local(format!(
            "{}: the project's private key is passphrase-protected; gpuprov needs an \
             unencrypted key",
            path.display()
        )));
    }
    Ok(Some(key))
}

fn create_private_key(dir: &Path, path: &Path, comment: &str) -> Result<PrivateKey, SshError> {
    let mut key = PrivateKey::random(&mut OsRng, Algorithm::Ed25519)
        .map_err(|e| local(path, "cannot generate a key", e))?;
    key.set_comment(comment);
    // Zeroizing: the encoded text is wiped from memory when dropped.
    let pem = key
        .to_openssh(LineEnding::LF)
        .map_err(|e| local(path, "cannot encode the key", e))?;

    let tmp = dir.join(format!(
        ".{PRIVATE_KEY_FILE}.tmp-{}-{}",
        std::process::id(),
        nonce()
    ));
    let written = (|| -> io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(pem.as_bytes())?;
        f.sync_all()
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(local(&tmp, "cannot write the new private key", e));
    }
    // hard_link fails with AlreadyExists instead of replacing, unlike rename.
    let linked = fs::hard_link(&tmp, path);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            sync_dir(dir);
            Ok(key)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            // Another process created the key between our check and now: use theirs.
            load_private_key(path)?.ok_or_else(|| {
                SshError::Local(format!(
                    "{}: key vanished while being created",
                    path.display()
                ))
            })
        }
        Err(e) => Err(local(path, "cannot install the new private key", e)),
    }
}

fn write_public_key(path: &Path, public_key: &str) -> Result<(), SshError> {
    let want = format!("{public_key}\n");
    if fs::read_to_string(path).ok().as_deref() == Some(want.as_str()) {
        return Ok(());
    }
    // Derived data, rewritten when stale: the directory fsync is best effort.
    let options = atomic_file::Options::new()
        .mode(0o644)
        .dir_sync_best_effort();
    atomic_file::write(path, want.as_bytes(), options)
        .map_err(|e| local(path, "cannot write the public key", e.source))
}

/// Best effort: makes a rename or link durable; some file systems do not support it and
/// the data is already safe in the common case, so failures are ignored.
fn sync_dir(dir: &Path) {
    let _ = atomic_file::sync_dir(dir);
}

fn nonce() -> u64 {
    rand::random()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_key_with_private_modes_and_reloads_same_public_key() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("keys");
        let first = ensure_project_key(&dir, "gpuprov test").unwrap();
        assert_eq!(first.private_key_path, dir.join("id_ed25519"));
        assert!(first.public_key_openssh.starts_with("ssh-ed25519 AAAA"));
        assert!(first.public_key_openssh.ends_with(" gpuprov test"));
        assert_eq!(
            fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let meta = fs::metadata(&first.private_key_path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let pem = fs::read_to_string(&first.private_key_path).unwrap();
        assert!(pem.starts_with("-----BEGIN OPENSSH PRIVATE KEY-----\n"));
        let parsed = PrivateKey::from_openssh(&pem).unwrap();
        assert_eq!(parsed.algorithm(), Algorithm::Ed25519);
        assert_eq!(
            fs::read_to_string(dir.join("id_ed25519.pub")).unwrap(),
            format!("{}\n", first.public_key_openssh)
        );
        // No temporary files are left behind.
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");

        // Second call: same key, even if the .pub file was lost or tampered with.
        fs::write(dir.join("id_ed25519.pub"), "garbage").unwrap();
        let second = ensure_project_key(&dir, "another comment").unwrap();
        assert_eq!(second, first);
        assert_eq!(fs::read_to_string(&first.private_key_path).unwrap(), pem);
        assert_eq!(
            fs::read_to_string(dir.join("id_ed25519.pub")).unwrap(),
            format!("{}\n", first.public_key_openssh)
        );
    }

    #[test]
    fn debug_of_project_key_has_no_private_material() {
        let tmp = tempfile::tempdir().unwrap();
        let key = ensure_project_key(tmp.path(), "c").unwrap();
        let pem = fs::read_to_string(&key.private_key_path).unwrap();
        let debug = format!("{key:?}");
        assert!(!debug.contains("PRIVATE KEY"));
        for line in pem.lines().filter(|l| !l.starts_with("-----")) {
            assert!(
                !debug.contains(line),
                "Debug output leaks a private key line"
            );
        }
    }

    #[test]
    fn corrupt_key_is_an_error_naming_the_path_and_is_left_untouched() {
        let tmp = tempfile::tempdir().unwrap();
        let key = ensure_project_key(tmp.path(), "c").unwrap();
        let pem = fs::read_to_string(&key.private_key_path).unwrap();
        // Truncate the base64 body: still looks like a key, but no longer parses.
        let corrupt = format!("{}\n", &pem[..pem.len() / 2]);
        fs::write(&key.private_key_path, &corrupt).unwrap();

        let err = ensure_project_key(tmp.path(), "c").unwrap_err();
        let shown = format!("{err} {err:?}");
        assert!(matches!(err, SshError::Local(_)));
        assert!(
            shown.contains(&key.private_key_path.display().to_string()),
            "{shown}"
        );
        for line in corrupt
            .lines()
            .filter(|l| !l.starts_with("-----") && l.len() > 8)
        {
            assert!(
                !shown.contains(line),
                "error leaks private key text: {shown}"
            );
        }
        assert_eq!(fs::read_to_string(&key.private_key_path).unwrap(), corrupt);
    }

    #[test]
    fn group_readable_key_is_refused_not_rewritten() {
        let tmp = tempfile::tempdir().unwrap();
        let key = ensure_project_key(tmp.path(), "c").unwrap();
        fs::set_permissions(&key.private_key_path, fs::Permissions::from_mode(0o640)).unwrap();
        let err = ensure_project_key(tmp.path(), "c").unwrap_err().to_string();
        assert!(err.contains("chmod 600"), "{err}");
        assert!(
            err.contains(&key.private_key_path.display().to_string()),
            "{err}"
        );
    }
}
