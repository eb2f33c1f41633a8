//! The CLI's one error type and its exit codes, as jj's `CommandError`: every failure a
//! command returns is a [`CommandError`] whose [`Kind`] decides the exit code, and every
//! way a command ends is an [`Exit`]. [`EXIT_CODES`] is the table `--help` and the README
//! show; [`Exit::code`] is the only place a number is chosen.
//!
//! Library errors choose their kind through `From` (their help stays apart from their
//! message, as miette shows it): a config error ([`crate::config::LoadError`],
//! [`crate::config::ConfigError`]) is [`Kind::Config`]; a state, lock, cloud
//! ([`crate::provider::ProviderError`]) or I/O error is [`Kind::User`]. A diagnostic a
//! command built around one of them keeps its kind ([`CommandError::from`] a `Report`
//! looks inside).

use miette::{Diagnostic, Report};

/// How a command ended. [`Exit::code`] maps it to the process's exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It did what was asked (`plan --detailed-exitcode`: and there are no changes).
    Success,
    /// It failed after saying why (a refused prompt, an unusable cloud in `validate`, a
    /// failed check in `health`); errors with a message are [`CommandError`]s.
    Failure,
    /// `plan --detailed-exitcode` found changes.
    Changes,
    /// Ctrl-C or SIGTERM stopped it.
    Interrupted,
    /// A bug in gpuprov stopped it ([`Kind::Internal`]).
    Internal,
    /// `gpuprov ssh NAME -- CMD`: the remote command's own status, as ssh passes it on.
    Remote(u8),
}

impl Exit {
    /// The process exit status of this outcome.
    pub fn code(self) -> u8 {
        match self {
            Exit::Success => 0,
            Exit::Failure => 1,
            Exit::Changes => 2,
            Exit::Interrupted => 130,
            // As jj: far from every code a remote command or a signal gives.
            Exit::Internal => 255,
            Exit::Remote(n) => n,
        }
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(e: Exit) -> Self {
        std::process::ExitCode::from(e.code())
    }
}

/// The documented exit codes: (code, meaning), as `gpuprov --help` and the README list
/// them. A test checks both against [`Exit::code`].
pub const EXIT_CODES: &[(u8, &str)] = &[
    (0, "success; with --detailed-exitcode: no changes"),
    (
        1,
        "error, including a usage error (an unknown flag, a missing or malformed value)",
    ),
    (2, "changes present (only with plan --detailed-exitcode)"),
    (130, "interrupted (Ctrl-C or SIGTERM)"),
    (255, "internal error: a bug in gpuprov (please report it)"),
];

/// The environment variables gpuprov reads itself: (name, meaning), as the man page's
/// ENVIRONMENT section lists them. Each cloud's credential variables are the vendor's own
/// (README, "Clouds").
pub const ENVIRONMENT: &[(&str, &str)] = &[
    ("GPUPROV_CONFIG", "the config file (default gpuprov.toml); same as --config"),
    ("GPUPROV_STATE", "the local state file; same as --state"),
    ("GPUPROV_BACKEND_CONFIG", "overrides [backend] keys, for example type=s3,bucket=B,key=K"),
    ("GPUPROV_PG_CONN_STR", "the PostgreSQL backend's connection string (else PG_CONN_STR)"),
    ("GPUPROV_HOME", "where per-project SSH keys, ssh config and kubeconfigs live (default ~/.gpuprov)"),
    ("GPUPROV_SSH_PRIVATE_KEY", "the project's SSH private key itself (CI), held in memory only"),
    ("GPUPROV_SSH_KEY_FILE", "a file holding the project's SSH private key; same as --ssh-key"),
    ("GPUPROV_<CLOUD>_ENDPOINT", "a cloud's API base URL, for example GPUPROV_LAMBDA_ENDPOINT"),
    ("GPUPROV_K3S_INSTALL_URL", "the k3s install script's URL or path on the machine (air-gapped)"),
    ("GPUPROV_K3S_VERSION", "the k3s release to install, for example v1.31.4+k3s1"),
    ("GPUPROV_LOG", "structured log filter on stderr (tracing's EnvFilter), for example gpuprov=debug: one span per machine and step, with cloud, region, offer and attempt"),
    ("NO_COLOR", "when set, no colour in any output (as -no-color)"),
    ("GITHUB_STEP_SUMMARY", "when set (GitHub Actions), plan and show append the Markdown plan to it"),
];

/// The `--help` epilogue: [`EXIT_CODES`] as an indented table.
pub fn exit_codes_help() -> String {
    let mut s = String::from("Exit codes:\n");
    for (code, meaning) in EXIT_CODES {
        s.push_str(&format!("  {code:<4} {meaning}\n"));
    }
    s.push_str(
        "  `gpuprov ssh NAME -- CMD` exits with the remote command's status, as ssh does.\n",
    );
    s.push_str("  `gpuprov validate` and `gpuprov health` exit 1 when a check fails.");
    s
}

/// What kind of failure a [`CommandError`] is; the kind decides the exit code (as jj's
/// `CommandErrorKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The command line is wrong: an unknown flag or subcommand, a missing or malformed
    /// value. Exit 1 (never 2, which `--detailed-exitcode` gives to "changes present").
    Usage,
    /// `gpuprov.toml` is wrong: it cannot be read, does not parse, or says something
    /// invalid (the diagnostic points at the value). Exit 1, as Terraform's.
    Config,
    /// Anything else the user or their environment can act on: the state, the lock, a
    /// cloud's answer, a refused operation. Exit 1.
    User,
    /// Ctrl-C or SIGTERM before the command had anything to undo. Exit 130.
    Interrupted,
    /// A bug in gpuprov: a task panicked, a run reached a state it never should, its own
    /// output could not be encoded. Exit 255, as jj.
    Internal,
}

/// A command's failure: its [`Kind`] and the diagnostic to show (a miette report with a
/// code and a separate help, or clap's own rendering of a usage error).
#[derive(Debug)]
pub struct CommandError {
    kind: Kind,
    body: Body,
}

#[derive(Debug)]
enum Body {
    Report(Report),
    Clap(clap::Error),
}

/// A usage error found before clap parses (an unknown single-dash word).
#[derive(Debug, thiserror::Error, Diagnostic)]
#[error("{message}")]
#[diagnostic(code(gpuprov::usage))]
struct UsageError {
    message: String,
    #[help]
    help: Option<String>,
}

/// A bug in gpuprov, with the help to report it.
#[derive(Debug, thiserror::Error, Diagnostic)]
#[error("internal error: {message}")]
#[diagnostic(
    code(gpuprov::internal),
    help("this is a bug in gpuprov: please report it with the command line and the output above (GPUPROV_LOG=debug adds the details); the state file records where each machine is")
)]
struct InternalError {
    message: String,
}

/// A cloud's error ([`crate::provider::ProviderError`]) as a diagnostic: its message, and
/// its help (which credential to check, where it is read) apart.
#[derive(Debug, thiserror::Error, Diagnostic)]
#[error("{message}")]
#[diagnostic(code(gpuprov::cloud))]
struct CloudError {
    message: String,
    #[help]
    help: Option<String>,
}

impl CommandError {
    /// A usage error with its own message and hint (code `gpuprov::usage`).
    pub fn usage(message: impl Into<String>, help: Option<String>) -> CommandError {
        CommandError {
            kind: Kind::Usage,
            body: Body::Report(Report::new(UsageError {
                message: message.into(),
                help,
            })),
        }
    }

    /// A bug in gpuprov: `message` says what went wrong; the help asks for a report.
    pub fn internal(message: impl std::fmt::Display) -> CommandError {
        CommandError {
            kind: Kind::Internal,
            body: Body::Report(Report::new(InternalError {
                message: message.to_string(),
            })),
        }
    }

    /// Any diagnostic as an error of `kind`.
    pub fn new(kind: Kind, report: Report) -> CommandError {
        CommandError {
            kind,
            body: Body::Report(report),
        }
    }

    /// Its kind.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// How the command ended: the exit code follows from the kind.
    pub fn exit(&self) -> Exit {
        match self.kind {
            Kind::Usage | Kind::Config | Kind::User => Exit::Failure,
            Kind::Interrupted => Exit::Interrupted,
            Kind::Internal => Exit::Internal,
        }
    }

    /// Prints the diagnostic on stderr.
    pub fn print(&self) {
        match &self.body {
            Body::Report(r) => errln!("{r:?}"),
            // clap renders its usage errors itself (with the usage line and a tip), in
            // colour where stderr is a terminal and NO_COLOR is unset.
            Body::Clap(e) => {
                let _ = e.print();
            }
        }
    }
}

impl From<Report> for CommandError {
    /// A diagnostic built around a library error has that error's kind (a config error
    /// stays [`Kind::Config`] through the helpers that return a `Report`); any other is
    /// [`Kind::User`].
    fn from(report: Report) -> Self {
        let config = report.downcast_ref::<crate::config::LoadError>().is_some()
            || report
                .downcast_ref::<crate::config::ConfigError>()
                .is_some();
        let kind = if config { Kind::Config } else { Kind::User };
        CommandError::new(kind, report)
    }
}

impl From<crate::config::LoadError> for CommandError {
    fn from(e: crate::config::LoadError) -> Self {
        CommandError::new(Kind::Config, Report::new(e))
    }
}

impl From<Box<crate::config::ConfigError>> for CommandError {
    fn from(e: Box<crate::config::ConfigError>) -> Self {
        CommandError::new(Kind::Config, Report::new(*e))
    }
}

impl From<crate::state::StateError> for CommandError {
    fn from(e: crate::state::StateError) -> Self {
        CommandError::new(Kind::User, Report::new(e))
    }
}

impl From<crate::state::lock::LockError> for CommandError {
    fn from(e: crate::state::lock::LockError) -> Self {
        CommandError::new(Kind::User, Report::new(e))
    }
}

impl From<crate::provider::ProviderError> for CommandError {
    fn from(e: crate::provider::ProviderError) -> Self {
        CommandError::new(
            Kind::User,
            Report::new(CloudError {
                message: e.msg,
                help: e.help,
            }),
        )
    }
}

impl From<std::io::Error> for CommandError {
    fn from(e: std::io::Error) -> Self {
        CommandError::new(Kind::User, Report::msg(e))
    }
}

impl From<clap::Error> for CommandError {
    fn from(e: clap::Error) -> Self {
        CommandError {
            kind: Kind::Usage,
            body: Body::Clap(e),
        }
    }
}

/// Whether diagnostics are coloured (read by the miette hook at each report).
static COLOR: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Installs the miette hook that renders every diagnostic, coloured (and with Unicode
/// frames) when `color`, never with terminal links.
pub(super) fn install_report_hook(color: bool) {
    color_reports(color);
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
}

/// Colours the diagnostics reported from now on, or not (`--no-color`, once parsed).
pub(super) fn color_reports(color: bool) {
    COLOR.store(color, std::sync::atomic::Ordering::Relaxed);
}

/// What every command returns.
pub type CmdResult = Result<Exit, CommandError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_table_is_what_the_exits_map_to() {
        let documented: Vec<u8> = EXIT_CODES.iter().map(|(c, _)| *c).collect();
        let mapped: Vec<u8> = [
            Exit::Success,
            Exit::Failure,
            Exit::Changes,
            Exit::Interrupted,
            Exit::Internal,
        ]
        .iter()
        .map(|e| e.code())
        .collect();
        assert_eq!(documented, mapped);
        let usage = CommandError::usage("x", None);
        assert_eq!((usage.kind(), usage.exit().code()), (Kind::Usage, 1));
        let user = CommandError::from(miette::miette!("x"));
        assert_eq!((user.kind(), user.exit().code()), (Kind::User, 1));
        let int = CommandError::new(Kind::Interrupted, miette::miette!("x"));
        assert_eq!(int.exit().code(), 130);
        let bug = CommandError::internal("x");
        assert_eq!((bug.kind(), bug.exit().code()), (Kind::Internal, 255));
    }

    /// Library errors choose their kind through `From`, also inside a `Report` a helper
    /// returned; a cloud's help stays apart from its message.
    #[test]
    fn library_errors_choose_their_kind() {
        let missing = crate::config::Config::load(std::path::Path::new("/nonexistent/x.toml"))
            .expect_err("no such file");
        assert_eq!(CommandError::from(missing).kind(), Kind::Config);
        let bad = crate::config::Config::parse(
            std::path::Path::new("t.toml"),
            "[vm.a]\nnope = 1\n".into(),
        )
        .expect_err("an unknown key");
        let report = miette::Report::new(*bad);
        let e = CommandError::from(report);
        assert_eq!((e.kind(), e.exit().code()), (Kind::Config, 1));
        let cloud = crate::provider::ProviderError::new(
            crate::provider::ErrorKind::Credentials,
            "no Lambda API key",
        )
        .with_help("set LAMBDA_API_KEY");
        let e = CommandError::from(cloud);
        assert_eq!(e.kind(), Kind::User);
        let Body::Report(r) = &e.body else {
            panic!("a report")
        };
        assert_eq!(r.to_string(), "no Lambda API key");
        assert_eq!(
            r.help().map(|h| h.to_string()).as_deref(),
            Some("set LAMBDA_API_KEY")
        );
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        assert_eq!(CommandError::from(io).exit().code(), 1);
    }
}
