//! `google.protobuf.Struct` ⇄ JSON, for COSI specs that embed Kubernetes objects as a Struct
//! (`StaticPodStatusSpec.pod_status`, `KubeletSpecSpec.config`).

use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Value};

/// Convert a JSON value into a protobuf `Value`.
pub fn to_value(json: &serde_json::Value) -> Value {
    let kind = match json {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(a) => Kind::ListValue(ListValue {
            values: a.iter().map(to_value).collect(),
        }),
        serde_json::Value::Object(o) => Kind::StructValue(to_struct(o)),
    };
    Value { kind: Some(kind) }
}

/// Convert a JSON object into a protobuf `Struct`.
pub fn to_struct(obj: &serde_json::Map<String, serde_json::Value>) -> Struct {
    Struct {
        fields: obj.iter().map(|(k, v)| (k.clone(), to_value(v))).collect(),
    }
}

/// Convert a protobuf `Value` into JSON.
pub fn from_value(v: &Value) -> serde_json::Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::BoolValue(b)) => serde_json::Value::Bool(*b),
        Some(Kind::NumberValue(n)) => serde_json::Number::from_f64(*n)
            .map(serde_json::Value::Number)
            .unwrap_or(serde_json::Value::Null),
        Some(Kind::StringValue(s)) => serde_json::Value::String(s.clone()),
        Some(Kind::ListValue(l)) => {
            serde_json::Value::Array(l.values.iter().map(from_value).collect())
        }
        Some(Kind::StructValue(s)) => from_struct(s),
    }
}

/// Convert a protobuf `Struct` into a JSON object.
pub fn from_struct(s: &Struct) -> serde_json::Value {
    serde_json::Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), from_value(v)))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_json() {
        let json = serde_json::json!({
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "restarts": 2.0,
            "ok": true,
            "none": null
        });
        let s = to_struct(json.as_object().unwrap());
        assert_eq!(from_struct(&s), json);
    }
}
