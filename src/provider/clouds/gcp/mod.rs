//! Google Cloud (cloud name `gcp`), over the Compute Engine API v1 (the discovery document
//! `compute.v1.json` in `tests/fixtures/vendor-apis/gcp/`; base
//! `https://compute.googleapis.com/compute/v1/`).
//!
//! Mapping onto the contract (design 5, with the brief's long-running-operation rule):
//!
//! - `plan`: the static ladder of [`catalog`] (GPU model → machine type, list prices on
//!   demand and spot), one offer per zone offering the accelerator (capacity on Compute
//!   Engine is zonal), id `gcp/<region>/<type>/<zone>`. Without a credential or a project
//!   the zones are the catalog's, so `plan` works offline; with both, they are the
//!   project's own `GET projects/{p}/aggregated/acceleratorTypes` (one paginated call), and
//!   an error of that call is the plan's error.
//! - `prepare`: checks that the zone has the machine type (`machineTypes.get`) and, for
//!   N1 hosts, the accelerator (`acceleratorTypes.get`) — a 404 is `Unavailable` for that
//!   offer —, resolves the image (`images.getFromFamily` for a family, `images.get` for an
//!   image; default [`DEFAULT_IMAGE`]; one that does not exist is `InvalidRequest`) and
//!   makes the VM's firewall rule `gpuprov-<vm>-<lineage8>` (TCP 22 and the VM's ports to
//!   its network tag, on the `default` network): read, created when missing (`409` means
//!   a concurrent run made it), patched when its ports differ. Returns `{"image",
//!   "firewall", "network_tag", "zone"}`.
//! - `create`: one `instances.insert` (see [`api::insert_body`]) named
//!   `gpuprov-<vm>-<lineage8>-<hhhh>` (4 hex digits of the attempt's token) with
//!   `requestId` derived from the attempt's client token ([`api::request_id`]): GCP answers
//!   a resent insert with the same `requestId` with the first one's operation, so a create
//!   repeated after a crash never starts a second instance. It returns the instance name
//!   as soon as the insert is accepted, without waiting for its operation; an insert
//!   answered with an operation that already failed (a resend of a failed one) is that
//!   operation's error, and a `409 alreadyExists` for its own name is success.
//! - `instances` (the listing `observe`, `observe_location` and `list` derive from):
//!   `instances.list` of the zone (narrowed by both identity labels for one VM), plus
//!   `zoneOperations.list` of the zone's inserts: an insert of this lineage whose
//!   instance is not listed is `Pending` while it runs and [`InstanceStatus::Refused`]
//!   with its classified error once it failed (a late
//!   `ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS]` is `Capacity` for that zone's offer, a
//!   late `QUOTA_EXCEEDED` is `Quota`). Without a zone, the region's instances come from
//!   `aggregated/instances`, each with the zone its scope names (so a machine adopted from
//!   that listing by `state recover` is then observed and deleted in its zone). Each
//!   instance shows its identity labels ([`api::seen`]); statuses: see
//!   [`api::status_of`]; the SSH endpoint is the access config's `natIP`, port 22, user
//!   [`SSH_USER`].
//! - `delete`: `instances.delete` per id; `404` is success unless an insert of that name
//!   is still running (then `Transient`: the instance is not there yet, and a delete now
//!   would miss it).
//! - `cleanup`: deletes the VM's firewall rule (`404` is success; a firewall rule is never
//!   "in use" in Compute Engine: rules apply by tag).
//! - `start` ([`Feature::Start`]): `instances.start` (a stopped VM is `TERMINATED`).
//!
//! Errors: [`errors`] (Google's JSON error body, operation errors, token endpoint errors,
//! and the table). Nothing here waits: operations are followed by `observe`, which the
//! executor polls.
//!
//! Credentials ([`auth`]): `GOOGLE_APPLICATION_CREDENTIALS`, gcloud's application default
//! credentials, or the metadata server on a Compute Engine VM; the access token is held
//! as a [`crate::provider::Secret`] and every token issued is scrubbed from errors. The project:
//! `[cloud.gcp] project`, else `GOOGLE_CLOUD_PROJECT`, else the credential's own
//! (`project_id` of a key, `quota_project_id` of a user login). The endpoint:
//! `GPUPROV_GCP_ENDPOINT`, else `[cloud.gcp] endpoint`, else [`DEFAULT_ENDPOINT`]: the root
//! URL, to which `/compute/v1` is appended unless it ends in it.

pub mod api;
pub mod auth;
pub mod catalog;
pub mod errors;
mod settings;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Method;
use serde_json::{json, Value};

use crate::provider::kit::paginate::{self, Cursor, Next};
use crate::provider::kit::{self, Adapter, Auth, Call, Credential, Failure, RestClient};
use crate::provider::{
    Capabilities, CloudProvider, ErrorKind, Feature, InstanceSpec, InstanceStatus, Location, Offer,
    ProviderError, ResourceRequest, Result, Secret, Seen, Shown,
};
use api::{AggregatedPage, Firewall, Image, Instance, Operation, Page};
use auth::Tokens;
use catalog::{Availability, MachineType};
use errors::{is_already_there, CLASSIFIER, CREATE, PREPARE};
pub use settings::GcpSettings;

/// The cloud name.
pub const CLOUD: &str = "gcp";
/// The API root when neither config nor environment overrides it (discovery `rootUrl`).
pub const DEFAULT_ENDPOINT: &str = "https://compute.googleapis.com";
/// The API's path under the root (discovery `servicePath`).
pub const API_PATH: &str = "/compute/v1";
/// Environment variable overriding the endpoint (wins over `[cloud.gcp] endpoint`).
pub const ENDPOINT_ENV: &str = "GPUPROV_GCP_ENDPOINT";
/// Environment variable naming the project when the config does not.
pub const PROJECT_ENV: &str = "GOOGLE_CLOUD_PROJECT";
/// The login user: the one `ssh-keys` metadata creates (`gpuprov:<key>`).
pub const SSH_USER: &str = "gpuprov";
/// The SSH port (the image's sshd; the firewall rule opens it).
pub const SSH_PORT: u16 = 22;
/// The boot image when the VM sets none: Canonical's Ubuntu 22.04 with the NVIDIA 550
/// driver, from Google's accelerator image project (a family, resolved by `prepare`).
pub const DEFAULT_IMAGE: &str =
    "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accelerator-2204-amd64-with-nvidia-550";
/// Items asked per page of a list call (the API's maximum is 500).
const PAGE_SIZE: u32 = 500;

/// The GCP adapter. Construction does no I/O.
pub struct GcpProvider {
    settings: GcpSettings,
    api: RestClient,
    adapter: Adapter,
    /// The `Credentials` message when no credential was found.
    missing: String,
}

fn invalid(msg: impl Into<String>) -> ProviderError {
    ProviderError::new(ErrorKind::InvalidRequest, msg)
}

fn unavailable(msg: impl Into<String>) -> ProviderError {
    ProviderError::new(ErrorKind::Unavailable, msg)
}

/// The API base for an endpoint override `root` (`/compute/v1` appended unless present).
pub fn api_base(root: Option<&str>) -> String {
    let root = root.unwrap_or(DEFAULT_ENDPOINT).trim_end_matches('/');
    if root.ends_with(API_PATH) {
        root.to_string()
    } else {
        format!("{root}{API_PATH}")
    }
}

impl GcpProvider {
    /// An adapter for `settings`: one [`RestClient`] sending the access token of the
    /// credential's [`Tokens`] as a bearer token, with Google's error decoder and the GCP
    /// table. Never fails and does no I/O.
    pub fn new(settings: GcpSettings) -> GcpProvider {
        let adapter = Adapter::new(
            CLOUD,
            settings.endpoint.as_deref(),
            Self::default_capabilities(),
        )
        .with_credential_at(
            settings.credential.as_ref().map(|c| &c.source),
            &settings.looked_in,
            settings.unusable.as_deref(),
        )
        .with_lineage(&settings.lineage);
        // The token source sends the token; this only says where it was found.
        let report = settings.credential.as_ref().map(|c| Credential {
            secret: Secret::new(String::new()),
            source: c.source.clone(),
        });
        let missing = match &settings.unusable {
            Some(why) => format!("no usable Google credential: {why}"),
            None => format!(
                "no Google credential: set {} to a service-account key file, or run `gcloud \
                 auth application-default login` ({})",
                auth::CREDENTIALS_ENV,
                kit::credentials::looked_in(&settings.looked_in)
            ),
        };
        let base = api_base(settings.endpoint.as_deref());
        let mut api = RestClient::new(&base, Auth::Bearer, report, missing.clone(), &CLASSIFIER)
            .gated(adapter.gate())
            .with_error_decoder(errors::decode);
        if let Some(c) = &settings.credential {
            api = api.with_token_source(Arc::new(Tokens::new(c.clone())));
        }
        GcpProvider {
            settings,
            api,
            adapter,
            missing,
        }
    }

    /// Replaces the declared capabilities (tests use short timeouts and poll intervals).
    pub fn with_capabilities(mut self, caps: Capabilities) -> GcpProvider {
        self.adapter.capabilities = caps;
        self
    }

    /// What gpuprov declares for GCP: boot script (cloud-init `user-data`), firewall,
    /// spot, GPUs, k3s and start; the default regions of [`catalog::DEFAULT_REGIONS`]; 15
    /// minutes to delete (a GPU VM's shutdown can be slow). Compute Engine's API rate
    /// limits are per project quotas the discovery document does not state, so no
    /// `rate_limits` are declared; 8 concurrent calls keep gpuprov well within.
    pub fn default_capabilities() -> Capabilities {
        use Feature::*;
        Capabilities {
            delete_timeout: Duration::from_secs(15 * 60),
            default_regions: catalog::DEFAULT_REGIONS
                .iter()
                .map(|r| r.to_string())
                .collect(),
            ..kit::adapter::vm_capabilities(&[
                BootScript, Firewall, Spot, Gpu, Kubernetes, Start, Zones,
            ])
        }
    }

    /// The settings the adapter was built with (the credential's secrets stay redacted in
    /// their `Debug`).
    pub fn settings(&self) -> &GcpSettings {
        &self.settings
    }

    /// The project, or `InvalidRequest` saying how to set one (after the credential:
    /// without one, calls say that first).
    fn project(&self) -> Result<&str> {
        if self.settings.credential.is_none() {
            let f = Failure::no_credential(self.missing.clone());
            return Err(self.api.fail(&f, Call::other("use the Compute Engine API")));
        }
        self.settings
            .project
            .as_deref()
            .filter(|p| !p.trim().is_empty())
            .ok_or_else(|| {
                invalid(format!(
                    "gcp: no project: set `project` in [cloud.gcp] (or {PROJECT_ENV}); the \
                     credential names none"
                ))
            })
    }

    /// Every item of a paginated list at `path` (`maxResults`, `pageToken`,
    /// `nextPageToken`), parsed by `page`.
    async fn pages<T>(
        &self,
        path: &str,
        query: &[(&str, String)],
        what: &str,
        page: impl Fn(Value) -> Result<(Vec<T>, Option<String>)>,
    ) -> Result<Vec<T>> {
        let page = &page;
        paginate::all_pages(what, |cursor| {
            let mut q: Vec<(&str, String)> = query.to_vec();
            q.push(("maxResults", PAGE_SIZE.to_string()));
            if let Cursor::Token(t) = &cursor {
                q.push(("pageToken", t.clone()));
            }
            async move {
                let v: Value = self.api.get(path, &q, Call::other(what)).await?;
                let (items, next) = page(v)?;
                Ok((items, next.map(Next::Token).unwrap_or(Next::Done)))
            }
        })
        .await
    }

    /// A zonal list (`items` of `T`).
    async fn zonal_list<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
        what: &str,
    ) -> Result<Vec<T>> {
        self.pages(path, query, what, |v| {
            let p: Page<T> = self.api.parse(v, Call::other(what))?;
            Ok((p.items, p.next_page_token))
        })
        .await
    }

    /// An aggregated list: `(zone, item)` of the items under `field`.
    async fn aggregated<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
        field: &str,
        what: &str,
    ) -> Result<Vec<(String, T)>> {
        self.pages(path, query, what, |v| {
            let p: AggregatedPage = self.api.parse(v, Call::other(what))?;
            let mut items = Vec::new();
            for (zone, item) in p.zonal(field) {
                items.push((
                    zone.to_string(),
                    self.api.parse(item.clone(), Call::other(what))?,
                ));
            }
            Ok((items, p.next_page_token))
        })
        .await
    }

    /// `(accelerator, zone)` for the accelerators `wanted` that the project can use,
    /// from `aggregated/acceleratorTypes` (deprecated-obsolete types left out).
    async fn accelerator_zones(
        &self,
        project: &str,
        wanted: &[&str],
    ) -> Result<Vec<(String, String)>> {
        let path = format!("/projects/{project}/aggregated/acceleratorTypes");
        let types: Vec<(String, Value)> = self
            .aggregated(&path, &[], "acceleratorTypes", "list accelerator types")
            .await?;
        Ok(types
            .into_iter()
            .filter_map(|(zone, t)| {
                let name = t["name"].as_str()?.to_string();
                let gone = matches!(
                    t["deprecated"]["state"].as_str(),
                    Some("OBSOLETE" | "DELETED")
                );
                (wanted.contains(&name.as_str()) && !gone).then_some((name, zone))
            })
            .collect())
    }

    /// `GET path`, `None` when it is not found (404), else the classified failure.
    async fn get_opt(&self, path: &str, call: Call<'_>) -> Result<Option<Value>> {
        match self.api.send(Method::GET, path, &[], None).await {
            Ok(v) => Ok(Some(v)),
            Err(f) if f.is_not_found() => Ok(None),
            Err(f) => Err(self.api.fail(&f, call)),
        }
    }

    /// The image `spec_image` names (else [`DEFAULT_IMAGE`]): a family
    /// (`projects/P/global/images/family/F`, or `P/F`) through `images.getFromFamily`, an
    /// image (`projects/P/global/images/NAME`) through `images.get`. Returns its
    /// `selfLink`. Errors: another form, or one that does not exist → `InvalidRequest`.
    async fn resolve_image(&self, spec_image: Option<&str>) -> Result<String> {
        let image = spec_image
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .unwrap_or(DEFAULT_IMAGE);
        let Some(path) = api::image_path(image) else {
            return Err(invalid(format!(
                "gcp: image {image:?}: expected projects/PROJECT/global/images/family/FAMILY, \
                 projects/PROJECT/global/images/NAME or PROJECT/FAMILY"
            )));
        };
        let what = format!("read image {image}");
        let found = self.get_opt(&path, Call::named(PREPARE, &what)).await?;
        let Some(v) = found else {
            return Err(invalid(format!(
                "gcp: image {image} does not exist (or the project cannot use it)"
            )));
        };
        let img: Image = self.api.parse(v, Call::other(&what))?;
        if img.status != "READY" && !img.status.is_empty() {
            return Err(invalid(format!(
                "gcp: image {} is {}, not READY",
                img.name, img.status
            )));
        }
        Ok(img.self_link)
    }

    /// The VM's firewall rule, made or fixed as `prepare` says (module docs).
    async fn ensure_firewall(&self, project: &str, name: &str, spec: &InstanceSpec) -> Result<()> {
        let lineage = &self.settings.lineage;
        let body = api::firewall_body(project, name, &spec.vm_name, lineage, &spec.ports);
        let path = format!("/projects/{project}/global/firewalls/{name}");
        let what = format!("read firewall {name}");
        match self.get_opt(&path, Call::other(&what)).await? {
            Some(v) => {
                let fw: Firewall = self.api.parse(v, Call::other(&what))?;
                if api::firewall_matches(&fw, name, &spec.ports) {
                    return Ok(());
                }
                let what = format!("update firewall {name}");
                let patch = self.api.send(Method::PATCH, &path, &[], Some(&body)).await;
                patch
                    .map(|_| ())
                    .map_err(|f| self.api.fail(&f, Call::named(PREPARE, &what)))
            }
            None => {
                let what = format!("create firewall {name}");
                let list = format!("/projects/{project}/global/firewalls");
                match self.api.send(Method::POST, &list, &[], Some(&body)).await {
                    Ok(_) => Ok(()),
                    Err(f) if is_already_there(&f) => Ok(()),
                    Err(f) => Err(self.api.fail(&f, Call::named(PREPARE, &what))),
                }
            }
        }
    }

    /// The insert operations of `zone` (PENDING, RUNNING or DONE).
    async fn insert_operations(&self, project: &str, zone: &str) -> Result<Vec<Operation>> {
        let path = format!("/projects/{project}/zones/{zone}/operations");
        let q = [("filter", api::INSERT_OPERATIONS.to_string())];
        self.zonal_list(&path, &q, &format!("list operations of {zone}"))
            .await
    }

    /// The classified error of a failed operation `op` of call `name` in `region`.
    fn operation_error(
        &self,
        op: &Operation,
        name: &'static str,
        what: &str,
        region: &str,
    ) -> Option<ProviderError> {
        let err = op.failure()?;
        let f = errors::operation_failure(err, op.http_error_status_code);
        Some(self.api.fail(&f, Call::named(name, what).in_region(region)))
    }

    /// The instances in every zone of `region` as (zone, instance):
    /// `aggregated/instances` (all pages), narrowed by `filter` when given.
    async fn region_instances(
        &self,
        project: &str,
        region: &str,
        filter: Option<String>,
    ) -> Result<Vec<(String, Instance)>> {
        let path = format!("/projects/{project}/aggregated/instances");
        let q: Vec<(&str, String)> = filter.map(|f| ("filter", f)).into_iter().collect();
        let what = format!("list instances of {region}");
        let all: Vec<(String, Instance)> = self.aggregated(&path, &q, "instances", &what).await?;
        Ok(all
            .into_iter()
            .filter(|(z, _)| catalog::region_of(z) == Some(region))
            .collect())
    }

    /// The machine type of an offer, as the catalog knows it.
    fn machine_type(offer: &Offer) -> Result<&'static MachineType> {
        catalog::of_instance_type(&offer.instance_type).ok_or_else(|| {
            invalid(format!(
                "gcp: {} is not a machine type of gpuprov's GCP catalog",
                offer.instance_type
            ))
        })
    }

    fn zone_of(at: &Location) -> Result<&str> {
        at.zone
            .as_deref()
            .ok_or_else(|| invalid(format!("gcp: {at} names no zone (GCP offers are per zone)")))
    }
}

#[async_trait]
impl CloudProvider for GcpProvider {
    /// Name, endpoint, capabilities ([`GcpProvider::default_capabilities`]) and the
    /// credential found, or every place looked at.
    fn adapter(&self) -> &Adapter {
        &self.adapter
    }

    /// Offers from the catalog (module docs). Errors: the catalog's `InvalidRequest`, or
    /// the `acceleratorTypes` call's error when a credential and a project are set.
    async fn plan(&self, req: &ResourceRequest) -> Result<Vec<Offer>> {
        let offline = catalog::plan(req, &Availability::Static)?;
        let live = self.settings.credential.is_some() && self.settings.project.is_some();
        if !live {
            return Ok(offline);
        }
        let project = self.project()?;
        let wanted = catalog::accelerators_for(req);
        let listed = self.accelerator_zones(project, &wanted).await?;
        catalog::plan(req, &Availability::Listed(listed))
    }

    /// Checks the zone's machine type (and accelerator for N1), resolves the image and
    /// makes the firewall rule (module docs). Returns `{"image", "firewall",
    /// "network_tag", "zone"}`.
    async fn prepare(&self, offer: &Offer, spec: &InstanceSpec) -> Result<Value> {
        crate::provider::check_spec_lineage(CLOUD, &self.settings.lineage, spec)?;
        let project = self.project()?;
        let zone = Self::zone_of(&offer.location)?;
        let t = Self::machine_type(offer)?;
        let what = format!("read machine type {} in {zone}", t.name);
        let mt = format!("/projects/{project}/zones/{zone}/machineTypes/{}", t.name);
        if self.get_opt(&mt, Call::other(&what)).await?.is_none() {
            return Err(unavailable(format!(
                "gcp: zone {zone} has no machine type {}",
                t.name
            )));
        }
        if t.attached {
            let what = format!("read accelerator type {} in {zone}", t.accelerator);
            let at = format!(
                "/projects/{project}/zones/{zone}/acceleratorTypes/{}",
                t.accelerator
            );
            if self.get_opt(&at, Call::other(&what)).await?.is_none() {
                return Err(unavailable(format!(
                    "gcp: zone {zone} has no {}",
                    t.accelerator
                )));
            }
        }
        let image = self.resolve_image(spec.image.as_deref()).await?;
        let name = api::firewall_name(&spec.vm_name, &self.settings.lineage);
        self.ensure_firewall(project, &name, spec).await?;
        Ok(json!({"image": image, "firewall": name, "network_tag": name, "zone": zone}))
    }

    /// One `instances.insert` (module docs). Returns the instance name.
    async fn create(&self, offer: &Offer, prep: &Value, spec: &InstanceSpec) -> Result<String> {
        let lineage = crate::provider::check_spec_lineage(CLOUD, &self.settings.lineage, spec)?;
        let project = self.project()?;
        let zone = Self::zone_of(&offer.location)?;
        let t = Self::machine_type(offer)?;
        let field = |k: &str| kit::offer::prepared(prep, k, Value::as_str);
        let name = api::instance_name(&spec.vm_name, lineage, &spec.client_token);
        let user_data = match &spec.boot_script {
            Some(b) => Some(crate::provider::cloud_init_user_data(b)?),
            None => None,
        };
        let body = api::insert_body(
            t,
            &api::InsertArgs {
                name: &name,
                zone,
                vm: &spec.vm_name,
                lineage,
                image: field("image")?,
                network_tag: field("network_tag")?,
                disk_gb: spec.disk_gb,
                spot: offer.spot,
                ssh_public_key: &spec.ssh_public_key,
                user_data,
            },
        );
        let path = format!("/projects/{project}/zones/{zone}/instances");
        let q = [("requestId", api::request_id(&spec.client_token))];
        let what = format!("create {} in {zone}", offer.instance_type);
        let region = offer.location.region.as_str();
        match self.api.send(Method::POST, &path, &q, Some(&body)).await {
            Ok(v) => {
                let op: Operation = self.api.parse(v, Call::other(&what))?;
                match self.operation_error(&op, CREATE, &what, region) {
                    Some(e) => Err(e),
                    None => Ok(name),
                }
            }
            // Our own name: an earlier send of this attempt made it.
            Err(f) if is_already_there(&f) => Ok(name),
            Err(f) => Err(self
                .api
                .fail(&f, Call::named(CREATE, &what).in_region(region))),
        }
    }

    /// With a zone, `instances.list` of the zone (all pages) and `zoneOperations.list` of
    /// its inserts: an insert whose instance is not listed is `Pending` while it runs and
    /// [`InstanceStatus::Refused`] with its classified error once it failed, shown as
    /// the VM its instance name names in this lineage ([`api::vm_of_instance_name`]);
    /// without one, `aggregated/instances` (all pages) of the region's zones, each entry
    /// with its [`Seen::zone`] from the `zones/<zone>` scope. `only_vm`
    /// narrows the instances to its labels (list `filter`, discovery
    /// `compute.instances.list` / `aggregatedList`, `vendor-apis/gcp/compute.v1.json`).
    async fn instances(&self, at: &Location, only_vm: Option<&str>) -> Result<Vec<Seen>> {
        let project = self.project()?;
        let lineage = &self.settings.lineage;
        let filter = only_vm.map(|vm| api::label_filter(vm, lineage));
        let Some(zone) = at.zone.as_deref() else {
            let all = self.region_instances(project, &at.region, filter).await?;
            let in_zone = |(zone, i): &(String, Instance)| Seen {
                zone: Some(zone.clone()),
                ..api::seen(i)
            };
            return Ok(all.iter().map(in_zone).collect());
        };
        let path = format!("/projects/{project}/zones/{zone}/instances");
        let q: Vec<(&str, String)> = filter.map(|f| ("filter", f)).into_iter().collect();
        let what = format!("list instances of {zone}");
        let listed: Vec<Instance> = self.zonal_list(&path, &q, &what).await?;
        let mut out: Vec<Seen> = listed.iter().map(api::seen).collect();
        for op in self.insert_operations(project, zone).await? {
            let name = op.target_name();
            let Some(vm) = api::vm_of_instance_name(name, lineage) else {
                continue;
            };
            if only_vm.is_some_and(|v| v != vm) || out.iter().any(|s| s.instance_id == name) {
                continue;
            }
            let what = format!("create instance {name} in {zone}");
            let status = if !op.is_done() {
                InstanceStatus::Pending
            } else if let Some(e) = self.operation_error(&op, CREATE, &what, &at.region) {
                InstanceStatus::Refused(Box::new(e))
            } else {
                continue; // Done and fine, but no instance listed: deleted since.
            };
            let shown = Shown::labels(Some(vm), Some(lineage.as_str()));
            out.push(Seen::new(name, status, shown));
        }
        Ok(out)
    }

    /// `instances.delete` for each id (module docs); ids that are not this VM's instance
    /// names are nothing of ours and skipped.
    async fn delete(&self, at: &Location, vm: &str, ids: &[String]) -> Result<()> {
        let lineage = &self.settings.lineage;
        let ids: Vec<&String> = ids
            .iter()
            .filter(|id| api::is_instance_name(id, vm, lineage))
            .collect();
        if ids.is_empty() {
            return Ok(());
        }
        let project = self.project()?;
        let zones: Vec<(String, String)> = match at.zone.as_deref() {
            Some(z) => ids
                .iter()
                .map(|id| (z.to_string(), id.to_string()))
                .collect(),
            None => self
                .region_instances(project, &at.region, Some(api::label_filter(vm, lineage)))
                .await?
                .into_iter()
                .filter(|(_, i)| ids.contains(&&i.name))
                .map(|(z, i)| (z, i.name))
                .collect(),
        };
        for (zone, id) in zones {
            let what = format!("delete instance {id} in {zone}");
            let path = format!("/projects/{project}/zones/{zone}/instances/{id}");
            match self.api.send(Method::DELETE, &path, &[], None).await {
                Ok(_) => {}
                Err(f) if f.is_not_found() => {
                    let running = self
                        .insert_operations(project, &zone)
                        .await?
                        .into_iter()
                        .any(|op| op.target_name() == id && !op.is_done());
                    if running {
                        return Err(ProviderError::transient(format!(
                            "gcp {what}: its insert is still running; the delete is sent again \
                             once the instance exists"
                        )));
                    }
                }
                Err(f) => return Err(self.api.fail(&f, Call::named("delete", &what))),
            }
        }
        Ok(())
    }

    /// Deletes the VM's firewall rule; not found is success.
    async fn cleanup(&self, _at: &Location, vm_name: &str) -> Result<()> {
        let project = self.project()?;
        let name = api::firewall_name(vm_name, &self.settings.lineage);
        let path = format!("/projects/{project}/global/firewalls/{name}");
        let what = format!("delete firewall {name}");
        self.api
            .delete(&path, Failure::is_not_found, Call::named("cleanup", &what))
            .await
    }

    /// `instances.start`; its operation's error when it already failed. Errors: as
    /// [`errors`] classifies (a stockout is `Capacity`).
    async fn start(&self, at: &Location, _vm: &str, id: &str) -> Result<()> {
        let project = self.project()?;
        let zone = Self::zone_of(at)?;
        let path = format!("/projects/{project}/zones/{zone}/instances/{id}/start");
        let what = format!("start instance {id} in {zone}");
        let v = self
            .api
            .send(Method::POST, &path, &[], None)
            .await
            .map_err(|f| {
                self.api
                    .fail(&f, Call::named(CREATE, &what).in_region(&at.region))
            })?;
        let op: Operation = self.api.parse(v, Call::other(&what))?;
        match self.operation_error(&op, CREATE, &what, &at.region) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
