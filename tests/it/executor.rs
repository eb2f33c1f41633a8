//! Executor tests (design 6): a toy machine checks persistence, resume after a simulated
//! crash, retry exhaustion, polling without budget, and the cancellation mapping.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use gpuprov::machine::{
    CancelToken, ExecError, Executor, Machine, MemoryJournal, PrevRecord, RetryPolicy, Step, StepCx,
};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Toy {
    A,
    B,
    /// Polls `n` more times, then goes to Done.
    Waiting(u32),
    /// Fails transiently forever.
    Flaky,
    Done,
    GaveUp(String),
    Compensated,
}

#[derive(Default)]
struct ToyMachine {
    steps: AtomicU32,
    hang_in_waiting: bool,
}

#[async_trait]
impl Machine for ToyMachine {
    type State = Toy;
    const KIND: &'static str = "toy";
    fn is_terminal(&self, s: &Toy) -> bool {
        matches!(s, Toy::Done | Toy::GaveUp(_) | Toy::Compensated)
    }
    fn label(&self, s: &Toy) -> String {
        format!("{s:?}").to_lowercase()
    }
    async fn step(&self, s: &Toy, _cx: &StepCx) -> Step<Toy> {
        self.steps.fetch_add(1, Ordering::SeqCst);
        match s {
            Toy::A => Step::Next(Toy::B),
            Toy::B => Step::Next(Toy::Waiting(3)),
            Toy::Waiting(_) if self.hang_in_waiting => {
                Step::poll(Duration::from_secs(3600), "hanging")
            }
            Toy::Waiting(0) => Step::Next(Toy::Done),
            // Above 3: poll (same state) until ten steps have run, then count down.
            Toy::Waiting(n) if *n > 3 && self.steps.load(Ordering::SeqCst) <= 10 => {
                Step::poll(Duration::from_millis(1), "not yet")
            }
            Toy::Waiting(n) if *n > 3 => Step::Next(Toy::Waiting(3)),
            Toy::Waiting(n) => Step::Next(Toy::Waiting(n - 1)),
            Toy::Flaky => Step::retry("flaky"),
            other => Step::Next(other.clone()),
        }
    }
    fn retry_policy(&self, _s: &Toy) -> RetryPolicy {
        RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(4),
        }
    }
    fn on_retries_exhausted(&self, _s: &Toy, last_error: String) -> Toy {
        Toy::GaveUp(last_error)
    }
    fn on_cancel(&self, s: &Toy) -> Option<Toy> {
        match s {
            Toy::Waiting(_) | Toy::B => Some(Toy::Compensated),
            _ => None,
        }
    }
}

fn labels(j: &MemoryJournal) -> Vec<String> {
    j.history().into_iter().map(|(_, l)| l).collect()
}

#[tokio::test]
async fn every_transition_is_journalled_in_order() {
    let j = Arc::new(MemoryJournal::new());
    let ex = Executor::new(j.clone(), CancelToken::new());
    let end = ex
        .run(&ToyMachine::default(), "vm.x", |_| Toy::A)
        .await
        .unwrap();
    assert_eq!(end, Toy::Done);
    assert_eq!(
        labels(&j),
        [
            "a",
            "b",
            "waiting(3)",
            "waiting(2)",
            "waiting(1)",
            "waiting(0)",
            "done"
        ]
    );
    assert_eq!(j.get("vm.x").unwrap().kind, "toy");
}

#[tokio::test]
async fn a_crash_resumes_from_the_last_durable_state() {
    let j = Arc::new(MemoryJournal::new());
    j.crash_before("waiting(1)");
    let m = ToyMachine::default();
    let ex = Executor::new(j.clone(), CancelToken::new());
    let err = ex.run(&m, "vm.x", |_| Toy::A).await.unwrap_err();
    assert!(matches!(err, ExecError::Journal { .. }), "{err:?}");
    assert_eq!(
        j.get("vm.x").unwrap().state,
        serde_json::json!({"Waiting": 2})
    );

    // The second run must not call `initial`: it resumes from Waiting(2).
    let end = ex
        .run(&m, "vm.x", |_| panic!("initial state requested on resume"))
        .await
        .unwrap();
    assert_eq!(end, Toy::Done);
    assert_eq!(labels(&j).last().unwrap(), "done");
}

#[tokio::test]
async fn progress_says_resumed_then_each_transition_wait_and_retry() {
    use gpuprov::machine::Progress;
    let j = Arc::new(MemoryJournal::new());
    j.crash_before("waiting(1)");
    let m = ToyMachine::default();
    let ex = Executor::new(j.clone(), CancelToken::new());
    ex.run(&m, "vm.x", |_| Toy::A).await.unwrap_err();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let ex = ex.with_progress(tx);
    ex.run(&m, "vm.x", |_| panic!("must resume")).await.unwrap();
    drop(ex);
    let mut events = Vec::new();
    while let Some(e) = rx.recv().await {
        events.push(e);
    }
    // The resumed state first, then the transitions; a toy has no facts.
    assert!(
        matches!(&events[0], Progress::Resumed { key, label, .. } if key == "vm.x" && label == "waiting(2)"),
        "{events:?}"
    );
    let labels: Vec<&str> = events[1..]
        .iter()
        .map(|e| match e {
            Progress::Transition { label, .. } => label.as_str(),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(labels, ["waiting(1)", "waiting(0)", "done"]);

    // Polls arrive as expected waits, transient failures as retries.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let ex = Executor::new(Arc::new(MemoryJournal::new()), CancelToken::new()).with_progress(tx);
    ex.run(&ToyMachine::default(), "vm.p", |_| Toy::Waiting(5))
        .await
        .unwrap();
    ex.run(&ToyMachine::default(), "vm.f", |_| Toy::Flaky)
        .await
        .unwrap();
    drop(ex);
    let (mut polls, mut retries) = (0, 0);
    while let Some(e) = rx.recv().await {
        match e {
            Progress::Poll { note, .. } => {
                assert_eq!(note, "not yet");
                polls += 1;
            }
            Progress::Retry { max, .. } => {
                assert_eq!(max, 4);
                retries += 1;
            }
            _ => {}
        }
    }
    assert!(polls > 0);
    assert_eq!(retries, 3, "the fourth failure exhausts the budget");
}

#[tokio::test]
async fn a_terminal_record_gets_a_fresh_run_that_sees_it() {
    let j = Arc::new(MemoryJournal::new());
    j.put(
        "vm.x",
        PrevRecord {
            kind: "toy".into(),
            state: serde_json::json!("Done"),
        },
    );
    let ex = Executor::new(j.clone(), CancelToken::new());
    let mut seen = None;
    let end = ex
        .run(&ToyMachine::default(), "vm.x", |prev| {
            seen = prev;
            Toy::B
        })
        .await
        .unwrap();
    assert_eq!(end, Toy::Done);
    assert_eq!(seen.unwrap().state, serde_json::json!("Done"));
}

#[tokio::test]
async fn retries_are_budgeted_and_exhaustion_names_the_failure_state() {
    let j = Arc::new(MemoryJournal::new());
    let m = ToyMachine::default();
    let ex = Executor::new(j.clone(), CancelToken::new());
    let end = ex.run(&m, "vm.x", |_| Toy::Flaky).await.unwrap();
    assert_eq!(end, Toy::GaveUp("flaky".into()));
    assert_eq!(
        m.steps.load(Ordering::SeqCst),
        4,
        "max_attempts steps, then exhaustion"
    );
    assert_eq!(labels(&j), ["flaky", "gaveup(\"flaky\")"]);
}

#[tokio::test]
async fn a_record_of_the_wrong_shape_is_an_error_not_a_panic() {
    let j = Arc::new(MemoryJournal::new());
    j.put(
        "vm.x",
        PrevRecord {
            kind: "toy".into(),
            state: serde_json::json!({"Nope": 1}),
        },
    );
    let ex = Executor::new(j, CancelToken::new());
    let err = ex
        .run(&ToyMachine::default(), "vm.x", |_| Toy::A)
        .await
        .unwrap_err();
    assert!(matches!(err, ExecError::BadRecord { .. }), "{err:?}");
}

#[tokio::test]
async fn first_cancel_maps_to_the_compensating_state() {
    let j = Arc::new(MemoryJournal::new());
    let cancel = CancelToken::new();
    let m = Arc::new(ToyMachine {
        hang_in_waiting: true,
        ..Default::default()
    });
    let ex = Executor::new(j.clone(), cancel.clone());
    let task = {
        let m = m.clone();
        tokio::spawn(async move { ex.run(&*m, "vm.x", |_| Toy::A).await })
    };
    // Wait until it is polling in Waiting, then cancel once.
    for _ in 0..200 {
        if labels(&j)
            .last()
            .map(|l| l.starts_with("waiting"))
            .unwrap_or(false)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(cancel.escalate(), 1);
    let end = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(end, Toy::Compensated);
    assert_eq!(labels(&j).last().unwrap(), "compensated");
}

#[tokio::test]
async fn second_cancel_exits_and_leaves_the_journal_resumable() {
    let j = Arc::new(MemoryJournal::new());
    let cancel = CancelToken::new();
    let m = Arc::new(ToyMachine {
        hang_in_waiting: true,
        ..Default::default()
    });
    cancel.escalate();
    cancel.escalate();
    let ex = Executor::new(j.clone(), cancel.clone());
    let err = ex.run(&*m, "vm.x", |_| Toy::Waiting(1)).await.unwrap_err();
    assert!(matches!(err, ExecError::Interrupted { .. }), "{err:?}");
    // The initial state was journalled before anything ran, so a resume continues it.
    assert_eq!(
        j.get("vm.x").unwrap().state,
        serde_json::json!({"Waiting": 1})
    );
    let ex2 = Executor::new(j.clone(), CancelToken::new());
    let end = ex2
        .run(&ToyMachine::default(), "vm.x", |_| panic!("must resume"))
        .await
        .unwrap();
    assert_eq!(end, Toy::Done);
}

#[tokio::test]
async fn polls_do_not_consume_the_retry_budget() {
    // Ten polls in a row, more than the budget of four retries.
    let j = Arc::new(MemoryJournal::new());
    let ex = Executor::new(j.clone(), CancelToken::new());
    let m = ToyMachine::default();
    let end = ex.run(&m, "vm.x", |_| Toy::Waiting(10)).await.unwrap();
    assert_eq!(end, Toy::Done);
    assert!(m.steps.load(Ordering::SeqCst) > 10);
    assert_eq!(labels(&j)[..2], ["waiting(10)", "waiting(3)"]);
}

#[test]
fn backoff_grows_and_is_capped() {
    let p = RetryPolicy {
        max_attempts: 10,
        initial_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_secs(1),
    };
    let b1 = p.backoff(1);
    let b3 = p.backoff(3);
    let b9 = p.backoff(9);
    assert!(
        b1 >= Duration::from_millis(100) && b1 <= Duration::from_millis(120),
        "{b1:?}"
    );
    assert!(
        b3 >= Duration::from_millis(400) && b3 <= Duration::from_millis(480),
        "{b3:?}"
    );
    assert!(b9 <= Duration::from_secs(1), "{b9:?}");
}
