//! A fault-injecting wrapper around any adapter (issue 6), for tests against a real cloud
//! (the Docker test cloud): transient errors at a seeded rate, either before the call (the
//! request never reached the cloud) or after it (the cloud acted, the answer was lost, as
//! with a timeout), so the core's retries and its observe-before-act adoption are
//! exercised against the real thing. Adds no waits or retries of its own.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rand::{Rng as _, SeedableRng as _};

use crate::provider::{
    Capabilities, CloudProvider, InstanceSpec, Location, Observed, Offer, ProviderError,
    ResourceRequest, Result, Seen,
};

/// An adapter with injected transient faults. See the module docs.
pub struct Faulty {
    inner: Arc<dyn CloudProvider>,
    before: f64,
    lost: f64,
    rng: Mutex<rand::rngs::StdRng>,
    injected: AtomicU32,
    lose_first_create: std::sync::atomic::AtomicBool,
    lost_create: std::sync::atomic::AtomicBool,
}

impl Faulty {
    /// Wraps `inner`: each call fails before reaching it with probability `before`, and
    /// otherwise, after it returned, has its answer replaced by a transient error with
    /// probability `lost`; draws come from a generator seeded with `seed`.
    pub fn new(inner: Arc<dyn CloudProvider>, before: f64, lost: f64, seed: u64) -> Self {
        Faulty {
            inner,
            before: before.clamp(0.0, 1.0),
            lost: lost.clamp(0.0, 1.0),
            rng: Mutex::new(rand::rngs::StdRng::seed_from_u64(seed)),
            injected: AtomicU32::new(0),
            lose_first_create: Default::default(),
            lost_create: Default::default(),
        }
    }

    /// Also loses the answer of the first `create` that succeeds (the instance exists, the
    /// caller hears a transient error): the next attempt must adopt it, not create another.
    pub fn losing_first_create_answer(self) -> Self {
        self.lose_first_create.store(true, Ordering::SeqCst);
        self
    }

    /// Whether a successful create's answer was lost
    /// ([`losing_first_create_answer`](Self::losing_first_create_answer)).
    pub fn lost_a_create(&self) -> bool {
        self.lost_create.load(Ordering::SeqCst)
    }

    /// How many faults were injected so far.
    pub fn injected(&self) -> u32 {
        self.injected.load(Ordering::SeqCst)
    }

    fn draw(&self, p: f64) -> bool {
        let hit = p > 0.0
            && self
                .rng
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .gen_bool(p);
        if hit {
            self.injected.fetch_add(1, Ordering::SeqCst);
        }
        hit
    }

    fn before(&self, op: &str) -> Result<()> {
        if self.draw(self.before) {
            return Err(ProviderError::transient(format!(
                "injected: {op} did not reach the cloud"
            )));
        }
        Ok(())
    }

    fn after<T>(&self, op: &str, r: Result<T, ProviderError>) -> Result<T> {
        if r.is_ok() && self.draw(self.lost) {
            return Err(ProviderError::transient(format!(
                "injected: the answer to {op} was lost"
            )));
        }
        r
    }
}

#[async_trait]
impl CloudProvider for Faulty {
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
        self.before("plan")?;
        let r = self.inner.plan(req).await;
        self.after("plan", r)
    }
    async fn prepare(&self, offer: &Offer, spec: &InstanceSpec) -> Result<serde_json::Value> {
        self.before("prepare")?;
        let r = self.inner.prepare(offer, spec).await;
        self.after("prepare", r)
    }
    async fn create(
        &self,
        offer: &Offer,
        prep: &serde_json::Value,
        spec: &InstanceSpec,
    ) -> Result<String> {
        self.before("create")?;
        let r = self.inner.create(offer, prep, spec).await;
        if r.is_ok() && self.lose_first_create.swap(false, Ordering::SeqCst) {
            self.injected.fetch_add(1, Ordering::SeqCst);
            self.lost_create.store(true, Ordering::SeqCst);
            return Err(ProviderError::transient(
                "injected: the answer to the first create was lost",
            ));
        }
        self.after("create", r)
    }
    async fn instances(&self, at: &Location, only_vm: Option<&str>) -> Result<Vec<Seen>> {
        self.before("instances")?;
        let r = self.inner.instances(at, only_vm).await;
        self.after("instances", r)
    }
    async fn observe(&self, at: &Location, vm_name: &str) -> Result<Vec<Observed>> {
        self.before("observe")?;
        let r = self.inner.observe(at, vm_name).await;
        self.after("observe", r)
    }
    async fn observe_location(
        &self,
        at: &Location,
    ) -> Result<Option<crate::provider::Observations>> {
        self.before("observe")?;
        let r = self.inner.observe_location(at).await;
        self.after("observe", r)
    }
    async fn list(&self, at: &Location) -> Result<Vec<crate::provider::Listed>> {
        self.before("list")?;
        let r = self.inner.list(at).await;
        self.after("list", r)
    }
    async fn import(
        &self,
        at: &Location,
        vm_name: &str,
        id: &str,
    ) -> Result<crate::provider::Imported> {
        self.before("import")?;
        let r = self.inner.import(at, vm_name, id).await;
        self.after("import", r)
    }
    async fn diagnose(
        &self,
        at: &Location,
        vm_name: &str,
        id: &str,
    ) -> Result<Vec<crate::provider::Finding>> {
        self.before("diagnose")?;
        let r = self.inner.diagnose(at, vm_name, id).await;
        self.after("diagnose", r)
    }
    async fn delete(&self, at: &Location, vm_name: &str, instance_ids: &[String]) -> Result<()> {
        self.before("delete")?;
        let r = self.inner.delete(at, vm_name, instance_ids).await;
        self.after("delete", r)
    }
    async fn start(&self, at: &Location, vm_name: &str, instance_id: &str) -> Result<()> {
        self.before("start")?;
        let r = self.inner.start(at, vm_name, instance_id).await;
        self.after("start", r)
    }
    fn shared_objects(&self, offer: &Offer) -> Vec<crate::provider::SharedObject> {
        self.inner.shared_objects(offer)
    }
    async fn observe_shared(
        &self,
        obj: &crate::provider::SharedObject,
        public_key: &str,
    ) -> Result<Option<crate::provider::SharedFound>> {
        self.before("observe_shared")?;
        let r = self.inner.observe_shared(obj, public_key).await;
        self.after("observe_shared", r)
    }
    async fn create_shared(
        &self,
        obj: &crate::provider::SharedObject,
        public_key: &str,
    ) -> Result<crate::provider::SharedFound> {
        self.before("create_shared")?;
        let r = self.inner.create_shared(obj, public_key).await;
        self.after("create_shared", r)
    }
    async fn delete_shared(
        &self,
        obj: &crate::provider::SharedObject,
        found: &crate::provider::SharedFound,
    ) -> Result<()> {
        self.before("delete_shared")?;
        let r = self.inner.delete_shared(obj, found).await;
        self.after("delete_shared", r)
    }
    async fn cleanup(&self, at: &Location, vm_name: &str) -> Result<()> {
        self.before("cleanup")?;
        let r = self.inner.cleanup(at, vm_name).await;
        self.after("cleanup", r)
    }
}
