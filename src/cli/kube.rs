//! `gpuprov kubeconfig NAME` and `gpuprov tunnel NAME`: the user's side of a machine's
//! k3s cluster (design 4.5, "Access mode").

use super::error::{CmdResult, Exit};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use miette::{miette, Report};

use super::args::{KubeconfigArgs, TunnelArgs};
use super::key::project_key;
use super::project::Project;
use crate::cluster::k3s::{write_private, AccessRecord, ClusterRecord, K3sState};
use crate::cluster::kubeconfig::{entry_name, Kubeconfig, API_PORT};
use crate::record::{self, Record};
use crate::state::StateFile;
use crate::vm::VmRecord;

/// The machine and its validated cluster, from the state.
fn cluster_of(project: &Project, name: &str) -> Result<(VmRecord, ClusterRecord), Report> {
    let (_, state) = project.open_state()?;
    let address = format!("vm.{name}");
    let rec = state.resources.get(&address).ok_or_else(|| {
        miette!(
            help = "list machines with `gpuprov list`",
            "no machine named {name:?} in {}",
            project.location()
        )
    })?;
    let s = match rec.machine.decode() {
        Ok(Record::K3s(s)) => s,
        Err(e) if e.invalid_kind() == Some(record::K3S) => {
            return Err(miette!(
                help = "the state file was edited by hand or written by an incompatible gpuprov; see `gpuprov state show {address}`",
                "state record {address} is {e}"
            ))
        }
        _ => {
            return Err(miette!(
                help = "set kubernetes = true for it (or pass --k8s) on a cloud that can host k3s (aws, lambda, digitalocean, hyperstack) and run `gpuprov apply`",
                "{address} is not a k3s cluster: {}",
                rec.machine.label
            ))
        }
    };
    match s {
        K3sState::Ready {
            vm,
            cluster: Some(c),
        } => Ok((*vm, c)),
        K3sState::Ready { vm, cluster: None } => Err(miette!(
            help = "k3s was skipped for it; list a cloud that can host k3s first in its `clouds`",
            "{address} is up on {}, which cannot host k3s",
            vm.location.cloud
        )),
        _ => Err(miette!(
            help = "run `gpuprov apply`; `gpuprov status` shows where it stopped",
            "the cluster of {address} is not ready: {}",
            rec.machine.label
        )),
    }
}

fn read_kubeconfig(path: &Path) -> Result<(String, Kubeconfig), Report> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        miette!(
            help = "it is written when `gpuprov apply` validates the cluster; run `gpuprov apply` again",
            "cannot read {}: {e}",
            path.display()
        )
    })?;
    let kc = Kubeconfig::parse(&text).map_err(|e| miette!("{}: {e}", path.display()))?;
    Ok((text, kc))
}

/// The files of `$KUBECONFIG` in order (empty entries skipped), or `~/.kube/config`.
fn kubeconfig_chain() -> Vec<PathBuf> {
    if let Some(v) = std::env::var_os("KUBECONFIG") {
        let files: Vec<PathBuf> = std::env::split_paths(&v)
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
        if !files.is_empty() {
            return files;
        }
    }
    dirs::home_dir()
        .map(|h| vec![h.join(".kube").join("config")])
        .unwrap_or_default()
}

/// The file `--merge` writes to: `explicit`, else kubectl's choice for a new entry ("The
/// kubeconfig file", Kubernetes docs: the first file of `$KUBECONFIG` that exists, else
/// its last one), else `~/.kube/config`.
fn merge_target(explicit: Option<&PathBuf>) -> Result<PathBuf, Report> {
    if let Some(p) = explicit {
        return Ok(p.clone());
    }
    let chain = kubeconfig_chain();
    chain
        .iter()
        .find(|p| p.exists())
        .or(chain.last())
        .cloned()
        .ok_or_else(|| {
            miette!(
                help = "pass --kubeconfig FILE",
                "no home directory to find ~/.kube/config in"
            )
        })
}

/// Whether `theirs` holds the same cluster as `ours` (same server and CA), under the
/// name gpuprov gives machine `name`.
fn same_cluster(theirs: &Kubeconfig, ours: &Kubeconfig, name: &str) -> Option<bool> {
    let n = entry_name(name);
    let t = theirs.clusters.iter().find(|c| c.name == n)?;
    let o = ours.clusters.iter().find(|c| c.name == n)?;
    let ca = |c: &crate::cluster::kubeconfig::Cluster| {
        c.other.get("certificate-authority-data").cloned()
    };
    Some(t.cluster.server == o.cluster.server && ca(&t.cluster) == ca(&o.cluster))
}

/// The line `apply` prints under a machine whose cluster is ready: how to use it.
pub(super) fn ready_hint(name: &str, r: &crate::state::ResourceRecord) -> Option<String> {
    let Ok(Record::K3s(s)) = r.machine.decode() else {
        return None;
    };
    match s {
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

/// The kubeconfigs of the state's clusters, read before a run that may destroy them, so
/// [`forget_cluster`] can tell the user's copies of *these* clusters from same-named
/// entries of other projects. Keyed by address; each with the machine name its entries
/// carry (the name it was created under, which a move does not change).
pub(super) fn clusters_of(state: &StateFile) -> BTreeMap<String, (String, Kubeconfig)> {
    state
        .resources
        .iter()
        .filter_map(|(address, r)| {
            let Ok(Record::K3s(s)) = r.machine.decode() else {
                return None;
            };
            let text = std::fs::read_to_string(s.kubeconfig()?).ok()?;
            let identity = r.identity_name(address).to_string();
            Some((address.clone(), (identity, Kubeconfig::parse(&text).ok()?)))
        })
        .collect()
}

/// After machine `name` is destroyed: removes its cluster, user and context from the
/// files of the user's kubeconfig chain where `--merge` put them, only where the entry is
/// this very cluster (same server and CA as `ours`). Returns the files changed, and
/// warnings for files that hold the entries but could not be cleaned.
pub(super) fn forget_cluster(name: &str, ours: &Kubeconfig) -> (Vec<PathBuf>, Vec<String>) {
    let (mut changed, mut warnings) = (Vec::new(), Vec::new());
    for path in kubeconfig_chain() {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let mut kc = match Kubeconfig::parse(&text) {
            Ok(k) => k,
            Err(e) if text.contains(&entry_name(name)) => {
                warnings.push(format!(
                    "{}: {e}; remove {} from it by hand (it holds the destroyed cluster's client key)",
                    path.display(),
                    entry_name(name)
                ));
                continue;
            }
            Err(_) => continue,
        };
        if same_cluster(&kc, ours, name) != Some(true) || !kc.remove_vm(name) {
            continue;
        }
        match kc
            .to_yaml()
            .map_err(|e| e.to_string())
            .and_then(|y| write_private(&path, y.as_bytes()).map_err(|e| e.to_string()))
        {
            Ok(()) => changed.push(path),
            Err(e) => warnings.push(format!("cannot clean {}: {e}", path.display())),
        }
    }
    (changed, warnings)
}

pub(super) async fn cmd_kubeconfig(project: &Project, a: &KubeconfigArgs) -> CmdResult {
    let (_, c) = cluster_of(project, &a.name)?;
    // Read it even for --path: a path to nothing would fail later, in kubectl.
    let (text, kc) = read_kubeconfig(&c.kubeconfig)?;
    if a.path {
        outln!("{}", c.kubeconfig.display());
        return Ok(Exit::Success);
    }
    if !a.merge {
        out!("{text}");
        return Ok(Exit::Success);
    }
    let target = merge_target(a.kubeconfig.as_ref())?;
    let unchanged =
        "fix it, or merge into another file with --kubeconfig FILE; it was not modified";
    let mut mine = match std::fs::read_to_string(&target) {
        Ok(t) => Kubeconfig::parse(&t)
            .map_err(|e| miette!(help = unchanged, "{}: {e}", target.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Kubeconfig::empty(),
        Err(e) => {
            return Err(miette!(help = unchanged, "cannot read {}: {e}", target.display()).into())
        }
    };
    let name = entry_name(&a.name);
    if same_cluster(&mine, &kc, &a.name) == Some(false) {
        return Err(miette!(
            help = format!(
                "it may be another project's machine named {:?}; remove it first (`kubectl config delete-context {name}; kubectl config delete-cluster {name}; kubectl config delete-user {name}`), or merge into another file with --kubeconfig FILE",
                a.name
            ),
            "{} already has a cluster {name} with another server or CA; it was not modified",
            target.display()
        ).into());
    }
    mine.merge(&kc, a.use_context);
    let yaml = mine
        .to_yaml()
        .map_err(|e| miette!("cannot render {}: {e}", target.display()))?;
    write_private(&target, yaml.as_bytes())
        .map_err(|e| miette!("cannot write {}: {e}", target.display()))?;
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
    Ok(Exit::Success)
}

/// Resolves on Ctrl-C, SIGTERM or SIGHUP: the tunnel runs in the foreground, or with `&`
/// and is stopped by `kill`, and either way its ssh must not outlive it.
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let (Ok(mut term), Ok(mut hup)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::hangup()),
        ) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
                _ = hup.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

pub(super) async fn cmd_tunnel(project: &Project, a: &TunnelArgs) -> CmdResult {
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
    // `--port 0`: any free port.
    let wanted = match a.port {
        Some(0) => None,
        Some(p) => Some(p),
        None => Some(recorded_port),
    };
    let (_, state) = project.open_state()?;
    let key = project_key(project, &state, super::key::KeyUse::Connect)?;
    let mut tunnel = crate::cluster::tunnel::Tunnel::open(&vm, &key, wanted, API_PORT)
        .await
        .map_err(Report::new)?;
    let port = tunnel.local_port();
    errln!(
        "Forwarding https://127.0.0.1:{port} to the Kubernetes API of {} ({}). Press Ctrl-C to stop.",
        a.name,
        vm.ssh
    );
    if port != recorded_port {
        errln!(
            "note: the kubeconfig points at 127.0.0.1:{recorded_port}; use `kubectl --server https://127.0.0.1:{port}`"
        );
    }
    super::interrupt::take_over();
    // The tunnel (and its ssh) is dropped on every way out, so nothing is left listening.
    // Stopping it is how it is meant to end: exit 0, whichever signal stopped it.
    tokio::select! {
        () = stop_signal() => {
            errln!("\nTunnel closed.");
            Ok(Exit::Success)
        }
        status = tunnel.wait() => {
            Err(miette!("the ssh tunnel ended: {}", match status {
                Ok(s) => s.to_string(),
                Err(e) => e.to_string(),
            }).into())
        }
    }
}
