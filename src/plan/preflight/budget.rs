//! A pool whose waves find every slot taken before the job starts (issue #51 item 7). A wave
//! starts only while fewer than `maxUnavailable` of its step's other nodes are unavailable
//! (NotReady or cordoned: the sequencer's `wave_budget`, which counts the same nodes
//! at run time); a node cordoned by someone else is left cordoned after its own wave, so it
//! keeps its slot for every wave after it. When a wave would find no slot, the job would wait
//! `healthTimeout` at that wave and halt `pool_unavailable`: the plan says so before approval.

use super::{Finding, Severity, checks, dur};
use crate::inventory::{MachineRole, ObservedCluster};
use crate::plan::model::{ClusterPlan, Step, TalosRollout};
use crate::plan::note::{Away, Note};

/// What a step's budget looks like at its tightest wave: the blocking finding when a wave has
/// no slot, and a line for the plan's notes whenever a wave counts an unavailable node.
pub(super) fn check(obs: &ObservedCluster, plan: &ClusterPlan) -> (Vec<Finding>, Vec<Note>) {
    let mut found = Vec::new();
    let mut notes = Vec::new();
    for step in &plan.steps {
        let Step::Talos(t) = step else { continue };
        let cap = capacity(t);
        // the wave with the fewest slots (the first of them)
        let tightest = (0..t.waves.len())
            .map(|w| (w, unavailable(obs, t, w)))
            .min_by_key(|(w, u)| (cap.saturating_sub(u.len()), *w));
        let Some((wave, away)) = tightest else {
            continue;
        };
        if away.is_empty() {
            continue;
        }
        let slots = cap.saturating_sub(away.len());
        let names: Vec<String> = away.iter().map(|(n, why)| format!("{n} {why}")).collect();
        notes.push(Note::BudgetUnavailable {
            pool: t.pool.clone(),
            to: t.to.to_string(),
            wave: u32::try_from(wave + 1).unwrap_or(u32::MAX),
            machines: away
                .iter()
                .map(|(n, why)| Away {
                    node: n.to_string(),
                    why: why.to_string(),
                })
                .collect(),
            slots: u32::try_from(slots).unwrap_or(u32::MAX),
            capacity: u32::try_from(cap).unwrap_or(u32::MAX),
        });
        if slots > 0 {
            continue;
        }
        found.push(Finding::new(
            format!("budget/{}/{}", t.pool, t.to),
            checks::BUDGET,
            Severity::Blocking,
            format!(
                "pool {} cannot start wave {} of its Talos {} hop: its {cap} slot{} (maxUnavailable) {} taken by nodes already unavailable ({}); the job would wait healthTimeout ({}) there and halt pool_unavailable",
                t.pool,
                wave + 1,
                t.to,
                if cap == 1 { "" } else { "s" },
                if cap == 1 { "is" } else { "are" },
                names.join(", "),
                dur(t.health_timeout),
            ),
            away
                .iter()
                .map(|(n, why)| format!("node {n}: {why}"))
                .collect(),
            if t.role == MachineRole::Controlplane {
                "bring the control-plane nodes back (Ready, uncordoned: `kubectl uncordon`) and refresh, or acknowledge this finding to let the job wait for them".to_string()
            } else {
                "uncordon the nodes (`kubectl uncordon`) or bring them back Ready and refresh, raise the pool's `rollout.maxUnavailable`, or acknowledge this finding to let the job wait for them".to_string()
            },
        ));
    }
    (found, notes)
}

/// Nodes that may be away at once: `maxUnavailable`, and always 1 for the control plane (as
/// the job's step counts it).
fn capacity(t: &TalosRollout) -> usize {
    if t.role == MachineRole::Controlplane {
        1
    } else {
        t.max_unavailable.max(1) as usize
    }
}

/// The nodes of `t` outside wave `w` that will be unavailable when `w` starts, with why: a
/// later wave's node unavailable now (nothing medea does brings it back before its turn), an
/// earlier wave's node cordoned now (cordoned by someone else: medea leaves it cordoned).
fn unavailable(obs: &ObservedCluster, t: &TalosRollout, w: usize) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (v, members) in t.waves.iter().enumerate() {
        if v == w {
            continue;
        }
        for m in members {
            let Some(o) = obs.machines.get(&m.node) else {
                continue;
            };
            let why = if v > w {
                let mut why = Vec::new();
                if !o.ready {
                    why.push("NotReady");
                }
                if o.cordoned {
                    why.push("cordoned by someone else");
                }
                why.join(", ")
            } else if o.cordoned {
                "cordoned by someone else (medea leaves it cordoned after its wave)".to_string()
            } else {
                String::new()
            };
            if !why.is_empty() {
                out.push((m.node.clone(), why));
            }
        }
    }
    out
}
