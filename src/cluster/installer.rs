//! The k3s installer ([`INSTALLER_SH`], a POSIX shell script shipped inside the binary)
//! and the environment that configures it ([`InstallerConfig`]). The same
//! [`BootScript`] is delivered at boot by the adapter and, as the fallback, pushed over
//! SSH (design 4.5); the script is idempotent and serialised on a host-wide `flock`, so
//! both routes may overlap.

use std::collections::BTreeMap;

use super::san::SanList;
use crate::provider::boot::{BootScript, BootScriptError};

/// The installer script (`src/cluster/installer.sh`). Its header documents every
/// environment variable it reads.
pub const INSTALLER_SH: &str = include_str!("installer.sh");

/// The installer's status marker on the host: `key=value` lines, `state=running|done|failed`
/// (see [`super::probe::Marker`]).
pub const STATUS_PATH: &str = "/var/lib/gpuprov/k3s-install.status";

/// The config file the installer owns (k3s reads it at start; k3s docs, "Configuration
/// File").
pub const K3S_CONFIG_PATH: &str = "/etc/rancher/k3s/config.yaml";

/// The kubeconfig k3s writes on the host.
pub const K3S_KUBECONFIG_PATH: &str = "/etc/rancher/k3s/k3s.yaml";

/// The official k3s install script (k3s docs, "Quick-Start Guide").
pub const DEFAULT_K3S_INSTALL_URL: &str = "https://get.k3s.io";

/// How the installer treats the GPU (`GPUPROV_GPU`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GpuMode {
    /// The VM was bought with GPUs: wait for the driver (`nvidia-smi -L`), fail without it.
    Required,
    /// Take the GPU path if `nvidia-smi -L` lists a GPU.
    #[default]
    Auto,
    /// Never take the GPU path.
    Off,
}

impl GpuMode {
    /// The mode for a VM with `gpu_count` GPUs: `Required` when it has any, else `Off`.
    pub fn for_gpu_count(gpu_count: u32) -> GpuMode {
        if gpu_count > 0 {
            GpuMode::Required
        } else {
            GpuMode::Off
        }
    }

    fn as_env(self) -> &'static str {
        match self {
            GpuMode::Required => "required",
            GpuMode::Auto => "auto",
            GpuMode::Off => "off",
        }
    }
}

/// Where the k3s artifacts come from. The default is the official install script, which
/// installs the stable channel's release; air-gapped users and tests point `install_url`
/// at a local copy (`file://` URL or absolute path on the host) or pin `version`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct K3sSource {
    /// `None`: [`DEFAULT_K3S_INSTALL_URL`].
    pub install_url: Option<String>,
    /// A k3s release such as `v1.31.4+k3s1` (`INSTALL_K3S_VERSION`); `None`: the install
    /// script's default.
    pub version: Option<String>,
}

/// Everything the installer is told, rendered to its environment by
/// [`InstallerConfig::env`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InstallerConfig {
    pub tls_sans: SanList,
    /// Ask the AWS/GCP metadata service for the public IP at boot, when gpuprov does not
    /// know it yet (design 4.5, "TLS SAN").
    pub san_from_metadata: bool,
    pub gpu: GpuMode,
    pub k3s: K3sSource,
    /// `None`: the installer's pinned NVIDIA device plugin image.
    pub device_plugin_image: Option<String>,
    /// `None`: NVIDIA's package repository.
    pub nvidia_repo_url: Option<String>,
    /// Seconds to wait for each of driver, k3s unit and containerd config; `None`: 300.
    pub wait_secs: Option<u32>,
}

impl InstallerConfig {
    /// The installer's environment. Only set values appear, so the script's defaults
    /// stay in one place (its header).
    pub fn env(&self) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        let mut set = |k: &str, v: String| {
            env.insert(k.to_string(), v);
        };
        set("GPUPROV_GPU", self.gpu.as_env().into());
        let sans = self.tls_sans.to_env_value();
        if !sans.is_empty() {
            set("GPUPROV_TLS_SANS", sans);
        }
        if self.san_from_metadata {
            set("GPUPROV_TLS_SAN_FROM_METADATA", "1".into());
        }
        if let Some(u) = &self.k3s.install_url {
            set("GPUPROV_K3S_INSTALL_URL", u.clone());
        }
        if let Some(v) = &self.k3s.version {
            set("GPUPROV_K3S_VERSION", v.clone());
        }
        if let Some(i) = &self.device_plugin_image {
            set("GPUPROV_DEVICE_PLUGIN_IMAGE", i.clone());
        }
        if let Some(u) = &self.nvidia_repo_url {
            set("GPUPROV_NVIDIA_REPO_URL", u.clone());
        }
        if let Some(w) = self.wait_secs {
            set("GPUPROV_WAIT_SECS", w.to_string());
        }
        env
    }

    /// The installer as a boot script (for `InstanceSpec::boot_script` and for the SSH
    /// push, which runs its [`BootScript::to_shell`] form).
    ///
    /// Errors: none for values built by this module; checked anyway so a bad value can
    /// never reach a host.
    pub fn boot_script(&self) -> Result<BootScript, BootScriptError> {
        let b = BootScript {
            script: INSTALLER_SH.to_string(),
            env: self.env(),
        };
        b.validate()?;
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::san::SanInputs;
    use crate::provider::boot::cloud_init::{
        self,
        tests::{decoded_script, doc},
    };
    use std::process::Command;

    #[test]
    fn installer_parses_with_sh_n() {
        for shell in ["sh", "dash", "bash"] {
            let Ok(out) = Command::new(shell)
                .arg("-n")
                .arg("-c")
                .arg(INSTALLER_SH)
                .output()
            else {
                continue; // that shell is not installed here
            };
            assert!(
                out.status.success(),
                "{shell} -n: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    #[test]
    fn installer_is_shellcheck_clean_when_shellcheck_is_installed() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/cluster/installer.sh");
        let Ok(out) = Command::new("shellcheck").args(["-s", "sh", path]).output() else {
            return; // shellcheck is optional on developer machines
        };
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }

    #[test]
    fn installer_keeps_its_contract() {
        // Paths and states the probe and the design rely on.
        for needle in [
            "/var/lib/gpuprov",
            "k3s-install.status",
            "/etc/rancher/k3s",
            "flock -w",
            "state=%s",
            "write_status running",
            "write_status \"done\"",
            "write_status failed",
            "default-runtime: nvidia",
            "tls-san:",
            "https://get.k3s.io",
            "INSTALL_K3S_VERSION",
        ] {
            assert!(INSTALLER_SH.contains(needle), "{needle}");
        }
        assert!(STATUS_PATH.ends_with("/k3s-install.status"));
        // Order on the GPU path: driver check, toolkit, then k3s.
        let pos = |s: &str| INSTALLER_SH.find(s).unwrap();
        assert!(pos("STEP=driver") < pos("STEP=toolkit"));
        assert!(pos("STEP=toolkit") < pos("STEP=k3s-install"));
        assert!(pos("STEP=k3s-install") < pos("STEP=containerd-runtime"));
        assert!(pos("STEP=containerd-runtime") < pos("STEP=device-plugin"));
    }

    #[test]
    fn env_defaults_and_overrides() {
        let d = InstallerConfig::default().env();
        assert_eq!(
            d,
            BTreeMap::from([("GPUPROV_GPU".to_string(), "auto".to_string())])
        );
        let c = InstallerConfig {
            tls_sans: SanList::for_vm(&SanInputs {
                public_host: Some("203.0.113.7".into()),
                ..Default::default()
            })
            .unwrap(),
            san_from_metadata: true,
            gpu: GpuMode::for_gpu_count(8),
            k3s: K3sSource {
                install_url: Some("file:///opt/k3s/install.sh".into()),
                version: Some("v1.31.4+k3s1".into()),
            },
            device_plugin_image: Some("registry.local/dp:1".into()),
            nvidia_repo_url: Some("https://mirror.local/nvidia".into()),
            wait_secs: Some(60),
        };
        let e = c.env();
        let get = |k: &str| e.get(k).map(String::as_str);
        assert_eq!(get("GPUPROV_GPU"), Some("required"));
        assert_eq!(
            get("GPUPROV_TLS_SANS"),
            Some("203.0.113.7,127.0.0.1,localhost")
        );
        assert_eq!(get("GPUPROV_TLS_SAN_FROM_METADATA"), Some("1"));
        assert_eq!(
            get("GPUPROV_K3S_INSTALL_URL"),
            Some("file:///opt/k3s/install.sh")
        );
        assert_eq!(get("GPUPROV_K3S_VERSION"), Some("v1.31.4+k3s1"));
        assert_eq!(
            get("GPUPROV_DEVICE_PLUGIN_IMAGE"),
            Some("registry.local/dp:1")
        );
        assert_eq!(
            get("GPUPROV_NVIDIA_REPO_URL"),
            Some("https://mirror.local/nvidia")
        );
        assert_eq!(get("GPUPROV_WAIT_SECS"), Some("60"));
        assert_eq!(GpuMode::for_gpu_count(0), GpuMode::Off);
        let b = c.boot_script().unwrap();
        assert_eq!(b.script, INSTALLER_SH);
        assert_eq!(b.env, e);
        // The shell form keeps the installer's own shebang and still parses.
        let shell = b.to_shell().unwrap();
        assert!(shell.starts_with("#!/bin/sh\n"));
        let out = Command::new("sh")
            .arg("-n")
            .arg("-c")
            .arg(&shell)
            .output()
            .unwrap();
        assert!(out.status.success());
    }

    /// A sandbox for running the real installer locally against the test doubles in
    /// `tests/doubles/` (no root, no network, GPU off): relocated state, config and data
    /// dirs, and a PATH whose `systemctl` and `k3s` are doubles.
    struct Sandbox {
        root: tempfile::TempDir,
    }

    impl Sandbox {
        fn new() -> Sandbox {
            let root = tempfile::tempdir().unwrap();
            let bin = root.path().join("bin");
            std::fs::create_dir_all(&bin).unwrap();
            let doubles = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/doubles");
            std::fs::copy(format!("{doubles}/systemctl-double"), bin.join("systemctl")).unwrap();
            Sandbox { root }
        }

        fn run(&self, sans: &str) -> std::process::Output {
            let r = self.root.path();
            let path = format!(
                "{}:{}",
                r.join("bin").display(),
                std::env::var("PATH").unwrap()
            );
            Command::new("sh")
                .arg("-c")
                .arg(INSTALLER_SH)
                .env("PATH", path)
                .env("K3S_DOUBLE_ROOT", r)
                .env("K3S_DOUBLE_INSTALL_SECS", "1")
                .env("GPUPROV_STATE_DIR", r.join("state"))
                .env("GPUPROV_K3S_CONFIG_DIR", r.join("etc"))
                .env("GPUPROV_K3S_DATA_DIR", r.join("data"))
                .env(
                    "GPUPROV_K3S_INSTALL_URL",
                    concat!(
                        env!("CARGO_MANIFEST_DIR"),
                        "/tests/doubles/k3s-install-double.sh"
                    ),
                )
                .env("GPUPROV_K3S_VERSION", "v0.0.0+double")
                .env("GPUPROV_GPU", "off")
                .env("GPUPROV_WAIT_SECS", "4")
                .env("GPUPROV_TLS_SANS", sans)
                // Never ask a cloud metadata service (169.254.169.254) from a test.
                .env_remove("GPUPROV_TLS_SAN_FROM_METADATA")
                .output()
                .unwrap()
        }

        fn read(&self, rel: &str) -> String {
            std::fs::read_to_string(self.root.path().join(rel)).unwrap_or_default()
        }

        /// Returns and clears the doubles' call log.
        fn take_calls(&self) -> Vec<String> {
            let calls = self.read("calls");
            let _ = std::fs::remove_file(self.root.path().join("calls"));
            calls.lines().map(str::to_string).collect()
        }

        fn status(&self, key: &str) -> Option<String> {
            self.read("state/k3s-install.status")
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")).map(str::to_string))
        }
    }

    #[test]
    fn installer_runs_against_test_doubles() {
        let sb = Sandbox::new();
        let ok = |o: &std::process::Output| {
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        };

        // Two concurrent first runs: serialised by the lock, k3s installed once.
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| sb.run("203.0.113.7,127.0.0.1,localhost"));
            let b = s.spawn(|| sb.run("203.0.113.7,127.0.0.1,localhost"));
            (a.join().unwrap(), b.join().unwrap())
        });
        ok(&a);
        ok(&b);
        assert_eq!(
            sb.take_calls(),
            [
                "install-start version=v0.0.0+double",
                "install-end",
                "start k3s"
            ]
        );
        assert_eq!(sb.status("state").as_deref(), Some("done"));
        assert_eq!(
            sb.read("etc/config.yaml"),
            "# Managed by gpuprov (installer.sh); rewritten on every install run.\n\
             write-kubeconfig-mode: \"0600\"\ntls-san:\n  - \"203.0.113.7\"\n  \
             - \"127.0.0.1\"\n  - \"localhost\"\n"
        );

        // Same SAN list: nothing restarts.
        ok(&sb.run("203.0.113.7,127.0.0.1,localhost"));
        assert_eq!(sb.take_calls(), Vec::<String>::new());
        assert_eq!(sb.status("restarted").as_deref(), Some("0"));

        // Changed SAN list: config rewritten, k3s restarted once.
        ok(&sb.run("198.51.100.9,127.0.0.1,localhost"));
        assert_eq!(sb.take_calls(), ["restart k3s"]);
        assert_eq!(sb.status("restarted").as_deref(), Some("1"));
        assert!(sb.read("etc/config.yaml").contains("\"198.51.100.9\""));

        // A bad SAN fails with the reason in the marker, and the probe reads it.
        let bad = sb.run("bad\"san");
        assert_eq!(bad.status.code(), Some(1));
        assert_eq!(sb.status("state").as_deref(), Some("failed"));
        let marker = sb.read("state/k3s-install.status");
        let probe = crate::cluster::probe::BootProbe::parse(&format!(
            "@@gpuprov-probe section marker\n{marker}\n@@gpuprov-probe rc 0\n"
        ));
        assert!(matches!(
            probe.marker,
            crate::cluster::probe::Marker::Failed { reason: Some(ref r), .. } if r.contains("invalid TLS SAN")
        ));
    }

    #[test]
    fn the_installer_renders_as_valid_cloud_config() {
        let b = InstallerConfig::default().boot_script().unwrap();
        let u = cloud_init::render(Some(&b), &["ssh-ed25519 AAAA k"]).unwrap();
        let v = doc(&u);
        assert_eq!(decoded_script(&v), b.to_shell().unwrap());
    }

    #[test]
    fn the_installer_fits_the_smallest_user_data_limit() {
        // The installer as a GPU VM's boot script carries, with a long SAN list and
        // every setting set, plus a project key.
        let cfg = InstallerConfig {
            tls_sans: crate::cluster::san::SanList::for_vm(&crate::cluster::san::SanInputs {
                public_host: Some("ec2-203-0-113-250.us-west-2.compute.amazonaws.com".into()),
                private_ip: Some("10.0.12.34".parse().unwrap()),
                extra: vec!["k3s.internal.example.com".into()],
            })
            .unwrap(),
            san_from_metadata: true,
            gpu: GpuMode::Required,
            k3s: K3sSource {
                install_url: Some("https://mirror.example.com/k3s/install.sh".into()),
                version: Some("v1.31.4+k3s1".into()),
            },
            device_plugin_image: Some("nvcr.io/nvidia/k8s-device-plugin:v0.17.0".into()),
            nvidia_repo_url: Some("https://mirror.example.com/nvidia".into()),
            wait_secs: Some(600),
        };
        let b = cfg.boot_script().unwrap();
        let key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGpuprovTestKeyOnlyAAAAAAAAAAAAAAAAAAAAA gpuprov-0f0e0d0c";
        let u = cloud_init::render(Some(&b), &[key]).unwrap();
        assert!(
            u.len() < cloud_init::MAX_USER_DATA_BYTES / 2,
            "{} bytes of user data; EC2 takes at most {}",
            u.len(),
            cloud_init::MAX_USER_DATA_BYTES
        );
        // Uncompressed it would not fit: the compression is what makes AWS work.
        assert!(b.to_shell().unwrap().len() * 4 / 3 > cloud_init::MAX_USER_DATA_BYTES);
        assert_eq!(decoded_script(&doc(&u)), b.to_shell().unwrap());
    }
}
