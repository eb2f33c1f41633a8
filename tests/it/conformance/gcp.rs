//! The conformance driver of the GCP adapter: the spec-checked Compute Engine fake of
//! `vendor::gcp` (its `World`, `Fake` and token endpoint), seeded from the suite's
//! [`World`]. The main offer is `a3-highgpu-8g` (8 × H100, $87.83/h); Compute Engine has
//! region names that are prefixes of each other (`europe-west1`, `europe-west10`), each
//! with zones listing the accelerator (two in the first, one in the second). Capacity is per zone: a stockout (the late
//! `ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS` of the insert's operation) moves to the
//! first region's next zone. The project's key is not registered anywhere (instance
//! metadata carries it), so the key scenario does not apply.

use std::sync::Arc;

use gpuprov::config::{Cloud as CloudName, VmSpec};
use gpuprov::provider::{CloudProvider, Location};
use gpuprov::vm::VmRecord;
use serde_json::json;

use super::recover::CliCloud;
use super::{Cloud, Driver, Fault, Scenario, World};
use crate::support::drive::{self, LINEAGE};
use crate::support::spec::Canned;
use crate::vendor::gcp::{self as api, google_error, stockout, Fake, H100, SENTINEL};

pub struct GcpDriver;

struct GcpCloud {
    fake: Fake,
    provider: Arc<gpuprov::provider::clouds::gcp::GcpProvider>,
}

/// The zones of the driver's regions listing the accelerator: two in the first (so a
/// stockout moves to the next zone), one in the second (one offer per region there).
fn zones(region: &str) -> Vec<String> {
    let letters: &[&str] = if region == "europe-west1" {
        &["b", "c"]
    } else {
        &["a"]
    };
    letters.iter().map(|l| format!("{region}-{l}")).collect()
}

fn region_of(zone: &str) -> String {
    zone.rsplit_once('-')
        .map(|(r, _)| r)
        .unwrap_or(zone)
        .to_string()
}

#[async_trait::async_trait]
impl Driver for GcpDriver {
    fn name(&self) -> &'static str {
        "gcp"
    }

    fn unsupported(&self, s: Scenario) -> Option<&'static str> {
        match s {
            Scenario::KeyFoundByValueNeverRegisteredTwice => {
                Some("GCP registers no key: each instance's metadata carries it (`ssh-keys`)")
            }
            _ => None,
        }
    }

    fn regions(&self) -> [&'static str; 2] {
        ["europe-west1", "europe-west10"]
    }

    /// B200 and the rest are in the ladder; an RTX 6000 is not.
    fn unplannable_gpu(&self) -> &'static str {
        "RTX6000"
    }

    /// "none of the regions [\"europe-west\"] is a Compute Engine region gpuprov knows".
    fn unknown_region_is_invalid(&self) -> bool {
        true
    }

    fn capacity_is_per_zone(&self) -> bool {
        true
    }

    fn unknown_instance_id(&self) -> &'static str {
        "gpuprov-trainer-0f0e0d0c-dead"
    }

    async fn start(&self, world: World) -> Box<dyn Cloud> {
        let [r0, _] = self.regions();
        let mut w = api::World::default().with_default_image();
        for region in &world.capacity_in {
            let zs = zones(region);
            let zs: Vec<&str> = zs.iter().map(String::as_str).collect();
            w = w.with_zones(H100, &zs, true);
        }
        let first = zones(r0)[0].clone();
        if world.second_offer_in_first_region {
            let zs = zones(r0);
            let zs: Vec<&str> = zs.iter().map(String::as_str).collect();
            w = w.with_zones("nvidia-h100-mega-80gb", &zs, true);
        }
        let insert = format!(
            "/compute/v1/projects/{}/zones/{first}/instances",
            api::PROJECT
        );
        match world.create_fault {
            // Accepted, then refused in the insert's operation.
            Some(Fault::Capacity) => w.late.push_back(stockout(&first)),
            Some(Fault::Quota) => w.fault(
                "POST",
                &insert,
                Canned::status(
                    403,
                    google_error(
                        403,
                        "quotaExceeded",
                        "PERMISSION_DENIED",
                        &format!("Quota 'NVIDIA_H100_GPUS' exceeded.  Limit: 0.0 in region {r0}."),
                    ),
                ),
            ),
            Some(Fault::RateLimited { retry_after_secs }) => w.fault(
                "POST",
                &insert,
                Canned::status(
                    429,
                    google_error(
                        429,
                        "rateLimitExceeded",
                        "RESOURCE_EXHAUSTED",
                        "Rate Limit Exceeded",
                    ),
                )
                .header("Retry-After", &retry_after_secs.to_string()),
            ),
            None => {}
        }
        if world.echo_credential {
            w.echo_auth = true;
            w.fault(
                "GET",
                &format!(
                    "/compute/v1/projects/{}/aggregated/acceleratorTypes",
                    api::PROJECT
                ),
                Canned::status(
                    401,
                    google_error(
                        401,
                        "authError",
                        "UNAUTHENTICATED",
                        "Request had invalid authentication credentials.",
                    ),
                ),
            );
        }
        let fake = Fake::start(w).await;
        let provider = fake.provider();
        Box::new(GcpCloud { fake, provider })
    }
}

impl Cloud for GcpCloud {
    fn provider(&self) -> Arc<dyn CloudProvider> {
        self.provider.clone()
    }

    fn vm(&self) -> VmSpec {
        drive::gpu_vm(CloudName::Gcp, "H100", 8)
    }

    fn creates(&self) -> Vec<String> {
        self.fake
            .inserts()
            .iter()
            .map(|(z, _)| region_of(z))
            .collect()
    }

    fn instances(&self) -> usize {
        self.fake.live_instances().len()
    }

    fn key_registrations(&self) -> usize {
        0
    }

    /// Firewall rules.
    fn side_resources(&self) -> usize {
        self.fake.world.lock().unwrap().firewalls.len()
    }

    /// The service-account key of the fake's token endpoint, written as `gcp-sa.json`.
    fn cli(&self, dir: &std::path::Path) -> Option<CliCloud> {
        let key = dir.join("gcp-sa.json");
        std::fs::write(&key, api::sa_json(&self.fake.tokens.token_uri())).unwrap();
        Some(CliCloud {
            env: vec![
                ("GPUPROV_GCP_ENDPOINT".into(), self.fake.server.uri()),
                (
                    "GOOGLE_APPLICATION_CREDENTIALS".into(),
                    key.display().to_string(),
                ),
            ],
            config: String::new(),
        })
    }

    fn secret(&self) -> Option<&'static str> {
        Some(SENTINEL)
    }

    fn at(&self, region: &str) -> Location {
        Location {
            cloud: "gcp".into(),
            region: region.into(),
            zone: None,
        }
    }

    fn check_launched(&self, vm: &VmRecord) {
        assert_eq!(vm.offer.id, "gcp/europe-west1/a3-highgpu-8g/europe-west1-b");
        assert_eq!(vm.offer.price_per_hour, 87.8325);
        assert_eq!(vm.user, "gpuprov");
        assert_eq!(vm.ssh.port, 22);
        assert!(vm.ssh.host.starts_with("127.0.0."), "{}", vm.ssh.host);
        let (zone, b) = self.fake.inserts().remove(0);
        assert_eq!(zone, "europe-west1-b");
        assert_eq!(
            b["machineType"],
            "zones/europe-west1-b/machineTypes/a3-highgpu-8g"
        );
        assert_eq!(
            b["labels"],
            json!({"gpuprov-vm-name": "trainer", "gpuprov-lineage": LINEAGE})
        );
        assert_eq!(b["scheduling"]["onHostMaintenance"], "TERMINATE");
        assert_eq!(b["networkInterfaces"][0]["nicType"], "GVNIC");
        assert!(b.get("guestAccelerators").is_none(), "A3 carries its GPUs");
        let w = self.fake.world.lock().unwrap();
        let fw = &w.firewalls["gpuprov-trainer-0f0e0d0c"];
        assert_eq!(
            fw["allowed"],
            json!([{"IPProtocol": "tcp", "ports": ["22"]}])
        );
        assert_eq!(b["tags"]["items"], json!(["gpuprov-trainer-0f0e0d0c"]));
    }

    fn check_torn_down(&self) {
        let w = self.fake.world.lock().unwrap();
        assert!(w.firewalls.is_empty(), "cleanup removed the firewall rule");
    }

    fn check_after(&self, s: Scenario) {
        let zones: Vec<String> = self.fake.inserts().into_iter().map(|(z, _)| z).collect();
        let request_ids: Vec<String> = self
            .fake
            .server
            .requests()
            .into_iter()
            .filter(|q| q.method == "POST" && q.path.ends_with("/instances"))
            .filter_map(|q| {
                q.query
                    .iter()
                    .find(|(k, _)| k == "requestId")
                    .map(|(_, v)| v.clone())
            })
            .collect();
        match s {
            Scenario::CapacityFailsOver => {
                assert_eq!(
                    zones,
                    ["europe-west1-b", "europe-west1-c"],
                    "gcp: the next zone"
                );
                assert_eq!(self.fake.live_instances().len(), 1);
            }
            Scenario::QuotaBlocksTheRegion => assert_eq!(
                zones,
                ["europe-west1-b", "europe-west10-a"],
                "gcp: the region's other zone and its mega-GPU offers share the quota"
            ),
            Scenario::RetryAfterOnTheSameOffer => {
                assert_eq!(zones, ["europe-west1-b", "europe-west1-b"]);
                assert_eq!(
                    request_ids[0], request_ids[1],
                    "gcp: the same attempt, the same requestId"
                );
            }
            Scenario::CrashBetweenCreateAndJournalAdopts => {
                assert_eq!(self.fake.world.lock().unwrap().instances.len(), 1)
            }
            Scenario::StartNotReplace => {
                let starts = self
                    .fake
                    .server
                    .requests()
                    .iter()
                    .filter(|q| q.path.ends_with("/start"))
                    .count();
                assert_eq!(starts, 1, "gcp: one instances.start");
            }
            _ => {}
        }
    }

    fn verify(&self) {
        self.fake.server.verify();
    }

    /// Stopped as its user would: `TERMINATED`, Compute Engine's word for a stopped VM.
    fn stop(&self, id: &str) {
        let mut w = self.fake.world.lock().unwrap();
        let name = id.split('@').next().unwrap_or(id);
        let i = w
            .instances
            .iter_mut()
            .find(|(_, i)| i["name"] == name)
            .unwrap_or_else(|| panic!("gcp: no instance {id}"));
        i.1["status"] = json!("TERMINATED");
    }
}
