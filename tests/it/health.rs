//! `gpuprov health [NAME]`: golden output where no cloud is asked (an empty state, an
//! unknown name, a machine that is not up, `--help`), and one run against the real
//! Docker test cloud: healthy, a changed host key, a stopped container.

use std::path::PathBuf;

use assert_cmd::Command;
use gpuprov::state::{MachineRecord, ResourceRecord, StateStore};
use gpuprov::vm::LaunchState;

use crate::docker_e2e::{containers, ensure_base_image, leftovers, skip};

const DOCKER_TOML: &str = "[defaults]\nclouds = [\"docker\"]\n\n[vm.dev]\nregions = [\"local\"]\n";

struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    fn new() -> Project {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("gpuprov.toml"), DOCKER_TOML).unwrap();
        Project { dir }
    }
    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }
    fn run(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::cargo_bin("gpuprov")
            .unwrap()
            .current_dir(self.dir.path())
            .env("GPUPROV_HOME", self.path("home"))
            .env("NO_COLOR", "1")
            .env_remove("GPUPROV_CONFIG")
            .env_remove("GPUPROV_STATE")
            .env_remove("GPUPROV_SSH_KEY_FILE")
            .env_remove("GPUPROV_SSH_PRIVATE_KEY")
            .args(args)
            .output()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (
            out.status.code().unwrap_or(-1),
            text(&out.stdout),
            text(&out.stderr),
        )
    }
    /// Snapshots a run's exit code, stdout and stderr, the temp dir as `[TMP]`.
    fn snap(&self, name: &str, (code, out, err): (i32, String, String)) {
        let mut s = insta::Settings::clone_current();
        s.add_filter(
            &regex_escape(&self.dir.path().display().to_string()),
            "[TMP]",
        );
        s.bind(|| {
            insta::assert_snapshot!(
                name,
                format!("exit: {code}\n--- stdout\n{out}--- stderr\n{err}")
            )
        });
    }
    /// Writes a state with one launch record `vm.NAME` in `state`, labelled `label`.
    fn with_record(&self, name: &str, state: &LaunchState, label: &str) {
        let (mut store, mut file) = StateStore::open(self.path("gpuprov.state.json")).unwrap();
        file.lineage = "00000000-0000-4000-8000-000000000000".into();
        let rec = ResourceRecord::new(MachineRecord {
            kind: "launch".into(),
            state: gpuprov::state::JsonText::encode(&state).unwrap(),
            label: label.into(),
            updated_at: chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
                .unwrap()
                .into(),
        });
        file.resources.insert(format!("vm.{name}"), rec);
        store.save(&mut file).unwrap();
    }
}

/// `s` with the regex metacharacters escaped (a literal path as an insta filter).
fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn assert_valid(v: &serde_json::Value) {
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/schemas/gpuprov-health.schema.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator.iter_errors(v).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:?}\n{v:#}");
}

#[test]
fn health_of_an_empty_state_is_healthy() {
    let p = Project::new();
    p.snap("empty", p.run(&["health"]));
    let (code, out, err) = p.run(&["health", "-json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_valid(&v);
    assert_eq!(v["healthy"], true);
    assert_eq!(v["machines"], serde_json::json!([]));
}

#[test]
fn health_of_an_unknown_name_lists_the_known_ones() {
    let p = Project::new();
    p.snap("unknown_name_empty_state", p.run(&["health", "nope"]));
    let aborted = LaunchState::Aborted {
        reason: "cancelled by Ctrl-C".into(),
        owned: None,
    };
    p.with_record("dev", &aborted, "aborted: cancelled by Ctrl-C");
    p.with_record("db", &aborted, "aborted: cancelled by Ctrl-C");
    p.snap("unknown_name", p.run(&["health", "nope"]));
}

#[test]
fn health_fails_a_machine_that_is_not_up_with_its_recorded_state() {
    let p = Project::new();
    let aborted = LaunchState::Aborted {
        reason: "cancelled by Ctrl-C".into(),
        owned: None,
    };
    p.with_record("dev", &aborted, "aborted: cancelled by Ctrl-C");
    p.snap("not_up", p.run(&["health"]));
    let (code, out, _) = p.run(&["health", "dev", "-json"]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_valid(&v);
    assert_eq!(v["healthy"], false);
    let m = &v["machines"][0];
    assert_eq!(m["status"], "fail");
    assert_eq!(m["cloud"]["status"], "fail");
    assert!(
        m["cloud"]["detail"].as_str().unwrap().contains("aborted"),
        "{m}"
    );
    assert_eq!(m["ssh"]["status"], "skipped");
}

#[test]
fn health_of_an_unreadable_state_exits_1_with_the_diagnostic() {
    let p = Project::new();
    std::fs::write(p.path("gpuprov.state.json"), "{\"version\": 4, \"serial\"").unwrap();
    let (code, out, err) = p.run(&["health", "-json"]);
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty(), "no verdict without a state: {out}");
    p.snap("unreadable_state", (code, out, err));
}

#[test]
fn health_help_names_the_checks_and_exit_codes() {
    let p = Project::new();
    let (code, out, err) = p.run(&["health", "--help"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("warnings allowed"), "{out}");
    p.snap("help", (code, out, err));
}

/// One machine on the Docker test cloud: healthy (Kubernetes skipped: Docker cannot host
/// k3s), then a host key changed in the state (the SSH check fails saying so, the cloud
/// check stays ok), then the container stopped behind gpuprov's back (exit 1: not
/// running). Destroyed at the end; nothing is left.
#[tokio::test(flavor = "multi_thread")]
async fn health_on_docker_ok_then_changed_host_key_then_stopped() {
    if skip() {
        return;
    }
    ensure_base_image();
    let p = crate::docker_e2e::Project::new();
    let out = p.run(&["apply", "--auto-approve"]);
    assert!(out.status.success(), "apply failed");
    let lineage = p.lineage();
    let ids = containers(&lineage).await;
    assert_eq!(ids.len(), 1);

    // 1. Healthy: exit 0, cloud and ssh ok, kubernetes skipped with the reason.
    let out = p.run(&["health", "-json"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_valid(&v);
    let m = &v["machines"][0];
    assert_eq!(
        (&m["status"], &m["cloud"]["status"], &m["ssh"]["status"]),
        (&"ok".into(), &"ok".into(), &"ok".into()),
        "{m:#}"
    );
    assert_eq!(m["kubernetes"]["status"], "skipped");
    assert!(
        m["kubernetes"]["detail"]
            .as_str()
            .unwrap()
            .contains("docker cannot host k3s"),
        "{m:#}"
    );
    assert_eq!(m["instance_id"], ids[0].as_str());
    let out = p.run(&["health", "dev"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("1 machine checked: 1 healthy"), "{text}");

    // 2. A host key changed in the state: the server's key no longer matches the pin.
    let original = std::fs::read_to_string(p.state_path()).unwrap();
    let mut state: serde_json::Value = serde_json::from_str(&original).unwrap();
    let pin = &mut state["resources"]["vm.dev"]["machine"]["state"]["vm"]["host_key"];
    assert_eq!(pin["algorithm"], "ssh-ed25519", "{pin}");
    // Another ed25519 key: the blob of a key of 32 bytes 0x01.
    let mut blob = Vec::new();
    for part in [&b"ssh-ed25519"[..], &[1u8; 32][..]] {
        blob.extend_from_slice(&(part.len() as u32).to_be_bytes());
        blob.extend_from_slice(part);
    }
    use base64::Engine as _;
    pin["key_base64"] = base64::engine::general_purpose::STANDARD
        .encode(&blob)
        .into();
    pin["fingerprint"] = "SHA256:not-the-servers-key".into();
    std::fs::write(
        p.state_path(),
        serde_json::to_string_pretty(&state).unwrap(),
    )
    .unwrap();
    let out = p.run(&["health", "-json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let m = &v["machines"][0];
    assert_eq!(m["cloud"]["status"], "ok", "{m:#}");
    assert_eq!(m["ssh"]["status"], "fail", "{m:#}");
    let detail = m["ssh"]["detail"].as_str().unwrap();
    assert!(
        detail.contains("host key") && detail.contains("changed"),
        "{detail}"
    );
    std::fs::write(p.state_path(), &original).unwrap();

    // 3. The container stopped outside gpuprov: exit 1, the instance is not running.
    let docker = bollard::Docker::connect_with_defaults().unwrap();
    docker
        .stop_container(
            &ids[0],
            Some(
                bollard::query_parameters::StopContainerOptionsBuilder::default()
                    .t(1)
                    .build(),
            ),
        )
        .await
        .unwrap();
    let out = p.run(&["health"]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("not running"), "{text}");
    assert!(text.contains("1 unhealthy"), "{text}");
    let out = p.run(&["health", "-json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_valid(&v);
    assert_eq!(v["machines"][0]["ssh"]["status"], "skipped");

    let out = p.run(&["destroy", "--auto-approve"]);
    assert!(out.status.success());
    assert_eq!(leftovers(&lineage).await, (0, 0, 0));
}
