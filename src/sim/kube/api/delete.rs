//! The removing verbs: delete (with preconditions and dry-run) and eviction (PDB-checked).

use super::*;
use crate::sim::kube::cluster::Propagation;
use crate::sim::kube::resources::JOBS;

/// The propagation policy of a `DELETE`: `?propagationPolicy=`, else the body's
/// `DeleteOptions.propagationPolicy` (what kubectl and kube-rs send), else the legacy
/// `orphanDependents`; `None` when the request leaves it to the resource's default.
fn propagation(q: &HashMap<String, String>, body: &Bytes) -> Result<Option<Propagation>> {
    let options: Value = if body.is_empty() {
        Value::Null
    } else {
        parse_body(body, false)?
    };
    let named = q
        .get("propagationPolicy")
        .map(String::as_str)
        .or_else(|| options.get("propagationPolicy").and_then(Value::as_str));
    if let Some(p) = named {
        return Propagation::parse(p).map(Some).ok_or_else(|| {
            ApiError::bad_request(format!(
                "propagationPolicy: Unsupported value: {}: supported values: \"Foreground\", \"Background\", \"Orphan\"",
                json!(p)
            ))
        });
    }
    let orphan = q
        .get("orphanDependents")
        .map(|v| v == "true")
        .or_else(|| options.get("orphanDependents").and_then(Value::as_bool));
    Ok(orphan.map(|o| {
        if o {
            Propagation::Orphan
        } else {
            Propagation::Background
        }
    }))
}

/// `DeleteOptionWarnings` of the Job storage (kubernetes `pkg/registry/batch/job/storage/storage.go`):
/// a `DELETE` of a batch/v1 Job that leaves the propagation policy to the default orphans the
/// Job's pods, and says so.
const JOB_ORPHAN_WARNING: &str = "child pods are preserved by default when jobs are deleted; set propagationPolicy=Background to remove them or set propagationPolicy=Orphan to suppress this warning";

#[allow(clippy::too_many_arguments, reason = "the parts of one request")]
pub(super) fn delete(
    c: &mut KubeSide,
    rt: &'static ResourceType,
    ns: &str,
    name: &str,
    q: &HashMap<String, String>,
    body: &Bytes,
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
    let policy = propagation(q, body)?;
    c.counters.deletes += 1;
    if std::ptr::eq(rt, &JOBS) {
        // batch/v1's default garbage-collection policy orphans the pods
        // (`jobStrategy.DefaultGarbageCollectionPolicy`)
        let gone = c
            .delete_job(ns, name, policy.unwrap_or(Propagation::Orphan), now, wall)
            .unwrap_or(existing);
        let mut response = json_response(StatusCode::OK, &gone);
        if policy.is_none() {
            add_warning(&mut response, JOB_ORPHAN_WARNING);
        }
        return Ok(response);
    }
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
