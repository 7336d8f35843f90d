//! Simulated nodes' machine configs: real Talos v1alpha1 YAML, generated for a node, and the
//! facts the rest of the simulator derives from it (kubelet and static pod images).
//!
//! Talos 1.14 can move component settings into their own documents (`KubeletConfig`,
//! `KubeAPIServerConfig`, `KubeControllerManagerConfig`, `KubeSchedulerConfig`); an `image` in
//! such a document wins over the v1alpha1 field, as on a real node.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::scenario::{InstallConfig, MachineConfigExtra};
use crate::version::{KubeVersion, TalosVersion};

/// Why a submitted machine config was refused (mapped to `InvalidArgument`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("failed to parse config: {0}")]
    Yaml(String),
    #[error("the config has no v1alpha1 document (`version: v1alpha1`)")]
    NoV1alpha1,
    #[error("machine type can't be changed from `{from}` to `{to}`")]
    TypeChange { from: String, to: String },
}

#[derive(Debug, Default, Deserialize)]
struct Doc {
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    image: Option<String>,
    #[serde(default)]
    machine: Option<serde_json::Value>,
    #[serde(default)]
    cluster: Option<serde_json::Value>,
    /// `UnattendedInstallConfig`'s `installer` (`image`).
    #[serde(default)]
    installer: Option<serde_json::Value>,
}

/// What the simulator reads out of a machine config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigFacts {
    /// `machine.type` (`controlplane`, `worker`, `init`).
    pub machine_type: String,
    pub kubelet_image: String,
    /// `kube-apiserver` / `kube-controller-manager` / `kube-scheduler` → image (control planes).
    pub static_pod_images: BTreeMap<String, String>,
    pub install_image: Option<String>,
    /// The parts whose change needs a reboot on Talos ≤ 1.13 (see [`needs_reboot`]).
    reboot_fields: serde_json::Value,
}

fn str_at<'a>(v: &'a Option<serde_json::Value>, path: &[&str]) -> Option<&'a str> {
    let mut cur = v.as_ref()?;
    for p in path {
        cur = cur.get(p)?;
    }
    cur.as_str()
}

/// Parse a (multi-document) machine config and extract its facts.
pub fn facts(yaml: &[u8]) -> Result<ConfigFacts, ConfigError> {
    let text = std::str::from_utf8(yaml).map_err(|e| ConfigError::Yaml(e.to_string()))?;
    let docs: Vec<Doc> =
        serde_saphyr::from_multiple(text).map_err(|e| ConfigError::Yaml(e.to_string()))?;
    let v1 = docs
        .iter()
        .find(|d| d.version.as_deref() == Some("v1alpha1") && d.kind.is_none())
        .ok_or(ConfigError::NoV1alpha1)?;
    let machine_type = str_at(&v1.machine, &["type"])
        .unwrap_or("worker")
        .to_string();
    let doc_image = |kind: &str| {
        docs.iter()
            .find(|d| d.kind.as_deref() == Some(kind))
            .and_then(|d| d.image.clone())
    };
    let kubelet_image = doc_image("KubeletConfig")
        .or_else(|| str_at(&v1.machine, &["kubelet", "image"]).map(str::to_string))
        .unwrap_or_default();
    let mut static_pod_images = BTreeMap::new();
    if machine_type != "worker" {
        for (component, field, kind) in [
            ("kube-apiserver", "apiServer", "KubeAPIServerConfig"),
            (
                "kube-controller-manager",
                "controllerManager",
                "KubeControllerManagerConfig",
            ),
            ("kube-scheduler", "scheduler", "KubeSchedulerConfig"),
        ] {
            if let Some(img) = doc_image(kind)
                .or_else(|| str_at(&v1.cluster, &[field, "image"]).map(str::to_string))
            {
                static_pod_images.insert(component.to_string(), img);
            }
        }
    }
    let machine = v1.machine.clone().unwrap_or_default();
    let reboot_fields = serde_json::json!({
        "disk": machine.pointer("/install/disk"),
        "extraKernelArgs": machine.pointer("/install/extraKernelArgs"),
        "kernel": machine.get("kernel"),
    });
    Ok(ConfigFacts {
        machine_type,
        kubelet_image,
        static_pod_images,
        // `machine.install.image`, or a Talos 1.14 `UnattendedInstallConfig` document's
        // `installer.image` (`pkg/machinery/config/types/runtime/unattended_install.go`)
        install_image: str_at(&v1.machine, &["install", "image"])
            .or_else(|| {
                docs.iter()
                    .filter(|d| d.kind.as_deref() == Some("UnattendedInstallConfig"))
                    .find_map(|d| str_at(&d.installer, &["image"]))
            })
            .map(str::to_string),
        reboot_fields,
    })
}

/// Whether going from `old` to `new` needs a reboot on Talos ≤ 1.13. The simulator's model:
/// changes to `machine.install.disk`, `machine.install.extraKernelArgs` or `machine.kernel`
/// need one; everything else applies live.
pub fn needs_reboot(old: &ConfigFacts, new: &ConfigFacts) -> bool {
    old.reboot_fields != new.reboot_fields
}

/// The version in an image tag (`ghcr.io/siderolabs/kubelet:v1.34.1` → `v1.34.1`), if any.
pub fn tag_version(image: &str) -> Option<String> {
    crate::sim::reference::tag_of(image).map(str::to_string)
}

/// Inputs of a generated node config.
pub struct NodeConfigSpec<'a> {
    pub cluster_name: &'a str,
    pub hostname: &'a str,
    pub address: &'a str,
    pub control_plane: bool,
    /// The control-plane endpoint host (the first control plane's address).
    pub endpoint: &'a str,
    pub talos: &'a TalosVersion,
    pub kubernetes: &'a KubeVersion,
    /// PEM of the OS CA (its certificate only; the key is never in a config).
    pub ca_pem: &'a str,
    /// Scenario text added as written ([`MachineConfigExtra`]).
    pub extra: Option<&'a MachineConfigExtra>,
    /// The installer image the config names ([`super::scenario::NodeSpec::config_installer`]).
    pub installer: &'a str,
    /// Where: `machine.install.image` (`V1alpha1`), or an `UnattendedInstallConfig` document
    /// (and no `machine.install`).
    pub install_config: InstallConfig,
}

/// `text` with every non-empty line indented by two spaces, ending with a newline.
fn indented(text: &str) -> String {
    let mut out = String::new();
    for line in text.split_inclusive('\n') {
        if !line.trim().is_empty() {
            out.push_str("  ");
        }
        out.push_str(line);
    }
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

/// Generate a v1alpha1 machine config like `talosctl gen config` would (secrets are
/// deterministic placeholders: this is a simulator).
pub fn generate(s: &NodeConfigSpec<'_>) -> String {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(s.ca_pem);
    let k = s.kubernetes;
    let machine_type = if s.control_plane {
        "controlplane"
    } else {
        "worker"
    };
    let mut out = format!(
        r#"version: v1alpha1
debug: false
persist: true
machine:
  type: {machine_type}
  token: sim000.simulatedtoken00
  ca:
    crt: {ca}
    key: ""
  certSANs: []
  kubelet:
    image: ghcr.io/siderolabs/kubelet:{k}
    defaultRuntimeSeccompProfileEnabled: true
    disableManifestsDirectory: true
  network:
    hostname: {host}
{install}  features:
    rbac: true
    stableHostname: true
{machine_extra}cluster:
  id: c2ltdWxhdGVkLWNsdXN0ZXItaWQ=
  secret: c2ltdWxhdGVkLWNsdXN0ZXItc2VjcmV0
  controlPlane:
    endpoint: https://{endpoint}:6443
  clusterName: {cluster}
  network:
    dnsDomain: cluster.local
    podSubnets:
      - 10.244.0.0/16
    serviceSubnets:
      - 10.96.0.0/12
  token: simtok.simulatedtoken00
  ca:
    crt: {ca}
    key: ""
  proxy:
    image: registry.k8s.io/kube-proxy:{k}
"#,
        host = s.hostname,
        machine_extra = s
            .extra
            .and_then(|e| e.machine.as_deref())
            .map(indented)
            .unwrap_or_default(),
        install = match s.install_config {
            InstallConfig::V1alpha1 => format!(
                "  install:\n    disk: /dev/sda\n    image: {}\n    wipe: false\n",
                s.installer
            ),
            InstallConfig::UnattendedInstallConfig => String::new(),
        },
        endpoint = s.endpoint,
        cluster = s.cluster_name,
    );
    if s.control_plane {
        out.push_str(&format!(
            r#"  apiServer:
    image: registry.k8s.io/kube-apiserver:{k}
    certSANs:
      - {addr}
  controllerManager:
    image: registry.k8s.io/kube-controller-manager:{k}
  scheduler:
    image: registry.k8s.io/kube-scheduler:{k}
  etcd:
    ca:
      crt: {ca}
      key: ""
"#,
            addr = s.address,
        ));
    }
    if let Some(e) = s.extra {
        if let Some(c) = e.cluster.as_deref() {
            out.push_str(&indented(c));
        }
        if let Some(d) = e.documents.as_deref() {
            if !d.trim_start().starts_with("---") {
                out.push_str("---\n");
            }
            out.push_str(d);
            if !d.ends_with('\n') {
                out.push('\n');
            }
        }
    }
    if s.install_config == InstallConfig::UnattendedInstallConfig {
        out.push_str(&format!(
            "---\napiVersion: v1alpha1\nkind: UnattendedInstallConfig\ninstaller:\n  image: {}\nprovisioning:\n  diskSelector:\n    match: disk.dev_path == \"/dev/sda\"\n  wipe: false\n",
            s.installer
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(cp: bool) -> String {
        generate(&NodeConfigSpec {
            cluster_name: "sim",
            hostname: "cp-1",
            address: "127.5.0.2",
            control_plane: cp,
            endpoint: "127.5.0.2",
            talos: &TalosVersion::parse("v1.13.9").unwrap(),
            kubernetes: &KubeVersion::parse("v1.34.1").unwrap(),
            ca_pem: "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n",
            extra: None,
            installer: "ghcr.io/siderolabs/installer:v1.13.9",
            install_config: InstallConfig::V1alpha1,
        })
    }

    #[test]
    fn an_unattended_install_config_document_carries_the_installer() {
        let installer = "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.14.6";
        let config = generate(&NodeConfigSpec {
            cluster_name: "sim",
            hostname: "w-1",
            address: "127.5.0.5",
            control_plane: false,
            endpoint: "127.5.0.2",
            talos: &TalosVersion::parse("v1.14.6").unwrap(),
            kubernetes: &KubeVersion::parse("v1.35.8").unwrap(),
            ca_pem: "",
            extra: None,
            installer,
            install_config: InstallConfig::UnattendedInstallConfig,
        });
        assert!(!config.contains("  install:\n"), "{config}");
        assert!(
            config.contains(&format!(
                "---\napiVersion: v1alpha1\nkind: UnattendedInstallConfig\ninstaller:\n  image: {installer}\n"
            )),
            "{config}"
        );
        assert_eq!(
            facts(config.as_bytes()).unwrap().install_image.as_deref(),
            Some(installer)
        );
    }

    #[test]
    fn generated_configs_carry_the_versions() {
        let f = facts(spec(true).as_bytes()).unwrap();
        assert_eq!(f.machine_type, "controlplane");
        assert_eq!(f.kubelet_image, "ghcr.io/siderolabs/kubelet:v1.34.1");
        assert_eq!(
            f.static_pod_images
                .get("kube-apiserver")
                .map(String::as_str),
            Some("registry.k8s.io/kube-apiserver:v1.34.1")
        );
        assert_eq!(f.static_pod_images.len(), 3);
        assert_eq!(
            f.install_image.as_deref(),
            Some("ghcr.io/siderolabs/installer:v1.13.9")
        );
        let w = facts(spec(false).as_bytes()).unwrap();
        assert_eq!(w.machine_type, "worker");
        assert!(w.static_pod_images.is_empty());
    }

    #[test]
    fn multi_doc_component_configs_override_v1alpha1_fields() {
        let yaml = format!(
            "{}---\napiVersion: v1alpha1\nkind: KubeAPIServerConfig\nimage: registry.k8s.io/kube-apiserver:v1.35.0\n---\napiVersion: v1alpha1\nkind: KubeletConfig\nimage: ghcr.io/siderolabs/kubelet:v1.35.0\n",
            spec(true)
        );
        let f = facts(yaml.as_bytes()).unwrap();
        assert_eq!(f.kubelet_image, "ghcr.io/siderolabs/kubelet:v1.35.0");
        assert_eq!(
            f.static_pod_images["kube-apiserver"],
            "registry.k8s.io/kube-apiserver:v1.35.0"
        );
        assert_eq!(
            f.static_pod_images["kube-scheduler"],
            "registry.k8s.io/kube-scheduler:v1.34.1"
        );
    }

    #[test]
    fn reboot_detection_and_refusals() {
        let base = spec(true);
        let a = facts(base.as_bytes()).unwrap();
        let kubelet = base.replace("kubelet:v1.34.1", "kubelet:v1.35.0");
        assert!(!needs_reboot(&a, &facts(kubelet.as_bytes()).unwrap()));
        let disk = base.replace("disk: /dev/sda", "disk: /dev/vda");
        assert!(needs_reboot(&a, &facts(disk.as_bytes()).unwrap()));
        assert_eq!(
            facts(b"apiVersion: v1alpha1\nkind: KubeletConfig\n").unwrap_err(),
            ConfigError::NoV1alpha1
        );
        assert!(matches!(
            facts(b"machine: [unclosed"),
            Err(ConfigError::Yaml(_))
        ));
        assert_eq!(
            tag_version("ghcr.io/siderolabs/kubelet:v1.34.1").as_deref(),
            Some("v1.34.1")
        );
    }
}
