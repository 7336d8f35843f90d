//! The incremental (dirty-set) pass against the full re-derivation: random sequences of
//! changes must leave both with the same cluster, object for object and resourceVersion for
//! resourceVersion; and a change must touch only what it dirties.

use std::sync::Mutex;

use proptest::prelude::*;

use super::super::resources::{DAEMONSETS, DEPLOYMENTS, NODES};
use super::super::scenario;
use super::*;

/// A node source over a plain list (the default per-node digests hash each node's facts).
/// When `tracked`, it also has a fingerprint and lists the nodes changed since one, as the
/// Talos side does (`TalosSide::node_fingerprints_since`), by hashing every node on each
/// read: the kube side then compares only changed nodes' digests.
struct Facts(Mutex<Vec<NodeFacts>>, Option<Mutex<Tracker>>);

/// The generations of a tracked [`Facts`].
#[derive(Default)]
struct Tracker {
    generation: u64,
    /// The node list changed at this generation.
    rebuilt_at: u64,
    /// name → (digest, generation it last changed at).
    digests: BTreeMap<String, (u64, u64)>,
}

fn digest(f: &NodeFacts) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    f.hash(&mut h);
    h.finish()
}

impl Facts {
    /// Bring the tracker up to date with the list (`None` when untracked).
    fn settle(&self) -> Option<std::sync::MutexGuard<'_, Tracker>> {
        let mut t = self.1.as_ref()?.lock().unwrap();
        let now: BTreeMap<String, u64> = self
            .0
            .lock()
            .unwrap()
            .iter()
            .map(|f| (f.name.clone(), digest(f)))
            .collect();
        if !now.keys().eq(t.digests.keys()) {
            t.generation += 1;
            let g = t.generation;
            t.rebuilt_at = g;
            t.digests = now.into_iter().map(|(n, d)| (n, (d, g))).collect();
        } else {
            for (n, d) in now {
                if t.digests[&n].0 != d {
                    t.generation += 1;
                    let g = t.generation;
                    t.digests.insert(n, (d, g));
                }
            }
        }
        Some(t)
    }
}

impl NodeSource for Facts {
    fn nodes(&self) -> Vec<NodeFacts> {
        self.0.lock().unwrap().clone()
    }
    fn fingerprint(&self) -> Option<u64> {
        self.settle().map(|t| t.generation)
    }
    fn node_fingerprints_since(&self, since: u64) -> Option<Vec<(String, u64)>> {
        let t = self.settle()?;
        if since < t.rebuilt_at || since > t.generation {
            return None;
        }
        Some(
            t.digests
                .iter()
                .filter(|(_, (_, at))| *at > since)
                .map(|(n, (d, _))| (n.clone(), *d))
                .collect(),
        )
    }
}

fn facts(name: &str, cp: bool) -> NodeFacts {
    NodeFacts {
        name: name.into(),
        address: format!("10.0.{}.{}", u8::from(cp), name.len()),
        control_plane: cp,
        up: true,
        talos_version: "v1.13.9".into(),
        kubelet_version: "v1.34.1".into(),
        static_pod_images: if cp {
            [
                (
                    "kube-apiserver".to_string(),
                    "registry.k8s.io/kube-apiserver:v1.34.1".to_string(),
                ),
                (
                    "kube-scheduler".to_string(),
                    "registry.k8s.io/kube-scheduler:v1.34.1".to_string(),
                ),
            ]
            .into()
        } else {
            BTreeMap::new()
        },
        crash_looping: Default::default(),
        extensions: Default::default(),
        static_pod_config_versions: Default::default(),
        static_pod_config_file_versions: Default::default(),
    }
}

fn source(control_planes: usize, workers: usize) -> Arc<Facts> {
    source_tracked(control_planes, workers, false)
}

fn source_tracked(control_planes: usize, workers: usize, tracked: bool) -> Arc<Facts> {
    let mut nodes: Vec<NodeFacts> = (1..=control_planes)
        .map(|i| facts(&format!("cp-{i}"), true))
        .chain((1..=workers).map(|i| facts(&format!("w-{i:03}"), false)))
        .collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    Arc::new(Facts(
        Mutex::new(nodes),
        tracked.then(|| Mutex::new(Tracker::default())),
    ))
}

fn side(
    src: Arc<Facts>,
    termination: Duration,
    full_only: bool,
    wall: jiff::Timestamp,
) -> KubeSide {
    let mut c = KubeSide::new(
        src,
        Timing {
            start: Duration::from_secs(2),
            termination,
            crd_establish: Duration::ZERO,
        },
        42,
    );
    c.full_only = full_only;
    for o in scenario::default_scenario() {
        let rt = resources::by_kind(
            o["apiVersion"].as_str().unwrap(),
            o["kind"].as_str().unwrap(),
        )
        .unwrap();
        c.store.create(rt, o, wall).unwrap();
    }
    c
}

/// One change, as a client or the Talos side makes it.
#[derive(Debug, Clone)]
enum Change {
    /// Time passes (milliseconds), then both reconcile.
    Wait(u64),
    Cordon(usize, bool),
    Label(usize),
    /// Evict (terminate) the i-th pod, counted over every pod.
    Evict(usize),
    Power(usize, bool),
    StaticImage(usize, u8),
    Crash(usize, bool),
    /// A new DaemonSet template (the kube-proxy image).
    DaemonSetImage(u8),
    Scale(i32),
    NeverReady(usize),
    ClearFaults,
    /// A client deletes a Node object.
    DeleteNode(usize),
    RemoveMachine(usize),
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        4 => (0u64..4000).prop_map(Change::Wait),
        3 => (0usize..64, any::<bool>()).prop_map(|(n, b)| Change::Cordon(n, b)),
        1 => (0usize..64).prop_map(Change::Label),
        3 => (0usize..256).prop_map(Change::Evict),
        3 => (0usize..64, any::<bool>()).prop_map(|(n, b)| Change::Power(n, b)),
        1 => (0usize..64, 0u8..3).prop_map(|(n, v)| Change::StaticImage(n, v)),
        1 => (0usize..64, any::<bool>()).prop_map(|(n, b)| Change::Crash(n, b)),
        1 => (0u8..3).prop_map(Change::DaemonSetImage),
        1 => (0i32..5).prop_map(Change::Scale),
        1 => (0usize..64).prop_map(Change::NeverReady),
        1 => Just(Change::ClearFaults),
        1 => (0usize..64).prop_map(Change::DeleteNode),
        1 => (0usize..64).prop_map(Change::RemoveMachine),
    ]
}

/// Everything a pass writes or keeps, for comparison.
fn state(c: &KubeSide) -> (Vec<(ObjKey, Value)>, u64, Vec<String>, Vec<String>) {
    let objects = c
        .store
        .objects()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut timers: Vec<String> = c.timers.iter().map(|(u, t)| format!("{u} {t:?}")).collect();
    timers.sort();
    let mut crash: Vec<String> = c
        .crash_looping
        .iter()
        .map(|(n, p)| format!("{n}/{p}"))
        .collect();
    crash.sort();
    (objects, c.store.resource_version(), timers, crash)
}

/// Make the same change on both sides (the node source is shared).
fn apply(
    sides: &mut [&mut KubeSide; 2],
    src: &Facts,
    change: &Change,
    now: &mut Instant,
    wall: &mut jiff::Timestamp,
) {
    let node_at = |i: usize| -> Option<String> {
        let nodes = src.0.lock().unwrap();
        (!nodes.is_empty()).then(|| nodes[i % nodes.len()].name.clone())
    };
    match change {
        Change::Wait(ms) => {
            *now += Duration::from_millis(*ms);
            *wall = wall
                .checked_add(jiff::SignedDuration::from_millis(*ms as i64))
                .unwrap();
        }
        Change::Cordon(i, _) | Change::Label(i) if node_at(*i).is_some() => {
            let name = node_at(*i).unwrap();
            for c in sides.iter_mut() {
                let Some(mut node) = c.store.get(&NODES, "", &name).cloned() else {
                    continue;
                };
                match change {
                    Change::Cordon(_, on) => node["spec"]["unschedulable"] = json!(on),
                    _ => node["metadata"]["labels"]["example.com/pool"] = json!("blue"),
                }
                c.patch_node(&name, &node, *wall).unwrap();
            }
        }
        Change::Evict(i) => {
            let pods = sides[0].pods();
            if !pods.is_empty() {
                let p = &pods[i % pods.len()];
                for c in sides.iter_mut() {
                    c.terminate(&p.namespace, &p.name, *now, *wall);
                }
            }
        }
        Change::Power(i, up) => {
            let mut nodes = src.0.lock().unwrap();
            let len = nodes.len();
            if len > 0 {
                nodes[i % len].up = *up;
            }
        }
        Change::StaticImage(i, v) => {
            let mut nodes = src.0.lock().unwrap();
            let len = nodes.len();
            if len > 0
                && let Some(img) = nodes[i % len].static_pod_images.get_mut("kube-apiserver")
            {
                *img = format!("registry.k8s.io/kube-apiserver:v1.34.{v}");
            }
        }
        Change::Crash(i, on) => {
            let mut nodes = src.0.lock().unwrap();
            let len = nodes.len();
            if len > 0 {
                let n = &mut nodes[i % len];
                if *on && n.control_plane {
                    n.crash_looping.insert("kube-apiserver".into());
                } else {
                    n.crash_looping.clear();
                }
            }
        }
        Change::DaemonSetImage(v) => {
            for c in sides.iter_mut() {
                let mut ds = c
                    .store
                    .get(&DAEMONSETS, "kube-system", "kube-proxy")
                    .unwrap()
                    .clone();
                ds["spec"]["template"]["spec"]["containers"][0]["image"] =
                    json!(format!("registry.k8s.io/kube-proxy:v1.34.{v}"));
                c.store.put(&DAEMONSETS, ds, *wall);
            }
        }
        Change::Scale(n) => {
            for c in sides.iter_mut() {
                let mut d = c.store.get(&DEPLOYMENTS, "default", "web").unwrap().clone();
                d["spec"]["replicas"] = json!(n);
                c.store.put(&DEPLOYMENTS, d, *wall);
            }
        }
        Change::NeverReady(i) => {
            if let Some(node) = node_at(*i) {
                for c in sides.iter_mut() {
                    c.inject(KubeFault::NodeNeverReady { node: node.clone() }, *now);
                }
            }
        }
        Change::ClearFaults => {
            for c in sides.iter_mut() {
                c.clear_faults();
            }
        }
        Change::DeleteNode(i) => {
            if let Some(node) = node_at(*i) {
                for c in sides.iter_mut() {
                    c.store.delete(&NODES, "", &node);
                }
            }
        }
        Change::RemoveMachine(i) => {
            let mut nodes = src.0.lock().unwrap();
            if nodes.len() > 2 {
                let len = nodes.len();
                nodes.remove(i % len);
            }
        }
        Change::Cordon(..) | Change::Label(_) => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn an_incremental_pass_derives_what_a_full_pass_derives(
        workers in 1usize..7,
        graceful in any::<bool>(),
        tracked in any::<bool>(),
        changes in proptest::collection::vec(change(), 1..40),
    ) {
        let src = source_tracked(2, workers, tracked);
        let mut wall = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let termination = if graceful { Duration::from_secs(3) } else { Duration::ZERO };
        let mut full = side(src.clone(), termination, true, wall);
        let mut inc = side(src.clone(), termination, false, wall);
        let mut now = Instant::now();
        full.reconcile(now, wall);
        inc.reconcile(now, wall);
        prop_assert_eq!(state(&full), state(&inc));
        for (step, c) in changes.iter().enumerate() {
            apply(&mut [&mut full, &mut inc], &src, c, &mut now, &mut wall);
            full.reconcile(now, wall);
            inc.reconcile(now, wall);
            prop_assert!(
                state(&full) == state(&inc),
                "after step {} ({:?}) of {:?}: {}",
                step,
                c,
                changes,
                first_difference(&full, &inc)
            );
        }
        prop_assert!(full.inc.incremental_passes == 0);
        prop_assert!(!tracked || changes.len() < 4 || inc.inc.changed_prints > 0);
    }
}

/// The first object that differs, for a readable failure.
fn first_difference(a: &KubeSide, b: &KubeSide) -> String {
    let (oa, rva, ta, ca) = state(a);
    let (ob, rvb, tb, cb) = state(b);
    let ma: BTreeMap<_, _> = oa.into_iter().collect();
    let mb: BTreeMap<_, _> = ob.into_iter().collect();
    for k in ma.keys().chain(mb.keys()) {
        if ma.get(k) != mb.get(k) {
            return format!(
                "{k:?}:\nfull: {}\nincremental: {}",
                serde_json::to_string(&ma.get(k)).unwrap(),
                serde_json::to_string(&mb.get(k)).unwrap()
            );
        }
    }
    format!("rv {rva} vs {rvb}; timers {ta:?} vs {tb:?}; crash {ca:?} vs {cb:?}")
}

#[test]
fn random_changes_run_mostly_incremental_passes() {
    // the property above is only meaningful if the incremental side did run incrementally
    let src = source(2, 4);
    let mut wall = jiff::Timestamp::from_second(1_800_000_000).unwrap();
    let mut full = side(src.clone(), Duration::from_secs(3), true, wall);
    let mut inc = side(src.clone(), Duration::from_secs(3), false, wall);
    let mut now = Instant::now();
    let changes = [
        Change::Cordon(2, true),
        Change::Evict(7),
        Change::Wait(2500),
        Change::Power(3, false),
        Change::Wait(500),
        Change::Power(3, true),
        Change::Wait(4000),
        Change::Cordon(2, false),
        Change::DaemonSetImage(1),
        Change::Wait(4000),
    ];
    full.reconcile(now, wall);
    inc.reconcile(now, wall);
    for c in &changes {
        apply(&mut [&mut full, &mut inc], &src, c, &mut now, &mut wall);
        full.reconcile(now, wall);
        inc.reconcile(now, wall);
        assert!(
            state(&full) == state(&inc),
            "{c:?}: {}",
            first_difference(&full, &inc)
        );
    }
    assert_eq!(full.inc.incremental_passes, 0);
    assert!(
        inc.inc.incremental_passes >= changes.len() as u64 - 1,
        "{} incremental passes",
        inc.inc.incremental_passes
    );
}

#[test]
fn a_cordon_derives_one_node_and_reads_only_that_nodes_pods() {
    // with a source that can only hash every node, and with one that lists changed nodes
    for tracked in [false, true] {
        let src = source_tracked(3, 200, tracked);
        let wall = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let mut c = side(src.clone(), Duration::ZERO, false, wall);
        let now = Instant::now();
        c.reconcile(now, wall);
        c.reconcile(now + Duration::from_secs(3), wall);
        // a pass re-reads what the previous one wrote (every pod started): settle that first
        c.reconcile(now + Duration::from_secs(3), wall);
        let derived = c.inc.nodes_derived;
        let examined = c.inc.pods_examined;
        let mut node = c.store.get(&NODES, "", "w-100").unwrap().clone();
        node["spec"]["unschedulable"] = json!(true);
        c.patch_node("w-100", &node, wall).unwrap();
        c.reconcile(now + Duration::from_secs(3), wall);
        assert!(
            c.inc.nodes_derived - derived <= 2,
            "only the cordoned node (at the patch and at the pass): {}",
            c.inc.nodes_derived - derived
        );
        let pods_here = c
            .pods()
            .iter()
            .filter(|p| p.node.as_deref() == Some("w-100"))
            .count();
        assert!(pods_here >= 2, "kube-proxy and flannel run there");
        assert!(
            c.inc.pods_examined - examined <= pods_here as u64,
            "the kubelet read {} pods, {} are on the node",
            c.inc.pods_examined - examined,
            pods_here
        );
        let ready = c.pods().iter().filter(|p| p.ready).count();
        assert!(ready > 400, "{ready} ready pods: the cluster converged");
        assert_eq!(
            c.inc.changed_prints > 0,
            tracked,
            "a tracked source's changed nodes are read, an untracked one's every node"
        );
    }
}
