//! The RunPod adapter against a local fake of the RunPod REST API v2 whose every request
//! and every response is checked against RunPod's own OpenAPI description
//! (`tests/it/support/spec.rs`, `spec::runpod()`). The launch and teardown machines run for
//! real through the executor with a `MemoryJournal`; SSH is the `FakeConnector` (pods get
//! 127.0.0.x addresses only, nothing is dialled).

use crate::support::drive;
use crate::support::spec;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drive::{LINEAGE, PUBKEY};
use gpuprov::config::Cloud;
use gpuprov::machine::ExecError;
use gpuprov::provider::clouds::runpod::{ApiKey, RunpodProvider, RunpodSettings};
use gpuprov::provider::{
    Capabilities, CloudProvider, ErrorKind, Feature, InstanceSpec, InstanceStatus, Location,
    ResourceRequest,
};
use gpuprov::vm::{LaunchState, Target, TeardownState};
use serde_json::{json, Value};
use spec::{Canned, Seen, SpecServer};

/// The user's own key, already registered on the account: it must survive the merge.
pub(crate) const USER_KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIUserOwnKey me@laptop";
/// A sentinel API key: it must never appear in any error, reason or journal entry.
pub(crate) const SENTINEL: &str = "rpa_secret_sentinel_key_7f3a9c";
pub(crate) const H100: &str = "NVIDIA H100 80GB HBM3";

pub(crate) const PODS: &str = "/v2/pods";
pub(crate) const CATALOG: &str = "/v2/catalog/gpus";
pub(crate) const KEYS: &str = "/v2/account/ssh-keys";

/// One GPU type of the fake catalog.
#[derive(Clone)]
struct Gpu {
    name: String,
    /// USD per GPU per hour: (secure, community).
    price: (f64, f64),
    /// Largest machine: (secure, community); 0 = not offered in that tier.
    max: (u32, u32),
    /// Data centres with stock, per tier (`SECURE` / `COMMUNITY`).
    stock: BTreeMap<String, Vec<String>>,
}

/// The fake RunPod account.
#[derive(Default)]
pub(crate) struct World {
    gpus: BTreeMap<String, Gpu>,
    pub(crate) keys: Vec<String>,
    pub(crate) pods: Vec<Value>,
    /// Per pod id: how many more listings show it RUNNING with its ports not mapped yet.
    unmapped: BTreeMap<String, u32>,
    /// Listings a new pod stays RUNNING-but-unmapped (the field-reported case).
    hold_unmapped: u32,
    /// Per (method, path): error responses served before the normal behaviour.
    faults: BTreeMap<(String, String), VecDeque<Canned>>,
    next: u32,
    /// Every error body echoes the Authorization header (a hostile server), to prove the
    /// adapter scrubs the key.
    pub(crate) echo_auth: bool,
}

/// An RFC 9457 problem body in the spec's `ErrorResponse` shape.
pub(crate) fn problem(status: u16, detail: &str) -> Value {
    let title = match status {
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        _ => "Error",
    };
    json!({"title": title, "status": status, "detail": detail})
}

/// `%XX` decoding of a path segment (GPU type ids hold spaces).
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap()
}

fn query<'a>(req: &'a Seen, k: &str) -> Option<&'a str> {
    req.query
        .iter()
        .find(|(n, _)| n == k)
        .map(|(_, v)| v.as_str())
}

impl World {
    pub(crate) fn with_gpu(
        mut self,
        id: &str,
        name: &str,
        price: (f64, f64),
        max: (u32, u32),
    ) -> Self {
        self.gpus.insert(
            id.into(),
            Gpu {
                name: name.into(),
                price,
                max,
                stock: BTreeMap::new(),
            },
        );
        self
    }

    pub(crate) fn with_stock(mut self, id: &str, tier: &str, dcs: &[&str]) -> Self {
        self.gpus
            .get_mut(id)
            .unwrap()
            .stock
            .insert(tier.into(), dcs.iter().map(|d| d.to_string()).collect());
        self
    }

    pub(crate) fn fault(&mut self, method: &str, path: &str, c: Canned) {
        self.faults
            .entry((method.into(), path.into()))
            .or_default()
            .push_back(c);
    }

    fn take_fault(&mut self, req: &Seen) -> Option<Canned> {
        let mut c = self
            .faults
            .get_mut(&(req.method.clone(), req.path.clone()))?
            .pop_front()?;
        if self.echo_auth {
            let auth = req
                .headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("authorization"))
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            if let Some(b) = c.body.as_mut() {
                let d = b["detail"].as_str().unwrap_or_default().to_string();
                b["detail"] = json!(format!("{d} [{auth}]"));
            }
        }
        Some(c)
    }

    /// The catalog's cross-parameter rules, which the spec states in prose only:
    /// `include=AVAILABILITY` requires `product`, and `product`, `count` and `cloud` are
    /// valid only with `include` (400 either way).
    fn catalog_rules(req: &Seen) -> Option<Canned> {
        let include = query(req, "include").is_some();
        let bad = (include && query(req, "product").is_none())
            || (!include
                && ["product", "count", "cloud"]
                    .iter()
                    .any(|k| query(req, k).is_some()));
        bad.then(|| {
            Canned::status(
                400,
                problem(400, "include=AVAILABILITY requires product, and vice versa"),
            )
        })
    }

    fn gpu_json(&self, id: &str, g: &Gpu, req: &Seen) -> Value {
        let mut v = json!({
            "id": id,
            "name": g.name,
            "pool": null,
            "manufacturer": "NVIDIA",
            "memory": 80,
            "secure": g.max.0 > 0,
            "community": g.max.1 > 0,
            "price": {"secure": g.price.0, "community": g.price.1},
            "maxCount": {"secure": g.max.0, "community": g.max.1},
        });
        if query(req, "include") == Some("AVAILABILITY") {
            let tier = query(req, "cloud").unwrap_or("SECURE");
            let count: u32 = query(req, "count")
                .and_then(|c| c.parse().ok())
                .unwrap_or(1);
            let max = if tier == "SECURE" { g.max.0 } else { g.max.1 };
            let dcs: Vec<Value> = if count <= max {
                g.stock
                    .get(tier)
                    .cloned()
                    .unwrap_or_default()
                    .iter()
                    .map(|d| json!({"id": d, "name": format!("{d} test"), "availability": "HIGH"}))
                    .collect()
            } else {
                vec![]
            };
            v["availability"] = json!(if dcs.is_empty() { "NONE" } else { "HIGH" });
            // "omitted entirely when the configuration is unavailable everywhere"
            if !dcs.is_empty() {
                v["dataCenters"] = json!(dcs);
            }
        }
        v
    }

    fn catalog(&self, req: &Seen) -> Canned {
        if let Some(c) = Self::catalog_rules(req) {
            return c;
        }
        let gpus: Vec<Value> = self
            .gpus
            .iter()
            .map(|(id, g)| self.gpu_json(id, g, req))
            .collect();
        Canned::ok(json!({ "gpus": gpus }))
    }

    fn gpu(&self, req: &Seen) -> Canned {
        if let Some(c) = Self::catalog_rules(req) {
            return c;
        }
        let id = decode(req.path.rsplit('/').next().unwrap_or_default());
        match self.gpus.get(&id) {
            Some(g) => Canned::ok(self.gpu_json(&id, g, req)),
            None => Canned::status(404, problem(404, "gpu type not found")),
        }
    }

    fn create(&mut self, body: &Value) -> Canned {
        let id = body["gpu"]["id"].as_str().unwrap_or_default().to_string();
        let count = body["gpu"]["count"].as_u64().unwrap_or(1) as u32;
        let tier = body["cloud"].as_str().unwrap_or("SECURE").to_string();
        let dc = body["dataCenterIds"][0]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let Some(g) = self.gpus.get(&id).cloned() else {
            return Canned::status(400, problem(400, "unknown gpu type"));
        };
        let max = if tier == "SECURE" { g.max.0 } else { g.max.1 };
        let stocked = g.stock.get(&tier).is_some_and(|d| d.contains(&dc));
        if count > max || !stocked {
            return Canned::status(
                400,
                problem(
                    400,
                    "There are no longer any instances available with the requested specifications.",
                ),
            );
        }
        self.next += 1;
        let pod_id = format!("pod{:08x}", self.next);
        let price = if tier == "SECURE" {
            g.price.0
        } else {
            g.price.1
        };
        let pod = json!({
            "id": pod_id,
            "name": body["name"],
            "image": body["image"],
            "args": "",
            "disk": body.get("disk").cloned().unwrap_or(json!(20)),
            "ports": body["ports"],
            "env": body["env"],
            "registry": null,
            "status": "PROVISIONING",
            "actions": ["terminate"],
            "mounts": {},
            "gpu": {"id": id, "count": count},
            "cloud": tier,
            // Not assigned by the scheduler yet.
            "dataCenterId": null,
            "cudaVersion": null,
            "ssh": {"proxy": null, "direct": null},
            "template": null,
            "cost": price * count as f64,
            "locked": false,
            "globalNetworking": {"enabled": false},
            "runtime": null,
            "createdAt": "2026-11-30T20:00:00Z",
            "startedAt": null,
        });
        self.unmapped.insert(pod_id, self.hold_unmapped);
        self.pods.push(pod.clone());
        Canned::status(201, pod)
    }

    /// The list as RunPod shows it now; then every pod advances one step:
    /// PROVISIONING → RUNNING with its ports not mapped yet (null `ssh.direct`, a `22/tcp`
    /// runtime port with null `public`/`ip`) for `hold_unmapped` listings → mapped, with a
    /// loopback address.
    fn list(&mut self) -> Canned {
        let out = json!({ "pods": self.pods });
        for (n, p) in self.pods.iter_mut().enumerate() {
            let id = p["id"].as_str().unwrap_or_default().to_string();
            match p["status"].as_str() {
                Some("PROVISIONING" | "STARTING") => {
                    let dc = p["env"]["GPUPROV_DATA_CENTER"].clone();
                    p["status"] = json!("RUNNING");
                    p["dataCenterId"] = dc;
                    p["startedAt"] = json!("2026-11-30T20:01:00Z");
                    p["actions"] = json!(["stop", "restart", "terminate"]);
                    p["ssh"]["proxy"] = json!({
                        "host": "ssh.runpod.io", "port": 22,
                        "username": format!("{id}-64411eb2"),
                        "command": format!("ssh {id}-64411eb2@ssh.runpod.io")
                    });
                    p["runtime"] = json!({"uptime": 1, "ports": [
                        {"private": 22, "public": null, "type": "tcp", "ip": null}
                    ]});
                }
                Some("RUNNING") if p["ssh"]["direct"].is_null() => {
                    let hold = self.unmapped.entry(id.clone()).or_default();
                    if *hold > 0 {
                        *hold -= 1;
                        continue;
                    }
                    let ip = format!("127.0.0.{}", 7 + n);
                    let port = 40022 + n as u16;
                    p["ssh"]["direct"] = json!({
                        "host": ip, "port": port, "username": "root",
                        "command": format!("ssh root@{ip} -p {port}")
                    });
                    p["runtime"] = json!({"uptime": 5, "ports": [
                        {"private": 22, "public": port, "type": "tcp", "ip": ip}
                    ]});
                }
                _ => {}
            }
        }
        Canned::ok(out)
    }

    /// `POST /v2/pods/{id}/action` (spec `podAction`): `stop` (a running, provisioning or
    /// starting pod → `EXITED`, ports unmapped), `start` (`EXITED`/`ERROR` → `STARTING`,
    /// then the listing advances it as a new pod), `terminate` (gone, `204`); any other
    /// action for the pod's status is `409`.
    pub(crate) fn action(&mut self, path: &str, body: &Value) -> Canned {
        let id = path
            .trim_end_matches("/action")
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        let Some(n) = self.pods.iter().position(|p| p["id"] == id.as_str()) else {
            return Canned::status(404, problem(404, "pod not found"));
        };
        let p = &mut self.pods[n];
        let status = p["status"].as_str().unwrap_or_default().to_string();
        match (body["action"].as_str().unwrap_or_default(), status.as_str()) {
            ("stop", "RUNNING" | "PROVISIONING" | "STARTING") => {
                p["status"] = json!("EXITED");
                p["actions"] = json!(["start", "terminate"]);
                p["ssh"] = json!({"proxy": null, "direct": null});
                p["runtime"] = Value::Null;
            }
            ("start", "EXITED" | "ERROR") => {
                p["status"] = json!("STARTING");
                p["actions"] = json!(["stop", "terminate"]);
            }
            ("terminate", _) => {
                self.pods.remove(n);
                return Canned::empty(204);
            }
            _ => {
                return Canned::status(
                    409,
                    problem(409, &format!("action not valid for a {status} pod")),
                )
            }
        }
        Canned::ok(p.clone())
    }

    /// `GET /v2/pods/{id}` (spec `getPod`).
    fn get(&self, path: &str) -> Canned {
        let id = path.rsplit('/').next().unwrap_or_default();
        match self.pods.iter().find(|p| p["id"] == id) {
            Some(p) => Canned::ok(p.clone()),
            None => Canned::status(404, problem(404, "pod not found")),
        }
    }

    fn delete(&mut self, path: &str) -> Canned {
        let id = path.rsplit('/').next().unwrap_or_default();
        let before = self.pods.len();
        // "the pod no longer appears in listPods"
        self.pods.retain(|p| p["id"] != id);
        if self.pods.len() == before {
            Canned::status(404, problem(404, "pod not found"))
        } else {
            Canned::empty(204)
        }
    }
}

pub(crate) struct Fake {
    pub(crate) server: SpecServer,
    pub(crate) world: Arc<Mutex<World>>,
}

impl Fake {
    pub(crate) async fn start(world: World) -> Fake {
        let server = SpecServer::start(Arc::new(spec::runpod())).await;
        let world = Arc::new(Mutex::new(world));
        macro_rules! route {
            ($method:expr, $re:expr, |$w:ident, $req:ident| $body:expr) => {{
                let wc = world.clone();
                server
                    .mount_fn($method, $re, move |$req: &Seen| {
                        let mut $w = wc.lock().unwrap();
                        if let Some(f) = $w.take_fault($req) {
                            return f;
                        }
                        $body
                    })
                    .await;
            }};
        }
        route!("GET", "^/v2/catalog/gpus$", |w, r| w.catalog(r));
        route!("GET", "^/v2/catalog/gpus/[^/]+$", |w, r| w.gpu(r));
        route!("GET", "^/v2/account/ssh-keys$", |w, _r| Canned::ok(
            json!({"keys": w.keys})
        ));
        route!("PUT", "^/v2/account/ssh-keys$", |w, r| {
            let b = r.body.clone().unwrap_or_default();
            w.keys = b["keys"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|k| k.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            Canned::ok(json!({"keys": w.keys}))
        });
        route!("GET", "^/v2/pods$", |w, _r| w.list());
        route!("POST", "^/v2/pods$", |w, r| {
            let b = r.body.clone().unwrap_or_default();
            w.create(&b)
        });
        route!("DELETE", "^/v2/pods/[^/]+$", |w, r| w.delete(&r.path));
        route!("GET", "^/v2/pods/[^/]+$", |w, r| w.get(&r.path));
        route!("POST", "^/v2/pods/[^/]+/action$", |w, r| {
            let b = r.body.clone().unwrap_or_default();
            w.action(&r.path, &b)
        });
        Fake { server, world }
    }

    fn provider_with_key(&self, key: Option<&str>) -> Arc<RunpodProvider> {
        let caps = Capabilities {
            min_create_interval: Duration::ZERO,
            ..drive::test_capabilities(RunpodProvider::default_capabilities())
        };
        Arc::new(
            RunpodProvider::new(RunpodSettings {
                endpoint: Some(self.server.uri()),
                api_key: key.map(ApiKey::new),
                key_source: "the RUNPOD_API_KEY environment variable, ~/.runpod/config.toml \
                             (not found)"
                    .into(),
                lineage: LINEAGE.parse().unwrap(),
            })
            .with_capabilities(caps),
        )
    }

    pub(crate) fn provider(&self) -> Arc<RunpodProvider> {
        self.provider_with_key(Some(SENTINEL))
    }

    pub(crate) fn creates(&self) -> Vec<Value> {
        self.server
            .requests_to("POST", PODS)
            .into_iter()
            .filter_map(|r| r.body)
            .collect()
    }
}

/// The shared launch/teardown harness over this vendor's local server.
type Run = drive::Run<Fake, RunpodProvider>;

/// A run of `trainer` asking for 8 × H100 against a server serving `world`.
async fn run(world: World) -> Run {
    let cloud = Fake::start(world).await;
    let provider = cloud.provider();
    Run::new(cloud, provider, drive::gpu_vm(Cloud::Runpod, "H100", 8))
}

/// H100 SXM: secure $2.99 / community $2.69 per GPU-hour, 8 per machine in both tiers;
/// secure stock in US-KS-2 and EU-RO-1, community stock in EU-RO-1. An A40 nobody asks for.
pub(crate) fn h100_world() -> World {
    let mut w = World::default()
        .with_gpu(H100, "H100 SXM", (2.99, 2.69), (8, 8))
        .with_stock(H100, "SECURE", &["US-KS-2", "EU-RO-1"])
        .with_stock(H100, "COMMUNITY", &["EU-RO-1"])
        .with_gpu("NVIDIA A40", "A40", (0.40, 0.35), (8, 8))
        .with_stock("NVIDIA A40", "SECURE", &["US-KS-2"]);
    w.keys = vec![USER_KEY.into()];
    w
}

fn spec_for(vm: &str) -> InstanceSpec {
    InstanceSpec {
        vm_name: vm.into(),
        lineage: LINEAGE.parse().unwrap(),
        client_token: "t".into(),
        image: None,
        disk_gb: None,
        ports: vec![],
        ssh_public_key: PUBKEY.into(),
        boot_script: None,
        shared: Default::default(),
    }
}

fn ask(regions: &[&str]) -> ResourceRequest {
    ResourceRequest {
        vm_name: "trainer".into(),
        regions: regions.iter().map(|r| r.to_string()).collect(),
        zones: vec![],
        gpu: Some("H100".into()),
        gpu_count: 8,
        spot: false,
        max_price_per_hour: None,
        gpu_count_at_least: false,
    }
}

fn at(region: &str) -> Location {
    Location {
        cloud: "runpod".into(),
        region: region.into(),
        zone: None,
    }
}

fn placements(fake: &Fake) -> Vec<(Value, Value)> {
    fake.creates()
        .iter()
        .map(|b| (b["dataCenterIds"][0].clone(), b["cloud"].clone()))
        .collect()
}

#[tokio::test]
async fn full_launch_then_teardown_against_the_spec() {
    let mut r = run(h100_world()).await;
    r.vm.ports = vec![8080];
    r.vm.regions = vec!["US-KS-2".into()];
    r.vm.disk_gb = Some(100);
    let end = r.launch().await.unwrap();
    let vm = end
        .ready()
        .unwrap_or_else(|| panic!("not ready: {end:?} {:?}", r.labels()));
    assert_eq!(vm.offer.id, format!("runpod/US-KS-2/secure/{H100}"));
    assert!((vm.offer.price_per_hour - 23.92).abs() < 1e-9);
    assert_eq!(vm.user, "root");
    assert!(vm.ssh.host.starts_with("127.0.0."), "{}", vm.ssh.host);
    assert!(
        vm.ssh.port >= 40022,
        "the mapped public port: {}",
        vm.ssh.port
    );
    assert_eq!(r.connector.logins(), 1);

    // plan: one catalog read per tier, with the filters availability requires.
    let reads = r.cloud.server.requests_to("GET", CATALOG);
    let tiers: Vec<&str> = reads
        .iter()
        .map(|q| query(q, "cloud").unwrap_or_default())
        .collect();
    assert!(
        tiers.contains(&"SECURE") && tiers.contains(&"COMMUNITY"),
        "{tiers:?}"
    );
    for q in &reads {
        assert_eq!(query(q, "include"), Some("AVAILABILITY"));
        assert_eq!(query(q, "product"), Some("POD"));
        assert_eq!(query(q, "count"), Some("8"));
    }
    // prepare: the stock re-check. The shared key before it: one PUT that keeps the
    // user's key and adds ours, its comment the derived name (`create_shared`; `prepare`
    // never writes the set).
    assert!(!r
        .cloud
        .server
        .requests_to("GET", "/v2/catalog/gpus/NVIDIA%20H100%2080GB%20HBM3")
        .is_empty());
    let ours = format!(
        "{} {}",
        gpuprov::provider::kit::keys::key_value(PUBKEY),
        gpuprov::provider::project_key_name(drive::LINEAGE, PUBKEY)
    );
    let puts = r.cloud.server.requests_to("PUT", KEYS);
    assert_eq!(puts.len(), 1);
    assert_eq!(
        puts[0].body.clone().unwrap()["keys"],
        json!([USER_KEY, ours])
    );
    assert_eq!(
        r.cloud.world.lock().unwrap().keys,
        [USER_KEY.to_string(), ours.clone()]
    );

    // create: one pod, named, with the identity env, 22/tcp, SSH on, both keys.
    let creates = r.cloud.creates();
    assert_eq!(creates.len(), 1);
    let b = &creates[0];
    assert_eq!(b["name"], "gpuprov-trainer-0f0e0d0c");
    assert_eq!(b["gpu"], json!({"id": H100, "count": 8}));
    assert_eq!(b["cloud"], "SECURE");
    assert_eq!(b["dataCenterIds"], json!(["US-KS-2"]));
    assert_eq!(b["ports"], json!(["22/tcp", "8080/tcp"]));
    assert_eq!(b["startSsh"], true);
    assert_eq!(b["disk"], 100);
    assert_eq!(b["image"], gpuprov::provider::clouds::runpod::DEFAULT_IMAGE);
    assert_eq!(b["env"]["GPUPROV_VM_NAME"], "trainer");
    assert_eq!(b["env"]["GPUPROV_LINEAGE"], LINEAGE);
    assert_eq!(b["env"]["GPUPROV_DATA_CENTER"], "US-KS-2");
    assert_eq!(b["env"]["PUBLIC_KEY"], format!("{USER_KEY}\n{ours}"));

    let labels = r.labels();
    assert!(
        labels.iter().any(|l| l.starts_with("booting")),
        "{labels:?}"
    );
    assert!(labels.last().unwrap().starts_with("ready"), "{labels:?}");

    // Teardown: DELETE the pod, wait until it is gone; nothing else to clean.
    let end = r
        .teardown(Target::new(
            vm.location.clone(),
            "trainer",
            vec![vm.instance_id.clone()],
        ))
        .await;
    assert_eq!(end, TeardownState::Done);
    let path = format!("{PODS}/{}", vm.instance_id);
    assert_eq!(r.cloud.server.requests_to("DELETE", &path).len(), 1);
    assert!(r
        .provider
        .observe(&vm.location, "trainer")
        .await
        .unwrap()
        .is_empty());
    // The project key stays registered (shared by the project's pods); the user's too.
    assert_eq!(
        r.cloud.world.lock().unwrap().keys,
        [USER_KEY.to_string(), ours]
    );
    r.cloud.server.verify();
}

/// Field report: RunPod lists a RUNNING pod whose ports are not mapped yet (`ssh.direct`
/// null, the `22/tcp` runtime port with a null public port and ip, or `runtime` null).
/// That is "not ready yet", never an error: the launch machine keeps waiting in Booting
/// and connects once the port is mapped.
#[tokio::test]
async fn runpod_ports_not_mapped_yet_keep_booting_then_connect() {
    let mut world = h100_world();
    world.hold_unmapped = 4;
    let r = run(world).await;
    let end = r.launch().await.unwrap();
    let vm = end
        .ready()
        .unwrap_or_else(|| panic!("not ready: {end:?} {:?}", r.labels()));
    assert_eq!(r.connector.logins(), 1);
    assert!(vm.ssh.host.starts_with("127.0.0."));
    assert_eq!(r.cloud.creates().len(), 1, "waited, no failover");
    // Booting polled through every unmapped listing (observe said Running, no endpoint).
    let lists = r.cloud.server.requests_to("GET", PODS).len();
    assert!(
        lists >= 6,
        "observe before create + provisioning + 4 unmapped + mapped: {lists}"
    );
    let labels = r.labels();
    assert!(
        !labels.iter().any(|l| l.starts_with("compensating")),
        "{labels:?}"
    );

    // The adapter itself: a running pod with null ports is Running without an endpoint.
    let fake = Fake::start(h100_world()).await;
    fake.world.lock().unwrap().hold_unmapped = 1;
    let p = fake.provider();
    let offer = p.plan(&ask(&["US-KS-2"])).await.unwrap().remove(0);
    let prepared = drive::prepare(p.clone(), &offer, &spec_for("trainer"))
        .await
        .unwrap();
    let id = p
        .create(&offer, &prepared, &spec_for("trainer"))
        .await
        .unwrap();
    let first = p.observe(&at("US-KS-2"), "trainer").await.unwrap();
    assert_eq!(
        (first[0].status.clone(), first[0].ssh.clone()),
        (InstanceStatus::Pending, None)
    );
    let second = p.observe(&at("US-KS-2"), "trainer").await.unwrap();
    assert_eq!(second[0].instance_id, id);
    assert_eq!(
        (second[0].status.clone(), second[0].ssh.clone()),
        (InstanceStatus::Running, None)
    );
    let third = p.observe(&at("US-KS-2"), "trainer").await.unwrap();
    assert_eq!(
        (third[0].status.clone(), third[0].ssh.clone()),
        (InstanceStatus::Running, None)
    );
    let mapped = p.observe(&at("US-KS-2"), "trainer").await.unwrap();
    let ssh = mapped[0].ssh.clone().expect("mapped now");
    assert_eq!(ssh.user.as_deref(), Some("root"));
    fake.server.verify();
    r.cloud.server.verify();
}

#[tokio::test]
async fn a_400_on_create_fails_over_to_the_next_offer() {
    let mut r = run(h100_world()).await;
    r.vm.regions = vec!["US-KS-2".into(), "EU-RO-1".into()];
    r.cloud.world.lock().unwrap().fault(
        "POST",
        PODS,
        Canned::status(
            400,
            problem(
                400,
                "There are no longer any instances available with the requested specifications.",
            ),
        ),
    );
    let end = r.launch().await.unwrap();
    let vm = end.ready().unwrap_or_else(|| panic!("{end:?}"));
    assert_eq!(
        placements(&r.cloud),
        [
            (json!("US-KS-2"), json!("SECURE")),
            (json!("EU-RO-1"), json!("COMMUNITY")),
        ]
    );
    assert_eq!(vm.offer.id, format!("runpod/EU-RO-1/community/{H100}"));
    assert_eq!(r.cloud.world.lock().unwrap().pods.len(), 1);
    r.cloud.server.verify();
}

#[tokio::test]
async fn a_402_insufficient_balance_aborts_without_trying_other_offers() {
    let mut r = run(h100_world()).await;
    r.vm.regions = vec!["US-KS-2".into(), "EU-RO-1".into()];
    r.cloud.world.lock().unwrap().fault(
        "POST",
        PODS,
        Canned::status(402, problem(402, "insufficient balance")),
    );
    let end = r.launch().await.unwrap();
    match &end {
        LaunchState::Aborted { reason, .. } => {
            assert!(reason.contains("402"), "{reason}");
            assert!(reason.contains("add funds"), "{reason}");
        }
        other => panic!("expected Aborted, got {other:?}"),
    }
    assert_eq!(r.cloud.creates().len(), 1, "no failover on 402");
    assert!(r.cloud.world.lock().unwrap().pods.is_empty());
    r.cloud.server.verify();
}

/// A machine whose every cloud refused the account stops at once, even when asked to
/// wait for capacity (`retry_until_up`): no wait cures a 402.
#[tokio::test]
async fn a_402_on_the_only_cloud_aborts_even_when_retrying_until_up() {
    let mut r = run(h100_world()).await;
    r.vm.regions = vec!["US-KS-2".into(), "EU-RO-1".into()];
    r.vm.retry_until_up = true;
    r.cloud.world.lock().unwrap().fault(
        "POST",
        PODS,
        Canned::status(402, problem(402, "insufficient balance")),
    );
    let end = r.launch().await.unwrap();
    match &end {
        LaunchState::Aborted { reason, .. } => {
            assert!(
                reason.contains("every cloud refused the account"),
                "{reason}"
            );
            assert!(
                reason.contains("402") && reason.contains("add funds"),
                "{reason}"
            );
        }
        other => panic!("expected Aborted, got {other:?}"),
    }
    assert_eq!(
        r.cloud.creates().len(),
        1,
        "one create, then RunPod is left out"
    );
    assert!(r.cloud.world.lock().unwrap().pods.is_empty());
    r.cloud.server.verify();
}

/// Issue 35: a 402 concerns RunPod's account, not the ask. With a second cloud, the
/// machine comes up there; RunPod is tried once and the 402 is named in the run's log.
#[tokio::test]
async fn a_402_on_the_first_of_two_clouds_fails_over_to_the_second() {
    let fake = Fake::start(h100_world()).await;
    fake.world.lock().unwrap().fault(
        "POST",
        PODS,
        Canned::status(402, problem(402, "insufficient balance")),
    );
    let runpod = fake.provider();
    let lambda = Arc::new(
        gpuprov::provider::doubles::fake::FakeProvider::new("lambda").with_offer(
            "lambda-h100",
            "us-east-1",
            "gpu_8x_h100_sxm5",
            23.92,
        ),
    );
    let mut vm = drive::gpu_vm(Cloud::Runpod, "H100", 8);
    vm.clouds = vec![Cloud::Runpod, Cloud::Lambda];
    vm.regions = vec!["US-KS-2".into(), "EU-RO-1".into(), "us-east-1".into()];
    let mut providers = gpuprov::machine::Providers::new();
    providers.insert(runpod.clone());
    providers.insert(lambda.clone());
    let journal = Arc::new(gpuprov::machine::MemoryJournal::new());
    let end = drive::launch_across(
        LINEAGE,
        &vm,
        providers,
        journal.clone(),
        Arc::new(gpuprov::provider::doubles::fake::FakeConnector::default()),
    )
    .await
    .unwrap();
    let labels = drive::labels(&journal);
    let up = end.ready().unwrap_or_else(|| panic!("{end:?} {labels:?}"));
    assert_eq!(up.location.cloud, "lambda", "{labels:?}");
    assert_eq!(fake.creates().len(), 1, "RunPod's other offers are blocked");
    assert!(
        labels
            .iter()
            .any(|l| l.contains("402") && l.contains("add funds")),
        "the 402 and its help are in the log: {labels:?}"
    );
    assert!(fake.world.lock().unwrap().pods.is_empty());
    fake.server.verify();
}

#[tokio::test]
async fn a_422_contract_violation_aborts() {
    let mut r = run(h100_world()).await;
    r.vm.regions = vec!["US-KS-2".into(), "EU-RO-1".into()];
    r.cloud.world.lock().unwrap().fault(
        "POST",
        PODS,
        Canned::status(
            422,
            json!({"title": "Unprocessable Entity", "status": 422,
                   "detail": "Request validation failed.",
                   "errors": ["$.gpu.count: must be >= 1"]}),
        ),
    );
    let end = r.launch().await.unwrap();
    match &end {
        LaunchState::Aborted { reason, .. } => assert!(reason.contains("gpu.count"), "{reason}"),
        other => panic!("expected Aborted, got {other:?}"),
    }
    assert_eq!(r.cloud.creates().len(), 1);
    r.cloud.server.verify();
}

#[tokio::test]
async fn a_crash_between_create_and_journal_adopts_the_pod() {
    let r = run(h100_world()).await;
    r.journal.crash_before("booting");
    let first = r.launch().await.unwrap_err();
    assert!(matches!(first, ExecError::Journal { .. }), "{first:?}");
    assert_eq!(r.cloud.creates().len(), 1, "the create happened");
    // The pod is still PROVISIONING with no data centre assigned: the identity env finds it.
    assert!(r.cloud.world.lock().unwrap().pods[0]["dataCenterId"].is_null());
    let end = r.launch().await.unwrap();
    assert!(end.ready().is_some(), "{end:?}");
    assert_eq!(r.cloud.creates().len(), 1, "adopted, not created twice");
    assert_eq!(r.cloud.world.lock().unwrap().pods.len(), 1);
    r.cloud.server.verify();
}

#[tokio::test]
async fn deleting_an_unknown_pod_succeeds_and_cleanup_is_idempotent() {
    let fake = Fake::start(h100_world()).await;
    let p = fake.provider();
    p.delete(&at("US-KS-2"), "trainer", &["podgone".into()])
        .await
        .unwrap();
    assert_eq!(
        fake.server.requests_to("DELETE", "/v2/pods/podgone").len(),
        1
    );
    p.cleanup(&at("US-KS-2"), "trainer").await.unwrap();
    p.cleanup(&at("US-KS-2"), "trainer").await.unwrap();
    // A cluster member (409) is not deletable here: not success, not transient.
    fake.world.lock().unwrap().fault(
        "DELETE",
        "/v2/pods/podc",
        Canned::status(409, problem(409, "pod belongs to a cluster")),
    );
    let e = p
        .delete(&at("US-KS-2"), "trainer", &["podc".into()])
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Failed, "{e}");
    // An upstream failure is transient.
    fake.world.lock().unwrap().fault(
        "GET",
        PODS,
        Canned::status(503, problem(503, "upstream unavailable")),
    );
    assert_eq!(
        p.observe(&at("US-KS-2"), "trainer").await.unwrap_err().kind,
        ErrorKind::Transient
    );
    fake.server.verify();
}

#[tokio::test]
async fn data_centre_ids_match_as_whole_ids() {
    let world = World::default()
        .with_gpu(H100, "H100 SXM", (2.99, 2.69), (8, 8))
        .with_stock(H100, "SECURE", &["US-KS-20"])
        .with_gpu("NVIDIA A100-SXM4-80GB", "A100 SXM", (1.49, 1.19), (8, 8))
        .with_stock("NVIDIA A100-SXM4-80GB", "SECURE", &["US-KS-2"]);
    let fake = Fake::start(world).await;
    let p = fake.provider();
    assert!(
        p.plan(&ask(&["US-KS-2"])).await.unwrap().is_empty(),
        "US-KS-2 is not US-KS-20"
    );
    assert!(p.plan(&ask(&["US-KS"])).await.unwrap().is_empty());
    let o = p.plan(&ask(&["us-ks-20"])).await.unwrap();
    assert_eq!(o.len(), 1);
    assert_eq!(o[0].location.region, "US-KS-20");

    // A pod of ours in US-KS-20 is not seen when observing US-KS-2, before and after the
    // scheduler assigns its data centre.
    let prepared = drive::prepare(p.clone(), &o[0], &spec_for("trainer"))
        .await
        .unwrap();
    let id = p
        .create(&o[0], &prepared, &spec_for("trainer"))
        .await
        .unwrap();
    assert!(p
        .observe(&at("US-KS-2"), "trainer")
        .await
        .unwrap()
        .is_empty());
    let seen = p.observe(&at("US-KS-20"), "trainer").await.unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].instance_id, id);
    assert!(p
        .observe(&at("US-KS-2"), "trainer")
        .await
        .unwrap()
        .is_empty());
    // Another VM's name or another lineage is not ours either.
    assert!(p
        .observe(&at("US-KS-20"), "other")
        .await
        .unwrap()
        .is_empty());
    fake.server.verify();
}

#[tokio::test]
async fn the_api_key_never_appears_in_errors() {
    let r = run(h100_world()).await;
    {
        let mut w = r.cloud.world.lock().unwrap();
        w.echo_auth = true;
        // A hostile server echoing the Authorization header in its problem detail.
        w.fault(
            "GET",
            CATALOG,
            Canned::status(401, problem(401, "invalid bearer token")),
        );
    }
    let end = r.launch().await.unwrap();
    match &end {
        LaunchState::Aborted { reason, .. } => {
            assert!(reason.contains("401"), "{reason}");
            assert!(!reason.contains(SENTINEL), "{reason}");
        }
        other => panic!("expected Aborted, got {other:?}"),
    }
    for (_, label) in r.journal.history() {
        assert!(!label.contains(SENTINEL), "{label}");
    }
    assert!(!format!("{end:?}").contains(SENTINEL));
    assert!(!format!("{:?}", r.provider.settings()).contains(SENTINEL));

    // Every primitive, each answered by an error that echoes the key.
    let p = r.provider.clone();
    let offer = {
        let o = p.plan(&ask(&["US-KS-2"])).await.unwrap();
        o.into_iter().next().unwrap()
    };
    for (m, path) in [
        ("GET", PODS),
        ("DELETE", "/v2/pods/abc"),
        ("GET", KEYS),
        ("POST", PODS),
    ] {
        r.cloud.world.lock().unwrap().fault(
            m,
            path,
            Canned::status(403, problem(403, "access denied")),
        );
    }
    let prepared = json!({"public_keys": [PUBKEY]});
    let errors = [
        p.observe(&at("US-KS-2"), "trainer").await.unwrap_err(),
        p.delete(&at("US-KS-2"), "trainer", &["abc".into()])
            .await
            .unwrap_err(),
        // The project key's listing (the shared object `prepare` needs first).
        p.observe_shared(&p.shared_objects(&offer)[0], PUBKEY)
            .await
            .unwrap_err(),
        p.create(&offer, &prepared, &spec_for("trainer"))
            .await
            .unwrap_err(),
    ];
    for e in &errors {
        assert_eq!(e.kind, ErrorKind::Credentials, "{e}");
        assert!(!e.to_string().contains(SENTINEL), "{e}");
        assert!(e.msg.contains("REDACTED"), "the echo was scrubbed: {e}");
    }
    r.cloud.server.verify();

    // No key at all: a Credentials error naming where it looked.
    let e = r
        .cloud
        .provider_with_key(None)
        .observe(&at("US-KS-2"), "trainer")
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Credentials);
    assert!(e.msg.contains("RUNPOD_API_KEY"), "{}", e.msg);
    assert!(e.msg.contains(".runpod/config.toml"), "{}", e.msg);
}

#[tokio::test]
async fn unplannable_asks_are_invalid_requests() {
    let fake = Fake::start(h100_world()).await;
    let p = fake.provider();
    let mut a = ask(&[]);
    a.spot = true;
    assert_eq!(
        p.plan(&a).await.unwrap_err().kind,
        ErrorKind::InvalidRequest
    );
    a.spot = false;
    a.gpu = Some("B200".into());
    let e = p.plan(&a).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest);
    assert!(e.msg.contains("H100 SXM x8"), "{}", e.msg);
    // More GPUs than RunPod's largest H100 machine.
    a.gpu = Some("H100".into());
    a.gpu_count = 16;
    assert_eq!(
        p.plan(&a).await.unwrap_err().kind,
        ErrorKind::InvalidRequest
    );
    // Known model, no stock now: no offers, not an error.
    a.gpu_count = 8;
    a.regions = vec!["CA-MTL-1".into()];
    assert!(p.plan(&a).await.unwrap().is_empty());
    // A boot script cannot be delivered to a pod.
    let offer = p.plan(&ask(&["US-KS-2"])).await.unwrap().remove(0);
    let mut s = spec_for("trainer");
    s.boot_script = Some(gpuprov::provider::BootScript {
        script: "echo hi".into(),
        env: BTreeMap::new(),
    });
    let e = p
        .create(&offer, &json!({"public_keys": [PUBKEY]}), &s)
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest);
    assert!(fake.creates().is_empty());
    fake.server.verify();
}

#[tokio::test]
async fn prepare_rechecks_stock_and_a_gone_offer_is_unavailable() {
    let fake = Fake::start(h100_world()).await;
    let p = fake.provider();
    let offer = p.plan(&ask(&["US-KS-2"])).await.unwrap().remove(0);
    drive::prepare(p.clone(), &offer, &spec_for("trainer"))
        .await
        .unwrap();
    fake.world
        .lock()
        .unwrap()
        .gpus
        .get_mut(H100)
        .unwrap()
        .stock
        .insert("SECURE".into(), vec!["EU-RO-1".into()]);
    let e = drive::prepare(p.clone(), &offer, &spec_for("trainer"))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unavailable, "{e}");
    fake.server.verify();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpuprov_plan_lists_the_runpod_offers_from_the_local_api() {
    let fake = Fake::start(h100_world()).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("gpuprov.toml"),
        "[defaults]\nclouds = [\"runpod\"]\nkubernetes = false\n\n[vm.trainer]\ngpu = \"H100\"\ngpu_count = 8\nregions = [\"US-KS-2\"]\n",
    )
    .unwrap();
    let uri = fake.server.uri();
    let path = dir.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        assert_cmd::Command::cargo_bin("gpuprov")
            .unwrap()
            .current_dir(&path)
            .env("GPUPROV_HOME", path.join("home"))
            .env("HOME", path.join("home"))
            .env("NO_COLOR", "1")
            .env_remove("GPUPROV_CONFIG")
            .env_remove("GPUPROV_STATE")
            .env("GPUPROV_RUNPOD_ENDPOINT", &uri)
            .env("RUNPOD_API_KEY", SENTINEL)
            .args(["plan"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("no adapter for runpod in this build"),
        "target/debug/gpuprov is another checkout's build: the build directory is shared \
         (CARGO_TARGET_DIR) with a concurrent build of another branch; rerun alone\n{stderr}"
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("23.92"), "{stdout}");
    assert!(
        stdout.contains(&fake.server.uri()),
        "the endpoint override is shown: {stdout}"
    );
    assert!(!stdout.contains(SENTINEL) && !stderr.contains(SENTINEL));
    assert!(fake.creates().is_empty(), "plan creates nothing");
    assert!(
        fake.server.requests_to("PUT", KEYS).is_empty(),
        "plan registers nothing"
    );
    fake.server.verify();
}

/// The harness really holds the adapter to RunPod's document: what the fake accepts above
/// is what the spec accepts, and these are what it rejects.
#[test]
fn the_runpod_spec_rejects_what_runpod_would() {
    let s = spec::runpod();
    // An unknown body field (`CreatePodRequest` has `unevaluatedProperties: false`).
    let bad = json!({"name": "x", "image": "i", "gpu": {"id": H100}, "bogus": 1});
    assert!(s.check_request("POST", PODS, &[], Some(&bad)).is_err());
    // No image and no template.
    let bad = json!({"name": "x", "gpu": {"id": H100}});
    assert!(s.check_request("POST", PODS, &[], Some(&bad)).is_err());
    // An undeclared catalog filter, and a tier outside the enum.
    let q = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
    assert!(s
        .check_request("GET", CATALOG, &q("region", "US"), None)
        .is_err());
    assert!(s
        .check_request("GET", CATALOG, &q("cloud", "ALL"), None)
        .is_err());
    // A key line the PUT pattern refuses.
    let bad = json!({"keys": ["not a key"]});
    assert!(s.check_request("PUT", KEYS, &[], Some(&bad)).is_err());
    // A pod missing required fields.
    assert!(s
        .check_response("GET", "/v2/pods/p1", 200, Some(&json!({"id": "p1"})))
        .is_err());
    // The patched 402 (defect 1) takes the documented problem body only.
    assert!(s
        .check_response(
            "POST",
            PODS,
            402,
            Some(&problem(402, "insufficient balance"))
        )
        .is_ok());
    assert!(s
        .check_response("POST", PODS, 402, Some(&json!({"message": "x"})))
        .is_err());
}

/// Observes `vm` at `region` until its one pod is Running with an SSH endpoint (the fake
/// advances one step per listing); panics after a few listings. Returns the statuses seen.
async fn until_running(p: &RunpodProvider, region: &str, vm: &str) -> Vec<InstanceStatus> {
    let mut seen = Vec::new();
    for _ in 0..6 {
        let o = p.observe(&at(region), vm).await.unwrap();
        assert_eq!(o.len(), 1, "{o:?}");
        seen.push(o[0].status.clone());
        if o[0].status == InstanceStatus::Running && o[0].ssh.is_some() {
            return seen;
        }
    }
    panic!("never Running with an endpoint: {seen:?}");
}

/// Issue 12 item 2 (restart before replace): RunPod can start a stopped pod. A stopped
/// pod is `EXITED` and observed `Stopped` (no endpoint); `start` sends the spec's
/// `podAction` `{"action": "start"}`, after which it is observed Pending and then Running;
/// starting a pod already running is success (`409` + `getPod`); a start refused with a
/// `400` (no free GPU on the host: the spec documents no capacity answer) is `Capacity`
/// and leaves the pod stopped; a pod that is gone is `Failed`.
#[tokio::test]
async fn a_stopped_pod_is_observed_stopped_then_started_again() {
    let fake = Fake::start(h100_world()).await;
    let p = fake.provider();
    assert!(p.capabilities().supports(Feature::Start));
    let offer = p.plan(&ask(&["US-KS-2"])).await.unwrap().remove(0);
    let prepared = drive::prepare(p.clone(), &offer, &spec_for("trainer"))
        .await
        .unwrap();
    let id = p
        .create(&offer, &prepared, &spec_for("trainer"))
        .await
        .unwrap();
    until_running(&p, "US-KS-2", "trainer").await;
    let action = format!("{PODS}/{id}/action");
    let stop = |fake: &Fake| {
        let r = fake
            .world
            .lock()
            .unwrap()
            .action(&action, &json!({"action": "stop"}));
        assert_eq!(r.status, 200);
    };

    stop(&fake);
    let o = p.observe(&at("US-KS-2"), "trainer").await.unwrap();
    assert_eq!(
        (
            o[0].instance_id.as_str(),
            o[0].status.clone(),
            o[0].ssh.clone()
        ),
        (id.as_str(), InstanceStatus::Stopped, None)
    );
    p.start(&at("US-KS-2"), "trainer", &id).await.unwrap();
    let sent = fake.server.requests_to("POST", &action);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].body, Some(json!({"action": "start"})));
    let seen = until_running(&p, "US-KS-2", "trainer").await;
    assert_eq!(seen[0], InstanceStatus::Pending, "STARTING first: {seen:?}");
    assert_eq!(fake.creates().len(), 1, "the same pod, not a new one");

    // Already running: the 409 is success once getPod shows it RUNNING.
    p.start(&at("US-KS-2"), "trainer", &id).await.unwrap();
    assert_eq!(
        fake.server
            .requests_to("GET", &format!("{PODS}/{id}"))
            .len(),
        1
    );

    // No free GPU to start it on: Capacity, and the pod stays stopped.
    stop(&fake);
    fake.world.lock().unwrap().fault(
        "POST",
        &action,
        Canned::status(
            400,
            problem(
                400,
                "There are not enough free GPUs on the host machine to start this pod.",
            ),
        ),
    );
    let e = p.start(&at("US-KS-2"), "trainer", &id).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Capacity, "{e}");
    assert!(e.msg.contains("not enough free GPUs"), "{e}");
    let o = p.observe(&at("US-KS-2"), "trainer").await.unwrap();
    assert_eq!(o[0].status, InstanceStatus::Stopped);

    // Gone: not found is Failed, never success.
    let e = p
        .start(&at("US-KS-2"), "trainer", "podgone")
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Failed, "{e}");
    fake.server.verify();
}

/// A local server standing in for a proxy in front of RunPod (not RunPod itself, so not
/// spec-checked): every request gets `status` with a `content_type` body.
async fn proxy_answering(status: u16, content_type: &str, body: String) -> wiremock::MockServer {
    let server = wiremock::MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::any())
        .respond_with(
            wiremock::ResponseTemplate::new(status).set_body_raw(body.into_bytes(), content_type),
        )
        .mount(&server)
        .await;
    server
}

fn provider_at(endpoint: String) -> RunpodProvider {
    RunpodProvider::new(RunpodSettings {
        endpoint: Some(endpoint),
        api_key: Some(ApiKey::new(SENTINEL)),
        key_source: "test".into(),
        lineage: LINEAGE.parse().unwrap(),
    })
}

/// Issue 12 item 7: an error body that is not RunPod's problem document (a proxy's HTML
/// page, plain text) is shown as one short line naming the status and the content type,
/// never the dumped page; the kind still follows the status.
#[tokio::test]
async fn a_proxy_page_becomes_one_short_line() {
    let page = format!(
        "<!DOCTYPE html>\n<html>\n<head><title>502 Bad Gateway</title></head>\n<body>\n\
         <center><h1>502 Bad Gateway</h1></center>\n{}</body>\n</html>\n",
        "<hr><center>nginx</center>\n".repeat(100)
    );
    let proxy = proxy_answering(502, "text/html; charset=utf-8", page).await;
    let e = provider_at(proxy.uri())
        .plan(&ask(&["US-KS-2"]))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient, "{e}");
    assert_eq!(
        e.msg,
        "runpod list GPU types (SECURE cloud): HTTP 502 (text/html): 502 Bad Gateway"
    );

    let proxy = proxy_answering(
        403,
        "text/plain",
        "Forbidden by policy\nrequest id 42".into(),
    )
    .await;
    let e = provider_at(proxy.uri())
        .observe(&at("US-KS-2"), "trainer")
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Credentials, "{e}");
    // The hint is the error's help now, shown after the message (`text`).
    assert!(
        e.text()
            .starts_with("runpod list pods: HTTP 403 (text/plain): Forbidden by policy;"),
        "{e}"
    );
    assert!(e
        .help
        .as_deref()
        .unwrap_or_default()
        .contains("RUNPOD_API_KEY"));
    assert!(!e.msg.contains("request id"), "{e}");
}

/// Issue 12 item 7: an endpoint that refuses the connection is `Unreachable` at once (the
/// core then blocks the whole cloud), with the endpoint shown redacted.
#[tokio::test]
async fn a_closed_port_is_unreachable_at_once() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    let p = provider_at(format!("http://user:hunter2@127.0.0.1:{port}"));
    let started = Instant::now();
    for e in [
        p.plan(&ask(&["US-KS-2"])).await.unwrap_err(),
        p.observe(&at("US-KS-2"), "trainer").await.unwrap_err(),
        p.delete(&at("US-KS-2"), "trainer", &["p1".into()])
            .await
            .unwrap_err(),
        p.start(&at("US-KS-2"), "trainer", "p1").await.unwrap_err(),
    ] {
        assert_eq!(e.kind, ErrorKind::Unreachable, "{e}");
        assert!(e.msg.contains("refused"), "{e}");
        assert!(
            e.msg.contains(&format!("REDACTED@127.0.0.1:{port}")) && !e.msg.contains("hunter2"),
            "{e}"
        );
        assert!(!e.msg.contains(SENTINEL), "{e}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "no retry inside the adapter"
    );
}

/// RunPod declares the rates of its `RateLimit-Policy` header as the API description
/// documents them: 60 a minute, 3,000 an hour, 50,000 a day.
#[test]
fn the_documented_rate_limits_are_declared_with_their_source() {
    let caps = RunpodProvider::default_capabilities();
    let windows: Vec<(u32, u64)> = caps
        .rate_limits
        .iter()
        .map(|l| {
            assert_eq!(l.class, None);
            (l.requests, l.per.as_secs())
        })
        .collect();
    assert_eq!(windows, vec![(60, 60), (3000, 3600), (50_000, 86_400)]);
    let doc = spec::runpod();
    let example = doc.doc()["components"]["schemas"]["RateLimitPolicyHeader"]["examples"][0]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        example,
        "\"minute\";q=60;w=60, \"hour\";q=3000;w=3600, \"day\";q=50000;w=86400"
    );
}
