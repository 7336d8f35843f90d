//! The per-kind validation the apiserver runs on every write of an object, after decoding and
//! before storing (create, update, patch, server-side apply, dry run or not):
//!
//! - a Secret's `stringData` is folded into `data` first (base64, `stringData` wins) and never
//!   stored: k8s `pkg/apis/core/v1/conversion.go` `Convert_v1_Secret_To_core_Secret`;
//! - ConfigMap `data` and `binaryData` keys and Secret `data` keys must be config keys:
//!   k8s `pkg/apis/core/validation/validation.go` `ValidateConfigMap`, `ValidateSecret`, with
//!   k8s.io/apimachinery `pkg/util/validation/validation.go` `IsConfigMapKey`.
//!
//! A failure is the apiserver's 422 ([`ApiError::invalid_fields`]). The apiserver walks the
//! keys in Go map order; the simulator reports them sorted.

use base64::Engine as _;
use serde_json::{Map, Value};

use super::Result;
use crate::sim::kube::resources::{CONFIGMAPS, JOBS, ResourceType, SECRETS};
use crate::sim::kube::status::{ApiError, FieldError};
use crate::sim::kube::store::name_of;

/// `DNS1123SubdomainMaxLength`.
const MAX_KEY_LEN: usize = 253;
/// `configMapKeyFmt`.
const CONFIG_MAP_KEY_FMT: &str = "[-._a-zA-Z0-9]+";

/// `IsConfigMapKey`: what is wrong with `key` as a ConfigMap or Secret key, in upstream's order
/// and wording (`MaxLenError`, `RegexError` with its three examples, `hasChDirPrefix`).
pub(crate) fn config_map_key_errors(key: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if key.len() > MAX_KEY_LEN {
        errs.push(format!("must be no more than {MAX_KEY_LEN} characters"));
    }
    let valid = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if !valid {
        errs.push(format!(
            "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '{CONFIG_MAP_KEY_FMT}')"
        ));
    }
    if key == "." {
        errs.push("must not be '.'".to_string());
    } else if key == ".." {
        errs.push("must not be '..'".to_string());
    } else if key.starts_with("..") {
        errs.push("must not start with '..'".to_string());
    }
    errs
}

fn key_errors(errors: &mut Vec<FieldError>, path: &str, map: Option<&Map<String, Value>>) {
    for key in map.into_iter().flat_map(Map::keys) {
        for detail in config_map_key_errors(key) {
            errors.push(FieldError {
                field: format!("{path}[{key}]"),
                value: key.clone(),
                detail,
            });
        }
    }
}

/// Fold a Secret's `stringData` into `data`, as the v1 → internal conversion does.
fn fold_string_data(obj: &mut Value) {
    let Some(m) = obj.as_object_mut() else {
        return;
    };
    let Some(Value::Object(strings)) = m.remove("stringData") else {
        return;
    };
    let data = m.entry("data").or_insert_with(|| Value::Object(Map::new()));
    if !data.is_object() {
        *data = Value::Object(Map::new());
    }
    if let Some(data) = data.as_object_mut() {
        for (k, v) in strings {
            let text = v.as_str().unwrap_or_default();
            data.insert(
                k,
                Value::String(base64::engine::general_purpose::STANDARD.encode(text)),
            );
        }
    }
}

/// Validate (and, for a Secret, convert) `obj` of type `rt` as the apiserver does before
/// storing it.
pub(super) fn validate(rt: &ResourceType, obj: &mut Value) -> Result<()> {
    let mut errors = Vec::new();
    if std::ptr::eq(rt, &SECRETS) {
        fold_string_data(obj);
        key_errors(
            &mut errors,
            "data",
            obj.get("data").and_then(Value::as_object),
        );
    } else if std::ptr::eq(rt, &CONFIGMAPS) {
        key_errors(
            &mut errors,
            "data",
            obj.get("data").and_then(Value::as_object),
        );
        key_errors(
            &mut errors,
            "binaryData",
            obj.get("binaryData").and_then(Value::as_object),
        );
    }
    if std::ptr::eq(rt, &JOBS) {
        crate::sim::kube::batch::defaults(obj);
        let problems = crate::sim::kube::batch::validate(obj);
        if !problems.is_empty() {
            return Err(ApiError::invalid_causes(
                rt,
                name_of(obj),
                &problems
                    .iter()
                    .map(|p| (p.field.as_str(), p.reason, p.message.as_str()))
                    .collect::<Vec<_>>(),
            ));
        }
    }
    if errors.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid_fields(rt, name_of(obj), &errors))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_colon_in_a_config_map_key_is_the_apiservers_422() {
        let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "inv", "namespace": "kube-system"},
            "data": {"_system:coredns_rbac.authorization.k8s.io_ClusterRole": "", "ok_key": ""}});
        let err = validate(&CONFIGMAPS, &mut cm).unwrap_err();
        assert_eq!(err.code, 422);
        assert_eq!(err.reason, "Invalid");
        assert_eq!(
            err.message,
            "ConfigMap \"inv\" is invalid: data[_system:coredns_rbac.authorization.k8s.io_ClusterRole]: Invalid value: \"_system:coredns_rbac.authorization.k8s.io_ClusterRole\": a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"
        );
        let details = err.details.unwrap();
        assert_eq!(details.kind.as_deref(), Some("ConfigMap"));
        let causes = details.causes.unwrap();
        assert_eq!(causes.len(), 1);
        assert_eq!(
            causes[0].field.as_deref(),
            Some("data[_system:coredns_rbac.authorization.k8s.io_ClusterRole]")
        );
        let mut fine = json!({"kind": "ConfigMap", "metadata": {"name": "x"},
            "data": {"_system__coredns_rbac.authorization.k8s.io_ClusterRole": ""}});
        assert!(validate(&CONFIGMAPS, &mut fine).is_ok());
    }

    #[test]
    fn config_map_key_rules_are_upstreams() {
        assert!(config_map_key_errors("key.name").is_empty());
        assert_eq!(config_map_key_errors(".."), vec!["must not be '..'"]);
        assert_eq!(
            config_map_key_errors("..a"),
            vec!["must not start with '..'"]
        );
        assert_eq!(config_map_key_errors(".").len(), 1);
        let long = "a".repeat(254);
        assert_eq!(
            config_map_key_errors(&long),
            vec!["must be no more than 253 characters"]
        );
        // two reasons for one key, and a second key: aggregated in brackets
        let mut cm = json!({"kind": "ConfigMap", "metadata": {"name": "c"},
            "data": {"a b": ""}, "binaryData": {"..": ""}});
        let err = validate(&CONFIGMAPS, &mut cm).unwrap_err();
        assert!(
            err.message.starts_with(
                "ConfigMap \"c\" is invalid: [data[a b]: Invalid value: \"a b\": a valid config key"
            ),
            "{}",
            err.message
        );
        assert!(
            err.message
                .ends_with(", binaryData[..]: Invalid value: \"..\": must not be '..']"),
            "{}",
            err.message
        );
    }

    #[test]
    fn secret_string_data_is_folded_into_data_and_validated_there() {
        let mut s = json!({"kind": "Secret", "metadata": {"name": "t"},
            "data": {"a": "b2xk"}, "stringData": {"a": "new", "token-id": "x"}});
        validate(&SECRETS, &mut s).unwrap();
        assert!(s.get("stringData").is_none());
        assert_eq!(s["data"]["a"], "bmV3");
        assert_eq!(s["data"]["token-id"], "eA==");
        let mut bad = json!({"kind": "Secret", "metadata": {"name": "t"},
            "stringData": {"a:b": "x"}});
        let err = validate(&SECRETS, &mut bad).unwrap_err();
        assert!(
            err.message
                .starts_with("Secret \"t\" is invalid: data[a:b]: Invalid value: \"a:b\""),
            "{}",
            err.message
        );
    }
}
