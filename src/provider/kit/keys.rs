//! The project's SSH key on clouds that register keys: found by *value* (type and base64,
//! never by name or comment), else registered under the name derived from its fingerprint
//! ([`crate::provider::project_key_name`]). Only the shared-object calls register it
//! (`observe_shared`, `create_shared`), both on one [`KeyListing`] of the cloud's keys;
//! `prepare` takes it from the core ([`prepared_key`]).

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

/// One key of a cloud's key listing, as [`KeyListing`] reads it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListedKey {
    /// The cloud's id for the key.
    pub id: String,
    /// Its name as the cloud shows it.
    pub name: String,
    /// Its OpenSSH public key; empty where the adapter wants it never found by value (a
    /// name shared by keys of other values, on a cloud whose launch names keys).
    pub public_key: String,
}

impl ListedKey {
    /// A key with the cloud's `id` (any displayable id), `name` and `public_key`.
    pub fn new(id: impl ToString, name: String, public_key: String) -> ListedKey {
        ListedKey {
            id: id.to_string(),
            name,
            public_key,
        }
    }
}

/// One read of a cloud's registered SSH keys, for the project key `public_key`: what
/// `observe_shared` answers ([`KeyListing::found`]) and the name `create_shared`
/// registers ([`KeyListing::name_to_register`]). The adapter supplies the listing and
/// the registration call; the rules (found by value, never by name; ours only under a
/// derived name; never registered twice) live here.
#[derive(Debug, Clone)]
pub struct KeyListing {
    cloud: &'static str,
    public_key: String,
    /// [`project_key_name`] as the cloud spells it (see [`KeyListing::spelled_with`]).
    base: String,
    sep: char,
    unique_names: bool,
    keys: Vec<ListedKey>,
}

impl KeyListing {
    /// `keys` of `cloud`, read for the project key `public_key` of `lineage`. Names are
    /// unique on the cloud (a taken derived name gets a free `-<n>`), spelled with `-`.
    pub fn new(
        cloud: &'static str,
        lineage: &str,
        public_key: &str,
        keys: impl IntoIterator<Item = ListedKey>,
    ) -> KeyListing {
        KeyListing {
            cloud,
            public_key: public_key.to_string(),
            base: project_key_name(lineage, public_key),
            sep: '-',
            unique_names: true,
            keys: keys.into_iter().collect(),
        }
    }

    /// On a cloud whose key names take no `-`: every `-` of the derived name (and of the
    /// free `-<n>` suffix) is spelled `sep` (Massed Compute: a space).
    pub fn spelled_with(mut self, sep: char) -> KeyListing {
        self.base = self.base.replace('-', &sep.to_string());
        self.sep = sep;
        self
    }

    /// On a cloud whose key names need not be unique (DigitalOcean): gpuprov registers
    /// under the derived name itself, so only a key of exactly that name is ours.
    pub fn names_not_unique(mut self) -> KeyListing {
        self.unique_names = false;
        self
    }

    /// The project key among the listed, found by value ([`find_by_value`]), as the shared
    /// object `ssh_key`: ours when its name is one gpuprov derives, else the user's (used,
    /// never deleted). `None` when it is not registered.
    pub fn found(&self) -> Option<SharedFound> {
        let k = find_by_value(&self.keys, &self.public_key, |k| &k.public_key)?;
        let ours = if self.unique_names {
            is_derived_name(&k.name, &self.base, self.sep)
        } else {
            k.name == self.base
        };
        Some(SharedFound {
            id: k.id.clone(),
            name: k.name.clone(),
            ours,
        })
    }

    /// The name to register the project key under: the derived name, or on a cloud with
    /// unique names its first free `<sep><n>` ([`free_name`]) when a key of another value
    /// holds it.
    ///
    /// Errors: `Exists` when the key is listed already by value ([`refuse_registered`]),
    /// so the core observes again and adopts it instead of registering it twice.
    pub fn name_to_register(&self) -> Result<String, ProviderError> {
        refuse_registered(self.cloud, &self.keys, &self.public_key, |k| &k.public_key)?;
        if !self.unique_names {
            return Ok(self.base.clone());
        }
        let sep = self.sep.to_string();
        let dashed = self.base.replace(&sep, "-");
        let taken = |n: &str| self.keys.iter().any(|k| k.name == n.replace('-', &sep));
        Ok(free_name(&dashed, taken).replace('-', &sep))
    }
}

/// What a registration under `name` answered, as the shared object `ssh_key`: the
/// cloud's `id` and the name it echoes (`name` when it echoes none); always ours.
pub fn registered(id: String, echoed: Option<String>, name: String) -> SharedFound {
    SharedFound {
        id,
        name: echoed.filter(|n| !n.is_empty()).unwrap_or(name),
        ours: true,
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

    const LINEAGE: &str = "0f0e0d0c-1111-4222-8333-444455556666";
    const KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtu gpuprov";

    fn key(id: &str, name: &str, value: &str) -> ListedKey {
        ListedKey {
            id: id.into(),
            name: name.into(),
            public_key: value.into(),
        }
    }

    #[test]
    fn a_listing_finds_by_value_and_names_a_free_derived_name() {
        let base = project_key_name(LINEAGE, KEY);
        let other = "ssh-ed25519 AAAAother me@laptop";
        // The derived name is held by another value: the next free suffix, never reuse.
        let l = KeyListing::new("c", LINEAGE, KEY, [key("1", &base, other)]);
        assert_eq!(l.found(), None);
        assert_eq!(l.name_to_register().unwrap(), format!("{base}-2"));
        // Found by value under a derived name: ours; under the user's name: not ours.
        let l = KeyListing::new("c", LINEAGE, KEY, [key("7", &format!("{base}-2"), KEY)]);
        assert_eq!(
            l.found(),
            Some(SharedFound {
                id: "7".into(),
                name: format!("{base}-2"),
                ours: true
            })
        );
        assert_eq!(l.name_to_register().unwrap_err().kind, ErrorKind::Exists);
        let l = KeyListing::new(
            "c",
            LINEAGE,
            KEY,
            [key(
                "8",
                "laptop",
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtu me",
            )],
        );
        assert!(
            !l.found().unwrap().ours,
            "the user's key is used, never ours"
        );
    }

    #[test]
    fn spelling_and_non_unique_names_follow_the_cloud() {
        let base = project_key_name(LINEAGE, KEY);
        let spaced = base.replace('-', " ");
        let l = KeyListing::new("c", LINEAGE, KEY, [key("1", &spaced, "")]).spelled_with(' ');
        assert_eq!(l.found(), None, "an empty value is never found");
        assert_eq!(l.name_to_register().unwrap(), format!("{spaced} 2"));
        let l = KeyListing::new("c", LINEAGE, KEY, [key("2", &format!("{spaced} 2"), KEY)])
            .spelled_with(' ');
        assert!(l.found().unwrap().ours);
        // Names not unique: the derived name itself, and only it is ours.
        let l = KeyListing::new("c", LINEAGE, KEY, [key("3", &format!("{base}-2"), KEY)])
            .names_not_unique();
        assert!(!l.found().unwrap().ours);
        let l = KeyListing::new("c", LINEAGE, KEY, [key("4", &base, "ssh-rsa AAAAx")])
            .names_not_unique();
        assert_eq!(l.name_to_register().unwrap(), base);
        assert_eq!(
            registered("9".into(), Some(String::new()), base.clone()).name,
            base
        );
    }
}
