//! The adapters of one run, by cloud name. Every adapter is registered behind the core's
//! limits ([`Governed`]), so the machines that call it through this registry cannot bypass
//! `max_concurrency`, `min_create_interval` or the declared `rate_limits`, and adapters
//! never wait themselves. Above
//! the limits, the machines' catalog reads and their `observe` calls at one location are
//! shared ([`SharedReads`]) unless the registry was built per machine
//! ([`Providers::per_machine_observe`], today's path kept for the benchmark's "before").

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::provider::CloudProvider;

use super::coalesce::SharedReads;
use super::limits::Governed;

/// The adapters available to one run, by cloud name.
#[derive(Clone, Default)]
pub struct Providers {
    map: BTreeMap<String, Arc<dyn CloudProvider>>,
    per_machine: bool,
    /// Clouds whose shared objects outlive their last machine (`keep_shared`).
    kept_shared: BTreeSet<String>,
}

impl Providers {
    /// An empty registry whose adapters' observe calls are shared per location.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty registry whose adapters are observed once per machine and poll, each
    /// call on its own (the path before shared observation; for comparisons).
    pub fn per_machine_observe() -> Self {
        Providers {
            per_machine: true,
            ..Self::default()
        }
    }

    /// Registers an adapter behind the core's limits for its declared capabilities
    /// (`max_concurrency`, `min_create_interval`, `rate_limits`; see [`super::limits`]), its observe
    /// calls shared per location ([`super::coalesce`]) unless built
    /// [`per_machine_observe`](Self::per_machine_observe). An adapter of the same cloud
    /// registered before is replaced.
    pub fn insert(&mut self, p: Arc<dyn CloudProvider>) {
        let name = p.name().to_string();
        let governed: Arc<dyn CloudProvider> = Arc::new(Governed::new(p));
        let p = if self.per_machine {
            governed
        } else {
            Arc::new(SharedReads::new(governed))
        };
        self.map.insert(name, p);
    }

    /// The adapter of `cloud` (behind its limits), if registered.
    pub fn get(&self, cloud: &str) -> Option<&Arc<dyn CloudProvider>> {
        self.map.get(cloud)
    }

    /// Keeps `cloud`'s shared objects after their last machine is destroyed (the
    /// `[cloud.NAME] keep_shared = true` setting): destroy neither deletes them nor drops
    /// their records.
    pub fn keep_shared(&mut self, cloud: &str) {
        self.kept_shared.insert(cloud.to_string());
    }

    /// Whether `cloud`'s shared objects are kept ([`Providers::keep_shared`]).
    pub fn keeps_shared(&self, cloud: &str) -> bool {
        self.kept_shared.contains(cloud)
    }

    /// The registered cloud names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.map.keys().map(|s| s.as_str())
    }
}
