//! The gRPC side of the kit (tonic), for clouds whose API is gRPC only (Nebius): one lazy
//! channel per endpoint (TLS with rustls and the webpki roots for `https://`, plain HTTP/2
//! for `http://`, which local test servers speak), the bearer token and idempotency key as
//! request metadata, and a failed call's transport cause as a [`Failure`]. The vendor
//! reads its own error details from the status.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use super::super::cause::display_chain;
use super::super::redact::Secret;
use super::failure::Failure;

/// How long one call may take, seconds (connect included).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long connecting may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Lazily connected channels, one per endpoint URL, shared by every call to it.
#[derive(Default)]
pub struct Channels {
    open: Mutex<HashMap<String, Channel>>,
}

impl Channels {
    /// The channel to `url` (`https://host:port` or `http://host:port`), made on first use
    /// without connecting. Errors: a URL tonic cannot use (`Failed`, naming it).
    pub fn get(&self, url: &str) -> Result<Channel, Failure> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = open.get(url) {
            return Ok(c.clone());
        }
        let bad = |e: &dyn std::fmt::Display| {
            let mut f = Failure::transport(false, format!("endpoint {url} cannot be used: {e}"));
            f.code = Some(super::failure::codes::BAD_ENDPOINT.into());
            f
        };
        if !(url.starts_with("https://") || url.starts_with("http://")) {
            return Err(bad(&"not an http:// or https:// URL"));
        }
        let mut ep = Endpoint::from_shared(url.to_string())
            .map_err(|e| bad(&e))?
            .timeout(CALL_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT);
        if url.starts_with("https://") {
            ep = ep
                .tls_config(ClientTlsConfig::new().with_webpki_roots())
                .map_err(|e| bad(&e))?;
        }
        let c = ep.connect_lazy();
        open.insert(url.to_string(), c.clone());
        Ok(c)
    }
}

/// `msg` as a request carrying `authorization: Bearer <token>` and, when given, the
/// idempotency key under `idempotency_header`. Errors: a token or key that is not a valid
/// header value (never shown).
pub fn request<M>(
    msg: M,
    token: Option<&Secret>,
    idempotency: Option<(&'static str, &str)>,
) -> Result<tonic::Request<M>, Failure> {
    let mut r = tonic::Request::new(msg);
    if let Some(t) = token {
        let v: MetadataValue<_> = format!("Bearer {}", t.expose())
            .parse()
            .map_err(|_| Failure::no_credential("the access token is not a valid header value"))?;
        r.metadata_mut().insert("authorization", v);
    }
    if let Some((name, key)) = idempotency {
        let v: MetadataValue<_> = key
            .parse()
            .map_err(|_| Failure::transport(false, "the idempotency key is not a header value"))?;
        r.metadata_mut().insert(name, v);
    }
    Ok(r)
}

/// The transport's failure when `status` was made by tonic from a connection error rather
/// than answered by a server: `refused` when the endpoint refused the connection or its
/// name did not resolve (nothing was sent). `None` for a server's answer.
pub fn transport_failure(status: &tonic::Status) -> Option<Failure> {
    let source = std::error::Error::source(status)?;
    let chain = display_chain(source);
    let lower = chain.to_lowercase();
    let refused = lower.contains("connection refused")
        || lower.contains("dns error")
        || lower.contains("failed to lookup address");
    Some(Failure::transport(refused, format!("no answer: {chain}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_carry_the_token_and_key_and_bad_urls_are_named() {
        let token = Secret::new("tok-SENTINEL");
        let req = request((), Some(&token), Some(("x-idempotency-key", "k-1"))).unwrap();
        assert_eq!(
            req.metadata().get("authorization").unwrap(),
            "Bearer tok-SENTINEL"
        );
        assert_eq!(req.metadata().get("x-idempotency-key").unwrap(), "k-1");
        let bad = request((), Some(&Secret::new("a\nb")), None).unwrap_err();
        assert!(!bad.message.contains("a\nb"));
        let channels = Channels::default();
        let e = channels.get("not a url").unwrap_err();
        assert!(e.message.contains("not a url"), "{}", e.message);
        assert!(e.has_code(super::super::failure::codes::BAD_ENDPOINT));
        assert!(channels.get("ftp://127.0.0.1:9").is_err());
        assert!(channels.get("http://{service}").is_err());
    }
}
