//! The catalog calls behind `plan`: the platforms of a project and the offers of a
//! region (its platforms' presets priced by the catalog).

use super::*;

impl NebiusProvider {
    /// The platforms `project` lists.
    pub(super) async fn platforms(&self, project: &str) -> Result<Vec<compute::Platform>> {
        let what = format!("list platforms of {project}");
        self.list_all(
            Service::Compute,
            Call::other(&what),
            |page_token| compute::ListPlatformsRequest {
                parent_id: project.to_string(),
                page_size: PAGE_SIZE,
                page_token,
            },
            |c, r| async move {
                compute::platform_service_client::PlatformServiceClient::new(c)
                    .list(r)
                    .await
            },
            |p: compute::ListPlatformsResponse| (p.items, p.next_page_token),
        )
        .await
    }

    /// The offers of `region` for `req` (module docs).
    pub(super) async fn region_offers(
        &self,
        req: &ResourceRequest,
        region: &str,
        platforms: &[&'static catalog::Platform],
    ) -> Result<Vec<Offer>> {
        let live_project = self.tokens.as_ref().and(self.settings.projects.get(region));
        // (platform, preset, gpus) that fit.
        let mut fit: Vec<(&'static catalog::Platform, String, u32)> = Vec::new();
        match live_project {
            Some(project) => {
                for p in self.platforms(project).await? {
                    let name = p.metadata.as_ref().map(|m| m.name.as_str()).unwrap_or("");
                    let Some(known) = platforms.iter().find(|k| k.name == name) else {
                        continue;
                    };
                    let preemptible = p
                        .status
                        .as_ref()
                        .is_some_and(|s| s.allowed_for_preemptibles);
                    if req.spot && !preemptible {
                        continue;
                    }
                    for preset in p.spec.iter().flat_map(|s| s.presets.iter()) {
                        let gpus = preset
                            .resources
                            .as_ref()
                            .map(|r| r.gpu_count.max(0) as u32)
                            .unwrap_or(0);
                        if kit::gpu::count_fits(req, gpus) {
                            fit.push((known, preset.name.clone(), gpus));
                        }
                    }
                }
            }
            None => {
                for p in platforms.iter().filter(|p| p.regions.contains(&region)) {
                    for preset in p.presets {
                        let gpus = catalog::preset_gpus(preset).unwrap_or(0);
                        if kit::gpu::count_fits(req, gpus) {
                            fit.push((p, preset.to_string(), gpus));
                        }
                    }
                }
            }
        }
        let note = catalog::catalog_note(live_project.is_some());
        Ok(fit
            .into_iter()
            .map(|(p, preset, gpus)| {
                let instance_type = format!("{}/{preset}", p.name);
                let mut o =
                    kit::offer::on_demand(CLOUD, region, &instance_type, p.price(gpus, req.spot));
                if req.spot {
                    o.id.push_str("/preemptible");
                }
                o.spot = req.spot;
                o.gpu = Some(p.gpu.to_string());
                o.gpu_count = gpus;
                o.facts = kit::offer::facts_of_price_list(
                    catalog::PRICES_AS_OF,
                    req.spot && p.preemptible_per_gpu_hour.is_none(),
                );
                (o.facts.vcpus, o.facts.memory_gib) = catalog::preset_size(&preset);
                o.detail = json!({
                    "platform": p.name,
                    "preset": preset,
                    "catalog_note": note,
                });
                o
            })
            .collect())
    }
}
