//! `gpuprov force-unlock ID`: clears a stale lock record on any backend.

use super::error::{CmdResult, Exit};

use super::args::ForceUnlockArgs;
use super::project::Project;

/// Clears the lock whose id is `a.lock_id`, after checking it is the one recorded (and,
/// where the backend can tell, that its holder is gone).
pub(super) fn run(project: &Project, a: &ForceUnlockArgs) -> CmdResult {
    let backend = project.backend()?;
    let outcome = crate::state::backend::bridge::blocking(|| backend.force_unlock(&a.lock_id))?;
    let i = &outcome.cleared;
    errln!(
        "Cleared the stale lock {} ({} by {}, pid {}, {}) on {}. The state is unlocked.",
        i.id,
        i.operation,
        i.who,
        i.pid,
        i.created,
        backend.location().display()
    );
    if backend.kind() == crate::config::BackendKind::S3 {
        errln!(
            "note: S3 cannot tell whether that run is still going. If it is, its next journal write is refused and it stops, and its final save is refused (its state goes to its errored file); machines it created carry the gpuprov labels and are found by the next apply."
        );
    }
    Ok(Exit::Success)
}
