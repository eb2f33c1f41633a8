//! Test clouds built on the FakeProvider with behaviours of real clouds that the fake
//! itself does not have (shared by `tests/it/launch.rs` and `tests/it/crash_sweep.rs`).
#![allow(dead_code)]

use std::sync::Arc;

use gpuprov::provider::doubles::fake::FakeProvider;
use gpuprov::provider::{CloudProvider, Location, Result};

/// The fake cloud with two behaviours of real ones: it ignores the idempotency token
/// (`no_token`, as Lambda, DigitalOcean, RunPod and Hyperstack do: every create starts a
/// new instance), and a `gate` that holds every create call open after the cloud has
/// acted on it, until the test releases it (its answer is still on the wire).
pub struct TestCloud {
    pub inner: Arc<FakeProvider>,
    pub no_token: bool,
    pub gate: Option<Gate>,
}

#[derive(Clone, Default)]
pub struct Gate {
    pub entered: Arc<tokio::sync::Notify>,
    pub release: Arc<tokio::sync::Notify>,
}

#[async_trait::async_trait]
impl CloudProvider for TestCloud {
    fn adapter(&self) -> &gpuprov::provider::kit::Adapter {
        self.inner.adapter()
    }
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> gpuprov::provider::Capabilities {
        self.inner.capabilities()
    }
    async fn plan(
        &self,
        req: &gpuprov::provider::ResourceRequest,
    ) -> Result<Vec<gpuprov::provider::Offer>> {
        self.inner.plan(req).await
    }
    async fn prepare(
        &self,
        offer: &gpuprov::provider::Offer,
        spec: &gpuprov::provider::InstanceSpec,
    ) -> Result<serde_json::Value> {
        self.inner.prepare(offer, spec).await
    }
    async fn create(
        &self,
        offer: &gpuprov::provider::Offer,
        prep: &serde_json::Value,
        spec: &gpuprov::provider::InstanceSpec,
    ) -> Result<String> {
        let mut spec = spec.clone();
        if self.no_token {
            spec.client_token = uuid::Uuid::new_v4().to_string();
        }
        let out = self.inner.create(offer, prep, &spec).await;
        if let Some(g) = &self.gate {
            g.entered.notify_one();
            g.release.notified().await;
        }
        out
    }
    async fn instances(
        &self,
        at: &Location,
        only_vm: Option<&str>,
    ) -> Result<Vec<gpuprov::provider::Seen>> {
        CloudProvider::instances(self.inner.as_ref(), at, only_vm).await
    }
    async fn observe(
        &self,
        at: &Location,
        vm_name: &str,
    ) -> Result<Vec<gpuprov::provider::Observed>> {
        self.inner.observe(at, vm_name).await
    }
    async fn observe_location(
        &self,
        at: &Location,
    ) -> Result<Option<gpuprov::provider::Observations>> {
        self.inner.observe_location(at).await
    }
    async fn list(&self, at: &Location) -> Result<Vec<gpuprov::provider::Listed>> {
        self.inner.list(at).await
    }
    async fn delete(&self, at: &Location, vm_name: &str, instance_ids: &[String]) -> Result<()> {
        self.inner.delete(at, vm_name, instance_ids).await
    }
    fn shared_objects(
        &self,
        offer: &gpuprov::provider::Offer,
    ) -> Vec<gpuprov::provider::SharedObject> {
        self.inner.shared_objects(offer)
    }
    async fn observe_shared(
        &self,
        obj: &gpuprov::provider::SharedObject,
        public_key: &str,
    ) -> Result<Option<gpuprov::provider::SharedFound>> {
        self.inner.observe_shared(obj, public_key).await
    }
    async fn create_shared(
        &self,
        obj: &gpuprov::provider::SharedObject,
        public_key: &str,
    ) -> Result<gpuprov::provider::SharedFound> {
        self.inner.create_shared(obj, public_key).await
    }
    async fn delete_shared(
        &self,
        obj: &gpuprov::provider::SharedObject,
        found: &gpuprov::provider::SharedFound,
    ) -> Result<()> {
        self.inner.delete_shared(obj, found).await
    }
    async fn cleanup(&self, at: &Location, vm_name: &str) -> Result<()> {
        self.inner.cleanup(at, vm_name).await
    }
}
