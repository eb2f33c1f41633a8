//! Containers as the contract sees them: the identity filters, a container's status, its
//! SSH endpoint on the loopback address, an existing container adopted by its client token,
//! and what `diagnose` finds in its state.

use super::*;

pub(super) fn dead_reason(code: Option<i64>, error: Option<&str>, status: Option<&str>) -> String {
    let mut reason = "container is dead".to_string();
    if let Some(code) = code {
        reason.push_str(&format!(", exit code {code}"));
    }
    if let Some(error) = error {
        reason.push_str(&format!(", error: {error}"));
    } else if let Some(status) = status.filter(|s| !s.is_empty()) {
        reason.push_str(&format!(" ({status})"));
    }
    reason
}

/// The SSH endpoint of a listed container: its `Ports[]` entry with `PrivatePort` 22,
/// `Type` tcp and a `PublicPort`. Only when running: a stopped container keeps no binding
/// worth dialling. The host is always [`LOOPBACK`] because that is where `create` binds.
pub(super) fn ssh_endpoint(c: &ContainerSummary) -> Option<SshEndpoint> {
    if c.state != Some(ContainerSummaryStateEnum::RUNNING) {
        return None;
    }
    let port = c.ports.as_ref()?.iter().find_map(|p| {
        let tcp = p.typ.is_none_or(|t| t == PortTypeEnum::TCP);
        // Skip an IPv6 binding: the host we report is the IPv4 loopback.
        let v4 = p.ip.as_deref().is_none_or(|ip| !ip.contains(':'));
        (p.private_port == 22 && tcp && v4)
            .then_some(p.public_port)
            .flatten()
    })?;
    (port != 0).then(|| SshEndpoint {
        host: LOOPBACK.to_string(),
        port,
        user: Some("root".to_string()),
    })
}

/// The findings `diagnose` reports for a container's `State` (Docker Engine API,
/// "ContainerInspect"): `Health.Status` unhealthy (with the last check's output) is an
/// error, starting a warning, healthy an info; `OOMKilled` and a daemon `Error` are
/// errors; `Restarting` is a warning; a stopped container's `ExitCode` is an error when
/// non-zero; restarts (`RestartCount`) are an info.
pub fn findings_of(
    state: &bollard::models::ContainerState,
    restart_count: Option<i64>,
) -> Vec<crate::provider::Finding> {
    use crate::provider::{Finding, Severity};
    use bollard::models::HealthStatusEnum;
    let mut out = Vec::new();
    if let Some(h) = &state.health {
        let last = h
            .log
            .as_ref()
            .and_then(|l| l.last())
            .and_then(|r| r.output.as_deref())
            .map(|o| o.trim().lines().next().unwrap_or("").to_string())
            .filter(|o| !o.is_empty());
        match h.status {
            Some(HealthStatusEnum::UNHEALTHY) => out.push(Finding::new(
                Severity::Error,
                format!(
                    "healthcheck unhealthy ({} failures in a row){}",
                    h.failing_streak.unwrap_or(0),
                    last.map(|o| format!(": {o}")).unwrap_or_default()
                ),
            )),
            Some(HealthStatusEnum::STARTING) => {
                out.push(Finding::new(Severity::Warning, "healthcheck starting"))
            }
            Some(HealthStatusEnum::HEALTHY) => {
                out.push(Finding::new(Severity::Info, "healthcheck healthy"))
            }
            _ => {}
        }
    }
    if state.oom_killed == Some(true) {
        out.push(Finding::new(
            Severity::Error,
            "killed by the out-of-memory killer (OOMKilled)",
        ));
    }
    if state.restarting == Some(true) {
        out.push(Finding::new(Severity::Warning, "restarting"));
    }
    if let Some(e) = state.error.as_deref().filter(|e| !e.is_empty()) {
        out.push(Finding::new(Severity::Error, format!("engine error: {e}")));
    }
    if state.running != Some(true) {
        match state.exit_code {
            Some(0) | None => {}
            Some(code) => out.push(Finding::new(
                Severity::Error,
                format!("exited with code {code}"),
            )),
        }
    }
    if let Some(n) = restart_count.filter(|n| *n > 0) {
        out.push(Finding::new(Severity::Info, format!("restarted {n} times")));
    }
    out
}

impl DockerProvider {
    /// Engine `filters` selecting objects of `vm_name` in this lineage (both labels must
    /// match: repeated `label` filters are ANDed by the Engine).
    pub(super) fn identity_filters(&self, vm_name: &str) -> Result<HashMap<String, Vec<String>>> {
        let lineage = self.lineage();
        Ok(HashMap::from([(
            "label".to_string(),
            vec![
                format!("{IDENTITY_LABEL}={vm_name}"),
                format!("{LINEAGE_LABEL}={lineage}"),
            ],
        )]))
    }

    /// Looks up an existing container by name after a 409 on create, checks it is ours and
    /// starts it if it is not running (`POST /containers/{id}/start` answers 304 when it
    /// already runs, which bollard treats as success).
    pub(super) async fn adopt_existing(
        &self,
        docker: &Docker,
        name: &str,
        spec: &InstanceSpec,
    ) -> Result<String> {
        let info = docker
            .inspect_container(
                name,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
            .map_err(|e| {
                if is_not_found(&e) {
                    // Removed between our create and inspect: let the core retry the create.
                    ProviderError::transient(format!("container {name} vanished during create"))
                } else {
                    self.err(e)
                }
            })?;
        let labels = info
            .config
            .as_ref()
            .and_then(|c| c.labels.clone())
            .unwrap_or_default();
        if labels.get(IDENTITY_LABEL).map(String::as_str) != Some(spec.vm_name.as_str())
            || labels.get(LINEAGE_LABEL).map(String::as_str) != Some(spec.lineage.as_str())
        {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "a container named {name} exists but is not labelled {IDENTITY_LABEL}={} / \
                     {LINEAGE_LABEL}={}; remove it or rename the VM",
                    spec.vm_name, spec.lineage
                ),
            ));
        }
        let id = info.id.ok_or_else(|| {
            ProviderError::new(ErrorKind::Failed, format!("container {name} has no id"))
        })?;
        let running = info.state.as_ref().and_then(|s| s.running).unwrap_or(false);
        if !running {
            // A stopped container of this identity is not this create's to start: the
            // retried step observes it and decides whether it is ours.
            return Err(ProviderError::transient(format!(
                "a stopped container named {name} with this identity already exists"
            )));
        }
        Ok(id)
    }

    /// The normalised status of a listed container (`State` of `GET /containers/json`).
    /// Dead containers are inspected for `State.ExitCode` / `State.Error` so the reason says
    /// what happened.
    pub(super) async fn status_of(&self, docker: &Docker, c: &ContainerSummary) -> InstanceStatus {
        match c.state {
            Some(ContainerSummaryStateEnum::RUNNING) => InstanceStatus::Running,
            Some(ContainerSummaryStateEnum::CREATED | ContainerSummaryStateEnum::RESTARTING) => {
                InstanceStatus::Pending
            }
            Some(ContainerSummaryStateEnum::PAUSED | ContainerSummaryStateEnum::EXITED) => {
                InstanceStatus::Stopped
            }
            Some(ContainerSummaryStateEnum::REMOVING) => InstanceStatus::Terminating,
            Some(ContainerSummaryStateEnum::DEAD) => {
                let id = c.id.clone().unwrap_or_default();
                let state = docker
                    .inspect_container(
                        &id,
                        None::<bollard::query_parameters::InspectContainerOptions>,
                    )
                    .await
                    .ok()
                    .and_then(|i| i.state);
                let code = state.as_ref().and_then(|s| s.exit_code);
                let error = state.and_then(|s| s.error).filter(|e| !e.is_empty());
                InstanceStatus::Failed(dead_reason(code, error.as_deref(), c.status.as_deref()))
            }
            Some(ContainerSummaryStateEnum::EMPTY) | None => InstanceStatus::Failed(format!(
                "container reports no state ({})",
                c.status.as_deref().unwrap_or("no status")
            )),
        }
    }
}
