//! cloud-init user-data for EC2: the project's public key for the default user, and the
//! boot script (when there is one) written to disk and run once at first boot.

use base64::Engine as _;

use crate::provider::BootScript;

/// Where the boot script is written on the instance.
pub const BOOT_SCRIPT_PATH: &str = "/var/lib/gpuprov/boot.sh";

/// Renders `#cloud-config` user-data (plain text; the caller base64-encodes it for
/// `RunInstances`). Strings are emitted as JSON strings, which YAML reads verbatim, so
/// no value can break the document.
///
/// Errors: a public key that is empty or spans several lines.
pub fn render(ssh_public_key: &str, boot: Option<&BootScript>) -> Result<String, String> {
    let key = ssh_public_key.trim();
    if key.is_empty() || key.contains('\n') {
        return Err("the SSH public key must be one non-empty line".into());
    }
    let q = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into());
    let mut out = String::from("#cloud-config\n");
    out.push_str(&format!("ssh_authorized_keys:\n  - {}\n", q(key)));
    if let Some(b) = boot {
        let mut script = String::from("#!/bin/bash\nset -euo pipefail\n");
        for (k, v) in &b.env {
            if !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') || k.is_empty() {
                return Err(format!("boot script env name {k:?} is not a shell name"));
            }
            script.push_str(&format!("export {k}='{}'\n", v.replace('\'', r"'\''")));
        }
        script.push_str(&b.script);
        let b64 = base64::engine::general_purpose::STANDARD.encode(script);
        out.push_str(&format!(
            "write_files:\n  - path: {}\n    permissions: '0755'\n    encoding: b64\n    content: {}\n",
            q(BOOT_SCRIPT_PATH),
            q(&b64)
        ));
        out.push_str(&format!("runcmd:\n  - [bash, {}]\n", q(BOOT_SCRIPT_PATH)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_only() {
        let u = render("ssh-ed25519 AAAA x@y", None).unwrap();
        assert_eq!(
            u,
            "#cloud-config\nssh_authorized_keys:\n  - \"ssh-ed25519 AAAA x@y\"\n"
        );
        assert!(render("", None).is_err());
        assert!(render("a\nb", None).is_err());
    }

    #[test]
    fn boot_script_is_written_and_run() {
        let b = BootScript {
            script: "echo hi\n".into(),
            env: [("K".to_string(), "it's".to_string())].into(),
        };
        let u = render("ssh-ed25519 AAAA", Some(&b)).unwrap();
        assert!(u.contains("write_files:") && u.contains("runcmd:"), "{u}");
        let b64 = u
            .lines()
            .find_map(|l| l.trim().strip_prefix("content: "))
            .unwrap()
            .trim_matches('"');
        let script = String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap(),
        )
        .unwrap();
        assert!(script.contains("export K='it'\\''s'"), "{script}");
        assert!(script.ends_with("echo hi\n"));
    }
}
