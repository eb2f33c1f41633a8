//! The settings and credential plumbing the API-key adapters share, so an adapter
//! declares only its constants (cloud name, endpoint and key variables, the vendor's
//! configuration file) and its vendor-specific bits (how that file holds the key, the
//! "no key" message):
//!
//! - [`find_key`]: the key from its environment variable, else the vendor's file, and
//!   where it was found (or every place looked at);
//! - [`Adapter::with_key`]: the adapter's self-description holding its settings' key and
//!   the place it was found, and the credential its REST client sends.
//!
//! The endpoint precedence (`GPUPROV_<CLOUD>_ENDPOINT` > `[cloud.NAME] endpoint` > the
//! default) is [`crate::provider::endpoint_from`].

use std::path::Path;

use super::super::Secret;
use super::adapter::Adapter;
use super::credentials::{Credential, Lookup, Source};

/// An API key and where it came from: the value of `env` (given as `env_value`, so tests
/// pass it explicitly) when not blank, else the file at `file` (when given and readable)
/// with the key extracted by `parse` (the vendor format). Without a key, the place names
/// every place looked at, comma-separated. Never puts the key (or file text) in the place.
pub fn find_key(
    env: &'static str,
    env_value: Option<String>,
    file: Option<&Path>,
    parse: fn(&str) -> Option<String>,
) -> (Option<Secret>, String) {
    Lookup::new()
        .env_value(env, env_value)
        .file(file, parse)
        .place()
}

impl Adapter {
    /// This adapter holding the API key `key` of its settings, found at `key_source` (or,
    /// without a key, every place looked at, which the `validate` report lists), and the
    /// credential its REST client sends. Does no I/O.
    pub fn with_key(self, key: Option<&Secret>, key_source: &str) -> (Adapter, Option<Credential>) {
        let credential = Credential::found(key, Source::Other(key_source.to_string()));
        let adapter = self.with_credential(credential.as_ref(), &[key_source.to_string()]);
        (adapter, credential)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::kit::CredentialReport;
    use crate::provider::{Capabilities, Lineage};

    #[test]
    fn the_key_comes_from_the_variable_else_the_file_and_says_where() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config");
        std::fs::write(&file, "key=from-file\n").unwrap();
        let parse: fn(&str) -> Option<String> = |t| t.strip_prefix("key=").map(str::to_string);
        let (k, place) = find_key("ACME_KEY", Some(" from-env ".into()), Some(&file), parse);
        assert_eq!(k.unwrap().expose(), "from-env");
        assert_eq!(place, "the ACME_KEY environment variable");
        let (k, place) = find_key("ACME_KEY", Some("  ".into()), Some(&file), parse);
        assert_eq!(k.unwrap().expose(), "from-file");
        assert_eq!(place, file.display().to_string());
        let gone = dir.path().join("nowhere");
        let (k, place) = find_key("ACME_KEY", None, Some(&gone), parse);
        assert!(k.is_none());
        assert_eq!(
            place,
            format!("the ACME_KEY environment variable, {}", gone.display())
        );
    }

    #[test]
    fn an_adapter_with_a_key_reports_where_it_is_or_every_place_looked_at() {
        let lineage = Lineage::parse("0f0e0d0c-1111-4222-8333-444455556666").unwrap();
        let key = Secret::new("sk-test");
        let caps = Capabilities::default();
        let (a, c) = Adapter::new("acme", Some("http://u:p@127.0.0.1:1/"), caps.clone())
            .with_lineage(&lineage)
            .with_key(Some(&key), "the ACME_KEY environment variable");
        assert_eq!(a.name(), "acme");
        assert!(!a.endpoint_override().unwrap().contains("u:p"));
        assert_eq!(
            a.credentials(),
            CredentialReport::Found("the ACME_KEY environment variable".into())
        );
        assert_eq!(a.lineage().unwrap(), &lineage);
        assert_eq!(c.unwrap().secret.expose(), "sk-test");
        let (a, c) = Adapter::new("acme", None, caps).with_key(None, "a, b");
        assert!(c.is_none());
        assert_eq!(
            a.credentials(),
            CredentialReport::Missing(vec!["a, b".into()])
        );
    }
}
