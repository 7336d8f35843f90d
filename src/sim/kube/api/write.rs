//! The write verbs: create, update (replace), patch and server-side apply, with their shared
//! checks (identity against the URL, field validation, managed fields, derived resources).

use super::*;

/// Check the body's identity against the URL and fill in the namespace.
pub(super) fn check_identity(
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

pub(super) fn derived_refusal(rt: &ResourceType, verb: &str) -> ApiError {
    ApiError::method_not_allowed(format!(
        "the simulator derives {} from the Talos side; {verb} is not supported (patch spec.unschedulable, taints, labels or annotations instead)",
        rt.plural
    ))
}

/// The field manager of a non-apply write: `?fieldManager=`, else the User-Agent's product
/// (`kubectl/v1.34.1 (linux/amd64) …` → `kubectl`), as the apiserver derives it
/// (k8s.io/apiserver `pkg/endpoints/handlers/rest.go` `prefixFromUserAgent`).
pub(super) fn update_manager(q: &HashMap<String, String>, headers: &HeaderMap) -> String {
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
    let time = super::super::store::k8s_time(wall);
    c.deprecation
        .note_writer(&key, manager, &rt.api_version(), &time);
    let owners = c.owners.get(&key).cloned().unwrap_or_default();
    let updaters = c.updaters.get(&key).cloned().unwrap_or_default();
    obj["metadata"]["managedFields"] = managed_fields(c, rt, &key, &owners, &updaters, wall);
}

/// `metadata.managedFields` of an object from its owners: each entry with the group-version
/// its manager wrote with and the time it last did (k8s.io/apimachinery
/// `ManagedFieldsEntry`: "the version of this resource that this field set applies to").
/// Unlike the apiserver, a manager that `Update`s through two versions keeps one entry (the
/// last version), not one per version.
pub(crate) fn managed_fields(
    c: &KubeSide,
    rt: &'static ResourceType,
    key: &crate::sim::kube::store::ObjKey,
    owners: &std::collections::BTreeMap<String, Value>,
    updaters: &std::collections::BTreeSet<String>,
    wall: jiff::Timestamp,
) -> Value {
    let now = super::super::store::k8s_time(wall);
    let entries: Vec<Value> = owners
        .iter()
        .map(|(m, cfg)| {
            let (api_version, time) = c
                .deprecation
                .writer(key, m)
                .cloned()
                .unwrap_or_else(|| (rt.api_version(), now.clone()));
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

pub(super) fn create(
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
    super::validate::validate(rt, &mut obj)?;
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
pub(super) fn replace(
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
    super::validate::validate(rt, &mut obj)?;
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
        // what the update would store (registry `Update` with `dryRun=All` runs everything but
        // the write): the identity and status of the live object, the body's spec and metadata
        let mut preview = obj;
        preview["apiVersion"] = json!(rt.api_version());
        preview["kind"] = json!(rt.kind);
        for field in [
            "uid",
            "creationTimestamp",
            "resourceVersion",
            "generation",
            "managedFields",
        ] {
            if let Some(v) = existing.pointer(&format!("/metadata/{field}")) {
                preview["metadata"][field] = v.clone();
            }
        }
        if let Some(status) = existing.get("status") {
            preview["status"] = status.clone();
        }
        return Ok(json_response(StatusCode::OK, &preview));
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
pub(super) fn patch(
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
    // a patch that names a resourceVersion is a conditional update (apiserver
    // `registry/generic/registry/store.go` `Update`: a non-zero resourceVersion that differs
    // from the stored one is a 409 Conflict), how a client changes a list such as a Node's
    // taints without losing a concurrent writer's change
    if let Some(rv) = patch
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .filter(|rv| !rv.is_empty())
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
    let mut next = existing.clone();
    apply::merge_patch(&mut next, &patch);
    if name_of(&next) != name || ns_of(&next) != ns {
        return Err(ApiError::bad_request(
            "a patch may not change metadata.name or metadata.namespace",
        ));
    }
    let warnings = check_fields(rt, &mut next, q)?;
    super::validate::validate(rt, &mut next)?;
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

pub(super) fn server_side_apply(
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
    super::validate::validate(rt, &mut next)?;
    let mut updaters = updaters.clone();
    updaters.remove(&manager);
    updaters.retain(|m| owners.contains_key(m));
    let time = super::super::store::k8s_time(wall);
    // the applier's entry as of this request; kept only if the apply changes something
    let previous = c.deprecation.writer(&key, &manager).cloned();
    c.deprecation
        .note_writer(&key, &manager, &rt.api_version(), &time);
    next["metadata"]["managedFields"] = managed_fields(c, rt, &key, &owners, &updaters, wall);
    let restore = |c: &mut KubeSide| match &previous {
        Some((v, t)) => {
            c.deprecation
                .writers
                .entry(key.clone())
                .or_default()
                .insert(manager.clone(), (v.clone(), t.clone()));
        }
        None => {
            if let Some(w) = c.deprecation.writers.get_mut(&key) {
                w.remove(&manager);
            }
        }
    };
    if let Some(status) = live.as_ref().and_then(|l| l.get("status")) {
        next["status"] = status.clone();
    }
    if dry_run(q) {
        restore(c);
        return Ok(json_response(StatusCode::OK, &next));
    }
    c.counters.applies += 1;
    let created = live.is_none();
    // Keep the timestamps of unchanged managers stable so a no-op apply changes nothing.
    if let Some(live) = &live
        && strip_managed_time(live) == strip_managed_time(&next)
    {
        restore(c);
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

pub(super) fn strip_managed_time(obj: &Value) -> Value {
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
