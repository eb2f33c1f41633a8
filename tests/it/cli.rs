//! Golden tests of the CLI (assert_cmd + insta snapshots in tests/it/snapshots/, taken
//! under insta filters for temp paths, ids, digests, timestamps and durations). None of
//! these needs Docker: they plan with `--refresh=false` or stop before any cloud call.
//! Review changes with `cargo insta review`.

use std::path::PathBuf;

use assert_cmd::Command;
use gpuprov::config::{Cloud, VmSpec};
use gpuprov::provider::SshEndpoint;
use gpuprov::ssh::HostKey;
use gpuprov::state::{MachineRecord, ResourceRecord, StateStore};
use gpuprov::vm::{LaunchState, VmRecord};

struct Project {
    dir: tempfile::TempDir,
}

const DOCKER_TOML: &str = "#:schema ../schemas/gpuprov.schema.json\n[defaults]\nclouds = [\"docker\"]\n\n[vm.dev]\nregions = [\"local\"]\n";

impl Project {
    fn new(config: &str) -> Project {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("gpuprov.toml"), config).unwrap();
        Project { dir }
    }
    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::cargo_bin("gpuprov").unwrap();
        c.current_dir(self.dir.path())
            .env("GPUPROV_HOME", self.path("home"))
            .env("NO_COLOR", "1")
            .env_remove("GPUPROV_CONFIG")
            .env_remove("GPUPROV_STATE")
            .env_remove("GPUPROV_SSH_KEY_FILE")
            .env_remove("GITHUB_STEP_SUMMARY")
            .args(args);
        c
    }
    /// Runs and returns (exit code, stdout, stderr) as the binary wrote them.
    fn run(&self, args: &[&str]) -> (i32, String, String) {
        let out = self.cmd(args).output().unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (
            out.status.code().unwrap_or(-1),
            text(&out.stdout),
            text(&out.stderr),
        )
    }

    /// The insta settings every snapshot of this project is taken under: its temp
    /// directory, UUIDs (the lineage), SHA-256 digests, RFC 3339 timestamps and measured
    /// durations become placeholders, so a snapshot keeps only what the CLI means.
    fn settings(&self) -> insta::Settings {
        let mut s = insta::Settings::clone_current();
        s.add_filter(
            &regex_escape(&self.dir.path().display().to_string()),
            "[TMP]",
        );
        s.add_filter(
            r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b",
            "[UUID]",
        );
        s.add_filter(r"\b[0-9a-fA-F]{64}\b", "[SHA256]");
        s.add_filter(
            r"\b\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})",
            "[TIMESTAMP]",
        );
        s.add_filter(r"\b\d+(\.\d+)?(ms|µs|ns)\b", "[DURATION]");
        s.add_filter(
            r#""uptime_seconds": \d+"#,
            r#""uptime_seconds": "[UPTIME]""#,
        );
        s
    }

    /// Snapshots `value` as `name` under [`Project::settings`].
    fn snapshot(&self, name: &str, value: &str) {
        self.settings()
            .bind(|| insta::assert_snapshot!(name, value));
    }

    /// Snapshots a run's exit code, stdout and stderr together as `name`.
    fn snap(&self, name: &str, code: i32, stdout: &str, stderr: &str) {
        self.snapshot(
            name,
            &format!("exit: {code}\n--- stdout\n{stdout}--- stderr\n{stderr}"),
        );
    }

    /// Writes a state where `vm.NAME` is up, applied with `desired`.
    fn with_ready(&self, desired: &VmSpec) {
        self.with_ready_all(std::slice::from_ref(desired));
    }

    /// Writes a state where each machine of `all` is up, applied with its settings.
    fn with_ready_all(&self, all: &[VmSpec]) {
        let (mut store, mut state) = StateStore::open(self.path("gpuprov.state.json")).unwrap();
        state.lineage = "00000000-0000-4000-8000-000000000000".into();
        for desired in all {
            state
                .resources
                .insert(format!("vm.{}", desired.name), ready_record(desired));
        }
        store.save(&mut state).unwrap();
    }
}

/// The record of a machine up on the Docker cloud, applied with `desired`.
fn ready_record(desired: &VmSpec) -> ResourceRecord {
    let offer = crate::support::docker_offer();
    let vm = VmRecord {
        instance_id: "c0ffee".into(),
        location: offer.location.clone(),
        offer,
        ssh: SshEndpoint {
            host: "127.0.0.1".into(),
            port: 32768,
            user: Some("root".into()),
        },
        user: "root".into(),
        host_key: HostKey {
            algorithm: "ssh-ed25519".into(),
            key_base64: "AAAA".into(),
            fingerprint: "SHA256:x".into(),
        },
        ready_at: chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .unwrap()
            .into(),
        preemptions: vec![],
    };
    let s = LaunchState::Ready { vm: Box::new(vm) };
    let mut rec = ResourceRecord::new(MachineRecord {
        kind: "launch".into(),
        state: gpuprov::state::JsonText::encode(&s).unwrap(),
        label: "ready c0ffee".into(),
        updated_at: chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .unwrap()
            .into(),
    });
    rec.desired = Some(gpuprov::state::JsonText::encode(&desired).unwrap());
    rec
}

fn dev() -> VmSpec {
    let mut v = VmSpec::new("dev", vec![Cloud::Docker]);
    v.regions = vec!["local".into()];
    v
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

#[test]
fn plan_create() {
    let p = Project::new(DOCKER_TOML);
    let (code, out, err) = p.run(&["plan", "--refresh=false"]);
    p.snap("plan_create", code, &out, &err);
    assert_eq!(code, 0);
}

#[test]
fn plan_detailed_exitcode_is_2_with_changes_and_0_without() {
    let p = Project::new(DOCKER_TOML);
    assert_eq!(
        p.run(&["plan", "--refresh=false", "--detailed-exitcode"]).0,
        2
    );
    p.with_ready(&dev());
    assert_eq!(
        p.run(&["plan", "--refresh=false", "--detailed-exitcode"]).0,
        0
    );
}

#[test]
fn plan_no_op() {
    let p = Project::new(DOCKER_TOML);
    p.with_ready(&dev());
    let (code, out, err) = p.run(&["plan", "--refresh=false"]);
    p.snap("plan_no_op", code, &out, &err);
}

#[test]
fn plan_replace() {
    let p = Project::new(&format!("{DOCKER_TOML}image = \"debian:12\"\n"));
    p.with_ready(&dev());
    let (code, out, err) = p.run(&["plan", "--refresh=false", "--detailed-exitcode"]);
    p.snap("plan_replace", code, &out, &err);
    assert_eq!(code, 2);
}

#[test]
fn plan_update_in_place() {
    let p = Project::new(&format!("{DOCKER_TOML}retry_until_up = true\n"));
    p.with_ready(&dev());
    let (code, out, err) = p.run(&["plan", "--refresh=false"]);
    p.snap("plan_update_in_place", code, &out, &err);
}

#[test]
fn plan_destroy() {
    let p = Project::new(DOCKER_TOML);
    p.with_ready(&dev());
    let mut old = dev();
    old.name = "old".into();
    p.with_ready(&old);
    let (code, out, err) = p.run(&["plan", "--refresh=false"]);
    p.snap("plan_destroy", code, &out, &err);
}

#[test]
fn plan_json() {
    let p = Project::new(DOCKER_TOML);
    let (code, out, _) = p.run(&["plan", "--refresh=false", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).expect("stdout is JSON only");
    // Terraform's JSON plan shape (issue 19), gpuprov's own facts under "gpuprov".
    assert_eq!(v["format_version"], "1.2");
    let c = &v["resource_changes"][0];
    assert_eq!(
        (&c["address"], &c["type"], &c["name"], &c["mode"]),
        (
            &serde_json::json!("vm.dev"),
            &serde_json::json!("vm"),
            &serde_json::json!("dev"),
            &serde_json::json!("managed")
        )
    );
    assert_eq!(c["change"]["actions"], serde_json::json!(["create"]));
    assert!(c["change"]["before"].is_null());
    assert_eq!(
        c["change"]["after"]["clouds"],
        serde_json::json!(["docker"])
    );
    assert_eq!(c["change"]["after_unknown"]["instance"], true);
    assert_eq!(c["gpuprov"]["action"], "create");
    assert_eq!(v["gpuprov"]["add"], 1);
    assert_valid("gpuprov-plan.schema.json", &v);
    p.snapshot("plan_json", &out);
}

#[test]
fn saved_plan_is_refused_once_the_state_moved_on() {
    let p = Project::new(DOCKER_TOML);
    let (code, out, _) = p.run(&["plan", "--refresh=false", "-out", "tfplan.json"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("gpuprov apply tfplan.json"), "{out}");
    p.with_ready(&dev()); // another apply wrote the state meanwhile
    let (code, _, err) = p.run(&["apply", "tfplan.json"]);
    assert_eq!(code, 1);
    assert!(err.contains("saved plan tfplan.json is stale"), "{err}");
}

#[test]
fn saved_plan_is_refused_after_a_config_edit() {
    let p = Project::new(DOCKER_TOML);
    assert_eq!(p.run(&["plan", "--refresh=false", "-out=tfplan.json"]).0, 0);
    std::fs::write(
        p.path("gpuprov.toml"),
        format!("{DOCKER_TOML}ports = [8080]\n"),
    )
    .unwrap();
    let (code, _, err) = p.run(&["apply", "tfplan.json"]);
    assert_eq!(code, 1);
    assert!(err.contains("was made from a different"), "{err}");
}

#[test]
fn apply_without_a_terminal_needs_auto_approve() {
    let p = Project::new(DOCKER_TOML);
    let (code, _, err) = p.run(&["apply", "--refresh=false"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("needs confirmation, but standard input is not a terminal"),
        "{err}"
    );
    assert!(err.contains("--auto-approve"), "{err}");
    assert!(
        !p.path("gpuprov.state.json").exists(),
        "nothing was written"
    );
}

fn bad_config(name: &str, text: &str) {
    let p = Project::new(text);
    let (code, out, err) = p.run(&["plan", "--refresh=false"]);
    assert_eq!(code, 1, "{err}");
    p.snap(name, code, &out, &err);
}

#[test]
fn diagnostic_unknown_key() {
    bad_config(
        "bad_unknown_key",
        "[vm.dev]\nclouds = [\"docker\"]\ngpus = 1\n",
    );
}

#[test]
fn diagnostic_wrong_type() {
    bad_config(
        "bad_wrong_type",
        "[vm.dev]\nclouds = [\"docker\"]\ndisk_gb = \"100\"\n",
    );
}

#[test]
fn diagnostic_unknown_cloud() {
    bad_config("bad_unknown_cloud", "[vm.dev]\nclouds = [\"dokcer\"]\n");
}

#[test]
fn diagnostic_cycle() {
    bad_config(
        "bad_cycle",
        "[defaults]\nclouds = [\"docker\"]\n\n[vm.a]\ndepends_on = [\"b\"]\n\n[vm.b]\ndepends_on = [\"a\"]\n",
    );
}

#[test]
fn diagnostic_dangling_dependency() {
    bad_config(
        "bad_dangling",
        "[defaults]\nclouds = [\"docker\"]\n\n[vm.a]\ndepends_on = [\"db\"]\n",
    );
}

#[test]
fn diagnostic_toml_syntax() {
    bad_config("bad_syntax", "[vm.dev\nclouds = [\"docker\"]\n");
}

#[test]
fn diagnostic_gpu_on_docker() {
    bad_config(
        "bad_gpu_on_docker",
        "[vm.dev]\nclouds = [\"docker\"]\ngpu = \"H100\"\n",
    );
}

#[test]
fn diagnostic_explicit_kubernetes_on_docker() {
    bad_config(
        "bad_k8s_on_docker",
        "[vm.dev]\nclouds = [\"docker\"]\nkubernetes = true\n",
    );
}

#[test]
fn kubernetes_by_default_is_skipped_on_docker_with_a_note() {
    let p = Project::new(DOCKER_TOML);
    let (_, _, err) = p.run(&["plan", "--refresh=false"]);
    assert!(
        err.contains("note: vm.dev: kubernetes skipped: docker cannot host k3s"),
        "{err}"
    );
}

#[test]
fn missing_config_is_a_clear_error() {
    let p = Project::new(DOCKER_TOML);
    let (code, _, err) = p.run(&["plan", "-c", "nope.toml"]);
    assert_eq!(code, 1);
    assert!(err.contains("cannot read config file nope.toml"), "{err}");
}

#[test]
fn a_truncated_state_file_is_refused_and_left_untouched() {
    let p = Project::new(DOCKER_TOML);
    p.with_ready(&dev());
    let full = std::fs::read(p.path("gpuprov.state.json")).unwrap();
    let truncated = &full[..full.len() / 2];
    std::fs::write(p.path("gpuprov.state.json"), truncated).unwrap();
    for args in [
        &["plan", "--refresh=false"][..],
        &["apply", "--auto-approve", "--refresh=false"],
        &["destroy", "--auto-approve"],
        &["status"],
    ] {
        let (code, _, err) = p.run(args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(
            err.contains("gpuprov.state.json"),
            "{args:?} names the file: {err}"
        );
        assert_eq!(
            std::fs::read(p.path("gpuprov.state.json")).unwrap(),
            truncated,
            "{args:?} changed the file"
        );
    }
    let (_, _, err) = p.run(&["plan", "--refresh=false"]);
    p.snap("bad_truncated_state", 1, "", &err);
}

#[test]
fn a_held_lock_fails_within_the_timeout_naming_the_holder() {
    let p = Project::new(DOCKER_TOML);
    let (lock, _) = gpuprov::state::StateLock::acquire(
        &p.path("gpuprov.state.json"),
        "apply",
        std::time::Duration::ZERO,
    )
    .unwrap();
    let started = std::time::Instant::now();
    let out = p
        .cmd(&["plan", "--refresh=false", "--lock-timeout", "1s"])
        .output()
        .unwrap();
    let waited = started.elapsed();
    let (code, err) = (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    );
    assert_eq!(code, 1);
    assert!(
        waited >= std::time::Duration::from_millis(900),
        "waited {waited:?}"
    );
    assert!(err.contains("apply"), "names the holder's operation: {err}");
    assert!(
        err.contains(&std::process::id().to_string()),
        "names the holder's pid: {err}"
    );
    assert!(
        err.contains(&lock.info().id),
        "gives the lock id for force-unlock: {err}"
    );
    drop(lock);
    assert_eq!(
        p.run(&["plan", "--refresh=false"]).0,
        0,
        "free again once released"
    );
}

#[test]
fn graph_prints_dot_with_dependency_edges() {
    let p = Project::new(
        "[defaults]\nclouds = [\"docker\"]\n[vm.db]\n[vm.web]\ndepends_on = [\"db\"]\n",
    );
    let (code, out, _) = p.run(&["graph"]);
    assert_eq!(code, 0);
    p.snapshot("graph", &out);
}

#[test]
fn state_list_and_show() {
    let p = Project::new(DOCKER_TOML);
    p.with_ready(&dev());
    let (code, out, _) = p.run(&["state", "list"]);
    assert_eq!((code, out.as_str()), (0, "vm.dev\n"));
    let (code, out, _) = p.run(&["state", "show", "vm.dev"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["machine"]["state"]["state"], "ready");
    let (code, _, err) = p.run(&["state", "show", "vm.nope"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("no resource vm.nope") && err.contains("vm.dev"),
        "{err}"
    );
}

#[test]
fn every_command_has_help() {
    let p = Project::new(DOCKER_TOML);
    for cmd in [
        "plan",
        "apply",
        "destroy",
        "status",
        "list",
        "ssh",
        "graph",
        "validate",
        "state",
        "force-unlock",
        "offers",
        "kubeconfig",
        "tunnel",
        "show",
        "sweep",
        "health",
        "import",
    ] {
        let (code, out, _) = p.run(&[cmd, "--help"]);
        assert_eq!(code, 0, "{cmd}");
        assert!(out.contains("Usage: gpuprov"), "{cmd}: {out}");
    }
}

/// Regression (newcomer report): destroy dropped a record it could not read and left the
/// machine running untracked.
#[test]
fn destroy_refuses_a_record_it_cannot_read_and_changes_nothing() {
    for (field, value) in [("state", "\"exploded\""), ("kind", "\"teleport\"")] {
        let p = Project::new(DOCKER_TOML);
        p.with_ready(&dev());
        let path = p.path("gpuprov.state.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let new: serde_json::Value = serde_json::from_str(value).unwrap();
        if field == "state" {
            v["resources"]["vm.dev"]["machine"]["state"]["state"] = new;
        } else {
            v["resources"]["vm.dev"]["machine"]["kind"] = new;
        }
        std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
        let before = std::fs::read(&path).unwrap();
        for args in [
            &["destroy", "--auto-approve"][..],
            &["plan", "--refresh=false"],
            &["apply", "--auto-approve", "--refresh=false"],
        ] {
            let (code, _, err) = p.run(args);
            assert_eq!(code, 1, "{args:?}: {err}");
            assert!(err.contains("vm.dev"), "{args:?} names the record: {err}");
            assert_eq!(
                std::fs::read(&path).unwrap(),
                before,
                "{args:?} changed the state"
            );
        }
    }
}

/// A plan of more machines than `plan::read_ahead::PARALLEL_FROM` decodes their records
/// on several threads, beside the catalog lookups: it still finds each change, in address
/// order, and a bad record in the middle is still named and the state left as it was.
#[test]
fn a_plan_of_hundreds_of_machines_finds_each_change_and_names_a_bad_record() {
    let n = 300;
    let mut toml = String::from("[defaults]\nclouds = [\"docker\"]\nregions = [\"local\"]\n");
    for i in 0..n {
        toml.push_str(&format!("\n[vm.m{i:03}]\n"));
        match i {
            7 => toml.push_str("retry_until_up = true\n"),
            150 => toml.push_str("image = \"debian:12\"\n"),
            _ => {}
        }
    }
    let p = Project::new(&toml);
    // m000 is only in the config (created), m300 only in the state (destroyed).
    let recorded: Vec<VmSpec> = (1..=n)
        .map(|i| {
            let mut v = VmSpec::new(&format!("m{i:03}"), vec![Cloud::Docker]);
            v.regions = vec!["local".into()];
            v
        })
        .collect();
    p.with_ready_all(&recorded);
    let (code, out, err) = p.run(&["plan", "--refresh=false", "--detailed-exitcode"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        out.contains("Plan: 2 to add, 1 to change, 2 to destroy."),
        "{out}"
    );
    let headers: Vec<&str> = out.lines().filter(|l| l.starts_with("  # vm.")).collect();
    assert_eq!(
        headers,
        [
            "  # vm.m000 will be created",
            "  # vm.m007 will be updated in-place",
            "  # vm.m150 must be replaced",
            "  # vm.m300 will be destroyed",
        ],
        "{out}"
    );

    let path = p.path("gpuprov.state.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v["resources"]["vm.m222"]["machine"]["state"]["state"] = "exploded".into();
    std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    let before = std::fs::read(&path).unwrap();
    for args in [
        &["plan", "--refresh=false"][..],
        &["apply", "--auto-approve", "--refresh=false"],
    ] {
        let (code, _, err) = p.run(args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(
            err.contains("state record vm.m222 is not a valid launch state"),
            "{args:?}: {err}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), before, "{args:?}");
    }
}

/// Regression (newcomer report): `gpuprov status | head -1` panicked on the broken pipe.
#[test]
fn a_closed_stdout_is_not_a_panic() {
    let p = Project::new(DOCKER_TOML);
    p.with_ready(&dev());
    for args in [
        &["graph"][..],
        &["state", "list"],
        &["plan", "--refresh=false"],
        &["status", "--refresh=false"],
    ] {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gpuprov"))
            .current_dir(p.dir.path())
            .env("GPUPROV_HOME", p.path("home"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // the reader goes away before anything is written
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_ne!(out.status.code(), Some(101), "{args:?}: {stderr}");
    }
}

/// A saved plan's lineage can become a new state's lineage, which names a directory.
#[test]
fn a_saved_plan_with_a_forged_lineage_is_refused() {
    let p = Project::new(DOCKER_TOML);
    assert_eq!(
        p.run(&["plan", "--refresh=false", "-out", "tfplan.json"]).0,
        0
    );
    let path = p.path("tfplan.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v["lineage"] = "../../../tmp/evil".into();
    std::fs::write(&path, v.to_string()).unwrap();
    let (code, _, err) = p.run(&["apply", "tfplan.json"]);
    assert_eq!(code, 1);
    assert!(err.contains("invalid lineage"), "{err}");
    assert!(!p.path("gpuprov.state.json").exists());
}

/// Issue 3: `plan` on the AWS example prints the offers in the order apply tries them,
/// with prices, offline (the catalog is built in).
#[test]
fn plan_lists_the_ordered_offers_with_prices() {
    let example =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/aws.toml")).unwrap();
    let p = Project::new(&example);
    let (code, out, err) = p.run(&["plan", "--refresh=false"]);
    assert_eq!(code, 0, "{err}");
    let trainer = out.split("# vm.trainer").nth(1).expect("trainer planned");
    let lines: Vec<&str> = trainer
        .lines()
        .filter(|l| l.trim_start().starts_with("# ") && l.contains("/h"))
        .collect();
    assert!(lines.len() >= 2, "{out}");
    assert!(
        lines[0].contains("1. aws/us-east-1/p5.48xlarge") && lines[0].contains('$'),
        "{lines:?}"
    );
    // One offer per zone: every zone of us-east-1 before us-west-2.
    let west = lines
        .iter()
        .position(|l| l.contains(". aws/us-west-2/"))
        .unwrap_or_else(|| panic!("us-west-2 planned: {lines:?}"));
    assert!(
        west > 1 && lines[..west].iter().all(|l| l.contains(". aws/us-east-1/")),
        "regions in the order the config lists them: {lines:?}"
    );
    assert!(
        lines[1].contains("2. aws/us-east-1/p5.48xlarge/us-east-1b"),
        "{lines:?}"
    );
    let (_, json, _) = p.run(&["plan", "--refresh=false", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let trainer = &v["resource_changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "trainer")
        .unwrap()["gpuprov"];
    assert_eq!(
        trainer["offers"][0]["id"],
        "aws/us-east-1/p5.48xlarge/us-east-1a"
    );
    assert_eq!(
        trainer["price_per_hour"], trainer["offers"][0]["price_per_hour"],
        "priced by the first offer tried"
    );
}

#[test]
fn offers_lists_the_catalog_cheapest_first_without_a_config() {
    let p = Project::new("");
    std::fs::remove_file(p.path("gpuprov.toml")).unwrap();
    let (code, out, err) = p.run(&["offers", "--cloud", "aws", "--gpu", "a10g"]);
    assert_eq!(code, 0, "{err}");
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert!(out.starts_with("CLOUD"), "{out}");
    assert!(rows.len() >= 2, "{out}");
    // USD/H is the next-to-last column (the last is per GPU-hour).
    let prices: Vec<f64> = rows
        .iter()
        .map(|l| l.split_whitespace().rev().nth(1).unwrap().parse().unwrap())
        .collect();
    assert!(
        prices.windows(2).all(|w| w[0] <= w[1]),
        "cheapest first: {out}"
    );
    assert!(rows.iter().all(|l| l.contains("A10G")), "{out}");

    let (code, json, err) = p.run(&[
        "offers",
        "--cloud",
        "aws",
        "--gpu",
        "A10G",
        "--max-price",
        "2",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let list = v.as_array().unwrap();
    assert!(!list.is_empty(), "{json}");
    assert!(list
        .iter()
        .all(|o| o["price_per_hour"].as_f64().unwrap() <= 2.0
            && o["cloud"] == "aws"
            && o.get("detail").is_none()));

    let (code, json, _) = p.run(&[
        "offers", "--cloud", "aws", "--gpu", "A10G", "--limit", "1", "--json",
    ]);
    assert_eq!(code, 0);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&json)
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

/// Issue 19: `--gpu-count` is exact, `--min-gpu-count` a minimum; the table shows sizes,
/// the per-GPU price, spot upper bounds, and where each cloud's prices come from.
#[test]
fn offers_count_gpus_exactly_unless_asked_for_a_minimum() {
    let p = Project::new("");
    std::fs::remove_file(p.path("gpuprov.toml")).unwrap();
    let counts = |args: &[&str]| -> Vec<u64> {
        let mut all = vec!["offers", "--cloud", "aws", "--gpu", "A10G", "--json"];
        all.extend_from_slice(args);
        let (code, out, err) = p.run(&all);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let mut c: Vec<u64> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["gpu_count"].as_u64().unwrap())
            .collect();
        c.sort();
        c.dedup();
        c
    };
    assert_eq!(counts(&["--gpu-count", "4"]), vec![4]);
    assert_eq!(counts(&["--min-gpu-count", "4"]), vec![4, 8]);
    assert_eq!(counts(&[]), vec![1, 4, 8]);
    let (code, _, err) = p.run(&["offers", "--gpu-count", "2", "--min-gpu-count", "2"]);
    assert_eq!(code, 1, "the two counts conflict: {err}");

    let (code, out, err) = p.run(&[
        "offers",
        "--cloud",
        "aws",
        "--gpu",
        "A10G",
        "--gpu-count",
        "8",
        "--spot",
    ]);
    assert_eq!(code, 0, "{err}");
    let header: Vec<&str> = out
        .lines()
        .next()
        .unwrap()
        .split("  ")
        .filter(|c| !c.trim().is_empty())
        .map(str::trim)
        .collect();
    for col in ["VCPUS", "MEM GIB", "DISK GIB", "SPOT", "USD/H", "USD/GPU-H"] {
        assert!(header.contains(&col), "{header:?}");
    }
    let row = out.lines().nth(1).unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    let (total, per_gpu) = (cells[cells.len() - 2], cells[cells.len() - 1]);
    // AWS publishes no spot price in gpuprov's list: the on-demand price bounds it.
    let strip = |c: &str| {
        c.strip_prefix("<=")
            .expect("marked as an upper bound")
            .parse::<f64>()
            .unwrap()
    };
    assert!((strip(total) / 8.0 - strip(per_gpu)).abs() < 0.01, "{row}");
    assert!(
        err.contains("note: aws: prices from gpuprov's built-in list as of 2025-06")
            && err.contains("an upper bound"),
        "{err}"
    );
    let (_, json, _) = p.run(&[
        "offers",
        "--cloud",
        "aws",
        "--gpu",
        "A10G",
        "--gpu-count",
        "8",
        "--spot",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_valid("gpuprov-offers.schema.json", &v);
    assert_eq!(v[0]["price_is_upper_bound"], true);
    assert_eq!(v[0]["prices_as_of"], "2025-06");
}

#[test]
fn offers_for_a_config_machine_keep_applys_order() {
    let example =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/aws.toml")).unwrap();
    let p = Project::new(&example);
    let (code, out, err) = p.run(&["offers", "--vm", "trainer", "--json"]);
    assert_eq!(code, 0, "{err}");
    let offers: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    let (_, plan, _) = p.run(&["plan", "--refresh=false", "--json"]);
    let plan: serde_json::Value = serde_json::from_str(&plan).unwrap();
    let planned = plan["resource_changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "trainer")
        .unwrap()["gpuprov"]["offers"]
        .as_array()
        .unwrap()
        .clone();
    let ids = |l: &[serde_json::Value]| l.iter().map(|o| o["id"].clone()).collect::<Vec<_>>();
    assert_eq!(
        ids(&offers),
        ids(&planned),
        "same offers, same order as plan"
    );

    let (code, _, err) = p.run(&["offers", "--vm", "nope"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("no [vm.nope]") && err.contains("trainer"),
        "{err}"
    );
}

#[test]
fn offers_rejects_unknown_clouds_and_bad_prices() {
    let p = Project::new("");
    std::fs::remove_file(p.path("gpuprov.toml")).unwrap();
    let (code, _, err) = p.run(&["offers", "--cloud", "nimbus"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("--cloud nimbus: unknown cloud") && err.contains("known clouds: aws"),
        "{err}"
    );
    let (code, _, err) = p.run(&["offers", "--cloud", "aws", "--max-price", "-3"]);
    assert_eq!(code, 1);
    assert!(err.contains("--max-price -3"), "{err}");
    let (code, out, err) = p.run(&["offers", "--cloud", "aws"]);
    assert_eq!(
        code, 0,
        "a cloud that refuses the ask still answered: {err}"
    );
    assert!(
        err.contains("note: aws:") && out.contains("No offers match."),
        "{out}{err}"
    );
}

/// Issue 19: the exit-code table is one table, shown by `--help` and the README.
#[test]
fn the_exit_code_table_is_in_help_and_readme() {
    let p = Project::new(DOCKER_TOML);
    let (code, out, _) = p.run(&["--help"]);
    assert_eq!(code, 0);
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    for (c, meaning) in gpuprov::cli::EXIT_CODES {
        assert!(
            out.contains(&format!("  {c:<4} {meaning}")),
            "--help lacks exit code {c}: {out}"
        );
        assert!(
            readme.contains(&format!("| {c} | {meaning} |")),
            "README lacks the row of exit code {c}"
        );
    }
    p.snapshot("help", &out);
}

/// Issue 19, exit 1: every usage error, clap's or an unknown single-dash word, exits 1
/// (never 2, which `--detailed-exitcode` gives to "changes present").
#[test]
fn every_usage_error_exits_1() {
    let p = Project::new(DOCKER_TOML);
    for args in [
        &[][..],
        &["bogus"],
        &["plan", "--nope"],
        &["plan", "-nope"],
        &["plan", "--lock-timeout", "soon"],
        &["plan", "--detailed-exitcode=yes"],
        &["ssh"],
        &["state"],
        &["apply", "--parallelism", "0"],
        &["-chdirr=sub", "plan"],
    ] {
        let (code, out, err) = p.run(args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: usage errors go to stderr: {out}");
        assert!(
            !err.trim().is_empty() && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
    let (code, out, err) = p.run(&["plan", "-detailed-exitcodes"]);
    p.snap("usage_unknown_single_dash", code, &out, &err);
    let (code, out, err) = p.run(&["plan", "--detailed-exitcodes"]);
    p.snap("usage_unknown_long", code, &out, &err);
}

/// Issue 19, exit 0 and 2: `-detailed-exitcode` says "changes" with 2 and nothing else.
#[test]
fn detailed_exitcode_is_0_or_2_and_help_is_0() {
    let p = Project::new(DOCKER_TOML);
    assert_eq!(
        p.run(&["plan", "-refresh=false", "-detailed-exitcode"]).0,
        2
    );
    assert_eq!(p.run(&["plan", "-refresh=false"]).0, 0);
    p.with_ready(&dev());
    assert_eq!(
        p.run(&["plan", "-refresh=false", "-detailed-exitcode"]).0,
        0
    );
    for args in [
        &["--help"][..],
        &["plan", "-help"],
        &["--version"],
        &["help", "plan"],
    ] {
        let (code, out, _) = p.run(args);
        assert_eq!(code, 0, "{args:?}");
        assert!(out.contains("gpuprov"), "{args:?}: {out}");
    }
}

/// Issue 19, exit 130: Ctrl-C or SIGTERM while waiting for the lock (announced with its
/// holder) ends the command at once with 130.
#[test]
fn an_interrupt_while_waiting_for_the_lock_exits_130() {
    use std::io::BufRead;
    let p = Project::new(DOCKER_TOML);
    let (_lock, _) = gpuprov::state::StateLock::acquire(
        &p.path("gpuprov.state.json"),
        "apply",
        std::time::Duration::ZERO,
    )
    .unwrap();
    for signal in [libc::SIGINT, libc::SIGTERM] {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gpuprov"))
            .current_dir(p.dir.path())
            .env("GPUPROV_HOME", p.path("home"))
            .env("NO_COLOR", "1")
            .args(["plan", "-refresh=false", "-lock-timeout=60s"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        stderr.read_line(&mut line).unwrap();
        assert!(
            line.starts_with("Acquiring state lock… held by apply by ")
                && line.contains(&format!("pid {}", std::process::id()))
                && line.contains("waiting up to 1m"),
            "the wait is announced with its holder: {line}"
        );
        let started = std::time::Instant::now();
        // SAFETY: kill(2) on the child's pid, which has not been waited for yet.
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(130), "signal {signal}: {rest}");
        assert!(rest.contains("gpuprov::interrupted"), "{rest}");
        assert!(started.elapsed() < std::time::Duration::from_secs(20));
    }
}

/// Issue 19: Terraform's single-dash spellings, `-chdir` among them, beside the
/// double-dash ones.
#[test]
fn terraform_spellings_work_beside_the_double_dash_ones() {
    let p = Project::new(DOCKER_TOML);
    std::fs::create_dir(p.path("sub")).unwrap();
    std::fs::rename(p.path("gpuprov.toml"), p.path("sub/gpuprov.toml")).unwrap();
    let (code, out, err) = p.run(&[
        "-chdir=sub",
        "plan",
        "-refresh=false",
        "-lock=false",
        "-lock-timeout=5s",
        "-no-color",
        "-detailed-exitcode",
        "-out=tfplan.json",
    ]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        p.path("sub/tfplan.json").exists(),
        "-out is read in -chdir's directory"
    );
    assert!(
        !p.path("sub/gpuprov.state.json.lock").exists(),
        "-lock=false took no lock"
    );
    let (code, json, err) = p.run(&["-chdir", "sub", "plan", "-refresh=false", "-json"]);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str::<serde_json::Value>(&json).expect("-json prints JSON");
    let (code, _, err) = p.run(&["plan", "-chdir=sub", "-refresh=false"]);
    assert_eq!(code, 0, "a global flag after the subcommand: {err}");
    // Terraform's -input=false: never prompt, even on a terminal.
    let (code, _, err) = p.run(&["-chdir=sub", "apply", "-input=false", "-refresh=false"]);
    assert_eq!(code, 1);
    assert!(err.contains("input is off (--input=false)"), "{err}");
    assert_eq!(
        p.run(&["-chdir=sub", "plan", "-input=false", "-refresh=false"])
            .0,
        0,
        "plan never asks"
    );
    // Without -chdir there is no config here.
    assert_eq!(p.run(&["plan", "-refresh=false"]).0, 1);
    let (code, _, err) = p.run(&["-chdir=nowhere", "plan"]);
    assert_eq!(code, 1);
    assert!(err.contains("-chdir=nowhere: cannot switch to it"), "{err}");
}

/// A machine whose clouds offer nothing, for a different reason on each: AWS's offline
/// catalog prices every H100 above the cap, Lambda has no key, RunPod's endpoint refuses
/// the connection (loopback, nothing listens), and the Docker cloud has no GPUs.
const NO_OFFERS_TOML: &str = "[vm.trainer]\nclouds = [\"aws\", \"lambda\", \"runpod\", \"docker\"]\ngpu = \"H100\"\ngpu_count = 8\nmax_price_per_hour = 1.0\n";

fn no_offers_project() -> Project {
    Project::new(NO_OFFERS_TOML)
}

fn run_no_offers(p: &Project, args: &[&str]) -> (i32, String, String) {
    let out = p
        .cmd(args)
        .env_remove("LAMBDA_API_KEY")
        .env("HOME", p.path("home"))
        .env("RUNPOD_API_KEY", "sentinel-runpod-key")
        .env("GPUPROV_RUNPOD_ENDPOINT", "http://127.0.0.1:9")
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

/// Issue 19: a plan that cannot be applied fails at plan time, exit 1, with each cloud's
/// reason, unless `--allow-no-offers`.
#[test]
fn a_machine_without_offers_fails_the_plan_with_each_clouds_reason() {
    let p = no_offers_project();
    for args in [
        &["plan", "--refresh=false"][..],
        &["plan", "--refresh=false", "--detailed-exitcode"],
        &["apply", "--refresh=false", "--auto-approve"],
    ] {
        let (code, out, err) = run_no_offers(&p, args);
        assert_eq!(code, 1, "{args:?}: {out}{err}");
        for why in [
            "aws",
            "everything above the max price: ",
            "lambda",
            "no credentials: ",
            "runpod",
            "API error: ",
            "docker",
            "nothing matches the ask: ",
            "--allow-no-offers",
        ] {
            assert!(err.contains(why), "{args:?}: {why}: {err}");
        }
        assert!(!err.contains("sentinel-runpod-key"), "{err}");
        assert!(
            !p.path("gpuprov.state.json").exists(),
            "{args:?} wrote a state"
        );
    }
    let (code, out, err) = run_no_offers(&p, &["plan", "--refresh=false"]);
    p.snap("plan_no_offers", code, &out, &err);

    let (code, out, err) = run_no_offers(
        &p,
        &[
            "plan",
            "--refresh=false",
            "--allow-no-offers",
            "--detailed-exitcode",
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert!(out.contains("NO offers: apply cannot create it"), "{out}");
    p.snap("plan_no_offers_allowed", code, &out, &err);
    let (code, json, _) =
        run_no_offers(&p, &["plan", "-refresh=false", "-allow-no-offers", "-json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let reasons: Vec<&str> = v["resource_changes"][0]["gpuprov"]["no_offers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["reason"].as_str().unwrap())
        .collect();
    assert_eq!(
        reasons,
        ["above_max_price", "no_credentials", "api_error", "no_match"]
    );
}

/// A machine that is up needs no offer: its plan is no change, even with no offers.
#[test]
fn a_running_machine_without_offers_still_plans_no_changes() {
    let p = no_offers_project();
    let config = gpuprov::config::Config::load(&p.path("gpuprov.toml")).unwrap();
    p.with_ready(&config.vms["trainer"]);
    let (code, out, err) = run_no_offers(&p, &["plan", "--refresh=false", "--detailed-exitcode"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("No changes."), "{out}");
}

/// Checks `value` against `schemas/NAME`, the committed JSON Schema of an output.
fn assert_valid(name: &str, value: &serde_json::Value) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/schemas/").to_string() + name;
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(value)
        .map(|e| format!("{e} at {}", e.instance_path))
        .collect();
    assert!(errors.is_empty(), "{name}: {errors:?}\n{value:#}");
}

fn json_of(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {out}"))
}

/// Issue 19: `show -json PLANFILE` is `plan -json`, as Terraform's `show -json`; `show`
/// alone is the text plan.
#[test]
fn show_prints_a_saved_plan_as_text_or_terraform_json() {
    let p = Project::new(DOCKER_TOML);
    assert_eq!(p.run(&["plan", "-refresh=false", "-out=tfplan"]).0, 0);
    let (code, shown, err) = p.run(&["show", "-json", "tfplan"]);
    assert_eq!(code, 0, "{err}");
    let (_, planned, _) = p.run(&["plan", "-refresh=false", "-json"]);
    // Without a state, each plan picks the lineage the first state will have.
    let without_lineage = |text: &str| {
        let mut v = json_of(text);
        v["gpuprov"]["lineage"] = serde_json::Value::Null;
        v
    };
    assert_eq!(without_lineage(&shown), without_lineage(&planned));
    assert_valid("gpuprov-plan.schema.json", &json_of(&shown));
    let (code, text, _) = p.run(&["show", "tfplan"]);
    assert_eq!(code, 0);
    assert!(text.contains("# vm.dev will be created"), "{text}");
    let (code, _, err) = p.run(&["show", "-json", "nope"]);
    assert_eq!(code, 1);
    assert!(err.contains("cannot read saved plan nope"), "{err}");
}

/// Issue 19: a replacement in Terraform's shape: before and after, ["delete", "create"],
/// and the setting that forces it as a replace path.
#[test]
fn plan_json_of_a_replacement_has_before_after_and_replace_paths() {
    let p = Project::new(&format!("{DOCKER_TOML}image = \"debian:12\"\n"));
    p.with_ready(&dev());
    let (code, out, _) = p.run(&["plan", "-refresh=false", "-json"]);
    assert_eq!(code, 0);
    let v = json_of(&out);
    assert_valid("gpuprov-plan.schema.json", &v);
    let c = &v["resource_changes"][0]["change"];
    assert_eq!(c["actions"], serde_json::json!(["delete", "create"]));
    assert!(c["before"]["image"].is_null(), "{c:#}");
    assert_eq!(c["after"]["image"], "debian:12");
    assert_eq!(c["replace_paths"], serde_json::json!([["image"]]));
    assert_eq!(v["resource_changes"][0]["gpuprov"]["action"], "replace");
    assert_eq!(v["applyable"], true);
}

/// Issue 19: `status -json` and `list -json` fit their schemas.
#[test]
fn status_and_list_print_json_that_fits_their_schemas() {
    let p = Project::new(DOCKER_TOML);
    let (code, out, _) = p.run(&["status", "-json"]);
    assert_eq!(code, 0);
    let v = json_of(&out);
    assert_valid("gpuprov-status.schema.json", &v);
    assert_eq!(v["machines"], serde_json::json!([]));
    p.with_ready(&dev());
    let (code, out, err) = p.run(&["status", "-refresh=false", "-json"]);
    assert_eq!(code, 0, "{err}");
    let v = json_of(&out);
    assert_valid("gpuprov-status.schema.json", &v);
    let m = &v["machines"][0];
    assert_eq!(m["address"], "vm.dev");
    assert_eq!(m["state"], "ready");
    assert_eq!(m["instance_ids"], serde_json::json!(["c0ffee"]));
    assert_eq!(m["ssh"], "root@127.0.0.1:32768");
    // Up since the record's ready_at; a free container costs nothing however long it runs.
    assert_eq!(m["up_since"], "2026-01-01T00:00:00Z");
    assert!(m["uptime_seconds"].as_u64().unwrap() > 86_400, "{m:#}");
    assert_eq!(m["cost_so_far"], 0.0);
    assert_eq!(m["kubernetes"], "skipped: docker cannot host k3s");
    p.snapshot("status_json", &out);
    let (code, table, _) = p.run(&["status", "-refresh=false"]);
    assert_eq!(code, 0);
    assert!(table.lines().next().unwrap().contains("UPTIME"), "{table}");
    assert!(
        table.contains("note: vm.dev: kubernetes skipped: docker cannot host k3s"),
        "{table}"
    );
    let (code, out, _) = p.run(&["list", "-json"]);
    assert_eq!(code, 0);
    let v = json_of(&out);
    assert_valid("gpuprov-list.schema.json", &v);
    assert_eq!(
        v["machines"],
        serde_json::json!([{"address": "vm.dev", "kind": "launch", "label": "ready c0ffee"}])
    );
}

/// Issue 19: `offers -json` and `validate -json` fit their schemas. Lambda's key is a
/// sentinel and its endpoint a closed loopback port: the key is found, the catalog is not.
#[test]
fn offers_and_validate_print_json_that_fits_their_schemas() {
    let p = Project::new("[vm.trainer]\nclouds = [\"lambda\"]\ngpu = \"H100\"\n");
    let (code, out, err) = p.run(&["offers", "--cloud", "aws", "--gpu", "A10G", "-json"]);
    assert_eq!(code, 0, "{err}");
    let v = json_of(&out);
    assert_valid("gpuprov-offers.schema.json", &v);
    assert!(!v.as_array().unwrap().is_empty());
    let out = p
        .cmd(&["validate", "-json"])
        .env("LAMBDA_API_KEY", "sentinel-lambda-key")
        .env("GPUPROV_LAMBDA_ENDPOINT", "http://127.0.0.1:9")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(!text.contains("sentinel-lambda-key"), "{text}");
    let v = json_of(&text);
    assert_valid("gpuprov-validate.schema.json", &v);
    assert_eq!(v["valid"], true);
    assert_eq!(v["clouds"][0]["cloud"], "lambda");
    assert_eq!(v["clouds"][0]["usable"], true);
    assert_eq!(v["no_offers"]["trainer"][0]["reason"], "api_error");
}

/// Issue 19: every kind of change `plan -json` prints (create, no-op, update, replace,
/// destroy) fits the fields of Terraform's JSON plan that consumers read
/// (`tests/fixtures/terraform-plan-shared.schema.json`, transcribed from
/// hashicorp/terraform-json) as well as gpuprov's own schema.
#[test]
fn plan_json_fits_terraforms_plan_structure_for_every_action() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/terraform-plan-shared.schema.json"
    );
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let terraform = jsonschema::validator_for(&schema).expect("schema compiles");
    let p = Project::new(&format!("{DOCKER_TOML}\n[vm.web]\nregions = [\"local\"]\n"));
    let mut old = dev();
    old.name = "old".into();
    p.with_ready(&old); // destroy
    p.with_ready(&dev()); // no-op
    let mut actions = std::collections::BTreeSet::new();
    for config in [
        format!("{DOCKER_TOML}\n[vm.web]\nregions = [\"local\"]\n"),
        format!("{DOCKER_TOML}retry_until_up = true\n"),
        format!("{DOCKER_TOML}image = \"debian:12\"\n"),
    ] {
        std::fs::write(p.path("gpuprov.toml"), config).unwrap();
        let (code, out, err) = p.run(&["plan", "-refresh=false", "-json"]);
        assert_eq!(code, 0, "{err}");
        let v = json_of(&out);
        let errors: Vec<String> = terraform
            .iter_errors(&v)
            .map(|e| format!("{e} at {}", e.instance_path))
            .collect();
        assert!(errors.is_empty(), "{errors:?}\n{v:#}");
        assert_valid("gpuprov-plan.schema.json", &v);
        for c in v["resource_changes"].as_array().unwrap() {
            actions.insert(c["change"]["actions"].to_string());
        }
    }
    assert_eq!(
        actions.into_iter().collect::<Vec<_>>(),
        [
            r#"["create"]"#,
            r#"["delete","create"]"#,
            r#"["delete"]"#,
            r#"["no-op"]"#,
            r#"["update"]"#
        ]
    );
}

/// Issue 19: completions for bash, zsh and fish come from the clap definitions; the bash
/// script parses and registers itself, and offers the flags and commands there are.
#[test]
fn completions_are_generated_for_each_shell() {
    let p = Project::new(DOCKER_TOML);
    for (shell, marker) in [
        ("bash", "complete -F _gpuprov"),
        ("zsh", "#compdef gpuprov"),
        ("fish", "complete -c gpuprov"),
    ] {
        let (code, out, err) = p.run(&["completion", shell]);
        assert_eq!(code, 0, "{shell}: {err}");
        assert!(out.contains(marker), "{shell}: {out}");
        // fish spells long flags `-l NAME`.
        for word in [
            "plan",
            "apply",
            "auto-approve",
            "detailed-exitcode",
            "chdir",
        ] {
            assert!(out.contains(word), "{shell} lacks {word}");
        }
    }
    let (_, script, _) = p.run(&["completion", "bash"]);
    std::fs::write(p.path("gpuprov.bash"), &script).unwrap();
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg("source ./gpuprov.bash && complete -p gpuprov")
        .current_dir(p.dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("gpuprov"),
        "{out:?}"
    );
    assert_eq!(
        p.run(&["completion", "tcsh"]).0,
        1,
        "an unknown shell is a usage error"
    );
}

/// Issue 19: the man page comes from the clap definitions, with the exit-code table; with
/// --dir, one page per command.
#[test]
fn the_man_page_is_generated_with_every_command() {
    let p = Project::new(DOCKER_TOML);
    let (code, page, err) = p.run(&["man"]);
    assert_eq!(code, 0, "{err}");
    assert!(page.contains(".TH gpuprov 1"), "{page}");
    for word in ["plan", "apply", "destroy", "Exit codes", "130"] {
        assert!(page.contains(word), "the page lacks {word}");
    }
    // ENVIRONMENT lists what gpuprov reads, after the exit codes.
    let env = page
        .find(".SH ENVIRONMENT")
        .expect("an ENVIRONMENT section");
    assert!(page.find("Exit codes").unwrap() < env);
    for var in [
        "GPUPROV_LOG",
        "GPUPROV_BACKEND_CONFIG",
        "NO_COLOR",
        "GITHUB_STEP_SUMMARY",
    ] {
        assert!(page[env..].contains(var), "ENVIRONMENT lacks {var}");
    }
    let (code, _, err) = p.run(&["man", "--dir", "man"]);
    assert_eq!(code, 0, "{err}");
    for file in ["gpuprov.1", "gpuprov-plan.1", "gpuprov-state-push.1"] {
        let text = std::fs::read_to_string(p.path("man").join(file))
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(text.contains(".TH "), "{file}");
    }
    let top = std::fs::read_to_string(p.path("man").join("gpuprov.1")).unwrap();
    assert!(top.contains(".SH ENVIRONMENT"), "{top}");
}

/// A machine that retries until up waits for stock: nothing matching (or everything above
/// its price) is no error for it, but what waiting cannot fix (no credentials) still is.
#[test]
fn a_machine_that_retries_until_up_waits_for_offers_unless_waiting_cannot_help() {
    let p = Project::new(
        "[vm.trainer]\nclouds = [\"aws\"]\ngpu = \"H100\"\ngpu_count = 8\nmax_price_per_hour = 1.0\nretry_until_up = true\n",
    );
    let (code, out, err) = p.run(&["plan", "-refresh=false"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("NO offers now: apply waits for one (retry_until_up)")
            && out.contains("everything above the max price"),
        "{out}"
    );
    let (code, _, err) = run_no_offers(
        &Project::new(
            "[vm.trainer]\nclouds = [\"lambda\"]\ngpu = \"H100\"\nretry_until_up = true\n",
        ),
        &["plan", "-refresh=false"],
    );
    assert_eq!(code, 1);
    assert!(err.contains("no credentials: "), "{err}");
}

/// Issue 19, item 5: the Markdown plan for pull requests (`plan -markdown`, `show
/// -markdown`), also appended to `$GITHUB_STEP_SUMMARY` when GitHub Actions sets it.
#[test]
fn plan_markdown_for_pull_requests_and_the_job_summary() {
    let p = Project::new(DOCKER_TOML);
    let summary = p.path("summary.md");
    let (code, md, err) = p.run(&["plan", "-refresh=false", "-markdown", "-out=tfplan"]);
    assert_eq!(code, 0, "{err}");
    p.snapshot("plan_markdown_create", &md);
    assert!(
        md.starts_with("### gpuprov plan: 1 to add, 0 to change, 0 to destroy"),
        "{md}"
    );
    assert!(
        md.contains("| `vm.dev` | ➕ create | `docker/local` | `container` | $0.00 |"),
        "{md}"
    );
    assert!(
        !md.contains("Saved the plan"),
        "stdout stays Markdown: {md}"
    );
    let out = p
        .cmd(&["show", "-markdown", "tfplan"])
        .env("GITHUB_STEP_SUMMARY", &summary)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        md,
        "show renders the saved plan alike"
    );
    let written = std::fs::read_to_string(&summary).unwrap();
    assert_eq!(written.trim_end(), md.trim_end());
    // A text plan in CI still writes the summary (appended).
    let out = p
        .cmd(&["plan", "-refresh=false"])
        .env("GITHUB_STEP_SUMMARY", &summary)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let written = std::fs::read_to_string(&summary).unwrap();
    assert_eq!(written.matches("### gpuprov plan").count(), 2, "{written}");
    // An unwritable summary path is an error that names it.
    let out = p
        .cmd(&["plan", "-refresh=false"])
        .env("GITHUB_STEP_SUMMARY", p.path("no/such/dir/summary.md"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("GITHUB_STEP_SUMMARY"));
    let (code, _, err) = p.run(&["plan", "-json", "-markdown"]);
    assert_eq!(code, 1, "conflicting formats are a usage error: {err}");
}

// State surgery (`state rm`, `state mv`, `[[moved]]`) and targeted changes (`-target`,
// `-replace`), issue 18.

const TWO_TOML: &str = "[defaults]\nclouds = [\"docker\"]\nregions = [\"local\"]\n\n[vm.dev]\n\n[vm.web]\ndepends_on = [\"dev\"]\n";

fn web() -> VmSpec {
    let mut v = dev();
    v.name = "web".into();
    v.depends_on = vec!["dev".into()];
    v
}

fn state_json(p: &Project) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p.path("gpuprov.state.json")).unwrap()).unwrap()
}

#[test]
fn state_rm_forgets_without_destroying_and_warns() {
    let p = Project::new(DOCKER_TOML);
    p.with_ready(&dev());
    let before = std::fs::read(p.path("gpuprov.state.json")).unwrap();
    let (code, out, err) = p.run(&["state", "rm", "-dry-run", "vm.dev"]);
    p.snap("state_rm_dry_run", code, &out, &err);
    assert_eq!(code, 0);
    assert_eq!(std::fs::read(p.path("gpuprov.state.json")).unwrap(), before);
    let (code, out, err) = p.run(&["state", "rm", "vm.dev"]);
    p.snap("state_rm", code, &out, &err);
    assert_eq!(code, 0);
    assert!(
        err.contains("instance c0ffee at docker/local ($0.00/h)"),
        "{err}"
    );
    let after = state_json(&p);
    assert!(after["resources"].as_object().unwrap().is_empty());
    let serial = |v: &serde_json::Value| v["serial"].as_u64().unwrap();
    let old: serde_json::Value = serde_json::from_slice(&before).unwrap();
    assert_eq!(serial(&after), serial(&old) + 1);
    assert_eq!(
        std::fs::read(p.path("gpuprov.state.json.backup")).unwrap(),
        before
    );
}

#[test]
fn state_rm_of_an_unknown_or_malformed_address_writes_nothing() {
    let p = Project::new(DOCKER_TOML);
    p.with_ready(&dev());
    let before = std::fs::read(p.path("gpuprov.state.json")).unwrap();
    // One unknown address among known ones: nothing is removed.
    let (code, out, err) = p.run(&["state", "rm", "vm.dev", "vm.nope"]);
    p.snap("state_rm_unknown", code, &out, &err);
    assert_eq!(code, 1);
    let (code, out, err) = p.run(&["state", "rm", "dev"]);
    p.snap("state_rm_malformed", code, &out, &err);
    assert_eq!(code, 1);
    assert_eq!(std::fs::read(p.path("gpuprov.state.json")).unwrap(), before);
}

#[test]
fn state_mv_renames_keeping_the_instance_and_its_cloud_name() {
    let p = Project::new(DOCKER_TOML);
    p.with_ready(&dev());
    let (code, out, err) = p.run(&["state", "mv", "--dry-run", "vm.dev", "vm.gpu"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("Would move vm.dev to vm.gpu"), "{out}");
    assert!(state_json(&p)["resources"].get("vm.dev").is_some());
    let (code, out, err) = p.run(&["state", "mv", "vm.dev", "vm.gpu"]);
    p.snap("state_mv", code, &out, &err);
    assert_eq!(code, 0);
    let s = state_json(&p);
    let gpu = &s["resources"]["vm.gpu"];
    assert_eq!(gpu["machine"]["state"]["vm"]["instance_id"], "c0ffee");
    assert_eq!(gpu["cloud_name"], "dev");
    assert!(s["resources"].get("vm.dev").is_none());
    // Moving back to the name the cloud objects carry forgets the alias.
    let (code, _, err) = p.run(&["state", "mv", "vm.gpu", "vm.dev"]);
    assert_eq!(code, 0, "{err}");
    assert!(state_json(&p)["resources"]["vm.dev"]
        .get("cloud_name")
        .is_none());
}

#[test]
fn state_mv_refusals_write_nothing() {
    let p = Project::new(DOCKER_TOML);
    p.with_ready(&dev());
    p.with_ready(&web());
    let before = std::fs::read(p.path("gpuprov.state.json")).unwrap();
    for (name, args) in [
        (
            "state_mv_destination_exists",
            ["state", "mv", "vm.dev", "vm.web"],
        ),
        (
            "state_mv_source_missing",
            ["state", "mv", "vm.nope", "vm.x"],
        ),
        (
            "state_mv_malformed",
            ["state", "mv", "vm.dev", "vm.Bad_Name"],
        ),
    ] {
        let (code, out, err) = p.run(&args);
        p.snap(name, code, &out, &err);
        assert_eq!(code, 1, "{name}");
    }
    assert_eq!(std::fs::read(p.path("gpuprov.state.json")).unwrap(), before);
}

#[test]
fn state_rm_and_mv_help() {
    let p = Project::new(DOCKER_TOML);
    for (name, sub) in [("state_rm_help", "rm"), ("state_mv_help", "mv")] {
        let (code, out, _) = p.run(&["state", sub, "--help"]);
        assert_eq!(code, 0);
        p.snapshot(name, &out);
    }
}

#[test]
fn plan_applies_a_moved_block_as_a_move_not_destroy_and_create() {
    let moved = "[defaults]\nclouds = [\"docker\"]\n\n[vm.gpu]\nregions = [\"local\"]\n\n[[moved]]\nfrom = \"vm.dev\"\nto = \"vm.gpu\"\n";
    let p = Project::new(moved);
    p.with_ready(&dev());
    let before = std::fs::read(p.path("gpuprov.state.json")).unwrap();
    let (code, out, err) = p.run(&["plan", "--refresh=false", "--detailed-exitcode"]);
    p.snap("plan_moved", code, &out, &err);
    assert_eq!(code, 2, "a move is a change apply saves");
    assert!(out.contains("# vm.dev has moved to vm.gpu"), "{out}");
    assert!(
        out.contains("Plan: 0 to add, 0 to change, 0 to destroy."),
        "{out}"
    );
    assert_eq!(
        std::fs::read(p.path("gpuprov.state.json")).unwrap(),
        before,
        "plan writes nothing"
    );
    let (code, out, _) = p.run(&["plan", "--refresh=false", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["resource_changes"][0]["address"], "vm.gpu");
    assert_eq!(v["resource_changes"][0]["previous_address"], "vm.dev");
    assert_eq!(
        v["resource_changes"][0]["change"]["actions"],
        serde_json::json!(["no-op"])
    );
    assert_valid("gpuprov-plan.schema.json", &v);
    // Both ends in the state: an error at the block.
    let mut gpu = dev();
    gpu.name = "gpu".into();
    p.with_ready(&gpu);
    let (code, out, err) = p.run(&["plan", "--refresh=false"]);
    p.snap("plan_moved_both_in_state", code, &out, &err);
    assert_eq!(code, 1);
}

#[test]
fn moved_blocks_are_checked_with_spans() {
    let moved = |from: &str, to: &str| format!("\n[[moved]]\nfrom = \"{from}\"\nto = \"{to}\"\n");
    for (name, text) in [
        (
            "moved_to_not_in_config",
            format!("{DOCKER_TOML}{}", moved("vm.old", "vm.nope")),
        ),
        (
            "moved_from_still_in_config",
            format!("{TWO_TOML}{}", moved("vm.dev", "vm.web")),
        ),
        (
            "moved_same_address",
            format!("{DOCKER_TOML}{}", moved("vm.dev", "vm.dev")),
        ),
        (
            "moved_bad_address",
            format!("{DOCKER_TOML}{}", moved("old", "vm.dev")),
        ),
        (
            "moved_twice",
            format!(
                "{DOCKER_TOML}{}{}",
                moved("vm.old", "vm.dev"),
                moved("vm.old", "vm.dev")
            ),
        ),
        (
            "moved_unknown_key",
            format!("{DOCKER_TOML}{}why = \"x\"\n", moved("vm.old", "vm.dev")),
        ),
    ] {
        let p = Project::new(&text);
        let (code, out, err) = p.run(&["validate"]);
        p.snap(name, code, &out, &err);
        assert_eq!(code, 1, "{name}");
    }
}

#[test]
fn plan_target_includes_dependencies_and_warns() {
    let p = Project::new(TWO_TOML);
    let (code, out, err) = p.run(&[
        "plan",
        "-refresh=false",
        "-target",
        "vm.web",
        "-out",
        "t.plan",
    ]);
    p.snap("plan_target", code, &out, &err);
    assert_eq!(code, 0);
    assert!(err.contains("Resource targeting is in effect"), "{err}");
    // The saved plan keeps the targeted changes only.
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p.path("t.plan")).unwrap()).unwrap();
    let addresses: Vec<&str> = saved["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["address"].as_str().unwrap())
        .collect();
    assert_eq!(addresses, ["vm.dev", "vm.web"], "web depends_on dev");
    let (_, out, _) = p.run(&["plan", "-refresh=false", "-target", "vm.dev", "-json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["complete"], false, "a targeted plan is incomplete");
    // A target without dependencies plans it alone.
    let (code, out, _) = p.run(&["plan", "-refresh=false", "--target=vm.dev"]);
    assert_eq!(code, 0);
    assert!(out.contains("Plan: 1 to add"), "{out}");
    assert!(!out.contains("vm.web"), "{out}");
    // A saved plan is applied as it is.
    let (code, _, err) = p.run(&["apply", "-target", "vm.dev", "t.plan"]);
    assert_eq!(code, 1);
    assert!(err.contains("cannot change a saved plan"), "{err}");
    let (code, out, err) = p.run(&["plan", "-refresh=false", "-target", "vm.nope"]);
    p.snap("plan_target_unknown", code, &out, &err);
    assert_eq!(code, 1);
}

#[test]
fn plan_replace_forces_a_replacement_of_the_named_machine_only() {
    let p = Project::new(TWO_TOML);
    p.with_ready(&dev());
    p.with_ready(&web());
    let (code, out, err) = p.run(&["plan", "-refresh=false", "-replace", "vm.dev"]);
    p.snap("plan_replace_forced", code, &out, &err);
    assert_eq!(code, 0);
    assert!(
        out.contains("Plan: 1 to add, 0 to change, 1 to destroy."),
        "{out}"
    );
    let (_, out, _) = p.run(&["plan", "-refresh=false", "-replace", "vm.dev", "-json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(
        v["resource_changes"][0]["action_reason"],
        "replace_by_request"
    );
    let (code, out, err) = p.run(&["plan", "-refresh=false", "-replace", "vm.nope"]);
    p.snap("plan_replace_unknown", code, &out, &err);
    assert_eq!(code, 1);
}

#[test]
fn destroy_target_takes_the_dependents_along() {
    let p = Project::new(TWO_TOML);
    p.with_ready(&dev());
    p.with_ready(&web());
    let before = std::fs::read(p.path("gpuprov.state.json")).unwrap();
    // No terminal and no -auto-approve: it stops at the question, after the list.
    let (code, out, err) = p.run(&["destroy", "-target", "vm.dev"]);
    p.snap("destroy_target", code, &out, &err);
    assert_eq!(code, 1);
    assert!(
        err.contains("- vm.web") && err.contains("- vm.dev"),
        "{err}"
    );
    let (code, _, err) = p.run(&["destroy", "-target", "vm.web"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("- vm.web") && !err.contains("- vm.dev"),
        "{err}"
    );
    assert_eq!(std::fs::read(p.path("gpuprov.state.json")).unwrap(), before);
}

/// A state written before records had `cloud_name` (the golden fixture) loads, and a
/// move adds the field while keeping every other one, unknown ones included.
#[test]
fn state_mv_of_a_fixture_state_without_cloud_names_keeps_everything_else() {
    let p = Project::new(DOCKER_TOML);
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/states/state_file.json");
    std::fs::copy(&fixture, p.path("gpuprov.state.json")).unwrap();
    let before = state_json(&p);
    let (code, _, err) = p.run(&["state", "mv", "vm.old", "vm.older"]);
    assert_eq!(code, 0, "{err}");
    let after = state_json(&p);
    assert_eq!(after["serial"], before["serial"].as_u64().unwrap() + 1);
    assert_eq!(
        after["from_a_newer_release"],
        before["from_a_newer_release"]
    );
    let (old, moved) = (
        &before["resources"]["vm.old"],
        &after["resources"]["vm.older"],
    );
    assert_eq!(moved["cloud_name"], "old");
    for key in ["machine", "desired", "from_a_newer_release"] {
        assert_eq!(moved[key], old[key], "{key}");
    }
    for untouched in ["vm.gpu-node", "vm.trainer"] {
        assert_eq!(
            after["resources"][untouched],
            before["resources"][untouched]
        );
        assert!(after["resources"][untouched].get("cloud_name").is_none());
    }
}

#[test]
fn state_rm_and_mv_respect_the_lock() {
    let p = Project::new(DOCKER_TOML);
    p.with_ready(&dev());
    let (lock, _) = gpuprov::state::StateLock::acquire(
        &p.path("gpuprov.state.json"),
        "apply",
        std::time::Duration::ZERO,
    )
    .unwrap();
    for args in [
        &["state", "rm", "-lock-timeout=1s", "vm.dev"][..],
        &["state", "mv", "vm.dev", "vm.gpu"][..],
    ] {
        let (code, _, err) = p.run(args);
        assert_eq!(code, 1, "{args:?}");
        assert!(err.contains(&lock.info().id), "{args:?}: {err}");
    }
    assert!(state_json(&p)["resources"].get("vm.dev").is_some());
    // -lock=false, as Terraform's: the user takes the risk.
    let (code, _, err) = p.run(&["state", "mv", "-lock=false", "vm.dev", "vm.gpu"]);
    assert_eq!(code, 0, "{err}");
    drop(lock);
}

/// Issue 18: `state recover` and `sweep` — their help, and the errors they give before
/// any cloud is asked (a malformed lineage, a state that records machines).
#[test]
fn state_recover_and_sweep_help_and_errors() {
    let p = Project::new(DOCKER_TOML);
    let (code, out, _) = p.run(&["state", "recover", "--help"]);
    assert_eq!(code, 0);
    p.snapshot("state_recover_help", &out);
    let (code, out, _) = p.run(&["sweep", "--help"]);
    assert_eq!(code, 0);
    p.snapshot("sweep_help", &out);

    let (code, out, err) = p.run(&["state", "recover", "--lineage", "not-a-uuid"]);
    assert_eq!(code, 1);
    p.snap("state_recover_bad_lineage", code, &out, &err);
    let (code, out, err) = p.run(&["sweep", "--destroy", "not-a-uuid"]);
    assert_eq!(code, 1);
    p.snap("sweep_bad_lineage", code, &out, &err);
    let (code, _, err) = p.run(&["sweep", "--auto-approve"]);
    assert_eq!(code, 1, "--auto-approve needs --destroy: {err}");
    assert!(err.contains("--destroy"), "{err}");

    // A state that records machines is never replaced by a recovery.
    p.with_ready(&dev());
    let before = std::fs::read(p.path("gpuprov.state.json")).unwrap();
    let (code, out, err) = p.run(&[
        "state",
        "recover",
        "--lineage",
        "11111111-1111-4111-8111-111111111111",
        "--auto-approve",
    ]);
    assert_eq!(code, 1);
    p.snap("state_recover_state_in_use", code, &out, &err);
    assert_eq!(
        std::fs::read(p.path("gpuprov.state.json")).unwrap(),
        before,
        "the state is untouched"
    );
}

/// Issue 18: `import` refuses what does not match the config before any cloud is asked,
/// and writes nothing.
#[test]
fn import_errors_name_the_config_and_write_nothing() {
    let p = Project::new(DOCKER_TOML);
    let (code, out, _) = p.run(&["import", "--help"]);
    assert_eq!(code, 0);
    p.snapshot("import_help", &out);
    for (name, args) in [
        (
            "import_unknown_machine",
            &["import", "vm.nope", "docker/local/abc"][..],
        ),
        ("import_malformed_id", &["import", "vm.dev", "abc"][..]),
        (
            "import_other_cloud",
            &["import", "vm.dev", "lambda/us-east-1/abc"][..],
        ),
        (
            "import_other_region",
            &["import", "vm.dev", "docker/elsewhere/abc"][..],
        ),
    ] {
        let (code, out, err) = p.run(args);
        assert_eq!(code, 1, "{name}");
        p.snap(name, code, &out, &err);
    }
    assert!(!p.path("gpuprov.state.json").exists());
}
