//! JSON Schemas of the file format, generated from [`super::format`] (`medea schema`).

use schemars::{JsonSchema, Schema, schema_for};
use serde_json::{Value, json};

use super::format::{API_VERSION, ClusterDoc, NodePoolDoc};

/// Base URL the schemas declare as their `$id` (the files are also used by relative path).
pub const SCHEMA_BASE: &str = "https://medea.dev/schemas/v1alpha1";

#[allow(
    clippy::expect_used,
    reason = "schemars renders a struct as a JSON object with `properties`; a unit test renders every kind"
)]
fn kind_schema<T: JsonSchema>(kind: &str, file: &str) -> Value {
    let schema: Schema = schema_for!(T);
    let mut v = schema.to_value();
    let obj = v.as_object_mut().expect("a struct schema is an object");
    obj.insert("$id".into(), json!(format!("{SCHEMA_BASE}/{file}")));
    let props = obj
        .get_mut("properties")
        .and_then(Value::as_object_mut)
        .expect("kind schemas have properties");
    props.insert(
        "apiVersion".into(),
        json!({ "description": format!("Always `{API_VERSION}`."), "const": API_VERSION }),
    );
    props.insert(
        "kind".into(),
        json!({ "description": format!("Always `{kind}`."), "const": kind }),
    );
    v
}

/// `(file name, pretty JSON)` for every schema medea publishes, in a stable order.
#[allow(clippy::expect_used, reason = "a serde_json::Value always serializes")]
pub fn all() -> Vec<(&'static str, String)> {
    let cluster = kind_schema::<ClusterDoc>("Cluster", "cluster.json");
    let pool = kind_schema::<NodePoolDoc>("NodePool", "nodepool.json");
    let any = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": format!("{SCHEMA_BASE}/medea.json"),
        "title": "medea desired state (any kind)",
        "oneOf": [ { "$ref": "cluster.json" }, { "$ref": "nodepool.json" } ]
    });
    [
        ("cluster.json", cluster),
        ("nodepool.json", pool),
        ("medea.json", any),
    ]
    .into_iter()
    .map(|(name, v)| {
        let mut text = serde_json::to_string_pretty(&v).expect("schemas serialize");
        text.push('\n');
        (name, text)
    })
    .collect()
}

/// The schema file a document kind validates against.
pub fn file_for_kind(kind: &str) -> Option<&'static str> {
    match kind {
        "Cluster" => Some("cluster.json"),
        "NodePool" => Some("nodepool.json"),
        _ => None,
    }
}
