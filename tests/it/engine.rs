//! Engine tests: plans applied through the state-file journal against the FakeProvider:
//! dependency ordering on apply and destroy, a failed dependency skipping its dependents,
//! durability of each transition, and a leaked teardown kept in the state until resolved.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gpuprov::config::Config;
use gpuprov::engine::{Engine, Outcome, StateJournal};
use gpuprov::machine::Providers;
use gpuprov::machine::{CancelToken, Executor};
use gpuprov::plan::{self, Action};
use gpuprov::provider::doubles::fake::{FakeConnector, FakeProvider, Op};
use gpuprov::provider::{ErrorKind, ProviderError};
use gpuprov::state::StateStore;

struct Setup {
    dir: tempfile::TempDir,
    cloud: Arc<FakeProvider>,
}

impl Setup {
    fn new(cloud: FakeProvider) -> Setup {
        Setup {
            dir: tempfile::tempdir().unwrap(),
            cloud: Arc::new(cloud),
        }
    }

    fn engine(&self) -> (Engine, Arc<StateJournal>) {
        let (store, state) = StateStore::open(self.dir.path().join("gpuprov.state.json")).unwrap();
        let lineage = state.lineage.clone();
        let journal = Arc::new(StateJournal::new(store, state).unwrap());
        let mut providers = Providers::new();
        providers.insert(self.cloud.clone());
        let engine = Engine {
            providers,
            connector: Arc::new(FakeConnector::default()),
            journal: journal.clone(),
            executor: Executor::new(journal.clone(), CancelToken::new()),
            lineage,
            ssh_public_key: "ssh-ed25519 AAAAtest".into(),
            parallelism: 4,
            retry_until_up: false,
            k3s: None,
        };
        (engine, journal)
    }

    async fn apply(&self, toml: &str) -> std::collections::BTreeMap<String, Outcome> {
        let config = Config::parse(Path::new("gpuprov.toml"), toml.to_string()).unwrap();
        let (engine, journal) = self.engine();
        let plan = plan::compute(&config, &journal.snapshot(), None, &|_| Some(1.0)).unwrap();
        let out = tokio::time::timeout(Duration::from_secs(30), engine.apply(&plan))
            .await
            .expect("no hang");
        journal.save_final().unwrap();
        out
    }

    async fn destroy(&self) -> std::collections::BTreeMap<String, Outcome> {
        let (engine, journal) = self.engine();
        let addresses: Vec<String> = journal.snapshot().resources.keys().cloned().collect();
        let out = tokio::time::timeout(Duration::from_secs(30), engine.destroy(&addresses))
            .await
            .expect("no hang");
        journal.save_final().unwrap();
        out
    }

    fn on_disk(&self) -> gpuprov::state::StateFile {
        StateStore::open(self.dir.path().join("gpuprov.state.json"))
            .unwrap()
            .1
    }
}

const TWO: &str = "[defaults]\nclouds = [\"aws\"]\n[vm.db]\n[vm.web]\ndepends_on = [\"db\"]\n";

fn cloud() -> FakeProvider {
    FakeProvider::new("aws")
        .with_offer("east", "us-east-1", "p5.48xlarge", 98.0)
        .with_offer("west", "us-west-2", "p5.48xlarge", 98.0)
}

#[tokio::test]
async fn apply_creates_dependencies_first_and_records_everything() {
    let s = Setup::new(cloud());
    let out = s.apply(TWO).await;
    assert!(matches!(out["vm.db"], Outcome::Ready(_)), "{out:?}");
    assert!(matches!(out["vm.web"], Outcome::Ready(_)), "{out:?}");
    let creates: Vec<String> = s
        .cloud
        .calls()
        .into_iter()
        .filter(|(op, _)| *op == Op::Create)
        .map(|(_, d)| d)
        .collect();
    assert_eq!(creates, ["db east", "web east"], "web waits for db");

    let state = s.on_disk();
    assert_eq!(state.resources.len(), 2);
    let web = &state.resources["vm.web"];
    assert_eq!(web.machine.kind, "launch");
    assert_eq!(web.machine.state.to_value()["state"], "ready");
    assert_eq!(
        web.desired.as_ref().unwrap().to_value()["depends_on"],
        serde_json::json!(["db"])
    );
    let labels: Vec<&str> = web.events.iter().map(|e| e.label.as_str()).collect();
    assert_eq!(labels.first(), Some(&"reconciling"));
    assert!(labels.last().unwrap().starts_with("ready"));
    assert_eq!(
        state.serial, 1,
        "transitions go to the journal; the state file is rewritten once, by the fold"
    );
    assert!(
        !s.dir.path().join("gpuprov.state.json.journal").exists(),
        "the folded journal is deleted"
    );

    // Nothing to do on the next plan.
    let config = Config::parse(Path::new("gpuprov.toml"), TWO.to_string()).unwrap();
    let plan = plan::compute(&config, &state, None, &|_| None).unwrap();
    assert!(plan.changes.iter().all(|c| c.action == Action::NoOp));
}

#[tokio::test]
async fn a_failed_dependency_skips_its_dependents() {
    let s = Setup::new(cloud().with_fault(
        Op::Create,
        None,
        ProviderError::new(ErrorKind::InvalidRequest, "bad ask"),
        1,
    ));
    let out = s.apply(TWO).await;
    assert!(
        matches!(&out["vm.db"], Outcome::Failed(m) if m.contains("bad ask")),
        "{out:?}"
    );
    assert!(
        matches!(&out["vm.web"], Outcome::Failed(m) if m.contains("dependency vm.db")),
        "{out:?}"
    );
    assert_eq!(s.cloud.count(Op::Create), 1, "web was never attempted");
    assert!(!s.on_disk().resources.contains_key("vm.web"));
}

#[tokio::test]
async fn destroy_removes_dependents_first_and_empties_the_state() {
    let s = Setup::new(cloud());
    s.apply(TWO).await;
    let out = s.destroy().await;
    assert_eq!(out["vm.db"], Outcome::Destroyed);
    assert_eq!(out["vm.web"], Outcome::Destroyed);
    let deletes: Vec<String> = s
        .cloud
        .calls()
        .into_iter()
        .filter(|(op, _)| *op == Op::Delete)
        .map(|(_, d)| d)
        .collect();
    assert!(
        deletes[0].starts_with("web "),
        "dependents go first: {deletes:?}"
    );
    assert!(s.cloud.instances().is_empty());
    assert!(s.on_disk().resources.is_empty());
}

#[tokio::test]
async fn a_leaked_teardown_stays_in_the_state_until_a_later_destroy_succeeds() {
    let s = Setup::new(cloud());
    s.apply("[vm.solo]\nclouds = [\"aws\"]\n").await;
    s.cloud.fault(
        Op::Delete,
        None,
        ProviderError::new(ErrorKind::Failed, "DependencyViolation"),
        u32::MAX,
    );
    let out = s.destroy().await;
    assert!(
        matches!(&out["vm.solo"], Outcome::Leaked(m) if m.contains("DependencyViolation")),
        "{out:?}"
    );
    let state = s.on_disk();
    let rec = &state.resources["vm.solo"];
    assert_eq!(
        (
            rec.machine.kind.as_str(),
            rec.machine.state.to_value()["state"].as_str()
        ),
        ("teardown", Some("leaked"))
    );
    assert_eq!(
        s.cloud.instances().len(),
        1,
        "still billed, and the state says so"
    );

    s.cloud.clear_faults();
    let out = s.destroy().await;
    assert_eq!(out["vm.solo"], Outcome::Destroyed);
    assert!(s.cloud.instances().is_empty());
    assert!(s.on_disk().resources.is_empty());
}

#[tokio::test]
async fn removing_a_machine_from_the_config_destroys_it_on_apply() {
    let s = Setup::new(cloud());
    s.apply(TWO).await;
    let out = s.apply("[defaults]\nclouds = [\"aws\"]\n[vm.db]\n").await;
    assert_eq!(out["vm.web"], Outcome::Destroyed);
    assert_eq!(out["vm.db"], Outcome::Unchanged);
    assert_eq!(s.cloud.instances().len(), 1);
    assert_eq!(s.on_disk().resources.keys().collect::<Vec<_>>(), ["vm.db"]);
}

#[tokio::test]
async fn a_replacing_change_tears_down_then_creates() {
    let s = Setup::new(cloud());
    s.apply("[vm.solo]\nclouds = [\"aws\"]\n").await;
    let first = s.cloud.instances()[0].id.clone();
    let out = s
        .apply("[vm.solo]\nclouds = [\"aws\"]\nregions = [\"us-west-2\"]\n")
        .await;
    let Outcome::Ready(vm) = &out["vm.solo"] else {
        panic!("{out:?}")
    };
    assert_eq!(vm.location.region, "us-west-2");
    let live = s.cloud.instances();
    assert_eq!(live.len(), 1);
    assert_ne!(live[0].id, first);
}

#[tokio::test]
async fn after_a_cancel_queued_machines_do_not_start() {
    let s = Setup::new(cloud());
    let (mut engine, journal) = s.engine();
    engine.parallelism = 1;
    engine.executor.cancel_token().escalate();
    let config = Config::parse(
        Path::new("gpuprov.toml"),
        "[defaults]\nclouds = [\"aws\"]\n[vm.a]\n[vm.b]\n".into(),
    )
    .unwrap();
    let plan = plan::compute(&config, &journal.snapshot(), None, &|_| None).unwrap();
    let out = engine.apply(&plan).await;
    assert!(
        out.values().all(|o| matches!(o, Outcome::Interrupted(_))),
        "{out:?}"
    );
    assert_eq!(s.cloud.calls().len(), 0, "no cloud call after the cancel");
    assert!(
        journal.snapshot().resources.is_empty(),
        "no record for machines that never started"
    );
}

fn vms(n: usize) -> String {
    let mut t = String::from("[defaults]\nclouds = [\"aws\"]\n");
    for i in 0..n {
        t.push_str(&format!("[vm.m{i}]\n"));
    }
    t
}

#[tokio::test]
async fn creates_are_spaced_by_the_clouds_declared_interval() {
    let base = cloud();
    let caps = gpuprov::provider::Capabilities {
        min_create_interval: Duration::from_millis(60),
        ..base.capabilities_for_test()
    };
    let s = Setup::new(base.with_capabilities(caps));
    let out = s.apply(&vms(3)).await;
    assert!(
        out.values().all(|o| matches!(o, Outcome::Ready(_))),
        "{out:?}"
    );
    let times = s.cloud.call_times(Op::Create);
    assert_eq!(times.len(), 3);
    for pair in times.windows(2) {
        let gap = pair[1] - pair[0];
        // The interval runs from when the previous create was let through; allow for the
        // moment between that and the fake recording the call.
        assert!(gap >= Duration::from_millis(50), "creates {gap:?} apart");
    }
}

/// Found by the benchmark: with every concurrency permit busy, creates spaced before
/// waiting for a permit reached the cloud in a bunch. Spacing must hold at the cloud.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_stay_spaced_at_the_cloud_when_the_concurrency_limit_is_saturated() {
    let base = cloud().with_latency(Duration::from_millis(40));
    let caps = gpuprov::provider::Capabilities {
        max_concurrency: 2,
        min_create_interval: Duration::from_millis(30),
        ..base.capabilities_for_test()
    };
    let s = Setup::new(base.with_capabilities(caps));
    let out = s.apply(&vms(8)).await;
    assert!(
        out.values().all(|o| matches!(o, Outcome::Ready(_))),
        "{out:?}"
    );
    assert!(s.cloud.max_in_flight() <= 2);
    let times = s.cloud.call_times(Op::Create);
    assert_eq!(times.len(), 8);
    for pair in times.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(gap >= Duration::from_millis(25), "creates {gap:?} apart");
    }
}

#[tokio::test]
async fn calls_in_flight_never_exceed_the_clouds_declared_concurrency() {
    let limited = {
        let base = cloud().with_latency(Duration::from_millis(10));
        let caps = gpuprov::provider::Capabilities {
            max_concurrency: 2,
            ..base.capabilities_for_test()
        };
        Setup::new(base.with_capabilities(caps))
    };
    limited.apply(&vms(6)).await;
    assert!(
        limited.cloud.max_in_flight() <= 2,
        "{} in flight",
        limited.cloud.max_in_flight()
    );
    assert!(limited.cloud.max_in_flight() >= 1);

    // The same run without the limit does overlap calls, so the check above can fail.
    let free = Setup::new(cloud().with_latency(Duration::from_millis(10)));
    free.apply(&vms(6)).await;
    assert!(
        free.cloud.max_in_flight() > 2,
        "{} in flight",
        free.cloud.max_in_flight()
    );
}

/// Spot preemption (issue 18, item 7): refresh tells a preempted machine from a deleted
/// one, the plan says so with the preempted offer moved last, and apply relaunches on
/// another offer first and records the preemption.
mod preemption {
    use super::*;
    use gpuprov::provider::CloudProvider;

    const SPOT: &str = "[vm.trainer]\nclouds = [\"aws\"]\nspot = true\n";

    impl Setup {
        /// `plan` with refresh, the offers attached as the CLI attaches them.
        async fn refreshed_plan(&self, toml: &str) -> plan::Plan {
            let config = Config::parse(Path::new("gpuprov.toml"), toml.to_string()).unwrap();
            let state = self.on_disk();
            let mut providers = Providers::new();
            providers.insert(self.cloud.clone());
            let observed = plan::refresh(&state, &providers).await.unwrap();
            let offers = self
                .cloud
                .plan(&config.vms["trainer"].request())
                .await
                .unwrap();
            let mut p = plan::compute(&config, &state, Some(&observed), &|_| {
                offers.first().map(|o| o.price_per_hour)
            })
            .unwrap();
            for c in p.changes.iter_mut().filter(|c| c.needs_offer()) {
                c.offers = plan::offer_lines(&offers, &c.preempted);
            }
            p.reprice_preempted();
            p
        }

        async fn apply_plan(&self, p: &plan::Plan) -> std::collections::BTreeMap<String, Outcome> {
            let (engine, journal) = self.engine();
            let out = tokio::time::timeout(Duration::from_secs(30), engine.apply(p))
                .await
                .expect("no hang");
            journal.save_final().unwrap();
            out
        }

        fn creates(&self) -> Vec<String> {
            self.cloud
                .calls()
                .into_iter()
                .filter(|(op, _)| *op == Op::Create)
                .map(|(_, d)| d)
                .collect()
        }
    }

    #[tokio::test]
    async fn a_preempted_spot_machine_relaunches_on_another_offer_first() {
        let fake = FakeProvider::new("aws");
        let caps = gpuprov::provider::Capabilities {
            supported: vec![gpuprov::provider::Feature::Start],
            ..fake.capabilities_for_test()
        };
        let s = Setup::new(
            fake.with_capabilities(caps)
                .with_offer("east", "us-east-1", "p5.48xlarge", 30.0)
                .with_offer("west", "us-west-2", "p5.48xlarge", 35.0),
        );
        let out = s.apply(SPOT).await;
        let Outcome::Ready(first) = &out["vm.trainer"] else {
            panic!("{out:?}")
        };
        assert_eq!(first.offer.id, "east");
        assert!(first.preemptions.is_empty());
        s.cloud.preempt_instance(&first.instance_id, false);

        let p = s.refreshed_plan(SPOT).await;
        let c = &p.changes[0];
        assert_eq!(c.action, Action::Create, "{c:?}");
        let reason = c.reason.as_deref().unwrap();
        assert!(
            reason.contains(&format!(
                "spot instance {} preempted at aws/us-east-1 p5.48xlarge",
                first.instance_id
            )) && reason.contains("apply tries other offers first"),
            "{reason}"
        );
        let order: Vec<(&str, bool)> = c
            .offers
            .iter()
            .map(|o| (o.id.as_str(), o.preempted))
            .collect();
        assert_eq!(order, [("west", false), ("east", true)]);
        assert_eq!(
            c.price_per_hour,
            Some(35.0),
            "priced at the offer tried first"
        );
        assert_eq!(p.hourly_cost_after, 35.0);
        let shown = gpuprov::cli::view::text::render(&p);
        assert!(shown.contains("# vm.trainer will be created"), "{shown}");
        assert!(
            shown.contains("east  $30.00/h  (preempted here recently: moved last)"),
            "{shown}"
        );

        let out = s.apply_plan(&p).await;
        let Outcome::Ready(second) = &out["vm.trainer"] else {
            panic!("{out:?}")
        };
        assert_eq!(second.offer.id, "west", "another offer first");
        assert_eq!(s.creates(), ["trainer east", "trainer west"]);
        assert_eq!(second.preemptions.len(), 1);
        assert_eq!(second.preemptions[0].instance_id, first.instance_id);
        assert_eq!(second.preemptions[0].offer_id, "east");
        let recorded = &s.on_disk().resources["vm.trainer"].machine.state.to_value();
        assert_eq!(recorded["vm"]["preemptions"][0]["offer_id"], "east");
        assert_eq!(
            recorded["vm"]["preemptions"][0]["instance_type"],
            "p5.48xlarge"
        );
        assert!(recorded["vm"]["preemptions"][0]["at"].is_string());

        // Up again: nothing to do, and the preemption stays on the record.
        let again = s.refreshed_plan(SPOT).await;
        assert_eq!(again.changes[0].action, Action::NoOp);

        // Stopped (not preempted) and started again: the record keeps its preemption.
        s.cloud.stop_instance(&second.instance_id);
        let p = s.refreshed_plan(SPOT).await;
        assert_eq!(p.changes[0].action, Action::Resume, "{:?}", p.changes[0]);
        assert!(!p.changes[0].preempted_now);
        let out = s.apply_plan(&p).await;
        let Outcome::Ready(third) = &out["vm.trainer"] else {
            panic!("{out:?}")
        };
        assert_eq!(third.instance_id, second.instance_id);
        assert_eq!(third.preemptions, second.preemptions);
    }

    #[tokio::test]
    async fn a_preempted_machine_with_one_offer_is_retried_there_and_a_stopped_one_replaced() {
        let s = Setup::new(FakeProvider::new("aws").with_offer(
            "east",
            "us-east-1",
            "p5.48xlarge",
            30.0,
        ));
        let out = s.apply(SPOT).await;
        let Outcome::Ready(first) = &out["vm.trainer"] else {
            panic!("{out:?}")
        };
        // Kept stopped by the cloud (GCP, an EC2 spot that stops): deleted, not started.
        s.cloud.preempt_instance(&first.instance_id, true);
        let p = s.refreshed_plan(SPOT).await;
        let c = &p.changes[0];
        assert_eq!(c.action, Action::Replace, "{c:?}");
        assert!(c.preempted_now);
        assert!(gpuprov::cli::view::text::render(&p).contains("# vm.trainer must be replaced"));
        assert_eq!(c.offers.len(), 1, "the only offer is kept");
        assert!(c.offers[0].preempted);

        let out = s.apply_plan(&p).await;
        let Outcome::Ready(second) = &out["vm.trainer"] else {
            panic!("{out:?}")
        };
        assert_eq!(second.offer.id, "east", "retried on the only offer");
        assert_ne!(second.instance_id, first.instance_id);
        assert_eq!(
            s.cloud.count(Op::Start),
            0,
            "a preempted machine is not started"
        );
        let live: Vec<String> = s.cloud.instances().into_iter().map(|i| i.id).collect();
        assert_eq!(live.len(), 1, "the stopped one was deleted: {live:?}");
        assert_eq!(live[0], second.instance_id);
        assert_eq!(second.preemptions.len(), 1);
        assert_eq!(second.preemptions[0].instance_id, first.instance_id);
    }
}
