//! Classification of Hyperstack Infrahub API errors into [`ErrorKind`]s (design 4.1).
//!
//! Hyperstack answers 400/401/404/405/409 with the envelope `ErrorResponseModel {status:
//! false, message, error_reason}` (`components.schemas.ErrorResponseModel` of the vendor's
//! description) and 500 with no declared body. Unlike Lambda there is no machine-readable
//! error code: capacity and quota can only be recognised from the free text of `message`
//! and `error_reason` (SOURCES.md, Hyperstack: "create failures come back as 400/409
//! `ErrorResponseModel` with free-text `message`/`error_reason`"). So the phrases matched
//! here are deliberately narrow, and anything not recognised is `Failed`, never
//! `Capacity`.

use serde::Deserialize;

use crate::provider::{ErrorKind, ProviderError};

/// A failed API call as Hyperstack reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status; `None` when no response arrived (connection, timeout).
    pub status: Option<u16>,
    /// `ErrorResponseModel.message`, or a transport description; for a body that is not
    /// the envelope (an HTML page from a proxy, plain text), the whole short cause from
    /// [`crate::provider::cause::http_cause`] (see `raw`).
    pub message: String,
    /// Whether the body was not Hyperstack's envelope: `message` then already names the
    /// status and content type, is never the dumped body, and is not searched for
    /// capacity, quota or busy phrases (those are the vendor's free text).
    pub raw: bool,
    /// `ErrorResponseModel.error_reason`, when the body was the envelope and had one.
    pub reason: Option<String>,
    /// `Retry-After` in seconds, when the server sent one as a number.
    pub retry_after_secs: Option<u64>,
}

#[derive(Deserialize)]
struct Envelope {
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    error_reason: Option<String>,
}

/// Phrases (lowercase) that mean the request hit a rate limit: transient, same offer.
const RATE_LIMIT: &[&str] = &["rate limit", "too many requests", "throttl"];
/// Phrases (lowercase) that mean an account or environment quota is exhausted. Checked
/// before [`CAPACITY_PHRASES`]: "exceeds your GPU limit" is quota even though it names GPUs.
const QUOTA: &[&str] = &[
    "quota",
    "limit exceeded",
    "exceeds the limit",
    "exceeded the limit",
    "exceeds your",
    "maximum number of",
    "vm limit",
    "gpu limit",
];
/// Phrases (lowercase) that mean the region has no stock of the flavor now.
pub const CAPACITY_PHRASES: &[&str] = &[
    "out of stock",
    "no stock",
    "not enough stock",
    "insufficient stock",
    "stock not available",
    "stock is not available",
    "insufficient capacity",
    "not enough capacity",
    "no capacity",
    "capacity not available",
    "no available host",
    "no valid host",
];
/// Phrases (lowercase) a delete refusal uses when the VM is still being created (or is
/// otherwise mid-transition): the request must be repeated later.
const BUSY: &[&str] = &[
    "creating",
    "being created",
    "build",
    "in progress",
    "try again",
    "current state",
    "transitional",
    "not allowed in",
    "cannot be deleted",
    "can not be deleted",
    "locked",
];

impl ApiError {
    /// An error from an HTTP response: status, raw body and the `Retry-After` header value
    /// (no `Content-Type` known; see [`ApiError::from_http`]).
    pub fn from_response(status: u16, body: &str, retry_after: Option<&str>) -> ApiError {
        ApiError::from_http(status, None, body, retry_after)
    }

    /// [`ApiError::from_response`] with the response's `Content-Type`, which the short
    /// cause of a body that is not the envelope names.
    pub fn from_http(
        status: u16,
        content_type: Option<&str>,
        body: &str,
        retry_after: Option<&str>,
    ) -> ApiError {
        let retry_after_secs = retry_after.and_then(|v| v.trim().parse::<u64>().ok());
        let clip = |s: &str| s.chars().take(300).collect::<String>().trim().to_string();
        match serde_json::from_str::<Envelope>(body) {
            Ok(e) if e.message.is_some() || e.error_reason.is_some() => ApiError {
                status: Some(status),
                message: clip(e.message.as_deref().unwrap_or_default()),
                reason: e.error_reason.map(|r| clip(&r)).filter(|r| !r.is_empty()),
                raw: false,
                retry_after_secs,
            },
            _ => ApiError {
                status: Some(status),
                message: crate::provider::cause::http_cause(status, content_type, body),
                reason: None,
                raw: true,
                retry_after_secs,
            },
        }
    }

    /// `message` and `error_reason` together, lowercase, for phrase matching.
    fn text(&self) -> String {
        format!(
            "{} {}",
            self.message,
            self.reason.as_deref().unwrap_or_default()
        )
        .to_lowercase()
    }

    fn says(&self, phrases: &[&str]) -> bool {
        if self.raw {
            return false;
        }
        let t = self.text();
        phrases.iter().any(|p| t.contains(p))
    }

    /// Whether the object does not exist (HTTP 404).
    pub fn is_not_found(&self) -> bool {
        self.status == Some(404)
    }

    /// Whether a delete was refused because the VM is mid-transition (typically still
    /// `CREATING`): a 409, or a 400 whose text says so. The caller must retry, and must not
    /// take the refusal for a deletion.
    pub fn is_busy(&self) -> bool {
        match self.status {
            Some(409) => true,
            Some(400) => self.says(BUSY),
            _ => false,
        }
    }
}

/// Maps a Hyperstack error onto the provider contract's kinds. `what` names the call (for
/// example `create VM in CANADA-1`) and starts the message.
///
/// - no response (a timeout, a reset) → `Transient`; a refused connection never gets here:
///   the adapter reports it as `Unreachable` before classifying;
/// - HTTP 429, or a text saying "rate limit" / "too many requests" → `Transient` with
///   `retry_after_secs` from `Retry-After` (the core retries the same offer, never fails
///   over);
/// - HTTP 5xx (500 has no declared body) → `Transient`;
/// - HTTP 401, 403 → `Credentials`; 402 ("Insufficient balance" in the vendor docs) →
///   `Credentials` (the account cannot be used until it is topped up);
/// - a text naming a quota or limit (see `QUOTA`) → `Quota` (blocks the whole region);
/// - a text naming stock or capacity (see `CAPACITY_PHRASES`) → `Capacity` (blocks the offer);
/// - HTTP 404 → `InvalidRequest` (callers for which "not found" means success, delete and
///   cleanup, test for it first);
/// - anything else (400, 405, 409 with another text) → `Failed`: an unknown error is never
///   taken for capacity.
///
/// `secret` (the API key) is scrubbed from the message, in case a server ever echoes it.
pub fn classify(e: &ApiError, what: &str, secret: Option<&str>) -> ProviderError {
    let kind = match e.status {
        None => ErrorKind::Transient,
        Some(429) => ErrorKind::Transient,
        Some(s) if s >= 500 => ErrorKind::Transient,
        Some(401..=403) => ErrorKind::Credentials,
        Some(_) if e.says(RATE_LIMIT) => ErrorKind::Transient,
        Some(_) if e.says(QUOTA) => ErrorKind::Quota,
        Some(_) if e.says(CAPACITY_PHRASES) => ErrorKind::Capacity,
        Some(404) => ErrorKind::InvalidRequest,
        Some(_) => ErrorKind::Failed,
    };
    let detail = match (&e.reason, e.message.is_empty()) {
        (Some(r), false) if *r != e.message => format!("{} ({r})", e.message),
        (Some(r), true) => r.clone(),
        _ => e.message.clone(),
    };
    let mut msg = match e.status {
        Some(_) if e.raw => format!("hyperstack {what}: {}", e.message),
        Some(s) if detail.is_empty() => format!("hyperstack {what}: HTTP {s}"),
        Some(s) => format!("hyperstack {what}: HTTP {s}: {detail}"),
        None => format!("hyperstack {what}: {detail}"),
    };
    if kind == ErrorKind::Credentials {
        msg.push_str(&format!(
            "; check the API key in {} and the account's billing status",
            super::API_KEY_ENV
        ));
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

    /// An error body in the spec's `ErrorResponseModel` shape.
    fn body(message: &str, reason: &str) -> String {
        serde_json::json!({"status": false, "message": message, "error_reason": reason}).to_string()
    }

    fn kind(status: u16, message: &str, reason: &str) -> ErrorKind {
        classify(
            &ApiError::from_response(status, &body(message, reason), None),
            "x",
            None,
        )
        .kind
    }

    #[test]
    fn capacity_and_quota_come_from_the_text() {
        assert_eq!(
            kind(400, "Out of stock for flavor n3-H100x8", "out_of_stock"),
            ErrorKind::Capacity
        );
        assert_eq!(
            kind(409, "Not enough capacity in CANADA-1", ""),
            ErrorKind::Capacity
        );
        assert_eq!(
            kind(400, "GPU quota exceeded for your organization", ""),
            ErrorKind::Quota
        );
        assert_eq!(
            kind(400, "Request exceeds your GPU limit", "limit"),
            ErrorKind::Quota
        );
        assert_eq!(kind(400, "Too many requests", ""), ErrorKind::Transient);
    }

    #[test]
    fn an_unknown_error_is_never_capacity() {
        assert_eq!(kind(400, "Something new happened", ""), ErrorKind::Failed);
        assert_eq!(kind(409, "Name already taken", ""), ErrorKind::Failed);
        assert_eq!(kind(405, "Method not allowed", ""), ErrorKind::Failed);
        // "stock" alone (a flavor name, a region "STOCKHOLM-1") is not a capacity phrase.
        assert_eq!(
            kind(400, "Invalid flavor for region STOCKHOLM-1", ""),
            ErrorKind::Failed
        );
    }

    #[test]
    fn statuses_decide_first() {
        assert_eq!(kind(401, "Unauthorized", ""), ErrorKind::Credentials);
        assert_eq!(
            kind(402, "Insufficient balance", ""),
            ErrorKind::Credentials
        );
        assert_eq!(kind(404, "Not found", ""), ErrorKind::InvalidRequest);
        let k = |s: u16| classify(&ApiError::from_response(s, "", None), "x", None).kind;
        assert_eq!(k(500), ErrorKind::Transient);
        assert_eq!(k(502), ErrorKind::Transient);
        assert_eq!(k(400), ErrorKind::Failed);
        let transport = ApiError {
            status: None,
            message: "connection reset".into(),
            reason: None,
            raw: false,
            retry_after_secs: None,
        };
        assert_eq!(classify(&transport, "x", None).kind, ErrorKind::Transient);
    }

    #[test]
    fn rate_limit_is_transient_with_retry_after() {
        let e = ApiError::from_response(429, &body("Too many requests", ""), Some("7"));
        let p = classify(&e, "create", None);
        assert_eq!(
            (p.kind, p.retry_after_secs),
            (ErrorKind::Transient, Some(7))
        );
        // A 429 whose text says quota is still a rate limit, not quota.
        let e = ApiError::from_response(429, &body("quota of requests", ""), Some("2"));
        assert_eq!(classify(&e, "create", None).kind, ErrorKind::Transient);
        let e = ApiError::from_response(429, "", Some("Wed, 21 Oct 2026 07:28:00 GMT"));
        let p = classify(&e, "create", None);
        assert_eq!((p.kind, p.retry_after_secs), (ErrorKind::Transient, None));
    }

    #[test]
    fn delete_refusals_while_creating_are_busy() {
        let busy = |s: u16, m: &str| ApiError::from_response(s, &body(m, ""), None).is_busy();
        assert!(busy(400, "Cannot delete VM while it is in CREATING state"));
        assert!(busy(400, "VM is being created, try again later"));
        assert!(busy(409, "Conflict"));
        assert!(!busy(400, "Invalid VM id"));
        assert!(!busy(404, "VM creating"));
        assert!(ApiError::from_response(404, "", None).is_not_found());
    }

    #[test]
    fn a_body_that_is_not_the_envelope_is_one_short_line() {
        let page = format!(
            "<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n<body>{}</body></html>",
            "<p>nginx: no capacity, try again</p>\n".repeat(200)
        );
        let e = ApiError::from_http(502, Some("text/html; charset=utf-8"), &page, None);
        let p = classify(&e, "list VMs", None);
        assert_eq!(p.kind, ErrorKind::Transient);
        assert_eq!(
            p.msg,
            "hyperstack list VMs: HTTP 502 (text/html): 502 Bad Gateway"
        );
        // A proxy's page is not the vendor's free text: no phrase in it is capacity or busy.
        let e = ApiError::from_http(409, Some("text/plain"), "no capacity, try again", None);
        assert_eq!(classify(&e, "x", None).kind, ErrorKind::Failed);
        assert!(!ApiError::from_http(400, None, "try again", None).is_busy());
    }

    #[test]
    fn the_message_keeps_message_and_reason_and_never_the_secret() {
        let e = ApiError::from_response(
            401,
            &body("key secret_sentinel_123 is invalid", "invalid_api_key"),
            None,
        );
        let p = classify(&e, "list flavors", Some("secret_sentinel_123"));
        assert_eq!(p.kind, ErrorKind::Credentials);
        assert!(!p.msg.contains("secret_sentinel_123"), "{}", p.msg);
        assert!(p.msg.contains("invalid_api_key"), "{}", p.msg);
        assert!(p.msg.contains("HYPERSTACK_API_KEY"), "{}", p.msg);
    }
}
