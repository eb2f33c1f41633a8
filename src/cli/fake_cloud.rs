//! Test-only: `GPUPROV_FAKE_CLOUD=1` serves every cloud of the config from the in-memory
//! [`FakeProvider`] and logs in with a scripted connector, so the real `apply` (its plan,
//! engine and live display) runs at hundreds of machines on one host. Compiled only with
//! the `test-doubles` feature (tests and benches), never shipped.
//!
//! `GPUPROV_FAKE_HOLD_SSH=FILE`: every SSH login is "not reachable yet" until FILE
//! exists, holding the machines in the expected wait (a screen to capture).
//!
//! `GPUPROV_FAKE_SHARED_KEY=1`: the fake cloud declares the project key as a shared
//! object (as DigitalOcean or Lambda do), so a run prepares it before its machines.
//!
//! `GPUPROV_FAKE_PANIC_SSH=1`: every SSH login panics, as a bug in gpuprov would (its
//! internal error, exit 255).
//!
//! `GPUPROV_FAKE_SSH=1` (without `GPUPROV_FAKE_CLOUD`): the clouds are the real adapters
//! (pointed at local vendor servers by their endpoint variables), only the SSH logins are
//! the scripted connector's, so no address a vendor server hands out is ever dialed.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::config::{Cloud, Config};
use crate::machine::Providers;
use crate::provider::doubles::fake::{FakeConnector, FakeProvider};
use crate::provider::{Capabilities, CloudProvider, SshEndpoint};
use crate::ssh::{Connector, HostKey, SshError};

/// Whether the fake cloud is asked for.
pub fn enabled() -> bool {
    std::env::var_os("GPUPROV_FAKE_CLOUD").is_some_and(|v| v == "1")
}

/// Whether only the SSH logins are asked to be faked (`GPUPROV_FAKE_SSH=1`).
pub fn ssh_only() -> bool {
    std::env::var_os("GPUPROV_FAKE_SSH").is_some_and(|v| v == "1")
}

/// A fake cloud under each cloud name the config uses ([`provider`]).
pub fn providers(config: &Config) -> Providers {
    let mut p = Providers::new();
    for cloud in config.clouds_in_use() {
        p.insert(provider(cloud));
    }
    p
}

/// The fake cloud under `cloud`'s name: one offer (`us-east-1`, `gpu_1x_h100`,
/// 2.49 USD/h), two observes of boot, 20 ms API calls.
pub fn provider(cloud: Cloud) -> Arc<dyn CloudProvider> {
    let caps = Capabilities {
        supported: vec![],
        boot_timeout: Duration::from_secs(600),
        ssh_timeout: Duration::from_secs(3600),
        delete_timeout: Duration::from_secs(600),
        poll_interval: Duration::from_millis(200),
        max_concurrency: 1000,
        min_create_interval: Duration::ZERO,
        rate_limits: Vec::new(),
        create_list_lag: Duration::from_millis(20),
        default_regions: Vec::new(),
        keeps_offer_order: true,
    };
    let fake = FakeProvider::new(cloud.as_str())
        .with_capabilities(caps)
        .with_latency(Duration::from_millis(20))
        .with_boot_observes(2)
        .with_offer("fake-h100", "us-east-1", "gpu_1x_h100", 2.49);
    if std::env::var_os("GPUPROV_FAKE_SHARED_KEY").is_some_and(|v| v == "1") {
        return Arc::new(fake.with_shared_key(None));
    }
    Arc::new(fake)
}

/// The fake cloud's SSH: held while `GPUPROV_FAKE_HOLD_SSH` names a missing file.
pub fn connector() -> Arc<dyn Connector> {
    Arc::new(HeldConnector {
        inner: FakeConnector::default(),
        hold: std::env::var_os("GPUPROV_FAKE_HOLD_SSH").map(PathBuf::from),
        panic: std::env::var_os("GPUPROV_FAKE_PANIC_SSH").is_some_and(|v| v == "1"),
    })
}

struct HeldConnector {
    inner: FakeConnector,
    hold: Option<PathBuf>,
    panic: bool,
}

#[async_trait]
impl Connector for HeldConnector {
    async fn login(
        &self,
        endpoint: &SshEndpoint,
        user: &str,
        pinned: Option<&HostKey>,
    ) -> Result<HostKey, SshError> {
        if self.panic {
            panic!("fake: a scripted bug in the SSH login");
        }
        if self.hold.as_ref().is_some_and(|f| !f.exists()) {
            return Err(SshError::Unreachable {
                endpoint: endpoint.to_string(),
                msg: "connection refused".into(),
            });
        }
        self.inner.login(endpoint, user, pinned).await
    }
}
