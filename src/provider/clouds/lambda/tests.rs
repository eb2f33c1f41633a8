//! Unit tests of the Lambda adapter's mapping.

use super::api::{InstanceType, Region, Specs, Tag};
use super::*;
use crate::provider::kit::testing::ask;

fn item(name: &str, desc: &str, gpus: u32, cents: i64, regions: &[&str]) -> TypesItem {
    TypesItem {
        instance_type: InstanceType {
            name: name.into(),
            description: String::new(),
            gpu_description: desc.into(),
            price_cents_per_hour: cents,
            specs: Specs {
                gpus,
                vcpus: None,
                memory_gib: None,
                storage_gib: None,
            },
        },
        regions_with_capacity_available: regions
            .iter()
            .map(|r| Region { name: (*r).into() })
            .collect(),
    }
}

#[test]
fn gpu_models_from_description_then_name() {
    assert_eq!(
        gpu_model("H100 (80 GB SXM5)", "gpu_8x_h100_sxm5", 8).as_deref(),
        Some("H100")
    );
    assert_eq!(
        gpu_model("RTX 6000 (24 GB)", "gpu_1x_rtx6000", 1).as_deref(),
        Some("RTX 6000")
    );
    assert_eq!(
        gpu_model("", "gpu_8x_h100_sxm5", 8).as_deref(),
        Some("H100")
    );
    assert_eq!(gpu_model("", "cpu_4x_general", 0), None);
    assert_eq!(gpu::norm("rtx6000"), gpu::norm("RTX 6000"));
}

#[test]
fn offers_filter_by_gpu_count_and_exact_region() {
    let types = vec![
        item(
            "gpu_8x_h100_sxm5",
            "H100 (80 GB SXM5)",
            8,
            2392,
            &["us-east-13", "us-east-1"],
        ),
        item(
            "gpu_1x_h100_pcie",
            "H100 (80 GB PCIe)",
            1,
            249,
            &["us-east-1"],
        ),
        item("gpu_8x_a100", "A100 (40 GB SXM4)", 8, 1032, &["us-east-1"]),
    ];
    let o = offers_for(&types, &ask(Some("h100"), 8, &["us-east-1"]));
    let ids: Vec<&str> = o.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(ids, ["lambda/us-east-1/gpu_8x_h100_sxm5"]);
    assert_eq!(o[0].price_per_hour, 23.92);
    assert_eq!((o[0].gpu.as_deref(), o[0].gpu_count), (Some("H100"), 8));
    let o = offers_for(&types, &ask(Some("H100"), 8, &["us-east-13"]));
    assert_eq!(o.len(), 1);
    assert_eq!(o[0].location.region, "us-east-13");
    assert!(offers_for(&types, &ask(Some("H100"), 8, &["us-east"])).is_empty());
    // Region preference first, then price: the core's order.
    let req = ask(None, 8, &["us-east-13", "us-east-1"]);
    let mut o = offers_for(&types, &req);
    crate::provider::offers::order(&mut o, &req, &Capabilities::default());
    let ids: Vec<&str> = o.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "lambda/us-east-13/gpu_8x_h100_sxm5",
            "lambda/us-east-1/gpu_8x_a100",
            "lambda/us-east-1/gpu_8x_h100_sxm5"
        ]
    );
}

#[test]
fn statuses_map_and_terminated_is_gone() {
    assert_eq!(status_of("booting"), Some(InstanceStatus::Pending));
    assert_eq!(status_of("active"), Some(InstanceStatus::Running));
    assert_eq!(
        status_of("unhealthy"),
        Some(InstanceStatus::Failed("unhealthy".into()))
    );
    assert_eq!(status_of("terminating"), Some(InstanceStatus::Terminating));
    assert_eq!(
        status_of("preempted"),
        Some(InstanceStatus::Preempted {
            signal: "Lambda status `preempted`".into(),
            stopped: true
        })
    );
    assert_eq!(status_of("terminated"), None);
}

#[test]
fn listing_shows_tags_name_type_and_price_in_the_region_only() {
    let inst = |region: &str, tags: Option<Vec<(&str, &str)>>, name: &str| Instance {
        id: "i".into(),
        name: Some(name.into()),
        ip: Some("192.0.2.7".into()),
        status: "active".into(),
        region: Some(Region {
            name: region.into(),
        }),
        tags: tags.map(|t| {
            t.into_iter()
                .map(|(k, v)| Tag {
                    key: k.into(),
                    value: v.into(),
                })
                .collect()
        }),
        instance_type: Some(api::TypeRef {
            name: "gpu_1x_h100_pcie".into(),
            price_cents_per_hour: Some(249),
        }),
    };
    let lin = "0f0e0d0c-1111-4222-8333-444455556666";
    let both = Some(vec![(IDENTITY_LABEL, "a"), (LINEAGE_LABEL, lin)]);
    let seen = seen_at(&inst("us-east-1", both.clone(), "x"), "us-east-1").unwrap();
    assert_eq!(seen.identity.vm.as_deref(), Some("a"));
    assert_eq!(seen.identity.lineage.as_deref(), Some(lin));
    assert_eq!(seen.identity.name.as_deref(), Some("x"));
    assert_eq!(seen.identity.naming, Naming::Object);
    assert_eq!(seen.instance_type.as_deref(), Some("gpu_1x_h100_pcie"));
    assert_eq!(seen.price_per_hour, Some(2.49));
    assert_eq!(seen.ssh.as_ref().map(|e| e.port), Some(SSH_PORT));
    assert_eq!(
        seen_at(&inst("us-east-13", both, "x"), "us-east-1"),
        None,
        "regions compare whole"
    );
    let untagged = seen_at(&inst("us-east-1", None, "gpuprov-a-0f0e0d0c"), "us-east-1").unwrap();
    assert_eq!(
        (untagged.identity.vm, untagged.identity.lineage),
        (None, None)
    );
    let mut gone = inst("us-east-1", None, "x");
    gone.status = "terminated".into();
    assert_eq!(seen_at(&gone, "us-east-1"), None);
}

#[test]
fn api_key_debug_is_redacted() {
    let s = LambdaSettings {
        api_key: Some(ApiKey::new("secret_sentinel")),
        ..LambdaSettings::from_env_and_config(None, Lineage::random())
    };
    let p = LambdaProvider::new(s.clone());
    let shown = format!("{s:?} {:?}", p.api);
    assert!(!shown.contains("secret_sentinel"), "{shown}");
}
