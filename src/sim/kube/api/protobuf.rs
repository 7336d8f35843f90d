//! The one protobuf request body the simulator reads: a `SelfSubjectAccessReview`, which
//! `kubectl auth can-i` sends as protobuf. The other requests kubectl and medea send the
//! simulator are JSON. Replies are always JSON, which kubectl's `Accept` allows.

use serde_json::{Value, json};

use super::ApiError;

/// `k8s.io/apimachinery/pkg/runtime.Unknown` after the `k8s\0` magic.
#[derive(Clone, PartialEq, prost::Message)]
struct Unknown {
    #[prost(message, optional, tag = "1")]
    type_meta: Option<TypeMeta>,
    #[prost(bytes = "vec", tag = "2")]
    raw: Vec<u8>,
}
#[derive(Clone, PartialEq, prost::Message)]
struct TypeMeta {
    #[prost(string, tag = "1")]
    api_version: String,
    #[prost(string, tag = "2")]
    kind: String,
}
/// `authorization/v1.SelfSubjectAccessReview` (metadata and status are not read).
#[derive(Clone, PartialEq, prost::Message)]
struct Review {
    #[prost(message, optional, tag = "2")]
    spec: Option<Spec>,
}
#[derive(Clone, PartialEq, prost::Message)]
struct Spec {
    #[prost(message, optional, tag = "1")]
    resource_attributes: Option<ResourceAttributes>,
    #[prost(message, optional, tag = "2")]
    non_resource_attributes: Option<NonResourceAttributes>,
}
#[derive(Clone, PartialEq, prost::Message)]
struct ResourceAttributes {
    #[prost(string, tag = "1")]
    namespace: String,
    #[prost(string, tag = "2")]
    verb: String,
    #[prost(string, tag = "3")]
    group: String,
    #[prost(string, tag = "4")]
    version: String,
    #[prost(string, tag = "5")]
    resource: String,
    #[prost(string, tag = "6")]
    subresource: String,
    #[prost(string, tag = "7")]
    name: String,
}
#[derive(Clone, PartialEq, prost::Message)]
struct NonResourceAttributes {
    #[prost(string, tag = "1")]
    path: String,
    #[prost(string, tag = "2")]
    verb: String,
}

/// Decode a protobuf `SelfSubjectAccessReview` into its JSON form.
pub(super) fn access_review(body: &[u8]) -> Result<Value, ApiError> {
    use prost::Message as _;
    let bad = |what: &str| ApiError::bad_request(format!("invalid protobuf body: {what}"));
    let envelope = body
        .strip_prefix(b"k8s\0")
        .ok_or_else(|| bad("missing the `k8s\\0` prefix"))?;
    let unknown = Unknown::decode(envelope).map_err(|_| bad("not a runtime.Unknown"))?;
    let tm = unknown.type_meta.unwrap_or_default();
    if tm.kind != "SelfSubjectAccessReview" {
        return Err(bad("expected a SelfSubjectAccessReview"));
    }
    let review =
        Review::decode(unknown.raw.as_slice()).map_err(|_| bad("not a SelfSubjectAccessReview"))?;
    let spec = review.spec.unwrap_or_default();
    let mut out = json!({ "apiVersion": tm.api_version, "kind": tm.kind, "spec": {} });
    if let Some(r) = spec.resource_attributes {
        out["spec"]["resourceAttributes"] = json!({
            "namespace": r.namespace, "verb": r.verb, "group": r.group,
            "version": r.version, "resource": r.resource,
            "subresource": r.subresource, "name": r.name,
        });
    }
    if let Some(n) = spec.non_resource_attributes {
        out["spec"]["nonResourceAttributes"] = json!({ "path": n.path, "verb": n.verb });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    /// What `kubectl auth can-i create pods --subresource=eviction` (v1.32) sent.
    #[test]
    fn kubectl_access_review_decodes() {
        let hex = concat!(
            "6b3873000a320a17617574686f72697a6174696f6e2e6b38732e696f2f7631121753656c66",
            "5375626a65637441636365737352657669657712470a100a0012001a0022002a0032003800",
            "420012290a270a0764656661756c7412066372656174651a0022002a04706f647332086576",
            "696374696f6e3a001a08080012001a0020001a002200",
        );
        let body = hex::decode(hex).unwrap();
        let review = super::access_review(&body).unwrap();
        assert_eq!(review["kind"], "SelfSubjectAccessReview");
        let attrs = &review["spec"]["resourceAttributes"];
        assert_eq!(attrs["verb"], "create");
        assert_eq!(attrs["namespace"], "default");
        assert_eq!(attrs["resource"], "pods");
        assert_eq!(attrs["subresource"], "eviction");
        assert!(super::access_review(b"{}").is_err());
    }
}
