//! A plan computed with a [`PlanMemo`] is the plan computed without one: same result, same
//! id, same rendered and stored bytes, over random sequences of changes to the desired state,
//! the observations, the running jobs and the applied state.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::{MemoStats, PlanInputs, PlanMemo, compute_memo};
use crate::bench::fleet::{FleetSpec, generate};
use crate::desired::Loader;
use crate::desired::source::{Snapshot, SourceFile};
use crate::inventory::Inventory;
use crate::plan::applied::LastApplied;
use crate::plan::render;
use crate::version::TalosVersion;

struct World {
    files: BTreeMap<String, String>,
    inventory: Inventory,
    applied: LastApplied,
    running: BTreeMap<String, String>,
    loader: Loader,
}

impl World {
    fn new(clusters: usize) -> World {
        let fleet = generate(FleetSpec {
            clusters,
            machines_per_cluster: 6,
            seed: 7,
        });
        World {
            files: fleet.files,
            inventory: fleet.inventory,
            applied: LastApplied::default(),
            running: BTreeMap::new(),
            loader: Loader::new(),
        }
    }
    /// The inputs of planning `desired` against this world after the plan `parent`.
    fn inputs<'a>(
        &'a self,
        desired: &'a crate::desired::Desired,
        parent: Option<crate::plan::PlanId>,
    ) -> PlanInputs<'a> {
        PlanInputs {
            parent,
            running: &self.running,
            ..PlanInputs::new(desired, &self.inventory, &self.applied)
        }
    }
    fn cluster(&self, i: usize) -> String {
        format!("c{:04}", i)
    }
    fn desired(&mut self) -> crate::desired::Desired {
        self.loaded().desired
    }
    fn loaded(&mut self) -> crate::desired::Loaded {
        let snap = Snapshot {
            files: self
                .files
                .iter()
                .map(|(p, t)| SourceFile {
                    path: p.clone(),
                    bytes: t.as_bytes().to_vec().into(),
                })
                .collect(),
            markers: Vec::new(),
            commit: None,
            refused: Vec::new(),
        };
        let loaded = self.loader.load_snapshot(snap);
        assert!(!loaded.has_errors(), "{:#?}", loaded.diagnostics);
        loaded
    }
}

#[derive(Debug, Clone)]
enum Change {
    /// Set the desired Talos version of a cluster's pools (some are downgrades: plan errors).
    Talos(usize, usize),
    /// Change a cluster's `maxUnavailable`.
    MaxUnavailable(usize, u8),
    /// Remove a cluster's files from the desired state, or put them back.
    Desired(usize, bool),
    /// A machine's observed state changes (a new generation).
    Observe(usize, usize, u8),
    /// A cluster's record disappears from the inventory.
    Unobserve(usize),
    /// A rollout job starts or ends.
    Running(usize, bool),
    /// The current plan is approved: its applies become the last-applied state.
    Apply,
}

const TALOS: [&str; 4] = ["v1.13.9", "v1.13.2", "v1.12.4", "v1.10.0"];

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        (0..4usize, 0..4usize).prop_map(|(c, v)| Change::Talos(c, v)),
        (0..4usize, 1..4u8).prop_map(|(c, m)| Change::MaxUnavailable(c, m)),
        (0..4usize, any::<bool>()).prop_map(|(c, b)| Change::Desired(c, b)),
        (0..4usize, 0..6usize, any::<u8>()).prop_map(|(c, m, v)| Change::Observe(c, m, v)),
        (0..4usize).prop_map(Change::Unobserve),
        (0..4usize, any::<bool>()).prop_map(|(c, b)| Change::Running(c, b)),
        Just(Change::Apply),
    ]
}

fn apply_change(w: &mut World, original: &World, c: &Change, last: Option<&crate::plan::Plan>) {
    match c {
        Change::Talos(i, v) => {
            let key = format!("{}/pools.yaml", w.cluster(*i));
            if let Some(text) = w.files.get_mut(&key) {
                let mut out = String::new();
                for line in text.split_inclusive('\n') {
                    if line.starts_with("    version: ") {
                        out.push_str(&format!("    version: {}\n", TALOS[*v]));
                    } else {
                        out.push_str(line);
                    }
                }
                *text = out;
            }
        }
        Change::MaxUnavailable(i, m) => {
            let key = format!("{}/cluster.yaml", w.cluster(*i));
            if let Some(text) = w.files.get_mut(&key) {
                let mut out = String::new();
                for line in text.split_inclusive('\n') {
                    if line.starts_with("    maxUnavailable: ") {
                        out.push_str(&format!("    maxUnavailable: {m}\n"));
                    } else {
                        out.push_str(line);
                    }
                }
                *text = out;
            }
        }
        Change::Desired(i, present) => {
            let name = w.cluster(*i);
            for f in ["cluster.yaml", "pools.yaml"] {
                let key = format!("{name}/{f}");
                if *present {
                    if let Some(t) = original.files.get(&key) {
                        w.files.insert(key, t.clone());
                    }
                } else {
                    w.files.remove(&key);
                }
            }
        }
        Change::Observe(i, m, v) => {
            let name = w.cluster(*i);
            let base = original.inventory.clusters.get(&name).cloned();
            let entry = w.inventory.clusters.entry(name).or_insert_with(|| {
                base.clone().unwrap_or_else(|| {
                    std::sync::Arc::new(crate::inventory::ObservedCluster::new("gone"))
                })
            });
            let mut machines = entry.machines.clone();
            if let Some(machine) = machines.values_mut().nth(*m) {
                match v % 3 {
                    0 => machine.ready = !machine.ready,
                    1 => {
                        machine.talos_version =
                            Some(TalosVersion::parse(TALOS[*v as usize % 3]).unwrap())
                    }
                    _ => machine.reachable = !machine.reachable,
                }
            }
            *entry = std::sync::Arc::new(entry.observe(entry.kubernetes_version.clone(), machines));
        }
        Change::Unobserve(i) => {
            let name = w.cluster(*i);
            w.inventory.clusters.remove(&name);
        }
        Change::Running(i, on) => {
            let name = w.cluster(*i);
            if *on {
                w.running.insert(name.clone(), format!("job-{name}"));
            } else {
                w.running.remove(&name);
            }
        }
        Change::Apply => {
            if let Some(plan) = last {
                for r in &plan.applies.put {
                    w.applied.resources.insert(r.key.store_key(), r.clone());
                }
                for k in &plan.applies.delete {
                    w.applied.resources.remove(&k.store_key());
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    #[test]
    fn a_memoized_plan_equals_a_cold_plan(
        changes in proptest::collection::vec((change(), any::<bool>()), 1..14),
        share_first in any::<bool>(),
    ) {
        // Each step either shares its desired state with the memo (as the daemon does: the
        // memo keeps the revision, not copies; an unchanged revision is the same `Arc`, so
        // its clusters compare by pointer) or does not (the memo copies each Cluster), in
        // any order.
        let original = World::new(4);
        let mut w = World::new(4);
        let mut memo = PlanMemo::default();
        let mut last: Option<crate::plan::Plan> = None;
        let mut loaded: Option<std::sync::Arc<crate::desired::Loaded>> = None;
        let steps = std::iter::once((None, share_first))
            .chain(changes.iter().map(|(c, s)| (Some(c), *s)));
        for (c, share) in steps {
            let desired_changed = match c {
                Some(c) => {
                    apply_change(&mut w, &original, c, last.as_ref());
                    matches!(c, Change::Talos(..) | Change::MaxUnavailable(..) | Change::Desired(..))
                }
                None => true,
            };
            let l = match (&loaded, desired_changed) {
                (Some(l), false) => l.clone(),
                _ => std::sync::Arc::new(w.loaded()),
            };
            loaded = Some(l.clone());
            if share {
                memo.share_desired(l.clone());
            }
            let desired = l.valid().unwrap();
            let parent = last.as_ref().map(|p| p.id);
            let cold = compute_memo(&w.inputs(desired, parent), &mut PlanMemo::one_off());
            let warm = compute_memo(&w.inputs(desired, parent), &mut memo);
            prop_assert_eq!(&warm, &cold);
            let stats = memo.last_stats();
            prop_assert_eq!(stats.planned + stats.reused, desired.clusters.len());
            if let (Ok(warm), Ok(cold)) = (&warm, &cold) {
                prop_assert_eq!(warm.id, cold.id);
                prop_assert_eq!(warm.canonical_id(), cold.id);
                let o = render::Options { color: false };
                prop_assert_eq!(render::text(warm, o), render::text(cold, o));
                prop_assert_eq!(serde_json::to_vec(warm).unwrap(), serde_json::to_vec(cold).unwrap());
                // The stored record's JSON, stitched from the sections' JSON, is the plan's.
                prop_assert_eq!(memo.plan_json(warm), serde_json::to_vec(cold).unwrap());
                let mut reparented = warm.clone();
                reparented.parent = None;
                prop_assert_eq!(memo.plan_json(&reparented), serde_json::to_vec(&reparented).unwrap());
            }
            if let Ok(p) = cold {
                last = Some(p);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6))]
    /// Sections planned through the daemon's fan-out (`ops::fan_out`, one thread per lane)
    /// make the plan the calling thread makes, byte for byte, cold and through a memo, over
    /// random changes (40 clusters: above `PARALLEL_FROM`, so the first plan fans out).
    #[test]
    fn a_plan_made_in_several_lanes_equals_one_made_on_one_thread(
        changes in proptest::collection::vec(change(), 1..5),
        lanes in 2..5usize,
    ) {
        let original = World::new(40);
        let mut w = World::new(40);
        let mut one = PlanMemo::default();
        let mut many = PlanMemo::default().fan_out(crate::ops::fan_out, lanes);
        let mut last: Option<crate::plan::Plan> = None;
        for c in std::iter::once(None).chain(changes.iter().map(Some)) {
            if let Some(c) = c {
                apply_change(&mut w, &original, c, last.as_ref());
            }
            let desired = w.desired();
            let parent = last.as_ref().map(|p| p.id);
            let a = compute_memo(&w.inputs(&desired, parent), &mut one);
            let b = compute_memo(&w.inputs(&desired, parent), &mut many);
            prop_assert_eq!(&a, &b);
            prop_assert_eq!(one.last_stats(), many.last_stats());
            if let (Ok(a), Ok(b)) = (&a, &b) {
                prop_assert_eq!(a.id, b.id);
                prop_assert_eq!(b.canonical_id(), b.id);
                prop_assert_eq!(one.plan_json(a), many.plan_json(b));
                prop_assert_eq!(many.plan_json(b), serde_json::to_vec(a).unwrap());
            }
            if let Ok(p) = a {
                last = Some(p);
            }
        }
    }
}

/// A cold plan fans out exactly when it has enough sections to plan, and every lane runs.
#[test]
fn a_cold_plan_of_many_clusters_is_planned_in_lanes() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static JOBS: AtomicUsize = AtomicUsize::new(0);
    fn counting(jobs: Vec<Box<dyn FnOnce() + Send + '_>>) {
        JOBS.fetch_add(jobs.len(), Ordering::SeqCst);
        for j in jobs.into_iter().rev() {
            j();
        }
    }
    let mut w = World::new(40);
    let desired = w.desired();
    let one = compute_memo(&w.inputs(&desired, None), &mut PlanMemo::one_off()).unwrap();
    let laned = compute_memo(
        &w.inputs(&desired, None),
        &mut PlanMemo::one_off().fan_out(counting, 3),
    )
    .unwrap();
    assert_eq!(
        JOBS.load(Ordering::SeqCst),
        3,
        "three lanes handed to the fan-out"
    );
    assert_eq!(
        serde_json::to_vec(&one).unwrap(),
        serde_json::to_vec(&laned).unwrap()
    );
    // below PARALLEL_FROM sections to plan: on the calling thread
    let mut small = World::new(3);
    let d = small.desired();
    compute_memo(
        &small.inputs(&d, None),
        &mut PlanMemo::one_off().fan_out(counting, 3),
    )
    .unwrap();
    assert_eq!(JOBS.load(Ordering::SeqCst), 3, "no fan-out for 3 sections");
}

#[test]
fn only_the_changed_cluster_is_planned_again() {
    let original = World::new(5);
    let mut w = World::new(5);
    let mut memo = PlanMemo::default();
    let run = |w: &mut World, memo: &mut PlanMemo| {
        let desired = w.desired();
        compute_memo(&w.inputs(&desired, None), memo).unwrap()
    };
    let first = run(&mut w, &mut memo);
    assert_eq!(
        memo.last_stats(),
        MemoStats {
            planned: 5,
            reused: 0
        }
    );
    let again = run(&mut w, &mut memo);
    assert_eq!(
        memo.last_stats(),
        MemoStats {
            planned: 0,
            reused: 5
        }
    );
    assert_eq!(again, first);
    // A desired change to one cluster.
    let to = if w.files["c0002/cluster.yaml"].contains("maxUnavailable: 3") {
        1
    } else {
        3
    };
    apply_change(&mut w, &original, &Change::MaxUnavailable(2, to), None);
    let edited = run(&mut w, &mut memo);
    assert_eq!(
        memo.last_stats(),
        MemoStats {
            planned: 1,
            reused: 4
        }
    );
    assert_ne!(edited.id, first.id);
    // An observation of another.
    apply_change(&mut w, &original, &Change::Observe(4, 1, 0), None);
    let observed = run(&mut w, &mut memo);
    assert_eq!(
        memo.last_stats(),
        MemoStats {
            planned: 1,
            reused: 4
        }
    );
    assert_ne!(observed.id, first.id);
    // A job starting on a third.
    apply_change(&mut w, &original, &Change::Running(0, true), None);
    let busy = run(&mut w, &mut memo);
    assert_eq!(
        memo.last_stats(),
        MemoStats {
            planned: 1,
            reused: 4
        }
    );
    assert_eq!(
        busy.clusters[0].status,
        crate::plan::ClusterStatus::RollingOut
    );
}

/// Every input a section receives is in the memo's key: the key of some inputs holds them, and
/// changing any one field of them (a value a section could read) makes the key miss, whether
/// the memo copied the desired `Cluster` or shares the desired state. A field added to
/// [`Inputs`] must be changed here too (the pattern below names every field, so it does not
/// compile until it is), so a section can never read an input the memo's key lacks.
#[test]
fn every_input_is_in_the_key() {
    use super::memo::{Inputs, SectionInputs};
    let original = World::new(2);
    let mut w = World::new(2);
    let name = w.cluster(0);
    let other = w.cluster(1);
    // an applied state, so that the inputs hold some applied resources
    let desired = w.desired();
    let first = compute_memo(&w.inputs(&desired, None), &mut PlanMemo::one_off()).unwrap();
    apply_change(&mut w, &original, &Change::Apply, Some(&first));
    // the same cluster with one desired field changed, and its observation one generation on
    let to = if w.files["c0000/cluster.yaml"].contains("maxUnavailable: 3") {
        1
    } else {
        3
    };
    let mut edited = World::new(2);
    apply_change(&mut edited, &original, &Change::MaxUnavailable(0, to), None);
    let edited = edited.desired();
    let mut moved = (*w.inventory.clusters[&name]).clone();
    moved.generation += 1;
    let moved = std::sync::Arc::new(moved);
    let job = "job-1".to_string();
    let applied: Vec<_> = w
        .applied
        .resources
        .values()
        .filter(|r| r.key.cluster_name() == name)
        .collect();
    assert!(!applied.is_empty(), "the cluster has applied resources");
    let base: SectionInputs<'_> = Inputs {
        name: &name,
        cluster: &desired.clusters[&name],
        observed: w.inventory.clusters.get(&name),
        running: None,
        applied,
    };
    let Inputs {
        name: _,
        cluster: _,
        observed: _,
        running: _,
        applied: _,
    } = &base;
    let changed: Vec<(&str, SectionInputs<'_>)> = vec![
        (
            "name",
            Inputs {
                name: &other,
                ..base.clone()
            },
        ),
        (
            "cluster",
            Inputs {
                cluster: &edited.clusters[&name],
                ..base.clone()
            },
        ),
        (
            "observed (gone)",
            Inputs {
                observed: None,
                ..base.clone()
            },
        ),
        (
            "observed (a new generation)",
            Inputs {
                observed: Some(&moved),
                ..base.clone()
            },
        ),
        (
            "running",
            Inputs {
                running: Some(&job),
                ..base.clone()
            },
        ),
        (
            "applied (one fewer)",
            Inputs {
                applied: base.applied[1..].to_vec(),
                ..base.clone()
            },
        ),
    ];
    for shared in [false, true] {
        let key = base.key(shared);
        // a shared key's Cluster is the one in the desired state the memo holds
        let kept = shared.then_some(base.cluster);
        assert!(base.is_kept_in(&key, kept), "shared {shared}: its own key");
        for (field, inputs) in &changed {
            assert!(
                !inputs.is_kept_in(&key, kept),
                "shared {shared}: a change of {field} is missed by the key"
            );
        }
    }
}
