//! Issue #36 item 4, "Done when": the twin built from a census round-trips the observed
//! cluster. Generated observed clusters (1–3 control planes, 0–6 workers, Talos and kubelet
//! versions, platforms, extensions, non-loopback addresses) and censuses (pods per node owned
//! by a ReplicaSet, a StatefulSet, a DaemonSet or nothing, with labels and emptyDir / hostPath /
//! PVC / CSI volume counts; PodDisruptionBudgets with `minAvailable` or `maxUnavailable`, an
//! int or a percentage, over a label selector) become a twin (`rehearsal::twin::build`), which
//! starts as a real `SimCluster` on loopback. The census gathered back from it with
//! `ops::census::gather` and its nodes observed with `ops::refresh::observe` (what the refresh
//! does) must be the generated ones.
//!
//! The census's `disruptionsAllowed` / `expectedPods` of a generated budget are what upstream's
//! disruption controller computes with every pod Ready ([`budget_status`]), so the round trip
//! also checks the simulator's disruption controller against upstream.

use std::collections::BTreeMap;
use std::time::Duration;

use medea::inventory::census::{Census, CensusPdb, CensusPod, Owner, VolumeKinds};
use medea::inventory::{Machine, MachineRole, ObservedCluster};
use medea::k8s::KubeClient;
use medea::ops::{census, refresh};
use medea::rehearsal::twin::{self, Twin, TwinTiming};
use medea::sim::cluster::{SimCluster, SimClusterConfig};
use medea::talos::TalosClient;
use medea::version::{KubeVersion, TalosVersion};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use serde_json::Value;

use crate::sim_cluster::{fast_kube, fast_talos};

const TALOS: &[&str] = &["v1.11.5", "v1.12.11", "v1.13.0"];
const KUBE: &[&str] = &["v1.33.5", "v1.34.1"];
const PLATFORMS: &[&str] = &["metal", "aws", "nocloud"];
const NAMESPACES: &[&str] = &["default", "shop", "kube-system"];
/// Labels a pod may carry besides its group's `app`.
const EXTRA_LABELS: &[(&str, &str)] = &[("tier", "web"), ("tier", "db"), ("zone", "a")];
/// What a DaemonSet controller stamps on its pods: values it generates.
const GENERATED_DS_LABELS: &[&str] = &["controller-revision-hash", "pod-template-generation"];

#[derive(Debug, Clone)]
struct NodeGen {
    talos: &'static str,
    kubelet: &'static str,
    platform: &'static str,
    extension: Option<&'static str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    ReplicaSet,
    StatefulSet,
    DaemonSet,
    Bare,
}

#[derive(Debug, Clone, Copy)]
enum Budget {
    MinInt(u8),
    MinPct(u8),
    MaxInt(u8),
    MaxPct(u8),
}

#[derive(Debug, Clone)]
struct PodGen {
    node: Index,
    extra: Option<usize>,
    volumes: VolumeKinds,
}

#[derive(Debug, Clone)]
struct Group {
    kind: Kind,
    namespace: &'static str,
    /// One per pod; a DaemonSet runs one pod on every node instead, with the first's volumes.
    pods: Vec<PodGen>,
    budget: Option<Budget>,
}

#[derive(Debug, Clone)]
struct World {
    control_planes: Vec<NodeGen>,
    workers: Vec<NodeGen>,
    groups: Vec<Group>,
}

fn node_gen() -> impl Strategy<Value = NodeGen> {
    (
        prop::sample::select(TALOS),
        prop::sample::select(KUBE),
        prop::sample::select(PLATFORMS),
        prop::option::of(prop::sample::select(&["v0.1.6", "v1.2.0"][..])),
    )
        .prop_map(|(talos, kubelet, platform, extension)| NodeGen {
            talos,
            kubelet,
            platform,
            extension,
        })
}

fn volumes() -> impl Strategy<Value = VolumeKinds> {
    (0u32..=2, 0u32..=1, 0u32..=1, 0u32..=1).prop_map(|(empty_dir, host_path, pvc, csi)| {
        VolumeKinds {
            empty_dir,
            host_path,
            persistent_volume_claim: pvc,
            csi,
        }
    })
}

fn pod_gen() -> impl Strategy<Value = PodGen> {
    (
        any::<Index>(),
        prop::option::of(0..EXTRA_LABELS.len()),
        volumes(),
    )
        .prop_map(|(node, extra, volumes)| PodGen {
            node,
            extra,
            volumes,
        })
}

fn budget() -> impl Strategy<Value = Budget> {
    prop_oneof![
        (0u8..=4).prop_map(Budget::MinInt),
        prop::sample::select(&[0u8, 34, 50, 100][..]).prop_map(Budget::MinPct),
        (0u8..=3).prop_map(Budget::MaxInt),
        prop::sample::select(&[0u8, 25, 50, 100][..]).prop_map(Budget::MaxPct),
    ]
}

fn group() -> impl Strategy<Value = Group> {
    (
        prop::sample::select(
            &[
                Kind::ReplicaSet,
                Kind::StatefulSet,
                Kind::DaemonSet,
                Kind::Bare,
            ][..],
        ),
        prop::sample::select(NAMESPACES),
        prop::collection::vec(pod_gen(), 1..=4),
        prop::option::of(budget()),
    )
        .prop_map(|(kind, namespace, pods, budget)| Group {
            kind,
            namespace,
            pods,
            // The disruption controller finds no scale for a DaemonSet (it has no `scale`
            // subresource), so no budget is generated over one.
            budget: budget.filter(|_| kind != Kind::DaemonSet),
        })
}

fn world() -> impl Strategy<Value = World> {
    (
        prop::collection::vec(node_gen(), 1..=3),
        prop::collection::vec(node_gen(), 0..=6),
        prop::collection::vec(group(), 0..=5),
    )
        .prop_map(|(control_planes, workers, groups)| World {
            control_planes,
            workers,
            groups,
        })
}

impl World {
    /// (name, role, generated node), control planes first.
    fn nodes(&self) -> Vec<(String, MachineRole, &NodeGen)> {
        let cps = self
            .control_planes
            .iter()
            .enumerate()
            .map(|(i, n)| (format!("cp-{}", i + 1), MachineRole::Controlplane, n));
        let workers = self
            .workers
            .iter()
            .enumerate()
            .map(|(i, n)| (format!("w-{}", i + 1), MachineRole::Worker, n));
        cps.chain(workers).collect()
    }

    /// The cluster as a refresh of the real one recorded it: addresses off loopback.
    fn observed(&self) -> ObservedCluster {
        let mut machines = BTreeMap::new();
        for (i, (name, role, n)) in self.nodes().into_iter().enumerate() {
            let extensions: BTreeMap<String, String> = n
                .extension
                .map(|v| ("iscsi-tools".to_string(), v.to_string()))
                .into_iter()
                .collect();
            machines.insert(
                name.clone(),
                Machine {
                    node: name.clone(),
                    id: format!("machine-{name}"),
                    address: format!("10.20.{}.{}", i / 200, 10 + i % 200),
                    role,
                    talos_version: Some(TalosVersion::parse(n.talos).unwrap()),
                    installer_image: None,
                    schematic: None,
                    platform: Some(n.platform.to_string()),
                    secure_boot: None,
                    factory_host: None,
                    extensions,
                    kubelet_version: Some(KubeVersion::parse(n.kubelet).unwrap()),
                    ready: true,
                    cordoned: false,
                    reachable: true,
                    boot_id: Some(format!("boot-{name}")),
                    labels: BTreeMap::new(),
                },
            );
        }
        let kubernetes_version = self
            .control_planes
            .iter()
            .map(|n| KubeVersion::parse(n.kubelet).unwrap())
            .min();
        ObservedCluster::new("twin-prop").observe(kubernetes_version, machines)
    }

    /// The census a refresh gathered of the real cluster, every pod Running and Ready.
    fn census(&self) -> Census {
        let nodes: Vec<String> = self.nodes().into_iter().map(|(n, _, _)| n).collect();
        let mut pods = Vec::new();
        let mut pdbs = Vec::new();
        let mut daemonsets = Vec::new();
        for (g, group) in self.groups.iter().enumerate() {
            let app = format!("g{g}");
            let ns = group.namespace.to_string();
            let pod = |node: &str, name: String, owner: Option<Owner>, p: &PodGen| {
                let mut labels = BTreeMap::from([("app".to_string(), app.clone())]);
                if let Some(i) = p.extra {
                    let (k, v) = EXTRA_LABELS[i];
                    labels.insert(k.into(), v.into());
                }
                CensusPod {
                    node: node.to_string(),
                    namespace: ns.clone(),
                    name,
                    owner,
                    mirror: false,
                    phase: "Running".into(),
                    labels,
                    volumes: p.volumes,
                }
            };
            let mut members = Vec::new();
            match group.kind {
                Kind::DaemonSet => {
                    daemonsets.push(format!("{ns}/{app}"));
                    for node in &nodes {
                        let mut p = pod(
                            node,
                            format!("{app}-{node}"),
                            Some(Owner {
                                kind: "DaemonSet".into(),
                                name: app.clone(),
                            }),
                            &group.pods[0],
                        );
                        p.labels
                            .insert("controller-revision-hash".into(), "6b8d7f9c4".into());
                        p.labels
                            .insert("pod-template-generation".into(), "1".into());
                        pods.push(p);
                    }
                }
                kind => {
                    for (j, p) in group.pods.iter().enumerate() {
                        let node = p.node.get(&nodes);
                        let (name, owner) = match kind {
                            Kind::ReplicaSet => (
                                format!("{app}-5d8f9c-{j}"),
                                Some(Owner {
                                    kind: "ReplicaSet".into(),
                                    name: format!("{app}-5d8f9c"),
                                }),
                            ),
                            Kind::StatefulSet => (
                                format!("{app}-{j}"),
                                Some(Owner {
                                    kind: "StatefulSet".into(),
                                    name: app.clone(),
                                }),
                            ),
                            _ => (format!("{app}-bare-{j}"), None),
                        };
                        members.push(name.clone());
                        pods.push(pod(node, name, owner, p));
                    }
                }
            }
            if let Some(b) = group.budget {
                members.sort();
                let (allowed, expected) = budget_status(b, group.kind, members.len() as i64);
                let (min_available, max_unavailable) = match b {
                    Budget::MinInt(n) => (Some(n.to_string()), None),
                    Budget::MinPct(p) => (Some(format!("{p}%")), None),
                    Budget::MaxInt(n) => (None, Some(n.to_string())),
                    Budget::MaxPct(p) => (None, Some(format!("{p}%"))),
                };
                pdbs.push(CensusPdb {
                    namespace: ns.clone(),
                    name: format!("{app}-pdb"),
                    min_available,
                    max_unavailable,
                    disruptions_allowed: allowed,
                    expected_pods: expected,
                    pods: members,
                });
            }
        }
        pods.sort_by(|a, b| {
            (&a.node, &a.namespace, &a.name).cmp(&(&b.node, &b.namespace, &b.name))
        });
        pdbs.sort();
        daemonsets.sort();
        Census {
            gathered_at: "2026-01-01T00:00:00Z".into(),
            pods,
            pdbs,
            daemonsets,
            ..Census::default()
        }
    }
}

/// `intstr.GetScaledValueFromIntOrPercent(v, total, true)` for a percentage.
fn pct_up(pct: u8, total: i64) -> i64 {
    (i64::from(pct) * total + 99) / 100
}

/// `(disruptionsAllowed, expectedPods)` upstream's disruption controller writes for a budget
/// over `n` Ready pods of one controller of `kind` (kubernetes `pkg/controller/disruption/
/// disruption.go`, `getExpectedPodCount` and `updatePdbStatus`): an int `minAvailable` counts
/// the pods; a percentage or `maxUnavailable` needs the controllers' scale
/// (`getExpectedScale`), which fails for a pod without a controller ("found no controller
/// ref"), and a failed sync writes `disruptionsAllowed: 0` and leaves `expectedPods` as it was
/// (0 on a new budget; `failSafe`). Nothing is allowed while `expectedCount <= 0`.
fn budget_status(b: Budget, kind: Kind, n: i64) -> (i64, i64) {
    let scale = (kind != Kind::Bare).then_some(n);
    let (expected, desired) = match (b, scale) {
        (Budget::MinInt(m), _) => (n, i64::from(m)),
        (_, None) => return (0, 0),
        (Budget::MinPct(p), Some(s)) => (s, pct_up(p, s)),
        (Budget::MaxInt(m), Some(s)) => (s, (s - i64::from(m)).max(0)),
        (Budget::MaxPct(p), Some(s)) => (s, (s - pct_up(p, s)).max(0)),
    };
    let allowed = n - desired;
    (
        if expected <= 0 || allowed <= 0 {
            0
        } else {
            allowed
        },
        expected,
    )
}

// ---------------------------------------------------------------------------------------
// The comparison

/// A census pod as the round trip compares it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct PodView {
    node: String,
    namespace: String,
    owner: Option<(String, String)>,
    /// `None` for a DaemonSet's pod: the DaemonSet controller generates its name.
    name: Option<String>,
    phase: String,
    labels: BTreeMap<String, String>,
    volumes: VolumeKinds,
}

/// Everything the round trip keeps of a census.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CensusView {
    pods: Vec<PodView>,
    pdbs: Vec<CensusPdb>,
    daemonsets: Vec<String>,
    attachments: BTreeMap<String, Vec<String>>,
    truncated: Vec<String>,
    gather_errors: BTreeMap<String, String>,
}

/// The census without what differs between any two gathers of the same cluster, or is the
/// twin's own:
/// - `gatheredAt` (a timestamp);
/// - the generated names of DaemonSet pods and the generated values of the labels the
///   DaemonSet controller stamps (`controller-revision-hash`, `pod-template-generation`);
/// - the `twin.medea.dev/` labels the twin's controllers and budgets select by;
/// - mirror pods: the twin leaves the census's out, and the simulator runs its own static
///   pods (the generated censuses have none).
///
/// Uids are not in a census.
fn normalise(c: &Census) -> CensusView {
    let mut pods: Vec<PodView> = c
        .pods
        .iter()
        .filter(|p| !p.mirror)
        .map(|p| {
            let daemon = p.owner.as_ref().is_some_and(|o| o.kind == "DaemonSet");
            let mut labels: BTreeMap<String, String> = p
                .labels
                .iter()
                .filter(|(k, _)| !k.starts_with("twin.medea.dev/"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if daemon {
                for k in GENERATED_DS_LABELS {
                    if let Some(v) = labels.get_mut(*k) {
                        *v = "(generated)".into();
                    }
                }
            }
            PodView {
                node: p.node.clone(),
                namespace: p.namespace.clone(),
                owner: p.owner.as_ref().map(|o| (o.kind.clone(), o.name.clone())),
                name: (!daemon).then(|| p.name.clone()),
                phase: p.phase.clone(),
                labels,
                volumes: p.volumes,
            }
        })
        .collect();
    pods.sort();
    CensusView {
        pods,
        pdbs: c.pdbs.clone(),
        daemonsets: c.daemonsets.clone(),
        attachments: c.attachments.clone(),
        truncated: c.truncated.clone(),
        gather_errors: c.gather_errors.clone(),
    }
}

/// A machine as the round trip compares it (the address is checked on its own: the twin's).
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeView {
    role: MachineRole,
    talos: Option<TalosVersion>,
    kubelet: Option<KubeVersion>,
    platform: Option<String>,
    extensions: BTreeMap<String, String>,
}

fn node_views(machines: &BTreeMap<String, Machine>) -> BTreeMap<String, NodeView> {
    machines
        .iter()
        .map(|(name, m)| {
            (
                name.clone(),
                NodeView {
                    role: m.role,
                    talos: m.talos_version.clone(),
                    kubelet: m.kubelet_version.clone(),
                    platform: m.platform.clone(),
                    extensions: m.extensions.clone(),
                },
            )
        })
        .collect()
}

/// What the twin gave back.
struct Back {
    census: Census,
    observation: refresh::Observation,
}

const QUICK: TwinTiming = TwinTiming {
    reboot: Duration::from_millis(200),
    image_pull: Duration::ZERO,
    pod_start: Duration::ZERO,
    pod_termination: Duration::ZERO,
};

fn status_i64(obj: &Option<Value>, field: &str) -> Option<i64> {
    obj.as_ref()
        .and_then(|o| o.pointer(&format!("/status/{field}")))
        .and_then(Value::as_i64)
}

/// Whether the twin's controllers have caught up: every node Ready, every pod Running and
/// Ready, every DaemonSet and ReplicaSet with all its pods Ready, every budget's status
/// counting its current pods. Read from the simulator's own state, not from the expectation.
fn settled(sim: &SimCluster, twin: &Twin) -> bool {
    let nodes_ready = twin.scenario.nodes.iter().all(|n| {
        sim.kube
            .get("v1", "Node", "", &n.name)
            .and_then(|node| {
                node.pointer("/status/conditions")?
                    .as_array()?
                    .iter()
                    .find(|c| c["type"] == "Ready")
                    .map(|c| c["status"] == "True")
            })
            .unwrap_or(false)
    });
    if !nodes_ready {
        return false;
    }
    let pods = sim.kube.pods();
    if !pods
        .iter()
        .all(|p| p.mirror || (p.phase == "Running" && p.ready && !p.terminating))
    {
        return false;
    }
    twin.objects.iter().all(|o| {
        let ns = o["metadata"]["namespace"].as_str().unwrap_or("");
        let name = o["metadata"]["name"].as_str().unwrap_or("");
        match o["kind"].as_str() {
            Some("DaemonSet") => {
                let ds = sim.kube.get("apps/v1", "DaemonSet", ns, name);
                let desired = status_i64(&ds, "desiredNumberScheduled");
                desired == Some(twin.scenario.nodes.len() as i64)
                    && status_i64(&ds, "numberReady") == desired
            }
            Some("ReplicaSet") => {
                let rs = sim.kube.get("apps/v1", "ReplicaSet", ns, name);
                status_i64(&rs, "readyReplicas") == o["spec"]["replicas"].as_i64()
            }
            Some("PodDisruptionBudget") => {
                let pdb = sim.kube.get("policy/v1", "PodDisruptionBudget", ns, name);
                let key = o["spec"]["selector"]["matchLabels"]
                    .as_object()
                    .and_then(|m| m.keys().next().cloned())
                    .unwrap_or_default();
                let members = twin
                    .objects
                    .iter()
                    .filter(|p| {
                        p["kind"] == "Pod"
                            && p["metadata"]["namespace"] == ns
                            && p["metadata"]["labels"].get(&key).is_some()
                    })
                    .count();
                // A budget the disruption controller could not sync keeps its status but
                // for a `SyncFailed` condition.
                let sync_failed = pdb
                    .as_ref()
                    .and_then(|p| p.pointer("/status/conditions/0/reason"))
                    .is_some_and(|r| r == "SyncFailed");
                sync_failed || status_i64(&pdb, "currentHealthy") == Some(members as i64)
            }
            _ => true,
        }
    })
}

/// Build the twin of `observed` with `census`, start it on loopback, wait until its controllers
/// have caught up, gather its census and observe its nodes as the refresh does.
async fn round_trip(observed: &ObservedCluster, census: &Census) -> (Twin, Back) {
    let twin = twin::build(observed, Some(census), QUICK);
    let sim = SimCluster::start(
        twin.scenario.clone(),
        SimClusterConfig {
            extra_objects: twin.objects.clone(),
            platform: false,
            ..SimClusterConfig::default()
        },
    )
    .await
    .expect("the twin starts");
    let dir = tempfile::tempdir().unwrap();
    let creds = sim.write_creds(&dir.path().join("twin")).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !settled(&sim, &twin) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the twin did not settle in 30 s: pods {:?}",
            sim.kube.pods()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let kube = KubeClient::from_kubeconfig(&creds.kubeconfig, fast_kube())
        .await
        .unwrap();
    let talos = TalosClient::from_talosconfig(&creds.talosconfig, None, fast_talos())
        .unwrap()
        .0;
    let gathered = census::gather(&kube, jiff::Timestamp::now()).await;
    let observation = refresh::observe(&talos, &kube, &observed.name)
        .await
        .expect("the twin is observed");
    sim.shutdown().await;
    (
        twin,
        Back {
            census: gathered,
            observation,
        },
    )
}

#[test]
fn the_twin_built_from_a_census_round_trips_the_observed_cluster() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 12,
        max_shrink_iters: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(&world(), |w| {
            let observed = w.observed();
            let census = w.census();
            let (twin, back) = rt.block_on(round_trip(&observed, &census));

            // Nodes: the same names, roles, versions, platforms and extensions ...
            prop_assert_eq!(
                node_views(&back.observation.machines),
                node_views(&observed.machines)
            );
            prop_assert_eq!(
                &back.observation.kubernetes_version,
                &observed.kubernetes_version
            );
            // ... on the twin's loopback addresses only, never an observed one.
            for (name, m) in &back.observation.machines {
                let ip: std::net::IpAddr = m.address.parse().unwrap();
                prop_assert!(ip.is_loopback(), "{name} at {}", m.address);
                prop_assert_eq!(Some(&m.address), twin.addresses.get(name));
                prop_assert_ne!(&m.address, &observed.machines[name].address);
            }
            // The only limit: an evicted StatefulSet pod is not recreated (no controller).
            prop_assert!(
                twin.limits
                    .iter()
                    .all(|l| l.contains("no StatefulSet controller")),
                "{:?}",
                twin.limits
            );

            // Workloads: the same pods on the same nodes with the same owners, labels and
            // volumes, the same budgets allowing the same, the same DaemonSets.
            prop_assert_eq!(normalise(&back.census), normalise(&census));
            Ok(())
        })
        .unwrap();
}
