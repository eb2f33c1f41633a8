//! Lambda Cloud's errors as data (design 4.1): the error body decoder, the success
//! envelope, and the table that classifies a [`Failure`] into the contract's kinds.
//!
//! Lambda answers every error with the envelope `{"error": {"code", "message",
//! "suggestion"?}}` (schemas `ApiError*`) and asks clients to switch on `code`, never on
//! `message` (spec 1.8.3, "Error responses"). So the kind comes from `code` (then the HTTP
//! status when the body is not the envelope); the message only travels into the text shown
//! to the user. Successful answers wrap their payload as `{"data": …}`.
//!
//! Beyond the table, the kit's defaults hold: a refused connection → `Unreachable`, no
//! response otherwise → `Transient`, 429 → `Transient` with `Retry-After` (never failover),
//! any other 5xx → `Transient`, a 401/403 without the envelope → `Credentials`, anything
//! else → `Failed`: an unknown error is never taken for capacity.

use serde::Deserialize;
use serde_json::Value;

use crate::provider::kit::http::{failure_of, RateHeaders};
use crate::provider::kit::{Call, Classifier, Failure, Rule};
use crate::provider::{cause, ErrorKind, ProviderError};

/// `instance-operations/launch` had no capacity for the type in the region (HTTP 400).
pub const INSUFFICIENT_CAPACITY: &str = "instance-operations/launch/insufficient-capacity";
/// The account's quota is exhausted (HTTP 400).
pub const QUOTA_EXCEEDED: &str = "global/quota-exceeded";
/// Missing or wrong API key (HTTP 401).
pub const INVALID_API_KEY: &str = "global/invalid-api-key";
/// Account deactivated (HTTP 403).
pub const ACCOUNT_INACTIVE: &str = "global/account-inactive";
/// Billing address missing or invalid (HTTP 403).
pub const INVALID_ADDRESS: &str = "global/invalid-address";
/// A request field is invalid (HTTP 400); also a key name already taken ("Key name must
/// be unique").
pub const INVALID_PARAMETERS: &str = "global/invalid-parameters";
/// Phrase (lowercase) of the `global/invalid-parameters` refusing a key name that is
/// taken ("Key name must be unique.", as field reports quote it).
pub const KEY_NAME_TAKEN_PHRASES: &[&str] = &["must be unique"];
/// An object named in the request does not exist (HTTP 400/404).
pub const OBJECT_DOES_NOT_EXIST: &str = "global/object-does-not-exist";
/// A firewall ruleset still attached to an instance (HTTP 400 on delete).
pub const RULESET_IN_USE: &str = "firewall-rulesets/firewall-ruleset-in-use";
/// A launch naming a file system of another region (HTTP 400).
pub const FILE_SYSTEM_IN_WRONG_REGION: &str =
    "instance-operations/launch/file-system-in-wrong-region";

/// Lambda's codes, in the order they are tried.
const RULES: &[Rule] = &[
    // `ApiErrorInternal.code`, and the `provider/*` family of Lambda's upstream providers
    // (`provider/internal-unavailable`): outages, retried.
    Rule::code("global/internal-error", ErrorKind::Transient),
    Rule::code("provider/*", ErrorKind::Transient),
    // `ApiErrorInsufficientCapacity.code`: blocks the offer.
    Rule::code(INSUFFICIENT_CAPACITY, ErrorKind::Capacity),
    // `ApiErrorQuotaExceeded.code`: blocks the whole region (the kind's default scope).
    Rule::code(QUOTA_EXCEEDED, ErrorKind::Quota),
    // `ApiErrorUnauthorized.code`, `ApiErrorAccountInactive.code`,
    // `ApiErrorInvalidBillingAddress.code`.
    Rule::code(INVALID_API_KEY, ErrorKind::Credentials),
    Rule::code(ACCOUNT_INACTIVE, ErrorKind::Credentials),
    Rule::code(INVALID_ADDRESS, ErrorKind::Credentials),
    // `ApiErrorInvalidParameters.code`, the `*NotFound` schemas' `global/object-does-not-exist`
    // (delete and cleanup test for it first: there it is success),
    // `ApiErrorFileSystemInWrongRegion.code`.
    // A key name taken ("Key name must be unique."): for the shared project key, it
    // exists (registered meanwhile): observed again and adopted, never a failed offer.
    Rule::code(INVALID_PARAMETERS, ErrorKind::Exists).phrases(KEY_NAME_TAKEN_PHRASES),
    Rule::code(INVALID_PARAMETERS, ErrorKind::InvalidRequest),
    Rule::code(OBJECT_DOES_NOT_EXIST, ErrorKind::InvalidRequest),
    Rule::code(FILE_SYSTEM_IN_WRONG_REGION, ErrorKind::InvalidRequest),
    // `ApiErrorFirewallRulesetInUse.code`: an instance still uses the ruleset; the core
    // observes again before retrying.
    Rule::code(RULESET_IN_USE, ErrorKind::InUse),
    // A 401/403 whose envelope carries a code not listed above: the code decides, and an
    // unknown one is `Failed` (only a 401/403 without the envelope is `Credentials`).
    Rule {
        status: Some((401, 403)),
        ..Rule::code("*", ErrorKind::Failed)
    },
];

/// Lambda's classifier.
pub static CLASSIFIER: Classifier = Classifier {
    cloud: super::CLOUD,
    rules: RULES,
    credentials_help: "check the API key in LAMBDA_API_KEY",
};

#[derive(Deserialize)]
struct Envelope {
    error: EnvelopeError,
}

#[derive(Deserialize)]
struct EnvelopeError {
    code: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    suggestion: Option<String>,
}

/// The error body decoder: `error.code`, and `error.message` with the `suggestion` in
/// parentheses. A body that is not the envelope (an HTML page from a proxy, plain text) is
/// reduced to one short line naming the status and content type, never kept whole.
pub fn decode_error(
    status: u16,
    content_type: Option<&str>,
    body: &str,
) -> (Option<String>, String) {
    match serde_json::from_str::<Envelope>(body) {
        Ok(Envelope { error }) => {
            let message = match error.suggestion.filter(|s| !s.trim().is_empty()) {
                Some(s) => format!("{} ({})", error.message.trim(), s.trim()),
                None => error.message.trim().to_string(),
            };
            (Some(error.code), message)
        }
        Err(_) => (None, cause::http_cause(status, content_type, body)),
    }
}

/// The success envelope: the payload is `data` (`Null` when absent).
pub fn data(_status: u16, v: Value) -> Result<Value, (Option<String>, String)> {
    Ok(v.get("data").cloned().unwrap_or(Value::Null))
}

/// Whether Lambda said the object does not exist (`global/object-does-not-exist`, or a
/// 404 without the envelope).
pub fn is_not_found(f: &Failure) -> bool {
    f.has_code(OBJECT_DOES_NOT_EXIST) || (f.code.is_none() && f.http_status() == Some(404))
}

/// One error response as Lambda sent it (status, `Content-Type`, body, `Retry-After`),
/// decoded; for classifying answers without a server (the property tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError(pub Failure);

impl ApiError {
    pub fn from_response(
        status: u16,
        content_type: Option<&str>,
        body: &str,
        retry_after: Option<&str>,
    ) -> ApiError {
        let rate = RateHeaders {
            retry_after: retry_after.map(str::to_string),
            ..RateHeaders::default()
        };
        ApiError(failure_of(
            decode_error,
            status,
            content_type,
            body,
            &rate,
            0,
        ))
    }
}

/// [`CLASSIFIER`] on `e`, the message starting `lambda <what>: `, `secret` scrubbed.
pub fn classify(e: &ApiError, what: &str, secret: Option<&str>) -> ProviderError {
    CLASSIFIER.classify(&e.0, Call::other(what), secret)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::kit::testing::proxy_page;

    const JSON: Option<&str> = Some("application/json");

    /// Error bodies in the spec's own shapes (`ApiError*` schemas of 1.8.3).
    fn body(code: &str, message: &str, suggestion: Option<&str>) -> String {
        let mut e = serde_json::json!({"code": code, "message": message});
        if let Some(s) = suggestion {
            e["suggestion"] = s.into();
        }
        serde_json::json!({ "error": e }).to_string()
    }

    fn kind(status: u16, code: &str) -> ErrorKind {
        classify(
            &ApiError::from_response(status, JSON, &body(code, "m", None), None),
            "x",
            None,
        )
        .kind
    }

    #[test]
    fn codes_decide_the_kind() {
        assert_eq!(kind(400, INSUFFICIENT_CAPACITY), ErrorKind::Capacity);
        assert_eq!(kind(400, QUOTA_EXCEEDED), ErrorKind::Quota);
        assert_eq!(kind(401, INVALID_API_KEY), ErrorKind::Credentials);
        assert_eq!(kind(403, ACCOUNT_INACTIVE), ErrorKind::Credentials);
        assert_eq!(kind(403, INVALID_ADDRESS), ErrorKind::Credentials);
        assert_eq!(kind(400, INVALID_PARAMETERS), ErrorKind::InvalidRequest);
        assert_eq!(kind(404, OBJECT_DOES_NOT_EXIST), ErrorKind::InvalidRequest);
        assert_eq!(
            kind(400, FILE_SYSTEM_IN_WRONG_REGION),
            ErrorKind::InvalidRequest
        );
        assert_eq!(
            kind(503, "provider/internal-unavailable"),
            ErrorKind::Transient
        );
        assert_eq!(kind(400, "provider/quota-whatever"), ErrorKind::Transient);
        assert_eq!(kind(500, "global/internal-error"), ErrorKind::Transient);
        assert_eq!(kind(400, RULESET_IN_USE), ErrorKind::InUse);
        assert_eq!(kind(401, "global/something-new"), ErrorKind::Failed);
        assert_eq!(kind(502, "global/something-new"), ErrorKind::Transient);
    }

    #[test]
    fn an_unknown_error_is_never_capacity() {
        assert_eq!(kind(400, "global/something-new"), ErrorKind::Failed);
        assert_eq!(kind(409, "global/duplicate"), ErrorKind::Failed);
        // The message says "capacity" but the code does not: not capacity.
        let e = ApiError::from_response(
            400,
            JSON,
            &body("global/something-new", "Not enough capacity", None),
            None,
        );
        assert_eq!(classify(&e, "x", None).kind, ErrorKind::Failed);
    }

    #[test]
    fn quota_message_keeps_the_suggestion() {
        let e = ApiError::from_response(
            400,
            JSON,
            &body(
                QUOTA_EXCEEDED,
                "Quota exceeded.",
                Some("Contact Support to increase your quota."),
            ),
            None,
        );
        let p = classify(&e, "launch", None);
        assert_eq!(p.kind, ErrorKind::Quota);
        assert!(p.msg.contains("global/quota-exceeded"), "{}", p.msg);
        assert!(p.msg.contains("Contact Support"), "{}", p.msg);
    }

    #[test]
    fn rate_limit_is_transient_with_retry_after() {
        let e = ApiError::from_response(
            429,
            JSON,
            &body("global/rate-limited", "slow", None),
            Some("7"),
        );
        let p = classify(&e, "launch", None);
        assert_eq!(p.kind, ErrorKind::Transient);
        assert_eq!(p.retry_after_secs, Some(7));
        // Without the header or with an HTTP date: no hint, still transient.
        let e = ApiError::from_response(429, None, "", Some("Wed, 21 Oct 2026 07:28:00 GMT"));
        let p = classify(&e, "launch", None);
        assert_eq!((p.kind, p.retry_after_secs), (ErrorKind::Transient, None));
    }

    #[test]
    fn statuses_without_an_envelope() {
        let k = |s: u16| {
            classify(
                &ApiError::from_response(s, Some("text/html"), "<html>", None),
                "x",
                None,
            )
            .kind
        };
        assert_eq!(k(502), ErrorKind::Transient);
        assert_eq!(k(401), ErrorKind::Credentials);
        assert_eq!(k(403), ErrorKind::Credentials);
        assert_eq!(k(400), ErrorKind::Failed);
        assert!(is_not_found(
            &ApiError::from_response(404, None, "", None).0
        ));
        let transport = Failure::transport(false, "operation timed out");
        let p = CLASSIFIER.classify(&transport, Call::other("x"), None);
        assert_eq!(p.kind, ErrorKind::Transient);
        let refused = Failure::transport(true, "connection refused");
        let p = CLASSIFIER.classify(&refused, Call::other("x"), None);
        assert_eq!(p.kind, ErrorKind::Unreachable);
    }

    #[test]
    fn a_page_that_is_not_the_envelope_becomes_one_short_line() {
        let page = proxy_page();
        let e = ApiError::from_response(502, Some("text/html; charset=UTF-8"), &page, None);
        let p = classify(&e, "list instances", None);
        assert_eq!(p.kind, ErrorKind::Transient);
        assert_eq!(
            p.msg,
            "lambda list instances: HTTP 502 (text/html): 502 Bad Gateway"
        );
    }

    #[test]
    fn the_secret_never_reaches_the_message() {
        let e = ApiError::from_response(
            401,
            JSON,
            &body(INVALID_API_KEY, "key secret_sentinel_123 is invalid", None),
            None,
        );
        let p = classify(&e, "list", Some("secret_sentinel_123"));
        assert_eq!(p.kind, ErrorKind::Credentials);
        assert!(!p.text().contains("secret_sentinel_123"), "{}", p.text());
        // The hint is the help, shown after the message.
        assert!(p.text().contains("LAMBDA_API_KEY"), "{}", p.text());
    }
}
