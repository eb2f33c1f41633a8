//! [`JsonText`]: a JSON value of the state kept as its text until something reads it.
//!
//! A machine's journalled state and its applied settings are most of a state file, and
//! most commands read few of them (a `plan` of unchanged machines decodes each record
//! once, `status` only labels). Parsing them into `serde_json::Value` trees cost half of
//! a 10,000-machine plan and five times the file's size in memory (issue 20); their text
//! costs one scan and one copy, and is decoded straight into the type that reads it.

use std::fmt;
use std::sync::OnceLock;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

/// One JSON value (any kind: object, array, string, number, bool, null) held as valid
/// JSON text, exactly as read: from a pretty state file it keeps the file's whitespace,
/// from a journal line or [`JsonText::encode`] it is compact.
///
/// - It reads with [`JsonText::decode`] (into a typed value) or [`JsonText::to_value`].
/// - It writes through whatever serializer holds it, token by token, so a pretty state
///   file gets it pretty and a journal line (JSON Lines) gets it on one line, whatever
///   whitespace the text has.
/// - Two are equal when their JSON values are (whitespace and key order aside).
///
/// It deserializes only from `serde_json`'s own deserializers (text or `Value`), not
/// through serde's buffering of internally tagged enums or `flatten`; the types holding it
/// read their fields by hand where they would buffer (`StateFile`, `ResourceRecord`,
/// `JournalOp`).
#[derive(Clone)]
pub struct JsonText(Box<RawValue>, OnceLock<bool>);

impl JsonText {
    /// The compact JSON of `value`.
    ///
    /// # Errors
    ///
    /// Whatever `value`'s `Serialize` refuses (a map with non-string keys, say).
    pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<JsonText, serde_json::Error> {
        serde_json::value::to_raw_value(value).map(JsonText::made)
    }

    /// Text serde_json wrote itself, which re-emits by construction.
    fn made(text: Box<RawValue>) -> JsonText {
        JsonText(text, OnceLock::from(true))
    }

    /// The compact JSON of a `Value` (which always serializes).
    pub fn from_value(value: &Value) -> JsonText {
        let text = value.to_string();
        // `Value`'s text is valid JSON; `null` is only the unreachable fallback.
        JsonText::made(RawValue::from_string(text).unwrap_or_else(|_| null()))
    }

    /// Decodes the text as a `T`.
    ///
    /// # Errors
    ///
    /// `serde_json`'s error when the value does not fit `T` (its line and column count
    /// within this text).
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }

    /// The value as a `serde_json::Value` tree; `Value::Null` for text a tree cannot
    /// hold (a number beyond `f64`, a lone surrogate escape: see [`Serialize`]).
    pub fn to_value(&self) -> Value {
        self.decode().unwrap_or(Value::Null)
    }

    /// The JSON text, as held.
    pub fn as_str(&self) -> &str {
        self.0.get()
    }

    /// Whether the value is JSON `null`.
    pub fn is_null(&self) -> bool {
        self.0.get().trim() == "null"
    }
}

fn null() -> Box<RawValue> {
    RawValue::from_string("null".to_string()).expect("`null` is JSON")
}

impl From<Value> for JsonText {
    fn from(value: Value) -> JsonText {
        JsonText::from_value(&value)
    }
}

impl fmt::Debug for JsonText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.get())
    }
}

impl PartialEq for JsonText {
    fn eq(&self, other: &JsonText) -> bool {
        self.0.get() == other.0.get() || self.to_value() == other.to_value()
    }
}

impl Serialize for JsonText {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // Re-emitted token by token, so the serializer's own format (pretty or compact)
        // applies. Text that is JSON by its grammar yet holds what serde_json cannot
        // re-emit (a hand-edited `1e400`, a lone surrogate escape) is written as read
        // instead: refusing it would leave a state that can never be saved again.
        if self.transcodes() {
            let mut text = serde_json::Deserializer::from_str(self.0.get());
            serde_transcode::Transcoder::new(&mut text).serialize(serializer)
        } else {
            self.0.serialize(serializer)
        }
    }
}

impl JsonText {
    /// Whether the text re-emits token by token: known for text we made, checked once
    /// (into a sink, at its first save) for text read from a file.
    fn transcodes(&self) -> bool {
        *self.1.get_or_init(|| {
            let mut text = serde_json::Deserializer::from_str(self.0.get());
            let mut sink = serde_json::Serializer::new(std::io::sink());
            serde_transcode::transcode(&mut text, &mut sink).is_ok()
        })
    }
}

impl<'de> Deserialize<'de> for JsonText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<JsonText, D::Error> {
        Box::<RawValue>::deserialize(deserializer).map(|text| JsonText(text, OnceLock::new()))
    }
}

impl schemars::JsonSchema for JsonText {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        <Value as schemars::JsonSchema>::schema_name()
    }

    fn inline_schema() -> bool {
        <Value as schemars::JsonSchema>::inline_schema()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        <Value as schemars::JsonSchema>::json_schema(generator)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_writes_in_its_holders_format_and_reads_back_equal() {
        let v = serde_json::json!({"state": "ready", "vm": {"port": 22, "price": 12.5,
            "name": "a \"quoted\"\nname", "tags": [], "none": null}});
        let pretty = serde_json::to_string_pretty(&serde_json::json!({"machine": v})).unwrap();
        #[derive(Deserialize, Serialize)]
        struct Holder {
            machine: JsonText,
        }
        let read: Holder = serde_json::from_str(&pretty).unwrap();
        assert!(read.machine.as_str().contains('\n'), "kept as read");
        assert_eq!(read.machine.to_value(), v);
        assert_eq!(read.machine, JsonText::from_value(&v), "equal as values");
        assert_eq!(serde_json::to_string_pretty(&read).unwrap(), pretty);
        let line = serde_json::to_string(&read).unwrap();
        assert!(
            !line.contains('\n'),
            "a journal line stays one line: {line}"
        );
        assert_eq!(line, serde_json::json!({"machine": v}).to_string());
        // From a `Value` deserializer too (`serde_json::from_value`).
        let from_tree: Holder = serde_json::from_value(serde_json::json!({"machine": v})).unwrap();
        assert_eq!(from_tree.machine.to_value(), v);
        assert_ne!(from_tree.machine, JsonText::from_value(&Value::Null));
    }

    /// A hand-edited value serde_json cannot re-emit is written back as read, in both
    /// formats, so the state that holds it can still be saved.
    #[test]
    fn a_value_beyond_f64_is_written_as_read() {
        #[derive(Deserialize, Serialize)]
        struct Holder {
            machine: JsonText,
        }
        let line = r#"{"machine":{"big":1e400,"ok":[1,2]}}"#;
        let read: Holder = serde_json::from_str(line).unwrap();
        assert!(read.machine.decode::<Value>().is_err(), "not a tree");
        assert_eq!(serde_json::to_string(&read).unwrap(), line);
        let pretty = serde_json::to_string_pretty(&read).unwrap();
        assert!(
            pretty.contains(r#""machine": {"big":1e400,"ok":[1,2]}"#),
            "{pretty}"
        );
        let again: Holder = serde_json::from_str(&pretty).unwrap();
        assert_eq!(again.machine.as_str(), read.machine.as_str());
    }

    #[test]
    fn null_and_typed_decoding() {
        assert!(JsonText::from_value(&Value::Null).is_null());
        let t: JsonText = serde_json::from_str(" null ").unwrap();
        assert!(t.is_null());
        let n = JsonText::encode(&vec![1u32, 2]).unwrap();
        assert!(!n.is_null());
        assert_eq!(n.decode::<Vec<u32>>().unwrap(), vec![1, 2]);
        let e = n.decode::<String>().unwrap_err();
        assert!(e.to_string().contains("invalid type"), "{e}");
    }
}
