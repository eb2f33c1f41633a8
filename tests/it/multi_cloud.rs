//! `examples/multi-cloud.toml` planned against local fakes of every REST cloud of this
//! build (issue 4): one spec-checked server per cloud (`tests/it/support/spec.rs`) serving a
//! catalog (Lambda instance types, RunPod GPU catalog with stock, Hyperstack flavors +
//! stocks + pricebook, DigitalOcean sizes + regions, GCP's accelerator types behind its
//! token endpoint, `vendor::gcp`) whose every request and response is
//! validated against the vendor's OpenAPI description, and the real `gpuprov` binary run
//! on a copy of the example with each cloud's endpoint and a distinct sentinel credential.
//! Massed Compute, Verda (its OAuth2 token endpoint included) and Prime Intellect are the
//! spec-checked fakes of their `vendor` modules, seeded with a small catalog.
//! AWS plans from its offline catalog (no network); it gets dummy static credentials and
//! no instance metadata all the same. Only catalog reads (and the instance listings of
//! discovery by identity, empty) are answered: any other request (a key listing, a
//! create) is a violation `verify()` reports.

use crate::support::spec;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;

use serde_json::{json, Value};
use spec::{Canned, Seen, SpecServer};

use crate::vendor::gcp as gcp_api;
use crate::vendor::nebius as nebius_api;
use crate::vendor::{massedcompute as mc, primeintellect as pi, verda};

const LAMBDA_KEY: &str = "lambda_sentinel_key_5d1e0a";
const RUNPOD_KEY: &str = "rpa_runpod_sentinel_key_8b2f1c";
const HYPERSTACK_KEY: &str = "hyperstack_sentinel_key_3c7a2d";
const DO_TOKEN: &str = "dop_v1_do_sentinel_token_9e4d3e";
const AWS_SECRET: &str = "aws_sentinel_secret_6f0b4f";
/// The GCP service-account key file, relative to the project directory (the binary runs
/// there); its access tokens carry `gcp_api::SENTINEL`.
const GCP_KEY_FILE: &str = "gcp-sa.json";
/// The Nebius service account's credentials file, relative to the project directory; the
/// IAM tokens its exchange issues carry `nebius_api::SENTINEL`.
const NEBIUS_KEY_FILE: &str = "nebius-sa.json";
const SENTINELS: &[&str] = &[
    LAMBDA_KEY,
    RUNPOD_KEY,
    HYPERSTACK_KEY,
    DO_TOKEN,
    AWS_SECRET,
    gcp_api::SENTINEL,
    nebius_api::SENTINEL,
    mc::SENTINEL,
    verda::SENTINEL,
    pi::SENTINEL,
];

const RUNPOD_H100: &str = "NVIDIA H100 80GB HBM3";

// ---- Lambda: GET /api/v1/instance-types ----

fn lambda_region(name: &str) -> Value {
    json!({"name": name, "description": format!("{name} test region")})
}

/// One `instance-types` entry: (name, gpu description, gpus, cents per hour, regions with
/// capacity), in the shape of `tests/it/vendor/lambda.rs`.
fn lambda_type(name: &str, desc: &str, gpus: u32, cents: i64, regions: &[&str]) -> (String, Value) {
    (
        name.to_string(),
        json!({
            "instance_type": {
                "name": name,
                "description": format!("{gpus}x {desc}"),
                "gpu_description": desc,
                "price_cents_per_hour": cents,
                "specs": {"vcpus": 26 * gpus, "memory_gib": 225 * gpus, "storage_gib": 2750 * gpus, "gpus": gpus}
            },
            "regions_with_capacity_available": regions.iter().map(|r| lambda_region(r)).collect::<Vec<_>>(),
        }),
    )
}

/// 8 × H100 SXM at $23.92/h with capacity in us-east-1, us-west-1 and us-south-1; 1 × H100
/// PCIe at $2.49/h in us-east-1; 1 × A10. No L40S: Lambda sells none.
fn lambda_catalog() -> Value {
    let types: serde_json::Map<String, Value> = [
        lambda_type(
            "gpu_8x_h100_sxm5",
            "H100 (80 GB SXM5)",
            8,
            2392,
            &["us-west-1", "us-east-1", "us-south-1"],
        ),
        lambda_type(
            "gpu_1x_h100_pcie",
            "H100 (80 GB PCIe)",
            1,
            249,
            &["us-east-1"],
        ),
        lambda_type("gpu_1x_a10", "A10 (24 GB PCIe)", 1, 75, &["us-east-1"]),
    ]
    .into_iter()
    .collect();
    json!({ "data": types })
}

// ---- RunPod: GET /v2/catalog/gpus?include=AVAILABILITY&product=POD&count=N&cloud=TIER ----

/// A GPU type of the fake catalog: id, name, USD per GPU-hour (secure, community), largest
/// machine (secure, community), data centres with stock per tier.
struct RunpodGpu {
    id: &'static str,
    name: &'static str,
    price: (f64, f64),
    max: (u32, u32),
    secure: &'static [&'static str],
    community: &'static [&'static str],
}

/// H100 SXM ($2.99 secure / $2.69 community per GPU, stock in US-KS-2 and EU-RO-1 secure,
/// EU-RO-1 community); H100 NVL ($3.39 per GPU, secure stock in US-TX-3: 8 of them are
/// above the trainer's cap); L40S ($0.86 / $0.79, secure stock in EU-RO-1 and US-TX-3,
/// community in CA-MTL-1).
const RUNPOD_GPUS: &[RunpodGpu] = &[
    RunpodGpu {
        id: RUNPOD_H100,
        name: "H100 SXM",
        price: (2.99, 2.69),
        max: (8, 8),
        secure: &["US-KS-2", "EU-RO-1"],
        community: &["EU-RO-1"],
    },
    RunpodGpu {
        id: "NVIDIA H100 NVL",
        name: "H100 NVL",
        price: (3.39, 0.0),
        max: (8, 0),
        secure: &["US-TX-3"],
        community: &[],
    },
    RunpodGpu {
        id: "NVIDIA L40S",
        name: "L40S",
        price: (0.86, 0.79),
        max: (8, 8),
        secure: &["EU-RO-1", "US-TX-3"],
        community: &["CA-MTL-1"],
    },
];

fn query<'a>(req: &'a Seen, k: &str) -> Option<&'a str> {
    req.query
        .iter()
        .find(|(n, _)| n == k)
        .map(|(_, v)| v.as_str())
}

/// The catalog as `tests/it/vendor/runpod.rs` serves it, with the prose rules the spec cannot
/// carry (`include=AVAILABILITY` requires `product`; `count`/`cloud` only with it).
fn runpod_catalog(req: &Seen) -> Canned {
    let include = query(req, "include") == Some("AVAILABILITY");
    if (include && query(req, "product").is_none())
        || (!include
            && ["product", "count", "cloud"]
                .iter()
                .any(|k| query(req, k).is_some()))
    {
        return Canned::status(
            400,
            json!({"title": "Bad Request", "status": 400, "detail": "include=AVAILABILITY requires product, and vice versa"}),
        );
    }
    let tier = query(req, "cloud").unwrap_or("SECURE");
    let count: u32 = query(req, "count")
        .and_then(|c| c.parse().ok())
        .unwrap_or(1);
    let gpus: Vec<Value> = RUNPOD_GPUS
        .iter()
        .map(|g| {
            let mut v = json!({
                "id": g.id,
                "name": g.name,
                "pool": null,
                "manufacturer": "NVIDIA",
                "memory": 80,
                "secure": g.max.0 > 0,
                "community": g.max.1 > 0,
                "price": {"secure": g.price.0, "community": g.price.1},
                "maxCount": {"secure": g.max.0, "community": g.max.1},
            });
            if include {
                let (max, dcs) = if tier == "SECURE" {
                    (g.max.0, g.secure)
                } else {
                    (g.max.1, g.community)
                };
                let dcs: Vec<Value> = if count <= max {
                    dcs.iter()
                        .map(|d| json!({"id": d, "name": format!("{d} test"), "availability": "HIGH"}))
                        .collect()
                } else {
                    vec![]
                };
                v["availability"] = json!(if dcs.is_empty() { "NONE" } else { "HIGH" });
                if !dcs.is_empty() {
                    v["dataCenters"] = json!(dcs);
                }
            }
            v
        })
        .collect();
    Canned::ok(json!({ "gpus": gpus }))
}

// ---- Hyperstack: GET /v1/core/flavors[?region=], /v1/core/stocks, /v1/pricebook ----

/// (region, flavor, GPU model, GPU count, stock of that configuration in the region).
/// NORWAY-1's 8 × H100 is out of stock; L40 is not L40S.
const HYPERSTACK_FLAVORS: &[(&str, &str, &str, u32, i64)] = &[
    ("CANADA-1", "n3-H100x8", "H100-80G-PCIe", 8, 2),
    ("CANADA-1", "n3-H100x1", "H100-80G-PCIe", 1, 4),
    ("CANADA-1", "n3-L40x1", "L40", 1, 6),
    ("US-1", "n3-H100-SXM5x8", "H100-80G-SXM5", 8, 1),
    ("NORWAY-1", "n3-H100x8", "H100-80G-PCIe", 8, 0),
];

/// USD per GPU-hour by GPU model.
const HYPERSTACK_PRICES: &[(&str, f64)] = &[
    ("H100-80G-PCIe", 1.90),
    ("H100-80G-SXM5", 2.40),
    ("L40", 1.00),
];

/// Flavors in groups per (region, GPU), as `tests/it/vendor/hyperstack.rs` serves them; a region
/// the organisation does not have yields no groups.
fn hyperstack_flavors(req: &Seen) -> Canned {
    let region = query(req, "region");
    let mut groups: BTreeMap<(&str, &str), Vec<Value>> = BTreeMap::new();
    for (i, (r, name, gpu, n, stock)) in HYPERSTACK_FLAVORS.iter().enumerate() {
        if region.is_some_and(|q| q != *r) {
            continue;
        }
        groups.entry((r, gpu)).or_default().push(json!({
            "id": i + 1, "name": name, "display_name": name, "region_name": r,
            "cpu": 28 * n, "ram": 180.0 * *n as f64, "disk": 100, "ephemeral": 750 * n,
            "gpu": gpu, "gpu_count": n, "stock_available": *stock > 0,
            "created_at": "2026-01-01T00:00:00Z", "labels": [], "features": {}
        }));
    }
    let data: Vec<Value> = groups
        .into_iter()
        .map(|((r, gpu), flavors)| json!({"gpu": gpu, "region_name": r, "flavors": flavors}))
        .collect();
    Canned::ok(json!({"status": true, "message": "Success", "data": data}))
}

fn hyperstack_stocks() -> Canned {
    let mut by_region: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
    for (r, _, gpu, n, stock) in HYPERSTACK_FLAVORS {
        let mut c = json!({"1x": 0, "2x": 0, "4x": 0, "8x": 0, "10x": 0});
        c[format!("{n}x")] = json!(stock);
        by_region.entry(r).or_default().push(json!({
            "model": gpu, "available": stock.to_string(),
            "planned_7_days": "0", "planned_30_days": "0", "planned_100_days": "0",
            "configurations": c
        }));
    }
    let stocks: Vec<Value> = by_region
        .into_iter()
        .map(|(r, models)| json!({"region": r, "stock-type": "GPU", "models": models}))
        .collect();
    Canned::ok(json!({ "stocks": stocks }))
}

fn hyperstack_pricebook() -> Canned {
    let items: Vec<Value> = HYPERSTACK_PRICES
        .iter()
        .enumerate()
        .map(|(i, (n, v))| {
            json!({"id": i + 1, "name": n, "value": v, "original_value": v,
                   "discount_applied": false, "start_time": "2026-01-01T00:00:00Z"})
        })
        .collect();
    Canned::ok(json!(items))
}

// ---- DigitalOcean: GET /v2/sizes, /v2/regions ----

fn do_region(slug: &str) -> Value {
    json!({
        "name": format!("{slug} test region"),
        "slug": slug,
        "features": ["backups", "ipv6", "metadata"],
        "available": true,
        "sizes": ["gpu-h100x1-80gb", "gpu-l40sx1-48gb", "s-2vcpu-4gb"]
    })
}

/// A size in the spec's `size` shape, as `tests/it/vendor/digitalocean.rs` builds it.
fn do_size(
    slug: &str,
    gpu: Option<(&str, u32)>,
    price: f64,
    regions: &[&str],
    available: bool,
) -> Value {
    let count = gpu.map(|g| g.1).unwrap_or(0);
    let mut s = json!({
        "slug": slug,
        "memory": if count > 0 { 245_760 * count } else { 4096 },
        "vcpus": if count > 0 { 20 * count } else { 2 },
        "disk": if count > 0 { 720 * count } else { 80 },
        "transfer": 15.0,
        "price_monthly": (price * 672.0 * 100.0).round() / 100.0,
        "price_hourly": price,
        "regions": regions,
        "available": available,
        "description": if count > 0 { format!("GPU - {count}X") } else { "Basic".into() },
        "disk_info": [{"type": "local", "size": {"amount": 720, "unit": "gib"}}]
    });
    if let Some((model, count)) = gpu {
        s["gpu_info"] =
            json!({"count": count, "model": model, "vram": {"amount": 48 * count, "unit": "gib"}});
    }
    s
}

/// 8 × H100 exists but is sold out everywhere (`available: false`); 1 × H100 at $3.39/h
/// in tor1 and nyc2; 1 × L40S at $1.57/h in tor1 and atl1; a CPU size.
fn do_sizes() -> Vec<Value> {
    vec![
        do_size(
            "gpu-h100x8-640gb",
            Some(("nvidia_h100", 8)),
            23.92,
            &["tor1", "nyc2"],
            false,
        ),
        do_size(
            "gpu-h100x1-80gb",
            Some(("nvidia_h100", 1)),
            3.39,
            &["tor1", "nyc2"],
            true,
        ),
        do_size(
            "gpu-l40sx1-48gb",
            Some(("nvidia_l40s", 1)),
            1.57,
            &["tor1", "atl1"],
            true,
        ),
        do_size(
            "s-2vcpu-4gb",
            None,
            0.03571,
            &["tor1", "nyc2", "atl1"],
            true,
        ),
    ]
}

fn do_regions() -> Vec<Value> {
    ["nyc2", "tor1", "atl1", "ams3"]
        .iter()
        .map(|r| do_region(r))
        .collect()
}

/// One page holding every item (the fixture is smaller than any `per_page`).
fn do_page(key: &str, items: Vec<Value>) -> Canned {
    let total = items.len();
    Canned::ok(json!({ key: items, "links": {}, "meta": {"total": total} }))
}

// ---- Massed Compute, Verda, Prime Intellect: their vendor fakes ----

/// 8 × H100 SXM5 at 2299 cents ($22.99/h) and 1 × L40S at 109 cents, placed by Massed
/// Compute (region `any`).
fn mc_world() -> mc::World {
    mc::World::new()
        .with_product("gpu_8x_h100", "8x H100 SXM5", 2299, &["us-central-3"])
        .with_product("gpu_1x_l40s", "1x L40S", 109, &["us-central-3"])
}

/// 8 × H100 at $19.92/h in FIN-01 and ICE-01; 1 × L40S at $1.29/h in FIN-02.
fn verda_world() -> verda::World {
    verda::World::default()
        .with_type("8H100.80S.176V", "H100", 8, 19.92, &["FIN-01", "ICE-01"])
        .with_type("1L40S.20V", "L40S", 1, 1.29, &["FIN-02"])
}

/// Hyperstack's 8 × H100 resold in CANADA-1 at $16/h (secure); RunPod's L40S in EU-RO-1
/// at $0.99/h (community).
fn pi_world() -> pi::World {
    pi::World::default()
        .with_config(
            "n3-H100x8",
            "H100_80GB",
            8,
            "hyperstack",
            "CANADA-1",
            false,
            16.0,
        )
        .with_config(
            "NVIDIA L40S",
            "L40S_48GB",
            1,
            "runpod",
            "EU-RO-1",
            true,
            0.99,
        )
}

// ---- the servers ----

/// A catalog read that fails, served before the normal answer.
struct Fault {
    method: &'static str,
    path: &'static str,
    canned: Canned,
}

struct Clouds {
    lambda: SpecServer,
    runpod: SpecServer,
    hyperstack: SpecServer,
    digitalocean: SpecServer,
    massedcompute: mc::Fake,
    verda: verda::Fake,
    primeintellect: pi::Fake,
    gcp: gcp_api::Fake,
    nebius: nebius_api::Fake,
}

/// The Nebius tenant: the example's project in eu-north1, listing H100 (1 and 8 GPUs).
fn nebius_world() -> nebius_api::World {
    nebius_api::World::default().with_project(
        "eu-north1",
        "project-e00example",
        vec![nebius_api::platform(
            nebius_api::H100,
            &[(nebius_api::PRESET1, 1), (nebius_api::PRESET8, 8)],
        )],
    )
}

/// The GCP project: L4 in two zones of us-central1 and one of us-east4, H100 in one zone
/// of each.
fn gcp_world() -> gcp_api::World {
    gcp_api::World::default()
        .with_zones(
            "nvidia-l4",
            &["us-central1-a", "us-central1-b", "us-east4-a"],
            true,
        )
        .with_zones(gcp_api::H100, &["us-central1-a", "us-east4-a"], true)
}

impl Clouds {
    async fn start() -> Clouds {
        Self::start_with(BTreeMap::new()).await
    }

    /// Starts the fakes; `faults` (by cloud name) are mounted first, so they answer
    /// instead of the catalog.
    async fn start_with(faults: BTreeMap<&str, Fault>) -> Clouds {
        let lambda = SpecServer::start(Arc::new(spec::lambda())).await;
        let runpod = SpecServer::start(Arc::new(spec::runpod())).await;
        let hyperstack = SpecServer::start(Arc::new(spec::hyperstack())).await;
        let digitalocean = SpecServer::start(Arc::new(spec::digitalocean())).await;
        let gcp = gcp_api::Fake::start(gcp_world()).await;
        let nebius = nebius_api::Fake::start(nebius_world());
        let (mut mcw, mut vw, mut piw) = (mc_world(), verda_world(), pi_world());
        for (cloud, f) in faults {
            let server = match cloud {
                "lambda" => &lambda,
                "runpod" => &runpod,
                "hyperstack" => &hyperstack,
                "digitalocean" => &digitalocean,
                "massedcompute" => {
                    mcw.faults.push(f.method, f.path, f.canned);
                    continue;
                }
                "verda" => {
                    vw.faults.push(f.method, f.path, f.canned);
                    continue;
                }
                "primeintellect" => {
                    piw.faults.push(f.method, f.path, f.canned);
                    continue;
                }
                other => panic!("no fake for {other}"),
            };
            server.mount(f.method, f.path, f.canned, None).await;
        }
        let massedcompute = mc::Fake::start(mcw).await;
        let vd = verda::Fake::start(vw).await;
        let primeintellect = pi::Fake::start(piw).await;
        lambda
            .mount_fn("GET", "^/api/v1/instance-types$", |_| {
                Canned::ok(lambda_catalog())
            })
            .await;
        runpod
            .mount_fn("GET", "^/v2/catalog/gpus$", runpod_catalog)
            .await;
        hyperstack
            .mount_fn("GET", "^/v1/core/flavors$", hyperstack_flavors)
            .await;
        hyperstack
            .mount_fn("GET", "^/v1/core/stocks$", |_| hyperstack_stocks())
            .await;
        hyperstack
            .mount_fn("GET", "^/v1/pricebook$", |_| hyperstack_pricebook())
            .await;
        digitalocean
            .mount_fn("GET", "^/v2/sizes$", |_| do_page("sizes", do_sizes()))
            .await;
        digitalocean
            .mount_fn("GET", "^/v2/regions$", |_| do_page("regions", do_regions()))
            .await;
        // Discovery by identity (plan with refresh): the account's instances, none here.
        lambda
            .mount_fn("GET", "^/api/v1/instances$", |_| {
                Canned::ok(json!({"data": []}))
            })
            .await;
        digitalocean
            .mount_fn("GET", "^/v2/droplets$", |_| do_page("droplets", vec![]))
            .await;
        runpod
            .mount_fn("GET", "^/v2/pods$", |_| Canned::ok(json!({"pods": []})))
            .await;
        hyperstack
            .mount_fn("GET", "^/v1/core/virtual-machines$", |_| {
                Canned::ok(
                    json!({"status": true, "message": "Success", "instances": [],
                                  "count": 0, "page": 1, "page_size": 100}),
                )
            })
            .await;
        Clouds {
            lambda,
            runpod,
            hyperstack,
            digitalocean,
            massedcompute,
            verda: vd,
            primeintellect,
            gcp,
            nebius,
        }
    }

    fn all(&self) -> [(&'static str, &SpecServer); 8] {
        [
            ("lambda", &self.lambda),
            ("runpod", &self.runpod),
            ("hyperstack", &self.hyperstack),
            ("digitalocean", &self.digitalocean),
            ("gcp", &self.gcp.server),
            ("massedcompute", &self.massedcompute.server),
            ("verda", &self.verda.server),
            ("primeintellect", &self.primeintellect.server),
        ]
    }

    /// `GPUPROV_<CLOUD>_ENDPOINT` for each fake (the base URLs of Hyperstack, Massed
    /// Compute and Verda carry their `servers[0].url` paths).
    fn endpoints(&self) -> Vec<(&'static str, String)> {
        vec![
            ("GPUPROV_LAMBDA_ENDPOINT", self.lambda.uri()),
            ("GPUPROV_RUNPOD_ENDPOINT", self.runpod.uri()),
            (
                "GPUPROV_HYPERSTACK_ENDPOINT",
                format!("{}/v1", self.hyperstack.uri()),
            ),
            ("GPUPROV_DIGITALOCEAN_ENDPOINT", self.digitalocean.uri()),
            ("GPUPROV_GCP_ENDPOINT", self.gcp.server.uri()),
            (
                "GPUPROV_MASSEDCOMPUTE_ENDPOINT",
                format!("{}/api/v1", self.massedcompute.server.uri()),
            ),
            (
                "GPUPROV_VERDA_ENDPOINT",
                format!("{}/v1", self.verda.server.uri()),
            ),
            (
                "GPUPROV_PRIMEINTELLECT_ENDPOINT",
                self.primeintellect.server.uri(),
            ),
            ("GPUPROV_NEBIUS_ENDPOINT", self.nebius.url.clone()),
        ]
    }

    /// Every server kept to its spec, asked only to read (no create, no key upload; Verda's
    /// token request aside), and every request carried that cloud's own credential and no
    /// other cloud's. Verda's client secret travels only in its token request's body; its
    /// API calls carry the access token instead.
    fn verify(&self, own: &[(&str, &str)]) {
        // Nebius (gRPC): only reads and token exchanges, every call with a Nebius token
        // and no other cloud's credential.
        let w = self.nebius.world.lock().unwrap();
        for call in &w.calls {
            assert!(
                call.ends_with("/List") || call.ends_with("/Exchange"),
                "nebius: plan and offers only read: {call}"
            );
        }
        for (name, value) in &w.headers {
            if name == "authorization" {
                assert!(
                    value.starts_with(&format!("Bearer {}", nebius_api::SENTINEL)),
                    "nebius: {value}"
                );
            }
            for (c, secret) in own {
                assert!(
                    *c == "nebius" || !value.contains(secret),
                    "nebius was sent {c}'s credential"
                );
            }
        }
        drop(w);
        for (cloud, server) in self.all() {
            server.verify();
            for r in server.requests() {
                let token_request = cloud == "verda" && r.path == verda::TOKEN;
                assert!(
                    r.method == "GET" || (token_request && r.method == "POST"),
                    "{cloud}: plan and offers only read: {} {}",
                    r.method,
                    r.path
                );
                let mut sent: String = r
                    .headers
                    .iter()
                    .map(|(k, v)| format!("{k}: {v}\n"))
                    .collect();
                if let Some(b) = &r.body {
                    sent.push_str(&b.to_string());
                }
                for (c, secret) in own {
                    if *c != cloud {
                        assert!(!sent.contains(secret), "{cloud} was sent {c}'s credential");
                    } else if cloud == "verda" && !token_request {
                        assert!(
                            !sent.contains(secret),
                            "verda: the secret only goes to the token endpoint"
                        );
                        assert!(
                            sent.contains("Bearer tok-"),
                            "verda: {} carried no access token",
                            r.path
                        );
                    } else {
                        assert!(
                            sent.contains(secret),
                            "{cloud}: {} carried no {cloud} credential",
                            r.path
                        );
                    }
                }
            }
        }
    }
}

/// The credential env of each cloud (GCP's names the key file).
const CREDENTIALS: &[(&str, &str, &str)] = &[
    ("lambda", "LAMBDA_API_KEY", LAMBDA_KEY),
    ("runpod", "RUNPOD_API_KEY", RUNPOD_KEY),
    ("hyperstack", "HYPERSTACK_API_KEY", HYPERSTACK_KEY),
    ("digitalocean", "DIGITALOCEAN_TOKEN", DO_TOKEN),
    ("gcp", "GOOGLE_APPLICATION_CREDENTIALS", GCP_KEY_FILE),
    ("massedcompute", "MASSED_COMPUTE_API_KEY", mc::SENTINEL),
    ("verda", "VERDA_CLIENT_SECRET", verda::SENTINEL),
    ("primeintellect", "PRIME_API_KEY", pi::SENTINEL),
    ("nebius", "GPUPROV_NEBIUS_CREDENTIALS_FILE", NEBIUS_KEY_FILE),
];

/// What each cloud's requests carry: the credential, or for GCP the access token its
/// token endpoint issued.
fn all_credentials() -> Vec<(&'static str, &'static str)> {
    CREDENTIALS
        .iter()
        .map(|(c, _, s)| match *c {
            "gcp" => (*c, gcp_api::SENTINEL),
            "nebius" => (*c, nebius_api::SENTINEL),
            _ => (*c, *s),
        })
        .collect()
}

/// A project directory holding a copy of `examples/multi-cloud.toml` as `gpuprov.toml`,
/// with `home/` (HOME: no real ~/.runpod, ~/.aws, doctl or gcloud config is read),
/// `gpuprov-home/` (GPUPROV_HOME) and the GCP service-account key of `clouds`' token
/// endpoint ([`GCP_KEY_FILE`]).
struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    fn new(clouds: &Clouds) -> Project {
        let dir = tempfile::tempdir().unwrap();
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/multi-cloud.toml");
        std::fs::copy(&example, dir.path().join("gpuprov.toml")).unwrap();
        std::fs::create_dir_all(dir.path().join("home")).unwrap();
        let key = gcp_api::sa_json(&clouds.gcp.tokens.token_uri());
        std::fs::write(dir.path().join(GCP_KEY_FILE), key).unwrap();
        let nebius = serde_json::json!({"subject-credentials": {
            "type": "JWT", "alg": "RS256", "private-key": nebius_api::KEY_PEM,
            "kid": nebius_api::KEY_ID, "iss": nebius_api::SA_ID, "sub": nebius_api::SA_ID,
        }});
        std::fs::write(dir.path().join(NEBIUS_KEY_FILE), nebius.to_string()).unwrap();
        Project { dir }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// Runs the real binary with a cleared environment: the endpoints, `credentials`
    /// (env var, value), dummy static AWS credentials and no instance metadata.
    async fn run(
        &self,
        args: &[&str],
        endpoints: &[(&'static str, String)],
        credentials: &[(&str, &str)],
    ) -> Output {
        let dir = self.path();
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let mut env: Vec<(String, String)> = endpoints
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        env.extend(
            credentials
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        let home = dir.join("home");
        env.extend([
            ("HOME".into(), home.display().to_string()),
            (
                "GPUPROV_HOME".into(),
                dir.join("gpuprov-home").display().to_string(),
            ),
            ("NO_COLOR".into(), "1".into()),
            ("AWS_EC2_METADATA_DISABLED".into(), "true".into()),
            // AWS has no local server here: its listing (discovery) goes to a closed
            // loopback port, never to the real EC2 endpoint (nor its DNS name).
            ("AWS_ENDPOINT_URL".into(), "http://127.0.0.1:9".into()),
            ("AWS_ACCESS_KEY_ID".into(), "AKIAGPUPROVTESTONLY00".into()),
            ("AWS_SECRET_ACCESS_KEY".into(), AWS_SECRET.into()),
            ("AWS_REGION".into(), "us-east-1".into()),
        ]);
        tokio::task::spawn_blocking(move || {
            assert_cmd::Command::cargo_bin("gpuprov")
                .unwrap()
                .current_dir(&dir)
                .env_clear()
                .envs(env)
                .args(&args)
                .output()
                .unwrap()
        })
        .await
        .unwrap()
    }

    /// No sentinel in any file under the project directory (config, saved plans, state,
    /// anything gpuprov wrote under its home).
    fn assert_no_secret_in_files(&self) {
        fn walk(p: &Path, out: &mut Vec<PathBuf>) {
            for e in std::fs::read_dir(p).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(&p, out);
                } else {
                    out.push(p);
                }
            }
        }
        let mut files = Vec::new();
        walk(self.dir.path(), &mut files);
        for f in files {
            let bytes = std::fs::read(&f).unwrap();
            let text = String::from_utf8_lossy(&bytes);
            for s in SENTINELS {
                assert!(!text.contains(s), "{} holds a credential", f.display());
            }
        }
    }
}

fn text(out: &Output) -> (String, String) {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !stderr.contains("in this build of gpuprov"),
        "target/debug/gpuprov is another checkout's build: the build directory is shared \
         (CARGO_TARGET_DIR) with a concurrent build of another branch; rerun alone\n{stderr}"
    );
    for s in SENTINELS {
        assert!(
            !stdout.contains(s) && !stderr.contains(s),
            "a credential was printed:\n{stdout}\n{stderr}"
        );
    }
    (stdout, stderr)
}

/// (offer id, USD per hour) of a JSON offer list (plan change offers or `offers --json`).
fn ids_prices(offers: &Value) -> Vec<(String, f64)> {
    offers
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["id"].as_str().unwrap().to_string(),
                o["price_per_hour"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// gpuprov's facts about `vm`'s change in a `plan -json` (Terraform's shape: its
/// `resource_changes[]` entry's `gpuprov` object).
fn change<'a>(plan: &'a Value, vm: &str) -> &'a Value {
    &plan["resource_changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == vm)
        .unwrap_or_else(|| panic!("no change for {vm}: {plan:#}"))["gpuprov"]
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

fn assert_offers(got: &[(String, f64)], want: &[(&str, f64)]) {
    let ids: Vec<&str> = got.iter().map(|(i, _)| i.as_str()).collect();
    let want_ids: Vec<&str> = want.iter().map(|(i, _)| *i).collect();
    assert_eq!(ids, want_ids, "offers (in apply's order)");
    for ((id, p), (_, w)) in got.iter().zip(want) {
        assert!(close(*p, *w), "{id}: ${p}/h, expected ${w}/h");
    }
}

/// The trainer's offers, in apply's order: Lambda (regions as listed: us-east-1 before
/// us-west-1; us-south-1 is not asked; 2392 cents → $23.92), then RunPod (US-KS-2 before
/// EU-RO-1 as listed, then price: community $2.69 × 8 before secure $2.99 × 8; the H100
/// NVL in US-TX-3, $3.39 × 8 = $27.12, is above the $25 cap), then Hyperstack (CANADA-1
/// PCIe $1.90 × 8, US-1 SXM5 $2.40 × 8; NORWAY-1 has no stock). DigitalOcean's 8 × H100
/// is sold out: none. Then Massed Compute, placed by the cloud (`any`, 2299 cents →
/// $22.99 for the machine), Verda in FIN-01 ($19.92; ICE-01 is not asked) and Prime
/// Intellect's resold Hyperstack pod in CANADA-1 ($16 for the pod).
const TRAINER: &[(&str, f64)] = &[
    ("lambda/us-east-1/gpu_8x_h100_sxm5", 23.92),
    ("lambda/us-west-1/gpu_8x_h100_sxm5", 23.92),
    ("runpod/US-KS-2/secure/NVIDIA H100 80GB HBM3", 23.92),
    ("runpod/EU-RO-1/community/NVIDIA H100 80GB HBM3", 21.52),
    ("runpod/EU-RO-1/secure/NVIDIA H100 80GB HBM3", 23.92),
    ("hyperstack/CANADA-1/n3-H100x8", 15.2),
    ("hyperstack/US-1/n3-H100-SXM5x8", 19.2),
    ("massedcompute/any/gpu_8x_h100", 22.99),
    ("verda/FIN-01/8H100.80S.176V", 19.92),
    ("primeintellect/CANADA-1/hyperstack/n3-H100x8", 16.0),
    ("nebius/eu-north1/gpu-h100-sxm/8gpu-128vcpu-1600gb", 23.6),
];

/// The inference box's offers: Lambda and Hyperstack sell no L40S; RunPod cheapest first
/// (community $0.79, then secure $0.86 by data centre); DigitalOcean $1.57 in atl1 and
/// tor1; Massed Compute's in `any` (109 cents), Verda's in FIN-02 ($1.29), Prime
/// Intellect's community L40S in EU-RO-1 ($0.99); AWS g6e.xlarge ($1.861) in each zone of
/// its default regions (g6e.2xlarge, $2.242, is above the $2 cap).
const INFERENCE: &[(&str, f64)] = &[
    ("runpod/CA-MTL-1/community/NVIDIA L40S", 0.79),
    ("runpod/EU-RO-1/secure/NVIDIA L40S", 0.86),
    ("runpod/US-TX-3/secure/NVIDIA L40S", 0.86),
    ("digitalocean/atl1/gpu-l40sx1-48gb", 1.57),
    ("digitalocean/tor1/gpu-l40sx1-48gb", 1.57),
    ("massedcompute/any/gpu_1x_l40s", 1.09),
    ("verda/FIN-02/1L40S.20V", 1.29),
    ("primeintellect/EU-RO-1/runpod/NVIDIA L40S/community", 0.99),
    ("aws/us-east-1/g6e.xlarge/us-east-1a", 1.861),
    ("aws/us-east-1/g6e.xlarge/us-east-1b", 1.861),
    ("aws/us-east-1/g6e.xlarge/us-east-1c", 1.861),
    ("aws/us-east-1/g6e.xlarge/us-east-1d", 1.861),
    ("aws/us-east-1/g6e.xlarge/us-east-1e", 1.861),
    ("aws/us-east-1/g6e.xlarge/us-east-1f", 1.861),
    ("aws/us-west-2/g6e.xlarge/us-west-2a", 1.861),
    ("aws/us-west-2/g6e.xlarge/us-west-2b", 1.861),
    ("aws/us-west-2/g6e.xlarge/us-west-2c", 1.861),
    ("aws/us-west-2/g6e.xlarge/us-west-2d", 1.861),
    ("aws/us-east-2/g6e.xlarge/us-east-2a", 1.861),
    ("aws/us-east-2/g6e.xlarge/us-east-2b", 1.861),
    ("aws/us-east-2/g6e.xlarge/us-east-2c", 1.861),
    ("aws/eu-west-1/g6e.xlarge/eu-west-1a", 1.861),
    ("aws/eu-west-1/g6e.xlarge/eu-west-1b", 1.861),
    ("aws/eu-west-1/g6e.xlarge/eu-west-1c", 1.861),
];

/// The notebook box's offers: GCP first (`clouds = ["gcp", "aws"]`): g2-standard-8
/// ($0.8536) in the zones the project's acceleratorTypes list, us-central1 before us-east4
/// as listed (g2-standard-24 is above the $1 cap); then AWS in us-east-1 (the only AWS
/// name listed): g6.xlarge ($0.805), then g6.2xlarge ($0.978), in each zone.
const NOTEBOOK: &[(&str, f64)] = &[
    ("gcp/us-central1/g2-standard-8/us-central1-a", 0.8536),
    ("gcp/us-central1/g2-standard-8/us-central1-b", 0.8536),
    ("gcp/us-east4/g2-standard-8/us-east4-a", 0.8536),
    ("aws/us-east-1/g6.xlarge/us-east-1a", 0.805),
    ("aws/us-east-1/g6.xlarge/us-east-1b", 0.805),
    ("aws/us-east-1/g6.xlarge/us-east-1c", 0.805),
    ("aws/us-east-1/g6.xlarge/us-east-1d", 0.805),
    ("aws/us-east-1/g6.xlarge/us-east-1e", 0.805),
    ("aws/us-east-1/g6.xlarge/us-east-1f", 0.805),
    ("aws/us-east-1/g6.2xlarge/us-east-1a", 0.978),
    ("aws/us-east-1/g6.2xlarge/us-east-1b", 0.978),
    ("aws/us-east-1/g6.2xlarge/us-east-1c", 0.978),
    ("aws/us-east-1/g6.2xlarge/us-east-1d", 0.978),
    ("aws/us-east-1/g6.2xlarge/us-east-1e", 0.978),
    ("aws/us-east-1/g6.2xlarge/us-east-1f", 0.978),
];

/// The credential env of every cloud, plus Verda's client id (not a secret).
fn cred_env() -> Vec<(&'static str, &'static str)> {
    let mut env: Vec<_> = CREDENTIALS.iter().map(|(_, k, v)| (*k, *v)).collect();
    env.push(("VERDA_CLIENT_ID", verda::CLIENT_ID));
    env
}

#[tokio::test]
async fn the_multi_cloud_example_plans_offers_from_every_cloud_with_stock() {
    let clouds = Clouds::start().await;
    let project = Project::new(&clouds);
    let endpoints = clouds.endpoints();
    let creds = cred_env();

    // Human plan: exit 0, both machines to create, offers in apply's order.
    let out = project.run(&["plan"], &endpoints, &creds).await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("vm.trainer will be created"), "{stdout}");
    assert!(stdout.contains("vm.inference will be created"), "{stdout}");
    assert!(stdout.contains("vm.notebook will be created"), "{stdout}");
    // Three machines and the project keys of DigitalOcean, Lambda, RunPod (its account
    // key set), Massed Compute, Verda and Prime Intellect, each planned once for all the
    // machines that may land there, and Hyperstack's environment and key pair of the
    // region the launch picks (`[*]`: the machines list several clouds, so the plan
    // cannot tell which region is Hyperstack's).
    assert!(
        stdout.contains("Plan: 11 to add, 0 to change, 0 to destroy."),
        "{stdout}"
    );
    for key in [
        "+ shared.digitalocean.ssh_key",
        "+ shared.lambda.ssh_key",
        "+ shared.runpod.ssh_key",
        "+ shared.massedcompute.ssh_key",
        "+ shared.verda.ssh_key",
        "+ shared.primeintellect.ssh_key",
        "+ shared.hyperstack.environment[*]",
        "+ shared.hyperstack.ssh_key[*]",
    ] {
        assert_eq!(stdout.matches(key).count(), 1, "{stdout}");
    }
    for (_, uri) in &endpoints {
        assert!(
            stdout.contains(uri.as_str()),
            "endpoint override {uri} shown: {stdout}"
        );
    }
    let first = stdout
        .find(TRAINER[0].0)
        .expect("first trainer offer shown");
    let last = stdout.find(TRAINER[7].0).expect("last shown trainer offer");
    assert!(first < last, "{stdout}");
    assert!(stdout.contains("$23.92/h"), "{stdout}");
    // The trainer: 11 offers, 8 shown. The inference box: 5 from RunPod and DigitalOcean,
    // 3 from Massed Compute, Verda and Prime Intellect, 16 from AWS (one per zone).
    assert!(stdout.contains("… and 3 more (see --json)"), "{stdout}");
    assert!(stdout.contains("… and 16 more (see --json)"), "{stdout}");
    assert!(!stdout.contains("H100 NVL"), "above the cap: {stdout}");

    // JSON plan with --detailed-exitcode (2: changes) and a saved plan file.
    let out = project
        .run(
            &[
                "plan",
                "--json",
                "--detailed-exitcode",
                "-out",
                "saved.plan",
            ],
            &endpoints,
            &creds,
        )
        .await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    let plan: Value = serde_json::from_str(&stdout).unwrap();
    let trainer = change(&plan, "trainer");
    let inference = change(&plan, "inference");
    let notebook = change(&plan, "notebook");
    assert_eq!(trainer["action"], "create");
    assert_eq!(inference["action"], "create");
    assert_eq!(notebook["action"], "create");
    assert_offers(&ids_prices(&trainer["offers"]), TRAINER);
    assert_offers(&ids_prices(&inference["offers"]), INFERENCE);
    assert_offers(&ids_prices(&notebook["offers"]), NOTEBOOK);
    // A new machine costs what its first offer costs.
    assert!(close(trainer["price_per_hour"].as_f64().unwrap(), 23.92));
    assert!(close(inference["price_per_hour"].as_f64().unwrap(), 0.79));
    assert!(close(notebook["price_per_hour"].as_f64().unwrap(), 0.8536));
    assert!(close(
        plan["gpuprov"]["hourly_cost_after"].as_f64().unwrap(),
        23.92 + 0.79 + 0.8536
    ));
    for (cloud, _) in clouds.all() {
        assert!(
            plan["gpuprov"]["endpoints"][cloud].is_string(),
            "{cloud} endpoint override recorded: {plan:#}"
        );
    }
    // `show -json` of the saved plan is the printed one (as Terraform's `show -json`).
    let out = project
        .run(&["show", "-json", "saved.plan"], &endpoints, &creds)
        .await;
    let (shown, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{shown}\n{stderr}");
    let saved: Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(saved, plan, "the saved plan is the printed one");

    // `offers --vm trainer` agrees with the plan, in the same order.
    let out = project
        .run(&["offers", "--vm", "trainer", "--json"], &endpoints, &creds)
        .await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let rows: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(ids_prices(&rows), ids_prices(&trainer["offers"]));
    assert!(rows
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["gpu_count"] == 8 && r["spot"] == false));

    // `offers --gpu H100` asks every cloud (any count, any region), cheapest first.
    let out = project
        .run(&["offers", "--gpu", "H100", "--json"], &endpoints, &creds)
        .await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let rows: Value = serde_json::from_str(&stdout).unwrap();
    let list = ids_prices(&rows);
    assert!(
        list.windows(2).all(|w| w[0].1 <= w[1].1),
        "cheapest first: {list:?}"
    );
    let clouds_seen: std::collections::BTreeSet<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["cloud"].as_str().unwrap())
        .collect();
    assert_eq!(
        clouds_seen.into_iter().collect::<Vec<_>>(),
        [
            "aws",
            "digitalocean",
            "gcp",
            "hyperstack",
            "lambda",
            "massedcompute",
            "nebius",
            "primeintellect",
            "runpod",
            "verda"
        ]
    );
    let price_of = |id: &str| {
        list.iter()
            .find(|(i, _)| i == id)
            .unwrap_or_else(|| panic!("{id} missing from {list:?}"))
            .1
    };
    // RunPod is priced per GPU × count: one GPU when no count is asked.
    assert!(close(
        price_of("runpod/EU-RO-1/community/NVIDIA H100 80GB HBM3"),
        2.69
    ));
    assert!(close(
        price_of("runpod/US-TX-3/secure/NVIDIA H100 NVL"),
        3.39
    ));
    assert!(close(price_of("lambda/us-south-1/gpu_8x_h100_sxm5"), 23.92));
    assert!(close(price_of("lambda/us-east-1/gpu_1x_h100_pcie"), 2.49));
    assert!(close(price_of("hyperstack/CANADA-1/n3-H100x1"), 1.9));
    // Massed Compute's cents, Verda's and Prime Intellect's prices, all USD per hour per
    // machine; with no region asked, Massed Compute places it (`any`) and Verda lists every
    // location with stock.
    assert!(close(price_of("massedcompute/any/gpu_8x_h100"), 22.99));
    assert!(close(price_of("verda/FIN-01/8H100.80S.176V"), 19.92));
    assert!(close(price_of("verda/ICE-01/8H100.80S.176V"), 19.92));
    assert!(close(
        price_of("primeintellect/CANADA-1/hyperstack/n3-H100x8"),
        16.0
    ));
    assert!(close(price_of("digitalocean/nyc2/gpu-h100x1-80gb"), 3.39));
    assert!(close(
        price_of("aws/us-east-1/p5.48xlarge/us-east-1a"),
        55.04
    ));
    // GCP: the zones its project lists (in its default regions), the catalog's prices.
    assert!(close(
        price_of("gcp/us-central1/a3-highgpu-1g/us-central1-a"),
        10.9791
    ));
    assert!(close(
        price_of("gcp/us-east4/a3-highgpu-8g/us-east4-a"),
        87.8325
    ));
    assert!(
        list.iter().all(|(i, _)| !i.starts_with("gcp/")
            || i.ends_with("us-central1-a")
            || i.ends_with("us-east4-a")),
        "only the listed zones: {list:?}"
    );
    assert!(
        !clouds.gcp.tokens.issued().is_empty(),
        "GCP's zones came from its API, with a token from the key's token_uri"
    );
    assert!(list
        .iter()
        .all(|(i, _)| !i.contains("gpu-h100x8-640gb") && !i.starts_with("hyperstack/NORWAY-1")));
    assert_eq!(list[0].0, "hyperstack/CANADA-1/n3-H100x1");

    project.assert_no_secret_in_files();
    clouds.verify(&all_credentials());
}

#[tokio::test]
async fn a_cloud_whose_catalog_fails_leaves_the_others_planning() {
    // RunPod rejects the key (401, a credentials error); Lambda's catalog is down (500);
    // Verda's token endpoint refuses the client secret (a wrong one is set below).
    let faults = BTreeMap::from([
        (
            "runpod",
            Fault {
                method: "GET",
                path: "/v2/catalog/gpus",
                canned: Canned::status(
                    401,
                    json!({"title": "Unauthorized", "status": 401, "detail": "invalid api key"}),
                ),
            },
        ),
        (
            "lambda",
            Fault {
                method: "GET",
                path: "/api/v1/instance-types",
                canned: Canned::status(
                    500,
                    json!({"error": {"code": "provider/internal-unavailable", "message": "upstream unavailable", "suggestion": "Try again later."}}),
                ),
            },
        ),
    ]);
    let clouds = Clouds::start_with(faults).await;
    let project = Project::new(&clouds);
    let endpoints = clouds.endpoints();
    let creds: Vec<(&str, &str)> = cred_env()
        .into_iter()
        .map(|(k, v)| match k {
            "VERDA_CLIENT_SECRET" => (k, "not-the-verda-secret"),
            _ => (k, v),
        })
        .collect();

    let out = project.run(&["plan", "--json"], &endpoints, &creds).await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("vm.trainer: runpod shows no offers")
            && stderr.contains("vm.trainer: lambda shows no offers")
            && stderr.contains("vm.trainer: verda shows no offers"),
        "the plan says which clouds failed: {stderr}"
    );
    let plan: Value = serde_json::from_str(&stdout).unwrap();
    fn without(list: &[(&'static str, f64)]) -> Vec<(&'static str, f64)> {
        list.iter()
            .filter(|(id, _)| {
                !["runpod/", "lambda/", "verda/"]
                    .iter()
                    .any(|c| id.starts_with(c))
            })
            .copied()
            .collect()
    }
    assert_offers(
        &ids_prices(&change(&plan, "trainer")["offers"]),
        &without(TRAINER),
    );
    assert_offers(
        &ids_prices(&change(&plan, "inference")["offers"]),
        &without(INFERENCE),
    );

    // `offers` says which cloud failed, without anything secret.
    let out = project
        .run(&["offers", "--vm", "trainer"], &endpoints, &creds)
        .await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stderr.contains("warning: runpod:"), "{stderr}");
    assert!(stderr.contains("warning: lambda:"), "{stderr}");
    assert!(stderr.contains("warning: verda:"), "{stderr}");
    assert!(stdout.contains("hyperstack"), "{stdout}");

    project.assert_no_secret_in_files();
    let others: Vec<_> = all_credentials()
        .into_iter()
        .filter(|(c, _)| *c != "verda")
        .collect();
    clouds.verify(&others);
}

#[tokio::test]
async fn without_credentials_every_rest_cloud_says_where_it_looked() {
    let clouds = Clouds::start().await;
    let project = Project::new(&clouds);
    let endpoints = clouds.endpoints();
    let home = project.path().join("home");

    // No REST cloud has a key: the trainer's only offer is Nebius' and the inference box's
    // are Nebius' and AWS's (both plan from built-in catalogs without a credential), so
    // the plan can be applied and succeeds; each REST cloud says why it added none.
    let out = project.run(&["plan"], &endpoints, &[]).await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let out = project.run(&["plan", "--json"], &endpoints, &[]).await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let plan: Value = serde_json::from_str(&stdout).unwrap();
    // Only Nebius' built-in catalog answers for the trainer (its plan works offline too).
    assert_eq!(
        ids_prices(&change(&plan, "trainer")["offers"]),
        [(
            "nebius/eu-north1/gpu-h100-sxm/8gpu-128vcpu-1600gb".to_string(),
            23.6
        )],
        "{plan:#}"
    );
    let aws_only: Vec<(&str, f64)> = INFERENCE
        .iter()
        .filter(|(id, _)| id.starts_with("aws/"))
        .copied()
        .collect();
    let (nebius, rest): (Vec<_>, Vec<_>) = ids_prices(&change(&plan, "inference")["offers"])
        .into_iter()
        .partition(|(id, _)| id.starts_with("nebius/"));
    assert!(
        !nebius.is_empty()
            && nebius
                .iter()
                .all(|(id, p)| id.starts_with("nebius/eu-north1/gpu-l40s-") && *p <= 2.0),
        "{nebius:?}"
    );
    assert_offers(&rest, &aws_only);

    // GCP plans from its built-in catalog: the catalog's L4 zones, then AWS's.
    let notebook = ids_prices(&change(&plan, "notebook")["offers"]);
    assert_eq!(
        notebook[0].0, "gcp/us-central1/g2-standard-8/us-central1-a",
        "{notebook:?}"
    );
    let gcp_zones: Vec<&str> = notebook
        .iter()
        .filter_map(|(i, _)| i.strip_prefix("gcp/"))
        .collect();
    assert_eq!(
        gcp_zones,
        [
            "us-central1/g2-standard-8/us-central1-a",
            "us-central1/g2-standard-8/us-central1-b",
            "us-central1/g2-standard-8/us-central1-c",
            "us-east4/g2-standard-8/us-east4-a",
            "us-east4/g2-standard-8/us-east4-c",
        ]
    );
    assert!(notebook.iter().any(|(i, _)| i.starts_with("aws/")));

    // Every REST cloud of the trainer fails: `offers --vm trainer` lists only Nebius'
    // offline offer and names where each REST cloud looked for its credential.
    let out = project
        .run(&["offers", "--vm", "trainer"], &endpoints, &[])
        .await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("gpu-h100-sxm/8gpu-128vcpu-1600gb"),
        "{stdout}"
    );
    for (cloud, var, _) in CREDENTIALS
        .iter()
        .filter(|(c, _, _)| *c != "gcp" && *c != "nebius")
    {
        let line = stderr
            .lines()
            .find(|l| l.starts_with(&format!("warning: {cloud}:")))
            .unwrap_or_else(|| panic!("no warning for {cloud}: {stderr}"));
        assert!(line.contains(var), "{cloud} names {var}: {line}");
    }
    let line = |cloud: &str| {
        stderr
            .lines()
            .find(|l| l.starts_with(&format!("warning: {cloud}:")))
            .unwrap()
            .to_string()
    };
    assert!(
        line("runpod").contains(&home.join(".runpod/config.toml").display().to_string()),
        "{stderr}"
    );
    let doctl = line("digitalocean");
    assert!(doctl.contains("DIGITALOCEAN_ACCESS_TOKEN"), "{doctl}");
    assert!(
        doctl.contains(&home.join(".config/doctl/config.yaml").display().to_string()),
        "{doctl}"
    );
    assert!(
        line("hyperstack").contains("no CLI configuration file"),
        "{stderr}"
    );

    project.assert_no_secret_in_files();
    // Nothing was sent to any fake: there was no credential to send.
    for (cloud, server) in clouds.all() {
        assert!(server.requests().is_empty(), "{cloud} was called");
    }
    clouds.verify(&[]);
}

/// Issue 20: a plan of 100 machines reads each cloud's catalog as often as a plan of one
/// (once per ask, and per region where the vendor's catalog is regional), counted at the
/// spec-checked servers of five REST clouds.
#[tokio::test]
async fn a_plan_of_100_machines_reads_each_catalog_as_often_as_one_machine() {
    const CLOUDS: [&str; 5] = [
        "lambda",
        "runpod",
        "hyperstack",
        "digitalocean",
        "massedcompute",
    ];
    fn config(n: usize) -> String {
        let mut s = String::from("[defaults]\nkubernetes = false\n");
        for i in 0..n {
            s.push_str(&format!(
                "\n[vm.t{i:03}]\nclouds = {CLOUDS:?}\ngpu = \"H100\"\ngpu_count = 8\n\
                 regions = [\"us-east-1\", \"US-KS-2\", \"CANADA-1\", \"nyc2\", \"any\"]\n\
                 max_price_per_hour = 25.0\n"
            ));
        }
        s
    }
    /// Catalog requests per cloud and path (discovery's instance listings left out).
    fn catalog_reads(clouds: &Clouds) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for (cloud, server) in clouds.all() {
            if !CLOUDS.contains(&cloud) {
                continue;
            }
            for r in server.requests() {
                let listing = r.path.ends_with("/instances")
                    || r.path.ends_with("/droplets")
                    || r.path.ends_with("/instance");
                if r.method == "GET" && !listing {
                    *out.entry(format!("{cloud} {}", r.path)).or_insert(0) += 1;
                }
            }
        }
        out
    }
    let creds = cred_env();
    let mut reads = Vec::new();
    for n in [1, 100] {
        let clouds = Clouds::start().await;
        let project = Project::new(&clouds);
        std::fs::write(project.path().join("gpuprov.toml"), config(n)).unwrap();
        let out = project
            .run(
                &["plan", "--json", "-refresh=false"],
                &clouds.endpoints(),
                &creds,
            )
            .await;
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
        let plan: Value = serde_json::from_str(&stdout).unwrap();
        let offers = ids_prices(&change(&plan, &format!("t{:03}", n - 1))["offers"]);
        for cloud in ["lambda/", "runpod/", "hyperstack/", "massedcompute/"] {
            assert!(
                offers.iter().any(|(id, _)| id.starts_with(cloud)),
                "{cloud} offers planned: {offers:?}"
            );
        }
        clouds.verify(&all_credentials());
        reads.push(catalog_reads(&clouds));
    }
    let (one, hundred) = (&reads[0], &reads[1]);
    for cloud in CLOUDS {
        assert!(
            one.keys().any(|k| k.starts_with(&format!("{cloud} "))),
            "{cloud}'s catalog was read: {one:?}"
        );
    }
    assert_eq!(
        hundred, one,
        "100 machines read the catalogs as often as one"
    );
    assert_eq!(one["lambda /api/v1/instance-types"], 1, "{one:?}");
}
