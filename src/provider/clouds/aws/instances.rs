//! Mapping of EC2 instances onto the contract: filters and tags, the client token, the
//! status of a listed instance and its preemption.

use super::*;

pub(super) fn filter(name: &str, values: &[&str]) -> Filter {
    let mut b = Filter::builder().name(name);
    for v in values {
        b = b.values(*v);
    }
    b.build()
}

pub(super) fn tag(key: &str, value: &str) -> Tag {
    Tag::builder().key(key).value(value).build()
}

/// `ClientToken` for `token`: itself when it fits EC2's 64 ASCII characters, else a
/// stable digest (`gpuprov-` + 56 hex of SHA-256), so the same attempt always sends the
/// same token.
pub fn client_token(token: &str) -> String {
    if token.len() <= CLIENT_TOKEN_MAX && token.is_ascii() {
        return token.to_string();
    }
    let digest = Sha256::digest(token.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("gpuprov-{}", &hex[..CLIENT_TOKEN_MAX - "gpuprov-".len()])
}

/// The normalised status of an EC2 instance state.
pub fn status_of(state: Option<&InstanceStateName>, reason: Option<&str>) -> InstanceStatus {
    match state {
        Some(InstanceStateName::Pending) => InstanceStatus::Pending,
        Some(InstanceStateName::Running) => InstanceStatus::Running,
        Some(InstanceStateName::Stopping) => InstanceStatus::Stopping,
        Some(InstanceStateName::Stopped) => InstanceStatus::Stopped,
        Some(InstanceStateName::ShuttingDown | InstanceStateName::Terminated) => {
            InstanceStatus::Terminating
        }
        other => InstanceStatus::Failed(format!(
            "unknown EC2 state {:?}{}",
            other.map(|s| s.as_str()),
            reason.map(|r| format!(": {r}")).unwrap_or_default()
        )),
    }
}

/// EC2's own spot interruption signal: a spot instance (`InstanceLifecycle: spot`, or
/// no lifecycle given) whose last state change has the reason code
/// `Server.SpotInstanceTermination` (terminated, or shutting down) or
/// `Server.SpotInstanceShutdown` (stopped, or stopping; the `stop` interruption
/// behaviour) is [`InstanceStatus::Preempted`], stopped or not. `None` otherwise (the
/// state alone decides, [`status_of`]).
pub fn preemption_of(
    state: Option<&InstanceStateName>,
    lifecycle: Option<&InstanceLifecycleType>,
    reason: Option<&StateReason>,
) -> Option<InstanceStatus> {
    let code = reason.and_then(|r| r.code())?;
    if !matches!(
        code,
        "Server.SpotInstanceTermination" | "Server.SpotInstanceShutdown"
    ) || lifecycle.is_some_and(|l| *l != InstanceLifecycleType::Spot)
    {
        return None;
    }
    let stopped = match state? {
        InstanceStateName::Stopped | InstanceStateName::Stopping => true,
        InstanceStateName::Terminated | InstanceStateName::ShuttingDown => false,
        _ => return None,
    };
    let message = reason.and_then(|r| r.message()).unwrap_or_default();
    Some(InstanceStatus::Preempted {
        // EC2's message usually starts with the code already
        // ("Server.SpotInstanceTermination: Spot instance termination").
        signal: if message.is_empty() {
            code.to_string()
        } else if message.starts_with(code) {
            message.to_string()
        } else {
            format!("{code}: {message}")
        },
        stopped,
    })
}

/// A listed instance as the contract's listing shows it: its identity tags and `Name` tag,
/// status (a reclaimed spot instance is [`InstanceStatus::Preempted`], [`preemption_of`];
/// otherwise [`status_of`]), the SSH endpoint (public IPv4, 22, user [`SSH_USER`]) once it
/// runs with a public IP, its type, the catalog's list price for the type (an upper bound
/// for spot) and `LaunchTime`. `None` for an instance without id, or terminated and not
/// preempted (gone).
pub fn seen_of(i: &aws_sdk_ec2::types::Instance) -> Option<Seen> {
    let id = i.instance_id()?;
    let tag = |k: &str| {
        i.tags()
            .iter()
            .find(|t| t.key() == Some(k))
            .and_then(|t| t.value())
    };
    let state = i.state().and_then(|s| s.name());
    let preempted = preemption_of(state, i.instance_lifecycle(), i.state_reason());
    if state == Some(&InstanceStateName::Terminated) && preempted.is_none() {
        return None;
    }
    let status =
        preempted.unwrap_or_else(|| status_of(state, i.state_reason().and_then(|r| r.message())));
    let ssh = (status == InstanceStatus::Running)
        .then(|| i.public_ip_address())
        .flatten()
        .filter(|ip| !ip.is_empty())
        .map(|ip| SshEndpoint {
            host: ip.to_string(),
            port: 22,
            user: Some(SSH_USER.to_string()),
        });
    let instance_type = i.instance_type().map(|t| t.as_str().to_string());
    let identity =
        Shown::labels(tag(IDENTITY_LABEL), tag(LINEAGE_LABEL)).named(tag("Name"), Naming::Object);
    Some(Seen {
        ssh,
        price_per_hour: instance_type
            .as_deref()
            .and_then(catalog::lookup)
            .map(|g| g.price_per_hour),
        instance_type,
        created_at: i
            .launch_time()
            .and_then(|t| chrono::DateTime::from_timestamp(t.secs(), t.subsec_nanos())),
        ..Seen::new(id, status, identity)
    })
}
