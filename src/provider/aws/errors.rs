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
        | "DependencyViolation"
        | "IncorrectState" => (Transient, Scope::Default),
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
    let mut e = ProviderError::new(kind, format!("{what}: {code}: {}", message.trim()));
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

/// Classifies an SDK error from the call `what` (made for `offer`, when there is one).
///
/// - a service error: by its EC2 code ([`classify_code`]);
/// - a timeout or a connection failure: `Transient`, naming the endpoint's host is left
///   to the caller (`AwsProvider` appends the endpoint);
/// - a failure to obtain credentials (the orchestrator resolves them before sending):
///   `Credentials`;
/// - anything else (an unparsable response, a request that cannot be built): `Failed`.
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
    let chain = DisplayErrorContext(err).to_string();
    let lower = chain.to_ascii_lowercase();
    let kind = if lower.contains("credential") || lower.contains("no identity") {
        ErrorKind::Credentials
    } else {
        match err {
            SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) => ErrorKind::Transient,
            SdkError::ResponseError(_) => ErrorKind::Transient,
            SdkError::ServiceError(_) => match raw_status(err) {
                Some(s) if s >= 500 => ErrorKind::Transient,
                _ => ErrorKind::Failed,
            },
            _ => ErrorKind::Failed,
        }
    };
    ProviderError::new(kind, format!("{what}: {chain}"))
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
            ("DependencyViolation", Transient, Scope::Default),
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
}
