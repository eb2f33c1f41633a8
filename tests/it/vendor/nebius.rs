//! The Nebius adapter against a local Nebius: a tonic server built from the server stubs
//! generated from the vendor's own protos (the same `proto/` the client is generated
//! from), so every request is decoded by the vendor's types, with real in-memory state:
//! instances move CREATING → STARTING → RUNNING, operations end later and can fail late
//! with `not_enough_resources`, quota and rate-limit errors carry the vendor's
//! `ServiceError` details, a resent create with the same `x-idempotency-key` is answered
//! with the first operation, and the token exchange checks the JWT's RS256 signature and
//! claims before issuing short-lived IAM tokens. It also checks what the protos' validation
//! annotations require of a create (`buf.validate` required fields, interface name
//! pattern, the 32 KiB user-data limit). Public addresses are 127.0.0.x; nothing is
//! dialled (SSH is the `FakeConnector`).

// The generated service traits answer `tonic::Status`, whatever its size.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpuprov::provider::kit::credentials::Source;
use gpuprov::provider::kit::CredentialReport;
use gpuprov::provider::clouds::nebius::auth::{self, Credential, ServiceAccount};
use gpuprov::provider::clouds::nebius::proto::google::rpc::Status as RpcStatus;
use gpuprov::provider::clouds::nebius::proto::nebius::common::v1 as common;
use gpuprov::provider::clouds::nebius::proto::nebius::compute::v1 as compute;
use gpuprov::provider::clouds::nebius::proto::nebius::iam::v1 as iam;
use gpuprov::provider::clouds::nebius::proto::nebius::vpc::v1 as vpc;
use gpuprov::provider::clouds::nebius::{NebiusProvider, NebiusSettings};
use gpuprov::provider::{
    CloudProvider, ErrorKind, InstanceStatus, Lineage, Location, ResourceRequest, Secret,
};
use gpuprov::vm::{Target, TeardownState};
use prost::Message as _;
use tonic::{Request, Response, Status};

use crate::support::drive::{self, LINEAGE};

/// The private key of the test service account (a test-only RSA key, shared with the GCP
/// tests).
pub(crate) const KEY_PEM: &str = include_str!("../../fixtures/gcp/test-only-sa-key.pem");
const PUB_PEM: &str = include_str!("../../fixtures/gcp/test-only-sa-key.pub.pem");
pub(crate) const SA_ID: &str = "serviceaccount-e00testsa";
pub(crate) const KEY_ID: &str = "publickey-e00testkey";
/// Every IAM token the server issues starts with this: never in any error or output.
pub(crate) const SENTINEL: &str = "nebius_iam_token_sentinel_5e1f";
pub(crate) const H100: &str = "gpu-h100-sxm";
pub(crate) const PRESET8: &str = "8gpu-128vcpu-1600gb";
pub(crate) const PRESET1: &str = "1gpu-16vcpu-200gb";

/// A failure the server answers instead of a call.
#[derive(Clone)]
pub(crate) struct Canned {
    pub code: tonic::Code,
    pub message: String,
    pub details: Option<common::service_error::Details>,
    pub retry: common::service_error::RetryType,
    pub pushback_ms: Option<u64>,
}

impl Canned {
    pub(crate) fn new(code: tonic::Code, message: &str) -> Canned {
        Canned {
            code,
            message: message.into(),
            details: None,
            retry: common::service_error::RetryType::Unspecified,
            pushback_ms: None,
        }
    }
    pub(crate) fn details(mut self, d: common::service_error::Details) -> Canned {
        self.details = Some(d);
        self
    }
    pub(crate) fn retry(mut self, r: common::service_error::RetryType) -> Canned {
        self.retry = r;
        self
    }
    fn service_error(&self) -> Vec<prost_types::Any> {
        self.details
            .clone()
            .map(|d| prost_types::Any {
                type_url: "type.googleapis.com/nebius.common.v1.ServiceError".into(),
                value: common::ServiceError {
                    service: "compute".into(),
                    code: "Test".into(),
                    details: Some(d),
                    retry_type: self.retry as i32,
                }
                .encode_to_vec(),
            })
            .into_iter()
            .collect()
    }
    fn status(&self) -> Status {
        let details = RpcStatus {
            code: self.code as i32,
            message: self.message.clone(),
            details: self.service_error(),
        }
        .encode_to_vec();
        let mut md = tonic::metadata::MetadataMap::new();
        if let Some(ms) = self.pushback_ms {
            md.insert("grpc-retry-pushback-ms", ms.to_string().parse().unwrap());
        }
        Status::with_details_and_metadata(self.code, &self.message, details.into(), md)
    }
    fn rpc_status(&self) -> RpcStatus {
        RpcStatus {
            code: self.code as i32,
            message: self.message.clone(),
            details: self.service_error(),
        }
    }
}

/// Nebius' capacity error, as a late operation failure or a call's answer.
pub(crate) fn no_capacity() -> Canned {
    Canned::new(tonic::Code::ResourceExhausted, "Not enough resources")
        .details(common::service_error::Details::NotEnoughResources(
            common::NotEnoughResources {
                violations: vec![common::not_enough_resources::Violation {
                    resource_type: "gpu-h100-sxm".into(),
                    message: "not enough free GPUs of the platform in the region".into(),
                    requested: "8".into(),
                }],
            },
        ))
        .retry(common::service_error::RetryType::UnitOfWork)
}

/// Nebius' quota error.
pub(crate) fn quota() -> Canned {
    Canned::new(tonic::Code::ResourceExhausted, "Quota exceeded")
        .details(common::service_error::Details::QuotaFailure(
            common::QuotaFailure {
                violations: vec![common::quota_failure::Violation {
                    quota: "compute.instance.gpu.h100".into(),
                    message: "Quota limit exceeded".into(),
                    limit: "0".into(),
                    requested: "8".into(),
                }],
            },
        ))
        .retry(common::service_error::RetryType::Nothing)
}

/// Nebius' rate limit, with gRPC's retry pushback of `ms`.
pub(crate) fn rate_limited(ms: u64) -> Canned {
    let mut c = Canned::new(tonic::Code::ResourceExhausted, "Too many requests")
        .details(common::service_error::Details::TooManyRequests(
            common::TooManyRequests {
                violation: "compute.instance.create rate".into(),
            },
        ))
        .retry(common::service_error::RetryType::Call);
    c.pushback_ms = Some(ms);
    c
}

struct Op {
    op: common::Operation,
    done_at: Instant,
    outcome: Option<Canned>,
    /// What finishing does (the instance created or deleted).
    on_done: OnDone,
}

#[derive(Clone)]
enum OnDone {
    Nothing,
    Created(String),
    Deleted(String),
}

/// The fake Nebius tenant.
pub(crate) struct World {
    /// region → project.
    pub projects: BTreeMap<String, String>,
    /// project → platforms listed (with presets).
    pub platforms: BTreeMap<String, Vec<compute::Platform>>,
    pub subnets: BTreeMap<String, Vec<vpc::Subnet>>,
    pub families: Vec<String>,
    pub instances: BTreeMap<String, compute::Instance>,
    /// instance id → when it runs.
    running_at: BTreeMap<String, Instant>,
    ops: BTreeMap<String, Op>,
    idempotency: BTreeMap<String, String>,
    pub groups: BTreeMap<String, vpc::SecurityGroup>,
    pub rules: BTreeMap<String, vpc::SecurityRule>,
    /// method → failures its next calls answer, in order.
    pub faults: BTreeMap<&'static str, VecDeque<Canned>>,
    /// Late failures of the next creates' operations.
    pub late: VecDeque<Canned>,
    /// How long a create's operation runs, and from its end to RUNNING.
    pub op_time: Duration,
    pub boot_time: Duration,
    /// Lifetime of the tokens issued, seconds.
    pub expires_in: i64,
    tokens: BTreeMap<String, Instant>,
    /// Tokens refused as expired, and JWTs refused.
    pub refused_tokens: usize,
    pub exchanges: usize,
    /// Every call, in order, by method.
    pub calls: Vec<&'static str>,
    /// Every create request received.
    pub creates: Vec<compute::CreateInstanceRequest>,
    /// Every `authorization` and `x-idempotency-key` value received.
    pub headers: Vec<(String, String)>,
    /// Errors echo the `authorization` header (a hostile server).
    pub echo_auth: bool,
    next: u32,
}

impl Default for World {
    fn default() -> World {
        World {
            projects: BTreeMap::new(),
            platforms: BTreeMap::new(),
            subnets: BTreeMap::new(),
            families: vec!["ubuntu22.04-cuda12".into()],
            instances: BTreeMap::new(),
            running_at: BTreeMap::new(),
            ops: BTreeMap::new(),
            idempotency: BTreeMap::new(),
            groups: BTreeMap::new(),
            rules: BTreeMap::new(),
            faults: BTreeMap::new(),
            late: VecDeque::new(),
            op_time: Duration::from_millis(30),
            boot_time: Duration::from_millis(30),
            expires_in: 3600,
            tokens: BTreeMap::new(),
            refused_tokens: 0,
            exchanges: 0,
            calls: vec![],
            creates: vec![],
            headers: vec![],
            echo_auth: false,
            next: 0,
        }
    }
}

fn meta(id: &str, parent: &str, name: &str) -> common::ResourceMetadata {
    common::ResourceMetadata {
        id: id.into(),
        parent_id: parent.into(),
        name: name.into(),
        ..Default::default()
    }
}

/// A platform with `presets` (name, GPUs), allowed for preemptibles.
pub(crate) fn platform(name: &str, presets: &[(&str, i32)]) -> compute::Platform {
    compute::Platform {
        metadata: Some(meta(&format!("platform-{name}"), "", name)),
        spec: Some(compute::PlatformSpec {
            presets: presets
                .iter()
                .map(|(p, g)| compute::Preset {
                    name: p.to_string(),
                    resources: Some(compute::PresetResources {
                        vcpu_count: 16 * g,
                        memory_gibibytes: 200 * g,
                        gpu_count: *g,
                        ..Default::default()
                    }),
                    allow_gpu_clustering: *g == 8,
                })
                .collect(),
            ..Default::default()
        }),
        status: Some(compute::PlatformStatus {
            allowed_for_preemptibles: true,
        }),
    }
}

impl World {
    /// A project in `region` whose platforms are `platforms`, with a default subnet.
    pub(crate) fn with_project(
        mut self,
        region: &str,
        project: &str,
        platforms: Vec<compute::Platform>,
    ) -> World {
        self.projects.insert(region.into(), project.into());
        self.platforms.insert(project.into(), platforms);
        self.subnets.insert(
            project.into(),
            vec![vpc::Subnet {
                metadata: Some(meta(
                    &format!("vpcsubnet-{project}"),
                    project,
                    &format!("default-subnet-{region}"),
                )),
                spec: Some(vpc::SubnetSpec {
                    network_id: format!("vpcnetwork-{project}"),
                    ..Default::default()
                }),
                ..Default::default()
            }],
        );
        self
    }

    /// The next call of `method` answers `c`.
    pub(crate) fn fault(&mut self, method: &'static str, c: Canned) {
        self.faults.entry(method).or_default().push_back(c);
    }

    fn id(&mut self, kind: &str) -> String {
        self.next += 1;
        format!("{kind}-e00{:06}", self.next)
    }

    /// Moves time forward: operations that are due end, instances that are due run.
    fn tick(&mut self) {
        let now = Instant::now();
        let due: Vec<String> = self
            .ops
            .iter()
            .filter(|(_, o)| o.op.status.is_none() && o.done_at <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for k in due {
            let (outcome, on_done) = {
                let o = &self.ops[&k];
                (o.outcome.clone(), o.on_done.clone())
            };
            let status = match &outcome {
                Some(c) => c.rpc_status(),
                None => RpcStatus::default(),
            };
            match (on_done, outcome.is_some()) {
                (OnDone::Created(id), false) => {
                    self.set_state(&id, compute::instance_status::InstanceState::Starting);
                    self.running_at.insert(id, now + self.boot_time);
                }
                // A create that fails late leaves nothing behind.
                (OnDone::Created(id), true) => {
                    self.instances.remove(&id);
                }
                (OnDone::Deleted(id), _) => {
                    self.instances.remove(&id);
                    self.running_at.remove(&id);
                }
                (OnDone::Nothing, _) => {}
            }
            self.ops.get_mut(&k).unwrap().op.status = Some(status);
        }
        let up: Vec<String> = self
            .running_at
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for id in up {
            self.running_at.remove(&id);
            self.set_state(&id, compute::instance_status::InstanceState::Running);
            let n = self.next % 200 + 20;
            if let Some(i) = self.instances.get_mut(&id) {
                i.status.as_mut().unwrap().network_interfaces =
                    vec![compute::NetworkInterfaceStatus {
                        name: "eth0".into(),
                        public_ip_address: Some(compute::PublicIpAddressStatus {
                            address: format!("127.0.0.{n}/32"),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }];
            }
        }
    }

    pub(crate) fn set_state(&mut self, id: &str, s: compute::instance_status::InstanceState) {
        if let Some(i) = self.instances.get_mut(id) {
            i.status.get_or_insert_with(Default::default).state = s as i32;
        }
    }

    fn operation(
        &mut self,
        resource: &str,
        outcome: Option<Canned>,
        on_done: OnDone,
        wait: Duration,
    ) -> common::Operation {
        let id = self.id("computeoperation");
        let op = common::Operation {
            id: id.clone(),
            resource_id: resource.into(),
            ..Default::default()
        };
        self.ops.insert(
            id,
            Op {
                op: op.clone(),
                done_at: Instant::now() + wait,
                outcome,
                on_done,
            },
        );
        self.tick();
        op
    }

    /// Instances of ours (not being deleted).
    pub(crate) fn live(&self) -> Vec<&compute::Instance> {
        self.instances
            .values()
            .filter(|i| {
                i.status.as_ref().map(|s| s.state)
                    != Some(compute::instance_status::InstanceState::Deleting as i32)
            })
            .collect()
    }
}

/// The server: every service of the world.
#[derive(Clone)]
struct Nebius(Arc<Mutex<World>>);

fn bad(field: &str, message: &str) -> Status {
    Canned::new(tonic::Code::InvalidArgument, &format!("{field}: {message}"))
        .details(common::service_error::Details::BadRequest(
            common::BadRequest {
                violations: vec![common::bad_request::Violation {
                    field: field.into(),
                    message: message.into(),
                    ..Default::default()
                }],
            },
        ))
        .status()
}

fn not_found(id: &str) -> Status {
    Canned::new(tonic::Code::NotFound, &format!("{id} not found"))
        .details(common::service_error::Details::ResourceNotFound(
            common::ResourceNotFound {
                resource_id: id.into(),
            },
        ))
        .status()
}

impl Nebius {
    /// Checks the bearer token and the method's scripted faults; returns the world.
    fn enter<T>(
        &self,
        method: &'static str,
        req: &Request<T>,
    ) -> Result<std::sync::MutexGuard<'_, World>, Status> {
        let mut w = self.0.lock().unwrap();
        w.calls.push(method);
        let auth = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        if let Some(k) = req
            .metadata()
            .get("x-idempotency-key")
            .and_then(|v| v.to_str().ok())
        {
            w.headers.push(("x-idempotency-key".into(), k.into()));
        }
        w.headers.push(("authorization".into(), auth.clone()));
        let echo = if w.echo_auth {
            format!(" (got {auth})")
        } else {
            String::new()
        };
        let live = auth
            .strip_prefix("Bearer ")
            .and_then(|t| w.tokens.get(t))
            .is_some_and(|until| Instant::now() < *until);
        if !live {
            w.refused_tokens += 1;
            return Err(Status::unauthenticated(format!(
                "invalid or expired token{echo}"
            )));
        }
        if let Some(c) = w.faults.get_mut(method).and_then(VecDeque::pop_front) {
            let mut c = c;
            c.message.push_str(&echo);
            return Err(c.status());
        }
        w.tick();
        Ok(w)
    }
}

fn page<T: Clone>(items: Vec<T>, size: i64, token: &str) -> (Vec<T>, String) {
    let start: usize = token.parse().unwrap_or(0);
    let size = if size <= 0 { 100 } else { size as usize };
    let end = (start + size).min(items.len());
    let next = if end < items.len() {
        end.to_string()
    } else {
        String::new()
    };
    (items[start.min(end)..end].to_vec(), next)
}

fn project_of(w: &World, parent: &str) -> Result<(), Status> {
    if w.projects.values().any(|p| p == parent) {
        Ok(())
    } else {
        Err(not_found(parent))
    }
}

#[tonic::async_trait]
impl iam::token_exchange_service_server::TokenExchangeService for Nebius {
    async fn exchange(
        &self,
        req: Request<iam::ExchangeTokenRequest>,
    ) -> Result<Response<iam::CreateTokenResponse>, Status> {
        let mut w = self.0.lock().unwrap();
        w.calls.push("TokenExchangeService/Exchange");
        let r = req.into_inner();
        if r.grant_type != auth::GRANT_TYPE
            || r.subject_token_type != auth::SUBJECT_TOKEN_TYPE
            || r.requested_token_type != auth::REQUESTED_TOKEN_TYPE
        {
            return Err(Status::invalid_argument("unsupported token exchange"));
        }
        let header = jsonwebtoken::decode_header(&r.subject_token)
            .map_err(|_| Status::unauthenticated("not a JWT"))?;
        if header.alg != jsonwebtoken::Algorithm::RS256 || header.kid.as_deref() != Some(KEY_ID) {
            w.refused_tokens += 1;
            return Err(Status::unauthenticated("unknown public key"));
        }
        let key = jsonwebtoken::DecodingKey::from_rsa_pem(PUB_PEM.as_bytes()).unwrap();
        let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
        v.set_audience(&[auth::JWT_AUDIENCE]);
        v.set_issuer(&[SA_ID]);
        v.set_required_spec_claims(&["exp", "iat", "iss", "sub", "aud"]);
        let claims = match jsonwebtoken::decode::<auth::Claims>(&r.subject_token, &key, &v) {
            Ok(d) => d.claims,
            Err(e) => {
                w.refused_tokens += 1;
                return Err(Status::unauthenticated(format!("JWT refused: {e}")));
            }
        };
        if claims.sub != claims.iss || claims.exp.saturating_sub(claims.iat) > 300 {
            return Err(Status::unauthenticated("bad claims"));
        }
        w.exchanges += 1;
        let n = w.exchanges;
        let token = format!("{SENTINEL}-{n}");
        let life = w.expires_in;
        w.tokens.insert(
            token.clone(),
            Instant::now() + Duration::from_secs(life.max(0) as u64),
        );
        Ok(Response::new(iam::CreateTokenResponse {
            access_token: token,
            issued_token_type: auth::REQUESTED_TOKEN_TYPE.into(),
            token_type: "Bearer".into(),
            expires_in: life,
            scopes: vec![],
        }))
    }
}

#[tonic::async_trait]
impl compute::platform_service_server::PlatformService for Nebius {
    async fn list(
        &self,
        req: Request<compute::ListPlatformsRequest>,
    ) -> Result<Response<compute::ListPlatformsResponse>, Status> {
        let w = self.enter("PlatformService/List", &req)?;
        let r = req.into_inner();
        project_of(&w, &r.parent_id)?;
        let all = w.platforms.get(&r.parent_id).cloned().unwrap_or_default();
        let (items, next) = page(all, r.page_size, &r.page_token);
        Ok(Response::new(compute::ListPlatformsResponse {
            items,
            next_page_token: next,
        }))
    }
}

#[tonic::async_trait]
impl compute::image_service_server::ImageService for Nebius {
    async fn get_latest_by_family(
        &self,
        req: Request<compute::GetImageLatestByFamilyRequest>,
    ) -> Result<Response<compute::Image>, Status> {
        let w = self.enter("ImageService/GetLatestByFamily", &req)?;
        let family = req.into_inner().image_family;
        if !w.families.contains(&family) {
            return Err(not_found(&family));
        }
        Ok(Response::new(compute::Image {
            metadata: Some(meta(
                &format!("computeimage-{family}"),
                "project-public",
                &family,
            )),
            ..Default::default()
        }))
    }
}

#[tonic::async_trait]
impl vpc::subnet_service_server::SubnetService for Nebius {
    async fn list(
        &self,
        req: Request<vpc::ListSubnetsRequest>,
    ) -> Result<Response<vpc::ListSubnetsResponse>, Status> {
        let w = self.enter("SubnetService/List", &req)?;
        let r = req.into_inner();
        project_of(&w, &r.parent_id)?;
        let all = w.subnets.get(&r.parent_id).cloned().unwrap_or_default();
        let (items, next) = page(all, r.page_size, &r.page_token);
        Ok(Response::new(vpc::ListSubnetsResponse {
            items,
            next_page_token: next,
        }))
    }
}

#[tonic::async_trait]
impl vpc::security_group_service_server::SecurityGroupService for Nebius {
    async fn get_by_name(
        &self,
        req: Request<vpc::GetSecurityGroupByNameRequest>,
    ) -> Result<Response<vpc::SecurityGroup>, Status> {
        let w = self.enter("SecurityGroupService/GetByName", &req)?;
        let r = req.into_inner();
        w.groups
            .values()
            .find(|g| {
                g.metadata
                    .as_ref()
                    .is_some_and(|m| m.parent_id == r.parent_id && m.name == r.name)
            })
            .cloned()
            .map(Response::new)
            .ok_or_else(|| not_found(&r.name))
    }

    async fn create(
        &self,
        req: Request<vpc::CreateSecurityGroupRequest>,
    ) -> Result<Response<common::Operation>, Status> {
        let mut w = self.enter("SecurityGroupService/Create", &req)?;
        let r = req.into_inner();
        let m = r.metadata.ok_or_else(|| bad("metadata", "required"))?;
        project_of(&w, &m.parent_id)?;
        if r.spec.as_ref().is_none_or(|s| s.network_id.is_empty()) {
            return Err(bad("spec.network_id", "required"));
        }
        let id = w.id("vpcsecuritygroup");
        let mut md = m.clone();
        md.id = id.clone();
        w.groups.insert(
            id.clone(),
            vpc::SecurityGroup {
                metadata: Some(md),
                spec: r.spec,
                ..Default::default()
            },
        );
        let op = w.operation(&id, None, OnDone::Nothing, Duration::ZERO);
        Ok(Response::new(op))
    }

    async fn delete(
        &self,
        req: Request<vpc::DeleteSecurityGroupRequest>,
    ) -> Result<Response<common::Operation>, Status> {
        let mut w = self.enter("SecurityGroupService/Delete", &req)?;
        let id = req.into_inner().id;
        if !w.groups.contains_key(&id) {
            return Err(not_found(&id));
        }
        let attached = w.instances.values().any(|i| {
            i.spec.as_ref().is_some_and(|s| {
                s.network_interfaces
                    .iter()
                    .any(|n| n.security_groups.iter().any(|g| g.id == id))
            })
        });
        if attached {
            return Err(Status::failed_precondition(format!(
                "security group {id} is used by an instance"
            )));
        }
        w.groups.remove(&id);
        w.rules
            .retain(|_, r| r.metadata.as_ref().is_none_or(|m| m.parent_id != id));
        Ok(Response::new(w.operation(
            &id,
            None,
            OnDone::Nothing,
            Duration::ZERO,
        )))
    }
}

#[tonic::async_trait]
impl vpc::security_rule_service_server::SecurityRuleService for Nebius {
    async fn list(
        &self,
        req: Request<vpc::ListSecurityRulesRequest>,
    ) -> Result<Response<vpc::ListSecurityRulesResponse>, Status> {
        let w = self.enter("SecurityRuleService/List", &req)?;
        let r = req.into_inner();
        let all: Vec<vpc::SecurityRule> = w
            .rules
            .values()
            .filter(|x| {
                x.metadata
                    .as_ref()
                    .is_some_and(|m| m.parent_id == r.parent_id)
            })
            .cloned()
            .collect();
        let (items, next) = page(all, r.page_size, &r.page_token);
        Ok(Response::new(vpc::ListSecurityRulesResponse {
            items,
            next_page_token: next,
        }))
    }

    async fn create(
        &self,
        req: Request<vpc::CreateSecurityRuleRequest>,
    ) -> Result<Response<common::Operation>, Status> {
        let mut w = self.enter("SecurityRuleService/Create", &req)?;
        let r = req.into_inner();
        let m = r.metadata.ok_or_else(|| bad("metadata", "required"))?;
        if !w.groups.contains_key(&m.parent_id) {
            return Err(not_found(&m.parent_id));
        }
        let spec = r.spec.ok_or_else(|| bad("spec", "required"))?;
        if spec.access == 0 || spec.protocol == 0 || spec.r#match.is_none() {
            return Err(bad(
                "spec",
                "access, protocol and ingress or egress are required",
            ));
        }
        let id = w.id("vpcsecurityrule");
        let mut md = m;
        md.id = id.clone();
        w.rules.insert(
            id.clone(),
            vpc::SecurityRule {
                metadata: Some(md),
                spec: Some(spec),
                ..Default::default()
            },
        );
        Ok(Response::new(w.operation(
            &id,
            None,
            OnDone::Nothing,
            Duration::ZERO,
        )))
    }

    async fn delete(
        &self,
        req: Request<vpc::DeleteSecurityRuleRequest>,
    ) -> Result<Response<common::Operation>, Status> {
        let mut w = self.enter("SecurityRuleService/Delete", &req)?;
        let id = req.into_inner().id;
        w.rules.remove(&id).ok_or_else(|| not_found(&id))?;
        Ok(Response::new(w.operation(
            &id,
            None,
            OnDone::Nothing,
            Duration::ZERO,
        )))
    }
}

/// What the protos' validation annotations require of a create.
fn validate_create(r: &compute::CreateInstanceRequest) -> Result<(), Status> {
    let m = r
        .metadata
        .as_ref()
        .ok_or_else(|| bad("metadata", "required"))?;
    if m.parent_id.is_empty() {
        return Err(bad("metadata.parent_id", "required"));
    }
    let s = r.spec.as_ref().ok_or_else(|| bad("spec", "required"))?;
    let res = s
        .resources
        .as_ref()
        .ok_or_else(|| bad("spec.resources", "required"))?;
    if res.platform.is_empty() || res.size.is_none() {
        return Err(bad("spec.resources", "platform and preset are required"));
    }
    let disk = s
        .boot_disk
        .as_ref()
        .ok_or_else(|| bad("spec.boot_disk", "required"))?;
    if disk.attach_mode == 0 || disk.r#type.is_none() {
        return Err(bad("spec.boot_disk", "attach_mode and a disk are required"));
    }
    if s.network_interfaces.is_empty() || s.network_interfaces.len() > 8 {
        return Err(bad("spec.network_interfaces", "1 to 8 required"));
    }
    for n in &s.network_interfaces {
        let name_ok = !n.name.is_empty()
            && n.name.len() <= 60
            && n.name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !n.name.starts_with('-');
        if n.subnet_id.is_empty() || !name_ok || n.ip_address.is_none() {
            return Err(bad(
                "spec.network_interfaces",
                "subnet_id, a valid name and ip_address are required",
            ));
        }
    }
    if s.cloud_init_user_data.len() > 32768 {
        return Err(bad("spec.cloud_init_user_data", "at most 32768 characters"));
    }
    if let Some(p) = &s.preemptible {
        if p.on_preemption == 0 {
            return Err(bad("spec.preemptible.on_preemption", "required"));
        }
    }
    Ok(())
}

#[tonic::async_trait]
impl compute::instance_service_server::InstanceService for Nebius {
    async fn get_by_name(
        &self,
        req: Request<common::GetByNameRequest>,
    ) -> Result<Response<compute::Instance>, Status> {
        let w = self.enter("InstanceService/GetByName", &req)?;
        let r = req.into_inner();
        w.instances
            .values()
            .find(|i| {
                i.metadata
                    .as_ref()
                    .is_some_and(|m| m.parent_id == r.parent_id && m.name == r.name)
            })
            .cloned()
            .map(Response::new)
            .ok_or_else(|| not_found(&r.name))
    }

    async fn list(
        &self,
        req: Request<compute::ListInstancesRequest>,
    ) -> Result<Response<compute::ListInstancesResponse>, Status> {
        let w = self.enter("InstanceService/List", &req)?;
        let r = req.into_inner();
        project_of(&w, &r.parent_id)?;
        let all: Vec<compute::Instance> = w
            .instances
            .values()
            .filter(|i| {
                i.metadata
                    .as_ref()
                    .is_some_and(|m| m.parent_id == r.parent_id)
            })
            .cloned()
            .collect();
        let (items, next) = page(all, r.page_size, &r.page_token);
        Ok(Response::new(compute::ListInstancesResponse {
            items,
            next_page_token: next,
        }))
    }

    async fn create(
        &self,
        req: Request<compute::CreateInstanceRequest>,
    ) -> Result<Response<common::Operation>, Status> {
        let key = req
            .metadata()
            .get("x-idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        // Recorded before the scripted faults: a refused create was still sent.
        self.0.lock().unwrap().creates.push(req.get_ref().clone());
        let mut w = self.enter("InstanceService/Create", &req)?;
        let r = req.into_inner();
        if let Some(op) = key.as_ref().and_then(|k| w.idempotency.get(k)) {
            let op = w.ops[op].op.clone();
            return Ok(Response::new(op));
        }
        validate_create(&r)?;
        let m = r.metadata.clone().unwrap();
        project_of(&w, &m.parent_id)?;
        let taken = w.instances.values().any(|i| {
            i.metadata
                .as_ref()
                .is_some_and(|x| x.parent_id == m.parent_id && x.name == m.name)
        });
        if taken {
            return Err(Canned::new(
                tonic::Code::AlreadyExists,
                &format!("instance {} exists", m.name),
            )
            .details(common::service_error::Details::ResourceAlreadyExists(
                common::ResourceAlreadyExists::default(),
            ))
            .status());
        }
        let id = w.id("computeinstance");
        let mut md = m;
        md.id = id.clone();
        w.instances.insert(
            id.clone(),
            compute::Instance {
                metadata: Some(md),
                spec: r.spec.clone(),
                status: Some(compute::InstanceStatus {
                    state: compute::instance_status::InstanceState::Creating as i32,
                    ..Default::default()
                }),
            },
        );
        let late = w.late.pop_front();
        let wait = w.op_time;
        let op = w.operation(&id, late, OnDone::Created(id.clone()), wait);
        if let Some(k) = key {
            w.idempotency.insert(k, op.id.clone());
        }
        Ok(Response::new(op))
    }

    async fn delete(
        &self,
        req: Request<compute::DeleteInstanceRequest>,
    ) -> Result<Response<common::Operation>, Status> {
        let mut w = self.enter("InstanceService/Delete", &req)?;
        let id = req.into_inner().id;
        if !w.instances.contains_key(&id) {
            return Err(not_found(&id));
        }
        let creating = w
            .ops
            .values()
            .any(|o| o.op.status.is_none() && matches!(&o.on_done, OnDone::Created(x) if *x == id));
        if creating {
            return Err(
                Canned::new(tonic::Code::FailedPrecondition, "an operation is running")
                    .details(common::service_error::Details::OperationConflict(
                        common::OperationConflict {
                            conflicting_operation_id: "computeoperation-running".into(),
                            resource_id: id.clone(),
                        },
                    ))
                    .retry(common::service_error::RetryType::Call)
                    .status(),
            );
        }
        w.set_state(&id, compute::instance_status::InstanceState::Deleting);
        let wait = w.op_time;
        Ok(Response::new(w.operation(
            &id,
            None,
            OnDone::Deleted(id.clone()),
            wait,
        )))
    }

    async fn start(
        &self,
        req: Request<compute::StartInstanceRequest>,
    ) -> Result<Response<common::Operation>, Status> {
        let mut w = self.enter("InstanceService/Start", &req)?;
        let id = req.into_inner().id;
        if !w.instances.contains_key(&id) {
            return Err(not_found(&id));
        }
        w.set_state(&id, compute::instance_status::InstanceState::Starting);
        let at = Instant::now() + w.boot_time;
        w.running_at.insert(id.clone(), at);
        Ok(Response::new(w.operation(
            &id,
            None,
            OnDone::Nothing,
            Duration::ZERO,
        )))
    }
}

#[tonic::async_trait]
impl common::operation_service_server::OperationService for Nebius {
    async fn get(
        &self,
        req: Request<common::GetOperationRequest>,
    ) -> Result<Response<common::Operation>, Status> {
        let w = self.enter("OperationService/Get", &req)?;
        let id = req.into_inner().id;
        w.ops
            .get(&id)
            .map(|o| Response::new(o.op.clone()))
            .ok_or_else(|| not_found(&id))
    }
}

/// A running local Nebius.
pub(crate) struct Fake {
    pub world: Arc<Mutex<World>>,
    pub url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Fake {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

impl Fake {
    /// Serves `world` on a loopback port, on its own thread and runtime.
    pub(crate) fn start(world: World) -> Fake {
        use compute::image_service_server::ImageServiceServer;
        use compute::instance_service_server::InstanceServiceServer;
        use compute::platform_service_server::PlatformServiceServer;
        let world = Arc::new(Mutex::new(world));
        let svc = Nebius(world.clone());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                tonic::transport::Server::builder()
                    .add_service(InstanceServiceServer::new(svc.clone()))
                    .add_service(PlatformServiceServer::new(svc.clone()))
                    .add_service(ImageServiceServer::new(svc.clone()))
                    .add_service(
                        common::operation_service_server::OperationServiceServer::new(svc.clone()),
                    )
                    .add_service(vpc::subnet_service_server::SubnetServiceServer::new(
                        svc.clone(),
                    ))
                    .add_service(
                        vpc::security_group_service_server::SecurityGroupServiceServer::new(
                            svc.clone(),
                        ),
                    )
                    .add_service(
                        vpc::security_rule_service_server::SecurityRuleServiceServer::new(
                            svc.clone(),
                        ),
                    )
                    .add_service(
                        iam::token_exchange_service_server::TokenExchangeServiceServer::new(svc),
                    )
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stopped.await;
                    })
                    .await
                    .unwrap();
            });
        });
        Fake {
            world,
            url,
            stop: Some(stop),
        }
    }

    /// The test service account.
    pub(crate) fn service_account() -> ServiceAccount {
        ServiceAccount {
            id: SA_ID.into(),
            public_key_id: KEY_ID.into(),
            private_key: Secret::new(KEY_PEM),
        }
    }

    /// The adapter with `credential`, the world's projects and the test capabilities.
    pub(crate) fn provider_with(&self, credential: Option<Credential>) -> Arc<NebiusProvider> {
        let projects = self.world.lock().unwrap().projects.clone();
        let settings = NebiusSettings {
            lineage: Lineage::parse(LINEAGE).unwrap(),
            endpoint: Some(self.url.clone()),
            projects,
            credential: credential
                .map(|c| (c, Source::File("/test/nebius-credentials.json".into()))),
            looked_in: vec!["the test".into()],
            unusable: None,
        };
        // The listing is immediate here: a refused create need not wait the default lag.
        let caps = gpuprov::provider::Capabilities {
            create_list_lag: Duration::from_secs(1),
            ..drive::test_capabilities(NebiusProvider::default_capabilities())
        };
        Arc::new(NebiusProvider::new(settings).with_capabilities(caps))
    }

    /// The adapter with the test service account.
    pub(crate) fn provider(&self) -> Arc<NebiusProvider> {
        self.provider_with(Some(Credential::ServiceAccount(Fake::service_account())))
    }

    /// Instances of ours that exist now.
    pub(crate) fn live(&self) -> usize {
        let mut w = self.world.lock().unwrap();
        w.tick();
        w.live().len()
    }

    /// The region of each create request received, in order.
    pub(crate) fn create_regions(&self) -> Vec<String> {
        let w = self.world.lock().unwrap();
        w.creates
            .iter()
            .map(|c| {
                let p = &c.metadata.as_ref().unwrap().parent_id;
                w.projects
                    .iter()
                    .find(|(_, x)| *x == p)
                    .map(|(r, _)| r.clone())
                    .unwrap_or_default()
            })
            .collect()
    }
}

/// The usual world: eu-north1 and us-central1, each with H100 (1 and 8 GPUs).
pub(crate) fn two_regions() -> World {
    World::default()
        .with_project(
            "eu-north1",
            "project-e00north",
            vec![platform(H100, &[(PRESET1, 1), (PRESET8, 8)])],
        )
        .with_project(
            "us-central1",
            "project-u00central",
            vec![platform(H100, &[(PRESET1, 1), (PRESET8, 8)])],
        )
}

fn vm(regions: &[&str]) -> gpuprov::config::VmSpec {
    let mut vm = drive::gpu_vm(gpuprov::config::Cloud::Nebius, "H100", 8);
    vm.regions = regions.iter().map(|r| r.to_string()).collect();
    vm
}

fn at(region: &str) -> Location {
    Location {
        cloud: "nebius".into(),
        region: region.into(),
        zone: None,
    }
}

#[tokio::test]
async fn a_late_capacity_failure_in_the_create_operation_fails_over_leaving_nothing() {
    let mut w = two_regions();
    w.late.push_back(no_capacity());
    let fake = Fake::start(w);
    let run = drive::Run::new((), fake.provider(), vm(&["eu-north1", "us-central1"]));
    let end = run.launch().await.unwrap();
    let up = end
        .ready()
        .unwrap_or_else(|| panic!("{end:?} {:?}", run.labels()));
    assert_eq!(up.location.region, "us-central1");
    assert_eq!(fake.create_regions(), ["eu-north1", "us-central1"]);
    assert_eq!(fake.live(), 1, "the refused create left nothing");
    let labels = run.labels();
    assert!(
        labels.iter().any(|l| l.contains("not_enough_resources")
            || l.contains("Capacity")
            || l.contains("capacity")),
        "{labels:?}"
    );
    let seen = fake
        .provider()
        .observe(&at("eu-north1"), "trainer")
        .await
        .unwrap();
    assert!(
        gpuprov::provider::existing(seen).is_empty(),
        "nothing labelled is left in eu-north1"
    );
    // The create carried the identity, the disk, the key and the public address.
    let w = fake.world.lock().unwrap();
    let c = &w.creates[1];
    let m = c.metadata.as_ref().unwrap();
    assert_eq!(m.labels["gpuprov-vm-name"], "trainer");
    assert_eq!(m.labels["gpuprov-lineage"], LINEAGE);
    let s = c.spec.as_ref().unwrap();
    assert_eq!(s.resources.as_ref().unwrap().platform, H100);
    assert!(
        s.cloud_init_user_data.contains(drive::PUBKEY),
        "{}",
        s.cloud_init_user_data
    );
    assert!(s.network_interfaces[0].public_ip_address.is_some());
    assert!(s.preemptible.is_none());
    match s.boot_disk.as_ref().unwrap().r#type.as_ref().unwrap() {
        compute::attached_disk_spec::Type::ManagedDisk(d) => {
            assert_eq!(
                d.spec.as_ref().unwrap().size,
                Some(compute::disk_spec::Size::SizeGibibytes(200))
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_crash_before_the_operation_is_journalled_adopts_the_instance_by_label() {
    let fake = Fake::start(two_regions());
    let run = drive::Run::new((), fake.provider(), vm(&["eu-north1"]));
    run.journal.crash_before("booting");
    assert!(run.launch().await.is_err(), "the crash");
    assert_eq!(fake.create_regions().len(), 1, "the create was sent");
    // A new process: nothing in memory of the operation.
    let resumed = drive::Run {
        cloud: (),
        provider: fake.provider(),
        journal: run.journal.clone(),
        connector: run.connector.clone(),
        vm: run.vm.clone(),
    };
    let end = resumed.launch().await.unwrap();
    assert!(end.ready().is_some(), "{end:?}");
    assert_eq!(fake.create_regions().len(), 1, "adopted, not created again");
    assert_eq!(fake.live(), 1);
}

#[tokio::test]
async fn a_resent_create_with_the_same_key_gets_the_first_operation() {
    let fake = Fake::start(two_regions());
    let p = fake.provider();
    let offers = p.plan(&vm(&["eu-north1"]).request()).await.unwrap();
    let o = offers.iter().find(|o| o.gpu_count == 8).unwrap();
    let spec = gpuprov::provider::InstanceSpec {
        vm_name: "trainer".into(),
        lineage: LINEAGE.into(),
        client_token: "attempt-1".into(),
        image: None,
        disk_gb: Some(500),
        ports: vec![8888],
        ssh_public_key: drive::PUBKEY.into(),
        boot_script: None,
        shared: Default::default(),
    };
    let prep = p.prepare(o, &spec).await.unwrap();
    assert!(prep["security_group_id"].as_str().is_some(), "{prep}");
    let a = p.create(o, &prep, &spec).await.unwrap();
    let b = fake.provider().create(o, &prep, &spec).await.unwrap();
    assert_eq!(a, b);
    assert_eq!(fake.live(), 1);
    let w = fake.world.lock().unwrap();
    let keys: Vec<&String> = w
        .headers
        .iter()
        .filter(|(k, _)| k == "x-idempotency-key")
        .map(|(_, v)| v)
        .collect();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1]);
    let rules: Vec<Vec<i32>> = w
        .rules
        .values()
        .filter_map(|r| match r.spec.as_ref()?.r#match.as_ref()? {
            vpc::security_rule_spec::Match::Ingress(i) => Some(i.destination_ports.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(rules, [vec![22, 8888]]);
}

#[tokio::test]
async fn a_token_that_expires_mid_apply_is_renewed() {
    let mut w = two_regions();
    w.expires_in = 1;
    w.op_time = Duration::from_millis(600);
    w.boot_time = Duration::from_millis(900);
    let fake = Fake::start(w);
    let run = drive::Run::new((), fake.provider(), vm(&["eu-north1"]));
    let end = run.launch().await.unwrap();
    assert!(end.ready().is_some(), "{end:?} {:?}", run.labels());
    let w = fake.world.lock().unwrap();
    assert!(w.exchanges >= 2, "renewed: {} exchanges", w.exchanges);
}

#[tokio::test]
async fn a_revoked_token_is_replaced_and_a_refused_key_is_credentials() {
    let fake = Fake::start(two_regions());
    let p = fake.provider();
    let ask = vm(&["eu-north1"]).request();
    p.plan(&ask).await.unwrap();
    fake.world.lock().unwrap().tokens.clear();
    let e = p.plan(&ask).await.unwrap_err();
    assert_eq!(
        e.kind,
        ErrorKind::Transient,
        "a token that worked: retried, {e}"
    );
    p.plan(&ask).await.unwrap();

    let mut other = Fake::service_account();
    other.public_key_id = "publickey-unknown".into();
    let e = fake
        .provider_with(Some(Credential::ServiceAccount(other)))
        .plan(&ask)
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Credentials, "{e}");
    assert!(e.help.unwrap().contains("NEBIUS_IAM_TOKEN"));
    assert!(!e.msg.contains("PRIVATE KEY"));
}

#[tokio::test]
async fn the_private_key_and_tokens_appear_nowhere() {
    let mut w = two_regions();
    w.echo_auth = true;
    w.fault("InstanceService/Create", quota());
    let fake = Fake::start(w);
    let run = drive::Run::new((), fake.provider(), vm(&["eu-north1", "us-central1"]));
    let end = run.launch().await.unwrap();
    let up = end.ready().unwrap_or_else(|| panic!("{end:?}"));
    let mut texts: Vec<String> = run.labels();
    texts.push(format!("{end:?}"));
    texts.push(format!("{:?}", run.journal.history()));
    let e = fake
        .provider_with(Some(Credential::IamToken(Secret::new(format!(
            "{SENTINEL}-ready"
        )))))
        .plan(&vm(&["eu-north1"]).request())
        .await
        .unwrap_err();
    texts.push(format!("{e:?} {e}"));
    texts.push(format!("{:?}", fake.provider().settings()));
    for t in &texts {
        assert!(!t.contains(SENTINEL), "{t}");
        assert!(!t.contains("PRIVATE KEY"), "{t}");
        assert!(!t.contains("MII"), "{t}");
    }
    assert_eq!(up.location.region, "us-central1", "quota blocks eu-north1");
}

#[tokio::test]
async fn errors_follow_the_table_on_nebius_bodies() {
    let fake = Fake::start(two_regions());
    let p = fake.provider();
    let ask = vm(&["eu-north1"]).request();
    let cases: Vec<(Canned, ErrorKind)> = vec![
        (quota(), ErrorKind::Quota),
        (no_capacity(), ErrorKind::Capacity),
        (rate_limited(2000), ErrorKind::Transient),
        (
            rate_limited(0).retry(common::service_error::RetryType::Nothing),
            ErrorKind::Failed,
        ),
        (
            Canned::new(tonic::Code::Unavailable, "down"),
            ErrorKind::Transient,
        ),
        (
            Canned::new(tonic::Code::DeadlineExceeded, "slow"),
            ErrorKind::Transient,
        ),
        (
            Canned::new(tonic::Code::PermissionDenied, "no"),
            ErrorKind::Credentials,
        ),
        (
            Canned::new(tonic::Code::InvalidArgument, "bad"),
            ErrorKind::InvalidRequest,
        ),
        (Canned::new(tonic::Code::Unknown, "odd"), ErrorKind::Failed),
    ];
    for (c, want) in cases {
        let pushback = c.pushback_ms;
        fake.world.lock().unwrap().fault("PlatformService/List", c);
        let e = p.plan(&ask).await.unwrap_err();
        assert_eq!(e.kind, want, "{e}");
        if want == ErrorKind::Transient && pushback == Some(2000) {
            assert_eq!(e.retry_after_secs, Some(2), "gRPC retry pushback");
        }
    }
}

#[tokio::test]
async fn offers_come_from_the_projects_platforms_and_offline_from_the_catalog() {
    let w = World::default().with_project(
        "eu-north1",
        "project-e00north",
        vec![
            platform(H100, &[(PRESET1, 1), (PRESET8, 8)]),
            platform("gpu-h200-sxm", &[(PRESET8, 8)]),
            platform("cpu-d3", &[("4vcpu-16gb", 0)]),
        ],
    );
    let fake = Fake::start(w);
    let p = fake.provider();
    let o = p.plan(&vm(&["eu-north1"]).request()).await.unwrap();
    assert_eq!(o.len(), 1, "{o:?}");
    assert_eq!(o[0].id, "nebius/eu-north1/gpu-h100-sxm/8gpu-128vcpu-1600gb");
    assert_eq!(o[0].price_per_hour, 23.6);
    let mut spot = vm(&["eu-north1"]);
    spot.spot = true;
    let o = p.plan(&spot.request()).await.unwrap();
    assert_eq!(o[0].price_per_hour, 10.0);
    assert!(o[0].spot && o[0].id.ends_with("/preemptible"));
    let mut one = vm(&["eu-north1"]);
    one.gpu_count = 1;
    let exactly_one = p.plan(&one.request()).await.unwrap();
    assert_eq!(exactly_one.len(), 1, "gpu_count is exact: {exactly_one:?}");
    assert_eq!(exactly_one[0].gpu_count, 1);
    let at_least_one = ResourceRequest {
        gpu_count_at_least: true,
        ..one.request()
    };
    assert_eq!(
        p.plan(&at_least_one).await.unwrap().len(),
        2,
        "1 and 8 GPUs"
    );
    // No credential: the catalog's presets and regions, nothing dialled.
    let offline = fake.provider_with(None);
    let calls = fake.world.lock().unwrap().calls.len();
    let mut any = vm(&[]);
    any.gpu = Some("H200".into());
    let o = offline.plan(&any.request()).await.unwrap();
    assert_eq!(o.len(), 1, "{o:?}");
    assert_eq!(o[0].price_per_hour, 28.0);
    assert_eq!(fake.world.lock().unwrap().calls.len(), calls);
    let report = offline.credentials().await;
    assert!(matches!(report, CredentialReport::Missing(_)), "{report:?}");
    let e = offline
        .observe(&at("eu-north1"), "trainer")
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Credentials);
    let mut b = vm(&[]);
    b.gpu = Some("A10".into());
    let e = p.plan(&b.request()).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest, "{e}");
    let none = ResourceRequest {
        gpu: None,
        ..vm(&[]).request()
    };
    assert_eq!(
        p.plan(&none).await.unwrap_err().kind,
        ErrorKind::InvalidRequest
    );
}

#[tokio::test]
async fn teardown_deletes_the_instance_then_its_security_group() {
    let fake = Fake::start(two_regions());
    let mut v = vm(&["eu-north1"]);
    v.ports = vec![8080];
    let run = drive::Run::new((), fake.provider(), v);
    let end = run.launch().await.unwrap();
    let up = end.ready().unwrap_or_else(|| panic!("{end:?}")).clone();
    assert_eq!(fake.world.lock().unwrap().groups.len(), 1);
    let done = run
        .teardown(Target::new(
            up.location.clone(),
            "trainer",
            vec![up.instance_id.clone()],
        ))
        .await;
    assert_eq!(done, TeardownState::Done);
    assert_eq!(fake.live(), 0);
    {
        let w = fake.world.lock().unwrap();
        assert!(
            w.groups.is_empty() && w.rules.is_empty(),
            "cleanup removed the security group"
        );
    }
    let p = fake.provider();
    p.delete(
        &at("eu-north1"),
        "trainer",
        std::slice::from_ref(&up.instance_id),
    )
    .await
    .unwrap();
    p.cleanup(&at("eu-north1"), "trainer").await.unwrap();
}

/// A stopped preemptible VM reads as preempted (issue 18: the core relaunches elsewhere
/// first, and deletes the stopped one); the adapter can still start it.
#[tokio::test]
async fn a_stopped_preemptible_reads_as_preempted_and_can_be_started() {
    let fake = Fake::start(two_regions());
    let mut v = vm(&["eu-north1"]);
    v.spot = true;
    let run = drive::Run::new((), fake.provider(), v);
    let end = run.launch().await.unwrap();
    let up = end.ready().unwrap_or_else(|| panic!("{end:?}")).clone();
    {
        let w = fake.world.lock().unwrap();
        let s = w.creates[0].spec.as_ref().unwrap();
        assert_eq!(
            s.preemptible.as_ref().unwrap().on_preemption,
            compute::preemptible_spec::PreemptionPolicy::Stop as i32
        );
    }
    fake.world.lock().unwrap().set_state(
        &up.instance_id,
        compute::instance_status::InstanceState::Stopped,
    );
    let p = fake.provider();
    let seen = p.observe(&at("eu-north1"), "trainer").await.unwrap();
    assert!(
        matches!(
            seen[0].status,
            InstanceStatus::Preempted { stopped: true, .. }
        ),
        "{:?}",
        seen[0].status
    );
    p.start(&at("eu-north1"), "trainer", &up.instance_id)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    let seen = p.observe(&at("eu-north1"), "trainer").await.unwrap();
    assert_eq!(seen[0].status, InstanceStatus::Running);
}

/// Ends the create operation of instance `id` now, with its scripted outcome.
fn end_create(fake: &Fake, id: &str) {
    let mut w = fake.world.lock().unwrap();
    for o in w.ops.values_mut() {
        if matches!(&o.on_done, OnDone::Created(x) if x == id) {
            o.done_at = Instant::now();
        }
    }
    w.tick();
}

/// The calls made since the last count, `(InstanceService/List, OperationService/Get)`.
fn lists_and_gets(fake: &Fake) -> (usize, usize) {
    let mut w = fake.world.lock().unwrap();
    let n = |m: &str| w.calls.iter().filter(|c| **c == m).count();
    let counted = (n("InstanceService/List"), n("OperationService/Get"));
    w.calls.clear();
    counted
}

/// For each VM (and one never launched), `observe` answers `all`'s entry, from one
/// listing and one `OperationService/Get` when the VM's create is `in_flight`.
async fn same_as_observe(
    p: &NebiusProvider,
    fake: &Fake,
    at: &Location,
    all: &gpuprov::provider::Observations,
    in_flight: &[&str],
) {
    for vm in ["trainer", "worker", "refused", "absent"] {
        lists_and_gets(fake);
        let one = p.observe(at, vm).await.unwrap();
        let gets = usize::from(in_flight.contains(&vm));
        assert_eq!(lists_and_gets(fake), (1, gets), "observe({vm})");
        assert_eq!(all.get(vm).cloned().unwrap_or_default(), one, "{vm}");
    }
}

/// Issue 20: `observe_location` answers every VM of a location from one
/// `InstanceService/List`, plus one `OperationService/Get` per create of this process
/// still running there (none for one known to have failed or finished, none for the
/// creates of another region), and each VM's entry is exactly `observe`'s, which follows
/// only its own VM's creates. Another lineage's instance and an unlabelled one are no VM's.
#[tokio::test]
async fn one_listing_observes_every_vm_of_a_location() {
    let mut w = two_regions();
    // Operations end only when the test ends them, and no instance runs meanwhile, so
    // one answer can be compared with the next.
    w.op_time = Duration::from_secs(3600);
    w.boot_time = Duration::from_secs(3600);
    let mut theirs = meta("computeinstance-e00other", "project-e00north", "theirs");
    theirs.labels = [
        ("gpuprov-vm-name".to_string(), "trainer".to_string()),
        (
            "gpuprov-lineage".to_string(),
            "00000000-0000-4000-8000-000000000000".to_string(),
        ),
    ]
    .into();
    for m in [
        theirs,
        meta("computeinstance-e00plain", "project-e00north", "plain"),
    ] {
        w.instances.insert(
            m.id.clone(),
            compute::Instance {
                metadata: Some(m),
                ..Default::default()
            },
        );
    }
    let fake = Fake::start(w);
    let p = fake.provider();
    let eu = at("eu-north1");
    let offers = p.plan(&vm(&["eu-north1"]).request()).await.unwrap();
    let o = offers.iter().find(|o| o.gpu_count == 8).unwrap();
    let spec = |vm: &str| gpuprov::provider::InstanceSpec {
        vm_name: vm.into(),
        lineage: LINEAGE.into(),
        client_token: format!("attempt-{vm}"),
        image: None,
        disk_gb: None,
        ports: vec![],
        ssh_public_key: drive::PUBKEY.into(),
        boot_script: None,
        shared: Default::default(),
    };
    let prep = p.prepare(o, &spec("trainer")).await.unwrap();
    let mut ids = BTreeMap::new();
    for vm in ["trainer", "worker", "refused"] {
        if vm == "refused" {
            fake.world.lock().unwrap().late.push_back(no_capacity());
        }
        ids.insert(vm, p.create(o, &prep, &spec(vm)).await.unwrap());
    }
    lists_and_gets(&fake);
    let all = p.observe_location(&eu).await.unwrap().unwrap();
    assert_eq!(lists_and_gets(&fake), (1, 3), "three creates in flight");
    let vms: Vec<&str> = all.keys().map(String::as_str).collect();
    assert_eq!(vms, ["refused", "trainer", "worker"], "{all:?}");
    for (vm, id) in &ids {
        let seen = &all[*vm];
        assert_eq!(seen.len(), 1, "{vm}: {seen:?}");
        assert_eq!(&seen[0].instance_id, id);
        assert_eq!(seen[0].status, InstanceStatus::Pending, "{vm}");
    }
    same_as_observe(&p, &fake, &eu, &all, &["trainer", "worker", "refused"]).await;

    // The refused create's operation fails late: its instance goes, the failure stays.
    end_create(&fake, &ids["refused"]);
    lists_and_gets(&fake);
    let all = p.observe_location(&eu).await.unwrap().unwrap();
    assert_eq!(lists_and_gets(&fake), (1, 3));
    assert!(
        matches!(&all["refused"][..], [o] if matches!(&o.status, InstanceStatus::Refused(e)
            if e.kind == ErrorKind::Capacity)),
        "{all:?}"
    );
    let all = p.observe_location(&eu).await.unwrap().unwrap();
    assert_eq!(
        lists_and_gets(&fake),
        (1, 2),
        "a known failure is not read again"
    );
    same_as_observe(&p, &fake, &eu, &all, &["trainer", "worker"]).await;

    // The other creates end: the listing alone answers for them.
    end_create(&fake, &ids["trainer"]);
    end_create(&fake, &ids["worker"]);
    lists_and_gets(&fake);
    p.observe_location(&eu).await.unwrap().unwrap();
    assert_eq!(
        lists_and_gets(&fake),
        (1, 2),
        "each read once more, then forgotten"
    );
    let all = p.observe_location(&eu).await.unwrap().unwrap();
    assert_eq!(lists_and_gets(&fake), (1, 0));
    assert_eq!(all.len(), 3, "{all:?}");
    for vm in ["trainer", "worker"] {
        let listed: Vec<&str> = all[vm].iter().map(|o| o.instance_id.as_str()).collect();
        assert_eq!(listed, [ids[vm].as_str()], "{vm}");
    }
    assert!(matches!(
        all["refused"][0].status,
        InstanceStatus::Refused(_)
    ));
    same_as_observe(&p, &fake, &eu, &all, &[]).await;

    // Another region: its own listing, and none of eu-north1's creates.
    let us = p
        .observe_location(&at("us-central1"))
        .await
        .unwrap()
        .unwrap();
    assert!(us.is_empty(), "{us:?}");
    assert_eq!(lists_and_gets(&fake), (1, 0));
}

/// Runs the real binary in `dir` with no ambient credentials and `env`.
fn gpuprov(dir: &std::path::Path, env: &[(&str, String)], args: &[&str]) -> std::process::Output {
    let mut cmd = assert_cmd::Command::cargo_bin("gpuprov").unwrap();
    for (k, _) in std::env::vars() {
        if k.starts_with("NEBIUS_") || k.starts_with("GPUPROV_") {
            cmd.env_remove(k);
        }
    }
    cmd.current_dir(dir)
        .env("HOME", dir.join("home"))
        .env("GPUPROV_HOME", dir.join("gpuprov-home"))
        .env("NO_COLOR", "1")
        .envs(env.iter().map(|(k, v)| (k.to_string(), v.clone())))
        .args(args)
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap()
}

/// `examples/nebius.toml` plans offline (no credential: the catalog's presets and
/// prices; nothing dialled, the endpoint points at a closed port).
#[test]
fn the_nebius_example_plans_offline() {
    let dir = tempfile::tempdir().unwrap();
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/nebius.toml");
    std::fs::copy(&example, dir.path().join("gpuprov.toml")).unwrap();
    let env = [("GPUPROV_NEBIUS_ENDPOINT", "http://127.0.0.1:9".to_string())];
    let out = gpuprov(dir.path(), &env, &["plan", "--refresh=false"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("Plan: 2 to add"), "{stdout}");
    // 8 × H100 at $2.95 and 1 × H200 preemptible (on-demand $3.50 bounds it).
    assert!(stdout.contains("$27.10/h"), "{stdout}");
    let out = gpuprov(dir.path(), &env, &["offers", "--vm", "notebook", "--json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}");
    assert!(stderr.contains("from the built-in catalog"), "{stderr}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&stdout).unwrap();
    let ids: Vec<&str> = rows.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids[0], "nebius/us-central1/gpu-h200-sxm/1gpu-16vcpu-200gb/preemptible",
        "the asked region first: {ids:?}"
    );
}

/// `gpuprov offers --cloud nebius` asks the project's platforms over gRPC with a service
/// account's token, and prints neither the key nor the token.
#[test]
fn offers_answer_from_the_local_nebius() {
    let fake = Fake::start(two_regions());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("gpuprov.toml"),
        "[defaults]\nclouds = [\"nebius\"]\n\n[cloud.nebius]\nprojects = { eu-north1 = \
         \"project-e00north\", us-central1 = \"project-u00central\" }\n\n[vm.trainer]\ngpu = \"H100\"\n",
    )
    .unwrap();
    let creds = serde_json::json!({"subject-credentials": {
        "type": "JWT", "alg": "RS256", "private-key": KEY_PEM,
        "kid": KEY_ID, "iss": SA_ID, "sub": SA_ID,
    }});
    let file = dir.path().join("sa.json");
    std::fs::write(&file, creds.to_string()).unwrap();
    let env = [
        ("GPUPROV_NEBIUS_ENDPOINT", fake.url.clone()),
        (
            "GPUPROV_NEBIUS_CREDENTIALS_FILE",
            file.display().to_string(),
        ),
    ];
    let out = gpuprov(
        dir.path(),
        &env,
        &["offers", "--cloud", "nebius", "--gpu", "H100", "--json"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for t in [&stdout, &stderr] {
        assert!(!t.contains(SENTINEL) && !t.contains("PRIVATE KEY"), "{t}");
    }
    assert!(
        stderr.contains("note: nebius: prices are gpuprov's built-in list prices")
            && stderr.contains("from the project's PlatformService/List"),
        "{stderr}"
    );
    let rows: Vec<serde_json::Value> = serde_json::from_str(&stdout).unwrap();
    let ids: Vec<&str> = rows.iter().map(|r| r["id"].as_str().unwrap()).collect();
    for id in [
        "nebius/eu-north1/gpu-h100-sxm/1gpu-16vcpu-200gb",
        "nebius/us-central1/gpu-h100-sxm/8gpu-128vcpu-1600gb",
    ] {
        assert!(ids.contains(&id), "{ids:?}");
    }
    let w = fake.world.lock().unwrap();
    assert_eq!(w.exchanges, 1, "one token for the command");
    assert!(
        w.calls
            .iter()
            .filter(|c| **c == "PlatformService/List")
            .count()
            >= 2
    );
}

/// From a newcomer's review: a region without a project offers nothing once a credential
/// is there (apply could not create there), a refused prepare leaves nothing to clean up,
/// an endpoint that is no URL is a config error, and an explicitly named credentials file
/// that cannot be used fails the plan instead of planning offline.
#[tokio::test]
async fn regions_without_a_project_bad_endpoints_and_unusable_files_are_config_errors() {
    let fake = Fake::start(two_regions());
    let p = fake.provider();
    let e = p.plan(&vm(&["eu-west1"]).request()).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest, "{e}");
    assert!(e.msg.contains("projects = { eu-west1"), "{e}");
    assert_eq!(
        p.plan(&vm(&["eu-west1", "eu-north1"]).request())
            .await
            .unwrap()
            .len(),
        1
    );
    p.cleanup(&at("eu-west1"), "trainer").await.unwrap();
    p.delete(&at("eu-west1"), "trainer", &[]).await.unwrap();

    let settings = |endpoint: &str, unusable: Option<&str>| NebiusSettings {
        lineage: Lineage::parse(LINEAGE).unwrap(),
        endpoint: Some(endpoint.into()),
        projects: fake.world.lock().unwrap().projects.clone(),
        credential: unusable.is_none().then(|| {
            (
                Credential::IamToken(Secret::new("t")),
                Source::Env("NEBIUS_IAM_TOKEN"),
            )
        }),
        looked_in: vec![],
        unusable: unusable.map(str::to_string),
    };
    for bad in ["not a url", "ftp://127.0.0.1:9", "{service}"] {
        let e = NebiusProvider::new(settings(bad, None))
            .plan(&vm(&["eu-north1"]).request())
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidRequest, "{bad}: {e}");
    }
    let e = NebiusProvider::new(settings(&fake.url, Some("/x/sa.json: cannot read")))
        .plan(&vm(&["eu-north1"]).request())
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Credentials, "{e}");
    assert!(e.msg.contains("/x/sa.json"), "{e}");
}
