//! The static AWS catalog `plan` works from: a GPU → instance-type ladder and a list-price
//! table. `plan` is a pure lookup (design 4.1): it needs no credentials and no network, so
//! `gpuprov plan` works offline. Whether a type is really offered in a region is checked
//! by `prepare` (`DescribeInstanceTypeOfferings`), which answers `Unavailable` otherwise.
//!
//! Sources:
//! - GPUs per type: the AWS "Accelerated computing" instance-type specifications,
//!   <https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html> (G4dn, G5, G6, G6e,
//!   P3, P4d, P4de, P5, P5e, P5en, P6-B200).
//! - Prices: on-demand Linux list prices in us-east-1, USD per hour, from
//!   <https://aws.amazon.com/ec2/pricing/on-demand/> as of 2025-06 (after AWS's June 2025
//!   price reduction for P4d/P4de/P5/P5en). They are estimates: other regions differ by a
//!   few percent, and the Pricing API is not reachable from here. Spot capacity is shown
//!   at the on-demand price, which is the most a spot instance is charged by default
//!   (no `MaxPrice` is set).

use crate::provider::kit;
use crate::provider::kit::gpu::{norm, rungs_for, Ladder};
use crate::provider::{Location, Offer, ProviderError, ResourceRequest};

/// When the list prices were read (module docs, "Sources").
pub const PRICES_AS_OF: &str = "2025-06";

/// Regions `plan` uses when the machine lists none: the regions with the broadest GPU
/// offering (N. Virginia, Oregon, Ohio, Ireland), in that order.
pub const DEFAULT_REGIONS: &[&str] = &["us-east-1", "us-west-2", "us-east-2", "eu-west-1"];

/// The EC2 region codes gpuprov knows (commercial, GovCloud and China partitions), from
/// AWS's "Regions and Availability Zones" list
/// (<https://docs.aws.amazon.com/global-infrastructure/latest/regions/aws-regions.html>,
/// as of 2025). A multi-cloud config lists other clouds' region names too (`CANADA-1`,
/// Lambda's `us-south-1`); only names in this list become AWS offers.
pub const KNOWN_REGIONS: &[&str] = &[
    "us-east-1",
    "us-east-2",
    "us-west-1",
    "us-west-2",
    "af-south-1",
    "ap-east-1",
    "ap-east-2",
    "ap-south-1",
    "ap-south-2",
    "ap-southeast-1",
    "ap-southeast-2",
    "ap-southeast-3",
    "ap-southeast-4",
    "ap-southeast-5",
    "ap-southeast-7",
    "ap-northeast-1",
    "ap-northeast-2",
    "ap-northeast-3",
    "ca-central-1",
    "ca-west-1",
    "eu-central-1",
    "eu-central-2",
    "eu-west-1",
    "eu-west-2",
    "eu-west-3",
    "eu-south-1",
    "eu-south-2",
    "eu-north-1",
    "il-central-1",
    "me-south-1",
    "me-central-1",
    "mx-central-1",
    "sa-east-1",
    "us-gov-east-1",
    "us-gov-west-1",
    "cn-north-1",
    "cn-northwest-1",
];

/// One rung of the ladder: an instance type and what it carries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuType {
    pub instance_type: &'static str,
    /// GPU model as gpuprov spells it in `gpu = "..."`.
    pub gpu: &'static str,
    /// The model family an ask without a memory size matches (`A100` matches both A100s).
    pub family: &'static str,
    pub gpus: u32,
    /// Memory per GPU, GiB.
    pub gpu_memory_gib: u32,
    /// On-demand list price, USD per hour (see the module docs for source and date).
    pub price_per_hour: f64,
}

const fn t(
    instance_type: &'static str,
    gpu: &'static str,
    family: &'static str,
    gpus: u32,
    gpu_memory_gib: u32,
    price_per_hour: f64,
) -> GpuType {
    GpuType {
        instance_type,
        gpu,
        family,
        gpus,
        gpu_memory_gib,
        price_per_hour,
    }
}

/// The GPU → instance-type ladder (sources in the module docs).
pub const LADDER: &[GpuType] = &[
    // NVIDIA T4 16 GB: G4dn.
    t("g4dn.xlarge", "T4", "T4", 1, 16, 0.526),
    t("g4dn.2xlarge", "T4", "T4", 1, 16, 0.752),
    t("g4dn.12xlarge", "T4", "T4", 4, 16, 3.912),
    t("g4dn.metal", "T4", "T4", 8, 16, 7.824),
    // NVIDIA A10G 24 GB: G5.
    t("g5.xlarge", "A10G", "A10G", 1, 24, 1.006),
    t("g5.2xlarge", "A10G", "A10G", 1, 24, 1.212),
    t("g5.12xlarge", "A10G", "A10G", 4, 24, 5.672),
    t("g5.48xlarge", "A10G", "A10G", 8, 24, 16.288),
    // NVIDIA L4 24 GB: G6.
    t("g6.xlarge", "L4", "L4", 1, 24, 0.805),
    t("g6.2xlarge", "L4", "L4", 1, 24, 0.978),
    t("g6.12xlarge", "L4", "L4", 4, 24, 4.602),
    t("g6.48xlarge", "L4", "L4", 8, 24, 13.350),
    // NVIDIA L40S 48 GB: G6e.
    t("g6e.xlarge", "L40S", "L40S", 1, 48, 1.861),
    t("g6e.2xlarge", "L40S", "L40S", 1, 48, 2.242),
    t("g6e.12xlarge", "L40S", "L40S", 4, 48, 10.493),
    t("g6e.48xlarge", "L40S", "L40S", 8, 48, 30.131),
    // NVIDIA V100 16 GB: P3.
    t("p3.2xlarge", "V100", "V100", 1, 16, 3.06),
    t("p3.8xlarge", "V100", "V100", 4, 16, 12.24),
    t("p3.16xlarge", "V100", "V100", 8, 16, 24.48),
    // NVIDIA A100 40 GB: P4d; A100 80 GB: P4de.
    t("p4d.24xlarge", "A100-40GB", "A100", 8, 40, 21.96),
    t("p4de.24xlarge", "A100-80GB", "A100", 8, 80, 27.45),
    // NVIDIA H100 80 GB: P5.
    t("p5.48xlarge", "H100", "H100", 8, 80, 55.04),
    // NVIDIA H200 141 GB: P5e, P5en.
    t("p5e.48xlarge", "H200", "H200", 8, 141, 60.82),
    t("p5en.48xlarge", "H200", "H200", 8, 141, 63.30),
    // NVIDIA B200 180 GB: P6-B200.
    t("p6-b200.48xlarge", "B200", "B200", 8, 180, 113.93),
];

/// Whether rung `g` carries the GPU model `ask` (exact model, or the family when the ask
/// names no memory size: `A100` matches both A100 rungs, `A100-80GB` only P4de).
pub fn matches_gpu(g: &GpuType, ask: &str) -> bool {
    let a = norm(ask);
    a == norm(g.gpu) || a == norm(g.family)
}

/// The rung of `instance_type`, if the ladder has it.
pub fn lookup(instance_type: &str) -> Option<&'static GpuType> {
    LADDER.iter().find(|g| g.instance_type == instance_type)
}

/// The offer id of `instance_type` in `region`: `aws/<region>/<type>`.
pub fn offer_id(region: &str, instance_type: &str) -> String {
    format!("aws/{region}/{instance_type}")
}

/// The offer id of `instance_type` in one `zone` of `region`:
/// `aws/<region>/<type>/<zone>` (the region-level id plus the zone, so the region and type
/// stay a prefix).
pub fn zone_offer_id(region: &str, instance_type: &str, zone: &str) -> String {
    format!("aws/{region}/{instance_type}/{zone}")
}

/// The zone letters `plan` proposes in a region where they differ from `a`, `b`, `c`:
/// the Availability Zones AWS lists per region
/// (<https://docs.aws.amazon.com/global-infrastructure/latest/regions/aws-availability-zones.html>,
/// as of 2025). Zone *names* are mapped per account in the older regions, so this is a
/// superset of candidates, not a promise: `prepare` checks the account's own
/// `DescribeInstanceTypeOfferings` and answers `Unavailable` for that one offer when its
/// zone does not offer the type (for the type in the whole region when no zone does).
pub const ZONE_LETTERS: &[(&str, &str)] = &[
    ("us-east-1", "abcdef"),
    ("us-west-2", "abcd"),
    ("ap-northeast-1", "acd"),
    ("ap-northeast-2", "abcd"),
    ("ca-central-1", "abd"),
];

/// The candidate zones of `region`, in name order (see [`ZONE_LETTERS`]).
pub fn zones_of(region: &str) -> Vec<String> {
    let letters = ZONE_LETTERS
        .iter()
        .find(|(r, _)| *r == region)
        .map(|(_, l)| *l)
        .unwrap_or("abc");
    letters.chars().map(|c| format!("{region}{c}")).collect()
}

/// The ordered offers for `req`: the regions in the order the machine lists them (else
/// [`DEFAULT_REGIONS`]), and within a region the matching types cheapest first. A type
/// matches when it carries the asked GPU model and at least `gpu_count` GPUs (the
/// smallest such type comes first because it is the cheapest), and its price is within
/// `max_price_per_hour`. Within a (region, type) there is one offer per zone (EC2 capacity
/// is per type and zone), in zone order, so every zone of a region is tried before a
/// larger, pricier type: region (ask order) → type (cheapest first) → zone. Requested
/// zones (`zones`) restrict the zones of the regions they belong to (a zone belongs to
/// the region its name starts with); a region none of them belongs to keeps all its zones.
///
/// Errors (`InvalidRequest`): no GPU asked (the catalog lists GPU types only), a GPU
/// model the ladder does not know, or no type within the count and price.
pub fn plan(req: &ResourceRequest) -> Result<Vec<Offer>, ProviderError> {
    let ladder = Ladder {
        cloud: "AWS",
        kind: "instance type",
        rungs: LADDER,
        model: |g| g.gpu,
        matches: matches_gpu,
        gpus: |g| g.gpus,
    };
    let types = rungs_for(&ladder, req, |g| g.price_per_hour)?;
    let regions = kit::offer::catalog_regions(
        req,
        DEFAULT_REGIONS,
        KNOWN_REGIONS,
        "an AWS region",
        "us-east-1",
    )?;
    let mut offers = Vec::new();
    for region in &regions {
        let asked: Vec<String> = req
            .zones
            .iter()
            .filter(|z| zone_in_region(z, region))
            .cloned()
            .collect();
        let mut zones = if asked.is_empty() {
            zones_of(region)
        } else {
            asked
        };
        zones.sort();
        zones.dedup();
        for g in &types {
            for zone in &zones {
                offers.push(Offer {
                    id: zone_offer_id(region, g.instance_type, zone),
                    location: Location {
                        cloud: super::CLOUD.to_string(),
                        region: region.clone(),
                        zone: Some(zone.clone()),
                    },
                    instance_type: g.instance_type.to_string(),
                    gpu: Some(g.gpu.to_string()),
                    gpu_count: g.gpus,
                    spot: req.spot,
                    price_per_hour: g.price_per_hour,
                    detail: serde_json::Value::Null,
                    // One list price per type, on demand: a spot offer shows it as
                    // its upper bound (EC2 spot prices move hourly per zone).
                    facts: crate::provider::kit::offer::facts_of_price_list(PRICES_AS_OF, req.spot),
                });
            }
        }
    }
    Ok(offers)
}

/// Whether `zone` names a zone of `region`: the region name followed by one lowercase
/// letter (`us-east-1a`; not `us-east-11a`).
pub fn zone_in_region(zone: &str, region: &str) -> bool {
    zone.strip_prefix(region).is_some_and(|rest| {
        let mut c = rest.chars();
        matches!((c.next(), c.next()), (Some(l), None) if l.is_ascii_lowercase())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::ErrorKind;

    fn req(gpu: Option<&str>, count: u32, regions: &[&str]) -> ResourceRequest {
        ResourceRequest {
            vm_name: "t".into(),
            regions: regions.iter().map(|s| s.to_string()).collect(),
            zones: vec![],
            gpu: gpu.map(str::to_string),
            gpu_count: count,
            spot: false,
            max_price_per_hour: None,
            gpu_count_at_least: false,
        }
    }

    #[test]
    fn ladder_covers_the_issue_models() {
        for m in [
            "T4",
            "A10G",
            "L4",
            "L40S",
            "V100",
            "A100-40GB",
            "A100-80GB",
            "H100",
            "H200",
            "B200",
        ] {
            assert!(LADDER.iter().any(|g| g.gpu == m), "{m}");
        }
        assert_eq!(lookup("p5.48xlarge").unwrap().gpus, 8);
        assert_eq!(lookup("p4de.24xlarge").unwrap().gpu_memory_gib, 80);
    }

    #[test]
    fn other_clouds_region_names_are_skipped() {
        let o = plan(&req(
            Some("H100"),
            8,
            &["CANADA-1", "us-south-1", "us-west-2", "us-east-1x"],
        ))
        .unwrap();
        let mut regions: Vec<&str> = o.iter().map(|o| o.location.region.as_str()).collect();
        regions.dedup();
        assert_eq!(regions, ["us-west-2"]);
        let e = plan(&req(Some("H100"), 8, &["CANADA-1"])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidRequest);
        assert!(e.msg.contains("CANADA-1"), "{}", e.msg);
    }

    #[test]
    fn regions_in_user_order_then_price() {
        let offers = plan(&req(Some("a100"), 8, &["us-west-2", "us-east-1"])).unwrap();
        let ids: Vec<&str> = offers.iter().map(|o| o.id.as_str()).collect();
        let mut want = Vec::new();
        for (region, zones) in [("us-west-2", "abcd"), ("us-east-1", "abcdef")] {
            for t in ["p4d.24xlarge", "p4de.24xlarge"] {
                for z in zones.chars() {
                    want.push(format!("aws/{region}/{t}/{region}{z}"));
                }
            }
        }
        assert_eq!(ids, want, "region, then type (cheapest first), then zone");
        for o in &offers {
            let zone = o
                .location
                .zone
                .as_deref()
                .expect("every offer names its zone");
            assert!(zone_in_region(zone, &o.location.region), "{o:?}");
            assert!(o.id.ends_with(zone), "{o:?}");
        }
        let only80 = plan(&req(Some("A100-80GB"), 8, &["us-east-1"])).unwrap();
        assert_eq!(only80.len(), 6);
        assert!(only80.iter().all(|o| o.instance_type == "p4de.24xlarge"));
    }

    #[test]
    fn requested_zones_restrict_their_own_region_only() {
        let mut r = req(Some("H100"), 8, &["us-east-1", "us-west-2"]);
        r.zones = vec![
            "us-east-1c".into(),
            "us-east-1a".into(),
            "eu-west-9z".into(),
        ];
        let ids: Vec<String> = plan(&r).unwrap().into_iter().map(|o| o.id).collect();
        assert_eq!(
            ids,
            [
                "aws/us-east-1/p5.48xlarge/us-east-1a",
                "aws/us-east-1/p5.48xlarge/us-east-1c",
                "aws/us-west-2/p5.48xlarge/us-west-2a",
                "aws/us-west-2/p5.48xlarge/us-west-2b",
                "aws/us-west-2/p5.48xlarge/us-west-2c",
                "aws/us-west-2/p5.48xlarge/us-west-2d",
            ]
        );
        assert!(zone_in_region("us-east-1a", "us-east-1"));
        assert!(!zone_in_region("us-east-11a", "us-east-1"));
        assert!(!zone_in_region("us-west-2-lax-1a", "us-west-2"));
    }

    #[test]
    fn count_and_price_filter() {
        let types_of = |r: &ResourceRequest| {
            let mut t: Vec<String> = plan(r)
                .unwrap()
                .into_iter()
                .map(|o| o.instance_type)
                .collect();
            t.dedup();
            t
        };
        let mut four = req(Some("T4"), 4, &["us-east-1"]);
        assert_eq!(types_of(&four), ["g4dn.12xlarge"], "exactly 4");
        four.gpu_count_at_least = true;
        assert_eq!(
            types_of(&four),
            ["g4dn.12xlarge", "g4dn.metal"],
            "at least 4"
        );
        let mut r = req(Some("T4"), 1, &[]);
        r.max_price_per_hour = Some(0.6);
        let cheap = plan(&r).unwrap();
        assert!(cheap.iter().all(|o| o.instance_type == "g4dn.xlarge"));
        let zones: usize = DEFAULT_REGIONS.iter().map(|r| zones_of(r).len()).sum();
        assert_eq!(
            cheap.len(),
            zones,
            "one offer per zone of each default region"
        );
    }

    #[test]
    fn unplannable_asks_are_invalid_requests() {
        for r in [
            req(None, 0, &[]),
            req(Some("MI300X"), 1, &[]),
            req(Some("H100"), 16, &[]),
        ] {
            assert_eq!(plan(&r).unwrap_err().kind, ErrorKind::InvalidRequest);
        }
    }
}
