//! RunPod (cloud name `runpod`), over its REST API v2 (OpenAPI 3.1, API 2.0.0,
//! `tests/fixtures/vendor-apis/runpod/api-reference-v2/openapi.json`). RunPod rents GPU
//! *pods*: containers on a GPU host, not VMs. There is no boot script and no systemd, so
//! RunPod machines cannot host k3s.
//!
//! Mapping onto the contract (design 5):
//!
//! - `plan`: `GET /v2/catalog/gpus?include=AVAILABILITY&product=POD&count=N&cloud=TIER`,
//!   once per cloud tier (`SECURE`, `COMMUNITY`; `include=AVAILABILITY` requires `product`,
//!   and `count` / `cloud` are valid only with it). One offer per (GPU type, tier, data
//!   centre listed in `dataCenters` with availability other than `NONE`): region = the
//!   data centre id, id `runpod/<dc>/<tier>/<gpu type id>`, price = `price.<tier>` ×
//!   count USD per hour (the spec: `price` is per GPU, "the rate for a unit is the figure
//!   times `gpu.count`"). RunPod's v2 API has no interruptible (spot) pods. Offers are
//!   emitted secure tier first; the core orders them (region, price, type, data centre),
//!   and its stable sort keeps a secure offer ahead of the community one at equal price.
//! - Shared object `ssh_key` (the account's key set, one per account,
//!   [`crate::provider::shared`]): the set is written by read-modify-write (`GET`, then
//!   `PUT /v2/account/ssh-keys` with the whole set: "Existing keys not present in the
//!   request are removed"), so it is written in its own node, once per run, never by the
//!   machines' `prepare`: parallel pods cannot overwrite each other's additions.
//!   `observe_shared` finds the project key in the set by *value* (ignoring the comment);
//!   `create_shared` reads the set and, when the key is still missing, `PUT`s the existing
//!   keys plus the project key with the comment [`crate::provider::project_key_name`]
//!   (`gpuprov-<lineage8>-<fp12>`; the set holds bare strings, so the comment is the only
//!   name a key has); `delete_shared` `PUT`s the set without that entry. A key found by
//!   value with another comment is the user's own: used, never removed. The PUT replaces
//!   the set whatever it holds, so RunPod has no "exists" answer to classify. The spec
//!   offers no conditional PUT (no ETag), so a key the user adds in the dashboard between
//!   that GET and PUT would be lost; the window is one round trip, at most twice a run.
//! - `prepare`: re-checks stock (`GET /v2/catalog/gpus/{id}` with the same filters) and
//!   reads the account's key set (`GET /v2/account/ssh-keys`, read only: the core
//!   prepared the shared key). Returns that set, with the project key added when the
//!   listing does not show it yet. Without the shared key, `InvalidRequest`.
//! - `create`: `POST /v2/pods` with the GPU type id and count, the tier, the data centre
//!   (`dataCenterIds`), `ports` `22/tcp` (plus the VM's ports as `<p>/tcp`), `startSsh`,
//!   and `env` `PUBLIC_KEY` = the merged key set (one key per line; RunPod images install
//!   `PUBLIC_KEY` into `authorized_keys`, and `startSsh` leaves a `PUBLIC_KEY` the request
//!   sets alone), so the pod gets the project key even if the account's set changes
//!   between prepare and create. Pods have no tags or labels: the identity is the name
//!   `gpuprov-<vm>-<lineage8>` plus `env` `GPUPROV_VM_NAME`, `GPUPROV_LINEAGE` and
//!   `GPUPROV_DATA_CENTER` (`Pod.env` is returned by every read).
//! - `instances` (the listing `observe`, `observe_location` and `list` read):
//!   `GET /v2/pods` (no filter exists), kept when the pod's data centre (`dataCenterId`,
//!   null until the scheduler assigns it, else `GPUPROV_DATA_CENTER`; a pod with neither
//!   is seen everywhere rather than missed and created twice) is the location's region.
//!   The identity is the env (else the name), judged by the core's one rule.
//! - `delete`: `DELETE /v2/pods/{id}` (`204`; `404` is success). `cleanup` has nothing to
//!   do: a pod has no side resources, and the project key is the shared object's (the
//!   core removes it after the last pod).
//! - `start` ([`Feature::Start`]): `POST /v2/pods/{id}/action` `{"action": "start"}`. A
//!   stopped pod is `EXITED` (spec `PodStatus`: "container exited (stopped)"; `stop`
//!   "releas[es] GPU/CPU compute while keeping its disk"), observed as `Stopped`.
//!
//! Calls go through one [`kit::RestClient`]; [`errors`] holds the vendor's part: the
//! problem-document decoder and the classification table (the `createPod` retry table).
//! Errors show a short cause: the problem document's `detail` when the body is one, else
//! [`crate::provider::cause::http_cause`] (status, content type, first line), never a dumped page.
//! A refused connection is `Unreachable` (the whole cloud), with the endpoint redacted.
//!
//! SSH: `Pod.ssh.direct` (host, port, username; "null unless `22/tcp` is in `ports` and
//! the running pod has been assigned a public port"), else the `runtime.ports` entry with
//! `private` 22 and type `tcp` once its `ip` and `public` port are set. While neither is
//! there the pod is reported without an endpoint, and the core keeps waiting: a pod whose
//! ports are not mapped yet is not an error. The user is `username` of `ssh.direct`, else
//! `root` (RunPod containers run as root). The proxy endpoint (`ssh.proxy`) is not used:
//! it carries an interactive shell only, no SFTP or port forwarding.
//!
//! Credentials: the API key from the environment variable `RUNPOD_API_KEY`, else
//! `~/.runpod/config.toml`, where runpodctl writes `apiKey = "..."` (any case) and the
//! runpod-python CLI writes `[default] api_key = "..."`. Sent as `Authorization: Bearer`
//! (spec `bearerAuth`), never written to state, logs, `Debug` output or error messages.
//!
//! Rate limits: 60 requests a minute, 3,000 an hour, 50,000 a day per user (API
//! description `components.schemas.RateLimitPolicyHeader`, its example; the header is
//! sent on every authenticated answer). All three are declared in
//! [`RunpodProvider::default_capabilities`] and the core enforces them on every HTTP
//! request; a `429` beyond that (a limit changed since) carries `Retry-After` (else the
//! exhausted window of the `RateLimit` header), classified `Transient` with the delay.

mod api;
mod credentials;
mod errors;
mod offers;
#[cfg(test)]
mod tests;

use std::time::Duration;

use async_trait::async_trait;
use reqwest::Method;
use serde::Deserialize;
use serde_json::{json, Value};

/// The credential; its `Debug` never shows the value.
pub use crate::provider::Secret as ApiKey;
pub use api::Tier;
use api::{encode_segment, seen_at, GpuList, GpuType, Pod, PodList, SshKeys};
pub use credentials::{api_key_from_config, find_api_key};
pub use errors::{classify, ApiError, Call, CLASSIFIER};
pub use offers::gpu_matches;
use offers::offers_for;

use crate::provider::kit::keys::key_value;
use crate::provider::kit::{self, Adapter, Auth, RestClient};
use crate::provider::{
    project_key_name, Capabilities, CloudProvider, ErrorKind, Feature, InstanceSpec, Lineage,
    Location, Offer, ProviderError, RateLimit, ResourceRequest, Result, Seen, SharedFound,
    SharedObject,
};

/// The cloud name.
pub const CLOUD: &str = "runpod";
/// The API base URL when neither config nor environment overrides it (spec `servers`).
pub const DEFAULT_ENDPOINT: &str = "https://api.runpod.io";
/// Environment variable overriding the endpoint (wins over `[cloud.runpod] endpoint`).
pub const ENDPOINT_ENV: &str = "GPUPROV_RUNPOD_ENDPOINT";
/// Environment variable holding the API key (RunPod's SDKs and CLIs read it too).
pub const API_KEY_ENV: &str = "RUNPOD_API_KEY";
/// The RunPod CLIs' configuration file, relative to the home directory.
pub const CONFIG_FILE: &str = ".runpod/config.toml";
/// The image when the VM names none: RunPod's official PyTorch image (the spec's
/// `createPod` example), which honours `PUBLIC_KEY` and starts sshd.
pub const DEFAULT_IMAGE: &str = "runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404";
/// Login user when `ssh.direct` names none: RunPod containers run as root.
pub const SSH_USER: &str = "root";
/// Identity env keys of a pod (RunPod has no tags): VM name, lineage, data centre asked.
pub const ENV_VM_NAME: &str = "GPUPROV_VM_NAME";
pub const ENV_LINEAGE: &str = "GPUPROV_LINEAGE";
pub const ENV_DATA_CENTER: &str = "GPUPROV_DATA_CENTER";
/// The env key RunPod images read authorized keys from (spec `startSsh`).
pub const ENV_PUBLIC_KEY: &str = "PUBLIC_KEY";

/// Configuration of the RunPod adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunpodSettings {
    /// The state's lineage (a UUID): `observe` only sees pods carrying it.
    pub lineage: Lineage,
    /// Where the key was found (`RUNPOD_API_KEY` or the file's path), or where gpuprov
    /// looked when it was not: shown in the `Credentials` error, never the key itself.
    pub key_source: String,
    /// `None` when no key was found; calls then fail with `Credentials`.
    pub api_key: Option<ApiKey>,
    /// API base URL override; `None` means [`DEFAULT_ENDPOINT`].
    pub endpoint: Option<String>,
}

impl RunpodSettings {
    /// Settings from `[cloud.runpod] endpoint` and the environment: endpoint precedence
    /// `GPUPROV_RUNPOD_ENDPOINT` (non-empty) > `endpoint` > [`DEFAULT_ENDPOINT`]; the key
    /// from [`find_api_key`] with the user's home directory.
    pub fn from_env_and_config(endpoint: Option<String>, lineage: Lineage) -> RunpodSettings {
        let home = dirs::home_dir();
        let (api_key, key_source) = find_api_key(std::env::var(API_KEY_ENV).ok(), home.as_deref());
        RunpodSettings {
            endpoint: crate::provider::endpoint_from(ENDPOINT_ENV, endpoint),
            api_key,
            key_source,
            lineage,
        }
    }
}

/// The RunPod adapter. Construction does no I/O.
pub struct RunpodProvider {
    settings: RunpodSettings,
    api: RestClient,
    adapter: Adapter,
}

impl RunpodProvider {
    /// An adapter for `settings`: one bearer-auth [`RestClient`] with RunPod's decoder and
    /// table. Never fails and does no I/O.
    pub fn new(settings: RunpodSettings) -> RunpodProvider {
        let endpoint = settings.endpoint.as_deref();
        let (adapter, credential) = Adapter::new(CLOUD, endpoint, Self::default_capabilities())
            .with_lineage(&settings.lineage)
            .with_key(settings.api_key.as_ref(), &settings.key_source);
        let missing = format!(
            "no RunPod API key: set {API_KEY_ENV} or run `runpodctl config --apiKey …` \
             (looked in: {})",
            settings.key_source
        );
        let base = endpoint.unwrap_or(DEFAULT_ENDPOINT);
        let api = RestClient::new(base, Auth::Bearer, credential, missing, &CLASSIFIER)
            .gated(adapter.gate())
            .with_error_decoder(errors::decode);
        RunpodProvider {
            settings,
            api,
            adapter,
        }
    }

    /// Replaces the declared capabilities (tests use short timeouts and poll intervals).
    pub fn with_capabilities(mut self, caps: Capabilities) -> RunpodProvider {
        self.adapter.capabilities = caps;
        self
    }

    /// The capabilities RunPod's documentation implies: GPUs and start only: no boot
    /// script (pods are containers started from an image), no firewall API (exposed ports
    /// are mapped to other public ports), no k3s, no spot. Pods pull their image while
    /// booting, so the boot timeout is generous. Rate limits over every request, from the
    /// API description (`runpod/api-reference-v2/openapi.json`,
    /// `components.schemas.RateLimitPolicyHeader`, example
    /// `"minute";q=60;w=60, "hour";q=3000;w=3600, "day";q=50000;w=86400`): 60 per minute
    /// (1 request/s), 3,000 per hour (0.83 requests/s), 50,000 per day (0.58 requests/s).
    pub fn default_capabilities() -> Capabilities {
        const SOURCE: &str = "tests/fixtures/vendor-apis/runpod/api-reference-v2/openapi.json, components.schemas.RateLimitPolicyHeader (example)";
        Capabilities {
            max_concurrency: 2,
            rate_limits: vec![
                RateLimit::all(60, Duration::from_secs(60), SOURCE),
                RateLimit::all(3000, Duration::from_secs(3600), SOURCE),
                RateLimit::all(50_000, Duration::from_secs(86_400), SOURCE),
            ],
            ..kit::adapter::vm_capabilities(&[Feature::Gpu, Feature::Start, Feature::SharedObjects])
        }
    }

    pub fn settings(&self) -> &RunpodSettings {
        &self.settings
    }

    /// The availability filters of a catalog read: `include=AVAILABILITY&product=POD`
    /// (the spec: `include=AVAILABILITY` requires `product`) with the GPU count and tier
    /// (valid only with `include`).
    fn stock_query(tier: Tier, count: u32) -> Vec<(&'static str, String)> {
        vec![
            ("include", "AVAILABILITY".into()),
            ("product", "POD".into()),
            ("count", count.max(1).to_string()),
            ("cloud", tier.as_api().into()),
        ]
    }

    /// The GPU catalog of `tier` with pod stock for `count` GPUs.
    async fn catalog(&self, tier: Tier, count: u32) -> Result<Vec<GpuType>> {
        let what = format!("list GPU types ({} cloud)", tier.as_api());
        let list: GpuList = self
            .api
            .get(
                "/v2/catalog/gpus",
                &Self::stock_query(tier, count),
                Call::Other.what(&what),
            )
            .await?;
        Ok(list.gpus)
    }

    /// The account's SSH key set (`GET /v2/account/ssh-keys`), trimmed, empty entries
    /// dropped.
    async fn account_keys(&self) -> Result<Vec<String>> {
        let have: SshKeys = self
            .api
            .get(
                "/v2/account/ssh-keys",
                &[],
                Call::Other.what("list SSH keys"),
            )
            .await?;
        Ok(have
            .keys
            .into_iter()
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty())
            .collect())
    }

    /// Replaces the account's key set with `keys` (`PUT /v2/account/ssh-keys`); returns
    /// the set as the answer shows it.
    async fn put_keys(&self, keys: &[String], what: &str) -> Result<Vec<String>> {
        let now: SshKeys = self
            .api
            .put(
                "/v2/account/ssh-keys",
                &json!({ "keys": keys }),
                Call::Other.what(what),
            )
            .await?;
        Ok(now.keys)
    }

    /// The project key's value (`type base64`); an empty key is `InvalidRequest`.
    fn wanted_key(public_key: &str) -> Result<String> {
        let want = key_value(public_key);
        if want.is_empty() {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                "the project's SSH public key is empty",
            ));
        }
        Ok(want)
    }

    /// The name gpuprov gives the project key: the comment of the entry it adds.
    fn key_name(&self, public_key: &str) -> String {
        project_key_name(self.settings.lineage.as_str(), public_key)
    }

    /// The project key in `keys`, found by value, as a shared object: `id` is the entry
    /// as listed, `name` its comment; ours when the comment is [`Self::key_name`].
    fn find_shared(&self, keys: &[String], public_key: &str) -> Result<Option<SharedFound>> {
        let want = Self::wanted_key(public_key)?;
        let ours = self.key_name(public_key);
        // Prefer our own entry when the user registered the same value too.
        let mut found: Vec<&String> = keys.iter().filter(|k| key_value(k) == want).collect();
        found.sort_by_key(|k| comment_of(k) != ours);
        Ok(found.first().map(|k| SharedFound {
            id: (*k).clone(),
            name: comment_of(k).to_string(),
            ours: comment_of(k) == ours,
        }))
    }
}

// The kind of the project key, the one shared object this cloud declares
// (`shared::declared`): one per account.
use crate::provider::shared::SSH_KEY as SSH_KEY_KIND;

/// The comment of an OpenSSH key entry (what follows `type base64`), empty when none.
fn comment_of(k: &str) -> &str {
    let mut rest = k.trim();
    for _ in 0..2 {
        rest = rest
            .split_once(char::is_whitespace)
            .map_or("", |(_, r)| r.trim_start());
    }
    rest.trim_end()
}

/// The tier and GPU type id an offer of this adapter carries in `detail`.
fn offer_tier(offer: &Offer) -> Result<(Tier, String)> {
    let tier = offer.detail["tier"]
        .as_str()
        .and_then(Tier::from_api)
        .ok_or_else(|| {
            ProviderError::new(
                ErrorKind::InvalidRequest,
                format!("runpod offer {} has no cloud tier", offer.id),
            )
        })?;
    let id = offer.detail["gpu_type_id"]
        .as_str()
        .unwrap_or(&offer.instance_type)
        .to_string();
    Ok((tier, id))
}

#[async_trait]
impl CloudProvider for RunpodProvider {
    /// Name, endpoint, capabilities ([`RunpodProvider::default_capabilities`]) and
    /// `RUNPOD_API_KEY`, else `~/.runpod/config.toml` (see [`find_api_key`]).
    fn adapter(&self) -> &Adapter {
        &self.adapter
    }

    /// Offers from the GPU catalog with pod stock, once per tier (see the module docs).
    /// A GPU count of 0 asks for 1. An empty list means "no stock now". Errors: a spot
    /// ask, or no GPU type with that model and count in any tier → `InvalidRequest`.
    async fn plan(&self, req: &ResourceRequest) -> Result<Vec<Offer>> {
        kit::offer::refuse_spot(req, "RunPod's REST API v2 has no spot (interruptible) pods")?;
        let count = req.gpu_count.max(1);
        let mut catalog = Vec::new();
        for tier in Tier::ALL {
            catalog.push((tier, self.catalog(tier, count).await?));
        }
        let exists = catalog.iter().any(|(tier, gpus)| {
            gpus.iter().any(|g| {
                g.in_tier(*tier)
                    && g.max_count(*tier) >= count
                    && req
                        .gpu
                        .as_ref()
                        .is_none_or(|w| gpu_matches(w, &g.id, &g.name))
            })
        });
        if !exists {
            // Sorted and without repeats: a type listed in both tiers shows once.
            let have: std::collections::BTreeSet<String> = catalog
                .iter()
                .flat_map(|(tier, gpus)| {
                    gpus.iter()
                        .filter(|g| g.in_tier(*tier))
                        .map(|g| format!("{} x{}", g.name, g.max_count(*tier)))
                })
                .collect();
            let have: Vec<String> = have.into_iter().collect();
            let want = req.gpu.as_deref().unwrap_or("any GPU");
            let msg = format!(
                "RunPod has no GPU type with {want} x{count}; it has (name x max count): {}",
                have.join(", ")
            );
            return Err(ProviderError::new(ErrorKind::InvalidRequest, msg));
        }
        Ok(offers_for(&catalog, req, count))
    }

    /// Re-checks the offer's stock (`GET /v2/catalog/gpus/{id}` with the offer's tier and
    /// count; gone → `Unavailable`), then reads the account's key set, read only: the core
    /// prepared the shared `ssh_key` (`spec.shared`; missing → `InvalidRequest`, before any
    /// call). Returns `{"public_keys": [..]}`, the
    /// account's key set including the project key (public keys only).
    async fn prepare(&self, offer: &Offer, spec: &InstanceSpec) -> Result<Value> {
        kit::keys::prepared_key(CLOUD, spec)?;
        let (tier, gpu_id) = offer_tier(offer)?;
        let path = format!("/v2/catalog/gpus/{}", encode_segment(&gpu_id));
        let what = format!("re-check stock of {gpu_id} ({} cloud)", tier.as_api());
        let query = Self::stock_query(tier, offer.gpu_count);
        let gone = || {
            ProviderError::new(
                ErrorKind::Unavailable,
                format!(
                    "runpod: no {} stock left for {gpu_id} x{} in {}",
                    tier.as_api(),
                    offer.gpu_count.max(1),
                    offer.location.region
                ),
            )
        };
        let gpu: GpuType = match self.api.send(Method::GET, &path, &query, None).await {
            Ok(v) => self.api.parse(v, Call::Other.what(&what))?,
            Err(f) if f.is_not_found() => return Err(gone()),
            Err(f) => return Err(self.api.fail(&f, Call::Other.what(&what))),
        };
        if !gpu
            .stocked()
            .any(|d| d.id.eq_ignore_ascii_case(&offer.location.region))
        {
            return Err(gone());
        }
        // The core registered it once for the run: read only, never write the set here.
        let mut keys = self.account_keys().await?;
        let want = Self::wanted_key(&spec.ssh_public_key)?;
        if !keys.iter().any(|k| key_value(k) == want) {
            keys.push(spec.ssh_public_key.trim().to_string());
        }
        Ok(json!({ "public_keys": keys }))
    }

    /// `POST /v2/pods` (see the module docs for the body). Returns the pod id.
    ///
    /// `createPod` takes no idempotency token (`spec.client_token` is unused): a create
    /// repeated after a crash is avoided by the core's observe-before-create, which finds
    /// the pod by its identity env even before the scheduler assigns its data centre.
    /// Errors: a boot script → `InvalidRequest` (RunPod cannot run one).
    async fn create(&self, offer: &Offer, prepared: &Value, spec: &InstanceSpec) -> Result<String> {
        let lineage = crate::provider::check_spec_lineage(CLOUD, &self.settings.lineage, spec)?;
        if spec.boot_script.is_some() {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                "RunPod pods cannot run a boot script (containers, no cloud-init)",
            ));
        }
        let (tier, gpu_id) = offer_tier(offer)?;
        let keys: Vec<&str> = prepared["public_keys"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let want = key_value(&spec.ssh_public_key);
        if !keys.iter().any(|k| key_value(k) == want) {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                "prepared data does not hold the project's SSH key",
            ));
        }
        let mut ports = vec!["22/tcp".to_string()];
        for p in &spec.ports {
            let entry = format!("{p}/tcp");
            if !ports.contains(&entry) {
                ports.push(entry);
            }
        }
        let region = &offer.location.region;
        let mut body = json!({
            "name": crate::provider::object_name(&spec.vm_name, lineage),
            "image": spec
                .image
                .as_deref()
                .filter(|s| !s.trim().is_empty())
                .unwrap_or(DEFAULT_IMAGE),
            "gpu": { "id": gpu_id, "count": offer.gpu_count.max(1) },
            "cloud": tier.as_api(),
            "dataCenterIds": [region],
            "ports": ports,
            "startSsh": true,
            "env": {
                ENV_PUBLIC_KEY: keys.join("\n"),
                ENV_VM_NAME: spec.vm_name,
                ENV_LINEAGE: lineage.as_str(),
                ENV_DATA_CENTER: region,
            },
        });
        if let Some(gb) = spec.disk_gb.filter(|g| *g > 0) {
            body["disk"] = json!(gb);
        }
        let what = format!(
            "create pod on {gpu_id} x{} ({} cloud) in {region}",
            offer.gpu_count.max(1),
            tier.as_api()
        );
        #[derive(Deserialize)]
        struct Created {
            id: String,
        }
        let pod: Created = self
            .api
            .post("/v2/pods", &body, Call::CreatePod.what(&what))
            .await?;
        Ok(pod.id)
    }

    /// One `GET /v2/pods` (its only query parameter is `includeClusterPods`:
    /// `vendor-apis/runpod/api-reference-v2/openapi.json`, no filter by env, name or data
    /// centre), keeping the pods at `at.region` ([`seen_at`]) except `TERMINATED` ones.
    async fn instances(&self, at: &Location, _only_vm: Option<&str>) -> Result<Vec<Seen>> {
        let list: PodList = self
            .api
            .get("/v2/pods", &[], Call::Other.what("list pods"))
            .await?;
        Ok(list
            .pods
            .iter()
            .filter_map(|p| seen_at(p, &at.region))
            .collect())
    }

    /// `DELETE /v2/pods/{id}` for each id; `404` (unknown or already deleted) is success.
    async fn delete(&self, _: &Location, _: &str, ids: &[String]) -> Result<()> {
        for id in ids {
            let what = format!("delete pod {id}");
            let path = format!("/v2/pods/{}", encode_segment(id));
            self.api
                .delete(
                    &path,
                    crate::provider::kit::Failure::is_not_found,
                    Call::Other.what(&what),
                )
                .await?;
        }
        Ok(())
    }

    /// Nothing to clean: a pod has no side resources, and the project key is the shared
    /// object's (removed by the core after the last pod).
    async fn cleanup(&self, _: &Location, _: &str) -> Result<()> {
        Ok(())
    }

    /// The project key in `GET /v2/account/ssh-keys`, found by *value* (ignoring the
    /// comment); `None` when the set does not hold it. Ours when its comment is the name
    /// gpuprov derives ([`project_key_name`]), else the user's own.
    async fn observe_shared(
        &self,
        obj: &SharedObject,
        public_key: &str,
    ) -> Result<Option<SharedFound>> {
        obj.expect(CLOUD, SSH_KEY_KIND)?;
        let keys = self.account_keys().await?;
        self.find_shared(&keys, public_key)
    }

    /// Read-modify-write of the account's key set: `GET`, then (when the key is still
    /// missing) `PUT` of every listed key plus the project key with the comment
    /// [`project_key_name`]. A key found by value at the `GET` is adopted without a write.
    async fn create_shared(&self, obj: &SharedObject, public_key: &str) -> Result<SharedFound> {
        obj.expect(CLOUD, SSH_KEY_KIND)?;
        let keys = self.account_keys().await?;
        if let Some(found) = self.find_shared(&keys, public_key)? {
            return Ok(found);
        }
        let name = self.key_name(public_key);
        let entry = format!("{} {name}", Self::wanted_key(public_key)?);
        let mut merged = keys;
        merged.push(entry.clone());
        self.put_keys(&merged, &format!("register SSH key {name}"))
            .await?;
        Ok(SharedFound {
            id: entry,
            name,
            ours: true,
        })
    }

    /// Read-modify-write of the account's key set without the entry gpuprov added (same
    /// value and comment as `found`); every other key, the user's own of the same value
    /// too, stays. Nothing to remove (already gone) is success without a write.
    async fn delete_shared(&self, obj: &SharedObject, found: &SharedFound) -> Result<()> {
        obj.expect(CLOUD, SSH_KEY_KIND)?;
        if !found.ours {
            return Ok(());
        }
        let value = key_value(&found.id);
        let keys = self.account_keys().await?;
        let before = keys.len();
        let kept: Vec<String> = keys
            .into_iter()
            .filter(|k| !(key_value(k) == value && comment_of(k) == found.name))
            .collect();
        if kept.len() == before {
            return Ok(());
        }
        self.put_keys(&kept, &format!("remove SSH key {}", found.name))
            .await?;
        Ok(())
    }

    /// `POST /v2/pods/{id}/action` with `{"action": "start"}` (spec `podAction`: "boot a
    /// stopped pod (`EXITED` or `ERROR`) back toward `RUNNING`"; `200` with the pod).
    /// A `409` ("not valid for the pod's current status") is success when `getPod` shows
    /// the pod already `RUNNING`, `STARTING` or `PROVISIONING`. Errors: `400` → `Capacity`
    /// (see [`classify`]: the spec documents no capacity answer for a start), others as
    /// [`classify`] says; a pod that no longer exists (`404`) → `Failed`.
    async fn start(&self, _: &Location, _: &str, instance_id: &str) -> Result<()> {
        let what = format!("start pod {instance_id}");
        let pod = format!("/v2/pods/{}", encode_segment(instance_id));
        let body = json!({ "action": "start" });
        let action = format!("{pod}/action");
        let refused = match self.api.send(Method::POST, &action, &[], Some(&body)).await {
            Ok(_) => return Ok(()),
            Err(f) if f.http_status() == Some(409) => f,
            Err(f) => return Err(self.api.fail(&f, Call::StartPod.what(&what))),
        };
        let now: Pod = self.api.get(&pod, &[], Call::Other.what(&what)).await?;
        match now.status.as_str() {
            "RUNNING" | "STARTING" | "PROVISIONING" => Ok(()),
            other => {
                let mut e = self.api.fail(&refused, Call::StartPod.what(&what));
                e.msg = format!("{} (the pod is {other})", e.msg);
                Err(e)
            }
        }
    }
}
