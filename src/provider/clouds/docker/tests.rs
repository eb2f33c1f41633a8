//! Unit tests of the Docker adapter's pure parts: findings, the SSH endpoint, names,
//! dead reasons and settings.

use super::containers::dead_reason;
use super::*;
use bollard::models::Port;

#[test]
fn findings_say_what_the_engine_says() {
    use crate::provider::Severity;
    use bollard::models::{ContainerState, Health, HealthStatusEnum, HealthcheckResult};
    let healthy = ContainerState {
        running: Some(true),
        exit_code: Some(0),
        health: Some(Health {
            status: Some(HealthStatusEnum::HEALTHY),
            ..Default::default()
        }),
        ..Default::default()
    };
    let f = findings_of(&healthy, Some(0));
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].severity, Severity::Info);
    let sick = ContainerState {
        running: Some(false),
        oom_killed: Some(true),
        exit_code: Some(137),
        health: Some(Health {
            status: Some(HealthStatusEnum::UNHEALTHY),
            failing_streak: Some(3),
            log: Some(vec![HealthcheckResult {
                output: Some("curl: connection refused\nmore".into()),
                ..Default::default()
            }]),
        }),
        ..Default::default()
    };
    let f = findings_of(&sick, Some(2));
    let text: Vec<&str> = f.iter().map(|f| f.message.as_str()).collect();
    assert_eq!(
        text,
        [
            "healthcheck unhealthy (3 failures in a row): curl: connection refused",
            "killed by the out-of-memory killer (OOMKilled)",
            "exited with code 137",
            "restarted 2 times"
        ]
    );
    assert_eq!(f.iter().map(|f| f.severity).max(), Some(Severity::Error));
    let clean_stop = ContainerState {
        running: Some(false),
        exit_code: Some(0),
        ..Default::default()
    };
    assert!(findings_of(&clean_stop, None).is_empty());
}

fn summary(state: ContainerSummaryStateEnum, ports: Vec<Port>) -> ContainerSummary {
    ContainerSummary {
        id: Some("abc".into()),
        state: Some(state),
        ports: Some(ports),
        ..Default::default()
    }
}

fn port(private: u16, public: Option<u16>, ip: &str) -> Port {
    Port {
        ip: Some(ip.into()),
        private_port: private,
        public_port: public,
        typ: Some(PortTypeEnum::TCP),
    }
}

#[test]
fn ssh_endpoint_only_when_running_with_published_22() {
    let ok = summary(
        ContainerSummaryStateEnum::RUNNING,
        vec![port(22, Some(32768), "127.0.0.1")],
    );
    assert_eq!(
        ssh_endpoint(&ok),
        Some(SshEndpoint {
            host: "127.0.0.1".into(),
            port: 32768,
            user: Some("root".into())
        })
    );
    let stopped = summary(
        ContainerSummaryStateEnum::EXITED,
        vec![port(22, Some(1), "127.0.0.1")],
    );
    assert_eq!(ssh_endpoint(&stopped), None);
    let unpublished = summary(ContainerSummaryStateEnum::RUNNING, vec![port(22, None, "")]);
    assert_eq!(ssh_endpoint(&unpublished), None);
    let other = summary(
        ContainerSummaryStateEnum::RUNNING,
        vec![port(8080, Some(40000), "127.0.0.1")],
    );
    assert_eq!(ssh_endpoint(&other), None);
}

#[test]
fn container_name_uses_lineage_prefix() {
    assert_eq!(
        DockerProvider::container_name("gpu1", "0123456789abcdef"),
        "gpuprov-gpu1-01234567"
    );
}

#[test]
fn dead_reason_mentions_code_and_error() {
    let r = dead_reason(Some(137), Some("oom"), None);
    assert!(r.contains("137") && r.contains("oom"), "{r}");
    assert!(dead_reason(None, None, Some("Dead")).contains("Dead"));
}

#[test]
fn settings_default_base_image() {
    let s = DockerSettings::from_env_and_config(None, None, Lineage::random());
    assert_eq!(s.base_image, DEFAULT_BASE_IMAGE);
    let s = DockerSettings::from_env_and_config(None, Some("x/y:z".into()), Lineage::random());
    assert_eq!(s.base_image, "x/y:z");
}
