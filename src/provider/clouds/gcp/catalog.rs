//! The static GCP catalog `plan` starts from: a GPU → machine-type ladder with list
//! prices, and the zones that offer each accelerator. Offers are per zone (GPU capacity
//! on Compute Engine is zonal). With a credential and a project, `plan` replaces the
//! zones by the project's own `acceleratorTypes` listing (see the adapter's docs); the
//! machine types and prices always come from here.
//!
//! The ladder (Compute Engine machine families, "GPU machine types" in the Compute Engine
//! docs): T4 and V100 are N1 machines with attached guest accelerators; L4 is G2; A100
//! 40 GB is A2 high-GPU (and A2 mega-GPU for 16); A100 80 GB is A2 ultra-GPU; H100 is A3
//! high-GPU or A3 mega-GPU (the latter with more network bandwidth, asked for as
//! `H100-MEGA`); H200 is A3 ultra-GPU; B200 is A4. Only N1 needs `guestAccelerators` in the
//! insert; the others carry their GPUs in the machine type.
//!
//! Prices are USD per hour, on demand and spot, estimates of the list price in one
//! reference region per rung (named in [`LADDER`]); other regions differ by up to a
//! third, and prices change (spot prices up to once a day). Sources, retrieved
//! 2026-12-02:
//! - the SkyPilot catalog, `skypilot-org/skypilot-catalog` `catalogs/v7/gcp/vms.csv` at
//!   commit `017e2502fb63c7a28757acd94002b2d6099d3e3d` (generated from Google's Cloud
//!   Billing Catalog API): a machine type's host row (vCPUs and memory) plus the
//!   accelerator row of its GPU count, for A2 high-GPU (`us-central1`), A3 high-, mega-
//!   and ultra-GPU (`us-east4`), the A4 accelerator row (`us-east4`; the catalog has no
//!   separate A4 host row), and the T4 and L4 accelerator rows (`us-central1`);
//! - Google's published N1 predefined rates in `us-central1` ($0.031611 per vCPU-hour,
//!   $0.004237 per GiB-hour) for the N1 hosts, and the G2 list prices (`g2-standard-8`
//!   $0.8536/h) for the G2 hosts;
//! - A2 ultra-GPU on demand: Google's list price ($5.0688/h per A100 80 GB in
//!   `us-central1`); the catalog's A100-80GB on-demand rows are lower than that list
//!   price, so only its spot rows are used;
//! - V100 ($2.48 per GPU-hour on demand) from Google's GPU pricing page: the catalog
//!   excerpt read here had no V100 rows; its spot price is estimated at 40 % of that.
//!   Where the catalog had no spot row for an N1 or G2 host, the host's spot price is
//!   estimated at the accelerator's own spot discount.
//!
//! Zones per accelerator: the zones of the same catalog rows (V100: Google's "GPU regions
//! and zones" page), a superset of candidates, not a promise: a zone without stock
//! answers the insert's operation with `ZONE_RESOURCE_POOL_EXHAUSTED`, which blocks that
//! zone's offer only.

use crate::provider::kit;
use crate::provider::kit::gpu::{norm, rungs_for, Ladder};
use crate::provider::{Location, Offer, ProviderError, ResourceRequest};

use super::CLOUD;

/// The day the built-in prices were read (module docs, "Sources").
pub const PRICES_AS_OF: &str = "2026-12-02";

/// What [`plan`] says about where its prices come from (`gpuprov offers` shows it).
pub const PRICE_NOTE: &str = "prices are gpuprov's built-in list-price estimates (SkyPilot \
     catalog v7 and Google's pricing pages, retrieved 2026-12-02), not quotes";

/// The note of an offer (its `detail.catalog_note`, which `gpuprov offers` shows once per
/// cloud): where its prices and zones come from.
pub fn catalog_note(available: &Availability) -> String {
    match available {
        Availability::Static => format!(
            "{PRICE_NOTE}; zones from the built-in catalog (no credential or project, so the \
             project's own acceleratorTypes were not read)"
        ),
        Availability::Listed(_) => {
            format!("{PRICE_NOTE}; zones from the project's acceleratorTypes")
        }
    }
}

/// Regions `plan` uses when the machine lists none: the US regions with the broadest GPU
/// offering first, then Europe and Asia.
pub const DEFAULT_REGIONS: &[&str] = &[
    "us-central1",
    "us-east4",
    "us-east5",
    "us-west1",
    "europe-west4",
    "asia-southeast1",
];

/// Every Compute Engine region gpuprov knows (the regions of the catalog above; Google's
/// "Regions and zones" list). A multi-cloud config lists other clouds' region names too
/// (`CANADA-1`, `us-east-1`); only these become GCP offers.
pub const KNOWN_REGIONS: &[&str] = &[
    "africa-south1",
    "asia-east1",
    "asia-east2",
    "asia-northeast1",
    "asia-northeast2",
    "asia-northeast3",
    "asia-south1",
    "asia-south2",
    "asia-southeast1",
    "asia-southeast2",
    "australia-southeast1",
    "australia-southeast2",
    "europe-central2",
    "europe-north1",
    "europe-north2",
    "europe-southwest1",
    "europe-west1",
    "europe-west2",
    "europe-west3",
    "europe-west4",
    "europe-west6",
    "europe-west8",
    "europe-west9",
    "europe-west10",
    "europe-west12",
    "me-central1",
    "me-central2",
    "me-west1",
    "northamerica-northeast1",
    "northamerica-northeast2",
    "northamerica-south1",
    "southamerica-east1",
    "southamerica-west1",
    "us-central1",
    "us-east1",
    "us-east4",
    "us-east5",
    "us-south1",
    "us-west1",
    "us-west2",
    "us-west3",
    "us-west4",
];

/// The boot disk type a machine series takes (Compute Engine docs, "Machine series
/// comparison": A3 ultra-GPU and A4 attach Hyperdisk only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disk {
    PdBalanced,
    HyperdiskBalanced,
}

impl Disk {
    /// The `diskTypes` name.
    pub fn name(self) -> &'static str {
        match self {
            Disk::PdBalanced => "pd-balanced",
            Disk::HyperdiskBalanced => "hyperdisk-balanced",
        }
    }
}

/// One rung of the ladder: a machine type and what it carries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MachineType {
    pub name: &'static str,
    /// GPU model as gpuprov spells it in `gpu = "..."`.
    pub gpu: &'static str,
    /// The model family an ask without a variant matches (`A100` matches both A100s,
    /// `H100` both A3 H100 machines).
    pub family: &'static str,
    /// The `acceleratorTypes` name of its GPU (`nvidia-h100-80gb`).
    pub accelerator: &'static str,
    pub gpus: u32,
    /// Whether the GPUs are attached with `guestAccelerators` (N1); `false` when the
    /// machine type carries them.
    pub attached: bool,
    /// Whether the machine needs a gVNIC network interface (A3, A4).
    pub gvnic: bool,
    pub disk: Disk,
    /// USD per hour, on demand and spot (see the module docs).
    pub on_demand: f64,
    pub spot: f64,
    /// The region the prices are for.
    pub priced_in: &'static str,
}

#[allow(clippy::too_many_arguments)]
const fn m(
    name: &'static str,
    gpu: &'static str,
    family: &'static str,
    accelerator: &'static str,
    gpus: u32,
    on_demand: f64,
    spot: f64,
    priced_in: &'static str,
) -> MachineType {
    MachineType {
        name,
        gpu,
        family,
        accelerator,
        gpus,
        attached: false,
        gvnic: false,
        disk: Disk::PdBalanced,
        on_demand,
        spot,
        priced_in,
    }
}

const fn n1(mut t: MachineType) -> MachineType {
    t.attached = true;
    t
}

const fn a3(mut t: MachineType, disk: Disk) -> MachineType {
    t.gvnic = true;
    t.disk = disk;
    t
}

const T4: &str = "nvidia-tesla-t4";
const V100: &str = "nvidia-tesla-v100";
const L4: &str = "nvidia-l4";
const A100_40: &str = "nvidia-tesla-a100";
const A100_80: &str = "nvidia-a100-80gb";
const H100: &str = "nvidia-h100-80gb";
const H100_MEGA: &str = "nvidia-h100-mega-80gb";
const H200: &str = "nvidia-h200-141gb";
const B200: &str = "nvidia-b200";

/// The GPU → machine-type ladder (sources and reference regions in the module docs).
/// N1 rows name the host (`n1-standard-8` for one GPU, doubling with the count). Columns:
/// machine type, GPU model, family, accelerator type, GPUs, USD/h on demand, USD/h spot,
/// the region priced.
#[rustfmt::skip]
pub const LADDER: &[MachineType] = &[
    // T4 16 GB on N1: host $0.38 per 8 vCPUs + $0.35 per T4 (spot $0.14).
    n1(m("n1-standard-8",   "T4",   "T4",   T4,   1,  0.73,   0.292, "us-central1")),
    n1(m("n1-standard-16",  "T4",   "T4",   T4,   2,  1.46,   0.584, "us-central1")),
    n1(m("n1-standard-32",  "T4",   "T4",   T4,   4,  2.92,   1.168, "us-central1")),
    // V100 16 GB on N1: host as above + $2.48 per V100.
    n1(m("n1-standard-8",   "V100", "V100", V100, 1,  2.86,   1.144, "us-central1")),
    n1(m("n1-standard-16",  "V100", "V100", V100, 2,  5.72,   2.288, "us-central1")),
    n1(m("n1-standard-32",  "V100", "V100", V100, 4, 11.44,   4.576, "us-central1")),
    n1(m("n1-standard-64",  "V100", "V100", V100, 8, 22.88,   9.152, "us-central1")),
    // L4 24 GB on G2.
    m("g2-standard-8",  "L4", "L4", L4, 1, 0.8536, 0.3398, "us-central1"),
    m("g2-standard-24", "L4", "L4", L4, 2, 2.0008, 0.7965, "us-central1"),
    m("g2-standard-48", "L4", "L4", L4, 4, 4.0016, 1.593,  "us-central1"),
    m("g2-standard-96", "L4", "L4", L4, 8, 8.0032, 3.186,  "us-central1"),
    // A100 40 GB on A2 high-GPU and mega-GPU.
    m("a2-highgpu-1g",  "A100-40GB", "A100", A100_40,  1,  3.6734,  1.443,  "us-central1"),
    m("a2-highgpu-2g",  "A100-40GB", "A100", A100_40,  2,  7.3468,  2.8859, "us-central1"),
    m("a2-highgpu-4g",  "A100-40GB", "A100", A100_40,  4, 14.6935,  5.7718, "us-central1"),
    m("a2-highgpu-8g",  "A100-40GB", "A100", A100_40,  8, 29.3871, 11.5436, "us-central1"),
    m("a2-megagpu-16g", "A100-40GB", "A100", A100_40, 16, 55.7395, 21.8738, "us-central1"),
    // A100 80 GB on A2 ultra-GPU.
    m("a2-ultragpu-1g", "A100-80GB", "A100", A100_80, 1,  5.0688,  2.011,  "us-central1"),
    m("a2-ultragpu-2g", "A100-80GB", "A100", A100_80, 2, 10.1376,  4.022,  "us-central1"),
    m("a2-ultragpu-4g", "A100-80GB", "A100", A100_80, 4, 20.2752,  8.0441, "us-central1"),
    m("a2-ultragpu-8g", "A100-80GB", "A100", A100_80, 8, 40.5504, 16.0882, "us-central1"),
    // H100 80 GB on A3 high-GPU (gVNIC).
    a3(m("a3-highgpu-1g", "H100", "H100", H100, 1, 10.9791,  1.9761, "us-east4"), Disk::PdBalanced),
    a3(m("a3-highgpu-2g", "H100", "H100", H100, 2, 21.9581,  3.9523, "us-east4"), Disk::PdBalanced),
    a3(m("a3-highgpu-4g", "H100", "H100", H100, 4, 43.9162,  7.9046, "us-east4"), Disk::PdBalanced),
    a3(m("a3-highgpu-8g", "H100", "H100", H100, 8, 87.8325, 15.8091, "us-east4"), Disk::PdBalanced),
    // H100 80 GB on A3 mega-GPU: 8 GPUs with more GPU-to-GPU network bandwidth.
    a3(m("a3-megagpu-8g", "H100-MEGA", "H100", H100_MEGA, 8, 92.2143, 16.5987, "us-east4"), Disk::PdBalanced),
    // H200 141 GB on A3 ultra-GPU (Hyperdisk only).
    a3(m("a3-ultragpu-8g", "H200", "H200", H200, 8, 86.7599, 30.0698, "us-east4"), Disk::HyperdiskBalanced),
    // B200 on A4 (Hyperdisk only).
    a3(m("a4-highgpu-8g",  "B200", "B200", B200, 8, 90.216,  64.44,   "us-east4"), Disk::HyperdiskBalanced),
];

/// The zones offering each accelerator (module docs), space-separated.
pub const ZONES: &[(&str, &str)] = &[
    (
        T4,
        concat!(
            "asia-east1-a asia-east1-c asia-northeast1-a asia-northeast1-c asia-south1-a ",
            "asia-south1-b asia-southeast1-a asia-southeast1-b asia-southeast1-c ",
            "australia-southeast1-a australia-southeast1-c europe-west1-b europe-west1-c ",
            "europe-west1-d europe-west2-a europe-west2-b europe-west4-a europe-west4-b ",
            "europe-west4-c us-central1-a us-central1-b us-central1-c us-central1-f ",
            "us-east1-c us-east1-d us-east4-a us-east4-b us-east4-c us-west1-a us-west1-b ",
            "us-west4-a us-west4-b",
        ),
    ),
    (
        V100,
        concat!(
            "asia-east1-c europe-west4-a europe-west4-b europe-west4-c us-central1-a ",
            "us-central1-b us-central1-c us-central1-f us-east1-c us-west1-a us-west1-b",
        ),
    ),
    (
        L4,
        concat!(
            "asia-east1-a asia-east1-b asia-east1-c asia-northeast1-a asia-northeast1-b ",
            "asia-northeast1-c asia-south1-a asia-south1-b asia-south1-c asia-southeast1-a ",
            "asia-southeast1-b asia-southeast1-c us-central1-a us-central1-b us-central1-c ",
            "us-east1-b us-east1-c us-east1-d us-east4-a us-east4-c us-west1-a us-west1-b ",
            "us-west1-c us-west4-a us-west4-c",
        ),
    ),
    (
        A100_40,
        concat!(
            "asia-northeast1-a asia-northeast1-c asia-northeast3-a asia-northeast3-b ",
            "asia-southeast1-b asia-southeast1-c europe-west4-a europe-west4-b me-west1-a ",
            "me-west1-c us-central1-a us-central1-b us-central1-c us-central1-f us-east1-b ",
            "us-west1-b us-west3-b us-west4-b",
        ),
    ),
    (
        A100_80,
        concat!(
            "asia-southeast1-c europe-west4-a us-central1-a us-central1-c us-east4-c ",
            "us-east5-a us-east5-b",
        ),
    ),
    (
        H100,
        concat!(
            "asia-east1-c asia-northeast1-b asia-south1-c asia-southeast1-b ",
            "asia-southeast1-c australia-southeast1-c europe-north1-c europe-west1-b ",
            "europe-west1-c europe-west3-c europe-west4-b europe-west4-c us-central1-a ",
            "us-central1-b us-central1-c us-east4-a us-east4-b us-east4-c us-east5-a ",
            "us-west1-a us-west1-b us-west4-a",
        ),
    ),
    (
        H100_MEGA,
        concat!(
            "asia-east1-c asia-northeast1-b asia-southeast1-b asia-southeast1-c ",
            "australia-southeast1-c europe-north1-c europe-west1-b europe-west1-c ",
            "europe-west3-c europe-west4-b europe-west4-c us-central1-a us-central1-b ",
            "us-central1-c us-east4-a us-east4-b us-east4-c us-east5-a us-west1-a ",
            "us-west1-b us-west4-a",
        ),
    ),
    (
        H200,
        concat!(
            "asia-south1-b asia-south2-c europe-west1-b europe-west4-a us-central1-b ",
            "us-east4-b us-east5-a us-south1-b us-west1-c",
        ),
    ),
    (
        B200,
        concat!(
            "asia-northeast1-b asia-southeast1-b us-central1-b us-east1-b us-east4-b ",
            "us-south1-b us-west2-c us-west3-b us-west3-c",
        ),
    ),
];

/// Which zones offer which accelerator: the static [`ZONES`], or a project's own
/// `acceleratorTypes` listing as `(accelerator, zone)` pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    Static,
    Listed(Vec<(String, String)>),
}

impl Availability {
    /// The zones of `region` offering `accelerator`, in name order.
    pub fn zones(&self, accelerator: &str, region: &str) -> Vec<String> {
        let mut out: Vec<String> = match self {
            Availability::Static => ZONES
                .iter()
                .filter(|(a, _)| *a == accelerator)
                .flat_map(|(_, zs)| zs.split_whitespace())
                .filter(|z| region_of(z) == Some(region))
                .map(str::to_string)
                .collect(),
            Availability::Listed(pairs) => pairs
                .iter()
                .filter(|(a, z)| a == accelerator && region_of(z) == Some(region))
                .map(|(_, z)| z.clone())
                .collect(),
        };
        out.sort();
        out.dedup();
        out
    }
}

/// The region of zone `zone`: its name without the last `-<letter>` (`us-central1-a` →
/// `us-central1`); `None` for a name that is not a zone.
pub fn region_of(zone: &str) -> Option<&str> {
    let (region, letter) = zone.rsplit_once('-')?;
    let mut c = letter.chars();
    matches!((c.next(), c.next()), (Some(l), None) if l.is_ascii_lowercase()).then_some(region)
}

/// Whether rung `t` carries the GPU model `ask` (its own name, or its family when the ask
/// names no variant: `H100` matches A3 high- and mega-GPU, `H100-MEGA` only mega).
pub fn matches_gpu(t: &MachineType, ask: &str) -> bool {
    let a = norm(ask);
    a == norm(t.gpu) || a == norm(t.family)
}

/// The rung of machine type `name` carrying `gpus` GPUs of `accelerator` (N1 names
/// repeat across GPU models, so the accelerator is part of the key).
pub fn lookup(name: &str, accelerator: &str) -> Option<&'static MachineType> {
    LADDER
        .iter()
        .find(|t| t.name == name && t.accelerator == accelerator)
}

/// The offer id of machine type `name` with `accelerator` in `zone` of `region`:
/// `gcp/<region>/<type>/<zone>`, with the accelerator appended for N1 hosts
/// (`gcp/us-central1/n1-standard-8+nvidia-tesla-t4/us-central1-a`).
pub fn offer_id(region: &str, t: &MachineType, zone: &str) -> String {
    format!("{CLOUD}/{region}/{}/{zone}", instance_type(t))
}

/// The instance type an offer shows: the machine type, plus `+<accelerator>` for N1 hosts
/// whose GPUs are attached.
pub fn instance_type(t: &MachineType) -> String {
    if t.attached {
        format!("{}+{}", t.name, t.accelerator)
    } else {
        t.name.to_string()
    }
}

/// The rung an offer's instance type names (see [`instance_type`]).
pub fn of_instance_type(instance_type: &str) -> Option<&'static MachineType> {
    match instance_type.split_once('+') {
        Some((name, acc)) => lookup(name, acc).filter(|t| t.attached),
        None => LADDER
            .iter()
            .find(|t| t.name == instance_type && !t.attached),
    }
}

/// The accelerators whose zones [`plan`] needs for `req` (empty when the ask is not
/// plannable: [`plan`] says why).
pub fn accelerators_for(req: &ResourceRequest) -> Vec<&'static str> {
    let Some(gpu) = req.gpu.as_deref() else {
        return vec![];
    };
    let mut out: Vec<&str> = LADDER
        .iter()
        .filter(|t| matches_gpu(t, gpu))
        .map(|t| t.accelerator)
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The ordered offers for `req` with the zones `available` says: the regions in the order
/// the machine lists them (else [`DEFAULT_REGIONS`]), within a region the matching
/// machine types cheapest first (a type matches when it carries the asked GPU model and
/// at least `gpu_count` GPUs, and its price, spot when the ask is spot, is within
/// `max_price_per_hour`), and within a type one offer per zone in zone order: region →
/// type → zone. Requested `zones` restrict the zones of the regions they belong to; a
/// region none of them belongs to keeps all its zones.
///
/// Errors (`InvalidRequest`): no GPU asked (the catalog lists GPU machine types only), a
/// GPU model the ladder does not know, no type within the count and price, or no asked
/// region is a Compute Engine region.
pub fn plan(req: &ResourceRequest, available: &Availability) -> Result<Vec<Offer>, ProviderError> {
    let ladder = Ladder {
        cloud: "GCP",
        kind: "machine type",
        rungs: LADDER,
        model: |t| t.gpu,
        matches: matches_gpu,
        gpus: |t| t.gpus,
    };
    let price = |t: &MachineType| if req.spot { t.spot } else { t.on_demand };
    let types = rungs_for(&ladder, req, price)?;
    let regions = kit::offer::catalog_regions(
        req,
        DEFAULT_REGIONS,
        KNOWN_REGIONS,
        "a Compute Engine region",
        "us-central1",
    )?;
    let note = catalog_note(available);
    let mut offers: Vec<Offer> = Vec::new();
    for region in &regions {
        let asked: Vec<&String> = req
            .zones
            .iter()
            .filter(|z| region_of(z) == Some(region.as_str()))
            .collect();
        for t in &types {
            for zone in available.zones(t.accelerator, region) {
                if !asked.is_empty() && !asked.contains(&&zone) {
                    continue;
                }
                let id = offer_id(region, t, &zone);
                if offers.iter().any(|o| o.id == id) {
                    continue;
                }
                offers.push(Offer {
                    id,
                    location: Location {
                        cloud: CLOUD.to_string(),
                        region: region.clone(),
                        zone: Some(zone.clone()),
                    },
                    instance_type: instance_type(t),
                    gpu: Some(t.gpu.to_string()),
                    gpu_count: t.gpus,
                    spot: req.spot,
                    price_per_hour: price(t),
                    detail: serde_json::json!({
                        "accelerator": t.accelerator,
                        "catalog_note": note,
                        "priced_in": t.priced_in,
                        "zones_from": match available {
                            Availability::Static => "catalog",
                            Availability::Listed(_) => "acceleratorTypes",
                        },
                    }),
                    facts: crate::provider::OfferFacts {
                        prices_as_of: Some(PRICES_AS_OF.into()),
                        ..Default::default()
                    },
                });
            }
        }
    }
    Ok(offers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::kit::testing::ask;
    use crate::provider::ErrorKind;

    #[test]
    fn the_ladder_covers_the_issue_models_with_both_prices() {
        for g in [
            "T4",
            "V100",
            "L4",
            "A100-40GB",
            "A100-80GB",
            "H100",
            "H100-MEGA",
            "H200",
            "B200",
        ] {
            assert!(LADDER.iter().any(|t| t.gpu == g), "{g}");
        }
        for t in LADDER {
            assert!(t.on_demand > t.spot && t.spot > 0.0, "{t:?}");
            assert!(KNOWN_REGIONS.contains(&t.priced_in), "{t:?}");
            assert!(ZONES.iter().any(|(a, _)| *a == t.accelerator), "{t:?}");
            assert_eq!(of_instance_type(&instance_type(t)), Some(t));
        }
        for (_, zones) in ZONES {
            for z in zones.split_whitespace() {
                let r = region_of(z).unwrap_or_else(|| panic!("{z}"));
                assert!(KNOWN_REGIONS.contains(&r), "{z}");
            }
        }
        assert!(LADDER
            .iter()
            .filter(|t| t.attached)
            .all(|t| t.name.starts_with("n1-")));
    }

    #[test]
    fn h100_is_a3_high_then_mega_per_zone_in_region_order() {
        let offers = plan(
            &ask(Some("H100"), 8, &["us-east4", "us-central1"]),
            &Availability::Static,
        )
        .unwrap();
        let ids: Vec<&str> = offers.iter().map(|o| o.id.as_str()).collect();
        let mut want = vec![];
        for (r, zs) in [("us-east4", "abc"), ("us-central1", "abc")] {
            for t in ["a3-highgpu-8g", "a3-megagpu-8g"] {
                for z in zs.chars() {
                    want.push(format!("gcp/{r}/{t}/{r}-{z}"));
                }
            }
        }
        assert_eq!(ids, want, "region, then type (cheapest first), then zone");
        assert_eq!(offers[0].price_per_hour, 87.8325);
        assert_eq!(offers[0].location.zone.as_deref(), Some("us-east4-a"));
        assert_eq!(offers[0].detail["accelerator"], "nvidia-h100-80gb");
        let mega = plan(
            &ask(Some("H100-MEGA"), 8, &["us-east4"]),
            &Availability::Static,
        )
        .unwrap();
        assert!(
            mega.iter().all(|o| o.instance_type == "a3-megagpu-8g"),
            "{mega:?}"
        );
    }

    #[test]
    fn spot_asks_take_spot_prices_and_n1_types_name_their_gpu() {
        let mut r = ask(Some("T4"), 1, &["us-central1"]);
        r.spot = true;
        let o = plan(&r, &Availability::Static).unwrap();
        assert!(o.iter().all(|o| o.spot), "{o:?}");
        assert_eq!(o[0].instance_type, "n1-standard-8+nvidia-tesla-t4");
        assert_eq!(o[0].price_per_hour, 0.292);
        assert_eq!(
            o[0].id,
            "gcp/us-central1/n1-standard-8+nvidia-tesla-t4/us-central1-a"
        );
    }

    #[test]
    fn listed_zones_replace_the_static_ones_and_zones_restrict_their_region() {
        let listed = Availability::Listed(vec![
            ("nvidia-h100-80gb".into(), "europe-west10-b".into()),
            ("nvidia-h100-80gb".into(), "europe-west1-c".into()),
            ("nvidia-l4".into(), "europe-west1-b".into()),
        ]);
        let o = plan(
            &ask(Some("H100"), 8, &["europe-west1", "europe-west10"]),
            &listed,
        )
        .unwrap();
        let zones: Vec<&str> = o
            .iter()
            .filter_map(|o| o.location.zone.as_deref())
            .collect();
        assert_eq!(zones, ["europe-west1-c", "europe-west10-b"]);
        let mut r = ask(Some("H100"), 8, &["us-east4", "us-central1"]);
        r.zones = vec!["us-east4-b".into()];
        let o = plan(&r, &Availability::Static).unwrap();
        assert!(o
            .iter()
            .filter(|o| o.location.region == "us-east4")
            .all(|o| o.location.zone.as_deref() == Some("us-east4-b")));
        assert!(o.iter().any(|o| o.location.region == "us-central1"));
        assert_eq!(region_of("europe-west10-b"), Some("europe-west10"));
        assert_eq!(region_of("us-central1"), None);
    }

    #[test]
    fn unplannable_asks_are_invalid_requests() {
        for r in [
            ask(None, 0, &[]),
            ask(Some("MI300X"), 1, &[]),
            ask(Some("H100"), 16, &[]),
            ask(Some("H100"), 8, &["CANADA-1", "us-east-1"]),
        ] {
            assert_eq!(
                plan(&r, &Availability::Static).unwrap_err().kind,
                ErrorKind::InvalidRequest,
                "{r:?}"
            );
        }
        let mut cheap = ask(Some("A100"), 1, &[]);
        cheap.max_price_per_hour = Some(4.0);
        let o = plan(&cheap, &Availability::Static).unwrap();
        assert!(
            o.iter().all(|o| o.instance_type == "a2-highgpu-1g"),
            "{o:?}"
        );
    }
}
