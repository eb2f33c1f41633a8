//! `gpuprov offers`: ask the clouds' catalogs what they sell (instance types, regions,
//! prices), like `sky show-gpus` or `dstack offer`, without creating anything.

use super::error::{CmdResult, CommandError, Exit};
use std::fmt::Write as _;

use miette::{miette, Report};

use super::args::OffersArgs;
use super::project::Project;
use super::providers::clouds_in_this_build;
use super::view::json::OfferRow;
use crate::config::{Cloud, Config};
use crate::provider::{ErrorKind, Lineage, Offer, ResourceRequest};

/// What to ask and whom: the request, the clouds in order, and whether the list keeps
/// apply's order (`--vm`) or is sorted cheapest first.
struct Query {
    request: ResourceRequest,
    clouds: Vec<Cloud>,
    apply_order: bool,
}

fn parse_cloud(name: &str) -> Result<Cloud, Report> {
    let cloud: Cloud = serde_json::from_value(serde_json::Value::String(name.to_lowercase()))
        .map_err(|_| {
            miette!(
                help = format!("known clouds: {}", Cloud::known_names()),
                "--cloud {name}: unknown cloud"
            )
        })?;
    if !cloud.has_adapter() {
        return Err(miette!(
            help = format!("available clouds in this build: {}", clouds_in_this_build()),
            "--cloud {name}: no adapter for {cloud} in this build of gpuprov"
        ));
    }
    Ok(cloud)
}

fn query(a: &OffersArgs, config: Option<&Config>, project: &Project) -> Result<Query, Report> {
    if let Some(name) = &a.vm {
        let Some(config) = config else {
            return Err(miette!(
                "--vm {name}: no config at {}",
                project.config_path.display()
            ));
        };
        let vm = config.vms.get(name).ok_or_else(|| {
            miette!(
                help = format!(
                    "machines in {}: {}",
                    project.config_path.display(),
                    config.vms.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
                "--vm {name}: no [vm.{name}] in {}",
                project.config_path.display()
            )
        })?;
        return Ok(Query {
            request: vm.request(),
            clouds: vm.clouds.clone(),
            apply_order: true,
        });
    }
    if let Some(m) = a.max_price {
        if !(m.is_finite() && m > 0.0) {
            return Err(miette!(
                "--max-price {m}: expected a positive price in USD per hour"
            ));
        }
    }
    let clouds = if a.clouds.is_empty() {
        Cloud::in_this_build()
            .filter(|c| *c != Cloud::Docker)
            .collect()
    } else {
        let mut out = Vec::new();
        for name in &a.clouds {
            let c = parse_cloud(name)?;
            if !out.contains(&c) {
                out.push(c);
            }
        }
        out
    };
    Ok(Query {
        request: ResourceRequest {
            vm_name: "offers".into(),
            regions: a.regions.clone(),
            zones: Vec::new(),
            gpu: a.gpu.clone(),
            // No count asked means any count (adapters read 0 as "any").
            gpu_count: a.gpu_count.or(a.min_gpu_count).unwrap_or(0),
            spot: a.spot,
            max_price_per_hour: a.max_price,
            gpu_count_at_least: a.min_gpu_count.is_some(),
        },
        clouds,
        apply_order: false,
    })
}

/// Runs `gpuprov offers`. The config is optional (its `[cloud.NAME]` settings, such as
/// endpoints, apply when it exists) except with `--vm`. Every cloud is asked at once;
/// a cloud that fails is reported on stderr and the others still answer. Exits 1 when
/// no cloud answered.
pub(super) async fn cmd_offers(project: &Project, a: &OffersArgs) -> CmdResult {
    let config = if a.vm.is_some() || project.config_path.exists() {
        Some(project.load_config()?)
    } else {
        None
    };
    let q = query(a, config.as_ref(), project)?;
    let lookups = q.clouds.iter().filter_map(|&cloud| {
        let none = crate::config::CloudTables::default();
        let tables = config.as_ref().map_or(&none, |c| &c.clouds);
        // Catalog lookups create nothing and there may be no state: a throwaway lineage.
        let provider = cloud.build(tables, Lineage::random())?;
        let req = q.request.clone();
        Some(async move {
            let mut answer = provider.plan(&req).await;
            if let Ok(found) = &mut answer {
                crate::provider::offers::order(found, &req, &provider.capabilities());
            }
            (cloud, answer)
        })
    });
    let answers = futures_util::future::join_all(lookups).await;

    let mut offers: Vec<Offer> = Vec::new();
    let mut answered = 0;
    for (cloud, result) in answers {
        match result {
            Ok(found) => {
                answered += 1;
                // A cloud whose offers come from a built-in catalog says so (its offers'
                // `detail.catalog_note`), once.
                if let Some(note) = found
                    .iter()
                    .find_map(|o| o.detail.get("catalog_note").and_then(|n| n.as_str()))
                {
                    errln!("note: {cloud}: {note}");
                }
                offers.extend(found.into_iter().filter(|o| {
                    q.request
                        .max_price_per_hour
                        .is_none_or(|m| o.price_per_hour <= m)
                }));
            }
            Err(e) if e.kind == ErrorKind::InvalidRequest => {
                answered += 1;
                errln!("note: {cloud}: {}", e.text());
            }
            Err(e) => errln!("warning: {cloud}: {}", e.text()),
        }
    }
    if !q.apply_order {
        offers.sort_by(|x, y| {
            x.price_per_hour
                .total_cmp(&y.price_per_hour)
                .then_with(|| x.id.cmp(&y.id))
        });
    }
    if let Some(n) = a.limit {
        offers.truncate(n);
    }

    if a.json {
        let rows: Vec<OfferRow> = offers.iter().map(OfferRow::from).collect();
        outln!(
            "{}",
            serde_json::to_string_pretty(&rows).map_err(CommandError::internal)?
        );
    } else if offers.is_empty() {
        outln!("No offers match.");
    } else {
        out!("{}", render_table(&offers));
        for line in catalog_ages(&offers) {
            errln!("note: {line}");
        }
    }
    Ok(if answered == 0 {
        Exit::Failure
    } else {
        Exit::Success
    })
}

/// A plain-text table, one offer per line, columns padded to their widest cell; numbers
/// right-aligned. A price the cloud does not quote for spot (shown at on demand) is
/// marked `<=`; unknown sizes are `-`.
fn render_table(offers: &[Offer]) -> String {
    const HEADER: [&str; 12] = [
        "CLOUD",
        "REGION",
        "ZONE",
        "TYPE",
        "GPU",
        "GPUS",
        "VCPUS",
        "MEM GIB",
        "DISK GIB",
        "SPOT",
        "USD/H",
        "USD/GPU-H",
    ];
    // Columns from GPUS on are numbers (SPOT is short either way).
    const RIGHT_FROM: usize = 5;
    let dash = || "-".to_string();
    let rows: Vec<[String; 12]> = offers
        .iter()
        .map(|o| {
            let bound = if o.facts.spot_price_is_upper_bound {
                "<="
            } else {
                ""
            };
            [
                o.location.cloud.clone(),
                o.location.region.clone(),
                o.location.zone.clone().unwrap_or_else(dash),
                o.instance_type.clone(),
                o.gpu.clone().unwrap_or_else(dash),
                o.gpu_count.to_string(),
                o.facts.vcpus.map(|v| v.to_string()).unwrap_or_else(dash),
                o.facts
                    .memory_gib
                    .map(|m| format!("{m:.0}"))
                    .unwrap_or_else(dash),
                o.facts.disk_gib.map(|d| d.to_string()).unwrap_or_else(dash),
                if o.spot { "yes" } else { "no" }.into(),
                format!("{bound}{:.2}", o.price_per_hour),
                if o.gpu_count > 0 {
                    format!("{bound}{:.2}", o.price_per_hour / o.gpu_count as f64)
                } else {
                    dash()
                },
            ]
        })
        .collect();
    let mut widths = HEADER.map(str::len);
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let mut l = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i >= RIGHT_FROM {
                let _ = write!(l, "{cell:>w$}");
            } else {
                let _ = write!(l, "{cell:<w$}");
            }
            if i + 1 < cells.len() {
                l.push_str("  ");
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&HEADER);
    for r in &rows {
        line(&r.each_ref().map(String::as_str));
    }
    out
}

/// One line per cloud in `offers`: where its prices come from and how old they are
/// (gpuprov's built-in list and its date, or the cloud's API now), and whether some spot
/// prices are upper bounds.
fn catalog_ages(offers: &[Offer]) -> Vec<String> {
    let mut by_cloud: std::collections::BTreeMap<&str, (Option<&str>, bool)> =
        std::collections::BTreeMap::new();
    for o in offers {
        let e = by_cloud.entry(&o.location.cloud).or_insert((None, false));
        e.0 = e.0.or(o.facts.prices_as_of.as_deref());
        e.1 |= o.facts.spot_price_is_upper_bound;
    }
    by_cloud
        .into_iter()
        .map(|(cloud, (as_of, bound))| {
            let age = match as_of {
                Some(d) => format!("prices from gpuprov's built-in list as of {d}"),
                None => "prices and stock from its API now".to_string(),
            };
            let bound = if bound {
                "; spot prices marked <= are the on-demand price (no spot price published), an upper bound"
            } else {
                ""
            };
            format!("{cloud}: {age}{bound}")
        })
        .collect()
}
