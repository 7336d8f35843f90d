//! Machine-config edits (issue 20, item 3): each config goes back byte-identical but the
//! images.

use super::*;

/// What real configurations hold and a YAML 1.1 re-encoding would change: octal modes, `off`
/// and `yes` strings, an anchor and its alias, comments, flow style, another document.
fn typed_extras() -> medea::sim::talos::MachineConfigExtra {
    medea::sim::talos::MachineConfigExtra {
        machine: Some(
            "files:\n  - content: |\n      MODE=off\n    permissions: 0644   # rw-r--r--\n    path: /var/etc/nut/upsmon.conf\n    op: create\nsysctls: &sysctls\n  net.ipv4.ip_forward: on\n  vm.overcommit_memory: off\nnodeLabels: {rack: \"07\", spare: yes}\n".into(),
        ),
        cluster: Some(
            "# headers for extraManifests\nextraManifestHeaders: {X-Mode: off, X-Copy: 0755}\n".into(),
        ),
        documents: Some(
            "---\napiVersion: v1alpha1\nkind: SideroLinkConfig\napiUrl: https://siderolink.example/?jointoken=off\n".into(),
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubernetes_upgrade_sends_each_machine_config_back_byte_identical_but_the_images() {
    let dir = tempfile::tempdir().unwrap();
    let mut scenario = Scenario::uniform(1, 1, tv(FROM), KubeVersion::parse(KUBE).unwrap());
    scenario.machine_config_extra = Some(typed_extras());
    let sim = Sim::start_scenario(dir.path(), scenario, KubeSimConfig::default()).await;
    let before: BTreeMap<String, String> = ["cp-1", "w-1"]
        .iter()
        .map(|n| {
            let c = sim.talos.machine_config(n).unwrap();
            (
                n.to_string(),
                String::from_utf8(c.expose().clone()).unwrap(),
            )
        })
        .collect();
    assert!(before["cp-1"].contains("permissions: 0644   # rw-r--r--"));
    let to = "v1.34.1";
    let run = run_for(
        &sim,
        dir.path(),
        vec![crate::rollout::kube_step(&["cp-1"], &["w-1"], KUBE, to)],
    )
    .await;
    assert_eq!(run.go().await, RunOutcome::Succeeded);
    for (name, old) in &before {
        let new = sim.talos.machine_config(name).unwrap();
        let new = String::from_utf8(new.expose().clone()).unwrap();
        // every component image the step sets moved to the target (on a worker: the kubelet's;
        // its `cluster.proxy` is the control plane's business); not one other byte changed
        let expected = if name.starts_with("cp-") {
            old.replace(&format!(":{KUBE}\n"), &format!(":{to}\n"))
        } else {
            old.replace(&format!("kubelet:{KUBE}\n"), &format!("kubelet:{to}\n"))
        };
        assert_ne!(&expected, old);
        assert_eq!(new, expected, "{name}");
    }
}
