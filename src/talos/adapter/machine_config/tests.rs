use super::*;

const API: &str = "registry.k8s.io/kube-apiserver:v1.34.0";

fn set(yaml: &str, c: Component, image: &str) -> String {
    let out =
        set_component_image_in(yaml.as_bytes(), c, image).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    check_only_image_changed(yaml.as_bytes(), &out, c, image)
        .unwrap_or_else(|e| panic!("{e}\n{yaml}\n---8<---\n{}", String::from_utf8_lossy(&out)));
    String::from_utf8(out).unwrap()
}

const TYPED: &str = "version: v1alpha1 # generated\nmachine:\n  type: controlplane\n  files:\n    - path: /var/etc/x\n      permissions: 0644\n      op: create\n      content: x\n  sysctls:\n    net.ipv4.ip_forward: on\n    vm.swap: off\n  kubelet:\n    image: ghcr.io/siderolabs/kubelet:v1.33.4 # pinned\n    extraArgs: {rotate-server-certificates: yes}\ncluster:\n  apiServer:\n    image: \"registry.k8s.io/kube-apiserver:v1.33.4\"\n";

#[test]
fn only_the_image_bytes_change() {
    let out = set(TYPED, Component::ApiServer, API);
    assert_eq!(
        out,
        TYPED.replace(
            "registry.k8s.io/kube-apiserver:v1.33.4",
            "registry.k8s.io/kube-apiserver:v1.34.0"
        )
    );
    let out = set(
        TYPED,
        Component::Kubelet,
        "ghcr.io/siderolabs/kubelet:v1.34.0",
    );
    assert_eq!(
        out,
        TYPED.replace("kubelet:v1.33.4 # pinned", "kubelet:v1.34.0 # pinned")
    );
    assert!(out.contains("permissions: 0644") && out.contains("vm.swap: off"));
}

#[test]
fn missing_fields_are_inserted_into_their_mapping() {
    let out = set(
        TYPED,
        Component::Scheduler,
        "registry.k8s.io/kube-scheduler:v1.34.0",
    );
    assert_eq!(
        out,
        TYPED.replace(
            "cluster:\n",
            "cluster:\n  scheduler:\n    image: registry.k8s.io/kube-scheduler:v1.34.0\n"
        )
    );
    let no_cluster = "version: v1alpha1\nmachine:\n  type: worker\n";
    let out = set(
        no_cluster,
        Component::Proxy,
        "registry.k8s.io/kube-proxy:v1.34.0",
    );
    assert_eq!(
        out,
        "cluster:\n  proxy:\n    image: registry.k8s.io/kube-proxy:v1.34.0\nversion: v1alpha1\nmachine:\n  type: worker\n"
    );
    let flow = "version: v1alpha1\ncluster: {apiServer: {certSANs: [a]}, proxy: {}}\n";
    assert_eq!(
        set(flow, Component::ApiServer, API),
        format!(
            "version: v1alpha1\ncluster: {{apiServer: {{image: {API}, certSANs: [a]}}, proxy: {{}}}}\n"
        )
    );
    assert_eq!(
        set(flow, Component::Proxy, "p:v2"),
        "version: v1alpha1\ncluster: {apiServer: {certSANs: [a]}, proxy: {image: p:v2}}\n"
    );
}

#[test]
fn the_components_own_document_is_edited_and_nothing_else() {
    let multi = format!(
        "{TYPED}---\n# api server\napiVersion: v1alpha1\nkind: KubeAPIServerConfig\nimage: 'registry.k8s.io/kube-apiserver:v1.33.4'\nextraArgs:\n  audit: off\n---\napiVersion: v1alpha1\nkind: KubeletConfig\n"
    );
    let out = set(&multi, Component::ApiServer, API);
    assert_eq!(
        out,
        multi.replace(
            "'registry.k8s.io/kube-apiserver:v1.33.4'",
            &format!("'{API}'")
        )
    );
    let out = set(&multi, Component::Kubelet, "k:v2");
    assert_eq!(
        out,
        multi.replace(
            "---\napiVersion: v1alpha1\nkind: KubeletConfig\n",
            "---\nimage: k:v2\napiVersion: v1alpha1\nkind: KubeletConfig\n"
        )
    );
}

#[test]
fn an_alias_is_replaced_and_its_anchor_kept() {
    let t = "version: v1alpha1\nmachine:\n  kubelet:\n    image: &img ghcr.io/siderolabs/kubelet:v1.33.4\n    extraArgs: {note: *img}\ncluster:\n  proxy:\n    image: *img\n";
    let out = set(t, Component::Proxy, "registry.k8s.io/kube-proxy:v1.34.0");
    assert_eq!(
        out,
        t.replace(
            "    image: *img\n",
            "    image: registry.k8s.io/kube-proxy:v1.34.0\n"
        )
    );
    // editing the anchored scalar would change its aliases too: refused before applying
    let e = set_component_image_in(t.as_bytes(), Component::Kubelet, "k:v2")
        .and_then(|o| check_only_image_changed(t.as_bytes(), &o, Component::Kubelet, "k:v2"))
        .unwrap_err();
    assert!(
        matches!(&e, MachineConfigError::UnexpectedChange { path, .. } if path == "/cluster/proxy/image"),
        "{e:?}"
    );
}

#[test]
fn any_other_change_is_refused_before_applying() {
    let good = set_component_image_in(TYPED.as_bytes(), Component::ApiServer, API).unwrap();
    let good = String::from_utf8(good).unwrap();
    // a re-encoding that keeps the values but not the text (what the old code sent)
    let e = check_only_image_changed(
        TYPED.as_bytes(),
        good.replace("vm.swap: off", "vm.swap: false").as_bytes(),
        Component::ApiServer,
        API,
    )
    .unwrap_err();
    assert!(
        matches!(e, MachineConfigError::TextChange { line: 11 }),
        "{e:?}"
    );
    let e = check_only_image_changed(
        TYPED.as_bytes(),
        good.replace("0644", "644").as_bytes(),
        Component::ApiServer,
        API,
    )
    .unwrap_err();
    assert!(
        matches!(&e, MachineConfigError::UnexpectedChange { document: 1, path } if path == "/machine/files/0/permissions"),
        "{e:?}"
    );
    assert!(e.to_string().contains("nothing was applied"));
    // a comment on the image line is part of the text
    let e = check_only_image_changed(
        TYPED.as_bytes(),
        good.replace("# pinned", "# moved").as_bytes(),
        Component::ApiServer,
        API,
    )
    .unwrap_err();
    assert!(matches!(e, MachineConfigError::TextChange { .. }), "{e:?}");
    // the image of another component is another change
    let e = check_only_image_changed(TYPED.as_bytes(), good.as_bytes(), Component::Kubelet, API)
        .unwrap_err();
    assert!(
        matches!(e, MachineConfigError::UnexpectedChange { .. }),
        "{e:?}"
    );
}

#[test]
fn what_cannot_be_edited_in_place_is_refused() {
    // a folded scalar on one line is edited in place
    let folded = "version: v1alpha1\ncluster:\n  apiServer:\n    image: >-\n      registry.k8s.io/kube-apiserver:v1.33.4\n";
    assert_eq!(
        set(folded, Component::ApiServer, API),
        folded.replace("kube-apiserver:v1.33.4", "kube-apiserver:v1.34.0")
    );
    let escaped = "version: v1alpha1\ncluster:\n  apiServer:\n    image: \"registry.k8s.io/kube-apiserver:v1.33.\\x34\"\n";
    let e = set_component_image_in(escaped.as_bytes(), Component::ApiServer, API).unwrap_err();
    assert!(
        matches!(&e, MachineConfigError::NotEditable { path, .. } if path == "cluster.apiServer.image"),
        "{e:?}"
    );
    let e = set_component_image_in(TYPED.as_bytes(), Component::ApiServer, "x: y").unwrap_err();
    assert!(matches!(e, MachineConfigError::BadImage { .. }), "{e:?}");
    let null = "version: v1alpha1\ncluster:\n  apiServer:\n";
    let e = set_component_image_in(null.as_bytes(), Component::ApiServer, API).unwrap_err();
    assert!(matches!(e, MachineConfigError::NotAMapping { .. }), "{e:?}");
}
