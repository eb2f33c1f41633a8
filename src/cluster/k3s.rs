//! The k3s machine (design 4.5): the launch machine as a child (`Vm`), then
//! CheckingBootInstall → [Installing] → AwaitingApi → FetchingKubeconfig → Validating →
//! Ready, or Failed. One journal record per VM holds the whole nested state.
//!
//! Failure policy: a k3s failure leaves the VM up (`Failed { vm: Some(..) }`) for
//! debugging; `destroy` removes it, and the next `apply` reuses it and re-enters at
//! CheckingBootInstall (the installer is pushed again; it is idempotent).
//!
//! Every step observes before it acts, as in the launch machine: the installer is
//! idempotent and serialised on a host-wide lock, the kubeconfig write is atomic, and
//! validation only reads.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::api::{serving_cert_pem, ApiConnector, KubeClient};
use super::installer::{GpuMode, InstallerConfig};
use super::kubeconfig::{ApiAccess, Kubeconfig, API_PORT};
use super::probe::{self, BootProbe, BootRoute, DecideCtx, Decision, BOOT_INSTALL_DEADLINE};
use super::remote::{install_command, installer_stdin, read_kubeconfig_command, NodeShell};
use super::san::{cert_coverage, Coverage, SanInputs, SanList};
use crate::machine::{Facts, Machine, RetryPolicy, Step, StepCx};
use crate::provider::Feature;
use crate::ssh::SshError;
use crate::vm::{LaunchMachine, LaunchState, Owned, VmRecord};

/// How the user reaches the API, as recorded (the serde form of [`ApiAccess`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum AccessRecord {
    /// The cloud opened 6443: `https://<host>:6443`.
    Direct { host: String },
    /// `gpuprov tunnel <vm>` forwards `127.0.0.1:<local_port>` to the VM's 6443.
    SshTunnel { local_port: u16 },
}

impl AccessRecord {
    /// The same access as the kubeconfig layer's type.
    pub fn to_access(&self) -> ApiAccess {
        match self {
            AccessRecord::Direct { host } => ApiAccess::Direct { host: host.clone() },
            AccessRecord::SshTunnel { local_port } => ApiAccess::SshTunnel {
                local_port: *local_port,
            },
        }
    }
}

/// A validated cluster: what `status` and `gpuprov kubeconfig` need. Holds no secret:
/// the kubeconfig (which holds the client key) is only referenced by path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterRecord {
    pub access: AccessRecord,
    /// The kubeconfig gpuprov wrote for this VM (mode 0600).
    pub kubeconfig: PathBuf,
    /// `nvidia.com/gpu` allocatable on the node when validated.
    pub allocatable_gpus: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet_version: Option<String>,
}

/// The k3s machine's journalled state (persisted: keep it small and stable). Tagged
/// `k3s` so the nested launch state keeps its own `state` tag.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "k3s", rename_all = "snake_case")]
pub enum K3sState {
    /// The child launch machine runs. `reused`: the VM existed before this run, so its
    /// boot script (if any) may not be this run's and the installer is pushed.
    Vm {
        launch: Box<LaunchState>,
        #[serde(default)]
        reused: bool,
    },
    CheckingBootInstall {
        vm: Box<VmRecord>,
        route: BootRoute,
    },
    Installing {
        vm: Box<VmRecord>,
        /// Why the installer is pushed (for the journal and progress).
        reason: String,
    },
    AwaitingApi {
        vm: Box<VmRecord>,
    },
    FetchingKubeconfig {
        vm: Box<VmRecord>,
    },
    Validating {
        vm: Box<VmRecord>,
        access: AccessRecord,
        kubeconfig: PathBuf,
        /// The installer was already re-run once to add the access host to the API
        /// certificate.
        #[serde(default)]
        san_rerun: bool,
    },
    /// `cluster` is `None` when the VM landed on a cloud that cannot host k3s (a VM
    /// whose clouds include one that can, and one that cannot).
    Ready {
        vm: Box<VmRecord>,
        cluster: Option<ClusterRecord>,
    },
    /// Terminal. `vm` is set when the machine is up (left running for debugging);
    /// `launch` holds the child's end when the VM never came up (it may own a leaked
    /// instance).
    Failed {
        stage: String,
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vm: Option<Box<VmRecord>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        launch: Option<Box<LaunchState>>,
    },
}

impl K3sState {
    /// A fresh start: the launch machine first looks at what `previous` may own (a VM
    /// that is up is reused).
    pub fn start(previous: Option<Owned>) -> K3sState {
        let reused = previous.as_ref().is_some_and(|o| o.vm.is_some());
        K3sState::Vm {
            launch: Box::new(LaunchState::start(previous)),
            reused,
        }
    }

    /// The machine when the VM is up (in any k3s stage, including `Failed`).
    pub fn vm(&self) -> Option<&VmRecord> {
        match self {
            K3sState::Vm { launch, .. } => launch.ready(),
            K3sState::CheckingBootInstall { vm, .. }
            | K3sState::Installing { vm, .. }
            | K3sState::AwaitingApi { vm }
            | K3sState::FetchingKubeconfig { vm }
            | K3sState::Validating { vm, .. }
            | K3sState::Ready { vm, .. } => Some(vm),
            K3sState::Failed { vm, .. } => vm.as_deref(),
        }
    }

    /// The cloud resources this state may own.
    pub fn owned(&self) -> Option<Owned> {
        match self {
            K3sState::Vm { launch, .. } => launch.owned(),
            K3sState::Failed {
                vm: None,
                launch: Some(l),
                ..
            } => l.owned(),
            other => other.vm().map(|vm| Owned {
                vm: Some(Box::new(vm.clone())),
                ..Owned::at(vm.location.clone(), vec![vm.instance_id.clone()])
            }),
        }
    }

    /// The kubeconfig gpuprov wrote for this VM, once written.
    pub fn kubeconfig(&self) -> Option<&Path> {
        match self {
            K3sState::Validating { kubeconfig, .. } => Some(kubeconfig),
            K3sState::Ready {
                cluster: Some(c), ..
            } => Some(&c.kubeconfig),
            _ => None,
        }
    }

    /// The child's leaked end, when the VM's launch leaked.
    pub fn leaked(&self) -> Option<&LaunchState> {
        match self {
            K3sState::Failed {
                launch: Some(l), ..
            } if matches!(**l, LaunchState::Leaked { .. }) => Some(l),
            _ => None,
        }
    }
}

/// The k3s machine's time limits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct K3sTimeouts {
    /// How long to wait for the boot-time install (design: ≤ 15 min).
    pub boot_install: Duration,
    pub probe_interval: Duration,
    /// One SSH push of the installer.
    pub install: Duration,
    /// `/readyz` on the node after install.
    pub api: Duration,
    /// Validation over the user's access path.
    pub validate: Duration,
    pub api_poll: Duration,
}

impl Default for K3sTimeouts {
    fn default() -> Self {
        K3sTimeouts {
            boot_install: BOOT_INSTALL_DEADLINE,
            probe_interval: Duration::from_secs(10),
            install: Duration::from_secs(20 * 60),
            api: Duration::from_secs(10 * 60),
            validate: Duration::from_secs(10 * 60),
            api_poll: Duration::from_secs(5),
        }
    }
}

/// Runs one VM's cluster: the launch machine as a child, then the k3s stages.
pub struct K3sMachine {
    pub launch: LaunchMachine,
    pub shell: Arc<dyn NodeShell>,
    pub api: Arc<dyn ApiConnector>,
    /// Where per-VM kubeconfigs are written (`<dir>/<vm>.yaml`, mode 0600).
    pub kubeconfig_dir: PathBuf,
    /// The installer settings besides the SAN list and GPU mode, which are per VM
    /// (k3s source, device plugin image, waits).
    pub installer: InstallerConfig,
    pub timeouts: K3sTimeouts,
    pub retry: RetryPolicy,
}

impl K3sMachine {
    /// Wraps `launch`. On clouds that run boot scripts the installer becomes the VM's boot
    /// script (the public IP comes from the metadata service at boot); on clouds that
    /// open ports, 6443 is opened so the API is reached directly.
    pub fn new(
        mut launch: LaunchMachine,
        shell: Arc<dyn NodeShell>,
        api: Arc<dyn ApiConnector>,
        kubeconfig_dir: PathBuf,
        installer: InstallerConfig,
    ) -> K3sMachine {
        let caps: Vec<_> = launch
            .vm
            .clouds
            .iter()
            .filter_map(|c| launch.providers.get(c.as_str()))
            .map(|p| p.capabilities())
            .collect();
        if caps.iter().any(|c| c.supports(Feature::BootScript)) {
            let mut boot = installer.clone();
            boot.tls_sans = SanList::for_vm(&SanInputs::default()).unwrap_or_default();
            boot.san_from_metadata = true;
            // The offer (and so its GPU count) is not chosen yet: a VM that asked for GPUs
            // requires one, any other takes the GPU path if the machine has one.
            boot.gpu = if launch.vm.gpu_count > 0 {
                GpuMode::Required
            } else {
                GpuMode::Auto
            };
            launch.boot_script = boot.boot_script().ok();
        }
        if caps.iter().any(|c| c.supports(Feature::Firewall))
            && !launch.vm.ports.contains(&API_PORT)
        {
            launch.vm.ports.push(API_PORT);
        }
        K3sMachine {
            retry: launch.retry,
            launch,
            shell,
            api,
            kubeconfig_dir,
            installer,
            timeouts: K3sTimeouts::default(),
        }
    }

    fn supports(&self, cloud: &str, f: Feature) -> bool {
        self.launch
            .providers
            .get(cloud)
            .is_some_and(|p| p.capabilities().supports(f))
    }

    /// Direct when the VM's cloud opens ports (6443 was asked for), else an SSH tunnel.
    pub fn access_for(&self, vm: &VmRecord) -> AccessRecord {
        if self.supports(&vm.location.cloud, Feature::Firewall) {
            AccessRecord::Direct {
                host: vm.ssh.host.clone(),
            }
        } else {
            AccessRecord::SshTunnel {
                local_port: API_PORT,
            }
        }
    }

    fn route_for(&self, vm: &VmRecord, reused: bool) -> BootRoute {
        if reused {
            BootRoute::Reused
        } else if self.launch.boot_script.is_some()
            && self.supports(&vm.location.cloud, Feature::BootScript)
        {
            BootRoute::CloudInit
        } else {
            BootRoute::NoBootScript
        }
    }

    /// The installer for an SSH push to `vm`: the SAN list covers its public host.
    pub fn installer_for(&self, vm: &VmRecord) -> InstallerConfig {
        let mut cfg = self.installer.clone();
        cfg.tls_sans = SanList::for_vm(&SanInputs {
            public_host: Some(vm.ssh.host.clone()),
            ..SanInputs::default()
        })
        .unwrap_or_default();
        cfg.san_from_metadata = false;
        cfg.gpu = GpuMode::for_gpu_count(vm.offer.gpu_count);
        cfg
    }

    /// The kubeconfig path of VM `name`.
    pub fn kubeconfig_path(&self, name: &str) -> PathBuf {
        self.kubeconfig_dir.join(format!("{name}.yaml"))
    }

    fn failed(stage: &str, reason: impl Into<String>, vm: &VmRecord) -> K3sState {
        K3sState::Failed {
            stage: stage.into(),
            reason: reason.into(),
            vm: Some(Box::new(vm.clone())),
            launch: None,
        }
    }

    /// What an SSH error means for a k3s step: a changed host key ends it, anything else
    /// is retried within the budget.
    fn ssh_error(stage: &str, vm: &VmRecord, e: SshError) -> Step<K3sState> {
        match e {
            SshError::HostKeyMismatch { .. } => Step::Next(Self::failed(stage, e.to_string(), vm)),
            other => Step::retry(other.to_string()),
        }
    }

    async fn push_installer(&self, vm: &VmRecord) -> Result<(), Step<K3sState>> {
        let stdin = installer_stdin(&self.installer_for(vm))
            .map_err(|e| Step::Next(Self::failed("installing", e.to_string(), vm)))?;
        crate::crash::point("k3s.push.before").await;
        let cmd = install_command(&vm.user);
        let run = self.shell.run(vm, &cmd, Some(stdin));
        let out = match tokio::time::timeout(self.timeouts.install, run).await {
            Err(_) => {
                return Err(Step::retry(format!(
                    "the installer did not finish within {}",
                    humantime::format_duration(self.timeouts.install)
                )))
            }
            Ok(Err(e)) => return Err(Self::ssh_error("installing", vm, e)),
            Ok(Ok(out)) => out,
        };
        crate::crash::point("k3s.push.after").await;
        if out.status != 0 {
            let tail: Vec<&str> = out.stderr.lines().rev().take(3).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(Step::retry(format!(
                "the installer exited {}: {}",
                out.status,
                tail.join(" / ")
            )));
        }
        Ok(())
    }

    async fn check_boot_install(
        &self,
        vm: &VmRecord,
        route: BootRoute,
        cx: &StepCx,
    ) -> Step<K3sState> {
        let out = match self.shell.run(vm, &probe::command(), None).await {
            Ok(o) => o,
            Err(e) => return Self::ssh_error("checking_boot_install", vm, e),
        };
        let ctx = DecideCtx {
            route,
            expected_gpus: vm.offer.gpu_count,
            elapsed: cx.in_state,
            deadline: self.timeouts.boot_install,
        };
        match BootProbe::parse(&out.stdout).decide(&ctx) {
            Decision::Installed => Step::Next(K3sState::AwaitingApi {
                vm: Box::new(vm.clone()),
            }),
            Decision::Wait => Step::poll(self.timeouts.probe_interval, "k3s installing at boot"),
            Decision::PushOverSsh(reason) => Step::Next(K3sState::Installing {
                vm: Box::new(vm.clone()),
                reason: reason.to_string(),
            }),
        }
    }

    /// `/readyz` on the node itself (`k3s kubectl` uses the node's admin credentials;
    /// k3s runs the API server with anonymous auth off, so an unauthenticated probe from
    /// outside would only ever see 401).
    async fn await_api(&self, vm: &VmRecord, cx: &StepCx) -> Step<K3sState> {
        let cmd = super::remote::as_root(&vm.user, "k3s kubectl get --raw=/readyz");
        let last = match self.shell.run(vm, &cmd, None).await {
            Ok(o) if o.status == 0 && o.stdout.trim() == "ok" => {
                return Step::Next(K3sState::FetchingKubeconfig {
                    vm: Box::new(vm.clone()),
                })
            }
            Ok(o) => format!(
                "/readyz: {}",
                first_line(if o.stdout.trim().is_empty() {
                    &o.stderr
                } else {
                    &o.stdout
                })
            ),
            Err(e @ SshError::HostKeyMismatch { .. }) => {
                return Step::Next(Self::failed("awaiting_api", e.to_string(), vm))
            }
            Err(e) => e.to_string(),
        };
        if cx.in_state >= self.timeouts.api {
            return Step::Next(Self::failed(
                "awaiting_api",
                format!(
                    "the Kubernetes API was not ready within {}: {last}",
                    humantime::format_duration(self.timeouts.api)
                ),
                vm,
            ));
        }
        Step::poll(
            self.timeouts.api_poll,
            format!("waiting for the API ({last})"),
        )
    }

    async fn fetch_kubeconfig(&self, vm: &VmRecord) -> Step<K3sState> {
        let out = match self
            .shell
            .run(vm, &read_kubeconfig_command(&vm.user), None)
            .await
        {
            Ok(o) if o.status == 0 => o,
            Ok(o) => {
                return Step::retry(format!(
                    "cannot read the k3s kubeconfig: {}",
                    first_line(&o.stderr)
                ))
            }
            Err(e) => return Self::ssh_error("fetching_kubeconfig", vm, e),
        };
        let access = self.access_for(vm);
        let name = &self.launch.vm.name;
        let kc = match Kubeconfig::from_k3s(&out.stdout, name, &access.to_access()) {
            Ok(k) => k,
            // The text may hold the client key: the error carries only its position.
            Err(e) => return Step::Next(Self::failed("fetching_kubeconfig", e.to_string(), vm)),
        };
        let path = self.kubeconfig_path(name);
        crate::crash::point("k3s.kubeconfig.before").await;
        if let Err(e) = write_private(&path, kc.to_yaml().unwrap_or_default().as_bytes()) {
            return Step::retry(format!("cannot write {}: {e}", path.display()));
        }
        crate::crash::point("k3s.kubeconfig.after").await;
        Step::Next(K3sState::Validating {
            vm: Box::new(vm.clone()),
            access,
            kubeconfig: path,
            san_rerun: false,
        })
    }

    async fn validate(
        &self,
        vm: &VmRecord,
        access: &AccessRecord,
        kubeconfig: &Path,
        san_rerun: bool,
        cx: &StepCx,
    ) -> Step<K3sState> {
        let pending = |what: String| -> Step<K3sState> {
            if cx.in_state >= self.timeouts.validate {
                Step::Next(Self::failed(
                    "validating",
                    format!(
                        "not valid within {}: {what}",
                        humantime::format_duration(self.timeouts.validate)
                    ),
                    vm,
                ))
            } else {
                Step::poll(self.timeouts.api_poll, format!("validating: {what}"))
            }
        };
        let kc = match std::fs::read_to_string(kubeconfig)
            .ok()
            .and_then(|t| Kubeconfig::parse(&t).ok())
        {
            Some(k) => k,
            // Removed or damaged since it was written: fetch it again.
            None => {
                return Step::Next(K3sState::FetchingKubeconfig {
                    vm: Box::new(vm.clone()),
                })
            }
        };
        let api_access = access.to_access();
        let path = match self.api.open(vm, &api_access).await {
            Ok(p) => p,
            Err(e) => return pending(format!("cannot open the access path: {e}")),
        };
        // The certificate must cover the host the user connects to.
        let pem = match serving_cert_pem(&path.base_url).await {
            Ok(p) => p,
            Err(e) => return pending(e.to_string()),
        };
        match cert_coverage(&pem, api_access.host()) {
            Ok(Coverage::Covered) => {}
            Ok(Coverage::Missing { host, cert_sans }) => {
                let sans: Vec<String> = cert_sans.iter().map(ToString::to_string).collect();
                let why = format!(
                    "the API certificate does not cover {host} (it covers {})",
                    sans.join(", ")
                );
                if san_rerun {
                    return Step::Next(Self::failed(
                        "validating",
                        format!("{why}, even after re-running the installer with it"),
                        vm,
                    ));
                }
                // Re-run the installer once with the SAN (design 4.5, "TLS SAN").
                if let Err(step) = self.push_installer(vm).await {
                    return step;
                }
                return Step::Next(K3sState::Validating {
                    vm: Box::new(vm.clone()),
                    access: access.clone(),
                    kubeconfig: kubeconfig.to_path_buf(),
                    san_rerun: true,
                });
            }
            Err(e) => return pending(format!("unreadable API certificate: {e}")),
        }
        let client = match KubeClient::from_kubeconfig(&kc, &path.base_url) {
            Ok(c) => c,
            Err(e) => return Step::Next(Self::failed("validating", e.to_string(), vm)),
        };
        if let Err(e) = client.readyz().await {
            return pending(e.to_string());
        }
        let nodes = match client.nodes().await {
            Ok(n) => n,
            Err(e) => return pending(e.to_string()),
        };
        let Some(node) = nodes.first() else {
            return pending("no node registered yet".into());
        };
        if let Some(n) = nodes.iter().find(|n| !n.ready) {
            return pending(format!("node {} is not Ready", n.name));
        }
        let want_gpus = vm.offer.gpu_count;
        if node.allocatable_gpus < want_gpus {
            return pending(format!(
                "node {} has {} of {want_gpus} nvidia.com/gpu allocatable",
                node.name, node.allocatable_gpus
            ));
        }
        match client.coredns_pods().await {
            Ok(pods) if pods.iter().any(|p| p.phase == "Running" && p.ready) => {}
            Ok(pods) if pods.is_empty() => return pending("no CoreDNS pod yet".into()),
            Ok(_) => return pending("CoreDNS is not running and ready".into()),
            Err(e) => return pending(e.to_string()),
        }
        Step::Next(K3sState::Ready {
            vm: Box::new(vm.clone()),
            cluster: Some(ClusterRecord {
                access: access.clone(),
                kubeconfig: kubeconfig.to_path_buf(),
                allocatable_gpus: node.allocatable_gpus,
                kubelet_version: node.kubelet_version.clone(),
            }),
        })
    }
}

fn first_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .chars()
        .take(200)
        .collect()
}

/// Writes `bytes` to `path` atomically (temp file, fsync, rename) with mode 0600, in a
/// directory created with mode 0700: the file holds the cluster's client key. A `path`
/// that is a symlink is followed: the file it points to is replaced, the link is kept
/// (dotfile managers keep `~/.kube/config` as a link).
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    #[cfg(unix)]
    use std::os::unix::fs::DirBuilderExt;
    let path = match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => std::fs::canonicalize(path)?,
        _ => path.to_path_buf(),
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    b.mode(0o700);
    b.create(dir)?;
    let options = crate::atomic_file::Options::new()
        .mode(0o600)
        .dir_sync_best_effort();
    crate::atomic_file::write(&path, bytes, options).map_err(|e| e.source)
}

#[async_trait]
impl Machine for K3sMachine {
    type State = K3sState;
    const KIND: &'static str = "k3s";

    fn is_terminal(&self, s: &K3sState) -> bool {
        matches!(s, K3sState::Ready { .. } | K3sState::Failed { .. })
    }

    fn offer<'a>(&self, s: &'a K3sState) -> Option<&'a crate::provider::Offer> {
        match s {
            K3sState::Vm { launch, .. } => launch.offer(),
            _ => s.vm().map(|vm| &vm.offer),
        }
    }

    fn label(&self, s: &K3sState) -> String {
        match s {
            K3sState::Vm { launch, .. } => self.launch.label(launch),
            K3sState::CheckingBootInstall { route, .. } => {
                format!("k3s: checking the boot install ({route:?})")
            }
            K3sState::Installing { reason, .. } => {
                format!("k3s: installing over ssh ({reason})")
            }
            K3sState::AwaitingApi { .. } => "k3s: waiting for the API".into(),
            K3sState::FetchingKubeconfig { .. } => "k3s: fetching the kubeconfig".into(),
            K3sState::Validating { san_rerun, .. } => {
                if *san_rerun {
                    "k3s: validating (after the SAN re-run)".into()
                } else {
                    "k3s: validating".into()
                }
            }
            K3sState::Ready { vm, cluster } => {
                let access = match cluster.as_ref().map(|c| &c.access) {
                    Some(AccessRecord::Direct { host }) => format!("https://{host}:{API_PORT}"),
                    Some(AccessRecord::SshTunnel { .. }) => "via gpuprov tunnel".into(),
                    None => format!("skipped ({} cannot host it)", vm.location.cloud),
                };
                format!(
                    "ready {} at {} ({}), k3s {access}",
                    vm.instance_id, vm.location, vm.ssh
                )
            }
            K3sState::Failed {
                stage,
                reason,
                vm,
                launch,
            } => match (vm, launch) {
                (None, Some(l)) => self.launch.label(l),
                (Some(vm), _) => format!(
                    "k3s failed at {stage}: {reason} (VM {} left up)",
                    vm.instance_id
                ),
                (None, None) => format!("k3s failed at {stage}: {reason}"),
            },
        }
    }

    fn facts(&self, s: &K3sState) -> Facts {
        use crate::vm::vm_facts;
        match s {
            K3sState::Vm { launch, .. } => self.launch.facts(launch),
            K3sState::CheckingBootInstall { vm, .. } => vm_facts("k3s check", vm),
            K3sState::Installing { vm, .. } => vm_facts("k3s install", vm),
            K3sState::AwaitingApi { vm, .. } => vm_facts("k3s api", vm),
            K3sState::FetchingKubeconfig { vm, .. } => vm_facts("kubeconfig", vm),
            K3sState::Validating { vm, .. } => vm_facts("k3s validate", vm),
            K3sState::Ready { vm, .. } => vm_facts("ready", vm),
            K3sState::Failed {
                vm: Some(vm),
                reason,
                ..
            } if reason == crate::vm::launch::CANCELLED => vm_facts("interrupted", vm),
            K3sState::Failed { vm: Some(vm), .. } => vm_facts("failed", vm),
            K3sState::Failed {
                launch: Some(l), ..
            } => self.launch.facts(l),
            K3sState::Failed { .. } => Facts {
                phase: "failed",
                ..Facts::default()
            },
        }
    }

    async fn step(&self, s: &K3sState, cx: &StepCx) -> Step<K3sState> {
        match s {
            K3sState::Vm { launch, reused } => {
                let reused = *reused;
                match self.launch.step(launch, cx).await {
                    Step::Next(LaunchState::Ready { vm })
                        if !self.supports(&vm.location.cloud, Feature::Kubernetes) =>
                    {
                        Step::Next(K3sState::Ready { vm, cluster: None })
                    }
                    Step::Next(LaunchState::Ready { vm }) => {
                        let route = self.route_for(&vm, reused);
                        Step::Next(K3sState::CheckingBootInstall { vm, route })
                    }
                    Step::Next(next) if self.launch.is_terminal(&next) => {
                        Step::Next(K3sState::Failed {
                            stage: "vm".into(),
                            reason: self.launch.label(&next),
                            vm: None,
                            launch: Some(Box::new(next)),
                        })
                    }
                    Step::Next(next) => Step::Next(K3sState::Vm {
                        launch: Box::new(next),
                        reused,
                    }),
                    Step::Poll { after, note } => Step::Poll { after, note },
                    Step::Retry { error, after } => Step::Retry { error, after },
                }
            }
            K3sState::CheckingBootInstall { vm, route } => {
                self.check_boot_install(vm, *route, cx).await
            }
            K3sState::Installing { vm, .. } => match self.push_installer(vm).await {
                Ok(()) => Step::Next(K3sState::AwaitingApi { vm: vm.clone() }),
                Err(step) => step,
            },
            K3sState::AwaitingApi { vm } => self.await_api(vm, cx).await,
            K3sState::FetchingKubeconfig { vm } => self.fetch_kubeconfig(vm).await,
            K3sState::Validating {
                vm,
                access,
                kubeconfig,
                san_rerun,
            } => self.validate(vm, access, kubeconfig, *san_rerun, cx).await,
            K3sState::Ready { .. } | K3sState::Failed { .. } => {
                Step::retry("internal: step on a terminal state")
            }
        }
    }

    fn retry_policy(&self, s: &K3sState) -> RetryPolicy {
        match s {
            K3sState::Vm { launch, .. } => self.launch.retry_policy(launch),
            _ => self.retry,
        }
    }

    fn on_retries_exhausted(&self, s: &K3sState, last_error: String) -> K3sState {
        let stage = match s {
            K3sState::Vm { launch, reused } => {
                return K3sState::Vm {
                    launch: Box::new(self.launch.on_retries_exhausted(launch, last_error)),
                    reused: *reused,
                }
            }
            K3sState::CheckingBootInstall { .. } => "checking_boot_install",
            K3sState::Installing { .. } => "installing",
            K3sState::AwaitingApi { .. } => "awaiting_api",
            K3sState::FetchingKubeconfig { .. } => "fetching_kubeconfig",
            K3sState::Validating { .. } => "validating",
            K3sState::Ready { .. } | K3sState::Failed { .. } => return s.clone(),
        };
        K3sState::Failed {
            stage: stage.into(),
            reason: format!("gave up after repeated errors: {last_error}"),
            vm: s.vm().map(|v| Box::new(v.clone())),
            launch: None,
        }
    }

    /// While the VM launches, the launch machine's compensation applies (a VM being
    /// created is torn down). Once it is up, a cancel stops the k3s stages and leaves the
    /// VM up and recorded; the next `apply` re-enters at CheckingBootInstall.
    fn on_cancel(&self, s: &K3sState) -> Option<K3sState> {
        match s {
            K3sState::Vm { launch, reused } => {
                self.launch.on_cancel(launch).map(|l| K3sState::Vm {
                    launch: Box::new(l),
                    reused: *reused,
                })
            }
            K3sState::Ready { .. } | K3sState::Failed { .. } => None,
            other => {
                let stage = match other {
                    K3sState::CheckingBootInstall { .. } => "checking_boot_install",
                    K3sState::Installing { .. } => "installing",
                    K3sState::AwaitingApi { .. } => "awaiting_api",
                    K3sState::FetchingKubeconfig { .. } => "fetching_kubeconfig",
                    _ => "validating",
                };
                other
                    .vm()
                    .map(|vm| Self::failed(stage, crate::vm::launch::CANCELLED, vm))
            }
        }
    }
}
