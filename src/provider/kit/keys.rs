//! The project's SSH key on clouds that register keys: found by *value* (type and base64,
//! never by name or comment), else registered under the name derived from its fingerprint
//! ([`crate::provider::project_key_name`]). Only the shared-object calls register it
//! (`observe_shared`, `create_shared`); `prepare` takes it from the core
//! ([`prepared_key`]).

use super::super::shared::SSH_KEY;
use super::super::{project_key_name, ErrorKind, InstanceSpec, ProviderError, SharedFound};

/// The project key the core prepared for this machine: `spec.shared`'s [`SSH_KEY`]. The
/// engine makes it a shared object (observed by value, registered when missing) before
/// any `prepare` of a cloud that declares it, so `prepare` never registers keys itself.
///
/// Errors: `InvalidRequest` ("`cloud`: prepare needs the project SSH key …") when it is
/// missing, before any call to the cloud.
pub fn prepared_key<'a>(
    cloud: &str,
    spec: &'a InstanceSpec,
) -> Result<&'a SharedFound, ProviderError> {
    spec.shared.get(SSH_KEY).ok_or_else(|| {
        ProviderError::new(
            ErrorKind::InvalidRequest,
            format!(
                "{cloud}: prepare needs the project SSH key (the core makes it a shared \
                 object first)"
            ),
        )
    })
}

/// The OpenSSH key without its comment (`type base64`), for comparing keys by value.
pub fn key_value(k: &str) -> String {
    k.split_whitespace().take(2).collect::<Vec<_>>().join(" ")
}

/// The key of `listed` whose public key (`value_of`) is `public_key`, compared by value
/// ([`key_value`]: type and base64, without the comment).
pub fn find_by_value<'a, K>(
    listed: &'a [K],
    public_key: &str,
    value_of: impl Fn(&K) -> &str,
) -> Option<&'a K> {
    let want = key_value(public_key);
    listed.iter().find(|k| key_value(value_of(k)) == want)
}

/// Refuses to register `public_key` on `cloud` when `listed` already holds it by value
/// ([`find_by_value`]): the answer is `Exists`, so the core observes again and adopts the
/// key instead of the cloud keeping the same key twice under two names.
pub fn refuse_registered<K>(
    cloud: &str,
    listed: &[K],
    public_key: &str,
    value_of: impl Fn(&K) -> &str,
) -> Result<(), ProviderError> {
    match find_by_value(listed, public_key, value_of) {
        Some(_) => Err(ProviderError::new(
            ErrorKind::Exists,
            format!("{cloud}: the project SSH key is registered already"),
        )),
        None => Ok(()),
    }
}

/// `base`, or the first of `base-2`, `base-3`, … that `taken` refuses, for clouds whose key
/// names are unique (a key of another value may hold the derived name).
pub fn free_name(base: &str, taken: impl Fn(&str) -> bool) -> String {
    if !taken(base) {
        return base.to_string();
    }
    (2..)
        .map(|i| format!("{base}-{i}"))
        .find(|n| !taken(n))
        .unwrap_or_else(|| base.to_string())
}

/// Whether key name `name` is one gpuprov derives from `base` for clouds whose names are
/// unique: `base` itself, or `base` with the `<sep><n>` suffix [`free_name`] gives a taken
/// name (`sep` is `-`, or a space where the cloud allows no dashes). Decides
/// [`SharedFound::ours`](crate::provider::SharedFound::ours): only such a key is deleted.
pub fn is_derived_name(name: &str, base: &str, sep: char) -> bool {
    name == base
        || name
            .strip_prefix(base)
            .and_then(|r| r.strip_prefix(sep))
            .is_some_and(|n| n.parse::<u32>().is_ok_and(|n| n >= 2))
}

/// The name to register the project key under on a cloud whose key names are unique:
/// [`project_key_name`] of `lineage` and `public_key`, or its first free `-<n>`
/// ([`free_name`]) when `taken` refuses it.
pub fn free_project_key_name(
    lineage: &str,
    public_key: &str,
    taken: impl Fn(&str) -> bool,
) -> String {
    free_name(&project_key_name(lineage, public_key), taken)
}

/// A listed key (`id`, `name`) as the shared object `ssh_key`: ours when `name` is one
/// [`free_project_key_name`] gives ([`is_derived_name`] with `-`), else the user's.
pub fn shared_found(id: String, name: &str, lineage: &str, public_key: &str) -> SharedFound {
    SharedFound {
        id,
        name: name.to_string(),
        ours: is_derived_name(name, &project_key_name(lineage, public_key), '-'),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_compare_by_value_and_names_get_free_suffixes() {
        assert_eq!(
            key_value("ssh-ed25519 AAAAx me@laptop\n"),
            key_value("ssh-ed25519 AAAAx gpuprov")
        );
        assert_ne!(
            key_value("ssh-ed25519 AAAAx"),
            key_value("ssh-ed25519 AAAAy")
        );
        let taken = ["k", "k-2"];
        assert_eq!(free_name("k", |n| taken.contains(&n)), "k-3");
        assert_eq!(free_name("j", |n| taken.contains(&n)), "j");
        assert!(is_derived_name("k", "k", '-'));
        assert!(is_derived_name("k-3", "k", '-'));
        assert!(is_derived_name("g k 2", "g k", ' '));
        assert!(!is_derived_name("k-x", "k", '-'));
        assert!(!is_derived_name("k-1", "k", '-'), "free_name starts at 2");
        assert!(!is_derived_name("k 2", "k", '-'));
        assert!(!is_derived_name("my-laptop", "k", '-'));
    }
}
