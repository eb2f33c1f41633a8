//! Instances as the listing (`GET /instance`) shows them: status, endpoint and the name
//! that carries the identity.

use super::api::Instance;
use super::{ANY_REGION, SSH_PORT, SSH_USER};
use crate::provider::{InstanceStatus, Naming, Seen, Shown, SshEndpoint};

/// Normalised status of a listed instance; `None` once it is gone. The words are
/// brevdev/cloud's (`massedComputeLifecycleStatus`), which takes an unknown word for a
/// machine still on its way.
pub(super) fn status_of(s: &str) -> Option<InstanceStatus> {
    Some(match s.trim().to_ascii_lowercase().as_str() {
        "active" | "running" | "rented" => InstanceStatus::Running,
        "stopping" => InstanceStatus::Stopping,
        "stopped" => InstanceStatus::Stopped,
        "terminating" | "deleting" => InstanceStatus::Terminating,
        "terminated" | "deleted" => return None,
        "failed" | "error" => InstanceStatus::Failed(format!("Massed Compute status `{s}`")),
        _ => InstanceStatus::Pending,
    })
}

/// A listed instance as the contract's listing shows it at `region`, unless it is gone.
/// The listing does not say where an instance runs, so every one is shown at every
/// location; its name carries the place: `gpuprov-<vm>-<lineage8>` at [`ANY_REGION`],
/// `gpuprov-<vm>-<lineage8>-<region>` when pinned ([`Naming::Located`]). No labels.
/// Type `product.name`, price `product.price_hr` (USD per hour), `created`. SSH endpoint
/// `ip:22` as `username` (else `ubuntu`) once `ip` is set.
pub(super) fn seen_at(i: &Instance, region: &str) -> Option<Seen> {
    let status = status_of(i.status.as_deref().unwrap_or_default())?;
    let nonblank = |s: &Option<String>| {
        s.as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let ssh = nonblank(&i.ip).map(|host| SshEndpoint {
        host,
        port: SSH_PORT,
        user: Some(nonblank(&i.username).unwrap_or_else(|| SSH_USER.to_string())),
    });
    let naming = if region.eq_ignore_ascii_case(ANY_REGION) {
        Naming::Object
    } else {
        Naming::Located
    };
    let product = i.product.as_ref();
    Some(Seen {
        ssh,
        instance_type: product.and_then(|p| nonblank(&p.name)),
        price_per_hour: product.and_then(|p| p.price_hr.as_ref()?.as_f64()),
        created_at: i.created.as_deref().and_then(|t| t.parse().ok()),
        ..Seen::new(
            i.uuid.clone(),
            status,
            Shown::default().named(i.name.as_deref(), naming),
        )
    })
}
