//! Blocking hooks (issue #35 item 2): which hook runs next, at which point, and what its
//! result does to the job. Pure.
//!
//! Points: `beforeJob` (after the job's gates, before anything is touched), `beforeWave`
//! (after a wave's gates, before its first node starts), `beforeNode` (after a node's checks
//! and pull, when it may go away, before its silence and cordon), `afterNode` (once the node
//! is back and uncordoned and its silence expired), `afterWave` (once every node of the wave
//! is done, before the wave's soak) and `afterJob` (after the last step, before the job's
//! soak). The hooks of a point run one after another, in the order written.
//!
//! Every hook has a site (`<step>/<point>/<scope>/<name>`) and a record in
//! [`Job::hook_runs`], made when it is first scheduled. The executor journals the hook's
//! intent before it runs and its result after; a hook whose intent has no result (medea
//! stopped while it ran) is run again only when it is `idempotent` (one more attempt);
//! otherwise the job halts `hook_interrupted`, naming it: medea never runs a hook twice that
//! was not declared safe to run twice. A hook that fails halts `hook_failed`, naming the hook
//! and the point; after an `afterNode` hook the node stays as it is (back and uncordoned).

use super::*;
use crate::desired::hooks::{Hook, HookPoint, Hooks};

/// Where a hook runs, before it has a site.
struct Place<'a> {
    step: usize,
    point: HookPoint,
    /// A node name, `wave-<n>` (1-based) or `job`.
    scope: String,
    pool: Option<&'a str>,
    node: Option<&'a str>,
    /// 0-based.
    wave: Option<usize>,
}

/// The site of `hook` at `place`: the key of its record in [`Job::hook_runs`].
fn site(place: &Place<'_>, hook: &Hook) -> String {
    let step = match place.point {
        HookPoint::BeforeJob | HookPoint::AfterJob => "job".to_string(),
        _ => place.step.to_string(),
    };
    format!("{step}/{}/{}/{}", place.point, place.scope, hook.name)
}

/// The Kubernetes Job name and HTTP `runId` of `site` in job `j`: stable across attempts and
/// restarts, a DNS label.
pub fn hook_run_id(job: &JobId, site: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("{job}\n{site}").as_bytes());
    format!("medea-hook-{}", &hex::encode(digest)[..16])
}

/// The command of the first hook of `hooks` at `place` that has not succeeded yet (its
/// record made when first scheduled), or `None` when all have.
fn next(j: &mut Job, hooks: &[Hook], place: Place<'_>) -> Option<Flow> {
    let (hook, site) = hooks.iter().find_map(|h| {
        let s = site(&place, h);
        let done = j.hook_runs.get(&s).is_some_and(|r| r.done.is_some());
        (!done).then_some((h, s))
    })?;
    let attempts = j
        .hook_runs
        .entry(site.clone())
        .or_insert(HookRun {
            attempts: 1,
            done: None,
        })
        .attempts;
    let run_id = hook_run_id(&j.id, &site);
    Some(Flow::Run(Box::new(Command {
        key: key(
            j,
            place.step,
            place.node,
            CommandOp::Hook,
            attempts.saturating_sub(1),
        ),
        action: Action::Hook {
            point: place.point,
            site,
            run_id,
            pool: place.pool.map(str::to_string),
            node: place.node.map(str::to_string),
            wave: place.wave.map(|w| w + 1),
            hook: Box::new(hook.clone()),
        },
    })))
}

/// The next `beforeJob` or `afterJob` hook of the job.
pub(super) fn job_hook(j: &mut Job, point: HookPoint) -> Option<Flow> {
    let hooks = j.hooks.clone()?;
    let step = match point {
        HookPoint::AfterJob => j.steps.len().saturating_sub(1),
        _ => 0,
    };
    next(
        j,
        hooks.at(point),
        Place {
            step,
            point,
            scope: "job".into(),
            pool: None,
            node: None,
            wave: None,
        },
    )
}

fn pool_hooks(j: &Job, si: usize) -> Option<Arc<TalosRollout>> {
    let ts = talos_of(j, si);
    ts.rollout.hooks.as_ref()?;
    Some(ts.rollout.clone())
}

/// The next `beforeWave` hook of wave `wave` (0-based) of step `si`.
pub(super) fn before_wave_hook(j: &mut Job, si: usize, wave: usize) -> Option<Flow> {
    let r = pool_hooks(j, si)?;
    next(
        j,
        &r.hooks.as_deref()?.before_wave,
        Place {
            step: si,
            point: HookPoint::BeforeWave,
            scope: format!("wave-{}", wave + 1),
            pool: Some(&r.pool),
            node: None,
            wave: Some(wave),
        },
    )
}

/// The next `beforeNode` hook of node `i` of step `si` (it may go away now).
pub(super) fn before_node_hook(j: &mut Job, si: usize, i: usize) -> Option<Flow> {
    let r = pool_hooks(j, si)?;
    let n = talos_of(j, si).nodes[i].clone();
    next(
        j,
        &r.hooks.as_deref()?.before_node,
        Place {
            step: si,
            point: HookPoint::BeforeNode,
            scope: n.target.node.clone(),
            pool: Some(&r.pool),
            node: Some(&n.target.node),
            wave: Some(n.wave),
        },
    )
}

/// The next `afterNode` hook of a node of step `si` that is done (upgraded and back), else
/// the next `afterWave` hook of a wave whose nodes all finished and that started (a node was
/// upgraded, or its `beforeWave` hooks ran).
pub(super) fn after_hooks(j: &mut Job, si: usize) -> Option<Flow> {
    let r = pool_hooks(j, si)?;
    let hooks: &Hooks = r.hooks.as_deref()?;
    let nodes = talos_of(j, si).nodes.clone();
    if !hooks.after_node.is_empty() {
        for n in nodes.iter().filter(|n| n.phase == NodePhase::Done) {
            let place = Place {
                step: si,
                point: HookPoint::AfterNode,
                scope: n.target.node.clone(),
                pool: Some(&r.pool),
                node: Some(&n.target.node),
                wave: Some(n.wave),
            };
            if let Some(f) = next(j, &hooks.after_node, place) {
                return Some(f);
            }
        }
    }
    if hooks.after_wave.is_empty() {
        return None;
    }
    let waves = nodes.iter().map(|n| n.wave + 1).max().unwrap_or(0);
    for w in 0..waves {
        let mut members = nodes.iter().filter(|n| n.wave == w);
        if !members.clone().all(|n| n.phase.finished()) {
            // waves finish in order: nothing after this one is done
            return None;
        }
        let before = format!("{si}/{}/wave-{}/", HookPoint::BeforeWave, w + 1);
        let started = members.any(|n| n.phase == NodePhase::Done)
            || j.hook_runs.keys().any(|k| k.starts_with(&before));
        if !started {
            continue;
        }
        let place = Place {
            step: si,
            point: HookPoint::AfterWave,
            scope: format!("wave-{}", w + 1),
            pool: Some(&r.pool),
            node: None,
            wave: Some(w),
        };
        if let Some(f) = next(j, &hooks.after_wave, place) {
            return Some(f);
        }
    }
    None
}

/// The resolution of a hook whose intent has no result: run it again only when it is
/// idempotent; otherwise halt `hook_interrupted`, naming it.
pub(super) fn hook_resolution(intent: &Intent) -> Resolution {
    let Action::Hook {
        point, node, hook, ..
    } = &intent.action
    else {
        return Resolution::Reissue;
    };
    if hook.idempotent {
        return Resolution::Reissue;
    }
    Resolution::Halt(HaltReason::new(
        HaltCode::HookInterrupted,
        format!(
            "hook `{}` at {point}{} was started (attempt {}) and medea stopped before its result was recorded; it is not idempotent, so it is not run again: check what it did, then make a new plan to continue",
            hook.name,
            where_(node.as_deref()),
            intent.key.attempt
        ),
    ))
}

fn where_(node: Option<&str>) -> String {
    node.map_or_else(String::new, |n| format!(" of node `{n}`"))
}

/// A hook's attempt counted again: an idempotent hook re-issued after its result was lost.
pub(super) fn hook_attempted(j: &mut Job) {
    // only the hook in flight has a record without a result (a failed hook halts the job)
    if let Some(r) = j.hook_runs.values_mut().find(|r| r.done.is_none()) {
        r.attempts += 1;
    }
}

/// Most characters of a log tail a journal note carries.
pub const HOOK_NOTE_LOG: usize = 2048;

/// Apply the result of a hook: its record done, or the job halted `hook_failed`.
pub(super) fn hook_outcome(
    j: &mut Job,
    intent: &Intent,
    outcome: &CommandOutcome,
    now: Timestamp,
    notes: &mut Vec<String>,
) {
    j.in_flight = None;
    let Action::Hook {
        point,
        site,
        node,
        hook,
        ..
    } = &intent.action
    else {
        return;
    };
    let report = match outcome {
        CommandOutcome::Hook { report } => report.clone(),
        CommandOutcome::Transient { error } | CommandOutcome::Failed { error, .. } => HookReport {
            succeeded: false,
            detail: error.clone(),
            exit_code: None,
            log_tail: None,
        },
        other => HookReport {
            succeeded: false,
            detail: format!("unexpected answer {other:?}"),
            exit_code: None,
            log_tail: None,
        },
    };
    let at = format!("hook `{}` at {point}{}", hook.name, where_(node.as_deref()));
    let exit = report
        .exit_code
        .map_or_else(String::new, |c| format!(" (exit code {c})"));
    if let Some(log) = &report.log_tail {
        let cut: String = {
            let chars: Vec<char> = log.chars().collect();
            chars[chars.len().saturating_sub(HOOK_NOTE_LOG)..]
                .iter()
                .collect()
        };
        notes.push(format!("{at}: log tail:\n{cut}"));
    }
    if report.succeeded {
        notes.push(format!("{at} succeeded{exit}: {}", report.detail));
        let r = j.hook_runs.entry(site.clone()).or_insert(HookRun {
            attempts: intent.key.attempt,
            done: None,
        });
        r.done = Some(format!("{}{exit}", report.detail));
        return;
    }
    let found_cordoned = match j.steps.get(intent.key.step).map(|s| &s.kind) {
        Some(StepKind::Talos(ts)) => ts
            .nodes
            .iter()
            .any(|n| Some(&n.target.node) == node.as_ref() && n.was_cordoned),
        _ => false,
    };
    let after = match point {
        HookPoint::AfterNode if found_cordoned => {
            "; the node is back and stays cordoned, as it was found before the job"
        }
        HookPoint::AfterNode => {
            "; the node is back and was uncordoned before the hook ran: it stays uncordoned"
        }
        _ => "",
    };
    let reason = HaltReason::new(
        HaltCode::HookFailed,
        format!("{at} failed{exit}: {}{after}", report.detail),
    );
    notes.push(format!("halted: {reason}"));
    j.state = JobState::Halted {
        reason,
        step: Some(intent.key.step),
        node: node.clone(),
        op: Some(CommandOp::Hook),
        at: now,
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::hooks::HookAction;
    use crate::version::TalosVersion;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn hook(name: &str, idempotent: bool) -> Hook {
        Hook {
            name: name.into(),
            timeout: Duration::from_secs(60),
            idempotent,
            action: HookAction::Http {
                url: "https://hooks.example/medea".into(),
                credential: None,
            },
        }
    }

    fn job() -> Job {
        let v = |s| TalosVersion::parse(s).unwrap();
        let target = |n: &str| MachineTarget {
            node: n.into(),
            id: format!("id-{n}"),
            address: "10.0.0.21".into(),
            from: v("v1.12.4"),
            image: None,
        };
        let rollout = TalosRollout {
            pool: "storage".into(),
            role: crate::inventory::MachineRole::Worker,
            hop: 1,
            hops: 1,
            to: v("v1.13.9"),
            image: "factory.talos.dev/installer/x:v1.13.9".into(),
            max_unavailable: 1,
            drain_timeout: Duration::from_secs(600),
            health_timeout: Duration::from_secs(900),
            upgrade_attempts: 1,
            drain: DrainPolicy::default(),
            waves: vec![vec![target("s-1")], vec![target("s-2")]],
            health: None,
            silence: None,
            hooks: Some(Box::new(Hooks {
                before_node: vec![hook("noout", false), hook("notify", true)],
                after_node: vec![hook("unset-noout", true)],
                after_wave: vec![hook("wave-done", true)],
                ..Hooks::default()
            })),
            stage: None,
            taint_next_wave: true,
        };
        let plan = PlanId::from_digest([7; 32]);
        Job {
            hooks: Some(Arc::new(Hooks {
                before_job: vec![hook("announce", false)],
                ..Hooks::default()
            })),
            ..Job::one_talos_step(plan, t("2026-12-06T00:00:00Z"), StepState::Running, rollout)
        }
    }

    fn run(f: Option<Flow>) -> Command {
        match f {
            Some(Flow::Run(c)) => *c,
            _ => panic!("expected a command"),
        }
    }

    fn intent(cmd: &Command) -> Intent {
        Intent {
            key: cmd.key.clone(),
            action: cmd.action.clone(),
            issued_at: t("2026-12-06T00:01:00Z"),
            last_error: None,
        }
    }

    fn report(succeeded: bool) -> CommandOutcome {
        CommandOutcome::Hook {
            report: HookReport {
                succeeded,
                detail: if succeeded { "HTTP 204" } else { "HTTP 503" }.into(),
                exit_code: None,
                log_tail: Some("flags noout\n".into()),
            },
        }
    }

    fn answer(j: &mut Job, cmd: &Command, outcome: CommandOutcome) -> Vec<String> {
        let mut notes = Vec::new();
        j.in_flight = Some(intent(cmd));
        hook_outcome(
            j,
            &intent(cmd),
            &outcome,
            t("2026-12-06T00:02:00Z"),
            &mut notes,
        );
        notes
    }

    #[test]
    fn a_points_hooks_run_in_order_each_once() {
        let mut j = job();
        let a = run(before_node_hook(&mut j, 0, 0));
        let Action::Hook {
            site,
            run_id,
            node,
            wave,
            pool,
            ..
        } = &a.action
        else {
            panic!("{a:?}")
        };
        assert_eq!(site, "0/beforeNode/s-1/noout");
        assert_eq!(run_id, &hook_run_id(&j.id, site));
        assert!(
            run_id.starts_with("medea-hook-") && run_id.len() == 27,
            "{run_id}"
        );
        assert_eq!(
            (node.as_deref(), *wave, pool.as_deref()),
            (Some("s-1"), Some(1), Some("storage"))
        );
        assert_eq!((a.key.op, a.key.attempt), (CommandOp::Hook, 1));
        // asked again before it ran: the same command, the same attempt
        assert_eq!(run(before_node_hook(&mut j, 0, 0)), a);
        let notes = answer(&mut j, &a, report(true));
        assert!(
            notes.iter().any(|n| n.contains("log tail:\nflags noout")),
            "{notes:?}"
        );
        assert!(j.hook_runs["0/beforeNode/s-1/noout"].done.is_some());
        let b = run(before_node_hook(&mut j, 0, 0));
        assert!(matches!(&b.action, Action::Hook { hook, .. } if hook.name == "notify"));
        answer(&mut j, &b, report(true));
        assert!(before_node_hook(&mut j, 0, 0).is_none(), "both ran");
        // the next node has hooks of its own
        assert!(before_node_hook(&mut j, 0, 1).is_some());
        // the job's hooks
        let c = run(job_hook(&mut j, HookPoint::BeforeJob));
        assert!(
            matches!(&c.action, Action::Hook { site, .. } if site == "job/beforeJob/job/announce")
        );
        assert!(job_hook(&mut j, HookPoint::AfterJob).is_none());
    }

    #[test]
    fn after_a_node_is_done_its_hooks_then_the_waves() {
        let mut j = job();
        assert!(after_hooks(&mut j, 0).is_none(), "nothing done yet");
        node_mut(&mut j, 0, 0).phase = NodePhase::Done;
        let a = run(after_hooks(&mut j, 0));
        assert!(
            matches!(&a.action, Action::Hook { site, .. } if site == "0/afterNode/s-1/unset-noout")
        );
        answer(&mut j, &a, report(true));
        let w = run(after_hooks(&mut j, 0));
        assert!(
            matches!(&w.action, Action::Hook { site, wave: Some(1), .. } if site == "0/afterWave/wave-1/wave-done")
        );
        answer(&mut j, &w, report(true));
        assert!(after_hooks(&mut j, 0).is_none(), "wave 2 has not finished");
    }

    #[test]
    fn a_lost_result_reruns_only_an_idempotent_hook() {
        let mut j = job();
        let a = run(before_node_hook(&mut j, 0, 0));
        // `noout` is not idempotent
        let Resolution::Halt(reason) = hook_resolution(&intent(&a)) else {
            panic!("a non-idempotent hook is never run twice")
        };
        assert_eq!(reason.code(), HaltCode::HookInterrupted);
        let text = reason.to_string();
        assert!(
            text.contains("`noout`") && text.contains("beforeNode") && text.contains("`s-1`"),
            "{text}"
        );
        answer(&mut j, &a, report(true));
        // `notify` is: issued again as attempt 2
        let b = run(before_node_hook(&mut j, 0, 0));
        assert!(matches!(hook_resolution(&intent(&b)), Resolution::Reissue));
        hook_attempted(&mut j);
        let again = run(before_node_hook(&mut j, 0, 0));
        assert_eq!(again.key.attempt, 2);
        assert_eq!(again.action, b.action, "the same hook, the same run id");
        assert_eq!(j.hook_runs["0/beforeNode/s-1/notify"].attempts, 2);
    }

    #[test]
    fn a_failed_hook_halts_naming_it_and_its_point() {
        let mut j = job();
        node_mut(&mut j, 0, 0).phase = NodePhase::Done;
        let a = run(after_hooks(&mut j, 0));
        answer(&mut j, &a, report(false));
        let JobState::Halted {
            reason, node, op, ..
        } = &j.state
        else {
            panic!("{:?}", j.state)
        };
        assert_eq!(reason.code(), HaltCode::HookFailed);
        assert_eq!((node.as_deref(), *op), (Some("s-1"), Some(CommandOp::Hook)));
        let text = reason.to_string();
        for part in [
            "`unset-noout`",
            "afterNode",
            "HTTP 503",
            "uncordoned",
            "stays",
        ] {
            assert!(text.contains(part), "{part} in {text}");
        }
        assert!(j.in_flight.is_none());
        // a transport failure the executor reports is a failure too
        let mut j = job();
        let b = run(before_node_hook(&mut j, 0, 0));
        answer(
            &mut j,
            &b,
            CommandOutcome::Failed {
                error: "no client".into(),
                refusal: None,
            },
        );
        assert!(
            matches!(&j.state, JobState::Halted { reason, .. } if reason.code() == HaltCode::HookFailed)
        );
    }
}
