//! The project's SSH key: one key pair every machine of the project trusts. gpuprov
//! creates an ed25519 key on first use and keeps it outside the state; another machine (a
//! CI runner, a colleague's laptop) supplies the same key from the environment, a file or
//! the SSH agent ([`super::supply`]).
//!
//! Security notes (why the code looks the way it does):
//! - the private key file is created with mode 0600 at `open(2)` time, never chmod-ed
//!   afterwards, so there is no window in which another local user could read it;
//! - it is written to a temporary file first and hard-linked into place, which fails if
//!   the key already exists, so two gpuprov processes racing on first use end up with one
//!   key and nobody ever reads a half-written file;
//! - an existing key that does not parse is an error, never replaced: replacing it would
//!   lock the user out of every machine that trusts the old key;
//! - the private key text is held only inside this module's functions (or, for a key
//!   from the environment, in a [`Secret`]) and never put in an error message;
//!   [`ProjectKey`]'s `Debug` shows only where the key is and its public half;
//! - a key held in memory reaches the disk only when OpenSSH needs a file (the tunnel,
//!   an interactive `gpuprov ssh`): a 0600 file in a fresh 0700 temporary directory,
//!   removed when the last copy of the key is dropped ([`ProjectKey::openssh_identity`]).

use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ssh_key::rand_core::OsRng;
use ssh_key::{Algorithm, LineEnding, PrivateKey};

use crate::atomic_file;
use crate::provider::redact::Secret;

use super::{HostKey, SshError};

/// File name of the private key inside the key directory; the public key is next to it
/// with a `.pub` suffix, as `ssh-keygen` lays them out.
pub const PRIVATE_KEY_FILE: &str = "id_ed25519";
/// File name of the public key inside the key directory.
pub const PUBLIC_KEY_FILE: &str = "id_ed25519.pub";
/// File name, in the project directory, of the public half of a key supplied from the
/// environment or the agent: what the generated ssh config names as `IdentityFile`
/// (OpenSSH then asks the agent for the private half).
pub const SUPPLIED_PUBLIC_KEY_FILE: &str = "supplied_key.pub";

/// The project's key as gpuprov uses it: where the private half is and the public key to
/// install on machines.
///
/// Holds private key material only for [`KeySource::Memory`], inside a [`Secret`]; its
/// `Debug` never shows it.
#[derive(Debug, Clone)]
pub struct ProjectKey {
    /// One line, `ALGORITHM BASE64 [comment]`, without a trailing newline.
    pub public_key_openssh: String,
    source: KeySource,
}

/// Where the private half of a [`ProjectKey`] is.
#[derive(Debug, Clone)]
pub enum KeySource {
    /// An unencrypted OpenSSH private key file (mode 0600): the per-project key, or the
    /// file named by `--ssh-key` / `GPUPROV_SSH_KEY_FILE`.
    File(PathBuf),
    /// Private key text from the environment (`GPUPROV_SSH_PRIVATE_KEY`), kept in memory.
    Memory(Arc<MemoryKey>),
    /// The SSH agent holds the private half.
    Agent(Arc<AgentKey>),
    /// No private half on this machine (a `destroy`, which never logs in, may run
    /// without it); every login fails with this reason.
    Unavailable(String),
}

/// A private key held in memory, and the temporary file OpenSSH reads it from while one
/// is needed.
pub struct MemoryKey {
    /// Where the text came from, for messages (an environment variable's name).
    origin: String,
    /// OpenSSH private key text, normalised to LF line ends with a final newline.
    text: Secret,
    copy: Mutex<Option<TempCopy>>,
}

/// A temporary 0600 copy of a [`MemoryKey`] in its own 0700 directory; both go when it
/// is dropped.
struct TempCopy {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl std::fmt::Debug for MemoryKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryKey")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// A key the SSH agent holds: which agent, and the temporary public key file OpenSSH is
/// pointed at while one is needed.
pub struct AgentKey {
    socket: Option<PathBuf>,
    copy: Mutex<Option<TempCopy>>,
}

impl std::fmt::Debug for AgentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentKey")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

impl AgentKey {
    /// The agent's socket (`SSH_AUTH_SOCK`); `None`: libssh2's default, the same
    /// variable.
    pub fn socket(&self) -> Option<&Path> {
        self.socket.as_deref()
    }
}

impl MemoryKey {
    /// The OpenSSH private key text, for the one place that hands it to libssh2.
    pub(super) fn text(&self) -> &str {
        self.text.expose()
    }
}

impl PartialEq for ProjectKey {
    fn eq(&self, other: &Self) -> bool {
        self.public_key_openssh == other.public_key_openssh
            && match (&self.source, &other.source) {
                (KeySource::File(a), KeySource::File(b)) => a == b,
                (KeySource::Memory(a), KeySource::Memory(b)) => a.text == b.text,
                (KeySource::Agent(a), KeySource::Agent(b)) => a.socket == b.socket,
                (KeySource::Unavailable(a), KeySource::Unavailable(b)) => a == b,
                _ => false,
            }
    }
}

impl Eq for ProjectKey {}

impl ProjectKey {
    /// A key whose private half is the OpenSSH private key file at `path`, with
    /// `public_key_openssh` its public line (not checked against the file here).
    pub fn from_file(path: impl Into<PathBuf>, public_key_openssh: impl Into<String>) -> Self {
        ProjectKey {
            public_key_openssh: public_key_openssh.into(),
            source: KeySource::File(path.into()),
        }
    }

    /// Parses OpenSSH private key `text` (as `ssh-keygen` writes it: ed25519, ECDSA or
    /// RSA, unencrypted) that came from `origin` (named in errors), and keeps it in
    /// memory. CRLF line ends and missing final newlines (as CI secret stores deliver
    /// them) are normalised.
    ///
    /// Errors: [`SshError::Local`] naming `origin`, never quoting the text, when it is
    /// empty, a public key, not an OpenSSH private key, or passphrase-protected.
    pub fn from_private_key_text(origin: &str, text: &Secret) -> Result<Self, SshError> {
        let normalised = normalise_key_text(text.expose());
        Ok(ProjectKey {
            public_key_openssh: public_line_of_private_text(origin, &normalised)?,
            source: KeySource::Memory(Arc::new(MemoryKey {
                origin: origin.to_string(),
                text: Secret::new(normalised),
                copy: Mutex::new(None),
            })),
        })
    }

    /// Loads the OpenSSH private key file at `path` (mode 0600, unencrypted).
    ///
    /// Errors: [`SshError::Local`] naming the path when it is missing, unreadable,
    /// readable by group or others, not a private key, or passphrase-protected.
    pub fn load_file(path: &Path) -> Result<Self, SshError> {
        let text = read_private_file(path)?.ok_or_else(|| {
            SshError::Local(format!("{}: no such private key file", path.display()))
        })?;
        let public = public_line_of_private_text(&path.display().to_string(), &text)?;
        Ok(ProjectKey::from_file(path, public))
    }

    /// A key the SSH agent holds: `public_key_openssh` says which of its identities.
    pub fn in_agent(public_key_openssh: impl Into<String>, socket: Option<PathBuf>) -> Self {
        ProjectKey {
            public_key_openssh: public_key_openssh.into(),
            source: KeySource::Agent(Arc::new(AgentKey {
                socket,
                copy: Mutex::new(None),
            })),
        }
    }

    /// A key whose private half is not on this machine (`why` says so on every login).
    pub fn unavailable(public_key_openssh: impl Into<String>, why: impl Into<String>) -> Self {
        ProjectKey {
            public_key_openssh: public_key_openssh.into(),
            source: KeySource::Unavailable(why.into()),
        }
    }

    /// Where the private half is.
    pub fn source(&self) -> &KeySource {
        &self.source
    }

    /// The private key file, for [`KeySource::File`] only.
    pub fn private_key_path(&self) -> Option<&Path> {
        match &self.source {
            KeySource::File(p) => Some(p),
            _ => None,
        }
    }

    /// Where the key comes from, for messages: a path, an environment variable's name,
    /// or "the SSH agent".
    pub fn origin(&self) -> String {
        match &self.source {
            KeySource::File(p) => p.display().to_string(),
            KeySource::Memory(m) => m.origin.clone(),
            KeySource::Agent(_) => "the SSH agent (SSH_AUTH_SOCK)".to_string(),
            KeySource::Unavailable(_) => "no key on this machine".to_string(),
        }
    }

    /// The public key's `SHA256:` fingerprint as `ssh-keygen -lf` prints it; `None` when
    /// the public line does not parse (only a [`KeySource::Unavailable`] key may lack one).
    pub fn fingerprint(&self) -> Option<String> {
        HostKey::from_public_key_line(&self.public_key_openssh)
            .ok()
            .map(|k| k.fingerprint)
    }

    /// The raw public key blob (as the SSH protocol and the agent carry it).
    pub(super) fn public_blob(&self) -> Option<Vec<u8>> {
        HostKey::from_public_key_line(&self.public_key_openssh)
            .ok()
            .and_then(|k| k.blob())
    }

    /// A file OpenSSH can be given as `-i` / `IdentityFile` for this key, valid while
    /// this key (or a clone) lives: the key file itself; for a key in memory, a 0600 copy
    /// in a fresh 0700 temporary directory, made on first call and removed when the last
    /// clone is dropped; for a key in the agent, its public key in such a directory
    /// (OpenSSH then asks the agent for the private half).
    ///
    /// Errors: [`SshError::Local`] when the temporary file cannot be written, or the key
    /// is [`KeySource::Unavailable`].
    pub fn openssh_identity(&self) -> Result<PathBuf, SshError> {
        match &self.source {
            KeySource::File(p) => Ok(p.clone()),
            KeySource::Memory(m) => {
                let mut copy = m.copy.lock().unwrap_or_else(|e| e.into_inner());
                temp_copy(&mut copy, "id", m.text.expose())
            }
            KeySource::Agent(a) => {
                let mut copy = a.copy.lock().unwrap_or_else(|e| e.into_inner());
                temp_copy(
                    &mut copy,
                    "id.pub",
                    &format!("{}\n", self.public_key_openssh),
                )
            }
            KeySource::Unavailable(why) => Err(SshError::Local(why.clone())),
        }
    }

    /// The `IdentityFile` for the generated ssh config in `project_dir`, a file that
    /// outlives this process: the key file itself (absolute); for a key from the
    /// environment or the agent, its public half written to
    /// `project_dir/`[`SUPPLIED_PUBLIC_KEY_FILE`], so `ssh gpuprov-NAME` works once the
    /// key is in the agent and the private key is never written for it. `None` for a
    /// [`KeySource::Unavailable`] key.
    ///
    /// Errors: [`SshError::Local`] when the public key file cannot be written.
    pub fn config_identity_file(&self, project_dir: &Path) -> Result<Option<PathBuf>, SshError> {
        match &self.source {
            KeySource::File(p) => Ok(Some(std::path::absolute(p).unwrap_or_else(|_| p.clone()))),
            KeySource::Memory(_) | KeySource::Agent(_) => {
                create_private_dir(project_dir)?;
                let path = project_dir.join(SUPPLIED_PUBLIC_KEY_FILE);
                write_public_key(&path, &self.public_key_openssh)?;
                Ok(Some(std::path::absolute(&path).unwrap_or(path)))
            }
            KeySource::Unavailable(_) => Ok(None),
        }
    }
}

/// Writes `content` to a 0600 file named `name` in a fresh 0700 temporary directory kept
/// in `slot` (reused when already there). Returns the file's path.
fn temp_copy(slot: &mut Option<TempCopy>, name: &str, content: &str) -> Result<PathBuf, SshError> {
    if let Some(c) = slot.as_ref() {
        return Ok(c.path.clone());
    }
    let fail = |e: io::Error| {
        SshError::Local(format!(
            "cannot write a temporary copy of the key for ssh: {e}"
        ))
    };
    // An unguessable name, created 0700 (never looser than that under any umask).
    let dir = tempfile::Builder::new()
        .prefix("gpuprov-key-")
        .permissions(fs::Permissions::from_mode(0o700))
        .tempdir()
        .map_err(fail)?;
    let path = dir.path().join(name);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(fail)?;
    f.write_all(content.as_bytes()).map_err(fail)?;
    *slot = Some(TempCopy {
        _dir: dir,
        path: path.clone(),
    });
    Ok(path)
}

/// CRLF → LF, surrounding blank space trimmed, one final newline; a key pasted as one line
/// with literal `\n` escapes (some CI variable stores flatten it) is unfolded.
fn normalise_key_text(text: &str) -> String {
    let mut t = text.replace("\r\n", "\n").replace('\r', "\n");
    if !t.trim().contains('\n') && t.contains("\\n") {
        t = t.replace("\\n", "\n");
    }
    let mut t = t.trim().to_string();
    t.push('\n');
    t
}

/// The public key line of the unencrypted OpenSSH private key `text` that came from
/// `origin`: `ALGORITHM BASE64 comment` as ssh-key decodes it, or, for a private section
/// ssh-key cannot decode but OpenSSH wrote (an ECDSA scalar with leading zero bytes,
/// stored shorter than the curve size: every other P-521 key), `ALGORITHM BASE64` from
/// the container's public section ([`openssh_public_blob`]); libssh2 and OpenSSH read
/// such keys.
fn public_line_of_private_text(origin: &str, text: &str) -> Result<String, SshError> {
    let bad = |what: &str| SshError::Local(format!("{origin}: {what}"));
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(bad("is empty"));
    }
    if !trimmed.starts_with("-----BEGIN OPENSSH PRIVATE KEY-----") {
        if HostKey::from_public_key_line(trimmed).is_ok() {
            return Err(bad(
                "holds a public key; it must hold the private key (the file without .pub)",
            ));
        }
        return Err(bad(
            "is not an OpenSSH private key (it must start with -----BEGIN OPENSSH PRIVATE \
             KEY-----; convert a PEM key with `ssh-keygen -p -f FILE`)",
        ));
    }
    let encrypted = || {
        bad(
            "is passphrase-protected; gpuprov needs an unencrypted key (or load it into \
             the SSH agent with ssh-add)",
        )
    };
    // The parser's errors describe the format problem only (they never echo the input).
    match PrivateKey::from_openssh(text.as_bytes()) {
        Ok(key) if key.is_encrypted() => Err(encrypted()),
        Ok(key) => key
            .public_key()
            .to_openssh()
            .map_err(|e| SshError::Local(format!("{origin}: cannot encode the public key: {e}"))),
        Err(e) => match openssh_public_blob(trimmed) {
            Some((cipher, _)) if cipher != "none" => Err(encrypted()),
            Some((_, blob)) => {
                Ok(HostKey::from_blob(&blob)).map(|k| format!("{} {}", k.algorithm, k.key_base64))
            }
            None => Err(bad(&format!("is not a valid OpenSSH private key: {e}"))),
        },
    }
}

/// The cipher name and public key blob of an OpenSSH private key container
/// (`openssh-key-v1`, OpenSSH's PROTOCOL.key: magic, cipher, KDF, KDF options, one
/// public key, the private section), read without decoding the private section. `None`
/// unless the text is one whole, well-formed container holding one key whose private
/// section (when unencrypted) starts with two equal check integers and the public key's
/// type, so a truncated or damaged key is not taken for a good one.
fn openssh_public_blob(text: &str) -> Option<(String, Vec<u8>)> {
    use base64::Engine as _;
    let body: String = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("-----"))
        .collect();
    let data = base64::engine::general_purpose::STANDARD
        .decode(body)
        .ok()?;
    let mut r = Cursor(data.strip_prefix(b"openssh-key-v1\0")?);
    let cipher = String::from_utf8(r.string()?.to_vec()).ok()?;
    let (_kdf, _kdf_options) = (r.string()?, r.string()?);
    if r.u32()? != 1 {
        return None;
    }
    let public = r.string()?.to_vec();
    let mut private = Cursor(r.string()?);
    if !r.0.is_empty() {
        return None;
    }
    if cipher == "none" {
        let algorithm = HostKey::from_blob(&public).algorithm;
        let (check1, check2) = (private.u32()?, private.u32()?);
        if check1 != check2 || private.string()? != algorithm.as_bytes() {
            return None;
        }
    }
    Some((cipher, public))
}

/// Reads SSH wire data (RFC 4251 `uint32` and `string`); `None` past the end.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn u32(&mut self) -> Option<u32> {
        let (head, rest) = self.0.split_at_checked(4)?;
        self.0 = rest;
        Some(u32::from_be_bytes(head.try_into().ok()?))
    }

    fn string(&mut self) -> Option<&'a [u8]> {
        let len = self.u32()? as usize;
        let (head, rest) = self.0.split_at_checked(len)?;
        self.0 = rest;
        Some(head)
    }
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
    Ok(ProjectKey::from_file(private_key_path, public_key_openssh))
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
    let Some(text) = read_private_file(path)? else {
        return Ok(None);
    };
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
            "{}: the private key is passphrase-protected; gpuprov needs an unencrypted \
             key (or load it into the SSH agent with ssh-add)",
            path.display()
        )));
    }
    Ok(Some(key))
}

/// The text of the private key file at `path`; `Ok(None)` when there is none. OpenSSH
/// refuses a key others can read, and so does gpuprov (the ssh config would not work).
fn read_private_file(path: &Path) -> Result<Option<String>, SshError> {
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(local(path, "cannot read the private key", e)),
    };
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(SshError::Local(format!(
            "{}: the private key is accessible by group or others (mode {:o}); run \
             `chmod 600` on it",
            path.display(),
            meta.permissions().mode() & 0o777
        )));
    }
    fs::read_to_string(path)
        .map(Some)
        .map_err(|e| local(path, "cannot read the private key", e))
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
pub(crate) mod tests {
    use super::*;

    // Test-only keys made once with `ssh-keygen -q -t ed25519 -N '' -C vector-private -f k`
    // and `ssh-keygen -q -t ecdsa -b 256 -N '' -C vector-ecdsa -f e`; `ssh-keygen -lf k`
    // printed `256 SHA256:S8IhQjNX85q4ZcapWhNGp2yTrW7AbSYFf/SLF7YwOGw vector-private
    // (ED25519)` and `ssh-keygen -lf e` `256
    // SHA256:+qB348VvSQvkoHmlozvg3oY9SUkDHSx+Yt+9enY0uOQ vector-ecdsa (ECDSA)`.
    pub(crate) const ED25519_VECTOR: &str = "-----BEGIN OPENSSH PRIVATE KEY-----
b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW
QyNTUxOQAAACANUj1abw49FkXShp0Itndrdta8GBpzBDRIrcenCdXHpwAAAJh/HhSmfx4U
pgAAAAtzc2gtZWQyNTUxOQAAACANUj1abw49FkXShp0Itndrdta8GBpzBDRIrcenCdXHpw
AAAED0uaGxPuJlOoUmJ/IaBQZ6+LhsUHQxvM1R/5qGmD/RpA1SPVpvDj0WRdKGnQi2d2t2
1rwYGnMENEitx6cJ1cenAAAADnZlY3Rvci1wcml2YXRlAQIDBAUGBw==
-----END OPENSSH PRIVATE KEY-----
";
    pub(crate) const ED25519_VECTOR_FP: &str = "SHA256:S8IhQjNX85q4ZcapWhNGp2yTrW7AbSYFf/SLF7YwOGw";
    const ECDSA_VECTOR: &str = "-----BEGIN OPENSSH PRIVATE KEY-----
b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAaAAAABNlY2RzYS
1zaGEyLW5pc3RwMjU2AAAACG5pc3RwMjU2AAAAQQT1F/7xtnNMINtNYza/Fbzl8GlOkIu2
6CqqCrmbSe15JR/+ynqWCfeiLLv8bZ09dkrpIE4yK90ezgsTtC5h9rsYAAAAqP5AFEn+QB
RJAAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBPUX/vG2c0wg201j
Nr8VvOXwaU6Qi7boKqoKuZtJ7XklH/7KepYJ96Isu/xtnT12SukgTjIr3R7OCxO0LmH2ux
gAAAAhAOa9yccOmHX+uRRZygw1rdF3FMsc1wRssVGi/MQRZWFiAAAADHZlY3Rvci1lY2Rz
YQECAw==
-----END OPENSSH PRIVATE KEY-----
";
    // `ssh-keygen -q -t ecdsa -b 521 -N '' -C vector-p521 -f p`, picked among several for
    // a private scalar with a leading zero byte, which OpenSSH stores in 65 bytes and
    // ssh-key 0.6 refuses ("length invalid"); `ssh-keygen -lf p` printed `521
    // SHA256:ISeFbNnmwlzdKi+Ulzg6b45VIhSsxywkO21xkUfRNZg vector-p521 (ECDSA)`.
    const P521_SHORT_SCALAR: &str = "-----BEGIN OPENSSH PRIVATE KEY-----
b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAArAAAABNlY2RzYS
1zaGEyLW5pc3RwNTIxAAAACG5pc3RwNTIxAAAAhQQAsJie4fSI5qxg82F5sKw77jUyZ+B8
2tZWwV7NK7d1s+rtxYtqR0qs3htJnJ4fsZj58b3uAgze1U/reXV7BXn0ZUcAMIXWDvwpS0
JMxPsSWfB0SEowtICu7s9EnXs/fy7+o0WbxMybhDHmYId2tB3j2MBkPLBb4NJl73aeySHv
BFozlkcAAAEIbTH1GW0x9RkAAAATZWNkc2Etc2hhMi1uaXN0cDUyMQAAAAhuaXN0cDUyMQ
AAAIUEALCYnuH0iOasYPNhebCsO+41MmfgfNrWVsFezSu3dbPq7cWLakdKrN4bSZyeH7GY
+fG97gIM3tVP63l1ewV59GVHADCF1g78KUtCTMT7ElnwdEhKMLSAru7PRJ17P38u/qNFm8
TMm4Qx5mCHdrQd49jAZDywW+DSZe92nskh7wRaM5ZHAAAAQVa4b4lMF78ijayNLI9YzroK
H33kycYdmqep1Bfz6pPzaK6CCT/m4tX37ycBW/ezv7wOWipHDhQ/+VyluwI0b10vAAAAC3
ZlY3Rvci1wNTIx
-----END OPENSSH PRIVATE KEY-----
";

    #[test]
    fn a_key_ssh_key_cannot_decode_gets_its_public_half_from_the_container() {
        assert!(
            PrivateKey::from_openssh(P521_SHORT_SCALAR).is_err(),
            "ssh-key decodes it now: the fallback may go"
        );
        let key = ProjectKey::from_private_key_text("T", &Secret::new(P521_SHORT_SCALAR)).unwrap();
        assert_eq!(
            key.fingerprint().as_deref(),
            Some("SHA256:ISeFbNnmwlzdKi+Ulzg6b45VIhSsxywkO21xkUfRNZg")
        );
        assert!(key
            .public_key_openssh
            .starts_with("ecdsa-sha2-nistp521 AAAA"));
        // The fallback reads whole containers only: cut, or with a bad check, it refuses.
        let lines: Vec<&str> = P521_SHORT_SCALAR.lines().collect();
        let cut = format!(
            "{}\n{}\n",
            lines[..lines.len() - 3].join("\n"),
            lines[lines.len() - 1]
        );
        assert!(openssh_public_blob(&cut).is_none());
        assert!(ProjectKey::from_private_key_text("T", &Secret::new(cut)).is_err());
        assert!(openssh_public_blob(ED25519_VECTOR).is_some());
        assert!(openssh_public_blob("-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n").is_none());
    }

    /// The base64 body lines of a private key text: what must never show up anywhere.
    fn body_lines(pem: &str) -> Vec<&str> {
        pem.lines()
            .filter(|l| !l.starts_with("-----") && l.len() > 8)
            .collect()
    }

    #[test]
    fn fingerprints_of_private_keys_match_ssh_keygen() {
        let key = ProjectKey::from_private_key_text("T", &Secret::new(ED25519_VECTOR)).unwrap();
        assert_eq!(key.fingerprint().as_deref(), Some(ED25519_VECTOR_FP));
        assert_eq!(
            key.public_key_openssh,
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA1SPVpvDj0WRdKGnQi2d2t21rwYGnMENEitx6cJ1cen \
             vector-private"
        );
        let key = ProjectKey::from_private_key_text("T", &Secret::new(ECDSA_VECTOR)).unwrap();
        assert_eq!(
            key.fingerprint().as_deref(),
            Some("SHA256:+qB348VvSQvkoHmlozvg3oY9SUkDHSx+Yt+9enY0uOQ")
        );
    }

    #[test]
    fn key_text_from_ci_stores_is_normalised() {
        let crlf = ED25519_VECTOR.replace('\n', "\r\n");
        let flattened = format!("  {}  ", ED25519_VECTOR.trim_end().replace('\n', "\\n"));
        let unterminated = ED25519_VECTOR.trim_end().to_string();
        for text in [crlf, flattened, unterminated] {
            let key = ProjectKey::from_private_key_text("T", &Secret::new(text)).unwrap();
            assert_eq!(key.fingerprint().as_deref(), Some(ED25519_VECTOR_FP));
            let KeySource::Memory(m) = key.source() else {
                panic!("a key from text is held in memory");
            };
            assert_eq!(m.text(), ED25519_VECTOR);
        }
    }

    #[test]
    fn bad_key_text_is_an_error_naming_its_origin_and_never_quoting_it() {
        let public =
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA1SPVpvDj0WRdKGnQi2d2t21rwYGnMENEitx6cJ1cen";
        let half = ED25519_VECTOR[..ED25519_VECTOR.len() / 2].to_string();
        let encrypted_looking =
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----\n";
        for (text, says) in [
            ("   ", "is empty"),
            (public, "holds a public key"),
            (half.as_str(), "is not a valid OpenSSH private key"),
            (encrypted_looking, "ssh-keygen -p"),
        ] {
            let err =
                ProjectKey::from_private_key_text("GPUPROV_SSH_PRIVATE_KEY", &Secret::new(text))
                    .unwrap_err()
                    .to_string();
            assert!(err.starts_with("ssh: GPUPROV_SSH_PRIVATE_KEY: "), "{err}");
            assert!(err.contains(says), "{err}");
            for l in body_lines(&half) {
                assert!(!err.contains(l), "error quotes the key: {err}");
            }
            assert!(
                !err.contains("AAAAC3NzaC1lZDI1NTE5AAAAIA1SPVpvDj0WRdKGnQi2"),
                "{err}"
            );
        }
    }

    #[test]
    fn debug_of_a_key_in_memory_has_no_private_material() {
        let key = ProjectKey::from_private_key_text("T", &Secret::new(ED25519_VECTOR)).unwrap();
        let debug = format!("{key:?}");
        assert!(!debug.contains("PRIVATE KEY"), "{debug}");
        for l in body_lines(ED25519_VECTOR) {
            assert!(!debug.contains(l), "Debug leaks a key line: {debug}");
        }
        assert!(debug.contains("origin: \"T\""), "{debug}");
    }

    #[test]
    fn a_key_in_memory_reaches_openssh_as_a_private_temp_file_removed_with_the_key() {
        let key = ProjectKey::from_private_key_text("T", &Secret::new(ED25519_VECTOR)).unwrap();
        let path = key.openssh_identity().unwrap();
        assert_eq!(key.openssh_identity().unwrap(), path, "one copy per key");
        assert_eq!(fs::read_to_string(&path).unwrap(), ED25519_VECTOR);
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        let dir = path.parent().unwrap().to_path_buf();
        assert_eq!(mode(&dir), 0o700);
        let clone = key.clone();
        drop(key);
        assert!(path.exists(), "a clone still uses it");
        drop(clone);
        assert!(
            !path.exists() && !dir.exists(),
            "removed with the last clone"
        );
    }

    #[test]
    fn the_ssh_config_of_a_supplied_key_names_only_its_public_half() {
        let tmp = tempfile::tempdir().unwrap();
        let project = tmp.path().join("project");
        let key = ProjectKey::from_private_key_text("T", &Secret::new(ED25519_VECTOR)).unwrap();
        let file = key.config_identity_file(&project).unwrap().unwrap();
        assert_eq!(file, project.join(SUPPLIED_PUBLIC_KEY_FILE));
        assert_eq!(
            fs::read_to_string(&file).unwrap(),
            format!("{}\n", key.public_key_openssh)
        );
        let names: Vec<_> = fs::read_dir(&project)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, [SUPPLIED_PUBLIC_KEY_FILE], "no private key written");
        // A key file is named as it is; a key with no private half names nothing.
        let on_disk = ensure_project_key(&tmp.path().join("k"), "c").unwrap();
        assert_eq!(
            on_disk.config_identity_file(&project).unwrap().as_deref(),
            on_disk.private_key_path()
        );
        let none = ProjectKey::unavailable("", "not here");
        assert_eq!(none.config_identity_file(&project).unwrap(), None);
        assert!(none
            .openssh_identity()
            .unwrap_err()
            .to_string()
            .contains("not here"));
    }

    #[test]
    fn a_user_key_file_is_loaded_and_checked_like_the_project_key() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("ci_key");
        fs::write(&path, ED25519_VECTOR).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let err = ProjectKey::load_file(&path).unwrap_err().to_string();
        assert!(err.contains("chmod 600"), "{err}");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let key = ProjectKey::load_file(&path).unwrap();
        assert_eq!(key.fingerprint().as_deref(), Some(ED25519_VECTOR_FP));
        assert_eq!(key.private_key_path(), Some(path.as_path()));
        let missing = ProjectKey::load_file(&tmp.path().join("nope")).unwrap_err();
        assert!(
            missing.to_string().contains("no such private key file"),
            "{missing}"
        );
    }

    #[test]
    fn creates_key_with_private_modes_and_reloads_same_public_key() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("keys");
        let first = ensure_project_key(&dir, "gpuprov test").unwrap();
        assert_eq!(
            first.private_key_path(),
            Some(dir.join("id_ed25519").as_path())
        );
        assert!(first.public_key_openssh.starts_with("ssh-ed25519 AAAA"));
        assert!(first.public_key_openssh.ends_with(" gpuprov test"));
        assert_eq!(
            fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let meta = fs::metadata(first.private_key_path().unwrap()).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let pem = fs::read_to_string(first.private_key_path().unwrap()).unwrap();
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
        assert_eq!(
            fs::read_to_string(first.private_key_path().unwrap()).unwrap(),
            pem
        );
        assert_eq!(
            fs::read_to_string(dir.join("id_ed25519.pub")).unwrap(),
            format!("{}\n", first.public_key_openssh)
        );
    }

    #[test]
    fn debug_of_project_key_has_no_private_material() {
        let tmp = tempfile::tempdir().unwrap();
        let key = ensure_project_key(tmp.path(), "c").unwrap();
        let pem = fs::read_to_string(key.private_key_path().unwrap()).unwrap();
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
        let pem = fs::read_to_string(key.private_key_path().unwrap()).unwrap();
        // Truncate the base64 body: still looks like a key, but no longer parses.
        let corrupt = format!("{}\n", &pem[..pem.len() / 2]);
        fs::write(key.private_key_path().unwrap(), &corrupt).unwrap();

        let err = ensure_project_key(tmp.path(), "c").unwrap_err();
        let shown = format!("{err} {err:?}");
        assert!(matches!(err, SshError::Local(_)));
        assert!(
            shown.contains(&key.private_key_path().unwrap().display().to_string()),
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
        assert_eq!(
            fs::read_to_string(key.private_key_path().unwrap()).unwrap(),
            corrupt
        );
    }

    #[test]
    fn group_readable_key_is_refused_not_rewritten() {
        let tmp = tempfile::tempdir().unwrap();
        let key = ensure_project_key(tmp.path(), "c").unwrap();
        fs::set_permissions(
            key.private_key_path().unwrap(),
            fs::Permissions::from_mode(0o640),
        )
        .unwrap();
        let err = ensure_project_key(tmp.path(), "c").unwrap_err().to_string();
        assert!(err.contains("chmod 600"), "{err}");
        assert!(
            err.contains(&key.private_key_path().unwrap().display().to_string()),
            "{err}"
        );
    }
}
