//! `gpuprov state push FILE`: replaces the backend's state with a state file.

use super::error::{CmdResult, Exit};
use std::io::Read;

use miette::{miette, IntoDiagnostic, Report};

use super::args::{Cli, StatePushArgs};
use super::project::Project;

/// Pushes `a.file` (or stdin for `-`) as the backend's state, under the lock.
///
/// Refused unless `--force`, as Terraform's `state push` refuses: another lineage, an
/// older serial, the same serial with other content, or an unfinished run's journal in
/// the backend. The file must parse as a state this build can read; its bytes are stored
/// as they are (serial and lineage kept).
pub(super) fn run(cli: &Cli, project: &Project, a: &StatePushArgs) -> CmdResult {
    let bytes = if a.file.as_os_str() == "-" {
        let mut b = Vec::new();
        std::io::stdin().read_to_end(&mut b).into_diagnostic()?;
        b
    } else {
        std::fs::read(&a.file)
            .into_diagnostic()
            .map_err(|e| e.wrap_err(format!("cannot read {}", a.file.display())))?
    };
    let pushed = crate::state::parse_state(&a.file, &bytes)?;
    let _lock = project.lock("state push", cli.lock_timeout)?;
    let (mut store, current) = project.open_state()?;
    if let Some(existing) = store.original_bytes() {
        let refuse = |what: String| -> Result<(), Report> {
            if a.force {
                errln!("note: {what}; pushing anyway (--force)");
                Ok(())
            } else {
                Err(miette!(
                    help = "check you are pushing the right file (`gpuprov state pull` shows the stored one); --force overrides",
                    "refusing to push {}: {what}",
                    a.file.display()
                ))
            }
        };
        if current.lineage != pushed.lineage {
            refuse(format!(
                "its lineage {} is not the stored state's {}",
                pushed.lineage, current.lineage
            ))?;
        } else if pushed.serial < current.serial {
            refuse(format!(
                "its serial {} is older than the stored state's {}",
                pushed.serial, current.serial
            ))?;
        } else if pushed.serial == current.serial && existing != bytes.as_slice() {
            refuse(format!(
                "it has the stored state's serial {} but different content",
                pushed.serial
            ))?;
        }
        if store.replayed_journal() {
            refuse(
                "the stored state has an unfinished run's journal, whose changes the push would drop"
                    .into(),
            )?;
        }
    }
    let discard = store.replayed_journal();
    crate::state::backend::bridge::blocking(|| store.write_exact(&bytes))?;
    if discard {
        // Forced over an unfinished run: its journal would be replayed onto the pushed
        // state by the next command.
        crate::state::backend::bridge::blocking(|| store.discard_journals())?;
        errln!("note: discarded the unfinished run's journal");
    }
    errln!(
        "Pushed {} (serial {}, lineage {}) to {}.",
        a.file.display(),
        pushed.serial,
        pushed.lineage,
        project.location()
    );
    Ok(Exit::Success)
}
