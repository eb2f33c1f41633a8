//! Lambda Cloud (cloud name `lambda`), over its REST API v1 (OpenAPI 1.8.3,
//! `tests/fixtures/vendor-apis/lambda/openapi-1.8.3.json`).
//!
//! Mapping onto the contract (design 5):
//!
//! - `plan`: `GET /api/v1/instance-types`; one offer per (instance type, region listed in
//!   `regions_with_capacity_available`), id `lambda/<region>/<type>`, price
//!   `price_cents_per_hour / 100` USD. Lambda has no spot market.
//! - Shared object `ssh_key` (one per account): `observe_shared` / `create_shared` /
//!   `delete_shared` below; a taken name ("Key name must be unique.") is `Exists`.
//! - `prepare`: takes the project key the core prepared as the shared object (found among
//!   `GET /api/v1/ssh-keys` by its public key *value*, type and base64 ignoring the
//!   comment, else registered under [`crate::provider::project_key_name`],
//!   `gpuprov-<lineage8>-<fp12>`, or the next free `-<n>` of a name held by another
//!   value; without it, `InvalidRequest`); re-checks capacity; when the VM asks for ports, finds
//!   or creates the firewall ruleset `gpuprov-<vm>-<lineage8>` in the region (TCP 22 and
//!   the ports, from anywhere).
//! - `create`: `POST /api/v1/instance-operations/launch`, named `gpuprov-<vm>-<lineage8>`,
//!   tagged `gpuprov-vm-name=<vm>` and `gpuprov-lineage=<lineage>`, with the ruleset and the
//!   boot script as cloud-init `user_data`.
//! - `observe`: `GET /api/v1/instances` (the list has no tag filter), filtered here by
//!   region and both tags (or, for an instance without tags, the name).
//! - `delete`: `POST /api/v1/instance-operations/terminate`; `cleanup` deletes the ruleset
//!   (still attached to an instance → `InUse`).
//! - no `start`: Lambda has `instance-operations/restart` (a reboot of a running
//!   instance) but no stopped state (`InstanceStatus` has none), so `Feature::Start` is not
//!   declared.
//!
//! Errors (`errors.rs`): the `{"error": {code, message, suggestion}}` envelope decoded and
//! classified by `code` through a table; a body that is not the envelope (a proxy's HTML
//! page) is shown as one short line (`provider::cause::http_cause`); a refused connection
//! is `Unreachable`. Successful answers are read from their `{"data": …}` envelope.
//!
//! Credentials: the API key is read from the environment variable `LAMBDA_API_KEY` only
//! (Lambda publishes no official CLI with a configuration file; third-party CLIs' files,
//! such as `~/.lambda/config.json`, are not read). It is sent as
//! `Authorization: Bearer`, and never written to state, logs or error messages; a
//! `Credentials` error's help names the variable.
//!
//! SSH: the host is `Instance.ip`; port 22 and user `ubuntu` are Lambda Stack's defaults
//! and are *not* in the API description.
//!
//! Rate limits (API description `info.description`, `lambda/openapi-1.8.3.json`):
//! "generally limited to one request per second", the launch endpoint "one request per
//! 12 seconds, or five requests per minute". Both are declared in
//! [`LambdaProvider::default_capabilities`] (`rate_limits`) and the core enforces them
//! on every HTTP request (`machine::limits`); the adapter itself never sleeps. A 429 is
//! `Transient` with the server's `Retry-After`.

mod api;
mod errors;
mod offers;
#[cfg(test)]
mod tests;

use std::time::Duration;

use async_trait::async_trait;
use reqwest::Method;
use serde_json::{json, Value};

use api::{Instance, LaunchResponse, Ruleset, SshKey, TypesItem};
pub use errors::{classify, ApiError, INSUFFICIENT_CAPACITY};
pub use offers::gpu_model;
use offers::{model_of, offers_for, type_matches};

use crate::provider::kit::keys::{self, KeyListing, ListedKey};
use crate::provider::kit::{
    self, gpu, Adapter, Auth, Call, Credential, Lookup, RestClient, Source,
};
use crate::provider::{
    object_name, Capabilities, CloudProvider, EndpointClass, ErrorKind, Feature, Imported,
    InstanceSpec, InstanceStatus, Lineage, Location, Naming, Offer, ProviderError, RateLimit,
    ResourceRequest, Result, Seen, SharedFound, SharedObject, Shown, IDENTITY_LABEL, LINEAGE_LABEL,
};

// The kind of the project key, the one shared object this cloud declares
// (`shared::declared`): one per account.
use crate::provider::shared::SSH_KEY as SSH_KEY_KIND;

/// The cloud name.
pub const CLOUD: &str = "lambda";
/// The API base URL when neither config nor environment overrides it.
pub const DEFAULT_ENDPOINT: &str = "https://cloud.lambda.ai";
/// Environment variable overriding the endpoint (wins over `[cloud.lambda] endpoint`).
pub const ENDPOINT_ENV: &str = "GPUPROV_LAMBDA_ENDPOINT";
/// Environment variable holding the API key.
pub const API_KEY_ENV: &str = "LAMBDA_API_KEY";
/// SSH port of Lambda instances (not in the API description).
pub const SSH_PORT: u16 = 22;
/// Login user of Lambda Stack images (not in the API description).
pub const SSH_USER: &str = "ubuntu";

/// The credential; its `Debug` never shows the value.
pub use crate::provider::Secret as ApiKey;

/// Configuration of the Lambda adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LambdaSettings {
    /// API base URL override; `None` means [`DEFAULT_ENDPOINT`].
    pub endpoint: Option<String>,
    /// `None` when no key was found; calls then fail with `Credentials`.
    pub api_key: Option<ApiKey>,
    /// The state's lineage: `observe` only sees instances tagged with it.
    pub lineage: Lineage,
}

impl LambdaSettings {
    /// Settings from `[cloud.lambda] endpoint` and the environment: endpoint precedence
    /// `GPUPROV_LAMBDA_ENDPOINT` (non-empty) > `endpoint` > [`DEFAULT_ENDPOINT`]; the key
    /// from `LAMBDA_API_KEY`.
    pub fn from_env_and_config(endpoint: Option<String>, lineage: Lineage) -> LambdaSettings {
        let (key, _) = key_lookup(std::env::var(API_KEY_ENV).ok());
        LambdaSettings {
            endpoint: crate::provider::endpoint_from(ENDPOINT_ENV, endpoint),
            api_key: key.map(|c| c.secret),
            lineage,
        }
    }
}

/// The one place Lambda's key is read, given its value: the key (trimmed, non-blank) and
/// the places looked at.
fn key_lookup(value: Option<String>) -> (Option<Credential>, Vec<String>) {
    Lookup::new().env_value(API_KEY_ENV, value).finish()
}

/// The Lambda Cloud adapter. Construction does no I/O.
pub struct LambdaProvider {
    settings: LambdaSettings,
    api: RestClient,
    adapter: Adapter,
}

/// Normalised status of a Lambda `InstanceStatus`; `None` for `terminated` (gone).
fn status_of(s: &str) -> Option<InstanceStatus> {
    Some(match s {
        "booting" => InstanceStatus::Pending,
        "active" => InstanceStatus::Running,
        "unhealthy" => InstanceStatus::Failed("unhealthy".into()),
        "terminating" => InstanceStatus::Terminating,
        // Still listed, so deleted like a stopped one before the machine is replaced.
        "preempted" => InstanceStatus::Preempted {
            signal: "Lambda status `preempted`".into(),
            stopped: true,
        },
        "terminated" => return None,
        other => InstanceStatus::Failed(format!("unknown Lambda status `{other}`")),
    })
}

/// The launch request's path (`POST`), the [`EndpointClass::Launch`](crate::provider::EndpointClass::Launch) one: Lambda limits it
/// apart from the other requests.
const LAUNCH_PATH: &str = "/api/v1/instance-operations/launch";

impl LambdaProvider {
    /// An adapter for `settings`. Never fails and does no I/O.
    pub fn new(settings: LambdaSettings) -> LambdaProvider {
        // The only place: Lambda has no CLI configuration file.
        let looked_in = [Source::Env(API_KEY_ENV).to_string()];
        let missing = format!(
            "no Lambda API key: set {API_KEY_ENV} ({})",
            kit::credentials::looked_in(&looked_in)
        );
        let endpoint = settings.endpoint.as_deref();
        let (adapter, credential) = Adapter::new(CLOUD, endpoint, Self::default_capabilities())
            .with_lineage(&settings.lineage)
            .with_key(settings.api_key.as_ref(), &looked_in[0]);
        let base = endpoint.unwrap_or(DEFAULT_ENDPOINT);
        let api = RestClient::new(base, Auth::Bearer, credential, missing, &errors::CLASSIFIER)
            .gated(adapter.gate())
            .with_endpoint_class(Method::POST, LAUNCH_PATH, EndpointClass::Launch)
            .with_error_decoder(errors::decode_error)
            .with_envelope(errors::data);
        LambdaProvider {
            settings,
            api,
            adapter,
        }
    }

    /// Replaces the declared capabilities (tests use short timeouts and poll intervals).
    pub fn with_capabilities(mut self, caps: Capabilities) -> LambdaProvider {
        self.adapter.capabilities = caps;
        self
    }

    /// The capabilities Lambda's documentation implies: boot script (cloud-init), firewall
    /// and GPUs; no spot. Lambda instances take several minutes to boot and 15 to go.
    /// Rate limits, from the API description (`lambda/openapi-1.8.3.json`,
    /// `info.description`): every request 1 per second (1 request/s), launch requests 1
    /// per 12 s (0.083 requests/s; the stricter reading of "one request per 12 seconds, or
    /// five requests per minute"). With the rate declared, a few calls may be in flight.
    pub fn default_capabilities() -> Capabilities {
        use Feature::*;
        const SOURCE: &str =
            "tests/fixtures/vendor-apis/lambda/openapi-1.8.3.json, info.description";
        Capabilities {
            delete_timeout: Duration::from_secs(15 * 60),
            max_concurrency: 4,
            rate_limits: vec![
                RateLimit::all(1, Duration::from_secs(1), SOURCE),
                RateLimit::of(EndpointClass::Launch, 1, Duration::from_secs(12), SOURCE),
            ],
            ..kit::adapter::vm_capabilities(&[
                BootScript,
                Firewall,
                Gpu,
                Kubernetes,
                Import,
                SharedObjects,
            ])
        }
    }

    pub fn settings(&self) -> &LambdaSettings {
        &self.settings
    }

    /// The per-VM object name of instances and firewall rulesets,
    /// `gpuprov-<vm>-<lineage8>` (at most 57 characters, Lambda allows 64).
    fn object_name(&self, vm_name: &str) -> String {
        object_name(vm_name, &self.settings.lineage)
    }

    async fn instance_types(&self) -> Result<Vec<TypesItem>> {
        let path = "/api/v1/instance-types";
        let map: std::collections::BTreeMap<String, TypesItem> = self
            .api
            .get(path, &[], Call::other("list instance types"))
            .await?;
        Ok(map.into_values().collect())
    }

    async fn rulesets(&self) -> Result<Vec<Ruleset>> {
        let call = Call::other("list firewall rulesets");
        self.api.get("/api/v1/firewall-rulesets", &[], call).await
    }

    /// `GET /api/v1/ssh-keys` read for the project key `public_key` (names are unique).
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

    /// The id of the VM's ruleset in `region`, created with TCP 22 and `ports` when missing.
    async fn ensure_ruleset(&self, name: &str, region: &str, ports: &[u16]) -> Result<String> {
        if let Some(r) = self
            .rulesets()
            .await?
            .into_iter()
            .find(|r| r.name == name && r.region.name == region)
        {
            return Ok(r.id);
        }
        let rules: Vec<Value> = kit::ports::with_ssh(ports)
            .iter()
            .map(|p| {
                json!({
                    "protocol": "tcp",
                    "port_range": [p, p],
                    "source_network": "0.0.0.0/0",
                    "description": format!("gpuprov: tcp {p}"),
                })
            })
            .collect();
        let body = json!({ "name": name, "region": region, "rules": rules });
        let what = format!("create firewall ruleset {name} in {region}");
        let created: Ruleset = self
            .api
            .post("/api/v1/firewall-rulesets", &body, Call::other(&what))
            .await?;
        Ok(created.id)
    }

    /// `GET /api/v1/ssh-keys`: the account's registered keys.
    async fn ssh_keys(&self) -> Result<Vec<SshKey>> {
        self.api
            .get("/api/v1/ssh-keys", &[], Call::other("list SSH keys"))
            .await
    }

    /// `GET /api/v1/instances`: every instance of the account (the API has no filter).
    async fn listing(&self) -> Result<Vec<Instance>> {
        self.api
            .get("/api/v1/instances", &[], Call::other("list instances"))
            .await
    }

    /// `POST /api/v1/instance-operations/terminate` for `ids`, `Ok(false)` when Lambda
    /// answered that one of them does not exist.
    async fn terminate(&self, ids: &[String]) -> Result<bool> {
        let body = json!({ "instance_ids": ids });
        let path = "/api/v1/instance-operations/terminate";
        match self.api.send(Method::POST, path, &[], Some(&body)).await {
            Ok(_) => Ok(true),
            Err(f) if errors::is_not_found(&f) => Ok(false),
            Err(f) => Err(self.api.fail(&f, Call::other("terminate instances"))),
        }
    }
}

/// A listed instance as the contract's listing shows it, when it is in `region` and not
/// `terminated`: its tags (the identity), its name (`gpuprov-<vm>-<lineage8>`: an
/// imported instance's identity, since Lambda cannot change tags), type and price
/// (`instance_type.price_cents_per_hour`). Status: booting → Pending, active → Running,
/// unhealthy → Failed, preempted → Preempted (stopped: still listed), terminating →
/// Terminating. SSH endpoint `ip:22`, user `ubuntu`, once `ip` is set.
fn seen_at(i: &Instance, region: &str) -> Option<Seen> {
    if i.region.as_ref().map(|r| r.name.as_str()) != Some(region) {
        return None;
    }
    let tag = |k: &str| {
        i.tags
            .as_ref()
            .and_then(|t| t.iter().find(|t| t.key == k).map(|t| t.value.as_str()))
    };
    let identity = Shown::labels(tag(IDENTITY_LABEL), tag(LINEAGE_LABEL))
        .named(i.name.as_deref(), Naming::Object);
    Some(Seen {
        ssh: crate::provider::kit::ports::ssh_at(i.ip.as_deref(), SSH_PORT, SSH_USER),
        instance_type: i.instance_type.as_ref().map(|t| t.name.clone()),
        price_per_hour: i
            .instance_type
            .as_ref()
            .and_then(|t| t.price_cents_per_hour)
            .map(|c| c as f64 / 100.0),
        ..Seen::new(i.id.clone(), status_of(&i.status)?, identity)
    })
}

#[async_trait]
impl CloudProvider for LambdaProvider {
    /// Name, endpoint, capabilities ([`LambdaProvider::default_capabilities`]) and
    /// `LAMBDA_API_KEY`, found or not.
    fn adapter(&self) -> &Adapter {
        &self.adapter
    }

    /// Offers from `GET /api/v1/instance-types`: one per type matching the ask (GPU model
    /// compared ignoring case and punctuation, exact GPU count when asked) and region with
    /// capacity (exact names when the ask lists regions). An empty list means "no capacity
    /// now". Errors: a spot ask, or no type with that GPU model and count → `InvalidRequest`.
    async fn plan(&self, req: &ResourceRequest) -> Result<Vec<Offer>> {
        kit::offer::refuse_spot(req, "Lambda has no spot instances")?;
        let types = self.instance_types().await?;
        if !types.iter().any(|t| type_matches(t, req)) {
            let gpus = |t: &TypesItem| t.instance_type.specs.gpus;
            let have = types
                .iter()
                .filter_map(|t| model_of(t).map(|m| format!("{m} x{}", gpus(t))));
            return Err(gpu::no_type_for("Lambda has no instance type", req, have));
        }
        Ok(offers_for(&types, req))
    }

    /// Takes the project key the core prepared ([`keys::prepared_key`]; missing →
    /// `InvalidRequest`), re-checks capacity for the offer (gone → `Unavailable`), and when `spec.ports` is non-empty finds or creates the VM's
    /// firewall ruleset in the region. Returns `{"ssh_key_name", "firewall_ruleset_id"?}`.
    async fn prepare(&self, offer: &Offer, spec: &InstanceSpec) -> Result<Value> {
        let key_name = keys::prepared_key(CLOUD, spec)?.name.clone();
        let region = &offer.location.region;
        let types = self.instance_types().await?;
        let available = types.iter().any(|t| {
            t.instance_type.name == offer.instance_type
                && t.regions_with_capacity_available
                    .iter()
                    .any(|r| r.name == *region)
        });
        if !available {
            return Err(ProviderError::new(
                ErrorKind::Unavailable,
                format!(
                    "lambda: no capacity left for {} in {region}",
                    offer.instance_type
                ),
            ));
        }
        let mut out = json!({ "ssh_key_name": key_name });
        if !spec.ports.is_empty() {
            let name = self.object_name(&spec.vm_name);
            let id = self.ensure_ruleset(&name, region, &spec.ports).await?;
            out["firewall_ruleset_id"] = Value::String(id);
        }
        Ok(out)
    }

    /// `POST /api/v1/instance-operations/launch` with the region, type, key, name
    /// `gpuprov-<vm>-<lineage8>`, both identity tags, the ruleset, `spec.image` as image
    /// family, and the boot script as `user_data`. Returns the first instance id.
    ///
    /// Lambda's launch takes no idempotency token (`spec.client_token` is unused): a launch
    /// repeated after a crash is avoided by the core's observe-before-create, which finds
    /// the instance by its tags.
    async fn create(&self, offer: &Offer, prepared: &Value, spec: &InstanceSpec) -> Result<String> {
        let lineage = crate::provider::check_spec_lineage(CLOUD, &self.settings.lineage, spec)?;
        let key = kit::offer::prepared(prepared, "ssh_key_name", Value::as_str)?;
        let mut body = json!({
            "region_name": offer.location.region,
            "instance_type_name": offer.instance_type,
            "ssh_key_names": [key],
            "name": self.object_name(&spec.vm_name),
            "tags": [
                { "key": IDENTITY_LABEL, "value": spec.vm_name },
                { "key": LINEAGE_LABEL, "value": lineage.as_str() },
            ],
        });
        if let Some(id) = prepared.get("firewall_ruleset_id").and_then(Value::as_str) {
            body["firewall_rulesets"] = json!([{ "id": id }]);
        }
        if let Some(image) = spec.image.as_deref().filter(|s| !s.is_empty()) {
            body["image"] = json!({ "family": image });
        }
        if let Some(b) = &spec.boot_script {
            body["user_data"] = Value::String(crate::provider::cloud_init_user_data(b)?);
        }
        let what = format!(
            "launch {} in {}",
            offer.instance_type, offer.location.region
        );
        let path = LAUNCH_PATH;
        let r: LaunchResponse = self.api.post(path, &body, Call::other(&what)).await?;
        r.instance_ids.into_iter().next().ok_or_else(|| {
            ProviderError::new(
                ErrorKind::Failed,
                format!("lambda {what}: no instance id in the response"),
            )
        })
    }

    /// `GET /api/v1/instances` (the whole account: the API has no filter), keeping the
    /// instances in `at.region` ([`seen_at`]).
    async fn instances(&self, at: &Location, _only_vm: Option<&str>) -> Result<Vec<Seen>> {
        let list = self.listing().await?;
        Ok(list.iter().filter_map(|i| seen_at(i, &at.region)).collect())
    }

    /// `GET /api/v1/instances/{id}`, then `POST /api/v1/instances/{id}` with the
    /// identity name (`gpuprov-<vm>-<lineage8>`): Lambda's API can change an instance's
    /// name but not its tags (`InstanceModificationRequest` has only `name`), and
    /// `observe` matches that name. An instance tagged with another identity, or in
    /// another region, is refused.
    async fn import(&self, at: &Location, vm_name: &str, id: &str) -> Result<Imported> {
        let path = format!("/api/v1/instances/{id}");
        let instance: Instance = match self.api.send(Method::GET, &path, &[], None).await {
            Ok(v) => self.api.parse(v, Call::other("get instance"))?,
            Err(f) if errors::is_not_found(&f) => {
                return Err(ProviderError::new(
                    ErrorKind::InvalidRequest,
                    format!("no Lambda instance {id}"),
                ))
            }
            Err(f) => return Err(self.api.fail(&f, Call::other("get instance"))),
        };
        let region = instance.region.as_ref().map(|r| r.name.as_str());
        if at.cloud != CLOUD || region != Some(at.region.as_str()) {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "Lambda instance {id} is in {}, not {at}",
                    region.unwrap_or("no region")
                ),
            ));
        }
        let tag = |k: &str| {
            instance
                .tags
                .as_ref()
                .and_then(|t| t.iter().find(|t| t.key == k).map(|t| t.value.clone()))
        };
        let lineage = &self.settings.lineage;
        if let Some(vm) = tag(IDENTITY_LABEL) {
            if vm != vm_name || tag(LINEAGE_LABEL).as_deref() != Some(lineage.as_str()) {
                return Err(ProviderError::new(
                    ErrorKind::InvalidRequest,
                    format!("Lambda instance {id} carries the identity of gpuprov VM {vm}"),
                ));
            }
        }
        let name = object_name(vm_name, lineage);
        let renamed: Instance = self
            .api
            .post(
                &path,
                &json!({ "name": name }),
                Call::other("rename instance"),
            )
            .await?;
        let observed = seen_at(&renamed, &at.region)
            .map(Seen::observed)
            .ok_or_else(|| {
                ProviderError::new(
                    ErrorKind::InvalidRequest,
                    format!("Lambda instance {id} is terminated"),
                )
            })?;
        Ok(Imported {
            observed,
            identity: format!(
                "renamed to {name} (Lambda's API cannot change tags: gpuprov finds it by this \
                 name)"
            ),
        })
    }

    /// `POST /api/v1/instance-operations/terminate`. An unknown instance
    /// (`global/object-does-not-exist`) is success; with several ids, each is then
    /// terminated alone so the others still go.
    async fn delete(&self, _at: &Location, _vm_name: &str, instance_ids: &[String]) -> Result<()> {
        if instance_ids.is_empty() || self.terminate(instance_ids).await? {
            return Ok(());
        }
        if instance_ids.len() > 1 {
            for id in instance_ids {
                self.terminate(std::slice::from_ref(id)).await?;
            }
        }
        Ok(())
    }

    /// The project key among `GET /api/v1/ssh-keys`, found by *value* (compared without
    /// the comment), never by name; `None` when it is not registered.
    async fn observe_shared(
        &self,
        obj: &SharedObject,
        public_key: &str,
    ) -> Result<Option<SharedFound>> {
        obj.expect(CLOUD, SSH_KEY_KIND)?;
        Ok(self.key_listing(public_key).await?.found())
    }

    /// `POST /api/v1/ssh-keys` under [`project_key_name`](crate::provider::project_key_name), or the first free `-<n>`
    /// suffix when a key of another value holds it (Lambda's names are unique). A name
    /// taken meanwhile ("Key name must be unique.") is `Exists`: observed again.
    async fn create_shared(&self, obj: &SharedObject, public_key: &str) -> Result<SharedFound> {
        obj.expect(CLOUD, SSH_KEY_KIND)?;
        let name = self.key_listing(public_key).await?.name_to_register()?;
        let what = format!("register SSH key {name}");
        let body = json!({ "name": name, "public_key": public_key.trim() });
        let v = self
            .api
            .send(Method::POST, "/api/v1/ssh-keys", &[], Some(&body))
            .await
            .map_err(|f| self.api.fail(&f, Call::other(&what)))?;
        let k: SshKey = self.api.parse(v, Call::other(&what))?;
        Ok(keys::registered(k.id, Some(k.name), name))
    }

    /// `DELETE /api/v1/ssh-keys/{id}` when `GET /api/v1/ssh-keys` still lists it: Lambda
    /// answers an unknown id with `global/invalid-parameters` (HTTP 400, its description
    /// has no 404 here), which cannot be told from a real refusal, so a key already gone
    /// is recognised by the listing. Instances keep the key they were launched with.
    async fn delete_shared(&self, obj: &SharedObject, found: &SharedFound) -> Result<()> {
        obj.expect(CLOUD, SSH_KEY_KIND)?;
        if found.id.is_empty() {
            return Ok(());
        }
        let listed = self.ssh_keys().await?;
        if !listed.iter().any(|k| k.id == found.id) {
            return Ok(());
        }
        let what = format!("delete SSH key {}", found.name);
        self.api
            .delete(
                &format!("/api/v1/ssh-keys/{}", found.id),
                errors::is_not_found,
                Call::other(&what),
            )
            .await
    }

    /// Deletes the VM's firewall ruleset in `at.region`, if any (not found → success; still
    /// attached to an instance, `firewall-rulesets/firewall-ruleset-in-use` → `InUse`). The
    /// project key stays registered: it is shared by the project's VMs.
    async fn cleanup(&self, at: &Location, vm_name: &str) -> Result<()> {
        if at.cloud != CLOUD {
            return Ok(());
        }
        let name = self.object_name(vm_name);
        let what = format!("delete firewall ruleset {name}");
        for r in self
            .rulesets()
            .await?
            .into_iter()
            .filter(|r| r.name == name && r.region.name == at.region)
        {
            let path = format!("/api/v1/firewall-rulesets/{}", r.id);
            self.api
                .delete(&path, errors::is_not_found, Call::other(&what))
                .await?;
        }
        Ok(())
    }
}
