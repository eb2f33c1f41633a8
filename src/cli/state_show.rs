//! `gpuprov state list` and `gpuprov state show ADDRESS`: the state's addresses, and one
//! record as the state file holds it.

use super::error::{CmdResult, CommandError, Exit};
use super::project::Project;

/// `state list`: every address of the state, one per line.
pub(super) fn list(project: &Project) -> CmdResult {
    let (_, state) = project.open_state()?;
    for a in state.resources.keys() {
        outln!("{a}");
    }
    Ok(Exit::Success)
}

/// `state show ADDRESS`: the record of `address`, as pretty JSON.
pub(super) fn show(project: &Project, address: &str) -> CmdResult {
    let (_, state) = project.open_state()?;
    let r = state
        .resources
        .get(address)
        .ok_or_else(|| super::state_mv::unknown_address(project, &state, address))?;
    outln!(
        "{}",
        serde_json::to_string_pretty(r).map_err(CommandError::internal)?
    );
    Ok(Exit::Success)
}
