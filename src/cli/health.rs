//! `gpuprov health [NAME] [-json]`: for each machine of the state (or only NAME), three
//! checks, each `ok`, `warn`, `fail` or `skipped` with a one-line detail:
//!
//! - **cloud**: the vendor's own view: `observe` at the recorded location, the recorded
//!   instance found by id and its status judged ([`status_verdict`]), plus the cloud's
//!   own findings ([`crate::provider::CloudProvider::diagnose`]);
//! - **ssh**: a login with the project key and the host key pinned in the state, running
//!   `true`, each step bounded by a 5 s timeout (a changed host key is a failure, never
//!   accepted);
//! - **kubernetes**: for a k3s record that is ready, `/readyz` and the node list through
//!   the access path the user has (direct, or an SSH tunnel), as the k3s machine's
//!   validation does.
//!
//! A machine that is not up fails with its recorded state. Machines are checked
//! concurrently (at most [`CONCURRENCY`] at once), each check once, under a deadline: a
//! timeout is a failure. Exit 0 when no check failed (warnings allowed), 1 otherwise.

use std::collections::BTreeSet;
use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use miette::{miette, Report};

use super::args::HealthArgs;
use super::error::{CmdResult, CommandError, Exit};
use super::key::{project_key, KeyUse};
use super::project::{lineage_of, Project};
use super::view::json::{Check, CheckStatus, HealthFinding, JsonHealth, MachineHealth};
use crate::cluster::api::{AccessConnector, ApiConnector, KubeClient};
use crate::cluster::k3s::{ClusterRecord, K3sState};
use crate::cluster::kubeconfig::Kubeconfig;
use crate::config::{Cloud, Config};
use crate::machine::Providers;
use crate::provider::{CloudProvider, Feature, Finding, InstanceStatus, Lineage, Severity};
use crate::record::Record;
use crate::ssh::{ProjectKey, SshError};
use crate::state::{ResourceRecord, StateFile};
use crate::vm::VmRecord;

/// Machines checked at once.
const CONCURRENCY: usize = 8;
/// Deadline of the cloud check (`observe`, then `diagnose`).
const CLOUD_DEADLINE: Duration = Duration::from_secs(30);
/// Bound on each step of the SSH check: TCP connect, handshake, login, the command.
const SSH_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Deadline of the whole SSH check.
const SSH_DEADLINE: Duration = Duration::from_secs(20);
/// Deadline of the Kubernetes check (the tunnel, `/readyz`, the node list).
const K8S_DEADLINE: Duration = Duration::from_secs(30);

/// What every machine's checks share.
struct Ctx {
    /// The adapters of the clouds the selected machines are on.
    providers: Providers,
    /// The project key, or why there is none here (an SSH check then fails saying so).
    key: Result<ProjectKey, String>,
    /// The project's public key as the state records it (for a key that is unavailable).
    public_key: String,
}

pub(super) async fn run(project: &Project, a: &HealthArgs) -> CmdResult {
    let (_, state) = project.open_state()?;
    let selected: Vec<(String, ResourceRecord)> = match a.name.as_deref() {
        None => state
            .resources
            .iter()
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect(),
        Some(name) => {
            let address = if name.starts_with("vm.") {
                name.to_string()
            } else {
                format!("vm.{name}")
            };
            let r = state
                .resources
                .get(&address)
                .ok_or_else(|| unknown_machine(name, &state, project))?;
            vec![(address, r.clone())]
        }
    };
    let machines = if selected.is_empty() {
        Vec::new()
    } else {
        let lineage = lineage_of(&state)?;
        let config = project.load_config().ok();
        let needs_key = selected.iter().any(|(_, r)| r.machine.vm().is_some());
        let key = if needs_key {
            project_key(project, &state, KeyUse::Connect).map_err(|e| one_line(&e))
        } else {
            Err("no machine is up".to_string())
        };
        let ctx = Ctx {
            providers: providers_for(&selected, config.as_ref(), &lineage),
            key,
            public_key: state
                .ssh
                .as_ref()
                .map(|s| s.public_key.clone())
                .unwrap_or_default(),
        };
        stream::iter(selected.iter())
            .map(|(address, r)| check_machine(&ctx, address, r))
            .buffered(CONCURRENCY)
            .collect()
            .await
    };
    let (healthy, exit) = verdict(machines.iter().map(|m| m.status));
    if a.json.json {
        let out = JsonHealth {
            state: project.location(),
            healthy,
            machines,
        };
        outln!(
            "{}",
            serde_json::to_string_pretty(&out).map_err(CommandError::internal)?
        );
        return Ok(exit);
    }
    if machines.is_empty() {
        outln!("No machines in {}.", project.location());
        return Ok(exit);
    }
    render(&machines);
    Ok(exit)
}

/// Whether the machines of these verdicts are healthy, and the exit: 1 only when one
/// failed (a warning keeps 0).
fn verdict(statuses: impl IntoIterator<Item = CheckStatus>) -> (bool, Exit) {
    let healthy = statuses.into_iter().all(|s| s != CheckStatus::Fail);
    (
        healthy,
        if healthy {
            Exit::Success
        } else {
            Exit::Failure
        },
    )
}

/// The diagnostic for a NAME the state does not have, listing the names it has.
fn unknown_machine(name: &str, state: &StateFile, project: &Project) -> Report {
    let known: Vec<&str> = state
        .resources
        .keys()
        .map(|a| a.strip_prefix("vm.").unwrap_or(a))
        .collect();
    let help = if known.is_empty() {
        "the state has no machines; `gpuprov apply` creates them".to_string()
    } else {
        format!("machines in the state: {}", known.join(", "))
    };
    miette!(
        help = help,
        "no machine named {name:?} in {}",
        project.location()
    )
}

/// A diagnostic as one line: its message, then its help.
fn one_line(e: &Report) -> String {
    match e.help() {
        Some(h) => format!("{e}; {h}"),
        None => e.to_string(),
    }
}

/// The adapters of the clouds the selected machines are up on, with the config's
/// settings for each (its endpoint overrides) when the config can be read.
fn providers_for(
    selected: &[(String, ResourceRecord)],
    config: Option<&Config>,
    lineage: &Lineage,
) -> Providers {
    let clouds: BTreeSet<String> = selected
        .iter()
        .filter_map(|(_, r)| r.machine.vm())
        .map(|vm| vm.location.cloud)
        .collect();
    let mut p = Providers::new();
    for cloud in clouds.iter().filter_map(|c| Cloud::from_name(c)) {
        let none = crate::config::CloudTables::default();
        let tables = config.map_or(&none, |c| &c.clouds);
        if let Some(adapter) = cloud.build(tables, lineage.clone()) {
            p.insert(adapter);
        }
    }
    p
}

fn check(status: CheckStatus, detail: impl Into<String>) -> Check {
    Check {
        status,
        detail: detail.into(),
        findings: Vec::new(),
    }
}

/// The worst of `checks`, `skipped` counting as `ok`.
fn worst(checks: &[&Check]) -> CheckStatus {
    checks
        .iter()
        .map(|c| c.status)
        .max()
        .map(|s| s.max(CheckStatus::Ok))
        .unwrap_or(CheckStatus::Ok)
}

/// One machine's three checks.
async fn check_machine(ctx: &Ctx, address: &str, r: &ResourceRecord) -> MachineHealth {
    // A moved machine's cloud objects carry the name it was created under.
    let name = r.identity_name(address);
    let mut m = MachineHealth {
        address: address.to_string(),
        recorded: r.machine.label.clone(),
        location: None,
        instance_id: None,
        status: CheckStatus::Fail,
        cloud: check(CheckStatus::Fail, ""),
        ssh: check(CheckStatus::Skipped, ""),
        kubernetes: check(CheckStatus::Skipped, ""),
    };
    let record = match r.machine.decode() {
        Ok(rec) => rec,
        Err(e) => {
            m.cloud = check(
                CheckStatus::Fail,
                format!("the state record {address} is {e}; see `gpuprov state show {address}`"),
            );
            m.ssh.detail = "the record cannot be read".into();
            m.kubernetes.detail = "the record cannot be read".into();
            return m;
        }
    };
    let owned = record.owned();
    m.location = owned.as_ref().map(|o| o.location.to_string());
    let Some(vm) = record.vm().cloned() else {
        m.instance_id = owned.and_then(|o| o.instance_ids.first().cloned());
        m.cloud = check(
            CheckStatus::Fail,
            format!(
                "not up: recorded as {:?} ({}); see `gpuprov status`",
                r.machine.label,
                record.tag().unwrap_or_else(|| r.machine.kind.clone()),
            ),
        );
        m.ssh.detail = "the machine is not up".into();
        m.kubernetes.detail = "the machine is not up".into();
        return m;
    };
    m.location = Some(vm.location.to_string());
    m.instance_id = Some(vm.instance_id.clone());
    let provider = ctx.providers.get(&vm.location.cloud).cloned();
    let (cloud, running) = cloud_check(provider.as_deref(), &vm, name).await;
    m.cloud = cloud;
    if running == Some(false) {
        let why = "the instance is not running (see the cloud check)";
        m.ssh = check(CheckStatus::Skipped, why);
        m.kubernetes = check(CheckStatus::Skipped, why);
    } else {
        let (ssh, k8s) = tokio::join!(
            ssh_check(ctx, &vm),
            k8s_check(ctx, &record, &vm, provider.as_deref(), &r.machine.label)
        );
        m.ssh = ssh;
        m.kubernetes = k8s;
    }
    m.status = worst(&[&m.cloud, &m.ssh, &m.kubernetes]);
    m
}

/// The verdict on the recorded instance's status as `observe` lists it (`None`: not
/// listed), and whether it runs (`Some(false)`: certainly not, so SSH and Kubernetes
/// are not tried; `None`: maybe soon).
fn status_verdict(status: Option<&InstanceStatus>) -> (CheckStatus, String, Option<bool>) {
    use CheckStatus::{Fail, Ok, Warn};
    let (s, detail, running) = match status {
        None => (
            Fail,
            "instance not found: deleted outside gpuprov (`gpuprov apply` creates a new one)"
                .to_string(),
            Some(false),
        ),
        Some(InstanceStatus::Running) => (Ok, "running".to_string(), Some(true)),
        Some(InstanceStatus::Pending) => (
            Warn,
            "pending: starting, not running yet (it may come up by itself)".to_string(),
            None,
        ),
        Some(InstanceStatus::Stopping) => (
            Fail,
            "stopping: the instance is not running (`gpuprov apply` brings it back)".to_string(),
            Some(false),
        ),
        Some(InstanceStatus::Stopped) => (
            Fail,
            "stopped: the instance is not running (`gpuprov apply` brings it back)".to_string(),
            Some(false),
        ),
        Some(InstanceStatus::Terminating) => (
            Fail,
            "terminating: the instance is being deleted outside gpuprov".to_string(),
            Some(false),
        ),
        Some(InstanceStatus::Failed(why)) => (
            Fail,
            format!("failed: the instance is not running: {why}"),
            Some(false),
        ),
        Some(InstanceStatus::Preempted { signal, .. }) => (
            Fail,
            format!(
                "preempted: the cloud reclaimed the spot instance ({signal}); `gpuprov apply` \
                 replaces it, trying other offers first"
            ),
            Some(false),
        ),
        Some(InstanceStatus::Refused(e)) => (
            Fail,
            format!("the cloud refused the instance: {}", e.text()),
            Some(false),
        ),
    };
    (s, detail, running)
}

/// The verdict a finding of `severity` gives the cloud check.
fn finding_status(severity: Severity) -> CheckStatus {
    match severity {
        Severity::Info => CheckStatus::Ok,
        Severity::Warning => CheckStatus::Warn,
        Severity::Error => CheckStatus::Fail,
    }
}

/// The cloud check with the cloud's `findings` folded in: each shown, the worst deciding
/// with the status.
fn with_findings(mut c: Check, findings: &[Finding]) -> Check {
    for f in findings {
        c.status = c.status.max(finding_status(f.severity));
        c.detail.push_str(&format!("; {}", f.message));
        c.findings.push(HealthFinding {
            severity: match f.severity {
                Severity::Info => "info",
                Severity::Warning => "warning",
                Severity::Error => "error",
            }
            .to_string(),
            message: f.message.clone(),
        });
    }
    c
}

/// The cloud check: the recorded instance in `observe`'s answer, then its findings.
async fn cloud_check(
    p: Option<&dyn CloudProvider>,
    vm: &VmRecord,
    name: &str,
) -> (Check, Option<bool>) {
    let cloud = &vm.location.cloud;
    let Some(p) = p else {
        return (
            check(
                CheckStatus::Fail,
                format!("this build of gpuprov has no adapter for {cloud}"),
            ),
            None,
        );
    };
    let work = async {
        let seen = p.observe(&vm.location, name).await.map_err(|e| e.text())?;
        let status = seen
            .into_iter()
            .find(|o| (o.exists() || o.status.is_preempted()) && o.instance_id == vm.instance_id)
            .map(|o| o.status);
        let findings = match status {
            Some(_) => p.diagnose(&vm.location, name, &vm.instance_id).await,
            None => Ok(Vec::new()),
        };
        Ok::<_, String>((status, findings))
    };
    match tokio::time::timeout(CLOUD_DEADLINE, work).await {
        Err(_) => (
            check(
                CheckStatus::Fail,
                format!(
                    "{cloud} did not answer within {} s",
                    CLOUD_DEADLINE.as_secs()
                ),
            ),
            None,
        ),
        Ok(Err(e)) => (
            check(
                CheckStatus::Fail,
                format!("cannot ask {cloud} at {}: {e}", vm.location),
            ),
            None,
        ),
        Ok(Ok((status, findings))) => {
            let (s, detail, running) = status_verdict(status.as_ref());
            let c = check(s, detail);
            let c = match findings {
                Ok(f) => with_findings(c, &f),
                Err(e) => with_findings(
                    c,
                    &[Finding::new(
                        Severity::Warning,
                        format!("the cloud's own findings are unavailable: {}", e.text()),
                    )],
                ),
            };
            (c, running)
        }
    }
}

/// The verdict on the SSH check's outcome.
fn ssh_verdict(at: &str, outcome: Result<i32, SshError>) -> Check {
    match outcome {
        Ok(0) => check(
            CheckStatus::Ok,
            format!("logged in to {at} with the pinned host key; `true` ran"),
        ),
        Ok(n) => check(
            CheckStatus::Fail,
            format!("logged in to {at}, but `true` exited {n}"),
        ),
        Err(SshError::Unreachable { endpoint, msg }) => {
            check(CheckStatus::Fail, format!("cannot reach {endpoint}: {msg}"))
        }
        Err(SshError::AuthRejected { endpoint, msg }) => check(
            CheckStatus::Fail,
            format!("{endpoint} refused the project key: {msg}"),
        ),
        // Its message says the key changed, both fingerprints, and that it was refused.
        Err(e @ SshError::HostKeyMismatch { .. }) => check(CheckStatus::Fail, e.to_string()),
        Err(e @ SshError::Local(_)) => check(CheckStatus::Fail, e.to_string()),
    }
}

/// The SSH check: `true` over a login with the project key and the pinned host key.
async fn ssh_check(ctx: &Ctx, vm: &VmRecord) -> Check {
    let key = match &ctx.key {
        Ok(k) => k.clone(),
        Err(e) => {
            return check(
                CheckStatus::Fail,
                format!("no project key to log in with: {e}"),
            )
        }
    };
    let at = format!("{}@{}:{}", vm.user, vm.ssh.host, vm.ssh.port);
    let (endpoint, user, pinned) = (vm.ssh.clone(), vm.user.clone(), vm.host_key.clone());
    // libssh2 blocks: off the runtime, each of its steps bounded by the connect timeout.
    let task = tokio::task::spawn_blocking(move || {
        crate::ssh::client::run_bounded(
            &endpoint,
            &user,
            &key,
            &pinned,
            "true",
            SSH_CONNECT_TIMEOUT,
        )
    });
    match tokio::time::timeout(SSH_DEADLINE, task).await {
        Err(_) => check(
            CheckStatus::Fail,
            format!("no answer from {at} within {} s", SSH_DEADLINE.as_secs()),
        ),
        Ok(Err(e)) => check(CheckStatus::Fail, format!("the ssh check stopped: {e}")),
        Ok(Ok(outcome)) => ssh_verdict(&at, outcome),
    }
}

/// The Kubernetes check: the API of a ready k3s cluster; skipped (saying why) for a
/// machine without one.
async fn k8s_check(
    ctx: &Ctx,
    record: &Record,
    vm: &VmRecord,
    p: Option<&dyn CloudProvider>,
    label: &str,
) -> Check {
    let cloud = &vm.location.cloud;
    match record {
        Record::K3s(K3sState::Ready {
            cluster: Some(c), ..
        }) => api_check(ctx, vm, c).await,
        Record::K3s(K3sState::Ready { cluster: None, .. }) => check(
            CheckStatus::Skipped,
            format!("{cloud} cannot host k3s: kubernetes was skipped for this machine"),
        ),
        Record::K3s(_) => check(CheckStatus::Fail, format!("k3s is not ready: {label}")),
        _ => match p.map(|p| p.capabilities().supported.contains(&Feature::Kubernetes)) {
            Some(false) => check(CheckStatus::Skipped, format!("{cloud} cannot host k3s")),
            _ => check(CheckStatus::Skipped, "kubernetes is off for this machine"),
        },
    }
}

/// `/readyz` and the node list of cluster `c`, through its recorded access path.
async fn api_check(ctx: &Ctx, vm: &VmRecord, c: &ClusterRecord) -> Check {
    let work = async {
        let file = c.kubeconfig.display();
        let text = std::fs::read_to_string(&c.kubeconfig).map_err(|e| {
            format!("cannot read its kubeconfig {file}: {e} (`gpuprov apply` writes it again)")
        })?;
        let kc = Kubeconfig::parse(&text).map_err(|e| format!("{file}: {e}"))?;
        // Direct access needs no key; a tunnel fails saying why there is none.
        let key = match &ctx.key {
            Ok(k) => k.clone(),
            Err(e) => ProjectKey::unavailable(ctx.public_key.clone(), e.clone()),
        };
        let path = AccessConnector { key }
            .open(vm, &c.access.to_access())
            .await?;
        let client = KubeClient::from_kubeconfig(&kc, &path.base_url).map_err(|e| e.to_string())?;
        client.readyz().await.map_err(|e| e.to_string())?;
        let nodes = client.nodes().await.map_err(|e| e.to_string())?;
        drop(path);
        Ok::<_, String>(nodes)
    };
    let nodes = match tokio::time::timeout(K8S_DEADLINE, work).await {
        Err(_) => {
            return check(
                CheckStatus::Fail,
                format!(
                    "the Kubernetes API did not answer within {} s",
                    K8S_DEADLINE.as_secs()
                ),
            )
        }
        Ok(Err(e)) => return check(CheckStatus::Fail, e),
        Ok(Ok(nodes)) => nodes,
    };
    let not_ready: Vec<&str> = nodes
        .iter()
        .filter(|n| !n.ready)
        .map(|n| n.name.as_str())
        .collect();
    let gpus: u32 = nodes.iter().map(|n| n.allocatable_gpus).sum();
    if nodes.is_empty() {
        check(CheckStatus::Fail, "API ready, but it lists no node")
    } else if !not_ready.is_empty() {
        check(
            CheckStatus::Fail,
            format!("API ready; node not Ready: {}", not_ready.join(", ")),
        )
    } else if gpus < c.allocatable_gpus {
        check(
            CheckStatus::Warn,
            format!(
                "API ready; {} GPU(s) allocatable, {} when validated",
                gpus, c.allocatable_gpus
            ),
        )
    } else {
        check(
            CheckStatus::Ok,
            format!(
                "API ready; {} node(s) Ready, {gpus} GPU(s) allocatable",
                nodes.len()
            ),
        )
    }
}

/// The check that speaks for a machine's row: the worst, the first of equals.
fn headline(m: &MachineHealth) -> (&'static str, &Check) {
    let checks = [("cloud", &m.cloud), ("ssh", &m.ssh), ("k8s", &m.kubernetes)];
    let mut best = checks[0];
    for c in &checks[1..] {
        if c.1.status > best.1.status {
            best = *c;
        }
    }
    best
}

/// The table, the details of every other warning or failure, and a summary.
fn render(machines: &[MachineHealth]) {
    outln!(
        "{:<20} {:<16} {:<14} {:<7} {:<7} {:<7}  DETAIL",
        "MACHINE",
        "CLOUD/REGION",
        "INSTANCE",
        "CLOUD",
        "SSH",
        "K8S"
    );
    let mut more = Vec::new();
    for m in machines {
        let (which, head) = headline(m);
        let inst: String = m
            .instance_id
            .as_deref()
            .unwrap_or("-")
            .chars()
            .take(14)
            .collect();
        outln!(
            "{:<20} {:<16} {:<14} {:<7} {:<7} {:<7}  {which}: {}",
            m.address,
            m.location.as_deref().unwrap_or("-"),
            inst,
            m.cloud.status.as_str(),
            m.ssh.status.as_str(),
            m.kubernetes.status.as_str(),
            head.detail
        );
        for (name, c) in [("cloud", &m.cloud), ("ssh", &m.ssh), ("k8s", &m.kubernetes)] {
            if name != which && c.status >= CheckStatus::Warn {
                more.push(format!(
                    "  {} {name}: {} ({})",
                    m.address,
                    c.detail,
                    c.status.as_str()
                ));
            }
        }
    }
    if !more.is_empty() {
        outln!();
        more.iter().for_each(|l| outln!("{l}"));
    }
    let failed = machines
        .iter()
        .filter(|m| m.status == CheckStatus::Fail)
        .count();
    let warned = machines
        .iter()
        .filter(|m| m.status == CheckStatus::Warn)
        .count();
    let n = machines.len();
    outln!();
    outln!(
        "{n} machine{} checked: {} healthy, {warned} with warnings, {failed} unhealthy.{}",
        if n == 1 { "" } else { "s" },
        n - failed - warned,
        if failed == 0 && warned > 0 {
            " Warnings do not change the exit code (0)."
        } else {
            ""
        }
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{ErrorKind, ProviderError};

    #[test]
    fn each_instance_status_has_its_verdict() {
        use CheckStatus::{Fail, Ok, Warn};
        let cases: Vec<(Option<InstanceStatus>, CheckStatus, Option<bool>, &str)> = vec![
            (Some(InstanceStatus::Running), Ok, Some(true), "running"),
            (Some(InstanceStatus::Pending), Warn, None, "not running yet"),
            (
                Some(InstanceStatus::Stopping),
                Fail,
                Some(false),
                "not running",
            ),
            (
                Some(InstanceStatus::Stopped),
                Fail,
                Some(false),
                "not running",
            ),
            (
                Some(InstanceStatus::Terminating),
                Fail,
                Some(false),
                "deleted outside gpuprov",
            ),
            (
                Some(InstanceStatus::Failed("exit 3".into())),
                Fail,
                Some(false),
                "exit 3",
            ),
            (
                Some(InstanceStatus::Refused(Box::new(ProviderError::new(
                    ErrorKind::Capacity,
                    "no capacity",
                )))),
                Fail,
                Some(false),
                "no capacity",
            ),
            (None, Fail, Some(false), "deleted outside gpuprov"),
        ];
        for (status, want, running, says) in cases {
            let (s, detail, r) = status_verdict(status.as_ref());
            assert_eq!((s, r), (want, running), "{status:?}");
            assert!(detail.contains(says), "{status:?}: {detail}");
        }
    }

    #[test]
    fn findings_raise_the_cloud_verdict_never_lower_it() {
        let ok = check(CheckStatus::Ok, "running");
        let info = [Finding::new(Severity::Info, "healthcheck healthy")];
        let c = with_findings(ok.clone(), &info);
        assert_eq!(c.status, CheckStatus::Ok);
        assert_eq!(c.detail, "running; healthcheck healthy");
        assert_eq!(c.findings[0].severity, "info");
        let bad = [
            Finding::new(Severity::Warning, "restarting"),
            Finding::new(Severity::Error, "OOMKilled"),
        ];
        assert_eq!(with_findings(ok, &bad).status, CheckStatus::Fail);
        let failed = check(CheckStatus::Fail, "stopped");
        assert_eq!(with_findings(failed, &info).status, CheckStatus::Fail);
    }

    #[test]
    fn a_changed_host_key_fails_saying_so() {
        let c = ssh_verdict(
            "root@127.0.0.1:22",
            Err(SshError::HostKeyMismatch {
                endpoint: "root@127.0.0.1:22".into(),
                expected: "SHA256:old".into(),
                got: "SHA256:new".into(),
            }),
        );
        assert_eq!(c.status, CheckStatus::Fail);
        assert!(
            c.detail.contains("host key") && c.detail.contains("changed"),
            "{}",
            c.detail
        );
        assert_eq!(ssh_verdict("x", Ok(0)).status, CheckStatus::Ok);
        assert_eq!(ssh_verdict("x", Ok(1)).status, CheckStatus::Fail);
    }

    #[test]
    fn the_machine_verdict_is_the_worst_check_and_skipped_counts_as_ok() {
        let (ok, warn, fail, skipped) = (
            check(CheckStatus::Ok, ""),
            check(CheckStatus::Warn, ""),
            check(CheckStatus::Fail, ""),
            check(CheckStatus::Skipped, ""),
        );
        assert_eq!(worst(&[&ok, &ok, &skipped]), CheckStatus::Ok);
        assert_eq!(worst(&[&skipped, &skipped, &skipped]), CheckStatus::Ok);
        assert_eq!(worst(&[&ok, &warn, &skipped]), CheckStatus::Warn);
        assert_eq!(worst(&[&warn, &fail, &ok]), CheckStatus::Fail);
    }

    #[test]
    fn only_a_failure_makes_the_exit_code_1() {
        let code = |v: &[CheckStatus]| verdict(v.iter().copied()).1.code();
        assert_eq!(code(&[]), 0);
        assert_eq!(code(&[CheckStatus::Ok, CheckStatus::Skipped]), 0);
        assert_eq!(code(&[CheckStatus::Ok, CheckStatus::Warn]), 0);
        assert_eq!(code(&[CheckStatus::Ok, CheckStatus::Fail]), 1);
        assert!(!verdict([CheckStatus::Fail]).0);
    }

    fn vm() -> VmRecord {
        let location = crate::provider::Location {
            cloud: "docker".into(),
            region: "local".into(),
            zone: None,
        };
        VmRecord {
            instance_id: "c0ffee".into(),
            location: location.clone(),
            offer: crate::provider::Offer {
                id: "docker/local/container".into(),
                location,
                instance_type: "container".into(),
                gpu: None,
                gpu_count: 0,
                spot: false,
                price_per_hour: 0.0,
                detail: serde_json::Value::Null,
                facts: Default::default(),
            },
            ssh: crate::provider::SshEndpoint {
                host: "127.0.0.1".into(),
                port: 1,
                user: None,
            },
            user: "root".into(),
            host_key: crate::ssh::HostKey {
                algorithm: "ssh-ed25519".into(),
                key_base64: "AAAA".into(),
                fingerprint: "SHA256:x".into(),
            },
            ready_at: chrono::Utc::now(),
            preemptions: vec![],
        }
    }

    #[tokio::test]
    async fn kubernetes_is_checked_only_where_a_cluster_is_ready_and_says_why_not() {
        use crate::cluster::k3s::AccessRecord;
        use crate::provider::clouds::docker::{DockerProvider, DockerSettings};
        use crate::vm::LaunchState;
        let vm = vm();
        let ctx = Ctx {
            providers: Providers::new(),
            key: Err("no key here".into()),
            public_key: String::new(),
        };
        let k8s = |rec: Record, p: Option<std::sync::Arc<dyn CloudProvider>>| {
            let (ctx, vm) = (&ctx, &vm);
            async move { k8s_check(ctx, &rec, vm, p.as_deref(), "fetching kubeconfig").await }
        };
        let launch = || {
            Record::Launch(LaunchState::Ready {
                vm: Box::new(vm.clone()),
            })
        };
        let c = k8s(launch(), None).await;
        assert_eq!(c.status, CheckStatus::Skipped);
        assert_eq!(c.detail, "kubernetes is off for this machine");
        let docker: std::sync::Arc<dyn CloudProvider> =
            std::sync::Arc::new(DockerProvider::new(DockerSettings::new(Lineage::random())));
        let c = k8s(launch(), Some(docker)).await;
        assert_eq!(
            (c.status, c.detail.as_str()),
            (CheckStatus::Skipped, "docker cannot host k3s")
        );
        let no_cluster = Record::K3s(K3sState::Ready {
            vm: Box::new(vm.clone()),
            cluster: None,
        });
        let c = k8s(no_cluster, None).await;
        assert_eq!(c.status, CheckStatus::Skipped);
        assert!(c.detail.contains("docker cannot host k3s"), "{}", c.detail);
        let installing = Record::K3s(K3sState::FetchingKubeconfig {
            vm: Box::new(vm.clone()),
        });
        let c = k8s(installing, None).await;
        assert_eq!(
            (c.status, c.detail.as_str()),
            (CheckStatus::Fail, "k3s is not ready: fetching kubeconfig")
        );

        // A ready cluster: its kubeconfig is read first; no network is needed to fail.
        let dir = tempfile::tempdir().unwrap();
        let ready = |kubeconfig: std::path::PathBuf| {
            Record::K3s(K3sState::Ready {
                vm: Box::new(vm.clone()),
                cluster: Some(ClusterRecord {
                    access: AccessRecord::Direct {
                        host: "127.0.0.1".into(),
                    },
                    kubeconfig,
                    allocatable_gpus: 0,
                    kubelet_version: None,
                }),
            })
        };
        let c = k8s(ready(dir.path().join("missing.yaml")), None).await;
        assert_eq!(c.status, CheckStatus::Fail);
        assert!(
            c.detail.contains("cannot read its kubeconfig") && c.detail.contains("missing.yaml"),
            "{}",
            c.detail
        );
        let no_credentials = dir.path().join("kubeconfig.yaml");
        std::fs::write(
            &no_credentials,
            "apiVersion: v1\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority-data: bm90IGEgY2VydA==\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user: {}\ncurrent-context: c\n",
        )
        .unwrap();
        let c = k8s(ready(no_credentials), None).await;
        assert_eq!(c.status, CheckStatus::Fail);
        assert!(
            c.detail.contains("the kubeconfig cannot be used"),
            "{}",
            c.detail
        );
    }
}
