//! In-memory fakes of both ports with side-effect counters and fault injection, for tests and
//! the crash harness. One [`FakeCluster`] is the truth of every node; [`FakeTalos`] and
//! [`FakeKube`] are its two faces, the way the simulator's Talos side feeds its kube side.
//!
//! [`FakeCluster::persistent`] backs the state with a JSON file rewritten (fsync + rename)
//! after every change, so a child process killed mid-rollout leaves the cluster where it was.
//!
//! Behaviour: a reboot takes the node down for `reboot_polls` Talos observations (unreachable,
//! NotReady), then it boots its staged version with a new boot id. Counters count calls the node
//! accepted (a call refused by an injected `UNAVAILABLE` does not count).

#![allow(
    clippy::expect_used,
    reason = "test support (the crate's tests and the crash harness), never used by `serve`: a broken fake must fail the test that drives it, loudly; its lookups follow a presence check in the same locked section"
)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ports::{
    CORDONED_BY_ANNOTATION, Component, ComponentArgs, ComponentImages, CordonedBy, Detail,
    DrainOutcome, EtcdHealth, EtcdMember, FOREIGN_CORDON_ANNOTATIONS, ImageNamespace, KubeNode,
    KubePort, MachineStage, Manifest, NextBoot, NodeTaint, NodeTarget, PortError, SnapshotInfo,
    SnapshotStreamed, StaticPod, TalosNode, TalosPort, UpgradeMethod,
};
use super::ports::{GateContext, GateEvaluation, GateSample, GateVerdict, HealthProbe};
use super::sequencer::{image_version, split_image};
use crate::plan::health::Gate;
use crate::version::{KubeVersion, TalosVersion};

/// A health probe over the fake cluster: each gate is evaluated by its [`FakeGate`] rule in
/// [`FakeState::gates`] (persisted, so the crash harness's children agree).
#[derive(Debug, Clone)]
pub struct FakeProbe(pub FakeCluster);

impl HealthProbe for FakeProbe {
    async fn evaluate(&self, gate: &Gate, _ctx: &GateContext) -> GateEvaluation {
        self.0.edit(|s| {
            let rule = s.gates.get(&gate.name).cloned().unwrap_or_default();
            let mut samples = Vec::new();
            let mut why = None;
            if rule.error_next > 0 {
                if let Some(r) = s.gates.get_mut(&gate.name) {
                    r.error_next -= 1;
                }
                s.gate_log.push(format!("{} error", gate.name));
                return GateEvaluation {
                    gate: gate.name.clone(),
                    verdict: GateVerdict::Inconclusive,
                    samples,
                    detail: "the source is unreachable (timed out)".into(),
                    dry_run: gate.dry_run,
                    error: true,
                };
            }
            if rule.inconclusive_next > 0 {
                if let Some(r) = s.gates.get_mut(&gate.name) {
                    r.inconclusive_next -= 1;
                }
                s.gate_log.push(format!("{} inconclusive", gate.name));
                return GateEvaluation {
                    gate: gate.name.clone(),
                    verdict: GateVerdict::Inconclusive,
                    samples,
                    detail: "the query returned no value".into(),
                    dry_run: gate.dry_run,
                    error: false,
                };
            }
            if rule.fail {
                why = Some("the gate is set to fail".to_string());
            }
            if let Some((nodes, v)) = &rule.fail_while {
                for n in nodes {
                    if s.nodes
                        .get(n)
                        .is_some_and(|x| &x.version == v && !x.rebooting)
                    {
                        samples.push(GateSample {
                            labels: [("node".to_string(), n.clone())].into(),
                            value: "0".into(),
                        });
                        why.get_or_insert_with(|| format!("`{n}` runs {v}"));
                    }
                }
            }
            if why.is_none() && rule.fail_next > 0 {
                if let Some(r) = s.gates.get_mut(&gate.name) {
                    r.fail_next -= 1;
                }
                why = Some("flapping".into());
            }
            let verdict = if why.is_some() {
                GateVerdict::Fail
            } else {
                GateVerdict::Pass
            };
            s.gate_log.push(format!(
                "{} {}",
                gate.name,
                if verdict == GateVerdict::Pass {
                    "pass"
                } else {
                    "fail"
                }
            ));
            GateEvaluation {
                gate: gate.name.clone(),
                verdict,
                samples,
                detail: why.unwrap_or_else(|| "ok".into()),
                dry_run: gate.dry_run,
                error: false,
            }
        })
    }
}

/// A fault, as data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "fault")]
pub enum Fault {
    /// After its next reboot the node never comes back.
    NeverReturns {
        /// The node.
        node: String,
    },
    /// The node reboots into its old version (the bootloader fell back), with a new boot id.
    SilentRevert {
        /// The node.
        node: String,
    },
    /// The installer exits non-zero.
    UpgradeExitCode {
        /// The node.
        node: String,
        /// The installer's exit code.
        code: i32,
    },
    /// A PodDisruptionBudget refuses every eviction on the node.
    PdbBlocks {
        /// The node.
        node: String,
        /// The PodDisruptionBudget's name.
        pdb: String,
    },
    /// `EtcdSnapshot` fails.
    SnapshotFails,
    /// `EtcdForfeitLeadership` on `node` fails (etcd's leader transfer timing out) the next
    /// `calls` times, the leadership staying where it was unless `moved` (the transfer
    /// finished after the client gave up).
    ForfeitFails {
        /// The node.
        node: String,
        /// How many calls fail.
        calls: u32,
        /// The leadership moved anyway.
        #[serde(default)]
        moved: bool,
    },
    /// The next `calls` Talos API calls (any node) fail with UNAVAILABLE before reaching it.
    TalosUnavailable {
        /// How many calls fail.
        calls: u32,
    },
    /// The kube-apiserver is unreachable while a control-plane node is down, and for the next
    /// `calls` Kubernetes calls after it is back (static pods restarting).
    ApiserverAwayDuringControlPlaneReboot {
        /// Kubernetes calls after the node is back that still fail.
        calls: u32,
    },
    /// The call `op` on `node` takes effect, then the reply is lost (UNAVAILABLE), once.
    LostReply {
        /// The node.
        node: String,
        /// The call (`upgrade`, `reboot`, `cordon`, ...).
        op: String,
    },
    /// Every Upgrade call to `node` is answered UNAVAILABLE before it reaches the node (no
    /// trace is left): a transport that never lets the call through.
    UpgradeNeverArrives {
        /// The node.
        node: String,
    },
    /// The kubelet on `node` keeps `component`'s mirror pod at the config version it had
    /// (image and Ready move on; `talos.dev/config-version` does not).
    StaleConfigVersion {
        /// The node.
        node: String,
        /// The static-pod component.
        component: Component,
    },
}

/// Calls a node accepted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeCounters {
    /// Image pulls.
    pub pull: u32,
    /// Cordons.
    pub cordon: u32,
    /// Uncordons.
    pub uncordon: u32,
    /// Drains.
    pub drain: u32,
    /// Upgrade calls.
    pub upgrade: u32,
    /// Reboot calls.
    pub reboot: u32,
    /// Static-pod image changes.
    pub set_image: u32,
    /// Rollback calls.
    #[serde(default)]
    pub rollback: u32,
}

/// A fake node's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FakeNode {
    /// The address its Talos API answers on.
    pub address: String,
    /// Whether it is a control-plane node.
    pub control_plane: bool,
    /// The Talos version it runs.
    pub version: TalosVersion,
    /// Boots so far.
    pub boots: u32,
    /// Changes at every boot.
    pub boot_id: String,
    /// Installed but not booted.
    pub staged: Option<TalosVersion>,
    /// What `MachineStatus` reports.
    pub stage: MachineStage,
    /// Down: rebooting, unreachable and NotReady until a Talos observation finds it back.
    pub rebooting: bool,
    /// Talos observations that still find it down; `u32::MAX` = never back.
    pub down_polls: u32,
    /// Whether the node is cordoned.
    pub cordoned: bool,
    /// Its Node's annotations (who cordoned it: `medea.dev/cordoned-by`, issue #48).
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Its Node's taints.
    #[serde(default)]
    pub taints: Vec<NodeTaint>,
    /// Taint and untaint calls it accepted (apart from [`NodeCounters`]: pacing, issue #35).
    #[serde(default)]
    pub taint_calls: (u32, u32),
    /// NotReady in Kubernetes while its Talos side is fine (a kubelet someone else broke).
    #[serde(default)]
    pub not_ready: bool,
    /// The kubelet's version.
    pub kubelet: KubeVersion,
    /// The image of each static-pod component.
    pub images: ComponentImages,
    /// `extraArgs` of its components (the Kubernetes upgrade checks read them).
    #[serde(default)]
    pub args: ComponentArgs,
    /// Whether the node reports its next boot (`NextBoot::Unknown` otherwise).
    pub reports_next_boot: bool,
    /// Talos observations that still find it `Booting` and not ready after a boot (its services
    /// healthy and its Kubernetes node Ready already, as happens before `MachineStatus` is).
    #[serde(default)]
    pub booting: u32,
    /// The version of each static-pod component's config resource (absent = 1), bumped by
    /// every apply that changes the component's image.
    #[serde(default)]
    pub config_versions: BTreeMap<Component, u64>,
    /// The `talos.dev/config-version` each mirror pod shows (absent = 1).
    #[serde(default)]
    pub pod_config_versions: BTreeMap<Component, u64>,
    /// The other boot slot: the version the node ran before its last upgrade (A/B).
    #[serde(default)]
    pub previous: Option<TalosVersion>,
    /// `Rollback` flipped the default slot: the next boot runs `previous` (a second call flips
    /// it back, as Talos' bootloader does).
    #[serde(default)]
    pub rollback_pending: bool,
    /// The calls it accepted.
    pub counters: NodeCounters,
}

impl FakeNode {
    /// Whether it is down (rebooting and not back yet).
    pub fn down(&self) -> bool {
        self.rebooting
    }

    /// Its Node, as the Kubernetes port reports it.
    pub fn kube_node(&self) -> KubeNode {
        KubeNode {
            ready: !self.down() && !self.not_ready,
            kubelet_version: Some(self.kubelet.clone()),
            unschedulable: self.cordoned,
            taints: self.taints.clone(),
            cordoned_by: self
                .annotations
                .get(CORDONED_BY_ANNOTATION)
                .map(|j| CordonedBy::Job(j.clone()))
                .or_else(|| {
                    FOREIGN_CORDON_ANNOTATIONS
                        .iter()
                        .find(|a| self.annotations.contains_key(**a))
                        .map(|a| CordonedBy::Annotation((*a).to_string()))
                }),
        }
    }
}

/// The whole fake cluster: nodes, faults, timing and counters (persisted as JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FakeState {
    /// The nodes, by name.
    pub nodes: BTreeMap<String, FakeNode>,
    /// Faults still armed.
    pub faults: Vec<Fault>,
    /// Talos observations a rebooting node stays away.
    pub reboot_polls: u32,
    /// Talos observations a node that came back stays `Booting` (not ready) before `Running`.
    #[serde(default)]
    pub booting_polls: u32,
    /// etcd snapshots taken.
    pub snapshots: u32,
    /// Manifest syncs applied.
    pub manifest_applies: u32,
    /// Kubernetes calls left that find the apiserver away (see the fault).
    #[serde(default)]
    pub apiserver_away: u32,
    /// Every accepted mutating call, in order (`op node`), but the pacing taints'.
    pub log: Vec<String>,
    /// Every accepted taint and untaint (issue #35, pacing), in order (`op node`): kept apart
    /// from [`FakeState::log`], whose order the lifecycle tests read.
    #[serde(default)]
    pub pacing_log: Vec<String>,
    /// How [`FakeProbe`] evaluates each gate, by gate name (absent: it passes).
    #[serde(default)]
    pub gates: BTreeMap<String, FakeGate>,
    /// Gate evaluations [`FakeProbe`] made, in order (`gate verdict`).
    #[serde(default)]
    pub gate_log: Vec<String>,
    /// `VolumeAttachment`s naming each node (absent: none), as a test sets them.
    #[serde(default)]
    pub volume_attachments: BTreeMap<String, Vec<crate::rollout::ports::VolumeAttachment>>,
    /// The control-plane node whose etcd member leads (`None`: the members report no leader,
    /// as before the fake knew one). A leader that goes down is replaced by the first other
    /// control plane that is up, by name.
    #[serde(default)]
    pub etcd_leader: Option<String>,
    /// Every `EtcdForfeitLeadership` call a node accepted, in order (`node -> new leader`, or
    /// `node` when it did not lead).
    #[serde(default)]
    pub forfeits: Vec<String>,
}

/// How [`FakeProbe`] evaluates a gate, from the fake cluster's state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FakeGate {
    /// Fails always (e.g. a critical alert firing).
    #[serde(default)]
    pub fail: bool,
    /// Fails while any of these nodes runs `version` (a workload that breaks on it).
    #[serde(default)]
    pub fail_while: Option<(Vec<String>, TalosVersion)>,
    /// Evaluations left that fail before the gate passes (a flapping signal).
    #[serde(default)]
    pub fail_next: u32,
    /// Evaluations left that cannot tell (an answer without data) before the rules above
    /// decide (issue #35); counted against `inconclusiveLimit`.
    #[serde(default)]
    pub inconclusive_next: u32,
    /// Evaluations left whose source cannot be asked (a timeout, issue #51), before
    /// `inconclusive_next` and the rules above; counted against `consecutiveErrorLimit`.
    #[serde(default)]
    pub error_next: u32,
}

/// A node to create.
#[derive(Debug, Clone)]
pub struct FakeNodeSpec {
    /// The node name.
    pub name: String,
    /// Its address.
    pub address: String,
    /// Whether it is a control-plane node.
    pub control_plane: bool,
    /// The Talos version it runs.
    pub talos: TalosVersion,
    /// The kubelet's version.
    pub kube: KubeVersion,
}

impl FakeNodeSpec {
    /// A node at a generated address.
    pub fn new(name: &str, control_plane: bool, talos: &str, kube: &str) -> FakeNodeSpec {
        FakeNodeSpec {
            name: name.to_string(),
            address: format!(
                "10.0.0.{}",
                10 + name.bytes().map(u32::from).sum::<u32>() % 200
            ),
            control_plane,
            talos: TalosVersion::parse(talos).expect("test version"),
            kube: KubeVersion::parse(kube).expect("test version"),
        }
    }
}

/// The shared truth behind [`FakeTalos`] and [`FakeKube`].
#[derive(Debug, Clone)]
pub struct FakeCluster {
    inner: Arc<Mutex<FakeState>>,
    file: Option<PathBuf>,
    observing: Arc<Observing>,
}

/// Talos node observations in flight now, and the most there ever were at once (not part of
/// the persisted state).
#[derive(Debug, Default)]
struct Observing {
    now: std::sync::atomic::AtomicUsize,
    max: std::sync::atomic::AtomicUsize,
    /// Give the runtime one turn inside every observation, so that concurrent ones overlap.
    yielding: std::sync::atomic::AtomicBool,
    /// Observations of each node made while it was drained and not upgraded yet.
    drained: Mutex<BTreeMap<String, usize>>,
}

fn unavailable(op: &'static str, node: &str, why: &str) -> PortError {
    PortError::transient(
        op,
        node,
        Detail(format!("rpc error: code = Unavailable desc = {why}")),
    )
}

fn failed(op: &'static str, node: &str, why: impl Into<String>) -> PortError {
    PortError::failed(op, node, Detail(why.into()))
}

impl FakeCluster {
    /// The most Talos node observations that were ever in flight at once. Observations answer
    /// at once unless [`Self::yield_in_observations`] was called, so only then can they overlap.
    pub fn max_concurrent_observations(&self) -> usize {
        self.observing.max.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// How often each node was observed while it was drained and waiting for its Upgrade call.
    pub fn observations_while_drained(&self) -> BTreeMap<String, usize> {
        self.observing
            .drained
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// From now on, every Talos node observation gives the runtime one turn before it answers.
    pub fn yield_in_observations(&self) {
        self.observing
            .yielding
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// A cluster of `specs`, in memory.
    pub fn new(specs: &[FakeNodeSpec]) -> FakeCluster {
        let nodes = specs
            .iter()
            .map(|s| {
                let mut images = ComponentImages::new();
                if s.control_plane {
                    for c in Component::STATIC_PODS {
                        images.insert(c, format!("{}:{}", c.default_repository(), s.kube));
                    }
                    images.insert(
                        Component::Proxy,
                        format!("{}:{}", Component::Proxy.default_repository(), s.kube),
                    );
                }
                images.insert(
                    Component::Kubelet,
                    format!("{}:{}", Component::Kubelet.default_repository(), s.kube),
                );
                (
                    s.name.clone(),
                    FakeNode {
                        address: s.address.clone(),
                        control_plane: s.control_plane,
                        version: s.talos.clone(),
                        boots: 1,
                        boot_id: format!("{}-boot-1", s.name),
                        staged: None,
                        stage: MachineStage::Running,
                        rebooting: false,
                        down_polls: 0,
                        cordoned: false,
                        annotations: BTreeMap::new(),
                        taints: Vec::new(),
                        taint_calls: (0, 0),
                        not_ready: false,
                        kubelet: s.kube.clone(),
                        images,
                        args: ComponentArgs::new(),
                        reports_next_boot: true,
                        booting: 0,
                        config_versions: BTreeMap::new(),
                        pod_config_versions: BTreeMap::new(),
                        previous: None,
                        rollback_pending: false,
                        counters: NodeCounters::default(),
                    },
                )
            })
            .collect();
        FakeCluster {
            inner: Arc::new(Mutex::new(FakeState {
                nodes,
                faults: Vec::new(),
                reboot_polls: 1,
                booting_polls: 0,
                snapshots: 0,
                manifest_applies: 0,
                apiserver_away: 0,
                log: Vec::new(),
                pacing_log: Vec::new(),
                gates: BTreeMap::new(),
                gate_log: Vec::new(),
                volume_attachments: BTreeMap::new(),
                etcd_leader: None,
                forfeits: Vec::new(),
            })),
            file: None,
            observing: Arc::default(),
        }
    }

    /// Load a cluster saved with [`FakeCluster::save`]; every change is written back.
    pub fn persistent(path: &Path) -> std::io::Result<FakeCluster> {
        let bytes = std::fs::read(path)?;
        let state: FakeState = serde_json::from_slice(&bytes)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        Ok(FakeCluster {
            inner: Arc::new(Mutex::new(state)),
            file: Some(path.to_path_buf()),
            observing: Arc::default(),
        })
    }

    /// Write the state to `path` (write, fsync, rename).
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let state = self.state();
        write_state(path, &state)
    }

    /// Its Talos port.
    pub fn talos(&self) -> FakeTalos {
        FakeTalos(self.clone())
    }
    /// Its Kubernetes port.
    pub fn kube(&self) -> FakeKube {
        FakeKube(self.clone())
    }

    /// A copy of the current state.
    pub fn state(&self) -> FakeState {
        self.inner.lock().expect("fake lock").clone()
    }

    /// The cluster with `f` armed.
    pub fn with_fault(self, f: Fault) -> FakeCluster {
        self.edit(|s| s.faults.push(f));
        self
    }

    /// Change the state (test setup).
    pub fn edit<R>(&self, f: impl FnOnce(&mut FakeState) -> R) -> R {
        let mut s = self.inner.lock().expect("fake lock");
        let r = f(&mut s);
        self.persist(&s);
        r
    }

    /// How the ports address `node`.
    pub fn node_target(&self, node: &str) -> NodeTarget {
        let s = self.state();
        NodeTarget {
            node: node.to_string(),
            address: s.nodes[node].address.clone(),
        }
    }

    fn persist(&self, s: &FakeState) {
        if let Some(path) = &self.file {
            write_state(path, s).expect("fake state file is writable");
        }
    }

    /// Run `f` on the state as one Talos call: injected UNAVAILABLE first, then the effect,
    /// persisted before the reply.
    fn talos_call<R>(
        &self,
        op: &'static str,
        node: &str,
        f: impl FnOnce(&mut FakeState) -> Result<R, PortError>,
    ) -> Result<R, PortError> {
        let mut s = self.inner.lock().expect("fake lock");
        if let Some(Fault::TalosUnavailable { calls }) = s
            .faults
            .iter_mut()
            .find(|f| matches!(f, Fault::TalosUnavailable { calls } if *calls > 0))
        {
            *calls -= 1;
            self.persist(&s);
            return Err(unavailable(op, node, "injected"));
        }
        if !s.nodes.contains_key(node) {
            return Err(failed(op, node, format!("no node `{node}`")));
        }
        let r = f(&mut s);
        let r = match r {
            Ok(v) if take_lost_reply(&mut s, node, op) => {
                drop(v);
                Err(unavailable(op, node, "connection reset after the call"))
            }
            r => r,
        };
        self.persist(&s);
        r
    }

    fn kube_call<R>(
        &self,
        op: &'static str,
        node: &str,
        f: impl FnOnce(&mut FakeState) -> Result<R, PortError>,
    ) -> Result<R, PortError> {
        let mut s = self.inner.lock().expect("fake lock");
        let fault = s
            .faults
            .iter()
            .any(|f| matches!(f, Fault::ApiserverAwayDuringControlPlaneReboot { .. }));
        let cp_down = s.nodes.values().any(|n| n.control_plane && n.down());
        if fault && (cp_down || s.apiserver_away > 0) {
            if !cp_down {
                s.apiserver_away -= 1;
            }
            self.persist(&s);
            return Err(unavailable(
                op,
                node,
                "dial tcp 10.0.0.1:6443: connect: connection refused",
            ));
        }
        if !node.is_empty() && !s.nodes.contains_key(node) {
            return Err(failed(op, node, format!("nodes \"{node}\" not found")));
        }
        let r = f(&mut s);
        let r = match r {
            Ok(v) if take_lost_reply(&mut s, node, op) => {
                drop(v);
                Err(unavailable(op, node, "connection reset after the call"))
            }
            r => r,
        };
        self.persist(&s);
        r
    }

    // -- the Talos side, synchronous

    /// The Talos port's node observation.
    pub fn talos_node(&self, t: &NodeTarget) -> Result<TalosNode, PortError> {
        self.talos_call("version", &t.node, |s| {
            let revert = s.faults.contains(&Fault::SilentRevert {
                node: t.node.clone(),
            });
            let booting_polls = s.booting_polls;
            let n = s.nodes.get_mut(&t.node).expect("checked");
            if n.rebooting {
                if n.down_polls > 0 {
                    if n.down_polls != u32::MAX {
                        n.down_polls -= 1;
                    }
                    return Err(unavailable("version", &t.node, "connection refused"));
                }
                boot(n, &t.node, revert);
                n.booting = booting_polls;
            }
            let booting = n.booting > 0;
            if booting {
                n.booting -= 1;
            }
            Ok(TalosNode {
                version: n.version.clone(),
                boot_id: n.boot_id.clone(),
                stage: if booting {
                    MachineStage::Booting
                } else {
                    n.stage
                },
                ready: !booting && n.stage == MachineStage::Running,
                next_boot: if !n.reports_next_boot {
                    NextBoot::Unknown
                } else if n.rollback_pending {
                    n.previous
                        .clone()
                        .map_or(NextBoot::Unknown, NextBoot::Version)
                } else {
                    match &n.staged {
                        Some(v) => NextBoot::Version(v.clone()),
                        None => NextBoot::Same,
                    }
                },
                unhealthy_services: Vec::new(),
            })
        })
    }

    /// The Talos port's etcd health.
    pub fn talos_etcd(&self, via: &[NodeTarget]) -> Result<EtcdHealth, PortError> {
        let first = via.first().map(|v| v.node.clone()).unwrap_or_default();
        self.talos_call("etcd-status", &first, |s| {
            let members = s
                .nodes
                .iter()
                .filter(|(_, n)| n.control_plane)
                .map(|(name, n)| EtcdMember {
                    name: name.clone(),
                    learner: false,
                    healthy: !n.down(),
                    errors: Vec::new(),
                })
                .collect();
            Ok(EtcdHealth {
                members,
                alarms: Vec::new(),
                leader: s.etcd_leader.clone(),
            })
        })
    }

    /// The Talos port's image pull.
    pub fn talos_pull(&self, t: &NodeTarget, image: &str) -> Result<(), PortError> {
        self.talos_call("pull", &t.node, |s| {
            let n = s.nodes.get_mut(&t.node).expect("checked");
            if n.down() {
                return Err(unavailable("pull", &t.node, "connection refused"));
            }
            n.counters.pull += 1;
            s.log.push(format!("pull {} {image}", t.node));
            Ok(())
        })
    }

    /// The Talos port's upgrade.
    pub fn talos_upgrade(
        &self,
        t: &NodeTarget,
        image: &str,
        method: UpgradeMethod,
    ) -> Result<(), PortError> {
        self.talos_call("upgrade", &t.node, |s| {
            let exit = s.faults.iter().find_map(|f| match f {
                Fault::UpgradeExitCode { node, code } if node == &t.node => Some(*code),
                _ => None,
            });
            let never = s.faults.contains(&Fault::UpgradeNeverArrives {
                node: t.node.clone(),
            });
            let n = s.nodes.get_mut(&t.node).expect("checked");
            if n.down() || never {
                return Err(unavailable("upgrade", &t.node, "connection refused"));
            }
            n.counters.upgrade += 1;
            s.log.push(format!("upgrade {} {image}", t.node));
            if let Some(code) = exit {
                return Err(failed(
                    "upgrade",
                    &t.node,
                    format!("installer exited with code {code}"),
                ));
            }
            let tag = split_image(image).1.unwrap_or_default();
            let v =
                TalosVersion::parse(tag).map_err(|e| failed("upgrade", &t.node, e.to_string()))?;
            n.staged = Some(v);
            if method == UpgradeMethod::Legacy {
                go_down(s, &t.node);
            }
            Ok(())
        })
    }

    /// A reboot nobody asked medea for (an operator's `talosctl reboot`, a power loss): the
    /// node goes down and boots whatever it has staged, like any reboot. Counted in no
    /// counter of medea's calls.
    pub fn reboot_externally(&self, node: &str) {
        self.edit(|s| {
            s.log.push(format!("external-reboot {node}"));
            go_down(s, node);
        });
    }

    /// The Talos port's `EtcdForfeitLeadership`, as Talos answers it
    /// (`v1alpha1_server.go` `EtcdForfeitLeadership`, `internal/pkg/etcd/etcd.go`
    /// `ForfeitLeadership`): a member that does not lead answers with no new leader; the
    /// leader moves its leadership to the first other member (by name here) that is up.
    pub fn talos_forfeit(&self, t: &NodeTarget) -> Result<Option<String>, PortError> {
        self.talos_call("forfeit", &t.node, |s| {
            let n = s.nodes.get(&t.node).expect("checked");
            if n.down() {
                return Err(unavailable("forfeit", &t.node, "connection refused"));
            }
            if !n.control_plane {
                return Err(failed(
                    "forfeit",
                    &t.node,
                    "etcd forfeit leadership is only available on control plane nodes",
                ));
            }
            let fail = s.faults.iter_mut().find_map(|f| match f {
                Fault::ForfeitFails { node, calls, moved } if node == &t.node && *calls > 0 => {
                    *calls -= 1;
                    Some(*moved)
                }
                _ => None,
            });
            if let Some(moved) = fail {
                s.forfeits.push(format!("{} failed", t.node));
                if moved && s.etcd_leader.as_deref() == Some(t.node.as_str()) {
                    s.etcd_leader = other_leader(s, &t.node);
                }
                return Err(failed(
                    "forfeit",
                    &t.node,
                    "failed to forfeit leadership: etcdserver: request timed out, leader transfer took too long",
                ));
            }
            if s.etcd_leader.as_deref() != Some(t.node.as_str()) {
                s.forfeits.push(t.node.clone());
                return Ok(None);
            }
            let next = other_leader(s, &t.node);
            s.forfeits
                .push(format!("{} -> {}", t.node, next.as_deref().unwrap_or("-")));
            s.log.push(format!("forfeit {}", t.node));
            if next.is_some() {
                s.etcd_leader = next.clone();
            }
            Ok(next)
        })
    }

    /// The Talos port's reboot.
    pub fn talos_reboot(&self, t: &NodeTarget) -> Result<(), PortError> {
        self.talos_call("reboot", &t.node, |s| {
            let n = s.nodes.get_mut(&t.node).expect("checked");
            if n.down() {
                return Err(unavailable("reboot", &t.node, "connection refused"));
            }
            n.counters.reboot += 1;
            s.log.push(format!("reboot {}", t.node));
            go_down(s, &t.node);
            Ok(())
        })
    }

    /// `MachineService.Rollback`: flip the default slot, then reboot (no cordon, no drain).
    pub fn talos_rollback(&self, t: &NodeTarget) -> Result<(), PortError> {
        self.talos_call("rollback", &t.node, |s| {
            let n = s.nodes.get_mut(&t.node).expect("checked");
            if n.down() {
                return Err(unavailable("rollback", &t.node, "connection refused"));
            }
            if n.previous.is_none() {
                return Err(failed(
                    "rollback",
                    &t.node,
                    "cannot rollback to \"\", label does not exist",
                ));
            }
            n.counters.rollback += 1;
            n.rollback_pending = !n.rollback_pending;
            s.log.push(format!("rollback {}", t.node));
            go_down(s, &t.node);
            Ok(())
        })
    }

    /// The Talos port's component `extraArgs`.
    pub fn talos_args(&self, t: &NodeTarget) -> Result<ComponentArgs, PortError> {
        self.talos_call("get-machineconfig", &t.node, |s| {
            let n = &s.nodes[&t.node];
            if n.down() {
                return Err(unavailable(
                    "get-machineconfig",
                    &t.node,
                    "connection refused",
                ));
            }
            Ok(n.args.clone())
        })
    }

    /// The Talos port's static-pod images.
    pub fn talos_images(&self, t: &NodeTarget) -> Result<ComponentImages, PortError> {
        self.talos_call("get-machineconfig", &t.node, |s| {
            let n = &s.nodes[&t.node];
            if n.down() {
                return Err(unavailable(
                    "get-machineconfig",
                    &t.node,
                    "connection refused",
                ));
            }
            Ok(n.images.clone())
        })
    }

    /// The Talos port's config version of a component.
    pub fn talos_config_version(
        &self,
        t: &NodeTarget,
        c: Component,
    ) -> Result<Option<String>, PortError> {
        self.talos_call("get-component-config", &t.node, |s| {
            let n = &s.nodes[&t.node];
            if n.down() {
                return Err(unavailable(
                    "get-component-config",
                    &t.node,
                    "connection refused",
                ));
            }
            if !n.control_plane || !Component::STATIC_PODS.contains(&c) {
                return Ok(None);
            }
            Ok(Some(
                n.config_versions.get(&c).copied().unwrap_or(1).to_string(),
            ))
        })
    }

    /// The Talos port's image change of a component.
    pub fn talos_set_image(
        &self,
        t: &NodeTarget,
        c: Component,
        image: &str,
    ) -> Result<(), PortError> {
        self.talos_call("apply-configuration", &t.node, |s| {
            let n = s.nodes.get_mut(&t.node).expect("checked");
            if n.down() {
                return Err(unavailable(
                    "apply-configuration",
                    &t.node,
                    "connection refused",
                ));
            }
            n.counters.set_image += 1;
            let changed = n.images.insert(c, image.to_string()).as_deref() != Some(image);
            if changed && Component::STATIC_PODS.contains(&c) {
                let v = n.config_versions.get(&c).copied().unwrap_or(1) + 1;
                n.config_versions.insert(c, v);
                let stale = s.faults.iter().any(|f| {
                    matches!(f, Fault::StaleConfigVersion { node, component }
                        if *node == t.node && *component == c)
                });
                let n = s.nodes.get_mut(&t.node).expect("checked");
                if !stale {
                    n.pod_config_versions.insert(c, v);
                }
            }
            let n = s.nodes.get_mut(&t.node).expect("checked");
            if c == Component::Kubelet
                && let Some((v, _)) = image_version(image)
            {
                n.kubelet = v;
            }
            s.log.push(format!("set-image {} {c} {image}", t.node));
            Ok(())
        })
    }

    /// The Talos port's etcd snapshot.
    pub fn talos_snapshot(&self, t: &NodeTarget) -> Result<Vec<u8>, PortError> {
        self.talos_call("etcd-snapshot", &t.node, |s| {
            if s.faults.contains(&Fault::SnapshotFails) {
                return Err(failed(
                    "etcd-snapshot",
                    &t.node,
                    "etcdserver: mvcc: database space exceeded",
                ));
            }
            let n = &s.nodes[&t.node];
            if !n.control_plane {
                return Err(failed(
                    "etcd-snapshot",
                    &t.node,
                    "etcd is not running on a worker",
                ));
            }
            s.snapshots += 1;
            s.log.push(format!("etcd-snapshot {}", t.node));
            Ok(format!("fake etcd database #{}", s.snapshots).into_bytes())
        })
    }

    /// The Talos port's bootstrap manifests.
    pub fn talos_manifests(&self, t: &NodeTarget) -> Result<Vec<Manifest>, PortError> {
        self.talos_call("get-manifests", &t.node, |s| {
            let kube = s.nodes[&t.node].kubelet.clone();
            Ok(vec![Manifest(serde_json::json!({
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": {"name": "kube-proxy", "namespace": "kube-system"},
                "spec": {"template": {"spec": {"containers": [{"name": "kube-proxy", "image": format!("registry.k8s.io/kube-proxy:{kube}")}]}}}
            }))])
        })
    }

    // -- the Kubernetes side, synchronous

    /// The Kubernetes port's node observation.
    pub fn kube_node(&self, node: &str) -> Result<KubeNode, PortError> {
        self.kube_call("get-node", node, |s| {
            let n = &s.nodes[node];
            Ok(n.kube_node())
        })
    }

    /// The Kubernetes port's list of every Node.
    pub fn kube_nodes(&self) -> Result<BTreeMap<String, KubeNode>, PortError> {
        self.kube_call("list-nodes", "", |s| {
            Ok(s.nodes
                .iter()
                .map(|(name, n)| (name.clone(), n.kube_node()))
                .collect())
        })
    }

    /// The Kubernetes port's taint (`add`) and untaint: only a taint with the key and effect
    /// absent is added; only the exact taint is removed.
    pub fn kube_taint(&self, node: &str, taint: &NodeTaint, add: bool) -> Result<(), PortError> {
        let op = if add { "taint" } else { "untaint" };
        self.kube_call(op, node, |s| {
            let n = s.nodes.get_mut(node).expect("checked");
            if add {
                n.taint_calls.0 += 1;
                if !n
                    .taints
                    .iter()
                    .any(|t| t.key == taint.key && t.effect == taint.effect)
                {
                    n.taints.push(taint.clone());
                }
            } else {
                n.taint_calls.1 += 1;
                n.taints.retain(|t| t != taint);
            }
            s.pacing_log.push(format!("{op} {node}"));
            Ok(())
        })
    }

    /// The Kubernetes port's cordon (`on`) and uncordon.
    pub fn kube_cordon(&self, node: &str, owner: &str, on: bool) -> Result<(), PortError> {
        let op = if on { "cordon" } else { "uncordon" };
        self.kube_call(op, node, |s| {
            let n = s.nodes.get_mut(node).expect("checked");
            let ours = n
                .annotations
                .get(CORDONED_BY_ANNOTATION)
                .map(String::as_str)
                == Some(owner);
            if on && !n.cordoned {
                n.cordoned = true;
                n.annotations
                    .insert(CORDONED_BY_ANNOTATION.to_string(), owner.to_string());
            } else if !on && ours {
                n.cordoned = false;
                n.annotations.remove(CORDONED_BY_ANNOTATION);
            }
            if on {
                n.counters.cordon += 1;
            } else {
                n.counters.uncordon += 1;
            }
            // an uncordon while Talos still reports the node booting is the mistake a test
            // looks for (Kubernetes Ready comes before `MachineStatus` running+ready)
            let booting = if !on && n.booting > 0 {
                " (talos: booting, not ready)"
            } else {
                ""
            };
            s.log.push(format!("{op} {node}{booting}"));
            Ok(())
        })
    }

    /// One drain pass: `Blocked` if a PDB fault covers the node.
    pub fn kube_drain(&self, node: &str) -> Result<DrainOutcome, PortError> {
        self.kube_call("drain", node, |s| {
            let pdb = s.faults.iter().find_map(|f| match f {
                Fault::PdbBlocks { node: n, pdb } if n == node => Some(pdb.clone()),
                _ => None,
            });
            let n = s.nodes.get_mut(node).expect("checked");
            n.counters.drain += 1;
            s.log.push(format!("drain {node}"));
            Ok(match pdb {
                // the fake reports no volumes: every attachment on the node counts
                Some(pdb) => DrainOutcome::Blocked {
                    pdb,
                    pod: format!("default/app-on-{node}"),
                    volumes: None,
                },
                None => DrainOutcome::Drained { volumes: None },
            })
        })
    }

    /// The Kubernetes port's `VolumeAttachment` observation.
    pub fn kube_volume_attachments(
        &self,
        node: &str,
    ) -> Result<Vec<crate::rollout::ports::VolumeAttachment>, PortError> {
        self.kube_call("list-volumeattachments", node, |s| {
            Ok(s.volume_attachments.get(node).cloned().unwrap_or_default())
        })
    }

    /// The Kubernetes port's mirror-pod observation.
    pub fn kube_static_pod(
        &self,
        node: &str,
        c: Component,
    ) -> Result<Option<StaticPod>, PortError> {
        self.kube_call("get-pod", node, |s| {
            let n = &s.nodes[node];
            if !n.control_plane {
                return Ok(None);
            }
            Ok(n.images.get(&c).map(|image| StaticPod {
                image: image.clone(),
                ready: !n.down(),
                config_version: Some(
                    n.pod_config_versions
                        .get(&c)
                        .copied()
                        .unwrap_or(1)
                        .to_string(),
                ),
            }))
        })
    }

    /// The Kubernetes port's manifest sync (`legacy`: the pre-1.13 way).
    pub fn kube_apply(&self, manifests: &[Manifest], legacy: bool) -> Result<(), PortError> {
        self.kube_call("server-side-apply", "", |s| {
            s.manifest_applies += 1;
            s.log.push(format!(
                "apply-manifests {}{}",
                manifests.len(),
                if legacy { " legacy" } else { "" }
            ));
            Ok(())
        })
    }
}

fn take_lost_reply(s: &mut FakeState, node: &str, op: &str) -> bool {
    let pos = s
        .faults
        .iter()
        .position(|f| matches!(f, Fault::LostReply { node: n, op: o } if n == node && o == op));
    match pos {
        Some(i) => {
            s.faults.remove(i);
            true
        }
        None => false,
    }
}

/// The first control plane other than `name`, by name, that is up: who takes etcd's
/// leadership over from `name`.
fn other_leader(s: &FakeState, name: &str) -> Option<String> {
    s.nodes
        .iter()
        .find(|(k, n)| k.as_str() != name && n.control_plane && !n.down())
        .map(|(k, _)| k.clone())
}

fn go_down(s: &mut FakeState, name: &str) {
    if s.etcd_leader.as_deref() == Some(name) {
        // the leader goes away: the others elect one of them
        s.etcd_leader = other_leader(s, name);
    }
    let never = s.faults.contains(&Fault::NeverReturns {
        node: name.to_string(),
    });
    let polls = if never { u32::MAX } else { s.reboot_polls };
    let away = s.faults.iter().find_map(|f| match f {
        Fault::ApiserverAwayDuringControlPlaneReboot { calls } => Some(*calls),
        _ => None,
    });
    let n = s.nodes.get_mut(name).expect("checked");
    if n.control_plane
        && let Some(calls) = away
    {
        s.apiserver_away = calls;
    }
    let n = s.nodes.get_mut(name).expect("checked");
    n.stage = MachineStage::Rebooting;
    n.rebooting = true;
    n.down_polls = polls;
}

fn boot(n: &mut FakeNode, name: &str, revert: bool) {
    n.boots += 1;
    n.boot_id = format!("{name}-boot-{}", n.boots);
    if n.rollback_pending {
        n.rollback_pending = false;
        if let Some(prev) = n.previous.take() {
            n.previous = Some(std::mem::replace(&mut n.version, prev));
        }
    } else if let Some(v) = n.staged.take()
        && !revert
    {
        n.previous = Some(std::mem::replace(&mut n.version, v));
    }
    n.stage = MachineStage::Running;
    n.rebooting = false;
    n.down_polls = 0;
}

fn write_state(path: &Path, s: &FakeState) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&serde_json::to_vec_pretty(s).expect("fake state serializes"))?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Write a snapshot the way the real adapter does: `.part` (0600, directory 0700), fsync,
/// then into place; refuses an existing destination.
fn save_snapshot(dest: &Path, bytes: &[u8]) -> std::io::Result<SnapshotInfo> {
    use sha2::{Digest, Sha256};
    if dest.exists() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{} already exists", dest.display()),
        ));
    }
    crate::private_file::write_private(dest, bytes, crate::private_file::ExistingDir::Keep)
        .map_err(crate::private_file::PrivateFileError::into_io)?;
    Ok(SnapshotInfo {
        path: dest.to_path_buf(),
        size: bytes.len() as u64,
        sha256: hex::encode(Sha256::digest(bytes)),
        encrypted: None,
    })
}

/// The Talos face of a [`FakeCluster`].
#[derive(Debug, Clone)]
pub struct FakeTalos(pub FakeCluster);

/// The Kubernetes face of a [`FakeCluster`].
#[derive(Debug, Clone)]
pub struct FakeKube(pub FakeCluster);

impl TalosPort for FakeTalos {
    async fn node(&self, node: &NodeTarget) -> Result<TalosNode, PortError> {
        use std::sync::atomic::Ordering::SeqCst;
        let o = &self.0.observing;
        let now = o.now.fetch_add(1, SeqCst) + 1;
        o.max.fetch_max(now, SeqCst);
        if o.yielding.load(SeqCst) {
            tokio::task::yield_now().await;
        }
        let r = self.0.talos_node(node);
        o.now.fetch_sub(1, SeqCst);
        let drained = self
            .0
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .nodes
            .get(&node.node)
            .is_some_and(|n| n.counters.drain > 0 && n.counters.upgrade == 0);
        if drained {
            *o.drained
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(node.node.clone())
                .or_default() += 1;
        }
        r
    }
    async fn etcd(&self, control_plane: &[NodeTarget]) -> Result<EtcdHealth, PortError> {
        self.0.talos_etcd(control_plane)
    }
    async fn etcd_forfeit_leadership(
        &self,
        node: &NodeTarget,
    ) -> Result<Option<String>, PortError> {
        self.0.talos_forfeit(node)
    }
    async fn etcd_snapshot(
        &self,
        node: &NodeTarget,
        dest: &Path,
    ) -> Result<SnapshotInfo, PortError> {
        let bytes = self.0.talos_snapshot(node)?;
        save_snapshot(dest, &bytes).map_err(|e| PortError::failed("etcd-snapshot", &node.node, e))
    }
    async fn etcd_snapshot_stream(
        &self,
        node: &NodeTarget,
        chunks: tokio::sync::mpsc::Sender<Vec<u8>>,
    ) -> Result<SnapshotStreamed, PortError> {
        use sha2::{Digest, Sha256};
        // etcd's layout: the database, then the sha256 of the database.
        let mut bytes = self.0.talos_snapshot(node)?;
        let trailer = Sha256::digest(&bytes);
        bytes.extend_from_slice(&trailer);
        let (size, sha256) = (bytes.len() as u64, hex::encode(Sha256::digest(&bytes)));
        chunks
            .send(bytes)
            .await
            .map_err(|_| failed("etcd-snapshot", &node.node, "the consumer stopped"))?;
        Ok(SnapshotStreamed { size, sha256 })
    }
    async fn pull_image(
        &self,
        node: &NodeTarget,
        image: &str,
        _namespace: ImageNamespace,
    ) -> Result<(), PortError> {
        self.0.talos_pull(node, image)
    }
    async fn upgrade(
        &self,
        node: &NodeTarget,
        image: &str,
        method: UpgradeMethod,
    ) -> Result<(), PortError> {
        self.0.talos_upgrade(node, image, method)
    }
    async fn reboot(&self, node: &NodeTarget) -> Result<(), PortError> {
        self.0.talos_reboot(node)
    }
    async fn rollback(&self, node: &NodeTarget) -> Result<(), PortError> {
        self.0.talos_rollback(node)
    }
    async fn component_images(&self, node: &NodeTarget) -> Result<ComponentImages, PortError> {
        self.0.talos_images(node)
    }
    async fn component_args(&self, node: &NodeTarget) -> Result<ComponentArgs, PortError> {
        self.0.talos_args(node)
    }
    async fn component_config_version(
        &self,
        node: &NodeTarget,
        component: Component,
    ) -> Result<Option<String>, PortError> {
        self.0.talos_config_version(node, component)
    }
    async fn set_component_image(
        &self,
        node: &NodeTarget,
        component: Component,
        image: &str,
    ) -> Result<(), PortError> {
        self.0.talos_set_image(node, component, image)
    }
    async fn bootstrap_manifests(&self, node: &NodeTarget) -> Result<Vec<Manifest>, PortError> {
        self.0.talos_manifests(node)
    }
}

impl KubePort for FakeKube {
    async fn node(&self, node: &str) -> Result<KubeNode, PortError> {
        self.0.kube_node(node)
    }
    async fn cordon(&self, node: &str, owner: &str) -> Result<(), PortError> {
        self.0.kube_cordon(node, owner, true)
    }
    async fn uncordon(&self, node: &str, owner: &str) -> Result<(), PortError> {
        self.0.kube_cordon(node, owner, false)
    }
    async fn nodes(&self) -> Result<BTreeMap<String, KubeNode>, PortError> {
        self.0.kube_nodes()
    }
    async fn taint(&self, node: &str, taint: &NodeTaint) -> Result<(), PortError> {
        self.0.kube_taint(node, taint, true)
    }
    async fn untaint(&self, node: &str, taint: &NodeTaint) -> Result<(), PortError> {
        self.0.kube_taint(node, taint, false)
    }
    async fn drain(
        &self,
        node: &str,
        timeout: Duration,
        _policy: &crate::desired::model::DrainPolicy,
    ) -> Result<DrainOutcome, PortError> {
        let r = self.0.kube_drain(node)?;
        if matches!(r, DrainOutcome::Blocked { .. }) {
            // a real drain keeps retrying the refused eviction until its timeout
            tokio::time::sleep(timeout).await;
        }
        Ok(r)
    }
    async fn volume_attachments(
        &self,
        node: &str,
    ) -> Result<Vec<crate::rollout::ports::VolumeAttachment>, PortError> {
        self.0.kube_volume_attachments(node)
    }
    async fn static_pod(
        &self,
        node: &str,
        component: Component,
    ) -> Result<Option<StaticPod>, PortError> {
        self.0.kube_static_pod(node, component)
    }
    async fn apply_manifests(
        &self,
        manifests: &[Manifest],
        legacy: bool,
        _wait: Duration,
    ) -> Result<(), PortError> {
        self.0.kube_apply(manifests, legacy)
    }
}

/// Moved to [`crate::store::mem`]; this path keeps working.
pub use crate::store::mem::MemStore;
