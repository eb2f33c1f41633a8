//! `gpuprov apply [FILE]` and `gpuprov destroy`: one command in two modes, as OpenTofu's
//! `ApplyCommand { Destroy }`. Apply runs the plan's changes (made here, or a saved one);
//! destroy tears down what the state records (the config, when there is one, only
//! supplies cloud settings). Both run the engine through [`super::run`].

use std::collections::BTreeSet;
use std::path::Path;

use miette::{miette, Context, IntoDiagnostic, Report};

use crate::machine::Providers;
use crate::plan::{self, Action, Plan};

use super::args::{ApplyArgs, Cli, DestroyArgs};
use super::error::{CmdResult, Exit};
use super::key::{project_key, KeyUse};
use super::plan::{
    apply_k8s_flags, apply_moved, check_targeting, preflight_reading_ahead, shown_plan,
    warn_targeting, Asked,
};
use super::preflight::preflight;
use super::project::{confirm, lineage_of, Project};
use super::providers::{add_recorded_clouds, build_providers, recorded_clouds, shared_clouds};
use super::run::{finish_run, start_run};
use super::view::text;
use super::{color, progress, ssh, state_mv};

/// What a run of the apply command does.
pub(super) enum Mode<'a> {
    /// `gpuprov apply [FILE]`: the plan's changes.
    Apply(&'a ApplyArgs),
    /// `gpuprov destroy`: every machine of the state (or the targets and what depends on
    /// them), then the shared objects no machine uses any more.
    Destroy(&'a DestroyArgs),
}

/// Runs the apply command in `mode`.
pub(super) async fn run(cli: &Cli, project: &Project, mode: Mode<'_>, color: bool) -> CmdResult {
    match mode {
        Mode::Apply(a) => apply(cli, project, a, color).await,
        Mode::Destroy(a) => destroy(cli, project, a, color).await,
    }
}

/// `apply [FILE]`: makes the plan (or checks the saved one against the state and the
/// config), asks for confirmation, and runs its changes.
async fn apply(cli: &Cli, project: &Project, a: &ApplyArgs, color: bool) -> CmdResult {
    let mut config = project.load_config()?;
    if a.plan_file.is_some() && (a.k8s.k8s || a.k8s.no_k8s) {
        return Err(miette!(
            help = "pass --k8s / --no-k8s to `gpuprov plan -out FILE` instead",
            "--k8s and --no-k8s cannot change a saved plan"
        )
        .into());
    }
    if a.plan_file.is_some() && a.targeting.any() {
        return Err(miette!(
            help = "pass -target / -replace to `gpuprov plan -out FILE` instead",
            "-target and -replace cannot change a saved plan"
        )
        .into());
    }
    check_targeting(&a.targeting.targets, &a.targeting.replace)?;
    apply_k8s_flags(&mut config, &a.k8s);
    let _lock = project.lock("apply", cli.lock_timeout)?;
    let (mut store, mut state) = project.open_state()?;
    let moved = apply_moved(&config, &mut state)?;
    let saved = a.plan_file.as_deref().map(read_saved_plan).transpose()?;
    if let Some(plan) = &saved {
        // A plan made before the state file existed carries the lineage the new state
        // will have; a state still never saved (serial 0) takes it over.
        if state.serial == 0 && plan.serial == 0 && state.resources.is_empty() {
            state.lineage = plan.lineage.clone();
        }
    }
    let lineage = lineage_of(&state)?;
    let mut providers = build_providers(&config, &lineage);
    // A saved plan's records need no decoding for the plan, only for their clouds.
    let (pre, ahead) = if saved.is_some() {
        let pre = preflight(&config, &providers).await?;
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let clouds = recorded_clouds(&state, &plan::ReadAhead::of(&state, cores));
        add_recorded_clouds(&mut providers, Some(&config), clouds, &lineage);
        (pre, None)
    } else {
        let (pre, ahead) = preflight_reading_ahead(&config, &state, &providers).await?;
        let clouds = recorded_clouds(&state, &ahead);
        add_recorded_clouds(&mut providers, Some(&config), clouds, &lineage);
        (pre, Some(ahead))
    };
    for n in &pre.notes {
        errln!("note: {n}");
    }
    let plan = match (&a.plan_file, saved, ahead) {
        (Some(path), Some(plan), _) => {
            if plan.lineage != state.lineage || plan.serial != state.serial {
                return Err(miette!(
                    help = "run `gpuprov plan -out FILE` again and apply the new plan",
                    "saved plan {} is stale: it was made against state serial {} (lineage {}), the state is now at serial {} (lineage {})",
                    path.display(), plan.serial, plan.lineage, state.serial, state.lineage
                ).into());
            }
            if plan.config_sha256 != plan::sha256_hex(config.source.as_bytes()) {
                return Err(miette!(
                    help = "run `gpuprov plan -out FILE` again and apply the new plan",
                    "saved plan {} was made from a different {}",
                    path.display(),
                    project.config_path.display()
                )
                .into());
            }
            plan
        }
        (_, _, ahead) => {
            let ahead = ahead.unwrap_or_else(|| plan::ReadAhead::of(&state, 1));
            let asked = Asked {
                refresh: a.refresh.refresh,
                targeting: &a.targeting,
                allow_no_offers: a.allow_no_offers,
            };
            let plan = shown_plan(&config, &state, &ahead, &providers, &pre, asked, moved).await?;
            let color = color::stdout_color(cli.no_color);
            out!("{}", color::plan(&text::render(&plan), color));
            if plan.has_changes() {
                // Before asking: a missing key is said before anyone types "yes".
                project_key(project, &state, KeyUse::Apply)?;
            }
            if plan.has_changes() && !confirm(cli, "apply", a.auto_approve)? {
                errln!("Apply cancelled.");
                return Ok(Exit::Failure);
            }
            plan
        }
    };
    if !plan.moved.is_empty() {
        // Moves are saved before any machine runs: a journal replayed onto the unmoved
        // state would track one machine under two addresses.
        store.save(&mut state)?;
        for m in &plan.moved {
            errln!("{}: moved from {}", m.to, m.from);
        }
    }
    if !plan.has_changes() {
        // A run killed after its last transition may not have written these; without the
        // key on this machine there is nothing to name in them (and nothing to apply).
        if let Ok(key) = project_key(project, &state, KeyUse::Connect) {
            match ssh::write_ssh_config(&state, &key) {
                Ok(warnings) => warnings.iter().for_each(|w| errln!("warning: {w}")),
                Err(e) => errln!("warning: cannot write the ssh config: {e}"),
            }
        }
        return Ok(Exit::Success);
    }
    let key = project_key(project, &state, KeyUse::Apply)?;
    let run = start_run(
        state,
        store,
        providers,
        &key,
        a.parallelism,
        a.retry_until_up,
        progress::Display {
            verb: progress::Verb::Apply,
            machines: plan
                .changes
                .iter()
                .filter(|c| c.action != Action::NoOp)
                .map(|c| (c.address.clone(), c.action == Action::Resume))
                .collect(),
            color,
        },
    )?;
    let outcomes = run.engine.apply(&plan).await;
    warn_targeting(&plan.targets, true);
    let actions = plan
        .changes
        .iter()
        .map(|c| (c.address.clone(), c.action))
        .collect();
    finish_run(run, &outcomes, &actions, "Apply").await
}

/// `destroy`: every machine the state records (or the targets and their dependents),
/// with the adapter of every cloud they are on, config or not.
async fn destroy(cli: &Cli, project: &Project, a: &DestroyArgs, color: bool) -> CmdResult {
    // The config is optional for destroy: the state says what exists. When present it
    // supplies cloud settings (endpoints).
    let config = project.load_config().ok();
    check_targeting(&a.targets, &[])?;
    let _lock = project.lock("destroy", cli.lock_timeout)?;
    let (store, state) = project.open_state()?;
    if state.resources.is_empty() {
        errln!("No machines in {}: nothing to destroy.", project.location());
        return Ok(Exit::Success);
    }
    let lineage = lineage_of(&state)?;
    let mut providers = match &config {
        Some(c) => build_providers(c, &lineage),
        None => Providers::new(),
    };
    // Every cloud the state records needs its adapter, named by the config or not. A
    // record that cannot be read stops everything: it may be the only trace of a
    // machine, so it is neither skipped nor dropped.
    let mut recorded = BTreeSet::new();
    for (address, r) in &state.resources {
        let owned = r.machine.owned().map_err(|e| {
            miette!(
                help = "the state file was edited by hand or written by an incompatible gpuprov; restore its .backup, or fix the record (see `gpuprov state show ADDRESS`). Nothing was destroyed and the file was not modified",
                "state record {address} is {e}"
            )
        })?;
        if let Some(o) = owned {
            recorded.insert(o.location.cloud);
        }
    }
    recorded.extend(shared_clouds(&state));
    add_recorded_clouds(&mut providers, config.as_ref(), recorded, &lineage);
    let addresses: Vec<String> = if a.targets.is_empty() {
        state.resources.keys().cloned().collect()
    } else {
        if let Some(t) = a.targets.iter().find(|t| !state.resources.contains_key(*t)) {
            return Err(state_mv::unknown_address(project, &state, t));
        }
        plan::destroy_targets(&state, &a.targets)
            .into_iter()
            .collect()
    };
    warn_targeting(&a.targets, false);
    errln!("gpuprov will destroy:");
    for addr in &addresses {
        errln!("  - {addr} ({})", state.resources[addr].machine.label);
    }
    errln!(
        "\nPlan: 0 to add, 0 to change, {} to destroy.",
        addresses.len()
    );
    if !confirm(cli, "destroy", a.auto_approve)? {
        errln!("Destroy cancelled.");
        return Ok(Exit::Failure);
    }
    let key = project_key(project, &state, KeyUse::Destroy)?;
    let display = progress::Display {
        verb: progress::Verb::Destroy,
        machines: addresses.iter().map(|a| (a.clone(), false)).collect(),
        color,
    };
    let run = start_run(state, store, providers, &key, a.parallelism, false, display)?;
    let outcomes = run.engine.destroy(&addresses).await;
    let actions = addresses
        .iter()
        .map(|a| (a.clone(), Action::Destroy))
        .collect();
    finish_run(run, &outcomes, &actions, "Destroy").await
}

/// Reads a plan saved by `plan -out FILE`.
///
/// Errors: the file cannot be read, is not a plan, was written by a newer gpuprov (plan
/// format), or carries a lineage that is not a UUID.
pub(super) fn read_saved_plan(path: &Path) -> Result<Plan, Report> {
    let text = std::fs::read_to_string(path)
        .into_diagnostic()
        .wrap_err_with(|| format!("cannot read saved plan {}", path.display()))?;
    let plan: Plan = serde_json::from_str(&text).map_err(|e| {
        miette!(
            help = "make it with `gpuprov plan -out FILE`",
            "{} is not a gpuprov plan file: {e}",
            path.display()
        )
    })?;
    if plan.format_version > plan::PLAN_FORMAT_VERSION {
        return Err(miette!(
            "{} was written by a newer gpuprov (plan format {})",
            path.display(),
            plan.format_version
        ));
    }
    // A new state may adopt the plan's lineage, which names a directory: UUIDs only.
    if uuid::Uuid::parse_str(&plan.lineage).is_err() {
        return Err(miette!(
            help = "make it with `gpuprov plan -out FILE`",
            "{} has an invalid lineage {:?}: a lineage is a UUID",
            path.display(),
            plan.lineage
        ));
    }
    Ok(plan)
}
