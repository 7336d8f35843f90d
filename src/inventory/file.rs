//! The inventory file: an observed inventory written by hand (or dumped), YAML or JSON, for
//! `medea plan --observed FILE` rehearsals and for test fixtures. Pure: text in, inventory out.
//!
//! ```yaml
//! clusters:
//!   - name: home
//!     kubernetesVersion: v1.34.1
//!     generation: 4          # default 1
//!     rolloutsEnabled: false # default false
//!     machines:
//!       - node: cp-1
//!         address: 10.0.1.11
//!         role: controlplane
//!         talosVersion: v1.12.4   # absent = unknown (the node did not answer)
//!         kubeletVersion: v1.34.1
//!         # id (default: the node name), installerImage, schematic, platform, extensions
//!         # (name: version), bootId,
//!         # ready (default true), cordoned (default false), reachable (default true), labels
//!     preflight:             # optional: what the preflight checks read (inventory::preflight)
//!       apiserverMetrics: [{endpoint: "https://10.0.1.11:6443", error: null}]
//!       deprecatedApiRequests:
//!         - {group: flowcontrol.apiserver.k8s.io, version: v1beta3, resource: flowschemas,
//!            removedRelease: "1.32", source: "https://10.0.1.11:6443"}
//!       podDisruptionBudgets: [{namespace: db, name: pg, disruptionsAllowed: 0,
//!                               pods: [{name: pg-0, node: w-1}]}]
//!       etcd: {members: [{id: "8e9e05c52164694d", name: cp-1, learner: false, healthy: true}]}
//!       nodePressure: {w-1: [DiskPressure]}
//!       credentials: [{credential: talosconfig client certificate, notAfter: "2027-01-01T00:00:00Z"}]
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Inventory, Machine, MachineRole, ObservedCluster};
use crate::version::{KubeVersion, TalosVersion};

#[derive(Debug, thiserror::Error)]
pub enum InventoryFileError {
    #[error("inventory file `{file}` is not a valid inventory")]
    Parse {
        file: String,
        #[source]
        err: Box<serde_saphyr::Error>,
    },
    #[error("inventory file `{file}` is not a valid inventory")]
    Json {
        file: String,
        #[source]
        err: serde_json::Error,
    },
    /// A YAML inventory beyond what [`LIMITS`] allows (sized for 100,000 machines).
    #[error(
        "inventory file `{file}` is larger than medea reads as YAML: {what} (the limit is {limit}, sized for {MACHINES_SIZED_FOR} machines); write it as JSON, which has no such limit"
    )]
    TooLarge {
        file: String,
        what: String,
        limit: usize,
    },
    #[error("inventory file `{file}` lists cluster `{cluster}` twice")]
    DuplicateCluster { file: String, cluster: String },
    #[error("inventory file `{file}` lists machine `{node}` twice in cluster `{cluster}`")]
    DuplicateMachine {
        file: String,
        cluster: String,
        node: String,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InventoryFile {
    #[serde(default)]
    pub clusters: Vec<ClusterEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterEntry {
    pub name: String,
    #[serde(default)]
    pub kubernetes_version: Option<KubeVersion>,
    #[serde(default)]
    pub rollouts_enabled: bool,
    #[serde(default = "one")]
    pub generation: u64,
    #[serde(default)]
    pub machines: Vec<MachineEntry>,
    /// What a refresh's preflight gathering saw (deprecated-API usage, PDBs, etcd, node
    /// pressure, credential expiry), so a rehearsal shows the same findings. A file with the
    /// block counts as gathered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preflight: Option<super::preflight::PreflightObservations>,
}

fn one() -> u64 {
    1
}
fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MachineEntry {
    pub node: String,
    #[serde(default)]
    pub id: Option<String>,
    pub address: String,
    pub role: MachineRole,
    #[serde(default)]
    pub talos_version: Option<TalosVersion>,
    #[serde(default)]
    pub installer_image: Option<String>,
    #[serde(default)]
    pub schematic: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extensions: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure_boot: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub factory_host: Option<String>,
    #[serde(default)]
    pub kubelet_version: Option<KubeVersion>,
    #[serde(default = "yes")]
    pub ready: bool,
    #[serde(default)]
    pub cordoned: bool,
    #[serde(default = "yes")]
    pub reachable: bool,
    #[serde(default)]
    pub boot_id: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// How many machines the YAML reader's limits are sized for. The inventory is medea's own file
/// (written by `medea bench fleet`, dumps, or a person), not hostile input like desired state,
/// so its limits are sized for the largest fleet medea plans rather than for defence.
pub const MACHINES_SIZED_FOR: usize = 100_000;

/// The YAML reader's limits for an inventory file. A machine written out in full is about 30
/// YAML nodes (more with many labels); the default serde-saphyr budget (250,000 nodes) stops
/// near 8,000 machines, which `medea bench fleet --clusters 100 --machines 100` exceeds. JSON
/// inventories are read with serde_json and need no budget: it builds no event stream and
/// cannot be made to expand by aliases.
pub struct Limits {
    pub max_nodes: usize,
    pub max_events: usize,
    pub max_total_scalar_bytes: usize,
}

/// See [`Limits`]: 80 nodes per machine for [`MACHINES_SIZED_FOR`] machines.
pub const LIMITS: Limits = Limits {
    max_nodes: 80 * MACHINES_SIZED_FOR,
    max_events: 160 * MACHINES_SIZED_FOR,
    max_total_scalar_bytes: 4096 * MACHINES_SIZED_FOR,
};

/// Parse an inventory file: JSON (as `medea bench fleet` writes it) when the text starts with
/// `{`, YAML otherwise. `file` names it in errors.
pub fn parse(file: &str, text: &str) -> Result<Inventory, InventoryFileError> {
    let parsed: InventoryFile = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|err| InventoryFileError::Json {
            file: file.to_string(),
            err,
        })?
    } else {
        parse_yaml(file, text, &LIMITS)?
    };
    let mut clusters = BTreeMap::new();
    for c in parsed.clusters {
        let mut machines = BTreeMap::new();
        for m in c.machines {
            let node = m.node.clone();
            let machine = Machine {
                id: m.id.unwrap_or_else(|| m.node.clone()),
                node: m.node,
                address: m.address,
                role: m.role,
                talos_version: m.talos_version,
                installer_image: m.installer_image,
                schematic: m.schematic,
                platform: m.platform,
                extensions: m.extensions,
                secure_boot: m.secure_boot,
                factory_host: m.factory_host,
                kubelet_version: m.kubelet_version,
                ready: m.ready,
                cordoned: m.cordoned,
                reachable: m.reachable,
                boot_id: m.boot_id,
                labels: m.labels,
            };
            if machines.insert(node.clone(), machine).is_some() {
                return Err(InventoryFileError::DuplicateMachine {
                    file: file.to_string(),
                    cluster: c.name,
                    node,
                });
            }
        }
        let cluster = ObservedCluster {
            preflight: c
                .preflight
                .map(|mut p| {
                    p.gathered = true;
                    p
                })
                .unwrap_or_default(),
            name: c.name.clone(),
            kubernetes_version: c.kubernetes_version,
            rollouts_enabled: c.rollouts_enabled,
            generation: c.generation,
            machines,
        };
        if clusters.insert(c.name.clone(), cluster).is_some() {
            return Err(InventoryFileError::DuplicateCluster {
                file: file.to_string(),
                cluster: c.name,
            });
        }
    }
    Ok(Inventory {
        clusters: clusters
            .into_iter()
            .map(|(k, v)| (k, std::sync::Arc::new(v)))
            .collect(),
    })
}

fn parse_yaml(
    file: &str,
    text: &str,
    limits: &Limits,
) -> Result<InventoryFile, InventoryFileError> {
    let options = serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_nodes: limits.max_nodes,
            max_events: limits.max_events,
            max_total_scalar_bytes: limits.max_total_scalar_bytes,
        },
    };
    serde_saphyr::from_str_with_options(text, options).map_err(|err| {
        use serde_saphyr::budget::BudgetBreach;
        let too_large = |what: String, limit: usize| InventoryFileError::TooLarge {
            file: file.to_string(),
            what,
            limit,
        };
        match err.without_snippet() {
            serde_saphyr::Error::Budget { breach, .. } => match breach {
                BudgetBreach::Nodes { nodes } => {
                    too_large(format!("{nodes} YAML nodes"), limits.max_nodes)
                }
                BudgetBreach::Events { events } => {
                    too_large(format!("{events} YAML events"), limits.max_events)
                }
                BudgetBreach::ScalarBytes { total_scalar_bytes } => too_large(
                    format!("{total_scalar_bytes} bytes of values"),
                    limits.max_total_scalar_bytes,
                ),
                _ => InventoryFileError::Parse {
                    file: file.to_string(),
                    err: Box::new(err),
                },
            },
            _ => InventoryFileError::Parse {
                file: file.to_string(),
                err: Box::new(err),
            },
        }
    })
}

/// The file form of an inventory (every field written), for dumps and round trips.
pub fn to_file(inv: &Inventory) -> InventoryFile {
    InventoryFile {
        clusters: inv
            .clusters
            .values()
            .map(|c| ClusterEntry {
                name: c.name.clone(),
                kubernetes_version: c.kubernetes_version.clone(),
                rollouts_enabled: c.rollouts_enabled,
                generation: c.generation,
                preflight: (!c.preflight.is_empty()).then(|| c.preflight.clone()),
                machines: c
                    .machines
                    .values()
                    .map(|m| MachineEntry {
                        node: m.node.clone(),
                        id: Some(m.id.clone()),
                        address: m.address.clone(),
                        role: m.role,
                        talos_version: m.talos_version.clone(),
                        installer_image: m.installer_image.clone(),
                        schematic: m.schematic.clone(),
                        platform: m.platform.clone(),
                        extensions: m.extensions.clone(),
                        secure_boot: m.secure_boot,
                        factory_host: m.factory_host.clone(),
                        kubelet_version: m.kubelet_version.clone(),
                        ready: m.ready,
                        cordoned: m.cordoned,
                        reachable: m.reachable,
                        boot_id: m.boot_id.clone(),
                        labels: m.labels.clone(),
                    })
                    .collect(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "clusters:\n  - name: home\n    kubernetesVersion: v1.34.1\n    generation: 4\n    machines:\n      - { node: cp-1, address: 10.0.1.11, role: controlplane, talosVersion: v1.12.4, kubeletVersion: v1.34.1 }\n      - { node: w-1, address: 10.0.1.21, role: worker, ready: false, labels: { zone: a } }\n";

    #[test]
    fn parses_with_defaults() {
        let inv = parse("inv.yaml", TEXT).unwrap();
        let home = &inv.clusters["home"];
        assert_eq!(home.generation, 4);
        assert!(!home.rollouts_enabled);
        let cp = &home.machines["cp-1"];
        assert_eq!(cp.id, "cp-1");
        assert!(cp.ready && cp.reachable && !cp.cordoned);
        assert_eq!(
            cp.talos_version,
            Some(TalosVersion::parse("v1.12.4").unwrap())
        );
        let w = &home.machines["w-1"];
        assert_eq!(w.talos_version, None, "absent = unknown");
        assert!(!w.ready && w.unavailable());
        assert_eq!(w.labels["zone"], "a");
    }

    #[test]
    fn json_is_accepted_and_round_trips() {
        let inv = parse("inv.yaml", TEXT).unwrap();
        let json = serde_json::to_string(&to_file(&inv)).unwrap();
        assert_eq!(parse("inv.json", &json).unwrap(), inv);
    }

    #[test]
    fn refuses_bad_files_with_the_reason() {
        let e = parse("x.yaml", "clusters:\n  - name: a\n    machines:\n      - { node: n, address: a, role: worker, talosVersion: 1.2.3 }\n")
            .unwrap_err();
        assert!(matches!(e, InventoryFileError::Parse { .. }), "{e}");
        let chain = format!("{e}: {}", std::error::Error::source(&e).unwrap());
        assert!(chain.contains("must start with `v`"), "{chain}");
        let e = parse("x.yaml", "clusters:\n  - name: a\n    bogus: 1\n").unwrap_err();
        assert!(
            std::error::Error::source(&e)
                .unwrap()
                .to_string()
                .contains("bogus"),
            "{e}"
        );
        assert!(matches!(
            parse("x.yaml", "clusters:\n  - name: a\n  - name: a\n"),
            Err(InventoryFileError::DuplicateCluster { .. })
        ));
        assert!(matches!(
            parse(
                "x.yaml",
                "clusters:\n  - name: a\n    machines:\n      - { node: n, address: a, role: worker }\n      - { node: n, address: b, role: worker }\n"
            ),
            Err(InventoryFileError::DuplicateMachine { .. })
        ));
    }

    fn fleet(machines: usize) -> Inventory {
        let per_cluster = 100;
        let mut text = String::from("clusters:\n");
        for c in 0..machines / per_cluster {
            text.push_str(&format!(
                "  - name: c{c}\n    kubernetesVersion: v1.34.1\n    machines:\n"
            ));
            for m in 0..per_cluster {
                text.push_str(&format!(
                    "      - {{ node: n{m}, id: c{c}-n{m}, address: 10.{}.{}.{m}, role: worker, talosVersion: v1.12.4, kubeletVersion: v1.34.1, installerImage: ghcr.io/siderolabs/installer:v1.12.4, bootId: b{m}, labels: {{ zone: a, rack: r{m} }} }}\n",
                    c / 256,
                    c % 256
                ));
            }
        }
        parse("fleet.yaml", &text).unwrap()
    }

    #[test]
    fn ten_thousand_machines_read_as_yaml_and_as_json() {
        let inv = fleet(10_000);
        assert_eq!(
            inv.clusters
                .values()
                .map(|c| c.machines.len())
                .sum::<usize>(),
            10_000
        );
        let json = serde_json::to_string(&to_file(&inv)).unwrap();
        assert_eq!(parse("fleet.json", &json).unwrap(), inv);
    }

    #[test]
    fn a_yaml_inventory_beyond_the_limits_names_the_limit() {
        let text = "clusters:\n  - name: a\n    machines:\n      - { node: n, address: a, role: worker }\n      - { node: m, address: b, role: worker }\n";
        let tiny = Limits {
            max_nodes: 10,
            max_events: 1_000,
            max_total_scalar_bytes: 1_000,
        };
        let e = parse_yaml("x.yaml", text, &tiny).unwrap_err();
        assert!(
            matches!(&e, InventoryFileError::TooLarge { limit: 10, .. }),
            "{e:?}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains("the limit is 10")
                && msg.contains("100000 machines")
                && msg.contains("JSON"),
            "{msg}"
        );
        assert!(parse_yaml("x.yaml", text, &LIMITS).is_ok());
    }

    #[test]
    fn a_bad_json_inventory_says_where() {
        let e = parse(
            "x.json",
            "{\"clusters\": [{\"name\": \"a\", \"bogus\": 1}]}",
        )
        .unwrap_err();
        assert!(matches!(e, InventoryFileError::Json { .. }), "{e}");
        let src = std::error::Error::source(&e).unwrap().to_string();
        assert!(src.contains("bogus") && src.contains("column"), "{src}");
    }
}
