//! Every cloud the state records has its adapter (issue 34, item 5): a machine on Lambda
//! whose cloud no longer appears in the config is still torn down, by `apply` (its
//! `[vm.X]` removed), by `destroy` with a config that no longer names the cloud, and by
//! `destroy` with no config file at all (the state alone; the cloud's settings then come
//! from the environment). Each runs the real binary against the spec-checked local Lambda
//! API (`vendor::lambda`), pointed at it with `GPUPROV_LAMBDA_ENDPOINT` and
//! `LAMBDA_API_KEY`, and counts the instances left on the server.

use std::path::{Path, PathBuf};
use std::process::Output;

use gpuprov::config::Cloud;
use gpuprov::provider::{Location, Offer, SshEndpoint};
use gpuprov::ssh::HostKey;
use gpuprov::state::{MachineRecord, ResourceRecord, StateStore};
use gpuprov::vm::{LaunchState, VmRecord};
use serde_json::json;

use crate::support::drive::{self, LINEAGE};
use crate::vendor::lambda::{self as api, Cloud2, SENTINEL, TERMINATE};

/// The instance the state records, already up on the server.
const INSTANCE: &str = "000000000000000000000000000000a1";

/// The config once `[vm.trainer]` (on Lambda) was removed: only `vm.dev`, on Docker, is
/// left, so Lambda appears nowhere in it.
const NO_LAMBDA_TOML: &str =
    "[defaults]\nclouds = [\"docker\"]\nkubernetes = false\n\n[vm.dev]\nregions = [\"local\"]\n";

/// A project whose state records `vm.trainer` up on Lambda, and the Lambda server that
/// runs its instance.
struct Project {
    dir: tempfile::TempDir,
    cloud: Cloud2,
}

impl Project {
    /// The server with `vm.trainer`'s instance active in `us-east-1`, the state recording it
    /// ready (and `vm.dev` up on Docker when `with_dev`), and the project key in the
    /// per-project directory; `config` (if any) is written as `gpuprov.toml`.
    async fn start(config: Option<&str>, with_dev: bool) -> Project {
        let cloud = Cloud2::start(api::h100_world()).await;
        cloud.world.lock().unwrap().instances.push(json!({
            "id": INSTANCE,
            "name": "gpuprov-trainer-0f0e0d0c",
            "status": "active",
            "ip": "127.0.0.7",
            "ssh_key_names": ["gpuprov-key"],
            "file_system_names": [],
            "region": api::region("us-east-1"),
            "instance_type": api::type_json("gpu_8x_h100_sxm5", "H100 (80 GB SXM5)", 8, 2392),
            "actions": {
                "migrate": {"available": false},
                "rebuild": {"available": false},
                "restart": {"available": false},
                "cold_reboot": {"available": false},
                "terminate": {"available": true}
            },
            "tags": [
                {"key": "gpuprov-lineage", "value": LINEAGE},
                {"key": "gpuprov-vm-name", "value": "trainer"}
            ],
        }));
        let dir = tempfile::tempdir().unwrap();
        if let Some(text) = config {
            std::fs::write(dir.path().join("gpuprov.toml"), text).unwrap();
        }
        let (mut store, mut state) =
            StateStore::open(dir.path().join("gpuprov.state.json")).unwrap();
        state.lineage = LINEAGE.into();
        state
            .resources
            .insert("vm.trainer".into(), ready_on_lambda());
        if with_dev {
            state.resources.insert("vm.dev".into(), ready_on_docker());
        }
        store.save(&mut state).unwrap();
        gpuprov::ssh::ensure_project_key(
            &dir.path().join("home").join("projects").join(LINEAGE),
            "gpuprov-0f0e0d0c",
        )
        .unwrap();
        Project { dir, cloud }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// Runs the binary with `args` in the project directory (off the runtime that serves
    /// the API).
    async fn run(&self, args: &[&str]) -> Output {
        let dir = self.path();
        let uri = self.cloud.server.uri();
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        tokio::task::spawn_blocking(move || {
            assert_cmd::Command::cargo_bin("gpuprov")
                .unwrap()
                .current_dir(&dir)
                .env("GPUPROV_HOME", dir.join("home"))
                .env("NO_COLOR", "1")
                .env_remove("GPUPROV_CONFIG")
                .env_remove("GPUPROV_STATE")
                .env_remove("GPUPROV_SSH_KEY_FILE")
                .env_remove("GPUPROV_SSH_PRIVATE_KEY")
                .env_remove("GPUPROV_FAKE_CLOUD")
                .env_remove("GITHUB_STEP_SUMMARY")
                .env("GPUPROV_LAMBDA_ENDPOINT", &uri)
                .env("LAMBDA_API_KEY", SENTINEL)
                .args(&args)
                .timeout(std::time::Duration::from_secs(180))
                .output()
                .unwrap()
        })
        .await
        .unwrap()
    }

    /// The instances on the server that are neither terminated nor terminating.
    fn live_instances(&self) -> usize {
        let w = self.cloud.world.lock().unwrap();
        w.instances
            .iter()
            .filter(|i| i["status"] != "terminated" && i["status"] != "terminating")
            .count()
    }

    /// Asserts that `out` succeeded, terminated the recorded instance, left nothing
    /// running on the server and nothing in the state, and never showed the key.
    fn assert_torn_down(&self, out: &Output) {
        let text = format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!text.contains("LEAKED"), "{text}");
        assert!(out.status.success(), "{text}");
        assert_eq!(self.live_instances(), 0, "{text}");
        let terminated = self.cloud.server.requests_to("POST", TERMINATE);
        assert!(
            terminated
                .iter()
                .any(|r| r.body.as_ref().unwrap()["instance_ids"] == json!([INSTANCE])),
            "{text}"
        );
        let (_, state) = StateStore::open(self.dir.path().join("gpuprov.state.json")).unwrap();
        assert!(
            !state.resources.contains_key("vm.trainer"),
            "{:?}",
            state.resources.keys()
        );
        assert!(!text.contains(SENTINEL));
        self.cloud.server.verify();
    }
}

/// The record of `vm.trainer` up on Lambda at `INSTANCE`, applied with its config.
fn ready_on_lambda() -> ResourceRecord {
    let mut desired = drive::gpu_vm(Cloud::Lambda, "H100", 8);
    desired.regions = vec!["us-east-1".into()];
    ready_record(lambda_vm(), &desired)
}

/// The record of `vm.dev` up on Docker, applied with the config's settings (the plan
/// leaves it as it is).
fn ready_on_docker() -> ResourceRecord {
    let offer = crate::support::docker_offer();
    let mut vm = lambda_vm();
    vm.instance_id = "c0ffee".into();
    vm.location = offer.location.clone();
    vm.offer = offer;
    vm.user = "root".into();
    let mut desired = gpuprov::config::VmSpec::new("dev", vec![Cloud::Docker]);
    desired.regions = vec!["local".into()];
    desired.kubernetes = false;
    ready_record(vm, &desired)
}

/// A `launch` record of `vm` ready, applied with `desired`.
fn ready_record(vm: VmRecord, desired: &gpuprov::config::VmSpec) -> ResourceRecord {
    let at = vm.ready_at;
    let label = format!("ready {}", vm.instance_id);
    let s = LaunchState::Ready { vm: Box::new(vm) };
    let mut rec = ResourceRecord::new(MachineRecord {
        kind: "launch".into(),
        state: gpuprov::state::JsonText::encode(&s).unwrap(),
        label,
        updated_at: at,
    });
    rec.desired = Some(gpuprov::state::JsonText::encode(desired).unwrap());
    rec
}

/// `vm.trainer`'s machine on Lambda at `INSTANCE`.
fn lambda_vm() -> VmRecord {
    let location = Location {
        cloud: "lambda".into(),
        region: "us-east-1".into(),
        zone: None,
    };
    let offer = Offer {
        id: "lambda/us-east-1/gpu_8x_h100_sxm5".into(),
        location: location.clone(),
        instance_type: "gpu_8x_h100_sxm5".into(),
        gpu: Some("H100".into()),
        gpu_count: 8,
        spot: false,
        price_per_hour: 23.92,
        detail: serde_json::Value::Null,
        facts: Default::default(),
    };
    let at = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
        .unwrap()
        .into();
    VmRecord {
        instance_id: INSTANCE.into(),
        location,
        offer,
        ssh: SshEndpoint {
            host: "127.0.0.7".into(),
            port: 22,
            user: Some("ubuntu".into()),
        },
        user: "ubuntu".into(),
        host_key: HostKey {
            algorithm: "ssh-ed25519".into(),
            key_base64: "AAAA".into(),
            fingerprint: "SHA256:x".into(),
        },
        ready_at: at,
        preemptions: vec![],
    }
}

fn exists(dir: &Path, name: &str) -> bool {
    dir.join(name).exists()
}

/// `apply` after `[vm.trainer]` left the config: the plan destroys it and the run has
/// Lambda's adapter for it. `vm.dev` stays as it is (no refresh: no Docker is needed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_destroys_a_machine_whose_cloud_left_the_config() {
    let p = Project::start(Some(NO_LAMBDA_TOML), true).await;
    assert_eq!(p.live_instances(), 1);
    let out = p.run(&["apply", "--auto-approve", "--refresh=false"]).await;
    p.assert_torn_down(&out);
    let (_, state) = StateStore::open(p.path().join("gpuprov.state.json")).unwrap();
    assert!(state.resources.contains_key("vm.dev"), "left as it is");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_tears_down_a_cloud_the_config_no_longer_names() {
    let p = Project::start(Some(NO_LAMBDA_TOML), false).await;
    let out = p.run(&["destroy", "--auto-approve"]).await;
    p.assert_torn_down(&out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_without_a_config_tears_down_from_the_state_alone() {
    let p = Project::start(None, false).await;
    assert!(!exists(&p.path(), "gpuprov.toml"));
    let out = p.run(&["destroy", "--auto-approve"]).await;
    p.assert_torn_down(&out);
}
