//! Discovery by identity (issue 18): every cloud object carries the VM name and the
//! lineage, so what a state does not know can still be found. [`discover`] lists the
//! locations a config may run in ([`CloudProvider::list`]) and sorts what carries the
//! identity labels into:
//! - **this lineage, unknown to the state** (a state restored from an old backup, a crash
//!   before the first fold on another machine): [`fold`] turns the machine's `Create` into
//!   an adoption, so `apply` takes the instance over instead of starting a second one;
//! - **another lineage, with a name of this config** (the state was lost or replaced):
//!   shown, never adopted; `gpuprov state recover --lineage L` rebuilds a state from them;
//! - everything else (`gpuprov sweep` shows what no state here knows).
//!
//! [`CloudProvider::list`]: crate::provider::CloudProvider::list

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::machine::Providers;
use crate::provider::{InstanceStatus, Listed, Location};
use crate::state::StateFile;

use super::{Action, Plan};

/// One instance found by its identity labels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FoundInstance {
    /// The VM name its `gpuprov-vm-name` label carries.
    pub vm: String,
    /// Its `gpuprov-lineage` label.
    pub lineage: String,
    /// `cloud/region[/zone]` where it runs (the zone when the listing shows one).
    pub location: String,
    pub cloud: String,
    pub region: String,
    /// The zone it runs in, on a zonal cloud whose listing shows it ([`Listed::zone`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    pub instance_id: String,
    /// The normalised status (`running`, `pending`, `stopped`, …).
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,
    /// USD per hour, when the cloud's listing gives it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_per_hour: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl FoundInstance {
    /// The instance `l` listed at `at` (in the zone the listing shows, if any).
    pub fn of(at: &Location, l: &Listed) -> FoundInstance {
        let status = serde_json::to_value(&l.observed.status)
            .ok()
            .and_then(|v| v.get("status").and_then(|s| s.as_str()).map(str::to_string))
            .unwrap_or_default();
        let zone = l.zone.clone().or_else(|| at.zone.clone());
        let runs_at = Location {
            zone: zone.clone(),
            ..at.clone()
        };
        FoundInstance {
            vm: l.vm_name.clone(),
            lineage: l.lineage.clone(),
            location: runs_at.to_string(),
            cloud: at.cloud.clone(),
            region: at.region.clone(),
            zone,
            instance_id: l.observed.instance_id.clone(),
            status,
            instance_type: l.instance_type.clone(),
            price_per_hour: l.price_per_hour,
            created_at: l.created_at,
        }
    }

    /// The location as the contract spells it: the zone it runs in when known, else
    /// region-wide (a zonal cloud's observe and delete then stay in that zone).
    pub fn at(&self) -> Location {
        Location {
            cloud: self.cloud.clone(),
            region: self.region.clone(),
            zone: self.zone.clone(),
        }
    }
}

/// What [`discover`] found, in the locations it could list.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Discovery {
    /// Every live instance carrying both identity labels, by location listed.
    pub listed: Vec<FoundInstance>,
    /// Locations that could not be listed, with the cloud's reason (an API error): what
    /// is there is unknown.
    pub unlisted: Vec<(String, String)>,
}

impl Discovery {
    /// The instances of `lineage` that `known` (instance ids a state records) does not
    /// name.
    pub fn unknown_of<'a>(
        &'a self,
        lineage: &'a str,
        known: &'a BTreeSet<String>,
    ) -> impl Iterator<Item = &'a FoundInstance> + 'a {
        self.listed
            .iter()
            .filter(move |f| f.lineage == lineage && !known.contains(&f.instance_id))
    }

    /// Instances named like one of `names` under another lineage than `lineage`.
    pub fn foreign<'a>(
        &'a self,
        lineage: &'a str,
        names: &'a BTreeSet<String>,
    ) -> impl Iterator<Item = &'a FoundInstance> + 'a {
        self.listed
            .iter()
            .filter(move |f| f.lineage != lineage && names.contains(&f.vm))
    }

    /// The lineages found with instances named like `names`, other than `lineage`, each
    /// with its instances.
    pub fn foreign_lineages(
        &self,
        lineage: &str,
        names: &BTreeSet<String>,
    ) -> BTreeMap<String, Vec<FoundInstance>> {
        let mut out: BTreeMap<String, Vec<FoundInstance>> = BTreeMap::new();
        for f in self.foreign(lineage, names) {
            out.entry(f.lineage.clone()).or_default().push(f.clone());
        }
        out
    }
}

/// The region-wide locations of `locations`, once each, in order.
pub fn regions(locations: impl IntoIterator<Item = Location>) -> Vec<Location> {
    let mut seen = BTreeSet::new();
    locations
        .into_iter()
        .map(|l| Location { zone: None, ..l })
        .filter(|l| seen.insert(l.clone()))
        .collect()
}

/// Lists every location once ([`CloudProvider::list`], one call per region) and keeps
/// the live instances carrying both identity labels. A location whose cloud has no
/// adapter in this run, or whose listing fails, is reported in
/// [`Discovery::unlisted`]: discovery never blocks a plan.
///
/// [`CloudProvider::list`]: crate::provider::CloudProvider::list
pub async fn discover(locations: &[Location], providers: &Providers) -> Discovery {
    let mut d = Discovery::default();
    for at in regions(locations.iter().cloned()) {
        let Some(p) = providers.get(&at.cloud) else {
            continue;
        };
        match p.list(&at).await {
            Ok(items) => d.listed.extend(
                items
                    .iter()
                    .filter(|l| {
                        l.observed.exists() && l.observed.status != InstanceStatus::Terminating
                    })
                    .map(|l| FoundInstance::of(&at, l)),
            ),
            Err(e) => d.unlisted.push((at.to_string(), e.text())),
        }
    }
    d
}

/// Every instance id the state's records may own (any record kind, any stage).
pub fn known_ids(state: &StateFile) -> BTreeSet<String> {
    state
        .resources
        .values()
        .filter_map(|r| r.machine.decode().ok())
        .filter_map(|r| r.owned())
        .flat_map(|o| o.instance_ids)
        .collect()
}

/// The locations to look in: `offers` (the plan's catalog lookups) and the state's
/// records', region-wide, once each.
pub fn locations(offers: impl IntoIterator<Item = Location>, state: &StateFile) -> Vec<Location> {
    let recorded = state.resources.values().filter_map(|r| {
        r.machine
            .decode()
            .ok()
            .and_then(|r| r.owned())
            .map(|o| o.location)
    });
    regions(offers.into_iter().chain(recorded))
}

/// Folds what discovery found into `plan`: a machine to be created that has an instance of
/// this lineage the state does not know is adopted instead (`Resume`, with
/// [`Change::found`](super::Change::found)); instances of other lineages named like this
/// config's machines are listed in [`Plan::foreign`] when the state is new or lost (it
/// records nothing), so nobody creates a second fleet beside a lost one unknowingly.
pub fn fold(plan: &mut Plan, state: &StateFile, d: &Discovery) {
    let known = known_ids(state);
    let mut ours: BTreeMap<&str, Vec<&FoundInstance>> = BTreeMap::new();
    for f in d.unknown_of(&state.lineage, &known) {
        ours.entry(f.vm.as_str()).or_default().push(f);
    }
    for c in plan.changes.iter_mut() {
        if c.action != Action::Create {
            continue;
        }
        let Some(found) = ours.get(c.vm.as_str()) else {
            continue;
        };
        // A running one first: it is the one worth taking over.
        let mut found = found.clone();
        found.sort_by_key(|f| (f.status != "running", f.instance_id.clone()));
        let f = found[0];
        let more = if found.len() > 1 {
            format!(
                "; {} more carry the same identity (`gpuprov sweep` lists them)",
                found.len() - 1
            )
        } else {
            String::new()
        };
        c.action = Action::Resume;
        c.reason = Some(format!(
            "found instance {} at {} ({}) carrying this machine's identity, which the state \
             does not record; apply adopts it instead of creating another{more}",
            f.instance_id, f.location, f.status
        ));
        c.attributes.clear();
        c.offers.clear();
        c.no_offers.clear();
        if f.price_per_hour.is_some() {
            c.price_per_hour = f.price_per_hour;
        }
        c.found = Some(f.clone());
    }
    if state.resources.is_empty() {
        let names: BTreeSet<String> = plan.changes.iter().map(|c| c.vm.clone()).collect();
        plan.foreign = d.foreign(&state.lineage, &names).cloned().collect();
    }
    plan.unlisted = d.unlisted.clone();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::Observed;

    fn listed(vm: &str, lineage: &str, id: &str, status: InstanceStatus) -> FoundInstance {
        let at = Location {
            cloud: "fake".into(),
            region: "r1".into(),
            zone: None,
        };
        FoundInstance::of(
            &at,
            &Listed {
                vm_name: vm.into(),
                lineage: lineage.into(),
                observed: Observed {
                    instance_id: id.into(),
                    status,
                    ssh: None,
                },
                instance_type: None,
                created_at: None,
                price_per_hour: None,
                zone: None,
            },
        )
    }

    #[test]
    fn regions_drop_zones_and_repeat() {
        let l = |r: &str, z: Option<&str>| Location {
            cloud: "aws".into(),
            region: r.into(),
            zone: z.map(str::to_string),
        };
        let got = regions([
            l("a", Some("a1")),
            l("a", Some("a2")),
            l("b", None),
            l("a", None),
        ]);
        assert_eq!(got, vec![l("a", None), l("b", None)]);
    }

    #[test]
    fn unknown_and_foreign_are_told_apart() {
        let d = Discovery {
            listed: vec![
                listed("a", "L1", "i-1", InstanceStatus::Running),
                listed("a", "L1", "i-2", InstanceStatus::Running),
                listed("a", "L2", "i-3", InstanceStatus::Running),
                listed("zz", "L3", "i-4", InstanceStatus::Running),
            ],
            ..Discovery::default()
        };
        let known: BTreeSet<String> = ["i-1".to_string()].into();
        let unknown: Vec<_> = d.unknown_of("L1", &known).map(|f| &f.instance_id).collect();
        assert_eq!(unknown, ["i-2"]);
        let names: BTreeSet<String> = ["a".to_string()].into();
        let foreign = d.foreign_lineages("L1", &names);
        assert_eq!(foreign.keys().collect::<Vec<_>>(), ["L2"]);
        assert_eq!(foreign["L2"][0].instance_id, "i-3");
        assert_eq!(d.listed[0].status, "running");
    }

    /// A stale state (it knows `a` only) meets the cloud: `b` of this lineage is adopted,
    /// and nothing of another lineage is shown while the state records machines; an
    /// empty state names the other lineage and how to recover it.
    #[test]
    fn fold_adopts_this_lineage_and_names_a_lost_one() {
        let config = crate::config::Config::parse(
            std::path::Path::new("gpuprov.toml"),
            "[defaults]\nclouds = [\"docker\"]\n[vm.a]\n[vm.b]\n".into(),
        )
        .unwrap();
        let mut empty = StateFile::new();
        empty.lineage = "L1".into();
        let d = Discovery {
            listed: vec![
                listed("b", "L1", "i-b", InstanceStatus::Running),
                listed("b", "L1", "i-b2", InstanceStatus::Stopped),
                listed("a", "L2", "i-x", InstanceStatus::Running),
            ],
            ..Discovery::default()
        };
        let mut plan = super::super::compute(&config, &empty, None, &|_| Some(1.0)).unwrap();
        fold(&mut plan, &empty, &d);
        let b = plan.changes.iter().find(|c| c.vm == "b").unwrap();
        assert_eq!(b.action, Action::Resume);
        assert_eq!(
            b.found.as_ref().unwrap().instance_id,
            "i-b",
            "the running one"
        );
        let a = plan.changes.iter().find(|c| c.vm == "a").unwrap();
        assert_eq!(a.action, Action::Create, "another lineage is never adopted");
        assert_eq!(plan.foreign.len(), 1);
        insta::assert_snapshot!(
            "plan_with_found_and_foreign",
            crate::cli::view::text::render(&plan)
        );
        // A state that records a machine: the other lineage is another project's.
        let mut stale = empty.clone();
        stale.resources.insert(
            "vm.a".into(),
            crate::state::ResourceRecord::new(crate::state::MachineRecord {
                kind: "launch".into(),
                state: serde_json::json!({"state": "planning", "round": 0}).into(),
                label: "planning".into(),
                updated_at: chrono::Utc::now(),
            }),
        );
        let mut plan = super::super::compute(&config, &stale, None, &|_| Some(1.0)).unwrap();
        fold(&mut plan, &stale, &d);
        assert!(plan.foreign.is_empty());
    }
}
