//! The CLI's k3s side: `--k8s` / `--no-k8s`, `gpuprov kubeconfig`, `gpuprov tunnel`, and
//! how `status` and `list` show a k3s record. No cloud is called: states are written
//! directly, as a finished apply leaves them.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use gpuprov::cluster::k3s::{AccessRecord, ClusterRecord, K3sState};
use gpuprov::cluster::kubeconfig::Kubeconfig;
use gpuprov::provider::SshEndpoint;
use gpuprov::ssh::HostKey;
use gpuprov::state::{MachineRecord, ResourceRecord, StateStore};
use gpuprov::vm::{LaunchState, VmRecord};

const DOCKER_TOML: &str = "[defaults]\nclouds = [\"docker\"]\n\n[vm.dev]\nregions = [\"local\"]\n";

/// A kubeconfig as gpuprov writes it for VM `dev` (no real key: a marked placeholder).
const DEV_KUBECONFIG: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: gpuprov-dev\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority-data: VEVTVCBDQQ==\ncontexts:\n- name: gpuprov-dev\n  context:\n    cluster: gpuprov-dev\n    user: gpuprov-dev\nusers:\n- name: gpuprov-dev\n  user:\n    client-certificate-data: VEVTVCBDRVJU\n    client-key-data: VEVTVCBLRVk=\ncurrent-context: gpuprov-dev\n";

struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    fn new(config: &str) -> Project {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("gpuprov.toml"), config).unwrap();
        Project { dir }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn run(&self, args: &[&str]) -> (i32, String, String) {
        self.run_with(args, None)
    }

    /// As `run`, with `KUBECONFIG` set to `kubeconfig` (unset when `None`).
    fn run_with(&self, args: &[&str], kubeconfig: Option<&str>) -> (i32, String, String) {
        let mut c = Command::cargo_bin("gpuprov").unwrap();
        c.current_dir(self.dir.path())
            .env("GPUPROV_HOME", self.path("home"))
            .env("HOME", self.path("home"))
            .env("NO_COLOR", "1")
            .env_remove("GPUPROV_CONFIG")
            .env_remove("GPUPROV_STATE")
            .env_remove("KUBECONFIG");
        if let Some(k) = kubeconfig {
            c.env("KUBECONFIG", k);
        }
        let out = c.args(args).output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Writes a state where `vm.dev` is recorded as `kind` / `state`.
    fn with_record(&self, kind: &str, state: serde_json::Value, label: &str) {
        let (mut store, mut st) = StateStore::open(self.path("gpuprov.state.json")).unwrap();
        st.lineage = "00000000-0000-4000-8000-000000000000".into();
        let rec = ResourceRecord::new(MachineRecord {
            kind: kind.into(),
            state: state.into(),
            label: label.into(),
            updated_at: chrono::Utc::now(),
        });
        st.resources.insert("vm.dev".into(), rec);
        store.save(&mut st).unwrap();
    }

    /// A k3s record of `vm.dev` that is ready, its kubeconfig where apply writes it
    /// (`$GPUPROV_HOME/projects/<lineage>/kube/dev.yaml`).
    fn with_cluster(&self, access: AccessRecord) -> PathBuf {
        let kube = self.path("home/projects/00000000-0000-4000-8000-000000000000/kube/dev.yaml");
        std::fs::create_dir_all(kube.parent().unwrap()).unwrap();
        std::fs::write(&kube, DEV_KUBECONFIG).unwrap();
        let s = K3sState::Ready {
            vm: Box::new(vm()),
            cluster: Some(ClusterRecord {
                access,
                kubeconfig: kube.clone(),
                allocatable_gpus: 0,
                kubelet_version: Some("v1.31.4+k3s1".into()),
            }),
        };
        self.with_record(
            "k3s",
            serde_json::to_value(&s).unwrap(),
            "ready c0ffee, k3s via gpuprov tunnel",
        );
        kube
    }
}

fn vm() -> VmRecord {
    let offer = crate::support::docker_offer();
    VmRecord {
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
        ready_at: chrono::Utc::now(),
        preemptions: vec![],
    }
}

#[test]
fn k8s_flag_on_a_cloud_without_k3s_is_rejected_up_front_and_no_k8s_silences_the_note() {
    let p = Project::new(DOCKER_TOML);
    let (code, _, err) = p.run(&["plan", "--refresh=false", "--k8s"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("kubernetes = true"), "{err}");
    assert!(err.contains("can host k3s"), "{err}");
    assert!(err.contains("--k8s"), "the help names the flag: {err}");

    let (code, out, err) = p.run(&["plan", "--refresh=false", "--no-k8s"]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("kubernetes skipped"), "{err}");
    assert!(out.contains("kubernetes") && out.contains("false"), "{out}");

    let (code, _, err) = p.run(&["plan", "--k8s", "--no-k8s"]);
    // A usage error exits 1 (issue 19): 2 is --detailed-exitcode's "changes present".
    assert_eq!(code, 1, "clap refuses both: {err}");
    assert!(err.contains("cannot be used with"), "{err}");
}

#[test]
fn a_saved_plan_cannot_be_changed_by_k8s_flags() {
    let p = Project::new(DOCKER_TOML);
    let (code, _, err) = p.run(&["plan", "--refresh=false", "-out", "p.json"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = p.run(&["apply", "p.json", "--no-k8s", "--auto-approve"]);
    assert_eq!(code, 1);
    assert!(err.contains("cannot change a saved plan"), "{err}");
}

#[test]
fn kubeconfig_prints_gives_the_path_and_merges_without_losing_entries() {
    let p = Project::new(DOCKER_TOML);
    let kube = p.with_cluster(AccessRecord::SshTunnel { local_port: 6443 });

    let (code, out, err) = p.run(&["kubeconfig", "dev"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, DEV_KUBECONFIG);
    let (code, out, _) = p.run(&["kubeconfig", "dev", "--path"]);
    assert_eq!(code, 0);
    assert_eq!(Path::new(out.trim()), kube);

    // Merge into a kubeconfig that has another cluster: it stays, and its context stays
    // current unless --use-context.
    let mine = p.path("mine.yaml");
    std::fs::write(
        &mine,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: prod\n  cluster:\n    server: https://prod.example:6443\ncontexts:\n- name: prod\n  context:\n    cluster: prod\n    user: prod\nusers:\n- name: prod\n  user:\n    token: t\ncurrent-context: prod\npreferences: {}\n",
    )
    .unwrap();
    let m = mine.to_str().unwrap();
    let (code, _, err) = p.run(&["kubeconfig", "dev", "--merge", "--kubeconfig", m]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("gpuprov tunnel dev"),
        "tunnel access is pointed out: {err}"
    );
    let kc = Kubeconfig::parse(&std::fs::read_to_string(&mine).unwrap()).unwrap();
    let names: Vec<&str> = kc.contexts.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["prod", "gpuprov-dev"]);
    assert_eq!(kc.current_context.as_deref(), Some("prod"));
    assert!(kc.other.contains_key("preferences"), "unknown keys kept");
    let (code, _, _) = p.run(&[
        "kubeconfig",
        "dev",
        "--merge",
        "--use-context",
        "--kubeconfig",
        m,
    ]);
    assert_eq!(code, 0);
    let kc = Kubeconfig::parse(&std::fs::read_to_string(&mine).unwrap()).unwrap();
    assert_eq!(
        kc.contexts.len(),
        2,
        "merged twice, entries replaced not duplicated"
    );
    assert_eq!(kc.current_context.as_deref(), Some("gpuprov-dev"));

    // The default target is ~/.kube/config (HOME is the test's), created when missing.
    let (code, _, err) = p.run(&["kubeconfig", "dev", "--merge"]);
    assert_eq!(code, 0, "{err}");
    let home_cfg = p.path("home/.kube/config");
    let kc = Kubeconfig::parse(&std::fs::read_to_string(&home_cfg).unwrap()).unwrap();
    assert_eq!(kc.contexts[0].name, "gpuprov-dev");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&home_cfg).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "it holds a client key");
    }

    // A kubeconfig that does not parse is reported and left as it was.
    let broken = p.path("broken.yaml");
    std::fs::write(&broken, "clusters: [unclosed\n").unwrap();
    let (code, _, err) = p.run(&[
        "kubeconfig",
        "dev",
        "--merge",
        "--kubeconfig",
        broken.to_str().unwrap(),
    ]);
    assert_eq!(code, 1);
    let flat = err.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains("was not modified"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&broken).unwrap(),
        "clusters: [unclosed\n"
    );
}

#[test]
fn kubeconfig_and_tunnel_refuse_machines_that_are_not_ready_clusters() {
    let p = Project::new(DOCKER_TOML);
    let (code, _, err) = p.run(&["kubeconfig", "nope"]);
    assert_eq!(code, 1);
    assert!(err.contains("no machine named \"nope\""), "{err}");

    // A plain VM.
    p.with_record(
        "launch",
        serde_json::to_value(LaunchState::Ready { vm: Box::new(vm()) }).unwrap(),
        "ready c0ffee",
    );
    for cmd in ["kubeconfig", "tunnel"] {
        let (code, _, err) = p.run(&[cmd, "dev"]);
        assert_eq!(code, 1, "{cmd}");
        assert!(err.contains("is not a k3s cluster"), "{cmd}: {err}");
        assert!(err.contains("--k8s"), "{cmd}: {err}");
    }

    // A cluster whose install failed: status shows the stage, kubeconfig says so.
    let failed = K3sState::Failed {
        stage: "installing".into(),
        reason: "the installer exited 1".into(),
        vm: Some(Box::new(vm())),
        launch: None,
    };
    p.with_record(
        "k3s",
        serde_json::to_value(&failed).unwrap(),
        "k3s failed at installing: the installer exited 1 (VM c0ffee left up)",
    );
    let (code, _, err) = p.run(&["kubeconfig", "dev"]);
    assert_eq!(code, 1);
    assert!(err.contains("is not ready"), "{err}");
    assert!(err.contains("left up"), "{err}");
    let (code, out, err) = p.run(&["status", "--refresh=false"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("k3s:failed"), "{out}");
    assert!(
        out.contains("root@127.0.0.1:32768"),
        "the VM is shown: {out}"
    );
    let (_, out, _) = p.run(&["plan", "--refresh=false", "--no-k8s"]);
    assert!(
        out.contains("resumes on the same VM") || out.contains("resume"),
        "{out}"
    );
}

#[test]
fn tunnel_to_a_machine_that_does_not_answer_fails_with_a_diagnostic() {
    let p = Project::new(DOCKER_TOML);
    // Port 1 on loopback: nothing listens, ssh fails at once.
    let kube = p.with_cluster(AccessRecord::SshTunnel { local_port: 6443 });
    assert!(kube.exists());
    let st = std::fs::read_to_string(p.path("gpuprov.state.json")).unwrap();
    std::fs::write(
        p.path("gpuprov.state.json"),
        st.replace("\"port\": 32768", "\"port\": 1"),
    )
    .unwrap();
    // This machine has no key for the project's machines: said so, none generated.
    let key_dir = p.path("home/projects/00000000-0000-4000-8000-000000000000");
    let (code, _, err) = p.run(&["tunnel", "dev", "--port", "0"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("GPUPROV_SSH_PRIVATE_KEY"), "{err}");
    assert!(!key_dir.join("id_ed25519").exists());
    gpuprov::ssh::ensure_project_key(&key_dir, "gpuprov-test").unwrap();
    let (code, _, err) = p.run(&["tunnel", "dev", "--port", "0"]);
    assert_eq!(code, 1, "port 0 picks a free port, then ssh fails: {err}");
    let (code, _, err) = p.run(&["tunnel", "dev", "--port", "45871"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("dev") || err.contains("127.0.0.1"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// `DEV_KUBECONFIG` with another server: the same-named cluster of another project.
fn foreign() -> String {
    DEV_KUBECONFIG.replace("https://127.0.0.1:6443", "https://203.0.113.9:6443")
}

#[test]
fn destroy_removes_the_kubeconfig_and_only_this_clusters_merged_entries() {
    if std::env::var_os("GPUPROV_SKIP_DOCKER").is_some() {
        return;
    }
    // The recorded container no longer exists: Docker confirms it gone, so destroy
    // finishes and cleans up after the cluster.
    let p = Project::new(DOCKER_TOML);
    let kube = p.with_cluster(AccessRecord::Direct {
        host: "127.0.0.1".into(),
    });
    // KUBECONFIG chains two files: ours is merged into the first; the second holds
    // another project's cluster of the same name, which must survive.
    let mine = p.path("mine.yaml");
    let theirs = p.path("theirs.yaml");
    std::fs::write(&mine, "apiVersion: v1\nkind: Config\nclusters:\n- name: prod\n  cluster:\n    server: https://prod.example:6443\n").unwrap();
    std::fs::write(&theirs, foreign()).unwrap();
    let chain = format!("{}:{}", mine.display(), theirs.display());
    let (code, _, err) = p.run_with(&["kubeconfig", "dev", "--merge"], Some(&chain));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(&format!("into {}", mine.display())),
        "kubectl's choice: the first existing file: {err}"
    );

    let (code, _, err) = p.run_with(&["destroy", "--auto-approve"], Some(&chain));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(&format!(
            "removed context gpuprov-dev from {}",
            mine.display()
        )),
        "{err}"
    );
    assert!(!err.contains(&theirs.display().to_string()), "{err}");
    assert!(!kube.exists(), "gpuprov's copy is deleted");
    let kc = Kubeconfig::parse(&std::fs::read_to_string(&mine).unwrap()).unwrap();
    let names: Vec<&str> = kc.clusters.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["prod"], "only gpuprov's entries go");
    assert_eq!(
        std::fs::read_to_string(&theirs).unwrap(),
        foreign(),
        "another project's entry stays"
    );
}

#[test]
fn destroying_a_plain_machine_never_touches_kubeconfigs() {
    if std::env::var_os("GPUPROV_SKIP_DOCKER").is_some() {
        return;
    }
    let p = Project::new(DOCKER_TOML);
    p.with_record(
        "launch",
        serde_json::to_value(LaunchState::Ready { vm: Box::new(vm()) }).unwrap(),
        "ready c0ffee",
    );
    let cfg = p.path("home/.kube/config");
    std::fs::create_dir_all(cfg.parent().unwrap()).unwrap();
    std::fs::write(&cfg, DEV_KUBECONFIG).unwrap();
    let (code, _, err) = p.run(&["destroy", "--auto-approve"]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("removed context"), "{err}");
    assert_eq!(std::fs::read_to_string(&cfg).unwrap(), DEV_KUBECONFIG);
}

#[test]
fn merge_takes_kubectl_files_follows_symlinks_and_refuses_another_clusters_entry() {
    let p = Project::new(DOCKER_TOML);
    p.with_cluster(AccessRecord::Direct {
        host: "127.0.0.1".into(),
    });
    // What `kubectl config set-credentials u --token=t --kubeconfig F` writes.
    let k = p.path("kubectl.yaml");
    std::fs::write(&k, "apiVersion: v1\nclusters: null\ncontexts: null\ncurrent-context: \"\"\nkind: Config\npreferences: {}\nusers:\n- name: u\n  user:\n    token: t\n").unwrap();
    let (code, _, err) = p.run(&[
        "kubeconfig",
        "dev",
        "--merge",
        "--kubeconfig",
        k.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let kc = Kubeconfig::parse(&std::fs::read_to_string(&k).unwrap()).unwrap();
    assert_eq!(kc.users.len(), 2, "the token user is kept");

    // A symlinked kubeconfig (dotfile managers): the target changes, the link stays.
    let real = p.path("dotfiles/kc");
    std::fs::create_dir_all(real.parent().unwrap()).unwrap();
    std::fs::write(&real, "").unwrap();
    let link = p.path("kc.link");
    #[cfg(unix)]
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let (code, _, err) = p.run(&[
        "kubeconfig",
        "dev",
        "--merge",
        "--kubeconfig",
        link.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(std::fs::read_to_string(&real)
        .unwrap()
        .contains("gpuprov-dev"));

    // Another cluster under the same name: refused, file untouched.
    let other = p.path("other.yaml");
    std::fs::write(&other, foreign()).unwrap();
    let (code, _, err) = p.run(&[
        "kubeconfig",
        "dev",
        "--merge",
        "--kubeconfig",
        other.to_str().unwrap(),
    ]);
    assert_eq!(code, 1);
    let flat = err.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains("already has a cluster gpuprov-dev with another"),
        "{err}"
    );
    assert!(flat.contains("kubectl config delete-"), "{err}");
    assert_eq!(std::fs::read_to_string(&other).unwrap(), foreign());

    // --path refuses a kubeconfig that is gone instead of printing a dead path.
    std::fs::remove_file(
        p.path("home/projects/00000000-0000-4000-8000-000000000000/kube/dev.yaml"),
    )
    .unwrap();
    let (code, out, err) = p.run(&["kubeconfig", "dev", "--path"]);
    assert_eq!(code, 1, "{out}");
    let flat = err.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains("No such file"), "{err}");
}
