//! A credential plus where it was found, and the report `gpuprov validate` prints per
//! cloud: found where (never the value), or every place looked at.

use std::fmt;
use std::path::{Path, PathBuf};

use super::super::redact::Secret;

/// Where a credential was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// An environment variable.
    Env(&'static str),
    /// A vendor CLI's configuration file.
    File(PathBuf),
    /// Anything else (the AWS SDK's chain, an instance metadata server), described.
    Other(String),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Env(v) => write!(f, "the {v} environment variable"),
            Source::File(p) => write!(f, "{}", p.display()),
            Source::Other(s) => f.write_str(s),
        }
    }
}

/// A secret and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub secret: Secret,
    pub source: Source,
}

impl Credential {
    /// The credential `secret` found at `source`, when one was found (settings carry the
    /// secret and describe its place apart).
    pub fn found(secret: Option<&Secret>, source: Source) -> Option<Credential> {
        secret.map(|s| Credential {
            secret: s.clone(),
            source,
        })
    }
}

/// What one adapter found, for `gpuprov validate` (design: "credentials() report").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialReport {
    /// The cloud needs no credential (the local Docker cloud).
    NotNeeded(String),
    /// Found, at this place.
    Found(String),
    /// Not found; every place looked at, in lookup order.
    Missing(Vec<String>),
}

impl CredentialReport {
    /// The report for an adapter that holds `credential`, having looked at `looked_in`.
    pub fn of(credential: Option<&Credential>, looked_in: &[String]) -> CredentialReport {
        match credential {
            Some(c) => CredentialReport::Found(c.source.to_string()),
            None => CredentialReport::Missing(looked_in.to_vec()),
        }
    }

    pub fn is_missing(&self) -> bool {
        matches!(self, CredentialReport::Missing(_))
    }
}

/// A credential lookup: the places are tried in order, the first non-empty value wins,
/// and every place tried is remembered for the "looked in" list.
#[derive(Debug, Default)]
pub struct Lookup {
    looked: Vec<String>,
    found: Option<Credential>,
}

impl Lookup {
    pub fn new() -> Lookup {
        Lookup::default()
    }

    /// Environment variable `name` (trimmed, non-blank).
    pub fn env(self, name: &'static str) -> Lookup {
        self.env_value(name, std::env::var(name).ok())
    }

    /// Environment variable `name` with the value given (tests pass it explicitly).
    pub fn env_value(mut self, name: &'static str, value: Option<String>) -> Lookup {
        self.looked.push(Source::Env(name).to_string());
        if self.found.is_none() {
            if let Some(v) = value
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
            {
                self.found = Some(Credential {
                    secret: Secret::new(v),
                    source: Source::Env(name),
                });
            }
        }
        self
    }

    /// The file at `path` when it exists, its secret extracted by `parse`.
    pub fn file(
        mut self,
        path: Option<&Path>,
        parse: impl FnOnce(&str) -> Option<String>,
    ) -> Lookup {
        let Some(path) = path else {
            return self;
        };
        self.looked.push(path.display().to_string());
        if self.found.is_none() {
            if let Ok(text) = std::fs::read_to_string(path) {
                if let Some(v) = parse(&text)
                    .map(|v| v.trim().to_string())
                    .filter(|v| !v.is_empty())
                {
                    self.found = Some(Credential {
                        secret: Secret::new(v),
                        source: Source::File(path.to_path_buf()),
                    });
                }
            }
        }
        self
    }

    /// The credential found (if any) and every place looked at.
    pub fn finish(self) -> (Option<Credential>, Vec<String>) {
        (self.found, self.looked)
    }

    /// The secret found and where, or `None` and every place looked at, comma-separated:
    /// the pair an adapter's settings keep (never the secret in the place).
    pub fn place(self) -> (Option<Secret>, String) {
        match self.found {
            Some(c) => (Some(c.secret), c.source.to_string()),
            None => (None, self.looked.join(", ")),
        }
    }
}

/// The string field `key` of a JSON configuration file's text (a vendor CLI's
/// `config.json`); `None` when the text is not JSON or the field is not a string.
pub fn json_field(text: &str, key: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    v.get(key).and_then(|f| f.as_str()).map(str::to_string)
}

/// "looked in: A, B" for a missing-credential message.
pub fn looked_in(places: &[String]) -> String {
    format!("looked in: {}", places.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_place_with_a_value_wins_and_every_place_is_listed() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.toml");
        std::fs::write(&file, "apikey = \"from-file\"\n").unwrap();
        let parse = |t: &str| t.split('"').nth(1).map(str::to_string);

        let (c, looked) = Lookup::new()
            .env_value("ACME_KEY", Some("  ".into()))
            .file(Some(&file), parse)
            .finish();
        let c = c.unwrap();
        assert_eq!(c.secret.expose(), "from-file");
        assert_eq!(c.source, Source::File(file.clone()));
        assert_eq!(looked.len(), 2);
        assert_eq!(looked[0], "the ACME_KEY environment variable");

        let (c, _) = Lookup::new()
            .env_value("ACME_KEY", Some("k1".into()))
            .file(Some(&file), parse)
            .finish();
        assert_eq!(
            c.unwrap().source.to_string(),
            "the ACME_KEY environment variable"
        );

        let (c, looked) = Lookup::new()
            .env_value("ACME_KEY", None)
            .file(Some(&dir.path().join("absent")), parse)
            .finish();
        assert!(c.is_none());
        assert_eq!(
            json_field(r#"{"k": "v", "n": 1}"#, "k").as_deref(),
            Some("v")
        );
        assert_eq!(json_field(r#"{"n": 1}"#, "n"), None);
        assert_eq!(json_field("nope", "k"), None);
        let (s, place) = Lookup::new()
            .env_value("ACME_KEY", Some("k".into()))
            .place();
        assert_eq!(
            (s.unwrap().expose(), place.as_str()),
            ("k", "the ACME_KEY environment variable")
        );
        let report = CredentialReport::of(None, &looked);
        assert!(report.is_missing());
        assert!(
            looked_in(&looked).contains("absent"),
            "{}",
            looked_in(&looked)
        );
    }
}
