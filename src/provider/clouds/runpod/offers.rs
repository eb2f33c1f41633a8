//! The GPU catalog (per cloud tier, with pod stock per data centre) mapped onto offers.

use serde_json::json;

use super::api::{GpuType, Tier};
use super::CLOUD;
use crate::provider::kit::{self, gpu::norm};
use crate::provider::{Location, Offer, ResourceRequest};

/// Whether the ask's GPU model `want` names the catalog type `id` / `name`: the type id
/// exactly (ignoring case, `NVIDIA H100 80GB HBM3`), the name ignoring case and
/// punctuation (`rtx4090` = `RTX 4090`), or the name's leading words (`H100` names
/// `H100 SXM`, `H100 PCIe` and `H100 NVL`; whole words only, so `L40` never names `L40S`
/// and `A40` never names `A4000`).
pub fn gpu_matches(want: &str, id: &str, name: &str) -> bool {
    let want = want.trim();
    if want.is_empty() {
        return false;
    }
    if want.eq_ignore_ascii_case(id) || kit::gpu::same_model(want, name) {
        return true;
    }
    let w: Vec<String> = want.split_whitespace().map(norm).collect();
    let n: Vec<String> = name.split_whitespace().map(norm).collect();
    n.len() > w.len() && n[..w.len()] == w[..]
}

/// Offers of the catalog (`(tier, gpu types)` per tier, secure first) for the ask, in
/// the catalog's order; the core orders them ([`crate::provider::offers::order`]), keeping a
/// secure offer ahead of the community one of the same type, data centre and price.
/// Regions match data centre ids as whole ids, ignoring case.
pub(super) fn offers_for(
    catalog: &[(Tier, Vec<GpuType>)],
    req: &ResourceRequest,
    count: u32,
) -> Vec<Offer> {
    let mut offers = Vec::new();
    for (tier, gpus) in catalog {
        for g in gpus {
            if !g.in_tier(*tier) || g.max_count(*tier) < count {
                continue;
            }
            if let Some(want) = &req.gpu {
                if !gpu_matches(want, &g.id, &g.name) {
                    continue;
                }
            }
            for dc in g.stocked() {
                if !req.regions.is_empty()
                    && !req.regions.iter().any(|r| r.eq_ignore_ascii_case(&dc.id))
                {
                    continue;
                }
                offers.push(Offer {
                    id: format!(
                        "{CLOUD}/{}/{}/{}",
                        dc.id,
                        tier.as_api().to_ascii_lowercase(),
                        g.id
                    ),
                    location: Location {
                        cloud: CLOUD.to_string(),
                        region: dc.id.clone(),
                        zone: None,
                    },
                    instance_type: g.id.clone(),
                    gpu: Some(g.name.clone()),
                    gpu_count: count,
                    spot: false,
                    price_per_hour: g.price(*tier) * count as f64,
                    detail: json!({
                        "tier": tier.as_api(),
                        "gpu_type_id": g.id,
                        "availability": dc.availability,
                    }),
                    facts: Default::default(),
                });
            }
        }
    }
    offers
}
