//! `plan`: compares desired (config) with recorded (state) and, with refresh, observed
//! (the clouds' view), and renders the difference with Terraform's symbols. Pure except
//! for [`refresh`], which asks the clouds.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use similar::{ChangeTag, TextDiff};

use crate::cluster::k3s::K3sState;
use crate::config::{Config, VmSpec};
use crate::machine::Providers;
use crate::provider::redact::redact_url;
use crate::provider::InstanceStatus;
use crate::record::{DecodeError, Record};
use crate::state::{ResourceRecord, StateFile};

pub mod discovery;
pub mod markdown;
use crate::vm::{LaunchState, Preemption, TeardownState};

/// Version of the saved plan file format (`plan -out FILE`).
pub const PLAN_FORMAT_VERSION: u32 = 1;

/// What apply will do to one machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    NoOp,
    Create,
    /// Change recorded settings only; the machine is untouched.
    Update,
    /// Destroy, then create.
    Replace,
    Destroy,
    /// Continue an apply or destroy that was interrupted.
    Resume,
}

impl Action {
    /// Terraform's symbol for the action.
    pub fn symbol(self) -> &'static str {
        match self {
            Action::NoOp => " ",
            Action::Create => "+",
            Action::Update | Action::Resume => "~",
            Action::Replace => "-/+",
            Action::Destroy => "-",
        }
    }
}

/// One attribute's change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AttrChange {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// Whether this change alone forces replacement.
    #[serde(default)]
    pub forces_replacement: bool,
}

/// The planned change of one machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    /// `vm.NAME`.
    pub address: String,
    pub vm: String,
    pub action: Action,
    /// Why, when it is not obvious from the attributes (drift, an interrupted run, a leak).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attributes: Vec<AttrChange>,
    /// The desired settings after apply (`None` when destroyed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired: Option<VmSpec>,
    /// The settings the state recorded when the machine was last applied (`None` for a
    /// machine the state does not have, or a record older than the snapshot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded: Option<VmSpec>,
    /// The price of what will run for this machine after apply, USD per hour, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_per_hour: Option<f64>,
    /// For a machine to be created: the matching offers, in the order apply tries them
    /// (clouds in preference order, each cloud's own order), from the catalog lookup.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub offers: Vec<OfferLine>,
    /// For a machine no cloud offers anything for: each cloud's reason, in the machine's
    /// order of clouds (planned only with `--allow-no-offers`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub no_offers: Vec<NoOffer>,
    /// The offer of the machine the state records as up now (where it runs, its price in
    /// USD per hour), `None` when nothing runs for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<OfferLine>,
    /// An instance of this lineage carrying the machine's identity that the state does not
    /// record (found by [`discovery`]): apply adopts it instead of creating one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub found: Option<discovery::FoundInstance>,
    /// The machine's recent spot preemptions (its record's, plus one refresh found):
    /// apply tries their (instance type, region) after every other offer, and `offers`
    /// is shown in that order ([`offer_lines`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preempted: Vec<Preemption>,
    /// Refresh found the recorded instance preempted: apply's launch machine deletes it
    /// itself when the cloud kept it stopped (no teardown first) and records the
    /// preemption.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preempted_now: bool,
}

impl Change {
    /// Whether apply needs an offer for this change: a machine is created (or
    /// replaced); one that is up, or resumed where it stopped, needs none.
    pub fn needs_offer(&self) -> bool {
        matches!(self.action, Action::Create | Action::Replace)
    }

    /// Whether a machine without offers only has to wait for one: it retries until up
    /// (`retry_until_up`, or `retry_all` for `apply --retry-until-up`) and every cloud's
    /// reason is a market condition (nothing in stock that matches, everything above the
    /// max price), not one that waiting cannot fix.
    pub fn waits_for_offers(&self, retry_all: bool) -> bool {
        let retries = retry_all || self.desired.as_ref().is_some_and(|d| d.retry_until_up);
        retries
            && self.no_offers.iter().all(|n| {
                matches!(
                    n.reason,
                    NoOfferReason::NoMatch | NoOfferReason::AboveMaxPrice
                )
            })
    }
}

/// Why one cloud of a machine has no offer for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NoOffer {
    pub cloud: String,
    pub reason: NoOfferReason,
    /// The cloud's own words (or the prices), without secrets.
    pub detail: String,
}

/// The kinds of reason a cloud has no offer for a machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NoOfferReason {
    /// Missing or rejected credentials.
    NoCredentials,
    /// The catalog could not be read (unreachable, an error answer).
    ApiError,
    /// Nothing in the catalog matches the ask (GPU, count, regions, …).
    NoMatch,
    /// Offers match, but every one costs more than `max_price_per_hour`.
    AboveMaxPrice,
    /// This build of gpuprov has no adapter for the cloud.
    NoAdapter,
}

impl NoOfferReason {
    /// A short lowercase phrase for tables.
    pub fn as_str(self) -> &'static str {
        match self {
            NoOfferReason::NoCredentials => "no credentials",
            NoOfferReason::ApiError => "API error",
            NoOfferReason::NoMatch => "nothing matches the ask",
            NoOfferReason::AboveMaxPrice => "everything above the max price",
            NoOfferReason::NoAdapter => "no adapter",
        }
    }
}

/// One offer as a plan shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct OfferLine {
    /// The offer id, for example `aws/us-east-1/p5.48xlarge`.
    pub id: String,
    pub instance_type: String,
    /// `cloud/region[/zone]`.
    pub location: String,
    /// USD per hour.
    pub price_per_hour: f64,
    #[serde(default)]
    pub spot: bool,
    /// The machine was preempted on this instance type in this region recently: apply
    /// tries it after every other offer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preempted: bool,
}

/// A machine's `offers` as the plan shows them, in the order apply tries them: the
/// preflight's order with every offer of a `preempted` (instance type, region) moved
/// last and marked (`provider::offers::demote_preempted`, as the launch machine's
/// Planning step does).
pub fn offer_lines(offers: &[crate::provider::Offer], preempted: &[Preemption]) -> Vec<OfferLine> {
    let scopes: Vec<_> = preempted.iter().map(Preemption::scope).collect();
    let mut offers = offers.to_vec();
    crate::provider::offers::demote_preempted(&mut offers, &scopes);
    offers
        .iter()
        .map(|o| OfferLine {
            preempted: scopes.iter().any(|s| s.covers(o)),
            ..OfferLine::from(o)
        })
        .collect()
}

impl From<&crate::provider::Offer> for OfferLine {
    fn from(o: &crate::provider::Offer) -> Self {
        OfferLine {
            id: o.id.clone(),
            instance_type: o.instance_type.clone(),
            location: o.location.to_string(),
            price_per_hour: o.price_per_hour,
            spot: o.spot,
            preempted: false,
        }
    }
}

/// How many offers a rendered plan lists per machine; the JSON plan has all of them.
const OFFERS_SHOWN: usize = 8;

/// A whole plan; also the saved plan file's content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub format_version: u32,
    pub gpuprov_version: String,
    /// The state this plan was made against: apply of a saved plan refuses when the
    /// state's lineage or serial moved on since.
    pub lineage: String,
    pub serial: u64,
    /// SHA-256 of the config text the plan was made from.
    pub config_sha256: String,
    pub refreshed: bool,
    /// Endpoint overrides in force, by cloud (credentials in URLs redacted).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub endpoints: BTreeMap<String, String>,
    pub changes: Vec<Change>,
    /// Sum of `price_per_hour` of what will run after apply, USD per hour.
    pub hourly_cost_after: f64,
    /// Whether some price of what will run is unknown (the sum is then a lower bound).
    pub hourly_cost_incomplete: bool,
    /// Live instances named like this config's machines under another lineage, found
    /// while the state records nothing (a lost or replaced state): never adopted, shown
    /// with how to recover them (see [`discovery`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub foreign: Vec<discovery::FoundInstance>,
    /// Locations discovery could not list (`location`, why).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unlisted: Vec<(String, String)>,
}

impl Plan {
    /// Whether apply would change anything.
    pub fn has_changes(&self) -> bool {
        self.changes.iter().any(|c| c.action != Action::NoOp)
    }

    /// After the offers are attached: a preempted machine to be created runs on its first
    /// offer once the preempted ones are moved last, so its price (and the total) is that
    /// offer's.
    pub fn reprice_preempted(&mut self) {
        for c in self.changes.iter_mut() {
            if c.needs_offer() && !c.preempted.is_empty() {
                if let Some(first) = c.offers.first() {
                    c.price_per_hour = Some(first.price_per_hour);
                }
            }
        }
        (self.hourly_cost_after, self.hourly_cost_incomplete) = cost_after(&self.changes);
    }

    /// What runs now costs, USD per hour: the sum of the machines' current offers.
    pub fn hourly_cost_before(&self) -> f64 {
        self.changes
            .iter()
            .filter_map(|c| c.current.as_ref())
            .fold(0.0, |sum, o| sum + o.price_per_hour)
    }

    /// `(add, change, destroy)` counts as Terraform's summary line counts them.
    pub fn counts(&self) -> (usize, usize, usize) {
        let (mut add, mut change, mut destroy) = (0, 0, 0);
        for c in &self.changes {
            match c.action {
                Action::Create => add += 1,
                Action::Update | Action::Resume => change += 1,
                Action::Replace => {
                    add += 1;
                    destroy += 1
                }
                Action::Destroy => destroy += 1,
                Action::NoOp => {}
            }
        }
        (add, change, destroy)
    }
}

/// The offer of the machine `rec` records as up (ready, or kept by an aborted apply).
fn current_offer(address: &str, rec: &ResourceRecord) -> Result<Option<OfferLine>, String> {
    Ok(match recorded(address, rec)? {
        Recorded::Launch(LaunchState::Ready { vm }) => Some(OfferLine::from(&vm.offer)),
        Recorded::Launch(LaunchState::Aborted { owned: Some(o), .. }) => {
            o.vm.as_ref().map(|vm| OfferLine::from(&vm.offer))
        }
        _ => None,
    })
}

/// What refresh observed of a machine that the state says is up.
#[derive(Debug, Clone, PartialEq)]
pub enum Observation {
    Running,
    /// Present but not running (stopped, failed, going away).
    NotRunning(InstanceStatus),
    Gone,
}

/// The machine state recorded for a resource, parsed. A k3s record is read through its
/// VM: up (in any k3s stage) reads as the launch's `Ready`, a VM that never came up as
/// the launch's end, and the k3s stages that still have work as [`Recorded::K3sPending`].
pub enum Recorded {
    Launch(LaunchState),
    Teardown(TeardownState),
    /// The VM is up but its cluster is not ready: `why` says where it stopped.
    K3sPending {
        why: String,
    },
}

/// Parses a resource's journalled machine state.
///
/// Errors: a message naming the address when the record is of an unknown kind or does not
/// parse (a hand-edited or inconsistent state file).
pub fn recorded(address: &str, r: &ResourceRecord) -> Result<Recorded, String> {
    let record = Record::decode(&r.machine.kind, &r.machine.state).map_err(|e| match e {
        DecodeError::UnknownKind(_) => format!("state record {address} has {e}"),
        DecodeError::Invalid { .. } => format!("state record {address} is {e}"),
    })?;
    Ok(match record {
        Record::Launch(s) => Recorded::Launch(s),
        Record::Teardown(s) => Recorded::Teardown(s),
        Record::K3s(k) => match k {
            K3sState::Vm { launch, .. } => Recorded::Launch(*launch),
            K3sState::Ready { vm, .. } => Recorded::Launch(LaunchState::Ready { vm }),
            K3sState::Failed {
                vm: None,
                launch: Some(l),
                ..
            } => Recorded::Launch(*l),
            K3sState::Failed {
                vm: None, reason, ..
            } => Recorded::Launch(LaunchState::Aborted {
                reason,
                owned: None,
            }),
            K3sState::Failed { stage, reason, .. } => Recorded::K3sPending {
                why: format!("k3s failed at {stage}: {reason}; apply resumes on the same VM"),
            },
            _ => Recorded::K3sPending {
                why: format!(
                    "an earlier apply was interrupted while {}; apply resumes it",
                    r.machine.label
                ),
            },
        },
    })
}

/// Asks the clouds about every machine the state says is up. Returns observations by
/// address; machines whose cloud has no adapter in this run are skipped.
///
/// Errors: the first cloud error, with the address it concerned.
pub async fn refresh(
    state: &StateFile,
    providers: &Providers,
) -> Result<BTreeMap<String, Observation>, String> {
    let mut out = BTreeMap::new();
    for (address, r) in &state.resources {
        let Some(vm) = crate::record::vm_of(&r.machine.kind, &r.machine.state) else {
            continue;
        };
        let Some(p) = providers.get(&vm.location.cloud) else {
            continue;
        };
        let name = address.strip_prefix("vm.").unwrap_or(address);
        let seen = p
            .observe(&vm.location, name)
            .await
            .map_err(|e| format!("cannot refresh {address} on {}: {}", vm.location, e.text()))?;
        // A preempted instance the cloud terminated does not exist, yet says why it is gone.
        let obs = match seen
            .iter()
            .find(|o| (o.exists() || o.status.is_preempted()) && o.instance_id == vm.instance_id)
        {
            Some(o) if o.status == InstanceStatus::Running => Observation::Running,
            Some(o) => Observation::NotRunning(o.status.clone()),
            None => Observation::Gone,
        };
        out.insert(address.clone(), obs);
    }
    Ok(out)
}

/// Computes the plan. `observed` is `None` without refresh. `offer_price` gives the
/// cheapest offer price (USD per hour) a new machine would get, when known.
pub fn compute(
    config: &Config,
    state: &StateFile,
    observed: Option<&BTreeMap<String, Observation>>,
    offer_price: &dyn Fn(&VmSpec) -> Option<f64>,
) -> Result<Plan, String> {
    let mut changes = Vec::new();
    for (name, want) in &config.vms {
        let address = format!("vm.{name}");
        let had: Option<VmSpec> = state
            .resources
            .get(&address)
            .and_then(|r| r.desired.clone())
            .and_then(|d| serde_json::from_value(d).ok());
        let change = |action, reason: Option<String>, attributes, price| Change {
            address: address.clone(),
            vm: name.clone(),
            action,
            reason,
            attributes,
            desired: Some(want.clone()),
            recorded: had.clone(),
            price_per_hour: price,
            offers: Vec::new(),
            no_offers: Vec::new(),
            current: None,
            found: None,
            preempted: Vec::new(),
            preempted_now: false,
        };
        let Some(rec) = state.resources.get(&address) else {
            changes.push(change(
                Action::Create,
                None,
                create_attrs(want),
                offer_price(want),
            ));
            continue;
        };
        let current = current_offer(&address, rec)?;
        let mut c = match recorded(&address, rec)? {
            Recorded::Launch(LaunchState::Ready { vm }) => {
                let price = Some(vm.offer.price_per_hour);
                match observed.and_then(|o| o.get(&address)) {
                    // Reclaimed by the cloud: created again (replaced when the cloud kept
                    // it stopped), other offers first; apply records the preemption.
                    Some(Observation::NotRunning(InstanceStatus::Preempted {
                        signal,
                        stopped,
                    })) => {
                        let mut c = change(
                            if *stopped {
                                Action::Replace
                            } else {
                                Action::Create
                            },
                            Some(format!(
                                "spot instance {} preempted at {} {} ({signal}); apply tries \
                                 other offers first{}",
                                vm.instance_id,
                                vm.location,
                                vm.offer.instance_type,
                                if *stopped {
                                    "; the stopped instance is deleted first"
                                } else {
                                    ""
                                }
                            )),
                            if *stopped { vec![] } else { create_attrs(want) },
                            offer_price(want),
                        );
                        c.preempted = Preemption::remember(
                            &vm.preemptions,
                            Preemption::of(vm.as_ref(), signal),
                        );
                        c.preempted_now = true;
                        c
                    }
                    Some(Observation::Gone) => change(
                        Action::Create,
                        Some(format!(
                            "instance {} no longer exists (deleted outside gpuprov)",
                            vm.instance_id
                        )),
                        create_attrs(want),
                        offer_price(want),
                    ),
                    // Restart before replace: a stopped (or starting) machine is started
                    // again with its disk, never deleted first.
                    Some(Observation::NotRunning(
                        st @ (InstanceStatus::Stopped
                        | InstanceStatus::Stopping
                        | InstanceStatus::Pending),
                    )) => change(
                        Action::Resume,
                        Some(format!(
                            "instance {} is {st:?}; apply starts it again (it is kept if it \
                             cannot be started)",
                            vm.instance_id
                        )),
                        vec![],
                        price,
                    ),
                    Some(Observation::NotRunning(st)) => change(
                        Action::Replace,
                        Some(format!(
                            "instance {} is {st:?}, not running",
                            vm.instance_id
                        )),
                        vec![],
                        offer_price(want),
                    ),
                    _ => {
                        let attrs = diff_attrs(had.as_ref(), want);
                        if attrs.iter().any(|a| a.forces_replacement) {
                            change(Action::Replace, None, attrs, offer_price(want))
                        } else if !attrs.is_empty() {
                            change(Action::Update, None, attrs, price)
                        } else {
                            change(Action::NoOp, None, vec![], price)
                        }
                    }
                }
            }
            // An instance exists that apply takes over or starts again: nothing is added.
            Recorded::Launch(LaunchState::Unowned { reason, .. }) => {
                change(Action::Resume, Some(reason), vec![], offer_price(want))
            }
            Recorded::Launch(LaunchState::Aborted {
                reason,
                owned: Some(o),
            }) if o.vm.is_some() => change(
                Action::Resume,
                Some(format!(
                    "the last apply aborted with the machine kept: {reason}"
                )),
                vec![],
                o.vm.as_ref().map(|vm| vm.offer.price_per_hour),
            ),
            Recorded::Launch(
                s @ (LaunchState::Aborted { .. }
                | LaunchState::Exhausted { .. }
                | LaunchState::Leaked { .. }),
            ) => {
                let why = match &s {
                    LaunchState::Leaked {
                        instance_ids,
                        location,
                        ..
                    } => format!(
                        "the last apply leaked {} at {location}; apply removes it first",
                        instance_ids.join(",")
                    ),
                    LaunchState::Aborted { reason, .. } => {
                        format!("the last apply aborted: {reason}")
                    }
                    _ => "the last apply found no capacity".into(),
                };
                change(
                    Action::Create,
                    Some(why),
                    create_attrs(want),
                    offer_price(want),
                )
            }
            Recorded::Launch(s) => change(
                Action::Resume,
                Some(format!(
                    "an earlier apply was interrupted while {}; apply resumes it",
                    label_of(&s)
                )),
                vec![],
                offer_price(want),
            ),
            Recorded::K3sPending { why } => {
                change(Action::Resume, Some(why), vec![], offer_price(want))
            }
            Recorded::Teardown(TeardownState::Done) => {
                change(Action::Create, None, create_attrs(want), offer_price(want))
            }
            Recorded::Teardown(_) => change(
                Action::Create,
                Some("an earlier destroy did not finish; apply completes it first".into()),
                create_attrs(want),
                offer_price(want),
            ),
        };
        c.current = current;
        if c.preempted.is_empty() {
            // Earlier preemptions still order the offers of a machine created again.
            if let Recorded::Launch(LaunchState::Ready { vm }) = recorded(&address, rec)? {
                if c.needs_offer() {
                    c.preempted = vm.preemptions.clone();
                }
            }
        }
        changes.push(c);
    }
    for (address, rec) in &state.resources {
        let name = address.strip_prefix("vm.").unwrap_or(address);
        if config.vms.contains_key(name) {
            continue;
        }
        let had: Option<VmSpec> = rec
            .desired
            .clone()
            .and_then(|d| serde_json::from_value(d).ok());
        let reason = match recorded(address, rec)? {
            Recorded::Launch(LaunchState::Ready { .. }) => None,
            Recorded::Launch(s) => Some(format!("recorded as: {}", label_of(&s))),
            Recorded::K3sPending { why } => Some(format!("recorded as: {why}")),
            Recorded::Teardown(_) => Some("an earlier destroy did not finish".into()),
        };
        changes.push(Change {
            address: address.clone(),
            vm: name.to_string(),
            action: Action::Destroy,
            reason,
            attributes: had.as_ref().map(destroy_attrs).unwrap_or_default(),
            desired: None,
            recorded: had,
            price_per_hour: None,
            offers: Vec::new(),
            no_offers: Vec::new(),
            current: current_offer(address, rec)?,
            found: None,
            preempted: Vec::new(),
            preempted_now: false,
        });
    }
    changes.sort_by(|a, b| a.address.cmp(&b.address));
    let (total, incomplete) = cost_after(&changes);
    let endpoints = config
        .clouds
        .iter()
        .filter_map(|(c, s)| s.endpoint.as_ref().map(|e| (c.to_string(), redact_url(e))))
        .collect();
    Ok(Plan {
        format_version: PLAN_FORMAT_VERSION,
        gpuprov_version: env!("CARGO_PKG_VERSION").into(),
        lineage: state.lineage.clone(),
        serial: state.serial,
        config_sha256: sha256_hex(config.source.as_bytes()),
        refreshed: observed.is_some(),
        endpoints,
        changes,
        hourly_cost_after: total,
        hourly_cost_incomplete: incomplete,
        foreign: Vec::new(),
        unlisted: Vec::new(),
    })
}

/// The hourly cost of what runs after apply (USD per hour), and whether a price is
/// unknown.
fn cost_after(changes: &[Change]) -> (f64, bool) {
    let (mut total, mut incomplete) = (0.0, false);
    for c in changes {
        if c.action != Action::Destroy {
            match c.price_per_hour {
                Some(p) => total += p,
                None => incomplete = true,
            }
        }
    }
    (total, incomplete)
}

fn label_of(s: &LaunchState) -> String {
    let v = serde_json::to_value(s).ok();
    v.and_then(|v| v.get("state").and_then(|s| s.as_str()).map(str::to_string))
        .unwrap_or_default()
}

fn attr_lines(v: &VmSpec) -> Vec<(String, String, bool)> {
    v.replace_attributes()
        .into_iter()
        .map(|(n, val)| (n.to_string(), val, true))
        .chain(
            v.in_place_attributes()
                .into_iter()
                .map(|(n, val)| (n.to_string(), val, false)),
        )
        .collect()
}

fn create_attrs(v: &VmSpec) -> Vec<AttrChange> {
    attr_lines(v)
        .into_iter()
        .map(|(name, val, _)| AttrChange {
            name,
            before: None,
            after: Some(val),
            forces_replacement: false,
        })
        .collect()
}

fn destroy_attrs(v: &VmSpec) -> Vec<AttrChange> {
    attr_lines(v)
        .into_iter()
        .map(|(name, val, _)| AttrChange {
            name,
            before: Some(val),
            after: None,
            forces_replacement: false,
        })
        .collect()
}

/// Attribute changes between what was applied and what is wanted, computed as a line diff
/// (`similar`) of the rendered attributes, so the order and pairing match what is shown.
fn diff_attrs(had: Option<&VmSpec>, want: &VmSpec) -> Vec<AttrChange> {
    let Some(had) = had else {
        // An old record without a snapshot: nothing to compare, assume unchanged.
        return vec![];
    };
    let render = |v: &VmSpec| {
        attr_lines(v)
            .into_iter()
            .map(|(n, val, _)| format!("{n} = {val}\n"))
            .collect::<String>()
    };
    let (before, after) = (render(had), render(want));
    let forcing: Vec<String> = want
        .replace_attributes()
        .into_iter()
        .map(|(n, _)| n.to_string())
        .collect();
    let diff = TextDiff::from_lines(&before, &after);
    let mut changes: BTreeMap<String, AttrChange> = BTreeMap::new();
    for ch in diff.iter_all_changes() {
        let line = ch.value().trim_end();
        let Some((name, val)) = line.split_once(" = ") else {
            continue;
        };
        let entry = changes
            .entry(name.to_string())
            .or_insert_with(|| AttrChange {
                name: name.to_string(),
                before: None,
                after: None,
                forces_replacement: forcing.iter().any(|f| f == name),
            });
        match ch.tag() {
            ChangeTag::Delete => entry.before = Some(val.to_string()),
            ChangeTag::Insert => entry.after = Some(val.to_string()),
            ChangeTag::Equal => {}
        }
    }
    let order: Vec<String> = attr_lines(want).into_iter().map(|(n, _, _)| n).collect();
    let mut out: Vec<AttrChange> = changes
        .into_values()
        .filter(|c| c.before != c.after)
        .collect();
    out.sort_by_key(|c| order.iter().position(|n| *n == c.name));
    out
}

/// Renders the plan for a terminal, Terraform-style.
pub fn render(plan: &Plan) -> String {
    let mut out = String::new();
    for (cloud, ep) in &plan.endpoints {
        let _ = writeln!(out, "Note: {cloud} API endpoint overridden: {ep}");
    }
    if !plan.endpoints.is_empty() {
        out.push('\n');
    }
    render_discovery(&mut out, plan);
    if !plan.has_changes() {
        out.push_str("No changes. Your machines match the configuration.\n");
        let _ = writeln!(out, "\n{}", cost_line(plan));
        return out;
    }
    out.push_str("gpuprov will perform the following actions:\n");
    for c in plan.changes.iter().filter(|c| c.action != Action::NoOp) {
        let verb = match c.action {
            Action::Create => "will be created",
            Action::Update => "will be updated in-place",
            Action::Replace => "must be replaced",
            Action::Destroy => "will be destroyed",
            Action::Resume if c.found.is_some() => "will be adopted (found by identity)",
            Action::Resume => "will be resumed",
            Action::NoOp => unreachable!("filtered"),
        };
        let _ = writeln!(out, "\n  # {} {verb}", c.address);
        if let Some(r) = &c.reason {
            let _ = writeln!(out, "  # ({r})");
        }
        if c.attributes.is_empty() && c.offers.is_empty() && c.no_offers.is_empty() {
            let _ = writeln!(out, "{:>3} vm \"{}\"", c.action.symbol(), c.vm);
            continue;
        }
        let _ = writeln!(out, "{:>3} vm \"{}\" {{", c.action.symbol(), c.vm);
        let width = c.attributes.iter().map(|a| a.name.len()).max().unwrap_or(0);
        for a in &c.attributes {
            let line = match (&a.before, &a.after) {
                (None, Some(v)) => format!("      + {:width$} = {v}", a.name),
                (Some(v), None) => format!("      - {:width$} = {v}", a.name),
                (Some(b), Some(v)) => format!(
                    "      ~ {:width$} = {b} -> {v}{}",
                    a.name,
                    if a.forces_replacement {
                        " # forces replacement"
                    } else {
                        ""
                    }
                ),
                (None, None) => continue,
            };
            let _ = writeln!(out, "{line}");
        }
        render_offers(&mut out, c);
        out.push_str("    }\n");
    }
    let (add, change, destroy) = plan.counts();
    let _ = writeln!(
        out,
        "\nPlan: {add} to add, {change} to change, {destroy} to destroy."
    );
    let _ = writeln!(out, "{}", cost_line(plan));
    out
}

/// What discovery found that the plan does not act on: another lineage's machines named
/// like this config's (a lost state), and the locations it could not look in.
fn render_discovery(out: &mut String, plan: &Plan) {
    for (at, why) in &plan.unlisted {
        let _ = writeln!(
            out,
            "Note: could not look for unrecorded machines at {at}: {why}"
        );
    }
    if !plan.unlisted.is_empty() {
        out.push('\n');
    }
    if plan.foreign.is_empty() {
        return;
    }
    let mut by_lineage: BTreeMap<&str, Vec<&discovery::FoundInstance>> = BTreeMap::new();
    for f in &plan.foreign {
        by_lineage.entry(&f.lineage).or_default().push(f);
    }
    out.push_str(
        "Warning: machines with this configuration's names are running under another state\n\n",
    );
    for (lineage, found) in &by_lineage {
        let _ = writeln!(out, "  lineage {lineage}:");
        for f in found {
            let _ = writeln!(
                out,
                "    vm.{}  {}  {}  {}{}",
                f.vm,
                f.location,
                f.instance_id,
                f.status,
                f.price_per_hour
                    .map(|p| format!("  ${p:.2}/h"))
                    .unwrap_or_default()
            );
        }
        let _ = writeln!(
            out,
            "    recover them with: gpuprov state recover --lineage {lineage}"
        );
    }
    out.push_str(
        "\n  This state records no machine: it may have been lost or replaced. Recovering\n  \
         gets those machines back; apply would create new ones beside them, and theirs keep\n  \
         billing until destroyed (`gpuprov sweep --destroy LINEAGE`).\n\n",
    );
}

/// The offers of a machine to be created, in the order apply tries them (or, when it
/// has none, each cloud's reason).
fn render_offers(out: &mut String, c: &Change) {
    if c.needs_offer() && !c.no_offers.is_empty() {
        out.push_str(if c.waits_for_offers(false) {
            "\n      # NO offers now: apply waits for one (retry_until_up):\n"
        } else {
            "\n      # NO offers: apply cannot create it (planned with --allow-no-offers):\n"
        });
        let width = c.no_offers.iter().map(|n| n.cloud.len()).max().unwrap_or(0);
        for n in &c.no_offers {
            let _ = writeln!(
                out,
                "      #   {:width$}  {}: {}",
                n.cloud,
                n.reason.as_str(),
                n.detail
            );
        }
    }
    if c.offers.is_empty() {
        return;
    }
    out.push_str("\n      # offers, in the order apply tries them:\n");
    let width = c
        .offers
        .iter()
        .take(OFFERS_SHOWN)
        .map(|o| o.id.len())
        .max()
        .unwrap_or(0);
    for (i, o) in c.offers.iter().take(OFFERS_SHOWN).enumerate() {
        let _ = writeln!(
            out,
            "      # {:>2}. {:width$}  ${:.2}/h{}{}",
            i + 1,
            o.id,
            o.price_per_hour,
            if o.spot { " (spot)" } else { "" },
            if o.preempted {
                "  (preempted here recently: moved last)"
            } else {
                ""
            }
        );
    }
    if c.offers.len() > OFFERS_SHOWN {
        let _ = writeln!(
            out,
            "      #     … and {} more (see --json)",
            c.offers.len() - OFFERS_SHOWN
        );
    }
}

fn cost_line(plan: &Plan) -> String {
    format!(
        "Hourly cost of what will run: ${:.2}/h{}",
        plan.hourly_cost_after,
        if plan.hourly_cost_incomplete {
            " (some prices unknown; lower bound)"
        } else {
            ""
        }
    )
}

/// Hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
