//! Unit tests of the DigitalOcean adapter's mapping.

use super::api::{DropletRegion, GpuInfo, NetworkV4, Networks};
use super::droplets::status_of;
use super::*;
use crate::provider::kit::testing::ask;
use crate::provider::kit::{Credential, CredentialReport};
use crate::provider::{InstanceStatus, Naming};

/// [`offers_for`] in the core's order (`vm::offers::order`).
fn planned(sizes: &[Size], regions: &[Region], req: &ResourceRequest) -> Vec<Offer> {
    let mut o = offers_for(sizes, regions, req);
    crate::provider::offers::order(&mut o, req, &Capabilities::default());
    o
}

fn size(slug: &str, gpu: Option<(&str, u32)>, price: f64, regions: &[&str]) -> Size {
    Size {
        slug: slug.into(),
        memory: 8192,
        vcpus: 4,
        disk: 100,
        price_hourly: price,
        regions: regions.iter().map(|r| r.to_string()).collect(),
        available: true,
        description: String::new(),
        gpu_info: gpu.map(|(m, c)| GpuInfo {
            count: c,
            model: m.into(),
            vram: None,
        }),
    }
}

fn region(slug: &str, available: bool) -> Region {
    Region {
        slug: slug.into(),
        available,
    }
}

#[test]
fn gpu_models_drop_the_vendor_prefix() {
    assert_eq!(gpu_model("nvidia_h100", 1).as_deref(), Some("H100"));
    assert_eq!(gpu_model("amd_mi300x", 8).as_deref(), Some("MI300X"));
    assert_eq!(
        gpu_model("nvidia_rtx_4000_ada", 1).as_deref(),
        Some("RTX 4000 ADA")
    );
    assert_eq!(gpu_model("nvidia_h100", 0), None);
}

#[test]
fn offers_filter_by_model_count_availability_and_exact_region() {
    let sizes = vec![
        size(
            "gpu-h100x1-80gb",
            Some(("nvidia_h100", 1)),
            3.39,
            &["tor1", "nyc2"],
        ),
        size(
            "gpu-h100x8-640gb",
            Some(("nvidia_h100", 8)),
            23.92,
            &["tor1"],
        ),
        size(
            "gpu-mi300x1-192gb",
            Some(("amd_mi300x", 1)),
            1.99,
            &["tor1"],
        ),
        size("s-2vcpu-4gb", None, 0.03, &["tor1", "nyc2"]),
    ];
    let regions = vec![
        region("tor1", true),
        region("nyc2", true),
        region("nyc3", false),
    ];
    let ids = |o: Vec<Offer>| o.into_iter().map(|o| o.id).collect::<Vec<_>>();
    assert_eq!(
        ids(planned(
            &sizes,
            &regions,
            &ask(Some("h100"), 1, &["nyc2", "tor1"])
        )),
        [
            "digitalocean/nyc2/gpu-h100x1-80gb",
            "digitalocean/tor1/gpu-h100x1-80gb"
        ]
    );
    assert_eq!(
        ids(offers_for(
            &sizes,
            &regions,
            &ask(Some("nvidia_h100"), 8, &[])
        )),
        ["digitalocean/tor1/gpu-h100x8-640gb"]
    );
    assert!(offers_for(&sizes, &regions, &ask(Some("H100"), 1, &["nyc"])).is_empty());
    assert!(offers_for(&sizes, &regions, &ask(Some("H100"), 1, &["tor"])).is_empty());
    // Any GPU, any count: cheapest first.
    let o = planned(&sizes, &regions, &ask(None, 1, &["tor1"]));
    assert_eq!(o[0].instance_type, "gpu-mi300x1-192gb");
    assert_eq!(o[0].gpu.as_deref(), Some("MI300X"));
    // CPU-only asks take only sizes without GPUs.
    let o = offers_for(&sizes, &regions, &ask(None, 0, &[]));
    assert!(o.iter().all(|o| o.gpu.is_none()), "{o:?}");
    assert_eq!(o.len(), 2);
    // A region that takes no droplets, or a size that is unavailable: no offer.
    let mut sizes2 = sizes.clone();
    sizes2[0].regions.push("nyc3".into());
    assert!(offers_for(&sizes2, &regions, &ask(Some("H100"), 1, &["nyc3"])).is_empty());
    sizes2[0].available = false;
    assert!(offers_for(&sizes2, &regions, &ask(Some("H100"), 1, &[])).is_empty());
}

#[test]
fn statuses_map() {
    assert_eq!(status_of("new"), InstanceStatus::Pending);
    assert_eq!(status_of("active"), InstanceStatus::Running);
    assert_eq!(status_of("off"), InstanceStatus::Stopped);
    assert!(matches!(status_of("archive"), InstanceStatus::Failed(_)));
    assert!(matches!(status_of("weird"), InstanceStatus::Failed(_)));
}

#[test]
fn listing_shows_tags_name_size_and_price_in_the_region_only() {
    let lin = "0f0e0d0c-1111-4222-8333-444455556666";
    let droplet = |region: &str, tags: &[&str]| Droplet {
        id: 7,
        status: "active".into(),
        name: Some("gpuprov-a-0f0e0d0c".into()),
        networks: Networks {
            v4: vec![NetworkV4 {
                ip_address: "192.0.2.7".into(),
                kind: "public".into(),
            }],
        },
        region: Some(DropletRegion {
            slug: region.into(),
        }),
        tags: tags.iter().map(|t| t.to_string()).collect(),
        size_slug: Some("gpu-h100x1-80gb".into()),
        created_at: Some("2026-11-30T20:00:00Z".parse().unwrap()),
        size: Some(api::DropletSize {
            price_hourly: Some(3.39),
        }),
    };
    let lineage_tag = format!("{LINEAGE_LABEL}:{lin}");
    let both = [&format!("{IDENTITY_LABEL}:a"), lineage_tag.as_str(), "fw"];
    let seen = seen_at(&droplet("nyc1", &both), "nyc1").unwrap();
    assert_eq!(seen.instance_id, "7");
    assert_eq!(seen.status, InstanceStatus::Running);
    assert_eq!(seen.identity.vm.as_deref(), Some("a"));
    assert_eq!(seen.identity.lineage.as_deref(), Some(lin));
    assert_eq!(seen.identity.name.as_deref(), Some("gpuprov-a-0f0e0d0c"));
    assert_eq!(seen.identity.naming, Naming::Object);
    assert_eq!(seen.instance_type.as_deref(), Some("gpu-h100x1-80gb"));
    assert_eq!(seen.price_per_hour, Some(3.39));
    assert!(seen.created_at.is_some());
    let ssh = seen.ssh.unwrap();
    assert_eq!((ssh.host.as_str(), ssh.port), ("192.0.2.7", SSH_PORT));
    assert_eq!(
        seen_at(&droplet("nyc13", &both), "nyc1"),
        None,
        "region slugs compare whole"
    );
    let untagged = seen_at(&droplet("nyc1", &["fw"]), "nyc1").unwrap();
    assert_eq!(
        (untagged.identity.vm, untagged.identity.lineage),
        (None, None),
        "a tag that is not `<label>:` shows no identity"
    );
}

#[test]
fn tags_and_names_fit_digitaloceans_charsets() {
    let lin = Lineage::parse("0f0e0d0c-1111-4222-8333-444455556666").unwrap();
    let lin = &lin;
    for t in [
        DigitalOceanProvider::identity_tag("trainer-2"),
        DigitalOceanProvider::lineage_tag(lin),
        DigitalOceanProvider::firewall_name("trainer-2", lin, "tor1"),
    ] {
        assert!(is_valid_tag(&t), "{t}");
    }
    assert!(!is_valid_tag("gpuprov-vm-name=trainer"));
    assert!(!is_valid_tag(""));
    assert_eq!(
        DigitalOceanProvider::firewall_name("a", lin, "nyc2"),
        "gpuprov-a-0f0e0d0c-nyc2"
    );
}

#[test]
fn default_images() {
    assert_eq!(default_image(Some("nvidia_h100"), 1), "gpu-h100x1-base");
    assert_eq!(default_image(Some("nvidia_h100"), 8), "gpu-h100x8-base");
    assert_eq!(default_image(Some("amd_mi300x"), 8), "gpu-amd-base");
    assert_eq!(default_image(None, 0), DEFAULT_IMAGE);
}

#[test]
fn tokens_come_from_env_then_doctl_config() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(&cfg, "access-token: dop_v1_file\ncontext: default\n").unwrap();
    let files = vec![dir.path().join("missing.yaml"), cfg.clone()];
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    };
    let token = |c: Option<Credential>| c.map(|c| (c.secret, c.source.to_string()));
    let (t, _) = find_token(
        env(&[(TOKEN_ENV, "dop_v1_a"), (ACCESS_TOKEN_ENV, "dop_v1_b")]),
        &files,
    );
    assert_eq!(
        token(t),
        Some((
            Token::new("dop_v1_a"),
            "the DIGITALOCEAN_TOKEN environment variable".to_string()
        ))
    );
    let (t, _) = find_token(
        env(&[(TOKEN_ENV, " "), (ACCESS_TOKEN_ENV, "dop_v1_b")]),
        &files,
    );
    assert_eq!(token(t).map(|t| t.0), Some(Token::new("dop_v1_b")));
    let (t, _) = find_token(env(&[]), &files);
    assert_eq!(
        token(t),
        Some((Token::new("dop_v1_file"), cfg.display().to_string()))
    );
    let (t, looked) = find_token(env(&[]), &files[..1]);
    let looked = looked.join(", ");
    assert_eq!(t, None);
    assert!(looked.contains("DIGITALOCEAN_TOKEN"), "{looked}");
    assert!(looked.contains("DIGITALOCEAN_ACCESS_TOKEN"), "{looked}");
    assert!(looked.contains("missing.yaml"), "{looked}");
}

#[test]
fn doctl_contexts_pick_their_token() {
    let text = "access-token: dop_v1_default\nauth-contexts:\n  work: \"dop_v1_work\"\n  home: dop_v1_home\ncontext: work\noutput: text\n";
    assert_eq!(
        token_from_doctl_config(text).as_deref(),
        Some("dop_v1_work")
    );
    let text = "access-token: \"\"\ncontext: default\n";
    assert_eq!(token_from_doctl_config(text), None);
    assert_eq!(
        token_from_doctl_config("access-token: 'x'\n").as_deref(),
        Some("x")
    );
    assert_eq!(
        token_from_doctl_config("context: gone\naccess-token: x\n"),
        None
    );
}

#[tokio::test]
async fn the_token_is_never_shown() {
    let (token, _) = find_token(|_| Some("dop_v1_secret_sentinel".into()), &[]);
    let p = DigitalOceanProvider::new(DigitalOceanSettings {
        endpoint: None,
        token: token.map(|c| c.secret),
        token_source: "test".into(),
        lineage: Lineage::random(),
    });
    let report = p.credentials().await;
    assert_eq!(report, CredentialReport::Found("test".into()));
    let shown = format!("{:?} {:?} {report:?}", p.settings(), p.api);
    assert!(!shown.contains("dop_v1_secret_sentinel"), "{shown}");
}
