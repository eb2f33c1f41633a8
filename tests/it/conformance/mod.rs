//! The adapter conformance suite (issue 13): ONE scenario table run for every adapter
//! that has a [`Driver`]. A driver starts its cloud (a spec-checked local server, or the
//! FakeProvider), seeds a [`World`] in the cloud's own terms, builds the adapter with the
//! test capabilities, and reports what the cloud saw ([`Cloud`]); a scenario it cannot
//! express is declared unsupported with a reason. A new cloud gets the whole contract by
//! writing its driver and adding it to [`drivers`].
//!
//! `the_matrix` prints and checks scenario × adapter; each scenario is one test that runs
//! every driver that supports it. Vendor-only behaviour stays in the vendor's own module
//! (`vendor::lambda` …) beside its driver.
//!
//! Drivers: the FakeProvider, Lambda, RunPod, DigitalOcean, Hyperstack, GCP, Massed
//! Compute, Verda and Prime Intellect over the spec-checked servers of their `vendor`
//! modules, Nebius over its local gRPC server (generated from the vendor's protos), Docker on the real local Engine (its
//! own lineage per run), and AWS against moto through `aws_moto`'s rewriting proxy (its
//! own moto per run). `aws_moto` keeps its end-to-end tests, which assert the exact
//! offers (zone, type) and EC2 side resources beyond the scenarios. What a vendor's old
//! copy of a scenario asserted beyond the contract lives in its driver's
//! [`Cloud::check_after`].

mod aws;
mod digitalocean;
mod docker;
mod fake;
mod gcp;
mod hyperstack;
mod lambda;
mod massedcompute;
mod nebius;
mod primeintellect;
mod runpod;
mod verda;

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuprov::config::VmSpec;
use gpuprov::machine::{ExecError, MemoryJournal};
use gpuprov::provider::fake::FakeConnector;
use gpuprov::provider::{CloudProvider, ErrorKind, Location, ResourceRequest};
use gpuprov::vm::{LaunchState, Target, TeardownState};

use crate::support::drive;

/// The contract every adapter is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    FullLaunchAndTeardown,
    KeyFoundByValueNeverRegisteredTwice,
    CapacityFailsOver,
    QuotaBlocksTheRegion,
    RetryAfterOnTheSameOffer,
    CrashBetweenCreateAndJournalAdopts,
    ExactRegionMatch,
    SecretsNeverInErrors,
    UnplannableAskIsInvalidRequest,
    DeleteAndCleanupIdempotent,
    PlanListsTheOffer,
    /// `list` finds a launched machine by its identity labels (VM name and lineage), in
    /// its region only, and a run that lost its record adopts it from that listing
    /// instead of creating a second instance (issue 18's discovery and recovery).
    ListFindsAndAdoptsByIdentity,
    /// `observe_location` answers for a whole location what `observe` answers per VM
    /// (issue 20): for every VM name, launched, imported, never launched, or launched in
    /// the other region, the map's entry (none = empty) equals `observe`. Every adapter
    /// answers for the whole location (none answers `None`).
    ObserveLocationMatchesObserve,
}

pub const SCENARIOS: &[Scenario] = &[
    Scenario::FullLaunchAndTeardown,
    Scenario::KeyFoundByValueNeverRegisteredTwice,
    Scenario::CapacityFailsOver,
    Scenario::QuotaBlocksTheRegion,
    Scenario::RetryAfterOnTheSameOffer,
    Scenario::CrashBetweenCreateAndJournalAdopts,
    Scenario::ExactRegionMatch,
    Scenario::SecretsNeverInErrors,
    Scenario::UnplannableAskIsInvalidRequest,
    Scenario::DeleteAndCleanupIdempotent,
    Scenario::PlanListsTheOffer,
    Scenario::ListFindsAndAdoptsByIdentity,
    Scenario::ObserveLocationMatchesObserve,
];

/// A fault the cloud answers the first create with, in its own words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// No capacity for the offer.
    Capacity,
    /// The account's quota in the region is exhausted.
    Quota,
    /// 429 with `Retry-After: <secs>`.
    RateLimited { retry_after_secs: u64 },
}

/// What a scenario asks the cloud to hold, in terms every cloud can map to its own.
#[derive(Debug, Clone, Default)]
pub struct World {
    /// Regions (of [`Driver::regions`]) where the main offer has capacity.
    pub capacity_in: Vec<&'static str>,
    /// Another, pricier offer in the first region (so a quota must block the region, not
    /// the offer).
    pub second_offer_in_first_region: bool,
    /// The first create is answered with this.
    pub create_fault: Option<Fault>,
    /// The project's public key is already registered, under another name and comment.
    pub existing_key: bool,
    /// A hostile server: every error it sends echoes the credential, and the first plan
    /// call is refused as unauthorised.
    pub echo_credential: bool,
}

/// A started cloud and its adapter.
pub trait Cloud: Send + Sync {
    fn provider(&self) -> Arc<dyn CloudProvider>;
    /// The VM `trainer` as this cloud's scenarios ask for it.
    fn vm(&self) -> VmSpec;
    /// The region of every create call so far, in order.
    fn creates(&self) -> Vec<String>;
    /// Instances of ours the cloud holds now (not terminated).
    fn instances(&self) -> usize;
    /// Key registrations so far.
    fn key_registrations(&self) -> usize;
    /// The state lineage runs on this cloud use (a cloud shared by parallel tests gives
    /// each run its own).
    fn lineage(&self) -> &str {
        drive::LINEAGE
    }
    /// The credential the adapter was built with (none for a cloud without one).
    fn secret(&self) -> Option<&'static str>;
    /// A location of this cloud in `region` (no zone).
    fn at(&self, region: &str) -> Location {
        Location {
            cloud: self.provider().name().to_string(),
            region: region.to_string(),
            zone: None,
        }
    }
    /// Vendor checks after a full launch (request bodies, side resources) and after its
    /// teardown.
    fn check_launched(&self, _vm: &gpuprov::vm::VmRecord) {}
    fn check_torn_down(&self) {}
    /// Vendor checks at the end of scenario `s` (what the cloud saw, in its own terms:
    /// request bodies, the types it was asked for), before [`Cloud::verify`].
    fn check_after(&self, _s: Scenario) {}
    /// Fails the test if the cloud saw a request that breaks its API description.
    fn verify(&self) {}
    /// Puts an instance launched outside gpuprov (its own name, no identity) in `region`
    /// and answers its id, for `import`; `None` where the cloud cannot `import` (or the
    /// driver cannot seed one).
    fn outside_instance(&self, _region: &str) -> Option<String> {
        None
    }
}

#[async_trait::async_trait]
pub trait Driver: Sync {
    fn name(&self) -> &'static str;
    /// Why this cloud cannot express `s`, if it cannot.
    fn unsupported(&self, s: Scenario) -> Option<&'static str>;
    /// Two regions, in the order the core tries them; the first a prefix of the second's
    /// name where the cloud has such names (`us-east-1`, `us-east-13`).
    fn regions(&self) -> [&'static str; 2];
    /// A GPU ask this cloud cannot plan (not in its catalog).
    fn unplannable_gpu(&self) -> &'static str {
        "B200"
    }
    /// Whether the cloud answers an ask in a region it does not know as `InvalidRequest`
    /// (rather than with no offers).
    fn unknown_region_is_invalid(&self) -> bool {
        false
    }
    /// Whether a capacity refusal blocks only the zone's offer (EC2: capacity is per
    /// type and zone), so the next offer is the same type in the first region's next
    /// zone rather than the next region.
    fn capacity_is_per_zone(&self) -> bool {
        false
    }
    /// Whether the cloud's offers cost nothing (the local Docker cloud), so a plan's price
    /// is 0.
    fn offers_are_free(&self) -> bool {
        false
    }
    /// An instance id of this cloud's form that names no instance.
    fn unknown_instance_id(&self) -> &'static str {
        "0123456789abcdef0123456789abcdef"
    }
    /// Why the adapter cannot run [`Scenario::ListFindsAndAdoptsByIdentity`] (it does not
    /// implement `CloudProvider::list` yet); `None` where it does.
    fn cannot_list(&self) -> Option<&'static str> {
        Some("the adapter does not implement CloudProvider::list yet")
    }
    async fn start(&self, world: World) -> Box<dyn Cloud>;
}

/// Why `d` cannot express `s`, if it cannot: its own answer, or that it cannot list.
fn unsupported(d: &dyn Driver, s: Scenario) -> Option<&'static str> {
    d.unsupported(s).or(match s {
        Scenario::ListFindsAndAdoptsByIdentity => d.cannot_list(),
        _ => None,
    })
}

/// Runs `f` to completion on a fresh thread and runtime: drivers answer the sync [`Cloud`]
/// methods from inside the scenario's runtime, where blocking on a future panics.
pub(crate) fn on_own_runtime<F, Fut, T>(f: F) -> T
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T>,
    T: Send + 'static,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f())
    })
    .join()
    .expect("driver helper thread")
}

/// Every driver of the suite.
pub fn drivers() -> Vec<Box<dyn Driver>> {
    vec![
        Box::new(fake::FakeDriver),
        Box::new(lambda::LambdaDriver),
        Box::new(runpod::RunpodDriver),
        Box::new(digitalocean::DigitalOceanDriver),
        Box::new(hyperstack::HyperstackDriver),
        Box::new(docker::DockerDriver),
        Box::new(aws::AwsDriver),
        Box::new(gcp::GcpDriver),
        Box::new(massedcompute::MassedComputeDriver),
        Box::new(nebius::NebiusDriver),
        Box::new(verda::VerdaDriver),
        Box::new(primeintellect::PrimeIntellectDriver),
    ]
}

/// [`drive::Run`] over a driver's cloud, with the adapter behind `dyn`.
struct Run {
    cloud: Box<dyn Cloud>,
    provider: Arc<dyn CloudProvider>,
    journal: Arc<MemoryJournal>,
    connector: Arc<FakeConnector>,
    vm: VmSpec,
}

impl Run {
    async fn launch(&self) -> Result<LaunchState, ExecError> {
        drive::launch_in(
            self.cloud.lineage(),
            &self.vm,
            self.provider.clone(),
            self.journal.clone(),
            self.connector.clone(),
        )
        .await
    }

    async fn teardown(&self, target: Target) -> TeardownState {
        drive::teardown(
            self.provider.clone(),
            target,
            Arc::new(MemoryJournal::new()),
        )
        .await
    }

    fn labels(&self) -> Vec<String> {
        drive::labels(&self.journal)
    }
}

fn run(cloud: Box<dyn Cloud>, regions: &[&str]) -> Run {
    let provider = cloud.provider();
    let mut vm = cloud.vm();
    vm.regions = regions.iter().map(|r| r.to_string()).collect();
    Run {
        cloud,
        provider,
        journal: Arc::new(MemoryJournal::new()),
        connector: Arc::new(FakeConnector::default()),
        vm,
    }
}

fn ask(vm: &VmSpec, regions: &[&str]) -> ResourceRequest {
    let mut v = vm.clone();
    v.regions = regions.iter().map(|r| r.to_string()).collect();
    v.request()
}

/// Runs `s` for every driver that supports it; returns how many ran.
async fn for_each(s: Scenario) -> usize {
    let mut ran = 0;
    for d in drivers() {
        if let Some(why) = unsupported(d.as_ref(), s) {
            eprintln!("{:?} on {}: unsupported ({why})", s, d.name());
            continue;
        }
        eprintln!("{:?} on {}", s, d.name());
        scenario(d.as_ref(), s).await;
        ran += 1;
    }
    assert!(ran > 0, "{s:?} ran on no adapter");
    ran
}

async fn scenario(d: &dyn Driver, s: Scenario) {
    let name = d.name();
    let [r0, r1] = d.regions();
    match s {
        Scenario::FullLaunchAndTeardown => {
            let cloud = d
                .start(World {
                    capacity_in: vec![r0, r1],
                    ..World::default()
                })
                .await;
            let r = run(cloud, &[r0]);
            let end = r.launch().await.unwrap();
            let vm = end
                .ready()
                .unwrap_or_else(|| panic!("{name}: not ready: {end:?} {:?}", r.labels()));
            assert_eq!(vm.location.region, r0, "{name}");
            assert_eq!(r.connector.logins(), 1, "{name}");
            assert_eq!(r.cloud.creates(), [r0], "{name}: one create");
            let labels = r.labels();
            assert!(
                labels.iter().any(|l| l.starts_with("booting")),
                "{name}: {labels:?}"
            );
            assert!(
                labels.last().unwrap().starts_with("ready"),
                "{name}: {labels:?}"
            );
            r.cloud.check_launched(vm);
            let end = r
                .teardown(Target::new(
                    vm.location.clone(),
                    "trainer",
                    vec![vm.instance_id.clone()],
                ))
                .await;
            assert_eq!(end, TeardownState::Done, "{name}");
            assert!(
                r.provider
                    .observe(&vm.location, "trainer")
                    .await
                    .unwrap()
                    .is_empty(),
                "{name}: gone"
            );
            assert_eq!(r.cloud.instances(), 0, "{name}");
            r.cloud.check_torn_down();
            r.cloud.check_after(s);
            r.cloud.verify();
        }
        Scenario::KeyFoundByValueNeverRegisteredTwice => {
            let cloud = d
                .start(World {
                    capacity_in: vec![r0],
                    existing_key: true,
                    ..World::default()
                })
                .await;
            let r = run(cloud, &[r0]);
            let end = r.launch().await.unwrap();
            assert!(end.ready().is_some(), "{name}: {end:?}");
            assert_eq!(r.cloud.key_registrations(), 0, "{name}: found by value");
            r.cloud.check_after(s);
            r.cloud.verify();
        }
        Scenario::CapacityFailsOver => {
            let cloud = d
                .start(World {
                    capacity_in: vec![r0, r1],
                    create_fault: Some(Fault::Capacity),
                    ..World::default()
                })
                .await;
            let r = run(cloud, &[r0, r1]);
            let end = r.launch().await.unwrap();
            let vm = end.ready().unwrap_or_else(|| panic!("{name}: {end:?}"));
            // The next offer: the next region, or the first region's next zone.
            let next = if d.capacity_is_per_zone() { r0 } else { r1 };
            assert_eq!(vm.location.region, next, "{name}");
            assert_eq!(r.cloud.creates(), [r0, next], "{name}");
            assert_eq!(r.cloud.instances(), 1, "{name}");
            r.cloud.check_after(s);
            r.cloud.verify();
        }
        Scenario::QuotaBlocksTheRegion => {
            let cloud = d
                .start(World {
                    capacity_in: vec![r0, r1],
                    second_offer_in_first_region: true,
                    create_fault: Some(Fault::Quota),
                    ..World::default()
                })
                .await;
            let r = run(cloud, &[r0, r1]);
            let end = r.launch().await.unwrap();
            let vm = end.ready().unwrap_or_else(|| panic!("{name}: {end:?}"));
            assert_eq!(vm.location.region, r1, "{name}");
            assert_eq!(
                r.cloud.creates(),
                [r0, r1],
                "{name}: the other offer in {r0} shares the region's quota and is skipped"
            );
            r.cloud.check_after(s);
            r.cloud.verify();
        }
        Scenario::RetryAfterOnTheSameOffer => {
            let cloud = d
                .start(World {
                    capacity_in: vec![r0, r1],
                    create_fault: Some(Fault::RateLimited {
                        retry_after_secs: 1,
                    }),
                    ..World::default()
                })
                .await;
            let r = run(cloud, &[r0, r1]);
            let started = Instant::now();
            let end = r.launch().await.unwrap();
            let vm = end.ready().unwrap_or_else(|| panic!("{name}: {end:?}"));
            assert_eq!(vm.location.region, r0, "{name}");
            assert_eq!(r.cloud.creates(), [r0, r0], "{name}: no failover on 429");
            assert!(
                started.elapsed() >= Duration::from_secs(1),
                "{name}: Retry-After respected"
            );
            r.cloud.check_after(s);
            r.cloud.verify();
        }
        Scenario::CrashBetweenCreateAndJournalAdopts => {
            let cloud = d
                .start(World {
                    capacity_in: vec![r0],
                    ..World::default()
                })
                .await;
            let r = run(cloud, &[r0]);
            r.journal.crash_before("booting");
            let first = r.launch().await.unwrap_err();
            assert!(
                matches!(first, ExecError::Journal { .. }),
                "{name}: {first:?}"
            );
            assert_eq!(r.cloud.creates().len(), 1, "{name}: the create happened");
            let end = r.launch().await.unwrap();
            assert!(end.ready().is_some(), "{name}: {end:?}");
            assert_eq!(
                r.cloud.creates().len(),
                1,
                "{name}: adopted, not created twice"
            );
            assert_eq!(r.cloud.instances(), 1, "{name}");
            r.cloud.check_after(s);
            r.cloud.verify();
        }
        Scenario::ExactRegionMatch => {
            let cloud = d
                .start(World {
                    capacity_in: vec![r1],
                    ..World::default()
                })
                .await;
            let p = cloud.provider();
            let vm = cloud.vm();
            assert!(
                p.plan(&ask(&vm, &[r0])).await.unwrap().is_empty(),
                "{name}: {r0} is not {r1}"
            );
            let prefix = &r0[..r0.len() - 1];
            let by_prefix = p.plan(&ask(&vm, &[prefix])).await;
            if d.unknown_region_is_invalid() {
                let e = by_prefix.unwrap_err();
                assert_eq!(e.kind, ErrorKind::InvalidRequest, "{name}: {prefix}: {e}");
            } else {
                assert!(
                    by_prefix.unwrap().is_empty(),
                    "{name}: {prefix} matches nothing"
                );
            }
            let o = p.plan(&ask(&vm, &[r1])).await.unwrap();
            assert_eq!(o.len(), 1, "{name}: {o:?}");
            assert_eq!(o[0].location.region, r1, "{name}");
            // An instance in r1 is not seen when observing r0.
            let r = run(cloud, &[r1]);
            let end = r.launch().await.unwrap();
            let up = end.ready().unwrap_or_else(|| panic!("{name}: {end:?}"));
            assert!(
                r.provider
                    .observe(&r.cloud.at(r0), "trainer")
                    .await
                    .unwrap()
                    .is_empty(),
                "{name}: nothing of ours in {r0}"
            );
            let seen = r
                .provider
                .observe(&r.cloud.at(r1), "trainer")
                .await
                .unwrap();
            assert_eq!(seen.len(), 1, "{name}");
            assert_eq!(seen[0].instance_id, up.instance_id, "{name}");
            r.cloud.check_after(s);
            r.cloud.verify();
        }
        Scenario::SecretsNeverInErrors => {
            let cloud = d
                .start(World {
                    capacity_in: vec![r0],
                    echo_credential: true,
                    ..World::default()
                })
                .await;
            let secret = cloud.secret().expect("a cloud with a credential");
            let r = run(cloud, &[r0]);
            let end = r.launch().await.unwrap();
            match &end {
                LaunchState::Aborted { reason, .. } => {
                    assert!(!reason.contains(secret), "{name}: {reason}")
                }
                other => panic!("{name}: expected Aborted, got {other:?}"),
            }
            for (_, label) in r.journal.history() {
                assert!(!label.contains(secret), "{name}: {label}");
            }
            assert!(!format!("{end:?}").contains(secret), "{name}");
            r.cloud.check_after(s);
            r.cloud.verify();
        }
        Scenario::UnplannableAskIsInvalidRequest => {
            let cloud = d
                .start(World {
                    capacity_in: vec![r0],
                    ..World::default()
                })
                .await;
            let mut vm = cloud.vm();
            vm.gpu = Some(d.unplannable_gpu().into());
            let e = cloud.provider().plan(&ask(&vm, &[])).await.unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidRequest, "{name}: {e}");
            cloud.check_after(s);
            cloud.verify();
        }
        Scenario::DeleteAndCleanupIdempotent => {
            let cloud = d
                .start(World {
                    capacity_in: vec![r0],
                    ..World::default()
                })
                .await;
            let p = cloud.provider();
            let at = cloud.at(r0);
            p.delete(&at, "trainer", &[d.unknown_instance_id().into()])
                .await
                .unwrap_or_else(|e| panic!("{name}: deleting an unknown instance: {e}"));
            p.cleanup(&at, "trainer").await.unwrap();
            p.cleanup(&at, "trainer").await.unwrap();
            cloud.check_after(s);
            cloud.verify();
        }
        Scenario::PlanListsTheOffer => {
            let cloud = d
                .start(World {
                    capacity_in: vec![r0],
                    ..World::default()
                })
                .await;
            let vm = cloud.vm();
            let o = cloud.provider().plan(&ask(&vm, &[r0])).await.unwrap();
            assert!(!o.is_empty(), "{name}: no offer");
            assert!(o.iter().all(|o| o.location.region == r0), "{name}: {o:?}");
            if d.offers_are_free() {
                assert!(o.iter().all(|o| o.price_per_hour == 0.0), "{name}: {o:?}");
            } else {
                assert!(o.iter().all(|o| o.price_per_hour > 0.0), "{name}: {o:?}");
            }
            assert!(cloud.creates().is_empty(), "{name}: plan creates nothing");
            cloud.check_after(s);
            cloud.verify();
        }
        Scenario::ListFindsAndAdoptsByIdentity => {
            let cloud = d
                .start(World {
                    capacity_in: vec![r0, r1],
                    ..World::default()
                })
                .await;
            let r = run(cloud, &[r0]);
            let end = r.launch().await.unwrap();
            let vm = end
                .ready()
                .unwrap_or_else(|| panic!("{name}: not ready: {end:?}"))
                .clone();
            let listed = r.provider.list(&r.cloud.at(r0)).await.unwrap();
            let mine: Vec<_> = listed
                .iter()
                .filter(|l| l.observed.instance_id == vm.instance_id)
                .collect();
            assert_eq!(mine.len(), 1, "{name}: {listed:?}");
            assert_eq!(mine[0].vm_name, "trainer", "{name}");
            assert_eq!(mine[0].lineage, r.cloud.lineage(), "{name}");
            // A cloud with one region (Docker's `local`) has nowhere else to look.
            let elsewhere = if r1 == r0 {
                vec![]
            } else {
                r.provider.list(&r.cloud.at(r1)).await.unwrap()
            };
            assert!(
                elsewhere
                    .iter()
                    .all(|l| l.observed.instance_id != vm.instance_id),
                "{name}: listed in {r1} too: {elsewhere:?}"
            );
            // The record is lost; what the listing found is adopted, never created beside.
            let lost = Run {
                journal: Arc::new(MemoryJournal::new()),
                ..run(r.cloud, &[r0])
            };
            let found = LaunchState::Unowned {
                location: lost.cloud.at(r0),
                instance_ids: vec![vm.instance_id.clone()],
                reason: "found by identity".into(),
            };
            use gpuprov::machine::Journal as _;
            lost.journal
                .record(
                    "vm.trainer",
                    "launch",
                    &serde_json::to_value(&found).unwrap(),
                    "unowned",
                )
                .await
                .unwrap();
            let end = lost.launch().await.unwrap();
            let again = end
                .ready()
                .unwrap_or_else(|| panic!("{name}: not adopted: {end:?} {:?}", lost.labels()));
            assert_eq!(
                again.instance_id, vm.instance_id,
                "{name}: the same instance"
            );
            assert_eq!(lost.cloud.creates(), [r0], "{name}: still one create");
            assert_eq!(lost.cloud.instances(), 1, "{name}");
            let end = lost
                .teardown(Target::new(
                    vm.location.clone(),
                    "trainer",
                    vec![vm.instance_id.clone()],
                ))
                .await;
            assert_eq!(end, TeardownState::Done, "{name}");
            lost.cloud.check_after(s);
            lost.cloud.verify();
        }
        Scenario::ObserveLocationMatchesObserve => observe_location_scenario(d, s).await,
    }
}

/// [`Scenario::ObserveLocationMatchesObserve`]: VMs `trainer` and `worker` launched in
/// the first region, `elsewhere` in the second, `imported` (where the cloud imports) an
/// outside instance taken in by `import`, and `absent` never launched; at both regions,
/// every name's entry of `observe_location` equals `observe`, and the map holds exactly
/// the VMs with instances there.
async fn observe_location_scenario(d: &dyn Driver, s: Scenario) {
    let name = d.name();
    let [r0, r1] = d.regions();
    let cloud = d
        .start(World {
            capacity_in: vec![r0, r1],
            ..World::default()
        })
        .await;
    let p = cloud.provider();
    let mut launched = vec![];
    for (vm_name, region) in [("trainer", r0), ("worker", r0), ("elsewhere", r1)] {
        if region == r1 && r1 == r0 {
            continue; // One region (Docker's `local`): nowhere else to launch.
        }
        let mut vm = cloud.vm();
        vm.name = vm_name.into();
        vm.regions = vec![region.into()];
        let end = drive::launch_in(
            cloud.lineage(),
            &vm,
            p.clone(),
            Arc::new(MemoryJournal::new()),
            Arc::new(FakeConnector::default()),
        )
        .await
        .unwrap();
        let up = end
            .ready()
            .unwrap_or_else(|| panic!("{name}: {vm_name} not ready: {end:?}"));
        assert_eq!(up.location.region, region, "{name}: {vm_name}");
        launched.push((vm_name, region));
    }
    if let Some(id) = cloud.outside_instance(r0) {
        p.import(&cloud.at(r0), "imported", &id)
            .await
            .unwrap_or_else(|e| panic!("{name}: import {id}: {e}"));
        launched.push(("imported", r0));
    }
    let names = ["trainer", "worker", "elsewhere", "imported", "absent"];
    for region in [r0, r1] {
        let at = cloud.at(region);
        let all = p
            .observe_location(&at)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{name}: observe_location answers None at {at}"));
        for vm in names {
            let one = p.observe(&at, vm).await.unwrap();
            let there = launched.iter().any(|&(v, r)| v == vm && r == region);
            assert_eq!(
                !one.is_empty(),
                there,
                "{name}: observe({at}, {vm}) = {one:?}"
            );
            assert_eq!(
                all.get(vm).cloned().unwrap_or_default(),
                one,
                "{name}: observe_location({at})[{vm}] differs from observe"
            );
        }
        let keys: Vec<&str> = all
            .iter()
            .filter(|(_, seen)| !seen.is_empty())
            .map(|(k, _)| k.as_str())
            .collect();
        let mut want: Vec<&str> = launched
            .iter()
            .filter(|&&(_, r)| r == region)
            .map(|&(v, _)| v)
            .collect();
        want.sort();
        assert_eq!(keys, want, "{name}: the VMs of {at}: {all:?}");
    }
    cloud.check_after(s);
    cloud.verify();
}

/// The scenario × adapter matrix: printed, and every scenario runs somewhere; an
/// unsupported cell always says why.
#[test]
fn the_matrix() {
    let ds = drivers();
    // A cloud this build can reach is checked by the whole contract: it has a driver.
    for c in gpuprov::config::Cloud::in_this_build() {
        assert!(
            ds.iter().any(|d| d.name() == c.as_str()),
            "cloud {c} has no conformance driver: add one to drivers()"
        );
    }
    let mut out = format!("{:<40}", "scenario");
    for d in &ds {
        out.push_str(&format!(" {:<12}", d.name()));
    }
    out.push('\n');
    for s in SCENARIOS {
        out.push_str(&format!("{:<40}", format!("{s:?}")));
        let mut any = false;
        for d in &ds {
            let cell = match unsupported(d.as_ref(), *s) {
                None => {
                    any = true;
                    "supported"
                }
                Some(why) => {
                    assert!(!why.is_empty(), "{} must say why it skips {s:?}", d.name());
                    "unsupported"
                }
            };
            out.push_str(&format!(" {cell:<12}"));
        }
        out.push('\n');
        assert!(any, "{s:?} runs on no adapter");
    }
    println!("{out}");
    for d in &ds {
        for s in SCENARIOS {
            if let Some(why) = unsupported(d.as_ref(), *s) {
                println!("{} / {s:?}: {why}", d.name());
            }
        }
    }
}

macro_rules! scenario_tests {
    ($($test:ident => $s:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $test() {
                for_each(Scenario::$s).await;
            }
        )*
    };
}

scenario_tests! {
    full_launch_and_teardown => FullLaunchAndTeardown,
    key_found_by_value_never_registered_twice => KeyFoundByValueNeverRegisteredTwice,
    capacity_fails_over => CapacityFailsOver,
    quota_blocks_the_region => QuotaBlocksTheRegion,
    retry_after_on_the_same_offer => RetryAfterOnTheSameOffer,
    crash_between_create_and_journal_adopts => CrashBetweenCreateAndJournalAdopts,
    exact_region_match => ExactRegionMatch,
    secrets_never_in_errors => SecretsNeverInErrors,
    unplannable_ask_is_invalid_request => UnplannableAskIsInvalidRequest,
    delete_and_cleanup_idempotent => DeleteAndCleanupIdempotent,
    plan_lists_the_offer => PlanListsTheOffer,
    list_finds_and_adopts_by_identity => ListFindsAndAdoptsByIdentity,
    observe_location_matches_observe => ObserveLocationMatchesObserve,
}
