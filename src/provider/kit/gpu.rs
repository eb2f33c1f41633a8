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
