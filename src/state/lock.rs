//! The state lock: an exclusive advisory lock on `<state>.lock`, recording its holder.
//!
//! The lock is an OS file lock (`flock(2)` on Unix, `LockFileEx` on Windows, through fs4),
//! so it dies with the process that holds it: a crashed or killed gpuprov can never leave
//! the state locked. What it can leave behind is the *record* of who held it (the JSON
//! [`LockInfo`] inside the lock file); the next [`StateLock::acquire`] reports that record
//! as stale and overwrites it.
//!
//! Locks are taken per open file description, so two `StateLock`s in one process conflict
//! just as two processes do.

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use fs4::fs_std::FileExt;
use miette::Diagnostic;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::config::BackendKind;

use super::backend::{Backend, LockAttempt, LockHandle};
use super::{sibling, GPUPROV_VERSION};

/// Returns the lock file path for a state file (`<state_path>.lock`).
pub fn lock_path(state_path: &Path) -> PathBuf {
    sibling(state_path, ".lock")
}

/// Who holds (or held) the state lock; stored as JSON in the lock file.
///
/// Every field has a default when reading, so a record written by another gpuprov
/// release is still shown as far as it can be.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LockInfo {
    /// A UUID (v4) naming this lock acquisition; `gpuprov force-unlock` takes it.
    pub id: String,
    /// The command holding the lock, for example `"apply"`.
    pub operation: String,
    /// `user@host` of the holder.
    pub who: String,
    /// The holder's process id on that host.
    pub pid: u32,
    /// The holder's gpuprov release.
    pub version: String,
    /// When the lock was taken (UTC).
    pub created: DateTime<Utc>,
    /// The state the lock protects (a path, `s3://bucket/key`, a PostgreSQL row).
    pub path: PathBuf,
    /// The CI job holding the lock, when run from CI (a run URL; see
    /// [`super::backend::ci_job`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ci: Option<String>,
}

impl LockInfo {
    /// Returns the holder record in the lock file of `state_path`, or `None` when there
    /// is no lock file, it is empty (no holder), or it cannot be read or parsed.
    ///
    /// This is for display only: whether the lock is actually held is decided by the OS
    /// lock, not by this record.
    pub fn read(state_path: &Path) -> Option<LockInfo> {
        let bytes = std::fs::read(lock_path(state_path)).ok()?;
        parse_info(&bytes)
    }

    fn render(&self, out: &mut String) {
        // Terraform's layout, which users already know how to read.
        let _ = writeln!(out, "Lock Info:");
        let _ = writeln!(out, "  ID:        {}", self.id);
        let _ = writeln!(out, "  Path:      {}", self.path.display());
        let _ = writeln!(out, "  Operation: {}", self.operation);
        let _ = writeln!(out, "  Who:       {}", self.who);
        let _ = writeln!(out, "  PID:       {}", self.pid);
        let _ = writeln!(out, "  Version:   {}", self.version);
        if let Some(ci) = &self.ci {
            let _ = writeln!(out, "  CI job:    {ci}");
        }
        let _ = write!(
            out,
            "  Created:   {}",
            self.created
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        );
    }
}

/// The result of [`force_unlock`].
#[derive(Debug, Clone, PartialEq)]
pub struct ForceUnlockOutcome {
    /// The stale holder record that was cleared.
    pub cleared: LockInfo,
}

/// An error taking, releasing or force-unlocking the state lock.
#[derive(Debug, Error, Diagnostic)]
pub enum LockError {
    /// A filesystem call on the lock file failed.
    #[error("could not {action} `{}`", path.display())]
    #[diagnostic(code(gpuprov::state::lock::io))]
    Io {
        /// What gpuprov was doing, as a short lowercase phrase.
        action: &'static str,
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// A remote store could not be asked about the lock (or refused a lock write for a
    /// reason other than the lock being held).
    #[error("could not {action} the state lock at `{}`: {reason}", location.display())]
    #[diagnostic(code(gpuprov::state::lock::store))]
    Store {
        /// What gpuprov was doing, as a short lowercase phrase.
        action: &'static str,
        /// The lock object or row (no secrets).
        location: PathBuf,
        /// The store's answer, scrubbed of secrets.
        reason: String,
    },

    /// Another process held the lock for the whole timeout.
    #[error("{}", held_message(lock_path, info.as_deref(), *waited))]
    #[diagnostic(code(gpuprov::state::lock::held), help("{}", held_help(info.as_deref())))]
    Held {
        /// The lock file.
        lock_path: PathBuf,
        /// The holder's record, if it could be read (it is written just after the OS lock
        /// is taken, so a holder that has just started may not have one yet).
        info: Option<Box<LockInfo>>,
        /// How long acquire waited.
        waited: Duration,
    },

    /// `force-unlock` found no holder record: there is nothing to unlock.
    #[error("the state is not locked: `{}` holds no lock record", lock_path.display())]
    #[diagnostic(code(gpuprov::state::lock::not_locked))]
    NotLocked {
        /// The lock file.
        lock_path: PathBuf,
    },

    /// `force-unlock` was given an id that is not the recorded holder's.
    #[error("lock id `{given}` does not match the lock in `{}`, whose id is `{actual}`", lock_path.display())]
    #[diagnostic(
        code(gpuprov::state::lock::id_mismatch),
        help("check the id: it is the `ID:` line of the lock error (`gpuprov force-unlock {actual}`)")
    )]
    IdMismatch {
        /// The lock file.
        lock_path: PathBuf,
        /// The id passed to force-unlock.
        given: String,
        /// The id in the lock file.
        actual: String,
    },

    /// `force-unlock` refused because the holder is still alive and holds the OS lock.
    #[error(
        "the state lock {} is still held by a running process ({} pid {}, operation {})",
        info.id, info.who, info.pid, info.operation
    )]
    #[diagnostic(
        code(gpuprov::state::lock::still_held),
        help("stop that process first (or wait for it to finish); its lock is released as soon as it exits, so force-unlock is only needed to clear a stale record")
    )]
    StillHeld {
        /// The lock file.
        lock_path: PathBuf,
        /// The live holder's record.
        info: Box<LockInfo>,
    },
}

fn lock_io(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> LockError {
    let path = path.to_path_buf();
    move |source| LockError::Io {
        action,
        path,
        source,
    }
}

fn held_message(lock_path: &Path, info: Option<&LockInfo>, waited: Duration) -> String {
    let mut out = format!(
        "Error acquiring the state lock: `{}` is held by another process (waited {} ms)\n\n",
        lock_path.display(),
        waited.as_millis()
    );
    match info {
        Some(info) => info.render(&mut out),
        None => out.push_str("Lock Info: unavailable (the holder has not recorded it yet)"),
    }
    out
}

fn held_help(info: Option<&LockInfo>) -> String {
    let force = match info {
        Some(info) if !info.id.is_empty() => format!("gpuprov force-unlock {}", info.id),
        _ => "gpuprov force-unlock ID".to_string(),
    };
    format!(
        "another gpuprov command is using this state. Wait for it, or retry with a longer \
         `--lock-timeout` (for example `--lock-timeout 5m`). If that process is stuck, stop \
         it; if a record remains afterwards, `{force}` clears it"
    )
}

/// Parses a lock record; empty (released) or unreadable content is `None`.
pub(super) fn parse_info(bytes: &[u8]) -> Option<LockInfo> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    serde_json::from_slice(bytes).ok()
}

/// A held state lock, on any backend; released on [`StateLock::release`] or on drop.
#[derive(Debug)]
pub struct StateLock {
    /// `None` once released, so drop does not release twice.
    handle: Option<Box<dyn LockHandle>>,
    lock_path: PathBuf,
    info: LockInfo,
}

impl StateLock {
    /// Takes the local state file's lock; [`StateLock::acquire_on`] with a
    /// [`LocalBackend`](super::backend::local::LocalBackend) for `state_path`.
    ///
    /// The lock file `<state_path>.lock` is created if needed and kept afterwards
    /// (deleting it would race with other lockers).
    ///
    /// # Errors
    ///
    /// As [`StateLock::acquire_on`].
    pub fn acquire(
        state_path: &Path,
        operation: &str,
        timeout: Duration,
    ) -> Result<(StateLock, Option<LockInfo>), LockError> {
        Self::acquire_on(
            &super::backend::local::LocalBackend::new(state_path),
            operation,
            timeout,
        )
    }

    /// Takes the exclusive lock of `backend`'s state on behalf of `operation` (for
    /// example `"apply"`), retrying at the backend's poll interval for up to `timeout`
    /// (`Duration::ZERO` tries once). The holder record (who, host, pid, operation, time,
    /// CI job) is written with the lock.
    ///
    /// Returns the lock and, if a holder that died without releasing left a record the
    /// backend could take over, that stale record (so the caller can report it).
    ///
    /// This blocks the calling thread while waiting; from async code call it inside
    /// `block_in_place` or `spawn_blocking`.
    ///
    /// # Errors
    ///
    /// [`LockError::Held`] naming the holder when the timeout expires, else the backend's
    /// [`LockError`] when it could not be asked.
    pub fn acquire_on(
        backend: &dyn Backend,
        operation: &str,
        timeout: Duration,
    ) -> Result<(StateLock, Option<LockInfo>), LockError> {
        let location = backend.location();
        let info = LockInfo {
            id: uuid::Uuid::new_v4().to_string(),
            operation: operation.to_string(),
            who: who(),
            pid: std::process::id(),
            version: GPUPROV_VERSION.to_string(),
            created: Utc::now(),
            path: location.clone(),
            ci: super::backend::ci_job(),
        };
        let start = Instant::now();
        loop {
            match backend.try_lock(&info)? {
                LockAttempt::Acquired { handle, stale } => {
                    let lock = StateLock {
                        handle: Some(handle),
                        lock_path: lock_location(backend),
                        info,
                    };
                    return Ok((lock, stale));
                }
                LockAttempt::Held(holder) => {
                    let waited = start.elapsed();
                    if waited >= timeout {
                        return Err(LockError::Held {
                            info: holder.map(Box::new),
                            lock_path: lock_location(backend),
                            waited,
                        });
                    }
                    std::thread::sleep(backend.lock_poll_interval().min(timeout - waited));
                }
            }
        }
    }

    /// Returns this acquisition's holder record (its `id` is what force-unlock takes).
    pub fn info(&self) -> &LockInfo {
        &self.info
    }

    /// Returns where the lock lives (the lock file, object or row).
    pub fn lock_path(&self) -> &Path {
        &self.lock_path
    }

    /// Clears the holder record and releases the lock, reporting errors (drop ignores
    /// them). Release only after the final state save.
    ///
    /// # Errors
    ///
    /// [`LockError`] if the record cannot be cleared; a local lock is released anyway
    /// when its file is closed.
    pub fn release(mut self) -> Result<(), LockError> {
        match self.handle.take() {
            Some(handle) => handle.release(),
            None => Ok(()),
        }
    }
}

impl Drop for StateLock {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            // Nothing useful to do with an error here: a leftover record is reported as
            // stale (or cleared with force-unlock) next time.
            let _ = handle.release();
        }
    }
}

/// Where `backend` keeps its lock, for messages: `<state>.lock` for files and objects,
/// the state's location for PostgreSQL.
fn lock_location(backend: &dyn Backend) -> PathBuf {
    match backend.kind() {
        BackendKind::Postgres => backend.location(),
        _ => sibling(&backend.location(), ".lock"),
    }
}

/// One attempt to take the local lock of `state_path` (see [`StateLock::acquire_on`]).
pub(super) fn try_lock_file(state_path: &Path, info: &LockInfo) -> Result<LockAttempt, LockError> {
    let lock_path = lock_path(state_path);
    // No truncate: the file may hold the live holder's record.
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(lock_io("open lock file", &lock_path))?;
    if !FileExt::try_lock_exclusive(&file).map_err(lock_io("lock", &lock_path))? {
        return Ok(LockAttempt::Held(LockInfo::read(state_path)));
    }
    // If anything below fails, dropping `file` closes it, which releases the OS lock.
    let stale = read_all(&mut file, &lock_path).map(|b| parse_info(&b))?;
    let record = serde_json::to_vec_pretty(info).map_err(|e| LockError::Io {
        action: "serialize lock record for",
        path: lock_path.clone(),
        source: io::Error::other(e),
    })?;
    overwrite(&mut file, &lock_path, &record)?;
    Ok(LockAttempt::Acquired {
        handle: Box::new(FileLock { file, lock_path }),
        stale,
    })
}

/// A held local lock: the open, locked lock file.
#[derive(Debug)]
struct FileLock {
    file: File,
    lock_path: PathBuf,
}

impl LockHandle for FileLock {
    fn release(self: Box<Self>) -> Result<(), LockError> {
        release_file(self.file, &self.lock_path)
    }
}

/// Clears the record, then unlocks: the other order would let a new holder's record be
/// truncated by us.
fn release_file(mut file: File, lock_path: &Path) -> Result<(), LockError> {
    let cleared = overwrite(&mut file, lock_path, b"");
    let unlocked = FileExt::unlock(&file).map_err(lock_io("unlock", lock_path));
    cleared.and(unlocked)
}

fn read_all(file: &mut File, lock_path: &Path) -> Result<Vec<u8>, LockError> {
    let mut bytes = Vec::new();
    file.seek(SeekFrom::Start(0))
        .and_then(|_| file.read_to_end(&mut bytes))
        .map_err(lock_io("read lock file", lock_path))?;
    Ok(bytes)
}

/// Replaces the lock file's record. Not fsynced: the lock is the OS lock, which dies with
/// its holder, and the record only says who holds it while the holder runs (other
/// processes read it from the page cache); after a crash a lost or torn record is a
/// stale one, which a new holder overwrites.
fn overwrite(file: &mut File, lock_path: &Path, bytes: &[u8]) -> Result<(), LockError> {
    file.set_len(0)
        .and_then(|()| file.seek(SeekFrom::Start(0)))
        .and_then(|_| file.write_all(bytes))
        .map_err(lock_io("write lock file", lock_path))
}

fn who() -> String {
    let user = whoami::fallible::username().unwrap_or_else(|_| "unknown".to_string());
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    format!("{user}@{host}")
}

/// Clears a stale lock record for `state_path` whose id is `id`.
///
/// Local locks are advisory OS locks that die with their process, so a dead holder never
/// keeps the state locked; all that can remain is its record in the lock file. This
/// function therefore only clears records: it takes the OS lock itself to prove the holder
/// is gone, and refuses while a live process holds the lock, because clearing a live
/// holder's record would not stop it writing the state.
///
/// # Errors
///
/// - [`LockError::NotLocked`]: no lock file or no record in it.
/// - [`LockError::IdMismatch`]: the record's id is not `id` (the error names the actual id).
/// - [`LockError::StillHeld`]: a running process holds the lock ("stop that process first").
/// - [`LockError::Io`]: the lock file could not be read, locked or written.
pub fn force_unlock(state_path: &Path, id: &str) -> Result<ForceUnlockOutcome, LockError> {
    let lock_path = lock_path(state_path);
    let mut file = match OpenOptions::new().read(true).write(true).open(&lock_path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(LockError::NotLocked { lock_path });
        }
        Err(e) => return Err(lock_io("open lock file", &lock_path)(e)),
    };
    let check = |info: Option<LockInfo>, lock_path: &Path| match info {
        None => Err(LockError::NotLocked {
            lock_path: lock_path.to_path_buf(),
        }),
        Some(info) if info.id != id => Err(LockError::IdMismatch {
            lock_path: lock_path.to_path_buf(),
            given: id.to_string(),
            actual: info.id,
        }),
        Some(info) => Ok(info),
    };
    let info = check(parse_info(&read_all(&mut file, &lock_path)?), &lock_path)?;
    if !FileExt::try_lock_exclusive(&file).map_err(lock_io("lock", &lock_path))? {
        return Err(LockError::StillHeld {
            lock_path,
            info: Box::new(info),
        });
    }
    // Re-read under the lock: the record may have changed between the first read and
    // taking the lock (a holder released it, or a new one took and released it).
    let outcome = read_all(&mut file, &lock_path)
        .and_then(|bytes| check(parse_info(&bytes), &lock_path))
        .and_then(|info| {
            overwrite(&mut file, &lock_path, b"")?;
            Ok(ForceUnlockOutcome { cleared: info })
        });
    let unlocked = FileExt::unlock(&file).map_err(lock_io("unlock", &lock_path));
    let outcome = outcome?;
    unlocked?;
    Ok(outcome)
}
