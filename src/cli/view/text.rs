//! The plan for a terminal, Terraform-style: what each machine and shared object will
//! do, its attributes before and after, the offers apply tries in order, and the hourly
//! cost of what will run. Colour is added by `super::super::color`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::plan::{discovery, Action, Change, Plan};

/// How many offers a rendered plan lists per machine; the JSON plan has all of them.
const OFFERS_SHOWN: usize = 8;

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
    let moved_from = |address: &str| plan.moved.iter().find(|m| m.to == address);
    // A moved machine with nothing else to do, as Terraform shows it.
    for m in &plan.moved {
        let changed = plan
            .changes
            .iter()
            .any(|c| c.address == m.to && c.action != Action::NoOp);
        if !changed {
            let name = m.to.strip_prefix("vm.").unwrap_or(&m.to);
            let _ = writeln!(
                out,
                "\n  # {} has moved to {}\n    vm \"{name}\"",
                m.from, m.to
            );
        }
    }
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
        if let Some(m) = moved_from(&c.address) {
            let _ = writeln!(out, "  # (moved from {})", m.from);
        }
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
                (None, Some(v)) => match c.effective.get(&a.name) {
                    Some(e) if e.value != *v => {
                        format!("      + {:width$} = {} # {}", a.name, e.value, e.why)
                    }
                    Some(e) => format!("      + {:width$} = {v} # {}", a.name, e.why),
                    None => format!("      + {:width$} = {v}", a.name),
                },
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
    for s in &plan.shared {
        let users = s.users_text();
        let object = crate::provider::SharedObject::parse(&s.address);
        // Keys are found by value, other kinds by the name gpuprov derives.
        let found = match &object {
            Some(o) if o.kind == crate::provider::shared::SSH_KEY => "by value",
            _ => "by its name",
        };
        let what = match s.action {
            // A machine whose region is chosen at launch: one per region used.
            Action::Create if object.is_some_and(|o| o.region.as_deref() == Some("*")) => format!(
                "will be created once in each region the machines launch in\n  # (found {found} if it exists; used by {users})"
            ),
            Action::Create => format!(
                "will be created once, before the first machine that needs it\n  # (found {found} if it exists; used by {users})"
            ),
            Action::NoOp => {
                let _ = writeln!(
                    out,
                    "\n  # {} is kept: no machine uses it any more, and keep_shared is set",
                    s.address
                );
                continue;
            }
            _ => "will be released after the last machine using it\n  # (deleted only if gpuprov created it)".into(),
        };
        let _ = writeln!(out, "\n  # {} {what}", s.address);
        let _ = writeln!(out, "{:>3} {}", s.action.symbol(), s.address);
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

/// `Hourly cost of what will run: $…/h`, a lower bound when a price is unknown.
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
