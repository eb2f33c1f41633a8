//! A scripted in-memory provider for engine tests (and, later, benchmarks): offers,
//! instances that boot after a number of observes, and faults injected per primitive and
//! offer. It keeps a log of every call so tests can assert what the core did.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;

use crate::provider::kit::Adapter;
use crate::provider::rate::{self, EndpointClass};
use crate::provider::{
    Capabilities, CloudProvider, ErrorKind, InstanceSpec, InstanceStatus, Location, Observations,
    Observed, Offer, ProviderError, ResourceRequest, Result, Seen, Shown, SshEndpoint,
};

/// A provider primitive, for scripting faults and counting calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Plan,
    Prepare,
    Create,
    Observe,
    Delete,
    Cleanup,
    Start,
}

/// An instance as the fake cloud holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeInstance {
    /// Observes left before the instance is listed at all.
    pub unlisted_for: u32,
    pub id: String,
    pub vm_name: String,
    /// The lineage label the create carried (empty: put in directly by a test without
    /// one; `list` leaves such instances out).
    pub lineage: String,
    pub location: Location,
    pub status: InstanceStatus,
    /// Observes left before a Pending instance turns Running.
    pub observes_to_boot: u32,
    pub client_token: String,
    /// Observes left that a started instance still reports `Stopped`.
    pub stopped_for: u32,
    /// The create's long-running operation fails with this error when the instance would
    /// have booted ([`FakeProvider::refuse_late`]).
    pub refused_with: Option<ProviderError>,
    /// When a Pending instance turns Running at the earliest (on tokio's clock), with
    /// [`FakeProvider::with_boot_time`]; its observes to boot count as well.
    pub boots_at: Option<tokio::time::Instant>,
    /// When a deleted instance is gone (on tokio's clock), with
    /// [`FakeProvider::with_termination_time`]; until then it is `Terminating`.
    pub gone_at: Option<tokio::time::Instant>,
}

struct Fault {
    op: Op,
    /// Only calls concerning this offer id (create/prepare) or region (others); `None`: any.
    scope: Option<String>,
    error: ProviderError,
    remaining: u32,
}

#[derive(Default)]
struct Inner {
    offers: Vec<Offer>,
    instances: BTreeMap<String, FakeInstance>,
    next_id: u64,
    faults: Vec<Fault>,
    calls: Vec<(Op, String)>,
    call_times: Vec<(Op, std::time::Instant)>,
    boot_observes: u32,
    vanish_on_boot: bool,
    /// Observes that do not list a new instance yet (eventually consistent list APIs).
    list_lag: u32,
    /// Seeded random transient faults: probability per call, and the generator.
    transient_rate: f64,
    rng: Option<rand::rngs::StdRng>,
    /// Random transient faults injected so far.
    transient_injected: u32,
    /// The most live instances one VM name ever had at once.
    peak_per_vm: usize,
    /// Idempotency tokens of deleted instances, answered with the dead id as EC2 does
    /// ([`FakeProvider::with_remembered_tokens`]).
    remember_tokens: bool,
    dead_tokens: BTreeMap<String, String>,
    /// Per-VM side resources that `prepare` made, by (vm name, cloud/region), removed by
    /// `cleanup` ([`FakeProvider::side_resources`]).
    side: std::collections::BTreeSet<(String, String)>,
    /// A delete of an instance not listed yet is answered "not found" (success) without
    /// deleting it ([`FakeProvider::with_delete_lag`]).
    delete_lag: bool,
    /// `cleanup` fails with `InUse` while an instance of the VM exists in the region.
    dependency_errors: bool,
    /// Creates accepted and then refused late, per offer id ([`FakeProvider::refuse_late`]).
    late_refusals: Vec<(String, ProviderError)>,
    /// Booting instances turn `Failed(reason)` instead of `Running`.
    boot_failure: Option<String>,
    /// Observes a started instance still reports `Stopped` before it is `Pending`.
    start_lag: u32,
    /// The account's SSH keys as (id, name, value) when the fake shares a project key
    /// ([`FakeProvider::with_shared_key`]); `None`: it declares no shared object.
    shared_keys: Option<Vec<(String, String, String)>>,
    /// Key registrations the fake accepted, and deletions it made.
    shared_creates: u32,
    shared_deletes: u32,
    /// Bytes of every `observe`, `observe_location` and `list` answer, as JSON.
    answered_bytes: u64,
    /// How long a new instance boots ([`FakeProvider::with_boot_time`]).
    boot_time: Option<Duration>,
    /// How long a deleted instance terminates ([`FakeProvider::with_termination_time`]).
    termination_time: Option<Duration>,
    /// When each request arrived, by class ([`FakeProvider::request_times`]).
    request_times: Vec<(EndpointClass, tokio::time::Instant)>,
}

impl Inner {
    fn note_peak(&mut self, vm_name: &str) {
        let live = self
            .instances
            .values()
            .filter(|i| i.vm_name == vm_name)
            .count();
        self.peak_per_vm = self.peak_per_vm.max(live);
    }
}

/// Marks one call in flight until dropped.
struct InFlight<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The scripted provider. Construct with [`FakeProvider::new`] and the `with_*` builders.
pub struct FakeProvider {
    /// The name and the scripted capabilities; the offers' order is always the script's
    /// (`keeps_offer_order`), since tests script the preference.
    adapter: Adapter,
    inner: Mutex<Inner>,
    /// Simulated API latency of every call.
    latency: Duration,
    in_flight: std::sync::atomic::AtomicUsize,
    max_in_flight: std::sync::atomic::AtomicUsize,
}

impl FakeProvider {
    /// A fake cloud named `name` (it answers to that cloud name in configs) with fast
    /// timings: 1 ms polls, 2 s boot and SSH timeouts.
    pub fn new(name: &'static str) -> Self {
        let caps = Capabilities {
            supported: vec![],
            boot_timeout: Duration::from_secs(2),
            ssh_timeout: Duration::from_secs(2),
            delete_timeout: Duration::from_secs(2),
            poll_interval: Duration::from_millis(1),
            max_concurrency: 64,
            min_create_interval: Duration::ZERO,
            rate_limits: Vec::new(),
            create_list_lag: Duration::from_millis(20),
            default_regions: Vec::new(),
            keeps_offer_order: true,
        };
        FakeProvider {
            adapter: Adapter::new(name, None, caps),
            inner: Mutex::new(Inner {
                boot_observes: 1,
                ..Inner::default()
            }),
            latency: Duration::ZERO,
            in_flight: Default::default(),
            max_in_flight: Default::default(),
        }
    }

    /// Declares one shared object, the project key per account (`ssh_key`, as
    /// DigitalOcean): found by value, created under `gpuprov-key`, a second registration
    /// of the same value refused with `Exists`. `user_key`: a key of that value the
    /// user registered before, under their own name (used, never deleted).
    pub fn with_shared_key(self, user_key: Option<&str>) -> Self {
        self.lock().shared_keys = Some(
            user_key
                .map(|v| ("user-1".to_string(), "my-laptop".to_string(), v.to_string()))
                .into_iter()
                .collect(),
        );
        self
    }

    /// The shared keys on the fake account, as (id, name, value).
    pub fn shared_keys(&self) -> Vec<(String, String, String)> {
        self.lock().shared_keys.clone().unwrap_or_default()
    }

    /// (key registrations accepted, key deletions made) so far.
    pub fn shared_counts(&self) -> (u32, u32) {
        let g = self.lock();
        (g.shared_creates, g.shared_deletes)
    }

    /// Every call takes `latency` (simulated API round trip).
    pub fn with_latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// The most calls that were in flight at once.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Bytes of every observe and list answer so far, as JSON (what a REST cloud would
    /// have sent).
    pub fn answered_bytes(&self) -> u64 {
        self.lock().answered_bytes
    }

    /// When each call of `op` started, in order.
    pub fn call_times(&self, op: Op) -> Vec<std::time::Instant> {
        self.lock()
            .call_times
            .iter()
            .filter(|(o, _)| *o == op)
            .map(|(_, t)| *t)
            .collect()
    }

    /// The tokio instants at which the fake cloud received each request, by endpoint
    /// class (after the core's gate admitted it), in order.
    pub fn request_times(&self) -> Vec<(EndpointClass, tokio::time::Instant)> {
        self.lock().request_times.clone()
    }

    /// The requests the fake cloud received that broke one of its declared
    /// `rate_limits` (each request counted once per limit it broke), measured from
    /// [`Self::request_times`] with [`rate::violations`], independently of the core's
    /// limiter.
    pub fn rate_violations(&self) -> usize {
        let times = self.request_times();
        let Some(first) = times.first().map(|t| t.1) else {
            return 0;
        };
        self.adapter
            .capabilities
            .rate_limits
            .iter()
            .map(|l| {
                let seen: Vec<f64> = times
                    .iter()
                    .filter(|(c, _)| l.covers(*c))
                    .map(|(_, t)| t.duration_since(first).as_secs_f64())
                    .collect();
                rate::violations(&seen, l)
            })
            .sum()
    }

    /// Simulates one API request of `class` (admitted by the core's gate, then the round
    /// trip) and tracks concurrency; the guard ends the call.
    async fn round_trip(&self, class: EndpointClass) -> InFlight<'_> {
        use std::sync::atomic::Ordering::SeqCst;
        self.adapter.gate().admit(class).await;
        self.lock()
            .request_times
            .push((class, tokio::time::Instant::now()));
        let now = self.in_flight.fetch_add(1, SeqCst) + 1;
        self.max_in_flight.fetch_max(now, SeqCst);
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        InFlight(&self.in_flight)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("fake provider mutex")
    }

    /// Adds an offer `id` of `instance_type` in `region` at `price` USD per hour.
    pub fn with_offer(self, id: &str, region: &str, instance_type: &str, price: f64) -> Self {
        self.lock().offers.push(Offer {
            id: id.into(),
            location: Location {
                cloud: self.adapter.name().into(),
                region: region.into(),
                zone: None,
            },
            instance_type: instance_type.into(),
            gpu: Some("H100".into()),
            gpu_count: 1,
            spot: false,
            price_per_hour: price,
            detail: serde_json::Value::Null,
            facts: Default::default(),
        });
        self
    }

    /// Makes the next `times` calls of `op` (concerning offer id or region `scope`, or any
    /// when `None`) fail with `error`. `u32::MAX` means always.
    pub fn with_fault(self, op: Op, scope: Option<&str>, error: ProviderError, times: u32) -> Self {
        self.fault(op, scope, error, times);
        self
    }

    /// Like [`with_fault`](Self::with_fault) on a shared provider.
    pub fn fault(&self, op: Op, scope: Option<&str>, error: ProviderError, times: u32) {
        self.lock().faults.push(Fault {
            op,
            scope: scope.map(str::to_string),
            error,
            remaining: times,
        });
    }

    /// Makes every call fail with a transient error with probability `rate` (0..=1),
    /// drawn from a generator seeded with `seed` so a failing run can be replayed.
    pub fn with_transient_rate(self, rate: f64, seed: u64) -> Self {
        use rand::SeedableRng as _;
        {
            let mut g = self.lock();
            g.transient_rate = rate;
            g.rng = Some(rand::rngs::StdRng::seed_from_u64(seed));
        }
        self
    }

    /// How many random transient faults ([`with_transient_rate`](Self::with_transient_rate))
    /// were injected so far.
    pub fn transient_injected(&self) -> u32 {
        self.lock().transient_injected
    }

    /// The most live instances any one VM name had at the same time (a duplicate shows
    /// as 2 or more).
    pub fn peak_instances_per_vm(&self) -> usize {
        self.lock().peak_per_vm
    }

    /// Removes every scripted fault.
    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    /// Instances turn Running after `n` observes (default 1).
    /// A new instance stays Pending for `d` after its create (tokio's clock, so a paused
    /// test clock gives exact figures), besides its observes to boot (set those to 1 for
    /// a boot by time alone).
    pub fn with_boot_time(self, d: Duration) -> Self {
        self.lock().boot_time = Some(d);
        self
    }

    /// A deleted instance is listed `Terminating` for `d` (tokio's clock) before it is
    /// gone.
    pub fn with_termination_time(self, d: Duration) -> Self {
        self.lock().termination_time = Some(d);
        self
    }

    pub fn with_boot_observes(self, n: u32) -> Self {
        self.lock().boot_observes = n;
        self
    }

    /// A new instance is missing from the next `n` observes (clouds whose list API lags
    /// behind create).
    pub fn with_list_lag(self, n: u32) -> Self {
        self.lock().list_lag = n;
        self
    }

    /// Remembers the idempotency token of every deleted instance and answers a create
    /// that re-sends one with the dead instance's id, as EC2 does (moto does not).
    pub fn with_remembered_tokens(self) -> Self {
        self.lock().remember_tokens = true;
        self
    }

    /// Ids invisible to delete while they are invisible to observe: a delete of an
    /// instance not listed yet answers "not found" (success) and deletes nothing.
    pub fn with_delete_lag(self) -> Self {
        self.lock().delete_lag = true;
        self
    }

    /// `cleanup` answers `InUse` while any instance of the VM exists in the region (a
    /// security group still attached), listed or not.
    pub fn with_dependency_errors(self) -> Self {
        self.lock().dependency_errors = true;
        self
    }

    /// The per-VM side resources `prepare` created and `cleanup` has not removed, as
    /// `(vm name, "cloud/region")`.
    pub fn side_resources(&self) -> Vec<(String, String)> {
        self.lock().side.iter().cloned().collect()
    }

    /// A started instance keeps reporting `Stopped` for `n` observes (DigitalOcean shows
    /// `off` until its power_on action completes).
    pub fn with_start_lag(self, n: u32) -> Self {
        self.lock().start_lag = n;
        self
    }

    /// From now on, instances that finish booting report `Failed(reason)` instead of
    /// `Running` (`None`: they boot normally again).
    pub fn fail_boots(&self, reason: Option<&str>) {
        self.lock().boot_failure = reason.map(str::to_string);
    }

    /// The next create on offer `offer_id` is accepted (an id is returned) but its
    /// long-running operation then fails with `error`: `observe` lists the attempt as
    /// [`InstanceStatus::Refused`] once it would have booted (GCP's late
    /// `ZONE_RESOURCE_POOL_EXHAUSTED`).
    pub fn refuse_late(&self, offer_id: &str, error: ProviderError) {
        self.lock()
            .late_refusals
            .push((offer_id.to_string(), error));
    }

    /// Stops instance `id` (as a user, the vendor or a spot reclaim that stops would).
    pub fn stop_instance(&self, id: &str) {
        if let Some(i) = self.lock().instances.get_mut(id) {
            i.status = InstanceStatus::Stopped;
        }
    }

    /// Preempts instance `id` as a spot reclaim would: `stopped` keeps it (stopped, its
    /// disk kept; GCP, an EC2 spot with the `stop` behaviour), otherwise the cloud
    /// terminated it and lists it as preempted (EC2 lists terminated instances for about
    /// an hour) until it is deleted. `observe` reports it [`InstanceStatus::Preempted`].
    pub fn preempt_instance(&self, id: &str, stopped: bool) {
        if let Some(i) = self.lock().instances.get_mut(id) {
            i.status = InstanceStatus::Preempted {
                signal: "spot capacity reclaimed (fake)".into(),
                stopped,
            };
        }
    }

    /// Removes instance `id` outside gpuprov (terminated in the console, spot
    /// interruption); its token is remembered like any deleted instance's.
    pub fn terminate_instance(&self, id: &str) {
        let mut g = self.lock();
        if let Some(i) = g.instances.remove(id) {
            if g.remember_tokens && !i.client_token.is_empty() {
                g.dead_tokens.insert(i.client_token, i.id);
            }
        }
    }

    /// Instances disappear on their first observe (a cloud that reclaims them).
    pub fn with_vanish_on_boot(self) -> Self {
        self.lock().vanish_on_boot = true;
        self
    }

    /// The fake's default (fast) capabilities, to override field by field in tests.
    pub fn capabilities_for_test(&self) -> Capabilities {
        self.adapter.capabilities.clone()
    }

    /// Replaces the scripted capabilities (the offer order stays the script's).
    pub fn with_capabilities(mut self, caps: Capabilities) -> Self {
        self.adapter.capabilities = Capabilities {
            keeps_offer_order: true,
            ..caps
        };
        self
    }

    /// Every live instance, by id.
    pub fn instances(&self) -> Vec<FakeInstance> {
        self.lock().instances.values().cloned().collect()
    }

    /// How many calls of `op` were made.
    pub fn count(&self, op: Op) -> usize {
        self.lock().calls.iter().filter(|(o, _)| *o == op).count()
    }

    /// Every call as `(op, detail)`, in order.
    pub fn calls(&self) -> Vec<(Op, String)> {
        self.lock().calls.clone()
    }

    /// Puts an instance in the cloud directly (one a crashed run created).
    pub fn insert_instance(
        &self,
        vm_name: &str,
        location: Location,
        status: InstanceStatus,
    ) -> String {
        self.insert_instance_of(vm_name, "", location, status)
    }

    /// Puts an instance carrying `lineage` in the cloud directly (one another state, or a
    /// lost one, created).
    pub fn insert_instance_of(
        &self,
        vm_name: &str,
        lineage: &str,
        location: Location,
        status: InstanceStatus,
    ) -> String {
        let mut g = self.lock();
        g.next_id += 1;
        let id = format!("{}-i-{}", self.adapter.name(), g.next_id);
        g.instances.insert(
            id.clone(),
            FakeInstance {
                unlisted_for: 0,
                id: id.clone(),
                vm_name: vm_name.into(),
                lineage: lineage.into(),
                location,
                status,
                observes_to_boot: 0,
                client_token: String::new(),
                stopped_for: 0,
                refused_with: None,
                boots_at: None,
                gone_at: None,
            },
        );
        g.note_peak(vm_name);
        id
    }

    fn check(&self, g: &mut Inner, op: Op, scope: &str, detail: String) -> Result<()> {
        g.calls.push((op, detail));
        g.call_times.push((op, std::time::Instant::now()));
        for f in g.faults.iter_mut() {
            if f.op == op && f.remaining > 0 && f.scope.as_deref().is_none_or(|s| s == scope) {
                if f.remaining != u32::MAX {
                    f.remaining -= 1;
                }
                return Err(f.error.clone());
            }
        }
        if g.transient_rate > 0.0 {
            use rand::Rng as _;
            let rate = g.transient_rate;
            if let Some(rng) = g.rng.as_mut() {
                if rng.gen_bool(rate.clamp(0.0, 1.0)) {
                    g.transient_injected += 1;
                    return Err(ProviderError::transient(format!(
                        "injected transient fault in {op:?}"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// What `observe` answers at `at` for `only` (or for every VM there), advancing each
/// answered instance's list lag and boot once, as one call to the cloud would.
fn observe_at(g: &mut Inner, at: &Location, only: Option<&str>) -> Observations {
    let vanish = g.vanish_on_boot;
    let boot_failure = g.boot_failure.clone();
    let mut out = Observations::new();
    let mut gone = Vec::new();
    for i in g.instances.values_mut() {
        if only.is_some_and(|vm| i.vm_name != vm) || i.location != *at {
            continue;
        }
        let entries = out.entry(i.vm_name.clone()).or_default();
        if i.gone_at.is_some_and(|t| tokio::time::Instant::now() >= t) {
            gone.push(i.id.clone());
            continue;
        }
        if i.unlisted_for > 0 {
            i.unlisted_for -= 1;
            continue;
        }
        if i.stopped_for > 0 {
            i.stopped_for -= 1;
            entries.push(Observed {
                instance_id: i.id.clone(),
                status: InstanceStatus::Stopped,
                ssh: None,
            });
            continue;
        }
        if i.status == InstanceStatus::Pending {
            if vanish {
                gone.push(i.id.clone());
                continue;
            }
            // Still booting by the clock: Pending whatever the observes say.
            let booting = i.boots_at.is_some_and(|t| tokio::time::Instant::now() < t);
            if !booting {
                if i.observes_to_boot <= 1 {
                    i.status = match (&i.refused_with, &boot_failure) {
                        (Some(e), _) => InstanceStatus::Refused(Box::new(e.clone())),
                        (None, Some(r)) => InstanceStatus::Failed(r.clone()),
                        (None, None) => InstanceStatus::Running,
                    };
                } else {
                    i.observes_to_boot -= 1;
                }
            }
        }
        let ssh = (i.status == InstanceStatus::Running).then(|| SshEndpoint {
            host: "127.0.0.1".into(),
            port: 22,
            user: Some("ubuntu".into()),
        });
        entries.push(Observed {
            instance_id: i.id.clone(),
            status: i.status.clone(),
            ssh,
        });
    }
    for id in gone {
        g.instances.remove(&id);
    }
    out
}

/// The size of an answer as JSON, the way a REST cloud would send it.
fn answer_bytes<T: serde::Serialize>(answer: &T) -> u64 {
    serde_json::to_vec(answer).map_or(0, |v| v.len() as u64)
}

#[async_trait]
impl CloudProvider for FakeProvider {
    /// The scripted name and capabilities; no endpoint, no credential.
    fn adapter(&self) -> &Adapter {
        &self.adapter
    }

    fn shared_objects(&self, offer: &Offer) -> Vec<crate::provider::SharedObject> {
        if self.lock().shared_keys.is_none() {
            return Vec::new();
        }
        vec![crate::provider::SharedObject {
            cloud: offer.location.cloud.clone(),
            kind: "ssh_key".into(),
            region: None,
        }]
    }

    async fn observe_shared(
        &self,
        _obj: &crate::provider::SharedObject,
        public_key: &str,
    ) -> Result<Option<crate::provider::SharedFound>> {
        // Listing the account's keys, the request DigitalOcean limits apart.
        let _call = self.round_trip(EndpointClass::KeyListing).await;
        let want = crate::provider::kit::keys::key_value(public_key);
        Ok(self.shared_keys().into_iter().find_map(|(id, name, v)| {
            (crate::provider::kit::keys::key_value(&v) == want).then(|| {
                crate::provider::SharedFound {
                    ours: name == "gpuprov-key",
                    id,
                    name,
                }
            })
        }))
    }

    async fn create_shared(
        &self,
        _obj: &crate::provider::SharedObject,
        public_key: &str,
    ) -> Result<crate::provider::SharedFound> {
        let _call = self.round_trip(EndpointClass::Other).await;
        let mut g = self.lock();
        let want = crate::provider::kit::keys::key_value(public_key);
        let keys = g.shared_keys.get_or_insert_with(Vec::new);
        if keys
            .iter()
            .any(|(_, _, v)| crate::provider::kit::keys::key_value(v) == want)
        {
            return Err(ProviderError::new(
                ErrorKind::Exists,
                "fake: SSH key is already in use",
            ));
        }
        let id = format!("key-{}", keys.len() + 1);
        keys.push((id.clone(), "gpuprov-key".into(), public_key.to_string()));
        g.shared_creates += 1;
        Ok(crate::provider::SharedFound {
            id,
            name: "gpuprov-key".into(),
            ours: true,
        })
    }

    async fn delete_shared(
        &self,
        _obj: &crate::provider::SharedObject,
        found: &crate::provider::SharedFound,
    ) -> Result<()> {
        let _call = self.round_trip(EndpointClass::Other).await;
        let mut g = self.lock();
        let before = g.shared_keys.as_ref().map_or(0, Vec::len);
        if let Some(keys) = g.shared_keys.as_mut() {
            keys.retain(|(id, _, _)| *id != found.id);
        }
        if g.shared_keys.as_ref().map_or(0, Vec::len) < before {
            g.shared_deletes += 1;
        }
        Ok(())
    }

    async fn plan(&self, req: &ResourceRequest) -> Result<Vec<Offer>> {
        let _call = self.round_trip(EndpointClass::Read).await;
        let mut g = self.lock();
        self.check(&mut g, Op::Plan, "", req.vm_name.clone())?;
        Ok(g.offers
            .iter()
            .filter(|o| req.regions.is_empty() || req.regions.contains(&o.location.region))
            .cloned()
            .collect())
    }

    async fn prepare(&self, offer: &Offer, spec: &InstanceSpec) -> Result<serde_json::Value> {
        // As the adapters that declare the key: only the core supplies it.
        if self.lock().shared_keys.is_some() {
            crate::provider::kit::keys::prepared_key(self.name(), spec)?;
        }
        let _call = self.round_trip(EndpointClass::Other).await;
        let mut g = self.lock();
        let checked = self.check(
            &mut g,
            Op::Prepare,
            &offer.id,
            format!("{} {}", spec.vm_name, offer.id),
        );
        // The side resource exists before anything but "not offered here" can fail (a
        // prepare that fails after creating a security group); `Unavailable` means,
        // by contract, that nothing was created.
        if !matches!(&checked, Err(e) if e.kind == ErrorKind::Unavailable) {
            g.side
                .insert((spec.vm_name.clone(), region_key(&offer.location)));
        }
        checked?;
        Ok(serde_json::json!({ "offer": offer.id }))
    }

    async fn create(
        &self,
        offer: &Offer,
        _prepared: &serde_json::Value,
        spec: &InstanceSpec,
    ) -> Result<String> {
        let _call = self.round_trip(EndpointClass::Launch).await;
        let mut g = self.lock();
        self.check(
            &mut g,
            Op::Create,
            &offer.id,
            format!("{} {}", spec.vm_name, offer.id),
        )?;
        // Idempotency token: a repeated create returns the existing instance, or (EC2)
        // the dead one that used it.
        if let Some(dead) = g.dead_tokens.get(&spec.client_token) {
            return Ok(dead.clone());
        }
        if let Some(i) = g
            .instances
            .values()
            .find(|i| i.client_token == spec.client_token)
        {
            return Ok(i.id.clone());
        }
        g.next_id += 1;
        let id = format!("{}-i-{}", self.adapter.name(), g.next_id);
        let boot = g.boot_observes;
        let lag = g.list_lag;
        let boots_at = g.boot_time.map(|d| tokio::time::Instant::now() + d);
        let refused_with = g
            .late_refusals
            .iter()
            .position(|(o, _)| *o == offer.id)
            .map(|i| g.late_refusals.remove(i).1);
        g.instances.insert(
            id.clone(),
            FakeInstance {
                unlisted_for: lag,
                id: id.clone(),
                vm_name: spec.vm_name.clone(),
                lineage: spec.lineage.clone(),
                location: offer.location.clone(),
                status: InstanceStatus::Pending,
                observes_to_boot: boot,
                client_token: spec.client_token.clone(),
                stopped_for: 0,
                refused_with,
                boots_at,
                gone_at: None,
            },
        );
        g.note_peak(&spec.vm_name);
        Ok(id)
    }

    /// The listing `observe` (`only_vm`: recorded as one `Op::Observe` with detail
    /// `<vm> <at>`) or `observe_location` (detail `* <at>`) answers from, as one call:
    /// boots and list lags advance once. Each entry shows its VM as the identity label
    /// and its lineage, where it has one, as the lineage label. The scripted answers of
    /// `observe`, `observe_location` and `list` stay the fake's own (an instance put in
    /// without a lineage is still its VM's there).
    async fn instances(&self, at: &Location, only_vm: Option<&str>) -> Result<Vec<Seen>> {
        let _call = self.round_trip(EndpointClass::Read).await;
        let mut g = self.lock();
        let detail = match only_vm {
            Some(vm) => format!("{vm} {at}"),
            None => format!("* {at}"),
        };
        self.check(&mut g, Op::Observe, &at.region, detail)?;
        let all = observe_at(&mut g, at, only_vm);
        g.answered_bytes += answer_bytes(&all);
        let mut out = Vec::new();
        for (vm, entries) in all {
            for o in entries {
                let lineage = g.instances.get(&o.instance_id).map(|i| i.lineage.as_str());
                let shown = Shown::labels(Some(&vm), lineage.filter(|l| !l.is_empty()));
                out.push(Seen {
                    ssh: o.ssh,
                    ..Seen::new(o.instance_id, o.status, shown)
                });
            }
        }
        Ok(out)
    }

    async fn observe(&self, at: &Location, vm_name: &str) -> Result<Vec<Observed>> {
        let _call = self.round_trip(EndpointClass::Read).await;
        let mut g = self.lock();
        self.check(&mut g, Op::Observe, &at.region, format!("{vm_name} {at}"))?;
        let out = observe_at(&mut g, at, Some(vm_name))
            .remove(vm_name)
            .unwrap_or_default();
        g.answered_bytes += answer_bytes(&out);
        Ok(out)
    }

    /// Every VM at `at` as `observe` would answer for each, from one call (recorded as one
    /// `Op::Observe` with detail `* <at>`); boots and list lags advance once per listing.
    async fn observe_location(&self, at: &Location) -> Result<Option<Observations>> {
        let _call = self.round_trip(EndpointClass::Read).await;
        let mut g = self.lock();
        self.check(&mut g, Op::Observe, &at.region, format!("* {at}"))?;
        let out = observe_at(&mut g, at, None);
        g.answered_bytes += answer_bytes(&out);
        Ok(Some(out))
    }

    /// The listed instances at `at` with a lineage, as they are now (a listing does not
    /// advance boots the way `observe` does).
    async fn list(&self, at: &Location) -> Result<Vec<crate::provider::Listed>> {
        let _call = self.round_trip(EndpointClass::Read).await;
        let mut g = self.lock();
        self.check(&mut g, Op::Observe, &at.region, format!("list {at}"))?;
        let mut out: Vec<crate::provider::Listed> = g
            .instances
            .values()
            .filter(|i| i.unlisted_for == 0 && !i.lineage.is_empty())
            // Terminated instances are not listed (the contract), preempted ones included.
            .filter(|i| !matches!(i.status, InstanceStatus::Preempted { stopped: false, .. }))
            .filter(|i| {
                i.location.cloud == at.cloud
                    && i.location.region == at.region
                    && (at.zone.is_none() || i.location.zone == at.zone)
            })
            .map(|i| crate::provider::Listed {
                vm_name: i.vm_name.clone(),
                lineage: i.lineage.clone(),
                observed: Observed {
                    instance_id: i.id.clone(),
                    status: i.status.clone(),
                    ssh: (i.status == InstanceStatus::Running).then(|| SshEndpoint {
                        host: "127.0.0.1".into(),
                        port: 22,
                        user: Some("ubuntu".into()),
                    }),
                },
                instance_type: None,
                created_at: None,
                price_per_hour: None,
                zone: i.location.zone.clone(),
            })
            .collect();
        out.sort_by(|a, b| a.observed.instance_id.cmp(&b.observed.instance_id));
        g.answered_bytes += answer_bytes(&out);
        Ok(out)
    }

    async fn delete(&self, at: &Location, vm_name: &str, instance_ids: &[String]) -> Result<()> {
        let _call = self.round_trip(EndpointClass::Other).await;
        let mut g = self.lock();
        self.check(
            &mut g,
            Op::Delete,
            &at.region,
            format!("{vm_name} {}", instance_ids.join(",")),
        )?;
        for id in instance_ids {
            if g.delete_lag && g.instances.get(id).is_some_and(|i| i.unlisted_for > 0) {
                continue;
            }
            if let Some(d) = g.termination_time {
                let at = tokio::time::Instant::now() + d;
                if let Some(i) = g.instances.get_mut(id) {
                    i.status = InstanceStatus::Terminating;
                    i.gone_at.get_or_insert(at);
                }
                continue;
            }
            if let Some(i) = g.instances.remove(id) {
                if g.remember_tokens && !i.client_token.is_empty() {
                    g.dead_tokens.insert(i.client_token, i.id);
                }
            }
        }
        Ok(())
    }

    async fn cleanup(&self, at: &Location, vm_name: &str) -> Result<()> {
        let _call = self.round_trip(EndpointClass::Other).await;
        let mut g = self.lock();
        self.check(&mut g, Op::Cleanup, &at.region, vm_name.to_string())?;
        if g.dependency_errors
            && g.instances
                .values()
                .any(|i| i.vm_name == vm_name && region_key(&i.location) == region_key(at))
        {
            return Err(ProviderError::new(
                ErrorKind::InUse,
                format!("side resource of {vm_name} is still in use"),
            ));
        }
        g.side.remove(&(vm_name.to_string(), region_key(at)));
        Ok(())
    }

    async fn start(&self, at: &Location, vm_name: &str, instance_id: &str) -> Result<()> {
        let _call = self.round_trip(EndpointClass::Other).await;
        let mut g = self.lock();
        self.check(
            &mut g,
            Op::Start,
            &at.region,
            format!("{vm_name} {instance_id}"),
        )?;
        let boot = g.boot_observes;
        let lag = g.start_lag;
        match g.instances.get_mut(instance_id) {
            Some(i) if i.status == InstanceStatus::Stopped => {
                i.status = InstanceStatus::Pending;
                i.observes_to_boot = boot;
                i.stopped_for = lag;
                Ok(())
            }
            Some(_) => Ok(()),
            None => Err(ProviderError::new(
                ErrorKind::Failed,
                format!("instance {instance_id} not found"),
            )),
        }
    }

    /// Gives instance `id` at `at` VM name `vm` (and the adapter's lineage, when it was
    /// built with one), as a cloud that labels would; the fake keeps no call log of it.
    /// Errors: `InvalidRequest` when `id` names no instance at `at`, or one of another VM.
    async fn import(&self, at: &Location, vm: &str, id: &str) -> Result<crate::provider::Imported> {
        let _call = self.round_trip(EndpointClass::Other).await;
        let lineage = self.adapter.lineage().map(|l| l.to_string()).ok();
        let mut g = self.lock();
        let invalid = |why: String| Err(ProviderError::new(ErrorKind::InvalidRequest, why));
        let Some(i) = g.instances.get_mut(id).filter(|i| i.location == *at) else {
            return invalid(format!("no instance {id} at {at}"));
        };
        if !i.vm_name.is_empty() && i.vm_name != vm {
            return invalid(format!("instance {id} belongs to VM {}", i.vm_name));
        }
        i.vm_name = vm.to_string();
        if let Some(l) = lineage {
            i.lineage = l;
        }
        let observed = Observed {
            instance_id: i.id.clone(),
            status: i.status.clone(),
            ssh: None,
        };
        Ok(crate::provider::Imported {
            observed,
            identity: format!("labelled {vm}"),
        })
    }

    /// A `Failed` instance's reason as an `Error` finding; nothing for any other (a gone
    /// instance included).
    async fn diagnose(
        &self,
        _at: &Location,
        _vm: &str,
        id: &str,
    ) -> Result<Vec<crate::provider::Finding>> {
        let _call = self.round_trip(EndpointClass::Read).await;
        Ok(match self.lock().instances.get(id).map(|i| &i.status) {
            Some(InstanceStatus::Failed(why)) => {
                vec![crate::provider::Finding::new(
                    crate::provider::Severity::Error,
                    why.clone(),
                )]
            }
            _ => Vec::new(),
        })
    }
}

/// `cloud/region`, the scope of per-VM side resources (zones share them).
fn region_key(l: &Location) -> String {
    format!("{}/{}", l.cloud, l.region)
}

/// A scripted SSH connector: answers with a fixed host key, after failing a chosen number
/// of times.
pub struct FakeConnector {
    pub host_key: Mutex<crate::ssh::HostKey>,
    failures: Mutex<Vec<crate::ssh::SshError>>,
    logins: Mutex<u32>,
}

impl Default for FakeConnector {
    fn default() -> Self {
        FakeConnector {
            host_key: Mutex::new(crate::ssh::HostKey {
                algorithm: "ssh-ed25519".into(),
                key_base64: "AAAAC3NzaC1lZDI1NTE5AAAAIFakeHostKeyForTestsOnly".into(),
                fingerprint: "SHA256:fake".into(),
            }),
            failures: Mutex::new(vec![]),
            logins: Mutex::new(0),
        }
    }
}

impl FakeConnector {
    /// Makes the next logins fail with these errors, in order.
    pub fn fail_with(&self, errors: Vec<crate::ssh::SshError>) {
        let mut f = self.failures.lock().expect("mutex");
        *f = errors.into_iter().rev().collect();
    }
    /// Successful logins so far.
    pub fn logins(&self) -> u32 {
        *self.logins.lock().expect("mutex")
    }
}

#[async_trait]
impl crate::ssh::Connector for FakeConnector {
    async fn login(
        &self,
        endpoint: &SshEndpoint,
        _user: &str,
        pinned: Option<&crate::ssh::HostKey>,
    ) -> Result<crate::ssh::HostKey, crate::ssh::SshError> {
        if let Some(e) = self.failures.lock().expect("mutex").pop() {
            return Err(e);
        }
        let key = self.host_key.lock().expect("mutex").clone();
        if let Some(p) = pinned {
            if p.fingerprint != key.fingerprint {
                return Err(crate::ssh::SshError::HostKeyMismatch {
                    endpoint: endpoint.to_string(),
                    expected: p.fingerprint.clone(),
                    got: key.fingerprint,
                });
            }
        }
        *self.logins.lock().expect("mutex") += 1;
        Ok(key)
    }
}
