//! Classification of DigitalOcean API errors into [`ErrorKind`]s (design 4.1).
//!
//! Every 4xx/5xx answer carries the `error` schema of the API description: `{"id",
//! "message", "request_id"?}`, where `id` names the HTTP status (`not_found`,
//! `unauthorized`, `too_many_requests`, `unprocessable_entity`, ...). DigitalOcean has no
//! finer machine-readable code: capacity and quota refusals are both HTTP 422
//! `unprocessable_entity` and differ only in `message` (SOURCES.md, "Capacity / quota",
//! from DigitalOcean issue threads). So the kind comes from the status, and for 422 from a
//! short list of known message phrases; an unknown message is `Failed`, never `Capacity`.

use serde::Deserialize;

use crate::provider::{ErrorKind, ProviderError};

/// `error.id` of a 404 (spec `error` schema example).
pub const NOT_FOUND: &str = "not_found";

/// Phrases (lowercase) of a 422 `message` meaning the account's droplet limit is reached
/// ("creating this/these droplet(s) will exceed your droplet limit"): `Quota`.
pub const QUOTA_PHRASES: &[&str] = &["droplet limit"];
/// Phrases (lowercase) of a 422 `message` meaning the size cannot be created in the region
/// now ("size is unavailable", "Size is not available in this region"): `Capacity` for
/// the offer.
pub const SIZE_UNAVAILABLE_PHRASES: &[&str] = &[
    "size is unavailable",
    "size is not available",
    "not available in this region",
];
/// Phrases (lowercase) of a 422 `message` meaning the region takes no new droplets at all
/// ("Region is not available"): `Capacity` blocking the whole region.
pub const REGION_UNAVAILABLE_PHRASES: &[&str] = &["region is not available"];

/// A failed API call as DigitalOcean reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status; `None` when no response arrived (connection, timeout).
    pub status: Option<u16>,
    /// `error.id`, when the body was the documented error object.
    pub id: Option<String>,
    /// `error.message`; for a body that is not the error object, a short cause
    /// ([`crate::provider::cause::http_cause`]); or a transport description.
    pub message: String,
    /// Seconds to wait before the next call: `retry-after` (sent on burst-limit 429s), else
    /// on a 429 `ratelimit-reset` (Unix epoch seconds) minus now.
    pub retry_after_secs: Option<u64>,
    /// No response: the endpoint refused the connection (or its name did not resolve),
    /// [`crate::provider::cause::is_refused`].
    pub refused: bool,
}

#[derive(Deserialize)]
struct ErrorBody {
    id: String,
    #[serde(default)]
    message: String,
}

/// The rate-limit headers of a response (spec `components.headers`, "Rate Limit").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateHeaders {
    /// `retry-after`, seconds.
    pub retry_after: Option<u64>,
    /// `ratelimit-remaining`, requests left in the hourly window.
    pub remaining: Option<u64>,
    /// `ratelimit-reset`, Unix epoch seconds when the oldest counted request expires.
    pub reset_epoch: Option<u64>,
}

/// Longest delay a `ratelimit-reset` hint may ask for (DigitalOcean's window is one hour).
const MAX_RESET_WAIT_SECS: u64 = 3600;

impl ApiError {
    /// An error from an HTTP response: status, `Content-Type`, raw body, rate-limit headers
    /// and the current Unix time in seconds (to turn `ratelimit-reset` into a delay). A
    /// body that is not the error object (an HTML page from a proxy, plain text) is reduced
    /// to one short line naming the status and content type, never kept whole.
    pub fn from_response(
        status: u16,
        content_type: Option<&str>,
        body: &str,
        rate: RateHeaders,
        now_epoch: u64,
    ) -> ApiError {
        let retry_after_secs = if status == 429 {
            rate.retry_after.or_else(|| {
                rate.reset_epoch
                    .filter(|_| rate.remaining.is_none_or(|r| r == 0))
                    .map(|reset| {
                        reset
                            .saturating_sub(now_epoch)
                            .clamp(1, MAX_RESET_WAIT_SECS)
                    })
            })
        } else {
            rate.retry_after
        };
        match serde_json::from_str::<ErrorBody>(body) {
            Ok(e) => ApiError {
                status: Some(status),
                id: Some(e.id),
                message: e.message.trim().to_string(),
                retry_after_secs,
                refused: false,
            },
            Err(_) => ApiError {
                status: Some(status),
                id: None,
                message: crate::provider::cause::http_cause(status, content_type, body),
                retry_after_secs,
                refused: false,
            },
        }
    }

    /// Whether DigitalOcean said the object does not exist (HTTP 404, `not_found`).
    pub fn is_not_found(&self) -> bool {
        self.status == Some(404) || (self.status.is_some() && self.id.as_deref() == Some(NOT_FOUND))
    }

    fn message_has(&self, phrases: &[&str]) -> bool {
        let m = self.message.to_lowercase();
        phrases.iter().any(|p| m.contains(p))
    }
}

/// The scope a classified error asks the core to block, beyond the kind's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The kind's default scope (design 4.1).
    Default,
    /// Every offer in the region of the failed offer.
    Region,
}

/// Maps a DigitalOcean error onto the contract's kinds. `what` names the call (for example
/// `create gpu-h100x1-80gb in tor1`) and starts the message. Returns the error and the
/// scope to block.
///
/// - no response because the endpoint refused the connection → `Unreachable` (the core
///   blocks the whole cloud at once);
/// - no response otherwise (timeout, reset) → `Transient`;
/// - HTTP 429 → `Transient` with the hinted delay (never failover);
/// - 5xx → `Transient`;
/// - 401 / 403 → `Credentials`;
/// - 422 whose message says the droplet limit is exceeded → `Quota` (blocks the region);
/// - 422 saying the size is unavailable (in this region) → `Capacity` (blocks the offer);
/// - 422 saying the region is not available → `Capacity` blocking the whole region;
/// - 400 and 404 → `InvalidRequest` (callers for which "not found" means success test
///   for it first);
/// - anything else, including any other 422 → `Failed`: an unknown error is never taken
///   for capacity.
///
/// `secret` (the token) is scrubbed from the message, in case a server ever echoes it.
pub fn classify(e: &ApiError, what: &str, secret: Option<&str>) -> (ProviderError, Scope) {
    let mut scope = Scope::Default;
    let kind = match e.status {
        None if e.refused => ErrorKind::Unreachable,
        None => ErrorKind::Transient,
        Some(429) => ErrorKind::Transient,
        Some(s) if s >= 500 => ErrorKind::Transient,
        Some(401 | 403) => ErrorKind::Credentials,
        Some(422) if e.message_has(QUOTA_PHRASES) => ErrorKind::Quota,
        Some(422) if e.message_has(REGION_UNAVAILABLE_PHRASES) => {
            scope = Scope::Region;
            ErrorKind::Capacity
        }
        Some(422) if e.message_has(SIZE_UNAVAILABLE_PHRASES) => ErrorKind::Capacity,
        Some(400 | 404) => ErrorKind::InvalidRequest,
        Some(_) => ErrorKind::Failed,
    };
    let mut msg = match (e.status, e.id.as_deref()) {
        (Some(s), Some(id)) => format!("digitalocean {what}: {id} (HTTP {s}): {}", e.message),
        (Some(s), None) if e.message.is_empty() => format!("digitalocean {what}: HTTP {s}"),
        // `message` is already the short cause, starting with the status.
        (Some(_), None) => format!("digitalocean {what}: {}", e.message),
        (None, _) => format!("digitalocean {what}: {}", e.message),
    };
    if kind == ErrorKind::Credentials {
        msg.push_str(&format!(
            "; check the token in {} / {} or doctl's config.yaml",
            super::TOKEN_ENV,
            super::ACCESS_TOKEN_ENV
        ));
    }
    if let Some(s) = secret.filter(|s| !s.is_empty()) {
        msg = msg.replace(s, "REDACTED");
    }
    let err = ProviderError {
        kind,
        msg,
        block: None,
        retry_after_secs: if kind == ErrorKind::Transient {
            e.retry_after_secs
        } else {
            None
        },
        help: None,
    };
    (err, scope)
}

#[cfg(test)]
mod tests {
    use super::*;

    const JSON: Option<&str> = Some("application/json");

    fn body(id: &str, message: &str) -> String {
        serde_json::json!({"id": id, "message": message, "request_id": "4d9d8375"}).to_string()
    }

    fn classified(status: u16, id: &str, message: &str) -> (ErrorKind, Scope) {
        let e =
            ApiError::from_response(status, JSON, &body(id, message), RateHeaders::default(), 0);
        let (p, s) = classify(&e, "x", None);
        (p.kind, s)
    }

    #[test]
    fn documented_422_messages_decide_quota_and_capacity() {
        let k = |m: &str| classified(422, "unprocessable_entity", m);
        assert_eq!(
            k("creating this/these droplet(s) will exceed your droplet limit"),
            (ErrorKind::Quota, Scope::Default)
        );
        assert_eq!(
            k("Size is not available in this region."),
            (ErrorKind::Capacity, Scope::Default)
        );
        assert_eq!(
            k("The size is unavailable at this time."),
            (ErrorKind::Capacity, Scope::Default)
        );
        assert_eq!(
            k("Region is not available"),
            (ErrorKind::Capacity, Scope::Region)
        );
    }

    #[test]
    fn an_unknown_error_is_never_capacity() {
        assert_eq!(
            classified(422, "unprocessable_entity", "Image is not valid").0,
            ErrorKind::Failed
        );
        assert_eq!(
            classified(409, "conflict", "Not enough capacity").0,
            ErrorKind::Failed
        );
        assert_eq!(
            classified(418, "teapot", "").0,
            ErrorKind::Failed,
            "unknown status"
        );
    }

    #[test]
    fn statuses_decide_the_rest() {
        assert_eq!(
            classified(401, "unauthorized", "Unable to authenticate you").0,
            ErrorKind::Credentials
        );
        assert_eq!(
            classified(403, "forbidden", "You do not have access").0,
            ErrorKind::Credentials
        );
        assert_eq!(
            classified(404, NOT_FOUND, "not found").0,
            ErrorKind::InvalidRequest
        );
        assert_eq!(
            classified(400, "bad_request", "bad").0,
            ErrorKind::InvalidRequest
        );
        assert_eq!(
            classified(500, "server_error", "oops").0,
            ErrorKind::Transient
        );
        assert_eq!(
            classified(503, "service_unavailable", "").0,
            ErrorKind::Transient
        );
        let transport = ApiError {
            status: None,
            id: None,
            message: "operation timed out".into(),
            retry_after_secs: None,
            refused: false,
        };
        assert_eq!(classify(&transport, "x", None).0.kind, ErrorKind::Transient);
        let refused = ApiError {
            message: "connection refused".into(),
            refused: true,
            ..transport
        };
        assert_eq!(classify(&refused, "x", None).0.kind, ErrorKind::Unreachable);
        let html =
            ApiError::from_response(502, Some("text/html"), "<html>", RateHeaders::default(), 0);
        assert_eq!(classify(&html, "x", None).0.kind, ErrorKind::Transient);
        assert!(ApiError::from_response(404, None, "", RateHeaders::default(), 0).is_not_found());
    }

    #[test]
    fn a_page_that_is_not_the_error_object_becomes_one_short_line() {
        let page = format!(
            "<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n<body>{}</body></html>",
            "<p>cloudflare</p>".repeat(200)
        );
        let e = ApiError::from_response(
            502,
            Some("text/html; charset=UTF-8"),
            &page,
            RateHeaders::default(),
            0,
        );
        let (p, _) = classify(&e, "list sizes", None);
        assert_eq!(p.kind, ErrorKind::Transient);
        assert_eq!(
            p.msg,
            "digitalocean list sizes: HTTP 502 (text/html): 502 Bad Gateway"
        );
    }

    #[test]
    fn a_429_carries_the_hinted_delay() {
        let b = body("too_many_requests", "API Rate limit exceeded.");
        // Burst limit: retry-after wins.
        let rate = RateHeaders {
            retry_after: Some(7),
            remaining: Some(0),
            reset_epoch: Some(1_000_100),
        };
        let p = classify(
            &ApiError::from_response(429, JSON, &b, rate, 1_000_000),
            "x",
            None,
        )
        .0;
        assert_eq!(
            (p.kind, p.retry_after_secs),
            (ErrorKind::Transient, Some(7))
        );
        // Hourly limit: no retry-after, wait until ratelimit-reset.
        let rate = RateHeaders {
            retry_after: None,
            remaining: Some(0),
            reset_epoch: Some(1_000_042),
        };
        let p = classify(
            &ApiError::from_response(429, JSON, &b, rate, 1_000_000),
            "x",
            None,
        )
        .0;
        assert_eq!(p.retry_after_secs, Some(42));
        // A reset in the past still waits a second; no headers: no hint.
        let rate = RateHeaders {
            retry_after: None,
            remaining: Some(0),
            reset_epoch: Some(5),
        };
        let p = classify(
            &ApiError::from_response(429, JSON, &b, rate, 1_000_000),
            "x",
            None,
        )
        .0;
        assert_eq!(p.retry_after_secs, Some(1));
        let p = classify(
            &ApiError::from_response(429, JSON, &b, RateHeaders::default(), 0),
            "x",
            None,
        )
        .0;
        assert_eq!((p.kind, p.retry_after_secs), (ErrorKind::Transient, None));
    }

    #[test]
    fn the_secret_never_reaches_the_message() {
        let e = ApiError::from_response(
            401,
            JSON,
            &body("unauthorized", "token dop_v1_sentinel is invalid"),
            RateHeaders::default(),
            0,
        );
        let (p, _) = classify(&e, "list", Some("dop_v1_sentinel"));
        assert_eq!(p.kind, ErrorKind::Credentials);
        assert!(!p.msg.contains("dop_v1_sentinel"), "{}", p.msg);
        assert!(p.msg.contains("DIGITALOCEAN_TOKEN"), "{}", p.msg);
    }
}
