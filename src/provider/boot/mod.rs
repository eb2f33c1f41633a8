//! The boot script model of the provider contract: [`BootScript`] (shell text plus
//! environment) and its renderers, so the core never sees a cloud format (design 4.5):
//!
//! - [`BootScript::to_shell`]: one self-contained shell file, for clouds that take a
//!   startup script (Verda);
//! - [`cloud_init`]: the same shell form as cloud-init `#cloud-config` user-data, for
//!   clouds that take it (AWS, Lambda, DigitalOcean, Hyperstack, GCP, Nebius).
//!
//! The k3s layer (`cluster/`) builds a `BootScript`; adapters render it.

pub mod cloud_init;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::{ErrorKind, ProviderError};

/// A boot script: shell text plus environment, rendered by each adapter in its own
/// format (cloud-init user-data or a startup script). The core never sees a cloud format.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BootScript {
    pub script: String,
    pub env: BTreeMap<String, String>,
}

/// A boot script as cloud-init `#cloud-config` user-data for the REST clouds that take it
/// (Lambda, DigitalOcean, Hyperstack), rendered by [`cloud_init::render`]. Their SSH key
/// travels through the API (a registered key), not the user-data.
///
/// Errors: [`ErrorKind::InvalidRequest`] for a boot script that cannot be rendered (an
/// environment name that is not a shell name).
pub fn cloud_init_user_data(b: &BootScript) -> Result<String, ProviderError> {
    cloud_init::render(Some(b), &[])
        .map_err(|e| ProviderError::new(ErrorKind::InvalidRequest, format!("boot script: {e}")))
}

/// Why a boot script cannot be rendered. Carries names, never values (a value could be
/// anything the caller put in the environment).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BootScriptError {
    #[error(
        "boot script environment name `{0}` is not a shell variable name ([A-Za-z_][A-Za-z0-9_]*)"
    )]
    BadEnvName(String),
    #[error("boot script environment value of `{0}` contains a NUL byte, which no shell can hold")]
    NulInValue(String),
    #[error("the boot script contains a NUL byte")]
    NulInScript,
    #[error("SSH public key number {0} must be one non-empty line")]
    BadSshKey(usize),
}

/// Quotes `s` as one POSIX shell word: single quotes, with each `'` written as `'\''`.
/// Inside single quotes the shell expands nothing (`$`, `` ` ``, `\`, newlines are
/// literal; POSIX.1-2017 XCU 2.2.2), so the word is exactly `s`.
pub fn shell_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        if c == '\'' {
            out.push_str(r"'\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

fn is_shell_name(k: &str) -> bool {
    let mut chars = k.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl BootScript {
    /// A boot script with no environment.
    pub fn new(script: impl Into<String>) -> BootScript {
        BootScript {
            script: script.into(),
            env: Default::default(),
        }
    }

    /// Adds (or replaces) one environment variable.
    pub fn with_env(mut self, name: impl Into<String>, value: impl Into<String>) -> BootScript {
        self.env.insert(name.into(), value.into());
        self
    }

    /// Checks that every name is a shell variable name and that no value or the script
    /// holds a NUL byte.
    pub fn validate(&self) -> Result<(), BootScriptError> {
        for (k, v) in &self.env {
            if !is_shell_name(k) {
                return Err(BootScriptError::BadEnvName(k.clone()));
            }
            if v.contains('\0') {
                return Err(BootScriptError::NulInValue(k.clone()));
            }
        }
        if self.script.contains('\0') {
            return Err(BootScriptError::NulInScript);
        }
        Ok(())
    }

    /// The script as one self-contained shell file: the script's own `#!` line (else
    /// `#!/bin/sh`), `set -eu`, one `export NAME='value'` per variable in name order, then
    /// the script body. Values are single-quoted ([`shell_quote`]), so quotes, newlines,
    /// `$` and backquotes arrive verbatim.
    ///
    /// Errors: see [`BootScript::validate`].
    pub fn to_shell(&self) -> Result<String, BootScriptError> {
        self.validate()?;
        let (shebang, body) = match self.script.strip_prefix("#!") {
            Some(rest) => {
                let (line, body) = rest.split_once('\n').unwrap_or((rest, ""));
                (format!("#!{}", line.trim_end()), body)
            }
            None => ("#!/bin/sh".to_string(), self.script.as_str()),
        };
        let mut out = shebang;
        out.push_str("\n# Rendered by gpuprov: environment first, then the script.\nset -eu\n");
        for (k, v) in &self.env {
            out.push_str(&format!("export {k}={}\n", shell_quote(v)));
        }
        out.push_str(body);
        if !out.ends_with('\n') {
            out.push('\n');
        }
        Ok(out)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::process::Command;

    /// Values that break naive quoting.
    pub(crate) const NASTY: &[&str] = &[
        "",
        "plain",
        "it's",
        "'",
        "''",
        "\"double\"",
        "a\nb\n",
        "\n",
        "$HOME ${HOME} $(echo pwned) `echo pwned`",
        "back\\slash\\",
        "tab\there",
        "*?[a-z]",
        "~root",
        "; rm -rf / #",
        "ünïcødé ✓",
        "\r\n",
        "-n",
        "trailing space ",
    ];

    fn printing_script() -> BootScript {
        // Prints every variable between markers, so the test sees exact bytes, including
        // trailing newlines.
        let mut script = String::from("#!/bin/sh\n");
        let mut b = BootScript::default();
        for (i, v) in NASTY.iter().enumerate() {
            let name = format!("V{i}");
            script.push_str(&format!("printf '<%s>' \"${name}\"\n"));
            b = b.with_env(name, *v);
        }
        b.script = script;
        b
    }

    fn expected_output(b: &BootScript) -> String {
        // printf prints in the script's order (by index), not the env's name order.
        (0..NASTY.len())
            .map(|i| format!("<{}>", b.env[&format!("V{i}")]))
            .collect()
    }

    #[test]
    fn values_round_trip_through_sh() {
        let b = printing_script();
        let text = b.to_shell().unwrap();
        let out = Command::new("sh").arg("-c").arg(&text).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8(out.stdout).unwrap(), expected_output(&b));
    }

    #[test]
    fn shape_of_the_shell_form() {
        let b = BootScript::new("#!/bin/bash -x\necho hi")
            .with_env("B", "2")
            .with_env("A", "it's");
        assert_eq!(
            b.to_shell().unwrap(),
            "#!/bin/bash -x\n# Rendered by gpuprov: environment first, then the script.\n\
             set -eu\nexport A='it'\\''s'\nexport B='2'\necho hi\n"
        );
        let no_shebang = BootScript::new("true\n").to_shell().unwrap();
        assert!(no_shebang.starts_with("#!/bin/sh\n"), "{no_shebang}");
        assert!(no_shebang.ends_with("set -eu\ntrue\n"), "{no_shebang}");
    }

    #[test]
    fn set_eu_stops_on_error_and_unset_variables() {
        let failing = BootScript::new("false\necho after").to_shell().unwrap();
        let out = Command::new("sh").arg("-c").arg(&failing).output().unwrap();
        assert!(!out.status.success());
        assert!(out.stdout.is_empty());
        let unset = BootScript::new("echo \"$GPUPROV_SURELY_UNSET\"")
            .to_shell()
            .unwrap();
        let out = Command::new("sh").arg("-c").arg(&unset).output().unwrap();
        assert!(!out.status.success());
    }

    #[test]
    fn bad_names_and_nul_are_rejected() {
        for bad in ["", "1A", "A-B", "A B", "A=B", "$A", "Ä"] {
            assert_eq!(
                BootScript::new("true").with_env(bad, "x").to_shell(),
                Err(BootScriptError::BadEnvName(bad.into())),
                "{bad:?}"
            );
        }
        assert_eq!(
            BootScript::new("true").with_env("A", "x\0y").to_shell(),
            Err(BootScriptError::NulInValue("A".into()))
        );
        assert_eq!(
            BootScript::new("a\0").to_shell(),
            Err(BootScriptError::NulInScript)
        );
        for ok in ["_", "A", "a_1", "_X9"] {
            assert!(BootScript::new("true").with_env(ok, "x").to_shell().is_ok());
        }
    }

    #[test]
    fn shell_quote_is_one_word() {
        for v in NASTY {
            let out = Command::new("sh")
                .arg("-c")
                .arg(format!("printf '%s|' {}", shell_quote(v)))
                .output()
                .unwrap();
            assert_eq!(String::from_utf8(out.stdout).unwrap(), format!("{v}|"));
        }
    }

    #[test]
    fn serde_format_is_unchanged() {
        // The journal persists InstanceSpec (with its boot script): field names are
        // part of the state format.
        let b = BootScript::new("x").with_env("K", "v");
        let j = serde_json::to_value(&b).unwrap();
        assert_eq!(j, serde_json::json!({"script": "x", "env": {"K": "v"}}));
        let back: BootScript = serde_json::from_value(j).unwrap();
        assert_eq!(back, b);
    }

    #[test]
    fn cloud_init_user_data_carries_the_boot_script() {
        let b = BootScript {
            script: "echo hi".into(),
            env: [("K".to_string(), "it's".to_string())].into(),
        };
        let u = cloud_init_user_data(&b).unwrap();
        assert!(u.starts_with("#cloud-config\n"), "{u}");
        assert!(
            !u.contains("ssh_authorized_keys"),
            "the key goes through the API"
        );
        let doc: serde_yaml::Value = serde_yaml::from_str(&u).unwrap();
        let content = doc["write_files"][0]["content"].as_str().unwrap();
        assert_eq!(
            cloud_init::decode_gz_b64(content).unwrap(),
            b.to_shell().unwrap()
        );
        let bad = BootScript {
            script: "true".into(),
            env: [("NOT A NAME".to_string(), "x".to_string())].into(),
        };
        assert_eq!(
            cloud_init_user_data(&bad).unwrap_err().kind,
            ErrorKind::InvalidRequest
        );
    }
}
