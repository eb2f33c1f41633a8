//! Where a state lives: the backend seam and its three implementations.
//!
//! A [`Backend`] stores four things for one state: the state document itself (replaced
//! only by compare-and-set on the [`Version`] read at the start of the run), a `.backup`
//! of the bytes first read, the write-ahead journal of the run in progress (appended in
//! batches, replayed by the next run on any machine), and the lock with its holder info.
//!
//! - [`local::LocalBackend`]: today's files (`gpuprov.state.json`, `.backup`, `.journal`,
//!   `.lock` with an fs4 lock). The file lock is the fence: `force-unlock` refuses while
//!   the holder lives.
//! - [`s3::S3Backend`]: objects in a bucket of any S3-compatible store that really
//!   enforces conditional writes (checked once per process before the first write). The
//!   lock is created with `If-None-Match: *`; the state is replaced with `If-Match` on the
//!   ETag read at the start, so a writer whose lock was broken can never overwrite it.
//! - [`postgres::PostgresBackend`]: rows in PostgreSQL; the lock is a session advisory
//!   lock on a dedicated connection (it dies with the holder's session), and every write
//!   of the holder goes through that session with a `serial` compare-and-set.
//!
//! The trait is synchronous: the state module is called from both async and plain code,
//! and its callers hold no await point across a save. The remote backends run their
//! client on a small runtime of their own ([`bridge::Bridge`]), so a call works from any
//! thread, inside a Tokio runtime or not.
//!
//! No backend stores a secret: credentials come from the SDK's chain or the environment
//! and never enter a key, a row or lock info.

pub mod bridge;
pub mod local;
pub mod postgres;
pub mod s3;

use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::config::{BackendKind, BackendSettings};

use super::error::StateError;
use super::lock::{ForceUnlockOutcome, LockError, LockInfo};

/// An opaque version of the stored state document, used for compare-and-set: an S3
/// ETag, a PostgreSQL `serial`, empty for a local file (its lock fences it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version(pub String);

/// The state document as stored, with the version to compare against when replacing it.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The document's bytes (pretty JSON, as [`super::StateStore`] writes it).
    pub bytes: Vec<u8>,
    /// Its version at the time of the read.
    pub version: Version,
}

/// One run's write-ahead journal as stored: the header line and the batches appended
/// after it, concatenated in order (the format is [`super::wal`]'s, the same on every
/// backend).
#[derive(Debug, Clone)]
pub struct JournalBytes {
    /// Where it is stored, for messages (a path, an object key prefix, a row key).
    pub location: PathBuf,
    /// Its lines.
    pub bytes: Vec<u8>,
}

/// The result of one attempt to take the lock.
#[derive(Debug)]
pub enum LockAttempt {
    /// Taken; `stale` is the record a previous holder left (local and PostgreSQL, whose
    /// locks die with their holder, take such a lock over).
    Acquired {
        /// Releases the lock when released or dropped.
        handle: Box<dyn LockHandle>,
        /// The lock info a dead holder left behind, if any.
        stale: Option<LockInfo>,
    },
    /// Someone else holds it; their info, when readable.
    Held(Option<LockInfo>),
}

/// A held lock; releasing it (or dropping it) lets the next writer in.
pub trait LockHandle: Send + Sync + Debug {
    /// Releases the lock and clears its record.
    ///
    /// # Errors
    ///
    /// [`LockError`] when the store refused; the lock may then stay recorded until
    /// `force-unlock`.
    fn release(self: Box<Self>) -> Result<(), LockError>;
}

/// Where one run's journal batches go.
pub trait JournalSink: Send + Sync {
    /// Appends `batch` (whole lines) durably: when it returns `Ok`, the lines survive a
    /// crash of this process and of the machine it runs on (remote stores) or of the
    /// process (local fsync).
    ///
    /// # Errors
    ///
    /// A one-line reason; the caller marks the journal failed and stops the run's side
    /// effects.
    fn append(&self, batch: &[u8]) -> Result<(), String>;

    /// Deletes this run's journal once its changes are folded into the state.
    ///
    /// # Errors
    ///
    /// [`StateError`] naming the journal.
    fn remove(&self) -> Result<(), StateError>;
}

/// Storage for one state (see the module docs). Implementations never hold a secret in
/// what they store or in their errors.
pub trait Backend: Send + Sync + Debug {
    /// The backend's kind.
    fn kind(&self) -> BackendKind;

    /// Where the state lives, for messages: a path, `s3://bucket/key`,
    /// `postgres://host:port/db (schema.name)` (never with a password).
    fn location(&self) -> PathBuf;

    /// Reads the state document; `None` when there is none yet.
    ///
    /// # Errors
    ///
    /// [`StateError`] when the store could not be read.
    fn read_state(&self) -> Result<Option<Stored>, StateError>;

    /// Replaces the state document with `bytes` if it is still at `expected` (`None`:
    /// only if there is none), returning the new version.
    ///
    /// # Errors
    ///
    /// [`StateError::Conflict`] when the stored document moved on (another writer saved
    /// since the read: this writer's lock was broken), else [`StateError`] naming the
    /// store.
    fn write_state(&self, bytes: &[u8], expected: Option<&Version>) -> Result<Version, StateError>;

    /// Keeps `bytes` (the document as first read) as the state's backup.
    ///
    /// # Errors
    ///
    /// [`StateError`] naming the store.
    fn write_backup(&self, bytes: &[u8]) -> Result<(), StateError>;

    /// The local file the state goes to when the final save fails.
    fn errored_path(&self) -> PathBuf;

    /// The journals stored for this state (none, or one per run that did not fold its
    /// journal), oldest run first.
    ///
    /// # Errors
    ///
    /// [`StateError`] when the store could not be read.
    fn read_journals(&self) -> Result<Vec<JournalBytes>, StateError>;

    /// Deletes every stored journal of this state and starts a new one holding `header`
    /// (one line).
    ///
    /// # Errors
    ///
    /// [`StateError`] naming the store.
    fn start_journal(&self, header: &[u8]) -> Result<Box<dyn JournalSink>, StateError>;

    /// One attempt to take the lock, recording `info`. The wait and its deadline are the
    /// caller's ([`super::lock::StateLock::acquire_on`]).
    ///
    /// # Errors
    ///
    /// [`LockError`] when the store could not be asked.
    fn try_lock(&self, info: &LockInfo) -> Result<LockAttempt, LockError>;

    /// How long to wait between two attempts to take a held lock.
    fn lock_poll_interval(&self) -> Duration;

    /// The recorded lock info, if any.
    ///
    /// # Errors
    ///
    /// [`LockError`] when the store could not be read.
    fn lock_info(&self) -> Result<Option<LockInfo>, LockError>;

    /// Clears the lock whose id is `id`.
    ///
    /// # Errors
    ///
    /// [`LockError::NotLocked`], [`LockError::IdMismatch`], or
    /// [`LockError::StillHeld`] when the store knows the holder is alive.
    fn force_unlock(&self, id: &str) -> Result<ForceUnlockOutcome, LockError>;
}

/// Why a backend could not be opened.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum BackendError {
    /// A key of `[backend]` (or an override) is missing, misplaced or invalid.
    #[error("invalid [backend]: {message}")]
    #[diagnostic(code(gpuprov::backend::config))]
    Config {
        /// What is wrong, naming the key.
        message: String,
        /// How to fix it.
        #[help]
        help: Option<String>,
    },
    /// The store could not be reached or set up.
    #[error("cannot open the {kind} backend at {location}: {reason}")]
    #[diagnostic(code(gpuprov::backend::unavailable))]
    Unavailable {
        /// `s3` or `postgres`.
        kind: &'static str,
        /// Where (no secrets).
        location: String,
        /// Why.
        reason: String,
        /// What to check.
        #[help]
        help: Option<String>,
    },
}

fn config_error(message: impl Into<String>, help: impl Into<Option<String>>) -> BackendError {
    BackendError::Config {
        message: message.into(),
        help: help.into(),
    }
}

/// Opens the backend `settings` describe. `default_state_path` is the local state file
/// when the settings name none (beside the config, or `--state`); `project_dir` is the
/// config's directory, where a remote backend's `.errored` file goes.
///
/// # Errors
///
/// [`BackendError::Config`] for a key that does not belong to the type, a missing
/// required key, or a missing connection string; [`BackendError::Unavailable`] when a
/// remote store cannot be set up (PostgreSQL: connection or schema creation).
pub fn open(
    settings: &BackendSettings,
    default_state_path: &Path,
    project_dir: &Path,
) -> Result<Arc<dyn Backend>, BackendError> {
    let allowed: &[&str] = match settings.kind {
        BackendKind::Local => &["path"],
        BackendKind::S3 => &["bucket", "key", "region", "endpoint", "force_path_style"],
        BackendKind::Postgres => &["schema", "name"],
    };
    if let Some((key, _)) = keys_set(settings)
        .into_iter()
        .find(|(k, set)| *set && !allowed.contains(k))
    {
        return Err(config_error(
            format!(
                "`{key}` does not apply to the {} backend",
                settings.kind.as_str()
            ),
            Some(match (settings.kind, key) {
                (
                    BackendKind::Local,
                    "bucket" | "key" | "region" | "endpoint" | "force_path_style",
                ) => "set `type = \"s3\"` in [backend] (the type defaults to local)".to_string(),
                (BackendKind::Local, _) => {
                    "set `type = \"postgres\"` in [backend] (the type defaults to local)"
                        .to_string()
                }
                _ => format!(
                    "the {} backend takes: type, {}",
                    settings.kind.as_str(),
                    allowed.join(", ")
                ),
            }),
        ));
    }
    let s = settings;
    match s.kind {
        BackendKind::Local => {
            let path = s
                .path
                .clone()
                .unwrap_or_else(|| default_state_path.to_path_buf());
            Ok(Arc::new(local::LocalBackend::new(path)))
        }
        BackendKind::S3 => {
            let bucket = s.bucket.clone().filter(|b| !b.is_empty()).ok_or_else(|| {
                config_error(
                    "the s3 backend needs `bucket`",
                    Some(
                        "set `bucket = \"…\"` in [backend] or pass --backend-config bucket=…"
                            .into(),
                    ),
                )
            })?;
            // Required, as Terraform's: a default would let two projects share one state.
            let key = s.key.clone().ok_or_else(|| {
                config_error(
                    "the s3 backend needs `key`, the state object's key",
                    Some("one key per project, for example `key = \"team/gpu/gpuprov.state.json\"` (or --backend-config key=…)".into()),
                )
            })?;
            if key.is_empty() || key.ends_with('/') {
                return Err(config_error(
                    format!("the s3 backend's `key` {key:?} must name an object"),
                    Some("for example `key = \"team/gpu/gpuprov.state.json\"`".into()),
                ));
            }
            let backend = s3::S3Backend::new(s3::S3Settings {
                bucket,
                key,
                region: s.region.clone(),
                endpoint: s.endpoint.clone(),
                force_path_style: s.force_path_style.unwrap_or(false),
                errored_path: project_dir.join("gpuprov.state.errored.json"),
            })?;
            Ok(Arc::new(backend))
        }
        BackendKind::Postgres => {
            let conn = postgres::connection_string_from_env().ok_or_else(|| {
                config_error(
                    format!(
                        "the postgres backend needs a connection string in {}",
                        postgres::CONN_STR_VARS.join(" or ")
                    ),
                    Some("it holds a password, so it is never read from gpuprov.toml: export GPUPROV_PG_CONN_STR=\"host=… user=… password=… dbname=…\" (or a postgres:// URL) from your CI's secrets".into()),
                )
            })?;
            let backend = postgres::PostgresBackend::connect(postgres::PostgresSettings {
                conn,
                schema: s.schema.clone().unwrap_or_else(|| "gpuprov".to_string()),
                name: s.name.clone().filter(|n| !n.is_empty()).ok_or_else(|| {
                    config_error(
                        "the postgres backend needs `name`, the state's name",
                        Some("one name per project, for example `name = \"gpu-dev\"` (or --backend-config name=…)".into()),
                    )
                })?,
                errored_path: project_dir.join("gpuprov.state.errored.json"),
            })?;
            Ok(Arc::new(backend))
        }
    }
}

/// Every key of `[backend]` but `type`, and whether it is set.
fn keys_set(s: &BackendSettings) -> [(&'static str, bool); 8] {
    [
        ("path", s.path.is_some()),
        ("bucket", s.bucket.is_some()),
        ("key", s.key.is_some()),
        ("region", s.region.is_some()),
        ("endpoint", s.endpoint.is_some()),
        ("force_path_style", s.force_path_style.is_some()),
        ("schema", s.schema.is_some()),
        ("name", s.name.is_some()),
    ]
}

/// The CI job running this process, from the usual environment variables, for lock
/// info: GitHub Actions, GitLab CI, Buildkite, CircleCI, Jenkins; `None` elsewhere.
pub fn ci_job() -> Option<String> {
    ci_job_from(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
}

/// [`ci_job`] over any variable lookup (tests pass a map).
pub fn ci_job_from(var: impl Fn(&str) -> Option<String>) -> Option<String> {
    if let (Some(server), Some(repo), Some(run)) = (
        var("GITHUB_SERVER_URL"),
        var("GITHUB_REPOSITORY"),
        var("GITHUB_RUN_ID"),
    ) {
        let job = var("GITHUB_JOB")
            .map(|j| format!(" (job {j})"))
            .unwrap_or_default();
        return Some(format!("{server}/{repo}/actions/runs/{run}{job}"));
    }
    if let Some(url) = var("CI_JOB_URL") {
        return Some(url);
    }
    for k in ["BUILDKITE_BUILD_URL", "CIRCLE_BUILD_URL", "BUILD_URL"] {
        if let Some(url) = var(k) {
            return Some(url);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn settings(kind: BackendKind) -> BackendSettings {
        BackendSettings {
            kind,
            ..Default::default()
        }
    }

    #[test]
    fn local_is_the_default_and_uses_the_given_path() {
        let b = open(
            &BackendSettings::default(),
            Path::new("/p/gpuprov.state.json"),
            Path::new("/p"),
        )
        .unwrap();
        assert_eq!(b.kind(), BackendKind::Local);
        assert_eq!(b.location(), PathBuf::from("/p/gpuprov.state.json"));
    }

    #[test]
    fn a_key_of_another_type_is_named() {
        let mut s = settings(BackendKind::Local);
        s.bucket = Some("b".into());
        let e = open(&s, Path::new("s.json"), Path::new(".")).unwrap_err();
        assert!(e
            .to_string()
            .contains("`bucket` does not apply to the local backend"));
    }

    #[test]
    fn s3_needs_a_bucket_and_an_object_key() {
        let e = open(&settings(BackendKind::S3), Path::new("s"), Path::new(".")).unwrap_err();
        assert!(e.to_string().contains("needs `bucket`"), "{e}");
        let mut s = settings(BackendKind::S3);
        s.bucket = Some("b".into());
        s.key = Some("dir/".into());
        let e = open(&s, Path::new("s"), Path::new(".")).unwrap_err();
        assert!(e.to_string().contains("must name an object"), "{e}");
    }

    #[test]
    fn ci_job_names_the_run_of_each_ci() {
        let env = |pairs: &[(&str, &str)]| {
            let m: HashMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            move |k: &str| m.get(k).cloned()
        };
        assert_eq!(
            ci_job_from(env(&[
                ("GITHUB_SERVER_URL", "https://github.com"),
                ("GITHUB_REPOSITORY", "acme/gpu"),
                ("GITHUB_RUN_ID", "42"),
                ("GITHUB_JOB", "apply"),
            ])),
            Some("https://github.com/acme/gpu/actions/runs/42 (job apply)".into())
        );
        assert_eq!(
            ci_job_from(env(&[("CI_JOB_URL", "https://gitlab.com/a/b/-/jobs/7")])),
            Some("https://gitlab.com/a/b/-/jobs/7".into())
        );
        assert_eq!(ci_job_from(env(&[])), None);
    }
}
