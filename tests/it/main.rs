//! The single integration test of gpuprov (one binary, one link: the layout of
//! matklad's "Delete Cargo Integration Tests"). Each former `tests/<name>.rs` is the
//! module `<name>` here; the shared harnesses live in [`support`]. Run it with the
//! README's command, `cargo nextest run --locked --no-fail-fast`; one module's tests with
//! a filter, e.g. `cargo nextest run cli::`.

mod support;

mod aws_moto;
mod backends;
mod backends_docker;
mod ci_examples;
mod cli;
mod cli_kube;
mod cli_outcomes;
mod config;
mod conformance;
mod crash_docker;
mod crash_sweep;
mod docker_e2e;
mod docker_provider;
mod engine;
mod executor;
mod faults;
mod health;
mod host_keys;
mod k3s_docker;
mod k3s_machine;
mod launch;
mod lifecycle_docker;
mod live_display;
mod multi_cloud;
mod persisted_states;
mod properties;
mod self_contained;
mod shared_objects;
mod spec_harness;
mod ssh_key_docker;
mod ssh_local;
mod state_clouds;
mod state_commands;
mod state_file;
mod state_journal;
mod surgery_docker;
mod validate;
mod vendor;
