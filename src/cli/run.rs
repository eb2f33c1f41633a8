//! A run of the engine, as `apply`, `destroy` and `state recover` start and end it: the
//! journal, the live display and the Ctrl-C handler set up; then the state saved, the
//! ssh config written, each outcome said and the exit code chosen.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use miette::{miette, Report};

use crate::engine::{Engine, FailureKind, Outcome, StateJournal};
use crate::machine::{CancelToken, Executor, Providers};
use crate::plan::Action;
use crate::ssh::client::Ssh2Connector;
use crate::ssh::keys::ProjectKey;
use crate::state::{StateFile, StateStore};

use super::error::{CmdResult, CommandError, Exit};
#[cfg(feature = "test-doubles")]
use super::fake_cloud;
use super::key::record_key;
use super::project::project_dir;
use super::{interrupt, kube, progress, ssh};

/// Listens for Ctrl-C and SIGTERM (what CI runners send on timeout): the first asks the
/// machines to compensate, the second makes them exit leaving the journal resumable.
pub(super) fn spawn_signal_handler(cancel: CancelToken) {
    interrupt::take_over();
    tokio::spawn(async move {
        #[cfg(unix)]
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        loop {
            #[cfg(unix)]
            {
                let t = async {
                    match term.as_mut() {
                        Some(t) => t.recv().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = t => {}
                }
            }
            #[cfg(not(unix))]
            let _ = tokio::signal::ctrl_c().await;
            let level = cancel.escalate();
            if progress::is_live() {
                // The live screen's header says it, and redraws at once.
                continue;
            }
            match level {
                1 => errln!(
                    "\nInterrupt received: stopping gracefully; machines being created are torn down.\nPress Ctrl-C again to exit at once (the state keeps where each machine was; the next apply resumes)."
                ),
                _ => errln!("\nSecond interrupt: exiting now; run `gpuprov apply` or `gpuprov destroy` to resume."),
            }
        }
    });
}

pub(super) struct Run {
    pub(super) journal: Arc<StateJournal>,
    pub(super) engine: Engine,
    pub(super) progress: progress::Renderer,
    /// The kubeconfigs of the state's clusters as the run started (see
    /// `kube::forget_cluster`).
    pub(super) clusters: BTreeMap<String, (String, crate::cluster::kubeconfig::Kubeconfig)>,
    /// The project key the run logs in with (the ssh config names it).
    pub(super) key: ProjectKey,
}

/// Starts a run of the engine on `state` with `providers`: records the key, opens the
/// journal, starts the live display and the Ctrl-C handler.
pub(super) fn start_run(
    mut state: StateFile,
    mut store: StateStore,
    providers: Providers,
    key: &ProjectKey,
    parallelism: u32,
    retry_until_up: bool,
    display: progress::Display,
) -> Result<Run, Report> {
    record_key(&mut store, &mut state, key)?;
    let lineage = state.lineage.clone();
    let lineage_dir = lineage.clone();
    let clusters = kube::clusters_of(&state);
    let journal = Arc::new(StateJournal::new(store, state).map_err(Report::new)?);
    let cancel = CancelToken::new();
    spawn_signal_handler(cancel.clone());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let progress = progress::Renderer::spawn(
        rx,
        progress::Options {
            verb: display.verb,
            machines: display.machines,
            live: progress::live_terminal(),
            color: display.color,
            cancel: cancel.clone(),
        },
    );
    let executor = Executor::new(journal.clone(), cancel).with_progress(tx);
    let engine = Engine {
        providers,
        connector: ssh_connector(key),
        journal: journal.clone(),
        executor,
        lineage,
        ssh_public_key: key.public_key_openssh.clone(),
        parallelism: parallelism as usize,
        retry_until_up,
        k3s: Some(crate::engine::K3sSetup {
            shell: Arc::new(crate::cluster::remote::SshNodeShell::new(key.clone())),
            api: Arc::new(crate::cluster::api::AccessConnector { key: key.clone() }),
            // Absolute: the path is recorded, and a relative GPUPROV_HOME would make it
            // depend on the directory apply ran in.
            kubeconfig_dir: std::path::absolute(project_dir(&lineage_dir).join("kube"))
                .unwrap_or_else(|_| project_dir(&lineage_dir).join("kube")),
            installer: installer_settings(),
            timeouts: Default::default(),
        }),
    };
    Ok(Run {
        journal,
        engine,
        progress,
        clusters,
        key: key.clone(),
    })
}

/// The SSH logins of a run (the fake cloud's in test builds that ask for it).
fn ssh_connector(key: &ProjectKey) -> Arc<dyn crate::ssh::Connector> {
    #[cfg(feature = "test-doubles")]
    if fake_cloud::enabled() || fake_cloud::ssh_only() {
        return fake_cloud::connector();
    }
    Arc::new(Ssh2Connector::new(key.clone(), Duration::from_secs(10)))
}

/// The installer's settings from the environment: `GPUPROV_K3S_INSTALL_URL` (an
/// air-gapped copy of the k3s install script: a URL, or a path on the machine) and
/// `GPUPROV_K3S_VERSION` (a k3s release such as `v1.31.4+k3s1`); unset or empty means the
/// official script and its stable channel.
fn installer_settings() -> crate::cluster::installer::InstallerConfig {
    crate::cluster::installer::InstallerConfig {
        k3s: crate::cluster::installer::K3sSource {
            install_url: crate::provider::env_nonempty("GPUPROV_K3S_INSTALL_URL"),
            version: crate::provider::env_nonempty("GPUPROV_K3S_VERSION"),
        },
        ..Default::default()
    }
}

/// Ends a run: saves the state (or the `.errored` copy), writes the ssh config, prints
/// the outcomes and returns the exit code.
pub(super) async fn finish_run(
    run: Run,
    outcomes: &BTreeMap<String, Outcome>,
    actions: &BTreeMap<String, Action>,
    verb: &str,
) -> CmdResult {
    let cancelled = run.engine.executor.cancel_token().level() > 0;
    let clusters = run.clusters;
    drop(run.engine);
    let display = run.progress.finish().await;
    if let Err(e) = run.journal.save_final() {
        if let crate::state::StateError::FinalSaveLost { state_json, .. } = &e {
            // Last resort: the only copy of what was created is this output.
            outln!("{state_json}");
        }
        return Err(Report::new(e).into());
    }
    let state = run.journal.snapshot();
    match ssh::write_ssh_config(&state, &run.key) {
        Ok(warnings) => warnings.iter().for_each(|w| errln!("warning: {w}")),
        Err(e) => errln!("warning: cannot write the ssh config: {e}"),
    }
    let mut failed = false;
    let mut internal = false;
    let mut interrupted = false;
    for (address, o) in outcomes {
        match o {
            Outcome::Ready(vm) => {
                let name = address.trim_start_matches("vm.");
                errln!(
                    "{address}: ready at {} ({}), ssh with: gpuprov ssh {name}",
                    vm.location,
                    vm.ssh,
                );
                if let Some(hint) = state
                    .resources
                    .get(address)
                    .and_then(|r| kube::ready_hint(name, r))
                {
                    errln!("  {hint}");
                }
            }
            Outcome::Updated => errln!("{address}: updated"),
            Outcome::Unchanged => {}
            Outcome::Destroyed => {
                if let Some((name, ours)) = clusters.get(address) {
                    let (changed, warnings) = kube::forget_cluster(name, ours);
                    for path in changed {
                        errln!(
                            "{address}: removed context gpuprov-{name} from {}",
                            path.display()
                        );
                    }
                    for w in warnings {
                        errln!("warning: {w}");
                    }
                }
            }
            // Ctrl-C stopped it and tore down what it was creating: not a failure.
            Outcome::Failed(f) if cancelled && f.kind == FailureKind::Cancelled => {
                interrupted = true;
                errln!("{address}: interrupted; what it was creating is torn down");
            }
            Outcome::Failed(f) => {
                failed = true;
                internal |= f.kind == FailureKind::Internal;
                errln!("{address}: FAILED: {f}");
            }
            Outcome::Leaked(why) => {
                failed = true;
                errln!("{address}: LEAKED (may still bill): {why}\n  the next `gpuprov apply` or `gpuprov destroy` retries the teardown");
            }
            Outcome::Interrupted(at) => {
                interrupted = true;
                errln!("{address}: interrupted while {at}; the next run resumes it");
            }
        }
    }
    display.print_summary(outcomes, cancelled);
    if interrupted || cancelled {
        errln!("\n{verb} interrupted; the state records where each machine is (`gpuprov status`).");
        return Ok(Exit::Interrupted);
    }
    if internal {
        return Err(CommandError::internal(format!(
            "{verb} stopped on a bug in gpuprov (see above)"
        )));
    }
    if failed {
        return Err(miette!(
            "{verb} finished with errors (see above); the state records where each machine is"
        )
        .into());
    }
    // Counted by what was planned, as Terraform's summary: a replacement adds and destroys.
    let action = |address: &str| actions.get(address).copied();
    let (mut added, mut changed, mut destroyed) = (0, 0, 0);
    for (address, o) in outcomes {
        match (o, action(address)) {
            (Outcome::Ready(_), Some(Action::Replace)) => {
                added += 1;
                destroyed += 1;
            }
            (Outcome::Ready(_), Some(Action::Resume | Action::Update)) | (Outcome::Updated, _) => {
                changed += 1
            }
            (Outcome::Ready(_), _) => added += 1,
            (Outcome::Destroyed, _) => destroyed += 1,
            _ => {}
        }
    }
    errln!(
        "\n{verb} complete! Resources: {added} added, {changed} changed, {destroyed} destroyed."
    );
    Ok(Exit::Success)
}
