//! `medea bench plan`: load + validate + plan + render of a generated fleet, against the parse
//! floor — the time to merely read and parse the same YAML files — measured in the same run.
//!
//! Each round runs the floor and the pipeline back to back (alternating which goes first), so
//! the ratio of each round compares runs under the same machine load.

use std::path::Path;
use std::time::Instant;

use super::BenchError;
use super::stats::Samples;
use crate::desired::{self, Source};
use crate::inventory::Inventory;
use crate::plan::{self, LastApplied, render};

/// Timings of every round, in milliseconds.
#[derive(Debug, Clone, Default)]
pub struct PipelineReport {
    pub machines: usize,
    pub clusters: usize,
    pub files: usize,
    pub bytes: usize,
    /// Read every file, parse every YAML document once into a generic tree.
    pub floor: Samples,
    /// Read every file, parse every document with no tree at all (syntax only).
    pub syntax: Samples,
    /// `ops::load_desired` (read, parse on up to `desired::incremental::PARSE_THREADS`
    /// threads, validate): what `medea plan` and the daemon run.
    pub load: Samples,
    /// `desired::load`: the same load on the calling thread only.
    pub load_single: Samples,
    /// `plan::compute` on the calling thread only.
    pub plan_single: Samples,
    /// load + plan + render with the load and the plan on the calling thread only.
    pub total_single: Samples,
    /// Planning with `ops::cold_plan_memo` (the sections on every core, as `medea plan`).
    pub plan: Samples,
    /// `plan::render::text`.
    pub render: Samples,
    /// load + plan + render.
    pub total: Samples,
    /// `plan::render::json` (reported, not part of the total).
    pub json: Samples,
    pub waves: usize,
    pub rendered_bytes: usize,
}

impl PipelineReport {
    /// Median of the per-round ratios total / floor.
    pub fn ratio(&self) -> f64 {
        self.total.ratio_to(&self.floor).median()
    }
    pub fn ratio_syntax(&self) -> f64 {
        self.total.ratio_to(&self.syntax).median()
    }
    /// Median of the per-round ratios total / floor with the load on one thread (the floor is
    /// single-threaded).
    pub fn ratio_single(&self) -> f64 {
        self.total_single.ratio_to(&self.floor).median()
    }
}

/// What the floor does: the same reader as `desired::load`, then one parse per document.
fn parse_floor(root: &Path, tree: bool) -> Result<usize, BenchError> {
    let snapshot = desired::source::read(&Source::Dir(root.to_path_buf()))
        .map_err(|e| BenchError::Desired(Box::new(e)))?;
    let mut docs = 0;
    for f in &snapshot.files {
        let text = std::str::from_utf8(&f.bytes).map_err(|_| BenchError::Invalid {
            what: format!("{} is not UTF-8", f.path),
        })?;
        docs += if tree {
            serde_saphyr::from_multiple::<serde_json::Value>(text)
                .map_err(|e| BenchError::Invalid {
                    what: format!("{}: {e}", f.path),
                })?
                .len()
        } else {
            serde_saphyr::from_multiple::<serde::de::IgnoredAny>(text)
                .map_err(|e| BenchError::Invalid {
                    what: format!("{}: {e}", f.path),
                })?
                .len()
        };
    }
    Ok(docs)
}

struct Round {
    load: f64,
    plan: f64,
    render: f64,
    total: f64,
    json: f64,
    waves: usize,
    rendered: usize,
}

/// One cold pipeline; `single`: parse and plan on the calling thread only.
fn pipeline(root: &Path, inventory: &Inventory, single: bool) -> Result<Round, BenchError> {
    let t0 = Instant::now();
    let source = Source::Dir(root.to_path_buf());
    let loaded = if single {
        desired::load(&source)
    } else {
        crate::ops::load_desired(&source)
    }
    .map_err(|e| BenchError::Desired(Box::new(e)))?;
    let Some(desired) = loaded.valid() else {
        return Err(BenchError::Invalid {
            what: format!(
                "the generated desired state has {} errors",
                loaded.errors().count()
            ),
        });
    };
    let t1 = Instant::now();
    let planned = if single {
        plan::compute(desired, inventory, &LastApplied::default(), None)
    } else {
        plan::compute_memo(
            &plan::PlanInputs::new(desired, inventory, &LastApplied::default()),
            &mut crate::ops::cold_plan_memo(),
        )
    };
    let plan = planned.map_err(|d| BenchError::Invalid {
        what: format!("the generated fleet cannot be planned: {} errors", d.len()),
    })?;
    let t2 = Instant::now();
    let text = render::text(&plan, render::Options { color: false });
    let t3 = Instant::now();
    let json = render::json(&plan);
    let t4 = Instant::now();
    let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
    let waves = plan
        .clusters
        .iter()
        .flat_map(|c| &c.steps)
        .map(|s| match s {
            plan::Step::Talos(t) => t.waves.len(),
            _ => 0,
        })
        .sum();
    std::hint::black_box(&json);
    Ok(Round {
        load: ms(t0, t1),
        plan: ms(t1, t2),
        render: ms(t2, t3),
        total: ms(t0, t3),
        json: ms(t3, t4),
        waves,
        rendered: text.len(),
    })
}

/// Run `rounds` rounds (after one warm-up round) over the repo at `root`.
pub fn run(
    root: &Path,
    inventory: &Inventory,
    rounds: usize,
) -> Result<PipelineReport, BenchError> {
    let snapshot = desired::source::read(&Source::Dir(root.to_path_buf()))
        .map_err(|e| BenchError::Desired(Box::new(e)))?;
    let mut r = PipelineReport {
        machines: inventory.clusters.values().map(|c| c.machines.len()).sum(),
        clusters: inventory.clusters.len(),
        files: snapshot.files.len(),
        bytes: snapshot.files.iter().map(|f| f.bytes.len()).sum(),
        ..PipelineReport::default()
    };
    // Warm-up: page cache, allocator, lazy statics.
    parse_floor(root, true)?;
    parse_floor(root, false)?;
    pipeline(root, inventory, false)?;
    pipeline(root, inventory, true)?;
    for i in 0..rounds {
        let floor = |r: &mut PipelineReport| -> Result<(), BenchError> {
            let t = Instant::now();
            std::hint::black_box(parse_floor(root, true)?);
            r.floor.push(t.elapsed());
            let t = Instant::now();
            std::hint::black_box(parse_floor(root, false)?);
            r.syntax.push(t.elapsed());
            Ok(())
        };
        let full = |r: &mut PipelineReport| -> Result<(), BenchError> {
            let single = pipeline(root, inventory, true)?;
            r.load_single.push_value(single.load);
            r.plan_single.push_value(single.plan);
            r.total_single.push_value(single.total);
            let round = pipeline(root, inventory, false)?;
            r.load.push_value(round.load);
            r.plan.push_value(round.plan);
            r.render.push_value(round.render);
            r.total.push_value(round.total);
            r.json.push_value(round.json);
            r.waves = round.waves;
            r.rendered_bytes = round.rendered;
            Ok(())
        };
        if i % 2 == 0 {
            floor(&mut r)?;
            full(&mut r)?;
        } else {
            full(&mut r)?;
            floor(&mut r)?;
        }
    }
    Ok(r)
}
