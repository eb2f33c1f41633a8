//! Launch- and teardown-machine tests (design 6) against the scripted FakeProvider: each
//! scenario builds a cloud, runs the machine through the real executor and a journal, and
//! checks the end state, the journal and what the cloud saw.

#[path = "support/clouds.rs"]
mod clouds;

use std::sync::Arc;
use std::time::Duration;

use clouds::{Gate, TestCloud};
use gpuprov::config::{Cloud, VmSpec};
use gpuprov::machine::{CancelToken, ExecError, Executor, MemoryJournal, RetryPolicy};
use gpuprov::provider::fake::{FakeConnector, FakeProvider, Op};
use gpuprov::provider::{
    CloudProvider, ErrorKind, InstanceStatus, Location, ProviderError, Providers,
};
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
        m.vanish_grace = Duration::from_millis(20);
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
    // Boot fails (the instance reports Failed), and delete keeps failing.
    let r = Run::new(FakeProvider::new("aws").with_offer("only", "us-east-1", "p5.48xlarge", 98.0));
    let loc = Location {
        cloud: "aws".into(),
        region: "us-east-1".into(),
        zone: None,
    };
    let id = r
        .cloud
        .insert_instance("trainer", loc, InstanceStatus::Failed("hardware".into()));
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
    let target = Target {
        location: loc,
        vm_name: "trainer".into(),
        instance_ids: vec![known],
    };
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
    let target = Target {
        location: loc,
        vm_name: "trainer".into(),
        instance_ids: vec!["i-1".into()],
    };
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
    let r = Run::new(two_regions().with_list_lag(2));
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
    let r = Arc::new(Run::new(two_regions().with_list_lag(3)));
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
