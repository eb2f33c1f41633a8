//! `gpuprov state pull`: prints the state as stored in the backend.

use super::error::{CmdResult, Exit};

use miette::miette;

use super::project::Project;

/// Prints the stored state document byte for byte. When an unfinished run left a
/// journal, prints the state with that journal applied (what the next run will see),
/// and says so on stderr.
pub(super) fn run(project: &Project) -> CmdResult {
    let (store, state) = project.open_state()?;
    if store.replayed_journal() {
        errln!(
            "note: an unfinished run's journal was applied; its changes are not yet in the stored state (the next apply or destroy folds them in)"
        );
        let bytes = crate::state::to_json_bytes(&state)?;
        out!("{}", String::from_utf8_lossy(&bytes));
        return Ok(Exit::Success);
    }
    match store.original_bytes() {
        Some(bytes) => {
            out!("{}", String::from_utf8_lossy(bytes));
            Ok(Exit::Success)
        }
        None => Err(miette!(
            help = "run `gpuprov apply` to create it, or `gpuprov state push FILE`",
            "no state is stored at {}",
            project.location()
        )
        .into()),
    }
}
