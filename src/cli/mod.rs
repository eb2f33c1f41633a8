//! The CLI layer: wires commands to the library, renders output, and maps errors to exit
//! codes. Architecture invariant: only this module prints or exits.
//!
//! Exit codes ([`EXIT_CODES`]): 0 success (or no changes with `--detailed-exitcode`), 1
//! error, 2 changes present (`plan --detailed-exitcode`), 130 interrupted, 255 a bug.

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

mod apply;
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
mod key;
mod kube;
mod list;
mod man;
mod offers;
mod plan;
mod preflight;
mod progress;
mod project;
mod providers;
mod run;
mod show;
mod ssh;
mod state_migrate;
mod state_mv;
mod state_pull;
mod state_push;
mod state_recover;
mod state_rm;
mod state_show;
mod status;
mod sweep;
mod validate;
pub mod view;

use std::io::IsTerminal;
use std::process::ExitCode;

use crate::graph::ResourceGraph;

use apply::Mode;
use args::{Cli, Command, StateCommand};
use error::{CmdResult, CommandError};
pub use error::{Exit, EXIT_CODES};
pub use project::data_home;
use project::Project;

/// Entry point of the `gpuprov` binary: parses the command line (after [`argv`]'s
/// single-dash normalisation), runs the command, prints a failure's diagnostic and
/// returns the exit code of the table in [`error::EXIT_CODES`].
pub fn main() -> ExitCode {
    // Diagnostics are coloured on a terminal unless NO_COLOR or --no-color (known once
    // parsed) says otherwise; usage errors are rendered before that.
    error::install_report_hook(
        std::env::var_os("NO_COLOR").is_none() && std::io::stderr().is_terminal(),
    );
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
    error::color_reports(color);
    init_logging(color);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| CommandError::internal(format!("cannot start the async runtime: {e}")))?;
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

/// Runs the parsed command in the current directory (after `-chdir`).
async fn run(cli: Cli, color: bool) -> CmdResult {
    let project = Project::new(&cli);
    match &cli.command {
        Command::Plan(a) => plan::run(&cli, &project, a).await,
        Command::Apply(a) => apply::run(&cli, &project, Mode::Apply(a), color).await,
        Command::Destroy(a) => apply::run(&cli, &project, Mode::Destroy(a), color).await,
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
        Command::State(StateCommand::List) => state_show::list(&project),
        Command::State(StateCommand::Show { address }) => state_show::show(&project, address),
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
