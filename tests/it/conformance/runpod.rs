//! The conformance driver of the RunPod adapter: the spec-checked RunPod REST API v2
//! server of `vendor::runpod` (its `World` and `Fake`). The main offer is 8 × H100 SXM in the
//! SECURE tier ($2.99 per GPU-hour); data centre ids that are prefixes of each other:
//! `US-KS-2`, `US-KS-20`.

use std::sync::Arc;

use gpuprov::config::{Cloud as CloudName, VmSpec};
use gpuprov::provider::{CloudProvider, Location};
use gpuprov::vm::VmRecord;

use super::recover::CliCloud;
use super::{Cloud, Driver, Fault, Scenario, World};
use crate::support::drive::{self, PUBKEY};
use crate::support::spec::Canned;
use crate::vendor::runpod::{self as api, Fake, H100, KEYS, PODS, SENTINEL, USER_KEY};

pub struct RunpodDriver;

struct RunpodCloud {
    fake: Fake,
    provider: Arc<gpuprov::provider::clouds::runpod::RunpodProvider>,
}

#[async_trait::async_trait]
impl Driver for RunpodDriver {
    fn name(&self) -> &'static str {
        "runpod"
    }

    fn unsupported(&self, s: Scenario) -> Option<&'static str> {
        match s {
            Scenario::QuotaBlocksTheRegion => Some(
                "RunPod has no per-region quota; its account limit (402 insufficient balance) \
                 aborts: vendor::runpod::a_402_insufficient_balance_aborts_without_trying_other_offers",
            ),
            _ => None,
        }
    }

    fn regions(&self) -> [&'static str; 2] {
        ["US-KS-2", "US-KS-20"]
    }

    async fn start(&self, world: World) -> Box<dyn Cloud> {
        let mut w = api::World::default()
            .with_gpu(H100, "H100 SXM", (2.99, 2.69), (8, 8))
            .with_stock(H100, "SECURE", &world.capacity_in);
        w.keys = vec![USER_KEY.into()];
        if world.existing_key {
            w.keys.push(
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGpuprovTestKeyOnly me@other-comment".into(),
            );
        }
        match world.create_fault {
            Some(Fault::Capacity) => w.fault(
                "POST",
                PODS,
                Canned::status(
                    400,
                    api::problem(
                        400,
                        "There are no longer any instances available with the requested specifications.",
                    ),
                ),
            ),
            Some(Fault::Quota) => unreachable!("unsupported on RunPod"),
            Some(Fault::RateLimited { retry_after_secs }) => w.fault(
                "POST",
                PODS,
                Canned::status(
                    429,
                    api::problem(429, "rate limit exceeded for the minute window"),
                )
                .header("Retry-After", &retry_after_secs.to_string())
                // RunPod's draft-standard rate-limit headers ride along; Retry-After counts.
                .header("RateLimit", "\"minute\";r=0;t=1, \"hour\";r=2800;t=1812")
                .header(
                    "RateLimit-Policy",
                    "\"minute\";q=60;w=60, \"hour\";q=3000;w=3600",
                ),
            ),
            None => {}
        }
        if world.echo_credential {
            // A hostile server echoing the Authorization header in its problem detail.
            w.echo_auth = true;
            w.fault(
                "GET",
                api::CATALOG,
                Canned::status(401, api::problem(401, "invalid bearer token")),
            );
        }
        let fake = Fake::start(w).await;
        let provider = fake.provider();
        Box::new(RunpodCloud { fake, provider })
    }
}

impl Cloud for RunpodCloud {
    fn provider(&self) -> Arc<dyn CloudProvider> {
        self.provider.clone()
    }

    fn vm(&self) -> VmSpec {
        drive::gpu_vm(CloudName::Runpod, "H100", 8)
    }

    fn creates(&self) -> Vec<String> {
        self.fake
            .creates()
            .iter()
            .map(|b| {
                b["dataCenterIds"][0]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect()
    }

    fn instances(&self) -> usize {
        self.fake.world.lock().unwrap().pods.len()
    }

    fn key_registrations(&self) -> usize {
        self.fake.server.requests_to("PUT", KEYS).len()
    }

    /// Keys on the account other than the user's own (RunPod keeps them in one list).
    fn side_resources(&self) -> usize {
        let w = self.fake.world.lock().unwrap();
        w.keys.iter().filter(|k| k.as_str() != USER_KEY).count()
    }

    fn cli(&self, _dir: &std::path::Path) -> Option<CliCloud> {
        Some(CliCloud {
            env: vec![
                ("GPUPROV_RUNPOD_ENDPOINT".into(), self.fake.server.uri()),
                ("RUNPOD_API_KEY".into(), SENTINEL.into()),
            ],
            config: String::new(),
        })
    }

    fn secret(&self) -> Option<&'static str> {
        Some(SENTINEL)
    }

    fn at(&self, region: &str) -> Location {
        Location {
            cloud: "runpod".into(),
            region: region.into(),
            zone: None,
        }
    }

    fn check_launched(&self, vm: &VmRecord) {
        assert_eq!(vm.offer.id, format!("runpod/US-KS-2/secure/{H100}"));
        assert_eq!(self.fake.creates()[0]["cloud"], "SECURE");
        // The shared key: one PUT that keeps the user's key and adds ours, its comment the
        // derived name (`create_shared`; `prepare` never writes the set).
        let puts = self.fake.server.requests_to("PUT", KEYS);
        assert_eq!(puts.len(), 1);
        let ours = format!(
            "{} {}",
            gpuprov::provider::kit::keys::key_value(PUBKEY),
            gpuprov::provider::project_key_name(drive::LINEAGE, PUBKEY)
        );
        assert_eq!(
            puts[0].body.clone().unwrap()["keys"],
            serde_json::json!([USER_KEY, ours])
        );
    }

    /// What the old vendor copies of the scenarios asserted beyond the contract.
    fn check_after(&self, s: Scenario) {
        match s {
            Scenario::KeyFoundByValueNeverRegisteredTwice => {
                // The registered copy (another comment) is what the pod gets.
                let env = &self.fake.creates()[0]["env"];
                assert!(env["PUBLIC_KEY"]
                    .as_str()
                    .unwrap()
                    .contains("me@other-comment"));
            }
            Scenario::RetryAfterOnTheSameOffer => {
                for b in self.fake.creates() {
                    assert_eq!(b["cloud"], "SECURE", "runpod: the same tier");
                    assert_eq!(b["gpu"]["id"], H100, "runpod: the same GPU");
                }
            }
            _ => {}
        }
    }

    fn verify(&self) {
        self.fake.server.verify();
    }

    /// Stopped as its user would (`podAction` `stop`: `EXITED` at once in this cloud).
    fn stop(&self, id: &str) {
        let c = self.fake.world.lock().unwrap().action(
            &format!("{PODS}/{id}/action"),
            &serde_json::json!({"action": "stop"}),
        );
        assert_eq!(c.status, 200, "runpod: stop {id}");
    }
}
