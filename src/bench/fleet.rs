//! Deterministic fleet generator: desired-state repos and matching inventories of any size.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::inventory::{Inventory, Machine, MachineRole, ObservedCluster};
use crate::version::{KubeVersion, TalosVersion};

/// splitmix64: a tiny, well-known seeded generator (reproducible across platforms).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

#[derive(Debug, Clone, Copy)]
pub struct FleetSpec {
    pub clusters: usize,
    pub machines_per_cluster: usize,
    pub seed: u64,
}

/// A generated fleet: desired-state files (path → YAML) and the inventory they describe.
#[derive(Debug, Clone)]
pub struct Fleet {
    pub files: BTreeMap<String, String>,
    pub inventory: Inventory,
}

impl Fleet {
    pub fn machines(&self) -> usize {
        self.inventory
            .clusters
            .values()
            .map(|c| c.machines.len())
            .sum()
    }
}

const WORKER_POOL: usize = 48;

/// Every cluster has 3 control-plane machines, one canary worker, and worker pools of up to 48
/// machines (`after: [canary]`). About half the clusters run an older Talos than desired, so
/// plans have real work; some worker pools have one machine NotReady already.
#[allow(
    clippy::expect_used,
    reason = "benchmark fleet: versions are formatted from integers or constant literals and always parse"
)]
pub fn generate(spec: FleetSpec) -> Fleet {
    let mut rng = Rng::new(spec.seed);
    let mut files = BTreeMap::new();
    let mut clusters = BTreeMap::new();
    let desired_talos = "v1.13.9";
    for c in 0..spec.clusters {
        let name = format!("c{c:04}");
        let behind = rng.below(2) == 0;
        let running_talos = if behind {
            format!("v1.12.{}", 2 + rng.below(3))
        } else {
            desired_talos.to_string()
        };
        files.insert(
            format!("{name}/cluster.yaml"),
            format!(
                "# yaml-language-server: $schema=../schemas/cluster.json\napiVersion: medea/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\nspec:\n  kubernetes:\n    version: v1.35.0\n  rollout:\n    maxUnavailable: {}\n    drainTimeout: 10m\n    healthTimeout: 15m\n  approvals:\n    required: 1\n    controlPlane: 2\n",
                1 + rng.below(3)
            ),
        );
        let n = spec.machines_per_cluster.max(4);
        let mut machines = BTreeMap::new();
        let mut pools = String::new();
        let node = |i: usize| format!("{name}-n{i:04}");
        let mut pool_doc = |pname: &str, role: &str, members: &[String], after: Option<&str>| {
            if !pools.is_empty() {
                pools.push_str("---\n");
            }
            pools.push_str(&format!(
                "apiVersion: medea/v1alpha1\nkind: NodePool\nmetadata:\n  name: {pname}\nspec:\n  cluster: {name}\n  role: {role}\n  machines: [{}]\n  talos:\n    version: {desired_talos}\n",
                members.join(", ")
            ));
            if let Some(a) = after {
                pools.push_str(&format!("  after: [{a}]\n"));
            }
        };
        let cp: Vec<String> = (0..3).map(node).collect();
        pool_doc("controlplane", "controlplane", &cp, None);
        pool_doc("canary", "worker", &[node(3)], None);
        let workers: Vec<String> = (4..n).map(node).collect();
        for (i, chunk) in workers.chunks(WORKER_POOL).enumerate() {
            pool_doc(&format!("workers-{i}"), "worker", chunk, Some("canary"));
        }
        files.insert(
            format!("{name}/pools.yaml"),
            format!("# yaml-language-server: $schema=../schemas/nodepool.json\n{pools}"),
        );
        for i in 0..n {
            // At most one machine per worker pool is NotReady (a pool can always start).
            let away = i >= 4 && (i - 4) % WORKER_POOL == 17 && rng.below(3) == 0;
            let m = Machine {
                node: node(i),
                id: format!("{:016x}", rng.next_u64()),
                address: format!("10.{}.{}.{}", c / 256 % 256, c % 256, i % 250 + 1),
                role: if i < 3 {
                    MachineRole::Controlplane
                } else {
                    MachineRole::Worker
                },
                talos_version: Some(
                    TalosVersion::parse(&running_talos).expect("generated version"),
                ),
                installer_image: Some(format!("ghcr.io/siderolabs/installer:{running_talos}")),
                schematic: None,
                platform: None,
                secure_boot: None,
                factory_host: None,
                extensions: BTreeMap::new(),
                kubelet_version: Some(KubeVersion::parse("v1.35.0").expect("literal")),
                ready: !(away && i >= 3),
                cordoned: false,
                reachable: true,
                boot_id: Some(format!("{:032x}", rng.next_u64())),
                labels: BTreeMap::new(),
            };
            machines.insert(m.node.clone(), m);
        }
        let cluster = ObservedCluster::new(name.clone()).observe(
            Some(KubeVersion::parse("v1.35.0").expect("literal")),
            machines,
        );
        clusters.insert(name, cluster);
    }
    Fleet {
        files,
        inventory: Inventory {
            clusters: clusters
                .into_iter()
                .map(|(k, v)| (k, std::sync::Arc::new(v)))
                .collect(),
        },
    }
}

/// Where [`write_repo`] put a fleet.
#[derive(Debug, Clone)]
pub struct Written {
    /// The desired-state root (`<dir>/desired`): one directory per cluster.
    pub desired: PathBuf,
    /// The inventory file (`<dir>/inventory.json`), for `medea plan --observed`.
    pub inventory: PathBuf,
}

/// Write `fleet` below `dir`: the desired-state repo in `desired/` and the inventory in
/// `inventory.json` (the inventory-file format, which `medea plan --observed` reads).
#[allow(
    clippy::expect_used,
    reason = "plain structs with string keys and no non-finite floats: serializing them to JSON cannot fail"
)]
pub fn write_repo(fleet: &Fleet, dir: &Path) -> std::io::Result<Written> {
    let desired = dir.join("desired");
    for (rel, text) in &fleet.files {
        let path = desired.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, text)?;
    }
    let inventory = dir.join("inventory.json");
    let file = crate::inventory::file::to_file(&fleet.inventory);
    std::fs::write(
        &inventory,
        serde_json::to_vec(&file).expect("an inventory serializes"),
    )?;
    Ok(Written { desired, inventory })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_valid() {
        let spec = FleetSpec {
            clusters: 3,
            machines_per_cluster: 60,
            seed: 7,
        };
        let a = generate(spec);
        let b = generate(spec);
        assert_eq!(a.files, b.files);
        assert_eq!(a.inventory, b.inventory);
        assert_eq!(a.machines(), 180);
        let c = generate(FleetSpec { seed: 8, ..spec });
        assert_ne!(a.inventory, c.inventory);
        let snapshot = crate::desired::Snapshot {
            files: a
                .files
                .iter()
                .map(|(p, t)| crate::desired::source::SourceFile {
                    path: p.clone(),
                    bytes: t.clone().into_bytes().into(),
                })
                .collect(),
            markers: vec![],
            commit: None,
            refused: Vec::new(),
        };
        let loaded = crate::desired::parse_snapshot(snapshot);
        assert!(
            loaded.diagnostics.is_empty(),
            "{:#?}",
            &loaded.diagnostics[..loaded.diagnostics.len().min(3)]
        );
        let pools: usize = loaded
            .desired
            .clusters
            .values()
            .map(|c| c.pools.len())
            .sum();
        assert_eq!(
            pools,
            3 * 4,
            "controlplane, canary, 2 worker pools of ≤48 each"
        );
    }

    #[test]
    fn written_repos_load_and_their_inventory_reads_back() {
        let fleet = generate(FleetSpec {
            clusters: 2,
            machines_per_cluster: 10,
            seed: 3,
        });
        let dir = tempfile::tempdir().unwrap();
        let w = write_repo(&fleet, dir.path()).unwrap();
        let loaded = crate::desired::load(&crate::desired::Source::Dir(w.desired)).unwrap();
        assert!(loaded.diagnostics.is_empty(), "{:?}", loaded.diagnostics);
        assert_eq!(loaded.desired.clusters.len(), 2);
        let text = std::fs::read_to_string(&w.inventory).unwrap();
        let inv = crate::inventory::file::parse("inventory.json", &text).unwrap();
        assert_eq!(inv, fleet.inventory);
    }

    #[test]
    fn every_generated_fleet_can_be_planned() {
        for seed in 0..5 {
            let fleet = generate(FleetSpec {
                clusters: 20,
                machines_per_cluster: 100,
                seed,
            });
            let snapshot = crate::desired::Snapshot {
                files: fleet
                    .files
                    .iter()
                    .map(|(p, t)| crate::desired::source::SourceFile {
                        path: p.clone(),
                        bytes: t.clone().into_bytes().into(),
                    })
                    .collect(),
                markers: vec![],
                commit: None,
                refused: Vec::new(),
            };
            let loaded = crate::desired::parse_snapshot(snapshot);
            let plan = crate::plan::compute(
                loaded.valid().expect("valid"),
                &fleet.inventory,
                &crate::plan::LastApplied::default(),
                None,
            );
            let plan = plan.unwrap_or_else(|d| panic!("seed {seed}: {:?}", d[0].message));
            assert!(plan.has_changes(), "about half the clusters are behind");
        }
    }
}
