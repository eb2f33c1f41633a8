//! The catalog lookups before a plan: one `plan` call per machine and usable cloud,
//! which reject what cannot work before anything runs and give the offers (and, for a
//! machine with none, each cloud's reason) that the plan shows.

use std::collections::BTreeMap;

use miette::{Diagnostic, Report};

use super::providers::clouds_in_this_build;
use crate::config::Config;
use crate::machine::Providers;
use crate::plan::{Effective, NoOffer, NoOfferReason, Plan};
use crate::provider::{Capabilities, ErrorKind, Feature, Offer};

/// What the catalog lookups found.
pub(super) struct Preflight {
    /// Notes to show on stderr (a cloud that answered with an error while another had
    /// offers, k3s skipped where a cloud cannot host it).
    pub notes: Vec<String>,
    /// Per machine, the matching offers in the order the launch machine tries them.
    pub offers: BTreeMap<String, Vec<Offer>>,
    /// Per machine without a single offer, each cloud's reason, in the machine's order.
    pub no_offers: BTreeMap<String, Vec<NoOffer>>,
    /// Per machine, the attributes whose effective value differs from the config's
    /// (`kubernetes` where its clouds cannot host k3s), shown in the plan.
    pub effective: BTreeMap<String, BTreeMap<String, Effective>>,
}

/// An error naming every machine `plan` would create (or replace) although no cloud
/// offers anything for it, with each cloud's reason; `None` when there is none. A
/// machine that is up (or only resumed) needs no offer, and one that waits for capacity
/// (`retry_until_up`, or every machine with `apply --retry-until-up`: `retry_all`) is not
/// blocked by a market condition (nothing in stock that matches, everything above the
/// max price), only by what waiting cannot fix (credentials, an API error, no adapter).
pub(super) fn no_offers_error(plan: &Plan, retry_all: bool) -> Option<Report> {
    let machines: BTreeMap<String, Vec<NoOffer>> = plan
        .changes
        .iter()
        .filter(|c| c.needs_offer() && !c.no_offers.is_empty())
        .filter(|c| !(c.waits_for_offers(retry_all)))
        .map(|c| (c.vm.clone(), c.no_offers.clone()))
        .collect();
    (!machines.is_empty()).then(|| Report::new(NoOffersError { machines }))
}

/// Machines that no cloud offers anything for: `apply` could not create them.
#[derive(Debug, thiserror::Error, Diagnostic)]
#[error("{}", no_offers_message(machines))]
#[diagnostic(
    code(gpuprov::plan::no_offers),
    help(
        "fix the cause shown for a cloud (credentials, the ask, max_price_per_hour), or pass --allow-no-offers to plan anyway (apply then fails over and ends Exhausted for this machine)"
    )
)]
struct NoOffersError {
    machines: BTreeMap<String, Vec<NoOffer>>,
}

fn no_offers_message(machines: &BTreeMap<String, Vec<NoOffer>>) -> String {
    let names: Vec<String> = machines.keys().map(|m| format!("vm.{m}")).collect();
    let mut s = format!(
        "no offers for {}: apply could not create {}",
        names.join(", "),
        if names.len() == 1 { "it" } else { "them" }
    );
    let width = machines
        .values()
        .flatten()
        .map(|n| n.cloud.len())
        .max()
        .unwrap_or(0);
    for (vm, why) in machines {
        s.push_str(&format!("\nvm.{vm}:"));
        for n in why {
            s.push_str(&format!(
                "\n  {:width$}  {}: {}",
                n.cloud,
                n.reason.as_str(),
                n.detail
            ));
        }
    }
    s
}

/// Rejects what cannot work before anything runs, with one catalog lookup per machine and
/// usable cloud: machines with no cloud adapter in this build, asks every usable cloud
/// rejects (`InvalidRequest`, for example a GPU on the Docker cloud), `zones` on clouds
/// without zones ([`Feature::Zones`]), and an explicit `kubernetes = true` on clouds that
/// cannot host k3s. The same lookups give the offers
/// the plan shows and, for a machine without any, each cloud's reason
/// ([`Preflight::no_offers`]; the caller decides whether that is an error).
///
/// The catalogs are asked without the machine's `max_price_per_hour`, which is applied
/// here as the launch machine applies it, so "everything is above the price" is told
/// apart from "nothing matches".
pub(super) async fn preflight(config: &Config, providers: &Providers) -> Result<Preflight, Report> {
    let mut notes = Vec::new();
    let mut k3s_skipped: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut offers: BTreeMap<String, Vec<Offer>> = BTreeMap::new();
    let mut no_offers: BTreeMap<String, Vec<NoOffer>> = BTreeMap::new();
    let mut effective: BTreeMap<String, BTreeMap<String, Effective>> = BTreeMap::new();
    // Asked once per cloud, not per machine: each answer is a fresh copy.
    let caps: BTreeMap<&str, Capabilities> = providers
        .names()
        .filter_map(|c| Some((c, providers.get(c)?.capabilities())))
        .collect();
    let supports = |cloud: &str, f: Feature| caps.get(cloud).is_some_and(|c| c.supports(f));
    for vm in config.vms.values() {
        let usable: Vec<_> = vm
            .clouds
            .iter()
            .filter(|c| providers.get(c.as_str()).is_some())
            .collect();
        if usable.is_empty() {
            return Err(Report::new(config.vm_error(
                &vm.name,
                format!(
                    "vm.{}: no adapter for {} in this build of gpuprov",
                    vm.name,
                    vm.clouds.iter().map(|c| c.as_str()).collect::<Vec<_>>().join(", ")
                ),
                Some(format!(
                    "available clouds in this build: {}",
                    clouds_in_this_build()
                )),
            )));
        }
        let zoned = vm
            .clouds
            .iter()
            .any(|c| supports(c.as_str(), Feature::Zones));
        if !vm.zones.is_empty() && !zoned {
            return Err(Report::new(config.key_error(
                &vm.name,
                "zones",
                format!(
                    "vm.{}: zones is set, but none of its clouds ({}) places machines in zones",
                    vm.name,
                    vm.clouds.iter().map(|c| c.as_str()).collect::<Vec<_>>().join(", ")
                ),
                Some("remove zones (regions choose where it runs), or add a cloud with zones (aws, gcp)".into()),
            )));
        }
        let mut rejections = Vec::new();
        let mut reasons = Vec::new();
        let mut errors = Vec::new();
        let mut unpriced = vm.request();
        unpriced.max_price_per_hour = None;
        for c in &usable {
            let Some(p) = providers.get(c.as_str()) else {
                continue;
            };
            let why = |reason, detail: String| NoOffer {
                cloud: c.to_string(),
                reason,
                detail,
            };
            match p.plan(&unpriced).await {
                Err(e) if e.kind == ErrorKind::InvalidRequest => {
                    rejections.push(format!("{c}: {}", e.text()));
                    reasons.push(why(NoOfferReason::NoMatch, e.text()));
                }
                // Other errors (capacity, credentials, an unreachable catalog) are for
                // apply to handle; the plan says why this cloud shows no offers.
                Err(e) => {
                    errors.push(format!(
                        "vm.{}: {c} shows no offers: {} ({:?})",
                        vm.name,
                        e.text(),
                        e.kind
                    ));
                    reasons.push(match e.kind {
                        ErrorKind::Credentials => why(NoOfferReason::NoCredentials, e.text()),
                        _ => why(
                            NoOfferReason::ApiError,
                            format!("{} ({:?})", e.text(), e.kind),
                        ),
                    });
                }
                // The same filter and order as the launch machine's Planning step.
                Ok(mut found) => {
                    if let Some(caps) = caps.get(c.as_str()) {
                        crate::provider::offers::order(&mut found, &unpriced, caps);
                    }
                    let total = found.len();
                    let cheapest = found
                        .iter()
                        .map(|o| o.price_per_hour)
                        .min_by(f64::total_cmp);
                    let fit: Vec<Offer> = found
                        .into_iter()
                        .filter(|o| vm.max_price_per_hour.is_none_or(|m| o.price_per_hour <= m))
                        .collect();
                    match (fit.is_empty(), cheapest, vm.max_price_per_hour) {
                        (false, _, _) => offers.entry(vm.name.clone()).or_default().extend(fit),
                        (true, Some(cheapest), Some(max)) => reasons.push(why(
                            NoOfferReason::AboveMaxPrice,
                            format!(
                                "{total} offer{} above max_price_per_hour ${max:.2}/h (the cheapest: ${cheapest:.2}/h)",
                                if total == 1 { "" } else { "s" }
                            ),
                        )),
                        _ => reasons.push(why(
                            NoOfferReason::NoMatch,
                            "the catalog has nothing that matches the ask".into(),
                        )),
                    }
                }
            }
        }
        if rejections.len() == usable.len() {
            return Err(Report::new(config.vm_error(
                &vm.name,
                format!("vm.{}: no cloud can provide what it asks for", vm.name),
                Some(rejections.join("; ")),
            )));
        }
        if offers.get(&vm.name).is_none_or(Vec::is_empty) {
            // The error (or, when allowed, the plan) gives the reasons as a table.
            for c in vm.clouds.iter().filter(|c| !usable.contains(c)) {
                reasons.push(NoOffer {
                    cloud: c.to_string(),
                    reason: NoOfferReason::NoAdapter,
                    detail: "no adapter in this build of gpuprov".into(),
                });
            }
            no_offers.insert(vm.name.clone(), reasons);
        } else {
            notes.extend(errors);
        }
        let no_k3s: Vec<&str> = usable
            .iter()
            .filter(|c| !supports(c.as_str(), Feature::Kubernetes))
            .map(|c| c.as_str())
            .collect();
        let k3s_capable = no_k3s.len() < usable.len();
        if vm.kubernetes && !no_k3s.is_empty() {
            let (value, why) = if k3s_capable {
                (
                    "true",
                    format!(
                        "skipped if placed on {}, which cannot host k3s",
                        no_k3s.join(" or ")
                    ),
                )
            } else {
                (
                    "false",
                    format!(
                        "{} cannot host k3s (the config asks for true)",
                        no_k3s.join(", ")
                    ),
                )
            };
            effective.entry(vm.name.clone()).or_default().insert(
                "kubernetes".into(),
                Effective {
                    value: value.into(),
                    why,
                },
            );
        }
        if vm.kubernetes && !k3s_capable {
            if vm.kubernetes_explicit {
                return Err(Report::new(config.vm_error(
                    &vm.name,
                    format!(
                        "vm.{}: kubernetes = true, but none of its clouds can host k3s",
                        vm.name
                    ),
                    Some("set kubernetes = false (or drop --k8s), or add a cloud that supports Kubernetes".into()),
                )));
            }
            k3s_skipped
                .entry(
                    usable
                        .iter()
                        .map(|c| c.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                )
                .or_default()
                .push(vm.name.clone());
        }
    }
    // One note per cloud set, not per machine: a fleet of 1,000 gets one line.
    for (clouds, vms) in k3s_skipped {
        let shown: Vec<String> = vms.iter().take(3).map(|v| format!("vm.{v}")).collect();
        let more = match vms.len().saturating_sub(3) {
            0 => String::new(),
            n => format!(" and {n} more"),
        };
        notes.push(format!(
            "{}{more}: kubernetes skipped: {clouds} cannot host k3s",
            shown.join(", ")
        ));
    }
    Ok(Preflight {
        notes,
        offers,
        no_offers,
        effective,
    })
}
