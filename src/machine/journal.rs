//! The journal the executor writes through: one record per key holding a machine's
//! current state. The layers above the executor implement it on the state file; tests
//! use [`MemoryJournal`], which can simulate a crash at a chosen transition.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;

/// A journalled record as loaded: the machine kind and its state as JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct PrevRecord {
    pub kind: String,
    pub state: serde_json::Value,
}

/// Why a record could not be made durable or read.
#[derive(Debug, Clone, thiserror::Error, miette::Diagnostic)]
pub enum JournalError {
    #[error("cannot encode state: {0}")]
    Encode(String),
    #[error("cannot write the state file: {0}")]
    Write(String),
    /// Test-only: a simulated crash at this transition.
    #[error("simulated crash before journalling '{0}'")]
    SimulatedCrash(String),
}

/// Durable storage of machine states, one record per key.
#[async_trait]
pub trait Journal: Send + Sync {
    async fn load(&self, key: &str) -> Result<Option<PrevRecord>, JournalError>;
    /// Makes `state` durable as the record of `key`; returns only once it is.
    async fn record(
        &self,
        key: &str,
        kind: &str,
        state: &serde_json::Value,
        label: &str,
    ) -> Result<(), JournalError>;
}

/// An in-memory journal for tests: keeps every record and the history of labels, and can
/// fail the transition whose label starts with a given prefix (a simulated crash after the
/// step's side effect, before its result was durable).
#[derive(Default)]
pub struct MemoryJournal {
    inner: Mutex<MemInner>,
}

#[derive(Default)]
struct MemInner {
    records: BTreeMap<String, PrevRecord>,
    history: Vec<(String, String)>,
    crash_before: Option<String>,
}

impl MemoryJournal {
    pub fn new() -> Self {
        Self::default()
    }
    /// Makes the next `record` whose label starts with `label_prefix` fail (once).
    pub fn crash_before(&self, label_prefix: &str) {
        self.inner.lock().expect("journal mutex").crash_before = Some(label_prefix.to_string());
    }
    /// `(key, label)` of every durable transition, in order.
    pub fn history(&self) -> Vec<(String, String)> {
        self.inner.lock().expect("journal mutex").history.clone()
    }
    pub fn get(&self, key: &str) -> Option<PrevRecord> {
        self.inner
            .lock()
            .expect("journal mutex")
            .records
            .get(key)
            .cloned()
    }
    /// Writes a record directly (for tests that start from a given journal).
    pub fn put(&self, key: &str, rec: PrevRecord) {
        self.inner
            .lock()
            .expect("journal mutex")
            .records
            .insert(key.to_string(), rec);
    }
}

#[async_trait]
impl Journal for MemoryJournal {
    async fn load(&self, key: &str) -> Result<Option<PrevRecord>, JournalError> {
        Ok(self.get(key))
    }
    async fn record(
        &self,
        key: &str,
        kind: &str,
        state: &serde_json::Value,
        label: &str,
    ) -> Result<(), JournalError> {
        let mut g = self.inner.lock().expect("journal mutex");
        if let Some(p) = &g.crash_before {
            if label.starts_with(p.as_str()) {
                g.crash_before = None;
                return Err(JournalError::SimulatedCrash(label.to_string()));
            }
        }
        g.records.insert(
            key.to_string(),
            PrevRecord {
                kind: kind.to_string(),
                state: state.clone(),
            },
        );
        g.history.push((key.to_string(), label.to_string()));
        Ok(())
    }
}
