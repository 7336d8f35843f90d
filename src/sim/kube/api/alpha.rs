//! Alpha resources that a later Kubernetes minor removes (go-kubernetes
//! `kubernetes/upgrade/checks.go`, `removedAPIResources`). A real kube-apiserver serves an
//! alpha group-version only when `--runtime-config` turns it on, and not at all from the minor
//! that removed it (`pkg/controlplane/apiserver/options`, the removed group-versions are
//! dropped from the registry). The simulator serves such a resource only when a test enabled
//! it with objects ([`super::super::KubeSim::enable_alpha`]) and the served minor is below the
//! removal: a cluster-wide `GET` list, which is what `talosctl upgrade-k8s` and medea send.

use axum::http::{Method, StatusCode};
use axum::response::Response;
use serde_json::json;

use super::{Result, json_response};
use crate::api_lifecycle::{Minor, REMOVED_ALPHA, RemovedAlpha};
use crate::sim::kube::cluster::KubeSide;
use crate::sim::kube::status::ApiError;

/// The answer to `path` when it lists an enabled alpha resource; `None` when the path is not
/// one (the normal routing then answers, a 404 for an alpha group it does not serve).
pub(super) fn answer(
    c: &KubeSide,
    method: &Method,
    path: &str,
    minor: Minor,
) -> Option<Result<Response>> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let ["apis", group, version, plural] = segs.as_slice() else {
        return None;
    };
    let r: &RemovedAlpha = REMOVED_ALPHA
        .iter()
        .find(|r| r.group == *group && r.version == *version && r.resource == *plural)?;
    let objects = c.alpha.get(&r.resource_arg())?;
    if minor >= r.removed {
        return None;
    }
    if method != Method::GET {
        return Some(Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method ({method}) on the requested resource"
        ))));
    }
    let rv = c.store.resource_version().to_string();
    let items: Vec<_> = objects
        .iter()
        .map(|(ns, name)| {
            let mut meta = json!({
                "name": name,
                "uid": format!("alpha-{}-{ns}-{name}", r.resource),
                "resourceVersion": rv,
            });
            if r.namespaced {
                meta["namespace"] = json!(ns);
            }
            json!({"apiVersion": r.api_version(), "kind": r.kind, "metadata": meta})
        })
        .collect();
    Some(Ok(json_response(
        StatusCode::OK,
        &json!({
            "apiVersion": r.api_version(),
            "kind": format!("{}List", r.kind),
            "metadata": {"resourceVersion": rv},
            "items": items,
        }),
    )))
}
