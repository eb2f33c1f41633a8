//! `plan`: compares desired (config) with recorded (state) and, with refresh, observed
//! (the clouds' view) into the changes a run makes; the CLI renders them
//! (`crate::cli::view`). Pure except for [`refresh`], which asks the clouds.

use std::collections::{BTreeMap, BTreeSet};

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
pub mod read_ahead;
use crate::vm::{LaunchState, Preemption, TeardownState};
pub use read_ahead::ReadAhead;

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
    /// Where what will really happen differs from what the config says, by attribute
    /// (for example `kubernetes`: skipped on a cloud that cannot host k3s), with why.
    /// Shown beside the attribute; the desired snapshot keeps the config's value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub effective: BTreeMap<String, Effective>,
}

/// An attribute's effective value where it differs from the config's (or may, depending
/// on where the machine is placed), and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Effective {
    /// The value that takes effect, rendered as the plan renders attributes.
    pub value: String,
    /// Why, in a few words (for example "docker cannot host k3s").
    pub why: String,
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
    /// The state's records this plan moves (`[[moved]]` blocks), applied by apply before
    /// any change.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moved: Vec<MovedLine>,
    /// The `-target` addresses this plan was restricted to (empty: not targeted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<String>,
    /// Live instances named like this config's machines under another lineage, found
    /// while the state records nothing (a lost or replaced state): never adopted, shown
    /// with how to recover them (see [`discovery`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub foreign: Vec<discovery::FoundInstance>,
    /// Locations discovery could not list (`location`, why).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unlisted: Vec<(String, String)>,
    /// The shared objects the changes create or release ([`shared_changes`]), once each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared: Vec<SharedChange>,
    /// Clouds whose shared objects outlive their last machine (`[cloud.NAME]
    /// keep_shared = true`): their releases are planned as kept (no-op).
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub kept_shared: std::collections::BTreeSet<String>,
}

/// What apply does to one shared object (an SSH key per cloud account, an environment
/// per region: [`crate::provider::shared`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedChange {
    /// For example `shared.digitalocean.ssh_key` or `shared.hyperstack.environment[CANADA-1]`
    /// (a region-scoped object, one per region the machines name). `[*]` stands for the
    /// regions of machines that name none, or that name several clouds (the plan cannot
    /// tell which cloud has which region): their region is chosen at launch (with
    /// failover), so the plan cannot name it; such a change is always listed as a create
    /// (apply finds or creates the object of the region each launch lands in, once per
    /// region) and counted once.
    pub address: String,
    /// `Create` (found or created once, before the first machine that needs it),
    /// `Destroy` (released after the last machine using it; one gpuprov did not make is
    /// kept), or `NoOp` (no machine uses it any more, but its cloud is set to
    /// `keep_shared`: kept at the cloud and in the state).
    pub action: Action,
    /// The machines (`vm.NAME`) that use it.
    pub users: Vec<String>,
}

impl SharedChange {
    /// The machines using it, for one line: the first three, then a count (a fleet of
    /// 500 would make a 5,000-character line).
    pub fn users_text(&self) -> String {
        match self.users.len() {
            0..=3 => self.users.join(", "),
            n => format!("{} and {} more", self.users[..3].join(", "), n - 3),
        }
    }

    /// The cloud and the kind of the object, from its address
    /// (`shared.<cloud>.<kind>[<region>]`).
    pub fn cloud_and_kind(&self) -> (&str, &str) {
        let rest = self
            .address
            .strip_prefix(crate::provider::shared::PREFIX)
            .unwrap_or(&self.address);
        let rest = rest.split('[').next().unwrap_or(rest);
        rest.split_once('.').unwrap_or((rest, ""))
    }
}

/// The shared objects `planned` needs that the state has no record of (created once,
/// before the first machine launching), and the recorded ones that no machine keeps
/// using (released after the last one is gone). `untouched`: changes a `-target` left
/// out; their machines still use what they use. `kept`: clouds set to `keep_shared`,
/// whose unused objects are shown as kept (`NoOp`) instead of released.
pub fn shared_changes(
    planned: &[Change],
    untouched: &[Change],
    state: &StateFile,
    kept: &std::collections::BTreeSet<String>,
) -> Vec<SharedChange> {
    let mut users: BTreeMap<String, (bool, Vec<String>)> = BTreeMap::new();
    let planned_users = planned.iter().map(|c| (c, true));
    let other_users = untouched.iter().map(|c| (c, false));
    for (c, in_plan) in planned_users.chain(other_users) {
        if c.action == Action::Destroy {
            continue;
        }
        let Some(want) = &c.desired else { continue };
        let launches =
            in_plan && matches!(c.action, Action::Create | Action::Replace | Action::Resume);
        for a in crate::graph::shared_addresses(want) {
            let e = users.entry(a).or_default();
            e.0 |= launches;
            if in_plan {
                e.1.push(c.address.clone());
            }
        }
    }
    let mut out: Vec<SharedChange> = users
        .iter()
        .filter(|(a, (launches, _))| *launches && !state.shared.contains_key(*a))
        .map(|(a, (_, u))| SharedChange {
            address: a.clone(),
            action: Action::Create,
            users: u.clone(),
        })
        .collect();
    // `shared.c.k[*]` stands for every region of that kind.
    let used = |address: &str| {
        users.keys().any(|k| {
            k == address
                || k.strip_suffix("[*]")
                    .is_some_and(|stem| address.starts_with(&format!("{stem}[")))
        })
    };
    let destroys = planned.iter().any(|c| c.action == Action::Destroy);
    for address in state.shared.keys() {
        if destroys && !used(address) {
            let mut change = SharedChange {
                address: address.clone(),
                action: Action::Destroy,
                users: Vec::new(),
            };
            if kept.contains(change.cloud_and_kind().0) {
                change.action = Action::NoOp;
            }
            out.push(change);
        }
    }
    // In the order apply acts: a cloud's kinds as declared when created (an environment
    // before its key pair), the other way round when released.
    let rank = |c: &SharedChange| {
        let o = crate::provider::SharedObject::parse(&c.address);
        let (cloud, position) = o
            .map(|o| (o.cloud.clone(), o.position()))
            .unwrap_or_default();
        let position = match c.action {
            Action::Destroy => usize::MAX - position,
            _ => position,
        };
        (
            c.action == Action::Destroy,
            cloud,
            position,
            c.address.clone(),
        )
    };
    out.sort_by_key(rank);
    out
}

/// One record a plan moves: `from` → `to` (both `vm.NAME`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MovedLine {
    pub from: String,
    pub to: String,
}

impl Plan {
    /// Whether apply would change anything (a moved record counts: apply saves it).
    pub fn has_changes(&self) -> bool {
        !self.moved.is_empty() || self.changes.iter().any(|c| c.action != Action::NoOp)
    }

    /// Recomputes [`Plan::hourly_cost_after`] from the changes (after targeting or
    /// `-replace` changed them); `untouched` is what keeps running outside the plan.
    fn recompute_cost(&mut self, untouched: &[Change]) {
        let (mut total, mut incomplete) = cost_of(&self.changes);
        for c in untouched.iter().filter(|c| c.action != Action::Create) {
            if let Some(o) = &c.current {
                total += o.price_per_hour;
            } else if c.action != Action::Destroy {
                incomplete = true;
            }
        }
        self.hourly_cost_after = total;
        self.hourly_cost_incomplete = incomplete;
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
        (self.hourly_cost_after, self.hourly_cost_incomplete) = cost_of(&self.changes);
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
        for s in &self.shared {
            match s.action {
                Action::Create => add += 1,
                Action::Destroy => destroy += 1,
                _ => {}
            }
        }
        (add, change, destroy)
    }
}

/// The offer of the machine `rec` records as up (ready, or kept by an aborted apply).
/// Takes the record already decoded: decoding records is most of a plan's cost.
fn offer_of(recorded: &Recorded) -> Option<OfferLine> {
    match recorded {
        Recorded::Launch(LaunchState::Ready { vm }) => Some(OfferLine::from(&vm.offer)),
        Recorded::Launch(LaunchState::Aborted { owned: Some(o), .. }) => {
            o.vm.as_ref().map(|vm| OfferLine::from(&vm.offer))
        }
        _ => None,
    }
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
    let record = r.machine.decode().map_err(|e| match e {
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
        let Some(vm) = r.machine.vm() else {
            continue;
        };
        let Some(p) = providers.get(&vm.location.cloud) else {
            continue;
        };
        let name = r.identity_name(address);
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
///
/// Errors: a message naming the address of the first record that does not decode (the
/// config's machines first, then those it no longer has).
pub fn compute(
    config: &Config,
    state: &StateFile,
    observed: Option<&BTreeMap<String, Observation>>,
    offer_price: &dyn Fn(&VmSpec) -> Option<f64>,
) -> Result<Plan, String> {
    compute_with(
        config,
        state,
        &ReadAhead::of(state, 1),
        observed,
        offer_price,
    )
}

/// [`compute`] on records already decoded: `ahead` must be [`ReadAhead::of`] `state`.
/// The decoded records are only read, so a caller about to exit need not free them.
pub fn compute_with(
    config: &Config,
    state: &StateFile,
    ahead: &ReadAhead<'_>,
    observed: Option<&BTreeMap<String, Observation>>,
    offer_price: &dyn Fn(&VmSpec) -> Option<f64>,
) -> Result<Plan, String> {
    let mut changes = Vec::new();
    for (name, want) in &config.vms {
        let address = format!("vm.{name}");
        let decoded = ahead.get(&address);
        let had = decoded.and_then(|d| d.had.as_ref());
        let change = |action, reason: Option<String>, attributes, price| Change {
            address: address.clone(),
            vm: name.clone(),
            action,
            reason,
            attributes,
            desired: Some(want.clone()),
            recorded: had.cloned(),
            price_per_hour: price,
            offers: Vec::new(),
            no_offers: Vec::new(),
            current: None,
            found: None,
            preempted: Vec::new(),
            preempted_now: false,
            effective: BTreeMap::new(),
        };
        let Some(decoded) = decoded else {
            changes.push(change(
                Action::Create,
                None,
                create_attrs(want),
                offer_price(want),
            ));
            continue;
        };
        let was = decoded.was.as_ref().map_err(String::clone)?;
        let current = offer_of(was);
        // Earlier preemptions still order the offers of a machine created again.
        let earlier_preemptions = match was {
            Recorded::Launch(LaunchState::Ready { vm }) => vm.preemptions.clone(),
            _ => Vec::new(),
        };
        let mut c = match was {
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
                            "instance {} is {st}; apply starts it again (it is kept if it \
                             cannot be started)",
                            vm.instance_id
                        )),
                        vec![],
                        price,
                    ),
                    Some(Observation::NotRunning(st)) => change(
                        Action::Replace,
                        Some(format!("instance {} is {st}, not running", vm.instance_id)),
                        vec![],
                        offer_price(want),
                    ),
                    _ => {
                        let attrs = diff_attrs(had, want);
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
            Recorded::Launch(LaunchState::Unowned { reason, .. }) => change(
                Action::Resume,
                Some(reason.clone()),
                vec![],
                offer_price(want),
            ),
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
                    label_of(s)
                )),
                vec![],
                offer_price(want),
            ),
            Recorded::K3sPending { why } => {
                change(Action::Resume, Some(why.clone()), vec![], offer_price(want))
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
        if c.preempted.is_empty() && c.needs_offer() {
            c.preempted = earlier_preemptions;
        }
        changes.push(c);
    }
    for (address, d) in &ahead.by_address {
        let name = address.strip_prefix("vm.").unwrap_or(address);
        if config.vms.contains_key(name) {
            continue;
        }
        let (had, was) = (d.had.as_ref(), d.was.as_ref().map_err(String::clone)?);
        let current = offer_of(was);
        let reason = match was {
            Recorded::Launch(LaunchState::Ready { .. }) => None,
            Recorded::Launch(s) => Some(format!("recorded as: {}", label_of(s))),
            Recorded::K3sPending { why } => Some(format!("recorded as: {why}")),
            Recorded::Teardown(_) => Some("an earlier destroy did not finish".into()),
        };
        changes.push(Change {
            address: address.to_string(),
            vm: name.to_string(),
            action: Action::Destroy,
            reason,
            attributes: had.map(destroy_attrs).unwrap_or_default(),
            desired: None,
            recorded: had.cloned(),
            price_per_hour: None,
            offers: Vec::new(),
            no_offers: Vec::new(),
            current,
            found: None,
            preempted: Vec::new(),
            preempted_now: false,
            effective: BTreeMap::new(),
        });
    }
    changes.sort_by(|a, b| a.address.cmp(&b.address));
    let (total, incomplete) = cost_of(&changes);
    let kept_shared: std::collections::BTreeSet<String> = config
        .clouds
        .present()
        .filter(|c| config.clouds.common(*c).keep_shared)
        .map(|c| c.to_string())
        .collect();
    let shared = shared_changes(&changes, &[], state, &kept_shared);
    let endpoints = config
        .clouds
        .present()
        .filter_map(|c| {
            let endpoint = config.clouds.common(c).endpoint?;
            Some((c.to_string(), redact_url(endpoint)))
        })
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
        moved: Vec::new(),
        targets: Vec::new(),
        foreign: Vec::new(),
        unlisted: Vec::new(),
        shared,
        kept_shared,
    })
}

/// The hourly cost (USD) of what runs after `changes`, and whether a price is unknown.
fn cost_of(changes: &[Change]) -> (f64, bool) {
    let (mut total, mut incomplete) = (0.0, false);
    for c in changes.iter().filter(|c| c.action != Action::Destroy) {
        match c.price_per_hour {
            Some(p) => total += p,
            None => incomplete = true,
        }
    }
    (total, incomplete)
}

/// Why a record cannot be moved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoveError {
    #[error("{0} is not in the state")]
    SourceMissing(String),
    #[error("{0} is already in the state")]
    DestinationExists(String),
}

/// Moves the record at `from` to `to` (both `vm.NAME`), keeping the machine: the record
/// remembers the name its cloud objects carry ([`ResourceRecord::cloud_name`]), which
/// stays the first name until the machine is destroyed or replaced (clouds mostly cannot
/// relabel). Moving back to that name clears it. Nothing changes on error.
pub fn move_record(state: &mut StateFile, from: &str, to: &str) -> Result<(), MoveError> {
    // The source first: a moved block whose `from` is gone was applied already.
    if !state.resources.contains_key(from) {
        return Err(MoveError::SourceMissing(from.into()));
    }
    if state.resources.contains_key(to) {
        return Err(MoveError::DestinationExists(to.into()));
    }
    let Some(mut rec) = state.resources.remove(from) else {
        return Err(MoveError::SourceMissing(from.into()));
    };
    let identity = rec.identity_name(from).to_string();
    let to_name = to.strip_prefix("vm.").unwrap_or(to);
    rec.cloud_name = (identity != to_name).then_some(identity);
    rec.push_event(format!("moved from {from} to {to}"));
    state.resources.insert(to.into(), rec);
    Ok(())
}

/// Applies the config's `[[moved]]` blocks to `state` (in memory), Terraform's way: a
/// block whose `from` is not in the state is ignored. Returns the moves made.
///
/// Errors: a diagnostic at the block when both `from` and `to` are in the state.
pub fn apply_moved(
    config: &Config,
    state: &mut StateFile,
) -> Result<Vec<MovedLine>, Box<crate::config::ConfigError>> {
    let mut out = Vec::new();
    for m in &config.moved {
        match move_record(state, &m.from, &m.to) {
            Ok(()) => out.push(MovedLine {
                from: m.from.clone(),
                to: m.to.clone(),
            }),
            Err(MoveError::SourceMissing(_)) => {}
            Err(MoveError::DestinationExists(_)) => {
                return Err(Box::new(config.error_at(
                    m.to_span.clone(),
                    "already in the state",
                    format!(
                        "moved: cannot move {} to {}: both are in the state",
                        m.from, m.to
                    ),
                    Some(format!(
                        "the state records a machine at each address; destroy one (`gpuprov destroy -target {}`) or forget it (`gpuprov state rm`), or drop this moved block",
                        m.from
                    )),
                )))
            }
        }
    }
    Ok(out)
}

/// Refuses a plan that would start a machine under a name another record's machine
/// still carries in the cloud (moved away from it, see [`move_record`]): both would
/// answer to the same identity, and the new one's launch would find the other machine.
///
/// Errors: the address, the holder and what to do, for the first clash.
pub fn check_identity_clash(plan: &Plan, state: &StateFile) -> Result<(), String> {
    for c in &plan.changes {
        // A replacement goes with its record, so the new machine carries the address's
        // name; a create over a kept record keeps the record's name.
        let name = match (c.action, state.resources.get(&c.address)) {
            (Action::Create, Some(r)) => r.identity_name(&c.address).to_string(),
            (Action::Create | Action::Replace, _) => c.vm.clone(),
            _ => continue,
        };
        let holder = state
            .resources
            .iter()
            .find(|(a, r)| *a != &c.address && r.identity_name(a) == name);
        if let Some((holder, _)) = holder {
            return Err(format!(
                "{} cannot be created yet: the machine of {holder} still carries the name {name} in the cloud (it was moved from vm.{name}); replace {holder} first (`gpuprov apply -replace {holder}`, which gives it its own name), or give {} another name",
                c.address, c.address
            ));
        }
    }
    Ok(())
}

/// The applied `depends_on` of the record at `address`, as addresses.
fn recorded_depends_on(state: &StateFile, address: &str) -> Vec<String> {
    state
        .resources
        .get(address)
        .and_then(|r| r.desired.as_ref())
        .and_then(|d| d.decode::<VmSpec>().ok())
        .map(|v| v.depends_on.iter().map(|n| format!("vm.{n}")).collect())
        .unwrap_or_default()
}

/// `start` and everything reachable from it along `next`.
fn closure(start: &[String], next: impl Fn(&str) -> Vec<String>) -> BTreeSet<String> {
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut todo: Vec<String> = start.to_vec();
    while let Some(a) = todo.pop() {
        if seen.insert(a.clone()) {
            todo.extend(next(&a));
        }
    }
    seen
}

/// What `destroy -target` destroys: the targets and, transitively, every machine of the
/// state whose applied `depends_on` names one of them (a dependent goes first).
pub fn destroy_targets(state: &StateFile, targets: &[String]) -> BTreeSet<String> {
    closure(targets, |a| {
        state
            .resources
            .keys()
            .filter(|other| recorded_depends_on(state, other).iter().any(|d| d == a))
            .cloned()
            .collect()
    })
}

/// What `-target` keeps of a plan: each target, the machines a created or changed one
/// `depends_on` (transitively, from the config), and for a destroyed one the machines of
/// the state that depend on it.
pub fn target_closure(plan: &Plan, state: &StateFile, targets: &[String]) -> BTreeSet<String> {
    let by_address: BTreeMap<&str, &Change> = plan
        .changes
        .iter()
        .map(|c| (c.address.as_str(), c))
        .collect();
    closure(targets, |a| match by_address.get(a) {
        Some(c) if c.action == Action::Destroy => destroy_targets(state, &[a.to_string()])
            .into_iter()
            .filter(|d| d != a)
            .collect(),
        Some(c) => c
            .desired
            .as_ref()
            .map(|d| d.depends_on.iter().map(|n| format!("vm.{n}")).collect())
            .unwrap_or_default(),
        None => Vec::new(),
    })
}

/// Restricts `plan` to [`target_closure`] of `targets` (Terraform's `-target`): the
/// other changes are dropped, so apply (and a saved plan) touches nothing else; the
/// hourly cost counts the untouched machines at what they cost now.
pub fn restrict_to_targets(plan: &mut Plan, state: &StateFile, targets: &[String]) {
    let keep = target_closure(plan, state, targets);
    let (kept, dropped): (Vec<Change>, Vec<Change>) = std::mem::take(&mut plan.changes)
        .into_iter()
        .partition(|c| keep.contains(&c.address));
    plan.changes = kept;
    plan.targets = targets.to_vec();
    plan.recompute_cost(&dropped);
    plan.shared = shared_changes(&plan.changes, &dropped, state, &plan.kept_shared);
}

/// The reason of a replacement `-replace` asked for.
pub const REPLACE_BY_REQUEST: &str = "replacement requested with -replace";

/// Plans each of `addresses` as [`Action::Replace`] even when unchanged (Terraform's
/// `-replace`); `offer_price` gives the price of the new machine, as in [`compute`].
///
/// Errors: an address the config does not have (it would be destroyed, not replaced) or
/// the state does not have (nothing to replace).
pub fn force_replace(
    plan: &mut Plan,
    state: &StateFile,
    addresses: &[String],
    offer_price: &dyn Fn(&VmSpec) -> Option<f64>,
) -> Result<(), String> {
    for address in addresses {
        let Some(c) = plan.changes.iter_mut().find(|c| &c.address == address) else {
            return Err(format!(
                "-replace {address}: no such machine in the config or the state"
            ));
        };
        if c.action == Action::Destroy {
            return Err(format!(
                "-replace {address}: it is not in the config, so it would be destroyed, not replaced"
            ));
        }
        if !state.resources.contains_key(address) {
            return Err(format!(
                "-replace {address}: it is not in the state yet, so there is nothing to replace (apply creates it)"
            ));
        }
        if matches!(c.action, Action::NoOp | Action::Update | Action::Resume) {
            c.action = Action::Replace;
            c.reason = Some(REPLACE_BY_REQUEST.into());
            c.price_per_hour = c.desired.as_ref().and_then(offer_price);
        }
    }
    plan.recompute_cost(&[]);
    Ok(())
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
    // The common case of a plan: nothing differs, and nothing needs rendering.
    if had.same_attributes(want) {
        return vec![];
    }
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

/// Hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const FOUR: &str = "[defaults]\nclouds = [\"docker\"]\n\n[vm.db]\n\n[vm.app]\ndepends_on = [\"db\"]\n\n[vm.web]\ndepends_on = [\"app\"]\n\n[vm.other]\n";

    fn config(text: &str) -> Config {
        Config::parse(Path::new("t.toml"), text.into()).expect("valid config")
    }

    /// A record of a launch in progress, applied with `desired`.
    fn record(desired: &VmSpec) -> ResourceRecord {
        let mut r = ResourceRecord::new(crate::state::MachineRecord {
            kind: crate::record::LAUNCH.into(),
            state: crate::state::JsonText::encode(&LaunchState::start(None)).expect("serializes"),
            label: "planning".into(),
            updated_at: chrono::Utc::now(),
        });
        r.desired = Some(crate::state::JsonText::encode(desired).expect("serializes"));
        r
    }

    fn recorded_all(c: &Config) -> StateFile {
        let mut s = StateFile::new();
        for (name, vm) in &c.vms {
            s.resources.insert(format!("vm.{name}"), record(vm));
        }
        s
    }

    /// Three DigitalOcean machines share one project key: the plan creates it once and
    /// counts it once; the graph has one node for it, feeding every machine's prepare;
    /// destroying every machine releases it.
    #[test]
    fn shared_objects_are_planned_and_drawn_once() {
        let c = config(
            "[defaults]\nclouds = [\"digitalocean\"]\nregions = [\"tor1\"]\n\n[vm.a]\n\n[vm.b]\n\n[vm.c]\n",
        );
        let mut p = compute(&c, &StateFile::new(), None, &|_| Some(1.0)).expect("plans");
        p.gpuprov_version = "TEST".into();
        assert_eq!(p.shared.len(), 1);
        assert_eq!(p.counts(), (4, 0, 0), "three machines and one key");
        insta::assert_snapshot!("plan_with_shared_key", crate::cli::view::text::render(&p));
        insta::assert_snapshot!(
            "graph_with_shared_key",
            crate::graph::ResourceGraph::build(&c.vms).to_dot()
        );

        // Recorded: nothing to create. Gone from the config: released.
        let mut st = recorded_all(&c);
        st.shared
            .insert("shared.digitalocean.ssh_key".into(), record(&c.vms["a"]));
        let p = compute(&c, &st, None, &|_| Some(1.0)).expect("plans");
        assert!(p.shared.is_empty());
        let elsewhere = config("[defaults]\nclouds = [\"docker\"]\n\n[vm.z]\n");
        let p = compute(&elsewhere, &st, None, &|_| Some(1.0)).expect("plans");
        assert_eq!(p.shared.len(), 1);
        assert_eq!(p.shared[0].action, Action::Destroy);
        assert_eq!(
            p.counts(),
            (1, 0, 4),
            "z added; a, b, c and the key destroyed"
        );
    }

    /// `keep_shared = true`: the unused key is planned as kept, not released, and counted
    /// in nothing; the other cloud's setting does not matter.
    #[test]
    fn a_kept_shared_object_outlives_its_last_machine_in_the_plan() {
        let c = config("[defaults]\nclouds = [\"digitalocean\"]\n\n[vm.a]\n");
        let mut st = recorded_all(&c);
        st.shared
            .insert("shared.digitalocean.ssh_key".into(), record(&c.vms["a"]));
        let keep = |cloud: &str| {
            config(&format!(
                "[defaults]\nclouds = [\"docker\"]\n\n[cloud.{cloud}]\nkeep_shared = true\n\n[vm.z]\n"
            ))
        };
        let mut p = compute(&keep("digitalocean"), &st, None, &|_| Some(1.0)).expect("plans");
        assert_eq!(p.shared.len(), 1);
        assert_eq!(p.shared[0].action, Action::NoOp);
        assert_eq!(p.counts(), (1, 0, 1), "z added; a destroyed; the key kept");
        p.gpuprov_version = "TEST".into();
        let text = crate::cli::view::text::render(&p);
        assert!(
            text.contains("shared.digitalocean.ssh_key is kept"),
            "{text}"
        );
        assert!(!text.contains("- shared.digitalocean.ssh_key"), "{text}");
        // A plan restricted with -target keeps the setting.
        let mut targeted = p.clone();
        restrict_to_targets(&mut targeted, &st, &["vm.a".into()]);
        assert_eq!(targeted.shared[0].action, Action::NoOp);

        let p = compute(&keep("lambda"), &st, None, &|_| Some(1.0)).expect("plans");
        assert_eq!(p.shared[0].action, Action::Destroy);
    }

    /// Hyperstack's environment and key pair are per region: one of each per region the
    /// machines name, the environment first, the key pair fed by it; a machine naming no
    /// region or several shows `[*]` (its region is chosen at launch, so one per region
    /// would overcount). Released key pair first.
    #[test]
    fn regional_shared_objects_are_planned_per_region() {
        let c = config(
            "[defaults]\nclouds = [\"hyperstack\"]\n\n[vm.a]\nregions = [\"CANADA-1\"]\n\n\
             [vm.b]\nregions = [\"CANADA-1\", \"NORWAY-1\"]\n\n[vm.c]\n",
        );
        let mut p = compute(&c, &StateFile::new(), None, &|_| Some(1.0)).expect("plans");
        p.gpuprov_version = "TEST".into();
        let addresses: Vec<&str> = p.shared.iter().map(|s| s.address.as_str()).collect();
        assert_eq!(
            addresses,
            [
                "shared.hyperstack.environment[*]",
                "shared.hyperstack.environment[CANADA-1]",
                "shared.hyperstack.ssh_key[*]",
                "shared.hyperstack.ssh_key[CANADA-1]",
            ]
        );
        insta::assert_snapshot!(
            "plan_with_regional_shared_objects",
            crate::cli::view::text::render(&p)
        );
        let dot = crate::graph::ResourceGraph::build(&c.vms).to_dot();
        assert!(dot.contains(
            "\"shared.hyperstack.environment[CANADA-1]\" -> \"shared.hyperstack.ssh_key[CANADA-1]\""
        ));
        assert!(!dot.contains(
            "\"shared.hyperstack.environment[CANADA-1]\" -> \"shared.hyperstack.ssh_key[NORWAY-1]\""
        ));
        insta::assert_snapshot!("graph_with_regional_shared_objects", dot);
        // Several clouds share the regions list: which is Hyperstack's is known at launch.
        let multi = config(
            "[defaults]\nclouds = [\"hyperstack\", \"runpod\"]\nregions = [\"CANADA-1\", \"EU-RO-1\"]\n\n[vm.m]\n",
        );
        assert_eq!(
            crate::graph::shared_addresses(&multi.vms["m"]),
            [
                "shared.hyperstack.environment[*]",
                "shared.hyperstack.ssh_key[*]",
                "shared.runpod.ssh_key",
            ]
        );

        // Recorded, then every machine gone: released key pairs first.
        let mut st = recorded_all(&c);
        for a in [
            "shared.hyperstack.environment[CANADA-1]",
            "shared.hyperstack.ssh_key[CANADA-1]",
        ] {
            st.shared.insert(a.into(), record(&c.vms["a"]));
        }
        let elsewhere = config("[defaults]\nclouds = [\"docker\"]\n\n[vm.z]\n");
        let p = compute(&elsewhere, &st, None, &|_| Some(1.0)).expect("plans");
        let released: Vec<&str> = p.shared.iter().map(|s| s.address.as_str()).collect();
        assert_eq!(
            released,
            [
                "shared.hyperstack.ssh_key[CANADA-1]",
                "shared.hyperstack.environment[CANADA-1]",
            ]
        );
    }

    fn list(s: BTreeSet<String>) -> Vec<String> {
        s.into_iter().collect()
    }

    fn t(a: &str) -> Vec<String> {
        vec![a.to_string()]
    }

    #[test]
    fn a_target_brings_what_it_depends_on_transitively() {
        let c = config(FOUR);
        let state = StateFile::new();
        let plan = compute(&c, &state, None, &|_| None).expect("plans");
        assert_eq!(
            list(target_closure(&plan, &state, &t("vm.web"))),
            ["vm.app", "vm.db", "vm.web"]
        );
        assert_eq!(list(target_closure(&plan, &state, &t("vm.db"))), ["vm.db"]);
    }

    #[test]
    fn a_destroyed_target_brings_what_depends_on_it() {
        let all = recorded_all(&config(FOUR));
        assert_eq!(
            list(destroy_targets(&all, &t("vm.db"))),
            ["vm.app", "vm.db", "vm.web"]
        );
        assert_eq!(list(destroy_targets(&all, &t("vm.web"))), ["vm.web"]);
        // In a plan: the machines left the config, so they are destroyed.
        let only_other = config("[vm.other]\nclouds = [\"docker\"]\n");
        let plan = compute(&only_other, &all, None, &|_| None).expect("plans");
        assert_eq!(
            list(target_closure(&plan, &all, &t("vm.app"))),
            ["vm.app", "vm.web"]
        );
    }

    #[test]
    fn targeting_drops_the_other_changes_and_recounts_the_cost() {
        let c = config(FOUR);
        let state = StateFile::new();
        let mut plan = compute(&c, &state, None, &|_| Some(1.5)).expect("plans");
        assert_eq!(plan.hourly_cost_after, 6.0);
        restrict_to_targets(&mut plan, &state, &t("vm.app"));
        let kept: Vec<&str> = plan.changes.iter().map(|c| c.address.as_str()).collect();
        assert_eq!(kept, ["vm.app", "vm.db"]);
        assert_eq!(plan.targets, ["vm.app"]);
        assert_eq!(plan.hourly_cost_after, 3.0);
        assert_eq!(plan.counts(), (2, 0, 0));
    }

    #[test]
    fn a_moved_record_remembers_the_name_its_cloud_objects_carry() {
        let c = config(FOUR);
        let mut s = StateFile::new();
        s.resources.insert("vm.a".into(), record(&c.vms["db"]));
        move_record(&mut s, "vm.a", "vm.b").expect("moves");
        assert_eq!(s.resources["vm.b"].cloud_name.as_deref(), Some("a"));
        move_record(&mut s, "vm.b", "vm.c").expect("moves");
        assert_eq!(s.resources["vm.c"].identity_name("vm.c"), "a");
        let before = s.clone();
        assert_eq!(
            move_record(&mut s, "vm.x", "vm.y"),
            Err(MoveError::SourceMissing("vm.x".into()))
        );
        s.resources.insert("vm.d".into(), record(&c.vms["db"]));
        let with_d = s.clone();
        assert_eq!(
            move_record(&mut s, "vm.c", "vm.d"),
            Err(MoveError::DestinationExists("vm.d".into()))
        );
        assert_eq!(s, with_d, "nothing changes on error");
        assert_eq!(before.resources.len() + 1, s.resources.len());
        move_record(&mut s, "vm.c", "vm.a").expect("moves back");
        assert_eq!(s.resources["vm.a"].cloud_name, None);
    }

    #[test]
    fn moved_blocks_move_present_records_ignore_absent_ones_and_refuse_both() {
        let c =
            config("[vm.b]\nclouds = [\"docker\"]\n\n[[moved]]\nfrom = \"vm.a\"\nto = \"vm.b\"\n");
        assert_eq!(
            c.moved[0].from_span.clone(),
            c.source
                .find("\"vm.a\"")
                .map(|i| i..i + 6)
                .expect("written")
        );
        let mut s = StateFile::new();
        s.resources.insert("vm.a".into(), record(&c.vms["b"]));
        let moved = apply_moved(&c, &mut s).expect("moves");
        assert_eq!(
            moved,
            [MovedLine {
                from: "vm.a".into(),
                to: "vm.b".into()
            }]
        );
        assert_eq!(s.resources["vm.b"].cloud_name.as_deref(), Some("a"));
        // Applied already: from is absent, the block is ignored.
        assert_eq!(apply_moved(&c, &mut s).expect("ignored"), []);
        let plan = compute(&c, &s, None, &|_| None).expect("plans");
        assert!(plan.changes.iter().all(|c| c.action != Action::Destroy));
        s.resources.insert("vm.a".into(), record(&c.vms["b"]));
        let e = apply_moved(&c, &mut s).expect_err("both in the state");
        assert!(e.message.contains("both are in the state"), "{}", e.message);
    }

    #[test]
    fn a_new_machine_may_not_take_a_name_a_moved_machine_still_carries() {
        let c = config("[vm.a]\nclouds = [\"docker\"]\n\n[vm.b]\nclouds = [\"docker\"]\n");
        let mut s = StateFile::new();
        s.resources.insert("vm.a".into(), record(&c.vms["a"]));
        move_record(&mut s, "vm.a", "vm.b").expect("moves");
        let plan = compute(&c, &s, None, &|_| None).expect("plans");
        let e = check_identity_clash(&plan, &s).expect_err("vm.a's name is taken");
        assert!(
            e.starts_with("vm.a cannot be created yet: the machine of vm.b"),
            "{e}"
        );
        // Replaced, vm.b's machine carries its own name and vm.a is free.
        s.resources.get_mut("vm.b").expect("b").cloud_name = None;
        let plan = compute(&c, &s, None, &|_| None).expect("plans");
        check_identity_clash(&plan, &s).expect("no clash");
    }

    #[test]
    fn replace_is_forced_only_for_machines_of_config_and_state() {
        let c = config(FOUR);
        let mut s = StateFile::new();
        s.resources.insert("vm.db".into(), record(&c.vms["db"]));
        s.resources.insert("vm.gone".into(), record(&c.vms["db"]));
        let plan = compute(&c, &s, None, &|_| Some(2.0)).expect("plans");
        let mut p = plan.clone();
        force_replace(&mut p, &s, &t("vm.db"), &|_| Some(2.0)).expect("replaces");
        let db = p.changes.iter().find(|c| c.address == "vm.db").expect("db");
        assert_eq!(db.action, Action::Replace);
        assert_eq!(db.price_per_hour, Some(2.0));
        for bad in ["vm.app", "vm.gone", "vm.nope"] {
            let mut p = plan.clone();
            assert!(
                force_replace(&mut p, &s, &t(bad), &|_| None).is_err(),
                "{bad}"
            );
        }
    }
}
