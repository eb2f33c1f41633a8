//! The project's SSH key on clouds that register keys: found by *value* (type and base64,
//! never by name or comment), else registered under the name derived from its fingerprint
//! ([`crate::provider::project_key_name`]).

use std::future::Future;

use super::super::{project_key_name, ErrorKind, ProviderError, SharedFound};

/// Registration attempts of the project key; each lists the keys first, so a key another
/// machine registered meanwhile is found instead of registered twice.
pub const REGISTER_ATTEMPTS: usize = 3;

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

/// What a registration attempt came to.
pub enum Registered<K> {
    /// The cloud registered the key.
    Key(K),
    /// The cloud refused because the name or the value was taken meanwhile (another
    /// machine registered it): list again. Carries the error to return if the attempts run
    /// out.
    Conflict(ProviderError),
}

/// The key among the account's whose value is `public_key`, else registered.
///
/// - `list()` lists the keys (`Vec<K>`, one call's pagination at most);
/// - `value(&K)` is a listed key's OpenSSH public key;
/// - `register(&[K])` registers the key, given the listing (to pick a free name), and
///   says whether it was [`Registered::Conflict`]ed.
///
/// Errors: `InvalidRequest` for an empty key; the calls' own; the last conflict after
/// [`REGISTER_ATTEMPTS`].
pub async fn find_or_register<K, L, LF, R, RF>(
    public_key: &str,
    list: L,
    value: impl Fn(&K) -> &str,
    register: R,
) -> Result<K, ProviderError>
where
    L: Fn() -> LF,
    LF: Future<Output = Result<Vec<K>, ProviderError>>,
    R: Fn(Vec<K>) -> RF,
    RF: Future<Output = Result<Registered<K>, ProviderError>>,
{
    let want = key_value(public_key);
    if want.is_empty() {
        return Err(ProviderError::new(
            ErrorKind::InvalidRequest,
            "the project's SSH public key is empty",
        ));
    }
    let mut last = None;
    for _ in 0..REGISTER_ATTEMPTS {
        let keys = list().await?;
        if let Some(i) = keys.iter().position(|k| key_value(value(k)) == want) {
            return Ok(keys.into_iter().nth(i).expect("position is in range"));
        }
        match register(keys).await? {
            Registered::Key(k) => return Ok(k),
            Registered::Conflict(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        ProviderError::new(
            ErrorKind::Failed,
            "could not register the project's SSH key",
        )
    }))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

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

    #[tokio::test]
    async fn found_by_value_registered_once_and_conflicts_list_again() {
        // (name, value) pairs of the account.
        let account = Mutex::new(vec![(
            "other".to_string(),
            "ssh-ed25519 AAAAold x".to_string(),
        )]);
        let registrations = Mutex::new(0);
        let list = || async { Ok(account.lock().unwrap().clone()) };
        let register = |keys: Vec<(String, String)>| {
            let n = free_name("gpuprov-k", |n| keys.iter().any(|k| k.0 == n));
            let mut count = registrations.lock().unwrap();
            *count += 1;
            let result = if *count == 1 {
                // Another machine registered the same key meanwhile.
                account
                    .lock()
                    .unwrap()
                    .push(("theirs".into(), "ssh-ed25519 AAAAnew them".into()));
                Registered::Conflict(ProviderError::new(ErrorKind::Failed, "taken"))
            } else {
                Registered::Key((n, "ssh-ed25519 AAAAnew".to_string()))
            };
            async move { Ok(result) }
        };
        let k = find_or_register(
            "ssh-ed25519 AAAAnew me",
            list,
            |k: &(String, String)| &k.1,
            register,
        )
        .await
        .unwrap();
        assert_eq!(
            k.0, "theirs",
            "the key registered meanwhile is used, by value"
        );
        assert_eq!(*registrations.lock().unwrap(), 1);

        let e = find_or_register("", list, |k: &(String, String)| &k.1, register).await;
        assert_eq!(e.unwrap_err().kind, ErrorKind::InvalidRequest);
    }
}
