//! The Kubernetes API as the k3s machine's `Validating` step sees it: over the access path
//! the user will use ([`ApiConnector`]), with the credentials of the kubeconfig gpuprov
//! wrote ([`KubeClient`]), plus the certificate the API serves ([`serving_cert_pem`]).
//!
//! Only the few read-only calls validation needs are here (Kubernetes API reference,
//! "Node v1 core" and "Pod v1 core"; health endpoints per "Kubernetes API health
//! endpoints"): `GET /readyz`, `GET /api/v1/nodes`, and `GET
//! /api/v1/namespaces/kube-system/pods?labelSelector=k8s-app=kube-dns` (CoreDNS carries
//! the `k8s-app=kube-dns` label in k3s's bundled manifest, as upstream).

use std::any::Any;
use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde::Deserialize;
use thiserror::Error;

use super::kubeconfig::{ApiAccess, Kubeconfig};
use crate::vm::VmRecord;

/// Timeout of one API request, seconds.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// Why an API call failed. Messages never carry credentials.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ApiError {
    /// The kubeconfig lacks or mangles what a client needs.
    #[error("the kubeconfig cannot be used: {0}")]
    Kubeconfig(String),
    /// Connect, TLS or transport failure (the API may not be reachable on this path).
    #[error("cannot reach the Kubernetes API at {url}: {msg}")]
    Unreachable { url: String, msg: String },
    /// The API answered with an unexpected HTTP status.
    #[error("the Kubernetes API answered {status} to {path}: {body}")]
    Status {
        path: String,
        status: u16,
        body: String,
    },
    /// The body did not parse as the documented shape.
    #[error("unexpected answer to {path}: {msg}")]
    Decode { path: String, msg: String },
}

/// An open way to a VM's API: the base URL to call (`https://host:port`) and whatever
/// keeps the path open (an SSH tunnel) for as long as this value lives.
pub struct ApiPath {
    pub base_url: String,
    pub guard: Option<Box<dyn Any + Send + Sync>>,
}

impl ApiPath {
    /// A path that needs nothing kept open.
    pub fn direct(base_url: impl Into<String>) -> ApiPath {
        ApiPath {
            base_url: base_url.into(),
            guard: None,
        }
    }
}

/// Opens the access path the user will use to reach a VM's API. A trait so tests can
/// point validation at a local stand-in server.
#[async_trait]
pub trait ApiConnector: Send + Sync {
    /// Errors: a message saying why the path cannot be opened (tunnel failed and so on).
    async fn open(&self, vm: &VmRecord, access: &ApiAccess) -> Result<ApiPath, String>;
}

/// One node, reduced to what validation checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    /// The `Ready` condition is `True`.
    pub ready: bool,
    /// `status.allocatable["nvidia.com/gpu"]`, 0 when absent.
    pub allocatable_gpus: u32,
    /// `status.nodeInfo.kubeletVersion`.
    pub kubelet_version: Option<String>,
}

/// One pod, reduced to what validation checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    pub name: String,
    /// `status.phase` (`Pending`, `Running`, ...).
    pub phase: String,
    /// The `Ready` condition is `True`.
    pub ready: bool,
}

#[derive(Deserialize)]
struct List<T> {
    #[serde(default = "Vec::new")]
    items: Vec<T>,
}

#[derive(Deserialize)]
struct Meta {
    #[serde(default)]
    name: String,
}

#[derive(Deserialize)]
struct Condition {
    #[serde(rename = "type")]
    kind: String,
    status: String,
}

#[derive(Deserialize)]
struct NodeStatus {
    #[serde(default)]
    conditions: Vec<Condition>,
    #[serde(default)]
    allocatable: BTreeMap<String, String>,
    #[serde(default, rename = "nodeInfo")]
    node_info: Option<NodeSystemInfo>,
}

#[derive(Deserialize)]
struct NodeSystemInfo {
    #[serde(default, rename = "kubeletVersion")]
    kubelet_version: Option<String>,
}

#[derive(Deserialize)]
struct Node {
    metadata: Meta,
    #[serde(default)]
    status: Option<NodeStatus>,
}

#[derive(Deserialize)]
struct PodStatus {
    #[serde(default)]
    phase: String,
    #[serde(default)]
    conditions: Vec<Condition>,
}

#[derive(Deserialize)]
struct Pod {
    metadata: Meta,
    #[serde(default)]
    status: Option<PodStatus>,
}

fn condition_true(conds: &[Condition], kind: &str) -> bool {
    conds.iter().any(|c| c.kind == kind && c.status == "True")
}

/// A quantity such as `"1"` or `"8"` (extended resources are whole numbers); anything
/// else counts as 0.
fn whole_quantity(q: &str) -> u32 {
    q.trim().parse().unwrap_or(0)
}

fn b64_field(v: &serde_json::Value, field: &str) -> Result<Option<Vec<u8>>, ApiError> {
    match v.get(field).and_then(|f| f.as_str()) {
        None => Ok(None),
        Some(s) => STANDARD
            .decode(s.trim())
            .map(Some)
            .map_err(|_| ApiError::Kubeconfig(format!("{field} is not base64"))),
    }
}

/// A read-only client for the calls validation makes, authenticated as the kubeconfig's
/// user and trusting only the kubeconfig's cluster CA.
pub struct KubeClient {
    base: String,
    http: reqwest::Client,
}

impl KubeClient {
    /// A client for `base_url` with the credentials of `kc`'s current context (client
    /// certificate and key, or a bearer token) and its `certificate-authority-data` as
    /// the only trusted root.
    ///
    /// Errors: [`ApiError::Kubeconfig`] when the context, CA or credentials are missing
    /// or unreadable (the message names the field, never its value).
    pub fn from_kubeconfig(kc: &Kubeconfig, base_url: &str) -> Result<KubeClient, ApiError> {
        let ctx_name = kc
            .current_context
            .clone()
            .or_else(|| kc.contexts.first().map(|c| c.name.clone()))
            .ok_or_else(|| ApiError::Kubeconfig("no context".into()))?;
        let ctx = kc
            .contexts
            .iter()
            .find(|c| c.name == ctx_name)
            .ok_or_else(|| ApiError::Kubeconfig(format!("context {ctx_name} not found")))?;
        let cluster = kc
            .clusters
            .iter()
            .find(|c| c.name == ctx.context.cluster)
            .ok_or_else(|| ApiError::Kubeconfig("the context's cluster is missing".into()))?;
        let user = kc
            .users
            .iter()
            .find(|u| u.name == ctx.context.user)
            .ok_or_else(|| ApiError::Kubeconfig("the context's user is missing".into()))?;
        let cluster_v = serde_json::to_value(&cluster.cluster.other).unwrap_or_default();
        let ca = b64_field(&cluster_v, "certificate-authority-data")?
            .ok_or_else(|| ApiError::Kubeconfig("certificate-authority-data is missing".into()))?;
        // reqwest parses roots lazily; check it is a certificate now, by name.
        if super::san::cert_sans(&String::from_utf8_lossy(&ca)).is_err() {
            return Err(ApiError::Kubeconfig(
                "certificate-authority-data is not a PEM certificate".into(),
            ));
        }
        let ca = reqwest::Certificate::from_pem(&ca).map_err(|_| {
            ApiError::Kubeconfig("certificate-authority-data is not a PEM certificate".into())
        })?;
        let user_v = serde_json::to_value(&user.user).unwrap_or_default();
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(ca)
            .timeout(REQUEST_TIMEOUT)
            .no_proxy();
        let mut headers = reqwest::header::HeaderMap::new();
        if let (Some(cert), Some(key)) = (
            b64_field(&user_v, "client-certificate-data")?,
            b64_field(&user_v, "client-key-data")?,
        ) {
            let mut pem = cert;
            pem.push(b'\n');
            pem.extend_from_slice(&key);
            let id = reqwest::Identity::from_pem(&pem).map_err(|_| {
                ApiError::Kubeconfig("client-certificate-data / client-key-data unusable".into())
            })?;
            builder = builder.identity(id);
        } else if let Some(token) = user_v.get("token").and_then(|t| t.as_str()) {
            let mut v = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| ApiError::Kubeconfig("token is not a valid header value".into()))?;
            v.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, v);
        } else {
            return Err(ApiError::Kubeconfig(
                "the user has neither a client certificate nor a token".into(),
            ));
        }
        let http = builder
            .default_headers(headers)
            .build()
            .map_err(|e| ApiError::Kubeconfig(format!("HTTP client: {e}")))?;
        Ok(KubeClient {
            base: base_url.trim_end_matches('/').to_string(),
            http,
        })
    }

    async fn get(&self, path: &str) -> Result<String, ApiError> {
        let url = format!("{}{path}", self.base);
        let resp = self
            .http
            .get(&url)
            .send()
            .await
            .map_err(|e| ApiError::Unreachable {
                url: self.base.clone(),
                msg: error_chain(&e),
            })?;
        let status = resp.status().as_u16();
        let body = resp.text().await.map_err(|e| ApiError::Unreachable {
            url: self.base.clone(),
            msg: error_chain(&e),
        })?;
        if status != 200 {
            return Err(ApiError::Status {
                path: path.into(),
                status,
                body: body.chars().take(200).collect(),
            });
        }
        Ok(body)
    }

    /// `GET /readyz`: `Ok(())` when it answers 200 `ok`.
    ///
    /// Errors: [`ApiError::Status`] with the failing checks (the body) when not ready.
    pub async fn readyz(&self) -> Result<(), ApiError> {
        self.get("/readyz").await.map(|_| ())
    }

    /// `GET /api/v1/nodes`.
    pub async fn nodes(&self) -> Result<Vec<NodeInfo>, ApiError> {
        let path = "/api/v1/nodes";
        let list: List<Node> = decode(path, &self.get(path).await?)?;
        Ok(list
            .items
            .into_iter()
            .map(|n| {
                let st = n.status;
                NodeInfo {
                    name: n.metadata.name,
                    ready: st
                        .as_ref()
                        .is_some_and(|s| condition_true(&s.conditions, "Ready")),
                    allocatable_gpus: st
                        .as_ref()
                        .and_then(|s| s.allocatable.get("nvidia.com/gpu"))
                        .map_or(0, |q| whole_quantity(q)),
                    kubelet_version: st.and_then(|s| s.node_info).and_then(|i| i.kubelet_version),
                }
            })
            .collect())
    }

    /// The CoreDNS pods in `kube-system`.
    pub async fn coredns_pods(&self) -> Result<Vec<PodInfo>, ApiError> {
        let path = "/api/v1/namespaces/kube-system/pods?labelSelector=k8s-app%3Dkube-dns";
        let list: List<Pod> = decode(path, &self.get(path).await?)?;
        Ok(list
            .items
            .into_iter()
            .map(|p| {
                let st = p.status;
                PodInfo {
                    name: p.metadata.name,
                    ready: st
                        .as_ref()
                        .is_some_and(|s| condition_true(&s.conditions, "Ready")),
                    phase: st.map(|s| s.phase).unwrap_or_default(),
                }
            })
            .collect())
    }
}

fn decode<T: serde::de::DeserializeOwned>(path: &str, body: &str) -> Result<T, ApiError> {
    serde_json::from_str(body).map_err(|e| ApiError::Decode {
        path: path.into(),
        msg: e.to_string(),
    })
}

/// The error and its causes on one line (reqwest's top-level message alone hides the TLS
/// reason, for example a certificate not valid for the host).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut src = e.source();
    while let Some(s) = src {
        let m = s.to_string();
        if !parts.iter().any(|p| p.contains(&m)) {
            parts.push(m);
        }
        src = s.source();
    }
    parts.join(": ")
}

/// The certificate the API at `base_url` serves, as PEM, read from the TLS handshake
/// without trusting it (it is only inspected, for its SANs) and without sending any
/// credential.
///
/// Errors: [`ApiError::Unreachable`] when no TLS handshake completes or no certificate
/// was presented.
pub async fn serving_cert_pem(base_url: &str) -> Result<String, ApiError> {
    let http = reqwest::Client::builder()
        .use_rustls_tls()
        .danger_accept_invalid_certs(true)
        .tls_info(true)
        .timeout(REQUEST_TIMEOUT)
        .no_proxy()
        .build()
        .map_err(|e| ApiError::Unreachable {
            url: base_url.into(),
            msg: e.to_string(),
        })?;
    let url = format!("{}/version", base_url.trim_end_matches('/'));
    let resp = http
        .get(&url)
        .send()
        .await
        .map_err(|e| ApiError::Unreachable {
            url: base_url.into(),
            msg: error_chain(&e),
        })?;
    let der = resp
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|t| t.peer_certificate())
        .ok_or_else(|| ApiError::Unreachable {
            url: base_url.into(),
            msg: "no certificate in the TLS handshake".into(),
        })?;
    Ok(der_to_pem(der))
}

/// PEM text of one DER certificate.
pub fn der_to_pem(der: &[u8]) -> String {
    let b64 = STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// The real connector: `Direct` connects to the VM's public host on 6443; `SshTunnel`
/// opens an SSH local forward to the VM's 6443 on a free local port for as long as the
/// returned path lives.
pub struct AccessConnector {
    pub key: crate::ssh::ProjectKey,
}

#[async_trait]
impl ApiConnector for AccessConnector {
    async fn open(&self, vm: &VmRecord, access: &ApiAccess) -> Result<ApiPath, String> {
        match access {
            ApiAccess::Direct { .. } => access
                .server_url()
                .map(ApiPath::direct)
                .map_err(|e| e.to_string()),
            ApiAccess::SshTunnel { .. } => {
                let t =
                    super::tunnel::Tunnel::open(vm, &self.key, None, super::kubeconfig::API_PORT)
                        .await
                        .map_err(|e| e.to_string())?;
                Ok(ApiPath {
                    base_url: format!("https://127.0.0.1:{}", t.local_port()),
                    guard: Some(Box::new(t)),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_and_pod_lists_decode_the_documented_shapes() {
        let nodes: List<Node> = serde_json::from_str(
            r#"{"kind":"NodeList","items":[{"metadata":{"name":"gpu-1"},"status":{
                "conditions":[{"type":"MemoryPressure","status":"False"},{"type":"Ready","status":"True"}],
                "allocatable":{"cpu":"16","nvidia.com/gpu":"8"},
                "nodeInfo":{"kubeletVersion":"v1.31.4+k3s1"}}}]}"#,
        )
        .unwrap();
        let n = &nodes.items[0];
        let st = n.status.as_ref().unwrap();
        assert!(condition_true(&st.conditions, "Ready"));
        assert!(!condition_true(&st.conditions, "MemoryPressure"));
        assert_eq!(whole_quantity(&st.allocatable["nvidia.com/gpu"]), 8);
        assert_eq!(whole_quantity("500m"), 0);
        // An empty list and a node without status are valid answers, not errors.
        let empty: List<Node> = serde_json::from_str(r#"{"kind":"NodeList"}"#).unwrap();
        assert!(empty.items.is_empty());
        let bare: List<Node> =
            serde_json::from_str(r#"{"items":[{"metadata":{"name":"x"}}]}"#).unwrap();
        assert!(bare.items[0].status.is_none());
    }

    #[test]
    fn pem_round_trips_through_the_san_parser() {
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".into(), "k3s.example".into()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        let pem = der_to_pem(cert.der());
        let sans = crate::cluster::san::cert_sans(&pem).unwrap();
        assert_eq!(sans.len(), 2, "{sans:?}");
    }

    #[test]
    fn kubeconfig_without_credentials_is_refused_by_name() {
        let kc = Kubeconfig::parse(
            "apiVersion: v1\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority-data: bm90IGEgY2VydA==\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user: {}\ncurrent-context: c\n",
        )
        .unwrap();
        let err = KubeClient::from_kubeconfig(&kc, "https://127.0.0.1:6443")
            .err()
            .unwrap();
        assert!(
            matches!(err, ApiError::Kubeconfig(ref m) if m.contains("certificate-authority-data")),
            "{err}"
        );
    }
}
