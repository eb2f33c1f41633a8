//! The AWS adapter end to end against a real EC2 API server (moto, issue 3).
//!
//! Each test starts its own `moto_server` on a free loopback port (killed on drop) and
//! puts a small HTTP proxy in front of it ([`Proxy`]). The proxy
//! - rewrites every public IPv4 address in EC2's XML answers (`ipAddress`, `publicIp`,
//!   `publicIpAddress`) to a distinct `127.0.0.x`, so nothing ever dials the public-looking
//!   addresses moto hands out; a [`LoopbackOnly`] connector guard double-checks it;
//! - injects EC2's real XML error body for chosen calls (`InsufficientInstanceCapacity`
//!   with HTTP 500, `VcpuLimitExceeded`, ...), so the SDK's own parsing is exercised;
//! - remembers every `ClientToken` a `RunInstances` succeeded with, and answers a
//!   `RunInstances` that sends one again with that first reservation, as EC2 does (even
//!   after the instance terminated; moto forgets tokens, so without this a test could not
//!   see a replacement that re-sends a used token get the dead instance back).
//!
//! moto must be installed (`pip install 'moto[server]'`); without it the tests fail with
//! that hint, unless `GPUPROV_SKIP_AWS=1`. The classification tests need no moto: the
//! proxy answers the injected errors itself.
//!
//! Fake credentials (`testing`) are given to the adapter explicitly and to the moto child
//! process's own environment; the test process's environment is never changed.

use std::collections::HashMap;
use std::net::TcpListener as StdListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_ec2::types::Filter;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use gpuprov::config::{Cloud, VmSpec};
use gpuprov::machine::Providers;
use gpuprov::machine::{CancelToken, ExecError, Executor, MemoryJournal, RetryPolicy};
use gpuprov::provider::clouds::aws::{AwsProvider, AwsSettings, StaticCredentials};
use gpuprov::provider::doubles::fake::FakeConnector;
use gpuprov::provider::{
    BlockScope, CloudProvider, ErrorKind, InstanceSpec, Location, Offer, SshEndpoint,
    IDENTITY_LABEL, LINEAGE_LABEL,
};
use gpuprov::ssh::{Connector, HostKey, SshError};
use gpuprov::vm::{LaunchMachine, LaunchState, Target, TeardownMachine, TeardownState};

pub(crate) const LINEAGE: &str = "5f0c2a7e-1b2d-4c3e-9f10-aabbccddeeff";
const VM: &str = "trainer";

const FAST: RetryPolicy = RetryPolicy {
    max_attempts: 4,
    initial_backoff: Duration::from_millis(10),
    max_backoff: Duration::from_millis(50),
};

pub(crate) fn skip() -> bool {
    std::env::var("GPUPROV_SKIP_AWS").is_ok_and(|v| v == "1")
}

// ---------------------------------------------------------------------------------------
// moto

/// A `moto_server` child process on a free loopback port; killed on drop.
pub(crate) struct Moto {
    child: Child,
    pub(crate) port: u16,
}

fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl Moto {
    pub(crate) fn start() -> Moto {
        let port = free_port();
        let mut last_err = String::new();
        for (prog, pre) in [
            ("moto_server", vec![]),
            ("python3", vec!["-m", "moto.server"]),
        ] {
            let mut cmd = Command::new(prog);
            cmd.args(&pre)
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .env("AWS_ACCESS_KEY_ID", "testing")
                .env("AWS_SECRET_ACCESS_KEY", "testing")
                .env("AWS_DEFAULT_REGION", "us-east-1")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            match cmd.spawn() {
                Ok(mut child) => {
                    let deadline = Instant::now() + Duration::from_secs(30);
                    while Instant::now() < deadline {
                        if let Ok(Some(status)) = child.try_wait() {
                            last_err = format!("{prog} exited with {status}");
                            break;
                        }
                        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                            return Moto { child, port };
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    let _ = child.kill();
                    let _ = child.wait();
                    if last_err.is_empty() {
                        last_err = format!("{prog} did not listen on port {port} within 30s");
                    }
                }
                Err(e) => last_err = format!("{prog}: {e}"),
            }
        }
        panic!(
            "moto is needed for the AWS tests and could not be started ({last_err}); install \
             it with `pip install 'moto[server]'` (or set GPUPROV_SKIP_AWS=1 to skip them)"
        );
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------
// The proxy in front of moto

/// An EC2 error to answer instead of forwarding.
#[derive(Clone, Debug)]
pub(crate) struct Fault {
    pub(crate) action: &'static str,
    /// Only requests signed for this region (`None`: any).
    pub(crate) region: Option<&'static str>,
    /// Only requests naming this instance type (`None`: any).
    pub(crate) instance_type: Option<&'static str>,
    pub(crate) status: u16,
    pub(crate) code: &'static str,
    pub(crate) message: &'static str,
    pub(crate) times: u32,
    /// A canned body to answer with instead of the error XML.
    pub(crate) body: Option<&'static str>,
    /// The answer's `Content-Type` (`None`: EC2's `text/xml;charset=UTF-8`).
    pub(crate) content_type: Option<&'static str>,
}

/// One request the proxy saw: action, region, instance type, and whether a fault
/// answered it.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) action: String,
    pub(crate) region: String,
    pub(crate) instance_type: Option<String>,
    pub(crate) faulted: Option<String>,
    /// The form body as sent (URL-encoded).
    pub(crate) body: String,
    /// A `RunInstances` answered from the token memory (the first reservation of a
    /// `ClientToken` sent again) instead of being forwarded.
    pub(crate) replayed: Option<String>,
}

#[derive(Default)]
pub(crate) struct ProxyState {
    faults: Vec<Fault>,
    seen: Vec<Seen>,
    ips: HashMap<String, String>,
    /// Public addresses that ever reached a client (must all be loopback).
    handed_out: Vec<String>,
    /// Every `ClientToken` a forwarded `RunInstances` succeeded with → (instance id, the
    /// answer's body), kept after the instance terminates, as EC2 keeps them.
    tokens: HashMap<String, (String, Vec<u8>)>,
    /// Remember tokens by their pre-nonce shape (`gpuprov-<lineage8>-<vm>-r<round>-o<n>`,
    /// the per-planning nonce dropped), as the cloud would have seen them before the
    /// engine added it: the negative control for the replacement test.
    legacy_tokens: bool,
}

/// `token` without the engine's per-planning nonce: `gpuprov-<l8>-<vm>-<8 hex>-r<n>-o<m>`
/// → `gpuprov-<l8>-<vm>-r<n>-o<m>` (unchanged when it has no such segment).
fn without_nonce(token: &str) -> String {
    let Some(i) = token.rfind("-r") else {
        return token.to_string();
    };
    let (head, tail) = token.split_at(i);
    match head.rsplit_once('-') {
        Some((before, nonce))
            if nonce.len() == 8 && nonce.chars().all(|c| c.is_ascii_hexdigit()) =>
        {
            format!("{before}{tail}")
        }
        _ => token.to_string(),
    }
}

/// The first `<instanceId>` of an EC2 answer.
fn first_instance_id(body: &str) -> Option<String> {
    let start = body.find("<instanceId>")? + "<instanceId>".len();
    let end = body[start..].find('<')?;
    Some(body[start..start + end].trim().to_string())
}

#[derive(Clone)]
pub(crate) struct Proxy {
    port: u16,
    pub(crate) state: Arc<Mutex<ProxyState>>,
}

fn form_value(body: &str, key: &str) -> Option<String> {
    body.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| v.replace("%2F", "/").replace("%2E", "."))
    })
}

fn region_of(head: &str) -> String {
    // Authorization: AWS4-HMAC-SHA256 Credential=AKID/20260101/us-east-1/ec2/aws4_request
    head.split("Credential=")
        .nth(1)
        .and_then(|c| c.split('/').nth(2))
        .unwrap_or("")
        .to_string()
}

fn ec2_error_xml(code: &str, message: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code>\
         <Message>{message}</Message></Error></Errors>\
         <RequestID>3f2b1c7a-0d4e-4a8b-9c1d-2e3f4a5b6c7d</RequestID></Response>"
    )
}

/// Replaces each public IPv4 in the `<ipAddress>`, `<publicIp>` and `<publicIpAddress>`
/// elements (and every other occurrence of the same address) with a distinct 127.0.0.x.
fn rewrite_ips(body: &str, st: &mut ProxyState) -> String {
    let mut found = Vec::new();
    for tag in ["ipAddress", "publicIp", "publicIpAddress"] {
        let open = format!("<{tag}>");
        let close = format!("</{tag}>");
        let mut rest = body;
        while let Some(i) = rest.find(&open) {
            let after = &rest[i + open.len()..];
            let Some(j) = after.find(&close) else { break };
            found.push(after[..j].trim().to_string());
            rest = &after[j..];
        }
    }
    let mut out = body.to_string();
    for ip in found {
        if ip.is_empty() || ip.starts_with("127.") {
            continue;
        }
        let n = st.ips.len() + 2;
        let local = st
            .ips
            .entry(ip.clone())
            .or_insert_with(|| format!("127.0.0.{n}"))
            .clone();
        out = out.replace(&format!(">{ip}<"), &format!(">{local}<"));
    }
    for tag in ["ipAddress", "publicIp", "publicIpAddress"] {
        let open = format!("<{tag}>");
        let mut rest = out.as_str();
        while let Some(i) = rest.find(&open) {
            let after = &rest[i + open.len()..];
            let v: String = after.chars().take_while(|c| *c != '<').collect();
            st.handed_out.push(v);
            rest = after;
        }
    }
    out
}

async fn read_request(s: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        let n = s.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())
                .flatten()
        })
        .unwrap_or(0);
    if head.to_ascii_lowercase().contains("expect: 100-continue") {
        s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await.ok()?;
    }
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let n = s.read(&mut tmp).await.ok()?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&tmp[..n]);
    }
    Some((head, body))
}

/// Sends the request to moto with `Connection: close` and returns (status, body).
async fn forward(upstream: u16, head: &str, body: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(("127.0.0.1", upstream)).await?;
    let mut lines = head.split("\r\n").filter(|l| !l.is_empty());
    let request_line = lines.next().unwrap_or("POST / HTTP/1.1");
    let mut out = format!("{request_line}\r\n");
    for l in lines {
        let lower = l.to_ascii_lowercase();
        if lower.starts_with("connection:") || lower.starts_with("expect:") {
            continue;
        }
        out.push_str(l);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    s.write_all(out.as_bytes()).await?;
    s.write_all(body).await?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).await?;
    let end = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| p + 4)
        .unwrap_or(resp.len());
    let rhead = String::from_utf8_lossy(&resp[..end]).to_string();
    let status = rhead
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(502);
    let mut rbody = resp[end..].to_vec();
    if rhead
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        rbody = dechunk(&rbody);
    }
    Ok((status, rbody))
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(p) = b.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&b[..p])
                .split(';')
                .next()
                .unwrap_or("0")
                .trim(),
            16,
        )
        .unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = p + 2;
        out.extend_from_slice(&b[start..(start + size).min(b.len())]);
        b = &b[(start + size + 2).min(b.len())..];
    }
    out
}

async fn respond(s: &mut TcpStream, status: u16, body: &[u8]) {
    respond_as(s, status, "text/xml;charset=UTF-8", body).await
}

async fn respond_as(s: &mut TcpStream, status: u16, content_type: &str, body: &[u8]) {
    let head = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    let _ = s.write_all(head.as_bytes()).await;
    let _ = s.write_all(body).await;
    let _ = s.shutdown().await;
}

impl Proxy {
    /// A proxy to moto on `upstream` (`None`: every request must be answered by a fault).
    pub(crate) async fn start(upstream: Option<u16>) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(ProxyState::default()));
        let st = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else {
                    break;
                };
                let st = st.clone();
                tokio::spawn(async move {
                    let Some((head, body)) = read_request(&mut sock).await else {
                        return;
                    };
                    let text = String::from_utf8_lossy(&body).to_string();
                    let action = form_value(&text, "Action").unwrap_or_default();
                    let region = region_of(&head);
                    let itype = form_value(&text, "InstanceType");
                    let token = (action == "RunInstances")
                        .then(|| form_value(&text, "ClientToken"))
                        .flatten()
                        .map(|t| {
                            if st.lock().unwrap().legacy_tokens {
                                without_nonce(&t)
                            } else {
                                t
                            }
                        });
                    let (fault, remembered) = {
                        let mut g = st.lock().unwrap();
                        let hit = g.faults.iter_mut().find(|f| {
                            f.times > 0
                                && f.action == action
                                && f.region.is_none_or(|r| r == region)
                                && f.instance_type.is_none_or(|t| itype.as_deref() == Some(t))
                        });
                        let fault = hit.map(|f| {
                            f.times -= 1;
                            f.clone()
                        });
                        // EC2 answers a ClientToken it has seen with that first
                        // reservation, whether or not the instance still exists.
                        let remembered = match (&fault, &token) {
                            (None, Some(t)) => g.tokens.get(t).cloned(),
                            _ => None,
                        };
                        g.seen.push(Seen {
                            action: action.clone(),
                            region: region.clone(),
                            instance_type: itype.clone(),
                            faulted: fault.as_ref().map(|f| f.code.to_string()),
                            body: text.clone(),
                            replayed: remembered.as_ref().map(|r| r.0.clone()),
                        });
                        (fault, remembered)
                    };
                    if let Some(f) = fault {
                        let body = match f.body {
                            Some(b) => b.to_string(),
                            None => ec2_error_xml(f.code, f.message),
                        };
                        let ct = f.content_type.unwrap_or("text/xml;charset=UTF-8");
                        respond_as(&mut sock, f.status, ct, body.as_bytes()).await;
                        return;
                    }
                    if let Some((_, first)) = remembered {
                        respond(&mut sock, 200, &first).await;
                        return;
                    }
                    let Some(up) = upstream else {
                        respond(
                            &mut sock,
                            500,
                            ec2_error_xml("InternalError", "no upstream in this test").as_bytes(),
                        )
                        .await;
                        return;
                    };
                    match forward(up, &head, &body).await {
                        Ok((status, rbody)) => {
                            let rewritten = {
                                let mut g = st.lock().unwrap();
                                rewrite_ips(&String::from_utf8_lossy(&rbody), &mut g)
                            };
                            if let (200, Some(t), Some(id)) =
                                (status, &token, first_instance_id(&rewritten))
                            {
                                st.lock()
                                    .unwrap()
                                    .tokens
                                    .insert(t.clone(), (id, rewritten.as_bytes().to_vec()));
                            }
                            respond(&mut sock, status, rewritten.as_bytes()).await;
                        }
                        Err(e) => {
                            respond(
                                &mut sock,
                                503,
                                ec2_error_xml("ServiceUnavailable", &e.to_string()).as_bytes(),
                            )
                            .await
                        }
                    }
                });
            }
        });
        Proxy { port, state }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub(crate) fn fault(&self, f: Fault) {
        self.state.lock().unwrap().faults.push(f);
    }

    pub(crate) fn seen(&self, action: &str) -> Vec<Seen> {
        self.state
            .lock()
            .unwrap()
            .seen
            .iter()
            .filter(|s| s.action == action)
            .cloned()
            .collect()
    }

    fn regions_seen(&self) -> Vec<String> {
        let mut r: Vec<String> = self
            .state
            .lock()
            .unwrap()
            .seen
            .iter()
            .map(|s| s.region.clone())
            .collect();
        r.sort();
        r.dedup();
        r
    }

    pub(crate) fn assert_only_loopback_handed_out(&self) {
        let g = self.state.lock().unwrap();
        assert!(
            g.seen.iter().all(|s| s.action != "DescribeInstances")
                || g.handed_out.iter().any(|ip| ip.starts_with("127.0.0."))
                || g.ips.is_empty(),
            "the rewriting layer saw public addresses but handed out none"
        );
        for ip in &g.handed_out {
            assert!(
                ip.is_empty() || ip.starts_with("127."),
                "a non-loopback address reached the adapter: {ip}"
            );
        }
    }
}

pub(crate) fn fault(action: &'static str, status: u16, code: &'static str) -> Fault {
    Fault {
        action,
        region: None,
        instance_type: None,
        status,
        code,
        message: "injected by the test proxy",
        times: 1,
        body: None,
        content_type: None,
    }
}

// ---------------------------------------------------------------------------------------
// Connectors

/// Refuses (by panicking) any endpoint outside 127.0.0.0/8, then delegates.
struct LoopbackOnly<C>(C);

#[async_trait]
impl<C: Connector> Connector for LoopbackOnly<C> {
    async fn login(
        &self,
        endpoint: &SshEndpoint,
        user: &str,
        pinned: Option<&HostKey>,
    ) -> Result<HostKey, SshError> {
        let ip: std::net::Ipv4Addr = endpoint
            .host
            .parse()
            .unwrap_or_else(|_| panic!("endpoint host {} is not an IPv4", endpoint.host));
        assert!(
            ip.is_loopback(),
            "refusing to dial {ip}: outside 127.0.0.0/8"
        );
        self.0.login(endpoint, user, pinned).await
    }
}

// ---------------------------------------------------------------------------------------
// The run harness

pub(crate) fn settings(endpoint: String) -> AwsSettings {
    let mut s = AwsSettings {
        endpoint: Some(endpoint),
        credentials: Some(StaticCredentials {
            access_key_id: "testing".into(),
            secret_access_key: "testing".into(),
        }),
        credentials_timeout: Duration::from_secs(5),
        ..AwsSettings::new(LINEAGE.parse().unwrap())
    };
    s.capabilities.poll_interval = Duration::from_millis(100);
    s.capabilities.boot_timeout = Duration::from_secs(20);
    s.capabilities.ssh_timeout = Duration::from_secs(2);
    s.capabilities.delete_timeout = Duration::from_secs(20);
    s
}

/// What moto at `moto_url` holds with the identity tag of [`VM`] in `region`, asked
/// directly (not through the proxy): live instance ids (each must carry [`LINEAGE`]) and
/// security group ids.
pub(crate) async fn sweep_moto(moto_url: &str, region: &str) -> (Vec<String>, Vec<String>) {
    let c = direct_client(moto_url, region);
    let tag_filter = Filter::builder()
        .name(format!("tag:{IDENTITY_LABEL}"))
        .values(VM)
        .build();
    let live = Filter::builder()
        .name("instance-state-name")
        .set_values(Some(
            ["pending", "running", "stopping", "stopped", "shutting-down"]
                .map(String::from)
                .to_vec(),
        ))
        .build();
    let out = c
        .describe_instances()
        .filters(tag_filter.clone())
        .filters(live)
        .send()
        .await
        .expect("sweep DescribeInstances");
    let mut ids = Vec::new();
    for r in out.reservations() {
        for i in r.instances() {
            let lineage = i
                .tags()
                .iter()
                .find(|t| t.key() == Some(LINEAGE_LABEL))
                .and_then(|t| t.value());
            assert_eq!(lineage, Some(LINEAGE), "every instance carries the lineage");
            ids.push(i.instance_id().unwrap_or_default().to_string());
        }
    }
    let sgs = c
        .describe_security_groups()
        .filters(tag_filter)
        .send()
        .await
        .expect("sweep DescribeSecurityGroups");
    let groups = sgs
        .security_groups()
        .iter()
        .map(|g| g.group_id().unwrap_or_default().to_string())
        .collect();
    (ids, groups)
}

/// An EC2 client straight to the moto at `moto_url` (not through the proxy).
pub(crate) fn direct_client(moto_url: &str, region: &str) -> aws_sdk_ec2::Client {
    let conf = aws_sdk_ec2::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(region.to_string()))
        .credentials_provider(Credentials::new("testing", "testing", None, None, "test"))
        .endpoint_url(moto_url.to_string())
        .http_client(
            aws_smithy_http_client::Builder::new()
                .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                    aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
                ))
                .build_https(),
        )
        .build();
    aws_sdk_ec2::Client::from_conf(conf)
}

struct Env {
    _moto: Moto,
    moto_url: String,
    proxy: Proxy,
    aws: Arc<AwsProvider>,
    journal: Arc<MemoryJournal>,
    vm: VmSpec,
}

impl Env {
    async fn start(gpu: &str, gpu_count: u32, regions: &[&str]) -> Env {
        Env::start_with(gpu, gpu_count, regions, |_| {}).await
    }

    /// [`Env::start`] with the adapter's settings adjusted by `tweak`.
    async fn start_with(
        gpu: &str,
        gpu_count: u32,
        regions: &[&str],
        tweak: impl FnOnce(&mut AwsSettings),
    ) -> Env {
        let moto = Moto::start();
        let moto_url = moto.url();
        let proxy = Proxy::start(Some(moto.port)).await;
        let mut s = settings(proxy.url());
        tweak(&mut s);
        let aws = Arc::new(AwsProvider::new(s));
        let mut vm = VmSpec::new(VM, vec![Cloud::Aws]);
        vm.gpu = Some(gpu.into());
        vm.gpu_count = gpu_count;
        vm.regions = regions.iter().map(|s| s.to_string()).collect();
        vm.kubernetes = false;
        Env {
            _moto: moto,
            moto_url,
            proxy,
            aws,
            journal: Arc::new(MemoryJournal::new()),
            vm,
        }
    }

    fn providers(&self) -> Providers {
        let mut p = Providers::new();
        p.insert(self.aws.clone());
        p
    }

    fn machine(&self, connector: Arc<dyn Connector>) -> LaunchMachine {
        let mut m = LaunchMachine::new(
            self.vm.clone(),
            LINEAGE.into(),
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGpuprovTestKeyOnly gpuprov-test".into(),
            self.providers(),
            connector,
        );
        m.retry = FAST;
        m.teardown.retry = FAST;
        m.vanish_grace = Some(Duration::from_secs(2));
        m.exhausted_wait = Duration::from_millis(5);
        m
    }

    async fn launch_with(&self, connector: Arc<dyn Connector>) -> Result<LaunchState, ExecError> {
        let ex = Executor::new(self.journal.clone(), CancelToken::new());
        let m = self.machine(connector);
        let fut = ex.run(&m, "vm.trainer", |prev| {
            let owned = prev
                .and_then(|p| serde_json::from_value::<LaunchState>(p.state).ok())
                .and_then(|s| s.owned());
            LaunchState::start(owned)
        });
        tokio::time::timeout(Duration::from_secs(90), fut)
            .await
            .expect("launch must not hang")
    }

    async fn launch(&self) -> Result<LaunchState, ExecError> {
        self.launch_with(Arc::new(LoopbackOnly(FakeConnector::default())))
            .await
    }

    async fn teardown(&self, location: Location, ids: Vec<String>) -> TeardownState {
        let mut m = TeardownMachine::new(self.providers());
        m.retry = FAST;
        let ex = Executor::new(Arc::new(MemoryJournal::new()), CancelToken::new());
        let target = Target::new(location, VM, ids);
        tokio::time::timeout(
            Duration::from_secs(60),
            ex.run(&m, "vm.trainer", |_| TeardownState::Requesting { target }),
        )
        .await
        .expect("teardown must not hang")
        .expect("teardown runs")
    }

    fn labels(&self) -> Vec<String> {
        self.journal.history().into_iter().map(|(_, l)| l).collect()
    }

    /// A client straight to moto (not through the proxy), for the sweeps.
    fn direct(&self, region: &str) -> aws_sdk_ec2::Client {
        direct_client(&self.moto_url, region)
    }

    /// What moto holds with our identity tag in `region` ([`sweep_moto`]).
    async fn sweep(&self, region: &str) -> (Vec<String>, Vec<String>) {
        sweep_moto(&self.moto_url, region).await
    }

    /// "No silent leaks": everything moto holds with the identity tag, in every region the
    /// test touched, is owned by `end` (nothing at all when it owns nothing).
    async fn assert_nothing_unknown(&self, end: &LaunchState, regions: &[&str]) {
        let owned = end.owned();
        for r in regions {
            let (ids, groups) = self.sweep(r).await;
            let known: Vec<String> = owned
                .as_ref()
                .filter(|o| o.location.region == *r)
                .map(|o| o.instance_ids.clone())
                .unwrap_or_default();
            for id in &ids {
                assert!(
                    known.contains(id),
                    "{id} in {r} is tagged but the state does not know it (end: {end:?})"
                );
            }
            if known.is_empty() {
                assert!(
                    groups.is_empty(),
                    "security groups {groups:?} left in {r} (end: {end:?})"
                );
            }
        }
        self.proxy.assert_only_loopback_handed_out();
    }
}

fn ready_or_panic(end: &LaunchState) -> &gpuprov::vm::VmRecord {
    end.ready()
        .unwrap_or_else(|| panic!("expected Ready, got {end:?}"))
}

// ---------------------------------------------------------------------------------------
// End to end against moto

#[tokio::test]
async fn full_launch_then_teardown_against_moto() {
    if skip() {
        return;
    }
    let env = Env::start("H100", 8, &["us-east-1", "us-west-2"]).await;
    let end = env.launch().await.expect("launch runs");
    let vm = ready_or_panic(&end);
    assert_eq!(vm.offer.id, "aws/us-east-1/p5.48xlarge/us-east-1a");
    assert_eq!(vm.offer.location.zone.as_deref(), Some("us-east-1a"));
    assert!(
        vm.ssh.host.starts_with("127.0.0."),
        "endpoint was rewritten to loopback: {}",
        vm.ssh
    );
    assert_eq!(vm.ssh.port, 22);
    assert_eq!(vm.user, "ubuntu");
    {
        let st = env.proxy.state.lock().unwrap();
        assert!(
            st.ips.values().any(|l| *l == vm.ssh.host) && !st.ips.contains_key(&vm.ssh.host),
            "moto's public address was rewritten to {}: {:?}",
            vm.ssh.host,
            st.ips
        );
    }
    let labels = env.labels();
    for (i, prefix) in [
        "reconciling",
        "planning",
        "preparing aws/us-east-1",
        "creating",
        "creating", // the intent to call create, journalled before the call
        "booting",
        "connecting",
        "ready",
    ]
    .iter()
    .enumerate()
    {
        assert!(labels[i].starts_with(prefix), "{labels:?}");
    }

    // prepare made a tagged security group; create tagged the instance (and its volume).
    let (ids, groups) = env.sweep("us-east-1").await;
    assert_eq!(ids, vec![vm.instance_id.clone()]);
    assert_eq!(groups.len(), 1, "one per-VM security group");
    let c = env.direct("us-east-1");
    let sg = c
        .describe_security_groups()
        .group_ids(&groups[0])
        .send()
        .await
        .unwrap();
    let g = &sg.security_groups()[0];
    assert_eq!(
        g.group_name(),
        Some(AwsProvider::security_group_name(VM, LINEAGE).as_str())
    );
    assert!(g
        .tags()
        .iter()
        .any(|t| t.key() == Some(LINEAGE_LABEL) && t.value() == Some(LINEAGE)));
    assert!(g
        .ip_permissions()
        .iter()
        .any(|p| p.from_port() == Some(22) && p.to_port() == Some(22)));
    let run = env.proxy.seen("RunInstances");
    assert_eq!(run.len(), 1, "one create");
    let vols = c
        .describe_volumes()
        .filters(
            Filter::builder()
                .name(format!("tag:{IDENTITY_LABEL}"))
                .values(VM)
                .build(),
        )
        .send()
        .await
        .unwrap();
    assert!(
        !vols.volumes().is_empty(),
        "the volume carries the identity"
    );

    // prepare is idempotent: again, same group, nothing new.
    let offer = vm.offer.clone();
    let spec = env
        .machine(Arc::new(FakeConnector::default()))
        .instance_spec(&gpuprov::vm::Search {
            offers: vec![offer.clone()],
            ..Default::default()
        });
    let again = env.aws.prepare(&offer, &spec).await.expect("prepare again");
    assert_eq!(again["security_group"].as_str(), Some(groups[0].as_str()));

    // Teardown: instance terminated, security group gone.
    let done = env
        .teardown(vm.location.clone(), vec![vm.instance_id.clone()])
        .await;
    assert_eq!(done, TeardownState::Done);
    let (ids, groups) = env.sweep("us-east-1").await;
    assert!(ids.is_empty() && groups.is_empty(), "{ids:?} {groups:?}");
    env.proxy.assert_only_loopback_handed_out();
}

#[tokio::test]
async fn crash_between_create_and_journal_adopts_the_instance() {
    if skip() {
        return;
    }
    let env = Env::start("H100", 8, &["us-east-1"]).await;
    env.journal.crash_before("booting");
    let first = env.launch().await.unwrap_err();
    assert!(matches!(first, ExecError::Journal { .. }), "{first:?}");
    assert_eq!(
        env.sweep("us-east-1").await.0.len(),
        1,
        "the create happened"
    );

    // The resumed Creating step (prepare already journalled) observes and adopts.
    let end = env.launch().await.expect("resume");
    let vm = ready_or_panic(&end);
    let (ids, _) = env.sweep("us-east-1").await;
    assert_eq!(ids, vec![vm.instance_id.clone()], "exactly one instance");
    assert_eq!(env.proxy.seen("RunInstances").len(), 1, "no second create");

    // Re-running prepare and create by hand after the crash: prepare is idempotent, and
    // the launch machine's observe-first step is what adopts (moto ignores ClientToken).
    let spec = env
        .machine(Arc::new(FakeConnector::default()))
        .instance_spec(&gpuprov::vm::Search {
            offers: vec![vm.offer.clone()],
            ..Default::default()
        });
    env.aws.prepare(&vm.offer, &spec).await.expect("prepare");
    let seen = env.aws.observe(&vm.location, VM).await.unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].instance_id, vm.instance_id);

    let done = env
        .teardown(vm.location.clone(), vec![vm.instance_id.clone()])
        .await;
    assert_eq!(done, TeardownState::Done);
    assert_eq!(env.sweep("us-east-1").await, (vec![], vec![]));
}

#[tokio::test]
async fn insufficient_capacity_fails_over_to_the_next_offer() {
    if skip() {
        return;
    }
    // A100 in us-east-1: p4d.24xlarge first (cheaper) in each of its zones (moto, like
    // EC2, offers it in us-east-1a..d), then p4de.24xlarge (offered in us-east-1b, c).
    let env = Env::start("A100", 8, &["us-east-1", "us-west-2"]).await;
    env.proxy.fault(Fault {
        instance_type: Some("p4d.24xlarge"),
        region: Some("us-east-1"),
        message: "We currently do not have sufficient p4d.24xlarge capacity in the \
                  Availability Zone you requested.",
        times: 4,
        ..fault("RunInstances", 500, "InsufficientInstanceCapacity")
    });
    let end = env.launch().await.expect("launch runs");
    let vm = ready_or_panic(&end);
    assert_eq!(
        vm.offer.id, "aws/us-east-1/p4de.24xlarge/us-east-1b",
        "capacity blocks the zone's offer only; every zone of p4d first"
    );
    let run = env.proxy.seen("RunInstances");
    assert_eq!(run.len(), 5, "HTTP 500 by code: no SDK retry: {run:?}");
    for r in &run[..4] {
        assert_eq!(r.faulted.as_deref(), Some("InsufficientInstanceCapacity"));
        assert_eq!(r.instance_type.as_deref(), Some("p4d.24xlarge"));
    }
    assert!(env
        .labels()
        .iter()
        .any(|l| l.contains("compensating") && l.contains("InsufficientInstanceCapacity")));
    env.assert_nothing_unknown(&end, &["us-east-1", "us-west-2"])
        .await;
    let done = env
        .teardown(vm.location.clone(), vec![vm.instance_id.clone()])
        .await;
    assert_eq!(done, TeardownState::Done);
}

#[tokio::test]
async fn vcpu_limit_blocks_the_whole_region() {
    if skip() {
        return;
    }
    let env = Env::start("A100", 8, &["us-east-1", "us-west-2"]).await;
    env.proxy.fault(Fault {
        region: Some("us-east-1"),
        message: "You have requested more vCPU capacity than your current vCPU limit of 0 \
                  allows for the instance bucket that the specified instance type belongs to.",
        ..fault("RunInstances", 400, "VcpuLimitExceeded")
    });
    let end = env.launch().await.expect("launch runs");
    let vm = ready_or_panic(&end);
    assert_eq!(vm.offer.id, "aws/us-west-2/p4d.24xlarge/us-west-2a");
    let run = env.proxy.seen("RunInstances");
    let where_: Vec<(String, Option<String>)> = run
        .iter()
        .map(|s| (s.region.clone(), s.instance_type.clone()))
        .collect();
    assert_eq!(
        where_,
        [
            ("us-east-1".to_string(), Some("p4d.24xlarge".to_string())),
            ("us-west-2".to_string(), Some("p4d.24xlarge".to_string())),
        ],
        "neither another zone nor p4de in us-east-1 (same region) was tried"
    );
    env.assert_nothing_unknown(&end, &["us-east-1", "us-west-2"])
        .await;
    let done = env
        .teardown(vm.location.clone(), vec![vm.instance_id.clone()])
        .await;
    assert_eq!(done, TeardownState::Done);
}

#[tokio::test]
async fn invalid_parameter_aborts_without_walking_other_regions() {
    if skip() {
        return;
    }
    let env = Env::start("H100", 8, &["us-east-1", "us-west-2"]).await;
    env.proxy.fault(Fault {
        message: "Value (gpuprov-missing-profile) for parameter iamInstanceProfile.name is \
                  invalid. Invalid IAM Instance Profile name",
        ..fault("RunInstances", 400, "InvalidParameterValue")
    });
    let end = env.launch().await.expect("launch runs");
    match &end {
        LaunchState::Aborted { reason, owned } => {
            assert!(reason.contains("InvalidParameterValue"), "{reason}");
            assert!(owned.is_none());
        }
        other => panic!("expected Aborted, got {other:?}"),
    }
    assert_eq!(env.proxy.seen("RunInstances").len(), 1);
    assert_eq!(
        env.proxy.regions_seen(),
        ["us-east-1"],
        "us-west-2 was never called"
    );
    env.assert_nothing_unknown(&end, &["us-east-1", "us-west-2"])
        .await;
}

#[tokio::test]
async fn closed_ssh_port_compensates_and_leaves_nothing_tagged() {
    if skip() {
        return;
    }
    let env = Env::start("H100", 8, &["us-east-1"]).await;
    let dir = tempfile::tempdir().unwrap();
    let key = gpuprov::ssh::keys::ensure_project_key(dir.path(), "gpuprov-test").unwrap();
    let real = gpuprov::ssh::client::Ssh2Connector::new(key, Duration::from_millis(500));
    let end = env
        .launch_with(Arc::new(LoopbackOnly(real)))
        .await
        .expect("launch runs");
    // The only offer failed to connect: compensated, blocked, exhausted.
    assert!(
        matches!(end, LaunchState::Exhausted { .. }),
        "expected Exhausted, got {end:?}"
    );
    assert!(
        env.labels()
            .iter()
            .any(|l| l.starts_with("connecting ssh ubuntu@127.0.0.")),
        "{:?}",
        env.labels()
    );
    assert!(env
        .labels()
        .iter()
        .any(|l| l.contains("compensating") && l.contains("ssh not reachable")));
    env.assert_nothing_unknown(&end, &["us-east-1"]).await;
}

// ---------------------------------------------------------------------------------------
// Classification through the SDK: every row, with EC2's real XML error body.

fn offer(region: &str, instance_type: &str) -> Offer {
    Offer {
        id: format!("aws/{region}/{instance_type}"),
        location: Location {
            cloud: "aws".into(),
            region: region.into(),
            zone: None,
        },
        instance_type: instance_type.into(),
        gpu: Some("H100".into()),
        gpu_count: 8,
        spot: false,
        price_per_hour: 55.04,
        detail: serde_json::Value::Null,
        facts: Default::default(),
    }
}

fn spec() -> InstanceSpec {
    InstanceSpec {
        vm_name: VM.into(),
        lineage: LINEAGE.parse().unwrap(),
        client_token: "gpuprov-5f0c2a7e-trainer-r0-o0".into(),
        image: None,
        disk_gb: None,
        ports: vec![],
        ssh_public_key: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGpuprov test".into(),
        boot_script: None,
        shared: Default::default(),
    }
}

#[tokio::test]
async fn every_table_row_is_classified_from_the_real_error_body() {
    // No moto needed: the proxy answers every call with the injected error.
    let proxy = Proxy::start(None).await;
    let aws = AwsProvider::new(settings(proxy.url()));
    let o = offer("us-east-1", "p5.48xlarge");
    let prepared = serde_json::json!({
        "image": "ami-12345678",
        "subnets": [{"id": "subnet-1", "zone": "us-east-1a"}],
        "security_group": "sg-1",
        "vpc": "vpc-1",
    });
    let region = BlockScope::Region {
        cloud: "aws".into(),
        region: "us-east-1".into(),
    };
    let type_in_region = BlockScope::InstanceTypeInRegion {
        cloud: "aws".into(),
        region: "us-east-1".into(),
        instance_type: "p5.48xlarge".into(),
    };
    let offer_scope = BlockScope::Offer { id: o.id.clone() };
    // An account refusal leaves the whole cloud out (issue 35): other clouds may still
    // take the machine.
    let cloud = BlockScope::Cloud {
        cloud: "aws".into(),
    };
    use ErrorKind::*;
    let rows: Vec<(&'static str, u16, ErrorKind, Option<BlockScope>)> = vec![
        (
            "InsufficientInstanceCapacity",
            500,
            Capacity,
            Some(offer_scope.clone()),
        ),
        ("InstanceLimitExceeded", 400, Quota, Some(region.clone())),
        ("VcpuLimitExceeded", 400, Quota, Some(region.clone())),
        (
            "MaxSpotInstanceCountExceeded",
            400,
            Quota,
            Some(region.clone()),
        ),
        (
            "Unsupported",
            400,
            Unavailable,
            Some(type_in_region.clone()),
        ),
        (
            "UnauthorizedOperation",
            403,
            Credentials,
            Some(cloud.clone()),
        ),
        ("AuthFailure", 401, Credentials, Some(cloud.clone())),
        (
            "InvalidClientTokenId",
            401,
            Credentials,
            Some(cloud.clone()),
        ),
        ("ExpiredToken", 400, Credentials, Some(cloud.clone())),
        ("RequestLimitExceeded", 503, Transient, None),
        ("Throttling", 400, Transient, None),
        ("ServiceUnavailable", 503, Transient, None),
        ("InternalError", 500, Transient, None),
        ("Unavailable", 503, Transient, None),
        ("InvalidParameterCombination", 400, InvalidRequest, None),
        ("InvalidParameterValue", 400, InvalidRequest, None),
        ("InvalidAMIID.NotFound", 400, InvalidRequest, None),
        ("InvalidAMIID.Malformed", 400, InvalidRequest, None),
    ];
    for (i, (code, status, kind, scope)) in rows.into_iter().enumerate() {
        proxy.fault(fault("RunInstances", status, code));
        let e = aws
            .create(&o, &prepared, &spec())
            .await
            .expect_err("the proxy answers with an error");
        assert_eq!(e.kind, kind, "{code}: {e:?}");
        assert_eq!(e.scope_for(&o), scope, "{code}");
        assert!(
            e.msg.contains(code),
            "{code}: message names the code: {}",
            e.msg
        );
        assert_eq!(
            proxy.seen("RunInstances").len(),
            i + 1,
            "{code}: exactly one RunInstances (SDK retries are off for create)"
        );
    }

    // Reads: not-found on terminate and delete-group is success; DependencyViolation
    // on the security group is InUse (something still uses it: observe again).
    let at = o.location.clone();
    proxy.fault(fault(
        "TerminateInstances",
        400,
        "InvalidInstanceID.NotFound",
    ));
    aws.delete(&at, VM, &["i-0123456789abcdef0".into()])
        .await
        .expect("unknown instance is success");
    let groups = Fault {
        body: Some(
            "<DescribeSecurityGroupsResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\">\
             <requestId>r</requestId><securityGroupInfo><item><ownerId>123456789012</ownerId>\
             <groupId>sg-0123456789abcdef0</groupId><groupName>gpuprov-trainer-5f0c2a7e</groupName>\
             <groupDescription>d</groupDescription></item></securityGroupInfo>\
             </DescribeSecurityGroupsResponse>",
        ),
        times: 2,
        ..fault("DescribeSecurityGroups", 200, "")
    };
    proxy.fault(groups);
    proxy.fault(Fault {
        message: "resource sg-0123456789abcdef0 has a dependent object",
        ..fault("DeleteSecurityGroup", 400, "DependencyViolation")
    });
    let e = aws.cleanup(&at, VM).await.unwrap_err();
    assert_eq!(e.kind, InUse, "{e:?}");
    assert_eq!(
        e.msg,
        "DeleteSecurityGroup: DependencyViolation (HTTP 400): resource sg-0123456789abcdef0 \
         has a dependent object",
        "a short cause: call, code, status, EC2's message"
    );
    proxy.fault(fault("DeleteSecurityGroup", 400, "InvalidGroup.NotFound"));
    aws.cleanup(&at, VM)
        .await
        .expect("a group already gone is success");
    assert_eq!(proxy.seen("DeleteSecurityGroup").len(), 2);
}

// ---------------------------------------------------------------------------------------
// The CLI: plan is offline

/// `gpuprov plan --refresh=false` on `examples/aws.toml` needs no credentials and no
/// network: the AWS catalog is static. Run with an empty HOME, no AWS variables and
/// instance metadata disabled, so nothing could be found or dialled if it tried.
#[test]
fn plan_of_the_aws_example_is_offline_and_priced() {
    let dir = tempfile::tempdir().unwrap();
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/aws.toml");
    let config = dir.path().join("gpuprov.toml");
    std::fs::copy(&example, &config).unwrap();
    let mut cmd = assert_cmd::Command::cargo_bin("gpuprov").unwrap();
    for (k, _) in std::env::vars() {
        if k.starts_with("AWS_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .env("HOME", dir.path())
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_ENDPOINT_URL", "http://user:secret@127.0.0.1:9")
        .args(["plan", "--refresh=false", "-c"])
        .arg(&config)
        .timeout(Duration::from_secs(30))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("Plan: 2 to add"), "{stdout}");
    // Cheapest matching offers: p5.48xlarge (H100 × 8) + p4d.24xlarge (A100 × 8).
    assert!(stdout.contains("$77.00/h"), "{stdout}");
    assert!(
        stdout.contains("aws API endpoint overridden: http://REDACTED@127.0.0.1:9"),
        "{stdout}"
    );
    assert!(!stdout.contains("secret") && !stderr.contains("secret"));
}

/// `gpuprov apply` against moto: the machine comes up in moto, its (rewritten, loopback)
/// SSH port is closed, so Connecting times out and compensates; the apply fails, the
/// state owns nothing and a sweep of moto by the identity tag finds nothing.
#[tokio::test]
async fn cli_apply_against_moto_with_a_closed_ssh_port_leaves_nothing() {
    if skip() {
        return;
    }
    let env = Env::start("H100", 8, &["us-east-1"]).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gpuprov.toml");
    std::fs::write(
        &config,
        "[defaults]\nclouds = [\"aws\"]\nkubernetes = false\n\n[vm.trainer]\ngpu = \"H100\"\n\
         gpu_count = 8\nregions = [\"us-east-1\"]\nzones = [\"us-east-1a\"]\n",
    )
    .unwrap();
    let run = |args: Vec<&'static str>| {
        let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("gpuprov"));
        for (k, _) in std::env::vars() {
            if k.starts_with("AWS_") || k.starts_with("GPUPROV_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("HOME", dir.path())
            .env("GPUPROV_HOME", dir.path().join("home"))
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("AWS_ENDPOINT_URL", env.proxy.url())
            .env("GPUPROV_AWS_SSH_TIMEOUT", "2s")
            .env("GPUPROV_AWS_BOOT_TIMEOUT", "30s")
            .env("GPUPROV_AWS_POLL_INTERVAL", "200ms")
            .args(args)
            .arg("-c")
            .arg(&config)
            .stdin(Stdio::null());
        async move {
            tokio::time::timeout(
                Duration::from_secs(120),
                tokio::task::spawn_blocking(move || cmd.output().unwrap()),
            )
            .await
            .expect("gpuprov must not hang")
            .unwrap()
        }
    };
    let out = run(vec!["apply", "--auto-approve"]).await;
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "apply must fail: {text}");
    assert!(text.contains("ssh not reachable"), "{text}");
    // `zones` restricts the offers to us-east-1a: one attempt.
    assert_eq!(env.proxy.seen("RunInstances").len(), 1, "{text}");
    assert_eq!(
        env.sweep("us-east-1").await,
        (vec![], vec![]),
        "nothing left tagged in moto: {text}"
    );
    env.proxy.assert_only_loopback_handed_out();
    let state = std::fs::read_to_string(dir.path().join("gpuprov.state.json")).unwrap();
    let state: serde_json::Value = serde_json::from_str(&state).unwrap();
    let end = &state["resources"]["vm.trainer"]["machine"]["state"];
    assert_eq!(end["state"], "exhausted", "{end}");
    let end: LaunchState = serde_json::from_value(end.clone()).unwrap();
    assert!(end.owned().is_none(), "the state owns nothing: {end:?}");

    let out = run(vec!["destroy", "--auto-approve"]).await;
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---------------------------------------------------------------------------------------
// A real login on the rewritten loopback address

/// A throwaway OpenSSH server listening on 127.0.0.2-127.0.0.9 (the addresses the proxy
/// hands out) on one free port; killed on drop.
struct Sshd {
    child: Child,
    port: u16,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_sshd(work: &std::path::Path, authorized: &str) -> Sshd {
    let sshd = "/usr/sbin/sshd";
    assert!(
        std::path::Path::new(sshd).exists(),
        "{sshd} not found: install openssh-server (CI installs it)"
    );
    std::fs::create_dir_all("/run/sshd").expect("create /run/sshd (tests run as root)");
    let host = gpuprov::ssh::ensure_project_key(&work.join("host"), "host").unwrap();
    let keys = work.join("authorized_keys");
    std::fs::write(&keys, format!("{authorized}\n")).unwrap();
    let port = free_port();
    let listen: String = (2..10)
        .map(|i| format!("ListenAddress 127.0.0.{i}\n"))
        .collect();
    let config = work.join("sshd_config");
    std::fs::write(
        &config,
        format!(
            "Port {port}\n{listen}HostKey \"{}\"\nAuthorizedKeysFile \"{}\"\nPidFile \"{}\"\n\
             StrictModes no\nPermitRootLogin prohibit-password\nPubkeyAuthentication yes\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n",
            host.private_key_path().unwrap().display(),
            keys.display(),
            work.join("sshd.pid").display()
        ),
    )
    .unwrap();
    let child = Command::new(sshd)
        .args(["-D", "-e", "-f"])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start sshd");
    let mut s = Sshd { child, port };
    let deadline = Instant::now() + Duration::from_secs(15);
    while std::net::TcpStream::connect(("127.0.0.2", port)).is_err() {
        if let Ok(Some(st)) = s.child.try_wait() {
            panic!("sshd exited early: {st}");
        }
        assert!(Instant::now() < deadline, "sshd did not listen in time");
        std::thread::sleep(Duration::from_millis(50));
    }
    s
}

/// Logs in on the endpoint's own (rewritten, loopback) host, at the test sshd's port and
/// as the local user: binding port 22 and creating the image's `ubuntu` user are the
/// only things the test does not reproduce.
struct ToTestSshd<C> {
    inner: C,
    port: u16,
    user: String,
}

#[async_trait]
impl<C: Connector> Connector for ToTestSshd<C> {
    async fn login(
        &self,
        endpoint: &SshEndpoint,
        user: &str,
        pinned: Option<&HostKey>,
    ) -> Result<HostKey, SshError> {
        assert_eq!(endpoint.port, 22);
        assert_eq!(user, "ubuntu");
        let local = SshEndpoint {
            host: endpoint.host.clone(),
            port: self.port,
            user: Some(self.user.clone()),
        };
        self.inner.login(&local, &self.user, pinned).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_ssh_login_on_the_rewritten_address() {
    if skip() {
        return;
    }
    let env = Env::start("H100", 8, &["us-east-1"]).await;
    let dir = tempfile::tempdir().unwrap();
    let key = gpuprov::ssh::ensure_project_key(&dir.path().join("project"), "t").unwrap();
    let sshd = start_sshd(dir.path(), &key.public_key_openssh);
    let me = String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout)
        .unwrap()
        .trim()
        .to_string();
    let connector = ToTestSshd {
        inner: gpuprov::ssh::Ssh2Connector::new(key, Duration::from_secs(2)),
        port: sshd.port,
        user: me,
    };
    let end = env
        .launch_with(Arc::new(LoopbackOnly(connector)))
        .await
        .expect("launch runs");
    let vm = ready_or_panic(&end);
    assert!(vm.ssh.host.starts_with("127.0.0."), "{}", vm.ssh);
    assert_eq!(
        vm.host_key.algorithm, "ssh-ed25519",
        "a real host key was pinned"
    );
    let done = env
        .teardown(vm.location.clone(), vec![vm.instance_id.clone()])
        .await;
    assert_eq!(done, TeardownState::Done);
    assert_eq!(env.sweep("us-east-1").await, (vec![], vec![]));
}

// ---------------------------------------------------------------------------------------
// What create sends, and prepare's Unavailable

#[tokio::test]
async fn create_sends_token_tags_user_data_and_spot_options() {
    if skip() {
        return;
    }
    let mut env = Env::start("L4", 1, &["us-west-2"]).await;
    env.vm.spot = true;
    env.vm.disk_gb = Some(200);
    env.vm.ports = vec![8888];
    let end = env.launch().await.expect("launch runs");
    let vm = ready_or_panic(&end);
    assert_eq!(vm.offer.id, "aws/us-west-2/g6.xlarge/us-west-2a");
    let run = env.proxy.seen("RunInstances");
    assert_eq!(run.len(), 1);
    let body = &run[0].body;
    // gpuprov-<lineage8>-<vm>-<nonce: 8 hex>-r<round>-o<cursor>
    let token = form_value(body, "ClientToken").expect("a ClientToken");
    let nonce = token
        .strip_prefix("gpuprov-5f0c2a7e-trainer-")
        .and_then(|t| t.strip_suffix("-r0-o0"))
        .unwrap_or_else(|| panic!("token shape: {token}"));
    assert!(
        nonce.len() == 8 && nonce.chars().all(|c| c.is_ascii_hexdigit()),
        "the planning's nonce: {token}"
    );
    assert!(token.len() <= 64, "fits EC2's limit: {token}");
    let has = |k: &str, v: &str| {
        body.split('&').any(|kv| {
            kv.split_once('=')
                .is_some_and(|(a, b)| a.ends_with(k) && b == v)
        })
    };
    assert!(has("InstanceMarketOptions.MarketType", "spot"), "{body}");
    assert!(has("Ebs.VolumeSize", "200"), "{body}");
    assert!(has("MinCount", "1") && has("MaxCount", "1"), "{body}");
    for rt in ["instance", "volume"] {
        assert!(has("ResourceType", rt), "{rt}: {body}");
    }
    assert!(has("Value", "trainer") && has("Value", LINEAGE), "{body}");
    let user_data = body
        .split('&')
        .find_map(|kv| kv.strip_prefix("UserData="))
        .expect("user data sent");
    let user_data = user_data
        .replace("%2B", "+")
        .replace("%2F", "/")
        .replace("%3D", "=");
    let decoded = String::from_utf8(
        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, user_data).unwrap(),
    )
    .unwrap();
    assert!(decoded.starts_with("#cloud-config\n"), "{decoded}");
    assert!(decoded.contains("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGpuprovTestKeyOnly"));
    // The security group opened 22 and the extra port.
    let (_, groups) = env.sweep("us-west-2").await;
    let g = env
        .direct("us-west-2")
        .describe_security_groups()
        .group_ids(&groups[0])
        .send()
        .await
        .unwrap();
    let ports: Vec<i32> = g.security_groups()[0]
        .ip_permissions()
        .iter()
        .filter_map(|p| p.from_port())
        .collect();
    assert!(ports.contains(&22) && ports.contains(&8888), "{ports:?}");
    let done = env
        .teardown(vm.location.clone(), vec![vm.instance_id.clone()])
        .await;
    assert_eq!(done, TeardownState::Done);
}

#[tokio::test]
async fn a_type_no_zone_offers_is_unavailable_for_the_region() {
    if skip() {
        return;
    }
    let env = Env::start("H100", 8, &["us-east-1"]).await;
    let o = offer("us-east-1", "p5.48xlarge");
    let mut only_zone = o.clone();
    only_zone.detail = serde_json::json!({ "zones": ["us-east-1-nowhere"] });
    let e = env.aws.prepare(&only_zone, &spec()).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unavailable, "{e:?}");
    assert_eq!(
        e.scope_for(&o),
        Some(BlockScope::InstanceTypeInRegion {
            cloud: "aws".into(),
            region: "us-east-1".into(),
            instance_type: "p5.48xlarge".into(),
        })
    );
    // Nothing was created for an offer that cannot run.
    assert_eq!(env.sweep("us-east-1").await, (vec![], vec![]));
    let mut unknown = o.clone();
    unknown.instance_type = "p99.huge".into();
    let e = env.aws.prepare(&unknown, &spec()).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unavailable, "{e:?}");
}

#[tokio::test]
async fn a_zone_that_does_not_offer_the_type_blocks_only_its_offer() {
    if skip() {
        return;
    }
    // moto (like EC2) offers p4de.24xlarge in us-east-1b and us-east-1c only.
    let env = Env::start("A100", 8, &["us-east-1"]).await;
    let mut o = offer("us-east-1", "p4de.24xlarge");
    o.location.zone = Some("us-east-1a".into());
    o.id = format!("{}/us-east-1a", o.id);
    let e = env.aws.prepare(&o, &spec()).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unavailable, "{e:?}");
    assert_eq!(
        e.scope_for(&o),
        Some(BlockScope::Offer { id: o.id.clone() })
    );
    assert!(e.msg.contains("us-east-1b, us-east-1c"), "{}", e.msg);
    assert_eq!(env.sweep("us-east-1").await, (vec![], vec![]));
}

// ---------------------------------------------------------------------------------------
// Issue 12: zones, eventual consistency, start, actionable errors, remembered tokens

/// The subnet id → zone map of moto's default VPC in `region`.
async fn subnet_zones(env: &Env, region: &str) -> HashMap<String, String> {
    env.direct(region)
        .describe_subnets()
        .send()
        .await
        .expect("DescribeSubnets")
        .subnets()
        .iter()
        .filter_map(|s| {
            Some((
                s.subnet_id()?.to_string(),
                s.availability_zone()?.to_string(),
            ))
        })
        .collect()
}

/// Capacity is per (type, zone): after `InsufficientInstanceCapacity` in us-west-2a the
/// next attempt is the same (cheaper) type in us-west-2b, with its own ClientToken, and
/// EC2's message naming the zones with capacity is kept in the journal.
#[tokio::test]
async fn capacity_in_one_zone_tries_the_next_zone_before_a_pricier_type() {
    if skip() {
        return;
    }
    let env = Env::start("A100", 8, &["us-west-2"]).await;
    env.proxy.fault(Fault {
        instance_type: Some("p4d.24xlarge"),
        region: Some("us-west-2"),
        message: "We currently do not have sufficient p4d.24xlarge capacity in the \
                  Availability Zone you requested (us-west-2a). Our system will be working on \
                  provisioning additional capacity. You can currently get p4d.24xlarge \
                  capacity by not specifying an Availability Zone in your request or \
                  choosing us-west-2b, us-west-2c.",
        ..fault("RunInstances", 500, "InsufficientInstanceCapacity")
    });
    let end = env.launch().await.expect("launch runs");
    let vm = ready_or_panic(&end);
    assert_eq!(vm.offer.id, "aws/us-west-2/p4d.24xlarge/us-west-2b");
    let run = env.proxy.seen("RunInstances");
    assert_eq!(run.len(), 2, "{run:?}");
    assert!(run
        .iter()
        .all(|r| r.instance_type.as_deref() == Some("p4d.24xlarge")));
    let zones = subnet_zones(&env, "us-west-2").await;
    let zone_of = |r: &Seen| {
        let subnet = form_value(&r.body, "SubnetId").expect("one subnet per attempt");
        zones.get(&subnet).cloned().unwrap_or_default()
    };
    assert_eq!(zone_of(&run[0]), "us-west-2a");
    assert_eq!(zone_of(&run[1]), "us-west-2b");
    let token = |r: &Seen| form_value(&r.body, "ClientToken").unwrap();
    assert_ne!(
        token(&run[0]),
        token(&run[1]),
        "each zone attempt its own token"
    );
    // The instance really is in us-west-2b.
    let d = env
        .direct("us-west-2")
        .describe_instances()
        .instance_ids(&vm.instance_id)
        .send()
        .await
        .unwrap();
    let placed = d.reservations()[0].instances()[0]
        .placement()
        .and_then(|p| p.availability_zone())
        .map(str::to_string);
    assert_eq!(placed.as_deref(), Some("us-west-2b"));
    assert!(
        env.labels()
            .iter()
            .any(|l| l.contains("InsufficientInstanceCapacity")
                && l.contains("choosing us-west-2b, us-west-2c")),
        "the capacity message is kept: {:?}",
        env.labels()
    );
    // One security group per (machine, region): never a second one alongside.
    let creates = env.proxy.seen("CreateSecurityGroup").len();
    let deletes = env.proxy.seen("DeleteSecurityGroup").len();
    assert_eq!(
        creates,
        1 + deletes,
        "a group is only recreated after its deletion"
    );
    let (ids, groups) = env.sweep("us-west-2").await;
    assert_eq!((ids.len(), groups.len()), (1, 1));
    // Observe at the zone location sees the instance; delete/cleanup there work
    // region-wide.
    let seen = env.aws.observe(&vm.location, VM).await.unwrap();
    assert_eq!(seen.len(), 1);
    let mut other_zone = vm.location.clone();
    other_zone.zone = Some("us-west-2c".into());
    assert_eq!(env.aws.observe(&other_zone, VM).await.unwrap().len(), 1);
    let done = env
        .teardown(vm.location.clone(), vec![vm.instance_id.clone()])
        .await;
    assert_eq!(done, TeardownState::Done);
    assert_eq!(env.sweep("us-west-2").await, (vec![], vec![]));
}

/// prepare for a second zone of the same region finds and reuses the group the first
/// zone's prepare created (the core keeps it across a zone-to-zone failover).
#[tokio::test]
async fn prepare_in_another_zone_reuses_the_security_group() {
    if skip() {
        return;
    }
    let env = Env::start("H100", 8, &["us-west-2"]).await;
    let zoned = |z: &str| {
        let mut o = offer("us-west-2", "p5.48xlarge");
        o.location.zone = Some(z.into());
        o.id = format!("{}/{z}", o.id);
        o
    };
    let a = env
        .aws
        .prepare(&zoned("us-west-2a"), &spec())
        .await
        .unwrap();
    let b = env
        .aws
        .prepare(&zoned("us-west-2b"), &spec())
        .await
        .unwrap();
    assert_eq!(a["security_group"], b["security_group"]);
    assert_eq!(env.proxy.seen("CreateSecurityGroup").len(), 1);
    let zones = subnet_zones(&env, "us-west-2").await;
    for (p, z) in [(&a, "us-west-2a"), (&b, "us-west-2b")] {
        let subnets = p["subnets"].as_array().unwrap();
        assert_eq!(subnets.len(), 1, "only the offer's zone: {p}");
        assert_eq!(subnets[0]["zone"], z);
        assert_eq!(zones[subnets[0]["id"].as_str().unwrap()], z);
    }
    let at = zoned("us-west-2a").location;
    env.aws.cleanup(&at, VM).await.unwrap();
    assert_eq!(env.sweep("us-west-2").await, (vec![], vec![]));
}

/// A group created a moment ago that the next calls do not see yet
/// (`InvalidGroup.NotFound` on AuthorizeSecurityGroupIngress, then on RunInstances) is
/// lag: retried in place, the first offer comes up, nothing is compensated.
#[tokio::test]
async fn a_security_group_not_visible_yet_is_retried_not_failed_over() {
    if skip() {
        return;
    }
    let env = Env::start_with("H100", 8, &["us-east-1"], |s| {
        s.capabilities.create_list_lag = Duration::from_millis(300);
    })
    .await;
    env.proxy.fault(Fault {
        message: "The security group 'sg-0123' does not exist",
        times: 2,
        ..fault(
            "AuthorizeSecurityGroupIngress",
            400,
            "InvalidGroup.NotFound",
        )
    });
    env.proxy.fault(Fault {
        message: "The security group 'sg-0123' does not exist in VPC 'vpc-1'",
        ..fault("RunInstances", 400, "InvalidGroup.NotFound")
    });
    let end = env.launch().await.expect("launch runs");
    let vm = ready_or_panic(&end);
    assert_eq!(vm.offer.id, "aws/us-east-1/p5.48xlarge/us-east-1a");
    assert!(
        !env.labels().iter().any(|l| l.contains("compensating")),
        "{:?}",
        env.labels()
    );
    assert_eq!(env.proxy.seen("AuthorizeSecurityGroupIngress").len(), 3);
    assert_eq!(env.proxy.seen("RunInstances").len(), 2);
    let (ids, groups) = env.sweep("us-east-1").await;
    assert_eq!((ids.len(), groups.len()), (1, 1));
    let done = env
        .teardown(vm.location.clone(), vec![vm.instance_id.clone()])
        .await;
    assert_eq!(done, TeardownState::Done);
}

/// `start`: a stopped instance (observed `Stopped`) is started with one StartInstances
/// and observed `Pending`/`Running` after; starting a running one sends nothing; the
/// cloud's capacity and quota refusals keep their kinds.
#[tokio::test]
async fn start_restarts_a_stopped_instance() {
    if skip() {
        return;
    }
    let env = Env::start("H100", 8, &["us-east-1"]).await;
    assert!(env
        .aws
        .capabilities()
        .supported
        .contains(&gpuprov::provider::Feature::Start));
    let end = env.launch().await.expect("launch runs");
    let vm = ready_or_panic(&end).clone();
    let at = vm.location.clone();
    let stop = || async {
        env.direct("us-east-1")
            .stop_instances()
            .instance_ids(&vm.instance_id)
            .send()
            .await
            .expect("StopInstances");
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut statuses = Vec::new();
        loop {
            let seen = env.aws.observe(&at, VM).await.unwrap();
            assert_eq!(seen.len(), 1, "a stopped instance is still listed");
            statuses.push(seen[0].status.clone());
            if seen[0].status == gpuprov::provider::InstanceStatus::Stopped {
                assert!(seen[0].ssh.is_none());
                return statuses;
            }
            assert!(Instant::now() < deadline, "never stopped: {statuses:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let statuses = stop().await;
    assert!(statuses.iter().all(|s| matches!(
        s,
        gpuprov::provider::InstanceStatus::Stopping | gpuprov::provider::InstanceStatus::Stopped
    )));

    env.aws
        .start(&at, VM, &vm.instance_id)
        .await
        .expect("start");
    assert_eq!(env.proxy.seen("StartInstances").len(), 1);
    let seen = env.aws.observe(&at, VM).await.unwrap();
    assert!(
        matches!(
            seen[0].status,
            gpuprov::provider::InstanceStatus::Pending | gpuprov::provider::InstanceStatus::Running
        ),
        "{seen:?}"
    );
    // Already running (or pending): success, nothing sent.
    env.aws.start(&at, VM, &vm.instance_id).await.unwrap();
    assert_eq!(env.proxy.seen("StartInstances").len(), 1);

    // The cloud cannot start it now: Capacity / Quota, by the table.
    stop().await;
    env.proxy.fault(Fault {
        message: "Insufficient capacity.",
        ..fault("StartInstances", 500, "InsufficientInstanceCapacity")
    });
    let e = env.aws.start(&at, VM, &vm.instance_id).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Capacity, "{e:?}");
    assert_eq!(
        env.proxy.seen("StartInstances").len(),
        2,
        "HTTP 500 by code: no SDK retry, the core decides"
    );
    env.proxy
        .fault(fault("StartInstances", 400, "VcpuLimitExceeded"));
    let e = env.aws.start(&at, VM, &vm.instance_id).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Quota, "{e:?}");
    // A terminated instance cannot be started.
    env.aws
        .delete(&at, VM, std::slice::from_ref(&vm.instance_id))
        .await
        .unwrap();
    let e = env.aws.start(&at, VM, &vm.instance_id).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Failed, "{e:?}");
    let done = env
        .teardown(vm.location.clone(), vec![vm.instance_id.clone()])
        .await;
    assert_eq!(done, TeardownState::Done);
}

/// An endpoint that refuses connections is `Unreachable` (the core blocks the cloud),
/// quickly, with a one-line cause naming the endpoint; a launch over two regions ends
/// after one attempt instead of one retry budget per region.
#[tokio::test]
async fn a_refused_endpoint_is_unreachable_at_once() {
    let closed = free_port();
    let url = format!("http://127.0.0.1:{closed}");
    let aws = AwsProvider::new(settings(url.clone()));
    let o = offer("us-east-1", "p5.48xlarge");
    let started = Instant::now();
    let e = aws.prepare(&o, &spec()).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unreachable, "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        e.scope_for(&o),
        Some(BlockScope::Cloud {
            cloud: "aws".into()
        })
    );
    assert!(
        e.msg.contains("refused") && e.msg.contains(&url),
        "{}",
        e.msg
    );
    assert!(
        !e.msg.contains('\n') && e.msg.len() < 300,
        "short: {}",
        e.msg
    );
    assert!(!e.msg.contains("DispatchFailure"), "no Debug: {}", e.msg);

    // The whole launch machine, over two regions.
    let mut vm = VmSpec::new(VM, vec![Cloud::Aws]);
    vm.gpu = Some("H100".into());
    vm.gpu_count = 8;
    vm.regions = vec!["us-east-1".into(), "us-west-2".into()];
    vm.kubernetes = false;
    let mut providers = Providers::new();
    providers.insert(Arc::new(AwsProvider::new(settings(url))));
    let mut m = LaunchMachine::new(
        vm,
        LINEAGE.into(),
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGpuprovTestKeyOnly gpuprov-test".into(),
        providers,
        Arc::new(LoopbackOnly(FakeConnector::default())),
    );
    m.retry = FAST;
    m.teardown.retry = FAST;
    m.exhausted_wait = Duration::from_millis(5);
    let journal = Arc::new(MemoryJournal::new());
    let ex = Executor::new(journal.clone(), CancelToken::new());
    let started = Instant::now();
    let end = tokio::time::timeout(
        Duration::from_secs(60),
        ex.run(&m, "vm.trainer", |_| LaunchState::start(None)),
    )
    .await
    .expect("no hang")
    .expect("runs");
    assert!(matches!(end, LaunchState::Exhausted { .. }), "{end:?}");
    let preparing = journal
        .history()
        .into_iter()
        .filter(|(_, l)| l.starts_with("preparing"))
        .count();
    assert_eq!(
        preparing,
        1,
        "one attempt blocks the cloud: {:?}",
        journal.history()
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

/// An answer that is not EC2's XML (a proxy's HTML error page) becomes one line: the
/// status, the content type and the page's first readable line.
#[tokio::test]
async fn a_non_ec2_answer_is_a_short_cause() {
    let proxy = Proxy::start(None).await;
    let aws = AwsProvider::new(settings(proxy.url()));
    proxy.fault(Fault {
        body: Some(
            "<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n<body>\
             <h1>502 Bad Gateway</h1><p>nginx</p></body></html>",
        ),
        content_type: Some("text/html; charset=utf-8"),
        times: 10,
        ..fault("DescribeInstances", 502, "")
    });
    let at = offer("us-east-1", "p5.48xlarge").location;
    let e = aws.observe(&at, VM).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient, "{e:?}");
    assert!(
        e.msg
            .starts_with("DescribeInstances: HTTP 502 (text/html): 502 Bad Gateway"),
        "{}",
        e.msg
    );
    assert!(!e.msg.contains('<') && !e.msg.contains('\n'), "{}", e.msg);
}

/// `AWS_PROFILE` naming a profile neither shared file defines: a `Credentials` error
/// naming the profile and both files, before any request.
#[tokio::test]
async fn a_missing_profile_is_named() {
    let proxy = Proxy::start(None).await;
    let mut s = settings(proxy.url());
    s.credentials = None;
    s.profile = Some("gpuprov-test-no-such-profile".into());
    let aws = AwsProvider::new(s);
    let e = aws
        .prepare(&offer("us-east-1", "p5.48xlarge"), &spec())
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Credentials, "{e:?}");
    assert!(
        e.msg.contains("`gpuprov-test-no-such-profile`"),
        "{}",
        e.msg
    );
    let (config, credentials) = gpuprov::provider::clouds::aws::shared_files();
    assert!(
        e.msg.contains(&config.display().to_string())
            && e.msg.contains(&credentials.display().to_string()),
        "{}",
        e.msg
    );
    assert!(proxy.state.lock().unwrap().seen.is_empty(), "nothing sent");
}

/// Terminates `id` straight at moto (outside gpuprov) and waits until moto lists it
/// terminated.
async fn terminate_outside(env: &Env, region: &str, id: &str) {
    let c = env.direct(region);
    c.terminate_instances()
        .instance_ids(id)
        .send()
        .await
        .expect("TerminateInstances");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let d = c
            .describe_instances()
            .instance_ids(id)
            .send()
            .await
            .unwrap();
        let state = d
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .find_map(|i| i.state().and_then(|s| s.name()).cloned());
        if state == Some(aws_sdk_ec2::types::InstanceStateName::Terminated) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{id} never terminated: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A machine whose instance was terminated outside gpuprov is replaced by a re-apply:
/// the replacement's ClientToken is new (the planning's nonce), so the proxy, which
/// remembers tokens as EC2 does, forwards it and a new instance comes up at the first
/// offer. (With the pre-nonce token the re-apply gets the dead instance back: see the
/// next test.)
#[tokio::test]
async fn an_instance_terminated_outside_is_replaced_by_a_reapply() {
    if skip() {
        return;
    }
    let env = Env::start("H100", 8, &["us-east-1"]).await;
    let first = env.launch().await.expect("launch runs");
    let old = ready_or_panic(&first).clone();
    terminate_outside(&env, "us-east-1", &old.instance_id).await;

    let again = env.launch().await.expect("re-apply runs");
    let new = ready_or_panic(&again);
    assert_ne!(new.instance_id, old.instance_id, "a new instance");
    assert_eq!(new.offer.id, old.offer.id, "at the first offer again");
    let run = env.proxy.seen("RunInstances");
    assert_eq!(run.len(), 2, "{run:?}");
    assert!(
        run.iter().all(|r| r.replayed.is_none()),
        "no token was re-sent: {run:?}"
    );
    let tokens: Vec<String> = run
        .iter()
        .map(|r| form_value(&r.body, "ClientToken").unwrap())
        .collect();
    assert_ne!(tokens[0], tokens[1]);
    let (ids, _) = env.sweep("us-east-1").await;
    assert_eq!(ids, vec![new.instance_id.clone()]);
    let done = env
        .teardown(new.location.clone(), vec![new.instance_id.clone()])
        .await;
    assert_eq!(done, TeardownState::Done);
}

/// The negative control for the test above: with tokens compared in their pre-nonce
/// shape (`...-r0-o0`, what the engine sent before the nonce), the re-apply's first
/// create gets the dead instance's reservation back, as EC2 answers a reused token, and
/// cannot come up at its first offer.
#[tokio::test]
async fn without_the_nonce_a_reused_token_answers_the_dead_instance() {
    if skip() {
        return;
    }
    let env = Env::start("H100", 8, &["us-east-1"]).await;
    env.proxy.state.lock().unwrap().legacy_tokens = true;
    assert_eq!(
        without_nonce("gpuprov-5f0c2a7e-trainer-0a1b2c3d-r0-o0"),
        "gpuprov-5f0c2a7e-trainer-r0-o0"
    );
    let first = env.launch().await.expect("launch runs");
    let old = ready_or_panic(&first).clone();
    terminate_outside(&env, "us-east-1", &old.instance_id).await;

    let again = env.launch().await.expect("re-apply runs");
    let run = env.proxy.seen("RunInstances");
    assert_eq!(
        run[1].replayed.as_deref(),
        Some(old.instance_id.as_str()),
        "the re-sent token got the dead instance: {run:?}"
    );
    if let Some(vm) = again.ready() {
        assert_ne!(vm.offer.id, old.offer.id, "not at the first offer");
    }
    let (ids, _) = env.sweep("us-east-1").await;
    if let Some(o) = again.owned() {
        env.teardown(o.location.clone(), o.instance_ids.clone())
            .await;
    }
    assert!(ids.len() <= 1, "{ids:?}");
}

// ---------------------------------------------------------------------------------------
// Issue 12 on EC2: never destroy what the run did not create; restart before replace

impl Env {
    /// Runs the teardown machine on `target` (a fresh journal), as `destroy` does.
    async fn teardown_target(&self, target: Target) -> TeardownState {
        let mut m = TeardownMachine::new(self.providers());
        m.retry = FAST;
        let ex = Executor::new(Arc::new(MemoryJournal::new()), CancelToken::new());
        tokio::time::timeout(
            Duration::from_secs(60),
            ex.run(&m, "vm.trainer", |_| TeardownState::Requesting { target }),
        )
        .await
        .expect("teardown must not hang")
        .expect("teardown runs")
    }

    /// The first offer the launch will try (the adapter's plan, cheapest first).
    async fn first_offer(&self) -> Offer {
        let offers = self.aws.plan(&self.vm.request()).await.expect("plan");
        offers.into_iter().next().expect("at least one offer")
    }
}

/// Creates an instance straight at moto (not through the proxy, not by gpuprov) carrying
/// this machine's identity tags, of `offer`'s type in a subnet of its zone, as a
/// colleague's run or an older state would have left it. Returns its id.
async fn run_outside(env: &Env, offer: &Offer) -> String {
    use aws_sdk_ec2::types::{InstanceType, ResourceType, Tag, TagSpecification};
    let region = offer.location.region.as_str();
    let zone = offer
        .location
        .zone
        .clone()
        .expect("EC2 offers are per zone");
    let c = env.direct(region);
    let image = c
        .describe_images()
        .owners("amazon")
        .send()
        .await
        .expect("DescribeImages")
        .images()
        .iter()
        .find_map(|i| i.image_id().map(str::to_string))
        .expect("moto has images");
    let subnet = subnet_zones(env, region)
        .await
        .into_iter()
        .find_map(|(s, z)| (z == zone).then_some(s))
        .expect("a default subnet in the zone");
    let out = c
        .run_instances()
        .image_id(image)
        .instance_type(InstanceType::from(offer.instance_type.as_str()))
        .min_count(1)
        .max_count(1)
        .subnet_id(subnet)
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::Instance)
                .tags(Tag::builder().key(IDENTITY_LABEL).value(VM).build())
                .tags(Tag::builder().key(LINEAGE_LABEL).value(LINEAGE).build())
                .build(),
        )
        .send()
        .await
        .expect("RunInstances straight at moto");
    out.instances()[0]
        .instance_id()
        .expect("an instance id")
        .to_string()
}

/// The state moto reports for `id` (straight, not through the proxy).
async fn state_outside(
    env: &Env,
    region: &str,
    id: &str,
) -> Option<aws_sdk_ec2::types::InstanceStateName> {
    env.direct(region)
        .describe_instances()
        .instance_ids(id)
        .send()
        .await
        .expect("DescribeInstances straight at moto")
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .find(|i| i.instance_id() == Some(id))
        .and_then(|i| i.state().and_then(|s| s.name()).cloned())
}

/// Stops `id` straight at moto (outside gpuprov) and waits until moto lists it stopped.
async fn stop_outside(env: &Env, region: &str, id: &str) {
    env.direct(region)
        .stop_instances()
        .instance_ids(id)
        .send()
        .await
        .expect("StopInstances straight at moto");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let state = state_outside(env, region, id).await;
        if state == Some(aws_sdk_ec2::types::InstanceStateName::Stopped) {
            return;
        }
        assert!(Instant::now() < deadline, "{id} never stopped: {state:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Counts logins, then delegates.
struct CountLogins<C> {
    inner: C,
    n: Arc<std::sync::atomic::AtomicU32>,
}

#[async_trait]
impl<C: Connector> Connector for CountLogins<C> {
    async fn login(
        &self,
        endpoint: &SshEndpoint,
        user: &str,
        pinned: Option<&HostKey>,
    ) -> Result<HostKey, SshError> {
        self.n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.login(endpoint, user, pinned).await
    }
}

/// A stopped instance with this machine's identity that gpuprov did not create (made and
/// stopped straight at moto, in the region and zone of the first offer): the launch finds
/// it in `Creating`, adopts it, sees it stopped and ends `Unowned` without starting,
/// terminating or replacing it. Only a deliberate teardown of what that state owns (as
/// `destroy` does) terminates it.
#[tokio::test]
async fn a_stopped_instance_found_by_identity_is_left_untouched_on_ec2() {
    if skip() {
        return;
    }
    let env = Env::start("H100", 8, &["us-east-1"]).await;
    let first = env.first_offer().await;
    assert_eq!(first.id, "aws/us-east-1/p5.48xlarge/us-east-1a");
    let region = first.location.region.clone();
    let id = run_outside(&env, &first).await;
    stop_outside(&env, &region, &id).await;
    assert!(
        env.proxy.seen("RunInstances").is_empty() && env.proxy.seen("StopInstances").is_empty(),
        "the setup went straight to moto"
    );

    let end = env.launch().await.expect("launch runs");
    let LaunchState::Unowned {
        location,
        instance_ids,
        reason,
    } = &end
    else {
        panic!("expected Unowned, got {end:?} ({:?})", env.labels());
    };
    assert_eq!(instance_ids, std::slice::from_ref(&id));
    assert_eq!(location.region, region);
    assert!(
        reason.contains("not created by gpuprov") && reason.contains("Stopped"),
        "{reason}"
    );
    assert!(
        env.labels()
            .iter()
            .any(|l| l.contains(&id) && l.contains("found, not created by gpuprov")),
        "{:?}",
        env.labels()
    );
    assert!(
        !env.labels().iter().any(|l| l.contains("compensating")),
        "{:?}",
        env.labels()
    );
    assert_eq!(
        state_outside(&env, &region, &id).await,
        Some(aws_sdk_ec2::types::InstanceStateName::Stopped),
        "still there, still stopped"
    );
    for action in ["TerminateInstances", "RunInstances", "StartInstances"] {
        assert!(
            env.proxy.seen(action).is_empty(),
            "{action}: {:?}",
            env.proxy.seen(action)
        );
    }
    env.assert_nothing_unknown(&end, &[&region]).await;

    // destroy: the state owns it (adopted), and a teardown of that deletes it on purpose.
    let owned = end.owned().expect("the state names the instance");
    assert!(owned.adopted, "{owned:?}");
    assert_eq!(owned.instance_ids, vec![id.clone()]);
    let done = env.teardown_target(Target::of(owned, VM)).await;
    assert_eq!(done, TeardownState::Done);
    assert_eq!(
        env.proxy
            .seen("TerminateInstances")
            .iter()
            .filter(|s| s.body.contains(&id))
            .count(),
        1,
        "terminated by the teardown"
    );
    assert_eq!(
        state_outside(&env, &region, &id).await,
        Some(aws_sdk_ec2::types::InstanceStateName::Terminated)
    );
    assert_eq!(env.sweep(&region).await, (vec![], vec![]));
}

/// A running instance with this machine's identity that gpuprov did not create, which
/// refuses the project key (a colleague's, launched with another key): the launch adopts
/// it, the first refused login ends it `Unowned` with "key refused" (no silent retry for
/// the SSH timeout), and it is neither terminated nor replaced.
#[tokio::test]
async fn a_running_instance_with_another_key_is_left_untouched_on_ec2() {
    if skip() {
        return;
    }
    // A long SSH timeout: only the refused key can end the wait quickly.
    let env = Env::start_with("H100", 8, &["us-east-1"], |s| {
        s.capabilities.ssh_timeout = Duration::from_secs(60);
    })
    .await;
    let first = env.first_offer().await;
    let region = first.location.region.clone();
    let id = run_outside(&env, &first).await;
    let running = Instant::now() + Duration::from_secs(20);
    while state_outside(&env, &region, &id).await
        != Some(aws_sdk_ec2::types::InstanceStateName::Running)
    {
        assert!(Instant::now() < running, "{id} never ran");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let fake = FakeConnector::default();
    fake.fail_with(
        (0..200)
            .map(|_| SshError::AuthRejected {
                endpoint: "colleague".into(),
                msg: "Permission denied (publickey)".into(),
            })
            .collect(),
    );
    let logins = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let connector = CountLogins {
        inner: LoopbackOnly(fake),
        n: logins.clone(),
    };
    let started = Instant::now();
    let end = env
        .launch_with(Arc::new(connector))
        .await
        .expect("launch runs");
    let took = started.elapsed();
    let LaunchState::Unowned {
        instance_ids,
        reason,
        ..
    } = &end
    else {
        panic!("expected Unowned, got {end:?} ({:?})", env.labels());
    };
    assert_eq!(instance_ids, std::slice::from_ref(&id));
    assert!(reason.contains("key refused"), "{reason}");
    assert!(reason.contains("not created by gpuprov"), "{reason}");
    assert_eq!(
        logins.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the first refusal ends the wait"
    );
    assert!(
        took < Duration::from_secs(15),
        "ended at once, not after the 60s SSH timeout: {took:?}"
    );
    assert_eq!(
        state_outside(&env, &region, &id).await,
        Some(aws_sdk_ec2::types::InstanceStateName::Running),
        "still there, still running"
    );
    for action in ["TerminateInstances", "RunInstances", "StopInstances"] {
        assert!(
            env.proxy.seen(action).is_empty(),
            "{action}: {:?}",
            env.proxy.seen(action)
        );
    }
    env.assert_nothing_unknown(&end, &[&region]).await;

    let owned = end.owned().expect("the state names the instance");
    assert!(owned.adopted, "{owned:?}");
    let done = env.teardown_target(Target::of(owned, VM)).await;
    assert_eq!(done, TeardownState::Done);
    assert_eq!(env.sweep(&region).await, (vec![], vec![]));
}

/// As above, but EC2 cannot start it now (`InsufficientInstanceCapacity`, HTTP 500, on
/// StartInstances): the launch ends `Aborted` with "no replacement", the state keeps the
/// machine's record, and nothing is created or terminated; the instance (and its disk)
/// is still there, stopped.
#[tokio::test]
async fn a_restart_refused_for_capacity_keeps_the_instance_on_ec2() {
    if skip() {
        return;
    }
    let env = Env::start("H100", 8, &["us-east-1"]).await;
    let first = env.launch().await.expect("launch runs");
    let old = ready_or_panic(&first).clone();
    let region = old.location.region.clone();
    stop_outside(&env, &region, &old.instance_id).await;
    env.proxy.fault(Fault {
        message: "We currently do not have sufficient p5.48xlarge capacity in the \
                  Availability Zone you requested (us-east-1a). Our system will be working on \
                  provisioning additional capacity.",
        ..fault("StartInstances", 500, "InsufficientInstanceCapacity")
    });

    let again = env.launch().await.expect("re-apply runs");
    let LaunchState::Aborted { reason, owned } = &again else {
        panic!("expected Aborted, got {again:?} ({:?})", env.labels());
    };
    assert!(reason.contains("no replacement"), "{reason}");
    assert!(reason.contains("InsufficientInstanceCapacity"), "{reason}");
    let owned = owned.as_ref().expect("the machine is kept");
    assert_eq!(owned.instance_ids, vec![old.instance_id.clone()]);
    assert!(!owned.adopted, "still gpuprov's own machine");
    let kept = owned.vm.as_ref().expect("its record is kept");
    assert_eq!(kept.instance_id, old.instance_id);
    assert_eq!(kept.host_key, old.host_key);
    let start = env.proxy.seen("StartInstances");
    assert_eq!(start.len(), 1, "{start:?}");
    assert_eq!(
        start[0].faulted.as_deref(),
        Some("InsufficientInstanceCapacity")
    );
    assert_eq!(
        env.proxy.seen("RunInstances").len(),
        1,
        "never a second instance of the machine"
    );
    assert!(env.proxy.seen("TerminateInstances").is_empty());
    assert_eq!(
        state_outside(&env, &region, &old.instance_id).await,
        Some(aws_sdk_ec2::types::InstanceStateName::Stopped),
        "still there, still stopped"
    );
    env.assert_nothing_unknown(&again, &[&region]).await;
    let done = env
        .teardown_target(Target::of(again.owned().unwrap(), VM))
        .await;
    assert_eq!(done, TeardownState::Done);
    assert_eq!(env.sweep(&region).await, (vec![], vec![]));
}
