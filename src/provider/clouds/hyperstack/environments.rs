//! The project's shared objects on Hyperstack, both per region: its environment
//! `gpuprov-<lineage8>-<region>` and, inside it, the key pair holding the project key.

use serde_json::json;

use super::api::{label, Environment, EnvironmentResponse, Keypair, KeypairResponse, Vm};
use super::{errors, invalid, HyperstackProvider, CLOUD, MAX_NAME_LEN};
use crate::provider::kit::keys::{self, KeyListing, ListedKey};
use crate::provider::kit::Call;
use crate::provider::{project_key_name, Lineage, Result, SharedObject, LINEAGE_LABEL};
use reqwest::Method;

impl HyperstackProvider {
    /// The project's environment in `region`: `gpuprov-<lineage8>-<region, lowercase>`,
    /// cut to [`MAX_NAME_LEN`].
    pub fn environment_name(lineage: &Lineage, region: &str) -> String {
        let mut n = format!("gpuprov-{}-{}", lineage.short(), region.to_lowercase());
        n.truncate(MAX_NAME_LEN);
        n
    }

    /// The project's environment in `region` ([`Self::environment_name`]), `None` when
    /// missing. Errors: an environment of that name in another region →
    /// `InvalidRequest` (names are unique per account, so it cannot be made here).
    pub(super) async fn find_environment(&self, region: &str) -> Result<Option<Environment>> {
        let name = Self::environment_name(&self.settings.lineage, region);
        let envs: Vec<Environment> = self
            .list_all(
                "/core/environments",
                &[("search", name.clone())],
                "environments",
                "list environments",
            )
            .await?;
        if let Some(e) = envs.iter().find(|e| e.name == name && e.region == region) {
            return Ok(Some(e.clone()));
        }
        if let Some(other) = envs.iter().find(|e| e.name == name) {
            return Err(invalid(format!(
                "a Hyperstack environment named {name} exists in region {} instead of {region}",
                other.region
            )));
        }
        Ok(None)
    }

    /// `POST /core/environments` of the project's environment in `region`. A `409` is
    /// `Exists` (errors.rs): made meanwhile.
    pub(super) async fn create_environment(&self, region: &str) -> Result<Environment> {
        let name = Self::environment_name(&self.settings.lineage, region);
        let body = json!({ "name": name, "region": region });
        let what = format!("create environment {name} in {region}");
        let call = || Call::named(errors::CREATE_SHARED, &what);
        let v = self
            .api
            .send(Method::POST, "/core/environments", &[], Some(&body))
            .await
            .map_err(|f| self.api.fail(&f, call()))?;
        let created: EnvironmentResponse = self.api.parse(v, call())?;
        Ok(created.environment)
    }

    /// The key pairs of environment `env` (`GET /core/keypairs`, every page, filtered on
    /// `environment.name`: the list takes no environment filter).
    pub(super) async fn keypairs_in(&self, env: &str) -> Result<Vec<Keypair>> {
        let all: Vec<Keypair> = self
            .list_all("/core/keypairs", &[], "keypairs", "list key pairs")
            .await?;
        Ok(all
            .into_iter()
            .filter(|k| k.environment.as_ref().is_some_and(|e| e.name == env))
            .collect())
    }

    /// Whether `name` is a key pair name gpuprov gives `public_key` in this lineage:
    /// [`project_key_name`] or its `-2`, `-3`, … ([`keys::is_derived_name`]).
    pub(super) fn is_project_key_name(&self, name: &str, public_key: &str) -> bool {
        let base = project_key_name(self.settings.lineage.as_str(), public_key);
        keys::is_derived_name(name, &base, '-')
    }

    /// Whether environment `env` holds only what gpuprov put there for this lineage:
    /// key pairs named as [`Self::is_project_key_name`] says and VMs labelled with the
    /// lineage. One holding anything else (the user's own key pair, a VM made by hand)
    /// is not gpuprov's to delete.
    pub(super) async fn holds_only_ours(&self, env: &str, public_key: &str) -> Result<bool> {
        let keys = self.keypairs_in(env).await?;
        if keys
            .iter()
            .any(|k| !self.is_project_key_name(&k.name, public_key))
        {
            return Ok(false);
        }
        let vms: Vec<Vm> = self
            .list_all(
                "/core/virtual-machines",
                &[
                    ("environment", env.to_string()),
                    ("exact_environment_match", "true".to_string()),
                ],
                "instances",
                "list VMs",
            )
            .await?;
        let lineage = label(LINEAGE_LABEL, self.settings.lineage.as_str());
        Ok(vms
            .iter()
            .all(|v| v.status.eq_ignore_ascii_case("DELETED") || v.labels.contains(&lineage)))
    }

    /// The region of a region-scoped shared object. Errors: none given → `InvalidRequest`.
    pub(super) fn region_of(obj: &SharedObject) -> Result<&str> {
        obj.region
            .as_deref()
            .filter(|r| !r.is_empty() && *r != "*")
            .ok_or_else(|| invalid(format!("{} has no region", obj.address())))
    }

    /// The key pairs of environment `env` read for the project key `public_key` (names
    /// are unique), with the names Hyperstack refused in this run (a `409` on import)
    /// listed as taken: never found by value, skipped by the next free name.
    pub(super) async fn key_listing(&self, env: &str, public_key: &str) -> Result<KeyListing> {
        let listed = self.keypairs_in(env).await?.into_iter();
        let mut keys: Vec<ListedKey> = listed
            .map(|k| {
                let id = k.id.map(|i| i.to_string()).unwrap_or_default();
                ListedKey::new(id, k.name, k.public_key)
            })
            .collect();
        let refused = self.refused_names.lock().unwrap_or_else(|e| e.into_inner());
        let taken = refused.iter().filter(|(e, _)| e == env);
        keys.extend(taken.map(|(_, name)| ListedKey::new("", name.clone(), String::new())));
        drop(refused);
        Ok(KeyListing::new(
            CLOUD,
            self.settings.lineage.as_str(),
            public_key,
            keys,
        ))
    }

    /// Imports the project key into environment `env` (`POST /core/keypairs`, one call) as
    /// [`project_key_name`], or its first free `-2`, `-3` when a key pair of another value
    /// holds the name ([`KeyListing::name_to_register`]; the old `gpuprov-<lineage8>` and
    /// a derived name of another value are never used).
    ///
    /// Errors: a key pair of this value already in `env` → `Exists`; a `409` (Hyperstack
    /// refuses a name already taken; the description says only "Conflict") → `Exists`
    /// (errors.rs), and the name is remembered as taken: the core observes again (a concurrent run may have imported
    /// the same key) and the next create moves on to the next name.
    pub(super) async fn import_key(&self, env: &str, public_key: &str) -> Result<Keypair> {
        let name = self
            .key_listing(env, public_key)
            .await?
            .name_to_register()?;
        let body = json!({
            "environment_name": env,
            "name": name,
            "public_key": public_key.trim(),
        });
        let what = format!("import key pair {name} into {env}");
        match self
            .api
            .send(Method::POST, "/core/keypairs", &[], Some(&body))
            .await
        {
            Ok(v) => {
                let created: KeypairResponse = self.api.parse(v, Call::other(&what))?;
                Ok(created.keypair)
            }
            Err(f) => {
                if f.http_status() == Some(409) {
                    let mut r = self.refused_names.lock().unwrap_or_else(|e| e.into_inner());
                    r.push((env.to_string(), name));
                }
                Err(self.api.fail(&f, Call::named(errors::CREATE_SHARED, &what)))
            }
        }
    }
}
