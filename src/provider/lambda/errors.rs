//! Classification of Lambda Cloud API errors into [`ErrorKind`]s (design 4.1).
//!
//! Lambda answers every error with the envelope `{"error": {"code", "message",
//! "suggestion"?}}` and asks clients to switch on `code`, never on `message` (spec 1.8.3,
//! "Error responses"). So the kind comes from `code` (then the HTTP status when the body is
//! not the envelope); the message only travels into the text shown to the user.

use serde::Deserialize;

use crate::provider::{ErrorKind, ProviderError};

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
/// A request field is invalid (HTTP 400).
pub const INVALID_PARAMETERS: &str = "global/invalid-parameters";
/// An object named in the request does not exist (HTTP 400/404).
pub const OBJECT_DOES_NOT_EXIST: &str = "global/object-does-not-exist";
/// A firewall ruleset still attached to an instance (HTTP 400 on delete,
/// `ApiErrorFirewallRulesetInUse`).
pub const RULESET_IN_USE: &str = "firewall-rulesets/firewall-ruleset-in-use";
/// Prefix of errors from Lambda's upstream providers (outages, unavailability).
pub const PROVIDER_PREFIX: &str = "provider/";

/// A failed API call as Lambda reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status; `None` when no response arrived (connection, timeout).
    pub status: Option<u16>,
    /// `error.code` of the envelope, when the body was one.
    pub code: Option<String>,
    /// `error.message` (and `suggestion`); for a body that is not the envelope, a short
    /// cause ([`crate::provider::cause::http_cause`]); or a transport description.
    pub message: String,
    /// `Retry-After` in seconds, when the server sent one as a number.
    pub retry_after_secs: Option<u64>,
    /// No response: the endpoint refused the connection (or its name did not resolve),
    /// [`crate::provider::cause::is_refused`].
    pub refused: bool,
}

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

impl ApiError {
    /// An error from an HTTP response: status, `Content-Type`, raw body and the
    /// `Retry-After` header value. A body that is not Lambda's envelope (an HTML page from
    /// a proxy, plain text) is reduced to one short line naming the status and content
    /// type, never kept whole.
    pub fn from_response(
        status: u16,
        content_type: Option<&str>,
        body: &str,
        retry_after: Option<&str>,
    ) -> ApiError {
        let retry_after_secs = retry_after.and_then(|v| v.trim().parse::<u64>().ok());
        match serde_json::from_str::<Envelope>(body) {
            Ok(Envelope { error }) => {
                let message = match error.suggestion.filter(|s| !s.trim().is_empty()) {
                    Some(s) => format!("{} ({})", error.message.trim(), s.trim()),
                    None => error.message.trim().to_string(),
                };
                ApiError {
                    status: Some(status),
                    code: Some(error.code),
                    message,
                    retry_after_secs,
                    refused: false,
                }
            }
            Err(_) => ApiError {
                status: Some(status),
                code: None,
                message: crate::provider::cause::http_cause(status, content_type, body),
                retry_after_secs,
                refused: false,
            },
        }
    }

    /// Whether Lambda said the object does not exist (`global/object-does-not-exist`, or a
    /// 404 without an envelope).
    pub fn is_not_found(&self) -> bool {
        self.code.as_deref() == Some(OBJECT_DOES_NOT_EXIST)
            || (self.code.is_none() && self.status == Some(404))
    }

    /// The error code when it is `code`.
    pub fn has_code(&self, code: &str) -> bool {
        self.code.as_deref() == Some(code)
    }
}

/// Maps a Lambda error onto the provider contract's kinds. `what` names the call (for
/// example `launch gpu_8x_h100_sxm5 in us-east-1`) and starts the message.
///
/// - no response because the endpoint refused the connection → `Unreachable` (the core
///   blocks the whole cloud at once);
/// - no response otherwise (timeout, reset) → `Transient`;
/// - HTTP 429 → `Transient` with `retry_after_secs` from `Retry-After` (never failover);
/// - `provider/*` codes, `global/internal-error` and any 5xx → `Transient`;
/// - `instance-operations/launch/insufficient-capacity` → `Capacity` (blocks the offer);
/// - `global/quota-exceeded` → `Quota` (blocks the whole region);
/// - `global/invalid-api-key`, `global/account-inactive`, `global/invalid-address`, and a
///   401/403 without an envelope → `Credentials`;
/// - `global/invalid-parameters`, `global/object-does-not-exist`,
///   `instance-operations/launch/file-system-in-wrong-region` → `InvalidRequest` (callers
///   for which "does not exist" means success, delete and cleanup, test for it first);
/// - `firewall-rulesets/firewall-ruleset-in-use` → `InUse` (an instance still uses the
///   ruleset: the core observes again before retrying);
/// - anything else → `Failed`: an unknown error is never taken for capacity.
///
/// `secret` (the API key) is scrubbed from the message, in case a server ever echoes it.
pub fn classify(e: &ApiError, what: &str, secret: Option<&str>) -> ProviderError {
    let code = e.code.as_deref().unwrap_or_default();
    let kind = match (e.status, code) {
        (None, _) if e.refused => ErrorKind::Unreachable,
        (None, _) => ErrorKind::Transient,
        (Some(429), _) => ErrorKind::Transient,
        (_, c) if c.starts_with(PROVIDER_PREFIX) || c == "global/internal-error" => {
            ErrorKind::Transient
        }
        (_, INSUFFICIENT_CAPACITY) => ErrorKind::Capacity,
        (_, QUOTA_EXCEEDED) => ErrorKind::Quota,
        (_, INVALID_API_KEY | ACCOUNT_INACTIVE | INVALID_ADDRESS) => ErrorKind::Credentials,
        (
            _,
            INVALID_PARAMETERS
            | OBJECT_DOES_NOT_EXIST
            | "instance-operations/launch/file-system-in-wrong-region",
        ) => ErrorKind::InvalidRequest,
        (_, RULESET_IN_USE) => ErrorKind::InUse,
        (Some(s), _) if s >= 500 => ErrorKind::Transient,
        (Some(401 | 403), "") => ErrorKind::Credentials,
        _ => ErrorKind::Failed,
    };
    let mut msg = match (e.status, e.code.as_deref()) {
        (Some(s), Some(c)) => format!("lambda {what}: {c} (HTTP {s}): {}", e.message),
        (Some(s), None) if e.message.is_empty() => format!("lambda {what}: HTTP {s}"),
        // `message` is already the short cause, starting with the status.
        (Some(_), None) => format!("lambda {what}: {}", e.message),
        (None, _) => format!("lambda {what}: {}", e.message),
    };
    if kind == ErrorKind::Credentials {
        msg.push_str(&format!("; check the API key in {}", super::API_KEY_ENV));
    }
    if let Some(s) = secret.filter(|s| !s.is_empty()) {
        msg = msg.replace(s, "REDACTED");
    }
    ProviderError {
        kind,
        msg,
        block: None,
        retry_after_secs: if kind == ErrorKind::Transient {
            e.retry_after_secs
        } else {
            None
        },
        help: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            kind(
                400,
                "instance-operations/launch/file-system-in-wrong-region"
            ),
            ErrorKind::InvalidRequest
        );
        assert_eq!(
            kind(503, "provider/internal-unavailable"),
            ErrorKind::Transient
        );
        assert_eq!(kind(400, "provider/quota-whatever"), ErrorKind::Transient);
        assert_eq!(kind(500, "global/internal-error"), ErrorKind::Transient);
        assert_eq!(kind(400, RULESET_IN_USE), ErrorKind::InUse);
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
        assert!(ApiError::from_response(404, None, "", None).is_not_found());
        let transport = ApiError {
            status: None,
            code: None,
            message: "operation timed out".into(),
            retry_after_secs: None,
            refused: false,
        };
        assert_eq!(classify(&transport, "x", None).kind, ErrorKind::Transient);
        let refused = ApiError {
            message: "connection refused".into(),
            refused: true,
            ..transport
        };
        assert_eq!(classify(&refused, "x", None).kind, ErrorKind::Unreachable);
    }

    #[test]
    fn a_page_that_is_not_the_envelope_becomes_one_short_line() {
        let page = format!(
            "<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n<body>{}</body></html>",
            "<p>cloudflare</p>".repeat(200)
        );
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
        assert!(!p.msg.contains("secret_sentinel_123"), "{}", p.msg);
        assert!(p.msg.contains("LAMBDA_API_KEY"), "{}", p.msg);
    }
}
