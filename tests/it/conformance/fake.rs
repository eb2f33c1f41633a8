//! The conformance driver of the FakeProvider (`src/provider/doubles/fake.rs`): the contract the
//! core is written against, without a vendor. Offers are `fake/<region>/<type>` on a
//! provider named `aws` (the name the launch tests give it). The fake's capabilities are
//! scripted: it declares every optional feature it implements (shared keys, `start`,
//! `import`, `diagnose`), so every scenario runs on it.

use std::sync::Arc;

use gpuprov::config::{Cloud as CloudName, VmSpec};
use gpuprov::provider::doubles::fake::{FakeProvider, Op};
use gpuprov::provider::{
    Capabilities, CloudProvider, ErrorKind, Feature, InstanceStatus, Location, ProviderError,
};

use super::{Cloud, Driver, Fault, Scenario, World};
use crate::support::drive::PUBKEY;

pub struct FakeDriver;

struct FakeCloud {
    fake: Arc<FakeProvider>,
}

#[async_trait::async_trait]
impl Driver for FakeDriver {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn unsupported(&self, s: Scenario) -> Option<&'static str> {
        match s {
            Scenario::KeyFoundByValueNeverRegisteredTwice => {
                Some("the fake cloud has no key registry")
            }
            Scenario::SecretsNeverInErrors => Some("the fake cloud needs no credential"),
            Scenario::UnplannableAskIsInvalidRequest => {
                Some("the fake cloud has no GPU catalog: it plans every ask")
            }
            Scenario::StateLostRecoverThenDestroy => Some(
                "the fake cloud lives in one process: the binary's runs (apply, recover, \
                 destroy) cannot share it",
            ),
            _ => None,
        }
    }

    fn regions(&self) -> [&'static str; 2] {
        ["east-1", "east-13"]
    }

    async fn start(&self, world: World) -> Box<dyn Cloud> {
        let [r0, _] = self.regions();
        let mut fake = FakeProvider::new("aws");
        let caps = Capabilities {
            supported: vec![
                Feature::Start,
                Feature::SharedObjects,
                Feature::Import,
                Feature::Diagnose,
            ],
            ..fake.capabilities_for_test()
        };
        fake = fake.with_capabilities(caps);
        // The project key under the user's own comment, when the world has it.
        let users = format!("{} me@laptop", PUBKEY.rsplit_once(' ').unwrap().0);
        fake = fake.with_shared_key(world.existing_key.then_some(users.as_str()));
        // The main offer, cheaper in the first region (the core orders by price); the
        // second offer in the first region sits between the two.
        for (n, region) in world.capacity_in.iter().enumerate() {
            let price = if *region == r0 { 10.0 } else { 11.0 + n as f64 };
            fake = fake.with_offer(&format!("fake/{region}/h100"), region, "h100", price);
        }
        if world.second_offer_in_first_region {
            fake = fake.with_offer(&format!("fake/{r0}/h100-b"), r0, "h100-b", 10.5);
        }
        if let Some(f) = world.create_fault {
            let e = match f {
                Fault::Capacity => ProviderError::new(ErrorKind::Capacity, "no capacity"),
                Fault::Quota => ProviderError::new(ErrorKind::Quota, "quota exceeded"),
                Fault::RateLimited { retry_after_secs } => {
                    let mut e = ProviderError::new(ErrorKind::Transient, "429 too many requests");
                    e.retry_after_secs = Some(retry_after_secs);
                    e
                }
            };
            fake = fake.with_fault(Op::Create, None, e, 1);
        }
        Box::new(FakeCloud {
            fake: Arc::new(fake),
        })
    }
}

impl Cloud for FakeCloud {
    fn provider(&self) -> Arc<dyn CloudProvider> {
        self.fake.clone()
    }

    fn vm(&self) -> VmSpec {
        VmSpec::new("trainer", vec![CloudName::Aws])
    }

    fn creates(&self) -> Vec<String> {
        self.fake
            .calls()
            .into_iter()
            .filter(|(op, _)| *op == Op::Create)
            .map(|(_, detail)| {
                // "<vm> fake/<region>/<type>"
                detail.split('/').nth(1).unwrap_or_default().to_string()
            })
            .collect()
    }

    fn instances(&self) -> usize {
        self.fake.instances().len()
    }

    fn key_registrations(&self) -> usize {
        self.fake.shared_counts().0 as usize
    }

    /// Keys registered and not deleted.
    fn side_resources(&self) -> usize {
        let (made, deleted) = self.fake.shared_counts();
        made.saturating_sub(deleted) as usize
    }

    fn cli(&self, _dir: &std::path::Path) -> Option<super::recover::CliCloud> {
        None
    }

    fn secret(&self) -> Option<&'static str> {
        None
    }

    fn at(&self, region: &str) -> Location {
        Location {
            cloud: "aws".into(),
            region: region.into(),
            zone: None,
        }
    }

    fn stop(&self, id: &str) {
        self.fake.stop_instance(id);
    }

    /// A running instance put in directly, with no VM name and no lineage.
    fn outside_instance(&self, region: &str) -> Option<String> {
        Some(
            self.fake
                .insert_instance("", self.at(region), InstanceStatus::Running),
        )
    }
}
