//! One REST client for every adapter that speaks JSON over HTTPS: base URL, auth style,
//! the credential (held as a [`Secret`], scrubbed from every error), user agent,
//! timeout, `Retry-After` / `RateLimit-*` parsing, and the vendor's hooks for its error
//! body and its success envelope. Built on reqwest with rustls.
//!
//! A 2xx `text/plain` body is the payload `Value::String` of its text, trimmed.
//!
//! A cloud whose bearer token is short-lived (GCP's service-account tokens, Verda's
//! OAuth2 client credentials in [`super::oauth`]) hands the client a [`TokenSource`]:
//! every call asks it for the current token, and every token it has
//! issued is scrubbed from errors like the credential itself.
//!
//! An adapter makes one [`RestClient`] at construction (no I/O) and calls
//! [`RestClient::get`] / [`post`](RestClient::post) / [`put`](RestClient::put) /
//! [`delete`](RestClient::delete) for classified, typed answers, or
//! [`RestClient::send`] when it must look at the [`Failure`] itself (for example "not
//! found is success" on delete), then [`RestClient::fail`] to classify it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::super::redact::{redact_url, Secret};
use super::super::{cause, EndpointClass, ErrorKind, Gate, ProviderError};
use super::credentials::Credential;
use super::failure::{codes, Call, Classifier, Failure};

/// Per-request timeout when the adapter sets none, seconds.
pub const DEFAULT_TIMEOUT_SECS: u64 = 60;

/// Longest delay a `RateLimit-Reset` hint may ask for, seconds (the longest documented
/// window among the clouds, DigitalOcean's, is one hour).
pub const MAX_RESET_WAIT_SECS: u64 = 3600;

/// How the credential is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// `Authorization: Bearer <secret>`.
    Bearer,
    /// A named header carrying the secret (Hyperstack's `api_key`).
    Header(&'static str),
    /// HTTP basic auth with this user and the secret as password.
    Basic { user: String },
}

/// The vendor's error body decoder: `(status, Content-Type, body)` → `(code, message)`.
/// The default, [`plain_error`], keeps no code and a one-line cause.
pub type ErrorDecoder = fn(u16, Option<&str>, &str) -> (Option<String>, String);

/// The vendor's success envelope: the parsed 2xx body → the payload, or a failure the
/// vendor reports inside a 2xx (Hyperstack's `status: false`). The default returns the
/// body unchanged.
pub type SuccessEnvelope = fn(u16, Value) -> Result<Value, (Option<String>, String)>;

/// The default [`ErrorDecoder`]: no code, the short cause of
/// [`cause::http_cause`] (a JSON body's `message`, or one line naming status and type).
pub fn plain_error(
    status: u16,
    content_type: Option<&str>,
    body: &str,
) -> (Option<String>, String) {
    (None, cause::http_cause(status, content_type, body))
}

fn unchanged(_status: u16, v: Value) -> Result<Value, (Option<String>, String)> {
    Ok(v)
}

/// A source of short-lived bearer tokens (OAuth2 access tokens) for a [`RestClient`]:
/// it fetches a token when it has none that is still valid and refreshes it before it
/// expires (one token request per call at most: no loop, no wait).
#[async_trait]
pub trait TokenSource: Send + Sync {
    /// A token valid for the next call; `call` is the client's connection pool and
    /// error decoding, for a source whose token endpoint is the API's own. Errors: the
    /// token endpoint's answer as a [`Failure`] (its error code and description), or the
    /// transport's.
    async fn token(&self, call: &TokenCall<'_>) -> Result<Secret, Failure>;
    /// Every token issued so far and the long-lived secret behind them (a refresh token,
    /// a private key, a client secret), so none of them can surface in an error.
    fn secrets(&self) -> Vec<Secret>;
    /// A call made with `token` succeeded.
    fn worked(&self, _token: &Secret) {}
    /// The API refused `token` (HTTP 401). Returns whether a renewed token may succeed
    /// (it had worked: it expired or was revoked early), so the call is retried
    /// ([`codes::STALE_TOKEN`]), rather than the credentials being wrong.
    fn rejected(&self, _token: &Secret) -> bool {
        false
    }
}

/// What a [`TokenSource`] may use for its own requests: the client's HTTP client (its
/// timeout), its error-body decoder, and the transport failure naming a URL.
pub struct TokenCall<'a> {
    /// The client's HTTP client.
    pub http: &'a reqwest::Client,
    /// The vendor's error-body decoder.
    pub decode: ErrorDecoder,
    /// The client's per-request timeout.
    pub timeout: Duration,
}

impl TokenCall<'_> {
    /// The [`Failure`] of a token request to `url` that got no answer.
    pub fn transport(&self, e: reqwest::Error, url: &str) -> Failure {
        transport_failure(e, url, self.timeout)
    }
}

/// How one adapter talks to its API.
pub struct RestClient {
    cloud: &'static str,
    base: String,
    auth: Auth,
    credential: Option<Credential>,
    /// The Credentials message when no credential was found (which, and where looked).
    missing: String,
    classifier: &'static Classifier,
    decode_error: ErrorDecoder,
    envelope: SuccessEnvelope,
    http: reqwest::Client,
    /// The per-request timeout, for the message when it runs out.
    timeout: Duration,
    /// Where the bearer token comes from when it is short-lived; `None`: the credential
    /// is sent as `auth` says.
    tokens: Option<Arc<dyn TokenSource>>,
    /// The core's rate limiter, passed by every request ([`RestClient::gated`]).
    gate: Gate,
    /// The `(method, path, class)` of each request the vendor limits apart from the
    /// others ([`RestClient::with_endpoint_class`]).
    endpoints: Vec<(Method, &'static str, EndpointClass)>,
}

impl std::fmt::Debug for RestClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestClient")
            .field("cloud", &self.cloud)
            .field("base", &redact_url(&self.base))
            .field("auth", &self.auth)
            .field("credential", &self.credential)
            .finish()
    }
}

impl RestClient {
    /// A client for `base` (trailing `/` ignored) classifying with `classifier` (whose
    /// `cloud` names the adapter). `credential` `None` makes every call fail with
    /// `Credentials` and the message `missing`. Does no I/O; never fails.
    pub fn new(
        base: &str,
        auth: Auth,
        credential: Option<Credential>,
        missing: impl Into<String>,
        classifier: &'static Classifier,
    ) -> RestClient {
        RestClient {
            cloud: classifier.cloud,
            base: base.trim_end_matches('/').to_string(),
            auth,
            credential,
            missing: missing.into(),
            classifier,
            decode_error: plain_error,
            envelope: unchanged,
            http: client(Duration::from_secs(DEFAULT_TIMEOUT_SECS)),
            timeout: Duration::from_secs(DEFAULT_TIMEOUT_SECS),
            tokens: None,
            gate: Gate::default(),
            endpoints: Vec::new(),
        }
    }

    /// Every request passes `gate` first (the adapter's, from
    /// [`Adapter::gate`](super::Adapter::gate)), so the core's limits for the vendor's
    /// documented rates hold however many requests one contract call sends.
    pub fn gated(mut self, gate: Gate) -> RestClient {
        self.gate = gate;
        self
    }

    /// Requests to `method path` (the path exact, as sent after the base URL, without
    /// query) are counted as `class`, for a vendor limit on that endpoint: its launch
    /// request ([`EndpointClass::Launch`]), its SSH key listing
    /// ([`EndpointClass::KeyListing`]). Other `GET`/`HEAD` requests are
    /// [`EndpointClass::Read`], the rest [`EndpointClass::Other`]. A later declaration
    /// of the same `method path` replaces the earlier.
    pub fn with_endpoint_class(
        mut self,
        method: Method,
        path: &'static str,
        class: EndpointClass,
    ) -> RestClient {
        self.endpoints
            .retain(|(m, p, _)| !(*m == method && *p == path));
        self.endpoints.push((method, path, class));
        self
    }

    /// The endpoint class of `method path` (a query after `?` ignored; see
    /// [`Self::with_endpoint_class`]).
    pub fn class_of(&self, method: &Method, path: &str) -> EndpointClass {
        let path = path.split('?').next().unwrap_or(path);
        let named = self
            .endpoints
            .iter()
            .find(|(m, p, _)| m == method && *p == path);
        match named {
            Some((_, _, class)) => *class,
            None if *method == Method::GET || *method == Method::HEAD => EndpointClass::Read,
            None => EndpointClass::Other,
        }
    }

    /// Sends `Authorization: Bearer <token>` with the token `tokens` hands out, instead of
    /// the credential (which then only says that, and where, one was found).
    pub fn with_token_source(mut self, tokens: Arc<dyn TokenSource>) -> RestClient {
        self.tokens = Some(tokens);
        self
    }

    /// Sets the vendor's error body decoder.
    pub fn with_error_decoder(mut self, d: ErrorDecoder) -> RestClient {
        self.decode_error = d;
        self
    }

    /// Sets the vendor's success envelope.
    pub fn with_envelope(mut self, e: SuccessEnvelope) -> RestClient {
        self.envelope = e;
        self
    }

    /// Sets the per-request timeout.
    pub fn with_timeout(mut self, t: Duration) -> RestClient {
        self.http = client(t);
        self.timeout = t;
        self
    }

    /// The base URL, credentials in it redacted.
    pub fn base(&self) -> String {
        redact_url(&self.base)
    }

    /// The credential's value, for scrubbing; `None` without one.
    pub fn secret(&self) -> Option<&str> {
        self.credential.as_ref().map(|c| c.secret.expose())
    }

    /// The credential in use and where it was found.
    pub fn credential(&self) -> Option<&Credential> {
        self.credential.as_ref()
    }

    /// Every secret an error must not show: the credential's value and, with a
    /// [`TokenSource`], every token it issued.
    pub fn secrets(&self) -> Vec<String> {
        let mut out: Vec<String> = self.secret().map(str::to_string).into_iter().collect();
        if let Some(t) = &self.tokens {
            out.extend(t.secrets().iter().map(|s| s.expose().to_string()));
        }
        out
    }

    /// The contract's error for `f` (see [`Classifier::classify`]).
    pub fn fail(&self, f: &Failure, call: Call<'_>) -> ProviderError {
        let secrets = self.secrets();
        self.classifier
            .classify(f, call, secrets.iter().map(String::as_str))
    }

    /// One call; the payload (`Null` for an empty body, such as a 204) or the failure as
    /// the vendor reported it. Errors never contain the credential.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<Value, Failure> {
        let Some(cred) = &self.credential else {
            return Err(Failure::no_credential(self.missing.clone()));
        };
        let url = format!("{}{path}", self.base);
        let class = self.class_of(&method, path);
        let mut req = self.http.request(method, &url);
        let token = match &self.tokens {
            Some(tokens) => {
                let call = TokenCall {
                    http: &self.http,
                    decode: self.decode_error,
                    timeout: self.timeout,
                };
                Some(tokens.token(&call).await?)
            }
            None => None,
        };
        req = match (&token, &self.auth) {
            (Some(t), _) => req.bearer_auth(t.expose()),
            (None, Auth::Bearer) => req.bearer_auth(cred.secret.expose()),
            (None, Auth::Header(name)) => req.header(*name, cred.secret.expose()),
            (None, Auth::Basic { user }) => req.basic_auth(user, Some(cred.secret.expose())),
        };
        if !query.is_empty() {
            req = req.query(query);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let transport = |e: reqwest::Error| transport_failure(e, &url, self.timeout);
        // Admitted last, just before the request leaves, so the core counts it when the
        // vendor does.
        self.gate.admit(class).await;
        let resp = req.send().await.map_err(transport)?;
        let status = resp.status().as_u16();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let rate = RateHeaders {
            retry_after: header("retry-after"),
            remaining: header("ratelimit-remaining"),
            reset: header("ratelimit-reset"),
            structured: header("ratelimit"),
        };
        let content_type = header("content-type");
        let text = resp.text().await.map_err(transport)?;
        if let (Some(tokens), Some(t)) = (&self.tokens, &token) {
            if (200..300).contains(&status) {
                tokens.worked(t);
            } else if status == 401 && tokens.rejected(t) {
                let (_, message) = (self.decode_error)(status, content_type.as_deref(), &text);
                return Err(Failure::http(
                    status,
                    Some(codes::STALE_TOKEN.into()),
                    message,
                ));
            }
        }
        // A plain-text answer (Verda answers a create with the new id as text) is its text.
        if (200..300).contains(&status)
            && content_type
                .as_deref()
                .is_some_and(|c| c.trim_start().starts_with("text/plain"))
        {
            return Ok(Value::String(text.trim().to_string()));
        }
        if !(200..300).contains(&status) {
            let (code, message) = (self.decode_error)(status, content_type.as_deref(), &text);
            return Err(Failure::http(status, code, message)
                .with_retry_after(rate.delay_secs(status, now_epoch())));
        }
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        let v: Value = serde_json::from_str(&text).map_err(|e| {
            Failure::http(status, None, format!("unreadable response to {path}: {e}"))
        })?;
        (self.envelope)(status, v).map_err(|(code, message)| Failure::http(status, code, message))
    }

    /// [`Self::send`] classified as `call`, the payload parsed into `T`.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
        call: Call<'_>,
    ) -> Result<T, ProviderError> {
        let v = self
            .send(method, path, query, body)
            .await
            .map_err(|f| self.fail(&f, call))?;
        self.parse(v, call)
    }

    /// `v` parsed into `T`; a shape the adapter does not expect is `Failed`, naming the
    /// call.
    pub fn parse<T: DeserializeOwned>(&self, v: Value, call: Call<'_>) -> Result<T, ProviderError> {
        serde_json::from_value(v).map_err(|e| {
            ProviderError::new(
                ErrorKind::Failed,
                format!(
                    "{} {}: unexpected response shape: {e}",
                    self.cloud, call.what
                ),
            )
        })
    }

    pub async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
        call: Call<'_>,
    ) -> Result<T, ProviderError> {
        self.call(Method::GET, path, query, None, call).await
    }

    pub async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &Value,
        call: Call<'_>,
    ) -> Result<T, ProviderError> {
        self.call(Method::POST, path, &[], Some(body), call).await
    }

    pub async fn put<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &Value,
        call: Call<'_>,
    ) -> Result<T, ProviderError> {
        self.call(Method::PUT, path, &[], Some(body), call).await
    }

    /// `DELETE path`; an answer the `gone` predicate accepts (typically "not found") is
    /// success, since deletes are idempotent.
    pub async fn delete(
        &self,
        path: &str,
        gone: impl Fn(&Failure) -> bool,
        call: Call<'_>,
    ) -> Result<(), ProviderError> {
        match self.send(Method::DELETE, path, &[], None).await {
            Ok(_) => Ok(()),
            Err(f) if gone(&f) => Ok(()),
            Err(f) => Err(self.fail(&f, call)),
        }
    }
}

/// The [`Failure`] of a request that got no HTTP answer from `url` (its credentials
/// redacted): a refused connection says so (the error's text alone reads "error sending
/// request"), so the user sees that nothing answered at that endpoint, and a server that
/// accepts and never answers within `timeout` is named as such.
pub fn transport_failure(e: reqwest::Error, url: &str, timeout: Duration) -> Failure {
    let refused = cause::is_refused(&e);
    let what = if refused {
        "the API endpoint refused the connection".to_string()
    } else if e.is_timeout() {
        format!(
            "the API endpoint did not answer within {}",
            humantime::format_duration(timeout)
        )
    } else {
        e.without_url().to_string()
    };
    Failure::transport(refused, format!("{what} ({})", redact_url(url)))
}

/// The HTTP client every adapter uses (rustls, gpuprov's user agent), with a per-request
/// `timeout`.
pub fn client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(timeout)
        .user_agent(concat!("gpuprov/", env!("CARGO_PKG_VERSION")))
        .build()
        .unwrap_or_default()
}

fn now_epoch() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The rate-limit headers of one response, as sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateHeaders {
    /// `Retry-After`: delta-seconds (RFC 9110 10.2.3; the HTTP-date form is ignored).
    pub retry_after: Option<String>,
    /// `RateLimit-Remaining`: requests left in the window.
    pub remaining: Option<String>,
    /// `RateLimit-Reset`: seconds until the window resets, or (DigitalOcean) the Unix
    /// epoch second when it does; values above 10^9 are read as epoch seconds.
    pub reset: Option<String>,
    /// The structured `RateLimit` header (RunPod, IETF draft): members such as
    /// `"minute";r=0;t=12` — `r` requests remaining, `t` seconds until reset.
    pub structured: Option<String>,
}

impl RateHeaders {
    /// The delay the server asks for, seconds: `Retry-After` when present; on a 429
    /// without it, the reset of an exhausted window (`RateLimit-Remaining: 0` or absent
    /// with `RateLimit-Reset`, or an exhausted member of `RateLimit`), at least 1 s and at
    /// most [`MAX_RESET_WAIT_SECS`].
    pub fn delay_secs(&self, status: u16, now_epoch: u64) -> Option<u64> {
        let num = |v: &Option<String>| v.as_deref().and_then(|s| s.trim().parse::<u64>().ok());
        if let Some(s) = num(&self.retry_after) {
            return Some(s);
        }
        if status != 429 {
            return None;
        }
        let reset = num(&self.reset)
            .filter(|_| num(&self.remaining).is_none_or(|r| r == 0))
            .map(|r| {
                if r > 1_000_000_000 {
                    r.saturating_sub(now_epoch)
                } else {
                    r
                }
            });
        reset
            .or_else(|| self.structured.as_deref().and_then(exhausted_window_secs))
            .map(|s| s.clamp(1, MAX_RESET_WAIT_SECS))
    }
}

/// The seconds until the first exhausted window resets, from a structured `RateLimit`
/// header such as `"minute";r=0;t=12, "hour";r=2800;t=1812`. The longest wait of the
/// exhausted windows wins; `None` when no window is exhausted or the value is unreadable.
pub fn exhausted_window_secs(rate_limit: &str) -> Option<u64> {
    rate_limit
        .split(',')
        .filter_map(|member| {
            let mut r = None;
            let mut t = None;
            for param in member.split(';').skip(1) {
                match param.trim().split_once('=') {
                    Some(("r", v)) => r = v.trim().parse::<u64>().ok(),
                    Some(("t", v)) => t = v.trim().parse::<u64>().ok(),
                    _ => {}
                }
            }
            (r == Some(0)).then_some(t).flatten()
        })
        .max()
}

/// The [`Failure`] of one error response as [`RestClient::send`] makes it: the vendor's
/// `decode` on the body, the delay the rate-limit headers ask for at `now_epoch`. For
/// classifying answers without a server (property tests, adapters' compatibility shims).
pub fn failure_of(
    decode: ErrorDecoder,
    status: u16,
    content_type: Option<&str>,
    body: &str,
    rate: &RateHeaders,
    now_epoch: u64,
) -> Failure {
    let (code, message) = decode(status, content_type, body);
    Failure::http(status, code, message).with_retry_after(rate.delay_secs(status, now_epoch))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::kit::credentials::Source;
    use crate::provider::kit::failure::{Rule, Status};
    use crate::provider::redact::Secret;

    const RULES: &[Rule] = &[];
    static C: Classifier = Classifier {
        cloud: "acme",
        rules: RULES,
        credentials_help: "set ACME_KEY",
    };

    fn rate(
        ra: Option<&str>,
        rem: Option<&str>,
        reset: Option<&str>,
        s: Option<&str>,
    ) -> RateHeaders {
        RateHeaders {
            retry_after: ra.map(str::to_string),
            remaining: rem.map(str::to_string),
            reset: reset.map(str::to_string),
            structured: s.map(str::to_string),
        }
    }

    #[test]
    fn delays_from_every_rate_limit_header() {
        assert_eq!(
            rate(Some("7"), None, None, None).delay_secs(503, 0),
            Some(7)
        );
        assert_eq!(
            rate(None, Some("0"), Some("1000000030"), None).delay_secs(429, 1_000_000_000),
            Some(30)
        );
        assert_eq!(
            rate(None, Some("0"), Some("12"), None).delay_secs(429, 5),
            Some(12)
        );
        assert_eq!(
            rate(None, Some("3"), Some("12"), None).delay_secs(429, 5),
            None
        );
        assert_eq!(
            rate(None, None, Some("99999"), None).delay_secs(429, 0),
            Some(MAX_RESET_WAIT_SECS)
        );
        assert_eq!(
            rate(
                None,
                None,
                None,
                Some("\"minute\";r=0;t=12, \"hour\";r=0;t=40")
            )
            .delay_secs(429, 0),
            Some(40)
        );
        assert_eq!(
            rate(None, None, None, Some("\"minute\";r=5;t=12")).delay_secs(429, 0),
            None
        );
        assert_eq!(
            rate(None, Some("0"), Some("12"), None).delay_secs(500, 0),
            None
        );
        assert_eq!(exhausted_window_secs("garbage"), None);
    }

    #[tokio::test]
    async fn an_endpoint_that_never_answers_is_a_named_timeout() {
        // Accepts on loopback and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let hold = tokio::spawn(async move {
            let (_sock, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        let cred = Credential {
            secret: Secret::new("k"),
            source: Source::Env("ACME_KEY"),
        };
        let c = RestClient::new(
            &format!("http://127.0.0.1:{port}"),
            Auth::Bearer,
            Some(cred),
            "",
            &C,
        )
        .with_timeout(Duration::from_millis(300));
        let f = c.send(Method::GET, "/v1/x", &[], None).await.unwrap_err();
        assert_eq!(f.status, Status::Transport { refused: false }, "{f:?}");
        assert!(
            f.message
                .starts_with("the API endpoint did not answer within 300ms"),
            "{}",
            f.message
        );
        assert_eq!(c.fail(&f, Call::other("list")).kind, ErrorKind::Transient);
        hold.abort();
    }

    #[tokio::test]
    async fn without_a_credential_nothing_is_sent() {
        let c = RestClient::new(
            "http://127.0.0.1:9",
            Auth::Bearer,
            None,
            "no key: set ACME_KEY",
            &C,
        );
        let f = c.send(Method::GET, "/x", &[], None).await.unwrap_err();
        assert_eq!(f.status, Status::NoCredential);
        let e = c.fail(&f, Call::other("list"));
        assert_eq!(e.kind, ErrorKind::Credentials);
        assert_eq!(e.help.as_deref(), Some("set ACME_KEY"));
    }

    #[tokio::test]
    async fn a_refused_connection_is_unreachable_and_the_key_never_shows() {
        // Port 9 (discard) on loopback: nothing listens there in the test environment.
        let cred = Credential {
            secret: Secret::new("sk_test_sentinel"),
            source: Source::Env("ACME_KEY"),
        };
        let c = RestClient::new(
            "http://user:sk_test_sentinel@127.0.0.1:9/",
            Auth::Bearer,
            Some(cred),
            "",
            &C,
        );
        assert_eq!(c.base(), "http://REDACTED@127.0.0.1:9");
        let f = c.send(Method::GET, "/v1/x", &[], None).await.unwrap_err();
        assert_eq!(f.status, Status::Transport { refused: true }, "{f:?}");
        let e = c.fail(&f, Call::other("list"));
        assert_eq!(e.kind, ErrorKind::Unreachable);
        assert!(e.msg.contains("refused the connection"), "{}", e.msg);
        assert!(!e.msg.contains("sk_test_sentinel"), "{}", e.msg);
        assert!(!format!("{c:?}").contains("sk_test_sentinel"));
    }

    #[test]
    fn a_named_endpoint_is_classed_by_method_and_exact_path() {
        let c = RestClient::new("http://127.0.0.1:9", Auth::Bearer, None, "", &C)
            .with_endpoint_class(Method::POST, "/v2/droplets", EndpointClass::Launch)
            .with_endpoint_class(Method::GET, "/v2/account/keys", EndpointClass::KeyListing);
        let class = |m: Method, p: &str| c.class_of(&m, p);
        assert_eq!(
            class(Method::GET, "/v2/account/keys"),
            EndpointClass::KeyListing
        );
        assert_eq!(
            class(Method::GET, "/v2/account/keys?page=2&per_page=200"),
            EndpointClass::KeyListing
        );
        // The same path by another method, and a longer path, are not the listing.
        assert_eq!(
            class(Method::POST, "/v2/account/keys"),
            EndpointClass::Other
        );
        assert_eq!(
            class(Method::GET, "/v2/account/keys/42"),
            EndpointClass::Read
        );
        assert_eq!(
            class(Method::DELETE, "/v2/account/keys/42"),
            EndpointClass::Other
        );
        assert_eq!(class(Method::POST, "/v2/droplets"), EndpointClass::Launch);
        assert_eq!(
            class(Method::GET, "/v2/droplets?tag_name=x"),
            EndpointClass::Read
        );
        assert_eq!(class(Method::HEAD, "/v2/account/keys"), EndpointClass::Read);
        // A later declaration of the same endpoint replaces the earlier.
        let c = c.with_endpoint_class(Method::GET, "/v2/account/keys", EndpointClass::Read);
        assert_eq!(
            c.class_of(&Method::GET, "/v2/account/keys"),
            EndpointClass::Read
        );
    }

    #[test]
    fn a_recorded_response_fails_as_a_sent_one() {
        let rate = RateHeaders {
            retry_after: Some("4".into()),
            ..RateHeaders::default()
        };
        let f = failure_of(plain_error, 429, None, "", &rate, 0);
        assert_eq!(
            f,
            Failure::http(429, None, plain_error(429, None, "").1).with_retry_after(Some(4))
        );
    }
}
