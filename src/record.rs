//! The journalled records of the state file, typed: a resource's `machine.kind` says which
//! machine wrote its `machine.state` JSON, and [`Record::decode`] is the one place that
//! turns the pair into that machine's state enum. `plan`, `engine` and the CLI read
//! records only through it; the persisted format is the machines' own serde form,
//! unchanged by decoding.
//!
//! Layering: above `vm/` and `cluster/` (whose state types it names), below `plan`,
//! `engine` and `cli`.

use crate::cluster::k3s::{ClusterRecord, K3sMachine, K3sState};
use crate::machine::Machine;
use crate::vm::{LaunchMachine, LaunchState, Owned, TeardownMachine, TeardownState, VmRecord};

/// The journal kind of launch records (`LaunchMachine`'s [`Machine::KIND`]).
pub const LAUNCH: &str = <LaunchMachine as Machine>::KIND;
/// The journal kind of teardown records (`TeardownMachine`'s [`Machine::KIND`]).
pub const TEARDOWN: &str = <TeardownMachine as Machine>::KIND;
/// The journal kind of k3s records (`K3sMachine`'s [`Machine::KIND`]).
pub const K3S: &str = <K3sMachine as Machine>::KIND;

/// A journalled machine state, decoded by its kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    Launch(LaunchState),
    Teardown(TeardownState),
    K3s(K3sState),
}

/// Why a record could not be decoded. The messages are phrases to follow "the state
/// record X is" / "has" (`not a valid launch state: …`, `unknown machine kind "x"`).
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The kind is none of [`LAUNCH`], [`TEARDOWN`], [`K3S`].
    #[error("unknown machine kind {0:?}")]
    UnknownKind(String),
    /// The kind is known but the state does not parse as that machine's state.
    #[error("not a valid {kind} state: {source}")]
    Invalid {
        kind: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

impl DecodeError {
    /// The known kind whose state did not parse; `None` for an unknown kind.
    pub fn invalid_kind(&self) -> Option<&'static str> {
        match self {
            DecodeError::Invalid { kind, .. } => Some(kind),
            DecodeError::UnknownKind(_) => None,
        }
    }
}

impl Record {
    /// Decodes the state JSON text of a record of machine `kind` (the state file's
    /// `machine.state`).
    ///
    /// # Errors
    ///
    /// [`DecodeError::UnknownKind`] for a kind no machine of this build writes,
    /// [`DecodeError::Invalid`] (naming the kind) when the state does not parse.
    pub fn decode(kind: &str, state: &str) -> Result<Record, DecodeError> {
        fn parse<T: serde::de::DeserializeOwned>(
            kind: &'static str,
            state: &str,
        ) -> Result<T, DecodeError> {
            serde_json::from_str(state).map_err(|e| DecodeError::Invalid {
                kind,
                source: without_position(e),
            })
        }
        match kind {
            LAUNCH => match serde_json::from_str::<LaunchReady>(state) {
                // Built field by field: a field added to the variant fails to compile here.
                Ok(LaunchReady { vm, state: _ }) => Ok(Record::Launch(LaunchState::Ready { vm })),
                Err(_) => parse(LAUNCH, state).map(Record::Launch),
            },
            TEARDOWN => parse(TEARDOWN, state).map(Record::Teardown),
            K3S => match serde_json::from_str::<K3sReady>(state) {
                Ok(K3sReady {
                    vm,
                    cluster,
                    k3s: _,
                }) => Ok(Record::K3s(K3sState::Ready { vm, cluster })),
                Err(_) => parse(K3S, state).map(Record::K3s),
            },
            other => Err(DecodeError::UnknownKind(other.to_string())),
        }
    }

    /// The record's journal kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Record::Launch(_) => LAUNCH,
            Record::Teardown(_) => TEARDOWN,
            Record::K3s(_) => K3S,
        }
    }

    /// The machine the record says is up: a launch that is ready, or a k3s machine in any
    /// stage after its VM came up (including a failed install). `None` for a teardown.
    pub fn vm(&self) -> Option<&VmRecord> {
        match self {
            Record::Launch(s) => s.ready(),
            Record::K3s(s) => s.vm(),
            Record::Teardown(_) => None,
        }
    }

    /// The cloud resources the record may own, whichever machine wrote it.
    pub fn owned(&self) -> Option<Owned> {
        match self {
            Record::Launch(s) => s.owned(),
            Record::Teardown(s) => s.owned(),
            Record::K3s(s) => s.owned(),
        }
    }

    /// The serde tag of the top-level state (`ready`, `requesting`, `installing`, …), as
    /// written in the state file; `None` if it cannot be serialized.
    pub fn tag(&self) -> Option<String> {
        // The launch and teardown machines tag their states `state`, the k3s machine `k3s`.
        let (value, field) = match self {
            Record::Launch(s) => (serde_json::to_value(s), "state"),
            Record::Teardown(s) => (serde_json::to_value(s), "state"),
            Record::K3s(s) => (serde_json::to_value(s), "k3s"),
        };
        value.ok()?.get(field)?.as_str().map(str::to_string)
    }
}

// A state at rest is all `ready`, and serde's derive for internally tagged enums first
// copies the whole value into a buffer (most of a plan's decoding, issue 20): a `ready`
// state is read as a plain struct whose tag must be `ready`. Any other state, or a ready
// one that does not fit, fails here and takes the derived decoder, which gives its error.

/// The tag value of a `ready` state; any other tag does not deserialize.
#[derive(serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum ReadyTag {
    Ready,
}

/// The fields of `LaunchState::Ready` (tagged `state`), read as a plain struct.
#[derive(serde::Deserialize)]
struct LaunchReady {
    #[allow(dead_code)] // read to check the tag
    state: ReadyTag,
    vm: Box<VmRecord>,
}

/// The fields of `K3sState::Ready` (tagged `k3s`), as [`LaunchReady`].
#[derive(serde::Deserialize)]
struct K3sReady {
    #[allow(dead_code)] // read to check the tag
    k3s: ReadyTag,
    vm: Box<VmRecord>,
    cluster: Option<ClusterRecord>,
}

/// `e` without its line and column: they count within one record's text, not the state
/// file a reader would look them up in.
fn without_position(e: serde_json::Error) -> serde_json::Error {
    let text = e.to_string();
    let at = format!(" at line {} column {}", e.line(), e.column());
    match text.strip_suffix(&at) {
        Some(message) => serde::de::Error::custom(message),
        None => e,
    }
}

/// The machine a record of `kind` with `state` says is up (see [`Record::vm`]). `None`
/// for anything else, including a record that does not decode.
pub fn vm_of(kind: &str, state: &str) -> Option<VmRecord> {
    Record::decode(kind, state).ok()?.vm().cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kind_names_are_the_persisted_ones() {
        // The state file's format: changing these strands every existing record.
        assert_eq!([LAUNCH, TEARDOWN, K3S], ["launch", "teardown", "k3s"]);
    }

    #[test]
    fn decodes_each_kind_and_keeps_the_json() {
        let cases = [
            (
                LAUNCH,
                serde_json::to_value(LaunchState::start(None)).unwrap(),
            ),
            (TEARDOWN, serde_json::to_value(TeardownState::Done).unwrap()),
            (K3S, serde_json::to_value(K3sState::start(None)).unwrap()),
        ];
        for (kind, json) in cases {
            let r = Record::decode(kind, &json.to_string()).unwrap();
            assert_eq!(r.kind(), kind);
            let back = match &r {
                Record::Launch(s) => serde_json::to_value(s),
                Record::Teardown(s) => serde_json::to_value(s),
                Record::K3s(s) => serde_json::to_value(s),
            }
            .unwrap();
            assert_eq!(back, json, "{kind}: decoding must not change the format");
            assert!(r.vm().is_none() && r.owned().is_none(), "{kind}");
            assert!(r.tag().is_some(), "{kind}");
            assert_eq!(vm_of(kind, &json.to_string()), None);
        }
    }

    #[test]
    fn a_ready_state_decodes_as_the_derived_decoder_decodes_it() {
        let vm = || -> Box<VmRecord> {
            serde_json::from_value(serde_json::json!({
                "instance_id": "i-1",
                "location": {"cloud": "aws", "region": "us-east-1", "zone": "us-east-1a"},
                "offer": {"id": "aws/us-east-1a/p5.48xlarge", "instance_type": "p5.48xlarge",
                          "location": {"cloud": "aws", "region": "us-east-1"},
                          "gpu": "H100", "gpu_count": 8, "spot": true, "price_per_hour": 12.5,
                          "detail": {"ami": "ami-1"}},
                "ssh": {"host": "127.0.0.1", "port": 22, "user": "ubuntu"},
                "user": "ubuntu",
                "host_key": {"algorithm": "ssh-ed25519", "key_base64": "AAAA", "fingerprint": "SHA256:x"},
                "ready_at": "2026-12-01T10:00:00Z",
                "preemptions": [{"instance_id": "i-0", "offer_id": "o", "instance_type": "p5.48xlarge",
                                 "location": {"cloud": "aws", "region": "us-east-1"},
                                 "at": "2026-12-01T09:00:00Z", "signal": "spot-interruption"}]
            }))
            .unwrap()
        };
        let launch = serde_json::to_value(LaunchState::Ready { vm: vm() }).unwrap();
        let derived: LaunchState = serde_json::from_value(launch.clone()).unwrap();
        assert_eq!(
            Record::decode(LAUNCH, &launch.to_string()).unwrap(),
            Record::Launch(derived)
        );
        let mut cluster = serde_json::to_value(K3sState::Ready {
            vm: vm(),
            cluster: None,
        })
        .unwrap();
        for with_cluster in [false, true] {
            if with_cluster {
                cluster["cluster"] = serde_json::json!({
                    "kubeconfig": "/p/k", "kubelet_version": "v1.31.4+k3s1",
                    "allocatable_gpus": 8, "access": {"mode": "direct", "host": "127.0.0.1"}
                });
            }
            let derived: K3sState = serde_json::from_value(cluster.clone()).unwrap();
            assert_eq!(
                Record::decode(K3S, &cluster.to_string()).unwrap(),
                Record::K3s(derived),
                "with cluster: {with_cluster}"
            );
        }
        // A ready state that does not fit keeps the derived decoder's error.
        let e = Record::decode(LAUNCH, r#"{"state": "ready"}"#).unwrap_err();
        assert!(e.to_string().contains("missing field `vm`"), "{e}");
    }

    #[test]
    fn errors_name_the_kind() {
        let e = Record::decode("launch", r#"{"state": "nope"}"#).unwrap_err();
        assert_eq!(e.invalid_kind(), Some("launch"));
        // No line and column: they would count within the record, not the file.
        assert!(!e.to_string().contains(" at line "), "{e}");
        assert!(
            e.to_string().starts_with("not a valid launch state: "),
            "{e}"
        );
        let e = Record::decode("spaceship", "{}").unwrap_err();
        assert_eq!(e.invalid_kind(), None);
        assert_eq!(e.to_string(), "unknown machine kind \"spaceship\"");
        assert_eq!(vm_of("spaceship", "{}"), None);
    }
}
