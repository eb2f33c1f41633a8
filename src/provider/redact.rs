//! Redaction: how a credential is held so that it never reaches state, plan files, logs
//! or errors. One place for the whole crate: adapters hold credentials in [`Secret`],
//! scrub what a server echoes with [`scrub`], and show URLs through [`redact_url`];
//! `plan` shows endpoint overrides through the same function.

use std::fmt;

/// A credential (API key, token, client secret) held by an adapter; its `Debug` never
/// shows the value, so settings can be logged and errors formatted without leaking it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }
    /// The value, for the one place that sends it (an auth header).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(REDACTED)")
    }
}

/// The marker that replaces a secret in text.
pub const REDACTED: &str = "REDACTED";

/// `text` with every occurrence of each non-empty secret replaced by `REDACTED`, in case a
/// server echoes a credential back (some error pages quote the request's headers).
pub fn scrub<'a>(text: &str, secrets: impl IntoIterator<Item = &'a str>) -> String {
    let mut out = text.to_string();
    for s in secrets.into_iter().filter(|s| !s.is_empty()) {
        out = out.replace(s, REDACTED);
    }
    out
}

/// Replaces the userinfo of a URL (`https://user:secret@host`) so no credential is shown.
pub fn redact_url(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if let Some(at) = authority.rfind('@') {
            return format!("{scheme}://{REDACTED}@{}{path}", &authority[at + 1..]);
        }
    }
    url.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_scrubbed_and_hidden_from_debug() {
        let s = Secret::new("sk_live_1");
        assert_eq!(format!("{s:?}"), "Secret(REDACTED)");
        assert_eq!(
            scrub("bad key sk_live_1 (sk_live_1)", [s.expose(), ""]),
            "bad key REDACTED (REDACTED)"
        );
        assert_eq!(scrub("nothing", []), "nothing");
    }

    #[test]
    fn urls_lose_their_userinfo_only() {
        assert_eq!(
            redact_url("https://u:p@api.example/v1?x=1"),
            "https://REDACTED@api.example/v1?x=1"
        );
        assert_eq!(
            redact_url("http://127.0.0.1:9/a@b"),
            "http://127.0.0.1:9/a@b"
        );
        assert_eq!(redact_url("not a url"), "not a url");
    }
}
