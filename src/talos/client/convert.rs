//! Wire ↔ domain: the prost types of the Talos API turned into medea's domain types
//! ([`crate::talos::types`]) and back, and the checks a reply must pass (one message, no
//! per-node error in its metadata).

use std::time::Duration;

use crate::talos::TalosError;
use crate::talos::proto::common;
use crate::talos::proto::cosi::resource as cosi;
use crate::talos::proto::talos::resource::definitions::enums;
use crate::talos::types::*;

/// The containerd instance `talosctl upgrade` pulls the installer into (`--namespace system`).
pub(super) fn system_containerd() -> common::ContainerdInstance {
    containerd(PullNamespace::System)
}

pub(super) fn containerd_namespace(ns: PullNamespace) -> common::ContainerdNamespace {
    match ns {
        PullNamespace::System => common::ContainerdNamespace::NsSystem,
        PullNamespace::Cri => common::ContainerdNamespace::NsCri,
    }
}

pub(super) fn containerd(ns: PullNamespace) -> common::ContainerdInstance {
    common::ContainerdInstance {
        driver: common::ContainerDriver::Cri as i32,
        namespace: containerd_namespace(ns) as i32,
    }
}

pub(super) fn bad_reply(
    op: &'static str,
    node: &NodeTarget,
    what: impl Into<String>,
) -> TalosError {
    TalosError::BadReply {
        op,
        node: node.to_string(),
        what: what.into(),
    }
}

/// The single message of a single-node reply.
pub(super) fn first<T>(
    op: &'static str,
    node: &NodeTarget,
    messages: Vec<T>,
) -> Result<T, TalosError> {
    messages
        .into_iter()
        .next()
        .ok_or_else(|| bad_reply(op, node, "the reply has no messages"))
}

/// Legacy proxies report per-node failures in `metadata.error`; treat it as an error.
#[allow(deprecated)]
pub(super) fn check_metadata(
    op: &'static str,
    node: &NodeTarget,
    md: &Option<common::Metadata>,
) -> Result<(), TalosError> {
    match md {
        Some(m) if !m.error.is_empty() => Err(TalosError::NodeError {
            op,
            node: node.to_string(),
            message: m.error.clone(),
        }),
        _ => Ok(()),
    }
}

pub(super) fn prost_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

pub(super) fn cosi_resource(r: cosi::Resource) -> CosiResource {
    let md = r.metadata.unwrap_or_default();
    let spec = r.spec.unwrap_or_default();
    CosiResource {
        namespace: md.namespace,
        resource_type: md.r#type,
        id: md.id,
        version: md.version,
        phase: md.phase,
        proto_spec: crate::secret::Secret::new(spec.proto_spec),
        yaml_spec: crate::secret::Secret::new(spec.yaml_spec),
    }
}

pub(super) fn decode_spec<M: prost::Message + Default>(
    op: &'static str,
    node: &NodeTarget,
    r: &CosiResource,
) -> Result<M, TalosError> {
    M::decode(r.proto_spec.expose().as_slice()).map_err(|e| {
        bad_reply(
            op,
            node,
            format!("the {} spec does not decode: {e}", r.resource_type),
        )
    })
}

pub(super) fn machine_stage(stage: i32) -> MachineStage {
    use enums::RuntimeMachineStage as S;
    match S::try_from(stage).unwrap_or(S::MachineStageUnknown) {
        S::MachineStageUnknown => MachineStage::Unknown,
        S::MachineStageBooting => MachineStage::Booting,
        S::MachineStageInstalling => MachineStage::Installing,
        S::MachineStageMaintenance => MachineStage::Maintenance,
        S::MachineStageRunning => MachineStage::Running,
        S::MachineStageRebooting => MachineStage::Rebooting,
        S::MachineStageShuttingDown => MachineStage::ShuttingDown,
        S::MachineStageResetting => MachineStage::Resetting,
        S::MachineStageUpgrading => MachineStage::Upgrading,
    }
}

/// Read the interesting parts of a pod status JSON.
pub(super) fn static_pod_status(id: String, status: &serde_json::Value) -> StaticPodStatus {
    let phase = status["phase"].as_str().unwrap_or_default().to_string();
    let ready = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True");
    let images = status["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["image"].as_str().map(str::to_string))
        .collect();
    StaticPodStatus {
        id,
        phase,
        ready,
        images,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_static_pod_status_json() {
        let json = serde_json::json!({
            "phase": "Running",
            "conditions": [{"type": "Initialized", "status": "True"}, {"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "kube-apiserver", "image": "registry.k8s.io/kube-apiserver:v1.34.1"}]
        });
        let s = static_pod_status("kube-system/kube-apiserver-cp-1".into(), &json);
        assert_eq!(s.phase, "Running");
        assert!(s.ready);
        assert_eq!(s.images, ["registry.k8s.io/kube-apiserver:v1.34.1"]);
        let not_ready = static_pod_status("x".into(), &serde_json::json!({"phase": "Pending"}));
        assert!(!not_ready.ready);
    }
}
