//! Over configurations with octal modes, `on/off/yes/no` strings, anchors and aliases,
//! comments, flow and block styles and several documents: the edit leaves every byte but
//! the image's.

use proptest::prelude::*;

use super::*;

const SLOT: &str = "\u{1}";
const COMPONENTS: [(Component, &str, &str, &str); 5] = [
    (
        Component::Kubelet,
        "kubelet",
        "KubeletConfig",
        "ghcr.io/siderolabs/kubelet",
    ),
    (
        Component::ApiServer,
        "apiServer",
        "KubeAPIServerConfig",
        "registry.k8s.io/kube-apiserver",
    ),
    (
        Component::ControllerManager,
        "controllerManager",
        "KubeControllerManagerConfig",
        "registry.k8s.io/kube-controller-manager",
    ),
    (
        Component::Scheduler,
        "scheduler",
        "KubeSchedulerConfig",
        "registry.k8s.io/kube-scheduler",
    ),
    (
        Component::Proxy,
        "proxy",
        "KubeProxyConfig",
        "registry.k8s.io/kube-proxy",
    ),
];
/// Lines a real configuration may hold that a YAML 1.1 reader would re-type.
const FILLERS: [&str; 8] = [
    "  files:\n    - content: \"x\"\n      permissions: 0644\n      path: /var/etc/a\n      op: create\n",
    "  sysctls:\n    net.ipv4.ip_forward: on\n    vm.overcommit: off\n",
    "  nodeLabels: {feature: yes, other: no, mode: 0755}\n",
    "  # a comment: off\n",
    "  env: &env\n    A: 'on'\n    B: 010\n  envCopy: *env\n",
    "  banner: |\n    line: 1\n    off\n",
    "  disks: [{device: /dev/sdb, partitions: [{mountpoint: /var/a, size: 0x10}]}]\n",
    "  extraArgs:\n    feature-gates: Foo=true,Bar=false\n    verbose: Yes   # trailing comment\n",
];
const DOCS: [&str; 3] = [
    "apiVersion: v1alpha1\nkind: SideroLinkConfig\napiUrl: https://siderolink.example/?jointoken=off\n",
    "# extension\napiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: nut\nconfigFiles:\n  - content: |-\n      MODE=netclient\n    mountPath: /usr/local/etc/nut/upsmon.conf\nenvironment: [NUT=on]\n",
    "apiVersion: v1alpha1\nkind: NetworkDefaultActionConfig\ningress: block\n",
];

#[derive(Debug, Clone)]
struct Case {
    target: usize,
    quoting: usize,
    comment: bool,
    flow: bool,
    own_doc: bool,
    cluster_first: bool,
    machine_fillers: Vec<usize>,
    cluster_fillers: Vec<usize>,
    docs: Vec<usize>,
    doc_before: bool,
}

fn case() -> impl Strategy<Value = Case> {
    (
        0..5usize,
        0..4usize,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        proptest::sample::subsequence((0..FILLERS.len()).collect::<Vec<_>>(), 0..4),
        proptest::sample::subsequence((0..FILLERS.len()).collect::<Vec<_>>(), 0..4),
        proptest::sample::subsequence((0..DOCS.len()).collect::<Vec<_>>(), 0..3),
        any::<bool>(),
    )
        .prop_map(
            |(target, quoting, comment, flow, own_doc, cluster_first, mf, cf, docs, db)| Case {
                target,
                quoting,
                comment,
                flow,
                own_doc,
                cluster_first,
                machine_fillers: mf,
                cluster_fillers: cf,
                docs,
                doc_before: db,
            },
        )
}

/// The configuration with the target image's text replaced by [`SLOT`].
fn template(c: &Case) -> String {
    let holder = |i: usize, slot: bool| {
        let (_, field, _, repo) = COMPONENTS[i];
        let value = if slot {
            SLOT.to_string()
        } else {
            format!("{repo}:v1.33.4")
        };
        let comment = if slot && c.comment { " # pinned" } else { "" };
        if slot && c.flow {
            format!("  {field}: {{image: {value}, extraArgs: {{v: off}}}}{comment}\n")
        } else {
            format!("  {field}:\n    image: {value}{comment}\n    extraArgs:\n      enabled: on\n")
        }
    };
    let in_v1 = !c.own_doc;
    let anchor = "  annotations:\n    current: &cur registry.k8s.io/pinned:v1.33.4\n";
    let mut machine = String::from("machine:\n  type: controlplane\n");
    let mut cluster = String::from("cluster:\n  clusterName: off\n");
    let first = if c.cluster_first {
        &mut cluster
    } else {
        &mut machine
    };
    first.push_str(anchor);
    for f in &c.machine_fillers {
        machine.push_str(FILLERS[*f]);
    }
    for f in &c.cluster_fillers {
        cluster.push_str(FILLERS[*f]);
    }
    machine.push_str(&holder(0, in_v1 && c.target == 0));
    for i in 1..5 {
        cluster.push_str(&holder(i, in_v1 && c.target == i));
    }
    let mut v1 = String::from("# node config\nversion: v1alpha1\ndebug: no\n");
    if c.cluster_first {
        v1.push_str(&cluster);
        v1.push_str(&machine);
    } else {
        v1.push_str(&machine);
        v1.push_str(&cluster);
    }
    let mut docs: Vec<String> = c.docs.iter().map(|d| DOCS[*d].to_string()).collect();
    if c.own_doc {
        let (_, _, kind, _) = COMPONENTS[c.target];
        let comment = if c.comment { " # pinned" } else { "" };
        docs.push(format!(
            "apiVersion: v1alpha1\nkind: {kind}\nimage: {SLOT}{comment}\nextraArgs:\n  profiling: off\n"
        ));
    }
    if c.doc_before {
        docs.push(v1);
        docs.rotate_right(1);
        docs.reverse();
    } else {
        docs.insert(0, v1);
    }
    docs.join("---\n")
}

fn slot_text(c: &Case, image: &str, original: bool) -> String {
    let quoting = if c.own_doc && c.quoting == 3 {
        0
    } else {
        c.quoting
    };
    match (quoting, original) {
        (1, _) => format!("'{image}'"),
        (2, _) => format!("\"{image}\""),
        (3, true) => "*cur".to_string(),
        _ => image.to_string(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_result_equals_the_input_except_the_image(c in case()) {
        let (component, _, _, repo) = COMPONENTS[c.target];
        let t = template(&c);
        let old_image = format!("{repo}:v1.33.4");
        let new_image = format!("{repo}:v1.34.0");
        let original = t.replace(SLOT, &slot_text(&c, &old_image, true));
        let expected = t.replace(SLOT, &slot_text(&c, &new_image, false));
        let out = set_component_image_in(original.as_bytes(), component, &new_image)
            .map_err(|e| TestCaseError::fail(format!("{e}\n{original}")))?;
        prop_assert_eq!(String::from_utf8(out.clone()).unwrap(), expected);
        prop_assert!(
            check_only_image_changed(original.as_bytes(), &out, component, &new_image).is_ok()
        );
    }

    #[test]
    fn a_missing_image_is_added_and_nothing_else_changes(c in case()) {
        let (component, _, _, repo) = COMPONENTS[c.target];
        // the target's image line removed: the field must be inserted
        let t = template(&c);
        let original: String = if c.flow && !c.own_doc {
            t.replace(&format!("image: {SLOT}, "), "")
        } else {
            t.split_inclusive('\n').filter(|l| !l.contains(SLOT)).collect()
        };
        prop_assume!(!original.contains(SLOT));
        let new_image = format!("{repo}:v1.34.0");
        let out = set_component_image_in(original.as_bytes(), component, &new_image)
            .map_err(|e| TestCaseError::fail(format!("{e}\n{original}")))?;
        check_only_image_changed(original.as_bytes(), &out, component, &new_image)
            .map_err(|e| TestCaseError::fail(format!("{e}\n{}", String::from_utf8_lossy(&out))))?;
        let images = super::super::component_images_of(&out).unwrap();
        prop_assert_eq!(images.get(&component), Some(&new_image));
        // taking the added text out again gives the original back
        let out = String::from_utf8(out).unwrap();
        let back: String = if c.flow && !c.own_doc {
            out.replace(&format!("image: {new_image}, "), "")
        } else {
            out.split_inclusive('\n').filter(|l| !l.contains(&new_image)).collect()
        };
        prop_assert_eq!(back, original);
    }
}
