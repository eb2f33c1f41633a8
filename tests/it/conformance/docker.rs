//! The conformance driver of the Docker test cloud (`src/provider/clouds/docker/`) on the real
//! local Docker Engine. Every scenario run has its own state lineage (a fresh UUID v4), so
//! parallel tests never see, let alone adopt, each other's containers, and a drop guard
//! force-removes every container of that lineage, even on panic. Only the local Engine
//! is dialled.
//!
//! The adapter is wrapped in [`Counted`], which records every `create` (the Engine keeps
//! no request log) and runs with a 100 ms poll so the launch machine does not hammer the
//! daemon.
//!
//! When the daemon is unreachable the scenarios FAIL with a clear message, unless
//! `GPUPROV_SKIP_DOCKER=1`: then every scenario is declared unsupported on this driver.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bollard::query_parameters::{InspectContainerOptions, ListContainersOptions};
use gpuprov::config::{Cloud as CloudName, VmSpec};
use gpuprov::provider::clouds::docker::{DockerProvider, DockerSettings};
use gpuprov::provider::{
    Capabilities, CloudProvider, InstanceSpec, Lineage, Location, Observed, Offer, ProviderError,
    ResourceRequest, IDENTITY_LABEL, LINEAGE_LABEL,
};
use gpuprov::vm::VmRecord;

use super::recover::CliCloud;
use super::{on_own_runtime, Cloud, Driver, Scenario, World};
use crate::docker_provider::{docker_or_skip, raw_docker, Cleanup};

pub struct DockerDriver;

/// Whether the daemon is unreachable while `GPUPROV_SKIP_DOCKER=1` (checked once, on its
/// own thread and runtime, since `unsupported` is not async).
fn skipped() -> bool {
    static SKIPPED: OnceLock<bool> = OnceLock::new();
    *SKIPPED.get_or_init(|| {
        if std::env::var("GPUPROV_SKIP_DOCKER").as_deref() != Ok("1") {
            return false;
        }
        on_own_runtime(|| async { docker_or_skip("conformance/docker").await.is_none() })
    })
}

/// The Docker adapter with every `create` recorded (region of the offer).
struct Counted {
    inner: DockerProvider,
    creates: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl CloudProvider for Counted {
    fn adapter(&self) -> &gpuprov::provider::kit::Adapter {
        self.inner.adapter()
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            poll_interval: Duration::from_millis(100),
            boot_timeout: Duration::from_secs(20),
            ssh_timeout: Duration::from_secs(5),
            delete_timeout: Duration::from_secs(20),
            ..self.inner.capabilities()
        }
    }

    fn endpoint_override(&self) -> Option<String> {
        self.inner.endpoint_override()
    }

    async fn credentials(&self) -> gpuprov::provider::kit::CredentialReport {
        self.inner.credentials().await
    }

    async fn plan(&self, req: &ResourceRequest) -> Result<Vec<Offer>, ProviderError> {
        self.inner.plan(req).await
    }

    async fn prepare(
        &self,
        offer: &Offer,
        spec: &InstanceSpec,
    ) -> Result<serde_json::Value, ProviderError> {
        self.inner.prepare(offer, spec).await
    }

    async fn create(
        &self,
        offer: &Offer,
        prepared: &serde_json::Value,
        spec: &InstanceSpec,
    ) -> Result<String, ProviderError> {
        self.creates
            .lock()
            .unwrap()
            .push(offer.location.region.clone());
        self.inner.create(offer, prepared, spec).await
    }

    async fn instances(
        &self,
        at: &Location,
        only_vm: Option<&str>,
    ) -> Result<Vec<gpuprov::provider::Seen>, ProviderError> {
        self.inner.instances(at, only_vm).await
    }

    async fn observe(&self, at: &Location, vm_name: &str) -> Result<Vec<Observed>, ProviderError> {
        self.inner.observe(at, vm_name).await
    }

    async fn list(&self, at: &Location) -> Result<Vec<gpuprov::provider::Listed>, ProviderError> {
        self.inner.list(at).await
    }

    async fn observe_location(
        &self,
        at: &Location,
    ) -> Result<Option<gpuprov::provider::Observations>, ProviderError> {
        self.inner.observe_location(at).await
    }

    async fn import(
        &self,
        at: &Location,
        vm_name: &str,
        id: &str,
    ) -> Result<gpuprov::provider::Imported, ProviderError> {
        self.inner.import(at, vm_name, id).await
    }

    async fn delete(
        &self,
        at: &Location,
        vm_name: &str,
        instance_ids: &[String],
    ) -> Result<(), ProviderError> {
        self.inner.delete(at, vm_name, instance_ids).await
    }

    async fn cleanup(&self, at: &Location, vm_name: &str) -> Result<(), ProviderError> {
        self.inner.cleanup(at, vm_name).await
    }

    async fn start(
        &self,
        at: &Location,
        vm_name: &str,
        instance_id: &str,
    ) -> Result<(), ProviderError> {
        self.inner.start(at, vm_name, instance_id).await
    }

    async fn diagnose(
        &self,
        at: &Location,
        vm_name: &str,
        instance_id: &str,
    ) -> Result<Vec<gpuprov::provider::Finding>, ProviderError> {
        self.inner.diagnose(at, vm_name, instance_id).await
    }
}

/// The label the driver puts on the containers it makes outside gpuprov, with the run's
/// lineage as value (not a gpuprov label: the adapter never reads it).
const RUN_LABEL: &str = "gpuprov-conformance-run";

/// Force-removes, on drop, the containers this run made outside gpuprov ([`RUN_LABEL`]).
struct Outside(String);

impl Drop for Outside {
    fn drop(&mut self) {
        let run = self.0.clone();
        on_own_runtime(move || async move {
            let Ok(docker) = raw_docker() else { return };
            let Ok(docker) = docker.negotiate_version().await else {
                return;
            };
            let filters =
                HashMap::from([("label".to_string(), vec![format!("{RUN_LABEL}={run}")])]);
            let options = ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            };
            for c in docker
                .list_containers(Some(options))
                .await
                .unwrap_or_default()
            {
                if let Some(id) = c.id {
                    let remove =
                        bollard::query_parameters::RemoveContainerOptionsBuilder::default()
                            .force(true)
                            .v(true)
                            .build();
                    let _ = docker.remove_container(&id, Some(remove)).await;
                }
            }
        });
    }
}

struct DockerCloud {
    provider: Arc<Counted>,
    lineage: String,
    /// Removes the containers made outside gpuprov on drop.
    _outside: Outside,
    /// Force-removes the lineage's containers on drop; declared last so it runs after
    /// the adapter is gone.
    _cleanup: Cleanup,
}

#[async_trait::async_trait]
impl Driver for DockerDriver {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn unsupported(&self, s: Scenario) -> Option<&'static str> {
        if skipped() {
            return Some("Docker unreachable and GPUPROV_SKIP_DOCKER=1");
        }
        match s {
            Scenario::KeyFoundByValueNeverRegisteredTwice => {
                Some("no key registry: the public key is written into the container at create")
            }
            Scenario::CapacityFailsOver => Some(
                "one region with unlimited local capacity, and no way to make the Engine \
                 refuse a create for capacity: nothing to fail over to",
            ),
            Scenario::QuotaBlocksTheRegion => Some("no quota, and a single region"),
            Scenario::RetryAfterOnTheSameOffer => {
                Some("the local Engine has no rate limit and cannot be made to send a 429")
            }
            Scenario::ExactRegionMatch => Some(
                "one region, `local`; an ask for any other region is InvalidRequest, so \
                 there is no second region to match exactly",
            ),
            Scenario::SecretsNeverInErrors => Some("the Docker cloud has no credential"),
            _ => None,
        }
    }

    fn regions(&self) -> [&'static str; 2] {
        // The only region; the scenarios that need a second one are unsupported.
        ["local", "local"]
    }

    fn offers_are_free(&self) -> bool {
        true
    }

    async fn start(&self, _world: World) -> Box<dyn Cloud> {
        docker_or_skip("conformance/docker")
            .await
            .expect("skipped() declares every scenario unsupported when Docker is off");
        let lineage = uuid::Uuid::new_v4().to_string();
        let inner = DockerProvider::new(DockerSettings {
            lineage: lineage.parse().unwrap(),
            ..DockerSettings::from_env_and_config(None, None, Lineage::random())
        });
        Box::new(DockerCloud {
            provider: Arc::new(Counted {
                inner,
                creates: Mutex::new(Vec::new()),
            }),
            _outside: Outside(lineage.clone()),
            _cleanup: Cleanup {
                lineage: lineage.clone(),
                images: vec![],
            },
            lineage,
        })
    }
}

impl DockerCloud {
    /// The containers of this run's lineage (all states), as the Engine lists them.
    fn containers(&self) -> Vec<bollard::models::ContainerSummary> {
        let lineage = self.lineage.clone();
        on_own_runtime(move || async move {
            let docker = raw_docker().unwrap().negotiate_version().await.unwrap();
            let filters = HashMap::from([(
                "label".to_string(),
                vec![format!("{LINEAGE_LABEL}={lineage}")],
            )]);
            docker
                .list_containers(Some(ListContainersOptions {
                    all: true,
                    filters: Some(filters),
                    ..Default::default()
                }))
                .await
                .unwrap()
        })
    }
}

impl Cloud for DockerCloud {
    fn provider(&self) -> Arc<dyn CloudProvider> {
        self.provider.clone()
    }

    fn vm(&self) -> VmSpec {
        VmSpec::new("trainer", vec![CloudName::Docker])
    }

    fn creates(&self) -> Vec<String> {
        self.provider.creates.lock().unwrap().clone()
    }

    fn instances(&self) -> usize {
        self.containers().len()
    }

    fn key_registrations(&self) -> usize {
        0
    }

    fn lineage(&self) -> &str {
        &self.lineage
    }

    /// Volumes and networks labelled with this run's lineage (the adapter makes none:
    /// a container is the whole machine).
    fn side_resources(&self) -> usize {
        let lineage = self.lineage.clone();
        on_own_runtime(move || async move {
            let docker = raw_docker().unwrap().negotiate_version().await.unwrap();
            let filters = HashMap::from([(
                "label".to_string(),
                vec![format!("{LINEAGE_LABEL}={lineage}")],
            )]);
            let volumes = docker
                .list_volumes(Some(bollard::query_parameters::ListVolumesOptions {
                    filters: Some(filters.clone()),
                }))
                .await
                .unwrap()
                .volumes
                .unwrap_or_default()
                .len();
            let networks = docker
                .list_networks(Some(bollard::query_parameters::ListNetworksOptions {
                    filters: Some(filters),
                }))
                .await
                .unwrap()
                .len();
            volumes + networks
        })
    }

    /// The local Engine the tests use (`DOCKER_HOST` when set).
    fn cli(&self, _dir: &std::path::Path) -> Option<CliCloud> {
        Some(CliCloud {
            env: std::env::var("DOCKER_HOST")
                .map(|h| vec![("DOCKER_HOST".to_string(), h)])
                .unwrap_or_default(),
            config: String::new(),
        })
    }

    fn secret(&self) -> Option<&'static str> {
        None
    }

    fn at(&self, region: &str) -> Location {
        Location {
            cloud: "docker".into(),
            region: region.into(),
            zone: None,
        }
    }

    /// The container carries the VM identity and this run's lineage, is named after
    /// both, and publishes SSH on loopback only.
    fn check_launched(&self, vm: &VmRecord) {
        assert_eq!(vm.ssh.host, "127.0.0.1", "docker: SSH on loopback only");
        let id = vm.instance_id.clone();
        let inspected = on_own_runtime(move || async move {
            let docker = raw_docker().unwrap().negotiate_version().await.unwrap();
            docker
                .inspect_container(&id, None::<InspectContainerOptions>)
                .await
                .unwrap()
        });
        let labels = inspected.config.and_then(|c| c.labels).unwrap_or_default();
        assert_eq!(
            labels.get(IDENTITY_LABEL).map(String::as_str),
            Some("trainer")
        );
        assert_eq!(
            labels.get(LINEAGE_LABEL).map(String::as_str),
            Some(self.lineage.as_str())
        );
        assert_eq!(
            inspected.name.as_deref().map(|n| n.trim_start_matches('/')),
            Some(DockerProvider::container_name("trainer", &self.lineage).as_str())
        );
    }

    /// A running container made outside gpuprov from the base image, named by the user,
    /// with no gpuprov label (a lineage label alone would make it half labelled: no
    /// one's, never imported); the driver's own [`RUN_LABEL`] lets the run's
    /// [`Outside`] guard remove it.
    fn outside_instance(&self, _region: &str) -> Option<String> {
        let lineage = self.lineage.clone();
        Some(on_own_runtime(move || async move {
            let docker = raw_docker().unwrap().negotiate_version().await.unwrap();
            let name = format!("outside-{}", uuid::Uuid::new_v4().simple());
            let body = bollard::models::ContainerCreateBody {
                image: Some(gpuprov::provider::clouds::docker::DEFAULT_BASE_IMAGE.into()),
                cmd: Some(vec!["sleep".into(), "infinity".into()]),
                labels: Some(HashMap::from([(RUN_LABEL.to_string(), lineage)])),
                ..Default::default()
            };
            let options = bollard::query_parameters::CreateContainerOptionsBuilder::default()
                .name(&name)
                .build();
            let id = docker
                .create_container(Some(options), body)
                .await
                .unwrap()
                .id;
            docker
                .start_container(
                    &id,
                    None::<bollard::query_parameters::StartContainerOptions>,
                )
                .await
                .unwrap();
            id
        }))
    }

    fn check_torn_down(&self) {
        assert!(
            self.containers().is_empty(),
            "docker: no container of the lineage is left"
        );
    }

    /// `docker stop`, as the user would; the Engine answers once the container exited.
    fn stop(&self, id: &str) {
        let id = id.to_string();
        on_own_runtime(move || async move {
            let docker = raw_docker().unwrap().negotiate_version().await.unwrap();
            docker
                .stop_container(&id, None::<bollard::query_parameters::StopContainerOptions>)
                .await
                .unwrap();
        })
    }
}
