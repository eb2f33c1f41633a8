//! OAuth2 client credentials (RFC 6749 section 4.4) for REST clouds whose API takes a
//! short-lived bearer access token (Verda): the token is fetched from the vendor's token
//! endpoint, cached, renewed before it expires (with the refresh grant when the server
//! issued a refresh token, falling back to the client-credentials grant when the refresh is
//! refused, as Verda's SDK does), and dropped when the API refuses a token that worked
//! before. A [`RestClient`](super::RestClient) given one as its
//! [`TokenSource`](super::TokenSource) sends the access token instead of its
//! credential; the client secret, the access token and the refresh token are scrubbed from
//! every error.
//!
//! The token request is a JSON body (`{grant_type, client_id, client_secret}` or
//! `{grant_type: refresh_token, refresh_token}`) without an `Authorization` header, as
//! Verda's Python SDK sends it (`verda/authentication/_authentication.py`); RFC 6749
//! describes a form body, which no cloud using this kit needs yet.
//!
//! A token is renewed once 90 % of its `expires_in` has passed (the margin Nebius' SDK
//! uses, `lifetime_safe_fraction`), so a call never starts with a token about to lapse.
//! Nothing here waits or retries: a refused renewal is the call's failure, and an API
//! answer of 401 to a token that had worked is [`failure::codes::STALE_TOKEN`] (retried by
//! the core, which then fetches a new token), while a 401 to a token never used with
//! success, or a refusal of the client credentials by the token endpoint
//! ([`failure::codes::TOKEN_REFUSED`]), is `Credentials`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Value};

use super::super::redact::Secret;
use super::failure::{codes, Failure};
use super::http::{ErrorDecoder, TokenCall, TokenSource};

/// The share of a token's lifetime after which it is renewed.
pub const RENEW_AT: f64 = 0.9;

/// Lifetime assumed for a token answered without `expires_in`, seconds.
pub const DEFAULT_LIFETIME_SECS: f64 = 300.0;

/// A client's OAuth2 client credentials and its cached token. Its `Debug` shows neither
/// the secret nor a token.
pub struct ClientCredentials {
    token_url: String,
    client_id: String,
    client_secret: Secret,
    /// The cached token, read briefly (also by [`ClientCredentials::secrets`]).
    state: Mutex<Option<Token>>,
    /// Held across a token request, so concurrent calls fetch one token, not several.
    gate: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for ClientCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCredentials")
            .field(
                "token_url",
                &super::super::redact::redact_url(&self.token_url),
            )
            .field("client_secret", &self.client_secret)
            .finish()
    }
}

#[derive(Clone)]
struct Token {
    access: Secret,
    refresh: Option<Secret>,
    renew_at: Instant,
    /// Whether an API call succeeded with it.
    worked: bool,
    /// The API refused it: renewed before the next call (its refresh token first).
    stale: bool,
}

/// A token endpoint's answer (RFC 6749 5.1), the fields gpuprov reads.
#[derive(Deserialize)]
struct Answer {
    access_token: String,
    #[serde(default)]
    refresh_token: Option<String>,
    /// Seconds; Verda's SDK adds it to the clock as a number.
    #[serde(default)]
    expires_in: Option<f64>,
}

impl ClientCredentials {
    /// Credentials `client_id` / `client_secret` for the token endpoint at `token_url`.
    /// Does no I/O.
    pub fn new(token_url: &str, client_id: &str, client_secret: Secret) -> ClientCredentials {
        ClientCredentials {
            token_url: token_url.to_string(),
            client_id: client_id.to_string(),
            client_secret,
            state: Mutex::new(None),
            gate: tokio::sync::Mutex::new(()),
        }
    }

    fn cached(&self) -> Option<Token> {
        self.state.lock().map(|s| s.clone()).unwrap_or(None)
    }

    fn store(&self, t: Option<Token>) {
        if let Ok(mut s) = self.state.lock() {
            *s = t;
        }
    }

    /// The access token to send now: the cached one while fresh, else a renewed one.
    ///
    /// Errors (as [`Failure`]s, classified by the caller's table): the token endpoint's
    /// answer decoded with `decode`; a refusal of the client credentials (400, 401, 403)
    /// carries [`codes::TOKEN_REFUSED`]; `transport` names a call that got no answer.
    async fn fetch(
        &self,
        http: &reqwest::Client,
        decode: ErrorDecoder,
        transport: impl Fn(reqwest::Error) -> Failure,
    ) -> Result<Secret, Failure> {
        let _one_at_a_time = self.gate.lock().await;
        let cached = self.cached();
        if let Some(t) = cached
            .as_ref()
            .filter(|t| !t.stale && Instant::now() < t.renew_at)
        {
            return Ok(t.access.clone());
        }
        if let Some(refresh) = cached.and_then(|t| t.refresh) {
            let body = json!({ "grant_type": "refresh_token", "refresh_token": refresh.expose() });
            match self.request(http, &body, decode, &transport).await {
                Ok(t) => return Ok(t),
                // Verda's SDK: "if refresh token is also expired, authenticate again".
                Err(f) if matches!(f.http_status(), Some(400 | 401)) => {}
                Err(f) => return Err(f),
            }
        }
        let body = json!({
            "grant_type": "client_credentials",
            "client_id": self.client_id,
            "client_secret": self.client_secret.expose(),
        });
        self.request(http, &body, decode, &transport)
            .await
            .map_err(|f| match f.http_status() {
                Some(s @ (400 | 401 | 403)) => Failure::http(
                    s,
                    Some(codes::TOKEN_REFUSED.into()),
                    format!(
                        "the token endpoint refused the client credentials: {}",
                        f.message
                    ),
                ),
                _ => f,
            })
    }

    async fn request(
        &self,
        http: &reqwest::Client,
        body: &Value,
        decode: ErrorDecoder,
        transport: &impl Fn(reqwest::Error) -> Failure,
    ) -> Result<Secret, Failure> {
        let resp = http
            .post(&self.token_url)
            .json(body)
            .send()
            .await
            .map_err(transport)?;
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let text = resp.text().await.map_err(transport)?;
        if !(200..300).contains(&status) {
            let (code, message) = decode(status, content_type.as_deref(), &text);
            return Err(Failure::http(status, code, message));
        }
        let answer: Answer = serde_json::from_str(&text).map_err(|e| {
            Failure::http(
                status,
                None,
                format!("unreadable token endpoint answer: {e}"),
            )
        })?;
        if answer.access_token.trim().is_empty() {
            return Err(Failure::http(
                status,
                None,
                "the token endpoint answered an empty access token",
            ));
        }
        let lifetime = answer.expires_in.unwrap_or(DEFAULT_LIFETIME_SECS).max(0.0) * RENEW_AT;
        let token = Token {
            access: Secret::new(answer.access_token),
            refresh: answer
                .refresh_token
                .filter(|r| !r.is_empty())
                .map(Secret::new),
            renew_at: Instant::now() + Duration::from_secs_f64(lifetime.min(1e9)),
            worked: false,
            stale: false,
        };
        let access = token.access.clone();
        self.store(Some(token));
        Ok(access)
    }

    /// Records that a call succeeded with `access`.
    fn record_worked(&self, access: &Secret) {
        if let Ok(mut s) = self.state.lock() {
            if let Some(t) = s.as_mut().filter(|t| t.access == *access) {
                t.worked = true;
            }
        }
    }

    /// The API refused `access` (HTTP 401): marks it stale, so the next call renews it (its
    /// refresh token first). Answers whether it had worked before (it expired or was
    /// revoked early; another try may succeed) rather than failing on its first use (the
    /// credentials are wrong).
    fn record_rejected(&self, access: &Secret) -> bool {
        let Ok(mut s) = self.state.lock() else {
            return false;
        };
        match s.as_mut() {
            Some(t) if t.access == *access => {
                t.stale = true;
                t.worked
            }
            // Another call already renewed it: try again with the new one.
            _ => true,
        }
    }

    /// The secrets to scrub from messages: the client secret and the cached tokens.
    fn secret_list(&self) -> Vec<Secret> {
        let mut out = vec![self.client_secret.clone()];
        if let Some(t) = self.cached() {
            out.push(t.access.clone());
            out.extend(t.refresh);
        }
        out
    }
}

#[async_trait::async_trait]
impl TokenSource for ClientCredentials {
    /// The access token to send now: the cached one while fresh, else a renewed one,
    /// requested through the API client's own HTTP client.
    async fn token(&self, call: &TokenCall<'_>) -> Result<Secret, Failure> {
        self.fetch(call.http, call.decode, |e| {
            call.transport(e, &self.token_url)
        })
        .await
    }

    fn secrets(&self) -> Vec<Secret> {
        self.secret_list()
    }

    fn worked(&self, token: &Secret) {
        self.record_worked(token)
    }

    fn rejected(&self, token: &Secret) -> bool {
        self.record_rejected(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::kit::http::plain_error;
    use wiremock::matchers::{body_partial_json, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    fn answer(access: &str, expires_in: f64) -> ResponseTemplate {
        ResponseTemplate::new(200).set_body_json(serde_json::json!({
            "access_token": access, "refresh_token": format!("r-{access}"), "expires_in": expires_in
        }))
    }

    fn transport(e: reqwest::Error) -> Failure {
        Failure::transport(false, e.to_string())
    }

    #[tokio::test]
    async fn tokens_are_cached_renewed_by_refresh_and_refetched_when_refused() {
        let server = MockServer::start().await;
        let grant = |g: &str| body_partial_json(serde_json::json!({ "grant_type": g }));
        Mock::given(method("POST"))
            .and(path("/token"))
            .and(grant("client_credentials"))
            .respond_with(answer("a1", 0.0))
            .up_to_n_times(1)
            .mount(&server)
            .await;
        // The first refresh works (an already lapsed token: renewed on every call), the
        // second is refused: the client credentials are sent again.
        Mock::given(method("POST"))
            .and(path("/token"))
            .and(body_partial_json(
                serde_json::json!({ "refresh_token": "r-a1" }),
            ))
            .respond_with(answer("a2", 3600.0))
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path("/token"))
            .and(body_partial_json(
                serde_json::json!({ "refresh_token": "r-a2" }),
            ))
            .respond_with(ResponseTemplate::new(400))
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path("/token"))
            .and(grant("client_credentials"))
            .respond_with(answer("a3", 3600.0))
            .mount(&server)
            .await;
        let c = ClientCredentials::new(
            &format!("{}/token", server.uri()),
            "id",
            Secret::new("s3cr3t"),
        );
        let http = reqwest::Client::new();
        async fn t(c: &ClientCredentials, http: &reqwest::Client) -> String {
            c.fetch(http, plain_error, transport)
                .await
                .unwrap()
                .expose()
                .to_string()
        }
        assert_eq!(t(&c, &http).await, "a1");
        assert_eq!(t(&c, &http).await, "a2", "a1 lapsed at once: refreshed");
        assert_eq!(t(&c, &http).await, "a2", "a2 is cached");
        // Refused on its first use: the credentials are wrong, not the token's age.
        assert!(!c.rejected(&Secret::new("a2")));
        c.worked(&Secret::new("a2"));
        assert!(c.rejected(&Secret::new("a2")), "worked before: stale");
        assert_eq!(
            t(&c, &http).await,
            "a3",
            "refresh refused: client credentials again"
        );
        assert!(
            c.secrets().contains(&Secret::new("a3"))
                && c.secrets().contains(&Secret::new("s3cr3t"))
        );
        assert!(!format!("{c:?}").contains("s3cr3t"));
    }

    #[tokio::test]
    async fn refused_client_credentials_are_marked_for_the_classifier() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/token"))
            .respond_with(ResponseTemplate::new(401).set_body_string("bad client"))
            .mount(&server)
            .await;
        let c = ClientCredentials::new(&format!("{}/token", server.uri()), "id", Secret::new("x"));
        let f = c
            .fetch(&reqwest::Client::new(), plain_error, transport)
            .await
            .unwrap_err();
        assert!(f.has_code(codes::TOKEN_REFUSED), "{f:?}");
        assert!(
            f.message.starts_with("the token endpoint refused"),
            "{}",
            f.message
        );
    }
}
