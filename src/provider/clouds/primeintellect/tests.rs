//! Unit tests of the Prime Intellect adapter's mapping.

use super::api::{Prices, SpecValue};
use super::*;
use crate::provider::kit::testing::ask;
use crate::provider::{InstanceStatus, Naming, Shown};

fn conf(
    cloud_id: &str,
    gpu_type: &str,
    count: u32,
    dc: &str,
    security: &str,
    price: f64,
) -> GpuAvailability {
    GpuAvailability {
        cloud_id: cloud_id.into(),
        gpu_type: gpu_type.into(),
        socket: Some("SXM5".into()),
        provider: Some("hyperstack".into()),
        data_center: Some(dc.into()),
        region: Some("canada".into()),
        gpu_count: count,
        stock_status: Some("Available".into()),
        security: Some(security.into()),
        prices: Prices {
            on_demand: (security == "secure_cloud").then_some(price),
            community_price: (security == "community_cloud").then_some(price),
            currency: Some("USD".into()),
        },
        is_spot: None,
        ..GpuAvailability::default()
    }
}

fn ep(conn: Value, ports: &[(&str, &str)]) -> std::result::Result<Option<String>, String> {
    let ports: Vec<PortMapping> = ports
        .iter()
        .map(|(i, e)| PortMapping {
            internal: (*i).into(),
            external: (*e).into(),
            protocol: Some("TCP".into()),
            used_by: None,
        })
        .collect();
    ssh_endpoint(&conn, &ports).map(|e| e.map(|e| e.to_string()))
}

#[test]
fn every_shape_of_ssh_connection() {
    // The description's example.
    assert_eq!(
        ep(json!("root@135.23.125.123 -p 22"), &[]),
        Ok(Some("root@135.23.125.123:22".into()))
    );
    // A NAT port, and a user the provider chose.
    assert_eq!(
        ep(json!("ubuntu@127.0.0.7 -p 40123"), &[]),
        Ok(Some("ubuntu@127.0.0.7:40123".into()))
    );
    // No `-p`: the port mapping's public port for 22, else 22 (the CLI's default).
    assert_eq!(
        ep(json!("root@127.0.0.7"), &[("22", "41022")]),
        Ok(Some("root@127.0.0.7:41022".into()))
    );
    assert_eq!(
        ep(json!("root@127.0.0.7"), &[("8888", "1234")]),
        Ok(Some("root@127.0.0.7:22".into()))
    );
    // No user: root. `-p` glued or before the host, an `ssh` prefix, other options.
    assert_eq!(
        ep(json!("127.0.0.7 -p 2222"), &[]),
        Ok(Some("root@127.0.0.7:2222".into()))
    );
    assert_eq!(
        ep(json!("ssh -p2222 root@127.0.0.7"), &[]),
        Ok(Some("root@127.0.0.7:2222".into()))
    );
    assert_eq!(
        ep(
            json!("ssh -i ~/.ssh/id -o ConnectTimeout=5 root@127.0.0.7 -p 3"),
            &[]
        ),
        Ok(Some("root@127.0.0.7:3".into()))
    );
    // Lists (one entry per node): the first string; nulls while nodes come up.
    assert_eq!(
        ep(json!(["root@127.0.0.8 -p 1", "root@127.0.0.9 -p 2"]), &[]),
        Ok(Some("root@127.0.0.8:1".into()))
    );
    assert_eq!(
        ep(json!([null, "root@127.0.0.9 -p 2"]), &[]),
        Ok(Some("root@127.0.0.9:2".into()))
    );
    // Not there yet: booting, no endpoint.
    for late in [
        json!(null),
        json!([]),
        json!([null]),
        json!(""),
        json!("  "),
    ] {
        assert_eq!(ep(late.clone(), &[]), Ok(None), "{late}");
    }
    // Unreadable: a reason, never a panic.
    for bad in [
        "root@ -p 22",
        "-p 22",
        "root@h -p",
        "root@h -p 70000",
        "root@h -p x",
        "a@h b@h",
    ] {
        assert!(ep(json!(bad), &[]).is_err(), "{bad}");
    }
}

#[test]
fn gpu_types_name_their_model() {
    assert_eq!(gpu_model("H100_80GB"), "H100");
    assert_eq!(gpu_model("RTX_PRO_6000B_96GB"), "RTX_PRO_6000B");
    assert_eq!(gpu_model("GB200"), "GB200");
    assert!(gpu_matches("h100", "H100_80GB"));
    assert!(gpu_matches("A100", "A100_40GB") && gpu_matches("A100", "A100_80GB"));
    assert!(gpu_matches("A100 80GB", "A100_80GB") && !gpu_matches("A100 80GB", "A100_40GB"));
    assert!(!gpu_matches("H200", "H100_80GB"));
    assert!(!gpu_matches("L40", "L40S_48GB"));
}

#[test]
fn offers_per_data_centre_with_the_tier_price() {
    let mut eur = conf(
        "n3-H100x8",
        "H100_80GB",
        8,
        "NORWAY-1",
        "secure_cloud",
        15.0,
    );
    eur.prices.currency = Some("EUR".into());
    let mut gone = conf("n3-H100x8", "H100_80GB", 8, "US-1", "secure_cloud", 15.0);
    gone.stock_status = Some("Unavailable".into());
    let mut spot = conf("spot-h100", "H100_80GB", 8, "US-2", "secure_cloud", 9.0);
    spot.is_spot = Some(true);
    let items = vec![
        conf(
            "n3-H100x8",
            "H100_80GB",
            8,
            "CANADA-1",
            "secure_cloud",
            15.2,
        ),
        conf(
            "NVIDIA H100 80GB HBM3",
            "H100_80GB",
            8,
            "US-KS-2",
            "community_cloud",
            17.52,
        ),
        conf("n3-H100x1", "H100_80GB", 1, "CANADA-1", "secure_cloud", 1.9),
        eur,
        gone,
        spot,
    ];
    let o = offers_for(&items, &ask(Some("H100"), 8, &[]));
    let got: Vec<(&str, f64)> = o
        .iter()
        .map(|o| (o.id.as_str(), o.price_per_hour))
        .collect();
    assert_eq!(
        got,
        [
            ("primeintellect/CANADA-1/hyperstack/n3-H100x8", 15.2),
            (
                "primeintellect/US-KS-2/hyperstack/NVIDIA H100 80GB HBM3/community",
                17.52
            ),
        ]
    );
    assert_eq!((o[0].gpu.as_deref(), o[0].gpu_count), (Some("H100"), 8));
    assert_eq!(o[0].detail["security"], "secure_cloud");
    let canada = offers_for(&items, &ask(Some("H100"), 8, &["canada-1"]));
    assert_eq!(canada.len(), 1, "data centres match whole, ignoring case");
    assert!(offers_for(&items, &ask(Some("H100"), 8, &["CANADA"])).is_empty());
    let mut s = ask(Some("H100"), 8, &[]);
    s.spot = true;
    let o = offers_for(&items, &s);
    assert_eq!((o.len(), o[0].spot, o[0].price_per_hour), (1, true, 9.0));
}

#[test]
fn offers_carry_the_configurations_default_size() {
    let mut c = conf(
        "n3-H100x8",
        "H100_80GB",
        8,
        "CANADA-1",
        "secure_cloud",
        15.2,
    );
    let spec = |n| SpecValue {
        default_count: Some(n),
    };
    (c.vcpu, c.memory, c.disk) = (spec(104), spec(752), spec(1000));
    let o = offers_for(&[c], &ask(Some("H100"), 8, &[]));
    let f = &o[0].facts;
    assert_eq!(
        (f.vcpus, f.memory_gib, f.disk_gib),
        (Some(104), Some(752.0), Some(1000))
    );
    assert_eq!(f.prices_as_of, None, "a live quote");
}

#[test]
fn statuses_and_late_ssh() {
    let pod = |status: &str, conn: Value| Pod {
        id: "p1".into(),
        name: "n".into(),
        status: status.into(),
        installation_status: None,
        installation_failure: None,
        ssh_connection: conn,
        prime_port_mapping: None,
        ..Pod::default()
    };
    let observed = |p: &Pod| seen_at(p, "us-east-1");
    let o = observed(&pod("PROVISIONING", json!(null))).unwrap();
    assert_eq!((o.status, o.ssh), (InstanceStatus::Pending, None));
    let o = observed(&pod("ACTIVE", json!(null))).unwrap();
    assert_eq!(
        (o.status, o.ssh),
        (InstanceStatus::Running, None),
        "running, endpoint not yet known"
    );
    let o = observed(&pod("ACTIVE", json!("root@127.0.0.3 -p 1234"))).unwrap();
    assert_eq!(o.ssh.unwrap().port, 1234);
    let o = observed(&pod("ACTIVE", json!("root@ -p 1"))).unwrap();
    assert!(matches!(o.status, InstanceStatus::Failed(r) if r.contains("sshConnection")));
    assert!(observed(&pod("TERMINATED", json!(null))).is_none());
    assert_eq!(
        status_of(&pod("DELETING", json!(null))),
        Some(InstanceStatus::Terminating)
    );
    assert_eq!(
        status_of(&pod("STOPPED", json!(null))),
        Some(InstanceStatus::Stopped)
    );
    let mut failed = pod("ACTIVE", json!(null));
    failed.installation_status = Some("ERROR".into());
    failed.installation_failure = Some("image pull failed".into());
    assert!(
        matches!(status_of(&failed), Some(InstanceStatus::Failed(r)) if r.contains("image pull"))
    );
}

/// The listing shows every pod at every location (it does not say where one runs), with
/// its name under the located naming, its price and creation time.
#[test]
fn listing_shows_the_located_name_price_and_creation_time() {
    let p: Pod = serde_json::from_value(json!({
        "id": "p1", "name": "gpuprov-a-0f0e0d0c-us-east-1", "status": "ACTIVE",
        "sshConnection": null, "priceHr": 2.5, "createdAt": "2026-03-13T20:00:00Z"
    }))
    .unwrap();
    let seen = seen_at(&p, "us-east-1").unwrap();
    assert_eq!(
        seen.identity,
        Shown::default().named(Some("gpuprov-a-0f0e0d0c-us-east-1"), Naming::Located)
    );
    assert_eq!(seen.price_per_hour, Some(2.5));
    assert!(seen.created_at.is_some());
    assert_eq!(seen.instance_type, None, "pods carry no cloudId");
    assert_eq!(
        seen_at(&p, "eu-west-1").map(|s| s.instance_id).as_deref(),
        Some("p1"),
        "shown everywhere: the name says where"
    );
}

#[test]
fn pages_run_to_the_total_and_keys_come_from_env_or_the_cli() {
    assert_eq!(next_page(1, 100, Some(150)), Next::Page(2));
    assert_eq!(next_page(2, 50, Some(150)), Next::Done);
    assert_eq!(
        next_page(1, 0, Some(150)),
        Next::Done,
        "an empty page ends it"
    );
    assert_eq!(next_page(1, 100, None), Next::Page(2));
    assert_eq!(next_page(1, 7, None), Next::Done);
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join(".prime")).unwrap();
    std::fs::write(
        dir.path().join(CONFIG_FILE),
        r#"{"api_key": "pk-file", "team_id": null}"#,
    )
    .unwrap();
    let (k, place) = find_api_key(None, Some(dir.path()));
    assert_eq!(k.unwrap().expose(), "pk-file");
    assert!(place.ends_with(".prime/config.json"), "{place}");
    let (k, place) = find_api_key(Some("pk-env".into()), Some(dir.path()));
    assert_eq!(
        (k.unwrap().expose(), place.as_str()),
        ("pk-env", "the PRIME_API_KEY environment variable")
    );
    assert!(find_api_key(None, None).0.is_none());
}
