//! Reliability figures (issue 6): tests write JSON to `<target>/reliability/<name>.json`
//! (`CARGO_TARGET_DIR` when set, else `./target`); `cargo run --example reliability-report`
//! renders them, with the property figures of `tests/it/properties.rs`, into RELIABILITY.md.
#![allow(dead_code)]

use std::path::PathBuf;

/// The directory the figures go to: `<target>/reliability` (`CARGO_TARGET_TMPDIR` is
/// `<target>/tmp`, so this follows `CARGO_TARGET_DIR` like `tests/it/properties.rs` does).
pub fn dir() -> PathBuf {
    let tmp = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_else(|| tmp.to_path_buf())
        .join("reliability")
}

/// Writes `value` as `<dir>/<name>.json` (pretty), replacing an earlier run's figures.
pub fn write(name: &str, value: &serde_json::Value) {
    let d = dir();
    std::fs::create_dir_all(&d).expect("create the reliability figures directory");
    let path = d.join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(value).expect("figures serialise");
    std::fs::write(&path, text).expect("write reliability figures");
    eprintln!("figures written to {}", path.display());
}
