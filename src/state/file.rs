//! Reading and atomically writing the state file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::atomic_file;

use super::backend::{local::LocalBackend, Backend, Version};
use super::error::{CorruptState, StateError};
use super::split;
use super::wal::{self, JournalWriter, Replayed};
use super::{backup_path, StateFile, GPUPROV_VERSION, STATE_FORMAT_VERSION};

/// Owns the state file's path for one run: it read the file once at [`StateStore::open`]
/// and writes it back with [`StateStore::save`] / [`StateStore::save_final`].
///
/// There is no way to get a store for a file that could not be parsed, so such a file is
/// never overwritten. Callers hold the [`super::StateLock`] for as long as they hold a
/// store that will save.
#[derive(Debug)]
pub struct StateStore {
    backend: Arc<dyn Backend>,
    /// The backend's location, for messages.
    path: PathBuf,
    /// The bytes read at open, if the file existed; written to `.backup` on first save.
    original: Option<Vec<u8>>,
    /// The stored document's version at open (then after each save), compared on write
    /// so a writer whose lock was broken cannot overwrite a newer state.
    version: Option<Version>,
    /// The lineage read at open, if the file existed; saves must not change it.
    lineage: Option<String>,
    backup_written: bool,
    /// What [`wal::replay`] found beside the file at open.
    journal: Replayed,
}

impl StateStore {
    /// Reads the state file at `path`.
    ///
    /// A missing file gives a fresh [`StateFile::new`] (serial 0, new lineage). The
    /// write-ahead journal beside it, if a run left one, is replayed onto the returned
    /// state (see [`super::wal`]); without a state file, the journal's lineage is adopted.
    ///
    /// # Errors
    ///
    /// - [`StateError::Corrupt`]: the file is empty, truncated, not JSON, or has a field of
    ///   the wrong type; the diagnostic points at the line and column.
    /// - [`StateError::NewerVersion`]: its `version` is above [`STATE_FORMAT_VERSION`].
    /// - [`StateError::Io`]: it could not be read (for example `path` is a directory).
    /// - [`StateError::CorruptJournal`] / [`StateError::JournalMismatch`]: the journal
    ///   beside it cannot be applied.
    ///
    /// In every error case the files are left untouched.
    pub fn open(path: impl AsRef<Path>) -> Result<(StateStore, StateFile), StateError> {
        Self::open_in(Arc::new(LocalBackend::new(path.as_ref())))
    }

    /// Reads the state stored in `backend`, as [`StateStore::open`] does for a file.
    ///
    /// # Errors
    ///
    /// As [`StateStore::open`], and the backend's [`StateError::Store`] when it cannot be
    /// read.
    pub fn open_in(backend: Arc<dyn Backend>) -> Result<(StateStore, StateFile), StateError> {
        // A reader can race a writer that folds its journal and starts the next one
        // between our two reads; reading both again resolves it.
        let mut attempt = 0;
        loop {
            match Self::open_once(&backend) {
                Err(StateError::JournalMismatch { .. }) if attempt < 3 => {
                    attempt += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                other => return other,
            }
        }
    }

    fn open_once(backend: &Arc<dyn Backend>) -> Result<(StateStore, StateFile), StateError> {
        let path = backend.location();
        let (original, version, mut state) = match backend.read_state()? {
            Some(stored) => {
                let state = parse(&path, &stored.bytes)?;
                (Some(stored.bytes), Some(stored.version), state)
            }
            None => (None, None, StateFile::new()),
        };
        let existed = original.is_some();
        let journal = wal::replay(&backend.read_journals()?, &mut state, existed)?;
        let store = StateStore {
            backend: backend.clone(),
            path,
            lineage: (existed || journal != Replayed::None).then(|| state.lineage.clone()),
            original,
            version,
            backup_written: false,
            journal,
        };
        Ok((store, state))
    }

    /// Starts this run's write-ahead journal (`<path>.journal`) for `state`. A journal
    /// replayed at open is folded into the state file first, so no change is lost.
    ///
    /// # Errors
    ///
    /// As [`StateStore::save`] for the fold, [`StateError::Io`] if the journal cannot be
    /// created and made durable.
    pub fn begin_journal(&mut self, state: &mut StateFile) -> Result<JournalWriter, StateError> {
        if matches!(self.journal, Replayed::Applied { .. }) {
            self.save(state)?;
        }
        // Truncates an already-folded journal; the fold above is durable before that.
        let writer = JournalWriter::start(&*self.backend, &state.lineage, state.serial)?;
        self.journal = Replayed::None;
        self.lineage = Some(state.lineage.clone());
        Ok(writer)
    }

    /// Whether a journal of an unfinished run was replayed at open (its changes are in
    /// the returned state but not yet in the file).
    pub fn replayed_journal(&self) -> bool {
        matches!(self.journal, Replayed::Applied { .. })
    }

    /// Returns the state's location (the file's path, `s3://bucket/key`, …).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The backend this store reads and writes.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The bytes of the stored document as read at open (`None`: there was none).
    pub fn original_bytes(&self) -> Option<&[u8]> {
        self.original.as_deref()
    }

    /// Returns the path of the backup written on the first save (`<path>.backup`).
    pub fn backup_path(&self) -> PathBuf {
        backup_path(&self.path)
    }

    /// Returns the path the final state goes to if [`StateStore::save_final`] fails
    /// (`<path>.errored`).
    pub fn errored_path(&self) -> PathBuf {
        self.backend.errored_path()
    }

    /// Writes `state` to the file atomically, after incrementing its `serial` and setting
    /// `gpuprov_version` to this build.
    ///
    /// The write goes to a temp file in the same directory, which is fsynced and renamed
    /// over the target, and then the directory is fsynced, so a crash leaves either the
    /// old or the new file, never a torn one. Before the first save of this store, if the
    /// file existed at open, the bytes read then are written (atomically) to
    /// `<path>.backup`.
    ///
    /// On error `state.serial` is left as it was and the target file is unchanged.
    ///
    /// # Errors
    ///
    /// [`StateError::Io`] naming the file and step that failed,
    /// [`StateError::LineageMismatch`] if `state` belongs to another lineage than the file
    /// read at open.
    pub fn save(&mut self, state: &mut StateFile) -> Result<(), StateError> {
        if let Some(on_disk) = &self.lineage {
            if *on_disk != state.lineage {
                return Err(StateError::LineageMismatch {
                    path: self.path.clone(),
                    on_disk: on_disk.clone(),
                    given: state.lineage.clone(),
                });
            }
        }
        if !self.backup_written {
            if let Some(original) = &self.original {
                self.backend.write_backup(original)?;
            }
            self.backup_written = true;
        }
        let previous = (state.serial, state.gpuprov_version.clone());
        state.serial = state.serial.saturating_add(1);
        state.gpuprov_version = GPUPROV_VERSION.to_string();
        let result = to_json(&self.path, state)
            .and_then(|bytes| self.backend.write_state(&bytes, self.version.as_ref()));
        match result {
            Ok(version) => {
                self.version = Some(version);
                Ok(())
            }
            Err(e) => {
                (state.serial, state.gpuprov_version) = previous;
                Err(e)
            }
        }
    }

    /// Replaces the stored document with `bytes` exactly as given (`state push`, a
    /// migration's destination), compared against the version read at open. `bytes` must
    /// parse as a state this build can read; its serial and lineage are kept as they are.
    ///
    /// # Errors
    ///
    /// [`StateError::Corrupt`] and friends when `bytes` is not a valid state (nothing is
    /// written), [`StateError::Conflict`] when the store moved on since open, else the
    /// backend's error.
    pub fn write_exact(&mut self, bytes: &[u8]) -> Result<(), StateError> {
        parse(&self.path, bytes)?;
        if !self.backup_written {
            if let Some(original) = &self.original {
                self.backend.write_backup(original)?;
            }
            self.backup_written = true;
        }
        let version = self.backend.write_state(bytes, self.version.as_ref())?;
        self.version = Some(version);
        Ok(())
    }

    /// Deletes every journal stored for this state (`state push --force` over an
    /// unfinished run, whose changes the pushed state replaces).
    ///
    /// # Errors
    ///
    /// The backend's [`StateError`].
    pub fn discard_journals(&mut self) -> Result<(), StateError> {
        let lineage = self.lineage.clone().unwrap_or_default();
        let writer = JournalWriter::start(&*self.backend, &lineage, 0)?;
        writer.remove()?;
        self.journal = Replayed::None;
        Ok(())
    }

    /// Saves like [`StateStore::save`]; if that fails, writes the state (with its serial
    /// incremented) to `<path>.errored` so it is not lost.
    ///
    /// Use this for the last save of a command, after which the lock is released.
    ///
    /// # Errors
    ///
    /// [`StateError::FinalSaveFailed`] when the state went to the `.errored` file (its
    /// help says how to move it back), or [`StateError::FinalSaveLost`] carrying the state
    /// JSON when even that write failed.
    pub fn save_final(&mut self, state: &mut StateFile) -> Result<(), StateError> {
        let source = match self.save(state) {
            Ok(()) => return Ok(()),
            Err(e) => Box::new(e),
        };
        // The errored copy is newer than whatever is on disk, so it carries the next
        // serial: after `mv`, a saved plan made before this run is correctly stale.
        state.serial = state.serial.saturating_add(1);
        state.gpuprov_version = GPUPROV_VERSION.to_string();
        let errored = self.errored_path();
        let bytes = to_json(&self.path, state)?;
        match write_atomic(&errored, &bytes) {
            Ok(()) => Err(StateError::FinalSaveFailed {
                path: self.path.clone(),
                errored,
                source,
            }),
            Err(e) => Err(StateError::FinalSaveLost {
                path: self.path.clone(),
                errored,
                source,
                errored_error: Box::new(e),
                state_json: String::from_utf8_lossy(&bytes).into_owned(),
            }),
        }
    }
}

/// Parses and version-checks the bytes of an existing state file.
pub(crate) fn parse(path: &Path, bytes: &[u8]) -> Result<StateFile, StateError> {
    let corrupt =
        |e: &serde_json::Error| StateError::Corrupt(Box::new(CorruptState::new(path, bytes, e)));
    // One typed parse (a 10,000-machine state is 16 MB); the version is checked on its
    // result, and only when the bytes do not fit our types is the version read alone, so
    // a newer format says "upgrade gpuprov" rather than a type error. Older formats would
    // be migrated here; version 1 is the first.
    // UTF-8 checked once for the whole file, not string by string (a tenth of the parse);
    // bytes that are not UTF-8 take the slice parser, whose error says where.
    // A large file's records are read on every core (`super::split`), falling back to
    // this one-piece parse, which names any error.
    let parsed = match std::str::from_utf8(bytes) {
        Ok(text) => match split_parts(text.len()).and_then(|parts| split::parse(text, parts)) {
            Some(state) => Ok(state),
            None => serde_json::from_str(text),
        },
        Err(_) => serde_json::from_slice(bytes),
    };
    let state: StateFile = match parsed {
        Ok(state) => state,
        Err(e) => {
            newer_version(path, version_of(bytes))?;
            return Err(corrupt(&e));
        }
    };
    newer_version(path, Some(u64::from(state.version)))?;
    // The lineage names per-project directories and labels cloud objects: only a UUID
    // is acceptable (a hand-edited `../..` must never become a path).
    if uuid::Uuid::parse_str(&state.lineage).is_err() {
        return Err(StateError::InvalidLineage {
            path: path.to_path_buf(),
            lineage: state.lineage,
        });
    }
    Ok(state)
}

/// Into how many runs a state file of `len` bytes is cut: one per core, `None` (one
/// piece) for a small file or a single core.
fn split_parts(len: usize) -> Option<usize> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    (len >= split::SPLIT_FROM && cores > 1).then_some(cores)
}

/// The `version` of a state file's bytes alone, when they are a JSON object with a
/// numeric one (every other field skipped).
fn version_of(bytes: &[u8]) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Version {
        version: Option<serde_json::Value>,
    }
    serde_json::from_slice::<Version>(bytes)
        .ok()?
        .version?
        .as_u64()
}

/// `NewerVersion` when `found` is above the format this release reads.
fn newer_version(path: &Path, found: Option<u64>) -> Result<(), StateError> {
    match found {
        Some(found) if found > u64::from(STATE_FORMAT_VERSION) => Err(StateError::NewerVersion {
            path: path.to_path_buf(),
            found,
            supported: STATE_FORMAT_VERSION,
        }),
        _ => Ok(()),
    }
}

/// Serializes the state as pretty JSON with a trailing newline.
pub(crate) fn to_json(path: &Path, state: &StateFile) -> Result<Vec<u8>, StateError> {
    let mut bytes = serde_json::to_vec_pretty(state).map_err(|source| StateError::Serialize {
        path: path.to_path_buf(),
        source,
    })?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// Replaces `target` with `bytes` atomically: temp file in the same directory (so the
/// rename does not cross filesystems), write, fsync, rename, fsync of the directory (so
/// the rename itself survives a power loss). A replaced file keeps its permissions.
pub fn write_atomic(target: &Path, bytes: &[u8]) -> Result<(), StateError> {
    atomic_file::write(target, bytes, atomic_file::Options::new()).map_err(io_error)
}

/// Fsyncs the directory holding `path`, so a create, rename or delete in it is durable.
pub(super) fn sync_parent(path: &Path) -> Result<(), StateError> {
    atomic_file::sync_dir(atomic_file::parent_dir(path)).map_err(io_error)
}

fn io_error(e: atomic_file::Error) -> StateError {
    StateError::io(e.step, &e.path, e.source)
}
