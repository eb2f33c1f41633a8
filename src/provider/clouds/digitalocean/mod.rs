//! DigitalOcean (cloud name `digitalocean`), over its public API v2 (vendor OpenAPI 3.0,
//! `tests/fixtures/vendor-apis/digitalocean/DigitalOcean-public.v2.gpuprov-subset.yaml`).
//!
//! Mapping onto the contract (design 5):
//!
//! - `plan`: `GET /v2/sizes` (all pages) × `GET /v2/regions` (all pages); one offer per
//!   (size, region) where the size is `available`, lists the region in `regions`, and the
//!   region is `available`. GPU asks take sizes with `gpu_info`; the price is
//!   `price_hourly` USD. Id `digitalocean/<region>/<size>`. DigitalOcean has no spot market.
//! - Shared object `ssh_key` (one per account, [`crate::provider::shared`]): `observe_shared` finds
//!   the project key among `GET /v2/account/keys` by its public key *value* (a key merely
//!   named like ours is never used); `create_shared` registers it under
//!   [`crate::provider::project_key_name`], `gpuprov-<lineage8>-<fp12>` (a 422 "SSH Key is already
//!   in use" is `Exists`: the core observes again and adopts it); `delete_shared` is
//!   `DELETE /v2/account/keys/{id}`, only for a key of that name (the user's own stays).
//! - `prepare`: re-checks the size in the region (gone → `Unavailable`) and that its disk
//!   covers `disk_gb`; takes the shared key the core prepared (without it, `InvalidRequest`); creates the
//!   per-VM firewall tag
//!   (`POST /v2/tags`: a firewall may only name tags that exist, spec
//!   `existing_tags_array`) and finds or creates the per-VM cloud firewall
//!   `gpuprov-<vm>-<lineage8>-<region>` applied to that tag (inbound TCP 22 and the VM's
//!   ports from anywhere, outbound all: a DigitalOcean firewall drops any outbound traffic
//!   it does not allow); picks the image.
//! - `create`: `POST /v2/droplets` named `gpuprov-<vm>-<lineage8>`, tagged
//!   `gpuprov-vm-name:<vm>`, `gpuprov-lineage:<lineage>` and the firewall tag (tag names
//!   allow only letters, digits, `_`, `-` and `:`, so `:` replaces the `=` of the identity
//!   convention), with the key and the boot script as cloud-init `user_data`.
//! - `instances` (the listing `observe`, `observe_location` and `list` read): GPU droplets
//!   are listed only with `type=gpus`, which cannot be combined with `tag_name` (spec
//!   parameter `droplet_type`; also a field report). So it lists
//!   `GET /v2/droplets?type=gpus`, and non-GPU droplets with
//!   `GET /v2/droplets?tag_name=gpuprov-vm-name:<vm>` for one VM or `GET /v2/droplets`
//!   for all; both filtered by region slug (exact). The identity is the droplet's tags
//!   (else its name), judged by the core's one rule.
//! - `delete`: `DELETE /v2/droplets/{id}` (404 = already gone); `cleanup` deletes the
//!   per-VM firewall, then its tag (`DELETE /v2/tags/{name}`; 404 = already gone). The
//!   project key is not the machine's (see `ssh_key` above). DigitalOcean documents no "still in use" answer for either
//!   (deleting a tag untags whatever carries it), so `cleanup` never reports `InUse`.
//! - `start`: `POST /v2/droplets/{id}/actions` `{"type": "power_on"}` for a droplet that
//!   is `off` (`Feature::Start`); one already `new` or `active` is left alone.
//!
//! Errors (`errors.rs`): the `error` object's `id` and `message`, classified by status and,
//! for 422, by known message phrases through a table; a body that is not the `error`
//! object (a proxy's HTML page) is shown as one short line (`provider::cause::http_cause`);
//! a refused connection is `Unreachable`.
//!
//! Listings (`sizes`, `regions`, `ssh_keys`, `firewalls`, `droplets`, `actions`) ask
//! `per_page=200` (the spec's maximum) and follow `links.pages.next`; only its `page`
//! number is read, so the link's host (DigitalOcean's even behind an endpoint override)
//! is never dialled.
//!
//! Image: GPU sizes get DigitalOcean's "AI/ML Ready" image (NVIDIA drivers and CUDA
//! preinstalled): `gpu-h100x1-base` (the spec's `gpu_droplets` example droplet runs it,
//! `AI/ML Ready H100x1`), `gpu-h100x8-base` for 8-GPU NVIDIA sizes and `gpu-amd-base` for
//! AMD sizes (both from DigitalOcean's GPU Droplet documentation, *not* in the spec). Other
//! sizes get `ubuntu-24-04-x64`. `image` in config overrides it.
//!
//! Credentials: the token comes from `DIGITALOCEAN_TOKEN`, then `DIGITALOCEAN_ACCESS_TOKEN`
//! (doctl's variable), then doctl's `config.yaml` (key `access-token`, or the current
//! `context` under `auth-contexts`) in the platform configuration directory
//! (`~/.config/doctl/` on Linux, `~/Library/Application Support/doctl/` on macOS). It is
//! sent as `Authorization: Bearer` and never written to state, logs, `Debug` output or
//! error messages; a `Credentials` error's help names these places.
//!
//! SSH: host = `networks.v4[]` entry of `type: public`; port 22 and user `root` are
//! DigitalOcean's conventions, *not* in the API description.
//!
//! Rate limits (API description `info.description`, section "Rate Limit"): 5,000 requests
//! per hour and 250 per minute per token, each request counted for its own window
//! ("each request instead has its own timer"). Both are declared in
//! [`DigitalOceanProvider::default_capabilities`] and the core enforces them on every
//! HTTP request. So is the limit the same section sets on one endpoint, 10 key listings
//! (`GET /v2/account/keys`) per 60 s: the client counts each page of the listing as an
//! [`EndpointClass::KeyListing`] request, against that limit and the two over every
//! request. A 429 is `Transient` with `retry-after`, else the wait until
//! `ratelimit-reset`. The adapter itself never sleeps.

mod api;
mod doctl;
mod droplets;
mod errors;
mod firewall;
mod sizes;
#[cfg(test)]
mod tests;

use async_trait::async_trait;
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use api::{Droplet, Region, Size, SshKey};
pub use doctl::{doctl_config_paths, find_token, token_from_doctl_config};
use droplets::seen_at;
pub use errors::{
    classify, ApiError, RateHeaders, Scope, REGION_UNAVAILABLE_PHRASES, SIZE_UNAVAILABLE_PHRASES,
};
pub use sizes::{default_image, gpu_model};
use sizes::{offers_for, size_matches};

use crate::provider::kit::keys::{self, KeyListing, ListedKey};
use crate::provider::kit::paginate::{all_pages, page_of_link, Cursor, Next};
use crate::provider::kit::{self, gpu, Adapter, Auth, Call, RestClient};
use crate::provider::{
    object_name, project_key_name, Capabilities, CloudProvider, EndpointClass, ErrorKind, Feature,
    InstanceSpec, Lineage, Location, Offer, ProviderError, RateLimit, ResourceRequest, Result,
    Seen, SharedFound, SharedObject, IDENTITY_LABEL, LINEAGE_LABEL,
};

/// The cloud name.
pub const CLOUD: &str = "digitalocean";
/// The API base URL when neither config nor environment overrides it (spec `servers`).
pub const DEFAULT_ENDPOINT: &str = "https://api.digitalocean.com";
/// Environment variable overriding the endpoint (wins over `[cloud.digitalocean] endpoint`).
pub const ENDPOINT_ENV: &str = "GPUPROV_DIGITALOCEAN_ENDPOINT";
/// Environment variable holding the token (the API description's examples use it).
pub const TOKEN_ENV: &str = "DIGITALOCEAN_TOKEN";
/// doctl's environment variable for the token.
pub const ACCESS_TOKEN_ENV: &str = "DIGITALOCEAN_ACCESS_TOKEN";
/// SSH port of droplets (not in the API description).
pub const SSH_PORT: u16 = 22;
/// Login user of DigitalOcean images (not in the API description).
pub const SSH_USER: &str = "root";
/// Image of non-GPU sizes.
pub const DEFAULT_IMAGE: &str = "ubuntu-24-04-x64";
/// Items per page asked for in list calls (spec `per_page` maximum).
pub const PER_PAGE: u32 = 200;

/// The credential; its `Debug` never shows the value.
pub use crate::provider::Secret as Token;

/// Configuration of the DigitalOcean adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigitalOceanSettings {
    /// API base URL override; `None` means [`DEFAULT_ENDPOINT`].
    pub endpoint: Option<String>,
    /// `None` when no token was found; calls then fail with `Credentials`.
    pub token: Option<Token>,
    /// Where the token was found (an environment variable or a file path), or every place
    /// that was searched when none was found. Holds no secret.
    pub token_source: String,
    /// The state's lineage: `observe` only sees droplets tagged with it.
    pub lineage: Lineage,
}

impl DigitalOceanSettings {
    /// Settings from `[cloud.digitalocean] endpoint` and the environment: endpoint
    /// precedence `GPUPROV_DIGITALOCEAN_ENDPOINT` (non-empty) > `endpoint` >
    /// [`DEFAULT_ENDPOINT`]; the token as [`find_token`] finds it in the process
    /// environment and doctl's configuration directory.
    pub fn from_env_and_config(endpoint: Option<String>, lineage: Lineage) -> DigitalOceanSettings {
        let (token, looked) = find_token(|k| std::env::var(k).ok(), &doctl_config_paths());
        DigitalOceanSettings {
            endpoint: crate::provider::endpoint_from(ENDPOINT_ENV, endpoint),
            token_source: match &token {
                Some(c) => c.source.to_string(),
                None => looked.join(", "),
            },
            token: token.map(|c| c.secret),
            lineage,
        }
    }
}

/// The DigitalOcean adapter. Construction does no I/O.
pub struct DigitalOceanProvider {
    settings: DigitalOceanSettings,
    api: RestClient,
    adapter: Adapter,
}

/// Whether `tag` is a valid DigitalOcean tag name (`^[a-zA-Z0-9_\-\:]+$`, at most 255
/// characters; bundled spec, schema `tags.name`).
pub fn is_valid_tag(tag: &str) -> bool {
    !tag.is_empty()
        && tag.len() <= 255
        && tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | ':'))
}

/// The value at `pointer` of a response, or `Failed` naming the call and `field`.
fn field<'v, T>(
    v: &'v Value,
    pointer: &str,
    get: impl Fn(&'v Value) -> Option<T>,
    what: &str,
    field: &str,
) -> Result<T> {
    v.pointer(pointer).and_then(get).ok_or_else(|| {
        ProviderError::new(
            ErrorKind::Failed,
            format!("{CLOUD} {what}: no {field} in the response"),
        )
    })
}

/// The droplets collection: `POST` launches (the [`EndpointClass::Launch`](crate::provider::EndpointClass::Launch) request),
/// `GET` lists.
const DROPLETS: &str = "/v2/droplets";

/// The account's SSH keys: `GET` lists them (the
/// [`EndpointClass::KeyListing`](crate::provider::EndpointClass::KeyListing) request,
/// limited to 10 per 60 s apart from the other requests), `POST` registers one.
const KEYS: &str = "/v2/account/keys";

impl DigitalOceanProvider {
    /// An adapter for `settings`. Never fails and does no I/O.
    pub fn new(settings: DigitalOceanSettings) -> DigitalOceanProvider {
        let endpoint = settings.endpoint.as_deref();
        let (adapter, credential) = Adapter::new(CLOUD, endpoint, Self::default_capabilities())
            .with_lineage(&settings.lineage)
            .with_key(settings.token.as_ref(), &settings.token_source);
        let missing = format!(
            "no DigitalOcean token: set {TOKEN_ENV} or log in with `doctl auth init` \
             (looked in: {})",
            settings.token_source
        );
        let base = endpoint.unwrap_or(DEFAULT_ENDPOINT);
        let api = RestClient::new(base, Auth::Bearer, credential, missing, &errors::CLASSIFIER)
            .gated(adapter.gate())
            .with_endpoint_class(Method::POST, DROPLETS, EndpointClass::Launch)
            .with_endpoint_class(Method::GET, KEYS, EndpointClass::KeyListing)
            .with_error_decoder(errors::decode_error);
        DigitalOceanProvider {
            settings,
            api,
            adapter,
        }
    }

    /// Replaces the declared capabilities (tests use short timeouts and poll intervals).
    pub fn with_capabilities(mut self, caps: Capabilities) -> DigitalOceanProvider {
        self.adapter.capabilities = caps;
        self
    }

    /// The capabilities DigitalOcean's documentation implies: boot script (cloud-init),
    /// firewall, GPUs, k3s and start; no spot. Rate limits from the API description
    /// (`digitalocean/DigitalOcean-public.v2.gpuprov-subset.yaml`, `info.description`,
    /// "Rate Limit"): 250 requests per minute (4.17 requests/s, the burst) and 5,000 per
    /// hour (1.39 requests/s) over every request, and SSH key listings
    /// (`GET /v2/account/keys`, each page) 10 per 60 s (0.17 requests/s; "Only 10 `GET`
    /// requests to the `/v2/account/keys` endpoint to list SSH keys can be made per 60
    /// seconds").
    pub fn default_capabilities() -> Capabilities {
        use Feature::*;
        const SOURCE: &str = "tests/fixtures/vendor-apis/digitalocean/DigitalOcean-public.v2.gpuprov-subset.yaml, info.description \"Rate Limit\"";
        Capabilities {
            max_concurrency: 4,
            rate_limits: vec![
                RateLimit::all(250, std::time::Duration::from_secs(60), SOURCE),
                RateLimit::all(5000, std::time::Duration::from_secs(3600), SOURCE),
                RateLimit::of(
                    EndpointClass::KeyListing,
                    10,
                    std::time::Duration::from_secs(60),
                    SOURCE,
                ),
            ],
            ..kit::adapter::vm_capabilities(&[
                BootScript,
                Firewall,
                Gpu,
                Kubernetes,
                Start,
                SharedObjects,
            ])
        }
    }

    pub fn settings(&self) -> &DigitalOceanSettings {
        &self.settings
    }

    /// The identity tag: `gpuprov-vm-name:<vm>`.
    pub fn identity_tag(vm_name: &str) -> String {
        format!("{IDENTITY_LABEL}:{vm_name}")
    }

    /// The lineage tag: `gpuprov-lineage:<lineage>`.
    pub fn lineage_tag(lineage: &Lineage) -> String {
        format!("{LINEAGE_LABEL}:{lineage}")
    }

    /// Every item under `key` of a paginated listing: `per_page=200` (the maximum), then
    /// the page number of each `links.pages.next` until there is none.
    async fn list_all<T: DeserializeOwned>(
        &self,
        path: &str,
        key: &str,
        filter: &[(&str, String)],
        what: &str,
    ) -> Result<Vec<T>> {
        all_pages(what, |cursor| async move {
            let mut query: Vec<(&str, String)> = filter.to_vec();
            query.push(("per_page", PER_PAGE.to_string()));
            if let Cursor::Page(n) = cursor {
                query.push(("page", n.to_string()));
            }
            let v: Value = self.api.get(path, &query, Call::other(what)).await?;
            let items = v.get(key).cloned().unwrap_or(json!([]));
            let next = v
                .pointer("/links/pages/next")
                .and_then(Value::as_str)
                .and_then(page_of_link)
                .map_or(Next::Done, Next::Page);
            Ok((self.api.parse(items, Call::other(what))?, next))
        })
        .await
    }

    async fn sizes(&self) -> Result<Vec<Size>> {
        self.list_all("/v2/sizes", "sizes", &[], "list sizes").await
    }

    async fn regions(&self) -> Result<Vec<Region>> {
        self.list_all("/v2/regions", "regions", &[], "list regions")
            .await
    }
}

// The kind of the project key, the one shared object this cloud declares
// (`shared::declared`): one per account.
use crate::provider::shared::SSH_KEY as SSH_KEY_KIND;

impl DigitalOceanProvider {
    /// `GET /v2/account/keys` (all pages) read for the project key `public_key`.
    /// DigitalOcean names need not be unique: gpuprov registers under the derived name
    /// itself, so only a key of exactly that name is ours.
    async fn key_listing(&self, public_key: &str) -> Result<KeyListing> {
        let what = "list SSH keys";
        let listed: Vec<SshKey> = self.list_all(KEYS, "ssh_keys", &[], what).await?;
        let keys = listed
            .into_iter()
            .map(|k| ListedKey::new(k.id, k.name, k.public_key));
        let lineage = self.settings.lineage.as_str();
        Ok(KeyListing::new(CLOUD, lineage, public_key, keys).names_not_unique())
    }
}

#[async_trait]
impl CloudProvider for DigitalOceanProvider {
    /// Name, endpoint, capabilities ([`DigitalOceanProvider::default_capabilities`]) and
    /// the token's place (`DIGITALOCEAN_TOKEN`, `DIGITALOCEAN_ACCESS_TOKEN`, doctl's
    /// `config.yaml`), or every place looked at.
    fn adapter(&self) -> &Adapter {
        &self.adapter
    }

    /// Offers from `GET /v2/sizes` × `GET /v2/regions` (see [`offers_for`]). An empty list
    /// means "nothing available now". Errors: a spot ask, or no size with that GPU model
    /// and count → `InvalidRequest`.
    async fn plan(&self, req: &ResourceRequest) -> Result<Vec<Offer>> {
        kit::offer::refuse_spot(req, "DigitalOcean has no spot droplets")?;
        let sizes = self.sizes().await?;
        if !sizes.iter().any(|s| size_matches(s, req)) {
            let have = sizes.iter().filter_map(|s| {
                let g = s.gpu_info.as_ref()?;
                gpu_model(&g.model, g.count).map(|m| format!("{m} x{}", g.count))
            });
            return Err(gpu::no_type_for("DigitalOcean has no size", req, have));
        }
        let regions = self.regions().await?;
        Ok(offers_for(&sizes, &regions, req))
    }

    /// Re-checks that the size is still available in the region (else `Unavailable`) and
    /// that its disk (GB) covers `spec.disk_gb` (else `Unavailable`: sizes have fixed
    /// disks); takes the project key the core prepared ([`keys::prepared_key`]; missing or
    /// not a number → `InvalidRequest`); creates the firewall tag and finds or
    /// creates the per-VM firewall; picks the image. Returns `{"ssh_key_id",
    /// "firewall_id", "firewall_tag", "image"}`.
    async fn prepare(&self, offer: &Offer, spec: &InstanceSpec) -> Result<Value> {
        let key = keys::prepared_key(CLOUD, spec)?;
        let key_id = key.id.parse::<i64>().map_err(|_| {
            ProviderError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "digitalocean: shared SSH key id {:?} is not a number",
                    key.id
                ),
            )
        })?;
        let region = &offer.location.region;
        let sizes = self.sizes().await?;
        let size = sizes.iter().find(|s| {
            s.slug == offer.instance_type && s.available && s.regions.iter().any(|r| r == region)
        });
        let Some(size) = size else {
            return Err(ProviderError::new(
                ErrorKind::Unavailable,
                format!(
                    "digitalocean: size {} is no longer available in {region}",
                    offer.instance_type
                ),
            ));
        };
        if let Some(want) = spec.disk_gb.filter(|d| *d > size.disk) {
            return Err(ProviderError::new(
                ErrorKind::Unavailable,
                format!(
                    "digitalocean: size {} has a {} GB disk, disk_gb asks {want}",
                    size.slug, size.disk
                ),
            ));
        }
        let fw_name = Self::firewall_name(&spec.vm_name, &self.settings.lineage, region);
        self.ensure_tag(&fw_name).await?;
        let fw_id = self.ensure_firewall(&fw_name, &spec.ports).await?;
        let image = match spec.image.as_deref().filter(|s| !s.trim().is_empty()) {
            Some(i) => i.to_string(),
            None => {
                let g = size.gpu_info.as_ref();
                default_image(g.map(|g| g.model.as_str()), g.map(|g| g.count).unwrap_or(0))
                    .to_string()
            }
        };
        Ok(json!({
            "ssh_key_id": key_id,
            "firewall_id": fw_id,
            "firewall_tag": fw_name,
            "image": image,
        }))
    }

    /// `POST /v2/droplets` with the region, size, image, key, name
    /// `gpuprov-<vm>-<lineage8>`, the identity, lineage and firewall tags, and the boot
    /// script as `user_data`. Returns the droplet id.
    ///
    /// DigitalOcean's create takes no idempotency token (`spec.client_token` is unused): a
    /// create repeated after a crash is avoided by the core's observe-before-create, which
    /// finds the droplet by its tags.
    async fn create(&self, offer: &Offer, prepared: &Value, spec: &InstanceSpec) -> Result<String> {
        let lineage = crate::provider::check_spec_lineage(CLOUD, &self.settings.lineage, spec)?;
        let key = kit::offer::prepared(prepared, "ssh_key_id", Value::as_i64)?;
        let image = kit::offer::prepared(prepared, "image", Value::as_str)?;
        let fw_tag = kit::offer::prepared(prepared, "firewall_tag", Value::as_str)?;
        let tags = [
            Self::identity_tag(&spec.vm_name),
            Self::lineage_tag(lineage),
            fw_tag.to_string(),
        ];
        if let Some(bad) = tags.iter().find(|t| !is_valid_tag(t)) {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                format!("`{bad}` is not a valid DigitalOcean tag"),
            ));
        }
        let region = &offer.location.region;
        let mut body = json!({
            "name": object_name(&spec.vm_name, lineage),
            "region": region,
            "size": offer.instance_type,
            "image": image,
            "ssh_keys": [key],
            "tags": tags,
        });
        if let Some(b) = &spec.boot_script {
            body["user_data"] = Value::String(crate::provider::cloud_init_user_data(b)?);
        }
        let what = format!("create {} in {region}", offer.instance_type);
        let call = Call::other(&what).in_region(region);
        let v: Value = self.api.post(DROPLETS, &body, call).await?;
        let id = field(&v, "/droplet/id", Value::as_i64, &what, "droplet id")?;
        Ok(id.to_string())
    }

    /// GPU droplets from `GET /v2/droplets?type=gpus` (the only listing that shows them;
    /// `type` cannot be combined with `tag_name`, spec parameter `droplet_type` of
    /// `droplets_list` in `vendor-apis/digitalocean/DigitalOcean-public.v2.gpuprov-subset.yaml`),
    /// plus non-GPU droplets from `GET /v2/droplets?tag_name=gpuprov-vm-name:<vm>` for
    /// `only_vm` (spec parameter `droplet_tag_name`: one exact tag), else
    /// `GET /v2/droplets` (every one, whatever its lineage); each all pages, the same two
    /// calls for any number of VMs. Those in `at.region` ([`seen_at`]).
    async fn instances(&self, at: &Location, only_vm: Option<&str>) -> Result<Vec<Seen>> {
        let gpus = [("type", "gpus".to_string())];
        let mut all: Vec<Droplet> = self
            .list_all(DROPLETS, "droplets", &gpus, "list GPU droplets")
            .await?;
        let tag: Vec<(&str, String)> = only_vm
            .map(|vm| ("tag_name", Self::identity_tag(vm)))
            .into_iter()
            .collect();
        let others: Vec<Droplet> = self
            .list_all(DROPLETS, "droplets", &tag, "list droplets")
            .await?;
        for d in others {
            if !all.iter().any(|g| g.id == d.id) {
                all.push(d);
            }
        }
        Ok(all.iter().filter_map(|d| seen_at(d, &at.region)).collect())
    }

    /// `DELETE /v2/droplets/{id}` for each id. An unknown droplet (404) is success, and so
    /// is an id that is not a number (no droplet can have it).
    async fn delete(&self, _at: &Location, _vm_name: &str, instance_ids: &[String]) -> Result<()> {
        for n in instance_ids
            .iter()
            .filter_map(|id| id.trim().parse::<u64>().ok())
        {
            let what = format!("delete droplet {n}");
            let path = format!("/v2/droplets/{n}");
            self.api
                .delete(&path, errors::is_not_found, Call::other(&what))
                .await?;
        }
        Ok(())
    }

    /// Deletes the VM's firewall of `at.region`, if any, then its tag (404 = already gone,
    /// for both). The project key stays: it is shared by the project's VMs.
    async fn cleanup(&self, at: &Location, vm_name: &str) -> Result<()> {
        if at.cloud != CLOUD {
            return Ok(());
        }
        let name = Self::firewall_name(vm_name, &self.settings.lineage, &at.region);
        let what = format!("delete firewall {name}");
        for f in self
            .firewalls()
            .await?
            .into_iter()
            .filter(|f| f.name == name)
        {
            let path = format!("/v2/firewalls/{}", f.id);
            self.api
                .delete(&path, errors::is_not_found, Call::other(&what))
                .await?;
        }
        let what = format!("delete tag {name}");
        let path = format!("/v2/tags/{name}");
        self.api
            .delete(&path, errors::is_not_found, Call::other(&what))
            .await
    }

    /// The project key among `GET /v2/account/keys` (all pages), found by *value*
    /// (compared without the comment), never by name; `None` when it is not registered.
    async fn observe_shared(
        &self,
        obj: &SharedObject,
        public_key: &str,
    ) -> Result<Option<SharedFound>> {
        obj.expect(CLOUD, SSH_KEY_KIND)?;
        Ok(self.key_listing(public_key).await?.found())
    }

    /// `POST /v2/account/keys` named [`project_key_name`]. DigitalOcean refuses a second
    /// key of the same value with 422 "SSH Key is already in use on your account":
    /// `Exists` (errors.rs), so the core observes again and adopts it.
    async fn create_shared(&self, obj: &SharedObject, public_key: &str) -> Result<SharedFound> {
        obj.expect(CLOUD, SSH_KEY_KIND)?;
        let name = project_key_name(self.settings.lineage.as_str(), public_key);
        let what = format!("register SSH key {name}");
        let body = json!({ "name": name, "public_key": public_key.trim() });
        let v = self
            .api
            .send(Method::POST, KEYS, &[], Some(&body))
            .await
            .map_err(|f| self.api.fail(&f, Call::other(&what)))?;
        Ok(SharedFound {
            id: field(&v, "/ssh_key/id", Value::as_i64, &what, "id")?.to_string(),
            name,
            ours: true,
        })
    }

    /// `DELETE /v2/account/keys/{id}` (404 = already gone). Droplets keep the key they
    /// were created with, so DigitalOcean documents no "in use" refusal.
    async fn delete_shared(&self, obj: &SharedObject, found: &SharedFound) -> Result<()> {
        obj.expect(CLOUD, SSH_KEY_KIND)?;
        let Ok(id) = found.id.trim().parse::<u64>() else {
            return Ok(());
        };
        let what = format!("delete SSH key {}", found.name);
        self.api
            .delete(
                &format!("{KEYS}/{id}"),
                errors::is_not_found,
                Call::other(&what),
            )
            .await
    }

    /// Powers a stopped droplet on: `GET /v2/droplets/{id}`, and when it is `off`,
    /// `POST /v2/droplets/{id}/actions` with `{"type": "power_on"}` (answered 201 with the
    /// `in-progress` action; the droplet turns `active` when it completes). A droplet
    /// already `new` or `active` is success without an action, and so is one whose
    /// power_on is still in progress (the repeated action is refused with 422; the
    /// droplet's actions, `GET /v2/droplets/{id}/actions`, show the one in progress). A
    /// droplet that no longer exists (404), or one `archive`d, is `Failed`: there is
    /// nothing to start.
    async fn start(&self, at: &Location, _vm_name: &str, instance_id: &str) -> Result<()> {
        self.power_on(&at.region, instance_id).await
    }
}
