//! The conformance driver of the Prime Intellect adapter: the spec-checked FastAPI server
//! of `vendor::primeintellect` (its `World` and `Fake`). The main offer is Hyperstack's
//! `n3-H100x8` (8 × H100 at $15.20/h for the pod) in data centres whose names are
//! prefixes of each other, `US-KS-2` and `US-KS-20`; pods report their SSH connection
//! late, with a NAT port.

use std::sync::Arc;

use gpuprov::config::{Cloud as CloudName, VmSpec};
use gpuprov::provider::CloudProvider;
use gpuprov::vm::VmRecord;
use serde_json::json;

use super::recover::CliCloud;
use super::{Cloud, Driver, Fault, Scenario, World};
use crate::support::drive::{self, PUBKEY};
use crate::support::spec::Canned;
use crate::vendor::primeintellect::{self as api, Fake, AVAILABILITY, KEYS, PODS, SENTINEL};

pub struct PrimeIntellectDriver;

struct PiCloud {
    fake: Fake,
    provider: Arc<gpuprov::provider::clouds::primeintellect::PrimeIntellectProvider>,
}

#[async_trait::async_trait]
impl Driver for PrimeIntellectDriver {
    fn name(&self) -> &'static str {
        "primeintellect"
    }

    fn unsupported(&self, s: Scenario) -> Option<&'static str> {
        match s {
            Scenario::QuotaBlocksTheRegion => Some(
                "Prime Intellect documents no quota error (SOURCES.md: rate limits, capacity \
                 and quota not documented); its account limit, 402 insufficient balance, aborts",
            ),
            _ => None,
        }
    }

    fn regions(&self) -> [&'static str; 2] {
        ["US-KS-2", "US-KS-20"]
    }

    /// `B200_180GB` is one of the API's GPU types (only out of stock here): an AMD part is
    /// none of them.
    fn unplannable_gpu(&self) -> &'static str {
        "MI300X"
    }

    fn unknown_instance_id(&self) -> &'static str {
        "5e3d0c1a-ffff-4000-8000-000000000000"
    }

    async fn start(&self, world: World) -> Box<dyn Cloud> {
        let [r0, _] = self.regions();
        let mut w = api::World::default();
        for dc in &world.capacity_in {
            w = w.with_config("n3-H100x8", "H100_80GB", 8, "hyperstack", dc, false, 15.2);
        }
        w = w.with_config("n3-A100x1", "A100_80GB", 1, "hyperstack", r0, false, 1.35);
        if world.existing_key {
            let value = PUBKEY.rsplit_once(' ').unwrap().0;
            w.keys = vec![
                json!({"id": "key-a", "userId": "u-1", "name": "someone-else", "publicKey": "ssh-ed25519 AAAAC3NzaOther x", "isPrimary": false, "isUserKey": true}),
                json!({"id": "key-b", "userId": "u-1", "name": "my-laptop", "publicKey": format!("{value} me@laptop"), "isPrimary": true, "isUserKey": true}),
            ];
        }
        match world.create_fault {
            Some(Fault::Capacity) => w.faults.push(
                "POST",
                PODS,
                Canned::status(400, api::detail("This configuration is out of stock")),
            ),
            Some(Fault::Quota) => unreachable!("unsupported on Prime Intellect"),
            Some(Fault::RateLimited { retry_after_secs }) => w.faults.push(
                "POST",
                PODS,
                Canned::status(429, api::detail("Too many requests"))
                    .header("Retry-After", &retry_after_secs.to_string()),
            ),
            None => {}
        }
        if world.echo_credential {
            w.faults.echo = true;
            w.faults.push(
                "GET",
                AVAILABILITY,
                Canned::status(403, api::detail("Invalid API key")),
            );
        }
        let fake = Fake::start(w).await;
        let provider = fake.provider();
        Box::new(PiCloud { fake, provider })
    }
}

impl Cloud for PiCloud {
    fn provider(&self) -> Arc<dyn CloudProvider> {
        self.provider.clone()
    }

    fn vm(&self) -> VmSpec {
        drive::gpu_vm(CloudName::Primeintellect, "H100", 8)
    }

    fn creates(&self) -> Vec<String> {
        self.fake
            .creates()
            .iter()
            .map(|b| {
                b["pod"]["dataCenterId"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect()
    }

    fn instances(&self) -> usize {
        self.fake.world.lock().unwrap().live()
    }

    fn key_registrations(&self) -> usize {
        self.fake.server.requests_to("POST", KEYS).len()
    }

    /// Registered keys.
    fn side_resources(&self) -> usize {
        self.fake.world.lock().unwrap().keys.len()
    }

    fn cli(&self, _dir: &std::path::Path) -> Option<CliCloud> {
        Some(CliCloud {
            env: vec![
                (
                    "GPUPROV_PRIMEINTELLECT_ENDPOINT".into(),
                    self.fake.server.uri(),
                ),
                ("PRIME_API_KEY".into(), SENTINEL.into()),
            ],
            config: String::new(),
        })
    }

    fn secret(&self) -> Option<&'static str> {
        Some(SENTINEL)
    }

    fn check_launched(&self, vm: &VmRecord) {
        assert_eq!(vm.offer.id, "primeintellect/US-KS-2/hyperstack/n3-H100x8");
        assert_eq!(vm.offer.price_per_hour, 15.2);
        assert_eq!(
            (vm.user.as_str(), vm.ssh.port),
            ("root", 40000),
            "the NAT port"
        );
        let cb = &self.fake.creates()[0];
        assert_eq!(cb["pod"]["name"], "gpuprov-trainer-0f0e0d0c-us-ks-2");
        assert_eq!(cb["pod"]["gpuType"], "H100_80GB");
    }

    fn check_after(&self, s: Scenario) {
        if s == Scenario::KeyFoundByValueNeverRegisteredTwice {
            assert_eq!(self.fake.creates()[0]["pod"]["sshKeyId"], "key-b");
        }
    }

    fn verify(&self) {
        self.fake.server.verify();
    }
}
