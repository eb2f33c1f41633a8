//! The core's offer policy, "preference = order" (design 4.3): within one cloud, offers
//! in the ask's region order, then cheapest first; clouds in the ask's cloud order. The
//! core applies it after every `plan` (the launch machine's search, `plan`'s preflight,
//! `gpuprov offers --vm`), so what the plan shows is what apply tries; adapters do not
//! order their offers (one that must cut its list, DigitalOcean's CPU sizes, cuts in
//! this order). It lives beside the contract so both sides can name it.

use super::{BlockScope, Capabilities, Offer, ResourceRequest};

/// Moves every offer that a scope in `preempted` covers (the instance type and region of
/// a recent spot preemption) after all the others, keeping both groups' order, across
/// clouds: apply tries everything else first, and still the preempted one last (it may
/// be the only one). Applied by the core after [`order`] and the price filter, also to
/// clouds that keep their own order. Returns how many offers moved.
pub fn demote_preempted(offers: &mut Vec<Offer>, preempted: &[BlockScope]) -> usize {
    let hit = |o: &Offer| preempted.iter().any(|s| s.covers(o));
    let (last, mut first): (Vec<Offer>, Vec<Offer>) = offers.drain(..).partition(hit);
    let moved = last.len();
    first.extend(last);
    *offers = first;
    moved
}

/// Sorts one cloud's `offers` for `req`: the position of the offer's region in
/// `req.regions`, or when the ask names none in the cloud's own
/// [`Capabilities::default_regions`] (matched without case; 0 when neither lists it),
/// then price (USD per hour), instance type and region name. Stable: offers equal in all
/// of these (an instance type's zones, a marketplace's tiers) keep the adapter's order.
///
/// A cloud declaring [`Capabilities::keeps_offer_order`] keeps its own order.
pub fn order(offers: &mut [Offer], req: &ResourceRequest, caps: &Capabilities) {
    if caps.keeps_offer_order {
        return;
    }
    let preferred = if req.regions.is_empty() {
        &caps.default_regions
    } else {
        &req.regions
    };
    let rank = |o: &Offer| {
        preferred
            .iter()
            .position(|r| r.eq_ignore_ascii_case(&o.location.region))
            .unwrap_or(0)
    };
    offers.sort_by(|a, b| {
        rank(a)
            .cmp(&rank(b))
            .then(a.price_per_hour.total_cmp(&b.price_per_hour))
            .then_with(|| a.instance_type.cmp(&b.instance_type))
            .then_with(|| a.location.region.cmp(&b.location.region))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::Location;

    fn offer(region: &str, ty: &str, zone: Option<&str>, price: f64) -> Offer {
        Offer {
            id: format!("c/{region}/{ty}/{}", zone.unwrap_or("-")),
            location: Location {
                cloud: "c".into(),
                region: region.into(),
                zone: zone.map(str::to_string),
            },
            instance_type: ty.into(),
            gpu: None,
            gpu_count: 0,
            spot: false,
            price_per_hour: price,
            detail: serde_json::Value::Null,
            facts: Default::default(),
        }
    }

    #[test]
    fn preempted_type_and_region_go_last_in_every_zone_but_stay() {
        let mut o = vec![
            offer("us-east-1", "h100", Some("a"), 1.0),
            offer("us-east-1", "h100", Some("b"), 1.0),
            offer("us-west-2", "h100", None, 2.0),
            offer("us-east-1", "a100", None, 3.0),
        ];
        let scope = BlockScope::InstanceTypeInRegion {
            cloud: "c".into(),
            region: "us-east-1".into(),
            instance_type: "h100".into(),
        };
        assert_eq!(demote_preempted(&mut o, std::slice::from_ref(&scope)), 2);
        let ids: Vec<&str> = o.iter().map(|o| o.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "c/us-west-2/h100/-",
                "c/us-east-1/a100/-",
                "c/us-east-1/h100/a",
                "c/us-east-1/h100/b"
            ]
        );
        let mut only = vec![offer("us-east-1", "h100", None, 1.0)];
        assert_eq!(demote_preempted(&mut only, &[scope]), 1);
        assert_eq!(only.len(), 1, "the only offer is kept, tried last");
        assert_eq!(demote_preempted(&mut o, &[]), 0);
    }

    #[test]
    fn region_preference_first_then_price_and_zones_keep_their_order() {
        let req = ResourceRequest {
            vm_name: "a".into(),
            regions: vec!["us-east-13".into(), "US-EAST-1".into()],
            zones: vec![],
            gpu: None,
            gpu_count: 0,
            spot: false,
            max_price_per_hour: None,
            gpu_count_at_least: false,
        };
        let mut o = vec![
            offer("us-east-1", "h100", None, 23.92),
            offer("us-east-1", "a100", None, 10.32),
            offer("us-east-13", "h100", Some("b"), 23.92),
            offer("us-east-13", "h100", Some("a"), 23.92),
        ];
        order(&mut o, &req, &Capabilities::default());
        let ids: Vec<&str> = o.iter().map(|o| o.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "c/us-east-13/h100/b",
                "c/us-east-13/h100/a",
                "c/us-east-1/a100/-",
                "c/us-east-1/h100/-"
            ]
        );
        let caps = Capabilities {
            default_regions: vec!["us-east-1".into()],
            ..Capabilities::default()
        };
        let unasked = ResourceRequest {
            regions: vec![],
            ..req
        };
        order(&mut o, &unasked, &caps);
        assert_eq!(
            o[0].id, "c/us-east-1/a100/-",
            "the cloud's preference when none asked"
        );
        order(&mut o, &unasked, &Capabilities::default());
        assert_eq!(o[0].id, "c/us-east-1/a100/-", "cheapest first");
        assert_eq!(
            o[3].id, "c/us-east-13/h100/a",
            "then type and region name, stable"
        );
    }
}
