//! The plan as GitHub-flavoured Markdown, for a pull-request comment or a job summary
//! (`gpuprov plan -markdown`, `gpuprov show -markdown PLANFILE`, and
//! `$GITHUB_STEP_SUMMARY`): a summary line, the hourly cost before and after, one table
//! row per machine (action, where it runs or will first be tried, instance type, USD per
//! hour, the change), and each machine's attribute diff folded in a `<details>` block.
//! Pure: it renders what the plan holds.

use std::fmt::Write as _;

use crate::plan::{Action, Change, Plan};

/// A table cell's text: pipes escaped and on one line, so no value can break the table.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace(['\n', '\r'], " ")
}

fn money(usd: f64) -> String {
    format!("${usd:.2}")
}

/// The action's word and Terraform's symbol.
fn action(c: &Change) -> &'static str {
    match c.action {
        Action::NoOp => "no change",
        Action::Create => "➕ create",
        Action::Update => "🔄 update in place",
        Action::Replace => "♻️ replace",
        Action::Destroy => "🗑️ destroy",
        Action::Resume => "⏯️ resume",
    }
}

/// Where the machine runs now, or for a machine to create, its first offer (apply tries it
/// first), and its instance type.
fn place(c: &Change) -> (String, String) {
    let offer = match c.action {
        Action::Create | Action::Replace => c.offers.first().or(c.current.as_ref()),
        _ => c.current.as_ref().or(c.offers.first()),
    };
    match offer {
        Some(o) => (
            format!(
                "`{}`{}",
                cell(&o.location),
                if o.spot { " (spot)" } else { "" }
            ),
            format!("`{}`", cell(&o.instance_type)),
        ),
        None if !c.no_offers.is_empty() => ("**no offer**".into(), "—".into()),
        None => ("—".into(), "—".into()),
    }
}

/// What changes, in a few words.
fn what(c: &Change) -> String {
    let mut parts = Vec::new();
    if let Some(r) = &c.reason {
        parts.push(cell(r));
    }
    match c.action {
        Action::Create | Action::Replace if c.offers.len() > 1 => parts.push(format!(
            "first of {} offers, tried in order",
            c.offers.len()
        )),
        _ => {}
    }
    let forcing: Vec<&str> = c
        .attributes
        .iter()
        .filter(|a| a.forces_replacement)
        .map(|a| a.name.as_str())
        .collect();
    if !forcing.is_empty() {
        parts.push(format!("`{}` forces replacement", forcing.join("`, `")));
    } else if c.action == Action::Update {
        let names: Vec<&str> = c.attributes.iter().map(|a| a.name.as_str()).collect();
        parts.push(format!("`{}`", names.join("`, `")));
    }
    for (name, e) in &c.effective {
        parts.push(format!("`{name}` = `{}`: {}", cell(&e.value), cell(&e.why)));
    }
    if !c.no_offers.is_empty() {
        let why: Vec<String> = c
            .no_offers
            .iter()
            .map(|n| format!("{}: {}", n.cloud, n.reason.as_str()))
            .collect();
        parts.push(cell(&why.join("; ")));
    }
    if parts.is_empty() {
        "—".into()
    } else {
        parts.join("; ")
    }
}

/// The price cell: after apply, with the change when the machine runs now.
fn price(c: &Change) -> String {
    let before = c.current.as_ref().map(|o| o.price_per_hour);
    let after = if c.action == Action::Destroy {
        Some(0.0)
    } else {
        c.price_per_hour
    };
    match (before, after) {
        (Some(b), Some(a)) if (a - b).abs() >= 0.005 => format!("{} → {}", money(b), money(a)),
        (_, Some(a)) => money(a),
        (Some(b), None) => format!("{} → ?", money(b)),
        (None, None) => "?".into(),
    }
}

/// The plan as Markdown (module docs).
pub fn render(plan: &Plan) -> String {
    let mut out = String::new();
    let (add, change, destroy) = plan.counts();
    if plan.has_changes() {
        let _ = writeln!(
            out,
            "### gpuprov plan: {add} to add, {change} to change, {destroy} to destroy\n"
        );
    } else {
        out.push_str("### gpuprov plan: no changes\n\n");
    }
    let (before, after) = (plan.hourly_cost_before(), plan.hourly_cost_after);
    let delta = after - before;
    let sign = if delta >= 0.0 { "+" } else { "−" };
    let _ = writeln!(
        out,
        "**Hourly cost:** {} → {}{} ({sign}{}/h)\n",
        money(before),
        money(after),
        if plan.hourly_cost_incomplete {
            " at least"
        } else {
            ""
        },
        money(delta.abs()),
    );
    for (cloud, ep) in &plan.endpoints {
        let _ = writeln!(
            out,
            "> [!NOTE]\n> {cloud} API endpoint overridden: `{}`\n",
            cell(ep)
        );
    }
    if plan.changes.is_empty() {
        out.push_str("The configuration defines no machine.\n");
        return out;
    }
    out.push_str("| machine | action | cloud / region | type | USD/h | change |\n");
    out.push_str("|---|---|---|---|--:|---|\n");
    for c in &plan.changes {
        let (place, itype) = place(c);
        let _ = writeln!(
            out,
            "| `{}` | {} | {place} | {itype} | {} | {} |",
            cell(&c.address),
            action(c),
            price(c),
            what(c)
        );
    }
    for s in &plan.shared {
        let (cloud, kind) = s.cloud_and_kind();
        let (act, what) = match s.action {
            Action::Create => ("create once", format!("used by {}", s.users_text())),
            Action::NoOp => ("keep", "unused; `keep_shared` is set".to_string()),
            _ => (
                "release",
                "after its last machine; deleted only if gpuprov created it".to_string(),
            ),
        };
        let region = s
            .address
            .split_once('[')
            .map(|(_, r)| format!(" / {}", r.trim_end_matches(']')))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "| `{}` | {act} | {}{} | {} | – | {} |",
            cell(&s.address),
            cell(cloud),
            cell(&region),
            cell(kind),
            cell(&what)
        );
    }
    for c in plan.changes.iter().filter(|c| !c.attributes.is_empty()) {
        let _ = writeln!(
            out,
            "\n<details><summary><code>{}</code>: {} ({} attribute{})</summary>\n\n```diff",
            c.address,
            action(c),
            c.attributes.len(),
            if c.attributes.len() == 1 { "" } else { "s" }
        );
        for a in &c.attributes {
            if let Some(b) = &a.before {
                let _ = writeln!(out, "- {} = {b}", a.name);
            }
            if let Some(v) = &a.after {
                let forces = if a.forces_replacement {
                    "  # forces replacement"
                } else {
                    ""
                };
                let _ = writeln!(out, "+ {} = {v}{forces}", a.name);
            }
        }
        out.push_str("```\n\n</details>\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{AttrChange, NoOffer, NoOfferReason, OfferLine};

    fn offer(id: &str, location: &str, itype: &str, price: f64) -> OfferLine {
        OfferLine {
            id: id.into(),
            instance_type: itype.into(),
            location: location.into(),
            price_per_hour: price,
            spot: false,
            preempted: false,
        }
    }

    fn change(vm: &str, action: Action) -> Change {
        use std::collections::BTreeMap;
        Change {
            address: format!("vm.{vm}"),
            vm: vm.into(),
            action,
            reason: None,
            attributes: vec![],
            desired: None,
            recorded: None,
            price_per_hour: None,
            offers: vec![],
            no_offers: vec![],
            current: None,
            found: None,
            preempted: vec![],
            preempted_now: false,
            effective: BTreeMap::new(),
        }
    }

    fn attr(name: &str, before: Option<&str>, after: Option<&str>, forces: bool) -> AttrChange {
        AttrChange {
            name: name.into(),
            before: before.map(str::to_string),
            after: after.map(str::to_string),
            forces_replacement: forces,
        }
    }

    /// Every action in one plan: the table, the cost change and the folded diffs.
    #[test]
    fn a_plan_with_every_action_renders_as_markdown() {
        let h100 = offer(
            "lambda/us-east-1/gpu_8x_h100_sxm5",
            "lambda/us-east-1",
            "gpu_8x_h100_sxm5",
            23.92,
        );
        let l40s = offer(
            "runpod/EU-RO-1/secure/NVIDIA L40S",
            "runpod/EU-RO-1",
            "NVIDIA L40S",
            0.86,
        );
        let mut create = change("trainer", Action::Create);
        create.attributes = vec![
            attr("gpu", None, Some("\"H100\""), false),
            attr("gpu_count", None, Some("8"), false),
        ];
        create.offers = vec![
            h100.clone(),
            offer("verda/FIN-01/8H100", "verda/FIN-01", "8H100", 19.92),
        ];
        create.price_per_hour = Some(23.92);
        let mut replace = change("inference", Action::Replace);
        replace.attributes = vec![attr("image", Some("\"a\""), Some("\"b | c\""), true)];
        replace.current = Some(l40s.clone());
        replace.offers = vec![l40s.clone()];
        replace.price_per_hour = Some(0.86);
        let mut update = change("notebook", Action::Update);
        update.attributes = vec![attr("ports", Some("[8888]"), Some("[8888, 8000]"), false)];
        update.current = Some(offer(
            "gcp/us-central1/g2/a",
            "gcp/us-central1/us-central1-a",
            "g2-standard-8",
            0.8536,
        ));
        update.price_per_hour = Some(0.8536);
        let mut destroy = change("old", Action::Destroy);
        destroy.current = Some(offer(
            "aws/us-east-1/g6.xlarge/a",
            "aws/us-east-1/us-east-1a",
            "g6.xlarge",
            0.805,
        ));
        destroy.attributes = vec![attr("gpu", Some("\"L4\""), None, false)];
        let mut none = change("spare", Action::Create);
        none.no_offers = vec![NoOffer {
            cloud: "lambda".into(),
            reason: NoOfferReason::NoCredentials,
            detail: "set LAMBDA_API_KEY".into(),
        }];
        let mut same = change("web", Action::NoOp);
        same.current = Some(offer(
            "docker/local/container",
            "docker/local",
            "container",
            0.0,
        ));
        same.price_per_hour = Some(0.0);
        let plan = Plan {
            format_version: 1,
            gpuprov_version: "0.1.0".into(),
            lineage: "l".into(),
            serial: 3,
            config_sha256: "x".into(),
            refreshed: true,
            endpoints: [("lambda".to_string(), "http://127.0.0.1:9".to_string())].into(),
            changes: vec![create, replace, update, destroy, none, same],
            hourly_cost_after: 23.92 + 0.86 + 0.8536,
            hourly_cost_incomplete: true,
            moved: vec![],
            targets: vec![],
            foreign: vec![],
            unlisted: vec![],
            shared: vec![],
            kept_shared: Default::default(),
        };
        let md = render(&plan);
        insta::assert_snapshot!("plan_markdown_every_action", md);
        assert!(md.starts_with("### gpuprov plan: 3 to add, 1 to change, 2 to destroy"));
        assert!(md.contains("$2.52 → $25.63 at least"), "{md}");
        assert!(
            md.contains("+ image = \"b | c\"  # forces replacement"),
            "{md}"
        );
        // One row per machine, each with six cells (seven unescaped pipes).
        let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| `vm.")).collect();
        assert_eq!(rows.len(), 6);
        for r in rows {
            let pipes = r.matches('|').count() - r.matches("\\|").count();
            assert_eq!(pipes, 7, "{r}");
        }
        let empty = Plan {
            changes: vec![],
            endpoints: Default::default(),
            hourly_cost_after: 0.0,
            hourly_cost_incomplete: false,
            ..plan
        };
        assert!(render(&empty).starts_with("### gpuprov plan: no changes"));
    }
}
