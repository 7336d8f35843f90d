//! The removing verbs: delete (with preconditions and dry-run) and eviction (PDB-checked).

use super::*;

pub(super) fn delete(
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

pub(super) fn evict(
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
