//! gpuprov: provisions GPU machines on many clouds from a committed `gpuprov.toml`,
//! Terraform-style. See ARCHITECTURE.md for the map of the code.

pub mod config;
pub mod graph;
pub mod machine;
pub mod provider;
pub mod ssh;
pub mod state;
pub mod vm;
