//! The AWS EC2 adapter (issue 3), on `aws-sdk-ec2` with `aws-config` for credentials.
//!
//! Mapping onto the contract (design 5):
//! - `plan`: the static GPU → instance-type ladder × regions × zones ([`catalog`]); no
//!   network. EC2 capacity is per (type, zone), so there is one offer per zone, and every
//!   zone of a region comes before the next, pricier type.
//! - `prepare`: `DescribeInstanceTypes` + `DescribeInstanceTypeOfferings` (the zones that
//!   offer the type; none → `Unavailable` for the type in the region; not the offer's
//!   zone → `Unavailable` for that offer), the image (`image` from config, else the newest
//!   AWS Deep Learning Ubuntu AMI, else the newest Canonical Ubuntu 22.04), the default
//!   VPC's subnet in the offer's zone, and a per-VM security group
//!   `gpuprov-<vm>-<lineage8>` (22 plus `ports`) tagged with the identity. Idempotent:
//!   everything is looked up before it is created, so the one group per (machine,
//!   region) is found and reused when the core fails over from zone to zone.
//! - `create`: one `RunInstances` (the SDK's retries off: the core decides) with
//!   `ClientToken` from the spec, in the first subnet (see [`CloudProvider::create`] below
//!   for why one), identity tags on the instance and its volumes, cloud-init user-data
//!   with the project key, spot through instance market options.
//! - `instances` (the listing `observe`, `observe_location` and `list` derive from):
//!   `DescribeInstances` of the instances carrying the identity tag (for one VM: its
//!   identity and lineage tags), region-wide (a location's zone is ignored: the identity
//!   is per region), each showing its tags and `Name` ([`seen_of`]).
//! - `delete` / `cleanup`: `TerminateInstances` (unknown id = success) / the security
//!   group (`DependencyViolation` while the instance terminates = `InUse`).
//! - `start`: `StartInstances` for a stopped instance ([`Feature::Start`]).
//!
//! Credentials come from the standard AWS chain (environment, profiles incl. SSO and
//! `credential_process`, web identity, ECS, instance metadata), resolved once with a
//! deadline so a machine without credentials gets a clear error instead of a hang. The
//! endpoint can be overridden by `AWS_ENDPOINT_URL_EC2` / `AWS_ENDPOINT_URL` (the SDK's
//! own variables) or `[cloud.aws] endpoint`.

pub mod catalog;
pub mod errors;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_ec2::config::retry::RetryConfig;
use aws_sdk_ec2::config::{Credentials, ProvideCredentials, SharedCredentialsProvider};
use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::{
    BlockDeviceMapping, EbsBlockDevice, Filter, InstanceInterruptionBehavior,
    InstanceLifecycleType, InstanceMarketOptionsRequest, InstanceStateName, InstanceType,
    IpPermission, IpRange, LocationType, MarketType, ResourceType, SpotInstanceType,
    SpotMarketOptions, StateReason, Tag, TagSpecification, VolumeType,
};
use aws_sdk_ec2::Client;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;

use crate::provider::kit::{Adapter, CredentialReport};
use crate::provider::{
    Capabilities, CloudProvider, ErrorKind, Feature, InstanceSpec, InstanceStatus, Lineage,
    Location, Naming, Offer, ProviderError, ResourceRequest, Result, Seen, Shown, SshEndpoint,
    IDENTITY_LABEL, LINEAGE_LABEL,
};
pub use errors::{classify_code, Scope};

/// The cloud name.
pub const CLOUD: &str = "aws";
/// The login user of the default images (AWS Deep Learning Ubuntu AMIs and Canonical's
/// Ubuntu AMIs both use `ubuntu`; cloud-init puts the project key in its
/// `authorized_keys`). A custom `image` must use the same user.
pub const SSH_USER: &str = "ubuntu";
/// EC2's limit on `ClientToken` length.
pub const CLIENT_TOKEN_MAX: usize = 64;
/// Owner alias of the AWS Deep Learning AMIs, and their name pattern.
pub const DLAMI_OWNER: &str = "amazon";
pub const DLAMI_NAME: &str = "Deep Learning*Ubuntu*";
/// Canonical's account and the Ubuntu 22.04 name pattern, the fallback image.
pub const UBUNTU_OWNER: &str = "099720109477";
pub const UBUNTU_NAME: &str = "ubuntu/images/*ubuntu-jammy-22.04-amd64-server-*";
/// What `instances` lists: the live states, and terminated instances (EC2 lists them for
/// about an hour), of which only the preempted spot ones are kept ([`preemption_of`]).
const OBSERVED_STATES: &[&str] = &[
    "pending",
    "running",
    "stopping",
    "stopped",
    "shutting-down",
    "terminated",
];
/// Environment variables tuning the waits (see [`AwsSettings::from_env_and_config`]).
pub const BOOT_TIMEOUT_ENV: &str = "GPUPROV_AWS_BOOT_TIMEOUT";
pub const SSH_TIMEOUT_ENV: &str = "GPUPROV_AWS_SSH_TIMEOUT";
pub const POLL_INTERVAL_ENV: &str = "GPUPROV_AWS_POLL_INTERVAL";
/// Default deadline for resolving credentials (the chain may ask instance metadata).
const CREDENTIALS_TIMEOUT: Duration = Duration::from_secs(10);

/// Static credentials given explicitly (tests, or a caller with its own secret store).
/// `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct StaticCredentials {
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl fmt::Debug for StaticCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticCredentials")
            .field("access_key_id", &"REDACTED")
            .field("secret_access_key", &"REDACTED")
            .finish()
    }
}

/// Configuration of the AWS adapter.
#[derive(Debug, Clone)]
pub struct AwsSettings {
    /// EC2 endpoint override; `None` = the regional AWS endpoint.
    pub endpoint: Option<String>,
    /// The state's lineage: the identity rule reads listings against it; `cleanup` sees
    /// only objects tagged with it.
    pub lineage: Lineage,
    /// Explicit credentials instead of the standard chain.
    pub credentials: Option<StaticCredentials>,
    /// What the core must respect; [`AwsSettings::default_capabilities`] unless a test
    /// shortens the timeouts.
    pub capabilities: Capabilities,
    /// Deadline for resolving credentials through the chain.
    pub credentials_timeout: Duration,
    /// The shared-config profile to use (`AWS_PROFILE`); `None` = the SDK's default.
    /// A named profile that neither shared file defines is a `Credentials` error naming
    /// it and the files looked at, before anything is sent.
    pub profile: Option<String>,
}

impl AwsSettings {
    /// The default settings (the standard credential chain, the regional endpoint) for
    /// `lineage`.
    pub fn new(lineage: Lineage) -> Self {
        AwsSettings {
            endpoint: None,
            lineage,
            credentials: None,
            capabilities: AwsSettings::default_capabilities(),
            credentials_timeout: CREDENTIALS_TIMEOUT,
            profile: None,
        }
    }
}

impl AwsSettings {
    /// Settings from `[cloud.aws] endpoint` plus the environment. Endpoint precedence:
    /// `AWS_ENDPOINT_URL_EC2` > `AWS_ENDPOINT_URL` > config (non-empty values only), so
    /// the SDK's own variables behave as they do for the AWS CLI.
    ///
    /// The waits can be tuned for slow images (and short test runs) with
    /// `GPUPROV_AWS_BOOT_TIMEOUT`, `GPUPROV_AWS_SSH_TIMEOUT` and `GPUPROV_AWS_POLL_INTERVAL`
    /// (humantime durations such as `20m` or `500ms`); an unparsable value is ignored with a
    /// warning.
    pub fn from_env_and_config(endpoint: Option<String>, lineage: Lineage) -> Self {
        let env = |k: &str| std::env::var(k).ok().filter(|s| !s.trim().is_empty());
        let mut s = AwsSettings {
            endpoint: env("AWS_ENDPOINT_URL_EC2")
                .or_else(|| env("AWS_ENDPOINT_URL"))
                .or(endpoint.filter(|s| !s.trim().is_empty())),
            profile: env("AWS_PROFILE").map(|p| p.trim().to_string()),
            ..AwsSettings::new(lineage)
        };
        let duration = |k: &str| {
            let v = env(k)?;
            match humantime::parse_duration(v.trim()) {
                Ok(d) => Some(d),
                Err(e) => {
                    tracing::warn!("ignoring {k}={v:?}: {e}");
                    None
                }
            }
        };
        let caps = &mut s.capabilities;
        if let Some(d) = duration(BOOT_TIMEOUT_ENV) {
            caps.boot_timeout = d;
        }
        if let Some(d) = duration(SSH_TIMEOUT_ENV) {
            caps.ssh_timeout = d;
        }
        if let Some(d) = duration(POLL_INTERVAL_ENV) {
            caps.poll_interval = d;
        }
        s
    }

    /// GPU instances take minutes to boot and longer to terminate; EC2 throttles
    /// mutating calls per account (token buckets not in the sources this project holds,
    /// so no `rate_limits` are declared), so concurrency stays modest. k3s installs at boot
    /// through cloud-init, and 6443 is opened in the VM's security group.
    pub fn default_capabilities() -> Capabilities {
        Capabilities {
            supported: vec![
                Feature::BootScript,
                Feature::Firewall,
                Feature::Spot,
                Feature::Gpu,
                Feature::Kubernetes,
                Feature::Start,
                Feature::Zones,
            ],
            boot_timeout: Duration::from_secs(900),
            ssh_timeout: Duration::from_secs(600),
            delete_timeout: Duration::from_secs(900),
            poll_interval: Duration::from_secs(10),
            max_concurrency: 8,
            min_create_interval: Duration::ZERO,
            rate_limits: Vec::new(),
            create_list_lag: Duration::from_secs(20),
            default_regions: catalog::DEFAULT_REGIONS
                .iter()
                .map(|r| r.to_string())
                .collect(),
            keeps_offer_order: false,
        }
    }
}

/// What `prepare` hands to `create` (persisted in the journal).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prepared {
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_device: Option<String>,
    /// The default-VPC subnet of the offer's zone (of every zone offering the type, in
    /// zone order, for an offer without a zone, as journalled by older versions); create
    /// uses the first.
    pub subnets: Vec<PreparedSubnet>,
    pub security_group: String,
    pub vpc: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreparedSubnet {
    pub id: String,
    pub zone: String,
}

/// The AWS adapter (cloud name `"aws"`). Construction does no I/O; the SDK config (and
/// with it the credential chain) is loaded on the first API call, so `plan` needs
/// neither network nor credentials.
pub struct AwsProvider {
    settings: AwsSettings,
    adapter: Adapter,
    sdk: OnceCell<SdkConfig>,
    credentials_ok: OnceCell<()>,
    clients: Mutex<HashMap<String, Client>>,
}

fn filter(name: &str, values: &[&str]) -> Filter {
    let mut b = Filter::builder().name(name);
    for v in values {
        b = b.values(*v);
    }
    b.build()
}

fn tag(key: &str, value: &str) -> Tag {
    Tag::builder().key(key).value(value).build()
}

/// `ClientToken` for `token`: itself when it fits EC2's 64 ASCII characters, else a
/// stable digest (`gpuprov-` + 56 hex of SHA-256), so the same attempt always sends the
/// same token.
pub fn client_token(token: &str) -> String {
    if token.len() <= CLIENT_TOKEN_MAX && token.is_ascii() {
        return token.to_string();
    }
    let digest = Sha256::digest(token.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("gpuprov-{}", &hex[..CLIENT_TOKEN_MAX - "gpuprov-".len()])
}

/// The normalised status of an EC2 instance state.
pub fn status_of(state: Option<&InstanceStateName>, reason: Option<&str>) -> InstanceStatus {
    match state {
        Some(InstanceStateName::Pending) => InstanceStatus::Pending,
        Some(InstanceStateName::Running) => InstanceStatus::Running,
        Some(InstanceStateName::Stopping) => InstanceStatus::Stopping,
        Some(InstanceStateName::Stopped) => InstanceStatus::Stopped,
        Some(InstanceStateName::ShuttingDown | InstanceStateName::Terminated) => {
            InstanceStatus::Terminating
        }
        other => InstanceStatus::Failed(format!(
            "unknown EC2 state {:?}{}",
            other.map(|s| s.as_str()),
            reason.map(|r| format!(": {r}")).unwrap_or_default()
        )),
    }
}

/// EC2's own spot interruption signal: a spot instance (`InstanceLifecycle: spot`, or
/// no lifecycle given) whose last state change has the reason code
/// `Server.SpotInstanceTermination` (terminated, or shutting down) or
/// `Server.SpotInstanceShutdown` (stopped, or stopping; the `stop` interruption
/// behaviour) is [`InstanceStatus::Preempted`], stopped or not. `None` otherwise (the
/// state alone decides, [`status_of`]).
pub fn preemption_of(
    state: Option<&InstanceStateName>,
    lifecycle: Option<&InstanceLifecycleType>,
    reason: Option<&StateReason>,
) -> Option<InstanceStatus> {
    let code = reason.and_then(|r| r.code())?;
    if !matches!(
        code,
        "Server.SpotInstanceTermination" | "Server.SpotInstanceShutdown"
    ) || lifecycle.is_some_and(|l| *l != InstanceLifecycleType::Spot)
    {
        return None;
    }
    let stopped = match state? {
        InstanceStateName::Stopped | InstanceStateName::Stopping => true,
        InstanceStateName::Terminated | InstanceStateName::ShuttingDown => false,
        _ => return None,
    };
    let message = reason.and_then(|r| r.message()).unwrap_or_default();
    Some(InstanceStatus::Preempted {
        signal: if message.is_empty() {
            code.to_string()
        } else {
            format!("{code}: {message}")
        },
        stopped,
    })
}

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

/// A listed instance as the contract's listing shows it: its identity tags and `Name` tag,
/// status (a reclaimed spot instance is [`InstanceStatus::Preempted`], [`preemption_of`];
/// otherwise [`status_of`]), the SSH endpoint (public IPv4, 22, user [`SSH_USER`]) once it
/// runs with a public IP, its type, the catalog's list price for the type (an upper bound
/// for spot) and `LaunchTime`. `None` for an instance without id, or terminated and not
/// preempted (gone).
pub fn seen_of(i: &aws_sdk_ec2::types::Instance) -> Option<Seen> {
    let id = i.instance_id()?;
    let tag = |k: &str| {
        i.tags()
            .iter()
            .find(|t| t.key() == Some(k))
            .and_then(|t| t.value())
    };
    let state = i.state().and_then(|s| s.name());
    let preempted = preemption_of(state, i.instance_lifecycle(), i.state_reason());
    if state == Some(&InstanceStateName::Terminated) && preempted.is_none() {
        return None;
    }
    let status =
        preempted.unwrap_or_else(|| status_of(state, i.state_reason().and_then(|r| r.message())));
    let ssh = (status == InstanceStatus::Running)
        .then(|| i.public_ip_address())
        .flatten()
        .filter(|ip| !ip.is_empty())
        .map(|ip| SshEndpoint {
            host: ip.to_string(),
            port: 22,
            user: Some(SSH_USER.to_string()),
        });
    let instance_type = i.instance_type().map(|t| t.as_str().to_string());
    let identity =
        Shown::labels(tag(IDENTITY_LABEL), tag(LINEAGE_LABEL)).named(tag("Name"), Naming::Object);
    Some(Seen {
        ssh,
        price_per_hour: instance_type
            .as_deref()
            .and_then(catalog::lookup)
            .map(|g| g.price_per_hour),
        instance_type,
        created_at: i
            .launch_time()
            .and_then(|t| chrono::DateTime::from_timestamp(t.secs(), t.subsec_nanos())),
        ..Seen::new(id, status, identity)
    })
}

impl AwsProvider {
    /// An adapter for `settings`. Never fails and does no I/O.
    pub fn new(settings: AwsSettings) -> Self {
        let endpoint = settings.endpoint.as_deref();
        let adapter = Adapter::new(CLOUD, endpoint, settings.capabilities.clone())
            .with_lineage(&settings.lineage);
        AwsProvider {
            settings,
            adapter,
            sdk: OnceCell::new(),
            credentials_ok: OnceCell::new(),
            clients: Mutex::new(HashMap::new()),
        }
    }

    pub fn settings(&self) -> &AwsSettings {
        &self.settings
    }

    /// The per-VM security group name: `gpuprov-<vm>-<first 8 of lineage>`.
    pub fn security_group_name(vm_name: &str, lineage: &str) -> String {
        let short: String = lineage.chars().take(8).collect();
        format!("gpuprov-{vm_name}-{short}")
    }

    fn lineage(&self) -> &str {
        self.settings.lineage.as_str()
    }

    fn endpoint_for(&self, region: &str) -> String {
        self.settings
            .endpoint
            .as_deref()
            .map(crate::provider::redact::redact_url)
            .unwrap_or_else(|| format!("https://ec2.{region}.amazonaws.com"))
    }

    async fn sdk(&self) -> &SdkConfig {
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
    async fn check_credentials(&self, sdk: &SdkConfig) -> Result<()> {
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
    async fn client(&self, region: &str) -> Result<Client> {
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

    /// Classifies an SDK error, naming the endpoint when the cause is the connection.
    fn err<E>(
        &self,
        what: &str,
        region: &str,
        e: &aws_sdk_ec2::error::SdkError<E, aws_sdk_ec2::config::http::HttpResponse>,
        offer: Option<&Offer>,
    ) -> ProviderError
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        let mut pe = errors::classify(what, e, offer);
        if e.code().is_none() {
            pe.msg = format!("{} (EC2 endpoint {})", pe.msg, self.endpoint_for(region));
        }
        pe
    }

    fn unavailable_type(offer: &Offer, msg: String) -> ProviderError {
        ProviderError::new(ErrorKind::Unavailable, msg).with_block(
            crate::provider::BlockScope::InstanceTypeInRegion {
                cloud: CLOUD.into(),
                region: offer.location.region.clone(),
                instance_type: offer.instance_type.clone(),
            },
        )
    }

    async fn resolve_image(
        &self,
        client: &Client,
        offer: &Offer,
        spec: &InstanceSpec,
    ) -> Result<(String, Option<String>)> {
        let region = &offer.location.region;
        let newest = |imgs: &[aws_sdk_ec2::types::Image]| {
            imgs.iter()
                .filter(|i| i.image_id().is_some())
                .max_by(|a, b| a.creation_date().cmp(&b.creation_date()))
                .map(|i| {
                    (
                        i.image_id().unwrap_or_default().to_string(),
                        i.root_device_name().map(str::to_string),
                    )
                })
        };
        if let Some(image) = spec.image.as_deref().filter(|s| !s.trim().is_empty()) {
            let req = client.describe_images();
            let req = if image.starts_with("ami-") {
                req.image_ids(image)
            } else {
                req.filters(filter("name", &[image]))
                    .filters(filter("state", &["available"]))
            };
            let out = match req.send().await {
                Ok(o) => o,
                Err(e) if e.code().is_some_and(|c| c.starts_with("InvalidAMIID.")) => {
                    return Err(ProviderError::new(
                        ErrorKind::InvalidRequest,
                        format!("image {image} does not exist in {region}"),
                    ))
                }
                Err(e) => return Err(self.err("DescribeImages", region, &e, Some(offer))),
            };
            return newest(out.images()).ok_or_else(|| {
                ProviderError::new(
                    ErrorKind::InvalidRequest,
                    format!("image {image} matches no available image in {region}"),
                )
            });
        }
        for (owner, name) in [(DLAMI_OWNER, DLAMI_NAME), (UBUNTU_OWNER, UBUNTU_NAME)] {
            let out = client
                .describe_images()
                .owners(owner)
                .filters(filter("name", &[name]))
                .filters(filter("state", &["available"]))
                .filters(filter("architecture", &["x86_64"]))
                .send()
                .await
                .map_err(|e| self.err("DescribeImages", region, &e, Some(offer)))?;
            if let Some(found) = newest(out.images()) {
                return Ok(found);
            }
        }
        Err(ProviderError::new(
            ErrorKind::Unavailable,
            format!(
                "no Deep Learning Ubuntu or Ubuntu 22.04 image in {region}; set `image` to an AMI id"
            ),
        )
        .with_block(crate::provider::BlockScope::Region {
            cloud: CLOUD.into(),
            region: region.clone(),
        }))
    }

    async fn ensure_security_group(
        &self,
        client: &Client,
        offer: &Offer,
        spec: &InstanceSpec,
        vpc: &str,
    ) -> Result<String> {
        let region = &offer.location.region;
        let name = Self::security_group_name(&spec.vm_name, &spec.lineage);
        let find = || async {
            client
                .describe_security_groups()
                .filters(filter("group-name", &[&name]))
                .filters(filter("vpc-id", &[vpc]))
                .send()
                .await
                .map_err(|e| self.err("DescribeSecurityGroups", region, &e, Some(offer)))
                .map(|o| o.security_groups().first().cloned())
        };
        let group = match find().await? {
            Some(g) => {
                let has = |k: &str, v: &str| {
                    g.tags()
                        .iter()
                        .any(|t| t.key() == Some(k) && t.value() == Some(v))
                };
                if !has(IDENTITY_LABEL, &spec.vm_name) || !has(LINEAGE_LABEL, &spec.lineage) {
                    return Err(ProviderError::new(
                        ErrorKind::InvalidRequest,
                        format!(
                            "security group {name} in {vpc} exists but is not tagged \
                             {IDENTITY_LABEL}={} / {LINEAGE_LABEL}={}; delete it or rename the VM",
                            spec.vm_name, spec.lineage
                        ),
                    ));
                }
                g.group_id().unwrap_or_default().to_string()
            }
            None => {
                let tags = TagSpecification::builder()
                    .resource_type(ResourceType::SecurityGroup)
                    .tags(tag(IDENTITY_LABEL, &spec.vm_name))
                    .tags(tag(LINEAGE_LABEL, &spec.lineage))
                    .tags(tag("Name", &name))
                    .build();
                match client
                    .create_security_group()
                    .group_name(&name)
                    .description(format!("gpuprov VM {} (SSH and its ports)", spec.vm_name))
                    .vpc_id(vpc)
                    .tag_specifications(tags)
                    .send()
                    .await
                {
                    Ok(o) => o.group_id().unwrap_or_default().to_string(),
                    // Created concurrently (or by a crashed run): take it.
                    Err(e) if e.code() == Some("InvalidGroup.Duplicate") => find()
                        .await?
                        .and_then(|g| g.group_id().map(str::to_string))
                        .ok_or_else(|| {
                            ProviderError::transient(format!("security group {name} vanished"))
                        })?,
                    Err(e) => return Err(self.err("CreateSecurityGroup", region, &e, Some(offer))),
                }
            }
        };
        let mut ports: Vec<u16> = vec![22];
        ports.extend(spec.ports.iter().copied());
        ports.sort_unstable();
        ports.dedup();
        let mut req = client.authorize_security_group_ingress().group_id(&group);
        for p in ports {
            req = req.ip_permissions(
                IpPermission::builder()
                    .ip_protocol("tcp")
                    .from_port(i32::from(p))
                    .to_port(i32::from(p))
                    .ip_ranges(IpRange::builder().cidr_ip("0.0.0.0/0").build())
                    .build(),
            );
        }
        match req.send().await {
            Ok(_) => {}
            // Rules already there (a repeated prepare).
            Err(e) if e.code() == Some("InvalidPermission.Duplicate") => {}
            Err(e) => {
                return Err(self.err("AuthorizeSecurityGroupIngress", region, &e, Some(offer)))
            }
        }
        Ok(group)
    }
}

#[async_trait]
impl CloudProvider for AwsProvider {
    /// Name, endpoint and the settings' capabilities; the credential is resolved on
    /// demand (below).
    fn adapter(&self) -> &Adapter {
        &self.adapter
    }

    /// Resolves the standard chain (within `credentials_timeout`); found → where
    /// (`AWS_ACCESS_KEY_ID`, the profile, else "the AWS SDK's default chain"), missing →
    /// what the chain looks at.
    async fn credentials(&self) -> CredentialReport {
        if self.settings.credentials.is_some() {
            return CredentialReport::Found("the adapter's explicit settings".into());
        }
        let sdk = self.sdk().await;
        match self.check_credentials(sdk).await {
            Ok(()) if crate::provider::env_nonempty("AWS_ACCESS_KEY_ID").is_some() => {
                CredentialReport::Found("the AWS_ACCESS_KEY_ID environment variable".into())
            }
            Ok(()) => CredentialReport::Found(match &self.settings.profile {
                Some(p) => format!("AWS profile `{p}` (AWS_PROFILE)"),
                None => "the AWS SDK's default chain".into(),
            }),
            Err(e) => CredentialReport::Missing(vec![e.msg]),
        }
    }

    /// The static catalog ([`catalog::plan`]); no network, no credentials.
    async fn plan(&self, req: &ResourceRequest) -> Result<Vec<Offer>> {
        catalog::plan(req)
    }

    /// Type metadata and zones, image, default-VPC subnets, security group; returns
    /// [`Prepared`] as JSON.
    ///
    /// Errors: the type unknown to the region or offered in no (requested) zone →
    /// `Unavailable` for the type in the region; no default VPC → `Unavailable` for the
    /// region; a configured image that does not exist → `InvalidRequest`; a security
    /// group of that name without our tags → `InvalidRequest`; API errors per the table.
    async fn prepare(&self, offer: &Offer, spec: &InstanceSpec) -> Result<Value> {
        let region = &offer.location.region;
        let client = self.client(region).await?;
        let itype = InstanceType::from(offer.instance_type.as_str());

        match client
            .describe_instance_types()
            .instance_types(itype.clone())
            .send()
            .await
        {
            Ok(o) if !o.instance_types().is_empty() => {}
            Ok(_) => {
                return Err(Self::unavailable_type(
                    offer,
                    format!("{} is not known in {region}", offer.instance_type),
                ))
            }
            Err(e) if e.code() == Some("InvalidInstanceType") => {
                return Err(Self::unavailable_type(
                    offer,
                    format!("{} is not known in {region}", offer.instance_type),
                ))
            }
            Err(e) => return Err(self.err("DescribeInstanceTypes", region, &e, Some(offer))),
        }

        let offerings = client
            .describe_instance_type_offerings()
            .location_type(LocationType::AvailabilityZone)
            .filters(filter("instance-type", &[&offer.instance_type]))
            .send()
            .await
            .map_err(|e| self.err("DescribeInstanceTypeOfferings", region, &e, Some(offer)))?;
        let wanted: Vec<String> = offer
            .detail
            .get("zones")
            .and_then(|z| serde_json::from_value(z.clone()).ok())
            .unwrap_or_default();
        let mut zones: Vec<String> = offerings
            .instance_type_offerings()
            .iter()
            .filter_map(|o| o.location().map(str::to_string))
            .filter(|z| wanted.is_empty() || wanted.contains(z))
            .collect();
        zones.sort();
        zones.dedup();
        if zones.is_empty() {
            return Err(Self::unavailable_type(
                offer,
                format!(
                    "no zone of {region} offers {}{}",
                    offer.instance_type,
                    if wanted.is_empty() {
                        String::new()
                    } else {
                        format!(" (among {})", wanted.join(", "))
                    }
                ),
            ));
        }
        // A zone offer: only its zone. Not offered there → only this offer is blocked
        // (the core goes on with the other zones).
        if let Some(zone) = offer.location.zone.as_deref() {
            if !zones.iter().any(|z| z == zone) {
                return Err(ProviderError::new(
                    ErrorKind::Unavailable,
                    format!(
                        "{zone} does not offer {} (zones of {region} that do: {})",
                        offer.instance_type,
                        zones.join(", ")
                    ),
                ));
            }
            zones = vec![zone.to_string()];
        }

        let (image, root_device) = self.resolve_image(&client, offer, spec).await?;

        let zone_refs: Vec<&str> = zones.iter().map(String::as_str).collect();
        let subnets_out = client
            .describe_subnets()
            .filters(filter("default-for-az", &["true"]))
            .filters(filter("availability-zone", &zone_refs))
            .send()
            .await
            .map_err(|e| self.err("DescribeSubnets", region, &e, Some(offer)))?;
        let mut subnets: Vec<(PreparedSubnet, String)> = subnets_out
            .subnets()
            .iter()
            .filter_map(|s| {
                Some((
                    PreparedSubnet {
                        id: s.subnet_id()?.to_string(),
                        zone: s.availability_zone()?.to_string(),
                    },
                    s.vpc_id()?.to_string(),
                ))
            })
            .collect();
        subnets.sort_by(|a, b| a.0.zone.cmp(&b.0.zone));
        let Some(vpc) = subnets.first().map(|s| s.1.clone()) else {
            if let Some(zone) = offer.location.zone.as_deref() {
                return Err(ProviderError::new(
                    ErrorKind::Unavailable,
                    format!(
                        "{zone} has no default-VPC subnet; create one \
                         (`aws ec2 create-default-subnet --availability-zone {zone}`)"
                    ),
                ));
            }
            return Err(ProviderError::new(
                ErrorKind::Unavailable,
                format!(
                    "{region} has no default-VPC subnet in the zones offering {} ({}); \
                     create the default VPC (`aws ec2 create-default-vpc`)",
                    offer.instance_type,
                    zones.join(", ")
                ),
            )
            .with_block(crate::provider::BlockScope::InstanceTypeInRegion {
                cloud: CLOUD.into(),
                region: region.clone(),
                instance_type: offer.instance_type.clone(),
            }));
        };
        let subnets: Vec<PreparedSubnet> = subnets
            .into_iter()
            .filter(|s| s.1 == vpc)
            .map(|s| s.0)
            .collect();

        let security_group = self
            .ensure_security_group(&client, offer, spec, &vpc)
            .await?;
        let prepared = Prepared {
            image,
            root_device,
            subnets,
            security_group,
            vpc,
        };
        serde_json::to_value(&prepared).map_err(|e| {
            ProviderError::new(ErrorKind::Failed, format!("serialising prepare data: {e}"))
        })
    }

    /// One `RunInstances` in the first prepared subnet (the offer's zone), with the SDK's
    /// retries off.
    ///
    /// One subnet per attempt, by choice: a `RunInstances` call takes one subnet, and a
    /// second call in another zone would need a second `ClientToken` (the same token
    /// with other parameters is `IdempotentParameterMismatch`), which breaks the "one
    /// create attempt, recognisable after a crash" rule. Zone failover is therefore the
    /// core's: each zone is its own offer (see [`catalog::plan`]), so each zone attempt
    /// has its own cursor and with it its own `ClientToken`, and
    /// `InsufficientInstanceCapacity` blocks only that zone's offer. EC2's capacity
    /// message (which names the zones that have capacity) is kept in the error.
    ///
    /// Errors per the classification table ([`errors::classify_code`]).
    async fn create(&self, offer: &Offer, prep: &Value, spec: &InstanceSpec) -> Result<String> {
        let lineage = crate::provider::check_spec_lineage(CLOUD, &self.settings.lineage, spec)?.as_str();
        let p: Prepared = serde_json::from_value(prep.clone()).map_err(|e| {
            ProviderError::new(ErrorKind::InvalidRequest, format!("bad prepare data: {e}"))
        })?;
        let Some(subnet) = p.subnets.first() else {
            return Err(ProviderError::new(
                ErrorKind::Unavailable,
                "prepare found no subnet".to_string(),
            ));
        };
        let region = &offer.location.region;
        let client = self.client(region).await?;
        let name = Self::security_group_name(&spec.vm_name, lineage);
        let tags = |rt: ResourceType| {
            TagSpecification::builder()
                .resource_type(rt)
                .tags(tag(IDENTITY_LABEL, &spec.vm_name))
                .tags(tag(LINEAGE_LABEL, lineage))
                .tags(tag("Name", &name))
                .build()
        };
        let user_data = crate::provider::boot::cloud_init::render(
            spec.boot_script.as_ref(),
            &[spec.ssh_public_key.as_str()],
        )
        .map_err(|e| ProviderError::new(ErrorKind::InvalidRequest, e.to_string()))?;
        if user_data.len() > crate::provider::boot::cloud_init::MAX_USER_DATA_BYTES {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "the boot script renders to {} bytes of user data; EC2 takes at most {}",
                    user_data.len(),
                    crate::provider::boot::cloud_init::MAX_USER_DATA_BYTES
                ),
            ));
        }
        let mut req = client
            .run_instances()
            .image_id(&p.image)
            .instance_type(InstanceType::from(offer.instance_type.as_str()))
            .min_count(1)
            .max_count(1)
            .client_token(client_token(&spec.client_token))
            .subnet_id(&subnet.id)
            .security_group_ids(&p.security_group)
            .user_data(base64::engine::general_purpose::STANDARD.encode(user_data))
            .tag_specifications(tags(ResourceType::Instance))
            .tag_specifications(tags(ResourceType::Volume));
        if let Some(gb) = spec.disk_gb {
            req = req.block_device_mappings(
                BlockDeviceMapping::builder()
                    .device_name(p.root_device.as_deref().unwrap_or("/dev/sda1"))
                    .ebs(
                        EbsBlockDevice::builder()
                            .volume_size(i32::try_from(gb).unwrap_or(i32::MAX))
                            .volume_type(VolumeType::Gp3)
                            .delete_on_termination(true)
                            .build(),
                    )
                    .build(),
            );
        }
        if offer.spot {
            req = req.instance_market_options(
                InstanceMarketOptionsRequest::builder()
                    .market_type(MarketType::Spot)
                    .spot_options(
                        SpotMarketOptions::builder()
                            .spot_instance_type(SpotInstanceType::OneTime)
                            .instance_interruption_behavior(InstanceInterruptionBehavior::Terminate)
                            .build(),
                    )
                    .build(),
            );
        }
        let out = req
            .customize()
            .config_override(
                aws_sdk_ec2::config::Config::builder().retry_config(RetryConfig::disabled()),
            )
            .send()
            .await
            .map_err(|e| self.err("RunInstances", region, &e, Some(offer)))?;
        out.instances()
            .first()
            .and_then(|i| i.instance_id())
            .map(str::to_string)
            .ok_or_else(|| {
                ProviderError::new(ErrorKind::Failed, "RunInstances returned no instance id")
            })
    }

    /// One paginated `DescribeInstances` of `at.region` with the filters
    /// `tag-key=gpuprov-vm-name` (the identity tag is present; for one VM
    /// `tag:gpuprov-vm-name=<vm>` and `tag:gpuprov-lineage=<lineage>`) and
    /// `instance-state-name` (EC2 API reference, DescribeInstances `Filter.N`: `tag-key`,
    /// `tag:<key>`; `aws-sdk-ec2` `DescribeInstancesInput::filters`), each instance as
    /// [`seen_of`] shows it.
    async fn instances(&self, at: &Location, only_vm: Option<&str>) -> Result<Vec<Seen>> {
        if at.cloud != CLOUD {
            return Ok(vec![]);
        }
        let client = self.client(&at.region).await?;
        let identity = match only_vm {
            Some(vm) => vec![
                filter(&format!("tag:{IDENTITY_LABEL}"), &[vm]),
                filter(&format!("tag:{LINEAGE_LABEL}"), &[self.lineage()]),
            ],
            None => vec![filter("tag-key", &[IDENTITY_LABEL])],
        };
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = client
                .describe_instances()
                .set_filters(Some(identity.clone()))
                // Terminated ones too, for the preempted spot instances among them.
                .filters(filter("instance-state-name", OBSERVED_STATES))
                .set_next_token(token.clone())
                .send()
                .await
                .map_err(|e| self.err("DescribeInstances", &at.region, &e, None))?;
            let listed = page.reservations().iter().flat_map(|r| r.instances());
            out.extend(listed.filter_map(seen_of));
            token = page
                .next_token()
                .filter(|t| !t.is_empty())
                .map(str::to_string);
            if token.is_none() {
                return Ok(out);
            }
        }
    }

    /// `TerminateInstances` in `at.region`, one id per call so one unknown id cannot fail
    /// the others; `InvalidInstanceID.NotFound` is success. Does not wait.
    async fn delete(&self, at: &Location, _vm_name: &str, instance_ids: &[String]) -> Result<()> {
        if instance_ids.is_empty() {
            return Ok(());
        }
        let client = self.client(&at.region).await?;
        for id in instance_ids {
            match client.terminate_instances().instance_ids(id).send().await {
                Ok(_) => {}
                Err(e) if errors::is_not_found(e.code()) => {}
                Err(e) => return Err(self.err("TerminateInstances", &at.region, &e, None)),
            }
        }
        Ok(())
    }

    /// Deletes the VM's security groups (by name and both tags) in `at.region` (a zone in
    /// `at` is ignored: the group is per region). Not found is success;
    /// `DependencyViolation` (an instance still terminating holds it) is `InUse`, per the
    /// table: the core observes again before retrying.
    async fn cleanup(&self, at: &Location, vm_name: &str) -> Result<()> {
        let lineage = self.lineage().to_string();
        if at.cloud != CLOUD {
            return Ok(());
        }
        let client = self.client(&at.region).await?;
        let name = Self::security_group_name(vm_name, &lineage);
        let groups = client
            .describe_security_groups()
            .filters(filter("group-name", &[&name]))
            .filters(filter(&format!("tag:{IDENTITY_LABEL}"), &[vm_name]))
            .filters(filter(&format!("tag:{LINEAGE_LABEL}"), &[&lineage]))
            .send()
            .await
            .map_err(|e| self.err("DescribeSecurityGroups", &at.region, &e, None))?;
        for g in groups.security_groups() {
            let Some(id) = g.group_id() else { continue };
            match client.delete_security_group().group_id(id).send().await {
                Ok(_) => {}
                Err(e) if errors::is_not_found(e.code()) => {}
                Err(e) => return Err(self.err("DeleteSecurityGroup", &at.region, &e, None)),
            }
        }
        Ok(())
    }

    /// Starts a stopped instance: `DescribeInstances` by id first, then `StartInstances`
    /// only when it is `stopped` (the SDK's retries off, as for create: the core decides,
    /// and `InsufficientInstanceCapacity` arrives as HTTP 500). Already `pending` or
    /// `running` is success (nothing is
    /// sent); `stopping` is `Transient` (it can be started once stopped); terminated,
    /// shutting down or unknown is `Failed` (there is nothing to start). `StartInstances`
    /// errors per the table: `InsufficientInstanceCapacity` → `Capacity`, the account
    /// limits → `Quota`, `IncorrectInstanceState` (raced with a stop) → `Transient`.
    async fn start(&self, at: &Location, _vm_name: &str, instance_id: &str) -> Result<()> {
        let client = self.client(&at.region).await?;
        let state = match client
            .describe_instances()
            .instance_ids(instance_id)
            .send()
            .await
        {
            Ok(out) => out
                .reservations()
                .iter()
                .flat_map(|r| r.instances())
                .find(|i| i.instance_id() == Some(instance_id))
                .and_then(|i| i.state().and_then(|s| s.name()).cloned()),
            Err(e) if errors::is_not_found(e.code()) => None,
            Err(e) => return Err(self.err("DescribeInstances", &at.region, &e, None)),
        };
        match state {
            Some(InstanceStateName::Pending | InstanceStateName::Running) => return Ok(()),
            Some(InstanceStateName::Stopping) => {
                return Err(ProviderError::transient(format!(
                    "{instance_id} is still stopping; it can be started once stopped"
                )))
            }
            Some(InstanceStateName::Stopped) => {}
            other => {
                return Err(ProviderError::new(
                    ErrorKind::Failed,
                    format!(
                        "{instance_id} cannot be started: it is {}",
                        other.as_ref().map(|s| s.as_str()).unwrap_or("gone")
                    ),
                ))
            }
        }
        client
            .start_instances()
            .instance_ids(instance_id)
            .customize()
            .config_override(
                aws_sdk_ec2::config::Config::builder().retry_config(RetryConfig::disabled()),
            )
            .send()
            .await
            .map_err(|e| self.err("StartInstances", &at.region, &e, None))?;
        Ok(())
    }
}
