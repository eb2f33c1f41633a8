//! The k3s machine (design 4.5) through every path of its diagram: the FakeProvider is
//! the cloud, a scripted node answers the SSH commands (probe, installer push, `/readyz`,
//! kubeconfig), and a local HTTPS server stands in for the Kubernetes API (`/readyz`,
//! nodes, kube-system pods) with a real CA, a serving certificate whose SANs the test
//! controls, and client-certificate authentication, so validation runs its real TLS and
//! HTTP code.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use gpuprov::cluster::api::{ApiConnector, ApiPath};
use gpuprov::cluster::k3s::{AccessRecord, K3sMachine, K3sState, K3sTimeouts};
use gpuprov::cluster::kubeconfig::{ApiAccess, Kubeconfig};
use gpuprov::cluster::probe::BootRoute;
use gpuprov::cluster::remote::{NodeShell, RemoteOutput};
use gpuprov::config::{Cloud, Config, VmSpec};
use gpuprov::engine::{Engine, K3sSetup, Outcome, StateJournal};
use gpuprov::machine::{CancelToken, ExecError, Executor, MemoryJournal, RetryPolicy};
use gpuprov::plan::{self, Action};
use gpuprov::provider::fake::{FakeConnector, FakeProvider, Op};
use gpuprov::provider::{Capabilities, Feature, Providers};
use gpuprov::ssh::SshError;
use gpuprov::state::StateStore;
use gpuprov::vm::{LaunchMachine, VmRecord};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

const FAST: RetryPolicy = RetryPolicy {
    max_attempts: 3,
    initial_backoff: Duration::from_millis(1),
    max_backoff: Duration::from_millis(2),
};

/// The real `nvidia-smi --query-gpu` output of an H200 machine (fixture copied from
/// shared/fixtures/gpu-probe/nvidia-h200).
const H200_QUERY: &str = include_str!("fixtures/gpu-probe/nvidia-h200/query-gpu.csv");

/// A sentinel standing for the cluster's client key: it must reach the kubeconfig file
/// and nothing else.
const KEY_SENTINEL_NOTE: &str = "client-key-data";

// ---------------------------------------------------------------------------------------
// PKI and the Kubernetes API stand-in

struct Pki {
    ca_pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    client_cert_pem: String,
    client_key_pem: String,
}

impl Pki {
    fn new() -> Pki {
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "k3s-server-ca (test)");
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let mut client = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        client
            .distinguished_name
            .push(rcgen::DnType::CommonName, "system:admin");
        client.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let client_key = rcgen::KeyPair::generate().unwrap();
        let client_cert_pem = client.signed_by(&client_key, &issuer).unwrap().pem();
        Pki {
            ca_pem,
            issuer,
            client_cert_pem,
            client_key_pem: client_key.serialize_pem(),
        }
    }

    fn server_cert(&self, sans: &[&str]) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
        let mut p =
            rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        (
            cert.der().clone(),
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
    }

    /// `/etc/rancher/k3s/k3s.yaml` as k3s writes it (server on the loopback address).
    fn k3s_yaml(&self) -> String {
        use base64::Engine as _;
        let b = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        format!(
            "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: {}\n    server: https://127.0.0.1:6443\n  name: default\ncontexts:\n- context:\n    cluster: default\n    user: default\n  name: default\ncurrent-context: default\nkind: Config\npreferences: {{}}\nusers:\n- name: default\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
            b(&self.ca_pem),
            b(&self.client_cert_pem),
            b(&self.client_key_pem)
        )
    }
}

/// What the stand-in API answers, and what it saw.
struct ApiState {
    cert: (CertificateDer<'static>, PrivateKeyDer<'static>),
    /// `/api/v1/nodes` answers NotReady this many more times.
    node_not_ready: u32,
    /// `nvidia.com/gpu` allocatable, and how many more node lists report 0 first.
    gpus: u32,
    gpus_late: u32,
    /// CoreDNS answers Pending this many more times.
    coredns_pending: u32,
    /// Paths requested with a client certificate.
    authed: Vec<String>,
    /// Requests without one.
    anonymous: u32,
}

struct ApiServer {
    port: u16,
    state: Arc<Mutex<ApiState>>,
    _task: tokio::task::JoinHandle<()>,
}

impl ApiServer {
    async fn start(pki: &Pki, sans: &[&str], gpus: u32) -> ApiServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(ApiState {
            cert: pki.server_cert(sans),
            node_not_ready: 0,
            gpus,
            gpus_late: 0,
            coredns_pending: 0,
            authed: vec![],
            anonymous: 0,
        }));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(pem_der(&pki.ca_pem)).unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .allow_unauthenticated()
        .build()
        .unwrap();
        let st = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                // A config per connection, so a swapped certificate takes effect at once.
                let (cert, key) = {
                    let g = st.lock().unwrap();
                    (g.cert.0.clone(), g.cert.1.clone_key())
                };
                let cfg = rustls::ServerConfig::builder_with_provider(provider.clone())
                    .with_safe_default_protocol_versions()
                    .unwrap()
                    .with_client_cert_verifier(verifier.clone())
                    .with_single_cert(vec![cert], key.clone_key())
                    .unwrap();
                let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
                let st = st.clone();
                tokio::spawn(async move {
                    if let Ok(tls) = acceptor.accept(tcp).await {
                        let _ = serve(tls, st).await;
                    }
                });
            }
        });
        ApiServer {
            port,
            state,
            _task: task,
        }
    }
}

fn pem_der(pem: &str) -> CertificateDer<'static> {
    use base64::Engine as _;
    let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    CertificateDer::from(
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap(),
    )
}

async fn serve(
    mut tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    st: Arc<Mutex<ApiState>>,
) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tls.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&buf).to_string();
    let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
    let authed = tls.get_ref().1.peer_certificates().is_some();
    let (status, body) = {
        let mut s = st.lock().unwrap();
        if !authed {
            s.anonymous += 1;
            if path == "/version" {
                (200, r#"{"gitVersion":"v1.31.4+k3s1"}"#.to_string())
            } else {
                (
                    401,
                    r#"{"kind":"Status","code":401,"reason":"Unauthorized"}"#.to_string(),
                )
            }
        } else {
            s.authed.push(path.clone());
            match path.as_str() {
                "/readyz" => (200, "ok".to_string()),
                "/api/v1/nodes" => {
                    let ready = if s.node_not_ready > 0 {
                        s.node_not_ready -= 1;
                        "False"
                    } else {
                        "True"
                    };
                    let gpus = if s.gpus_late > 0 {
                        s.gpus_late -= 1;
                        0
                    } else {
                        s.gpus
                    };
                    let alloc = if gpus > 0 {
                        format!(r#","nvidia.com/gpu":"{gpus}""#)
                    } else {
                        String::new()
                    };
                    (
                        200,
                        format!(
                            r#"{{"kind":"NodeList","apiVersion":"v1","items":[{{"metadata":{{"name":"trainer"}},"status":{{"conditions":[{{"type":"Ready","status":"{ready}"}}],"allocatable":{{"cpu":"8"{alloc}}},"nodeInfo":{{"kubeletVersion":"v1.31.4+k3s1"}}}}}}]}}"#
                        ),
                    )
                }
                p if p.starts_with("/api/v1/namespaces/kube-system/pods") => {
                    let (phase, ready) = if s.coredns_pending > 0 {
                        s.coredns_pending -= 1;
                        ("Pending", "False")
                    } else {
                        ("Running", "True")
                    };
                    (
                        200,
                        format!(
                            r#"{{"kind":"PodList","items":[{{"metadata":{{"name":"coredns-ccb96694c-x2vz8"}},"status":{{"phase":"{phase}","conditions":[{{"type":"Ready","status":"{ready}"}}]}}}}]}}"#
                        ),
                    )
                }
                _ => (404, "{}".to_string()),
            }
        }
    };
    let resp = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(resp.as_bytes()).await?;
    tls.shutdown().await
}

/// Points validation at the stand-in, whatever the access path.
struct StandIn {
    port: u16,
    opened: Mutex<Vec<ApiAccess>>,
}

#[async_trait]
impl ApiConnector for StandIn {
    async fn open(&self, _vm: &VmRecord, access: &ApiAccess) -> Result<ApiPath, String> {
        self.opened.lock().unwrap().push(access.clone());
        Ok(ApiPath::direct(format!("https://127.0.0.1:{}", self.port)))
    }
}

// ---------------------------------------------------------------------------------------
// The scripted node

struct NodeState {
    /// The marker file's text; `None`: absent.
    marker: Option<String>,
    /// `cloud-init status` output; `None`: no cloud-init on the image.
    cloud_init: Option<String>,
    k3s_active: bool,
    gpu_csv: Option<String>,
    /// Exit codes of the next pushes (default 0).
    push_exit: VecDeque<i32>,
    /// Every push: the `GPUPROV_TLS_SANS` it carried.
    pushes: Vec<String>,
    /// SSH errors for the next commands.
    ssh_errors: VecDeque<SshError>,
    /// `/readyz` on the node answers "ok" only after this many more asks.
    readyz_late: u32,
    readyz_never: bool,
    kubeconfig: String,
    probes: u32,
}

struct Node {
    st: Mutex<NodeState>,
    /// Runs after every successful push (the installer rewrote the k3s config).
    on_push: Mutex<Option<Box<dyn Fn() + Send + Sync>>>,
}

impl Node {
    fn new(pki: &Pki) -> Arc<Node> {
        Arc::new(Node {
            st: Mutex::new(NodeState {
                marker: None,
                cloud_init: Some("status: done".into()),
                k3s_active: false,
                gpu_csv: Some(H200_QUERY.into()),
                push_exit: VecDeque::new(),
                pushes: vec![],
                ssh_errors: VecDeque::new(),
                readyz_late: 0,
                readyz_never: false,
                kubeconfig: pki.k3s_yaml(),
                probes: 0,
            }),
            on_push: Mutex::new(None),
        })
    }

    fn installed_at_boot(self: &Arc<Self>) -> Arc<Self> {
        {
            let mut s = self.st.lock().unwrap();
            s.marker = Some("state=done\nstep=done\n".into());
            s.k3s_active = true;
        }
        self.clone()
    }

    fn pushes(&self) -> Vec<String> {
        self.st.lock().unwrap().pushes.clone()
    }

    fn probe_output(&self) -> String {
        let mut s = self.st.lock().unwrap();
        s.probes += 1;
        let mut out = String::from("@@gpuprov-probe v1\n@@gpuprov-probe section marker\n");
        match &s.marker {
            Some(m) => out.push_str(&format!("{m}\n@@gpuprov-probe rc 0\n")),
            None => out.push_str("@@gpuprov-probe missing\n"),
        }
        out.push_str("@@gpuprov-probe section cloud-init\n");
        match &s.cloud_init {
            Some(c) => out.push_str(&format!("{c}\n@@gpuprov-probe rc 0\n")),
            None => out.push_str("@@gpuprov-probe missing\n"),
        }
        out.push_str("@@gpuprov-probe section k3s\n");
        if s.k3s_active {
            out.push_str("active\n@@gpuprov-probe rc 0\n");
        } else {
            out.push_str("inactive\n@@gpuprov-probe rc 3\n");
        }
        out.push_str("@@gpuprov-probe section nvidia-smi\n");
        match &s.gpu_csv {
            Some(c) => out.push_str(&format!("{c}@@gpuprov-probe rc 0\n")),
            None => out.push_str("@@gpuprov-probe missing\n"),
        }
        out.push_str("@@gpuprov-probe end\n");
        out
    }
}

#[async_trait]
impl NodeShell for Node {
    async fn run(
        &self,
        vm: &VmRecord,
        command: &str,
        stdin: Option<Vec<u8>>,
    ) -> Result<RemoteOutput, SshError> {
        if let Some(e) = self.st.lock().unwrap().ssh_errors.pop_front() {
            return Err(e);
        }
        let ok = |stdout: String| {
            Ok(RemoteOutput {
                status: 0,
                stdout,
                stderr: String::new(),
            })
        };
        if command.contains("@@gpuprov-probe") {
            return ok(self.probe_output());
        }
        if command == gpuprov::cluster::remote::install_command(&vm.user) {
            let script = String::from_utf8(stdin.expect("the installer comes on stdin")).unwrap();
            assert!(
                script.contains("k3s-install.status"),
                "the real installer is pushed"
            );
            let sans = script
                .lines()
                .find_map(|l| l.strip_prefix("export GPUPROV_TLS_SANS="))
                .unwrap_or("")
                .trim_matches('\'')
                .to_string();
            let code = {
                let mut s = self.st.lock().unwrap();
                s.pushes.push(sans);
                let code = s.push_exit.pop_front().unwrap_or(0);
                if code == 0 {
                    s.marker = Some("state=done\nstep=done\n".into());
                    s.k3s_active = true;
                } else {
                    s.marker =
                        Some("state=failed\nstep=k3s\nreason=install script failed\n".into());
                }
                code
            };
            if code == 0 {
                if let Some(hook) = self.on_push.lock().unwrap().as_ref() {
                    hook();
                }
            }
            return Ok(RemoteOutput {
                status: code,
                stdout: String::new(),
                stderr: if code == 0 {
                    String::new()
                } else {
                    "gpuprov-installer: step k3s: install script failed".into()
                },
            });
        }
        if command.contains("get --raw=/readyz") {
            let mut s = self.st.lock().unwrap();
            if s.k3s_active && !s.readyz_never && s.readyz_late == 0 {
                return ok("ok".into());
            }
            s.readyz_late = s.readyz_late.saturating_sub(1);
            return Ok(RemoteOutput {
                status: 1,
                stdout: String::new(),
                stderr: "The connection to the server 127.0.0.1:6443 was refused".into(),
            });
        }
        if command.contains("k3s.yaml") {
            assert!(
                command.starts_with("sudo -n "),
                "ubuntu reads it through sudo"
            );
            return ok(self.st.lock().unwrap().kubeconfig.clone());
        }
        panic!("unexpected command on the node: {command}");
    }
}

// ---------------------------------------------------------------------------------------
// The harness

struct Rig {
    pki: Pki,
    cloud: Arc<FakeProvider>,
    node: Arc<Node>,
    api: ApiServer,
    connector: Arc<StandIn>,
    journal: Arc<MemoryJournal>,
    dir: tempfile::TempDir,
    timeouts: K3sTimeouts,
}

fn caps(features: &[Feature]) -> Capabilities {
    let mut c = FakeProvider::new("aws").capabilities_for_test();
    c.supported = features.to_vec();
    c
}

impl Rig {
    /// A cloud with `features`, a node, and an API whose certificate covers `sans`.
    async fn new(features: &[Feature], sans: &[&str]) -> Rig {
        let pki = Pki::new();
        let cloud = FakeProvider::new("aws")
            .with_offer("east-a", "us-east-1", "p5.48xlarge", 98.0)
            .with_capabilities(caps(features));
        let node = Node::new(&pki);
        let api = ApiServer::start(&pki, sans, 1).await;
        let connector = Arc::new(StandIn {
            port: api.port,
            opened: Mutex::new(vec![]),
        });
        Rig {
            pki,
            cloud: Arc::new(cloud),
            node,
            api,
            connector,
            journal: Arc::new(MemoryJournal::new()),
            dir: tempfile::tempdir().unwrap(),
            timeouts: K3sTimeouts {
                boot_install: Duration::from_secs(5),
                probe_interval: Duration::from_millis(2),
                install: Duration::from_secs(5),
                api: Duration::from_millis(300),
                validate: Duration::from_secs(3),
                api_poll: Duration::from_millis(2),
            },
        }
    }

    fn providers(&self) -> Providers {
        let mut p = Providers::new();
        p.insert(self.cloud.clone());
        p
    }

    fn machine(&self) -> K3sMachine {
        let mut launch = LaunchMachine::new(
            VmSpec::new("trainer", vec![Cloud::Aws]),
            "0f0e0d0c-lineage".into(),
            "ssh-ed25519 AAAAtest gpuprov".into(),
            self.providers(),
            Arc::new(FakeConnector::default()),
        );
        launch.retry = FAST;
        launch.teardown.retry = FAST;
        launch.vanish_grace = Duration::from_millis(20);
        let mut m = K3sMachine::new(
            launch,
            self.node.clone(),
            self.connector.clone(),
            self.dir.path().join("kube"),
            Default::default(),
        );
        m.retry = FAST;
        m.timeouts = self.timeouts;
        m
    }

    async fn run(&self) -> Result<K3sState, ExecError> {
        let ex = Executor::new(self.journal.clone(), CancelToken::new());
        let m = self.machine();
        let fut = ex.run(&m, "vm.trainer", |prev| {
            let owned = prev.and_then(|p| gpuprov::engine::owned_of(&p).ok().flatten());
            K3sState::start(owned)
        });
        tokio::time::timeout(Duration::from_secs(30), fut)
            .await
            .expect("the k3s machine must not hang")
    }

    fn labels(&self) -> Vec<String> {
        self.journal.history().into_iter().map(|(_, l)| l).collect()
    }

    /// The journalled k3s stages in order (the `k3s` tags), consecutive repeats folded.
    fn stages(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (key, _) in self.journal.history() {
            assert_eq!(key, "vm.trainer");
        }
        let rec = self.journal.get("vm.trainer").unwrap();
        assert_eq!(rec.kind, "k3s");
        for l in self.labels() {
            let stage = if l.starts_with("k3s: checking") {
                "checking_boot_install"
            } else if l.starts_with("k3s: installing") {
                "installing"
            } else if l.starts_with("k3s: waiting") {
                "awaiting_api"
            } else if l.starts_with("k3s: fetching") {
                "fetching_kubeconfig"
            } else if l.starts_with("k3s: validating") {
                "validating"
            } else if l.starts_with("k3s failed") {
                "failed"
            } else if l.starts_with("ready") && l.contains("k3s") {
                "ready"
            } else {
                "vm"
            };
            if out.last().map(String::as_str) != Some(stage) {
                out.push(stage.to_string());
            }
        }
        out
    }
}

fn ready_cluster(s: &K3sState) -> &gpuprov::cluster::k3s::ClusterRecord {
    match s {
        K3sState::Ready {
            cluster: Some(c), ..
        } => c,
        other => panic!("expected a ready cluster, got {other:?}"),
    }
}

const COVERS: &[&str] = &["127.0.0.1", "localhost"];

// ---------------------------------------------------------------------------------------
// The paths

#[tokio::test]
async fn installed_at_boot_goes_straight_to_the_api_and_writes_a_private_kubeconfig() {
    let r = Rig::new(
        &[Feature::BootScript, Feature::Kubernetes, Feature::Firewall],
        COVERS,
    )
    .await;
    r.node.installed_at_boot();
    let m = r.machine();
    // The installer rides the boot script, with the metadata lookup on; 6443 is opened.
    let boot = m.launch.boot_script.as_ref().expect("boot script set");
    assert!(boot.script.contains("k3s-install.status"));
    assert_eq!(boot.env["GPUPROV_TLS_SAN_FROM_METADATA"], "1");
    assert_eq!(
        boot.env["GPUPROV_GPU"], "auto",
        "gpu_count is not set: the GPU path runs if the machine has one"
    );
    assert!(m.launch.vm.ports.contains(&6443));

    let end = r.run().await.unwrap();
    let c = ready_cluster(&end);
    assert_eq!(
        r.stages(),
        [
            "vm",
            "checking_boot_install",
            "awaiting_api",
            "fetching_kubeconfig",
            "validating",
            "ready"
        ]
    );
    assert!(r.node.pushes().is_empty(), "nothing pushed over ssh");
    assert_eq!(
        c.access,
        AccessRecord::Direct {
            host: "127.0.0.1".into()
        },
        "the cloud opens ports: direct"
    );
    assert_eq!(c.allocatable_gpus, 1);
    // The kubeconfig: the VM's context, the server rewritten, mode 0600.
    let text = std::fs::read_to_string(&c.kubeconfig).unwrap();
    let kc = Kubeconfig::parse(&text).unwrap();
    assert_eq!(kc.current_context.as_deref(), Some("gpuprov-trainer"));
    assert_eq!(kc.clusters[0].cluster.server, "https://127.0.0.1:6443");
    assert!(text.contains(KEY_SENTINEL_NOTE));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&c.kubeconfig)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    // The journal never holds the client key; validation used the client certificate.
    let rec = serde_json::to_string(&r.journal.get("vm.trainer").unwrap().state).unwrap();
    assert!(!rec.contains(KEY_SENTINEL_NOTE) && !rec.contains("PRIVATE KEY"));
    let st = r.api.state.lock().unwrap();
    assert!(st.authed.iter().any(|p| p == "/readyz"));
    assert!(st.authed.iter().any(|p| p == "/api/v1/nodes"));
    assert!(st.authed.iter().any(|p| p.contains("k8s-app%3Dkube-dns")));
    assert!(
        st.anonymous >= 1,
        "the certificate is read without credentials"
    );
}

#[tokio::test]
async fn a_running_boot_install_is_waited_for() {
    let r = Rig::new(&[Feature::BootScript, Feature::Kubernetes], COVERS).await;
    {
        let mut s = r.node.st.lock().unwrap();
        s.marker = Some("state=running\nstep=k3s\n".into());
        s.cloud_init = Some("status: running".into());
    }
    // Finish the boot install after a few probes.
    let node = r.node.clone();
    let finisher = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(2)).await;
            let mut s = node.st.lock().unwrap();
            if s.probes >= 3 {
                s.marker = Some("state=done\n".into());
                s.cloud_init = Some("status: done".into());
                s.k3s_active = true;
                return;
            }
        }
    });
    let end = r.run().await.unwrap();
    finisher.await.unwrap();
    let c = ready_cluster(&end);
    assert!(r.node.st.lock().unwrap().probes >= 3);
    assert!(r.node.pushes().is_empty());
    // No firewall API: the user reaches the API through `gpuprov tunnel`.
    assert_eq!(c.access, AccessRecord::SshTunnel { local_port: 6443 });
    let kc = Kubeconfig::parse(&std::fs::read_to_string(&c.kubeconfig).unwrap()).unwrap();
    assert_eq!(kc.clusters[0].cluster.server, "https://127.0.0.1:6443");
}

#[tokio::test]
async fn a_cloud_without_boot_scripts_gets_the_installer_over_ssh() {
    let r = Rig::new(&[Feature::Kubernetes], COVERS).await;
    let m = r.machine();
    assert!(m.launch.boot_script.is_none());
    let end = r.run().await.unwrap();
    ready_cluster(&end);
    assert_eq!(
        r.stages(),
        [
            "vm",
            "checking_boot_install",
            "installing",
            "awaiting_api",
            "fetching_kubeconfig",
            "validating",
            "ready"
        ]
    );
    let pushes = r.node.pushes();
    assert_eq!(pushes.len(), 1);
    assert_eq!(
        pushes[0], "127.0.0.1,localhost",
        "the SAN list covers the host"
    );
    assert!(r
        .labels()
        .iter()
        .any(|l| l.contains("the cloud runs no boot script")));
}

#[tokio::test]
async fn a_failed_or_overdue_boot_install_falls_back_to_ssh() {
    // Failed at boot.
    let r = Rig::new(&[Feature::BootScript, Feature::Kubernetes], COVERS).await;
    r.node.st.lock().unwrap().marker =
        Some("state=failed\nstep=toolkit\nreason=apt-get failed\n".into());
    ready_cluster(&r.run().await.unwrap());
    assert_eq!(r.node.pushes().len(), 1);
    assert!(
        r.labels()
            .iter()
            .any(|l| l.contains("failed at step toolkit")),
        "{:?}",
        r.labels()
    );

    // Still running past the deadline.
    let mut r = Rig::new(&[Feature::BootScript, Feature::Kubernetes], COVERS).await;
    r.timeouts.boot_install = Duration::from_millis(30);
    {
        let mut s = r.node.st.lock().unwrap();
        s.marker = Some("state=running\nstep=k3s\n".into());
        s.cloud_init = Some("status: running".into());
    }
    ready_cluster(&r.run().await.unwrap());
    assert_eq!(r.node.pushes().len(), 1);
    assert!(r.labels().iter().any(|l| l.contains("past its deadline")));

    // Installed, but the GPU is not visible: pushed to take the GPU path.
    let r = Rig::new(&[Feature::BootScript, Feature::Kubernetes], COVERS).await;
    r.node.installed_at_boot();
    r.node.st.lock().unwrap().gpu_csv = None;
    ready_cluster(&r.run().await.unwrap());
    assert_eq!(r.node.pushes().len(), 1);
}

#[tokio::test]
async fn a_certificate_without_the_access_host_reruns_the_installer_once_with_the_san() {
    let r = Rig::new(
        &[Feature::BootScript, Feature::Kubernetes, Feature::Firewall],
        &["localhost", "10.0.0.5"],
    )
    .await;
    r.node.installed_at_boot();
    // The installer rewrites the k3s config with the SAN list; k3s serves a new cert.
    let pki_sans: Vec<String> = vec!["127.0.0.1".into(), "localhost".into()];
    let server_state = r.api.state.clone();
    let fresh = r
        .pki
        .server_cert(&pki_sans.iter().map(String::as_str).collect::<Vec<_>>());
    *r.node.on_push.lock().unwrap() = Some(Box::new(move || {
        server_state.lock().unwrap().cert = (fresh.0.clone(), fresh.1.clone_key());
    }));
    let end = r.run().await.unwrap();
    ready_cluster(&end);
    assert_eq!(
        r.node.pushes(),
        ["127.0.0.1,localhost"],
        "one re-run, with the SAN"
    );
    assert!(r
        .labels()
        .iter()
        .any(|l| l == "k3s: validating (after the SAN re-run)"));
    assert_eq!(
        r.stages(),
        [
            "vm",
            "checking_boot_install",
            "awaiting_api",
            "fetching_kubeconfig",
            "validating",
            "ready"
        ],
        "Validating → Validating: no other stage in between"
    );
}

#[tokio::test]
async fn a_san_still_missing_after_the_rerun_fails_and_leaves_the_vm_up() {
    let r = Rig::new(
        &[Feature::BootScript, Feature::Kubernetes, Feature::Firewall],
        &["localhost"],
    )
    .await;
    r.node.installed_at_boot();
    let end = r.run().await.unwrap();
    match &end {
        K3sState::Failed {
            stage, reason, vm, ..
        } => {
            assert_eq!(stage, "validating");
            assert!(reason.contains("does not cover 127.0.0.1"), "{reason}");
            assert!(reason.contains("even after re-running"), "{reason}");
            assert!(vm.is_some(), "the VM is kept for debugging");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(r.node.pushes().len(), 1, "re-run once, not more");
    assert_eq!(r.cloud.instances().len(), 1, "the VM is left up");
    assert_eq!(r.cloud.count(Op::Delete), 0);
}

#[tokio::test]
async fn a_failed_install_leaves_the_vm_up_and_the_next_apply_reuses_it() {
    let r = Rig::new(&[Feature::Kubernetes], COVERS).await;
    r.node.st.lock().unwrap().push_exit = VecDeque::from(vec![1, 1, 1]);
    let end = r.run().await.unwrap();
    let K3sState::Failed {
        stage, reason, vm, ..
    } = &end
    else {
        panic!("{end:?}")
    };
    assert_eq!(stage, "installing");
    assert!(reason.contains("install script failed"), "{reason}");
    let vm = vm.as_ref().expect("VM left up");
    assert_eq!(r.cloud.instances().len(), 1);
    assert_eq!(r.cloud.count(Op::Delete), 0);
    assert_eq!(r.node.pushes().len(), 3, "retried within the budget");

    // The next apply: the same VM, re-entered at CheckingBootInstall as reused.
    let before = r.journal.history().len();
    let end = r.run().await.unwrap();
    let c = ready_cluster(&end);
    assert_eq!(r.cloud.count(Op::Create), 1, "no second VM");
    assert_eq!(end.vm().unwrap().instance_id, vm.instance_id);
    assert!(c.kubeconfig.exists());
    let later: Vec<String> = r.labels()[before..].to_vec();
    assert!(
        later
            .iter()
            .any(|l| l.starts_with("k3s: checking the boot install (Reused)")),
        "{later:?}"
    );
    assert!(later
        .iter()
        .any(|l| l.contains("reused from an earlier run")));
    assert_eq!(r.node.pushes().len(), 4);
}

#[tokio::test]
async fn an_api_that_never_becomes_ready_fails_in_awaiting_api() {
    let r = Rig::new(&[Feature::BootScript, Feature::Kubernetes], COVERS).await;
    r.node.installed_at_boot();
    r.node.st.lock().unwrap().readyz_never = true;
    let end = r.run().await.unwrap();
    match &end {
        K3sState::Failed {
            stage, reason, vm, ..
        } => {
            assert_eq!(stage, "awaiting_api");
            assert!(reason.contains("was refused"), "{reason}");
            assert!(vm.is_some());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(r.cloud.instances().len(), 1);
}

#[tokio::test]
async fn validation_waits_for_node_gpu_and_coredns_and_fails_when_they_never_come() {
    let r = Rig::new(&[Feature::BootScript, Feature::Kubernetes], COVERS).await;
    r.node.installed_at_boot();
    r.node.st.lock().unwrap().readyz_late = 2;
    {
        let mut s = r.api.state.lock().unwrap();
        s.node_not_ready = 2;
        s.gpus_late = 2;
        s.coredns_pending = 2;
    }
    let end = r.run().await.unwrap();
    assert_eq!(ready_cluster(&end).allocatable_gpus, 1);
    let polls = r.api.state.lock().unwrap().authed.len();
    assert!(polls >= 10, "validation polled ({polls} calls)");

    // The device plugin never advertises the GPU: Failed, naming it.
    let mut r = Rig::new(&[Feature::BootScript, Feature::Kubernetes], COVERS).await;
    r.timeouts.validate = Duration::from_millis(100);
    r.node.installed_at_boot();
    r.api.state.lock().unwrap().gpus = 0;
    match r.run().await.unwrap() {
        K3sState::Failed { stage, reason, .. } => {
            assert_eq!(stage, "validating");
            assert!(
                reason.contains("0 of 1 nvidia.com/gpu allocatable"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_vm_that_never_comes_up_fails_in_vm_and_a_changed_host_key_stops_k3s() {
    let r = Rig::new(&[Feature::Kubernetes], COVERS).await;
    r.cloud.fault(
        Op::Plan,
        None,
        gpuprov::provider::ProviderError::new(
            gpuprov::provider::ErrorKind::Capacity,
            "no capacity",
        ),
        u32::MAX,
    );
    match r.run().await.unwrap() {
        K3sState::Failed {
            stage, vm, launch, ..
        } => {
            assert_eq!(stage, "vm");
            assert!(vm.is_none());
            assert!(launch.is_some(), "the launch's end is kept");
        }
        other => panic!("{other:?}"),
    }

    let r = Rig::new(&[Feature::Kubernetes], COVERS).await;
    r.node.st.lock().unwrap().ssh_errors = VecDeque::from(vec![SshError::HostKeyMismatch {
        endpoint: "ubuntu@127.0.0.1:22".into(),
        expected: "SHA256:a".into(),
        got: "SHA256:b".into(),
    }]);
    match r.run().await.unwrap() {
        K3sState::Failed { stage, reason, .. } => {
            assert_eq!(stage, "checking_boot_install");
            assert!(reason.contains("host key"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        r.node.pushes().is_empty(),
        "nothing runs on a host that changed key"
    );
}

#[tokio::test]
async fn unreachable_ssh_is_retried_not_fatal() {
    let r = Rig::new(&[Feature::Kubernetes], COVERS).await;
    r.node.st.lock().unwrap().ssh_errors = VecDeque::from(vec![SshError::Unreachable {
        endpoint: "ubuntu@127.0.0.1:22".into(),
        msg: "connection reset".into(),
    }]);
    ready_cluster(&r.run().await.unwrap());
}

// ---------------------------------------------------------------------------------------
// Through the engine and the state file

struct EngineRig {
    rig: Rig,
    dir: tempfile::TempDir,
}

impl EngineRig {
    fn engine(&self) -> (Engine, Arc<StateJournal>) {
        let (store, state) = StateStore::open(self.dir.path().join("gpuprov.state.json")).unwrap();
        let lineage = state.lineage.clone();
        let journal = Arc::new(StateJournal::new(store, state).unwrap());
        let engine = Engine {
            providers: self.rig.providers(),
            connector: Arc::new(FakeConnector::default()),
            journal: journal.clone(),
            executor: Executor::new(journal.clone(), CancelToken::new()),
            lineage,
            ssh_public_key: "ssh-ed25519 AAAAtest".into(),
            parallelism: 4,
            retry_until_up: false,
            k3s: Some(K3sSetup {
                shell: self.rig.node.clone(),
                api: self.rig.connector.clone(),
                kubeconfig_dir: self.dir.path().join("kube"),
                installer: Default::default(),
                timeouts: self.rig.timeouts,
            }),
        };
        (engine, journal)
    }

    async fn apply(&self, toml: &str) -> (plan::Plan, std::collections::BTreeMap<String, Outcome>) {
        let config = Config::parse(Path::new("gpuprov.toml"), toml.to_string()).unwrap();
        let (engine, journal) = self.engine();
        let plan = plan::compute(&config, &journal.snapshot(), None, &|_| Some(1.0)).unwrap();
        let out = tokio::time::timeout(Duration::from_secs(30), engine.apply(&plan))
            .await
            .unwrap();
        journal.save_final().unwrap();
        (plan, out)
    }
}

#[tokio::test]
async fn apply_plans_and_destroys_a_cluster_through_the_state_file() {
    let rig = Rig::new(&[Feature::Kubernetes], COVERS).await;
    let e = EngineRig {
        rig,
        dir: tempfile::tempdir().unwrap(),
    };
    let toml = "[vm.trainer]\nclouds = [\"aws\"]\n";
    let (_, out) = e.apply(toml).await;
    assert!(matches!(out["vm.trainer"], Outcome::Ready(_)), "{out:?}");
    let kube = e.dir.path().join("kube/trainer.yaml");
    assert!(kube.exists());
    let text = std::fs::read_to_string(e.dir.path().join("gpuprov.state.json")).unwrap();
    assert!(text.contains("\"kind\": \"k3s\"") || text.contains("\"kind\":\"k3s\""));
    assert!(
        !text.contains(KEY_SENTINEL_NOTE),
        "no client key in the state"
    );
    assert!(
        gpuprov::engine::vm_of(
            "k3s",
            &e.engine().1.snapshot().resources["vm.trainer"]
                .machine
                .state
        )
        .is_some(),
        "ssh and status find the VM in a k3s record"
    );

    // Applied again: nothing to do.
    let (plan, _) = e.apply(toml).await;
    assert_eq!(plan.changes[0].action, Action::NoOp, "{plan:?}");

    // A failed install is a Resume that reuses the VM.
    {
        let (_, journal) = e.engine();
        let snap = journal.snapshot();
        let mut s: K3sState =
            serde_json::from_value(snap.resources["vm.trainer"].machine.state.clone()).unwrap();
        s = K3sState::Failed {
            stage: "validating".into(),
            reason: "test".into(),
            vm: s.vm().cloned().map(Box::new),
            launch: None,
        };
        let config = Config::parse(Path::new("gpuprov.toml"), toml.to_string()).unwrap();
        let mut st = snap.clone();
        st.resources.get_mut("vm.trainer").unwrap().machine.state =
            serde_json::to_value(&s).unwrap();
        let plan = plan::compute(&config, &st, None, &|_| Some(1.0)).unwrap();
        assert_eq!(plan.changes[0].action, Action::Resume);
        assert!(plan.changes[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("re-runs the install on the same VM"));
    }

    // Destroy: the VM and its kubeconfig go.
    let (engine, journal) = e.engine();
    let out = engine.destroy(&["vm.trainer".to_string()]).await;
    journal.save_final().unwrap();
    assert_eq!(out["vm.trainer"], Outcome::Destroyed);
    assert!(e.rig.cloud.instances().is_empty(), "the VM is gone");
    assert_eq!(e.rig.cloud.count(Op::Create), 1);
    assert!(!kube.exists(), "the kubeconfig went with the cluster");
}

#[tokio::test]
async fn turning_kubernetes_on_for_a_running_vm_installs_k3s_on_it() {
    let rig = Rig::new(&[Feature::Kubernetes], COVERS).await;
    let e = EngineRig {
        rig,
        dir: tempfile::tempdir().unwrap(),
    };
    let (_, out) = e
        .apply("[vm.trainer]\nclouds = [\"aws\"]\nkubernetes = false\n")
        .await;
    assert!(matches!(out["vm.trainer"], Outcome::Ready(_)));
    assert_eq!(
        e.engine().1.snapshot().resources["vm.trainer"].machine.kind,
        "launch"
    );
    let (plan, out) = e.apply("[vm.trainer]\nclouds = [\"aws\"]\n").await;
    assert_eq!(plan.changes[0].action, Action::Update);
    assert!(matches!(out["vm.trainer"], Outcome::Ready(_)), "{out:?}");
    assert_eq!(
        e.engine().1.snapshot().resources["vm.trainer"].machine.kind,
        "k3s"
    );
    assert_eq!(e.rig.cloud.count(Op::Create), 1, "the same VM");
    assert_eq!(e.rig.node.pushes().len(), 1);
}

#[test]
fn the_route_is_recorded_in_the_journal() {
    let s = K3sState::CheckingBootInstall {
        vm: Box::new(serde_json::from_value(serde_json::json!({
            "instance_id": "i-1",
            "location": {"cloud": "aws", "region": "us-east-1"},
            "offer": {"id": "o", "location": {"cloud": "aws", "region": "us-east-1"},
                      "instance_type": "p5", "gpu_count": 1, "spot": false,
                      "price_per_hour": 1.0, "detail": null},
            "ssh": {"host": "127.0.0.1", "port": 22},
            "user": "ubuntu",
            "host_key": {"algorithm": "ssh-ed25519", "key_base64": "AAAA", "fingerprint": "SHA256:x"},
            "ready_at": "2026-12-01T00:00:00Z"
        }))
        .unwrap()),
        route: BootRoute::CloudInit,
    };
    let v = serde_json::to_value(&s).unwrap();
    assert_eq!(v["k3s"], "checking_boot_install");
    assert_eq!(v["route"], "cloud_init");
    let back: K3sState = serde_json::from_value(v).unwrap();
    assert_eq!(back, s);
}
