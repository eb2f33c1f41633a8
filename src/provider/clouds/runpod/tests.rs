//! Unit tests of the RunPod mapping (catalog, statuses, SSH, ownership, credentials).

use super::api::*;
use super::*;
use crate::provider::kit::testing::ask;
use crate::provider::{InstanceStatus, Naming};

/// `offers_for` in the order the core applies ([`crate::provider::offers::order`]).
fn ordered(catalog: &[(Tier, Vec<GpuType>)], req: &ResourceRequest, count: u32) -> Vec<Offer> {
    let mut o = offers_for(catalog, req, count);
    crate::provider::offers::order(&mut o, req, &RunpodProvider::default_capabilities());
    o
}

fn gpu(id: &str, name: &str, price: (f64, f64), max: (u32, u32), dcs: &[&str]) -> GpuType {
    GpuType {
        id: id.into(),
        name: name.into(),
        secure: max.0 > 0,
        community: max.1 > 0,
        price: PerTier {
            secure: price.0,
            community: price.1,
        },
        max_count: PerTier {
            secure: max.0,
            community: max.1,
        },
        data_centers: dcs
            .iter()
            .map(|d| DataCenterStock {
                id: (*d).into(),
                availability: "HIGH".into(),
            })
            .collect(),
    }
}

fn pod(v: Value) -> Pod {
    serde_json::from_value(v).unwrap()
}

#[test]
fn gpu_models_match_by_id_name_or_leading_words() {
    assert!(gpu_matches("H100", "NVIDIA H100 80GB HBM3", "H100 SXM"));
    assert!(gpu_matches("h100 sxm", "NVIDIA H100 80GB HBM3", "H100 SXM"));
    assert!(gpu_matches(
        "nvidia h100 80gb hbm3",
        "NVIDIA H100 80GB HBM3",
        "H100 SXM"
    ));
    assert!(gpu_matches(
        "rtx4090",
        "NVIDIA GeForce RTX 4090",
        "RTX 4090"
    ));
    assert!(!gpu_matches("L40", "NVIDIA L40S", "L40S"));
    assert!(!gpu_matches("A40", "NVIDIA RTX A4000", "RTX A4000"));
    assert!(!gpu_matches("H100 SXM", "NVIDIA H100 NVL", "H100 NVL"));
    assert!(!gpu_matches("", "x", "y"));
}

#[test]
fn offers_per_tier_and_data_centre_with_exact_regions() {
    let h100 = gpu(
        "NVIDIA H100 80GB HBM3",
        "H100 SXM",
        (2.99, 2.69),
        (8, 8),
        &["US-KS-2", "US-KS-20"],
    );
    let a100 = gpu(
        "NVIDIA A100 80GB PCIe",
        "A100 PCIe",
        (1.64, 1.19),
        (8, 0),
        &["US-KS-2"],
    );
    let catalog = vec![
        (Tier::Secure, vec![h100.clone(), a100.clone()]),
        (Tier::Community, vec![h100.clone(), a100.clone()]),
    ];
    let o = ordered(&catalog, &ask(Some("H100"), 8, &["US-KS-2"]), 8);
    let ids: Vec<&str> = o.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "runpod/US-KS-2/community/NVIDIA H100 80GB HBM3",
            "runpod/US-KS-2/secure/NVIDIA H100 80GB HBM3"
        ]
    );
    assert!(
        (o[0].price_per_hour - 21.52).abs() < 1e-9,
        "{}",
        o[0].price_per_hour
    );
    assert_eq!(o[0].gpu.as_deref(), Some("H100 SXM"));
    assert_eq!(o[0].detail["tier"], "COMMUNITY");
    // `us-ks-2` names US-KS-2 only, never US-KS-20; `US-KS` names nothing.
    let o = ordered(&catalog, &ask(Some("H100"), 8, &["us-ks-2"]), 8);
    assert!(o.iter().all(|o| o.location.region == "US-KS-2"));
    assert!(ordered(&catalog, &ask(Some("H100"), 8, &["US-KS"]), 8).is_empty());
    // The A100 has no community machines: one secure offer.
    let o = ordered(&catalog, &ask(Some("A100"), 2, &[]), 2);
    assert_eq!(o.len(), 1);
    assert_eq!(o[0].detail["tier"], "SECURE");
    // More GPUs than the largest machine: none.
    assert!(ordered(&catalog, &ask(Some("A100"), 16, &[]), 16).is_empty());
    // Region preference first, then price.
    let o = ordered(&catalog, &ask(None, 1, &["US-KS-20", "US-KS-2"]), 1);
    assert_eq!(o[0].location.region, "US-KS-20");
}

#[test]
fn statuses_map_and_terminated_is_gone() {
    assert_eq!(status_of("PROVISIONING"), Some(InstanceStatus::Pending));
    assert_eq!(status_of("STARTING"), Some(InstanceStatus::Pending));
    assert_eq!(status_of("RUNNING"), Some(InstanceStatus::Running));
    assert_eq!(status_of("EXITED"), Some(InstanceStatus::Stopped));
    assert!(matches!(
        status_of("ERROR"),
        Some(InstanceStatus::Failed(_))
    ));
    assert_eq!(status_of("TERMINATED"), None);
}

#[test]
fn ssh_endpoint_from_direct_then_runtime_ports_and_none_while_unmapped() {
    let base = json!({"id": "p", "name": "n", "status": "RUNNING"});
    let with = |extra: Value| {
        let mut v = base.clone();
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        pod(v)
    };
    let direct = with(json!({"ssh": {"proxy": null, "direct": {
        "host": "127.0.0.9", "port": 34446, "username": "root", "command": "ssh"}}}));
    let e = ssh_endpoint(&direct).unwrap();
    let got = (e.host.as_str(), e.port, e.user.as_deref());
    assert_eq!(got, ("127.0.0.9", 34446, Some("root")));
    let mapped = with(
        json!({"ssh": {"proxy": null, "direct": null}, "runtime": {"ports": [
        {"private": 8888, "public": 40000, "type": "http", "ip": "127.0.0.9"},
        {"private": 22, "public": 40022, "type": "tcp", "ip": "127.0.0.9"}]}}),
    );
    assert_eq!(ssh_endpoint(&mapped).unwrap().port, 40022);
    for unmapped in [
        json!({}),
        json!({"ssh": {"proxy": null, "direct": null}, "runtime": null}),
        json!({"runtime": {}}),
        json!({"runtime": {"ports": null}}),
        json!({"runtime": {"ports": []}}),
        json!({"runtime": {"ports": [{"private": 22, "public": null, "type": "tcp", "ip": null}]}}),
        json!({"runtime": {"ports": [{"private": 22, "public": 40022, "type": "tcp", "ip": null}]}}),
    ] {
        assert_eq!(ssh_endpoint(&with(unmapped.clone())), None, "{unmapped}");
    }
}

/// The listing shows a pod at the data centre it runs in (or was asked for, before the
/// scheduler assigns one) with its identity env and name; whose it is, is then the core's
/// one rule ([`owner`], tested in `identity.rs`): the same cases as before the rule moved.
#[test]
fn listing_shows_identity_env_name_and_data_centre() {
    use crate::provider::identity::owner;
    let lin: Lineage = "0f0e0d0c-1111-4111-8111-111111111111".parse().unwrap();
    let p = |env: Value, dc: Value, name: &str| {
        pod(
            json!({"id": "p", "name": name, "status": "RUNNING", "env": env, "dataCenterId": dc,
            "gpu": {"id": "NVIDIA H100 80GB HBM3", "count": 1}, "cost": 2.99,
            "createdAt": "2026-03-13T20:00:00Z"}),
        )
    };
    let whose = |pod: &Pod, region: &str| {
        seen_at(pod, region).and_then(|s| owner(&s.identity, &lin, region))
    };
    let ours = json!({ENV_VM_NAME: "a", ENV_LINEAGE: lin.as_str(), ENV_DATA_CENTER: "US-KS-2"});
    let seen = seen_at(&p(ours.clone(), json!("US-KS-2"), "x"), "us-ks-2").unwrap();
    assert_eq!(seen.identity.vm.as_deref(), Some("a"));
    assert_eq!(seen.identity.lineage.as_deref(), Some(lin.as_str()));
    assert_eq!(seen.identity.name.as_deref(), Some("x"));
    assert_eq!(seen.identity.naming, Naming::Object);
    assert_eq!(seen.instance_type.as_deref(), Some("NVIDIA H100 80GB HBM3"));
    assert_eq!(seen.price_per_hour, Some(2.99));
    assert!(seen.created_at.is_some());
    assert_eq!(
        whose(&p(ours.clone(), json!("US-KS-2"), "x"), "US-KS-2").as_deref(),
        Some("a")
    );
    assert_eq!(
        seen_at(&p(ours.clone(), json!("US-KS-2"), "x"), "US-KS-20"),
        None,
        "data centre ids compare whole"
    );
    // Not yet scheduled: the data centre asked for at create decides.
    assert_eq!(
        whose(&p(ours.clone(), Value::Null, "x"), "US-KS-2").as_deref(),
        Some("a")
    );
    assert_eq!(seen_at(&p(ours, Value::Null, "x"), "EU-RO-1"), None);
    // Neither: seen everywhere rather than missed.
    assert!(seen_at(&p(json!({}), Value::Null, "x"), "EU-RO-1").is_some());
    let other = json!({ENV_VM_NAME: "a", ENV_LINEAGE: "zzz"});
    assert_eq!(
        whose(&p(other, json!("US-KS-2"), "gpuprov-a-0f0e0d0c"), "US-KS-2"),
        None
    );
    // No identity env: the gpuprov name.
    assert_eq!(
        whose(
            &p(json!({}), json!("US-KS-2"), "gpuprov-a-0f0e0d0c"),
            "US-KS-2"
        )
        .as_deref(),
        Some("a")
    );
    assert_eq!(
        whose(&p(json!({}), json!("US-KS-2"), "mine"), "US-KS-2"),
        None
    );
    let mut gone = p(json!({}), json!("US-KS-2"), "x");
    gone.status = "TERMINATED".into();
    assert_eq!(seen_at(&gone, "US-KS-2"), None);
}

#[test]
fn api_key_from_the_runpod_cli_config_files() {
    assert_eq!(
        api_key_from_config("apiUrl = \"https://api.runpod.io/graphql\"\napiKey = \"rpa_x\"\n")
            .as_deref(),
        Some("rpa_x")
    );
    assert_eq!(
        api_key_from_config("apikey = 'rpa_y'").as_deref(),
        Some("rpa_y")
    );
    assert_eq!(
        api_key_from_config("[default]\napi_key = \"rpa_z\"\n").as_deref(),
        Some("rpa_z")
    );
    assert_eq!(api_key_from_config("apiKey = \"\""), None);
    assert_eq!(api_key_from_config("not toml = = ="), None);

    let home = tempfile::tempdir().unwrap();
    let (k, src) = find_api_key(Some("  env_key ".into()), Some(home.path()));
    assert_eq!(k, Some(ApiKey::new("env_key")));
    assert!(src.contains(API_KEY_ENV));
    let (k, src) = find_api_key(None, Some(home.path()));
    assert_eq!(k, None);
    assert!(
        src.contains(API_KEY_ENV) && src.contains("config.toml"),
        "{src}"
    );
    std::fs::create_dir_all(home.path().join(".runpod")).unwrap();
    std::fs::write(home.path().join(CONFIG_FILE), "apiKey = \"file_key\"\n").unwrap();
    let (k, src) = find_api_key(Some(String::new()), Some(home.path()));
    assert_eq!(k, Some(ApiKey::new("file_key")));
    assert!(!src.contains("file_key"));
    std::fs::write(home.path().join(CONFIG_FILE), "apiKey = \"file_key\" junk").unwrap();
    let (k, src) = find_api_key(None, Some(home.path()));
    assert_eq!(k, None);
    assert!(!src.contains("file_key"), "{src}");
}

#[test]
fn segments_are_percent_encoded() {
    assert_eq!(
        encode_segment("NVIDIA H100 80GB HBM3"),
        "NVIDIA%20H100%2080GB%20HBM3"
    );
    assert_eq!(encode_segment("abc-12_x.y"), "abc-12_x.y");
    assert_eq!(encode_segment("a/b"), "a%2Fb");
}

#[test]
fn api_key_debug_is_redacted() {
    let mut s = RunpodSettings::from_env_and_config(None, Lineage::random());
    s.api_key = Some(ApiKey::new("secret_sentinel"));
    assert!(!format!("{s:?}").contains("secret_sentinel"));
}

#[test]
fn the_shared_key_is_found_by_value_and_ours_only_by_its_comment() {
    assert_eq!(comment_of("ssh-ed25519 AAAA me@laptop  "), "me@laptop");
    assert_eq!(comment_of("ssh-ed25519 AAAA"), "");
    assert_eq!(comment_of("ssh-ed25519  AAAA  two words"), "two words");
    let lineage = "0f0e0d0c-1111-4222-8333-444455556666";
    let p = RunpodProvider::new(RunpodSettings {
        lineage: lineage.parse().unwrap(),
        key_source: "test".into(),
        api_key: None,
        endpoint: None,
    });
    let project = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIProject me@laptop";
    let name = project_key_name(lineage, project);
    let users = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIProject me@laptop".to_string();
    let ours = format!("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIProject {name}");
    let other = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOther me@laptop".to_string();
    assert_eq!(
        p.find_shared(std::slice::from_ref(&other), project)
            .unwrap(),
        None
    );
    let found = p
        .find_shared(&[other.clone(), users.clone()], project)
        .unwrap()
        .unwrap();
    assert!(!found.ours, "the user's copy is used, never ours");
    assert_eq!(found.name, "me@laptop");
    let found = p
        .find_shared(&[users, ours.clone(), other], project)
        .unwrap()
        .unwrap();
    assert!(found.ours, "our entry preferred over the user's copy");
    assert_eq!((found.id, found.name), (ours, name));
    assert_eq!(
        p.find_shared(&[], "  ").unwrap_err().kind,
        ErrorKind::InvalidRequest
    );
}
