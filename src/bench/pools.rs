//! `medea bench pools` (issue #49): planning clusters with many node pools, the input a
//! committer controls. The fleet generator's clusters (3 control planes and a canary each),
//! each given empty worker pools (a selector that matches nothing) until it has the number of
//! pools asked for, planned through the same pipeline as `medea bench plan`: load + validate +
//! plan + render.
//!
//! The cases: 500 pools in one cluster (the target: a plan in at most 1 s, release build), the
//! most pools a cluster may have (`MAX_POOLS_PER_CLUSTER`), and the most documents a revision
//! may have (`MAX_DOCUMENTS`: 20 clusters of 999 pools and their cluster documents).

use super::BenchError;
use super::fleet::{self, FleetSpec};
use super::pipeline::{self, PipelineReport};
use crate::desired::source::limits::{MAX_DOCUMENTS, MAX_POOLS_PER_CLUSTER};

/// Pools per file, as in the reproduction.
const PER_FILE: usize = 500;

/// One case: its shape and its timings.
#[derive(Debug)]
pub struct Case {
    pub clusters: usize,
    pub pools_per_cluster: usize,
    /// YAML documents of the revision (clusters and pools).
    pub documents: usize,
    pub report: PipelineReport,
}

/// (clusters, pools per cluster) of each case.
pub fn cases() -> Vec<(usize, usize)> {
    let clusters = MAX_DOCUMENTS / MAX_POOLS_PER_CLUSTER;
    vec![
        (1, 500),
        (1, MAX_POOLS_PER_CLUSTER),
        (clusters, MAX_DOCUMENTS / clusters - 1),
    ]
}

/// Plan `clusters` clusters of `pools` pools each, `rounds` times.
pub fn run(clusters: usize, pools: usize, rounds: usize) -> Result<Case, BenchError> {
    let fleet = fleet::generate(FleetSpec {
        clusters,
        machines_per_cluster: 4,
        seed: 1,
    });
    let dir = tempfile::tempdir().map_err(|err| BenchError::Io {
        path: std::env::temp_dir(),
        err,
    })?;
    let written = fleet::write_repo(&fleet, dir.path()).map_err(|err| BenchError::Io {
        path: dir.path().to_path_buf(),
        err,
    })?;
    // The generator's two pools (controlplane, canary), then empty ones.
    let extra: Vec<usize> = (0..pools.saturating_sub(2)).collect();
    for name in fleet.inventory.clusters.keys() {
        for (k, chunk) in extra.chunks(PER_FILE).enumerate() {
            let docs: Vec<String> = chunk.iter().map(|i| empty_pool(name, *i)).collect();
            let path = written
                .desired
                .join(name)
                .join(format!("extra-{k:02}.yaml"));
            std::fs::write(&path, docs.join("---\n"))
                .map_err(|err| BenchError::Io { path, err })?;
        }
    }
    let report = pipeline::run(&written.desired, &fleet.inventory, rounds)?;
    Ok(Case {
        clusters,
        pools_per_cluster: pools,
        documents: clusters * (1 + pools),
        report,
    })
}

/// A worker pool of `cluster` whose selector matches no machine.
fn empty_pool(cluster: &str, i: usize) -> String {
    format!(
        "apiVersion: medea/v1alpha1\nkind: NodePool\nmetadata:\n  name: empty-{i:05}\nspec:\n  cluster: {cluster}\n  role: worker\n  selector:\n    matchLabels:\n      medea-bench/none: \"true\"\n  talos:\n    version: v1.13.9\n"
    )
}

#[cfg(test)]
mod tests {
    /// The capped cases stay within the limits (so they plan), and the largest fills the
    /// document limit exactly.
    #[test]
    fn the_cases_are_within_the_limits() {
        use crate::desired::source::limits::{MAX_DOCUMENTS, MAX_POOLS_PER_CLUSTER};
        for (clusters, pools) in super::cases() {
            assert!(pools <= MAX_POOLS_PER_CLUSTER);
            assert!(clusters * (1 + pools) <= MAX_DOCUMENTS);
        }
        let (c, p) = super::cases()[2];
        assert_eq!(c * (1 + p), MAX_DOCUMENTS);
    }
}
