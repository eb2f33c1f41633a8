//! Prime Intellect (cloud name `primeintellect`), a GPU marketplace, over its REST API
//! (`tests/fixtures/vendor-apis/primeintellect/prime-intellect-compute-api-openapi.fixed.yml`: the
//! FastAPI description as extracted by a third party, patched P1–P9 from the vendor CLI
//! `prime` 0.18.0, which settles what the description leaves open).
//!
//! Mapping onto the contract (design 5):
//!
//! - `plan`: `GET /api/v1/availability/gpus` (with `gpu_count` when asked; pages of 100
//!   until `totalCount`, as the CLI reads it). One offer per listed configuration whose
//!   GPU type matches the ask and whose `stockStatus` is not `Unavailable`: region = its
//!   data centre (`dataCenter`, else its `region`), id
//!   `primeintellect/<dc>/<provider>/<cloudId>` (`…/community` for the community cloud),
//!   price USD per hour for the whole pod: `prices.onDemand` on the secure cloud,
//!   `communityPrice` on the community cloud (the CLI shows either as the price of the
//!   configuration "`<count>x <gpu>`"). EUR prices are not offered. Spot asks see only
//!   `isSpot` configurations, others none of them.
//! - Shared object `ssh_key` (one per account, [`crate::provider::shared`]: keys belong to the user
//!   the API key authenticates, `APISSHKeyConfig.userId`, with no team or region, and a
//!   pod names any of them by `sshKeyId`): `observe_shared` finds the project key among
//!   `GET /api/v1/ssh_keys/` (offset pages) by its public key *value* (a key merely named
//!   like ours is never used; the user's own key found by value is used and never
//!   deleted); `create_shared` uploads it (`POST /api/v1/ssh_keys/`) under
//!   [`crate::provider::project_key_name`], or the next free `-<n>` when a key of another value
//!   holds that name; a 422 there is `Exists` (errors.rs: the description gives no
//!   conflict answer), so the core observes again and adopts it; `delete_shared` is
//!   `DELETE /api/v1/ssh_keys/{id}`, only for a key of the derived name.
//! - `prepare`: re-validates the offer (the same query narrowed to its `cloud_id` and
//!   `data_center_id`; gone or `Unavailable` → `Unavailable`), then takes the shared key
//!   the core prepared (without it, `InvalidRequest`).
//!   Returns `{"ssh_key_id"}`.
//! - `create`: `POST /api/v1/pods/` with the offer's `cloudId`, `gpuType`, `socket`,
//!   `gpuCount`, `dataCenterId`, `security`, the provider type and `sshKeyId`. Pods have
//!   no tags and the pod listing does not say where a pod runs, so the identity is the
//!   name `gpuprov-<vm>-<lineage8>-<dc>` ([`crate::provider::identity::located_name`]; pod names
//!   are letters, digits and dashes, per the CLI).
//! - `instances` (the listing `observe`, `observe_location` and `list` read):
//!   `GET /api/v1/pods/` (offset pages until `total_count`); the name is the identity,
//!   judged by the core's one rule under the located naming.
//!   Prime Intellect picks the SSH user and NAT port itself and reports them late:
//!   `sshConnection` is null (or `[null]`, or `[]`) while the pod boots, then
//!   `"<user>@<host> -p <port>"`, or a list of those (one per node; the first is used),
//!   or a bare `<host>` ([`ssh_endpoint`]). Until it appears the pod is reported without an
//!   endpoint and the core keeps waiting; an answer that cannot be read is `Failed`.
//! - `delete`: `DELETE /api/v1/pods/{id}` for the ids still listed (404 is success).
//!   `cleanup` has nothing to do (the project key is not the pod's, see `ssh_key` above:
//!   it goes after the project's last pod).
//!
//! No boot script and no firewall API: the capabilities declare neither, so the k3s layer
//! installs over SSH and reaches the API through `gpuprov tunnel` (the cluster access mode
//! is chosen from the capabilities). A boot script in the spec is ignored; `spec.ports`
//! is not applied (Prime Intellect maps ports itself, `primePortMapping`).
//!
//! Errors ([`errors`]): FastAPI bodies; a 422 is `InvalidRequest`, never capacity.
//!
//! Credentials: the API key from `PRIME_API_KEY`, else `api_key` in `~/.prime/config.json`
//! (the vendor CLI's, `prime_cli/core/config.py`). Sent as `Authorization: Bearer`
//! (`HTTPBearer`), never written to state, logs or errors.
//!
//! Rate limits: not published (SOURCES.md). Two concurrent calls; a 429 is `Transient` with
//! `Retry-After`.

mod api;
mod errors;
mod offers;
mod pods;
#[cfg(test)]
mod tests;

use std::path::Path;

use async_trait::async_trait;
use reqwest::Method;
use serde_json::{json, Value};

pub use api::PortMapping;
use api::{Availability, GpuAvailability, Pod, Pods, SshKey, SshKeys};
pub use errors::CLASSIFIER;
pub use offers::{gpu_matches, gpu_model};
use offers::{offer_id, offers_for, region_of};
pub use pods::ssh_endpoint;
use pods::{seen_at, status_of};

use crate::provider::identity::located_name;
use crate::provider::kit::keys::{self, KeyListing, ListedKey};
use crate::provider::kit::paginate::{self, Cursor, Next};
use crate::provider::kit::{self, Adapter, Auth, Call, RestClient};
use crate::provider::{
    Capabilities, CloudProvider, ErrorKind, Feature, InstanceSpec, Lineage, Location, Offer,
    ProviderError, ResourceRequest, Result, Secret, Seen, SharedFound, SharedObject,
};

// The kind of the project key, the one shared object this cloud declares
// (`shared::declared`): one per account.
use crate::provider::shared::SSH_KEY as SSH_KEY_KIND;

/// The cloud name.
pub const CLOUD: &str = "primeintellect";
/// The API base URL when neither config nor environment overrides it (`servers[0]`).
pub const DEFAULT_ENDPOINT: &str = "https://api.primeintellect.ai";
/// Environment variable overriding the endpoint (wins over `[cloud.primeintellect] endpoint`).
pub const ENDPOINT_ENV: &str = "GPUPROV_PRIMEINTELLECT_ENDPOINT";
/// Environment variable holding the API key (the vendor CLI reads it too).
pub const API_KEY_ENV: &str = "PRIME_API_KEY";
/// The vendor CLI's configuration file, relative to the home directory.
pub const CONFIG_FILE: &str = ".prime/config.json";
/// Login user when `sshConnection` names none (the description's example `root@…`).
pub const SSH_USER: &str = "root";
/// SSH port when neither `sshConnection` nor the port mapping names one (the CLI's default).
pub const SSH_PORT: u16 = 22;
/// Items per availability and listing page (the most the API allows).
pub const PAGE_SIZE: u32 = 100;

/// The GPU types the API knows (`GPUType`), so an ask for a model none of them is can be
/// told apart from one that is only out of stock.
pub const GPU_TYPES: &[&str] = &[
    "CPU_NODE",
    "A10_24GB",
    "A100_80GB",
    "A100_40GB",
    "A30_24GB",
    "A40_48GB",
    "B200_180GB",
    "B300_262GB",
    "GB200",
    "GB300",
    "RTX3070_8GB",
    "RTX3080_10GB",
    "RTX3080Ti_12GB",
    "RTX3090_24GB",
    "RTX3090Ti_24GB",
    "RTX4070Ti_12GB",
    "RTX4080_16GB",
    "RTX4080Ti_16GB",
    "RTX4090_24GB",
    "RTX5090_32GB",
    "H100_80GB",
    "H200_96GB",
    "GH200_96GB",
    "H200_141GB",
    "GH200_480GB",
    "GH200_624GB",
    "L4_24GB",
    "L40_48GB",
    "L40S_48GB",
    "RTX4000_8GB",
    "RTX5000_16GB",
    "RTX6000_24GB",
    "RTX8000_48GB",
    "RTX2000Ada_16GB",
    "RTX4000Ada_20GB",
    "RTX5000Ada_32GB",
    "RTX6000Ada_48GB",
    "A2000_6GB",
    "A4000_16GB",
    "A4500_20GB",
    "A5000_24GB",
    "A6000_48GB",
    "V100_16GB",
    "V100_32GB",
    "P100_16GB",
    "T4_16GB",
    "P4_8GB",
    "P40_24GB",
    "RTX_PRO_6000B_96GB",
];

/// Configuration of the Prime Intellect adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrimeIntellectSettings {
    /// API base URL override; `None` means [`DEFAULT_ENDPOINT`].
    pub endpoint: Option<String>,
    /// `None` when no key was found; calls then fail with `Credentials`.
    pub api_key: Option<Secret>,
    /// Where the key was found, or every place looked at (never the key).
    pub key_source: String,
    /// The state's lineage: `observe` only sees pods named with it.
    pub lineage: Lineage,
}

/// The API key in the CLI's `config.json` text: its string `api_key`.
pub fn api_key_from_config(text: &str) -> Option<String> {
    kit::credentials::json_field(text, "api_key")
}

/// The key and where it came from: `env_value` (of `PRIME_API_KEY`) when not blank, else
/// `<home>/.prime/config.json`. Without a key, the place says everywhere looked.
pub fn find_api_key(env_value: Option<String>, home: Option<&Path>) -> (Option<Secret>, String) {
    let file = home.map(|h| h.join(CONFIG_FILE));
    kit::settings::find_key(API_KEY_ENV, env_value, file.as_deref(), api_key_from_config)
}

impl PrimeIntellectSettings {
    /// Settings from `[cloud.primeintellect] endpoint` and the environment: endpoint
    /// precedence `GPUPROV_PRIMEINTELLECT_ENDPOINT` > `endpoint` > [`DEFAULT_ENDPOINT`];
    /// the key from [`find_api_key`] with the user's home directory.
    pub fn from_env_and_config(endpoint: Option<String>, lineage: Lineage) -> Self {
        let home = dirs::home_dir();
        let (api_key, key_source) = find_api_key(std::env::var(API_KEY_ENV).ok(), home.as_deref());
        PrimeIntellectSettings {
            endpoint: crate::provider::endpoint_from(ENDPOINT_ENV, endpoint),
            api_key,
            key_source,
            lineage,
        }
    }
}

/// The Prime Intellect adapter. Construction does no I/O.
pub struct PrimeIntellectProvider {
    settings: PrimeIntellectSettings,
    api: RestClient,
    adapter: Adapter,
}

/// What follows page `page` (1-based, [`PAGE_SIZE`] items a page) that held `got` items,
/// of `total` in all: the next page while items remain (the CLI reads until it has
/// `totalCount`), or, without a total, while pages come back full.
fn next_page(page: u32, got: usize, total: Option<u64>) -> Next {
    let seen = u64::from(page - 1) * u64::from(PAGE_SIZE) + got as u64;
    match total {
        Some(t) if seen < t && got > 0 => Next::Page(page + 1),
        None if got as u32 >= PAGE_SIZE => Next::Page(page + 1),
        _ => Next::Done,
    }
}

fn page_number(c: &Cursor) -> u32 {
    match c {
        Cursor::Page(n) => *n,
        _ => 1,
    }
}

impl PrimeIntellectProvider {
    /// An adapter for `settings`. Never fails and does no I/O.
    pub fn new(settings: PrimeIntellectSettings) -> PrimeIntellectProvider {
        let endpoint = settings.endpoint.as_deref();
        let (adapter, credential) = Adapter::new(CLOUD, endpoint, Self::default_capabilities())
            .with_lineage(&settings.lineage)
            .with_key(settings.api_key.as_ref(), &settings.key_source);
        let missing = format!(
            "no Prime Intellect API key: set {API_KEY_ENV} or run `prime login` (looked in: {})",
            settings.key_source
        );
        let base = endpoint.unwrap_or(DEFAULT_ENDPOINT);
        let api = RestClient::new(base, Auth::Bearer, credential, missing, &CLASSIFIER)
            .gated(adapter.gate())
            .with_error_decoder(errors::decode);
        PrimeIntellectProvider {
            settings,
            api,
            adapter,
        }
    }

    /// Replaces the declared capabilities (tests use short timeouts and poll intervals).
    pub fn with_capabilities(mut self, caps: Capabilities) -> PrimeIntellectProvider {
        self.adapter.capabilities = caps;
        self
    }

    /// GPUs, spot and Kubernetes over SSH: no boot script and no firewall API, so the
    /// cluster's API is reached through the SSH tunnel. Marketplace pods can take long to
    /// provision: 30 minutes to boot. Two concurrent calls; no `rate_limits` declared
    /// (the vendor publishes none: SOURCES.md, Prime Intellect).
    pub fn default_capabilities() -> Capabilities {
        use Feature::*;
        Capabilities {
            boot_timeout: std::time::Duration::from_secs(30 * 60),
            max_concurrency: 2,
            ..kit::adapter::vm_capabilities(&[Gpu, Kubernetes, Spot, SharedObjects])
        }
    }

    pub fn settings(&self) -> &PrimeIntellectSettings {
        &self.settings
    }

    /// Every configuration listed for `filters` (pages of [`PAGE_SIZE`]).
    async fn availability(
        &self,
        filters: &[(&'static str, String)],
    ) -> Result<Vec<GpuAvailability>> {
        paginate::all_pages("primeintellect: list GPU availability", |c| {
            let page = page_number(&c);
            let mut query = filters.to_vec();
            query.push(("page", page.to_string()));
            query.push(("page_size", PAGE_SIZE.to_string()));
            async move {
                let a: Availability = self
                    .api
                    .get(
                        "/api/v1/availability/gpus",
                        &query,
                        Call::other("list GPU availability"),
                    )
                    .await?;
                let next = next_page(page, a.items.len(), a.total_count);
                Ok((a.items, next))
            }
        })
        .await
    }

    /// Every pod of the account (offset pages of [`PAGE_SIZE`]).
    async fn pods(&self) -> Result<Vec<Pod>> {
        paginate::all_pages("primeintellect: list pods", |c| {
            let page = page_number(&c);
            let query = [
                ("offset", ((page - 1) * PAGE_SIZE).to_string()),
                ("limit", PAGE_SIZE.to_string()),
            ];
            async move {
                let p: Pods = self
                    .api
                    .get("/api/v1/pods/", &query, Call::other("list pods"))
                    .await?;
                let next = next_page(page, p.data.len(), p.total_count);
                Ok((p.data, next))
            }
        })
        .await
    }

    /// The availability query of an ask: `gpu_count` when asked.
    fn filters(gpu_count: u32) -> Vec<(&'static str, String)> {
        if gpu_count > 0 {
            vec![("gpu_count", gpu_count.to_string())]
        } else {
            vec![]
        }
    }

    /// Every SSH key of the account (offset pages of [`PAGE_SIZE`]).
    async fn ssh_keys(&self) -> Result<Vec<SshKey>> {
        paginate::all_pages("primeintellect: list SSH keys", |c| {
            let page = page_number(&c);
            let query = [
                ("offset", ((page - 1) * PAGE_SIZE).to_string()),
                ("limit", PAGE_SIZE.to_string()),
            ];
            async move {
                let k: SshKeys = self
                    .api
                    .get("/api/v1/ssh_keys/", &query, Call::other("list SSH keys"))
                    .await?;
                let next = next_page(page, k.data.len(), k.total_count);
                Ok((k.data, next))
            }
        })
        .await
    }

    /// `GET /api/v1/ssh_keys/` (all pages) read for the project key `public_key` (names
    /// are unique).
    async fn key_listing(&self, public_key: &str) -> Result<KeyListing> {
        let listed = self.ssh_keys().await?.into_iter();
        let keys = listed.map(|k| ListedKey::new(k.id, k.name, k.public_key));
        Ok(KeyListing::new(
            CLOUD,
            self.settings.lineage.as_str(),
            public_key,
            keys,
        ))
    }

    /// The pod name of `vm_name` in data centre `region`.
    fn pod_name(&self, vm_name: &str, region: &str) -> String {
        located_name(vm_name, &self.settings.lineage, region)
    }
}

/// The offer's field `name` from its `detail`; absent → `InvalidRequest`.
fn detail<'a>(offer: &'a Offer, name: &str) -> Result<&'a str> {
    offer.detail[name].as_str().ok_or_else(|| {
        ProviderError::new(
            ErrorKind::InvalidRequest,
            format!("primeintellect offer {} has no {name}", offer.id),
        )
    })
}

#[async_trait]
impl CloudProvider for PrimeIntellectProvider {
    /// Name, endpoint, capabilities ([`PrimeIntellectProvider::default_capabilities`]) and
    /// where the key was found ([`find_api_key`]).
    fn adapter(&self) -> &Adapter {
        &self.adapter
    }

    /// Offers from the live availability (see the module docs). An empty list means "no
    /// stock now". Errors: a GPU model that is no `GPUType` of the API and is not listed
    /// → `InvalidRequest`.
    async fn plan(&self, req: &ResourceRequest) -> Result<Vec<Offer>> {
        // The API's `gpu_count` filter is exact: a minimum is filtered here instead.
        let exact = if req.gpu_count_at_least {
            0
        } else {
            req.gpu_count
        };
        let items = self.availability(&Self::filters(exact)).await?;
        if let Some(want) = &req.gpu {
            let known = GPU_TYPES.iter().any(|t| gpu_matches(want, t))
                || items.iter().any(|g| gpu_matches(want, &g.gpu_type));
            if !known {
                let models = GPU_TYPES.iter().map(|t| gpu_model(t).to_string());
                let have: std::collections::BTreeSet<String> = models.collect();
                return Err(ProviderError::new(
                    ErrorKind::InvalidRequest,
                    format!(
                        "Prime Intellect has no GPU type {want}; it knows: {}",
                        have.into_iter().collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
        }
        Ok(offers_for(&items, req))
    }

    /// Re-validates the offer (gone or out of stock → `Unavailable`), then takes the shared
    /// key the core prepared ([`keys::prepared_key`]; missing → `InvalidRequest`). Returns
    /// `{"ssh_key_id"}`.
    async fn prepare(&self, offer: &Offer, spec: &InstanceSpec) -> Result<Value> {
        let key = keys::prepared_key(CLOUD, spec)?.id.clone();
        let cloud_id = detail(offer, "cloud_id")?;
        let mut filters = Self::filters(offer.gpu_count);
        filters.push(("cloud_id", cloud_id.to_string()));
        if let Some(dc) = offer.detail["data_center"].as_str() {
            filters.push(("data_center_id", dc.to_string()));
        }
        let items = self.availability(&filters).await?;
        let still = items.iter().any(|g| {
            region_of(g).is_some_and(|r| offer_id(g, r) == offer.id)
                && g.stock_status.as_deref() != Some("Unavailable")
        });
        if !still {
            return Err(ProviderError::new(
                ErrorKind::Unavailable,
                format!(
                    "primeintellect: {} is no longer available in {}",
                    cloud_id, offer.location.region
                ),
            ));
        }
        Ok(json!({ "ssh_key_id": key }))
    }

    /// `POST /api/v1/pods/` (see the module docs). Returns the pod id.
    ///
    /// The API takes no idempotency token (`spec.client_token` is unused): the core's
    /// observe-before-create finds a created pod by its name.
    async fn create(&self, offer: &Offer, prepared: &Value, spec: &InstanceSpec) -> Result<String> {
        crate::provider::check_spec_lineage(CLOUD, &self.settings.lineage, spec)?;
        let key = kit::offer::prepared(prepared, "ssh_key_id", Value::as_str)?;
        let region = &offer.location.region;
        let mut pod = json!({
            "name": self.pod_name(&spec.vm_name, region),
            "cloudId": detail(offer, "cloud_id")?,
            "gpuType": detail(offer, "gpu_type")?,
            "socket": detail(offer, "socket")?,
            "gpuCount": offer.gpu_count,
            "sshKeyId": key,
        });
        if let Some(dc) = offer.detail["data_center"].as_str() {
            pod["dataCenterId"] = json!(dc);
        }
        if let Some(s) = offer.detail["security"].as_str() {
            pod["security"] = json!(s);
        }
        if let Some(image) = spec.image.as_deref().filter(|s| !s.trim().is_empty()) {
            pod["image"] = json!(image);
        }
        if let Some(gb) = spec.disk_gb.filter(|g| *g > 0) {
            pod["diskSize"] = json!(gb);
        }
        let body = json!({ "pod": pod, "provider": { "type": detail(offer, "provider")? } });
        let what = format!("create a pod on {} in {region}", offer.instance_type);
        let call = Call::named(errors::CREATE, &what).in_region(region);
        let p: Pod = self.api.post("/api/v1/pods/", &body, call).await?;
        Ok(p.id)
    }

    /// One paginated `GET /api/v1/pods/` (the account's pods; it takes only `offset` and
    /// `limit`, `prime-intellect-compute-api-openapi.yml` in `vendor-apis/primeintellect`),
    /// every pod not terminated, shown at `at` ([`seen_at`]): the name says where it runs.
    async fn instances(&self, at: &Location, _only_vm: Option<&str>) -> Result<Vec<Seen>> {
        let pods = self.pods().await?;
        Ok(pods.iter().filter_map(|p| seen_at(p, &at.region)).collect())
    }

    /// `DELETE /api/v1/pods/{id}` for those of `instance_ids` still listed (not
    /// `TERMINATED`); a 404 is success.
    async fn delete(&self, _at: &Location, _vm_name: &str, instance_ids: &[String]) -> Result<()> {
        if instance_ids.is_empty() {
            return Ok(());
        }
        let alive = |p: &Pod| status_of(p).is_some();
        let listed = kit::listing::still_listed(self.pods().await?, instance_ids, |p| &p.id, alive);
        for id in listed.into_iter().map(|p| p.id) {
            let what = format!("delete pod {id}");
            let path = format!("/api/v1/pods/{id}");
            match self.api.send(Method::DELETE, &path, &[], None).await {
                Ok(_) => {}
                Err(f) if f.is_not_found() => {}
                Err(f) => return Err(self.api.fail(&f, Call::other(&what))),
            }
        }
        Ok(())
    }

    /// The project key among `GET /api/v1/ssh_keys/` (every page), found by *value*
    /// (compared without the comment), never by name; `None` when it is not there.
    async fn observe_shared(
        &self,
        obj: &SharedObject,
        public_key: &str,
    ) -> Result<Option<SharedFound>> {
        obj.expect(CLOUD, SSH_KEY_KIND)?;
        Ok(self.key_listing(public_key).await?.found())
    }

    /// `POST /api/v1/ssh_keys/` `{name, publicKey}` under [`project_key_name`](crate::provider::project_key_name), or the
    /// first free `-<n>` when a key of another value holds it. A 422 (the description's
    /// only refusal) is `Exists`: observed again.
    async fn create_shared(&self, obj: &SharedObject, public_key: &str) -> Result<SharedFound> {
        obj.expect(CLOUD, SSH_KEY_KIND)?;
        let name = self.key_listing(public_key).await?.name_to_register()?;
        let what = format!("upload SSH key {name}");
        let body = json!({ "name": name, "publicKey": public_key.trim() });
        let call = Call::named(errors::REGISTER_KEY, &what);
        let k: SshKey = self.api.post("/api/v1/ssh_keys/", &body, call).await?;
        Ok(keys::registered(k.id, Some(k.name), name))
    }

    /// `DELETE /api/v1/ssh_keys/{id}` (404 = already gone). Pods keep the key they were
    /// created with.
    async fn delete_shared(&self, obj: &SharedObject, found: &SharedFound) -> Result<()> {
        obj.expect(CLOUD, SSH_KEY_KIND)?;
        let what = format!("delete SSH key {}", found.name);
        self.api
            .delete(
                &format!("/api/v1/ssh_keys/{}", found.id),
                |f| f.is_not_found(),
                Call::other(&what),
            )
            .await
    }

    /// Nothing to delete: pods have no side resources here, and the project key is shared
    /// by the project's pods.
    async fn cleanup(&self, _at: &Location, _vm_name: &str) -> Result<()> {
        Ok(())
    }
}
