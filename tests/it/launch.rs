//! Launch- and teardown-machine tests (design 6) against the scripted FakeProvider: each
//! scenario builds a cloud, runs the machine through the real executor and a journal, and
//! checks the end state, the journal and what the cloud saw.

use crate::support::clouds;

use std::sync::Arc;
use std::time::Duration;

use clouds::{Gate, TestCloud};
use gpuprov::config::{Cloud, VmSpec};
use gpuprov::machine::Providers;
use gpuprov::machine::{CancelToken, ExecError, Executor, MemoryJournal, RetryPolicy};
use gpuprov::provider::doubles::fake::{FakeConnector, FakeProvider, Op};
use gpuprov::provider::{CloudProvider, ErrorKind, InstanceStatus, Location, ProviderError};
use gpuprov::ssh::{HostKey, SshError};
use gpuprov::vm::{LaunchMachine, LaunchState, Target, TeardownMachine, TeardownState};

const FAST: RetryPolicy = RetryPolicy {
    max_attempts: 3,
    initial_backoff: Duration::from_millis(1),
    max_backoff: Duration::from_millis(2),
};

struct Run {
    cloud: Arc<FakeProvider>,
    journal: Arc<MemoryJournal>,
    connector: Arc<FakeConnector>,
    vm: VmSpec,
}

impl Run {
    fn new(cloud: FakeProvider) -> Run {
        Run {
            cloud: Arc::new(cloud),
            journal: Arc::new(MemoryJournal::new()),
            connector: Arc::new(FakeConnector::default()),
            vm: VmSpec::new("trainer", vec![Cloud::Aws]),
        }
    }

    fn machine(&self) -> LaunchMachine {
        let mut providers = Providers::new();
        providers.insert(self.cloud.clone());
        let mut m = LaunchMachine::new(
            self.vm.clone(),
            "0f0e0d0c-lineage".into(),
            "ssh-ed25519 AAAAtest gpuprov".into(),
            providers,
            self.connector.clone(),
        );
        m.retry = FAST;
        m.teardown.retry = FAST;
        m.vanish_grace = Some(Duration::from_millis(20));
        m.exhausted_wait = Duration::from_millis(5);
        m
    }

    async fn launch(&self) -> Result<LaunchState, ExecError> {
        self.launch_with(CancelToken::new()).await
    }

    async fn launch_with(&self, cancel: CancelToken) -> Result<LaunchState, ExecError> {
        let ex = Executor::new(self.journal.clone(), cancel);
        // As the engine does: a fresh run starts from what the previous record owns.
        let m = self.machine();
        let fut = ex.run(&m, "vm.trainer", |prev| {
            let owned = prev
                .and_then(|p| serde_json::from_value::<LaunchState>(p.state).ok())
                .and_then(|s| s.owned());
            LaunchState::start(owned)
        });
        tokio::time::timeout(Duration::from_secs(20), fut)
            .await
            .expect("launch must not hang")
    }

    fn labels(&self) -> Vec<String> {
        self.journal.history().into_iter().map(|(_, l)| l).collect()
    }
}

fn err(kind: ErrorKind, msg: &str) -> ProviderError {
    ProviderError::new(kind, msg)
}

fn two_regions() -> FakeProvider {
    FakeProvider::new("aws")
        .with_offer("east-a", "us-east-1", "p5.48xlarge", 98.0)
        .with_offer("east-b", "us-east-1", "p4d.24xlarge", 40.0)
        .with_offer("west-a", "us-west-2", "p5.48xlarge", 98.0)
}

#[tokio::test]
async fn happy_path_reaches_ready_with_one_create() {
    let r = Run::new(two_regions());
    let end = r.launch().await.unwrap();
    let vm = end.ready().expect("ready");
    assert_eq!(vm.offer.id, "east-a");
    assert_eq!(vm.user, "ubuntu", "the cloud's user wins over the default");
    assert_eq!(r.cloud.count(Op::Create), 1);
    assert_eq!(r.cloud.instances().len(), 1);
    let labels = r.labels();
    assert_eq!(labels[0], "reconciling");
    assert_eq!(labels[1], "planning");
    assert!(
        labels[2].starts_with("preparing aws/us-east-1"),
        "{labels:?}"
    );
    assert!(labels[3].starts_with("creating"), "{labels:?}");
    // The intent to call create is journalled before the call.
    assert!(
        labels[4].starts_with("creating") && labels[4].ends_with("(create sent)"),
        "{labels:?}"
    );
    assert!(labels[5].starts_with("booting"), "{labels:?}");
    assert!(labels[6].starts_with("connecting"), "{labels:?}");
    assert!(labels[7].starts_with("ready"), "{labels:?}");
}

#[tokio::test]
async fn capacity_error_fails_over_to_the_next_offer() {
    let r = Run::new(two_regions().with_fault(
        Op::Create,
        Some("east-a"),
        err(ErrorKind::Capacity, "InsufficientInstanceCapacity"),
        u32::MAX,
    ));
    let end = r.launch().await.unwrap();
    let vm = end.ready().expect("ready");
    assert_eq!(
        vm.offer.id, "east-b",
        "capacity blocks only the offer, not the region"
    );
    assert!(r.labels().iter().any(|l| l.starts_with("compensating (")
        && l.ends_with("): create: InsufficientInstanceCapacity")));
    assert_eq!(r.cloud.instances().len(), 1);
}

#[tokio::test]
async fn quota_error_blocks_the_whole_region() {
    let r = Run::new(two_regions().with_fault(
        Op::Create,
        Some("east-a"),
        err(ErrorKind::Quota, "VcpuLimitExceeded"),
        u32::MAX,
    ));
    let end = r.launch().await.unwrap();
    assert_eq!(end.ready().expect("ready").offer.id, "west-a");
    let prepared: Vec<String> = r
        .cloud
        .calls()
        .into_iter()
        .filter(|(op, _)| *op == Op::Prepare)
        .map(|(_, d)| d)
        .collect();
    assert_eq!(
        prepared,
        ["trainer east-a", "trainer west-a"],
        "east-b shares the quota'd region"
    );
}

#[tokio::test]
async fn unavailable_in_prepare_moves_on_without_compensation() {
    let r = Run::new(two_regions().with_fault(
        Op::Prepare,
        Some("east-a"),
        err(ErrorKind::Unavailable, "Unsupported"),
        u32::MAX,
    ));
    let end = r.launch().await.unwrap();
    assert_eq!(end.ready().expect("ready").offer.id, "east-b");
    assert_eq!(r.cloud.count(Op::Delete), 0);
    assert_eq!(r.cloud.count(Op::Cleanup), 0);
    assert!(!r.labels().iter().any(|l| l.starts_with("compensating")));
}

#[tokio::test]
async fn crash_between_create_and_journal_adopts_instead_of_duplicating() {
    let r = Run::new(two_regions());
    r.journal.crash_before("booting");
    let first = r.launch().await.unwrap_err();
    assert!(matches!(first, ExecError::Journal { .. }), "{first:?}");
    assert_eq!(r.cloud.instances().len(), 1, "the create happened");
    assert!(
        r.labels().last().unwrap().starts_with("creating"),
        "journal still says creating"
    );

    let end = r.launch().await.unwrap();
    assert!(end.ready().is_some());
    assert_eq!(
        r.cloud.count(Op::Create),
        1,
        "the resumed Creating step observed and adopted"
    );
    assert_eq!(r.cloud.instances().len(), 1);
}

#[tokio::test]
async fn fatal_error_after_create_compensates_then_aborts() {
    // The create happens, the run dies before journalling it, and on resume the cloud
    // rejects the credentials: the instance exists, so it must be torn down.
    let r = Run::new(two_regions());
    r.journal.crash_before("booting");
    r.launch().await.unwrap_err();
    assert_eq!(r.cloud.instances().len(), 1);
    r.cloud.fault(
        Op::Observe,
        None,
        err(ErrorKind::Credentials, "AuthFailure"),
        1,
    );
    let end = r.launch().await.unwrap();
    match &end {
        LaunchState::Aborted {
            reason,
            owned: None,
        } => assert!(reason.contains("AuthFailure"), "{reason}"),
        other => panic!("expected Aborted, got {other:?}"),
    }
    assert!(
        r.cloud.instances().is_empty(),
        "compensation removed the instance"
    );
    assert_eq!(r.cloud.count(Op::Delete), 1);
}

#[tokio::test]
async fn invalid_request_on_create_aborts_after_compensation() {
    let r = Run::new(two_regions().with_fault(
        Op::Create,
        None,
        err(ErrorKind::InvalidRequest, "InvalidParameterCombination"),
        u32::MAX,
    ));
    let end = r.launch().await.unwrap();
    assert!(matches!(end, LaunchState::Aborted { .. }), "{end:?}");
    assert_eq!(
        r.cloud.count(Op::Create),
        1,
        "no failover on a request that cannot succeed anywhere"
    );
}

#[tokio::test]
async fn failed_teardown_is_leaked_and_the_next_run_resolves_it() {
    // Boot fails (the instance this run created reports Failed), and delete keeps failing.
    let r = Run::new(FakeProvider::new("aws").with_offer("only", "us-east-1", "p5.48xlarge", 98.0));
    r.cloud.fail_boots(Some("hardware"));
    let id = "aws-i-1".to_string();
    r.cloud.fault(
        Op::Delete,
        None,
        err(ErrorKind::Failed, "DeleteRefused"),
        u32::MAX,
    );
    let end = r.launch().await.unwrap();
    match &end {
        LaunchState::Leaked {
            instance_ids,
            reason,
            ..
        } => {
            assert_eq!(instance_ids, &vec![id.clone()]);
            assert!(reason.contains("DeleteRefused"), "{reason}");
        }
        other => panic!("expected Leaked, got {other:?}"),
    }
    assert_eq!(
        r.cloud.instances().len(),
        1,
        "still there, and the journal says so"
    );

    // The cloud recovers; the next run first removes the leaked instance, then launches.
    r.cloud.clear_faults();
    r.cloud.fail_boots(None);
    let end = r.launch().await.unwrap();
    assert!(end.ready().is_some(), "{end:?}");
    let live = r.cloud.instances();
    assert_eq!(live.len(), 1);
    assert_ne!(live[0].id, id, "the leaked instance is gone");
    assert!(r
        .labels()
        .iter()
        .any(|l| l.contains("removing what an earlier run left behind")));
}

#[tokio::test]
async fn every_offer_failing_ends_exhausted_with_the_history() {
    let r = Run::new(two_regions().with_fault(
        Op::Create,
        None,
        err(ErrorKind::Capacity, "InsufficientInstanceCapacity"),
        u32::MAX,
    ));
    let end = r.launch().await.unwrap();
    match end {
        LaunchState::Exhausted { search } => {
            assert_eq!(search.history.len(), 3);
            assert_eq!(search.blocked.len(), 3);
        }
        other => panic!("expected Exhausted, got {other:?}"),
    }
    assert!(r.cloud.instances().is_empty());
}

#[tokio::test]
async fn retry_until_up_replans_until_capacity_appears() {
    let mut r = Run::new(
        FakeProvider::new("aws")
            .with_offer("only", "us-east-1", "p5.48xlarge", 98.0)
            .with_fault(
                Op::Create,
                None,
                err(ErrorKind::Capacity, "InsufficientInstanceCapacity"),
                2,
            ),
    );
    r.vm.retry_until_up = true;
    let end = r.launch().await.unwrap();
    assert!(end.ready().is_some(), "{end:?}");
    assert_eq!(r.cloud.count(Op::Plan), 3);
    assert!(
        r.labels().iter().any(|l| l == "planning (round 3)"),
        "{:?}",
        r.labels()
    );
}

#[tokio::test]
async fn boot_timeout_compensates_and_tries_the_next_offer() {
    let caps = gpuprov::provider::Capabilities {
        boot_timeout: Duration::from_millis(30),
        poll_interval: Duration::from_millis(2),
        ..FakeProvider::new("aws").capabilities_for_test()
    };
    let r = Run::new(
        two_regions()
            .with_boot_observes(u32::MAX)
            .with_capabilities(caps),
    );
    let end = r.launch().await.unwrap();
    // Every offer times out at boot; each attempt is torn down.
    assert!(matches!(end, LaunchState::Exhausted { .. }), "{end:?}");
    assert!(r.cloud.instances().is_empty(), "no instance left behind");
    assert_eq!(r.cloud.count(Op::Create), 3);
}

#[tokio::test]
async fn an_instance_vanishing_while_booting_is_replaced() {
    let r = Run::new(two_regions().with_vanish_on_boot());
    let end = r.launch().await.unwrap();
    assert!(matches!(end, LaunchState::Exhausted { .. }), "{end:?}");
    assert!(
        r.labels()
            .iter()
            .any(|l| l.contains("vanished while booting")),
        "{:?}",
        r.labels()
    );
}

#[tokio::test]
async fn ssh_timeout_on_a_new_instance_compensates() {
    let caps = gpuprov::provider::Capabilities {
        ssh_timeout: Duration::from_millis(20),
        poll_interval: Duration::from_millis(2),
        ..FakeProvider::new("aws").capabilities_for_test()
    };
    let r = Run::new(
        FakeProvider::new("aws")
            .with_offer("only", "us-east-1", "p5.48xlarge", 98.0)
            .with_capabilities(caps),
    );
    r.connector.fail_with(
        (0..10_000)
            .map(|_| SshError::Unreachable {
                endpoint: "127.0.0.1:22".into(),
                msg: "refused".into(),
            })
            .collect(),
    );
    let end = r.launch().await.unwrap();
    assert!(matches!(end, LaunchState::Exhausted { .. }), "{end:?}");
    assert!(r.cloud.instances().is_empty());
}

#[tokio::test]
async fn a_transient_error_is_retried_then_succeeds() {
    let r = Run::new(two_regions().with_fault(
        Op::Create,
        None,
        ProviderError::transient("RequestLimitExceeded"),
        2,
    ));
    let end = r.launch().await.unwrap();
    assert_eq!(
        end.ready().expect("ready").offer.id,
        "east-a",
        "transient errors do not fail over"
    );
    assert_eq!(r.cloud.count(Op::Create), 3);
}

#[tokio::test]
async fn max_price_filters_offers() {
    let mut r = Run::new(two_regions());
    r.vm.max_price_per_hour = Some(50.0);
    let end = r.launch().await.unwrap();
    assert_eq!(end.ready().expect("ready").offer.id, "east-b");
}

#[tokio::test]
async fn no_offer_within_price_is_exhausted_not_a_panic() {
    let mut r = Run::new(two_regions());
    r.vm.max_price_per_hour = Some(1.0);
    let end = r.launch().await.unwrap();
    assert!(matches!(end, LaunchState::Exhausted { .. }), "{end:?}");
    assert_eq!(r.cloud.count(Op::Create), 0);
}

#[tokio::test]
async fn a_second_apply_reuses_the_running_machine() {
    let r = Run::new(two_regions());
    let first = r.launch().await.unwrap();
    let end = r.launch().await.unwrap();
    assert_eq!(
        end.ready().unwrap().instance_id,
        first.ready().unwrap().instance_id
    );
    assert_eq!(r.cloud.count(Op::Create), 1);
    assert_eq!(
        r.connector.logins(),
        2,
        "the reused machine is logged into again"
    );
}

#[tokio::test]
async fn a_changed_host_key_is_refused_and_the_machine_left_alone() {
    let r = Run::new(two_regions());
    r.launch().await.unwrap();
    *r.connector.host_key.lock().unwrap() = HostKey {
        algorithm: "ssh-ed25519".into(),
        key_base64: "AAAAother".into(),
        fingerprint: "SHA256:other".into(),
    };
    let end = r.launch().await.unwrap();
    match &end {
        LaunchState::Aborted {
            reason,
            owned: Some(o),
        } => {
            assert!(reason.contains("host key"), "{reason}");
            assert!(o.vm.is_some());
        }
        other => panic!("expected Aborted with the machine owned, got {other:?}"),
    }
    assert_eq!(
        r.cloud.instances().len(),
        1,
        "never deleted on a host-key mismatch"
    );
    assert_eq!(r.cloud.count(Op::Delete), 0);
}

#[tokio::test]
async fn a_machine_deleted_outside_gpuprov_is_recreated() {
    let r = Run::new(two_regions());
    let first = r.launch().await.unwrap();
    let gone = first.ready().unwrap();
    let loc = gone.location.clone();
    r.cloud
        .delete(&loc, "trainer", std::slice::from_ref(&gone.instance_id))
        .await
        .unwrap();
    let end = r.launch().await.unwrap();
    assert_ne!(end.ready().unwrap().instance_id, gone.instance_id);
    assert_eq!(r.cloud.instances().len(), 1);
}

#[tokio::test]
async fn cancel_while_booting_compensates_and_aborts() {
    let caps = gpuprov::provider::Capabilities {
        boot_timeout: Duration::from_secs(30),
        poll_interval: Duration::from_millis(5),
        ..FakeProvider::new("aws").capabilities_for_test()
    };
    let r = Arc::new(Run::new(
        two_regions()
            .with_boot_observes(u32::MAX)
            .with_capabilities(caps),
    ));
    let cancel = CancelToken::new();
    let task = {
        let (r, cancel) = (r.clone(), cancel.clone());
        tokio::spawn(async move { r.launch_with(cancel).await })
    };
    for _ in 0..400 {
        if r.labels().last().is_some_and(|l| l.starts_with("booting")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cancel.escalate();
    let end = task.await.unwrap().unwrap();
    assert!(
        matches!(&end, LaunchState::Aborted { reason, owned: None } if reason.contains("cancelled")),
        "{end:?}"
    );
    assert!(
        r.cloud.instances().is_empty(),
        "the booting instance was torn down"
    );
}

#[tokio::test]
async fn teardown_machine_deletes_what_the_record_and_the_cloud_know() {
    let cloud = Arc::new(FakeProvider::new("aws"));
    let loc = Location {
        cloud: "aws".into(),
        region: "us-east-1".into(),
        zone: None,
    };
    let known = cloud.insert_instance("trainer", loc.clone(), InstanceStatus::Running);
    let unknown = cloud.insert_instance("trainer", loc.clone(), InstanceStatus::Pending);
    let other_vm = cloud.insert_instance("other", loc.clone(), InstanceStatus::Running);
    let mut providers = Providers::new();
    providers.insert(cloud.clone());
    let mut m = TeardownMachine::new(providers);
    m.retry = FAST;
    let j = Arc::new(MemoryJournal::new());
    let ex = Executor::new(j, CancelToken::new());
    let target = Target::new(loc, "trainer", vec![known]);
    let end = ex
        .run(&m, "vm.trainer", |_| TeardownState::Requesting { target })
        .await
        .unwrap();
    assert_eq!(end, TeardownState::Done);
    let left: Vec<String> = cloud.instances().into_iter().map(|i| i.id).collect();
    assert_eq!(
        left,
        vec![other_vm],
        "both of trainer's instances went, {unknown} included"
    );
    assert_eq!(cloud.count(Op::Cleanup), 1);
}

#[tokio::test]
async fn teardown_with_an_unreachable_api_is_leaked_never_done() {
    let cloud = Arc::new(FakeProvider::new("aws").with_fault(
        Op::Observe,
        None,
        ProviderError::transient("connection refused"),
        u32::MAX,
    ));
    let loc = Location {
        cloud: "aws".into(),
        region: "us-east-1".into(),
        zone: None,
    };
    let mut providers = Providers::new();
    providers.insert(cloud.clone());
    let mut m = TeardownMachine::new(providers);
    m.retry = FAST;
    let ex = Executor::new(Arc::new(MemoryJournal::new()), CancelToken::new());
    let target = Target::new(loc, "trainer", vec!["i-1".into()]);
    let end = ex
        .run(&m, "vm.trainer", |_| TeardownState::Requesting { target })
        .await
        .unwrap();
    assert!(
        matches!(end, TeardownState::Leaked { ref instance_ids, .. } if instance_ids == &vec!["i-1".to_string()]),
        "{end:?}"
    );
}

/// Field report: a resumed run lists the cloud right after a create and sees nothing yet.
/// It must not lose or duplicate the instance: the repeated create carries the same
/// idempotency token and gets the same instance back.
#[tokio::test]
async fn a_resumed_create_that_lists_nothing_yet_does_not_duplicate() {
    // The wait for the listing ends when the instance is listed (two observes here); a
    // listing lag of seconds keeps a loaded machine from outrunning it.
    let cloud = two_regions().with_list_lag(2);
    let caps = gpuprov::provider::Capabilities {
        create_list_lag: Duration::from_secs(5),
        ..cloud.capabilities_for_test()
    };
    let r = Run::new(cloud.with_capabilities(caps));
    r.journal.crash_before("booting");
    r.launch().await.unwrap_err();
    assert_eq!(r.cloud.instances().len(), 1);
    let end = r.launch().await.unwrap();
    assert!(end.ready().is_some(), "{end:?}");
    assert_eq!(
        r.cloud.count(Op::Create),
        1,
        "the resume waited for the cloud to list the instance and adopted it"
    );
    assert_eq!(r.cloud.instances().len(), 1);
    assert_eq!(end.ready().unwrap().instance_id, r.cloud.instances()[0].id);
}

impl Run {
    /// Runs the launch machine against `cloud` instead of the bare fake.
    async fn launch_on(
        &self,
        cloud: Arc<TestCloud>,
        cancel: CancelToken,
    ) -> Result<LaunchState, ExecError> {
        let mut providers = Providers::new();
        providers.insert(cloud);
        let mut m = self.machine();
        m.providers = providers.clone();
        m.teardown = TeardownMachine::new(providers);
        m.teardown.retry = FAST;
        let ex = Executor::new(self.journal.clone(), cancel);
        let fut = ex.run(&m, "vm.trainer", |prev| {
            let owned = prev
                .and_then(|p| serde_json::from_value::<LaunchState>(p.state).ok())
                .and_then(|s| s.owned());
            LaunchState::start(owned)
        });
        tokio::time::timeout(Duration::from_secs(20), fut)
            .await
            .expect("no hang")
    }
}

/// Field report (review): on a cloud that ignores the token, a run resumed after a crash
/// between create and its journal entry listed the cloud once, saw nothing yet (list
/// lag), and created a second instance. It must wait for the listing instead.
#[tokio::test]
async fn a_resumed_create_on_a_cloud_without_idempotency_waits_for_the_listing() {
    let r = Run::new(two_regions().with_list_lag(3));
    let cloud = Arc::new(TestCloud {
        inner: r.cloud.clone(),
        no_token: true,
        gate: None,
    });
    r.journal.crash_before("booting");
    r.launch_on(cloud.clone(), CancelToken::new())
        .await
        .unwrap_err();
    assert_eq!(r.cloud.instances().len(), 1, "the create reached the cloud");
    let end = r.launch_on(cloud, CancelToken::new()).await.unwrap();
    assert!(end.ready().is_some(), "{end:?}");
    assert_eq!(r.cloud.count(Op::Create), 1, "no second create");
    assert_eq!(r.cloud.instances().len(), 1);
}

/// A second Ctrl-C (exit now) while a create call is in flight drops the call: its answer
/// is lost though the cloud acted on it. The next run must find that instance, not make
/// another, even on a cloud without an idempotency token.
#[tokio::test]
async fn a_hard_cancel_during_create_then_resume_adopts_the_instance() {
    // The listing lags 3 calls; the cloud's declared consistency window must cover them
    // even on a loaded machine (20 ms did not, in one CI run): 1 s.
    let fake = two_regions().with_list_lag(3);
    let mut caps = fake.capabilities_for_test();
    caps.create_list_lag = Duration::from_secs(1);
    let r = Arc::new(Run::new(fake.with_capabilities(caps)));
    let gate = Gate::default();
    let cloud = Arc::new(TestCloud {
        inner: r.cloud.clone(),
        no_token: true,
        gate: Some(gate.clone()),
    });
    let cancel = CancelToken::new();
    let task = {
        let (r, cloud, cancel) = (r.clone(), cloud.clone(), cancel.clone());
        tokio::spawn(async move { r.launch_on(cloud, cancel).await })
    };
    gate.entered.notified().await;
    cancel.escalate();
    cancel.escalate();
    assert!(matches!(
        task.await.unwrap(),
        Err(ExecError::Interrupted { .. })
    ));
    assert_eq!(r.cloud.instances().len(), 1, "the cloud made it");
    let resumed = Arc::new(TestCloud {
        inner: r.cloud.clone(),
        no_token: true,
        gate: None,
    });
    let end = r.launch_on(resumed, CancelToken::new()).await.unwrap();
    assert!(end.ready().is_some(), "{end:?}");
    assert_eq!(r.cloud.count(Op::Create), 1, "adopted, not created again");
    assert_eq!(end.ready().unwrap().instance_id, r.cloud.instances()[0].id);
}

/// Field report: Ctrl-C the instant a create call is in flight. The call is not dropped:
/// when it returns, the instance is recorded and then torn down.
#[tokio::test]
async fn cancel_while_a_create_is_in_flight_records_then_tears_down() {
    let r = Arc::new(Run::new(two_regions()));
    let gate = Gate::default();
    let cloud = Arc::new(TestCloud {
        inner: r.cloud.clone(),
        no_token: false,
        gate: Some(gate.clone()),
    });
    let cancel = CancelToken::new();
    let task = {
        let (r, cloud, cancel) = (r.clone(), cloud.clone(), cancel.clone());
        tokio::spawn(async move { r.launch_on(cloud, cancel).await })
    };
    // The create call has reached the cloud and not returned: Ctrl-C now.
    gate.entered.notified().await;
    cancel.escalate();
    tokio::task::yield_now().await;
    assert!(!task.is_finished(), "the create call is not abandoned");
    gate.release.notify_one();
    let end = task.await.unwrap().unwrap();
    assert!(
        matches!(&end, LaunchState::Aborted { owned: None, .. }),
        "{end:?}"
    );
    let labels = r.labels();
    let booting = labels
        .iter()
        .position(|l| l.starts_with("booting"))
        .expect("the instance was recorded");
    let compensating = labels
        .iter()
        .position(|l| l.starts_with("compensating"))
        .expect("then torn down");
    assert!(booting < compensating, "{labels:?}");
    assert_eq!(r.cloud.count(Op::Create), 1);
    assert!(r.cloud.instances().is_empty());
}

// ---------------------------------------------------------------------------------------
// Issue 12: ownership, restart before replace, tokens, side resources, consistency,
// failures a user can act on.

fn here(region: &str) -> Location {
    Location {
        cloud: "aws".into(),
        region: region.into(),
        zone: None,
    }
}

fn refused() -> SshError {
    SshError::AuthRejected {
        endpoint: "127.0.0.1:22".into(),
        msg: "publickey".into(),
    }
}

/// The spec a test sends straight to the fake cloud (as an interrupted run would have).
fn trainer_spec() -> gpuprov::provider::InstanceSpec {
    gpuprov::provider::InstanceSpec {
        vm_name: "trainer".into(),
        lineage: "0f0e0d0c-lineage".into(),
        client_token: "t".into(),
        image: None,
        disk_gb: None,
        ports: vec![],
        ssh_public_key: "ssh-ed25519 AAAAtest".into(),
        boot_script: None,
        shared: Default::default(),
    }
}

/// A fake cloud that can start stopped instances.
fn startable(cloud: FakeProvider) -> FakeProvider {
    let mut caps = cloud.capabilities_for_test();
    caps.supported.push(gpuprov::provider::Feature::Start);
    cloud.with_capabilities(caps)
}

#[tokio::test]
async fn a_stopped_instance_found_by_identity_is_left_untouched() {
    let r = Run::new(two_regions());
    let theirs = r
        .cloud
        .insert_instance("trainer", here("us-east-1"), InstanceStatus::Stopped);
    let end = r.launch().await.unwrap();
    let LaunchState::Unowned {
        instance_ids,
        reason,
        ..
    } = &end
    else {
        panic!("expected Unowned, got {end:?}");
    };
    assert_eq!(instance_ids, std::slice::from_ref(&theirs));
    assert!(reason.contains("not created by gpuprov"), "{reason}");
    assert!(reason.contains("gpuprov destroy"), "{reason}");
    assert_eq!(r.cloud.count(Op::Delete), 0, "never deleted");
    assert_eq!(r.cloud.count(Op::Create), 0, "never duplicated");
    assert_eq!(r.cloud.instances().len(), 1);
    let owned = end.owned().expect("visible to destroy");
    assert!(owned.adopted);

    // The next apply looks again and still leaves it alone.
    let again = r.launch().await.unwrap();
    assert!(matches!(again, LaunchState::Unowned { .. }), "{again:?}");
    assert_eq!(r.cloud.count(Op::Delete), 0);

    // `destroy` removes it deliberately.
    let td = TeardownMachine::new({
        let mut p = Providers::new();
        p.insert(r.cloud.clone());
        p
    });
    let ex = Executor::new(Arc::new(MemoryJournal::new()), CancelToken::new());
    let gone = ex
        .run(&td, "vm.trainer", |_| TeardownState::Requesting {
            target: Target::of(owned, "trainer"),
        })
        .await
        .unwrap();
    assert_eq!(gone, TeardownState::Done);
    assert!(r.cloud.instances().is_empty());
}

#[tokio::test]
async fn a_found_instance_that_refuses_the_key_ends_at_once_and_is_not_deleted() {
    let r = Run::new(two_regions());
    let theirs = r
        .cloud
        .insert_instance("trainer", here("us-east-1"), InstanceStatus::Running);
    r.connector
        .fail_with((0..1000).map(|_| refused()).collect());
    let end = r.launch().await.unwrap();
    let LaunchState::Unowned { reason, .. } = &end else {
        panic!("expected Unowned, got {end:?}");
    };
    assert!(reason.contains("key refused"), "{reason}");
    assert_eq!(r.cloud.count(Op::Delete), 0);
    assert_eq!(r.cloud.count(Op::Create), 0);
    assert_eq!(r.cloud.instances()[0].id, theirs);
    let connects = r
        .labels()
        .iter()
        .filter(|l| l.starts_with("connecting"))
        .count();
    assert_eq!(connects, 1, "no silent retries: {:?}", r.labels());
}

#[tokio::test]
async fn a_found_instance_that_runs_and_accepts_the_key_is_adopted() {
    let r = Run::new(two_regions());
    let theirs = r
        .cloud
        .insert_instance("trainer", here("us-east-1"), InstanceStatus::Running);
    let end = r.launch().await.unwrap();
    assert_eq!(end.ready().expect("ready").instance_id, theirs);
    assert_eq!(r.cloud.count(Op::Create), 0);
}

#[tokio::test]
async fn cancelling_while_an_adopted_instance_boots_leaves_it() {
    let r = Run::new(two_regions());
    let m = r.machine();
    use gpuprov::machine::Machine as _;
    let booting = LaunchState::Booting {
        search: gpuprov::vm::Search {
            offers: vec![],
            ..Default::default()
        },
        instance_id: "theirs".into(),
        adopted: true,
        kept: None,
    };
    // Without an offer there is no location; with one, the result is Unowned.
    let with_offer = match booting {
        LaunchState::Booting {
            instance_id,
            adopted,
            kept,
            ..
        } => LaunchState::Booting {
            search: gpuprov::vm::Search {
                offers: r
                    .cloud
                    .plan(&r.vm.request())
                    .await
                    .unwrap()
                    .into_iter()
                    .take(1)
                    .collect(),
                ..Default::default()
            },
            instance_id,
            adopted,
            kept,
        },
        other => other,
    };
    let after = m.on_cancel(&with_offer).expect("maps");
    assert!(matches!(after, LaunchState::Unowned { .. }), "{after:?}");
}

#[tokio::test]
async fn a_stopped_recorded_machine_is_started_not_replaced() {
    let r = Run::new(startable(two_regions()));
    let first = r.launch().await.unwrap();
    let id = first.ready().expect("ready").instance_id.clone();
    r.cloud.stop_instance(&id);
    let end = r.launch().await.unwrap();
    assert_eq!(
        end.ready().expect("ready again").instance_id,
        id,
        "same disk"
    );
    assert_eq!(r.cloud.count(Op::Start), 1);
    assert_eq!(r.cloud.count(Op::Create), 1, "no replacement");
    assert_eq!(r.cloud.count(Op::Delete), 0);
}

#[tokio::test]
async fn a_restart_refused_for_quota_keeps_the_machine_and_creates_nothing() {
    let r = Run::new(startable(two_regions()));
    let id = r
        .launch()
        .await
        .unwrap()
        .ready()
        .unwrap()
        .instance_id
        .clone();
    r.cloud.stop_instance(&id);
    r.cloud.fault(
        Op::Start,
        None,
        err(ErrorKind::Quota, "VcpuLimitExceeded"),
        u32::MAX,
    );
    let end = r.launch().await.unwrap();
    let LaunchState::Aborted { reason, owned } = &end else {
        panic!("expected Aborted, got {end:?}");
    };
    assert!(reason.contains("no replacement"), "{reason}");
    assert_eq!(
        owned
            .as_ref()
            .and_then(|o| o.vm.as_ref())
            .unwrap()
            .instance_id,
        id
    );
    assert_eq!(
        r.cloud.count(Op::Create),
        1,
        "never fails over into a second"
    );
    assert_eq!(r.cloud.count(Op::Delete), 0);
    assert_eq!(r.cloud.instances()[0].status, InstanceStatus::Stopped);
    // Once the quota frees up, the next apply starts it.
    r.cloud.clear_faults();
    let end = r.launch().await.unwrap();
    assert_eq!(end.ready().expect("ready").instance_id, id);
}

#[tokio::test]
async fn a_stopped_machine_on_a_cloud_that_cannot_start_is_kept() {
    let r = Run::new(two_regions());
    let id = r
        .launch()
        .await
        .unwrap()
        .ready()
        .unwrap()
        .instance_id
        .clone();
    r.cloud.stop_instance(&id);
    let end = r.launch().await.unwrap();
    let LaunchState::Aborted { reason, owned } = &end else {
        panic!("expected Aborted, got {end:?}");
    };
    assert!(reason.contains("cannot start"), "{reason}");
    assert!(owned.as_ref().and_then(|o| o.vm.as_ref()).is_some());
    assert_eq!(r.cloud.count(Op::Delete), 0);
    assert_eq!(r.cloud.count(Op::Create), 1);
}

#[tokio::test]
async fn a_replacement_never_resends_a_token_the_cloud_used() {
    let r = Run::new(two_regions().with_remembered_tokens());
    let first = r.launch().await.unwrap();
    let id = first.ready().expect("ready").instance_id.clone();
    r.cloud.terminate_instance(&id);
    let end = r.launch().await.unwrap();
    let vm = end.ready().expect("replaced");
    assert_ne!(vm.instance_id, id);
    assert_eq!(r.cloud.count(Op::Create), 2);
}

#[tokio::test]
async fn side_resources_of_an_abandoned_offer_are_cleaned_up() {
    let r = Run::new(two_regions().with_fault(
        Op::Prepare,
        Some("east-a"),
        err(ErrorKind::Failed, "authorizing the security group failed"),
        u32::MAX,
    ));
    r.cloud.fault(
        Op::Prepare,
        Some("east-b"),
        err(ErrorKind::Failed, "authorizing the security group failed"),
        u32::MAX,
    );
    let end = r.launch().await.unwrap();
    assert_eq!(end.ready().expect("ready").offer.id, "west-a");
    assert_eq!(
        r.cloud.side_resources(),
        [("trainer".to_string(), "aws/us-west-2".to_string())],
        "only the region in use keeps its security group"
    );
    // east-a → east-b stays in the region (its group is reused), east-b → west-a leaves.
    assert_eq!(r.cloud.count(Op::Cleanup), 1, "{:?}", r.cloud.calls());
}

#[tokio::test]
async fn an_exhausted_search_leaves_no_side_resource() {
    let r = Run::new(two_regions().with_fault(
        Op::Create,
        None,
        err(ErrorKind::Capacity, "InsufficientInstanceCapacity"),
        u32::MAX,
    ));
    let end = r.launch().await.unwrap();
    assert!(matches!(end, LaunchState::Exhausted { .. }), "{end:?}");
    assert!(
        r.cloud.side_resources().is_empty(),
        "{:?}",
        r.cloud.side_resources()
    );
    assert!(end.owned().is_none());
}

#[tokio::test]
async fn cancelling_during_prepare_cleans_up_its_side_resources() {
    let r = Run::new(two_regions());
    let m = r.machine();
    use gpuprov::machine::Machine as _;
    let offers = r.cloud.plan(&r.vm.request()).await.unwrap();
    let preparing = LaunchState::Preparing {
        search: gpuprov::vm::Search {
            offers,
            ..Default::default()
        },
    };
    assert!(preparing.owned().is_some(), "destroy sees the region");
    let after = m.on_cancel(&preparing).expect("maps");
    assert!(
        matches!(after, LaunchState::Compensating { .. }),
        "{after:?}"
    );
}

#[tokio::test]
async fn destroy_after_an_interrupted_create_waits_for_the_listing() {
    // The instance exists but is invisible to list and delete for a few calls.
    let cloud = Arc::new(two_regions().with_list_lag(5).with_delete_lag());
    let offers = cloud
        .plan(&VmSpec::new("trainer", vec![Cloud::Aws]).request())
        .await
        .unwrap();
    let creating = LaunchState::Creating {
        search: gpuprov::vm::Search {
            offers: offers.clone(),
            ..Default::default()
        },
        prepared: serde_json::json!({}),
        sent: true,
    };
    let spec = trainer_spec();
    cloud
        .create(&offers[0], &serde_json::json!({}), &spec)
        .await
        .unwrap();
    let owned = creating.owned().unwrap();
    assert!(owned.unsettled);
    let mut p = Providers::new();
    p.insert(cloud.clone());
    let mut td = TeardownMachine::new(p);
    td.retry = FAST;
    let ex = Executor::new(Arc::new(MemoryJournal::new()), CancelToken::new());
    let end = ex
        .run(&td, "vm.trainer", |_| TeardownState::Requesting {
            target: Target::of(owned, "trainer"),
        })
        .await
        .unwrap();
    assert_eq!(end, TeardownState::Done);
    assert!(
        cloud.instances().is_empty(),
        "found once listed, and deleted"
    );
}

#[tokio::test]
async fn a_side_resource_in_use_makes_teardown_look_again() {
    let cloud = Arc::new(two_regions().with_list_lag(3).with_dependency_errors());
    let offers = cloud
        .plan(&VmSpec::new("trainer", vec![Cloud::Aws]).request())
        .await
        .unwrap();
    let spec = trainer_spec();
    cloud.prepare(&offers[0], &spec).await.unwrap();
    cloud
        .create(&offers[0], &serde_json::json!({}), &spec)
        .await
        .unwrap();
    let mut p = Providers::new();
    p.insert(cloud.clone());
    let mut td = TeardownMachine::new(p);
    td.retry = RetryPolicy {
        max_attempts: 10,
        ..FAST
    };
    let ex = Executor::new(Arc::new(MemoryJournal::new()), CancelToken::new());
    let end = ex
        .run(&td, "vm.trainer", |_| TeardownState::Requesting {
            target: Target::new(here("us-east-1"), "trainer", vec![]),
        })
        .await
        .unwrap();
    assert_eq!(end, TeardownState::Done);
    assert!(cloud.instances().is_empty());
    assert!(cloud.side_resources().is_empty());
}

#[tokio::test]
async fn the_vanish_grace_follows_the_clouds_listing_lag() {
    let cloud = two_regions().with_list_lag(40);
    let mut caps = cloud.capabilities_for_test();
    caps.create_list_lag = Duration::from_secs(5);
    let r = Run::new(cloud.with_capabilities(caps));
    let mut m = r.machine();
    m.vanish_grace = None;
    let ex = Executor::new(r.journal.clone(), CancelToken::new());
    let end = ex
        .run(&m, "vm.trainer", |_| LaunchState::start(None))
        .await
        .unwrap();
    assert!(end.ready().is_some(), "{end:?}");
    assert_eq!(r.cloud.count(Op::Create), 1);
}

#[tokio::test]
async fn a_refused_key_on_a_new_instance_ends_after_the_short_grace() {
    let r = Run::new(two_regions());
    r.connector
        .fail_with((0..100_000).map(|_| refused()).collect());
    let mut m = r.machine();
    m.auth_refused_grace = Duration::from_millis(30);
    let ex = Executor::new(r.journal.clone(), CancelToken::new());
    let end = ex
        .run(&m, "vm.trainer", |_| LaunchState::start(None))
        .await
        .unwrap();
    // Ended by the refusal, not by the (2 s) ssh timeout.
    let LaunchState::Exhausted { search } = &end else {
        panic!("expected Exhausted, got {end:?}");
    };
    assert!(
        search
            .history
            .iter()
            .all(|a| a.outcome.contains("key refused")),
        "{:?}",
        search.history
    );
    assert!(r.cloud.instances().is_empty(), "ours are compensated");
}

#[tokio::test]
async fn an_endpoint_that_refuses_connections_blocks_its_cloud_once() {
    let aws = Arc::new(two_regions().with_fault(
        Op::Prepare,
        None,
        err(ErrorKind::Unreachable, "connection refused"),
        u32::MAX,
    ));
    let lambda =
        Arc::new(FakeProvider::new("lambda").with_offer("l-1", "us-tx-1", "gpu_1x_h100", 2.5));
    let mut providers = Providers::new();
    providers.insert(aws.clone());
    providers.insert(lambda.clone());
    let mut m = LaunchMachine::new(
        VmSpec::new("trainer", vec![Cloud::Aws, Cloud::Lambda]),
        "0f0e0d0c-lineage".into(),
        "ssh-ed25519 AAAAtest gpuprov".into(),
        providers,
        Arc::new(FakeConnector::default()),
    );
    m.retry = FAST;
    let ex = Executor::new(Arc::new(MemoryJournal::new()), CancelToken::new());
    let end = ex
        .run(&m, "vm.trainer", |_| LaunchState::start(None))
        .await
        .unwrap();
    assert_eq!(end.ready().expect("ready").offer.id, "l-1");
    assert_eq!(
        aws.count(Op::Prepare),
        1,
        "one refusal blocks every aws region"
    );
}

#[tokio::test]
async fn a_failed_prepare_or_a_cancel_never_sweeps_an_instance_it_did_not_create() {
    // A stopped instance of the identity sits in us-east-1, which the first two offers use;
    // both fail in prepare after creating their side resource.
    let r = Run::new(
        two_regions()
            .with_fault(
                Op::Prepare,
                Some("east-a"),
                err(ErrorKind::Failed, "sg"),
                u32::MAX,
            )
            .with_fault(
                Op::Prepare,
                Some("east-b"),
                err(ErrorKind::Failed, "sg"),
                u32::MAX,
            ),
    );
    let theirs = r
        .cloud
        .insert_instance("trainer", here("us-east-1"), InstanceStatus::Stopped);
    let end = r.launch().await.unwrap();
    assert_eq!(end.ready().expect("ready").offer.id, "west-a");
    assert!(
        r.cloud.instances().iter().any(|i| i.id == theirs),
        "compensating a prepare deletes nothing it did not create"
    );
    assert_eq!(r.cloud.count(Op::Delete), 0, "{:?}", r.cloud.calls());

    // Cancelled during prepare: the compensation cleans up, deletes nothing.
    let m = r.machine();
    use gpuprov::machine::Machine as _;
    let offers = r.cloud.plan(&r.vm.request()).await.unwrap();
    let cancelled = m
        .on_cancel(&LaunchState::Preparing {
            search: gpuprov::vm::Search {
                offers,
                ..Default::default()
            },
        })
        .unwrap();
    let LaunchState::Compensating { teardown, .. } = &cancelled else {
        panic!("{cancelled:?}");
    };
    let TeardownState::Requesting { target } = teardown else {
        panic!("{teardown:?}");
    };
    assert!(
        target.named_only && target.instance_ids.is_empty(),
        "{target:?}"
    );
}

#[tokio::test]
async fn a_restart_that_the_cloud_reports_late_is_waited_for() {
    let r = Run::new(startable(two_regions().with_start_lag(3)));
    let id = r
        .launch()
        .await
        .unwrap()
        .ready()
        .unwrap()
        .instance_id
        .clone();
    r.cloud.stop_instance(&id);
    let end = r.launch().await.unwrap();
    assert_eq!(end.ready().expect("ready again").instance_id, id);
    assert_eq!(r.cloud.count(Op::Create), 1);
}

/// The long-running-operation rule of the contract: a create the cloud accepted and then
/// refused in its operation (GCP's `ZONE_RESOURCE_POOL_EXHAUSTED`) is handled like a
/// refused create: capacity blocks the offer and the search fails over, and nothing is
/// left behind.
#[tokio::test]
async fn a_create_refused_late_in_its_operation_fails_over_like_capacity() {
    let cloud = two_regions();
    cloud.refuse_late(
        "east-a",
        err(ErrorKind::Capacity, "ZONE_RESOURCE_POOL_EXHAUSTED"),
    );
    let r = Run::new(cloud);
    let end = r.launch().await.unwrap();
    let vm = end.ready().expect("ready");
    assert_eq!(vm.offer.id, "east-b", "capacity blocks only the offer");
    assert_eq!(r.cloud.count(Op::Create), 2);
    assert!(
        r.labels().iter().any(|l| l.starts_with("compensating (")
            && l.ends_with("): create: ZONE_RESOURCE_POOL_EXHAUSTED")),
        "{:?}",
        r.labels()
    );
    let live: Vec<_> = r
        .cloud
        .instances()
        .into_iter()
        .filter(|i| !matches!(i.status, InstanceStatus::Refused(_)))
        .collect();
    assert_eq!(live.len(), 1, "only the running machine exists");
}

#[tokio::test]
async fn a_quota_refused_late_blocks_the_whole_region() {
    let cloud = two_regions();
    cloud.refuse_late("east-a", err(ErrorKind::Quota, "QUOTA_EXCEEDED"));
    let r = Run::new(cloud);
    let end = r.launch().await.unwrap();
    assert_eq!(
        end.ready().expect("ready").offer.id,
        "west-a",
        "quota blocks us-east-1, east-b included"
    );
}

/// A `MakeWriter` collecting the structured log in memory.
#[derive(Clone, Default)]
struct LogBuf(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Issue 19 (`GPUPROV_LOG`): the executor logs one span per machine and one per step,
/// with the offer's cloud, region and id and the attempt, and an event per transition and
/// retry.
#[tokio::test]
async fn the_structured_log_has_a_span_per_machine_and_step_with_the_offer() {
    let cloud = two_regions().with_fault(
        Op::Create,
        Some("east-a"),
        err(ErrorKind::Transient, "502 from the API"),
        1,
    );
    let r = Run::new(cloud);
    let buf = LogBuf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("gpuprov=info"))
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    r.launch().await.unwrap().ready().expect("ready");
    let log = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    assert!(
        lines
            .iter()
            .all(|l| l.contains("machine{address=vm.trainer kind=launch}")),
        "{log}"
    );
    let creating = lines
        .iter()
        .find(|l| l.contains("step{state=creating") && l.contains("transition"))
        .unwrap_or_else(|| panic!("a transition out of creating: {log}"));
    for field in ["cloud=aws", "region=us-east-1", "offer=east-a", "attempt="] {
        assert!(creating.contains(field), "{field}: {creating}");
    }
    assert!(
        lines.iter().any(|l| l.contains("retry")
            && l.contains("attempt=1")
            && l.contains("502 from the API")),
        "{log}"
    );
    assert!(lines.iter().any(|l| l.contains("to=ready")), "{log}");
}
