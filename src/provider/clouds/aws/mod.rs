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
mod instances;
mod network;
mod sdk;
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
pub use instances::{client_token, preemption_of, seen_of, status_of};
use instances::{filter, tag};
pub use sdk::{missing_profile, resolve_credentials, sdk_loader, shared_files, CREDENTIAL_SOURCES};

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
        let zones = self.zones_offering(&client, offer).await?;
        let (image, root_device) = self.resolve_image(&client, offer, spec).await?;
        let (vpc, subnets) = self.default_subnets(&client, offer, &zones).await?;

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
        let lineage =
            crate::provider::check_spec_lineage(CLOUD, &self.settings.lineage, spec)?.as_str();
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
