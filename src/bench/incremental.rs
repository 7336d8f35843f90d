//! `medea bench plan`, incremental rows: one file changed → reload + replan + render with the
//! daemon's caches ([`crate::desired::Loader`], [`crate::plan::compute::PlanMemo`]), against
//! the same work from scratch in the same round.
//!
//! Each round edits one cluster's `cluster.yaml` on disk (a new `drainTimeout`, so a new
//! revision every time), then runs the incremental pipeline and the cold one back to back
//! (alternating which goes first) and checks that both give the same plan.

use std::path::Path;
use std::time::Instant;

use super::BenchError;
use super::stats::Samples;
use crate::desired::Source;
use crate::inventory::Inventory;
use crate::plan::compute::{PlanInputs, PlanMemo, compute_memo};
use crate::plan::{self, LastApplied, render};

/// Timings of every round, in milliseconds.
#[derive(Debug, Clone, Default)]
pub struct IncrementalReport {
    /// `Loader::load` after one file changed (stat every file, read and parse the changed
    /// one, validate again the clusters its documents can affect).
    pub load: Samples,
    /// `compute_memo` (one cluster planned again).
    pub plan: Samples,
    /// `render::text`.
    pub render: Samples,
    /// load + plan + render, incremental.
    pub total: Samples,
    /// The same from scratch: `desired::load` + `plan::compute` + `render::text`.
    pub cold: Samples,
    /// Files parsed, cluster groups validated again and clusters planned in the last
    /// incremental round.
    pub parsed: usize,
    pub revalidated: usize,
    pub planned: usize,
}

impl IncrementalReport {
    /// Median of the per-round ratios incremental / cold.
    pub fn ratio(&self) -> f64 {
        self.total.ratio_to(&self.cold).median()
    }
}

fn edit(file: &Path, round: usize) -> Result<(), BenchError> {
    let io = |err| BenchError::Io {
        path: file.to_path_buf(),
        err,
    };
    let text = std::fs::read_to_string(file).map_err(io)?;
    let Some(at) = text.find("drainTimeout: ") else {
        return Err(BenchError::Invalid {
            what: format!("{} has no drainTimeout to change", file.display()),
        });
    };
    let start = at + "drainTimeout: ".len();
    let end = start + text[start..].find('\n').unwrap_or(text.len() - start);
    let new = format!("{}{}m{}", &text[..start], 20 + round, &text[end..]);
    std::fs::write(file, new).map_err(io)
}

fn invalid(what: &str) -> BenchError {
    BenchError::Invalid {
        what: what.to_string(),
    }
}

/// Run `rounds` rounds (after one warm-up round that fills the caches) over the repo at
/// `root`, editing `root/<first cluster>/cluster.yaml`.
pub fn run(
    root: &Path,
    inventory: &Inventory,
    rounds: usize,
) -> Result<IncrementalReport, BenchError> {
    let source = Source::Dir(root.to_path_buf());
    let first = inventory
        .clusters
        .keys()
        .next()
        .ok_or_else(|| invalid("the fleet has no cluster"))?;
    let file = root.join(first).join("cluster.yaml");
    let applied = LastApplied::default();
    let mut loader = crate::ops::desired_loader();
    let mut memo = PlanMemo::default();
    let mut r = IncrementalReport::default();
    let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
    let mut incremental =
        |r: &mut IncrementalReport, timed: bool| -> Result<plan::Plan, BenchError> {
            let t0 = Instant::now();
            let loaded = loader
                .load(&source)
                .map_err(|e| BenchError::Desired(Box::new(e)))?;
            let desired = loaded
                .valid()
                .ok_or_else(|| invalid("the edited desired state has errors"))?;
            let t1 = Instant::now();
            let p = compute_memo(&PlanInputs::new(desired, inventory, &applied), &mut memo)
                .map_err(|_| invalid("the edited fleet cannot be planned"))?;
            let t2 = Instant::now();
            std::hint::black_box(render::text(&p, render::Options { color: false }));
            let t3 = Instant::now();
            if timed {
                r.load.push_value(ms(t0, t1));
                r.plan.push_value(ms(t1, t2));
                r.render.push_value(ms(t2, t3));
                r.total.push_value(ms(t0, t3));
                r.parsed = loader.last_stats().parsed;
                r.revalidated = loader.last_revalidated();
                r.planned = memo.last_stats().planned;
            }
            Ok(p)
        };
    let cold = |r: &mut IncrementalReport| -> Result<plan::Plan, BenchError> {
        let t0 = Instant::now();
        let loaded =
            crate::ops::load_desired(&source).map_err(|e| BenchError::Desired(Box::new(e)))?;
        let desired = loaded
            .valid()
            .ok_or_else(|| invalid("the edited desired state has errors"))?;
        let p = plan::compute(desired, inventory, &applied, None)
            .map_err(|_| invalid("the edited fleet cannot be planned"))?;
        std::hint::black_box(render::text(&p, render::Options { color: false }));
        r.cold.push(t0.elapsed());
        Ok(p)
    };
    // Warm-up: fills the caches (a server's first pass).
    incremental(&mut r, false)?;
    for i in 0..rounds {
        edit(&file, i)?;
        let (a, b) = if i % 2 == 0 {
            let a = incremental(&mut r, true)?;
            (a, cold(&mut r)?)
        } else {
            let b = cold(&mut r)?;
            (incremental(&mut r, true)?, b)
        };
        if a != b {
            return Err(invalid("the incremental plan differs from the cold plan"));
        }
    }
    Ok(r)
}
