//! The conformance driver of the Lambda adapter: the spec-checked Lambda Cloud API server
//! of `vendor::lambda` (its `World` and `Cloud2`), seeded from the suite's [`World`]. The
//! main offer is `gpu_8x_h100_sxm5` (8 × H100, $23.92/h); Lambda has region names that
//! are prefixes of each other (`us-east-1`, `us-east-13`).

use std::sync::Arc;

use gpuprov::config::{Cloud as CloudName, VmSpec};
use gpuprov::provider::{project_key_name, CloudProvider, Location};
use gpuprov::vm::VmRecord;
use serde_json::{json, Value};

use super::recover::CliCloud;
use super::{Cloud, Driver, Fault, Scenario, World};
use crate::support::drive::{self, LINEAGE, PUBKEY};
use crate::support::spec::Canned;
use crate::vendor::lambda::{self as api, Cloud2, LAUNCH, SENTINEL, TERMINATE};

pub struct LambdaDriver;

struct LambdaCloud {
    cloud: Cloud2,
    provider: Arc<gpuprov::provider::clouds::lambda::LambdaProvider>,
}

#[async_trait::async_trait]
impl Driver for LambdaDriver {
    fn name(&self) -> &'static str {
        "lambda"
    }

    fn unsupported(&self, _s: Scenario) -> Option<&'static str> {
        None
    }

    fn regions(&self) -> [&'static str; 2] {
        ["us-east-1", "us-east-13"]
    }

    async fn start(&self, world: World) -> Box<dyn Cloud> {
        let [r0, _] = self.regions();
        let mut w = api::World::default()
            .with_type(
                "gpu_8x_h100_sxm5",
                "H100 (80 GB SXM5)",
                8,
                2392,
                &world.capacity_in,
            )
            .with_type("gpu_1x_a10", "A10 (24 GB PCIe)", 1, 75, &[r0]);
        if world.second_offer_in_first_region {
            w = w.with_type("gpu_8x_h100_sxm5gdr", "H100 (80 GB SXM5)", 8, 2592, &[r0]);
        }
        if world.existing_key {
            w.keys = vec![
                json!({"id": "k1", "name": "someone-else", "public_key": "ssh-ed25519 AAAAC3NzaOther x"}),
                // The same key under the user's own name and comment.
                json!({"id": "k2", "name": "my-laptop", "public_key": format!("{} me@laptop", PUBKEY.rsplit_once(' ').unwrap().0)}),
            ];
        }
        match world.create_fault {
            Some(Fault::Capacity) => w.fault(
                "POST",
                LAUNCH,
                Canned::status(
                    400,
                    api::err_body(
                        "instance-operations/launch/insufficient-capacity",
                        "Not enough capacity to fulfill launch request.",
                    ),
                ),
            ),
            Some(Fault::Quota) => w.fault(
                "POST",
                LAUNCH,
                Canned::status(
                    400,
                    json!({"error": {"code": "global/quota-exceeded", "message": "Quota exceeded.", "suggestion": "Contact Support to increase your quota."}}),
                ),
            ),
            Some(Fault::RateLimited { retry_after_secs }) => w.fault(
                "POST",
                LAUNCH,
                Canned::status(
                    429,
                    api::err_body("global/too-many-requests", "Too many requests."),
                )
                .header("Retry-After", &retry_after_secs.to_string()),
            ),
            None => {}
        }
        if world.echo_credential {
            // A hostile server echoing the Authorization header in its error message.
            w.echo_auth = true;
            w.fault(
                "GET",
                "/api/v1/instance-types",
                Canned::status(
                    401,
                    api::err_body(
                        "global/invalid-api-key",
                        "API key was invalid, expired, or deleted.",
                    ),
                ),
            );
        }
        let cloud = Cloud2::start(w).await;
        let provider = cloud.provider();
        Box::new(LambdaCloud { cloud, provider })
    }
}

impl Cloud for LambdaCloud {
    fn provider(&self) -> Arc<dyn CloudProvider> {
        self.provider.clone()
    }

    fn vm(&self) -> VmSpec {
        drive::gpu_vm(CloudName::Lambda, "H100", 8)
    }

    fn creates(&self) -> Vec<String> {
        self.cloud
            .launches()
            .iter()
            .map(|b| b["region_name"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    fn instances(&self) -> usize {
        let w = self.cloud.world.lock().unwrap();
        w.instances
            .iter()
            .filter(|i| i["status"] != "terminated" && i["status"] != "terminating")
            .count()
    }

    fn key_registrations(&self) -> usize {
        self.cloud
            .server
            .requests_to("POST", "/api/v1/ssh-keys")
            .len()
    }

    /// Registered keys and firewall rulesets.
    fn side_resources(&self) -> usize {
        let w = self.cloud.world.lock().unwrap();
        w.keys.len() + w.rulesets.len()
    }

    fn cli(&self, _dir: &std::path::Path) -> Option<CliCloud> {
        Some(CliCloud {
            env: vec![
                ("GPUPROV_LAMBDA_ENDPOINT".into(), self.cloud.server.uri()),
                ("LAMBDA_API_KEY".into(), SENTINEL.into()),
            ],
            config: String::new(),
        })
    }

    fn secret(&self) -> Option<&'static str> {
        Some(SENTINEL)
    }

    fn at(&self, region: &str) -> Location {
        Location {
            cloud: "lambda".into(),
            region: region.into(),
            zone: None,
        }
    }

    fn check_launched(&self, vm: &VmRecord) {
        assert_eq!(vm.offer.id, "lambda/us-east-1/gpu_8x_h100_sxm5");
        assert_eq!(vm.offer.price_per_hour, 23.92);
        assert_eq!(vm.user, "ubuntu");
        assert_eq!(vm.ssh.port, 22);
        assert!(vm.ssh.host.starts_with("127.0.0."), "{}", vm.ssh.host);
        // The unknown key was registered under the name derived from its fingerprint.
        let keys = self.cloud.server.requests_to("POST", "/api/v1/ssh-keys");
        assert_eq!(keys.len(), 1);
        let key_name = project_key_name(LINEAGE, PUBKEY);
        assert_eq!(keys[0].body.clone().unwrap()["name"], key_name.as_str());
        let launches = self.cloud.launches();
        let lb = &launches[0];
        assert_eq!(lb["instance_type_name"], "gpu_8x_h100_sxm5");
        assert_eq!(lb["ssh_key_names"], json!([key_name]));
        assert_eq!(lb["name"], "gpuprov-trainer-0f0e0d0c");
        assert_eq!(api::tag(lb, "gpuprov-vm-name").as_deref(), Some("trainer"));
        assert_eq!(api::tag(lb, "gpuprov-lineage").as_deref(), Some(LINEAGE));
        // No ports asked: no firewall calls at all.
        assert!(self
            .cloud
            .server
            .requests()
            .iter()
            .all(|q| !q.path.starts_with("/api/v1/firewall-rulesets")));
    }

    fn check_torn_down(&self) {
        let t = self.cloud.server.requests_to("POST", TERMINATE);
        assert!(!t.is_empty());
        let ids: Vec<Value> = t
            .iter()
            .map(|r| r.body.clone().unwrap()["instance_ids"].clone())
            .collect();
        assert!(!ids.is_empty());
    }

    /// What the old vendor copies of the scenarios asserted beyond the contract.
    fn check_after(&self, s: Scenario) {
        let types: Vec<Value> = self
            .cloud
            .launches()
            .iter()
            .map(|b| b["instance_type_name"].clone())
            .collect();
        let h100 = json!("gpu_8x_h100_sxm5");
        match s {
            Scenario::KeyFoundByValueNeverRegisteredTwice => {
                // The user's own registration of the key is used, by its name.
                assert_eq!(
                    self.cloud.launches()[0]["ssh_key_names"],
                    json!(["my-laptop"])
                );
                // No ports asked: no firewall calls at all.
                assert!(self
                    .cloud
                    .server
                    .requests()
                    .iter()
                    .all(|q| !q.path.starts_with("/api/v1/firewall-rulesets")));
            }
            Scenario::CapacityFailsOver | Scenario::RetryAfterOnTheSameOffer => {
                assert!(types.iter().all(|t| *t == h100), "lambda: {types:?}");
            }
            Scenario::QuotaBlocksTheRegion => {
                assert_eq!(
                    types,
                    [h100.clone(), h100],
                    "lambda: the second type in the first region shares its quota"
                );
            }
            Scenario::CrashBetweenCreateAndJournalAdopts => {
                // Not even a terminated second instance.
                assert_eq!(self.cloud.world.lock().unwrap().instances.len(), 1);
            }
            Scenario::ImportOutsideInstance => {
                // One rename, to the identity name; the refused imports changed nothing.
                let renames: Vec<Value> = self
                    .cloud
                    .server
                    .requests()
                    .into_iter()
                    .filter(|q| q.method == "POST" && q.path.starts_with("/api/v1/instances/"))
                    .map(|q| q.body.unwrap_or_default())
                    .collect();
                assert_eq!(
                    renames,
                    [json!({"name": format!("gpuprov-imported-{}", &LINEAGE[..8])})],
                    "lambda"
                );
            }
            _ => {}
        }
        if s == Scenario::CapacityFailsOver {
            assert_eq!(self.cloud.world.lock().unwrap().instances.len(), 1);
        }
    }

    fn verify(&self) {
        self.cloud.server.verify();
    }

    /// An active instance launched outside gpuprov: its own name, a tag of the user's.
    fn outside_instance(&self, region: &str) -> Option<String> {
        let mut w = self.cloud.world.lock().unwrap();
        let id = format!(
            "0123456789abcdef0123456789ab{:04x}",
            0xee00 + w.instances.len()
        );
        w.instances.push(json!({
            "id": id,
            "name": "my own box",
            "status": "active",
            "ip": "127.0.0.99",
            "ssh_key_names": ["mine"],
            "file_system_names": [],
            "region": api::region(region),
            "instance_type": api::type_json("gpu_1x_a10", "A10 (24 GB PCIe)", 1, 75),
            "actions": {
                "migrate": {"available": false},
                "rebuild": {"available": false},
                "restart": {"available": false},
                "cold_reboot": {"available": false},
                "terminate": {"available": true}
            },
            "tags": [{"key": "team", "value": "ml"}],
        }));
        Some(id)
    }

    /// The API cannot change tags: the instance is renamed to the identity name.
    fn check_imported(&self, imported: &gpuprov::provider::Imported) {
        assert!(
            imported.identity.contains("renamed to gpuprov-imported-"),
            "lambda: {}",
            imported.identity
        );
    }
}
