//! Shared prerequisites as graph nodes (issue 21): a fleet applied with full parallelism
//! prepares each shared object exactly once (counted at the cloud), every machine comes
//! up, the user's own key found by value is used and never deleted, and the key gpuprov
//! made goes after the last machine. Against the fake cloud and the spec-checked local
//! servers of the clouds that share a project key (`tests/it/vendor/*.rs`): DigitalOcean,
//! Lambda, RunPod, Verda, Prime Intellect and Massed Compute.

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
use gpuprov::provider::doubles::fake::{FakeConnector, FakeProvider};
use gpuprov::provider::CloudProvider;
use gpuprov::state::StateStore;
use serde_json::json;

const FLEET: usize = 20;

/// `n` machines on `cloud` in `region`.
pub(crate) fn fleet(cloud: &str, region: &str, gpu: Option<&str>, n: usize) -> String {
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
pub(crate) struct Project {
    dir: tempfile::TempDir,
    provider: Arc<dyn CloudProvider>,
    /// The state's lineage; the adapter must be built with it (DigitalOcean tags by it).
    lineage: Option<String>,
    /// `[cloud.NAME] keep_shared = true` for the adapter's cloud.
    keep_shared: std::cell::Cell<bool>,
}

impl Project {
    pub(crate) fn new(provider: Arc<dyn CloudProvider>, lineage: Option<&str>) -> Project {
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
            keep_shared: Default::default(),
        }
    }

    fn engine(&self) -> (Engine, Arc<StateJournal>) {
        let (store, state) = StateStore::open(self.dir.path().join("gpuprov.state.json")).unwrap();
        let lineage = self.lineage.clone().unwrap_or(state.lineage.clone());
        let journal = Arc::new(StateJournal::new(store, state).unwrap());
        let mut providers = Providers::new();
        providers.insert(self.provider.clone());
        if self.keep_shared.get() {
            providers.keep_shared(self.provider.name());
        }
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

    pub(crate) async fn apply(&self, toml: &str) -> BTreeMap<String, Outcome> {
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

pub(crate) fn all_ready(out: &BTreeMap<String, Outcome>, n: usize) {
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

/// `keep_shared = true`: destroying the last droplet leaves the key registered and its
/// record in the state; the next apply uses it without registering again; with the
/// setting off, the next destroy deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kept_key_outlives_the_fleet_and_serves_the_next_apply() {
    let cloud = Cloud2::start(h100_world()).await;
    let p = Project::new(cloud.provider(), Some(crate::support::drive::LINEAGE));
    p.keep_shared.set(true);
    let toml = fleet("digitalocean", "tor1", Some("H100"), 3);
    all_ready(&p.apply(&toml).await, 3);
    let out = p.destroy().await;
    assert!(!out.contains_key("shared.digitalocean.ssh_key"), "{out:?}");
    assert!(cloud.world.lock().unwrap().droplets.is_empty());
    assert_eq!(cloud.world.lock().unwrap().keys.len(), 1, "kept");
    assert!(p.state().shared.contains_key("shared.digitalocean.ssh_key"));

    all_ready(&p.apply(&toml).await, 3);
    assert_eq!(
        cloud.server.requests_to("POST", "/v2/account/keys").len(),
        1,
        "registered once, used by both fleets"
    );
    p.keep_shared.set(false);
    let out = p.destroy().await;
    assert_eq!(out["shared.digitalocean.ssh_key"], Outcome::Destroyed);
    assert!(cloud.world.lock().unwrap().keys.is_empty());
    assert!(p.state().shared.is_empty());
    cloud.server.verify();
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

/// Requests per (method, path with ids as `{id}`) the server saw.
fn tally(server: &crate::support::spec::SpecServer) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for r in server.requests() {
        let path: Vec<String> = r
            .path
            .split('/')
            .map(|s| {
                if !s.is_empty() && s.chars().all(|c| c.is_ascii_digit()) {
                    "{id}".to_string()
                } else {
                    s.to_string()
                }
            })
            .collect();
        *m.entry(format!("{} {}", r.method, path.join("/")))
            .or_insert(0) += 1;
    }
    m
}

/// API requests of a 20-droplet apply on DigitalOcean's local server, before (every
/// machine's `prepare` finds or registers the key itself, as the previous release did:
/// the launch machines run without the run's shared guard) and after (the key is a
/// shared node). Written to `<target>/reliability/shared_objects_requests.json` for
/// BENCHMARKS.md; the key's own requests must drop to two listings and one
/// registration for the fleet.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn digitalocean_requests_per_machine_before_and_after() {
    let vm = |i: usize| {
        let mut v = crate::support::drive::gpu_vm(gpuprov::config::Cloud::Digitalocean, "H100", 1);
        v.name = format!("m{i:02}");
        v.regions = vec!["tor1".into()];
        v
    };
    // Before: each machine prepares its own key.
    let before_cloud = Cloud2::start(h100_world()).await;
    let providers = crate::support::drive::providers(before_cloud.provider());
    let mut launches = tokio::task::JoinSet::new();
    for i in 0..FLEET {
        let (providers, v) = (providers.clone(), vm(i));
        launches.spawn(async move {
            crate::support::drive::launch_across(
                crate::support::drive::LINEAGE,
                &v,
                providers,
                Arc::new(gpuprov::machine::MemoryJournal::new()),
                Arc::new(FakeConnector::default()),
            )
            .await
        });
    }
    let mut before_ready = 0;
    while let Some(r) = launches.join_next().await {
        if matches!(r, Ok(Ok(s)) if s.ready().is_some()) {
            before_ready += 1;
        }
    }
    let before = tally(&before_cloud.server);
    // After: the engine's apply.
    let after_cloud = Cloud2::start(h100_world()).await;
    let p = Project::new(after_cloud.provider(), Some(crate::support::drive::LINEAGE));
    all_ready(
        &p.apply(&fleet("digitalocean", "tor1", Some("H100"), FLEET))
            .await,
        FLEET,
    );
    let after = tally(&after_cloud.server);
    let keys = |t: &BTreeMap<String, usize>| -> usize {
        t.iter()
            .filter(|(k, _)| k.contains("/v2/account/keys"))
            .map(|(_, n)| n)
            .sum()
    };
    let total = |t: &BTreeMap<String, usize>| -> usize { t.values().sum() };
    crate::support::figures::write(
        "shared_objects_requests",
        &json!({
            "machines": FLEET,
            "before": {"ready": before_ready, "total": total(&before), "key_requests": keys(&before), "by_call": before},
            "after": {"ready": FLEET, "total": total(&after), "key_requests": keys(&after), "by_call": after},
        }),
    );
    // Observing lists once, Creating (its intent journalled) observes again before it
    // registers: two listings and one registration for the whole fleet.
    assert_eq!(keys(&after), 3, "{after:?}");
    assert_eq!(after["POST /v2/account/keys"], 1, "{after:?}");
    assert!(
        before["GET /v2/account/keys"] >= FLEET,
        "every machine listed the keys before: {before:?}"
    );
}

/// Lambda: 20 instances in one region with parallelism 20 register the project key once
/// and all come up; the key goes after the last instance. Repeated 20 times. (The
/// documented launch spacing, one per 12 s, is lifted for the test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lambda_fleet_registers_the_key_once_and_deletes_it_after_the_last_instance() {
    use crate::vendor::lambda as lam;
    use gpuprov::provider::clouds::lambda::{ApiKey, LambdaProvider, LambdaSettings};
    for round in 0..20 {
        let cloud = lam::Cloud2::start(lam::h100_world()).await;
        let caps = gpuprov::provider::Capabilities {
            min_create_interval: Duration::ZERO,
            ..crate::support::drive::test_capabilities(LambdaProvider::default_capabilities())
        };
        let provider = Arc::new(
            LambdaProvider::new(LambdaSettings {
                endpoint: Some(cloud.server.uri()),
                api_key: Some(ApiKey::new("secret_lambda_test")),
                lineage: crate::support::drive::LINEAGE.parse().unwrap(),
            })
            .with_capabilities(caps),
        );
        let p = Project::new(provider, Some(crate::support::drive::LINEAGE));
        let mut toml = fleet("lambda", "us-east-1", Some("H100"), FLEET);
        toml = toml.replace("gpu = \"H100\"\n", "gpu = \"H100\"\ngpu_count = 8\n");
        let out = p.apply(&toml).await;
        all_ready(&out, FLEET);
        let posts = cloud.server.requests_to("POST", "/api/v1/ssh-keys");
        assert_eq!(posts.len(), 1, "round {round}: one registration");
        let name = cloud.world.lock().unwrap().keys[0]["name"].clone();
        for l in cloud.launches() {
            assert_eq!(l["ssh_key_names"], json!([name]));
        }
        let out = p.destroy().await;
        assert_eq!(out["shared.lambda.ssh_key"], Outcome::Destroyed, "{out:?}");
        assert!(cloud.world.lock().unwrap().keys.is_empty());
        cloud.server.verify();
    }
}

/// RunPod: the account's key set is written by read-modify-write (`PUT` of the whole
/// set), so 20 pods in one data centre with parallelism 20 must write it exactly once
/// (counted at the server), keep the user's key beside the project key, and all come up;
/// the project key leaves the set after the last pod, the user's stays. Repeated 20 times.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runpod_fleet_writes_the_key_set_once_and_keeps_the_users_key() {
    use crate::vendor::runpod as rp;
    for round in 0..20 {
        let cloud = rp::Fake::start(rp::h100_world()).await;
        let p = Project::new(cloud.provider(), Some(crate::support::drive::LINEAGE));
        let out = p
            .apply(&fleet("runpod", "US-KS-2", Some("H100"), FLEET))
            .await;
        all_ready(&out, FLEET);
        let puts = cloud.server.requests_to("PUT", rp::KEYS);
        assert_eq!(puts.len(), 1, "round {round}: the set written once");
        let keys = cloud.world.lock().unwrap().keys.clone();
        assert_eq!(keys.len(), 2, "{keys:?}");
        assert_eq!(keys[0], rp::USER_KEY, "the user's key survives the merge");
        let project = gpuprov::provider::kit::keys::key_value(PUBKEY);
        assert!(keys[1].starts_with(&project), "{keys:?}");
        let creates = cloud.creates();
        assert_eq!(creates.len(), FLEET);
        for c in creates {
            let env = c["env"]["PUBLIC_KEY"].as_str().unwrap().to_string();
            assert!(
                env.contains(rp::USER_KEY) && env.contains(&project),
                "{env}"
            );
        }
        let out = p.destroy().await;
        assert_eq!(out["shared.runpod.ssh_key"], Outcome::Destroyed, "{out:?}");
        assert_eq!(
            cloud.world.lock().unwrap().keys,
            [rp::USER_KEY],
            "only the project key removed"
        );
        assert_eq!(cloud.server.requests_to("PUT", rp::KEYS).len(), 2);
        assert!(cloud.world.lock().unwrap().pods.is_empty());
        assert!(p.state().shared.is_empty());
        cloud.server.verify();
    }
}

/// RunPod with the project key already in the account's set (the user put it there
/// under their own comment): used by value, the set never written, the key kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runpod_uses_the_users_key_and_never_writes_the_set() {
    use crate::vendor::runpod as rp;
    let users_copy = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGpuprovTestKeyOnly me@laptop";
    for round in 0..20 {
        let mut world = rp::h100_world();
        world.keys.push(users_copy.into());
        let cloud = rp::Fake::start(world).await;
        let p = Project::new(cloud.provider(), Some(crate::support::drive::LINEAGE));
        let out = p
            .apply(&fleet("runpod", "US-KS-2", Some("H100"), FLEET))
            .await;
        all_ready(&out, FLEET);
        assert!(
            cloud.server.requests_to("PUT", rp::KEYS).is_empty(),
            "round {round}: the set is not written"
        );
        for c in cloud.creates() {
            let env = c["env"]["PUBLIC_KEY"].as_str().unwrap().to_string();
            assert!(env.contains(users_copy), "{env}");
        }
        p.destroy().await;
        assert!(cloud.server.requests_to("PUT", rp::KEYS).is_empty(), "kept");
        assert_eq!(cloud.world.lock().unwrap().keys, [rp::USER_KEY, users_copy]);
        assert!(
            p.state().shared.is_empty(),
            "the record goes, the key stays"
        );
        cloud.server.verify();
    }
}

/// `fleet` asking `gpu_count` GPUs per machine (the clouds below list only 8-GPU types or
/// configurations for H100 in the region used).
fn gpu_fleet(cloud: &str, region: &str, gpu: &str, count: u32) -> String {
    fleet(cloud, region, Some(gpu), FLEET).replace(
        &format!("gpu = \"{gpu}\"\n"),
        &format!("gpu = \"{gpu}\"\ngpu_count = {count}\n"),
    )
}

/// Where in the server's log the last request matching `f` is (`None`: no such request).
fn last_index(
    server: &crate::support::spec::SpecServer,
    f: impl Fn(&crate::support::spec::Seen) -> bool,
) -> Option<usize> {
    server.requests().iter().rposition(f)
}

/// Asserts the project key's delete (`DELETE <keys>/<id>`, once) came after the last
/// request that tears a machine down (`teardown`): the key goes after the last machine.
fn key_deleted_after_machines(
    server: &crate::support::spec::SpecServer,
    key_path: &str,
    teardown: impl Fn(&crate::support::spec::Seen) -> bool,
) {
    let deletes = server.requests_to("DELETE", key_path);
    assert_eq!(deletes.len(), 1, "{key_path} deleted once");
    let key = last_index(server, |r| r.method == "DELETE" && r.path == key_path).unwrap();
    let machines = last_index(server, teardown).expect("machines were torn down");
    assert!(key > machines, "the key goes after the last machine");
}

/// The project key as the user registered it themselves: the same value under their own
/// comment (found by value, never by name).
const USERS_COPY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGpuprovTestKeyOnly me@laptop";

/// Lambda's adapter on its local server, the documented launch spacing (one per 12 s)
/// lifted for the test.
fn lambda_provider(
    cloud: &crate::vendor::lambda::Cloud2,
) -> Arc<gpuprov::provider::clouds::lambda::LambdaProvider> {
    use gpuprov::provider::clouds::lambda::{ApiKey, LambdaProvider, LambdaSettings};
    let caps = gpuprov::provider::Capabilities {
        min_create_interval: Duration::ZERO,
        ..crate::support::drive::test_capabilities(LambdaProvider::default_capabilities())
    };
    Arc::new(
        LambdaProvider::new(LambdaSettings {
            endpoint: Some(cloud.server.uri()),
            api_key: Some(ApiKey::new("secret_lambda_test")),
            lineage: crate::support::drive::LINEAGE.parse().unwrap(),
        })
        .with_capabilities(caps),
    )
}

/// Lambda with the project key registered by the user under their own name: used by
/// value (every launch names it), never registered again, never deleted. Repeated 20
/// times.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lambda_uses_the_users_key_and_keeps_it() {
    use crate::vendor::lambda as lam;
    for round in 0..20 {
        let mut world = lam::h100_world();
        world.keys =
            vec![json!({"id": "user-key-1", "name": "my-laptop", "public_key": USERS_COPY})];
        let cloud = lam::Cloud2::start(world).await;
        let p = Project::new(
            lambda_provider(&cloud),
            Some(crate::support::drive::LINEAGE),
        );
        let out = p.apply(&gpu_fleet("lambda", "us-east-1", "H100", 8)).await;
        all_ready(&out, FLEET);
        assert!(
            cloud
                .server
                .requests_to("POST", "/api/v1/ssh-keys")
                .is_empty(),
            "round {round}: not registered again"
        );
        let launches = cloud.launches();
        assert_eq!(launches.len(), FLEET);
        for l in launches {
            assert_eq!(l["ssh_key_names"], json!(["my-laptop"]));
        }
        let out = p.destroy().await;
        assert_eq!(out["shared.lambda.ssh_key"], Outcome::Destroyed, "{out:?}");
        assert_eq!(cloud.world.lock().unwrap().keys.len(), 1, "kept");
        assert!(cloud
            .server
            .requests_to("DELETE", "/api/v1/ssh-keys/user-key-1")
            .is_empty());
        assert!(
            p.state().shared.is_empty(),
            "the record goes, the key stays"
        );
        cloud.server.verify();
    }
}

/// Verda: 20 instances in one location with parallelism 20 register the project key once
/// (`POST /v1/sshkeys` counted at the server), every create names it, all come up, and
/// the key goes after the last instance. Repeated 20 times.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn verda_fleet_registers_the_key_once_and_deletes_it_after_the_last_instance() {
    use crate::vendor::verda as vd;
    for round in 0..20 {
        let cloud = vd::Fake::start(vd::h100_world()).await;
        let p = Project::new(cloud.provider(), Some(crate::support::drive::LINEAGE));
        let out = p.apply(&gpu_fleet("verda", "FIN-01", "H100", 8)).await;
        all_ready(&out, FLEET);
        let posts = cloud.server.requests_to("POST", vd::KEYS);
        assert_eq!(posts.len(), 1, "round {round}: one registration");
        let key_id = cloud.world.lock().unwrap().keys[0]["id"]
            .as_str()
            .unwrap()
            .to_string();
        let creates = cloud.creates();
        assert_eq!(creates.len(), FLEET);
        for c in creates {
            assert_eq!(
                c["ssh_key_ids"],
                json!([key_id]),
                "every instance gets the one key"
            );
        }
        let out = p.destroy().await;
        assert_eq!(out["shared.verda.ssh_key"], Outcome::Destroyed, "{out:?}");
        assert!(cloud.world.lock().unwrap().keys.is_empty());
        assert_eq!(cloud.world.lock().unwrap().live(), 0);
        key_deleted_after_machines(&cloud.server, &format!("{}/{key_id}", vd::KEYS), |r| {
            r.method == "PUT" && r.path == vd::INSTANCES
        });
        assert!(p.state().shared.is_empty());
        cloud.server.verify();
    }
}

/// Verda with the project key registered by the user under their own name: used by
/// value, never registered again, never deleted. Repeated 20 times.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn verda_uses_the_users_key_and_keeps_it() {
    use crate::vendor::verda as vd;
    for round in 0..20 {
        let mut world = vd::h100_world();
        world.keys = vec![json!({"id": "user-key-1", "name": "my-laptop", "key": USERS_COPY})];
        let cloud = vd::Fake::start(world).await;
        let p = Project::new(cloud.provider(), Some(crate::support::drive::LINEAGE));
        let out = p.apply(&gpu_fleet("verda", "FIN-01", "H100", 8)).await;
        all_ready(&out, FLEET);
        assert!(
            cloud.server.requests_to("POST", vd::KEYS).is_empty(),
            "round {round}: not registered again"
        );
        let creates = cloud.creates();
        assert_eq!(creates.len(), FLEET);
        for c in creates {
            assert_eq!(c["ssh_key_ids"], json!(["user-key-1"]));
        }
        let out = p.destroy().await;
        assert_eq!(out["shared.verda.ssh_key"], Outcome::Destroyed, "{out:?}");
        assert_eq!(cloud.world.lock().unwrap().keys.len(), 1, "kept");
        assert!(cloud
            .server
            .requests()
            .iter()
            .all(|r| !(r.method == "DELETE" && r.path.starts_with(vd::KEYS))));
        assert_eq!(cloud.world.lock().unwrap().live(), 0);
        assert!(
            p.state().shared.is_empty(),
            "the record goes, the key stays"
        );
        cloud.server.verify();
    }
}

/// Prime Intellect: 20 pods in one data centre with parallelism 20 upload the project
/// key once (`POST /api/v1/ssh_keys/` counted at the server), every pod names it, all come
/// up, and the key goes after the last pod. Repeated 20 times.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn primeintellect_fleet_uploads_the_key_once_and_deletes_it_after_the_last_pod() {
    use crate::vendor::primeintellect as pi;
    for round in 0..20 {
        let cloud = pi::Fake::start(pi::h100_world()).await;
        let p = Project::new(cloud.provider(), Some(crate::support::drive::LINEAGE));
        let out = p
            .apply(&gpu_fleet("primeintellect", "CANADA-1", "H100", 8))
            .await;
        all_ready(&out, FLEET);
        let posts = cloud.server.requests_to("POST", pi::KEYS);
        assert_eq!(posts.len(), 1, "round {round}: one upload");
        let key_id = cloud.world.lock().unwrap().keys[0]["id"]
            .as_str()
            .unwrap()
            .to_string();
        let creates = cloud.creates();
        assert_eq!(creates.len(), FLEET);
        for c in creates {
            assert_eq!(
                c["pod"]["sshKeyId"],
                json!(key_id),
                "every pod gets the one key"
            );
        }
        let out = p.destroy().await;
        assert_eq!(
            out["shared.primeintellect.ssh_key"],
            Outcome::Destroyed,
            "{out:?}"
        );
        assert!(cloud.world.lock().unwrap().keys.is_empty());
        assert_eq!(cloud.world.lock().unwrap().live(), 0);
        key_deleted_after_machines(&cloud.server, &format!("{}{key_id}", pi::KEYS), |r| {
            r.method == "DELETE" && r.path.starts_with(pi::PODS)
        });
        assert!(p.state().shared.is_empty());
        cloud.server.verify();
    }
}

/// Prime Intellect with the project key uploaded by the user under their own name: used
/// by value, never uploaded again, never deleted. Repeated 20 times.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn primeintellect_uses_the_users_key_and_keeps_it() {
    use crate::vendor::primeintellect as pi;
    for round in 0..20 {
        let mut world = pi::h100_world();
        world.keys = vec![json!({
            "id": "user-key-1", "userId": "u-1", "name": "my-laptop", "publicKey": USERS_COPY,
            "isPrimary": true, "isUserKey": true
        })];
        let cloud = pi::Fake::start(world).await;
        let p = Project::new(cloud.provider(), Some(crate::support::drive::LINEAGE));
        let out = p
            .apply(&gpu_fleet("primeintellect", "CANADA-1", "H100", 8))
            .await;
        all_ready(&out, FLEET);
        assert!(
            cloud.server.requests_to("POST", pi::KEYS).is_empty(),
            "round {round}: not uploaded again"
        );
        let creates = cloud.creates();
        assert_eq!(creates.len(), FLEET);
        for c in creates {
            assert_eq!(c["pod"]["sshKeyId"], json!("user-key-1"));
        }
        let out = p.destroy().await;
        assert_eq!(
            out["shared.primeintellect.ssh_key"],
            Outcome::Destroyed,
            "{out:?}"
        );
        assert_eq!(cloud.world.lock().unwrap().keys.len(), 1, "kept");
        assert!(cloud
            .server
            .requests()
            .iter()
            .all(|r| !(r.method == "DELETE" && r.path.starts_with(pi::KEYS))));
        assert_eq!(cloud.world.lock().unwrap().live(), 0);
        assert!(
            p.state().shared.is_empty(),
            "the record goes, the key stays"
        );
        cloud.server.verify();
    }
}

/// Massed Compute: 20 machines pinned to one region with parallelism 20 register the
/// project key once (`POST /api/v1/ssh-keys` counted at the server) under the derived
/// name with spaces, every launch names it, all come up, and the key goes after the last
/// machine. Repeated 20 times.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn massedcompute_fleet_registers_the_key_once_and_deletes_it_after_the_last_machine() {
    use crate::vendor::massedcompute as mc;
    let name = gpuprov::provider::project_key_name(crate::support::drive::LINEAGE, PUBKEY)
        .replace('-', " ");
    for round in 0..20 {
        let cloud = mc::Fake::start(mc::h100_world()).await;
        let p = Project::new(cloud.provider(), Some(crate::support::drive::LINEAGE));
        let out = p
            .apply(&gpu_fleet("massedcompute", "us-central-1", "H100", 8))
            .await;
        all_ready(&out, FLEET);
        let posts = cloud.server.requests_to("POST", mc::KEYS);
        assert_eq!(posts.len(), 1, "round {round}: one registration");
        let key = cloud.world.lock().unwrap().keys[0].clone();
        assert_eq!(key["name"], json!(name));
        let launches = cloud.launches();
        assert_eq!(launches.len(), FLEET);
        for l in launches {
            assert_eq!(
                l["sshKeys"],
                json!([name]),
                "every machine gets the one key"
            );
        }
        let out = p.destroy().await;
        assert_eq!(
            out["shared.massedcompute.ssh_key"],
            Outcome::Destroyed,
            "{out:?}"
        );
        assert!(cloud.world.lock().unwrap().keys.is_empty());
        assert_eq!(cloud.world.lock().unwrap().live(), 0);
        let path = format!("{}/{}", mc::KEYS, key["id"].as_str().unwrap());
        key_deleted_after_machines(&cloud.server, &path, |r| {
            r.method == "POST" && r.path == mc::TERMINATE
        });
        assert!(p.state().shared.is_empty());
        cloud.server.verify();
    }
}

/// Massed Compute with the project key registered by the user under their own name:
/// used by value (the launches name it), never registered again, never deleted.
/// Repeated 20 times.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn massedcompute_uses_the_users_key_and_keeps_it() {
    use crate::vendor::massedcompute as mc;
    for round in 0..20 {
        let mut world = mc::h100_world();
        world.keys =
            vec![json!({"id": "user-key-1", "name": "my laptop", "public_key": USERS_COPY})];
        let cloud = mc::Fake::start(world).await;
        let p = Project::new(cloud.provider(), Some(crate::support::drive::LINEAGE));
        let out = p
            .apply(&gpu_fleet("massedcompute", "us-central-1", "H100", 8))
            .await;
        all_ready(&out, FLEET);
        assert!(
            cloud.server.requests_to("POST", mc::KEYS).is_empty(),
            "round {round}: not registered again"
        );
        let launches = cloud.launches();
        assert_eq!(launches.len(), FLEET);
        for l in launches {
            assert_eq!(l["sshKeys"], json!(["my laptop"]));
        }
        let out = p.destroy().await;
        assert_eq!(
            out["shared.massedcompute.ssh_key"],
            Outcome::Destroyed,
            "{out:?}"
        );
        assert_eq!(cloud.world.lock().unwrap().keys.len(), 1, "kept");
        assert!(cloud
            .server
            .requests()
            .iter()
            .all(|r| !(r.method == "DELETE" && r.path.starts_with(mc::KEYS))));
        assert_eq!(cloud.world.lock().unwrap().live(), 0);
        assert!(
            p.state().shared.is_empty(),
            "the record goes, the key stays"
        );
        cloud.server.verify();
    }
}

/// Verda refuses a key registration with its only documented refusal (`invalid_request`:
/// the description has no conflict answer), as when the key was registered meanwhile:
/// the shared node observes again and registers (or adopts) it; no machine fails and no
/// offer is given up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn verda_a_refused_key_registration_is_observed_again_not_a_failed_offer() {
    use crate::support::spec::Canned;
    use crate::vendor::verda as vd;
    let cloud = vd::Fake::start(vd::h100_world()).await;
    cloud.world.lock().unwrap().faults.push(
        "POST",
        vd::KEYS,
        Canned::status(400, vd::err("invalid_request", "SSH key already exists")),
    );
    let p = Project::new(cloud.provider(), Some(crate::support::drive::LINEAGE));
    let toml = fleet("verda", "FIN-01", Some("H100"), 3)
        .replace("gpu = \"H100\"\n", "gpu = \"H100\"\ngpu_count = 8\n");
    let out = p.apply(&toml).await;
    all_ready(&out, 3);
    assert_eq!(
        cloud.server.requests_to("POST", vd::KEYS).len(),
        2,
        "refused once, then registered"
    );
    assert_eq!(cloud.world.lock().unwrap().keys.len(), 1);
    assert_eq!(cloud.creates().len(), 3, "every offer kept");
    p.destroy().await;
    assert!(cloud.world.lock().unwrap().keys.is_empty());
    cloud.server.verify();
}

// Hyperstack: an environment and a key pair per region (the key pair lives in the
// environment), both shared objects prepared in that order and released the other way.

/// 20 Hyperstack VMs (8 × H100) in CANADA-1.
fn hyperstack_fleet() -> String {
    fleet("hyperstack", "CANADA-1", Some("H100"), FLEET)
        .replace("gpu = \"H100\"\n", "gpu = \"H100\"\ngpu_count = 8\n")
}

/// The paths of the `DELETE`s the server saw that were not VM deletes, in order.
fn hyperstack_shared_deletes(server: &crate::support::spec::SpecServer) -> Vec<String> {
    server
        .requests()
        .into_iter()
        .filter(|r| r.method == "DELETE" && !r.path.starts_with(crate::vendor::hyperstack::VMS))
        .map(|r| r.path)
        .collect()
}

/// Hyperstack: 20 VMs in one region with parallelism 20 create the project's environment
/// and key pair exactly once each (counted at the spec-checked server), all come up in
/// that environment with that key pair, and both go after the last VM, the key pair
/// before its environment. Repeated 20 times.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hyperstack_fleet_creates_environment_and_key_once_and_deletes_both_last() {
    use crate::vendor::hyperstack as hs;
    const ENV: &str = "shared.hyperstack.environment[CANADA-1]";
    const KEY: &str = "shared.hyperstack.ssh_key[CANADA-1]";
    for round in 0..20 {
        let cloud = hs::Fake::start(hs::h100_world()).await;
        let p = Project::new(cloud.provider(), Some(crate::support::drive::LINEAGE));
        let out = p.apply(&hyperstack_fleet()).await;
        all_ready(&out, FLEET);
        let server = &cloud.server;
        assert_eq!(
            server.requests_to("POST", "/v1/core/environments").len(),
            1,
            "round {round}: one environment"
        );
        assert_eq!(
            server.requests_to("POST", "/v1/core/keypairs").len(),
            1,
            "round {round}: one key pair"
        );
        assert_eq!(
            p.state().shared.keys().collect::<Vec<_>>(),
            [ENV, KEY],
            "journalled as resources of their own"
        );
        let key = cloud.world.lock().unwrap().keypairs[0]["name"].clone();
        let creates = cloud.creates();
        assert_eq!(creates.len(), FLEET);
        for c in creates {
            assert_eq!(c["environment_name"], hs::ENV_CA);
            assert_eq!(c["key_name"], key, "every VM gets the one key pair");
        }
        // Destroying one VM keeps both for the others.
        let (engine, journal) = p.engine();
        let out = engine.destroy(&["vm.m00".to_string()]).await;
        journal.save_final().unwrap();
        assert_eq!(out.len(), 1, "both stay while VMs use them: {out:?}");
        assert!(hyperstack_shared_deletes(server).is_empty());
        let out = p.destroy().await;
        assert_eq!(out[KEY], Outcome::Destroyed, "{out:?}");
        assert_eq!(out[ENV], Outcome::Destroyed, "{out:?}");
        let deletes = hyperstack_shared_deletes(server);
        assert_eq!(deletes.len(), 2, "{deletes:?}");
        assert!(
            deletes[0].starts_with("/v1/core/keypair/")
                && deletes[1].starts_with("/v1/core/environments/"),
            "the key pair before the environment it lives in: {deletes:?}"
        );
        {
            let w = cloud.world.lock().unwrap();
            assert!(w.environments.is_empty() && w.keypairs.is_empty());
            assert!(w.vms.iter().all(|v| v["status"] == "DELETED"));
        }
        assert!(p.state().shared.is_empty());
        server.verify();
    }
}

/// Hyperstack with the project key already imported by the user into the project's
/// environment, under their own name: the key pair is used by value, never imported,
/// never deleted, and the environment that holds it is used and kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hyperstack_uses_the_users_key_pair_and_keeps_it_and_its_environment() {
    use crate::vendor::hyperstack as hs;
    let users_copy = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGpuprovTestKeyOnly me@laptop";
    for round in 0..20 {
        let mut world = hs::h100_world();
        world.environments = vec![hs::env_json(2, hs::ENV_CA, "CANADA-1")];
        world.keypairs = vec![hs::keypair(3, "my-laptop", users_copy, hs::ENV_CA)];
        world.next = 10;
        let cloud = hs::Fake::start(world).await;
        let p = Project::new(cloud.provider(), Some(crate::support::drive::LINEAGE));
        let out = p.apply(&hyperstack_fleet()).await;
        all_ready(&out, FLEET);
        let server = &cloud.server;
        assert!(
            server.requests_to("POST", "/v1/core/keypairs").is_empty(),
            "round {round}: never imported"
        );
        assert!(server
            .requests_to("POST", "/v1/core/environments")
            .is_empty());
        for c in cloud.creates() {
            assert_eq!(c["key_name"], "my-laptop");
            assert_eq!(c["environment_name"], hs::ENV_CA);
        }
        let out = p.destroy().await;
        assert!(
            out.iter()
                .filter(|(a, _)| a.starts_with("shared."))
                .all(|(_, o)| *o == Outcome::Destroyed),
            "the records go: {out:?}"
        );
        assert!(
            hyperstack_shared_deletes(server).is_empty(),
            "neither deleted"
        );
        {
            let w = cloud.world.lock().unwrap();
            assert_eq!(w.keypairs.len(), 1);
            assert_eq!(w.keypairs[0]["name"], "my-laptop");
            assert_eq!(w.environments.len(), 1);
        }
        assert!(p.state().shared.is_empty(), "the records go, both stay");
        server.verify();
    }
}
