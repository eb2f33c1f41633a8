//! The Verda adapter against a local fake of Verda's API v1 whose every request and
//! response is checked against the description derived from the vendor's Python SDK
//! (`support::spec::verda`), including its OAuth2 token endpoint. The launch and teardown
//! machines run for real; SSH is the `FakeConnector` (127.0.0.x addresses, nothing dialled).
//!
//! What the conformance suite does not hold every cloud to: the access token refreshed
//! mid-apply (and renewed after the API revoked it), the startup script created from the
//! boot script and removed by cleanup, the two teardown refusals, `no_capacity`, and where
//! the client credentials were found.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpuprov::config::Cloud;
use gpuprov::provider::kit::CredentialReport;
use gpuprov::provider::clouds::verda::{VerdaProvider, VerdaSettings};
use gpuprov::provider::{
    BootScript, CloudProvider, ErrorKind, InstanceSpec, InstanceStatus, Location, ResourceRequest,
    Secret,
};
use gpuprov::vm::{Target, TeardownState};
use serde_json::{json, Value};

use crate::support::drive::{self, LINEAGE, PUBKEY};
use crate::support::faults::{query, Faults};
use crate::support::spec::{self, Canned, Seen, SpecServer};

/// The sentinel client secret: never in any error, reason, journal entry or log.
pub(crate) const SENTINEL: &str = "verda_client_secret_sentinel_2c9d7e";
pub(crate) const CLIENT_ID: &str = "verda-test-client";
pub(crate) const TOKEN: &str = "/v1/oauth2/token";
pub(crate) const INSTANCES: &str = "/v1/instances";
pub(crate) const KEYS: &str = "/v1/sshkeys";
pub(crate) const SCRIPTS: &str = "/v1/scripts";
/// The main type: 8 × H100 SXM5.
pub(crate) const H100: &str = "8H100.80S.176V";

/// The fake Verda account.
pub(crate) struct World {
    /// `InstanceType` objects.
    pub(crate) types: Vec<Value>,
    /// location → instance types available on demand.
    pub(crate) available: BTreeMap<String, Vec<String>>,
    pub(crate) keys: Vec<Value>,
    pub(crate) scripts: Vec<Value>,
    pub(crate) instances: Vec<Value>,
    pub(crate) volumes: Vec<Value>,
    pub(crate) faults: Faults,
    /// Lifetime of the access tokens issued, seconds.
    pub(crate) expires_in: f64,
    /// Access token → when it expires; refresh tokens still valid.
    access: BTreeMap<String, Instant>,
    refresh: Vec<String>,
    /// Answers 401 to an access token (expired or revoked), how many.
    pub(crate) refused_tokens: usize,
    /// How long a new instance stays `provisioning`.
    pub(crate) provisioning: Duration,
    /// The next create ends `no_capacity` instead of running.
    pub(crate) no_capacity_next: bool,
    ready_at: BTreeMap<String, Instant>,
    next: u32,
}

impl Default for World {
    fn default() -> World {
        World {
            types: vec![],
            available: BTreeMap::new(),
            keys: vec![],
            scripts: vec![],
            instances: vec![],
            volumes: vec![],
            faults: Faults::default(),
            expires_in: 3600.0,
            access: BTreeMap::new(),
            refresh: vec![],
            refused_tokens: 0,
            provisioning: Duration::ZERO,
            no_capacity_next: false,
            ready_at: BTreeMap::new(),
            next: 0,
        }
    }
}

/// An error body in Verda's envelope.
pub(crate) fn err(code: &str, message: &str) -> Value {
    json!({ "code": code, "message": message })
}

fn size(gb: u32) -> Value {
    json!({ "description": format!("{gb} GB"), "size_in_gigabytes": gb })
}

impl World {
    /// Adds type `name` (`gpus` × `model`, USD `price` on demand) available in `locations`.
    pub(crate) fn with_type(
        mut self,
        name: &str,
        model: &str,
        gpus: u32,
        price: f64,
        locations: &[&str],
    ) -> World {
        self.types.push(json!({
            "id": format!("t-{name}"),
            "instance_type": name,
            "price_per_hour": format!("{price:.2}"),
            "spot_price": price / 3.0,
            "description": format!("{gpus}x {model}"),
            "cpu": {"description": "176 CPU", "number_of_cores": 176},
            "gpu": {"description": format!("{gpus}x {model} SXM5 80GB"), "number_of_gpus": gpus},
            "memory": size(1480), "gpu_memory": size(640), "storage": size(0),
            "best_for": ["training"], "model": model, "name": format!("{model} SXM5 80GB"),
            "p2p": "900 GB/s", "currency": "usd", "manufacturer": "NVIDIA",
            "display_name": format!("{gpus}x {model}"), "supported_os": ["ubuntu-24.04"],
        }));
        for l in locations {
            self.available
                .entry(l.to_string())
                .or_default()
                .push(name.into());
        }
        self
    }

    /// Revokes every token issued so far, access and refresh.
    pub(crate) fn revoke_all(&mut self) {
        self.access.clear();
        self.refresh.clear();
    }

    /// Whether `req` carries a live access token; counts a refusal when not.
    fn authorised(&mut self, req: &Seen) -> bool {
        let auth = crate::support::faults::authorization(req);
        let live = auth
            .strip_prefix("Bearer ")
            .and_then(|t| self.access.get(t))
            .is_some_and(|until| Instant::now() < *until);
        if !live {
            self.refused_tokens += 1;
        }
        live
    }

    fn issue(&mut self) -> Canned {
        self.next += 1;
        let (access, refresh) = (format!("tok-{}", self.next), format!("ref-{}", self.next));
        self.access.insert(
            access.clone(),
            Instant::now() + Duration::from_secs_f64(self.expires_in),
        );
        self.refresh.push(refresh.clone());
        Canned::ok(json!({
            "access_token": access, "refresh_token": refresh, "scope": "cloud-api-v1",
            "token_type": "Bearer", "expires_in": self.expires_in,
        }))
    }

    fn token(&mut self, b: &Value) -> Canned {
        match b["grant_type"].as_str() {
            Some("client_credentials")
                if b["client_id"] == CLIENT_ID && b["client_secret"] == SENTINEL =>
            {
                self.issue()
            }
            Some("refresh_token") => match b["refresh_token"].as_str() {
                Some(r) if self.refresh.iter().any(|x| x == r) => {
                    self.refresh.retain(|x| x != r);
                    self.issue()
                }
                _ => Canned::status(400, err("invalid_request", "Invalid refresh token")),
            },
            _ => Canned::status(
                401,
                err("unauthorized_request", "Invalid client credentials"),
            ),
        }
    }

    fn create(&mut self, b: &Value) -> Canned {
        let ty = b["instance_type"].as_str().unwrap_or_default().to_string();
        let loc = b["location_code"].as_str().unwrap_or("FIN-03").to_string();
        if !self.types.iter().any(|t| t["instance_type"] == ty.as_str()) {
            return Canned::status(404, err("not_found", "Instance type not found"));
        }
        for k in b["ssh_key_ids"].as_array().into_iter().flatten() {
            if !self.keys.iter().any(|x| x["id"] == *k) {
                return Canned::status(400, err("invalid_request", "Unknown ssh key"));
            }
        }
        if let Some(s) = b["startup_script_id"].as_str() {
            if !self.scripts.iter().any(|x| x["id"] == s) {
                return Canned::status(400, err("invalid_request", "Unknown startup script"));
            }
        }
        self.next += 1;
        let id = format!("deadc0de-a5d2-4972-ae4e-{:012x}", self.next);
        let os = format!("os-{}", self.next);
        self.volumes.push(json!({
            "id": os, "status": "attached", "name": b["os_volume"]["name"], "size": b["os_volume"]["size"],
            "type": "NVMe", "is_os_volume": true, "created_at": "2026-11-30T20:00:00Z",
            "location": loc, "instance_id": id, "ssh_key_ids": [],
        }));
        let status = if std::mem::take(&mut self.no_capacity_next) {
            "no_capacity"
        } else {
            "provisioning"
        };
        self.instances.push(json!({
            "id": id, "instance_type": ty, "price_per_hour": 19.92,
            "hostname": b["hostname"], "description": b["description"], "status": status,
            "created_at": "2026-11-30T20:00:00Z", "ssh_key_ids": b["ssh_key_ids"],
            "cpu": {"description": "176 CPU", "number_of_cores": 176},
            "gpu": {"description": "8x H100", "number_of_gpus": 8},
            "memory": size(1480), "gpu_memory": size(640), "storage": size(0),
            "ip": null, "os_volume_id": os, "location": loc, "image": b["image"],
            "startup_script_id": b["startup_script_id"], "is_spot": b["is_spot"],
        }));
        self.ready_at
            .insert(id.clone(), Instant::now() + self.provisioning);
        Canned::text(200, &id)
    }

    /// The list as Verda shows it now (discontinued instances are not listed); then every
    /// provisioning instance whose time has come runs with a loopback address.
    fn list(&mut self) -> Canned {
        let out: Vec<Value> = self
            .instances
            .iter()
            .filter(|i| i["status"] != "discontinued")
            .cloned()
            .collect();
        for (n, i) in self.instances.iter_mut().enumerate() {
            let id = i["id"].as_str().unwrap_or_default().to_string();
            let due = self.ready_at.get(&id).is_none_or(|t| Instant::now() >= *t);
            if i["status"] == "provisioning" && due {
                i["status"] = json!("running");
                i["ip"] = json!(format!("127.0.0.{}", 40 + n));
            }
        }
        Canned::ok(json!(out))
    }

    fn action(&mut self, b: &Value) -> Canned {
        if b["action"] != "delete" {
            return Canned::status(400, err("invalid_request", "Unsupported action"));
        }
        let ids: Vec<String> = b["id"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        for id in &ids {
            let Some(i) = self.instances.iter().find(|i| i["id"] == id.as_str()) else {
                return Canned::status(404, err("not_found", "Instance not found"));
            };
            match i["status"].as_str() {
                Some("provisioning") => {
                    return Canned::status(
                        400,
                        err(
                            "invalid_request",
                            "Can't discontinue a provisioning instance",
                        ),
                    )
                }
                Some("discontinued") => {
                    return Canned::status(
                        400,
                        err("invalid_request", "Instance is already discontinued"),
                    )
                }
                _ => {}
            }
        }
        let vols: Vec<String> = b["volume_ids"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        for i in self
            .instances
            .iter_mut()
            .filter(|i| ids.iter().any(|id| i["id"] == id.as_str()))
        {
            i["status"] = json!("discontinued");
        }
        if b["delete_permanently"] == true {
            self.volumes
                .retain(|v| !vols.iter().any(|id| v["id"] == id.as_str()));
        }
        for v in self
            .volumes
            .iter_mut()
            .filter(|v| ids.iter().any(|id| v["instance_id"] == id.as_str()))
        {
            v["instance_id"] = Value::Null;
            v["status"] = json!("detached");
        }
        Canned::empty(204)
    }

    /// Instances not discontinued.
    pub(crate) fn live(&self) -> usize {
        self.instances
            .iter()
            .filter(|i| i["status"] != "discontinued")
            .count()
    }
}

/// A started fake and its world.
pub(crate) struct Fake {
    pub(crate) server: SpecServer,
    pub(crate) world: Arc<Mutex<World>>,
}

/// The client secret of a token request, for the hostile echo.
fn body_secret(req: &Seen) -> String {
    req.body
        .as_ref()
        .and_then(|b| b["client_secret"].as_str())
        .unwrap_or_default()
        .to_string()
}

impl Fake {
    pub(crate) async fn start(world: World) -> Fake {
        let server = SpecServer::start(Arc::new(spec::verda())).await;
        let world = Arc::new(Mutex::new(world));
        // Every API route answers only a live access token (else 401, as Verda does).
        macro_rules! route {
            ($method:expr, $re:expr, |$w:ident, $req:ident| $body:expr) => {{
                let wc = world.clone();
                server
                    .mount_fn($method, $re, move |$req: &Seen| {
                        let mut $w = wc.lock().unwrap();
                        if let Some(f) = $w.faults.take($req, "/message", body_secret) {
                            return f;
                        }
                        if !$w.authorised($req) {
                            return Canned::status(
                                401,
                                err("unauthorized_request", "Access token expired"),
                            );
                        }
                        $body
                    })
                    .await;
            }};
        }
        let wc = world.clone();
        server
            .mount_fn("POST", "^/v1/oauth2/token$", move |r: &Seen| {
                let mut w = wc.lock().unwrap();
                if let Some(f) = w.faults.take(r, "/message", body_secret) {
                    return f;
                }
                w.token(&r.body.clone().unwrap_or_default())
            })
            .await;
        route!("GET", "^/v1/instance-types$", |w, _r| Canned::ok(json!(
            w.types
        )));
        route!("GET", "^/v1/instance-availability$", |w, r| {
            let spot = query(r, "isSpot") == Some("true");
            let list: Vec<Value> = w
                .available
                .iter()
                .map(|(l, ts)| json!({"location_code": l, "availabilities": if spot { vec![] } else { ts.clone() }}))
                .collect();
            Canned::ok(json!(list))
        });
        route!("GET", "^/v1/instance-availability/[^/]+$", |w, r| {
            let ty = r.path.rsplit('/').next().unwrap_or_default();
            let loc = query(r, "location_code").unwrap_or("FIN-03");
            let ok = w
                .available
                .get(loc)
                .is_some_and(|ts| ts.iter().any(|t| t == ty));
            Canned::ok(json!(ok))
        });
        route!("GET", "^/v1/images$", |_w, _r| Canned::ok(json!([
            {"id": "img-1", "name": "Ubuntu 22.04 + CUDA 12.4 + Docker", "image_type": "ubuntu-22.04-cuda-12.4-docker", "details": []},
            {"id": "img-2", "name": "Ubuntu 24.04 + CUDA 12.8 Open + Docker", "image_type": "ubuntu-24.04-cuda-12.8-open-docker", "details": []},
        ])));
        route!("GET", "^/v1/sshkeys$", |w, _r| Canned::ok(json!(w.keys)));
        route!("POST", "^/v1/sshkeys$", |w, r| {
            let b = r.body.clone().unwrap_or_default();
            w.next += 1;
            let id = format!("key-{}", w.next);
            w.keys
                .push(json!({"id": id, "name": b["name"], "key": b["key"]}));
            Canned::text(201, &id)
        });
        route!("DELETE", "^/v1/sshkeys/[^/]+$", |w, r| {
            let id = r.path.rsplit('/').next().unwrap_or_default().to_string();
            let before = w.keys.len();
            w.keys.retain(|k| k["id"] != id.as_str());
            if w.keys.len() == before {
                Canned::status(404, err("not_found", "SSH key not found"))
            } else {
                Canned::empty(204)
            }
        });
        route!("GET", "^/v1/scripts$", |w, _r| Canned::ok(json!(w.scripts)));
        route!("POST", "^/v1/scripts$", |w, r| {
            let b = r.body.clone().unwrap_or_default();
            let id = format!("script-{}", w.scripts.len() + 1);
            w.scripts
                .push(json!({"id": id, "name": b["name"], "script": b["script"]}));
            Canned::text(201, &id)
        });
        route!("DELETE", "^/v1/scripts/[^/]+$", |w, r| {
            let id = r.path.rsplit('/').next().unwrap_or_default().to_string();
            let before = w.scripts.len();
            w.scripts.retain(|s| s["id"] != id.as_str());
            if w.scripts.len() == before {
                Canned::status(404, err("not_found", "Script not found"))
            } else {
                Canned::empty(204)
            }
        });
        route!("GET", "^/v1/instances$", |w, _r| w.list());
        route!("POST", "^/v1/instances$", |w, r| w
            .create(&r.body.clone().unwrap_or_default()));
        route!("PUT", "^/v1/instances$", |w, r| w
            .action(&r.body.clone().unwrap_or_default()));
        route!("GET", "^/v1/volumes$", |w, _r| Canned::ok(json!(w.volumes)));
        route!("DELETE", "^/v1/volumes/[^/]+$", |w, r| {
            let id = r.path.rsplit('/').next().unwrap_or_default().to_string();
            w.volumes.retain(|v| v["id"] != id.as_str());
            Canned::empty(204)
        });
        Fake { server, world }
    }

    pub(crate) fn provider_with(&self, client: Option<(&str, &str)>) -> Arc<VerdaProvider> {
        // The fake lists an instance as soon as it is created: no listing lag to wait out
        // after a late `no_capacity` refusal.
        let caps = gpuprov::provider::Capabilities {
            create_list_lag: Duration::from_millis(300),
            ..drive::test_capabilities(VerdaProvider::default_capabilities())
        };
        Arc::new(
            VerdaProvider::new(VerdaSettings {
                endpoint: Some(format!("{}/v1", self.server.uri())),
                client: client.map(|(id, s)| (id.to_string(), Secret::new(s))),
                key_source: "the VERDA_CLIENT_ID and VERDA_CLIENT_SECRET environment variables"
                    .into(),
                lineage: LINEAGE.parse().unwrap(),
            })
            .with_capabilities(caps),
        )
    }

    pub(crate) fn provider(&self) -> Arc<VerdaProvider> {
        self.provider_with(Some((CLIENT_ID, SENTINEL)))
    }

    pub(crate) fn creates(&self) -> Vec<Value> {
        self.server
            .requests_to("POST", INSTANCES)
            .into_iter()
            .filter_map(|r| r.body)
            .collect()
    }

    /// The grant types of the token requests so far, in order.
    pub(crate) fn grants(&self) -> Vec<String> {
        self.server
            .requests_to("POST", TOKEN)
            .iter()
            .map(|r| {
                r.body.as_ref().unwrap()["grant_type"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect()
    }
}

/// 8 × H100 on demand in FIN-01 and ICE-01; 1 × H100 in FIN-01.
pub(crate) fn h100_world() -> World {
    World::default()
        .with_type(H100, "H100", 8, 19.92, &["FIN-01", "ICE-01"])
        .with_type("1H100.80S.22V", "H100", 1, 2.49, &["FIN-01"])
}

type Run = drive::Run<Fake, VerdaProvider>;

async fn run(world: World) -> Run {
    let fake = Fake::start(world).await;
    let provider = fake.provider();
    let mut vm = drive::gpu_vm(Cloud::Verda, "H100", 8);
    vm.regions = vec!["FIN-01".into()];
    Run::new(fake, provider, vm)
}

fn spec_of(boot: Option<BootScript>) -> InstanceSpec {
    InstanceSpec {
        vm_name: "trainer".into(),
        lineage: LINEAGE.into(),
        client_token: "t".into(),
        image: None,
        disk_gb: None,
        ports: vec![],
        ssh_public_key: PUBKEY.into(),
        boot_script: boot,
        shared: Default::default(),
    }
}

fn ask() -> ResourceRequest {
    ResourceRequest {
        vm_name: "trainer".into(),
        regions: vec!["FIN-01".into()],
        zones: vec![],
        gpu: Some("H100".into()),
        gpu_count: 8,
        spot: false,
        max_price_per_hour: None,
        gpu_count_at_least: false,
    }
}

fn fin01() -> Location {
    Location {
        cloud: "verda".into(),
        region: "FIN-01".into(),
        zone: None,
    }
}

/// Distinct bearer tokens the API (not the token endpoint) was called with.
fn tokens_used(fake: &Fake) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    for r in fake.server.requests().iter().filter(|r| r.path != TOKEN) {
        let t = crate::support::faults::authorization(r);
        if !seen.contains(&t) {
            seen.push(t);
        }
    }
    seen
}

#[tokio::test]
async fn the_token_is_refreshed_mid_apply_before_it_lapses() {
    let mut w = h100_world();
    // Tokens live one second; the instance provisions for 1.5 s: the apply outlives its
    // first token and must renew it (at 90 % of its life) without a single 401.
    w.expires_in = 1.0;
    w.provisioning = Duration::from_millis(1500);
    let r = run(w).await;
    let end = r.launch().await.unwrap();
    let vm = end
        .ready()
        .unwrap_or_else(|| panic!("{end:?} {:?}", r.labels()));
    assert_eq!(vm.offer.id, format!("verda/FIN-01/{H100}"));
    let grants = r.cloud.grants();
    assert_eq!(grants[0], "client_credentials", "{grants:?}");
    assert!(
        grants[1..].iter().any(|g| g == "refresh_token"),
        "renewed with the refresh grant: {grants:?}"
    );
    assert!(
        tokens_used(&r.cloud).len() >= 2,
        "the API saw the renewed token"
    );
    assert_eq!(
        r.cloud.world.lock().unwrap().refused_tokens,
        0,
        "no call was made with a lapsed token"
    );
    // The token request carried the client credentials in a JSON body, never a header.
    let first = &r.cloud.server.requests_to("POST", TOKEN)[0];
    assert_eq!(first.body.as_ref().unwrap()["client_id"], CLIENT_ID);
    assert!(crate::support::faults::authorization(first).is_empty());
    r.cloud.server.verify();
}

#[tokio::test]
async fn a_token_revoked_mid_apply_is_replaced_and_the_apply_goes_on() {
    let w = h100_world();
    let r = run(w).await;
    let p = r.provider.clone();
    let o = &p.plan(&ask()).await.unwrap()[0];
    let prep = p.prepare(o, &spec_of(None)).await.unwrap();
    // The server revokes every token, refresh tokens too: the next call is refused once,
    // as a stale token (retried, not a credentials abort), and the retry authenticates
    // again after the refused refresh.
    r.cloud.world.lock().unwrap().revoke_all();
    let e = p.create(o, &prep, &spec_of(None)).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient, "{e}");
    let id = p.create(o, &prep, &spec_of(None)).await.unwrap();
    assert_eq!(
        r.cloud.grants(),
        ["client_credentials", "refresh_token", "client_credentials"]
    );
    assert_eq!(r.cloud.world.lock().unwrap().refused_tokens, 1);
    let seen = p.observe(&fin01(), "trainer").await.unwrap();
    assert_eq!(seen[0].instance_id, id);
    assert!(
        !format!("{e:?}").contains("tok-") && !format!("{e:?}").contains(SENTINEL),
        "{e:?}"
    );
    r.cloud.server.verify();
}

#[tokio::test]
async fn wrong_client_credentials_abort_without_showing_the_secret() {
    let fake = Fake::start(h100_world()).await;
    let p = fake.provider_with(Some((CLIENT_ID, "not-the-secret")));
    let e = p.plan(&ask()).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Credentials, "{e}");
    assert!(
        e.msg.contains("refused the client credentials"),
        "{}",
        e.msg
    );
    assert!(e.text().contains("VERDA_CLIENT_ID"), "{}", e.text());
    assert_eq!(
        fake.server.requests().len(),
        1,
        "only the token endpoint was asked"
    );
    fake.server.verify();
}

#[tokio::test]
async fn the_boot_script_becomes_a_startup_script_that_cleanup_removes() {
    let fake = Fake::start(h100_world()).await;
    let p = fake.provider();
    let boot =
        BootScript::new("#!/bin/bash\necho k3s\n").with_env("K3S_TOKEN_FILE", "/etc/k3s-token");
    let o = &p.plan(&ask()).await.unwrap()[0];
    let prep = p.prepare(o, &spec_of(Some(boot.clone()))).await.unwrap();
    let scripts = fake.server.requests_to("POST", SCRIPTS);
    assert_eq!(scripts.len(), 1);
    let sb = scripts[0].body.clone().unwrap();
    assert_eq!(
        sb["script"],
        boot.to_shell().unwrap(),
        "the boot script's shell form"
    );
    let name = sb["name"].as_str().unwrap();
    assert!(
        name.starts_with("gpuprov-trainer-0f0e0d0c-fin-01-"),
        "{name}"
    );
    assert_eq!(prep["startup_script_id"], "script-1");
    // prepare again (a retried attempt): the same script is reused, not created twice.
    let again = p.prepare(o, &spec_of(Some(boot.clone()))).await.unwrap();
    assert_eq!(again["startup_script_id"], "script-1");
    assert_eq!(fake.server.requests_to("POST", SCRIPTS).len(), 1);
    let id = p.create(o, &prep, &spec_of(Some(boot))).await.unwrap();
    let cb = &fake.creates()[0];
    assert_eq!(cb["startup_script_id"], "script-1");
    assert_eq!(cb["hostname"], "gpuprov-trainer-0f0e0d0c");
    assert_eq!(
        cb["description"],
        format!("gpuprov-vm-name=trainer gpuprov-lineage={LINEAGE}")
    );
    assert_eq!(
        cb["os_volume"],
        json!({"name": "gpuprov-trainer-0f0e0d0c-fin-01-os", "size": 100})
    );
    assert_eq!(cb["image"], "ubuntu-24.04-cuda-12.8-open-docker");
    // Teardown: the instance with its OS volume, then cleanup removes the script.
    p.observe(&fin01(), "trainer").await.unwrap();
    p.delete(&fin01(), "trainer", std::slice::from_ref(&id))
        .await
        .unwrap();
    let os = fake.world.lock().unwrap().instances[0]["os_volume_id"].clone();
    let put = fake.server.requests_to("PUT", INSTANCES);
    let pb = put.last().unwrap().body.clone().unwrap();
    assert_eq!(
        pb,
        json!({"id": [id], "action": "delete", "volume_ids": [os], "delete_permanently": true})
    );
    p.cleanup(&fin01(), "trainer").await.unwrap();
    {
        let w = fake.world.lock().unwrap();
        assert!(w.scripts.is_empty(), "{:?}", w.scripts);
        assert!(w.volumes.is_empty(), "{:?}", w.volumes);
    }
    assert_eq!(
        fake.server
            .requests_to("DELETE", "/v1/scripts/script-1")
            .len(),
        1
    );
    p.cleanup(&fin01(), "trainer").await.unwrap();
    fake.server.verify();
}

#[tokio::test]
async fn teardown_retries_a_provisioning_instance_and_takes_already_discontinued_for_gone() {
    let mut w = h100_world();
    w.provisioning = Duration::from_millis(300);
    let r = run(w).await;
    let p = r.provider.clone();
    let o = &p.plan(&ask()).await.unwrap()[0];
    let prep = p.prepare(o, &spec_of(None)).await.unwrap();
    let id = p.create(o, &prep, &spec_of(None)).await.unwrap();
    // "Can't discontinue a provisioning instance": transient, the teardown tries again.
    let e = p
        .delete(&fin01(), "trainer", std::slice::from_ref(&id))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient, "{e}");
    assert!(e.msg.contains("provisioning instance"), "{}", e.msg);
    tokio::time::sleep(Duration::from_millis(350)).await;
    let end = r
        .teardown(Target::new(fin01(), "trainer", vec![id.clone()]))
        .await;
    assert_eq!(end, TeardownState::Done);
    assert_eq!(r.cloud.world.lock().unwrap().live(), 0);
    // "already discontinued" (the instance went between the listing and the action): gone.
    let id2 = p.create(o, &prep, &spec_of(None)).await.unwrap();
    p.observe(&fin01(), "trainer").await.unwrap();
    r.cloud.world.lock().unwrap().faults.push(
        "PUT",
        INSTANCES,
        Canned::status(
            400,
            json!({"code": "invalid_request", "message": "Instance is already discontinued"}),
        ),
    );
    p.delete(&fin01(), "trainer", std::slice::from_ref(&id2))
        .await
        .unwrap();
    r.cloud.server.verify();
}

#[tokio::test]
async fn no_capacity_after_the_create_is_a_capacity_refusal_and_fails_over() {
    let mut w = h100_world();
    w.no_capacity_next = true;
    let mut r = run(w).await;
    r.vm.regions = vec!["FIN-01".into(), "ICE-01".into()];
    let end = r.launch().await.unwrap();
    let vm = end
        .ready()
        .unwrap_or_else(|| panic!("{end:?} {:?}", r.labels()));
    assert_eq!(vm.location.region, "ICE-01", "failed over");
    let locs: Vec<Value> = r
        .cloud
        .creates()
        .iter()
        .map(|b| b["location_code"].clone())
        .collect();
    assert_eq!(locs, [json!("FIN-01"), json!("ICE-01")]);
    assert_eq!(
        r.cloud.world.lock().unwrap().live(),
        1,
        "the refused one was removed"
    );
    // Seen directly: observe lists it as refused for capacity, never as running.
    let fake = Fake::start(h100_world()).await;
    fake.world.lock().unwrap().no_capacity_next = true;
    let p = fake.provider();
    let o = &p.plan(&ask()).await.unwrap()[0];
    let prep = p.prepare(o, &spec_of(None)).await.unwrap();
    p.create(o, &prep, &spec_of(None)).await.unwrap();
    let seen = p.observe(&fin01(), "trainer").await.unwrap();
    match &seen[0].status {
        InstanceStatus::Refused(e) => assert_eq!(e.kind, ErrorKind::Capacity),
        other => panic!("{other:?}"),
    }
    r.cloud.server.verify();
    fake.server.verify();
}

#[tokio::test]
async fn validate_says_where_the_client_credentials_were_found() {
    let fake = Fake::start(h100_world()).await;
    assert_eq!(
        fake.provider().credentials().await,
        CredentialReport::Found(
            "the VERDA_CLIENT_ID and VERDA_CLIENT_SECRET environment variables".into()
        )
    );
    let none = fake.provider_with(None);
    assert!(none.credentials().await.is_missing());
    let e = none.plan(&ask()).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Credentials);
    assert!(e.msg.contains("VERDA_CLIENT_SECRET"), "{}", e.msg);
    assert!(
        fake.server.requests().is_empty(),
        "nothing sent without credentials"
    );
}
