//! Pods as the listing (`GET /api/v1/pods/`) shows them: status, the SSH endpoint Prime
//! Intellect reports late, and the name that carries the identity.

use serde_json::Value;

use super::api::{Pod, PortMapping};
use super::{SSH_PORT, SSH_USER};
use crate::provider::{InstanceStatus, Naming, Seen, Shown, SshEndpoint};

/// The SSH endpoint in a pod's `sshConnection` (and port mapping).
///
/// `conn` is what the API answers: a string, a list of strings and nulls (one per node;
/// the first string is used), or null / `[]` / `[null]` while the pod boots (`Ok(None)`).
/// A string is `[ssh] [user@]host [-p port]` with `-p port` anywhere (`-p2222` too); the
/// user defaults to [`SSH_USER`]; the port, when the string has none, is the public port
/// `primePortMapping` maps to 22/TCP (or marks `usedBy: SSH`: the NAT port), else
/// [`SSH_PORT`] (the CLI's default).
/// Errors: a string without a host, or with a port that is not a TCP port number (the
/// reason, for `Failed`).
pub fn ssh_endpoint(
    conn: &Value,
    ports: &[PortMapping],
) -> std::result::Result<Option<SshEndpoint>, String> {
    let first = match conn {
        Value::String(s) => Some(s.as_str()),
        Value::Array(list) => list.iter().find_map(Value::as_str),
        _ => None,
    };
    let Some(text) = first.map(str::trim).filter(|s| !s.is_empty()) else {
        return Ok(None);
    };
    let bad = |why: &str| format!("sshConnection {text:?} {why}");
    let mut dest = None;
    let mut port = None;
    let mut words = text.split_whitespace().peekable();
    if words.peek() == Some(&"ssh") {
        words.next();
    }
    while let Some(w) = words.next() {
        let value = match w {
            "-p" => Some(words.next().ok_or_else(|| bad("has -p without a port"))?),
            _ if w.starts_with("-p") => Some(&w[2..]),
            // Options with an argument the CLI could print (identity file, config).
            "-i" | "-o" | "-l" => {
                words.next();
                None
            }
            _ if w.starts_with('-') => None,
            _ if dest.is_none() => {
                dest = Some(w);
                None
            }
            _ => return Err(bad("has more than one destination")),
        };
        if let Some(v) = value {
            port = Some(
                v.parse::<u16>()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| bad("has no valid port"))?,
            );
        }
    }
    let dest = dest.ok_or_else(|| bad("names no host"))?;
    let (user, host) = match dest.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, dest),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || user.is_some_and(str::is_empty) {
        return Err(bad("names no host"));
    }
    let nat = ports
        .iter()
        .find(|m| {
            (m.internal.trim() == "22" || m.used_by.as_deref() == Some("SSH"))
                && m.protocol
                    .as_deref()
                    .is_none_or(|p| p.eq_ignore_ascii_case("TCP"))
        })
        .and_then(|m| m.external.trim().parse::<u16>().ok())
        .filter(|p| *p > 0);
    Ok(Some(SshEndpoint {
        host: host.to_string(),
        port: port.or(nat).unwrap_or(SSH_PORT),
        user: Some(user.unwrap_or(SSH_USER).to_string()),
    }))
}

/// Normalised status of a pod; `None` once it is gone.
pub(super) fn status_of(p: &Pod) -> Option<InstanceStatus> {
    Some(match p.status.as_str() {
        "PROVISIONING" | "PENDING" | "UNKNOWN" => InstanceStatus::Pending,
        "ACTIVE" if p.installation_status.as_deref() == Some("ERROR") => {
            InstanceStatus::Failed(format!(
                "installation failed: {}",
                p.installation_failure
                    .as_deref()
                    .unwrap_or("no reason given")
            ))
        }
        "ACTIVE" => InstanceStatus::Running,
        "STOPPED" => InstanceStatus::Stopped,
        "DELETING" => InstanceStatus::Terminating,
        "TERMINATED" => return None,
        "ERROR" => InstanceStatus::Failed("Prime Intellect status ERROR".into()),
        other => InstanceStatus::Failed(format!("unknown Prime Intellect status `{other}`")),
    })
}

/// A listed pod as the contract's listing shows it at `region`, unless it is terminated.
/// The listing does not say where a pod runs, so every pod is shown at every location;
/// its name `gpuprov-<vm>-<lineage8>-<dc>` carries the place ([`Naming::Located`]). No
/// labels. Price `priceHr` (USD per hour), `createdAt`; no type (pods carry no
/// `cloudId`, the offers' type). Status: PROVISIONING / PENDING / UNKNOWN → Pending,
/// ACTIVE → Running (Failed when its installation failed, or when its `sshConnection`
/// cannot be read, with the reason), STOPPED → Stopped, DELETING → Terminating, ERROR →
/// Failed. The SSH endpoint from `sshConnection` once it is set ([`ssh_endpoint`]).
pub(super) fn seen_at(p: &Pod, _region: &str) -> Option<Seen> {
    let mut status = status_of(p)?;
    let ports = p.prime_port_mapping.as_deref().unwrap_or_default();
    let ssh = match ssh_endpoint(&p.ssh_connection, ports) {
        Ok(ep) => ep,
        Err(why) => {
            if status == InstanceStatus::Running {
                status = InstanceStatus::Failed(why);
            }
            None
        }
    };
    let name = Some(p.name.as_str()).filter(|n| !n.is_empty());
    Some(Seen {
        ssh,
        price_per_hour: p.price_hr,
        created_at: p.created_at.as_deref().and_then(|t| t.parse().ok()),
        ..Seen::new(
            p.id.clone(),
            status,
            Shown::default().named(name, Naming::Located),
        )
    })
}
