//! The OpenAPI v3 documents of the simulated kube-apiserver, and the field validation
//! (`?fieldValidation=Strict|Warn|Ignore`) they make possible.
//!
//! kubectl ≥ 1.27 needs them for `kubectl apply` with its default `--validate=strict`: it reads
//! `GET /openapi/v3` (the index), then `GET /openapi/v3/apis/apps/v1?hash=…` (one document per
//! group-version) and looks for the `PATCH` operation of the object's group-version-kind
//! (`x-kubernetes-group-version-kind`) with a `fieldValidation` query parameter
//! (k8s.io/cli-runtime `pkg/resource/query_param_verifier_v3.go`). When the server supports
//! it, kubectl sends `fieldValidation=Strict` and the server rejects unknown fields; when it
//! does not, kubectl falls back to client-side validation with the OpenAPI v2 protobuf
//! document. `kubectl apply` then computes its strategic merge patch from the schema found
//! under the same extension when the `PATCH` operation accepts
//! `application/strategic-merge-patch+json` (k8s.io/kubectl `pkg/cmd/apply/patcher.go`,
//! `gvkSupportsPatchOpenAPIV3`).
//!
//! The document layout follows the apiserver's (kubernetes `api/openapi-spec/v3/*.json`;
//! index shape from k8s.io/kube-openapi `pkg/handler3/handler.go`: `{"paths": {"apis/apps/v1":
//! {"serverRelativeURL": "/openapi/v3/apis/apps/v1?hash=…"}}}`). The schemas are generated
//! from k8s-openapi's types (its `schemars` feature, Kubernetes 1.33), so they carry every
//! field of every served kind. They do not carry upstream's list-merge metadata
//! (`x-kubernetes-patch-merge-key`), so kubectl's strategic merge patches from this schema
//! replace lists whole, which the simulator's patch handler applies as a merge patch.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use schemars::JsonSchema;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha512};

use super::resources::{self, ResourceType};

/// One group-version document, its hash and its serialised form.
pub(crate) struct GvDoc {
    pub doc: Value,
    pub hash: String,
    pub text: String,
}

fn add<T: JsonSchema>(g: &mut schemars::SchemaGenerator) {
    g.subschema_for::<T>();
}

/// The k8s-openapi type of a served kind, registered with `g`.
fn register(kind: &str, g: &mut schemars::SchemaGenerator) -> bool {
    use k8s_openapi::api::{
        apps::v1 as apps, batch::v1 as batch, core::v1 as core, flowcontrol::v1 as flowcontrol,
        policy::v1 as policy, rbac::v1 as rbac,
    };
    match kind {
        "Namespace" => add::<core::Namespace>(g),
        "Node" => add::<core::Node>(g),
        "Pod" => add::<core::Pod>(g),
        "ConfigMap" => add::<core::ConfigMap>(g),
        "Secret" => add::<core::Secret>(g),
        "ServiceAccount" => add::<core::ServiceAccount>(g),
        "Service" => add::<core::Service>(g),
        "Deployment" => add::<apps::Deployment>(g),
        "DaemonSet" => add::<apps::DaemonSet>(g),
        "StatefulSet" => add::<apps::StatefulSet>(g),
        "ReplicaSet" => add::<apps::ReplicaSet>(g),
        "PodDisruptionBudget" => add::<policy::PodDisruptionBudget>(g),
        "Job" => add::<batch::Job>(g),
        "PersistentVolume" => add::<core::PersistentVolume>(g),
        "PersistentVolumeClaim" => add::<core::PersistentVolumeClaim>(g),
        "ClusterRole" => add::<rbac::ClusterRole>(g),
        "ClusterRoleBinding" => add::<rbac::ClusterRoleBinding>(g),
        "Role" => add::<rbac::Role>(g),
        "RoleBinding" => add::<rbac::RoleBinding>(g),
        "FlowSchema" => add::<flowcontrol::FlowSchema>(g),
        "PriorityLevelConfiguration" => add::<flowcontrol::PriorityLevelConfiguration>(g),
        _ => return false,
    }
    true
}

/// `io.k8s.api.apps.v1.Deployment` for `apps/v1 Deployment`.
fn schema_name(rt: &ResourceType) -> String {
    let group = match rt.group {
        "" => "core",
        "rbac.authorization.k8s.io" => "rbac",
        resources::FLOWCONTROL_GROUP => "flowcontrol",
        g => g,
    };
    format!("io.k8s.api.{group}.{}.{}", rt.version, rt.kind)
}

/// The index key of a group-version: `api/v1`, `apis/apps/v1`.
fn gv_key(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

fn camel(s: &str) -> String {
    s.split(['.', '-'])
        .next()
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
                .unwrap_or_default()
        })
        .unwrap_or_default()
}

fn query(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": {"type": "string", "uniqueItems": true}})
}

fn write_params(patch: bool) -> Vec<Value> {
    let mut p = vec![
        query(
            "dryRun",
            "When present, indicates that modifications should not be persisted.",
        ),
        query(
            "fieldManager",
            "fieldManager is a name associated with the actor or entity that is making these changes.",
        ),
        query(
            "fieldValidation",
            "fieldValidation instructs the server on how to handle objects in the request (POST/PUT/PATCH) containing unknown or duplicate fields. Valid values are: Ignore, Warn (the default), Strict.",
        ),
    ];
    if patch {
        p.push(json!({"name": "force", "in": "query", "description": "Force is going to \"force\" Apply requests.", "schema": {"type": "boolean", "uniqueItems": true}}));
    }
    p
}

fn object_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn operation(
    verb: &str,
    action: &str,
    rt: &ResourceType,
    scope: &str,
    body: Option<Value>,
) -> Value {
    let gvk = json!({"group": rt.group, "version": rt.version, "kind": rt.kind});
    let id = format!(
        "{verb}{}{}{scope}{}",
        if rt.group.is_empty() {
            "Core".to_string()
        } else {
            camel(rt.group)
        },
        camel(rt.version),
        rt.kind
    );
    let name = schema_name(rt);
    let mut op = json!({
        "operationId": id,
        "tags": [gv_key(rt.group, rt.version).replace('/', "_")],
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": gvk,
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": object_ref(&name)}}},
            "401": {"description": "Unauthorized"},
        },
    });
    if let Some(b) = body {
        op["requestBody"] = b;
        op["parameters"] = Value::Array(write_params(action == "patch"));
    }
    op
}

fn path_params(ns: bool, name: bool) -> Value {
    let mut p = Vec::new();
    if name {
        p.push(json!({"name": "name", "in": "path", "description": "name of the object", "required": true, "schema": {"type": "string", "uniqueItems": true}}));
    }
    if ns {
        p.push(json!({"name": "namespace", "in": "path", "description": "object name and auth scope, such as for teams and projects", "required": true, "schema": {"type": "string", "uniqueItems": true}}));
    }
    Value::Array(p)
}

fn paths_of(rt: &ResourceType, paths: &mut Map<String, Value>) {
    let name = schema_name(rt);
    let prefix = format!("/{}", gv_key(rt.group, rt.version));
    let (base, scope) = if rt.namespaced {
        (
            format!("{prefix}/namespaces/{{namespace}}/{}", rt.plural),
            "Namespaced",
        )
    } else {
        (format!("{prefix}/{}", rt.plural), "")
    };
    let json_body = json!({"content": {"*/*": {"schema": object_ref(&name)}}, "required": true});
    let patch_schema = object_ref("io.k8s.apimachinery.pkg.apis.meta.v1.Patch");
    let patch_body = json!({"content": {
        "application/apply-patch+yaml": {"schema": patch_schema},
        "application/json-patch+json": {"schema": patch_schema},
        "application/merge-patch+json": {"schema": patch_schema},
        "application/strategic-merge-patch+json": {"schema": patch_schema},
    }, "required": true});
    paths.insert(
        base.clone(),
        json!({
            "get": operation("list", "list", rt, scope, None),
            "post": operation("create", "post", rt, scope, Some(json_body.clone())),
            "parameters": path_params(rt.namespaced, false),
        }),
    );
    paths.insert(
        format!("{base}/{{name}}"),
        json!({
            "get": operation("read", "get", rt, scope, None),
            "put": operation("replace", "put", rt, scope, Some(json_body)),
            "patch": operation("patch", "patch", rt, scope, Some(patch_body)),
            "delete": operation("delete", "delete", rt, scope, None),
            "parameters": path_params(rt.namespaced, true),
        }),
    );
}

fn build(group: &str, version: &str) -> Option<GvDoc> {
    let served: Vec<&'static ResourceType> = resources::ALL
        .iter()
        .chain(resources::OLDER_VERSIONS)
        .copied()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    let mut g = schemars::generate::SchemaSettings::openapi3().into_generator();
    let mut paths = Map::new();
    let mut kinds = Vec::new();
    for rt in served {
        if register(rt.kind, &mut g) {
            paths_of(rt, &mut paths);
            kinds.push(rt);
        }
    }
    if kinds.is_empty() {
        return None;
    }
    let mut schemas = g.take_definitions(true);
    // an older version is described with its stored version's schema (k8s-openapi only has
    // the current types), under its own name
    for rt in &kinds {
        let stored = schema_name(resources::storage_of(rt));
        if stored != schema_name(rt)
            && let Some(s) = schemas.remove(&stored)
        {
            schemas.insert(schema_name(rt), s);
        }
    }
    for rt in kinds {
        if let Some(Value::Object(s)) = schemas.get_mut(&schema_name(rt)) {
            s.insert(
                "x-kubernetes-group-version-kind".into(),
                json!([{"group": rt.group, "kind": rt.kind, "version": rt.version}]),
            );
        }
    }
    schemas.insert(
        "io.k8s.apimachinery.pkg.apis.meta.v1.Patch".into(),
        json!({"description": "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body.", "type": "object"}),
    );
    let doc = json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"BearerToken": {"type": "apiKey", "name": "authorization", "in": "header", "description": "Bearer Token authentication"}},
        },
    });
    let text = doc.to_string();
    let hash = hex::encode_upper(Sha512::digest(text.as_bytes()));
    Some(GvDoc { doc, hash, text })
}

fn all() -> &'static BTreeMap<String, GvDoc> {
    static DOCS: OnceLock<BTreeMap<String, GvDoc>> = OnceLock::new();
    DOCS.get_or_init(|| {
        let mut gvs: Vec<(&str, &str)> = resources::ALL
            .iter()
            .chain(resources::OLDER_VERSIONS)
            .map(|r| (r.group, r.version))
            .collect();
        gvs.dedup();
        gvs.sort();
        gvs.dedup();
        gvs.into_iter()
            .filter_map(|(g, v)| build(g, v).map(|d| (gv_key(g, v), d)))
            .collect()
    })
}

/// `GET /openapi/v3`: where each group-version's document is.
pub(crate) fn index(minor: crate::api_lifecycle::Minor) -> Value {
    let served: Vec<String> = resources::served(minor)
        .map(|r| gv_key(r.group, r.version))
        .collect();
    let paths: Map<String, Value> = all()
        .iter()
        .filter(|(k, _)| served.contains(k))
        .map(|(k, d)| {
            (
                k.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{k}?hash={}", d.hash)}),
            )
        })
        .collect();
    json!({ "paths": paths })
}

/// `GET /openapi/v3/<key>`: the document of one group-version (`api/v1`, `apis/apps/v1`).
pub(crate) fn document(key: &str) -> Option<&'static GvDoc> {
    all().get(key)
}

/// The unknown fields of `obj` for its kind's schema, as the apiserver's strict decoding names
/// them (`spec.template.spec.containers[0].imagee`). Kinds without a schema have none.
#[cfg(test)]
pub(crate) fn unknown_fields(rt: &ResourceType, obj: &Value) -> Vec<String> {
    prune_unknown_fields(rt, &mut obj.clone())
}

/// [`unknown_fields`], removing them from `obj` as the apiserver's decoding into its typed
/// object does when they are only warned about or ignored.
pub(crate) fn prune_unknown_fields(rt: &ResourceType, obj: &mut Value) -> Vec<String> {
    let Some(doc) = document(&gv_key(rt.group, rt.version)) else {
        return Vec::new();
    };
    let Some(schemas) = doc
        .doc
        .pointer("/components/schemas")
        .and_then(Value::as_object)
    else {
        return Vec::new();
    };
    let Some(root) = schemas.get(&schema_name(rt)) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    walk(schemas, root, obj, "", &mut out, 0);
    out
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn walk(
    schemas: &Map<String, Value>,
    schema: &Value,
    v: &mut Value,
    path: &str,
    out: &mut Vec<String>,
    depth: usize,
) {
    if depth > 64 {
        return;
    }
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        if let Some(s) = r
            .strip_prefix("#/components/schemas/")
            .and_then(|n| schemas.get(n))
        {
            walk(schemas, s, v, path, out, depth + 1);
        }
        return;
    }
    if let Some(all) = schema.get("allOf").and_then(Value::as_array) {
        for s in all {
            walk(schemas, s, v, path, out, depth + 1);
        }
        return;
    }
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        return;
    }
    match v {
        Value::Object(m) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let extra = schema.get("additionalProperties").filter(|a| a.is_object());
            let mut unknown = Vec::new();
            for (k, val) in m.iter_mut() {
                match (props.and_then(|p| p.get(k)), extra) {
                    (Some(s), _) | (None, Some(s)) => {
                        walk(schemas, s, val, &join(path, k), out, depth + 1)
                    }
                    (None, None) if props.is_some() => {
                        out.push(join(path, k));
                        unknown.push(k.clone());
                    }
                    (None, None) => {}
                }
            }
            for k in unknown {
                m.remove(&k);
            }
        }
        Value::Array(a) => {
            if let Some(items) = schema.get("items") {
                for (i, item) in a.iter_mut().enumerate() {
                    walk(
                        schemas,
                        items,
                        item,
                        &format!("{path}[{i}]"),
                        out,
                        depth + 1,
                    );
                }
            }
        }
        _ => {}
    }
}

/// How a write request wants unknown fields handled (`fieldValidation`, default `Warn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

impl FieldValidation {
    pub(crate) fn from_query(v: Option<&str>) -> Result<FieldValidation, String> {
        match v {
            None | Some("") | Some("Warn") => Ok(FieldValidation::Warn),
            Some("Ignore") => Ok(FieldValidation::Ignore),
            Some("Strict") => Ok(FieldValidation::Strict),
            Some(other) => Err(format!(
                "fieldValidation parameter unsupported: {other}. Supported values are Ignore, Warn, Strict"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_points_at_each_group_version_with_a_hash() {
        let idx = index((1, 33));
        let url = idx["paths"]["apis/apps/v1"]["serverRelativeURL"]
            .as_str()
            .unwrap();
        let hash = &document("apis/apps/v1").unwrap().hash;
        assert_eq!(url, format!("/openapi/v3/apis/apps/v1?hash={hash}"));
        for k in [
            "api/v1",
            "apis/policy/v1",
            "apis/rbac.authorization.k8s.io/v1",
        ] {
            assert!(idx["paths"].get(k).is_some(), "{k}");
        }
    }

    #[test]
    fn patch_operations_name_their_kind_and_accept_field_validation() {
        let d = &document("apis/apps/v1").unwrap().doc;
        let op = &d["paths"]["/apis/apps/v1/namespaces/{namespace}/statefulsets/{name}"]["patch"];
        assert_eq!(
            op["x-kubernetes-group-version-kind"],
            json!({"group": "apps", "version": "v1", "kind": "StatefulSet"})
        );
        assert!(
            op["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "fieldValidation" && p["in"] == "query")
        );
        assert!(
            op["requestBody"]["content"]
                .get("application/strategic-merge-patch+json")
                .is_some()
        );
        let s = &d["components"]["schemas"]["io.k8s.api.apps.v1.Deployment"];
        assert_eq!(
            s["x-kubernetes-group-version-kind"][0]["kind"],
            "Deployment"
        );
        // every reference resolves inside the document
        let text = &document("api/v1").unwrap().text;
        let schemas = document("api/v1").unwrap().doc["components"]["schemas"]
            .as_object()
            .unwrap();
        for r in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = &r[..r.find('"').unwrap()];
            assert!(schemas.contains_key(name), "{name}");
        }
    }

    #[test]
    fn unknown_fields_are_named_by_their_path() {
        let dep = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "x", "labels": {"a": "b"}, "annotations": {"k": "v"}},
            "spec": {"replicass": 2, "selector": {"matchLabels": {"a": "b"}},
                "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [
                    {"name": "c", "image": "i", "resources": {"limits": {"cpu": "1"}}},
                    {"name": "d", "imagee": "i"}]}}},
        });
        let rt = resources::by_kind("apps/v1", "Deployment").unwrap();
        assert_eq!(
            unknown_fields(rt, &dep),
            ["spec.replicass", "spec.template.spec.containers[1].imagee"]
        );
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "b"}, "extra": 1});
        let rt = resources::by_kind("v1", "ConfigMap").unwrap();
        assert_eq!(unknown_fields(rt, &cm), ["extra"]);
        let mut pruned = cm.clone();
        assert_eq!(prune_unknown_fields(rt, &mut pruned), ["extra"]);
        assert_eq!(
            pruned,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "b"}})
        );
    }
}
