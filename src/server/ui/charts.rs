//! The rollout pictures, as server-rendered SVG (no script, no external asset, colours from
//! the stylesheet's classes): a grid of nodes per pool coloured by state, a progress bar per
//! step, a matrix of a Kubernetes step's tasks, and a timeline of the waves with their
//! durations.
//!
//! The wave timings come from the job's journal: every entry after the creation carries the
//! [`JobDelta`](crate::rollout::journal::JobDelta) it made, so [`Timings::fold`] sees when each
//! node left `pending` and when it finished. The page folds the whole journal once; the live
//! stream folds each new entry as it sends it.
//!
//! SVG elements are always written with a closing tag (`rect {}`): in an HTML document a
//! `<rect>` without one stays open and swallows its siblings.

use std::collections::BTreeMap;

use jiff::Timestamp;
use maud::{Markup, html};

use super::pages::elapsed;
use crate::rollout::journal::JournalEntry;
use crate::rollout::sequencer::{
    GatePoint, Job, JobState, KubeOp, KubeStep, NodePhase, NodeProgress, RollbackPhase, StepState,
    TalosStep, TaskState,
};

/// Width of every picture's view box; the stylesheet scales it to the page (`width: 100%`).
const WIDTH: i64 = 1000;

/// When something started and finished (`None`: not yet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Span {
    pub start: Option<Timestamp>,
    pub end: Option<Timestamp>,
}

impl Span {
    fn began(&mut self, at: Timestamp) {
        if self.start.is_none() {
            self.start = Some(at);
        }
    }
    fn finished(&mut self, at: Timestamp) {
        if self.end.is_none() {
            self.end = Some(at);
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct StepTimes {
    span: Span,
    /// Talos steps: by node index in the step.
    nodes: BTreeMap<usize, Span>,
}

/// When each step and each node of a job started and finished, read from its journal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Timings {
    steps: BTreeMap<usize, StepTimes>,
    /// Soaks after a wave or a step, by gate point name (`after-wave:1:2`): from the start of
    /// the point's gate run to the entry that records it passed.
    soaks: BTreeMap<String, Span>,
    /// The sequence number of the last entry folded.
    pub last: Option<u64>,
}

/// A node is done with the job: finished its phases and any rollback.
fn node_finished(n: &NodeProgress) -> bool {
    match n.rollback {
        Some(r) => r == RollbackPhase::Done,
        None => n.phase.finished(),
    }
}

impl Timings {
    /// The timings of a job's journal, entries in sequence order.
    pub fn of<'a>(entries: impl IntoIterator<Item = &'a JournalEntry>) -> Timings {
        let mut t = Timings::default();
        for e in entries {
            t.fold(e);
        }
        t
    }

    /// Take one more journal entry into account (entries older than the last folded one are
    /// ignored, so a replayed entry counts once).
    pub fn fold(&mut self, e: &JournalEntry) {
        if self.last.is_some_and(|last| e.seq <= last) {
            return;
        }
        self.last = Some(e.seq);
        let Some(delta) = &e.delta else { return };
        if let Some(g) = &delta.gates {
            if let Some(run) = &g.current
                && run.soak_secs > 0
                && matches!(
                    run.point,
                    GatePoint::AfterWave { .. } | GatePoint::AfterStep { .. }
                )
            {
                self.soaks
                    .entry(run.point.name())
                    .or_default()
                    .began(run.started);
            }
            for p in &g.passed {
                if let Some(span) = self.soaks.get_mut(&p.name()) {
                    span.finished(e.at);
                }
            }
        }
        for d in &delta.steps {
            let step = self.steps.entry(d.index).or_default();
            if d.state != StepState::Pending {
                step.span.began(e.at);
            }
            if d.state == StepState::Done {
                step.span.finished(e.at);
            }
            for (i, n) in &d.nodes {
                let span = step.nodes.entry(*i).or_default();
                if n.phase != NodePhase::Pending || n.rollback.is_some() {
                    span.began(e.at);
                }
                if node_finished(n) {
                    span.finished(e.at);
                } else {
                    // A rollback reopens a node that had finished.
                    span.end = None;
                }
            }
        }
    }

    /// A step's span.
    pub fn step(&self, step: usize) -> Span {
        self.steps.get(&step).map(|s| s.span).unwrap_or_default()
    }

    /// The span of each wave of a Talos step: from its first node's start to its last node's
    /// end (open while any node of it is unfinished).
    pub fn waves(&self, step: usize, t: &TalosStep) -> Vec<Span> {
        let times = self.steps.get(&step);
        let mut waves: Vec<(Span, bool)> = vec![(Span::default(), true); t.rollout.waves.len()];
        for (i, n) in t.nodes.iter().enumerate() {
            let Some((wave, all_done)) = waves.get_mut(n.wave) else {
                continue;
            };
            let span = times
                .and_then(|s| s.nodes.get(&i))
                .copied()
                .unwrap_or_default();
            if let Some(s) = span.start {
                wave.start = Some(wave.start.map_or(s, |w| w.min(s)));
            }
            match span.end {
                Some(e) if node_finished(n) => wave.end = Some(wave.end.map_or(e, |w| w.max(e))),
                // Finished without a recorded end (a journal from before deltas): no duration.
                _ if node_finished(n) => {}
                _ => *all_done = false,
            }
        }
        waves
            .into_iter()
            .map(|(s, done)| Span {
                start: s.start,
                end: if done { s.end } else { None },
            })
            .collect()
    }

    /// The soak at a gate point (after a wave or a step), if it had one.
    pub fn soak(&self, point: &GatePoint) -> Option<Span> {
        self.soaks.get(&point.name()).copied()
    }

    /// A node's span, by its index in a Talos step.
    pub fn node(&self, step: usize, index: usize) -> Span {
        self.steps
            .get(&step)
            .and_then(|s| s.nodes.get(&index))
            .copied()
            .unwrap_or_default()
    }
}

/// The state a node, a Kubernetes task or a wave is shown in: one colour each. Its lowercase
/// name (serde, [`Shown::as_str`]) is the stylesheet's class (`s-back`) and the `data-state`
/// attribute; the variants' order is the legend's. Pages and charts match the variant, never
/// the name (issue #50 item 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Shown {
    /// A node on the target (back, done, or skipped: it already ran it); a finished wave.
    Back,
    /// A Kubernetes task done.
    Done,
    /// A Kubernetes task applied, not yet confirmed.
    Applied,
    /// A node in its checks and image pull, still serving.
    Preparing,
    /// A node cordoned and drained.
    Draining,
    /// A node installing, rebooting, coming back; a running wave.
    Rebooting,
    /// A node being rolled back, or rolled back.
    Rollback,
    /// In flight when the job halted.
    Halted,
    /// A node or wave not started.
    Waiting,
    /// A Kubernetes task not started.
    Pending,
}

impl Shown {
    /// The lowercase name: the class suffix and `data-state` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Shown::Back => "back",
            Shown::Done => "done",
            Shown::Applied => "applied",
            Shown::Preparing => "preparing",
            Shown::Draining => "draining",
            Shown::Rebooting => "rebooting",
            Shown::Rollback => "rollback",
            Shown::Halted => "halted",
            Shown::Waiting => "waiting",
            Shown::Pending => "pending",
        }
    }
}

impl std::fmt::Display for Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl maud::Render for Shown {
    fn render_to(&self, buffer: &mut String) {
        buffer.push_str(self.as_str());
    }
}

impl PartialEq<&str> for Shown {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// The state a node is shown in, one colour each: `waiting` (not started), `preparing`
/// (checks and the image pull, still serving), `draining` (cordoned, drained), `rebooting`
/// (installing, rebooting, coming back), `back` (on the target: back, done, or skipped
/// because it already ran it), `halted` (in flight when the job halted), `rollback`.
pub fn node_state(n: &NodeProgress, job_halted: bool) -> Shown {
    if let Some(r) = n.rollback {
        return if r == RollbackPhase::Done || !job_halted {
            Shown::Rollback
        } else {
            Shown::Halted
        };
    }
    let state = match n.phase {
        NodePhase::Pending => Shown::Waiting,
        NodePhase::Checking | NodePhase::Checked | NodePhase::Pulled => Shown::Preparing,
        NodePhase::Cordoned | NodePhase::Drained | NodePhase::Detached => Shown::Draining,
        NodePhase::Upgraded | NodePhase::Rebooting => Shown::Rebooting,
        NodePhase::Back | NodePhase::Done | NodePhase::Skipped => Shown::Back,
    };
    if job_halted && !matches!(state, Shown::Waiting | Shown::Back) {
        Shown::Halted
    } else {
        state
    }
}

/// What a node is doing, from its phase: the command that comes next.
pub fn activity(p: NodePhase) -> &'static str {
    match p {
        NodePhase::Pending => "waiting",
        NodePhase::Checking => "checks",
        NodePhase::Checked => "pull",
        NodePhase::Pulled => "cordon",
        NodePhase::Cordoned => "drain",
        NodePhase::Drained => "volume detach",
        NodePhase::Detached => "upgrade",
        NodePhase::Upgraded => "reboot",
        NodePhase::Rebooting => "verify",
        NodePhase::Back => "uncordon",
        NodePhase::Done => "done",
        NodePhase::Skipped => "skipped",
    }
}

fn rollback_word(r: RollbackPhase) -> &'static str {
    match r {
        RollbackPhase::Pending => "rollback: cordon",
        RollbackPhase::Cordoned => "rollback: drain",
        RollbackPhase::Drained => "rollback: call",
        RollbackPhase::Rebooting => "rollback: reboot",
        RollbackPhase::Back => "rollback: uncordon",
        RollbackPhase::Done => "rolled back",
    }
}

/// The line under a node's name: what comes next, or where it stopped.
fn node_label(n: &NodeProgress, state: Shown) -> String {
    let what = n.rollback.map_or(activity(n.phase), rollback_word);
    if state == Shown::Halted {
        format!("stopped at {what}")
    } else {
        what.to_string()
    }
}

/// Counts of the states of `states`, in legend order (the order of [`Shown`]'s variants).
fn tally(states: impl IntoIterator<Item = Shown>) -> Vec<(Shown, usize)> {
    let mut counts: BTreeMap<Shown, usize> = BTreeMap::new();
    for s in states {
        *counts.entry(s).or_default() += 1;
    }
    counts.into_iter().collect()
}

/// A progress bar: one segment per state, in legend order, and `label` to its right.
pub fn progress_bar(states: &[Shown], label: &str) -> Markup {
    let total = states.len().max(1) as i64;
    let bar = 700;
    let mut x = 0;
    let segments: Vec<(Shown, usize, i64, i64)> = tally(states.iter().copied())
        .into_iter()
        .map(|(s, n)| {
            let w = bar * n as i64 / total;
            let seg = (s, n, x, w);
            x += w;
            seg
        })
        .collect();
    html! {
        svg.progress width=(WIDTH) viewBox={ "0 0 " (WIDTH) " 22" } role="img" aria-label=(label) {
            title { (label) }
            rect.track x="0" y="3" width=(bar) height="16" rx="3" {}
            @for (s, n, x, w) in &segments {
                rect class={ "s-" (s) } data-state=(s) x=(x) y="3" width=(w) height="16" { title { (n) " " (s) } }
            }
            text x=(bar + 12) y="16" { (label) }
        }
    }
}

/// A compact bar (the rollouts list, the overview): the share of `done` in `total`, red when
/// the job halted.
pub fn mini_bar(done: usize, total: usize, state: &JobState) -> Markup {
    let w = (100 * done).checked_div(total).unwrap_or(0) as i64;
    let fill = match state {
        JobState::Halted { .. } => "s-halted",
        JobState::Succeeded { .. } => "s-back",
        JobState::Running => "s-rebooting",
    };
    html! {
        svg.mini viewBox="0 0 100 10" role="img" aria-label={ (done) " of " (total) " done" } {
            title { (done) " of " (total) " done" }
            rect.track x="0" y="0" width="100" height="10" rx="2" {}
            rect class=(fill) x="0" y="0" width=(w) height="10" rx="2" {}
        }
    }
}

/// Tiles per row of the node grid.
const TILES: i64 = 7;
const TILE_W: i64 = 128;
const TILE_H: i64 = 40;
const GAP: i64 = 6;
const LABEL: i64 = 66;

/// A Talos step's nodes: one row per wave (wrapping after [`TILES`]), each node a tile
/// coloured by its state, with its name and what comes next (or where it stopped).
pub fn node_grid(
    step: usize,
    t: &TalosStep,
    timings: &Timings,
    job: &Job,
    now: Option<Timestamp>,
) -> Markup {
    let halted = matches!(job.state, JobState::Halted { .. });
    let mut waves: BTreeMap<usize, Vec<(usize, &NodeProgress)>> = BTreeMap::new();
    for (i, n) in t.nodes.iter().enumerate() {
        waves.entry(n.wave).or_default().push((i, n.as_ref()));
    }
    // Rows: (wave label or none, nodes of the row by their index in the step).
    type Row<'a> = (Option<usize>, Vec<(usize, &'a NodeProgress)>);
    let mut rows: Vec<Row> = Vec::new();
    for (w, nodes) in waves {
        for (k, chunk) in nodes.chunks(TILES as usize).enumerate() {
            rows.push(((k == 0).then_some(w), chunk.to_vec()));
        }
    }
    let height = rows.len() as i64 * (TILE_H + GAP);
    // As wide as its widest row: a small pool keeps its size on a phone.
    let cols = rows.iter().map(|(_, n)| n.len() as i64).max().unwrap_or(1);
    let width = LABEL + cols * (TILE_W + GAP);
    html! {
        svg.grid width=(width) viewBox={ "0 0 " (width) " " (height) } role="img" aria-label={ "nodes of pool " (t.rollout.pool) " by wave" } data-pool=(t.rollout.pool) {
            @for (r, (wave, nodes)) in rows.iter().enumerate() {
                @let y = r as i64 * (TILE_H + GAP);
                @if let Some(w) = wave { text.wave x="0" y=(y + 25) { "wave " (w + 1) } }
                @for (c, (i, n)) in nodes.iter().enumerate() {
                    @let x = LABEL + c as i64 * (TILE_W + GAP);
                    @let state = node_state(n, halted);
                    @let label = node_label(n, state);
                    @let span = timings.node(step, *i);
                    // Elapsed time of a node under way: from its start, ticking only while the job runs.
                    @let clock = match (span.start, span.end, now) {
                        (Some(s), None, Some(now)) if !matches!(state, Shown::Waiting | Shown::Back) => format!(" {}", elapsed(now.as_second() - s.as_second())),
                        (Some(s), Some(e), _) if state == Shown::Back => format!(" in {}", elapsed(e.as_second() - s.as_second())),
                        _ => String::new(),
                    };
                    g.node data-node=(n.target.node) data-state=(state) {
                        title { (n.target.node) ": " (state) " (" (label) ")" (clock) }
                        rect class={ "s-" (state) } x=(x) y=(y) width=(TILE_W) height=(TILE_H) rx="4" {}
                        text.name x=(x + 8) y=(y + 16) { (clip(&n.target.node, 17)) }
                        text.act x=(x + 8) y=(y + 32) { (label) (clock) }
                    }
                }
            }
        }
    }
}

/// `s` cut to `n` characters, with an ellipsis when cut (the tile's title has it whole).
fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut c: String = s.chars().take(n - 1).collect();
        c.push('…');
        c
    }
}

/// The state a Kubernetes task is shown in.
pub fn task_state(s: TaskState, job_halted: bool) -> Shown {
    match s {
        TaskState::Pending => Shown::Pending,
        TaskState::Applied if job_halted => Shown::Halted,
        TaskState::Applied => Shown::Applied,
        TaskState::Done => Shown::Done,
    }
}

fn op_name(op: KubeOp) -> &'static str {
    match op {
        KubeOp::Pull => "pull",
        KubeOp::Patch => "patch",
        KubeOp::Manifests => "manifests",
    }
}

/// A Kubernetes step's tasks as a matrix: one row per task kind (`pull kube-apiserver`, …),
/// one column per node, one cell per task coloured by its state.
pub fn task_matrix(k: &KubeStep, job: &Job) -> Markup {
    let halted = matches!(job.state, JobState::Halted { .. });
    let tasks = k.tasks.list();
    let mut rows: Vec<String> = Vec::new();
    let mut cols: Vec<&str> = Vec::new();
    for t in tasks {
        let row = match t.component {
            Some(c) => format!("{} {}", op_name(t.op), c.name()),
            None => op_name(t.op).to_string(),
        };
        if !rows.contains(&row) {
            rows.push(row);
        }
        if !cols.contains(&t.node.node.as_str()) {
            cols.push(&t.node.node);
        }
    }
    let label = 200;
    let cell = 20;
    // Node names above their columns, slanted.
    let head = 70;
    let width = label + cols.len() as i64 * cell + 40;
    let height = head + rows.len() as i64 * cell + 4;
    html! {
        svg.tasks width=(width) viewBox={ "0 0 " (width) " " (height) } role="img" aria-label="Kubernetes tasks by node" {
            @for (c, node) in cols.iter().enumerate() {
                @let x = label + c as i64 * cell + 12;
                text.wave x=(x) y=(head - 6) transform={ "rotate(-50 " (x) " " (head - 6) ")" } { (clip(node, 12)) }
            }
            @for (r, row) in rows.iter().enumerate() {
                text x="0" y=(head + r as i64 * cell + 13) { (row) }
            }
            @for t in tasks {
                @let row = match t.component { Some(c) => format!("{} {}", op_name(t.op), c.name()), None => op_name(t.op).to_string() };
                @let r = rows.iter().position(|x| *x == row).unwrap_or(0) as i64;
                @let c = cols.iter().position(|x| *x == t.node.node).unwrap_or(0) as i64;
                @let state = task_state(t.state, halted);
                rect class={ "s-" (state) } data-state=(state) x=(label + c * cell) y=(head + r * cell) width=(cell - 4) height=(cell - 4) rx="2" {
                    title { (t.node.node) ": " (row) ": " (state) }
                }
            }
        }
    }
}

/// One row of the wave timeline.
pub struct Row {
    pub label: String,
    pub span: Span,
    /// The health gates' soak after it, when it had one.
    pub soak: Option<Span>,
    /// The row's state class (`back` when finished, `halted`, the running colour, `waiting`).
    pub state: Shown,
}

/// The rows of a job's timeline: every wave of every Talos step, and every Kubernetes step.
pub fn timeline_rows(job: &Job, timings: &Timings) -> Vec<Row> {
    use crate::rollout::sequencer::StepKind;
    let halted = matches!(job.state, JobState::Halted { .. });
    let mut rows = Vec::new();
    for (i, step) in job.steps.iter().enumerate() {
        let state_of = |span: &Span| match (span.start, span.end) {
            (_, Some(_)) => Shown::Back,
            (Some(_), None) if halted => Shown::Halted,
            (Some(_), None) => Shown::Rebooting,
            (None, _) => Shown::Waiting,
        };
        match &step.kind {
            StepKind::Talos(t) => {
                for (w, span) in timings.waves(i, t).into_iter().enumerate() {
                    rows.push(Row {
                        // the hop's target too: a two-hop job moves a pool twice (issue #52)
                        label: format!("{} → {} wave {}", t.rollout.pool, t.rollout.to, w + 1),
                        state: state_of(&span),
                        soak: timings.soak(&GatePoint::AfterWave { step: i, wave: w }),
                        span,
                    });
                }
            }
            StepKind::Kubernetes(k) => {
                let span = timings.step(i);
                rows.push(Row {
                    label: format!("Kubernetes {}", k.rollout.to),
                    state: state_of(&span),
                    soak: timings.soak(&GatePoint::AfterStep { step: i }),
                    span,
                });
            }
        }
    }
    rows
}

/// The waves on a time axis from the job's creation to its end (or `now` while it runs): a
/// bar per wave from its first node's start to its last node's end, labelled with the
/// duration.
pub fn wave_timeline(job: &Job, timings: &Timings, now: Timestamp) -> Markup {
    let rows = timeline_rows(job, timings);
    let t0 = job.created_at;
    let t1 = match &job.state {
        JobState::Running => now,
        JobState::Halted { at, .. } | JobState::Succeeded { at } => *at,
    };
    let total = (t1.as_second() - t0.as_second()).max(1);
    let label = 200;
    // Room on the right for the last bar's label (`1m30s + soak 5m00s`).
    let chart = WIDTH - label - 150;
    let x_of =
        |t: Timestamp| label + chart * (t.as_second() - t0.as_second()).clamp(0, total) / total;
    let row_h = 22;
    let height = rows.len() as i64 * row_h + 26;
    html! {
        svg.timeline width=(WIDTH) viewBox={ "0 0 " (WIDTH) " " (height) } role="img" aria-label="waves over time" {
            @for (r, row) in rows.iter().enumerate() {
                @let y = r as i64 * row_h;
                g.wave data-state=(row.state) {
                    text x="0" y=(y + 15) { (row.label) }
                    @if let Some(s) = row.span.start {
                        @let e = row.span.end.unwrap_or(t1);
                        @let x = x_of(s);
                        @let w = (x_of(e) - x).max(3);
                        @let d = elapsed(e.as_second() - s.as_second());
                        rect class={ "s-" (row.state) } x=(x) y=(y + 3) width=(w) height="15" rx="2" {
                            title { (row.label) ": " (d) @if row.span.end.is_none() { @if row.state == Shown::Halted { " until the halt" } @else { " so far" } } }
                        }
                        // The soak after it: a lighter bar from the gate run's start.
                        @let soak = row.soak.and_then(|k| k.start.map(|ks| (ks, k.end)));
                        @let soak_end = soak.map(|(ks, ke)| (ks, ke.unwrap_or(t1)));
                        @let right = soak_end.map_or(x + w, |(ks, ke)| x_of(ke).max(x_of(ks) + 3));
                        @if let Some((ks, ke)) = soak_end {
                            @let sx = x_of(ks).max(x + w);
                            rect.soak x=(sx) y=(y + 6) width=((right - sx).max(3)) height="9" rx="2" {
                                title { "soak after " (row.label) ": " (elapsed(ke.as_second() - ks.as_second())) @if soak.is_some_and(|(_, e)| e.is_none()) { " so far" } }
                            }
                        }
                        text.dur x=(right + 6) y=(y + 15) {
                            (d) @if row.span.end.is_none() && row.state != Shown::Halted { "…" }
                            @if let Some((ks, ke)) = soak_end { " + soak " (elapsed(ke.as_second() - ks.as_second())) }
                        }
                    } @else {
                        text.dur x=(label) y=(y + 15) { @if matches!(job.state, JobState::Halted { .. }) { "not reached (halted before)" } @else { "not started" } }
                    }
                }
            }
            @let axis = rows.len() as i64 * row_h + 4;
            line x1=(label) y1=(axis) x2=(label + chart) y2=(axis) {}
            @for k in 0..=4i64 {
                @let x = label + chart * k / 4;
                line x1=(x) y1=(axis) x2=(x) y2=(axis + 5) {}
                text.tick x=(x) y=(axis + 18) { "+" (elapsed(total * k / 4)) }
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests;
