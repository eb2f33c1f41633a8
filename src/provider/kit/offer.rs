//! Offers as most clouds list them: one instance type in one region, on demand; the
//! spot refusal of clouds without spot; the fields `prepare` hands to `create`.

use super::super::{
    ErrorKind, Location, Offer, OfferFacts, ProviderError, ResourceRequest, Result,
};

/// The on-demand offer of `instance_type` in `region` of `cloud` at `price_per_hour` USD,
/// id `<cloud>/<region>/<type>`, without GPUs, zone or detail (set them with struct
/// update syntax).
pub fn on_demand(cloud: &str, region: &str, instance_type: &str, price_per_hour: f64) -> Offer {
    Offer {
        id: format!("{cloud}/{region}/{instance_type}"),
        location: Location {
            cloud: cloud.to_string(),
            region: region.to_string(),
            zone: None,
        },
        instance_type: instance_type.to_string(),
        gpu: None,
        gpu_count: 0,
        spot: false,
        price_per_hour,
        detail: serde_json::Value::Null,
        facts: Default::default(),
    }
}

/// The facts of an offer priced from gpuprov's built-in price list read on `as_of`
/// (`YYYY-MM-DD`); `spot_upper_bound` when a spot offer is shown at the on-demand price
/// because the vendor publishes no spot price.
pub fn facts_of_price_list(as_of: &str, spot_upper_bound: bool) -> OfferFacts {
    OfferFacts {
        prices_as_of: Some(as_of.to_string()),
        spot_price_is_upper_bound: spot_upper_bound,
        ..OfferFacts::default()
    }
}

/// Refuses a spot ask (`InvalidRequest` with `msg`) on a cloud that sells no spot
/// capacity; any other ask passes.
pub fn refuse_spot(req: &ResourceRequest, msg: &str) -> Result<()> {
    if req.spot {
        return Err(ProviderError::new(ErrorKind::InvalidRequest, msg));
    }
    Ok(())
}

/// The regions to offer in for `req` on a cloud with a built-in catalog: `defaults` when
/// the ask names none, else the asked regions that are in `known`, compared exactly (other
/// clouds' region names in the same list are skipped), in the asked order.
///
/// Errors: `InvalidRequest` when the ask names regions and none is known: "none of the
/// regions [..] is `what` gpuprov knows (for example `example`)".
pub fn catalog_regions(
    req: &ResourceRequest,
    defaults: &[&str],
    known: &[&str],
    what: &str,
    example: &str,
) -> Result<Vec<String>> {
    if req.regions.is_empty() {
        return Ok(defaults.iter().map(|s| s.to_string()).collect());
    }
    let ours: Vec<String> = req
        .regions
        .iter()
        .filter(|r| known.contains(&r.as_str()))
        .cloned()
        .collect();
    if ours.is_empty() {
        return Err(ProviderError::new(
            ErrorKind::InvalidRequest,
            format!(
                "none of the regions {:?} is {what} gpuprov knows (for example {example})",
                req.regions
            ),
        ));
    }
    Ok(ours)
}

/// Field `name` of the data `prepare` returned, read by `get` (`Value::as_str`,
/// `Value::as_i64`); absent or of another type → `InvalidRequest` ("prepared data has no
/// `name`"), since only a `prepare` of another version could have written it.
pub fn prepared<'a, T>(
    prep: &'a serde_json::Value,
    name: &str,
    get: impl FnOnce(&'a serde_json::Value) -> Option<T>,
) -> Result<T> {
    prep.get(name).and_then(get).ok_or_else(|| {
        ProviderError::new(
            ErrorKind::InvalidRequest,
            format!("prepared data has no {name}"),
        )
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_name_cloud_region_and_type() {
        let o = super::on_demand("acme", "r1", "big", 2.5);
        assert_eq!(o.id, "acme/r1/big");
        assert_eq!((o.location.region.as_str(), o.spot), ("r1", false));
    }
}
