//! The per-VM cloud firewall and the tag it is applied to (`/v2/firewalls`, `/v2/tags`).

use reqwest::Method;
use serde_json::{json, Value};

use super::api::Firewall;
use super::{errors, field, DigitalOceanProvider};
use crate::provider::kit::{ports, Call};
use crate::provider::{object_name, Lineage, ProviderError};

impl DigitalOceanProvider {
    /// The per-VM firewall's name and tag, per region: `gpuprov-<vm>-<lineage8>-<region>`
    /// (valid as firewall name, spec `^[a-zA-Z0-9][a-zA-Z0-9\.-]+$`, and as tag). The
    /// region keeps a cleanup after a failover from removing the firewall of the VM's next
    /// attempt elsewhere.
    pub fn firewall_name(vm_name: &str, lineage: &Lineage, region: &str) -> String {
        format!("{}-{region}", object_name(vm_name, lineage))
    }

    pub(super) async fn firewalls(&self) -> Result<Vec<Firewall>, ProviderError> {
        self.list_all("/v2/firewalls", "firewalls", &[], "list firewalls")
            .await
    }

    /// Creates tag `name` (`POST /v2/tags`); a tag that already exists is success.
    pub(super) async fn ensure_tag(&self, name: &str) -> Result<(), ProviderError> {
        let body = json!({ "name": name });
        match self
            .api
            .send(Method::POST, "/v2/tags", &[], Some(&body))
            .await
        {
            Ok(_) => Ok(()),
            Err(f) if errors::is_422(&f, errors::TAG_EXISTS_PHRASES) => Ok(()),
            Err(f) => Err(self
                .api
                .fail(&f, Call::other(&format!("create tag {name}")))),
        }
    }

    /// The id of firewall `name`, created (applied to tag `name`) with inbound TCP 22 and
    /// `ports` from anywhere and all outbound traffic when missing.
    pub(super) async fn ensure_firewall(
        &self,
        name: &str,
        ports: &[u16],
    ) -> Result<String, ProviderError> {
        if let Some(f) = self.firewalls().await?.into_iter().find(|f| f.name == name) {
            return Ok(f.id);
        }
        let anywhere = json!({ "addresses": ["0.0.0.0/0", "::/0"] });
        let inbound: Vec<Value> = ports::with_ssh(ports)
            .iter()
            .map(|p| json!({ "protocol": "tcp", "ports": p.to_string(), "sources": anywhere }))
            .collect();
        // "0" = every port of the protocol (spec `firewall_rule_base.ports`).
        let outbound: Vec<Value> = ["tcp", "udp", "icmp"]
            .iter()
            .map(|p| json!({ "protocol": p, "ports": "0", "destinations": anywhere }))
            .collect();
        let body = json!({
            "name": name,
            "tags": [name],
            "inbound_rules": inbound,
            "outbound_rules": outbound,
        });
        let what = format!("create firewall {name}");
        let v: Value = self
            .api
            .post("/v2/firewalls", &body, Call::other(&what))
            .await?;
        field(
            &v,
            "/firewall/id",
            |v| v.as_str().map(str::to_string),
            &what,
            "id",
        )
    }
}
