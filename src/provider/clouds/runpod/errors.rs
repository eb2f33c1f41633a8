//! RunPod REST v2 errors as data (design 4.1): the error-body decoder, the
//! [`Classifier`] table, and the "not found" predicate.
//!
//! RunPod answers every error as RFC 9457 `application/problem+json`
//! (`ErrorResponse{title, status, detail, errors?}`, spec `components.schemas`). There is
//! no machine-readable error code: the spec says capacity exhaustion "currently carries no
//! machine-readable code of its own — only a human-readable `detail`". So the kind comes
//! from the HTTP status and from which call failed ([`Call`]), following the retry table
//! in the `createPod` description; `detail` only travels into the text shown to the user.
//!
//! The kit's defaults cover the rest of that table: no response (a timeout, a reset) and
//! any `5xx` → `Transient` ("retry the same candidate"); `429` → `Transient` with the
//! delay of `Retry-After` (integer seconds, spec `TooManyRequestsError`) or else of the
//! exhausted window of the structured `RateLimit` header (spec `RateLimitHeader`), never
//! a failover; a refused connection → `Unreachable`; `401` / `403` → `Credentials`; any
//! other status (`404`, `409`, …) → `Failed`: an unknown error is never taken for
//! capacity. Callers for which `404` means success (delete) test [`Failure::is_not_found`] first.

use serde::Deserialize;

use crate::provider::kit::failure::{Classifier, Failure, Rule};
use crate::provider::kit::http::RateHeaders;
use crate::provider::kit::Call as KitCall;
use crate::provider::{cause, ErrorKind, ProviderError};

/// `ErrorResponse` (RFC 9457 problem document), the fields gpuprov shows.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Problem {
    title: String,
    detail: String,
    errors: Vec<String>,
}

/// Which kind of call failed: a `400` means "try the next candidate" only for a pod
/// create (the `createPod` table) or start; anywhere else it is a request gpuprov built
/// wrongly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// `POST /v2/pods`.
    CreatePod,
    /// `POST /v2/pods/{id}/action` with `start`.
    StartPod,
    /// Any other call (catalog, pods list, SSH keys, delete).
    Other,
}

impl Call {
    /// The name [`Rule::on`] matches.
    pub fn name(self) -> &'static str {
        match self {
            Call::CreatePod => "create",
            Call::StartPod => "start",
            Call::Other => "other",
        }
    }

    /// The kit's call, described by `what` (which starts the message).
    pub fn what(self, what: &str) -> KitCall<'_> {
        KitCall::named(self.name(), what)
    }
}

/// Shown with a `402`, as help.
const ADD_FUNDS: &str =
    "the RunPod account's balance is insufficient: add funds (no other offer can succeed)";
/// Shown with a `401` / `403` and a missing key, as help.
const CHECK_KEY: &str =
    "check the API key (RUNPOD_API_KEY or ~/.runpod/config.toml) and its permissions";

/// The vendor's table, first match wins (the kit's defaults follow it).
const RULES: &[Rule] = &[
    // `createPod` 400: "this GPU and data center combination could not be placed" *or* a
    // cross-field rule break, which the spec does not tell apart; "Try your next
    // candidate".
    Rule::status(400, ErrorKind::Capacity).on("create").help(
        "RunPod answers both \"no capacity\" and a broken rule with 400; if every offer fails \
         so, the request itself is the problem",
    ),
    // `podAction` documents no capacity answer (only the generic `BadRequestError`,
    // "malformed or conflicts with request rules"); the body gpuprov sends (`{"action":
    // "start"}`) breaks no rule, so a 400 is read as the `createPod` table reads it: the
    // pod cannot be placed now (its host has no free GPU). Capacity on a start keeps the
    // stopped pod and never fails over.
    Rule::status(400, ErrorKind::Capacity)
        .on("start")
        .help("read as no capacity to start the stopped pod now: it is kept, with its disk"),
    // `BadRequestError` on any other call: a request gpuprov built wrongly.
    Rule::status(400, ErrorKind::InvalidRequest),
    // `createPod` 402, insufficient balance: "Stop; no candidate will succeed". Not
    // capacity, so the search aborts rather than trying other offers.
    Rule::status(402, ErrorKind::Credentials).help(ADD_FUNDS),
    // `createPod` 403 reads "your account cannot access the requested pool" (skip the
    // candidate), but a 403 is also what a key without write access gets
    // (`ForbiddenError`: "the bearer token is valid, but it does not grant access") and
    // the two are not told apart; the kit's default (`Credentials`) is the reading that
    // never loops through every offer on a bad key.
    // `422` `ValidationError`, a contract violation: "Fix the request. Never retry."
    Rule::status(422, ErrorKind::InvalidRequest),
];

/// RunPod's classifier.
pub static CLASSIFIER: Classifier = Classifier {
    cloud: "runpod",
    rules: RULES,
    credentials_help: CHECK_KEY,
};

/// The kit's error decoder for RunPod: no code; the message `HTTP <s>: <detail>` (the
/// `title` when `detail` is empty, plus the `errors` list of a `422`) for a problem
/// document, else the short cause of [`cause::http_cause`] (status, content type, first
/// line), never a dumped page.
///
/// What the user must do on a `402` or a `401` / `403` is the error's `help`, which the
/// core shows after the message (`ProviderError::text`).
pub fn decode(status: u16, content_type: Option<&str>, body: &str) -> (Option<String>, String) {
    let message = match serde_json::from_str::<Problem>(body) {
        Ok(p) if !p.title.is_empty() || !p.detail.is_empty() => {
            let mut m = p.detail.trim().to_string();
            if m.is_empty() {
                m = p.title.trim().to_string();
            }
            if !p.errors.is_empty() {
                m = format!("{m} [{}]", p.errors.join("; "));
            }
            if m.is_empty() {
                format!("HTTP {status}")
            } else {
                format!("HTTP {status}: {m}")
            }
        }
        _ => cause::http_cause(status, content_type, body),
    };
    (None, message)
}

/// Builds the [`Failure`] of an HTTP answer outside the client (property tests).
pub struct ApiError;

impl ApiError {
    /// The failure of an answer with `status`, `body`, and the `Retry-After` and
    /// `RateLimit` header values, as the client would report it.
    pub fn from_response(
        status: u16,
        body: &str,
        retry_after: Option<&str>,
        rate_limit: Option<&str>,
    ) -> Failure {
        ApiError::from_http(status, None, body, retry_after, rate_limit)
    }

    /// [`ApiError::from_response`] with the response's `Content-Type`.
    pub fn from_http(
        status: u16,
        content_type: Option<&str>,
        body: &str,
        retry_after: Option<&str>,
        rate_limit: Option<&str>,
    ) -> Failure {
        let (code, message) = decode(status, content_type, body);
        let rate = RateHeaders {
            retry_after: retry_after.map(str::to_string),
            structured: rate_limit.map(str::to_string),
            ..RateHeaders::default()
        };
        Failure::http(status, code, message).with_retry_after(rate.delay_secs(status, 0))
    }
}

/// The contract's error for `f` on `call`; `what` starts the message, `secret` is
/// scrubbed from it.
pub fn classify(f: &Failure, call: Call, what: &str, secret: Option<&str>) -> ProviderError {
    CLASSIFIER.classify(f, call.what(what), secret)
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
        assert_eq!(kind(400, Call::StartPod), ErrorKind::Capacity);
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
        assert_eq!(e.code, None);
        assert_eq!(e.message, "HTTP 502: bad gateway");
        assert_eq!(
            classify(&e, Call::Other, "x", None).kind,
            ErrorKind::Transient
        );
        assert!(ApiError::from_response(404, "", None, None).is_not_found());
        let transport = Failure::transport(false, "connection reset");
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
        assert!(p.help.unwrap().contains("it is kept"));
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
        assert!(p.text().contains("RUNPOD_API_KEY"), "{}", p.text());
        assert!(p.help.as_deref().unwrap().contains("RUNPOD_API_KEY"));
        let e = ApiError::from_response(402, &body(402, "insufficient balance"), None, None);
        let p = classify(&e, Call::CreatePod, "create", None);
        assert!(p.text().contains("add funds"), "{}", p.text());
        assert_eq!(p.help.as_deref(), Some(ADD_FUNDS));
        let e = ApiError::from_response(400, &body(400, "x"), None, None);
        let p = classify(&e, Call::CreatePod, "create", None);
        assert_eq!(p.msg, "runpod create: HTTP 400: x");
        assert!(p.help.unwrap().contains("answers both"));
    }
}
