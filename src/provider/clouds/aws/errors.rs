//! Classification of EC2 errors into [`ErrorKind`]s and block scopes (design 4.1).
//!
//! EC2 answers errors as `<Response><Errors><Error><Code>…</Code><Message>…</Message>
//! </Error></Errors><RequestID>…</RequestID></Response>`; the SDK parses the code. The
//! table goes by that code, never by the HTTP status: `InsufficientInstanceCapacity`, for
//! one, arrives with HTTP 500 and must fail over, not be retried as a server error.
//! Codes: <https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html>.

use aws_sdk_ec2::config::http::HttpResponse;
use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

use crate::provider::{BlockScope, ErrorKind, Offer, ProviderError};

/// The block scope a code asks for, beyond its kind's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The kind's default (design 4.1): the offer for Capacity/Unavailable/Failed, the
    /// region for Quota, nothing for the rest.
    Default,
    /// Every offer of this instance type in this region (all zones).
    InstanceTypeInRegion,
    /// Every offer in this region.
    Region,
}

/// The classification table: EC2 error code → kind and scope. `None` for codes it does
/// not list (those fall back on the HTTP status).
pub fn classify_code(code: &str) -> Option<(ErrorKind, Scope)> {
    use ErrorKind::*;
    let row = match code {
        // Out of capacity for this type in this zone: next offer.
        "InsufficientInstanceCapacity"
        | "InsufficientHostCapacity"
        | "InsufficientReservedInstanceCapacity"
        | "InsufficientCapacityOnHost"
        | "SpotMaxPriceTooLow" => (Capacity, Scope::Default),
        // Account limits are per region: one zone's refusal blocks every type there.
        "InstanceLimitExceeded"
        | "VcpuLimitExceeded"
        | "MaxSpotInstanceCountExceeded"
        | "SecurityGroupLimitExceeded"
        | "VolumeLimitExceeded" => (Quota, Scope::Region),
        // The type is not offered here (in any zone we may try).
        "Unsupported" | "UnsupportedInstanceType" => (Unavailable, Scope::InstanceTypeInRegion),
        // Credentials missing, rejected or without permission.
        "UnauthorizedOperation"
        | "AuthFailure"
        | "InvalidClientTokenId"
        | "ExpiredToken"
        | "RequestExpired"
        | "SignatureDoesNotMatch"
        | "MissingAuthenticationToken"
        | "OptInRequired" => (Credentials, Scope::Default),
        // Retry with backoff.
        "RequestLimitExceeded"
        | "Throttling"
        | "ThrottlingException"
        | "ServiceUnavailable"
        | "InternalError"
        | "InternalFailure"
        | "Unavailable"
        | "IncorrectState"
        // StartInstances on an instance still stopping: it will be stopped shortly.
        | "IncorrectInstanceState"
        // A security group created a moment ago that the next call (authorize, run,
        // describe by id) does not see yet: EC2 is eventually consistent, so this is lag
        // within the core's retry budget, not a failed offer. (`delete`/`cleanup` treat
        // it as "already gone" before consulting the table.)
        | "InvalidGroup.NotFound"
        | "InvalidGroupId.NotFound" => (Transient, Scope::Default),
        // A side resource something still uses (deleting a security group an instance that
        // is still terminating holds): the core observes again before retrying.
        "DependencyViolation" | "InvalidGroup.InUse" => (InUse, Scope::Default),
        // The request itself is wrong: it would fail in every region, so abort.
        "InvalidParameterCombination"
        | "InvalidParameterValue"
        | "InvalidParameter"
        | "MissingParameter"
        | "UnknownParameter"
        | "InvalidBlockDeviceMapping"
        | "InvalidUserData.Malformed"
        | "IdempotentParameterMismatch"
        | "InvalidKeyPair.NotFound"
        | "InvalidInstanceID.Malformed" => (InvalidRequest, Scope::Default),
        c if c.starts_with("InvalidAMIID.") => (InvalidRequest, Scope::Default),
        c if c.starts_with("InvalidSubnetID.") || c.starts_with("InvalidGroup.") => {
            (Failed, Scope::Default)
        }
        _ => return None,
    };
    Some(row)
}

/// Whether an EC2 error code means "the object does not exist" for the calls that treat
/// that as success (terminate, delete security group).
pub fn is_not_found(code: Option<&str>) -> bool {
    matches!(
        code,
        Some("InvalidInstanceID.NotFound" | "InvalidGroup.NotFound" | "InvalidGroupId.NotFound")
    )
}

/// Builds the [`ProviderError`] for an EC2 error `code` (or its absence) on `offer`.
/// `status` is the HTTP status, used only for codes the table does not list (5xx →
/// `Transient`, else `Failed`). `what` names the call; `message` is EC2's own text,
/// which never holds a secret.
pub fn from_code(
    what: &str,
    code: &str,
    message: &str,
    status: Option<u16>,
    offer: Option<&Offer>,
) -> ProviderError {
    let (kind, scope) = classify_code(code).unwrap_or(match status {
        Some(s) if s >= 500 => (ErrorKind::Transient, Scope::Default),
        _ => (ErrorKind::Failed, Scope::Default),
    });
    let mut e = ProviderError::new(kind, short_cause(what, code, message, status));
    if let Some(o) = offer {
        match scope {
            Scope::Default => {}
            Scope::InstanceTypeInRegion => {
                e = e.with_block(BlockScope::InstanceTypeInRegion {
                    cloud: o.location.cloud.clone(),
                    region: o.location.region.clone(),
                    instance_type: o.instance_type.clone(),
                })
            }
            Scope::Region => {
                e = e.with_block(BlockScope::Region {
                    cloud: o.location.cloud.clone(),
                    region: o.location.region.clone(),
                })
            }
        }
    }
    e
}

/// At most this many characters of EC2's message are kept (its capacity messages, which
/// name the zones that have capacity, are well below it).
pub const MAX_MESSAGE: usize = 400;

/// The one-line cause of an EC2 error: `<call>: <code> (HTTP <status>): <message>`, the
/// message's first line only and at most [`MAX_MESSAGE`] characters. EC2's messages
/// never hold a secret; they are kept whole otherwise, because they say what to do (the
/// capacity message names the zones that have capacity: "... choosing us-east-1a,
/// us-east-1c").
pub fn short_cause(what: &str, code: &str, message: &str, status: Option<u16>) -> String {
    let status = status.map(|s| format!(" (HTTP {s})")).unwrap_or_default();
    let line = message
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    let line = if line.chars().count() > MAX_MESSAGE {
        let cut: String = line.chars().take(MAX_MESSAGE).collect();
        format!("{cut}…")
    } else {
        line.to_string()
    };
    if line.is_empty() {
        format!("{what}: {code}{status}")
    } else {
        format!("{what}: {code}{status}: {line}")
    }
}

/// Whether a transport error means the endpoint refused the connection, or its name did
/// not resolve: nothing was sent, and the whole cloud is unreachable
/// ([`ErrorKind::Unreachable`]). The SDK reports both as a dispatch failure whose
/// connector error is an I/O error; the refusal itself is the `std::io::Error` of kind
/// `ConnectionRefused` in the source chain (hyper's "tcp connect error"), the resolver's
/// failure hyper's "dns error". A connect timeout, or a connection reset after the
/// request may have been sent, is not counted: those stay `Transient`.
pub fn is_refused<E, R>(err: &SdkError<E, R>) -> bool
where
    E: std::error::Error + 'static,
    R: std::fmt::Debug,
{
    let SdkError::DispatchFailure(d) = err else {
        return false;
    };
    let Some(conn) = d.as_connector_error() else {
        return false;
    };
    if !conn.is_io() {
        return false;
    }
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(conn);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::ConnectionRefused {
                return true;
            }
        }
        if e.to_string().starts_with("dns error") {
            return true;
        }
        next = e.source();
    }
    false
}

pub use crate::provider::cause::display_chain;

/// The innermost cause of an error chain (the OS's "Connection refused (os error 111)"
/// rather than the SDK's "dispatch failure: io error: ..." wrapping).
fn innermost(err: &(dyn std::error::Error + 'static)) -> String {
    let mut last = err;
    while let Some(s) = last.source() {
        last = s;
    }
    last.to_string()
}

/// Classifies an SDK error from the call `what` (made for `offer`, when there is one).
/// The message is a short cause, never the SDK's `Debug` or its whole `Display` chain:
///
/// - a service error with an EC2 code: by the code ([`classify_code`]), as
///   `<call>: <code> (HTTP <status>): <EC2's message>`;
/// - an answer without an EC2 envelope (a proxy's HTML page, an empty 503): by the HTTP
///   status (5xx `Transient`, else `Failed`), as [`crate::provider::cause::http_cause`]
///   (status, content type, first line of the body);
/// - the endpoint refused the connection ([`is_refused`]): `Unreachable`;
/// - a timeout or another connection failure: `Transient`, with the innermost cause
///   (naming the endpoint is left to the caller: `AwsProvider` appends it);
/// - a failure to obtain credentials (the orchestrator resolves them before sending):
///   `Credentials`;
/// - anything else (a request that cannot be built): `Failed`.
pub fn classify<E>(
    what: &str,
    err: &SdkError<E, HttpResponse>,
    offer: Option<&Offer>,
) -> ProviderError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    if let Some(code) = err.code() {
        let status = match err {
            SdkError::ServiceError(_) => raw_status(err),
            _ => None,
        };
        return from_code(what, code, err.message().unwrap_or(""), status, offer);
    }
    if let (SdkError::ServiceError(_) | SdkError::ResponseError(_), Some(raw)) =
        (err, err.raw_response())
    {
        let status = raw.status().as_u16();
        let content_type = raw.headers().get("content-type");
        let body = raw
            .body()
            .bytes()
            .map(|b| String::from_utf8_lossy(b).to_string())
            .unwrap_or_default();
        let kind = if status >= 500 || matches!(err, SdkError::ResponseError(_)) {
            ErrorKind::Transient
        } else {
            ErrorKind::Failed
        };
        return ProviderError::new(
            kind,
            format!(
                "{what}: {}",
                crate::provider::cause::http_cause(status, content_type, &body)
            ),
        );
    }
    if is_refused(err) {
        return ProviderError::new(
            ErrorKind::Unreachable,
            format!("{what}: connection refused ({})", innermost(err)),
        );
    }
    let chain = DisplayErrorContext(err).to_string();
    let lower = chain.to_ascii_lowercase();
    let (kind, cause) = if lower.contains("credential") || lower.contains("no identity") {
        (ErrorKind::Credentials, innermost(err))
    } else {
        match err {
            SdkError::TimeoutError(_) => (ErrorKind::Transient, "timed out".to_string()),
            SdkError::DispatchFailure(d) if d.is_timeout() => (
                ErrorKind::Transient,
                format!("timed out ({})", innermost(err)),
            ),
            SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
                (ErrorKind::Transient, innermost(err))
            }
            _ => (ErrorKind::Failed, innermost(err)),
        }
    };
    ProviderError::new(kind, format!("{what}: {cause}"))
}

fn raw_status<E>(err: &SdkError<E, HttpResponse>) -> Option<u16> {
    err.raw_response().map(|r| r.status().as_u16())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_rows() {
        use ErrorKind::*;
        let rows = [
            ("InsufficientInstanceCapacity", Capacity, Scope::Default),
            ("InstanceLimitExceeded", Quota, Scope::Region),
            ("VcpuLimitExceeded", Quota, Scope::Region),
            ("MaxSpotInstanceCountExceeded", Quota, Scope::Region),
            ("Unsupported", Unavailable, Scope::InstanceTypeInRegion),
            ("UnauthorizedOperation", Credentials, Scope::Default),
            ("AuthFailure", Credentials, Scope::Default),
            ("InvalidClientTokenId", Credentials, Scope::Default),
            ("ExpiredToken", Credentials, Scope::Default),
            ("RequestLimitExceeded", Transient, Scope::Default),
            ("Throttling", Transient, Scope::Default),
            ("ServiceUnavailable", Transient, Scope::Default),
            ("InternalError", Transient, Scope::Default),
            ("Unavailable", Transient, Scope::Default),
            ("DependencyViolation", InUse, Scope::Default),
            ("InvalidGroup.InUse", InUse, Scope::Default),
            ("InvalidGroup.NotFound", Transient, Scope::Default),
            ("InvalidGroupId.NotFound", Transient, Scope::Default),
            ("InvalidGroup.Malformed", Failed, Scope::Default),
            ("IncorrectInstanceState", Transient, Scope::Default),
            (
                "InvalidParameterCombination",
                InvalidRequest,
                Scope::Default,
            ),
            ("InvalidParameterValue", InvalidRequest, Scope::Default),
            ("InvalidAMIID.NotFound", InvalidRequest, Scope::Default),
            ("InvalidAMIID.Malformed", InvalidRequest, Scope::Default),
        ];
        for (code, kind, scope) in rows {
            assert_eq!(classify_code(code), Some((kind, scope)), "{code}");
        }
        assert_eq!(classify_code("SomethingNew"), None);
    }

    #[test]
    fn unknown_codes_fall_back_on_the_status() {
        assert_eq!(
            from_code("x", "Weird", "m", Some(503), None).kind,
            ErrorKind::Transient
        );
        assert_eq!(
            from_code("x", "Weird", "m", Some(400), None).kind,
            ErrorKind::Failed
        );
        // The code wins over the status.
        assert_eq!(
            from_code("x", "InsufficientInstanceCapacity", "m", Some(500), None).kind,
            ErrorKind::Capacity
        );
    }

    #[test]
    fn causes_are_one_short_line() {
        let c = short_cause(
            "RunInstances",
            "InsufficientInstanceCapacity",
            "We currently do not have sufficient p4d.24xlarge capacity in the Availability \
             Zone you requested (us-east-1a). You can currently get p4d.24xlarge capacity by \
             not specifying an Availability Zone in your request or choosing us-east-1b, \
             us-east-1c.\nsecond line",
            Some(500),
        );
        assert!(
            c.starts_with("RunInstances: InsufficientInstanceCapacity (HTTP 500): We currently"),
            "{c}"
        );
        assert!(c.contains("choosing us-east-1b, us-east-1c."), "{c}");
        assert!(!c.contains("second line"), "{c}");
        let long = short_cause("X", "Weird", &"m".repeat(1000), None);
        assert!(long.ends_with('…') && long.chars().count() < MAX_MESSAGE + 20);
        assert_eq!(short_cause("X", "Weird", " ", None), "X: Weird");
    }
}
