//! The catalogue mapped onto offers: instance types (`GET /instance-types?currency=usd`)
//! joined with their availability per location (`GET /instance-availability`).

use serde_json::json;

use super::api::{InstanceType, LocationAvailability};
use super::CLOUD;
use crate::provider::kit::{self, gpu};
use crate::provider::{Offer, ResourceRequest};

/// The GPU model of an instance type: `model`, else the description after `Nx `.
pub(super) fn model_of(t: &InstanceType) -> Option<String> {
    if t.gpu.number_of_gpus == 0 {
        return None;
    }
    let m = t.model.trim();
    if !m.is_empty() {
        return Some(m.to_string());
    }
    let d = t.gpu.description.trim();
    let d = d.split_once("x ").map(|(_, r)| r).unwrap_or(d);
    d.split_whitespace().next().map(str::to_string)
}

/// Whether a type fits the ask: the GPU model ([`gpu::same_model`]) and the exact GPU
/// count, when asked.
pub(super) fn type_matches(t: &InstanceType, req: &ResourceRequest) -> bool {
    req.gpu
        .as_ref()
        .is_none_or(|w| model_of(t).is_some_and(|m| gpu::same_model(w, &m)))
        && kit::gpu::count_fits(req, t.gpu.number_of_gpus)
}

/// The price of a type, USD per hour (spot or on demand); `None` when not in USD or not
/// given.
fn price_of(t: &InstanceType, spot: bool) -> Option<f64> {
    if !t.currency.is_empty() && !t.currency.eq_ignore_ascii_case("usd") {
        return None;
    }
    if spot {
        t.spot_price
    } else {
        t.price_per_hour
    }
}

/// Offers for the ask: each available type of each location (exact codes when asked).
/// Unordered: the core orders them.
pub(super) fn offers_for(
    types: &[InstanceType],
    avail: &[LocationAvailability],
    req: &ResourceRequest,
) -> Vec<Offer> {
    let mut offers = Vec::new();
    for loc in avail {
        if !req.regions.is_empty() && !req.regions.contains(&loc.location_code) {
            continue;
        }
        for name in &loc.availabilities {
            let Some(t) = types
                .iter()
                .find(|t| t.instance_type == *name && type_matches(t, req))
            else {
                continue;
            };
            let Some(price) = price_of(t, req.spot) else {
                continue;
            };
            let base = kit::offer::on_demand(CLOUD, &loc.location_code, name, price);
            offers.push(Offer {
                id: if req.spot {
                    format!("{}/spot", base.id)
                } else {
                    base.id.clone()
                },
                gpu: model_of(t),
                gpu_count: t.gpu.number_of_gpus,
                spot: req.spot,
                detail: json!({ "gpu": t.gpu.description }),
                // `InstanceType.cpu.number_of_cores`, `memory.size_in_gigabytes`.
                facts: crate::provider::OfferFacts {
                    vcpus: t.cpu.number_of_cores,
                    memory_gib: t.memory.size_in_gigabytes,
                    ..Default::default()
                },
                ..base
            });
        }
    }
    offers
}
