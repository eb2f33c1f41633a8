//! The CLI layer: wires commands to the library, renders output, and maps errors to exit
//! codes. Architecture invariant: only this module prints or exits.
//!
//! Exit codes: 0 success (or no changes with `--detailed-exitcode`), 1 error, 2 changes
//! present (`plan --detailed-exitcode`), 130 interrupted.

// Output macros: like println!/eprintln!, but a closed stdout or stderr (a broken pipe,
// as in `gpuprov status | head -1`) is ignored instead of panicking, as ripgrep does; a
// run in progress is never aborted because its output went away.
macro_rules! outln {
    ($($t:tt)*) => {{ use std::io::Write as _; let _ = writeln!(std::io::stdout(), $($t)*); }};
}
macro_rules! out {
    ($($t:tt)*) => {{ use std::io::Write as _; let _ = write!(std::io::stdout(), $($t)*); }};
}
macro_rules! errln {
    ($($t:tt)*) => {{ use std::io::Write as _; let _ = writeln!(std::io::stderr(), $($t)*); }};
}
macro_rules! err {
    ($($t:tt)*) => {{ use std::io::Write as _; let _ = write!(std::io::stderr(), $($t)*); }};
}

pub mod args;
mod argv;
mod color;
mod completion;
pub mod error;
#[cfg(feature = "test-doubles")]
mod fake_cloud;
mod force_unlock;
mod health;
mod import;
mod interrupt;
pub mod json;
mod kube;
mod list;
mod man;
mod offers;
mod preflight;
mod progress;
mod show;
mod ssh;
mod state_migrate;
mod state_mv;
mod state_pull;
mod state_push;
mod state_recover;
mod state_rm;
mod status;
mod sweep;
mod validate;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use miette::{miette, Context, IntoDiagnostic, Report};

use crate::config::BackendSettings;
use crate::config::{Cloud, Config};
use crate::engine::{Engine, Outcome, StateJournal};
use crate::graph::ResourceGraph;
use crate::machine::{CancelToken, Executor, Providers};
use crate::plan::{self, Action, Plan};
use crate::provider::docker::{DockerProvider, DockerSettings};
use crate::provider::Lineage;
use crate::ssh::client::Ssh2Connector;
use crate::ssh::keys::ProjectKey;
use crate::ssh::supply::{KeyRequest, KeySupply, SshIdentity, ENV_AGENT, ENV_PRIVATE_KEY};
use crate::state::lock::StateLock;
use crate::state::{Backend, StateFile, StateStore};

use error::{CmdResult, CommandError};
pub use error::{Exit, EXIT_CODES};
use preflight::{preflight, Preflight};

use args::{ApplyArgs, Cli, Command, DestroyArgs, K8sArgs, PlanArgs, StateCommand, TargetArgs};

/// Entry point of the `gpuprov` binary: parses the command line (after [`argv`]'s
/// single-dash normalisation), runs the command, prints a failure's diagnostic and
/// returns the exit code of the table in [`error::EXIT_CODES`].
pub fn main() -> ExitCode {
    // Diagnostics are coloured on a terminal unless NO_COLOR or --no-color (known once
    // parsed) says otherwise; usage errors are rendered before that.
    COLOR.store(
        std::env::var_os("NO_COLOR").is_none() && std::io::stderr().is_terminal(),
        std::sync::atomic::Ordering::Relaxed,
    );
    let _ = miette::set_hook(Box::new(|_| {
        let color = COLOR.load(std::sync::atomic::Ordering::Relaxed);
        Box::new(
            miette::MietteHandlerOpts::new()
                .color(color)
                .unicode(color)
                .terminal_links(false)
                .build(),
        )
    }));
    let outcome = match parse(std::env::args_os().collect()) {
        Ok(Some(cli)) => run_cli(cli),
        Ok(None) => Ok(Exit::Success),
        Err(e) => Err(e),
    };
    match outcome {
        Ok(exit) => exit.into(),
        Err(e) => {
            e.print();
            e.exit().into()
        }
    }
}

/// Whether diagnostics are coloured (read by the miette hook at each report).
static COLOR: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Parses `args` (the program name first): `None` when clap printed help or the version
/// (exit 0), else the command line; every usage error (clap's, or an unknown single-dash
/// word) is a [`error::Kind::Usage`] error, exit 1.
///
/// # Errors
///
/// The usage error, to print with [`CommandError::print`].
pub fn parse(args: Vec<std::ffi::OsString>) -> Result<Option<Cli>, CommandError> {
    use clap::FromArgMatches;
    let mut command = args::command();
    command.build();
    let args = argv::normalize(&command, args)?;
    let matches = match command.try_get_matches_from_mut(args) {
        Ok(m) => m,
        // `--help`, `--version`: clap's text on stdout, and success.
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    Ok(Some(Cli::from_arg_matches(&matches)?))
}

fn run_cli(cli: Cli) -> CmdResult {
    if let Some(dir) = &cli.chdir {
        std::env::set_current_dir(dir).map_err(|e| {
            CommandError::usage(
                format!("-chdir={}: cannot switch to it: {e}", dir.display()),
                Some(
                    "-chdir names an existing directory; the config and state are read from there"
                        .into(),
                ),
            )
        })?;
    }
    let color =
        !cli.no_color && std::env::var_os("NO_COLOR").is_none() && std::io::stderr().is_terminal();
    COLOR.store(color, std::sync::atomic::Ordering::Relaxed);
    init_logging(color);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| miette!("cannot start the async runtime: {e}"))?;
    rt.block_on(async {
        interrupt::install_default();
        run(cli, color).await
    })
}

fn init_logging(color: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("GPUPROV_LOG")
        // The AWS SDK warns on every credential source it tries; its errors say enough.
        .unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new("warn,aws_config=error,aws_smithy_runtime=error")
        });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(color)
        .with_writer(std::io::stderr)
        .try_init();
}

/// One project: its config, and where its state lives (the backend, opened on first
/// use).
struct Project {
    config_path: PathBuf,
    /// The local state file: `--state`, else `gpuprov.state.json` beside the config.
    state_path: PathBuf,
    /// Whether `--state` was given (it names a local file, so a remote backend refuses it).
    state_flag: bool,
    /// `GPUPROV_BACKEND_CONFIG`'s pairs, then `--backend-config`'s: two layers, applied
    /// in that order.
    backend_overrides: [Vec<String>; 2],
    backend: std::sync::OnceLock<Arc<dyn Backend>>,
    /// The `[backend]` table of the config as [`Project::load_config`] read it, so that
    /// opening the backend after loading the config does not parse the file again (a
    /// second parse was a tenth of a large plan's time).
    config_backend: std::sync::OnceLock<Option<BackendSettings>>,
    /// `--ssh-key` / `GPUPROV_SSH_KEY_FILE`.
    ssh_key: Option<PathBuf>,
}

impl Project {
    fn new(cli: &Cli) -> Project {
        let state_path = cli
            .state
            .clone()
            .unwrap_or_else(|| project_root(&cli.config).join("gpuprov.state.json"));
        Project {
            config_path: cli.config.clone(),
            state_path,
            state_flag: cli.state.is_some(),
            backend_overrides: backend_overrides(cli),
            backend: std::sync::OnceLock::new(),
            config_backend: std::sync::OnceLock::new(),
            ssh_key: cli.ssh_key.clone(),
        }
    }

    fn load_config(&self) -> Result<Config, Report> {
        let config = Config::load(&self.config_path).map_err(Report::new)?;
        let _ = self.config_backend.set(config.backend.clone());
        Ok(config)
    }

    /// The backend settings: `base` pairs on an empty table (`state migrate --from/--to`),
    /// else the config's `[backend]` (when the config exists) with the layers of
    /// `GPUPROV_BACKEND_CONFIG` and then `--backend-config` applied.
    fn backend_settings(&self, base: Option<&[String]>) -> Result<BackendSettings, Report> {
        let mut settings = match base {
            // An explicit backend (`state migrate --from/--to`) starts from scratch.
            Some(_) => BackendSettings::default(),
            None if self.config_backend.get().is_some() => self
                .config_backend
                .get()
                .cloned()
                .flatten()
                .unwrap_or_default(),
            None if self.config_path.exists() => self.load_config()?.backend.unwrap_or_default(),
            None => BackendSettings::default(),
        };
        let layers: Vec<&[String]> = match base {
            Some(pairs) => vec![pairs],
            None => self.backend_overrides.iter().map(Vec::as_slice).collect(),
        };
        for pairs in layers {
            settings = settings.with_overrides(pairs).map_err(|e| {
                miette!(
                    help = "pairs are KEY=VALUE, keys as in [backend]: type, path, bucket, key, region, endpoint, force_path_style, schema, name",
                    "{e}"
                )
            })?;
        }
        Ok(settings)
    }

    /// Opens the backend `settings` describe.
    fn open_backend(&self, settings: &BackendSettings) -> Result<Arc<dyn Backend>, Report> {
        if self.state_flag && settings.kind != crate::config::BackendKind::Local {
            return Err(miette!(
                help = "drop --state (GPUPROV_STATE), or select the local backend with --backend-config type=local",
                "--state names a local state file, but the backend is {}",
                settings.kind.as_str()
            ));
        }
        let mut settings = settings.clone();
        if self.state_flag {
            settings.path = Some(self.state_path.clone());
        }
        crate::state::open_backend(
            &settings,
            &self.state_path,
            &project_root(&self.config_path),
        )
        .map_err(Report::new)
    }

    /// The project's backend (the config's, with the overrides), opened once.
    fn backend(&self) -> Result<Arc<dyn Backend>, Report> {
        if let Some(b) = self.backend.get() {
            return Ok(b.clone());
        }
        let settings = self.backend_settings(None)?;
        let b = self.open_backend(&settings)?;
        Ok(self.backend.get_or_init(|| b).clone())
    }

    /// Where the state lives, for messages.
    fn location(&self) -> String {
        match self.backend.get() {
            Some(b) => b.location().display().to_string(),
            None => self.state_path.display().to_string(),
        }
    }

    fn open_state(&self) -> Result<(StateStore, StateFile), Report> {
        let backend = self.backend()?;
        crate::state::backend::bridge::blocking(|| StateStore::open_in(backend))
            .map_err(Report::new)
    }

    fn lock(&self, operation: &str, timeout: Duration) -> Result<StateLock, Report> {
        let backend = self.backend()?;
        lock_backend(&*backend, operation, timeout)
    }
}

/// The backend overrides in the order they apply: `GPUPROV_BACKEND_CONFIG`'s pairs, then
/// `--backend-config`'s (a flag refines the environment, as on the command line of CI).
fn backend_overrides(cli: &Cli) -> [Vec<String>; 2] {
    let env = std::env::var("GPUPROV_BACKEND_CONFIG").unwrap_or_default();
    let env = env
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(String::from)
        .collect();
    [env, cli.backend_config.clone()]
}

/// Takes `backend`'s lock, reporting a stale record left by a dead holder.
fn lock_backend(
    backend: &dyn Backend,
    operation: &str,
    timeout: Duration,
) -> Result<StateLock, Report> {
    // Waiting for the lock blocks; tell the runtime so other tasks keep running. One try
    // first, so a wait is announced with its holder instead of looking like a hang.
    let acquire = |timeout| {
        crate::state::backend::bridge::blocking(|| {
            StateLock::acquire_on(backend, operation, timeout)
        })
    };
    let first = match acquire(Duration::ZERO) {
        Err(crate::state::lock::LockError::Held { info, .. }) if !timeout.is_zero() => {
            let holder = info.map_or_else(
                || "another process".to_string(),
                |i| format!("{} by {}, pid {}", i.operation, i.who, i.pid),
            );
            errln!(
                "Acquiring state lock… held by {holder}; waiting up to {} (--lock-timeout)",
                humantime::format_duration(timeout)
            );
            acquire(timeout)
        }
        other => other,
    };
    let (lock, stale) = first.map_err(Report::new)?;
    if let Some(info) = stale {
        errln!(
            "note: a previous lock ({} by {}, pid {}, {}) was not released; that process is gone, so the lock was taken over",
            info.operation,
            info.who,
            info.pid,
            info.created.format("%Y-%m-%d %H:%M:%S UTC")
        );
    }
    Ok(lock)
}

/// The config's directory (`.` for a bare file name).
fn project_root(config: &Path) -> PathBuf {
    config
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf()
}

/// gpuprov's per-user data directory: `$GPUPROV_HOME`, else the platform's local data
/// directory (`~/.local/share/gpuprov` on Linux).
pub fn data_home() -> PathBuf {
    if let Some(h) = std::env::var_os("GPUPROV_HOME") {
        return PathBuf::from(h);
    }
    dirs::data_local_dir()
        .map(|d| d.join("gpuprov"))
        .unwrap_or_else(|| PathBuf::from(".gpuprov"))
}

/// The per-project directory (keys, ssh config), keyed by the state's lineage.
fn project_dir(lineage: &str) -> PathBuf {
    data_home().join("projects").join(lineage)
}

fn docker_provider(config: Option<&Config>, lineage: &Lineage) -> DockerProvider {
    let s = config
        .map(|c| c.cloud_settings(Cloud::Docker))
        .unwrap_or_default();
    DockerProvider::new(DockerSettings::from_env_and_config(
        s.endpoint,
        s.base_image,
        lineage.clone(),
    ))
}

/// The state's lineage, typed; a state whose lineage is not a UUID is refused with a
/// diagnostic naming the state file (it is never overwritten).
fn lineage_of(state: &crate::state::StateFile) -> Result<Lineage, Report> {
    Lineage::parse(&state.lineage).map_err(|e| {
        miette!(
            help = "the lineage is the state's identity; restore the state from its .backup",
            "the state's lineage is unusable: {}",
            e.text()
        )
    })
}

/// The adapters of the clouds the config uses (those this build has), from the cloud
/// registry (`provider::registry`). A run that may touch what the state records adds
/// those clouds' adapters with [`add_recorded_clouds`].
fn build_providers(config: &Config, lineage: &Lineage) -> Providers {
    #[cfg(feature = "test-doubles")]
    if fake_cloud::enabled() {
        let mut p = fake_cloud::providers(config);
        keep_shared_of(config, &mut p);
        return p;
    }
    let mut p = Providers::new();
    for cloud in config.clouds_in_use() {
        if let Some(adapter) = cloud.build(&config.cloud_settings(cloud), lineage.clone()) {
            p.insert(adapter);
        }
    }
    keep_shared_of(config, &mut p);
    p
}

/// Adds to `p` the adapter of each cloud of `recorded` (clouds the state holds something
/// on: [`recorded_clouds`]) that it lacks, from the registry: a machine whose cloud left
/// the config, or a `destroy` without a config, is torn down all the same. Its settings
/// are the config's `[cloud.NAME]` when there is one, else the defaults; the environment
/// (endpoint override, credentials) applies either way, as for any adapter. A name this
/// build has no adapter for is skipped: teardown then reports the machine leaked, naming
/// the cloud.
fn add_recorded_clouds(
    p: &mut Providers,
    config: Option<&Config>,
    recorded: impl IntoIterator<Item = String>,
    lineage: &Lineage,
) {
    for name in recorded {
        if p.get(&name).is_some() {
            continue;
        }
        let Some(cloud) = Cloud::from_name(&name) else {
            continue;
        };
        #[cfg(feature = "test-doubles")]
        if fake_cloud::enabled() {
            p.insert(fake_cloud::provider(cloud));
            continue;
        }
        let settings = config
            .map(|c| c.cloud_settings(cloud))
            .unwrap_or_default();
        if let Some(adapter) = cloud.build(&settings, lineage.clone()) {
            p.insert(adapter);
        }
    }
    if let Some(config) = config {
        keep_shared_of(config, p);
    }
}

/// The clouds `state` holds something on: those of its machine records (decoded in
/// `ahead`) and of its shared objects (`shared.<cloud>.…`), by name.
fn recorded_clouds(state: &StateFile, ahead: &plan::ReadAhead<'_>) -> BTreeSet<String> {
    let mut out = ahead.clouds();
    out.extend(shared_clouds(state));
    out
}

/// The clouds of `state`'s shared objects, by name (from their addresses).
fn shared_clouds(state: &StateFile) -> impl Iterator<Item = String> + '_ {
    state
        .shared
        .keys()
        .filter_map(|a| crate::provider::SharedObject::parse(a))
        .map(|o| o.cloud)
}

/// Marks the clouds set to `keep_shared` in any `[cloud.NAME]` section, also one no
/// machine uses any more (its objects are then exactly what destroy would release), as
/// the plan reads it.
fn keep_shared_of(config: &Config, p: &mut Providers) {
    for (cloud, settings) in &config.clouds {
        if settings.keep_shared == Some(true) {
            p.keep_shared(cloud.as_str());
        }
    }
}

/// The "available clouds" hint for diagnostics.
fn clouds_in_this_build() -> String {
    Cloud::in_this_build()
        .map(|c| c.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

async fn run(cli: Cli, color: bool) -> CmdResult {
    let project = Project::new(&cli);
    match &cli.command {
        Command::Plan(a) => cmd_plan(&cli, &project, a).await,
        Command::Apply(a) => cmd_apply(&cli, &project, a, color).await,
        Command::Destroy(a) => cmd_destroy(&cli, &project, a, color).await,
        Command::Status(a) => status::run(&project, a).await,
        Command::List(a) => list::run(&project, a),
        Command::Show(a) => show::run(a, color::stdout_color(cli.no_color)),
        Command::Ssh(a) => ssh::run(&project, a).await,
        Command::Graph => {
            let config = project.load_config()?;
            out!("{}", ResourceGraph::build(&config.vms).to_dot());
            Ok(Exit::Success)
        }
        Command::Validate(a) => validate::run(&project, a).await,
        Command::Offers(a) => offers::cmd_offers(&project, a).await,
        Command::Kubeconfig(a) => kube::cmd_kubeconfig(&project, a).await,
        Command::Tunnel(a) => kube::cmd_tunnel(&project, a).await,
        Command::Health(a) => health::run(&project, a).await,
        Command::Completion(a) => completion::run(a),
        Command::Man(a) => man::run(a),
        Command::State(StateCommand::List) => {
            let (_, state) = project.open_state()?;
            for a in state.resources.keys() {
                outln!("{a}");
            }
            Ok(Exit::Success)
        }
        Command::State(StateCommand::Show { address }) => {
            let (_, state) = project.open_state()?;
            let r = state.resources.get(address).ok_or_else(|| {
                miette!(
                    help = format!(
                        "addresses in the state: {}",
                        state
                            .resources
                            .keys()
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    "no resource {address} in {}",
                    project.location()
                )
            })?;
            outln!("{}", serde_json::to_string_pretty(r).into_diagnostic()?);
            Ok(Exit::Success)
        }
        Command::State(StateCommand::Pull) => state_pull::run(&project),
        Command::State(StateCommand::Push(a)) => state_push::run(&cli, &project, a),
        Command::State(StateCommand::Migrate(a)) => state_migrate::run(&cli, &project, a),
        Command::State(StateCommand::Rm(a)) => state_rm::run(&cli, &project, a),
        Command::State(StateCommand::Mv(a)) => state_mv::run(&cli, &project, a),
        Command::State(StateCommand::Recover(a)) => {
            state_recover::run(&cli, &project, a, color).await
        }
        Command::Sweep(a) => sweep::run(&cli, &project, a).await,
        Command::Import(a) => import::run(&cli, &project, a).await,
        Command::ForceUnlock(a) => force_unlock::run(&project, a),
    }
}

/// Makes a plan: config + state (+ refresh) → changes, with the offers and prices the
/// preflight catalog lookups found.
async fn make_plan(
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
async fn preflight_reading_ahead<'s>(
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
fn check_targeting(targets: &[String], replace: &[String]) -> Result<(), CommandError> {
    targets
        .iter()
        .chain(replace)
        .try_for_each(|a| state_mv::check_address(a))
}

/// Terraform's warnings for `-target`, on stderr (JSON on stdout stays clean): before a
/// targeted plan, and after a targeted apply that the rest may still be pending.
fn warn_targeting(targets: &[String], applied: bool) {
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
fn apply_moved(config: &Config, state: &mut StateFile) -> Result<Vec<plan::MovedLine>, Report> {
    plan::apply_moved(config, state).map_err(|e| Report::new(*e))
}

/// Applies `--k8s` / `--no-k8s` to every machine of `config`. `--k8s` counts as written
/// explicitly, so a machine whose clouds cannot host k3s is rejected up front.
fn apply_k8s_flags(config: &mut Config, k: &K8sArgs) {
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

async fn cmd_plan(cli: &Cli, project: &Project, a: &PlanArgs) -> CmdResult {
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
    let mut plan = make_plan(
        &config,
        &state,
        &ahead,
        &providers,
        a.refresh.refresh,
        &pre,
        &a.targeting,
    )
    .await?;
    plan.moved = moved;
    warn_targeting(&plan.targets, false);
    if !a.allow_no_offers {
        if let Some(e) = preflight::no_offers_error(&plan, false) {
            return Err(e.into());
        }
    }
    // Notes go to stderr, so `--json` output stays machine-readable.
    for n in &pre.notes {
        errln!("note: {n}");
    }
    if a.json {
        let json = json::JsonPlan::of(&plan);
        outln!("{}", serde_json::to_string_pretty(&json).into_diagnostic()?);
    } else if a.markdown {
        out!("{}", plan::markdown::render(&plan));
    } else {
        let color = color::stdout_color(cli.no_color);
        out!("{}", color::plan(&plan::render(&plan), color));
    }
    show::write_step_summary(&plan)?;
    if let Some(out) = &a.out {
        let text = serde_json::to_string_pretty(&plan).into_diagnostic()?;
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

/// Skips freeing `data` (plain data, no handle or lock) at the end of a one-shot
/// command: the process exits next and the OS takes the memory back at once, while
/// freeing a 10,000-machine state and plan allocation by allocation costs a sixth of
/// the plan's time (issue 20, callgrind).
fn forget_at_exit<T>(data: T) {
    std::mem::forget(data);
}

fn confirm(cli: &Cli, what: &str, auto_approve: bool) -> Result<bool, Report> {
    if auto_approve {
        return Ok(true);
    }
    if !cli.input {
        return Err(miette!(
            help = "pass --auto-approve to run without confirmation (for example in CI)",
            "{what} needs confirmation, but input is off (--input=false)"
        ));
    }
    if !std::io::stdin().is_terminal() {
        return Err(miette!(
            help = "pass --auto-approve to run without confirmation (for example in CI)",
            "{what} needs confirmation, but standard input is not a terminal"
        ));
    }
    err!("\nDo you want to perform these actions?\n  Only 'yes' will be accepted to approve.\n\n  Enter a value: ");
    let _ = std::io::stderr().flush();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).into_diagnostic()?;
    Ok(line.trim() == "yes")
}

/// Listens for Ctrl-C and SIGTERM (what CI runners send on timeout): the first asks the
/// machines to compensate, the second makes them exit leaving the journal resumable.
fn spawn_signal_handler(cancel: CancelToken) {
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

struct Run {
    journal: Arc<StateJournal>,
    engine: Engine,
    progress: progress::Renderer,
    /// The kubeconfigs of the state's clusters as the run started (see
    /// `kube::forget_cluster`).
    clusters: BTreeMap<String, (String, crate::cluster::kubeconfig::Kubeconfig)>,
    /// The project key the run logs in with (the ssh config names it).
    key: ProjectKey,
}

fn start_run(
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
    if fake_cloud::enabled() {
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

/// What decides how the project key is found: whether a fresh project may generate it
/// here (`apply`), must connect with it (`ssh`, `tunnel`), or only might need it
/// (`destroy`, which never logs in: without the key it runs with its public half).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyUse {
    Apply,
    Connect,
    Destroy,
}

/// The project key this machine uses for `state` ([`crate::ssh::supply`]): the one the
/// state records, from `GPUPROV_SSH_PRIVATE_KEY`, `--ssh-key` / `GPUPROV_SSH_KEY_FILE`,
/// the SSH agent or the per-project key file; a fresh project's `apply` may generate it.
/// Never generates a key for a state that records one.
fn project_key(project: &Project, state: &StateFile, usage: KeyUse) -> Result<ProjectKey, Report> {
    let supply = KeySupply {
        // Read here and held as a Secret from now on; never echoed.
        private_key_text: std::env::var(ENV_PRIVATE_KEY)
            .ok()
            .filter(|t| !t.trim().is_empty())
            .map(crate::provider::redact::Secret::new),
        key_file: project.ssh_key.clone(),
        agent_socket: crate::provider::env_nonempty(ENV_AGENT).map(PathBuf::from),
    };
    let short: String = state.lineage.chars().take(8).collect();
    let dir = project_dir(&state.lineage);
    let comment = format!("gpuprov-{short}");
    let request = KeyRequest {
        recorded: state.ssh.as_ref(),
        has_machines: !state.resources.is_empty(),
        project_dir: &dir,
        comment: &comment,
        may_generate: usage == KeyUse::Apply,
    };
    match crate::ssh::supply::resolve(&supply, &request) {
        Ok(key) => Ok(key),
        Err(e) if usage == KeyUse::Destroy => {
            // Teardown never logs in; logins (there are none) would fail with this reason.
            let public = state.ssh.as_ref().map(|s| s.public_key.clone());
            Ok(ProjectKey::unavailable(
                public.unwrap_or_default(),
                e.to_string(),
            ))
        }
        Err(e) => Err(Report::new(e)),
    }
}

/// Records `key`'s public identity in a state that has none yet, and saves it before any
/// machine runs, so a run killed later still leaves the fingerprint for the next machine.
fn record_key(
    store: &mut StateStore,
    state: &mut StateFile,
    key: &ProjectKey,
) -> Result<(), Report> {
    if state.ssh.is_some() {
        return Ok(());
    }
    let Some(identity) = SshIdentity::of(key) else {
        return Ok(());
    };
    state.ssh = Some(identity);
    store.save(state).map_err(Report::new)
}

/// Ends a run: saves the state (or the `.errored` copy), writes the ssh config, prints
/// the outcomes and returns the exit code.
async fn finish_run(
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
            Outcome::Failed(why) if cancelled && why.ends_with(crate::vm::launch::CANCELLED) => {
                interrupted = true;
                errln!("{address}: interrupted; what it was creating is torn down");
            }
            Outcome::Failed(why) => {
                failed = true;
                errln!("{address}: FAILED: {why}");
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

async fn cmd_apply(cli: &Cli, project: &Project, a: &ApplyArgs, color: bool) -> CmdResult {
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
            let mut plan = make_plan(
                &config,
                &state,
                &ahead,
                &providers,
                a.refresh.refresh,
                &pre,
                &a.targeting,
            )
            .await?;
            plan.moved = moved;
            warn_targeting(&plan.targets, false);
            if !a.allow_no_offers {
                if let Some(e) = preflight::no_offers_error(&plan, false) {
                    return Err(e.into());
                }
            }
            let color = color::stdout_color(cli.no_color);
            out!("{}", color::plan(&plan::render(&plan), color));
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
        store.save(&mut state).map_err(Report::new)?;
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

async fn cmd_destroy(cli: &Cli, project: &Project, a: &DestroyArgs, color: bool) -> CmdResult {
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
