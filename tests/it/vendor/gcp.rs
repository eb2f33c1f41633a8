//! The GCP adapter against a local fake of the Compute Engine API whose every request and
//! response is checked against Google's discovery document (`spec::gcp()`, loaded by the
//! harness's discovery reader), and a local OAuth 2.0 token endpoint that checks the
//! service account's JWT-bearer grant (signature with the test key's public half, issuer,
//! audience, scope, lifetime) before it issues a token. The launch and teardown machines
//! run for real through the executor with a `MemoryJournal`; SSH is the `FakeConnector`
//! (instances get 127.0.0.x NAT addresses, nothing is dialled).
//!
//! The fake follows Compute Engine's shapes: an insert answers an `Operation` at once and
//! creates the instance `PROVISIONING` (or, in a zone without stock, no instance: the
//! operation ends `DONE` with `ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS`); operations
//! advance `PENDING → RUNNING → DONE` and instances `PROVISIONING → STAGING → RUNNING` one
//! step per listing of the zone's operations (once per `observe`); a resent insert with a
//! known `requestId` answers the first operation and creates nothing; lists page by
//! `nextPageToken`; errors are Google's JSON error body.

use crate::support::drive;
use crate::support::spec;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use drive::{LINEAGE, PUBKEY};
use gpuprov::config::Cloud;
use gpuprov::machine::{MemoryJournal, Providers};
use gpuprov::provider::doubles::fake::{FakeConnector, FakeProvider};
use gpuprov::provider::clouds::gcp::auth::{self, GoogleCredential};
use gpuprov::provider::clouds::gcp::{GcpProvider, GcpSettings};
use gpuprov::provider::kit::Source;
use gpuprov::provider::{
    BlockScope, CloudProvider, ErrorKind, InstanceSpec, InstanceStatus, Location, ResourceRequest,
};
use gpuprov::vm::{LaunchState, Target, TeardownState};
use serde_json::{json, Value};
use spec::{Canned, Seen, SpecServer};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

/// Every access token the token endpoint issues carries this sentinel: it must never
/// appear in any error, reason, journal entry or output.
pub(crate) const SENTINEL: &str = "gcp_sentinel_token_4a7c1e";
pub(crate) const PROJECT: &str = "gpuprov-test";
pub(crate) const EMAIL: &str = "gpuprov@gpuprov-test.iam.gserviceaccount.com";
const KEY_ID: &str = "test-key-1";
/// The test service account's key pair (test-only, generated for these tests).
pub(crate) const KEY_PEM: &str = include_str!("../../fixtures/gcp/test-only-sa-key.pem");
const PUB_PEM: &str = include_str!("../../fixtures/gcp/test-only-sa-key.pub.pem");
const BASE: &str = "/compute/v1/projects/gpuprov-test";
pub(crate) const H100: &str = "nvidia-h100-80gb";

/// The service-account key file of the test account, its tokens from `token_uri`.
pub(crate) fn sa_json(token_uri: &str) -> String {
    sa_json_with_key(token_uri, KEY_PEM)
}

/// [`sa_json`] with another private key.
fn sa_json_with_key(token_uri: &str, pem: &str) -> String {
    json!({
        "type": "service_account",
        "project_id": PROJECT,
        "private_key_id": KEY_ID,
        "private_key": pem,
        "client_email": EMAIL,
        "client_id": "100000000000000000001",
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "token_uri": token_uri,
    })
    .to_string()
}

/// Google's JSON error body.
pub(crate) fn google_error(code: u16, reason: &str, status: &str, message: &str) -> Value {
    json!({"error": {
        "code": code,
        "message": message,
        "errors": [{"message": message, "domain": "global", "reason": reason}],
        "status": status,
    }})
}

/// An operation's `error` and its `httpErrorStatusCode`.
pub(crate) type LateError = (Value, i64);

/// The late error of a stockout, as Compute Engine reports it in the insert's operation.
pub(crate) fn stockout(zone: &str) -> (Value, i64) {
    (
        json!({"errors": [{
            "code": "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
            "message": format!("The zone 'projects/{PROJECT}/zones/{zone}' does not have enough resources available to fulfill the request.  '(resource type:compute)'."),
            "errorDetails": [
                {"errorInfo": {"reason": "resource_availability", "domain": "compute.googleapis.com",
                    "metadatas": {"zone": zone, "vmType": "a3-highgpu-8g", "attachment": "nvidia-h100-80gb"}}},
                {"localizedMessage": {"locale": "en-US", "message": "A a3-highgpu-8g VM instance is currently unavailable in the zone. Consider trying your request in another zone."}}
            ]
        }]}),
        503,
    )
}

/// The late error of the project-wide GPU quota.
pub(crate) fn all_regions_quota() -> (Value, i64) {
    (
        json!({"errors": [{
            "code": "QUOTA_EXCEEDED",
            "message": "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally.",
            "errorDetails": [{"quotaInfo": {"metricName": "compute.googleapis.com/gpus_all_regions",
                "limitName": "GPUS-ALL-REGIONS-per-project", "limit": 0.0}}]
        }]}),
        403,
    )
}

// ---- The token endpoint ----

/// The gcloud user login the token endpoint knows (`authorized_user`).
const USER_CLIENT_ID: &str = "764086051850-test.apps.googleusercontent.com";
const USER_CLIENT_SECRET: &str = "user_client_secret_sentinel_2b9d";
const USER_REFRESH_TOKEN: &str = "1//user_refresh_token_sentinel_8c3e";

#[derive(Default)]
pub(crate) struct TokenState {
    /// Tokens issued, in order.
    pub(crate) issued: Vec<String>,
    /// `expires_in` of the next grants (then 3600).
    pub(crate) lifetimes: VecDeque<u64>,
    /// Why requests were refused.
    pub(crate) refused: Vec<String>,
    /// Answer the next request with this instead.
    pub(crate) fail_next: Option<(u16, Value)>,
}

pub(crate) struct TokenServer {
    pub(crate) server: MockServer,
    pub(crate) state: Arc<Mutex<TokenState>>,
}

/// An `application/x-www-form-urlencoded` body as pairs.
fn form(body: &[u8]) -> BTreeMap<String, String> {
    fn decode(s: &str) -> String {
        let b = s.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < b.len() => {
                    let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                    out.push(u8::from_str_radix(hex, 16).unwrap_or(b'?'));
                    i += 2;
                }
                c => out.push(c),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    String::from_utf8_lossy(body)
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}

/// Whether `assertion` is the test account's JWT-bearer grant for Compute.
fn check_assertion(assertion: &str) -> Result<(), String> {
    let header = jsonwebtoken::decode_header(assertion).map_err(|e| format!("header: {e}"))?;
    if header.kid.as_deref() != Some(KEY_ID) {
        return Err(format!("kid {:?}", header.kid));
    }
    let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    v.set_audience(&[auth::TOKEN_ENDPOINT]);
    v.set_issuer(&[EMAIL]);
    v.set_required_spec_claims(&["exp", "iat", "aud", "iss"]);
    let key = jsonwebtoken::DecodingKey::from_rsa_pem(PUB_PEM.as_bytes()).unwrap();
    let claims = jsonwebtoken::decode::<auth::Claims>(assertion, &key, &v)
        .map_err(|e| format!("signature or claims: {e}"))?
        .claims;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    if claims.exp - claims.iat != 3600 || claims.iat.abs_diff(now) > 300 {
        return Err(format!(
            "lifetime {} from {}",
            claims.exp - claims.iat,
            claims.iat
        ));
    }
    if !claims.scope.split(' ').any(|s| s == auth::SCOPE) {
        return Err(format!("scope {}", claims.scope));
    }
    Ok(())
}

impl TokenServer {
    pub(crate) async fn start() -> TokenServer {
        let server = MockServer::start().await;
        let state = Arc::new(Mutex::new(TokenState::default()));
        let st = state.clone();
        Mock::given(wiremock::matchers::method("POST"))
            .and(wiremock::matchers::path("/token"))
            .respond_with(move |req: &Request| {
                let mut s = st.lock().unwrap();
                if let Some((status, body)) = s.fail_next.take() {
                    return ResponseTemplate::new(status).set_body_json(body);
                }
                let f = form(&req.body);
                let ct = req.headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default();
                let field = |k: &str| f.get(k).map(String::as_str);
                let check = if !ct.starts_with("application/x-www-form-urlencoded") {
                    Err(format!("content type {ct}"))
                } else if field("grant_type") == Some("refresh_token") {
                    // A gcloud user login (RFC 6749 6).
                    let ok = field("client_id") == Some(USER_CLIENT_ID)
                        && field("client_secret") == Some(USER_CLIENT_SECRET)
                        && field("refresh_token") == Some(USER_REFRESH_TOKEN);
                    if ok { Ok(()) } else { Err(format!("refresh grant {f:?}")) }
                } else if field("grant_type") != Some(auth::JWT_BEARER_GRANT) {
                    Err(format!("grant_type {:?}", f.get("grant_type")))
                } else {
                    check_assertion(field("assertion").unwrap_or_default())
                };
                if let Err(why) = check {
                    s.refused.push(why);
                    return ResponseTemplate::new(400).set_body_json(
                        json!({"error": "invalid_grant", "error_description": "Invalid JWT Signature."}),
                    );
                }
                let token = format!("ya29.{SENTINEL}.{}", s.issued.len() + 1);
                s.issued.push(token.clone());
                let expires = s.lifetimes.pop_front().unwrap_or(3600);
                ResponseTemplate::new(200).set_body_json(
                    json!({"access_token": token, "expires_in": expires, "token_type": "Bearer"}),
                )
            })
            .mount(&server)
            .await;
        TokenServer { server, state }
    }

    pub(crate) fn token_uri(&self) -> String {
        format!("{}/token", self.server.uri())
    }

    pub(crate) fn issued(&self) -> Vec<String> {
        self.state.lock().unwrap().issued.clone()
    }
}

// ---- The Compute Engine fake ----

/// The fake project.
#[derive(Default)]
pub(crate) struct World {
    /// zone → accelerator types listed there.
    pub(crate) accelerators: BTreeMap<String, Vec<String>>,
    /// Zones whose inserts succeed; an insert elsewhere fails late with a stockout.
    pub(crate) capacity: BTreeSet<String>,
    /// Zones without this machine type (`machineTypes.get` answers 404).
    pub(crate) missing_types: BTreeSet<(String, String)>,
    /// `project/family/F` or `project/NAME` → the image.
    pub(crate) images: BTreeMap<String, Value>,
    pub(crate) firewalls: BTreeMap<String, Value>,
    /// (zone, instance)
    pub(crate) instances: Vec<(String, Value)>,
    /// (zone, operation, the error it ends with)
    pub(crate) operations: Vec<(String, Value, Option<LateError>)>,
    /// requestId → operation name.
    request_ids: BTreeMap<String, String>,
    /// Late errors for the next inserts (before capacity decides).
    pub(crate) late: VecDeque<(Value, i64)>,
    /// Per (method, path): error responses served before the normal behaviour.
    faults: BTreeMap<(String, String), VecDeque<Canned>>,
    /// Items per page of every list (`None`: as many as `maxResults` allows).
    pub(crate) page_size: Option<usize>,
    /// New instances and their inserts stay out of every listing until the insert is
    /// sent again with the same `requestId` (a listing that lags behind a create).
    pub(crate) hide_until_resent: bool,
    hidden: BTreeSet<String>,
    /// Every error echoes the Authorization header (a hostile server).
    pub(crate) echo_auth: bool,
    /// Tokens the token endpoint issued (shared with it): any other bearer is refused.
    tokens: Option<Arc<Mutex<TokenState>>>,
    next: u64,
}

fn zone_url(zone: &str) -> String {
    format!("https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{zone}")
}

/// An image of `project`.
pub(crate) fn image(project: &str, name: &str, family: &str) -> Value {
    json!({
        "kind": "compute#image", "id": "5500000000000000001", "name": name, "family": family,
        "status": "READY", "diskSizeGb": "50", "architecture": "X86_64",
        "selfLink": format!("https://www.googleapis.com/compute/v1/projects/{project}/global/images/{name}"),
    })
}

impl World {
    /// A project where `zones` list `accelerator` and have stock, with the default image.
    pub(crate) fn with_zones(mut self, accelerator: &str, zones: &[&str], stock: bool) -> World {
        for z in zones {
            self.accelerators
                .entry(z.to_string())
                .or_default()
                .push(accelerator.into());
            if stock {
                self.capacity.insert(z.to_string());
            }
        }
        self
    }

    pub(crate) fn with_default_image(mut self) -> World {
        self.images.insert(
            "ubuntu-os-accelerator-images/family/ubuntu-accelerator-2204-amd64-with-nvidia-550"
                .into(),
            image(
                "ubuntu-os-accelerator-images",
                "ubuntu-accelerator-2204-amd64-with-nvidia-550-v20261101",
                "ubuntu-accelerator-2204-amd64-with-nvidia-550",
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

    fn auth_of(req: &Seen) -> String {
        req.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("authorization"))
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    }

    fn echo(&self, req: &Seen, mut c: Canned) -> Canned {
        if self.echo_auth {
            if let Some(m) = c
                .body
                .as_ref()
                .and_then(|b| b["error"]["message"].as_str().map(str::to_string))
            {
                c.body.as_mut().unwrap()["error"]["message"] =
                    json!(format!("{m} [{}]", Self::auth_of(req)));
            }
        }
        c
    }

    /// A fault queued for the request, or a 401 for a bearer the token endpoint never
    /// issued.
    fn intercept(&mut self, req: &Seen) -> Option<Canned> {
        if let Some(c) = self
            .faults
            .get_mut(&(req.method.clone(), req.path.clone()))
            .and_then(VecDeque::pop_front)
        {
            return Some(self.echo(req, c));
        }
        let tokens = self.tokens.as_ref()?;
        let auth = Self::auth_of(req);
        let ok = auth
            .strip_prefix("Bearer ")
            .is_some_and(|t| tokens.lock().unwrap().issued.iter().any(|i| i == t));
        (!ok).then(|| {
            let c = Canned::status(401, google_error(401, "authError", "UNAUTHENTICATED", "Request had invalid authentication credentials. Expected OAuth 2 access token."));
            self.echo(req, c)
        })
    }

    fn not_found(what: &str) -> Canned {
        Canned::status(
            404,
            google_error(
                404,
                "notFound",
                "NOT_FOUND",
                &format!("The resource '{what}' was not found"),
            ),
        )
    }

    /// One page of `items` under `field` (zonal lists) at `pageToken`.
    fn page(&self, req: &Seen, items: Vec<Value>, kind: &str) -> Canned {
        let (chunk, next) = self.paged(req, items);
        let mut out = json!({"kind": kind, "id": "projects/gpuprov-test", "items": chunk,
            "selfLink": "https://www.googleapis.com/compute/v1/projects/gpuprov-test"});
        if let Some(n) = next {
            out["nextPageToken"] = json!(n);
        }
        Canned::ok(out)
    }

    fn paged<T: Clone>(&self, req: &Seen, items: Vec<T>) -> (Vec<T>, Option<String>) {
        let q = |k: &str| {
            req.query
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
        };
        let start: usize = q("pageToken")
            .and_then(|t| t.strip_prefix("p").and_then(|n| n.parse().ok()))
            .unwrap_or(0);
        let max: usize = q("maxResults").and_then(|m| m.parse().ok()).unwrap_or(500);
        let size = self.page_size.unwrap_or(max).min(max).max(1);
        let end = (start + size).min(items.len());
        let next = (end < items.len()).then(|| format!("p{end}"));
        (
            items.get(start..end).map(<[T]>::to_vec).unwrap_or_default(),
            next,
        )
    }

    fn accelerator_type(zone: &str, name: &str) -> Value {
        json!({"kind": "compute#acceleratorType", "id": "10001", "name": name, "zone": zone_url(zone),
            "description": name, "maximumCardsPerInstance": 8,
            "selfLink": format!("{}/acceleratorTypes/{name}", zone_url(zone))})
    }

    fn aggregated_accelerators(&self, req: &Seen) -> Canned {
        let scopes: Vec<(String, Vec<String>)> = self
            .accelerators
            .iter()
            .map(|(z, a)| (z.clone(), a.clone()))
            .collect();
        let (chunk, next) = self.paged(req, scopes);
        let mut items = serde_json::Map::new();
        for (z, accs) in chunk {
            let types: Vec<Value> = accs.iter().map(|a| Self::accelerator_type(&z, a)).collect();
            items.insert(format!("zones/{z}"), json!({"acceleratorTypes": types}));
        }
        let mut out = json!({"kind": "compute#acceleratorTypeAggregatedList", "id": "projects/gpuprov-test", "items": items});
        if let Some(n) = next {
            out["nextPageToken"] = json!(n);
        }
        Canned::ok(out)
    }

    /// The `(labels.K = "V") (labels.K2 = "V2")` filter as pairs; anything else is a
    /// filter this fake (and gpuprov) does not speak.
    fn label_filter(req: &Seen) -> Vec<(String, String)> {
        let Some(f) = req
            .query
            .iter()
            .find(|(k, _)| k == "filter")
            .map(|(_, v)| v.clone())
        else {
            return vec![];
        };
        f.split(") (")
            .map(|e| e.trim_matches(|c| c == '(' || c == ')'))
            .map(|e| {
                let (k, v) = e
                    .split_once(" = ")
                    .unwrap_or_else(|| panic!("filter {f:?}"));
                let k = k
                    .strip_prefix("labels.")
                    .unwrap_or_else(|| panic!("filter {f:?}"));
                (k.to_string(), v.trim_matches('"').to_string())
            })
            .collect()
    }

    fn matches(i: &Value, filter: &[(String, String)]) -> bool {
        filter.iter().all(|(k, v)| i["labels"][k] == v.as_str())
    }

    fn visible(&self, name: &str) -> bool {
        !self.hidden.contains(name)
    }

    fn list_instances(&mut self, req: &Seen, zone: &str) -> Canned {
        let filter = Self::label_filter(req);
        let items: Vec<Value> = self
            .instances
            .iter()
            .filter(|(z, i)| {
                z == zone
                    && Self::matches(i, &filter)
                    && self.visible(i["name"].as_str().unwrap_or_default())
            })
            .map(|(_, i)| i.clone())
            .collect();
        self.page(req, items, "compute#instanceList")
    }

    fn aggregated_instances(&mut self, req: &Seen) -> Canned {
        let filter = Self::label_filter(req);
        let mut by_zone: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for (z, i) in &self.instances {
            if Self::matches(i, &filter) && self.visible(i["name"].as_str().unwrap_or_default()) {
                by_zone.entry(z.clone()).or_default().push(i.clone());
            }
        }
        let items: serde_json::Map<String, Value> = by_zone
            .into_iter()
            .map(|(z, is)| (format!("zones/{z}"), json!({"instances": is})))
            .collect();
        Canned::ok(
            json!({"kind": "compute#instanceAggregatedList", "id": "projects/gpuprov-test", "items": items}),
        )
    }

    fn new_operation(
        &mut self,
        zone: &str,
        kind: &str,
        target: &str,
        ends_with: Option<(Value, i64)>,
    ) -> Value {
        self.next += 1;
        let op = json!({
            "kind": "compute#operation",
            "id": format!("{}", 7_000_000_000u64 + self.next),
            "name": format!("operation-17330000000{:02}-5f0a1b2c3d4e5-00000000-{:08x}", self.next, self.next),
            "zone": zone_url(zone),
            "operationType": kind,
            "targetLink": format!("{}/instances/{target}", zone_url(zone)),
            "targetId": format!("{}", 8_000_000_000u64 + self.next),
            "status": "PENDING",
            "user": EMAIL,
            "progress": 0,
            "insertTime": "2026-12-02T10:00:00.000-08:00",
            "selfLink": format!("{}/operations/op-{}", zone_url(zone), self.next),
        });
        self.operations
            .push((zone.to_string(), op.clone(), ends_with));
        op
    }

    fn insert(&mut self, req: &Seen, zone: &str) -> Canned {
        let body = req.body.clone().unwrap_or_default();
        if let Some(id) = req
            .query
            .iter()
            .find(|(k, _)| k == "requestId")
            .map(|(_, v)| v.clone())
        {
            if let Some(name) = self.request_ids.get(&id) {
                // GCP answers a resent insert with the first one's operation, as it is now.
                let op = self
                    .operations
                    .iter()
                    .find(|(_, o, _)| o["name"] == name.as_str())
                    .map(|(_, o, _)| o.clone());
                let op = op.expect("the operation of a known requestId");
                let target = op["targetLink"]
                    .as_str()
                    .unwrap_or_default()
                    .rsplit('/')
                    .next()
                    .unwrap_or_default()
                    .to_string();
                self.hidden.remove(&target);
                return Canned::ok(op);
            }
        }
        let name = body["name"].as_str().unwrap_or_default().to_string();
        if self
            .instances
            .iter()
            .any(|(z, i)| z == zone && i["name"] == name.as_str())
        {
            return Canned::status(409, google_error(409, "alreadyExists", "ALREADY_EXISTS", &format!("The resource 'projects/{PROJECT}/zones/{zone}/instances/{name}' already exists")));
        }
        let late = self
            .late
            .pop_front()
            .or_else(|| (!self.capacity.contains(zone)).then(|| stockout(zone)));
        let op = self.new_operation(zone, "insert", &name, late.clone());
        if self.hide_until_resent {
            self.hidden.insert(name.clone());
        }
        if let Some(id) = req
            .query
            .iter()
            .find(|(k, _)| k == "requestId")
            .map(|(_, v)| v.clone())
        {
            self.request_ids
                .insert(id, op["name"].as_str().unwrap().to_string());
        }
        if late.is_none() {
            let mut i = body.clone();
            i["kind"] = json!("compute#instance");
            i["id"] = json!(format!("{}", 9_000_000_000u64 + self.next));
            i["zone"] = json!(zone_url(zone));
            i["status"] = json!("PROVISIONING");
            i["selfLink"] = json!(format!("{}/instances/{name}", zone_url(zone)));
            i["creationTimestamp"] = json!("2026-12-02T10:00:00.000-08:00");
            self.instances.push((zone.to_string(), i));
        }
        Canned::ok(op)
    }

    /// One step of every operation and instance (see the module docs).
    fn tick(&mut self) {
        let mut done_deletes = vec![];
        for (zone, op, ends) in &mut self.operations {
            match op["status"].as_str() {
                Some("PENDING") => op["status"] = json!("RUNNING"),
                Some("RUNNING") => {
                    op["status"] = json!("DONE");
                    op["progress"] = json!(100);
                    if let Some((err, http)) = ends.clone() {
                        op["error"] = err;
                        op["httpErrorStatusCode"] = json!(http);
                        op["httpErrorMessage"] = json!(if http == 503 {
                            "SERVICE UNAVAILABLE"
                        } else {
                            "FORBIDDEN"
                        });
                    }
                    if op["operationType"] == "delete" {
                        done_deletes.push((
                            zone.clone(),
                            op["targetLink"]
                                .as_str()
                                .unwrap_or_default()
                                .rsplit('/')
                                .next()
                                .unwrap_or_default()
                                .to_string(),
                        ));
                    }
                }
                _ => {}
            }
        }
        self.instances.retain(|(z, i)| {
            !done_deletes
                .iter()
                .any(|(dz, n)| dz == z && i["name"] == n.as_str())
        });
        let mut n = 7;
        for (_, i) in &mut self.instances {
            n += 1;
            match i["status"].as_str() {
                Some("PROVISIONING") => i["status"] = json!("STAGING"),
                Some("STAGING") => {
                    i["status"] = json!("RUNNING");
                    i["networkInterfaces"][0]["accessConfigs"][0]["natIP"] =
                        json!(format!("127.0.0.{n}"));
                }
                _ => {}
            }
        }
    }

    fn list_operations(&mut self, req: &Seen, zone: &str) -> Canned {
        let filter = req
            .query
            .iter()
            .find(|(k, _)| k == "filter")
            .map(|(_, v)| v.clone());
        let kind = filter.as_deref().map(|f| {
            f.strip_prefix("operationType = \"")
                .and_then(|f| f.strip_suffix('"'))
                .unwrap_or_else(|| panic!("filter {f:?}"))
                .to_string()
        });
        let items: Vec<Value> = self
            .operations
            .iter()
            .filter(|(z, o, _)| {
                z == zone && kind.as_deref().is_none_or(|k| o["operationType"] == k)
            })
            .filter(|(_, o, _)| {
                self.visible(
                    o["targetLink"]
                        .as_str()
                        .unwrap_or_default()
                        .rsplit('/')
                        .next()
                        .unwrap_or_default(),
                )
            })
            .map(|(_, o, _)| o.clone())
            .collect();
        let out = self.page(req, items, "compute#operationList");
        // Advance after the last page of the listing.
        if out
            .body
            .as_ref()
            .is_none_or(|b| b.get("nextPageToken").is_none())
        {
            self.tick();
        }
        out
    }

    fn delete_instance(&mut self, zone: &str, name: &str) -> Canned {
        let Some((_, i)) = self
            .instances
            .iter_mut()
            .find(|(z, i)| z == zone && i["name"] == name)
        else {
            return Self::not_found(&format!("projects/{PROJECT}/zones/{zone}/instances/{name}"));
        };
        i["status"] = json!("STOPPING");
        let op = self.new_operation(zone, "delete", name, None);
        Canned::ok(op)
    }

    fn firewall(&mut self, req: &Seen) -> Canned {
        let name = req.path.rsplit('/').next().unwrap_or_default().to_string();
        let global = "global";
        let op = |w: &mut World, kind: &str| {
            w.next += 1;
            json!({"kind": "compute#operation", "id": format!("{}", 6_000_000_000u64 + w.next),
                "name": format!("operation-fw-{}", w.next), "operationType": kind, "status": "PENDING",
                "targetLink": format!("https://www.googleapis.com/compute/v1/projects/{PROJECT}/{global}/firewalls/{name}"),
                "selfLink": format!("https://www.googleapis.com/compute/v1/projects/{PROJECT}/{global}/operations/operation-fw-{}", w.next)})
        };
        match req.method.as_str() {
            "GET" => match self.firewalls.get(&name) {
                Some(f) => Canned::ok(f.clone()),
                None => Self::not_found(&format!("projects/{PROJECT}/global/firewalls/{name}")),
            },
            "PATCH" => {
                let Some(f) = self.firewalls.get_mut(&name) else {
                    return Self::not_found(&format!("projects/{PROJECT}/global/firewalls/{name}"));
                };
                for (k, v) in req.body.clone().unwrap_or_default().as_object().unwrap() {
                    f[k] = v.clone();
                }
                Canned::ok(op(self, "patch"))
            }
            "DELETE" => match self.firewalls.remove(&name) {
                Some(_) => Canned::ok(op(self, "delete")),
                None => Self::not_found(&format!("projects/{PROJECT}/global/firewalls/{name}")),
            },
            _ => {
                let mut b = req.body.clone().unwrap_or_default();
                let name = b["name"].as_str().unwrap_or_default().to_string();
                if self.firewalls.contains_key(&name) {
                    return Canned::status(409, google_error(409, "alreadyExists", "ALREADY_EXISTS", &format!("The resource 'projects/{PROJECT}/global/firewalls/{name}' already exists")));
                }
                b["kind"] = json!("compute#firewall");
                b["id"] = json!("4400000000000000001");
                b["selfLink"] = json!(format!("https://www.googleapis.com/compute/v1/projects/{PROJECT}/global/firewalls/{name}"));
                self.firewalls.insert(name.clone(), b);
                let mut o = op(self, "insert");
                o["targetLink"] = json!(format!("https://www.googleapis.com/compute/v1/projects/{PROJECT}/global/firewalls/{name}"));
                Canned::ok(o)
            }
        }
    }

    fn get_image(&self, req: &Seen) -> Canned {
        // /compute/v1/projects/P/global/images/family/F or /compute/v1/projects/P/global/images/N
        let rest = req
            .path
            .strip_prefix("/compute/v1/projects/")
            .unwrap_or_default();
        let (project, tail) = rest.split_once("/global/images/").unwrap_or_default();
        let key = format!("{project}/{tail}");
        match self.images.get(&key) {
            Some(i) => Canned::ok(i.clone()),
            None => Self::not_found(&format!("projects/{project}/global/images/{tail}")),
        }
    }
}

pub(crate) struct Fake {
    pub(crate) server: SpecServer,
    pub(crate) tokens: TokenServer,
    pub(crate) world: Arc<Mutex<World>>,
}

/// `path` without the project prefix split in segments (`zones`, `Z`, `instances`, ...).
fn segments(path: &str) -> Vec<String> {
    path.strip_prefix(BASE)
        .unwrap_or(path)
        .trim_matches('/')
        .split('/')
        .map(str::to_string)
        .collect()
}

impl Fake {
    pub(crate) async fn start(mut world: World) -> Fake {
        let server = SpecServer::start(spec::gcp()).await;
        let tokens = TokenServer::start().await;
        world.tokens = Some(tokens.state.clone());
        let world = Arc::new(Mutex::new(world));
        macro_rules! route {
            ($method:expr, $re:expr, |$w:ident, $req:ident, $seg:ident| $body:expr) => {{
                let wc = world.clone();
                server
                    .mount_fn($method, $re, move |$req: &Seen| {
                        let mut $w = wc.lock().unwrap();
                        if let Some(f) = $w.intercept($req) {
                            return f;
                        }
                        let $seg = segments(&$req.path);
                        $body
                    })
                    .await;
            }};
        }
        let p = "^/compute/v1/projects/gpuprov-test";
        route!(
            "GET",
            &format!("{p}/aggregated/acceleratorTypes$"),
            |w, r, _s| w.aggregated_accelerators(r)
        );
        route!("GET", &format!("{p}/aggregated/instances$"), |w, r, _s| w
            .aggregated_instances(r));
        route!(
            "GET",
            &format!("{p}/zones/[^/]+/acceleratorTypes/[^/]+$"),
            |w, _r, s| {
                if w.accelerators.get(&s[1]).is_some_and(|a| a.contains(&s[3])) {
                    Canned::ok(World::accelerator_type(&s[1], &s[3]))
                } else {
                    World::not_found(&format!(
                        "projects/{PROJECT}/zones/{}/acceleratorTypes/{}",
                        s[1], s[3]
                    ))
                }
            }
        );
        route!(
            "GET",
            &format!("{p}/zones/[^/]+/machineTypes/[^/]+$"),
            |w, _r, s| {
                if w.accelerators.contains_key(&s[1])
                    && !w.missing_types.contains(&(s[1].clone(), s[3].clone()))
                {
                    Canned::ok(
                        json!({"kind": "compute#machineType", "id": "1000", "name": s[3], "zone": s[1],
                    "guestCpus": 208, "memoryMb": 1916928, "isSharedCpu": false,
                    "selfLink": format!("{}/machineTypes/{}", zone_url(&s[1]), s[3])}),
                    )
                } else {
                    World::not_found(&format!(
                        "projects/{PROJECT}/zones/{}/machineTypes/{}",
                        s[1], s[3]
                    ))
                }
            }
        );
        route!(
            "GET",
            "^/compute/v1/projects/[^/]+/global/images/.+$",
            |w, r, _s| w.get_image(r)
        );
        route!(
            "GET",
            &format!("{p}/global/firewalls/[^/]+$"),
            |w, r, _s| w.firewall(r)
        );
        route!(
            "PATCH",
            &format!("{p}/global/firewalls/[^/]+$"),
            |w, r, _s| w.firewall(r)
        );
        route!(
            "DELETE",
            &format!("{p}/global/firewalls/[^/]+$"),
            |w, r, _s| w.firewall(r)
        );
        route!("POST", &format!("{p}/global/firewalls$"), |w, r, _s| w
            .firewall(r));
        route!("POST", &format!("{p}/zones/[^/]+/instances$"), |w, r, s| w
            .insert(r, &s[1]));
        route!("GET", &format!("{p}/zones/[^/]+/instances$"), |w, r, s| w
            .list_instances(r, &s[1]));
        route!(
            "DELETE",
            &format!("{p}/zones/[^/]+/instances/[^/]+$"),
            |w, _r, s| w.delete_instance(&s[1], &s[3])
        );
        route!(
            "POST",
            &format!("{p}/zones/[^/]+/instances/[^/]+/start$"),
            |w, _r, s| {
                let zone = s[1].clone();
                let name = s[3].clone();
                match w
                    .instances
                    .iter_mut()
                    .find(|(z, i)| *z == zone && i["name"] == name.as_str())
                {
                    Some((_, i)) => {
                        i["status"] = json!("PROVISIONING");
                        let op = w.new_operation(&zone, "start", &name, None);
                        Canned::ok(op)
                    }
                    None => World::not_found(&format!(
                        "projects/{PROJECT}/zones/{zone}/instances/{name}"
                    )),
                }
            }
        );
        route!("GET", &format!("{p}/zones/[^/]+/operations$"), |w, r, s| w
            .list_operations(r, &s[1]));
        Fake {
            server,
            tokens,
            world,
        }
    }

    /// The credential of the test service account, its token endpoint this fake's.
    pub(crate) fn credential(&self) -> GoogleCredential {
        GoogleCredential::from_json(
            &sa_json(&self.tokens.token_uri()),
            Source::Other("the test service-account key".into()),
        )
        .unwrap()
    }

    pub(crate) fn settings(&self) -> GcpSettings {
        GcpSettings::with_credential(
            LINEAGE.parse().unwrap(),
            Some(self.server.uri()),
            None,
            Some(self.credential()),
        )
    }

    /// The adapter with the test capabilities and a listing lag of 100 ms (the core
    /// waits the lag after compensating a late-refused insert).
    pub(crate) fn provider(&self) -> Arc<GcpProvider> {
        let caps = gpuprov::provider::Capabilities {
            create_list_lag: Duration::from_millis(100),
            ..drive::test_capabilities(GcpProvider::default_capabilities())
        };
        Arc::new(GcpProvider::new(self.settings()).with_capabilities(caps))
    }

    /// The bodies of every insert, with the zone from its path.
    pub(crate) fn inserts(&self) -> Vec<(String, Value)> {
        self.server
            .requests()
            .into_iter()
            .filter(|r| {
                r.method == "POST" && r.path.ends_with("/instances") && r.path.contains("/zones/")
            })
            .map(|r| (segments(&r.path)[1].clone(), r.body.unwrap_or_default()))
            .collect()
    }

    /// Instances of the project that are not being deleted.
    pub(crate) fn live_instances(&self) -> Vec<(String, Value)> {
        let w = self.world.lock().unwrap();
        w.instances
            .iter()
            .filter(|(_, i)| i["status"] != "STOPPING")
            .cloned()
            .collect()
    }
}

/// The shared launch/teardown harness over this vendor's local server.
type Run = drive::Run<Fake, GcpProvider>;

/// H100 × 8 (`a3-highgpu-8g`) offered in two zones of `us-east4` and one of `us-central1`,
/// stock in all of them.
pub(crate) fn h100_world() -> World {
    World::default()
        .with_zones(H100, &["us-east4-a", "us-east4-b", "us-central1-a"], true)
        .with_default_image()
}

async fn run(world: World, regions: &[&str]) -> Run {
    let fake = Fake::start(world).await;
    let provider = fake.provider();
    let mut vm = drive::gpu_vm(Cloud::Gcp, "H100", 8);
    vm.regions = regions.iter().map(|r| r.to_string()).collect();
    Run::new(fake, provider, vm)
}

fn at(zone: &str) -> Location {
    Location {
        cloud: "gcp".into(),
        region: zone.rsplit_once('-').unwrap().0.into(),
        zone: Some(zone.into()),
    }
}

fn spec_for(vm: &str, token: &str) -> InstanceSpec {
    InstanceSpec {
        vm_name: vm.into(),
        lineage: LINEAGE.into(),
        client_token: token.into(),
        image: None,
        disk_gb: None,
        ports: vec![8080],
        ssh_public_key: PUBKEY.into(),
        boot_script: None,
        shared: Default::default(),
    }
}

fn ask(regions: &[&str]) -> ResourceRequest {
    let mut vm = drive::gpu_vm(Cloud::Gcp, "H100", 8);
    vm.regions = regions.iter().map(|r| r.to_string()).collect();
    vm.request()
}

#[tokio::test]
async fn a_late_stockout_blocks_its_zone_and_the_next_zone_is_tried() {
    // us-east4-a lists the GPU but has no stock: its insert is accepted and its operation
    // then fails with ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS.
    let world = World::default()
        .with_zones(H100, &["us-east4-a"], false)
        .with_zones(H100, &["us-east4-b"], true)
        .with_default_image();
    let r = run(world, &["us-east4"]).await;
    let end = r.launch().await.unwrap();
    let vm = end
        .ready()
        .unwrap_or_else(|| panic!("not ready: {end:?} {:?}", r.labels()));
    assert_eq!(vm.location.zone.as_deref(), Some("us-east4-b"));
    let zones: Vec<String> = r.cloud.inserts().into_iter().map(|(z, _)| z).collect();
    assert_eq!(
        zones,
        ["us-east4-a", "us-east4-b"],
        "the next zone, same type"
    );
    let labels = r.labels();
    let refused = labels
        .iter()
        .find(|l| l.contains("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"))
        .unwrap_or_else(|| panic!("the late error is recorded: {labels:?}"));
    assert!(
        refused.contains("Capacity")
            || refused.contains("capacity")
            || refused.contains("does not have enough resources"),
        "{refused}"
    );
    // Nothing but the one instance carries the VM's labels.
    let live = r.cloud.live_instances();
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(live[0].0, "us-east4-b");
    let seen = r
        .provider
        .observe(&at("us-east4-a"), "trainer")
        .await
        .unwrap();
    assert!(
        seen.iter().all(
            |o| matches!(o.status, InstanceStatus::Refused(ref e) if e.kind == ErrorKind::Capacity)
        ),
        "{seen:?}"
    );
    r.cloud.server.verify();
}

#[tokio::test]
async fn the_all_regions_gpu_quota_blocks_the_cloud_and_the_next_cloud_is_used() {
    let mut world = World::default()
        .with_zones(H100, &["us-east4-a", "us-east4-b", "us-central1-a"], true)
        .with_default_image();
    world.late.push_back(all_regions_quota());
    let fake = Fake::start(world).await;
    let gcp = fake.provider();
    let lambda = Arc::new(FakeProvider::new("lambda").with_offer(
        "lambda-h100",
        "us-east-1",
        "gpu_8x_h100_sxm5",
        23.92,
    ));
    let mut vm = drive::gpu_vm(Cloud::Gcp, "H100", 8);
    vm.clouds = vec![Cloud::Gcp, Cloud::Lambda];
    vm.regions = vec!["us-east4".into(), "us-central1".into(), "us-east-1".into()];
    let mut providers = Providers::new();
    providers.insert(gcp.clone());
    providers.insert(lambda.clone());
    let journal = Arc::new(MemoryJournal::new());
    let end = drive::launch_across(
        LINEAGE,
        &vm,
        providers,
        journal.clone(),
        Arc::new(FakeConnector::default()),
    )
    .await
    .unwrap();
    let up = end
        .ready()
        .unwrap_or_else(|| panic!("{end:?} {:?}", drive::labels(&journal)));
    assert_eq!(up.location.cloud, "lambda", "every GCP offer is blocked");
    assert_eq!(
        fake.inserts().len(),
        1,
        "no other GCP zone or region was tried"
    );
    let e = gcp.observe(&at("us-east4-a"), "trainer").await.unwrap();
    let Some(InstanceStatus::Refused(err)) = e.first().map(|o| o.status.clone()) else {
        panic!("{e:?}")
    };
    assert_eq!(err.kind, ErrorKind::Quota);
    assert_eq!(
        err.block.as_deref(),
        Some(&BlockScope::Cloud {
            cloud: "gcp".into()
        })
    );
    assert!(fake.live_instances().is_empty());
    fake.server.verify();
}

#[tokio::test]
async fn a_resent_insert_with_the_same_request_id_yields_one_instance() {
    let fake = Fake::start(h100_world()).await;
    let p = fake.provider();
    let offer = p.plan(&ask(&["us-east4"])).await.unwrap().remove(0);
    let spec = spec_for("trainer", "gpuprov-0f0e0d0c-trainer-1a2b3c4d-r0-o0");
    let prep = p.prepare(&offer, &spec).await.unwrap();
    let first = p.create(&offer, &prep, &spec).await.unwrap();
    let again = p.create(&offer, &prep, &spec).await.unwrap();
    assert_eq!(first, again);
    let ins = fake.inserts();
    assert_eq!(ins.len(), 2);
    let ids: Vec<String> = fake
        .server
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/instances"))
        .map(|r| {
            r.query
                .iter()
                .find(|(k, _)| k == "requestId")
                .unwrap()
                .1
                .clone()
        })
        .collect();
    assert_eq!(ids[0], ids[1], "the same attempt sends the same requestId");
    assert!(uuid::Uuid::parse_str(&ids[0]).is_ok());
    assert_eq!(
        fake.live_instances().len(),
        1,
        "GCP answered the resend with the first operation"
    );
    fake.server.verify();
}

#[tokio::test]
async fn a_crash_after_an_insert_the_listing_does_not_show_yet_resends_it_and_gets_one_instance() {
    let mut world = h100_world();
    // The instance and its insert stay out of every listing until the insert is sent
    // again: after the crash the core sees nothing, waits the listing lag, and sends the
    // insert again with the same requestId, which GCP answers with the first operation.
    world.hide_until_resent = true;
    let fake = Fake::start(world).await;
    let provider = fake.provider();
    let mut vm = drive::gpu_vm(Cloud::Gcp, "H100", 8);
    vm.regions = vec!["us-east4".into()];
    let r = Run::new(fake, provider, vm);
    r.journal.crash_before("booting");
    assert!(r.launch().await.is_err());
    let end = r.launch().await.unwrap();
    assert!(end.ready().is_some(), "{end:?} {:?}", r.labels());
    let ids: Vec<String> = r
        .cloud
        .server
        .requests()
        .into_iter()
        .filter(|q| q.method == "POST" && q.path.ends_with("/instances"))
        .map(|q| {
            q.query
                .iter()
                .find(|(k, _)| k == "requestId")
                .unwrap()
                .1
                .clone()
        })
        .collect();
    assert_eq!(ids.len(), 2, "sent again after the crash: {ids:?}");
    assert_eq!(ids[0], ids[1], "with the same requestId");
    assert_eq!(r.cloud.live_instances().len(), 1, "one instance");
    r.cloud.server.verify();
}

#[tokio::test]
async fn the_service_account_token_comes_from_its_token_uri_and_is_refreshed_when_it_expires() {
    let fake = Fake::start(h100_world()).await;
    // The first token expires at once (within the refresh threshold), the second lasts.
    fake.tokens.state.lock().unwrap().lifetimes = VecDeque::from([1, 3600]);
    let p = fake.provider();
    let here = at("us-east4-a");
    for _ in 0..3 {
        p.observe(&here, "trainer").await.unwrap();
    }
    let issued = fake.tokens.issued();
    assert_eq!(issued.len(), 2, "one grant, then one refresh: {issued:?}");
    let bearers: Vec<String> = fake
        .server
        .requests()
        .iter()
        .map(|r| {
            r.headers
                .iter()
                .find(|(k, _)| k == "authorization")
                .unwrap()
                .1
                .clone()
        })
        .collect();
    assert_eq!(
        bearers[0],
        format!("Bearer {}", issued[0]),
        "the first call used the first token"
    );
    assert!(
        bearers[2..]
            .iter()
            .all(|b| *b == format!("Bearer {}", issued[1])),
        "{bearers:?}"
    );
    assert!(
        fake.tokens.state.lock().unwrap().refused.is_empty(),
        "every grant was a valid JWT-bearer grant"
    );
    // A key the token endpoint refuses: `invalid_grant` is a Credentials error, said so.
    let mut other = fake.settings();
    let wrong_key = sa_json_with_key(&fake.tokens.token_uri(), &other_key());
    other.credential =
        Some(GoogleCredential::from_json(&wrong_key, Source::Other("k".into())).unwrap());
    let bad = GcpProvider::new(other);
    let e = bad.observe(&here, "trainer").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Credentials, "{e}");
    assert!(e.msg.contains("invalid_grant"), "{}", e.msg);
    assert!(!e.msg.contains("PRIVATE KEY"));
    fake.server.verify();
}

/// Another RSA key (the token endpoint does not know it).
fn other_key() -> String {
    let out = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ])
        .output()
        .expect("openssl");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[tokio::test]
async fn lists_follow_next_page_token() {
    let zones: Vec<String> = (0..5)
        .map(|i| format!("us-east4-{}", (b'a' + i) as char))
        .collect();
    let zs: Vec<&str> = zones.iter().map(String::as_str).collect();
    let mut world = World::default()
        .with_zones(H100, &zs, true)
        .with_default_image();
    world.page_size = Some(2);
    let fake = Fake::start(world).await;
    let p = fake.provider();
    let offers = p.plan(&ask(&["us-east4"])).await.unwrap();
    let mut seen: Vec<&str> = offers
        .iter()
        .filter_map(|o| o.location.zone.as_deref())
        .collect();
    seen.dedup();
    assert_eq!(seen, zs, "all five zones, over three pages");
    let pages = fake
        .server
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("aggregated/acceleratorTypes"))
        .count();
    assert_eq!(pages, 3);
    // Five instances of the VM in one zone: three pages of instances.
    {
        let mut w = fake.world.lock().unwrap();
        for n in 0..5 {
            let name = format!("gpuprov-trainer-0f0e0d0c-000{n}");
            w.instances.push(("us-east4-a".into(), json!({"name": name, "status": "RUNNING",
                "labels": {"gpuprov-vm-name": "trainer", "gpuprov-lineage": LINEAGE},
                "networkInterfaces": [{"accessConfigs": [{"natIP": format!("127.0.0.{}", 20 + n)}]}]})));
        }
    }
    let got = p.observe(&at("us-east4-a"), "trainer").await.unwrap();
    assert_eq!(got.len(), 5, "{got:?}");
    let lists = fake
        .server
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("us-east4-a/instances"))
        .count();
    assert_eq!(lists, 3);
    assert!(fake
        .server
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("us-east4-a/instances"))
        .skip(1)
        .all(|r| r.query.iter().any(|(k, _)| k == "pageToken")));
    fake.server.verify();
}

#[tokio::test]
async fn the_access_token_never_appears_in_errors_or_the_journal() {
    let mut world = h100_world();
    world.echo_auth = true;
    let path = format!("{BASE}/global/images/family/ubuntu-accelerator-2204-amd64-with-nvidia-550");
    world.fault(
        "GET",
        &path.replace(BASE, "/compute/v1/projects/ubuntu-os-accelerator-images"),
        Canned::status(
            403,
            google_error(
                403,
                "forbidden",
                "PERMISSION_DENIED",
                "Required 'compute.images.useReadOnly' permission",
            ),
        ),
    );
    let r = run(world, &["us-east4"]).await;
    let end = r.launch().await.unwrap();
    let reason = match &end {
        LaunchState::Aborted { reason, .. } => reason.clone(),
        other => panic!("expected Aborted, got {other:?}"),
    };
    let issued = r.cloud.tokens.issued();
    assert!(!issued.is_empty());
    assert!(
        reason.contains("REDACTED"),
        "the echo was scrubbed: {reason}"
    );
    let persisted = serde_json::to_string(&end).unwrap();
    for text in std::iter::once(reason)
        .chain(r.labels())
        .chain([format!("{end:?}"), persisted])
    {
        assert!(!text.contains(SENTINEL), "{text}");
        assert!(!text.contains("PRIVATE KEY"), "{text}");
    }
    r.cloud.server.verify();
}

#[tokio::test]
async fn prepare_resolves_the_image_and_keeps_one_firewall_per_vm() {
    let fake = Fake::start(h100_world()).await;
    let p = fake.provider();
    let offer = p.plan(&ask(&["us-east4"])).await.unwrap().remove(0);
    let spec = spec_for("trainer", "t1");
    let prep = p.prepare(&offer, &spec).await.unwrap();
    assert_eq!(prep["image"], "https://www.googleapis.com/compute/v1/projects/ubuntu-os-accelerator-images/global/images/ubuntu-accelerator-2204-amd64-with-nvidia-550-v20261101");
    assert_eq!(prep["firewall"], "gpuprov-trainer-0f0e0d0c");
    let fw = fake.world.lock().unwrap().firewalls["gpuprov-trainer-0f0e0d0c"].clone();
    assert_eq!(
        fw["allowed"],
        json!([{"IPProtocol": "tcp", "ports": ["22", "8080"]}])
    );
    assert_eq!(fw["targetTags"], json!(["gpuprov-trainer-0f0e0d0c"]));
    // Again: read, not made twice; with another port: patched.
    p.prepare(&offer, &spec).await.unwrap();
    let posts = fake
        .server
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/firewalls"))
        .count();
    assert_eq!(posts, 1);
    let mut wider = spec.clone();
    wider.ports = vec![6443, 8080];
    p.prepare(&offer, &wider).await.unwrap();
    let fw = fake.world.lock().unwrap().firewalls["gpuprov-trainer-0f0e0d0c"].clone();
    assert_eq!(fw["allowed"][0]["ports"], json!(["22", "6443", "8080"]));
    // A configured image that does not exist is the ask's fault; a zone without the
    // machine type is that offer's.
    let mut missing = spec.clone();
    missing.image = Some("projects/nope/global/images/family/none".into());
    let e = p.prepare(&offer, &missing).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest, "{e}");
    let mut odd = spec.clone();
    odd.image = Some("just-a-name".into());
    assert_eq!(
        p.prepare(&offer, &odd).await.unwrap_err().kind,
        ErrorKind::InvalidRequest
    );
    fake.world
        .lock()
        .unwrap()
        .missing_types
        .insert(("us-east4-a".into(), "a3-highgpu-8g".into()));
    let e = p.prepare(&offer, &spec).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unavailable, "{e}");
    // cleanup removes the rule, twice is fine.
    p.cleanup(&offer.location, "trainer").await.unwrap();
    p.cleanup(&offer.location, "trainer").await.unwrap();
    assert!(fake.world.lock().unwrap().firewalls.is_empty());
    fake.server.verify();
}

#[tokio::test]
async fn a_spot_t4_insert_attaches_its_gpu_and_is_deleted_on_preemption() {
    let world = World::default()
        .with_zones("nvidia-tesla-t4", &["us-central1-a"], true)
        .with_default_image();
    let mut r = run(world, &["us-central1"]).await;
    r.vm.gpu = Some("T4".into());
    r.vm.gpu_count = 1;
    r.vm.spot = true;
    r.vm.disk_gb = Some(300);
    let end = r.launch().await.unwrap();
    let vm = end
        .ready()
        .unwrap_or_else(|| panic!("{end:?} {:?}", r.labels()));
    assert_eq!(vm.offer.instance_type, "n1-standard-8+nvidia-tesla-t4");
    assert_eq!(vm.user, "gpuprov");
    assert!(vm.ssh.host.starts_with("127.0.0."), "{}", vm.ssh.host);
    let (_, b) = r.cloud.inserts().remove(0);
    assert_eq!(
        b["machineType"],
        "zones/us-central1-a/machineTypes/n1-standard-8"
    );
    assert_eq!(
        b["guestAccelerators"],
        json!([{"acceleratorType": "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4", "acceleratorCount": 1}])
    );
    assert_eq!(b["scheduling"]["provisioningModel"], "SPOT");
    assert_eq!(b["scheduling"]["instanceTerminationAction"], "DELETE");
    assert_eq!(b["scheduling"]["onHostMaintenance"], "TERMINATE");
    assert_eq!(b["disks"][0]["initializeParams"]["diskSizeGb"], "300");
    assert_eq!(
        b["labels"],
        json!({"gpuprov-vm-name": "trainer", "gpuprov-lineage": LINEAGE})
    );
    let end = r
        .teardown(Target::new(
            vm.location.clone(),
            "trainer",
            vec![vm.instance_id.clone()],
        ))
        .await;
    assert_eq!(end, TeardownState::Done);
    assert!(r.cloud.world.lock().unwrap().instances.is_empty());
    assert!(
        r.cloud.world.lock().unwrap().firewalls.is_empty(),
        "cleanup removed the firewall"
    );
    r.cloud.server.verify();
}

#[tokio::test]
async fn a_delete_while_the_insert_still_runs_is_retried_not_taken_for_done() {
    let mut world = h100_world();
    world.capacity.clear();
    world.late.push_back(stockout("us-east4-a"));
    let fake = Fake::start(world).await;
    let p = fake.provider();
    let offer = p.plan(&ask(&["us-east4"])).await.unwrap().remove(0);
    let spec = spec_for("trainer", "t-del");
    let prep = p.prepare(&offer, &spec).await.unwrap();
    let name = p.create(&offer, &prep, &spec).await.unwrap();
    let e = p
        .delete(&offer.location, "trainer", std::slice::from_ref(&name))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient, "{e}");
    // Once the operation has ended (here: failed late), not found is done.
    for _ in 0..3 {
        p.observe(&offer.location, "trainer").await.unwrap();
    }
    p.delete(&offer.location, "trainer", &[name]).await.unwrap();
    fake.server.verify();
}

/// Every row of the error table, each in the body shape GCP really sends, through the
/// adapter's own calls against the spec-checked server: `(what the fake answers, the
/// kind, the scope it blocks)`.
#[tokio::test]
async fn every_error_row_on_gcps_own_bodies() {
    let region = |r: &str| {
        Some(BlockScope::Region {
            cloud: "gcp".into(),
            region: r.into(),
        })
    };
    let cloud = Some(BlockScope::Cloud {
        cloud: "gcp".into(),
    });
    let http =
        |s: u16, reason: &str, st: &str, m: &str| Canned::status(s, google_error(s, reason, st, m));
    let rows: Vec<(Canned, ErrorKind, Option<BlockScope>)> = vec![
        (http(503, "zoneResourcePoolExhausted", "UNAVAILABLE", "The zone 'projects/gpuprov-test/zones/us-east4-a' does not have enough resources available to fulfill the request."), ErrorKind::Capacity, None),
        (http(400, "resourceNotReady", "FAILED_PRECONDITION", "The resource 'projects/gpuprov-test/zones/us-east4-a/acceleratorTypes/nvidia-h100-80gb' is not ready"), ErrorKind::Capacity, None),
        (http(403, "quotaExceeded", "PERMISSION_DENIED", "Quota 'NVIDIA_H100_GPUS' exceeded.  Limit: 0.0 in region us-east4."), ErrorKind::Quota, region("us-east4")),
        (http(403, "quotaExceeded", "PERMISSION_DENIED", "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally."), ErrorKind::Quota, cloud.clone()),
        (http(403, "rateLimitExceeded", "PERMISSION_DENIED", "Rate Limit Exceeded"), ErrorKind::Transient, None),
        (http(403, "userRateLimitExceeded", "PERMISSION_DENIED", "User Rate Limit Exceeded"), ErrorKind::Transient, None),
        (http(429, "rateLimitExceeded", "RESOURCE_EXHAUSTED", "Too many requests").header("Retry-After", "3"), ErrorKind::Transient, None),
        (http(500, "backendError", "INTERNAL", "Internal error. Please try again or contact Google Support."), ErrorKind::Transient, None),
        (http(503, "backendError", "UNAVAILABLE", "The service is currently unavailable."), ErrorKind::Transient, None),
        (http(403, "accessNotConfigured", "PERMISSION_DENIED", "Compute Engine API has not been used in project 1 before or it is disabled."), ErrorKind::Credentials, None),
        (http(403, "forbidden", "PERMISSION_DENIED", "Required 'compute.instances.create' permission for 'projects/gpuprov-test/zones/us-east4-a/instances/x'"), ErrorKind::Credentials, None),
        (http(401, "authError", "UNAUTHENTICATED", "Request had invalid authentication credentials."), ErrorKind::Credentials, None),
        (http(400, "invalid", "INVALID_ARGUMENT", "Invalid value for field 'resource.machineType'."), ErrorKind::InvalidRequest, None),
        (http(400, "badRequest", "INVALID_ARGUMENT", "Bad request."), ErrorKind::InvalidRequest, None),
        (http(400, "somethingNew", "FAILED_PRECONDITION", "Something about resources"), ErrorKind::Failed, None),
    ];
    let fake = Fake::start(h100_world()).await;
    let p = fake.provider();
    let offer = p.plan(&ask(&["us-east4"])).await.unwrap().remove(0);
    let insert = format!("{BASE}/zones/us-east4-a/instances");
    for (n, (canned, kind, scope)) in rows.into_iter().enumerate() {
        let retry = canned.headers.iter().any(|(k, _)| k == "Retry-After");
        let what = format!("{:?}", canned.body);
        fake.world.lock().unwrap().fault("POST", &insert, canned);
        let spec = spec_for("trainer", &format!("row-{n}"));
        let prep = p.prepare(&offer, &spec).await.unwrap();
        let e = p.create(&offer, &prep, &spec).await.unwrap_err();
        assert_eq!(e.kind, kind, "{what}: {e}");
        assert_eq!(
            e.scope_for(&offer),
            scope.or_else(|| BlockScope::default_for(kind, &offer)),
            "{what}"
        );
        if retry {
            assert_eq!(e.retry_after_secs, Some(3));
        }
    }
    // The late rows: the operation's own shape.
    let late: Vec<((Value, i64), ErrorKind, Option<BlockScope>)> = vec![
        (stockout("us-east4-a"), ErrorKind::Capacity, None),
        (
            (
                json!({"errors": [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": "The zone 'projects/gpuprov-test/zones/us-east4-a' does not have enough resources available to fulfill the request.  Try a different zone, or try again later."}]}),
                503,
            ),
            ErrorKind::Capacity,
            None,
        ),
        (
            (
                json!({"errors": [{"code": "UNSUPPORTED_OPERATION", "message": "The selected machine type (a3-highgpu-8g) has a required CPU platform of Intel Sapphire Rapids. The minimum CPU platform must match this, but was ."}]}),
                400,
            ),
            ErrorKind::Capacity,
            None,
        ),
        (
            (
                json!({"errors": [{"code": "QUOTA_EXCEEDED", "message": "Quota 'NVIDIA_H100_GPUS' exceeded.  Limit: 0.0 in region us-east4.", "errorDetails": [{"quotaInfo": {"metricName": "compute.googleapis.com/nvidia_h100_gpus", "limitName": "NVIDIA-H100-GPUS-per-project-region", "dimensions": {"region": "us-east4"}, "limit": 0.0}}]}]}),
                403,
            ),
            ErrorKind::Quota,
            region("us-east4"),
        ),
        (all_regions_quota(), ErrorKind::Quota, cloud),
        (
            (
                json!({"errors": [{"code": "NEW_CODE", "message": "Something new"}]}),
                400,
            ),
            ErrorKind::Failed,
            None,
        ),
    ];
    for (n, (err, kind, scope)) in late.into_iter().enumerate() {
        let what = err.0.to_string();
        fake.world.lock().unwrap().late.push_back(err);
        let spec = spec_for("trainer", &format!("late-{n}"));
        let prep = p.prepare(&offer, &spec).await.unwrap();
        let name = p.create(&offer, &prep, &spec).await.unwrap();
        let mut found = None;
        for _ in 0..4 {
            let seen = p.observe(&offer.location, "trainer").await.unwrap();
            if let Some(InstanceStatus::Refused(e)) = seen
                .iter()
                .find(|o| o.instance_id == name)
                .map(|o| o.status.clone())
            {
                found = Some(*e);
                break;
            }
        }
        let e = found.unwrap_or_else(|| panic!("{what}: never refused"));
        assert_eq!(e.kind, kind, "{what}: {e}");
        assert_eq!(
            e.scope_for(&offer),
            scope.or_else(|| BlockScope::default_for(kind, &offer)),
            "{what}"
        );
    }
    // The token endpoint's refusal, and its transient trouble.
    fake.tokens.state.lock().unwrap().fail_next = Some((
        400,
        json!({"error": "invalid_grant", "error_description": "Invalid JWT Signature."}),
    ));
    let fresh = GcpProvider::new(fake.settings());
    let e = fresh.observe(&offer.location, "trainer").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Credentials, "{e}");
    fake.tokens.state.lock().unwrap().fail_next =
        Some((503, json!({"error": "temporarily_unavailable"})));
    let fresh = GcpProvider::new(fake.settings());
    let e = fresh.observe(&offer.location, "trainer").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient, "{e}");
    fake.server.verify();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpuprov_offers_gcp_h100_works_offline_from_the_catalog_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        assert_cmd::Command::cargo_bin("gpuprov")
            .unwrap()
            .current_dir(&path)
            .env("GPUPROV_HOME", path.join("gpuprov-home"))
            .env("HOME", path.join("home"))
            .env("NO_COLOR", "1")
            .env_remove("GPUPROV_CONFIG")
            .env_remove("GPUPROV_STATE")
            .env_remove(auth::CREDENTIALS_ENV)
            .env_remove(auth::METADATA_HOST_ENV)
            .env("CLOUDSDK_CONFIG", path.join("no-gcloud"))
            // A closed port: a call that escaped would be refused at once.
            .env("GPUPROV_GCP_ENDPOINT", "http://127.0.0.1:9")
            .args(["offers", "--cloud", "gcp", "--gpu", "H100"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("a3-highgpu-8g") && stdout.contains("us-central1-a"),
        "{stdout}"
    );
    assert!(stdout.contains("87.83"), "{stdout}");
    assert!(
        stderr.contains("gcp") && stderr.contains("built-in"),
        "says the prices are the catalog's: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpuprov_plan_with_a_service_account_lists_the_projects_zones_and_shows_no_secret() {
    let fake = Fake::start(h100_world()).await;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("sa.json");
    std::fs::write(&key, sa_json(&fake.tokens.token_uri())).unwrap();
    std::fs::write(
        dir.path().join("gpuprov.toml"),
        "[defaults]\nclouds = [\"gcp\"]\nkubernetes = false\n\n[vm.trainer]\ngpu = \"H100\"\ngpu_count = 8\nregions = [\"us-east4\"]\n",
    )
    .unwrap();
    let uri = fake.server.uri();
    let path = dir.path().to_path_buf();
    let (key2, uri2) = (key.clone(), uri.clone());
    let out = tokio::task::spawn_blocking(move || {
        let (key, uri) = (key2, uri2);
        assert_cmd::Command::cargo_bin("gpuprov")
            .unwrap()
            .current_dir(&path)
            .env("GPUPROV_HOME", path.join("gpuprov-home"))
            .env("HOME", path.join("home"))
            .env("NO_COLOR", "1")
            .env_remove("GPUPROV_CONFIG")
            .env_remove("GPUPROV_STATE")
            .env_remove(auth::METADATA_HOST_ENV)
            .env(auth::CREDENTIALS_ENV, &key)
            .env("GPUPROV_GCP_ENDPOINT", &uri)
            .args(["plan"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("no adapter for gcp in this build"),
        "target/debug/gpuprov is another checkout's build (shared CARGO_TARGET_DIR)\n{stderr}"
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("87.83"), "{stdout}");
    assert!(
        stdout.contains(&uri),
        "the endpoint override is shown: {stdout}"
    );
    let issued = fake.tokens.issued();
    assert!(
        !issued.is_empty(),
        "plan asked the project's acceleratorTypes with a token"
    );
    for text in [&stdout, &stderr] {
        assert!(
            !text.contains(SENTINEL) && !text.contains("PRIVATE KEY"),
            "{text}"
        );
    }
    for entry in std::fs::read_dir(dir.path()).unwrap().flatten() {
        if entry.path().is_file() && entry.path() != key {
            let t = std::fs::read_to_string(entry.path()).unwrap_or_default();
            assert!(
                !t.contains(SENTINEL) && !t.contains("PRIVATE KEY"),
                "{}",
                entry.path().display()
            );
        }
    }
    assert!(fake.inserts().is_empty(), "plan creates nothing");
    fake.server.verify();
}

#[tokio::test]
async fn observe_without_a_zone_reads_the_regions_instances() {
    let r = run(h100_world(), &["us-east4"]).await;
    let end = r.launch().await.unwrap();
    let vm = end.ready().unwrap();
    let region = Location {
        zone: None,
        ..vm.location.clone()
    };
    let seen = r.provider.observe(&region, "trainer").await.unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].instance_id, vm.instance_id);
    let other = Location {
        region: "us-central1".into(),
        zone: None,
        ..vm.location.clone()
    };
    assert!(r
        .provider
        .observe(&other, "trainer")
        .await
        .unwrap()
        .is_empty());
    r.cloud.server.verify();
}

/// `examples/gcp.toml` plans offline (no credential, no project lookup): both machines,
/// their offers ordered region → type → zone with the catalog's prices, and `offers --vm`
/// shows the trainer's in that order.
#[test]
fn the_gcp_example_plans_offline_with_ordered_offers_and_prices() {
    let dir = tempfile::tempdir().unwrap();
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/gcp.toml");
    let config = dir.path().join("gpuprov.toml");
    std::fs::copy(&example, &config).unwrap();
    let run = |args: &[&str]| {
        let mut cmd = assert_cmd::Command::cargo_bin("gpuprov").unwrap();
        for (k, _) in std::env::vars() {
            if k.starts_with("GOOGLE_")
                || k.starts_with("GPUPROV_")
                || k.starts_with("CLOUDSDK_")
                || k.starts_with("GCE_")
            {
                cmd.env_remove(k);
            }
        }
        cmd.current_dir(dir.path())
            .env("HOME", dir.path().join("home"))
            .env("GPUPROV_HOME", dir.path().join("gpuprov-home"))
            .env("NO_COLOR", "1")
            .env("GPUPROV_GCP_ENDPOINT", "http://127.0.0.1:9")
            .args(args)
            .timeout(Duration::from_secs(30))
            .output()
            .unwrap()
    };
    let out = run(&["plan", "--refresh=false"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("Plan: 2 to add"), "{stdout}");
    // Cheapest first offers: a3-highgpu-8g ($87.8325) + spot a2-highgpu-8g ($11.5436).
    assert!(stdout.contains("$99.38/h"), "{stdout}");
    let out = run(&["offers", "--vm", "trainer", "--json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let rows: Vec<Value> = serde_json::from_str(&stdout).unwrap();
    let ids: Vec<&str> = rows.iter().map(|r| r["id"].as_str().unwrap()).collect();
    let mut want = vec![];
    for (region, zones) in [
        ("us-east4", "abc"),
        ("us-central1", "abc"),
        ("europe-west4", "bc"),
    ] {
        for t in ["a3-highgpu-8g", "a3-megagpu-8g"] {
            for z in zones.chars() {
                want.push(format!("gcp/{region}/{t}/{region}-{z}"));
            }
        }
    }
    assert_eq!(
        ids, want,
        "region as listed, then type cheapest first, then zone"
    );
    assert!(rows
        .iter()
        .all(|r| r["price_per_hour"].as_f64().unwrap() <= 95.0));
}

#[tokio::test]
async fn a_gcloud_user_login_refreshes_its_token_at_its_token_uri_and_never_shows_it() {
    let mut world = h100_world();
    world.echo_auth = true;
    world.fault(
        "GET",
        &format!("{BASE}/zones/us-east4-a/instances"),
        Canned::status(
            500,
            google_error(500, "backendError", "INTERNAL", "Internal error"),
        ),
    );
    let fake = Fake::start(world).await;
    let adc = json!({
        "type": "authorized_user",
        "client_id": USER_CLIENT_ID,
        "client_secret": USER_CLIENT_SECRET,
        "refresh_token": USER_REFRESH_TOKEN,
        "token_uri": fake.tokens.token_uri(),
        "quota_project_id": PROJECT,
    });
    let cred =
        GoogleCredential::from_json(&adc.to_string(), Source::Other("gcloud".into())).unwrap();
    let settings = GcpSettings::with_credential(
        LINEAGE.parse().unwrap(),
        Some(fake.server.uri()),
        None,
        Some(cred),
    );
    assert_eq!(
        settings.project.as_deref(),
        Some(PROJECT),
        "the login's quota project"
    );
    let p = GcpProvider::new(settings);
    let e = p.observe(&at("us-east4-a"), "trainer").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient);
    assert!(
        e.msg.contains("REDACTED"),
        "the echoed token was scrubbed: {}",
        e.msg
    );
    for s in [SENTINEL, USER_CLIENT_SECRET, USER_REFRESH_TOKEN] {
        assert!(!e.msg.contains(s), "{}", e.msg);
    }
    assert!(p
        .observe(&at("us-east4-a"), "trainer")
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        fake.tokens.issued().len(),
        1,
        "one refresh grant, the token reused"
    );
    assert!(fake.tokens.state.lock().unwrap().refused.is_empty());
    fake.server.verify();
}
