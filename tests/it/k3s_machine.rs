//! The k3s machine (design 4.5) through every path of its diagram: the FakeProvider is
//! the cloud, a scripted node answers the SSH commands (probe, installer push, `/readyz`,
//! kubeconfig), and a local HTTPS server stands in for the Kubernetes API (`/readyz`,
//! nodes, kube-system pods) with a real CA, a serving certificate whose SANs the test
//! controls, and client-certificate authentication, so validation runs its real TLS and
//! HTTP code.

use crate::support::figures;
use crate::support::k3s as k3s_rig;

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuprov::cluster::k3s::{AccessRecord, K3sMachine, K3sState, K3sTimeouts};
use gpuprov::cluster::kubeconfig::Kubeconfig;
use gpuprov::cluster::probe::BootRoute;
use gpuprov::config::{Cloud, Config, VmSpec};
use gpuprov::engine::{Engine, K3sSetup, Outcome, StateJournal};
use gpuprov::machine::Providers;
use gpuprov::machine::{CancelToken, ExecError, Executor, MemoryJournal, RetryPolicy};
use gpuprov::plan::{self, Action};
use gpuprov::provider::doubles::fake::{FakeConnector, FakeProvider, Op};
use gpuprov::provider::{Capabilities, Feature};
use gpuprov::ssh::SshError;
use gpuprov::state::StateStore;
use gpuprov::vm::LaunchMachine;
use k3s_rig::{ApiServer, Node, Pki, StandIn};

const FAST: RetryPolicy = RetryPolicy {
    max_attempts: 3,
    initial_backoff: Duration::from_millis(1),
    max_backoff: Duration::from_millis(2),
};

/// A sentinel standing for the cluster's client key: it must reach the kubeconfig file
/// and nothing else.
const KEY_SENTINEL_NOTE: &str = "client-key-data";

// ---------------------------------------------------------------------------------------
// The harness

struct Rig {
    pki: Pki,
    cloud: Arc<FakeProvider>,
    node: Arc<Node>,
    api: ApiServer,
    connector: Arc<StandIn>,
    journal: Arc<MemoryJournal>,
    dir: tempfile::TempDir,
    timeouts: K3sTimeouts,
}

fn caps(features: &[Feature]) -> Capabilities {
    let mut c = FakeProvider::new("aws").capabilities_for_test();
    c.supported = features.to_vec();
    c
}

impl Rig {
    /// A cloud with `features`, a node, and an API whose certificate covers `sans`.
    async fn new(features: &[Feature], sans: &[&str]) -> Rig {
        let pki = Pki::new();
        let cloud = FakeProvider::new("aws")
            .with_offer("east-a", "us-east-1", "p5.48xlarge", 98.0)
            .with_capabilities(caps(features));
        let node = Node::new(&pki);
        let api = ApiServer::start(&pki, sans, 1).await;
        let connector = Arc::new(StandIn {
            port: api.port,
            opened: Mutex::new(vec![]),
        });
        Rig {
            pki,
            cloud: Arc::new(cloud),
            node,
            api,
            connector,
            journal: Arc::new(MemoryJournal::new()),
            dir: tempfile::tempdir().unwrap(),
            timeouts: K3sTimeouts {
                boot_install: Duration::from_secs(5),
                probe_interval: Duration::from_millis(2),
                install: Duration::from_secs(5),
                api: Duration::from_millis(300),
                validate: Duration::from_secs(3),
                api_poll: Duration::from_millis(2),
            },
        }
    }

    fn providers(&self) -> Providers {
        let mut p = Providers::new();
        p.insert(self.cloud.clone());
        p
    }

    fn machine(&self) -> K3sMachine {
        let mut launch = LaunchMachine::new(
            VmSpec::new("trainer", vec![Cloud::Aws]),
            "0f0e0d0c-lineage".into(),
            "ssh-ed25519 AAAAtest gpuprov".into(),
            self.providers(),
            Arc::new(FakeConnector::default()),
        );
        launch.retry = FAST;
        launch.teardown.retry = FAST;
        launch.vanish_grace = Some(Duration::from_millis(20));
        let mut m = K3sMachine::new(
            launch,
            self.node.clone(),
            self.connector.clone(),
            self.dir.path().join("kube"),
            Default::default(),
        );
        m.retry = FAST;
        m.timeouts = self.timeouts;
        m
    }

    async fn run(&self) -> Result<K3sState, ExecError> {
        self.run_with(CancelToken::new()).await
    }

    async fn run_with(&self, cancel: CancelToken) -> Result<K3sState, ExecError> {
        let ex = Executor::new(self.journal.clone(), cancel);
        let m = self.machine();
        let fut = ex.run(&m, "vm.trainer", |prev| {
            let owned = prev.and_then(|p| gpuprov::engine::owned_of(&p).ok().flatten());
            K3sState::start(owned)
        });
        tokio::time::timeout(Duration::from_secs(30), fut)
            .await
            .expect("the k3s machine must not hang")
    }

    fn labels(&self) -> Vec<String> {
        self.journal.history().into_iter().map(|(_, l)| l).collect()
    }

    /// The journalled k3s stages in order (the `k3s` tags), consecutive repeats folded.
    fn stages(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (key, _) in self.journal.history() {
            assert_eq!(key, "vm.trainer");
        }
        let rec = self.journal.get("vm.trainer").unwrap();
        assert_eq!(rec.kind, "k3s");
        for l in self.labels() {
            let stage = if l.starts_with("k3s: checking") {
                "checking_boot_install"
            } else if l.starts_with("k3s: installing") {
                "installing"
            } else if l.starts_with("k3s: waiting") {
                "awaiting_api"
            } else if l.starts_with("k3s: fetching") {
                "fetching_kubeconfig"
            } else if l.starts_with("k3s: validating") {
                "validating"
            } else if l.starts_with("k3s failed") {
                "failed"
            } else if l.starts_with("ready") && l.contains("k3s") {
                "ready"
            } else {
                "vm"
            };
            if out.last().map(String::as_str) != Some(stage) {
                out.push(stage.to_string());
            }
        }
        out
    }
}

fn ready_cluster(s: &K3sState) -> &gpuprov::cluster::k3s::ClusterRecord {
    match s {
        K3sState::Ready {
            cluster: Some(c), ..
        } => c,
        other => panic!("expected a ready cluster, got {other:?}"),
    }
}

const COVERS: &[&str] = &["127.0.0.1", "localhost"];

// ---------------------------------------------------------------------------------------
// The paths

#[tokio::test]
async fn installed_at_boot_goes_straight_to_the_api_and_writes_a_private_kubeconfig() {
    let r = Rig::new(
        &[Feature::BootScript, Feature::Kubernetes, Feature::Firewall],
        COVERS,
    )
    .await;
    r.node.installed_at_boot();
    let m = r.machine();
    // The installer rides the boot script, with the metadata lookup on; 6443 is opened.
    let boot = m.launch.boot_script.as_ref().expect("boot script set");
    assert!(boot.script.contains("k3s-install.status"));
    assert_eq!(boot.env["GPUPROV_TLS_SAN_FROM_METADATA"], "1");
    assert_eq!(
        boot.env["GPUPROV_GPU"], "auto",
        "gpu_count is not set: the GPU path runs if the machine has one"
    );
    assert!(m.launch.vm.ports.contains(&6443));

    let end = r.run().await.unwrap();
    let c = ready_cluster(&end);
    assert_eq!(
        r.stages(),
        [
            "vm",
            "checking_boot_install",
            "awaiting_api",
            "fetching_kubeconfig",
            "validating",
            "ready"
        ]
    );
    assert!(r.node.pushes().is_empty(), "nothing pushed over ssh");
    assert_eq!(
        c.access,
        AccessRecord::Direct {
            host: "127.0.0.1".into()
        },
        "the cloud opens ports: direct"
    );
    assert_eq!(c.allocatable_gpus, 1);
    // The kubeconfig: the VM's context, the server rewritten, mode 0600.
    let text = std::fs::read_to_string(&c.kubeconfig).unwrap();
    let kc = Kubeconfig::parse(&text).unwrap();
    assert_eq!(kc.current_context.as_deref(), Some("gpuprov-trainer"));
    assert_eq!(kc.clusters[0].cluster.server, "https://127.0.0.1:6443");
    assert!(text.contains(KEY_SENTINEL_NOTE));
    // Validation authenticated with k3s's own key form: SEC1, with a two-certificate chain.
    let user = serde_json::to_value(&kc.users[0].user).unwrap();
    let b64 = |f: &str| {
        use base64::Engine as _;
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(user[f].as_str().unwrap())
                .unwrap(),
        )
        .unwrap()
    };
    assert!(b64("client-key-data").starts_with("-----BEGIN EC PRIVATE KEY-----"));
    assert_eq!(
        b64("client-certificate-data")
            .matches("BEGIN CERTIFICATE")
            .count(),
        2
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&c.kubeconfig)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    // The journal never holds the client key; validation used the client certificate.
    let rec = serde_json::to_string(&r.journal.get("vm.trainer").unwrap().state).unwrap();
    assert!(!rec.contains(KEY_SENTINEL_NOTE) && !rec.contains("PRIVATE KEY"));
    let st = r.api.state.lock().unwrap();
    assert!(st.authed.iter().any(|p| p == "/readyz"));
    assert!(st.authed.iter().any(|p| p == "/api/v1/nodes"));
    assert!(st.authed.iter().any(|p| p.contains("k8s-app%3Dkube-dns")));
    assert!(
        st.anonymous >= 1,
        "the certificate is read without credentials"
    );
}

#[tokio::test]
async fn a_running_boot_install_is_waited_for() {
    let r = Rig::new(&[Feature::BootScript, Feature::Kubernetes], COVERS).await;
    {
        let mut s = r.node.st.lock().unwrap();
        s.marker = Some("state=running\nstep=k3s\n".into());
        s.cloud_init = Some("status: running".into());
    }
    // Finish the boot install after a few probes.
    let node = r.node.clone();
    let finisher = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(2)).await;
            let mut s = node.st.lock().unwrap();
            if s.probes >= 3 {
                s.marker = Some("state=done\n".into());
                s.cloud_init = Some("status: done".into());
                s.k3s_active = true;
                return;
            }
        }
    });
    let end = r.run().await.unwrap();
    finisher.await.unwrap();
    let c = ready_cluster(&end);
    assert!(r.node.st.lock().unwrap().probes >= 3);
    assert!(r.node.pushes().is_empty());
    // No firewall API: the user reaches the API through `gpuprov tunnel`.
    assert_eq!(c.access, AccessRecord::SshTunnel { local_port: 6443 });
    let kc = Kubeconfig::parse(&std::fs::read_to_string(&c.kubeconfig).unwrap()).unwrap();
    assert_eq!(kc.clusters[0].cluster.server, "https://127.0.0.1:6443");
}

#[tokio::test]
async fn a_cloud_without_boot_scripts_gets_the_installer_over_ssh() {
    let r = Rig::new(&[Feature::Kubernetes], COVERS).await;
    let m = r.machine();
    assert!(m.launch.boot_script.is_none());
    let end = r.run().await.unwrap();
    ready_cluster(&end);
    assert_eq!(
        r.stages(),
        [
            "vm",
            "checking_boot_install",
            "installing",
            "awaiting_api",
            "fetching_kubeconfig",
            "validating",
            "ready"
        ]
    );
    let pushes = r.node.pushes();
    assert_eq!(pushes.len(), 1);
    assert_eq!(
        pushes[0], "127.0.0.1,localhost",
        "the SAN list covers the host"
    );
    assert!(r
        .labels()
        .iter()
        .any(|l| l.contains("the cloud runs no boot script")));
}

#[tokio::test]
async fn a_failed_or_overdue_boot_install_falls_back_to_ssh() {
    // Failed at boot.
    let r = Rig::new(&[Feature::BootScript, Feature::Kubernetes], COVERS).await;
    r.node.st.lock().unwrap().marker =
        Some("state=failed\nstep=toolkit\nreason=apt-get failed\n".into());
    ready_cluster(&r.run().await.unwrap());
    assert_eq!(r.node.pushes().len(), 1);
    assert!(
        r.labels()
            .iter()
            .any(|l| l.contains("failed at step toolkit")),
        "{:?}",
        r.labels()
    );

    // Still running past the deadline.
    let mut r = Rig::new(&[Feature::BootScript, Feature::Kubernetes], COVERS).await;
    r.timeouts.boot_install = Duration::from_millis(30);
    {
        let mut s = r.node.st.lock().unwrap();
        s.marker = Some("state=running\nstep=k3s\n".into());
        s.cloud_init = Some("status: running".into());
    }
    ready_cluster(&r.run().await.unwrap());
    assert_eq!(r.node.pushes().len(), 1);
    assert!(r.labels().iter().any(|l| l.contains("past its deadline")));

    // Installed, but the GPU is not visible: pushed to take the GPU path.
    let r = Rig::new(&[Feature::BootScript, Feature::Kubernetes], COVERS).await;
    r.node.installed_at_boot();
    r.node.st.lock().unwrap().gpu_csv = None;
    ready_cluster(&r.run().await.unwrap());
    assert_eq!(r.node.pushes().len(), 1);
}

#[tokio::test]
async fn a_certificate_without_the_access_host_reruns_the_installer_once_with_the_san() {
    let r = Rig::new(
        &[Feature::BootScript, Feature::Kubernetes, Feature::Firewall],
        &["localhost", "10.0.0.5"],
    )
    .await;
    r.node.installed_at_boot();
    // The installer rewrites the k3s config with the SAN list; k3s serves a new cert.
    let pki_sans: Vec<String> = vec!["127.0.0.1".into(), "localhost".into()];
    let server_state = r.api.state.clone();
    let fresh = r
        .pki
        .server_cert(&pki_sans.iter().map(String::as_str).collect::<Vec<_>>());
    *r.node.on_push.lock().unwrap() = Some(Box::new(move || {
        server_state.lock().unwrap().cert = (fresh.0.clone(), fresh.1.clone_key());
    }));
    let end = r.run().await.unwrap();
    ready_cluster(&end);
    assert_eq!(
        r.node.pushes(),
        ["127.0.0.1,localhost"],
        "one re-run, with the SAN"
    );
    assert!(r
        .labels()
        .iter()
        .any(|l| l == "k3s: validating (after the SAN re-run)"));
    assert_eq!(
        r.stages(),
        [
            "vm",
            "checking_boot_install",
            "awaiting_api",
            "fetching_kubeconfig",
            "validating",
            "ready"
        ],
        "Validating → Validating: no other stage in between"
    );
}

#[tokio::test]
async fn a_san_still_missing_after_the_rerun_fails_and_leaves_the_vm_up() {
    let r = Rig::new(
        &[Feature::BootScript, Feature::Kubernetes, Feature::Firewall],
        &["localhost"],
    )
    .await;
    r.node.installed_at_boot();
    let end = r.run().await.unwrap();
    match &end {
        K3sState::Failed {
            stage, reason, vm, ..
        } => {
            assert_eq!(stage, "validating");
            assert!(reason.contains("does not cover 127.0.0.1"), "{reason}");
            assert!(reason.contains("even after re-running"), "{reason}");
            assert!(vm.is_some(), "the VM is kept for debugging");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(r.node.pushes().len(), 1, "re-run once, not more");
    assert_eq!(r.cloud.instances().len(), 1, "the VM is left up");
    assert_eq!(r.cloud.count(Op::Delete), 0);
}

#[tokio::test]
async fn a_failed_install_leaves_the_vm_up_and_the_next_apply_reuses_it() {
    let r = Rig::new(&[Feature::Kubernetes], COVERS).await;
    r.node.st.lock().unwrap().push_exit = VecDeque::from(vec![1, 1, 1]);
    let end = r.run().await.unwrap();
    let K3sState::Failed {
        stage, reason, vm, ..
    } = &end
    else {
        panic!("{end:?}")
    };
    assert_eq!(stage, "installing");
    assert!(reason.contains("install script failed"), "{reason}");
    let vm = vm.as_ref().expect("VM left up");
    assert_eq!(r.cloud.instances().len(), 1);
    assert_eq!(r.cloud.count(Op::Delete), 0);
    assert_eq!(r.node.pushes().len(), 3, "retried within the budget");

    // The next apply: the same VM, re-entered at CheckingBootInstall as reused.
    let before = r.journal.history().len();
    let end = r.run().await.unwrap();
    let c = ready_cluster(&end);
    assert_eq!(r.cloud.count(Op::Create), 1, "no second VM");
    assert_eq!(end.vm().unwrap().instance_id, vm.instance_id);
    assert!(c.kubeconfig.exists());
    let later: Vec<String> = r.labels()[before..].to_vec();
    assert!(
        later
            .iter()
            .any(|l| l.starts_with("k3s: checking the boot install (Reused)")),
        "{later:?}"
    );
    assert!(later
        .iter()
        .any(|l| l.contains("reused from an earlier run")));
    assert_eq!(r.node.pushes().len(), 4);
}

#[tokio::test]
async fn an_api_that_never_becomes_ready_fails_in_awaiting_api() {
    let r = Rig::new(&[Feature::BootScript, Feature::Kubernetes], COVERS).await;
    r.node.installed_at_boot();
    r.node.st.lock().unwrap().readyz_never = true;
    let end = r.run().await.unwrap();
    match &end {
        K3sState::Failed {
            stage, reason, vm, ..
        } => {
            assert_eq!(stage, "awaiting_api");
            assert!(reason.contains("was refused"), "{reason}");
            assert!(vm.is_some());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(r.cloud.instances().len(), 1);
}

#[tokio::test]
async fn validation_waits_for_node_gpu_and_coredns_and_fails_when_they_never_come() {
    let r = Rig::new(&[Feature::BootScript, Feature::Kubernetes], COVERS).await;
    r.node.installed_at_boot();
    r.node.st.lock().unwrap().readyz_late = 2;
    {
        let mut s = r.api.state.lock().unwrap();
        s.node_not_ready = 2;
        s.gpus_late = 2;
        s.coredns_pending = 2;
    }
    let end = r.run().await.unwrap();
    assert_eq!(ready_cluster(&end).allocatable_gpus, 1);
    let polls = r.api.state.lock().unwrap().authed.len();
    assert!(polls >= 10, "validation polled ({polls} calls)");

    // The device plugin never advertises the GPU: Failed, naming it.
    let mut r = Rig::new(&[Feature::BootScript, Feature::Kubernetes], COVERS).await;
    r.timeouts.validate = Duration::from_millis(100);
    r.node.installed_at_boot();
    r.api.state.lock().unwrap().gpus = 0;
    match r.run().await.unwrap() {
        K3sState::Failed { stage, reason, .. } => {
            assert_eq!(stage, "validating");
            assert!(
                reason.contains("0 of 1 nvidia.com/gpu allocatable"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_vm_that_never_comes_up_fails_in_vm_and_a_changed_host_key_stops_k3s() {
    let r = Rig::new(&[Feature::Kubernetes], COVERS).await;
    r.cloud.fault(
        Op::Plan,
        None,
        gpuprov::provider::ProviderError::new(
            gpuprov::provider::ErrorKind::Capacity,
            "no capacity",
        ),
        u32::MAX,
    );
    match r.run().await.unwrap() {
        K3sState::Failed {
            stage, vm, launch, ..
        } => {
            assert_eq!(stage, "vm");
            assert!(vm.is_none());
            assert!(launch.is_some(), "the launch's end is kept");
        }
        other => panic!("{other:?}"),
    }

    let r = Rig::new(&[Feature::Kubernetes], COVERS).await;
    r.node.st.lock().unwrap().ssh_errors = VecDeque::from(vec![SshError::HostKeyMismatch {
        endpoint: "ubuntu@127.0.0.1:22".into(),
        expected: "SHA256:a".into(),
        got: "SHA256:b".into(),
    }]);
    match r.run().await.unwrap() {
        K3sState::Failed { stage, reason, .. } => {
            assert_eq!(stage, "checking_boot_install");
            assert!(reason.contains("host key"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        r.node.pushes().is_empty(),
        "nothing runs on a host that changed key"
    );
}

#[tokio::test]
async fn a_cancel_once_the_vm_is_up_stops_k3s_keeps_the_vm_and_the_next_apply_finishes() {
    let r = Rig::new(&[Feature::Kubernetes], COVERS).await;
    let cancel = CancelToken::new();
    let c = cancel.clone();
    // Ctrl-C arrives while the installer runs.
    *r.node.on_push.lock().unwrap() = Some(Box::new(move || {
        c.escalate();
    }));
    match r.run_with(cancel).await.unwrap() {
        K3sState::Failed {
            stage, reason, vm, ..
        } => {
            assert_eq!(stage, "awaiting_api");
            assert_eq!(reason, "cancelled by the user");
            assert!(vm.is_some());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        r.cloud.instances().len(),
        1,
        "the VM is kept, not compensated"
    );
    assert_eq!(r.cloud.count(Op::Delete), 0);
    *r.node.on_push.lock().unwrap() = None;
    ready_cluster(&r.run().await.unwrap());
    assert_eq!(r.cloud.count(Op::Create), 1);
}

#[tokio::test]
async fn a_cancel_while_the_vm_launches_compensates_as_the_launch_machine_does() {
    let r = Rig::new(&[Feature::Kubernetes], COVERS).await;
    let cancel = CancelToken::new();
    cancel.escalate();
    match r.run_with(cancel).await.unwrap() {
        K3sState::Failed {
            stage, vm, launch, ..
        } => {
            assert_eq!(stage, "vm");
            assert!(vm.is_none());
            assert!(
                matches!(
                    launch.as_deref(),
                    Some(gpuprov::vm::LaunchState::Aborted { .. })
                ),
                "{launch:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(r.cloud.instances().is_empty());
}

#[tokio::test]
async fn a_kubeconfig_removed_before_validation_is_fetched_again() {
    use gpuprov::machine::{Machine, Step, StepCx};
    let r = Rig::new(&[Feature::Kubernetes], COVERS).await;
    let end = r.run().await.unwrap();
    let vm = end.vm().unwrap().clone();
    let m = r.machine();
    let s = K3sState::Validating {
        vm: Box::new(vm),
        access: AccessRecord::SshTunnel { local_port: 6443 },
        kubeconfig: r.dir.path().join("kube/gone.yaml"),
        san_rerun: false,
    };
    let cx = StepCx {
        in_state: Duration::ZERO,
        attempt: 0,
        cancelling: false,
    };
    assert!(matches!(
        m.step(&s, &cx).await,
        Step::Next(K3sState::FetchingKubeconfig { .. })
    ));
}

#[tokio::test]
async fn unreachable_ssh_is_retried_not_fatal() {
    let r = Rig::new(&[Feature::Kubernetes], COVERS).await;
    r.node.st.lock().unwrap().ssh_errors = VecDeque::from(vec![SshError::Unreachable {
        endpoint: "ubuntu@127.0.0.1:22".into(),
        msg: "connection reset".into(),
    }]);
    ready_cluster(&r.run().await.unwrap());
}

// ---------------------------------------------------------------------------------------
// Through the engine and the state file

struct EngineRig {
    rig: Rig,
    dir: tempfile::TempDir,
}

impl EngineRig {
    fn engine(&self) -> (Engine, Arc<StateJournal>) {
        let (store, state) = StateStore::open(self.dir.path().join("gpuprov.state.json")).unwrap();
        let lineage = state.lineage.clone();
        let journal = Arc::new(StateJournal::new(store, state).unwrap());
        let engine = Engine {
            providers: self.rig.providers(),
            connector: Arc::new(FakeConnector::default()),
            journal: journal.clone(),
            executor: Executor::new(journal.clone(), CancelToken::new()),
            lineage,
            ssh_public_key: "ssh-ed25519 AAAAtest".into(),
            parallelism: 4,
            retry_until_up: false,
            k3s: Some(K3sSetup {
                shell: self.rig.node.clone(),
                api: self.rig.connector.clone(),
                kubeconfig_dir: self.dir.path().join("kube"),
                installer: Default::default(),
                timeouts: self.rig.timeouts,
            }),
        };
        (engine, journal)
    }

    async fn apply(&self, toml: &str) -> (plan::Plan, std::collections::BTreeMap<String, Outcome>) {
        let config = Config::parse(Path::new("gpuprov.toml"), toml.to_string()).unwrap();
        let (engine, journal) = self.engine();
        let plan = plan::compute(&config, &journal.snapshot(), None, &|_| Some(1.0)).unwrap();
        let out = tokio::time::timeout(Duration::from_secs(30), engine.apply(&plan))
            .await
            .unwrap();
        journal.save_final().unwrap();
        (plan, out)
    }
}

#[tokio::test]
async fn apply_plans_and_destroys_a_cluster_through_the_state_file() {
    let rig = Rig::new(&[Feature::Kubernetes], COVERS).await;
    let e = EngineRig {
        rig,
        dir: tempfile::tempdir().unwrap(),
    };
    let toml = "[vm.trainer]\nclouds = [\"aws\"]\n";
    let (_, out) = e.apply(toml).await;
    assert!(matches!(out["vm.trainer"], Outcome::Ready(_)), "{out:?}");
    let kube = e.dir.path().join("kube/trainer.yaml");
    assert!(kube.exists());
    let text = std::fs::read_to_string(e.dir.path().join("gpuprov.state.json")).unwrap();
    assert!(text.contains("\"kind\": \"k3s\"") || text.contains("\"kind\":\"k3s\""));
    // The cluster's client key (and the field that carries it) is in the kubeconfig
    // only: not in the state, its backup, the journal, or anything the run returned.
    let key_body: String = e
        .rig
        .pki
        .client_key_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    let mut searched = vec![
        ("gpuprov.state.json", text.clone()),
        ("outcomes", format!("{out:?}")),
        (
            "journal labels",
            e.engine().1.snapshot().resources["vm.trainer"]
                .machine
                .label
                .clone(),
        ),
    ];
    for f in ["gpuprov.state.json.backup", "gpuprov.state.json.journal"] {
        if let Ok(t) = std::fs::read_to_string(e.dir.path().join(f)) {
            searched.push((f, t));
        }
    }
    let hits = searched
        .iter()
        .filter(|(_, t)| t.contains(&key_body[..40]) || t.contains(KEY_SENTINEL_NOTE))
        .count();
    assert!(std::fs::read_to_string(&kube)
        .unwrap()
        .contains(KEY_SENTINEL_NOTE));
    figures::write(
        "secrets_k3s_client_key",
        &serde_json::json!({
            "searched": searched.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            "sentinel_hits": hits,
        }),
    );
    assert_eq!(hits, 0, "no client key outside the kubeconfig");
    assert!(
        gpuprov::engine::vm_of(
            "k3s",
            e.engine().1.snapshot().resources["vm.trainer"]
                .machine
                .state
                .as_str()
        )
        .is_some(),
        "ssh and status find the VM in a k3s record"
    );

    // Applied again: nothing to do.
    let (plan, _) = e.apply(toml).await;
    assert_eq!(plan.changes[0].action, Action::NoOp, "{plan:?}");

    // A failed install is a Resume that reuses the VM.
    {
        let (_, journal) = e.engine();
        let snap = journal.snapshot();
        let mut s: K3sState = snap.resources["vm.trainer"].machine.state.decode().unwrap();
        s = K3sState::Failed {
            stage: "validating".into(),
            reason: "test".into(),
            vm: s.vm().cloned().map(Box::new),
            launch: None,
        };
        let config = Config::parse(Path::new("gpuprov.toml"), toml.to_string()).unwrap();
        let mut st = snap.clone();
        st.resources.get_mut("vm.trainer").unwrap().machine.state =
            gpuprov::state::JsonText::encode(&s).unwrap();
        let plan = plan::compute(&config, &st, None, &|_| Some(1.0)).unwrap();
        assert_eq!(plan.changes[0].action, Action::Resume);
        assert!(plan.changes[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("resumes on the same VM"));
    }

    // Destroy: the VM and its kubeconfig go.
    let (engine, journal) = e.engine();
    let out = engine.destroy(&["vm.trainer".to_string()]).await;
    journal.save_final().unwrap();
    assert_eq!(out["vm.trainer"], Outcome::Destroyed);
    assert!(e.rig.cloud.instances().is_empty(), "the VM is gone");
    assert_eq!(e.rig.cloud.count(Op::Create), 1);
    assert!(!kube.exists(), "the kubeconfig went with the cluster");
}

#[tokio::test]
async fn turning_kubernetes_on_for_a_running_vm_installs_k3s_on_it() {
    let rig = Rig::new(&[Feature::Kubernetes], COVERS).await;
    let e = EngineRig {
        rig,
        dir: tempfile::tempdir().unwrap(),
    };
    let (_, out) = e
        .apply("[vm.trainer]\nclouds = [\"aws\"]\nkubernetes = false\n")
        .await;
    assert!(matches!(out["vm.trainer"], Outcome::Ready(_)));
    assert_eq!(
        e.engine().1.snapshot().resources["vm.trainer"].machine.kind,
        "launch"
    );
    let (plan, out) = e.apply("[vm.trainer]\nclouds = [\"aws\"]\n").await;
    assert_eq!(plan.changes[0].action, Action::Update);
    assert!(matches!(out["vm.trainer"], Outcome::Ready(_)), "{out:?}");
    assert_eq!(
        e.engine().1.snapshot().resources["vm.trainer"].machine.kind,
        "k3s"
    );
    assert_eq!(e.rig.cloud.count(Op::Create), 1, "the same VM");
    assert_eq!(e.rig.node.pushes().len(), 1);
}

#[test]
fn the_route_is_recorded_in_the_journal() {
    let s = K3sState::CheckingBootInstall {
        vm: Box::new(serde_json::from_value(serde_json::json!({
            "instance_id": "i-1",
            "location": {"cloud": "aws", "region": "us-east-1"},
            "offer": {"id": "o", "location": {"cloud": "aws", "region": "us-east-1"},
                      "instance_type": "p5", "gpu_count": 1, "spot": false,
                      "price_per_hour": 1.0, "detail": null},
            "ssh": {"host": "127.0.0.1", "port": 22},
            "user": "ubuntu",
            "host_key": {"algorithm": "ssh-ed25519", "key_base64": "AAAA", "fingerprint": "SHA256:x"},
            "ready_at": "2026-12-01T00:00:00Z"
        }))
        .unwrap()),
        route: BootRoute::CloudInit,
    };
    let v = serde_json::to_value(&s).unwrap();
    assert_eq!(v["k3s"], "checking_boot_install");
    assert_eq!(v["route"], "cloud_init");
    let back: K3sState = serde_json::from_value(v).unwrap();
    assert_eq!(back, s);
}
