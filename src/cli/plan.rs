//! `gpuprov plan`: config + state (+ the clouds, with refresh) → the changes, shown as
//! text, Markdown or JSON (`super::view`), saved with `-out`. `apply` makes its plan
//! with the same functions.

use miette::{miette, Context, Report};

use crate::config::Config;
use crate::machine::Providers;
use crate::plan::{self, Action, Plan};
use crate::state::StateFile;

use super::args::{Cli, K8sArgs, PlanArgs, TargetArgs};
use super::error::{CmdResult, CommandError, Exit};
use super::preflight::{self, preflight, Preflight};
use super::project::{lineage_of, Project};
use super::providers::{add_recorded_clouds, build_providers, recorded_clouds};
use super::view::{json, markdown, text};
use super::{color, show, state_mv};

/// `plan`: shows the changes as text, Markdown (`-markdown`) or JSON (`-json`), saves
/// them with `-out FILE`; exit 2 with `-detailed-exitcode` when there are changes.
pub(super) async fn run(cli: &Cli, project: &Project, a: &PlanArgs) -> CmdResult {
    let mut config = project.load_config()?;
    apply_k8s_flags(&mut config, &a.k8s);
    let _lock = if a.lock {
        Some(project.lock("plan", cli.lock_timeout)?)
    } else {
        None
    };
    check_targeting(&a.targeting.targets, &a.targeting.replace)?;
    // A plan never saves: the store and the file's bytes it keeps for the backup (16 MB
    // at 10,000 machines) go before the plan is built, which reuses their memory.
    let (store, mut state) = project.open_state()?;
    drop(store);
    let moved = apply_moved(&config, &mut state)?;
    let lineage = lineage_of(&state)?;
    let mut providers = build_providers(&config, &lineage);
    let (pre, ahead) = preflight_reading_ahead(&config, &state, &providers).await?;
    add_recorded_clouds(
        &mut providers,
        Some(&config),
        recorded_clouds(&state, &ahead),
        &lineage,
    );
    let asked = Asked {
        refresh: a.refresh.refresh,
        targeting: &a.targeting,
        allow_no_offers: a.allow_no_offers,
    };
    let plan = shown_plan(&config, &state, &ahead, &providers, &pre, asked, moved).await?;
    // Notes go to stderr, so `--json` output stays machine-readable.
    for n in &pre.notes {
        errln!("note: {n}");
    }
    if a.json {
        let json = json::JsonPlan::of(&plan);
        outln!(
            "{}",
            serde_json::to_string_pretty(&json).map_err(CommandError::internal)?
        );
    } else if a.markdown {
        out!("{}", markdown::render(&plan));
    } else {
        let color = color::stdout_color(cli.no_color);
        out!("{}", color::plan(&text::render(&plan), color));
    }
    show::write_step_summary(&plan)?;
    if let Some(out) = &a.out {
        let text = serde_json::to_string_pretty(&plan).map_err(CommandError::internal)?;
        crate::state::write_atomic(out, text.as_bytes())
            .map_err(Report::new)
            .wrap_err_with(|| format!("cannot save the plan to {}", out.display()))?;
        if !a.json && !a.markdown {
            outln!(
                "\nSaved the plan to: {}\nTo perform exactly these actions, run: gpuprov apply {}",
                out.display(),
                out.display()
            );
        }
    }
    let exit = if a.detailed_exitcode && plan.has_changes() {
        Exit::Changes
    } else {
        Exit::Success
    };
    forget_at_exit(ahead);
    forget_at_exit((config, state, plan, pre));
    Ok(exit)
}

/// What a `plan` or `apply` run asks of its plan (its flags).
pub(super) struct Asked<'a> {
    pub refresh: bool,
    pub targeting: &'a TargetArgs,
    pub allow_no_offers: bool,
}

/// The plan `plan` and `apply` show: [`make_plan`] with the records `moved` blocks
/// moved, the targeting warning said, and, unless `--allow-no-offers`, a machine to
/// create that no cloud offers anything for as an error.
pub(super) async fn shown_plan(
    config: &Config,
    state: &StateFile,
    ahead: &plan::ReadAhead<'_>,
    providers: &Providers,
    pre: &Preflight,
    asked: Asked<'_>,
    moved: Vec<plan::MovedLine>,
) -> Result<Plan, CommandError> {
    let mut plan = make_plan(
        config,
        state,
        ahead,
        providers,
        asked.refresh,
        pre,
        asked.targeting,
    )
    .await?;
    plan.moved = moved;
    warn_targeting(&plan.targets, false);
    if !asked.allow_no_offers {
        if let Some(e) = preflight::no_offers_error(&plan, false) {
            return Err(e.into());
        }
    }
    Ok(plan)
}

/// Makes a plan: config + state (+ refresh) → changes, with the offers and prices the
/// preflight catalog lookups found.
pub(super) async fn make_plan(
    config: &Config,
    state: &StateFile,
    ahead: &plan::ReadAhead<'_>,
    providers: &Providers,
    refresh: bool,
    pre: &Preflight,
    targeting: &TargetArgs,
) -> Result<Plan, Report> {
    let observed = if refresh {
        Some(plan::refresh(state, providers).await.map_err(|e| {
            miette!(
                help = "pass --refresh=false to plan from the state alone",
                "{e}"
            )
        })?)
    } else {
        None
    };
    // A new machine's price is that of the first offer apply will try.
    let first_price = |vm: &crate::config::VmSpec| {
        pre.offers
            .get(&vm.name)
            .and_then(|o| o.first())
            .map(|o| o.price_per_hour)
    };
    let mut plan = plan::compute_with(config, state, ahead, observed.as_ref(), &first_price)
        .map_err(|e| miette!(help = "inspect it with `gpuprov state show ADDRESS`; restore the .backup if it was edited by hand", "{e}"))?;
    apply_targeting(&mut plan, state, targeting, &first_price)?;
    plan::check_identity_clash(&plan, state).map_err(|e| {
        miette!(
            code = "gpuprov::plan::name_in_use",
            help = "clouds keep the name a machine was created under; see `gpuprov state show ADDRESS` (cloud_name)",
            "{e}"
        )
    })?;
    for c in plan.changes.iter_mut() {
        if c.desired.is_some() {
            c.effective = pre.effective.get(&c.vm).cloned().unwrap_or_default();
        }
        if matches!(c.action, Action::Create | Action::Replace | Action::Resume) {
            let found = pre.offers.get(&c.vm).map(Vec::as_slice).unwrap_or_default();
            c.offers = plan::offer_lines(found, &c.preempted);
            c.no_offers = pre.no_offers.get(&c.vm).cloned().unwrap_or_default();
        }
    }
    plan.reprice_preempted();
    if refresh {
        let offered = pre.offers.values().flatten().map(|o| o.location.clone());
        let locations = plan::discovery::locations(offered, state);
        let found = plan::discovery::discover(&locations, providers).await;
        plan::discovery::fold(&mut plan, state, &found);
    }
    for name in providers.names() {
        if let Some(ep) = providers.get(name).and_then(|p| p.endpoint_override()) {
            plan.endpoints.insert(name.to_string(), ep);
        }
    }
    Ok(plan)
}

/// Runs the catalog lookups ([`preflight`]) and decodes the state's records
/// ([`plan::ReadAhead`]) side by side: the two are independent and, at 10,000 machines,
/// most of a plan's time (issue 20). The lookups run on a thread of their own (driven by
/// the multi-threaded runtime that `run_cli` starts), the decode on every core; a small
/// state, or a runtime with one thread, runs them one after the other.
///
/// Errors: [`preflight`]'s.
pub(super) async fn preflight_reading_ahead<'s>(
    config: &Config,
    state: &'s StateFile,
    providers: &Providers,
) -> Result<(Preflight, plan::ReadAhead<'s>), Report> {
    let rt = tokio::runtime::Handle::current();
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    if state.resources.len() < plan::read_ahead::PARALLEL_FROM
        || rt.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread
        || cores < 2
    {
        let pre = preflight(config, providers).await?;
        return Ok((pre, plan::ReadAhead::of(state, cores)));
    }
    // The calling task blocks while both run: its worker hands its other tasks on.
    tokio::task::block_in_place(|| {
        std::thread::scope(|s| {
            let pre = s.spawn(|| rt.block_on(preflight(config, providers)));
            let ahead = plan::ReadAhead::of(state, cores);
            let pre = pre
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))?;
            Ok((pre, ahead))
        })
    })
}

/// Applies `-replace` and then `-target` to a computed plan (before offers are attached,
/// so a forced replacement gets them too).
fn apply_targeting(
    plan: &mut Plan,
    state: &StateFile,
    t: &TargetArgs,
    first_price: &dyn Fn(&crate::config::VmSpec) -> Option<f64>,
) -> Result<(), Report> {
    plan::force_replace(plan, state, &t.replace, first_price).map_err(|e| {
        miette!(
            code = "gpuprov::plan::replace",
            help = "-replace names a machine of both the config and the state, for example vm.gpu",
            "{e}"
        )
    })?;
    if t.targets.is_empty() {
        return Ok(());
    }
    for target in &t.targets {
        if !plan.changes.iter().any(|c| &c.address == target) {
            let known: Vec<&str> = plan.changes.iter().map(|c| c.address.as_str()).collect();
            return Err(miette!(
                code = "gpuprov::plan::no_such_target",
                help = format!("machines in the config or the state: {}", known.join(", ")),
                "-target {target}: no such machine in the config or the state"
            ));
        }
    }
    plan::restrict_to_targets(plan, state, &t.targets);
    Ok(())
}

/// Checks the addresses of `-target` and `-replace` (`vm.NAME`).
pub(super) fn check_targeting(targets: &[String], replace: &[String]) -> Result<(), CommandError> {
    targets
        .iter()
        .chain(replace)
        .try_for_each(|a| state_mv::check_address(a))
}

/// Terraform's warnings for `-target`, on stderr (JSON on stdout stays clean): before a
/// targeted plan, and after a targeted apply that the rest may still be pending.
pub(super) fn warn_targeting(targets: &[String], applied: bool) {
    if targets.is_empty() {
        return;
    }
    if applied {
        errln!(
            "\nWarning: Applied changes may be incomplete\n\n  The plan was created with the -target option in effect, so some changes requested\n  in the configuration may have been ignored. Run `gpuprov plan` to verify that no\n  other changes are pending.\n"
        );
    } else {
        errln!(
            "\nWarning: Resource targeting is in effect\n\n  You are creating a plan with the -target option, which means that the result may not\n  represent all of the changes requested by the current configuration.\n\n  The -target option is not for routine use, and is provided only for exceptional\n  situations such as recovering from errors or mistakes.\n"
        );
    }
}

/// Applies the config's `[[moved]]` blocks to `state` in memory (see
/// [`plan::apply_moved`]).
pub(super) fn apply_moved(
    config: &Config,
    state: &mut StateFile,
) -> Result<Vec<plan::MovedLine>, Report> {
    plan::apply_moved(config, state).map_err(|e| Report::new(*e))
}

/// Applies `--k8s` / `--no-k8s` to every machine of `config`. `--k8s` counts as written
/// explicitly, so a machine whose clouds cannot host k3s is rejected up front.
pub(super) fn apply_k8s_flags(config: &mut Config, k: &K8sArgs) {
    for vm in config.vms.values_mut() {
        if k.k8s {
            vm.kubernetes = true;
            vm.kubernetes_explicit = true;
        } else if k.no_k8s {
            vm.kubernetes = false;
            vm.kubernetes_explicit = false;
        }
    }
}

/// Skips freeing `data` (plain data, no handle or lock) at the end of a one-shot
/// command: the process exits next and the OS takes the memory back at once, while
/// freeing a 10,000-machine state and plan allocation by allocation costs a sixth of
/// the plan's time (issue 20, callgrind).
pub(super) fn forget_at_exit<T>(data: T) {
    std::mem::forget(data);
}
