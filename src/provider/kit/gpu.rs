//! GPU names as users write them and as clouds list them.

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
}
