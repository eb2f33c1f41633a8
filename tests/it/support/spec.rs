//! Spec-checked adapter test harness (issue 4): holds an adapter to the vendor's own API
//! description.
//!
//! - [`Spec`] loads an OpenAPI 3.x document (JSON or YAML), matches a request to an
//!   operation by method and path template (literal segments win over `{param}` ones, so
//!   `/firewall-rulesets/global` is not `/firewall-rulesets/{id}`), checks query parameters
//!   are declared (and required ones present), validates JSON bodies against the request
//!   schema and responses against the schema of their status (else `4XX`/`5XX`, else
//!   `default`). Schemas are validated as JSON Schema 2020-12 with the document's
//!   `components` as the root, so `#/components/...` references resolve as written.
//!   OpenAPI 3.0 documents are converted first (`nullable: true` → `"null"` added to
//!   `type`, or `anyOf [.., {type: null}]` when there is no `type`; boolean
//!   `exclusiveMinimum`/`exclusiveMaximum` → numeric).
//! - [`SpecServer`] is a wiremock server whose canned responses are validated when they
//!   are mounted (a fixture that does not validate panics) and which checks every request
//!   it receives against the spec as it arrives. Requests that match no operation, carry
//!   an undeclared query parameter, an invalid body (or one without a JSON Content-Type)
//!   or no credentials of a declared security scheme, and requests no canned response answers, are recorded as violations;
//!   [`SpecServer::verify`] (or `Drop`) fails the test if there is any.
//!
//! - [`Spec::discovery`] loads a Google API discovery document (the format Google
//!   publishes instead of OpenAPI) as the equivalent OpenAPI 3.1 document: one operation
//!   per method by `httpMethod` + `flatPath` under `servicePath`, its `parameters` (and the
//!   document's global ones) as path and query parameters with their types, enums and
//!   anchored patterns (`repeated` as arrays), `request` / `response` `$ref`s as JSON bodies,
//!   the OAuth 2.0 scopes as a bearer scheme, and `schemas` as JSON Schema (`$ref` names as
//!   component references, `type: any` untyped, `int64`/`uint64` strings of digits). Path
//!   parameters are checked against their schemas too. Request bodies are checked against
//!   a closed copy of the schemas (no property the document does not declare: Google's
//!   JSON APIs refuse unknown fields) with the properties the document marks
//!   `annotations.required` for that method; responses against the open schemas.
//!
//! Known defects of a vendor's document are patched in code through [`Spec::patch`] by
//! the test file of that vendor, each with a comment naming the defect.
//!
//! Used as `crate::support::spec` from the single integration test (`tests/it/main.rs`).
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

/// A loaded OpenAPI document, ready to check requests and responses.
pub struct Spec {
    doc: Value,
    /// Whether path parameters are checked against their schemas (discovery documents,
    /// whose names carry patterns).
    check_path_params: bool,
    /// Prefix the server's URLs carry before the document's paths (for example `/v1`
    /// when `servers[0].url` ends in `/v1`); stripped before matching.
    base_path: String,
    ops: Vec<Operation>,
    validators: Mutex<HashMap<String, Arc<jsonschema::Validator>>>,
}

#[derive(Clone)]
struct Operation {
    method: String,
    template: String,
    segments: Vec<Segment>,
    /// The parameter name of each segment (`None` for literals).
    names: Vec<Option<String>>,
    /// The operation object, with path-level parameters merged into `parameters`.
    op: Value,
}

#[derive(Clone)]
enum Segment {
    Literal(String),
    Param,
}

/// What a request was matched to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matched {
    pub method: String,
    pub template: String,
    pub operation_id: Option<String>,
}

const METHODS: &[&str] = &["get", "put", "post", "delete", "patch", "head", "options"];

impl Spec {
    /// Loads a document from a `.json`, `.yaml` or `.yml` file. Panics on a missing or
    /// unparsable file (a test setup error).
    pub fn load(path: impl AsRef<Path>) -> Spec {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let doc: Value = match path.extension().and_then(|e| e.to_str()) {
            Some("yaml" | "yml") => serde_yaml::from_str(&text)
                .unwrap_or_else(|e| panic!("parsing {}: {e}", path.display())),
            _ => serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("parsing {}: {e}", path.display())),
        };
        Spec::from_value(doc)
    }

    /// A spec from an already parsed document.
    pub fn from_value(doc: Value) -> Spec {
        let version = doc["openapi"].as_str().unwrap_or_default().to_string();
        assert!(
            version.starts_with("3."),
            "not an OpenAPI 3.x document (openapi = {version:?})"
        );
        let mut spec = Spec {
            doc,
            check_path_params: false,
            base_path: String::new(),
            ops: vec![],
            validators: Mutex::new(HashMap::new()),
        };
        spec.reindex();
        spec
    }

    /// Strips `prefix` from request paths before matching.
    pub fn with_base_path(mut self, prefix: &str) -> Spec {
        self.base_path = prefix.trim_end_matches('/').to_string();
        self
    }

    /// Edits the document (to patch a known vendor defect; say which in a comment at the
    /// call site), then re-indexes it.
    pub fn patch(mut self, f: impl FnOnce(&mut Value)) -> Spec {
        f(&mut self.doc);
        self.reindex();
        self
    }

    /// The (possibly patched) document.
    pub fn doc(&self) -> &Value {
        &self.doc
    }

    fn is_30(&self) -> bool {
        self.doc["openapi"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.0"))
    }

    fn reindex(&mut self) {
        let mut ops = Vec::new();
        if let Some(paths) = self.doc["paths"].as_object() {
            for (template, item) in paths {
                let item = self.deref(item).clone();
                let shared: Vec<Value> = item["parameters"].as_array().cloned().unwrap_or_default();
                for m in METHODS {
                    let Some(op) = item.get(*m) else { continue };
                    let mut op = op.clone();
                    // Operation-level parameters override path-level ones of the same
                    // (name, in).
                    let own: Vec<Value> = op["parameters"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .iter()
                        .map(|p| self.deref(p).clone())
                        .collect();
                    let mut params = own.clone();
                    for p in &shared {
                        let p = self.deref(p).clone();
                        if !own
                            .iter()
                            .any(|o| o["name"] == p["name"] && o["in"] == p["in"])
                        {
                            params.push(p);
                        }
                    }
                    op["parameters"] = Value::Array(params);
                    ops.push(Operation {
                        method: m.to_uppercase(),
                        template: template.clone(),
                        names: split(template)
                            .into_iter()
                            .map(|s| {
                                s.strip_prefix('{')
                                    .and_then(|s| s.strip_suffix('}'))
                                    .map(str::to_string)
                            })
                            .collect(),
                        segments: split(template)
                            .into_iter()
                            .map(|s| {
                                if s.starts_with('{') && s.ends_with('}') {
                                    Segment::Param
                                } else {
                                    Segment::Literal(s.to_string())
                                }
                            })
                            .collect(),
                        op,
                    });
                }
            }
        }
        self.ops = ops;
        self.validators.lock().unwrap().clear();
    }

    /// Follows a local `$ref` (`#/...`) chain; other values are returned as they are.
    fn deref<'a>(&'a self, v: &'a Value) -> &'a Value {
        let mut v = v;
        for _ in 0..16 {
            match v.get("$ref").and_then(Value::as_str) {
                Some(r) if r.starts_with("#/") => match self.doc.pointer(&r[1..]) {
                    Some(t) => v = t,
                    None => return v,
                },
                _ => return v,
            }
        }
        v
    }

    /// The operation `method path` matches. Of several matching templates the one with the
    /// most literal segments wins (OpenAPI: concrete paths before templated ones).
    fn find(&self, method: &str, path: &str) -> Result<&Operation, String> {
        let path = path.strip_prefix(&self.base_path).unwrap_or(path);
        let parts = split(path);
        let method = method.to_uppercase();
        let mut best: Option<(&Operation, usize)> = None;
        let mut path_known = false;
        for op in &self.ops {
            if op.segments.len() != parts.len() {
                continue;
            }
            let mut literals = 0;
            let ok = op.segments.iter().zip(&parts).all(|(s, p)| match s {
                Segment::Literal(l) => {
                    literals += 1;
                    l == p
                }
                Segment::Param => !p.is_empty(),
            });
            if !ok {
                continue;
            }
            path_known = true;
            if op.method != method {
                continue;
            }
            if best.is_none_or(|(_, n)| literals > n) {
                best = Some((op, literals));
            }
        }
        match best {
            Some((op, _)) => Ok(op),
            None if path_known => Err(format!("{method} {path}: method not allowed by the spec")),
            None => Err(format!("{method} {path}: no such path in the spec")),
        }
    }

    /// Checks a request: operation (method + path template), query parameters (declared,
    /// required ones present, values valid against their schema), and the JSON body against
    /// the request body schema (a body where none is declared, or none where one is
    /// required, is an error).
    pub fn check_request(
        &self,
        method: &str,
        path: &str,
        query: &[(String, String)],
        body: Option<&Value>,
    ) -> Result<Matched, String> {
        let op = self.find(method, path)?;
        let what = format!("{} {}", op.method, op.template);
        let params = op.op["parameters"].as_array().cloned().unwrap_or_default();
        let declared: Vec<&Value> = params.iter().filter(|p| p["in"] == "query").collect();
        let mut errors = Vec::new();
        if self.check_path_params {
            let local = path.strip_prefix(&self.base_path).unwrap_or(path);
            for (name, value) in op.names.iter().zip(split(local)) {
                let Some(name) = name else { continue };
                let schema = params
                    .iter()
                    .find(|p| p["in"] == "path" && p["name"] == name.as_str())
                    .and_then(|p| p.get("schema"));
                if let Some(schema) = schema {
                    if let Err(e) = self.validate(schema, &Value::String(value.into())) {
                        errors.push(format!("path parameter `{name}`: {e}"));
                    }
                }
            }
        }
        for (k, v) in query {
            match declared.iter().find(|p| p["name"] == k.as_str()) {
                None => errors.push(format!("query parameter `{k}` is not declared")),
                Some(p) => {
                    if let Some(schema) = p.get("schema") {
                        let value = query_value(v, self.deref(schema));
                        if let Err(e) = self.validate(schema, &value) {
                            errors.push(format!("query parameter `{k}`: {e}"));
                        }
                    }
                }
            }
        }
        for p in &declared {
            if p["required"] == true && !query.iter().any(|(k, _)| p["name"] == k.as_str()) {
                errors.push(format!("required query parameter `{}` missing", p["name"]));
            }
        }
        let rb = op.op.get("requestBody").map(|b| self.deref(b));
        match (rb, body) {
            (None, Some(b)) => errors.push(format!("body sent but none is declared: {b}")),
            (Some(rb), None) if rb["required"] == true => {
                errors.push("required request body missing".into())
            }
            (Some(rb), Some(b)) => match json_schema(rb) {
                Some(schema) => {
                    if let Err(e) = self.validate(schema, b) {
                        errors.push(format!("request body: {e}"));
                    }
                }
                None => errors.push("JSON body sent but no application/json body declared".into()),
            },
            _ => {}
        }
        if errors.is_empty() {
            Ok(Matched {
                method: op.method.clone(),
                template: op.template.clone(),
                operation_id: op.op["operationId"].as_str().map(str::to_string),
            })
        } else {
            Err(format!("{what} ({method} {path}): {}", errors.join("; ")))
        }
    }

    /// Checks a response body against the schema for `status` (exact, else `4XX`/`5XX`,
    /// else `default`). A status the operation does not declare is an error; `body` `None`
    /// means an empty body, allowed only when the response declares no content.
    pub fn check_response(
        &self,
        method: &str,
        path: &str,
        status: u16,
        body: Option<&Value>,
    ) -> Result<(), String> {
        let (what, resp) = self.response_for(method, path, status)?;
        match (json_schema(resp), body) {
            (Some(schema), Some(b)) => self.validate(schema, b).map_err(|e| format!("{what}: {e}")),
            (Some(_), None) => Err(format!("{what}: empty body where JSON is declared")),
            (None, Some(b)) if resp.get("content").is_none() => {
                Err(format!("{what}: body {b} where the spec declares none"))
            }
            _ => Ok(()),
        }
    }

    /// The response object `method path` declares for `status` (exact, else `4XX`/`5XX`,
    /// else `default`), with the `METHOD template → status` that names it in errors.
    fn response_for(
        &self,
        method: &str,
        path: &str,
        status: u16,
    ) -> Result<(String, &Value), String> {
        let op = self.find(method, path)?;
        let what = format!("{} {} → {status}", op.method, op.template);
        let responses = &op.op["responses"];
        let class = format!("{}XX", status / 100);
        let resp = [status.to_string(), class, "default".to_string()]
            .iter()
            .find_map(|k| responses.get(k))
            .map(|r| self.deref(r))
            .ok_or_else(|| format!("{what}: status not declared by the spec"))?;
        Ok((what, resp))
    }

    /// Checks a `text/plain` response `text` for `status`: the response (exact status, else
    /// `4XX`/`5XX`, else `default`) must declare `text/plain` content, whose schema (if
    /// any) the text must validate against as a JSON string.
    pub fn check_text_response(
        &self,
        method: &str,
        path: &str,
        status: u16,
        text: &str,
    ) -> Result<(), String> {
        let (what, resp) = self.response_for(method, path, status)?;
        let media = resp["content"]
            .as_object()
            .and_then(|c| c.iter().find(|(k, _)| k.starts_with("text/plain")))
            .map(|(_, v)| v)
            .ok_or_else(|| format!("{what}: a text/plain body where the spec declares none"))?;
        match media.get("schema") {
            Some(schema) => self
                .validate(schema, &Value::String(text.to_string()))
                .map_err(|e| format!("{what}: {e}")),
            None => Ok(()),
        }
    }

    /// Checks a canned response: its text body ([`Spec::check_text_response`]) or its
    /// JSON body ([`Spec::check_response`]).
    pub fn check_canned(&self, method: &str, path: &str, c: &Canned) -> Result<(), String> {
        match &c.text {
            Some(t) => self.check_text_response(method, path, c.status, t),
            None => self.check_response(method, path, c.status, c.body.as_ref()),
        }
    }

    /// The security schemes an operation accepts (names from `components.securitySchemes`);
    /// empty when it needs none.
    fn security_schemes(&self, op: &Operation) -> Vec<Value> {
        let reqs = op
            .op
            .get("security")
            .or_else(|| self.doc.get("security"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut out = Vec::new();
        for r in reqs {
            let Some(obj) = r.as_object() else { continue };
            if obj.is_empty() {
                // `{}` = anonymous access allowed.
                return vec![];
            }
            for name in obj.keys() {
                if let Some(s) = self
                    .doc
                    .pointer(&format!("/components/securitySchemes/{name}"))
                {
                    out.push(self.deref(s).clone());
                }
            }
        }
        out
    }

    /// Whether the request's headers satisfy one of the operation's security schemes
    /// (HTTP bearer/basic and API-key headers are checked; other kinds pass).
    fn check_security(
        &self,
        method: &str,
        path: &str,
        headers: &[(String, String)],
    ) -> Result<(), String> {
        let op = self.find(method, path)?;
        let schemes = self.security_schemes(op);
        if schemes.is_empty() {
            return Ok(());
        }
        let header = |n: &str| {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(n))
                .map(|(_, v)| v.as_str())
        };
        let ok = schemes
            .iter()
            .any(|s| match (s["type"].as_str(), s["scheme"].as_str()) {
                (Some("http"), Some(scheme)) => header("authorization").is_some_and(|v| {
                    v.len() > scheme.len() + 1
                        && v[..scheme.len()].eq_ignore_ascii_case(scheme)
                        && v.as_bytes()[scheme.len()] == b' '
                }),
                (Some("apiKey"), _) if s["in"] == "header" => {
                    s["name"].as_str().and_then(header).is_some()
                }
                _ => true,
            });
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{} {}: no credentials for any declared security scheme",
                op.method, op.template
            ))
        }
    }

    /// Validates `instance` against `schema` (a schema object of this document).
    fn validate(&self, schema: &Value, instance: &Value) -> Result<(), String> {
        let validator = self.validator(schema)?;
        let errors: Vec<String> = validator
            .iter_errors(instance)
            .map(|e| format!("at `{}`: {e}", e.instance_path))
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(format!("{} (value: {instance})", errors.join("; ")))
        }
    }

    fn validator(&self, schema: &Value) -> Result<Arc<jsonschema::Validator>, String> {
        let key = schema.to_string();
        if let Some(v) = self.validators.lock().unwrap().get(&key) {
            return Ok(v.clone());
        }
        // The document's components are the root, so `#/components/...` references in
        // the schema resolve exactly as the document writes them.
        let mut components = self.doc.get("components").cloned().unwrap_or(json!({}));
        let mut target = schema.clone();
        if self.is_30() {
            convert_30(&mut components);
            convert_30(&mut target);
        }
        let root = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "components": components,
            "allOf": [target],
        });
        let v = jsonschema::draft202012::new(&root)
            .map_err(|e| format!("schema does not compile: {e}"))?;
        let v = Arc::new(v);
        self.validators.lock().unwrap().insert(key, v.clone());
        Ok(v)
    }
}

impl Spec {
    /// A Google API discovery document (JSON) as the equivalent OpenAPI document (see the
    /// module docs), its paths under the document's `servicePath`. Panics on a missing or
    /// unparsable file (a test setup error).
    pub fn discovery(path: impl AsRef<Path>) -> Spec {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let doc: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()));
        assert_eq!(
            doc["discoveryVersion"],
            "v1",
            "{} is not a discovery document",
            path.display()
        );
        let base = format!("/{}", doc["servicePath"].as_str().unwrap_or_default());
        let mut spec = Spec::from_value(discovery_to_openapi(&doc)).with_base_path(&base);
        spec.check_path_params = true;
        spec
    }
}

/// The Google error body every JSON API answers errors with (the discovery format
/// declares no error responses): `{"error": {"code", "message", "status", "errors":
/// [{"domain", "reason", "message"}], "details"}}` (Google's "JSON error format" of its
/// JSON APIs; `googleapiclient.errors.HttpError` reads `error.errors[].reason` and
/// `error.details`).
fn google_error_schema() -> Value {
    json!({
        "type": "object",
        "required": ["error"],
        "properties": {"error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "integer"},
                "message": {"type": "string"},
                "status": {"type": "string"},
                "errors": {"type": "array", "items": {
                    "type": "object",
                    "required": ["message", "reason"],
                    "properties": {
                        "domain": {"type": "string"},
                        "reason": {"type": "string"},
                        "message": {"type": "string"},
                        "location": {"type": "string"},
                        "locationType": {"type": "string"}
                    }
                }},
                "details": {"type": "array"}
            }
        }}
    })
}

/// A discovery pattern as a JSON Schema one: discovery patterns describe the whole value.
fn anchored(pattern: &str) -> String {
    format!("^(?:{pattern})$")
}

/// A discovery schema as JSON Schema 2020-12 (module docs): references go to
/// `#/components/<to>/`, and `closed` objects refuse undeclared properties.
fn discovery_schema(s: &Value, to: &str, closed: bool) -> Value {
    let Some(obj) = s.as_object() else {
        return json!({});
    };
    if let Some(r) = obj.get("$ref").and_then(Value::as_str) {
        return json!({"$ref": format!("#/components/{to}/{r}")});
    }
    let mut out = serde_json::Map::new();
    match obj.get("type").and_then(Value::as_str) {
        None | Some("any") => {}
        Some(t) => {
            out.insert("type".into(), json!(t));
        }
    }
    if let Some(e) = obj.get("enum") {
        out.insert("enum".into(), e.clone());
    }
    if let Some(p) = obj.get("pattern").and_then(Value::as_str) {
        out.insert("pattern".into(), json!(anchored(p)));
    }
    let digits = matches!(
        obj.get("format").and_then(Value::as_str),
        Some("int64" | "uint64")
    );
    if digits
        && obj.get("type").and_then(Value::as_str) == Some("string")
        && !out.contains_key("pattern")
    {
        out.insert("pattern".into(), json!("^-?[0-9]+$"));
    }
    for bound in ["minimum", "maximum"] {
        if let Some(n) = obj.get(bound).and_then(|v| {
            v.as_str()
                .and_then(|s| s.parse::<f64>().ok())
                .or(v.as_f64())
        }) {
            out.insert(bound.into(), json!(n));
        }
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        let props: serde_json::Map<String, Value> = props
            .iter()
            .map(|(k, v)| (k.clone(), discovery_schema(v, to, closed)))
            .collect();
        out.insert("properties".into(), Value::Object(props));
        if closed && !obj.contains_key("additionalProperties") {
            out.insert("additionalProperties".into(), json!(false));
        }
    }
    if let Some(ap) = obj.get("additionalProperties") {
        out.insert(
            "additionalProperties".into(),
            discovery_schema(ap, to, closed),
        );
    }
    if let Some(items) = obj.get("items") {
        out.insert("items".into(), discovery_schema(items, to, closed));
    }
    Value::Object(out)
}

/// A discovery parameter as an OpenAPI parameter object.
fn discovery_parameter(name: &str, p: &Value) -> Value {
    let mut schema = discovery_schema(p, "schemas", false);
    if p["repeated"] == true {
        schema = json!({"type": "array", "items": schema});
    }
    json!({
        "name": name,
        "in": p["location"].as_str().unwrap_or("query"),
        "required": p["required"] == true,
        "schema": schema,
    })
}

/// Every method of a discovery `resources` tree (nested resources included).
fn discovery_methods(resources: &Value, out: &mut Vec<Value>) {
    for r in resources.as_object().into_iter().flat_map(|m| m.values()) {
        for m in r["methods"]
            .as_object()
            .into_iter()
            .flat_map(|m| m.values())
        {
            out.push(m.clone());
        }
        discovery_methods(&r["resources"], out);
    }
}

/// A discovery document as the equivalent OpenAPI 3.1 document (module docs).
pub fn discovery_to_openapi(d: &Value) -> Value {
    let empty = serde_json::Map::new();
    let schemas = d["schemas"].as_object().unwrap_or(&empty);
    let mut open = serde_json::Map::new();
    let mut closed = serde_json::Map::new();
    for (name, s) in schemas {
        open.insert(name.clone(), discovery_schema(s, "schemas", false));
        closed.insert(name.clone(), discovery_schema(s, "requestSchemas", true));
    }
    open.insert("gpuprovGoogleError".into(), google_error_schema());
    let error = json!({
        "description": "gpuprov harness: Google's JSON error body (see google_error_schema)",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/gpuprovGoogleError"}}}
    });
    let global: Vec<Value> = d["parameters"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, p)| discovery_parameter(k, p))
        .collect();
    let mut methods = Vec::new();
    discovery_methods(&d["resources"], &mut methods);
    let mut paths = serde_json::Map::new();
    for m in methods {
        let template = format!(
            "/{}",
            m["flatPath"]
                .as_str()
                .or(m["path"].as_str())
                .unwrap_or_default()
        );
        let verb = m["httpMethod"].as_str().unwrap_or("GET").to_lowercase();
        let id = m["id"].as_str().unwrap_or_default().to_string();
        let mut params = global.clone();
        for (k, p) in m["parameters"].as_object().into_iter().flatten() {
            params.push(discovery_parameter(k, p));
        }
        let mut op = json!({
            "operationId": id,
            "parameters": params,
            "responses": {"4XX": error.clone(), "5XX": error.clone()},
        });
        op["responses"]["200"] = match m["response"]["$ref"].as_str() {
            Some(r) => json!({
                "description": "the method's response",
                "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{r}")}}}
            }),
            None => json!({"description": "no response body"}),
        };
        if let Some(r) = m["request"]["$ref"].as_str() {
            // The properties the document requires for this method (`annotations.required`).
            let required: Vec<Value> = schemas
                .get(r)
                .and_then(|s| s["properties"].as_object())
                .into_iter()
                .flatten()
                .filter(|(_, p)| {
                    p["annotations"]["required"]
                        .as_array()
                        .is_some_and(|a| a.iter().any(|x| x == id.as_str()))
                })
                .map(|(k, _)| json!(k))
                .collect();
            op["requestBody"] = json!({
                "required": true,
                "content": {"application/json": {"schema": {"allOf": [
                    {"$ref": format!("#/components/requestSchemas/{r}")},
                    {"required": required}
                ]}}}
            });
        }
        if m["scopes"].as_array().is_some_and(|s| !s.is_empty()) {
            op["security"] = json!([{"google_oauth2": []}]);
        }
        paths
            .entry(template)
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .expect("a path item")
            .insert(verb, op);
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": d["title"],
            "version": format!("{} (discovery revision {})", d["version"].as_str().unwrap_or_default(), d["revision"].as_str().unwrap_or_default()),
        },
        "paths": paths,
        "components": {
            "schemas": open,
            "requestSchemas": closed,
            "securitySchemes": {"google_oauth2": {"type": "http", "scheme": "bearer"}},
        },
    })
}

fn split(path: &str) -> Vec<&str> {
    path.trim_matches('/').split('/').collect()
}

/// The `application/json` (or `+json`) schema of a request body or response object.
fn json_schema(obj: &Value) -> Option<&Value> {
    let content = obj.get("content")?.as_object()?;
    content
        .iter()
        .find(|(k, _)| {
            let k = k.split(';').next().unwrap_or_default().trim();
            k == "application/json" || k.ends_with("+json")
        })
        .and_then(|(_, v)| v.get("schema"))
}

/// A query string value as JSON, typed by its (dereferenced) schema. For an `anyOf` /
/// `oneOf` (FastAPI's `Optional[int]` is `anyOf [integer, null]`), the first alternative
/// the text reads as.
fn query_value(raw: &str, schema: &Value) -> Value {
    if let Some(alts) = schema
        .get("anyOf")
        .or_else(|| schema.get("oneOf"))
        .and_then(Value::as_array)
    {
        return alts
            .iter()
            .map(|alt| query_value(raw, alt))
            .find(|v| !v.is_string())
            .unwrap_or_else(|| Value::String(raw.into()));
    }
    let ty = schema["type"].as_str().unwrap_or_default();
    match ty {
        "integer" | "number" => serde_json::from_str(raw).unwrap_or(Value::String(raw.into())),
        "boolean" => match raw {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => Value::String(raw.into()),
        },
        "array" => Value::Array(
            raw.split(',')
                .map(|s| query_value(s, &schema["items"]))
                .collect(),
        ),
        _ => Value::String(raw.into()),
    }
}

/// OpenAPI 3.0 schema dialect → JSON Schema 2020-12, in place: `nullable: true` and the
/// boolean forms of `exclusiveMinimum` / `exclusiveMaximum`.
fn convert_30(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (_, child) in map.iter_mut() {
                convert_30(child);
            }
            for (flag, bound) in [
                ("exclusiveMinimum", "minimum"),
                ("exclusiveMaximum", "maximum"),
            ] {
                if let Some(Value::Bool(b)) = map.get(flag).cloned() {
                    map.remove(flag);
                    if b {
                        if let Some(n) = map.remove(bound) {
                            map.insert(flag.into(), n);
                        }
                    }
                }
            }
            if map.remove("nullable") == Some(Value::Bool(true)) {
                match map.get_mut("type") {
                    Some(Value::String(t)) => {
                        let t = t.clone();
                        map.insert("type".into(), json!([t, "null"]));
                        if let Some(Value::Array(e)) = map.get_mut("enum") {
                            e.push(Value::Null);
                        }
                    }
                    Some(Value::Array(ts)) => {
                        if !ts.contains(&json!("null")) {
                            ts.push(json!("null"));
                        }
                    }
                    _ => {
                        let inner = Value::Object(std::mem::take(map));
                        map.insert("anyOf".into(), json!([inner, {"type": "null"}]));
                    }
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(convert_30),
        _ => {}
    }
}

/// A canned response: status, JSON body (or a `text/plain` one, or none) and headers.
#[derive(Debug, Clone)]
pub struct Canned {
    pub status: u16,
    pub body: Option<Value>,
    /// A `text/plain` body (Verda answers some creates with the new id as text).
    pub text: Option<String>,
    pub headers: Vec<(String, String)>,
}

impl Canned {
    /// `200` with a JSON body.
    pub fn ok(body: Value) -> Canned {
        Canned::status(200, body)
    }
    /// `status` with a JSON body.
    pub fn status(status: u16, body: Value) -> Canned {
        Canned {
            status,
            body: Some(body),
            text: None,
            headers: vec![],
        }
    }
    /// `status` with an empty body.
    pub fn empty(status: u16) -> Canned {
        Canned {
            status,
            body: None,
            text: None,
            headers: vec![],
        }
    }
    /// `status` with a `text/plain` body.
    pub fn text(status: u16, text: &str) -> Canned {
        Canned {
            text: Some(text.to_string()),
            ..Canned::empty(status)
        }
    }
    pub fn header(mut self, name: &str, value: &str) -> Canned {
        self.headers.push((name.into(), value.into()));
        self
    }
    fn template(&self) -> ResponseTemplate {
        let mut t = ResponseTemplate::new(self.status);
        if let Some(b) = &self.body {
            t = t.set_body_json(b.clone());
        }
        if let Some(text) = &self.text {
            t = t.set_body_raw(text.clone().into_bytes(), "text/plain; charset=utf-8");
        }
        for (k, v) in &self.headers {
            t = t.insert_header(k.as_str(), v.as_str());
        }
        t
    }
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: Vec<(String, String)>,
    pub headers: Vec<(String, String)>,
    pub body: Option<Value>,
}

impl Seen {
    fn from(req: &Request) -> Seen {
        Seen {
            method: req.method.to_string(),
            path: req.url.path().to_string(),
            query: req
                .url
                .query_pairs()
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
            headers: req
                .headers
                .iter()
                .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
                .collect(),
            body: if req.body.is_empty() {
                None
            } else {
                Some(
                    serde_json::from_slice(&req.body).unwrap_or_else(|_| {
                        Value::String(String::from_utf8_lossy(&req.body).into())
                    }),
                )
            },
        }
    }
}

#[derive(Default)]
struct Log {
    requests: Vec<Seen>,
    violations: Vec<String>,
    /// When each of `requests` arrived (the server's clock).
    arrived: Vec<std::time::Instant>,
}

/// A function producing the response to a request (a stateful fake cloud).
type Handler = Box<dyn Fn(&Seen) -> Canned + Send + Sync>;

enum Answer {
    /// Validated when mounted.
    Fixed(Canned),
    /// Validated as each response is produced.
    Dynamic(Handler),
    /// The catch-all: no canned response answers this request.
    Nothing,
}

/// Answers after checking the request against the spec.
struct Checked {
    spec: Arc<Spec>,
    log: Arc<Mutex<Log>>,
    answer: Answer,
}

impl Respond for Checked {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        let seen = Seen::from(req);
        let mut problems = Vec::new();
        if let Err(e) =
            self.spec
                .check_request(&seen.method, &seen.path, &seen.query, seen.body.as_ref())
        {
            problems.push(e);
        } else if let Err(e) = self
            .spec
            .check_security(&seen.method, &seen.path, &seen.headers)
        {
            problems.push(e);
        }
        if seen.body.is_some() {
            let json_type = seen.headers.iter().any(|(k, v)| {
                k.eq_ignore_ascii_case("content-type") && v.to_ascii_lowercase().contains("json")
            });
            if !json_type {
                problems.push(format!(
                    "{} {}: body sent without a JSON Content-Type",
                    seen.method, seen.path
                ));
            }
        }
        let template = match &self.answer {
            Answer::Fixed(c) => c.template(),
            Answer::Dynamic(f) => {
                let c = f(&seen);
                if let Err(e) = self.spec.check_canned(&seen.method, &seen.path, &c) {
                    problems.push(format!("response does not match the spec: {e}"));
                }
                c.template()
            }
            Answer::Nothing => {
                problems.push(format!(
                    "{} {}: no canned response answers this request",
                    seen.method, seen.path
                ));
                ResponseTemplate::new(599)
            }
        };
        let mut log = self.log.lock().unwrap();
        log.violations.extend(problems);
        log.requests.push(seen);
        log.arrived.push(std::time::Instant::now());
        template
    }
}

/// A local wiremock server holding an adapter to a [`Spec`]. See the module docs.
pub struct SpecServer {
    server: MockServer,
    spec: Arc<Spec>,
    log: Arc<Mutex<Log>>,
}

impl SpecServer {
    /// Starts a server on 127.0.0.1 with a catch-all that records any request no canned
    /// response answers.
    pub async fn start(spec: Arc<Spec>) -> SpecServer {
        let server = MockServer::start().await;
        let log = Arc::new(Mutex::new(Log::default()));
        Mock::given(wiremock::matchers::any())
            .respond_with(Checked {
                spec: spec.clone(),
                log: log.clone(),
                answer: Answer::Nothing,
            })
            .with_priority(u8::MAX)
            .mount(&server)
            .await;
        SpecServer { server, spec, log }
    }

    /// The server's base URL (`http://127.0.0.1:PORT`).
    pub fn uri(&self) -> String {
        self.server.uri()
    }

    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    /// Answers `method path` (an exact path) with `canned`, forever or the first `times`
    /// times. Earlier mounts win over later ones while they last. Panics when the canned
    /// response does not validate against the spec.
    pub async fn mount(&self, method: &str, path: &str, canned: Canned, times: Option<u64>) {
        self.mount_matching(
            method,
            path,
            None::<wiremock::matchers::MethodExactMatcher>,
            canned,
            times,
        )
        .await
    }

    /// [`SpecServer::mount`] with an extra wiremock matcher (for example on the body).
    pub async fn mount_matching<M: wiremock::Match + 'static>(
        &self,
        method: &str,
        path: &str,
        extra: Option<M>,
        canned: Canned,
        times: Option<u64>,
    ) {
        if let Err(e) = self.spec.check_canned(method, path, &canned) {
            panic!("canned response does not match the spec: {e}");
        }
        let mut mock =
            Mock::given(wiremock::matchers::method(method)).and(wiremock::matchers::path(path));
        if let Some(m) = extra {
            mock = mock.and(m);
        }
        let mut mock = mock.respond_with(Checked {
            spec: self.spec.clone(),
            log: self.log.clone(),
            answer: Answer::Fixed(canned),
        });
        if let Some(n) = times {
            mock = mock.up_to_n_times(n);
        }
        mock.mount(&self.server).await;
    }

    /// Answers `method` requests whose path matches `path_regex` with `f(request)`, for a
    /// stateful fake. Each response is checked against the spec as it is produced; one that
    /// does not validate is recorded as a violation.
    pub async fn mount_fn(
        &self,
        method: &str,
        path_regex: &str,
        f: impl Fn(&Seen) -> Canned + Send + Sync + 'static,
    ) {
        Mock::given(wiremock::matchers::method(method))
            .and(wiremock::matchers::path_regex(path_regex))
            .respond_with(Checked {
                spec: self.spec.clone(),
                log: self.log.clone(),
                answer: Answer::Dynamic(Box::new(f)),
            })
            .mount(&self.server)
            .await;
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<Seen> {
        self.log.lock().unwrap().requests.clone()
    }

    /// The requests for `method path` (exact path).
    pub fn requests_to(&self, method: &str, path: &str) -> Vec<Seen> {
        self.requests()
            .into_iter()
            .filter(|r| r.method.eq_ignore_ascii_case(method) && r.path == path)
            .collect()
    }

    /// The violations recorded so far.
    /// Every request received, with when it arrived (the server's clock), in order.
    pub fn requests_timed(&self) -> Vec<(std::time::Instant, Seen)> {
        let log = self.log.lock().unwrap();
        log.arrived
            .iter()
            .copied()
            .zip(log.requests.iter().cloned())
            .collect()
    }

    pub fn violations(&self) -> Vec<String> {
        self.log.lock().unwrap().violations.clone()
    }

    /// Fails the test if any request violated the spec or went unanswered.
    pub fn verify(&self) {
        let v = self.violations();
        assert!(
            v.is_empty(),
            "requests that break the spec or had no canned response:\n  {}",
            v.join("\n  ")
        );
    }
}

impl Drop for SpecServer {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.verify();
        }
    }
}

/// Where the vendors' API descriptions live: `tests/fixtures/vendor-apis/` in this
/// repository, copied whole from the project's vendor-API folder with each file's
/// upstream source and SHA-256 in its `PROVENANCE.md` (checked by
/// `self_contained::every_copied_fixture_matches_its_checksum`); what each describes and
/// its known defects are in the copied `SOURCES.md` beside them.
pub fn vendor_apis_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vendor-apis")
}

/// The generic error envelope every Lambda error uses (info.description, "Error
/// responses"): `{"error": {"code", "message", "suggestion"?}}`.
fn lambda_error_envelope() -> Value {
    json!({
        "description": "gpuprov harness patch (see lambda())",
        "content": {"application/json": {"schema": {
            "type": "object",
            "additionalProperties": false,
            "required": ["error"],
            "properties": {"error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": {"type": "string"},
                    "message": {"type": "string"},
                    "suggestion": {"type": "string"}
                }
            }}
        }}}
    })
}

/// Lambda Cloud API 1.8.3 (`lambda/openapi-1.8.3.json`), with its known defects patched:
///
/// 1. Rate limits: the description limits requests (about 1/s, launch 1 per 12 s) but no
///    operation declares a `429` response or `Retry-After` (SOURCES.md: "No 429 response or
///    Retry-After header is described in the spec"). Patched: every operation gets a `429`
///    with the documented error envelope.
/// 2. Provider errors: the description documents `provider/*` upstream errors (example
///    `provider/internal-unavailable`) but no operation declares a `5XX` response.
///    Patched: every operation gets a `5XX` with the documented error envelope.
/// 3. `PublicRegionCode` is a closed enum of the 17 regions of 1.8.3; Lambda adds regions
///    between versions (1.10.0 exists upstream), so a region missing from the enum is not a
///    contract violation. Patched: any lowercase `name-…-N` region code.
pub fn lambda() -> Spec {
    let path = vendor_apis_dir().join("lambda/openapi-1.8.3.json");
    Spec::load(path).patch(|doc| {
        let envelope = lambda_error_envelope();
        if let Some(paths) = doc["paths"].as_object_mut() {
            for item in paths.values_mut() {
                for m in METHODS {
                    if let Some(responses) = item
                        .get_mut(*m)
                        .and_then(|op| op.get_mut("responses"))
                        .and_then(Value::as_object_mut)
                    {
                        responses.entry("429").or_insert_with(|| envelope.clone());
                        responses.entry("5XX").or_insert_with(|| envelope.clone());
                    }
                }
            }
        }
        doc["components"]["schemas"]["PublicRegionCode"] = json!({
            "title": "PublicRegionCode",
            "type": "string",
            "pattern": "^[a-z]+(-[a-z]+)*-[0-9]+$"
        });
    })
}

// ---- RunPod ----

/// RunPod REST API v2 (`runpod/api-reference-v2/openapi.json`, OpenAPI 3.1, API 2.0.0),
/// with its known defect patched:
///
/// 1. Insufficient balance: the `createPod` description's retry table documents
///    "`402` Insufficient balance. Stop; no candidate will succeed", but the operation
///    declares no `402` response (it only validates through `default`). Patched: `createPod`
///    gets an explicit `402` with the documented `ErrorResponse` problem body, so a fixture
///    for it is checked against what the vendor says it sends.
///
/// Rules the document states only in prose and a schema cannot carry (for example
/// "`include=AVAILABILITY` requires `product`; `count` and `cloud` are valid only with it")
/// are enforced by the fake in `tests/it/vendor/runpod.rs`, which answers `400` as the API does.
pub fn runpod() -> Spec {
    let path = vendor_apis_dir().join("runpod/api-reference-v2/openapi.json");
    Spec::load(path).patch(|doc| {
        let responses = &mut doc["paths"]["/v2/pods"]["post"]["responses"];
        assert!(
            responses.get("402").is_none(),
            "createPod declares 402 now: drop this patch"
        );
        responses["402"] = json!({
            "description": "gpuprov harness patch (see runpod()): insufficient balance",
            "content": {"application/problem+json": {"schema": {
                "$ref": "#/components/schemas/ErrorResponse"
            }}}
        });
    })
}

// ---- DigitalOcean ----

/// DigitalOcean API v2, the gpuprov subset (`digitalocean/DigitalOcean-public.v2.gpuprov-subset.yaml`),
/// with its known gaps patched:
///
/// 1. `POST /v2/tags` is not in the subset, but a firewall may only name tags that exist
///    (`existing_tags_array`), so the adapter creates its firewall tag first. Patched: the
///    operation as the whole-API bundle (`DigitalOcean-public.v2.bundled.yaml`,
///    `tags_create`) declares it, with its `tags` schema reduced to `name` (the only field
///    a client writes; `resources` is read-only). Its `400` (schema
///    `error_with_root_causes`, not in the subset) is left out: `default` answers for it.
/// 2. Tag names are limited to `^[a-zA-Z0-9_\-\:]+$`, at most 255 characters (bundled
///    schema `tags.name`), but the subset's `droplet_create.tags`, `tags_array` and
///    `existing_tags_array` items are unconstrained strings, so a tag with `=` would pass.
///    Patched: those items carry the pattern and length.
/// 3. `POST /v2/droplets` declares no 422 although capacity and quota refusals are 422
///    `unprocessable_entity` (SOURCES.md, "Capacity / quota"); `default` (the `error`
///    schema) covers them, so nothing is patched, and the same holds for 404/422 on other
///    operations.
pub fn digitalocean() -> Spec {
    let path = vendor_apis_dir().join("digitalocean/DigitalOcean-public.v2.gpuprov-subset.yaml");
    Spec::load(path).patch(|doc| {
        let tag_name = json!({"type": "string", "pattern": "^[a-zA-Z0-9_\\-\\:]+$", "maxLength": 255});
        doc["components"]["schemas"]["droplet_create"]["properties"]["tags"]["items"] =
            tag_name.clone();
        doc["components"]["schemas"]["tags_array"]["items"] = tag_name.clone();
        doc["components"]["schemas"]["existing_tags_array"]["items"] = tag_name.clone();
        let ratelimit = json!({
            "ratelimit-limit": {"$ref": "#/components/headers/ratelimit-limit"},
            "ratelimit-remaining": {"$ref": "#/components/headers/ratelimit-remaining"},
            "ratelimit-reset": {"$ref": "#/components/headers/ratelimit-reset"}
        });
        doc["components"]["schemas"]["tags"] = json!({
            "type": "object",
            "description": "gpuprov harness patch (see digitalocean()): bundled `tags`, client-written fields",
            "properties": {"name": tag_name},
            "required": ["name"]
        });
        doc["paths"]["/v2/tags"] = json!({"post": {
            "operationId": "tags_create",
            "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/tags"}}}},
            "responses": {
                "201": {
                    "description": "The response will be a JSON object with a key called `tag`.",
                    "headers": ratelimit,
                    "content": {"application/json": {"schema": {
                        "type": "object",
                        "properties": {"tag": {"$ref": "#/components/schemas/tags"}}
                    }}}
                },
                "401": {"$ref": "#/components/responses/unauthorized"},
                "429": {"$ref": "#/components/responses/too_many_requests"},
                "500": {"$ref": "#/components/responses/server_error"},
                "default": {"$ref": "#/components/responses/unexpected_error"}
            },
            "security": [{"bearer_auth": ["tag:create"]}]
        }});
    })
}

// ---- Hyperstack (NexGen Cloud Infrahub API) ----

/// The error envelope Hyperstack documents for 400/401/404/405/409
/// (`components.schemas.ErrorResponseModel`), reused for the responses patched in below.
fn hyperstack_error_response() -> Value {
    json!({
        "description": "gpuprov harness patch (see hyperstack())",
        "content": {"application/json": {"schema": {
            "$ref": "#/components/schemas/ErrorResponseModel"
        }}}
    })
}

/// Hyperstack's Infrahub API (`hyperstack/openapi.yaml`, OpenAPI 3.0.1 as normalised by
/// openapi-generator in the vendor's Go SDK), served under `/v1` (`servers[0].url`), with
/// its known defects patched:
///
/// 1. Undefined security scheme: every operation (and the document) lists `accessToken`,
///    which `components.securitySchemes` does not define (SOURCES.md, Hyperstack
///    "Auth"). Patched: the `accessToken` alternatives are removed, so a request must carry
///    the one defined scheme, the `api_key` header (`apiKey`), which is what gpuprov sends.
/// 2. `Create_Security_Rule_Payload` (the items of `Create_Instances_Payload.security_rules`)
///    requires `virtual_machine_id`, a property it does not declare and that a VM being
///    created cannot have yet. Patched: `virtual_machine_id` is no longer required.
/// 3. Rate limits: no operation declares a `429` (the vendor documents rate limiting in
///    its API reference, not in the description). Patched: every operation gets a `429`
///    with the `ErrorResponseModel` envelope (and may carry `Retry-After`).
pub fn hyperstack() -> Spec {
    let path = vendor_apis_dir().join("hyperstack/openapi.yaml");
    Spec::load(path)
        .patch(|doc| {
            fn drop_access_token(security: &mut Value) {
                if let Some(reqs) = security.as_array_mut() {
                    reqs.retain(|r| r.get("accessToken").is_none());
                }
            }
            drop_access_token(&mut doc["security"]);
            let envelope = hyperstack_error_response();
            if let Some(paths) = doc["paths"].as_object_mut() {
                for item in paths.values_mut() {
                    for m in METHODS {
                        let Some(op) = item.get_mut(*m) else { continue };
                        if let Some(sec) = op.get_mut("security") {
                            drop_access_token(sec);
                        }
                        if let Some(responses) =
                            op.get_mut("responses").and_then(Value::as_object_mut)
                        {
                            responses.entry("429").or_insert_with(|| envelope.clone());
                        }
                    }
                }
            }
            if let Some(req) = doc
                .pointer_mut("/components/schemas/Create_Security_Rule_Payload/required")
                .and_then(Value::as_array_mut)
            {
                req.retain(|r| r != "virtual_machine_id");
            }
        })
        .with_base_path("/v1")
}

// ---- GCP (Compute Engine v1, a discovery document) ----

/// The Compute Engine API v1, discovery revision 20261106: the gpuprov subset
/// (`gcp/compute.v1.gpuprov-subset.json`: the methods gpuprov calls and the schemas they
/// reference, byte-for-byte those of the whole `compute.v1.json`, which
/// `spec_harness::the_gcp_subset_is_the_whole_document_cut` checks), because loading the
/// whole 4.9 MB document costs seconds in every test process. Loaded once per process and
/// shared, with the validators it compiles. Served under `/compute/v1` (`servicePath`).
/// No known defect is patched; what the discovery format cannot say (the error body) is
/// added by [`Spec::discovery`].
pub fn gcp() -> Arc<Spec> {
    static SPEC: std::sync::OnceLock<Arc<Spec>> = std::sync::OnceLock::new();
    SPEC.get_or_init(|| {
        Arc::new(Spec::discovery(
            vendor_apis_dir().join("gcp/compute.v1.gpuprov-subset.json"),
        ))
    })
    .clone()
}

/// The whole Compute Engine discovery document (`gcp/compute.v1.json`), parsed.
pub fn gcp_whole_document() -> Value {
    let path = vendor_apis_dir().join("gcp/compute.v1.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// The gpuprov subset of it, parsed.
pub fn gcp_subset_document() -> Value {
    let path = vendor_apis_dir().join("gcp/compute.v1.gpuprov-subset.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

// ---- Massed Compute ----

/// Massed Compute's VM API (`massedcompute/openapi-v1.0.0.mock-fixed.yaml`, the vendor's
/// OpenAPI 1.0.0 with SOURCES.md's seven patches), served under `/api/v1`
/// (`servers[0].url`), with its known gap patched:
///
/// 1. Errors: no operation declares any error response (SOURCES.md: "Errors / rate
///    limits / capacity / quota: not documented (spec lists only success responses)"),
///    although the API answers with them (brevdev/cloud's client,
///    `v1/providers/massedcompute/errors.go`, classifies 429, 5xx and capacity / quota
///    bodies; its `instance.go` takes a 404 on terminate for gone). Patched: every
///    operation gets `4XX` and `5XX` with a JSON object body, whose shape is unknown.
pub fn massedcompute() -> Spec {
    let path = vendor_apis_dir().join("massedcompute/openapi-v1.0.0.mock-fixed.yaml");
    Spec::load(path)
        .patch(|doc| {
            let error = json!({
                "description": "gpuprov harness patch (see massedcompute()): an undocumented error",
                "content": {"application/json": {"schema": {"type": "object"}}}
            });
            if let Some(paths) = doc["paths"].as_object_mut() {
                for item in paths.values_mut() {
                    for m in METHODS {
                        if let Some(responses) = item
                            .get_mut(*m)
                            .and_then(|op| op.get_mut("responses"))
                            .and_then(Value::as_object_mut)
                        {
                            assert!(
                                !responses
                                    .keys()
                                    .any(|k| k.starts_with('4') || k.starts_with('5')),
                                "massedcompute declares errors now: revisit this patch"
                            );
                            responses.insert("4XX".into(), error.clone());
                            responses.insert("5XX".into(), error.clone());
                        }
                    }
                }
            }
        })
        .with_base_path("/api/v1")
}

// ---- Verda ----

/// Verda's public API v1 as the vendor's Python SDK uses it
/// (`verda/verda-from-sdk.openapi.yaml`, the primary description per SOURCES.md), served
/// under `/v1` (`servers[0].url`). No patch: its error envelope is every operation's
/// `default`, and its plain-text answers (the ids of created instances, keys and scripts)
/// are declared `text/plain`, which the harness checks as such.
pub fn verda() -> Spec {
    Spec::load(vendor_apis_dir().join("verda/verda-from-sdk.openapi.yaml")).with_base_path("/v1")
}

// ---- Prime Intellect ----

/// Prime Intellect's API (`primeintellect/prime-intellect-compute-api-openapi.fixed.yml`:
/// the FastAPI description with SOURCES.md's patches P1–P9 from the vendor CLI `prime`
/// 0.18.0), with the error bodies that CLI reads patched in:
///
/// 1. A 422 is declared as `ErrorResponse {errors: [{param, details}]}` only, but the
///    vendor client reads FastAPI's `{"detail": [..]}` list (SOURCES.md item 11, "which
///    422 body the live API sends is unverified"). Patched: every 422 accepts either.
/// 2. Every other error status carries FastAPI's `{"detail": "<text>"}` (the client reads
///    `detail` for any status but 401 and 422), yet no operation declares one (400, 404,
///    409, 429, 5xx), and P9's `402` on pod create has no body. Patched: every operation
///    gets a `default` with that body, and the 402 the same content.
pub fn primeintellect() -> Spec {
    let path =
        vendor_apis_dir().join("primeintellect/prime-intellect-compute-api-openapi.fixed.yml");
    Spec::load(path).patch(|doc| {
        let detail = json!({"type": "object", "required": ["detail"], "properties": {
            "detail": {"anyOf": [{"type": "string"}, {"type": "array"}]}
        }});
        let fastapi = json!({
            "description": "gpuprov harness patch (see primeintellect()): FastAPI's error body",
            "content": {"application/json": {"schema": detail}}
        });
        let validation = json!({
            "description": "gpuprov harness patch (see primeintellect()): either 422 body",
            "content": {"application/json": {"schema": {"anyOf": [
                {"$ref": "#/components/schemas/ErrorResponse"},
                {"type": "object", "required": ["detail"], "properties": {"detail": {"type": "array"}}}
            ]}}}
        });
        if let Some(paths) = doc["paths"].as_object_mut() {
            for item in paths.values_mut() {
                for m in METHODS {
                    if let Some(responses) = item
                        .get_mut(*m)
                        .and_then(|op| op.get_mut("responses"))
                        .and_then(Value::as_object_mut)
                    {
                        if responses.contains_key("422") {
                            responses.insert("422".into(), validation.clone());
                        }
                        if responses.contains_key("402") {
                            responses.insert("402".into(), fastapi.clone());
                        }
                        responses.entry("default").or_insert_with(|| fastapi.clone());
                    }
                }
            }
        }
    })
}
