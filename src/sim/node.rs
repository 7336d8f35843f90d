//! The contract between the simulator's Talos side and its kube-apiserver side.
//!
//! The Talos simulator owns each node's truth (running version, boot state, machine config); the
//! simulated kube-apiserver derives what Kubernetes shows (Node Ready, kubelet version, static
//! pods) from it through [`NodeSource`], the way a real kubelet reports what Talos booted.
//! The other way, the kube side's stored objects are what the control plane's etcd holds
//! ([`KeyspaceSource`]): the Talos side's `EtcdSnapshot` serves them as etcd's database.

use std::collections::BTreeMap;
use std::sync::Arc;

/// Facts about one simulated node, as the Talos side knows them right now.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeFacts {
    /// Node name (the Kubernetes node name, also the Talos `node` metadata target).
    pub name: String,
    /// The node's IP address, as reported in `status.addresses`.
    pub address: String,
    /// `true` for control-plane nodes (label `node-role.kubernetes.io/control-plane`).
    pub control_plane: bool,
    /// `false` while the node is rebooting or away (it then shows NotReady).
    pub up: bool,
    /// The Talos version it booted (`osImage: Talos (v1.13.9)`).
    pub talos_version: String,
    /// The kubelet version, e.g. `v1.34.1` (from the machine config's kubelet image tag).
    pub kubelet_version: String,
    /// Static pod component (`kube-apiserver`, `kube-controller-manager`, `kube-scheduler`)
    /// → image, for control-plane nodes; empty for workers.
    pub static_pod_images: BTreeMap<String, String>,
    /// Static pod component → the `talos.dev/config-version` its mirror pod carries (the
    /// version of the component's config resource it was rendered from).
    pub static_pod_config_versions: BTreeMap<String, String>,
    /// Static pod component → the `talos.dev/config-file-version` its mirror pod carries (the
    /// version of the node's `ConfigStatus` for static pods; the kube-apiserver only). A
    /// change restarts the pod, as any change of a static pod's manifest does.
    pub static_pod_config_file_versions: BTreeMap<String, String>,
    /// Static pod components that crash-loop with their current image (never Ready).
    pub crash_looping: std::collections::BTreeSet<String>,
    /// System extensions, name → version, and the Image Factory schematic as the extension
    /// `schematic`: what Talos publishes on the Node under `extensions.talos.dev/`.
    pub extensions: BTreeMap<String, String>,
}

/// One key of etcd's keyspace, as the kube-apiserver wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdKey {
    /// `/registry/<resource prefix>/[<namespace>/]<name>`.
    pub key: String,
    /// The stored object (JSON here; a default kube-apiserver stores protobuf).
    pub value: Vec<u8>,
    /// The revision that created the key.
    pub create_revision: i64,
    /// The revision of its last change (the object's `resourceVersion`).
    pub mod_revision: i64,
    /// Changes since it was created (1 at creation).
    pub version: i64,
}

/// The kube-apiserver's data as etcd holds it after a compaction at [`Keyspace::revision`]:
/// every live key once, at its newest revision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keyspace {
    /// etcd's current revision: that of the last write (the apiserver's newest
    /// `resourceVersion`), a deletion included.
    pub revision: i64,
    pub keys: Vec<EtcdKey>,
}

/// Read access to what the kube side stored, for the Talos side's etcd snapshots.
pub trait KeyspaceSource: Send + Sync + 'static {
    /// The keyspace now; `None` once the kube side is gone.
    fn keyspace(&self) -> Option<Keyspace>;
}

/// Read access to the Talos side's node facts. Implemented by the Talos simulator; tests of the
/// kube side can implement it over a plain map.
pub trait NodeSource: Send + Sync + 'static {
    /// All nodes, sorted by name.
    fn nodes(&self) -> Vec<NodeFacts>;
    /// One node, if it exists.
    fn node(&self, name: &str) -> Option<NodeFacts> {
        self.nodes().into_iter().find(|n| n.name == name)
    }
    /// The control-plane nodes, sorted by name: what the kube-apiserver's own version and
    /// instances derive from. The default filters [`Self::nodes`]; a source that can derive
    /// only these overrides it (the kube side asks after every change of the node facts, and
    /// deriving every worker each time made a rollout O(nodes²)).
    fn control_planes(&self) -> Vec<NodeFacts> {
        self.nodes()
            .into_iter()
            .filter(|n| n.control_plane)
            .collect()
    }
    /// A cheap value that changes whenever [`Self::nodes`] would return something different
    /// (a digest of the state the facts derive from), so that the kube side can tell that
    /// nothing changed without deriving every node; `None` (the default) when the source
    /// cannot tell, and the kube side then re-derives on every request.
    fn fingerprint(&self) -> Option<u64> {
        None
    }
    /// Each node's name and a digest that changes whenever that node's [`NodeFacts`] would,
    /// sorted by name, so that the kube side re-derives only the nodes that changed. The
    /// default hashes [`Self::nodes`]; a source that can tell more cheaply overrides it.
    fn node_fingerprints(&self) -> Vec<(String, u64)> {
        use std::hash::{Hash, Hasher};
        self.nodes()
            .into_iter()
            .map(|f| {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                f.hash(&mut h);
                (f.name, h.finish())
            })
            .collect()
    }
    /// [`Self::node_fingerprints`] of only the nodes whose digest changed since
    /// [`Self::fingerprint`] returned `since`, sorted by name, so that a pass costs O(nodes
    /// changed); `None` (the default) when the source cannot tell, or when the node list
    /// itself changed since: the caller then reads [`Self::node_fingerprints`]. A node changed
    /// after a later `fingerprint` call may be listed too.
    fn node_fingerprints_since(&self, since: u64) -> Option<Vec<(String, u64)>> {
        let _ = since;
        None
    }
    /// Node name → how many server-side drains the node has started (Talos' legacy
    /// `MachineService.Upgrade` drains its node before it installs: siderolabs/talos
    /// `v1alpha1_sequencer.go` `Upgrade`, `CordonAndDrainNode`), for the nodes that started
    /// one, sorted by name. The kube side evicts that node's pods as upstream's
    /// `pkg/kubernetes` `Client.Drain` does, once per count it has not seen. The default: no
    /// drains (a source with no Talos upgrade).
    fn talos_drains(&self) -> Vec<(String, u64)> {
        Vec::new()
    }
    /// Called once by the kube side when it starts on this source: from then on its stored
    /// objects are the etcd keyspace the source's control plane serves. The default ignores it
    /// (a source with no etcd).
    fn attach_keyspace(&self, keyspace: Arc<dyn KeyspaceSource>) {
        let _ = keyspace;
    }
}
