//! `gpuprov ssh NAME [-- CMD]` and `gpuprov ssh --print-config`, and the generated ssh
//! config behind them: each machine is `Host gpuprov-PROJECT-NAME` (PROJECT: the first 8
//! characters of the state's lineage), unique on this machine, plus the short
//! `gpuprov-NAME` while no other project's config under `$GPUPROV_HOME/projects/` names
//! it, so `ssh gpuprov-NAME` never reaches another project's machine.

use std::io::IsTerminal;
use std::path::PathBuf;

use miette::{miette, Context, IntoDiagnostic};

use super::args::SshArgs;
use super::error::{CmdResult, Exit};
use super::key::{project_key, KeyUse};
use super::project::{data_home, project_dir, Project};
use crate::ssh::config_file::{host_aliases, SSH_CONFIG_FILE};
use crate::ssh::keys::{KeySource, ProjectKey};
use crate::ssh::supply::ENV_PRIVATE_KEY;
use crate::ssh::{write_ssh_files, SshConfigEntry};
use crate::state::StateFile;

/// The alias of machine `name` that no other project can have: `gpuprov-PROJECT-NAME`.
pub(super) fn unique_alias(lineage: &str, name: &str) -> String {
    let project: String = lineage.chars().take(8).collect();
    format!("gpuprov-{project}-{name}")
}

/// The aliases other projects' generated configs name, each with the file naming it.
fn taken_aliases(ours: &str) -> Vec<(String, PathBuf)> {
    let Ok(dirs) = std::fs::read_dir(data_home().join("projects")) else {
        return Vec::new();
    };
    let mut taken = Vec::new();
    for d in dirs.flatten() {
        if d.file_name().to_str() == Some(ours) {
            continue;
        }
        let file = d.path().join(SSH_CONFIG_FILE);
        if let Ok(text) = std::fs::read_to_string(&file) {
            taken.extend(host_aliases(&text).into_iter().map(|a| (a, file.clone())));
        }
    }
    taken
}

/// Writes the ssh config and known_hosts of `state`'s machines into the project
/// directory, naming `key` (its file, or the public half of a supplied key) as the
/// identity; nothing for a key with no private half here. Returns a warning for each
/// short alias another project has taken.
pub(super) fn write_ssh_config(state: &StateFile, key: &ProjectKey) -> Result<Vec<String>, String> {
    let dir = project_dir(&state.lineage);
    let has_entries = state.resources.values().any(|r| r.machine.vm().is_some());
    if !has_entries && !dir.exists() {
        return Ok(Vec::new());
    }
    let Some(key_path) = key.config_identity_file(&dir).map_err(|e| e.to_string())? else {
        return Ok(Vec::new());
    };
    let taken = taken_aliases(&state.lineage);
    let mut warnings = Vec::new();
    let entries: Vec<SshConfigEntry> = state
        .resources
        .iter()
        .filter_map(|(address, r)| {
            let vm = r.machine.vm()?;
            let name = address.trim_start_matches("vm.");
            let long = unique_alias(&state.lineage, name);
            let short = format!("gpuprov-{name}");
            let other_aliases = match taken.iter().find(|(a, _)| *a == short) {
                Some((_, file)) => {
                    warnings.push(format!(
                        "ssh alias {short} is taken by another project ({}); reach {address} with `ssh {long}` or `gpuprov ssh {name}`",
                        file.display()
                    ));
                    vec![]
                }
                None => vec![short],
            };
            Some(SshConfigEntry {
                host_alias: long,
                other_aliases,
                hostname: vm.ssh.host.clone(),
                port: vm.ssh.port,
                user: vm.user.clone(),
                identity_file: key_path.clone(),
                host_key: vm.host_key.clone(),
            })
        })
        .collect();
    write_ssh_files(&dir, &entries).map_err(|e| e.to_string())?;
    Ok(warnings)
}

/// `gpuprov ssh --print-config`: writes this project's ssh config and prints it, with
/// the `Include` line that makes `ssh gpuprov-…` work.
fn print_config(project: &Project, state: &StateFile) -> CmdResult {
    let key = project_key(project, state, KeyUse::Connect)?;
    let warnings =
        write_ssh_config(state, &key).map_err(|e| miette!("cannot write the ssh config: {e}"))?;
    for w in warnings {
        errln!("warning: {w}");
    }
    let path = project_dir(&state.lineage).join(SSH_CONFIG_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => out!("{text}"),
        Err(_) => outln!(
            "# no machine of {} is up: no ssh config yet",
            project.location()
        ),
    }
    Ok(Exit::Success)
}

pub(super) async fn run(project: &Project, a: &SshArgs) -> CmdResult {
    let (_, state) = project.open_state()?;
    if a.print_config {
        return print_config(project, &state);
    }
    let name = a.name.as_deref().unwrap_or_default();
    let address = format!("vm.{name}");
    let rec = state.resources.get(&address).ok_or_else(|| {
        miette!(
            help = "list machines with `gpuprov list`",
            "no machine named {name:?} in {}",
            project.location()
        )
    })?;
    let vm = rec.machine.vm().ok_or_else(|| {
        miette!(
            help = "run `gpuprov apply` first",
            "{address} is not up: {}",
            rec.machine.label
        )
    })?;
    let key = project_key(project, &state, KeyUse::Connect)?;
    if a.command.is_empty() {
        // An interactive shell is best served by the user's OpenSSH client, through the
        // generated config that pins the host key.
        // Warnings about taken aliases are apply's to give; a login needs none.
        write_ssh_config(&state, &key).map_err(|e| miette!("cannot write the ssh config: {e}"))?;
        let cfg = project_dir(&state.lineage).join("ssh_config");
        let mut ssh = std::process::Command::new("ssh");
        ssh.arg("-F").arg(&cfg);
        if let KeySource::Memory(_) = key.source() {
            // The config names only the public half of a key from the environment; this
            // session gets a temporary copy, removed when `key` is dropped.
            let identity = key.openssh_identity().map_err(|e| miette!("{e}"))?;
            ssh.arg("-i").arg(identity);
        }
        let status = ssh
            .arg(unique_alias(&state.lineage, name))
            // The key's text stays with gpuprov: ssh and the remote shell never see it.
            .env_remove(ENV_PRIVATE_KEY)
            .status()
            .into_diagnostic()
            .wrap_err(
                "cannot run the ssh client (install openssh-client, or pass a command after --)",
            )?;
        return Ok(Exit::Remote(status.code().unwrap_or(1).clamp(0, 255) as u8));
    }
    // As OpenSSH does: the words are joined with spaces and the remote shell parses them,
    // so `-- 'nvidia-smi | head'` and `-- exit 7` mean what they do with ssh.
    let command = a.command.join(" ");
    let (endpoint, user, pinned) = (vm.ssh.clone(), vm.user.clone(), vm.host_key.clone());
    // Piped input is forwarded (`tar c . | gpuprov ssh vm -- tar x`); a terminal is not.
    let stdin: Option<Box<dyn std::io::Read + Send>> = (!std::io::stdin().is_terminal())
        .then(|| Box::new(std::io::stdin()) as Box<dyn std::io::Read + Send>);
    let status = tokio::task::spawn_blocking(move || {
        let mut out = std::io::stdout();
        let mut err = std::io::stderr();
        let io = crate::ssh::client::ExecIo {
            stdin,
            stdout: &mut out,
            stderr: &mut err,
        };
        crate::ssh::client::exec(&endpoint, &user, &key, &pinned, &command, io)
    })
    .await
    .into_diagnostic()?
    .map_err(|e| miette!("{e}"))?;
    Ok(Exit::Remote(status.clamp(0, 255) as u8))
}
