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
                zone: s.zone.clone(),
                observed: s.observed(),
            })
        })
        .collect();
    out.sort_by(|a, b| a.observed.instance_id.cmp(&b.observed.instance_id));
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
    use crate::provider::{InstanceStatus, Shown};

    #[test]
    fn still_listed_keeps_the_asked_and_alive() {
        let items = [("a", true), ("b", true), ("d", false)];
        let left = still_listed(
            items.to_vec(),
            &["a".into(), "d".into(), "x".into()],
            |i| i.0,
            |i| i.1,
        );
        assert_eq!(left, [("a", true)]);
    }

    #[test]
    fn observe_observe_location_and_list_read_one_listing_alike() {
        let l = Lineage::parse("0f0e0d0c-1111-4222-8333-444455556666").unwrap();
        let other = "9f0e0d0c-1111-4222-8333-444455556666";
        let at = Location {
            cloud: "c".into(),
            region: "r".into(),
            zone: None,
        };
        let seen = |id: &str, shown: Shown| Seen::new(id, InstanceStatus::Running, shown);
        let listing = || {
            vec![
                seen("2", Shown::labels(Some("a"), Some(l.as_str()))),
                seen(
                    "1",
                    Shown::default().named(Some("gpuprov-a-0f0e0d0c"), Default::default()),
                ),
                seen("3", Shown::labels(Some("a"), Some(other))),
                seen("4", Shown::labels(Some("b"), None)),
                seen("5", Shown::labels(Some("b"), Some(l.as_str()))),
            ]
        };
        let ids = |o: &[Observed]| o.iter().map(|o| o.instance_id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&observed_for(listing(), &l, &at, "a")), ["1", "2"]);
        let all = observations(listing(), &l, &at);
        assert_eq!(all.keys().collect::<Vec<_>>(), ["a", "b"]);
        for (vm, entries) in &all {
            assert_eq!(*entries, observed_for(listing(), &l, &at, vm), "{vm}");
        }
        let listed: Vec<(String, String, String)> = listed(listing(), &l, &at)
            .into_iter()
            .map(|x| (x.observed.instance_id, x.vm_name, x.lineage))
            .collect();
        assert_eq!(
            listed,
            [
                ("1".into(), "a".into(), l.to_string()),
                ("2".into(), "a".into(), l.to_string()),
                ("3".into(), "a".into(), other.to_string()),
                ("5".into(), "b".into(), l.to_string()),
            ]
        );
    }
}
