//! Shared prerequisites as graph nodes (issue 21): a fleet applied with full parallelism
//! prepares each shared object exactly once (counted at the cloud), every machine comes
//! up, the user's own key found by value is used and never deleted, and the key gpuprov
//! made goes after the last machine. Against the fake cloud and DigitalOcean's
//! spec-checked local server (`tests/it/vendor/digitalocean.rs`).

use crate::support::drive::PUBKEY;
use crate::vendor::digitalocean::{h100_world, Cloud2};

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gpuprov::config::Config;
use gpuprov::engine::{Engine, Outcome, StateJournal};
use gpuprov::machine::{CancelToken, Executor, Providers};
use gpuprov::plan;
use gpuprov::provider::fake::{FakeConnector, FakeProvider};
use gpuprov::provider::CloudProvider;
use gpuprov::state::StateStore;
use serde_json::json;

const FLEET: usize = 20;

/// `n` machines on `cloud` in `region`.
fn fleet(cloud: &str, region: &str, gpu: Option<&str>, n: usize) -> String {
    let mut t = format!("[defaults]\nclouds = [\"{cloud}\"]\nregions = [\"{region}\"]\n");
    if let Some(g) = gpu {
        t.push_str(&format!("gpu = \"{g}\"\n"));
    }
    for i in 0..n {
        t.push_str(&format!("[vm.m{i:02}]\n"));
    }
    t
}

/// One project: a state file in a temp dir and the adapter under test.
struct Project {
    dir: tempfile::TempDir,
    provider: Arc<dyn CloudProvider>,
    /// The state's lineage; the adapter must be built with it (DigitalOcean tags by it).
    lineage: Option<String>,
}

impl Project {
    fn new(provider: Arc<dyn CloudProvider>, lineage: Option<&str>) -> Project {
        let dir = tempfile::tempdir().unwrap();
        if let Some(l) = lineage {
            let (mut store, mut st) =
                StateStore::open(dir.path().join("gpuprov.state.json")).unwrap();
            st.lineage = l.to_string();
            store.save(&mut st).unwrap();
        }
        Project {
            dir,
            provider,
            lineage: lineage.map(str::to_string),
        }
    }

    fn engine(&self) -> (Engine, Arc<StateJournal>) {
        let (store, state) = StateStore::open(self.dir.path().join("gpuprov.state.json")).unwrap();
        let lineage = self.lineage.clone().unwrap_or(state.lineage.clone());
        let journal = Arc::new(StateJournal::new(store, state).unwrap());
        let mut providers = Providers::new();
        providers.insert(self.provider.clone());
        let engine = Engine {
            providers,
            connector: Arc::new(FakeConnector::default()),
            journal: journal.clone(),
            executor: Executor::new(journal.clone(), CancelToken::new()),
            lineage,
            ssh_public_key: PUBKEY.into(),
            parallelism: FLEET,
            retry_until_up: false,
            k3s: None,
        };
        (engine, journal)
    }

    async fn apply(&self, toml: &str) -> BTreeMap<String, Outcome> {
        let config = Config::parse(Path::new("gpuprov.toml"), toml.to_string()).unwrap();
        let (engine, journal) = self.engine();
        let plan = plan::compute(&config, &journal.snapshot(), None, &|_| Some(1.0)).unwrap();
        let out = tokio::time::timeout(Duration::from_secs(60), engine.apply(&plan))
            .await
            .expect("no hang");
        journal.save_final().unwrap();
        out
    }

    async fn destroy(&self) -> BTreeMap<String, Outcome> {
        let (engine, journal) = self.engine();
        let addresses: Vec<String> = journal.snapshot().resources.keys().cloned().collect();
        let out = tokio::time::timeout(Duration::from_secs(60), engine.destroy(&addresses))
            .await
            .expect("no hang");
        journal.save_final().unwrap();
        out
    }

    fn state(&self) -> gpuprov::state::StateFile {
        StateStore::open(self.dir.path().join("gpuprov.state.json"))
            .unwrap()
            .1
    }
}

fn all_ready(out: &BTreeMap<String, Outcome>, n: usize) {
    let ready = out
        .iter()
        .filter(|(a, o)| a.starts_with("vm.") && matches!(o, Outcome::Ready(_)))
        .count();
    assert_eq!(ready, n, "{out:?}");
}

fn fake_cloud(user_key: Option<&str>) -> Arc<FakeProvider> {
    Arc::new(
        FakeProvider::new("aws")
            .with_offer("east", "us-east-1", "p5.48xlarge", 98.0)
            // Real round trips, so the machines overlap at the shared key.
            .with_latency(Duration::from_millis(2))
            .with_shared_key(user_key),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleet_on_the_fake_creates_the_shared_key_once_and_releases_it_last() {
    for round in 0..20 {
        let cloud = fake_cloud(None);
        let p = Project::new(cloud.clone(), None);
        let out = p.apply(&fleet("aws", "us-east-1", None, FLEET)).await;
        all_ready(&out, FLEET);
        assert_eq!(cloud.shared_counts(), (1, 0), "round {round}: created once");
        let st = p.state();
        assert_eq!(
            st.shared.keys().collect::<Vec<_>>(),
            ["shared.aws.ssh_key"],
            "journalled as its own resource"
        );
        // Destroying some machines keeps the key for the others.
        let (engine, journal) = p.engine();
        let out = engine.destroy(&["vm.m00".to_string()]).await;
        journal.save_final().unwrap();
        assert_eq!(out.len(), 1, "the key stays while machines use it: {out:?}");
        assert_eq!(cloud.shared_keys().len(), 1);
        let out = p.destroy().await;
        assert_eq!(out["shared.aws.ssh_key"], Outcome::Destroyed, "{out:?}");
        assert_eq!(
            cloud.shared_counts(),
            (1, 1),
            "deleted after the last machine"
        );
        assert!(p.state().shared.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_users_key_found_by_value_is_used_and_never_deleted() {
    let cloud = fake_cloud(Some(PUBKEY));
    let p = Project::new(cloud.clone(), None);
    let out = p.apply(&fleet("aws", "us-east-1", None, FLEET)).await;
    all_ready(&out, FLEET);
    assert_eq!(cloud.shared_counts(), (0, 0), "not registered again");
    p.destroy().await;
    assert_eq!(cloud.shared_counts(), (0, 0), "never deleted");
    assert_eq!(cloud.shared_keys()[0].1, "my-laptop");
    assert!(
        p.state().shared.is_empty(),
        "the record goes, the key stays"
    );
}

/// DigitalOcean: the reproducer. 20 droplets in one region with parallelism 20
/// register the project key once (`POST /v2/account/keys` counted at the server), all
/// come up, and the key goes with the last droplet; repeated 20 times.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn digitalocean_fleet_registers_the_key_once_and_deletes_it_after_the_last_droplet() {
    for round in 0..20 {
        let cloud = Cloud2::start(h100_world()).await;
        let p = Project::new(cloud.provider(), Some(crate::support::drive::LINEAGE));
        let out = p
            .apply(&fleet("digitalocean", "tor1", Some("H100"), FLEET))
            .await;
        all_ready(&out, FLEET);
        let posts = cloud.server.requests_to("POST", "/v2/account/keys");
        assert_eq!(posts.len(), 1, "round {round}: one registration");
        let key_id = cloud.world.lock().unwrap().keys[0]["id"].clone();
        for c in cloud.creates() {
            assert_eq!(
                c["ssh_keys"],
                json!([key_id]),
                "every droplet gets the one key"
            );
        }
        let out = p.destroy().await;
        assert_eq!(
            out["shared.digitalocean.ssh_key"],
            Outcome::Destroyed,
            "{out:?}"
        );
        assert!(cloud.world.lock().unwrap().keys.is_empty());
        assert!(cloud.world.lock().unwrap().droplets.is_empty());
        cloud.server.verify();
    }
}

/// DigitalOcean with the project key registered by the user under their own name: used
/// by value, never registered again, never deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn digitalocean_uses_the_users_key_and_keeps_it() {
    for _ in 0..20 {
        let mut world = h100_world();
        world.keys = vec![json!({
            "id": 42, "fingerprint": "cc", "name": "my-laptop",
            "public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGpuprovTestKeyOnly me@laptop"
        })];
        let cloud = Cloud2::start(world).await;
        let p = Project::new(cloud.provider(), Some(crate::support::drive::LINEAGE));
        let out = p
            .apply(&fleet("digitalocean", "tor1", Some("H100"), FLEET))
            .await;
        all_ready(&out, FLEET);
        assert!(cloud
            .server
            .requests_to("POST", "/v2/account/keys")
            .is_empty());
        for c in cloud.creates() {
            assert_eq!(c["ssh_keys"], json!([42]));
        }
        p.destroy().await;
        assert_eq!(cloud.world.lock().unwrap().keys.len(), 1, "kept");
        assert!(cloud
            .server
            .requests_to("DELETE", "/v2/account/keys/42")
            .is_empty());
        cloud.server.verify();
    }
}

/// A state written by the previous release (its machines up, the key registered by
/// their `prepare`, no record of it): it loads, apply changes nothing, and destroy
/// adopts the key by identity (its derived name) and deletes it after the last droplet.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_previous_release_state_adopts_its_key_by_identity() {
    let cloud = Cloud2::start(h100_world()).await;
    let p = Project::new(cloud.provider(), Some(crate::support::drive::LINEAGE));
    let toml = fleet("digitalocean", "tor1", Some("H100"), 3);
    all_ready(&p.apply(&toml).await, 3);
    // What the previous release wrote: no `shared` records.
    let path = p.dir.path().join("gpuprov.state.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("shared");
    std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    assert!(p.state().shared.is_empty());
    let out = p.apply(&toml).await;
    assert!(
        out.values().all(|o| *o == Outcome::Unchanged),
        "nothing to do: {out:?}"
    );
    let out = p.destroy().await;
    assert_eq!(out["shared.digitalocean.ssh_key"], Outcome::Destroyed);
    assert!(cloud.world.lock().unwrap().keys.is_empty());
    assert!(p.state().shared.is_empty());
}
