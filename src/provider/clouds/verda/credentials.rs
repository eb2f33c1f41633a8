//! Where Verda's OAuth2 client credentials are found: the environment, else a profile of
//! the vendor CLI's credentials file (repo verda-cloud/verda-cli,
//! `internal/verda-cli/cmd/auth/README.md`).

use std::path::{Path, PathBuf};

use super::{CLIENT_ID_ENV, CLIENT_SECRET_ENV};
use crate::provider::kit::{Lookup, Source};
use crate::provider::Secret;

/// The client id and secret of `profile` in the text of a credentials file (an INI file
/// with `verda_client_id` / `verda_client_secret` per profile section); `None` unless both
/// are there.
pub fn client_from_credentials_file(text: &str, profile: &str) -> Option<(String, String)> {
    let ini = ini::Ini::load_from_str(text).ok()?;
    let section = ini.section(Some(profile))?;
    let get = |k: &str| {
        section
            .get(k)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    Some((get("verda_client_id")?, get("verda_client_secret")?))
}

/// The client credentials and where they came from: `VERDA_CLIENT_ID` and
/// `VERDA_CLIENT_SECRET` (`env_id`, `env_secret`) when both are set, else `profile` of the
/// credentials file at `file`. Without them, the place names everywhere looked.
pub fn find_client(
    env_id: Option<String>,
    env_secret: Option<String>,
    file: Option<&Path>,
    profile: &str,
) -> (Option<(String, Secret)>, String) {
    let env_id = env_id
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty());
    let from_file = |text: &str| client_from_credentials_file(text, profile).map(|c| c.1);
    let (found, looked) = Lookup::new()
        .env_value(CLIENT_SECRET_ENV, env_secret.filter(|_| env_id.is_some()))
        .file(file, from_file)
        .finish();
    let id = match found.as_ref().map(|c| &c.source) {
        Some(Source::Env(_)) => env_id,
        Some(Source::File(p)) => std::fs::read_to_string(p)
            .ok()
            .and_then(|t| client_from_credentials_file(&t, profile))
            .map(|c| c.0),
        _ => None,
    };
    match (found, id) {
        (Some(c), Some(id)) => (
            Some((id, c.secret)),
            match &c.source {
                Source::File(p) => format!("{} (profile {profile})", p.display()),
                _ => format!("the {CLIENT_ID_ENV} and {CLIENT_SECRET_ENV} environment variables"),
            },
        ),
        _ => {
            let mut places = vec![format!(
                "the {CLIENT_ID_ENV} and {CLIENT_SECRET_ENV} environment variables"
            )];
            places.extend(
                looked
                    .into_iter()
                    .skip(1)
                    .map(|p| format!("{p} (profile {profile})")),
            );
            (None, places.join(", "))
        }
    }
}

/// The vendor CLI's credentials file: `VERDA_SHARED_CREDENTIALS_FILE`, else
/// `$VERDA_HOME/credentials`, else `~/.verda/credentials`.
pub fn credentials_file(
    file_env: Option<String>,
    home_env: Option<String>,
    home: Option<&Path>,
) -> Option<PathBuf> {
    let nonblank = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
    nonblank(file_env).map(PathBuf::from).or_else(|| {
        nonblank(home_env)
            .map(PathBuf::from)
            .or_else(|| home.map(|h| h.join(".verda")))
            .map(|d| d.join("credentials"))
    })
}
