//! `gpuprov kubeconfig NAME` and `gpuprov tunnel NAME`: the user's side of a machine's
//! k3s cluster (design 4.5, "Access mode").

use std::path::PathBuf;
use std::process::ExitCode;

use miette::{miette, Report};

use super::args::{KubeconfigArgs, TunnelArgs};
use super::{project_key, Project};
use crate::cluster::k3s::{write_private, AccessRecord, ClusterRecord, K3sState};
use crate::cluster::kubeconfig::{Kubeconfig, API_PORT};
use crate::vm::VmRecord;

/// The machine and its validated cluster, from the state.
fn cluster_of(project: &Project, name: &str) -> Result<(VmRecord, ClusterRecord), Report> {
    let (_, state) = project.open_state()?;
    let address = format!("vm.{name}");
    let rec = state.resources.get(&address).ok_or_else(|| {
        miette!(
            help = "list machines with `gpuprov list`",
            "no machine named {name:?} in {}",
            project.state_path.display()
        )
    })?;
    let not_cluster = || {
        miette!(
            help = "set kubernetes = true for it (or pass --k8s) and run `gpuprov apply`",
            "{address} is not a k3s cluster: {}",
            rec.machine.label
        )
    };
    if rec.machine.kind != "k3s" {
        return Err(not_cluster());
    }
    let s: K3sState =
        serde_json::from_value(rec.machine.state.clone()).map_err(|_| not_cluster())?;
    match s {
        K3sState::Ready {
            vm,
            cluster: Some(c),
        } => Ok((*vm, c)),
        K3sState::Ready { cluster: None, .. } => Err(not_cluster()),
        _ => Err(miette!(
            help = "run `gpuprov apply`; `gpuprov status` shows where it stopped",
            "the cluster of {address} is not ready: {}",
            rec.machine.label
        )),
    }
}

fn read_kubeconfig(c: &ClusterRecord) -> Result<(String, Kubeconfig), Report> {
    let text = std::fs::read_to_string(&c.kubeconfig).map_err(|e| {
        miette!(
            help = "it is written when `gpuprov apply` validates the cluster; run `gpuprov apply` again",
            "cannot read {}: {e}",
            c.kubeconfig.display()
        )
    })?;
    let kc = Kubeconfig::parse(&text).map_err(|e| miette!("{}: {e}", c.kubeconfig.display()))?;
    Ok((text, kc))
}

/// The user's kubeconfig file: `explicit`, else the first entry of `$KUBECONFIG`, else
/// `~/.kube/config` (kubectl's own order, "Organizing Cluster Access Using kubeconfig
/// Files").
fn user_kubeconfig(explicit: Option<&PathBuf>) -> Result<PathBuf, Report> {
    if let Some(p) = explicit {
        return Ok(p.clone());
    }
    if let Some(v) = std::env::var_os("KUBECONFIG") {
        if let Some(first) = std::env::split_paths(&v).find(|p| !p.as_os_str().is_empty()) {
            return Ok(first);
        }
    }
    dirs::home_dir()
        .map(|h| h.join(".kube").join("config"))
        .ok_or_else(|| {
            miette!(
                help = "pass --kubeconfig FILE",
                "no home directory to find ~/.kube/config in"
            )
        })
}

/// The line `apply` prints under a machine whose cluster is ready: how to use it.
pub(super) fn ready_hint(name: &str, r: &crate::state::ResourceRecord) -> Option<String> {
    if r.machine.kind != "k3s" {
        return None;
    }
    match serde_json::from_value::<K3sState>(r.machine.state.clone()).ok()? {
        K3sState::Ready {
            cluster: Some(c), ..
        } => Some(match c.access {
            AccessRecord::Direct { .. } => format!(
                "k3s ready: export KUBECONFIG={} (or `gpuprov kubeconfig {name} --merge`)",
                c.kubeconfig.display()
            ),
            AccessRecord::SshTunnel { .. } => format!(
                "k3s ready: run `gpuprov tunnel {name}`, then export KUBECONFIG={} (or `gpuprov kubeconfig {name} --merge`)",
                c.kubeconfig.display()
            ),
        }),
        _ => None,
    }
}

/// After `name` is destroyed: removes its cluster, user and context from the user's
/// default kubeconfig (`$KUBECONFIG`'s first file, else `~/.kube/config`) if
/// `--merge` put them there. Returns the file when it changed. A file that does not parse
/// is left alone.
pub(super) fn forget_cluster(name: &str) -> Option<PathBuf> {
    let path = user_kubeconfig(None).ok()?;
    let text = std::fs::read_to_string(&path).ok()?;
    let mut kc = Kubeconfig::parse(&text).ok()?;
    if !kc.remove_vm(name) {
        return None;
    }
    let yaml = kc.to_yaml().ok()?;
    write_private(&path, yaml.as_bytes()).ok()?;
    Some(path)
}

pub(super) async fn cmd_kubeconfig(
    project: &Project,
    a: &KubeconfigArgs,
) -> Result<ExitCode, Report> {
    let (_, c) = cluster_of(project, &a.name)?;
    if a.path {
        outln!("{}", c.kubeconfig.display());
        return Ok(ExitCode::SUCCESS);
    }
    let (text, kc) = read_kubeconfig(&c)?;
    if !a.merge {
        out!("{text}");
        return Ok(ExitCode::SUCCESS);
    }
    let target = user_kubeconfig(a.kubeconfig.as_ref())?;
    let mut mine = match std::fs::read_to_string(&target) {
        Ok(t) if t.trim().is_empty() => Kubeconfig::empty(),
        Ok(t) => Kubeconfig::parse(&t).map_err(|e| {
            miette!(
                help = "fix it, or merge into another file with --kubeconfig FILE; it was not modified",
                "{}: {e}",
                target.display()
            )
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Kubeconfig::empty(),
        Err(e) => return Err(miette!("cannot read {}: {e}", target.display())),
    };
    mine.merge(&kc, a.use_context);
    let yaml = mine
        .to_yaml()
        .map_err(|e| miette!("cannot render {}: {e}", target.display()))?;
    write_private(&target, yaml.as_bytes())
        .map_err(|e| miette!("cannot write {}: {e}", target.display()))?;
    let name = crate::cluster::kubeconfig::entry_name(&a.name);
    errln!(
        "Merged context {name} into {}{}",
        target.display(),
        if a.use_context {
            " and made it the current context"
        } else {
            ""
        }
    );
    if let AccessRecord::SshTunnel { .. } = c.access {
        errln!(
            "note: this cluster is reached through `gpuprov tunnel {}`",
            a.name
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn cmd_tunnel(project: &Project, a: &TunnelArgs) -> Result<ExitCode, Report> {
    let (vm, c) = cluster_of(project, &a.name)?;
    let recorded_port = match c.access {
        AccessRecord::SshTunnel { local_port } => local_port,
        AccessRecord::Direct { ref host } => {
            errln!(
                "note: {} is also reachable directly at https://{host}:{API_PORT}",
                a.name
            );
            API_PORT
        }
    };
    let port = a.port.unwrap_or(recorded_port);
    let (_, state) = project.open_state()?;
    let key = project_key(&state.lineage)?;
    let mut tunnel = crate::cluster::tunnel::Tunnel::open(&vm, &key, Some(port), API_PORT)
        .await
        .map_err(Report::new)?;
    errln!(
        "Forwarding https://127.0.0.1:{} to the Kubernetes API of {} ({}). Press Ctrl-C to stop.",
        tunnel.local_port(),
        a.name,
        vm.ssh
    );
    if port != recorded_port {
        errln!(
            "note: the kubeconfig points at 127.0.0.1:{recorded_port}; use `--server https://127.0.0.1:{port}` with kubectl"
        );
    }
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {
            errln!("\nTunnel closed.");
            Ok(ExitCode::SUCCESS)
        }
        status = tunnel.wait() => {
            Err(miette!("the ssh tunnel ended: {}", match status {
                Ok(s) => s.to_string(),
                Err(e) => e.to_string(),
            }))
        }
    }
}
