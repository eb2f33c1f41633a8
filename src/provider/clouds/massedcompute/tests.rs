//! Unit tests of the Massed Compute adapter's mapping.

use super::api::{InstanceType, Region};
use super::*;
use crate::provider::kit::testing::ask;
use crate::provider::{InstanceStatus, Naming, Shown};

fn product(desc: &str, cents: i64, regions: &[&str], capacity: i64) -> Product {
    Product {
        instance_type: InstanceType {
            description: desc.into(),
            price_cents_per_hour: Some(cents),
        },
        regions_with_capacity_available: regions
            .iter()
            .map(|r| Region { name: (*r).into() })
            .collect(),
        capacity_available: Some(capacity),
    }
}

fn inventory() -> Inventory {
    let mut inv = Inventory::default();
    let mut add = |name: &str, p: Product| {
        inv.gpu_inventory.insert(name.into(), p);
    };
    add(
        "gpu_8x_h100",
        product("8x H100 SXM5", 2399, &["us-central-1", "us-central-10"], 3),
    );
    add(
        "gpu_1x_a6000",
        product("1x RTX A6000", 62, &["us-east-2"], 1),
    );
    add("gpu_1x_l40", product("1x L40", 99, &[], 0));
    inv
}

#[test]
fn gpus_come_from_the_description_then_the_name() {
    assert_eq!(
        gpu_of("gpu_8x_h100", "8x H100 SXM5"),
        Some(("H100 SXM5".into(), 8))
    );
    assert_eq!(gpu_of("gpu_1x_l40", ""), Some(("L40".into(), 1)));
    assert_eq!(gpu_of("cpu_only", "a CPU box"), None);
    let inv = inventory();
    let a6000 = &inv.gpu_inventory["gpu_1x_a6000"];
    assert!(product_matches(
        "gpu_1x_a6000",
        a6000,
        &ask(Some("A6000"), 1, &[])
    ));
    assert!(product_matches(
        "gpu_1x_a6000",
        a6000,
        &ask(Some("RTX A6000"), 0, &[])
    ));
    assert!(!product_matches(
        "gpu_1x_a6000",
        a6000,
        &ask(Some("A6000"), 2, &[])
    ));
    let h100 = &inv.gpu_inventory["gpu_8x_h100"];
    assert!(product_matches(
        "gpu_8x_h100",
        h100,
        &ask(Some("h100"), 8, &[])
    ));
    assert!(!product_matches(
        "gpu_8x_h100",
        h100,
        &ask(Some("H200"), 8, &[])
    ));
}

#[test]
fn cents_become_usd_in_region_any_unless_pinned() {
    let inv = inventory();
    let o = offers_for(&inv, &ask(Some("H100"), 8, &[]));
    assert_eq!(o.len(), 1, "{o:?}");
    assert_eq!(o[0].id, "massedcompute/any/gpu_8x_h100");
    assert_eq!(o[0].location.region, "any");
    assert_eq!(
        o[0].price_per_hour, 23.99,
        "2399 cents per hour for the machine"
    );
    assert_eq!(
        (o[0].gpu.as_deref(), o[0].gpu_count),
        (Some("H100 SXM5"), 8)
    );
    // Pinned regions match exactly; `any` may be asked for beside them.
    let ids = |o: Vec<Offer>| o.into_iter().map(|o| o.id).collect::<Vec<_>>();
    assert_eq!(
        ids(offers_for(&inv, &ask(Some("H100"), 8, &["us-central-1"]))),
        ["massedcompute/us-central-1/gpu_8x_h100"]
    );
    assert!(offers_for(&inv, &ask(Some("H100"), 8, &["us-central"])).is_empty());
    assert_eq!(
        ids(offers_for(
            &inv,
            &ask(Some("H100"), 8, &["us-central-10", "any"])
        )),
        [
            "massedcompute/any/gpu_8x_h100",
            "massedcompute/us-central-10/gpu_8x_h100"
        ]
    );
    // No capacity anywhere: no offer in `any` either.
    assert!(offers_for(&inv, &ask(Some("L40"), 1, &[])).is_empty());
    // Capacity counted without a region list still makes an `any` offer.
    let mut inv = inv;
    inv.gpu_inventory
        .insert("gpu_2x_l40".into(), product("2x L40", 198, &[], 2));
    assert_eq!(
        ids(offers_for(&inv, &ask(Some("L40"), 2, &[]))),
        ["massedcompute/any/gpu_2x_l40"]
    );
}

#[test]
fn statuses_follow_brevdev_and_gone_is_gone() {
    assert_eq!(status_of("rented"), Some(InstanceStatus::Running));
    assert_eq!(status_of("Active"), Some(InstanceStatus::Running));
    assert_eq!(status_of("booting"), Some(InstanceStatus::Pending));
    assert_eq!(status_of("stopped"), Some(InstanceStatus::Stopped));
    assert_eq!(status_of("deleting"), Some(InstanceStatus::Terminating));
    assert!(matches!(
        status_of("error"),
        Some(InstanceStatus::Failed(_))
    ));
    assert_eq!(status_of("terminated"), None);
    let i = Instance {
        uuid: "u1".into(),
        name: Some("n".into()),
        ip: Some(" ".into()),
        username: None,
        status: Some("booting".into()),
        ..Instance::default()
    };
    assert_eq!(
        seen_at(&i, "any").unwrap().ssh,
        None,
        "a blank ip is no endpoint yet"
    );
    let i = Instance {
        ip: Some("127.0.0.9".into()),
        username: Some("Ubuntu".into()),
        status: Some("rented".into()),
        ..i
    };
    let ep = seen_at(&i, "any").unwrap().ssh.unwrap();
    assert_eq!(
        (ep.host.as_str(), ep.port, ep.user.as_deref()),
        ("127.0.0.9", 22, Some("Ubuntu"))
    );
}

/// The listing shows every instance at every location (it does not say where one runs),
/// with its name under the location's naming, its product, price and creation time.
#[test]
fn listing_shows_the_name_under_the_locations_naming_and_the_product() {
    let i: Instance = serde_json::from_value(json!({
        "uuid": "u1", "name": "gpuprov-a-0f0e0d0c-us-east-2", "status": "rented",
        "created": "2024-08-07T16:41:43.000Z",
        "product": {"name": "gpu_1x_l40", "price_hr": "0.99", "gpu_count": 1}
    }))
    .unwrap();
    let pinned = seen_at(&i, "us-east-2").unwrap();
    assert_eq!(
        pinned.identity,
        Shown::default().named(Some("gpuprov-a-0f0e0d0c-us-east-2"), Naming::Located)
    );
    assert_eq!(pinned.instance_type.as_deref(), Some("gpu_1x_l40"));
    assert_eq!(pinned.price_per_hour, Some(0.99));
    assert!(pinned.created_at.is_some());
    assert_eq!(
        seen_at(&i, "ANY").unwrap().identity.naming,
        Naming::Object,
        "the any-region location names without a region"
    );
    let gone = Instance {
        status: Some("terminated".into()),
        ..i
    };
    assert_eq!(seen_at(&gone, "us-east-2"), None);
}

#[test]
fn names_carry_the_pinned_region_and_config_files_their_key() {
    let p = MassedComputeProvider::new(MassedComputeSettings {
        endpoint: None,
        api_key: Some(crate::provider::Secret::new("secret_sentinel")),
        key_source: "x".into(),
        lineage: Lineage::parse("0f0e0d0c-1111-4222-8333-444455556666").unwrap(),
    });
    assert_eq!(p.instance_name("a", "any"), "gpuprov-a-0f0e0d0c");
    assert_eq!(
        p.instance_name("a", "us-east-2"),
        "gpuprov-a-0f0e0d0c-us-east-2"
    );
    assert!(!format!("{:?} {:?}", p.settings(), p.api).contains("secret_sentinel"));
    assert_eq!(
        api_key_from_config(r#"{"apiKey": "k1", "baseUrl": "x"}"#).as_deref(),
        Some("k1")
    );
    assert_eq!(api_key_from_config("not json"), None);
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("massed-compute")).unwrap();
    std::fs::write(dir.path().join(CONFIG_FILE), r#"{"apiKey":"from-file"}"#).unwrap();
    let (k, place) = find_api_key(None, Some(dir.path()));
    assert_eq!(k.unwrap().expose(), "from-file");
    assert!(place.ends_with("massed-compute/config.json"), "{place}");
    let (k, place) = find_api_key(Some("from-env".into()), Some(dir.path()));
    assert_eq!(
        (k.unwrap().expose(), place.as_str()),
        (
            "from-env",
            "the MASSED_COMPUTE_API_KEY environment variable"
        )
    );
    let (k, place) = find_api_key(None, Some(&dir.path().join("nowhere")));
    assert!(k.is_none());
    assert!(
        place.contains("MASSED_COMPUTE_API_KEY") && place.contains("nowhere"),
        "{place}"
    );
}
