//! [`Scenario::StateLostRecoverThenDestroy`] (issue 34, "What it must show"): losing the
//! state leaks nothing. The real binary applies `vm.trainer` on the driver's cloud (the
//! engine, a state file, and every side resource the cloud makes: key, firewall,
//! security group, environment…), the state file and its journal are deleted, `state
//! recover --lineage L` rebuilds the state from what the cloud reports under the lost
//! lineage, and `destroy` then leaves the cloud with no instance and no side resource of
//! ours, by the vendor server's own records ([`Cloud::side_resources`]).
//!
//! The binary reaches the cloud as a user's would: the endpoint and credential variables
//! of [`Cloud::cli`]. Only its SSH logins are scripted (`GPUPROV_FAKE_SSH=1`, a
//! test-doubles build): the addresses the vendor servers hand out are never dialed.

use std::path::{Path, PathBuf};
use std::process::Output;

use gpuprov::config::VmSpec;
use gpuprov::state::StateStore;

use super::{Driver, Scenario, World};

/// How the real binary reaches a driver's cloud.
pub struct CliCloud {
    /// Environment variables (name, value): the endpoint override and the credential, as
    /// a user sets them.
    pub env: Vec<(String, String)>,
    /// TOML appended to the config (a `[cloud.NAME]` section the cloud needs), or empty.
    pub config: String,
}

/// The config of a project whose one machine is `vm` in `region`, k3s off.
fn config_toml(vm: &VmSpec, region: &str, extra: &str) -> String {
    let clouds: Vec<String> = vm
        .clouds
        .iter()
        .map(|c| format!("\"{}\"", c.as_str()))
        .collect();
    let mut t = format!(
        "[vm.{}]\nclouds = [{}]\nregions = [\"{region}\"]\nkubernetes = false\n",
        vm.name,
        clouds.join(", ")
    );
    if let Some(gpu) = &vm.gpu {
        t.push_str(&format!("gpu = \"{gpu}\"\ngpu_count = {}\n", vm.gpu_count));
    }
    t.push('\n');
    t.push_str(extra);
    t
}

/// Runs `gpuprov args` in `dir` with a cleared environment: `env`, the project's own
/// homes, and fake SSH logins (off the runtime that serves the vendor APIs).
async fn gpuprov(dir: &Path, env: &[(String, String)], args: &[&str]) -> Output {
    let dir = dir.to_path_buf();
    let env = env.to_vec();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let mut cmd = assert_cmd::Command::cargo_bin("gpuprov").unwrap();
        cmd.current_dir(&dir)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", dir.join("home"))
            .env("GPUPROV_HOME", dir.join("gpuprov-home"))
            .env("NO_COLOR", "1")
            .env("GPUPROV_FAKE_SSH", "1")
            .envs(env)
            .args(&args)
            .timeout(std::time::Duration::from_secs(150));
        cmd.output().unwrap()
    })
    .await
    .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "--- stdout\n{}\n--- stderr\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The state file and everything beside it that carries it (journal, backup).
fn state_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("gpuprov.state.json"))
        })
        .collect()
}

/// The machines the state at `dir` records (address → owned instance ids), its shared
/// objects' addresses, and its lineage.
/// A state's machines (address, instance ids), shared objects' addresses and lineage.
type Recorded = (Vec<(String, Vec<String>)>, Vec<String>, String);

fn recorded(dir: &Path) -> Recorded {
    let (_, state) = StateStore::open(dir.join("gpuprov.state.json")).unwrap();
    let machines = state
        .resources
        .iter()
        .map(|(a, r)| {
            let ids = r
                .machine
                .owned()
                .ok()
                .flatten()
                .map(|o| o.instance_ids)
                .unwrap_or_default();
            (a.clone(), ids)
        })
        .collect();
    (
        machines,
        state.shared.keys().cloned().collect(),
        state.lineage,
    )
}

/// [`Scenario::StateLostRecoverThenDestroy`] on `d`'s cloud.
pub(super) async fn state_lost_scenario(d: &dyn Driver, s: Scenario) {
    let name = d.name();
    let [r0, _] = d.regions();
    let cloud = d
        .start(World {
            capacity_in: vec![r0],
            ..World::default()
        })
        .await;
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    std::fs::create_dir_all(dir.join("home")).unwrap();
    let cli = cloud
        .cli(dir)
        .unwrap_or_else(|| panic!("{name}: the driver says how the binary reaches it"));
    std::fs::write(
        dir.join("gpuprov.toml"),
        config_toml(&cloud.vm(), r0, &cli.config),
    )
    .unwrap();
    assert_eq!(cloud.side_resources(), 0, "{name}: a fresh cloud");
    // The project's state starts empty under the cloud's lineage (a cloud shared by
    // parallel tests gives each run its own; its sweeps read that lineage).
    let (mut store, mut state) = StateStore::open(dir.join("gpuprov.state.json")).unwrap();
    state.lineage = cloud.lineage().to_string();
    store.save(&mut state).unwrap();
    drop(store);
    let secret_free = |out: &Output| {
        if let Some(secret) = cloud.secret() {
            assert!(!text(out).contains(secret), "{name}: {}", text(out));
        }
    };

    // Apply: one machine up, with what the cloud makes beside it.
    let out = gpuprov(dir, &cli.env, &["apply", "--auto-approve"]).await;
    assert!(out.status.success(), "{name}: apply: {}", text(&out));
    secret_free(&out);
    assert_eq!(cloud.instances(), 1, "{name}: {}", text(&out));
    let (machines, shared, lineage) = recorded(dir);
    assert_eq!(machines.len(), 1, "{name}: {machines:?}");
    let (address, ids) = machines[0].clone();
    assert_eq!(address, "vm.trainer", "{name}");
    assert_eq!(lineage, cloud.lineage(), "{name}");
    assert_eq!(ids.len(), 1, "{name}: {ids:?}");
    eprintln!(
        "{name}: applied {ids:?} under {lineage}; shared objects {shared:?}; {} side \
         resource(s) on the cloud",
        cloud.side_resources()
    );

    // The state is lost: the file, its journal, any copy beside it.
    for f in state_files(dir) {
        std::fs::remove_file(&f).unwrap();
    }
    assert!(state_files(dir).is_empty(), "{name}");

    // Recover adopts the same instance under the lost lineage.
    let out = gpuprov(
        dir,
        &cli.env,
        &["state", "recover", "--lineage", &lineage, "--auto-approve"],
    )
    .await;
    assert!(out.status.success(), "{name}: recover: {}", text(&out));
    secret_free(&out);
    let (again, _, recovered_lineage) = recorded(dir);
    assert_eq!(recovered_lineage, lineage, "{name}");
    assert_eq!(again, machines, "{name}: the same machine: {}", text(&out));
    // Nothing created: still the one instance (the Docker driver counts only its own
    // adapter's creates, so the instance count says it for every cloud).
    assert_eq!(
        cloud.instances(),
        1,
        "{name}: nothing created: {}",
        text(&out)
    );

    // Destroy leaves nothing: no instance, no side resource, an empty state.
    let out = gpuprov(dir, &cli.env, &["destroy", "--auto-approve"]).await;
    let said = text(&out);
    assert!(out.status.success(), "{name}: destroy: {said}");
    assert!(!said.contains("LEAKED"), "{name}: {said}");
    secret_free(&out);
    assert_eq!(cloud.instances(), 0, "{name}: instances left: {said}");
    assert_eq!(
        cloud.side_resources(),
        0,
        "{name}: side resources left: {said}"
    );
    let (left, shared_left, _) = recorded(dir);
    assert!(left.is_empty(), "{name}: {left:?}");
    assert!(shared_left.is_empty(), "{name}: {shared_left:?}");
    cloud.check_after(s);
    cloud.verify();
}
