//! The HTTP surface of the simulated kube-apiserver. Owns the routing of the REST paths,
//! bearer-token authentication, the fault gate, RBAC attributes, discovery/OpenAPI answers and the
//! dispatch to the verbs, which live by kind: [`read`] (get, list, watch, access reviews),
//! [`write`] (create, update, patch, server-side apply), [`delete`] (delete, eviction), with
//! [`protobuf`] decoding the one protobuf body kubectl sends.

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
use crate::api_lifecycle::Minor;

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
    /// `GET /metrics` (Prometheus text format).
    Metrics,
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

fn route(path: &str, minor: Minor, custom: &[&'static ResourceType]) -> Result<Route> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
        ["version"] => return Ok(Route::Version),
        ["metrics"] => return Ok(Route::Metrics),
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
    if !resources::group_version_exists(group, version, minor, custom) {
        return Err(ApiError::page_not_found());
    }
    let find = |plural: &str| {
        resources::lookup(group, version, plural, minor, custom)
            .ok_or_else(ApiError::page_not_found)
    };
    let namespaced = |plural: &str| {
        resources::lookup(group, version, plural, minor, custom).is_some_and(|r| r.namespaced)
    };
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
    // which kube-apiserver process serves this connection: a node's own, or the endpoint's
    let served_by = parts
        .extensions
        .get::<super::ServedBy>()
        .and_then(|s| s.0.clone());
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
    let request = Incoming {
        method: &parts.method,
        path: &path,
        headers: &parts.headers,
        q: &q,
        served_by: served_by.as_deref(),
    };
    let response = dispatch(&shared, &request, body).await;
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
async fn dispatch(shared: &Arc<Shared>, request: &Incoming<'_>, body: Bytes) -> Result<Response> {
    let (response, older) = answer(shared, request, body)?;
    let Some(older) = older else {
        return Ok(response);
    };
    let mut response = if true_param(request.q, "watch") {
        response
    } else {
        convert_response(response, &older.stored, &older.addressed).await
    };
    if let Some(w) = older.warning {
        add_warning(&mut response, &w);
    }
    Ok(response)
}

/// The parts of one request that every stage of answering it reads.
struct Incoming<'a> {
    method: &'a Method,
    path: &'a str,
    headers: &'a HeaderMap,
    q: &'a HashMap<String, String>,
    /// The control-plane node whose own kube-apiserver listener took the connection; `None`
    /// for the control-plane endpoint (the kubeconfig's server).
    served_by: Option<&'a str>,
}

/// A request to an older version of a stored resource: the versions to convert between and
/// the deprecation warning, if that minor deprecates it.
struct OlderVersion {
    addressed: String,
    stored: String,
    warning: Option<String>,
}

#[allow(
    clippy::expect_used,
    reason = "a poisoned cluster lock means a simulator thread panicked mid-update; serving its half-updated state would be worse than stopping"
)]
fn answer(
    shared: &Arc<Shared>,
    request: &Incoming<'_>,
    body: Bytes,
) -> Result<(Response, Option<OlderVersion>)> {
    let Incoming {
        path,
        headers,
        served_by,
        ..
    } = *request;
    let now = Instant::now();
    let wall = jiff::Timestamp::now();
    let mut c = shared.cluster.lock().expect("cluster lock");
    c.counters.requests += 1;
    if c.take_unavailable(now) {
        c.counters.unavailable += 1;
        return Err(ApiError::unavailable());
    }
    c.reconcile(now, wall);
    c.observe_apiservers();
    let minor = c.deprecation.minor();
    if let Some(listed) = alpha::answer(&c, request.method, path, minor) {
        return listed.map(|r| (r, None));
    }
    let route = route(path, minor, c.custom_types())?;
    // An older version of a stored resource: served from the stored one (the apiserver
    // converts), with its deprecation warning and gauge series when that minor deprecates it.
    let addressed = match &route {
        Route::Collection { rt, .. } | Route::Object { rt, .. } | Route::Subresource { rt, .. } => {
            Some(*rt)
        }
        _ => None,
    };
    c.deprecation.request_version = addressed.map(|rt| rt.api_version());
    let Some(older) = addressed.filter(|rt| !std::ptr::eq(*rt, resources::storage_of(rt))) else {
        return serve(shared, c, route, request, body, now, wall).map(|r| (r, None));
    };
    let stored = resources::storage_of(older);
    let warning = resources::deprecation(older, minor);
    if let Some(l) = &warning
        && matches!(route, Route::Collection { .. } | Route::Object { .. })
    {
        c.deprecation.record(
            served_by,
            (
                l.group.clone(),
                l.version.clone(),
                l.resource.clone(),
                String::new(),
                l.removed_release(),
            ),
        );
    }
    let route = match route {
        Route::Collection { ns, .. } => Route::Collection { rt: stored, ns },
        Route::Object { ns, name, .. } => Route::Object {
            rt: stored,
            ns,
            name,
        },
        Route::Subresource { ns, name, sub, .. } => Route::Subresource {
            rt: stored,
            ns,
            name,
            sub,
        },
        other => other,
    };
    let body = convert_body(&body, headers, &older.api_version(), &stored.api_version());
    let response = match serve(shared, c, route, request, body, now, wall) {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    Ok((
        response,
        Some(OlderVersion {
            addressed: older.api_version(),
            stored: stored.api_version(),
            warning: warning.map(|l| l.warning()),
        }),
    ))
}

/// Answer a request routed to a stored resource type (or a non-resource path).
#[allow(
    clippy::too_many_arguments,
    reason = "the parts of one request, passed through from dispatch"
)]
fn serve(
    shared: &Arc<Shared>,
    mut c: std::sync::MutexGuard<'_, KubeSide>,
    route: Route,
    request: &Incoming<'_>,
    body: Bytes,
    now: Instant,
    wall: jiff::Timestamp,
) -> Result<Response> {
    let Incoming {
        method,
        path,
        headers,
        q,
        served_by,
    } = *request;
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
        Route::Metrics => {
            get_only(method)?;
            if c.forbids("get", "", path, "") {
                return Err(ApiError::forbidden_path("get", path));
            }
            let version = c.server_version_of(served_by);
            Ok((
                StatusCode::OK,
                [(
                    header::CONTENT_TYPE,
                    "text/plain; version=0.0.4; charset=utf-8",
                )],
                c.deprecation.metrics_text(served_by, &version),
            )
                .into_response())
        }
        Route::Version => {
            get_only(method)?;
            let version = c.server_version_of(served_by);
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
            Ok(json_response(
                StatusCode::OK,
                &openapi::index(c.deprecation.minor()),
            ))
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
            Ok(json_response(
                StatusCode::OK,
                &resources::group_list(c.deprecation.minor(), c.custom_types()),
            ))
        }
        Route::Group(g) => {
            get_only(method)?;
            resources::group(&g, c.deprecation.minor(), c.custom_types())
                .map(|doc| json_response(StatusCode::OK, &doc))
                .ok_or_else(ApiError::page_not_found)
        }
        Route::ResourceList(g, v) => {
            get_only(method)?;
            Ok(json_response(
                StatusCode::OK,
                &resources::resource_list(&g, &v, c.deprecation.minor(), c.custom_types()),
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
                    c.after_get(rt, &ns, &name, wall);
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
                Method::DELETE => delete(&mut c, rt, &ns, &name, q, &body, now, wall),
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
            if rt.plural == "pods" && sub == "log" {
                get_only(method)?;
                return pod_log(&c, &ns, &name, q);
            }
            Err(ApiError::page_not_found())
        }
    }
}

/// A write body addressed to an older version, converted to the stored one (`apiVersion`;
/// the flowcontrol betas' fields are the stored version's). Unparsable bodies pass unchanged
/// for the handler to refuse.
fn convert_body(body: &Bytes, headers: &HeaderMap, from: &str, to: &str) -> Bytes {
    if body.is_empty() {
        return body.clone();
    }
    let yaml = content_type(headers) == "application/apply-patch+yaml";
    let Ok(mut v) = parse_body(body, yaml) else {
        return body.clone();
    };
    if v.get("apiVersion").and_then(Value::as_str) == Some(from) {
        v["apiVersion"] = json!(to);
    }
    // JSON is YAML, so an apply body stays an apply body
    Bytes::from(v.to_string())
}

/// Relabel a JSON answer (object, list, or table of objects) from the stored version to the
/// version the client asked for, as the apiserver's conversion on the way out does.
async fn convert_response(response: Response, from: &str, to: &str) -> Response {
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return ApiError::internal("the response could not be converted").into_response();
    };
    let Ok(mut v) = serde_json::from_slice::<Value>(&bytes) else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    let relabel = |o: &mut Value| {
        if o.get("apiVersion").and_then(Value::as_str) == Some(from) {
            o["apiVersion"] = json!(to);
        }
    };
    relabel(&mut v);
    if let Some(items) = v.get_mut("items").and_then(Value::as_array_mut) {
        items.iter_mut().for_each(relabel);
    }
    if let Some(rows) = v.get_mut("rows").and_then(Value::as_array_mut) {
        for row in rows {
            if let Some(o) = row.get_mut("object") {
                relabel(o);
            }
        }
    }
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(v.to_string()))
}

/// Add a `Warning: 299 - "<text>"` header (k8s.io/apiserver `pkg/endpoints/filters/warning.go`,
/// k8s.io/apimachinery `net.NewWarningHeader`: the text quoted with `"` and `\` escaped).
fn add_warning(response: &mut Response, text: &str) {
    let quoted = serde_json::to_string(text).unwrap_or_default();
    if let Ok(v) = header::HeaderValue::from_str(&format!("299 - {quoted}")) {
        response.headers_mut().append(header::WARNING, v);
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

mod alpha;
mod delete;
mod protobuf;
mod read;
mod validate;
mod write;

use delete::{delete, evict};
#[cfg(test)]
use read::event_line;
use read::{access_review, list, pod_log, watch};
pub(crate) use write::managed_fields;
use write::{create, derived_refusal, patch, replace, update_manager};

#[cfg(test)]
mod tests;
