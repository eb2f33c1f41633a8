//! Nebius errors: a gRPC status (or a finished operation's `google.rpc.Status`) and the
//! vendor's `nebius.common.v1.ServiceError` in its details (`common/v1/error.proto`), read
//! into one kit [`Failure`], and the table that classifies it.
//!
//! The failure's code is the name of the `ServiceError.details` case that is set
//! (`quota_failure`, `not_enough_resources`, `too_many_requests`, …), with `/no-retry`
//! appended when the error's `retry_type` is `NOTHING` ("do not retry, this is a fatal
//! error"), so the table can honour it; a status without a `ServiceError` has no code.
//! The message is the status message plus the violations the details list. A server's
//! `grpc-retry-pushback-ms` (gRPC's retry pushback, gRFC A6) becomes the retry delay.

use prost::Message as _;

use crate::provider::kit::failure::grpc;
use crate::provider::kit::{Classifier, Failure, Rule};
use crate::provider::ErrorKind;
use super::proto::google::rpc::Status as RpcStatus;
use super::proto::nebius::common::v1::service_error::{Details, RetryType};
use super::proto::nebius::common::v1::ServiceError;

/// The call names the table matches on.
pub const CREATE: &str = "create";
pub const PREPARE: &str = "prepare";
pub const DELETE: &str = "delete";
pub const CLEANUP: &str = "cleanup";

/// The `Any` type URL of a `ServiceError` detail.
pub const SERVICE_ERROR_TYPE: &str = "type.googleapis.com/nebius.common.v1.ServiceError";

/// The vendor's table (first match wins; the kit's defaults follow: UNAVAILABLE,
/// DEADLINE_EXCEEDED, INTERNAL → Transient, UNAUTHENTICATED, PERMISSION_DENIED →
/// Credentials, anything else Failed, never Capacity).
pub const RULES: &[Rule] = &[
    // "Do not retry": a rate limit or an outage the server calls fatal is not waited out.
    Rule::code("too_many_requests/no-retry", ErrorKind::Failed),
    Rule::code("no-retry", ErrorKind::Failed),
    Rule::code("quota_failure*", ErrorKind::Quota).help(
        "raise the quota in the Nebius console (Administration → Limits), or ask in other regions",
    ),
    Rule::code("not_enough_resources*", ErrorKind::Capacity),
    Rule::code("too_many_requests*", ErrorKind::Transient),
    // Another operation runs on the resource (a delete while its create still runs).
    Rule::code("operation_conflict*", ErrorKind::Transient),
    Rule::code("operation_aborted*", ErrorKind::Transient),
    Rule::grpc(grpc::ABORTED, ErrorKind::Transient),
    // A security group still attached to an instance being deleted.
    Rule::grpc(grpc::FAILED_PRECONDITION, ErrorKind::InUse).on(CLEANUP),
    Rule::grpc(grpc::FAILED_PRECONDITION, ErrorKind::Transient).on(DELETE),
    Rule::code("bad_request*", ErrorKind::InvalidRequest),
    Rule::grpc(grpc::INVALID_ARGUMENT, ErrorKind::InvalidRequest),
    Rule::grpc(grpc::FAILED_PRECONDITION, ErrorKind::InvalidRequest),
];

/// The Nebius classifier.
pub const CLASSIFIER: Classifier = Classifier {
    cloud: "nebius",
    rules: RULES,
    credentials_help: "set NEBIUS_IAM_TOKEN, or GPUPROV_NEBIUS_CREDENTIALS_FILE to a service \
                       account's credentials file (`nebius iam auth-public-key generate`), or \
                       configure the nebius CLI with a service account profile",
};

/// The `ServiceError`s among a status's details (others are skipped).
pub fn service_errors(details: &[prost_types::Any]) -> Vec<ServiceError> {
    details
        .iter()
        .filter(|a| a.type_url.ends_with("/nebius.common.v1.ServiceError"))
        .filter_map(|a| ServiceError::decode(a.value.as_slice()).ok())
        .collect()
}

/// The code and violation text of one `ServiceError` (module docs).
fn read(e: &ServiceError) -> (Option<&'static str>, Vec<String>) {
    let mut lines = Vec::new();
    let name = match &e.details {
        None => None,
        Some(Details::BadRequest(d)) => {
            lines.extend(
                d.violations
                    .iter()
                    .map(|v| format!("{}: {}", v.field, v.message)),
            );
            Some("bad_request")
        }
        Some(Details::BadResourceState(d)) => {
            lines.push(format!("{}: {}", d.resource_id, d.message));
            Some("bad_resource_state")
        }
        Some(Details::ResourceNotFound(_)) => Some("resource_not_found"),
        Some(Details::ResourceAlreadyExists(_)) => Some("resource_already_exists"),
        Some(Details::OutOfRange(d)) => {
            lines.push(format!("requested {}, limit {}", d.requested, d.limit));
            Some("out_of_range")
        }
        Some(Details::PermissionDenied(_)) => Some("permission_denied"),
        Some(Details::ResourceConflict(d)) => {
            lines.push(d.message.clone());
            Some("resource_conflict")
        }
        Some(Details::OperationAborted(_)) => Some("operation_aborted"),
        Some(Details::OperationConflict(d)) => {
            lines.push(format!(
                "operation {} is running",
                d.conflicting_operation_id
            ));
            Some("operation_conflict")
        }
        Some(Details::TooManyRequests(d)) => {
            lines.push(d.violation.clone());
            Some("too_many_requests")
        }
        Some(Details::QuotaFailure(d)) => {
            lines.extend(d.violations.iter().map(|v| {
                format!(
                    "quota {}: {} (limit {}, requested {})",
                    v.quota, v.message, v.limit, v.requested
                )
            }));
            Some("quota_failure")
        }
        Some(Details::NotEnoughResources(d)) => {
            lines.extend(d.violations.iter().map(|v| {
                let what = if v.resource_type.is_empty() {
                    String::new()
                } else {
                    format!("{}: ", v.resource_type)
                };
                format!("{what}{} (requested {})", v.message, v.requested)
            }));
            Some("not_enough_resources")
        }
        Some(Details::InternalError(d)) => {
            lines.push(format!("request id {}", d.request_id));
            Some("internal_error")
        }
    };
    (
        name,
        lines.into_iter().filter(|l| !l.trim().is_empty()).collect(),
    )
}

/// The failure of gRPC code `code` with `message` and `details` (module docs).
pub fn failure(code: i32, message: &str, details: &[prost_types::Any]) -> Failure {
    let mut f = Failure::grpc(code, message.trim());
    if let Some(e) = service_errors(details).first() {
        let (name, lines) = read(e);
        let fatal = e.retry_type() == RetryType::Nothing;
        f.code = match (name, fatal) {
            (Some(n), true) => Some(format!("{n}/no-retry")),
            (Some(n), false) => Some(n.to_string()),
            (None, true) => Some("no-retry".into()),
            // The vendor's body without a detail: `Rule::code("*")` may match it.
            (None, false) => Some(String::new()),
        };
        if !lines.is_empty() {
            f.message = format!("{}: {}", f.message, lines.join("; "));
        }
    }
    f.message = crate::provider::kit::failure::clip(&f.message);
    f
}

/// The failure a finished operation reports (`Operation.status`, code not OK).
pub fn of_operation(status: &RpcStatus) -> Failure {
    failure(status.code, &status.message, &status.details)
}

/// The failure of a call that ended with `status`: the server's answer (its details
/// decoded), or the transport's when no answer came (a status tonic made from a
/// connection error: `refused` when the endpoint refused the connection or did not
/// resolve, so nothing was sent).
pub fn of_status(status: &tonic::Status) -> Failure {
    if let Some(f) = crate::provider::kit::grpc::transport_failure(status) {
        return f;
    }
    let details = RpcStatus::decode(status.details())
        .map(|s| s.details)
        .unwrap_or_default();
    let pushback = status
        .metadata()
        .get("grpc-retry-pushback-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|ms| ms.div_ceil(1000));
    failure(status.code() as i32, status.message(), &details).with_retry_after(pushback)
}

/// Whether `f` says the object does not exist (gRPC NOT_FOUND, or the vendor's
/// `resource_not_found`).
pub fn is_not_found(f: &Failure) -> bool {
    matches!(f.status, crate::provider::kit::Status::Grpc(grpc::NOT_FOUND))
        || f.has_code("resource_not_found")
}

/// Whether `f` says the object exists already (gRPC ALREADY_EXISTS, or
/// `resource_already_exists`).
pub fn is_already_there(f: &Failure) -> bool {
    matches!(
        f.status,
        crate::provider::kit::Status::Grpc(grpc::ALREADY_EXISTS)
    ) || f.has_code("resource_already_exists")
}

#[cfg(test)]
mod tests {
    use crate::provider::clouds::nebius::proto::nebius::common::v1::{
        NotEnoughResources, QuotaFailure, TooManyRequests,
    };
    use super::*;
    use crate::provider::kit::Call;

    fn any(e: ServiceError) -> prost_types::Any {
        prost_types::Any {
            type_url: SERVICE_ERROR_TYPE.into(),
            value: e.encode_to_vec(),
        }
    }

    fn err(details: Details, retry: RetryType) -> ServiceError {
        ServiceError {
            service: "compute".into(),
            code: "x".into(),
            details: Some(details),
            retry_type: retry as i32,
        }
    }

    fn kind(
        code: i32,
        details: Option<Details>,
        retry: RetryType,
        call: &'static str,
    ) -> ErrorKind {
        let d: Vec<_> = details.map(|d| any(err(d, retry))).into_iter().collect();
        CLASSIFIER
            .classify(&failure(code, "m", &d), Call::named(call, "x"), [])
            .kind
    }

    #[test]
    fn the_table_reads_the_service_error() {
        use ErrorKind::*;
        let quota = Details::QuotaFailure(QuotaFailure {
            violations: vec![Default::default()],
        });
        let capacity = Details::NotEnoughResources(NotEnoughResources {
            violations: vec![Default::default()],
        });
        let slow = || {
            Details::TooManyRequests(TooManyRequests {
                violation: "compute.instance.create".into(),
            })
        };
        let x = RetryType::Unspecified;
        assert_eq!(kind(8, Some(quota), RetryType::UnitOfWork, CREATE), Quota);
        assert_eq!(kind(8, Some(capacity), x, CREATE), Capacity);
        assert_eq!(kind(8, Some(slow()), RetryType::Call, CREATE), Transient);
        assert_eq!(kind(8, Some(slow()), RetryType::Nothing, CREATE), Failed);
        assert_eq!(
            kind(8, None, x, CREATE),
            Transient,
            "no detail: a rate limit"
        );
        assert_eq!(kind(14, None, x, CREATE), Transient);
        assert_eq!(kind(4, None, x, CREATE), Transient);
        assert_eq!(kind(16, None, x, CREATE), Credentials);
        assert_eq!(kind(7, None, x, CREATE), Credentials);
        assert_eq!(kind(3, None, x, CREATE), InvalidRequest);
        assert_eq!(kind(9, None, x, CREATE), InvalidRequest);
        assert_eq!(kind(9, None, x, CLEANUP), InUse);
        assert_eq!(kind(9, None, x, DELETE), Transient);
        assert_eq!(
            kind(2, None, x, CREATE),
            Failed,
            "UNKNOWN is never capacity"
        );
    }

    #[test]
    fn messages_carry_the_violations_and_the_code() {
        let d = Details::QuotaFailure(QuotaFailure {
            violations: vec![
                crate::provider::clouds::nebius::proto::nebius::common::v1::quota_failure::Violation {
                    quota: "compute.instance.gpu.h100".into(),
                    message: "Quota exceeded".into(),
                    limit: "0".into(),
                    requested: "8".into(),
                },
            ],
        });
        let f = failure(8, "quota exceeded", &[any(err(d, RetryType::UnitOfWork))]);
        let e = CLASSIFIER.classify(&f, Call::named(CREATE, "create in eu-north1"), []);
        assert_eq!(
            e.msg,
            "nebius create in eu-north1: quota_failure (gRPC 8): quota exceeded: quota \
             compute.instance.gpu.h100: Quota exceeded (limit 0, requested 8)"
        );
        assert!(e.help.unwrap().contains("Limits"));
    }
}
