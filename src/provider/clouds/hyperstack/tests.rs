//! Unit tests of the Hyperstack mapping (GPU names, offers, readiness, the listing, images).

use super::api::*;
use super::*;
use crate::provider::kit::testing::ask;
use crate::provider::{InstanceStatus, Naming};

/// `offers_for` in the order the core applies ([`crate::provider::offers::order`]).
fn ordered(
    flavors: &[(String, Flavor)],
    stocks: &[Stock],
    prices: &[Price],
    req: &ResourceRequest,
) -> Vec<Offer> {
    let mut o = offers_for(flavors, stocks, prices, req);
    crate::provider::offers::order(&mut o, req, &HyperstackProvider::default_capabilities());
    o
}

fn flavor(name: &str, gpu: &str, n: u32, stock: Option<bool>) -> Flavor {
    Flavor {
        name: name.into(),
        region_name: None,
        cpu: 28 * n,
        ram: 180.0 * n as f64,
        disk: 100,
        ephemeral: 750,
        gpu: gpu.into(),
        gpu_count: n,
        stock_available: stock,
    }
}

fn stock(region: &str, model: &str, cfg: &[(&str, i64)]) -> Stock {
    Stock {
        region: region.into(),
        models: vec![StockModel {
            model: model.into(),
            configurations: cfg.iter().map(|(k, v)| (k.to_string(), Some(*v))).collect(),
        }],
    }
}

fn price(name: &str, v: Value) -> Price {
    Price {
        name: name.into(),
        value: v,
    }
}

#[test]
fn gpu_names_match_by_leading_tokens() {
    assert!(gpu_matches("H100", "H100-80G-PCIe"));
    assert!(gpu_matches("h100-80gb", "H100-80G-PCIe"));
    assert!(gpu_matches("H100-80G-SXM5", "H100-80G-SXM5"));
    assert!(!gpu_matches("H100-80G-SXM5", "H100-80G-PCIe"));
    assert!(!gpu_matches("L40", "L40S"));
    assert!(gpu_matches("RTX A6000", "RTX-A6000"));
    assert!(!gpu_matches("A100", "H100-80G-PCIe"));
    assert!(!gpu_matches("", "H100"));
}

#[test]
fn offers_join_flavors_stock_and_prices_with_exact_regions() {
    let flavors = vec![
        (
            "CANADA-1".to_string(),
            flavor("n3-H100x8", "H100-80G-PCIe", 8, Some(true)),
        ),
        (
            "CANADA-10".to_string(),
            flavor("n3-H100x8", "H100-80G-PCIe", 8, Some(true)),
        ),
        (
            "NORWAY-1".to_string(),
            flavor("n3-H100x8", "H100-80G-PCIe", 8, Some(true)),
        ),
        (
            "CANADA-1".to_string(),
            flavor("n3-H100x1", "H100-80G-PCIe", 1, Some(true)),
        ),
        // Marked out of stock by the flavor list itself.
        (
            "US-1".to_string(),
            flavor("n3-H100x8", "H100-80G-PCIe", 8, Some(false)),
        ),
    ];
    let stocks = vec![
        stock("CANADA-1", "H100-80G-PCIe", &[("1x", 3), ("8x", 1)]),
        stock("CANADA-10", "H100-80G-PCIe", &[("8x", 2)]),
        stock("NORWAY-1", "H100-80G-PCIe", &[("8x", 0)]),
        stock("US-1", "H100-80G-PCIe", &[("8x", 5)]),
    ];
    let prices = vec![price("H100-80G-PCIe", json!(1.9))];
    let o = ordered(
        &flavors,
        &stocks,
        &prices,
        &ask(Some("H100"), 8, &["CANADA-1"]),
    );
    let ids: Vec<&str> = o.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(ids, ["hyperstack/CANADA-1/n3-H100x8"]);
    assert_eq!(o[0].price_per_hour, 15.2);
    assert_eq!(
        (o[0].gpu.as_deref(), o[0].gpu_count),
        (Some("H100-80G-PCIe"), 8)
    );
    assert_eq!(o[0].detail["vcpus"], 224);
    // No region named: every region with stock (NORWAY-1 has none, US-1 is marked out).
    let o = ordered(&flavors, &stocks, &prices, &ask(Some("H100"), 8, &[]));
    let ids: Vec<&str> = o.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "hyperstack/CANADA-1/n3-H100x8",
            "hyperstack/CANADA-10/n3-H100x8"
        ]
    );
    assert!(ordered(
        &flavors,
        &stocks,
        &prices,
        &ask(Some("H100"), 8, &["CANADA"])
    )
    .is_empty());
    // No price: no offer.
    assert!(ordered(&flavors, &stocks, &[], &ask(Some("H100"), 8, &[])).is_empty());
}

#[test]
fn a_flavor_price_wins_over_the_gpu_price_and_strings_parse() {
    let f = flavor("n3-A100x2", "A100-80G-PCIe", 2, Some(true));
    assert_eq!(
        price_of(&[price("A100-80G-PCIe", json!("1.35"))], &f),
        Some(2.7)
    );
    assert_eq!(
        price_of(
            &[
                price("A100-80G-PCIe", json!(1.35)),
                price("n3-A100x2", json!(2.5))
            ],
            &f
        ),
        Some(2.5)
    );
    assert_eq!(price_of(&[price("A100-80G-PCIe", json!(null))], &f), None);
}

fn vm(status: &str, power: Option<&str>, ip: Option<&str>, fip: Option<&str>) -> Vm {
    Vm {
        id: Some(7),
        name: "gpuprov-a-0f0e0d0c".into(),
        status: status.into(),
        power_state: power.map(str::to_string),
        floating_ip: ip.map(str::to_string),
        floating_ip_status: fip.map(str::to_string),
        environment: None,
        labels: vec![],
        ..Vm::default()
    }
}

#[test]
fn ready_only_when_active_with_the_floating_ip_attached() {
    let s = |v: &Vm| status_of(v).map(|(s, e)| (s, e.is_some()));
    assert_eq!(
        s(&vm(
            "ACTIVE",
            Some("RUNNING"),
            Some("127.0.0.9"),
            Some("ATTACHED")
        )),
        Some((InstanceStatus::Running, true))
    );
    assert_eq!(
        s(&vm(
            "ACTIVE",
            Some("RUNNING"),
            Some("127.0.0.9"),
            Some("ATTACHING")
        )),
        Some((InstanceStatus::Pending, false))
    );
    assert_eq!(
        s(&vm("ACTIVE", Some("RUNNING"), None, Some("ATTACHED"))),
        Some((InstanceStatus::Pending, false))
    );
    assert_eq!(
        s(&vm(
            "ACTIVE",
            Some("SHUTDOWN"),
            Some("127.0.0.9"),
            Some("ATTACHED")
        )),
        Some((InstanceStatus::Pending, false))
    );
    assert_eq!(
        s(&vm("CREATING", None, None, None)),
        Some((InstanceStatus::Pending, false))
    );
    assert_eq!(
        s(&vm("BUILD", None, None, None)),
        Some((InstanceStatus::Pending, false))
    );
    assert_eq!(
        s(&vm("SHUTOFF", None, None, None)),
        Some((InstanceStatus::Stopped, false))
    );
    assert_eq!(
        s(&vm("DELETING", None, None, None)),
        Some((InstanceStatus::Terminating, false))
    );
    assert_eq!(
        s(&vm("ERROR", None, None, None)),
        Some((InstanceStatus::Failed("ERROR".into()), false))
    );
    assert_eq!(s(&vm("DELETED", None, None, None)), None);
    let (_, ssh) = status_of(&vm("ACTIVE", None, Some("127.0.0.9"), Some("ATTACHED"))).unwrap();
    let ssh = ssh.unwrap();
    assert_eq!((ssh.port, ssh.user.as_deref()), (22, Some("ubuntu")));
}

/// The listing shows a VM of the project's environment in the region with its labels and
/// name; whose it is, is then the core's one rule ([`owner`], tested in `identity.rs`):
/// the cases of the adapter's old rule, which also required the name beside the labels.
#[test]
fn listing_shows_environment_labels_and_name() {
    use crate::provider::identity::owner;
    let lin: Lineage = "0f0e0d0c-1111-4111-8111-111111111111".parse().unwrap();
    let env = HyperstackProvider::environment_name(&lin, "CANADA-1");
    assert_eq!(env, "gpuprov-0f0e0d0c-canada-1");
    let whose = |v: &Vm, region: &str| {
        seen_at(v, &env, region).and_then(|s| owner(&s.identity, &lin, region))
    };
    let mut v = vm("ACTIVE", None, None, None);
    v.environment = Some(VmEnvironment {
        name: env.clone(),
        region: Some("CANADA-1".into()),
    });
    v.flavor = Some(api::VmFlavor {
        name: "n3-H100x1".into(),
    });
    v.created_at = Some("2026-11-30T20:00:00Z".into());
    let seen = seen_at(&v, &env, "CANADA-1").unwrap();
    assert_eq!(seen.instance_id, "7");
    assert_eq!(seen.identity.name.as_deref(), Some("gpuprov-a-0f0e0d0c"));
    assert_eq!(seen.identity.naming, Naming::Object);
    assert_eq!(seen.instance_type.as_deref(), Some("n3-H100x1"));
    assert!(seen.created_at.is_some());
    assert_eq!(whose(&v, "CANADA-1").as_deref(), Some("a"));
    assert_eq!(
        seen_at(&v, &env, "CANADA-10"),
        None,
        "regions compare whole"
    );
    v.labels = vec![label(IDENTITY_LABEL, "a"), label(LINEAGE_LABEL, "zzz")];
    assert_eq!(whose(&v, "CANADA-1"), None);
    v.labels = vec![
        label(IDENTITY_LABEL, "a"),
        label(LINEAGE_LABEL, lin.as_str()),
    ];
    let seen = seen_at(&v, &env, "CANADA-1").unwrap();
    assert_eq!(seen.identity.vm.as_deref(), Some("a"));
    assert_eq!(seen.identity.lineage.as_deref(), Some(lin.as_str()));
    assert_eq!(whose(&v, "CANADA-1").as_deref(), Some("a"));
    // Labels decide; the name is not read (the old rule also wanted the name).
    v.name = "renamed".into();
    assert_eq!(whose(&v, "CANADA-1").as_deref(), Some("a"));
    v.name = "gpuprov-a-0f0e0d0c".into();
    v.environment = None;
    assert_eq!(
        whose(&v, "CANADA-1").as_deref(),
        Some("a"),
        "labels prove it"
    );
    v.labels.clear();
    assert_eq!(seen_at(&v, &env, "CANADA-1"), None, "nothing proves it");
    v.environment = Some(VmEnvironment {
        name: "someone-else".into(),
        region: Some("CANADA-1".into()),
    });
    assert_eq!(seen_at(&v, &env, "CANADA-1"), None);
    let mut gone = vm("DELETED", None, None, None);
    gone.labels = vec![label(IDENTITY_LABEL, "a")];
    assert_eq!(seen_at(&gone, &env, "CANADA-1"), None);
}

#[test]
fn rules_open_22_and_the_ports_once() {
    let r = security_rules(&[8080, 22]);
    let ports: Vec<Value> = r.iter().map(|r| r["port_range_min"].clone()).collect();
    assert_eq!(ports, [json!(22), json!(8080)]);
    assert_eq!(r[0]["direction"], "ingress");
    assert_eq!(r[0]["protocol"], "tcp");
}

#[test]
fn the_default_image_is_the_newest_ubuntu_cuda_of_the_region() {
    let list = ImageList {
        images: vec![ImageGroup {
            region_name: Some("CANADA-1".into()),
            images: vec![
                Image {
                    name: "Ubuntu Server 22.04 LTS".into(),
                    region_name: None,
                },
                Image {
                    name: "Ubuntu Server 22.04 LTS R535 CUDA 12.2".into(),
                    region_name: None,
                },
                Image {
                    name: "Ubuntu Server 24.04 LTS R570 CUDA 12.8".into(),
                    region_name: None,
                },
                Image {
                    name: "Windows Server 2022".into(),
                    region_name: None,
                },
            ],
        }],
    };
    assert_eq!(
        default_image(&list, "CANADA-1").as_deref(),
        Some("Ubuntu Server 24.04 LTS R570 CUDA 12.8")
    );
    assert_eq!(default_image(&list, "NORWAY-1"), None);
}

#[test]
fn api_key_debug_is_redacted() {
    let (lineage, endpoint) = (Lineage::random(), None);
    let api_key = Some(ApiKey::new("secret_sentinel"));
    let shown = format!(
        "{:?}",
        HyperstackSettings {
            lineage,
            api_key,
            endpoint
        }
    );
    assert!(!shown.contains("secret_sentinel"), "{shown}");
}
