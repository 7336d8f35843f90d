use super::*;
use crate::sim::talos::fault::{FaultPlan, Trigger};
use crate::version::KubeVersion;

fn cluster() -> TalosSide {
    let s = Scenario::uniform(
        2,
        1,
        TalosVersion::parse("v1.13.2").unwrap(),
        KubeVersion::parse("v1.34.1").unwrap(),
    );
    TalosSide::new(&s, "", 0)
}

fn md(node: Option<&str>) -> MetadataMap {
    let mut m = MetadataMap::new();
    if let Some(n) = node {
        m.insert("node", n.parse().unwrap());
    }
    m
}

#[test]
fn routes_by_name_or_address_and_defaults_to_the_endpoint_node() {
    let mut c = cluster();
    assert_eq!(c.admit(&md(Some("cp-2")), Method::Version).unwrap(), 1);
    assert_eq!(c.admit(&md(Some("127.5.0.4")), Method::Version).unwrap(), 2);
    assert_eq!(c.admit(&md(None), Method::Version).unwrap(), 0);
    let err = c.admit(&md(Some("nope")), Method::Version).unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert_eq!(c.nodes()[1].counters.calls(Method::Version), 1);
}

#[test]
fn refuses_fan_out_and_multi_valued_node() {
    let mut c = cluster();
    let mut m = MetadataMap::new();
    m.insert("nodes", "cp-1".parse().unwrap());
    let err = c.admit(&m, Method::CosiGet).unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("/cosi.resource.State/Get"),
        "{}",
        err.message()
    );
    assert_eq!(c.nodes_metadata_rejections, 1);
    let mut m = MetadataMap::new();
    m.append("node", "cp-1".parse().unwrap());
    m.append("node", "cp-2".parse().unwrap());
    assert_eq!(
        c.admit(&m, Method::Version).unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
}

#[test]
fn reboot_boots_the_installed_entry_with_a_new_boot_id() {
    let mut c = cluster();
    let before = c.nodes()[0].boot_id.clone();
    let img = "ghcr.io/siderolabs/installer:v1.14.0";
    c.install_entry(0, TalosVersion::parse("v1.14.0").unwrap(), img)
        .unwrap();
    let t = c.begin_reboot(0);
    assert_eq!(c.nodes()[0].power, Power::Rebooting);
    assert!(c.admit(&md(Some("cp-1")), Method::Version).is_err());
    assert_eq!(c.nodes()[0].counters.refused(Method::Version), 1);
    c.finish_boot(t);
    assert_eq!(c.nodes()[0].power, Power::Up);
    assert_eq!(c.nodes()[0].running.to_string(), "v1.14.0");
    assert_ne!(c.nodes()[0].boot_id, before);
    c.finish_boot(t);
    assert_eq!(c.nodes()[0].counters.boots, 1, "finishing twice is a no-op");
}

#[test]
fn an_installer_without_the_nodes_schematic_boots_without_its_extensions() {
    const SCHEMATIC: &str = "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515";
    let mut s = Scenario::uniform(
        1,
        2,
        TalosVersion::parse("v1.13.2").unwrap(),
        KubeVersion::parse("v1.34.1").unwrap(),
    );
    for n in &mut s.nodes {
        n.schematic = Some(SCHEMATIC.into());
        n.extensions = [("iscsi-tools".to_string(), "v0.1.6".to_string())].into();
    }
    let mut c = TalosSide::new(&s, "", 0);
    let ext = |c: &TalosSide, name: &str| {
        c.facts()
            .into_iter()
            .find(|f| f.name == name)
            .unwrap()
            .extensions
    };
    assert_eq!(ext(&c, "w-1")["iscsi-tools"], "v0.1.6");
    assert_eq!(ext(&c, "w-1")["schematic"], SCHEMATIC);
    let v = TalosVersion::parse("v1.14.0").unwrap();
    // the node's own factory installer keeps them
    c.install_entry(
        1,
        v.clone(),
        &format!("factory.talos.dev/metal-installer/{SCHEMATIC}:v1.14.0"),
    )
    .unwrap();
    let t = c.begin_reboot(1);
    c.finish_boot(t);
    assert_eq!(c.nodes()[1].running, v);
    assert_eq!(ext(&c, "w-1")["iscsi-tools"], "v0.1.6");
    // the default installer has no schematic: the node comes back without them
    c.install_entry(2, v.clone(), "ghcr.io/siderolabs/installer:v1.14.0")
        .unwrap();
    let t = c.begin_reboot(2);
    c.finish_boot(t);
    assert_eq!(c.nodes()[2].running, v);
    assert!(ext(&c, "w-2").is_empty(), "{:?}", ext(&c, "w-2"));
    assert_eq!(c.nodes()[2].spec.schematic, None);
}

#[test]
fn boot_faults_revert_or_lose_the_node() {
    let mut c = cluster();
    c.faults.push(ArmedFault::new(FaultPlan {
        node: "cp-1".into(),
        on: Trigger::boot(),
        effect: Effect::BootOldVersion,
    }));
    c.faults.push(ArmedFault::new(FaultPlan {
        node: "w-1".into(),
        on: Trigger::boot(),
        effect: Effect::NeverReturn,
    }));
    let img = "ghcr.io/siderolabs/installer:v1.14.0";
    c.install_entry(0, TalosVersion::parse("v1.14.0").unwrap(), img)
        .unwrap();
    let t = c.begin_reboot(0);
    c.finish_boot(t);
    assert_eq!(c.nodes()[0].running.to_string(), "v1.13.2");
    assert_eq!(c.nodes()[0].installed, None, "the failed entry is dropped");
    let t = c.begin_reboot(2);
    c.finish_boot(t);
    assert_eq!(c.nodes()[2].power, Power::Gone);
    assert!(!c.facts().iter().find(|f| f.name == "w-1").unwrap().up);
}

#[test]
fn facts_follow_the_machine_config() {
    let c = cluster();
    let f = c.facts();
    assert_eq!(f[0].name, "cp-1");
    assert_eq!(f[0].kubelet_version, "v1.34.1");
    assert_eq!(f[0].talos_version, "v1.13.2");
    assert_eq!(f[0].static_pod_images.len(), 3);
    assert!(f[2].static_pod_images.is_empty());
}

#[test]
fn health_checks_stop_at_the_first_failure() {
    let mut c = cluster();
    assert!(c.health_checks(&[], &[]).iter().all(|(_, r)| r.is_ok()));
    c.nodes_mut()[1].etcd_healthy = false;
    let r = c.health_checks(&[], &[]);
    assert_eq!(r.len(), 1);
    assert!(r[0].1.as_ref().unwrap_err().contains("etcd"));
}

/// The node index answers what a scan by name or address answers (the first match in node
/// order), also after renames, address changes, added and removed nodes, and for names that
/// collide with other nodes' addresses.
mod find_index {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Edit {
        Rename(usize, u8),
        Readdress(usize, u8),
        Add(u8, u8),
        Remove(usize),
    }

    fn key(k: u8) -> String {
        // a small key space shared by names and addresses, so collisions happen
        if k.is_multiple_of(2) {
            format!("n{}", k % 6)
        } else {
            format!("127.5.0.{}", k % 6)
        }
    }

    fn edit() -> impl Strategy<Value = Edit> {
        prop_oneof![
            (any::<usize>(), any::<u8>()).prop_map(|(i, k)| Edit::Rename(i, k)),
            (any::<usize>(), any::<u8>()).prop_map(|(i, k)| Edit::Readdress(i, k)),
            (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Edit::Add(a, b)),
            any::<usize>().prop_map(Edit::Remove),
        ]
    }

    fn assert_index_equals_scan(c: &TalosSide) {
        let mut keys: Vec<String> = (0..12).map(key).collect();
        keys.push("absent".into());
        for k in &keys {
            assert_eq!(c.find(k), c.find_linear(k), "key {k}");
        }
    }

    proptest! {
        #[test]
        fn the_index_equals_a_scan_after_any_edits(edits in proptest::collection::vec(edit(), 0..24)) {
            let mut c = cluster();
            assert_index_equals_scan(&c);
            for e in edits {
                let len = c.nodes().len();
                match e {
                    Edit::Rename(i, k) if len > 0 => c.nodes_mut()[i % len].spec.name = key(k),
                    Edit::Readdress(i, k) if len > 0 => c.nodes_mut()[i % len].spec.address = key(k),
                    Edit::Add(a, b) => {
                        let mut n = c.nodes()[0].clone();
                        n.spec.name = key(a);
                        n.spec.address = key(b);
                        c.nodes_mut().push(n);
                    }
                    Edit::Remove(i) if len > 1 => {
                        c.nodes_mut().remove(i % len);
                    }
                    _ => {}
                }
                c.reindex();
                assert_index_equals_scan(&c);
            }
        }
    }

    #[test]
    fn a_scenario_cluster_finds_every_node_by_name_and_address() {
        let c = cluster();
        for (i, n) in c.nodes().iter().enumerate() {
            assert_eq!(c.find(&n.spec.name), Some(i));
            assert_eq!(c.find(&n.spec.address), Some(i));
        }
        assert_eq!(c.find("nope"), None);
    }
}

/// The per-node digests kept by [`TalosSide::node_mut`] against hashing every node: after any
/// sequence of the model's own transitions and direct edits, the nodes listed as changed since
/// a generation are every node whose digest differs from then, and the fingerprint moves
/// whenever any node's facts would.
mod digests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Step {
        /// A routed RPC (counts a call; changes no facts).
        Call(usize),
        Reboot(usize),
        Boot(usize),
        Install(usize),
        TryApply(usize),
        RevertTry(usize),
        Crash(usize, bool),
        PodConfig(usize, u64),
        /// Read the fingerprint and every digest, to compare later reads with.
        Mark,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0..3usize).prop_map(Step::Call),
            (0..3usize).prop_map(Step::Reboot),
            (0..3usize).prop_map(Step::Boot),
            (0..3usize).prop_map(Step::Install),
            (0..3usize).prop_map(Step::TryApply),
            (0..3usize).prop_map(Step::RevertTry),
            (0..3usize, any::<bool>()).prop_map(|(i, on)| Step::Crash(i, on)),
            (0..3usize, 1..4u64).prop_map(|(i, v)| Step::PodConfig(i, v)),
            Just(Step::Mark),
        ]
    }

    /// Every node's digest by hashing each one (the reference).
    fn hashed(c: &TalosSide) -> BTreeMap<String, u64> {
        c.nodes()
            .iter()
            .map(|n| (n.spec.name.clone(), digest_of(n)))
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

        #[test]
        fn changed_digests_equal_a_full_hash(steps in proptest::collection::vec(step(), 1..40)) {
            let mut c = cluster();
            let mut marks: Vec<(u64, BTreeMap<String, u64>)> = vec![(c.facts_fingerprint(), hashed(&c))];
            let mut tickets: Vec<RebootTicket> = Vec::new();
            for s in steps {
                match s {
                    Step::Call(i) => {
                        let name = c.nodes()[i].spec.name.clone();
                        let _ = c.admit(&md(Some(&name)), Method::Version);
                    }
                    Step::Reboot(i) => tickets.push(c.begin_reboot(i)),
                    Step::Boot(i) => {
                        if let Some(pos) = tickets.iter().position(|t| t.node == i) {
                            let t = tickets.remove(pos);
                            c.finish_boot(t);
                        }
                    }
                    Step::Install(i) => {
                        let _ = c.install_entry(
                            i,
                            TalosVersion::parse("v1.14.0").unwrap(),
                            "ghcr.io/siderolabs/installer:v1.14.0",
                        );
                    }
                    Step::TryApply(i) => {
                        let g = c.next_apply_generation();
                        let previous = c.nodes()[i].config.clone();
                        c.start_try(i, g, previous);
                        let n = c.node_mut(i);
                        n.config.extend_from_slice(b"\n# edited\n");
                        n.config_version += 1;
                    }
                    Step::RevertTry(i) => {
                        if let Some(g) = c.nodes()[i].try_apply.as_ref().map(|t| t.generation) {
                            c.revert_try(i, g);
                        }
                    }
                    Step::Crash(i, on) => {
                        let n = c.node_mut(i);
                        if on {
                            n.crashing.insert("kube-apiserver".into(), "img".into());
                        } else {
                            n.crashing.clear();
                        }
                    }
                    Step::PodConfig(i, v) => {
                        c.node_mut(i).pod_config_versions.insert("kube-apiserver".into(), v);
                    }
                    Step::Mark => {
                        let g = c.facts_fingerprint();
                        marks.push((g, hashed(&c)));
                    }
                }
                let now = hashed(&c);
                let fingerprint = c.facts_fingerprint();
                prop_assert_eq!(
                    c.node_fingerprints().into_iter().collect::<BTreeMap<_, _>>(),
                    now.clone()
                );
                for (g, then) in &marks {
                    let changed: BTreeMap<String, u64> = c
                        .node_fingerprints_since(*g)
                        .expect("the node list never changed")
                        .into_iter()
                        .collect();
                    for (name, digest) in &now {
                        if then.get(name) != Some(digest) {
                            prop_assert_eq!(changed.get(name), Some(digest), "{} changed after {}", name, g);
                            prop_assert_ne!(fingerprint, *g);
                        }
                    }
                    for (name, digest) in &changed {
                        prop_assert_eq!(now.get(name), Some(digest));
                    }
                }
            }
        }
    }

    #[test]
    fn a_rebuilt_node_list_answers_none_and_a_quiet_one_nothing() {
        let mut c = cluster();
        let g = c.facts_fingerprint();
        assert_eq!(c.node_fingerprints_since(g), Some(Vec::new()));
        let _ = c.admit(&md(Some("cp-2")), Method::Version);
        assert_eq!(c.facts_fingerprint(), g, "a call changes no facts");
        c.begin_reboot(1);
        let after = c.facts_fingerprint();
        assert_ne!(after, g);
        let changed = c.node_fingerprints_since(g).unwrap();
        assert_eq!(changed.len(), 1);
        assert_eq!(changed[0].0, "cp-2");
        c.reindex();
        assert_eq!(c.node_fingerprints_since(after), None);
        let rebuilt = c.facts_fingerprint();
        assert_eq!(c.node_fingerprints_since(rebuilt), Some(Vec::new()));
    }
}

/// Boot entries as upstream's bootloaders keep them (`boot.rs`): what a rollback can still
/// reach after one install, and after a second install over a staged node.
mod boot_entries {
    use super::*;

    fn tv(s: &str) -> TalosVersion {
        TalosVersion::parse(s).unwrap()
    }

    fn one_node(talos: &str, bootloader: Bootloader) -> TalosSide {
        let s = Scenario::uniform(0, 1, tv(talos), KubeVersion::parse("v1.34.1").unwrap());
        let mut c = TalosSide::new(&s, "", 0);
        c.node_mut(0).bootloader = bootloader;
        c
    }

    fn install(c: &mut TalosSide, to: &str) {
        let img = format!("ghcr.io/siderolabs/installer:{to}");
        c.install_entry(0, tv(to), &img).unwrap();
    }

    /// Reboot through Talos (kexec) and come back.
    fn reboot(c: &mut TalosSide) {
        let t = c.begin_reboot(0);
        c.finish_boot(t);
    }

    /// `MachineService.Rollback` then its reboot: the version the node comes back on.
    fn rollback(c: &mut TalosSide) -> Result<TalosVersion, Status> {
        c.revert_boot_entry(0)?;
        reboot(c);
        Ok(c.nodes()[0].running.clone())
    }

    fn entries(c: &TalosSide) -> Vec<String> {
        c.nodes()[0]
            .boot_entries()
            .into_iter()
            .map(|(e, v)| format!("{e}={v}"))
            .collect()
    }

    #[test]
    fn one_install_keeps_the_running_entry_as_the_fallback_on_every_bootloader() {
        for bl in [Bootloader::SdBoot, Bootloader::Grub] {
            let mut c = one_node("v1.13.2", bl);
            install(&mut c, "v1.13.9");
            assert_eq!(c.nodes()[0].installed, Some(tv("v1.13.9")), "{bl:?}");
            reboot(&mut c);
            assert_eq!(c.nodes()[0].running, tv("v1.13.9"), "{bl:?}");
            assert_eq!(rollback(&mut c).unwrap(), tv("v1.13.2"), "{bl:?}");
        }
    }

    /// Before talos PR #14003 the sd-boot probe keeps `LoaderEntryDefault`: on a staged node
    /// that is the staged entry, and the UKI the node runs is removed.
    #[test]
    fn a_second_sd_boot_install_over_a_staged_node_deletes_the_running_entry_before_pr_14003() {
        let mut c = one_node("v1.13.2", Bootloader::SdBoot);
        install(&mut c, "v1.13.9");
        assert_eq!(
            entries(&c),
            ["Talos-v1.13.2.efi=v1.13.2", "Talos-v1.13.9.efi=v1.13.9"]
        );
        install(&mut c, "v1.13.9");
        assert_eq!(
            entries(&c),
            ["Talos-v1.13.9.efi=v1.13.9", "Talos-v1.13.9~1.efi=v1.13.9"],
            "the running v1.13.2 entry is gone"
        );
        reboot(&mut c);
        assert_eq!(c.nodes()[0].running, tv("v1.13.9"));
        assert_eq!(
            rollback(&mut c).unwrap(),
            tv("v1.13.9"),
            "no way back to v1.13.2"
        );
    }

    /// After PR #14003 the probe keeps the booted entry (`LoaderEntrySelected`) after a
    /// firmware boot, so a second install is harmless; after a kexec reboot (Talos' own) it
    /// takes the default as booted again and the running entry goes.
    #[test]
    fn after_pr_14003_a_second_install_keeps_the_running_entry_except_after_a_kexec_boot() {
        // the scenario's first boot went through the firmware
        let mut c = one_node("v1.14.6", Bootloader::SdBoot);
        install(&mut c, "v1.15.0");
        install(&mut c, "v1.15.0");
        assert_eq!(
            entries(&c),
            ["Talos-v1.14.6.efi=v1.14.6", "Talos-v1.15.0~1.efi=v1.15.0"]
        );
        reboot(&mut c);
        assert_eq!(rollback(&mut c).unwrap(), tv("v1.14.6"));
        // now booted through kexec (Talos' reboot): the default is taken as booted
        let mut c = one_node("v1.14.6", Bootloader::SdBoot);
        reboot(&mut c);
        assert!(c.nodes()[0].kexec_boot);
        install(&mut c, "v1.15.0");
        install(&mut c, "v1.15.0");
        assert_eq!(
            entries(&c),
            ["Talos-v1.15.0.efi=v1.15.0", "Talos-v1.15.0~1.efi=v1.15.0"]
        );
    }

    /// GRUB flips the configured default at every install: the second one flips back onto the
    /// running label and overwrites it.
    #[test]
    fn a_second_grub_install_over_a_staged_node_overwrites_the_running_label() {
        let mut c = one_node("v1.13.2", Bootloader::Grub);
        install(&mut c, "v1.13.9");
        assert_eq!(entries(&c), ["A=v1.13.2", "B=v1.13.9"]);
        install(&mut c, "v1.13.9");
        assert_eq!(entries(&c), ["A=v1.13.9", "B=v1.13.9"]);
        reboot(&mut c);
        assert_eq!(c.nodes()[0].running, tv("v1.13.9"));
        assert_eq!(rollback(&mut c).unwrap(), tv("v1.13.9"));
    }

    #[test]
    fn a_rollback_without_another_entry_is_the_bootloaders_error() {
        for (bl, msg) in [
            (Bootloader::SdBoot, "previous UKI not found"),
            (Bootloader::Grub, "label does not exist"),
        ] {
            let mut c = one_node("v1.13.2", bl);
            let e = c.revert_boot_entry(0).unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unknown);
            assert!(e.message().contains(msg), "{bl:?}: {}", e.message());
        }
    }
}

/// Config resources are COSI counters in memory: they restart at every boot, and on Talos
/// >= 1.14 the raw one runs ahead of `final-<component>` (talos#14258's report), which the
/// static pod's annotation follows.
#[test]
fn config_counters_restart_at_every_boot_with_the_raw_one_ahead_of_the_final() {
    let s = Scenario::uniform(
        1,
        0,
        TalosVersion::parse("v1.14.6").unwrap(),
        KubeVersion::parse("v1.36.1").unwrap(),
    );
    let mut c = TalosSide::new(&s, "", 0);
    let api = "kube-apiserver";
    let raw = |c: &TalosSide| c.nodes()[0].component_config_version(api);
    let fin = |c: &TalosSide| c.nodes()[0].final_config_version(api);
    let start = (raw(&c), fin(&c));
    assert!(start.0 > start.1, "raw ahead of final: {start:?}");
    assert_eq!(c.nodes()[0].pod_config_version(api), start.1);
    // an image change moves both on
    c.node_mut(0)
        .component_config_versions
        .insert(api.into(), start.0 + 3);
    c.node_mut(0).restart_static_pod(api);
    assert_eq!((raw(&c), fin(&c)), (start.0 + 3, start.1 + 3));
    // a boot starts them again, and the pod is rendered from the final one
    let t = c.begin_reboot(0);
    c.finish_boot(t);
    assert_eq!((raw(&c), fin(&c)), start);
    assert_eq!(c.nodes()[0].pod_config_version(api), start.1);
}
