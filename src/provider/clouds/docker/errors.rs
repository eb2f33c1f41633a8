//! Classification of Docker Engine API errors into [`ErrorKind`]s (design 4.1).

use bollard::errors::Error;

use crate::provider::{ErrorKind, ProviderError};

/// The HTTP status of an Engine API error response, `None` for transport-level errors.
pub(crate) fn status_code(err: &Error) -> Option<u16> {
    match err {
        Error::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// Whether the Engine answered 404 (no such container, image, volume or network).
pub(crate) fn is_not_found(err: &Error) -> bool {
    status_code(err) == Some(404)
}

/// Whether the Engine answered 409 (name already in use, removal already in progress).
pub(crate) fn is_conflict(err: &Error) -> bool {
    status_code(err) == Some(409)
}

/// Whether the error means the daemon could not be reached at all.
pub(crate) fn is_connection_error(err: &Error) -> bool {
    matches!(
        err,
        Error::SocketNotFoundError(_)
            | Error::HyperLegacyError { .. }
            | Error::HyperResponseError { .. }
            | Error::IOError { .. }
            | Error::RequestTimeoutError
    )
}

/// Maps a bollard error onto the provider contract's error kinds.
///
/// - daemon unreachable (socket missing, connection refused or reset, I/O error, timeout)
///   → `Transient`: the daemon may be restarting, so the core retries with backoff;
/// - HTTP 5xx and 429 → `Transient`;
/// - HTTP 401/403 → `Credentials`;
/// - HTTP 400 → `InvalidRequest` (the Engine rejected the request as written);
/// - HTTP 404 and 409 → `Failed`: their meaning depends on the call, so callers that expect
///   them (delete, create's name conflict, image lookups) test for them *before* classifying;
/// - other 4xx → `Failed`;
/// - a bad endpoint (unsupported URI scheme, unparsable URI) → `InvalidRequest`;
/// - anything else (undecodable JSON, errors reported mid-stream) → `Failed`.
///
/// The message is the error's display text, which names the resource and never holds a
/// secret (the only credential-like value involved is the public SSH key).
pub fn classify(err: Error) -> ProviderError {
    let kind = match &err {
        Error::DockerResponseServerError { status_code, .. } => match *status_code {
            429 | 500..=599 => ErrorKind::Transient,
            401 | 403 => ErrorKind::Credentials,
            400 => ErrorKind::InvalidRequest,
            _ => ErrorKind::Failed,
        },
        e if is_connection_error(e) => ErrorKind::Transient,
        Error::UnsupportedURISchemeError { .. }
        | Error::InvalidURIError { .. }
        | Error::InvalidURIPartsError { .. }
        | Error::URLParseError { .. } => ErrorKind::InvalidRequest,
        _ => ErrorKind::Failed,
    };
    let msg = match &err {
        Error::DockerResponseServerError {
            status_code,
            message,
        } => {
            format!("docker engine answered {status_code}: {}", message.trim())
        }
        Error::SocketNotFoundError(path) => {
            format!("docker daemon unreachable: socket {path} does not exist")
        }
        e if is_connection_error(e) => format!("docker daemon unreachable: {e}"),
        e => format!("docker: {e}"),
    };
    ProviderError::new(kind, msg)
}

/// [`classify`], naming the endpoint in the message when the daemon could not be reached,
/// so the user sees which socket or address was tried.
pub(crate) fn classify_at(err: Error, endpoint: &str) -> ProviderError {
    let unreachable = is_connection_error(&err);
    let mut e = classify(err);
    if unreachable && !e.msg.contains(endpoint.trim_start_matches("unix://")) {
        e.msg = format!("{} (docker endpoint {endpoint})", e.msg);
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(status_code: u16) -> Error {
        Error::DockerResponseServerError {
            status_code,
            message: format!("status {status_code}"),
        }
    }

    #[test]
    fn server_errors_by_status() {
        assert_eq!(classify(server(500)).kind, ErrorKind::Transient);
        assert_eq!(classify(server(503)).kind, ErrorKind::Transient);
        assert_eq!(classify(server(429)).kind, ErrorKind::Transient);
        assert_eq!(classify(server(400)).kind, ErrorKind::InvalidRequest);
        assert_eq!(classify(server(401)).kind, ErrorKind::Credentials);
        assert_eq!(classify(server(403)).kind, ErrorKind::Credentials);
        assert_eq!(classify(server(404)).kind, ErrorKind::Failed);
        assert_eq!(classify(server(409)).kind, ErrorKind::Failed);
        assert_eq!(classify(server(422)).kind, ErrorKind::Failed);
        assert!(classify(server(500)).msg.contains("500"));
    }

    #[test]
    fn connection_errors_are_transient_and_name_the_socket() {
        let e = classify(Error::SocketNotFoundError("/nowhere/docker.sock".into()));
        assert_eq!(e.kind, ErrorKind::Transient);
        assert!(e.msg.contains("/nowhere/docker.sock"), "{}", e.msg);

        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = classify_at(Error::IOError { err: io }, "unix:///run/x.sock");
        assert_eq!(e.kind, ErrorKind::Transient);
        assert!(e.msg.contains("unix:///run/x.sock"), "{}", e.msg);

        assert_eq!(
            classify(Error::RequestTimeoutError).kind,
            ErrorKind::Transient
        );
    }

    #[test]
    fn endpoint_and_stream_errors() {
        let e = classify(Error::UnsupportedURISchemeError {
            uri: "ftp://x".into(),
        });
        assert_eq!(e.kind, ErrorKind::InvalidRequest);
        let e = classify(Error::DockerStreamError {
            error: "build broke".into(),
        });
        assert_eq!(e.kind, ErrorKind::Failed);
        assert!(e.msg.contains("build broke"));
    }

    #[test]
    fn helpers_recognise_statuses() {
        assert!(is_not_found(&server(404)));
        assert!(!is_not_found(&server(409)));
        assert!(is_conflict(&server(409)));
        assert!(!is_conflict(&Error::RequestTimeoutError));
        assert!(is_connection_error(&Error::SocketNotFoundError(
            "/x".into()
        )));
    }
}
