//! `gpuprov state recover --lineage L`: rebuilds a lost state from what the clouds report
//! under its lineage. Every cloud object carries the VM name and the lineage, so a user
//! who deleted the state gets the machines back instead of a bill: each machine of this
//! config found under `L` is adopted through the launch machine (login with the project
//! key, host key pinned on first use), and the state takes the lineage `L`.

use std::collections::{BTreeMap, BTreeSet};

use miette::miette;

use crate::plan::discovery::{self, FoundInstance};
use crate::plan::{self, Action};
use crate::provider::Lineage;

use super::args::{Cli, StateRecoverArgs};
use super::error::{CmdResult, Exit};
use super::key::{project_key, KeyUse};
use super::preflight::preflight;
use super::project::{confirm, Project};
use super::providers::build_providers;
use super::run::{finish_run, start_run};

pub(super) async fn run(
    cli: &Cli,
    project: &Project,
    a: &StateRecoverArgs,
    color: bool,
) -> CmdResult {
    let config = project.load_config()?;
    let lineage = Lineage::parse(&a.lineage).map_err(|e| {
        miette!(
            code = "gpuprov::recover::lineage",
            help = "`gpuprov plan` (with no state) and `gpuprov sweep` show the lineages found",
            "--lineage: {}",
            e.text()
        )
    })?;
    let _lock = project.lock("state recover", cli.lock_timeout)?;
    let (store, mut state) = project.open_state()?;
    if !state.resources.is_empty() {
        return Err(miette!(
            code = "gpuprov::recover::state_in_use",
            help = "recover rebuilds a state that records nothing; to keep this one, find \
                    what it misses with `gpuprov plan` (it adopts machines of its own \
                    lineage) and `gpuprov sweep`",
            "{} records {} machine(s) under lineage {}: refusing to replace it",
            project.location(),
            state.resources.len(),
            state.lineage
        )
        .into());
    }
    // The adapters carry the lost lineage: their observes then find its machines.
    let providers = build_providers(&config, &lineage);
    let pre = preflight(&config, &providers).await?;
    let offered = pre.offers.values().flatten().map(|o| o.location.clone());
    let locations = discovery::locations(offered, &state);
    let found = discovery::discover(&locations, &providers).await;
    for (at, why) in &found.unlisted {
        errln!("note: could not list {at}: {why}");
    }
    let chosen = choose(&found.listed, lineage.as_str(), &config);
    if chosen.is_empty() {
        let names: BTreeSet<String> = config.vms.keys().cloned().collect();
        let others = found.foreign_lineages(lineage.as_str(), &names);
        let searched: Vec<String> = locations.iter().map(|l| l.to_string()).collect();
        return Err(miette!(
            code = "gpuprov::recover::nothing_found",
            help = if others.is_empty() {
                "check the lineage (`gpuprov sweep` lists every lineage found) and that the \
                 config names the clouds and regions the machines run in"
                    .to_string()
            } else {
                format!(
                    "machines with this config's names run under: {}",
                    others.keys().cloned().collect::<Vec<_>>().join(", ")
                )
            },
            "no live machine of this config under lineage {lineage} in {}",
            if searched.is_empty() {
                "any location (no offers: check credentials)".to_string()
            } else {
                searched.join(", ")
            }
        )
        .into());
    }
    outln!("Machines found under lineage {lineage}:\n");
    for (vm, f) in &chosen {
        outln!(
            "  vm.{vm}  {}  {}  {}{}",
            f.location,
            f.instance_id,
            f.status,
            f.price_per_hour
                .map(|p| format!("  ${p:.2}/h"))
                .unwrap_or_default()
        );
    }
    let missing: Vec<&String> = config
        .vms
        .keys()
        .filter(|n| !chosen.contains_key(*n))
        .collect();
    if !missing.is_empty() {
        outln!(
            "\nNot found (the next apply creates them): {}",
            missing
                .iter()
                .map(|n| format!("vm.{n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    outln!(
        "\nEach machine is taken over by logging in with the project key; its host key is \
         pinned on this first login (trust on first use: the key is not checked against an \
         earlier record, which was lost)."
    );
    if !confirm(cli, "recover", a.auto_approve)? {
        errln!("Recover cancelled.");
        return Ok(Exit::Failure);
    }
    state.lineage = lineage.to_string();
    let key = project_key(project, &state, KeyUse::Connect)?;
    let mut recovered =
        plan::compute(&config, &state, None, &|_| None).map_err(|e| miette!("{e}"))?;
    let only_found = discovery::Discovery {
        listed: chosen.values().cloned().collect(),
        ..Default::default()
    };
    discovery::fold(&mut recovered, &state, &only_found);
    recovered.changes.retain(|c| c.found.is_some());
    recovered.foreign.clear();
    let display = super::progress::Display {
        verb: super::progress::Verb::Apply,
        machines: recovered
            .changes
            .iter()
            .map(|c| (c.address.clone(), false))
            .collect(),
        color,
    };
    let run = start_run(state, store, providers, &key, a.parallelism, false, display)?;
    let outcomes = run.engine.apply(&recovered).await;
    let snapshot = run.journal.snapshot();
    for (address, o) in &outcomes {
        if let crate::engine::Outcome::Ready(vm) = o {
            outln!(
                "{address}: recovered {} at {}; host key {} {} pinned (trust on first use)",
                vm.instance_id,
                vm.location,
                vm.host_key.algorithm,
                vm.host_key.fingerprint
            );
        }
    }
    drop(snapshot);
    let actions: BTreeMap<String, Action> = recovered
        .changes
        .iter()
        .map(|c| (c.address.clone(), c.action))
        .collect();
    finish_run(run, &outcomes, &actions, "Recover").await
}

/// One instance per machine of `config` under `lineage`: a running one first, then the
/// lowest id (the others stay for `gpuprov sweep`).
fn choose(
    listed: &[FoundInstance],
    lineage: &str,
    config: &crate::config::Config,
) -> BTreeMap<String, FoundInstance> {
    let mut out: BTreeMap<String, FoundInstance> = BTreeMap::new();
    let mut sorted: Vec<&FoundInstance> = listed
        .iter()
        .filter(|f| f.lineage == lineage && config.vms.contains_key(&f.vm))
        .collect();
    sorted.sort_by_key(|f| (f.status != "running", f.instance_id.clone()));
    for f in sorted {
        out.entry(f.vm.clone()).or_insert_with(|| f.clone());
    }
    out
}
