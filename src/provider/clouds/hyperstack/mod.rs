//! Hyperstack (cloud name `hyperstack`), over NexGen Cloud's Infrahub API v1 (OpenAPI
//! 3.0.1 as published in the vendor's Go SDK, `tests/fixtures/vendor-apis/hyperstack/openapi.yaml`;
//! server `https://infrahub-api.nexgencloud.com/v1`).
//!
//! Mapping onto the contract (design 5):
//!
//! - `plan`: `GET /core/flavors` (per asked region, `?region=`) ⨝ `GET /core/stocks` ⨝
//!   `GET /pricebook`. One offer per flavor that matches the ask (GPU model, GPU count),
//!   sits in an asked region (exact names), has stock (`Flavor_Fields.stock_available` not
//!   false *and* the region's stock entry for the GPU model has a positive count for the
//!   flavor's `<N>x` configuration) and has a price. Id `hyperstack/<region>/<flavor>`.
//!   Hyperstack has no spot market in this API.
//! - Shared objects ([`crate::provider::shared`], declared in that order, both per region because
//!   key pairs live inside an environment and environments are per region:
//!   `Import_Keypair_Payload.environment_name`, `Create_Environment.region`):
//!   `environment` (`shared.hyperstack.environment[<region>]`) is the project's
//!   environment `gpuprov-<lineage8>-<region>` ([`HyperstackProvider::environment_name`]),
//!   found by that name; `ssh_key` (`shared.hyperstack.ssh_key[<region>]`) is the key pair
//!   in that environment whose public key *value* is the project's, whatever its name,
//!   else imported under [`crate::provider::project_key_name`] (`gpuprov-<lineage8>-<fp12>`; a key
//!   pair holding that name with another value is never used: the import moves to `-2`,
//!   `-3`). The region is the machine's launch region (the offer's). Since the
//!   environment's name is derived, the key pair's calls find their environment by name
//!   alone. A create answered `409` (the name is taken: made meanwhile) is `Exists`, so
//!   the core observes again and adopts it. Teardown (by the core, after the last VM of
//!   the region, key pair first): only what gpuprov made is deleted, the key pair by
//!   `DELETE /core/keypair/{id}` when it has the derived name, the environment by
//!   `DELETE /core/environments/{id}` only while it holds nothing but gpuprov's (a key
//!   pair of the user's, even of the same value, or a VM without the lineage label makes
//!   it the user's: used and kept). A refusal of the environment's delete (`400`, the only
//!   refusal the description declares) is `InUse`: retried, then the record stays for
//!   the next run.
//! - `prepare`: refuses a flavor whose root disk is smaller than the VM's `disk_gb`
//!   (`Unavailable`: the next offer may be bigger), re-checks stock, takes the
//!   environment and key pair the core prepared (without either, `InvalidRequest`), and
//!   picks the image (the config's, else the newest Ubuntu CUDA image
//!   of the region).
//! - `create`: `POST /core/virtual-machines` (count 1) named `gpuprov-<vm>-<lineage8>`,
//!   labelled `gpuprov-vm-name=<vm>` and `gpuprov-lineage=<lineage>`, with a public IP
//!   (`assign_floating_ip`), port randomisation off (so SSH is on port 22: the API does not
//!   report a randomised port), ingress security rules for TCP 22 and the VM's ports, and
//!   the boot script as cloud-init `user_data`.
//! - `instances` (the listing `observe`, `observe_location` and `list` read):
//!   `GET /core/virtual-machines?environment=…&exact_environment_match=true` (plus
//!   `search=<name>` for one VM), keeping the VMs of the project's environment of the
//!   region. The identity is the labels (else the name), judged by the core's one rule.
//!   The environment is per lineage, so `list` shows only this lineage's VMs.
//! - `delete`: `DELETE /core/virtual-machines/{id}`; 404 is success; a refusal because the
//!   VM is still being created is `Transient` (retry later), never success.
//! - `cleanup`: nothing. Security rules belong to the VM and go with it; the environment
//!   and the key pair are shared objects (above), released by the core, not per VM.
//! - `start` ([`Feature::Start`]): `GET /core/virtual-machines/{id}/start`. A stopped VM is
//!   `SHUTOFF` (vendor docs, "VM states and statuses": stop `STOPPING → SHUTOFF`), observed
//!   as `Stopped`.
//!
//! Calls go through one [`RestClient`] (pages through [`paginate`]); [`errors`] holds the
//! vendor's part: the envelope decoder (for error statuses and a 2xx saying
//! `status: false`) and the classification table. Errors show a short cause: the
//! envelope's `message` and `error_reason` when the body is one, else
//! [`crate::provider::cause::http_cause`] (status, content type, first line), never a dumped page.
//! A refused connection is `Unreachable` (the whole cloud), with the endpoint redacted.
//!
//! Readiness: a VM is `Running` only when `status` is `ACTIVE`, `power_state` (when
//! reported) is `RUNNING`, and its public IP is attached (`floating_ip` set and
//! `floating_ip_status` `ATTACHED`). The description declares these three fields as free
//! strings without enums; the values are the vendor documentation's ("VM states and
//! statuses"; SOURCES.md). Until then the VM is `Pending` without an SSH endpoint.
//!
//! Credentials: the API key is read from the environment variable `HYPERSTACK_API_KEY`
//! (the name the vendor's Terraform provider and SDK examples use). Hyperstack publishes
//! no CLI with a configuration file, so no file is read. The key is sent as the `api_key`
//! header (security scheme `apiKey`) and never written to state, logs or error messages.
//!
//! SSH: host = `floating_ip`, port 22 (port randomisation disabled at create), user
//! `ubuntu`, the default user of Hyperstack's Ubuntu images (the default image gpuprov
//! picks); an `image` override with another OS may need another user.
//!
//! Rate limits are not in the description; a 429 is `Transient` with the server's
//! `Retry-After`, and the declared `max_concurrency` keeps the request rate modest.

mod api;
mod environments;
mod errors;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

/// The credential; its `Debug` never shows the value.
pub use crate::provider::Secret as ApiKey;
pub use api::gpu_matches;
use api::{
    default_image, flavors_with_region, in_stock, label, matches_ask, no_flavor, offers_for,
    security_rules, seen_at, CreateResponse, Flavor, FlavorList, ImageList, Price, Stock,
    StockList, Vm,
};
pub use errors::{classify, ApiError, CAPACITY_PHRASES, CLASSIFIER, DELETE};

use crate::provider::kit::keys;
use crate::provider::kit::paginate::{self, Cursor, Next};
use crate::provider::kit::{self, Adapter, Auth, Call, Lookup, RestClient, Source};
use crate::provider::shared::{ENVIRONMENT, SSH_KEY};
use crate::provider::{
    Capabilities, CloudProvider, ErrorKind, Feature, InstanceSpec, Lineage, Location, Offer,
    ProviderError, ResourceRequest, Result, Seen, SharedFound, SharedObject, IDENTITY_LABEL,
    LINEAGE_LABEL,
};

/// The cloud name.
pub const CLOUD: &str = "hyperstack";
/// SSH port: 22, because VMs are created with `enable_port_randomization: false`.
pub const SSH_PORT: u16 = 22;
/// The API base URL when neither config nor environment overrides it (`servers[0].url`).
pub const DEFAULT_ENDPOINT: &str = "https://infrahub-api.nexgencloud.com/v1";
/// Environment variable overriding the endpoint (wins over `[cloud.hyperstack] endpoint`).
pub const ENDPOINT_ENV: &str = "GPUPROV_HYPERSTACK_ENDPOINT";
/// Environment variable holding the API key.
pub const API_KEY_ENV: &str = "HYPERSTACK_API_KEY";
/// Login user of Hyperstack's Ubuntu images (vendor docs; not in the API description).
pub const SSH_USER: &str = "ubuntu";
/// Longest VM, environment and key pair name the API accepts (`maxLength: 50` of
/// `Create_Instances_Payload.name`, `Create_Environment.name`, `Import_Keypair_Payload.name`).
pub const MAX_NAME_LEN: usize = 50;
/// Items requested per page of a list call.
const PAGE_SIZE: usize = 100;

/// Configuration of the Hyperstack adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HyperstackSettings {
    /// The state's lineage (a UUID): `observe` only sees VMs labelled with it.
    pub lineage: Lineage,
    /// `None` when no key was found; calls then fail with `Credentials`.
    pub api_key: Option<ApiKey>,
    /// API base URL override, including the `/v1` prefix; `None` means [`DEFAULT_ENDPOINT`].
    pub endpoint: Option<String>,
}

impl HyperstackSettings {
    /// Settings from `[cloud.hyperstack] endpoint` and the environment: endpoint precedence
    /// `GPUPROV_HYPERSTACK_ENDPOINT` (non-empty) > `endpoint` > [`DEFAULT_ENDPOINT`]; the key
    /// from `HYPERSTACK_API_KEY` (through [`crate::provider::kit::Lookup`]).
    pub fn from_env_and_config(endpoint: Option<String>, lineage: Lineage) -> HyperstackSettings {
        let (found, _) = Lookup::new().env(API_KEY_ENV).finish();
        HyperstackSettings {
            lineage,
            api_key: found.map(|c| c.secret),
            endpoint: crate::provider::endpoint_from(ENDPOINT_ENV, endpoint),
        }
    }
}

/// The Hyperstack adapter. Construction does no I/O.
pub struct HyperstackProvider {
    settings: HyperstackSettings,
    api: RestClient,
    adapter: Adapter,
    /// (environment, key pair name) an import was refused for (`409`) though no listing
    /// showed the name: the next import moves on to the next free name.
    refused_names: std::sync::Mutex<Vec<(String, String)>>,
}

fn invalid(msg: impl Into<String>) -> ProviderError {
    ProviderError::new(ErrorKind::InvalidRequest, msg)
}

impl HyperstackProvider {
    /// An adapter for `settings`: one [`RestClient`] sending the key as the `api_key`
    /// header, with Hyperstack's envelope decoder, 2xx envelope and table. Never fails and
    /// does no I/O.
    pub fn new(settings: HyperstackSettings) -> HyperstackProvider {
        let endpoint = settings.endpoint.as_deref();
        // The only place: Hyperstack has no CLI configuration file.
        let looked_in = Source::Env(API_KEY_ENV).to_string();
        let (adapter, credential) = Adapter::new(CLOUD, endpoint, Self::default_capabilities())
            .with_lineage(&settings.lineage)
            .with_key(settings.api_key.as_ref(), &looked_in);
        let missing = format!(
            "no Hyperstack API key: set {API_KEY_ENV} (looked in: the {API_KEY_ENV} \
             environment variable; Hyperstack has no CLI configuration file)"
        );
        let base = endpoint.unwrap_or(DEFAULT_ENDPOINT);
        let auth = Auth::Header("api_key");
        let api = RestClient::new(base, auth, credential, missing, &CLASSIFIER)
            .gated(adapter.gate())
            .with_error_decoder(errors::decode)
            .with_envelope(errors::envelope);
        HyperstackProvider {
            settings,
            api,
            adapter,
            refused_names: Default::default(),
        }
    }

    /// Replaces the declared capabilities (tests use short timeouts and poll intervals).
    pub fn with_capabilities(mut self, caps: Capabilities) -> HyperstackProvider {
        self.adapter.capabilities = caps;
        self
    }

    /// The capabilities gpuprov declares for Hyperstack: boot script (cloud-init
    /// `user_data`), firewall (security rules at create), GPUs, k3s and start; no spot.
    /// No `rate_limits` are declared: the API description (`hyperstack/openapi.yaml`)
    /// documents none. `max_concurrency` 4 keeps gpuprov modest, and a 429 is retried
    /// after its `Retry-After`.
    pub fn default_capabilities() -> Capabilities {
        use Feature::*;
        Capabilities {
            max_concurrency: 4,
            delete_timeout: Duration::from_secs(15 * 60),
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

    pub fn settings(&self) -> &HyperstackSettings {
        &self.settings
    }

    /// Every item of a paginated list (`page`, `pageSize`; the items under `field`),
    /// through [`paginate::all_pages`]: pages are read until one comes back short or
    /// `count` items are in hand.
    async fn list_all<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
        field: &str,
        what: &str,
    ) -> Result<Vec<T>> {
        let seen = AtomicUsize::new(0);
        paginate::all_pages(what, |cursor| {
            let page = match cursor {
                Cursor::Page(n) => n,
                _ => 1,
            };
            let mut q: Vec<(&str, String)> = query.to_vec();
            q.push(("page", page.to_string()));
            q.push(("pageSize", PAGE_SIZE.to_string()));
            let seen = &seen;
            async move {
                let mut v: Value = self.api.get(path, &q, Call::other(what)).await?;
                let items: Vec<T> = self.api.parse(
                    v.get_mut(field).map(Value::take).unwrap_or(json!([])),
                    Call::other(what),
                )?;
                let n = items.len();
                let so_far = seen.fetch_add(n, Ordering::Relaxed) + n;
                let total = v.get("count").and_then(Value::as_u64).map(|c| c as usize);
                let done = n < PAGE_SIZE || total.is_some_and(|t| so_far >= t);
                let next = if done {
                    Next::Done
                } else {
                    Next::Page(page + 1)
                };
                Ok((items, next))
            }
        })
        .await
    }

    /// The flavors of `regions` (all regions when empty), with their regions.
    async fn flavors(&self, regions: &[String]) -> Result<Vec<(String, Flavor)>> {
        if regions.is_empty() {
            let l: FlavorList = self
                .api
                .get("/core/flavors", &[], Call::other("list flavors"))
                .await?;
            return Ok(flavors_with_region(&l));
        }
        let mut out = Vec::new();
        for r in regions {
            let what = format!("list flavors of {r}");
            let l: FlavorList = self
                .api
                .get(
                    "/core/flavors",
                    &[("region", r.clone())],
                    Call::other(&what),
                )
                .await?;
            // The server filters; keep exact names only all the same.
            out.extend(
                flavors_with_region(&l)
                    .into_iter()
                    .filter(|(fr, _)| fr == r),
            );
        }
        Ok(out)
    }

    async fn stocks(&self) -> Result<Vec<Stock>> {
        let what = Call::other("list stocks");
        match self.api.send(Method::GET, "/core/stocks", &[], None).await {
            Ok(v) => Ok(self.api.parse::<StockList>(v, what)?.stocks),
            // "Stocks Not Found": no stock anywhere.
            Err(f) if f.is_not_found() => Ok(vec![]),
            Err(f) => Err(self.api.fail(&f, what)),
        }
    }

    async fn prices(&self) -> Result<Vec<Price>> {
        self.api
            .get("/pricebook", &[], Call::other("read the pricebook"))
            .await
    }

    /// `spec_image` when set, else the region's default image (see [`default_image`]).
    async fn pick_image(&self, spec_image: Option<&str>, region: &str) -> Result<String> {
        if let Some(i) = spec_image.map(str::trim).filter(|s| !s.is_empty()) {
            return Ok(i.to_string());
        }
        let what = format!("list images of {region}");
        let list: ImageList = self
            .api
            .get(
                "/core/images",
                &[("region", region.to_string())],
                Call::other(&what),
            )
            .await?;
        default_image(&list, region).ok_or_else(|| {
            ProviderError::new(
                ErrorKind::Unavailable,
                format!("hyperstack: no Ubuntu image in {region}; set `image` for this VM"),
            )
        })
    }
}

#[async_trait]
impl CloudProvider for HyperstackProvider {
    /// Name, endpoint, capabilities ([`HyperstackProvider::default_capabilities`]) and
    /// `HYPERSTACK_API_KEY`, found or not.
    fn adapter(&self) -> &Adapter {
        &self.adapter
    }

    /// Per machine: a VM name too long for Hyperstack's 50-character names (with the 17
    /// characters gpuprov adds) → `InvalidRequest`.
    fn check_request(&self, req: &ResourceRequest) -> Result<()> {
        let name_len = crate::provider::object_name(&req.vm_name, &self.settings.lineage).len();
        if name_len > MAX_NAME_LEN {
            return Err(invalid(format!(
                "vm name {} is too long for Hyperstack: VM names are at most {MAX_NAME_LEN} \
                 characters and gpuprov adds 17 (gpuprov-<name>-<lineage8>)",
                req.vm_name
            )));
        }
        Ok(())
    }

    /// Offers from flavors ⨝ stocks ⨝ pricebook (see the module docs). An empty list means
    /// "no stock now". Errors: a spot ask, a VM name too long for Hyperstack's 50-character
    /// names, or no flavor with that GPU model and count → `InvalidRequest`.
    async fn plan(&self, req: &ResourceRequest) -> Result<Vec<Offer>> {
        if req.spot {
            return Err(invalid("Hyperstack has no spot VMs in its API"));
        }
        self.check_request(req)?;
        let flavors = self.flavors(&req.regions).await?;
        if !flavors.iter().any(|(_, f)| matches_ask(f, req)) {
            return Err(invalid(no_flavor(&flavors, req)));
        }
        let stocks = self.stocks().await?;
        let prices = self.prices().await?;
        Ok(offers_for(&flavors, &stocks, &prices, req))
    }

    /// Checks the flavor's root disk against `spec.disk_gb` and re-checks stock (either
    /// short → `Unavailable`), takes the environment and the key pair the core prepared
    /// (`spec.shared`; either missing → `InvalidRequest`), and picks the
    /// image. Returns `{"environment_name", "key_name", "image_name"}`.
    async fn prepare(&self, offer: &Offer, spec: &InstanceSpec) -> Result<Value> {
        // The core prepared both (shared objects, in DECLARED order).
        let key = keys::prepared_key(CLOUD, spec)?.name.clone();
        let env = match spec.shared.get(ENVIRONMENT) {
            Some(e) => e.name.clone(),
            None => return Err(invalid(
                "hyperstack: prepare needs the project's environment (the core makes it a shared \
                     object first)",
            )),
        };
        let region = offer.location.region.as_str();
        let flavors = self.flavors(&[region.to_string()]).await?;
        let Some((_, flavor)) = flavors.iter().find(|(_, f)| f.name == offer.instance_type) else {
            return Err(ProviderError::new(
                ErrorKind::Unavailable,
                format!(
                    "hyperstack: flavor {} is no longer offered in {region}",
                    offer.instance_type
                ),
            ));
        };
        if let Some(want) = spec.disk_gb {
            if flavor.disk < want {
                return Err(ProviderError::new(
                    ErrorKind::Unavailable,
                    format!(
                        "hyperstack: flavor {} has a {} GB root disk, the VM asks for {want} GB",
                        flavor.name, flavor.disk
                    ),
                ));
            }
        }
        let stocks = self.stocks().await?;
        if !in_stock(&stocks, region, flavor) {
            return Err(ProviderError::new(
                ErrorKind::Unavailable,
                format!(
                    "hyperstack: no stock left for {} in {region}",
                    offer.instance_type
                ),
            ));
        }
        let image = self.pick_image(spec.image.as_deref(), region).await?;
        Ok(json!({
            "environment_name": env,
            "key_name": key,
            "image_name": image,
        }))
    }

    /// `POST /core/virtual-machines` (see the module docs). Returns the VM id.
    ///
    /// The API takes no idempotency token (`spec.client_token` is unused): a create
    /// repeated after a crash is avoided by the core's observe-before-create, which finds
    /// the VM by its exact name and labels.
    async fn create(&self, offer: &Offer, prepared: &Value, spec: &InstanceSpec) -> Result<String> {
        let lineage = crate::provider::check_spec_lineage(CLOUD, &self.settings.lineage, spec)?;
        let field = |k: &str| kit::offer::prepared(prepared, k, Value::as_str);
        let name = crate::provider::object_name(&spec.vm_name, lineage);
        if name.len() > MAX_NAME_LEN {
            return Err(invalid(format!(
                "VM name {name} is longer than Hyperstack's {MAX_NAME_LEN} characters"
            )));
        }
        let mut body = json!({
            "name": name,
            "environment_name": field("environment_name")?,
            "flavor_name": offer.instance_type,
            "image_name": field("image_name")?,
            "key_name": field("key_name")?,
            "count": 1,
            "assign_floating_ip": true,
            "enable_port_randomization": false,
            "labels": [
                label(IDENTITY_LABEL, &spec.vm_name),
                label(LINEAGE_LABEL, lineage.as_str()),
            ],
            "security_rules": security_rules(&spec.ports),
        });
        if let Some(b) = &spec.boot_script {
            body["user_data"] = crate::provider::cloud_init_user_data(b)?.into();
        }
        let (flavor, region) = (&offer.instance_type, &offer.location.region);
        let what = format!("create VM {flavor} in {region}");
        let r: CreateResponse = self
            .api
            .post("/core/virtual-machines", &body, Call::other(&what))
            .await?;
        match r.instances.iter().find_map(|i| i.id) {
            Some(id) => Ok(id.to_string()),
            None => Err(ProviderError::new(
                ErrorKind::Failed,
                format!("hyperstack {what}: no VM id in the response"),
            )),
        }
    }

    /// One paginated `GET /core/virtual-machines?environment=<env>&exact_environment_match=true`
    /// (query parameters `environment` and `exact_environment_match` of operation
    /// `List_VMs` in `vendor-apis/hyperstack/openapi.yaml`), `env` being the project's
    /// environment of `at.region` ([`Self::environment_name`]), which holds exactly this
    /// lineage's VMs there; `&search=gpuprov-<vm>-<lineage8>` too for `only_vm`. The VMs
    /// there ([`seen_at`]) once each, except deleted ones.
    async fn instances(&self, at: &Location, only_vm: Option<&str>) -> Result<Vec<Seen>> {
        let lineage = &self.settings.lineage;
        let env = Self::environment_name(lineage, &at.region);
        let mut query = vec![
            ("environment", env.clone()),
            ("exact_environment_match", "true".to_string()),
        ];
        if let Some(vm) = only_vm {
            query.push(("search", crate::provider::object_name(vm, lineage)));
        }
        let vms: Vec<Vm> = self
            .list_all("/core/virtual-machines", &query, "instances", "list VMs")
            .await?;
        let mut seen: Vec<Seen> = vms
            .iter()
            .filter_map(|v| seen_at(v, &env, &at.region))
            .collect();
        // A VM may show on two pages when the list shifts between them.
        seen.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
        seen.dedup_by(|a, b| a.instance_id == b.instance_id);
        Ok(seen)
    }

    /// Nothing to do: the security rules go with the VM; the environment and the key pair
    /// are shared objects, released by the core after the last VM using them.
    async fn cleanup(&self, _: &Location, _: &str) -> Result<()> {
        Ok(())
    }

    /// `DELETE /core/virtual-machines/{id}` for each id. Not found (404), or an id that is
    /// not a Hyperstack VM id (not an integer), is success. A refusal because the VM is
    /// mid-transition (still `CREATING`; a rule of [`errors`]) is `Transient`: the
    /// core retries, and nothing is taken for deleted until `observe` no longer sees it.
    async fn delete(&self, _: &Location, _: &str, ids: &[String]) -> Result<()> {
        for id in ids {
            let Ok(n) = id.trim().parse::<i64>() else {
                continue;
            };
            let what = format!("delete VM {n}");
            let path = format!("/core/virtual-machines/{n}");
            self.api
                .delete(
                    &path,
                    crate::provider::kit::Failure::is_not_found,
                    Call::named(DELETE, &what),
                )
                .await?;
        }
        Ok(())
    }

    /// Environment: the project's environment of `obj.region` found by its derived name,
    /// ours while it holds only what gpuprov put there ([`Self::holds_only_ours`]; an
    /// environment holding the user's key pair or VM is used and kept). Key pair: the one
    /// in that environment whose value is `public_key` (compared without the comment),
    /// whatever its name; ours when it has the name gpuprov derives, else the user's own
    /// (used, never deleted). `None` when missing (a key pair too when its environment
    /// is). Errors: another kind, or no region → `InvalidRequest`; the calls' own.
    async fn observe_shared(
        &self,
        obj: &SharedObject,
        public_key: &str,
    ) -> Result<Option<SharedFound>> {
        let region = Self::region_of(obj)?;
        if obj.expect(CLOUD, ENVIRONMENT).is_ok() {
            let Some(e) = self.find_environment(region).await? else {
                return Ok(None);
            };
            return Ok(Some(SharedFound {
                id: e.id.map(|i| i.to_string()).unwrap_or_default(),
                ours: self.holds_only_ours(&e.name, public_key).await?,
                name: e.name,
            }));
        }
        obj.expect(CLOUD, SSH_KEY)?;
        let env = Self::environment_name(&self.settings.lineage, region);
        Ok(self.key_listing(&env, public_key).await?.found())
    }

    /// Environment: `POST /core/environments` named [`Self::environment_name`] in
    /// `obj.region`. Key pair: imported into that environment as
    /// [`crate::provider::project_key_name`] (the next free `-2`, `-3` when a key pair of another
    /// value holds the name; see `import_key`). A `409` on either is `Exists`: the core
    /// observes again and adopts it.
    async fn create_shared(&self, obj: &SharedObject, public_key: &str) -> Result<SharedFound> {
        let region = Self::region_of(obj)?;
        if obj.expect(CLOUD, ENVIRONMENT).is_ok() {
            let e = self.create_environment(region).await?;
            return Ok(SharedFound {
                id: e.id.map(|i| i.to_string()).unwrap_or_default(),
                name: e.name,
                ours: true,
            });
        }
        obj.expect(CLOUD, SSH_KEY)?;
        let env = Self::environment_name(&self.settings.lineage, region);
        let k = self.import_key(&env, public_key).await?;
        Ok(SharedFound {
            id: k.id.map(|i| i.to_string()).unwrap_or_default(),
            ours: self.is_project_key_name(&k.name, public_key),
            name: k.name,
        })
    }

    /// Key pair: `DELETE /core/keypair/{id}`. Environment: `DELETE
    /// /core/environments/{id}`; a `400` (it still holds something) is `InUse`, so the
    /// record stays for the next run. Not found (404), an id that is not an integer, or
    /// one not ours is success without a call.
    async fn delete_shared(&self, obj: &SharedObject, found: &SharedFound) -> Result<()> {
        let (path, call) = if obj.expect(CLOUD, ENVIRONMENT).is_ok() {
            ("/core/environments", errors::DELETE_ENVIRONMENT)
        } else {
            obj.expect(CLOUD, SSH_KEY)?;
            ("/core/keypair", "delete_shared")
        };
        let Ok(id) = found.id.trim().parse::<i64>() else {
            return Ok(());
        };
        if !found.ours {
            return Ok(());
        }
        let what = format!("delete {} {}", obj.kind, found.name);
        self.api
            .delete(
                &format!("{path}/{id}"),
                crate::provider::kit::Failure::is_not_found,
                Call::named(call, &what),
            )
            .await
    }

    /// `GET /core/virtual-machines/{id}/start` (`Start_VM`: "Initiates the startup of a
    /// virtual machine"; a stopped VM is `SHUTOFF`, then `STARTING` → `ACTIVE`). A refusal
    /// that is not classified capacity or quota is success when `GET
    /// /core/virtual-machines/{id}` shows the VM already `ACTIVE` or starting. Errors: as
    /// [`classify`] says: the description documents no capacity answer for a start (only
    /// `400 ErrorResponseModel` with free text), so a text naming stock or capacity is
    /// `Capacity`, one naming a quota is `Quota`, and anything else `Failed`; an id that
    /// is not a Hyperstack VM id → `InvalidRequest`; a VM that no longer exists (`404`) →
    /// `Failed`.
    async fn start(&self, _: &Location, _: &str, instance_id: &str) -> Result<()> {
        let Ok(n) = instance_id.trim().parse::<i64>() else {
            return Err(invalid(format!(
                "{instance_id} is not a Hyperstack VM id (an integer)"
            )));
        };
        let what = format!("start VM {n}");
        let vm = format!("/core/virtual-machines/{n}");
        let start = format!("{vm}/start");
        let refused = match self.api.send(Method::GET, &start, &[], None).await {
            Ok(_) => return Ok(()),
            Err(f) => f,
        };
        let mut err = self.api.fail(&refused, Call::other(&what));
        if refused.is_not_found() {
            // Gone since it was observed: not a request gpuprov built wrongly.
            err.kind = ErrorKind::Failed;
            return Err(err);
        }
        if refused.http_status() != Some(400) || err.kind != ErrorKind::Failed {
            return Err(err);
        }
        #[derive(Deserialize)]
        struct One {
            instance: Vm,
        }
        let now: One = self.api.get(&vm, &[], Call::other(&what)).await?;
        match now.instance.status.trim().to_uppercase().as_str() {
            "ACTIVE" | "STARTING" | "REBOOTING" | "HARD_REBOOT" => Ok(()),
            other => Err(ProviderError {
                msg: format!("{} (the VM is {other})", err.msg),
                ..err
            }),
        }
    }
}
