//! The write-ahead journal beside the state file (`<state>.journal`).
//!
//! During `apply` and `destroy` every machine transition must be durable before the next
//! side effect of that resource (design 4.2). Rewriting the whole JSON state for each
//! transition costs O(N) bytes per transition and O(N²) per run, so a run instead appends
//! one small JSON line per transition to the journal and fsyncs it, and the state file is
//! rewritten once, at the end (the *fold*), after which the journal is deleted.
//!
//! Format (JSON Lines, one object per line, `\n`-terminated):
//!
//! ```text
//! {"gpuprov_journal":1,"lineage":"6f1c…","base_serial":7}
//! {"op":"transition","key":"vm.a","machine":{…},"desired":{…}}
//! {"op":"remove","key":"vm.b"}
//! ```
//!
//! The header names the state the journal applies to: its lineage and its serial when the
//! journal was started. Readers ([`replay`]) apply the lines to that state in order:
//!
//! - a last line without its `\n` is a write cut short by a crash before its fsync
//!   returned, so nothing acted on it: it is ignored;
//! - any other line that does not parse is corruption: the journal is refused and left
//!   untouched (never overwritten), like a corrupt state file;
//! - a journal whose `base_serial` is below the state's serial was already folded (a
//!   crash between the fold and the delete): it is ignored and deleted by the next writer;
//! - a journal of another lineage, or ahead of the state, is refused.
//!
//! Appends use group commit: concurrent transitions queue their lines and one of them
//! writes and fsyncs the batch, so N machines in flight cost about one fsync per batch,
//! not one each.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::StateError;
use super::{MachineRecord, ResourceRecord, StateFile};

/// The journal format version written in the header.
pub const JOURNAL_FORMAT_VERSION: u32 = 1;

/// Returns the journal's path beside `state_path` (`<state_path>.journal`).
pub fn journal_path(state_path: &Path) -> PathBuf {
    super::sibling(state_path, ".journal")
}

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    gpuprov_journal: u32,
    lineage: String,
    base_serial: u64,
}

/// One journalled change to the state, applied identically live and on replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum JournalOp {
    /// A machine entered a new state; its label becomes an event stamped
    /// `machine.updated_at`. `desired` replaces the record's applied settings when set.
    Transition {
        key: String,
        machine: MachineRecord,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        desired: Option<Value>,
    },
    /// The applied settings of an existing record were replaced in place.
    Desired {
        key: String,
        desired: Value,
        at: DateTime<Utc>,
    },
    /// The cloud confirmed the resource gone; its record leaves the state.
    Remove { key: String },
}

impl JournalOp {
    /// Applies this change to `state` (in memory).
    pub fn apply(&self, state: &mut StateFile) {
        match self {
            JournalOp::Transition {
                key,
                machine,
                desired,
            } => {
                let rec = state
                    .resources
                    .entry(key.clone())
                    .or_insert_with(|| ResourceRecord::new(machine.clone()));
                rec.machine = machine.clone();
                // A JSON null reads back as `None`: treat it so live too, so a replay
                // always equals the memory it journalled.
                if let Some(d) = desired.as_ref().filter(|d| !d.is_null()) {
                    rec.desired = Some(d.clone());
                }
                rec.push_event_at(machine.updated_at, machine.label.clone());
            }
            JournalOp::Desired { key, desired, at } => {
                if let Some(rec) = state.resources.get_mut(key) {
                    rec.desired = Some(desired.clone());
                    rec.push_event_at(*at, "settings updated in place");
                }
            }
            JournalOp::Remove { key } => {
                state.resources.remove(key);
            }
        }
    }
}

/// What [`replay`] found beside a state file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replayed {
    /// No journal.
    None,
    /// A journal of this state whose `n` changes were applied; it still has to be folded.
    Applied { n: usize },
    /// A journal that was already folded into the state; it can be deleted.
    Folded,
}

/// Applies the journal at `path` (if any) to `state`, which was read from the state
/// file beside it. `state_existed` says whether that file existed: a first run that
/// crashed before its first fold leaves only a journal, whose lineage is then adopted.
///
/// # Errors
///
/// [`StateError::CorruptJournal`] naming the line, [`StateError::JournalMismatch`] for a
/// journal of another lineage or ahead of the state, [`StateError::Io`] if it cannot be
/// read. In every error case nothing is modified on disk.
pub fn replay(
    path: &Path,
    state: &mut StateFile,
    state_existed: bool,
) -> Result<Replayed, StateError> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Replayed::None),
        Err(e) => return Err(StateError::io("read state journal", path, e)),
    };
    let mut reader = io::BufReader::new(file);
    let mut line = Vec::new();
    let mut lineno = 0usize;
    let mut header: Option<Header> = None;
    let mut ops = Vec::new();
    loop {
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .map_err(|e| StateError::io("read state journal", path, e))?;
        if n == 0 {
            break;
        }
        lineno += 1;
        if line.last() != Some(&b'\n') {
            // Cut short by a crash before its fsync returned: nothing acted on it.
            break;
        }
        let corrupt = |what: String| StateError::CorruptJournal {
            path: path.to_path_buf(),
            line: lineno,
            what,
        };
        if header.is_none() {
            let h: Header = serde_json::from_slice(&line)
                .map_err(|e| corrupt(format!("not a journal header: {e}")))?;
            if h.gpuprov_journal > JOURNAL_FORMAT_VERSION {
                return Err(corrupt(format!(
                    "journal format {} is newer than this gpuprov supports ({JOURNAL_FORMAT_VERSION})",
                    h.gpuprov_journal
                )));
            }
            header = Some(h);
            continue;
        }
        let op: JournalOp = serde_json::from_slice(&line).map_err(|e| corrupt(format!("{e}")))?;
        ops.push(op);
    }
    let Some(h) = header else {
        // Empty, or a header cut short: the journal was never started durably.
        return Ok(Replayed::Folded);
    };
    if !state_existed {
        if uuid::Uuid::parse_str(&h.lineage).is_err() {
            return Err(StateError::CorruptJournal {
                path: path.to_path_buf(),
                line: 1,
                what: format!("invalid lineage {:?}: a lineage is a UUID", h.lineage),
            });
        }
        state.lineage = h.lineage.clone();
        state.serial = h.base_serial;
    }
    if h.lineage != state.lineage {
        return Err(StateError::JournalMismatch {
            path: path.to_path_buf(),
            what: format!(
                "it belongs to lineage {}, the state beside it to {}",
                h.lineage, state.lineage
            ),
        });
    }
    if h.base_serial < state.serial {
        return Ok(Replayed::Folded);
    }
    if h.base_serial > state.serial {
        return Err(StateError::JournalMismatch {
            path: path.to_path_buf(),
            what: format!(
                "it continues serial {}, but the state file has serial {} (was the state file replaced by an older copy?)",
                h.base_serial, state.serial
            ),
        });
    }
    for op in &ops {
        op.apply(state);
    }
    Ok(Replayed::Applied { n: ops.len() })
}

/// Cumulative figures of one [`JournalWriter`], for benchmarks and debug logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JournalStats {
    /// Changes appended.
    pub appends: u64,
    /// Write + fsync batches (group commits).
    pub syncs: u64,
    /// Bytes written to the journal, header included.
    pub bytes: u64,
    /// Time spent writing and fsyncing.
    pub busy: Duration,
}

struct WriterInner {
    /// Shared so a batch is written without holding the lock (`&File` is `Write`).
    file: std::sync::Arc<File>,
    /// Lines queued and not yet written.
    pending: Vec<u8>,
    /// Sequence number of the last queued change.
    queued: u64,
    /// Sequence number of the last change known durable.
    durable: u64,
    /// A batch is being written by some appender.
    syncing: bool,
    /// The first write error: the journal's tail is unknown, so no later change may be
    /// reported durable.
    failed: Option<String>,
    stats: JournalStats,
}

/// An open journal for one run: appends changes durably with group commit.
///
/// Created by [`super::StateStore::begin_journal`], which folds any older journal first.
pub struct JournalWriter {
    path: PathBuf,
    inner: Mutex<WriterInner>,
    done: tokio::sync::Notify,
}

impl std::fmt::Debug for JournalWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalWriter")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl JournalWriter {
    /// Creates (or truncates) the journal at `path` with its header, durably: the file
    /// and the directory entry are fsynced before this returns.
    pub(super) fn create(
        path: &Path,
        lineage: &str,
        base_serial: u64,
    ) -> Result<JournalWriter, StateError> {
        let started = Instant::now();
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(path)
            .map_err(|e| StateError::io("create state journal", path, e))?;
        let mut header = serde_json::to_vec(&Header {
            gpuprov_journal: JOURNAL_FORMAT_VERSION,
            lineage: lineage.to_string(),
            base_serial,
        })
        .map_err(|source| StateError::Serialize {
            path: path.to_path_buf(),
            source,
        })?;
        header.push(b'\n');
        file.write_all(&header)
            .and_then(|_| file.sync_all())
            .map_err(|e| StateError::io("write state journal", path, e))?;
        super::file::sync_parent(path)?;
        Ok(JournalWriter {
            path: path.to_path_buf(),
            inner: Mutex::new(WriterInner {
                file: std::sync::Arc::new(file),
                pending: Vec::new(),
                queued: 0,
                durable: 0,
                syncing: false,
                failed: None,
                stats: JournalStats {
                    bytes: header.len() as u64,
                    syncs: 1,
                    appends: 0,
                    busy: started.elapsed(),
                },
            }),
            done: tokio::sync::Notify::new(),
        })
    }

    /// The journal's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, WriterInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `op` and returns its sequence number; [`JournalWriter::wait_durable`] with
    /// it returns once the line is on disk. Callers that apply the same change in memory
    /// queue under the same lock, so the journal's order is the memory's order.
    pub fn queue(&self, op: &JournalOp) -> Result<u64, StateError> {
        let mut line = serde_json::to_vec(op).map_err(|source| StateError::Serialize {
            path: self.path.clone(),
            source,
        })?;
        line.push(b'\n');
        let mut w = self.lock();
        if let Some(e) = &w.failed {
            return Err(self.failed_error(e));
        }
        w.pending.extend_from_slice(&line);
        w.queued += 1;
        Ok(w.queued)
    }

    fn failed_error(&self, e: &str) -> StateError {
        StateError::io(
            "append to state journal",
            &self.path,
            io::Error::other(format!("an earlier write failed: {e}")),
        )
    }

    /// Returns once change `seq` is durable. Whoever finds no batch in progress writes
    /// and fsyncs everything queued so far (group commit) while the others wait.
    ///
    /// The write itself blocks the calling thread for the fsync (well under a
    /// millisecond on an SSD) and holds no await point, so dropping a waiting future
    /// never leaves a batch half-done.
    pub async fn wait_durable(&self, seq: u64) -> Result<(), StateError> {
        loop {
            let notified = self.done.notified();
            tokio::pin!(notified);
            {
                let mut w = self.lock();
                if w.durable >= seq {
                    return Ok(());
                }
                if let Some(e) = &w.failed {
                    return Err(self.failed_error(e));
                }
                if !w.syncing {
                    w.syncing = true;
                    let batch = std::mem::take(&mut w.pending);
                    let upto = w.queued;
                    let file = w.file.clone();
                    drop(w);
                    let started = Instant::now();
                    let result = (&*file).write_all(&batch).and_then(|()| file.sync_data());
                    let mut w = self.lock();
                    w.syncing = false;
                    match result {
                        Ok(()) => {
                            w.durable = upto;
                            w.stats.syncs += 1;
                            w.stats.appends = upto;
                            w.stats.bytes += batch.len() as u64;
                            w.stats.busy += started.elapsed();
                        }
                        Err(e) => w.failed = Some(e.to_string()),
                    }
                    drop(w);
                    self.done.notify_waiters();
                    continue;
                }
                // Registered before the lock is released, so the batch's notify_waiters
                // cannot be missed.
                notified.as_mut().enable();
            }
            notified.await;
        }
    }

    /// Queues `op` and waits until it is durable.
    pub async fn append(&self, op: &JournalOp) -> Result<(), StateError> {
        let seq = self.queue(op)?;
        self.wait_durable(seq).await
    }

    /// The figures so far.
    pub fn stats(&self) -> JournalStats {
        self.lock().stats
    }

    /// Deletes the journal; call only after its changes were folded into the state file
    /// (a successful [`super::StateStore::save`]).
    pub fn remove(&self) -> Result<(), StateError> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => super::file::sync_parent(&self.path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StateError::io("delete folded state journal", &self.path, e)),
        }
    }
}
