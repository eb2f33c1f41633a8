//! The core's per-cloud API limits (brief: "Capabilities ... API rate and concurrency
//! limits"): at most `max_concurrency` calls in flight to one cloud from this process, and
//! `create` calls at least `min_create_interval` apart (for example Lambda's launch
//! endpoint, about one call per 12 s). Every adapter registered in
//! [`Providers`](super::Providers) is wrapped in a [`Governed`], so adapters
//! never wait and no call path can bypass the limits. Being on every call path, it also
//! carries the test-only crash points around each side effect (`provider.before:<op>` /
//! `provider.after:<op>` for prepare, create, delete and cleanup; see [`crate::crash`]).

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::{Mutex, Semaphore};
use tokio::time::Instant;

use crate::provider::{
    Capabilities, CloudProvider, InstanceSpec, Location, Observed, Offer, ProviderError,
    ResourceRequest, Result,
};

/// An adapter behind its declared limits.
pub struct Governed {
    inner: Arc<dyn CloudProvider>,
    caps: Capabilities,
    in_flight: Semaphore,
    /// Earliest time the next `create` may start.
    next_create: Mutex<Option<Instant>>,
}

impl Governed {
    pub fn new(inner: Arc<dyn CloudProvider>) -> Self {
        let caps = inner.capabilities();
        Governed {
            in_flight: Semaphore::new(caps.max_concurrency.max(1)),
            caps,
            inner,
            next_create: Mutex::new(None),
        }
    }

    async fn permit(&self) -> Result<tokio::sync::SemaphorePermit<'_>> {
        self.in_flight
            .acquire()
            .await
            .map_err(|_| ProviderError::transient("internal: API limiter closed"))
    }
}

#[async_trait]
impl CloudProvider for Governed {
    fn adapter(&self) -> &crate::provider::kit::Adapter {
        self.inner.adapter()
    }
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.caps.clone()
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
        let _p = self.permit().await?;
        self.inner.plan(req).await
    }
    async fn prepare(&self, offer: &Offer, spec: &InstanceSpec) -> Result<serde_json::Value> {
        crate::crash::point("provider.before:prepare").await;
        let r = {
            let _p = self.permit().await?;
            self.inner.prepare(offer, spec).await
        };
        crate::crash::point("provider.after:prepare").await;
        r
    }
    async fn create(
        &self,
        offer: &Offer,
        prep: &serde_json::Value,
        spec: &InstanceSpec,
    ) -> Result<String> {
        let permit = {
            // Held across both waits, so creates queue up and reach the cloud one
            // interval apart: the permit is taken before the next slot is set, else
            // creates spaced here could bunch up behind a full semaphore.
            let mut next = self.next_create.lock().await;
            if let Some(at) = *next {
                tokio::time::sleep_until(at).await;
            }
            let p = self.permit().await?;
            *next = Some(Instant::now() + self.caps.min_create_interval);
            p
        };
        crate::crash::point("provider.before:create").await;
        let r = self.inner.create(offer, prep, spec).await;
        drop(permit);
        crate::crash::point("provider.after:create").await;
        r
    }
    async fn observe(&self, at: &Location, vm_name: &str) -> Result<Vec<Observed>> {
        let _p = self.permit().await?;
        self.inner.observe(at, vm_name).await
    }
    async fn observe_location(
        &self,
        at: &Location,
    ) -> Result<Option<crate::provider::Observations>> {
        let _p = self.permit().await?;
        self.inner.observe_location(at).await
    }
    async fn import(
        &self,
        at: &Location,
        vm_name: &str,
        instance_id: &str,
    ) -> Result<crate::provider::Imported> {
        let _p = self.permit().await?;
        self.inner.import(at, vm_name, instance_id).await
    }
    async fn list(&self, at: &Location) -> Result<Vec<crate::provider::Listed>> {
        let _p = self.permit().await?;
        self.inner.list(at).await
    }
    async fn delete(&self, at: &Location, vm_name: &str, instance_ids: &[String]) -> Result<()> {
        crate::crash::point("provider.before:delete").await;
        let r = {
            let _p = self.permit().await?;
            self.inner.delete(at, vm_name, instance_ids).await
        };
        crate::crash::point("provider.after:delete").await;
        r
    }
    fn shared_objects(&self, offer: &Offer) -> Vec<crate::provider::SharedObject> {
        self.inner.shared_objects(offer)
    }
    async fn observe_shared(
        &self,
        obj: &crate::provider::SharedObject,
        public_key: &str,
    ) -> Result<Option<crate::provider::SharedFound>> {
        let _p = self.permit().await?;
        self.inner.observe_shared(obj, public_key).await
    }
    async fn create_shared(
        &self,
        obj: &crate::provider::SharedObject,
        public_key: &str,
    ) -> Result<crate::provider::SharedFound> {
        crate::crash::point("provider.before:create_shared").await;
        let r = {
            let _p = self.permit().await?;
            self.inner.create_shared(obj, public_key).await
        };
        crate::crash::point("provider.after:create_shared").await;
        r
    }
    async fn delete_shared(
        &self,
        obj: &crate::provider::SharedObject,
        found: &crate::provider::SharedFound,
    ) -> Result<()> {
        crate::crash::point("provider.before:delete_shared").await;
        let r = {
            let _p = self.permit().await?;
            self.inner.delete_shared(obj, found).await
        };
        crate::crash::point("provider.after:delete_shared").await;
        r
    }
    async fn start(&self, at: &Location, vm_name: &str, instance_id: &str) -> Result<()> {
        crate::crash::point("provider.before:start").await;
        let r = {
            let _p = self.permit().await?;
            self.inner.start(at, vm_name, instance_id).await
        };
        crate::crash::point("provider.after:start").await;
        r
    }
    async fn diagnose(
        &self,
        at: &Location,
        vm_name: &str,
        instance_id: &str,
    ) -> Result<Vec<crate::provider::Finding>> {
        let _p = self.permit().await?;
        self.inner.diagnose(at, vm_name, instance_id).await
    }
    async fn cleanup(&self, at: &Location, vm_name: &str) -> Result<()> {
        crate::crash::point("provider.before:cleanup").await;
        let r = {
            let _p = self.permit().await?;
            self.inner.cleanup(at, vm_name).await
        };
        crate::crash::point("provider.after:cleanup").await;
        r
    }
}
