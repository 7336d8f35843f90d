//! Observations: what a decision needs observed ([`Needs`]), what was observed
//! ([`Observations`]) and the view the decisions read them through.

use super::*;

/// An observation that could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObsError {
    /// Worth waiting out (node rebooting, API away).
    pub transient: bool,
    /// What went wrong.
    pub message: String,
}

/// An observation, or why it could not be made.
pub type Obs<T> = Result<T, ObsError>;

/// Fresh observations, keyed like [`Needs`].
#[derive(Debug, Clone, Default)]
pub struct Observations {
    /// Talos nodes, by node name.
    pub talos: BTreeMap<String, Obs<TalosNode>>,
    /// Kubernetes nodes, by name.
    pub kube: BTreeMap<String, Obs<KubeNode>>,
    /// etcd's health, if asked.
    pub etcd: Option<Obs<EtcdHealth>>,
    /// Static-pod images, by node.
    pub images: BTreeMap<String, Obs<ComponentImages>>,
    /// Component flags from the machine configuration, by node.
    pub args: BTreeMap<String, Obs<ComponentArgs>>,
    /// Mirror pods, by node and component (`None`: no such pod).
    pub static_pods: BTreeMap<(String, Component), Obs<Option<StaticPod>>>,
    /// The version of a static-pod component's config resource on a node (`None`: the node
    /// publishes none).
    pub config_versions: BTreeMap<(String, Component), Obs<Option<String>>>,
    /// The job's snapshot file, if it exists.
    pub snapshot: Option<Obs<Option<SnapshotInfo>>>,
    /// The `VolumeAttachment`s that name a node, by node name.
    pub volumes: BTreeMap<String, Obs<Vec<VolumeAttachment>>>,
    /// Every Node of the cluster, by name (one list), if asked.
    pub nodes: Option<Obs<BTreeMap<String, KubeNode>>>,
    /// The evaluations of the gates [`Needs::gates`] asked for (made now). A probe never
    /// fails: a source it cannot ask gives a failed evaluation.
    pub gates: BTreeMap<GatePoint, Vec<crate::rollout::ports::GateEvaluation>>,
}

impl Observations {
    /// Add `other`'s entries (a later round of the same instant).
    pub fn merge(&mut self, other: Observations) {
        self.talos.extend(other.talos);
        self.kube.extend(other.kube);
        if other.etcd.is_some() {
            self.etcd = other.etcd;
        }
        self.images.extend(other.images);
        self.args.extend(other.args);
        self.static_pods.extend(other.static_pods);
        self.config_versions.extend(other.config_versions);
        if other.snapshot.is_some() {
            self.snapshot = other.snapshot;
        }
        self.gates.extend(other.gates);
        self.volumes.extend(other.volumes);
        if other.nodes.is_some() {
            self.nodes = other.nodes;
        }
    }
}

/// What a decision needs observed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Needs {
    /// Talos nodes.
    pub talos: BTreeSet<NodeTarget>,
    /// Kubernetes nodes, by name.
    pub kube: BTreeSet<String>,
    /// etcd health, asked through these control-plane nodes.
    pub etcd: Option<Vec<NodeTarget>>,
    /// Static-pod images of these nodes.
    pub images: BTreeSet<NodeTarget>,
    /// Component flags of these nodes.
    pub args: BTreeSet<NodeTarget>,
    /// Mirror pods, by node and component.
    pub static_pods: BTreeSet<(String, Component)>,
    /// Config versions, by node and component.
    pub config_versions: BTreeSet<(NodeTarget, Component)>,
    /// Whether the job's snapshot file is to be looked at.
    pub snapshot: bool,
    /// Evaluate these health gates.
    pub gates: Option<GateAsk>,
    /// The `VolumeAttachment`s of these nodes, by node name.
    pub volumes: BTreeSet<String>,
    /// Every Node of the cluster (one list).
    pub nodes: bool,
}

impl Needs {
    /// Whether nothing is needed.
    pub fn is_empty(&self) -> bool {
        self == &Needs::default()
    }
    /// How many observations are asked for.
    pub fn count(&self) -> usize {
        self.talos.len()
            + self.kube.len()
            + usize::from(self.etcd.is_some())
            + self.images.len()
            + self.args.len()
            + self.static_pods.len()
            + self.config_versions.len()
            + usize::from(self.snapshot)
            + usize::from(self.gates.is_some())
            + self.volumes.len()
            + usize::from(self.nodes)
    }
}

// ---------------------------------------------------------------------------------------------
// observations

pub(super) struct Eyes<'a> {
    pub(super) obs: &'a Observations,
    pub(super) missing: RefCell<Needs>,
}

pub(super) enum Seen<'a, T> {
    Missing,
    Transient(&'a str),
    Failed(&'a str),
    Got(&'a T),
}

pub(super) fn seen<T>(o: Option<&Obs<T>>) -> Seen<'_, T> {
    match o {
        None => Seen::Missing,
        Some(Ok(t)) => Seen::Got(t),
        Some(Err(e)) if e.transient => Seen::Transient(&e.message),
        Some(Err(e)) => Seen::Failed(&e.message),
    }
}

impl<'a> Eyes<'a> {
    pub(super) fn talos(&self, t: &NodeTarget) -> Seen<'a, TalosNode> {
        let s = seen(self.obs.talos.get(&t.node));
        if s.is_missing() {
            self.missing.borrow_mut().talos.insert(t.clone());
        }
        s
    }
    pub(super) fn kube(&self, node: &str) -> Seen<'a, KubeNode> {
        let s = seen(self.obs.kube.get(node));
        if s.is_missing() {
            self.missing.borrow_mut().kube.insert(node.to_string());
        }
        s
    }
    pub(super) fn etcd(&self, via: &[NodeTarget]) -> Seen<'a, EtcdHealth> {
        let s = seen(self.obs.etcd.as_ref());
        if s.is_missing() {
            self.missing.borrow_mut().etcd = Some(via.to_vec());
        }
        s
    }
    pub(super) fn images(&self, t: &NodeTarget) -> Seen<'a, ComponentImages> {
        let s = seen(self.obs.images.get(&t.node));
        if s.is_missing() {
            self.missing.borrow_mut().images.insert(t.clone());
        }
        s
    }
    pub(super) fn args(&self, t: &NodeTarget) -> Seen<'a, ComponentArgs> {
        let s = seen(self.obs.args.get(&t.node));
        if s.is_missing() {
            self.missing.borrow_mut().args.insert(t.clone());
        }
        s
    }
    pub(super) fn static_pod(&self, node: &str, c: Component) -> Seen<'a, Option<StaticPod>> {
        let key = (node.to_string(), c);
        let s = seen(self.obs.static_pods.get(&key));
        if s.is_missing() {
            self.missing.borrow_mut().static_pods.insert(key);
        }
        s
    }
    pub(super) fn config_version(&self, t: &NodeTarget, c: Component) -> Seen<'a, Option<String>> {
        let s = seen(self.obs.config_versions.get(&(t.node.clone(), c)));
        if s.is_missing() {
            self.missing
                .borrow_mut()
                .config_versions
                .insert((t.clone(), c));
        }
        s
    }
    pub(super) fn volumes(&self, node: &str) -> Seen<'a, Vec<VolumeAttachment>> {
        let s = seen(self.obs.volumes.get(node));
        if s.is_missing() {
            self.missing.borrow_mut().volumes.insert(node.to_string());
        }
        s
    }
    pub(super) fn nodes(&self) -> Seen<'a, BTreeMap<String, KubeNode>> {
        let s = seen(self.obs.nodes.as_ref());
        if s.is_missing() {
            self.missing.borrow_mut().nodes = true;
        }
        s
    }
    pub(super) fn gates(
        &self,
        ask: GateAsk,
    ) -> Option<&'a Vec<crate::rollout::ports::GateEvaluation>> {
        let s = self.obs.gates.get(&ask.point);
        if s.is_none() {
            self.missing.borrow_mut().gates = Some(ask);
        }
        s
    }
    pub(super) fn snapshot(&self) -> Seen<'a, Option<SnapshotInfo>> {
        let s = seen(self.obs.snapshot.as_ref());
        if s.is_missing() {
            self.missing.borrow_mut().snapshot = true;
        }
        s
    }
}
