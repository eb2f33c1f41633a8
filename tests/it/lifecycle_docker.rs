//! Lifecycle on the real Docker test cloud, through the real binary (issue 18): discovery
//! by identity adopts what a stale state does not know, a lost state is reported by
//! lineage and rebuilt by `state recover`, and `sweep` lists and tears down exactly the
//! foreign lineage's objects.

use std::collections::HashMap;

use bollard::query_parameters::ListContainersOptionsBuilder;
use bollard::Docker;

use crate::docker_e2e::{containers, ensure_base_image, leftovers, skip, Project};
use crate::support::figures;

/// One row of RELIABILITY.md's "state lost / stale / foreign" table.
fn figure(name: &str, situation: &str, outcome: &str, before: usize, after: usize) {
    figures::write(
        &format!("lifecycle_{name}"),
        &serde_json::json!({
            "situation": situation,
            "outcome": outcome,
            "instances_before": before,
            "instances_after": after,
            "test": format!("tests/it/lifecycle_docker.rs::{name}"),
        }),
    );
}

/// Containers carrying `lineage` and VM name `vm` (any status).
async fn containers_of(lineage: &str, vm: &str) -> Vec<String> {
    let docker = Docker::connect_with_defaults().unwrap();
    let filters: HashMap<String, Vec<String>> = HashMap::from([(
        "label".to_string(),
        vec![
            format!("gpuprov-lineage={lineage}"),
            format!("gpuprov-vm-name={vm}"),
        ],
    )]);
    let opts = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    let mut ids: Vec<String> = docker
        .list_containers(Some(opts))
        .await
        .unwrap()
        .into_iter()
        .filter_map(|c| c.id)
        .collect();
    ids.sort();
    ids
}

/// Removes every container of a lineage when dropped: a test that loses its state must
/// not leave the lost state's containers behind.
struct Sweeper(String);

impl Drop for Sweeper {
    fn drop(&mut self) {
        let lineage = self.0.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let docker = Docker::connect_with_defaults().ok()?;
                for id in containers(&lineage).await {
                    let opts = bollard::query_parameters::RemoveContainerOptionsBuilder::default()
                        .force(true)
                        .v(true)
                        .build();
                    let _ = docker.remove_container(&id, Some(opts)).await;
                }
                Some(())
            })
        })
        .join();
    }
}

fn text(o: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn instance_of(p: &Project, address: &str) -> String {
    p.state()["resources"][address]["machine"]["state"]["vm"]["instance_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{address} is not up in {}", p.state()))
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stale_backup_adopts_the_machine_created_since() {
    if skip() {
        return;
    }
    ensure_base_image();
    let p = Project::new();
    assert!(p.run(&["apply", "--auto-approve"]).status.success());
    let lineage = p.lineage();
    let _sweeper = Sweeper(lineage.clone());
    let old = std::fs::read(p.state_path()).unwrap();
    let config = p.dir.path().join("gpuprov.toml");
    let mut toml = std::fs::read_to_string(&config).unwrap();
    toml.push_str("\n[vm.extra]\nregions = [\"local\"]\n");
    std::fs::write(&config, toml).unwrap();
    assert!(p.run(&["apply", "--auto-approve"]).status.success());
    let extra = containers_of(&lineage, "extra").await;
    assert_eq!(extra.len(), 1, "{extra:?}");

    // The state restored from before `extra` existed.
    std::fs::write(p.state_path(), old).unwrap();
    let out = p.run(&["plan", "-no-color"]);
    let (stdout, _) = text(&out);
    assert!(out.status.success());
    assert!(
        stdout.contains("# vm.extra will be adopted (found by identity)"),
        "{stdout}"
    );
    assert!(stdout.contains(&extra[0]), "{stdout}");
    assert!(
        stdout.contains("Plan: 0 to add, 1 to change, 0 to destroy."),
        "{stdout}"
    );

    let out = p.run(&["apply", "--auto-approve"]);
    assert!(out.status.success());
    assert_eq!(
        containers_of(&lineage, "extra").await,
        extra,
        "one instance, the same"
    );
    assert_eq!(instance_of(&p, "vm.extra"), extra[0]);
    let out = p.run(&["plan", "-detailed-exitcode"]);
    assert_eq!(out.status.code(), Some(0), "no changes after the adoption");
    figure(
        "a_stale_backup_adopts_the_machine_created_since",
        "stale: state restored from before a machine was created (same lineage)",
        "plan shows it found; apply adopts it (same instance id)",
        extra.len(),
        containers_of(&lineage, "extra").await.len(),
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_state_is_named_by_lineage_and_recovered() {
    if skip() {
        return;
    }
    ensure_base_image();
    let p = Project::new();
    assert!(p.run(&["apply", "--auto-approve"]).status.success());
    let lineage = p.lineage();
    let _sweeper = Sweeper(lineage.clone());
    let dev = containers_of(&lineage, "dev").await;
    assert_eq!(dev.len(), 1);

    // The state is lost.
    std::fs::remove_file(p.state_path()).unwrap();
    let _ = std::fs::remove_file(p.dir.path().join("gpuprov.state.json.backup"));
    let out = p.run(&["plan"]);
    let (stdout, _) = text(&out);
    assert!(out.status.success());
    assert!(
        stdout.contains("machines with this configuration's names are running under another state"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("gpuprov state recover --lineage {lineage}")),
        "{stdout}"
    );
    assert!(stdout.contains(&dev[0]), "{stdout}");

    let out = p.run(&["state", "recover", "--lineage", &lineage, "--auto-approve"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("pinned (trust on first use)"), "{stdout}");
    assert_eq!(p.lineage(), lineage);
    assert_eq!(instance_of(&p, "vm.dev"), dev[0]);
    assert_eq!(containers_of(&lineage, "dev").await, dev);
    let out = p.run(&["ssh", "dev", "--", "true"]);
    assert!(
        out.status.success(),
        "ssh works with the re-pinned host key"
    );
    let out = p.run(&["plan", "-detailed-exitcode"]);
    assert_eq!(out.status.code(), Some(0), "no changes after the recovery");

    // A second recover refuses: the state records machines now.
    let out = p.run(&["state", "recover", "--lineage", &lineage, "--auto-approve"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains("gpuprov::recover::state_in_use"),
        "{stderr}"
    );
    figure(
        "a_lost_state_is_named_by_lineage_and_recovered",
        "lost: state file deleted",
        "plan names lineage L and `state recover --lineage L`; recover rebuilds the state, host key re-pinned (TOFU), ssh works",
        dev.len(),
        containers_of(&lineage, "dev").await.len(),
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sweep_lists_a_foreign_lineage_and_destroys_only_it() {
    if skip() {
        return;
    }
    ensure_base_image();
    let a = Project::new();
    let b = Project::new();
    assert!(a.run(&["apply", "--auto-approve"]).status.success());
    assert!(b.run(&["apply", "--auto-approve"]).status.success());
    let (la, lb) = (a.lineage(), b.lineage());
    let _sweepers = (Sweeper(la.clone()), Sweeper(lb.clone()));
    let ours = containers_of(&la, "dev").await;

    let out = a.run(&["sweep"]);
    let (stdout, _) = text(&out);
    assert!(out.status.success());
    assert!(
        stdout.contains(&format!("lineage {lb}: 1 instance(s)")),
        "{stdout}"
    );
    assert!(
        !stdout.contains(&la),
        "a's own recorded machine is known: {stdout}"
    );
    let out = a.run(&["sweep", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let lineages: Vec<&str> = json["lineages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l["lineage"].as_str())
        .collect();
    assert!(lineages.contains(&lb.as_str()), "{json}");
    assert!(!lineages.contains(&la.as_str()), "{json}");

    let out = a.run(&["sweep", "--destroy", &lb, "--auto-approve"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert_eq!(
        leftovers(&lb).await,
        (0, 0, 0),
        "b's container, network, volume gone"
    );
    assert_eq!(
        containers_of(&la, "dev").await,
        ours,
        "a's machine untouched"
    );
    let out = a.run(&["sweep", "--destroy", &lb, "--auto-approve"]);
    assert_eq!(out.status.code(), Some(1), "nothing left of that lineage");
    figure(
        "sweep_lists_a_foreign_lineage_and_destroys_only_it",
        "foreign: another state's machine of the same name",
        "never adopted; sweep lists it, sweep --destroy removes it and nothing else (own machine kept)",
        1,
        containers(&lb).await.len(),
    );
}

/// `import` of a container created outside gpuprov (the base image running sshd without
/// the project key): recorded as found, renamed to the machine's container name (the Engine
/// cannot relabel), listed by `plan` as a machine apply takes over, and removed by
/// `destroy`; a second import into the same address, an unknown id and a foreign cloud are
/// refused without touching the state.
#[tokio::test(flavor = "multi_thread")]
async fn import_adopts_a_container_made_outside_gpuprov_and_destroy_removes_it() {
    if skip() {
        return;
    }
    ensure_base_image();
    let p = Project::new();
    let docker = Docker::connect_with_defaults().unwrap();
    let name = format!("outside-{}", uuid::Uuid::new_v4().simple());
    let body = bollard::models::ContainerCreateBody {
        image: Some("gpuprov/debian-sshd-base:bookworm".into()),
        cmd: Some(vec!["sleep".into(), "infinity".into()]),
        ..Default::default()
    };
    let created = docker
        .create_container(
            Some(
                bollard::query_parameters::CreateContainerOptionsBuilder::default()
                    .name(&name)
                    .build(),
            ),
            body,
        )
        .await
        .unwrap();
    /// Removes the outside container if the test fails before destroy does.
    struct Remove(String);
    impl Drop for Remove {
        fn drop(&mut self) {
            let id = self.0.clone();
            let _ = std::thread::spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .ok()?
                    .block_on(async {
                        let d = Docker::connect_with_defaults().ok()?;
                        let o = bollard::query_parameters::RemoveContainerOptionsBuilder::default()
                            .force(true)
                            .build();
                        d.remove_container(&id, Some(o)).await.ok()
                    })
            })
            .join();
        }
    }
    let _remove = Remove(created.id.clone());
    docker
        .start_container(
            &created.id,
            None::<bollard::query_parameters::StartContainerOptions>,
        )
        .await
        .unwrap();

    let (code_unknown, code_cloud) = (
        p.run(&["import", "vm.dev", "docker/local/0000000000000000"])
            .status
            .code(),
        p.run(&[
            "import",
            "vm.dev",
            &format!("lambda/us-east-1/{}", created.id),
        ])
        .status
        .code(),
    );
    assert_eq!((code_unknown, code_cloud), (Some(1), Some(1)));
    assert!(!p.state_path().exists(), "refusals write no state");

    let short = &created.id[..12];
    let out = p.run(&["import", "vm.dev", &format!("docker/local/{short}")]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("renamed to gpuprov-dev-"), "{stdout}");
    let rec = &p.state()["resources"]["vm.dev"]["machine"]["state"];
    assert_eq!(rec["state"], "unowned", "{rec}");
    assert_eq!(rec["instance_ids"][0], created.id.as_str(), "{rec}");
    let out = p.run(&["plan", "-no-color"]);
    let (stdout, _) = text(&out);
    assert!(stdout.contains("# vm.dev will be resumed"), "{stdout}");
    assert!(
        stdout.contains("Plan: 0 to add, 1 to change, 0 to destroy."),
        "{stdout}"
    );
    let out = p.run(&["import", "vm.dev", &format!("docker/local/{short}")]);
    assert_eq!(out.status.code(), Some(1), "already in the state");

    let out = p.run(&["destroy", "--auto-approve"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let gone = docker
        .inspect_container(
            &created.id,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .is_err();
    assert!(gone, "destroy removed the imported container");
    assert!(p.state()["resources"].as_object().unwrap().is_empty());
    figure(
        "import_adopts_a_container_made_outside_gpuprov_and_destroy_removes_it",
        "outside: an instance created outside gpuprov",
        "import records it as found (renamed: Docker cannot relabel); destroy removes it",
        1,
        usize::from(!gone),
    );
}

/// `state rm` forgets a machine without destroying it; `sweep` then lists it as this
/// state's unrecorded machine, and a plan that still configures it adopts it back instead
/// of creating a second one.
#[tokio::test(flavor = "multi_thread")]
async fn a_forgotten_machine_is_swept_or_adopted_back() {
    if skip() {
        return;
    }
    ensure_base_image();
    let p = Project::new();
    assert!(p.run(&["apply", "--auto-approve"]).status.success());
    let lineage = p.lineage();
    let _sweeper = Sweeper(lineage.clone());
    let dev = containers_of(&lineage, "dev").await;
    let out = p.run(&["state", "rm", "vm.dev"]);
    assert!(out.status.success());
    let out = p.run(&["sweep"]);
    let (stdout, _) = text(&out);
    assert!(
        stdout.contains(&format!("lineage {lineage} (this state's, not recorded)")),
        "{stdout}"
    );
    assert!(stdout.contains(&dev[0][..12]), "{stdout}");
    let out = p.run(&["plan", "-no-color"]);
    let (stdout, _) = text(&out);
    assert!(
        stdout.contains("# vm.dev will be adopted (found by identity)"),
        "{stdout}"
    );
    assert!(p.run(&["apply", "--auto-approve"]).status.success());
    assert_eq!(
        containers_of(&lineage, "dev").await,
        dev,
        "adopted, not duplicated"
    );
}
