//! Where RunPod's API key is found: `RUNPOD_API_KEY`, else the RunPod CLIs'
//! `~/.runpod/config.toml`.

use std::path::Path;

use super::{ApiKey, API_KEY_ENV, CONFIG_FILE};

/// The API key in a RunPod CLI configuration file's text: top-level `apiKey` (runpodctl;
/// its keys are case-insensitive), else `api_key` of the `[default]` profile
/// (runpod-python's `runpod config`). `None` when the text is not TOML or holds neither.
pub fn api_key_from_config(text: &str) -> Option<String> {
    let table: toml::Table = text.parse().ok()?;
    let str_of = |v: &toml::Value| {
        v.as_str()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    table
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("apikey"))
        .and_then(|(_, v)| str_of(v))
        .or_else(|| {
            table
                .get("default")
                .and_then(|d| d.get("api_key"))
                .and_then(str_of)
        })
}

/// The API key and where it came from: `env_value` (the value of `RUNPOD_API_KEY`) when
/// non-empty, else `<home>/.runpod/config.toml` (through
/// [`find_key`](crate::provider::kit::settings::find_key)). Without a key,
/// the source names every place looked at. Never puts the key (or file text that may
/// hold it) in the source.
pub fn find_api_key(env_value: Option<String>, home: Option<&Path>) -> (Option<ApiKey>, String) {
    let file = home.map(|h| h.join(CONFIG_FILE));
    crate::provider::kit::settings::find_key(
        API_KEY_ENV,
        env_value,
        file.as_deref(),
        api_key_from_config,
    )
}
