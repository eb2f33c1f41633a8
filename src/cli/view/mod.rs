//! The views of a plan and of the other commands' results, all in one place: the core
//! (`crate::plan`) computes, these format. [`text`] is the terminal's plan
//! (Terraform-style), [`markdown`] the pull-request and job-summary plan, [`json`] every
//! machine-readable output (the plan in Terraform's JSON plan shape, and `status`,
//! `list`, `offers`, `validate`, `health`) with its JSON Schema.

pub mod json;
pub mod markdown;
pub mod text;
