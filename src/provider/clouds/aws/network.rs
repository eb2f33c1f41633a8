//! The network and image half of `prepare`: the zones offering the type, the default
//! VPC's subnets in them, the image, and the per-VM security group.

use super::*;

impl AwsProvider {
    /// The zones of the offer's region that offer its type (`DescribeInstanceTypes`,
    /// `DescribeInstanceTypeOfferings`), narrowed to the offer's `zones` detail and to its
    /// own zone when it has one, sorted.
    ///
    /// Errors: the type unknown to the region or offered in no (requested) zone →
    /// `Unavailable` for the type in the region; not offered in the offer's zone →
    /// `Unavailable` for that offer; API errors per the table.
    pub(super) async fn zones_offering(
        &self,
        client: &Client,
        offer: &Offer,
    ) -> Result<Vec<String>> {
        let region = &offer.location.region;
        let itype = InstanceType::from(offer.instance_type.as_str());

        match client
            .describe_instance_types()
            .instance_types(itype.clone())
            .send()
            .await
        {
            Ok(o) if !o.instance_types().is_empty() => {}
            Ok(_) => {
                return Err(Self::unavailable_type(
                    offer,
                    format!("{} is not known in {region}", offer.instance_type),
                ))
            }
            Err(e) if e.code() == Some("InvalidInstanceType") => {
                return Err(Self::unavailable_type(
                    offer,
                    format!("{} is not known in {region}", offer.instance_type),
                ))
            }
            Err(e) => return Err(self.err("DescribeInstanceTypes", region, &e, Some(offer))),
        }

        let offerings = client
            .describe_instance_type_offerings()
            .location_type(LocationType::AvailabilityZone)
            .filters(filter("instance-type", &[&offer.instance_type]))
            .send()
            .await
            .map_err(|e| self.err("DescribeInstanceTypeOfferings", region, &e, Some(offer)))?;
        let wanted: Vec<String> = offer
            .detail
            .get("zones")
            .and_then(|z| serde_json::from_value(z.clone()).ok())
            .unwrap_or_default();
        let mut zones: Vec<String> = offerings
            .instance_type_offerings()
            .iter()
            .filter_map(|o| o.location().map(str::to_string))
            .filter(|z| wanted.is_empty() || wanted.contains(z))
            .collect();
        zones.sort();
        zones.dedup();
        if zones.is_empty() {
            return Err(Self::unavailable_type(
                offer,
                format!(
                    "no zone of {region} offers {}{}",
                    offer.instance_type,
                    if wanted.is_empty() {
                        String::new()
                    } else {
                        format!(" (among {})", wanted.join(", "))
                    }
                ),
            ));
        }
        // A zone offer: only its zone. Not offered there → only this offer is blocked
        // (the core goes on with the other zones).
        if let Some(zone) = offer.location.zone.as_deref() {
            if !zones.iter().any(|z| z == zone) {
                return Err(ProviderError::new(
                    ErrorKind::Unavailable,
                    format!(
                        "{zone} does not offer {} (zones of {region} that do: {})",
                        offer.instance_type,
                        zones.join(", ")
                    ),
                ));
            }
            zones = vec![zone.to_string()];
        }
        Ok(zones)
    }

    /// The default VPC's subnets in `zones` (`DescribeSubnets` with `default-for-az`), by
    /// zone, and the VPC they are in. Errors: none → `Unavailable` for the offer's zone, or
    /// for the type in the region; API errors per the table.
    pub(super) async fn default_subnets(
        &self,
        client: &Client,
        offer: &Offer,
        zones: &[String],
    ) -> Result<(String, Vec<PreparedSubnet>)> {
        let region = &offer.location.region;
        let zone_refs: Vec<&str> = zones.iter().map(String::as_str).collect();
        let subnets_out = client
            .describe_subnets()
            .filters(filter("default-for-az", &["true"]))
            .filters(filter("availability-zone", &zone_refs))
            .send()
            .await
            .map_err(|e| self.err("DescribeSubnets", region, &e, Some(offer)))?;
        let mut subnets: Vec<(PreparedSubnet, String)> = subnets_out
            .subnets()
            .iter()
            .filter_map(|s| {
                Some((
                    PreparedSubnet {
                        id: s.subnet_id()?.to_string(),
                        zone: s.availability_zone()?.to_string(),
                    },
                    s.vpc_id()?.to_string(),
                ))
            })
            .collect();
        subnets.sort_by(|a, b| a.0.zone.cmp(&b.0.zone));
        let Some(vpc) = subnets.first().map(|s| s.1.clone()) else {
            if let Some(zone) = offer.location.zone.as_deref() {
                return Err(ProviderError::new(
                    ErrorKind::Unavailable,
                    format!(
                        "{zone} has no default-VPC subnet; create one \
                         (`aws ec2 create-default-subnet --availability-zone {zone}`)"
                    ),
                ));
            }
            return Err(ProviderError::new(
                ErrorKind::Unavailable,
                format!(
                    "{region} has no default-VPC subnet in the zones offering {} ({}); \
                     create the default VPC (`aws ec2 create-default-vpc`)",
                    offer.instance_type,
                    zones.join(", ")
                ),
            )
            .with_block(crate::provider::BlockScope::InstanceTypeInRegion {
                cloud: CLOUD.into(),
                region: region.clone(),
                instance_type: offer.instance_type.clone(),
            }));
        };
        let subnets: Vec<PreparedSubnet> = subnets
            .into_iter()
            .filter(|s| s.1 == vpc)
            .map(|s| s.0)
            .collect();
        Ok((vpc, subnets))
    }

    pub(super) async fn resolve_image(
        &self,
        client: &Client,
        offer: &Offer,
        spec: &InstanceSpec,
    ) -> Result<(String, Option<String>)> {
        let region = &offer.location.region;
        let newest = |imgs: &[aws_sdk_ec2::types::Image]| {
            imgs.iter()
                .filter(|i| i.image_id().is_some())
                .max_by(|a, b| a.creation_date().cmp(&b.creation_date()))
                .map(|i| {
                    (
                        i.image_id().unwrap_or_default().to_string(),
                        i.root_device_name().map(str::to_string),
                    )
                })
        };
        if let Some(image) = spec.image.as_deref().filter(|s| !s.trim().is_empty()) {
            let req = client.describe_images();
            let req = if image.starts_with("ami-") {
                req.image_ids(image)
            } else {
                req.filters(filter("name", &[image]))
                    .filters(filter("state", &["available"]))
            };
            let out = match req.send().await {
                Ok(o) => o,
                Err(e) if e.code().is_some_and(|c| c.starts_with("InvalidAMIID.")) => {
                    return Err(ProviderError::new(
                        ErrorKind::InvalidRequest,
                        format!("image {image} does not exist in {region}"),
                    ))
                }
                Err(e) => return Err(self.err("DescribeImages", region, &e, Some(offer))),
            };
            return newest(out.images()).ok_or_else(|| {
                ProviderError::new(
                    ErrorKind::InvalidRequest,
                    format!("image {image} matches no available image in {region}"),
                )
            });
        }
        for (owner, name) in [(DLAMI_OWNER, DLAMI_NAME), (UBUNTU_OWNER, UBUNTU_NAME)] {
            let out = client
                .describe_images()
                .owners(owner)
                .filters(filter("name", &[name]))
                .filters(filter("state", &["available"]))
                .filters(filter("architecture", &["x86_64"]))
                .send()
                .await
                .map_err(|e| self.err("DescribeImages", region, &e, Some(offer)))?;
            if let Some(found) = newest(out.images()) {
                return Ok(found);
            }
        }
        Err(ProviderError::new(
            ErrorKind::Unavailable,
            format!(
                "no Deep Learning Ubuntu or Ubuntu 22.04 image in {region}; set `image` to an AMI id"
            ),
        )
        .with_block(crate::provider::BlockScope::Region {
            cloud: CLOUD.into(),
            region: region.clone(),
        }))
    }

    pub(super) async fn ensure_security_group(
        &self,
        client: &Client,
        offer: &Offer,
        spec: &InstanceSpec,
        vpc: &str,
    ) -> Result<String> {
        let region = &offer.location.region;
        let name = Self::security_group_name(&spec.vm_name, &spec.lineage);
        let find = || async {
            client
                .describe_security_groups()
                .filters(filter("group-name", &[&name]))
                .filters(filter("vpc-id", &[vpc]))
                .send()
                .await
                .map_err(|e| self.err("DescribeSecurityGroups", region, &e, Some(offer)))
                .map(|o| o.security_groups().first().cloned())
        };
        let group = match find().await? {
            Some(g) => {
                let has = |k: &str, v: &str| {
                    g.tags()
                        .iter()
                        .any(|t| t.key() == Some(k) && t.value() == Some(v))
                };
                if !has(IDENTITY_LABEL, &spec.vm_name) || !has(LINEAGE_LABEL, &spec.lineage) {
                    return Err(ProviderError::new(
                        ErrorKind::InvalidRequest,
                        format!(
                            "security group {name} in {vpc} exists but is not tagged \
                             {IDENTITY_LABEL}={} / {LINEAGE_LABEL}={}; delete it or rename the VM",
                            spec.vm_name, spec.lineage
                        ),
                    ));
                }
                g.group_id().unwrap_or_default().to_string()
            }
            None => {
                let tags = TagSpecification::builder()
                    .resource_type(ResourceType::SecurityGroup)
                    .tags(tag(IDENTITY_LABEL, &spec.vm_name))
                    .tags(tag(LINEAGE_LABEL, &spec.lineage))
                    .tags(tag("Name", &name))
                    .build();
                match client
                    .create_security_group()
                    .group_name(&name)
                    .description(format!("gpuprov VM {} (SSH and its ports)", spec.vm_name))
                    .vpc_id(vpc)
                    .tag_specifications(tags)
                    .send()
                    .await
                {
                    Ok(o) => o.group_id().unwrap_or_default().to_string(),
                    // Created concurrently (or by a crashed run): take it.
                    Err(e) if e.code() == Some("InvalidGroup.Duplicate") => find()
                        .await?
                        .and_then(|g| g.group_id().map(str::to_string))
                        .ok_or_else(|| {
                            ProviderError::transient(format!("security group {name} vanished"))
                        })?,
                    Err(e) => return Err(self.err("CreateSecurityGroup", region, &e, Some(offer))),
                }
            }
        };
        let mut ports: Vec<u16> = vec![22];
        ports.extend(spec.ports.iter().copied());
        ports.sort_unstable();
        ports.dedup();
        let mut req = client.authorize_security_group_ingress().group_id(&group);
        for p in ports {
            req = req.ip_permissions(
                IpPermission::builder()
                    .ip_protocol("tcp")
                    .from_port(i32::from(p))
                    .to_port(i32::from(p))
                    .ip_ranges(IpRange::builder().cidr_ip("0.0.0.0/0").build())
                    .build(),
            );
        }
        match req.send().await {
            Ok(_) => {}
            // Rules already there (a repeated prepare).
            Err(e) if e.code() == Some("InvalidPermission.Duplicate") => {}
            Err(e) => {
                return Err(self.err("AuthorizeSecurityGroupIngress", region, &e, Some(offer)))
            }
        }
        Ok(group)
    }
}
