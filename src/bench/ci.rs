//! `medea bench ci`: the regression check `tests/run` runs (issue #54 item 4). Not a timed
//! test: every row is a **ratio of two runs taken side by side in the same process** (or a
//! count that does not depend on the machine at all), compared with a baseline recorded in the
//! repository for the same machine class (`design/bench-ci-baseline.json`, keyed by
//! [`machine_class`]). A row fails when its median exceeds `baseline × factor`; the factors
//! leave room for a loaded 2-core machine (design/performance.md "The regression check").
//!
//! The rows:
//! - `plan_vs_parse_floor`: load + validate + plan + render of a small generated fleet over
//!   the time to merely parse the same YAML (`pipeline`), the median of per-round ratios;
//! - `sim_vs_fakes_per_node`: the rollout engine's zero-delay CPU time per node on the simulator
//!   (through the real adapters) over the same engine on the in-memory fakes, runs alternated:
//!   the simulator's and the adapters' own cost per node;
//! - `fakes_per_node_vs_parse_floor`: the engine alone, CPU time per node (fakes, fjall journal)
//!   over the parse floor of the same round (CPU work of a fixed size): what the engine costs
//!   per node in units of a yardstick that slows down with the machine as it does;
//! - `commits_per_node`: journal commits per node on the fakes (deterministic: the crash
//!   contract's intents and results; a new per-node write shows here at once).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::BenchError;
use super::rollout::{self, Backend};
use super::stats::Samples;

/// The baseline recorded in the repository (`design/bench-ci-baseline.json`).
pub const BASELINE: &str = include_str!("../../design/bench-ci-baseline.json");

/// Rows, in the order they are measured and printed.
pub const ROWS: &[&str] = &[
    "plan_vs_parse_floor",
    "sim_vs_fakes_per_node",
    "fakes_per_node_vs_parse_floor",
    "commits_per_node",
];

/// The baseline file: allowed factors per row, and the recorded medians per machine class.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Baseline {
    /// Free text: how the values were recorded.
    #[serde(default)]
    pub comment: String,
    /// A row fails when its median exceeds the recorded value times this factor.
    pub factors: BTreeMap<String, f64>,
    /// Recorded medians by machine class ([`machine_class`]), then by row.
    pub classes: BTreeMap<String, BTreeMap<String, f64>>,
}

impl Baseline {
    pub fn parse(text: &str) -> Result<Baseline, BenchError> {
        let b: Baseline = serde_json::from_str(text).map_err(|e| BenchError::Invalid {
            what: format!("the CI baseline is not valid: {e}"),
        })?;
        for row in ROWS {
            if !b.factors.contains_key(*row) {
                return Err(BenchError::Invalid {
                    what: format!("the CI baseline has no factor for row `{row}`"),
                });
            }
        }
        Ok(b)
    }

    /// The recorded values for `class`; else those of another class of the same build
    /// profile, with every factor widened by [`FOREIGN_CLASS_WIDENING`] (and the class named).
    pub fn for_class(&self, class: &str) -> Option<(String, &BTreeMap<String, f64>, f64)> {
        if let Some(v) = self.classes.get(class) {
            return Some((class.to_string(), v, 1.0));
        }
        let profile = class.rsplit('-').next().unwrap_or("");
        self.classes
            .iter()
            .find(|(k, _)| k.rsplit('-').next() == Some(profile))
            .map(|(k, v)| (k.clone(), v, FOREIGN_CLASS_WIDENING))
    }
}

/// How much wider every factor is when the machine's class has no recorded values of its own.
pub const FOREIGN_CLASS_WIDENING: f64 = 1.5;

/// `<arch>-<cpus>cpu-<profile>`: what a recorded ratio depends on (the number of cores: the
/// simulator and the planning lanes use them; the profile: a debug build is ~10× slower in the
/// engine and the parser alike, but not by the same factor).
pub fn machine_class(cpus: usize) -> String {
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    format!("{}-{}cpu-{profile}", std::env::consts::ARCH, cpus.min(4))
}

/// One row's measurement.
#[derive(Debug, Clone)]
pub struct Measured {
    pub row: &'static str,
    pub samples: Samples,
}

/// One row checked against the baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub row: String,
    pub median: f64,
    pub n: usize,
    pub baseline: Option<f64>,
    pub limit: Option<f64>,
    pub passed: bool,
}

/// Check `measured` medians against `base` for `class`.
pub fn check(base: &Baseline, class: &str, measured: &[(String, f64, usize)]) -> Vec<Verdict> {
    let chosen = base.for_class(class);
    measured
        .iter()
        .map(|(row, median, n)| {
            let recorded = chosen.as_ref().and_then(|(_, v, _)| v.get(row).copied());
            let widen = chosen.as_ref().map_or(1.0, |(_, _, w)| *w);
            let limit = recorded
                .zip(base.factors.get(row).copied())
                .map(|(r, f)| r * f * widen);
            Verdict {
                row: row.clone(),
                median: *median,
                n: *n,
                baseline: recorded,
                limit,
                // no recorded value: reported, not failed (record one with --record)
                passed: limit.is_none_or(|l| *median <= l),
            }
        })
        .collect()
}

/// The ci fleet: small enough for a debug build in `tests/run`.
#[derive(Debug, Clone, Copy)]
pub struct CiSize {
    pub clusters: usize,
    pub machines: usize,
    pub nodes: usize,
    pub rounds: usize,
}

impl Default for CiSize {
    fn default() -> Self {
        CiSize {
            clusters: 10,
            machines: 20,
            nodes: 40,
            rounds: 5,
        }
    }
}

/// Measure every row (`size.rounds` rounds, each side by side).
pub fn measure(dir: &Path, size: CiSize) -> Result<Vec<Measured>, BenchError> {
    let fleet = super::fleet::generate(super::fleet::FleetSpec {
        clusters: size.clusters,
        machines_per_cluster: size.machines,
        seed: 1,
    });
    let w = super::fleet::write_repo(&fleet, &dir.join("fleet")).map_err(|err| BenchError::Io {
        path: dir.join("fleet"),
        err,
    })?;
    let (mut plan_ratio, mut sim, mut fakes, mut commits) = (
        Samples::new(),
        Samples::new(),
        Samples::new(),
        Samples::new(),
    );
    let workers = size.nodes.saturating_sub(3);
    for round in 0..size.rounds {
        // the plan and its parse floor, side by side (the floor is also the CPU yardstick of
        // the engine row below, measured in the same round)
        let plan = super::pipeline::run(&w.desired, &fleet.inventory, 3)?;
        let (total, floor) = (plan.total.median(), plan.floor.median());
        plan_ratio.push_value(total / floor);
        let rdir = dir.join(format!("round-{round}"));
        let one = |backend: Backend, sub: &str| {
            rollout::run(
                &rdir.join(sub),
                backend,
                3,
                workers,
                10,
                Duration::ZERO,
                Duration::ZERO,
            )
        };
        // The engine rows compare CPU time per node (every thread of this process), not wall
        // time: on the fakes the wall time is mostly fsync waits, which a loaded or a quiet
        // machine stretches differently from the simulator's CPU work (the wall-time ratio
        // went from 8.4 at load 8 to 24 at load 1 on the same host).
        let cpu_per_node = |backend: Backend, sub: &str| {
            let before = process_cpu();
            let r = one(backend, sub)?;
            let cpu = process_cpu().saturating_sub(before);
            Ok::<_, BenchError>((cpu.as_secs_f64() * 1e3 / r.nodes.max(1) as f64, r))
        };
        // alternate which goes first, so neither always runs on a warmer (or busier) machine
        let ((s, _), (f, fr)) = if round % 2 == 0 {
            let s = cpu_per_node(Backend::Sim, "sim")?;
            (s, cpu_per_node(Backend::Fakes, "fakes")?)
        } else {
            let f = cpu_per_node(Backend::Fakes, "fakes")?;
            (cpu_per_node(Backend::Sim, "sim")?, f)
        };
        sim.push_value(s / f);
        fakes.push_value(f / floor);
        commits.push_value(fr.commits as f64 / fr.nodes.max(1) as f64);
    }
    Ok(vec![
        Measured {
            row: ROWS[0],
            samples: plan_ratio,
        },
        Measured {
            row: ROWS[1],
            samples: sim,
        },
        Measured {
            row: ROWS[2],
            samples: fakes,
        },
        Measured {
            row: ROWS[3],
            samples: commits,
        },
    ])
}

/// The CPU time this process has used so far, over all its threads.
fn process_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Baseline {
        Baseline::parse(
            r#"{"factors": {"plan_vs_parse_floor": 2.0, "sim_vs_fakes_per_node": 2.0,
                 "fakes_per_node_vs_parse_floor": 2.5, "commits_per_node": 1.2},
                "classes": {"x86_64-2cpu-debug": {"plan_vs_parse_floor": 3.0, "commits_per_node": 10.0}}}"#,
        )
        .unwrap()
    }

    #[test]
    fn the_recorded_baseline_names_every_row_for_the_debug_build_tests_run_makes() {
        let b = Baseline::parse(BASELINE).unwrap();
        for profile in ["debug"] {
            let class = b
                .classes
                .iter()
                .find(|(k, _)| k.ends_with(profile))
                .unwrap_or_else(|| panic!("no {profile} class recorded"));
            for row in ROWS {
                assert!(class.1.contains_key(*row), "{} lacks {row}", class.0);
            }
        }
    }

    #[test]
    fn a_row_over_its_factor_fails_and_one_under_passes() {
        let v = check(
            &base(),
            "x86_64-2cpu-debug",
            &[
                ("plan_vs_parse_floor".into(), 5.9, 5),
                ("commits_per_node".into(), 12.5, 5),
                ("sim_vs_fakes_per_node".into(), 100.0, 5),
            ],
        );
        assert!(v[0].passed && v[0].limit == Some(6.0), "{v:?}");
        assert!(!v[1].passed && v[1].limit == Some(12.0), "{v:?}");
        // no recorded value: reported, not failed
        assert!(v[2].passed && v[2].baseline.is_none(), "{v:?}");
    }

    #[test]
    fn a_class_without_values_borrows_its_profile_with_wider_factors() {
        let v = check(
            &base(),
            "aarch64-4cpu-debug",
            &[("plan_vs_parse_floor".into(), 8.9, 5)],
        );
        assert!(v[0].passed && v[0].limit == Some(9.0), "{v:?}");
        let v = check(
            &base(),
            "x86_64-2cpu-release",
            &[("plan_vs_parse_floor".into(), 100.0, 5)],
        );
        assert!(v[0].passed && v[0].limit.is_none(), "{v:?}");
    }

    #[test]
    fn a_baseline_without_a_factor_for_a_row_is_refused() {
        let e = Baseline::parse(r#"{"factors": {}, "classes": {}}"#).unwrap_err();
        assert!(e.to_string().contains("plan_vs_parse_floor"), "{e}");
    }
}
