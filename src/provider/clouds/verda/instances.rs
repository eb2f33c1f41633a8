//! Instances as the listing (`GET /instances`) shows them: location, status, identity.

use super::api::Instance;
use super::{DEFAULT_LOCATION, SSH_PORT, SSH_USER};
use crate::provider::kit::ports;
use crate::provider::{
    ErrorKind, InstanceStatus, Naming, ProviderError, Seen, Shown, IDENTITY_LABEL, LINEAGE_LABEL,
};

/// The value of `key=` among the words of a description.
pub(super) fn described<'d>(description: &'d str, key: &str) -> Option<&'d str> {
    description
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// The location of a listed instance (the SDKs' default when absent).
pub(super) fn location_of(i: &Instance) -> &str {
    i.location
        .as_deref()
        .filter(|l| !l.is_empty())
        .unwrap_or(DEFAULT_LOCATION)
}

/// Normalised status of a listed instance; `None` once it is gone. Status: new / ordered /
/// validating / provisioning / pending / restoring / unknown → Pending, running →
/// Running, offline → Stopped, hibernating → Stopping, deleting → Terminating, error →
/// Failed, `no_capacity` (the Go SDK's `StatusNoCapacity`) → Refused (`Capacity`: the
/// create refused late, so the core fails over), discontinued / notfound → gone.
pub(super) fn status_of(i: &Instance) -> Option<InstanceStatus> {
    Some(match i.status.as_str() {
        "new" | "ordered" | "validating" | "provisioning" | "pending" | "restoring" | "unknown" => {
            InstanceStatus::Pending
        }
        "running" => InstanceStatus::Running,
        "offline" => InstanceStatus::Stopped,
        "starting_hibernation" | "hibernating" => InstanceStatus::Stopping,
        "deleting" => InstanceStatus::Terminating,
        "discontinued" | "notfound" => return None,
        "error" => InstanceStatus::Failed("Verda status `error`".into()),
        "no_capacity" => InstanceStatus::Refused(Box::new(ProviderError::new(
            ErrorKind::Capacity,
            format!(
                "verda: no capacity for {} in {} (instance {} is `no_capacity`)",
                i.instance_type,
                location_of(i),
                i.id
            ),
        ))),
        other => InstanceStatus::Failed(format!("unknown Verda status `{other}`")),
    })
}

/// A listed instance as the contract's listing shows it, when it is in `region` and not
/// gone: its description's `gpuprov-vm-name=` and `gpuprov-lineage=` words (the
/// identity), its hostname (`gpuprov-<vm>-<lineage8>`), type and `created_at`. The
/// instance's `price_per_hour` is left out: the listing names no currency (only
/// `GET /instance-types` is asked in USD). SSH `root@ip:22` once `ip` is set.
pub(super) fn seen_at(i: &Instance, region: &str) -> Option<Seen> {
    if location_of(i) != region {
        return None;
    }
    let identity = Shown::labels(
        described(&i.description, IDENTITY_LABEL),
        described(&i.description, LINEAGE_LABEL),
    )
    .named(
        Some(i.hostname.as_str()).filter(|h| !h.is_empty()),
        Naming::Object,
    );
    Some(Seen {
        ssh: ports::ssh_at(i.ip.as_deref(), SSH_PORT, SSH_USER),
        instance_type: Some(i.instance_type.clone()).filter(|t| !t.is_empty()),
        created_at: i.created_at.as_deref().and_then(|t| t.parse().ok()),
        ..Seen::new(i.id.clone(), status_of(i)?, identity)
    })
}
