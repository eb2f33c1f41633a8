//! The AWS SDK's configuration as gpuprov uses it: the loader, the credential chain's
//! report, and the shared files it reads.

use super::*;

/// The AWS SDK's config loader as gpuprov uses it (EC2 here, S3 for the state backend):
/// the default credential chain, the ring-backed rustls HTTPS client (no aws-lc-rs C
/// build), and timeouts that turn an unreachable endpoint into an error within seconds
/// (connect 5 s, read 60 s, one attempt 90 s).
pub fn sdk_loader() -> aws_config::ConfigLoader {
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
            aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https();
    aws_config::defaults(BehaviorVersion::latest())
        .http_client(http)
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(5))
                .read_timeout(Duration::from_secs(60))
                .operation_attempt_timeout(Duration::from_secs(90))
                .build(),
        )
}

/// What the standard chain looks at, for the missing-credentials message.
pub const CREDENTIAL_SOURCES: &str = "looked for AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, \
    the profile (AWS_PROFILE or `default`) in ~/.aws/credentials and ~/.aws/config (static \
    keys, SSO, credential_process, assume-role), a web identity token, ECS container \
    credentials and EC2 instance metadata";

/// Asks `provider` for credentials within `timeout`. Errors: `Credentials`, naming what
/// the chain looks at and the provider's own reason (which never holds a secret).
pub async fn resolve_credentials(
    provider: Option<SharedCredentialsProvider>,
    timeout: Duration,
) -> Result<()> {
    let Some(p) = provider else {
        return Err(ProviderError::new(
            ErrorKind::Credentials,
            format!("no AWS credential provider is configured; {CREDENTIAL_SOURCES}"),
        ));
    };
    match tokio::time::timeout(timeout, p.provide_credentials()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(ProviderError::new(
            ErrorKind::Credentials,
            format!(
                "no usable AWS credentials: {}; {CREDENTIAL_SOURCES}",
                errors::display_chain(&e)
            ),
        )),
        Err(_) => Err(ProviderError::new(
            ErrorKind::Credentials,
            format!(
                "no AWS credentials within {}s; {CREDENTIAL_SOURCES}",
                timeout.as_secs()
            ),
        )),
    }
}

/// The shared config and credentials files the SDK reads: `AWS_CONFIG_FILE` /
/// `AWS_SHARED_CREDENTIALS_FILE`, else `~/.aws/config` / `~/.aws/credentials`.
pub fn shared_files() -> (std::path::PathBuf, std::path::PathBuf) {
    let home = dirs::home_dir().unwrap_or_default();
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(std::path::PathBuf::from)
    };
    (
        env("AWS_CONFIG_FILE").unwrap_or_else(|| home.join(".aws").join("config")),
        env("AWS_SHARED_CREDENTIALS_FILE").unwrap_or_else(|| home.join(".aws").join("credentials")),
    )
}

/// Whether the shared files define `profile`: a `[profile NAME]` (or `[NAME]`) section in
/// `config`, or a `[NAME]` section in `credentials`. A file that does not exist defines
/// nothing. `None` when one does; else the `Credentials` error naming the profile and
/// both files.
pub fn missing_profile(
    profile: &str,
    config: &std::path::Path,
    credentials: &std::path::Path,
) -> Option<ProviderError> {
    let sections = |path: &std::path::Path| -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                let inner = l.strip_prefix('[')?.strip_suffix(']')?;
                Some(inner.split_whitespace().collect::<Vec<_>>().join(" "))
            })
            .collect()
    };
    let in_config = sections(config)
        .iter()
        .any(|s| *s == format!("profile {profile}") || s == profile);
    let in_credentials = sections(credentials).iter().any(|s| s == profile);
    if in_config || in_credentials {
        return None;
    }
    Some(ProviderError::new(
        ErrorKind::Credentials,
        format!(
            "AWS profile `{profile}` (AWS_PROFILE) is not defined: looked for `[profile \
             {profile}]` in {} and `[{profile}]` in {}; add it (`aws configure --profile \
             {profile}`) or unset AWS_PROFILE",
            config.display(),
            credentials.display()
        ),
    ))
}

impl AwsProvider {
    pub(super) async fn sdk(&self) -> &SdkConfig {
        self.sdk
            .get_or_init(|| async {
                // Each client sets its own region; this only keeps the loader from asking
                // instance metadata for one.
                let mut loader = sdk_loader().region(Region::new("us-east-1"));
                if let (None, Some(p)) = (&self.settings.credentials, &self.settings.profile) {
                    loader = loader.profile_name(p);
                }
                if let Some(c) = &self.settings.credentials {
                    loader = loader.credentials_provider(Credentials::new(
                        c.access_key_id.clone(),
                        c.secret_access_key.clone(),
                        None,
                        None,
                        "gpuprov-static",
                    ));
                }
                loader.load().await
            })
            .await
    }

    /// Resolves credentials once per process, with a deadline, so a missing credential is
    /// a clear `Credentials` error naming what was looked for instead of a hang or an
    /// opaque signing failure.
    pub(super) async fn check_credentials(&self, sdk: &SdkConfig) -> Result<()> {
        self.credentials_ok
            .get_or_try_init(|| async {
                if let (None, Some(p)) = (&self.settings.credentials, &self.settings.profile) {
                    let (config, credentials) = shared_files();
                    if let Some(e) = missing_profile(p, &config, &credentials) {
                        return Err(e);
                    }
                }
                resolve_credentials(
                    sdk.credentials_provider(),
                    self.settings.credentials_timeout,
                )
                .await
            })
            .await
            .map(|_| ())
    }

    /// The EC2 client of `region` (SDK retries for reads stay on; `create` turns them
    /// off per call).
    pub(super) async fn client(&self, region: &str) -> Result<Client> {
        if let Some(c) = self.clients.lock().expect("mutex").get(region) {
            return Ok(c.clone());
        }
        let sdk = self.sdk().await;
        self.check_credentials(sdk).await?;
        let mut b = aws_sdk_ec2::config::Builder::from(sdk).region(Region::new(region.to_string()));
        if let Some(ep) = &self.settings.endpoint {
            b = b.endpoint_url(ep.clone());
        }
        let client = Client::from_conf(b.build());
        self.clients
            .lock()
            .expect("mutex")
            .insert(region.to_string(), client.clone());
        Ok(client)
    }
}
