//! Unit tests of the AWS adapter's pure parts: tokens, statuses and preemption, what
//! the listing shows, the credential chain's errors and the declared features.

use super::*;

#[test]
fn client_token_fits_ec2_limit_and_is_stable() {
    assert_eq!(client_token("short"), "short");
    let long = "x".repeat(100);
    let t = client_token(&long);
    assert_eq!(t.len(), CLIENT_TOKEN_MAX);
    assert_eq!(t, client_token(&long));
    assert_ne!(t, client_token(&"y".repeat(100)));
}

#[test]
fn status_mapping() {
    use InstanceStateName as S;
    assert_eq!(status_of(Some(&S::Pending), None), InstanceStatus::Pending);
    assert_eq!(status_of(Some(&S::Running), None), InstanceStatus::Running);
    assert_eq!(
        status_of(Some(&S::Stopping), None),
        InstanceStatus::Stopping
    );
    assert_eq!(status_of(Some(&S::Stopped), None), InstanceStatus::Stopped);
    assert_eq!(
        status_of(Some(&S::ShuttingDown), None),
        InstanceStatus::Terminating
    );
    assert!(matches!(status_of(None, None), InstanceStatus::Failed(_)));
}

#[test]
fn the_listing_shows_tags_name_type_price_and_launch_time() {
    use aws_sdk_ec2::types::{Instance, InstanceState};
    let lineage = "0f0e0d0c-1111-4222-8333-444455556666";
    let listed = |state: InstanceStateName| {
        Instance::builder()
            .instance_id("i-0123456789abcdef0")
            .tags(tag(IDENTITY_LABEL, "trainer"))
            .tags(tag(LINEAGE_LABEL, lineage))
            .tags(tag("Name", "gpuprov-trainer-0f0e0d0c"))
            .state(InstanceState::builder().name(state).build())
            .public_ip_address("203.0.113.7")
            .instance_type(InstanceType::P548xlarge)
            .launch_time(aws_sdk_ec2::primitives::DateTime::from_secs(1_764_698_400))
            .build()
    };
    let seen = seen_of(&listed(InstanceStateName::Running)).unwrap();
    assert_eq!(seen.instance_id, "i-0123456789abcdef0");
    assert_eq!(
        seen.identity,
        Shown::labels(Some("trainer"), Some(lineage))
            .named(Some("gpuprov-trainer-0f0e0d0c"), Naming::Object)
    );
    assert_eq!(seen.status, InstanceStatus::Running);
    assert_eq!(seen.ssh.unwrap().to_string(), "ubuntu@203.0.113.7:22");
    assert_eq!(seen.instance_type.as_deref(), Some("p5.48xlarge"));
    assert_eq!(seen.price_per_hour, Some(55.04), "the catalog's list price");
    assert_eq!(
        seen.created_at.map(|t| t.to_rfc3339()).as_deref(),
        Some("2025-12-02T18:00:00+00:00")
    );
    assert!(
        seen_of(&listed(InstanceStateName::Terminated)).is_none(),
        "terminated and not preempted: gone"
    );
}

#[test]
fn spot_interruption_reasons_map_to_preempted() {
    use InstanceStateName as S;
    let reason = |code: &str| {
        StateReason::builder()
            .code(code)
            .message(format!("{code}: spot capacity"))
            .build()
    };
    let term = reason("Server.SpotInstanceTermination");
    let spot = Some(&InstanceLifecycleType::Spot);
    let gone = preemption_of(Some(&S::Terminated), spot, Some(&term)).unwrap();
    assert!(
        matches!(&gone, InstanceStatus::Preempted { stopped: false, signal } if signal.starts_with("Server.SpotInstanceTermination")),
        "{gone:?}"
    );
    // EC2's message repeats the code: said once.
    assert_eq!(
        gone.to_string(),
        "preempted by the cloud (Server.SpotInstanceTermination: spot capacity)"
    );
    let bare = StateReason::builder()
        .code("Server.SpotInstanceTermination")
        .message("spot capacity")
        .build();
    assert!(matches!(
        preemption_of(Some(&S::Terminated), spot, Some(&bare)),
        Some(InstanceStatus::Preempted { signal, .. })
            if signal == "Server.SpotInstanceTermination: spot capacity"
    ));
    assert!(matches!(
        preemption_of(Some(&S::ShuttingDown), None, Some(&term)),
        Some(InstanceStatus::Preempted { stopped: false, .. })
    ));
    let shut = reason("Server.SpotInstanceShutdown");
    assert!(matches!(
        preemption_of(Some(&S::Stopped), spot, Some(&shut)),
        Some(InstanceStatus::Preempted { stopped: true, .. })
    ));
    // Not a spot interruption: the state decides.
    let user = reason("Client.UserInitiatedShutdown");
    assert_eq!(preemption_of(Some(&S::Terminated), spot, Some(&user)), None);
    assert_eq!(preemption_of(Some(&S::Stopped), spot, None), None);
    assert_eq!(
        preemption_of(
            Some(&S::Terminated),
            Some(&InstanceLifecycleType::Scheduled),
            Some(&term)
        ),
        None
    );
    // A running spot instance is running, whatever its last reason said.
    assert_eq!(preemption_of(Some(&S::Running), spot, Some(&shut)), None);
}

#[test]
fn debug_never_shows_secrets() {
    let s = AwsSettings {
        credentials: Some(StaticCredentials {
            access_key_id: "AKIASECRET".into(),
            secret_access_key: "topsecret".into(),
        }),
        ..AwsSettings::new(Lineage::random())
    };
    let d = format!("{s:?}");
    assert!(!d.contains("topsecret") && !d.contains("AKIASECRET"), "{d}");
}

#[derive(Debug)]
struct NoCredentials;
impl ProvideCredentials for NoCredentials {
    fn provide_credentials<'a>(
        &'a self,
    ) -> aws_credential_types::provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        aws_credential_types::provider::future::ProvideCredentials::ready(Err(
            aws_credential_types::provider::error::CredentialsError::not_loaded(
                "no providers in chain provided credentials",
            ),
        ))
    }
}

#[derive(Debug)]
struct Hangs;
impl ProvideCredentials for Hangs {
    fn provide_credentials<'a>(
        &'a self,
    ) -> aws_credential_types::provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        aws_credential_types::provider::future::ProvideCredentials::new(std::future::pending())
    }
}

#[tokio::test]
async fn missing_credentials_are_a_clear_error_never_a_hang() {
    let e = resolve_credentials(
        Some(SharedCredentialsProvider::new(NoCredentials)),
        Duration::from_secs(5),
    )
    .await
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Credentials);
    assert!(e.msg.contains("AWS_ACCESS_KEY_ID") && e.msg.contains("~/.aws/config"));
    assert!(
        e.msg.contains("no providers in chain provided credentials") && !e.msg.contains('{'),
        "the chain's text, never its Debug: {}",
        e.msg
    );
    let started = std::time::Instant::now();
    let e = resolve_credentials(
        Some(SharedCredentialsProvider::new(Hangs)),
        Duration::from_millis(200),
    )
    .await
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Credentials);
    assert!(e.msg.contains("within"), "{}", e.msg);
    assert!(started.elapsed() < Duration::from_secs(5));
    let e = resolve_credentials(None, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Credentials);
}

#[test]
fn security_group_name_uses_lineage_prefix() {
    assert_eq!(
        AwsProvider::security_group_name("gpu1", "0123456789abcdef"),
        "gpuprov-gpu1-01234567"
    );
}

#[test]
fn a_missing_profile_is_named_with_the_files_looked_at() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config");
    let credentials = dir.path().join("credentials");
    // Neither file exists.
    let e = missing_profile("prod", &config, &credentials).expect("missing");
    assert_eq!(e.kind, ErrorKind::Credentials);
    assert!(e.msg.contains("`prod`"), "{}", e.msg);
    assert!(
        e.msg.contains(&config.display().to_string())
            && e.msg.contains(&credentials.display().to_string()),
        "{}",
        e.msg
    );
    std::fs::write(&config, "[default]\nregion = us-east-1\n[profile dev]\n").unwrap();
    std::fs::write(&credentials, "[ci]\naws_access_key_id = x\n").unwrap();
    assert!(missing_profile("prod", &config, &credentials).is_some());
    assert!(missing_profile("dev", &config, &credentials).is_none());
    assert!(missing_profile("ci", &config, &credentials).is_none());
    assert!(missing_profile("default", &config, &credentials).is_none());
    std::fs::write(&config, "[profile   prod ]\n").unwrap();
    assert!(missing_profile("prod", &config, &credentials).is_none());
}

#[tokio::test]
async fn a_missing_profile_stops_before_any_request() {
    let aws = AwsProvider::new(AwsSettings {
        profile: Some("gpuprov-no-such-profile-4e1f".into()),
        // Never dialled: the profile check comes first.
        endpoint: Some("http://127.0.0.1:9".into()),
        ..AwsSettings::new("5f0c2a7e-1b2d-4c3e-9f10-aabbccddeeff".parse().unwrap())
    });
    let at = Location {
        cloud: CLOUD.into(),
        region: "us-east-1".into(),
        zone: None,
    };
    let e = aws.observe(&at, "trainer").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Credentials, "{e:?}");
    assert!(
        e.msg.contains("`gpuprov-no-such-profile-4e1f`"),
        "{}",
        e.msg
    );
    assert!(e.msg.contains("config") && e.msg.contains("credentials"));
}

#[test]
fn start_is_declared() {
    assert!(AwsSettings::default_capabilities()
        .supported
        .contains(&Feature::Start));
}
