//! The network half of `prepare`: the project's subnet, the image, and the per-VM security
//! group with its rules (reconciled to the rules gpuprov wants).

use super::*;

impl NebiusProvider {
    /// The subnet of `project` an instance's interface goes to: `(subnet id, network id)`.
    pub(super) async fn subnet(&self, project: &str) -> Result<(String, String)> {
        let what = format!("list subnets of {project}");
        let subnets = self
            .list_all(
                Service::Vpc,
                Call::named(PREPARE, &what),
                |page_token| vpc::ListSubnetsRequest {
                    parent_id: project.to_string(),
                    page_size: PAGE_SIZE,
                    page_token,
                },
                |c, r| async move {
                    vpc::subnet_service_client::SubnetServiceClient::new(c)
                        .list(r)
                        .await
                },
                |p: vpc::ListSubnetsResponse| (p.items, p.next_page_token),
            )
            .await?;
        let name = |s: &vpc::Subnet| {
            s.metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default()
        };
        let chosen = subnets
            .iter()
            .find(|s| name(s).starts_with("default"))
            .or_else(|| subnets.first())
            .ok_or_else(|| {
                invalid(format!(
                    "nebius: project {project} has no subnet: create a network in the console \
                     (every project gets a default one)"
                ))
            })?;
        let id = chosen
            .metadata
            .as_ref()
            .map(|m| m.id.clone())
            .unwrap_or_default();
        let network = chosen
            .spec
            .as_ref()
            .map(|s| s.network_id.clone())
            .unwrap_or_default();
        Ok((id, network))
    }

    /// The image id for `spec_image` (module docs).
    pub(super) async fn image(&self, spec_image: Option<&str>) -> Result<String> {
        let image = spec_image
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .unwrap_or(DEFAULT_IMAGE_FAMILY);
        if image.starts_with("computeimage-") {
            return Ok(image.to_string());
        }
        let req = compute::GetImageLatestByFamilyRequest {
            image_family: image.to_string(),
            parent_id: String::new(),
        };
        let found = self
            .call(Service::Compute, req, None, |c, r| async move {
                compute::image_service_client::ImageServiceClient::new(c)
                    .get_latest_by_family(r)
                    .await
            })
            .await;
        match found {
            Ok(img) => Ok(img.metadata.map(|m| m.id).unwrap_or_default()),
            Err(f) if is_not_found(&f) => Err(invalid(format!(
                "nebius: there is no image family {image} (set image to a public family such as \
                 {DEFAULT_IMAGE_FAMILY}, or an image id computeimage-…)"
            ))),
            Err(f) => Err(self.fail(
                &f,
                Call::named(PREPARE, &format!("read image family {image}")),
            )),
        }
    }

    /// The VM's security group in `project`, `None` when there is none.
    pub(super) async fn security_group(
        &self,
        project: &str,
        name: &str,
    ) -> Result<Option<vpc::SecurityGroup>> {
        let req = vpc::GetSecurityGroupByNameRequest {
            parent_id: project.to_string(),
            name: name.to_string(),
        };
        match self
            .call(Service::Vpc, req, None, |c, r| async move {
                vpc::security_group_service_client::SecurityGroupServiceClient::new(c)
                    .get_by_name(r)
                    .await
            })
            .await
        {
            Ok(g) => Ok(Some(g)),
            Err(f) if is_not_found(&f) => Ok(None),
            Err(f) => Err(self.fail(&f, Call::other(&format!("read security group {name}")))),
        }
    }

    /// The id an operation creates, or its failure when it already failed.
    pub(super) fn created_id(&self, op: &common::Operation, call: Call<'_>) -> Result<String> {
        if let Some(s) = op.status.as_ref().filter(|s| s.code != 0) {
            return Err(self.fail(&errors::of_operation(s), call));
        }
        Ok(op.resource_id.clone())
    }

    /// The VM's security group with its rules, made or fixed (module docs). Returns its id.
    pub(super) async fn ensure_security_group(
        &self,
        project: &str,
        network: &str,
        spec: &InstanceSpec,
    ) -> Result<String> {
        let lineage = &self.settings.lineage;
        let name = crate::provider::object_name(&spec.vm_name, lineage);
        let what = format!("create security group {name}");
        let id = match self.security_group(project, &name).await? {
            Some(g) => g.metadata.map(|m| m.id).unwrap_or_default(),
            None => {
                let req = vpc::CreateSecurityGroupRequest {
                    metadata: Some(common::ResourceMetadata {
                        parent_id: project.to_string(),
                        name: name.clone(),
                        labels: labels(&spec.vm_name, lineage),
                        ..Default::default()
                    }),
                    spec: Some(vpc::SecurityGroupSpec {
                        network_id: network.to_string(),
                    }),
                };
                let sent = self
                    .call(Service::Vpc, req, None, |c, r| async move {
                        vpc::security_group_service_client::SecurityGroupServiceClient::new(c)
                            .create(r)
                            .await
                    })
                    .await;
                match sent {
                    Ok(op) => self.created_id(&op, Call::named(PREPARE, &what))?,
                    // A concurrent run made it.
                    Err(f) if is_already_there(&f) => self
                        .security_group(project, &name)
                        .await?
                        .and_then(|g| g.metadata.map(|m| m.id))
                        .unwrap_or_default(),
                    Err(f) => return Err(self.fail(&f, Call::named(PREPARE, &what))),
                }
            }
        };
        let ports: Vec<i32> = kit::ports::with_ssh(&spec.ports)
            .into_iter()
            .map(i32::from)
            .collect();
        let ingress = format!(
            "ingress-{}",
            ports
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join("-")
        );
        let rules = self.rules(&id).await?;
        let mut have_ingress = false;
        let mut have_egress = false;
        for r in &rules {
            let (rid, rname) = r
                .metadata
                .as_ref()
                .map(|m| (m.id.clone(), m.name.clone()))
                .unwrap_or_default();
            if rname == ingress {
                have_ingress = true;
            } else if rname == "egress-all" {
                have_egress = true;
            } else if rname.starts_with("ingress-") {
                self.delete_rule(&rid, &rname).await?;
            }
        }
        if !have_ingress {
            self.create_rule(
                &id,
                &ingress,
                vpc::SecurityRuleSpec {
                    access: vpc::RuleAccessAction::Allow as i32,
                    protocol: vpc::RuleProtocol::Tcp as i32,
                    r#match: Some(vpc::security_rule_spec::Match::Ingress(vpc::RuleIngress {
                        source_cidrs: vec!["0.0.0.0/0".into()],
                        destination_ports: ports,
                        ..Default::default()
                    })),
                    ..Default::default()
                },
                spec,
            )
            .await?;
        }
        if !have_egress {
            self.create_rule(
                &id,
                "egress-all",
                vpc::SecurityRuleSpec {
                    access: vpc::RuleAccessAction::Allow as i32,
                    protocol: vpc::RuleProtocol::Any as i32,
                    r#match: Some(vpc::security_rule_spec::Match::Egress(vpc::RuleEgress {
                        destination_cidrs: vec!["0.0.0.0/0".into()],
                        ..Default::default()
                    })),
                    ..Default::default()
                },
                spec,
            )
            .await?;
        }
        Ok(id)
    }

    pub(super) async fn rules(&self, group: &str) -> Result<Vec<vpc::SecurityRule>> {
        let what = format!("list rules of security group {group}");
        self.list_all(
            Service::Vpc,
            Call::named(PREPARE, &what),
            |page_token| vpc::ListSecurityRulesRequest {
                parent_id: group.to_string(),
                page_size: PAGE_SIZE,
                page_token,
            },
            |c, r| async move {
                vpc::security_rule_service_client::SecurityRuleServiceClient::new(c)
                    .list(r)
                    .await
            },
            |p: vpc::ListSecurityRulesResponse| (p.items, p.next_page_token),
        )
        .await
    }

    pub(super) async fn create_rule(
        &self,
        group: &str,
        name: &str,
        rule: vpc::SecurityRuleSpec,
        spec: &InstanceSpec,
    ) -> Result<()> {
        let req = vpc::CreateSecurityRuleRequest {
            metadata: Some(common::ResourceMetadata {
                parent_id: group.to_string(),
                name: name.to_string(),
                labels: labels(&spec.vm_name, &self.settings.lineage),
                ..Default::default()
            }),
            spec: Some(rule),
        };
        let what = format!("create security rule {name}");
        match self
            .call(Service::Vpc, req, None, |c, r| async move {
                vpc::security_rule_service_client::SecurityRuleServiceClient::new(c)
                    .create(r)
                    .await
            })
            .await
        {
            Ok(op) => self
                .created_id(&op, Call::named(PREPARE, &what))
                .map(|_| ()),
            Err(f) if is_already_there(&f) => Ok(()),
            Err(f) => Err(self.fail(&f, Call::named(PREPARE, &what))),
        }
    }

    pub(super) async fn delete_rule(&self, id: &str, name: &str) -> Result<()> {
        let req = vpc::DeleteSecurityRuleRequest { id: id.to_string() };
        match self
            .call(Service::Vpc, req, None, |c, r| async move {
                vpc::security_rule_service_client::SecurityRuleServiceClient::new(c)
                    .delete(r)
                    .await
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(f) if is_not_found(&f) => Ok(()),
            Err(f) => Err(self.fail(
                &f,
                Call::named(PREPARE, &format!("replace security rule {name}")),
            )),
        }
    }
}
