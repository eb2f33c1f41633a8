//! Nebius credentials and IAM access tokens.
//!
//! Where a credential is looked for, first found wins (the vendor SDK's order: a ready
//! token first, then a service account; `nebius/aio/cli_config.py`, SDK 0.6.29):
//!
//! 1. `NEBIUS_IAM_TOKEN`: a ready IAM access token (what `nebius iam get-access-token`
//!    prints), sent as is and never renewed;
//! 2. `GPUPROV_NEBIUS_CREDENTIALS_FILE`: a service account's credentials file;
//! 3. the nebius CLI's profile (`~/.nebius/config.yaml`, profile `NEBIUS_PROFILE` or the
//!    file's `default`) with `auth-type: service account`: its
//!    `service-account-credentials-file-path`, or `service-account-id`, `public-key-id`
//!    and `private-key-file-path` (or an inline `private-key`);
//! 4. `~/.nebius/credentials.json` (where SkyPilot keeps the same file).
//!
//! The credentials file is the SDK's (`nebius/base/service_account/credentials_file.py`):
//! JSON `{"subject-credentials": {"type": "JWT", "alg": "RS256", "private-key": PEM,
//! "kid": public key id, "iss": service account id, "sub": the same}}`; like the SDK it
//! refuses `iss != sub` and any algorithm but RS256.
//!
//! A service account's token: an RS256 JWT with header `kid` = the public key id and
//! claims `iss` = `sub` = the service account id, `aud` = [`JWT_AUDIENCE`], `iat` = now,
//! `exp` = now + 60 s (the SDK's `ServiceAccount.get_exchange_token_request`), exchanged
//! through `nebius.iam.v1.TokenExchangeService/Exchange` (RFC 8693 fields:
//! [`GRANT_TYPE`], [`REQUESTED_TOKEN_TYPE`], [`SUBJECT_TOKEN_TYPE`]) for an access token,
//! cached and renewed once 90 % of its `expires_in` has passed (the SDK's
//! `lifetime_safe_fraction`). The private key, the JWT and every token are [`Secret`]s,
//! scrubbed from every error.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::provider::kit::credentials::Source;
use crate::provider::kit::failure::codes;
use crate::provider::kit::oauth::RENEW_AT;
use crate::provider::kit::token_cache::TokenCache;
use crate::provider::kit::Failure;
use crate::provider::redact::Secret;
use super::proto::nebius::iam::v1::{CreateTokenResponse, ExchangeTokenRequest};

/// A ready IAM access token (the vendor SDK's variable).
pub const TOKEN_ENV: &str = "NEBIUS_IAM_TOKEN";
/// A service account's credentials file (gpuprov's variable, for CI).
pub const CREDENTIALS_FILE_ENV: &str = "GPUPROV_NEBIUS_CREDENTIALS_FILE";
/// The nebius CLI's profile name override.
pub const PROFILE_ENV: &str = "NEBIUS_PROFILE";
/// The JWT's audience (the vendor SDK's `ServiceAccount`).
pub const JWT_AUDIENCE: &str = "token-service.iam.new.nebiuscloud.net";
/// The JWT's lifetime, seconds (the vendor SDK's).
pub const JWT_LIFETIME_SECS: u64 = 60;
/// RFC 8693 token exchange.
pub const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
pub const REQUESTED_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";
pub const SUBJECT_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:jwt";
/// Lifetime assumed for a token answered without `expires_in`, seconds.
const DEFAULT_LIFETIME_SECS: i64 = 300;

/// A service account key: its id, the public key's id and the private key (PEM).
#[derive(Clone, PartialEq, Eq)]
pub struct ServiceAccount {
    pub id: String,
    pub public_key_id: String,
    pub private_key: Secret,
}

impl std::fmt::Debug for ServiceAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccount")
            .field("id", &self.id)
            .field("public_key_id", &self.public_key_id)
            .field("private_key", &self.private_key)
            .finish()
    }
}

/// What authenticates the calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// A ready IAM token.
    IamToken(Secret),
    /// A service account whose JWT is exchanged for tokens.
    ServiceAccount(ServiceAccount),
}

/// The lookup's outcome (module docs): the credential and its place, every place looked
/// at, and why a credential found cannot be used (a malformed file).
#[derive(Debug, Default)]
pub struct Found {
    pub credential: Option<(Credential, Source)>,
    pub looked_in: Vec<String>,
    pub unusable: Option<String>,
}

#[derive(Deserialize)]
struct CredentialsFile {
    #[serde(rename = "subject-credentials")]
    subject: Subject,
}

#[derive(Deserialize)]
struct Subject {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    alg: String,
    #[serde(rename = "private-key")]
    private_key: String,
    kid: String,
    iss: String,
    sub: String,
}

/// The service account of a credentials file's `text` (module docs). Errors say what is
/// wrong, never a key.
pub fn parse_credentials_file(text: &str) -> Result<ServiceAccount, String> {
    let f: CredentialsFile = serde_json::from_str(text).map_err(|e| {
        format!(
            "not a Nebius credentials file (expected {{\"subject-credentials\": {{\"alg\", \
             \"private-key\", \"kid\", \"iss\", \"sub\"}}}}): line {} column {}",
            e.line(),
            e.column()
        )
    })?;
    let s = f.subject;
    // The values are not shown: a mis-pasted file may hold key text anywhere.
    if s.kind.as_deref().is_some_and(|k| k != "JWT") {
        return Err("subject-credentials type is not JWT".into());
    }
    if s.alg != "RS256" {
        return Err("its alg is not RS256 (the only algorithm Nebius service accounts use)".into());
    }
    if s.iss != s.sub {
        return Err("iss and sub differ (both must be the service account id)".into());
    }
    if s.kid.trim().is_empty() || s.iss.trim().is_empty() {
        return Err("kid and iss must not be empty".into());
    }
    usable_key(&s.private_key)?;
    Ok(ServiceAccount {
        id: s.iss,
        public_key_id: s.kid,
        private_key: Secret::new(s.private_key),
    })
}

/// Checks that `pem` is an RSA private key in PEM, the only kind that signs RS256.
fn usable_key(pem: &str) -> Result<(), String> {
    jsonwebtoken::EncodingKey::from_rsa_pem(pem.as_bytes())
        .map(|_| ())
        .map_err(|_| {
            "its private key is not an RSA private key in PEM (Nebius service-account keys \
             are RSA: `nebius iam auth-public-key generate`)"
                .into()
        })
}

/// The credential the environment and files name (module docs). `env` reads a variable
/// (blank is unset); `home` is the user's home directory. Reads files only.
pub fn find(env: impl Fn(&str) -> Option<String>, home: Option<&Path>) -> Found {
    let mut found = Found::default();
    found.looked_in.push(Source::Env(TOKEN_ENV).to_string());
    if let Some(t) = env(TOKEN_ENV) {
        found.credential = Some((Credential::IamToken(Secret::new(t)), Source::Env(TOKEN_ENV)));
        return found;
    }
    found
        .looked_in
        .push(Source::Env(CREDENTIALS_FILE_ENV).to_string());
    if let Some(path) = env(CREDENTIALS_FILE_ENV) {
        let path = PathBuf::from(path);
        match read_file(&path) {
            Ok(sa) => found.credential = Some((Credential::ServiceAccount(sa), Source::File(path))),
            Err(why) => found.unusable = Some(format!("{CREDENTIALS_FILE_ENV}: {why}")),
        }
        return found;
    }
    let Some(home) = home else { return found };
    let config = home.join(".nebius").join("config.yaml");
    found.looked_in.push(config.display().to_string());
    if let Ok(text) = std::fs::read_to_string(&config) {
        match from_profile(&text, env(PROFILE_ENV).as_deref(), &config) {
            Ok(Ok(sa)) => {
                found.credential = Some((Credential::ServiceAccount(sa), Source::File(config)));
                return found;
            }
            // Say why the CLI's profile was passed over (a user login, a missing profile).
            Ok(Err(skipped)) => {
                if let Some(last) = found.looked_in.last_mut() {
                    *last = format!("{last} ({skipped})");
                }
            }
            Err(why) => {
                found.unusable = Some(format!("{}: {why}", config.display()));
                return found;
            }
        }
    }
    let skypilot = home.join(".nebius").join("credentials.json");
    found.looked_in.push(skypilot.display().to_string());
    if skypilot.is_file() {
        match read_file(&skypilot) {
            Ok(sa) => {
                found.credential = Some((Credential::ServiceAccount(sa), Source::File(skypilot)))
            }
            Err(why) => found.unusable = Some(format!("{}: {why}", skypilot.display())),
        }
    }
    found
}

fn read_file(path: &Path) -> Result<ServiceAccount, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read: {e}"))?;
    parse_credentials_file(&text)
}

/// The service account of the CLI profile `profile` (else the file's `default`, else its
/// only profile) in the CLI config `text`; `Ok(Err(why))` when there is no such profile or
/// it is not a service account one (a federation login gpuprov cannot use); `Err` for a
/// service-account profile that cannot be used.
fn from_profile(
    text: &str,
    profile: Option<&str>,
    config: &Path,
) -> Result<Result<ServiceAccount, String>, String> {
    let v: serde_yaml::Value = serde_yaml::from_str(text).map_err(|e| format!("not YAML: {e}"))?;
    let profiles = &v["profiles"];
    let name = profile
        .map(str::to_string)
        .or_else(|| v["default"].as_str().map(str::to_string))
        .or_else(|| match profiles.as_mapping() {
            Some(m) if m.len() == 1 => m.keys().next()?.as_str().map(str::to_string),
            _ => None,
        });
    let Some(name) = name else {
        return Ok(Err("it names no default profile".into()));
    };
    let p = &profiles[name.as_str()];
    if p.is_null() {
        return Ok(Err(format!("it has no profile {name}")));
    }
    if p["auth-type"].as_str() != Some("service account") {
        return Ok(Err(format!(
            "profile {name} is not a service-account profile (auth-type {}); gpuprov needs a \
             service account",
            p["auth-type"].as_str().unwrap_or("unset")
        )));
    }
    let field = |k: &str| p[k].as_str().map(str::trim).filter(|s| !s.is_empty());
    let relative = |f: &str| {
        let path = PathBuf::from(shellexpand_home(f));
        if path.is_absolute() {
            path
        } else {
            config.parent().unwrap_or(Path::new(".")).join(path)
        }
    };
    if let Some(file) = field("service-account-credentials-file-path") {
        return read_file(&relative(file))
            .map(Ok)
            .map_err(|why| format!("profile {name}: {file}: {why}"));
    }
    let (Some(id), Some(key_id)) = (field("service-account-id"), field("public-key-id")) else {
        return Err(format!(
            "profile {name}: a service account profile needs service-account-id and \
             public-key-id, or service-account-credentials-file-path"
        ));
    };
    let key = match (field("private-key-file-path"), field("private-key")) {
        (Some(file), _) => std::fs::read_to_string(relative(file))
            .map_err(|e| format!("profile {name}: {file}: cannot read: {e}"))?,
        (None, Some(inline)) => inline.to_string(),
        (None, None) => {
            return Err(format!(
                "profile {name}: no private-key-file-path or private-key"
            ))
        }
    };
    usable_key(&key).map_err(|why| format!("profile {name}: {why}"))?;
    Ok(Ok(ServiceAccount {
        id: id.to_string(),
        public_key_id: key_id.to_string(),
        private_key: Secret::new(key),
    }))
}

/// `~/x` with the home directory expanded.
fn shellexpand_home(path: &str) -> String {
    match (path.strip_prefix("~/"), dirs::home_dir()) {
        (Some(rest), Some(home)) => home.join(rest).display().to_string(),
        _ => path.to_string(),
    }
}

/// The JWT's claims (module docs; seconds since the epoch).
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Claims {
    pub iss: String,
    pub sub: String,
    pub aud: String,
    pub iat: u64,
    pub exp: u64,
}

/// The signed JWT of `sa` at `now` (seconds since the epoch). Errors: the key cannot sign
/// (not an RSA private key in PEM); never the key itself.
pub fn jwt(sa: &ServiceAccount, now: u64) -> Result<Secret, String> {
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = Some(sa.public_key_id.clone());
    let claims = Claims {
        iss: sa.id.clone(),
        sub: sa.id.clone(),
        aud: JWT_AUDIENCE.into(),
        iat: now,
        exp: now + JWT_LIFETIME_SECS,
    };
    let signer = jsonwebtoken::EncodingKey::from_rsa_pem(sa.private_key.expose().as_bytes())
        .map_err(|e| format!("the private key of {} cannot sign: {e}", sa.id))?;
    jsonwebtoken::encode(&header, &claims, &signer)
        .map(Secret::new)
        .map_err(|e| format!("signing the token request of {} failed: {e}", sa.id))
}

/// The token exchange request for `jwt`.
pub fn exchange_request(jwt: &Secret) -> ExchangeTokenRequest {
    ExchangeTokenRequest {
        grant_type: GRANT_TYPE.into(),
        requested_token_type: REQUESTED_TOKEN_TYPE.into(),
        subject_token: jwt.expose().to_string(),
        subject_token_type: SUBJECT_TOKEN_TYPE.into(),
        ..Default::default()
    }
}

/// The access token of one credential: a ready one, or a service account's, exchanged,
/// cached and renewed (module docs). Its `Debug` shows no secret.
#[derive(Debug)]
pub struct Tokens {
    credential: Credential,
    cache: TokenCache,
}

impl Tokens {
    pub fn new(credential: Credential) -> Tokens {
        Tokens {
            credential,
            cache: TokenCache::default(),
        }
    }

    /// A token for the next call: the ready one, or the cached one until 90 % of its
    /// lifetime, else a new one from `exchange` (the gRPC token exchange). Errors: the
    /// key cannot sign, or the exchange's failure (a refusal is
    /// [`codes::TOKEN_REFUSED`], so `Credentials`).
    pub async fn token<F, Fut>(&self, exchange: F) -> Result<Secret, Failure>
    where
        F: FnOnce(ExchangeTokenRequest) -> Fut,
        Fut: std::future::Future<Output = Result<CreateTokenResponse, Failure>>,
    {
        let sa = match &self.credential {
            Credential::IamToken(t) => return Ok(t.clone()),
            Credential::ServiceAccount(sa) => sa,
        };
        self.cache
            .get(|| async {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or_default();
                let jwt = jwt(sa, now).map_err(|why| {
                    let mut f = Failure::no_credential(why);
                    f.code = Some(codes::TOKEN_REFUSED.into());
                    f
                })?;
                self.cache.remember(&jwt);
                let answer = exchange(exchange_request(&jwt))
                    .await
                    .map_err(|f| refused(f, sa))?;
                let lifetime = if answer.expires_in > 0 {
                    answer.expires_in
                } else {
                    DEFAULT_LIFETIME_SECS
                };
                let renew_in = Duration::from_secs_f64(lifetime as f64 * RENEW_AT);
                Ok((Secret::new(answer.access_token), renew_in))
            })
            .await
    }

    /// A call with `token` succeeded.
    pub fn worked(&self, token: &Secret) {
        self.cache.worked(token);
    }

    /// The API refused `token` (UNAUTHENTICATED). Drops it; returns whether a new one may
    /// succeed: it had worked (it expired or was revoked early), so the call is retried.
    /// A ready token from the environment cannot be renewed.
    pub fn rejected(&self, token: &Secret) -> bool {
        self.cache.rejected(token)
    }

    /// The secrets to scrub: the private key, every JWT and token issued.
    pub fn secrets(&self) -> Vec<Secret> {
        let mut out = match &self.credential {
            Credential::IamToken(t) => vec![t.clone()],
            Credential::ServiceAccount(sa) => vec![sa.private_key.clone()],
        };
        out.extend(self.cache.issued());
        out
    }
}

/// A token exchange's refusal of the service account `sa` (UNAUTHENTICATED,
/// PERMISSION_DENIED, INVALID_ARGUMENT) as [`codes::TOKEN_REFUSED`], so `Credentials`.
fn refused(mut f: Failure, sa: &ServiceAccount) -> Failure {
    use crate::provider::kit::failure::grpc;
    if matches!(
        f.status,
        crate::provider::kit::Status::Grpc(
            grpc::UNAUTHENTICATED | grpc::PERMISSION_DENIED | grpc::INVALID_ARGUMENT
        )
    ) {
        f.code = Some(codes::TOKEN_REFUSED.into());
        f.message = format!(
            "the token exchange refused service account {}: {}",
            sa.id, f.message
        );
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A credentials file with the tests' RSA key (a test-only key).
    fn file() -> String {
        let key = include_str!("../../../../tests/fixtures/gcp/test-only-sa-key.pem");
        serde_json::json!({"subject-credentials": {"type": "JWT", "alg": "RS256",
            "private-key": key, "kid": "publickey-e00abc",
            "iss": "serviceaccount-e00xyz", "sub": "serviceaccount-e00xyz"}})
        .to_string()
    }

    #[test]
    fn the_credentials_file_is_the_sdks() {
        let sa = parse_credentials_file(&file()).unwrap();
        assert_eq!(sa.id, "serviceaccount-e00xyz");
        assert_eq!(sa.public_key_id, "publickey-e00abc");
        assert!(
            !format!("{sa:?}").contains("PRIVATE"),
            "the key is not shown"
        );
        let ed = file().replace(
            "-----BEGIN PRIVATE KEY-----",
            "-----BEGIN OPENSSH PRIVATE KEY-----",
        );
        let e = parse_credentials_file(&ed).unwrap_err();
        assert!(e.contains("not an RSA private key in PEM"), "{e}");
        let other = file().replace("\"sub\":\"serviceaccount-e00xyz\"", "\"sub\":\"x\"");
        assert!(parse_credentials_file(&other)
            .unwrap_err()
            .contains("differ"));
        let es = file().replace("RS256", "ES256");
        assert!(parse_credentials_file(&es).unwrap_err().contains("RS256"));
        let junk = parse_credentials_file("{\"private-key\": \"AAAA\"").unwrap_err();
        assert!(!junk.contains("AAAA"), "{junk}");
        // A mis-pasted file: key text where the algorithm goes is not echoed.
        let pasted = file().replace("\"RS256\"", "\"-----BEGIN PRIVATE KEY-----MIIEvg\"");
        let e = parse_credentials_file(&pasted).unwrap_err();
        assert!(!e.contains("MIIEvg") && !e.contains("PRIVATE"), "{e}");
    }

    #[test]
    fn the_lookup_order_is_token_file_profile_skypilot() {
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join(".nebius");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("credentials.json"), file()).unwrap();
        let none = |_: &str| None;
        let f = find(none, Some(home.path()));
        assert!(
            matches!(f.credential, Some((Credential::ServiceAccount(_), Source::File(ref p))) if p.ends_with("credentials.json"))
        );
        assert_eq!(f.looked_in.len(), 4, "{:?}", f.looked_in);

        std::fs::write(dir.join("sa.json"), file()).unwrap();
        std::fs::write(
            dir.join("config.yaml"),
            "default: ci\nprofiles:\n  ci:\n    auth-type: service account\n    service-account-credentials-file-path: sa.json\n  me:\n    auth-type: federation\n",
        )
        .unwrap();
        let f = find(none, Some(home.path()));
        assert!(
            matches!(f.credential, Some((_, Source::File(ref p))) if p.ends_with("config.yaml"))
        );
        let f = find(
            |k| (k == PROFILE_ENV).then(|| "me".into()),
            Some(home.path()),
        );
        assert!(
            matches!(f.credential, Some((_, Source::File(ref p))) if p.ends_with("credentials.json")),
            "a federation profile is skipped"
        );
        assert!(
            f.looked_in
                .iter()
                .any(|l| l.contains("profile me is not a service-account profile")),
            "{:?}",
            f.looked_in
        );
        let f = find(
            |k| (k == TOKEN_ENV).then(|| "tok".into()),
            Some(home.path()),
        );
        assert!(matches!(
            f.credential,
            Some((Credential::IamToken(_), Source::Env(TOKEN_ENV)))
        ));
        let bad = home.path().join("bad.json");
        std::fs::write(&bad, "{}").unwrap();
        let f = find(
            |k| (k == CREDENTIALS_FILE_ENV).then(|| bad.display().to_string()),
            Some(home.path()),
        );
        assert!(f.credential.is_none());
        assert!(f
            .unusable
            .unwrap()
            .contains("not a Nebius credentials file"));
    }
}
