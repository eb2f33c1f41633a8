//! Unit tests of the GCP adapter's pure parts: the error table on Google's own body
//! shapes, names and ids, the insert body, statuses, the credential lookup and the JWT.

use std::collections::BTreeMap;

use serde_json::json;

use super::api::{self, Instance};
use super::auth::{self, GoogleCredential, Kind};
use super::errors::{self, OperationError, CLASSIFIER, CREATE, PREPARE};
use super::*;
use crate::provider::identity::owner;
use crate::provider::kit::{Call, Failure, Source};
use crate::provider::{BlockScope, ErrorKind, Lineage};

const LINEAGE: &str = "0f0e0d0c-1111-4222-8333-444455556666";
const KEY_PEM: &str = include_str!("../../../../tests/fixtures/gcp/test-only-sa-key.pem");
const PUB_PEM: &str = include_str!("../../../../tests/fixtures/gcp/test-only-sa-key.pub.pem");

fn lineage() -> Lineage {
    Lineage::parse(LINEAGE).unwrap()
}

/// Google's JSON error body for an HTTP error.
fn google(code: u16, reason: &str, status: &str, message: &str) -> String {
    json!({"error": {
        "code": code,
        "message": message,
        "errors": [{"message": message, "domain": "global", "reason": reason}],
        "status": status,
    }})
    .to_string()
}

fn classify_http(status: u16, body: &str, call: &'static str) -> ProviderError {
    let (code, message) = errors::decode(status, Some("application/json; charset=UTF-8"), body);
    let f = Failure::http(status, code, message);
    CLASSIFIER.classify(&f, Call::named(call, "x").in_region("us-central1"), [])
}

/// An operation's error as `Operation.error` carries it.
fn op_error(code: &str, message: &str, details: serde_json::Value) -> OperationError {
    serde_json::from_value(
        json!({"errors": [{"code": code, "message": message, "errorDetails": details}]}),
    )
    .unwrap()
}

fn classify_op(code: &str, message: &str, details: serde_json::Value, http: i64) -> ProviderError {
    let f = errors::operation_failure(&op_error(code, message, details), Some(http));
    CLASSIFIER.classify(&f, Call::named(CREATE, "x").in_region("us-central1"), [])
}

#[test]
fn late_stockouts_are_capacity_of_the_zone() {
    for code in [
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    ] {
        let e = classify_op(
            code,
            "The zone 'projects/p/zones/us-central1-a' does not have enough resources available to fulfill the request.  '(resource type:compute)'.",
            json!([]),
            503,
        );
        assert_eq!(e.kind, ErrorKind::Capacity, "{code}: {e}");
        assert_eq!(e.block, None, "the core blocks the offer (one zone)");
        assert!(e.msg.contains(code), "{}", e.msg);
    }
    let e = classify_http(
        400,
        &google(
            400,
            "resourceNotReady",
            "FAILED_PRECONDITION",
            "The resource is not ready",
        ),
        CREATE,
    );
    assert_eq!(e.kind, ErrorKind::Capacity);
    let e = classify_http(
        400,
        &google(
            400,
            "resourceNotReady",
            "FAILED_PRECONDITION",
            "The resource is not ready",
        ),
        "delete",
    );
    assert_eq!(
        e.kind,
        ErrorKind::Transient,
        "not capacity outside a create"
    );
    let e = classify_op(
        "UNSUPPORTED_OPERATION",
        "The accelerator type is not supported in this zone",
        json!([]),
        400,
    );
    assert_eq!(e.kind, ErrorKind::Capacity);
}

#[test]
fn quotas_block_the_region_or_the_whole_cloud() {
    let regional = classify_op(
        "QUOTA_EXCEEDED",
        "Quota 'NVIDIA_H100_GPUS' exceeded.  Limit: 0.0 in region us-central1.",
        json!([{"quotaInfo": {"metricName": "compute.googleapis.com/nvidia_h100_gpus", "limitName": "NVIDIA-H100-GPUS-per-project-region", "dimensions": {"region": "us-central1"}, "limit": 0.0}}]),
        403,
    );
    assert_eq!(regional.kind, ErrorKind::Quota);
    assert_eq!(regional.block, None, "the core's default: the region");
    let global = classify_op(
        "QUOTA_EXCEEDED",
        "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally.",
        json!([{"quotaInfo": {"metricName": "compute.googleapis.com/gpus_all_regions", "limitName": "GPUS-ALL-REGIONS-per-project", "limit": 0.0}}]),
        403,
    );
    assert_eq!(global.kind, ErrorKind::Quota);
    assert_eq!(
        global.block.as_deref(),
        Some(&BlockScope::Cloud {
            cloud: "gcp".into()
        })
    );
    let http = classify_http(
        403,
        &google(
            403,
            "quotaExceeded",
            "PERMISSION_DENIED",
            "Quota 'NVIDIA_A100_GPUS' exceeded.  Limit: 0.0 in region us-east1.",
        ),
        CREATE,
    );
    assert_eq!((http.kind, http.block.clone()), (ErrorKind::Quota, None));
    let http_all = classify_http(
        403,
        &google(
            403,
            "quotaExceeded",
            "PERMISSION_DENIED",
            "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 1.0 globally.",
        ),
        CREATE,
    );
    assert_eq!(
        http_all.block.as_deref(),
        Some(&BlockScope::Cloud {
            cloud: "gcp".into()
        })
    );
}

#[test]
fn rate_limits_and_backend_errors_are_transient() {
    for (status, reason, st) in [
        (403, "rateLimitExceeded", "PERMISSION_DENIED"),
        (403, "userRateLimitExceeded", "PERMISSION_DENIED"),
        (429, "rateLimitExceeded", "RESOURCE_EXHAUSTED"),
        (500, "backendError", "INTERNAL"),
        (503, "backendError", "UNAVAILABLE"),
        (502, "", ""),
    ] {
        let e = classify_http(
            status,
            &google(status, reason, st, "Rate Limit Exceeded"),
            CREATE,
        );
        assert_eq!(e.kind, ErrorKind::Transient, "{status} {reason}: {e}");
    }
    let e = classify_http(502, &crate::provider::kit::testing::proxy_page(), "other");
    assert_eq!(e.kind, ErrorKind::Transient);
    assert!(
        e.msg.len() < 200,
        "a proxy's page is one short line: {}",
        e.msg
    );
}

#[test]
fn refused_credentials_say_what_to_check() {
    for (status, reason, st) in [
        (403, "accessNotConfigured", "PERMISSION_DENIED"),
        (403, "forbidden", "PERMISSION_DENIED"),
        (403, "insufficientPermissions", "PERMISSION_DENIED"),
        (401, "authError", "UNAUTHENTICATED"),
        (401, "required", "UNAUTHENTICATED"),
    ] {
        let e = classify_http(
            status,
            &google(
                status,
                reason,
                st,
                "Request had invalid authentication credentials.",
            ),
            "other",
        );
        assert_eq!(e.kind, ErrorKind::Credentials, "{reason}: {e}");
        assert!(e.help.is_some(), "{reason}");
    }
    let e = classify_http(
        403,
        &google(
            403,
            "accessNotConfigured",
            "PERMISSION_DENIED",
            "Compute Engine API has not been used in project 1 before or it is disabled.",
        ),
        "other",
    );
    assert!(
        e.help
            .as_deref()
            .unwrap()
            .contains("compute.googleapis.com"),
        "{e:?}"
    );
    // The token endpoint's own shape (RFC 6749 5.2).
    let f = errors::token_failure(
        400,
        Some("application/json"),
        r#"{"error": "invalid_grant", "error_description": "Invalid JWT Signature."}"#,
    );
    let e = CLASSIFIER.classify(&f, Call::other("list instances"), []);
    assert_eq!(e.kind, ErrorKind::Credentials);
    assert!(
        e.msg.contains("invalid_grant") && e.msg.contains("Invalid JWT Signature."),
        "{}",
        e.msg
    );
    let f = errors::token_failure(
        503,
        Some("application/json"),
        r#"{"error": "temporarily_unavailable"}"#,
    );
    assert_eq!(
        CLASSIFIER.classify(&f, Call::other("x"), []).kind,
        ErrorKind::Transient
    );
}

#[test]
fn bad_asks_are_invalid_requests_and_unknown_reasons_never_capacity() {
    for reason in ["invalid", "badRequest", "required"] {
        let e = classify_http(
            400,
            &google(
                400,
                reason,
                "INVALID_ARGUMENT",
                "Invalid value for field 'resource.disks[0]'",
            ),
            CREATE,
        );
        assert_eq!(e.kind, ErrorKind::InvalidRequest, "{reason}");
    }
    let e = classify_http(
        404,
        &google(
            404,
            "notFound",
            "NOT_FOUND",
            "The resource 'projects/p/global/images/family/x' was not found",
        ),
        PREPARE,
    );
    assert_eq!(e.kind, ErrorKind::InvalidRequest);
    let e = classify_http(
        404,
        &google(404, "notFound", "NOT_FOUND", "not found"),
        "other",
    );
    assert_eq!(e.kind, ErrorKind::Failed);
    let e = classify_http(
        400,
        &google(
            400,
            "somethingNew",
            "FAILED_PRECONDITION",
            "out of capacity, maybe",
        ),
        CREATE,
    );
    assert_eq!(
        e.kind,
        ErrorKind::Failed,
        "an unknown reason is never capacity"
    );
    let e = classify_op("SOMETHING_NEW", "no resources", json!([]), 400);
    assert_eq!(e.kind, ErrorKind::Failed);
    let e = classify_op("SOMETHING_NEW", "x", json!([]), 503);
    assert_eq!(
        e.kind,
        ErrorKind::Transient,
        "a 5xx operation error follows the kit's default"
    );
}

#[test]
fn names_ids_and_labels() {
    let l = lineage();
    let n = api::instance_name("trainer", &l, "gpuprov-0f0e0d0c-trainer-r0-o3");
    assert!(
        n.starts_with("gpuprov-trainer-0f0e0d0c-")
            && n.len() == "gpuprov-trainer-0f0e0d0c-".len() + 4,
        "{n}"
    );
    assert_eq!(
        n,
        api::instance_name("trainer", &l, "gpuprov-0f0e0d0c-trainer-r0-o3"),
        "stable"
    );
    assert_ne!(
        n,
        api::instance_name("trainer", &l, "gpuprov-0f0e0d0c-trainer-r0-o4"),
        "per attempt"
    );
    assert!(api::is_instance_name(&n, "trainer", &l));
    assert!(!api::is_instance_name(&n, "train", &l));
    let longest = "a".repeat(40);
    let long = api::instance_name(&longest, &l, "t");
    assert!(long.len() <= 63, "{}", long.len());
    let other = api::instance_name("a-0f0e0d0c-b", &l, "t");
    assert!(
        !api::is_instance_name(&other, "a", &l),
        "VM a never claims VM a-0f0e0d0c-b's instance"
    );
    assert_eq!(api::vm_of_instance_name(&n, &l), Some("trainer"));
    assert_eq!(api::vm_of_instance_name(&other, &l), Some("a-0f0e0d0c-b"));
    for not in [
        "gpuprov-trainer-0f0e0d0c-12",
        "gpuprov--0f0e0d0c-abcd",
        "my-vm",
    ] {
        assert_eq!(api::vm_of_instance_name(not, &l), None, "{not}");
    }
    let id = api::request_id("gpuprov-0f0e0d0c-trainer-r0-o3");
    let parsed = uuid::Uuid::parse_str(&id).unwrap();
    assert_ne!(parsed, uuid::Uuid::nil());
    assert_eq!(id, api::request_id("gpuprov-0f0e0d0c-trainer-r0-o3"));
    assert_ne!(id, api::request_id("gpuprov-0f0e0d0c-trainer-r0-o4"));
    let labels: BTreeMap<String, String> =
        serde_json::from_value(api::labels("trainer", &l)).unwrap();
    // The listing shows the labels as they are; the identity rule reads them back.
    let listed = Instance {
        name: n.clone(),
        labels,
        ..Instance::default()
    };
    let shown = api::seen(&listed).identity;
    assert_eq!(shown, Shown::labels(Some("trainer"), Some(LINEAGE)));
    assert_eq!(owner(&shown, &l, "us-central1").as_deref(), Some("trainer"));
    assert_eq!(
        api::label_filter("trainer", &l),
        format!("(labels.gpuprov-vm-name = \"trainer\") (labels.gpuprov-lineage = \"{LINEAGE}\")")
    );
    assert_eq!(api_base(None), "https://compute.googleapis.com/compute/v1");
    assert_eq!(
        api_base(Some("http://127.0.0.1:9/")),
        "http://127.0.0.1:9/compute/v1"
    );
    assert_eq!(
        api_base(Some("http://127.0.0.1:9/compute/v1")),
        "http://127.0.0.1:9/compute/v1"
    );
}

fn insert_args<'a>(l: &'a Lineage, spot: bool) -> api::InsertArgs<'a> {
    api::InsertArgs {
        name: "gpuprov-trainer-0f0e0d0c-abcd",
        zone: "us-central1-a",
        vm: "trainer",
        lineage: l,
        image: "https://www.googleapis.com/compute/v1/projects/x/global/images/img",
        network_tag: "gpuprov-trainer-0f0e0d0c",
        disk_gb: Some(500),
        spot,
        ssh_public_key: "ssh-ed25519 AAAAC3 gpuprov\n",
        user_data: Some("#cloud-config\n".into()),
    }
}

#[test]
fn the_insert_body_attaches_n1_gpus_and_sets_gpu_scheduling() {
    let l = lineage();
    let t4 = catalog::lookup("n1-standard-8", "nvidia-tesla-t4").unwrap();
    let b = api::insert_body(t4, &insert_args(&l, true));
    assert_eq!(
        b["machineType"],
        "zones/us-central1-a/machineTypes/n1-standard-8"
    );
    assert_eq!(
        b["guestAccelerators"][0]["acceleratorType"],
        "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4"
    );
    assert_eq!(b["guestAccelerators"][0]["acceleratorCount"], 1);
    assert_eq!(b["scheduling"]["onHostMaintenance"], "TERMINATE");
    assert_eq!(b["scheduling"]["provisioningModel"], "SPOT");
    assert_eq!(b["scheduling"]["instanceTerminationAction"], "DELETE");
    assert_eq!(b["disks"][0]["initializeParams"]["diskSizeGb"], "500");
    assert_eq!(
        b["disks"][0]["initializeParams"]["diskType"],
        "zones/us-central1-a/diskTypes/pd-balanced"
    );
    assert_eq!(b["labels"]["gpuprov-vm-name"], "trainer");
    assert_eq!(b["labels"]["gpuprov-lineage"], LINEAGE);
    assert_eq!(b["tags"]["items"][0], "gpuprov-trainer-0f0e0d0c");
    let items = b["metadata"]["items"].as_array().unwrap();
    assert!(
        items.contains(&json!({"key": "ssh-keys", "value": "gpuprov:ssh-ed25519 AAAAC3 gpuprov"}))
    );
    assert!(items.iter().any(|i| i["key"] == "user-data"));
    let a3 = catalog::lookup("a3-ultragpu-8g", "nvidia-h200-141gb").unwrap();
    let b = api::insert_body(a3, &insert_args(&l, false));
    assert!(b.get("guestAccelerators").is_none(), "A3 carries its GPUs");
    assert_eq!(b["networkInterfaces"][0]["nicType"], "GVNIC");
    assert_eq!(
        b["disks"][0]["initializeParams"]["diskType"],
        "zones/us-central1-a/diskTypes/hyperdisk-balanced"
    );
    assert_eq!(b["scheduling"]["automaticRestart"], true);
    assert_eq!(b["scheduling"]["provisioningModel"], "STANDARD");
}

#[test]
fn statuses_and_the_ssh_endpoint() {
    let inst = |status: &str, ip: Option<&str>| -> Instance {
        serde_json::from_value(json!({
            "name": "n", "status": status,
            "networkInterfaces": [{"accessConfigs": [{"natIP": ip}]}]
        }))
        .unwrap()
    };
    let (s, ssh) = api::status_of(&inst("RUNNING", Some("127.0.0.9")));
    assert_eq!(s, InstanceStatus::Running);
    let ssh = ssh.unwrap();
    assert_eq!(
        (ssh.host.as_str(), ssh.port, ssh.user.as_deref()),
        ("127.0.0.9", 22, Some("gpuprov"))
    );
    assert_eq!(
        api::status_of(&inst("RUNNING", None)).0,
        InstanceStatus::Pending,
        "no address yet"
    );
    for (st, want) in [
        ("PROVISIONING", InstanceStatus::Pending),
        ("STAGING", InstanceStatus::Pending),
        ("STOPPING", InstanceStatus::Stopping),
        ("SUSPENDING", InstanceStatus::Stopping),
        ("SUSPENDED", InstanceStatus::Stopped),
        ("TERMINATED", InstanceStatus::Stopped),
    ] {
        assert_eq!(api::status_of(&inst(st, None)).0, want, "{st}");
    }
    assert!(matches!(
        api::status_of(&inst("WHATEVER", None)).0,
        InstanceStatus::Failed(_)
    ));
}

#[test]
fn the_listing_shows_type_price_and_creation_time() {
    let zone = "https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-a";
    let listed: Instance = serde_json::from_value(json!({
        "name": "gpuprov-trainer-0f0e0d0c-abcd", "status": "RUNNING",
        "machineType": format!("{zone}/machineTypes/n1-standard-8"),
        "guestAccelerators": [{"acceleratorType": format!("{zone}/acceleratorTypes/nvidia-tesla-t4"), "acceleratorCount": 1}],
        "scheduling": {"provisioningModel": "SPOT"},
        "creationTimestamp": "2026-12-02T10:00:00.000-08:00",
        "labels": {"team": "ml"},
    }))
    .unwrap();
    let seen = api::seen(&listed);
    assert_eq!(seen.instance_id, "gpuprov-trainer-0f0e0d0c-abcd");
    assert_eq!(
        seen.instance_type.as_deref(),
        Some("n1-standard-8+nvidia-tesla-t4")
    );
    assert_eq!(seen.price_per_hour, Some(0.292), "the catalog's spot price");
    assert_eq!(
        seen.created_at.map(|t| t.to_rfc3339()).as_deref(),
        Some("2026-12-02T18:00:00+00:00")
    );
    assert_eq!(seen.identity, Shown::default(), "no identity labels");
}

#[test]
fn a_stopped_spot_or_preemptible_vm_is_preempted() {
    let inst = |status: &str, scheduling: serde_json::Value| -> Instance {
        serde_json::from_value(json!({
            "name": "n", "status": status, "scheduling": scheduling,
            "statusMessage": "Instance was preempted."
        }))
        .unwrap()
    };
    let spot = json!({"provisioningModel": "SPOT", "instanceTerminationAction": "STOP"});
    assert_eq!(
        api::status_of(&inst("TERMINATED", spot.clone())).0,
        InstanceStatus::Preempted {
            signal: "spot VM TERMINATED: Instance was preempted.".into(),
            stopped: true
        }
    );
    assert!(matches!(
        api::status_of(&inst("STOPPED", json!({"preemptible": true}))).0,
        InstanceStatus::Preempted { stopped: true, .. }
    ));
    // Not spot: a stopped VM; spot but running: running (or booting).
    assert_eq!(
        api::status_of(&inst(
            "TERMINATED",
            json!({"provisioningModel": "STANDARD"})
        ))
        .0,
        InstanceStatus::Stopped
    );
    assert_eq!(
        api::status_of(&inst("STAGING", spot)).0,
        InstanceStatus::Pending
    );
}

fn sa_json(token_uri: &str) -> String {
    json!({
        "type": "service_account",
        "project_id": "gpuprov-test",
        "private_key_id": "k1",
        "private_key": KEY_PEM,
        "client_email": "gpuprov@gpuprov-test.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": token_uri,
    })
    .to_string()
}

#[test]
fn the_lookup_follows_adc_order_and_never_asks_a_metadata_server_off_gce() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key.json");
    std::fs::write(&key, sa_json("http://127.0.0.1:9/token")).unwrap();
    let adc = dir.path().join("application_default_credentials.json");
    std::fs::write(&adc, json!({"type": "authorized_user", "client_id": "c", "client_secret": "s", "refresh_token": "r", "quota_project_id": "q"}).to_string()).unwrap();
    let key_s = key.display().to_string();
    let env = |k: &str| (k == auth::CREDENTIALS_ENV).then(|| key_s.clone());
    let f = auth::find(env, Some(&adc), false);
    let c = f.credential.unwrap().unwrap();
    assert!(matches!(c.kind, Kind::ServiceAccount(_)));
    assert_eq!(c.project(), Some("gpuprov-test"));
    assert!(
        c.source
            .to_string()
            .contains("GOOGLE_APPLICATION_CREDENTIALS"),
        "{}",
        c.source
    );
    let f = auth::find(|_| None, Some(&adc), false);
    let c = f.credential.unwrap().unwrap();
    assert!(matches!(c.kind, Kind::AuthorizedUser(_)));
    assert_eq!(c.project(), Some("q"));
    let f = auth::find(|_| None, Some(&dir.path().join("absent.json")), false);
    assert!(
        f.credential.unwrap().is_none(),
        "off Compute Engine, no metadata server"
    );
    assert_eq!(f.looked_in.len(), 3, "{:?}", f.looked_in);
    let f = auth::find(
        |k| (k == auth::METADATA_HOST_ENV).then(|| "127.0.0.1:9".into()),
        None,
        false,
    );
    assert!(matches!(f.credential.unwrap().unwrap().kind, Kind::Metadata(h) if h == "127.0.0.1:9"));
    let f = auth::find(|_| None, None, true);
    assert!(
        matches!(f.credential.unwrap().unwrap().kind, Kind::Metadata(h) if h == auth::METADATA_HOST)
    );
    // A file that is not a credential is reported, without its content.
    std::fs::write(&key, r#"{"type": "external_account", "secret": "s3cr3t"}"#).unwrap();
    let why = auth::find(env, None, false).credential.unwrap_err();
    assert!(
        why.contains("external_account") && !why.contains("s3cr3t"),
        "{why}"
    );
    std::fs::write(&key, "not json s3cr3t").unwrap();
    let why = auth::find(env, None, false).credential.unwrap_err();
    assert!(!why.contains("s3cr3t"), "{why}");
}

#[test]
fn the_jwt_is_rs256_signed_for_googles_token_endpoint() {
    let c = GoogleCredential::from_json(
        &sa_json("http://127.0.0.1:9/token"),
        Source::Other("t".into()),
    )
    .unwrap();
    let Kind::ServiceAccount(key) = &c.kind else {
        panic!()
    };
    let jwt = auth::assertion(key, auth::SCOPE, 1_700_000_000).unwrap();
    let header = jsonwebtoken::decode_header(&jwt).unwrap();
    assert_eq!(header.alg, jsonwebtoken::Algorithm::RS256);
    assert_eq!(header.kid.as_deref(), Some("k1"));
    let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    v.validate_exp = false;
    v.set_audience(&[auth::TOKEN_ENDPOINT]);
    let dk = jsonwebtoken::DecodingKey::from_rsa_pem(PUB_PEM.as_bytes()).unwrap();
    let claims = jsonwebtoken::decode::<auth::Claims>(&jwt, &dk, &v)
        .unwrap()
        .claims;
    assert_eq!(claims.iss, "gpuprov@gpuprov-test.iam.gserviceaccount.com");
    assert_eq!(claims.scope, auth::SCOPE);
    assert_eq!(claims.exp - claims.iat, 3600);
    assert!(
        !format!("{c:?}").contains("PRIVATE KEY"),
        "Debug shows no key"
    );
    let mut bad = (**key).clone();
    bad.private_key = crate::provider::Secret::new(
        "-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n",
    );
    assert!(auth::assertion(&bad, auth::SCOPE, 1).is_err());
}

#[tokio::test]
async fn without_a_credential_plan_is_the_catalog_and_calls_say_where_it_looked() {
    let p = GcpProvider::new(GcpSettings {
        looked_in: vec!["the GOOGLE_APPLICATION_CREDENTIALS environment variable".into()],
        ..GcpSettings::with_credential(lineage(), Some("http://127.0.0.1:9".into()), None, None)
    });
    let offers = p
        .plan(&crate::provider::kit::testing::ask(
            Some("H100"),
            8,
            &["us-central1"],
        ))
        .await
        .unwrap();
    assert!(!offers.is_empty() && offers.iter().all(|o| o.detail["zones_from"] == "catalog"));
    let at = Location {
        cloud: "gcp".into(),
        region: "us-central1".into(),
        zone: Some("us-central1-a".into()),
    };
    let e = p.observe(&at, "trainer").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Credentials);
    assert!(
        e.msg.contains("GOOGLE_APPLICATION_CREDENTIALS"),
        "{}",
        e.msg
    );
    assert!(p.credentials().await.is_missing());
    assert_eq!(p.endpoint_override().as_deref(), Some("http://127.0.0.1:9"));
}
