//! gpuprov: provisions GPU machines on many clouds from a committed `gpuprov.toml`,
//! Terraform-style. See ARCHITECTURE.md for the map of the code.

pub mod atomic_file;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod crash;
pub mod engine;
pub mod graph;
pub mod machine;
pub mod plan;
pub mod provider;
pub mod record;
pub mod ssh;
pub mod state;
pub mod vm;

#[cfg(test)]
mod architecture;
#[cfg(test)]
mod tidy;
