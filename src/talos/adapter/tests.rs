use super::*;

fn v(s: &str) -> TalosVersion {
    TalosVersion::parse(s).unwrap()
}

fn efivar(value: &str) -> Vec<u8> {
    let mut out = 7u32.to_le_bytes().to_vec();
    for u in value.encode_utf16().chain([0]) {
        out.extend_from_slice(&u.to_le_bytes());
    }
    out
}

#[test]
fn component_args_come_from_the_component_document_or_v1alpha1() {
    let yaml = br#"version: v1alpha1
machine:
  kubelet:
    extraArgs:
      --cloud-config: /etc/cloud.conf
      max-pods: 250
cluster:
  apiServer:
    extraArgs:
      feature-gates: A=true,B=false
  scheduler:
    extraArgs:
      bind-address: 0.0.0.0
---
apiVersion: v1alpha1
kind: KubeSchedulerConfig
extraArgs:
  feature-gates:
    - X=true
    - Y=false
"#;
    let a = component_args_of(yaml).unwrap();
    assert_eq!(a[&Component::Kubelet]["cloud-config"], "/etc/cloud.conf");
    assert_eq!(a[&Component::Kubelet]["max-pods"], "250");
    assert_eq!(a[&Component::ApiServer]["feature-gates"], "A=true,B=false");
    // the document wins over v1alpha1
    assert_eq!(a[&Component::Scheduler]["feature-gates"], "X=true,Y=false");
    assert!(!a[&Component::Scheduler].contains_key("bind-address"));
    assert!(!a.contains_key(&Component::ControllerManager));
    assert!(matches!(
        component_args_of(b"apiVersion: v1alpha1\nkind: KubeletConfig\n"),
        Err(MachineConfigError::NoV1alpha1)
    ));
}

#[test]
fn the_default_boot_entry_says_what_boots_next() {
    let running = v("v1.13.2");
    assert_eq!(
        next_boot_from_efivar(&efivar("Talos-v1.13.2.efi"), &running),
        NextBoot::Same
    );
    assert_eq!(
        next_boot_from_efivar(&efivar("Talos-v1.13.9.efi"), &running),
        NextBoot::Version(v("v1.13.9"))
    );
    assert_eq!(
        next_boot_from_efivar(&efivar("talos-v1.14.0-rc.1.EFI"), &running),
        NextBoot::Version(v("v1.14.0-rc.1"))
    );
    // reinstall entries: `Talos-<v>~<N>.efi`
    assert_eq!(
        next_boot_from_efivar(&efivar("Talos-v1.13.9~1.efi"), &running),
        NextBoot::Version(v("v1.13.9"))
    );
    assert_eq!(
        next_boot_from_efivar(&efivar("Talos-v1.13.2~12.efi"), &running),
        NextBoot::Same
    );
    for unknown in [
        efivar("Talos-v1.13.9~.efi"),
        efivar("Talos-v1.13.9~x.efi"),
        efivar("ubuntu.efi"),
        efivar("Talos-latest.efi"),
        efivar(""),
        vec![7, 0],
        vec![7, 0, 0, 0, b'T'],
        // an unpaired surrogate
        vec![7, 0, 0, 0, 0x00, 0xd8, 0, 0],
    ] {
        assert_eq!(
            next_boot_from_efivar(&unknown, &running),
            NextBoot::Unknown,
            "{unknown:?}"
        );
    }
}

#[test]
fn missing_files_and_in_progress_upgrades_are_recognised() {
    let rpc = |code, message: &str| TalosError::Rpc {
        op: "x",
        node: "n".into(),
        code,
        message: message.into(),
    };
    assert!(file_absent(&rpc(Code::NotFound, "open x: nope")));
    assert!(file_absent(&rpc(
        Code::Unknown,
        "stat /sys/firmware/efi/efivars/x: no such file or directory"
    )));
    assert!(!file_absent(&rpc(Code::Unavailable, "connection refused")));
    assert!(upgrade_in_progress(&rpc(
        Code::FailedPrecondition,
        "another installation/upgrade is already in progress"
    )));
    assert!(!upgrade_in_progress(&rpc(
        Code::FailedPrecondition,
        "machine is not installed"
    )));
}

#[test]
fn errors_sort_into_transient_and_failed() {
    let rpc = |code| TalosError::Rpc {
        op: "x",
        node: "n".into(),
        code,
        message: String::new(),
    };
    assert!(is_transient(&rpc(Code::Unavailable)));
    assert!(is_transient(&rpc(Code::DeadlineExceeded)));
    assert!(!is_transient(&rpc(Code::PermissionDenied)));
    assert!(!is_transient(&rpc(Code::FailedPrecondition)));
    assert!(is_transient(&TalosError::Indeterminate {
        op: "LifecycleService.Upgrade",
        node: "n".into(),
        code: Code::Unavailable,
        message: "connection reset".into(),
    }));
    assert!(!is_transient(&TalosError::Refused {
        op: "MachineService.Upgrade",
        node: "n".into(),
        code: Code::Internal,
        message: "failed to run installer: disk full".into(),
    }));
    assert!(!is_transient(&TalosError::UpgradeExit {
        node: "n".into(),
        image: "i:v1".into(),
        exit_code: 1,
        output: vec![],
    }));
}

const V1: &str = "version: v1alpha1\nmachine:\n  type: controlplane\n  kubelet:\n    image: ghcr.io/siderolabs/kubelet:v1.33.4\n  token: s3cr3t\ncluster:\n  apiServer:\n    image: registry.k8s.io/kube-apiserver:v1.33.4\n  proxy:\n    image: registry.k8s.io/kube-proxy:v1.33.4\n";

#[test]
fn component_images_come_from_v1alpha1_or_the_component_document() {
    let imgs = component_images_of(V1.as_bytes()).unwrap();
    assert_eq!(
        imgs.get(&Component::ApiServer).map(String::as_str),
        Some("registry.k8s.io/kube-apiserver:v1.33.4")
    );
    assert_eq!(imgs.get(&Component::Scheduler), None);
    let multi = format!(
        "{V1}---\napiVersion: v1alpha1\nkind: KubeletConfig\nimage: ghcr.io/siderolabs/kubelet:v1.34.0\n"
    );
    let imgs = component_images_of(multi.as_bytes()).unwrap();
    assert_eq!(
        imgs.get(&Component::Kubelet).map(String::as_str),
        Some("ghcr.io/siderolabs/kubelet:v1.34.0"),
        "the document wins over the v1alpha1 field"
    );
}

#[test]
fn patching_writes_where_the_node_keeps_the_image_and_keeps_the_rest() {
    let out = set_component_image_in(
        V1.as_bytes(),
        Component::Scheduler,
        "registry.k8s.io/kube-scheduler:v1.34.0",
    )
    .unwrap();
    let imgs = component_images_of(&out).unwrap();
    assert_eq!(
        imgs.get(&Component::Scheduler).map(String::as_str),
        Some("registry.k8s.io/kube-scheduler:v1.34.0")
    );
    assert_eq!(
        imgs.get(&Component::ApiServer).map(String::as_str),
        Some("registry.k8s.io/kube-apiserver:v1.33.4")
    );
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("s3cr3t"), "the rest of the config is kept");

    let multi = format!(
        "{V1}---\napiVersion: v1alpha1\nkind: KubeAPIServerConfig\nimage: registry.k8s.io/kube-apiserver:v1.33.4\n"
    );
    let out = set_component_image_in(
        multi.as_bytes(),
        Component::ApiServer,
        "registry.k8s.io/kube-apiserver:v1.34.0",
    )
    .unwrap();
    let docs = parse_docs(&out).unwrap();
    assert_eq!(docs.len(), 2);
    assert_eq!(
        docs[0]["cluster"]["apiServer"]["image"], "registry.k8s.io/kube-apiserver:v1.33.4",
        "the v1alpha1 field is left alone when the document exists"
    );
    assert_eq!(docs[1]["image"], "registry.k8s.io/kube-apiserver:v1.34.0");
}

#[test]
fn bad_configs_are_named_without_quoting_them() {
    let e = component_images_of(b"machine: {token: [s3cr3t\n").unwrap_err();
    assert!(matches!(e, MachineConfigError::Yaml { .. }), "{e:?}");
    assert!(!e.to_string().contains("s3cr3t"));
    let e =
        set_component_image_in(b"kind: KubeletConfig\n", Component::ApiServer, "x:v1").unwrap_err();
    assert_eq!(e, MachineConfigError::NoV1alpha1);
}

#[test]
fn struct_numbers_become_integers_where_integral() {
    let v = integral_numbers(serde_json::json!({"replicas": 2.0, "ratio": 0.5, "l": [1.0]}));
    assert_eq!(
        v,
        serde_json::json!({"replicas": 2, "ratio": 0.5, "l": [1]})
    );
}

#[test]
fn etcd_urls_give_their_host() {
    assert_eq!(url_host("https://10.0.0.2:2379"), Some("10.0.0.2"));
    assert_eq!(url_host("https://[fd00::2]:2380"), Some("fd00::2"));
    assert_eq!(url_host("https://cp-1"), Some("cp-1"));
    assert_eq!(url_host(""), None);
}

/// After a reboot on Talos 1.14 apid refuses the client's role for a while (tuppr#453): a
/// read refused with `PermissionDenied` is "not back yet", a mutating call refused so stays a
/// failure.
#[test]
fn permission_denied_is_transient_on_reads_only() {
    let denied = || TalosError::Rpc {
        op: "x",
        node: "n".into(),
        code: Code::PermissionDenied,
        message: "not authorized".into(),
    };
    assert!(classify_read("MachineService.Version", "n", denied()).is_transient());
    assert!(!classify("MachineService.Reboot", "n", denied()).is_transient());
    let other = TalosError::Rpc {
        op: "x",
        node: "n".into(),
        code: Code::InvalidArgument,
        message: "bad".into(),
    };
    assert!(!classify_read("MachineService.Version", "n", other).is_transient());
}
