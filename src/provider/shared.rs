//! Shared prerequisites: cloud objects several machines use (the project's SSH key on an
//! account, an environment per region), declared per cloud and prepared once per run as
//! resources of their own (Terraform's `aws_key_pair` beside its instances), never as a
//! side effect of each machine's `prepare`.
//!
//! The declaration is data ([`declared`]): the graph and the plan read it without an
//! adapter, and [`CloudProvider::shared_objects`](super::CloudProvider::shared_objects)
//! derives an offer's objects from it. The adapter supplies the three primitives
//! (`observe_shared`, `create_shared`, `delete_shared`); the core (`vm::shared`) runs one
//! journalled machine per object with a single-flight guard, so parallel machines never
//! create the same object twice.

use serde::{Deserialize, Serialize};

use super::Offer;

/// How far a shared object reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedScope {
    /// One per cloud account (an SSH key).
    Account,
    /// One per region (an environment, a security group).
    Region,
}

/// One kind of shared object a cloud declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedKind {
    /// The resource type in addresses, for example `ssh_key`.
    pub kind: &'static str,
    pub scope: SharedScope,
}

/// The shared objects each cloud declares, in the order they are prepared (a later kind
/// may need an earlier one). Clouds not listed share nothing through the graph.
const DECLARED: &[(&str, &[SharedKind])] = &[
    ("digitalocean", &[ACCOUNT_KEY]),
    ("hyperstack", HYPERSTACK),
    ("lambda", &[ACCOUNT_KEY]),
    ("runpod", &[ACCOUNT_KEY]),
    ("verda", &[ACCOUNT_KEY]),
    ("primeintellect", &[ACCOUNT_KEY]),
    ("massedcompute", &[ACCOUNT_KEY]),
];

/// The kind of the project's SSH key (`InstanceSpec::shared`'s key for it).
pub const SSH_KEY: &str = "ssh_key";

/// The project's SSH key, one per cloud account.
const ACCOUNT_KEY: SharedKind = SharedKind {
    kind: SSH_KEY,
    scope: SharedScope::Account,
};

/// The kind of a per-region environment (`environment`).
pub const ENVIRONMENT: &str = "environment";

/// Hyperstack: key pairs live inside an environment and environments are per region
/// (`Import_Keypair_Payload.environment_name`, `Create_Environment.region` of
/// `tests/fixtures/vendor-apis/hyperstack/openapi.yaml`), so both are region-scoped and the
/// environment comes first.
const HYPERSTACK: &[SharedKind] = &[
    SharedKind {
        kind: ENVIRONMENT,
        scope: SharedScope::Region,
    },
    SharedKind {
        kind: SSH_KEY,
        scope: SharedScope::Region,
    },
];

/// The kinds of shared object `cloud` declares (none for a cloud not in the table).
pub fn declared(cloud: &str) -> &'static [SharedKind] {
    DECLARED
        .iter()
        .find(|(c, _)| *c == cloud)
        .map_or(&[], |(_, k)| *k)
}

/// Where `kind` comes in `cloud`'s declaration (its preparation order; teardown runs
/// the other way). A kind the cloud does not declare sorts last.
pub fn position(cloud: &str, kind: &str) -> usize {
    declared(cloud)
        .iter()
        .position(|k| k.kind == kind)
        .unwrap_or(usize::MAX)
}

/// One shared object: a kind of `cloud`, per account or in one region.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SharedObject {
    pub cloud: String,
    pub kind: String,
    /// The region of a region-scoped object; `None` for an account-wide one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
}

impl SharedObject {
    /// Checks that this object is `cloud`'s `kind`: an adapter's shared-object calls serve
    /// only what it declares.
    ///
    /// Errors: `InvalidRequest` ("`cloud` declares no shared `kind`") otherwise.
    pub fn expect(&self, cloud: &str, kind: &str) -> super::Result<()> {
        if self.kind == kind && self.cloud == cloud {
            Ok(())
        } else {
            Err(super::ProviderError::new(
                super::ErrorKind::InvalidRequest,
                format!("{cloud} declares no shared {}", self.kind),
            ))
        }
    }

    /// The object's address: `shared.<cloud>.<kind>`, or `shared.<cloud>.<kind>[<region>]`
    /// for a region-scoped one. It is also its key in the state's `shared` records.
    pub fn address(&self) -> String {
        match &self.region {
            None => format!("{PREFIX}{}.{}", self.cloud, self.kind),
            Some(r) => format!("{PREFIX}{}.{}[{r}]", self.cloud, self.kind),
        }
    }

    /// The object an [`address`](Self::address) names (`[*]` stays a region of `*`);
    /// `None` for anything else.
    pub fn parse(address: &str) -> Option<SharedObject> {
        let rest = address.strip_prefix(PREFIX)?;
        let (rest, region) = match rest.strip_suffix(']') {
            Some(r) => {
                let (head, region) = r.split_once('[')?;
                (head, Some(region.to_string()))
            }
            None => (rest, None),
        };
        let (cloud, kind) = rest.split_once('.')?;
        Some(SharedObject {
            cloud: cloud.to_string(),
            kind: kind.to_string(),
            region,
        })
    }

    /// Where this object's kind comes in its cloud's declaration ([`position`]).
    pub fn position(&self) -> usize {
        position(&self.cloud, &self.kind)
    }

    /// Whether `self` must go before `other` at teardown: `other` is an earlier kind of
    /// the same cloud that `self` may live in (same region, or either is account-wide),
    /// as a key pair lives in its environment.
    pub fn lives_in(&self, other: &SharedObject) -> bool {
        self.cloud == other.cloud
            && other.position() < self.position()
            && match (&self.region, &other.region) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }

    /// Whether a machine at (`cloud`, `region`) uses this object.
    pub fn serves(&self, cloud: &str, region: Option<&str>) -> bool {
        self.cloud == cloud
            && match (&self.region, region) {
                (None, _) => true,
                (Some(mine), Some(r)) => mine == r,
                // A machine whose region is not known yet may land here.
                (Some(_), None) => true,
            }
    }
}

/// The address prefix of shared objects (and of their keys in the state).
pub const PREFIX: &str = "shared.";

/// The shared objects a machine launched at `offer` on `cloud` uses, per [`declared`].
pub fn for_offer(cloud: &str, offer: &Offer) -> Vec<SharedObject> {
    declared(cloud)
        .iter()
        .map(|k| SharedObject {
            cloud: cloud.to_string(),
            kind: k.kind.to_string(),
            region: match k.scope {
                SharedScope::Account => None,
                SharedScope::Region => Some(offer.location.region.clone()),
            },
        })
        .collect()
}

/// A shared object as the cloud shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedFound {
    /// The cloud's id of the object (what `prepare` and `create` send).
    pub id: String,
    /// Its name at the cloud.
    pub name: String,
    /// Whether gpuprov made it for this lineage (it carries the name gpuprov derives):
    /// deleted after the last machine using it. `false`: an object that existed before
    /// gpuprov (the user's own key, found by value): used, never deleted.
    pub ours: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_scopes() {
        let key = SharedObject {
            cloud: "digitalocean".into(),
            kind: "ssh_key".into(),
            region: None,
        };
        assert_eq!(key.address(), "shared.digitalocean.ssh_key");
        assert!(key.serves("digitalocean", Some("tor1")));
        assert!(!key.serves("lambda", None));
        let env = SharedObject {
            region: Some("CANADA-1".into()),
            ..key
        };
        assert_eq!(env.address(), "shared.digitalocean.ssh_key[CANADA-1]");
        assert!(env.serves("digitalocean", Some("CANADA-1")));
        assert!(!env.serves("digitalocean", Some("NORWAY-1")));
        assert_eq!(declared("digitalocean")[0].kind, "ssh_key");
        assert!(declared("docker").is_empty());
    }

    #[test]
    fn hyperstack_declares_its_environment_before_its_key_per_region() {
        let kinds: Vec<_> = declared("hyperstack").iter().map(|k| k.kind).collect();
        assert_eq!(kinds, [ENVIRONMENT, SSH_KEY]);
        assert!(declared("hyperstack")
            .iter()
            .all(|k| k.scope == SharedScope::Region));
        let env = SharedObject {
            cloud: "hyperstack".into(),
            kind: ENVIRONMENT.into(),
            region: Some("CANADA-1".into()),
        };
        let key = SharedObject {
            kind: SSH_KEY.into(),
            ..env.clone()
        };
        assert_eq!(env.address(), "shared.hyperstack.environment[CANADA-1]");
        assert_eq!(SharedObject::parse(&key.address()), Some(key.clone()));
        assert!(key.lives_in(&env));
        assert!(!env.lives_in(&key));
        let norway = SharedObject {
            region: Some("NORWAY-1".into()),
            ..env.clone()
        };
        assert!(!key.lives_in(&norway), "another region's environment");
        let do_key = SharedObject::parse("shared.digitalocean.ssh_key").unwrap();
        assert_eq!(do_key.region, None);
        assert!(!do_key.lives_in(&env));
        assert_eq!(SharedObject::parse("vm.a"), None);
    }
}
