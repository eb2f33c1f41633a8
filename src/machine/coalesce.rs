//! Shared reads (issue 20): what many machines ask a cloud is asked once, so a fleet's
//! read calls grow with its locations and asks, not its machines.
//!
//! **Catalogs.** `plan` answers are shared between machines with the same ask (regions,
//! zones, GPU, count, spot; the VM name and price cap are not sent to the catalog's
//! answer: the price cap is the core's filter) for [`CATALOG_TTL`]: one command reads each
//! cloud's catalog once per ask. A `prepare` or `create` the cloud refused for capacity,
//! quota or availability drops the cloud's shared answers (they told of stock that is
//! not there), so a launch that fails over or waits out a shortage ("retrying until up")
//! reads the catalog afresh. What depends on the machine itself is checked
//! per machine without a call ([`CloudProvider::check_request`]). An error is shared only
//! with the callers that waited for it.
//!
//! **Observation** (Kubernetes' informer idea at poll scale): the `observe` calls of every
//! machine waiting at one (cloud, location) are answered from one
//! [`CloudProvider::observe_location`] listing.
//!
//! The rule that keeps observe-before-act sound: a machine is never answered from a
//! listing that started before its own last side effect returned, nor from the listing it
//! was answered from last time. Every listing gets a sequence number when it starts; each
//! VM name keeps the lowest number it may still be served (`need`): a `create`, `delete`,
//! `start`, `import` or `cleanup` of that VM raises it past every listing started so far
//! when the call returns (also when it failed or was dropped: its answer may be lost while
//! the cloud acted), and each answer raises it past the listing that answered. So the
//! create-intent check after a lost create answer always reads a listing that started
//! after that create returned, and successive polls of one machine see successive
//! listings, as with per-machine calls. A new listing waits a moment (a twentieth of the
//! poll interval, at most 50 ms) before it starts, so that machines asking together (a
//! burst of creates returning at once) share it; it starts after all of their side
//! effects, so its number is given when it starts.
//!
//! A listing is shared with every caller that arrives while it is in flight, and, once it
//! answered, for at most the cloud's poll interval. An error is shared only with the
//! callers that waited for it. A cloud whose adapter cannot observe a whole location
//! (`observe_location` answers `None`) is observed per machine, as before.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::provider::{
    Capabilities, CloudProvider, ErrorKind, Imported, InstanceSpec, Listed, Location, Observations,
    Observed, Offer, ResourceRequest, Result,
};

/// The longest a new location listing waits for more machines to join it.
pub const MAX_GATHER: Duration = Duration::from_millis(50);

/// How long one catalog answer serves further machines with the same ask.
pub const CATALOG_TTL: Duration = Duration::from_secs(60);

/// One catalog answer: when it was asked, and the offers once in.
struct Catalog {
    asked: Instant,
    answer: OnceCell<Result<Vec<Offer>>>,
}

/// What of a [`ResourceRequest`] the catalog's answer depends on: everything but the VM
/// name (checked per machine) and the price cap (the core's filter).
fn catalog_key(req: &ResourceRequest) -> ResourceRequest {
    ResourceRequest {
        vm_name: String::new(),
        max_price_per_hour: None,
        ..req.clone()
    }
}

/// One location listing: its sequence number (0 while it gathers callers, set when the
/// call starts), when it was opened, and its answer once in.
struct Listing {
    seq: AtomicU64,
    started: Instant,
    answer: OnceCell<Result<Option<Observations>>>,
}

#[derive(Default)]
struct Book {
    /// Listings started so far (the last one's sequence number).
    started: u64,
    /// The latest listing per location.
    latest: HashMap<Location, Arc<Listing>>,
    /// Per VM name, the lowest listing sequence number it may be answered from.
    need: HashMap<String, u64>,
    /// The latest catalog answer per ask ([`catalog_key`], as JSON).
    catalogs: HashMap<String, Arc<Catalog>>,
}

impl Book {
    fn raise(&mut self, vm: &str, to: u64) {
        let n = self.need.entry(vm.to_string()).or_default();
        *n = (*n).max(to);
    }
}

/// An adapter whose `plan` answers and `observe` calls are shared between machines (see
/// the module docs). Every other call passes through; side effects mark their VM so its
/// next `observe` reads a listing that started after them.
pub struct SharedReads {
    inner: Arc<dyn CloudProvider>,
    /// How long an answered listing may serve new callers: the cloud's poll interval.
    max_age: Duration,
    /// How long a new listing waits for more callers before it starts: 1/20 of the poll
    /// interval, at most [`MAX_GATHER`].
    gather: Duration,
    /// The adapter answered `None` once: observe per machine from then on.
    per_machine: AtomicBool,
    book: Mutex<Book>,
}

/// Raises a VM's `need` past every listing started so far when dropped: after a side
/// effect returned, failed, or was abandoned mid-call.
struct SideEffect<'a> {
    shared: &'a SharedReads,
    vm: &'a str,
}

impl Drop for SideEffect<'_> {
    fn drop(&mut self) {
        let mut b = self.shared.book();
        let next = b.started + 1;
        b.raise(self.vm, next);
    }
}

impl SharedReads {
    /// Wraps `inner` (normally the [`Governed`](super::limits::Governed) adapter, so the
    /// shared listings stay within the cloud's declared limits).
    pub fn new(inner: Arc<dyn CloudProvider>) -> Self {
        let max_age = inner.capabilities().poll_interval;
        SharedReads {
            inner,
            max_age,
            gather: (max_age / 20).min(MAX_GATHER),
            per_machine: AtomicBool::new(false),
            book: Mutex::new(Book::default()),
        }
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        // The book holds no invariant a panicking holder could break halfway.
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops the shared catalog answers after a refusal that says they were wrong.
    fn stale_catalog<T>(&self, r: &Result<T>) {
        if let Err(e) = r {
            if matches!(
                e.kind,
                ErrorKind::Capacity | ErrorKind::Quota | ErrorKind::Unavailable
            ) {
                self.book().catalogs.clear();
            }
        }
    }

    fn side_effect<'a>(&'a self, vm: &'a str) -> SideEffect<'a> {
        SideEffect { shared: self, vm }
    }

    /// The listing that may answer `vm` at `at`: the latest one when it is recent enough
    /// for this VM, else a new one.
    fn listing_for(&self, at: &Location, vm: &str) -> Arc<Listing> {
        let mut b = self.book();
        let need = b.need.get(vm).copied().unwrap_or(0);
        if let Some(l) = b.latest.get(at) {
            let seq = l.seq.load(Ordering::SeqCst);
            // A listing still gathering starts after every side effect that returned.
            let usable = (seq == 0 || seq >= need)
                && match l.answer.get() {
                    None => true,
                    Some(Ok(_)) => l.started.elapsed() <= self.max_age,
                    Some(Err(_)) => false,
                };
            if usable {
                return l.clone();
            }
        }
        let l = Arc::new(Listing {
            seq: AtomicU64::new(0),
            started: Instant::now(),
            answer: OnceCell::new(),
        });
        b.latest.insert(at.clone(), l.clone());
        l
    }
}

#[async_trait]
impl CloudProvider for SharedReads {
    fn adapter(&self) -> &crate::provider::kit::Adapter {
        self.inner.adapter()
    }
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn endpoint_override(&self) -> Option<String> {
        self.inner.endpoint_override()
    }
    async fn credentials(&self) -> crate::provider::kit::CredentialReport {
        self.inner.credentials().await
    }
    fn check_request(&self, req: &ResourceRequest) -> Result<()> {
        self.inner.check_request(req)
    }
    async fn plan(&self, req: &ResourceRequest) -> Result<Vec<Offer>> {
        self.inner.check_request(req)?;
        let key = catalog_key(req);
        let catalog = {
            let mut b = self.book();
            let k = serde_json::to_string(&key).unwrap_or_default();
            match b.catalogs.get(&k) {
                Some(c)
                    if c.asked.elapsed() <= CATALOG_TTL
                        && !matches!(c.answer.get(), Some(Err(_))) =>
                {
                    c.clone()
                }
                _ => {
                    let c = Arc::new(Catalog {
                        asked: Instant::now(),
                        answer: OnceCell::new(),
                    });
                    b.catalogs.insert(k, c.clone());
                    c
                }
            }
        };
        // The first asker's request goes out (its VM name included: adapters may name
        // things after it in errors) without its price cap, which the core applies to
        // each machine's own: the answer holds for every machine with this ask.
        let unpriced = ResourceRequest {
            max_price_per_hour: None,
            ..req.clone()
        };
        catalog
            .answer
            .get_or_init(|| self.inner.plan(&unpriced))
            .await
            .clone()
    }
    async fn prepare(&self, offer: &Offer, spec: &InstanceSpec) -> Result<serde_json::Value> {
        let r = self.inner.prepare(offer, spec).await;
        self.stale_catalog(&r);
        r
    }
    async fn create(
        &self,
        offer: &Offer,
        prep: &serde_json::Value,
        spec: &InstanceSpec,
    ) -> Result<String> {
        let _mark = self.side_effect(&spec.vm_name);
        let r = self.inner.create(offer, prep, spec).await;
        self.stale_catalog(&r);
        r
    }
    async fn observe(&self, at: &Location, vm_name: &str) -> Result<Vec<Observed>> {
        if self.per_machine.load(Ordering::Relaxed) {
            return self.inner.observe(at, vm_name).await;
        }
        let listing = self.listing_for(at, vm_name);
        let answer = listing
            .answer
            .get_or_init(|| async {
                // Gather the machines that ask in the next moment (a burst of creates
                // returning together) into this one call.
                tokio::time::sleep(self.gather).await;
                {
                    let mut b = self.book();
                    b.started += 1;
                    listing.seq.store(b.started, Ordering::SeqCst);
                }
                self.inner.observe_location(at).await
            })
            .await;
        let seq = listing.seq.load(Ordering::SeqCst);
        self.book().raise(vm_name, seq + 1);
        match answer {
            Ok(Some(all)) => Ok(all.get(vm_name).cloned().unwrap_or_default()),
            Ok(None) => {
                self.per_machine.store(true, Ordering::Relaxed);
                self.inner.observe(at, vm_name).await
            }
            Err(e) => Err(e.clone()),
        }
    }
    async fn instances(
        &self,
        at: &Location,
        only_vm: Option<&str>,
    ) -> Result<Vec<crate::provider::Seen>> {
        self.inner.instances(at, only_vm).await
    }
    async fn observe_location(&self, at: &Location) -> Result<Option<Observations>> {
        self.inner.observe_location(at).await
    }
    async fn list(&self, at: &Location) -> Result<Vec<Listed>> {
        self.inner.list(at).await
    }
    async fn import(&self, at: &Location, vm_name: &str, id: &str) -> Result<Imported> {
        let _mark = self.side_effect(vm_name);
        self.inner.import(at, vm_name, id).await
    }
    async fn delete(&self, at: &Location, vm_name: &str, ids: &[String]) -> Result<()> {
        let _mark = self.side_effect(vm_name);
        self.inner.delete(at, vm_name, ids).await
    }
    async fn start(&self, at: &Location, vm_name: &str, id: &str) -> Result<()> {
        let _mark = self.side_effect(vm_name);
        self.inner.start(at, vm_name, id).await
    }
    async fn diagnose(
        &self,
        at: &Location,
        vm_name: &str,
        id: &str,
    ) -> Result<Vec<crate::provider::Finding>> {
        self.inner.diagnose(at, vm_name, id).await
    }
    async fn cleanup(&self, at: &Location, vm_name: &str) -> Result<()> {
        let _mark = self.side_effect(vm_name);
        self.inner.cleanup(at, vm_name).await
    }
    // Shared prerequisites have their own single-flight guard (`vm::shared`): forwarded.
    fn shared_objects(&self, offer: &Offer) -> Vec<crate::provider::SharedObject> {
        self.inner.shared_objects(offer)
    }
    async fn observe_shared(
        &self,
        obj: &crate::provider::SharedObject,
        public_key: &str,
    ) -> Result<Option<crate::provider::SharedFound>> {
        self.inner.observe_shared(obj, public_key).await
    }
    async fn create_shared(
        &self,
        obj: &crate::provider::SharedObject,
        public_key: &str,
    ) -> Result<crate::provider::SharedFound> {
        self.inner.create_shared(obj, public_key).await
    }
    async fn delete_shared(
        &self,
        obj: &crate::provider::SharedObject,
        found: &crate::provider::SharedFound,
    ) -> Result<()> {
        self.inner.delete_shared(obj, found).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::doubles::fake::{FakeProvider, Op};
    use crate::provider::{InstanceStatus, ProviderError};

    fn east() -> Location {
        Location {
            cloud: "aws".into(),
            region: "us-east-1".into(),
            zone: None,
        }
    }

    /// A fake cloud whose calls take 10 ms and whose poll interval is 10 s (the longest a
    /// listing may serve new callers).
    fn cloud() -> Arc<FakeProvider> {
        let f = FakeProvider::new("aws")
            .with_offer("east", "us-east-1", "p5.48xlarge", 98.0)
            .with_latency(Duration::from_millis(10));
        let mut caps = f.capabilities_for_test();
        caps.poll_interval = Duration::from_secs(10);
        Arc::new(f.with_capabilities(caps))
    }

    fn spec(vm: &str) -> InstanceSpec {
        InstanceSpec {
            vm_name: vm.into(),
            lineage: "0f0e0d0c-1111-4222-8333-444455556666".into(),
            client_token: format!("{vm}-1"),
            image: None,
            disk_gb: None,
            ports: vec![],
            ssh_public_key: "ssh-ed25519 AAAAtest".into(),
            boot_script: None,
            shared: Default::default(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn machines_observing_one_location_at_once_share_one_call() {
        let fake = cloud();
        for i in 0..20 {
            fake.insert_instance(&format!("m{i}"), east(), InstanceStatus::Running);
        }
        let shared = SharedReads::new(fake.clone());
        let seen = futures_util::future::join_all(
            (0..20).map(|i| shared.observe_owned(east(), format!("m{i}"))),
        )
        .await;
        assert_eq!(fake.count(Op::Observe), 1);
        for s in seen {
            assert_eq!(s.unwrap().len(), 1);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_machine_never_reads_a_listing_older_than_its_own_create() {
        let fake = cloud();
        let shared = SharedReads::new(fake.clone());
        assert!(shared.observe(&east(), "a").await.unwrap().is_empty());
        // Another machine reads the same (recent) listing without a new call.
        assert!(shared.observe(&east(), "b").await.unwrap().is_empty());
        assert_eq!(fake.count(Op::Observe), 1);
        // A create: the cached listing (started before it) no longer serves "a".
        let ask = ResourceRequest {
            vm_name: "a".into(),
            regions: vec![],
            zones: vec![],
            gpu: None,
            gpu_count: 0,
            spot: false,
            max_price_per_hour: None,
            gpu_count_at_least: false,
        };
        let offer = fake.plan(&ask).await.unwrap().remove(0);
        let id = shared
            .create(&offer, &serde_json::Value::Null, &spec("a"))
            .await
            .unwrap();
        // The create-intent check reads a listing that started after the create.
        let seen = shared.observe(&east(), "a").await.unwrap();
        assert_eq!(fake.count(Op::Observe), 2);
        assert_eq!(seen[0].instance_id, id);
        // Each poll of one machine reads a newer listing than the one before.
        shared.observe(&east(), "a").await.unwrap();
        assert_eq!(fake.count(Op::Observe), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_side_effect_that_failed_still_forces_a_new_listing() {
        let fake = cloud();
        let shared = SharedReads::new(fake.clone());
        shared.observe(&east(), "a").await.unwrap();
        shared.observe(&east(), "b").await.unwrap();
        fake.fault(Op::Delete, None, ProviderError::transient("timeout"), 1);
        assert!(shared.delete(&east(), "b", &["x".into()]).await.is_err());
        shared.observe(&east(), "b").await.unwrap();
        assert_eq!(fake.count(Op::Observe), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_listing_serves_new_callers_for_one_poll_interval_only() {
        let fake = cloud();
        let shared = SharedReads::new(fake.clone());
        shared.observe(&east(), "a").await.unwrap();
        tokio::time::sleep(Duration::from_secs(11)).await;
        shared.observe(&east(), "b").await.unwrap();
        assert_eq!(fake.count(Op::Observe), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn one_catalog_read_serves_every_machine_with_the_same_ask_until_a_refusal() {
        let fake = cloud();
        let shared = SharedReads::new(fake.clone());
        let ask = |vm: &str| ResourceRequest {
            vm_name: vm.into(),
            regions: vec![],
            zones: vec![],
            gpu: Some("H100".into()),
            gpu_count: 8,
            spot: false,
            max_price_per_hour: Some(100.0),
            gpu_count_at_least: false,
        };
        let answers = futures_util::future::join_all(
            (0..50).map(|i| shared.plan_owned(ask(&format!("m{i}")))),
        )
        .await;
        assert!(answers.iter().all(|a| a.as_ref().unwrap().len() == 1));
        assert_eq!(fake.count(Op::Plan), 1);
        // A capacity refusal says the shared answer was wrong: the next ask reads again.
        fake.fault(
            Op::Create,
            None,
            ProviderError::new(ErrorKind::Capacity, "no capacity"),
            1,
        );
        let offer = answers[0].as_ref().unwrap()[0].clone();
        let refused = shared
            .create(&offer, &serde_json::Value::Null, &spec("m0"))
            .await;
        assert!(refused.is_err());
        shared.plan(&ask("m0")).await.unwrap();
        assert_eq!(fake.count(Op::Plan), 2);
    }

    impl SharedReads {
        async fn observe_owned(&self, at: Location, vm: String) -> Result<Vec<Observed>> {
            self.observe(&at, &vm).await
        }
        async fn plan_owned(&self, req: ResourceRequest) -> Result<Vec<Offer>> {
            self.plan(&req).await
        }
    }
}
