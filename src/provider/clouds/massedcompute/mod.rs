//! Massed Compute (cloud name `massedcompute`), over its VM API v1 (the vendor's OpenAPI
//! 1.0.0, `tests/fixtures/vendor-apis/massedcompute/openapi-v1.0.0.mock-fixed.yaml`; field names
//! confirmed by the vendor's MCP server `tools.json`, behaviour the description leaves open
//! by brevdev/cloud's client, `v1/providers/massedcompute/`).
//!
//! Mapping onto the contract (design 5):
//!
//! - `plan`: `GET /gpu-inventory`. Products match the ask by GPU model (the description's
//!   `Nx MODEL`, or the product name's `gpu_<N>x_<model>`) and exact count. When the ask
//!   names no region (or names `any`), one offer per product with capacity in region
//!   `any` (the API's own placement: the launch's `regionName` "Set value equal to
//!   'any'"); for each region the ask names, one offer where the product lists that
//!   region in `regions_with_capacity_available`. Price: `price_cents_per_hour / 100` USD
//!   per hour for the whole machine. Id `massedcompute/<region>/<product>`. No spot.
//! - Shared object `ssh_key` (one per account, [`crate::provider::shared`]: `GET /ssh-keys`
//!   "retrieve SSH keys associated with the account", and a launch names any of them):
//!   `observe_shared` finds the project key among `GET /ssh-keys` by its public key
//!   *value*, among keys whose name no key of another value shares (the launch takes key
//!   *names*, so such a name could hand the machine the other key); a key merely named
//!   like ours is never used, and the user's own key found by value is used and never
//!   deleted. `create_shared` registers it (`POST /ssh-keys`) under
//!   [`crate::provider::project_key_name`] with spaces for dashes (brevdev/cloud `instance.go`: "SSH
//!   keys cannot contain punctuation other than spaces"), or the next free `<name> <n>`;
//!   a 409 there is `Exists` (errors.rs: the description documents no error), so the core
//!   observes again and adopts it. `delete_shared` is `DELETE /ssh-keys/{id}`, only for a
//!   key of the derived name.
//! - `prepare`: re-checks capacity (gone → `Unavailable`); resolves the image (`GET
//!   /images`: the VM's `image` as an id or a name, else "Ubuntu Server 22.04 w/ drivers",
//!   brevdev's default); takes the shared key the core prepared (without it,
//!   `InvalidRequest`). Returns `{"image_id", "ssh_key_name"}`.
//! - `create`: `POST /instance/launch` with `imageId`, `productName`, `regionName` (the
//!   offer's region, `any` unless pinned), `instanceName` and `sshKeys` (key *names*, as
//!   the API takes them). Massed Compute has no tags or labels and its listing does not say
//!   where an instance runs, so the identity is the name: `gpuprov-<vm>-<lineage8>` in
//!   region `any`, `gpuprov-<vm>-<lineage8>-<region>` when pinned
//!   ([`crate::provider::identity::located_name`]).
//! - `instances` (the listing `observe`, `observe_location` and `list` read):
//!   `GET /instance`; the name is the identity (judged by the core's one rule, under
//!   the location's naming), `terminated` / `deleted` are gone.
//! - `delete`: `POST /instance/terminate` for the ids still listed (an unknown id is
//!   success without a call; a 404 too). `cleanup` has nothing to do: instances have no
//!   side resources, and the project key is not the machine's (see `ssh_key` above: it
//!   goes after the project's last machine).
//!
//! No boot script and no firewall API: the capabilities declare neither, so the k3s layer
//! installs over SSH and reaches the API through `gpuprov tunnel` (a boot script in the
//! spec is ignored; the launch's `command` is not used). `spec.ports` is not applied:
//! Massed Compute has no API to open ports.
//!
//! Errors ([`errors`]): undocumented by the vendor; classified by brevdev/cloud's rules.
//!
//! Credentials: the API token from `MASSED_COMPUTE_API_KEY`, else `apiKey` in the vendor's
//! MCP server's `config.json` (`massed-compute/config.json` in the user's configuration
//! directory: `$XDG_CONFIG_HOME` or `~/.config` on Linux; repo
//! Massed-Compute/massed-compute-mcp, `config.py`). Sent as `Authorization: Bearer` (the
//! description's `bearerAuth`), never written to state, logs or errors.
//!
//! SSH: host `ip`, user `username` (else `ubuntu`), port 22 (the listing gives none;
//! brevdev uses 22). A listed `password` is never read.
//!
//! Rate limits: none documented. The adapter declares two concurrent calls and brevdev's
//! 10 s poll interval; a 429 is `Transient` with `Retry-After`.

mod api;
mod errors;
mod instances;
#[cfg(test)]
mod tests;

use std::path::Path;

use async_trait::async_trait;
use reqwest::Method;
use serde_json::{json, Value};

use api::{Images, Instance, Inventory, Launched, PostedKey, Product, Running, SshKey, SshKeys};
pub use errors::CLASSIFIER;
use instances::{seen_at, status_of};

use crate::provider::identity::located_name;
use crate::provider::kit::keys::{self, KeyListing, ListedKey};
use crate::provider::kit::{self, gpu, Adapter, Auth, Call, RestClient};
use crate::provider::{
    object_name, Capabilities, CloudProvider, ErrorKind, Feature, InstanceSpec, Lineage, Location,
    Offer, ProviderError, ResourceRequest, Result, Seen, SharedFound, SharedObject,
};

// The kind of the project key, the one shared object this cloud declares
// (`shared::declared`): one per account.
use crate::provider::shared::SSH_KEY as SSH_KEY_KIND;

/// The cloud name.
pub const CLOUD: &str = "massedcompute";
/// The API base URL when neither config nor environment overrides it (`servers[0]`).
pub const DEFAULT_ENDPOINT: &str = "https://vm.massedcompute.com/api/v1";
/// Environment variable overriding the endpoint (wins over `[cloud.massedcompute] endpoint`).
pub const ENDPOINT_ENV: &str = "GPUPROV_MASSEDCOMPUTE_ENDPOINT";
/// Environment variable holding the API token (the vendor's MCP server reads it too).
pub const API_KEY_ENV: &str = "MASSED_COMPUTE_API_KEY";
/// The vendor MCP server's configuration file, relative to the configuration directory.
pub const CONFIG_FILE: &str = "massed-compute/config.json";
/// The region that lets Massed Compute place the machine (launch `regionName`).
pub const ANY_REGION: &str = "any";
/// The image when the VM names none (brevdev/cloud `instance.go`, `defaultImageName`).
pub const DEFAULT_IMAGE: &str = "Ubuntu Server 22.04 w/ drivers";
/// SSH port (the listing gives none).
pub const SSH_PORT: u16 = 22;
/// Login user when the listing gives no `username`.
pub const SSH_USER: &str = "ubuntu";

/// Configuration of the Massed Compute adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MassedComputeSettings {
    /// API base URL override; `None` means [`DEFAULT_ENDPOINT`].
    pub endpoint: Option<String>,
    /// `None` when no token was found; calls then fail with `Credentials`.
    pub api_key: Option<crate::provider::Secret>,
    /// Where the token was found, or every place looked at (never the token).
    pub key_source: String,
    /// The state's lineage: `observe` only sees instances named with it.
    pub lineage: Lineage,
}

/// The API token in the MCP server's `config.json` text: its string `apiKey`.
pub fn api_key_from_config(text: &str) -> Option<String> {
    kit::credentials::json_field(text, "apiKey")
}

/// The token and where it came from: `env_value` (of `MASSED_COMPUTE_API_KEY`) when not
/// blank, else `<config_dir>/massed-compute/config.json`. Without a token, the place says
/// everywhere looked.
pub fn find_api_key(
    env_value: Option<String>,
    config_dir: Option<&Path>,
) -> (Option<crate::provider::Secret>, String) {
    let file = config_dir.map(|d| d.join(CONFIG_FILE));
    kit::settings::find_key(API_KEY_ENV, env_value, file.as_deref(), api_key_from_config)
}

impl MassedComputeSettings {
    /// Settings from `[cloud.massedcompute] endpoint` and the environment: endpoint
    /// precedence `GPUPROV_MASSEDCOMPUTE_ENDPOINT` > `endpoint` > [`DEFAULT_ENDPOINT`]; the
    /// token from [`find_api_key`] with the user's configuration directory.
    pub fn from_env_and_config(endpoint: Option<String>, lineage: Lineage) -> Self {
        let dir = dirs::config_dir();
        let (api_key, key_source) = find_api_key(std::env::var(API_KEY_ENV).ok(), dir.as_deref());
        MassedComputeSettings {
            endpoint: crate::provider::endpoint_from(ENDPOINT_ENV, endpoint),
            api_key,
            key_source,
            lineage,
        }
    }
}

/// The Massed Compute adapter. Construction does no I/O.
pub struct MassedComputeProvider {
    settings: MassedComputeSettings,
    api: RestClient,
    adapter: Adapter,
}

/// The GPU model and count of a product: `Nx MODEL` of its description (`8x H100 SXM5` →
/// (`H100 SXM5`, 8)), else the product name's `gpu_<N>x_<model>` (`gpu_1x_l40` → (`L40`,
/// 1)). `None` for a product that names no GPU.
pub fn gpu_of(product: &str, description: &str) -> Option<(String, u32)> {
    if let Some((n, model)) = description.trim().split_once("x ") {
        if let Ok(n) = n.trim().parse::<u32>() {
            if !model.trim().is_empty() {
                return Some((model.trim().to_string(), n));
            }
        }
    }
    let (n, model) = name_gpu(product)?;
    Some((model.to_uppercase(), n))
}

/// `(count, model)` of a product name `gpu_<N>x_<model>[_…]`.
fn name_gpu(product: &str) -> Option<(u32, &str)> {
    let mut parts = product.split('_');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("gpu"), Some(n), Some(model)) => Some((n.strip_suffix('x')?.parse().ok()?, model)),
        _ => None,
    }
}

/// Whether product `name` fits the ask: the GPU model (the description's, or the name's
/// token, compared with [`gpu::same_model`]: `A6000` names `gpu_1x_a6000` described as
/// `1x RTX A6000`) and the exact count, when asked.
fn product_matches(name: &str, p: &Product, req: &ResourceRequest) -> bool {
    let Some((model, count)) = gpu_of(name, &p.instance_type.description) else {
        return req.gpu.is_none() && req.gpu_count == 0;
    };
    let model_ok = req.gpu.as_ref().is_none_or(|want| {
        gpu::same_model(want, &model)
            || name_gpu(name).is_some_and(|(_, m)| gpu::same_model(want, m))
    });
    model_ok && gpu::count_fits(req, count)
}

/// Whether product `p` can be launched in `region` now: any region with capacity for
/// `any`, else the region listed by exact name.
fn has_capacity(p: &Product, region: &str) -> bool {
    if region.eq_ignore_ascii_case(ANY_REGION) {
        p.capacity_available.is_some_and(|c| c > 0) || !p.regions_with_capacity_available.is_empty()
    } else {
        p.regions_with_capacity_available
            .iter()
            .any(|r| r.name == region)
    }
}

/// The regions an ask's offers are in: `any` when it names none (or names `any`), and
/// every region it names.
fn asked_regions(req: &ResourceRequest) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    if req.regions.is_empty()
        || req
            .regions
            .iter()
            .any(|r| r.eq_ignore_ascii_case(ANY_REGION))
    {
        out.push(ANY_REGION.to_string());
    }
    for r in &req.regions {
        if !r.eq_ignore_ascii_case(ANY_REGION) && !out.contains(r) {
            out.push(r.clone());
        }
    }
    out
}

/// Offers of `inventory` for the ask (see the module docs). Unordered: the core orders.
fn offers_for(inventory: &Inventory, req: &ResourceRequest) -> Vec<Offer> {
    let mut offers = Vec::new();
    for (name, p) in &inventory.gpu_inventory {
        if !product_matches(name, p, req) {
            continue;
        }
        let Some(cents) = p.instance_type.price_cents_per_hour else {
            continue;
        };
        let gpu = gpu_of(name, &p.instance_type.description);
        for region in asked_regions(req) {
            if !has_capacity(p, &region) {
                continue;
            }
            offers.push(Offer {
                gpu: gpu.as_ref().map(|g| g.0.clone()),
                gpu_count: gpu.as_ref().map(|g| g.1).unwrap_or(0),
                detail: json!({ "description": p.instance_type.description }),
                facts: Default::default(),
                ..kit::offer::on_demand(CLOUD, &region, name, cents as f64 / 100.0)
            });
        }
    }
    offers
}

impl MassedComputeProvider {
    /// An adapter for `settings`. Never fails and does no I/O.
    pub fn new(settings: MassedComputeSettings) -> MassedComputeProvider {
        let endpoint = settings.endpoint.as_deref();
        let (adapter, credential) = Adapter::new(CLOUD, endpoint, Self::default_capabilities())
            .with_lineage(&settings.lineage)
            .with_key(settings.api_key.as_ref(), &settings.key_source);
        let missing = format!(
            "no Massed Compute API token: set {API_KEY_ENV} (looked in: {})",
            settings.key_source
        );
        let base = endpoint.unwrap_or(DEFAULT_ENDPOINT);
        let api = RestClient::new(base, Auth::Bearer, credential, missing, &CLASSIFIER)
            .gated(adapter.gate())
            .with_error_decoder(errors::decode);
        MassedComputeProvider {
            settings,
            api,
            adapter,
        }
    }

    /// Replaces the declared capabilities (tests use short timeouts and poll intervals).
    pub fn with_capabilities(mut self, caps: Capabilities) -> MassedComputeProvider {
        self.adapter.capabilities = caps;
        self
    }

    /// GPUs and Kubernetes over SSH; no boot script, no firewall (so the cluster is reached
    /// through the SSH tunnel), no spot, no start. Two concurrent calls; no `rate_limits`
    /// declared (`massedcompute/openapi-v1.0.0.yaml` documents none) and a 10 s poll (brevdev/cloud's `GetInstancePollTime`).
    pub fn default_capabilities() -> Capabilities {
        Capabilities {
            max_concurrency: 2,
            ..kit::adapter::vm_capabilities(&[
                Feature::Gpu,
                Feature::Kubernetes,
                Feature::SharedObjects,
            ])
        }
    }

    pub fn settings(&self) -> &MassedComputeSettings {
        &self.settings
    }

    /// The instance name of `vm_name` in `region` (see the module docs).
    fn instance_name(&self, vm_name: &str, region: &str) -> String {
        let lineage = &self.settings.lineage;
        if region.eq_ignore_ascii_case(ANY_REGION) {
            object_name(vm_name, lineage)
        } else {
            located_name(vm_name, lineage, region)
        }
    }

    async fn inventory(&self) -> Result<Inventory> {
        let call = Call::other("list the GPU inventory");
        self.api.get("/gpu-inventory", &[], call).await
    }

    async fn listing(&self) -> Result<Vec<Instance>> {
        let r: Running = self
            .api
            .get("/instance", &[], Call::other("list instances"))
            .await?;
        Ok(r.running_instances)
    }

    /// The image id for `spec.image`: a number is taken as an id; a name is looked up in
    /// `GET /images` (ignoring case), as is [`DEFAULT_IMAGE`] when the VM names none.
    /// Errors: no such image → `InvalidRequest`.
    async fn image_id(&self, image: Option<&str>) -> Result<i64> {
        let image = image.map(str::trim).filter(|s| !s.is_empty());
        if let Some(id) = image.and_then(|s| s.parse::<i64>().ok()).filter(|i| *i > 0) {
            return Ok(id);
        }
        let name = image.unwrap_or(DEFAULT_IMAGE);
        let list: Images = self
            .api
            .get("/images", &[], Call::other("list images"))
            .await?;
        list.images
            .iter()
            .find(|i| i.vm_image_name.trim().eq_ignore_ascii_case(name))
            .map(|i| i.vm_image_id)
            .ok_or_else(|| {
                let have: Vec<&str> = list
                    .images
                    .iter()
                    .map(|i| i.vm_image_name.as_str())
                    .collect();
                ProviderError::new(
                    ErrorKind::InvalidRequest,
                    format!(
                        "massedcompute: no image named {name:?}; it has: {}",
                        have.join(", ")
                    ),
                )
            })
    }

    /// `GET /ssh-keys` read for the project key `public_key`. Names are unique and take
    /// no dashes, so the derived name is spelled with spaces. A key whose name another
    /// key of another value shares is listed without its value, so it is never found by
    /// value: the launch names keys, and such a name could give the machine the other key.
    async fn key_listing(&self, public_key: &str) -> Result<KeyListing> {
        let call = Call::other("list SSH keys");
        let all = self
            .api
            .get::<SshKeys>("/ssh-keys", &[], call)
            .await?
            .ssh_keys;
        let ambiguous = |k: &SshKey| {
            let value = keys::key_value(&k.public_key);
            all.iter()
                .any(|o| o.name == k.name && keys::key_value(&o.public_key) != value)
        };
        let listed = all.iter().map(|k| {
            let value = if ambiguous(k) { "" } else { &k.public_key };
            ListedKey::new(&k.id, k.name.clone(), value.to_string())
        });
        let lineage = self.settings.lineage.as_str();
        Ok(KeyListing::new(CLOUD, lineage, public_key, listed).spelled_with(' '))
    }
}

#[async_trait]
impl CloudProvider for MassedComputeProvider {
    /// Name, endpoint, capabilities ([`MassedComputeProvider::default_capabilities`]) and
    /// where the token was found ([`find_api_key`]).
    fn adapter(&self) -> &Adapter {
        &self.adapter
    }

    /// Offers from `GET /gpu-inventory` (see the module docs). An empty list means "no
    /// capacity now". Errors: a spot ask, or no product with that GPU model and count →
    /// `InvalidRequest`.
    async fn plan(&self, req: &ResourceRequest) -> Result<Vec<Offer>> {
        kit::offer::refuse_spot(req, "Massed Compute has no spot instances")?;
        let inventory = self.inventory().await?;
        if !inventory
            .gpu_inventory
            .iter()
            .any(|(n, p)| product_matches(n, p, req))
        {
            let have = inventory.gpu_inventory.iter().filter_map(|(n, p)| {
                gpu_of(n, &p.instance_type.description).map(|(m, c)| format!("{m} x{c}"))
            });
            return Err(gpu::no_type_for("Massed Compute has no product", req, have));
        }
        Ok(offers_for(&inventory, req))
    }

    /// Re-checks capacity for the offer (gone → `Unavailable`), resolves the image and
    /// takes the shared key the core prepared ([`keys::prepared_key`]; missing →
    /// `InvalidRequest`).
    /// Returns `{"image_id", "ssh_key_name"}`.
    async fn prepare(&self, offer: &Offer, spec: &InstanceSpec) -> Result<Value> {
        let key = keys::prepared_key(CLOUD, spec)?.name.clone();
        let region = &offer.location.region;
        let inventory = self.inventory().await?;
        let available = inventory
            .gpu_inventory
            .get(&offer.instance_type)
            .is_some_and(|p| has_capacity(p, region));
        if !available {
            return Err(ProviderError::new(
                ErrorKind::Unavailable,
                format!(
                    "massedcompute: no capacity left for {} in {region}",
                    offer.instance_type
                ),
            ));
        }
        let image_id = self.image_id(spec.image.as_deref()).await?;
        Ok(json!({ "image_id": image_id, "ssh_key_name": key }))
    }

    /// `POST /instance/launch` (202) with the image, product, region (`any` unless
    /// pinned), the identity name and the key name. Returns the instance UUID.
    ///
    /// The launch takes no idempotency token (`spec.client_token` is unused): the core's
    /// observe-before-create finds a launched instance by its name.
    async fn create(&self, offer: &Offer, prepared: &Value, spec: &InstanceSpec) -> Result<String> {
        crate::provider::check_spec_lineage(CLOUD, &self.settings.lineage, spec)?;
        let image_id = kit::offer::prepared(prepared, "image_id", Value::as_i64)?;
        let key = kit::offer::prepared(prepared, "ssh_key_name", Value::as_str)?;
        let region = &offer.location.region;
        let body = json!({
            "imageId": image_id,
            "productName": offer.instance_type,
            "regionName": region,
            "instanceName": self.instance_name(&spec.vm_name, region),
            "sshKeys": [key],
        });
        let what = format!("launch {} in {region}", offer.instance_type);
        let r: Launched = self
            .api
            .post("/instance/launch", &body, Call::other(&what))
            .await?;
        r.response
            .map(|id| id.trim().to_string())
            .filter(|id| !id.is_empty())
            .ok_or_else(|| {
                ProviderError::new(
                    ErrorKind::Failed,
                    format!("massedcompute {what}: no instance UUID in the response"),
                )
            })
    }

    /// One `GET /instance` (the account's instances; no query parameters,
    /// `openapi-v1.0.0.yaml` in `vendor-apis/massedcompute`), every one not gone, shown
    /// at `at` ([`seen_at`]): the name says where it runs.
    async fn instances(&self, at: &Location, _only_vm: Option<&str>) -> Result<Vec<Seen>> {
        let list = self.listing().await?;
        Ok(list.iter().filter_map(|i| seen_at(i, &at.region)).collect())
    }

    /// `POST /instance/terminate` for those of `instance_ids` still listed (the API says
    /// nothing of unknown ids, so they are not sent); a 404 is success.
    async fn delete(&self, _at: &Location, _vm_name: &str, instance_ids: &[String]) -> Result<()> {
        if instance_ids.is_empty() {
            return Ok(());
        }
        let alive = |i: &Instance| status_of(i.status.as_deref().unwrap_or_default()).is_some();
        let listed: Vec<String> =
            kit::listing::still_listed(self.listing().await?, instance_ids, |i| &i.uuid, alive)
                .into_iter()
                .map(|i| i.uuid)
                .collect();
        if listed.is_empty() {
            return Ok(());
        }
        let body = json!({ "instanceUuids": listed });
        match self
            .api
            .send(Method::POST, "/instance/terminate", &[], Some(&body))
            .await
        {
            Ok(_) => Ok(()),
            Err(f) if f.is_not_found() => Ok(()),
            Err(f) => Err(self.api.fail(&f, Call::other("terminate instances"))),
        }
    }

    /// The project key among `GET /ssh-keys`, found by *value* (compared without the
    /// comment) among keys whose name is not shared with another value, never by name;
    /// `None` when there is none. Ours when it carries the derived name (or its `<n>`
    /// suffix), else the user's own.
    async fn observe_shared(
        &self,
        obj: &SharedObject,
        public_key: &str,
    ) -> Result<Option<SharedFound>> {
        obj.expect(CLOUD, SSH_KEY_KIND)?;
        Ok(self.key_listing(public_key).await?.found())
    }

    /// `POST /ssh-keys` `{name, publicKey}` under the derived name (spaces for dashes), or
    /// the first free `<name> <n>` when any key holds it. A 409 is `Exists`: observed
    /// again.
    async fn create_shared(&self, obj: &SharedObject, public_key: &str) -> Result<SharedFound> {
        obj.expect(CLOUD, SSH_KEY_KIND)?;
        let name = self.key_listing(public_key).await?.name_to_register()?;
        let what = format!("register SSH key {name:?}");
        let body = json!({ "name": name, "publicKey": public_key.trim() });
        let call = Call::named(errors::REGISTER_KEY, &what);
        let posted: PostedKey = self.api.post("/ssh-keys", &body, call).await?;
        let item = posted.ssh_key.unwrap_or_default();
        // Without an id in the answer, the teardown takes it from the listing.
        Ok(keys::registered(
            item.id.unwrap_or_default(),
            item.name,
            name,
        ))
    }

    /// `DELETE /ssh-keys/{id}` (404 = already gone). Instances keep the key they were
    /// launched with. Errors: a key listed without an id → `Failed` (it cannot be
    /// named to the API).
    async fn delete_shared(&self, obj: &SharedObject, found: &SharedFound) -> Result<()> {
        obj.expect(CLOUD, SSH_KEY_KIND)?;
        if found.id.trim().is_empty() {
            return Err(ProviderError::new(
                ErrorKind::Failed,
                format!(
                    "massedcompute: SSH key {:?} is listed without an id: delete it in the \
                     console",
                    found.name
                ),
            ));
        }
        let what = format!("delete SSH key {:?}", found.name);
        self.api
            .delete(
                &format!("/ssh-keys/{}", found.id.trim()),
                |f| f.is_not_found(),
                Call::other(&what),
            )
            .await
    }

    /// Nothing to delete: instances have no side resources, and the project key is shared
    /// by the project's VMs.
    async fn cleanup(&self, _at: &Location, _vm_name: &str) -> Result<()> {
        Ok(())
    }
}
