//! The Massed Compute adapter against a local fake of the vendor's VM API whose every
//! request and response is checked against the vendor's OpenAPI 1.0.0 description
//! (`support::spec::massedcompute`). The launch and teardown machines run for real; SSH is
//! the `FakeConnector` (instances get 127.0.0.x addresses only, nothing is dialled).
//!
//! What the conformance suite does not hold every cloud to: prices in cents, region `any`
//! unless pinned, a same-named key of another value never trusted, the listing's password
//! never shown, the SSH route for k3s, and where the token was found.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use gpuprov::config::Cloud;
use gpuprov::provider::kit::CredentialReport;
use gpuprov::provider::clouds::massedcompute::{self as mc, MassedComputeProvider, MassedComputeSettings};
use gpuprov::provider::{project_key_name, CloudProvider, Feature, InstanceSpec, ResourceRequest};
use gpuprov::vm::{Target, TeardownState};
use serde_json::{json, Value};

use crate::support::drive::{self, LINEAGE, PUBKEY};
use crate::support::faults::{authorization, Faults};
use crate::support::spec::{self, Canned, Seen, SpecServer};

/// A sentinel API token: it must never appear in any error, reason or journal entry.
pub(crate) const SENTINEL: &str = "mc_secret_sentinel_token_4b8e1a";
/// A password the listing returns for every instance; it must never be shown either.
pub(crate) const PASSWORD: &str = "mc_listing_password_sentinel_77";
pub(crate) const LAUNCH: &str = "/api/v1/instance/launch";
pub(crate) const TERMINATE: &str = "/api/v1/instance/terminate";
pub(crate) const KEYS: &str = "/api/v1/ssh-keys";
pub(crate) const INVENTORY: &str = "/api/v1/gpu-inventory";
/// The main product: 8 × H100 SXM5.
pub(crate) const H100: &str = "gpu_8x_h100";

/// A product of the fake inventory.
#[derive(Clone)]
pub(crate) struct Product {
    pub(crate) description: String,
    pub(crate) cents: i64,
    pub(crate) regions: Vec<String>,
    pub(crate) capacity: i64,
}

/// The fake Massed Compute account.
#[derive(Default)]
pub(crate) struct World {
    pub(crate) products: BTreeMap<String, Product>,
    pub(crate) images: Vec<(i64, String)>,
    /// `{id, name, public_key}`; names need not be unique (the API does not say they are).
    pub(crate) keys: Vec<Value>,
    pub(crate) instances: Vec<Value>,
    pub(crate) faults: Faults,
    next: u32,
}

impl World {
    /// The images Massed Compute lists (ids as the description's examples).
    pub(crate) fn new() -> World {
        World {
            images: vec![
                (7, "Art".into()),
                (12, "Ubuntu Server 22.04 w/ drivers".into()),
            ],
            ..World::default()
        }
    }

    pub(crate) fn with_product(
        mut self,
        name: &str,
        description: &str,
        cents: i64,
        regions: &[&str],
    ) -> World {
        self.products.insert(
            name.into(),
            Product {
                description: description.into(),
                cents,
                regions: regions.iter().map(|r| r.to_string()).collect(),
                capacity: regions.len() as i64,
            },
        );
        self
    }

    fn inventory(&self) -> Canned {
        let mut inv = serde_json::Map::new();
        for (name, p) in &self.products {
            inv.insert(
                name.clone(),
                json!({
                    "instance_type": {
                        "name": name,
                        "description": p.description,
                        "price_cents_per_hour": p.cents,
                        "specs": {"vcpu_count": 104, "memory_gib": 900, "storage_gb": 2000}
                    },
                    "regions_with_capacity_available": p.regions.iter()
                        .map(|r| json!({"name": r, "description": format!("{r} test region")}))
                        .collect::<Vec<_>>(),
                    "capacity_available": p.capacity,
                }),
            );
        }
        Canned::ok(json!({ "gpu_inventory": inv }))
    }

    fn launch(&mut self, b: &Value) -> Canned {
        let product = b["productName"].as_str().unwrap_or_default();
        let region = b["regionName"].as_str().unwrap_or_default();
        let Some(p) = self.products.get(product).cloned() else {
            return Canned::status(
                400,
                json!({"message": format!("Unknown product {product}")}),
            );
        };
        let placed = if region == "any" {
            p.regions.first().cloned()
        } else {
            p.regions.iter().find(|r| *r == region).cloned()
        };
        if placed.is_none() {
            return Canned::status(
                400,
                json!({"message": "Not enough capacity to fulfill launch request."}),
            );
        }
        for k in b["sshKeys"].as_array().into_iter().flatten() {
            if !self.keys.iter().any(|x| x["name"] == *k) {
                return Canned::status(400, json!({"message": format!("Unknown SSH key {k}")}));
            }
        }
        self.next += 1;
        let uuid = format!("8b52a46b-0000-4fde-925c-{:012x}", self.next);
        self.instances.push(json!({
            "uuid": uuid,
            "name": b["instanceName"],
            "ip": "",
            "username": "Ubuntu",
            "password": PASSWORD,
            "status": "booting",
            "os_booted": 0,
            "command_startup": "",
            "created": "2026-11-30T20:00:00.000Z",
            "active": 0,
            "image": {"id": b["imageId"], "name": "Ubuntu Server 22.04 w/ drivers"},
            "product": {"name": product, "description": p.description, "gpu_count": 8,
                        "vcpu": 104, "ram": 900, "storage": 2000,
                        "price_hr": format!("{:.6}", p.cents as f64 / 100.0)},
        }));
        Canned::status(202, json!({ "response": uuid }))
    }

    /// The list as Massed Compute shows it now; then every booting instance is rented with
    /// a loopback address, and terminated ones leave the list.
    fn list(&mut self) -> Canned {
        let out = json!({ "runningInstances": self.instances });
        self.instances.retain(|i| i["status"] != "terminated");
        for (n, i) in self.instances.iter_mut().enumerate() {
            if i["status"] == "booting" {
                i["status"] = json!("rented");
                i["os_booted"] = json!(1);
                i["active"] = json!(1);
                i["ip"] = json!(format!("127.0.0.{}", 20 + n));
            }
        }
        Canned::ok(out)
    }

    fn terminate(&mut self, b: &Value) -> Canned {
        let mut done = vec![];
        for id in b["instanceUuids"].as_array().into_iter().flatten() {
            let Some(i) = self.instances.iter_mut().find(|i| i["uuid"] == *id) else {
                return Canned::status(404, json!({"message": "Instance not found"}));
            };
            i["status"] = json!("terminated");
            done.push(json!({"id": id, "name": i["name"], "status": "terminated"}));
        }
        Canned::status(
            202,
            json!({"response": {"data": {"terminated_instances": done}}}),
        )
    }

    /// Instances not terminated.
    pub(crate) fn live(&self) -> usize {
        self.instances
            .iter()
            .filter(|i| i["status"] != "terminated")
            .count()
    }
}

/// A started fake and its world.
pub(crate) struct Fake {
    pub(crate) server: SpecServer,
    pub(crate) world: Arc<Mutex<World>>,
}

impl Fake {
    pub(crate) async fn start(world: World) -> Fake {
        let server = SpecServer::start(Arc::new(spec::massedcompute())).await;
        let world = Arc::new(Mutex::new(world));
        macro_rules! route {
            ($method:expr, $re:expr, |$w:ident, $req:ident| $body:expr) => {{
                let wc = world.clone();
                server
                    .mount_fn($method, $re, move |$req: &Seen| {
                        let mut $w = wc.lock().unwrap();
                        if let Some(f) = $w.faults.take($req, "/message", authorization) {
                            return f;
                        }
                        $body
                    })
                    .await;
            }};
        }
        route!("GET", "^/api/v1/gpu-inventory$", |w, _r| w.inventory());
        route!("GET", "^/api/v1/images$", |w, _r| {
            let images: Vec<Value> = w
                .images
                .iter()
                .map(|(id, n)| json!({"vm_image_id": id, "vm_image_name": n, "vm_image_description": n}))
                .collect();
            Canned::ok(json!({ "images": images }))
        });
        route!("GET", "^/api/v1/ssh-keys$", |w, _r| Canned::ok(
            json!({ "sshKeys": w.keys })
        ));
        route!("POST", "^/api/v1/ssh-keys$", |w, r| {
            let b = r.body.clone().unwrap_or_default();
            w.next += 1;
            let id = format!("key-{}", w.next);
            w.keys
                .push(json!({"id": id, "name": b["name"], "public_key": b["publicKey"]}));
            Canned::ok(json!({"sshKey": {"id": id, "name": b["name"]}}))
        });
        route!("DELETE", "^/api/v1/ssh-keys/[^/]+$", |w, r| {
            let id = r.path.rsplit('/').next().unwrap_or_default().to_string();
            let before = w.keys.len();
            w.keys.retain(|k| k["id"] != id.as_str());
            if w.keys.len() == before {
                Canned::status(404, json!({"message": "SSH key not found"}))
            } else {
                Canned::ok(json!({"result": {}}))
            }
        });
        route!("GET", "^/api/v1/instance$", |w, _r| w.list());
        route!("POST", "^/api/v1/instance/launch$", |w, r| {
            w.launch(&r.body.clone().unwrap_or_default())
        });
        route!("POST", "^/api/v1/instance/terminate$", |w, r| {
            w.terminate(&r.body.clone().unwrap_or_default())
        });
        Fake { server, world }
    }

    pub(crate) fn provider_with(&self, key: Option<&str>) -> Arc<MassedComputeProvider> {
        let caps = drive::test_capabilities(MassedComputeProvider::default_capabilities());
        Arc::new(
            MassedComputeProvider::new(MassedComputeSettings {
                endpoint: Some(format!("{}/api/v1", self.server.uri())),
                api_key: key.map(gpuprov::provider::Secret::new),
                key_source: format!("the {} environment variable", mc::API_KEY_ENV),
                lineage: LINEAGE.parse().unwrap(),
            })
            .with_capabilities(caps),
        )
    }

    pub(crate) fn provider(&self) -> Arc<MassedComputeProvider> {
        self.provider_with(Some(SENTINEL))
    }

    pub(crate) fn launches(&self) -> Vec<Value> {
        self.server
            .requests_to("POST", LAUNCH)
            .into_iter()
            .filter_map(|r| r.body)
            .collect()
    }
}

/// 8 × H100 at 2392 cents an hour in us-central-1 and us-central-10; one RTX A6000.
pub(crate) fn h100_world() -> World {
    World::new()
        .with_product(
            H100,
            "8x H100 SXM5",
            2392,
            &["us-central-1", "us-central-10"],
        )
        .with_product("gpu_1x_a6000", "1x RTX A6000", 63, &["us-east-2"])
}

type Run = drive::Run<Fake, MassedComputeProvider>;

async fn run(world: World) -> Run {
    let fake = Fake::start(world).await;
    let provider = fake.provider();
    Run::new(
        fake,
        provider,
        drive::gpu_vm(Cloud::Massedcompute, "H100", 8),
    )
}

fn spec_of(vm: &str) -> InstanceSpec {
    InstanceSpec {
        vm_name: vm.into(),
        lineage: LINEAGE.into(),
        client_token: "t".into(),
        image: None,
        disk_gb: None,
        ports: vec![],
        ssh_public_key: PUBKEY.into(),
        boot_script: None,
        shared: Default::default(),
    }
}

fn ask(gpu: &str, count: u32, regions: &[&str]) -> ResourceRequest {
    ResourceRequest {
        vm_name: "trainer".into(),
        regions: regions.iter().map(|r| r.to_string()).collect(),
        zones: vec![],
        gpu: Some(gpu.into()),
        gpu_count: count,
        spot: false,
        max_price_per_hour: None,
        gpu_count_at_least: false,
    }
}

#[tokio::test]
async fn prices_are_cents_per_machine_hour_in_usd() {
    let fake = Fake::start(h100_world().with_product(
        "gpu_8x_h100_nvl",
        "8x H100 NVL",
        2599,
        &["us-central-1"],
    ))
    .await;
    let p = fake.provider();
    let o = p.plan(&ask("H100", 8, &[])).await.unwrap();
    let prices: BTreeMap<String, f64> =
        o.iter().map(|o| (o.id.clone(), o.price_per_hour)).collect();
    assert_eq!(
        prices,
        BTreeMap::from([
            ("massedcompute/any/gpu_8x_h100".to_string(), 23.92),
            ("massedcompute/any/gpu_8x_h100_nvl".to_string(), 25.99),
        ]),
        "2392 cents → $23.92 per hour for the whole 8-GPU machine"
    );
    let a6000 = p.plan(&ask("A6000", 1, &[])).await.unwrap();
    assert_eq!(a6000[0].price_per_hour, 0.63);
    assert_eq!(a6000[0].gpu.as_deref(), Some("RTX A6000"));
    fake.server.verify();
}

#[tokio::test]
async fn region_any_unless_the_vm_pins_one_and_the_name_says_which() {
    // No region asked: the launch lets Massed Compute place it (`regionName: any`).
    let mut r = run(h100_world()).await;
    let vm = r.launch().await.unwrap().ready().cloned().expect("ready");
    assert_eq!(vm.offer.id, "massedcompute/any/gpu_8x_h100");
    assert_eq!(vm.location.region, "any");
    let lb = &r.cloud.launches()[0];
    assert_eq!(lb["regionName"], "any");
    assert_eq!(lb["instanceName"], "gpuprov-trainer-0f0e0d0c");
    assert_eq!(lb["productName"], H100);
    assert_eq!(lb["imageId"], 12, "the default image, by name");
    assert_eq!((vm.user.as_str(), vm.ssh.port), ("Ubuntu", 22));
    let end = r
        .teardown(Target::new(
            vm.location.clone(),
            "trainer",
            vec![vm.instance_id.clone()],
        ))
        .await;
    assert_eq!(end, TeardownState::Done);
    assert_eq!(r.cloud.world.lock().unwrap().live(), 0);
    let t = r.cloud.server.requests_to("POST", TERMINATE);
    assert_eq!(t.len(), 1, "terminated once, then seen gone");
    assert_eq!(
        t[0].body.clone().unwrap()["instanceUuids"],
        json!([vm.instance_id])
    );

    // A pinned region is sent as asked, and the name carries it: observing `any` (or
    // another region) never sees the pinned machine.
    r.vm.regions = vec!["us-central-10".into()];
    r.journal = Arc::new(gpuprov::machine::MemoryJournal::new());
    let vm = r.launch().await.unwrap().ready().cloned().expect("ready");
    let lb = &r.cloud.launches()[1];
    assert_eq!(lb["regionName"], "us-central-10");
    assert_eq!(lb["instanceName"], "gpuprov-trainer-0f0e0d0c-us-central-10");
    assert_eq!(vm.offer.id, "massedcompute/us-central-10/gpu_8x_h100");
    let at = |region: &str| gpuprov::provider::Location {
        cloud: "massedcompute".into(),
        region: region.into(),
        zone: None,
    };
    for other in ["any", "us-central-1"] {
        assert!(
            r.provider
                .observe(&at(other), "trainer")
                .await
                .unwrap()
                .is_empty(),
            "{other}"
        );
    }
    assert_eq!(
        r.provider
            .observe(&at("us-central-10"), "trainer")
            .await
            .unwrap()
            .len(),
        1
    );
    r.cloud.server.verify();
}

#[tokio::test]
async fn a_same_named_key_with_another_value_is_never_trusted() {
    let name = project_key_name(LINEAGE, PUBKEY).replace('-', " ");
    let mut w = h100_world();
    w.keys = vec![
        // Our name, another value: not ours.
        json!({"id": "k1", "name": name, "public_key": "ssh-ed25519 AAAAC3NzaOtherValue x"}),
        // Our value under a name another value shares: the launch could get the other one.
        json!({"id": "k2", "name": "laptop", "public_key": format!("{} me@laptop", drive_key())}),
        json!({"id": "k3", "name": "laptop", "public_key": "ssh-ed25519 AAAAC3NzaSomeoneElse y"}),
    ];
    let fake = Fake::start(w).await;
    let p = fake.provider();
    let o = &p.plan(&ask("H100", 8, &[])).await.unwrap()[0];
    let prep = p.prepare(o, &spec_of("trainer")).await.unwrap();
    let posted = fake.server.requests_to("POST", KEYS);
    assert_eq!(posted.len(), 1, "registered once, under a free name");
    let body = posted[0].body.clone().unwrap();
    assert_eq!(
        body["name"],
        format!("{name} 2"),
        "spaces only: Massed Compute key names"
    );
    assert_eq!(body["publicKey"], PUBKEY);
    assert_eq!(prep["ssh_key_name"], format!("{name} 2"));
    // prepare again: the registered key is found by name and value, not registered twice.
    let again = p.prepare(o, &spec_of("trainer")).await.unwrap();
    assert_eq!(again["ssh_key_name"], format!("{name} 2"));
    assert_eq!(fake.server.requests_to("POST", KEYS).len(), 1);
    let id = p.create(o, &again, &spec_of("trainer")).await.unwrap();
    assert_eq!(fake.launches()[0]["sshKeys"], json!([format!("{name} 2")]));
    assert!(id.starts_with("8b52a46b-"), "{id}");
    fake.server.verify();
}

/// The shared node's calls hold the same rules as `prepare`: a key of our name with
/// another value, and our value under a name another value shares, are never taken;
/// the key registered under the next free name is ours (deleted), the user's is not.
#[tokio::test]
async fn the_shared_key_is_found_by_value_under_an_unambiguous_name_only() {
    use gpuprov::provider::SharedObject;
    let name = project_key_name(LINEAGE, PUBKEY).replace('-', " ");
    let mut w = h100_world();
    w.keys = vec![
        json!({"id": "k1", "name": name, "public_key": "ssh-ed25519 AAAAC3NzaOtherValue x"}),
        json!({"id": "k2", "name": "laptop", "public_key": format!("{} me@laptop", drive_key())}),
        json!({"id": "k3", "name": "laptop", "public_key": "ssh-ed25519 AAAAC3NzaSomeoneElse y"}),
    ];
    let fake = Fake::start(w).await;
    let p = fake.provider();
    let obj = SharedObject {
        cloud: "massedcompute".into(),
        kind: "ssh_key".into(),
        region: None,
    };
    assert_eq!(p.observe_shared(&obj, PUBKEY).await.unwrap(), None);
    let made = p.create_shared(&obj, PUBKEY).await.unwrap();
    assert_eq!(made.name, format!("{name} 2"));
    assert!(made.ours);
    let seen = p.observe_shared(&obj, PUBKEY).await.unwrap().unwrap();
    assert_eq!((seen.name.as_str(), seen.ours), (made.name.as_str(), true));
    assert_eq!(seen.id, made.id);
    p.delete_shared(&obj, &seen).await.unwrap();
    assert_eq!(p.observe_shared(&obj, PUBKEY).await.unwrap(), None);
    assert_eq!(
        fake.world.lock().unwrap().keys.len(),
        3,
        "the others untouched"
    );
    // Deleted already: success.
    p.delete_shared(&obj, &seen).await.unwrap();
    // The user's own key under an unambiguous name: used, not ours.
    fake.world.lock().unwrap().keys.remove(2);
    let users = p.observe_shared(&obj, PUBKEY).await.unwrap().unwrap();
    assert_eq!((users.name.as_str(), users.ours), ("laptop", false));
    fake.server.verify();
}

/// The project key without its comment.
fn drive_key() -> &'static str {
    PUBKEY.rsplit_once(' ').unwrap().0
}

#[tokio::test]
async fn the_listing_password_and_the_token_never_reach_the_journal() {
    let r = run(h100_world()).await;
    let end = r.launch().await.unwrap();
    assert!(end.ready().is_some(), "{end:?}");
    let all = format!("{end:?} {:?}", r.journal.history());
    assert!(!all.contains(PASSWORD), "{all}");
    assert!(!all.contains(SENTINEL), "{all}");
    let listed = r.cloud.server.requests_to("GET", "/api/v1/instance");
    assert!(!listed.is_empty());
    r.cloud.server.verify();
}

#[tokio::test]
async fn k3s_goes_over_ssh_and_the_tunnel() {
    let fake = Fake::start(h100_world()).await;
    let caps = fake.provider().capabilities();
    assert!(caps.supports(Feature::Kubernetes) && caps.supports(Feature::Gpu));
    assert!(
        !caps.supports(Feature::BootScript),
        "no cloud-init: install over SSH"
    );
    assert!(
        !caps.supports(Feature::Firewall),
        "no firewall API: the API goes over the tunnel"
    );
    // A boot script handed over anyway (a VM whose other clouds take one) is not sent.
    let p = fake.provider();
    let o = &p.plan(&ask("H100", 8, &[])).await.unwrap()[0];
    let prep = p.prepare(o, &spec_of("trainer")).await.unwrap();
    let mut spec = spec_of("trainer");
    spec.boot_script = Some(gpuprov::provider::BootScript::new("echo k3s"));
    p.create(o, &prep, &spec).await.unwrap();
    let lb = &fake.launches()[0];
    assert!(lb.get("command").is_none(), "{lb}");
    fake.server.verify();
}

#[tokio::test]
async fn validate_says_where_the_token_was_found() {
    let fake = Fake::start(h100_world()).await;
    assert_eq!(
        fake.provider().credentials().await,
        CredentialReport::Found("the MASSED_COMPUTE_API_KEY environment variable".into())
    );
    let none = fake.provider_with(None);
    match none.credentials().await {
        CredentialReport::Missing(places) => {
            assert!(
                places.iter().any(|p| p.contains("MASSED_COMPUTE_API_KEY")),
                "{places:?}"
            )
        }
        other => panic!("{other:?}"),
    }
    let e = none.plan(&ask("H100", 8, &[])).await.unwrap_err();
    assert_eq!(e.kind, gpuprov::provider::ErrorKind::Credentials);
    assert!(e.text().contains("MASSED_COMPUTE_API_KEY"), "{}", e.text());
    assert!(
        fake.server.requests().is_empty(),
        "nothing sent without a token"
    );
}
