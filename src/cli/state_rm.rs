//! `gpuprov state rm ADDRESS...`: forgets machines without destroying them. They keep
//! running and billing; `gpuprov sweep` lists what no state knows.

use super::args::{Cli, StateRmArgs};
use super::error::{CmdResult, Exit};
use super::project::Project;
use super::state_mv::{check_address, refresh_ssh_config, unknown_address};
use crate::state::ResourceRecord;

/// Removes `a.addresses` from the state under the lock (unless `-lock=false`): backup,
/// serial + 1, one save. Every address is checked first: a malformed or unknown one
/// fails the command with nothing written. Prints, for each machine recorded as owning
/// cloud resources, a warning with its instance ids, location and hourly price.
pub(super) fn run(cli: &Cli, project: &Project, a: &StateRmArgs) -> CmdResult {
    for address in &a.addresses {
        check_address(address)?;
    }
    let _lock = if a.lock {
        Some(project.lock("state rm", cli.lock_timeout)?)
    } else {
        None
    };
    let (mut store, mut state) = project.open_state()?;
    if let Some(missing) = a
        .addresses
        .iter()
        .find(|address| !state.resources.contains_key(*address))
    {
        return Err(unknown_address(project, &state, missing));
    }
    let mut addresses = a.addresses.clone();
    addresses.dedup();
    let removed: Vec<(String, ResourceRecord)> = addresses
        .iter()
        .filter_map(|address| {
            state
                .resources
                .remove(address)
                .map(|r| (address.clone(), r))
        })
        .collect();
    if a.dry_run {
        for (address, r) in &removed {
            outln!("Would remove {address}");
            warn_still_running(address, r, true);
        }
        return Ok(Exit::Success);
    }
    store.save(&mut state)?;
    for (address, r) in &removed {
        outln!("Removed {address}");
        warn_still_running(address, r, false);
    }
    outln!(
        "Successfully removed {} resource instance(s).",
        removed.len()
    );
    refresh_ssh_config(project, &state);
    Ok(Exit::Success)
}

/// Warns that what `r` records as owned (instances, side resources) is not destroyed.
fn warn_still_running(address: &str, r: &ResourceRecord, dry_run: bool) {
    let owned = r.machine.owned();
    let verb = if dry_run { "would be" } else { "is" };
    let what = match owned {
        Ok(Some(o)) => {
            let price =
                o.vm.as_ref()
                    .map(|vm| format!(" (${:.2}/h)", vm.offer.price_per_hour))
                    .unwrap_or_default();
            if o.instance_ids.is_empty() {
                format!("resources it may own at {}{price}", o.location)
            } else {
                format!(
                    "instance {} at {}{price}",
                    o.instance_ids.join(", "),
                    o.location
                )
            }
        }
        Ok(None) => return,
        Err(_) => "whatever its unreadable record owned".into(),
    };
    errln!(
        "warning: {address} {verb} forgotten, not destroyed: {what} keeps running and billing; `gpuprov sweep` will list it (cloud label gpuprov-vm-name={})",
        r.identity_name(address)
    );
}
