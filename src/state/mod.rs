//! The JSON state file and its lock.
