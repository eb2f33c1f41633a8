//! Tests of the Docker test cloud adapter against the real local Docker Engine.
//!
//! Tests that need the daemon FAIL with a clear message when it is unreachable, unless
//! `GPUPROV_SKIP_DOCKER=1`, in which case they print a skip line and pass. Every test uses
//! its own lineage (a fresh UUID), so tests running in parallel never see each other's
//! containers, and a Drop guard force-removes whatever a test created, even on panic.
//! Only 127.0.0.1 is ever dialled.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bollard::query_parameters::{
    InspectContainerOptions, ListContainersOptions, RemoveContainerOptions, RemoveImageOptions,
    TagImageOptions,
};
use bollard::{Docker, API_DEFAULT_VERSION};
use gpuprov::provider::clouds::docker::{
    sshd_image_tag, DockerProvider, DockerSettings, DEFAULT_BASE_IMAGE, MANAGED_LABEL, OFFER_ID,
};
use gpuprov::provider::{
    CloudProvider, ErrorKind, InstanceSpec, InstanceStatus, Location, Offer, ResourceRequest,
    IDENTITY_LABEL, LINEAGE_LABEL,
};

const PUBLIC_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ7jOiZMoNydwlhQ5xkS696y/oofZ4tyYuexq1H0eNRL gpuprov-test";

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// A raw Engine client for test-side inspection and cleanup, honouring the same endpoint
/// settings as the provider (`GPUPROV_DOCKER_ENDPOINT`, then `DOCKER_HOST`).
pub(crate) fn raw_docker() -> Result<Docker, bollard::errors::Error> {
    match DockerSettings::from_env_and_config(None, None, gpuprov::provider::Lineage::random())
        .endpoint
        .as_deref()
    {
        Some(e) if e.starts_with("tcp://") || e.starts_with("http://") => {
            Docker::connect_with_http(e, 120, API_DEFAULT_VERSION)
        }
        Some(e) => Docker::connect_with_unix(e, 120, API_DEFAULT_VERSION),
        None => Docker::connect_with_defaults(),
    }
}

/// `Some(client)` when the daemon answers; `None` (after printing a skip line) when it does
/// not and `GPUPROV_SKIP_DOCKER=1`; panics with a clear message otherwise.
pub(crate) async fn docker_or_skip(test: &str) -> Option<Docker> {
    let skip = std::env::var("GPUPROV_SKIP_DOCKER").as_deref() == Ok("1");
    let endpoint =
        DockerSettings::from_env_and_config(None, None, gpuprov::provider::Lineage::random())
            .effective_endpoint();
    let result = match raw_docker() {
        Ok(d) => match d.negotiate_version().await {
            Ok(d) => d.ping().await.map(|_| d),
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    match result {
        Ok(d) => Some(d),
        Err(e) if skip => {
            eprintln!("SKIP {test}: Docker unreachable at {endpoint} ({e}); GPUPROV_SKIP_DOCKER=1");
            None
        }
        Err(e) => panic!(
            "{test}: Docker Engine unreachable at {endpoint}: {e}. Start Docker (and build the \
             base image with scripts/build-base-image.sh), or set GPUPROV_SKIP_DOCKER=1 to skip"
        ),
    }
}

/// Force-removes, on drop, every container labelled with `lineage` and the listed image
/// tags. Runs on its own thread and runtime because Drop cannot await.
pub(crate) struct Cleanup {
    pub(crate) lineage: String,
    pub(crate) images: Vec<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let lineage = self.lineage.clone();
        let images = std::mem::take(&mut self.images);
        let joined = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let Ok(docker) = raw_docker() else { return };
                let Ok(docker) = docker.negotiate_version().await else {
                    return;
                };
                let filters = HashMap::from([(
                    "label".to_string(),
                    vec![format!("{LINEAGE_LABEL}={lineage}")],
                )]);
                let options = ListContainersOptions {
                    all: true,
                    filters: Some(filters),
                    ..Default::default()
                };
                for c in docker
                    .list_containers(Some(options))
                    .await
                    .unwrap_or_default()
                {
                    if let Some(id) = c.id {
                        let _ = docker
                            .remove_container(
                                &id,
                                Some(RemoveContainerOptions {
                                    force: true,
                                    v: true,
                                    link: false,
                                }),
                            )
                            .await;
                    }
                }
                for image in images {
                    // noprune: only untag when layers are shared with the regular sshd image.
                    let _ = docker
                        .remove_image(
                            &image,
                            Some(RemoveImageOptions {
                                force: false,
                                noprune: true,
                            }),
                            None,
                        )
                        .await;
                }
            });
        })
        .join();
        if joined.is_err() {
            eprintln!("cleanup of lineage {} panicked", self.lineage);
        }
    }
}

fn lineage() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn provider(lineage: &str) -> DockerProvider {
    DockerProvider::new(DockerSettings {
        lineage: lineage.parse().unwrap(),
        ..DockerSettings::from_env_and_config(None, None, gpuprov::provider::Lineage::random())
    })
}

fn request() -> ResourceRequest {
    ResourceRequest {
        vm_name: "box".into(),
        regions: vec![],
        zones: vec![],
        gpu: None,
        gpu_count: 0,
        spot: false,
        max_price_per_hour: None,
        gpu_count_at_least: false,
    }
}

fn spec(vm_name: &str, lineage: &str) -> InstanceSpec {
    InstanceSpec {
        vm_name: vm_name.into(),
        lineage: lineage.into(),
        client_token: format!("{vm_name}-attempt-1"),
        image: None,
        disk_gb: None,
        ports: vec![],
        ssh_public_key: PUBLIC_KEY.into(),
        boot_script: None,
        shared: Default::default(),
    }
}

fn local() -> Location {
    Location {
        cloud: "docker".into(),
        region: "local".into(),
        zone: None,
    }
}

async fn the_offer(p: &DockerProvider) -> Offer {
    p.plan(&request()).await.unwrap().remove(0)
}

/// Polls `observe` (test-side loop; the adapter itself never waits) until the single
/// instance is Running with an SSH endpoint, at most 30 s.
async fn wait_running(p: &DockerProvider, vm: &str) -> gpuprov::provider::Observed {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seen = p.observe(&local(), vm).await.unwrap();
        assert!(seen.len() <= 1, "more than one instance for {vm}: {seen:?}");
        if let Some(o) = seen.first() {
            if o.status == InstanceStatus::Running && o.ssh.is_some() {
                return o.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "{vm} not Running with SSH within 30 s: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Reads the first line sshd sends on 127.0.0.1:`port`, retrying for up to 15 s while sshd
/// is still generating host keys.
async fn ssh_banner(port: u16) -> String {
    tokio::task::spawn_blocking(move || {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut last = String::new();
        while Instant::now() < deadline {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
                Ok(stream) => {
                    stream
                        .set_read_timeout(Some(Duration::from_secs(3)))
                        .unwrap();
                    let mut line = String::new();
                    match BufReader::new(stream).read_line(&mut line) {
                        Ok(n) if n > 0 => return line,
                        Ok(_) => last = "connection closed before a banner".into(),
                        Err(e) => last = e.to_string(),
                    }
                }
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        panic!("no SSH banner on {addr} within 15 s: {last}");
    })
    .await
    .unwrap()
}

// ---------------------------------------------------------------------------------------
// No daemon needed
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn plan_returns_the_single_local_offer() {
    // An unusable endpoint proves plan never touches the daemon.
    let p = DockerProvider::new(DockerSettings {
        endpoint: Some("unix:///nonexistent/gpuprov-test.sock".into()),
        ..DockerSettings::new(gpuprov::provider::Lineage::random())
    });
    assert_eq!(p.name(), "docker");
    let offers = p.plan(&request()).await.unwrap();
    assert_eq!(offers.len(), 1);
    let o = &offers[0];
    assert_eq!(o.id, OFFER_ID);
    assert_eq!(o.location, local());
    assert_eq!(o.instance_type, "container");
    assert_eq!(
        (o.gpu.clone(), o.gpu_count, o.spot, o.price_per_hour),
        (None, 0, false, 0.0)
    );

    let with_local = p
        .plan(&ResourceRequest {
            regions: vec!["x".into(), "local".into()],
            ..request()
        })
        .await;
    assert_eq!(with_local.unwrap().len(), 1);

    let caps = p.capabilities();
    use gpuprov::provider::Feature::{Diagnose, Import, Start};
    assert_eq!(caps.supported, vec![Start, Import, Diagnose]);
    assert_eq!(caps.boot_timeout, Duration::from_secs(60));
    assert_eq!(caps.poll_interval, Duration::from_millis(500));
    assert_eq!(caps.max_concurrency, 4);
}

#[tokio::test]
async fn plan_rejects_gpu_spot_and_unknown_region() {
    let p = DockerProvider::new(DockerSettings::new(gpuprov::provider::Lineage::random()));
    let gpu = p
        .plan(&ResourceRequest {
            gpu: Some("H100".into()),
            ..request()
        })
        .await
        .unwrap_err();
    assert_eq!(gpu.kind, ErrorKind::InvalidRequest);
    assert!(
        gpu.msg.contains("the docker test cloud has no GPUs"),
        "{}",
        gpu.msg
    );

    let count = p
        .plan(&ResourceRequest {
            gpu_count: 1,
            ..request()
        })
        .await
        .unwrap_err();
    assert_eq!(count.kind, ErrorKind::InvalidRequest);

    let spot = p
        .plan(&ResourceRequest {
            spot: true,
            ..request()
        })
        .await
        .unwrap_err();
    assert_eq!(spot.kind, ErrorKind::InvalidRequest);

    let region = p
        .plan(&ResourceRequest {
            regions: vec!["us-east-1".into()],
            ..request()
        })
        .await
        .unwrap_err();
    assert_eq!(region.kind, ErrorKind::InvalidRequest);
    assert!(region.msg.contains("us-east-1"), "{}", region.msg);
}

#[tokio::test]
async fn unreachable_daemon_is_transient_and_names_the_socket() {
    let p = DockerProvider::new(DockerSettings {
        endpoint: Some("unix:///nonexistent/gpuprov-test.sock".into()),
        lineage: lineage().parse().unwrap(),
        ..DockerSettings::new(gpuprov::provider::Lineage::random())
    });
    let offer = the_offer(&p).await;
    let e = p
        .prepare(&offer, &spec("box", p.settings().lineage.as_str()))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient);
    assert!(
        e.msg.contains("/nonexistent/gpuprov-test.sock"),
        "{}",
        e.msg
    );
    let e = p.observe(&local(), "box").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient);
}

#[tokio::test]
async fn create_rejects_bad_specs_before_touching_docker() {
    // The endpoint is unusable: an InvalidRequest (not Transient) proves the checks run
    // before any Engine call.
    let lin = lineage();
    let p = DockerProvider::new(DockerSettings {
        endpoint: Some("unix:///nonexistent/gpuprov-test.sock".into()),
        lineage: lin.parse().unwrap(),
        ..DockerSettings::new(gpuprov::provider::Lineage::random())
    });
    let offer = the_offer(&p).await;
    let prepared = serde_json::json!({ "image": "gpuprov/sshd:whatever" });
    for bad in [
        InstanceSpec {
            ssh_public_key: "  ".into(),
            ..spec("box", &lin)
        },
        InstanceSpec {
            ssh_public_key: format!("{PUBLIC_KEY}\n{PUBLIC_KEY}"),
            ..spec("box", &lin)
        },
        spec("box", &lineage()),
    ] {
        let e = p.create(&offer, &prepared, &bad).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidRequest, "{e}");
    }
    let e = p
        .create(&offer, &serde_json::json!({}), &spec("box", &lin))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest, "{e}");

    // Without a lineage there is no provider at all: the settings take only a parsed one
    // (the state's lineage must be a UUID), so nothing can observe without it.
    let e = gpuprov::provider::Lineage::parse("").unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest, "{e}");
}

// ---------------------------------------------------------------------------------------
// Real Docker
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn prepare_builds_missing_image_and_is_idempotent() {
    let Some(docker) = docker_or_skip("prepare_builds_missing_image_and_is_idempotent").await
    else {
        return;
    };
    // A private alias of the base image gives a tag no other test or run has built, so
    // this test really sees the "missing" path.
    let lin = lineage();
    let alias_repo = format!("gpuprov-test/base-{}", &lin[..8]);
    let alias = format!("{alias_repo}:bookworm");
    let tag = sshd_image_tag(&alias);
    let _guard = Cleanup {
        lineage: lin.parse().unwrap(),
        images: vec![tag.clone(), alias.clone()],
    };
    docker
        .inspect_image(DEFAULT_BASE_IMAGE)
        .await
        .unwrap_or_else(|e| {
            panic!("base image {DEFAULT_BASE_IMAGE} missing ({e}): run scripts/build-base-image.sh")
        });
    docker
        .tag_image(
            DEFAULT_BASE_IMAGE,
            Some(TagImageOptions {
                repo: Some(alias_repo),
                tag: Some("bookworm".into()),
            }),
        )
        .await
        .unwrap();
    assert!(
        docker.inspect_image(&tag).await.is_err(),
        "{tag} exists before prepare"
    );

    let p = DockerProvider::new(DockerSettings {
        base_image: alias.clone(),
        lineage: lin.parse().unwrap(),
        ..DockerSettings::from_env_and_config(None, None, gpuprov::provider::Lineage::random())
    });
    let offer = the_offer(&p).await;
    let prepared = p.prepare(&offer, &spec("img", &lin)).await.unwrap();
    assert_eq!(prepared, serde_json::json!({ "image": tag }));
    let built = docker.inspect_image(&tag).await.expect("image built");
    let labels = built
        .config
        .as_ref()
        .and_then(|c| c.labels.clone())
        .unwrap_or_default();
    assert_eq!(labels.get(MANAGED_LABEL).map(String::as_str), Some("true"));
    let entrypoint = built
        .config
        .as_ref()
        .and_then(|c| c.entrypoint.clone())
        .unwrap_or_default();
    assert_eq!(
        entrypoint,
        vec!["/usr/local/sbin/gpuprov-entrypoint.sh".to_string()]
    );

    let started = Instant::now();
    let again = p.prepare(&offer, &spec("img", &lin)).await.unwrap();
    assert_eq!(again, prepared);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "second prepare took {:?}",
        started.elapsed()
    );
    let same = docker.inspect_image(&tag).await.unwrap();
    assert_eq!(same.id, built.id, "second prepare rebuilt the image");
}

#[tokio::test]
async fn prepare_without_base_image_is_invalid_request() {
    if docker_or_skip("prepare_without_base_image_is_invalid_request")
        .await
        .is_none()
    {
        return;
    }
    let lin = lineage();
    let p = DockerProvider::new(DockerSettings {
        base_image: format!("gpuprov-test/no-such-base:{}", &lin[..8]),
        lineage: lin.parse().unwrap(),
        ..DockerSettings::from_env_and_config(None, None, gpuprov::provider::Lineage::random())
    });
    let offer = the_offer(&p).await;
    let e = p.prepare(&offer, &spec("nobase", &lin)).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest);
    assert!(e.msg.contains("scripts/build-base-image.sh"), "{}", e.msg);
}

#[tokio::test]
async fn create_observe_ssh_delete_cleanup_lifecycle() {
    let Some(docker) = docker_or_skip("create_observe_ssh_delete_cleanup_lifecycle").await else {
        return;
    };
    let lin = lineage();
    let _guard = Cleanup {
        lineage: lin.parse().unwrap(),
        images: vec![],
    };
    let p = provider(&lin);
    let offer = the_offer(&p).await;
    let vm = "life";
    let spec = InstanceSpec {
        ports: vec![8080],
        ..spec(vm, &lin)
    };
    let prepared = p.prepare(&offer, &spec).await.unwrap();

    assert!(p.observe(&local(), vm).await.unwrap().is_empty());
    let id = p.create(&offer, &prepared, &spec).await.unwrap();
    let running = wait_running(&p, vm).await;
    assert_eq!(running.instance_id, id);
    let ssh = running.ssh.clone().unwrap();
    assert_eq!(ssh.host, "127.0.0.1");
    assert_eq!(ssh.user.as_deref(), Some("root"));
    assert_ne!(ssh.port, 0);

    let banner = ssh_banner(ssh.port).await;
    assert!(
        banner.starts_with("SSH-2.0-"),
        "unexpected banner {banner:?}"
    );

    // What the Engine reports: labels, key in the environment, ports on loopback only.
    let info = docker
        .inspect_container(&id, None::<InspectContainerOptions>)
        .await
        .unwrap();
    assert_eq!(
        info.name.as_deref(),
        Some(format!("/gpuprov-{vm}-{}", &lin[..8]).as_str())
    );
    let config = info.config.clone().unwrap();
    let labels = config.labels.unwrap_or_default();
    assert_eq!(labels.get(IDENTITY_LABEL).map(String::as_str), Some(vm));
    assert_eq!(
        labels.get(LINEAGE_LABEL).map(String::as_str),
        Some(lin.as_str())
    );
    assert_eq!(
        labels.get("gpuprov-client-token").map(String::as_str),
        Some(spec.client_token.as_str())
    );
    assert!(config
        .env
        .unwrap_or_default()
        .contains(&format!("GPUPROV_AUTHORIZED_KEY={PUBLIC_KEY}")));
    let ports = info
        .network_settings
        .and_then(|n| n.ports)
        .unwrap_or_default();
    for key in ["22/tcp", "8080/tcp"] {
        let bindings = ports.get(key).cloned().flatten().unwrap_or_default();
        assert!(!bindings.is_empty(), "{key} not published: {ports:?}");
        for b in bindings {
            assert_eq!(
                b.host_ip.as_deref(),
                Some("127.0.0.1"),
                "{key} bound beyond loopback"
            );
        }
    }

    // create is idempotent: same id, still one instance.
    let again = p.create(&offer, &prepared, &spec).await.unwrap();
    assert_eq!(again, id);
    let seen = p.observe(&local(), vm).await.unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].instance_id, id);

    // Another location holds nothing.
    let elsewhere = Location {
        region: "remote".into(),
        ..local()
    };
    assert!(p.observe(&elsewhere, vm).await.unwrap().is_empty());

    p.delete(&local(), vm, std::slice::from_ref(&id))
        .await
        .unwrap();
    assert!(
        p.observe(&local(), vm).await.unwrap().is_empty(),
        "container survived delete"
    );
    p.delete(&local(), vm, std::slice::from_ref(&id))
        .await
        .unwrap();
    p.delete(
        &local(),
        vm,
        &["0123456789abcdef-never-existed".to_string()],
    )
    .await
    .unwrap();
    p.cleanup(&local(), vm).await.unwrap();
    p.cleanup(&local(), vm).await.unwrap();
}

#[tokio::test]
async fn create_leaves_a_stopped_container_alone_and_start_restarts_it() {
    let Some(docker) =
        docker_or_skip("create_leaves_a_stopped_container_alone_and_start_restarts_it").await
    else {
        return;
    };
    let lin = lineage();
    let _guard = Cleanup {
        lineage: lin.parse().unwrap(),
        images: vec![],
    };
    let p = provider(&lin);
    let offer = the_offer(&p).await;
    let vm = "restart";
    let spec = spec(vm, &lin);
    let prepared = p.prepare(&offer, &spec).await.unwrap();
    let id = p.create(&offer, &prepared, &spec).await.unwrap();
    wait_running(&p, vm).await;

    docker
        .stop_container(&id, None::<bollard::query_parameters::StopContainerOptions>)
        .await
        .unwrap();
    let seen = p.observe(&local(), vm).await.unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].status, InstanceStatus::Stopped);
    assert_eq!(
        seen[0].ssh, None,
        "a stopped container must not report an SSH endpoint"
    );

    // A create that meets it (by name) neither duplicates nor starts it: whether it is
    // this run's is for the core's observe to decide (issue 12).
    let again = p.create(&offer, &prepared, &spec).await.unwrap_err();
    assert_eq!(again.kind, ErrorKind::Transient, "{again:?}");
    let seen = p.observe(&local(), vm).await.unwrap();
    assert_eq!(seen.len(), 1, "no duplicate");
    assert_eq!(
        seen[0].status,
        InstanceStatus::Stopped,
        "not started by create"
    );

    // `start` restarts it, and unpauses a paused one.
    p.start(&local(), vm, &id).await.unwrap();
    let running = wait_running(&p, vm).await;
    assert_eq!(running.instance_id, id);
    docker.pause_container(&id).await.unwrap();
    assert_eq!(
        p.observe(&local(), vm).await.unwrap()[0].status,
        InstanceStatus::Stopped
    );
    p.start(&local(), vm, &id).await.unwrap();
    assert_eq!(wait_running(&p, vm).await.instance_id, id);

    // `diagnose` (issue 18): a running container without a healthcheck has nothing to
    // say; a killed one says how it exited; a removed one has no findings.
    assert_eq!(p.diagnose(&local(), vm, &id).await.unwrap(), vec![]);
    docker
        .kill_container(
            &id,
            Some(
                bollard::query_parameters::KillContainerOptionsBuilder::new()
                    .signal("KILL")
                    .build(),
            ),
        )
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while p.observe(&local(), vm).await.unwrap()[0].status == InstanceStatus::Running {
        assert!(
            Instant::now() < deadline,
            "still running 15 s after SIGKILL"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let findings = p.diagnose(&local(), vm, &id).await.unwrap();
    assert!(
        findings
            .iter()
            .any(|f| f.severity == gpuprov::provider::Severity::Error
                && f.message == "exited with code 137"),
        "{findings:?}"
    );
    p.start(&local(), vm, &id).await.unwrap();
    assert_eq!(wait_running(&p, vm).await.instance_id, id);

    p.start(&local(), vm, &id).await.unwrap();
    p.delete(&local(), vm, std::slice::from_ref(&id))
        .await
        .unwrap();
    assert_eq!(p.diagnose(&local(), vm, &id).await.unwrap(), vec![]);
    let gone = p.start(&local(), vm, &id).await.unwrap_err();
    assert_eq!(gone.kind, ErrorKind::Failed, "{gone:?}");
}

#[tokio::test]
async fn observe_with_another_lineage_sees_nothing() {
    if docker_or_skip("observe_with_another_lineage_sees_nothing")
        .await
        .is_none()
    {
        return;
    }
    let mine = lineage();
    let theirs = lineage();
    let _guard = Cleanup {
        lineage: mine.clone(),
        images: vec![],
    };
    let p = provider(&mine);
    let other = provider(&theirs);
    let offer = the_offer(&p).await;
    let vm = "shared-name";
    let spec = spec(vm, &mine);
    let prepared = p.prepare(&offer, &spec).await.unwrap();
    let id = p.create(&offer, &prepared, &spec).await.unwrap();

    let seen = p.observe(&local(), vm).await.unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].instance_id, id);
    assert!(other.observe(&local(), vm).await.unwrap().is_empty());
    assert!(p
        .observe(&local(), "some-other-vm")
        .await
        .unwrap()
        .is_empty());

    // A spec of another lineage is refused rather than creating an invisible container.
    let foreign = gpuprov::provider::InstanceSpec {
        lineage: theirs.clone(),
        ..spec.clone()
    };
    let e = p.create(&offer, &prepared, &foreign).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest);

    other.cleanup(&local(), vm).await.unwrap();
    p.delete(&local(), vm, &[id]).await.unwrap();
}
