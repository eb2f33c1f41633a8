//! The conformance driver of the DigitalOcean adapter: the spec-checked DigitalOcean API
//! v2 server of `vendor::digitalocean` (its `World` and `Cloud2`). The main offer is the
//! 1 × H100 droplet size `gpu-h100x1-80gb` ($3.39/h); region slugs that are prefixes of
//! each other: `nyc1`, `nyc13`.

use std::sync::Arc;

use gpuprov::config::{Cloud as CloudName, VmSpec};
use gpuprov::provider::{CloudProvider, Location};
use gpuprov::vm::VmRecord;
use serde_json::json;

use super::recover::CliCloud;
use super::{Cloud, Driver, Fault, Scenario, World};
use crate::support::drive;
use crate::support::spec::Canned;
use crate::vendor::digitalocean::{self as api, Cloud2, DROPLETS, H100X1, SENTINEL};

pub struct DigitalOceanDriver;

struct DoCloud {
    cloud: Cloud2,
    provider: Arc<gpuprov::provider::clouds::digitalocean::DigitalOceanProvider>,
}

#[async_trait::async_trait]
impl Driver for DigitalOceanDriver {
    fn name(&self) -> &'static str {
        "digitalocean"
    }

    fn unsupported(&self, _s: Scenario) -> Option<&'static str> {
        None
    }

    fn regions(&self) -> [&'static str; 2] {
        ["nyc1", "nyc13"]
    }

    fn unknown_instance_id(&self) -> &'static str {
        "3164444"
    }

    async fn start(&self, world: World) -> Box<dyn Cloud> {
        let [r0, r1] = self.regions();
        let mut w = api::World::default().with_size(
            H100X1,
            Some(("nvidia_h100", 1)),
            3.39,
            &world.capacity_in,
        );
        w.regions.retain(|r| r["slug"] != r0);
        w.regions.push(api::region_json(r0, true));
        w.regions.push(api::region_json(r1, true));
        if world.second_offer_in_first_region {
            w = w.with_size("gpu-h100x1-80gb-alt", Some(("nvidia_h100", 1)), 3.49, &[r0]);
        }
        if world.existing_key {
            w.keys = vec![
                json!({"id": 1, "fingerprint": "aa", "public_key": "ssh-ed25519 AAAAC3NzaOther x", "name": "someone-else"}),
                json!({"id": 2, "fingerprint": "bb", "public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGpuprovTestKeyOnly me@laptop", "name": "my-laptop"}),
            ];
        }
        let create_fault = match world.create_fault {
            Some(Fault::Capacity) => Some(Canned::status(
                422,
                api::err_body(
                    "unprocessable_entity",
                    "Size is not available in this region.",
                ),
            )),
            Some(Fault::Quota) => Some(Canned::status(
                422,
                api::err_body(
                    "unprocessable_entity",
                    "creating this/these droplet(s) will exceed your droplet limit",
                ),
            )),
            Some(Fault::RateLimited { retry_after_secs }) => Some(
                Canned::status(
                    429,
                    api::err_body("too_many_requests", "API Rate limit exceeded."),
                )
                .header("ratelimit-limit", "5000")
                .header("ratelimit-remaining", "0")
                // A reset epoch long past: retry-after is what counts.
                .header("ratelimit-reset", "1444931833")
                .header("retry-after", &retry_after_secs.to_string()),
            ),
            None => None,
        };
        if let Some(c) = create_fault {
            w.fault("POST", DROPLETS, c);
        }
        if world.echo_credential {
            // A hostile server echoing the Authorization header in its error message.
            w.echo_auth = true;
            w.fault(
                "GET",
                "/v2/sizes",
                Canned::status(
                    401,
                    api::err_body("unauthorized", "Unable to authenticate you."),
                ),
            );
        }
        let cloud = Cloud2::start(w).await;
        let provider = cloud.provider();
        Box::new(DoCloud { cloud, provider })
    }
}

impl Cloud for DoCloud {
    fn provider(&self) -> Arc<dyn CloudProvider> {
        self.provider.clone()
    }

    fn vm(&self) -> VmSpec {
        drive::gpu_vm(CloudName::Digitalocean, "H100", 1)
    }

    fn creates(&self) -> Vec<String> {
        self.cloud
            .creates()
            .iter()
            .map(|b| b["region"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    fn instances(&self) -> usize {
        self.cloud.world.lock().unwrap().droplets.len()
    }

    fn key_registrations(&self) -> usize {
        self.cloud
            .server
            .requests_to("POST", "/v2/account/keys")
            .len()
    }

    fn side_resources(&self) -> usize {
        self.cloud.world.lock().unwrap().side_resources()
    }

    fn cli(&self, _dir: &std::path::Path) -> Option<CliCloud> {
        Some(CliCloud {
            env: vec![
                (
                    "GPUPROV_DIGITALOCEAN_ENDPOINT".into(),
                    self.cloud.server.uri(),
                ),
                ("DIGITALOCEAN_TOKEN".into(), SENTINEL.into()),
            ],
            config: String::new(),
        })
    }

    fn secret(&self) -> Option<&'static str> {
        Some(SENTINEL)
    }

    fn at(&self, region: &str) -> Location {
        Location {
            cloud: "digitalocean".into(),
            region: region.into(),
            zone: None,
        }
    }

    fn check_launched(&self, vm: &VmRecord) {
        assert_eq!(vm.offer.id, "digitalocean/nyc1/gpu-h100x1-80gb");
        assert_eq!(self.cloud.creates()[0]["size"], H100X1);
    }

    /// What the old vendor copies of the scenarios asserted beyond the contract.
    fn check_after(&self, s: Scenario) {
        let sizes: Vec<serde_json::Value> = self
            .cloud
            .creates()
            .iter()
            .map(|b| b["size"].clone())
            .collect();
        match s {
            Scenario::CapacityFailsOver
            | Scenario::QuotaBlocksTheRegion
            | Scenario::RetryAfterOnTheSameOffer => {
                // Quota: the second size in the first region shares its limit.
                assert_eq!(sizes, [json!(H100X1), json!(H100X1)], "digitalocean");
            }
            _ => {}
        }
        if s == Scenario::CapacityFailsOver {
            assert_eq!(self.cloud.world.lock().unwrap().droplets.len(), 1);
        }
    }

    fn verify(&self) {
        self.cloud.server.verify();
    }

    /// Powered off as its user would (`power_off` completes at once in this cloud).
    fn stop(&self, id: &str) {
        let c = self.cloud.world.lock().unwrap().action(
            &format!("{DROPLETS}/{id}/actions"),
            &json!({"type": "power_off"}),
        );
        assert!(c.status < 300, "digitalocean: power_off {id}: {}", c.status);
    }
}
