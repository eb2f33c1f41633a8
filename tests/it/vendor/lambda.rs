//! The Lambda adapter against a local fake of the Lambda Cloud API whose every request
//! and every response is checked against Lambda's own OpenAPI 1.8.3 description
//! (`tests/it/support/spec.rs`). The launch and teardown machines run for real through the
//! executor with a `MemoryJournal`; SSH is the `FakeConnector` (instances get 127.0.0.x
//! addresses only, nothing is dialled).

use crate::support::drive;
use crate::support::spec;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drive::{LINEAGE, PUBKEY};
use gpuprov::config::Cloud;
use gpuprov::provider::clouds::lambda::{ApiKey, LambdaProvider, LambdaSettings};
use gpuprov::provider::{
    project_key_name, CloudProvider, ErrorKind, Feature, InstanceSpec, InstanceStatus, Location,
    ResourceRequest,
};
use gpuprov::vm::{LaunchState, Target, TeardownState};
use serde_json::{json, Value};
use spec::{Canned, Seen, SpecServer};

/// A sentinel API key: it must never appear in any error, reason or journal entry.
pub(crate) const SENTINEL: &str = "secret_sentinel_key_7f3a9c";

pub(crate) const LAUNCH: &str = "/api/v1/instance-operations/launch";
pub(crate) const TERMINATE: &str = "/api/v1/instance-operations/terminate";

/// The fake Lambda account.
#[derive(Default)]
pub(crate) struct World {
    /// instance type name → (gpu description, gpus, cents per hour, regions with capacity)
    pub(crate) types: BTreeMap<String, (String, u32, i64, Vec<String>)>,
    pub(crate) keys: Vec<Value>,
    pub(crate) rulesets: Vec<Value>,
    pub(crate) instances: Vec<Value>,
    /// Per (method, path): error responses served before the normal behaviour.
    faults: BTreeMap<(String, String), VecDeque<Canned>>,
    next: u32,
    /// Every error body echoes the Authorization header (a hostile server), to prove the
    /// adapter scrubs the key.
    pub(crate) echo_auth: bool,
    /// `(boot, termination)`: an instance turns active (terminated) at the first listing
    /// at least this long after its launch (terminate request), in real time. `None`:
    /// one step per listing.
    pub(crate) timed: Option<(Duration, Duration)>,
    /// When each instance entered `booting` or `terminating` (for `timed`).
    since: BTreeMap<String, Instant>,
}

pub(crate) fn region(name: &str) -> Value {
    json!({"name": name, "description": format!("{name} test region")})
}

pub(crate) fn type_json(name: &str, desc: &str, gpus: u32, cents: i64) -> Value {
    json!({
        "name": name,
        "description": format!("{gpus}x {desc}"),
        "gpu_description": desc,
        "price_cents_per_hour": cents,
        "specs": {"vcpus": 26 * gpus, "memory_gib": 225 * gpus, "storage_gib": 2750 * gpus, "gpus": gpus}
    })
}

/// An error body in Lambda's envelope (`suggestion` included: several `ApiError*`
/// schemas require it).
pub(crate) fn err_body(code: &str, message: &str) -> Value {
    json!({"error": {"code": code, "message": message, "suggestion": "Try again later."}})
}

impl World {
    pub(crate) fn with_type(
        mut self,
        name: &str,
        desc: &str,
        gpus: u32,
        cents: i64,
        regions: &[&str],
    ) -> Self {
        self.types.insert(
            name.into(),
            (
                desc.into(),
                gpus,
                cents,
                regions.iter().map(|r| r.to_string()).collect(),
            ),
        );
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
            if let Some(m) = c
                .body
                .as_mut()
                .and_then(|b| b["error"]["message"].as_str().map(str::to_string))
            {
                c.body.as_mut().unwrap()["error"]["message"] = json!(format!("{m} [{auth}]"));
            }
        }
        Some(c)
    }

    fn types_data(&self) -> Value {
        let mut m = serde_json::Map::new();
        for (name, (desc, gpus, cents, regions)) in &self.types {
            m.insert(
                name.clone(),
                json!({
                    "instance_type": type_json(name, desc, *gpus, *cents),
                    "regions_with_capacity_available": regions.iter().map(|r| region(r)).collect::<Vec<_>>(),
                }),
            );
        }
        json!({"data": m})
    }

    fn launch(&mut self, body: &Value) -> Canned {
        let ty = body["instance_type_name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let reg = body["region_name"].as_str().unwrap_or_default().to_string();
        let Some((desc, gpus, cents, regions)) = self.types.get(&ty).cloned() else {
            return Canned::status(
                404,
                err_body(
                    "global/object-does-not-exist",
                    "Specified instance type does not exist.",
                ),
            );
        };
        if !regions.contains(&reg) {
            return Canned::status(
                400,
                err_body(
                    "instance-operations/launch/insufficient-capacity",
                    "Not enough capacity to fulfill launch request.",
                ),
            );
        }
        self.next += 1;
        let id = format!("{:032x}", self.next);
        let mut inst = json!({
            "id": id,
            "status": "booting",
            "ssh_key_names": body["ssh_key_names"],
            "file_system_names": [],
            "region": region(&reg),
            "instance_type": type_json(&ty, &desc, gpus, cents),
            "actions": {
                "migrate": {"available": false},
                "rebuild": {"available": false},
                "restart": {"available": false},
                "cold_reboot": {"available": false},
                "terminate": {"available": true}
            },
            "tags": body.get("tags").cloned().unwrap_or(json!([])),
        });
        if let Some(n) = body.get("name") {
            inst["name"] = n.clone();
        }
        if let Some(f) = body.get("firewall_rulesets") {
            inst["firewall_rulesets"] = f.clone();
            for fw in f.as_array().cloned().unwrap_or_default() {
                if let Some(rs) = self.rulesets.iter_mut().find(|r| r["id"] == fw["id"]) {
                    rs["instance_ids"].as_array_mut().unwrap().push(json!(id));
                }
            }
        }
        self.since.insert(id.clone(), Instant::now());
        self.instances.push(inst);
        Canned::ok(json!({"data": {"instance_ids": [id]}}))
    }

    /// The list as Lambda shows it now; then every booting instance becomes active with a
    /// loopback address, and every terminating one terminated (one step per listing).
    fn list(&mut self) -> Canned {
        let out = json!({"data": self.instances});
        for (n, i) in self.instances.iter_mut().enumerate() {
            let id = i["id"].as_str().unwrap_or_default().to_string();
            let due = |wait: fn(&(Duration, Duration)) -> Duration| match &self.timed {
                Some(t) => self.since.get(&id).is_none_or(|at| at.elapsed() >= wait(t)),
                None => true,
            };
            match i["status"].as_str() {
                Some("booting") if !due(|t| t.0) => {}
                Some("terminating") if !due(|t| t.1) => {}
                Some("booting") => {
                    i["status"] = json!("active");
                    i["ip"] = json!(format!("127.0.0.{}", 7 + n));
                }
                Some("terminating") => i["status"] = json!("terminated"),
                _ => {}
            }
        }
        Canned::ok(out)
    }

    /// Whether an instance that is not terminated uses ruleset `id`.
    fn ruleset_in_use(&self, id: &str) -> bool {
        self.rulesets
            .iter()
            .filter(|r| r["id"] == id)
            .flat_map(|r| r["instance_ids"].as_array().cloned().unwrap_or_default())
            .any(|i| {
                self.instances
                    .iter()
                    .any(|x| x["id"] == i && x["status"] != "terminated")
            })
    }

    fn terminate(&mut self, body: &Value) -> Canned {
        let ids: Vec<String> = body["instance_ids"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let mut done = vec![];
        for id in &ids {
            match self.instances.iter_mut().find(|i| i["id"] == id.as_str()) {
                Some(i) => {
                    if i["status"] != "terminating" {
                        self.since.insert(id.clone(), Instant::now());
                    }
                    i["status"] = json!("terminating");
                    done.push(i.clone());
                }
                None => {
                    return Canned::status(
                        404,
                        err_body(
                            "global/object-does-not-exist",
                            "Specified instance does not exist.",
                        ),
                    )
                }
            }
        }
        Canned::ok(json!({"data": {"terminated_instances": done}}))
    }
}

pub(crate) struct Cloud2 {
    pub(crate) server: SpecServer,
    pub(crate) world: Arc<Mutex<World>>,
}

impl Cloud2 {
    pub(crate) async fn start(world: World) -> Cloud2 {
        let server = SpecServer::start(Arc::new(spec::lambda())).await;
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
        route!("GET", "^/api/v1/instance-types$", |w, _r| Canned::ok(
            w.types_data()
        ));
        route!("GET", "^/api/v1/ssh-keys$", |w, _r| Canned::ok(
            json!({"data": w.keys})
        ));
        route!("POST", "^/api/v1/ssh-keys$", |w, r| {
            let b = r.body.clone().unwrap_or_default();
            // Lambda refuses a second key of the same name (400 `global/invalid-parameters`,
            // "Key name must be unique", as field reports quote it).
            if w.keys.iter().any(|k| k["name"] == b["name"]) {
                return Canned::status(
                    400,
                    json!({"error": {"code": "global/invalid-parameters", "message": "Key name must be unique."}}),
                );
            }
            let k = json!({"id": format!("key{}", w.keys.len()), "name": b["name"], "public_key": b["public_key"]});
            w.keys.push(k.clone());
            Canned::ok(json!({"data": k}))
        });
        route!("DELETE", "^/api/v1/ssh-keys/[^/]+$", |w, r| {
            let id = r.path.rsplit('/').next().unwrap_or_default().to_string();
            let before = w.keys.len();
            w.keys.retain(|k| k["id"] != id.as_str());
            if w.keys.len() == before {
                // The spec documents no 404 here: an unknown id is an invalid parameter.
                return Canned::status(
                    400,
                    err_body("global/invalid-parameters", "SSH key not found."),
                );
            }
            Canned::ok(json!({"data": {}}))
        });
        route!("GET", "^/api/v1/firewall-rulesets$", |w, _r| Canned::ok(
            json!({"data": w.rulesets})
        ));
        route!("POST", "^/api/v1/firewall-rulesets$", |w, r| {
            let b = r.body.clone().unwrap_or_default();
            let fw = json!({
                "id": format!("fw{}", w.rulesets.len() + 1),
                "name": b["name"],
                "region": region(b["region"].as_str().unwrap_or_default()),
                "rules": b["rules"],
                "created": "2026-11-30T20:00:00Z",
                "instance_ids": []
            });
            w.rulesets.push(fw.clone());
            Canned::ok(json!({"data": fw}))
        });
        route!("DELETE", "^/api/v1/firewall-rulesets/[^/]+$", |w, r| {
            let id = r.path.rsplit('/').next().unwrap_or_default().to_string();
            // A ruleset an instance that is not terminated still uses is refused
            // (`ApiErrorFirewallRulesetInUse`).
            if w.ruleset_in_use(&id) {
                return Canned::status(
                    400,
                    json!({"error": {
                        "code": "firewall-rulesets/firewall-ruleset-in-use",
                        "message": "Firewall ruleset is in use by one or more instances.",
                        "suggestion": "Terminate all instances that are using the ruleset before deleting it."
                    }}),
                );
            }
            let before = w.rulesets.len();
            w.rulesets.retain(|f| f["id"] != id.as_str());
            if w.rulesets.len() == before {
                Canned::status(
                    404,
                    err_body(
                        "global/object-does-not-exist",
                        "Firewall ruleset not found.",
                    ),
                )
            } else {
                Canned::ok(json!({"data": {}}))
            }
        });
        route!("GET", "^/api/v1/instances$", |w, _r| w.list());
        route!("GET", "^/api/v1/instances/[^/]+$", |w, r| {
            let id = r.path.rsplit('/').next().unwrap_or_default();
            match w.instances.iter().find(|i| i["id"] == id) {
                Some(i) => Canned::ok(json!({"data": i})),
                None => Canned::status(
                    404,
                    err_body("global/object-does-not-exist", "Instance not found."),
                ),
            }
        });
        // `InstanceModificationRequest`: only the name can change.
        route!("POST", "^/api/v1/instances/[^/]+$", |w, r| {
            let id = r.path.rsplit('/').next().unwrap_or_default().to_string();
            let name = r
                .body
                .as_ref()
                .and_then(|b| b["name"].as_str().map(str::to_string));
            match w.instances.iter_mut().find(|i| i["id"] == id.as_str()) {
                Some(i) => {
                    if let Some(n) = name {
                        i["name"] = json!(n);
                    }
                    Canned::ok(json!({"data": i.clone()}))
                }
                None => Canned::status(
                    404,
                    err_body("global/object-does-not-exist", "Instance not found."),
                ),
            }
        });
        route!("POST", "^/api/v1/instance-operations/launch$", |w, r| {
            let b = r.body.clone().unwrap_or_default();
            w.launch(&b)
        });
        route!("POST", "^/api/v1/instance-operations/terminate$", |w, r| {
            let b = r.body.clone().unwrap_or_default();
            w.terminate(&b)
        });
        Cloud2 { server, world }
    }

    pub(crate) fn provider_with_key(&self, key: Option<&str>) -> Arc<LambdaProvider> {
        let caps = drive::test_capabilities(LambdaProvider::default_capabilities());
        Arc::new(
            LambdaProvider::new(LambdaSettings {
                endpoint: Some(self.server.uri()),
                api_key: key.map(ApiKey::new),
                lineage: LINEAGE.parse().unwrap(),
            })
            .with_capabilities(caps),
        )
    }

    pub(crate) fn provider(&self) -> Arc<LambdaProvider> {
        self.provider_with_key(Some(SENTINEL))
    }

    pub(crate) fn launches(&self) -> Vec<Value> {
        self.server
            .requests_to("POST", LAUNCH)
            .into_iter()
            .filter_map(|r| r.body)
            .collect()
    }
}

/// The shared launch/teardown harness over this vendor's local server.
type Run = drive::Run<Cloud2, LambdaProvider>;

/// A run of `trainer` asking for 8 × H100 against a server serving `world`.
async fn run(world: World) -> Run {
    let cloud = Cloud2::start(world).await;
    let provider = cloud.provider();
    Run::new(cloud, provider, drive::gpu_vm(Cloud::Lambda, "H100", 8))
}

pub(crate) fn h100_world() -> World {
    World::default()
        .with_type(
            "gpu_8x_h100_sxm5",
            "H100 (80 GB SXM5)",
            8,
            2392,
            &["us-east-1", "us-west-1"],
        )
        .with_type("gpu_1x_a10", "A10 (24 GB PCIe)", 1, 75, &["us-east-1"])
}

pub(crate) fn tag(body: &Value, key: &str) -> Option<String> {
    body["tags"]
        .as_array()?
        .iter()
        .find(|t| t["key"] == key)
        .and_then(|t| t["value"].as_str().map(str::to_string))
}

#[tokio::test]
async fn full_launch_then_teardown_against_the_spec() {
    let mut r = run(h100_world()).await;
    r.vm.ports = vec![8080];
    r.vm.regions = vec!["us-east-1".into()];
    let end = r.launch().await.unwrap();
    let vm = end
        .ready()
        .unwrap_or_else(|| panic!("not ready: {end:?} {:?}", r.labels()));
    assert_eq!(vm.offer.id, "lambda/us-east-1/gpu_8x_h100_sxm5");
    assert_eq!(vm.offer.price_per_hour, 23.92);
    assert_eq!(vm.user, "ubuntu");
    assert_eq!(vm.ssh.port, 22);
    assert!(vm.ssh.host.starts_with("127.0.0."), "{}", vm.ssh.host);
    assert_eq!(r.connector.logins(), 1);

    // prepare: the key was unknown, so it was registered under the name derived from its
    // fingerprint, gpuprov-<lineage8>-<fp12>.
    let keys = r.cloud.server.requests_to("POST", "/api/v1/ssh-keys");
    assert_eq!(keys.len(), 1);
    let kb = keys[0].body.clone().unwrap();
    let key_name = project_key_name(LINEAGE, PUBKEY);
    assert!(key_name.starts_with("gpuprov-0f0e0d0c-"), "{key_name}");
    assert_eq!(kb["name"], key_name.as_str());
    assert_eq!(kb["public_key"], PUBKEY);
    // prepare: a per-VM ruleset with 22 and the asked port.
    let fw = r
        .cloud
        .server
        .requests_to("POST", "/api/v1/firewall-rulesets");
    assert_eq!(fw.len(), 1);
    let fb = fw[0].body.clone().unwrap();
    assert_eq!(fb["name"], "gpuprov-trainer-0f0e0d0c");
    assert_eq!(fb["region"], "us-east-1");
    let ports: Vec<Value> = fb["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["port_range"].clone())
        .collect();
    assert_eq!(ports, [json!([22, 22]), json!([8080, 8080])]);

    // create: one launch, tagged, named, with the key and the ruleset.
    let launches = r.cloud.launches();
    assert_eq!(launches.len(), 1);
    let lb = &launches[0];
    assert_eq!(lb["region_name"], "us-east-1");
    assert_eq!(lb["instance_type_name"], "gpu_8x_h100_sxm5");
    assert_eq!(lb["ssh_key_names"], json!([key_name]));
    assert_eq!(lb["name"], "gpuprov-trainer-0f0e0d0c");
    assert_eq!(lb["firewall_rulesets"], json!([{"id": "fw1"}]));
    assert_eq!(tag(lb, "gpuprov-vm-name").as_deref(), Some("trainer"));
    assert_eq!(tag(lb, "gpuprov-lineage").as_deref(), Some(LINEAGE));
    assert!(
        lb.get("user_data").is_none(),
        "no boot script, no user_data"
    );

    // The machine saw booting before active.
    let labels = r.labels();
    assert!(
        labels.iter().any(|l| l.starts_with("booting")),
        "{labels:?}"
    );
    assert!(labels.last().unwrap().starts_with("ready"), "{labels:?}");

    // Teardown: terminate, wait until gone, delete the ruleset.
    let end = r
        .teardown(Target::new(
            vm.location.clone(),
            "trainer",
            vec![vm.instance_id.clone()],
        ))
        .await;
    assert_eq!(end, TeardownState::Done);
    let t = r.cloud.server.requests_to("POST", TERMINATE);
    assert!(!t.is_empty());
    assert_eq!(
        t[0].body.clone().unwrap()["instance_ids"],
        json!([vm.instance_id])
    );
    assert_eq!(
        r.cloud
            .server
            .requests_to("DELETE", "/api/v1/firewall-rulesets/fw1")
            .len(),
        1
    );
    assert!(r.cloud.world.lock().unwrap().rulesets.is_empty());
    let loc = vm.location.clone();
    assert!(r
        .provider
        .observe(&loc, "trainer")
        .await
        .unwrap()
        .is_empty());
    r.cloud.server.verify();
}

#[tokio::test]
async fn region_names_that_are_prefixes_of_each_other_match_exactly() {
    let world = World::default()
        .with_type(
            "gpu_8x_h100_sxm5",
            "H100 (80 GB SXM5)",
            8,
            2392,
            &["us-east-13"],
        )
        .with_type("gpu_8x_a100", "A100 (40 GB SXM4)", 8, 1032, &["us-east-1"]);
    let cloud = Cloud2::start(world).await;
    let p = cloud.provider();
    let ask = |regions: &[&str]| ResourceRequest {
        vm_name: "trainer".into(),
        regions: regions.iter().map(|r| r.to_string()).collect(),
        zones: vec![],
        gpu: Some("H100".into()),
        gpu_count: 8,
        spot: false,
        max_price_per_hour: None,
        gpu_count_at_least: false,
    };
    assert!(
        p.plan(&ask(&["us-east-1"])).await.unwrap().is_empty(),
        "us-east-1 is not us-east-13"
    );
    assert!(p.plan(&ask(&["us-east"])).await.unwrap().is_empty());
    let o = p.plan(&ask(&["us-east-13"])).await.unwrap();
    assert_eq!(o.len(), 1);
    assert_eq!(o[0].id, "lambda/us-east-13/gpu_8x_h100_sxm5");

    // An instance of ours in us-east-13 is not seen when observing us-east-1.
    let mut spec = gpuprov::provider::InstanceSpec {
        vm_name: "trainer".into(),
        lineage: LINEAGE.parse().unwrap(),
        client_token: "t".into(),
        image: None,
        disk_gb: None,
        ports: vec![],
        ssh_public_key: PUBKEY.into(),
        boot_script: None,
        shared: Default::default(),
    };
    let prepared = drive::prepare(p.clone(), &o[0], &spec).await.unwrap();
    spec.boot_script = Some(gpuprov::provider::BootScript {
        script: "echo hello".into(),
        env: BTreeMap::from([("A".to_string(), "b".to_string())]),
    });
    let id = p.create(&o[0], &prepared, &spec).await.unwrap();
    assert!(
        boot_script_of(cloud.launches()[0]["user_data"].as_str().unwrap()).contains("echo hello")
    );
    let at = |r: &str| Location {
        cloud: "lambda".into(),
        region: r.into(),
        zone: None,
    };
    assert!(p
        .observe(&at("us-east-1"), "trainer")
        .await
        .unwrap()
        .is_empty());
    let seen = p.observe(&at("us-east-13"), "trainer").await.unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].instance_id, id);
    // (The fake turned it active on the previous listing.)
    assert_eq!(seen[0].status, InstanceStatus::Running);
    let ssh = seen[0].ssh.clone().expect("endpoint once the ip is set");
    assert!(ssh.host.starts_with("127.0.0."), "{ssh}");
    assert_eq!((ssh.port, ssh.user.as_deref()), (22, Some("ubuntu")));
    cloud.server.verify();
}

#[tokio::test]
async fn the_api_key_never_appears_in_errors() {
    let r = run(h100_world()).await;
    {
        let mut w = r.cloud.world.lock().unwrap();
        w.echo_auth = true;
        // A hostile server echoing the Authorization header in its error message.
        w.fault(
            "GET",
            "/api/v1/instance-types",
            Canned::status(
                401,
                err_body(
                    "global/invalid-api-key",
                    "API key was invalid, expired, or deleted.",
                ),
            ),
        );
    }
    let end = r.launch().await.unwrap();
    match &end {
        LaunchState::Aborted { reason, .. } => {
            assert!(reason.contains("global/invalid-api-key"), "{reason}");
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
    let loc = Location {
        cloud: "lambda".into(),
        region: "us-east-1".into(),
        zone: None,
    };
    for (m, path) in [
        ("GET", "/api/v1/instances"),
        ("POST", TERMINATE),
        ("GET", "/api/v1/firewall-rulesets"),
    ] {
        r.cloud.world.lock().unwrap().fault(
            m,
            path,
            Canned::status(
                403,
                err_body("global/account-inactive", "Your account is inactive."),
            ),
        );
    }
    let errors = [
        p.observe(&loc, "trainer").await.unwrap_err(),
        p.delete(&loc, "trainer", &["abc".into()])
            .await
            .unwrap_err(),
        p.cleanup(&loc, "trainer").await.unwrap_err(),
    ];
    for e in &errors {
        assert_eq!(e.kind, ErrorKind::Credentials, "{e}");
        assert!(!e.to_string().contains(SENTINEL), "{e}");
    }
    r.cloud.server.verify();

    // No key at all: a Credentials error naming where it looked.
    let e = r
        .cloud
        .provider_with_key(None)
        .observe(&loc, "trainer")
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Credentials);
    assert!(e.msg.contains("LAMBDA_API_KEY"), "{}", e.msg);
}

#[tokio::test]
async fn unplannable_asks_are_invalid_requests() {
    let cloud = Cloud2::start(h100_world()).await;
    let p = cloud.provider();
    let mut ask = ResourceRequest {
        vm_name: "trainer".into(),
        regions: vec![],
        zones: vec![],
        gpu: Some("H100".into()),
        gpu_count: 8,
        spot: true,
        max_price_per_hour: None,
        gpu_count_at_least: false,
    };
    assert_eq!(
        p.plan(&ask).await.unwrap_err().kind,
        ErrorKind::InvalidRequest,
        "no spot on Lambda"
    );
    ask.spot = false;
    ask.gpu = Some("B200".into());
    let e = p.plan(&ask).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest);
    assert!(e.msg.contains("H100 x8"), "{}", e.msg);
    cloud.server.verify();
}

#[tokio::test]
async fn delete_and_cleanup_are_idempotent() {
    let cloud = Cloud2::start(h100_world()).await;
    let p = cloud.provider();
    let loc = Location {
        cloud: "lambda".into(),
        region: "us-east-1".into(),
        zone: None,
    };
    p.delete(
        &loc,
        "trainer",
        &["0123456789abcdef0123456789abcdef".into()],
    )
    .await
    .unwrap();
    p.cleanup(&loc, "trainer").await.unwrap();
    // A ruleset that vanishes between list and delete is success too.
    cloud.world.lock().unwrap().rulesets.push(json!({
        "id": "fw9", "name": "gpuprov-trainer-0f0e0d0c", "region": region("us-east-1"),
        "rules": [], "created": "2026-11-30T20:00:00Z", "instance_ids": []
    }));
    cloud.world.lock().unwrap().fault(
        "DELETE",
        "/api/v1/firewall-rulesets/fw9",
        Canned::status(
            404,
            err_body(
                "global/object-does-not-exist",
                "Firewall ruleset not found.",
            ),
        ),
    );
    p.cleanup(&loc, "trainer").await.unwrap();
    // A provider/* outage is transient.
    cloud.world.lock().unwrap().fault(
        "GET",
        "/api/v1/instances",
        Canned::status(
            503,
            err_body("provider/internal-unavailable", "Provider unavailable"),
        ),
    );
    assert_eq!(
        p.observe(&loc, "trainer").await.unwrap_err().kind,
        ErrorKind::Transient
    );
    cloud.server.verify();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpuprov_plan_lists_the_lambda_offer_from_the_local_api() {
    let cloud = Cloud2::start(h100_world()).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("gpuprov.toml"),
        "[defaults]\nclouds = [\"lambda\"]\nkubernetes = false\n\n[vm.trainer]\ngpu = \"H100\"\ngpu_count = 8\nregions = [\"us-east-1\"]\n",
    )
    .unwrap();
    let uri = cloud.server.uri();
    let path = dir.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        assert_cmd::Command::cargo_bin("gpuprov")
            .unwrap()
            .current_dir(&path)
            .env("GPUPROV_HOME", path.join("home"))
            .env("NO_COLOR", "1")
            .env_remove("GPUPROV_CONFIG")
            .env_remove("GPUPROV_STATE")
            .env("GPUPROV_LAMBDA_ENDPOINT", &uri)
            .env("LAMBDA_API_KEY", SENTINEL)
            .args(["plan"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("no adapter for lambda in this build"),
        "target/debug/gpuprov is another checkout's build: the build directory is shared \
         (CARGO_TARGET_DIR) with a concurrent build of another branch; rerun alone\n{stderr}"
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("23.92"), "{stdout}");
    assert!(
        stdout.contains(&cloud.server.uri()),
        "the endpoint override is shown: {stdout}"
    );
    assert!(!stdout.contains(SENTINEL) && !stderr.contains(SENTINEL));
    assert!(cloud.launches().is_empty(), "plan creates nothing");
    cloud.server.verify();
}

#[tokio::test]
async fn prepare_reuses_the_rulesets_of_its_region_and_rechecks_capacity() {
    let mut world = h100_world();
    let rs = |id: &str, reg: &str| {
        json!({
            "id": id, "name": "gpuprov-trainer-0f0e0d0c", "region": region(reg),
            "rules": [], "created": "2026-11-30T20:00:00Z", "instance_ids": []
        })
    };
    // Same name in another region first: it must not be taken.
    world.rulesets = vec![rs("fw-west", "us-west-1"), rs("fw-east", "us-east-1")];
    let cloud = Cloud2::start(world).await;
    let p = cloud.provider();
    let ask = ResourceRequest {
        vm_name: "trainer".into(),
        regions: vec!["us-east-1".into()],
        zones: vec![],
        gpu: Some("H100".into()),
        gpu_count: 8,
        spot: false,
        max_price_per_hour: None,
        gpu_count_at_least: false,
    };
    let offer = p.plan(&ask).await.unwrap().remove(0);
    let spec = gpuprov::provider::InstanceSpec {
        vm_name: "trainer".into(),
        lineage: LINEAGE.parse().unwrap(),
        client_token: "t".into(),
        image: Some("lambda-stack-24-04".into()),
        disk_gb: None,
        ports: vec![8000],
        ssh_public_key: PUBKEY.into(),
        boot_script: None,
        shared: Default::default(),
    };
    let prepared = drive::prepare(p.clone(), &offer, &spec).await.unwrap();
    assert_eq!(prepared["firewall_ruleset_id"], "fw-east");
    assert!(cloud
        .server
        .requests_to("POST", "/api/v1/firewall-rulesets")
        .is_empty());
    p.create(&offer, &prepared, &spec).await.unwrap();
    assert_eq!(
        cloud.launches()[0]["image"],
        json!({"family": "lambda-stack-24-04"})
    );

    // The capacity is gone by the next prepare: Unavailable (nothing to compensate).
    cloud
        .world
        .lock()
        .unwrap()
        .types
        .get_mut("gpu_8x_h100_sxm5")
        .unwrap()
        .3
        .retain(|r| r != "us-east-1");
    let e = drive::prepare(p.clone(), &offer, &spec).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unavailable, "{e}");
    cloud.server.verify();
}

#[tokio::test]
async fn a_provider_outage_on_launch_is_retried_on_the_same_offer() {
    let mut r = run(h100_world()).await;
    r.vm.regions = vec!["us-east-1".into(), "us-west-1".into()];
    r.cloud.world.lock().unwrap().fault(
        "POST",
        LAUNCH,
        Canned::status(
            503,
            err_body("provider/internal-unavailable", "Provider unavailable"),
        ),
    );
    let end = r.launch().await.unwrap();
    assert_eq!(
        end.ready().expect("ready").offer.id,
        "lambda/us-east-1/gpu_8x_h100_sxm5"
    );
    let regions: Vec<Value> = r
        .cloud
        .launches()
        .iter()
        .map(|b| b["region_name"].clone())
        .collect();
    assert_eq!(regions, [json!("us-east-1"), json!("us-east-1")]);
    r.cloud.server.verify();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpuprov_offers_lists_lambda_offers_from_the_local_api() {
    let cloud = Cloud2::start(h100_world()).await;
    let dir = tempfile::tempdir().unwrap();
    let uri = cloud.server.uri();
    let path = dir.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        assert_cmd::Command::cargo_bin("gpuprov")
            .unwrap()
            .current_dir(&path)
            .env("GPUPROV_HOME", path.join("home"))
            .env("NO_COLOR", "1")
            .env_remove("GPUPROV_CONFIG")
            .env_remove("GPUPROV_STATE")
            .env("GPUPROV_LAMBDA_ENDPOINT", &uri)
            .env("LAMBDA_API_KEY", SENTINEL)
            .args(["offers", "--cloud", "lambda", "--gpu", "H100", "--json"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let offers: Vec<Value> = serde_json::from_str(&stdout).unwrap();
    assert!(!offers.is_empty(), "{stdout}");
    assert!(offers
        .iter()
        .all(|o| o["cloud"] == "lambda" && o["gpu"] == "H100"));
    assert!(
        offers.iter().any(|o| o["price_per_hour"] == 23.92),
        "{stdout}"
    );
    assert!(!stdout.contains(SENTINEL) && !stderr.contains(SENTINEL));
    assert!(cloud.launches().is_empty(), "offers creates nothing");
    cloud.server.verify();
}

/// Issue 12 item 6: keys named like the project key but holding another value (one under
/// the old `gpuprov-<lineage8>` name, one under the derived name itself) are never used
/// and do not stop the run: Lambda refuses a second key of the same name, so ours is
/// registered under the next free derived name and the launch carries it.
#[tokio::test]
async fn keys_named_like_ours_with_another_value_are_never_used() {
    let derived = project_key_name(LINEAGE, PUBKEY);
    let mut world = h100_world();
    world.keys = vec![
        json!({"id": "k1", "name": "gpuprov-0f0e0d0c", "public_key": "ssh-ed25519 AAAAC3NzaForeignOldName x"}),
        json!({"id": "k2", "name": derived, "public_key": "ssh-ed25519 AAAAC3NzaForeignDerived y"}),
    ];
    let r = run(world).await;
    let end = r.launch().await.unwrap();
    assert!(end.ready().is_some(), "{end:?} {:?}", r.labels());
    let ours = format!("{derived}-2");
    let posts = r.cloud.server.requests_to("POST", "/api/v1/ssh-keys");
    assert_eq!(posts.len(), 1, "registered once");
    let kb = posts[0].body.clone().unwrap();
    assert_eq!(
        (kb["name"].clone(), kb["public_key"].clone()),
        (json!(ours), json!(PUBKEY))
    );
    assert_eq!(r.cloud.launches()[0]["ssh_key_names"], json!([ours]));
    // The foreign keys are untouched.
    let w = r.cloud.world.lock().unwrap();
    assert_eq!(w.keys.len(), 3);
    assert_eq!(
        w.keys[0]["public_key"],
        "ssh-ed25519 AAAAC3NzaForeignOldName x"
    );
    assert_eq!(
        w.keys[1]["public_key"],
        "ssh-ed25519 AAAAC3NzaForeignDerived y"
    );
    drop(w);
    r.cloud.server.verify();
}

/// A key name taken between the listing and the registration (400 "Key name must be
/// unique") is not a failure: the keys are listed again and the next free name is used.
#[tokio::test]
async fn a_key_name_taken_meanwhile_is_registered_under_the_next_name() {
    let derived = project_key_name(LINEAGE, PUBKEY);
    let cloud = Cloud2::start(h100_world()).await;
    cloud.world.lock().unwrap().fault(
        "POST",
        "/api/v1/ssh-keys",
        Canned::status(
            400,
            json!({"error": {"code": "global/invalid-parameters", "message": "Key name must be unique."}}),
        ),
    );
    // What the refusal means: someone registered that name meanwhile.
    cloud.world.lock().unwrap().keys.push(
        json!({"id": "k9", "name": derived, "public_key": "ssh-ed25519 AAAAC3NzaMeanwhile z"}),
    );
    let p = cloud.provider();
    let offer = p.plan(&ask_h100(&["us-east-1"])).await.unwrap().remove(0);
    let prepared = drive::prepare(p.clone(), &offer, &spec_for("trainer", vec![]))
        .await
        .unwrap();
    assert_eq!(prepared["ssh_key_name"], format!("{derived}-2"));
    assert_eq!(
        cloud.server.requests_to("POST", "/api/v1/ssh-keys").len(),
        2
    );
    cloud.server.verify();
}

fn ask_h100(regions: &[&str]) -> ResourceRequest {
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

fn spec_for(vm: &str, ports: Vec<u16>) -> InstanceSpec {
    InstanceSpec {
        vm_name: vm.into(),
        lineage: LINEAGE.parse().unwrap(),
        client_token: "t".into(),
        image: None,
        disk_gb: None,
        ports,
        ssh_public_key: PUBKEY.into(),
        boot_script: None,
        shared: Default::default(),
    }
}

/// A provider for an endpoint that is not the spec server.
fn provider_at(endpoint: String) -> LambdaProvider {
    LambdaProvider::new(LambdaSettings {
        endpoint: Some(endpoint),
        api_key: Some(ApiKey::new(SENTINEL)),
        lineage: LINEAGE.parse().unwrap(),
    })
}

/// Issue 12 item 7: a proxy in front of the API answering 502 with its own HTML page (not
/// Lambda's envelope, so not the spec server) gives one short line naming the status and
/// the content type, never the page.
#[tokio::test]
async fn an_html_error_page_is_one_short_line() {
    let proxy = wiremock::MockServer::start().await;
    let page = format!(
        "<!DOCTYPE html>\n<html>\n<head><title>502 Bad Gateway</title></head>\n<body>\n<center><h1>502 Bad Gateway</h1></center>\n{}<hr><center>nginx</center>\n</body>\n</html>\n",
        "<!-- a padding comment to make the page long -->\n".repeat(40)
    );
    wiremock::Mock::given(wiremock::matchers::any())
        .respond_with(
            wiremock::ResponseTemplate::new(502)
                .set_body_raw(page.clone(), "text/html; charset=utf-8"),
        )
        .mount(&proxy)
        .await;
    let p = provider_at(proxy.uri());
    let at = Location {
        cloud: "lambda".into(),
        region: "us-east-1".into(),
        zone: None,
    };
    let e = p.observe(&at, "trainer").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient, "{e}");
    assert!(!e.msg.contains('\n'), "one line: {}", e.msg);
    assert!(
        e.msg.contains("HTTP 502") && e.msg.contains("text/html"),
        "{}",
        e.msg
    );
    assert!(e.msg.contains("502 Bad Gateway"), "{}", e.msg);
    assert!(!e.msg.contains('<'), "no markup: {}", e.msg);
    assert!(e.msg.len() < 200, "short: {}", e.msg);
}

/// Issue 12 item 7: an endpoint that refuses connections is `Unreachable` at once (the
/// core then blocks the whole cloud); the adapter does not retry, and the message names
/// the endpoint without the key.
#[tokio::test]
async fn a_refused_connection_is_unreachable_at_once() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    let p = provider_at(format!("http://127.0.0.1:{port}"));
    let started = Instant::now();
    let e = p.plan(&ask_h100(&["us-east-1"])).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unreachable, "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(e.msg.contains(&format!("127.0.0.1:{port}")), "{}", e.msg);
    assert!(!e.msg.contains(SENTINEL), "{}", e.msg);
    let at = Location {
        cloud: "lambda".into(),
        region: "us-east-1".into(),
        zone: None,
    };
    assert_eq!(
        p.observe(&at, "trainer").await.unwrap_err().kind,
        ErrorKind::Unreachable
    );
}

/// Issue 12 items 4 and 5: the per-VM ruleset is the VM's side resource. While an instance
/// still uses it, Lambda refuses its deletion (`firewall-ruleset-in-use`): that is `InUse`
/// (the core observes again), not a failure; once the instance is terminated, cleanup
/// removes it and nothing of the VM is left on the spec server.
#[tokio::test]
async fn the_ruleset_is_in_use_until_the_instance_is_gone_then_removed() {
    let cloud = Cloud2::start(h100_world()).await;
    let p = cloud.provider();
    assert!(
        !p.capabilities().supports(Feature::Start),
        "Lambda has no stopped state: no start"
    );
    let offer = p.plan(&ask_h100(&["us-east-1"])).await.unwrap().remove(0);
    let spec = spec_for("trainer", vec![8080]);
    let prepared = drive::prepare(p.clone(), &offer, &spec).await.unwrap();
    let id = p.create(&offer, &prepared, &spec).await.unwrap();
    let at = offer.location.clone();
    assert_eq!(p.observe(&at, "trainer").await.unwrap().len(), 1);
    let e = p.cleanup(&at, "trainer").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InUse, "{e}");
    assert!(e.msg.contains("firewall-ruleset-in-use"), "{}", e.msg);
    assert_eq!(cloud.world.lock().unwrap().rulesets.len(), 1, "kept");

    p.delete(&at, "trainer", std::slice::from_ref(&id))
        .await
        .unwrap();
    // Terminating, then gone.
    for _ in 0..3 {
        if p.observe(&at, "trainer").await.unwrap().is_empty() {
            break;
        }
    }
    assert!(p.observe(&at, "trainer").await.unwrap().is_empty());
    p.cleanup(&at, "trainer").await.unwrap();
    {
        let w = cloud.world.lock().unwrap();
        assert!(
            w.rulesets.iter().all(|r| !r["name"]
                .as_str()
                .unwrap_or_default()
                .starts_with("gpuprov-trainer-")),
            "{:?}",
            w.rulesets
        );
    }
    // A delete of the id again (eventual consistency: unknown = success).
    p.delete(&at, "trainer", &[id]).await.unwrap();
    cloud.server.verify();
}

/// The shell script inside cloud-config user-data (`write_files[0]`, base64).
fn boot_script_of(user_data: &str) -> String {
    assert!(user_data.starts_with("#cloud-config\n"), "{user_data}");
    let doc: serde_yaml::Value = serde_yaml::from_str(user_data).unwrap();
    let content = doc["write_files"][0]["content"].as_str().unwrap();
    gpuprov::provider::boot::cloud_init::decode_gz_b64(content).expect("gzip in base64")
}

/// Issue 18's `import` on Lambda: an instance launched outside gpuprov (its own name and
/// tags) is renamed to the identity name (the API cannot change tags), after which
/// `observe` finds it and `delete` terminates it; an instance tagged for another VM, one in
/// another region, and an unknown id are refused as `InvalidRequest`.
#[tokio::test]
async fn import_renames_an_outside_instance_to_the_identity_name() {
    let mut world = h100_world();
    let outside = |id: &str, region_name: &str, tags: Value| {
        json!({
            "id": id,
            "name": "my own box",
            "status": "active",
            "ip": "127.0.0.9",
            "ssh_key_names": ["mine"],
            "file_system_names": [],
            "region": region(region_name),
            "instance_type": type_json("gpu_1x_a10", "A10 (24 GB PCIe)", 1, 75),
            "actions": {
                "migrate": {"available": false},
                "rebuild": {"available": false},
                "restart": {"available": false},
                "cold_reboot": {"available": false},
                "terminate": {"available": true}
            },
            "tags": tags,
        })
    };
    let (mine, theirs, west) = (
        "0123456789abcdef0123456789abcde1",
        "0123456789abcdef0123456789abcde2",
        "0123456789abcdef0123456789abcde3",
    );
    world.instances.push(outside(
        mine,
        "us-east-1",
        json!([{"key": "team", "value": "ml"}]),
    ));
    world.instances.push(outside(
        theirs,
        "us-east-1",
        json!([{"key": "gpuprov-vm-name", "value": "other"}]),
    ));
    world.instances.push(outside(west, "us-west-1", json!([])));
    let cloud = Cloud2::start(world).await;
    let p = cloud.provider();
    let at = Location {
        cloud: "lambda".into(),
        region: "us-east-1".into(),
        zone: None,
    };
    assert!(p.observe(&at, "trainer").await.unwrap().is_empty());
    let got = p.import(&at, "trainer", mine).await.unwrap();
    assert_eq!(got.observed.instance_id, mine);
    assert!(
        got.identity.contains("renamed to gpuprov-trainer-"),
        "{}",
        got.identity
    );
    let seen = p.observe(&at, "trainer").await.unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].instance_id, mine);
    for (id, why) in [
        (theirs, "another VM's identity"),
        (west, "another region"),
        ("ffffffffffffffffffffffffffffffff", "unknown"),
    ] {
        let e = p.import(&at, "trainer", id).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidRequest, "{why}: {e:?}");
    }
    p.delete(&at, "trainer", &[mine.to_string()]).await.unwrap();
    let renames = cloud
        .server
        .requests_to("POST", &format!("/api/v1/instances/{mine}"));
    assert_eq!(renames.len(), 1);
    cloud.server.verify();
}

/// Issue 20 on a real adapter path: 20 machines observing one Lambda region at once make
/// one `GET /api/v1/instances` through the core's shared observation (counted at the
/// spec-checked server), against one each per machine without it; every machine sees its
/// own instance, and an instance imported by name only (no tags) is still found.
#[tokio::test]
async fn observes_of_many_machines_in_one_region_share_one_listing() {
    const N: usize = 20;
    let cloud = Cloud2::start(h100_world()).await;
    {
        let mut w = cloud.world.lock().unwrap();
        for i in 0..N {
            let vm = format!("m{i:02}");
            let mut body = json!({
                "instance_type_name": "gpu_8x_h100_sxm5",
                "region_name": "us-east-1",
                "ssh_key_names": [],
                "name": format!("gpuprov-{vm}-0f0e0d0c"),
            });
            // The last one carries the identity by name only, as an imported one does.
            if i + 1 < N {
                body["tags"] = json!([
                    {"key": "gpuprov-vm-name", "value": vm},
                    {"key": "gpuprov-lineage", "value": LINEAGE},
                ]);
            }
            w.launch(&body);
        }
    }
    let at = Location {
        cloud: "lambda".into(),
        region: "us-east-1".into(),
        zone: None,
    };
    let mut calls = Vec::new();
    for shared in [false, true] {
        let mut providers = match shared {
            true => gpuprov::machine::Providers::new(),
            false => gpuprov::machine::Providers::per_machine_observe(),
        };
        providers.insert(cloud.provider());
        let lambda = providers.get("lambda").unwrap().clone();
        let before = cloud.server.requests_to("GET", "/api/v1/instances").len();
        let seen = futures_util::future::join_all((0..N).map(|i| {
            let (lambda, at) = (lambda.clone(), at.clone());
            async move { lambda.observe(&at, &format!("m{i:02}")).await.unwrap() }
        }))
        .await;
        calls.push(cloud.server.requests_to("GET", "/api/v1/instances").len() - before);
        let ids: std::collections::BTreeSet<String> = seen
            .iter()
            .map(|s| {
                assert_eq!(s.len(), 1, "each machine sees its own instance: {s:?}");
                s[0].instance_id.clone()
            })
            .collect();
        assert_eq!(ids.len(), N, "no machine sees another's instance");
    }
    assert_eq!(calls, [N, 1], "per machine, then shared");
    cloud.server.verify();
}

/// Issue 20, gpuprov's own overhead on one launch and one destroy, on a REST adapter's
/// spec-checked server: the instance turns active 2 s after its launch and terminated
/// 1 s after its terminate request (real time); SSH is up at once (the fake connector).
/// What the wall time adds to those is gpuprov's (polling, prepare, API round trips).
/// A figure, not a timed assertion: written to `<target>/reliability/launch_overhead.json`
/// for BENCHMARKS.md (goals: launch overhead ≤ 1 s median, destroy ≤ 2 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launch_and_destroy_overhead_on_the_spec_server() {
    const BOOT: Duration = Duration::from_secs(2);
    const TERMINATION: Duration = Duration::from_secs(1);
    let (mut launch, mut destroy) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let mut world = h100_world();
        world.timed = Some((BOOT, TERMINATION));
        let mut r = run(world).await;
        r.vm.regions = vec!["us-east-1".into()];
        let started = Instant::now();
        let end = r.launch().await.unwrap();
        launch.push(started.elapsed().as_secs_f64() - BOOT.as_secs_f64());
        let vm = end
            .ready()
            .unwrap_or_else(|| panic!("not ready: {end:?} {:?}", r.labels()))
            .clone();
        // It really waited for the boot: the listing said booting first.
        assert!(r.labels().iter().any(|l| l.starts_with("booting")));
        let started = Instant::now();
        let end = r
            .teardown(Target::new(
                vm.location.clone(),
                "trainer",
                vec![vm.instance_id.clone()],
            ))
            .await;
        assert_eq!(end, TeardownState::Done);
        destroy.push(started.elapsed().as_secs_f64());
        assert_eq!(
            r.cloud.world.lock().unwrap().instances[0]["status"],
            "terminated"
        );
        r.cloud.server.verify();
    }
    let median = |xs: &mut Vec<f64>| {
        xs.sort_by(f64::total_cmp);
        xs[xs.len() / 2]
    };
    crate::support::figures::write(
        "launch_overhead",
        &json!({
            "cloud": "lambda (spec-checked local server)",
            "boot_s": BOOT.as_secs_f64(),
            "termination_s": TERMINATION.as_secs_f64(),
            "runs": launch.len(),
            "launch_overhead_s": launch.clone(),
            "launch_overhead_median_s": median(&mut launch),
            "destroy_s": destroy.clone(),
            "destroy_median_s": median(&mut destroy),
        }),
    );
}

/// Lambda declares its documented rates (API description `info.description`): every
/// request one per second, launch requests one per 12 s.
#[test]
fn the_documented_rate_limits_are_declared_with_their_source() {
    use gpuprov::provider::EndpointClass;
    let caps = LambdaProvider::default_capabilities();
    let windows: Vec<(Option<EndpointClass>, u32, u64)> = caps
        .rate_limits
        .iter()
        .map(|l| (l.class, l.requests, l.per.as_secs()))
        .collect();
    assert_eq!(
        windows,
        vec![(None, 1, 1), (Some(EndpointClass::Launch), 1, 12)]
    );
    let doc = spec::lambda();
    let text = doc.doc()["info"]["description"].as_str().unwrap();
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(text.contains("generally limited to one request per second"));
    assert!(text.contains("limited to one request per 12 seconds"));
    assert!(caps
        .rate_limits
        .iter()
        .all(|l| l.source.contains("openapi-1.8.3.json")));
}
