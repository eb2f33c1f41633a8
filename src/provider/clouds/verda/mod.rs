//! Verda, formerly DataCrunch (cloud name `verda`), over its public API v1
//! (`tests/fixtures/vendor-apis/verda/verda-from-sdk.openapi.yaml`, the description derived from
//! the vendor's Python SDK `verda` 1.25.0, the primary source; the Go SDK
//! `verdacloud-sdk-go` where it says more).
//!
//! Mapping onto the contract (design 5):
//!
//! - `plan`: `GET /instance-types?currency=usd` ⨝ `GET /instance-availability?isSpot=…`
//!   (the Python SDK's spelling). One offer per instance type matching the ask (GPU
//!   `model`, exact `gpu.number_of_gpus`) and location listing it as available: region =
//!   the location code (`FIN-01`), id `verda/<location>/<type>` (`…/spot` for spot), price
//!   `price_per_hour` (or `spot_price`) USD per hour for the whole instance.
//! - Shared object `ssh_key` (one per account, [`crate::provider::shared`]: `GET /sshkeys` lists the
//!   account's keys, and an instance names any of them by id): `observe_shared` finds the
//!   project key among `GET /sshkeys` by its public key *value* (a key merely named like
//!   ours is never used; the user's own key found by value is used and never deleted);
//!   `create_shared` registers it (`POST /sshkeys`, the id answered as plain text) under
//!   [`crate::provider::project_key_name`], or the next free `-<n>` when a key of another value
//!   holds that name; a refusal there is `Exists` (errors.rs: the description gives no
//!   conflict body), so the core observes again and adopts it; `delete_shared` is
//!   `DELETE /sshkeys/{id}`, only for a key of the derived name.
//! - `prepare`: re-checks the type in the location (`GET /instance-availability/{type}`;
//!   `false` → `Unavailable`); picks the image (`GET /images?instance_type=`: the VM's
//!   `image` by image type or id, else the newest Ubuntu + CUDA + Docker one); takes the
//!   shared key the core prepared (without it, `InvalidRequest`); and, when the spec has a boot script, finds or creates the
//!   startup script holding its shell form
//!   ([`BootScript::to_shell`](crate::provider::BootScript::to_shell)), named
//!   `gpuprov-<vm>-<lineage8>-<location>-<sha8 of the text>`. Returns `{"image",
//!   "ssh_key_id", "startup_script_id"?}`.
//! - `create`: `POST /instances` with the type, image, location, key, startup script, an OS
//!   volume `gpuprov-<vm>-<lineage8>-<location>-os` (`disk_gb`, else
//!   [`DEFAULT_OS_VOLUME_GB`]), `is_spot`, and the identity: `hostname`
//!   `gpuprov-<vm>-<lineage8>` (what the console shows) and `description`
//!   `gpuprov-vm-name=<vm> gpuprov-lineage=<lineage>` (the full lineage). Both are fields
//!   the Python SDK always sends and both SDKs read back as required `Instance` fields;
//!   tags exist only in the Go SDK (lowercased keys, at most 10, not in the Python SDK), so
//!   the identity does not rely on them. The answer is the new id as plain text (the Go
//!   SDK also accepts an `Instance` object; both are read).
//! - `instances` (the listing `observe`, `observe_location` and `list` read):
//!   `GET /instances` (the API has no tag or name filter), kept by location; the identity
//!   is the description's words (else the hostname), judged by the core's one rule. Status
//!   `no_capacity` (the Go SDK's `StatusNoCapacity`) is the create refused late for
//!   capacity: [`InstanceStatus::Refused`](crate::provider::InstanceStatus::Refused) with kind
//!   `Capacity`, so the core fails over as if `create` had refused.
//! - `delete`: the instance action endpoint, `PUT /instances {id: [..], action: "delete",
//!   volume_ids: [its OS and data volumes], delete_permanently: true}`, for the ids still
//!   listed. Its two refusals: an instance still being provisioned cannot be discontinued
//!   yet (`Transient`: the teardown retries), and one already discontinued is gone
//!   (success). A 207's per-instance errors are judged the same way.
//! - `cleanup`: deletes the VM's startup scripts of the location (`DELETE /scripts/{id}`)
//!   and any of its OS volumes left there (`DELETE /volumes/{id}` with `is_permanent`;
//!   still attached → `InUse`). The project key is not the machine's (see `ssh_key`
//!   above): it goes after the project's last machine.
//!
//! No firewall API: the capabilities declare none, so the k3s API is reached through
//! `gpuprov tunnel` and `spec.ports` is not applied.
//!
//! Credentials: OAuth2 client credentials ([`kit::oauth`]): `VERDA_CLIENT_ID` and
//! `VERDA_CLIENT_SECRET`, else the profile (`VERDA_PROFILE`, else `default`) of the vendor
//! CLI's credentials file (`VERDA_SHARED_CREDENTIALS_FILE`, else `$VERDA_HOME/credentials`,
//! else `~/.verda/credentials`; keys `verda_client_id`, `verda_client_secret`; repo
//! verda-cloud/verda-cli, `internal/verda-cli/cmd/auth/README.md`). The access token from
//! `POST /oauth2/token` is cached and renewed (refresh grant, then client credentials
//! again), sent as `Authorization: Bearer`, and like the secret never written to state,
//! logs or errors.
//!
//! SSH: host `ip`, user `root`, port 22 (no SDK states the user; dstack's DataCrunch
//! backend logs in as `root` on port 22).
//!
//! Rate limits: none documented (SOURCES.md). The adapter declares four concurrent calls;
//! a 429 is `Transient` with `Retry-After`.

mod api;
mod credentials;
mod errors;
mod instances;
mod offers;
mod scripts;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use async_trait::async_trait;
use reqwest::Method;
use serde_json::{json, Value};

use api::{ActionResult, Image, Instance, InstanceType, LocationAvailability, SshKey, Volume};
pub use credentials::{client_from_credentials_file, credentials_file, find_client};
pub use errors::CLASSIFIER;
use instances::{seen_at, status_of};
use offers::{model_of, offers_for, type_matches};

use crate::provider::identity::located_name;
use crate::provider::kit::keys::{self, KeyListing, ListedKey};
use crate::provider::kit::oauth::ClientCredentials;
use crate::provider::kit::{self, gpu, Adapter, Auth, Call, Failure, RestClient};
use crate::provider::{
    object_name, Capabilities, CloudProvider, ErrorKind, Feature, InstanceSpec, Lineage, Location,
    Offer, ProviderError, ResourceRequest, Result, Secret, Seen, SharedFound, SharedObject,
    IDENTITY_LABEL, LINEAGE_LABEL,
};

// The kind of the project key, the one shared object this cloud declares
// (`shared::declared`): one per account.
use crate::provider::shared::SSH_KEY as SSH_KEY_KIND;

/// The cloud name.
pub const CLOUD: &str = "verda";
/// The API base URL when neither config nor environment overrides it.
pub const DEFAULT_ENDPOINT: &str = "https://api.verda.com/v1";
/// Environment variable overriding the endpoint (wins over `[cloud.verda] endpoint`).
pub const ENDPOINT_ENV: &str = "GPUPROV_VERDA_ENDPOINT";
/// Environment variables of the client credentials (the vendor SDK's README).
pub const CLIENT_ID_ENV: &str = "VERDA_CLIENT_ID";
pub const CLIENT_SECRET_ENV: &str = "VERDA_CLIENT_SECRET";
/// The vendor CLI's profile, credentials file and home directory variables.
pub const PROFILE_ENV: &str = "VERDA_PROFILE";
pub const CREDENTIALS_FILE_ENV: &str = "VERDA_SHARED_CREDENTIALS_FILE";
pub const HOME_ENV: &str = "VERDA_HOME";
/// The profile read when `VERDA_PROFILE` is not set.
pub const DEFAULT_PROFILE: &str = "default";
/// The location the SDKs assume for an instance listed without one.
pub const DEFAULT_LOCATION: &str = "FIN-03";
/// The image type preferred when the VM names none (the description's example image).
pub const DEFAULT_IMAGE: &str = "ubuntu-24.04-cuda-12.8-open-docker";
/// The OS volume size when the VM names no `disk_gb`, GiB.
pub const DEFAULT_OS_VOLUME_GB: u32 = 100;
/// Login user and port of Verda instances (dstack's DataCrunch backend).
pub const SSH_USER: &str = "root";
pub const SSH_PORT: u16 = 22;

/// Configuration of the Verda adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerdaSettings {
    /// API base URL override; `None` means [`DEFAULT_ENDPOINT`].
    pub endpoint: Option<String>,
    /// The OAuth2 client id and secret; `None` when not found (calls then fail with
    /// `Credentials`).
    pub client: Option<(String, Secret)>,
    /// Where the credentials were found, or every place looked at (never a value).
    pub key_source: String,
    /// The state's lineage: `observe` only sees instances described with it.
    pub lineage: Lineage,
}

impl VerdaSettings {
    /// Settings from `[cloud.verda] endpoint` and the environment: endpoint precedence
    /// `GPUPROV_VERDA_ENDPOINT` > `endpoint` > [`DEFAULT_ENDPOINT`]; the client credentials
    /// from [`find_client`].
    pub fn from_env_and_config(endpoint: Option<String>, lineage: Lineage) -> VerdaSettings {
        let var = |n: &str| std::env::var(n).ok();
        let file = credentials_file(
            var(CREDENTIALS_FILE_ENV),
            var(HOME_ENV),
            dirs::home_dir().as_deref(),
        );
        let profile =
            crate::provider::env_nonempty(PROFILE_ENV).unwrap_or_else(|| DEFAULT_PROFILE.into());
        let (client, key_source) = find_client(
            var(CLIENT_ID_ENV),
            var(CLIENT_SECRET_ENV),
            file.as_deref(),
            &profile,
        );
        VerdaSettings {
            endpoint: crate::provider::endpoint_from(ENDPOINT_ENV, endpoint),
            client,
            key_source,
            lineage,
        }
    }
}

/// The Verda adapter. Construction does no I/O.
pub struct VerdaProvider {
    settings: VerdaSettings,
    api: RestClient,
    adapter: Adapter,
}

/// The description carrying a VM's identity: `gpuprov-vm-name=<vm> gpuprov-lineage=<l>`.
pub fn identity_description(vm_name: &str, lineage: &Lineage) -> String {
    format!("{IDENTITY_LABEL}={vm_name} {LINEAGE_LABEL}={lineage}")
}

/// The id in an answer that is the id as text, or an object with an `id`.
fn id_of(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.trim().trim_matches('"').to_string()),
        Value::Object(o) => o.get("id").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
    .filter(|s| !s.is_empty())
}

impl VerdaProvider {
    /// An adapter for `settings`. Never fails and does no I/O.
    pub fn new(settings: VerdaSettings) -> VerdaProvider {
        let endpoint = settings.endpoint.as_deref();
        let (adapter, credential) = Adapter::new(CLOUD, endpoint, Self::default_capabilities())
            .with_lineage(&settings.lineage)
            .with_key(settings.client.as_ref().map(|c| &c.1), &settings.key_source);
        let missing = format!(
            "no Verda client credentials: set {CLIENT_ID_ENV} and {CLIENT_SECRET_ENV}, or run \
             `verda auth login` (looked in: {})",
            settings.key_source
        );
        let base = endpoint.unwrap_or(DEFAULT_ENDPOINT).trim_end_matches('/');
        let mut api = RestClient::new(base, Auth::Bearer, credential, missing, &CLASSIFIER)
            .gated(adapter.gate())
            .with_error_decoder(errors::decode);
        if let Some((id, secret)) = &settings.client {
            let token_url = format!("{base}/oauth2/token");
            api = api.with_token_source(Arc::new(ClientCredentials::new(
                &token_url,
                id,
                secret.clone(),
            )));
        }
        VerdaProvider {
            settings,
            api,
            adapter,
        }
    }

    /// Replaces the declared capabilities (tests use short timeouts and poll intervals).
    pub fn with_capabilities(mut self, caps: Capabilities) -> VerdaProvider {
        self.adapter.capabilities = caps;
        self
    }

    /// Boot script (a startup script), GPUs, spot and Kubernetes; no firewall API (the
    /// cluster is reached through the SSH tunnel). Four concurrent calls; no
    /// `rate_limits` declared (neither the vendor SDKs nor the derived API description,
    /// `verda/verda-from-sdk.openapi.yaml`, document one).
    pub fn default_capabilities() -> Capabilities {
        use Feature::*;
        Capabilities {
            max_concurrency: 4,
            ..kit::adapter::vm_capabilities(&[BootScript, Gpu, Kubernetes, Spot, SharedObjects])
        }
    }

    pub fn settings(&self) -> &VerdaSettings {
        &self.settings
    }

    /// `GET /instances`: every instance of the account (it takes only a `status` filter,
    /// `datacrunch-openapi.yml` in `vendor-apis/verda`).
    async fn listing(&self) -> Result<Vec<Instance>> {
        self.api
            .get("/instances", &[], Call::other("list instances"))
            .await
    }

    /// The image type to deploy `instance_type` with: `image` when the VM names one (an
    /// image type or id listed for the type), else [`DEFAULT_IMAGE`] when listed, else the
    /// listed Ubuntu + CUDA image sorting last (the newest). Errors: none fits →
    /// `InvalidRequest`.
    async fn pick_image(&self, instance_type: &str, image: Option<&str>) -> Result<String> {
        let what = format!("list images for {instance_type}");
        let query = [("instance_type", instance_type.to_string())];
        let images: Vec<Image> = self.api.get("/images", &query, Call::other(&what)).await?;
        let wanted = image.map(str::trim).filter(|s| !s.is_empty());
        let found = match wanted {
            Some(w) => images.iter().find(|i| i.image_type == w || i.id == w),
            None => images
                .iter()
                .find(|i| i.image_type == DEFAULT_IMAGE)
                .or_else(|| {
                    images
                        .iter()
                        .filter(|i| {
                            i.image_type.starts_with("ubuntu-") && i.image_type.contains("cuda")
                        })
                        .max_by(|a, b| a.image_type.cmp(&b.image_type))
                }),
        };
        found.map(|i| i.image_type.clone()).ok_or_else(|| {
            let have: Vec<&str> = images.iter().map(|i| i.image_type.as_str()).collect();
            ProviderError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "verda: no image {} for {instance_type}; it has: {}",
                    wanted.unwrap_or("with Ubuntu and CUDA"),
                    have.join(", ")
                ),
            )
        })
    }

    /// `GET /sshkeys`: every key of the account (the API does not page it).
    async fn ssh_keys(&self) -> Result<Vec<SshKey>> {
        self.api
            .get("/sshkeys", &[], Call::other("list SSH keys"))
            .await
    }

    /// `GET /sshkeys` read for the project key `public_key` (names are unique).
    async fn key_listing(&self, public_key: &str) -> Result<KeyListing> {
        let listed = self.ssh_keys().await?.into_iter();
        let keys = listed.map(|k| ListedKey::new(k.id, k.name, k.key));
        Ok(KeyListing::new(
            CLOUD,
            self.settings.lineage.as_str(),
            public_key,
            keys,
        ))
    }

    /// The instance action `delete` for `ids` with `volumes`, permanently. `Ok(false)` when
    /// Verda answered that (one of) them is already gone.
    async fn delete_action(&self, ids: &[String], volumes: &[String]) -> Result<bool> {
        let body = json!({
            "id": ids,
            "action": "delete",
            "volume_ids": volumes,
            "delete_permanently": true,
        });
        let call = Call::named(errors::DELETE, "delete instances");
        match self
            .api
            .send(Method::PUT, "/instances", &[], Some(&body))
            .await
        {
            Ok(v) => {
                // 202 / 207: per-instance results (the Go SDK's `InstanceActionResult`).
                let results: Vec<ActionResult> = serde_json::from_value(v).unwrap_or_default();
                for r in results.iter().filter(|r| r.status == "error") {
                    let f = Failure::http(
                        r.status_code.unwrap_or(400),
                        Some(String::new()),
                        format!(
                            "{}: {}",
                            r.instance_id,
                            r.error.as_deref().unwrap_or("refused")
                        ),
                    );
                    if !errors::is_gone(&f) {
                        return Err(self.api.fail(&f, call));
                    }
                }
                Ok(true)
            }
            Err(f) if errors::is_gone(&f) => Ok(false),
            Err(f) => Err(self.api.fail(&f, call)),
        }
    }
}

#[async_trait]
impl CloudProvider for VerdaProvider {
    /// Name, endpoint, capabilities ([`VerdaProvider::default_capabilities`]) and where
    /// the client credentials were found ([`find_client`]).
    fn adapter(&self) -> &Adapter {
        &self.adapter
    }

    /// Offers from the instance types and their availability per location (see the module
    /// docs); spot asks read spot availability and prices. An empty list means "no
    /// capacity now". Errors: no type with that GPU model and count → `InvalidRequest`.
    async fn plan(&self, req: &ResourceRequest) -> Result<Vec<Offer>> {
        let currency = [("currency", "usd".to_string())];
        let types: Vec<InstanceType> = self
            .api
            .get(
                "/instance-types",
                &currency,
                Call::other("list instance types"),
            )
            .await?;
        if !types.iter().any(|t| type_matches(t, req)) {
            let have = types
                .iter()
                .filter_map(|t| model_of(t).map(|m| format!("{m} x{}", t.gpu.number_of_gpus)));
            return Err(gpu::no_type_for("Verda has no instance type", req, have));
        }
        let query = [("isSpot", req.spot.to_string())];
        let avail: Vec<LocationAvailability> = self
            .api
            .get(
                "/instance-availability",
                &query,
                Call::other("list instance availability"),
            )
            .await?;
        Ok(offers_for(&types, &avail, req))
    }

    /// Re-checks availability (gone → `Unavailable`), picks the image, takes the shared
    /// key the core prepared ([`keys::prepared_key`]; missing → `InvalidRequest`) and, with a boot
    /// script, finds or creates its startup script. Returns `{"image", "ssh_key_id",
    /// "startup_script_id"?}`.
    async fn prepare(&self, offer: &Offer, spec: &InstanceSpec) -> Result<Value> {
        let key = keys::prepared_key(CLOUD, spec)?.id.clone();
        let location = &offer.location.region;
        let ty = &offer.instance_type;
        let path = format!("/instance-availability/{ty}");
        let query = [
            ("isSpot", offer.spot.to_string()),
            ("location_code", location.clone()),
        ];
        let what = format!("re-check {ty} in {location}");
        let v: Value = self.api.get(&path, &query, Call::other(&what)).await?;
        // A JSON boolean (the Python SDK), or the string "true" (the Go SDK accepts both).
        if !(v == Value::Bool(true) || v == json!("true")) {
            return Err(ProviderError::new(
                ErrorKind::Unavailable,
                format!("verda: {ty} is no longer available in {location}"),
            ));
        }
        let image = self.pick_image(ty, spec.image.as_deref()).await?;
        let mut out = json!({ "image": image, "ssh_key_id": key });
        if let Some(boot) = &spec.boot_script {
            out["startup_script_id"] =
                json!(self.ensure_script(&spec.vm_name, location, boot).await?);
        }
        Ok(out)
    }

    /// `POST /instances` (see the module docs for the body). Returns the instance id.
    ///
    /// Verda's create takes no idempotency token (`spec.client_token` is unused): the
    /// core's observe-before-create finds a created instance by its description.
    async fn create(&self, offer: &Offer, prepared: &Value, spec: &InstanceSpec) -> Result<String> {
        let lineage = crate::provider::check_spec_lineage(CLOUD, &self.settings.lineage, spec)?;
        let image = kit::offer::prepared(prepared, "image", Value::as_str)?;
        let key = kit::offer::prepared(prepared, "ssh_key_id", Value::as_str)?;
        let location = &offer.location.region;
        let body = json!({
            "instance_type": offer.instance_type,
            "image": image,
            "hostname": object_name(&spec.vm_name, lineage),
            "description": identity_description(&spec.vm_name, lineage),
            "ssh_key_ids": [key],
            "location_code": location,
            "startup_script_id": prepared.get("startup_script_id").and_then(Value::as_str),
            "os_volume": {
                "name": format!("{}-os", located_name(&spec.vm_name, lineage, location)),
                "size": spec.disk_gb.filter(|g| *g > 0).unwrap_or(DEFAULT_OS_VOLUME_GB),
            },
            "volumes": [],
            "existing_volumes": [],
            "is_spot": offer.spot,
            "coupon": null,
        });
        let what = format!("create {} in {location}", offer.instance_type);
        let call = Call::named(errors::CREATE, &what).in_region(location);
        let v: Value = self.api.post("/instances", &body, call).await?;
        id_of(&v).ok_or_else(|| {
            ProviderError::new(
                ErrorKind::Failed,
                format!("verda {what}: no instance id in the answer"),
            )
        })
    }

    /// One `GET /instances` (the API has no tag or name filter), keeping the instances in
    /// `at.region` ([`seen_at`]).
    async fn instances(&self, at: &Location, _only_vm: Option<&str>) -> Result<Vec<Seen>> {
        let list = self.listing().await?;
        Ok(list.iter().filter_map(|i| seen_at(i, &at.region)).collect())
    }

    /// The `delete` action for those of `instance_ids` still listed, with their volumes
    /// (see the module docs). Unknown or already discontinued instances are success; with
    /// several ids, a "gone" answer sends each one alone so the others still go.
    async fn delete(&self, _at: &Location, _vm_name: &str, instance_ids: &[String]) -> Result<()> {
        if instance_ids.is_empty() {
            return Ok(());
        }
        let alive = |i: &Instance| status_of(i).is_some();
        let listed =
            kit::listing::still_listed(self.listing().await?, instance_ids, |i| &i.id, alive);
        let ids: Vec<String> = listed.iter().map(|i| i.id.clone()).collect();
        let volumes = |is: &[&Instance]| -> Vec<String> {
            is.iter()
                .flat_map(|i| {
                    i.os_volume_id
                        .iter()
                        .chain(i.volume_ids.iter().flatten())
                        .cloned()
                })
                .collect()
        };
        if ids.is_empty()
            || self
                .delete_action(&ids, &volumes(&listed.iter().collect::<Vec<_>>()))
                .await?
        {
            return Ok(());
        }
        if listed.len() > 1 {
            for i in &listed {
                self.delete_action(std::slice::from_ref(&i.id), &volumes(&[i]))
                    .await?;
            }
        }
        Ok(())
    }

    /// The project key among `GET /sshkeys`, found by *value* (compared without the
    /// comment), never by name; `None` when it is not registered.
    async fn observe_shared(
        &self,
        obj: &SharedObject,
        public_key: &str,
    ) -> Result<Option<SharedFound>> {
        obj.expect(CLOUD, SSH_KEY_KIND)?;
        Ok(self.key_listing(public_key).await?.found())
    }

    /// `POST /sshkeys` `{name, key}` under [`project_key_name`](crate::provider::project_key_name), or the first free `-<n>`
    /// when a key of another value holds it; the answer is the new id as plain text. A
    /// refusal (`invalid_request`: the description has no conflict answer) is `Exists`:
    /// observed again. A key of this value already listed is `Exists` too: Verda would
    /// register the same key a second time under another name.
    async fn create_shared(&self, obj: &SharedObject, public_key: &str) -> Result<SharedFound> {
        obj.expect(CLOUD, SSH_KEY_KIND)?;
        let name = self.key_listing(public_key).await?.name_to_register()?;
        let what = format!("register SSH key {name}");
        let body = json!({ "name": name, "key": public_key.trim() });
        let call = Call::named(errors::REGISTER_KEY, &what);
        let v: Value = self.api.post("/sshkeys", &body, call).await?;
        let id = id_of(&v).ok_or_else(|| {
            ProviderError::new(
                ErrorKind::Failed,
                format!("verda {what}: no key id in the answer"),
            )
        })?;
        Ok(keys::registered(id, None, name))
    }

    /// `DELETE /sshkeys/{id}` (`not_found` = already gone). Instances keep the key they
    /// were created with.
    async fn delete_shared(&self, obj: &SharedObject, found: &SharedFound) -> Result<()> {
        obj.expect(CLOUD, SSH_KEY_KIND)?;
        let what = format!("delete SSH key {}", found.name);
        self.api
            .delete(
                &format!("/sshkeys/{}", found.id),
                errors::is_gone,
                Call::other(&what),
            )
            .await
    }

    /// Deletes the VM's startup scripts of `at.region` and its OS volumes left there (not
    /// found → success; a volume still attached → `InUse`). The project key stays: it is
    /// shared by the project's VMs.
    async fn cleanup(&self, at: &Location, vm_name: &str) -> Result<()> {
        if at.cloud != CLOUD {
            return Ok(());
        }
        let located = located_name(vm_name, &self.settings.lineage, &at.region);
        self.delete_scripts(&located).await?;
        let os = format!("{located}-os");
        let volumes: Vec<Volume> = self
            .api
            .get("/volumes", &[], Call::other("list volumes"))
            .await?;
        for v in volumes.iter().filter(|v| {
            v.name == os
                && v.location.as_deref().unwrap_or(DEFAULT_LOCATION) == at.region
                && !matches!(v.status.as_str(), "deleted" | "deleting")
        }) {
            if v.status == "attached" || v.instance_id.as_deref().is_some_and(|i| !i.is_empty()) {
                return Err(ProviderError::new(
                    ErrorKind::InUse,
                    format!("verda: volume {} is still attached to an instance", v.name),
                ));
            }
            let what = format!("delete volume {}", v.name);
            let body = json!({ "is_permanent": true });
            match self
                .api
                .send(
                    Method::DELETE,
                    &format!("/volumes/{}", v.id),
                    &[],
                    Some(&body),
                )
                .await
            {
                Ok(_) => {}
                Err(f) if errors::is_gone(&f) => {}
                Err(f) => return Err(self.api.fail(&f, Call::other(&what))),
            }
        }
        Ok(())
    }
}
