//! The observed inventory: what medea last saw of each cluster.
//!
//! **Owns:** observed clusters, machines, versions and health; the per-cluster observed
//! generation.
//! **May depend on:** the `inventory` row of design/architecture.md's code map (of the store,
//! its records only). [`file`] reads the hand-written inventory files `medea plan --observed`
//! rehearses with.
//! Architecture Invariant: the generation of a cluster changes exactly when something observed
//! about it changes ([`ObservedCluster::observe`]); plans record the generations they were
//! computed from, so any observed change makes them stale.

pub mod census;
pub mod file;
pub mod preflight;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::store::{Record, Table};
use crate::version::{KubeVersion, TalosVersion};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MachineRole {
    Controlplane,
    Worker,
}

/// One machine as last observed (Talos API + Kubernetes Node).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Machine {
    /// Kubernetes node name; the key of the machine in its cluster.
    pub node: String,
    /// Talos machine id (or the node's system UUID).
    pub id: String,
    /// Address the Talos API is reached at for this node.
    pub address: String,
    pub role: MachineRole,
    /// Running Talos version; `None` when the node could not be asked.
    pub talos_version: Option<TalosVersion>,
    /// Installer image the node was installed/upgraded from (with tag), when known.
    pub installer_image: Option<String>,
    /// Image Factory schematic id, when the node runs one.
    pub schematic: Option<String>,
    /// The Talos platform the node runs on (`metal`, `aws`, `nocloud`, …; `Version` →
    /// `platform.name`), when its Talos API answered. Names its Image Factory installer
    /// (`factory.talos.dev/<platform>-installer/<schematic>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<String>,
    /// System extensions the node runs, name → version, as Talos publishes them on its Node
    /// (`extensions.talos.dev/<name>` labels and annotations; the `schematic` entry is
    /// [`Machine::schematic`], not an extension).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extensions: BTreeMap<String, String>,
    /// Whether the node booted with UEFI SecureBoot (COSI
    /// `runtime/SecurityStates.talos.dev/securitystate`, `secureBoot`), when its Talos API
    /// answered. A SecureBoot node is upgraded only with a SecureBoot installer
    /// (`<platform>-installer-secureboot/<schematic>`), a non-SecureBoot one only without.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure_boot: Option<bool>,
    /// The registry host of the Image Factory the node was built by (the host of `apiUrl` in
    /// COSI `runtime/ImageFactorySchematics.runtime.talos.dev/image-factory-schematic`, from
    /// Talos 1.14; else the host of a factory installer it was installed from), when known: a
    /// self-hosted or Omni factory is not `factory.talos.dev`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub factory_host: Option<String>,
    pub kubelet_version: Option<KubeVersion>,
    pub ready: bool,
    pub cordoned: bool,
    /// Whether the Talos API answered at the last refresh.
    pub reachable: bool,
    pub boot_id: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

impl Machine {
    /// A machine that is away: cordoned, NotReady or unreachable. Wave sizing counts these
    /// against `maxUnavailable`.
    pub fn unavailable(&self) -> bool {
        self.cordoned || !self.ready || !self.reachable
    }
}

/// One cluster as last observed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObservedCluster {
    pub name: String,
    /// The lowest kube-apiserver version running (what `upgrade-k8s` calls "from").
    pub kubernetes_version: Option<KubeVersion>,
    /// Off by default; only `medea cluster enable-rollouts` turns it on.
    pub rollouts_enabled: bool,
    /// Bumped on every observed change.
    pub generation: u64,
    /// Machines by node name.
    pub machines: BTreeMap<String, Machine>,
    /// What the preflight checks read (deprecated APIs, PDBs, etcd, pressure, credentials).
    #[serde(
        default,
        skip_serializing_if = "preflight::PreflightObservations::is_empty"
    )]
    pub preflight: preflight::PreflightObservations,
}

impl ObservedCluster {
    pub fn new(name: impl Into<String>) -> ObservedCluster {
        ObservedCluster {
            name: name.into(),
            kubernetes_version: None,
            rollouts_enabled: false,
            generation: 0,
            machines: BTreeMap::new(),
            preflight: preflight::PreflightObservations::default(),
        }
    }

    /// The cluster after a fresh observation of versions and machines, keeping the preflight
    /// observations: same generation when nothing changed, the next one otherwise.
    /// `rollouts_enabled` is not observed and is kept.
    pub fn observe(
        &self,
        kubernetes_version: Option<KubeVersion>,
        machines: BTreeMap<String, Machine>,
    ) -> ObservedCluster {
        self.observe_with(kubernetes_version, machines, self.preflight.clone())
    }

    /// [`Self::observe`] with fresh preflight observations too.
    pub fn observe_with(
        &self,
        kubernetes_version: Option<KubeVersion>,
        machines: BTreeMap<String, Machine>,
        preflight: preflight::PreflightObservations,
    ) -> ObservedCluster {
        let changed = self.kubernetes_version != kubernetes_version
            || self.machines != machines
            || self.preflight != preflight;
        ObservedCluster {
            name: self.name.clone(),
            kubernetes_version,
            rollouts_enabled: self.rollouts_enabled,
            generation: if changed {
                self.generation + 1
            } else {
                self.generation
            },
            machines,
            preflight,
        }
    }

    /// The cluster with `rollouts_enabled` set. This is a gate, not an observation: it does
    /// not move the generation, so an approved plan waiting for the gate stays current. (Job
    /// creation compares the whole record, so the gate cannot change underneath a start.)
    pub fn with_rollouts_enabled(&self, enabled: bool) -> ObservedCluster {
        let mut c = self.clone();
        c.rollouts_enabled = enabled;
        c
    }
}

impl Record for ObservedCluster {
    const TABLE: Table = Table::Inventory;
    const KIND: &'static str = "observed-cluster";
    const SCHEMA: u32 = 1;
}

/// Store key of a cluster's record.
pub fn cluster_key(name: &str) -> String {
    format!("cluster/{name}")
}

/// The `rolloutsEnabled` gate of a stored cluster record (`bytes`, stored under `key`), read
/// without decoding its machines: the executor checks it before every mutating command.
pub fn rollouts_enabled(key: &str, bytes: &[u8]) -> Result<bool, crate::store::StoreError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Gate {
        rollouts_enabled: bool,
    }
    crate::store::record::decode_view_or(key, bytes, |c: ObservedCluster| Gate {
        rollouts_enabled: c.rollouts_enabled,
    })
    .map(|g| g.rollouts_enabled)
}

/// The generation of every observed cluster (name → generation), read without decoding
/// their machines: all a plan's basis holds of the inventory.
pub fn generations(
    store: &dyn crate::store::Store,
) -> Result<BTreeMap<String, u64>, crate::store::StoreError> {
    #[derive(Deserialize)]
    struct Head {
        name: String,
        generation: u64,
    }
    let mut out = BTreeMap::new();
    for (key, bytes) in store.scan(ObservedCluster::TABLE, "cluster/")? {
        let h = crate::store::record::decode_view_or(&key, &bytes, |c: ObservedCluster| Head {
            name: c.name,
            generation: c.generation,
        })?;
        out.insert(h.name, h.generation);
    }
    Ok(out)
}

/// Every observed cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    /// Shared (`Arc`): the server's decoded inventory (`ops::replan::InventoryCache`) and the
    /// planner's memo hold the same records.
    pub clusters: BTreeMap<String, std::sync::Arc<ObservedCluster>>,
}

impl Inventory {
    /// A transaction writing every cluster record (seeding, tests, rehearsals).
    pub fn save_txn(&self) -> crate::store::Txn {
        let mut txn = crate::store::Txn::new();
        for c in self.clusters.values() {
            txn.push_record(cluster_key(&c.name), c.as_ref());
        }
        txn
    }

    /// Write every cluster record in one transaction.
    pub fn save(&self, store: &dyn crate::store::Store) -> Result<(), crate::store::StoreError> {
        store.commit(self.save_txn())
    }

    pub fn load(store: &dyn crate::store::Store) -> Result<Inventory, crate::store::StoreError> {
        use crate::store::StoreExt;
        let clusters = store
            .scan_records::<ObservedCluster>("cluster/")?
            .into_iter()
            .map(|(_, c)| (c.name.clone(), std::sync::Arc::new(c)))
            .collect();
        Ok(Inventory { clusters })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(node: &str) -> Machine {
        Machine {
            node: node.into(),
            id: format!("id-{node}"),
            address: "10.0.0.1".into(),
            role: MachineRole::Worker,
            talos_version: Some(TalosVersion::parse("v1.12.4").unwrap()),
            installer_image: None,
            schematic: None,
            platform: None,
            secure_boot: None,
            factory_host: None,
            extensions: BTreeMap::new(),
            kubelet_version: Some(KubeVersion::parse("v1.34.1").unwrap()),
            ready: true,
            cordoned: false,
            reachable: true,
            boot_id: Some("b1".into()),
            labels: BTreeMap::new(),
        }
    }

    #[test]
    fn generation_moves_only_on_change() {
        let c = ObservedCluster::new("home");
        let ms: BTreeMap<_, _> = [("w-1".to_string(), machine("w-1"))].into();
        let k = Some(KubeVersion::parse("v1.34.1").unwrap());
        let c1 = c.observe(k.clone(), ms.clone());
        assert_eq!(c1.generation, 1);
        let c2 = c1.observe(k.clone(), ms.clone());
        assert_eq!(c2.generation, 1, "same observation, same generation");
        let mut ms2 = ms.clone();
        ms2.get_mut("w-1").unwrap().boot_id = Some("b2".into());
        assert_eq!(
            c2.observe(k, ms2).generation,
            2,
            "a reboot is an observed change"
        );
        assert_eq!(
            c2.with_rollouts_enabled(true).generation,
            1,
            "a gate is not an observation"
        );
        assert!(c2.with_rollouts_enabled(true).rollouts_enabled);
        assert!(
            !c2.with_rollouts_enabled(true)
                .with_rollouts_enabled(false)
                .rollouts_enabled
        );
    }

    #[test]
    fn gate_and_generation_views_agree_with_the_full_record() {
        use crate::store::fjall::FjallStore;
        use crate::store::record::encode;
        use crate::store::{Store, Txn};
        let dir = tempfile::tempdir().unwrap();
        let store = FjallStore::open(&dir.path().join("s")).unwrap();
        let ms: BTreeMap<_, _> = [("w-1".to_string(), machine("w-1"))].into();
        let a = ObservedCluster::new("a")
            .observe(None, ms.clone())
            .with_rollouts_enabled(true);
        let mut ms2 = ms.clone();
        ms2.get_mut("w-1").unwrap().ready = false;
        let b = ObservedCluster::new("b")
            .observe(None, ms)
            .observe(None, ms2);
        store
            .commit(
                Txn::new()
                    .put_record(cluster_key("a"), &a)
                    .put_record(cluster_key("b"), &b),
            )
            .unwrap();
        let full = Inventory::load(&store).unwrap();
        let gens = generations(&store).unwrap();
        assert_eq!(gens, [("a".to_string(), 1), ("b".to_string(), 2)].into());
        for (name, c) in &full.clusters {
            assert_eq!(gens[name], c.generation);
            let key = cluster_key(name);
            let bytes = store.get(Table::Inventory, &key).unwrap().unwrap();
            assert_eq!(rollouts_enabled(&key, &bytes).unwrap(), c.rollouts_enabled);
        }
        assert!(rollouts_enabled(&cluster_key("a"), &encode(&a)).unwrap());
        assert!(!rollouts_enabled(&cluster_key("b"), &encode(&b)).unwrap());
        // Not a cluster record: the view refuses it and the full decode reports it.
        let wrong = br#"{"kind":"plan","schema":1,"data":{"rolloutsEnabled":true}}"#;
        assert!(rollouts_enabled("cluster/x", wrong).is_err());
        // A newer schema is refused, never read through the view.
        let newer = br#"{"kind":"observed-cluster","schema":99,"data":{"rolloutsEnabled":true}}"#;
        assert!(rollouts_enabled("cluster/x", newer).is_err());
    }
}
