//! Dynamic shell completion: cluster, node pool, machine, job and plan names come from the
//! server the client would talk to (`COMPLETE=bash medea`, clap_complete's environment
//! protocol). The completer sees no flags of the line being completed, so it connects the way a
//! command without flags does: `MEDEA_*` variables, then the client context, then the local
//! server's state directory. It waits at most [`PATIENCE`] and offers nothing when no server
//! answers, so a shell never hangs on a completion.

use std::ffi::OsStr;
use std::time::Duration;

use clap_complete::engine::{ArgValueCompleter, CompletionCandidate};

use crate::api::pb;
use crate::plan::PlanState;

/// How long a completion may wait for the server.
pub const PATIENCE: Duration = Duration::from_millis(1500);

/// Names that start with what was typed, each with its help text.
fn matching(current: &OsStr, names: Vec<(String, String)>) -> Vec<CompletionCandidate> {
    let typed = current.to_string_lossy();
    names
        .into_iter()
        .filter(|(n, _)| n.starts_with(typed.as_ref()))
        .map(|(n, help)| CompletionCandidate::new(n).help(Some(help.into())))
        .collect()
}

/// Ask the server with `f`; nothing when it cannot be reached in time.
fn ask<F, Fut>(f: F) -> Vec<(String, String)>
where
    F: FnOnce(super::client::Client) -> Fut,
    Fut: std::future::Future<Output = Option<Vec<(String, String)>>>,
{
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return Vec::new();
    };
    rt.block_on(async {
        // What clap would fill from the environment; the token comes from it in `connect`.
        let args = super::client::ClientArgs {
            addr: std::env::var("MEDEA_ADDR").ok(),
            token: None,
            token_file: None,
            ca: std::env::var_os("MEDEA_CA").map(Into::into),
            insecure: false,
            context: std::env::var("MEDEA_CONTEXT").ok(),
        };
        tokio::time::timeout(PATIENCE, async {
            let c = args.connect().await.ok()?;
            f(c).await
        })
        .await
        .ok()
        .flatten()
        .unwrap_or_default()
    })
}

pub fn clusters() -> ArgValueCompleter {
    ArgValueCompleter::new(|current: &OsStr| {
        matching(
            current,
            ask(|mut c| async move {
                let r = c.list_clusters(pb::ListClustersRequest {}).await.ok()?;
                Some(
                    r.into_inner()
                        .clusters
                        .into_iter()
                        .map(|c| (c.name, "cluster".to_string()))
                        .collect(),
                )
            }),
        )
    })
}

pub fn pools() -> ArgValueCompleter {
    ArgValueCompleter::new(|current: &OsStr| {
        matching(
            current,
            ask(|mut c| async move {
                let r = c
                    .list_node_pools(pb::ListNodePoolsRequest::default())
                    .await
                    .ok()?;
                Some(
                    r.into_inner()
                        .pools
                        .into_iter()
                        .map(|p| (p.name, format!("node pool of {}", p.cluster)))
                        .collect(),
                )
            }),
        )
    })
}

pub fn machines() -> ArgValueCompleter {
    ArgValueCompleter::new(|current: &OsStr| {
        matching(
            current,
            ask(|mut c| async move {
                let r = c
                    .list_machines(pb::ListMachinesRequest::default())
                    .await
                    .ok()?;
                Some(
                    r.into_inner()
                        .into_machines()
                        .into_iter()
                        .map(|m| (m.node, format!("machine of {}", m.cluster)))
                        .collect(),
                )
            }),
        )
    })
}

pub fn jobs() -> ArgValueCompleter {
    ArgValueCompleter::new(|current: &OsStr| {
        matching(
            current,
            ask(|mut c| async move {
                let r = c
                    .list_rollouts(pb::ListRolloutsRequest::default())
                    .await
                    .ok()?;
                Some(
                    r.into_inner()
                        .rollouts
                        .into_iter()
                        .map(|j| (j.job_id, j.state))
                        .collect(),
                )
            }),
        )
    })
}

/// Plans waiting for approvals (full ids, as `medea approve` wants them).
pub fn pending_plans() -> ArgValueCompleter {
    ArgValueCompleter::new(|current: &OsStr| {
        matching(
            current,
            ask(|mut c| async move {
                let r = c
                    .list_plans(pb::ListPlansRequest { limit: 20 })
                    .await
                    .ok()?;
                Some(
                    r.into_inner()
                        .plans
                        .into_iter()
                        .filter(|p| {
                            PlanState::from_wire(&p.state) == Some(PlanState::Pending) && !p.stale
                        })
                        .map(|p| {
                            (
                                p.id,
                                format!(
                                    "plan {}, {}/{} approvals",
                                    p.short_id,
                                    p.approvals.len(),
                                    p.approvals_required
                                ),
                            )
                        })
                        .collect(),
                )
            }),
        )
    })
}
