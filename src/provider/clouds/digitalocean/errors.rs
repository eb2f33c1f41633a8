//! DigitalOcean's errors as data (design 4.1): the error body decoder and the table that
//! classifies a [`Failure`] into the contract's kinds.
//!
//! Every 4xx/5xx answer carries the `error` schema of the API description: `{"id",
//! "message", "request_id"?}`, where `id` names the HTTP status (`not_found`,
//! `unauthorized`, `too_many_requests`, `unprocessable_entity`, ...). DigitalOcean has no
//! finer machine-readable code: capacity and quota refusals are both HTTP 422
//! `unprocessable_entity` and differ only in `message` (SOURCES.md, "Capacity / quota",
//! from DigitalOcean issue threads). So the kind comes from the status, and for 422 from a
//! short list of known message phrases; an unknown message is `Failed`, never `Capacity`.
//!
//! Beyond the table, the kit's defaults hold: a refused connection → `Unreachable`, no
//! response otherwise → `Transient`, 429 → `Transient` with `retry-after`, else the wait
//! until `ratelimit-reset` (spec "Rate Limit"; never failover), 5xx → `Transient`,
//! 401 / 403 → `Credentials`, anything else (including any other 422) → `Failed`.

use serde::Deserialize;

use crate::provider::kit::http::{failure_of, RateHeaders as Headers};
use crate::provider::kit::{Call, Classifier, Failure, Rule};
use crate::provider::{cause, ErrorKind, ProviderError};

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
/// Phrase of the 422 refusing a key whose value is already registered ("SSH Key is already
/// in use on your account").
pub const KEY_IN_USE_PHRASES: &[&str] = &["already in use"];
/// Phrase of the 422 refusing a tag that exists already.
pub const TAG_EXISTS_PHRASES: &[&str] = &["exist"];

/// DigitalOcean's statuses and 422 messages, in the order they are tried.
const RULES: &[Rule] = &[
    // 422, a key of this value is registered already: it exists (the shared key's node
    // observes again and adopts it), never a failed offer.
    Rule::status(422, ErrorKind::Exists).phrases(KEY_IN_USE_PHRASES),
    // 422 `unprocessable_entity`, `message` naming the droplet limit: blocks the region
    // (the kind's default scope).
    Rule::status(422, ErrorKind::Quota).phrases(QUOTA_PHRASES),
    // 422, the region takes no droplets: blocks every offer of the region (on the calls
    // that name one: create, start).
    Rule::status(422, ErrorKind::Capacity)
        .phrases(REGION_UNAVAILABLE_PHRASES)
        .region_wide(),
    // 422, the size cannot be created in the region now: blocks the offer.
    Rule::status(422, ErrorKind::Capacity).phrases(SIZE_UNAVAILABLE_PHRASES),
    // 400 `bad_request`, 404 `not_found` (delete, cleanup and start test for not found
    // first).
    Rule::status(400, ErrorKind::InvalidRequest),
    Rule::status(404, ErrorKind::InvalidRequest),
];

/// DigitalOcean's classifier.
pub static CLASSIFIER: Classifier = Classifier {
    cloud: super::CLOUD,
    rules: RULES,
    credentials_help: "check the token in DIGITALOCEAN_TOKEN / DIGITALOCEAN_ACCESS_TOKEN or \
                       doctl's config.yaml",
};

#[derive(Deserialize)]
struct ErrorBody {
    id: String,
    #[serde(default)]
    message: String,
}

/// The error body decoder: `error.id` as the code and `error.message`. A body that is not
/// the error object (an HTML page from a proxy, plain text) is reduced to one short line
/// naming the status and content type, never kept whole.
pub fn decode_error(
    status: u16,
    content_type: Option<&str>,
    body: &str,
) -> (Option<String>, String) {
    match serde_json::from_str::<ErrorBody>(body) {
        Ok(e) => (Some(e.id), e.message.trim().to_string()),
        Err(_) => (None, cause::http_cause(status, content_type, body)),
    }
}

/// Whether DigitalOcean said the object does not exist (HTTP 404, `not_found`).
pub fn is_not_found(f: &Failure) -> bool {
    f.http_status() == Some(404) || (f.http_status().is_some() && f.has_code(NOT_FOUND))
}

/// Whether the failure is a 422 whose message has one of `phrases`.
pub fn is_422(f: &Failure, phrases: &[&str]) -> bool {
    f.http_status() == Some(422) && f.message_has(phrases)
}

/// The rate-limit headers of a response as numbers (spec `components.headers`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateHeaders {
    /// `retry-after`, seconds.
    pub retry_after: Option<u64>,
    /// `ratelimit-remaining`, requests left in the hourly window.
    pub remaining: Option<u64>,
    /// `ratelimit-reset`, Unix epoch seconds when the oldest counted request expires.
    pub reset_epoch: Option<u64>,
}

/// The scope a classified error asks the core to block, beyond the kind's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The kind's default scope (design 4.1).
    Default,
    /// Every offer in the region of the failed offer.
    Region,
}

/// One error response as DigitalOcean sent it (status, `Content-Type`, body, rate-limit
/// headers, the time), decoded; for classifying answers without a server (the property
/// tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError(pub Failure);

impl ApiError {
    pub fn from_response(
        status: u16,
        content_type: Option<&str>,
        body: &str,
        rate: RateHeaders,
        now_epoch: u64,
    ) -> ApiError {
        let text = |v: Option<u64>| v.map(|n| n.to_string());
        let headers = Headers {
            retry_after: text(rate.retry_after),
            remaining: text(rate.remaining),
            reset: text(rate.reset_epoch),
            structured: None,
        };
        ApiError(failure_of(
            decode_error,
            status,
            content_type,
            body,
            &headers,
            now_epoch,
        ))
    }
}

/// [`CLASSIFIER`] on `e`, the message starting `digitalocean <what>: `, `secret` scrubbed;
/// with the scope its rule asks for.
pub fn classify(e: &ApiError, what: &str, secret: Option<&str>) -> (ProviderError, Scope) {
    let mut err = CLASSIFIER.classify(&e.0, Call::other(what).in_region(""), secret);
    let scope = match err.block.take() {
        Some(_) => Scope::Region,
        None => Scope::Default,
    };
    (err, scope)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::kit::testing::proxy_page;

    const JSON: Option<&str> = Some("application/json");
    /// A Unix time in the range `ratelimit-reset` is sent in.
    const NOW: u64 = 1_700_000_000;

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
        let transport = Failure::transport(false, "operation timed out");
        let p = CLASSIFIER.classify(&transport, Call::other("x"), None);
        assert_eq!(p.kind, ErrorKind::Transient);
        let refused = Failure::transport(true, "connection refused");
        let p = CLASSIFIER.classify(&refused, Call::other("x"), None);
        assert_eq!(p.kind, ErrorKind::Unreachable);
        let html =
            ApiError::from_response(502, Some("text/html"), "<html>", RateHeaders::default(), 0);
        assert_eq!(classify(&html, "x", None).0.kind, ErrorKind::Transient);
        let gone = ApiError::from_response(404, None, "", RateHeaders::default(), 0);
        assert!(is_not_found(&gone.0));
    }

    #[test]
    fn a_page_that_is_not_the_error_object_becomes_one_short_line() {
        let page = proxy_page();
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
        let delay = |retry_after, remaining, reset_epoch| {
            let rate = RateHeaders {
                retry_after,
                remaining,
                reset_epoch,
            };
            let e = ApiError::from_response(429, JSON, &b, rate, NOW);
            let (p, _) = classify(&e, "x", None);
            assert_eq!(p.kind, ErrorKind::Transient);
            p.retry_after_secs
        };
        // Burst limit: retry-after wins.
        assert_eq!(delay(Some(7), Some(0), Some(NOW + 100)), Some(7));
        // Hourly limit: no retry-after, wait until ratelimit-reset.
        assert_eq!(delay(None, Some(0), Some(NOW + 42)), Some(42));
        // A reset in the past still waits a second; no headers: no hint.
        assert_eq!(delay(None, Some(0), Some(NOW - 5)), Some(1));
        assert_eq!(delay(None, None, None), None);
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
        assert!(!p.text().contains("dop_v1_sentinel"), "{}", p.text());
        // The hint is the help, shown after the message.
        assert!(p.text().contains("DIGITALOCEAN_TOKEN"), "{}", p.text());
    }
}
