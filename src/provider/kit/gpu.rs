//! GPU names as users write them and as clouds list them.

use std::collections::BTreeSet;

use super::super::{ErrorKind, ProviderError, ResourceRequest};

/// A GPU name reduced to uppercase ASCII letters and digits, so `H100`, `h100`,
/// `RTX 6000` and `rtx6000` compare equal.
pub fn norm(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_uppercase())
        .collect()
}

/// Whether the asked model `want` names the cloud's model `have` (compared with [`norm`]).
pub fn same_model(want: &str, have: &str) -> bool {
    norm(want) == norm(have)
}

/// The `InvalidRequest` for an ask that no instance type of the cloud fits:
/// `"<none> with <gpu> x<count>; it has: <model> x<n>, …"`, where `none` says what the cloud
/// lacks (`"Lambda has no instance type"`) and `have` lists the cloud's GPU configurations
/// (`"H100 x8"`), shown once each, sorted.
pub fn no_type_for(
    none: &str,
    req: &ResourceRequest,
    have: impl IntoIterator<Item = String>,
) -> ProviderError {
    let have: BTreeSet<String> = have.into_iter().collect();
    let have: Vec<String> = have.into_iter().collect();
    ProviderError::new(
        ErrorKind::InvalidRequest,
        format!(
            "{none} with {} x{}; it has: {}",
            req.gpu.as_deref().unwrap_or("any GPU"),
            req.gpu_count,
            have.join(", ")
        ),
    )
}

/// A static catalog's GPU ladder, as [`rungs_for`] reads it: the cloud and what it calls
/// a type (for messages), the rungs, and how to read one.
pub struct Ladder<'a, T> {
    /// The cloud as messages name it (`"AWS"`).
    pub cloud: &'a str,
    /// What the cloud calls a type (`"instance type"`, `"machine type"`).
    pub kind: &'a str,
    pub rungs: &'a [T],
    /// A rung's GPU model as gpuprov spells it (listed when an ask names none of them).
    pub model: fn(&T) -> &str,
    /// Whether a rung carries the asked model.
    pub matches: fn(&T, &str) -> bool,
    /// GPUs per machine.
    pub gpus: fn(&T) -> u32,
}

/// Whether an instance type with `gpus` GPUs fits the ask's count: any count when none is
/// asked (0), else exactly `gpu_count`, or at least it with `gpu_count_at_least`.
pub fn count_fits(req: &ResourceRequest, gpus: u32) -> bool {
    match req.gpu_count {
        0 => true,
        n if req.gpu_count_at_least => gpus >= n,
        n => gpus == n,
    }
}

/// The rungs of `ladder` that fit `req`, cheapest first by `price` (USD per hour): they
/// carry the asked GPU model and `gpu_count` GPUs (any count when 0; see [`count_fits`]),
/// at or below `max_price_per_hour`.
///
/// Errors (`InvalidRequest`): no GPU asked (a GPU ladder lists GPU types only), a model
/// the ladder does not know (the message lists those it knows), or no rung within the
/// count and price.
pub fn rungs_for<'a, T>(
    ladder: &Ladder<'a, T>,
    req: &ResourceRequest,
    price: impl Fn(&T) -> f64,
) -> Result<Vec<&'a T>, ProviderError> {
    let invalid = |m: String| Err(ProviderError::new(ErrorKind::InvalidRequest, m));
    let (cloud, kind) = (ladder.cloud, ladder.kind);
    let Some(gpu) = req.gpu.as_deref() else {
        return invalid(format!(
            "the {cloud} catalog lists GPU {kind}s only; set gpu (for example \"H100\")"
        ));
    };
    if !ladder.rungs.iter().any(|t| (ladder.matches)(t, gpu)) {
        let mut known: Vec<&str> = ladder.rungs.iter().map(ladder.model).collect();
        known.dedup();
        return invalid(format!(
            "{cloud} has no GPU model {gpu:?} in gpuprov's catalog; known: {}",
            known.join(", ")
        ));
    }
    let count = req.gpu_count;
    let mut fit: Vec<&T> = ladder
        .rungs
        .iter()
        .filter(|t| (ladder.matches)(t, gpu) && count_fits(req, (ladder.gpus)(t)))
        .filter(|t| req.max_price_per_hour.is_none_or(|m| price(t) <= m))
        .collect();
    if fit.is_empty() {
        return invalid(format!(
            "no {cloud} {kind} has {}{count} × {gpu}{}",
            if req.gpu_count_at_least {
                "at least "
            } else {
                ""
            },
            req.max_price_per_hour
                .map(|m| format!(" at or below ${m}/h"))
                .unwrap_or_default()
        ));
    }
    fit.sort_by(|a, b| price(a).total_cmp(&price(b)));
    Ok(fit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_compare_without_case_spaces_or_dashes() {
        assert_eq!(norm("RTX 6000"), "RTX6000");
        assert!(same_model("h100", "H100"));
        assert!(same_model("a100-80gb", "A100 80GB"));
        assert!(!same_model("H100", "H200"));
    }

    #[test]
    fn an_unmet_gpu_ask_lists_what_the_cloud_has() {
        let req = super::super::testing::ask(Some("B200"), 8, &[]);
        let have = ["H100 x8", "A100 x1", "H100 x8"].map(String::from);
        let e = no_type_for("Acme has no type", &req, have);
        assert_eq!(e.kind, ErrorKind::InvalidRequest);
        assert_eq!(
            e.msg,
            "Acme has no type with B200 x8; it has: A100 x1, H100 x8"
        );
    }
}
