//! The gRPC API (`proto/medea/v1/medea.proto`). Read RPCs serve from the store and the last
//! loaded desired state; mutating RPCs go through the same store transactions as the CLI.

use std::pin::Pin;
use std::sync::Arc;

use backon::Retryable as _;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::Shared;
use crate::Locked as _;
use crate::api::machines::EncodedRows;
use crate::inventory::{self, MachineRole, ObservedCluster};
use crate::plan::PlanState;
use crate::store::{StoreExt, Txn};

/// The generated API code lives in [`crate::api::pb`]; this path keeps working.
pub use crate::api::pb;

pub struct MedeaApi {
    pub shared: Arc<Shared>,
}

/// How often an API approval is verified again after a store conflict before giving up.
const SUBMIT_ATTEMPTS: u32 = 5;

/// Why one verification of a submitted approval did not settle it.
enum Submit {
    /// The store changed while recording it: nothing was written; verify it again.
    Conflict(Box<super::reconcile::PassResult>),
    /// The pass failed.
    Failed(Status),
}

impl From<Status> for Submit {
    fn from(s: Status) -> Submit {
        Submit::Failed(s)
    }
}

fn internal(e: impl std::fmt::Display) -> Status {
    tracing::error!(error = %e, "API request failed");
    Status::internal(e.to_string())
}

fn role_name(r: MachineRole) -> &'static str {
    match r {
        MachineRole::Controlplane => "controlplane",
        MachineRole::Worker => "worker",
    }
}

/// The `get machines` rows of one cluster record, as built from its stored bytes under one
/// desired revision (the pools come from it), encoded once for the wire.
pub struct CachedRows {
    raw: Vec<u8>,
    revision: Option<String>,
    rows: Arc<EncodedRows>,
}

/// [`CachedRows`] by cluster record key.
pub type MachineRows = std::sync::Mutex<std::collections::HashMap<String, CachedRows>>;

impl MedeaApi {
    /// One cluster's machines as the API lists them, each with the pool that selects it.
    fn machine_rows(
        &self,
        c: &ObservedCluster,
        desired: Option<&crate::desired::Loaded>,
    ) -> Vec<pb::Machine> {
        let cname = &c.name;
        // Pools by listed machine once per cluster, not a scan of every pool per machine.
        let pools = desired.and_then(|d| d.desired.clusters.get(cname));
        let mut listed: std::collections::HashMap<&str, &str> = Default::default();
        for p in pools.into_iter().flat_map(|dc| dc.pools.values()) {
            for m in &p.machines {
                // First pool in name order wins, as in `pool_of`.
                listed
                    .entry(m.value.as_str())
                    .or_insert(p.name.value.as_str());
            }
        }
        let pool_of = |m: &inventory::Machine| -> String {
            pools
                .and_then(|dc| dc.pools.values().find(|p| p.selects(&m.node, &m.labels)))
                .map(|p| p.name.value.clone())
                .unwrap_or_default()
        };
        c.machines
            .values()
            .map(|m| {
                let pool = match pools {
                    // The first pool (in name order) that selects it, as `pool_of` decides.
                    Some(dc) => match listed.get(m.node.as_str()) {
                        Some(p)
                            if dc
                                .pools
                                .values()
                                .take_while(|q| q.name.value.as_str() != *p)
                                .all(|q| q.selector.is_empty()) =>
                        {
                            p.to_string()
                        }
                        _ => pool_of(m),
                    },
                    None => String::new(),
                };
                pb::Machine {
                    cluster: cname.clone(),
                    pool,
                    node: m.node.clone(),
                    id: m.id.clone(),
                    address: m.address.clone(),
                    role: role_name(m.role).into(),
                    talos_version: m
                        .talos_version
                        .as_ref()
                        .map(|v| v.to_string())
                        .unwrap_or_default(),
                    kubelet_version: m
                        .kubelet_version
                        .as_ref()
                        .map(|v| v.to_string())
                        .unwrap_or_default(),
                    ready: m.ready,
                    cordoned: m.cordoned,
                    reachable: m.reachable,
                }
            })
            .collect()
    }

    /// Every cluster record's `get machines` rows (only `filter`'s when it is not empty), in
    /// store key order, each encoded once and shared with the cache.
    ///
    /// The raw records are read on every call, not decoded: a cluster whose bytes (and the
    /// desired revision its pools come from) are unchanged since the last call reuses its
    /// encoded rows, so a warm call copies bytes and nothing else.
    /// `Ok` for an empty filter or a cluster the desired state or the inventory names;
    /// otherwise `NotFound` naming the known clusters, so `medea get machines --cluster nope`
    /// is an error rather than an empty table.
    pub fn known_cluster(&self, filter: &str) -> Result<(), Status> {
        if filter.is_empty() {
            return Ok(());
        }
        if self
            .shared
            .desired()
            .is_some_and(|d| d.desired.clusters.contains_key(filter))
        {
            return Ok(());
        }
        let key = inventory::cluster_key(filter);
        if self
            .shared
            .store
            .get(crate::store::Table::Inventory, &key)
            .map_err(internal)?
            .is_some()
        {
            return Ok(());
        }
        let inv = inventory::Inventory::load(self.shared.store.as_ref()).map_err(internal)?;
        let mut names: std::collections::BTreeSet<String> = inv.clusters.keys().cloned().collect();
        if let Some(d) = self.shared.desired() {
            names.extend(d.desired.clusters.keys().cloned());
        }
        let known = if names.is_empty() {
            "no cluster is known yet".to_string()
        } else {
            format!(
                "known: {}",
                names.into_iter().collect::<Vec<_>>().join(", ")
            )
        };
        Err(Status::not_found(format!(
            "no cluster named `{filter}` ({known})"
        )))
    }

    pub fn machines_encoded(&self, filter: &str) -> Result<Vec<Arc<EncodedRows>>, Status> {
        let desired = self.shared.desired();
        let revision = desired
            .as_ref()
            .map(|d| d.desired.revision.content.as_str());
        let raw = if filter.is_empty() {
            self.shared
                .store
                .scan(crate::store::Table::Inventory, "cluster/")
                .map_err(internal)?
        } else {
            let key = inventory::cluster_key(filter);
            self.shared
                .store
                .get(crate::store::Table::Inventory, &key)
                .map_err(internal)?
                .map(|bytes| (key, bytes))
                .into_iter()
                .collect()
        };
        let mut cache = self.shared.machine_rows.locked();
        let mut out = Vec::with_capacity(raw.len());
        let mut present = std::collections::HashSet::new();
        for (key, bytes) in raw {
            let hit = cache
                .get(&key)
                .filter(|c| c.raw == bytes && c.revision.as_deref() == revision)
                .map(|c| c.rows.clone());
            let rows = match hit {
                Some(rows) => rows,
                None => {
                    let c: ObservedCluster =
                        crate::store::record::decode(&key, &bytes).map_err(internal)?;
                    let rows =
                        Arc::new(EncodedRows::new(self.machine_rows(&c, desired.as_deref())));
                    cache.insert(
                        key.clone(),
                        CachedRows {
                            raw: bytes,
                            revision: revision.map(str::to_string),
                            rows: rows.clone(),
                        },
                    );
                    rows
                }
            };
            out.push(rows);
            present.insert(key);
        }
        if filter.is_empty() {
            cache.retain(|k, _| present.contains(k));
        }
        Ok(out)
    }

    fn cluster_pb(&self, name: &str, observed: Option<&ObservedCluster>) -> pb::Cluster {
        let desired = self.shared.desired();
        let desired_k8s = desired
            .as_ref()
            .and_then(|d| d.desired.clusters.get(name))
            .map(|c| c.kubernetes_version.value.to_string())
            .unwrap_or_default();
        match observed {
            Some(o) => pb::Cluster {
                name: name.to_string(),
                kubernetes_version: o
                    .kubernetes_version
                    .as_ref()
                    .map(|v| v.to_string())
                    .unwrap_or_default(),
                desired_kubernetes_version: desired_k8s,
                rollouts_enabled: o.rollouts_enabled,
                generation: o.generation,
                machines: o.machines.len() as u32,
                machines_ready: o.machines.values().filter(|m| m.ready).count() as u32,
                observed: true,
            },
            None => pb::Cluster {
                name: name.to_string(),
                desired_kubernetes_version: desired_k8s,
                ..Default::default()
            },
        }
    }
}

fn diag_pb(d: &crate::desired::Diagnostic, loaded: &crate::desired::Loaded) -> pb::Diagnostic {
    pb::Diagnostic {
        severity: if d.is_error() {
            "error".into()
        } else {
            "warning".into()
        },
        code: d.code.to_string(),
        message: d.message.clone(),
        file: d.origin.file.clone(),
        line: d.origin.line as u32,
        column: d.origin.column as u32,
        help: d.help.clone().unwrap_or_default(),
        rendered: crate::ops::report::render_plain(d, loaded),
    }
}

impl MedeaApi {
    fn plan_pb(&self, p: &crate::plan::Plan) -> Result<pb::Plan, crate::store::StoreError> {
        use crate::store::StoreExt;
        let store = self.shared.store.as_ref();
        let records = crate::ops::approvals::recorded(store, &p.id)?;
        // What counts is distinct verified people (`ops::approvals::status`, the reconcile
        // pass's computation): each record is verified again against the signers in force (a
        // removed signer no longer counts) and one person counts once, whatever number of
        // keys, markers or submissions they used. The view asks who approved this plan; its
        // execution is its state below, so its own consumed id does not make the records
        // replays here.
        let (signers, generation) = self.shared.trust.in_force_generation();
        let mut index = crate::ops::approvals::PlanIndex::load(store)?;
        index.consumed.remove(&p.id);
        let status = crate::ops::approvals::status(
            &index,
            crate::ops::approvals::Trust {
                signers: &signers,
                generation,
            },
            p,
            &records,
            &[],
            &[],
            jiff::Timestamp::now(),
            &mut Default::default(),
        );
        // The current plan's view comes from the last reconcile pass, which judged the
        // revision's markers too; another plan's from its records.
        let pass = self.shared.last_pass();
        let view = match &pass.plan {
            Some(q) if q.id == p.id => pass.approvals.clone(),
            _ => status.view(&signers),
        };
        let quorum = status.quorum;
        let approvals: Vec<&crate::approval::ApprovalRecord> = records
            .iter()
            .filter(|r| {
                quorum
                    .counted
                    .iter()
                    .any(|a| a.fingerprint == r.fingerprint && a.source == r.source)
            })
            .collect();
        let consumed: Option<crate::rollout::journal::PlanConsumed> =
            store.get_record(&crate::plan::stored::consumed_key(&p.id))?;
        let current = crate::ops::replan::current(store)?.map(|c| c.id);
        let stale = match self
            .shared
            .desired()
            .as_ref()
            .and_then(|l| l.valid().cloned())
        {
            Some(d) => p.is_stale(&crate::ops::replan::current_basis(store, &d)?),
            None => current != Some(p.id),
        };
        let state = if let Some(c) = &consumed {
            consumed_state(store, c)?
        } else if current != Some(p.id) {
            PlanState::Superseded
        } else if !p.has_changes() {
            PlanState::NoChanges
        } else if crate::plan::preflight::refusal(p).is_some() {
            PlanState::Blocked
        } else if quorum.reached() {
            PlanState::Approved
        } else {
            PlanState::Pending
        };
        Ok(pb::Plan {
            id: p.id.to_hex(),
            short_id: p.id.short(),
            parent: p.parent.map(|x| x.to_hex()).unwrap_or_default(),
            desired_revision: p.basis.desired.content.clone(),
            commit: p.basis.desired.commit.clone().unwrap_or_default(),
            has_changes: p.has_changes(),
            stale,
            approvals_required: p.approvals_required,
            approvals: approvals
                .iter()
                .map(|a| pb::Approval {
                    principal: a.principal.clone(),
                    fingerprint: a.fingerprint.clone(),
                    source: match &a.source {
                        crate::approval::ApprovalSource::Marker { path } => {
                            format!("marker:{path}")
                        }
                        crate::approval::ApprovalSource::Api => "api".into(),
                    },
                    at: a.at.to_string(),
                })
                .collect(),
            state: state.to_string(),
            rendered: {
                let mut text = crate::plan::render::text_in_state(
                    p,
                    crate::plan::render::Options { color: false },
                    state,
                );
                if state == crate::plan::PlanState::Pending {
                    text.push_str(&crate::plan::render::approvals_text(&view));
                }
                text
            },
            json: crate::plan::render::json_with_approvals(p, state, &view),
            computed_at: String::new(),
            rejected: view
                .rejected
                .iter()
                .map(|r| pb::RejectedApproval {
                    source: r.source.clone(),
                    fingerprint: r.fingerprint.clone(),
                    principal: r.principal.clone(),
                    code: r.code.clone(),
                    reason: r.reason.clone(),
                })
                .collect(),
            approvals_reason: match crate::plan::render::alone_hint(p) {
                Some(hint) => format!("{}. {hint}", crate::plan::render::bar_reason(p)),
                None => crate::plan::render::bar_reason(p),
            },
            // GetPlan adds them (`rehearsals_pb`); ListPlans lists plans without them.
            rehearsals: Vec::new(),
            rehearsing: self.shared.rehearsing.contains(&p.id),
        })
    }
}

/// The stored rehearsal of each cluster of `plan` that has one, in the plan's cluster order
/// (issue #36 item 4): advice beside the plan, read from its own records, never from the plan.
fn rehearsals_pb(
    store: &dyn crate::store::Store,
    plan: &crate::plan::Plan,
) -> Result<Vec<pb::Rehearsal>, crate::store::StoreError> {
    let mut out = Vec::new();
    for c in &plan.clusters {
        if let Some(r) = crate::ops::rehearse::load_report(store, &plan.id, &c.cluster)? {
            out.push(rehearsal_pb(&r));
        }
    }
    Ok(out)
}

/// The API's view of one stored rehearsal report.
pub fn rehearsal_pb(r: &crate::rehearsal::report::Rehearsal) -> pb::Rehearsal {
    use crate::rehearsal::report::Outcome;
    use crate::rehearsal::show;
    let outcome = match &r.outcome {
        Outcome::Completed { total_secs } => pb::RehearsalOutcome {
            total_seconds: *total_secs,
            ..Default::default()
        },
        Outcome::Halted {
            code,
            node,
            reason,
            after_secs,
        } => pb::RehearsalOutcome {
            code: code.clone(),
            node: node.clone().unwrap_or_default(),
            reason: reason.clone(),
            after_seconds: *after_secs,
            ..Default::default()
        },
        Outcome::NotRun { reason } => pb::RehearsalOutcome {
            reason: reason.clone(),
            ..Default::default()
        },
    };
    pb::Rehearsal {
        cluster: r.cluster.clone(),
        plan_id: r.plan.clone(),
        ran_at: r.ran_at.clone(),
        census_gathered_at: r.census_gathered_at.clone(),
        compression: r.compression,
        timings: r.timings.clone(),
        waves: r
            .waves
            .iter()
            .map(|w| pb::RehearsedWave {
                step: w.step.clone(),
                wave: u32::try_from(w.wave).unwrap_or(u32::MAX),
                nodes: w.nodes.clone(),
                start_seconds: w.start_secs,
                duration_seconds: w.duration_secs,
            })
            .collect(),
        outcome: Some(pb::RehearsalOutcome {
            kind: show::outcome_kind(&r.outcome).into(),
            summary: show::outcome_line(&r.outcome),
            ..outcome
        }),
        blockers: r
            .blockers
            .iter()
            .map(|b| pb::RehearsalBlocker {
                kind: show::blocker_kind(b.kind).into(),
                node: b.node.clone().unwrap_or_default(),
                detail: b.detail.clone(),
            })
            .collect(),
        limits: r.limits.clone(),
        rendered: crate::rehearsal::render::text(r),
        json: show::json(r),
        advice: show::ADVICE.into(),
    }
}

/// The status a refused `RehearsePlan` answers.
pub fn start_status(e: &super::rehearsals::StartError) -> Status {
    use super::rehearsals::StartError as E;
    match e {
        E::BadId { .. } | E::Ambiguous(_) | E::Compression(_) => {
            Status::invalid_argument(crate::error_chain(e))
        }
        E::UnknownPlan(_) => Status::not_found(e.to_string()),
        E::Busy { .. } => Status::resource_exhausted(e.to_string()),
        E::NotLeader { .. }
        | E::NoPlan
        | E::NotCurrent { .. }
        | E::Executed(_)
        | E::Stale(_)
        | E::NothingToRehearse(_)
        | E::DesiredInvalid => Status::failed_precondition(e.to_string()),
        E::Store(_) => internal(crate::error_chain(e)),
    }
}

/// What became of a consumed plan: its jobs still `running`, all succeeded (or none: settings
/// only) `applied`, or one `halted`.
fn consumed_state(
    store: &dyn crate::store::Store,
    c: &crate::rollout::journal::PlanConsumed,
) -> Result<PlanState, crate::store::StoreError> {
    use crate::rollout::sequencer::JobState;
    let mut state = PlanState::Applied;
    for id in &c.jobs {
        match crate::ops::jobs::load_job(store, id)?.map(|j| j.state) {
            Some(JobState::Running) => return Ok(PlanState::Running),
            Some(JobState::Halted { .. }) => state = PlanState::Halted,
            Some(JobState::Succeeded { .. }) => {}
            None => state = PlanState::Consumed,
        }
    }
    Ok(state)
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::RolloutEvent, Status>> + Send>>;

#[tonic::async_trait]
impl pb::medea_server::Medea for MedeaApi {
    async fn server_info(
        &self,
        _: Request<pb::ServerInfoRequest>,
    ) -> Result<Response<pb::ServerInfoResponse>, Status> {
        let desired = self.shared.desired();
        Ok(Response::new(pb::ServerInfoResponse {
            version: env!("CARGO_PKG_VERSION").to_string(),
            git_sha: crate::build_info::GIT_SHA.to_string(),
            rollouts_gate: self.shared.rollouts_gate,
            replica: self.shared.replica.clone(),
            leader: self.shared.leadership.is_leader(),
            leader_replica: self.shared.leadership.leader_replica().unwrap_or_default(),
            desired_source: self.shared.source.to_string(),
            desired_revision: desired
                .map(|d| d.desired.revision.to_string())
                .unwrap_or_default(),
            allowed_signers_problem: self.shared.trust.problem().unwrap_or_default(),
            desired_path: match &self.shared.source {
                crate::desired::Source::Dir(p) | crate::desired::Source::Git { path: p, .. } => {
                    p.display().to_string()
                }
            },
            desired_git_ref: match &self.shared.source {
                crate::desired::Source::Git { reference, .. } => reference.clone(),
                crate::desired::Source::Dir(_) => String::new(),
            },
        }))
    }

    async fn list_clusters(
        &self,
        _: Request<pb::ListClustersRequest>,
    ) -> Result<Response<pb::ListClustersResponse>, Status> {
        let inv = inventory::Inventory::load(self.shared.store.as_ref()).map_err(internal)?;
        let mut names: std::collections::BTreeSet<String> = inv.clusters.keys().cloned().collect();
        if let Some(d) = self.shared.desired() {
            names.extend(d.desired.clusters.keys().cloned());
        }
        let clusters = names
            .iter()
            .map(|n| self.cluster_pb(n, inv.clusters.get(n).map(|c| &**c)))
            .collect();
        Ok(Response::new(pb::ListClustersResponse { clusters }))
    }

    async fn list_node_pools(
        &self,
        req: Request<pb::ListNodePoolsRequest>,
    ) -> Result<Response<pb::ListNodePoolsResponse>, Status> {
        let filter = req.into_inner().cluster;
        self.known_cluster(&filter)?;
        let inv = inventory::Inventory::load(self.shared.store.as_ref()).map_err(internal)?;
        let mut pools = Vec::new();
        if let Some(d) = self.shared.desired() {
            for (cname, c) in &d.desired.clusters {
                if !filter.is_empty() && &filter != cname {
                    continue;
                }
                for p in c.pools.values() {
                    let members: Vec<&inventory::Machine> = inv
                        .clusters
                        .get(cname)
                        .map(|o| {
                            o.machines
                                .values()
                                .filter(|m| p.selects(&m.node, &m.labels))
                                .collect()
                        })
                        .unwrap_or_default();
                    let mut running: Vec<String> = members
                        .iter()
                        .filter_map(|m| m.talos_version.as_ref().map(|v| v.to_string()))
                        .collect();
                    running.sort();
                    running.dedup();
                    pools.push(pb::NodePool {
                        cluster: cname.clone(),
                        name: p.name.value.clone(),
                        role: match p.role {
                            crate::desired::Role::Controlplane => "controlplane".into(),
                            crate::desired::Role::Worker => "worker".into(),
                        },
                        desired_talos_version: p.talos_version.value.to_string(),
                        running_talos_versions: running,
                        machines: members.len() as u32,
                        max_unavailable: p.rollout.max_unavailable,
                    });
                }
            }
        }
        Ok(Response::new(pb::ListNodePoolsResponse { pools }))
    }

    async fn list_machines(
        &self,
        req: Request<pb::ListMachinesRequest>,
    ) -> Result<Response<pb::ListMachinesResponse>, Status> {
        let filter = req.into_inner().cluster;
        self.known_cluster(&filter)?;
        let clusters = self.machines_encoded(&filter)?;
        Ok(Response::new(pb::ListMachinesResponse::from_encoded(
            clusters,
        )))
    }

    async fn get_plan(
        &self,
        req: Request<pb::GetPlanRequest>,
    ) -> Result<Response<pb::GetPlanResponse>, Status> {
        let want = req.into_inner().id;
        let store = self.shared.store.as_ref();
        let mut diagnostics = Vec::new();
        if let Some(loaded) = self.shared.desired() {
            for d in &loaded.diagnostics {
                diagnostics.push(diag_pb(d, &loaded));
            }
            for d in &self.shared.last_pass().diagnostics {
                diagnostics.push(diag_pb(d, &loaded));
            }
        }
        let plan = if want.is_empty() {
            match crate::ops::replan::current(store).map_err(internal)? {
                Some(c) => crate::ops::replan::load_plan(store, &c.id).map_err(internal)?,
                None => None,
            }
        } else {
            let r = crate::plan::PlanIdRef::parse(&want)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            // ids from the store keys; only the one that matches is decoded
            let ids = crate::ops::replan::plan_ids(store).map_err(internal)?;
            let mut m: Vec<_> = ids.into_iter().filter(|id| r.matches(id)).collect();
            match m.len() {
                0 => return Err(Status::not_found(format!("no plan `{want}`"))),
                1 => match m.pop() {
                    Some(id) => crate::ops::replan::load_plan(store, &id).map_err(internal)?,
                    None => None,
                },
                _ => {
                    return Err(Status::invalid_argument(format!(
                        "plan id `{want}` is ambiguous; type more characters"
                    )));
                }
            }
        };
        let plan = match plan {
            Some(p) => {
                let mut view = self.plan_pb(&p).map_err(internal)?;
                view.rehearsals = rehearsals_pb(store, &p).map_err(internal)?;
                Some(view)
            }
            None => None,
        };
        let mut halted = Vec::new();
        if want.is_empty() {
            // Jobs come newest first: the first of each cluster is its newest.
            let mut seen = std::collections::BTreeSet::new();
            for j in super::rollouts::jobs(&self.shared).map_err(internal)? {
                if seen.insert(j.cluster.clone())
                    && matches!(j.state, crate::rollout::sequencer::JobState::Halted { .. })
                {
                    halted.push(super::rollouts::rollout_pb(&j));
                }
            }
        }
        Ok(Response::new(pb::GetPlanResponse {
            plan,
            diagnostics,
            halted,
        }))
    }

    async fn list_plans(
        &self,
        req: Request<pb::ListPlansRequest>,
    ) -> Result<Response<pb::ListPlansResponse>, Status> {
        let limit = match req.into_inner().limit {
            0 => 20,
            n => n as usize,
        };
        let store = self.shared.store.as_ref();
        // Newest first: follow the parent chain from the current plan.
        let mut plans = Vec::new();
        let mut next = crate::ops::replan::current(store)
            .map_err(internal)?
            .map(|c| c.id);
        while let Some(id) = next {
            if plans.len() >= limit {
                break;
            }
            let Some(p) = crate::ops::replan::load_plan(store, &id).map_err(internal)? else {
                break;
            };
            next = p.parent;
            let mut pb = self.plan_pb(&p).map_err(internal)?;
            pb.rendered.clear();
            pb.json.clear();
            plans.push(pb);
        }
        Ok(Response::new(pb::ListPlansResponse { plans }))
    }

    async fn preview_plan(
        &self,
        req: Request<pb::PreviewPlanRequest>,
    ) -> Result<Response<pb::PreviewPlanResponse>, Status> {
        use crate::desired::source::{SourceFile, is_marker_path, is_resource_path, limits};
        let req = req.into_inner();
        // The same bounds a revision read from disk has (the request itself is bounded by
        // the gRPC message limit).
        if req.files.len() > limits::MAX_FILES {
            return Err(Status::invalid_argument(format!(
                "{} files: a desired state holds at most {}",
                req.files.len(),
                limits::MAX_FILES
            )));
        }
        let mut files = Vec::with_capacity(req.files.len());
        for f in req.files {
            if f.content.len() > limits::MAX_FILE_BYTES {
                return Err(Status::invalid_argument(format!(
                    "{}: {} bytes, over the {} a desired-state file may have",
                    f.path,
                    f.content.len(),
                    limits::MAX_FILE_BYTES
                )));
            }
            let clean = !f.path.is_empty()
                && !f.path.starts_with('/')
                && f.path
                    .split('/')
                    .all(|c| !c.is_empty() && c != "." && c != "..");
            if !clean {
                return Err(Status::invalid_argument(format!(
                    "`{}` is not a relative path inside the desired state",
                    f.path
                )));
            }
            // Approval markers are not part of a preview: it can never be approved.
            if is_marker_path(&f.path) || !is_resource_path(&f.path) {
                continue;
            }
            files.push(SourceFile {
                path: f.path,
                bytes: f.content.into(),
            });
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        // At most `PREVIEWS` at once, each answered within its deadline (issue #49); the
        // permit is held until the computation ends, even past the deadline.
        let limits = &self.shared.request_limits;
        let Ok(permit) = limits.previews.clone().try_acquire_owned() else {
            return Err(Status::resource_exhausted(
                "the server is computing as many previews as it allows at once; try again when one has finished",
            ));
        };
        let deadline = limits.preview_deadline;
        let shared = self.shared.clone();
        let computing = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let mut loaded = crate::desired::parse_snapshot(crate::desired::source::Snapshot {
                files,
                markers: Vec::new(),
                commit: None,
                refused: Vec::new(),
            });
            crate::server::policy_check(&shared.hook_policy, &mut loaded);
            let mut r = pb::PreviewPlanResponse::default();
            if loaded.has_errors() {
                r.diagnostics = loaded
                    .diagnostics
                    .iter()
                    .map(|d| diag_pb(d, &loaded))
                    .collect();
                return Ok(r);
            }
            match crate::ops::replan::preview(shared.store.as_ref(), &loaded.desired) {
                Ok(p) => {
                    r.rendered = crate::plan::render::text_in_state(
                        &p,
                        crate::plan::render::Options { color: false },
                        crate::plan::PlanState::Preview,
                    );
                    r.json =
                        crate::plan::render::json_in_state(&p, crate::plan::PlanState::Preview);
                    r.has_changes = p.has_changes();
                    r.short_id = p.id.short();
                }
                Err(crate::ops::replan::ReplanError::Refused(diags)) => {
                    r.diagnostics = diags.iter().map(|d| diag_pb(d, &loaded)).collect();
                }
                Err(crate::ops::replan::ReplanError::Store(e)) => return Err(e),
            }
            Ok(r)
        });
        let answer = tokio::time::timeout(deadline, computing)
            .await
            .map_err(|_| {
                Status::deadline_exceeded(format!(
                    "the preview took longer than {} s; a revision this large is planned by the server once committed",
                    deadline.as_secs()
                ))
            })?
            .map_err(internal)?
            .map_err(internal)?;
        Ok(Response::new(answer))
    }

    async fn submit_approval(
        &self,
        req: Request<pb::SubmitApprovalRequest>,
    ) -> Result<Response<pb::SubmitApprovalResponse>, Status> {
        let req = req.into_inner();
        let store = self.shared.store.clone();
        let current = crate::ops::replan::current(store.as_ref())
            .map_err(internal)?
            .map(|c| c.id);
        // Stored and executed plans, from the store's keys (an executed plan whose record
        // was collected is still named as stale, not unknown).
        let known: Vec<crate::plan::PlanId> =
            crate::ops::approvals::PlanIndex::load(store.as_ref())
                .map_err(internal)?
                .known();
        let r = crate::plan::PlanIdRef::parse(&req.plan_id)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let plan = crate::approval::resolve_plan(&r, current.as_ref(), &known)
            .map_err(|e| Status::failed_precondition(e.to_string()))?;
        let candidate = crate::approval::Candidate {
            source: crate::approval::ApprovalSource::Api,
            armored: req.signature,
            named: Some(plan),
        };
        // Verify (and record) the signature; a store conflict means nothing was written, so
        // the submission is verified again against whatever is current then.
        // `backon`, without a pause between attempts (the conflict is a race with another
        // writer, not a load to back off from), at most SUBMIT_ATTEMPTS verifications; after
        // the last, the conflicted state is answered below.
        let verify = || {
            let shared = self.shared.clone();
            let candidate = candidate.clone();
            async move {
                let state = tokio::task::spawn_blocking(move || {
                    super::reconcile::reconcile(
                        &shared,
                        std::slice::from_ref(&candidate),
                        jiff::Timestamp::now(),
                    )
                })
                .await
                .map_err(internal)?
                .map_err(internal)?;
                if state.conflict {
                    return Err(Submit::Conflict(Box::new(state)));
                }
                Ok(state)
            }
        };
        let state = match verify
            .retry(
                backon::ConstantBuilder::default()
                    .with_delay(std::time::Duration::ZERO)
                    .with_max_times(SUBMIT_ATTEMPTS as usize - 1),
            )
            .sleep(tokio::time::sleep)
            .when(|e| matches!(e, Submit::Conflict(_)))
            .notify(|_, _| tracing::info!(plan = %plan.short(), "approval met a store conflict; verifying it again"))
            .await
        {
            Ok(state) => state,
            Err(Submit::Conflict(state)) => *state,
            Err(Submit::Failed(status)) => return Err(status),
        };
        self.shared.set_last_pass(state.clone());
        // Answer only for a verified signature.
        let Some((counts, outcome)) = state.submitted.first().cloned() else {
            return Err(Status::failed_precondition(format!(
                "the approval was not verified: plan {} cannot be approved right now (the desired state is invalid, or the plan is being recomputed); check `medea plan` and approve the current id",
                plan.short()
            )));
        };
        if !counts {
            return Err(Status::permission_denied(format!(
                "approval refused: {outcome}"
            )));
        }
        if state.conflict {
            return Err(Status::aborted(format!(
                "the approval was verified but not recorded: the store changed {SUBMIT_ATTEMPTS} times while recording it; submit it again"
            )));
        }
        let quorum = state.quorum.clone();
        let approved_by = quorum
            .as_ref()
            .and_then(|q| q.counted.last().map(|a| a.principal.clone()))
            .unwrap_or_default();
        if !state.started.is_empty() || state.applied {
            // Applied settings or new jobs change the basis: replan at once.
            self.shared.bump();
        }
        Ok(Response::new(pb::SubmitApprovalResponse {
            outcome,
            principal: approved_by,
            approvals: quorum.as_ref().map_or(0, |q| q.count()),
            approvals_required: quorum.as_ref().map_or(0, |q| q.required),
            started_jobs: state.started.clone(),
            closed_gates: state.waiting.clone(),
        }))
    }

    async fn set_rollouts_enabled(
        &self,
        req: Request<pb::SetRolloutsEnabledRequest>,
    ) -> Result<Response<pb::SetRolloutsEnabledResponse>, Status> {
        let req = req.into_inner();
        let key = inventory::cluster_key(&req.cluster);
        let store = self.shared.store.as_ref();
        let current: ObservedCluster =
            store.get_record(&key).map_err(internal)?.ok_or_else(|| {
                Status::not_found(format!(
                    "cluster `{}` has not been observed: run `medea seed` first",
                    req.cluster
                ))
            })?;
        let next = current.with_rollouts_enabled(req.enabled);
        store
            .commit(
                Txn::new()
                    .check_record(key.as_str(), &current)
                    .put_record(key.as_str(), &next),
            )
            .map_err(|e| match e {
                crate::store::StoreError::Conflict { .. } => {
                    Status::aborted("the cluster changed concurrently; retry")
                }
                other => internal(other),
            })?;
        tracing::info!(cluster = %req.cluster, enabled = req.enabled, "rolloutsEnabled changed");
        self.shared.bump();
        Ok(Response::new(pb::SetRolloutsEnabledResponse {
            cluster: Some(self.cluster_pb(&req.cluster, Some(&next))),
        }))
    }

    async fn list_rollouts(
        &self,
        req: Request<pb::ListRolloutsRequest>,
    ) -> Result<Response<pb::ListRolloutsResponse>, Status> {
        let cluster = req.into_inner().cluster;
        self.known_cluster(&cluster)?;
        let rollouts = super::rollouts::jobs(&self.shared)
            .map_err(internal)?
            .iter()
            .filter(|j| cluster.is_empty() || j.cluster == cluster)
            .map(|j| super::rollouts::rollout_view(j, &self.shared.waits))
            .collect();
        Ok(Response::new(pb::ListRolloutsResponse { rollouts }))
    }

    async fn list_backups(
        &self,
        req: Request<pb::ListBackupsRequest>,
    ) -> Result<Response<pb::ListBackupsResponse>, Status> {
        let cluster = req.into_inner().cluster;
        self.known_cluster(&cluster)?;
        let store = self.shared.store.as_ref();
        let clusters: Vec<String> = if cluster.is_empty() {
            crate::ops::replan::load_applied(store)
                .map_err(internal)?
                .cluster_names()
                .into_iter()
                .collect()
        } else {
            vec![cluster]
        };
        let mut backups = Vec::new();
        for c in clusters {
            for r in crate::ops::backup::list(store, &c).map_err(internal)? {
                backups.push(super::backups::backup_view(&r));
            }
        }
        Ok(Response::new(pb::ListBackupsResponse { backups }))
    }

    async fn backup_now(
        &self,
        req: Request<pb::BackupNowRequest>,
    ) -> Result<Response<pb::BackupNowResponse>, Status> {
        let cluster = req.into_inner().cluster;
        if cluster.is_empty() {
            return Err(Status::invalid_argument("name the cluster to back up"));
        }
        self.known_cluster(&cluster)?;
        let rec = super::backups::backup_now(&self.shared, &cluster).await?;
        Ok(Response::new(pb::BackupNowResponse {
            backup: Some(super::backups::backup_view(&rec)),
        }))
    }

    async fn rehearse_plan(
        &self,
        req: Request<pb::RehearsePlanRequest>,
    ) -> Result<Response<pb::RehearsePlanResponse>, Status> {
        use super::rehearsals::{Started, start};
        let req = req.into_inner();
        let answer = match start(&self.shared, req.plan_id.trim(), req.compression)
            .map_err(|e| start_status(&e))?
        {
            Started::Started { plan, clusters } => pb::RehearsePlanResponse {
                outcome: "started".into(),
                plan_id: plan.to_hex(),
                clusters,
            },
            Started::AlreadyRunning { plan } => pb::RehearsePlanResponse {
                outcome: "already running".into(),
                plan_id: plan.to_hex(),
                clusters: Vec::new(),
            },
        };
        Ok(Response::new(answer))
    }

    async fn watch_rollout(
        &self,
        req: Request<pb::WatchRolloutRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let req = req.into_inner();
        self.known_cluster(&req.cluster)?;
        // Subscribe before reading the journal, so nothing falls between the two (an event
        // journaled meanwhile may come twice; the CLI drops a line that repeats its subject's).
        let rx = self.shared.events.subscribe();
        let mut replay = Vec::new();
        if req.replay && !req.job_id.is_empty() {
            let id = crate::rollout::sequencer::JobId::parse(&req.job_id).ok_or_else(|| {
                Status::invalid_argument(format!("`{}` is not a job id", req.job_id))
            })?;
            let (job, entries) = super::rollouts::job_and_journal(&self.shared, &id)
                .map_err(internal)?
                .ok_or_else(|| Status::not_found(format!("no rollout job `{}`", req.job_id)))?;
            replay = super::rollouts::journal_events(&job, &entries);
            if job.state.is_terminal() {
                return Ok(Response::new(Box::pin(tokio_stream::iter(
                    replay.into_iter().map(Ok),
                ))));
            }
            if let Some(w) = self.shared.waits.get(&req.job_id) {
                replay.push(pb::RolloutEvent {
                    job_id: req.job_id.clone(),
                    cluster: job.cluster.clone(),
                    state: "waiting".into(),
                    message: w.reason,
                    detail: w.detail.unwrap_or_default(),
                    at: w.since.to_string(),
                    ..Default::default()
                });
            }
        }
        let live = tokio_stream::wrappers::BroadcastStream::new(rx).filter_map(move |e| match e {
            Ok(e)
                if (req.job_id.is_empty() || e.job.to_string() == req.job_id)
                    && (req.cluster.is_empty() || e.cluster == req.cluster) =>
            {
                Some(Ok(super::rollouts::event_pb(&e)))
            }
            Ok(_) => None,
            // A slow watcher missed events: say so rather than end the stream silently.
            Err(tokio_stream::wrappers::errors::BroadcastStreamRecvError::Lagged(n)) => {
                Some(Ok(pb::RolloutEvent {
                    state: "lagged".into(),
                    message: format!(
                        "{n} events were dropped; run `medea rollout status` for the full state"
                    ),
                    ..Default::default()
                }))
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::iter(replay.into_iter().map(Ok)).chain(live),
        )))
    }

    async fn halt_rollout(
        &self,
        req: Request<pb::HaltRolloutRequest>,
    ) -> Result<Response<pb::HaltRolloutResponse>, Status> {
        let req = req.into_inner();
        let id = crate::rollout::sequencer::JobId::parse(&req.job_id)
            .ok_or_else(|| Status::invalid_argument(format!("`{}` is not a job id", req.job_id)))?;
        let reason = if req.reason.is_empty() {
            None
        } else {
            Some(req.reason.as_str())
        };
        crate::rollout::executor::request_halt(
            self.shared.store.as_ref(),
            &id,
            "api",
            reason,
            jiff::Timestamp::now(),
        )
        .map_err(|e| match e {
            crate::rollout::RolloutError::UnknownJob { .. } => Status::not_found(e.to_string()),
            crate::rollout::RolloutError::AlreadyFinished { .. } => {
                Status::failed_precondition(e.to_string())
            }
            other => internal(other),
        })?;
        tracing::info!(job = %id, "halt requested over the API");
        self.shared.bump();
        let job = super::rollouts::jobs(&self.shared)
            .map_err(internal)?
            .into_iter()
            .find(|j| j.id == id);
        Ok(Response::new(pb::HaltRolloutResponse {
            rollout: job
                .as_ref()
                .map(|j| super::rollouts::rollout_view(j, &self.shared.waits)),
        }))
    }
}

#[cfg(test)]
mod tests;
