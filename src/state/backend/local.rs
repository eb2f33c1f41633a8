//! The local backend: the state file and its siblings, exactly as before backends
//! existed (`gpuprov.state.json`, `.backup`, `.journal`, `.errored`, `.lock`).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use crate::config::BackendKind;
use crate::state::error::StateError;
use crate::state::file::{sync_parent, write_atomic};
use crate::state::lock::{self, ForceUnlockOutcome, LockError, LockInfo};
use crate::state::wal::journal_path;
use crate::state::{backup_path, errored_path};

use super::{Backend, JournalBytes, JournalSink, LockAttempt, Stored, Version};

/// The local file backend for the state at `path`.
#[derive(Debug, Clone)]
pub struct LocalBackend {
    path: PathBuf,
}

impl LocalBackend {
    /// The backend of the state file at `path` (which need not exist yet).
    pub fn new(path: impl Into<PathBuf>) -> LocalBackend {
        LocalBackend { path: path.into() }
    }

    /// The state file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Backend for LocalBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Local
    }

    fn location(&self) -> PathBuf {
        self.path.clone()
    }

    fn read_state(&self) -> Result<Option<Stored>, StateError> {
        match fs::read(&self.path) {
            Ok(bytes) => Ok(Some(Stored {
                bytes,
                version: Version(String::new()),
            })),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StateError::io("read state file", &self.path, e)),
        }
    }

    fn write_state(
        &self,
        bytes: &[u8],
        _expected: Option<&Version>,
    ) -> Result<Version, StateError> {
        // The fs4 lock fences local writers: it cannot be broken while its holder lives.
        write_atomic(&self.path, bytes)?;
        Ok(Version(String::new()))
    }

    fn write_backup(&self, bytes: &[u8]) -> Result<(), StateError> {
        write_atomic(&backup_path(&self.path), bytes)
    }

    fn errored_path(&self) -> PathBuf {
        errored_path(&self.path)
    }

    fn read_journals(&self) -> Result<Vec<JournalBytes>, StateError> {
        let path = journal_path(&self.path);
        match fs::read(&path) {
            Ok(bytes) => Ok(vec![JournalBytes {
                location: path,
                bytes,
            }]),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(StateError::io("read state journal", &path, e)),
        }
    }

    fn start_journal(&self, header: &[u8]) -> Result<Box<dyn JournalSink>, StateError> {
        let path = journal_path(&self.path);
        // Truncates a folded journal; the fold is durable before this is called.
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)
            .map_err(|e| StateError::io("create state journal", &path, e))?;
        file.write_all(header)
            .and_then(|_| file.sync_all())
            .map_err(|e| StateError::io("write state journal", &path, e))?;
        sync_parent(&path)?;
        Ok(Box::new(FileJournal {
            path,
            file: Mutex::new(file),
        }))
    }

    fn try_lock(&self, info: &LockInfo) -> Result<LockAttempt, LockError> {
        lock::try_lock_file(&self.path, info)
    }

    fn lock_poll_interval(&self) -> Duration {
        Duration::from_millis(100)
    }

    fn lock_info(&self) -> Result<Option<LockInfo>, LockError> {
        Ok(LockInfo::read(&self.path))
    }

    fn force_unlock(&self, id: &str) -> Result<ForceUnlockOutcome, LockError> {
        lock::force_unlock(&self.path, id)
    }
}

/// The journal file of one run, appended to and fsynced per batch.
struct FileJournal {
    path: PathBuf,
    file: Mutex<File>,
}

impl JournalSink for FileJournal {
    fn append(&self, batch: &[u8]) -> Result<(), String> {
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        file.write_all(batch)
            .and_then(|()| file.sync_data())
            .map_err(|e| e.to_string())
    }

    fn remove(&self) -> Result<(), StateError> {
        match fs::remove_file(&self.path) {
            Ok(()) => sync_parent(&self.path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StateError::io("delete folded state journal", &self.path, e)),
        }
    }
}
