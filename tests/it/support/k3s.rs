//! The k3s test rig shared by `tests/k3s_machine.rs` and `tests/it/crash_sweep.rs`: a
//! scripted node that answers the k3s machine's SSH commands, and a local HTTPS server
//! standing in for the Kubernetes API (a real CA, a serving certificate whose SANs the
//! test controls, client-certificate authentication).
#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use gpuprov::cluster::api::{ApiConnector, ApiPath};
use gpuprov::cluster::kubeconfig::ApiAccess;
use gpuprov::cluster::remote::{NodeShell, RemoteOutput};
use gpuprov::ssh::SshError;
use gpuprov::vm::VmRecord;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The real `nvidia-smi --query-gpu` output of an H200 machine (the fixture
/// `tests/fixtures/gpu-probe/nvidia-h200/`; its origin is in `tests/fixtures/gpu-probe/PROVENANCE.md`).
pub const H200_QUERY: &str = include_str!("../../fixtures/gpu-probe/nvidia-h200/query-gpu.csv");

// ---------------------------------------------------------------------------------------
// PKI and the Kubernetes API stand-in

pub struct Pki {
    pub ca_pem: String,
    pub issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pub client_cert_pem: String,
    pub client_key_pem: String,
}

impl Pki {
    pub fn new() -> Pki {
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
        // As k3s writes them: the client certificate followed by its CA, and the key in
        // SEC1 form (`EC PRIVATE KEY`), not PKCS#8.
        let client_cert_pem =
            client.signed_by(&client_key, &issuer).unwrap().pem() + ca_pem.as_str();
        Pki {
            ca_pem,
            issuer,
            client_cert_pem,
            client_key_pem: pem(
                "EC PRIVATE KEY",
                &pkcs8_to_sec1(&client_key.serialize_der()),
            ),
        }
    }

    pub fn server_cert(&self, sans: &[&str]) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
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
    pub fn k3s_yaml(&self) -> String {
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
pub struct ApiState {
    pub cert: (CertificateDer<'static>, PrivateKeyDer<'static>),
    /// `/api/v1/nodes` answers NotReady this many more times.
    pub node_not_ready: u32,
    /// `nvidia.com/gpu` allocatable, and how many more node lists report 0 first.
    pub gpus: u32,
    pub gpus_late: u32,
    /// CoreDNS answers Pending this many more times.
    pub coredns_pending: u32,
    /// Paths requested with a client certificate.
    pub authed: Vec<String>,
    /// Requests without one.
    pub anonymous: u32,
}

pub struct ApiServer {
    pub port: u16,
    pub state: Arc<Mutex<ApiState>>,
    pub _task: tokio::task::JoinHandle<()>,
}

impl ApiServer {
    pub async fn start(pki: &Pki, sans: &[&str], gpus: u32) -> ApiServer {
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

/// PEM armour around `der`.
pub fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).unwrap());
        out.push('\n');
    }
    out + &format!("-----END {label}-----\n")
}

/// The SEC1 `ECPrivateKey` inside a PKCS#8 `PrivateKeyInfo` (RFC 5208: a SEQUENCE of the
/// version, the algorithm, and the key as an OCTET STRING).
pub fn pkcs8_to_sec1(der: &[u8]) -> Vec<u8> {
    fn tlv(b: &[u8]) -> (u8, &[u8], &[u8]) {
        let (len, hdr) = if b[1] & 0x80 == 0 {
            (b[1] as usize, 2)
        } else {
            let n = (b[1] & 0x7f) as usize;
            let len = b[2..2 + n]
                .iter()
                .fold(0usize, |l, &x| (l << 8) | x as usize);
            (len, 2 + n)
        };
        (b[0], &b[hdr..hdr + len], &b[hdr + len..])
    }
    let (_, info, _) = tlv(der);
    let (_, _, rest) = tlv(info); // version
    let (_, _, rest) = tlv(rest); // algorithm
    let (tag, key, _) = tlv(rest);
    assert_eq!(tag, 0x04, "PKCS#8 private key is an OCTET STRING");
    key.to_vec()
}

pub fn pem_der(pem: &str) -> CertificateDer<'static> {
    use base64::Engine as _;
    let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    CertificateDer::from(
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap(),
    )
}

pub async fn serve(
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
pub struct StandIn {
    pub port: u16,
    pub opened: Mutex<Vec<ApiAccess>>,
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

pub struct NodeState {
    /// The marker file's text; `None`: absent.
    pub marker: Option<String>,
    /// `cloud-init status` output; `None`: no cloud-init on the image.
    pub cloud_init: Option<String>,
    pub k3s_active: bool,
    pub gpu_csv: Option<String>,
    /// Exit codes of the next pushes (default 0).
    pub push_exit: VecDeque<i32>,
    /// Every push: the `GPUPROV_TLS_SANS` it carried.
    pub pushes: Vec<String>,
    /// SSH errors for the next commands.
    pub ssh_errors: VecDeque<SshError>,
    /// `/readyz` on the node answers "ok" only after this many more asks.
    pub readyz_late: u32,
    pub readyz_never: bool,
    pub kubeconfig: String,
    pub probes: u32,
}

pub struct Node {
    pub st: Mutex<NodeState>,
    /// Runs after every successful push (the installer rewrote the k3s config).
    pub on_push: Mutex<Option<Box<dyn Fn() + Send + Sync>>>,
}

impl Node {
    pub fn new(pki: &Pki) -> Arc<Node> {
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

    pub fn installed_at_boot(self: &Arc<Self>) -> Arc<Self> {
        {
            let mut s = self.st.lock().unwrap();
            s.marker = Some("state=done\nstep=done\n".into());
            s.k3s_active = true;
        }
        self.clone()
    }

    pub fn pushes(&self) -> Vec<String> {
        self.st.lock().unwrap().pushes.clone()
    }

    pub fn probe_output(&self) -> String {
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
