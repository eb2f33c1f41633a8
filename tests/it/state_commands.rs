//! `state pull`, `state push`, `state migrate` and the backend flags through the real
//! binary, on local states (the remote backends are exercised in `backends.rs` and
//! `backends_docker.rs`): Terraform's push rules, refusals that name what is wrong, and
//! nothing written when refused.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use gpuprov::state::StateStore;

fn gpuprov(dir: &Path, args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuprov"))
        .current_dir(dir)
        .env("GPUPROV_HOME", dir.join("home"))
        .env("NO_COLOR", "1")
        .env_remove("GPUPROV_BACKEND_CONFIG")
        .env_remove("GPUPROV_STATE")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    eprintln!(
        "$ gpuprov {} -> {:?}\n{}{}",
        args.join(" "),
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A project dir with the Docker example config and a saved state of `saves` serials.
fn project(saves: u32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/docker.toml"),
        dir.path().join("gpuprov.toml"),
    )
    .unwrap();
    let (mut store, mut state) = StateStore::open(dir.path().join("gpuprov.state.json")).unwrap();
    for _ in 0..saves {
        store.save(&mut state).unwrap();
    }
    dir
}

#[test]
fn pull_prints_the_stored_bytes_and_says_when_there_are_none() {
    let dir = project(2);
    let out = gpuprov(dir.path(), &["state", "pull"]);
    assert!(out.status.success());
    assert_eq!(
        out.stdout,
        std::fs::read(dir.path().join("gpuprov.state.json")).unwrap()
    );
    let empty = tempfile::tempdir().unwrap();
    let out = gpuprov(empty.path(), &["state", "pull"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("no state is stored"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn push_follows_terraforms_rules_unless_forced() {
    let dir = project(3);
    let state_path = dir.path().join("gpuprov.state.json");
    let stored = std::fs::read(&state_path).unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&stored).unwrap();

    // An older serial of the same lineage.
    v["serial"] = 2.into();
    std::fs::write(
        dir.path().join("old.json"),
        serde_json::to_vec_pretty(&v).unwrap(),
    )
    .unwrap();
    let out = gpuprov(dir.path(), &["state", "push", "old.json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("older than the stored state's 3"),
        "{}",
        stderr(&out)
    );

    // The same serial, other content.
    v["serial"] = 3.into();
    v["note"] = "edited".into();
    std::fs::write(
        dir.path().join("same.json"),
        serde_json::to_vec_pretty(&v).unwrap(),
    )
    .unwrap();
    let out = gpuprov(dir.path(), &["state", "push", "same.json"]);
    assert!(
        stderr(&out).contains("different content"),
        "{}",
        stderr(&out)
    );

    // Another lineage.
    v["serial"] = 9.into();
    v["lineage"] = uuid::Uuid::new_v4().to_string().into();
    std::fs::write(
        dir.path().join("other.json"),
        serde_json::to_vec_pretty(&v).unwrap(),
    )
    .unwrap();
    let out = gpuprov(dir.path(), &["state", "push", "other.json"]);
    assert!(stderr(&out).contains("lineage"), "{}", stderr(&out));
    assert_eq!(
        std::fs::read(&state_path).unwrap(),
        stored,
        "nothing was written"
    );

    // Not a state at all: refused before the lock, naming the file.
    std::fs::write(dir.path().join("junk.json"), b"{\"version\": 1,").unwrap();
    let out = gpuprov(dir.path(), &["state", "push", "junk.json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("junk.json"), "{}", stderr(&out));
    assert_eq!(
        std::fs::read(&state_path).unwrap(),
        stored,
        "nothing was written"
    );

    // A newer serial of the same lineage is accepted as is; --force takes the others.
    let mut newer: serde_json::Value = serde_json::from_slice(&stored).unwrap();
    newer["serial"] = 7.into();
    let newer_bytes = serde_json::to_vec_pretty(&newer).unwrap();
    std::fs::write(dir.path().join("newer.json"), &newer_bytes).unwrap();
    assert!(gpuprov(dir.path(), &["state", "push", "newer.json"])
        .status
        .success());
    assert_eq!(
        std::fs::read(&state_path).unwrap(),
        newer_bytes,
        "pushed byte for byte"
    );
    assert_eq!(
        std::fs::read(dir.path().join("gpuprov.state.json.backup")).unwrap(),
        stored,
        "the replaced state is the backup"
    );
    let forced = gpuprov(dir.path(), &["state", "push", "--force", "other.json"]);
    assert!(forced.status.success());
    assert!(
        stderr(&forced).contains("pushing anyway"),
        "{}",
        stderr(&forced)
    );
}

#[test]
fn migrate_copies_verifies_and_leaves_the_source() {
    let dir = project(2);
    let source = std::fs::read(dir.path().join("gpuprov.state.json")).unwrap();
    let out = gpuprov(dir.path(), &["state", "migrate"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("needs --from or --to"),
        "{}",
        stderr(&out)
    );

    let out = gpuprov(
        dir.path(),
        &["state", "migrate", "--to", "type=local,path=copy.json"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("verified"));
    assert_eq!(std::fs::read(dir.path().join("copy.json")).unwrap(), source);
    assert_eq!(
        std::fs::read(dir.path().join("gpuprov.state.json")).unwrap(),
        source
    );

    // A destination holding another state is refused unless forced.
    let other = project(5);
    std::fs::copy(
        other.path().join("gpuprov.state.json"),
        dir.path().join("taken.json"),
    )
    .unwrap();
    let out = gpuprov(
        dir.path(),
        &["state", "migrate", "--to", "type=local,path=taken.json"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("another state"), "{}", stderr(&out));

    let same = gpuprov(
        dir.path(),
        &[
            "state",
            "migrate",
            "--from",
            "type=local",
            "--to",
            "type=local",
        ],
    );
    assert!(
        stderr(&same).contains("the same state"),
        "{}",
        stderr(&same)
    );
}

#[test]
fn backend_flags_and_tables_are_checked_naming_the_key() {
    let dir = project(1);
    let out = gpuprov(
        dir.path(),
        &["--backend-config", "bukket=x", "state", "list"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("bukket"), "{}", stderr(&out));

    let out = gpuprov(
        dir.path(),
        &["--backend-config", "type=s3", "state", "list"],
    );
    assert!(stderr(&out).contains("needs `bucket`"), "{}", stderr(&out));

    let out = gpuprov(
        dir.path(),
        &[
            "--state",
            "x.json",
            "--backend-config",
            "type=s3,bucket=b",
            "state",
            "list",
        ],
    );
    assert!(
        stderr(&out).contains("--state names a local state file"),
        "{}",
        stderr(&out)
    );

    let out = Command::new(env!("CARGO_BIN_EXE_gpuprov"))
        .current_dir(dir.path())
        .env("GPUPROV_HOME", dir.path().join("home"))
        .env_remove("GPUPROV_PG_CONN_STR")
        .env_remove("PG_CONN_STR")
        .env("GPUPROV_BACKEND_CONFIG", "type=postgres")
        .args(["state", "list"])
        .output()
        .unwrap();
    assert!(
        stderr(&out).contains("GPUPROV_PG_CONN_STR"),
        "{}",
        stderr(&out)
    );

    let mut config = std::fs::read_to_string(dir.path().join("gpuprov.toml")).unwrap();
    config.push_str(
        "\n[backend]\ntype = \"s3\"\nbucket = \"b\"\nconn_str = \"postgres://u:pw@h/db\"\n",
    );
    std::fs::write(dir.path().join("gpuprov.toml"), config).unwrap();
    let out = gpuprov(dir.path(), &["state", "list"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("conn_str"), "{}", stderr(&out));
}

/// `GPUPROV_BACKEND_CONFIG` and `--backend-config` merge (the flag last); another `type`
/// starts from scratch; `key` is required on S3 and `name` on PostgreSQL.
#[test]
fn backend_overrides_merge_env_then_flags() {
    let dir = project(1);
    let run = |env: &str, args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_gpuprov"))
            .current_dir(dir.path())
            .env("GPUPROV_HOME", dir.path().join("home"))
            .env("NO_COLOR", "1")
            .env("GPUPROV_BACKEND_CONFIG", env)
            .env("AWS_ACCESS_KEY_ID", "AKIATEST")
            .env("AWS_SECRET_ACCESS_KEY", "not-a-real-secret")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // Nothing listens on port 1: the error names the state the command used.
    let env =
        "type=s3,bucket=team,key=from-env.json,endpoint=http://127.0.0.1:1,force_path_style=true";
    let err = run(
        env,
        &["--backend-config", "key=from-flag.json", "state", "pull"],
    );
    assert!(err.contains("s3://team/from-flag.json"), "{err}");
    let err = run(env, &["state", "pull"]);
    assert!(err.contains("s3://team/from-env.json"), "{err}");
    // Back to the local file from an s3 environment: the s3 keys do not carry over.
    let err = run(env, &["--backend-config", "type=local", "state", "list"]);
    assert!(!err.contains("does not apply"), "{err}");
    let err = run("type=s3,bucket=team", &["state", "list"]);
    assert!(err.contains("needs `key`"), "{err}");
    let err = run("", &["--backend-config", "bucket=team", "state", "list"]);
    assert!(err.contains("type = \"s3\""), "{err}");
}
