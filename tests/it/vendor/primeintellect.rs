//! The Prime Intellect adapter against a local fake of its FastAPI API whose every request
//! and response is checked against the vendor's description as patched from its CLI
//! (`support::spec::primeintellect`). The launch, teardown and k3s machines run for real;
//! SSH is the `FakeConnector` and the scripted k3s node (127.0.0.x addresses, nothing
//! dialled).
//!
//! What the conformance suite does not hold every cloud to: the late `sshConnection` (the
//! pod boots until it appears), the NAT port, every shape of `sshConnection`, the SSH
//! tunnel as the cluster's access path (chosen from the capabilities: no firewall API), a
//! FastAPI 422 that aborts instead of failing over, and where the key was found.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuprov::cluster::k3s::{AccessRecord, K3sMachine, K3sState, K3sTimeouts};
use gpuprov::cluster::kubeconfig::ApiAccess;
use gpuprov::config::{Cloud, VmSpec};
use gpuprov::machine::{CancelToken, Executor, MemoryJournal, Providers};
use gpuprov::provider::doubles::fake::FakeConnector;
use gpuprov::provider::kit::CredentialReport;
use gpuprov::provider::clouds::primeintellect::{PrimeIntellectProvider, PrimeIntellectSettings};
use gpuprov::provider::{CloudProvider, ErrorKind, Feature, Secret};
use gpuprov::vm::{LaunchMachine, LaunchState};
use serde_json::{json, Value};

use crate::support::drive::{self, FAST, LINEAGE, PUBKEY};
use crate::support::faults::{authorization, query, Faults};
use crate::support::k3s::{ApiServer, Node, Pki, StandIn};
use crate::support::spec::{self, Canned, Seen, SpecServer};

/// The sentinel API key: never in any error, reason or journal entry.
pub(crate) const SENTINEL: &str = "pit_secret_sentinel_key_91ae3f";
pub(crate) const PODS: &str = "/api/v1/pods/";
pub(crate) const KEYS: &str = "/api/v1/ssh_keys/";
pub(crate) const AVAILABILITY: &str = "/api/v1/availability/gpus";

/// How a running pod's `sshConnection` is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `"root@<ip> -p <nat>"`, the description's own.
    UserHostPort,
    /// `["root@<ip> -p <nat>"]`, one entry per node.
    List,
    /// `[null, "root@<ip> -p <nat>"]`: a node still coming up.
    ListWithNull,
    /// `"ubuntu@<ip> -p <nat>"`: the provider picks another user.
    OtherUser,
    /// `"<ip>"`: the port only in `primePortMapping` (22 → the NAT port).
    HostOnly,
}

/// The fake Prime Intellect account.
pub(crate) struct World {
    /// `GpuAvailability` items.
    pub(crate) configs: Vec<Value>,
    pub(crate) keys: Vec<Value>,
    pub(crate) pods: Vec<Value>,
    pub(crate) faults: Faults,
    pub(crate) shape: Shape,
    /// Listings a pod shows `ACTIVE` with `sshConnection: null` before the connection
    /// appears.
    pub(crate) late: u32,
    shown_active: std::collections::BTreeMap<String, u32>,
    next: u32,
}

impl Default for World {
    fn default() -> World {
        World {
            configs: vec![],
            keys: vec![],
            pods: vec![],
            faults: Faults::default(),
            shape: Shape::UserHostPort,
            late: 2,
            shown_active: Default::default(),
            next: 0,
        }
    }
}

/// FastAPI's error body.
pub(crate) fn detail(text: &str) -> Value {
    json!({ "detail": text })
}

fn spec_value(default: u32) -> Value {
    json!({"minCount": null, "defaultCount": default, "maxCount": null, "pricePerUnit": null,
           "step": null, "defaultIncludedInPrice": null, "additionalInfo": null})
}

impl World {
    /// Adds a configuration: `count` × `gpu_type` from `provider` as `cloud_id` in data
    /// centre `dc`, secure (`price` on demand) or community (`price` community), in stock.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn with_config(
        mut self,
        cloud_id: &str,
        gpu_type: &str,
        count: u32,
        provider: &str,
        dc: &str,
        community: bool,
        price: f64,
    ) -> World {
        self.configs.push(json!({
            "cloudId": cloud_id, "gpuType": gpu_type, "socket": "SXM5", "provider": provider,
            "region": "united_states", "dataCenter": dc, "country": "US", "gpuCount": count,
            "gpuMemory": 80, "disk": spec_value(1000), "sharedDisk": {}, "vcpu": spec_value(104),
            "memory": spec_value(900), "internetSpeed": null, "interconnect": null,
            "interconnectType": null, "provisioningTime": 5, "stockStatus": "Available",
            "security": if community { "community_cloud" } else { "secure_cloud" },
            "prices": {
                "onDemand": if community { Value::Null } else { json!(price) },
                "communityPrice": if community { json!(price) } else { Value::Null },
                "isVariable": false, "currency": "USD"
            },
            "images": ["ubuntu_22_cuda_12"], "isSpot": null, "prepaidTime": null,
        }));
        self
    }

    fn availability(&self, r: &Seen) -> Canned {
        let count = query(r, "gpu_count").and_then(|c| c.parse::<u64>().ok());
        let matching: Vec<Value> = self
            .configs
            .iter()
            .filter(|c| count.is_none_or(|n| c["gpuCount"] == n))
            .filter(|c| query(r, "cloud_id").is_none_or(|id| c["cloudId"] == id))
            .filter(|c| query(r, "data_center_id").is_none_or(|dc| c["dataCenter"] == dc))
            .cloned()
            .collect();
        let page: usize = query(r, "page").and_then(|p| p.parse().ok()).unwrap_or(1);
        let size: usize = query(r, "page_size")
            .and_then(|p| p.parse().ok())
            .unwrap_or(100);
        let items: Vec<Value> = matching
            .iter()
            .skip((page - 1) * size)
            .take(size)
            .cloned()
            .collect();
        Canned::ok(json!({ "items": items, "totalCount": matching.len() }))
    }

    fn create(&mut self, b: &Value) -> Canned {
        let pod = &b["pod"];
        let Some(conf) = self
            .configs
            .iter()
            .find(|c| c["cloudId"] == pod["cloudId"] && c["dataCenter"] == pod["dataCenterId"])
            .cloned()
        else {
            return Canned::status(404, detail("No such configuration"));
        };
        if conf["stockStatus"] == "Unavailable" {
            return Canned::status(400, detail("This configuration is out of stock"));
        }
        if !self.keys.iter().any(|k| k["id"] == pod["sshKeyId"]) {
            return Canned::status(404, detail("SSH key not found"));
        }
        self.next += 1;
        let id = format!("5e3d0c1a-0000-4000-8000-{:012x}", self.next);
        self.pods.push(json!({
            "id": id, "userId": "u-1", "teamId": null, "walletId": null, "name": pod["name"],
            "type": "HOSTED", "providerType": b["provider"]["type"], "status": "PROVISIONING",
            "installationStatus": "PENDING", "installationFailure": null,
            "installationProgress": 0, "createdAt": "2026-11-30T20:00:00Z",
            "updatedAt": "2026-11-30T20:00:00Z", "terminatedAt": null,
            "gpuName": pod["gpuType"], "gpuCount": pod["gpuCount"], "socket": pod["socket"],
            "priceHr": conf["prices"]["onDemand"].as_f64().or(conf["prices"]["communityPrice"].as_f64()),
            "stoppedPriceHr": null, "provisioningPriceHr": 0.0, "environmentType": "ubuntu_22_cuda_12",
            "customTemplateId": null, "primePortMapping": [], "sshConnection": null,
            "ip": null, "resources": {"memory": 900, "disk": 1000, "vcpus": 104},
            "attachedResources": [], "isSpot": false, "autoRestart": false,
        }));
        Canned::ok(self.pods.last().unwrap().clone())
    }

    /// The list as the API shows it now; then provisioning pods become active, active ones
    /// get their connection after `late` listings, and terminated ones leave the list.
    fn list(&mut self, r: &Seen) -> Canned {
        let offset: usize = query(r, "offset").and_then(|p| p.parse().ok()).unwrap_or(0);
        let limit: usize = query(r, "limit")
            .and_then(|p| p.parse().ok())
            .unwrap_or(100);
        let data: Vec<Value> = self.pods.iter().skip(offset).take(limit).cloned().collect();
        let out =
            json!({"total_count": self.pods.len(), "offset": offset, "limit": limit, "data": data});
        self.pods.retain(|p| p["status"] != "TERMINATED");
        for (n, p) in self.pods.iter_mut().enumerate() {
            let id = p["id"].as_str().unwrap_or_default().to_string();
            match p["status"].as_str() {
                Some("PROVISIONING") => p["status"] = json!("ACTIVE"),
                Some("ACTIVE") if p["sshConnection"].is_null() => {
                    let shown = self.shown_active.entry(id).or_default();
                    *shown += 1;
                    if *shown > self.late {
                        let ip = format!("127.0.0.{}", 60 + n);
                        let nat = 40000 + n as u16;
                        p["ip"] = json!(ip);
                        p["installationStatus"] = json!("FINISHED");
                        p["primePortMapping"] = json!([
                            {"internal": "22", "external": nat.to_string(), "protocol": "TCP", "usedBy": "SSH", "description": null}
                        ]);
                        p["sshConnection"] = match self.shape {
                            Shape::UserHostPort => json!(format!("root@{ip} -p {nat}")),
                            Shape::List => json!([format!("root@{ip} -p {nat}")]),
                            Shape::ListWithNull => json!([null, format!("root@{ip} -p {nat}")]),
                            Shape::OtherUser => json!(format!("ubuntu@{ip} -p {nat}")),
                            Shape::HostOnly => json!(ip),
                        };
                    }
                }
                _ => {}
            }
        }
        Canned::ok(out)
    }

    fn delete(&mut self, id: &str) -> Canned {
        match self.pods.iter_mut().find(|p| p["id"] == id) {
            Some(p) => {
                p["status"] = json!("TERMINATED");
                Canned::ok(json!({"status": "TERMINATED"}))
            }
            None => Canned::status(404, detail("Pod not found")),
        }
    }

    /// Pods not terminated.
    pub(crate) fn live(&self) -> usize {
        self.pods
            .iter()
            .filter(|p| p["status"] != "TERMINATED")
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
        let server = SpecServer::start(Arc::new(spec::primeintellect())).await;
        let world = Arc::new(Mutex::new(world));
        macro_rules! route {
            ($method:expr, $re:expr, |$w:ident, $req:ident| $body:expr) => {{
                let wc = world.clone();
                server
                    .mount_fn($method, $re, move |$req: &Seen| {
                        let mut $w = wc.lock().unwrap();
                        if let Some(f) = $w.faults.take($req, "/detail", authorization) {
                            return f;
                        }
                        $body
                    })
                    .await;
            }};
        }
        route!("GET", "^/api/v1/availability/gpus$", |w, r| w
            .availability(r));
        route!("GET", "^/api/v1/ssh_keys/$", |w, _r| {
            let n = w.keys.len();
            Canned::ok(json!({"total_count": n, "offset": 0, "limit": 100, "data": w.keys}))
        });
        route!("POST", "^/api/v1/ssh_keys/$", |w, r| {
            let b = r.body.clone().unwrap_or_default();
            w.next += 1;
            let k = json!({"id": format!("key-{}", w.next), "userId": "u-1", "name": b["name"],
                           "publicKey": b["publicKey"], "isPrimary": false, "isUserKey": true});
            w.keys.push(k.clone());
            Canned::ok(k)
        });
        route!("DELETE", "^/api/v1/ssh_keys/[^/]+$", |w, r| {
            let id = r.path.rsplit('/').next().unwrap_or_default().to_string();
            let before = w.keys.len();
            w.keys.retain(|k| k["id"] != id.as_str());
            if w.keys.len() == before {
                Canned::status(404, detail("SSH key not found"))
            } else {
                Canned::ok(json!({}))
            }
        });
        route!("GET", "^/api/v1/pods/$", |w, r| w.list(r));
        route!("POST", "^/api/v1/pods/$", |w, r| w
            .create(&r.body.clone().unwrap_or_default()));
        route!("DELETE", "^/api/v1/pods/[^/]+$", |w, r| {
            let id = r.path.rsplit('/').next().unwrap_or_default().to_string();
            w.delete(&id)
        });
        Fake { server, world }
    }

    pub(crate) fn provider_with(&self, key: Option<&str>) -> Arc<PrimeIntellectProvider> {
        let caps = drive::test_capabilities(PrimeIntellectProvider::default_capabilities());
        Arc::new(
            PrimeIntellectProvider::new(PrimeIntellectSettings {
                endpoint: Some(self.server.uri()),
                api_key: key.map(Secret::new),
                key_source: "the PRIME_API_KEY environment variable".into(),
                lineage: LINEAGE.parse().unwrap(),
            })
            .with_capabilities(caps),
        )
    }

    pub(crate) fn provider(&self) -> Arc<PrimeIntellectProvider> {
        self.provider_with(Some(SENTINEL))
    }

    pub(crate) fn creates(&self) -> Vec<Value> {
        self.server
            .requests_to("POST", PODS)
            .into_iter()
            .filter_map(|r| r.body)
            .collect()
    }
}

/// 8 × H100 from Hyperstack in CANADA-1 ($15.20/h) and, on the community cloud, from
/// RunPod in US-KS-2 ($17.52/h).
pub(crate) fn h100_world() -> World {
    World::default()
        .with_config(
            "n3-H100x8",
            "H100_80GB",
            8,
            "hyperstack",
            "CANADA-1",
            false,
            15.2,
        )
        .with_config(
            "NVIDIA H100 80GB HBM3",
            "H100_80GB",
            8,
            "runpod",
            "US-KS-2",
            true,
            17.52,
        )
}

type Run = drive::Run<Fake, PrimeIntellectProvider>;

async fn run(world: World) -> Run {
    let fake = Fake::start(world).await;
    let provider = fake.provider();
    let mut vm = drive::gpu_vm(Cloud::Primeintellect, "H100", 8);
    vm.regions = vec!["CANADA-1".into()];
    Run::new(fake, provider, vm)
}

#[tokio::test]
async fn the_pod_boots_until_its_ssh_connection_appears_with_the_nat_port() {
    let mut w = h100_world();
    w.late = 4;
    let r = run(w).await;
    let end = r.launch().await.unwrap();
    let vm = end
        .ready()
        .unwrap_or_else(|| panic!("{end:?} {:?}", r.labels()));
    assert_eq!(vm.offer.id, "primeintellect/CANADA-1/hyperstack/n3-H100x8");
    assert_eq!(
        vm.offer.price_per_hour, 15.2,
        "USD per hour for the whole pod"
    );
    // Prime Intellect picked the user and the NAT port; gpuprov used them.
    assert_eq!((vm.user.as_str(), vm.ssh.port), ("root", 40000));
    assert!(vm.ssh.host.starts_with("127.0.0."), "{}", vm.ssh.host);
    // Active but without a connection, the pod was observed booting several times.
    let booting = r
        .labels()
        .iter()
        .filter(|l| l.starts_with("booting"))
        .count();
    assert!(booting >= 1, "{:?}", r.labels());
    let listings = r.cloud.server.requests_to("GET", PODS).len();
    assert!(
        listings >= 6,
        "waited through the late connection: {listings} listings"
    );
    let cb = &r.cloud.creates()[0];
    assert_eq!(cb["pod"]["name"], "gpuprov-trainer-0f0e0d0c-canada-1");
    assert_eq!(cb["pod"]["cloudId"], "n3-H100x8");
    assert_eq!(cb["pod"]["dataCenterId"], "CANADA-1");
    assert_eq!(cb["pod"]["security"], "secure_cloud");
    assert_eq!(cb["pod"]["sshKeyId"], "key-1");
    assert_eq!(cb["provider"], json!({"type": "hyperstack"}));
    r.cloud.server.verify();
}

#[tokio::test]
async fn every_shape_of_ssh_connection_reaches_the_pod() {
    for (shape, user) in [
        (Shape::UserHostPort, "root"),
        (Shape::List, "root"),
        (Shape::ListWithNull, "root"),
        (Shape::OtherUser, "ubuntu"),
        (Shape::HostOnly, "root"),
    ] {
        let mut w = h100_world();
        w.shape = shape;
        let r = run(w).await;
        let end = r.launch().await.unwrap();
        let vm = end
            .ready()
            .unwrap_or_else(|| panic!("{shape:?}: {end:?} {:?}", r.labels()));
        assert_eq!(vm.user, user, "{shape:?}");
        assert_eq!(
            vm.ssh.port, 40000,
            "{shape:?}: the NAT port, from -p or the port mapping"
        );
        assert_eq!(r.connector.logins(), 1, "{shape:?}");
        r.cloud.server.verify();
    }
}

#[tokio::test]
async fn a_fastapi_422_aborts_instead_of_failing_over() {
    let mut w = h100_world();
    w.faults.push(
        "POST",
        PODS,
        Canned::status(
            422,
            json!({"detail": [{"loc": ["body", "pod", "socket"], "msg": "Input should be 'PCIe', 'SXM2', 'SXM3', 'SXM4', 'SXM5' or 'SXM6'", "type": "enum"}]}),
        ),
    );
    let mut r = run(w).await;
    r.vm.regions = vec!["CANADA-1".into(), "US-KS-2".into()];
    let end = r.launch().await.unwrap();
    match &end {
        LaunchState::Aborted { reason, .. } => {
            assert!(reason.contains("body.pod.socket"), "{reason}");
            assert!(!reason.contains(SENTINEL), "{reason}");
        }
        other => panic!("expected Aborted, got {other:?}"),
    }
    assert_eq!(
        r.cloud.creates().len(),
        1,
        "no failover walk over a request the API rejects"
    );
    r.cloud.server.verify();
}

#[tokio::test]
async fn the_cluster_goes_over_the_ssh_tunnel_chosen_from_the_capabilities() {
    // The provider picks `ubuntu` (the scripted node expects a sudo user).
    let mut w = h100_world();
    w.shape = Shape::OtherUser;
    let fake = Fake::start(w).await;
    let provider = fake.provider();
    let caps = provider.capabilities();
    assert!(caps.supports(Feature::Kubernetes));
    assert!(!caps.supports(Feature::Firewall) && !caps.supports(Feature::BootScript));
    let pki = Pki::new();
    let node = Node::new(&pki);
    let api = ApiServer::start(&pki, &["127.0.0.1", "localhost"], 8).await;
    let connector = Arc::new(StandIn {
        port: api.port,
        opened: Mutex::new(vec![]),
    });
    let mut providers = Providers::new();
    providers.insert(provider);
    let mut vm = VmSpec::new("trainer", vec![Cloud::Primeintellect]);
    vm.regions = vec!["CANADA-1".into()];
    let mut launch = LaunchMachine::new(
        vm,
        LINEAGE.into(),
        PUBKEY.into(),
        providers,
        Arc::new(FakeConnector::default()),
    );
    launch.retry = FAST;
    launch.teardown.retry = FAST;
    let dir = tempfile::tempdir().unwrap();
    let mut m = K3sMachine::new(
        launch,
        node.clone(),
        connector.clone(),
        dir.path().join("kube"),
        Default::default(),
    );
    m.retry = FAST;
    m.timeouts = K3sTimeouts {
        boot_install: Duration::from_secs(5),
        probe_interval: Duration::from_millis(2),
        install: Duration::from_secs(5),
        api: Duration::from_millis(300),
        validate: Duration::from_secs(3),
        api_poll: Duration::from_millis(2),
    };
    // No boot script to carry the installer and no port 6443 to open: SSH route, tunnel.
    assert!(m.launch.boot_script.is_none());
    assert!(!m.launch.vm.ports.contains(&6443));
    let journal = Arc::new(MemoryJournal::new());
    let ex = Executor::new(journal.clone(), CancelToken::new());
    let fut = ex.run(&m, "vm.trainer", |_| K3sState::start(None));
    let end = tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .unwrap()
        .unwrap();
    let cluster = match &end {
        K3sState::Ready {
            cluster: Some(c), ..
        } => c.clone(),
        other => panic!("expected a ready cluster, got {other:?}"),
    };
    assert!(
        matches!(cluster.access, AccessRecord::SshTunnel { .. }),
        "{:?}",
        cluster.access
    );
    assert!(
        connector
            .opened
            .lock()
            .unwrap()
            .iter()
            .all(|a| matches!(a, ApiAccess::SshTunnel { .. })),
        "validated over the tunnel"
    );
    assert!(!node.pushes().is_empty(), "the installer went over SSH");
    fake.server.verify();
}

#[tokio::test]
async fn validate_says_where_the_key_was_found() {
    let fake = Fake::start(h100_world()).await;
    assert_eq!(
        fake.provider().credentials().await,
        CredentialReport::Found("the PRIME_API_KEY environment variable".into())
    );
    let none = fake.provider_with(None);
    assert!(none.credentials().await.is_missing());
    let e = none
        .plan(&drive::gpu_vm(Cloud::Primeintellect, "H100", 8).request())
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Credentials);
    assert!(e.msg.contains("PRIME_API_KEY"), "{}", e.msg);
    assert!(
        fake.server.requests().is_empty(),
        "nothing sent without a key"
    );
}
