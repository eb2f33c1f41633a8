//! Verda's errors as data (design 4.1): the error body decoder and the table that
//! classifies a [`Failure`] into the contract's kinds.
//!
//! Verda answers every status of 400 and above with a JSON `{code, message}` (the Python
//! SDK's `handle_error` parses it; the Go SDK adds `details`). The codes are
//! `constants.ErrorCodes`: `invalid_request`, `unauthorized_request`, `insufficient_funds`,
//! `forbidden_action`, `not_found`, `server_error`, `service_unavailable` (SOURCES.md,
//! Verda). None of them means capacity: out of capacity shows as the instance status
//! `no_capacity` after the create was accepted (the Go SDK's `StatusNoCapacity`), which
//! `observe` reports as a late refusal (`InstanceStatus::Refused`, kind `Capacity`). A
//! create error is capacity only when the vendor's own body says so in words; anything
//! else is never taken for capacity.
//!
//! Teardown has two refusals of its own: an instance still being provisioned cannot be
//! discontinued yet (retried later: `Transient`), and one already discontinued is gone
//! (success: [`is_gone`], tested before classification).

use serde::Deserialize;

use crate::provider::kit::failure::{Classifier, Failure, Rule};
use crate::provider::{cause, ErrorKind};

/// The call name of a create (its capacity phrases count only there).
pub const CREATE: &str = "create";
/// The call name of a teardown action (its "still provisioning" refusal is transient).
pub const DELETE: &str = "delete";
/// The call name of the project key's registration by its shared node (`create_shared`):
/// a refusal there means the key exists.
pub const REGISTER_KEY: &str = "register_key";

/// `invalid_request` (400).
pub const INVALID_REQUEST: &str = "invalid_request";
/// `unauthorized_request` (401).
pub const UNAUTHORIZED: &str = "unauthorized_request";
/// `insufficient_funds` (402).
pub const INSUFFICIENT_FUNDS: &str = "insufficient_funds";
/// `forbidden_action` (403).
pub const FORBIDDEN: &str = "forbidden_action";
/// `not_found` (404).
pub const NOT_FOUND: &str = "not_found";
/// `server_error` (500).
pub const SERVER_ERROR: &str = "server_error";
/// `service_unavailable` (503).
pub const UNAVAILABLE: &str = "service_unavailable";

/// A teardown refused because the instance is still being provisioned ("can't
/// discontinue a provisioning instance").
const STILL_PROVISIONING: &[&str] = &["provisioning", "still being deployed", "not yet deployed"];
/// A teardown of an instance that is already gone ("already discontinued").
const ALREADY_GONE: &[&str] = &[
    "already discontinued",
    "already deleted",
    "is discontinued",
    "instance not found",
];
/// A create the vendor refused for lack of capacity, in its own words.
const NO_CAPACITY: &[&str] = &[
    "no capacity",
    "not enough capacity",
    "insufficient capacity",
    "out of stock",
    "sold out",
];

const CHECK_CLIENT: &str = "check VERDA_CLIENT_ID / VERDA_CLIENT_SECRET (or the profile in \
                            ~/.verda/credentials) and the account";

/// The vendor's table, first match wins (the kit's defaults follow it).
const RULES: &[Rule] = &[
    Rule::code("*", ErrorKind::Transient)
        .phrases(STILL_PROVISIONING)
        .on(DELETE)
        .help("the instance is still being provisioned; its teardown is retried"),
    Rule::code(INSUFFICIENT_FUNDS, ErrorKind::Credentials).help("add funds to the Verda account"),
    Rule::status(402, ErrorKind::Credentials).help("add funds to the Verda account"),
    Rule::code(UNAUTHORIZED, ErrorKind::Credentials),
    // The account may not do it (a 403 either way; the code says so).
    Rule::code(FORBIDDEN, ErrorKind::Credentials),
    Rule::code(SERVER_ERROR, ErrorKind::Transient),
    Rule::code(UNAVAILABLE, ErrorKind::Transient),
    Rule::code("*", ErrorKind::Capacity)
        .phrases(NO_CAPACITY)
        .on(CREATE),
    // A key registration refused: the description gives no conflict body for
    // `POST /sshkeys` (only the `{code, message}` envelope, whose codes include no
    // conflict), so the documented refusal, `invalid_request`, is taken to mean the key
    // (or its name) exists: the shared node observes again and adopts it by value. A
    // really invalid key is not found either and ends `Failed` after the node's retries.
    Rule::code(INVALID_REQUEST, ErrorKind::Exists).on(REGISTER_KEY),
    Rule::code(NOT_FOUND, ErrorKind::InvalidRequest),
    Rule::code(INVALID_REQUEST, ErrorKind::InvalidRequest),
];

/// Verda's classifier.
pub static CLASSIFIER: Classifier = Classifier {
    cloud: super::CLOUD,
    rules: RULES,
    credentials_help: CHECK_CLIENT,
};

/// `{code, message, details?}`.
#[derive(Deserialize)]
struct Body {
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    details: Option<String>,
}

/// The error body decoder: the body's `code` (empty when it has none: still the
/// vendor's) and `message` (with `details`, cut to 300 characters); any other body is one
/// short line ([`cause::http_cause`]) without a code.
pub fn decode(status: u16, content_type: Option<&str>, body: &str) -> (Option<String>, String) {
    match serde_json::from_str::<Body>(body) {
        Ok(b) if b.code.is_some() || b.message.is_some() => {
            let mut text = b.message.unwrap_or_default().trim().to_string();
            if let Some(d) = b.details.filter(|d| !d.trim().is_empty()) {
                text = format!("{text} ({})", d.trim());
            }
            let text: String = text.chars().take(300).collect();
            let text = if text.is_empty() {
                format!("HTTP {status}")
            } else {
                text
            };
            (Some(b.code.unwrap_or_default()), text)
        }
        _ => (None, cause::http_cause(status, content_type, body)),
    }
}

/// Whether a teardown failure means the instance is already gone: `not_found` (or a
/// 404), or the vendor's words for an instance already discontinued.
pub fn is_gone(f: &Failure) -> bool {
    f.has_code(NOT_FOUND)
        || f.http_status() == Some(404)
        || (f.code.is_some() && f.message_has(ALREADY_GONE))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::kit::testing::proxy_page;
    use crate::provider::kit::Call;

    fn failure(status: u16, code: &str, message: &str) -> Failure {
        let body = serde_json::json!({"code": code, "message": message}).to_string();
        let (code, message) = decode(status, Some("application/json"), &body);
        Failure::http(status, code, message)
    }

    fn kind(status: u16, code: &str, message: &str, call: &'static str) -> ErrorKind {
        CLASSIFIER
            .classify(&failure(status, code, message), Call::named(call, "x"), [])
            .kind
    }

    #[test]
    fn codes_decide_and_no_code_means_capacity() {
        use ErrorKind::*;
        assert_eq!(
            kind(400, INVALID_REQUEST, "Invalid image", CREATE),
            InvalidRequest
        );
        assert_eq!(kind(401, UNAUTHORIZED, "Bad token", "other"), Credentials);
        assert_eq!(kind(402, INSUFFICIENT_FUNDS, "Top up", CREATE), Credentials);
        assert_eq!(kind(403, FORBIDDEN, "Not allowed", CREATE), Credentials);
        assert_eq!(kind(404, NOT_FOUND, "No such type", CREATE), InvalidRequest);
        assert_eq!(kind(500, SERVER_ERROR, "Oops", CREATE), Transient);
        assert_eq!(kind(503, UNAVAILABLE, "Maintenance", CREATE), Transient);
        // The anchors took every launch error for capacity; here only the vendor's words do.
        assert_eq!(
            kind(
                400,
                INVALID_REQUEST,
                "Not enough capacity for 8H100",
                CREATE
            ),
            Capacity
        );
        assert_eq!(
            kind(400, INVALID_REQUEST, "Not enough capacity", "other"),
            InvalidRequest
        );
        assert_eq!(kind(409, "", "something new", CREATE), Failed);
        // A key registration refused by the shared node: it exists (observed again).
        assert_eq!(
            kind(400, INVALID_REQUEST, "Key already exists", REGISTER_KEY),
            Exists
        );
        assert_eq!(
            kind(400, INVALID_REQUEST, "Key already exists", "other"),
            InvalidRequest
        );
        assert_eq!(
            kind(401, UNAUTHORIZED, "Bad token", REGISTER_KEY),
            Credentials
        );
        let f = Failure::http(400, None, "HTTP 400 (text/html): no capacity");
        assert_eq!(
            CLASSIFIER.classify(&f, Call::named(CREATE, "x"), []).kind,
            Failed
        );
    }

    #[test]
    fn the_two_teardown_refusals() {
        // Still provisioning: retry later.
        let f = failure(
            400,
            INVALID_REQUEST,
            "Can't discontinue a provisioning instance",
        );
        assert!(!is_gone(&f));
        let e = CLASSIFIER.classify(&f, Call::named(DELETE, "delete"), []);
        assert_eq!(e.kind, ErrorKind::Transient);
        assert!(e.help.is_some());
        // Already discontinued: gone.
        assert!(is_gone(&failure(
            400,
            INVALID_REQUEST,
            "Instance is already discontinued"
        )));
        assert!(is_gone(&failure(404, NOT_FOUND, "Not found")));
        assert!(!is_gone(&failure(400, INVALID_REQUEST, "Invalid action")));
        assert!(!is_gone(&Failure::http(
            400,
            None,
            "already discontinued (a proxy)"
        )));
    }

    #[test]
    fn bodies_become_one_short_line() {
        let (code, m) = decode(502, Some("text/html"), &proxy_page());
        assert_eq!(
            (code, m.as_str()),
            (None, "HTTP 502 (text/html): 502 Bad Gateway")
        );
        let body = r#"{"code":"invalid_request","message":"bad","details":"hostname"}"#;
        assert_eq!(
            decode(400, None, body),
            (Some(INVALID_REQUEST.into()), "bad (hostname)".into())
        );
    }
}
