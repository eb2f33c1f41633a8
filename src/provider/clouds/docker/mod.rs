//! The Docker test cloud: each "instance" is a local container running sshd, reachable on a
//! loopback port. It exists so the whole launch/teardown machinery can be exercised for
//! real (SSH included) without a cloud account.
//!
//! Talks to the Docker Engine API through bollard (never the `docker` CLI), negotiating the
//! API version so old daemons (Engine 20.10 = API 1.41) work. Nothing is ever pulled: the
//! base image must exist locally (`scripts/build-base-image.sh` makes it offline).
//!
//! Mapping onto the contract (design 5): one offer `docker/local/container`; `prepare`
//! builds the sshd image if missing; `create` runs a labelled container; `instances` lists
//! containers by label and by gpuprov name (imported ones); `delete` force-removes;
//! `cleanup` removes labelled volumes and networks (normally none).

mod errors;
mod image;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use bollard::errors::Error as DockerError;
use bollard::models::{
    ContainerCreateBody, ContainerSummary, ContainerSummaryStateEnum, HostConfig, PortBinding,
    PortTypeEnum,
};
use bollard::query_parameters::{
    BuildImageOptions, CreateContainerOptions, ListContainersOptions, ListNetworksOptions,
    ListVolumesOptions, RemoveContainerOptions, RemoveVolumeOptions, StartContainerOptions,
};
use bollard::{Docker, API_DEFAULT_VERSION};
use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::OnceCell;

pub use errors::classify;
use errors::{classify_at, is_conflict, is_not_found};
pub use image::{sshd_image_tag, MANAGED_LABEL, SSHD_REPOSITORY};

use crate::provider::kit::Adapter;
use crate::provider::{
    Capabilities, CloudProvider, ErrorKind, Feature, Imported, InstanceSpec, InstanceStatus,
    Lineage, Location, Naming, Offer, ProviderError, ResourceRequest, Result, Seen, Shown,
    SshEndpoint, IDENTITY_LABEL, LINEAGE_LABEL,
};

/// The base image used when config does not name one.
pub const DEFAULT_BASE_IMAGE: &str = "gpuprov/debian-sshd-base:bookworm";
/// Environment variable that overrides the configured endpoint (see
/// [`DockerSettings::from_env_and_config`]).
pub const ENDPOINT_ENV: &str = "GPUPROV_DOCKER_ENDPOINT";
/// The cloud name, region and instance type of the single offer.
pub const CLOUD: &str = "docker";
/// The only region of the Docker test cloud.
pub const REGION: &str = "local";
/// The offer's instance type.
pub const INSTANCE_TYPE: &str = "container";
/// The id of the single offer.
pub const OFFER_ID: &str = "docker/local/container";
/// The Docker test cloud's single offer: [`OFFER_ID`] at [`CLOUD`]/[`REGION`], free
/// (0.0 USD per hour), no GPU. What `offers` answers and what a record of a machine up
/// there carries.
pub fn offer() -> Offer {
    Offer {
        id: OFFER_ID.to_string(),
        location: Location {
            cloud: CLOUD.to_string(),
            region: REGION.to_string(),
            zone: None,
        },
        instance_type: INSTANCE_TYPE.to_string(),
        gpu: None,
        gpu_count: 0,
        spot: false,
        price_per_hour: 0.0,
        detail: serde_json::Value::Null,
        facts: Default::default(),
    }
}

/// Label carrying `InstanceSpec::client_token` on each container (informational: Docker has
/// no idempotency token; the deterministic container name gives idempotency instead).
pub const CLIENT_TOKEN_LABEL: &str = "gpuprov-client-token";
/// The only host address ports are published on: containers are never reachable from
/// other machines.
pub const LOOPBACK: &str = "127.0.0.1";
/// Per-request read/write timeout of the Engine connection, seconds.
const REQUEST_TIMEOUT_SECS: u64 = 120;
/// Build log lines quoted in a build failure.
const BUILD_LOG_TAIL: usize = 20;

/// Configuration of the Docker test cloud.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerSettings {
    /// Local image the sshd image is built `FROM`; never pulled. Default
    /// [`DEFAULT_BASE_IMAGE`].
    pub base_image: String,
    /// Engine endpoint: `unix:///path/docker.sock` (or a bare socket path), `tcp://host:port`
    /// or `http://host:port`. `None` means `DOCKER_HOST`, else `unix:///var/run/docker.sock`.
    pub endpoint: Option<String>,
    /// The state's lineage (a UUID). The identity rule gives `observe` only containers
    /// labelled (or, imported, named) with it, and `create` refuses a spec of another
    /// lineage, so two projects never see each other's containers.
    pub lineage: Lineage,
}

impl DockerSettings {
    /// The default settings (default socket and base image) for `lineage`.
    pub fn new(lineage: Lineage) -> Self {
        DockerSettings {
            base_image: DEFAULT_BASE_IMAGE.to_string(),
            endpoint: None,
            lineage,
        }
    }
}

impl DockerSettings {
    /// Settings from `[cloud.docker]` values plus the environment. Endpoint precedence:
    /// env `GPUPROV_DOCKER_ENDPOINT` (non-empty) > `endpoint` > `DOCKER_HOST` (resolved at
    /// connect time) > the default socket. `base_image` defaults to [`DEFAULT_BASE_IMAGE`].
    pub fn from_env_and_config(
        endpoint: Option<String>,
        base_image: Option<String>,
        lineage: Lineage,
    ) -> Self {
        DockerSettings {
            base_image: base_image
                .filter(|s| !s.trim().is_empty())
                .unwrap_or_else(|| DEFAULT_BASE_IMAGE.to_string()),
            endpoint: crate::provider::endpoint_from(ENDPOINT_ENV, endpoint),
            lineage,
        }
    }

    /// The endpoint as it will be used, for messages: the explicit one, else `DOCKER_HOST`,
    /// else the default socket.
    pub fn effective_endpoint(&self) -> String {
        self.endpoint
            .clone()
            .or_else(|| std::env::var("DOCKER_HOST").ok().filter(|s| !s.is_empty()))
            .unwrap_or_else(|| "unix:///var/run/docker.sock".to_string())
    }
}

/// The Docker test cloud adapter (cloud name `"docker"`).
///
/// Construction never touches the daemon: the Engine connection is opened (and the API
/// version negotiated) on the first call that needs it, so `plan` works without Docker and
/// a daemon that comes up later is picked up by the next call.
pub struct DockerProvider {
    settings: DockerSettings,
    docker: OnceCell<Docker>,
    adapter: Adapter,
}

impl DockerProvider {
    /// An adapter for `settings`. Never fails and does no I/O.
    pub fn new(settings: DockerSettings) -> Self {
        let endpoint = settings.endpoint.as_deref();
        let adapter = Adapter::new(CLOUD, endpoint, Self::default_capabilities())
            .with_lineage(&settings.lineage);
        DockerProvider {
            settings,
            docker: OnceCell::new(),
            adapter,
        }
    }

    /// [`Feature::Start`] (`docker start` restarts a stopped container with its
    /// filesystem), [`Feature::Import`] and [`Feature::Diagnose`]; no GPU, spot, boot
    /// script, firewall or Kubernetes. Short timeouts because a container starts in about
    /// a second. Needs no credential.
    pub fn default_capabilities() -> Capabilities {
        Capabilities {
            supported: vec![Feature::Start, Feature::Import, Feature::Diagnose],
            boot_timeout: Duration::from_secs(60),
            ssh_timeout: Duration::from_secs(60),
            delete_timeout: Duration::from_secs(60),
            poll_interval: Duration::from_millis(500),
            max_concurrency: 4,
            min_create_interval: Duration::ZERO,
            rate_limits: Vec::new(),
            create_list_lag: Duration::from_secs(2),
            default_regions: Vec::new(),
            keeps_offer_order: false,
        }
    }

    /// Checks that the Engine answers; returns the endpoint it answered on.
    ///
    /// Errors: `Transient` when the daemon cannot be reached (the message names the socket).
    pub async fn ping(&self) -> Result<String> {
        let d = self.docker().await?;
        d.ping().await.map_err(|e| self.err(e))?;
        Ok(self.settings.effective_endpoint())
    }

    /// The settings this adapter was built with.
    pub fn settings(&self) -> &DockerSettings {
        &self.settings
    }

    /// The container name for a VM: `gpuprov-<vm_name>-<first 8 chars of lineage>`. The
    /// lineage prefix keeps two projects' VMs of the same name apart; the fixed name is what
    /// makes `create` idempotent (the Engine answers 409 to a second create).
    pub fn container_name(vm_name: &str, lineage: &str) -> String {
        let short: String = lineage.chars().take(8).collect();
        format!("gpuprov-{vm_name}-{short}")
    }

    fn err(&self, e: DockerError) -> ProviderError {
        classify_at(e, &self.settings.effective_endpoint())
    }

    /// The Engine client, connecting and negotiating the API version on first use. A
    /// failed attempt is not cached, so the next call tries again.
    async fn docker(&self) -> Result<&Docker> {
        self.docker
            .get_or_try_init(|| async {
                let docker = self.connect().map_err(|e| self.err(e))?;
                docker.negotiate_version().await.map_err(|e| self.err(e))
            })
            .await
    }

    fn connect(&self) -> Result<Docker, DockerError> {
        match self.settings.endpoint.as_deref() {
            // bollard reads DOCKER_HOST (unix://, tcp://, http://) and falls back to the
            // default socket, which is exactly the docker CLI's behaviour.
            None => Docker::connect_with_defaults(),
            Some(e) if e.starts_with("unix://") || e.starts_with('/') => {
                Docker::connect_with_unix(e, REQUEST_TIMEOUT_SECS, API_DEFAULT_VERSION)
            }
            Some(e) if e.starts_with("tcp://") || e.starts_with("http://") => {
                Docker::connect_with_http(e, REQUEST_TIMEOUT_SECS, API_DEFAULT_VERSION)
            }
            Some(e) => Err(DockerError::UnsupportedURISchemeError { uri: e.to_string() }),
        }
    }

    fn lineage(&self) -> &str {
        self.settings.lineage.as_str()
    }

    /// Engine `filters` selecting objects of `vm_name` in this lineage (both labels must
    /// match: repeated `label` filters are ANDed by the Engine).
    fn identity_filters(&self, vm_name: &str) -> Result<HashMap<String, Vec<String>>> {
        let lineage = self.lineage();
        Ok(HashMap::from([(
            "label".to_string(),
            vec![
                format!("{IDENTITY_LABEL}={vm_name}"),
                format!("{LINEAGE_LABEL}={lineage}"),
            ],
        )]))
    }

    /// Builds `tag` from `base` through `POST /build` (classic builder) and checks the
    /// result. Build errors arrive in the JSON stream (`error`/`errorDetail`), not as an
    /// HTTP status, so the stream is read to the end.
    async fn build_sshd_image(&self, docker: &Docker, base: &str, tag: &str) -> Result<()> {
        let context = image::build_context(base).map_err(|e| {
            ProviderError::new(ErrorKind::Failed, format!("packing the build context: {e}"))
        })?;
        let options = BuildImageOptions {
            dockerfile: "Dockerfile".to_string(),
            t: Some(tag.to_string()),
            rm: true,
            forcerm: true,
            // Never contact a registry: the base image is local by contract.
            pull: None,
            labels: Some(HashMap::from([(
                MANAGED_LABEL.to_string(),
                "true".to_string(),
            )])),
            ..Default::default()
        };
        let mut stream =
            docker.build_image(options, None, Some(bollard::body_full(context.into())));
        let mut log: Vec<String> = Vec::new();
        let mut failure: Option<String> = None;
        while let Some(item) = stream.next().await {
            match item {
                Ok(info) => {
                    if let Some(s) = info.stream {
                        log.extend(
                            s.lines()
                                .filter(|l| !l.trim().is_empty())
                                .map(str::to_string),
                        );
                    }
                    let detail = info.error_detail.and_then(|d| d.message);
                    if let Some(e) = info.error.or(detail) {
                        failure = Some(e);
                    }
                }
                Err(e @ DockerError::DockerStreamError { .. }) => {
                    failure = Some(e.to_string());
                    break;
                }
                Err(e) => return Err(self.err(e)),
            }
        }
        if let Some(reason) = failure {
            let tail = log[log.len().saturating_sub(BUILD_LOG_TAIL)..].join("\n");
            return Err(ProviderError::new(
                ErrorKind::Failed,
                format!(
                    "building {tag} from {base} failed: {reason}\n--- build log tail ---\n{tail}"
                ),
            ));
        }
        match docker.inspect_image(tag).await {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Err(ProviderError::new(
                ErrorKind::Failed,
                format!("building {tag} reported success but the image does not exist"),
            )),
            Err(e) => Err(self.err(e)),
        }
    }

    /// Looks up an existing container by name after a 409 on create, checks it is ours and
    /// starts it if it is not running (`POST /containers/{id}/start` answers 304 when it
    /// already runs, which bollard treats as success).
    async fn adopt_existing(
        &self,
        docker: &Docker,
        name: &str,
        spec: &InstanceSpec,
    ) -> Result<String> {
        let info = docker
            .inspect_container(
                name,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
            .map_err(|e| {
                if is_not_found(&e) {
                    // Removed between our create and inspect: let the core retry the create.
                    ProviderError::transient(format!("container {name} vanished during create"))
                } else {
                    self.err(e)
                }
            })?;
        let labels = info
            .config
            .as_ref()
            .and_then(|c| c.labels.clone())
            .unwrap_or_default();
        if labels.get(IDENTITY_LABEL).map(String::as_str) != Some(spec.vm_name.as_str())
            || labels.get(LINEAGE_LABEL).map(String::as_str) != Some(spec.lineage.as_str())
        {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "a container named {name} exists but is not labelled {IDENTITY_LABEL}={} / \
                     {LINEAGE_LABEL}={}; remove it or rename the VM",
                    spec.vm_name, spec.lineage
                ),
            ));
        }
        let id = info.id.ok_or_else(|| {
            ProviderError::new(ErrorKind::Failed, format!("container {name} has no id"))
        })?;
        let running = info.state.as_ref().and_then(|s| s.running).unwrap_or(false);
        if !running {
            // A stopped container of this identity is not this create's to start: the
            // retried step observes it and decides whether it is ours.
            return Err(ProviderError::transient(format!(
                "a stopped container named {name} with this identity already exists"
            )));
        }
        Ok(id)
    }

    /// The normalised status of a listed container (`State` of `GET /containers/json`).
    /// Dead containers are inspected for `State.ExitCode` / `State.Error` so the reason says
    /// what happened.
    async fn status_of(&self, docker: &Docker, c: &ContainerSummary) -> InstanceStatus {
        match c.state {
            Some(ContainerSummaryStateEnum::RUNNING) => InstanceStatus::Running,
            Some(ContainerSummaryStateEnum::CREATED | ContainerSummaryStateEnum::RESTARTING) => {
                InstanceStatus::Pending
            }
            Some(ContainerSummaryStateEnum::PAUSED | ContainerSummaryStateEnum::EXITED) => {
                InstanceStatus::Stopped
            }
            Some(ContainerSummaryStateEnum::REMOVING) => InstanceStatus::Terminating,
            Some(ContainerSummaryStateEnum::DEAD) => {
                let id = c.id.clone().unwrap_or_default();
                let state = docker
                    .inspect_container(
                        &id,
                        None::<bollard::query_parameters::InspectContainerOptions>,
                    )
                    .await
                    .ok()
                    .and_then(|i| i.state);
                let code = state.as_ref().and_then(|s| s.exit_code);
                let error = state.and_then(|s| s.error).filter(|e| !e.is_empty());
                InstanceStatus::Failed(dead_reason(code, error.as_deref(), c.status.as_deref()))
            }
            Some(ContainerSummaryStateEnum::EMPTY) | None => InstanceStatus::Failed(format!(
                "container reports no state ({})",
                c.status.as_deref().unwrap_or("no status")
            )),
        }
    }
}

fn dead_reason(code: Option<i64>, error: Option<&str>, status: Option<&str>) -> String {
    let mut reason = "container is dead".to_string();
    if let Some(code) = code {
        reason.push_str(&format!(", exit code {code}"));
    }
    if let Some(error) = error {
        reason.push_str(&format!(", error: {error}"));
    } else if let Some(status) = status.filter(|s| !s.is_empty()) {
        reason.push_str(&format!(" ({status})"));
    }
    reason
}

/// The SSH endpoint of a listed container: its `Ports[]` entry with `PrivatePort` 22,
/// `Type` tcp and a `PublicPort`. Only when running: a stopped container keeps no binding
/// worth dialling. The host is always [`LOOPBACK`] because that is where `create` binds.
fn ssh_endpoint(c: &ContainerSummary) -> Option<SshEndpoint> {
    if c.state != Some(ContainerSummaryStateEnum::RUNNING) {
        return None;
    }
    let port = c.ports.as_ref()?.iter().find_map(|p| {
        let tcp = p.typ.is_none_or(|t| t == PortTypeEnum::TCP);
        // Skip an IPv6 binding: the host we report is the IPv4 loopback.
        let v4 = p.ip.as_deref().is_none_or(|ip| !ip.contains(':'));
        (p.private_port == 22 && tcp && v4)
            .then_some(p.public_port)
            .flatten()
    })?;
    (port != 0).then(|| SshEndpoint {
        host: LOOPBACK.to_string(),
        port,
        user: Some("root".to_string()),
    })
}

fn is_local(at: &Location) -> bool {
    at.cloud == CLOUD && at.region == REGION
}

#[async_trait]
impl CloudProvider for DockerProvider {
    /// Name, endpoint and capabilities ([`DockerProvider::default_capabilities`]); no credential.
    fn adapter(&self) -> &Adapter {
        &self.adapter
    }

    /// Exactly one free offer, [`OFFER_ID`]. Errors (`InvalidRequest`): any GPU ask, a spot
    /// ask, or a non-empty `regions` list without `local`. Needs no daemon.
    async fn plan(&self, req: &ResourceRequest) -> Result<Vec<Offer>> {
        let invalid = |msg: String| Err(ProviderError::new(ErrorKind::InvalidRequest, msg));
        if req.gpu.is_some() || req.gpu_count > 0 {
            return invalid("the docker test cloud has no GPUs".to_string());
        }
        if req.spot {
            return invalid("the docker test cloud has no spot instances".to_string());
        }
        if !req.regions.is_empty() && !req.regions.iter().any(|r| r == REGION) {
            return invalid(format!(
                "the docker test cloud has only region `{REGION}`; asked for {}",
                req.regions
                    .iter()
                    .map(|r| format!("`{r}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        Ok(vec![offer()])
    }

    /// Ensures the sshd image [`sshd_image_tag`]`(base)` exists, building it through the
    /// Engine's `POST /build` when missing, where `base` is `spec.image` or
    /// `DockerSettings::base_image`. Returns `{"image": "<tag>"}`.
    ///
    /// Errors: base image missing → `InvalidRequest` (run `scripts/build-base-image.sh`);
    /// daemon unreachable → `Transient` naming the endpoint; build failure → `Failed` with
    /// the build log tail.
    async fn prepare(&self, _offer: &Offer, spec: &InstanceSpec) -> Result<Value> {
        let base = spec
            .image
            .clone()
            .unwrap_or_else(|| self.settings.base_image.clone());
        let tag = sshd_image_tag(&base);
        let docker = self.docker().await?;
        match docker.inspect_image(&tag).await {
            Ok(_) => return Ok(serde_json::json!({ "image": tag })),
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(self.err(e)),
        }
        match docker.inspect_image(&base).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {
                return Err(ProviderError::new(
                    ErrorKind::InvalidRequest,
                    format!(
                        "base image {base} does not exist locally and cannot be pulled; run \
                         scripts/build-base-image.sh (or set [cloud.docker] base_image to a \
                         local image with openssh-server)"
                    ),
                ))
            }
            Err(e) => return Err(self.err(e)),
        }
        self.build_sshd_image(docker, &base, &tag).await?;
        Ok(serde_json::json!({ "image": tag }))
    }

    /// Creates and starts container [`DockerProvider::container_name`] from
    /// `prep["image"]`, labelled `gpuprov-vm-name`, `gpuprov-lineage` and
    /// `gpuprov-client-token`, with `GPUPROV_AUTHORIZED_KEY` = the public key, port 22 and
    /// `spec.ports` published on 127.0.0.1 at random host ports (`HostConfig.PortBindings`
    /// with an empty `HostPort`). Idempotent: on 409 (name taken) it adopts the existing
    /// container, starting it if needed. Returns the container id.
    async fn create(&self, _offer: &Offer, prep: &Value, spec: &InstanceSpec) -> Result<String> {
        let lineage = crate::provider::check_spec_lineage(CLOUD, &self.settings.lineage, spec)?.as_str();
        let key = spec.ssh_public_key.trim();
        if key.is_empty() || key.contains('\n') {
            // The entrypoint refuses to start without a key; fail here instead of letting
            // the core wait out the boot timeout on an exited container.
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                "the SSH public key must be one non-empty line",
            ));
        }
        let image = prep.get("image").and_then(|v| v.as_str()).ok_or_else(|| {
            ProviderError::new(ErrorKind::InvalidRequest, "prepared data has no `image`")
        })?;
        let name = Self::container_name(&spec.vm_name, lineage);
        let docker = self.docker().await?;

        let mut ports: Vec<u16> = vec![22];
        ports.extend(spec.ports.iter().copied().filter(|p| *p != 22));
        ports.sort_unstable();
        ports.dedup();
        let keys: Vec<String> = ports.iter().map(|p| format!("{p}/tcp")).collect();
        let bindings = keys
            .iter()
            .map(|k| {
                let b = PortBinding {
                    host_ip: Some(LOOPBACK.to_string()),
                    // Empty HostPort = the Engine picks a free ephemeral port.
                    host_port: Some(String::new()),
                };
                (k.clone(), Some(vec![b]))
            })
            .collect();
        let body = ContainerCreateBody {
            image: Some(image.to_string()),
            env: Some(vec![format!("GPUPROV_AUTHORIZED_KEY={key}")]),
            labels: Some(HashMap::from([
                (IDENTITY_LABEL.to_string(), spec.vm_name.clone()),
                (LINEAGE_LABEL.to_string(), lineage.to_string()),
                (CLIENT_TOKEN_LABEL.to_string(), spec.client_token.clone()),
                (MANAGED_LABEL.to_string(), "true".to_string()),
            ])),
            exposed_ports: Some(keys.iter().map(|k| (k.clone(), HashMap::new())).collect()),
            host_config: Some(HostConfig {
                port_bindings: Some(bindings),
                // docker-init as PID 1 reaps the zombies of SSH sessions and forwards
                // signals, so `docker stop` is quick.
                init: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        };
        let options = CreateContainerOptions {
            name: Some(name.clone()),
            ..Default::default()
        };
        let id = match docker.create_container(Some(options), body).await {
            Ok(resp) => resp.id,
            Err(e) if is_conflict(&e) => return self.adopt_existing(docker, &name, spec).await,
            Err(e) if is_not_found(&e) => {
                return Err(ProviderError::new(
                    ErrorKind::Failed,
                    format!("image {image} is missing (was it removed after prepare?)"),
                ))
            }
            Err(e) => return Err(self.err(e)),
        };
        docker
            .start_container(&id, None::<StartContainerOptions>)
            .await
            .map_err(|e| self.err(e))?;
        Ok(id)
    }

    /// Two `GET /containers/json?all=true` listings (Engine API `ContainerList` `filters`:
    /// `label=key` or `label=key=value`, `name=<regexp>` over `/NAME`): the containers
    /// carrying the `gpuprov-vm-name` label (for one VM: both identity labels of it), and
    /// those named `gpuprov-<vm>-<lineage8>` (any VM's, or that VM's: how an imported
    /// container carries the identity, labels being fixed at create); each once, showing
    /// its labels and name. `State` maps: created/restarting → Pending, running →
    /// Running, paused/exited → Stopped, removing → Terminating, dead → Failed(exit code,
    /// `State.Error`). The SSH endpoint (`127.0.0.1`, the published host port of `22/tcp`,
    /// user `root`) is set only while running; the instance type is the image, the
    /// creation time the summary's `Created` (Unix seconds), the price 0 (the test cloud
    /// bills nothing). A location other than `docker/local` holds nothing.
    async fn instances(&self, at: &Location, only_vm: Option<&str>) -> Result<Vec<Seen>> {
        if !is_local(at) {
            return Ok(vec![]);
        }
        let labels = match only_vm {
            Some(vm) => self.identity_filters(vm)?,
            None => HashMap::from([("label".to_string(), vec![IDENTITY_LABEL.to_string()])]),
        };
        let name = format!(
            "^/{}$",
            Self::container_name(only_vm.unwrap_or(".+"), self.lineage())
        );
        let by_name = HashMap::from([("name".to_string(), vec![name])]);
        let docker = self.docker().await?;
        let mut found: Vec<ContainerSummary> = Vec::new();
        for filters in [labels, by_name] {
            let options = ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            };
            let listed = docker.list_containers(Some(options)).await;
            for c in listed.map_err(|e| self.err(e))? {
                if c.id.is_some() && !found.iter().any(|f| f.id == c.id) {
                    found.push(c);
                }
            }
        }
        let mut out = Vec::with_capacity(found.len());
        for c in &found {
            let label = |k: &str| c.labels.as_ref().and_then(|l| l.get(k)).map(String::as_str);
            let name = c
                .names
                .iter()
                .flatten()
                .next()
                .map(|n| n.trim_start_matches('/'));
            let identity = Shown::labels(label(IDENTITY_LABEL), label(LINEAGE_LABEL))
                .named(name, Naming::Object);
            out.push(Seen {
                ssh: ssh_endpoint(c),
                instance_type: c.image.clone(),
                price_per_hour: Some(0.0),
                created_at: c
                    .created
                    .and_then(|t| chrono::DateTime::from_timestamp(t, 0)),
                ..Seen::new(
                    c.id.clone().unwrap_or_default(),
                    self.status_of(docker, c).await,
                    identity,
                )
            });
        }
        Ok(out)
    }

    /// `GET /containers/{id}/json`, then `POST /containers/{id}/rename` to the VM's
    /// container name: the Engine cannot change a container's labels, so an imported
    /// container carries the identity by name, which `observe` also matches. A container
    /// already carrying this identity is taken as it is; one labelled for another VM or
    /// lineage is refused, and so is a rename to a name in use (409).
    async fn import(&self, at: &Location, vm_name: &str, id: &str) -> Result<Imported> {
        if !is_local(at) {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                format!("the docker test cloud has no location {at}"),
            ));
        }
        let docker = self.docker().await?;
        let info = docker
            .inspect_container(
                id,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
            .map_err(|e| {
                if is_not_found(&e) {
                    ProviderError::new(
                        ErrorKind::InvalidRequest,
                        format!("no container {id} at {at}"),
                    )
                } else {
                    self.err(e)
                }
            })?;
        let full_id = info.id.clone().unwrap_or_else(|| id.to_string());
        let labels = info
            .config
            .as_ref()
            .and_then(|c| c.labels.clone())
            .unwrap_or_default();
        let lineage = self.lineage();
        let identity =
            match (labels.get(IDENTITY_LABEL), labels.get(LINEAGE_LABEL)) {
                (Some(v), Some(l)) if v == vm_name && l == lineage => {
                    "already labelled with this identity".to_string()
                }
                (Some(v), l) => return Err(ProviderError::new(
                    ErrorKind::InvalidRequest,
                    format!(
                        "container {id} belongs to gpuprov VM {v} of lineage {}",
                        l.map(String::as_str).unwrap_or("(none)")
                    ),
                )
                .with_help(
                    "`gpuprov state recover` rebuilds a lost state; `gpuprov state mv` renames \
                     a machine",
                )),
                (None, _) => {
                    let name = Self::container_name(vm_name, lineage);
                    if info.name.as_deref() != Some(&format!("/{name}")) {
                        let options =
                            bollard::query_parameters::RenameContainerOptionsBuilder::default()
                                .name(&name)
                                .build();
                        docker
                            .rename_container(&full_id, options)
                            .await
                            .map_err(|e| {
                                if is_conflict(&e) {
                                    ProviderError::new(
                                        ErrorKind::InvalidRequest,
                                        format!("a container named {name} already exists"),
                                    )
                                } else {
                                    self.err(e)
                                }
                            })?;
                    }
                    format!(
                    "renamed to {name} (the Engine cannot change a container's labels: gpuprov \
                     finds it by this name)"
                )
                }
            };
        let seen = self.observe(at, vm_name).await?;
        let observed = seen
            .into_iter()
            .find(|o| o.instance_id == full_id)
            .ok_or_else(|| {
                ProviderError::transient(format!(
                    "container {id} is not listed under {vm_name} after the import"
                ))
            })?;
        Ok(Imported { observed, identity })
    }

    /// Starts a stopped container (`POST /containers/{id}/start`; 304 "already started"
    /// is success, as bollard reports it), or unpauses a paused one (`POST
    /// /containers/{id}/unpause`). A container that no longer exists is `Failed`.
    async fn start(&self, at: &Location, _vm_name: &str, instance_id: &str) -> Result<()> {
        if !is_local(at) {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                format!("the docker test cloud has no location {at}"),
            ));
        }
        let docker = self.docker().await?;
        // `docker pause` shows as Stopped; a paused container is unpaused, not started.
        let paused = docker
            .inspect_container(
                instance_id,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
            .ok()
            .and_then(|i| i.state)
            .and_then(|s| s.status)
            == Some(bollard::models::ContainerStateStatusEnum::PAUSED);
        let start = || docker.start_container(instance_id, None::<StartContainerOptions>);
        let started = if paused {
            // Unpaused meanwhile: an ordinary start (a no-op when it runs).
            match docker.unpause_container(instance_id).await {
                Ok(()) => Ok(()),
                Err(_) => start().await,
            }
        } else {
            start().await
        };
        match started {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Err(ProviderError::new(
                ErrorKind::Failed,
                format!("container {instance_id} no longer exists"),
            )),
            Err(e) => Err(self.err(e)),
        }
    }

    /// The container's own view (`GET /containers/{id}/json`, [`findings_of`]): its
    /// healthcheck, an out-of-memory kill, a restart loop, how it exited. A container that
    /// no longer exists has no findings (`observe` says it is gone); a location other
    /// than `docker/local` holds nothing.
    async fn diagnose(
        &self,
        at: &Location,
        _vm_name: &str,
        instance_id: &str,
    ) -> Result<Vec<crate::provider::Finding>> {
        if !is_local(at) {
            return Ok(vec![]);
        }
        let docker = self.docker().await?;
        match docker
            .inspect_container(
                instance_id,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
        {
            Ok(i) => Ok(i
                .state
                .map(|s| findings_of(&s, i.restart_count))
                .unwrap_or_default()),
            Err(e) if is_not_found(&e) => Ok(vec![]),
            Err(e) => Err(self.err(e)),
        }
    }

    /// Force-removes each container with its anonymous volumes (`DELETE
    /// /containers/{id}?force=true&v=true`). 404 (already gone) and 409 (removal already in
    /// progress) are success. Does not wait.
    async fn delete(&self, _at: &Location, _vm_name: &str, instance_ids: &[String]) -> Result<()> {
        if instance_ids.is_empty() {
            return Ok(());
        }
        let docker = self.docker().await?;
        for id in instance_ids {
            let options = RemoveContainerOptions {
                force: true,
                v: true,
                ..Default::default()
            };
            match docker.remove_container(id, Some(options)).await {
                Ok(()) => {}
                Err(e) if is_not_found(&e) || is_conflict(&e) => {}
                Err(e) => return Err(self.err(e)),
            }
        }
        Ok(())
    }

    /// Removes volumes and networks labelled with the VM identity and lineage. `create`
    /// makes none, so this normally finds nothing; it exists so a future change that adds
    /// such objects cannot leak them. Idempotent: 404 is success.
    async fn cleanup(&self, at: &Location, vm_name: &str) -> Result<()> {
        let filters = self.identity_filters(vm_name)?;
        if !is_local(at) {
            return Ok(());
        }
        let docker = self.docker().await?;
        let volumes = docker
            .list_volumes(Some(ListVolumesOptions {
                filters: Some(filters.clone()),
            }))
            .await
            .map_err(|e| self.err(e))?;
        for v in volumes.volumes.unwrap_or_default() {
            match docker
                .remove_volume(&v.name, Some(RemoveVolumeOptions { force: true }))
                .await
            {
                Ok(()) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(self.err(e)),
            }
        }
        let networks = docker
            .list_networks(Some(ListNetworksOptions {
                filters: Some(filters),
            }))
            .await
            .map_err(|e| self.err(e))?;
        for n in networks {
            let Some(id) = n.id.or(n.name) else { continue };
            match docker.remove_network(&id).await {
                Ok(()) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(self.err(e)),
            }
        }
        Ok(())
    }
}

/// The findings `diagnose` reports for a container's `State` (Docker Engine API,
/// "ContainerInspect"): `Health.Status` unhealthy (with the last check's output) is an
/// error, starting a warning, healthy an info; `OOMKilled` and a daemon `Error` are
/// errors; `Restarting` is a warning; a stopped container's `ExitCode` is an error when
/// non-zero; restarts (`RestartCount`) are an info.
pub fn findings_of(
    state: &bollard::models::ContainerState,
    restart_count: Option<i64>,
) -> Vec<crate::provider::Finding> {
    use crate::provider::{Finding, Severity};
    use bollard::models::HealthStatusEnum;
    let mut out = Vec::new();
    if let Some(h) = &state.health {
        let last = h
            .log
            .as_ref()
            .and_then(|l| l.last())
            .and_then(|r| r.output.as_deref())
            .map(|o| o.trim().lines().next().unwrap_or("").to_string())
            .filter(|o| !o.is_empty());
        match h.status {
            Some(HealthStatusEnum::UNHEALTHY) => out.push(Finding::new(
                Severity::Error,
                format!(
                    "healthcheck unhealthy ({} failures in a row){}",
                    h.failing_streak.unwrap_or(0),
                    last.map(|o| format!(": {o}")).unwrap_or_default()
                ),
            )),
            Some(HealthStatusEnum::STARTING) => {
                out.push(Finding::new(Severity::Warning, "healthcheck starting"))
            }
            Some(HealthStatusEnum::HEALTHY) => {
                out.push(Finding::new(Severity::Info, "healthcheck healthy"))
            }
            _ => {}
        }
    }
    if state.oom_killed == Some(true) {
        out.push(Finding::new(
            Severity::Error,
            "killed by the out-of-memory killer (OOMKilled)",
        ));
    }
    if state.restarting == Some(true) {
        out.push(Finding::new(Severity::Warning, "restarting"));
    }
    if let Some(e) = state.error.as_deref().filter(|e| !e.is_empty()) {
        out.push(Finding::new(Severity::Error, format!("engine error: {e}")));
    }
    if state.running != Some(true) {
        match state.exit_code {
            Some(0) | None => {}
            Some(code) => out.push(Finding::new(
                Severity::Error,
                format!("exited with code {code}"),
            )),
        }
    }
    if let Some(n) = restart_count.filter(|n| *n > 0) {
        out.push(Finding::new(Severity::Info, format!("restarted {n} times")));
    }
    out
}
