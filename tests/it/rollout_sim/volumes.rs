//! Volumes detached before a reboot (issue #35 item 3) on the simulator, with the simulated
//! attach/detach controller: a pod with a CSI volume keeps a VolumeAttachment on its node until
//! the pod is gone and the detach delay has passed.

use std::sync::{Arc, Mutex};

use k8s_openapi::api::storage::v1::VolumeAttachment;
use medea::plan::Step;
use medea::rollout::executor::{EventState, RolloutEvent};
use medea::rollout::sequencer::CommandOp;
use medea::sim::kube::{KubeFault, KubeSim, volume_attachment_name};

use super::*;

const DRIVER: &str = "rbd.csi.ceph.com";
const HANDLE: &str = "0001-0009-rook-ceph-0000000000000002-db";

/// One control plane and two workers; `default/db` (a CSI volume) runs on w-1.
async fn sim_with_volume(dir: &Path, detach: Duration) -> Sim {
    let objects = medea::sim::kube::scenario::csi_workload("default", "db", "w-1", DRIVER, HANDLE);
    Sim::start(
        dir,
        1,
        2,
        KubeSimConfig {
            objects,
            volume_detach_delay: detach,
            ..KubeSimConfig::default()
        },
    )
    .await
}

fn attachment(kube: &KubeSim, node: &str) -> Option<serde_json::Value> {
    kube.get(
        "storage.k8s.io/v1",
        "VolumeAttachment",
        "",
        &volume_attachment_name(HANDLE, DRIVER, node),
    )
}

/// What the VolumeAttachment of w-1 looked like when the executor reported something.
#[derive(Debug, Default)]
struct Seen {
    /// At the drain's end of w-1: present (marked deleted).
    after_drain: Option<bool>,
    /// When the executor journaled "no volume attached any more" for w-1.
    at_detached_note: Option<bool>,
    /// When the executor journaled the intent of a call on w-1 (`op`): present?
    at_intent: Vec<(CommandOp, bool)>,
}

fn watch(
    run_events: tokio::sync::broadcast::Receiver<RolloutEvent>,
    kube: Arc<KubeSim>,
) -> Arc<Mutex<Seen>> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let out = seen.clone();
    let mut events = run_events;
    tokio::spawn(async move {
        while let Ok(ev) = events.recv().await {
            // notes name the node in their text; command events carry it
            let about_w1 = ev.node.as_deref() == Some("w-1")
                || matches!(&ev.state, EventState::Progress { note } if note.starts_with("w-1:"));
            if !about_w1 {
                continue;
            }
            let present = attachment(&kube, "w-1").is_some();
            let mut s = out.lock().unwrap_or_else(|e| e.into_inner());
            match (&ev.state, ev.op) {
                (EventState::Done, Some(CommandOp::Drain)) => s.after_drain = Some(present),
                (EventState::Progress { note }, _) if note.contains("no volume attached") => {
                    s.at_detached_note = Some(present)
                }
                (EventState::Intended { .. }, Some(op)) => s.at_intent.push((op, present)),
                _ => {}
            }
        }
    });
    seen
}

/// The attach/detach controller through the `kube` client: the attachment is upstream's
/// (name, attacher, node, volume, attached, the external-attacher's finalizer); deleting the pod
/// marks it deleted, and it is gone after the detach delay; a node whose detach never completes
/// keeps it until the fault is cleared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csi_volume_is_attached_where_its_pod_runs_and_detached_after_the_delay() {
    let dir = tempfile::tempdir().unwrap();
    let sim = sim_with_volume(dir.path(), Duration::from_millis(300)).await;
    let kubeconfig = sim.creds.join(CLUSTER).join("kubeconfig");
    let client =
        kube::Client::try_from(medea::k8s::kubeconfig::load(&kubeconfig).await.unwrap()).unwrap();
    let api: kube::Api<VolumeAttachment> = kube::Api::all(client);
    let list = api.list(&Default::default()).await.unwrap();
    assert_eq!(list.items.len(), 1, "{:?}", list.items);
    let va = &list.items[0];
    let name = volume_attachment_name(HANDLE, DRIVER, "w-1");
    assert_eq!(va.metadata.name.as_deref(), Some(name.as_str()));
    assert!(name.starts_with("csi-") && name.len() == 68, "{name}");
    assert_eq!(va.spec.attacher, DRIVER);
    assert_eq!(va.spec.node_name, "w-1");
    assert_eq!(
        va.spec.source.persistent_volume_name.as_deref(),
        Some("pv-db")
    );
    assert!(va.status.as_ref().unwrap().attached);
    assert_eq!(
        va.metadata.finalizers.as_deref(),
        Some(&["external-attacher/rbd.csi.ceph.com".to_string()][..])
    );

    // the fault first: the detach of w-1 hangs
    sim.kube
        .inject(KubeFault::DetachNeverCompletes { node: "w-1".into() });
    let db = sim
        .kube
        .pods_on("w-1")
        .into_iter()
        .find(|p| p.name.starts_with("db-"))
        .unwrap();
    // move the Deployment's pod off w-1 for good: cordon, then delete the pod
    kube::Api::<k8s_openapi::api::core::v1::Node>::all(api.clone().into_client())
        .patch(
            "w-1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(api.clone().into_client(), "default")
        .delete(&db.name, &Default::default())
        .await
        .unwrap();
    let stuck = attachment(&sim.kube, "w-1").expect("still there while the detach hangs");
    assert!(
        stuck["metadata"]["deletionTimestamp"].is_string(),
        "{stuck}"
    );
    // well past the delay (the simulator's timer for it has fired), still there
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(attachment(&sim.kube, "w-1").is_some(), "the fault holds it");
    sim.kube.clear_faults();
    let mut gone = false;
    for _ in 0..200 {
        if attachment(&sim.kube, "w-1").is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gone, "detached once the fault is cleared");
    assert!(
        api.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

/// C1: the rollout drains w-1; the attachment of its drained pod stays for the detach delay; the
/// node is journaled `detached` only once it is gone, and upgraded (then rebooted) after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upgrade_waits_until_the_drained_pods_volume_is_detached() {
    let dir = tempfile::tempdir().unwrap();
    let sim = sim_with_volume(dir.path(), Duration::from_millis(800)).await;
    assert!(
        attachment(&sim.kube, "w-1").is_some(),
        "attached before the rollout"
    );
    let steps = vec![sim.step("workers", &[&["w-1"]], 1, (60, 60))];
    let run = run_for(&sim, dir.path(), steps).await;
    let seen = watch(run.exec.subscribe(), sim.kube.clone());
    let out = run.go().await;
    assert_eq!(out, RunOutcome::Succeeded);
    let s = seen.lock().unwrap();
    assert_eq!(s.after_drain, Some(true), "attached after the drain: {s:?}");
    assert_eq!(
        s.at_detached_note,
        Some(false),
        "detached when journaled: {s:?}"
    );
    let upgrade = s
        .at_intent
        .iter()
        .find(|(op, _)| *op == CommandOp::Upgrade)
        .unwrap_or_else(|| panic!("{s:?}"));
    assert!(!upgrade.1, "no upgrade while attached: {s:?}");
    let ops: Vec<CommandOp> = s.at_intent.iter().map(|(op, _)| *op).collect();
    let up = ops.iter().position(|o| *o == CommandOp::Upgrade).unwrap();
    let reboot = ops.iter().position(|o| *o == CommandOp::Reboot);
    assert!(reboot.is_none_or(|r| r > up), "{ops:?}");
    assert_eq!(sim.upgrades("w-1"), 1);
}

/// C2: a detach that never completes halts with `volumes_attached` naming the attachment, and
/// nothing is rebooted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detach_that_never_completes_halts_naming_the_attachment_with_nothing_rebooted() {
    let dir = tempfile::tempdir().unwrap();
    let sim = sim_with_volume(dir.path(), Duration::from_millis(100)).await;
    sim.kube
        .inject(KubeFault::DetachNeverCompletes { node: "w-1".into() });
    let mut step = sim.step("workers", &[&["w-1"], &["w-2"]], 1, (60, 60));
    if let Step::Talos(t) = &mut step {
        t.drain.volume_detach_timeout_secs = Some(1);
    }
    let run = run_for(&sim, dir.path(), vec![step]).await;
    let reason = halted_with(&run.go().await, HaltCode::VolumesAttached);
    let name = volume_attachment_name(HANDLE, DRIVER, "w-1");
    assert!(reason.contains(&name), "{reason}");
    for n in ["w-1", "w-2"] {
        assert_eq!(sim.upgrades(n), 0, "{n}");
        assert_eq!(sim.reboots(n), 0, "{n}");
    }
    assert!(
        attachment(&sim.kube, "w-1").is_some(),
        "the attachment is still there"
    );
}

/// Issue #48 item 7: the detach wait covers the volumes of the pods the drain evicted, as
/// tuppr's `EvictableVolumePVs` → `WaitForVolumeDetach` does, not every attachment naming the
/// node: an attachment of a volume no drained pod used (a DaemonSet's, which stays) held every
/// such node until `drain.volumeDetachTimeout` and halted the rollout. Now w-1 waits for the
/// drained database's volume only and is upgraded while the other attachment stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attachment_no_drained_pod_used_does_not_hold_the_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let sim = sim_with_volume(dir.path(), Duration::from_millis(300)).await;
    sim.kube
        .create(serde_json::json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "VolumeAttachment",
            "metadata": {"name": "csi-agent-cache"},
            "spec": {
                "attacher": DRIVER,
                "nodeName": "w-1",
                "source": {"persistentVolumeName": "pv-agent-cache"}
            }
        }))
        .unwrap();
    let mut step = sim.step("workers", &[&["w-1"]], 1, (60, 60));
    if let Step::Talos(t) = &mut step {
        t.drain.volume_detach_timeout_secs = Some(30);
    }
    let run = run_for(&sim, dir.path(), vec![step]).await;
    let seen = watch(run.exec.subscribe(), sim.kube.clone());
    assert_eq!(run.go().await, RunOutcome::Succeeded);
    let s = seen.lock().unwrap();
    assert_eq!(
        s.at_detached_note,
        Some(false),
        "the drained pod's volume was detached first: {s:?}"
    );
    assert_eq!(sim.upgrades("w-1"), 1);
    assert!(
        sim.kube
            .get(
                "storage.k8s.io/v1",
                "VolumeAttachment",
                "",
                "csi-agent-cache"
            )
            .is_some(),
        "the other attachment stays"
    );
}

/// Fails while w-1 runs [`TO`] (the workload breaks there): its wave is rolled back.
struct BreaksOnW1(medea::sim::talos::SimTalos);

impl medea::rollout::ports::HealthProbe for BreaksOnW1 {
    async fn evaluate(
        &self,
        gate: &medea::plan::health::Gate,
        _ctx: &medea::rollout::ports::GateContext,
    ) -> medea::rollout::ports::GateEvaluation {
        use medea::rollout::ports::{GateEvaluation, GateVerdict};
        let broken = self.0.node_state("w-1").unwrap().running == tv(TO);
        GateEvaluation {
            gate: gate.name.clone(),
            verdict: if broken {
                GateVerdict::Fail
            } else {
                GateVerdict::Pass
            },
            detail: format!("w-1 broken: {broken}"),
            samples: Vec::new(),
            dry_run: gate.dry_run,
            error: false,
        }
    }
}

/// C3: a failed gate rolls w-1 back (cordon → drain → `Rollback`, which reboots it): like the
/// upgrade, the rollback call waits until the drained pod's volume is detached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rollback_of_a_wave_also_waits_for_the_volume_to_detach() {
    use medea::plan::health::OnFailure;
    let dir = tempfile::tempdir().unwrap();
    let sim = sim_with_volume(dir.path(), Duration::from_millis(800)).await;
    let mut step = sim.step("workers", &[&["w-1"], &["w-2"]], 1, (60, 60));
    if let Step::Talos(t) = &mut step {
        t.health = Some(crate::rollout_health::policy(
            &["app"],
            0,
            1,
            1,
            OnFailure::Rollback,
        ));
    }
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let obs = sim.observed();
    let job = install(store.as_ref(), &plan(&obs, vec![step], 1), &obs, &[]).unwrap();
    let (talos, kube) = adapters(&sim).await;
    let mut cfg = ExecutorConfig::new(true, dir.path().join("snapshots"));
    cfg.poll = Duration::from_millis(20);
    cfg.backoff_min = Duration::from_millis(20);
    cfg.backoff_max = Duration::from_millis(160);
    cfg.max_sleep = Duration::from_secs(1);
    let exec = Executor::new(store.clone(), talos, kube, SystemClock, cfg)
        .with_probe(BreaksOnW1(sim.talos.clone()));
    let seen = watch(exec.subscribe(), sim.kube.clone());
    let out = tokio::time::timeout(Duration::from_secs(60), exec.run(&job))
        .await
        .expect("within a minute")
        .unwrap();
    let RunOutcome::Halted { reason, .. } = &out else {
        panic!("{out:?}")
    };
    assert_eq!(reason.code(), HaltCode::RolledBack, "{reason}");
    assert_eq!(
        sim.talos.counters("w-1").unwrap().calls(Method::Rollback),
        1
    );
    assert_eq!(sim.talos.node_state("w-1").unwrap().running, tv(FROM));
    let s = seen.lock().unwrap();
    let rollback = s
        .at_intent
        .iter()
        .find(|(op, _)| *op == CommandOp::Rollback)
        .unwrap_or_else(|| panic!("{s:?}"));
    assert!(
        !rollback.1,
        "the Rollback call (a reboot) came while the volume was still attached: {s:?}"
    );
    assert_eq!(sim.upgrades("w-2"), 0, "the next wave untouched");
}
