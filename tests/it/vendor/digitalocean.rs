//! The DigitalOcean adapter against a local fake of the DigitalOcean API v2 whose every
//! request and every response is checked against DigitalOcean's own OpenAPI description
//! (the gpuprov subset, `tests/it/support/spec.rs`). The launch and teardown machines run for
//! real through the executor with a `MemoryJournal`; SSH is the `FakeConnector` (droplets
//! get 127.0.0.x addresses only, nothing is dialled; the pagination links the fake returns
//! name api.digitalocean.com and must never be followed as URLs).

use crate::support::drive;
use crate::support::spec;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drive::{LINEAGE, PUBKEY};
use gpuprov::config::Cloud;
use gpuprov::machine::ExecError;
use gpuprov::provider::clouds::digitalocean::{DigitalOceanProvider, DigitalOceanSettings, Token};
use gpuprov::provider::{
    project_key_name, BootScript, CloudProvider, ErrorKind, Feature, InstanceSpec, InstanceStatus,
    Location, ResourceRequest,
};
use gpuprov::vm::{LaunchState, Target, TeardownState};
use serde_json::{json, Value};
use spec::{Canned, Seen, SpecServer};

/// A sentinel token: it must never appear in any error, reason or journal entry.
pub(crate) const SENTINEL: &str = "dop_v1_secret_sentinel_7f3a9c";

pub(crate) const DROPLETS: &str = "/v2/droplets";
pub(crate) const H100X1: &str = "gpu-h100x1-80gb";
const ID_TAG: &str = "gpuprov-vm-name:trainer";
const LINEAGE_TAG: &str = "gpuprov-lineage:0f0e0d0c-1111-4222-8333-444455556666";

/// The fake DigitalOcean account.
pub(crate) struct World {
    pub(crate) sizes: Vec<Value>,
    pub(crate) regions: Vec<Value>,
    pub(crate) keys: Vec<Value>,
    tags: BTreeSet<String>,
    firewalls: Vec<Value>,
    pub(crate) droplets: Vec<Value>,
    /// Droplet actions taken (spec `action` objects, `resource_id` = droplet id).
    actions: Vec<Value>,
    /// Ids of in-progress actions a listing already showed.
    listed_in_progress: BTreeSet<i64>,
    /// Per (method, path): error responses served before the normal behaviour.
    faults: BTreeMap<(String, String), VecDeque<Canned>>,
    next: i64,
    /// Most items per page whatever `per_page` asks (DigitalOcean's maximum is 200).
    page_cap: usize,
    /// Every error body echoes the Authorization header (a hostile server), to prove the
    /// adapter scrubs the token.
    pub(crate) echo_auth: bool,
}

impl Default for World {
    fn default() -> Self {
        World {
            sizes: vec![],
            regions: ["tor1", "nyc2", "ams3", "nyc1"]
                .iter()
                .map(|r| region_json(r, true))
                .collect(),
            keys: vec![],
            tags: BTreeSet::new(),
            firewalls: vec![],
            droplets: vec![],
            actions: vec![],
            listed_in_progress: BTreeSet::new(),
            faults: BTreeMap::new(),
            next: 448_543_583,
            page_cap: 200,
            echo_auth: false,
        }
    }
}

pub(crate) fn region_json(slug: &str, available: bool) -> Value {
    json!({
        "name": format!("{slug} test region"),
        "slug": slug,
        "features": ["backups", "ipv6", "metadata"],
        "available": available,
        "sizes": [H100X1, "s-2vcpu-4gb"]
    })
}

/// A size as the spec's `size` schema shows it (`gpu` = (model, count)).
fn size_json(slug: &str, gpu: Option<(&str, u32)>, price: f64, regions: &[&str]) -> Value {
    let count = gpu.map(|g| g.1).unwrap_or(0);
    let mut s = json!({
        "slug": slug,
        "memory": if count > 0 { 245_760 * count } else { 4096 },
        "vcpus": if count > 0 { 20 * count } else { 2 },
        "disk": if count > 0 { 720 * count } else { 80 },
        "transfer": 15.0,
        "price_monthly": (price * 672.0 * 100.0).round() / 100.0,
        "price_hourly": price,
        "regions": regions,
        "available": true,
        "description": if count > 0 { format!("GPU - {count}X") } else { "Basic".into() },
        "disk_info": [{"type": "local", "size": {"amount": 720, "unit": "gib"}}]
    });
    if let Some((model, count)) = gpu {
        s["gpu_info"] =
            json!({"count": count, "model": model, "vram": {"amount": 80 * count, "unit": "gib"}});
    }
    s
}

/// An error body in the spec's `error` shape.
pub(crate) fn err_body(id: &str, message: &str) -> Value {
    json!({"id": id, "message": message, "request_id": "4d9d8375-3c56-4925-a3e7-eb137fed17e9"})
}

fn query<'a>(req: &'a Seen, k: &str) -> Option<&'a str> {
    req.query
        .iter()
        .find(|(n, _)| n == k)
        .map(|(_, v)| v.as_str())
}

impl World {
    /// Side resources on the account: registered keys, firewalls and the tags they are
    /// applied to. The identity and lineage tags a droplet's create makes are labels, not
    /// resources: other droplets (another project's VM of the same name, the lineage's
    /// other machines) carry them, and deleting a tag untags them all.
    pub(crate) fn side_resources(&self) -> usize {
        let labels = [
            format!("{}:", gpuprov::provider::IDENTITY_LABEL),
            format!("{}:", gpuprov::provider::LINEAGE_LABEL),
        ];
        let tags = self
            .tags
            .iter()
            .filter(|t| !labels.iter().any(|l| t.starts_with(l.as_str())))
            .count();
        self.keys.len() + self.firewalls.len() + tags
    }

    pub(crate) fn with_size(
        mut self,
        slug: &str,
        gpu: Option<(&str, u32)>,
        price: f64,
        regions: &[&str],
    ) -> Self {
        self.sizes.push(size_json(slug, gpu, price, regions));
        self
    }

    pub(crate) fn fault(&mut self, method: &str, path: &str, c: Canned) {
        self.faults
            .entry((method.into(), path.into()))
            .or_default()
            .push_back(c);
    }

    fn take_fault(&mut self, req: &Seen) -> Option<Canned> {
        let mut c = self
            .faults
            .get_mut(&(req.method.clone(), req.path.clone()))?
            .pop_front()?;
        if self.echo_auth {
            let auth = req
                .headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("authorization"))
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            if let Some(b) = c.body.as_mut() {
                let m = b["message"].as_str().unwrap_or_default().to_string();
                b["message"] = json!(format!("{m} [{auth}]"));
            }
        }
        Some(c)
    }

    /// One page of `items` under `key`, as DigitalOcean paginates: `per_page` (default 20,
    /// capped), `page` (from 1), `links.pages.next` as an absolute api.digitalocean.com URL.
    fn page(&self, req: &Seen, key: &str, items: &[Value]) -> Canned {
        let per: usize = query(req, "per_page")
            .and_then(|v| v.parse().ok())
            .unwrap_or(20);
        let per = per.min(self.page_cap).max(1);
        let page: usize = query(req, "page").and_then(|v| v.parse().ok()).unwrap_or(1);
        let start = (page - 1) * per;
        let chunk: Vec<Value> = items.iter().skip(start).take(per).cloned().collect();
        let mut links = json!({});
        if start + per < items.len() {
            let mut extra = String::new();
            for (k, v) in &req.query {
                if k != "page" && k != "per_page" {
                    extra.push_str(&format!("&{k}={v}"));
                }
            }
            links = json!({"pages": {
                "next": format!("https://api.digitalocean.com{}?page={}&per_page={per}{extra}", req.path, page + 1),
                "last": format!("https://api.digitalocean.com{}?page={}&per_page={per}{extra}", req.path, items.len().div_ceil(per)),
            }});
        }
        Canned::ok(json!({ key: chunk, "links": links, "meta": {"total": items.len()} }))
    }

    fn size(&self, slug: &str) -> Option<Value> {
        self.sizes.iter().find(|s| s["slug"] == slug).cloned()
    }

    fn create(&mut self, body: &Value) -> Canned {
        let slug = body["size"].as_str().unwrap_or_default().to_string();
        let reg = body["region"].as_str().unwrap_or_default().to_string();
        let Some(size) = self.size(&slug) else {
            return Canned::status(
                422,
                err_body(
                    "unprocessable_entity",
                    "You specified an invalid size for Droplet creation.",
                ),
            );
        };
        if !size["regions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == reg.as_str())
        {
            return Canned::status(
                422,
                err_body(
                    "unprocessable_entity",
                    "Size is not available in this region.",
                ),
            );
        }
        for t in body["tags"].as_array().cloned().unwrap_or_default() {
            self.tags.insert(t.as_str().unwrap_or_default().to_string());
        }
        self.next += 1;
        let d = droplet_json(self.next, body, &size, &reg);
        self.droplets.push(d.clone());
        Canned::status(
            202,
            json!({"droplet": d, "links": {"actions": [{"id": 7515, "rel": "create", "href": "https://api.digitalocean.com/v2/actions/7515"}]}}),
        )
    }

    /// `GET /v2/droplets` as DigitalOcean answers it: without `type` (or `type=droplets`)
    /// only non-GPU droplets, with `type=gpus` only GPU droplets, `tag_name` filters, and
    /// `type` with `tag_name` is refused (spec: "Can not be combined with `tag_name`"; the
    /// status is not documented, 422 is DigitalOcean's validation status). Every `new`
    /// droplet listed becomes `active` with a loopback public address for the next listing.
    fn list(&mut self, req: &Seen) -> Canned {
        let ty = query(req, "type");
        let tag = query(req, "tag_name");
        if ty.is_some() && tag.is_some() {
            return Canned::status(
                422,
                err_body(
                    "unprocessable_entity",
                    "type can not be combined with tag_name",
                ),
            );
        }
        let gpus = ty == Some("gpus");
        let listed: Vec<Value> = self
            .droplets
            .iter()
            .filter(|d| d.get("gpu_info").is_some() == gpus)
            .filter(|d| tag.is_none_or(|t| d["tags"].as_array().unwrap().iter().any(|x| x == t)))
            .cloned()
            .collect();
        let out = self.page(req, "droplets", &listed);
        let ids: Vec<Value> = listed.iter().map(|d| d["id"].clone()).collect();
        for a in &mut self.actions {
            if ids.contains(&a["resource_id"]) && a["status"] == "in-progress" {
                // Listed once while in progress; completed by the next listing.
                if self
                    .listed_in_progress
                    .insert(a["id"].as_i64().unwrap_or_default())
                {
                    continue;
                }
                a["status"] = json!("completed");
                a["completed_at"] = json!("2026-11-30T20:00:05Z");
                if let Some(d) = self
                    .droplets
                    .iter_mut()
                    .find(|d| d["id"] == a["resource_id"])
                {
                    d["status"] = json!("active");
                }
            }
        }
        for (n, d) in self.droplets.iter_mut().enumerate() {
            if ids.contains(&d["id"]) && d["status"] == "new" {
                d["status"] = json!("active");
                d["networks"]["v4"] = json!([
                    {"ip_address": format!("10.128.0.{}", 2 + n), "netmask": "255.255.0.0", "gateway": "nil", "type": "private"},
                    {"ip_address": format!("127.0.0.{}", 7 + n), "netmask": "255.255.255.0", "gateway": "127.0.0.1", "type": "public"}
                ]);
            }
        }
        out
    }

    fn delete_droplet(&mut self, path: &str) -> Canned {
        let id: i64 = path
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .parse()
            .unwrap_or(0);
        let before = self.droplets.len();
        self.droplets.retain(|d| d["id"] != id);
        if self.droplets.len() == before {
            Canned::status(
                404,
                err_body(
                    "not_found",
                    "The resource you were accessing could not be found.",
                ),
            )
        } else {
            Canned::empty(204)
        }
    }

    fn droplet_id(path: &str) -> i64 {
        path.trim_start_matches("/v2/droplets/")
            .split('/')
            .next()
            .unwrap_or_default()
            .parse()
            .unwrap_or(0)
    }

    /// `GET /v2/droplets/{id}`.
    fn get_droplet(&self, path: &str) -> Canned {
        let id = Self::droplet_id(path);
        match self.droplets.iter().find(|d| d["id"] == id) {
            Some(d) => Canned::ok(json!({ "droplet": d })),
            None => Canned::status(
                404,
                err_body(
                    "not_found",
                    "The resource you were accessing could not be found.",
                ),
            ),
        }
    }

    /// `POST /v2/droplets/{id}/actions`: `power_off` turns the droplet `off` at once;
    /// `power_on` of an `off` droplet starts an `in-progress` action and the droplet stays
    /// `off` for one more listing, and the listing after it completes it (then `active`),
    /// as on DigitalOcean,
    /// where the droplet turns `active` only when the action completes. A second action
    /// while one is in progress is refused ("Droplet already has a pending event."), and
    /// so is powering on a droplet that is not `off` (the text of that one is this
    /// fake's; the vendor's is not documented).
    pub(crate) fn action(&mut self, path: &str, body: &Value) -> Canned {
        let id = Self::droplet_id(path);
        let ty = body["type"].as_str().unwrap_or_default().to_string();
        let pending = self
            .actions
            .iter()
            .any(|a| a["resource_id"] == id && a["status"] == "in-progress");
        let Some(d) = self.droplets.iter_mut().find(|d| d["id"] == id) else {
            return Canned::status(
                404,
                err_body(
                    "not_found",
                    "The resource you were accessing could not be found.",
                ),
            );
        };
        let refuse = |m: &str| Canned::status(422, err_body("unprocessable_entity", m));
        if pending {
            return refuse("Droplet already has a pending event.");
        }
        let status = match (ty.as_str(), d["status"].as_str()) {
            ("power_off", _) => {
                d["status"] = json!("off");
                "completed"
            }
            ("power_on", Some("off")) => "in-progress",
            ("power_on", _) => return refuse("Droplet is already powered on."),
            _ => return refuse("this fake knows no such action"),
        };
        let region = d["region"].clone();
        let a = json!({
            "id": 36_804_636 + self.actions.len() as i64,
            "status": status,
            "type": ty,
            "started_at": "2026-11-30T20:00:00Z",
            "completed_at": if status == "completed" { json!("2026-11-30T20:00:05Z") } else { Value::Null },
            "resource_id": id,
            "resource_type": "droplet",
            "region": region,
            "region_slug": region["slug"]
        });
        self.actions.push(a.clone());
        Canned::status(201, json!({ "action": a }))
    }

    /// `GET /v2/droplets/{id}/actions`, newest first.
    fn list_actions(&self, req: &Seen) -> Canned {
        let id = Self::droplet_id(&req.path);
        let mine: Vec<Value> = self
            .actions
            .iter()
            .rev()
            .filter(|a| a["resource_id"] == id)
            .cloned()
            .collect();
        self.page(req, "actions", &mine)
    }

    /// `DELETE /v2/tags/{name}`: deleting a tag untags whatever carries it.
    fn delete_tag(&mut self, path: &str) -> Canned {
        let name = path.trim_start_matches("/v2/tags/").to_string();
        if !self.tags.remove(&name) {
            return Canned::status(
                404,
                err_body(
                    "not_found",
                    "The resource you were accessing could not be found.",
                ),
            );
        }
        for d in &mut self.droplets {
            if let Some(t) = d["tags"].as_array_mut() {
                t.retain(|x| x != name.as_str());
            }
        }
        Canned::empty(204)
    }

    fn create_firewall(&mut self, body: &Value) -> Canned {
        // "Tag names must exist in order to be referenced in a request" (existing_tags_array).
        for t in body["tags"].as_array().cloned().unwrap_or_default() {
            if !self.tags.contains(t.as_str().unwrap_or_default()) {
                return Canned::status(
                    422,
                    err_body("unprocessable_entity", &format!("tag {t} not found")),
                );
            }
        }
        let mut fw = body.clone();
        fw["id"] = json!(format!(
            "bb4b2611-3d72-467b-8602-{:012}",
            self.firewalls.len() + 1
        ));
        fw["status"] = json!("succeeded");
        fw["created_at"] = json!("2026-11-30T20:00:00Z");
        fw["pending_changes"] = json!([]);
        fw["droplet_ids"] = json!([]);
        self.firewalls.push(fw.clone());
        Canned::status(202, json!({ "firewall": fw }))
    }

    fn delete_firewall(&mut self, path: &str) -> Canned {
        let id = path.rsplit('/').next().unwrap_or_default().to_string();
        let before = self.firewalls.len();
        self.firewalls.retain(|f| f["id"] != id.as_str());
        if self.firewalls.len() == before {
            Canned::status(
                404,
                err_body(
                    "not_found",
                    "The resource you were accessing could not be found.",
                ),
            )
        } else {
            Canned::empty(204)
        }
    }
}

/// A droplet in the full shape of the spec's `droplet` schema.
fn droplet_json(id: i64, body: &Value, size: &Value, region: &str) -> Value {
    let mut d = json!({
        "id": id,
        "name": body["name"],
        "memory": size["memory"],
        "vcpus": size["vcpus"],
        "disk": size["disk"],
        "locked": false,
        "status": "new",
        "kernel": null,
        "created_at": "2026-11-30T20:00:00Z",
        "features": ["droplet_agent", "private_networking"],
        "backup_ids": [],
        "next_backup_window": null,
        "snapshot_ids": [],
        "image": {
            "id": 166_407_044,
            "name": "AI/ML Ready H100x1",
            "distribution": "Ubuntu",
            "slug": body["image"],
            "public": true,
            "regions": ["nyc2", "tor1", "ams3"],
            "created_at": "2024-09-27T15:35:19Z",
            "min_disk_size": 25,
            "type": "base",
            "size_gigabytes": 18.47,
            "description": "GPU H100 1x Base Image",
            "tags": [],
            "status": "available"
        },
        "volume_ids": [],
        "size": size,
        "size_slug": size["slug"],
        "networks": {"v4": [], "v6": []},
        "region": region_json(region, true),
        "tags": body["tags"],
        "vpc_uuid": "e2fdd15c-6ae6-4c11-8c5d-72dae2ba1ad1"
    });
    if let Some(g) = size.get("gpu_info") {
        d["gpu_info"] = g.clone();
    }
    d
}

/// The gpuprov subset with `DELETE /v2/tags/{tag_id}` added: the subset lacks it, but the
/// adapter removes the per-VM firewall tag it created. Copied from the whole-API bundle
/// (`DigitalOcean-public.v2.bundled.yaml`, operation `tags_delete`: 204, 401, 404, 429,
/// 500, default); its path parameter is the tag name.
fn spec_with_tag_delete() -> spec::Spec {
    spec::digitalocean().patch(|doc| {
        assert!(
            doc["paths"].get("/v2/tags/{tag_id}").is_none(),
            "the subset has tags_delete now: drop this patch"
        );
        doc["paths"]["/v2/tags/{tag_id}"] = json!({
            "parameters": [{
                "name": "tag_id", "in": "path", "required": true,
                "schema": {"type": "string", "pattern": "^[a-zA-Z0-9_\\-\\:]+$", "maxLength": 255}
            }],
            "delete": {
                "operationId": "tags_delete",
                "responses": {
                    "204": {"$ref": "#/components/responses/no_content"},
                    "401": {"$ref": "#/components/responses/unauthorized"},
                    "404": {"$ref": "#/components/responses/not_found"},
                    "429": {"$ref": "#/components/responses/too_many_requests"},
                    "500": {"$ref": "#/components/responses/server_error"},
                    "default": {"$ref": "#/components/responses/unexpected_error"}
                },
                "security": [{"bearer_auth": ["tag:delete"]}]
            }
        });
    })
}

pub(crate) struct Cloud2 {
    pub(crate) server: SpecServer,
    pub(crate) world: Arc<Mutex<World>>,
}

impl Cloud2 {
    pub(crate) async fn start(world: World) -> Cloud2 {
        let server = SpecServer::start(Arc::new(spec_with_tag_delete())).await;
        let world = Arc::new(Mutex::new(world));
        macro_rules! route {
            ($method:expr, $re:expr, |$w:ident, $req:ident| $body:expr) => {{
                let wc = world.clone();
                server
                    .mount_fn($method, $re, move |$req: &Seen| {
                        let mut $w = wc.lock().unwrap();
                        if let Some(f) = $w.take_fault($req) {
                            return f;
                        }
                        $body
                    })
                    .await;
            }};
        }
        route!("GET", "^/v2/sizes$", |w, r| w.page(r, "sizes", &w.sizes));
        route!("GET", "^/v2/regions$", |w, r| w
            .page(r, "regions", &w.regions));
        route!("GET", "^/v2/account/keys$", |w, r| w
            .page(r, "ssh_keys", &w.keys));
        route!("POST", "^/v2/account/keys$", |w, r| {
            let b = r.body.clone().unwrap_or_default();
            // DigitalOcean refuses a second key of the same value (names may repeat).
            let value = |k: &Value| {
                k["public_key"]
                    .as_str()
                    .unwrap_or_default()
                    .split_whitespace()
                    .take(2)
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            if w.keys.iter().any(|k| value(k) == value(&b)) {
                return Canned::status(
                    422,
                    err_body(
                        "unprocessable_entity",
                        "SSH Key is already in use on your account",
                    ),
                );
            }
            let k = json!({
                "id": 512_190 + w.keys.len() as i64,
                "fingerprint": "3b:16:bf:e4:8b:00:8b:b8:59:8c:a9:d3:f0:19:45:fa",
                "public_key": b["public_key"],
                "name": b["name"],
            });
            w.keys.push(k.clone());
            Canned::status(201, json!({ "ssh_key": k }))
        });
        route!("DELETE", "^/v2/account/keys/[^/]+$", |w, r| {
            let id = r
                .path
                .trim_start_matches("/v2/account/keys/")
                .parse::<i64>()
                .ok();
            let before = w.keys.len();
            w.keys.retain(|k| k["id"].as_i64() != id);
            if w.keys.len() == before {
                return Canned::status(
                    404,
                    err_body(
                        "not_found",
                        "The resource you were accessing could not be found.",
                    ),
                );
            }
            Canned::empty(204)
        });
        route!("POST", "^/v2/tags$", |w, r| {
            let name = r.body.clone().unwrap_or_default()["name"].clone();
            w.tags.insert(name.as_str().unwrap_or_default().to_string());
            Canned::status(201, json!({"tag": {"name": name}}))
        });
        route!("GET", "^/v2/firewalls$", |w, r| w.page(
            r,
            "firewalls",
            &w.firewalls
        ));
        route!("POST", "^/v2/firewalls$", |w, r| {
            let b = r.body.clone().unwrap_or_default();
            w.create_firewall(&b)
        });
        route!("DELETE", "^/v2/firewalls/[^/]+$", |w, r| w
            .delete_firewall(&r.path));
        route!("GET", "^/v2/droplets$", |w, r| w.list(r));
        route!("POST", "^/v2/droplets$", |w, r| {
            let b = r.body.clone().unwrap_or_default();
            w.create(&b)
        });
        route!("DELETE", "^/v2/droplets/[^/]+$", |w, r| w
            .delete_droplet(&r.path));
        route!("GET", "^/v2/droplets/[^/]+$", |w, r| w.get_droplet(&r.path));
        route!("GET", "^/v2/droplets/[^/]+/actions$", |w, r| w
            .list_actions(r));
        route!("POST", "^/v2/droplets/[^/]+/actions$", |w, r| {
            let b = r.body.clone().unwrap_or_default();
            w.action(&r.path, &b)
        });
        route!("DELETE", "^/v2/tags/[^/]+$", |w, r| w.delete_tag(&r.path));
        Cloud2 { server, world }
    }

    fn provider_with_token(&self, token: Option<&str>) -> Arc<DigitalOceanProvider> {
        let caps = drive::test_capabilities(DigitalOceanProvider::default_capabilities());
        Arc::new(
            DigitalOceanProvider::new(DigitalOceanSettings {
                endpoint: Some(self.server.uri()),
                token: token.map(Token::new),
                token_source:
                    "the DIGITALOCEAN_TOKEN environment variable, /nonexistent/doctl/config.yaml"
                        .into(),
                lineage: LINEAGE.parse().unwrap(),
            })
            .with_capabilities(caps),
        )
    }

    pub(crate) fn provider(&self) -> Arc<DigitalOceanProvider> {
        self.provider_with_token(Some(SENTINEL))
    }

    pub(crate) fn creates(&self) -> Vec<Value> {
        self.server
            .requests_to("POST", DROPLETS)
            .into_iter()
            .filter_map(|r| r.body)
            .collect()
    }
}

/// The shared launch/teardown harness over this vendor's local server.
type Run = drive::Run<Cloud2, DigitalOceanProvider>;

/// A run of `trainer` asking for 1 × H100 against a server serving `world`.
async fn run(world: World) -> Run {
    let cloud = Cloud2::start(world).await;
    let provider = cloud.provider();
    Run::new(
        cloud,
        provider,
        drive::gpu_vm(Cloud::Digitalocean, "H100", 1),
    )
}

pub(crate) fn h100_world() -> World {
    World::default()
        .with_size(H100X1, Some(("nvidia_h100", 1)), 3.39, &["tor1", "nyc2"])
        .with_size(
            "gpu-h100x8-640gb",
            Some(("nvidia_h100", 8)),
            23.92,
            &["tor1"],
        )
        .with_size("s-2vcpu-4gb", None, 0.03571, &["tor1", "nyc2", "nyc1"])
}

fn loc(region: &str) -> Location {
    Location {
        cloud: "digitalocean".into(),
        region: region.into(),
        zone: None,
    }
}

fn ask(gpu: Option<&str>, count: u32, regions: &[&str]) -> ResourceRequest {
    ResourceRequest {
        vm_name: "trainer".into(),
        regions: regions.iter().map(|r| r.to_string()).collect(),
        zones: vec![],
        gpu: gpu.map(str::to_string),
        gpu_count: count,
        spot: false,
        max_price_per_hour: None,
        gpu_count_at_least: false,
    }
}

fn instance_spec() -> InstanceSpec {
    InstanceSpec {
        vm_name: "trainer".into(),
        lineage: LINEAGE.parse().unwrap(),
        client_token: "t".into(),
        image: None,
        disk_gb: None,
        ports: vec![],
        ssh_public_key: PUBKEY.into(),
        boot_script: None,
        shared: Default::default(),
    }
}

/// The `GET /v2/droplets` requests, as (type, tag_name) pairs.
fn listings(server: &SpecServer) -> Vec<(Option<String>, Option<String>)> {
    server
        .requests_to("GET", DROPLETS)
        .iter()
        .map(|r| {
            (
                query(r, "type").map(str::to_string),
                query(r, "tag_name").map(str::to_string),
            )
        })
        .collect()
}

#[tokio::test]
async fn full_launch_then_teardown_against_the_spec() {
    let mut r = run(h100_world()).await;
    r.vm.ports = vec![8080];
    r.vm.regions = vec!["tor1".into()];
    let end = r.launch().await.unwrap();
    let vm = end
        .ready()
        .unwrap_or_else(|| panic!("not ready: {end:?} {:?}", r.labels()));
    assert_eq!(vm.offer.id, "digitalocean/tor1/gpu-h100x1-80gb");
    assert_eq!(vm.offer.price_per_hour, 3.39);
    assert_eq!(vm.offer.gpu.as_deref(), Some("H100"));
    assert_eq!(vm.user, "root");
    assert_eq!(vm.ssh.port, 22);
    assert!(vm.ssh.host.starts_with("127.0.0."), "{}", vm.ssh.host);
    assert_eq!(r.connector.logins(), 1);

    // prepare: the key was unknown, so it was registered under the name derived from its
    // fingerprint, gpuprov-<lineage8>-<fp12>.
    let keys = r.cloud.server.requests_to("POST", "/v2/account/keys");
    assert_eq!(keys.len(), 1);
    let kb = keys[0].body.clone().unwrap();
    let key_name = project_key_name(LINEAGE, PUBKEY);
    assert!(key_name.starts_with("gpuprov-0f0e0d0c-"), "{key_name}");
    assert_eq!(
        (kb["name"].clone(), kb["public_key"].clone()),
        (json!(key_name), json!(PUBKEY))
    );
    // prepare: the firewall tag first (a firewall may only name existing tags), then a
    // per-VM firewall on that tag with 22 and the asked port in, everything out.
    let fw_tag = "gpuprov-trainer-0f0e0d0c-tor1";
    let tags = r.cloud.server.requests_to("POST", "/v2/tags");
    assert_eq!(tags.len(), 1);
    assert_eq!(tags[0].body.clone().unwrap()["name"], fw_tag);
    let fw = r.cloud.server.requests_to("POST", "/v2/firewalls");
    assert_eq!(fw.len(), 1);
    let fb = fw[0].body.clone().unwrap();
    assert_eq!(fb["name"], fw_tag);
    assert_eq!(fb["tags"], json!([fw_tag]));
    let inbound: Vec<Value> = fb["inbound_rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| json!([r["protocol"], r["ports"]]))
        .collect();
    assert_eq!(inbound, [json!(["tcp", "22"]), json!(["tcp", "8080"])]);
    assert_eq!(fb["outbound_rules"].as_array().unwrap().len(), 3);

    // create: one droplet, named, tagged, with the key and the AI/ML image.
    let creates = r.cloud.creates();
    assert_eq!(creates.len(), 1);
    let cb = &creates[0];
    assert_eq!(cb["region"], "tor1");
    assert_eq!(cb["size"], H100X1);
    assert_eq!(cb["image"], "gpu-h100x1-base");
    assert_eq!(cb["name"], "gpuprov-trainer-0f0e0d0c");
    assert_eq!(cb["ssh_keys"], json!([512_190]));
    assert_eq!(cb["tags"], json!([ID_TAG, LINEAGE_TAG, fw_tag]));
    assert!(
        cb.get("user_data").is_none(),
        "no boot script, no user_data"
    );

    let labels = r.labels();
    assert!(
        labels.iter().any(|l| l.starts_with("booting")),
        "{labels:?}"
    );
    assert!(labels.last().unwrap().starts_with("ready"), "{labels:?}");

    // Teardown: delete the droplet, see it gone, delete the firewall.
    let end = r
        .teardown(Target::new(
            vm.location.clone(),
            "trainer",
            vec![vm.instance_id.clone()],
        ))
        .await;
    assert_eq!(end, TeardownState::Done);
    let path = format!("/v2/droplets/{}", vm.instance_id);
    assert!(!r.cloud.server.requests_to("DELETE", &path).is_empty());
    let fw_id = r.cloud.server.requests_to(
        "DELETE",
        "/v2/firewalls/bb4b2611-3d72-467b-8602-000000000001",
    );
    assert_eq!(fw_id.len(), 1);
    assert!(r.cloud.world.lock().unwrap().firewalls.is_empty());
    assert!(r.cloud.world.lock().unwrap().droplets.is_empty());
    // ... and its tag (issue 12 item 4: the per-VM tag is owned too). The identity and
    // lineage tags are shared with other VMs and projects and stay.
    assert_eq!(
        r.cloud
            .server
            .requests_to("DELETE", &format!("/v2/tags/{fw_tag}"))
            .len(),
        1
    );
    let tags = r.cloud.world.lock().unwrap().tags.clone();
    assert!(!tags.contains(fw_tag), "{tags:?}");
    assert!(r
        .provider
        .observe(&vm.location, "trainer")
        .await
        .unwrap()
        .is_empty());
    r.cloud.server.verify();
}

/// Field report: GPU droplets are listed only with `type=gpus`, and `type` cannot be
/// combined with `tag_name`. The fake lists GPU droplets only under `type=gpus` and
/// refuses the combination; a crash between create and its journal entry must still find
/// the GPU droplet and adopt it (exactly one create).
#[tokio::test]
async fn gpu_droplets_need_type_gpus_without_tag_name() {
    let r = run(h100_world()).await;
    r.journal.crash_before("booting");
    let first = r.launch().await.unwrap_err();
    assert!(matches!(first, ExecError::Journal { .. }), "{first:?}");
    assert_eq!(r.cloud.creates().len(), 1, "the create happened");
    let end = r.launch().await.unwrap();
    assert!(end.ready().is_some(), "{end:?} {:?}", r.labels());
    assert_eq!(r.cloud.creates().len(), 1, "adopted, not created twice");
    assert_eq!(r.cloud.world.lock().unwrap().droplets.len(), 1);
    let seen = listings(&r.cloud.server);
    assert!(
        seen.iter().any(|(t, _)| t.as_deref() == Some("gpus")),
        "{seen:?}"
    );
    assert!(
        seen.iter().all(|(t, tag)| t.is_none() || tag.is_none()),
        "type combined with tag_name: {seen:?}"
    );
    // The fake does refuse the combination (so the test above means something).
    let w = r.cloud.world.lock().unwrap().list(&Seen {
        method: "GET".into(),
        path: DROPLETS.into(),
        query: vec![
            ("type".into(), "gpus".into()),
            ("tag_name".into(), ID_TAG.into()),
        ],
        headers: vec![],
        body: None,
    });
    assert_eq!(w.status, 422);
    // And a plain tag_name listing does not show the GPU droplet.
    let w = r.cloud.world.lock().unwrap().list(&Seen {
        method: "GET".into(),
        path: DROPLETS.into(),
        query: vec![("tag_name".into(), ID_TAG.into())],
        headers: vec![],
        body: None,
    });
    assert_eq!(w.body.unwrap()["droplets"], json!([]));
    r.cloud.server.verify();
}

#[tokio::test]
async fn a_crash_between_create_and_journal_adopts_a_cpu_droplet() {
    let mut r = run(h100_world()).await;
    r.vm.gpu = None;
    r.vm.gpu_count = 0;
    r.vm.regions = vec!["nyc1".into()];
    r.journal.crash_before("booting");
    assert!(r.launch().await.is_err());
    let end = r.launch().await.unwrap();
    let vm = end.ready().unwrap_or_else(|| panic!("{end:?}"));
    assert_eq!(vm.offer.instance_type, "s-2vcpu-4gb");
    assert_eq!(
        r.cloud.creates().len(),
        1,
        "adopted through tag_name, not created twice"
    );
    assert_eq!(r.cloud.creates()[0]["image"], "ubuntu-24-04-x64");
    r.cloud.server.verify();
}

#[tokio::test]
async fn sizes_are_read_across_pages_without_following_foreign_links() {
    let mut world = h100_world()
        .with_size("gpu-l40sx1-48gb", Some(("nvidia_l40s", 1)), 1.57, &["tor1"])
        .with_size(
            "gpu-mi300x1-192gb",
            Some(("amd_mi300x", 1)),
            1.99,
            &["tor1"],
        );
    world.page_cap = 2;
    let cloud = Cloud2::start(world).await;
    let p = cloud.provider();
    // The MI300X size is on the last of three pages.
    let o = p.plan(&ask(Some("MI300X"), 1, &[])).await.unwrap();
    assert_eq!(o.len(), 1);
    assert_eq!(o[0].id, "digitalocean/tor1/gpu-mi300x1-192gb");
    assert_eq!(o[0].price_per_hour, 1.99);
    let pages: Vec<Option<String>> = cloud
        .server
        .requests_to("GET", "/v2/sizes")
        .iter()
        .map(|r| {
            assert_eq!(query(r, "per_page"), Some("200"));
            query(r, "page").map(str::to_string)
        })
        .collect();
    assert_eq!(pages, [None, Some("2".to_string()), Some("3".to_string())]);
    // Regions were paginated too (4 regions, 2 per page).
    assert_eq!(cloud.server.requests_to("GET", "/v2/regions").len(), 2);
    cloud.server.verify();
}

#[tokio::test]
async fn region_slugs_match_exactly_and_create_sends_the_boot_script() {
    let mut world = World::default().with_size(H100X1, Some(("nvidia_h100", 1)), 3.39, &["nyc1"]);
    world.regions.push(region_json("nyc13", true));
    world.sizes[0]["regions"] = json!(["nyc1", "nyc13"]);
    let cloud = Cloud2::start(world).await;
    let p = cloud.provider();
    assert!(p
        .plan(&ask(Some("H100"), 1, &["nyc"]))
        .await
        .unwrap()
        .is_empty());
    let o = p.plan(&ask(Some("H100"), 1, &["nyc13"])).await.unwrap();
    assert_eq!(o.len(), 1);
    assert_eq!(o[0].location.region, "nyc13");
    let mut spec = instance_spec();
    let prepared = drive::prepare(p.clone(), &o[0], &spec).await.unwrap();
    spec.boot_script = Some(BootScript {
        script: "echo hello".into(),
        env: BTreeMap::from([("A".to_string(), "b".to_string())]),
    });
    let id = p.create(&o[0], &prepared, &spec).await.unwrap();
    let ud = cloud.creates()[0]["user_data"]
        .as_str()
        .unwrap()
        .to_string();
    let script = boot_script_of(&ud);
    assert!(
        script.contains("export A=") && script.contains("echo hello"),
        "{script}"
    );
    // A droplet of ours in nyc13 is not seen when observing nyc1.
    assert!(p.observe(&loc("nyc1"), "trainer").await.unwrap().is_empty());
    let seen = p.observe(&loc("nyc13"), "trainer").await.unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].instance_id, id);
    assert_eq!(seen[0].status, InstanceStatus::Running);
    let ssh = seen[0].ssh.clone().expect("endpoint once active");
    assert!(
        ssh.host.starts_with("127.0.0."),
        "the public address, not the private one: {ssh}"
    );
    assert_eq!((ssh.port, ssh.user.as_deref()), (22, Some("root")));
    // Another lineage's droplet with the same VM name is not ours.
    {
        let mut w = cloud.world.lock().unwrap();
        let mut other = w.droplets[0].clone();
        other["id"] = json!(1);
        other["tags"] = json!([
            ID_TAG,
            "gpuprov-lineage:ffffffff-0000-4000-8000-000000000000"
        ]);
        w.droplets.push(other);
    }
    assert_eq!(p.observe(&loc("nyc13"), "trainer").await.unwrap().len(), 1);
    cloud.server.verify();
}

#[tokio::test]
async fn prepare_reuses_key_and_firewall_and_rechecks_availability() {
    let mut world = h100_world();
    world.keys = vec![
        json!({"id": 1, "fingerprint": "aa", "public_key": "ssh-ed25519 AAAAC3NzaOther x", "name": "someone-else"}),
        json!({"id": 2, "fingerprint": "bb", "public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGpuprovTestKeyOnly me@laptop", "name": "my-laptop"}),
    ];
    let cloud = Cloud2::start(world).await;
    let p = cloud.provider();
    let offer = p
        .plan(&ask(Some("H100"), 1, &["tor1"]))
        .await
        .unwrap()
        .remove(0);
    let mut spec = instance_spec();
    spec.image = Some("my-image-slug".into());
    let first = drive::prepare(p.clone(), &offer, &spec).await.unwrap();
    let again = drive::prepare(p.clone(), &offer, &spec).await.unwrap();
    assert_eq!(first, again, "prepare is idempotent");
    assert_eq!(first["ssh_key_id"], 2, "found by value, not registered");
    assert_eq!(first["image"], "my-image-slug");
    assert!(cloud
        .server
        .requests_to("POST", "/v2/account/keys")
        .is_empty());
    assert_eq!(
        cloud.server.requests_to("POST", "/v2/firewalls").len(),
        1,
        "found the second time"
    );

    // A disk larger than the size's: Unavailable (nothing to compensate).
    spec.disk_gb = Some(5000);
    assert_eq!(
        drive::prepare(p.clone(), &offer, &spec)
            .await
            .unwrap_err()
            .kind,
        ErrorKind::Unavailable
    );
    spec.disk_gb = Some(500);
    drive::prepare(p.clone(), &offer, &spec).await.unwrap();
    // The size left the region by the next prepare: Unavailable.
    cloud.world.lock().unwrap().sizes[0]["regions"] = json!(["nyc2"]);
    let e = drive::prepare(p.clone(), &offer, &spec).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unavailable, "{e}");
    cloud.server.verify();
}

#[tokio::test]
async fn unknown_droplet_delete_and_missing_firewall_cleanup_succeed() {
    let cloud = Cloud2::start(h100_world()).await;
    let p = cloud.provider();
    p.delete(
        &loc("tor1"),
        "trainer",
        &["3164444".into(), "not-a-number".into()],
    )
    .await
    .unwrap();
    p.cleanup(&loc("tor1"), "trainer").await.unwrap();
    // A firewall that vanishes between list and delete is success too.
    let fw_id = "bb4b2611-3d72-467b-8602-280330ecd65c";
    cloud.world.lock().unwrap().firewalls.push(json!({
        "id": fw_id, "name": "gpuprov-trainer-0f0e0d0c-tor1", "status": "succeeded",
        "created_at": "2026-11-30T20:00:00Z", "pending_changes": [], "droplet_ids": [],
        "tags": ["gpuprov-trainer-0f0e0d0c-tor1"],
        "inbound_rules": [{"protocol": "tcp", "ports": "22", "sources": {"addresses": ["0.0.0.0/0"]}}]
    }));
    let path = format!("/v2/firewalls/{fw_id}");
    cloud.world.lock().unwrap().fault(
        "DELETE",
        &path,
        Canned::status(
            404,
            err_body(
                "not_found",
                "The resource you were accessing could not be found.",
            ),
        ),
    );
    p.cleanup(&loc("tor1"), "trainer").await.unwrap();
    // Another region's firewall of the same VM is left alone.
    cloud.world.lock().unwrap().firewalls[0]["name"] = json!("gpuprov-trainer-0f0e0d0c-nyc2");
    p.cleanup(&loc("tor1"), "trainer").await.unwrap();
    assert_eq!(cloud.world.lock().unwrap().firewalls.len(), 1);
    // A server error is transient.
    cloud.world.lock().unwrap().fault(
        "GET",
        DROPLETS,
        Canned::status(
            500,
            err_body("server_error", "Unexpected server-side error"),
        ),
    );
    assert_eq!(
        p.observe(&loc("tor1"), "trainer").await.unwrap_err().kind,
        ErrorKind::Transient
    );
    cloud.server.verify();
}

#[tokio::test]
async fn the_token_never_appears_in_errors() {
    let r = run(h100_world()).await;
    {
        let mut w = r.cloud.world.lock().unwrap();
        w.echo_auth = true;
        // A hostile server echoing the Authorization header in its error message.
        w.fault(
            "GET",
            "/v2/sizes",
            Canned::status(401, err_body("unauthorized", "Unable to authenticate you.")),
        );
    }
    let end = r.launch().await.unwrap();
    match &end {
        LaunchState::Aborted { reason, .. } => {
            assert!(reason.contains("unauthorized"), "{reason}");
            assert!(!reason.contains(SENTINEL), "{reason}");
        }
        other => panic!("expected Aborted, got {other:?}"),
    }
    for (_, label) in r.journal.history() {
        assert!(!label.contains(SENTINEL), "{label}");
    }
    assert!(!format!("{end:?}").contains(SENTINEL));
    assert!(!format!("{:?}", r.provider.settings()).contains(SENTINEL));

    // Every primitive, each answered by an error that echoes the token.
    let p = r.provider.clone();
    for (m, path) in [
        ("GET", "/v2/sizes"),
        ("GET", DROPLETS),
        ("DELETE", "/v2/droplets/3164444"),
        ("GET", "/v2/firewalls"),
        ("POST", DROPLETS),
    ] {
        r.cloud.world.lock().unwrap().fault(
            m,
            path,
            Canned::status(
                403,
                err_body(
                    "forbidden",
                    "You do not have access for the attempted action.",
                ),
            ),
        );
    }
    let offer = {
        let o = p.plan(&ask(Some("H100"), 1, &["tor1"])).await;
        assert_eq!(o.as_ref().unwrap_err().kind, ErrorKind::Credentials);
        r.cloud.world.lock().unwrap().echo_auth = false;
        let o = p
            .plan(&ask(Some("H100"), 1, &["tor1"]))
            .await
            .unwrap()
            .remove(0);
        r.cloud.world.lock().unwrap().echo_auth = true;
        o
    };
    let prepared = json!({"ssh_key_id": 1, "image": "gpu-h100x1-base", "firewall_tag": "gpuprov-trainer-0f0e0d0c-tor1"});
    let errors = [
        p.observe(&loc("tor1"), "trainer").await.unwrap_err(),
        p.delete(&loc("tor1"), "trainer", &["3164444".into()])
            .await
            .unwrap_err(),
        p.cleanup(&loc("tor1"), "trainer").await.unwrap_err(),
        p.create(&offer, &prepared, &instance_spec())
            .await
            .unwrap_err(),
    ];
    for e in &errors {
        assert_eq!(e.kind, ErrorKind::Credentials, "{e}");
        assert!(!e.to_string().contains(SENTINEL), "{e}");
        assert!(e.msg.contains("REDACTED"), "the echo was scrubbed: {e}");
    }
    r.cloud.server.verify();

    // No token at all: a Credentials error naming where it looked.
    let e = r
        .cloud
        .provider_with_token(None)
        .observe(&loc("tor1"), "trainer")
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Credentials);
    assert!(
        e.msg.contains("DIGITALOCEAN_TOKEN") && e.msg.contains("doctl/config.yaml"),
        "{}",
        e.msg
    );
}

#[tokio::test]
async fn unplannable_asks_are_invalid_requests() {
    let cloud = Cloud2::start(h100_world()).await;
    let p = cloud.provider();
    let mut a = ask(Some("H100"), 1, &[]);
    a.spot = true;
    assert_eq!(
        p.plan(&a).await.unwrap_err().kind,
        ErrorKind::InvalidRequest,
        "no spot on DigitalOcean"
    );
    let e = p.plan(&ask(Some("B200"), 8, &[])).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest);
    assert!(
        e.msg.contains("H100 x1") && e.msg.contains("H100 x8"),
        "{}",
        e.msg
    );
    let e = p.plan(&ask(Some("H100"), 2, &[])).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest);
    // A region that takes no new droplets gives no offer (not an error).
    cloud.world.lock().unwrap().regions[0]["available"] = json!(false);
    assert!(p
        .plan(&ask(Some("H100"), 1, &["tor1"]))
        .await
        .unwrap()
        .is_empty());
    cloud.server.verify();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpuprov_plan_lists_the_digitalocean_offer_from_the_local_api() {
    let cloud = Cloud2::start(h100_world()).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("gpuprov.toml"),
        "[defaults]\nclouds = [\"digitalocean\"]\nkubernetes = false\n\n[vm.trainer]\ngpu = \"H100\"\ngpu_count = 8\nregions = [\"tor1\"]\n",
    )
    .unwrap();
    let uri = cloud.server.uri();
    let path = dir.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        assert_cmd::Command::cargo_bin("gpuprov")
            .unwrap()
            .current_dir(&path)
            .env("GPUPROV_HOME", path.join("home"))
            .env("XDG_CONFIG_HOME", path.join("config"))
            .env("NO_COLOR", "1")
            .env_remove("GPUPROV_CONFIG")
            .env_remove("GPUPROV_STATE")
            .env_remove("DIGITALOCEAN_ACCESS_TOKEN")
            .env("GPUPROV_DIGITALOCEAN_ENDPOINT", &uri)
            .env("DIGITALOCEAN_TOKEN", SENTINEL)
            .args(["plan"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("no adapter for digitalocean in this build"),
        "target/debug/gpuprov is another checkout's build (shared CARGO_TARGET_DIR)\n{stderr}"
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("23.92"), "{stdout}");
    assert!(
        stdout.contains(&cloud.server.uri()),
        "the endpoint override is shown: {stdout}"
    );
    assert!(!stdout.contains(SENTINEL) && !stderr.contains(SENTINEL));
    assert!(cloud.creates().is_empty(), "plan creates nothing");
    cloud.server.verify();
}

/// The shell script inside cloud-config user-data (`write_files[0]`, base64).
fn boot_script_of(user_data: &str) -> String {
    assert!(user_data.starts_with("#cloud-config\n"), "{user_data}");
    let doc: serde_yaml::Value = serde_yaml::from_str(user_data).unwrap();
    let content = doc["write_files"][0]["content"].as_str().unwrap();
    gpuprov::provider::boot::cloud_init::decode_gz_b64(content).expect("gzip in base64")
}

/// Issue 12 item 6: keys named like the project key but holding another value (one under
/// the old `gpuprov-<lineage8>` name, one under the derived name itself) are never used and
/// do not stop the run: ours is registered under the derived name (DigitalOcean refuses
/// duplicate values, not names) and the droplet is created with it.
#[tokio::test]
async fn keys_named_like_ours_with_another_value_are_never_used() {
    let derived = project_key_name(LINEAGE, PUBKEY);
    let mut world = h100_world();
    world.keys = vec![
        json!({"id": 7, "fingerprint": "aa", "public_key": "ssh-ed25519 AAAAC3NzaForeignOldName x", "name": "gpuprov-0f0e0d0c"}),
        json!({"id": 8, "fingerprint": "bb", "public_key": "ssh-ed25519 AAAAC3NzaForeignDerived y", "name": derived}),
    ];
    let r = run(world).await;
    let end = r.launch().await.unwrap();
    assert!(end.ready().is_some(), "{end:?} {:?}", r.labels());
    let posts = r.cloud.server.requests_to("POST", "/v2/account/keys");
    assert_eq!(posts.len(), 1, "registered once");
    let kb = posts[0].body.clone().unwrap();
    assert_eq!(
        (kb["name"].clone(), kb["public_key"].clone()),
        (json!(derived), json!(PUBKEY))
    );
    let ours = r.cloud.world.lock().unwrap().keys[2]["id"].clone();
    assert_eq!(r.cloud.creates()[0]["ssh_keys"], json!([ours]));
    r.cloud.server.verify();
}

/// A registration refused because the key is already on the account (422 "SSH Key is
/// already in use on your account": registered meanwhile, or the listing lagged) is not a
/// failure: the keys are listed again and ours is found by value.
#[tokio::test]
async fn a_key_already_in_use_is_found_by_value_after_the_refusal() {
    let mut world = h100_world();
    world.keys = vec![json!({
        "id": 42, "fingerprint": "cc", "name": "my-laptop",
        "public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGpuprovTestKeyOnly me@laptop"
    })];
    let cloud = Cloud2::start(world).await;
    // The first listing lags and does not show the key yet.
    cloud.world.lock().unwrap().fault(
        "GET",
        "/v2/account/keys",
        Canned::ok(json!({"ssh_keys": [], "links": {}, "meta": {"total": 0}})),
    );
    let p = cloud.provider();
    let offer = p
        .plan(&ask(Some("H100"), 1, &["tor1"]))
        .await
        .unwrap()
        .remove(0);
    let prepared = drive::prepare(p.clone(), &offer, &instance_spec())
        .await
        .unwrap();
    assert_eq!(prepared["ssh_key_id"], 42);
    assert_eq!(cloud.world.lock().unwrap().keys.len(), 1);
    cloud.server.verify();
}

/// A provider for an endpoint that is not the spec server.
fn provider_at(endpoint: String) -> DigitalOceanProvider {
    DigitalOceanProvider::new(DigitalOceanSettings {
        endpoint: Some(endpoint),
        token: Some(Token::new(SENTINEL)),
        token_source: "test".into(),
        lineage: LINEAGE.parse().unwrap(),
    })
}

/// Issue 12 item 7: a proxy in front of the API answering 502 with its own HTML page (not
/// DigitalOcean's `error` object, so not the spec server) gives one short line naming the
/// status and the content type, never the page.
#[tokio::test]
async fn an_html_error_page_is_one_short_line() {
    let proxy = wiremock::MockServer::start().await;
    let page = format!(
        "<!DOCTYPE html>\n<html>\n<head><title>502 Bad Gateway</title></head>\n<body>\n<center><h1>502 Bad Gateway</h1></center>\n{}<hr><center>cloudflare</center>\n</body>\n</html>\n",
        "<!-- a padding comment to make the page long -->\n".repeat(40)
    );
    wiremock::Mock::given(wiremock::matchers::any())
        .respond_with(
            wiremock::ResponseTemplate::new(502)
                .set_body_raw(page.clone(), "text/html; charset=utf-8"),
        )
        .mount(&proxy)
        .await;
    let p = provider_at(proxy.uri());
    let e = p.observe(&loc("tor1"), "trainer").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient, "{e}");
    assert!(!e.msg.contains('\n'), "one line: {}", e.msg);
    assert!(
        e.msg.contains("HTTP 502") && e.msg.contains("text/html"),
        "{}",
        e.msg
    );
    assert!(e.msg.contains("502 Bad Gateway"), "{}", e.msg);
    assert!(!e.msg.contains('<'), "no markup: {}", e.msg);
    assert!(e.msg.len() < 200, "short: {}", e.msg);
}

/// Issue 12 item 7: an endpoint that refuses connections is `Unreachable` at once (the
/// core then blocks the whole cloud); the adapter does not retry, and the message names
/// the endpoint without the token.
#[tokio::test]
async fn a_refused_connection_is_unreachable_at_once() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    let p = provider_at(format!("http://127.0.0.1:{port}"));
    let started = Instant::now();
    let e = p.plan(&ask(Some("H100"), 1, &["tor1"])).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unreachable, "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(e.msg.contains(&format!("127.0.0.1:{port}")), "{}", e.msg);
    assert!(!e.msg.contains(SENTINEL), "{}", e.msg);
    assert_eq!(
        p.observe(&loc("tor1"), "trainer").await.unwrap_err().kind,
        ErrorKind::Unreachable
    );
}

/// Issue 12 item 2: DigitalOcean can power a droplet on, so it declares `Feature::Start`.
/// A droplet that is `off` is observed `Stopped`; `start` powers it on
/// (`POST /v2/droplets/{id}/actions` `{"type": "power_on"}`) and it is observed `Running`;
/// starting it again while it runs is success without another action.
#[tokio::test]
async fn a_stopped_droplet_is_started_and_observed_running() {
    let cloud = Cloud2::start(h100_world()).await;
    let p = cloud.provider();
    assert!(p.capabilities().supports(Feature::Start));
    let offer = p
        .plan(&ask(Some("H100"), 1, &["tor1"]))
        .await
        .unwrap()
        .remove(0);
    let spec = instance_spec();
    let prepared = drive::prepare(p.clone(), &offer, &spec).await.unwrap();
    let id = p.create(&offer, &prepared, &spec).await.unwrap();
    let at = loc("tor1");
    p.observe(&at, "trainer").await.unwrap(); // new → active in the fake
    let seen = p.observe(&at, "trainer").await.unwrap();
    assert_eq!(seen[0].status, InstanceStatus::Running);

    // Stopped by the user (or the vendor).
    let n: i64 = id.parse().unwrap();
    cloud.world.lock().unwrap().action(
        &format!("/v2/droplets/{n}/actions"),
        &json!({"type": "power_off"}),
    );
    let seen = p.observe(&at, "trainer").await.unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        (seen[0].instance_id.as_str(), &seen[0].status),
        (id.as_str(), &InstanceStatus::Stopped)
    );

    p.start(&at, "trainer", &id).await.unwrap();
    let actions = format!("/v2/droplets/{n}/actions");
    let posts = cloud.server.requests_to("POST", &actions);
    assert_eq!(posts.len(), 1);
    assert_eq!(posts[0].body, Some(json!({"type": "power_on"})));
    // The droplet stays `off` while the action is in progress; a start then (the core
    // seeing it still Stopped) is success: the refused second action ("pending event")
    // is answered by the power_on in progress.
    let seen = p.observe(&at, "trainer").await.unwrap();
    assert_eq!(seen[0].status, InstanceStatus::Stopped);
    p.start(&at, "trainer", &id).await.unwrap();
    assert_eq!(cloud.server.requests_to("POST", &actions).len(), 2);
    // Running once the action completes (the next listing in this fake).
    let mut seen = p.observe(&at, "trainer").await.unwrap();
    for _ in 0..3 {
        if seen[0].status == InstanceStatus::Running {
            break;
        }
        seen = p.observe(&at, "trainer").await.unwrap();
    }
    assert_eq!(seen[0].status, InstanceStatus::Running);
    assert!(seen[0].ssh.is_some());

    // Already running: success, no further action.
    p.start(&at, "trainer", &id).await.unwrap();
    assert_eq!(cloud.server.requests_to("POST", &actions).len(), 2);
    // Gone: nothing to start.
    p.delete(&at, "trainer", std::slice::from_ref(&id))
        .await
        .unwrap();
    assert_eq!(
        p.start(&at, "trainer", &id).await.unwrap_err().kind,
        ErrorKind::Failed
    );
    cloud.server.verify();
}

/// Issue 12 item 4: what `prepare` created for a VM (the firewall and its tag) is removed
/// by `cleanup`, also when the offer is abandoned before any droplet exists; a cleanup
/// again finds nothing and succeeds.
#[tokio::test]
async fn cleanup_removes_the_firewall_and_its_tag_of_an_abandoned_prepare() {
    let cloud = Cloud2::start(h100_world()).await;
    let p = cloud.provider();
    let offer = p
        .plan(&ask(Some("H100"), 1, &["tor1"]))
        .await
        .unwrap()
        .remove(0);
    drive::prepare(p.clone(), &offer, &instance_spec())
        .await
        .unwrap();
    let fw_tag = "gpuprov-trainer-0f0e0d0c-tor1";
    assert!(cloud.world.lock().unwrap().tags.contains(fw_tag));
    p.cleanup(&loc("tor1"), "trainer").await.unwrap();
    {
        let w = cloud.world.lock().unwrap();
        assert!(w.firewalls.is_empty(), "{:?}", w.firewalls);
        assert!(
            !w.tags.iter().any(|t| t.starts_with("gpuprov-trainer-")),
            "{:?}",
            w.tags
        );
    }
    p.cleanup(&loc("tor1"), "trainer").await.unwrap();
    cloud.server.verify();
}

/// Issue 20 on DigitalOcean: a fleet of `n` droplets in one region applied with full
/// parallelism through the core's shared observation (or per machine, for comparison),
/// with a realistic 1 s poll; answers the `GET /v2/droplets` calls the spec-checked
/// server saw, after checking every machine came up on its own droplet, then the calls
/// of one poll round of the whole fleet (every machine observing at once, as refresh and
/// waiting machines do).
async fn droplet_listings_of_a_fleet(n: usize, shared: bool) -> (usize, usize) {
    use gpuprov::engine::{Engine, Outcome, StateJournal};
    use gpuprov::machine::{CancelToken, Executor, Providers};
    use gpuprov::state::StateStore;
    let cloud = Cloud2::start(h100_world()).await;
    let caps = gpuprov::provider::Capabilities {
        poll_interval: Duration::from_secs(1),
        ..drive::test_capabilities(DigitalOceanProvider::default_capabilities())
    };
    let provider = DigitalOceanProvider::new(DigitalOceanSettings {
        endpoint: Some(cloud.server.uri()),
        token: Some(Token::new(SENTINEL)),
        token_source: "the DIGITALOCEAN_TOKEN environment variable".into(),
        lineage: LINEAGE.parse().unwrap(),
    })
    .with_capabilities(caps);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpuprov.state.json");
    let (mut store, mut st) = StateStore::open(&path).unwrap();
    st.lineage = LINEAGE.to_string();
    store.save(&mut st).unwrap();
    let (store, state) = StateStore::open(&path).unwrap();
    let journal = Arc::new(StateJournal::new(store, state).unwrap());
    let mut providers = match shared {
        true => Providers::new(),
        false => Providers::per_machine_observe(),
    };
    let provider = Arc::new(provider);
    providers.insert(provider.clone());
    let engine = Engine {
        providers,
        connector: Arc::new(gpuprov::provider::doubles::fake::FakeConnector::default()),
        journal: journal.clone(),
        executor: Executor::new(journal.clone(), CancelToken::new()),
        lineage: LINEAGE.into(),
        ssh_public_key: PUBKEY.into(),
        parallelism: n,
        retry_until_up: false,
        k3s: None,
    };
    let mut toml =
        "[defaults]\nclouds = [\"digitalocean\"]\nregions = [\"tor1\"]\ngpu = \"H100\"\n"
            .to_string();
    for i in 0..n {
        toml.push_str(&format!("[vm.m{i:02}]\n"));
    }
    let config =
        gpuprov::config::Config::parse(std::path::Path::new("gpuprov.toml"), toml).unwrap();
    let plan = gpuprov::plan::compute(&config, &journal.snapshot(), None, &|_| Some(1.0)).unwrap();
    let out = tokio::time::timeout(Duration::from_secs(60), engine.apply(&plan))
        .await
        .expect("no hang");
    let ids: BTreeSet<String> = out
        .iter()
        .filter_map(|(a, o)| match o {
            Outcome::Ready(vm) if a.starts_with("vm.") => Some(vm.instance_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(ids.len(), n, "every machine up on its own droplet: {out:?}");
    assert_eq!(cloud.creates().len(), n, "one create each");
    let applied = cloud.server.requests_to("GET", DROPLETS).len();
    // One poll round: every machine observes its droplet at once.
    let mut round = match shared {
        true => Providers::new(),
        false => Providers::per_machine_observe(),
    };
    round.insert(provider);
    let p = round.get("digitalocean").unwrap().clone();
    let at = loc("tor1");
    let seen = futures_util::future::join_all((0..n).map(|i| {
        let (p, at) = (p.clone(), at.clone());
        async move { p.observe(&at, &format!("m{i:02}")).await.unwrap() }
    }))
    .await;
    let seen: BTreeSet<String> = seen
        .iter()
        .map(|s| {
            assert_eq!(s.len(), 1, "each machine sees its own droplet: {s:?}");
            s[0].instance_id.clone()
        })
        .collect();
    assert_eq!(seen, ids, "each machine sees its own droplet");
    cloud.server.verify();
    let polled = cloud.server.requests_to("GET", DROPLETS).len() - applied;
    (applied, polled)
}

/// Issue 20 on a real adapter path, counted at the spec-checked server: one poll round of
/// a fleet lists the droplets once (two calls: `type=gpus` and the non-GPU listing) whether
/// it has 5 or 20 machines, where observing per machine makes one listing per machine;
/// and a whole fleet apply (prepare, the create-intent check, create and the waits)
/// makes fewer listing calls than machines and far fewer than per machine. The apply's
/// figure depends on how the creates bunch (each machine's next answer must come from a
/// listing started after its create returned), so only the poll round is exact.
/// Measured on a quiet machine: apply 5 shared 8, 20 shared 10, 20 per machine 120.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleets_observes_share_droplet_listings_whatever_its_size() {
    const N: usize = 20;
    let (small, small_round) = droplet_listings_of_a_fleet(5, true).await;
    let (large, large_round) = droplet_listings_of_a_fleet(N, true).await;
    let (per_machine, per_machine_round) = droplet_listings_of_a_fleet(N, false).await;
    eprintln!(
        "GET /v2/droplets: apply 5 shared {small}, {N} shared {large}, {N} per machine \
         {per_machine}; poll round {small_round}, {large_round}, {per_machine_round}"
    );
    assert_eq!(
        [small_round, large_round, per_machine_round],
        [2, 2, 2 * N],
        "one listing per round whatever the fleet's size, against one per machine"
    );
    assert!(large <= 2 * N, "apply of {N}: {large} calls");
    assert!(
        4 * large <= per_machine,
        "apply: {large} shared, {per_machine} per machine"
    );
}

/// DigitalOcean declares its documented rates (API description, "Rate Limit"): 250
/// requests a minute and 5,000 an hour over every request, and 10 SSH key listings per
/// 60 s.
#[test]
fn the_documented_rate_limits_are_declared_with_their_source() {
    use gpuprov::provider::{EndpointClass, RateLimit};
    let caps = DigitalOceanProvider::default_capabilities();
    let windows: Vec<(Option<EndpointClass>, u32, u64)> = caps
        .rate_limits
        .iter()
        .map(|l: &RateLimit| (l.class, l.requests, l.per.as_secs()))
        .collect();
    assert_eq!(
        windows,
        vec![
            (None, 250, 60),
            (None, 5000, 3600),
            (Some(EndpointClass::KeyListing), 10, 60)
        ]
    );
    let spec = std::fs::read_to_string(
        spec::vendor_apis_dir().join("digitalocean/DigitalOcean-public.v2.gpuprov-subset.yaml"),
    )
    .unwrap();
    assert!(spec.contains("5,000 requests per hour") && spec.contains("250 requests per minute"));
    assert!(spec.contains(
        "Only 10 `GET` requests to the `/v2/account/keys` endpoint to list SSH keys can be made per 60 seconds."
    ));
    for l in &caps.rate_limits {
        assert!(l.source.contains("DigitalOcean-public.v2"), "{}", l.source);
    }
}

/// Declared rates hold at the server for a whole fleet apply through the real adapter
/// path (prepare's lookups, coalesced listings, launches, key listing): the server times
/// each request's arrival and counts those beyond a declared limit in any window. The
/// limits are scaled down from the documented ones (250 a minute would take minutes to
/// bind; the apply lists the keys twice, not 11 times) and add a launch limit, so an
/// all-request limit and both class limits bind. The same apply without declared limits
/// breaks them, so the count can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleet_apply_never_exceeds_the_declared_rates_at_the_server() {
    use crate::shared_objects::{all_ready, fleet, Project};
    use gpuprov::provider::rate::violations;
    use gpuprov::provider::{EndpointClass, RateLimit};
    const N: usize = 8;
    let limits = vec![
        RateLimit::all(
            25,
            Duration::from_secs(1),
            "test: DigitalOcean's shape, scaled",
        ),
        RateLimit::of(EndpointClass::Launch, 2, Duration::from_secs(1), "test"),
        RateLimit::of(EndpointClass::KeyListing, 1, Duration::from_secs(2), "test"),
    ];
    let measure = |server: &SpecServer| -> (usize, usize, usize, usize) {
        let timed = server.requests_timed();
        let t0 = timed[0].0;
        let at = |of: Option<(&str, &str)>| -> Vec<f64> {
            timed
                .iter()
                .filter(|(_, r)| of.is_none_or(|(m, p)| r.method == m && r.path == p))
                .map(|(t, _)| t.duration_since(t0).as_secs_f64())
                .collect()
        };
        (
            violations(&at(None), &limits[0]),
            violations(&at(Some(("POST", DROPLETS))), &limits[1]),
            violations(&at(Some(("GET", "/v2/account/keys"))), &limits[2]),
            timed.len(),
        )
    };
    let run = |declared: Vec<RateLimit>| async move {
        let cloud = Cloud2::start(h100_world()).await;
        let caps = gpuprov::provider::Capabilities {
            rate_limits: declared,
            boot_timeout: Duration::from_secs(60),
            delete_timeout: Duration::from_secs(60),
            ..drive::test_capabilities(DigitalOceanProvider::default_capabilities())
        };
        let provider = Arc::new(
            DigitalOceanProvider::new(DigitalOceanSettings {
                endpoint: Some(cloud.server.uri()),
                token: Some(Token::new(SENTINEL)),
                token_source: "the DIGITALOCEAN_TOKEN environment variable".into(),
                lineage: LINEAGE.parse().unwrap(),
            })
            .with_capabilities(caps),
        );
        let p = Project::new(provider, Some(LINEAGE));
        let started = Instant::now();
        all_ready(
            &p.apply(&fleet("digitalocean", "tor1", Some("H100"), N))
                .await,
            N,
        );
        cloud.server.verify();
        (cloud, started.elapsed())
    };
    let (unlimited, _) = run(vec![]).await;
    let (over_all, over_launch, over_keys, _) = measure(&unlimited.server);
    assert!(
        over_all > 0 && over_launch > 0 && over_keys > 0,
        "without declared limits the apply bursts past them: \
         {over_all} / {over_launch} / {over_keys}"
    );
    let (limited, took) = run(limits.clone()).await;
    let (over_all, over_launch, over_keys, requests) = measure(&limited.server);
    if over_all > 0 {
        let timed = limited.server.requests_timed();
        for (t, r) in &timed {
            eprintln!(
                "{:.3} {} {}",
                t.duration_since(timed[0].0).as_secs_f64(),
                r.method,
                r.path
            );
        }
    }
    assert_eq!(
        (over_all, over_launch, over_keys),
        (0, 0, 0),
        "{requests} requests in {took:?}"
    );
    // The limits bound: N launches at 2 a second take at least (N/2 − 1) s.
    assert!(took >= Duration::from_secs((N / 2 - 1) as u64), "{took:?}");
}
