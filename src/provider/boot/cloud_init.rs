//! cloud-init user-data for clouds that take it (AWS, GCP, Hyperstack, DigitalOcean,
//! Nebius, Lambda): a `#cloud-config` document that authorises the project's SSH keys
//! and writes the boot script's shell form ([`BootScript::to_shell`]) to
//! [`BOOT_SCRIPT_PATH`], then runs it once from `runcmd`.
//!
//! The script travels gzip-compressed (`encoding: gz+b64`, cloud-init docs, `write_files`):
//! the k3s installer is about 13 KB of shell, and EC2 caps user data at 16 KB before
//! base64 (EC2 API reference, `RunInstances`, `UserData`); compressed, the document stays
//! well under [`MAX_USER_DATA_BYTES`].
//!
//! `write_files` runs in cloud-init's init stage and `runcmd` in the final stage, so the
//! file exists before it is run (cloud-init docs, "Module reference": `write_files`,
//! `runcmd`). cloud-init reports `status: running` until `runcmd` has finished, which the
//! boot probe relies on (`probe.rs`).

use base64::Engine as _;

use super::{BootScript, BootScriptError};

/// Where the boot script is written on the instance.
pub const BOOT_SCRIPT_PATH: &str = "/var/lib/gpuprov/boot.sh";

/// The smallest user-data limit among the clouds that take it: EC2's 16 KB ("User data
/// is limited to 16 KB", EC2 API reference, `RunInstances`); DigitalOcean allows 64 KiB
/// (`user_data` in its OpenAPI description), Lambda 1 MB (`user_data` in its OpenAPI).
pub const MAX_USER_DATA_BYTES: usize = 16 * 1024;

/// Where the boot script's output goes on the instance (also in cloud-init's own
/// `/var/log/cloud-init-output.log`).
pub const BOOT_LOG_PATH: &str = "/var/log/gpuprov-boot.log";

/// A YAML double-quoted scalar. JSON string syntax is a subset of YAML's double-quoted
/// style, and every value here is ASCII (paths, base64, OpenSSH keys), so the emitted
/// document is also safe for PyYAML's YAML 1.1 reader that cloud-init uses.
fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// Renders `#cloud-config` user-data (plain text; adapters that need base64 encode it
/// themselves). `ssh_authorized_keys` go to the image's default user; the boot script, if
/// any, is carried base64-encoded so no character of it can break the YAML, and run with
/// its output appended to [`BOOT_LOG_PATH`].
///
/// Errors: a key that is empty or spans lines, or a boot script that
/// [`BootScript::to_shell`] refuses.
pub fn render(
    boot: Option<&BootScript>,
    ssh_authorized_keys: &[&str],
) -> Result<String, BootScriptError> {
    let mut out = String::from("#cloud-config\n");
    if !ssh_authorized_keys.is_empty() {
        out.push_str("ssh_authorized_keys:\n");
        for (i, k) in ssh_authorized_keys.iter().enumerate() {
            let k = k.trim();
            if k.is_empty() || k.contains(['\n', '\r']) || !k.is_ascii() {
                return Err(BootScriptError::BadSshKey(i + 1));
            }
            out.push_str(&format!("  - {}\n", q(k)));
        }
    }
    if let Some(b) = boot {
        let shell = b.to_shell()?;
        let b64 = base64::engine::general_purpose::STANDARD.encode(gzip(shell.as_bytes()));
        out.push_str("write_files:\n");
        out.push_str(&format!("  - path: {}\n", q(BOOT_SCRIPT_PATH)));
        out.push_str("    owner: \"root:root\"\n    permissions: \"0700\"\n");
        out.push_str(&format!(
            "    encoding: \"gz+b64\"\n    content: {}\n",
            q(&b64)
        ));
        out.push_str("runcmd:\n");
        let cmd = format!("{BOOT_SCRIPT_PATH} >>{BOOT_LOG_PATH} 2>&1");
        out.push_str(&format!("  - [\"/bin/sh\", \"-c\", {}]\n", q(&cmd)));
    }
    Ok(out)
}

/// `bytes` gzip-compressed (best compression: user data is small and sent once).
fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    // Writing to a Vec cannot fail.
    let _ = e.write_all(bytes);
    e.finish().unwrap_or_default()
}

/// The text of a `gz+b64` `write_files` content, for tests and diagnostics: `None` when
/// it is not base64 of gzip of UTF-8.
pub fn decode_gz_b64(content: &str) -> Option<String> {
    use std::io::Read as _;
    let gz = base64::engine::general_purpose::STANDARD
        .decode(content.trim())
        .ok()?;
    let mut out = String::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_string(&mut out)
        .ok()?;
    Some(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_yaml::Value;

    pub(crate) fn doc(s: &str) -> Value {
        assert!(s.starts_with("#cloud-config\n"), "{s}");
        serde_yaml::from_str(s).unwrap()
    }

    pub(crate) fn decoded_script(v: &Value) -> String {
        let f = &v["write_files"][0];
        assert_eq!(f["path"].as_str(), Some(BOOT_SCRIPT_PATH));
        assert_eq!(f["encoding"].as_str(), Some("gz+b64"));
        assert_eq!(f["permissions"].as_str(), Some("0700"));
        decode_gz_b64(f["content"].as_str().unwrap()).expect("gzip in base64")
    }

    #[test]
    fn keys_only() {
        let u = render(None, &["ssh-ed25519 AAAA x@y"]).unwrap();
        assert_eq!(
            u,
            "#cloud-config\nssh_authorized_keys:\n  - \"ssh-ed25519 AAAA x@y\"\n"
        );
        let v = doc(&u);
        assert_eq!(
            v["ssh_authorized_keys"][0].as_str(),
            Some("ssh-ed25519 AAAA x@y")
        );
        assert!(v.get("runcmd").is_none());
        assert_eq!(render(None, &[]).unwrap(), "#cloud-config\n");
    }

    #[test]
    fn bad_keys_are_rejected() {
        assert_eq!(render(None, &[""]), Err(BootScriptError::BadSshKey(1)));
        assert_eq!(
            render(None, &["ssh-ed25519 A", "a\nb"]),
            Err(BootScriptError::BadSshKey(2))
        );
    }

    #[test]
    fn boot_script_is_written_then_run() {
        let b = BootScript::new("#!/bin/sh\necho hi\n").with_env("K", "it's \"$x\"\n");
        let u = render(Some(&b), &["ssh-ed25519 AAAA"]).unwrap();
        let v = doc(&u);
        assert_eq!(decoded_script(&v), b.to_shell().unwrap());
        let run: Vec<&str> = v["runcmd"][0]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap())
            .collect();
        assert_eq!(
            run,
            [
                "/bin/sh",
                "-c",
                "/var/lib/gpuprov/boot.sh >>/var/log/gpuprov-boot.log 2>&1"
            ]
        );
        // The only top-level keys are ones cloud-init knows.
        let keys: Vec<&str> = v
            .as_mapping()
            .unwrap()
            .keys()
            .map(|k| k.as_str().unwrap())
            .collect();
        assert_eq!(keys, ["ssh_authorized_keys", "write_files", "runcmd"]);
    }

    #[test]
    fn nasty_values_survive_yaml_and_shell() {
        let mut b = BootScript::new("#!/bin/sh\n");
        for (i, v) in super::super::tests::NASTY.iter().enumerate() {
            b = b.with_env(format!("V{i}"), *v);
            b.script.push_str(&format!("printf '<%s>' \"$V{i}\"\n"));
        }
        let u = render(Some(&b), &[]).unwrap();
        assert!(u.is_ascii());
        let script = decoded_script(&doc(&u));
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .output()
            .unwrap();
        assert!(out.status.success());
        let want: String = (0..super::super::tests::NASTY.len())
            .map(|i| format!("<{}>", super::super::tests::NASTY[i]))
            .collect();
        assert_eq!(String::from_utf8(out.stdout).unwrap(), want);
    }

    #[test]
    fn invalid_boot_script_is_an_error() {
        let b = BootScript::new("true").with_env("A-B", "x");
        assert_eq!(
            render(Some(&b), &[]),
            Err(BootScriptError::BadEnvName("A-B".into()))
        );
    }
}
