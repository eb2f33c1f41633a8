//! The adapter conformance suite (issue 13): ONE scenario table run for every adapter
//! that has a [`Driver`]. A driver starts its cloud (a spec-checked local server, or the
//! FakeProvider), seeds a [`World`] in the cloud's own terms, builds the adapter with the
//! test capabilities, and reports what the cloud saw ([`Cloud`]); a scenario it cannot
//! express is declared unsupported with a reason. A new cloud gets the whole contract by
//! writing its driver and adding it to [`drivers`].
//!
//! The suite is the home of every contract method (issue 34): a scenario about an
//! optional method runs for every driver whose adapter DECLARES the feature in
//! `capabilities()` ([`Scenario::feature`]: shared objects, `start`, `import`,
//! `diagnose`), read from the adapter and never from the driver, so a cloud that
//! declares a feature is held to it and one that does not is listed "not declared".
//! `every_contract_method_is_named_in_a_scenario` fails when a method of the trait
//! `CloudProvider` is called in no scenario's body (a few the wrappers and the CLI read
//! are on its allow-list, each with its reason).
//!
//! `the_matrix` prints the features each cloud declares and checks scenario × adapter;
//! each scenario is one test that runs every driver that supports it. Vendor-only
//! behaviour stays in the vendor's own module (`vendor::lambda` …) beside its driver.
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
mod recorded;
mod recover;
mod runpod;
mod verda;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuprov::config::VmSpec;
use gpuprov::machine::{ExecError, MemoryJournal};
use gpuprov::provider::doubles::fake::FakeConnector;
use gpuprov::provider::{
    identity, CloudProvider, ErrorKind, Feature, InstanceSpec, InstanceStatus, Location,
    ResourceRequest, Seen, SharedFound, SharedObject,
};
use gpuprov::vm::{LaunchState, Target, TeardownState};

use crate::support::drive;

/// The contract every adapter is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    FullLaunchAndTeardown,
    /// The user registered the project key before, under their own name: the launch
    /// (its shared objects prepared as the engine prepares them, `vm::shared`) finds it
    /// by value through `observe_shared` and comes up with it; nothing is registered.
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
    /// `prepare` is idempotent per (VM, offer): a second call answers the same, and what
    /// it made is removed by `cleanup` even when nothing was created (an abandoned
    /// offer), twice over; `create` with it (the spec built as the engine builds it, the
    /// offer's shared objects found or made first) makes one instance, which the teardown
    /// removes with everything else.
    PrepareTwiceCreateOnce,
    /// [`Feature::SharedObjects`]: every object `shared_objects(offer)` names is absent on
    /// a fresh cloud, made by `create_shared` (the key registered once), then found by
    /// `observe_shared` (keys by value) as ours; a second `create_shared` is refused as
    /// `Exists` or answers the same object; `delete_shared` removes it, and again is
    /// success. The user's own key, registered before under their name and comment, is
    /// found by value and is not ours.
    SharedKeys,
    /// [`Feature::SharedObjects`] with the project key (`ssh_key`): `prepare` without the
    /// key in `spec.shared` is `InvalidRequest`, and nothing is registered: the key has one
    /// path, the shared object the core prepares (issue 34 item 2).
    PrepareNeedsTheProjectKey,
    /// [`Feature::Start`]: a machine whose instance was stopped in the cloud's own terms
    /// ([`Cloud::stop`]) is observed `Stopped`; the next launch starts the same instance
    /// (one `start`, no second `create`, the pinned host key) instead of replacing it; a
    /// `start` of a running instance is success.
    StartNotReplace,
    /// [`Feature::Import`]: an instance made outside gpuprov ([`Cloud::outside_instance`])
    /// is taken into a VM; `observe` then reports it for that VM and the teardown deletes
    /// it. An id that names nothing, one in another region, and another VM's instance are
    /// `InvalidRequest`.
    ImportOutsideInstance,
    /// [`Feature::Diagnose`]: `diagnose` of a launched instance answers (one line per
    /// finding) and changes nothing: no create, the instance still there and running; a
    /// gone instance has no findings.
    Diagnose,
    /// The state is lost after an apply: the real binary's `state recover --lineage L`
    /// adopts the machine from what the cloud reports under the lost lineage, and
    /// `destroy` then leaves no instance and no side resource (keys, firewalls, security
    /// groups, environments…: [`Cloud::side_resources`]) on the cloud (issue 34).
    StateLostRecoverThenDestroy,
}

impl Scenario {
    /// The optional feature the scenario is about: it runs only where the adapter declares
    /// it in `capabilities()`.
    pub fn feature(self) -> Option<Feature> {
        match self {
            Scenario::SharedKeys | Scenario::PrepareNeedsTheProjectKey => {
                Some(Feature::SharedObjects)
            }
            Scenario::StartNotReplace => Some(Feature::Start),
            Scenario::ImportOutsideInstance => Some(Feature::Import),
            Scenario::Diagnose => Some(Feature::Diagnose),
            _ => None,
        }
    }
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
    Scenario::PrepareTwiceCreateOnce,
    Scenario::SharedKeys,
    Scenario::PrepareNeedsTheProjectKey,
    Scenario::StartNotReplace,
    Scenario::ImportOutsideInstance,
    Scenario::Diagnose,
    Scenario::StateLostRecoverThenDestroy,
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
    /// Side resources of ours the cloud holds now, counted from the vendor server's own
    /// records (registered keys, firewalls, security groups, rulesets, environments,
    /// volumes…): what a lost state could leak beside the instances. A fresh cloud of
    /// [`Driver::start`] holds none.
    fn side_resources(&self) -> usize;
    /// How the real binary reaches this cloud (endpoint and credential variables, a
    /// `[cloud.NAME]` section), with any credential file written under `dir` (the project
    /// directory); `None` for a cloud the binary cannot reach (the in-memory fake).
    fn cli(&self, dir: &std::path::Path) -> Option<recover::CliCloud>;
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
    /// and answers its id (a new one each call), for `import`. Every cloud declaring
    /// [`Feature::Import`] has one; `None` elsewhere.
    fn outside_instance(&self, _region: &str) -> Option<String> {
        None
    }
    /// Vendor checks of what `import` answered in [`Scenario::ImportOutsideInstance`]
    /// (how the instance carries the identity now).
    fn check_imported(&self, _imported: &gpuprov::provider::Imported) {}
    /// Stops instance `id` in the cloud's own terms, as its user or the vendor would (the
    /// vendor server's state changed directly, nothing sent through the adapter), and
    /// returns once the cloud shows it stopped. Every cloud declaring [`Feature::Start`]
    /// has it.
    fn stop(&self, id: &str) {
        panic!(
            "{}: the adapter declares Start but the driver cannot stop instance {id}",
            self.provider().name()
        )
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
    async fn start(&self, world: World) -> Box<dyn Cloud>;
}

/// Why `d` cannot express `s`, if it cannot.
fn unsupported(d: &dyn Driver, s: Scenario) -> Option<&'static str> {
    d.unsupported(s)
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

/// Runs `s` for every driver that supports it and whose adapter declares its feature;
/// returns how many ran.
async fn for_each(s: Scenario) -> usize {
    let mut ran = 0;
    for d in drivers() {
        if let Some(why) = unsupported(d.as_ref(), s) {
            eprintln!("{:?} on {}: unsupported ({why})", s, d.name());
            continue;
        }
        eprintln!("{:?} on {}", s, d.name());
        if scenario(d.as_ref(), s).await {
            ran += 1;
        }
    }
    assert!(ran > 0, "{s:?} ran on no adapter");
    ran
}

/// Whether `cloud`'s adapter declares what `s` needs ([`Scenario::feature`]), read from
/// its `capabilities()`; says so when it does not.
fn declares(cloud: &dyn Cloud, s: Scenario) -> bool {
    let Some(f) = s.feature() else {
        return true;
    };
    let p = cloud.provider();
    let yes = p.capabilities().supports(f);
    if !yes {
        eprintln!("{s:?} on {}: {f:?} not declared", p.name());
    }
    yes
}

/// `d`'s cloud started with capacity in `capacity_in`, or `None` (said on stderr) when
/// its adapter does not declare `s`'s feature.
async fn start_declaring(
    d: &dyn Driver,
    s: Scenario,
    capacity_in: Vec<&'static str>,
) -> Option<Box<dyn Cloud>> {
    let cloud = d
        .start(World {
            capacity_in,
            ..World::default()
        })
        .await;
    declares(cloud.as_ref(), s).then_some(cloud)
}

/// The spec the engine would give `prepare` and `create` for `vm` on `cloud`: attempt
/// `r0-o0`, the test key, no boot script, `shared` as prepared.
fn spec_for(cloud: &dyn Cloud, vm: &VmSpec, shared: BTreeMap<String, SharedFound>) -> InstanceSpec {
    let short: String = cloud.lineage().chars().take(8).collect();
    InstanceSpec {
        vm_name: vm.name.clone(),
        lineage: cloud.lineage().to_string(),
        client_token: format!("gpuprov-{short}-{}-r0-o0", vm.name),
        image: vm.image.clone(),
        disk_gb: vm.disk_gb,
        ports: vm.ports.clone(),
        ssh_public_key: drive::PUBKEY.into(),
        boot_script: None,
        shared,
    }
}

/// Runs `s` on `d`'s cloud; `false` when the adapter does not declare the scenario's
/// feature (nothing ran).
async fn scenario(d: &dyn Driver, s: Scenario) -> bool {
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
            // The one read shows the instance with the identity the rule gives to
            // `trainer`, in its region only.
            let lineage: gpuprov::provider::Lineage = r.cloud.lineage().parse().unwrap();
            let seen = listing(r.provider.as_ref(), &r.cloud.at(r0)).await;
            let mine: Vec<&Seen> = seen
                .iter()
                .filter(|x| x.instance_id == vm.instance_id)
                .collect();
            assert_eq!(mine.len(), 1, "{name}: instances: {seen:?}");
            assert_eq!(
                identity::owner(&mine[0].identity, &lineage, r0).as_deref(),
                Some("trainer"),
                "{name}: {:?}",
                mine[0].identity
            );
            if r1 != r0 {
                // A cloud whose listing does not say where an instance runs (Massed
                // Compute) shows it everywhere; its name places it, and the rule then
                // gives it to no VM there.
                let seen = listing(r.provider.as_ref(), &r.cloud.at(r1)).await;
                assert!(
                    seen.iter().all(|x| x.instance_id != vm.instance_id
                        || identity::owner(&x.identity, &lineage, r1).is_none()),
                    "{name}: instances in {r1}: {seen:?}"
                );
            }
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
        Scenario::PrepareTwiceCreateOnce => prepare_scenario(d, s).await,
        Scenario::SharedKeys => return shared_keys_scenario(d, s).await,
        Scenario::PrepareNeedsTheProjectKey => return prepare_needs_key_scenario(d, s).await,
        Scenario::StartNotReplace => return start_scenario(d, s).await,
        Scenario::ImportOutsideInstance => return import_scenario(d, s).await,
        Scenario::Diagnose => return diagnose_scenario(d, s).await,
        Scenario::StateLostRecoverThenDestroy => recover::state_lost_scenario(d, s).await,
    }
    true
}

/// [`Scenario::ObserveLocationMatchesObserve`]: VMs `trainer` and `worker` launched in
/// the first region, `elsewhere` in the second, `imported` (where the adapter declares
/// [`Feature::Import`]) an outside instance taken in by `import`, and `absent` never
/// launched; at both regions, every name's entry of `observe_location` equals `observe`,
/// and the map holds exactly the VMs with instances there.
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
    if p.capabilities().supports(Feature::Import) {
        let id = cloud
            .outside_instance(r0)
            .unwrap_or_else(|| panic!("{name} declares Import: its driver seeds no instance"));
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

/// `instances(at, None)`; an error fails the scenario.
async fn listing(p: &dyn CloudProvider, at: &Location) -> Vec<Seen> {
    p.instances(at, None)
        .await
        .unwrap_or_else(|e| panic!("{}: instances at {at}: {e}", p.name()))
}

/// The offer's shared objects as the engine supplies them to `prepare` (`vm::shared`):
/// each found by value or made; answers them with the ones made here (to delete after).
async fn shared_for(
    p: &dyn CloudProvider,
    offer: &gpuprov::provider::Offer,
) -> (
    BTreeMap<String, SharedFound>,
    Vec<(SharedObject, SharedFound)>,
) {
    let mut shared = BTreeMap::new();
    let mut made = Vec::new();
    for obj in p.shared_objects(offer) {
        let found = match p.observe_shared(&obj, drive::PUBKEY).await.unwrap() {
            Some(f) => f,
            None => {
                let f = p.create_shared(&obj, drive::PUBKEY).await.unwrap();
                made.push((obj.clone(), f.clone()));
                f
            }
        };
        shared.insert(obj.kind.clone(), found);
    }
    (shared, made)
}

/// [`Scenario::PrepareTwiceCreateOnce`].
async fn prepare_scenario(d: &dyn Driver, s: Scenario) {
    let name = d.name();
    let [r0, _] = d.regions();
    let cloud = d
        .start(World {
            capacity_in: vec![r0],
            ..World::default()
        })
        .await;
    let p = cloud.provider();
    let vm = cloud.vm();
    let offer = p
        .plan(&ask(&vm, &[r0]))
        .await
        .unwrap()
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("{name}: no offer in {r0}"));
    let (shared, made) = shared_for(p.as_ref(), &offer).await;
    let spec = spec_for(cloud.as_ref(), &vm, shared);
    let at = Location {
        zone: None,
        ..offer.location.clone()
    };
    // An abandoned offer: prepared twice, nothing created, cleaned up twice.
    let first = p.prepare(&offer, &spec).await.unwrap();
    let again = p.prepare(&offer, &spec).await.unwrap();
    assert_eq!(first, again, "{name}: prepare twice answers the same");
    p.cleanup(&at, &vm.name).await.unwrap();
    p.cleanup(&at, &vm.name).await.unwrap();
    // Prepared again and created once: one instance, which the teardown removes.
    let prep = p.prepare(&offer, &spec).await.unwrap();
    let id = p.create(&offer, &prep, &spec).await.unwrap();
    assert!(!id.is_empty(), "{name}: create answers an id");
    assert_eq!(cloud.creates(), [r0], "{name}: one create");
    assert_eq!(cloud.instances(), 1, "{name}");
    let end = drive::teardown(
        p.clone(),
        Target::new(offer.location.clone(), &vm.name, vec![id.clone()]),
        Arc::new(MemoryJournal::new()),
    )
    .await;
    assert_eq!(end, TeardownState::Done, "{name}");
    assert_eq!(cloud.instances(), 0, "{name}");
    cloud.check_torn_down();
    for (obj, found) in made.iter().rev() {
        p.delete_shared(obj, found).await.unwrap();
    }
    cloud.check_after(s);
    cloud.verify();
}

/// [`Scenario::SharedKeys`]; `false` where the adapter does not declare shared objects.
async fn shared_keys_scenario(d: &dyn Driver, s: Scenario) -> bool {
    let name = d.name();
    let [r0, _] = d.regions();
    let key = drive::PUBKEY;
    let Some(cloud) = start_declaring(d, s, vec![r0]).await else {
        return false;
    };
    let p = cloud.provider();
    let offer = p.plan(&ask(&cloud.vm(), &[r0])).await.unwrap().remove(0);
    let objects = p.shared_objects(&offer);
    assert!(
        objects.iter().any(|o| o.kind == "ssh_key"),
        "{name} declares SharedObjects: {objects:?}"
    );
    // In preparation order (a key pair may live in an environment made before it).
    let mut made: Vec<(SharedObject, SharedFound)> = Vec::new();
    for obj in &objects {
        let what = obj.address();
        assert_eq!(
            p.observe_shared(obj, key).await.unwrap(),
            None,
            "{name}: {what} on a fresh cloud"
        );
        let registered = cloud.key_registrations();
        let first = p.create_shared(obj, key).await.unwrap();
        assert!(first.ours, "{name}: {what} made by gpuprov: {first:?}");
        if obj.kind == "ssh_key" {
            assert_eq!(
                cloud.key_registrations(),
                registered + 1,
                "{name}: the key registered once"
            );
        }
        let seen = p
            .observe_shared(obj, key)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{name}: {what} not found after its create"));
        assert_eq!(seen, first, "{name}: {what} found as made");
        match p.create_shared(obj, key).await {
            Err(e) if e.kind == ErrorKind::Exists => {}
            Ok(again) if again.id == first.id => {}
            other => panic!(
                "{name}: a second create_shared of {what} must be refused as Exists or answer \
                 the same object, never make it again: {other:?}"
            ),
        }
        made.push((obj.clone(), seen));
    }
    // Teardown runs the other way.
    for (obj, found) in made.iter().rev() {
        let what = obj.address();
        p.delete_shared(obj, found).await.unwrap();
        assert_eq!(
            p.observe_shared(obj, key).await.unwrap(),
            None,
            "{name}: {what} gone"
        );
        p.delete_shared(obj, found).await.unwrap_or_else(|e| {
            panic!("{name}: deleting {what} again (one already gone is success): {e}")
        });
    }
    cloud.check_after(s);
    cloud.verify();

    // The user's own registration of the key (their name and comment): found by value,
    // not ours, nothing registered.
    let cloud = d
        .start(World {
            capacity_in: vec![r0],
            existing_key: true,
            ..World::default()
        })
        .await;
    let p = cloud.provider();
    let mut made: Vec<(SharedObject, SharedFound)> = Vec::new();
    for obj in &objects {
        let found = p.observe_shared(obj, key).await.unwrap();
        if obj.kind == "ssh_key" {
            let found = found.unwrap_or_else(|| panic!("{name}: the user's key not found"));
            assert!(!found.ours, "{name}: the user's key is not ours: {found:?}");
        } else if found.is_none() {
            made.push((obj.clone(), p.create_shared(obj, key).await.unwrap()));
        }
    }
    assert_eq!(cloud.key_registrations(), 0, "{name}: nothing registered");
    for (obj, found) in made.iter().rev() {
        p.delete_shared(obj, found).await.unwrap();
    }
    cloud.verify();
    true
}

/// [`Scenario::PrepareNeedsTheProjectKey`]; `false` where the adapter declares no shared
/// project key.
async fn prepare_needs_key_scenario(d: &dyn Driver, s: Scenario) -> bool {
    let name = d.name();
    let [r0, _] = d.regions();
    let Some(cloud) = start_declaring(d, s, vec![r0]).await else {
        return false;
    };
    let p = cloud.provider();
    let vm = cloud.vm();
    let offer = p.plan(&ask(&vm, &[r0])).await.unwrap().remove(0);
    if !p.shared_objects(&offer).iter().any(|o| o.kind == "ssh_key") {
        eprintln!("{s:?} on {name}: no shared ssh_key");
        return false;
    }
    let spec = spec_for(cloud.as_ref(), &vm, Default::default());
    let e = p.prepare(&offer, &spec).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest, "{name}: {e}");
    assert!(
        e.msg.contains("SSH key"),
        "{name}: says what is missing: {e}"
    );
    assert_eq!(cloud.key_registrations(), 0, "{name}: nothing registered");
    assert_eq!(cloud.instances(), 0, "{name}");
    cloud.verify();
    true
}

/// [`Scenario::StartNotReplace`]; `false` where the adapter does not declare `start`.
/// [`Cloud::check_after`] runs once the machine is up again, before the scenario's own
/// `start` of the running instance and the teardown.
async fn start_scenario(d: &dyn Driver, s: Scenario) -> bool {
    let name = d.name();
    let [r0, _] = d.regions();
    let Some(cloud) = start_declaring(d, s, vec![r0]).await else {
        return false;
    };
    let recorded = recorded::Recorded::new(cloud.provider());
    let r = Run {
        provider: recorded.clone(),
        ..run(cloud, &[r0])
    };
    let end = r.launch().await.unwrap();
    let old = end
        .ready()
        .unwrap_or_else(|| panic!("{name}: not ready: {end:?}"))
        .clone();
    let id = old.instance_id.clone();
    r.cloud.stop(&id);
    let seen = r.provider.observe(&old.location, "trainer").await.unwrap();
    assert_eq!(seen.len(), 1, "{name}: a stopped instance is still there");
    assert_eq!(
        (seen[0].instance_id.as_str(), &seen[0].status),
        (id.as_str(), &InstanceStatus::Stopped),
        "{name}: observed stopped"
    );
    let before = r.labels().len();
    let again = r.launch().await.unwrap();
    let vm = again
        .ready()
        .unwrap_or_else(|| panic!("{name}: not up again: {again:?} {:?}", r.labels()));
    assert_eq!(vm.instance_id, id, "{name}: the same instance");
    assert_eq!(vm.host_key, old.host_key, "{name}: pinned");
    let labels = r.labels()[before..].to_vec();
    let at = |p: &str| {
        labels
            .iter()
            .position(|l| l.starts_with(p))
            .unwrap_or_else(|| panic!("{name}: no {p:?} in {labels:?}"))
    };
    assert!(
        at("reconciling") < at("starting stopped")
            && at("starting stopped") < at(&format!("starting {id} "))
            && at(&format!("starting {id} ")) < at("connecting")
            && at("connecting") < at("ready"),
        "{name}: {labels:?}"
    );
    assert!(
        !labels
            .iter()
            .any(|l| l.starts_with("compensating") || l.starts_with("planning")),
        "{name}: {labels:?}"
    );
    assert_eq!(recorded.count("start"), 1, "{name}: started once");
    assert_eq!(r.cloud.creates(), [r0], "{name}: never a second create");
    assert_eq!(recorded.count("delete"), 0, "{name}: nothing deleted");
    assert_eq!(r.cloud.instances(), 1, "{name}");
    r.cloud.check_after(s);
    // A start of a running instance is success, and leaves it running.
    r.provider
        .start(&vm.location, "trainer", &id)
        .await
        .unwrap_or_else(|e| panic!("{name}: start of a running instance: {e}"));
    let seen = r.provider.observe(&vm.location, "trainer").await.unwrap();
    assert_eq!(seen.len(), 1, "{name}: {seen:?}");
    assert_eq!(seen[0].instance_id, id, "{name}");
    assert!(
        matches!(
            seen[0].status,
            InstanceStatus::Running | InstanceStatus::Pending
        ),
        "{name}: {seen:?}"
    );
    let end = r
        .teardown(Target::new(vm.location.clone(), "trainer", vec![id]))
        .await;
    assert_eq!(end, TeardownState::Done, "{name}");
    assert_eq!(r.cloud.instances(), 0, "{name}");
    r.cloud.check_torn_down();
    r.cloud.verify();
    true
}

/// [`Scenario::ImportOutsideInstance`]; `false` where the adapter does not declare
/// `import`.
async fn import_scenario(d: &dyn Driver, s: Scenario) -> bool {
    let name = d.name();
    let [r0, r1] = d.regions();
    let Some(cloud) = start_declaring(d, s, vec![r0, r1]).await else {
        return false;
    };
    let p = cloud.provider();
    let at = cloud.at(r0);
    let outside = |region: &str| {
        cloud
            .outside_instance(region)
            .unwrap_or_else(|| panic!("{name} declares Import: its driver seeds no instance"))
    };
    let id = outside(r0);
    assert!(
        p.observe(&at, "imported").await.unwrap().is_empty(),
        "{name}: no one's before the import"
    );
    let got = p
        .import(&at, "imported", &id)
        .await
        .unwrap_or_else(|e| panic!("{name}: import {id}: {e}"));
    assert_eq!(got.observed.instance_id, id, "{name}");
    assert!(!got.identity.is_empty(), "{name}: says how: {got:?}");
    cloud.check_imported(&got);
    let seen = p.observe(&at, "imported").await.unwrap();
    assert_eq!(seen.len(), 1, "{name}: {seen:?}");
    assert_eq!(seen[0].instance_id, id, "{name}");
    // What names nothing here, or someone else's, is refused.
    let mut refused = vec![(d.unknown_instance_id().to_string(), "an unknown id")];
    if r1 != r0 {
        refused.push((outside(r1), "an instance in another region"));
    }
    let mut vm = cloud.vm();
    vm.regions = vec![r0.into()];
    let end = drive::launch_in(
        cloud.lineage(),
        &vm,
        p.clone(),
        Arc::new(MemoryJournal::new()),
        Arc::new(FakeConnector::default()),
    )
    .await
    .unwrap();
    let trainer = end
        .ready()
        .unwrap_or_else(|| panic!("{name}: trainer not ready: {end:?}"))
        .clone();
    refused.push((trainer.instance_id.clone(), "another VM's instance"));
    for (other, what) in refused {
        let e = p.import(&at, "imported", &other).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidRequest, "{name}: {what}: {e}");
    }
    // The imported instance is the VM's from now on: the teardown deletes it.
    for (vm_name, ids) in [
        ("imported", vec![id]),
        ("trainer", vec![trainer.instance_id]),
    ] {
        let end = drive::teardown(
            p.clone(),
            Target::new(at.clone(), vm_name, ids),
            Arc::new(MemoryJournal::new()),
        )
        .await;
        assert_eq!(end, TeardownState::Done, "{name}: {vm_name}");
        assert!(
            p.observe(&at, vm_name).await.unwrap().is_empty(),
            "{name}: {vm_name} gone"
        );
    }
    cloud.check_after(s);
    cloud.verify();
    true
}

/// [`Scenario::Diagnose`]; `false` where the adapter does not declare `diagnose`.
async fn diagnose_scenario(d: &dyn Driver, s: Scenario) -> bool {
    let name = d.name();
    let [r0, _] = d.regions();
    let Some(cloud) = start_declaring(d, s, vec![r0]).await else {
        return false;
    };
    let r = run(cloud, &[r0]);
    let end = r.launch().await.unwrap();
    let vm = end
        .ready()
        .unwrap_or_else(|| panic!("{name}: not ready: {end:?}"))
        .clone();
    let findings = r
        .provider
        .diagnose(&vm.location, "trainer", &vm.instance_id)
        .await
        .unwrap_or_else(|e| panic!("{name}: diagnose: {e}"));
    for f in &findings {
        assert!(
            !f.message.is_empty() && !f.message.contains('\n'),
            "{name}: one line: {f:?}"
        );
        if let Some(secret) = r.cloud.secret() {
            assert!(!f.message.contains(secret), "{name}: {f:?}");
        }
    }
    // Read-only: nothing made or removed, the instance as it was.
    assert_eq!(r.cloud.creates(), [r0], "{name}");
    assert_eq!(r.cloud.instances(), 1, "{name}");
    let seen = r.provider.observe(&vm.location, "trainer").await.unwrap();
    assert_eq!(seen.len(), 1, "{name}: {seen:?}");
    assert_eq!(
        (seen[0].instance_id.as_str(), &seen[0].status),
        (vm.instance_id.as_str(), &InstanceStatus::Running),
        "{name}"
    );
    let end = r
        .teardown(Target::new(
            vm.location.clone(),
            "trainer",
            vec![vm.instance_id.clone()],
        ))
        .await;
    assert_eq!(end, TeardownState::Done, "{name}");
    let gone = r
        .provider
        .diagnose(&vm.location, "trainer", &vm.instance_id)
        .await
        .unwrap_or_else(|e| panic!("{name}: diagnose of a gone instance: {e}"));
    assert!(gone.is_empty(), "{name}: a gone instance: {gone:?}");
    r.cloud.check_after(s);
    r.cloud.verify();
    true
}

/// The features `name`'s adapter declares in `capabilities()`, its cloud started once for
/// the asking (on its own thread and runtime: the matrix is a sync test).
fn declared_features(name: &'static str) -> Vec<Feature> {
    on_own_runtime(move || async move {
        let d = drivers()
            .into_iter()
            .find(|d| d.name() == name)
            .expect("a driver of that name");
        let [r0, r1] = d.regions();
        let cloud = d
            .start(World {
                capacity_in: vec![r0, r1],
                ..World::default()
            })
            .await;
        let features = cloud.provider().capabilities().supported;
        drop(cloud);
        features
    })
}

/// The scenario × adapter matrix: printed with the features each cloud declares, and
/// every scenario runs somewhere. A cell is `supported`, `unsupported` (the driver says
/// why), or `not declared` (the adapter does not declare the scenario's feature).
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
    // A driver whose cloud cannot start here (no Docker, no moto, with the skip set)
    // declares every scenario unsupported: its adapter is not asked.
    let features: Vec<Option<Vec<Feature>>> = ds
        .iter()
        .map(|d| {
            d.unsupported(Scenario::FullLaunchAndTeardown)
                .is_none()
                .then(|| declared_features(d.name()))
        })
        .collect();
    let mut out = String::from("features declared in capabilities():\n");
    for (d, f) in ds.iter().zip(&features) {
        let f = match f {
            Some(f) => format!("{f:?}"),
            None => "(cloud not started here)".into(),
        };
        out.push_str(&format!("  {:<16} {f}\n", d.name()));
    }
    out.push('\n');
    out.push_str(&format!("{:<38}", "scenario"));
    for d in &ds {
        out.push_str(&format!(" {:<14}", d.name()));
    }
    out.push('\n');
    let mut why = Vec::new();
    for s in SCENARIOS {
        out.push_str(&format!("{:<38}", format!("{s:?}")));
        let mut any = false;
        for (d, f) in ds.iter().zip(&features) {
            let missing = s
                .feature()
                .filter(|x| f.as_ref().is_some_and(|f| !f.contains(x)));
            let cell = match (unsupported(d.as_ref(), *s), missing) {
                (Some(reason), _) => {
                    assert!(
                        !reason.is_empty(),
                        "{} must say why it skips {s:?}",
                        d.name()
                    );
                    why.push(format!("{} / {s:?}: {reason}", d.name()));
                    "unsupported"
                }
                (None, Some(x)) => {
                    why.push(format!("{} / {s:?}: {x:?} not declared", d.name()));
                    "not declared"
                }
                (None, None) => {
                    any = true;
                    "supported"
                }
            };
            out.push_str(&format!(" {cell:<14}"));
        }
        out.push('\n');
        assert!(any, "{s:?} runs on no adapter");
    }
    println!("{out}");
    for w in why {
        println!("{w}");
    }
}

/// Contract methods no scenario has to call, each with its reason: what the adapter
/// states about itself (read by the wrappers, the CLI and every scenario's gate) rather
/// than a behaviour of the cloud. A stale entry (no such method) fails.
const NOT_IN_SCENARIOS: &[(&str, &str)] = &[
    (
        "adapter",
        "the adapter's statement about itself, read by the provided methods and the wrappers",
    ),
    (
        "name",
        "the cloud's config name, read by every caller to route a call",
    ),
    (
        "capabilities",
        "read by the core and by every scenario's gate (`declares`), not a behaviour of its own",
    ),
    (
        "endpoint_override",
        "shown by `gpuprov plan` (CLI); each adapter's settings tests cover it",
    ),
    (
        "credentials",
        "`gpuprov validate` (CLI) reports it; each adapter's settings tests cover it",
    ),
    (
        "check_request",
        "the core's per-machine check beside a shared `plan` (machine::coalesce), no call",
    ),
    (
        "shared_objects",
        "the engine's graph reads it (vm::shared); derived from shared::declared, no call",
    ),
];

/// The methods of trait `name` in `source` (rustfmt'ed Rust): every `fn` one indent deep
/// between `pub trait <name>` and its closing brace.
fn trait_methods(source: &str, name: &str) -> Vec<String> {
    let head = format!("pub trait {name}");
    let mut lines = source.lines().skip_while(|l| !l.starts_with(&head)).skip(1);
    let mut out = Vec::new();
    for line in lines.by_ref() {
        if line == "}" {
            break;
        }
        let Some(rest) = line.strip_prefix("    ") else {
            continue;
        };
        let rest = rest.strip_prefix("async ").unwrap_or(rest);
        if let Some(sig) = rest.strip_prefix("fn ") {
            let end = sig.find(['(', '<']).unwrap_or(sig.len());
            out.push(sig[..end].to_string());
        }
    }
    out
}

/// The methods called (`.<method>(`) in the bodies of the scenario functions of
/// `source` (rustfmt'ed Rust): `scenario` and every `*_scenario` function, comments left
/// out.
fn scenario_calls(source: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let mut inside = false;
    for line in source.lines() {
        if !inside {
            let sig = line.strip_prefix("async ").unwrap_or(line);
            if let Some(sig) = sig.strip_prefix("fn ") {
                let name = &sig[..sig.find(['(', '<']).unwrap_or(sig.len())];
                inside = name == "scenario" || name.ends_with("_scenario");
            }
            continue;
        }
        if line == "}" {
            inside = false;
            continue;
        }
        let code = line.split("//").next().unwrap_or_default();
        for (i, _) in code.match_indices('.') {
            let rest = &code[i + 1..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            if end > 0 && rest[end..].starts_with('(') {
                out.insert(rest[..end].to_string());
            }
        }
    }
    out
}

/// Issue 34: the suite is the home of every contract method. Every method of
/// `CloudProvider` is called in the body of some scenario function of this suite, or is
/// on [`NOT_IN_SCENARIOS`] with its reason.
#[test]
fn every_contract_method_is_named_in_a_scenario() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let contract = std::fs::read_to_string(root.join("src/provider/mod.rs")).unwrap();
    let methods = trait_methods(&contract, "CloudProvider");
    assert!(
        methods.iter().any(|m| m == "plan") && methods.iter().any(|m| m == "instances"),
        "the trait was not read: {methods:?}"
    );
    let mut called = std::collections::BTreeSet::new();
    let dir = root.join("tests/it/conformance");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            called.extend(scenario_calls(&std::fs::read_to_string(&path).unwrap()));
        }
    }
    for (m, why) in NOT_IN_SCENARIOS {
        assert!(
            methods.iter().any(|x| x == m),
            "stale allow-list entry {m:?}: CloudProvider has no such method"
        );
        assert!(!why.is_empty(), "{m}: say why");
    }
    let missing: Vec<&String> = methods
        .iter()
        .filter(|m| !called.contains(*m) && !NOT_IN_SCENARIOS.iter().any(|(n, _)| n == m))
        .collect();
    assert!(
        missing.is_empty(),
        "contract methods no conformance scenario calls: {missing:?}; write the scenario \
         (gated by the feature the adapter declares, if optional), or allow-list a method \
         only the wrappers and the CLI read, with the reason"
    );
}

/// The rule above is not vacuous: a method added to the trait and called nowhere is
/// found, and calls split over lines are seen.
#[test]
fn the_contract_rule_finds_a_method_no_scenario_calls() {
    let contract = "pub trait CloudProvider: Send {\n    fn name(&self) -> &str;\n    \
                    async fn lease<'a>(&self, at: &Location) -> Result<()>;\n    \
                    async fn start(&self) -> Result<()> {\n        Ok(())\n    }\n}\n";
    assert_eq!(
        trait_methods(contract, "CloudProvider"),
        ["name", "lease", "start"]
    );
    let suite = "fn helper() {\n    p.lease(&at);\n}\n\nasync fn start_scenario(d: &dyn \
                 Driver) -> bool {\n    r.provider\n        .start(&at) // not .lease(\n}\n";
    let called = scenario_calls(suite);
    assert!(called.contains("start"), "{called:?}");
    assert!(!called.contains("lease"), "{called:?}");
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
    prepare_twice_create_once => PrepareTwiceCreateOnce,
    shared_keys => SharedKeys,
    prepare_needs_the_project_key => PrepareNeedsTheProjectKey,
    start_not_replace => StartNotReplace,
    import_outside_instance => ImportOutsideInstance,
    diagnose => Diagnose,
}

/// [`Scenario::StateLostRecoverThenDestroy`] on every driver, each to its end: a cloud
/// that leaks is named with what it left, after the others ran (the real binary's runs
/// make each cloud's result worth having on its own).
#[tokio::test]
async fn state_lost_recover_then_destroy() {
    use futures_util::FutureExt;
    let s = Scenario::StateLostRecoverThenDestroy;
    let (mut ran, mut failed) = (0, Vec::new());
    for d in drivers() {
        if let Some(why) = unsupported(d.as_ref(), s) {
            eprintln!("{s:?} on {}: unsupported ({why})", d.name());
            continue;
        }
        eprintln!("{s:?} on {}", d.name());
        ran += 1;
        let run = std::panic::AssertUnwindSafe(scenario(d.as_ref(), s)).catch_unwind();
        if let Err(e) = run.await {
            let why = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            eprintln!("{s:?} on {}: FAILED", d.name());
            failed.push(format!("{}: {why}", d.name()));
        } else {
            eprintln!("{s:?} on {}: passed", d.name());
        }
    }
    assert!(ran > 0, "{s:?} ran on no adapter");
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}
