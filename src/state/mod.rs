//! The JSON state file and its lock.
//!
//! Only this module touches the state (`gpuprov.state.json` by default, or a remote
//! [`backend`]: S3, PostgreSQL), its `.backup`, its `.errored` sibling, its journal and
//! its lock.
//!
//! - [`StateFile`] and friends are the on-disk format: serde types that tolerate *and
//!   preserve* unknown fields, because the file is read back by both older and newer
//!   gpuprov releases. A machine's journalled state and its applied settings are kept as
//!   their JSON text ([`JsonText`]) and decoded only where they are read.
//! - [`StateStore`] reads the file once per run and writes it atomically (temp file,
//!   fsync, rename, fsync of the directory), keeping a `.backup` of the bytes first read.
//! - [`lock::StateLock`] is the exclusive advisory lock that every writing command holds.
//! - [`wal`] is the write-ahead journal (`<state>.journal`) a run appends each transition
//!   to; [`StateStore::open`] replays it, and the run folds it into the file at the end.

pub mod backend;
mod error;
mod file;
mod json_text;
pub mod lock;
mod split;
pub mod wal;

use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::record::{DecodeError, Record};
use crate::vm::{Owned, VmRecord};

pub use backend::{open as open_backend, Backend, BackendError};
pub use error::{CorruptState, StateError};
pub use file::{write_atomic, StateStore};
pub use json_text::JsonText;
pub use lock::{ForceUnlockOutcome, LockError, LockInfo, StateLock};
pub use wal::{journal_path, JournalOp, JournalStats, JournalWriter};

/// The state format version this build writes and the newest it can read.
///
/// Bump it only for changes an older gpuprov cannot safely read by ignoring unknown
/// fields; additive fields do not need a bump because unknown fields are preserved.
pub const STATE_FORMAT_VERSION: u32 = 1;

/// The maximum number of events kept per resource in [`ResourceRecord::events`]; older
/// events are dropped first so the state file does not grow without bound.
pub const MAX_EVENTS: usize = 50;

/// The gpuprov release that writes state files (recorded in [`StateFile::gpuprov_version`]
/// and in lock info).
pub const GPUPROV_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The whole state file: format metadata plus one record per resource.
///
/// JSON shape (pretty-printed, trailing newline):
///
/// ```json
/// {
///   "version": 1,
///   "serial": 3,
///   "lineage": "6f1c…",
///   "gpuprov_version": "0.1.0",
///   "ssh": { "key_fingerprint": "SHA256:…", "public_key": "ssh-ed25519 AAAA…" },
///   "resources": { "vm.dev": { "machine": { … }, "desired": { … }, "events": [ … ] } }
/// }
/// ```
// `Deserialize` by hand (`by_hand` below): serde's derived `flatten` buffers every value
// into an intermediate tree before reading the fields.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct StateFile {
    /// Format version; see [`STATE_FORMAT_VERSION`].
    pub version: u32,
    /// Incremented by every successful save, so a saved plan can tell that the state
    /// moved on since it was made.
    pub serial: u64,
    /// A UUID (v4) fixed when the state is first created; it identifies this project's
    /// state across saves and is attached to every cloud object as a label.
    pub lineage: String,
    /// The gpuprov release that last wrote the file.
    pub gpuprov_version: String,
    /// The project's SSH key, public half only (fingerprint and public key), recorded
    /// when a run first uses it; every machine must then log in with that key (the
    /// private key is never in the state: see [`crate::ssh::supply`]). Absent in states
    /// written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<crate::ssh::SshIdentity>,
    /// Records keyed by resource address (for example `vm.dev`), sorted for stable diffs.
    #[serde(default)]
    pub resources: BTreeMap<String, ResourceRecord>,
    /// The shared objects' records (an SSH key per cloud account, an environment per
    /// region: `crate::vm::shared`), keyed by address (`shared.digitalocean.ssh_key`).
    /// Apart from `resources` so that everything reading machines reads machines. Absent
    /// in states written before shared objects were resources.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shared: BTreeMap<String, ResourceRecord>,
    /// Top-level fields this release does not know; kept so that saving a file written by
    /// a newer release does not silently drop its data.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl StateFile {
    /// The records `key` belongs to: [`StateFile::shared`] for a shared object's address
    /// (`shared.…`), else [`StateFile::resources`].
    pub fn records_of(&self, key: &str) -> &BTreeMap<String, ResourceRecord> {
        if key.starts_with(crate::provider::shared::PREFIX) {
            &self.shared
        } else {
            &self.resources
        }
    }

    /// [`StateFile::records_of`], mutable.
    pub fn records_of_mut(&mut self, key: &str) -> &mut BTreeMap<String, ResourceRecord> {
        if key.starts_with(crate::provider::shared::PREFIX) {
            &mut self.shared
        } else {
            &mut self.resources
        }
    }

    /// Returns an empty state: current format version, serial 0 and a fresh v4 lineage.
    pub fn new() -> Self {
        StateFile {
            version: STATE_FORMAT_VERSION,
            serial: 0,
            lineage: uuid::Uuid::new_v4().to_string(),
            gpuprov_version: GPUPROV_VERSION.to_string(),
            ssh: None,
            resources: BTreeMap::new(),
            shared: BTreeMap::new(),
            extra: Map::new(),
        }
    }
}

impl Default for StateFile {
    fn default() -> Self {
        Self::new()
    }
}

/// The state of one resource (one VM address): its journalled machine, the config it
/// was applied with, and a bounded event log.
// `Deserialize` by hand, like `StateFile`.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct ResourceRecord {
    /// The journalled machine state, exactly as the executor persists it.
    pub machine: MachineRecord,
    /// A snapshot of the resource's config as last applied (the serde form of
    /// `VmSpec`, kept as its text), used by `plan` to diff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired: Option<JsonText>,
    /// The most recent transitions, oldest first, at most [`MAX_EVENTS`].
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    pub events: VecDeque<Event>,
    /// The machine name its cloud objects carry (label `gpuprov-vm-name`), when it is not
    /// the address's: set by `state mv` and `moved` blocks, because clouds mostly cannot
    /// relabel. Every cloud call for this resource (observe, delete, cleanup) uses it; it
    /// goes with the record when the machine is destroyed or replaced, so a replacement
    /// carries the address's name. Absent (`None`) in older states and for machines never
    /// moved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_name: Option<String>,
    /// Per-resource fields this release does not know, preserved on save.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Reads a JSON object field by field: the known fields into their types, the others
/// kept as they are in an `extra` map (what `#[serde(flatten)]` did, without first
/// buffering every value). A known field given twice is an error, as with the derive.
mod by_hand {
    use std::collections::BTreeMap;
    use std::fmt;
    use std::marker::PhantomData;

    use serde::de::{Deserialize, Deserializer, Error, MapAccess, Visitor};
    use serde_json::{Map, Value};

    use super::{ResourceRecord, StateFile};

    /// A JSON object of records read into a map built in one pass from its entries in
    /// order: gpuprov writes the object sorted by key, so the build is linear, where
    /// inserting entry by entry searches the tree for each (a tenth of a 1,000-machine
    /// plan's state read, issue 20). A key given twice keeps its last value, as
    /// `BTreeMap`'s own reader does.
    struct Sorted<V>(BTreeMap<String, V>);

    impl<'de, V: Deserialize<'de>> Deserialize<'de> for Sorted<V> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            // A stable sort that finds the run already sorted, then a bulk build that
            // keeps the last of equal keys.
            Ok(Sorted(Entries::deserialize(d)?.0.into_iter().collect()))
        }
    }

    /// A JSON object's entries in the order written, repeated keys included (the state
    /// reader splits `resources` into such runs: `super::split`).
    pub(super) struct Entries<V>(pub(super) Vec<(String, V)>);

    impl<'de, V: Deserialize<'de>> Deserialize<'de> for Entries<V> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct InOrder<V>(PhantomData<V>);
            impl<'de, V: Deserialize<'de>> Visitor<'de> for InOrder<V> {
                type Value = Entries<V>;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("a map of records by address")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Entries<V>, A::Error> {
                    let mut entries = Vec::with_capacity(m.size_hint().unwrap_or(0));
                    while let Some(entry) = m.next_entry::<String, V>()? {
                        entries.push(entry);
                    }
                    Ok(Entries(entries))
                }
            }
            d.deserialize_map(InOrder(PhantomData))
        }
    }

    /// Stores `value` in `slot`, refusing a second one (also the journal reader's).
    pub(super) fn once<T, E: Error>(
        slot: &mut Option<T>,
        value: T,
        name: &'static str,
    ) -> Result<(), E> {
        if slot.replace(value).is_some() {
            return Err(E::duplicate_field(name));
        }
        Ok(())
    }

    impl<'de> Deserialize<'de> for StateFile {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = StateFile;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("a gpuprov state (a JSON object)")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<StateFile, A::Error> {
                    let (mut version, mut serial, mut lineage, mut gpuprov_version) =
                        (None, None, None, None);
                    let (mut ssh, mut resources, mut shared) = (None, None, None);
                    let mut extra = Map::new();
                    while let Some(key) = m.next_key::<String>()? {
                        match key.as_str() {
                            "version" => once(&mut version, m.next_value()?, "version")?,
                            "serial" => once(&mut serial, m.next_value()?, "serial")?,
                            "lineage" => once(&mut lineage, m.next_value()?, "lineage")?,
                            "gpuprov_version" => {
                                once(&mut gpuprov_version, m.next_value()?, "gpuprov_version")?
                            }
                            "ssh" => once(&mut ssh, m.next_value()?, "ssh")?,
                            "resources" => once(
                                &mut resources,
                                m.next_value::<Sorted<ResourceRecord>>()?.0,
                                "resources",
                            )?,
                            "shared" => once(
                                &mut shared,
                                m.next_value::<Sorted<ResourceRecord>>()?.0,
                                "shared",
                            )?,
                            _ => {
                                extra.insert(key, m.next_value::<Value>()?);
                            }
                        }
                    }
                    Ok(StateFile {
                        version: version.ok_or_else(|| A::Error::missing_field("version"))?,
                        serial: serial.ok_or_else(|| A::Error::missing_field("serial"))?,
                        lineage: lineage.ok_or_else(|| A::Error::missing_field("lineage"))?,
                        gpuprov_version: gpuprov_version
                            .ok_or_else(|| A::Error::missing_field("gpuprov_version"))?,
                        ssh: ssh.flatten(),
                        resources: resources.unwrap_or_default(),
                        shared: shared.unwrap_or_default(),
                        extra,
                    })
                }
            }
            d.deserialize_map(V)
        }
    }

    impl<'de> Deserialize<'de> for ResourceRecord {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = ResourceRecord;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("a resource record (a JSON object with `machine`)")
                }
                fn visit_map<A: MapAccess<'de>>(
                    self,
                    mut m: A,
                ) -> Result<ResourceRecord, A::Error> {
                    let (mut machine, mut desired, mut events, mut cloud_name) =
                        (None, None, None, None);
                    let mut extra = Map::new();
                    while let Some(key) = m.next_key::<String>()? {
                        match key.as_str() {
                            "machine" => once(&mut machine, m.next_value()?, "machine")?,
                            "desired" => once(&mut desired, m.next_value()?, "desired")?,
                            "events" => once(&mut events, m.next_value()?, "events")?,
                            "cloud_name" => once(&mut cloud_name, m.next_value()?, "cloud_name")?,
                            _ => {
                                extra.insert(key, m.next_value::<Value>()?);
                            }
                        }
                    }
                    Ok(ResourceRecord {
                        machine: machine.ok_or_else(|| A::Error::missing_field("machine"))?,
                        desired: desired.flatten(),
                        events: events.unwrap_or_default(),
                        cloud_name: cloud_name.flatten(),
                        extra,
                    })
                }
            }
            d.deserialize_map(V)
        }
    }
}

impl ResourceRecord {
    /// Returns a record for `machine` with no desired snapshot and no events.
    pub fn new(machine: MachineRecord) -> Self {
        ResourceRecord {
            machine,
            desired: None,
            events: VecDeque::new(),
            cloud_name: None,
            extra: Map::new(),
        }
    }

    /// The machine name the cloud objects of the resource at `address` (`vm.NAME`) carry:
    /// [`ResourceRecord::cloud_name`] when set, else `NAME`.
    pub fn identity_name<'a>(&'a self, address: &'a str) -> &'a str {
        self.cloud_name
            .as_deref()
            .unwrap_or_else(|| address.strip_prefix("vm.").unwrap_or(address))
    }

    /// Appends an event stamped with the current time, dropping the oldest events so that
    /// at most [`MAX_EVENTS`] remain.
    pub fn push_event(&mut self, label: impl Into<String>) {
        self.push_event_at(Utc::now(), label);
    }

    /// Appends an event stamped `at` (a journalled time, so a replay gives the same log).
    pub fn push_event_at(&mut self, at: DateTime<Utc>, label: impl Into<String>) {
        while self.events.len() >= MAX_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(Event {
            at,
            label: label.into(),
        });
    }
}

/// One journalled machine: which machine kind it is and its serialized state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MachineRecord {
    /// The machine kind, `"launch"` or `"teardown"`; it says how to read `state`.
    pub kind: String,
    /// The machine's state enum as serde JSON, kept as its text: variants and fields
    /// this build does not know are preserved. Read it with `MachineRecord::decode`.
    pub state: JsonText,
    /// A one-line human label of `state`, shown by `status` without decoding it.
    pub label: String,
    /// When `state` was last written (UTC).
    pub updated_at: DateTime<Utc>,
}

impl MachineRecord {
    /// The record decoded by its kind ([`Record::decode`]).
    ///
    /// # Errors
    ///
    /// [`DecodeError`]: an unknown kind, or a state that is not that kind's.
    pub fn decode(&self) -> Result<Record, DecodeError> {
        Record::decode(&self.kind, self.state.as_str())
    }

    /// The cloud resources the record may own, whichever machine wrote it
    /// ([`Record::owned`]).
    ///
    /// # Errors
    ///
    /// As [`MachineRecord::decode`]; callers must then refuse to act rather than treat
    /// the record as owning nothing.
    pub fn owned(&self) -> Result<Option<Owned>, DecodeError> {
        self.decode().map(|r| r.owned())
    }

    /// The machine the record says is up ([`crate::record::vm_of`]).
    pub fn vm(&self) -> Option<VmRecord> {
        crate::record::vm_of(&self.kind, self.state.as_str())
    }
}

/// One entry of a resource's event log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Event {
    /// When the event happened (UTC).
    pub at: DateTime<Utc>,
    /// A one-line description, usually the label of the state entered.
    pub label: String,
}

/// The bytes gpuprov stores for `state`: pretty JSON with a trailing newline.
///
/// # Errors
///
/// [`StateError::Serialize`] (an unknown field holding a non-finite number, say).
pub fn to_json_bytes(state: &StateFile) -> Result<Vec<u8>, StateError> {
    file::to_json(Path::new("state"), state)
}

/// Parses stored state bytes as [`StateStore::open`] does; `name` names them in
/// diagnostics.
///
/// # Errors
///
/// [`StateError::Corrupt`], [`StateError::NewerVersion`], [`StateError::InvalidLineage`].
pub fn parse_state(name: &Path, bytes: &[u8]) -> Result<StateFile, StateError> {
    file::parse(name, bytes)
}

/// Returns the path of the `.backup` file kept beside `state_path` (`<state_path>.backup`).
pub fn backup_path(state_path: &Path) -> PathBuf {
    sibling(state_path, ".backup")
}

/// Returns the path the state goes to when the final save fails (`<state_path>.errored`).
pub fn errored_path(state_path: &Path) -> PathBuf {
    sibling(state_path, ".errored")
}

/// Appends `suffix` to the file name (not the extension), so `a.json` → `a.json.backup`.
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut s = OsString::from(path.as_os_str());
    s.push(suffix);
    PathBuf::from(s)
}

/// The JSON Schema of the state file, as committed in `schemas/gpuprov-state.schema.json`.
/// `machine.state` is the journalled state of the machine named by `machine.kind`
/// (`launch` or `teardown`); its shape is the serde form of `vm::LaunchState` or
/// `vm::TeardownState`, described here as an object.
pub fn json_schema() -> String {
    let schema = schemars::schema_for!(StateFile);
    let mut s = serde_json::to_string_pretty(&schema).unwrap_or_default();
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> ResourceRecord {
        ResourceRecord::new(MachineRecord {
            kind: "launch".into(),
            state: serde_json::json!({"Searching": {"cursor": 0}}).into(),
            label: "searching".into(),
            updated_at: Utc::now(),
        })
    }

    /// The hand-written reader keeps what the derive did: a round trip is lossless
    /// (unknown fields included), a known field twice or `machine` missing is refused.
    #[test]
    fn the_state_reader_round_trips_and_refuses_duplicates() {
        let mut st = StateFile::new();
        st.resources.insert("vm.a".into(), record());
        st.extra
            .insert("outputs".into(), serde_json::json!({"x": 1}));
        let text = serde_json::to_string(&st).unwrap();
        assert_eq!(serde_json::from_str::<StateFile>(&text).unwrap(), st);
        let twice = text.replacen("\"serial\":0", "\"serial\":0,\"serial\":1", 1);
        let err = serde_json::from_str::<StateFile>(&twice).unwrap_err();
        assert!(
            err.to_string().contains("duplicate field `serial`"),
            "{err}"
        );
        let err = serde_json::from_str::<ResourceRecord>("{\"desired\":null}").unwrap_err();
        assert!(err.to_string().contains("missing field `machine`"), "{err}");
        let err = serde_json::from_str::<StateFile>("[1]").unwrap_err();
        assert!(err.to_string().contains("a gpuprov state"), "{err}");
    }

    /// Records read in one pass from the object's entries: a hand-edited file with its
    /// records out of order reads back sorted, and an address given twice keeps its last
    /// record (what reading them one by one into the map did).
    #[test]
    fn records_out_of_order_read_sorted_and_a_repeated_address_keeps_the_last() {
        let rec = |label: &str| {
            let mut r = record();
            r.machine.label = label.into();
            serde_json::to_string(&r).unwrap()
        };
        let text = format!(
            r#"{{"version":1,"serial":2,"lineage":"l","gpuprov_version":"0",
                "resources":{{"vm.c":{},"vm.a":{},"vm.c":{}}},
                "shared":{{"shared.z":{},"shared.y":{}}}}}"#,
            rec("first c"),
            rec("a"),
            rec("last c"),
            rec("z"),
            rec("y")
        );
        let st: StateFile = serde_json::from_str(&text).unwrap();
        let labels = |m: &BTreeMap<String, ResourceRecord>| -> Vec<(String, String)> {
            m.iter()
                .map(|(k, r)| (k.clone(), r.machine.label.clone()))
                .collect()
        };
        assert_eq!(
            labels(&st.resources),
            [
                ("vm.a".into(), "a".into()),
                ("vm.c".into(), "last c".into())
            ]
        );
        assert_eq!(
            labels(&st.shared),
            [
                ("shared.y".into(), "y".into()),
                ("shared.z".into(), "z".into())
            ]
        );
        let err = serde_json::from_str::<StateFile>(
            r#"{"version":1,"serial":2,"lineage":"l","gpuprov_version":"0","resources":null}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("a map of records"), "{err}");
    }

    #[test]
    fn push_event_keeps_the_newest_max_events() {
        let mut r = record();
        for i in 0..MAX_EVENTS + 7 {
            r.push_event(format!("e{i}"));
        }
        assert_eq!(r.events.len(), MAX_EVENTS);
        assert_eq!(r.events.front().map(|e| e.label.as_str()), Some("e7"));
        let last = format!("e{}", MAX_EVENTS + 6);
        assert_eq!(
            r.events.back().map(|e| e.label.as_str()),
            Some(last.as_str())
        );
    }

    #[test]
    fn empty_optional_fields_are_omitted() {
        let json = serde_json::to_value(record()).expect("serializes");
        let obj = json.as_object().expect("object");
        assert!(!obj.contains_key("desired"));
        assert!(!obj.contains_key("events"));
    }

    #[test]
    fn cloud_name_round_trips_and_is_omitted_when_unset() {
        let mut r = record();
        assert_eq!(r.identity_name("vm.b"), "b");
        let json = serde_json::to_value(&r).expect("serializes");
        assert!(!json.as_object().expect("object").contains_key("cloud_name"));
        r.cloud_name = Some("a".into());
        let json = serde_json::to_string(&r).expect("serializes");
        assert!(json.contains(r#""cloud_name":"a""#), "{json}");
        let back: ResourceRecord = serde_json::from_str(&json).expect("parses");
        assert_eq!(back, r);
        assert_eq!(back.identity_name("vm.b"), "a");
        // A record written before the field existed reads as never moved.
        let old = r#"{"machine":{"kind":"launch","state":{},"label":"x","updated_at":"2026-01-01T00:00:00Z"}}"#;
        let old: ResourceRecord = serde_json::from_str(old).expect("parses");
        assert_eq!(old.cloud_name, None);
        assert!(old.extra.is_empty());
    }

    #[test]
    fn new_states_get_distinct_lineages() {
        let a = StateFile::new();
        let b = StateFile::new();
        assert_ne!(a.lineage, b.lineage);
        assert!(uuid::Uuid::parse_str(&a.lineage).is_ok());
        assert_eq!(a.serial, 0);
        assert_eq!(a.version, STATE_FORMAT_VERSION);
    }

    #[test]
    fn sibling_appends_to_the_file_name() {
        assert_eq!(
            backup_path(Path::new("dir/gpuprov.state.json")),
            PathBuf::from("dir/gpuprov.state.json.backup")
        );
        assert_eq!(
            errored_path(Path::new("s.json")),
            PathBuf::from("s.json.errored")
        );
    }
}
