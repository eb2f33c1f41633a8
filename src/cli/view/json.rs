//! The machine-readable outputs (`-json`, on stdout): the plan in Terraform's JSON plan
//! shape (`plan -json`, `show -json PLANFILE`), and `status`, `list`, `offers`,
//! `validate` and `health`. Every type derives its JSON Schema; `schemas/gpuprov-*.schema.json` are
//! generated from them ([`schemas`]) and a test fails when one is stale.
//!
//! The plan follows Terraform's JSON output format (`terraform show -json PLANFILE`,
//! <https://developer.hashicorp.com/terraform/internals/json-format>, format 1.2) for the
//! fields it shares: `format_version`, `applyable`, `complete`, `errored`, and
//! `resource_changes[]` with `address`, `mode`, `type`, `name`, `provider_name` and
//! `change` (`actions`, `before`, `after`, `after_unknown`, `before_sensitive`,
//! `after_sensitive`, `replace_paths`). What only gpuprov knows (its own action, why,
//! the offers in apply's order and their prices, each cloud's reason for having none)
//! is under the key `gpuprov`, at the top and in each resource change.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Serialize;

use crate::config::VmSpec;
use crate::plan::{Action, AttrChange, NoOffer, OfferLine, Plan};
use crate::provider::Offer;

/// The version of Terraform's JSON plan format the plan output follows.
pub const TERRAFORM_FORMAT_VERSION: &str = "1.2";

/// A plan in Terraform's JSON plan shape, with gpuprov's extras under `gpuprov`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct JsonPlan {
    /// Terraform's JSON plan format version this output follows ("1.2").
    pub format_version: String,
    /// Whether applying it would change anything (Terraform's `applyable`).
    pub applyable: bool,
    /// Whether applying it brings every machine to its configuration: false for a plan
    /// restricted with `-target`, true otherwise (gpuprov has no deferred changes).
    pub complete: bool,
    /// Whether planning failed (always false: a failed plan prints a diagnostic, no JSON).
    pub errored: bool,
    /// One entry per machine of the config or the state, in address order, then one per
    /// shared object the plan creates, releases or keeps (`type` "shared", `name`
    /// `<cloud>.<kind>`, address `shared.<cloud>.<kind>`, `[<region>]` for a regional one).
    pub resource_changes: Vec<ResourceChange>,
    /// What only gpuprov knows about the plan as a whole.
    pub gpuprov: PlanExtras,
}

/// gpuprov's facts about a whole plan.
#[derive(Debug, Serialize, JsonSchema)]
pub struct PlanExtras {
    /// The gpuprov version that made the plan.
    pub version: String,
    /// The state the plan was made against (apply of a saved plan checks both).
    pub lineage: String,
    pub serial: u64,
    /// SHA-256 (hex) of the config text the plan was made from.
    pub config_sha256: String,
    /// Whether the clouds were asked for each machine's current state.
    pub refreshed: bool,
    /// API endpoint overrides in force, by cloud (credentials in URLs redacted).
    pub endpoints: BTreeMap<String, String>,
    /// Terraform's summary counts: machines to add, change and destroy.
    pub add: usize,
    pub change: usize,
    pub destroy: usize,
    /// What will run after apply, USD per hour (a lower bound when incomplete).
    pub hourly_cost_after: f64,
    /// Whether a price of what will run is unknown.
    pub hourly_cost_incomplete: bool,
    /// Live machines named like this config's under another lineage, found while the
    /// state records nothing (a lost state: `gpuprov state recover --lineage L`).
    pub foreign: Vec<crate::plan::discovery::FoundInstance>,
}

/// One machine's planned change, as Terraform's `resource_changes[]` entry.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ResourceChange {
    /// `vm.NAME`, as in the state and `gpuprov state show`.
    pub address: String,
    /// The address the state recorded the machine under before a `[[moved]]` block moved
    /// it (Terraform's `previous_address`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_address: Option<String>,
    /// Always "managed".
    pub mode: String,
    /// "vm" for a machine, "shared" for a shared object (an SSH key per cloud account, an
    /// environment per region).
    #[serde(rename = "type")]
    pub kind: String,
    /// The machine's name, as in `[vm.NAME]`; `<cloud>.<kind>` for a shared object.
    pub name: String,
    /// Always "gpuprov".
    pub provider_name: String,
    pub change: ChangeValues,
    /// Terraform's reason for a delete or replace, where one of its values fits
    /// (`delete_because_no_resource_config`: the machine left the config).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action_reason: Option<String>,
    /// What only gpuprov knows about this change.
    pub gpuprov: ChangeExtras,
}

/// Terraform's `change` object.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ChangeValues {
    /// Terraform's actions: ["no-op"], ["create"], ["update"], ["delete", "create"]
    /// (replace) or ["delete"]. gpuprov's `resume` (finish an interrupted run, start a
    /// stopped machine) is ["update"]: the machine is kept.
    pub actions: Vec<String>,
    /// The settings the state recorded (null for a new machine).
    pub before: Option<VmSpec>,
    /// The settings after apply (null when destroyed).
    pub after: Option<VmSpec>,
    /// What is known only after apply, as `{"instance": true}` for a machine to be
    /// created: its instance (id, location, offer, SSH endpoint).
    pub after_unknown: BTreeMap<String, bool>,
    /// No setting of a machine is sensitive: always `{}`.
    pub before_sensitive: BTreeMap<String, bool>,
    pub after_sensitive: BTreeMap<String, bool>,
    /// The settings whose change forces the replacement, each as a path (`[["image"]]`).
    pub replace_paths: Vec<Vec<String>>,
    /// Terraform's `importing` (`{"id": ...}`): an instance found by its identity labels
    /// that the state does not record, which apply adopts instead of creating one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub importing: Option<Importing>,
}

/// Terraform's `change.importing`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Importing {
    /// The instance id at the cloud.
    pub id: String,
}

/// gpuprov's facts about one change.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ChangeExtras {
    /// gpuprov's own action (Terraform's `actions` cannot say `resume`).
    pub action: Action,
    /// Why, when it is not obvious from the settings (drift, an interrupted run, a leak).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The settings that change, as the text plan shows them.
    pub attributes: Vec<AttrChange>,
    /// The price of what will run for this machine after apply, USD per hour, if known.
    pub price_per_hour: Option<f64>,
    /// For a machine to be created: the matching offers in the order apply tries them.
    pub offers: Vec<OfferLine>,
    /// For a machine no cloud offers anything for: each cloud's reason.
    pub no_offers: Vec<NoOffer>,
    /// The instance apply adopts (found by identity, unknown to the state).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub found: Option<crate::plan::discovery::FoundInstance>,
    /// Attributes whose effective value differs from the config's (for example
    /// `kubernetes` on a cloud that cannot host k3s), with why; `after` keeps the
    /// config's value.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub effective: std::collections::BTreeMap<String, crate::plan::Effective>,
    /// For a shared object: the machines (`vm.NAME`) of the plan that use it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
}

/// Terraform's actions for gpuprov's action.
fn actions(a: Action) -> Vec<String> {
    let list: &[&str] = match a {
        Action::NoOp => &["no-op"],
        Action::Create => &["create"],
        Action::Update | Action::Resume => &["update"],
        Action::Replace => &["delete", "create"],
        Action::Destroy => &["delete"],
    };
    list.iter().map(|s| s.to_string()).collect()
}

impl JsonPlan {
    /// `plan` in Terraform's shape.
    pub fn of(plan: &Plan) -> JsonPlan {
        let (add, change, destroy) = plan.counts();
        let resource_changes = plan
            .changes
            .iter()
            .map(|c| {
                let creates = matches!(c.action, Action::Create | Action::Replace);
                ResourceChange {
                    address: c.address.clone(),
                    previous_address: plan
                        .moved
                        .iter()
                        .find(|m| m.to == c.address)
                        .map(|m| m.from.clone()),
                    mode: "managed".into(),
                    kind: "vm".into(),
                    name: c.vm.clone(),
                    provider_name: "gpuprov".into(),
                    change: ChangeValues {
                        actions: actions(c.action),
                        before: c.recorded.clone(),
                        after: c.desired.clone(),
                        after_unknown: if creates {
                            BTreeMap::from([("instance".to_string(), true)])
                        } else {
                            BTreeMap::new()
                        },
                        before_sensitive: BTreeMap::new(),
                        after_sensitive: BTreeMap::new(),
                        replace_paths: c
                            .attributes
                            .iter()
                            .filter(|a| a.forces_replacement)
                            .map(|a| vec![a.name.clone()])
                            .collect(),
                        importing: c.found.as_ref().map(|f| Importing {
                            id: f.instance_id.clone(),
                        }),
                    },
                    action_reason: match c.action {
                        Action::Destroy => Some("delete_because_no_resource_config".into()),
                        Action::Replace
                            if c.reason.as_deref() == Some(crate::plan::REPLACE_BY_REQUEST) =>
                        {
                            Some("replace_by_request".into())
                        }
                        _ => None,
                    },
                    gpuprov: ChangeExtras {
                        action: c.action,
                        reason: c.reason.clone(),
                        attributes: c.attributes.clone(),
                        price_per_hour: c.price_per_hour,
                        offers: c.offers.clone(),
                        no_offers: c.no_offers.clone(),
                        found: c.found.clone(),
                        effective: c.effective.clone(),
                        users: Vec::new(),
                    },
                }
            })
            .chain(plan.shared.iter().map(shared_change))
            .collect();
        JsonPlan {
            format_version: TERRAFORM_FORMAT_VERSION.into(),
            applyable: plan.has_changes(),
            // A targeted plan leaves the rest of the config unapplied (Terraform's rule).
            complete: plan.targets.is_empty(),
            errored: false,
            resource_changes,
            gpuprov: PlanExtras {
                version: plan.gpuprov_version.clone(),
                lineage: plan.lineage.clone(),
                serial: plan.serial,
                config_sha256: plan.config_sha256.clone(),
                refreshed: plan.refreshed,
                endpoints: plan.endpoints.clone(),
                add,
                change,
                destroy,
                hourly_cost_after: plan.hourly_cost_after,
                hourly_cost_incomplete: plan.hourly_cost_incomplete,
                foreign: plan.foreign.clone(),
            },
        }
    }
}

/// A shared object's entry in `resource_changes`: no settings before or after (it is
/// made from the project key and the cloud's region), its id known only after apply.
fn shared_change(s: &crate::plan::SharedChange) -> ResourceChange {
    let (cloud, kind) = s.cloud_and_kind();
    ResourceChange {
        address: s.address.clone(),
        previous_address: None,
        mode: "managed".into(),
        kind: "shared".into(),
        name: format!("{cloud}.{kind}"),
        provider_name: "gpuprov".into(),
        change: ChangeValues {
            actions: actions(s.action),
            before: None,
            after: None,
            after_unknown: if s.action == Action::Create {
                BTreeMap::from([("id".to_string(), true)])
            } else {
                BTreeMap::new()
            },
            before_sensitive: BTreeMap::new(),
            after_sensitive: BTreeMap::new(),
            replace_paths: Vec::new(),
            importing: None,
        },
        action_reason: (s.action == Action::Destroy)
            .then(|| "delete_because_no_resource_config".into()),
        gpuprov: ChangeExtras {
            action: s.action,
            reason: Some(match s.action {
                Action::Create => format!(
                    "created once, before the first machine that needs it (found {} if it exists)",
                    if kind == crate::provider::shared::SSH_KEY {
                        "by value"
                    } else {
                        "by the name gpuprov derives"
                    }
                ),
                Action::NoOp => "no machine uses it any more; kept (keep_shared)".into(),
                _ => "released after the last machine using it; deleted only if gpuprov created it"
                    .into(),
            }),
            attributes: Vec::new(),
            price_per_hour: None,
            offers: Vec::new(),
            no_offers: Vec::new(),
            found: None,
            effective: BTreeMap::new(),
            users: s.users.clone(),
        },
    }
}

/// `status -json`: every machine of the state, recorded and (with refresh) observed.
#[derive(Debug, Serialize, JsonSchema)]
pub struct JsonStatus {
    /// Where the state lives (a file or a backend location).
    pub state: String,
    /// Whether the clouds were asked (`--refresh`, on by default).
    pub refreshed: bool,
    pub machines: Vec<MachineStatus>,
}

/// One machine in `status -json`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct MachineStatus {
    /// `vm.NAME`.
    pub address: String,
    /// The recorded machine state, as the state file names it (`ready`, `booting`,
    /// `k3s:installing`, `teardown:deleting`, `invalid`).
    pub state: String,
    /// What the cloud said with refresh: `running`, `gone`, or its status in one word
    /// (`pending`, `stopping`, `stopped`, `terminating`, `failed`, `refused`,
    /// `preempted`); null without refresh or when not asked.
    pub observed: Option<String>,
    /// `cloud/region[/zone]`, when the machine may own an instance.
    pub location: Option<String>,
    /// The cloud's instance ids, whole.
    pub instance_ids: Vec<String>,
    /// `user@host:port`, when up.
    pub ssh: Option<String>,
    /// The price of its offer, USD per hour, when up.
    pub price_per_hour: Option<f64>,
    /// When gpuprov first found it ready (RFC 3339, UTC), when up. Billing starts a little
    /// earlier, at the cloud's create.
    pub up_since: Option<chrono::DateTime<chrono::Utc>>,
    /// Seconds since `up_since`, when up.
    pub uptime_seconds: Option<u64>,
    /// `price_per_hour` × uptime, USD: what it has cost since it was ready (a lower
    /// bound: the boot before is billed too, and prices are list prices).
    pub cost_so_far: Option<f64>,
    /// Whether the machine is a k3s cluster: `on`, `off` (not asked), or `skipped: why`
    /// (asked, but its cloud cannot host k3s); null when unknown (no desired snapshot).
    pub kubernetes: Option<String>,
    /// Why a record cannot be read (`state` is then `invalid`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The last event of its log.
    pub last_event: Option<Event>,
}

/// One event of a machine's log.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Event {
    /// RFC 3339, UTC.
    pub at: chrono::DateTime<chrono::Utc>,
    pub label: String,
}

/// `list -json`: the machines of the state, one entry each.
#[derive(Debug, Serialize, JsonSchema)]
pub struct JsonList {
    pub machines: Vec<ListEntry>,
}

/// One machine in `list -json`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ListEntry {
    /// `vm.NAME`.
    pub address: String,
    /// The kind of its record: `launch`, `k3s` or `teardown`.
    pub kind: String,
    /// Its state's one-line label.
    pub label: String,
}

/// One offer as `offers -json` prints it (a list of them): the offer without its
/// driver-private detail. Prices in USD per hour.
#[derive(Debug, Serialize, JsonSchema)]
pub struct OfferRow<'a> {
    pub id: &'a str,
    pub cloud: &'a str,
    pub region: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<&'a str>,
    pub instance_type: &'a str,
    pub gpu: Option<&'a str>,
    pub gpu_count: u32,
    pub spot: bool,
    pub price_per_hour: f64,
    /// `price_per_hour` / `gpu_count`, USD per GPU-hour; null without GPUs.
    pub price_per_gpu_hour: Option<f64>,
    /// A spot offer shown at the on-demand price (the cloud publishes no spot price):
    /// the real price is lower.
    pub price_is_upper_bound: bool,
    /// vCPUs, when the catalog says.
    pub vcpus: Option<u32>,
    /// Memory, GiB, when the catalog says.
    pub memory_gib: Option<f64>,
    /// Local disk, GiB, when the catalog says.
    pub disk_gib: Option<u32>,
    /// The date of gpuprov's built-in price list the price comes from; null when the
    /// cloud's API quoted it now.
    pub prices_as_of: Option<&'a str>,
}

impl<'a> From<&'a Offer> for OfferRow<'a> {
    fn from(o: &'a Offer) -> Self {
        OfferRow {
            price_per_gpu_hour: (o.gpu_count > 0)
                .then(|| (o.price_per_hour / o.gpu_count as f64 * 10_000.0).round() / 10_000.0),
            price_is_upper_bound: o.facts.spot_price_is_upper_bound,
            vcpus: o.facts.vcpus,
            memory_gib: o.facts.memory_gib,
            disk_gib: o.facts.disk_gib,
            prices_as_of: o.facts.prices_as_of.as_deref(),
            id: &o.id,
            cloud: &o.location.cloud,
            region: &o.location.region,
            zone: o.location.zone.as_deref(),
            instance_type: &o.instance_type,
            gpu: o.gpu.as_deref(),
            gpu_count: o.gpu_count,
            spot: o.spot,
            price_per_hour: o.price_per_hour,
        }
    }
}

/// `validate -json`: the config's verdict and each cloud's usability.
#[derive(Debug, Serialize, JsonSchema)]
pub struct JsonValidate {
    /// The config file checked.
    pub config: String,
    /// Whether the config is valid and every cloud it uses is usable (the exit code: 0
    /// when true).
    pub valid: bool,
    /// How many machines it declares.
    pub machines: usize,
    pub clouds: Vec<CloudCheck>,
    /// Notes of the catalog lookups (a cloud that shows no offers while another does,
    /// k3s skipped where a cloud cannot host it).
    pub notes: Vec<String>,
    /// Machines no cloud offers anything for, with each cloud's reason.
    pub no_offers: BTreeMap<String, Vec<NoOffer>>,
}

/// One cloud in `validate -json`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CloudCheck {
    pub cloud: String,
    /// Whether gpuprov can use it: an adapter, and credentials where they are needed.
    pub usable: bool,
    /// Where the credential was found, where gpuprov looked, or why it is not usable (no
    /// secret).
    pub detail: String,
}

/// `health -json`: each machine's checks and the verdict.
#[derive(Debug, Serialize, JsonSchema)]
pub struct JsonHealth {
    /// Where the state lives (a file or a backend location).
    pub state: String,
    /// Whether no check failed (the exit code: 0 when true; warnings allowed).
    pub healthy: bool,
    /// The machines checked, in address order (one with `health NAME`).
    pub machines: Vec<MachineHealth>,
}

/// One machine in `health -json`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct MachineHealth {
    /// `vm.NAME`.
    pub address: String,
    /// The recorded state's one-line label (`ready 3f2a…`, `aborted: …`).
    pub recorded: String,
    /// `cloud/region[/zone]`, when the machine may own an instance.
    pub location: Option<String>,
    /// The recorded instance id, when the machine is up.
    pub instance_id: Option<String>,
    /// The worst of the three checks (`skipped` counts as `ok`).
    pub status: CheckStatus,
    /// The vendor's own view of the instance, with its findings.
    pub cloud: Check,
    /// A login with the project key and the pinned host key, running `true`.
    pub ssh: Check,
    /// The k3s API (`/readyz` and the node), where the machine has a cluster.
    pub kubernetes: Check,
}

/// One check's outcome.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Check {
    pub status: CheckStatus,
    /// One line: what was seen, or why the check failed or was skipped (no secret).
    pub detail: String,
    /// The cloud's own findings (`cloud` only; empty elsewhere).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<HealthFinding>,
}

/// How a check came out, from best to worst; `warn` keeps exit code 0, `fail` makes it 1.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, serde::Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum CheckStatus {
    /// Not applicable to this machine (the detail says why).
    Skipped,
    Ok,
    Warn,
    Fail,
}

impl CheckStatus {
    /// The lower-case word the table and the JSON use.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckStatus::Skipped => "skipped",
            CheckStatus::Ok => "ok",
            CheckStatus::Warn => "warn",
            CheckStatus::Fail => "fail",
        }
    }
}

/// A vendor-native finding ([`crate::provider::Finding`]).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct HealthFinding {
    /// `info`, `warning` or `error`.
    pub severity: String,
    pub message: String,
}

/// The JSON Schemas of the outputs, as (file name under `schemas/`, pretty JSON with a
/// trailing newline).
pub fn schemas() -> Vec<(&'static str, String)> {
    fn pretty(s: schemars::Schema) -> String {
        let mut t = serde_json::to_string_pretty(&s).unwrap_or_default();
        t.push('\n');
        t
    }
    vec![
        (
            "gpuprov-plan.schema.json",
            pretty(schemars::schema_for!(JsonPlan)),
        ),
        (
            "gpuprov-status.schema.json",
            pretty(schemars::schema_for!(JsonStatus)),
        ),
        (
            "gpuprov-list.schema.json",
            pretty(schemars::schema_for!(JsonList)),
        ),
        (
            "gpuprov-offers.schema.json",
            pretty(schemars::schema_for!(Vec<OfferRow<'static>>)),
        ),
        (
            "gpuprov-validate.schema.json",
            pretty(schemars::schema_for!(JsonValidate)),
        ),
        (
            "gpuprov-health.schema.json",
            pretty(schemars::schema_for!(JsonHealth)),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;
    use crate::state::StateFile;

    /// Three DigitalOcean machines and their one project key: the key is a resource
    /// change of its own (type "shared", created once, its users listed), so a consumer
    /// counting `resource_changes` finds the summary's "4 to add"; the Markdown plan has
    /// a row for it.
    #[test]
    fn a_shared_object_is_a_resource_change_in_json_and_markdown() {
        let text =
            "[defaults]\nclouds = [\"digitalocean\"]\nregions = [\"tor1\"]\n\n[vm.a]\n\n[vm.b]\n\n[vm.c]\n";
        let c = Config::parse(Path::new("t.toml"), text.into()).expect("valid config");
        let plan =
            crate::plan::compute(&c, &StateFile::new(), None, &|_| Some(1.0)).expect("plans");
        let json = serde_json::to_value(JsonPlan::of(&plan)).expect("serializes");
        let changes = json["resource_changes"].as_array().expect("an array");
        let creates = changes
            .iter()
            .filter(|r| r["change"]["actions"] == serde_json::json!(["create"]))
            .count();
        assert_eq!(creates, 4);
        assert_eq!(json["gpuprov"]["add"], 4);
        let key = changes
            .iter()
            .find(|r| r["type"] == "shared")
            .expect("the key is a resource change");
        assert_eq!(key["address"], "shared.digitalocean.ssh_key");
        assert_eq!(key["name"], "digitalocean.ssh_key");
        assert_eq!(key["change"]["after_unknown"]["id"], true);
        assert_eq!(
            key["gpuprov"]["users"],
            serde_json::json!(["vm.a", "vm.b", "vm.c"])
        );

        let md = super::super::markdown::render(&plan);
        assert!(
            md.contains(
                "| `shared.digitalocean.ssh_key` | create once | digitalocean | ssh_key | – | used by vm.a, vm.b, vm.c |"
            ),
            "{md}"
        );
    }
}
