//! The conformance driver of the Massed Compute adapter: the spec-checked VM API server of
//! `vendor::massedcompute` (its `World` and `Fake`). The main offer is the product
//! `gpu_8x_h100` (8 × H100 SXM5, 2392 cents an hour); the scenarios pin regions whose
//! names are prefixes of each other (`us-central-1`, `us-central-10`), so every instance is
//! named with its region.

use std::sync::Arc;

use gpuprov::config::{Cloud as CloudName, VmSpec};
use gpuprov::provider::CloudProvider;
use gpuprov::vm::VmRecord;
use serde_json::json;

use super::recover::CliCloud;
use super::{Cloud, Driver, Fault, Scenario, World};
use crate::support::drive::{self, PUBKEY};
use crate::support::spec::Canned;
use crate::vendor::massedcompute::{self as api, Fake, H100, INVENTORY, KEYS, LAUNCH, SENTINEL};

pub struct MassedComputeDriver;

struct McCloud {
    fake: Fake,
    provider: Arc<gpuprov::provider::clouds::massedcompute::MassedComputeProvider>,
}

#[async_trait::async_trait]
impl Driver for MassedComputeDriver {
    fn name(&self) -> &'static str {
        "massedcompute"
    }

    fn unsupported(&self, _s: Scenario) -> Option<&'static str> {
        None
    }

    fn regions(&self) -> [&'static str; 2] {
        ["us-central-1", "us-central-10"]
    }

    fn unknown_instance_id(&self) -> &'static str {
        "8b52a46b-ffff-4fde-925c-6d13226908f7"
    }

    async fn start(&self, world: World) -> Box<dyn Cloud> {
        let [r0, _] = self.regions();
        let mut w = api::World::new()
            .with_product(H100, "8x H100 SXM5", 2392, &world.capacity_in)
            .with_product("gpu_1x_a6000", "1x RTX A6000", 63, &[r0]);
        if world.second_offer_in_first_region {
            w = w.with_product("gpu_8x_h100_nvl", "8x H100 NVL", 2592, &[r0]);
        }
        if world.existing_key {
            let value = PUBKEY.rsplit_once(' ').unwrap().0;
            w.keys = vec![
                json!({"id": "k1", "name": "someone else", "public_key": "ssh-ed25519 AAAAC3NzaOther x"}),
                json!({"id": "k2", "name": "my laptop", "public_key": format!("{value} me@laptop")}),
            ];
        }
        match world.create_fault {
            Some(Fault::Capacity) => w.faults.push(
                "POST",
                LAUNCH,
                Canned::status(
                    400,
                    json!({"message": "Not enough capacity to fulfill launch request."}),
                ),
            ),
            Some(Fault::Quota) => w.faults.push(
                "POST",
                LAUNCH,
                Canned::status(
                    403,
                    json!({"message": "GPU quota limit exceeded for this region"}),
                ),
            ),
            Some(Fault::RateLimited { retry_after_secs }) => w.faults.push(
                "POST",
                LAUNCH,
                Canned::status(429, json!({"message": "Too many requests"}))
                    .header("Retry-After", &retry_after_secs.to_string()),
            ),
            None => {}
        }
        if world.echo_credential {
            w.faults.echo = true;
            w.faults.push(
                "GET",
                INVENTORY,
                Canned::status(401, json!({"message": "invalid API token"})),
            );
        }
        let fake = Fake::start(w).await;
        let provider = fake.provider();
        Box::new(McCloud { fake, provider })
    }
}

impl Cloud for McCloud {
    fn provider(&self) -> Arc<dyn CloudProvider> {
        self.provider.clone()
    }

    fn vm(&self) -> VmSpec {
        drive::gpu_vm(CloudName::Massedcompute, "H100", 8)
    }

    fn creates(&self) -> Vec<String> {
        self.fake
            .launches()
            .iter()
            .map(|b| b["regionName"].as_str().unwrap_or_default().to_string())
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
                    "GPUPROV_MASSEDCOMPUTE_ENDPOINT".into(),
                    format!("{}/api/v1", self.fake.server.uri()),
                ),
                ("MASSED_COMPUTE_API_KEY".into(), SENTINEL.into()),
            ],
            config: String::new(),
        })
    }

    fn secret(&self) -> Option<&'static str> {
        Some(SENTINEL)
    }

    fn check_launched(&self, vm: &VmRecord) {
        assert_eq!(vm.offer.id, format!("massedcompute/us-central-1/{H100}"));
        assert_eq!(vm.offer.price_per_hour, 23.92);
        assert_eq!((vm.user.as_str(), vm.ssh.port), ("Ubuntu", 22));
        assert!(vm.ssh.host.starts_with("127.0.0."), "{}", vm.ssh.host);
        let lb = &self.fake.launches()[0];
        assert_eq!(lb["instanceName"], "gpuprov-trainer-0f0e0d0c-us-central-1");
        assert_eq!(lb["imageId"], 12);
    }

    fn check_after(&self, s: Scenario) {
        let products: Vec<_> = self
            .fake
            .launches()
            .iter()
            .map(|b| b["productName"].clone())
            .collect();
        match s {
            Scenario::KeyFoundByValueNeverRegisteredTwice => {
                assert_eq!(self.fake.launches()[0]["sshKeys"], json!(["my laptop"]));
            }
            Scenario::QuotaBlocksTheRegion | Scenario::RetryAfterOnTheSameOffer => {
                assert!(products.iter().all(|p| *p == json!(H100)), "{products:?}");
            }
            _ => {}
        }
    }

    fn verify(&self) {
        self.fake.server.verify();
    }
}
