//! Pacing (issue #35 item 4): a wave's budget counts the pool's nodes that are already away,
//! and the next wave's nodes carry a `PreferNoSchedule` taint while the current wave drains.
//!
//! - **Budget.** Before a wave starts, every Node of the cluster is listed once; the step's
//!   nodes outside the wave that are NotReady, cordoned by someone else (medea's own cordons
//!   are lifted once a node is done; a node it found cordoned stays so and counts) or gone
//!   from the cluster take a slot of `maxUnavailable` (the control plane's one) each. The wave
//!   runs with what is left ([`WaveBudget`]); with nothing left it waits, listing again at
//!   every decision, and halts ([`HaltCode::PoolUnavailable`]) once the pool's `healthTimeout`
//!   has passed since the wave first counted. Omni does the same per machine set: its quota is
//!   the update strategy's parallelism less the machines that are not ready.
//! - **Taints.** While wave `w` of a worker step runs, each node of wave `w + 1` gets
//!   [`PACING_TAINT_KEY`]`=<job id>:PreferNoSchedule` (`rollout.taintNextWave`, default on),
//!   so the pods evicted now prefer the nodes that are not drained next; the taint is removed
//!   once its node is done (after its uncordon, or skipped), and every taint left is removed
//!   when the job ends (halted, cancelled or succeeded) by [`cleanup`]. medea only ever adds a
//!   taint whose key and effect the node does not carry, and only removes the taint with its
//!   key *and* the job's id as value: a taint someone else put, the same key included, is
//!   never changed.
//!
//! Every taint call is a journaled command: its intent before the call, its outcome after.
//! A call whose outcome was lost is resolved by observing the node's taints. A taint whose
//! call failed definitely never halts the job (a preference of the scheduler is not worth a
//! rollout); the job record says so ([`PacingTaint::NotPlaced`], [`PacingTaint::Left`]).

use super::*;

/// medea's pacing taint for job `j`: [`PACING_TAINT_KEY`], [`taint_value`] of the job's id,
/// `PreferNoSchedule`.
pub fn pacing_taint(j: &Job) -> NodeTaint {
    NodeTaint {
        key: crate::rollout::ports::PACING_TAINT_KEY.to_string(),
        value: taint_value(j.id.as_str()),
        effect: crate::rollout::ports::PACING_TAINT_EFFECT.to_string(),
    }
}

/// The longest label value (k8s.io/apimachinery `pkg/util/validation` `LabelValueMaxLength`).
const LABEL_VALUE_MAX: usize = 63;

/// Whether `v` is a label value the apiserver takes as a taint's value (kubernetes
/// `pkg/apis/core/validation` `validateNodeTaints` → apimachinery `IsValidLabelValue`): at most
/// 63 characters of `[A-Za-z0-9._-]`, alphanumeric at both ends (or empty).
pub fn valid_label_value(v: &str) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    v.is_empty()
        || (v.len() <= LABEL_VALUE_MAX
            && v.starts_with(alnum)
            && v.ends_with(alnum)
            && v.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.')))
}

/// The pacing taint's value for job `id`: the id itself when it is a valid label value (every
/// job of a cluster whose name is short enough: `<plan>-<cluster>`); otherwise the longest
/// valid prefix that leaves room, a `-`, and the first 12 hex digits of the id's SHA-256, so
/// it stays a label value, distinct per job, and the same at every decision of the job.
pub fn taint_value(id: &str) -> String {
    if valid_label_value(id) {
        return id.to_string();
    }
    use sha2::{Digest, Sha256};
    let digest = hex::encode(Sha256::digest(id.as_bytes()));
    let room = LABEL_VALUE_MAX - 13;
    let prefix: String = id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(room)
        .collect();
    let prefix = prefix.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if prefix.is_empty() {
        return digest[..12].to_string();
    }
    format!("{prefix}-{}", &digest[..12])
}

/// Whether `taints` hold job `j`'s pacing taint (key, value and effect).
pub(super) fn carries(j: &Job, taints: &[NodeTaint]) -> bool {
    let mine = pacing_taint(j);
    taints.contains(&mine)
}

fn taint_command(j: &Job, si: usize, node: &str, op: CommandOp) -> Flow {
    let taint = pacing_taint(j);
    let node = node.to_string();
    let action = match op {
        CommandOp::Taint => Action::Taint {
            node: node.clone(),
            taint,
        },
        _ => Action::Untaint {
            node: node.clone(),
            taint,
        },
    };
    Flow::Run(Box::new(Command {
        key: key(j, si, Some(&node), op, 0),
        action,
    }))
}

/// Before a node of `wave` of step `si` is cordoned (it started: inside the maintenance
/// windows and exclusions): the taint of the first node of the next wave that has none yet
/// (and has not started), when the pool taints its next wave.
pub(super) fn taint_next_wave(j: &Job, si: usize, wave: usize) -> Option<Flow> {
    let ts = talos_of(j, si);
    // a control-plane step taints nothing: its nodes carry the control-plane NoSchedule taint
    // already, and nothing of it may change before the job's etcd snapshot
    if !ts.rollout.taint_next_wave || ts.control_plane() {
        return None;
    }
    let n = ts.nodes.iter().find(|n| {
        n.wave == wave + 1
            && n.phase == NodePhase::Pending
            && n.pacing.is_none()
            && n.rollback.is_none()
    })?;
    Some(taint_command(j, si, &n.target.node, CommandOp::Taint))
}

/// The removal of the taint of a node of step `si` that is done (uncordoned, left cordoned as
/// found, or skipped).
pub(super) fn untaint_finished(j: &Job, si: usize) -> Option<Flow> {
    let ts = talos_of(j, si);
    let n = ts
        .nodes
        .iter()
        .find(|n| n.phase.finished() && n.pacing == Some(PacingTaint::Placed))?;
    Some(taint_command(j, si, &n.target.node, CommandOp::Untaint))
}

/// The nodes of a terminal job that may still carry its taint: placed, or whose taint call
/// was in flight when the job ended (step, node).
fn leftover(j: &Job) -> Option<(usize, String)> {
    if let Some(i) = &j.in_flight
        && matches!(i.action, Action::Taint { .. } | Action::Untaint { .. })
        && let Some(node) = &i.key.node
    {
        let settled = node_progress(j, i.key.step, node).is_some_and(|n| {
            matches!(
                n.pacing,
                Some(PacingTaint::Removed | PacingTaint::Left { .. })
            )
        });
        if !settled {
            return Some((i.key.step, node.clone()));
        }
    }
    j.steps
        .iter()
        .enumerate()
        .find_map(|(si, s)| match &s.kind {
            StepKind::Talos(ts) => ts
                .nodes
                .iter()
                .find(|n| n.pacing == Some(PacingTaint::Placed))
                .map(|n| (si, n.target.node.clone())),
            StepKind::Kubernetes(_) => None,
        })
}

fn node_progress<'a>(j: &'a Job, si: usize, node: &str) -> Option<&'a NodeProgress> {
    match j.steps.get(si).map(|s| &s.kind) {
        Some(StepKind::Talos(ts)) => ts
            .nodes
            .iter()
            .find(|n| n.target.node == node)
            .map(|n| n.as_ref()),
        _ => None,
    }
}

/// Whether a terminal job still has pacing taints to remove (the executor runs it until it
/// has none).
pub fn cleanup_pending(j: &Job) -> bool {
    j.state.is_terminal() && leftover(j).is_some()
}

/// A terminal job: the removal of a taint it may have left, else finished. Removal is
/// idempotent and touches only the job's own taint, so a call in flight is simply made again.
pub(super) fn cleanup(j: &Job) -> Next {
    match leftover(j) {
        Some((si, node)) => match taint_command(j, si, &node, CommandOp::Untaint) {
            Flow::Run(cmd) => Next::Run(*cmd),
            _ => Next::Finished,
        },
        None => Next::Finished,
    }
}

/// Apply the answer to a taint or untaint: a lost one stays in flight (resolved by observing
/// the node, or made again by [`cleanup`]); a definite refusal is recorded, never a halt.
pub(super) fn pacing_outcome(
    j: &mut Job,
    intent: &Intent,
    outcome: &CommandOutcome,
    notes: &mut Vec<String>,
) {
    let key = &intent.key;
    let node = key.node.clone().unwrap_or_default();
    let taint = pacing_taint(j);
    let shown = format!("{}={}:{}", taint.key, taint.value, taint.effect);
    let state = match (key.op, outcome) {
        (_, CommandOutcome::Transient { error }) => {
            if let Some(i) = j.in_flight.as_mut() {
                i.last_error = Some(error.clone());
            }
            notes.push(format!("{key}: outcome unknown ({error}); will observe"));
            return;
        }
        (CommandOp::Taint, CommandOutcome::Failed { error, .. }) => {
            notes.push(format!(
                "{node}: the apiserver refused taint {shown} ({error}); the node goes on untainted (pacing only)"
            ));
            PacingTaint::NotPlaced {
                error: error.clone(),
            }
        }
        (CommandOp::Taint, _) => {
            notes.push(format!(
                "{node}: tainted {shown} (next wave: evicted pods prefer other nodes)"
            ));
            PacingTaint::Placed
        }
        (_, CommandOutcome::Failed { error, .. }) => {
            notes.push(format!(
                "{node}: removing taint {shown} failed ({error}); it stays until removed: kubectl taint node {node} {}:{}-",
                taint.key, taint.effect
            ));
            PacingTaint::Left {
                error: error.clone(),
            }
        }
        (_, _) => {
            notes.push(format!("{node}: taint {shown} removed"));
            PacingTaint::Removed
        }
    };
    j.in_flight = None;
    if let Some(StepKind::Talos(ts)) = j.steps.get_mut(key.step).map(|s| &mut s.kind)
        && let Some(n) = ts.nodes.iter_mut().find(|n| n.target.node == node)
    {
        Arc::make_mut(n).pacing = Some(state);
    }
}

/// Whether node `n` is away because of medea (cordoned by this job, or on its way back).
fn medea_away(n: &NodeProgress) -> bool {
    n.phase.away()
        || matches!(
            n.rollback,
            Some(
                RollbackPhase::Cordoned
                    | RollbackPhase::Drained
                    | RollbackPhase::Rebooting
                    | RollbackPhase::Back
            )
        )
}

/// Before `wave` of step `si` starts (none of its nodes started): its budget, from one list
/// of the cluster's Nodes. Counted once per wave, and again while no slot is left; with no
/// slot left the wave waits until the pool's `healthTimeout` from its first count, then the
/// job halts naming the nodes.
pub(super) fn wave_budget(
    j: &mut Job,
    si: usize,
    wave: usize,
    eyes: &Eyes,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Result<(), Flow> {
    let ts = talos_of(j, si);
    let since = match &ts.budget {
        Some(b) if b.wave == wave && b.slots > 0 => return Ok(()),
        Some(b) if b.wave == wave => b.since,
        _ => now,
    };
    let deadline = add(since, ts.rollout.health_timeout);
    let nodes = need(eyes.nodes(), "the cluster's Nodes", deadline, now, None)?;
    let cap = ts.capacity();
    let unavailable: Vec<String> = ts
        .nodes
        .iter()
        .filter(|n| n.wave != wave && !medea_away(n))
        .filter_map(|n| {
            let name = &n.target.node;
            let why = match nodes.get(name) {
                None => "not in the cluster".to_string(),
                Some(k) => {
                    let mut why = Vec::new();
                    if !k.ready {
                        why.push("NotReady");
                    }
                    if k.unschedulable {
                        why.push("cordoned");
                    }
                    if why.is_empty() {
                        return None;
                    }
                    why.join(", ")
                }
            };
            Some(format!("{name} {why}"))
        })
        .collect();
    let slots = cap.saturating_sub(unavailable.len());
    let pool = ts.rollout.pool.clone();
    let text = budget_text(&pool, &unavailable, slots, cap);
    let budget = WaveBudget {
        wave,
        slots,
        unavailable: unavailable.clone(),
        since,
    };
    if talos_of(j, si).budget.as_ref() != Some(&budget) {
        if !unavailable.is_empty() {
            notes.push(format!("wave {}: {text}", wave + 1));
        }
        talos_mut(j, si).budget = Some(budget);
    }
    if slots > 0 {
        return Ok(());
    }
    Err(late(
        now,
        deadline,
        || {
            Flow::Poll(
                PollWhy::Waiting,
                format!("wave {}: {text}; waiting", wave + 1),
            )
        },
        || {
            halt_flow(
                HaltCode::PoolUnavailable,
                format!(
                    "wave {} of pool `{pool}` could not start within {}s (healthTimeout): {text}; bring the nodes back (Ready, uncordoned) and resume with a new plan",
                    wave + 1,
                    talos_of(j, si).rollout.health_timeout.as_secs()
                ),
                None,
                None,
            )
        },
    ))
}

/// "pool workers: 1 node already unavailable (w-3 NotReady); 1 of 2 slots left".
pub(super) fn budget_text(pool: &str, unavailable: &[String], slots: usize, cap: usize) -> String {
    if unavailable.is_empty() {
        return format!("pool {pool}: {slots} of {cap} slots");
    }
    format!(
        "pool {pool}: {} node{} already unavailable ({}); {slots} of {cap} slot{} left",
        unavailable.len(),
        if unavailable.len() == 1 { "" } else { "s" },
        unavailable.join(", "),
        if cap == 1 { "" } else { "s" },
    )
}

/// How many nodes of `wave` may be away at once: its budget when counted, else the step's
/// capacity.
pub(super) fn slots(ts: &TalosStep, wave: usize) -> usize {
    match &ts.budget {
        Some(b) if b.wave == wave => b.slots,
        _ => ts.capacity(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::model::DrainPolicy;
    use crate::version::TalosVersion;

    const HEALTH: Duration = Duration::from_secs(900);

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    /// Workers w1..w5 in waves [w1, w2], [w3, w4], [w5], `maxUnavailable` `max`.
    fn job(max: u32, taint: bool) -> Job {
        let v = |s| TalosVersion::parse(s).unwrap();
        let target = |n: &str| MachineTarget {
            node: n.into(),
            id: format!("id-{n}"),
            address: format!("10.0.0.{}", &n[1..]),
            from: v("v1.12.4"),
            image: None,
        };
        let rollout = TalosRollout {
            pool: "workers".into(),
            role: MachineRole::Worker,
            hop: 1,
            hops: 1,
            to: v("v1.13.9"),
            image: "factory.talos.dev/installer/x:v1.13.9".into(),
            max_unavailable: max,
            drain_timeout: Duration::from_secs(600),
            health_timeout: HEALTH,
            upgrade_attempts: 1,
            drain: DrainPolicy::default(),
            taint_next_wave: taint,
            waves: vec![
                vec![target("w1"), target("w2")],
                vec![target("w3"), target("w4")],
                vec![target("w5")],
            ],
            health: None,
            silence: None,
            hooks: None,
            stage: None,
        };
        let plan = PlanId::from_digest([7; 32]);
        Job::one_talos_step(plan, t("2026-12-06T00:00:00Z"), StepState::Pending, rollout)
    }

    /// [`job`] with wave 1's nodes checked and pulled: their cordon is next.
    fn at_cordon(max: u32, taint: bool) -> Job {
        let mut j = job(max, taint);
        let now = t("2026-12-06T00:30:00Z");
        j.steps[0].state = StepState::Running;
        for i in [0, 1] {
            node_mut(&mut j, 0, i).enter(NodePhase::Pulled, now);
        }
        j
    }

    fn kube(ready: bool, cordoned: bool, taints: Vec<NodeTaint>) -> KubeNode {
        KubeNode {
            ready,
            kubelet_version: None,
            unschedulable: cordoned,
            taints,
            cordoned_by: None,
        }
    }

    /// Every node Ready and schedulable, but `changed`.
    fn nodes(changed: &[(&str, KubeNode)]) -> Observations {
        let mut all: BTreeMap<String, KubeNode> = ["w1", "w2", "w3", "w4", "w5"]
            .iter()
            .map(|n| (n.to_string(), kube(true, false, vec![])))
            .collect();
        for (n, k) in changed {
            all.insert(n.to_string(), k.clone());
        }
        Observations {
            nodes: Some(Ok(all)),
            ..Default::default()
        }
    }

    fn command(next: &Next) -> &Command {
        match next {
            Next::Run(c) => c,
            other => panic!("expected a command, got {other:?}"),
        }
    }

    /// Run `cmd` and record `outcome` as the executor does.
    fn answer(j: &Job, cmd: &Command, outcome: CommandOutcome, now: Timestamp) -> Job {
        let intended = intend(j, cmd, now);
        complete(&intended, &cmd.key, &outcome, now).0
    }

    fn pacing_of(j: &Job, node: &str) -> Option<PacingTaint> {
        node_progress(j, 0, node).and_then(|n| n.pacing.clone())
    }

    #[test]
    fn the_next_wave_is_tainted_before_the_first_cordon() {
        let now = t("2026-12-06T01:00:00Z");
        // before a wave starts, its budget asks for the cluster's Nodes; nothing is tainted
        // before a node of it started (inside its windows)
        let first = step(&job(2, true), &Observations::default(), now);
        assert!(first.missing.nodes, "{:?}", first.missing);
        assert!(!matches!(first.next, Next::Run(_)), "{:?}", first.next);
        let mut j = at_cordon(2, true);
        for want in ["w3", "w4"] {
            let tr = step(&j, &nodes(&[]), now);
            let cmd = command(&tr.next).clone();
            let Action::Taint { node, taint } = &cmd.action else {
                panic!("{cmd:?}")
            };
            assert_eq!(node, want);
            assert_eq!(taint.key, "medea.dev/upgrade-pending");
            assert_eq!(taint.value, j.id.as_str());
            assert_eq!(taint.effect, "PreferNoSchedule");
            j = answer(&tr.job, &cmd, CommandOutcome::Done, now);
            assert_eq!(pacing_of(&j, want), Some(PacingTaint::Placed));
        }
        // then the first cordon of wave 1; w5, two waves ahead, is not tainted yet
        let tr = step(&j, &nodes(&[]), now);
        assert!(
            matches!(&tr.next, Next::Run(c) if c.key.op == CommandOp::Cordon && c.key.node.as_deref() == Some("w1")),
            "{:?}",
            tr.next
        );
        assert_eq!(pacing_of(&tr.job, "w5"), None);
    }

    #[test]
    fn a_pool_that_does_not_taint_its_next_wave_taints_nothing() {
        let now = t("2026-12-06T01:00:00Z");
        let j = at_cordon(2, false);
        let tr = step(&j, &nodes(&[]), now);
        assert!(
            matches!(&tr.next, Next::Run(c) if c.key.op == CommandOp::Cordon),
            "{:?}",
            tr.next
        );
    }

    /// Issue #48 item 7: the taint's value was the job id, `<plan>-<cluster>`: with a cluster
    /// name of more than 50 characters it was no label value, the apiserver refused the taint
    /// (`spec.taints[0].value: Invalid value: … must be no more than 63 characters`) and no
    /// node of the next wave was ever tainted.
    #[test]
    fn the_taint_value_stays_a_label_value_for_long_cluster_names() {
        let plan = PlanId::from_digest([7; 32]);
        let long = "production-eu-west-1-payments-platform-kubernetes-cluster-blue";
        let id = JobId::for_plan(&plan, long);
        assert!(id.as_str().len() > 63, "{id}");
        let value = taint_value(id.as_str());
        assert!(valid_label_value(&value), "{value}");
        assert_eq!(value.len(), 63, "{value}");
        assert!(value.starts_with(&plan.short()), "{value}");
        assert_eq!(
            value,
            taint_value(id.as_str()),
            "the same at every decision"
        );
        let other = JobId::for_plan(&plan, &format!("{long}-green"));
        assert_ne!(taint_value(other.as_str()), value, "distinct per job");
        // a short id is its own value, as before
        let short = JobId::for_plan(&plan, "prod");
        assert_eq!(taint_value(short.as_str()), short.as_str());
        // an id ending in a separator is no label value either
        let dotted = JobId::parse("abc-prod.").unwrap();
        assert!(valid_label_value(&taint_value(dotted.as_str())));
    }

    #[test]
    fn a_node_done_is_untainted_and_only_medeas_own_taint_counts() {
        let now = t("2026-12-06T01:00:00Z");
        let mut j = job(2, true);
        node_mut(&mut j, 0, 2).pacing = Some(PacingTaint::Placed);
        assert!(untaint_finished(&j, 0).is_none(), "w3 has not finished");
        node_mut(&mut j, 0, 2).enter(NodePhase::Done, now);
        let Some(Flow::Run(cmd)) = untaint_finished(&j, 0) else {
            panic!("expected the untaint of w3")
        };
        assert!(
            matches!(&cmd.action, Action::Untaint { node, taint } if node == "w3" && *taint == pacing_taint(&j)),
            "{cmd:?}"
        );
        let j = answer(&j, &cmd, CommandOutcome::Done, now);
        assert_eq!(pacing_of(&j, "w3"), Some(PacingTaint::Removed));
        assert!(untaint_finished(&j, 0).is_none());
        // a taint with medea's key but another value (another job, a person) is not medea's
        let mut other = pacing_taint(&j);
        other.value = "someone-else".into();
        assert!(!carries(&j, std::slice::from_ref(&other)));
        assert!(carries(&j, &[other, pacing_taint(&j)]));
    }

    #[test]
    fn a_lost_taint_call_is_resolved_by_the_nodes_taints() {
        let now = t("2026-12-06T01:00:00Z");
        let j = at_cordon(2, true);
        let tr = step(&j, &nodes(&[]), now);
        let cmd = command(&tr.next).clone();
        // journaled, then the process died before the outcome
        let crashed = intend(&tr.job, &cmd, now);
        let mine = pacing_taint(&j);
        // the node shows the taint: taken as placed
        let mut seen = nodes(&[]);
        seen.kube
            .insert("w3".into(), Ok(kube(true, false, vec![mine.clone()])));
        let tr = step(&crashed, &seen, now);
        assert_eq!(pacing_of(&tr.job, "w3"), Some(PacingTaint::Placed));
        assert!(tr.job.in_flight.is_none());
        // the node does not show it: made again
        let mut seen = nodes(&[]);
        seen.kube.insert("w3".into(), Ok(kube(true, false, vec![])));
        let tr = step(&crashed, &seen, now);
        assert!(
            matches!(&tr.next, Next::Run(c) if c.key.op == CommandOp::Taint && c.key.node.as_deref() == Some("w3")),
            "{:?}",
            tr.next
        );
    }

    #[test]
    fn a_job_that_is_over_removes_every_taint_it_may_have_left() {
        let now = t("2026-12-06T01:00:00Z");
        let j = at_cordon(2, true);
        let tr = step(&j, &nodes(&[]), now);
        let cmd = command(&tr.next).clone();
        let mut j = answer(&tr.job, &cmd, CommandOutcome::Done, now); // w3 placed
        let tr = step(&j, &nodes(&[]), now);
        let cmd = command(&tr.next).clone();
        j = intend(&tr.job, &cmd, now); // w4's taint in flight
        j = halt(
            &j,
            HaltReason::new(HaltCode::OperatorRequest, "halted by alice"),
            now,
        );
        assert!(cleanup_pending(&j));
        let mut removed = Vec::new();
        for _ in 0..3 {
            let tr = step(&j, &Observations::default(), now);
            assert!(tr.missing.is_empty(), "{:?}", tr.missing);
            let Next::Run(cmd) = &tr.next else {
                break;
            };
            let Action::Untaint { node, taint } = &cmd.action else {
                panic!("{cmd:?}")
            };
            assert_eq!(*taint, pacing_taint(&j));
            removed.push(node.clone());
            j = answer(&tr.job, cmd, CommandOutcome::Done, now);
        }
        assert_eq!(removed, ["w4", "w3"]);
        assert!(!cleanup_pending(&j));
        assert_eq!(step(&j, &Observations::default(), now).next, Next::Finished);
        assert!(matches!(
            &j.state,
            JobState::Halted { reason, .. } if reason.code() == HaltCode::OperatorRequest
        ));
        // a removal the apiserver refuses is recorded, not retried forever, not a halt
        let mut j2 = job(2, true);
        node_mut(&mut j2, 0, 2).pacing = Some(PacingTaint::Placed);
        j2 = halt(&j2, HaltReason::new(HaltCode::OperatorRequest, "x"), now);
        let tr = step(&j2, &Observations::default(), now);
        let cmd = command(&tr.next).clone();
        let j2 = answer(
            &tr.job,
            &cmd,
            CommandOutcome::Failed {
                error: "forbidden".into(),
                refusal: None,
            },
            now,
        );
        assert!(
            matches!(pacing_of(&j2, "w3"), Some(PacingTaint::Left { error }) if error == "forbidden")
        );
        assert!(!cleanup_pending(&j2));
    }

    /// Issue 50 item 3: a drain the pool's policy refuses halts the job with the refusal
    /// typed on the halt (a rehearsal reads it from there, never from the text).
    #[test]
    fn a_refused_drain_halts_with_its_refusal_typed() {
        use crate::rollout::ports::Refusal;
        let now = t("2026-12-06T01:00:00Z");
        let mut j = at_cordon(2, false);
        let mut drained = false;
        for _ in 0..20 {
            let tr = step(&j, &nodes(&[]), now);
            let Next::Run(cmd) = &tr.next else {
                panic!("{:?}", tr.next)
            };
            let cmd = cmd.clone();
            if cmd.key.op == CommandOp::Drain {
                j = answer(
                    &tr.job,
                    &cmd,
                    CommandOutcome::Failed {
                        error: "any words".into(),
                        refusal: Some(Refusal::UnmanagedPods),
                    },
                    now,
                );
                drained = true;
                break;
            }
            j = answer(&tr.job, &cmd, CommandOutcome::Done, now);
        }
        assert!(drained, "no drain within 20 commands");
        assert!(
            matches!(
                &j.state,
                JobState::Halted { reason, .. } if reason.code() == HaltCode::CommandFailed
                    && reason.cause() == Some(HaltCause::DrainRefused { refusal: Refusal::UnmanagedPods })
            ),
            "{:?}",
            j.state
        );
    }

    #[test]
    fn the_budget_counts_the_pools_nodes_already_unavailable() {
        let now = t("2026-12-06T01:00:00Z");
        let j = job(2, false);
        let tr = step(&j, &nodes(&[("w3", kube(false, false, vec![]))]), now);
        let Some(StepKind::Talos(ts)) = tr.job.steps.first().map(|s| &s.kind) else {
            panic!()
        };
        let b = ts.budget.as_ref().expect("counted before wave 1");
        assert_eq!((b.wave, b.slots), (0, 1));
        assert_eq!(b.unavailable, ["w3 NotReady"]);
        assert!(
            tr.notes.iter().any(|n| n
                == "wave 1: pool workers: 1 node already unavailable (w3 NotReady); 1 of 2 slots left"),
            "{:?}",
            tr.notes
        );
        assert_eq!(slots(ts, 0), 1);
        assert_eq!(slots(ts, 1), 2, "another wave counts again");
        // a node cordoned by someone else counts too; one of wave 1 does not (medea takes it)
        let tr = step(
            &j,
            &nodes(&[
                ("w4", kube(true, true, vec![])),
                ("w1", kube(false, false, vec![])),
            ]),
            now,
        );
        let Some(StepKind::Talos(ts)) = tr.job.steps.first().map(|s| &s.kind) else {
            panic!()
        };
        assert_eq!(ts.budget.as_ref().map(|b| b.slots), Some(1));
        assert_eq!(
            ts.budget.as_ref().map(|b| b.unavailable.clone()),
            Some(vec!["w4 cordoned".to_string()])
        );
    }

    #[test]
    fn a_wave_with_no_slot_left_waits_then_halts_naming_the_nodes() {
        let now = t("2026-12-06T01:00:00Z");
        let j = job(1, false);
        let down = nodes(&[("w5", kube(false, true, vec![]))]);
        let tr = step(&j, &down, now);
        assert!(
            matches!(&tr.next, Next::Poll { reason, .. } if reason.contains("0 of 1 slot left")),
            "{:?}",
            tr.next
        );
        let j = tr.job;
        let later = add(now, HEALTH - Duration::from_secs(1));
        let tr = step(&j, &down, later);
        assert!(matches!(tr.next, Next::Poll { .. }), "{:?}", tr.next);
        assert!(!tr.changed(&j), "waiting changes nothing");
        let tr = step(&j, &down, add(now, HEALTH));
        assert_eq!(tr.next, Next::Finished);
        let JobState::Halted { reason, .. } = &tr.job.state else {
            panic!("{:?}", tr.job.state)
        };
        assert_eq!(reason.code(), HaltCode::PoolUnavailable);
        assert_eq!(reason.code().as_str(), "pool_unavailable");
        assert!(
            reason.message().contains("w5 NotReady, cordoned"),
            "{reason}"
        );
        // the node back before the timeout: the wave starts with its slot
        let tr = step(&j, &nodes(&[]), later);
        assert!(!tr.missing.talos.is_empty(), "{:?}", tr.next);
        let Some(StepKind::Talos(ts)) = tr.job.steps.first().map(|s| &s.kind) else {
            panic!()
        };
        assert_eq!(slots(ts, 0), 1);
    }
}
