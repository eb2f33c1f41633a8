//! Test helpers the adapters' unit tests share.

use super::super::ResourceRequest;

/// The ask of VM `a` for `count` GPUs of model `gpu` (any when `None`) in `regions` (any
/// when empty), on demand and without a price cap.
pub fn ask(gpu: Option<&str>, count: u32, regions: &[&str]) -> ResourceRequest {
    ResourceRequest {
        vm_name: "a".into(),
        regions: regions.iter().map(|r| (*r).into()).collect(),
        zones: vec![],
        gpu: gpu.map(str::to_string),
        gpu_count: count,
        spot: false,
        max_price_per_hour: None,
    }
}

#[test]
fn an_ask_names_what_it_is_given() {
    let a = ask(Some("H100"), 8, &["CANADA-1"]);
    assert_eq!(
        (a.gpu.as_deref(), a.gpu_count, a.regions.len(), a.spot),
        (Some("H100"), 8, 1, false)
    );
}
