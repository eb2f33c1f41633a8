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

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::backend::{Backend, JournalBytes, JournalSink};
use super::error::StateError;
use super::{JsonText, MachineRecord, ResourceRecord, StateFile};

/// The journal format version written in the header.
pub const JOURNAL_FORMAT_VERSION: u32 = 1;

/// Returns the journal's path beside `state_path` (`<state_path>.journal`).
pub fn journal_path(state_path: &Path) -> PathBuf {
    super::sibling(state_path, ".journal")
}

/// Where `backend` keeps its journal, for messages (`<location>.journal`).
fn journal_location(backend: &dyn Backend) -> PathBuf {
    super::sibling(&backend.location(), ".journal")
}

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    gpuprov_journal: u32,
    lineage: String,
    base_serial: u64,
}

/// One journalled change to the state, applied identically live and on replay.
// `Deserialize` by hand (`by_hand` below): serde's derive for internally tagged enums
// buffers the line, and a buffered value cannot be read as [`JsonText`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum JournalOp {
    /// A machine entered a new state; its label becomes an event stamped
    /// `machine.updated_at`. `desired` replaces the record's applied settings when set.
    Transition {
        key: String,
        machine: MachineRecord,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        desired: Option<JsonText>,
    },
    /// The applied settings of an existing record were replaced in place.
    Desired {
        key: String,
        desired: JsonText,
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
                    .records_of_mut(key)
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
                if let Some(rec) = state.records_of_mut(key).get_mut(key) {
                    rec.desired = Some(desired.clone());
                    rec.push_event_at(*at, "settings updated in place");
                }
            }
            JournalOp::Remove { key } => {
                state.records_of_mut(key).remove(key);
            }
        }
    }
}

/// Reads a journal line's fields in any order, then builds the op its `op` names (what
/// the derive does, without buffering). A field given twice is refused, as with the derive.
mod by_hand {
    use std::fmt;

    use chrono::{DateTime, Utc};
    use serde::de::{Deserialize, Deserializer, Error, IgnoredAny, MapAccess, Visitor};

    use super::super::by_hand::once;
    use super::{JournalOp, JsonText, MachineRecord};

    const OPS: &[&str] = &["transition", "desired", "remove"];

    impl<'de> Deserialize<'de> for JournalOp {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = JournalOp;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("a journal entry (a JSON object with `op`)")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<JournalOp, A::Error> {
                    let (mut op, mut key) = (None::<String>, None::<String>);
                    let mut machine = None::<MachineRecord>;
                    let mut desired = None::<JsonText>;
                    let mut at = None::<DateTime<Utc>>;
                    while let Some(field) = m.next_key::<String>()? {
                        match field.as_str() {
                            "op" => once(&mut op, m.next_value()?, "op")?,
                            "key" => once(&mut key, m.next_value()?, "key")?,
                            "machine" => once(&mut machine, m.next_value()?, "machine")?,
                            "desired" => once(&mut desired, m.next_value()?, "desired")?,
                            "at" => once(&mut at, m.next_value()?, "at")?,
                            _ => {
                                m.next_value::<IgnoredAny>()?;
                            }
                        }
                    }
                    let op = op.ok_or_else(|| A::Error::missing_field("op"))?;
                    let key = key.ok_or_else(|| A::Error::missing_field("key"))?;
                    Ok(match op.as_str() {
                        "transition" => JournalOp::Transition {
                            key,
                            machine: machine.ok_or_else(|| A::Error::missing_field("machine"))?,
                            // `null` reads as absent, as `Option`'s derive read it.
                            desired: desired.filter(|d| !d.is_null()),
                        },
                        "desired" => JournalOp::Desired {
                            key,
                            desired: desired.ok_or_else(|| A::Error::missing_field("desired"))?,
                            at: at.ok_or_else(|| A::Error::missing_field("at"))?,
                        },
                        "remove" => JournalOp::Remove { key },
                        other => return Err(A::Error::unknown_variant(other, OPS)),
                    })
                }
            }
            d.deserialize_map(V)
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

/// One parsed journal: where it is stored, its header, and its complete lines.
struct Parsed {
    location: PathBuf,
    header: Header,
    ops: Vec<JournalOp>,
}

/// Parses one stored journal; `None` when it holds no header (an empty or torn first
/// line: nothing was journalled).
fn parse_journal(j: &JournalBytes) -> Result<Option<Parsed>, StateError> {
    let mut header: Option<Header> = None;
    let mut ops = Vec::new();
    let mut rest: &[u8] = &j.bytes;
    let mut lineno = 0usize;
    while !rest.is_empty() {
        lineno += 1;
        // A last line without its `\n` was cut short by a crash before its write
        // returned, so nothing acted on it.
        let Some(end) = rest.iter().position(|b| *b == b'\n') else {
            break;
        };
        let line = &rest[..end];
        rest = &rest[end + 1..];
        let corrupt = |what: String| StateError::CorruptJournal {
            path: j.location.clone(),
            line: lineno,
            what,
        };
        if header.is_none() {
            let h: Header = serde_json::from_slice(line)
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
        let op: JournalOp = serde_json::from_slice(line).map_err(|e| corrupt(format!("{e}")))?;
        ops.push(op);
    }
    Ok(header.map(|header| Parsed {
        location: j.location.clone(),
        header,
        ops,
    }))
}

/// Applies the stored journals (`journals`, as [`super::backend::Backend::read_journals`]
/// returns them) to `state`, which was read from the same backend. `state_existed` says
/// whether a state document existed: a first run that crashed before its first fold
/// leaves only a journal, whose lineage is then adopted.
///
/// At most one journal can continue the state (its `base_serial` is the state's serial);
/// those below it were folded already and are ignored. Two that continue it mean two
/// writers ran at once (a broken lock): refused, so a person decides.
///
/// # Errors
///
/// [`StateError::CorruptJournal`] naming the line, [`StateError::JournalMismatch`] for a
/// journal of another lineage, one ahead of the state, or two runs on the same serial.
/// In every error case nothing is modified in the store.
pub fn replay(
    journals: &[JournalBytes],
    state: &mut StateFile,
    state_existed: bool,
) -> Result<Replayed, StateError> {
    let mut parsed = Vec::new();
    for j in journals {
        if let Some(p) = parse_journal(j)? {
            parsed.push(p);
        }
    }
    if parsed.is_empty() {
        return Ok(if journals.is_empty() {
            Replayed::None
        } else {
            Replayed::Folded
        });
    }
    if !state_existed {
        // The newest run's journal names the lineage the first save would have written.
        let newest = parsed
            .iter()
            .max_by_key(|p| p.header.base_serial)
            .expect("not empty");
        if uuid::Uuid::parse_str(&newest.header.lineage).is_err() {
            return Err(StateError::CorruptJournal {
                path: newest.location.clone(),
                line: 1,
                what: format!(
                    "invalid lineage {:?}: a lineage is a UUID",
                    newest.header.lineage
                ),
            });
        }
        state.lineage = newest.header.lineage.clone();
        state.serial = newest.header.base_serial;
    }
    let mut current: Option<&Parsed> = None;
    for p in &parsed {
        let h = &p.header;
        if h.lineage != state.lineage {
            return Err(StateError::JournalMismatch {
                path: p.location.clone(),
                what: format!(
                    "it belongs to lineage {}, the state beside it to {}",
                    h.lineage, state.lineage
                ),
            });
        }
        if h.base_serial > state.serial {
            return Err(StateError::JournalMismatch {
                path: p.location.clone(),
                what: format!(
                    "it continues serial {}, but the state file has serial {} (was the state file replaced by an older copy?)",
                    h.base_serial, state.serial
                ),
            });
        }
        if h.base_serial < state.serial {
            continue;
        }
        if let Some(other) = current {
            return Err(StateError::JournalMismatch {
                path: p.location.clone(),
                what: format!(
                    "two runs journalled changes to serial {} at once (the other is `{}`): a run's lock was broken while it ran. Keep both, compare them with the state, and remove the one whose machines are not the ones running",
                    h.base_serial,
                    other.location.display()
                ),
            });
        }
        current = Some(p);
    }
    let Some(p) = current else {
        return Ok(Replayed::Folded);
    };
    for op in &p.ops {
        op.apply(state);
    }
    Ok(Replayed::Applied { n: p.ops.len() })
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
    /// Where batches go; shared so a batch is written without holding the lock.
    sink: Arc<dyn JournalSink>,
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
    /// Starts the journal of `backend`'s state with its header, durably (on a local
    /// file: the file and the directory entry are fsynced before this returns), after
    /// deleting any older journal of that state.
    pub(super) fn start(
        backend: &dyn Backend,
        lineage: &str,
        base_serial: u64,
    ) -> Result<JournalWriter, StateError> {
        let started = Instant::now();
        let path = journal_location(backend);
        let mut header = serde_json::to_vec(&Header {
            gpuprov_journal: JOURNAL_FORMAT_VERSION,
            lineage: lineage.to_string(),
            base_serial,
        })
        .map_err(|source| StateError::Serialize {
            path: path.clone(),
            source,
        })?;
        header.push(b'\n');
        let sink: Arc<dyn JournalSink> = Arc::from(backend.start_journal(&header)?);
        Ok(JournalWriter {
            path,
            inner: Mutex::new(WriterInner {
                sink,
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
                    let sink = w.sink.clone();
                    drop(w);
                    let started = Instant::now();
                    let result = sink.append(&batch);
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
                        Err(e) => w.failed = Some(e),
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

    /// Deletes the journal; call only after its changes were folded into the state
    /// (a successful [`super::StateStore::save`]).
    pub fn remove(&self) -> Result<(), StateError> {
        let sink = self.lock().sink.clone();
        sink.remove()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(line: &str) -> Result<JournalOp, String> {
        serde_json::from_str(line).map_err(|e| e.to_string())
    }

    /// The hand-written reader reads what the writer writes, in any field order, and
    /// refuses what the derive refused.
    #[test]
    fn journal_lines_read_back_and_bad_ones_are_refused() {
        let machine = MachineRecord {
            kind: "launch".into(),
            state: serde_json::json!({"state": "ready", "vm": {"port": 22}}).into(),
            label: "ready".into(),
            updated_at: "2026-12-01T10:00:00Z".parse().unwrap(),
        };
        let ops = [
            JournalOp::Transition {
                key: "vm.a".into(),
                machine: machine.clone(),
                desired: Some(serde_json::json!({"name": "a"}).into()),
            },
            JournalOp::Transition {
                key: "vm.a".into(),
                machine,
                desired: None,
            },
            JournalOp::Desired {
                key: "vm.a".into(),
                desired: serde_json::json!({"name": "a", "gpu": "H100"}).into(),
                at: "2026-12-01T10:00:01Z".parse().unwrap(),
            },
            JournalOp::Remove { key: "vm.a".into() },
        ];
        for want in ops {
            let line = serde_json::to_string(&want).unwrap();
            assert!(line.starts_with(r#"{"op":"#), "{line}");
            assert_eq!(op(&line).unwrap(), want, "{line}");
        }
        // Field order does not matter; `null` settings read as none, unknown fields
        // (from a newer release) are skipped.
        let line = r#"{"key":"vm.b","desired":null,"new":1,"op":"remove"}"#;
        assert_eq!(op(line).unwrap(), JournalOp::Remove { key: "vm.b".into() });
        let line = r#"{"desired":null,"key":"vm.b","op":"transition","machine":{"kind":"launch","state":{},"label":"x","updated_at":"2026-12-01T10:00:00Z"}}"#;
        assert!(matches!(
            op(line).unwrap(),
            JournalOp::Transition { desired: None, .. }
        ));
        for (line, why) in [
            (r#"{"op":"remove"}"#, "missing field `key`"),
            (r#"{"key":"vm.a"}"#, "missing field `op`"),
            (
                r#"{"op":"transition","key":"vm.a"}"#,
                "missing field `machine`",
            ),
            (
                r#"{"op":"desired","key":"vm.a","desired":{}}"#,
                "missing field `at`",
            ),
            (
                r#"{"op":"explode","key":"vm.a"}"#,
                "unknown variant `explode`",
            ),
            (
                r#"{"op":"remove","key":"vm.a","key":"vm.b"}"#,
                "duplicate field `key`",
            ),
            (r#"["remove"]"#, "a journal entry"),
        ] {
            let e = op(line).unwrap_err();
            assert!(e.contains(why), "{line}: {e}");
        }
    }
}
