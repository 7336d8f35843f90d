//! etcd leadership (issue #48 item 3) and cordon ownership (item 5) on the simulator, through
//! the real adapters: the simulated etcd's leader (named by the scenario) goes last and hands
//! over before its reboot, as the simulator records; a node its operator cordoned (talosctl
//! 1.15's `talos.dev/client-cordoned`) stays cordoned through a rollout and a restart of
//! medea, while every cordon of medea's carries the job's annotation and is lifted with it.

use super::*;
use medea::rollout::ports::CORDONED_BY_ANNOTATION;
use medea::sim::kube::ClusterRecord;

/// The nodes in the order medea cordoned them (the simulated apiserver's record).
fn cordon_order(sim: &Sim) -> Vec<String> {
    sim.kube
        .history()
        .into_iter()
        .filter_map(|r| match r {
            ClusterRecord::Cordoned(n) => Some(n),
            _ => None,
        })
        .collect()
}

fn annotations(sim: &Sim, node: &str) -> BTreeMap<String, String> {
    sim.kube
        .get("v1", "Node", "", node)
        .and_then(|n| n.pointer("/metadata/annotations").cloned())
        .map(|a| serde_json::from_value(a).unwrap())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etcd_leader_goes_last_after_forfeiting() {
    let dir = tempfile::tempdir().unwrap();
    let mut scenario = Scenario::uniform(3, 0, tv(FROM), KubeVersion::parse(KUBE).unwrap());
    scenario.etcd_leader = Some("cp-2".into());
    let sim = Sim::start_scenario(dir.path(), scenario, KubeSimConfig::default()).await;
    assert_eq!(sim.talos.etcd_leader().as_deref(), Some("cp-2"));
    let steps = vec![sim.step(
        "control-plane",
        &[&["cp-1"], &["cp-2"], &["cp-3"]],
        1,
        (60, 60),
    )];
    let run = run_for(&sim, dir.path(), steps).await;
    assert_eq!(run.go().await, RunOutcome::Succeeded);
    for n in ["cp-1", "cp-2", "cp-3"] {
        assert_eq!(sim.talos.node_state(n).unwrap().running, tv(TO), "{n}");
        assert_eq!(sim.reboots(n), 1, "{n}");
    }
    // the plan said cp-1, cp-2, cp-3; cp-2 led etcd, so it went last
    assert_eq!(cordon_order(&sim), ["cp-1", "cp-3", "cp-2"]);
    // cp-2 alone was asked, once, and handed over to the first other member by id
    let forfeits = sim.talos.etcd_forfeits();
    assert_eq!(forfeits.len(), 1, "{forfeits:?}");
    assert_eq!(forfeits[0].node, "cp-2");
    assert!(forfeits[0].error.is_none(), "{forfeits:?}");
    let to = forfeits[0].to.clone().expect("cp-2 led and handed over");
    assert_ne!(to, "cp-2");
    for n in ["cp-1", "cp-3"] {
        assert_eq!(
            sim.talos
                .counters(n)
                .unwrap()
                .calls(Method::EtcdForfeitLeadership),
            0,
            "{n} did not lead: not asked"
        );
    }
    // cp-2 rebooted after it handed over: the leader it handed to still leads
    assert_eq!(sim.talos.etcd_leader(), Some(to));
}

/// The simulated Talos answers `EtcdForfeitLeadership` as upstream: a worker is refused, a
/// member that does not lead names nobody, the leader names the member it handed over to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulator_answers_forfeits_as_talos_does() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 3, 1, KubeSimConfig::default()).await;
    let (talos, _) = adapters(&sim).await;
    assert_eq!(
        sim.talos.etcd_leader().as_deref(),
        Some("cp-1"),
        "default: the first control plane"
    );
    let e = talos
        .etcd_forfeit_leadership(&node(&sim, "w-1"))
        .await
        .unwrap_err();
    assert!(
        medea::error_chain(&e).contains("only available on control plane nodes"),
        "{}",
        medea::error_chain(&e)
    );
    assert_eq!(
        talos
            .etcd_forfeit_leadership(&node(&sim, "cp-3"))
            .await
            .unwrap(),
        None
    );
    let to = talos
        .etcd_forfeit_leadership(&node(&sim, "cp-1"))
        .await
        .unwrap()
        .expect("the leader names its successor");
    assert_ne!(to, "cp-1");
    assert_eq!(sim.talos.etcd_leader(), Some(to.clone()));
    // the adapter's etcd view reports the leader the members agree on
    let cps: Vec<NodeTarget> = ["cp-1", "cp-2", "cp-3"]
        .iter()
        .map(|n| node(&sim, n))
        .collect();
    assert_eq!(talos.etcd(&cps).await.unwrap().leader, Some(to.clone()));
    // a leader going down: the others elect one of them
    sim.talos.reboot_externally(&to).unwrap();
    let elected = sim.talos.etcd_leader().expect("two members are up");
    assert_ne!(elected, to);
}

/// w-2 was cordoned by its operator with talosctl 1.15 before the job. medea is stopped in
/// the middle of the rollout (its run dropped while w-1 is cordoned) and started again: w-1
/// carried the job's annotation while medea held it, w-2 is upgraded and left cordoned, the
/// notes name who cordoned it, and no annotation of medea's is left anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_cordon_stays_through_a_rollout_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 3, KubeSimConfig::default()).await;
    let kubeconfig = sim.creds.join(CLUSTER).join("kubeconfig");
    for args in [
        vec!["annotate", "node", "w-2", "talos.dev/client-cordoned=true"],
        vec!["cordon", "w-2"],
    ] {
        let out = crate::fixtures::tool("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(&args)
            .output()
            .unwrap();
        assert!(out.status.success(), "kubectl {args:?}: {out:?}");
    }
    let steps = vec![sim.step("workers", &[&["w-1"], &["w-2"], &["w-3"]], 2, (60, 60))];
    let run = run_for(&sim, dir.path(), steps).await;
    // the first medea, stopped while it holds w-1 cordoned
    let first = tokio::time::timeout(Duration::from_secs(60), async {
        let go = run.go();
        tokio::pin!(go);
        loop {
            tokio::select! {
                out = &mut go => panic!("the run ended before w-1 was cordoned: {out:?}"),
                () = tokio::time::sleep(Duration::from_millis(5)) => {
                    if sim.cordoned("w-1") {
                        return annotations(&sim, "w-1");
                    }
                }
            }
        }
    })
    .await
    .expect("w-1 is cordoned within a minute");
    assert_eq!(
        first.get(CORDONED_BY_ANNOTATION),
        Some(&run.job.to_string()),
        "medea's cordon names its job: {first:?}"
    );
    // a second medea resumes the job
    assert_eq!(run.go().await, RunOutcome::Succeeded);
    for n in ["w-1", "w-2", "w-3"] {
        assert_eq!(sim.talos.node_state(n).unwrap().running, tv(TO), "{n}");
        assert!(
            !annotations(&sim, n).contains_key(CORDONED_BY_ANNOTATION),
            "{n}: {:?}",
            annotations(&sim, n)
        );
    }
    assert!(!sim.cordoned("w-1") && !sim.cordoned("w-3"));
    assert!(sim.cordoned("w-2"), "the operator's cordon stays");
    assert!(annotations(&sim, "w-2").contains_key("talos.dev/client-cordoned"));
    let notes: Vec<String> = run
        .store
        .scan_records::<JournalEntry>(&entries_prefix(&run.job))
        .unwrap()
        .into_iter()
        .flat_map(|(_, e)| e.notes)
        .collect();
    assert!(
        notes.iter().any(|n| n.starts_with("w-2: left cordoned")),
        "{notes:#?}"
    );
}
