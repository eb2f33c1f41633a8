//! Massed Compute's errors as data (design 4.1): the error body decoder and the table that
//! classifies a [`Failure`] into the contract's kinds.
//!
//! The vendor's description documents success responses only (SOURCES.md, Massed
//! Compute: "Errors / rate limits / capacity / quota: not documented"). What is known
//! comes from a maintained client of the API, brevdev/cloud
//! (`v1/providers/massedcompute/errors.go`, `wrapMassedComputeError`): 429 and 5xx are
//! retryable, a body that says "capacity" or "out of stock" is insufficient resources,
//! "quota" or "limit exceeded" is out of quota; and its `instance.go` treats a 404 on
//! terminate as already gone. The phrases are only looked for in a JSON body (the
//! vendor's own answer, which the decoder marks with an empty code), never in a proxy's
//! page, and anything else is `Failed`: an unknown error is never taken for capacity.
//!
//! The kit's defaults cover the rest: no response → `Transient`, a refused connection →
//! `Unreachable`, 429 → `Transient` with `Retry-After`, 5xx → `Transient`, 401/403 →
//! `Credentials`.

use serde_json::Value;

use crate::provider::kit::failure::{clip, Classifier, Rule};
use crate::provider::{cause, ErrorKind};

/// Phrases of a capacity refusal (brevdev/cloud `errors.go`).
const CAPACITY: &[&str] = &["capacity", "out of stock"];
/// Phrases of a quota refusal (brevdev/cloud `errors.go`).
const QUOTA: &[&str] = &["quota", "limit exceeded"];

/// The call name of the project key's registration by its shared node (`create_shared`):
/// a conflict there means the key exists.
pub const REGISTER_KEY: &str = "register_key";

/// What the user can do about a `Credentials` error.
const CHECK_KEY: &str = "check the API token in MASSED_COMPUTE_API_KEY (or the massed-compute \
                         MCP's config.json) and the account's billing";

/// The vendor's table, first match wins (the kit's defaults follow it).
const RULES: &[Rule] = &[
    // brevdev/cloud retries every 5xx before it looks at the words.
    Rule {
        status: Some((500, 599)),
        ..Rule::new(ErrorKind::Transient)
    },
    // A key registration refused as a conflict. The description documents no error for
    // `POST /ssh-keys` (none at all, see above) and brevdev/cloud does not handle one, so
    // there is no conflict body to read: HTTP's own conflict status, 409, is taken to
    // mean the key (or its name) exists, and the shared node observes again and adopts
    // it by value. Any other refusal keeps its kind.
    Rule::status(409, ErrorKind::Exists).on(REGISTER_KEY),
    // Payment required: nothing this account launches will succeed until it is topped up.
    Rule::status(402, ErrorKind::Credentials).help("add funds to the Massed Compute account"),
    // brevdev/cloud checks capacity before quota; so does this table.
    Rule::code("*", ErrorKind::Capacity).phrases(CAPACITY),
    Rule::code("*", ErrorKind::Quota).phrases(QUOTA),
    // A request about an object that is not there (delete and terminate test for it
    // first: there it is success).
    Rule::status(404, ErrorKind::InvalidRequest),
];

/// Massed Compute's classifier.
pub static CLASSIFIER: Classifier = Classifier {
    cloud: super::CLOUD,
    rules: RULES,
    credentials_help: CHECK_KEY,
};

/// The error body decoder: a JSON body is the vendor's (empty code) and its message is
/// the first of `message`, `error`, `detail`, `response` that is a string (else the body,
/// cut to 300 characters); any other body is one short line
/// ([`cause::http_cause`]) without a code.
pub fn decode(status: u16, content_type: Option<&str>, body: &str) -> (Option<String>, String) {
    let Ok(v) = serde_json::from_str::<Value>(body) else {
        return (None, cause::http_cause(status, content_type, body));
    };
    let text = ["message", "error", "detail", "response"]
        .iter()
        .find_map(|k| v.get(*k).and_then(Value::as_str))
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string());
    let text = clip(&text);
    (Some(String::new()), format!("HTTP {status}: {text}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::kit::failure::Failure;
    use crate::provider::kit::testing::proxy_page;
    use crate::provider::kit::Call;

    fn kind(status: u16, body: &str) -> ErrorKind {
        let (code, message) = decode(status, Some("application/json"), body);
        CLASSIFIER
            .classify(&Failure::http(status, code, message), Call::other("x"), [])
            .kind
    }

    #[test]
    fn capacity_and_quota_come_from_the_vendors_words() {
        use ErrorKind::*;
        assert_eq!(kind(400, r#"{"message":"Not enough capacity"}"#), Capacity);
        assert_eq!(
            kind(409, r#"{"error":"Product is out of stock"}"#),
            Capacity
        );
        assert_eq!(kind(400, r#"{"message":"GPU quota reached"}"#), Quota);
        assert_eq!(kind(403, r#"{"message":"instance limit exceeded"}"#), Quota);
        assert_eq!(kind(402, r#"{"message":"Payment required"}"#), Credentials);
        assert_eq!(
            kind(404, r#"{"message":"no such instance"}"#),
            InvalidRequest
        );
    }

    #[test]
    fn an_unknown_error_is_never_capacity() {
        use ErrorKind::*;
        assert_eq!(kind(400, r#"{"message":"imageId is invalid"}"#), Failed);
        assert_eq!(kind(409, r#"{"oops":1}"#), Failed);
        // The word in a proxy's page is not the vendor's.
        let (code, message) = decode(502, Some("text/html"), "<h1>capacity</h1>");
        assert_eq!(code, None);
        let f = Failure::http(400, code, message);
        assert_eq!(CLASSIFIER.classify(&f, Call::other("x"), []).kind, Failed);
        assert_eq!(
            kind(503, r#"{"message":"no capacity"}"#),
            Transient,
            "5xx first"
        );
        assert_eq!(kind(503, r#"{"message":"down"}"#), Transient);
        assert_eq!(kind(401, r#"{"message":"bad token"}"#), Credentials);
    }

    #[test]
    fn a_conflict_on_the_key_registration_means_it_exists() {
        let kind_on = |status: u16, body: &str, call: &'static str| {
            let (code, message) = decode(status, Some("application/json"), body);
            CLASSIFIER
                .classify(
                    &Failure::http(status, code, message),
                    Call::named(call, "x"),
                    [],
                )
                .kind
        };
        let taken = r#"{"message":"SSH key already exists"}"#;
        assert_eq!(kind_on(409, taken, REGISTER_KEY), ErrorKind::Exists);
        assert_eq!(kind_on(409, taken, "other"), ErrorKind::Failed);
        assert_eq!(
            kind_on(400, r#"{"message":"bad key"}"#, REGISTER_KEY),
            ErrorKind::Failed
        );
    }

    #[test]
    fn bodies_become_one_short_line() {
        let (code, m) = decode(502, Some("text/html"), &proxy_page());
        assert_eq!(
            (code, m.as_str()),
            (None, "HTTP 502 (text/html): 502 Bad Gateway")
        );
        let (code, m) = decode(
            400,
            None,
            &format!(r#"{{"message":"{}"}}"#, "x".repeat(999)),
        );
        assert_eq!(code.as_deref(), Some(""));
        assert!(m.len() < 320, "{m}");
        assert!(Failure::http(404, None, "").is_not_found());
    }
}
