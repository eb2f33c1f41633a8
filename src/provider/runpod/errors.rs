//! Classification of RunPod REST v2 errors into [`ErrorKind`]s (design 4.1).
//!
//! RunPod answers every error as RFC 9457 `application/problem+json`
//! (`ErrorResponse{title, status, detail, errors?}`, spec `components.schemas`). There is
//! no machine-readable error code: the spec says capacity exhaustion "currently carries no
//! machine-readable code of its own — only a human-readable `detail`". So the kind comes
//! from the HTTP status and from which call failed ([`Call`]), following the retry table
//! in the `createPod` description; `detail` only travels into the text shown to the user.

use serde::Deserialize;

use crate::provider::{ErrorKind, ProviderError};

/// Which kind of call failed: a `400` means "try the next candidate" only for a pod
/// create (the `createPod` table); anywhere else it is a request gpuprov built wrongly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// `POST /v2/pods`.
    CreatePod,
    /// `POST /v2/pods/{id}/action` with `start`.
    StartPod,
    /// Any other call (catalog, pods list, SSH keys, delete).
    Other,
}

/// A failed API call as RunPod reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status; `None` when no response arrived (connection, timeout).
    pub status: Option<u16>,
    /// `title` of the problem document, when the body was one.
    pub title: Option<String>,
    /// `detail` (plus the `errors` list of a `422`), or a transport description; for a body
    /// that is not a problem document (an HTML page from a proxy, plain text), the whole
    /// short cause from [`crate::provider::cause::http_cause`] (see `raw`).
    pub message: String,
    /// Whether the body was not RunPod's problem document: `message` then already names
    /// the status and content type, and is never the dumped body.
    pub raw: bool,
    /// Seconds to wait before the next call: the `Retry-After` header (integer seconds,
    /// spec `TooManyRequestsError`), else the reset time `t` of an exhausted window
    /// (`r=0`) in the `RateLimit` header.
    pub retry_after_secs: Option<u64>,
}

#[derive(Deserialize)]
struct Problem {
    #[serde(default)]
    title: String,
    #[serde(default)]
    detail: String,
    #[serde(default)]
    errors: Vec<String>,
}

/// The seconds until the first exhausted window resets, from a `RateLimit` header such as
/// `"minute";r=0;t=12, "hour";r=2800;t=1812` (spec `RateLimitHeader`: one member per
/// window, `r` = remaining requests, `t` = seconds until reset). The longest wait of the
/// exhausted windows wins; `None` when no window is exhausted or the value is unreadable.
pub fn exhausted_window_secs(rate_limit: &str) -> Option<u64> {
    rate_limit
        .split(',')
        .filter_map(|member| {
            let mut r = None;
            let mut t = None;
            for param in member.split(';').skip(1) {
                match param.trim().split_once('=') {
                    Some(("r", v)) => r = v.trim().parse::<u64>().ok(),
                    Some(("t", v)) => t = v.trim().parse::<u64>().ok(),
                    _ => {}
                }
            }
            (r == Some(0)).then_some(t).flatten()
        })
        .max()
}

impl ApiError {
    /// An error from an HTTP response: status, raw body, and the `Retry-After` and
    /// `RateLimit` header values (no `Content-Type` known; see [`ApiError::from_http`]).
    pub fn from_response(
        status: u16,
        body: &str,
        retry_after: Option<&str>,
        rate_limit: Option<&str>,
    ) -> ApiError {
        ApiError::from_http(status, None, body, retry_after, rate_limit)
    }

    /// [`ApiError::from_response`] with the response's `Content-Type`, which the short
    /// cause of a body that is not a problem document names.
    pub fn from_http(
        status: u16,
        content_type: Option<&str>,
        body: &str,
        retry_after: Option<&str>,
        rate_limit: Option<&str>,
    ) -> ApiError {
        let retry_after_secs = retry_after
            .and_then(|v| v.trim().parse::<u64>().ok())
            .or_else(|| rate_limit.and_then(exhausted_window_secs));
        match serde_json::from_str::<Problem>(body) {
            Ok(p) if !p.title.is_empty() || !p.detail.is_empty() => {
                let mut message = p.detail.trim().to_string();
                if message.is_empty() {
                    message = p.title.trim().to_string();
                }
                if !p.errors.is_empty() {
                    message = format!("{message} [{}]", p.errors.join("; "));
                }
                ApiError {
                    status: Some(status),
                    title: Some(p.title).filter(|t| !t.is_empty()),
                    message,
                    raw: false,
                    retry_after_secs,
                }
            }
            _ => ApiError {
                status: Some(status),
                title: None,
                message: crate::provider::cause::http_cause(status, content_type, body),
                raw: true,
                retry_after_secs,
            },
        }
    }

    /// Whether RunPod said the object does not exist (HTTP 404, `NotFoundError`).
    pub fn is_not_found(&self) -> bool {
        self.status == Some(404)
    }
}

/// Maps a RunPod error onto the provider contract's kinds. `what` names the call (for
/// example `create pod on NVIDIA H100 80GB HBM3 x8 in US-KS-2`) and starts the message.
///
/// Following the retry table of the spec's `createPod` description:
///
/// - no response (a timeout, a reset) and any `5xx` → `Transient` (retry the same
///   candidate); a refused connection never gets here: the adapter reports it as
///   `Unreachable` before classifying;
/// - `429` → `Transient` with `retry_after_secs` (back off per `Retry-After`; never a
///   failover);
/// - `400` on a pod create → `Capacity` (the spec: "this GPU and data center combination
///   could not be placed" *or* a cross-field rule break, which it does not tell apart;
///   "Try your next candidate"); `400` anywhere else → `InvalidRequest`;
/// - `400` on a pod start → `Capacity`. The spec documents no capacity answer for
///   `podAction` (only the generic `BadRequestError`, "malformed or conflicts with request
///   rules"); the body gpuprov sends (`{"action": "start"}`) breaks no rule, so a `400`
///   is read as the `createPod` table reads it: the pod cannot be placed now (its host has
///   no free GPU). Capacity on a start keeps the stopped pod and never fails over;
/// - `402` → `Credentials`: insufficient balance, "Stop; no candidate will succeed". Not
///   capacity, so the search aborts rather than trying other offers;
/// - `401` and `403` → `Credentials`. For `createPod` the spec reads a `403` as "your
///   account cannot access the requested pool" (skip the candidate), but a `403` is also
///   what a key without write access gets (`ForbiddenError`: "the bearer token is valid,
///   but it does not grant access") and the two are not told apart; aborting with the
///   detail is the reading that never loops through every offer on a bad key;
/// - `422` → `InvalidRequest` (a contract violation: "Fix the request. Never retry.");
/// - anything else (`404`, `409`, ...) → `Failed`: an unknown error is never taken for
///   capacity. Callers for which `404` means success (delete) test for it first.
///
/// `secret` (the API key) is scrubbed from the message, in case a server ever echoes it.
pub fn classify(e: &ApiError, call: Call, what: &str, secret: Option<&str>) -> ProviderError {
    let kind = match (e.status, call) {
        (None, _) => ErrorKind::Transient,
        (Some(429), _) => ErrorKind::Transient,
        (Some(s), _) if s >= 500 => ErrorKind::Transient,
        (Some(400), Call::CreatePod | Call::StartPod) => ErrorKind::Capacity,
        (Some(400), Call::Other) => ErrorKind::InvalidRequest,
        (Some(401..=403), _) => ErrorKind::Credentials,
        (Some(422), _) => ErrorKind::InvalidRequest,
        _ => ErrorKind::Failed,
    };
    let mut msg = match (e.status, e.message.is_empty()) {
        (Some(_), false) if e.raw => format!("runpod {what}: {}", e.message),
        (Some(s), true) => format!("runpod {what}: HTTP {s}"),
        (Some(s), false) => format!("runpod {what}: HTTP {s}: {}", e.message),
        (None, _) => format!("runpod {what}: {}", e.message),
    };
    match e.status {
        Some(402) => msg.push_str(
            "; the RunPod account's balance is insufficient: add funds (no other offer can \
             succeed)",
        ),
        Some(401 | 403) => msg.push_str(&format!(
            "; check the API key ({} or ~/.runpod/config.toml) and its permissions",
            super::API_KEY_ENV
        )),
        Some(400) if call == Call::CreatePod => msg.push_str(
            " (RunPod answers both \"no capacity\" and a broken rule with 400; if every offer \
             fails so, the request itself is the problem)",
        ),
        Some(400) if call == Call::StartPod => msg.push_str(
            " (read as no capacity to start the stopped pod now: it is kept, with its disk)",
        ),
        _ => {}
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

    /// An error body in the spec's `ErrorResponse` shape.
    fn body(status: u16, detail: &str) -> String {
        serde_json::json!({"title": "T", "status": status, "detail": detail}).to_string()
    }

    fn kind(status: u16, call: Call) -> ErrorKind {
        classify(
            &ApiError::from_response(status, &body(status, "d"), None, None),
            call,
            "x",
            None,
        )
        .kind
    }

    #[test]
    fn statuses_follow_the_create_pod_table() {
        assert_eq!(kind(400, Call::CreatePod), ErrorKind::Capacity);
        assert_eq!(kind(400, Call::Other), ErrorKind::InvalidRequest);
        assert_eq!(kind(402, Call::CreatePod), ErrorKind::Credentials);
        assert_eq!(kind(401, Call::Other), ErrorKind::Credentials);
        assert_eq!(kind(403, Call::CreatePod), ErrorKind::Credentials);
        assert_eq!(kind(422, Call::CreatePod), ErrorKind::InvalidRequest);
        assert_eq!(kind(429, Call::CreatePod), ErrorKind::Transient);
        assert_eq!(kind(500, Call::CreatePod), ErrorKind::Transient);
        assert_eq!(kind(503, Call::Other), ErrorKind::Transient);
    }

    #[test]
    fn an_unknown_error_is_never_capacity() {
        assert_eq!(kind(404, Call::CreatePod), ErrorKind::Failed);
        assert_eq!(kind(409, Call::CreatePod), ErrorKind::Failed);
        assert_eq!(kind(418, Call::CreatePod), ErrorKind::Failed);
        // A detail that says "capacity" on a non-create call is still not capacity.
        let e = ApiError::from_response(400, &body(400, "no capacity"), None, None);
        assert_eq!(
            classify(&e, Call::Other, "x", None).kind,
            ErrorKind::InvalidRequest
        );
        // A 402 is not capacity either (it must not fail over).
        assert_ne!(kind(402, Call::CreatePod), ErrorKind::Capacity);
    }

    #[test]
    fn rate_limit_is_transient_with_retry_after() {
        let e = ApiError::from_response(429, &body(429, "slow down"), Some("12"), None);
        let p = classify(&e, Call::CreatePod, "create", None);
        assert_eq!(
            (p.kind, p.retry_after_secs),
            (ErrorKind::Transient, Some(12))
        );
        // No Retry-After: the exhausted window of the RateLimit header.
        let e = ApiError::from_response(
            429,
            &body(429, "slow down"),
            None,
            Some("\"minute\";r=0;t=7, \"hour\";r=2800;t=1812"),
        );
        assert_eq!(e.retry_after_secs, Some(7));
        // Neither: still transient, no hint.
        let e = ApiError::from_response(429, "", Some("Wed, 21 Oct 2026 07:28:00 GMT"), None);
        let p = classify(&e, Call::Other, "x", None);
        assert_eq!((p.kind, p.retry_after_secs), (ErrorKind::Transient, None));
        // A hint on a non-transient error is dropped.
        let e = ApiError::from_response(400, &body(400, "x"), Some("3"), None);
        assert_eq!(
            classify(&e, Call::CreatePod, "x", None).retry_after_secs,
            None
        );
    }

    #[test]
    fn rate_limit_header_parsing() {
        assert_eq!(
            exhausted_window_secs("\"minute\";r=0;t=12, \"hour\";r=0;t=1812"),
            Some(1812)
        );
        assert_eq!(exhausted_window_secs("\"minute\";r=3;t=12"), None);
        assert_eq!(exhausted_window_secs("garbage"), None);
    }

    #[test]
    fn validation_errors_and_non_problem_bodies() {
        let b = serde_json::json!({
            "title": "Unprocessable Entity", "status": 422,
            "detail": "Request validation failed.",
            "errors": ["$: additional properties 'bogus' not allowed"]
        })
        .to_string();
        let p = classify(
            &ApiError::from_response(422, &b, None, None),
            Call::CreatePod,
            "create",
            None,
        );
        assert_eq!(p.kind, ErrorKind::InvalidRequest);
        assert!(p.msg.contains("bogus"), "{}", p.msg);
        let e = ApiError::from_response(502, "<html>bad gateway</html>", None, None);
        assert_eq!(e.title, None);
        assert!(e.raw);
        assert_eq!(
            classify(&e, Call::Other, "x", None).kind,
            ErrorKind::Transient
        );
        assert!(ApiError::from_response(404, "", None, None).is_not_found());
        let transport = ApiError {
            status: None,
            title: None,
            message: "connection reset".into(),
            raw: false,
            retry_after_secs: None,
        };
        assert_eq!(
            classify(&transport, Call::CreatePod, "x", None).kind,
            ErrorKind::Transient
        );
    }

    #[test]
    fn a_body_that_is_no_problem_document_is_one_short_line() {
        let page = format!(
            "<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n<body>{}</body></html>",
            "<p>nginx</p>\n".repeat(200)
        );
        let e = ApiError::from_http(502, Some("text/html; charset=utf-8"), &page, None, None);
        let p = classify(&e, Call::Other, "list pods", None);
        assert_eq!(
            p.msg,
            "runpod list pods: HTTP 502 (text/html): 502 Bad Gateway"
        );
        let e = ApiError::from_http(400, Some("text/plain"), "bad start\nmore", None, None);
        let p = classify(&e, Call::StartPod, "start pod p", None);
        assert_eq!(p.kind, ErrorKind::Capacity);
        assert!(
            p.msg
                .starts_with("runpod start pod p: HTTP 400 (text/plain): bad start"),
            "{}",
            p.msg
        );
        // The vendor's detail, when the body is the problem document.
        let e = ApiError::from_http(
            503,
            Some("application/problem+json"),
            &body(503, "upstream down"),
            None,
            None,
        );
        assert_eq!(
            classify(&e, Call::Other, "x", None).msg,
            "runpod x: HTTP 503: upstream down"
        );
    }

    #[test]
    fn messages_say_what_to_do_and_never_hold_the_secret() {
        let e = ApiError::from_response(
            401,
            &body(401, "bearer secret_sentinel_123 is invalid"),
            None,
            None,
        );
        let p = classify(&e, Call::Other, "list pods", Some("secret_sentinel_123"));
        assert_eq!(p.kind, ErrorKind::Credentials);
        assert!(!p.msg.contains("secret_sentinel_123"), "{}", p.msg);
        assert!(p.msg.contains("RUNPOD_API_KEY"), "{}", p.msg);
        let e = ApiError::from_response(402, &body(402, "insufficient balance"), None, None);
        let p = classify(&e, Call::CreatePod, "create", None);
        assert!(p.msg.contains("add funds"), "{}", p.msg);
    }
}
