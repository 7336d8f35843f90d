//! The pictures from a job and its journal: wave spans from the deltas, node colours, a halt's
//! marks, bar segments, well-formed SVG.

use std::sync::Arc;

use super::*;
use crate::plan::{PlanId, TalosRollout};
use crate::rollout::journal::{Entry, JobDelta, JournalEntry};
use crate::rollout::sequencer::{HaltCode, HaltReason, StepKind, TalosStep};

pub(in crate::server::ui) fn at(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

/// A running job of one Talos step: pool `workers`, waves `[w-1, w-2]` and `[w-3]`, every node
/// pending, created at `at(0)`.
pub(in crate::server::ui) fn talos_job() -> Job {
    let target = |n: &str| serde_json::json!({"node": n, "id": format!("id-{n}"), "address": "10.0.0.1", "from": "v1.12.4"});
    let rollout: TalosRollout = serde_json::from_value(serde_json::json!({
        "pool": "workers", "role": "worker", "hop": 1, "hops": 1, "to": "v1.13.9",
        "image": "factory.talos.dev/installer/x:v1.13.9", "maxUnavailable": 2,
        "drainTimeout": 300, "healthTimeout": 600,
        "waves": [[target("w-1"), target("w-2")], [target("w-3")]],
    }))
    .unwrap();
    let plan = PlanId::from_digest([7; 32]);
    Job {
        generation: 0,
        ..Job::one_talos_step(plan, at(0), StepState::Pending, rollout)
    }
}

/// Set node `i` of step 0 to `phase`.
pub(in crate::server::ui) fn set(job: &mut Job, i: usize, phase: NodePhase, since: i64) {
    let StepKind::Talos(t) = &mut job.steps[0].kind else {
        panic!("a Talos step")
    };
    let n = Arc::make_mut(&mut t.nodes[i]);
    n.phase = phase;
    n.since = Some(at(since));
}

/// The journal a job's changes would leave: one entry per change, with its delta.
pub(in crate::server::ui) struct Journal {
    pub job: Job,
    pub entries: Vec<JournalEntry>,
}

impl Journal {
    pub(in crate::server::ui) fn new(job: Job) -> Journal {
        let created = JournalEntry {
            job: job.id.clone(),
            seq: 0,
            at: job.created_at,
            generation: 0,
            entry: Entry::Created { plan: job.plan },
            notes: vec![],
            delta: None,
        };
        Journal {
            job,
            entries: vec![created],
        }
    }

    /// Change the job at `t` seconds, journaling the change.
    pub(in crate::server::ui) fn at(&mut self, t: i64, change: impl FnOnce(&mut Job)) {
        let before = self.job.clone();
        change(&mut self.job);
        self.job.generation += 1;
        let seq = self.entries.len() as u64;
        self.job.journal_seq = seq;
        self.entries.push(JournalEntry {
            job: self.job.id.clone(),
            seq,
            at: at(t),
            generation: self.job.generation,
            entry: Entry::Progress,
            notes: vec![],
            delta: JobDelta::between(&before, &self.job),
        });
    }
}

/// Wave 1 runs 100–190 s (w-1 done at 160, w-2 at 190), wave 2 runs 200–260 s.
pub(in crate::server::ui) fn finished_journal() -> Journal {
    let mut j = Journal::new(talos_job());
    j.at(100, |job| {
        job.steps[0].state = StepState::Running;
        set(job, 0, NodePhase::Checking, 100);
        set(job, 1, NodePhase::Checking, 100);
    });
    j.at(130, |job| set(job, 0, NodePhase::Rebooting, 130));
    j.at(160, |job| set(job, 0, NodePhase::Done, 160));
    j.at(190, |job| set(job, 1, NodePhase::Done, 190));
    j.at(200, |job| set(job, 2, NodePhase::Checking, 200));
    j.at(260, |job| {
        set(job, 2, NodePhase::Done, 260);
        job.steps[0].state = StepState::Done;
        job.state = JobState::Succeeded { at: at(270) };
    });
    j
}

fn talos(job: &Job) -> &TalosStep {
    match &job.steps[0].kind {
        StepKind::Talos(t) => t,
        StepKind::Kubernetes(_) => panic!("a Talos step"),
    }
}

/// Every SVG shape is closed: an unclosed `<rect>` in HTML swallows the shapes after it.
fn assert_closed(svg: &str) {
    for tag in ["rect", "text", "g", "svg", "title", "line"] {
        let open =
            svg.matches(&format!("<{tag} ")).count() + svg.matches(&format!("<{tag}>")).count();
        let close = svg.matches(&format!("</{tag}>")).count();
        assert_eq!(open, close, "<{tag}> opened {open}, closed {close}:\n{svg}");
    }
}

#[test]
fn the_journal_gives_each_wave_its_span_from_first_start_to_last_end() {
    let j = finished_journal();
    let t = Timings::of(&j.entries);
    let waves = t.waves(0, talos(&j.job));
    assert_eq!(
        waves,
        [
            Span {
                start: Some(at(100)),
                end: Some(at(190))
            },
            Span {
                start: Some(at(200)),
                end: Some(at(260))
            },
        ]
    );
    assert_eq!(
        t.step(0),
        Span {
            start: Some(at(100)),
            end: Some(at(260))
        }
    );
    assert_eq!(
        t.node(0, 0),
        Span {
            start: Some(at(100)),
            end: Some(at(160))
        }
    );
    // Folding again (a reconnect replays entries) changes nothing; so does folding in parts.
    let mut twice = t.clone();
    for e in &j.entries {
        twice.fold(e);
    }
    assert_eq!(twice, t);
    let mut parts = Timings::of(&j.entries[..3]);
    for e in &j.entries[2..] {
        parts.fold(e);
    }
    assert_eq!(parts, t);
}

#[test]
fn a_wave_under_way_has_no_end_and_the_timeline_says_so_far() {
    let mut j = finished_journal();
    j.entries.truncate(5); // up to w-2 done: wave 1 ended, wave 2 not started
    let mut job = talos_job();
    job.steps[0].state = StepState::Running;
    set(&mut job, 0, NodePhase::Done, 160);
    set(&mut job, 1, NodePhase::Rebooting, 150);
    let t = Timings::of(&j.entries[..4]); // w-2 not done yet
    let waves = t.waves(0, talos(&job));
    assert_eq!(
        waves[0],
        Span {
            start: Some(at(100)),
            end: None
        }
    );
    assert_eq!(waves[1], Span::default());
    let svg = wave_timeline(&job, &t, at(220)).into_string();
    assert_closed(&svg);
    // wave 1 runs from 100 s to now (220 s): 2m00s so far; wave 2 has not started
    assert!(
        svg.contains("workers → v1.13.9 wave 1: 2m00s so far"),
        "{svg}"
    );
    assert!(svg.contains("2m00s…"), "{svg}");
    assert!(svg.contains("not started"), "{svg}");
    assert!(svg.contains(r#"data-state="rebooting""#), "{svg}");
}

#[test]
fn the_timeline_of_a_finished_job_shows_each_waves_duration_on_the_jobs_time_axis() {
    let j = finished_journal();
    let t = Timings::of(&j.entries);
    let svg = wave_timeline(&j.job, &t, at(9_999)).into_string();
    assert_closed(&svg);
    assert!(svg.contains("workers → v1.13.9 wave 1: 1m30s"), "{svg}");
    assert!(svg.contains("workers → v1.13.9 wave 2: 1m00s"), "{svg}");
    // The axis runs from the creation to the end (270 s), not to `now`.
    assert!(svg.contains("+4m30s"), "{svg}");
    assert!(!svg.contains("so far"), "{svg}");
    // wave 1 runs 100–190 s of 270 on the 650-unit chart: x = 200 + 240 to 200 + 457
    assert!(svg.contains(r#"x="440" y="3" width="217""#), "{svg}");
}

#[test]
fn nodes_are_coloured_by_state_and_a_halt_marks_the_nodes_in_flight() {
    let mut job = talos_job();
    job.steps[0].state = StepState::Running;
    set(&mut job, 0, NodePhase::Done, 160);
    set(&mut job, 1, NodePhase::Cordoned, 150);
    set(&mut job, 2, NodePhase::Pending, 0);
    let t = Timings::default();
    let svg = node_grid(0, talos(&job), &t, &job, Some(at(200))).into_string();
    assert_closed(&svg);
    assert!(
        svg.contains(r#"data-node="w-1" data-state="back""#),
        "{svg}"
    );
    assert!(
        svg.contains(r#"data-node="w-2" data-state="draining""#),
        "{svg}"
    );
    assert!(
        svg.contains(r#"data-node="w-3" data-state="waiting""#),
        "{svg}"
    );
    assert!(svg.contains(">wave 2<"), "{svg}");
    job.state = JobState::Halted {
        reason: HaltReason::new(HaltCode::OperatorRequest, "on call said so"),
        step: Some(0),
        node: None,
        op: None,
        at: at(210),
    };
    let svg = node_grid(0, talos(&job), &t, &job, None).into_string();
    assert!(
        svg.contains(r#"data-node="w-2" data-state="halted""#),
        "{svg}"
    );
    assert!(svg.contains("stopped at drain"), "{svg}");
    // what had finished or not started stays as it was
    assert!(
        svg.contains(r#"data-node="w-1" data-state="back""#),
        "{svg}"
    );
    assert!(
        svg.contains(r#"data-node="w-3" data-state="waiting""#),
        "{svg}"
    );
}

#[test]
fn each_phase_has_one_of_the_documented_states() {
    let cases = [
        (NodePhase::Pending, "waiting"),
        (NodePhase::Checking, "preparing"),
        (NodePhase::Checked, "preparing"),
        (NodePhase::Pulled, "preparing"),
        (NodePhase::Cordoned, "draining"),
        (NodePhase::Drained, "draining"),
        (NodePhase::Upgraded, "rebooting"),
        (NodePhase::Rebooting, "rebooting"),
        (NodePhase::Back, "back"),
        (NodePhase::Done, "back"),
        (NodePhase::Skipped, "back"),
    ];
    let mut job = talos_job();
    for (phase, want) in cases {
        set(&mut job, 0, phase, 0);
        assert_eq!(node_state(&talos(&job).nodes[0], false), want, "{phase:?}");
    }
}

#[test]
fn a_progress_bar_has_a_segment_per_state_in_proportion() {
    let svg = progress_bar(
        &[Shown::Waiting, Shown::Back, Shown::Rebooting, Shown::Back],
        "2/4 nodes back",
    )
    .into_string();
    assert_closed(&svg);
    // 700 units: back 2/4, rebooting 1/4, waiting 1/4, in legend order
    assert!(
        svg.contains(r#"class="s-back" data-state="back" x="0" y="3" width="350""#),
        "{svg}"
    );
    assert!(
        svg.contains(r#"class="s-rebooting" data-state="rebooting" x="350" y="3" width="175""#),
        "{svg}"
    );
    assert!(
        svg.contains(r#"class="s-waiting" data-state="waiting" x="525" y="3" width="175""#),
        "{svg}"
    );
    assert!(svg.contains(">2/4 nodes back</text>"), "{svg}");
}

#[test]
fn node_names_are_escaped_and_long_ones_clipped_with_the_whole_name_in_the_title() {
    let mut job = talos_job();
    let StepKind::Talos(t) = &mut job.steps[0].kind else {
        panic!()
    };
    let n = Arc::make_mut(&mut t.nodes[0]);
    let mut target = (*n.target).clone();
    target.node = "<b>a-very-long-node-name-indeed".into();
    n.target = Arc::new(target);
    let svg = node_grid(0, talos(&job), &Timings::default(), &job, None).into_string();
    assert!(!svg.contains("<b>"), "{svg}");
    assert!(
        svg.contains("&lt;b&gt;a-very-long-node-name-indeed: waiting"),
        "{svg}"
    );
    assert!(svg.contains("&lt;b&gt;a-very-long-n…</text>"), "{svg}");
}

#[test]
fn kubernetes_tasks_are_a_matrix_of_task_kinds_by_node() {
    use crate::rollout::ports::Component;
    use crate::rollout::ports::NodeTarget;
    use crate::rollout::sequencer::{KubeStep, KubeTask, KubeTasks};
    let node = |n: &str| NodeTarget {
        node: n.into(),
        address: "10.0.0.1".into(),
    };
    let task = |op, n: &str, component, state| KubeTask {
        op,
        node: node(n),
        component,
        image: String::new(),
        state,
        since: None,
        attempt: 0,
        config_version: None,
    };
    let rollout: crate::plan::KubeRollout = serde_json::from_value(serde_json::json!({
        "from": "v1.34.1", "to": "v1.35.0", "controlPlane": ["cp-1"], "workers": ["w-1"],
        "healthTimeout": 600,
    }))
    .unwrap();
    let mut k = KubeStep::new(rollout, vec![node("cp-1")], vec![node("w-1")]);
    k.tasks = KubeTasks::Planned(vec![
        task(
            KubeOp::Patch,
            "cp-1",
            Some(Component::ApiServer),
            TaskState::Done,
        ),
        task(
            KubeOp::Patch,
            "cp-1",
            Some(Component::Kubelet),
            TaskState::Applied,
        ),
        task(
            KubeOp::Patch,
            "w-1",
            Some(Component::Kubelet),
            TaskState::Pending,
        ),
        task(KubeOp::Manifests, "cp-1", None, TaskState::Pending),
    ]);
    let mut job = talos_job();
    let svg = task_matrix(&k, &job).into_string();
    assert_closed(&svg);
    // three rows, two columns (named), one cell per task
    for row in [
        ">patch kube-apiserver<",
        ">patch kubelet<",
        ">manifests<",
        ">cp-1<",
        ">w-1<",
    ] {
        assert!(svg.contains(row), "{row}: {svg}");
    }
    assert_eq!(svg.matches("<rect ").count(), 4, "{svg}");
    assert!(
        svg.contains("<title>cp-1: patch kubelet: applied</title>"),
        "{svg}"
    );
    assert!(
        svg.contains("<title>w-1: patch kubelet: pending</title>"),
        "{svg}"
    );
    // row "patch kubelet" (1), column w-1 (1): x = 200 + 20, y = 70 + 20
    assert!(
        svg.contains(r#"class="s-pending" data-state="pending" x="220" y="90""#),
        "{svg}"
    );
    // a halt marks the task that was under way
    job.state = JobState::Halted {
        reason: HaltReason::new(HaltCode::ComponentNotReady, "kubelet not Ready"),
        step: Some(0),
        node: None,
        op: None,
        at: at(10),
    };
    let svg = task_matrix(&k, &job).into_string();
    assert!(
        svg.contains("<title>cp-1: patch kubelet: halted</title>"),
        "{svg}"
    );
}

#[test]
fn a_soak_after_a_wave_is_drawn_after_its_bar_with_its_duration() {
    use crate::rollout::sequencer::{GatePoint, GateProgress, GateRun};
    let soak_point = GatePoint::AfterWave { step: 0, wave: 0 };
    let run = GateRun {
        point: soak_point.clone(),
        started: at(190),
        soak_secs: 300,
        next_at: at(220),
        streaks: vec![],
    };
    let mut j = Journal::new(talos_job());
    j.at(100, |job| {
        job.steps[0].state = StepState::Running;
        set(job, 0, NodePhase::Checking, 100);
        set(job, 1, NodePhase::Checking, 100);
    });
    j.at(160, |job| set(job, 0, NodePhase::Done, 160));
    j.at(190, |job| {
        set(job, 1, NodePhase::Done, 190);
        job.gates.current = Some(run.clone());
    });
    // soaking: the soak runs until now
    let t = Timings::of(&j.entries);
    assert_eq!(
        t.soak(&soak_point),
        Some(Span {
            start: Some(at(190)),
            end: None
        })
    );
    let svg = wave_timeline(&j.job, &t, at(250)).into_string();
    assert_closed(&svg);
    assert!(svg.contains("1m30s + soak 1m00s"), "{svg}");
    assert!(
        svg.contains("soak after workers → v1.13.9 wave 1: 1m00s so far"),
        "{svg}"
    );
    j.at(490, |job| {
        job.gates = GateProgress {
            passed: vec![soak_point.clone()],
            ..GateProgress::default()
        };
    });
    let t = Timings::of(&j.entries);
    assert_eq!(
        t.soak(&soak_point),
        Some(Span {
            start: Some(at(190)),
            end: Some(at(490))
        })
    );
    let svg = wave_timeline(&j.job, &t, at(600)).into_string();
    assert!(svg.contains("1m30s + soak 5m00s"), "{svg}");
    assert!(svg.contains(r#"class="soak""#), "{svg}");
    // no soak, no soak bar
    let plain = finished_journal();
    let svg = wave_timeline(&plain.job, &Timings::of(&plain.entries), at(600)).into_string();
    assert!(!svg.contains("soak"), "{svg}");
}

/// The dashboard's states are values (issue #50 item 3): the class and `data-state` are the
/// variant's lowercase serde name, and the legend order is the variants' order, so no page
/// matches a state's text.
#[test]
fn shown_states_are_lowercase_names_of_their_variants_in_legend_order() {
    let all = [
        Shown::Back,
        Shown::Done,
        Shown::Applied,
        Shown::Preparing,
        Shown::Draining,
        Shown::Rebooting,
        Shown::Rollback,
        Shown::Halted,
        Shown::Waiting,
        Shown::Pending,
    ];
    for s in all {
        assert_eq!(
            serde_json::to_value(s).unwrap(),
            serde_json::Value::String(s.as_str().to_string())
        );
        assert_eq!(s.as_str(), format!("{s:?}").to_lowercase());
        assert_eq!(maud::html! { (s) }.into_string(), s.as_str());
    }
    assert!(all.windows(2).all(|w| w[0] < w[1]), "legend order");
    // the tally follows the variants, whatever order the states come in
    let svg = progress_bar(&[Shown::Pending, Shown::Done, Shown::Halted], "x").into_string();
    let done = svg.find("data-state=\"done\"").unwrap();
    let halted = svg.find("data-state=\"halted\"").unwrap();
    let pending = svg.find("data-state=\"pending\"").unwrap();
    assert!(done < halted && halted < pending, "{svg}");
}
