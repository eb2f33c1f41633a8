//! Shared fixtures of the adapters' unit tests.

use super::super::ResourceRequest;

/// An on-demand ask of VM `a` for `count` × `gpu` (`None`: any) in `regions` (empty: any).
pub fn ask(gpu: Option<&str>, count: u32, regions: &[&str]) -> ResourceRequest {
    ResourceRequest {
        vm_name: "a".into(),
        regions: regions.iter().map(|r| (*r).into()).collect(),
        zones: vec![],
        gpu: gpu.map(str::to_string),
        gpu_count: count,
        spot: false,
        max_price_per_hour: None,
        gpu_count_at_least: false,
    }
}

/// The 502 page a proxy in front of an API answers with (HTML, long, not the vendor's
/// error body), which every adapter must reduce to one short line.
pub fn proxy_page() -> String {
    format!(
        "<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n<body>{}</body></html>",
        "<p>cloudflare</p>".repeat(200)
    )
}

#[test]
fn fixtures_are_what_they_say() {
    let a = ask(Some("H100"), 8, &["us-east-1"]);
    assert_eq!((a.gpu.as_deref(), a.gpu_count), (Some("H100"), 8));
    assert_eq!(a.regions, ["us-east-1"]);
    assert!(proxy_page().len() > 1000);
}
