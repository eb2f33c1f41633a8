//! One project as the commands see it: its config and where its state lives (the
//! backend, its lock), the per-project directory, and the confirmation prompt.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use miette::{miette, IntoDiagnostic, Report};

use crate::config::{BackendSettings, Config};
use crate::provider::Lineage;
use crate::state::lock::StateLock;
use crate::state::{Backend, StateFile, StateStore};

use super::args::Cli;

/// One project: its config, and where its state lives (the backend, opened on first
/// use).
pub(super) struct Project {
    pub(super) config_path: PathBuf,
    /// The local state file: `--state`, else `gpuprov.state.json` beside the config.
    pub(super) state_path: PathBuf,
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
    pub(super) ssh_key: Option<PathBuf>,
}

impl Project {
    /// The project the command line names (`--config`, `--state`, the backend flags).
    pub(super) fn new(cli: &Cli) -> Project {
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

    /// Reads and validates the config (a config error keeps its kind).
    pub(super) fn load_config(&self) -> Result<Config, Report> {
        let config = Config::load(&self.config_path).map_err(Report::new)?;
        let _ = self.config_backend.set(config.backend.clone());
        Ok(config)
    }

    /// The backend settings: `base` pairs on an empty table (`state migrate --from/--to`),
    /// else the config's `[backend]` (when the config exists) with the layers of
    /// `GPUPROV_BACKEND_CONFIG` and then `--backend-config` applied.
    pub(super) fn backend_settings(
        &self,
        base: Option<&[String]>,
    ) -> Result<BackendSettings, Report> {
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
    pub(super) fn open_backend(
        &self,
        settings: &BackendSettings,
    ) -> Result<Arc<dyn Backend>, Report> {
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
    pub(super) fn backend(&self) -> Result<Arc<dyn Backend>, Report> {
        if let Some(b) = self.backend.get() {
            return Ok(b.clone());
        }
        let settings = self.backend_settings(None)?;
        let b = self.open_backend(&settings)?;
        Ok(self.backend.get_or_init(|| b).clone())
    }

    /// Where the state lives, for messages.
    pub(super) fn location(&self) -> String {
        match self.backend.get() {
            Some(b) => b.location().display().to_string(),
            None => self.state_path.display().to_string(),
        }
    }

    /// Opens the state in the backend: the store and the state it holds.
    pub(super) fn open_state(&self) -> Result<(StateStore, StateFile), Report> {
        let backend = self.backend()?;
        crate::state::backend::bridge::blocking(|| StateStore::open_in(backend))
            .map_err(Report::new)
    }

    /// Takes the state lock for `operation`, waiting up to `timeout`.
    pub(super) fn lock(&self, operation: &str, timeout: Duration) -> Result<StateLock, Report> {
        let backend = self.backend()?;
        lock_backend(&*backend, operation, timeout)
    }
}

/// The backend overrides in the order they apply: `GPUPROV_BACKEND_CONFIG`'s pairs, then
/// `--backend-config`'s (a flag refines the environment, as on the command line of CI).
pub(super) fn backend_overrides(cli: &Cli) -> [Vec<String>; 2] {
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
pub(super) fn lock_backend(
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
pub(super) fn project_root(config: &Path) -> PathBuf {
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
pub(super) fn project_dir(lineage: &str) -> PathBuf {
    data_home().join("projects").join(lineage)
}

/// The state's lineage, typed; a state whose lineage is not a UUID is refused with a
/// diagnostic naming the state file (it is never overwritten).
pub(super) fn lineage_of(state: &crate::state::StateFile) -> Result<Lineage, Report> {
    Lineage::parse(&state.lineage).map_err(|e| {
        miette!(
            help = "the lineage is the state's identity; restore the state from its .backup",
            "the state's lineage is unusable: {}",
            e.text()
        )
    })
}

/// Asks to go on (`yes` only), unless `auto_approve`; refused without a terminal or
/// with `--input=false`.
pub(super) fn confirm(cli: &Cli, what: &str, auto_approve: bool) -> Result<bool, Report> {
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
