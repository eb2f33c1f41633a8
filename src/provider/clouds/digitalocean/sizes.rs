//! The size catalogue mapped onto offers (`GET /v2/sizes` × `GET /v2/regions`): GPU
//! models from `gpu_info`, the default images, and which sizes fit an ask.

use serde_json::json;

use super::api::{Region, Size};
use super::{Capabilities, Offer, ResourceRequest, CLOUD, DEFAULT_IMAGE};
use crate::provider::kit::{gpu, offer};
use crate::provider::OfferFacts;

/// Upper bound on offers for a CPU-only ask (every size × region would be hundreds).
const MAX_CPU_OFFERS: usize = 50;

/// The GPU model of a size from `gpu_info.model` (`nvidia_h100` → `H100`, `amd_mi300x` →
/// `MI300X`, `nvidia_rtx_4000_ada` → `RTX 4000 ADA`): vendor prefix dropped, `_` as
/// spaces, uppercase. `None` for sizes without GPUs.
pub fn gpu_model(model: &str, count: u32) -> Option<String> {
    if count == 0 || model.trim().is_empty() {
        return None;
    }
    let m = model.trim().to_lowercase();
    let m = m
        .strip_prefix("nvidia_")
        .or_else(|| m.strip_prefix("amd_"))
        .unwrap_or(&m);
    Some(m.replace('_', " ").to_uppercase())
}

/// The default image for a size: DigitalOcean's AI/ML-ready GPU images for GPU sizes (see
/// the module docs for the sources), `ubuntu-24-04-x64` otherwise.
pub fn default_image(gpu_model_raw: Option<&str>, gpu_count: u32) -> &'static str {
    match gpu_model_raw.map(str::to_lowercase) {
        Some(m) if gpu_count > 0 && m.starts_with("amd") => "gpu-amd-base",
        Some(_) if gpu_count >= 8 => "gpu-h100x8-base",
        Some(_) if gpu_count > 0 => "gpu-h100x1-base",
        _ => DEFAULT_IMAGE,
    }
}

/// Offers of `sizes` for the ask in the regions where both size and region are available.
/// Regions match as exact slugs (`nyc1` never matches `nyc13`). The core orders offers
/// (`vm::offers::order`); a CPU-only ask keeps only the [`MAX_CPU_OFFERS`] it would try
/// first (preferred regions, then cheapest).
pub(super) fn offers_for(sizes: &[Size], regions: &[Region], req: &ResourceRequest) -> Vec<Offer> {
    let wants_gpu = req.gpu.is_some() || req.gpu_count > 0;
    let mut offers = Vec::new();
    for s in sizes.iter().filter(|s| s.available && size_matches(s, req)) {
        let gpu = s.gpu_info.as_ref();
        let count = gpu.map(|g| g.count).unwrap_or(0);
        let model = gpu.and_then(|g| gpu_model(&g.model, g.count));
        for r in &s.regions {
            if !regions.iter().any(|x| x.slug == *r && x.available) {
                continue;
            }
            if !req.regions.is_empty() && !req.regions.contains(r) {
                continue;
            }
            offers.push(Offer {
                gpu: model.clone(),
                gpu_count: count,
                detail: json!({
                    "description": s.description,
                    "vcpus": s.vcpus,
                    "memory_mib": s.memory,
                    "disk_gb": s.disk,
                    "gpu_model": gpu.map(|g| g.model.clone()),
                    "gpu_vram": gpu.and_then(|g| g.vram.as_ref()).map(|v| format!("{} {}", v.amount, v.unit)),
                }),
                // Size `vcpus`, `memory` (MiB) and `disk` (GB) of `GET /v2/sizes`.
                facts: OfferFacts {
                    vcpus: Some(s.vcpus).filter(|v| *v > 0),
                    memory_gib: Some(s.memory as f64 / 1024.0).filter(|m| *m > 0.0),
                    disk_gib: Some(s.disk).filter(|d| *d > 0),
                    ..OfferFacts::default()
                },
                ..offer::on_demand(CLOUD, r, &s.slug, s.price_hourly)
            });
        }
    }
    if !wants_gpu {
        // The ones the core would try first.
        crate::provider::offers::order(&mut offers, req, &Capabilities::default());
        offers.truncate(MAX_CPU_OFFERS);
    }
    offers
}

/// Whether a size fits the ask: a GPU ask takes GPU sizes of that model (ignoring case and
/// punctuation, with or without the vendor prefix) and exact count when asked; a CPU-only
/// ask takes sizes without GPUs.
pub(super) fn size_matches(s: &Size, req: &ResourceRequest) -> bool {
    let wants_gpu = req.gpu.is_some() || req.gpu_count > 0;
    match s.gpu_info.as_ref().filter(|g| g.count > 0) {
        None => !wants_gpu,
        Some(g) => {
            wants_gpu
                && crate::provider::kit::gpu::count_fits(req, g.count)
                && req.gpu.as_ref().is_none_or(|want| {
                    gpu::same_model(want, &g.model)
                        || gpu_model(&g.model, g.count).is_some_and(|m| gpu::same_model(want, &m))
                })
        }
    }
}
