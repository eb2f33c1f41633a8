//! `gpuprov force-unlock ID`: clears a stale lock record on any backend.

use std::process::ExitCode;

use miette::Report;

use super::args::ForceUnlockArgs;
use super::Project;

/// Clears the lock whose id is `a.lock_id`, after checking it is the one recorded (and,
/// where the backend can tell, that its holder is gone).
pub(super) fn run(project: &Project, a: &ForceUnlockArgs) -> Result<ExitCode, Report> {
    let backend = project.backend()?;
    let outcome = crate::state::backend::bridge::blocking(|| backend.force_unlock(&a.lock_id))
        .map_err(Report::new)?;
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
    Ok(ExitCode::SUCCESS)
}
