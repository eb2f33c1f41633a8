//! What `observe` and `delete` make of one listing of the account's instances, for clouds
//! whose API has no filter by identity (the listing is filtered here).

use super::super::identity::{listed_identity, owner};
use super::super::{Lineage, Listed, Location, Observations, Observed, Seen};

/// What `observe(at, vm)` answers from a listing `seen` at `at`: the entries
/// [`owner`] gives to `vm` under `lineage`, sorted by instance id.
pub fn observed_for(seen: Vec<Seen>, lineage: &Lineage, at: &Location, vm: &str) -> Vec<Observed> {
    let mut out: Vec<Observed> = seen
        .into_iter()
        .filter(|s| owner(&s.identity, lineage, &at.region).as_deref() == Some(vm))
        .map(Seen::observed)
        .collect();
    out.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
    out
}

/// What `observe_location(at)` answers from a listing `seen` at `at`: every entry under
/// the VM [`owner`] gives it to (entries of no VM of `lineage` left out), each VM's
/// sorted by instance id, exactly as [`observed_for`] answers each VM.
pub fn observations(seen: Vec<Seen>, lineage: &Lineage, at: &Location) -> Observations {
    let mut out = Observations::new();
    for s in seen {
        if let Some(vm) = owner(&s.identity, lineage, &at.region) {
            out.entry(vm).or_default().push(s.observed());
        }
    }
    for entries in out.values_mut() {
        entries.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
    }
    out
}

/// What `list(at)` answers from a listing `seen` at `at`: every entry showing a whole
/// identity of any lineage ([`listed_identity`]), sorted by instance id.
pub fn listed(seen: Vec<Seen>, lineage: &Lineage, at: &Location) -> Vec<Listed> {
    let mut out: Vec<Listed> = seen
        .into_iter()
        .filter_map(|s| {
            let (vm_name, lineage) = listed_identity(&s.identity, lineage, &at.region)?;
            Some(Listed {
                vm_name,
                lineage,
                instance_type: s.instance_type.clone(),
                created_at: s.created_at,
                price_per_hour: s.price_per_hour,
                observed: s.observed(),
            })
        })
        .collect();
    out.sort_by(|a, b| a.observed.instance_id.cmp(&b.observed.instance_id));
    out
}

/// The instances among `items` that `ours` keeps, as `observed` reports them (`None`:
/// gone, left out), sorted by instance id so answers compare across calls.
pub fn observed_of<T>(
    items: &[T],
    ours: impl Fn(&T) -> bool,
    observed: impl Fn(&T) -> Option<Observed>,
) -> Vec<Observed> {
    let mut out: Vec<Observed> = items
        .iter()
        .filter(|i| ours(i))
        .filter_map(observed)
        .collect();
    out.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
    out
}

/// [`observed_of`] for every VM at once (`observe_location` over the same listing): each
/// item under the VM `vm_of` names (its identity label, or the VM an identity name
/// names), kept when `ours(item, vm)` holds, the rule `observe(vm)` keeps it by; each
/// VM's entries sorted by instance id. An item `vm_of` names no VM for is no VM's.
pub fn observations_of<T>(
    items: &[T],
    vm_of: impl Fn(&T) -> Option<String>,
    ours: impl Fn(&T, &str) -> bool,
    observed: impl Fn(&T) -> Option<Observed>,
) -> Observations {
    let mut out = Observations::new();
    for i in items {
        let Some(vm) = vm_of(i).filter(|vm| ours(i, vm)) else {
            continue;
        };
        if let Some(o) = observed(i) {
            out.entry(vm).or_default().push(o);
        }
    }
    for seen in out.values_mut() {
        seen.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
    }
    out
}

/// The items among `items` whose `id` is one of `ids` and that are still `alive` (not
/// gone): what a delete still has to ask for. An unknown id is simply not there, so the
/// vendor is never asked about it.
pub fn still_listed<T>(
    items: Vec<T>,
    ids: &[String],
    id: impl Fn(&T) -> &str,
    alive: impl Fn(&T) -> bool,
) -> Vec<T> {
    items
        .into_iter()
        .filter(|i| ids.iter().any(|x| x == id(i)) && alive(i))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::InstanceStatus;

    #[test]
    fn ours_sorted_and_the_gone_left_out() {
        let items = [
            ("b", true, true),
            ("a", true, true),
            ("c", false, true),
            ("d", true, false),
        ];
        let seen = observed_of(
            &items,
            |i| i.1,
            |i| {
                i.2.then(|| Observed {
                    instance_id: i.0.into(),
                    status: InstanceStatus::Running,
                    ssh: None,
                })
            },
        );
        let ids: Vec<&str> = seen.iter().map(|o| o.instance_id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        let left = still_listed(
            items.to_vec(),
            &["a".into(), "d".into(), "x".into()],
            |i| i.0,
            |i| i.2,
        );
        assert_eq!(left, [("a", true, true)]);
    }

    #[test]
    fn observations_group_by_vm_under_the_observe_rule() {
        // (id, vm named, vm the rule accepts, alive)
        let items = [
            ("2", Some("a"), "a", true),
            ("1", Some("a"), "a", true),
            ("3", Some("b"), "x", true),
            ("4", None, "a", true),
            ("5", Some("c"), "c", false),
        ];
        let all = observations_of(
            &items,
            |i| i.1.map(str::to_string),
            |i, vm| i.2 == vm,
            |i| {
                i.3.then(|| Observed {
                    instance_id: i.0.into(),
                    status: InstanceStatus::Running,
                    ssh: None,
                })
            },
        );
        let got: Vec<(&str, Vec<&str>)> = all
            .iter()
            .map(|(vm, s)| {
                (
                    vm.as_str(),
                    s.iter().map(|o| o.instance_id.as_str()).collect(),
                )
            })
            .collect();
        assert_eq!(got, [("a", vec!["1", "2"])]);
    }
}
