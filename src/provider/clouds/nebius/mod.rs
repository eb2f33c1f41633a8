//! Nebius AI Cloud (cloud name `nebius`), over its gRPC API: the client is generated from
//! the vendor's protos ([`proto`], `proto/README.md`); endpoints
//! `{service}.api.nebius.cloud:443` (`compute`, `vpc`, `tokens.iam`: each service's
//! `api_service_name` option).
//!
//! A Nebius project lives in one region, so the adapter is configured with the project of
//! each region: `[cloud.nebius] projects = { eu-north1 = "project-e00…" }`.
//!
//! Mapping onto the contract (design 5, with the brief's long-running-operation rule):
//!
//! - `plan`: for each asked region (else every region with a project, else every region of
//!   [`catalog::REGIONS`]), the GPU platforms of [`catalog`] carrying the asked model,
//!   one offer per preset with at least the asked GPUs, priced from the catalog (USD per
//!   hour = per-GPU price × GPUs). With a credential and the region's project, the
//!   presets are the project's own (`PlatformService/List`; spot only where
//!   `status.allowed_for_preemptibles`), and an error of that call is the plan's error;
//!   otherwise the catalog's presets, so `plan` works offline. Offer id
//!   `nebius/<region>/<platform>/<preset>[/preemptible]`, instance type
//!   `<platform>/<preset>`.
//! - `prepare`: the project's subnet (`SubnetService/List`: the one named `default…`,
//!   else the first), the image (`ImageService/GetLatestByFamily` for a family, default
//!   [`DEFAULT_IMAGE_FAMILY`]; an id `computeimage-…` is used as is) and, when the VM
//!   opens ports (k3s adds 6443), its security group `gpuprov-<vm>-<lineage8>` on the
//!   subnet's network with an ingress rule for TCP 22 and the ports and an egress rule
//!   (found by name and reused; an ingress rule with other ports is replaced). Returns
//!   `{"subnet_id", "image_id", "security_group_id"}`.
//! - `create`: one `InstanceService/Create` named `gpuprov-<vm>-<lineage8>-<hhhh>` (4 hex
//!   digits of the attempt's token), labelled with the VM identity, with a managed boot
//!   disk of `disk_gb` (default [`DEFAULT_DISK_GIB`]) GiB, a network interface with a
//!   public address (and the security group), cloud-init user-data authorising the
//!   project key for the image's user and running the boot script, and
//!   `preemptible { on_preemption: STOP }` for spot. The request carries an
//!   `x-idempotency-key` derived from the attempt's token (the vendor SDK's header), so a
//!   create resent after a crash is answered with the first one's operation. It returns
//!   the instance id (`Operation.resource_id`) at once; an operation that already failed
//!   is that failure, and `ALREADY_EXISTS` for its own name is success (the instance is
//!   read by name).
//! - `instances` (the listing `observe`, `observe_location` and `list` derive from): one
//!   `InstanceService/List` of the region's project (all pages; `ListInstancesRequest`
//!   has no filter, `instance_service.proto`), each instance showing its identity labels
//!   and name ([`seen`]); statuses mapped by [`status_of`]; the SSH endpoint is the
//!   public address (prefix length stripped), port 22, user [`SSH_USER`]. The create
//!   operations this process started in the region (for one VM: that VM's) are followed
//!   with `OperationService/Get` (on the compute endpoint) until they end: one still
//!   running whose instance is not listed is `Pending`, one that failed
//!   (`not_enough_resources` after an accepted create) is [`InstanceStatus::Refused`]
//!   with its classified error (remembered: not read again), each shown as the VM that
//!   created it. So a location costs one listing plus one `Get` per create of this
//!   process still in flight, however many VMs wait there. After a restart the
//!   operation is known again by resending the create (same idempotency key).
//! - `delete`: `InstanceService/Delete` per id (`NOT_FOUND` is success); the managed boot
//!   disk is deleted with the instance ("Also deletes all the managed disks",
//!   `instance_service.proto`).
//! - `cleanup`: deletes the VM's security group (`NOT_FOUND` is success; still attached
//!   is `InUse`).
//! - `start` ([`Feature::Start`]): `InstanceService/Start` (a preempted instance stops).
//!
//! Errors: [`errors`] (gRPC status and the vendor's `ServiceError` details, one table).
//! Credentials: [`auth`]. The endpoint: `GPUPROV_NEBIUS_ENDPOINT`, else
//! `[cloud.nebius] endpoint`: one URL for every service (a local server or a proxy), or a
//! template with `{service}`; `http://` is plain HTTP/2.

pub mod auth;
pub mod catalog;
pub mod errors;
pub mod proto;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use async_trait::async_trait;
use serde_json::{json, Value};
use tonic::transport::Channel;

use crate::provider::identity::owner;
use crate::provider::kit::credentials::Source;
use crate::provider::kit::failure::codes;
use crate::provider::kit::grpc::{self, Channels};
use crate::provider::kit::paginate::{self, Cursor, Next};
use crate::provider::kit::{self, Adapter, Call, Failure};
use crate::provider::{
    Capabilities, CloudProvider, ErrorKind, Feature, InstanceSpec, InstanceStatus, Lineage,
    Location, Naming, Offer, ProviderError, ResourceRequest, Result, Secret, Seen, Shown,
    IDENTITY_LABEL, LINEAGE_LABEL,
};
use auth::{Credential, Tokens};
use errors::{is_already_there, is_not_found, CLASSIFIER, CLEANUP, CREATE, DELETE, PREPARE};
use proto::nebius::common::v1 as common;
use proto::nebius::compute::v1 as compute;
use proto::nebius::iam::v1 as iam;
use proto::nebius::vpc::v1 as vpc;

/// The cloud name.
pub const CLOUD: &str = "nebius";
/// Environment variable overriding the endpoint (wins over `[cloud.nebius] endpoint`).
pub const ENDPOINT_ENV: &str = "GPUPROV_NEBIUS_ENDPOINT";
/// The endpoint of a service (`{service}` is its `api_service_name`).
pub const DEFAULT_ENDPOINT: &str = "https://{service}.api.nebius.cloud:443";
/// The header the vendor SDK sends its idempotency key in (`nebius/aio/idempotency.py`).
pub const IDEMPOTENCY_HEADER: &str = "x-idempotency-key";
/// The login user: the image's default user, which cloud-init's `ssh_authorized_keys`
/// authorises.
pub const SSH_USER: &str = "ubuntu";
/// The SSH port.
pub const SSH_PORT: u16 = 22;
/// The boot image family when the VM sets none: Ubuntu 22.04 with CUDA 12 and the NVIDIA
/// driver (Nebius' public image families, docs.nebius.com/compute/storage/boot-disk-images).
pub const DEFAULT_IMAGE_FAMILY: &str = "ubuntu22.04-cuda12";
/// The boot disk when the VM sets none, GiB.
pub const DEFAULT_DISK_GIB: u32 = 200;
/// Items asked per page of a list call (the API allows up to 1000).
const PAGE_SIZE: i64 = 500;

/// A Nebius API service, by its `api_service_name`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    Compute,
    Vpc,
    Tokens,
}

impl Service {
    pub fn name(self) -> &'static str {
        match self {
            Service::Compute => "compute",
            Service::Vpc => "vpc",
            Service::Tokens => "tokens.iam",
        }
    }
}

/// Configuration of the Nebius adapter.
#[derive(Debug, Clone)]
pub struct NebiusSettings {
    /// The state's lineage: the identity rule reads listings against it.
    pub lineage: Lineage,
    /// Endpoint override (module docs); `None` means [`DEFAULT_ENDPOINT`].
    pub endpoint: Option<String>,
    /// The project of each region (`[cloud.nebius] projects`).
    pub projects: BTreeMap<String, String>,
    /// The credential found and where; `None`: calls fail with `Credentials`.
    pub credential: Option<(Credential, Source)>,
    /// Every place looked at, for the report and the message.
    pub looked_in: Vec<String>,
    /// Why the credential found cannot be used (a malformed file).
    pub unusable: Option<String>,
}

impl NebiusSettings {
    /// Settings from `[cloud.nebius]` (`endpoint`, `projects`) and the environment (the
    /// credential lookup of [`auth`]). Reads files only; dials nothing.
    pub fn from_env_and_config(
        endpoint: Option<String>,
        projects: BTreeMap<String, String>,
        lineage: Lineage,
    ) -> NebiusSettings {
        let found = auth::find(crate::provider::env_nonempty, dirs::home_dir().as_deref());
        NebiusSettings {
            lineage,
            endpoint: crate::provider::endpoint_from(ENDPOINT_ENV, endpoint),
            projects,
            credential: found.credential,
            looked_in: found.looked_in,
            unusable: found.unusable,
        }
    }
}

/// A create this process started, followed until its operation ends.
#[derive(Debug, Clone)]
struct Started {
    vm: String,
    region: String,
    operation: String,
    /// The operation's failure, once it failed.
    failed: Option<ProviderError>,
}

/// The Nebius adapter. Construction does no I/O.
pub struct NebiusProvider {
    settings: NebiusSettings,
    adapter: Adapter,
    tokens: Option<Tokens>,
    channels: Channels,
    /// The `Credentials` message when no credential was found.
    missing: String,
    /// Instance id → the create that made it (module docs).
    started: Mutex<HashMap<String, Started>>,
}

fn invalid(msg: impl Into<String>) -> ProviderError {
    ProviderError::new(ErrorKind::InvalidRequest, msg)
}

/// The normalised status and SSH endpoint of `i` (its `InstanceStatus.state`):
/// CREATING, STARTING, UPDATING → `Pending`; RUNNING → `Running` (with the public address
/// once there is one); STOPPING, STOPPED (a preemptible VM's: `Preempted`); DELETING → `Terminating`; ERROR → `Failed`; an
/// unset or unknown state → `Pending` (never taken as gone).
pub fn status_of(i: &compute::Instance) -> (InstanceStatus, Option<crate::provider::SshEndpoint>) {
    use compute::instance_status::InstanceState as S;
    let st = i.status.as_ref();
    let state = st.map(|s| s.state()).unwrap_or(S::Unspecified);
    let status = match state {
        S::Creating | S::Starting | S::Updating | S::Unspecified => InstanceStatus::Pending,
        S::Running => InstanceStatus::Running,
        S::Stopping => InstanceStatus::Stopping,
        // A preemptible VM is stopped when preempted (`on_preemption: STOP`, the only
        // policy); the instance does not say who stopped it, so it counts as preempted.
        S::Stopped if i.spec.as_ref().is_some_and(|s| s.preemptible.is_some()) => {
            InstanceStatus::Preempted {
                signal: "preemptible instance STOPPED".into(),
                stopped: true,
            }
        }
        S::Stopped => InstanceStatus::Stopped,
        S::Deleting => InstanceStatus::Terminating,
        S::Error => InstanceStatus::Failed("Nebius reports the instance in state ERROR".into()),
    };
    let ip = st.and_then(|s| {
        s.network_interfaces
            .iter()
            .filter_map(|n| n.public_ip_address.as_ref())
            .map(|p| p.address.split('/').next().unwrap_or("").to_string())
            .find(|a| !a.trim().is_empty())
    });
    let ssh = match status {
        InstanceStatus::Running => kit::ports::ssh_at(ip.as_deref(), SSH_PORT, SSH_USER),
        _ => None,
    };
    (status, ssh)
}

/// The instance name of one create attempt: `gpuprov-<vm>-<lineage8>-<hhhh>`.
pub fn instance_name(vm: &str, lineage: &Lineage, client_token: &str) -> String {
    use sha2::Digest as _;
    let d = sha2::Sha256::digest(client_token.as_bytes());
    format!(
        "{}-{:02x}{:02x}",
        crate::provider::object_name(vm, lineage),
        d[0],
        d[1]
    )
}

/// The idempotency key of one create attempt: a UUID made from the attempt's token.
pub fn idempotency_key(client_token: &str) -> String {
    use sha2::Digest as _;
    let d = sha2::Sha256::digest(format!("nebius-create:{client_token}").as_bytes());
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[..16]);
    uuid::Builder::from_custom_bytes(b).into_uuid().to_string()
}

/// The identity labels of `vm`'s objects.
fn labels(vm: &str, lineage: &Lineage) -> HashMap<String, String> {
    HashMap::from([
        (IDENTITY_LABEL.to_string(), vm.to_string()),
        (LINEAGE_LABEL.to_string(), lineage.as_str().to_string()),
    ])
}

/// A listed instance as the contract's listing shows it: its identity labels and name
/// (`gpuprov-<vm>-<lineage8>-<hhhh>`), [`status_of`], the instance type as an offer names
/// it (`<platform>/<preset>`), the catalog's price for it (preemptible or not) and
/// `metadata.created_at`.
pub fn seen(i: &compute::Instance) -> Seen {
    let m = i.metadata.as_ref();
    let label = |k: &str| m.and_then(|m| m.labels.get(k)).map(String::as_str);
    let identity = Shown::labels(label(IDENTITY_LABEL), label(LINEAGE_LABEL))
        .named(m.map(|m| m.name.as_str()), Naming::Object);
    let (status, ssh) = status_of(i);
    let spec = i.spec.as_ref();
    let sized = spec
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| match &r.size {
            Some(compute::resources_spec::Size::Preset(p)) => {
                Some((r.platform.as_str(), p.as_str()))
            }
            _ => None,
        });
    let preemptible = spec.is_some_and(|s| s.preemptible.is_some());
    let price = sized.and_then(|(platform, preset)| {
        let gpus = catalog::preset_gpus(preset)?;
        Some(catalog::platform(platform)?.price(gpus, preemptible))
    });
    Seen {
        ssh,
        instance_type: sized.map(|(platform, preset)| format!("{platform}/{preset}")),
        price_per_hour: price,
        created_at: m
            .and_then(|m| m.created_at.as_ref())
            .and_then(|t| chrono::DateTime::from_timestamp(t.seconds, t.nanos.max(0) as u32)),
        ..Seen::new(
            m.map(|m| m.id.clone()).unwrap_or_default(),
            status,
            identity,
        )
    }
}

impl NebiusProvider {
    /// An adapter for `settings`. Never fails and does no I/O.
    pub fn new(settings: NebiusSettings) -> NebiusProvider {
        let adapter = Adapter::new(
            CLOUD,
            settings.endpoint.as_deref(),
            Self::default_capabilities(),
        )
        .with_credential_at(
            settings.credential.as_ref().map(|(_, source)| source),
            &settings.looked_in,
            settings.unusable.as_deref(),
        )
        .with_lineage(&settings.lineage);
        let missing = match &settings.unusable {
            Some(why) => format!("no usable Nebius credential: {why}"),
            None => format!(
                "no Nebius credential ({})",
                kit::credentials::looked_in(&settings.looked_in)
            ),
        };
        let tokens = settings
            .credential
            .as_ref()
            .map(|(c, _)| Tokens::new(c.clone()));
        NebiusProvider {
            settings,
            adapter,
            tokens,
            channels: Channels::default(),
            missing,
            started: Mutex::new(HashMap::new()),
        }
    }

    /// Replaces the declared capabilities (tests use short timeouts and poll intervals).
    pub fn with_capabilities(mut self, caps: Capabilities) -> NebiusProvider {
        self.adapter.capabilities = caps;
        self
    }

    /// What gpuprov declares for Nebius: boot script (cloud-init), firewall (security
    /// groups), spot (preemptible), GPUs, k3s and start; the waits of
    /// [`kit::adapter::vm_capabilities`]. Nebius publishes no request rate limits (its
    /// protos name only the `too_many_requests` error), so no `rate_limits` are declared;
    /// 8 concurrent calls is the kit's default.
    pub fn default_capabilities() -> Capabilities {
        use Feature::*;
        kit::adapter::vm_capabilities(&[BootScript, Firewall, Spot, Gpu, Kubernetes, Start])
    }

    /// The settings the adapter was built with.
    pub fn settings(&self) -> &NebiusSettings {
        &self.settings
    }

    /// The URL of `service` (module docs).
    pub fn url(&self, service: Service) -> String {
        let template = self
            .settings
            .endpoint
            .as_deref()
            .unwrap_or(DEFAULT_ENDPOINT);
        template.replace("{service}", service.name())
    }

    fn secrets(&self) -> Vec<Secret> {
        self.tokens
            .as_ref()
            .map(Tokens::secrets)
            .unwrap_or_default()
    }

    /// The contract's error for `f`, every secret scrubbed.
    fn fail(&self, f: &Failure, call: Call<'_>) -> ProviderError {
        let secrets = self.secrets();
        CLASSIFIER.classify(f, call, secrets.iter().map(Secret::expose))
    }

    fn channel(&self, service: Service) -> std::result::Result<Channel, Failure> {
        self.channels.get(&self.url(service))
    }

    /// A token for the next call (module docs of [`auth`]).
    async fn token(&self) -> std::result::Result<Secret, Failure> {
        let Some(tokens) = &self.tokens else {
            return Err(Failure::no_credential(self.missing.clone()));
        };
        tokens
            .token(|req| async move {
                // Only an exchange needs the token service (a ready token does not).
                let channel = self.channel(Service::Tokens)?;
                let req = grpc::request(req, None, None)?;
                iam::token_exchange_service_client::TokenExchangeServiceClient::new(channel)
                    .exchange(req)
                    .await
                    .map(tonic::Response::into_inner)
                    .map_err(|s| errors::of_status(&s))
            })
            .await
    }

    /// One call to `service`: `send` gets the channel and `msg` as a request with the
    /// bearer token (and `idempotency` key). A refused token that had worked is
    /// [`codes::STALE_TOKEN`] (retried by the core with a new one).
    async fn call<M, T, F, Fut>(
        &self,
        service: Service,
        msg: M,
        idempotency: Option<&str>,
        send: F,
    ) -> std::result::Result<T, Failure>
    where
        F: FnOnce(Channel, tonic::Request<M>) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let token = self.token().await?;
        let channel = self.channel(service)?;
        let req = grpc::request(
            msg,
            Some(&token),
            idempotency.map(|k| (IDEMPOTENCY_HEADER, k)),
        )?;
        match send(channel, req).await {
            Ok(r) => {
                if let Some(t) = &self.tokens {
                    t.worked(&token);
                }
                Ok(r.into_inner())
            }
            Err(s) => {
                let mut f = errors::of_status(&s);
                let unauthenticated = s.code() == tonic::Code::Unauthenticated;
                if unauthenticated && self.tokens.as_ref().is_some_and(|t| t.rejected(&token)) {
                    f.code = Some(codes::STALE_TOKEN.into());
                }
                Err(f)
            }
        }
    }

    /// The project of `region`. Errors: none configured (`InvalidRequest`, saying how).
    fn project(&self, region: &str) -> Result<&str> {
        if self.tokens.is_none() {
            let f = Failure::no_credential(self.missing.clone());
            return Err(self.fail(&f, Call::other("API call")));
        }
        self.settings
            .projects
            .get(region)
            .map(String::as_str)
            .filter(|p| !p.trim().is_empty())
            .ok_or_else(|| {
                invalid(format!(
                    "nebius: no project for region {region}: set [cloud.nebius] projects = {{ \
                     {region} = \"project-…\" }} (a Nebius project lives in one region)"
                ))
            })
    }

    /// Every item of one paginated list call to `service`: `request` makes the request
    /// of a page from its token, `send` sends it, `page` reads the items and the next
    /// token of an answer. Errors: the call's, classified as `call`.
    async fn list_all<M, R, T, F, Fut>(
        &self,
        service: Service,
        call: Call<'_>,
        request: impl Fn(String) -> M,
        send: F,
        page: impl Fn(R) -> (Vec<T>, String),
    ) -> Result<Vec<T>>
    where
        F: Fn(Channel, tonic::Request<M>) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<R>, tonic::Status>>,
    {
        let (request, send, page) = (&request, &send, &page);
        paginate::all_pages(call.what, |cursor| async move {
            let token = match cursor {
                Cursor::Token(t) => t,
                _ => String::new(),
            };
            let answer = self
                .call(service, request(token), None, send)
                .await
                .map_err(|f| self.fail(&f, call))?;
            let (items, next) = page(answer);
            Ok((items, Next::Token(next)))
        })
        .await
    }

    /// Every instance of `project`.
    async fn listing(&self, project: &str) -> Result<Vec<compute::Instance>> {
        let what = format!("list instances of {project}");
        self.list_all(
            Service::Compute,
            Call::other(&what),
            |page_token| compute::ListInstancesRequest {
                parent_id: project.to_string(),
                page_size: PAGE_SIZE,
                page_token,
            },
            |c, r| async move {
                compute::instance_service_client::InstanceServiceClient::new(c)
                    .list(r)
                    .await
            },
            |p: compute::ListInstancesResponse| (p.items, p.next_page_token),
        )
        .await
    }

    /// The platforms `project` lists.
    async fn platforms(&self, project: &str) -> Result<Vec<compute::Platform>> {
        let what = format!("list platforms of {project}");
        self.list_all(
            Service::Compute,
            Call::other(&what),
            |page_token| compute::ListPlatformsRequest {
                parent_id: project.to_string(),
                page_size: PAGE_SIZE,
                page_token,
            },
            |c, r| async move {
                compute::platform_service_client::PlatformServiceClient::new(c)
                    .list(r)
                    .await
            },
            |p: compute::ListPlatformsResponse| (p.items, p.next_page_token),
        )
        .await
    }

    /// The offers of `region` for `req` (module docs).
    async fn region_offers(
        &self,
        req: &ResourceRequest,
        region: &str,
        platforms: &[&'static catalog::Platform],
    ) -> Result<Vec<Offer>> {
        let live_project = self.tokens.as_ref().and(self.settings.projects.get(region));
        // (platform, preset, gpus) that fit.
        let mut fit: Vec<(&'static catalog::Platform, String, u32)> = Vec::new();
        match live_project {
            Some(project) => {
                for p in self.platforms(project).await? {
                    let name = p.metadata.as_ref().map(|m| m.name.as_str()).unwrap_or("");
                    let Some(known) = platforms.iter().find(|k| k.name == name) else {
                        continue;
                    };
                    let preemptible = p
                        .status
                        .as_ref()
                        .is_some_and(|s| s.allowed_for_preemptibles);
                    if req.spot && !preemptible {
                        continue;
                    }
                    for preset in p.spec.iter().flat_map(|s| s.presets.iter()) {
                        let gpus = preset
                            .resources
                            .as_ref()
                            .map(|r| r.gpu_count.max(0) as u32)
                            .unwrap_or(0);
                        if kit::gpu::count_fits(req, gpus) {
                            fit.push((known, preset.name.clone(), gpus));
                        }
                    }
                }
            }
            None => {
                for p in platforms.iter().filter(|p| p.regions.contains(&region)) {
                    for preset in p.presets {
                        let gpus = catalog::preset_gpus(preset).unwrap_or(0);
                        if kit::gpu::count_fits(req, gpus) {
                            fit.push((p, preset.to_string(), gpus));
                        }
                    }
                }
            }
        }
        let note = catalog::catalog_note(live_project.is_some());
        Ok(fit
            .into_iter()
            .map(|(p, preset, gpus)| {
                let instance_type = format!("{}/{preset}", p.name);
                let mut o =
                    kit::offer::on_demand(CLOUD, region, &instance_type, p.price(gpus, req.spot));
                if req.spot {
                    o.id.push_str("/preemptible");
                }
                o.spot = req.spot;
                o.gpu = Some(p.gpu.to_string());
                o.gpu_count = gpus;
                o.facts = kit::offer::facts_of_price_list(
                    catalog::PRICES_AS_OF,
                    req.spot && p.preemptible_per_gpu_hour.is_none(),
                );
                (o.facts.vcpus, o.facts.memory_gib) = catalog::preset_size(&preset);
                o.detail = json!({
                    "platform": p.name,
                    "preset": preset,
                    "catalog_note": note,
                });
                o
            })
            .collect())
    }

    /// The subnet of `project` an instance's interface goes to: `(subnet id, network id)`.
    async fn subnet(&self, project: &str) -> Result<(String, String)> {
        let what = format!("list subnets of {project}");
        let subnets = self
            .list_all(
                Service::Vpc,
                Call::named(PREPARE, &what),
                |page_token| vpc::ListSubnetsRequest {
                    parent_id: project.to_string(),
                    page_size: PAGE_SIZE,
                    page_token,
                },
                |c, r| async move {
                    vpc::subnet_service_client::SubnetServiceClient::new(c)
                        .list(r)
                        .await
                },
                |p: vpc::ListSubnetsResponse| (p.items, p.next_page_token),
            )
            .await?;
        let name = |s: &vpc::Subnet| {
            s.metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default()
        };
        let chosen = subnets
            .iter()
            .find(|s| name(s).starts_with("default"))
            .or_else(|| subnets.first())
            .ok_or_else(|| {
                invalid(format!(
                    "nebius: project {project} has no subnet: create a network in the console \
                     (every project gets a default one)"
                ))
            })?;
        let id = chosen
            .metadata
            .as_ref()
            .map(|m| m.id.clone())
            .unwrap_or_default();
        let network = chosen
            .spec
            .as_ref()
            .map(|s| s.network_id.clone())
            .unwrap_or_default();
        Ok((id, network))
    }

    /// The image id for `spec_image` (module docs).
    async fn image(&self, spec_image: Option<&str>) -> Result<String> {
        let image = spec_image
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .unwrap_or(DEFAULT_IMAGE_FAMILY);
        if image.starts_with("computeimage-") {
            return Ok(image.to_string());
        }
        let req = compute::GetImageLatestByFamilyRequest {
            image_family: image.to_string(),
            parent_id: String::new(),
        };
        let found = self
            .call(Service::Compute, req, None, |c, r| async move {
                compute::image_service_client::ImageServiceClient::new(c)
                    .get_latest_by_family(r)
                    .await
            })
            .await;
        match found {
            Ok(img) => Ok(img.metadata.map(|m| m.id).unwrap_or_default()),
            Err(f) if is_not_found(&f) => Err(invalid(format!(
                "nebius: there is no image family {image} (set image to a public family such as \
                 {DEFAULT_IMAGE_FAMILY}, or an image id computeimage-…)"
            ))),
            Err(f) => Err(self.fail(
                &f,
                Call::named(PREPARE, &format!("read image family {image}")),
            )),
        }
    }

    /// The VM's security group in `project`, `None` when there is none.
    async fn security_group(
        &self,
        project: &str,
        name: &str,
    ) -> Result<Option<vpc::SecurityGroup>> {
        let req = vpc::GetSecurityGroupByNameRequest {
            parent_id: project.to_string(),
            name: name.to_string(),
        };
        match self
            .call(Service::Vpc, req, None, |c, r| async move {
                vpc::security_group_service_client::SecurityGroupServiceClient::new(c)
                    .get_by_name(r)
                    .await
            })
            .await
        {
            Ok(g) => Ok(Some(g)),
            Err(f) if is_not_found(&f) => Ok(None),
            Err(f) => Err(self.fail(&f, Call::other(&format!("read security group {name}")))),
        }
    }

    /// The id an operation creates, or its failure when it already failed.
    fn created_id(&self, op: &common::Operation, call: Call<'_>) -> Result<String> {
        if let Some(s) = op.status.as_ref().filter(|s| s.code != 0) {
            return Err(self.fail(&errors::of_operation(s), call));
        }
        Ok(op.resource_id.clone())
    }

    /// The VM's security group with its rules, made or fixed (module docs). Returns its id.
    async fn ensure_security_group(
        &self,
        project: &str,
        network: &str,
        spec: &InstanceSpec,
    ) -> Result<String> {
        let lineage = &self.settings.lineage;
        let name = crate::provider::object_name(&spec.vm_name, lineage);
        let what = format!("create security group {name}");
        let id = match self.security_group(project, &name).await? {
            Some(g) => g.metadata.map(|m| m.id).unwrap_or_default(),
            None => {
                let req = vpc::CreateSecurityGroupRequest {
                    metadata: Some(common::ResourceMetadata {
                        parent_id: project.to_string(),
                        name: name.clone(),
                        labels: labels(&spec.vm_name, lineage),
                        ..Default::default()
                    }),
                    spec: Some(vpc::SecurityGroupSpec {
                        network_id: network.to_string(),
                    }),
                };
                let sent = self
                    .call(Service::Vpc, req, None, |c, r| async move {
                        vpc::security_group_service_client::SecurityGroupServiceClient::new(c)
                            .create(r)
                            .await
                    })
                    .await;
                match sent {
                    Ok(op) => self.created_id(&op, Call::named(PREPARE, &what))?,
                    // A concurrent run made it.
                    Err(f) if is_already_there(&f) => self
                        .security_group(project, &name)
                        .await?
                        .and_then(|g| g.metadata.map(|m| m.id))
                        .unwrap_or_default(),
                    Err(f) => return Err(self.fail(&f, Call::named(PREPARE, &what))),
                }
            }
        };
        let ports: Vec<i32> = kit::ports::with_ssh(&spec.ports)
            .into_iter()
            .map(i32::from)
            .collect();
        let ingress = format!(
            "ingress-{}",
            ports
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join("-")
        );
        let rules = self.rules(&id).await?;
        let mut have_ingress = false;
        let mut have_egress = false;
        for r in &rules {
            let (rid, rname) = r
                .metadata
                .as_ref()
                .map(|m| (m.id.clone(), m.name.clone()))
                .unwrap_or_default();
            if rname == ingress {
                have_ingress = true;
            } else if rname == "egress-all" {
                have_egress = true;
            } else if rname.starts_with("ingress-") {
                self.delete_rule(&rid, &rname).await?;
            }
        }
        if !have_ingress {
            self.create_rule(
                &id,
                &ingress,
                vpc::SecurityRuleSpec {
                    access: vpc::RuleAccessAction::Allow as i32,
                    protocol: vpc::RuleProtocol::Tcp as i32,
                    r#match: Some(vpc::security_rule_spec::Match::Ingress(vpc::RuleIngress {
                        source_cidrs: vec!["0.0.0.0/0".into()],
                        destination_ports: ports,
                        ..Default::default()
                    })),
                    ..Default::default()
                },
                spec,
            )
            .await?;
        }
        if !have_egress {
            self.create_rule(
                &id,
                "egress-all",
                vpc::SecurityRuleSpec {
                    access: vpc::RuleAccessAction::Allow as i32,
                    protocol: vpc::RuleProtocol::Any as i32,
                    r#match: Some(vpc::security_rule_spec::Match::Egress(vpc::RuleEgress {
                        destination_cidrs: vec!["0.0.0.0/0".into()],
                        ..Default::default()
                    })),
                    ..Default::default()
                },
                spec,
            )
            .await?;
        }
        Ok(id)
    }

    async fn rules(&self, group: &str) -> Result<Vec<vpc::SecurityRule>> {
        let what = format!("list rules of security group {group}");
        self.list_all(
            Service::Vpc,
            Call::named(PREPARE, &what),
            |page_token| vpc::ListSecurityRulesRequest {
                parent_id: group.to_string(),
                page_size: PAGE_SIZE,
                page_token,
            },
            |c, r| async move {
                vpc::security_rule_service_client::SecurityRuleServiceClient::new(c)
                    .list(r)
                    .await
            },
            |p: vpc::ListSecurityRulesResponse| (p.items, p.next_page_token),
        )
        .await
    }

    async fn create_rule(
        &self,
        group: &str,
        name: &str,
        rule: vpc::SecurityRuleSpec,
        spec: &InstanceSpec,
    ) -> Result<()> {
        let req = vpc::CreateSecurityRuleRequest {
            metadata: Some(common::ResourceMetadata {
                parent_id: group.to_string(),
                name: name.to_string(),
                labels: labels(&spec.vm_name, &self.settings.lineage),
                ..Default::default()
            }),
            spec: Some(rule),
        };
        let what = format!("create security rule {name}");
        match self
            .call(Service::Vpc, req, None, |c, r| async move {
                vpc::security_rule_service_client::SecurityRuleServiceClient::new(c)
                    .create(r)
                    .await
            })
            .await
        {
            Ok(op) => self
                .created_id(&op, Call::named(PREPARE, &what))
                .map(|_| ()),
            Err(f) if is_already_there(&f) => Ok(()),
            Err(f) => Err(self.fail(&f, Call::named(PREPARE, &what))),
        }
    }

    async fn delete_rule(&self, id: &str, name: &str) -> Result<()> {
        let req = vpc::DeleteSecurityRuleRequest { id: id.to_string() };
        match self
            .call(Service::Vpc, req, None, |c, r| async move {
                vpc::security_rule_service_client::SecurityRuleServiceClient::new(c)
                    .delete(r)
                    .await
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(f) if is_not_found(&f) => Ok(()),
            Err(f) => Err(self.fail(
                &f,
                Call::named(PREPARE, &format!("replace security rule {name}")),
            )),
        }
    }

    /// The instance of `project` named `name`.
    async fn instance_by_name(
        &self,
        project: &str,
        name: &str,
    ) -> Result<Option<compute::Instance>> {
        let req = common::GetByNameRequest {
            parent_id: project.to_string(),
            name: name.to_string(),
        };
        match self
            .call(Service::Compute, req, None, |c, r| async move {
                compute::instance_service_client::InstanceServiceClient::new(c)
                    .get_by_name(r)
                    .await
            })
            .await
        {
            Ok(i) => Ok(Some(i)),
            Err(f) if is_not_found(&f) => Ok(None),
            Err(f) => Err(self.fail(&f, Call::other(&format!("read instance {name}")))),
        }
    }

    /// Follows the create operations this process started in `region` (for VM `only`,
    /// else for every VM; module docs): `(vm, instance id, status)` of each one still
    /// running or failed. One `OperationService/Get` per create still running, none for
    /// one known to have failed; a create that succeeded or that the cloud forgot is
    /// dropped.
    async fn follow_creates(
        &self,
        region: &str,
        only: Option<&str>,
    ) -> Result<Vec<(String, String, InstanceStatus)>> {
        let mine: Vec<(String, Started)> = self
            .started
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, s)| s.region == region && only.is_none_or(|vm| s.vm == vm))
            .map(|(id, s)| (id.clone(), s.clone()))
            .collect();
        let mut out = Vec::new();
        for (id, s) in mine {
            if let Some(e) = s.failed {
                out.push((s.vm, id, InstanceStatus::Refused(Box::new(e))));
                continue;
            }
            let what = format!("read operation {} of instance {id}", s.operation);
            let req = common::GetOperationRequest {
                id: s.operation.clone(),
            };
            let op = self
                .call(Service::Compute, req, None, |c, r| async move {
                    common::operation_service_client::OperationServiceClient::new(c)
                        .get(r)
                        .await
                })
                .await;
            let op = match op {
                Ok(op) => op,
                // An operation the cloud no longer knows: the instance alone decides.
                Err(f) if is_not_found(&f) => {
                    self.forget(&id);
                    continue;
                }
                Err(f) => return Err(self.fail(&f, Call::other(&what))),
            };
            match op.status.as_ref() {
                None => out.push((s.vm, id, InstanceStatus::Pending)),
                Some(st) if st.code == 0 => self.forget(&id),
                Some(st) => {
                    let what = format!("create instance {id} in {region}");
                    let call = Call::named(CREATE, &what).in_region(region);
                    let e = self.fail(&errors::of_operation(st), call);
                    if let Some(s) = self
                        .started
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_mut(&id)
                    {
                        s.failed = Some(e.clone());
                    }
                    out.push((s.vm, id, InstanceStatus::Refused(Box::new(e))));
                }
            }
        }
        Ok(out)
    }

    fn forget(&self, id: &str) {
        self.started
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }

    fn remember(&self, id: &str, vm: &str, region: &str, op: &common::Operation) {
        if op.status.is_some() || id.is_empty() {
            return;
        }
        self.started
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                id.to_string(),
                Started {
                    vm: vm.to_string(),
                    region: region.to_string(),
                    operation: op.id.clone(),
                    failed: None,
                },
            );
    }
}

#[async_trait]
impl CloudProvider for NebiusProvider {
    /// Name, endpoint, capabilities ([`NebiusProvider::default_capabilities`]) and the
    /// credential found, or every place looked at.
    fn adapter(&self) -> &Adapter {
        &self.adapter
    }

    /// Offers per region (module docs). Errors: no GPU asked, or a model gpuprov does not
    /// offer on Nebius (`InvalidRequest`); a `PlatformService/List` call's error.
    async fn plan(&self, req: &ResourceRequest) -> Result<Vec<Offer>> {
        let Some(gpu) = req.gpu.as_deref() else {
            return Err(invalid(
                "gpuprov offers Nebius' GPU platforms only; set gpu (for example \"H100\")",
            ));
        };
        let platforms = catalog::platforms_for(gpu);
        if platforms.is_empty() {
            return Err(kit::gpu::no_type_for(
                "Nebius has no GPU platform",
                req,
                catalog::configurations(),
            ));
        }
        // A credential named explicitly but unusable is an error, not an offline plan.
        if let Some(why) = &self.settings.unusable {
            let f = Failure::no_credential(format!("no usable Nebius credential: {why}"));
            return Err(self.fail(&f, Call::other("list platforms")));
        }
        let regions: Vec<String> = if !req.regions.is_empty() {
            req.regions.clone()
        } else if !self.settings.projects.is_empty() {
            self.settings.projects.keys().cloned().collect()
        } else {
            catalog::REGIONS.iter().map(|r| r.to_string()).collect()
        };
        let has_project = |r: &str| {
            self.settings
                .projects
                .get(r)
                .is_some_and(|p| !p.trim().is_empty())
        };
        let mut out = Vec::new();
        let mut without_project = Vec::new();
        for region in &regions {
            let known = catalog::REGIONS.contains(&region.as_str()) || has_project(region);
            if !known {
                continue;
            }
            // With a credential, apply can only create where a project is named: offer
            // nothing elsewhere rather than an offer whose prepare must fail.
            if self.tokens.is_some() && !has_project(region) {
                without_project.push(region.clone());
                continue;
            }
            out.extend(self.region_offers(req, region, &platforms).await?);
        }
        if out.is_empty() && !without_project.is_empty() {
            return Err(invalid(format!(
                "no project for {}: set [cloud.nebius] projects = {{ {} = \"project-…\" }} (a \
                 Nebius project lives in one region)",
                without_project.join(", "),
                without_project[0]
            )));
        }
        Ok(out)
    }

    /// Subnet, image and security group (module docs). Returns `{"subnet_id",
    /// "image_id", "security_group_id"}` (the last `null` without ports).
    async fn prepare(&self, offer: &Offer, spec: &InstanceSpec) -> Result<Value> {
        crate::provider::check_spec_lineage(CLOUD, &self.settings.lineage, spec)?;
        let project = self.project(&offer.location.region)?;
        let (subnet, network) = self.subnet(project).await?;
        let image = self.image(spec.image.as_deref()).await?;
        let group = if spec.ports.is_empty() {
            None
        } else {
            Some(self.ensure_security_group(project, &network, spec).await?)
        };
        Ok(json!({"subnet_id": subnet, "image_id": image, "security_group_id": group}))
    }

    /// One `InstanceService/Create` (module docs). Returns the instance id.
    async fn create(&self, offer: &Offer, prep: &Value, spec: &InstanceSpec) -> Result<String> {
        let lineage = crate::provider::check_spec_lineage(CLOUD, &self.settings.lineage, spec)?;
        let region = offer.location.region.as_str();
        let project = self.project(region)?;
        let detail = |k: &str| kit::offer::prepared(&offer.detail, k, Value::as_str);
        let field = |k: &str| kit::offer::prepared(prep, k, Value::as_str);
        let (platform, preset) = (detail("platform")?, detail("preset")?);
        let name = instance_name(&spec.vm_name, lineage, &spec.client_token);
        let user_data = crate::provider::boot::cloud_init::render(
            spec.boot_script.as_ref(),
            &[spec.ssh_public_key.as_str()],
        )
        .map_err(|e| invalid(format!("nebius: cloud-init user-data: {e}")))?;
        let security_groups = prep["security_group_id"]
            .as_str()
            .map(|id| vec![compute::SecurityGroup { id: id.to_string() }])
            .unwrap_or_default();
        let req = compute::CreateInstanceRequest {
            metadata: Some(common::ResourceMetadata {
                parent_id: project.to_string(),
                name: name.clone(),
                labels: labels(&spec.vm_name, lineage),
                ..Default::default()
            }),
            spec: Some(compute::InstanceSpec {
                resources: Some(compute::ResourcesSpec {
                    platform: platform.to_string(),
                    size: Some(compute::resources_spec::Size::Preset(preset.to_string())),
                }),
                boot_disk: Some(compute::AttachedDiskSpec {
                    attach_mode: compute::attached_disk_spec::AttachMode::ReadWrite as i32,
                    r#type: Some(compute::attached_disk_spec::Type::ManagedDisk(
                        compute::ManagedDisk {
                            name: format!("{name}-boot"),
                            labels: labels(&spec.vm_name, lineage),
                            spec: Some(compute::DiskSpec {
                                size: Some(compute::disk_spec::Size::SizeGibibytes(i64::from(
                                    spec.disk_gb.unwrap_or(DEFAULT_DISK_GIB),
                                ))),
                                r#type: compute::disk_spec::DiskType::NetworkSsd as i32,
                                source: Some(compute::disk_spec::Source::SourceImageId(
                                    field("image_id")?.to_string(),
                                )),
                                ..Default::default()
                            }),
                        },
                    )),
                    device_id: String::new(),
                }),
                network_interfaces: vec![compute::NetworkInterfaceSpec {
                    subnet_id: field("subnet_id")?.to_string(),
                    name: "eth0".into(),
                    ip_address: Some(compute::IpAddress::default()),
                    public_ip_address: Some(compute::PublicIpAddress::default()),
                    security_groups,
                    ..Default::default()
                }],
                cloud_init_user_data: user_data,
                preemptible: offer.spot.then(|| compute::PreemptibleSpec {
                    on_preemption: compute::preemptible_spec::PreemptionPolicy::Stop as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
        };
        let what = format!("create {} in {region}", offer.instance_type);
        let call = Call::named(CREATE, &what).in_region(region);
        let key = idempotency_key(&spec.client_token);
        let sent = self
            .call(Service::Compute, req, Some(&key), |c, r| async move {
                compute::instance_service_client::InstanceServiceClient::new(c)
                    .create(r)
                    .await
            })
            .await;
        match sent {
            Ok(op) => {
                let id = self.created_id(&op, call)?;
                if id.is_empty() {
                    return Err(ProviderError::new(
                        ErrorKind::Failed,
                        format!("nebius {what}: the operation names no instance"),
                    ));
                }
                self.remember(&id, &spec.vm_name, region, &op);
                Ok(id)
            }
            // Our own name: an earlier send of this attempt made it.
            Err(f) if is_already_there(&f) => match self.instance_by_name(project, &name).await? {
                Some(i)
                    if owner(&seen(&i).identity, lineage, region) == Some(spec.vm_name.clone()) =>
                {
                    Ok(i.metadata.map(|m| m.id).unwrap_or_default())
                }
                _ => Err(self.fail(&f, call)),
            },
            Err(f) => Err(self.fail(&f, call)),
        }
    }

    /// One `InstanceService/List` of the region's project (all pages), then the creates
    /// this process follows there (of `only_vm` when given: one `OperationService/Get`
    /// per create still running; module docs); a followed create whose instance is
    /// listed counts once, as listed. Errors: no project for the region is
    /// `InvalidRequest`, no credential `Credentials`.
    async fn instances(&self, at: &Location, only_vm: Option<&str>) -> Result<Vec<Seen>> {
        if at.cloud != CLOUD {
            return Ok(vec![]);
        }
        let project = self.project(&at.region)?;
        let mut out: Vec<Seen> = self.listing(project).await?.iter().map(seen).collect();
        let lineage = self.settings.lineage.as_str();
        for (vm, id, status) in self.follow_creates(&at.region, only_vm).await? {
            if !out.iter().any(|s| s.instance_id == id) {
                out.push(Seen::new(
                    id,
                    status,
                    Shown::labels(Some(&vm), Some(lineage)),
                ));
            }
        }
        Ok(out)
    }

    /// `InstanceService/Delete` per id; `NOT_FOUND` is success.
    async fn delete(&self, at: &Location, _vm: &str, ids: &[String]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        self.project(&at.region)?;
        for id in ids {
            let what = format!("delete instance {id}");
            let req = compute::DeleteInstanceRequest { id: id.clone() };
            match self
                .call(Service::Compute, req, None, |c, r| async move {
                    compute::instance_service_client::InstanceServiceClient::new(c)
                        .delete(r)
                        .await
                })
                .await
            {
                Ok(op) => {
                    if let Some(s) = op.status.as_ref().filter(|s| s.code != 0) {
                        let f = errors::of_operation(s);
                        if !is_not_found(&f) {
                            return Err(self.fail(&f, Call::named(DELETE, &what)));
                        }
                    }
                }
                Err(f) if is_not_found(&f) => {}
                Err(f) => return Err(self.fail(&f, Call::named(DELETE, &what))),
            }
        }
        Ok(())
    }

    /// Deletes the VM's security group; not found is success, still attached `InUse`.
    async fn cleanup(&self, at: &Location, vm_name: &str) -> Result<()> {
        // Side resources are made in the region's project: with none configured, none
        // can have been made (a prepare refused for want of one made nothing).
        if self.tokens.is_some() && !self.settings.projects.contains_key(&at.region) {
            return Ok(());
        }
        let project = self.project(&at.region)?;
        let name = crate::provider::object_name(vm_name, &self.settings.lineage);
        let Some(g) = self.security_group(project, &name).await? else {
            return Ok(());
        };
        let id = g.metadata.map(|m| m.id).unwrap_or_default();
        let what = format!("delete security group {name}");
        let req = vpc::DeleteSecurityGroupRequest { id };
        match self
            .call(Service::Vpc, req, None, |c, r| async move {
                vpc::security_group_service_client::SecurityGroupServiceClient::new(c)
                    .delete(r)
                    .await
            })
            .await
        {
            Ok(op) => match op.status.as_ref().filter(|s| s.code != 0) {
                Some(s) => Err(self.fail(&errors::of_operation(s), Call::named(CLEANUP, &what))),
                None => Ok(()),
            },
            Err(f) if is_not_found(&f) => Ok(()),
            Err(f) => Err(self.fail(&f, Call::named(CLEANUP, &what))),
        }
    }

    /// `InstanceService/Start`. Errors: as [`errors`] classifies (no capacity to start is
    /// `Capacity`).
    async fn start(&self, at: &Location, _vm: &str, id: &str) -> Result<()> {
        self.project(&at.region)?;
        let what = format!("start instance {id}");
        let req = compute::StartInstanceRequest { id: id.to_string() };
        let op = self
            .call(Service::Compute, req, None, |c, r| async move {
                compute::instance_service_client::InstanceServiceClient::new(c)
                    .start(r)
                    .await
            })
            .await
            .map_err(|f| self.fail(&f, Call::named(CREATE, &what).in_region(&at.region)))?;
        self.created_id(&op, Call::named(CREATE, &what).in_region(&at.region))
            .map(|_| ())
    }
}
