//! The state file store and the state lock, against a real temp directory.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::Utc;
use gpuprov::state::lock::{force_unlock, lock_path};
use gpuprov::state::{
    LockError, LockInfo, MachineRecord, ResourceRecord, StateError, StateFile, StateLock,
    StateStore, MAX_EVENTS, STATE_FORMAT_VERSION,
};
use serde_json::json;
use tempfile::TempDir;

fn state_path(dir: &TempDir) -> PathBuf {
    dir.path().join("gpuprov.state.json")
}

fn record(label: &str) -> ResourceRecord {
    ResourceRecord::new(MachineRecord {
        kind: "launch".into(),
        state: json!({"Booting": {"instance_id": "i-123", "offer": 2}}).into(),
        label: label.into(),
        updated_at: Utc::now(),
    })
}

/// A valid state file as a newer gpuprov might write it: known fields plus unknown ones
/// at the top level and per resource.
const NEWER_FIELDS: &str = r#"{
  "version": 1,
  "serial": 7,
  "lineage": "5b0f7c1e-3a43-4f6e-9a51-6f2b1d2a9c10",
  "gpuprov_version": "9.9.9",
  "resources": {
    "vm.dev": {
      "machine": {
        "kind": "launch",
        "state": {"Ready": {"vm": {"ip": "10.0.0.1"}}},
        "label": "ready",
        "updated_at": "2025-01-02T03:04:05Z"
      },
      "drift_cache": {"checked": true}
    }
  },
  "outputs": {"kubeconfig_path": "/tmp/k"}
}
"#;

/// Lists the directory, to catch temp files left behind.
fn dir_entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn round_trip_preserves_records() {
    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    let (mut store, mut state) = StateStore::open(&path).unwrap();
    let mut rec = record("booting");
    rec.desired = Some(json!({"gpu": "H100", "count": 1}).into());
    rec.push_event("searching");
    rec.push_event("booting");
    state.resources.insert("vm.dev".into(), rec);
    state.resources.insert("vm.a".into(), record("searching"));
    store.save(&mut state).unwrap();

    let (_, read) = StateStore::open(&path).unwrap();
    assert_eq!(read, state);
    let text = fs::read_to_string(&path).unwrap();
    assert!(text.ends_with("}\n"), "trailing newline: {text:?}");
    assert!(
        text.contains("\n  \"serial\": 1,"),
        "pretty-printed: {text}"
    );
    // Resources are sorted by address.
    assert!(text.find("\"vm.a\"").unwrap() < text.find("\"vm.dev\"").unwrap());
}

#[test]
fn unknown_fields_survive_a_save() {
    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    fs::write(&path, NEWER_FIELDS).unwrap();
    let (mut store, mut state) = StateStore::open(&path).unwrap();
    assert_eq!(state.extra["outputs"], json!({"kubeconfig_path": "/tmp/k"}));
    assert_eq!(
        state.resources["vm.dev"].extra["drift_cache"],
        json!({"checked": true})
    );
    store.save(&mut state).unwrap();

    let saved: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    assert_eq!(saved["outputs"], json!({"kubeconfig_path": "/tmp/k"}));
    assert_eq!(
        saved["resources"]["vm.dev"]["drift_cache"],
        json!({"checked": true})
    );
    assert_eq!(
        saved["resources"]["vm.dev"]["machine"]["state"],
        json!({"Ready": {"vm": {"ip": "10.0.0.1"}}})
    );
    assert_eq!(saved["serial"], json!(8));
    assert_eq!(
        saved["lineage"],
        json!("5b0f7c1e-3a43-4f6e-9a51-6f2b1d2a9c10")
    );
    // The writer's version is recorded.
    assert_eq!(saved["gpuprov_version"], json!(env!("CARGO_PKG_VERSION")));

    // Records are written pretty, and one read back and saved again is written the same:
    // only the serial moves.
    let first = fs::read_to_string(&path).unwrap();
    assert!(first.contains("\"state\": {\n"), "{first}");
    let (mut store, mut state) = StateStore::open(&path).unwrap();
    store.save(&mut state).unwrap();
    let second = fs::read_to_string(&path).unwrap();
    assert_eq!(
        second.replace("\"serial\": 9,", "\"serial\": 8,"),
        first,
        "a second save rewrites nothing but the serial"
    );
}

/// A value serde_json reads by its grammar but cannot hold (a hand-edited `1e400`) does
/// not stop the state from being saved: it is written back as read.
#[test]
fn a_number_beyond_f64_in_a_record_survives_saves() {
    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    let text = NEWER_FIELDS.replace(r#""ip": "10.0.0.1""#, r#""ip": "10.0.0.1", "big": 1e400"#);
    assert_ne!(text, NEWER_FIELDS);
    fs::write(&path, &text).unwrap();
    for _ in 0..2 {
        let (mut store, mut state) = StateStore::open(&path).unwrap();
        store.save(&mut state).unwrap();
    }
    let saved = fs::read_to_string(&path).unwrap();
    assert!(saved.contains(r#""big": 1e400"#), "{saved}");
    let (_, state) = StateStore::open(&path).unwrap();
    assert_eq!(state.serial, 9);
}

#[test]
fn missing_file_gives_a_new_state_and_serial_counts_saves() {
    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    let (mut store, mut state) = StateStore::open(&path).unwrap();
    assert!(!path.exists(), "open must not create the file");
    assert_eq!(state.serial, 0);
    assert_eq!(state.version, STATE_FORMAT_VERSION);
    assert!(uuid::Uuid::parse_str(&state.lineage).is_ok());
    let lineage = state.lineage.clone();

    store.save(&mut state).unwrap();
    assert_eq!(state.serial, 1);
    store.save(&mut state).unwrap();
    assert_eq!(state.serial, 2);

    let (_, read) = StateStore::open(&path).unwrap();
    assert_eq!(read.serial, 2);
    assert_eq!(read.lineage, lineage);
    // No backup: there was no file when the run started.
    assert!(!store.backup_path().exists());
}

/// Opens each bad file and checks it is reported as corrupt, naming the path, and left
/// byte-for-byte unchanged.
#[test]
fn unparseable_files_are_corrupt_and_untouched() {
    let cases: &[(&str, &[u8])] = &[
        ("empty", b""),
        ("whitespace", b"  \n"),
        ("truncated", &NEWER_FIELDS.as_bytes()[..NEWER_FIELDS.len() / 2]),
        ("not json", b"lineage = \"abc\"\n"),
        ("binary", &[0xff, 0xfe, 0x00, 0x01]),
        ("array", b"[1, 2, 3]\n"),
        ("wrong type", b"{\"version\": 1, \"serial\": \"seven\", \"lineage\": \"x\", \"gpuprov_version\": \"0\"}"),
        ("missing lineage", b"{\"version\": 1, \"serial\": 1, \"gpuprov_version\": \"0\"}"),
        (
            "bad resource",
            b"{\"version\": 1, \"serial\": 1, \"lineage\": \"x\", \"gpuprov_version\": \"0\",\n \"resources\": {\"vm.a\": {\"machine\": 5}}}",
        ),
    ];
    for (name, bytes) in cases {
        let dir = TempDir::new().unwrap();
        let path = state_path(&dir);
        fs::write(&path, bytes).unwrap();
        let err = StateStore::open(&path).expect_err(name);
        let StateError::Corrupt(corrupt) = &err else {
            panic!("{name}: expected Corrupt, got {err:?}");
        };
        assert_eq!(corrupt.path, path, "{name}");
        let message = err.to_string();
        assert!(
            message.contains(&path.display().to_string()),
            "{name}: message names the path: {message}"
        );
        assert!(corrupt.help.contains("NOT modified"), "{name}");
        assert!(corrupt.help.contains(".backup"), "{name}");
        assert!(corrupt.span.offset() <= bytes.len(), "{name}");
        assert_eq!(fs::read(&path).unwrap(), *bytes, "{name}: file unchanged");
        assert_eq!(
            dir_entries(dir.path()),
            vec!["gpuprov.state.json".to_string()],
            "{name}: nothing written beside it"
        );
    }
}

#[test]
fn corrupt_diagnostic_points_at_the_line() {
    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    fs::write(&path, "{\n  \"version\": 1,\n  \"serial\": nope\n}\n").unwrap();
    let err = StateStore::open(&path).unwrap_err();
    let StateError::Corrupt(corrupt) = &err else {
        panic!("expected Corrupt, got {err:?}");
    };
    assert_eq!(corrupt.line, 3);
    let text = fs::read_to_string(&path).unwrap();
    // serde_json reports the byte where it gave up, inside the bad token.
    let token = text.find("nope").unwrap();
    let offset = corrupt.span.offset();
    assert!(
        (token..token + 4).contains(&offset),
        "span {offset} inside `nope` at {token}"
    );

    // The rendered diagnostic shows the file name and the offending line.
    let mut rendered = String::new();
    miette::GraphicalReportHandler::new_themed(miette::GraphicalTheme::unicode_nocolor())
        .render_report(&mut rendered, &err)
        .unwrap();
    assert!(rendered.contains("gpuprov.state.json"), "{rendered}");
    assert!(rendered.contains("\"serial\": nope"), "{rendered}");
    assert!(rendered.contains("gpuprov::state::corrupt"), "{rendered}");
}

#[test]
fn newer_version_is_refused_and_untouched() {
    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    // A newer format may also change shapes, so this one would not even fit our types.
    let bytes = br#"{"version": 2, "serial": 3, "lineage": "x", "resources": []}"#;
    fs::write(&path, bytes).unwrap();
    let err = StateStore::open(&path).unwrap_err();
    match &err {
        StateError::NewerVersion {
            found, supported, ..
        } => {
            assert_eq!(*found, 2);
            assert_eq!(*supported, STATE_FORMAT_VERSION);
        }
        other => panic!("expected NewerVersion, got {other:?}"),
    }
    assert!(err.to_string().contains("newer gpuprov"), "{err}");
    assert_eq!(fs::read(&path).unwrap(), bytes);
}

#[test]
fn backup_holds_the_original_bytes_of_the_run() {
    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    fs::write(&path, NEWER_FIELDS).unwrap();
    let (mut store, mut state) = StateStore::open(&path).unwrap();
    assert!(!store.backup_path().exists(), "open writes nothing");

    store.save(&mut state).unwrap();
    assert_eq!(
        fs::read_to_string(store.backup_path()).unwrap(),
        NEWER_FIELDS
    );
    state.resources.insert("vm.b".into(), record("creating"));
    store.save(&mut state).unwrap();
    assert_eq!(
        fs::read_to_string(store.backup_path()).unwrap(),
        NEWER_FIELDS,
        "a second save of the same run keeps the run's original"
    );

    // The next run backs up what the previous run left.
    let before = fs::read(&path).unwrap();
    let (mut store, mut state) = StateStore::open(&path).unwrap();
    store.save(&mut state).unwrap();
    assert_eq!(fs::read(store.backup_path()).unwrap(), before);
}

#[test]
fn atomic_write_leaves_no_temp_files() {
    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    fs::write(&path, NEWER_FIELDS).unwrap();
    let (mut store, mut state) = StateStore::open(&path).unwrap();
    for i in 0..5 {
        state
            .resources
            .insert(format!("vm.n{i}"), record("searching"));
        store.save(&mut state).unwrap();
    }
    assert_eq!(
        dir_entries(dir.path()),
        vec![
            "gpuprov.state.json".to_string(),
            "gpuprov.state.json.backup".to_string()
        ]
    );
}

#[test]
fn failed_save_keeps_serial_and_cleans_up() {
    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    let (mut store, mut state) = StateStore::open(&path).unwrap();
    fs::create_dir(&path).unwrap();
    let err = store.save(&mut state).unwrap_err();
    assert!(
        matches!(&err, StateError::Io { path: p, .. } if *p == path),
        "{err:?}"
    );
    assert_eq!(state.serial, 0, "serial unchanged after a failed save");
    assert_eq!(
        dir_entries(dir.path()),
        vec!["gpuprov.state.json".to_string()]
    );
}

#[test]
fn save_final_failure_writes_errored_file() {
    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    let (mut store, mut state) = StateStore::open(&path).unwrap();
    state.resources.insert("vm.dev".into(), record("ready"));
    store.save(&mut state).unwrap();
    // Something replaces the state file with a directory: the final save cannot rename.
    fs::remove_file(&path).unwrap();
    fs::create_dir(&path).unwrap();
    state.resources.insert("vm.other".into(), record("booting"));

    let err = store.save_final(&mut state).unwrap_err();
    let errored = dir.path().join("gpuprov.state.json.errored");
    match &err {
        StateError::FinalSaveFailed {
            errored: e,
            path: p,
            ..
        } => {
            assert_eq!(*e, errored);
            assert_eq!(*p, path);
        }
        other => panic!("expected FinalSaveFailed, got {other:?}"),
    }
    let help = miette::Diagnostic::help(&err).unwrap().to_string();
    assert!(
        help.contains(&format!("mv {} {}", errored.display(), path.display())),
        "{help}"
    );
    assert!(err.to_string().contains(&errored.display().to_string()));

    let saved: StateFile = serde_json::from_slice(&fs::read(&errored).unwrap()).unwrap();
    assert_eq!(saved.lineage, state.lineage);
    assert_eq!(saved.serial, 2, "newer than the last good save");
    assert!(saved.resources.contains_key("vm.other"));
}

#[test]
fn save_refuses_another_lineage() {
    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    fs::write(&path, NEWER_FIELDS).unwrap();
    let (mut store, _) = StateStore::open(&path).unwrap();
    let mut other = StateFile::new();
    let err = store.save(&mut other).unwrap_err();
    assert!(matches!(err, StateError::LineageMismatch { .. }), "{err:?}");
    assert_eq!(fs::read_to_string(&path).unwrap(), NEWER_FIELDS);
}

#[test]
fn events_are_bounded_on_disk() {
    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    let (mut store, mut state) = StateStore::open(&path).unwrap();
    let mut rec = record("booting");
    for i in 0..(MAX_EVENTS * 2) {
        rec.push_event(format!("event {i}"));
    }
    state.resources.insert("vm.dev".into(), rec);
    store.save(&mut state).unwrap();
    let (_, read) = StateStore::open(&path).unwrap();
    let events = &read.resources["vm.dev"].events;
    assert_eq!(events.len(), MAX_EVENTS);
    assert_eq!(events[0].label, format!("event {MAX_EVENTS}"));
    assert_eq!(
        events[MAX_EVENTS - 1].label,
        format!("event {}", MAX_EVENTS * 2 - 1)
    );
}

// ---- lock ----

#[test]
fn second_acquire_times_out_naming_the_holder() {
    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    let (first, stale) = StateLock::acquire(&path, "apply", Duration::ZERO).unwrap();
    assert!(stale.is_none());
    assert_eq!(first.lock_path(), lock_path(&path));
    let recorded = LockInfo::read(&path).expect("holder recorded");
    assert_eq!(&recorded, first.info());
    assert_eq!(recorded.pid, std::process::id());
    assert!(recorded.who.contains('@'), "{}", recorded.who);

    let started = std::time::Instant::now();
    let err = StateLock::acquire(&path, "destroy", Duration::from_millis(300)).unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(300));
    let LockError::Held { info, waited, .. } = &err else {
        panic!("expected Held, got {err:?}");
    };
    assert!(*waited >= Duration::from_millis(300));
    let info = info.as_deref().expect("holder info");
    assert_eq!(info.operation, "apply");
    assert_eq!(info.pid, std::process::id());
    let message = err.to_string();
    assert!(
        message.contains("Error acquiring the state lock"),
        "{message}"
    );
    assert!(message.contains("Operation: apply"), "{message}");
    assert!(message.contains(&first.info().id), "{message}");
    assert!(
        message.contains(&format!("PID:       {}", std::process::id())),
        "{message}"
    );
    let help = miette::Diagnostic::help(&err).unwrap().to_string();
    assert!(help.contains("--lock-timeout"), "{help}");
    assert!(
        help.contains(&format!("gpuprov force-unlock {}", first.info().id)),
        "{help}"
    );

    first.release().unwrap();
    assert_eq!(LockInfo::read(&path), None, "release clears the record");
    assert!(lock_path(&path).exists(), "the lock file itself is kept");
    let (second, stale) = StateLock::acquire(&path, "destroy", Duration::ZERO).unwrap();
    assert!(stale.is_none(), "a clean release leaves nothing stale");
    assert_eq!(second.info().operation, "destroy");
}

#[test]
fn drop_releases_the_lock() {
    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    {
        let _lock = StateLock::acquire(&path, "apply", Duration::ZERO).unwrap();
    }
    assert_eq!(LockInfo::read(&path), None);
    let (_lock, stale) = StateLock::acquire(&path, "plan", Duration::ZERO).unwrap();
    assert!(stale.is_none());
}

/// Writes a holder record with no process holding the OS lock, as a holder killed by
/// SIGKILL leaves behind.
fn write_stale_record(path: &Path) -> LockInfo {
    let info = LockInfo {
        id: "3f5e7a52-0c1d-4a4e-bb7b-8f5b8f2d2d11".into(),
        operation: "apply".into(),
        who: "ci@runner-7".into(),
        pid: 999_999,
        version: "0.0.1".into(),
        created: Utc::now(),
        path: path.to_path_buf(),
        ci: Some("https://ci.example/jobs/7".into()),
    };
    fs::write(lock_path(path), serde_json::to_vec(&info).unwrap()).unwrap();
    info
}

#[test]
fn stale_record_is_reported_on_acquire() {
    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    let stale_info = write_stale_record(&path);
    let (lock, stale) = StateLock::acquire(&path, "apply", Duration::ZERO).unwrap();
    assert_eq!(stale, Some(stale_info));
    assert_eq!(
        LockInfo::read(&path).as_ref(),
        Some(lock.info()),
        "our record replaced the stale one"
    );
}

#[test]
fn force_unlock_checks_the_id_and_clears_a_stale_record() {
    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    let err = force_unlock(&path, "whatever").unwrap_err();
    assert!(matches!(err, LockError::NotLocked { .. }), "{err:?}");

    let stale = write_stale_record(&path);
    let err = force_unlock(&path, "wrong-id").unwrap_err();
    match &err {
        LockError::IdMismatch { given, actual, .. } => {
            assert_eq!(given, "wrong-id");
            assert_eq!(*actual, stale.id);
        }
        other => panic!("expected IdMismatch, got {other:?}"),
    }
    assert!(err.to_string().contains(&stale.id), "{err}");
    assert_eq!(LockInfo::read(&path).as_ref(), Some(&stale), "left alone");

    let outcome = force_unlock(&path, &stale.id).unwrap();
    assert_eq!(outcome.cleared, stale);
    assert_eq!(LockInfo::read(&path), None);
    let (_lock, found) = StateLock::acquire(&path, "apply", Duration::ZERO).unwrap();
    assert!(found.is_none(), "nothing stale after force-unlock");
}

#[test]
fn force_unlock_refuses_while_the_holder_lives() {
    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    // flock locks belong to the open file description, so force_unlock's own open of the
    // lock file conflicts with this holder even in the same process.
    let (holder, _) = StateLock::acquire(&path, "apply", Duration::ZERO).unwrap();
    let id = holder.info().id.clone();
    let err = force_unlock(&path, &id).unwrap_err();
    match &err {
        LockError::StillHeld { info, .. } => assert_eq!(info.id, id),
        other => panic!("expected StillHeld, got {other:?}"),
    }
    let help = miette::Diagnostic::help(&err).unwrap().to_string();
    assert!(help.contains("stop that process first"), "{help}");
    assert!(err.to_string().contains(&std::process::id().to_string()));
    assert_eq!(
        LockInfo::read(&path).as_ref(),
        Some(holder.info()),
        "the live record is kept"
    );
    // And the holder still holds it.
    let err = StateLock::acquire(&path, "plan", Duration::ZERO).unwrap_err();
    assert!(matches!(err, LockError::Held { .. }));
    drop(holder);
}

/// Env var that turns [`lock_holder_child`] into a lock holder for the test below.
const HOLDER_ENV: &str = "GPUPROV_TEST_LOCK_HOLDER_STATE";

/// Helper run as a child process by [`lock_dies_with_a_killed_holder`]: takes the lock,
/// creates the ready file, and sleeps until killed. Without the env var it does nothing.
fn ready_path(state_path: &Path) -> PathBuf {
    state_path.with_extension("child-ready")
}

#[test]
fn lock_holder_child() {
    let Some(path) = std::env::var_os(HOLDER_ENV) else {
        return;
    };
    let path = PathBuf::from(path);
    let (_lock, _) = StateLock::acquire(&path, "apply", Duration::ZERO).unwrap();
    // A file, not stdout: libtest may capture the child's output.
    fs::write(ready_path(&path), b"").unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn lock_dies_with_a_killed_holder() {
    use std::process::{Command, Stdio};

    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    /// Kills the child even if an assertion below fails, so it does not linger.
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "state_file::lock_holder_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HOLDER_ENV, &path)
        .stdout(Stdio::null())
        .spawn()
        .map(KillOnDrop)
        .unwrap();
    let child_pid = child.0.id();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !ready_path(&path).exists() {
        if std::time::Instant::now() > deadline || child.0.try_wait().unwrap().is_some() {
            panic!("the child did not take the lock");
        }
        std::thread::sleep(Duration::from_millis(20));
    }

    // Another process holds it: we time out and see its record.
    let err = StateLock::acquire(&path, "plan", Duration::ZERO).unwrap_err();
    let LockError::Held { info, .. } = &err else {
        panic!("expected Held, got {err:?}");
    };
    assert_eq!(info.as_deref().map(|i| i.pid), Some(child_pid));

    // kill -9: the OS lock goes with the process, its record stays and is reported stale.
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let (lock, stale) = StateLock::acquire(&path, "apply", Duration::from_secs(5)).unwrap();
    let stale = stale.expect("stale record of the killed holder");
    assert_eq!(stale.pid, child_pid);
    assert_eq!(stale.operation, "apply");
    assert_ne!(stale.id, lock.info().id);
}

/// Regression (newcomer report): a hand-edited lineage became a directory name.
#[test]
fn a_lineage_that_is_not_a_uuid_is_refused_and_the_file_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpuprov.state.json");
    for lineage in ["../../../tmp/evil", "not-a-uuid", ""] {
        let text = format!("{{\"version\": 1, \"serial\": 3, \"lineage\": {lineage:?}, \"gpuprov_version\": \"0.1.0\"}}\n");
        std::fs::write(&path, &text).unwrap();
        let err = gpuprov::state::StateStore::open(&path).unwrap_err();
        assert!(
            matches!(err, gpuprov::state::StateError::InvalidLineage { .. }),
            "{lineage}: {err:?}"
        );
        assert!(err.to_string().contains("invalid lineage"), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    }
}
