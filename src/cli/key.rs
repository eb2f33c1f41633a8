//! The project key of a command ([`crate::ssh::supply`]): found where the state says it
//! must be, generated only by a fresh project's `apply`, and recorded (its public half)
//! before any machine runs.

use std::path::PathBuf;

use miette::Report;

use crate::ssh::keys::ProjectKey;
use crate::ssh::supply::{KeyRequest, KeySupply, SshIdentity, ENV_AGENT, ENV_PRIVATE_KEY};
use crate::state::{StateFile, StateStore};

use super::project::{project_dir, Project};

/// What decides how the project key is found: whether a fresh project may generate it
/// here (`apply`), must connect with it (`ssh`, `tunnel`), or only might need it
/// (`destroy`, which never logs in: without the key it runs with its public half).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KeyUse {
    Apply,
    Connect,
    Destroy,
}

/// The project key this machine uses for `state` ([`crate::ssh::supply`]): the one the
/// state records, from `GPUPROV_SSH_PRIVATE_KEY`, `--ssh-key` / `GPUPROV_SSH_KEY_FILE`,
/// the SSH agent or the per-project key file; a fresh project's `apply` may generate it.
/// Never generates a key for a state that records one.
pub(super) fn project_key(
    project: &Project,
    state: &StateFile,
    usage: KeyUse,
) -> Result<ProjectKey, Report> {
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
pub(super) fn record_key(
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
