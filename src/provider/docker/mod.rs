//! The Docker test cloud.
