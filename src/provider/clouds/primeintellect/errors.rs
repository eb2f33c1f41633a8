//! Prime Intellect's errors as data (design 4.1): the error body decoder and the table that
//! classifies a [`Failure`] into the contract's kinds.
//!
//! The API is FastAPI: a request that does not validate is a 422 whose body is FastAPI's
//! `{"detail": [{loc, msg, type}, ...]}` (what the vendor CLI `prime` 0.18.0 reads,
//! `prime_cli/core/client.py`), or the description's `{"errors": [{param, details}]}`;
//! any other error carries `{"detail": "<text>"}`. A 422 is the ask breaking the API's
//! contract — `InvalidRequest`, never capacity, whatever it names. 402 is "Payment
//! required" (the CLI's `PaymentRequiredError`). Capacity is recognised only from the
//! vendor's own words on a create; anything else is `Failed`.

use serde_json::Value;

use crate::provider::kit::failure::{clip, Classifier, Rule};
use crate::provider::{cause, ErrorKind};

/// The call name of a pod create (its capacity phrases count only there).
pub const CREATE: &str = "create";
/// The call name of the project key's upload by its shared node (`create_shared`): a
/// refusal there means the key exists.
pub const REGISTER_KEY: &str = "register_key";

/// A create refused for lack of stock, in the vendor's words.
const NO_CAPACITY: &[&str] = &[
    "out of stock",
    "no capacity",
    "not enough capacity",
    "insufficient capacity",
    "no longer available",
    "sold out",
];

const CHECK_KEY: &str =
    "check the API key in PRIME_API_KEY (or `prime login`'s ~/.prime/config.json)";

/// The vendor's table, first match wins (the kit's defaults follow it).
const RULES: &[Rule] = &[
    // A key upload refused: the description gives `POST /api/v1/ssh_keys/` no conflict
    // answer, only 401 and the 422 `ErrorResponse` (SOURCES.md: the vendor CLI has no
    // ssh-key client to say more), so the documented 422 is taken to mean the key (or
    // its name) exists: the shared node observes again and adopts it by value. A really
    // invalid key is not found either and ends `Failed` after the node's retries.
    Rule::status(422, ErrorKind::Exists).on(REGISTER_KEY),
    Rule::status(422, ErrorKind::InvalidRequest)
        .help("the API refused the request as invalid (FastAPI validation)"),
    Rule::status(402, ErrorKind::Credentials).help("add funds to the Prime Intellect wallet"),
    Rule::code("*", ErrorKind::Capacity)
        .phrases(NO_CAPACITY)
        .on(CREATE),
    Rule::status(404, ErrorKind::InvalidRequest),
];

/// Prime Intellect's classifier.
pub static CLASSIFIER: Classifier = Classifier {
    cloud: super::CLOUD,
    rules: RULES,
    credentials_help: CHECK_KEY,
};

/// One FastAPI validation entry as text: `body.pod.gpuCount: Input should be greater than 0`.
fn validation_entry(e: &Value) -> String {
    let loc = e["loc"]
        .as_array()
        .map(|l| {
            l.iter()
                .map(|p| match p {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect::<Vec<_>>()
                .join(".")
        })
        .or_else(|| e["param"].as_str().map(str::to_string))
        .unwrap_or_default();
    let msg = e["msg"]
        .as_str()
        .or_else(|| e["details"].as_str())
        .map(str::to_string)
        .unwrap_or_else(|| e.to_string());
    if loc.is_empty() {
        msg
    } else {
        format!("{loc}: {msg}")
    }
}

/// The error body decoder. A FastAPI body (`detail` text or list) or the description's
/// `errors` list is the vendor's (empty code), as `HTTP <s>: <text>` with every entry,
/// cut to 300 characters; any other body is one short line ([`cause::http_cause`]).
pub fn decode(status: u16, content_type: Option<&str>, body: &str) -> (Option<String>, String) {
    let Ok(v) = serde_json::from_str::<Value>(body) else {
        return (None, cause::http_cause(status, content_type, body));
    };
    let text = match (&v["detail"], &v["errors"]) {
        (Value::String(s), _) => s.clone(),
        (Value::Array(list), _) | (Value::Null, Value::Array(list)) => list
            .iter()
            .map(validation_entry)
            .collect::<Vec<_>>()
            .join("; "),
        _ => return (None, cause::http_cause(status, content_type, body)),
    };
    let text = clip(&text);
    (Some(String::new()), format!("HTTP {status}: {text}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::kit::failure::Failure;
    use crate::provider::kit::testing::proxy_page;
    use crate::provider::kit::Call;

    fn kind(status: u16, body: &str, call: &'static str) -> ErrorKind {
        let (code, message) = decode(status, Some("application/json"), body);
        CLASSIFIER
            .classify(
                &Failure::http(status, code, message),
                Call::named(call, "x"),
                [],
            )
            .kind
    }

    #[test]
    fn a_fastapi_422_is_an_invalid_request_never_capacity() {
        let body = r#"{"detail":[{"loc":["body","pod","gpuCount"],"msg":"Input should be greater than 0","type":"greater_than"},{"loc":["body","provider"],"msg":"Field required","type":"missing"}]}"#;
        assert_eq!(kind(422, body, CREATE), ErrorKind::InvalidRequest);
        let (_, m) = decode(422, None, body);
        assert_eq!(
            m,
            "HTTP 422: body.pod.gpuCount: Input should be greater than 0; body.provider: Field required"
        );
        // Even when it names stock: a 422 is the request's fault.
        let stock = r#"{"detail":[{"loc":["body","pod","cloudId"],"msg":"no capacity for this cloudId","type":"value_error"}]}"#;
        assert_eq!(kind(422, stock, CREATE), ErrorKind::InvalidRequest);
        // The description's own 422 shape.
        let errors = r#"{"errors":[{"param":"gpu_count","details":"must be positive"}]}"#;
        assert_eq!(kind(422, errors, "other"), ErrorKind::InvalidRequest);
        // Only the shared node's key upload reads a 422 as "it exists".
        let taken = r#"{"errors":[{"param":"publicKey","details":"already exists"}]}"#;
        assert_eq!(kind(422, taken, REGISTER_KEY), ErrorKind::Exists);
        assert_eq!(kind(422, taken, "other"), ErrorKind::InvalidRequest);
        assert_eq!(kind(401, "{}", REGISTER_KEY), ErrorKind::Credentials);
        assert_eq!(
            decode(422, None, errors).1,
            "HTTP 422: gpu_count: must be positive"
        );
    }

    #[test]
    fn other_statuses() {
        use ErrorKind::*;
        assert_eq!(
            kind(402, r#"{"detail":"Insufficient balance"}"#, CREATE),
            Credentials
        );
        assert_eq!(
            kind(401, r#"{"detail":"Invalid API key"}"#, "other"),
            Credentials
        );
        assert_eq!(
            kind(400, r#"{"detail":"GPU is out of stock"}"#, CREATE),
            Capacity
        );
        assert_eq!(
            kind(400, r#"{"detail":"GPU is out of stock"}"#, "other"),
            Failed
        );
        assert_eq!(kind(400, r#"{"detail":"Something else"}"#, CREATE), Failed);
        assert_eq!(
            kind(404, r#"{"detail":"Pod not found"}"#, "other"),
            InvalidRequest
        );
        assert_eq!(kind(503, r#"{"detail":"busy"}"#, CREATE), Transient);
        let (code, m) = decode(502, Some("text/html"), &proxy_page());
        assert_eq!(
            (code, m.as_str()),
            (None, "HTTP 502 (text/html): 502 Bad Gateway")
        );
        let (code, _) = decode(400, None, r#"{"unrelated":1}"#);
        assert_eq!(code, None, "not a FastAPI body");
    }
}
