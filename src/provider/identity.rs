//! The VM identity every cloud object gpuprov creates carries (brief: "Identity"): the VM
//! name and the state's lineage as labels or tags, names derived from them, and the typed
//! lineage handed to adapters when they are built.

use std::fmt;
use std::str::FromStr;

use super::{ErrorKind, ProviderError};

/// The label (or tag) key every cloud object gpuprov creates carries, with the VM name as
/// value, so it can always be found again (brief: "Identity").
pub const IDENTITY_LABEL: &str = "gpuprov-vm-name";
/// The label key carrying the state's lineage (a UUID), so objects of two projects that use
/// the same VM name are never confused.
pub const LINEAGE_LABEL: &str = "gpuprov-lineage";

/// A state's lineage: a UUID (the state file's `lineage`), checked once when it is parsed,
/// so an adapter holding one never has to re-check it. Kept as written in the state (its
/// text is what labels and tags carry).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Lineage(String);

impl Lineage {
    /// The lineage `s`. Errors: `InvalidRequest` when `s` is not a UUID.
    pub fn parse(s: &str) -> Result<Lineage, ProviderError> {
        let t = s.trim();
        uuid::Uuid::parse_str(t).map_err(|_| {
            ProviderError::new(
                ErrorKind::InvalidRequest,
                format!("lineage {s:?} is not a UUID"),
            )
        })?;
        Ok(Lineage(t.to_string()))
    }

    /// A fresh random lineage (UUID v4), for runs that create nothing (catalog lookups of
    /// `gpuprov offers`, which has no state), and for new states.
    pub fn random() -> Lineage {
        Lineage(uuid::Uuid::new_v4().to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 8 characters, used in object names (`gpuprov-<vm>-<lineage8>`).
    pub fn short(&self) -> &str {
        &self.0[..self.0.len().min(8)]
    }
}

impl FromStr for Lineage {
    type Err = ProviderError;
    fn from_str(s: &str) -> Result<Lineage, ProviderError> {
        Lineage::parse(s)
    }
}

impl fmt::Display for Lineage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Lineage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Lineage({})", self.0)
    }
}

impl PartialEq<str> for Lineage {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<String> for Lineage {
    fn eq(&self, other: &String) -> bool {
        &self.0 == other
    }
}

/// The per-VM object name most clouds show: `gpuprov-<vm>-<lineage8>` (at most 57
/// characters for a 40-character VM name).
pub fn object_name(vm_name: &str, lineage: &Lineage) -> String {
    format!("gpuprov-{vm_name}-{}", lineage.short())
}

/// The VM an [`object_name`] names under `lineage`: `api` for `gpuprov-api-0f0e0d0c`;
/// `None` for any other name. Listings that match imported instances by name use it to
/// tell which VM to check an instance against.
pub fn vm_of_object_name<'a>(name: &'a str, lineage: &Lineage) -> Option<&'a str> {
    name.strip_prefix("gpuprov-")?
        .strip_suffix(lineage.short())?
        .strip_suffix('-')
        .filter(|vm| !vm.is_empty())
}

/// The per-VM object name at a location, for clouds whose instance listing does not say
/// where an instance runs (Massed Compute, Prime Intellect), so that `observe` in one
/// region never sees the instance of another: `gpuprov-<vm>-<lineage8>-<region>`, the
/// region lowercased with every character outside `[a-z0-9]` written as `-` (names on
/// those clouds allow letters, digits and dashes).
pub fn located_name(vm_name: &str, lineage: &Lineage, region: &str) -> String {
    let region: String = region
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    format!("{}-{region}", object_name(vm_name, lineage))
}

/// The VM a [`located_name`] at `region` names under `lineage`; `None` for any other
/// name (another lineage or region, or no gpuprov name).
pub fn vm_of_located_name<'a>(name: &'a str, lineage: &Lineage, region: &str) -> Option<&'a str> {
    let tail = located_name("", lineage, region);
    let tail = tail.strip_prefix("gpuprov-")?;
    name.strip_prefix("gpuprov-")?
        .strip_suffix(tail)
        .filter(|vm| !vm.is_empty())
}

/// The name under which an adapter registers the project's SSH public key on clouds that
/// name keys: `gpuprov-<lineage8>-<fp12>`, where `fp12` is the first 12 hex digits of
/// the SHA-256 of the key's decoded blob (the digest of `ssh-keygen -l`'s `SHA256:`
/// fingerprint). A key of the same lineage but another value (a rotated or foreign key)
/// therefore has another name, so a cloud that refuses duplicate names never blocks the
/// run and an adapter never uses a key it merely found by name.
pub fn project_key_name(lineage: &str, public_key: &str) -> String {
    use base64::Engine as _;
    use sha2::Digest as _;
    let short: String = lineage.chars().take(8).collect();
    let blob = public_key.split_whitespace().nth(1).unwrap_or(public_key);
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(blob)
        .unwrap_or_else(|_| blob.as_bytes().to_vec());
    let digest = sha2::Sha256::digest(&bytes);
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("gpuprov-{short}-{hex}")
}

/// How an instance's name carries its identity on a cloud, for instances without
/// identity labels: [`object_name`] (`gpuprov-<vm>-<lineage8>`), or [`located_name`]
/// (`gpuprov-<vm>-<lineage8>-<region>`) on clouds whose listing does not say where an
/// instance runs (Massed Compute, Prime Intellect).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Naming {
    #[default]
    Object,
    Located,
}

/// The identity fields of one listed instance exactly as its cloud shows them (labels,
/// tags, environment variables or description words, and its name), not yet judged:
/// whose it is is [`owner`]'s decision, made here once for every cloud.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shown {
    /// The [`IDENTITY_LABEL`] value, where the instance carries one.
    pub vm: Option<String>,
    /// The [`LINEAGE_LABEL`] value, where the instance carries one.
    pub lineage: Option<String>,
    /// The instance's name (or hostname), where the cloud shows one.
    pub name: Option<String>,
    /// How that name carries the identity.
    pub naming: Naming,
}

impl Shown {
    /// Identity carried by labels (or what stands in for them): `vm` and `lineage` as the
    /// cloud shows them, `None` where a label is missing.
    pub fn labels(vm: Option<&str>, lineage: Option<&str>) -> Shown {
        Shown {
            vm: vm.map(str::to_string),
            lineage: lineage.map(str::to_string),
            ..Shown::default()
        }
    }

    /// The instance's name, formed as `naming` says.
    pub fn named(mut self, name: Option<&str>, naming: Naming) -> Shown {
        self.name = name.map(str::to_string);
        self.naming = naming;
        self
    }
}

/// The VM of `lineage` an instance at `region` belongs to, from the identity it shows;
/// `None` when it is no VM's of this lineage. The one rule every cloud follows:
///
/// 1. An instance with an identity label is the VM's it names when its lineage label is
///    `lineage` (compared ignoring ASCII case: GCP label values are lowercase); with
///    another lineage or none, it is no one's of this lineage. Its name is not read.
/// 2. An instance with a lineage label but no identity label is no one's: a half
///    labelled object is never adopted.
/// 3. An instance with no label at all (imported on a cloud whose labels cannot change,
///    or a cloud without labels) is the VM's its name names under `lineage`:
///    [`object_name`], or [`located_name`] at `region` where the cloud's names carry it.
pub fn owner(shown: &Shown, lineage: &Lineage, region: &str) -> Option<String> {
    match (&shown.vm, &shown.lineage) {
        (Some(vm), Some(l)) => {
            (l.eq_ignore_ascii_case(lineage.as_str()) && !vm.is_empty()).then(|| vm.clone())
        }
        (Some(_), None) | (None, Some(_)) => None,
        (None, None) => {
            let name = shown.name.as_deref()?;
            match shown.naming {
                Naming::Object => vm_of_object_name(name, lineage),
                Naming::Located => vm_of_located_name(name, lineage, region),
            }
            .map(str::to_string)
        }
    }
}

/// The identity an instance shows, whatever its lineage, for discovery, `state recover`
/// and `sweep`: `(vm, lineage)` from both labels; or, without labels, from a name of
/// `mine` ([`owner`]'s rule 3), with `mine`'s full lineage. A name of another lineage
/// holds only 8 characters of it, which is no lineage: such an instance is not listed.
pub fn listed_identity(shown: &Shown, mine: &Lineage, region: &str) -> Option<(String, String)> {
    match (&shown.vm, &shown.lineage) {
        (Some(vm), Some(l)) if !vm.is_empty() && !l.is_empty() => {
            let lineage = if l.eq_ignore_ascii_case(mine.as_str()) {
                mine.to_string()
            } else {
                l.clone()
            };
            Some((vm.clone(), lineage))
        }
        (None, None) => owner(shown, mine, region).map(|vm| (vm, mine.to_string())),
        _ => None,
    }
}

/// Refuses a create whose spec belongs to another lineage than the adapter's: `observe`
/// filters on the adapter's lineage, so such an instance would be invisible and leak.
/// Answers the adapter's lineage, which the create then labels its objects with.
pub fn check_spec_lineage<'a>(
    cloud: &str,
    lineage: &'a Lineage,
    spec: &super::InstanceSpec,
) -> Result<&'a Lineage, ProviderError> {
    if *lineage != spec.lineage {
        return Err(ProviderError::new(
            ErrorKind::InvalidRequest,
            format!(
                "{cloud}: spec lineage {} differs from the provider's lineage {lineage}",
                spec.lineage
            ),
        ));
    }
    Ok(lineage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lineages_are_uuids() {
        let l = Lineage::parse("0f0e0d0c-1111-4222-8333-444455556666").unwrap();
        assert_eq!(l.short(), "0f0e0d0c");
        assert_eq!(object_name("api", &l), "gpuprov-api-0f0e0d0c");
        assert_eq!(vm_of_object_name("gpuprov-a-b-0f0e0d0c", &l), Some("a-b"));
        for other in ["gpuprov--0f0e0d0c", "gpuprov-api-0f0e0d0d", "my own box"] {
            assert_eq!(vm_of_object_name(other, &l), None, "{other}");
        }
        assert_eq!(
            located_name("api", &l, "US-KS-2"),
            "gpuprov-api-0f0e0d0c-us-ks-2"
        );
        assert_eq!(
            located_name("api", &l, "eu_west 1"),
            "gpuprov-api-0f0e0d0c-eu-west-1"
        );
        let named = located_name("a-b", &l, "US-KS-2");
        assert_eq!(vm_of_located_name(&named, &l, "US-KS-2"), Some("a-b"));
        assert_eq!(vm_of_located_name(&named, &l, "US-KS-22"), None);
        assert_eq!(
            vm_of_located_name("gpuprov-a-b-0f0e0d0c", &l, "US-KS-2"),
            None
        );
        assert_eq!(
            Lineage::parse("").unwrap_err().kind,
            ErrorKind::InvalidRequest
        );
        assert!("not-a-uuid".parse::<Lineage>().is_err());
        assert_ne!(Lineage::random(), Lineage::random());
    }

    #[test]
    fn project_key_name_depends_on_the_key_value() {
        let a = project_key_name("0123456789ab", "ssh-ed25519 AAAAone= comment");
        let b = project_key_name("0123456789ab", "ssh-ed25519 AAAAtwo= comment");
        let a2 = project_key_name("0123456789ab", "ssh-ed25519 AAAAone= other-comment");
        assert!(a.starts_with("gpuprov-01234567-"), "{a}");
        assert_eq!(a.len(), "gpuprov-01234567-".len() + 12);
        assert_ne!(a, b, "another key value gets another name");
        assert_eq!(a, a2, "the comment does not change the name");
    }

    #[test]
    fn one_rule_decides_whose_an_instance_is() {
        let l = Lineage::parse("0f0e0d0c-1111-4222-8333-444455556666").unwrap();
        let other = "9f0e0d0c-1111-4222-8333-444455556666";
        let mine = l.as_str();
        let named = |n: &str, naming| Shown::default().named(Some(n), naming);
        // (shown, region, owner)
        let cases: Vec<(Shown, &str, Option<&str>)> = vec![
            (Shown::labels(Some("api"), Some(mine)), "r", Some("api")),
            (
                Shown::labels(Some("api"), Some(&mine.to_uppercase())),
                "r",
                Some("api"),
            ),
            (Shown::labels(Some("api"), Some(other)), "r", None),
            (Shown::labels(Some("api"), None), "r", None),
            (Shown::labels(None, Some(mine)), "r", None),
            (Shown::labels(Some(""), Some(mine)), "r", None),
            // Labels decide; the name is not read then.
            (
                Shown::labels(Some("api"), Some(other))
                    .named(Some("gpuprov-api-0f0e0d0c"), Naming::Object),
                "r",
                None,
            ),
            (
                named("gpuprov-api-0f0e0d0c", Naming::Object),
                "r",
                Some("api"),
            ),
            (
                named("gpuprov-a-b-0f0e0d0c", Naming::Object),
                "r",
                Some("a-b"),
            ),
            (named("gpuprov-api-9f0e0d0c", Naming::Object), "r", None),
            (named("my own box", Naming::Object), "r", None),
            (
                named("gpuprov-api-0f0e0d0c-us-ks-2", Naming::Located),
                "US-KS-2",
                Some("api"),
            ),
            (
                named("gpuprov-api-0f0e0d0c-us-ks-2", Naming::Located),
                "US-KS-22",
                None,
            ),
            (
                named("gpuprov-api-0f0e0d0c-us-ks-2", Naming::Object),
                "US-KS-2",
                None,
            ),
            (Shown::default(), "r", None),
        ];
        for (shown, region, want) in cases {
            assert_eq!(
                owner(&shown, &l, region).as_deref(),
                want,
                "{shown:?} at {region}"
            );
        }
        let listed = |s: &Shown| listed_identity(s, &l, "r");
        assert_eq!(
            listed(&Shown::labels(Some("api"), Some(other))),
            Some(("api".into(), other.into()))
        );
        assert_eq!(
            listed(&named("gpuprov-api-0f0e0d0c", Naming::Object)),
            Some(("api".into(), mine.into()))
        );
        assert_eq!(listed(&named("gpuprov-api-9f0e0d0c", Naming::Object)), None);
        assert_eq!(listed(&Shown::labels(Some("api"), None)), None);
    }
}
