//! The state's records decoded ahead of [`compute`](super::compute): decoding each
//! record's text (its machine state and the settings it was applied with) is most of a
//! large plan's cost (issue 20, BENCHMARKS.md), and it depends on nothing but the state,
//! so it runs on every core, side by side with the catalog lookups.

use std::collections::BTreeMap;

use super::{recorded, Recorded};
use crate::config::VmSpec;
use crate::state::{ResourceRecord, StateFile};

/// Below this many records the decode stays on the calling thread: starting a thread
/// (tens of microseconds) would cost more than it saves.
pub const PARALLEL_FROM: usize = 256;

/// One record as the plan reads it.
pub(super) struct Decoded {
    /// The settings the machine was last applied with (`desired`), `None` when the record
    /// has none or they do not decode (a record older than the snapshot).
    pub had: Option<VmSpec>,
    /// Its machine state, or the error naming the address ([`recorded`]).
    pub was: Result<Recorded, String>,
}

/// Every record of one state, decoded, by address. Built by [`ReadAhead::of`]; read by
/// [`compute_with`](super::compute_with).
pub struct ReadAhead<'s> {
    pub(super) by_address: BTreeMap<&'s str, Decoded>,
    state: &'s StateFile,
}

impl<'s> ReadAhead<'s> {
    /// Decodes every record of `state`, on up to `threads` threads (one below
    /// [`PARALLEL_FROM`] records). A record that does not decode is kept as its error;
    /// nothing fails here.
    pub fn of(state: &'s StateFile, threads: usize) -> ReadAhead<'s> {
        let records: Vec<(&'s str, &'s ResourceRecord)> = state
            .resources
            .iter()
            .map(|(a, r)| (a.as_str(), r))
            .collect();
        let threads = if records.len() < PARALLEL_FROM {
            1
        } else {
            threads.max(1)
        };
        let decoded: Vec<(&'s str, Decoded)> = if threads == 1 {
            records.iter().map(|&(a, r)| (a, decode(a, r))).collect()
        } else {
            let chunk = records.len().div_ceil(threads).max(1);
            std::thread::scope(|s| {
                let parts: Vec<_> = records
                    .chunks(chunk)
                    .map(|part| {
                        s.spawn(move || {
                            part.iter()
                                .map(|&(a, r)| (a, decode(a, r)))
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                parts
                    .into_iter()
                    .flat_map(|p| p.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                    .collect()
            })
        };
        // In address order already, so the map is built without a search per record.
        ReadAhead {
            by_address: decoded.into_iter().collect(),
            state,
        }
    }

    /// The decoded record of `address` (`None` when the state has none).
    pub(super) fn get(&self, address: &str) -> Option<&Decoded> {
        self.by_address.get(address)
    }

    /// The clouds the records hold something on (an instance, or side resources being
    /// torn down), by name, once each: every one needs its adapter in a run, whether the
    /// config still names it or not. A record that does not decode names none (the plan
    /// refuses it with its own diagnostic).
    pub fn clouds(&self) -> std::collections::BTreeSet<String> {
        let mut out = std::collections::BTreeSet::new();
        for (address, d) in &self.by_address {
            // A ready machine, the common record, is read in place rather than cloned.
            let owned = match &d.was {
                Ok(Recorded::Launch(crate::vm::LaunchState::Ready { vm })) => {
                    if !out.contains(&vm.location.cloud) {
                        out.insert(vm.location.cloud.clone());
                    }
                    continue;
                }
                Ok(Recorded::Launch(s)) => s.owned(),
                Ok(Recorded::Teardown(s)) => s.owned(),
                // The plan reads a cluster in progress without its VM: the record has it.
                Ok(Recorded::K3sPending { .. }) => self
                    .state
                    .resources
                    .get(*address)
                    .and_then(|r| r.machine.owned().ok().flatten()),
                Err(_) => None,
            };
            if let Some(o) = owned {
                out.insert(o.location.cloud);
            }
        }
        out
    }
}

fn decode(address: &str, r: &ResourceRecord) -> Decoded {
    Decoded {
        had: r.desired.as_ref().and_then(|d| d.decode::<VmSpec>().ok()),
        was: recorded(address, r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{JsonText, MachineRecord};

    fn state(n: usize, bad: Option<usize>) -> StateFile {
        let mut s = StateFile::new();
        for i in 0..n {
            let machine = MachineRecord {
                kind: if Some(i) == bad {
                    "nonsense"
                } else {
                    "teardown"
                }
                .into(),
                state: JsonText::encode(&serde_json::json!({"state": "done"})).unwrap(),
                label: "done".into(),
                updated_at: chrono::Utc::now(),
            };
            s.resources
                .insert(format!("vm.m{i:04}"), ResourceRecord::new(machine));
        }
        s
    }

    /// Split over threads or not, every record is decoded once, under its own address,
    /// and a bad one is kept as its error rather than failing the rest.
    #[test]
    fn every_record_is_decoded_under_its_address_on_any_number_of_threads() {
        let s = state(PARALLEL_FROM + 7, Some(100));
        for threads in [1, 2, 3] {
            let ahead = ReadAhead::of(&s, threads);
            assert_eq!(ahead.by_address.len(), s.resources.len());
            for (i, address) in s.resources.keys().enumerate() {
                let d = ahead.get(address).expect("decoded");
                match (i, &d.was) {
                    (100, Err(e)) => assert!(e.contains("vm.m0100"), "{e}"),
                    (100, Ok(_)) => panic!("the bad record decoded"),
                    (_, Ok(Recorded::Teardown(_))) => {}
                    (_, Ok(_)) => panic!("{address}: decoded as another kind"),
                    (_, Err(e)) => panic!("{address}: {e}"),
                }
                assert!(d.had.is_none());
            }
            assert!(ahead.get("vm.absent").is_none());
        }
    }
}
