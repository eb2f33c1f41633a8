//! The adapters of one run, by cloud name. Every adapter is registered behind the core's
//! limits ([`Governed`]), so the machines that call it through this registry cannot bypass
//! `max_concurrency` or `min_create_interval`, and adapters never wait themselves.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::provider::CloudProvider;

use super::limits::Governed;

/// The adapters available to one run, by cloud name.
#[derive(Clone, Default)]
pub struct Providers {
    map: BTreeMap<String, Arc<dyn CloudProvider>>,
}

impl Providers {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers an adapter behind the core's limits for its declared capabilities
    /// (`max_concurrency`, `min_create_interval`; see [`super::limits`]). An adapter of
    /// the same cloud registered before is replaced.
    pub fn insert(&mut self, p: Arc<dyn CloudProvider>) {
        self.map
            .insert(p.name().to_string(), Arc::new(Governed::new(p)));
    }

    /// The adapter of `cloud` (behind its limits), if registered.
    pub fn get(&self, cloud: &str) -> Option<&Arc<dyn CloudProvider>> {
        self.map.get(cloud)
    }

    /// The registered cloud names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.map.keys().map(|s| s.as_str())
    }
}
