//! State surgery and targeted changes on the Docker test cloud, through the real binary:
//! two machines applied; `state mv` and a `[[moved]]` block rename one and keep its
//! container; `-replace` replaces only the named machine; `-target` changes only the
//! named one; `state rm` forgets a machine whose container keeps running (removed here,
//! so nothing leaks); `destroy` removes the rest.

use bollard::Docker;

use crate::docker_e2e::{containers, ensure_base_image, leftovers, skip, Project};

const TWO: &str = "[defaults]\nclouds = [\"docker\"]\nregions = [\"local\"]\n\n[vm.a]\n\n[vm.b]\n";

impl Project {
    fn config(&self, text: &str) {
        std::fs::write(self.dir.path().join("gpuprov.toml"), text).unwrap();
    }
    /// The instance id the state records for `address`.
    fn instance(&self, address: &str) -> String {
        self.state()["resources"][address]["machine"]["state"]["vm"]["instance_id"]
            .as_str()
            .unwrap_or_else(|| panic!("{address} is not ready in {}", self.state()))
            .to_string()
    }
    /// Runs and returns (exit code, stdout + stderr).
    fn go(&self, args: &[&str]) -> (Option<i32>, String) {
        let out = self.run(args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    }
}

async fn running(id: &str) -> bool {
    let docker = Docker::connect_with_defaults().unwrap();
    docker
        .inspect_container(
            id,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .ok()
        .and_then(|c| c.state)
        .and_then(|s| s.running)
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_state_mv_moved_replace_target_and_state_rm() {
    if skip() {
        return;
    }
    ensure_base_image();
    let p = Project::new();
    p.config(TWO);
    let (code, out) = p.go(&["apply", "-auto-approve"]);
    assert_eq!(code, Some(0), "{out}");
    let lineage = p.lineage();
    assert_eq!(containers(&lineage).await.len(), 2);
    let (a, b) = (p.instance("vm.a"), p.instance("vm.b"));

    // state mv, with the config renamed alike: same container, nothing to do.
    let (code, out) = p.go(&["state", "mv", "vm.a", "vm.c"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(p.instance("vm.c"), a);
    assert_eq!(p.state()["resources"]["vm.c"]["cloud_name"], "a");
    p.config(&TWO.replace("[vm.a]", "[vm.c]"));
    let (code, out) = p.go(&["plan", "-detailed-exitcode"]);
    assert_eq!(
        code,
        Some(0),
        "refresh finds the container by its old name: {out}"
    );

    // A moved block: planned as a move, applied without touching the container.
    let moved = TWO.replace("[vm.a]", "[vm.d]") + "\n[[moved]]\nfrom = \"vm.c\"\nto = \"vm.d\"\n";
    p.config(&moved);
    let (code, out) = p.go(&["plan", "-detailed-exitcode"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("# vm.c has moved to vm.d"), "{out}");
    assert!(
        out.contains("Plan: 0 to add, 0 to change, 0 to destroy."),
        "{out}"
    );
    let (code, out) = p.go(&["apply", "-auto-approve"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(p.instance("vm.d"), a);
    assert!(p.state()["resources"].get("vm.c").is_none());
    let (code, out) = p.go(&["plan", "-detailed-exitcode"]);
    assert_eq!(
        code,
        Some(0),
        "a moved block already applied is ignored: {out}"
    );

    // -replace: only vm.d gets a new container, which carries its own name.
    let (code, out) = p.go(&["apply", "-auto-approve", "-replace", "vm.d"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("1 added, 0 changed, 1 destroyed"), "{out}");
    let d = p.instance("vm.d");
    assert_ne!(d, a);
    assert_eq!(p.instance("vm.b"), b);
    assert!(p.state()["resources"]["vm.d"].get("cloud_name").is_none());
    assert!(!running(&a).await, "the replaced container is gone");
    assert_eq!(containers(&lineage).await.len(), 2);

    // -target: both machines have an in-place change; only vm.b's is applied.
    p.config(&moved.replace("[defaults]\n", "[defaults]\nretry_until_up = true\n"));
    let (code, out) = p.go(&["apply", "-auto-approve", "-target=vm.b"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("Resource targeting is in effect"), "{out}");
    assert!(out.contains("0 added, 1 changed, 0 destroyed"), "{out}");
    let desired =
        |address: &str| p.state()["resources"][address]["desired"]["retry_until_up"].clone();
    assert_eq!(desired("vm.b"), true);
    assert_eq!(desired("vm.d"), false, "vm.d was not targeted");
    assert_eq!(
        (p.instance("vm.b"), p.instance("vm.d")),
        (b.clone(), d.clone())
    );

    // state rm: forgotten, not destroyed.
    let (code, out) = p.go(&["state", "rm", "vm.b"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(&format!("instance {b} at docker/local")),
        "{out}"
    );
    assert!(out.contains("keeps running and billing"), "{out}");
    assert!(p.state()["resources"].get("vm.b").is_none());
    assert!(running(&b).await, "state rm left the container running");
    // Nothing may leak: the forgotten container is removed here.
    let docker = Docker::connect_with_defaults().unwrap();
    let opts = bollard::query_parameters::RemoveContainerOptionsBuilder::default()
        .force(true)
        .v(true)
        .build();
    docker.remove_container(&b, Some(opts)).await.unwrap();

    let (code, out) = p.go(&["destroy", "-auto-approve"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        leftovers(&lineage).await,
        (0, 0, 0),
        "nothing left carrying the lineage"
    );
}
