//! `gpuprov state mv SOURCE DESTINATION`: renames a machine in the state, keeping its
//! instance. The record remembers the name the machine's cloud objects carry (their
//! `gpuprov-vm-name` label, which clouds mostly cannot change), so refresh, replace and
//! destroy still find them: see [`crate::plan::move_record`].

use miette::miette;

use super::args::{Cli, StateMvArgs};
use super::error::{CmdResult, CommandError, Exit};
use super::key::{project_key, KeyUse};
use super::project::Project;
use super::ssh;
use crate::plan::MoveError;
use crate::state::StateFile;

/// Moves `a.source` to `a.destination` under the lock (unless `-lock=false`): backup,
/// serial + 1. Refused, with nothing written, when an address is malformed, the source
/// is not in the state or the destination is.
pub(super) fn run(cli: &Cli, project: &Project, a: &StateMvArgs) -> CmdResult {
    check_address(&a.source)?;
    check_address(&a.destination)?;
    let _lock = if a.lock {
        Some(project.lock("state mv", cli.lock_timeout)?)
    } else {
        None
    };
    let (mut store, mut state) = project.open_state()?;
    let before = state.resources.get(&a.source).cloned();
    match crate::plan::move_record(&mut state, &a.source, &a.destination) {
        Ok(()) => {}
        Err(MoveError::SourceMissing(_)) => {
            return Err(unknown_address(project, &state, &a.source))
        }
        Err(e @ MoveError::DestinationExists(_)) => {
            return Err(miette!(
                code = "gpuprov::state::address_taken",
                help = format!(
                    "pick another name, or forget the machine there first (`gpuprov state rm {}`)",
                    a.destination
                ),
                "cannot move {} to {}: {e}",
                a.source,
                a.destination
            )
            .into())
        }
    }
    let carried = state.resources[&a.destination]
        .identity_name(&a.destination)
        .to_string();
    let keeps = before
        .as_ref()
        .and_then(|r| r.machine.vm())
        .map(|vm| format!(" (instance {} at {})", vm.instance_id, vm.location))
        .unwrap_or_default();
    if a.dry_run {
        outln!("Would move {} to {}{keeps}", a.source, a.destination);
        return Ok(Exit::Success);
    }
    store.save(&mut state)?;
    outln!("Move {} to {}{keeps}", a.source, a.destination);
    outln!("Successfully moved 1 object.");
    if carried != a.destination.trim_start_matches("vm.") {
        errln!(
            "note: its cloud objects keep the name {carried} (label gpuprov-vm-name), which gpuprov still matches; a replacement made later carries the new name"
        );
    }
    refresh_ssh_config(project, &state);
    Ok(Exit::Success)
}

/// Checks an address is `vm.NAME` with a valid machine name.
///
/// # Errors
///
/// A usage error naming the address.
pub(super) fn check_address(address: &str) -> Result<(), CommandError> {
    match address.strip_prefix("vm.") {
        Some(name) if crate::config::valid_vm_name(name) => Ok(()),
        _ => Err(CommandError::usage(
            format!("invalid address {address:?}: expected vm.NAME"),
            Some("addresses are vm.NAME, as `gpuprov state list` prints them".into()),
        )),
    }
}

/// The diagnostic for an address the state does not have, listing those it has.
pub(super) fn unknown_address(project: &Project, state: &StateFile, address: &str) -> CommandError {
    let known = if state.resources.is_empty() {
        "the state has no machines".to_string()
    } else {
        format!(
            "addresses in the state: {}",
            state
                .resources
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    miette!(
        code = "gpuprov::state::no_such_address",
        help = known,
        "no resource {address} in {}",
        project.location()
    )
    .into()
}

/// Rewrites the project's ssh config for `state` (aliases follow the addresses), when
/// the project key is at hand on this machine; without it there is nothing to name.
pub(super) fn refresh_ssh_config(project: &Project, state: &StateFile) {
    if let Ok(key) = project_key(project, state, KeyUse::Connect) {
        match ssh::write_ssh_config(state, &key) {
            Ok(warnings) => warnings.iter().for_each(|w| errln!("warning: {w}")),
            Err(e) => errln!("warning: cannot write the ssh config: {e}"),
        }
    }
}
