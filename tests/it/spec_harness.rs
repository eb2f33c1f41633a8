//! Tests of the spec-checked adapter harness itself (`tests/it/support/spec.rs`): matching,
//! query and body checks, fixture validation at mount time, OpenAPI 3.0 conversion, and a
//! failing `verify` for requests that break the spec.

use crate::support::spec;

use std::sync::Arc;

use serde_json::json;
use spec::{Canned, Spec, SpecServer};

#[test]
fn literal_paths_win_over_templates() {
    let s = spec::lambda();
    let global = s
        .check_request("GET", "/api/v1/firewall-rulesets/global", &[], None)
        .unwrap();
    assert_eq!(global.template, "/api/v1/firewall-rulesets/global");
    let by_id = s
        .check_request("GET", "/api/v1/firewall-rulesets/abc123", &[], None)
        .unwrap();
    assert_eq!(by_id.template, "/api/v1/firewall-rulesets/{id}");
}

#[test]
fn unknown_paths_methods_and_query_parameters_are_rejected() {
    let s = spec::lambda();
    let e = s
        .check_request("GET", "/api/v1/nope", &[], None)
        .unwrap_err();
    assert!(e.contains("no such path"), "{e}");
    let e = s
        .check_request("DELETE", "/api/v1/instance-types", &[], None)
        .unwrap_err();
    assert!(e.contains("method not allowed"), "{e}");
    let q = vec![("tag".to_string(), "x".to_string())];
    let e = s
        .check_request("GET", "/api/v1/instances", &q, None)
        .unwrap_err();
    assert!(e.contains("`tag` is not declared"), "{e}");
    let q = vec![("cluster_id".to_string(), "c1".to_string())];
    s.check_request("GET", "/api/v1/instances", &q, None)
        .unwrap();
}

#[test]
fn request_bodies_are_validated() {
    let s = spec::lambda();
    let path = "/api/v1/instance-operations/launch";
    let good = json!({
        "region_name": "us-east-1",
        "instance_type_name": "gpu_1x_a100",
        "ssh_key_names": ["k"],
        "tags": [{"key": "gpuprov-vm-name", "value": "a"}]
    });
    s.check_request("POST", path, &[], Some(&good)).unwrap();
    let bad_tag = json!({
        "region_name": "us-east-1",
        "instance_type_name": "gpu_1x_a100",
        "ssh_key_names": ["k"],
        "tags": [{"key": "Not Valid", "value": "a"}]
    });
    assert!(s.check_request("POST", path, &[], Some(&bad_tag)).is_err());
    let e = s.check_request("POST", path, &[], None).unwrap_err();
    assert!(e.contains("required request body missing"), "{e}");
    let e = s
        .check_request("GET", "/api/v1/instances", &[], Some(&json!({})))
        .unwrap_err();
    assert!(e.contains("none is declared"), "{e}");
}

#[test]
fn responses_are_validated_by_status() {
    let s = spec::lambda();
    let path = "/api/v1/instance-operations/launch";
    s.check_response(
        "POST",
        path,
        400,
        Some(&json!({"error": {
            "code": "instance-operations/launch/insufficient-capacity",
            "message": "Not enough capacity to fulfill launch request."
        }})),
    )
    .unwrap();
    let e = s
        .check_response(
            "POST",
            path,
            400,
            Some(&json!({"error": {"code": "made-up"}})),
        )
        .unwrap_err();
    assert!(e.contains("→ 400"), "{e}");
    assert!(s
        .check_response("POST", path, 200, Some(&json!({"data": {}})))
        .is_err());
    // The harness patches: 429 and 5XX carry the documented envelope.
    s.check_response(
        "POST",
        path,
        429,
        Some(&json!({"error": {"code": "global/too-many-requests", "message": "slow down"}})),
    )
    .unwrap();
    s.check_response(
        "GET",
        "/api/v1/instances",
        503,
        Some(&json!({"error": {"code": "provider/internal-unavailable", "message": "Provider unavailable"}})),
    )
    .unwrap();
}

#[test]
fn openapi_30_nullable_and_exclusive_bounds_are_converted() {
    let doc = json!({
        "openapi": "3.0.3",
        "info": {"title": "t", "version": "1"},
        "paths": {"/v1/things/{id}": {
            "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
            "get": {
                "parameters": [{"name": "page", "in": "query", "schema": {"type": "integer"}}],
                "responses": {"200": {"description": "ok", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Thing"}}}}}
            }
        }},
        "components": {"schemas": {
            "Thing": {"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string", "nullable": true},
                "size": {"type": "number", "minimum": 0, "exclusiveMinimum": true},
                "owner": {"allOf": [{"$ref": "#/components/schemas/Owner"}], "nullable": true}
            }},
            "Owner": {"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}}
        }}
    });
    let s = Spec::from_value(doc).with_base_path("/api");
    let q = vec![("page".to_string(), "2".to_string())];
    s.check_request("GET", "/api/v1/things/x", &q, None)
        .unwrap();
    let bad_q = vec![("page".to_string(), "two".to_string())];
    assert!(s
        .check_request("GET", "/api/v1/things/x", &bad_q, None)
        .is_err());
    let ok = json!({"name": null, "owner": null, "size": 1});
    s.check_response("GET", "/api/v1/things/x", 200, Some(&ok))
        .unwrap();
    let zero = json!({"name": "a", "size": 0});
    assert!(s
        .check_response("GET", "/api/v1/things/x", 200, Some(&zero))
        .is_err());
    let bad_owner = json!({"name": "a", "owner": {}});
    assert!(s
        .check_response("GET", "/api/v1/things/x", 200, Some(&bad_owner))
        .is_err());
}

#[tokio::test]
#[should_panic(expected = "canned response does not match the spec")]
async fn a_fixture_that_breaks_the_spec_fails_at_mount() {
    let server = SpecServer::start(Arc::new(spec::lambda())).await;
    server
        .mount(
            "GET",
            "/api/v1/instances",
            Canned::ok(json!({"data": [{"status": "sleeping"}]})),
            None,
        )
        .await;
}

#[tokio::test]
async fn requests_that_break_the_spec_are_recorded_and_fail_verify() {
    let server = SpecServer::start(Arc::new(spec::lambda())).await;
    server
        .mount(
            "GET",
            "/api/v1/instances",
            Canned::ok(json!({"data": []})),
            None,
        )
        .await;
    let http = reqwest::Client::new();
    let base = server.uri();
    // Good: declared operation, credentials.
    let r = http
        .get(format!("{base}/api/v1/instances"))
        .bearer_auth("k")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(server.violations().is_empty(), "{:?}", server.violations());
    // Undeclared query parameter, no credentials, and an unanswered request.
    http.get(format!("{base}/api/v1/instances?tag=x"))
        .bearer_auth("k")
        .send()
        .await
        .unwrap();
    http.get(format!("{base}/api/v1/instances"))
        .send()
        .await
        .unwrap();
    http.get(format!("{base}/api/v1/images"))
        .bearer_auth("k")
        .send()
        .await
        .unwrap();
    let v = server.violations();
    assert_eq!(v.len(), 3, "{v:?}");
    assert!(v[0].contains("`tag` is not declared"), "{v:?}");
    assert!(v[1].contains("no credentials"), "{v:?}");
    assert!(v[2].contains("no canned response"), "{v:?}");
    let verdict = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| server.verify()));
    assert!(verdict.is_err(), "verify must fail");
    std::mem::forget(server); // its Drop would fail the test again
}

/// The harness is built for the next adapters too: DigitalOcean's subset (OpenAPI 3.0,
/// YAML, `nullable`, `$ref`'d parameters and responses) and Hyperstack (3.0.1, a server
/// base path `/v1`) load, match and compile.
#[test]
fn openapi_30_yaml_documents_load_and_check() {
    let dir = spec::vendor_apis_dir();
    let d = Spec::load(dir.join("digitalocean/DigitalOcean-public.v2.gpuprov-subset.yaml"));
    let q = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
    d.check_request("GET", "/v2/droplets", &q("type", "gpus"), None)
        .unwrap();
    d.check_request(
        "GET",
        "/v2/droplets",
        &q("tag_name", "gpuprov-vm-name:a"),
        None,
    )
    .unwrap();
    let e = d
        .check_request("GET", "/v2/droplets", &q("type", "tpus"), None)
        .unwrap_err();
    assert!(e.contains("`type`"), "{e}");
    // A list response validates structurally (the schemas compile); a wrong shape fails.
    d.check_response(
        "GET",
        "/v2/droplets",
        200,
        Some(&json!({"droplets": [], "links": {}, "meta": {"total": 0}})),
    )
    .unwrap();
    let e = d
        .check_response("GET", "/v2/droplets", 200, Some(&json!({"droplets": 3})))
        .unwrap_err();
    assert!(!e.contains("does not compile"), "{e}");

    let h = Spec::load(dir.join("hyperstack/openapi.yaml")).with_base_path("/v1");
    let m = h
        .check_request("GET", "/v1/core/virtual-machines", &[], None)
        .unwrap();
    assert_eq!(m.template, "/core/virtual-machines");
}

/// Google's discovery format (issue 15): methods by `httpMethod` + `flatPath` under the
/// service path, parameters (path patterns, query types), closed request schemas with the
/// method's `annotations.required`, open responses, the bearer scheme and Google's error
/// body for 4xx/5xx.
#[test]
fn discovery_documents_load_and_check() {
    let s = spec::gcp();
    let zone = "/compute/v1/projects/p-1/zones/us-central1-a";
    let m = s
        .check_request(
            "GET",
            &format!("{zone}/instances/gpuprov-a-0f0e0d0c-ab12"),
            &[],
            None,
        )
        .unwrap();
    assert_eq!(m.operation_id.as_deref(), Some("compute.instances.get"));
    assert_eq!(
        m.template,
        "/projects/{project}/zones/{zone}/instances/{instance}"
    );
    let bulk = s
        .check_request(
            "POST",
            &format!("{zone}/instances/bulkInsert"),
            &[],
            Some(&json!({"count": "1"})),
        )
        .unwrap();
    assert_eq!(
        bulk.operation_id.as_deref(),
        Some("compute.instances.bulkInsert"),
        "literal wins"
    );
    // Path parameters carry the document's patterns.
    let e = s
        .check_request(
            "GET",
            "/compute/v1/projects/p-1/zones/US_CENTRAL/instances",
            &[],
            None,
        )
        .unwrap_err();
    assert!(e.contains("path parameter `zone`"), "{e}");
    // Query parameters: declared, typed, global ones included.
    let q = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
    s.check_request(
        "GET",
        &format!("{zone}/instances"),
        &q("maxResults", "500"),
        None,
    )
    .unwrap();
    s.check_request(
        "GET",
        &format!("{zone}/instances"),
        &q("prettyPrint", "false"),
        None,
    )
    .unwrap();
    let e = s
        .check_request(
            "GET",
            &format!("{zone}/instances"),
            &q("maxResults", "many"),
            None,
        )
        .unwrap_err();
    assert!(e.contains("maxResults"), "{e}");
    let e = s
        .check_request("GET", &format!("{zone}/instances"), &q("labels", "x"), None)
        .unwrap_err();
    assert!(e.contains("not declared"), "{e}");
    // Request bodies: closed, with the method's required fields.
    let ok = json!({"name": "gpuprov-a-0f0e0d0c-ab12", "machineType": "zones/us-central1-a/machineTypes/g2-standard-8",
        "disks": [{"boot": true, "initializeParams": {"diskSizeGb": "200"}}]});
    s.check_request(
        "POST",
        &format!("{zone}/instances"),
        &q("requestId", "x"),
        Some(&ok),
    )
    .unwrap();
    let e = s
        .check_request(
            "POST",
            &format!("{zone}/instances"),
            &[],
            Some(&json!({"machineType": "m"})),
        )
        .unwrap_err();
    assert!(
        e.contains("name"),
        "`name` is required by compute.instances.insert: {e}"
    );
    let typo = json!({"name": "a", "guestAcelerators": []});
    let e = s
        .check_request("POST", &format!("{zone}/instances"), &[], Some(&typo))
        .unwrap_err();
    assert!(
        e.contains("guestAcelerators"),
        "an undeclared field is refused: {e}"
    );
    let e = s
        .check_request(
            "POST",
            &format!("{zone}/instances"),
            &[],
            Some(&json!({"name": "a", "disks": [{"diskSizeGb": 200}]})),
        )
        .unwrap_err();
    assert!(
        e.contains("diskSizeGb"),
        "int64 travels as a string of digits: {e}"
    );
    // Responses: open schemas; errors in Google's error body.
    let op = json!({"kind": "compute#operation", "name": "operation-1", "status": "DONE", "somethingNew": 1});
    s.check_response("POST", &format!("{zone}/instances"), 200, Some(&op))
        .unwrap();
    let err = json!({"error": {"code": 403, "message": "Quota exceeded", "errors": [{"message": "Quota exceeded", "domain": "usageLimits", "reason": "quotaExceeded"}], "status": "PERMISSION_DENIED"}});
    s.check_response("POST", &format!("{zone}/instances"), 403, Some(&err))
        .unwrap();
    let e = s
        .check_response(
            "POST",
            &format!("{zone}/instances"),
            403,
            Some(&json!({"message": "no"})),
        )
        .unwrap_err();
    assert!(e.contains("error"), "{e}");
    let bad_status = json!({"name": "operation-1", "status": "FINISHED"});
    assert!(s
        .check_response(
            "GET",
            &format!("{zone}/operations/operation-1"),
            200,
            Some(&bad_status)
        )
        .is_err());
}

/// The GCP adapter's tests check against the subset of the discovery document (fast to
/// load); it must be the whole document cut, not an edited copy: every method and schema
/// it holds is the whole document's, unchanged, and every schema a method references is
/// in it.
#[test]
fn the_gcp_subset_is_the_whole_document_cut() {
    let whole = spec::gcp_whole_document();
    let subset = spec::gcp_subset_document();
    assert_eq!(subset["revision"], whole["revision"]);
    let mut methods = 0;
    for (r, res) in subset["resources"].as_object().unwrap() {
        for (m, method) in res["methods"].as_object().unwrap() {
            assert_eq!(method, &whole["resources"][r]["methods"][m], "{r}.{m}");
            methods += 1;
        }
    }
    assert!(methods > 30, "{methods}");
    for (name, schema) in subset["schemas"].as_object().unwrap() {
        assert_eq!(schema, &whole["schemas"][name], "schema {name}");
    }
    fn refs(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(r) = m.get("$ref").and_then(|r| r.as_str()) {
                    out.push(r.to_string());
                }
                m.values().for_each(|c| refs(c, out));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|c| refs(c, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    refs(&subset["resources"], &mut all);
    refs(&subset["schemas"], &mut all);
    for r in all {
        assert!(
            subset["schemas"].get(&r).is_some(),
            "{r} is referenced but not in the subset"
        );
    }
}
