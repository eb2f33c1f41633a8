//! `gpuprov status [-json]`: each machine's recorded state and, with refresh, what its
//! cloud says.

use super::args::StatusArgs;
use super::error::{CmdResult, CommandError, Exit};
use super::project::{lineage_of, Project};
use super::providers::{add_recorded_clouds, build_providers, recorded_clouds};
use super::view::json::{Event, JsonStatus, MachineStatus};
use crate::machine::Providers;
use crate::plan;
use crate::state::ResourceRecord;

pub(super) async fn run(project: &Project, a: &StatusArgs) -> CmdResult {
    let (_, state) = project.open_state()?;
    let refresh = a.refresh.refresh && !state.resources.is_empty();
    let observed = if refresh {
        let config = project.load_config().ok();
        let providers = match lineage_of(&state) {
            Ok(lineage) => {
                let mut p = match config.as_ref() {
                    Some(c) => build_providers(c, &lineage),
                    None => Providers::default(),
                };
                // The clouds the state records, named by the config or not.
                let clouds = recorded_clouds(&state, &plan::ReadAhead::of(&state, 1));
                add_recorded_clouds(&mut p, config.as_ref(), clouds, &lineage);
                p
            }
            Err(_) => Providers::default(),
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
                    plan::Observation::NotRunning(s) => s.word().to_string(),
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
        outln!(
            "{}",
            serde_json::to_string_pretty(&out).map_err(CommandError::internal)?
        );
        return Ok(Exit::Success);
    }
    if machines.is_empty() {
        outln!("No machines in {}.", project.location());
        return Ok(Exit::Success);
    }
    outln!(
        "{:<20} {:<24} {:<16} {:<16} {:<22} {:>8} {:>8} {:>9}  LAST EVENT",
        "MACHINE",
        "STATE",
        "LOCATION",
        "INSTANCE",
        "SSH",
        "$/H",
        "UPTIME",
        "COST $"
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
            "{:<20} {:<24} {:<16} {:<16} {:<22} {:>8} {:>8} {:>9}  {}",
            m.address,
            st,
            loc.unwrap_or_default(),
            inst,
            m.ssh.clone().unwrap_or_default(),
            m.price_per_hour
                .map(|p| format!("{p:.2}"))
                .unwrap_or_default(),
            m.uptime_seconds.map(uptime).unwrap_or_default(),
            m.cost_so_far.map(|c| format!("{c:.2}")).unwrap_or_default(),
            last
        );
    }
    // The cloud's reason for a status, as a sentence (a preemption's signal, a failure).
    let said = observed
        .iter()
        .flat_map(|o| o.iter())
        .filter_map(|(address, o)| match o {
            plan::Observation::NotRunning(s) if s.to_string() != s.word() => Some((address, s)),
            _ => None,
        });
    for (address, s) in said {
        outln!("note: {address}: {s}");
    }
    for m in &machines {
        if let Some(why) = m
            .kubernetes
            .as_deref()
            .and_then(|k| k.strip_prefix("skipped: "))
        {
            outln!("note: {}: kubernetes skipped: {why}", m.address);
        }
    }
    Ok(Exit::Success)
}

/// An uptime the way people read it: `45s`, `12m`, `3h05m`, `2d04h`.
fn uptime(secs: u64) -> String {
    let (d, h, m) = (secs / 86_400, secs / 3_600 % 24, secs / 60 % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{secs}s"),
        (0, 0, m) => format!("{m}m"),
        (0, h, m) => format!("{h}h{m:02}m"),
        (d, h, _) => format!("{d}d{h:02}h"),
    }
}

/// Whether a machine is (or will be) a cluster: from its desired snapshot and, for one
/// that asked for k3s, whether its cloud can host it (the adapter's capabilities; building
/// one does no I/O).
fn kubernetes(r: &ResourceRecord, cloud: Option<&str>) -> Option<String> {
    let desired: crate::config::VmSpec = r.desired.as_ref()?.decode().ok()?;
    if !desired.kubernetes {
        return Some("off".into());
    }
    if r.machine.kind == crate::record::K3S {
        return Some("on".into());
    }
    let hosts = cloud
        .and_then(crate::config::Cloud::from_name)
        .and_then(|c| c.build(&Default::default(), crate::provider::Lineage::random()))
        .map(|p| {
            p.capabilities()
                .supports(crate::provider::Feature::Kubernetes)
        });
    Some(match (hosts, cloud) {
        (Some(false), Some(c)) => format!("skipped: {c} cannot host k3s"),
        _ => "on".into(),
    })
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
        up_since: None,
        uptime_seconds: None,
        cost_so_far: None,
        kubernetes: None,
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
            m.price_per_hour = vm.as_ref().map(|v| v.offer.price_per_hour);
            m.up_since = vm.as_ref().map(|v| v.ready_at);
        }
        Ok(plan::Recorded::K3sPending { .. }) => {
            m.state = r
                .machine
                .decode()
                .ok()
                .and_then(|rec| rec.tag())
                .map(|s| format!("k3s:{s}"))
                .unwrap_or_default();
            if let Some(v) = r.machine.vm() {
                m.location = Some(v.location.to_string());
                m.instance_ids = vec![v.instance_id.clone()];
                m.ssh = Some(format!("{}@{}:{}", v.user, v.ssh.host, v.ssh.port));
                m.price_per_hour = Some(v.offer.price_per_hour);
                m.up_since = Some(v.ready_at);
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
    if let Some(since) = m.up_since {
        let secs = (chrono::Utc::now() - since).num_seconds().max(0) as u64;
        m.uptime_seconds = Some(secs);
        m.cost_so_far = m
            .price_per_hour
            .map(|p| (p * secs as f64 / 3600.0 * 100.0).round() / 100.0);
    }
    let cloud = m.location.as_deref().and_then(|l| l.split('/').next());
    m.kubernetes = kubernetes(r, cloud);
    m
}
