//! The Hyperstack adapter against a local fake of the Infrahub API whose every request and
//! every response is checked against Hyperstack's own OpenAPI description
//! (`tests/it/support/spec.rs`, `spec::hyperstack()`). The launch and teardown machines run
//! for real through the executor with a `MemoryJournal`; SSH is the `FakeConnector` (VMs
//! get 127.0.0.x floating IPs only, nothing is dialled).

use crate::support::drive;
use crate::support::spec;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drive::{LINEAGE, PUBKEY};
use gpuprov::config::Cloud;
use gpuprov::machine::MemoryJournal;
use gpuprov::provider::clouds::hyperstack::{ApiKey, HyperstackProvider, HyperstackSettings};
use gpuprov::provider::{
    BootScript, CloudProvider, ErrorKind, Feature, InstanceSpec, InstanceStatus, Location,
    ResourceRequest,
};
use gpuprov::vm::{LaunchState, Target, TeardownState};
use serde_json::{json, Value};
use spec::{Canned, Seen, SpecServer};

/// A sentinel API key: it must never appear in any error, reason or journal entry.
pub(crate) const SENTINEL: &str = "secret_sentinel_key_7f3a9c";
pub(crate) const VMS: &str = "/v1/core/virtual-machines";
pub(crate) const ENV_CA: &str = "gpuprov-0f0e0d0c-canada-1";
const VM_NAME: &str = "gpuprov-trainer-0f0e0d0c";
pub(crate) const H100: &str = "H100-80G-PCIe";

/// The fake Hyperstack organisation.
#[derive(Default)]
pub(crate) struct World {
    /// (region, flavor name, GPU model, GPU count, root disk GB, stock_available)
    flavors: Vec<(String, String, String, u32, u32, bool)>,
    /// (region, GPU model) → configuration (`8x`) → count
    stocks: BTreeMap<(String, String), BTreeMap<String, i64>>,
    /// (name, USD per hour)
    prices: Vec<(String, f64)>,
    pub(crate) environments: Vec<Value>,
    pub(crate) keypairs: Vec<Value>,
    pub(crate) vms: Vec<Value>,
    /// Per VM id: listings it has been through.
    ages: BTreeMap<i64, u32>,
    /// Listings a new VM stays `CREATING`.
    creating_for: u32,
    /// Listings an `ACTIVE` VM shows its floating IP as `ATTACHING`.
    attach_lag: u32,
    /// Per (method, path): error responses served before the normal behaviour.
    faults: BTreeMap<(String, String), VecDeque<Canned>>,
    pub(crate) next: i64,
    /// Every fault's message echoes the `api_key` header (a hostile server), to prove the
    /// adapter scrubs the key.
    pub(crate) echo_key: bool,
    /// Delete requests refused because the VM was still being created.
    refused_deletes: u32,
    /// Key pairs that hold their name in their environment but that the listing does not
    /// show (yet): an import under such a name is refused like any duplicate.
    unlisted_keypairs: Vec<Value>,
}

pub(crate) fn err(message: &str, reason: &str) -> Value {
    json!({"status": false, "message": message, "error_reason": reason})
}

pub(crate) fn env_json(id: i64, name: &str, region: &str) -> Value {
    json!({"id": id, "name": name, "region": region, "created_at": "2026-11-30T20:00:00Z",
           "features": {"network_optimised": false}})
}

impl World {
    /// Side resources on the account: environments and key pairs (listed or not).
    pub(crate) fn side_resources(&self) -> usize {
        self.environments.len() + self.keypairs.len() + self.unlisted_keypairs.len()
    }

    pub(crate) fn with_flavor(
        mut self,
        region: &str,
        name: &str,
        gpu: &str,
        n: u32,
        stock: i64,
    ) -> Self {
        self.flavors
            .push((region.into(), name.into(), gpu.into(), n, 100, stock > 0));
        self.stocks
            .entry((region.into(), gpu.into()))
            .or_default()
            .insert(format!("{n}x"), stock);
        self
    }

    pub(crate) fn with_price(mut self, name: &str, usd: f64) -> Self {
        self.prices.push((name.into(), usd));
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
        if self.echo_key {
            let key = req
                .headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("api_key"))
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            if let Some(b) = c.body.as_mut() {
                let m = b["message"].as_str().unwrap_or_default().to_string();
                b["message"] = json!(format!("{m} [api_key {key}]"));
            }
        }
        Some(c)
    }

    fn flavors(&self, region: Option<&str>) -> Canned {
        let mut groups: BTreeMap<(String, String), Vec<Value>> = BTreeMap::new();
        for (i, (r, name, gpu, n, disk, stock)) in self.flavors.iter().enumerate() {
            if region.is_some_and(|q| q != r) {
                continue;
            }
            groups
                .entry((r.clone(), gpu.clone()))
                .or_default()
                .push(json!({
                    "id": i + 1, "name": name, "display_name": name, "region_name": r,
                    "cpu": 28 * n, "ram": 180.0 * *n as f64, "disk": disk, "ephemeral": 750 * n,
                    "gpu": gpu, "gpu_count": n, "stock_available": stock,
                    "created_at": "2026-01-01T00:00:00Z", "labels": [], "features": {}
                }));
        }
        let data: Vec<Value> = groups
            .into_iter()
            .map(|((r, gpu), flavors)| json!({"gpu": gpu, "region_name": r, "flavors": flavors}))
            .collect();
        Canned::ok(json!({"status": true, "message": "Success", "data": data}))
    }

    fn stocks(&self) -> Canned {
        let mut by_region: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for ((r, model), cfg) in &self.stocks {
            let mut c = json!({"1x": 0, "2x": 0, "4x": 0, "8x": 0, "10x": 0});
            for (k, v) in cfg {
                c[k] = json!(v);
            }
            by_region.entry(r.clone()).or_default().push(json!({
                "model": model, "available": cfg.values().sum::<i64>().to_string(),
                "planned_7_days": "0", "planned_30_days": "0", "planned_100_days": "0",
                "configurations": c
            }));
        }
        let stocks: Vec<Value> = by_region
            .into_iter()
            .map(|(r, models)| json!({"region": r, "stock-type": "GPU", "models": models}))
            .collect();
        Canned::ok(json!({"stocks": stocks}))
    }

    fn pricebook(&self) -> Canned {
        let items: Vec<Value> = self
            .prices
            .iter()
            .enumerate()
            .map(|(i, (n, v))| {
                json!({"id": i + 1, "name": n, "value": v, "original_value": v,
                       "discount_applied": false, "start_time": "2026-01-01T00:00:00Z"})
            })
            .collect();
        Canned::ok(json!(items))
    }

    fn env(&self, name: &str) -> Option<Value> {
        self.environments
            .iter()
            .find(|e| e["name"] == name)
            .cloned()
    }

    fn create_env(&mut self, body: &Value) -> Canned {
        let name = body["name"].as_str().unwrap_or_default();
        if self.env(name).is_some() {
            return Canned::status(409, err("Environment name already exists", "conflict"));
        }
        self.next += 1;
        let e = env_json(self.next, name, body["region"].as_str().unwrap_or_default());
        self.environments.push(e.clone());
        Canned::ok(json!({"status": true, "message": "Environment created", "environment": e}))
    }

    /// `POST /core/keypairs`. A name already taken in the environment is refused with
    /// `409` (the description's only documented conflict for `Import_key_pair`; its text
    /// is not documented, this one is made up).
    fn import_key(&mut self, body: &Value) -> Canned {
        let Some(env) = self.env(body["environment_name"].as_str().unwrap_or_default()) else {
            return Canned::status(404, err("Environment not found", "not_found"));
        };
        let taken = self
            .keypairs
            .iter()
            .chain(&self.unlisted_keypairs)
            .any(|k| k["name"] == body["name"] && k["environment"]["name"] == env["name"]);
        if taken {
            return Canned::status(
                409,
                err(
                    &format!(
                        "Keypair with name {} already exists in this environment",
                        body["name"].as_str().unwrap_or_default()
                    ),
                    "conflict",
                ),
            );
        }
        self.next += 1;
        let k = json!({
            "id": self.next, "name": body["name"], "public_key": body["public_key"],
            "fingerprint": "aa:bb", "environment": env, "created_at": "2026-11-30T20:00:00Z"
        });
        self.keypairs.push(k.clone());
        Canned::ok(json!({"status": true, "message": "Keypair imported", "keypair": k}))
    }

    /// `DELETE /core/environments/{id}`. An environment that still holds key pairs or VMs
    /// is refused with `400` (the description declares no other refusal; the text is made
    /// up); a missing one is `404`.
    fn delete_env(&mut self, path: &str) -> Canned {
        let id: i64 = path
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .parse()
            .unwrap_or(-1);
        let Some(e) = self.environments.iter().find(|e| e["id"] == id).cloned() else {
            return Canned::status(404, err("Environment not found", "not_found"));
        };
        let holds_key = self
            .keypairs
            .iter()
            .any(|k| k["environment"]["name"] == e["name"]);
        let holds_vm = self
            .vms
            .iter()
            .any(|v| v["environment"]["name"] == e["name"] && v["status"] != "DELETED");
        if holds_key || holds_vm {
            return Canned::status(
                400,
                err(
                    "Environment cannot be deleted while it has resources",
                    "bad_request",
                ),
            );
        }
        self.environments.retain(|x| x["id"] != id);
        Canned::ok(json!({"status": true, "message": "Environment deleted"}))
    }

    /// `DELETE /core/keypair/{id}` (singular, as the description spells it).
    fn delete_key(&mut self, path: &str) -> Canned {
        let id: i64 = path
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .parse()
            .unwrap_or(-1);
        let before = self.keypairs.len();
        self.keypairs.retain(|k| k["id"] != id);
        if self.keypairs.len() == before {
            return Canned::status(404, err("Keypair not found", "not_found"));
        }
        Canned::ok(json!({"status": true, "message": "Keypair deleted"}))
    }

    fn create_vm(&mut self, body: &Value) -> Canned {
        let Some(env) = self.env(body["environment_name"].as_str().unwrap_or_default()) else {
            return Canned::status(404, err("Environment not found", "not_found"));
        };
        // The key pair must be one of the environment's.
        let has_key = self
            .keypairs
            .iter()
            .any(|k| k["name"] == body["key_name"] && k["environment"]["name"] == env["name"]);
        if !has_key {
            return Canned::status(404, err("Keypair not found in environment", "not_found"));
        }
        let region = env["region"].as_str().unwrap_or_default().to_string();
        let flavor = body["flavor_name"].as_str().unwrap_or_default();
        let Some((_, _, gpu, n, disk, _)) = self
            .flavors
            .iter()
            .find(|f| f.0 == region && f.1 == flavor)
            .cloned()
        else {
            return Canned::status(400, err("Invalid flavor for this region", "bad_request"));
        };
        let stock = self
            .stocks
            .get(&(region.clone(), gpu.clone()))
            .and_then(|c| c.get(&format!("{n}x")).copied())
            .unwrap_or(0);
        if stock <= 0 {
            return Canned::status(
                400,
                err(
                    &format!("Not enough stock available for flavor {flavor} in {region}"),
                    "out_of_stock",
                ),
            );
        }
        self.next += 1;
        let id = self.next;
        let rules: Vec<Value> = body["security_rules"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(i, mut r)| {
                r["id"] = json!(i + 1);
                r["status"] = json!("SUCCESS");
                r["created_at"] = json!("2026-11-30T20:00:00Z");
                r
            })
            .collect();
        let vm = json!({
            "id": id, "name": body["name"], "status": "CREATING", "vm_state": "building",
            "power_state": "NOSTATE", "fixed_ip": format!("10.0.0.{id}"),
            "environment": {"id": env["id"], "name": env["name"], "region": region, "org_id": 1},
            "flavor": {"id": 1, "name": flavor, "cpu": 28 * n, "ram": 180.0 * n as f64,
                       "disk": disk, "gpu": gpu, "gpu_count": n},
            "image": {"name": body["image_name"]}, "keypair": {"name": body["key_name"]},
            "labels": body["labels"], "security_rules": rules,
            "created_at": "2026-11-30T20:00:00Z", "locked": false,
            "port_randomization": body["enable_port_randomization"],
            "requires_public_ip": body["assign_floating_ip"], "os": "Ubuntu"
        });
        self.vms.push(vm.clone());
        self.ages.insert(id, 0);
        Canned::ok(json!({"status": true, "message": "Creating", "instances": [vm]}))
    }

    /// The list as Hyperstack shows it now; then every VM moves one step:
    /// CREATING (for `creating_for` listings) → BUILD → ACTIVE with the floating IP
    /// ATTACHING (for `attach_lag` listings) → ATTACHED; DELETING → gone.
    fn list_vms(&mut self, q: &[(String, String)]) -> Canned {
        let get = |k: &str| q.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let env = get("environment");
        let search = get("search");
        let shown: Vec<Value> = self
            .vms
            .iter()
            .filter(|v| env.as_deref().is_none_or(|e| v["environment"]["name"] == e))
            .filter(|v| {
                search
                    .as_deref()
                    .is_none_or(|s| v["name"].as_str().unwrap_or_default().contains(s))
            })
            .cloned()
            .collect();
        let (creating_for, attach_lag) = (self.creating_for, self.attach_lag);
        for v in self.vms.iter_mut() {
            let id = v["id"].as_i64().unwrap();
            let age = self.ages.entry(id).or_default();
            *age += 1;
            match v["status"].as_str().unwrap_or_default() {
                "CREATING" if *age > creating_for => v["status"] = json!("BUILD"),
                "BUILD" => {
                    v["status"] = json!("ACTIVE");
                    v["vm_state"] = json!("active");
                    v["power_state"] = json!("RUNNING");
                    v["floating_ip"] = json!(format!("127.0.0.{}", 10 + id));
                    v["floating_ip_status"] = json!("ATTACHING");
                    *age = 0;
                }
                "ACTIVE" if v["floating_ip_status"] == "ATTACHING" && *age > attach_lag => {
                    v["floating_ip_status"] = json!("ATTACHED")
                }
                // A start: the VM keeps its floating IP across a stop.
                "STARTING" => {
                    v["status"] = json!("ACTIVE");
                    v["vm_state"] = json!("active");
                    v["power_state"] = json!("RUNNING");
                }
                _ => {}
            }
        }
        self.vms.retain(|v| v["status"] != "DELETED");
        for v in self.vms.iter_mut() {
            if v["status"] == "DELETING" {
                v["status"] = json!("DELETED");
            }
        }
        Canned::ok(
            json!({"status": true, "message": "Success", "instances": shown,
                          "count": shown.len(), "page": 1, "page_size": 100}),
        )
    }

    fn vm_mut(&mut self, path: &str) -> Option<&mut Value> {
        let id: i64 = path
            .trim_start_matches(VMS)
            .trim_start_matches('/')
            .split('/')
            .next()
            .unwrap_or_default()
            .parse()
            .unwrap_or(-1);
        self.vms
            .iter_mut()
            .find(|v| v["id"] == id && v["status"] != "DELETED")
    }

    /// `GET /core/virtual-machines/{id}` (`Get_VM`).
    fn get_vm(&mut self, path: &str) -> Canned {
        match self.vm_mut(path) {
            Some(v) => Canned::ok(json!({"status": true, "message": "Success", "instance": v})),
            None => Canned::status(404, err("Virtual machine not found", "not_found")),
        }
    }

    /// `GET /core/virtual-machines/{id}/stop` (`Stop_VM`): an `ACTIVE` VM is `SHUTOFF`
    /// (vendor docs: `STOPPING → SHUTOFF`; the fake skips `STOPPING`).
    pub(crate) fn stop_vm(&mut self, path: &str) -> Canned {
        let Some(v) = self.vm_mut(path) else {
            return Canned::status(404, err("Virtual machine not found", "not_found"));
        };
        if v["status"] != "ACTIVE" {
            return Canned::status(400, err("Virtual machine is not active", "bad_request"));
        }
        v["status"] = json!("SHUTOFF");
        v["vm_state"] = json!("stopped");
        v["power_state"] = json!("SHUTDOWN");
        Canned::ok(json!({"status": true, "message": "Virtual machine stopping"}))
    }

    /// `GET /core/virtual-machines/{id}/start` (`Start_VM`): a `SHUTOFF` VM is
    /// `STARTING`, then `ACTIVE` at the next listing; a VM in another state is refused
    /// with `400` (the description declares no other refusal; the text is made up).
    fn start_vm(&mut self, path: &str) -> Canned {
        let Some(v) = self.vm_mut(path) else {
            return Canned::status(404, err("Virtual machine not found", "not_found"));
        };
        if v["status"] != "SHUTOFF" {
            let msg = format!(
                "Cannot start a virtual machine in {} state",
                v["status"].as_str().unwrap_or_default()
            );
            return Canned::status(400, err(&msg, "bad_request"));
        }
        v["status"] = json!("STARTING");
        v["vm_state"] = json!("stopped");
        v["power_state"] = json!("SHUTDOWN");
        Canned::ok(json!({"status": true, "message": "Virtual machine starting"}))
    }

    fn delete_vm(&mut self, path: &str) -> Canned {
        let id: i64 = path
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .parse()
            .unwrap_or(-1);
        let Some(v) = self
            .vms
            .iter_mut()
            .find(|v| v["id"] == id && v["status"] != "DELETED")
        else {
            return Canned::status(404, err("Virtual machine not found", "not_found"));
        };
        if v["status"] == "CREATING" {
            self.refused_deletes += 1;
            return Canned::status(
                400,
                err(
                    "Virtual machine cannot be deleted while it is in CREATING state",
                    "Please try again later",
                ),
            );
        }
        v["status"] = json!("DELETING");
        Canned::ok(json!({"status": true, "message": "Virtual machine deleting"}))
    }
}

pub(crate) struct Fake {
    pub(crate) server: SpecServer,
    pub(crate) world: Arc<Mutex<World>>,
}

impl Fake {
    pub(crate) async fn start(world: World) -> Fake {
        let server = SpecServer::start(Arc::new(spec::hyperstack())).await;
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
        route!("GET", "^/v1/core/flavors$", |w, r| {
            let region = r
                .query
                .iter()
                .find(|(k, _)| k == "region")
                .map(|(_, v)| v.clone());
            w.flavors(region.as_deref())
        });
        route!("GET", "^/v1/core/stocks$", |w, _r| w.stocks());
        route!("GET", "^/v1/pricebook$", |w, _r| w.pricebook());
        route!("GET", "^/v1/core/environments$", |w, _r| {
            let n = w.environments.len();
            Canned::ok(json!({"status": true, "message": "Success",
                "environments": w.environments, "count": n, "page": 1, "page_size": 100}))
        });
        route!("POST", "^/v1/core/environments$", |w, r| {
            let b = r.body.clone().unwrap_or_default();
            w.create_env(&b)
        });
        route!("DELETE", "^/v1/core/environments/[0-9]+$", |w, r| w
            .delete_env(&r.path));
        route!("DELETE", "^/v1/core/keypair/[0-9]+$", |w, r| w
            .delete_key(&r.path));
        route!("GET", "^/v1/core/keypairs$", |w, _r| {
            let n = w.keypairs.len();
            Canned::ok(json!({"status": true, "message": "Success",
                "keypairs": w.keypairs, "count": n, "page": 1, "page_size": 100}))
        });
        route!("POST", "^/v1/core/keypairs$", |w, r| {
            let b = r.body.clone().unwrap_or_default();
            w.import_key(&b)
        });
        route!("GET", "^/v1/core/images$", |_w, r| {
            let region = r
                .query
                .iter()
                .find(|(k, _)| k == "region")
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            let img = |id: i64, name: &str| {
                json!({"id": id, "name": name, "region_name": region, "type": "Ubuntu",
                       "version": "22.04", "size": 10, "display_size": "10 GB",
                       "is_public": true, "labels": []})
            };
            Canned::ok(json!({"status": true, "message": "Success", "images": [{
                "region_name": region, "type": "Ubuntu", "logo": "",
                "images": [
                    img(1, "Ubuntu Server 22.04 LTS"),
                    img(2, "Ubuntu Server 22.04 LTS R535 CUDA 12.2"),
                ]
            }]}))
        });
        route!("GET", "^/v1/core/virtual-machines$", |w, r| w
            .list_vms(&r.query));
        route!("POST", "^/v1/core/virtual-machines$", |w, r| {
            let b = r.body.clone().unwrap_or_default();
            w.create_vm(&b)
        });
        route!("DELETE", "^/v1/core/virtual-machines/[^/]+$", |w, r| w
            .delete_vm(&r.path));
        route!("GET", "^/v1/core/virtual-machines/[0-9]+$", |w, r| w
            .get_vm(&r.path));
        route!("GET", "^/v1/core/virtual-machines/[0-9]+/start$", |w, r| w
            .start_vm(&r.path));
        route!("GET", "^/v1/core/virtual-machines/[0-9]+/stop$", |w, r| w
            .stop_vm(&r.path));
        Fake { server, world }
    }

    fn endpoint(&self) -> String {
        format!("{}/v1", self.server.uri())
    }

    fn provider_with_key(&self, key: Option<&str>) -> Arc<HyperstackProvider> {
        let caps = drive::test_capabilities(HyperstackProvider::default_capabilities());
        Arc::new(
            HyperstackProvider::new(HyperstackSettings {
                endpoint: Some(self.endpoint()),
                api_key: key.map(ApiKey::new),
                lineage: LINEAGE.parse().unwrap(),
            })
            .with_capabilities(caps),
        )
    }

    pub(crate) fn provider(&self) -> Arc<HyperstackProvider> {
        self.provider_with_key(Some(SENTINEL))
    }

    pub(crate) fn creates(&self) -> Vec<Value> {
        self.server
            .requests_to("POST", VMS)
            .into_iter()
            .filter_map(|r| r.body)
            .collect()
    }
}

/// The shared launch/teardown harness over this vendor's local server.
type Run = drive::Run<Fake, HyperstackProvider>;

/// A run of `trainer` asking for 8 × H100 against a server serving `world`.
async fn run(world: World) -> Run {
    let cloud = Fake::start(world).await;
    let provider = cloud.provider();
    Run::new(cloud, provider, drive::gpu_vm(Cloud::Hyperstack, "H100", 8))
}

/// H100 x8 in CANADA-1 and NORWAY-1 (same price), an A100 x1 in CANADA-1.
pub(crate) fn h100_world() -> World {
    World::default()
        .with_flavor("CANADA-1", "n3-H100x8", H100, 8, 2)
        .with_flavor("NORWAY-1", "n3-H100x8", H100, 8, 1)
        .with_flavor("CANADA-1", "n3-A100x1", "A100-80G-PCIe", 1, 5)
        .with_price(H100, 1.9)
        .with_price("A100-80G-PCIe", 1.35)
}

/// The name the project key pair is imported under (`provider::project_key_name`).
fn key_name() -> String {
    gpuprov::provider::project_key_name(LINEAGE, PUBKEY)
}

fn loc(region: &str) -> Location {
    Location {
        cloud: "hyperstack".into(),
        region: region.into(),
        zone: None,
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

fn instance_spec() -> InstanceSpec {
    InstanceSpec {
        vm_name: "trainer".into(),
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

#[tokio::test]
async fn full_launch_then_teardown_against_the_spec() {
    let mut r = run(h100_world()).await;
    r.vm.ports = vec![8080];
    r.vm.regions = vec!["CANADA-1".into()];
    let end = r.launch().await.unwrap();
    let vm = end
        .ready()
        .unwrap_or_else(|| panic!("not ready: {end:?} {:?}", r.labels()));
    assert_eq!(vm.offer.id, "hyperstack/CANADA-1/n3-H100x8");
    assert_eq!(vm.offer.price_per_hour, 15.2, "1.90 USD per GPU-hour × 8");
    assert_eq!(vm.user, "ubuntu");
    assert_eq!(vm.ssh.port, 22);
    assert!(vm.ssh.host.starts_with("127.0.0."), "{}", vm.ssh.host);
    assert_eq!(r.connector.logins(), 1);

    // Every request carried the key in the `api_key` header.
    for q in r.cloud.server.requests() {
        assert!(
            q.headers
                .iter()
                .any(|(k, v)| k.eq_ignore_ascii_case("api_key") && v == SENTINEL),
            "{} {} without api_key",
            q.method,
            q.path
        );
    }
    // prepare: the environment of the region, then the key imported into it.
    let envs = r.cloud.server.requests_to("POST", "/v1/core/environments");
    assert_eq!(envs.len(), 1);
    assert_eq!(
        envs[0].body.clone().unwrap(),
        json!({"name": ENV_CA, "region": "CANADA-1"})
    );
    let keys = r.cloud.server.requests_to("POST", "/v1/core/keypairs");
    assert_eq!(keys.len(), 1);
    assert_eq!(
        keys[0].body.clone().unwrap(),
        json!({"environment_name": ENV_CA, "name": key_name(), "public_key": PUBKEY})
    );

    // create: one VM, named, labelled, public IP, port 22 kept, rules for 22 and 8080.
    let creates = r.cloud.creates();
    assert_eq!(creates.len(), 1);
    let b = &creates[0];
    assert_eq!(b["name"], VM_NAME);
    assert_eq!(b["environment_name"], ENV_CA);
    assert_eq!(b["flavor_name"], "n3-H100x8");
    assert_eq!(b["key_name"], key_name());
    assert_eq!(b["image_name"], "Ubuntu Server 22.04 LTS R535 CUDA 12.2");
    assert_eq!(b["count"], 1);
    assert_eq!(b["assign_floating_ip"], true);
    assert_eq!(b["enable_port_randomization"], false);
    assert_eq!(
        b["labels"],
        json!([
            "gpuprov-vm-name=trainer",
            format!("gpuprov-lineage={LINEAGE}")
        ])
    );
    let ports: Vec<(Value, Value, Value)> = b["security_rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["protocol"].clone(),
                r["port_range_min"].clone(),
                r["direction"].clone(),
            )
        })
        .collect();
    assert_eq!(
        ports,
        [
            (json!("tcp"), json!(22), json!("ingress")),
            (json!("tcp"), json!(8080), json!("ingress"))
        ]
    );
    assert!(b.get("user_data").is_none(), "no boot script, no user_data");

    // observe: by the project's environment (exact match); the core observes the whole
    // location (`observe_location`), so without the per-VM `search`.
    let lists = r.cloud.server.requests_to("GET", VMS);
    assert!(!lists.is_empty());
    for l in &lists {
        let q = &l.query;
        assert!(q.contains(&("environment".into(), ENV_CA.into())), "{q:?}");
        assert!(
            q.contains(&("exact_environment_match".into(), "true".into())),
            "{q:?}"
        );
    }
    // Observed alone, one VM is listed by its exact name too.
    let before = lists.len();
    let seen = r.provider.observe(&vm.location, "trainer").await.unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].instance_id, vm.instance_id);
    let lists = r.cloud.server.requests_to("GET", VMS);
    let q = &lists[before].query;
    assert!(q.contains(&("search".into(), VM_NAME.into())), "{q:?}");

    let labels = r.labels();
    assert!(
        labels.iter().any(|l| l.starts_with("booting")),
        "{labels:?}"
    );
    assert!(labels.last().unwrap().starts_with("ready"), "{labels:?}");

    // Teardown: delete, wait until gone, nothing else to clean up.
    let end = r
        .teardown_with(
            Target::new(vm.location.clone(), "trainer", vec![vm.instance_id.clone()]),
            Arc::new(MemoryJournal::new()),
        )
        .await;
    assert_eq!(end, TeardownState::Done);
    let d = r
        .cloud
        .server
        .requests_to("DELETE", &format!("{VMS}/{}", vm.instance_id));
    assert_eq!(d.len(), 1);
    assert!(r.cloud.world.lock().unwrap().vms.is_empty());
    // The environment and the key pair are shared per project and region: they stay.
    assert_eq!(r.cloud.world.lock().unwrap().environments.len(), 1);
    assert_eq!(r.cloud.world.lock().unwrap().keypairs.len(), 1);
    assert!(r
        .provider
        .observe(&vm.location, "trainer")
        .await
        .unwrap()
        .is_empty());
    r.cloud.server.verify();
}

#[tokio::test]
async fn not_ready_until_the_floating_ip_is_attached() {
    let mut world = h100_world();
    world.attach_lag = 3;
    let fake = Fake::start(world).await;
    let p = fake.provider();
    let offer = p.plan(&ask(&["CANADA-1"])).await.unwrap().remove(0);
    let spec = instance_spec();
    let prepared = drive::prepare(p.clone(), &offer, &spec).await.unwrap();
    let id = p.create(&offer, &prepared, &spec).await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..10 {
        let o = p.observe(&loc("CANADA-1"), "trainer").await.unwrap();
        assert_eq!(o.len(), 1);
        assert_eq!(o[0].instance_id, id);
        let v = fake.world.lock().unwrap().vms[0].clone();
        seen.push((
            v["status"].clone(),
            v["floating_ip_status"].clone(),
            o[0].status.clone(),
            o[0].ssh.is_some(),
        ));
        if o[0].status == InstanceStatus::Running {
            break;
        }
    }
    // (`v` is the state after the listing moved it on; the observation is of the one before.)
    let running: Vec<_> = seen
        .iter()
        .filter(|s| s.2 == InstanceStatus::Running)
        .collect();
    assert_eq!(running.len(), 1, "{seen:?}");
    assert!(running[0].3, "Running comes with the SSH endpoint");
    let active_unattached = seen
        .windows(2)
        .filter(|w| {
            w[0].0 == "ACTIVE" && w[0].1 == "ATTACHING" && w[1].2 == InstanceStatus::Pending
        })
        .count();
    assert!(
        active_unattached >= 2,
        "ACTIVE with the IP still attaching is Pending: {seen:?}"
    );
    for s in &seen {
        if s.2 == InstanceStatus::Pending {
            assert!(!s.3, "no SSH endpoint before the IP is attached: {seen:?}");
        }
    }

    // The launch machine waits for the same thing.
    let mut world = h100_world();
    world.attach_lag = 3;
    let r = run(world).await;
    let end = r.launch().await.unwrap();
    assert!(end.ready().is_some(), "{end:?}");
    assert_eq!(
        r.connector.logins(),
        1,
        "SSH was tried only once the IP was attached"
    );
    fake.server.verify();
    r.cloud.server.verify();
}

/// Field report: Hyperstack refuses to delete a VM that is still `CREATING` (HTTP 400
/// `ErrorResponseModel`). The adapter must surface it as `Transient`, the teardown machine
/// must retry until the server allows the delete, and the refusal must never be taken for
/// a deletion.
#[tokio::test]
async fn hyperstack_delete_refusal_during_creation() {
    let mut world = h100_world();
    world.creating_for = 3;
    let r = run(world).await;
    let p = r.provider.clone();
    let offer = p.plan(&ask(&["CANADA-1"])).await.unwrap().remove(0);
    let spec = instance_spec();
    let prepared = drive::prepare(p.clone(), &offer, &spec).await.unwrap();
    let id = p.create(&offer, &prepared, &spec).await.unwrap();

    // The adapter on its own: the refusal is Transient, and the VM is still there.
    let e = p
        .delete(&loc("CANADA-1"), "trainer", std::slice::from_ref(&id))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient, "{e}");
    assert!(e.msg.contains("CREATING"), "{e}");
    assert_eq!(r.cloud.world.lock().unwrap().vms[0]["status"], "CREATING");

    // The teardown machine retries (observing each time, which lets the fake move on)
    // until the delete is accepted, then waits for the VM to go.
    let journal = Arc::new(MemoryJournal::new());
    let end = r
        .teardown_with(
            Target::new(loc("CANADA-1"), "trainer", vec![id.clone()]),
            journal.clone(),
        )
        .await;
    assert_eq!(end, TeardownState::Done);
    let w = r.cloud.world.lock().unwrap();
    assert!(
        w.refused_deletes >= 2,
        "refused {} times",
        w.refused_deletes
    );
    assert!(w.vms.is_empty());
    drop(w);
    let deletes = r.cloud.server.requests_to("DELETE", &format!("{VMS}/{id}"));
    assert!(deletes.len() >= 3, "{}", deletes.len());
    // The journal: Requesting until the accepted delete, never AwaitingGone/Done before.
    let states: Vec<String> = journal.history().into_iter().map(|(_, l)| l).collect();
    assert!(states[0].starts_with("deleting at"), "{states:?}");
    let awaiting = states
        .iter()
        .position(|l| l.starts_with("awaiting deletion"))
        .unwrap_or_else(|| panic!("{states:?}"));
    assert!(
        states[..awaiting]
            .iter()
            .all(|l| l.starts_with("deleting at")),
        "{states:?}"
    );
    assert_eq!(states.last().unwrap(), "destroyed", "{states:?}");
    r.cloud.server.verify();
}

#[tokio::test]
async fn stock_gone_by_prepare_skips_the_offer_without_creating() {
    let mut r = run(h100_world()).await;
    r.vm.regions = vec!["CANADA-1".into(), "NORWAY-1".into()];
    // Stock visible at plan, gone at prepare's re-check.
    let fake_world = r.cloud.world.clone();
    let p = r.provider.clone();
    let offers = p.plan(&ask(&["CANADA-1", "NORWAY-1"])).await.unwrap();
    assert_eq!(offers.len(), 2);
    fake_world
        .lock()
        .unwrap()
        .stocks
        .get_mut(&("CANADA-1".to_string(), H100.to_string()))
        .unwrap()
        .insert("8x".into(), 0);
    let e = drive::prepare(p.clone(), &offers[0], &instance_spec())
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unavailable, "{e}");
    let end = r.launch().await.unwrap();
    assert_eq!(
        end.ready().expect("ready").offer.id,
        "hyperstack/NORWAY-1/n3-H100x8"
    );
    assert_eq!(r.cloud.creates().len(), 1, "nothing created in CANADA-1");
    // A disk larger than the flavor's root disk is Unavailable too (another flavor may fit).
    let mut spec = instance_spec();
    spec.disk_gb = Some(500);
    let e = drive::prepare(p.clone(), &offers[1], &spec)
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unavailable, "{e}");
    assert!(e.msg.contains("100 GB"), "{e}");
    r.cloud.server.verify();
}

#[tokio::test]
async fn a_500_on_create_is_retried_on_the_same_offer() {
    let mut r = run(h100_world()).await;
    r.vm.regions = vec!["CANADA-1".into(), "NORWAY-1".into()];
    r.cloud
        .world
        .lock()
        .unwrap()
        .fault("POST", VMS, Canned::empty(500));
    let end = r.launch().await.unwrap();
    assert_eq!(
        end.ready().expect("ready").offer.id,
        "hyperstack/CANADA-1/n3-H100x8"
    );
    assert_eq!(r.cloud.creates().len(), 2);
    r.cloud.server.verify();
}

#[tokio::test]
async fn deleting_an_unknown_vm_succeeds() {
    let fake = Fake::start(h100_world()).await;
    let p = fake.provider();
    p.delete(&loc("CANADA-1"), "trainer", &["987654".into()])
        .await
        .unwrap();
    assert_eq!(
        fake.server
            .requests_to("DELETE", &format!("{VMS}/987654"))
            .len(),
        1
    );
    // Not a Hyperstack id at all: nothing to delete, no call.
    p.delete(&loc("CANADA-1"), "trainer", &["i-abc".into()])
        .await
        .unwrap();
    p.cleanup(&loc("CANADA-1"), "trainer").await.unwrap();
    // A teardown of a VM the cloud never had ends Done.
    let r = run(h100_world()).await;
    let end = r
        .teardown_with(
            Target::new(loc("CANADA-1"), "trainer", vec!["424242".into()]),
            Arc::new(MemoryJournal::new()),
        )
        .await;
    assert_eq!(end, TeardownState::Done);
    fake.server.verify();
    r.cloud.server.verify();
}

#[tokio::test]
async fn the_api_key_never_appears_in_errors() {
    let r = run(h100_world()).await;
    {
        let mut w = r.cloud.world.lock().unwrap();
        w.echo_key = true;
        w.fault(
            "GET",
            "/v1/core/flavors",
            Canned::status(401, err("Invalid API key", "unauthorized")),
        );
    }
    let end = r.launch().await.unwrap();
    match &end {
        LaunchState::Aborted { reason, .. } => {
            assert!(reason.contains("Invalid API key"), "{reason}");
            assert!(reason.contains("HYPERSTACK_API_KEY"), "{reason}");
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
    {
        let mut w = r.cloud.world.lock().unwrap();
        w.fault(
            "GET",
            VMS,
            Canned::status(401, err("Unauthorized", "bad key")),
        );
        w.fault(
            "DELETE",
            &format!("{VMS}/5"),
            Canned::status(401, err("Unauthorized", "bad key")),
        );
        w.fault(
            "GET",
            "/v1/core/stocks",
            Canned::status(401, err("Unauthorized", "bad key")),
        );
    }
    let offer = gpuprov::provider::Offer {
        id: "hyperstack/CANADA-1/n3-H100x8".into(),
        location: loc("CANADA-1"),
        instance_type: "n3-H100x8".into(),
        gpu: Some(H100.into()),
        gpu_count: 8,
        spot: false,
        price_per_hour: 15.2,
        detail: Value::Null,
        facts: Default::default(),
    };
    let errors = [
        p.observe(&loc("CANADA-1"), "trainer").await.unwrap_err(),
        p.delete(&loc("CANADA-1"), "trainer", &["5".into()])
            .await
            .unwrap_err(),
        drive::prepare(p.clone(), &offer, &instance_spec())
            .await
            .unwrap_err(),
    ];
    for e in &errors {
        assert_eq!(e.kind, ErrorKind::Credentials, "{e}");
        assert!(!e.to_string().contains(SENTINEL), "{e}");
        assert!(!format!("{e:?}").contains(SENTINEL), "{e:?}");
    }
    r.cloud.server.verify();

    // No key at all: a Credentials error naming where it looked, and no request.
    let before = r.cloud.server.requests().len();
    let e = r
        .cloud
        .provider_with_key(None)
        .observe(&loc("CANADA-1"), "trainer")
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Credentials);
    assert!(e.msg.contains("HYPERSTACK_API_KEY"), "{}", e.msg);
    assert_eq!(r.cloud.server.requests().len(), before);
}

#[tokio::test]
async fn environment_and_key_are_found_not_created_twice() {
    let mut world = h100_world();
    world.environments = vec![
        env_json(1, "someone-else", "CANADA-1"),
        env_json(2, ENV_CA, "CANADA-1"),
    ];
    world.keypairs = vec![
        // The project key in another environment: not usable here.
        json!({"id": 3, "name": "elsewhere", "public_key": PUBKEY, "fingerprint": "x",
               "environment": env_json(1, "someone-else", "CANADA-1"),
               "created_at": "2026-11-30T20:00:00Z"}),
        // The same key under the user's own name and comment, in our environment.
        json!({"id": 4, "name": "my-laptop",
               "public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGpuprovTestKeyOnly me@laptop",
               "fingerprint": "y", "environment": env_json(2, ENV_CA, "CANADA-1"),
               "created_at": "2026-11-30T20:00:00Z"}),
    ];
    world.next = 10;
    let mut r = run(world).await;
    r.vm.regions = vec!["CANADA-1".into()];
    r.vm.image = Some("Ubuntu Server 24.04 LTS".into());
    let end = r.launch().await.unwrap();
    assert!(end.ready().is_some(), "{end:?}");
    assert!(r
        .cloud
        .server
        .requests_to("POST", "/v1/core/environments")
        .is_empty());
    assert!(r
        .cloud
        .server
        .requests_to("POST", "/v1/core/keypairs")
        .is_empty());
    assert!(
        r.cloud
            .server
            .requests_to("GET", "/v1/core/images")
            .is_empty(),
        "the configured image is used as is"
    );
    let c = &r.cloud.creates()[0];
    assert_eq!(c["key_name"], "my-laptop");
    assert_eq!(c["image_name"], "Ubuntu Server 24.04 LTS");
    r.cloud.server.verify();
}

#[tokio::test]
async fn plan_joins_flavors_stocks_and_prices_with_exact_regions() {
    let world = World::default()
        .with_flavor("CANADA-1", "n3-H100x8", H100, 8, 1)
        .with_flavor("CANADA-10", "n3-H100x8", H100, 8, 1)
        .with_flavor("NORWAY-1", "n3-H100x8", H100, 8, 0)
        .with_flavor("NORWAY-1", "n3-L40x8", "L40", 8, 3)
        .with_price(H100, 1.9)
        .with_price("L40", 1.0);
    let fake = Fake::start(world).await;
    let p = fake.provider();
    let ids = |o: Vec<gpuprov::provider::Offer>| o.into_iter().map(|o| o.id).collect::<Vec<_>>();
    assert_eq!(
        ids(p.plan(&ask(&["CANADA-1"])).await.unwrap()),
        ["hyperstack/CANADA-1/n3-H100x8"],
        "CANADA-1 is not CANADA-10"
    );
    assert_eq!(
        ids(p.plan(&ask(&["NORWAY-1"])).await.unwrap()),
        Vec::<String>::new(),
        "no stock in NORWAY-1: no offer (but no error: the model exists there)"
    );
    assert_eq!(
        ids(p.plan(&ask(&[])).await.unwrap()),
        [
            "hyperstack/CANADA-1/n3-H100x8",
            "hyperstack/CANADA-10/n3-H100x8"
        ]
    );
    let flavor_queries: Vec<Vec<(String, String)>> = fake
        .server
        .requests_to("GET", "/v1/core/flavors")
        .into_iter()
        .map(|r| r.query)
        .collect();
    assert_eq!(
        flavor_queries[0],
        [("region".to_string(), "CANADA-1".to_string())]
    );

    // Unplannable asks.
    let mut a = ask(&[]);
    a.spot = true;
    assert_eq!(
        p.plan(&a).await.unwrap_err().kind,
        ErrorKind::InvalidRequest
    );
    let mut a = ask(&[]);
    a.gpu = Some("B200".into());
    let e = p.plan(&a).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest);
    assert!(e.msg.contains("H100-80G-PCIe x8"), "{}", e.msg);
    let mut a = ask(&[]);
    a.vm_name = "a-very-long-machine-name-over-33-chars".into();
    assert_eq!(
        p.plan(&a).await.unwrap_err().kind,
        ErrorKind::InvalidRequest
    );
    assert!(fake.creates().is_empty(), "plan creates nothing");
    fake.server.verify();
}

#[tokio::test]
async fn the_boot_script_travels_as_user_data_and_observe_is_per_region() {
    let fake = Fake::start(h100_world()).await;
    let p = fake.provider();
    let offer = p.plan(&ask(&["NORWAY-1"])).await.unwrap().remove(0);
    let mut spec = instance_spec();
    let prepared = drive::prepare(p.clone(), &offer, &spec).await.unwrap();
    spec.boot_script = Some(BootScript {
        script: "echo hello".into(),
        env: BTreeMap::from([("A".to_string(), "b".to_string())]),
    });
    let id = p.create(&offer, &prepared, &spec).await.unwrap();
    let ud = fake.creates()[0]["user_data"].as_str().unwrap().to_string();
    let script = boot_script_of(&ud);
    assert!(
        script.contains("export A=") && script.contains("echo hello"),
        "{script}"
    );
    assert!(p
        .observe(&loc("CANADA-1"), "trainer")
        .await
        .unwrap()
        .is_empty());
    let seen = p.observe(&loc("NORWAY-1"), "trainer").await.unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].instance_id, id);
    assert_eq!(seen[0].status, InstanceStatus::Pending);
    // Another project's VM of the same name in the same environment is not ours.
    {
        let mut w = fake.world.lock().unwrap();
        let mut other = w.vms[0].clone();
        other["id"] = json!(999);
        other["labels"] = json!(["gpuprov-vm-name=trainer", "gpuprov-lineage=another"]);
        w.vms.push(other);
    }
    let seen = p.observe(&loc("NORWAY-1"), "trainer").await.unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].instance_id, id);
    fake.server.verify();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpuprov_plan_lists_the_hyperstack_offer_from_the_local_api() {
    let fake = Fake::start(h100_world()).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("gpuprov.toml"),
        "[defaults]\nclouds = [\"hyperstack\"]\nkubernetes = false\n\n[vm.trainer]\ngpu = \"H100\"\ngpu_count = 8\nregions = [\"CANADA-1\"]\n",
    )
    .unwrap();
    let endpoint = fake.endpoint();
    let path = dir.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        assert_cmd::Command::cargo_bin("gpuprov")
            .unwrap()
            .current_dir(&path)
            .env("GPUPROV_HOME", path.join("home"))
            .env("NO_COLOR", "1")
            .env_remove("GPUPROV_CONFIG")
            .env_remove("GPUPROV_STATE")
            .env("GPUPROV_HYPERSTACK_ENDPOINT", &endpoint)
            .env("HYPERSTACK_API_KEY", SENTINEL)
            .args(["plan"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("no adapter for hyperstack in this build"),
        "target/debug/gpuprov is another checkout's build: the build directory is shared \
         (CARGO_TARGET_DIR) with a concurrent build of another branch; rerun alone\n{stderr}"
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("15.2"), "{stdout}");
    assert!(
        stdout.contains(&fake.endpoint()),
        "the endpoint override is shown: {stdout}"
    );
    assert!(!stdout.contains(SENTINEL) && !stderr.contains(SENTINEL));
    assert!(fake.creates().is_empty(), "plan creates nothing");
    fake.server.verify();
}

/// The defects `spec::hyperstack()` patches are real (the unpatched document rejects what
/// Hyperstack's own docs and SDK send) and the patches are no wider than needed.
#[test]
fn the_patched_spec_defects_are_real() {
    let raw = spec::Spec::load(spec::vendor_apis_dir().join("hyperstack/openapi.yaml"))
        .with_base_path("/v1");
    let patched = spec::hyperstack();
    let body = json!({
        "name": VM_NAME, "environment_name": ENV_CA, "flavor_name": "n3-H100x8",
        "key_name": "k", "count": 1,
        "security_rules": [{"direction": "ingress", "ethertype": "IPv4", "protocol": "tcp",
                            "remote_ip_prefix": "0.0.0.0/0",
                            "port_range_min": 22, "port_range_max": 22}]
    });
    let e = raw
        .check_request("POST", VMS, &[], Some(&body))
        .unwrap_err();
    assert!(e.contains("virtual_machine_id"), "{e}");
    patched
        .check_request("POST", VMS, &[], Some(&body))
        .unwrap();
    // Other required fields are still required.
    let mut missing = body.clone();
    missing["security_rules"][0]
        .as_object_mut()
        .unwrap()
        .remove("protocol");
    assert!(patched
        .check_request("POST", VMS, &[], Some(&missing))
        .is_err());

    // The undefined `accessToken` scheme is gone; `apiKey` remains.
    let sec = &patched.doc()["paths"]["/core/virtual-machines"]["post"]["security"];
    assert_eq!(sec, &json!([{"apiKey": []}]));
    assert!(raw.doc()["components"]["securitySchemes"]
        .get("accessToken")
        .is_none());

    // 429 is declared (with the error envelope) only after the patch.
    let e429 = json!({"status": false, "message": "Too many requests", "error_reason": "r"});
    assert!(raw.check_response("POST", VMS, 429, Some(&e429)).is_err());
    patched
        .check_response("POST", VMS, 429, Some(&e429))
        .unwrap();
}

/// The shell script inside cloud-config user-data (`write_files[0]`, base64).
fn boot_script_of(user_data: &str) -> String {
    assert!(user_data.starts_with("#cloud-config\n"), "{user_data}");
    let doc: serde_yaml::Value = serde_yaml::from_str(user_data).unwrap();
    let content = doc["write_files"][0]["content"].as_str().unwrap();
    gpuprov::provider::boot::cloud_init::decode_gz_b64(content).expect("gzip in base64")
}

/// A key pair in `env` (CANADA-1) named `name` holding `public_key`.
pub(crate) fn keypair(id: i64, name: &str, public_key: &str, env: &str) -> Value {
    json!({"id": id, "name": name, "public_key": public_key, "fingerprint": "zz",
           "environment": env_json(2, env, "CANADA-1"), "created_at": "2026-11-30T20:00:00Z"})
}

/// Another key's value (a rotated or colleague's key).
const FOREIGN_KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIForeignColleagueKey col@desk";

/// Issue 12 item 6: key pairs already registered in the environment under the old name
/// (`gpuprov-<lineage8>`) and under the derived name, both holding ANOTHER value, are never
/// used and do not stop the run: the project key is imported under the next free derived
/// name (`-2`), and the VM gets that key pair. Hyperstack refuses a duplicate name in an
/// environment (`409`), as the fake does.
#[tokio::test]
async fn key_pairs_of_the_same_name_but_another_value_are_never_used() {
    let mut world = h100_world();
    world.environments = vec![env_json(2, ENV_CA, "CANADA-1")];
    world.keypairs = vec![
        keypair(3, "gpuprov-0f0e0d0c", FOREIGN_KEY, ENV_CA),
        keypair(4, &key_name(), FOREIGN_KEY, ENV_CA),
    ];
    world.next = 10;
    let mut r = run(world).await;
    r.vm.regions = vec!["CANADA-1".into()];
    let end = r.launch().await.unwrap();
    assert!(end.ready().is_some(), "{end:?} {:?}", r.labels());
    let second = format!("{}-2", key_name());
    let imports = r.cloud.server.requests_to("POST", "/v1/core/keypairs");
    assert_eq!(imports.len(), 1);
    assert_eq!(
        imports[0].body.clone().unwrap(),
        json!({"environment_name": ENV_CA, "name": second, "public_key": PUBKEY})
    );
    assert_eq!(r.cloud.creates()[0]["key_name"], second.as_str());
    // The foreign key pairs are left as they were.
    {
        let w = r.cloud.world.lock().unwrap();
        assert_eq!(w.keypairs.len(), 3);
        assert_eq!(w.keypairs[0]["public_key"], FOREIGN_KEY);
        assert_eq!(w.keypairs[1]["public_key"], FOREIGN_KEY);
    }
    r.cloud.server.verify();

    // A name taken but not listed yet: the import's 409 moves on to the next name.
    let mut world = h100_world();
    world.environments = vec![env_json(2, ENV_CA, "CANADA-1")];
    world.unlisted_keypairs = vec![keypair(5, &key_name(), FOREIGN_KEY, ENV_CA)];
    world.next = 10;
    let fake = Fake::start(world).await;
    let p = fake.provider();
    let offer = p.plan(&ask(&["CANADA-1"])).await.unwrap().remove(0);
    let prepared = drive::prepare(p.clone(), &offer, &instance_spec())
        .await
        .unwrap();
    assert_eq!(prepared["key_name"], second.as_str());
    let names: Vec<Value> = fake
        .server
        .requests_to("POST", "/v1/core/keypairs")
        .into_iter()
        .map(|q| q.body.unwrap()["name"].clone())
        .collect();
    assert_eq!(names, [json!(key_name()), json!(second)]);
    // Prepared again: found by value, nothing imported.
    drive::prepare(p.clone(), &offer, &instance_spec())
        .await
        .unwrap();
    assert_eq!(
        fake.server.requests_to("POST", "/v1/core/keypairs").len(),
        2
    );
    fake.server.verify();
}

/// Observes `vm` at CANADA-1 until its one VM is Running with an SSH endpoint; returns the
/// statuses seen.
async fn until_running(p: &HyperstackProvider) -> Vec<InstanceStatus> {
    let mut seen = Vec::new();
    for _ in 0..8 {
        let o = p.observe(&loc("CANADA-1"), "trainer").await.unwrap();
        assert_eq!(o.len(), 1, "{o:?}");
        seen.push(o[0].status.clone());
        if o[0].status == InstanceStatus::Running && o[0].ssh.is_some() {
            return seen;
        }
    }
    panic!("never Running with an endpoint: {seen:?}");
}

/// Issue 12 item 2 (restart before replace): Hyperstack can start a stopped VM. A stopped
/// VM is `SHUTOFF` and observed `Stopped` (no endpoint); `start` calls `Start_VM`, after
/// which the VM is observed Pending (`STARTING`) and then Running with its floating IP; a
/// start refused for a VM already `ACTIVE` is success (`Get_VM` shows it); a refusal
/// naming capacity is `Capacity` and leaves the VM stopped (the description documents no
/// capacity answer: the classifier's phrases decide), an unknown one `Failed`; a VM that is
/// gone is `Failed`.
#[tokio::test]
async fn a_stopped_vm_is_observed_stopped_then_started_again() {
    let fake = Fake::start(h100_world()).await;
    let p = fake.provider();
    assert!(p.capabilities().supports(Feature::Start));
    let offer = p.plan(&ask(&["CANADA-1"])).await.unwrap().remove(0);
    let spec = instance_spec();
    let prepared = drive::prepare(p.clone(), &offer, &spec).await.unwrap();
    let id = p.create(&offer, &prepared, &spec).await.unwrap();
    until_running(&p).await;
    let stop = |fake: &Fake| {
        let c = fake
            .world
            .lock()
            .unwrap()
            .stop_vm(&format!("{VMS}/{id}/stop"));
        assert_eq!(c.status, 200);
    };

    stop(&fake);
    let o = p.observe(&loc("CANADA-1"), "trainer").await.unwrap();
    assert_eq!(
        (
            o[0].instance_id.as_str(),
            o[0].status.clone(),
            o[0].ssh.clone()
        ),
        (id.as_str(), InstanceStatus::Stopped, None)
    );
    p.start(&loc("CANADA-1"), "trainer", &id).await.unwrap();
    let start = format!("{VMS}/{id}/start");
    assert_eq!(fake.server.requests_to("GET", &start).len(), 1);
    let seen = until_running(&p).await;
    assert_eq!(seen[0], InstanceStatus::Pending, "STARTING first: {seen:?}");
    assert_eq!(fake.creates().len(), 1, "the same VM, not a new one");

    // Already ACTIVE: the refusal is success once Get_VM shows it.
    p.start(&loc("CANADA-1"), "trainer", &id).await.unwrap();
    assert_eq!(
        fake.server.requests_to("GET", &format!("{VMS}/{id}")).len(),
        1
    );

    // No capacity to start it: Capacity, and the VM stays stopped.
    stop(&fake);
    fake.world.lock().unwrap().fault(
        "GET",
        &start,
        Canned::status(
            400,
            err(
                "Not enough capacity to start the virtual machine",
                "capacity",
            ),
        ),
    );
    let e = p.start(&loc("CANADA-1"), "trainer", &id).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Capacity, "{e}");
    assert_eq!(
        p.observe(&loc("CANADA-1"), "trainer").await.unwrap()[0].status,
        InstanceStatus::Stopped
    );
    // An unknown refusal of a stopped VM: Failed, with the VM's status named.
    fake.world.lock().unwrap().fault(
        "GET",
        &start,
        Canned::status(400, err("Something new happened", "bad_request")),
    );
    let e = p.start(&loc("CANADA-1"), "trainer", &id).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Failed, "{e}");
    assert!(e.msg.contains("SHUTOFF"), "{e}");

    // Gone: Failed, never success; not an id at all: InvalidRequest.
    let e = p
        .start(&loc("CANADA-1"), "trainer", "987654")
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Failed, "{e}");
    let e = p
        .start(&loc("CANADA-1"), "trainer", "i-abc")
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest, "{e}");
    fake.server.verify();
}

/// A local server standing in for a proxy in front of Hyperstack (not Hyperstack itself,
/// so not spec-checked): every request gets `status` with a `content_type` body.
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

fn provider_at(endpoint: String) -> HyperstackProvider {
    HyperstackProvider::new(HyperstackSettings {
        endpoint: Some(endpoint),
        api_key: Some(ApiKey::new(SENTINEL)),
        lineage: LINEAGE.parse().unwrap(),
    })
}

/// Issue 12 item 7: an error body that is not Hyperstack's envelope (a proxy's HTML page,
/// plain text) is shown as one short line naming the status and the content type, never
/// the dumped page, and no phrase inside it is taken for the vendor's words.
#[tokio::test]
async fn a_proxy_page_becomes_one_short_line() {
    let page = format!(
        "<!DOCTYPE html>\n<html>\n<head><title>502 Bad Gateway</title></head>\n<body>\n\
         <center><h1>502 Bad Gateway</h1></center>\n{}</body>\n</html>\n",
        "<hr><center>nginx</center>\n".repeat(100)
    );
    let proxy = proxy_answering(502, "text/html; charset=utf-8", page).await;
    let e = provider_at(format!("{}/v1", proxy.uri()))
        .observe(&loc("CANADA-1"), "trainer")
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient, "{e}");
    assert_eq!(
        e.msg,
        "hyperstack list VMs: HTTP 502 (text/html): 502 Bad Gateway"
    );

    let proxy = proxy_answering(
        400,
        "text/plain",
        "Out of stock? try again later\nrequest id 42".into(),
    )
    .await;
    let e = provider_at(format!("{}/v1", proxy.uri()))
        .delete(&loc("CANADA-1"), "trainer", &["5".into()])
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Failed, "not the vendor's words: {e}");
    assert_eq!(
        e.msg,
        "hyperstack delete VM 5: HTTP 400 (text/plain): Out of stock? try again later"
    );
}

/// Issue 12 item 7: an endpoint that refuses the connection is `Unreachable` at once (the
/// core then blocks the whole cloud), with the endpoint shown redacted.
#[tokio::test]
async fn a_closed_port_is_unreachable_at_once() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    let p = provider_at(format!("http://user:hunter2@127.0.0.1:{port}/v1"));
    let started = Instant::now();
    for e in [
        p.plan(&ask(&["CANADA-1"])).await.unwrap_err(),
        p.observe(&loc("CANADA-1"), "trainer").await.unwrap_err(),
        p.delete(&loc("CANADA-1"), "trainer", &["5".into()])
            .await
            .unwrap_err(),
        p.start(&loc("CANADA-1"), "trainer", "5").await.unwrap_err(),
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
