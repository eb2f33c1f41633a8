//! Team state on the real Docker test cloud through the real binary (issue 14), on each
//! remote backend (moto's S3, a throwaway PostgreSQL): two "runners" (separate
//! checkouts, separate `GPUPROV_HOME`) share one state. Runner A is killed (`kill -9`)
//! while its machine is being created; runner B is refused the lock while A holds it,
//! clears A's stale lock with `force-unlock ID` where the backend keeps it, resumes the
//! apply (exactly one container carries the label), and destroys (none left). Nothing
//! stored and nothing printed holds a credential or the connection password.
//!
//! And a migration round trip local → s3 → postgres → local with the machine up: the
//! state's bytes are equal at every hop and the machine is still reachable by `ssh`.

use std::time::{Duration, Instant};

use crate::crash_docker::{docker_ps, ensure_base_image, kill9, skip, Project};
use crate::support::stores::{backend_config, named, PgStore, S3Store, Store};

/// The `ID:` line of a lock error.
fn lock_id(stderr: &str) -> Option<String> {
    stderr
        .lines()
        .find_map(|l| {
            l.trim_start_matches(|c: char| c == '|' || c == '│' || c.is_whitespace())
                .strip_prefix("ID:")
        })
        .map(|id| id.trim().to_string())
}

/// B uses A's project key, as a CI runner gets it from a secret: the key files are
/// copied, never the state (which holds no key).
fn share_key(a: &Project, b: &Project) {
    let from = a.dir.path().join("home");
    let to = b.dir.path().join("home");
    let out = std::process::Command::new("cp")
        .arg("-a")
        .arg(&from)
        .arg(&to)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

fn two_runners_share_one_state(store: &dyn Store) {
    if skip() {
        return;
    }
    ensure_base_image();
    let a = Project::on(store, "team");
    let b = Project::on(store, "team");
    let mut printed = String::new();

    // A parks right after journalling the create (the container exists or is coming).
    let (holder, seen) = a.park_at(&["apply", "--auto-approve"], "journal.after:launch:booting");
    printed.push_str(&seen);
    let holder_pid = holder.id();

    // B waits --lock-timeout, then is refused, naming A.
    let t = Instant::now();
    let refused = b.run(&["apply", "--auto-approve", "--lock-timeout", "2s"]);
    let err = String::from_utf8_lossy(&refused.stderr).to_string();
    printed.push_str(&err);
    assert!(
        !refused.status.success(),
        "B must not apply while A holds the lock"
    );
    assert!(
        t.elapsed() >= Duration::from_millis(1900),
        "B waited {:?}",
        t.elapsed()
    );
    assert!(err.contains(&format!("PID:       {holder_pid}")), "{err}");
    assert!(err.contains("Operation: apply"), "{err}");

    kill9(holder);
    let lineage = a.lineage().expect("A's journal names the lineage");
    assert!(
        docker_ps(&lineage).len() <= 1,
        "no duplicate after the kill"
    );

    share_key(&a, &b);
    // Whether the lock outlived A depends on the store; B either takes it over (its
    // stale record reported) or is told the holder and clears it by ID.
    let first = b.run(&["apply", "--auto-approve", "--lock-timeout", "1s"]);
    let first_err = String::from_utf8_lossy(&first.stderr).to_string();
    printed.push_str(&first_err);
    if !first.status.success() {
        let id = lock_id(&first_err).unwrap_or_else(|| panic!("no lock ID in: {first_err}"));
        let unlocked = b.run(&["force-unlock", &id]);
        printed.push_str(&String::from_utf8_lossy(&unlocked.stderr));
        assert!(unlocked.status.success(), "force-unlock {id}");
        let resumed = b.run(&["apply", "--auto-approve"]);
        printed.push_str(&String::from_utf8_lossy(&resumed.stderr));
        assert!(resumed.status.success(), "B's apply resumes A's");
    } else {
        assert!(
            first_err.contains("was not released"),
            "stale lock reported: {first_err}"
        );
    }
    assert_eq!(
        docker_ps(&lineage).len(),
        1,
        "exactly one container after B's apply"
    );
    let ssh = b.run(&["ssh", "dev", "--", "true"]);
    assert!(ssh.status.success(), "B can ssh to the machine");

    let destroyed = b.run(&["destroy", "--auto-approve"]);
    printed.push_str(&String::from_utf8_lossy(&destroyed.stderr));
    printed.push_str(&String::from_utf8_lossy(&destroyed.stdout));
    assert!(destroyed.status.success());
    assert!(
        docker_ps(&lineage).is_empty(),
        "B's destroy leaves no container"
    );

    let stored = store.dump();
    let hits = store
        .secrets()
        .iter()
        .map(|s| printed.matches(s.as_str()).count() + stored.matches(s.as_str()).count())
        .sum::<usize>()
        + stored.matches("PRIVATE KEY").count();
    let kind = store.settings().kind.as_str();
    crate::support::figures::write(
        &format!("secrets_backend_{kind}"),
        &serde_json::json!({
            "searched": [
                format!("every {kind} object or row (state, backup, journal, lock info)"),
                "all command output of both runners".to_string(),
            ],
            "sentinel_hits": hits,
        }),
    );
    assert_eq!(
        hits, 0,
        "a credential, password or private key was stored or printed"
    );
}

#[test]
fn docker_two_runners_share_one_state_on_s3() {
    let store = S3Store::start();
    two_runners_share_one_state(&store);
}

#[test]
fn docker_two_runners_share_one_state_on_postgres() {
    let store = PgStore::start();
    two_runners_share_one_state(&store);
}

#[test]
fn docker_migration_local_s3_postgres_local_keeps_the_bytes_and_the_machine() {
    if skip() {
        return;
    }
    ensure_base_image();
    let s3 = S3Store::start();
    let pg = PgStore::start();
    let mut p = Project::new();
    p.env.extend(s3.env());
    p.env.extend(pg.env());
    let up = p.run(&["apply", "--auto-approve"]);
    assert!(up.status.success());
    let original = std::fs::read(p.state_path()).unwrap();
    let lineage = p.lineage().unwrap();

    let s3_pairs = backend_config(&named(s3.settings(), "migrated"));
    let pg_pairs = backend_config(&named(pg.settings(), "migrated"));
    let back = p.dir.path().join("back.state.json");
    let back_pairs = format!("type=local,path={}", back.display());
    let mut printed = String::new();
    for (from, to) in [
        ("type=local", s3_pairs.as_str()),
        (s3_pairs.as_str(), pg_pairs.as_str()),
        (pg_pairs.as_str(), back_pairs.as_str()),
    ] {
        let out = p.run(&["state", "migrate", "--from", from, "--to", to]);
        printed.push_str(&String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "migrate {from} -> {to}");
    }
    assert!(printed.contains("verified"), "{printed}");
    assert_eq!(
        s3.get("migrated/gpuprov.state.json").as_deref(),
        Some(original.as_slice()),
        "S3 holds the bytes"
    );
    let pg_body = pg.psql(&format!(
        "SELECT encode(body, 'hex') FROM {}.states WHERE name = 'migrated'",
        pg.schema
    ));
    assert_eq!(pg_body.trim(), hex(&original), "PostgreSQL holds the bytes");
    assert_eq!(
        std::fs::read(&back).unwrap(),
        original,
        "back home, byte for byte"
    );
    assert_eq!(
        std::fs::read(p.state_path()).unwrap(),
        original,
        "every source is left untouched"
    );

    // The machine is reachable through each copy of the state.
    for pairs in [s3_pairs.as_str(), pg_pairs.as_str(), back_pairs.as_str()] {
        let ssh = p.run(&["--backend-config", pairs, "ssh", "dev", "--", "true"]);
        assert!(ssh.status.success(), "ssh through {pairs}");
    }
    // A second migration to a destination already holding the state is a no-op.
    let again = p.run(&[
        "state",
        "migrate",
        "--from",
        "type=local",
        "--to",
        &s3_pairs,
    ]);
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("nothing to do"));

    assert!(p.run(&["destroy", "--auto-approve"]).status.success());
    assert!(docker_ps(&lineage).is_empty());
    for s in s3.secrets().into_iter().chain(pg.secrets()) {
        assert!(!printed.contains(&s), "a secret was printed");
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
