//! The write-ahead journal beside the state file (`state::wal`): replay after a crash,
//! torn tails, corruption, foreign journals, folding, and group commit.

use std::fs;
use std::path::PathBuf;

use chrono::Utc;
use gpuprov::state::{journal_path, JournalOp, MachineRecord, StateError, StateStore};
use serde_json::json;
use tempfile::TempDir;

fn state_path(dir: &TempDir) -> PathBuf {
    dir.path().join("gpuprov.state.json")
}

/// A launch transition of `key` to `label` (shared with the backend tests).
pub(crate) fn transition(key: &str, label: &str) -> JournalOp {
    JournalOp::Transition {
        key: key.into(),
        machine: MachineRecord {
            kind: "launch".into(),
            state: json!({"state": label}).into(),
            label: label.into(),
            updated_at: Utc::now(),
        },
        desired: None,
    }
}

/// A state file with serial 1 (one fold of an empty run), and its lineage.
fn saved_state(dir: &TempDir) -> String {
    let (mut store, mut state) = StateStore::open(state_path(dir)).unwrap();
    store.save(&mut state).unwrap();
    state.lineage
}

#[tokio::test]
async fn a_crashed_run_is_replayed_by_readers_and_folded_by_the_next_writer() {
    let dir = TempDir::new().unwrap();
    let lineage = saved_state(&dir);
    let before = fs::read(state_path(&dir)).unwrap();

    let (mut store, mut state) = StateStore::open(state_path(&dir)).unwrap();
    let writer = store.begin_journal(&mut state).unwrap();
    for label in ["reconciling", "planning", "creating"] {
        writer.append(&transition("vm.a", label)).await.unwrap();
    }
    writer
        .append(&transition("vm.b", "planning"))
        .await
        .unwrap();
    writer
        .append(&JournalOp::Remove { key: "vm.b".into() })
        .await
        .unwrap();
    // The process dies here: no fold.
    drop(writer);
    drop(store);
    assert_eq!(
        fs::read(state_path(&dir)).unwrap(),
        before,
        "the state file is rewritten only by the fold"
    );

    // A reader (status, plan) sees every durable transition.
    let (reader, seen) = StateStore::open(state_path(&dir)).unwrap();
    assert!(reader.replayed_journal());
    assert_eq!(seen.lineage, lineage);
    assert_eq!(seen.serial, 1);
    let a = &seen.resources["vm.a"];
    assert_eq!(a.machine.label, "creating");
    let labels: Vec<&str> = a.events.iter().map(|e| e.label.as_str()).collect();
    assert_eq!(labels, ["reconciling", "planning", "creating"]);
    assert!(
        !seen.resources.contains_key("vm.b"),
        "the remove replays too"
    );
    assert_eq!(
        fs::read(state_path(&dir)).unwrap(),
        before,
        "readers write nothing"
    );

    // The next writer folds it first (one save), then starts its own journal.
    let (mut store, mut state) = StateStore::open(state_path(&dir)).unwrap();
    let writer = store.begin_journal(&mut state).unwrap();
    assert_eq!(state.serial, 2);
    let (_, on_disk) = {
        // Only the file, without the new (empty) journal: the fold is in it.
        let raw: serde_json::Value =
            serde_json::from_slice(&fs::read(state_path(&dir)).unwrap()).unwrap();
        ((), raw)
    };
    assert_eq!(on_disk["serial"], 2);
    assert_eq!(
        on_disk["resources"]["vm.a"]["machine"]["label"], "creating",
        "the crashed run's transitions are in the file now"
    );
    let journal = fs::read_to_string(writer.path()).unwrap();
    assert_eq!(
        journal.lines().count(),
        1,
        "a fresh journal holds its header only"
    );
    assert!(journal.contains("\"base_serial\":2"), "{journal}");
}

#[tokio::test]
async fn a_first_run_that_crashed_before_any_fold_keeps_its_lineage() {
    let dir = TempDir::new().unwrap();
    let (mut store, mut state) = StateStore::open(state_path(&dir)).unwrap();
    let lineage = state.lineage.clone();
    let writer = store.begin_journal(&mut state).unwrap();
    writer
        .append(&transition("vm.a", "creating"))
        .await
        .unwrap();
    drop(writer);
    assert!(
        !state_path(&dir).exists(),
        "no state file yet, only the journal"
    );

    let (_, seen) = StateStore::open(state_path(&dir)).unwrap();
    assert_eq!(
        seen.lineage, lineage,
        "the journal's lineage is adopted, so the machine's labels still match"
    );
    assert_eq!(seen.resources["vm.a"].machine.label, "creating");
}

#[tokio::test]
async fn a_torn_last_line_is_ignored_and_a_corrupt_line_refused() {
    let dir = TempDir::new().unwrap();
    saved_state(&dir);
    let (mut store, mut state) = StateStore::open(state_path(&dir)).unwrap();
    let writer = store.begin_journal(&mut state).unwrap();
    writer
        .append(&transition("vm.a", "planning"))
        .await
        .unwrap();
    drop(writer);
    let jpath = journal_path(&state_path(&dir));

    // A crash in the middle of a write: the line has no newline and was never acted on.
    let mut torn = fs::read(&jpath).unwrap();
    torn.extend_from_slice(br#"{"op":"transition","key":"vm.a","mach"#);
    fs::write(&jpath, &torn).unwrap();
    let (_, seen) = StateStore::open(state_path(&dir)).unwrap();
    assert_eq!(seen.resources["vm.a"].machine.label, "planning");

    // A complete line that does not parse is corruption: refused, nothing rewritten.
    let mut bad = fs::read(&jpath).unwrap();
    bad.truncate(bad.len() - br#"{"op":"transition","key":"vm.a","mach"#.len());
    bad.extend_from_slice(b"{not json}\n");
    bad.extend_from_slice(
        (serde_json::to_string(&transition("vm.a", "creating")).unwrap() + "\n").as_bytes(),
    );
    fs::write(&jpath, &bad).unwrap();
    let state_before = fs::read(state_path(&dir)).unwrap();
    let err = StateStore::open(state_path(&dir)).unwrap_err();
    match &err {
        StateError::CorruptJournal { line, .. } => assert_eq!(*line, 3),
        other => panic!("expected CorruptJournal, got {other:?}"),
    }
    use miette::Diagnostic as _;
    assert!(err.to_string().contains("at line 3"), "{err}");
    let help = err.help().map(|h| h.to_string()).unwrap_or_default();
    assert!(help.contains("neither file was modified"), "{help}");
    assert_eq!(fs::read(&jpath).unwrap(), bad);
    assert_eq!(fs::read(state_path(&dir)).unwrap(), state_before);
}

#[tokio::test]
async fn a_journal_of_another_state_or_ahead_of_it_is_refused() {
    let dir = TempDir::new().unwrap();
    saved_state(&dir);
    let jpath = journal_path(&state_path(&dir));

    fs::write(
        &jpath,
        "{\"gpuprov_journal\":1,\"lineage\":\"5b0f7c1e-3a43-4f6e-9a51-6f2b1d2a9c10\",\"base_serial\":1}\n",
    )
    .unwrap();
    let err = StateStore::open(state_path(&dir)).unwrap_err();
    assert!(
        matches!(&err, StateError::JournalMismatch { what, .. } if what.contains("lineage")),
        "{err:?}"
    );

    let (_, state) = {
        fs::remove_file(&jpath).unwrap();
        StateStore::open(state_path(&dir)).unwrap()
    };
    fs::write(
        &jpath,
        format!(
            "{{\"gpuprov_journal\":1,\"lineage\":\"{}\",\"base_serial\":9}}\n",
            state.lineage
        ),
    )
    .unwrap();
    let err = StateStore::open(state_path(&dir)).unwrap_err();
    assert!(
        matches!(&err, StateError::JournalMismatch { what, .. } if what.contains("serial 9")),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_journal_already_folded_is_ignored_then_replaced() {
    let dir = TempDir::new().unwrap();
    saved_state(&dir);
    let (mut store, mut state) = StateStore::open(state_path(&dir)).unwrap();
    let writer = store.begin_journal(&mut state).unwrap();
    writer.append(&transition("vm.a", "ready")).await.unwrap();
    // The fold happened (state saved) but the process died before deleting the journal.
    let mut folded = state.clone();
    folded.resources.insert(
        "vm.a".into(),
        gpuprov::state::ResourceRecord::new(MachineRecord {
            kind: "launch".into(),
            state: json!({"state": "ready"}).into(),
            label: "ready".into(),
            updated_at: Utc::now(),
        }),
    );
    store.save(&mut folded).unwrap();
    drop(writer);

    let (store, seen) = StateStore::open(state_path(&dir)).unwrap();
    assert!(!store.replayed_journal());
    assert_eq!(seen.serial, folded.serial);
    assert_eq!(
        seen.resources["vm.a"].events.len(),
        0,
        "the folded journal is not applied a second time"
    );
}

#[tokio::test]
async fn queued_changes_share_one_fsync() {
    let dir = TempDir::new().unwrap();
    let (mut store, mut state) = StateStore::open(state_path(&dir)).unwrap();
    let writer = store.begin_journal(&mut state).unwrap();
    let base = writer.stats();
    let mut last = 0;
    for i in 0..10 {
        last = writer
            .queue(&transition(&format!("vm.m{i}"), "planning"))
            .unwrap();
    }
    writer.wait_durable(last).await.unwrap();
    let after = writer.stats();
    assert_eq!(after.appends, 10);
    assert_eq!(
        after.syncs - base.syncs,
        1,
        "one batch for ten queued changes"
    );
    let (_, seen) = StateStore::open(state_path(&dir)).unwrap();
    assert_eq!(seen.resources.len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_are_all_durable_in_memory_order() {
    let dir = TempDir::new().unwrap();
    let (mut store, mut state) = StateStore::open(state_path(&dir)).unwrap();
    let writer = std::sync::Arc::new(store.begin_journal(&mut state).unwrap());
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..50 {
        let w = writer.clone();
        tasks.spawn(async move {
            for label in ["reconciling", "planning", "creating", "ready"] {
                w.append(&transition(&format!("vm.m{i}"), label))
                    .await
                    .unwrap();
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    assert_eq!(writer.stats().appends, 200);
    let (_, seen) = StateStore::open(state_path(&dir)).unwrap();
    assert_eq!(seen.resources.len(), 50);
    for r in seen.resources.values() {
        let labels: Vec<&str> = r.events.iter().map(|e| e.label.as_str()).collect();
        assert_eq!(labels, ["reconciling", "planning", "creating", "ready"]);
    }
}
