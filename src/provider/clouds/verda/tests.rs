//! Unit tests of the Verda adapter's mapping and credential lookup.

use std::path::{Path, PathBuf};

use super::api::Gpu;
use super::instances::{described, location_of};
use super::scripts::{is_script_of, sha8};
use super::*;
use crate::provider::kit::testing::ask;
use crate::provider::{InstanceStatus, Naming};

fn ty(name: &str, model: &str, gpus: u32, price: f64, spot: f64) -> InstanceType {
    InstanceType {
        instance_type: name.into(),
        price_per_hour: Some(price),
        spot_price: Some(spot),
        gpu: Gpu {
            description: format!("{gpus}x {model} SXM5 80GB"),
            number_of_gpus: gpus,
        },
        model: model.into(),
        currency: "usd".into(),
        ..InstanceType::default()
    }
}

fn avail(loc: &str, types: &[&str]) -> LocationAvailability {
    LocationAvailability {
        location_code: loc.into(),
        availabilities: types.iter().map(|t| (*t).into()).collect(),
    }
}

#[test]
fn offers_join_types_and_availability_per_location() {
    let types = vec![
        ty("8H100.80S.176V", "H100", 8, 19.92, 6.97),
        ty("1H100.80S.22V", "H100", 1, 2.49, 0.87),
        ty("CPU.4V.16G", "", 0, 0.03, 0.01),
    ];
    let av = vec![
        avail("FIN-01", &["8H100.80S.176V", "CPU.4V.16G"]),
        avail("FIN-02", &["1H100.80S.22V"]),
        avail("ICE-01", &["8H100.80S.176V", "gone-type"]),
    ];
    let o = offers_for(&types, &av, &ask(Some("h100"), 8, &[]));
    let ids: Vec<&str> = o.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(
        ids,
        ["verda/FIN-01/8H100.80S.176V", "verda/ICE-01/8H100.80S.176V"]
    );
    assert_eq!(o[0].price_per_hour, 19.92, "USD per hour for the instance");
    assert_eq!(
        (o[0].gpu.as_deref(), o[0].gpu_count, o[0].spot),
        (Some("H100"), 8, false)
    );
    let o = offers_for(&types, &av, &ask(Some("H100"), 8, &["FIN-0"]));
    assert!(o.is_empty(), "location codes match exactly");
    let mut spot = ask(Some("H100"), 8, &["ICE-01"]);
    spot.spot = true;
    let o = offers_for(&types, &av, &spot);
    assert_eq!(o[0].id, "verda/ICE-01/8H100.80S.176V/spot");
    assert_eq!((o[0].price_per_hour, o[0].spot), (6.97, true));
    let mut eur = ty("8H100.80S.176V", "H100", 8, 18.0, 6.0);
    eur.currency = "eur".into();
    assert!(
        offers_for(&[eur], &av, &ask(Some("H100"), 8, &[])).is_empty(),
        "USD only"
    );
}

#[test]
fn statuses_and_the_late_capacity_refusal() {
    let inst = |status: &str| Instance {
        id: "i-1".into(),
        instance_type: "8H100.80S.176V".into(),
        status: status.into(),
        location: Some("FIN-01".into()),
        ..Instance::default()
    };
    assert_eq!(
        status_of(&inst("provisioning")),
        Some(InstanceStatus::Pending)
    );
    assert_eq!(status_of(&inst("ordered")), Some(InstanceStatus::Pending));
    assert_eq!(status_of(&inst("running")), Some(InstanceStatus::Running));
    assert_eq!(status_of(&inst("offline")), Some(InstanceStatus::Stopped));
    assert_eq!(
        status_of(&inst("deleting")),
        Some(InstanceStatus::Terminating)
    );
    assert_eq!(status_of(&inst("discontinued")), None);
    assert!(matches!(
        status_of(&inst("error")),
        Some(InstanceStatus::Failed(_))
    ));
    assert!(matches!(
        status_of(&inst("weird")),
        Some(InstanceStatus::Failed(_))
    ));
    match status_of(&inst("no_capacity")) {
        Some(InstanceStatus::Refused(e)) => {
            assert_eq!(e.kind, ErrorKind::Capacity);
            assert!(
                e.msg.contains("FIN-01") && e.msg.contains("8H100"),
                "{}",
                e.msg
            );
        }
        other => panic!("{other:?}"),
    }
    let mut i = inst("running");
    i.ip = Some("127.0.0.5".into());
    let ep = seen_at(&i, "FIN-01").unwrap().ssh.unwrap();
    assert_eq!(ep.to_string(), "root@127.0.0.5:22");
    i.location = None;
    assert_eq!(location_of(&i), "FIN-03", "the SDKs' default");
}

#[test]
fn listing_shows_the_described_identity_hostname_and_type_in_the_location_only() {
    let l = Lineage::parse("0f0e0d0c-1111-4222-8333-444455556666").unwrap();
    let inst = |location: &str, description: String| Instance {
        id: "i-1".into(),
        instance_type: "1H100.80S.30V".into(),
        hostname: "gpuprov-trainer-0f0e0d0c".into(),
        description,
        status: "running".into(),
        location: Some(location.into()),
        created_at: Some("2026-11-30T20:00:00Z".into()),
        ..Instance::default()
    };
    let seen = seen_at(
        &inst("FIN-01", identity_description("trainer", &l)),
        "FIN-01",
    )
    .unwrap();
    assert_eq!(seen.identity.vm.as_deref(), Some("trainer"));
    assert_eq!(seen.identity.lineage.as_deref(), Some(l.as_str()));
    assert_eq!(
        seen.identity.name.as_deref(),
        Some("gpuprov-trainer-0f0e0d0c")
    );
    assert_eq!(seen.identity.naming, Naming::Object);
    assert_eq!(seen.instance_type.as_deref(), Some("1H100.80S.30V"));
    assert!(seen.created_at.is_some());
    assert_eq!(seen.price_per_hour, None, "the listing names no currency");
    assert_eq!(
        seen_at(
            &inst("FIN-011", identity_description("trainer", &l)),
            "FIN-01"
        ),
        None,
        "location codes compare whole"
    );
    let free = seen_at(&inst("FIN-01", "my own box".into()), "FIN-01").unwrap();
    assert_eq!((free.identity.vm, free.identity.lineage), (None, None));
    let mut gone = inst("FIN-01", String::new());
    gone.status = "discontinued".into();
    assert_eq!(seen_at(&gone, "FIN-01"), None);
}

#[test]
fn identity_is_described_and_scripts_are_named_per_location() {
    let l = Lineage::parse("0f0e0d0c-1111-4222-8333-444455556666").unwrap();
    let d = identity_description("trainer", &l);
    assert_eq!(
        d,
        "gpuprov-vm-name=trainer gpuprov-lineage=0f0e0d0c-1111-4222-8333-444455556666"
    );
    assert_eq!(described(&d, IDENTITY_LABEL), Some("trainer"));
    assert_eq!(described(&d, LINEAGE_LABEL), Some(l.as_str()));
    assert_eq!(described("free text", IDENTITY_LABEL), None);
    let located = located_name("trainer", &l, "FIN-01");
    assert!(is_script_of(&format!("{located}-{}", sha8("x")), &located));
    assert!(!is_script_of(&format!("{located}-nothex!!"), &located));
    assert!(!is_script_of(
        &format!("{located}x-{}", sha8("x")),
        &located
    ));
    assert_eq!(id_of(&json!("  abc-1 ")).as_deref(), Some("abc-1"));
    assert_eq!(
        id_of(&json!({"id": "abc-2", "status": "ordered"})).as_deref(),
        Some("abc-2")
    );
    assert_eq!(id_of(&json!(42)), None);
}

#[test]
fn credentials_come_from_the_environment_then_the_cli_profile() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("credentials");
    std::fs::write(
        &file,
        "[default]\nverda_base_url = https://api.verda.com/v1\nverda_client_id = id-file\n\
         verda_client_secret = secret-file\n\n[staging]\nverda_client_id = id-stg\n\
         verda_client_secret = secret-stg\n",
    )
    .unwrap();
    let (c, place) = find_client(
        Some("id-env".into()),
        Some("secret-env".into()),
        Some(&file),
        "default",
    );
    let (id, secret) = c.unwrap();
    assert_eq!((id.as_str(), secret.expose()), ("id-env", "secret-env"));
    assert_eq!(
        place,
        "the VERDA_CLIENT_ID and VERDA_CLIENT_SECRET environment variables"
    );
    // A secret without an id is not a credential: the file's profile is read.
    let (c, place) = find_client(None, Some("secret-env".into()), Some(&file), "staging");
    let (id, secret) = c.unwrap();
    assert_eq!((id.as_str(), secret.expose()), ("id-stg", "secret-stg"));
    assert!(place.ends_with("credentials (profile staging)"), "{place}");
    let (c, place) = find_client(None, None, Some(&file), "prod");
    assert!(c.is_none());
    assert!(
        place.contains("VERDA_CLIENT_SECRET") && place.contains("(profile prod)"),
        "{place}"
    );
    assert!(!place.contains("secret-"), "{place}");
    assert_eq!(client_from_credentials_file("not = [ini", "default"), None);
    assert_eq!(
        credentials_file(None, None, Some(Path::new("/home/u"))),
        Some(PathBuf::from("/home/u/.verda/credentials"))
    );
    assert_eq!(
        credentials_file(None, Some("/v".into()), Some(Path::new("/home/u"))),
        Some(PathBuf::from("/v/credentials"))
    );
    assert_eq!(
        credentials_file(Some("/x/creds".into()), Some("/v".into()), None),
        Some(PathBuf::from("/x/creds"))
    );
}

#[test]
fn debug_never_shows_the_secret() {
    let s = VerdaSettings {
        endpoint: None,
        client: Some(("id".into(), Secret::new("secret_sentinel"))),
        key_source: "x".into(),
        lineage: Lineage::random(),
    };
    let p = VerdaProvider::new(s.clone());
    let shown = format!("{s:?} {:?}", p.api);
    assert!(!shown.contains("secret_sentinel"), "{shown}");
}
