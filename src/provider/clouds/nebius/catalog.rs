//! What gpuprov knows of Nebius' GPU platforms: the GPU model of each platform, its list
//! prices (USD per GPU-hour, on-demand and preemptible, with source and date), the
//! presets a project lists when none can be asked (offline `plan`), and the regions.
//!
//! Live, the presets come from `PlatformService/List` of the region's project
//! (`Platform.spec.presets[].resources.gpu_count`, and
//! `Platform.status.allowed_for_preemptibles` for spot); only the prices are from here,
//! since the API publishes none.
//!
//! Prices (a VM's hourly price is the per-GPU price × its GPUs: since 2025-10-01 GPU, vCPU
//! and RAM of H100, H200 and B200 VMs are billed as one item at the same hourly rate,
//! docs.nebius.com/signup-billing/billing-changes-oct-2025):
//! - H100: $2.95 on-demand, $1.25 preemptible (nebius.com/prices, as quoted on 2026-05-18
//!   by opslyft.com's comparison);
//! - H200: $3.50 on-demand (the 1gpu-16vcpu-200gb example of the billing-change page);
//! - B200: $5.50 on-demand; L40S: $1.82 (Intel host, `gpu-l40s-a`) and $1.55 (AMD host,
//!   `gpu-l40s-d`): nebius.com/prices as remembered in 2026, not verified offline;
//! - preemptible prices other than H100's are not known here: the on-demand price is
//!   shown as their upper bound.

use crate::provider::kit::gpu;

/// When the prices were last checked.
pub const PRICES_AS_OF: &str = "2026-05-18";

/// What `gpuprov offers` says of the offers' source (their `detail.catalog_note`):
/// `live` when the presets are the project's own.
pub fn catalog_note(live: bool) -> String {
    let prices = format!(
        "prices are gpuprov's built-in list prices (nebius.com/prices and Nebius' billing \
         docs, as of {PRICES_AS_OF}; preemptible prices other than H100's are not published \
         and shown at the on-demand price, an upper bound), not quotes"
    );
    if live {
        format!("{prices}; platforms and presets from the project's PlatformService/List")
    } else {
        format!(
            "{prices}; platforms and presets from the built-in catalog (no credential, or no \
             project for the region in [cloud.nebius] projects)"
        )
    }
}

/// A GPU platform (`Platform.metadata.name`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Platform {
    pub name: &'static str,
    /// The GPU as gpuprov spells it.
    pub gpu: &'static str,
    /// USD per GPU-hour, on-demand.
    pub per_gpu_hour: f64,
    /// USD per GPU-hour, preemptible, when published; else the on-demand price bounds it.
    pub preemptible_per_gpu_hour: Option<f64>,
    /// Presets as the API names them (`<n>gpu-<v>vcpu-<m>gb`), for plans made offline.
    pub presets: &'static [&'static str],
    /// Regions that have the platform (docs.nebius.com/compute/virtual-machines/types,
    /// 2026), for plans made offline; live plans ask the region's project.
    pub regions: &'static [&'static str],
}

impl Platform {
    /// USD per hour of a VM with `gpus` GPUs.
    pub fn price(&self, gpus: u32, preemptible: bool) -> f64 {
        let per = match (preemptible, self.preemptible_per_gpu_hour) {
            (true, Some(p)) => p,
            _ => self.per_gpu_hour,
        };
        ((per * gpus as f64) * 10_000.0).round() / 10_000.0
    }
}

/// The GPU platforms gpuprov offers.
pub const PLATFORMS: &[Platform] = &[
    Platform {
        name: "gpu-h100-sxm",
        gpu: "H100",
        per_gpu_hour: 2.95,
        preemptible_per_gpu_hour: Some(1.25),
        presets: &["1gpu-16vcpu-200gb", "8gpu-128vcpu-1600gb"],
        regions: &["eu-north1"],
    },
    Platform {
        name: "gpu-h200-sxm",
        gpu: "H200",
        per_gpu_hour: 3.50,
        preemptible_per_gpu_hour: None,
        presets: &["1gpu-16vcpu-200gb", "8gpu-128vcpu-1600gb"],
        regions: &["eu-north1", "eu-west1", "us-central1", "eu-north2"],
    },
    Platform {
        name: "gpu-b200-sxm",
        gpu: "B200",
        per_gpu_hour: 5.50,
        preemptible_per_gpu_hour: None,
        presets: &["8gpu-160vcpu-1792gb"],
        regions: &["us-central1", "me-west1", "uk-south1"],
    },
    Platform {
        name: "gpu-l40s-a",
        gpu: "L40S",
        per_gpu_hour: 1.82,
        preemptible_per_gpu_hour: None,
        presets: &["1gpu-8vcpu-32gb", "1gpu-16vcpu-64gb"],
        regions: &["eu-north1"],
    },
    Platform {
        name: "gpu-l40s-d",
        gpu: "L40S",
        per_gpu_hour: 1.55,
        preemptible_per_gpu_hour: None,
        presets: &[
            "1gpu-16vcpu-96gb",
            "2gpu-64vcpu-384gb",
            "4gpu-128vcpu-768gb",
        ],
        regions: &["eu-north1"],
    },
];

/// Every region gpuprov knows Nebius to have.
pub const REGIONS: &[&str] = &[
    "eu-north1",
    "eu-north2",
    "eu-west1",
    "us-central1",
    "me-west1",
    "uk-south1",
];

/// The platform named `name`, if gpuprov offers it.
pub fn platform(name: &str) -> Option<&'static Platform> {
    PLATFORMS.iter().find(|p| p.name == name)
}

/// The platforms carrying GPU model `want`.
pub fn platforms_for(want: &str) -> Vec<&'static Platform> {
    PLATFORMS
        .iter()
        .filter(|p| gpu::same_model(want, p.gpu))
        .collect()
}

/// The GPU count a preset's name states (`8gpu-128vcpu-1600gb` → 8), for offline plans.
pub fn preset_gpus(preset: &str) -> Option<u32> {
    preset.split('-').next()?.strip_suffix("gpu")?.parse().ok()
}

/// The vCPUs and memory (GiB) a preset's name states (`8gpu-128vcpu-1600gb` → 128, 1600):
/// Nebius names presets by their resources (the same as `PresetResources.vcpu_count`
/// and `memory_gibibytes`).
pub fn preset_size(preset: &str) -> (Option<u32>, Option<f64>) {
    let mut parts = preset.split('-').skip(1);
    let vcpus = parts
        .next()
        .and_then(|p| p.strip_suffix("vcpu")?.parse().ok());
    let memory = parts
        .next()
        .and_then(|p| p.strip_suffix("gb")?.parse().ok());
    (vcpus, memory)
}

/// Every GPU model gpuprov offers on Nebius, with counts (for "it has: …" messages).
pub fn configurations() -> Vec<String> {
    PLATFORMS
        .iter()
        .flat_map(|p| {
            p.presets
                .iter()
                .filter_map(move |s| preset_gpus(s).map(|n| format!("{} x{n}", p.gpu)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_are_per_gpu_times_gpus() {
        let h100 = platform("gpu-h100-sxm").unwrap();
        assert_eq!(h100.price(8, false), 23.6);
        assert_eq!(h100.price(8, true), 10.0);
        let h200 = platform("gpu-h200-sxm").unwrap();
        assert_eq!(
            h200.price(1, true),
            3.5,
            "on-demand bounds an unknown spot price"
        );
        assert_eq!(preset_gpus("8gpu-128vcpu-1600gb"), Some(8));
        assert_eq!(
            preset_size("8gpu-128vcpu-1600gb"),
            (Some(128), Some(1600.0))
        );
        assert_eq!(preset_size("odd"), (None, None));
        assert_eq!(preset_gpus("cpu-d3"), None);
        assert_eq!(platforms_for("l40s").len(), 2);
        assert!(configurations().contains(&"B200 x8".to_string()));
    }
}
