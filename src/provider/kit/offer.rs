//! Offers as most clouds list them: one instance type in one region, on demand.

use super::super::{ErrorKind, Location, Offer, ProviderError, ResourceRequest, Result};

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

#[cfg(test)]
mod tests {
    #[test]
    fn ids_name_cloud_region_and_type() {
        let o = super::on_demand("acme", "r1", "big", 2.5);
        assert_eq!(o.id, "acme/r1/big");
        assert_eq!((o.location.region.as_str(), o.spot), ("r1", false));
    }
}
