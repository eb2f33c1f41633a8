//! [`Recorded`]: a driver's adapter with the name of every contract call it answered
//! recorded, so a scenario can say which primitives the core sent (a `start`, and no
//! second `create`) on any cloud, whatever the cloud's own request log looks like. Every
//! method is forwarded as it is, the provided ones included, so wrapped and unwrapped
//! adapters behave alike.

use std::sync::{Arc, Mutex};

use gpuprov::provider::kit::{Adapter, CredentialReport};
use gpuprov::provider::{
    Capabilities, CloudProvider, Finding, Imported, InstanceSpec, Listed, Location, Observations,
    Observed, Offer, ResourceRequest, Result, Seen, SharedFound, SharedObject,
};
use serde_json::Value;

/// An adapter and the contract calls it answered, by method name, in order.
pub struct Recorded {
    inner: Arc<dyn CloudProvider>,
    calls: Mutex<Vec<&'static str>>,
}

impl Recorded {
    pub fn new(inner: Arc<dyn CloudProvider>) -> Arc<Recorded> {
        Arc::new(Recorded {
            inner,
            calls: Mutex::new(Vec::new()),
        })
    }

    /// How many calls of contract method `method` were answered so far.
    pub fn count(&self, method: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|m| **m == method)
            .count()
    }

    fn note(&self, method: &'static str) {
        self.calls.lock().unwrap().push(method);
    }
}

#[async_trait::async_trait]
impl CloudProvider for Recorded {
    fn adapter(&self) -> &Adapter {
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

    async fn credentials(&self) -> CredentialReport {
        self.inner.credentials().await
    }

    async fn plan(&self, req: &ResourceRequest) -> Result<Vec<Offer>> {
        self.note("plan");
        self.inner.plan(req).await
    }

    fn check_request(&self, req: &ResourceRequest) -> Result<()> {
        self.inner.check_request(req)
    }

    async fn prepare(&self, offer: &Offer, spec: &InstanceSpec) -> Result<Value> {
        self.note("prepare");
        self.inner.prepare(offer, spec).await
    }

    async fn create(&self, offer: &Offer, prep: &Value, spec: &InstanceSpec) -> Result<String> {
        self.note("create");
        self.inner.create(offer, prep, spec).await
    }

    async fn instances(&self, at: &Location, only_vm: Option<&str>) -> Result<Vec<Seen>> {
        self.note("instances");
        self.inner.instances(at, only_vm).await
    }

    async fn observe(&self, at: &Location, vm_name: &str) -> Result<Vec<Observed>> {
        self.note("observe");
        self.inner.observe(at, vm_name).await
    }

    async fn observe_location(&self, at: &Location) -> Result<Option<Observations>> {
        self.note("observe_location");
        self.inner.observe_location(at).await
    }

    async fn delete(&self, at: &Location, vm: &str, ids: &[String]) -> Result<()> {
        self.note("delete");
        self.inner.delete(at, vm, ids).await
    }

    async fn cleanup(&self, at: &Location, vm_name: &str) -> Result<()> {
        self.note("cleanup");
        self.inner.cleanup(at, vm_name).await
    }

    async fn list(&self, at: &Location) -> Result<Vec<Listed>> {
        self.note("list");
        self.inner.list(at).await
    }

    async fn import(&self, at: &Location, vm: &str, id: &str) -> Result<Imported> {
        self.note("import");
        self.inner.import(at, vm, id).await
    }

    async fn start(&self, at: &Location, vm: &str, id: &str) -> Result<()> {
        self.note("start");
        self.inner.start(at, vm, id).await
    }

    async fn diagnose(&self, at: &Location, vm: &str, id: &str) -> Result<Vec<Finding>> {
        self.note("diagnose");
        self.inner.diagnose(at, vm, id).await
    }

    fn shared_objects(&self, offer: &Offer) -> Vec<SharedObject> {
        self.inner.shared_objects(offer)
    }

    async fn observe_shared(
        &self,
        obj: &SharedObject,
        public_key: &str,
    ) -> Result<Option<SharedFound>> {
        self.note("observe_shared");
        self.inner.observe_shared(obj, public_key).await
    }

    async fn create_shared(&self, obj: &SharedObject, public_key: &str) -> Result<SharedFound> {
        self.note("create_shared");
        self.inner.create_shared(obj, public_key).await
    }

    async fn delete_shared(&self, obj: &SharedObject, found: &SharedFound) -> Result<()> {
        self.note("delete_shared");
        self.inner.delete_shared(obj, found).await
    }
}
