//! The conformance driver of the Verda adapter: the spec-checked API v1 server of
//! `vendor::verda` (its `World` and `Fake`, OAuth2 token endpoint included). The main
//! offer is `8H100.80S.176V` (8 × H100 at $19.92/h) in the locations `FIN-01` and
//! `ICE-01`. Verda's own word for "no capacity" is the status `no_capacity` of an accepted
//! create, so that is how this cloud refuses the scenarios' first create for capacity.

use std::sync::Arc;

use gpuprov::config::{Cloud as CloudName, VmSpec};
use gpuprov::provider::CloudProvider;
use gpuprov::vm::VmRecord;
use serde_json::json;

use super::recover::CliCloud;
use super::{Cloud, Driver, Fault, Scenario, World};
use crate::support::drive::{self, LINEAGE, PUBKEY};
use crate::support::spec::Canned;
use crate::vendor::verda::{self as api, Fake, H100, INSTANCES, KEYS, SENTINEL, TOKEN};

pub struct VerdaDriver;

struct VerdaCloud {
    fake: Fake,
    provider: Arc<gpuprov::provider::clouds::verda::VerdaProvider>,
}

#[async_trait::async_trait]
impl Driver for VerdaDriver {
    fn name(&self) -> &'static str {
        "verda"
    }

    fn unsupported(&self, s: Scenario) -> Option<&'static str> {
        match s {
            Scenario::QuotaBlocksTheRegion => Some(
                "Verda documents no quota error (the SDKs' ErrorCodes: invalid_request, \
                 unauthorized_request, insufficient_funds, forbidden_action, not_found, \
                 server_error, service_unavailable); insufficient funds aborts",
            ),
            _ => None,
        }
    }

    fn regions(&self) -> [&'static str; 2] {
        ["FIN-01", "ICE-01"]
    }

    fn unknown_instance_id(&self) -> &'static str {
        "deadc0de-ffff-4972-ae4e-d429115d055b"
    }

    async fn start(&self, world: World) -> Box<dyn Cloud> {
        let [r0, _] = self.regions();
        let mut w = api::World::default()
            .with_type(H100, "H100", 8, 19.92, &world.capacity_in)
            .with_type("1A100.22V", "A100", 1, 1.29, &[r0]);
        if world.existing_key {
            let value = PUBKEY.rsplit_once(' ').unwrap().0;
            w.keys = vec![
                json!({"id": "key-a", "name": "someone-else", "key": "ssh-ed25519 AAAAC3NzaOther x"}),
                json!({"id": "key-b", "name": "my-laptop", "key": format!("{value} me@laptop")}),
            ];
        }
        match world.create_fault {
            Some(Fault::Capacity) => w.no_capacity_next = true,
            Some(Fault::Quota) => unreachable!("unsupported on Verda"),
            Some(Fault::RateLimited { retry_after_secs }) => w.faults.push(
                "POST",
                INSTANCES,
                Canned::status(429, api::err("service_unavailable", "Too many requests"))
                    .header("Retry-After", &retry_after_secs.to_string()),
            ),
            None => {}
        }
        if world.echo_credential {
            // A hostile token endpoint echoing the client secret in its refusal.
            w.faults.echo = true;
            w.faults.push(
                "POST",
                TOKEN,
                Canned::status(401, api::err("unauthorized_request", "Invalid client")),
            );
        }
        let fake = Fake::start(w).await;
        let provider = fake.provider();
        Box::new(VerdaCloud { fake, provider })
    }
}

impl Cloud for VerdaCloud {
    fn provider(&self) -> Arc<dyn CloudProvider> {
        self.provider.clone()
    }

    fn vm(&self) -> VmSpec {
        drive::gpu_vm(CloudName::Verda, "H100", 8)
    }

    fn creates(&self) -> Vec<String> {
        self.fake
            .creates()
            .iter()
            .map(|b| b["location_code"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    fn instances(&self) -> usize {
        self.fake.world.lock().unwrap().live()
    }

    fn key_registrations(&self) -> usize {
        self.fake.server.requests_to("POST", KEYS).len()
    }

    /// Registered keys, startup scripts and volumes (an instance's OS volume outlives it
    /// unless its delete names it).
    fn side_resources(&self) -> usize {
        let w = self.fake.world.lock().unwrap();
        w.keys.len() + w.scripts.len() + w.volumes.len()
    }

    fn cli(&self, _dir: &std::path::Path) -> Option<CliCloud> {
        Some(CliCloud {
            env: vec![
                (
                    "GPUPROV_VERDA_ENDPOINT".into(),
                    format!("{}/v1", self.fake.server.uri()),
                ),
                ("VERDA_CLIENT_ID".into(), api::CLIENT_ID.into()),
                ("VERDA_CLIENT_SECRET".into(), SENTINEL.into()),
            ],
            config: String::new(),
        })
    }

    fn secret(&self) -> Option<&'static str> {
        Some(SENTINEL)
    }

    fn check_launched(&self, vm: &VmRecord) {
        assert_eq!(vm.offer.id, format!("verda/FIN-01/{H100}"));
        assert_eq!(vm.offer.price_per_hour, 19.92);
        assert_eq!((vm.user.as_str(), vm.ssh.port), ("root", 22));
        let cb = &self.fake.creates()[0];
        assert_eq!(cb["hostname"], "gpuprov-trainer-0f0e0d0c");
        assert_eq!(
            cb["description"],
            format!("gpuprov-vm-name=trainer gpuprov-lineage={LINEAGE}")
        );
        let key = self.fake.world.lock().unwrap().keys[0]["id"].clone();
        assert_eq!(cb["ssh_key_ids"], json!([key]), "the registered key");
        assert_eq!(cb["startup_script_id"], json!(null), "no boot script asked");
        assert_eq!(
            self.fake.grants(),
            ["client_credentials"],
            "one token for the run"
        );
    }

    fn check_torn_down(&self) {
        let w = self.fake.world.lock().unwrap();
        assert!(
            w.volumes.is_empty(),
            "the OS volume went with the instance: {:?}",
            w.volumes
        );
    }

    fn check_after(&self, s: Scenario) {
        if s == Scenario::KeyFoundByValueNeverRegisteredTwice {
            assert_eq!(self.fake.creates()[0]["ssh_key_ids"], json!(["key-b"]));
        }
        if s == Scenario::CapacityFailsOver {
            let w = self.fake.world.lock().unwrap();
            let refused = w
                .instances
                .iter()
                .filter(|i| i["status"] == "discontinued")
                .count();
            assert_eq!(refused, 1, "the no_capacity instance was deleted");
        }
    }

    fn verify(&self) {
        self.fake.server.verify();
    }
}
