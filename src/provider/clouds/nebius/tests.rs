//! Unit tests of the Nebius adapter's pure parts: endpoints, names and keys, statuses
//! and what the listing shows.

use super::*;

#[test]
fn every_service_has_its_endpoint_and_an_override_serves_all() {
    let with = |endpoint: Option<&str>| {
        NebiusProvider::new(NebiusSettings {
            lineage: Lineage::random(),
            endpoint: endpoint.map(str::to_string),
            projects: BTreeMap::new(),
            credential: None,
            looked_in: vec![],
            unusable: None,
        })
    };
    let p = with(None);
    assert_eq!(
        p.url(Service::Compute),
        "https://compute.api.nebius.cloud:443"
    );
    assert_eq!(
        p.url(Service::Tokens),
        "https://tokens.iam.api.nebius.cloud:443"
    );
    assert_eq!(p.endpoint_override(), None);
    let p = with(Some("http://127.0.0.1:7000"));
    assert_eq!(p.url(Service::Vpc), "http://127.0.0.1:7000");
    assert_eq!(
        p.endpoint_override().as_deref(),
        Some("http://127.0.0.1:7000")
    );
    let p = with(Some("https://{service}.proxy.example:8443"));
    assert_eq!(p.url(Service::Vpc), "https://vpc.proxy.example:8443");
}

#[test]
fn names_and_keys_are_per_attempt() {
    let l = Lineage::parse("0f0e0d0c-0b0a-4908-8706-050403020100").unwrap();
    let a = instance_name("trainer", &l, "tok-1");
    assert!(a.starts_with("gpuprov-trainer-0f0e0d0c-"), "{a}");
    assert_eq!(a, instance_name("trainer", &l, "tok-1"));
    assert_ne!(a, instance_name("trainer", &l, "tok-2"));
    let k = idempotency_key("tok-1");
    assert_eq!(k, idempotency_key("tok-1"));
    assert_ne!(k, idempotency_key("tok-2"));
    assert!(uuid::Uuid::parse_str(&k).is_ok());
}

#[test]
fn statuses_never_read_an_unknown_state_as_gone() {
    use compute::instance_status::InstanceState as S;
    let with = |state: S, ip: &str| compute::Instance {
        status: Some(compute::InstanceStatus {
            state: state as i32,
            network_interfaces: vec![compute::NetworkInterfaceStatus {
                public_ip_address: Some(compute::PublicIpAddressStatus {
                    address: ip.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let preemptible = compute::Instance {
        spec: Some(compute::InstanceSpec {
            preemptible: Some(compute::PreemptibleSpec::default()),
            ..Default::default()
        }),
        ..with(S::Stopped, "")
    };
    assert!(matches!(
        status_of(&preemptible).0,
        InstanceStatus::Preempted { stopped: true, .. }
    ));
    assert_eq!(status_of(&with(S::Stopped, "")).0, InstanceStatus::Stopped);
    let (s, ssh) = status_of(&with(S::Running, "203.0.113.7/32"));
    assert_eq!(s, InstanceStatus::Running);
    assert_eq!(ssh.unwrap().to_string(), "ubuntu@203.0.113.7:22");
    assert_eq!(status_of(&with(S::Creating, "")).0, InstanceStatus::Pending);
    assert_eq!(
        status_of(&with(S::Unspecified, "")).0,
        InstanceStatus::Pending
    );
    assert_eq!(
        status_of(&with(S::Deleting, "")).0,
        InstanceStatus::Terminating
    );
    assert!(matches!(
        status_of(&with(S::Error, "")).0,
        InstanceStatus::Failed(_)
    ));
    let mut odd = with(S::Running, "");
    odd.status.as_mut().unwrap().state = 99;
    assert_eq!(status_of(&odd).0, InstanceStatus::Pending);
    assert!(
        status_of(&with(S::Running, "")).1.is_none(),
        "no address yet"
    );
}

#[test]
fn the_listing_shows_labels_name_type_price_and_creation_time() {
    let l = Lineage::parse("0f0e0d0c-0b0a-4908-8706-050403020100").unwrap();
    let i = compute::Instance {
        metadata: Some(common::ResourceMetadata {
            id: "computeinstance-e00a".into(),
            name: instance_name("trainer", &l, "tok-1"),
            labels: labels("trainer", &l),
            created_at: Some(prost_types::Timestamp {
                seconds: 1_764_698_400,
                nanos: 0,
            }),
            ..Default::default()
        }),
        spec: Some(compute::InstanceSpec {
            resources: Some(compute::ResourcesSpec {
                platform: "gpu-h100-sxm".into(),
                size: Some(compute::resources_spec::Size::Preset(
                    "8gpu-128vcpu-1600gb".into(),
                )),
            }),
            preemptible: Some(compute::PreemptibleSpec::default()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let s = seen(&i);
    assert_eq!(s.instance_id, "computeinstance-e00a");
    assert_eq!(
        (s.identity.vm.as_deref(), s.identity.lineage.as_deref()),
        (Some("trainer"), Some(l.as_str()))
    );
    assert_eq!(s.identity.name, Some(instance_name("trainer", &l, "tok-1")));
    assert_eq!(
        owner(&s.identity, &l, "eu-north1").as_deref(),
        Some("trainer")
    );
    assert_eq!(
        s.instance_type.as_deref(),
        Some("gpu-h100-sxm/8gpu-128vcpu-1600gb")
    );
    let h100 = catalog::platform("gpu-h100-sxm").unwrap();
    assert_eq!(s.price_per_hour, Some(h100.price(8, true)));
    assert_eq!(
        s.created_at.map(|t| t.to_rfc3339()).as_deref(),
        Some("2025-12-02T18:00:00+00:00")
    );
    let other = Lineage::random();
    assert_eq!(owner(&s.identity, &other, "eu-north1"), None);
}
