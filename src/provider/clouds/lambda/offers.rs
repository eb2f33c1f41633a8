//! Lambda's catalog as offers: the GPU model of an instance type, whether it fits the ask,
//! and one offer per type and region with capacity (`GET /api/v1/instance-types`).

use serde_json::json;

use super::api::TypesItem;
use super::{gpu, kit, Offer, ResourceRequest, CLOUD};

/// The GPU model of an instance type: `gpu_description` up to ` (` (`"H100 (80 GB SXM5)"`
/// → `H100`, `"RTX 6000 (24 GB)"` → `RTX 6000`), else the token after `gpu_<N>x_` in the
/// name (`gpu_8x_h100_sxm5` → `H100`). `None` for types without GPUs.
pub fn gpu_model(gpu_description: &str, type_name: &str, gpus: u32) -> Option<String> {
    if gpus == 0 {
        return None;
    }
    let from_desc = gpu_description
        .split(" (")
        .next()
        .unwrap_or_default()
        .trim();
    if !from_desc.is_empty() {
        return Some(from_desc.to_string());
    }
    let mut parts = type_name.split('_');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("gpu"), Some(n), Some(model)) if n.ends_with('x') => Some(model.to_uppercase()),
        _ => None,
    }
}

/// The GPU model of a listed type (see [`gpu_model`]).
pub(super) fn model_of(t: &TypesItem) -> Option<String> {
    let it = &t.instance_type;
    gpu_model(&it.gpu_description, &it.name, it.specs.gpus)
}

/// Whether a type fits the ask: the GPU model (compared with [`gpu::same_model`]) and the
/// exact GPU count, when asked.
pub(super) fn type_matches(t: &TypesItem, req: &ResourceRequest) -> bool {
    req.gpu
        .as_ref()
        .is_none_or(|want| model_of(t).is_some_and(|m| gpu::same_model(want, &m)))
        && kit::gpu::count_fits(req, t.instance_type.specs.gpus)
}

/// Offers of `types` for the ask: one per matching type and region with capacity.
/// Regions match as exact names (`us-east-1` never matches `us-east-13`). Unordered: the
/// core orders offers (`vm::offers::order`).
pub(super) fn offers_for(types: &[TypesItem], req: &ResourceRequest) -> Vec<Offer> {
    let mut offers = Vec::new();
    for t in types.iter().filter(|t| type_matches(t, req)) {
        let it = &t.instance_type;
        let model = model_of(t);
        for r in &t.regions_with_capacity_available {
            if !req.regions.is_empty() && !req.regions.contains(&r.name) {
                continue;
            }
            let price = it.price_cents_per_hour as f64 / 100.0;
            offers.push(Offer {
                gpu: model.clone(),
                gpu_count: it.specs.gpus,
                detail: json!({ "description": it.description }),
                // `InstanceTypeSpecs`: vcpus, memory_gib, storage_gib.
                facts: crate::provider::OfferFacts {
                    vcpus: it.specs.vcpus,
                    memory_gib: it.specs.memory_gib,
                    disk_gib: it.specs.storage_gib,
                    ..Default::default()
                },
                ..kit::offer::on_demand(CLOUD, &r.name, &it.name, price)
            });
        }
    }
    offers
}
