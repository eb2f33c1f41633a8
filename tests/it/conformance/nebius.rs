//! The conformance driver of the Nebius adapter: the local gRPC Nebius of
//! `vendor::nebius` (server stubs generated from the vendor's protos), seeded from the
//! suite's [`World`]. Each region has its project; the main offer is `gpu-h100-sxm` with
//! 8 GPUs ($23.60/h), listed by the projects of the regions with capacity; the second
//! offer is `gpu-h200-sxm` (8 GPUs, $28/h). A capacity fault is Nebius' own: the create is
//! accepted and its operation fails later with `not_enough_resources`. The project key
//! travels in each instance's cloud-init user-data, so no key is registered.

use std::sync::Arc;

use gpuprov::config::{Cloud as CloudName, VmSpec};
use gpuprov::provider::CloudProvider;
use gpuprov::vm::VmRecord;

use super::recover::CliCloud;
use super::{Cloud, Driver, Fault, Scenario, World};
use crate::support::drive;
use crate::vendor::nebius::{
    self as api, no_capacity, platform, quota, rate_limited, Canned, Fake, H100, PRESET8, SENTINEL,
};

pub struct NebiusDriver;

struct NebiusCloud {
    fake: Fake,
    provider: Arc<gpuprov::provider::clouds::nebius::NebiusProvider>,
}

#[async_trait::async_trait]
impl Driver for NebiusDriver {
    fn name(&self) -> &'static str {
        "nebius"
    }

    fn unsupported(&self, s: Scenario) -> Option<&'static str> {
        match s {
            Scenario::KeyFoundByValueNeverRegisteredTwice => {
                Some("Nebius registers no key: each instance's cloud-init user-data carries it")
            }
            _ => None,
        }
    }

    fn regions(&self) -> [&'static str; 2] {
        ["eu-north1", "us-central1"]
    }

    /// B200 is a Nebius platform; an A10 is not.
    fn unplannable_gpu(&self) -> &'static str {
        "A10"
    }

    fn unknown_instance_id(&self) -> &'static str {
        "computeinstance-e00unknown"
    }

    async fn start(&self, world: World) -> Box<dyn Cloud> {
        let [r0, r1] = self.regions();
        let mut w = api::World::default();
        for (region, project) in [(r0, "project-e00north"), (r1, "project-u00central")] {
            let mut platforms = vec![];
            if world.capacity_in.contains(&region) {
                platforms.push(platform(H100, &[(PRESET8, 8)]));
            }
            if world.second_offer_in_first_region && region == r0 {
                platforms.push(platform("gpu-h200-sxm", &[(PRESET8, 8)]));
            }
            w = w.with_project(region, project, platforms);
        }
        match world.create_fault {
            Some(Fault::Capacity) => w.late.push_back(no_capacity()),
            Some(Fault::Quota) => w.fault("InstanceService/Create", quota()),
            Some(Fault::RateLimited { retry_after_secs }) => w.fault(
                "InstanceService/Create",
                rate_limited(retry_after_secs * 1000),
            ),
            None => {}
        }
        if world.echo_credential {
            w.echo_auth = true;
            w.fault(
                "PlatformService/List",
                Canned::new(tonic::Code::Unauthenticated, "token refused"),
            );
        }
        let fake = Fake::start(w);
        let provider = fake.provider();
        Box::new(NebiusCloud { fake, provider })
    }
}

impl Cloud for NebiusCloud {
    fn provider(&self) -> Arc<dyn CloudProvider> {
        self.provider.clone()
    }

    fn vm(&self) -> VmSpec {
        drive::gpu_vm(CloudName::Nebius, "H100", 8)
    }

    fn creates(&self) -> Vec<String> {
        self.fake.create_regions()
    }

    fn instances(&self) -> usize {
        self.fake.live()
    }

    fn key_registrations(&self) -> usize {
        0
    }

    /// Security groups and their rules.
    fn side_resources(&self) -> usize {
        let w = self.fake.world.lock().unwrap();
        w.groups.len() + w.rules.len()
    }

    /// The test service account's credentials file, written as `nebius-sa.json`; the
    /// project of each region in `[cloud.nebius]`.
    fn cli(&self, dir: &std::path::Path) -> Option<CliCloud> {
        let file = dir.join("nebius-sa.json");
        let creds = serde_json::json!({"subject-credentials": {
            "type": "JWT", "alg": "RS256", "private-key": api::KEY_PEM,
            "kid": api::KEY_ID, "iss": api::SA_ID, "sub": api::SA_ID,
        }});
        std::fs::write(&file, creds.to_string()).unwrap();
        let projects: Vec<String> = self
            .fake
            .world
            .lock()
            .unwrap()
            .projects
            .iter()
            .map(|(region, project)| format!("{region} = \"{project}\""))
            .collect();
        Some(CliCloud {
            env: vec![
                ("GPUPROV_NEBIUS_ENDPOINT".into(), self.fake.url.clone()),
                (
                    "GPUPROV_NEBIUS_CREDENTIALS_FILE".into(),
                    file.display().to_string(),
                ),
            ],
            config: format!("[cloud.nebius]\nprojects = {{ {} }}\n", projects.join(", ")),
        })
    }

    fn secret(&self) -> Option<&'static str> {
        Some(SENTINEL)
    }

    fn check_launched(&self, vm: &VmRecord) {
        assert_eq!(
            vm.offer.id,
            "nebius/eu-north1/gpu-h100-sxm/8gpu-128vcpu-1600gb"
        );
        assert_eq!(vm.offer.price_per_hour, 23.6);
        assert_eq!(vm.user, "ubuntu");
        assert_eq!(vm.ssh.port, 22);
        assert!(vm.ssh.host.starts_with("127.0.0."), "{}", vm.ssh.host);
        assert!(
            vm.instance_id.starts_with("computeinstance-"),
            "{}",
            vm.instance_id
        );
    }

    fn check_after(&self, s: Scenario) {
        let w = self.fake.world.lock().unwrap();
        match s {
            Scenario::RetryAfterOnTheSameOffer => {
                let names: Vec<&str> = w
                    .creates
                    .iter()
                    .map(|c| c.metadata.as_ref().unwrap().name.as_str())
                    .collect();
                assert_eq!(
                    names[0], names[1],
                    "nebius: the same attempt, the same name"
                );
            }
            Scenario::CapacityFailsOver => {
                assert_eq!(
                    w.live().len(),
                    1,
                    "nebius: the late-refused create left nothing"
                )
            }
            _ => {}
        }
    }

    /// Stopped as its user would (the instance's state `STOPPED`).
    fn stop(&self, id: &str) {
        use gpuprov::provider::clouds::nebius::proto::nebius::compute::v1::instance_status::InstanceState;
        self.fake
            .world
            .lock()
            .unwrap()
            .set_state(id, InstanceState::Stopped);
    }
}
