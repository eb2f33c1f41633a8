//! Shared test support of the single integration test (`tests/it/main.rs`).
//!
//! - [`drive`]: runs the real launch and teardown machines against one adapter.
//! - [`spec`]: spec-checked wiremock servers of the vendor APIs.
//! - [`clouds`]: FakeProvider variants with behaviours of real clouds.
//! - [`faults`]: the scripted error answers of the fake vendor servers.
//! - [`figures`]: reliability figures written beside the build.
//! - [`k3s`]: the scripted node and the stand-in Kubernetes API of the k3s tests.
//! - [`stores`]: moto S3 and a throwaway PostgreSQL cluster for the state backends.
//! - [`openssh`]: `ssh-keygen` keys and fingerprints, a throwaway `ssh-agent`.

pub mod clouds;
pub mod drive;
pub mod faults;
pub mod figures;
pub mod k3s;
pub mod openssh;
pub mod spec;
pub mod stores;

/// The one offer of the Docker test cloud, as a record of a machine up there carries it.
pub fn docker_offer() -> gpuprov::provider::Offer {
    gpuprov::provider::clouds::docker::offer()
}
