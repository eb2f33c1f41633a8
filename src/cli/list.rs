//! `gpuprov list [-json]`: the machines of the state, one line each.

use super::args::ListArgs;
use super::error::{CmdResult, CommandError, Exit};
use super::project::Project;
use super::view::json::{JsonList, ListEntry};

pub(super) fn run(project: &Project, a: &ListArgs) -> CmdResult {
    let (_, state) = project.open_state()?;
    let machines: Vec<ListEntry> = state
        .resources
        .iter()
        .map(|(address, r)| ListEntry {
            address: address.clone(),
            kind: r.machine.kind.clone(),
            label: r.machine.label.clone(),
        })
        .collect();
    if a.json.json {
        let out = JsonList { machines };
        outln!(
            "{}",
            serde_json::to_string_pretty(&out).map_err(CommandError::internal)?
        );
        return Ok(Exit::Success);
    }
    for m in &machines {
        outln!("{}\t{}\t{}", m.address, m.kind, m.label);
    }
    Ok(Exit::Success)
}
