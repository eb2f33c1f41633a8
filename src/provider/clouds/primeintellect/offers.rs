//! The live availability (`GET /api/v1/availability/gpus`) mapped onto offers.

use serde_json::json;

use super::api::GpuAvailability;
use super::CLOUD;
use crate::provider::kit::{self, gpu};
use crate::provider::{Location, Offer, ResourceRequest};

/// The GPU model of a `GPUType`: without its `_<N>GB` memory suffix (`H100_80GB` → `H100`,
/// `RTX_PRO_6000B_96GB` → `RTX_PRO_6000B`, `GB200` → `GB200`).
pub fn gpu_model(gpu_type: &str) -> &str {
    match gpu_type.rsplit_once('_') {
        Some((model, mem))
            if mem.len() > 2
                && mem.ends_with("GB")
                && mem[..mem.len() - 2].bytes().all(|b| b.is_ascii_digit()) =>
        {
            model
        }
        _ => gpu_type,
    }
}

/// Whether the asked model `want` names `GPUType` `gpu_type`: its model (`H100` names
/// `H100_80GB`; `A100` both A100 types) or the whole type (`A100 80GB`), compared with
/// [`gpu::same_model`].
pub fn gpu_matches(want: &str, gpu_type: &str) -> bool {
    gpu::same_model(want, gpu_model(gpu_type)) || gpu::same_model(want, gpu_type)
}

/// The region of a configuration: its data centre, else its region.
pub(super) fn region_of(g: &GpuAvailability) -> Option<&str> {
    g.data_center
        .as_deref()
        .or(g.region.as_deref())
        .map(str::trim)
        .filter(|r| !r.is_empty())
}

fn is_community(g: &GpuAvailability) -> bool {
    g.security.as_deref() == Some("community_cloud")
}

/// The configuration's price in USD per hour for the whole pod (see the module docs);
/// `None` in another currency or without a price.
fn price_of(g: &GpuAvailability) -> Option<f64> {
    let p = &g.prices;
    if !p
        .currency
        .as_deref()
        .unwrap_or("USD")
        .eq_ignore_ascii_case("USD")
    {
        return None;
    }
    if is_community(g) {
        p.community_price.or(p.on_demand)
    } else {
        p.on_demand.or(p.community_price)
    }
}

/// Whether a configuration fits the ask (GPU type, exact count, spot or not).
fn config_matches(g: &GpuAvailability, req: &ResourceRequest) -> bool {
    req.gpu.as_ref().is_none_or(|w| gpu_matches(w, &g.gpu_type))
        && kit::gpu::count_fits(req, g.gpu_count)
        && g.is_spot.unwrap_or(false) == req.spot
}

/// The offer id of a configuration.
pub(super) fn offer_id(g: &GpuAvailability, region: &str) -> String {
    let provider = g.provider.as_deref().unwrap_or("-");
    let id = format!("{CLOUD}/{region}/{provider}/{}", g.cloud_id);
    if is_community(g) {
        format!("{id}/community")
    } else {
        id
    }
}

/// Offers of the listed configurations for the ask. Unordered: the core orders them.
pub(super) fn offers_for(items: &[GpuAvailability], req: &ResourceRequest) -> Vec<Offer> {
    let mut offers = Vec::new();
    for g in items.iter().filter(|g| config_matches(g, req)) {
        if g.stock_status.as_deref() == Some("Unavailable") {
            continue;
        }
        let (Some(region), Some(price)) = (region_of(g), price_of(g)) else {
            continue;
        };
        if !req.regions.is_empty() && !req.regions.iter().any(|r| r.eq_ignore_ascii_case(region)) {
            continue;
        }
        offers.push(Offer {
            id: offer_id(g, region),
            location: Location {
                cloud: CLOUD.to_string(),
                region: region.to_string(),
                zone: None,
            },
            instance_type: g.cloud_id.clone(),
            gpu: Some(gpu_model(&g.gpu_type).to_string()),
            gpu_count: g.gpu_count,
            spot: req.spot,
            price_per_hour: price,
            detail: json!({
                "cloud_id": g.cloud_id,
                "gpu_type": g.gpu_type,
                "socket": g.socket,
                "provider": g.provider,
                "security": g.security,
                "data_center": g.data_center,
                "stock": g.stock_status,
            }),
            // `GpuAvailability.vcpu` / `memory` / `disk` (`CustomSpecValue.defaultCount`).
            facts: crate::provider::OfferFacts {
                vcpus: g.vcpu.default_count,
                memory_gib: g.memory.default_count.map(f64::from),
                disk_gib: g.disk.default_count,
                ..Default::default()
            },
        });
    }
    offers
}
