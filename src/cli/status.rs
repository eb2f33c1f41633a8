//! `gpuprov status [-json]`: each machine's recorded state and, with refresh, what its
//! cloud says.

use miette::IntoDiagnostic;

use super::args::StatusArgs;
use super::error::{CmdResult, Exit};
use super::json::{Event, JsonStatus, MachineStatus};
use super::{build_providers, lineage_of, Project};
use crate::machine::Providers;
use crate::plan;
use crate::state::ResourceRecord;

pub(super) async fn run(project: &Project, a: &StatusArgs) -> CmdResult {
    let (_, state) = project.open_state()?;
    let refresh = a.refresh.refresh && !state.resources.is_empty();
    let observed = if refresh {
        let config = project.load_config().ok();
        let providers = match (config.as_ref(), lineage_of(&state)) {
            (Some(c), Ok(lineage)) => build_providers(c, &lineage),
            _ => Providers::default(),
        };
        match plan::refresh(&state, &providers).await {
            Ok(o) => Some(o),
            Err(e) => {
                errln!("warning: {e}");
                None
            }
        }
    } else {
        None
    };
    let machines: Vec<MachineStatus> = state
        .resources
        .iter()
        .map(|(address, r)| {
            let observed = observed
                .as_ref()
                .and_then(|o| o.get(address))
                .map(|o| match o {
                    plan::Observation::Running => "running".to_string(),
                    plan::Observation::Gone => "gone".to_string(),
                    plan::Observation::NotRunning(s) => format!("{s:?}"),
                });
            machine(address, r, observed)
        })
        .collect();
    if a.json.json {
        let out = JsonStatus {
            state: project.location(),
            refreshed: observed.is_some(),
            machines,
        };
        outln!("{}", serde_json::to_string_pretty(&out).into_diagnostic()?);
        return Ok(Exit::Success);
    }
    if machines.is_empty() {
        outln!("No machines in {}.", project.location());
        return Ok(Exit::Success);
    }
    outln!(
        "{:<20} {:<24} {:<16} {:<16} {:<22} {:>8}  LAST EVENT",
        "MACHINE",
        "STATE",
        "LOCATION",
        "INSTANCE",
        "SSH",
        "$/H"
    );
    for m in &machines {
        let st = match m.observed.as_deref() {
            Some("gone") => format!("{} (GONE)", m.state),
            None | Some("running") => m.state.clone(),
            Some(s) => format!("{} ({s})", m.state),
        };
        let loc = m.error.clone().or_else(|| m.location.clone());
        let inst: String = m.instance_ids.join(",").chars().take(16).collect();
        let last = m
            .last_event
            .as_ref()
            .map(|e| format!("{} {}", e.at.format("%Y-%m-%d %H:%M:%S"), e.label))
            .unwrap_or_default();
        outln!(
            "{:<20} {:<24} {:<16} {:<16} {:<22} {:>8}  {}",
            m.address,
            st,
            loc.unwrap_or_default(),
            inst,
            m.ssh.clone().unwrap_or_default(),
            m.price_per_hour
                .map(|p| format!("{p:.2}"))
                .unwrap_or_default(),
            last
        );
    }
    Ok(Exit::Success)
}

/// One machine's status from its record.
fn machine(address: &str, r: &ResourceRecord, observed: Option<String>) -> MachineStatus {
    let mut m = MachineStatus {
        address: address.to_string(),
        state: String::new(),
        observed,
        location: None,
        instance_ids: Vec::new(),
        ssh: None,
        price_per_hour: None,
        error: None,
        last_event: r.events.back().map(|e| Event {
            at: e.at,
            label: e.label.clone(),
        }),
    };
    match plan::recorded(address, r) {
        Ok(plan::Recorded::Launch(s)) => {
            m.state = serde_json::to_value(&s)
                .ok()
                .and_then(|v| v["state"].as_str().map(str::to_string))
                .unwrap_or_default();
            let vm = s.ready().cloned();
            if let Some(o) = s.owned() {
                m.location = Some(o.location.to_string());
                m.instance_ids = o.instance_ids;
            }
            m.ssh = vm
                .as_ref()
                .map(|v| format!("{}@{}:{}", v.user, v.ssh.host, v.ssh.port));
            m.price_per_hour = vm.map(|v| v.offer.price_per_hour);
        }
        Ok(plan::Recorded::K3sPending { .. }) => {
            m.state = crate::record::Record::decode(&r.machine.kind, &r.machine.state)
                .ok()
                .and_then(|rec| rec.tag())
                .map(|s| format!("k3s:{s}"))
                .unwrap_or_default();
            if let Some(v) = crate::record::vm_of(&r.machine.kind, &r.machine.state) {
                m.location = Some(v.location.to_string());
                m.instance_ids = vec![v.instance_id.clone()];
                m.ssh = Some(format!("{}@{}:{}", v.user, v.ssh.host, v.ssh.port));
                m.price_per_hour = Some(v.offer.price_per_hour);
            }
        }
        Ok(plan::Recorded::Teardown(t)) => {
            m.state = serde_json::to_value(&t)
                .ok()
                .and_then(|v| v["state"].as_str().map(|s| format!("teardown:{s}")))
                .unwrap_or_default();
            if let Some(o) = t.owned() {
                m.location = Some(o.location.to_string());
                m.instance_ids = o.instance_ids;
            }
        }
        Err(e) => {
            m.state = "invalid".into();
            m.error = Some(e);
        }
    }
    m
}
