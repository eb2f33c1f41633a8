//! Nebius instances as the contract sees them: status, name, idempotency key and labels of
//! an instance, its listing entry, and the create operations followed until the instance
//! has its id.

use super::*;

/// The normalised status and SSH endpoint of `i` (its `InstanceStatus.state`):
/// CREATING, STARTING, UPDATING → `Pending`; RUNNING → `Running` (with the public address
/// once there is one); STOPPING, STOPPED (a preemptible VM's: `Preempted`); DELETING → `Terminating`; ERROR → `Failed`; an
/// unset or unknown state → `Pending` (never taken as gone).
pub fn status_of(i: &compute::Instance) -> (InstanceStatus, Option<crate::provider::SshEndpoint>) {
    use compute::instance_status::InstanceState as S;
    let st = i.status.as_ref();
    let state = st.map(|s| s.state()).unwrap_or(S::Unspecified);
    let status = match state {
        S::Creating | S::Starting | S::Updating | S::Unspecified => InstanceStatus::Pending,
        S::Running => InstanceStatus::Running,
        S::Stopping => InstanceStatus::Stopping,
        // A preemptible VM is stopped when preempted (`on_preemption: STOP`, the only
        // policy); the instance does not say who stopped it, so it counts as preempted.
        S::Stopped if i.spec.as_ref().is_some_and(|s| s.preemptible.is_some()) => {
            InstanceStatus::Preempted {
                signal: "preemptible instance STOPPED".into(),
                stopped: true,
            }
        }
        S::Stopped => InstanceStatus::Stopped,
        S::Deleting => InstanceStatus::Terminating,
        S::Error => InstanceStatus::Failed("Nebius reports the instance in state ERROR".into()),
    };
    let ip = st.and_then(|s| {
        s.network_interfaces
            .iter()
            .filter_map(|n| n.public_ip_address.as_ref())
            .map(|p| p.address.split('/').next().unwrap_or("").to_string())
            .find(|a| !a.trim().is_empty())
    });
    let ssh = match status {
        InstanceStatus::Running => kit::ports::ssh_at(ip.as_deref(), SSH_PORT, SSH_USER),
        _ => None,
    };
    (status, ssh)
}

/// The instance name of one create attempt: `gpuprov-<vm>-<lineage8>-<hhhh>`.
pub fn instance_name(vm: &str, lineage: &Lineage, client_token: &str) -> String {
    use sha2::Digest as _;
    let d = sha2::Sha256::digest(client_token.as_bytes());
    format!(
        "{}-{:02x}{:02x}",
        crate::provider::object_name(vm, lineage),
        d[0],
        d[1]
    )
}

/// The idempotency key of one create attempt: a UUID made from the attempt's token.
pub fn idempotency_key(client_token: &str) -> String {
    use sha2::Digest as _;
    let d = sha2::Sha256::digest(format!("nebius-create:{client_token}").as_bytes());
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[..16]);
    uuid::Builder::from_custom_bytes(b).into_uuid().to_string()
}

/// The identity labels of `vm`'s objects.
pub(super) fn labels(vm: &str, lineage: &Lineage) -> HashMap<String, String> {
    HashMap::from([
        (IDENTITY_LABEL.to_string(), vm.to_string()),
        (LINEAGE_LABEL.to_string(), lineage.as_str().to_string()),
    ])
}

/// A listed instance as the contract's listing shows it: its identity labels and name
/// (`gpuprov-<vm>-<lineage8>-<hhhh>`), [`status_of`], the instance type as an offer names
/// it (`<platform>/<preset>`), the catalog's price for it (preemptible or not) and
/// `metadata.created_at`.
pub fn seen(i: &compute::Instance) -> Seen {
    let m = i.metadata.as_ref();
    let label = |k: &str| m.and_then(|m| m.labels.get(k)).map(String::as_str);
    let identity = Shown::labels(label(IDENTITY_LABEL), label(LINEAGE_LABEL))
        .named(m.map(|m| m.name.as_str()), Naming::Object);
    let (status, ssh) = status_of(i);
    let spec = i.spec.as_ref();
    let sized = spec
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| match &r.size {
            Some(compute::resources_spec::Size::Preset(p)) => {
                Some((r.platform.as_str(), p.as_str()))
            }
            _ => None,
        });
    let preemptible = spec.is_some_and(|s| s.preemptible.is_some());
    let price = sized.and_then(|(platform, preset)| {
        let gpus = catalog::preset_gpus(preset)?;
        Some(catalog::platform(platform)?.price(gpus, preemptible))
    });
    Seen {
        ssh,
        instance_type: sized.map(|(platform, preset)| format!("{platform}/{preset}")),
        price_per_hour: price,
        created_at: m
            .and_then(|m| m.created_at.as_ref())
            .and_then(|t| chrono::DateTime::from_timestamp(t.seconds, t.nanos.max(0) as u32)),
        ..Seen::new(
            m.map(|m| m.id.clone()).unwrap_or_default(),
            status,
            identity,
        )
    }
}

impl NebiusProvider {
    /// The instance of `project` named `name`.
    pub(super) async fn instance_by_name(
        &self,
        project: &str,
        name: &str,
    ) -> Result<Option<compute::Instance>> {
        let req = common::GetByNameRequest {
            parent_id: project.to_string(),
            name: name.to_string(),
        };
        match self
            .call(Service::Compute, req, None, |c, r| async move {
                compute::instance_service_client::InstanceServiceClient::new(c)
                    .get_by_name(r)
                    .await
            })
            .await
        {
            Ok(i) => Ok(Some(i)),
            Err(f) if is_not_found(&f) => Ok(None),
            Err(f) => Err(self.fail(&f, Call::other(&format!("read instance {name}")))),
        }
    }

    /// Follows the create operations this process started in `region` (for VM `only`,
    /// else for every VM; module docs): `(vm, instance id, status)` of each one still
    /// running or failed. One `OperationService/Get` per create still running, none for
    /// one known to have failed; a create that succeeded or that the cloud forgot is
    /// dropped.
    pub(super) async fn follow_creates(
        &self,
        region: &str,
        only: Option<&str>,
    ) -> Result<Vec<(String, String, InstanceStatus)>> {
        let mine: Vec<(String, Started)> = self
            .started
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, s)| s.region == region && only.is_none_or(|vm| s.vm == vm))
            .map(|(id, s)| (id.clone(), s.clone()))
            .collect();
        let mut out = Vec::new();
        for (id, s) in mine {
            if let Some(e) = s.failed {
                out.push((s.vm, id, InstanceStatus::Refused(Box::new(e))));
                continue;
            }
            let what = format!("read operation {} of instance {id}", s.operation);
            let req = common::GetOperationRequest {
                id: s.operation.clone(),
            };
            let op = self
                .call(Service::Compute, req, None, |c, r| async move {
                    common::operation_service_client::OperationServiceClient::new(c)
                        .get(r)
                        .await
                })
                .await;
            let op = match op {
                Ok(op) => op,
                // An operation the cloud no longer knows: the instance alone decides.
                Err(f) if is_not_found(&f) => {
                    self.forget(&id);
                    continue;
                }
                Err(f) => return Err(self.fail(&f, Call::other(&what))),
            };
            match op.status.as_ref() {
                None => out.push((s.vm, id, InstanceStatus::Pending)),
                Some(st) if st.code == 0 => self.forget(&id),
                Some(st) => {
                    let what = format!("create instance {id} in {region}");
                    let call = Call::named(CREATE, &what).in_region(region);
                    let e = self.fail(&errors::of_operation(st), call);
                    if let Some(s) = self
                        .started
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_mut(&id)
                    {
                        s.failed = Some(e.clone());
                    }
                    out.push((s.vm, id, InstanceStatus::Refused(Box::new(e))));
                }
            }
        }
        Ok(out)
    }

    pub(super) fn forget(&self, id: &str) {
        self.started
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }

    pub(super) fn remember(&self, id: &str, vm: &str, region: &str, op: &common::Operation) {
        if op.status.is_some() || id.is_empty() {
            return;
        }
        self.started
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                id.to_string(),
                Started {
                    vm: vm.to_string(),
                    region: region.to_string(),
                    operation: op.id.clone(),
                    failed: None,
                },
            );
    }
}
