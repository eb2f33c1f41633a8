//! `gpuprov sweep`: lists every instance carrying gpuprov's identity labels in the
//! config's clouds and regions that no state here knows (another lineage's, or this
//! lineage's forgotten by `state rm` or a lost fold), grouped by lineage with age and
//! price. With `--destroy LINEAGE` it tears that lineage's down through the teardown
//! machine (delete, wait until gone, then the per-VM side resources). Read-only by default.
//!
//! The teardown is not journalled in the state: nothing of it is the state's, and what a
//! crash leaves is listed again by the next sweep.

use std::collections::BTreeMap;
use std::sync::Arc;

use miette::miette;
use serde::Serialize;

use crate::machine::{CancelToken, Executor, MemoryJournal};
use crate::plan::discovery::{self, FoundInstance};
use crate::provider::Lineage;
use crate::vm::{Owned, Target, TeardownMachine, TeardownState};

use super::args::{Cli, SweepArgs};
use super::error::{CmdResult, CommandError, Exit};
use super::preflight::preflight;
use super::project::{confirm, lineage_of, Project};
use super::providers::{add_recorded_clouds, build_providers, recorded_clouds};

/// `sweep --json`: the unknown instances by lineage.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct SweepJson {
    pub lineages: Vec<SweepLineage>,
    /// Locations that could not be listed, with why: what is there is unknown.
    pub unlisted: Vec<(String, String)>,
}

/// One lineage's instances that no state here knows.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct SweepLineage {
    pub lineage: String,
    /// Whether it is this state's lineage (instances it forgot or never folded).
    pub this_state: bool,
    /// Sum of the known prices, USD per hour.
    pub price_per_hour: f64,
    pub instances: Vec<FoundInstance>,
}

pub(super) async fn run(cli: &Cli, project: &Project, a: &SweepArgs) -> CmdResult {
    // A malformed --destroy is refused before any cloud is asked.
    let target = a
        .destroy
        .as_deref()
        .map(|t| {
            Lineage::parse(t).map_err(|e| {
                miette!(
                    code = "gpuprov::sweep::lineage",
                    help = "`gpuprov sweep` lists the lineages found",
                    "--destroy: {}",
                    e.text()
                )
            })
        })
        .transpose()?;
    let config = project.load_config()?;
    let (_store, state) = project.open_state()?;
    let lineage = lineage_of(&state)?;
    let mut providers = build_providers(&config, &lineage);
    let pre = preflight(&config, &providers).await?;
    // The state's locations are listed too: their clouds need their adapters.
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let clouds = recorded_clouds(&state, &crate::plan::ReadAhead::of(&state, cores));
    add_recorded_clouds(&mut providers, Some(&config), clouds, &lineage);
    let offered: Vec<_> = pre.offers.values().flatten().cloned().collect();
    let locations = discovery::locations(offered.iter().map(|o| o.location.clone()), &state);
    let found = discovery::discover(&locations, &providers).await;
    let known = discovery::known_ids(&state);
    let mut by_lineage: BTreeMap<String, Vec<FoundInstance>> = BTreeMap::new();
    for f in &found.listed {
        if f.lineage == state.lineage && known.contains(&f.instance_id) {
            continue;
        }
        let mut f = f.clone();
        // A price the listing lacks is the catalog's for that type and region.
        if f.price_per_hour.is_none() {
            f.price_per_hour = offered
                .iter()
                .find(|o| {
                    Some(&o.instance_type) == f.instance_type.as_ref()
                        && o.location.cloud == f.cloud
                        && o.location.region == f.region
                })
                .map(|o| o.price_per_hour);
        }
        by_lineage.entry(f.lineage.clone()).or_default().push(f);
    }
    let listing = SweepJson {
        lineages: by_lineage
            .into_iter()
            .map(|(l, instances)| SweepLineage {
                this_state: l == state.lineage,
                price_per_hour: instances.iter().filter_map(|f| f.price_per_hour).sum(),
                lineage: l,
                instances,
            })
            .collect(),
        unlisted: found.unlisted.clone(),
    };
    let Some(target) = target else {
        if a.json {
            outln!(
                "{}",
                serde_json::to_string_pretty(&listing).map_err(CommandError::internal)?
            );
        } else {
            render(&listing, &locations);
        }
        return Ok(Exit::Success);
    };
    let Some(group) = listing.lineages.iter().find(|l| target == l.lineage) else {
        return Err(miette!(
            code = "gpuprov::sweep::nothing_found",
            help = "`gpuprov sweep` lists the lineages found in this config's clouds and regions",
            "no unknown instance of lineage {target} was found"
        )
        .into());
    };
    render(
        &SweepJson {
            lineages: vec![SweepLineage {
                lineage: group.lineage.clone(),
                this_state: group.this_state,
                price_per_hour: group.price_per_hour,
                instances: group.instances.clone(),
            }],
            unlisted: listing.unlisted.clone(),
        },
        &locations,
    );
    outln!(
        "\nsweep will destroy these {} instance(s) and their side resources.",
        group.instances.len()
    );
    if !confirm(cli, "sweep --destroy", a.auto_approve)? {
        errln!("Sweep cancelled.");
        return Ok(Exit::Failure);
    }
    // The adapters carry the swept lineage: cleanup names its side resources.
    let mut providers = build_providers(&config, &target);
    let clouds = group.instances.iter().map(|f| f.at().cloud);
    add_recorded_clouds(&mut providers, Some(&config), clouds, &target);
    let cancel = CancelToken::new();
    super::run::spawn_signal_handler(cancel.clone());
    let executor = Executor::new(Arc::new(MemoryJournal::new()), cancel);
    let mut failed = 0;
    for f in &group.instances {
        let m = TeardownMachine::new(providers.clone());
        let owned = Owned::at(f.at(), vec![f.instance_id.clone()]);
        let target = Target::of(owned, &f.vm);
        let key = format!("sweep/{}/{}", f.vm, f.instance_id);
        let result = executor
            .run(&m, &key, move |_| TeardownState::Requesting { target })
            .await;
        match result {
            Ok(TeardownState::Done) => outln!("vm.{} {}: destroyed", f.vm, f.instance_id),
            Ok(other) => {
                failed += 1;
                errln!(
                    "vm.{} {}: not confirmed gone ({other:?}); run sweep again",
                    f.vm,
                    f.instance_id
                );
            }
            Err(e) => {
                failed += 1;
                errln!("vm.{} {}: {e}", f.vm, f.instance_id);
            }
        }
    }
    if failed > 0 {
        return Err(miette!(
            code = "gpuprov::sweep::failed",
            help = "run `gpuprov sweep` to see what is left",
            "{failed} instance(s) of lineage {target} could not be confirmed gone"
        )
        .into());
    }
    Ok(Exit::Success)
}

fn render(listing: &SweepJson, locations: &[crate::provider::Location]) {
    for (at, why) in &listing.unlisted {
        errln!("note: could not list {at}: {why}");
    }
    if listing.lineages.is_empty() {
        outln!(
            "No unknown gpuprov instances in {}.",
            if locations.is_empty() {
                "any location (this config has no offers: check credentials)".to_string()
            } else {
                locations
                    .iter()
                    .map(|l| l.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
        return;
    }
    let now = chrono::Utc::now();
    for l in &listing.lineages {
        outln!(
            "lineage {}{}: {} instance(s), ${:.2}/h",
            l.lineage,
            if l.this_state {
                " (this state's, not recorded)"
            } else {
                ""
            },
            l.instances.len(),
            l.price_per_hour
        );
        for f in &l.instances {
            let age = f
                .created_at
                .map(|t| age(now - t))
                .unwrap_or_else(|| "?".into());
            let price = f
                .price_per_hour
                .map(|p| format!("${p:.2}/h"))
                .unwrap_or_else(|| "?".into());
            outln!(
                "  vm.{:<16} {:<24} {:<14} {:<9} {:>8} {:>9}  {}",
                f.vm,
                f.location,
                short_id(&f.instance_id),
                f.status,
                age,
                price,
                f.instance_type.as_deref().unwrap_or("")
            );
        }
    }
    outln!("\nTear a lineage down with: gpuprov sweep --destroy LINEAGE");
}

/// Docker's 64-hex container ids shortened as `docker ps` does; others as they are.
fn short_id(id: &str) -> &str {
    if id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        &id[..12]
    } else {
        id
    }
}

/// `2d 03h`, `5h 12m`, `42m`.
fn age(d: chrono::Duration) -> String {
    let m = d.num_minutes().max(0);
    match (m / 1440, (m / 60) % 24, m % 60) {
        (0, 0, m) => format!("{m}m"),
        (0, h, m) => format!("{h}h {m:02}m"),
        (d, h, _) => format!("{d}d {h:02}h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_and_ids_read_as_docker_ps() {
        assert_eq!(age(chrono::Duration::minutes(42)), "42m");
        assert_eq!(age(chrono::Duration::minutes(5 * 60 + 12)), "5h 12m");
        assert_eq!(age(chrono::Duration::minutes(2 * 1440 + 3 * 60)), "2d 03h");
        assert_eq!(short_id(&"a".repeat(64)), "aaaaaaaaaaaa");
        assert_eq!(short_id("i-0abc"), "i-0abc");
    }
}
