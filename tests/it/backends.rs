//! The state backends against real stores on loopback (issue 14): moto's S3 and a
//! throwaway PostgreSQL cluster, nothing mocked at the backend boundary. The same
//! scenarios run on every backend (local, s3, postgres): save and read back, lock
//! exclusivity with holder info, a stale lock cleared by `force-unlock ID`, fencing of a
//! writer whose lock was broken, a crashed run's journal replayed by another process's
//! backend, and no secret in anything stored. S3 also refuses a store that ignores
//! conditional writes (a proxy strips the conditions).

use std::sync::Arc;
use std::time::Duration;

use gpuprov::state::lock::{LockError, StateLock};
use gpuprov::state::{Backend, StateError, StateStore};

use crate::state_journal::transition;
use crate::support::stores::{PgStore, S3Store, Store};

fn open(b: &Arc<dyn Backend>) -> (StateStore, gpuprov::state::StateFile) {
    StateStore::open_in(b.clone()).unwrap()
}

/// Save, read back through a second backend instance (another process's view), and the
/// backup of the first read.
fn saves_and_reads_back(a: Arc<dyn Backend>, b: Arc<dyn Backend>) {
    let (_l, _) = StateLock::acquire_on(&*a, "apply", Duration::ZERO).unwrap();
    let (mut store, mut state) = open(&a);
    assert!(
        store.original_bytes().is_none(),
        "a new store holds no state"
    );
    store.save(&mut state).unwrap();
    store.save(&mut state).unwrap();
    let (mut other, mut seen) = open(&b);
    assert_eq!(seen.lineage, state.lineage);
    assert_eq!(seen.serial, 2);
    assert!(other.original_bytes().is_some());
    // The next run's first save keeps the state it read as the backup.
    other.save(&mut seen).unwrap();
    assert_eq!(open(&a).1.serial, 3);
}

/// One holder at a time; the refused one is told who holds it; release lets it in.
fn lock_is_exclusive_and_names_its_holder(a: Arc<dyn Backend>, b: Arc<dyn Backend>) {
    let (held, stale) = StateLock::acquire_on(&*a, "apply", Duration::ZERO).unwrap();
    assert!(stale.is_none());
    let err = StateLock::acquire_on(&*b, "destroy", Duration::from_millis(1200)).unwrap_err();
    let LockError::Held { info, waited, .. } = &err else {
        panic!("expected Held, got {err:?}");
    };
    assert!(*waited >= Duration::from_millis(1200));
    let info = info.as_deref().expect("the holder's info");
    assert_eq!(info.id, held.info().id);
    assert_eq!(info.operation, "apply");
    assert_eq!(info.pid, std::process::id());
    let text = format!("{:?}", miette::Report::new(err));
    assert!(text.contains(&held.info().id), "{text}");
    assert!(text.contains("force-unlock"), "{text}");
    held.release().unwrap();
    let (again, _) = StateLock::acquire_on(&*b, "destroy", Duration::ZERO).unwrap();
    again.release().unwrap();
}

/// A run killed mid-apply leaves its journal; another machine's backend replays it, and
/// its next writer folds it (nothing lost, nothing applied twice).
async fn a_crashed_runs_journal_is_replayed_elsewhere(a: Arc<dyn Backend>, b: Arc<dyn Backend>) {
    {
        let (_l, _) = StateLock::acquire_on(&*a, "apply", Duration::ZERO).unwrap();
        let (mut store, mut state) = open(&a);
        store.save(&mut state).unwrap();
        let writer = store.begin_journal(&mut state).unwrap();
        for label in ["planning", "creating"] {
            writer.append(&transition("vm.a", label)).await.unwrap();
        }
        writer.append(&transition("vm.b", "booting")).await.unwrap();
        // Killed here: neither fold nor journal removal (the lock is released by drop,
        // as a force-unlock would after a kill).
        std::mem::forget(writer);
    }
    let (mut store, mut state) = open(&b);
    assert!(store.replayed_journal(), "the journal was replayed");
    assert_eq!(state.resources["vm.a"].machine.label, "creating");
    assert_eq!(state.resources["vm.b"].machine.label, "booting");
    assert_eq!(state.resources["vm.a"].events.len(), 2, "applied once each");
    let (_l, _) = StateLock::acquire_on(&*b, "apply", Duration::ZERO).unwrap();
    let writer = store.begin_journal(&mut state).unwrap();
    let ready = transition("vm.a", "ready");
    writer.append(&ready).await.unwrap();
    ready.apply(&mut state);
    store.save(&mut state).unwrap();
    writer.remove().unwrap();
    let (fresh, seen) = open(&a);
    assert!(
        !fresh.replayed_journal(),
        "the journal was folded and removed"
    );
    assert_eq!(seen.resources["vm.a"].machine.label, "ready");
    assert_eq!(seen.resources["vm.a"].events.len(), 3);
}

fn secrets_stored_nowhere(store: &dyn Store) {
    let dump = store.dump();
    assert!(dump.contains("lineage"), "the dump holds the state: {dump}");
    for s in store.secrets() {
        assert!(!dump.contains(&s), "a secret is stored: {dump}");
    }
}

// ---------------------------------------------------------------------------------------
// local

fn local_pair() -> (tempfile::TempDir, Arc<dyn Backend>, Arc<dyn Backend>) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("gpuprov.state.json");
    let a: Arc<dyn Backend> = Arc::new(gpuprov::state::backend::local::LocalBackend::new(&p));
    let b: Arc<dyn Backend> = Arc::new(gpuprov::state::backend::local::LocalBackend::new(&p));
    (dir, a, b)
}

#[test]
fn local_saves_and_reads_back() {
    let (_d, a, b) = local_pair();
    saves_and_reads_back(a, b);
}

#[test]
fn local_lock_is_exclusive_and_names_its_holder() {
    let (_d, a, b) = local_pair();
    lock_is_exclusive_and_names_its_holder(a, b);
}

#[tokio::test]
async fn local_replays_a_crashed_runs_journal() {
    let (_d, a, b) = local_pair();
    a_crashed_runs_journal_is_replayed_elsewhere(a, b).await;
}

// ---------------------------------------------------------------------------------------
// s3

#[test]
fn s3_saves_and_reads_back() {
    let s = S3Store::start();
    saves_and_reads_back(s.open(), s.open());
    let keys = s.keys();
    assert!(
        keys.contains(&"team/gpuprov.state.json".to_string()),
        "{keys:?}"
    );
    assert!(
        keys.contains(&"team/gpuprov.state.json.backup".to_string()),
        "{keys:?}"
    );
    assert!(
        !keys.iter().any(|k| k.contains("conditional-write-check")),
        "the self-test cleans up: {keys:?}"
    );
    secrets_stored_nowhere(&s);
}

#[test]
fn s3_lock_is_exclusive_and_names_its_holder() {
    let s = S3Store::start();
    lock_is_exclusive_and_names_its_holder(s.open(), s.open());
    assert!(s.get("team/gpuprov.state.json.lock").is_none(), "released");
}

#[tokio::test]
async fn s3_replays_a_crashed_runs_journal() {
    let s = S3Store::start();
    a_crashed_runs_journal_is_replayed_elsewhere(s.open(), s.open()).await;
    assert!(
        !s.keys().iter().any(|k| k.contains(".journal/")),
        "no journal object is left: {:?}",
        s.keys()
    );
    secrets_stored_nowhere(&s);
}

/// A killed holder's S3 lock stays (S3 cannot know it died): it is reported with the
/// holder's info until `force-unlock ID`, which checks the id.
#[test]
fn s3_stale_lock_is_reported_and_cleared_by_force_unlock() {
    let s = S3Store::start();
    let (a, b) = (s.open(), s.open());
    let (dead, _) = StateLock::acquire_on(&*a, "apply", Duration::ZERO).unwrap();
    let id = dead.info().id.clone();
    std::mem::forget(dead);
    let err = StateLock::acquire_on(&*b, "apply", Duration::ZERO).unwrap_err();
    assert!(
        matches!(&err, LockError::Held { info: Some(i), .. } if i.id == id),
        "{err:?}"
    );
    let lock_text = String::from_utf8(s.get("team/gpuprov.state.json.lock").unwrap()).unwrap();
    assert!(
        lock_text.contains("\"operation\": \"apply\""),
        "{lock_text}"
    );
    assert!(
        matches!(
            b.force_unlock("not-the-id"),
            Err(LockError::IdMismatch { .. })
        ),
        "a wrong id clears nothing"
    );
    let cleared = b.force_unlock(&id).unwrap();
    assert_eq!(cleared.cleared.id, id);
    let (l, stale) = StateLock::acquire_on(&*b, "apply", Duration::ZERO).unwrap();
    assert!(stale.is_none());
    l.release().unwrap();
    assert!(matches!(
        b.force_unlock(&id),
        Err(LockError::NotLocked { .. })
    ));
}

/// The fencing test: A's lock is broken (force-unlock) while A runs; B takes the lock,
/// replays and folds A's journal, and saves. A's next journal write is refused (it stops
/// instead of journalling into B's state), its save is refused, its release leaves B's
/// lock, and batches a dead run left without their header never block a reader.
#[tokio::test]
async fn s3_a_writer_whose_lock_was_broken_cannot_overwrite_the_state() {
    let s = S3Store::start();
    let (a, b) = (s.open(), s.open());
    {
        let (_l, _) = StateLock::acquire_on(&*a, "apply", Duration::ZERO).unwrap();
        let (mut st, mut state) = open(&a);
        st.save(&mut state).unwrap();
    }
    let (a_lock, _) = StateLock::acquire_on(&*a, "apply", Duration::ZERO).unwrap();
    let (mut a_store, mut a_state) = open(&a);
    let a_journal = a_store.begin_journal(&mut a_state).unwrap();
    a_journal
        .append(&transition("vm.a", "creating"))
        .await
        .unwrap();

    b.force_unlock(&a_lock.info().id).unwrap();
    let (_b_lock, _) = StateLock::acquire_on(&*b, "apply", Duration::ZERO).unwrap();
    let (mut b_store, mut b_state) = open(&b);
    assert!(b_store.replayed_journal(), "B resumes what A journalled");
    assert_eq!(b_state.resources["vm.a"].machine.label, "creating");
    let b_journal = b_store.begin_journal(&mut b_state).unwrap();

    let fenced = a_journal.append(&transition("vm.a", "booting")).await;
    let err = fenced.expect_err("A's journal is fenced off once its lock is gone");
    let text = format!("{:?}", miette::Report::new(err));
    assert!(text.contains("was broken"), "{text}");
    b_journal
        .append(&transition("vm.a", "booting"))
        .await
        .unwrap();
    transition("vm.a", "booting").apply(&mut b_state);
    b_store.save(&mut b_state).unwrap();
    b_journal.remove().unwrap();
    let err = a_store.save(&mut a_state).unwrap_err();
    assert!(matches!(err, StateError::Conflict { .. }), "{err:?}");
    let (_, seen) = open(&b);
    assert_eq!(seen.serial, b_state.serial, "B's state stands");
    a_lock.release().unwrap();
    assert!(
        s.get("team/gpuprov.state.json.lock").is_some(),
        "B's lock is still there"
    );

    // Batches of a discarded run (no header object) are ignored, not "corrupt".
    s.put(
        "team/gpuprov.state.json.journal/0000000000001-deadbeef/0000000017",
        br#"{"op":"remove","key":"vm.a"}
"#,
    );
    let (fresh, state) = open(&a);
    assert!(!fresh.replayed_journal());
    assert!(
        state.resources.contains_key("vm.a"),
        "the stray batch was not applied"
    );
}

/// A store that accepts `If-None-Match` / `If-Match` and ignores them is refused before
/// anything is written (the proxy strips the condition headers, as such stores behave).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_a_store_that_ignores_conditional_writes_is_refused() {
    let mut s = S3Store::start();
    let proxy = strip_conditions_proxy(s.moto.port).await;
    s.endpoint = Some(format!("http://127.0.0.1:{proxy}"));
    let b = s.open();
    let err = tokio::task::spawn_blocking(move || {
        StateLock::acquire_on(&*b, "apply", Duration::ZERO).map(|_| ())
    })
    .await
    .unwrap()
    .unwrap_err();
    let text = format!("{:?}", miette::Report::new(err));
    assert!(
        text.contains("does not enforce conditional writes"),
        "{text}"
    );
    assert!(
        s.get("team/gpuprov.state.json.lock").is_none(),
        "no lock was written"
    );
    // Straight to moto, the same store is accepted.
    s.endpoint = None;
    let ok = s.open();
    let (l, _) = tokio::task::spawn_blocking(move || {
        StateLock::acquire_on(&*ok, "apply", Duration::ZERO).map(|(l, s)| (l.info().id.clone(), s))
    })
    .await
    .unwrap()
    .unwrap();
    assert!(!l.is_empty());
}

/// An HTTP proxy to 127.0.0.1:`upstream` that drops `If-None-Match` and `If-Match` from
/// every request (one request per connection).
async fn strip_conditions_proxy(upstream: u16) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                let head_end = loop {
                    let n = client.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
                let mut body = buf[head_end..].to_vec();
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                while body.len() < len {
                    let n = client.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    body.extend_from_slice(&chunk[..n]);
                }
                let kept: Vec<&str> = head
                    .split("\r\n")
                    .filter(|l| {
                        let k = l.split(':').next().unwrap_or("").to_ascii_lowercase();
                        k != "if-none-match" && k != "if-match" && k != "connection"
                    })
                    .filter(|l| !l.is_empty())
                    .collect();
                let new_head = format!("{}\r\nConnection: close\r\n\r\n", kept.join("\r\n"));
                let Ok(mut up) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                else {
                    return;
                };
                let _ = up.write_all(new_head.as_bytes()).await;
                let _ = up.write_all(&body).await;
                let mut answer = Vec::new();
                let _ = up.read_to_end(&mut answer).await;
                let _ = client.write_all(&answer).await;
                let _ = client.shutdown().await;
            });
        }
    });
    port
}

// ---------------------------------------------------------------------------------------
// postgres

#[test]
fn postgres_saves_and_reads_back() {
    let s = PgStore::start();
    saves_and_reads_back(s.open(), s.open());
    let rows = s.psql(&format!("SELECT name, serial FROM {}.states", s.schema));
    assert_eq!(rows.trim(), "team|3");
    secrets_stored_nowhere(&s);
}

#[test]
fn postgres_lock_is_exclusive_and_names_its_holder() {
    let s = PgStore::start();
    lock_is_exclusive_and_names_its_holder(s.open(), s.open());
}

#[tokio::test]
async fn postgres_replays_a_crashed_runs_journal() {
    let s = PgStore::start();
    a_crashed_runs_journal_is_replayed_elsewhere(s.open(), s.open()).await;
    let left = s.psql(&format!("SELECT count(*) FROM {}.journal", s.schema));
    assert_eq!(left.trim(), "0", "the folded journal's rows are deleted");
    secrets_stored_nowhere(&s);
}

/// The PostgreSQL lock dies with its holder's session: a killed holder's record is
/// reported as stale and taken over; a live holder cannot be force-unlocked; a leftover
/// record is cleared by `force-unlock ID`.
#[test]
fn postgres_lock_dies_with_its_session_and_force_unlock_checks_the_holder() {
    let s = PgStore::start();
    let a = s.open();
    let b = s.open();
    let (held, _) = StateLock::acquire_on(&*a, "apply", Duration::ZERO).unwrap();
    let id = held.info().id.clone();
    std::mem::forget(held);
    assert!(
        matches!(b.force_unlock(&id), Err(LockError::StillHeld { .. })),
        "a live holder is not force-unlocked"
    );
    // The holder's process dies: its sessions close.
    drop(a);
    let pid = s.psql(&format!(
        "SELECT holder_pid FROM {}.locks WHERE name = 'team'",
        s.schema
    ));
    s.psql(&format!("SELECT pg_terminate_backend({})", pid.trim()));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        b.lock_info().unwrap().map(|i| i.id),
        Some(id.clone()),
        "the record stays"
    );
    b.force_unlock(&id).unwrap();
    assert!(b.lock_info().unwrap().is_none());
    // And a killed holder's record is taken over by the next run, reported as stale.
    let c = s.open();
    let (held, _) = StateLock::acquire_on(&*c, "apply", Duration::ZERO).unwrap();
    let id = held.info().id.clone();
    std::mem::forget(held);
    let pid = s.psql(&format!("SELECT holder_pid FROM {}.locks", s.schema));
    s.psql(&format!("SELECT pg_terminate_backend({})", pid.trim()));
    std::thread::sleep(Duration::from_millis(300));
    let (l, stale) = StateLock::acquire_on(&*b, "apply", Duration::from_secs(2)).unwrap();
    assert_eq!(stale.map(|i| i.id), Some(id));
    l.release().unwrap();
}

/// The fencing test: A's session (and so its lock) is lost while A runs; B takes the
/// lock and saves; A can write nothing.
#[test]
fn postgres_a_writer_whose_lock_was_broken_cannot_overwrite_the_state() {
    let s = PgStore::start();
    let (a, b) = (s.open(), s.open());
    {
        let (_l, _) = StateLock::acquire_on(&*a, "apply", Duration::ZERO).unwrap();
        let (mut st, mut state) = open(&a);
        st.save(&mut state).unwrap();
    }
    let (_a_lock, _) = StateLock::acquire_on(&*a, "apply", Duration::ZERO).unwrap();
    let (mut a_store, mut a_state) = open(&a);
    let pid = s.psql(&format!("SELECT holder_pid FROM {}.locks", s.schema));
    s.psql(&format!("SELECT pg_terminate_backend({})", pid.trim()));
    std::thread::sleep(Duration::from_millis(300));
    let (_b_lock, _) = StateLock::acquire_on(&*b, "apply", Duration::from_secs(2)).unwrap();
    let (mut b_store, mut b_state) = open(&b);
    b_store.save(&mut b_state).unwrap();
    let err = a_store.save(&mut a_state).unwrap_err();
    assert!(
        matches!(err, StateError::Conflict { .. }),
        "expected a conflict, got {err:?}"
    );
    let (_, seen) = open(&b);
    assert_eq!(seen.serial, b_state.serial, "B's state stands");
}

/// A missing or wrong connection string is a clear error that never shows the password.
#[test]
fn postgres_connection_errors_name_the_variable_and_hide_the_password() {
    let s = PgStore::start();
    std::env::set_var(
        "GPUPROV_PG_CONN_STR",
        format!(
            "host=127.0.0.1 port={} user=gpuprov password=wrong-{} dbname=postgres sslmode=disable",
            s.port, "pw-hunter2"
        ),
    );
    let err = gpuprov::state::open_backend(
        &s.settings(),
        std::path::Path::new("x"),
        std::path::Path::new("."),
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("password authentication failed"), "{text}");
    let report = format!("{:?}", miette::Report::new(err));
    assert!(
        !text.contains("pw-hunter2") && !report.contains("pw-hunter2"),
        "{report}"
    );
    std::env::remove_var("GPUPROV_PG_CONN_STR");
    std::env::remove_var("PG_CONN_STR");
    let err = gpuprov::state::open_backend(
        &s.settings(),
        std::path::Path::new("x"),
        std::path::Path::new("."),
    )
    .unwrap_err();
    assert!(err.to_string().contains("GPUPROV_PG_CONN_STR"), "{err}");
}
