//! The conformance driver of the Hyperstack adapter: the spec-checked Infrahub API server
//! of `vendor::hyperstack` (its `World` and `Fake`). The main offer is the flavor `n3-H100x8`
//! (8 × H100 PCIe at $1.90 per GPU-hour); region names that are prefixes of each other:
//! `CANADA-1`, `CANADA-10`. Instances live in one environment per region
//! (`gpuprov-<lineage8>-<region>`).

use std::sync::Arc;

use gpuprov::config::{Cloud as CloudName, VmSpec};
use gpuprov::provider::{CloudProvider, Location};
use gpuprov::vm::VmRecord;
use serde_json::json;

use super::recover::CliCloud;
use super::{Cloud, Driver, Fault, Scenario, World};
use crate::support::drive::{self, PUBKEY};
use crate::support::spec::Canned;
use crate::vendor::hyperstack::{self as api, Fake, ENV_CA, H100, SENTINEL, VMS};

pub struct HyperstackDriver;

struct HsCloud {
    fake: Fake,
    provider: Arc<gpuprov::provider::clouds::hyperstack::HyperstackProvider>,
}

#[async_trait::async_trait]
impl Driver for HyperstackDriver {
    fn name(&self) -> &'static str {
        "hyperstack"
    }

    fn unsupported(&self, _s: Scenario) -> Option<&'static str> {
        None
    }

    fn regions(&self) -> [&'static str; 2] {
        ["CANADA-1", "CANADA-10"]
    }

    /// "Hyperstack has no flavor with H100 x8 in CANADA-".
    fn unknown_region_is_invalid(&self) -> bool {
        true
    }

    fn unknown_instance_id(&self) -> &'static str {
        "987654"
    }

    async fn start(&self, world: World) -> Box<dyn Cloud> {
        let [r0, _] = self.regions();
        let mut w = api::World::default()
            .with_flavor(r0, "n3-A100x1", "A100-80G-PCIe", 1, 5)
            .with_price(H100, 1.9)
            .with_price("A100-80G-PCIe", 1.35);
        // The flavor exists in both regions (Hyperstack answers an ask for a model a
        // region does not have at all as invalid); stock only where there is capacity.
        for region in self.regions() {
            let stock = if world.capacity_in.contains(&region) {
                2
            } else {
                0
            };
            w = w.with_flavor(region, "n3-H100x8", H100, 8, stock);
        }
        if world.second_offer_in_first_region {
            w = w
                .with_flavor(r0, "n3-H100x8-NVLink", H100, 8, 1)
                .with_price("n3-H100x8-NVLink", 16.0);
        }
        if world.existing_key {
            w.environments = vec![api::env_json(2, ENV_CA, r0)];
            // The same key under the user's own name and comment, in our environment.
            w.keypairs = vec![json!({"id": 4, "name": "my-laptop",
                "public_key": format!("{} me@laptop", PUBKEY.rsplit_once(' ').unwrap().0),
                "fingerprint": "y", "environment": api::env_json(2, ENV_CA, r0),
                "created_at": "2026-11-30T20:00:00Z"})];
            w.next = 10;
        }
        match world.create_fault {
            Some(Fault::Capacity) => w.fault(
                "POST",
                VMS,
                Canned::status(
                    400,
                    api::err(
                        &format!("Not enough stock available for flavor n3-H100x8 in {r0}"),
                        "out_of_stock",
                    ),
                ),
            ),
            Some(Fault::Quota) => w.fault(
                "POST",
                VMS,
                Canned::status(
                    400,
                    api::err(
                        "GPU quota exceeded for your organization",
                        "Contact support to increase your quota",
                    ),
                ),
            ),
            Some(Fault::RateLimited { retry_after_secs }) => w.fault(
                "POST",
                VMS,
                Canned::status(429, api::err("Too many requests", "rate_limited"))
                    .header("Retry-After", &retry_after_secs.to_string()),
            ),
            None => {}
        }
        if world.echo_credential {
            w.echo_key = true;
            w.fault(
                "GET",
                "/v1/core/flavors",
                Canned::status(401, api::err("Invalid API key", "unauthorized")),
            );
        }
        let fake = Fake::start(w).await;
        let provider = fake.provider();
        Box::new(HsCloud { fake, provider })
    }
}

impl Cloud for HsCloud {
    fn provider(&self) -> Arc<dyn CloudProvider> {
        self.provider.clone()
    }

    fn vm(&self) -> VmSpec {
        drive::gpu_vm(CloudName::Hyperstack, "H100", 8)
    }

    /// The region of each create, from its environment (`gpuprov-<lineage8>-<region>`).
    fn creates(&self) -> Vec<String> {
        self.fake
            .creates()
            .iter()
            .map(|b| {
                let env = b["environment_name"].as_str().unwrap_or_default();
                env.strip_prefix("gpuprov-0f0e0d0c-")
                    .unwrap_or(env)
                    .to_uppercase()
            })
            .collect()
    }

    fn instances(&self) -> usize {
        let w = self.fake.world.lock().unwrap();
        w.vms.iter().filter(|v| v["status"] != "DELETED").count()
    }

    fn key_registrations(&self) -> usize {
        self.fake
            .server
            .requests_to("POST", "/v1/core/keypairs")
            .len()
    }

    /// Environments and key pairs (listed or not).
    fn side_resources(&self) -> usize {
        self.fake.world.lock().unwrap().side_resources()
    }

    fn cli(&self, _dir: &std::path::Path) -> Option<CliCloud> {
        Some(CliCloud {
            env: vec![
                (
                    "GPUPROV_HYPERSTACK_ENDPOINT".into(),
                    format!("{}/v1", self.fake.server.uri()),
                ),
                ("HYPERSTACK_API_KEY".into(), SENTINEL.into()),
            ],
            config: String::new(),
        })
    }

    fn secret(&self) -> Option<&'static str> {
        Some(SENTINEL)
    }

    fn at(&self, region: &str) -> Location {
        Location {
            cloud: "hyperstack".into(),
            region: region.into(),
            zone: None,
        }
    }

    fn check_launched(&self, vm: &VmRecord) {
        assert_eq!(vm.offer.id, "hyperstack/CANADA-1/n3-H100x8");
        let c = &self.fake.creates()[0];
        assert_eq!(c["environment_name"], ENV_CA);
        assert_eq!(c["flavor_name"], "n3-H100x8");
    }

    /// What the old vendor copies of the scenarios asserted beyond the contract.
    fn check_after(&self, s: Scenario) {
        let tried: Vec<(serde_json::Value, serde_json::Value)> = self
            .fake
            .creates()
            .iter()
            .map(|b| (b["environment_name"].clone(), b["flavor_name"].clone()))
            .collect();
        let ca = (json!(ENV_CA), json!("n3-H100x8"));
        let ca10 = (json!("gpuprov-0f0e0d0c-canada-10"), json!("n3-H100x8"));
        match s {
            Scenario::CapacityFailsOver => {
                assert_eq!(tried, [ca, ca10], "hyperstack: one environment per region");
                assert_eq!(self.fake.world.lock().unwrap().vms.len(), 1);
            }
            Scenario::QuotaBlocksTheRegion => assert_eq!(
                tried,
                [ca, ca10],
                "hyperstack: the second flavor in the first region shares its quota"
            ),
            Scenario::RetryAfterOnTheSameOffer => {
                assert_eq!(tried, [ca.clone(), ca], "hyperstack: the same environment")
            }
            Scenario::CrashBetweenCreateAndJournalAdopts => {
                assert_eq!(self.fake.world.lock().unwrap().vms.len(), 1)
            }
            _ => {}
        }
    }

    fn verify(&self) {
        self.fake.server.verify();
    }

    /// Stopped as its user would (`Stop_VM`: `SHUTOFF` at once in this cloud).
    fn stop(&self, id: &str) {
        let c = self
            .fake
            .world
            .lock()
            .unwrap()
            .stop_vm(&format!("{VMS}/{id}/stop"));
        assert_eq!(c.status, 200, "hyperstack: stop {id}");
    }
}
