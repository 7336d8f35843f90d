//! The HTTP surface of the simulated kube-apiserver: routing of the REST paths, bearer-token
//! authentication, the fault gate, and the verbs (get, list, watch, create, update, patch,
//! server-side apply, delete, eviction) over the store.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::Shared;
use super::apply;
use super::cluster::{KubeSide, kind_matches};
use super::openapi::{self, FieldValidation};
use super::resources::{self, Owner, PODS, ResourceType};
use super::selector::{FieldSelector, LabelSelector};
use super::status::{ApiError, success};
use super::store::{EventType, name_of, ns_of};
use super::table;

/// Request bodies above this are refused (the real apiserver's limit is 3 MiB).
const BODY_LIMIT: usize = 3 * 1024 * 1024;

fn json_response(code: StatusCode, body: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        json_response(code, &self.to_status())
    }
}

type Result<T> = std::result::Result<T, ApiError>;

/// Where a request goes.
#[derive(Debug)]
enum Route {
    Version,
    /// `POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews`.
    AccessReview,
    CoreVersions,
    Groups,
    Group(String),
    ResourceList(String, String),
    /// `GET /openapi/v3`.
    OpenApiIndex,
    /// `GET /openapi/v3/<group-version>` (`api/v1`, `apis/apps/v1`).
    OpenApiDoc(String),
    Collection {
        rt: &'static ResourceType,
        ns: Option<String>,
    },
    Object {
        rt: &'static ResourceType,
        ns: Option<String>,
        name: String,
    },
    Subresource {
        rt: &'static ResourceType,
        ns: Option<String>,
        name: String,
        sub: String,
    },
}

fn route(path: &str) -> Result<Route> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
        ["version"] => return Ok(Route::Version),
        [
            "apis",
            resources::AUTHORIZATION_GROUP,
            "v1",
            "selfsubjectaccessreviews",
        ] => {
            return Ok(Route::AccessReview);
        }
        ["api"] => return Ok(Route::CoreVersions),
        ["openapi", "v3"] => return Ok(Route::OpenApiIndex),
        ["openapi", "v3", rest @ ..] => return Ok(Route::OpenApiDoc(rest.join("/"))),
        ["apis"] => return Ok(Route::Groups),
        ["apis", g] => return Ok(Route::Group(g.to_string())),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::page_not_found()),
    };
    if !resources::group_version_exists(group, version) {
        return Err(ApiError::page_not_found());
    }
    let find = |plural: &str| {
        resources::lookup(group, version, plural).ok_or_else(ApiError::page_not_found)
    };
    let namespaced =
        |plural: &str| resources::lookup(group, version, plural).is_some_and(|r| r.namespaced);
    Ok(match rest {
        [] => Route::ResourceList(group.to_string(), version.to_string()),
        [plural] => Route::Collection {
            rt: find(plural)?,
            ns: None,
        },
        ["namespaces", ns, plural] if namespaced(plural) => Route::Collection {
            rt: find(plural)?,
            ns: Some(ns.to_string()),
        },
        ["namespaces", ns, plural, name] if namespaced(plural) => Route::Object {
            rt: find(plural)?,
            ns: Some(ns.to_string()),
            name: name.to_string(),
        },
        ["namespaces", ns, plural, name, sub] if namespaced(plural) => Route::Subresource {
            rt: find(plural)?,
            ns: Some(ns.to_string()),
            name: name.to_string(),
            sub: sub.to_string(),
        },
        [plural, name] => {
            let rt = find(plural)?;
            if rt.namespaced {
                return Err(ApiError::page_not_found());
            }
            Route::Object {
                rt,
                ns: None,
                name: name.to_string(),
            }
        }
        [plural, name, sub] => {
            let rt = find(plural)?;
            if rt.namespaced {
                return Err(ApiError::page_not_found());
            }
            Route::Subresource {
                rt,
                ns: None,
                name: name.to_string(),
                sub: sub.to_string(),
            }
        }
        _ => return Err(ApiError::page_not_found()),
    })
}

fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| {
            v.split(',')
                .next()
                .is_some_and(|first| first.contains("as=Table"))
        })
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_string()
}

fn parse_body(body: &Bytes, yaml: bool) -> Result<Value> {
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::bad_request("the request body is not UTF-8"))?;
    let value: Value = if yaml {
        serde_saphyr::from_str(text)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?
    } else {
        serde_json::from_str(text).map_err(|e| {
            ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
        })?
    };
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    Ok(value)
}

fn true_param(q: &HashMap<String, String>, key: &str) -> bool {
    q.get(key).is_some_and(|v| v == "true" || v == "1")
}

fn dry_run(q: &HashMap<String, String>) -> bool {
    q.get("dryRun").is_some_and(|v| v == "All")
}

/// The entry point for every request.
#[allow(
    clippy::expect_used,
    reason = "a poisoned cluster lock means a simulator thread panicked mid-update; serving its half-updated state would be worse than stopping"
)]
pub(crate) async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    if matches!(path.as_str(), "/healthz" | "/livez" | "/readyz") {
        return (StatusCode::OK, "ok").into_response();
    }
    let authorized = bearer(&parts.headers).is_some_and(|t| shared.token.matches(t));
    if !authorized {
        shared
            .cluster
            .lock()
            .expect("cluster lock")
            .counters
            .unauthorized += 1;
        return ApiError::unauthorized().into_response();
    }
    let body = match axum::body::to_bytes(body, BODY_LIMIT).await {
        Ok(b) => b,
        Err(_) => {
            return ApiError::bad_request("the request body is too large or unreadable")
                .into_response();
        }
    };
    let q: HashMap<String, String> = Query::<HashMap<String, String>>::try_from_uri(&parts.uri)
        .map(|Query(q)| q)
        .unwrap_or_default();
    tracing::debug!(method = %parts.method, path = %path, "sim kube-apiserver request");
    let response = dispatch(&shared, &parts.method, &path, &parts.headers, &q, body).await;
    shared.wake.notify_one();
    match response {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

#[allow(
    clippy::expect_used,
    reason = "a poisoned cluster lock means a simulator thread panicked mid-update; serving its half-updated state would be worse than stopping"
)]
async fn dispatch(
    shared: &Arc<Shared>,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    q: &HashMap<String, String>,
    body: Bytes,
) -> Result<Response> {
    let now = Instant::now();
    let wall = jiff::Timestamp::now();
    let route = route(path);
    let mut c = shared.cluster.lock().expect("cluster lock");
    c.counters.requests += 1;
    if c.take_unavailable(now) {
        c.counters.unavailable += 1;
        return Err(ApiError::unavailable());
    }
    c.reconcile(now, wall);
    let route = route?;
    if let Some(r) = rbac_request(&route, method, q)
        && c.forbids(r.verb, r.rt.group, r.rt.plural, r.sub.unwrap_or(""))
    {
        return Err(ApiError::forbidden(r.verb, r.rt, r.sub, r.ns, r.name));
    }
    let get_only = |m: &Method| {
        if m == Method::GET {
            Ok(())
        } else {
            Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method ({m}) on the requested resource"
            )))
        }
    };
    match route {
        Route::Version => {
            get_only(method)?;
            let version = c.server_version();
            let (major, minor) = version
                .trim_start_matches('v')
                .split_once('.')
                .map(|(ma, rest)| {
                    (
                        ma.to_string(),
                        rest.split('.').next().unwrap_or("0").to_string(),
                    )
                })
                .unwrap_or_else(|| ("1".into(), "33".into()));
            Ok(json_response(
                StatusCode::OK,
                &json!({
                    "major": major,
                    "minor": minor,
                    "emulationMajor": major,
                    "emulationMinor": minor,
                    "gitVersion": version,
                    "gitCommit": "0000000000000000000000000000000000000000",
                    "gitTreeState": "clean",
                    "buildDate": "2025-01-01T00:00:00Z",
                    "goVersion": "go1.24.0",
                    "compiler": "gc",
                    "platform": "linux/amd64",
                }),
            ))
        }
        Route::AccessReview => {
            if *method != Method::POST {
                return Err(ApiError::method_not_allowed(
                    "selfsubjectaccessreviews are created with POST",
                ));
            }
            let review = if content_type(headers) == PROTOBUF {
                protobuf::access_review(&body)?
            } else {
                parse_body(&body, false)?
            };
            Ok(json_response(
                StatusCode::CREATED,
                &access_review(&c, review),
            ))
        }
        Route::CoreVersions => {
            get_only(method)?;
            Ok(json_response(
                StatusCode::OK,
                &resources::core_versions(&shared.server_address),
            ))
        }
        Route::OpenApiIndex => {
            get_only(method)?;
            Ok(json_response(StatusCode::OK, &openapi::index()))
        }
        Route::OpenApiDoc(key) => {
            get_only(method)?;
            let doc = openapi::document(&key).ok_or_else(ApiError::page_not_found)?;
            // a request naming the current hash may be cached for good, as the apiserver says
            // (kube-openapi `pkg/handler3/handler.go`)
            let cache = if q.get("hash") == Some(&doc.hash) {
                "public, immutable"
            } else {
                "no-cache, private"
            };
            Ok((
                StatusCode::OK,
                [
                    (header::CONTENT_TYPE, "application/json"),
                    (header::CACHE_CONTROL, cache),
                ],
                [(header::ETAG, format!("\"{}\"", doc.hash))],
                doc.text.clone(),
            )
                .into_response())
        }
        Route::Groups => {
            get_only(method)?;
            Ok(json_response(StatusCode::OK, &resources::group_list()))
        }
        Route::Group(g) => {
            get_only(method)?;
            resources::group(&g)
                .map(|doc| json_response(StatusCode::OK, &doc))
                .ok_or_else(ApiError::page_not_found)
        }
        Route::ResourceList(g, v) => {
            get_only(method)?;
            Ok(json_response(
                StatusCode::OK,
                &resources::resource_list(&g, &v),
            ))
        }
        Route::Collection { rt, ns } => match *method {
            Method::GET if true_param(q, "watch") => {
                drop(c);
                watch(shared, rt, ns, q)
            }
            Method::GET => list(&c, rt, ns.as_deref(), headers, q, wall),
            Method::POST => {
                let m = update_manager(q, headers);
                create(&mut c, rt, ns.as_deref(), q, &body, &m, wall)
            }
            _ => Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method ({method}) on {}",
                rt.qualified()
            ))),
        },
        Route::Object { rt, ns, name } => {
            let ns = ns.unwrap_or_default();
            match *method {
                Method::GET => {
                    let obj = c
                        .store
                        .get(rt, &ns, &name)
                        .cloned()
                        .ok_or_else(|| ApiError::not_found(rt, &name))?;
                    if wants_table(headers) {
                        let rv = c.store.resource_version().to_string();
                        let include = q.get("includeObject").map_or("Metadata", String::as_str);
                        return Ok(json_response(
                            StatusCode::OK,
                            &table::table(rt, &[obj], &rv, None, include, wall),
                        ));
                    }
                    Ok(json_response(StatusCode::OK, &obj))
                }
                Method::PATCH => patch(&mut c, rt, &ns, &name, headers, q, &body, wall),
                Method::PUT => {
                    let m = update_manager(q, headers);
                    replace(&mut c, rt, &ns, &name, q, &body, &m, wall)
                }
                Method::DELETE => delete(&mut c, rt, &ns, &name, q, now, wall),
                _ => Err(ApiError::method_not_allowed(format!(
                    "the server does not allow this method ({method}) on {}",
                    rt.qualified()
                ))),
            }
        }
        Route::Subresource { rt, ns, name, sub } => {
            let ns = ns.unwrap_or_default();
            if rt.plural == "pods" && sub == "eviction" {
                if *method != Method::POST {
                    return Err(ApiError::method_not_allowed(
                        "evictions are created with POST",
                    ));
                }
                return evict(&mut c, &ns, &name, &body, now, wall);
            }
            Err(ApiError::page_not_found())
        }
    }
}

/// The authorization attributes of a resource request (what RBAC decides on).
struct RbacRequest<'a> {
    verb: &'static str,
    rt: &'static ResourceType,
    sub: Option<&'a str>,
    ns: Option<&'a str>,
    name: Option<&'a str>,
}

fn rbac_request<'a>(
    route: &'a Route,
    method: &Method,
    q: &HashMap<String, String>,
) -> Option<RbacRequest<'a>> {
    let object_verb = |m: &Method| match *m {
        Method::GET => Some("get"),
        Method::PATCH => Some("patch"),
        Method::PUT => Some("update"),
        Method::DELETE => Some("delete"),
        Method::POST => Some("create"),
        _ => None,
    };
    match route {
        Route::Collection { rt, ns } => {
            let verb = match *method {
                Method::GET if true_param(q, "watch") => "watch",
                Method::GET => "list",
                Method::POST => "create",
                _ => return None,
            };
            Some(RbacRequest {
                verb,
                rt,
                sub: None,
                ns: ns.as_deref(),
                name: None,
            })
        }
        Route::Object { rt, ns, name } => Some(RbacRequest {
            verb: object_verb(method)?,
            rt,
            sub: None,
            ns: ns.as_deref(),
            name: Some(name),
        }),
        Route::Subresource { rt, ns, name, sub } => Some(RbacRequest {
            verb: object_verb(method)?,
            rt,
            sub: Some(sub),
            ns: ns.as_deref(),
            name: Some(name),
        }),
        _ => None,
    }
}

/// Kubernetes' protobuf media type (kubectl sends typed requests such as `auth can-i` in it).
const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// The one protobuf request body the simulator reads: a `SelfSubjectAccessReview`, which
/// `kubectl auth can-i` sends as protobuf. The other requests kubectl and medea send the
/// simulator are JSON. Replies are always JSON, which kubectl's `Accept` allows.
mod protobuf {
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
        let review = Review::decode(unknown.raw.as_slice())
            .map_err(|_| bad("not a SelfSubjectAccessReview"))?;
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
}

/// Answer a `SelfSubjectAccessReview`: allowed unless a [`super::KubeFault::Forbidden`] fault
/// takes the permission away. Non-resource requests are always allowed.
fn access_review(c: &KubeSide, mut review: Value) -> Value {
    let attrs = review
        .pointer("/spec/resourceAttributes")
        .cloned()
        .unwrap_or(Value::Null);
    let field = |k: &str| attrs.get(k).and_then(Value::as_str).unwrap_or("");
    let allowed = attrs.is_null()
        || !c.forbids(
            field("verb"),
            field("group"),
            field("resource"),
            field("subresource"),
        );
    review["apiVersion"] = json!("authorization.k8s.io/v1");
    review["kind"] = json!("SelfSubjectAccessReview");
    review["metadata"] = json!({ "creationTimestamp": null });
    review["status"] = if allowed {
        json!({
            "allowed": true,
            "reason": format!(
                "RBAC: allowed by ClusterRoleBinding \"medea-sim-admin\" of ClusterRole \"cluster-admin\" to User \"{}\"",
                super::status::SIM_USER
            ),
        })
    } else {
        json!({ "allowed": false })
    };
    review
}

fn continue_key(obj: &Value) -> String {
    format!("{}/{}", ns_of(obj), name_of(obj))
}

fn list(
    c: &KubeSide,
    rt: &'static ResourceType,
    ns: Option<&str>,
    headers: &HeaderMap,
    q: &HashMap<String, String>,
    wall: jiff::Timestamp,
) -> Result<Response> {
    let labels = LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(e.0))?;
    let fields = FieldSelector::parse(rt, q.get("fieldSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(e.0))?;
    let after = match q.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(token)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| ApiError::bad_request("invalid continue token"))?,
        ),
        None => None,
    };
    let limit: usize = q
        .get("limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let mut items: Vec<Value> = c
        .store
        .list(rt, ns)
        .filter(|o| labels.matches_object(o) && fields.matches(o))
        .filter(|o| after.as_ref().is_none_or(|a| continue_key(o) > *a))
        .cloned()
        .collect();
    let mut continue_token = None;
    let mut remaining = 0;
    if items.len() > limit {
        remaining = items.len() - limit;
        items.truncate(limit);
        continue_token = items
            .last()
            .map(|o| base64::engine::general_purpose::STANDARD.encode(continue_key(o)));
    }
    let rv = c.store.resource_version().to_string();
    if wants_table(headers) {
        let include = q.get("includeObject").map_or("Metadata", String::as_str);
        return Ok(json_response(
            StatusCode::OK,
            &table::table(rt, &items, &rv, continue_token.as_deref(), include, wall),
        ));
    }
    let mut metadata = json!({ "resourceVersion": rv });
    if let Some(token) = continue_token {
        metadata["continue"] = json!(token);
        metadata["remainingItemCount"] = json!(remaining);
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "kind": rt.list_kind(),
            "apiVersion": rt.api_version(),
            "metadata": metadata,
            "items": items,
        }),
    ))
}

/// Check the body's identity against the URL and fill in the namespace.
fn check_identity(
    rt: &'static ResourceType,
    obj: &mut Value,
    ns: &str,
    name: Option<&str>,
) -> Result<()> {
    if !kind_matches(rt, obj) {
        return Err(ApiError::bad_request(format!(
            "the body is a {}/{}, but the URL is for {} ({})",
            obj.get("apiVersion").and_then(Value::as_str).unwrap_or("?"),
            obj.get("kind").and_then(Value::as_str).unwrap_or("?"),
            rt.qualified(),
            rt.api_version(),
        )));
    }
    let body_ns = ns_of(obj).to_string();
    if rt.namespaced {
        if !body_ns.is_empty() && body_ns != ns {
            return Err(ApiError::bad_request(format!(
                "the namespace of the provided object ({body_ns}) does not match the namespace sent on the request ({ns})"
            )));
        }
        obj["metadata"]["namespace"] = json!(ns);
    } else if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("namespace");
    }
    if let Some(name) = name {
        let body_name = name_of(obj);
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        obj["metadata"]["name"] = json!(name);
    }
    if name_of(obj).is_empty() {
        return Err(ApiError::invalid(
            rt,
            "",
            format!(
                "{} \"\" is invalid: metadata.name: Required value: name or generateName is required",
                rt.kind
            ),
        ));
    }
    Ok(())
}

fn derived_refusal(rt: &ResourceType, verb: &str) -> ApiError {
    ApiError::method_not_allowed(format!(
        "the simulator derives {} from the Talos side; {verb} is not supported (patch spec.unschedulable, taints, labels or annotations instead)",
        rt.plural
    ))
}

/// The field manager of a non-apply write: `?fieldManager=`, else the User-Agent's product
/// (`kubectl/v1.34.1 (linux/amd64) …` → `kubectl`), as the apiserver derives it
/// (k8s.io/apiserver `pkg/endpoints/handlers/rest.go` `prefixFromUserAgent`).
fn update_manager(q: &HashMap<String, String>, headers: &HeaderMap) -> String {
    if let Some(m) = q.get("fieldManager").filter(|m| !m.is_empty()) {
        return m.clone();
    }
    headers
        .get(axum::http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|ua| ua.split('/').next())
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .unwrap_or("unknown")
        .to_string()
}

/// Record a non-apply write of `obj` by `manager` (see [`apply::record_update`]) and render
/// the object's `managedFields`.
fn note_update(
    c: &mut KubeSide,
    rt: &'static ResourceType,
    before: Option<&Value>,
    obj: &mut Value,
    manager: &str,
    wall: jiff::Timestamp,
) {
    let key = (rt.key(), ns_of(obj).to_string(), name_of(obj).to_string());
    let owners = c.owners.entry(key.clone()).or_default();
    apply::record_update(before, obj, owners, manager);
    c.updaters
        .entry(key.clone())
        .or_default()
        .insert(manager.to_string());
    obj["metadata"]["managedFields"] = managed_fields(c, rt, &key, wall);
}

/// `metadata.managedFields` of an object from its owners.
fn managed_fields(
    c: &KubeSide,
    rt: &'static ResourceType,
    key: &crate::sim::kube::store::ObjKey,
    wall: jiff::Timestamp,
) -> Value {
    let time = super::store::k8s_time(wall);
    let updaters = c.updaters.get(key);
    let entries: Vec<Value> = c
        .owners
        .get(key)
        .into_iter()
        .flatten()
        .map(|(m, cfg)| {
            let update = updaters.is_some_and(|u| u.contains(m));
            json!({
                "manager": m,
                "operation": if update { "Update" } else { "Apply" },
                "apiVersion": rt.api_version(),
                "time": time,
                "fieldsType": "FieldsV1",
                "fieldsV1": apply::fields_v1(cfg),
            })
        })
        .collect();
    json!(entries)
}

/// The unknown fields of a written object, handled as `fieldValidation` asks: `Strict` is a
/// 400 strict decoding error, `Warn` (the default) a `Warning` header per field, `Ignore`
/// nothing; unless refused they are dropped from the object, as decoding into the typed object
/// does (apiserver `staging/src/k8s.io/apiserver/pkg/endpoints/handlers/create.go`,
/// `patch.go`, `update.go`; messages as `k8s.io/apimachinery/pkg/runtime/serializer/json`
/// `strict decoding error: unknown field "…"`).
fn check_fields(
    rt: &ResourceType,
    obj: &mut Value,
    q: &HashMap<String, String>,
) -> Result<Vec<String>> {
    let mode = FieldValidation::from_query(q.get("fieldValidation").map(String::as_str))
        .map_err(ApiError::bad_request)?;
    let mut pruned = obj.clone();
    let unknown: Vec<String> = openapi::prune_unknown_fields(rt, &mut pruned)
        .into_iter()
        .map(|f| format!("unknown field \"{f}\""))
        .collect();
    if unknown.is_empty() {
        return Ok(unknown);
    }
    if mode == FieldValidation::Strict {
        return Err(ApiError::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
            unknown.join(", "),
            kind = rt.kind,
            version = rt.version,
        )));
    }
    *obj = pruned;
    Ok(if mode == FieldValidation::Ignore {
        Vec::new()
    } else {
        unknown
    })
}

/// `Warning: 299 - "<message>"` headers (RFC 7234 warn-code 299, as the apiserver sends).
fn with_warnings(mut r: Response, warnings: &[String]) -> Response {
    for w in warnings {
        let quoted = serde_json::to_string(w).unwrap_or_default();
        if let Ok(v) = header::HeaderValue::from_str(&format!("299 - {quoted}")) {
            r.headers_mut().append(header::WARNING, v);
        }
    }
    r
}

fn create(
    c: &mut KubeSide,
    rt: &'static ResourceType,
    ns: Option<&str>,
    q: &HashMap<String, String>,
    body: &Bytes,
    manager: &str,
    wall: jiff::Timestamp,
) -> Result<Response> {
    if rt.owner == Owner::Node {
        return Err(derived_refusal(rt, "create"));
    }
    let ns = ns.unwrap_or("");
    if rt.namespaced && ns.is_empty() {
        return Err(ApiError::bad_request(format!(
            "{} must be created in a namespace",
            rt.qualified()
        )));
    }
    let mut obj = parse_body(body, false)?;
    if name_of(&obj).is_empty()
        && let Some(prefix) = obj
            .pointer("/metadata/generateName")
            .and_then(Value::as_str)
            .map(str::to_string)
    {
        let n = c.store.resource_version();
        obj["metadata"]["name"] = json!(format!("{prefix}{:05x}", n & 0xfffff));
    }
    check_identity(rt, &mut obj, ns, None)?;
    let warnings = check_fields(rt, &mut obj, q)?;
    if dry_run(q) {
        return Ok(with_warnings(
            json_response(StatusCode::CREATED, &obj),
            &warnings,
        ));
    }
    let name = name_of(&obj).to_string();
    c.counters.creates += 1;
    if c.store.get(rt, ns_of(&obj), &name).is_none() {
        note_update(c, rt, None, &mut obj, manager, wall);
    }
    let created = c
        .store
        .create(rt, obj, wall)
        .map_err(|_| ApiError::already_exists(rt, &name))?;
    c.reconcile(Instant::now(), wall);
    let stored = c
        .store
        .get(rt, ns_of(&created), &name)
        .cloned()
        .unwrap_or(created);
    Ok(with_warnings(
        json_response(StatusCode::CREATED, &stored),
        &warnings,
    ))
}

#[allow(clippy::too_many_arguments)]
fn replace(
    c: &mut KubeSide,
    rt: &'static ResourceType,
    ns: &str,
    name: &str,
    q: &HashMap<String, String>,
    body: &Bytes,
    manager: &str,
    wall: jiff::Timestamp,
) -> Result<Response> {
    let mut obj = parse_body(body, false)?;
    check_identity(rt, &mut obj, ns, Some(name))?;
    let warnings = check_fields(rt, &mut obj, q)?;
    let existing = c
        .store
        .get(rt, ns, name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(rt, name))?;
    if let Some(rv) = obj
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        && Some(rv)
            != existing
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
    {
        return Err(ApiError::conflict(
            rt,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        ));
    }
    if dry_run(q) {
        return Ok(json_response(StatusCode::OK, &obj));
    }
    c.counters.updates += 1;
    if rt.owner == Owner::Node {
        let node = c.patch_node(name, &obj, wall)?;
        return Ok(json_response(StatusCode::OK, &node));
    }
    // Status is owned by the simulated controllers.
    if let Some(status) = existing.get("status") {
        obj["status"] = status.clone();
    }
    note_update(c, rt, Some(&existing), &mut obj, manager, wall);
    let stored = c.store.put(rt, obj, wall);
    Ok(with_warnings(
        json_response(StatusCode::OK, &stored),
        &warnings,
    ))
}

#[allow(clippy::too_many_arguments)]
fn patch(
    c: &mut KubeSide,
    rt: &'static ResourceType,
    ns: &str,
    name: &str,
    headers: &HeaderMap,
    q: &HashMap<String, String>,
    body: &Bytes,
    wall: jiff::Timestamp,
) -> Result<Response> {
    let ct = content_type(headers);
    match ct.as_str() {
        "application/apply-patch+yaml" => return server_side_apply(c, rt, ns, name, q, body, wall),
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {}
        "application/json-patch+json" => {
            return Err(ApiError::unsupported_media_type(&ct));
        }
        other => return Err(ApiError::unsupported_media_type(other)),
    }
    let patch = parse_body(body, false)?;
    let existing = c
        .store
        .get(rt, ns, name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(rt, name))?;
    let mut next = existing.clone();
    apply::merge_patch(&mut next, &patch);
    if name_of(&next) != name || ns_of(&next) != ns {
        return Err(ApiError::bad_request(
            "a patch may not change metadata.name or metadata.namespace",
        ));
    }
    let warnings = check_fields(rt, &mut next, q)?;
    if dry_run(q) {
        return Ok(with_warnings(
            json_response(StatusCode::OK, &next),
            &warnings,
        ));
    }
    c.counters.patches += 1;
    if rt.owner == Owner::Node {
        let node = c.patch_node(name, &next, wall)?;
        return Ok(json_response(StatusCode::OK, &node));
    }
    let m = update_manager(q, headers);
    note_update(c, rt, Some(&existing), &mut next, &m, wall);
    let stored = c.store.put(rt, next, wall);
    Ok(with_warnings(
        json_response(StatusCode::OK, &stored),
        &warnings,
    ))
}

fn server_side_apply(
    c: &mut KubeSide,
    rt: &'static ResourceType,
    ns: &str,
    name: &str,
    q: &HashMap<String, String>,
    body: &Bytes,
    wall: jiff::Timestamp,
) -> Result<Response> {
    if rt.owner == Owner::Node {
        return Err(derived_refusal(rt, "server-side apply"));
    }
    let Some(manager) = q.get("fieldManager").filter(|m| !m.is_empty()).cloned() else {
        return Err(ApiError::bad_request(
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
        ));
    };
    let force = true_param(q, "force");
    let mut config = parse_body(body, true)?;
    if config.get("apiVersion").is_none() || config.get("kind").is_none() {
        return Err(ApiError::bad_request(
            "apply patches must set apiVersion and kind",
        ));
    }
    check_identity(rt, &mut config, ns, Some(name))?;
    let key = (rt.key(), ns.to_string(), name.to_string());
    let live = c.store.get(rt, ns, name).cloned();
    if let (Some(live), Some(rv)) = (
        &live,
        config
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str),
    ) && Some(rv)
        != live
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
    {
        return Err(ApiError::conflict(
            rt,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        ));
    }
    let mut owners = c.owners.get(&key).cloned().unwrap_or_default();
    let no_updaters = std::collections::BTreeSet::new();
    let updaters = c.updaters.get(&key).unwrap_or(&no_updaters);
    let mut next = apply::apply(live.as_ref(), &config, &mut owners, &manager, force)
        .map_err(|conflicts| ApiError::apply_conflict(rt, name, &conflicts, updaters))?;
    let mut updaters = updaters.clone();
    updaters.remove(&manager);
    updaters.retain(|m| owners.contains_key(m));
    let api_version = rt.api_version();
    let time = super::store::k8s_time(wall);
    let managed: Vec<Value> = owners
        .iter()
        .map(|(m, cfg)| {
            json!({
                "manager": m,
                "operation": if updaters.contains(m) { "Update" } else { "Apply" },
                "apiVersion": api_version,
                "time": time,
                "fieldsType": "FieldsV1",
                "fieldsV1": apply::fields_v1(cfg),
            })
        })
        .collect();
    next["metadata"]["managedFields"] = json!(managed);
    if let Some(status) = live.as_ref().and_then(|l| l.get("status")) {
        next["status"] = status.clone();
    }
    if dry_run(q) {
        return Ok(json_response(StatusCode::OK, &next));
    }
    c.counters.applies += 1;
    let created = live.is_none();
    // Keep the timestamps of unchanged managers stable so a no-op apply changes nothing.
    if let Some(live) = &live
        && strip_managed_time(live) == strip_managed_time(&next)
    {
        c.owners.insert(key.clone(), owners);
        c.updaters.insert(key, updaters);
        return Ok(json_response(StatusCode::OK, live));
    }
    let stored = c.store.put(rt, next, wall);
    c.owners.insert(key.clone(), owners);
    c.updaters.insert(key, updaters);
    c.reconcile(Instant::now(), wall);
    let stored = c.store.get(rt, ns, name).cloned().unwrap_or(stored);
    Ok(json_response(
        if created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        },
        &stored,
    ))
}

fn strip_managed_time(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(entries) = o
        .pointer_mut("/metadata/managedFields")
        .and_then(Value::as_array_mut)
    {
        for e in entries {
            if let Some(m) = e.as_object_mut() {
                m.remove("time");
            }
        }
    }
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
        m.remove("generation");
    }
    if let Some(m) = o.as_object_mut() {
        m.remove("status");
    }
    o
}

fn delete(
    c: &mut KubeSide,
    rt: &'static ResourceType,
    ns: &str,
    name: &str,
    q: &HashMap<String, String>,
    now: Instant,
    wall: jiff::Timestamp,
) -> Result<Response> {
    if rt.owner == Owner::Node {
        return Err(derived_refusal(rt, "delete"));
    }
    let existing = c
        .store
        .get(rt, ns, name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(rt, name))?;
    if dry_run(q) {
        return Ok(json_response(StatusCode::OK, &existing));
    }
    c.counters.deletes += 1;
    if std::ptr::eq(rt, &PODS) {
        c.counters.pod_deletes += 1;
        let pod = c.terminate(ns, name, now, wall).unwrap_or(existing);
        return Ok(json_response(StatusCode::OK, &pod));
    }
    c.owners
        .remove(&(rt.key(), ns.to_string(), name.to_string()));
    c.updaters
        .remove(&(rt.key(), ns.to_string(), name.to_string()));
    let gone = c.store.delete(rt, ns, name).unwrap_or(existing);
    Ok(json_response(StatusCode::OK, &gone))
}

fn evict(
    c: &mut KubeSide,
    ns: &str,
    name: &str,
    body: &Bytes,
    now: Instant,
    wall: jiff::Timestamp,
) -> Result<Response> {
    let eviction = parse_body(body, false)?;
    // Like the apiserver, a body without apiVersion/kind defaults to the endpoint's kind.
    let api_version = eviction
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("policy/v1");
    let kind = eviction
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("Eviction");
    if kind != "Eviction" || !matches!(api_version, "policy/v1" | "policy/v1beta1") {
        return Err(ApiError::bad_request(format!(
            "the body must be a policy/v1 Eviction, got {api_version} {kind}"
        )));
    }
    let body_name = name_of(&eviction);
    if !body_name.is_empty() && body_name != name {
        return Err(ApiError::bad_request(format!(
            "name in URL does not match name in Eviction object ({body_name} != {name})"
        )));
    }
    let dry = eviction
        .pointer("/deleteOptions/dryRun")
        .and_then(Value::as_array)
        .is_some_and(|d| d.iter().any(|v| v == "All"));
    if dry {
        return Err(ApiError::bad_request(
            "the simulator does not support dry-run evictions",
        ));
    }
    c.evict(ns, name, now, wall)?;
    c.reconcile(Instant::now(), wall);
    Ok(json_response(StatusCode::CREATED, &success(201)))
}

/// A watch: replay (or synthesize) the start, then stream events as newline-delimited
/// `WatchEvent` JSON until `timeoutSeconds` or the client goes away.
#[allow(
    clippy::expect_used,
    reason = "a poisoned cluster lock means a simulator thread panicked mid-update; serving its half-updated state would be worse than stopping"
)]
fn watch(
    shared: &Arc<Shared>,
    rt: &'static ResourceType,
    ns: Option<String>,
    q: &HashMap<String, String>,
) -> Result<Response> {
    let labels = LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(e.0))?;
    let fields = FieldSelector::parse(rt, q.get("fieldSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(e.0))?;
    let matches = move |o: &Value| {
        ns.as_deref().is_none_or(|n| n == ns_of(o)) && labels.matches_object(o) && fields.matches(o)
    };
    let send_initial = true_param(q, "sendInitialEvents");
    let bookmarks = true_param(q, "allowWatchBookmarks");
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs);
    let rv = q.get("resourceVersion").cloned().unwrap_or_default();
    let mut initial: Vec<Value> = Vec::new();
    let (mut rx, current_rv) = {
        let c = shared.cluster.lock().expect("cluster lock");
        let current_rv = c.store.resource_version();
        if rv.is_empty() || rv == "0" || send_initial {
            for o in c.store.list(rt, None).filter(|o| matches(o)) {
                initial.push(json!({"type": "ADDED", "object": o}));
            }
            (c.store.subscribe(), current_rv)
        } else {
            let since: u64 = rv
                .parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion `{rv}`")))?;
            match c.store.watch_from(since) {
                Some((rx, replay)) => {
                    for ev in replay.iter().filter(|e| e.res == rt.key()) {
                        if let Some(line) = event_line(ev, &matches) {
                            initial.push(line);
                        }
                    }
                    (rx, current_rv)
                }
                None => {
                    let gone =
                        ApiError::gone(format!("too old resource version: {since} ({current_rv})"));
                    initial.push(json!({"type": "ERROR", "object": gone.to_status()}));
                    let body = initial.iter().map(|l| format!("{l}\n")).collect::<String>();
                    return Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response());
                }
            }
        }
    };
    if send_initial && bookmarks {
        initial.push(json!({
            "type": "BOOKMARK",
            "object": {
                "kind": rt.kind,
                "apiVersion": rt.api_version(),
                "metadata": {
                    "resourceVersion": current_rv.to_string(),
                    "annotations": {"k8s.io/initial-events-end": "true"},
                },
            },
        }));
    }
    let (tx, body_rx) = tokio::sync::mpsc::channel::<std::result::Result<Bytes, Infallible>>(64);
    let key = rt.key();
    tokio::spawn(async move {
        for line in initial {
            if tx.send(Ok(Bytes::from(format!("{line}\n")))).await.is_err() {
                return;
            }
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let ev = tokio::select! {
                ev = rx.recv() => ev,
                _ = tx.closed() => return,
                _ = async {
                    match deadline {
                        Some(d) => tokio::time::sleep_until(d).await,
                        None => std::future::pending().await,
                    }
                } => return,
            };
            match ev {
                Ok(ev) if ev.res == key => {
                    if let Some(line) = event_line(&ev, &matches)
                        && tx.send(Ok(Bytes::from(format!("{line}\n")))).await.is_err()
                    {
                        return;
                    }
                }
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    let gone = ApiError::gone("the watch fell behind; relist");
                    let _ = tx
                        .send(Ok(Bytes::from(format!(
                            "{}\n",
                            json!({"type": "ERROR", "object": gone.to_status()})
                        ))))
                        .await;
                    return;
                }
                Err(_) => return,
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(body_rx);
    Ok((
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(stream),
    )
        .into_response())
}

/// The watch line for an event under a selector, with selector transitions (an object that
/// stops matching is DELETED for this watch; one that starts matching is ADDED).
fn event_line(ev: &super::store::Event, matches: &impl Fn(&Value) -> bool) -> Option<Value> {
    let now = matches(&ev.object);
    let kind = match ev.kind {
        EventType::Added | EventType::Deleted => now.then_some(ev.kind),
        EventType::Modified => {
            let before = ev.old.as_ref().map_or(now, matches);
            match (before, now) {
                (true, true) => Some(EventType::Modified),
                (false, true) => Some(EventType::Added),
                (true, false) => Some(EventType::Deleted),
                (false, false) => None,
            }
        }
    }?;
    Some(json!({"type": kind.as_str(), "object": ev.object}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_follow_the_kubernetes_path_layout() {
        assert!(
            matches!(route("/api/v1/nodes"), Ok(Route::Collection { rt, ns: None }) if rt.plural == "nodes")
        );
        assert!(
            matches!(route("/api/v1/nodes/w1"), Ok(Route::Object { name, .. }) if name == "w1")
        );
        assert!(
            matches!(route("/api/v1/namespaces/default/pods"), Ok(Route::Collection { ns: Some(ns), .. }) if ns == "default")
        );
        assert!(matches!(
            route("/api/v1/namespaces/default/pods/web-1/eviction"),
            Ok(Route::Subresource { sub, .. }) if sub == "eviction"
        ));
        assert!(
            matches!(route("/api/v1/namespaces/kube-system"), Ok(Route::Object { rt, .. }) if rt.plural == "namespaces")
        );
        assert!(
            matches!(route("/apis/apps/v1/namespaces/x/daemonsets/y"), Ok(Route::Object { rt, .. }) if rt.plural == "daemonsets")
        );
        assert!(
            matches!(route("/apis/policy/v1"), Ok(Route::ResourceList(g, v)) if g == "policy" && v == "v1")
        );
        // A namespaced resource has no cluster-scoped object path.
        assert!(route("/api/v1/pods/web-1").is_err());
        assert!(route("/apis/batch/v1/jobs").is_err());
    }

    #[test]
    fn only_a_first_choice_table_accept_gets_a_table() {
        let mut h = HeaderMap::new();
        h.insert(
            header::ACCEPT,
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
                .parse()
                .unwrap(),
        );
        assert!(wants_table(&h));
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, "application/json".parse().unwrap());
        assert!(!wants_table(&h));
    }

    #[test]
    fn selector_transitions_turn_into_added_and_deleted() {
        use super::super::resources::PODS;
        let ev = super::super::store::Event {
            rv: 1,
            res: PODS.key(),
            kind: EventType::Modified,
            object: json!({"spec": {"nodeName": "w2"}}),
            old: Some(json!({"spec": {"nodeName": "w1"}})),
        };
        let on_w1 = |o: &Value| o.pointer("/spec/nodeName") == Some(&json!("w1"));
        let on_w2 = |o: &Value| o.pointer("/spec/nodeName") == Some(&json!("w2"));
        assert_eq!(event_line(&ev, &on_w1).unwrap()["type"], "DELETED");
        assert_eq!(event_line(&ev, &on_w2).unwrap()["type"], "ADDED");
    }
}
