//! Google credentials: where they are found and how an access token is obtained.
//!
//! Lookup order (Google's "Application Default Credentials", as google-auth implements
//! it in `google/auth/_default.py`):
//! 1. the JSON file named by `GOOGLE_APPLICATION_CREDENTIALS`;
//! 2. gcloud's `application_default_credentials.json` in its configuration directory
//!    (`$CLOUDSDK_CONFIG`, else `~/.config/gcloud`; `%APPDATA%\gcloud` on Windows;
//!    `google/auth/_cloud_sdk.py`);
//! 3. the metadata server of a Compute Engine VM, only when `GCE_METADATA_HOST` names one
//!    or the machine says it is one (`/sys/class/dmi/id/product_name` starts with
//!    `Google`, google-auth's `detect_gce_residency_linux`), so a machine elsewhere never
//!    waits on an address that does not answer.
//!
//! A file may hold a service-account key (`"type": "service_account"`) or a gcloud user
//! login (`"type": "authorized_user"`); other types (workload identity federation,
//! impersonation) are refused with a message saying so.
//!
//! Tokens (OAuth 2.0): a service account signs a JWT (RS256 with its private key; header
//! `kid` = `private_key_id`; claims `iss` = `client_email`, `scope`, `aud` = Google's token
//! endpoint `https://oauth2.googleapis.com/token`, `iat`, `exp` = `iat` + 1 hour, as
//! google-auth's `service_account.Credentials._make_authorization_grant_assertion`) and
//! posts it to the key's own `token_uri` as the JWT-bearer grant
//! (`grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer`, RFC 7523); a user login posts
//! its refresh token (`grant_type=refresh_token`, RFC 6749 6) to its `token_uri` (default
//! the same endpoint); the metadata server answers
//! `GET /computeMetadata/v1/instance/service-accounts/default/token` with header
//! `Metadata-Flavor: Google`. A token is reused until it is within 3 minutes 45 seconds of
//! its `expires_in` (google-auth's `_helpers.REFRESH_THRESHOLD`), then fetched again on
//! the next call: one token request per API call at most, never a loop or a wait.
//!
//! Why not an auth crate: `gcp_auth` 0.12.7 honours a key's `token_uri`, but reduces every
//! token endpoint refusal to "token request failed" (so `invalid_grant` and a 503 look
//! the same) and retries with sleeps inside the call, which the adapter rule forbids. The
//! JWT is made with `jsonwebtoken` and sent with the kit's HTTP client.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::provider::kit::http::{client, transport_failure};
use crate::provider::kit::token_cache::TokenCache;
use crate::provider::kit::{Failure, Source, TokenCall, TokenSource};
use crate::provider::Secret;

use super::errors::token_failure;

/// Environment variable naming a credentials JSON file.
pub const CREDENTIALS_ENV: &str = "GOOGLE_APPLICATION_CREDENTIALS";
/// Environment variable naming gcloud's configuration directory.
pub const CLOUDSDK_CONFIG_ENV: &str = "CLOUDSDK_CONFIG";
/// Environment variable naming the metadata server (`host[:port]`).
pub const METADATA_HOST_ENV: &str = "GCE_METADATA_HOST";
/// The metadata server's name on a Compute Engine VM.
pub const METADATA_HOST: &str = "metadata.google.internal";
/// Google's OAuth 2.0 token endpoint, and the audience of every service-account JWT.
pub const TOKEN_ENDPOINT: &str = "https://oauth2.googleapis.com/token";
/// The grant a service account's signed JWT is posted with (RFC 7523 2.1).
pub const JWT_BEARER_GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// The scope gpuprov asks for (the discovery document's `auth.oauth2.scopes`).
pub const SCOPE: &str = "https://www.googleapis.com/auth/compute";
/// How long before its expiry a token is fetched again (google-auth's
/// `REFRESH_THRESHOLD`).
pub const REFRESH_THRESHOLD: Duration = Duration::from_secs(3 * 60 + 45);
/// The lifetime of a signed JWT, seconds (Google's maximum).
const JWT_LIFETIME_SECS: u64 = 3600;
/// Timeout of one token request.
const TOKEN_TIMEOUT: Duration = Duration::from_secs(20);
/// The DMI product name file google-auth reads to tell a Compute Engine VM.
const PRODUCT_NAME_FILE: &str = "/sys/class/dmi/id/product_name";

/// A service-account key file (the fields gpuprov uses).
#[derive(Clone, Deserialize)]
pub struct ServiceAccountKey {
    pub client_email: String,
    #[serde(deserialize_with = "secret")]
    pub private_key: Secret,
    #[serde(default)]
    pub private_key_id: Option<String>,
    #[serde(default = "default_token_uri")]
    pub token_uri: String,
    #[serde(default)]
    pub project_id: Option<String>,
}

/// A gcloud user login (`gcloud auth application-default login`).
#[derive(Clone, Deserialize)]
pub struct AuthorizedUser {
    pub client_id: String,
    #[serde(deserialize_with = "secret")]
    pub client_secret: Secret,
    #[serde(deserialize_with = "secret")]
    pub refresh_token: Secret,
    #[serde(default = "default_token_uri")]
    pub token_uri: String,
    #[serde(default)]
    pub quota_project_id: Option<String>,
}

fn secret<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Secret, D::Error> {
    String::deserialize(d).map(Secret::new)
}

fn default_token_uri() -> String {
    TOKEN_ENDPOINT.to_string()
}

/// What a credential is.
#[derive(Clone)]
pub enum Kind {
    /// A service-account key (JWT-bearer grant).
    ServiceAccount(Box<ServiceAccountKey>),
    /// A gcloud user login (refresh-token grant).
    AuthorizedUser(Box<AuthorizedUser>),
    /// The metadata server at this `host[:port]`.
    Metadata(String),
}

impl std::fmt::Debug for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kind::ServiceAccount(k) => write!(f, "ServiceAccount({})", k.client_email),
            Kind::AuthorizedUser(_) => f.write_str("AuthorizedUser"),
            Kind::Metadata(h) => write!(f, "Metadata({h})"),
        }
    }
}

/// A credential and where it was found; its `Debug` shows no secret.
#[derive(Debug, Clone)]
pub struct GoogleCredential {
    pub kind: Kind,
    /// Where it was found (for `gpuprov validate`).
    pub source: Source,
}

impl GoogleCredential {
    /// The credential in the JSON `text` of a credentials file found at `source`.
    /// Errors: a message saying what is wrong with it (never its content).
    pub fn from_json(text: &str, source: Source) -> Result<GoogleCredential, String> {
        #[derive(Deserialize)]
        struct Typed {
            #[serde(rename = "type", default)]
            ty: String,
        }
        let ty = serde_json::from_str::<Typed>(text)
            .map_err(|e| format!("{source} is not a JSON credentials file ({e})"))?
            .ty;
        let kind = match ty.as_str() {
            "service_account" => Kind::ServiceAccount(Box::new(
                serde_json::from_str(text)
                    .map_err(|e| format!("{source} is not a service-account key: {e}"))?,
            )),
            "authorized_user" => Kind::AuthorizedUser(Box::new(
                serde_json::from_str(text)
                    .map_err(|e| format!("{source} is not a gcloud user login: {e}"))?,
            )),
            other => {
                return Err(format!(
                    "{source} holds credentials of type {other:?}; gpuprov reads \
                     service_account and authorized_user credentials"
                ))
            }
        };
        Ok(GoogleCredential { kind, source })
    }

    /// The project the credential belongs to: a key's `project_id`, a user login's
    /// `quota_project_id`; `None` for the metadata server (whose project is not read).
    pub fn project(&self) -> Option<&str> {
        match &self.kind {
            Kind::ServiceAccount(k) => k.project_id.as_deref(),
            Kind::AuthorizedUser(u) => u.quota_project_id.as_deref(),
            Kind::Metadata(_) => None,
        }
        .filter(|p| !p.trim().is_empty())
    }

    /// The secrets behind the credential (never sent to the Compute API, scrubbed from
    /// errors all the same).
    fn secrets(&self) -> Vec<Secret> {
        match &self.kind {
            Kind::ServiceAccount(k) => vec![k.private_key.clone()],
            Kind::AuthorizedUser(u) => vec![u.client_secret.clone(), u.refresh_token.clone()],
            Kind::Metadata(_) => vec![],
        }
    }
}

/// What the lookup found: a credential, or why the one found is unusable; and every place
/// looked at, in order.
#[derive(Debug)]
pub struct Found {
    pub credential: Result<Option<GoogleCredential>, String>,
    pub looked_in: Vec<String>,
}

/// gcloud's application-default credentials file for the configuration directory
/// `cloudsdk_config` (`$CLOUDSDK_CONFIG`), else the platform's default.
pub fn adc_path(cloudsdk_config: Option<String>) -> Option<PathBuf> {
    let dir = match cloudsdk_config {
        Some(d) => PathBuf::from(d),
        None if cfg!(windows) => PathBuf::from(std::env::var_os("APPDATA")?).join("gcloud"),
        None => dirs::home_dir()?.join(".config").join("gcloud"),
    };
    Some(dir.join("application_default_credentials.json"))
}

/// Whether this machine says it is a Compute Engine VM (see the module docs). Reads one
/// small local file; never dials.
pub fn on_compute_engine() -> bool {
    std::fs::read_to_string(PRODUCT_NAME_FILE)
        .map(|s| s.trim().starts_with("Google"))
        .unwrap_or(false)
}

/// The lookup of the module docs, with the environment read through `env`, gcloud's file
/// at `adc`, and `on_gce` saying whether the metadata server may be asked.
pub fn find(env: impl Fn(&str) -> Option<String>, adc: Option<&Path>, on_gce: bool) -> Found {
    let mut looked = vec![Source::Env(CREDENTIALS_ENV).to_string()];
    let from_file = |path: &Path, source: Source| -> Result<GoogleCredential, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("{source}: cannot read {}: {e}", path.display()))?;
        GoogleCredential::from_json(&text, source)
    };
    if let Some(p) = env(CREDENTIALS_ENV).filter(|p| !p.trim().is_empty()) {
        let path = PathBuf::from(p.trim());
        let source = Source::Other(format!("{} (named by {CREDENTIALS_ENV})", path.display()));
        return Found {
            credential: from_file(&path, source).map(Some),
            looked_in: looked,
        };
    }
    if let Some(path) = adc {
        looked.push(path.display().to_string());
        if path.exists() {
            return Found {
                credential: from_file(path, Source::File(path.to_path_buf())).map(Some),
                looked_in: looked,
            };
        }
    }
    looked.push(format!(
        "the Compute Engine metadata server (only on a Compute Engine VM or with \
         {METADATA_HOST_ENV})"
    ));
    let host = env(METADATA_HOST_ENV)
        .filter(|h| !h.trim().is_empty())
        .or_else(|| on_gce.then(|| METADATA_HOST.to_string()));
    let credential = host.map(|h| GoogleCredential {
        source: Source::Other(format!("the Compute Engine metadata server at {h}")),
        kind: Kind::Metadata(h.trim().to_string()),
    });
    Found {
        credential: Ok(credential),
        looked_in: looked,
    }
}

/// The claims of a service account's JWT (module docs; times in seconds since the
/// epoch).
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Claims {
    /// The service account's email.
    pub iss: String,
    /// The scopes asked, space-separated.
    pub scope: String,
    /// Google's token endpoint.
    pub aud: String,
    pub iat: u64,
    pub exp: u64,
}

/// The signed JWT-bearer assertion of `key` for `scope` at `now` (seconds since the
/// epoch). Errors: the key cannot sign (not an RSA private key in PEM).
pub fn assertion(key: &ServiceAccountKey, scope: &str, now: u64) -> Result<String, String> {
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = key.private_key_id.clone();
    let claims = Claims {
        iss: key.client_email.clone(),
        scope: scope.to_string(),
        aud: TOKEN_ENDPOINT.to_string(),
        iat: now,
        exp: now + JWT_LIFETIME_SECS,
    };
    let signer = jsonwebtoken::EncodingKey::from_rsa_pem(key.private_key.expose().as_bytes())
        .map_err(|e| format!("the private key of {} cannot sign: {e}", key.client_email))?;
    jsonwebtoken::encode(&header, &claims, &signer).map_err(|e| {
        format!(
            "signing the token request of {} failed: {e}",
            key.client_email
        )
    })
}

/// A token endpoint's answer (RFC 6749 5.1; the metadata server answers the same shape).
#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    #[serde(default)]
    expires_in: Option<u64>,
}

/// The [`TokenSource`] of one credential: the token in use and its expiry, and every
/// token issued (for scrubbing).
pub struct Tokens {
    credential: GoogleCredential,
    http: reqwest::Client,
    cache: TokenCache,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("credential", &self.credential)
            .finish_non_exhaustive()
    }
}

impl Tokens {
    /// The token source of `credential`; no token is fetched until the first call.
    pub fn new(credential: GoogleCredential) -> Tokens {
        Tokens {
            credential,
            http: client(TOKEN_TIMEOUT),
            cache: TokenCache::default(),
        }
    }

    /// One token request for the credential (module docs).
    async fn fetch(&self) -> Result<(Secret, Duration), Failure> {
        let (url, req) = match &self.credential.kind {
            Kind::ServiceAccount(key) => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                let jwt = assertion(key, SCOPE, now).map_err(Failure::no_credential)?;
                let form = [
                    ("grant_type", JWT_BEARER_GRANT),
                    ("assertion", jwt.as_str()),
                ];
                (
                    key.token_uri.clone(),
                    self.http.post(&key.token_uri).form(&form),
                )
            }
            Kind::AuthorizedUser(u) => {
                let form = [
                    ("grant_type", "refresh_token"),
                    ("client_id", u.client_id.as_str()),
                    ("client_secret", u.client_secret.expose()),
                    ("refresh_token", u.refresh_token.expose()),
                ];
                (
                    u.token_uri.clone(),
                    self.http.post(&u.token_uri).form(&form),
                )
            }
            Kind::Metadata(host) => {
                let url = format!(
                    "http://{host}/computeMetadata/v1/instance/service-accounts/default/token"
                );
                let req = self.http.get(&url).header("Metadata-Flavor", "Google");
                (url, req)
            }
        };
        let resp = req
            .send()
            .await
            .map_err(|e| transport_failure(e, &url, TOKEN_TIMEOUT))?;
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = resp
            .text()
            .await
            .map_err(|e| transport_failure(e, &url, TOKEN_TIMEOUT))?;
        if !(200..300).contains(&status) {
            return Err(token_failure(status, content_type.as_deref(), &body));
        }
        let answer: TokenAnswer = serde_json::from_str(&body).map_err(|e| {
            Failure::http(
                status,
                None,
                format!("unreadable token answer from the token endpoint: {e}"),
            )
        })?;
        if answer.access_token.trim().is_empty() {
            return Err(Failure::http(
                status,
                None,
                "the token endpoint answered an empty token",
            ));
        }
        let lifetime = Duration::from_secs(answer.expires_in.unwrap_or(JWT_LIFETIME_SECS));
        Ok((Secret::new(answer.access_token), lifetime))
    }
}

#[async_trait]
impl TokenSource for Tokens {
    /// The current token while it is more than [`REFRESH_THRESHOLD`] from its expiry,
    /// else a new one (callers wait for one request in flight rather than send their own).
    async fn token(&self, _call: &TokenCall<'_>) -> Result<Secret, Failure> {
        self.cache
            .get(|| async {
                let (token, lifetime) = self.fetch().await?;
                Ok((token, lifetime.saturating_sub(REFRESH_THRESHOLD)))
            })
            .await
    }

    fn secrets(&self) -> Vec<Secret> {
        let mut out = self.credential.secrets();
        out.extend(self.cache.issued());
        out
    }
}
