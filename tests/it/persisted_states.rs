//! Golden JSON of every persisted machine state (issue 13): one fixture per variant of the
//! launch machine's `LaunchState`, the teardown machine's `TeardownState` and the k3s
//! machine's `K3sState` under `tests/fixtures/states/{launch,teardown,k3s}/`, the shared
//! objects' `SharedState` and `SharedTeardownState` (issue 21) under `shared/` and
//! `shared_teardown/`, and a state
//! file (`state_file.json`) whose resource records hold one machine of each kind. Every
//! fixture must deserialise and re-serialise to the same JSON value: they pin the
//! persisted format, so a state written by this release keeps loading.
//!
//! The fixtures were written from the samples below with
//! `GPUPROV_WRITE_STATE_FIXTURES=1 cargo nextest run persisted_states::` and committed;
//! never regenerate them to make a failing round trip pass (an old state would no longer
//! load). A new variant gets a fixture the same way (the matches below do not compile
//! until it has a name).

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};

use gpuprov::cluster::k3s::{AccessRecord, ClusterRecord, K3sState};
use gpuprov::cluster::probe::BootRoute;
use gpuprov::provider::{BlockScope, ErrorKind, Location, Offer, SshEndpoint};
use gpuprov::provider::{SharedFound, SharedObject};
use gpuprov::ssh::HostKey;
use gpuprov::state::{Event, MachineRecord, ResourceRecord, StateFile};
use gpuprov::vm::launch::{AfterCompensation, Attempt};
use gpuprov::vm::shared::{SharedState, SharedTeardownState};
use gpuprov::vm::{LaunchState, Owned, Preemption, Search, Target, TeardownState, VmRecord};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/states")
}

fn at(s: &str) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::parse_from_rfc3339(s).unwrap().into()
}

fn loc() -> Location {
    Location {
        cloud: "aws".into(),
        region: "us-east-1".into(),
        zone: Some("us-east-1a".into()),
    }
}

fn offer(id: &str, ty: &str, price: f64) -> Offer {
    Offer {
        id: id.into(),
        location: loc(),
        instance_type: ty.into(),
        gpu: Some("H100".into()),
        gpu_count: 8,
        spot: false,
        price_per_hour: price,
        detail: json!({"ami": "ami-0123456789abcdef0"}),
        facts: Default::default(),
    }
}

fn vm_record() -> VmRecord {
    VmRecord {
        instance_id: "i-0abc".into(),
        location: loc(),
        offer: offer("aws/us-east-1a/p5.48xlarge", "p5.48xlarge", 98.32),
        ssh: SshEndpoint {
            host: "203.0.113.7".into(),
            port: 22,
            user: Some("ubuntu".into()),
        },
        user: "ubuntu".into(),
        host_key: HostKey {
            algorithm: "ssh-ed25519".into(),
            key_base64: "AAAAC3NzaC1lZDI1NTE5AAAAIGpuprovHostKeyOnly".into(),
            fingerprint: "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU".into(),
        },
        ready_at: at("2026-12-01T10:00:00Z"),
        preemptions: vec![],
    }
}

fn search() -> Search {
    Search {
        offers: vec![
            offer("aws/us-east-1a/p5.48xlarge", "p5.48xlarge", 98.32),
            offer("aws/us-east-1a/p4d.24xlarge", "p4d.24xlarge", 32.77),
        ],
        cursor: 1,
        blocked: vec![
            BlockScope::Offer {
                id: "aws/us-east-1a/p5.48xlarge".into(),
            },
            BlockScope::InstanceTypeInRegion {
                cloud: "aws".into(),
                region: "us-west-2".into(),
                instance_type: "p5.48xlarge".into(),
            },
            BlockScope::Region {
                cloud: "aws".into(),
                region: "eu-west-1".into(),
            },
            BlockScope::Cloud {
                cloud: "lambda".into(),
            },
        ],
        history: vec![
            Attempt {
                offer_id: "aws/us-east-1a/p5.48xlarge".into(),
                outcome: "capacity: InsufficientInstanceCapacity".into(),
                kind: Some(ErrorKind::Capacity),
            },
            Attempt {
                offer_id: "aws/us-east-1a/p4d.24xlarge".into(),
                outcome: "trying".into(),
                kind: None,
            },
        ],
        round: 2,
        nonce: "1a2b3c4d".into(),
        preempted: vec![],
    }
}

fn preemption() -> Preemption {
    Preemption {
        instance_id: "i-0old".into(),
        offer_id: "aws/us-east-1a/p5.48xlarge".into(),
        location: loc(),
        instance_type: "p5.48xlarge".into(),
        at: at("2026-12-01T09:30:00Z"),
        signal: "Server.SpotInstanceTermination: Spot instance termination".into(),
    }
}

fn owned() -> Owned {
    Owned {
        location: loc(),
        instance_ids: vec!["i-0abc".into()],
        vm: Some(Box::new(vm_record())),
        adopted: true,
        unsettled: true,
    }
}

fn target() -> Target {
    Target {
        location: loc(),
        vm_name: "trainer".into(),
        instance_ids: vec!["i-0abc".into(), "i-0def".into()],
        settle: true,
        keep_side_resources: true,
        named_only: true,
    }
}

/// The fixture name of a launch state (exhaustive: a new variant needs a fixture).
fn launch_name(s: &LaunchState) -> &'static str {
    match s {
        LaunchState::Reconciling { .. } => "reconciling",
        LaunchState::Planning { .. } => "planning",
        LaunchState::Preparing { .. } => "preparing",
        LaunchState::Creating { .. } => "creating",
        LaunchState::Booting { .. } => "booting",
        LaunchState::Connecting { .. } => "connecting",
        LaunchState::Starting { .. } => "starting",
        LaunchState::Ready { .. } => "ready",
        LaunchState::Compensating { .. } => "compensating",
        LaunchState::NextOffer { .. } => "next_offer",
        LaunchState::Exhausted { .. } => "exhausted",
        LaunchState::Aborted { .. } => "aborted",
        LaunchState::Leaked { .. } => "leaked",
        LaunchState::Unowned { .. } => "unowned",
    }
}

fn teardown_name(s: &TeardownState) -> &'static str {
    match s {
        TeardownState::Requesting { .. } => "requesting",
        TeardownState::AwaitingGone { .. } => "awaiting_gone",
        TeardownState::CleaningUp { .. } => "cleaning_up",
        TeardownState::Done => "done",
        TeardownState::Leaked { .. } => "leaked",
    }
}

fn k3s_name(s: &K3sState) -> &'static str {
    match s {
        K3sState::Vm { .. } => "vm",
        K3sState::CheckingBootInstall { .. } => "checking_boot_install",
        K3sState::Installing { .. } => "installing",
        K3sState::AwaitingApi { .. } => "awaiting_api",
        K3sState::FetchingKubeconfig { .. } => "fetching_kubeconfig",
        K3sState::Validating { .. } => "validating",
        K3sState::Ready { .. } => "ready",
        K3sState::Failed { .. } => "failed",
    }
}

fn launch_samples() -> Vec<LaunchState> {
    let vm = || Box::new(vm_record());
    vec![
        LaunchState::Reconciling {
            previous: Some(owned()),
        },
        LaunchState::Planning {
            round: 2,
            preempted: vec![],
        },
        LaunchState::Preparing { search: search() },
        LaunchState::Creating {
            search: search(),
            prepared: json!({"security_group": "sg-0123", "key_name": "gpuprov-0f0e0d0c-abc"}),
            sent: true,
        },
        LaunchState::Booting {
            search: search(),
            instance_id: "i-0abc".into(),
            adopted: true,
            kept: Some(vm()),
        },
        LaunchState::Connecting {
            search: search(),
            instance_id: "i-0abc".into(),
            endpoint: SshEndpoint {
                host: "203.0.113.7".into(),
                port: 22,
                user: Some("ubuntu".into()),
            },
            pinned: Some(vm_record().host_key),
            adopted: true,
        },
        LaunchState::Starting {
            search: search(),
            vm: vm(),
        },
        LaunchState::Ready { vm: vm() },
        LaunchState::Compensating {
            search: search(),
            teardown: TeardownState::AwaitingGone { target: target() },
            reason: "capacity: InsufficientInstanceCapacity".into(),
            after: AfterCompensation::NextOffer,
        },
        LaunchState::NextOffer { search: search() },
        LaunchState::Exhausted { search: search() },
        LaunchState::Aborted {
            reason: "credentials: AuthFailure".into(),
            owned: Some(owned()),
        },
        LaunchState::Leaked {
            location: loc(),
            instance_ids: vec!["i-0abc".into()],
            reason: "delete not confirmed".into(),
        },
        LaunchState::Unowned {
            location: loc(),
            instance_ids: vec!["i-0abc".into()],
            reason: "stopped instance found by identity".into(),
        },
    ]
}

/// The compensation's other continuations, beside `launch/compensating.json`.
fn compensating_samples() -> Vec<(&'static str, LaunchState)> {
    let with = |after| LaunchState::Compensating {
        search: search(),
        teardown: TeardownState::Requesting { target: target() },
        reason: "stale record".into(),
        after,
    };
    vec![
        ("compensating_replan", with(AfterCompensation::Replan)),
        (
            "compensating_abort",
            with(AfterCompensation::Abort {
                reason: "cancelled".into(),
            }),
        ),
    ]
}

/// A machine's recorded spot preemptions: on the record of the machine that replaced the
/// preempted one, in the planning that demotes its offer, and in the search.
fn preemption_samples() -> Vec<(&'static str, LaunchState)> {
    vec![
        (
            "ready_preempted",
            LaunchState::Ready {
                vm: Box::new(VmRecord {
                    preemptions: vec![preemption()],
                    ..vm_record()
                }),
            },
        ),
        (
            "planning_preempted",
            LaunchState::Planning {
                round: 0,
                preempted: vec![preemption()],
            },
        ),
        (
            "next_offer_preempted",
            LaunchState::NextOffer {
                search: Search {
                    preempted: vec![preemption()],
                    ..search()
                },
            },
        ),
    ]
}

fn teardown_samples() -> Vec<TeardownState> {
    vec![
        TeardownState::Requesting { target: target() },
        TeardownState::AwaitingGone { target: target() },
        TeardownState::CleaningUp { target: target() },
        TeardownState::Done,
        TeardownState::Leaked {
            location: loc(),
            instance_ids: vec!["i-0abc".into()],
            reason: "delete not confirmed".into(),
        },
    ]
}

fn k3s_samples() -> Vec<K3sState> {
    let vm = || Box::new(vm_record());
    vec![
        K3sState::Vm {
            launch: Box::new(LaunchState::Planning {
                round: 0,
                preempted: vec![],
            }),
            reused: true,
        },
        K3sState::CheckingBootInstall {
            vm: vm(),
            route: BootRoute::CloudInit,
        },
        K3sState::Installing {
            vm: vm(),
            reason: "no boot script on this cloud".into(),
        },
        K3sState::AwaitingApi { vm: vm() },
        K3sState::FetchingKubeconfig { vm: vm() },
        K3sState::Validating {
            vm: vm(),
            access: AccessRecord::SshTunnel { local_port: 16443 },
            kubeconfig: "/home/u/.local/share/gpuprov/projects/p/trainer.kubeconfig".into(),
            san_rerun: true,
        },
        K3sState::Ready {
            vm: vm(),
            cluster: Some(ClusterRecord {
                access: AccessRecord::Direct {
                    host: "203.0.113.7".into(),
                },
                kubeconfig: "/home/u/.local/share/gpuprov/projects/p/trainer.kubeconfig".into(),
                allocatable_gpus: 8,
                kubelet_version: Some("v1.31.4+k3s1".into()),
            }),
        },
        K3sState::Failed {
            stage: "vm".into(),
            reason: "launch leaked".into(),
            vm: None,
            launch: Some(Box::new(LaunchState::Leaked {
                location: loc(),
                instance_ids: vec!["i-0abc".into()],
                reason: "delete not confirmed".into(),
            })),
        },
    ]
}

/// The other boot routes and a k3s `Ready` without a cluster (a VM on a cloud that cannot
/// host k3s), and a `Failed` with the VM up.
fn k3s_extra_samples() -> Vec<(&'static str, K3sState)> {
    let vm = || Box::new(vm_record());
    vec![
        (
            "checking_boot_install_startup_script",
            K3sState::CheckingBootInstall {
                vm: vm(),
                route: BootRoute::StartupScript,
            },
        ),
        (
            "checking_boot_install_no_boot_script",
            K3sState::CheckingBootInstall {
                vm: vm(),
                route: BootRoute::NoBootScript,
            },
        ),
        (
            "ready_without_cluster",
            K3sState::Ready {
                vm: vm(),
                cluster: None,
            },
        ),
        (
            "failed_with_vm",
            K3sState::Failed {
                stage: "awaiting_api".into(),
                reason: "/readyz did not answer in 300s".into(),
                vm: Some(vm()),
                launch: None,
            },
        ),
    ]
}

fn record<S: Serialize>(kind: &str, state: &S, label: &str) -> ResourceRecord {
    let mut r = ResourceRecord::new(MachineRecord {
        kind: kind.into(),
        state: gpuprov::state::JsonText::encode(&state).unwrap(),
        label: label.into(),
        updated_at: at("2026-12-01T10:00:05Z"),
    });
    r.desired =
        Some(json!({"name": "trainer", "clouds": ["aws"], "gpu": "H100", "gpu_count": 8}).into());
    r.events = VecDeque::from([
        Event {
            at: at("2026-12-01T09:59:00Z"),
            label: "planning".into(),
        },
        Event {
            at: at("2026-12-01T10:00:05Z"),
            label: label.into(),
        },
    ]);
    r
}

/// A state file holding a record of each machine kind (and fields of a newer release,
/// which are kept on save).
fn state_file_sample() -> StateFile {
    let mut s = StateFile::new();
    s.serial = 7;
    s.lineage = "0f0e0d0c-1111-4222-8333-444455556666".into();
    s.gpuprov_version = "0.1.0".into();
    s.resources = BTreeMap::from([
        (
            "vm.trainer".to_string(),
            record(
                "launch",
                &LaunchState::Ready {
                    vm: Box::new(vm_record()),
                },
                "ready i-0abc",
            ),
        ),
        (
            "vm.old".to_string(),
            record(
                "teardown",
                &TeardownState::AwaitingGone { target: target() },
                "awaiting gone i-0abc",
            ),
        ),
        (
            "vm.gpu-node".to_string(),
            record("k3s", &k3s_samples()[6], "k3s ready"),
        ),
    ]);
    s.resources
        .get_mut("vm.old")
        .unwrap()
        .extra
        .insert("from_a_newer_release".into(), json!({"kept": true}));
    s.extra
        .insert("from_a_newer_release".into(), json!([1, 2, 3]));
    s
}

/// Every sample, as (fixture path under `tests/fixtures/states`, JSON text).
fn samples() -> Vec<(String, String)> {
    let mut out = vec![];
    for s in launch_samples() {
        out.push((format!("launch/{}.json", launch_name(&s)), v(&s)));
    }
    for (n, s) in compensating_samples()
        .into_iter()
        .chain(preemption_samples())
    {
        out.push((format!("launch/{n}.json"), v(&s)));
    }
    for s in teardown_samples() {
        out.push((format!("teardown/{}.json", teardown_name(&s)), v(&s)));
    }
    for s in k3s_samples() {
        out.push((format!("k3s/{}.json", k3s_name(&s)), v(&s)));
    }
    for (n, s) in k3s_extra_samples() {
        out.push((format!("k3s/{n}.json"), v(&s)));
    }
    for (n, s) in shared_samples() {
        out.push((format!("shared/{n}.json"), v(&s)));
    }
    for (n, s) in shared_teardown_samples() {
        out.push((format!("shared_teardown/{n}.json"), v(&s)));
    }
    out.push(("state_file.json".into(), v(&state_file_sample())));
    out
}

fn shared_object() -> SharedObject {
    SharedObject {
        cloud: "digitalocean".into(),
        kind: "ssh_key".into(),
        region: None,
    }
}

fn shared_found(ours: bool) -> SharedFound {
    SharedFound {
        id: "512190".into(),
        name: if ours {
            "gpuprov-0f0e0d0c-3b16bfe48b00".into()
        } else {
            "my-laptop".into()
        },
        ours,
    }
}

/// Every variant of the shared object's machine (issue 21), named.
fn shared_samples() -> Vec<(&'static str, SharedState)> {
    let object = shared_object();
    let regional = SharedObject {
        cloud: "hyperstack".into(),
        kind: "environment".into(),
        region: Some("CANADA-1".into()),
    };
    let s = vec![
        (
            "observing",
            SharedState::Observing {
                object: object.clone(),
            },
        ),
        (
            "observing_regional",
            SharedState::Observing { object: regional },
        ),
        (
            "creating",
            SharedState::Creating {
                object: object.clone(),
            },
        ),
        (
            "ready",
            SharedState::Ready {
                object: object.clone(),
                found: shared_found(true),
            },
        ),
        (
            "ready_users_own",
            SharedState::Ready {
                object: object.clone(),
                found: shared_found(false),
            },
        ),
        (
            "failed",
            SharedState::Failed {
                object,
                kind: ErrorKind::Credentials,
                reason: "digitalocean: 401 unauthorized".into(),
            },
        ),
    ];
    for (_, x) in &s {
        match x {
            SharedState::Observing { .. }
            | SharedState::Creating { .. }
            | SharedState::Ready { .. }
            | SharedState::Failed { .. } => {}
        }
    }
    s
}

/// Every variant of the shared object's teardown machine, named.
fn shared_teardown_samples() -> Vec<(&'static str, SharedTeardownState)> {
    let object = shared_object();
    let s = vec![
        (
            "observing",
            SharedTeardownState::Observing {
                object: object.clone(),
            },
        ),
        (
            "deleting",
            SharedTeardownState::Deleting {
                object: object.clone(),
                found: shared_found(true),
            },
        ),
        (
            "deleted",
            SharedTeardownState::Deleted {
                object: object.clone(),
            },
        ),
        (
            "leaked",
            SharedTeardownState::Leaked {
                object,
                found: Some(shared_found(true)),
                reason: "transient: 503".into(),
            },
        ),
    ];
    for (_, x) in &s {
        match x {
            SharedTeardownState::Observing { .. }
            | SharedTeardownState::Deleting { .. }
            | SharedTeardownState::Deleted { .. }
            | SharedTeardownState::Leaked { .. } => {}
        }
    }
    s
}

/// `t` as the state file writes it (pretty, fields in declaration order).
fn v<T: Serialize>(t: &T) -> String {
    serde_json::to_string_pretty(t).unwrap() + "\n"
}

/// `value` read as `T` and written again.
fn round_trip<T: Serialize + DeserializeOwned>(path: &Path, value: &Value) -> Value {
    let t: T = serde_json::from_value(value.clone())
        .unwrap_or_else(|e| panic!("{} no longer loads: {e}", path.display()));
    serde_json::to_value(&t).unwrap()
}

/// Writes the fixtures when `GPUPROV_WRITE_STATE_FIXTURES=1` (once, for a new variant);
/// otherwise checks that every variant has one.
#[test]
fn every_variant_has_a_fixture() {
    let write = std::env::var("GPUPROV_WRITE_STATE_FIXTURES").is_ok_and(|v| v == "1");
    let mut missing = vec![];
    for (name, text) in samples() {
        let path = dir().join(&name);
        if write {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap();
            println!("wrote {}", path.display());
        } else if !path.exists() {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "no fixture for {missing:?}: write it with GPUPROV_WRITE_STATE_FIXTURES=1 and commit it"
    );
}

/// Every fixture under `tests/fixtures/states` deserialises and re-serialises to the same
/// JSON value.
#[test]
fn every_fixture_loads_and_round_trips() {
    let mut seen = 0;
    for sub in ["launch", "teardown", "k3s", "shared", "shared_teardown"] {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir().join(sub))
            .unwrap_or_else(|e| panic!("{sub}: {e}"))
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no {sub} fixtures");
        for path in files {
            let value: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let again = match sub {
                "launch" => round_trip::<LaunchState>(&path, &value),
                "teardown" => round_trip::<TeardownState>(&path, &value),
                "shared" => round_trip::<SharedState>(&path, &value),
                "shared_teardown" => round_trip::<SharedTeardownState>(&path, &value),
                _ => round_trip::<K3sState>(&path, &value),
            };
            assert_eq!(again, value, "{} changed on a round trip", path.display());
            seen += 1;
        }
    }
    assert!(seen >= 14 + 5 + 8 + 6 + 4, "read {seen} state fixtures");
}

/// The state file fixture loads and saves unchanged (records, events, unknown fields), and
/// each record's machine state loads as its kind says.
#[test]
fn the_state_file_fixture_loads_and_round_trips() {
    let path = dir().join("state_file.json");
    let value: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let file: StateFile = serde_json::from_value(value.clone())
        .unwrap_or_else(|e| panic!("{} no longer loads: {e}", path.display()));
    assert_eq!(serde_json::to_value(&file).unwrap(), value);
    let kinds: Vec<&str> = file
        .resources
        .values()
        .map(|r| r.machine.kind.as_str())
        .collect();
    for kind in ["launch", "teardown", "k3s"] {
        assert!(kinds.contains(&kind), "a {kind} record: {kinds:?}");
    }
    for (addr, r) in &file.resources {
        let state = &r.machine.state.to_value();
        let again = match r.machine.kind.as_str() {
            "launch" => round_trip::<LaunchState>(&path, state),
            "teardown" => round_trip::<TeardownState>(&path, state),
            "k3s" => round_trip::<K3sState>(&path, state),
            other => panic!("{addr}: unknown kind {other}"),
        };
        assert_eq!(&again, state, "{addr}");
    }
    assert_eq!(file.extra["from_a_newer_release"], json!([1, 2, 3]));
    assert_eq!(
        file.resources["vm.old"].extra["from_a_newer_release"],
        json!({"kept": true})
    );
}
