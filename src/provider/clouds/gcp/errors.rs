//! GCP's error shapes and the table that classifies them.
//!
//! Three shapes reach the adapter:
//! - an HTTP error of the Compute API, Google's JSON error body
//!   `{"error": {"code", "message", "status", "errors": [{"domain", "reason", "message"}],
//!   "details"}}` (the format every Google JSON API answers with; the discovery document
//!   describes no error responses). The code the table matches is `errors[0].reason`
//!   (`quotaExceeded`, `rateLimitExceeded`, `notFound`, ...), else `status`
//!   (`RESOURCE_EXHAUSTED`), else empty (Google's body without a code);
//! - a failed long-running operation: `Operation.error.errors[{code, message,
//!   errorDetails}]` (discovery schema `Operation`) with `httpErrorStatusCode`; the code
//!   is `errors[0].code` (`ZONE_RESOURCE_POOL_EXHAUSTED`, `QUOTA_EXCEEDED`, ...), and the
//!   message includes the `quotaInfo` of a `QUOTA_EXCEEDED` (its `metricName` names a
//!   quota that counts all regions, `GPUS_ALL_REGIONS`);
//! - an OAuth 2.0 token endpoint error, RFC 6749 section 5.2: `{"error": "invalid_grant",
//!   "error_description": "..."}`; the code is `error`.
//!
//! Unknown codes are never capacity: they fall to the kit's defaults (`Failed`; 401/403
//! `Credentials`; 5xx and 429 `Transient`).

use serde::Deserialize;
use serde_json::Value;

use crate::provider::cause;
use crate::provider::kit::{Classifier, Failure, Rule};
use crate::provider::ErrorKind;

/// The call name of an insert (and a start): capacity rules apply to it.
pub const CREATE: &str = "create";
/// The call name of `prepare`'s reads: a missing image is the ask's fault.
pub const PREPARE: &str = "prepare";

/// Reasons of a quota that counts every region (`GPUS_ALL_REGIONS`, Compute Engine
/// "Quotas": the project-wide GPU quota), matched in the message or quota details.
const ALL_REGIONS: &[&str] = &["GPUS_ALL_REGIONS", "GPUS-ALL-REGIONS", "gpus_all_regions"];

/// Shown with every `Credentials` error.
pub const CHECK_CREDENTIALS: &str = "check the credential gpuprov found \
     (GOOGLE_APPLICATION_CREDENTIALS, gcloud's application_default_credentials.json, or \
     the instance's service account) and that it may use the Compute Engine API of the \
     project";

/// The table, first match wins (the kit's defaults follow it). Sources: the Compute
/// Engine troubleshooting pages (stockouts: `ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS]`,
/// "The zone ... does not have enough resources available to fulfill the request"; an
/// accelerator not offered in the zone: `UNSUPPORTED_OPERATION`), the discovery
/// document's `Operation.error` and `QuotaExceededInfo`, Google's standard error reasons
/// (`quotaExceeded`, `rateLimitExceeded`, `userRateLimitExceeded`, `backendError`,
/// `accessNotConfigured`, `forbidden`, `insufficientPermissions`, `invalid`,
/// `badRequest`, `notFound`, `resourceNotReady`), and RFC 6749 5.2 with google-auth's
/// retryable token errors (`internal_failure`, `server_error`, `temporarily_unavailable`,
/// `google/oauth2/_client.py`).
const RULES: &[Rule] = &[
    // Capacity in the zone: the offer (one zone) is blocked, the next zone is tried.
    Rule::code("ZONE_RESOURCE_POOL_EXHAUSTED", ErrorKind::Capacity),
    Rule::code(
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        ErrorKind::Capacity,
    ),
    Rule::code("zoneResourcePoolExhausted", ErrorKind::Capacity),
    Rule::code("UNSUPPORTED_OPERATION", ErrorKind::Capacity).on(CREATE),
    Rule::code("resourceNotReady", ErrorKind::Capacity).on(CREATE),
    // Anything else not ready (a delete while the insert still runs): later.
    Rule::code("resourceNotReady", ErrorKind::Transient),
    // Quota: the region's (the core's default scope), or every region's.
    Rule::code("QUOTA_EXCEEDED", ErrorKind::Quota)
        .phrases(ALL_REGIONS)
        .cloud_wide(),
    Rule::code("quotaExceeded", ErrorKind::Quota)
        .phrases(ALL_REGIONS)
        .cloud_wide(),
    Rule::code("QUOTA_EXCEEDED", ErrorKind::Quota),
    Rule::code("quotaExceeded", ErrorKind::Quota),
    // Rate limits and Google's own trouble: again, same offer.
    Rule::code("rateLimitExceeded", ErrorKind::Transient),
    Rule::code("userRateLimitExceeded", ErrorKind::Transient),
    Rule::code("RESOURCE_OPERATION_RATE_EXCEEDED", ErrorKind::Transient),
    Rule::code("backendError", ErrorKind::Transient),
    Rule::code("internalError", ErrorKind::Transient),
    Rule::code("internal_failure", ErrorKind::Transient),
    Rule::code("server_error", ErrorKind::Transient),
    Rule::code("temporarily_unavailable", ErrorKind::Transient),
    // The credential or its rights.
    Rule::code("accessNotConfigured", ErrorKind::Credentials)
        .help("enable the Compute Engine API (compute.googleapis.com) for the project"),
    Rule::code("forbidden", ErrorKind::Credentials),
    Rule::code("insufficientPermissions", ErrorKind::Credentials),
    Rule::code("authError", ErrorKind::Credentials),
    Rule::code("invalid_grant", ErrorKind::Credentials),
    Rule::code("invalid_client", ErrorKind::Credentials),
    Rule::code("unauthorized_client", ErrorKind::Credentials),
    Rule::status(401, ErrorKind::Credentials),
    // The ask as written: a configured image or network that is not there, a bad field.
    Rule::code("notFound", ErrorKind::InvalidRequest).on(PREPARE),
    Rule::code("invalid", ErrorKind::InvalidRequest),
    Rule::code("badRequest", ErrorKind::InvalidRequest),
    Rule::code("required", ErrorKind::InvalidRequest),
];

/// GCP's classifier.
pub static CLASSIFIER: Classifier = Classifier {
    cloud: super::CLOUD,
    rules: RULES,
    credentials_help: CHECK_CREDENTIALS,
};

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Envelope {
    error: Option<GoogleError>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct GoogleError {
    message: String,
    status: String,
    errors: Vec<Reason>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Reason {
    reason: String,
}

/// The kit's error decoder for the Compute API: `(code, message)` from Google's error
/// body (see the module docs); another body (a proxy's page) keeps no code and a one-line
/// cause.
pub fn decode(status: u16, content_type: Option<&str>, body: &str) -> (Option<String>, String) {
    match serde_json::from_str::<Envelope>(body) {
        Ok(Envelope { error: Some(e) }) => {
            let code = e
                .errors
                .iter()
                .map(|r| r.reason.trim())
                .find(|r| !r.is_empty())
                .map(str::to_string)
                .or_else(|| Some(e.status.trim().to_string()));
            let message = first_line(&e.message);
            (code, message)
        }
        _ => (None, cause::http_cause(status, content_type, body)),
    }
}

/// The [`Failure`] of a token endpoint's error answer (RFC 6749 5.2): code `error`,
/// message `error_description`; another body keeps no code and a one-line cause.
pub fn token_failure(status: u16, content_type: Option<&str>, body: &str) -> Failure {
    #[derive(Deserialize)]
    struct OAuthError {
        error: String,
        #[serde(default)]
        error_description: Option<String>,
    }
    match serde_json::from_str::<OAuthError>(body) {
        Ok(e) => Failure::http(
            status,
            Some(e.error),
            first_line(e.error_description.as_deref().unwrap_or_default()),
        ),
        Err(_) => Failure::http(status, None, cause::http_cause(status, content_type, body)),
    }
}

/// `Operation.error` of the discovery document (the fields gpuprov reads).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct OperationError {
    pub errors: Vec<OperationErrorItem>,
}

/// One `Operation.error.errors` entry.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct OperationErrorItem {
    pub code: String,
    pub message: String,
    #[serde(rename = "errorDetails")]
    pub error_details: Vec<Value>,
}

/// The [`Failure`] of a failed operation: its first error's code, the messages of its
/// errors joined, plus a `QUOTA_EXCEEDED`'s quota metric (so a quota over all regions is
/// seen as such), and HTTP status `httpErrorStatusCode` (400 when absent, so an unknown
/// code is `Failed`).
pub fn operation_failure(err: &OperationError, http_status: Option<i64>) -> Failure {
    let code = err
        .errors
        .iter()
        .map(|e| e.code.trim())
        .find(|c| !c.is_empty())
        .unwrap_or_default()
        .to_string();
    let mut message: Vec<String> = err
        .errors
        .iter()
        .map(|e| first_line(&e.message))
        .filter(|m| !m.is_empty())
        .collect();
    for d in err.errors.iter().flat_map(|e| &e.error_details) {
        if let Some(metric) = d["quotaInfo"]["metricName"].as_str() {
            message.push(format!("quota metric {metric}"));
        }
    }
    let status = http_status
        .and_then(|s| u16::try_from(s).ok())
        .filter(|s| (400..600).contains(s))
        .unwrap_or(400);
    Failure::http(status, Some(code), message.join("; "))
}

/// A message cut to its first line and 300 characters (Google's messages are one line;
/// a server may send more).
fn first_line(s: &str) -> String {
    let line = s.lines().next().unwrap_or_default().trim();
    line.chars().take(300).collect()
}

/// Whether `f` says the resource exists already (HTTP 409 `alreadyExists`).
pub fn is_already_there(f: &Failure) -> bool {
    f.http_status() == Some(409)
}
