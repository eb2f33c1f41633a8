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
mod instances;
mod network;
mod offers;
pub mod proto;
mod rpc;
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
use instances::labels;
pub use instances::{idempotency_key, instance_name, seen, status_of};
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
