//! Droplets as the listing shows them (status, identity tags, endpoint) and the power-on
//! that starts a stopped one.

use reqwest::Method;
use serde_json::{json, Value};

use super::api::{Action, Droplet};
use super::{errors, field, DigitalOceanProvider, SSH_PORT, SSH_USER};
use crate::provider::kit::Call;
use crate::provider::{
    ErrorKind, InstanceStatus, Naming, ProviderError, Result, Seen, Shown, SshEndpoint,
    IDENTITY_LABEL, LINEAGE_LABEL,
};

/// Normalised status of a droplet `status` (spec enum `new, active, off, archive`):
/// `new` → Pending, `active` → Running, `off` → Stopped, `archive` → Failed (DigitalOcean
/// archived it; it takes no SSH and must be deleted), anything else → Failed naming it.
pub(super) fn status_of(s: &str) -> InstanceStatus {
    match s {
        "new" => InstanceStatus::Pending,
        "active" => InstanceStatus::Running,
        "off" => InstanceStatus::Stopped,
        "archive" => InstanceStatus::Failed("archived by DigitalOcean".into()),
        other => InstanceStatus::Failed(format!("unknown DigitalOcean status `{other}`")),
    }
}

/// The value of a droplet's `<key>:<value>` tag (tags stand in for labels here).
fn tag_value<'d>(d: &'d Droplet, key: &str) -> Option<&'d str> {
    d.tags
        .iter()
        .find_map(|t| t.strip_prefix(key)?.strip_prefix(':'))
}

/// A listed droplet as the contract's listing shows it, when it is in `region` (slug,
/// exact): its `gpuprov-vm-name:` and `gpuprov-lineage:` tags (the identity), name,
/// `size_slug`, `size.price_hourly` and `created_at`. Status: new → Pending, active →
/// Running, off → Stopped, archive → Failed. SSH endpoint: the public IPv4 address, port
/// 22, user `root`.
pub(super) fn seen_at(d: &Droplet, region: &str) -> Option<Seen> {
    if d.region.as_ref().map(|r| r.slug.as_str()) != Some(region) {
        return None;
    }
    let ssh = d
        .networks
        .v4
        .iter()
        .find(|n| n.kind == "public" && !n.ip_address.is_empty())
        .map(|n| SshEndpoint {
            host: n.ip_address.clone(),
            port: SSH_PORT,
            user: Some(SSH_USER.to_string()),
        });
    let identity = Shown::labels(tag_value(d, IDENTITY_LABEL), tag_value(d, LINEAGE_LABEL))
        .named(d.name.as_deref(), Naming::Object);
    Some(Seen {
        ssh,
        instance_type: d.size_slug.clone(),
        price_per_hour: d.size.as_ref().and_then(|s| s.price_hourly),
        created_at: d.created_at,
        ..Seen::new(d.id.to_string(), status_of(&d.status), identity)
    })
}

impl DigitalOceanProvider {
    /// [`start`](crate::provider::CloudProvider::start) of droplet `instance_id` in `region`:
    /// see its doc in `mod.rs`.
    pub(super) async fn power_on(&self, region: &str, instance_id: &str) -> Result<()> {
        let gone = |why: &str| {
            ProviderError::new(
                ErrorKind::Failed,
                format!("digitalocean start droplet {instance_id}: {why}"),
            )
        };
        let Ok(n) = instance_id.trim().parse::<u64>() else {
            return Err(gone("not a droplet id"));
        };
        let what = format!("start droplet {n}");
        let call = Call::other(&what).in_region(region);
        let path = format!("/v2/droplets/{n}");
        let v = match self.api.send(Method::GET, &path, &[], None).await {
            Ok(v) => v,
            Err(f) if errors::is_not_found(&f) => return Err(gone("it no longer exists")),
            Err(f) => return Err(self.api.fail(&f, Call::other(&what))),
        };
        match field(
            &v,
            "/droplet/status",
            Value::as_str,
            &what,
            "droplet status",
        )? {
            "new" | "active" => return Ok(()),
            "off" => {}
            other => return Err(gone(&format!("its status is `{other}`"))),
        }
        let body = json!({ "type": "power_on" });
        let actions = format!("{path}/actions");
        match self
            .api
            .send(Method::POST, &actions, &[], Some(&body))
            .await
        {
            Ok(_) => Ok(()),
            Err(f) if errors::is_not_found(&f) => Err(gone("it no longer exists")),
            // The droplet stays `off` until its power_on completes, so a start repeated
            // meanwhile is refused ("Droplet already has a pending event."): success when
            // a power_on is in progress.
            Err(f) if f.http_status() == Some(422) => {
                let listing = format!("list actions of droplet {n}");
                let listed: Vec<Action> = self.list_all(&actions, "actions", &[], &listing).await?;
                if listed
                    .iter()
                    .any(|a| a.kind == "power_on" && a.status == "in-progress")
                {
                    Ok(())
                } else {
                    Err(self.api.fail(&f, call))
                }
            }
            Err(f) => Err(self.api.fail(&f, call)),
        }
    }
}
