//! Hyperstack Infrahub API errors as data (design 4.1): the envelope decoder (for error
//! statuses and for a 2xx whose envelope says `status: false`), the [`Classifier`]
//! table, and the "not found" predicate.
//!
//! Hyperstack answers 400/401/404/405/409 with the envelope `ErrorResponseModel {status:
//! false, message, error_reason}` (`components.schemas.ErrorResponseModel` of the vendor's
//! description) and 500 with no declared body. Unlike Lambda there is no machine-readable
//! error code: capacity and quota can only be recognised from the free text of `message`
//! and `error_reason` (SOURCES.md, Hyperstack: "create failures come back as 400/409
//! `ErrorResponseModel` with free-text `message`/`error_reason`"). So the phrases matched
//! here are deliberately narrow, are only looked for in the vendor's envelope (the
//! decoder marks it with an empty code, which `Rule::code("*")` requires; a proxy's page
//! is never searched), and anything not recognised is `Failed`, never `Capacity`.
//!
//! The kit's defaults cover the rest: no response (a timeout, a reset) → `Transient`, a
//! refused connection → `Unreachable`, `429` → `Transient` with the server's
//! `Retry-After` (the core retries the same offer, never fails over), anything else →
//! `Failed`.

use serde::Deserialize;
use serde_json::Value;

use crate::provider::kit::failure::{Classifier, Failure, Rule};
use crate::provider::kit::http::RateHeaders;
use crate::provider::kit::Call;
use crate::provider::{cause, ErrorKind, ProviderError};

/// The call name of a VM delete (its refusals while the VM is mid-transition are
/// `Transient`).
pub const DELETE: &str = "delete";

/// The call name of a shared object's create (`POST /core/environments`, `POST
/// /core/keypairs`): a `409` means the name is taken, so the object exists (`Exists`).
pub const CREATE_SHARED: &str = "create_shared";
/// The call name of an environment's delete: a `400` is a refusal of an environment that
/// still holds something (`InUse`).
pub const DELETE_ENVIRONMENT: &str = "delete_environment";

/// Phrases that mean the request hit a rate limit: transient, same offer.
const RATE_LIMIT: &[&str] = &["rate limit", "too many requests", "throttl"];
/// Phrases that mean an account or environment quota is exhausted. Checked before
/// [`CAPACITY_PHRASES`]: "exceeds your GPU limit" is quota even though it names GPUs.
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
/// Phrases a delete refusal uses when the VM is still being created (or is otherwise
/// mid-transition): the request must be repeated later.
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

/// Shown with a `401` to `403`, as help.
const CHECK_KEY: &str = "check the API key in HYPERSTACK_API_KEY and the account's billing status";
const NOT_DELETABLE: &str = "the VM is not deletable yet; will retry";

/// Hyperstack's classifier.
pub static CLASSIFIER: Classifier = Classifier {
    cloud: "hyperstack",
    rules: RULES,
    credentials_help: CHECK_KEY,
};

/// The vendor's table, first match wins (the kit's defaults follow it).
const RULES: &[Rule] = &[
    // 500 is declared without a body; any 5xx is retried in place, whatever it says.
    Rule {
        status: Some((500, 599)),
        ..Rule::new(ErrorKind::Transient)
    },
    // 401 / 403, and 402 ("Insufficient balance" in the vendor docs): the account cannot
    // be used until the key or the billing is fixed.
    Rule {
        status: Some((401, 403)),
        ..Rule::new(ErrorKind::Credentials)
    },
    // `DELETE /core/virtual-machines/{id}` refused while the VM is mid-transition
    // (typically still `CREATING`): a 409, or a 400 whose text says so. Retried; never
    // taken for a deletion.
    Rule::status(409, ErrorKind::Transient)
        .on(DELETE)
        .help(NOT_DELETABLE),
    Rule::code("*", ErrorKind::Transient)
        .with_status(400)
        .phrases(BUSY)
        .on(DELETE)
        .help(NOT_DELETABLE),
    // `Create_environment` and `Import_key_pair` declare `409 Conflict` (no text is
    // documented): the name is taken, by a concurrent create of the same object or by an
    // older one. The core observes again and adopts it (never a failed offer).
    Rule::status(409, ErrorKind::Exists)
        .on(CREATE_SHARED)
        .help("it exists already; gpuprov looks for it again"),
    // `Delete_environment` declares only 400/401/404/500: a well-formed delete by id
    // refused with 400 is an environment that still holds VMs, volumes or key pairs.
    // Retried (they may be going), then the record stays for the next run.
    Rule::status(400, ErrorKind::InUse)
        .on(DELETE_ENVIRONMENT)
        .help("the environment still holds resources; it is kept until they are gone"),
    // The envelope's free text (SOURCES.md): rate limit, then quota, then stock.
    Rule::code("*", ErrorKind::Transient).phrases(RATE_LIMIT),
    Rule::code("*", ErrorKind::Quota).phrases(QUOTA),
    Rule::code("*", ErrorKind::Capacity).phrases(CAPACITY_PHRASES),
    // 404 on anything but a delete (which tests `is_not_found` first): a request about an
    // object that is not there.
    Rule::status(404, ErrorKind::InvalidRequest),
];

/// `ErrorResponseModel`, the fields gpuprov shows.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Envelope {
    message: Option<String>,
    error_reason: Option<String>,
}

/// The kit's error decoder for Hyperstack. The envelope gives the empty code (the
/// vendor's own words) and `HTTP <s>: <message> (<error_reason>)` (each cut to 300
/// characters); any other body no code and the short cause of [`cause::http_cause`].
///
/// What the user must do on a `401` to `403` is the error's `help`, which the core shows
/// after the message (`ProviderError::text`).
pub fn decode(status: u16, content_type: Option<&str>, body: &str) -> (Option<String>, String) {
    let clip = |s: &str| s.chars().take(300).collect::<String>().trim().to_string();
    let (code, message) = match serde_json::from_str::<Envelope>(body) {
        Ok(e) if e.message.is_some() || e.error_reason.is_some() => {
            let m = clip(e.message.as_deref().unwrap_or_default());
            let reason = e.error_reason.map(|r| clip(&r)).filter(|r| !r.is_empty());
            let detail = match (reason, m.is_empty()) {
                (Some(r), false) if r != m => format!("{m} ({r})"),
                (Some(r), true) => r,
                _ => m,
            };
            let text = if detail.is_empty() {
                format!("HTTP {status}")
            } else {
                format!("HTTP {status}: {detail}")
            };
            (Some(String::new()), text)
        }
        _ => (None, cause::http_cause(status, content_type, body)),
    };
    (code, message)
}

/// The kit's success envelope for Hyperstack: a 2xx whose body says `status: false` is
/// the error its envelope describes.
pub fn envelope(status: u16, v: Value) -> Result<Value, (Option<String>, String)> {
    if v.get("status") == Some(&Value::Bool(false)) {
        return Err(decode(status, None, &v.to_string()));
    }
    Ok(v)
}

/// Builds the [`Failure`] of an HTTP answer outside the client (property tests).
pub struct ApiError;

impl ApiError {
    /// The failure of an answer with `status`, `body` and the `Retry-After` header value,
    /// as the client would report it.
    pub fn from_response(status: u16, body: &str, retry_after: Option<&str>) -> Failure {
        ApiError::from_http(status, None, body, retry_after)
    }

    /// [`ApiError::from_response`] with the response's `Content-Type`.
    pub fn from_http(s: u16, ct: Option<&str>, body: &str, ra: Option<&str>) -> Failure {
        let (code, message) = decode(s, ct, body);
        let retry_after = ra.map(str::to_string);
        let delay = RateHeaders {
            retry_after,
            ..RateHeaders::default()
        }
        .delay_secs(s, 0);
        Failure::http(s, code, message).with_retry_after(delay)
    }
}

/// The contract's error for `f`; `what` starts the message, `secret` is scrubbed from it.
pub fn classify(f: &Failure, what: &str, secret: Option<&str>) -> ProviderError {
    CLASSIFIER.classify(f, Call::other(what), secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shared objects: a name conflict on a create is `Exists` (adopted, never a failed
    /// offer); a refused environment delete is `InUse`; elsewhere neither rule applies.
    #[test]
    fn shared_object_conflicts_and_refusals() {
        let f = |s: u16| ApiError::from_response(s, &body("Conflict", "conflict"), None);
        let on =
            |f: Failure, call: &'static str| CLASSIFIER.classify(&f, Call::named(call, "x"), []);
        assert_eq!(on(f(409), CREATE_SHARED).kind, ErrorKind::Exists);
        assert_eq!(on(f(400), DELETE_ENVIRONMENT).kind, ErrorKind::InUse);
        assert_ne!(on(f(409), "other").kind, ErrorKind::Exists);
        assert_ne!(on(f(400), CREATE_SHARED).kind, ErrorKind::InUse);
    }

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
        // A 2xx whose envelope says `status: false` is classified the same way.
        let v = serde_json::json!({"status": false, "message": "Out of stock"});
        let (code, message) = envelope(200, v).unwrap_err();
        let p = classify(&Failure::http(200, code, message), "x", None);
        assert_eq!(p.kind, ErrorKind::Capacity);
        assert!(envelope(200, serde_json::json!({"status": true})).is_ok());
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
        assert_eq!(kind(500, "Out of stock", ""), ErrorKind::Transient);
        let k = |s: u16| classify(&ApiError::from_response(s, "", None), "x", None).kind;
        assert_eq!(k(500), ErrorKind::Transient);
        assert_eq!(k(502), ErrorKind::Transient);
        assert_eq!(k(400), ErrorKind::Failed);
        let transport = Failure::transport(false, "connection reset");
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
    fn delete_refusals_while_creating_are_transient() {
        let on_delete = |f: Failure| CLASSIFIER.classify(&f, Call::named(DELETE, "d"), []);
        let busy = |s: u16, m: &str| {
            on_delete(ApiError::from_response(s, &body(m, ""), None)).kind == ErrorKind::Transient
        };
        assert!(busy(400, "Cannot delete VM while it is in CREATING state"));
        assert!(busy(400, "VM is being created, try again later"));
        assert!(busy(409, "Conflict"));
        assert!(busy(409, "Not enough capacity"), "busy before capacity");
        assert!(!busy(400, "Invalid VM id"));
        assert!(!busy(404, "VM creating"));
        assert!(ApiError::from_response(404, "", None).is_not_found());
        let e = on_delete(ApiError::from_response(
            409,
            &body("Conflict", ""),
            Some("4"),
        ));
        assert_eq!(e.retry_after_secs, Some(4));
        assert_eq!(e.help.as_deref(), Some(NOT_DELETABLE));
        // Only a delete: elsewhere a 409 is what its text says.
        assert_eq!(kind(409, "VM is being created", ""), ErrorKind::Failed);
    }

    #[test]
    fn a_body_that_is_not_the_envelope_is_one_short_line() {
        let filler = "<p>nginx: no capacity, try again</p>\n".repeat(200);
        let head = "<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>";
        let page = format!("{head}\n<body>{filler}</body></html>");
        let html = Some("text/html; charset=utf-8");
        let p = classify(
            &ApiError::from_http(502, html, &page, None),
            "list VMs",
            None,
        );
        let want = "hyperstack list VMs: HTTP 502 (text/html): 502 Bad Gateway";
        assert_eq!((p.kind, p.msg.as_str()), (ErrorKind::Transient, want));
        // A proxy's page is not the vendor's free text: no phrase in it is capacity or busy.
        let e = ApiError::from_http(409, Some("text/plain"), "no capacity, try again", None);
        assert_eq!(classify(&e, "x", None).kind, ErrorKind::Failed);
        let e = ApiError::from_http(400, None, "try again", None);
        let p = CLASSIFIER.classify(&e, Call::named(DELETE, "d"), []);
        assert_eq!(p.kind, ErrorKind::Failed);
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
        assert!(p.text().contains("HYPERSTACK_API_KEY"), "{}", p.text());
        assert_eq!(p.help.as_deref(), Some(CHECK_KEY));
        let e = ApiError::from_response(400, &body("Bad flavor", "bad_flavor"), None);
        assert_eq!(
            classify(&e, "create VM", None).msg,
            "hyperstack create VM: HTTP 400: Bad flavor (bad_flavor)"
        );
    }
}
