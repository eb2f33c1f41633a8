//! Where DigitalOcean's token is read: the environment, then doctl's configuration file.

use std::path::PathBuf;

use super::{ACCESS_TOKEN_ENV, TOKEN_ENV};
use crate::provider::kit::{Credential, Lookup};

/// Where doctl keeps its configuration: `<config dir>/doctl/config.yaml`, the config dir
/// being Go's `os.UserConfigDir` (`$XDG_CONFIG_HOME` or `~/.config` on Linux,
/// `~/Library/Application Support` on macOS), which `dirs::config_dir` mirrors.
pub fn doctl_config_paths() -> Vec<PathBuf> {
    dirs::config_dir()
        .map(|d| vec![d.join("doctl").join("config.yaml")])
        .unwrap_or_default()
}

/// The token and where it was found: `DIGITALOCEAN_TOKEN`, then
/// `DIGITALOCEAN_ACCESS_TOKEN` (through `env`), then the first of `config_files` holding
/// one (see [`token_from_doctl_config`]); and every place looked at, in that order.
pub fn find_token(
    env: impl Fn(&str) -> Option<String>,
    config_files: &[PathBuf],
) -> (Option<Credential>, Vec<String>) {
    let lookup = Lookup::new()
        .env_value(TOKEN_ENV, env(TOKEN_ENV))
        .env_value(ACCESS_TOKEN_ENV, env(ACCESS_TOKEN_ENV));
    config_files
        .iter()
        .fold(lookup, |l, p| l.file(Some(p), token_from_doctl_config))
        .finish()
}

/// The token in the text of doctl's `config.yaml`: the top-level `access-token` when the
/// `context` is absent or `default`, else the context's entry under `auth-contexts`.
/// doctl writes this file flat (viper): top-level `key: value` lines and one indented map.
pub fn token_from_doctl_config(text: &str) -> Option<String> {
    let unquote = |v: &str| {
        let v = v.trim();
        v.strip_prefix('"')
            .and_then(|s| s.strip_suffix('"'))
            .or_else(|| v.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')))
            .unwrap_or(v)
            .to_string()
    };
    let mut top = std::collections::BTreeMap::new();
    let mut contexts = std::collections::BTreeMap::new();
    let mut in_contexts = false;
    for line in text.lines() {
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let indented = line.starts_with(' ') || line.starts_with('\t');
        let Some((k, v)) = line.trim().split_once(':') else {
            continue;
        };
        if indented {
            if in_contexts {
                contexts.insert(unquote(k), unquote(v));
            }
        } else {
            in_contexts = k.trim() == "auth-contexts";
            top.insert(k.trim().to_string(), unquote(v));
        }
    }
    let token = match top.get("context").map(String::as_str) {
        None | Some("") | Some("default") => top.get("access-token").cloned(),
        Some(ctx) => contexts.get(ctx).cloned(),
    };
    token.filter(|t| !t.is_empty())
}
