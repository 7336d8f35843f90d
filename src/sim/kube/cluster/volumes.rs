//! The attach/detach controller and a CSI driver's external-attacher, as far as a rollout sees
//! them: a `storage.k8s.io/v1` VolumeAttachment per (CSI volume, node) that a pod on the node
//! uses, gone a detach delay after the last such pod left the node.
//!
//! - **What is attached where** (kubernetes `pkg/controller/volume/attachdetach`, the desired
//!   state of world): every pod bound to a node (`spec.nodeName`) and not terminated (phase
//!   `Succeeded`/`Failed`; a terminating pod keeps its volumes until it is gone,
//!   `pkg/volume/util` `IsPodTerminated`) wants, on that node, each volume it mounts through a
//!   `persistentVolumeClaim` bound (`spec.volumeName`) to a PersistentVolume with `spec.csi`.
//! - **Attach**: the CSI attacher creates the VolumeAttachment named
//!   `csi-<sha256(volumeHandle + driver + node)>` (`pkg/volume/csi/csi_attacher.go`,
//!   `getAttachmentName`) with `spec.attacher` (the driver), `spec.nodeName` and
//!   `spec.source.persistentVolumeName`; the driver's external-attacher adds its finalizer
//!   `external-attacher/<driver, '/' as '-'>` and sets `status.attached: true`
//!   (kubernetes-csi/external-attacher `pkg/controller/csi_handler.go`). Attaching takes no
//!   time here. A `ReadWriteOnce`/`ReadWriteOncePod` volume still attached to another node is
//!   not attached (the reconciler's Multi-Attach check, `reconciler.go` `isMultiAttachAllowed`)
//!   until that attachment is gone.
//! - **Detach**: once no pod on the node wants the volume, the CSI attacher deletes the
//!   VolumeAttachment; its finalizer keeps it (`deletionTimestamp` set) while the external-
//!   attacher's `ControllerUnpublishVolume` runs, the detach delay (`KubeSimConfig::
//!   volume_detach_delay`, scenario `timing.volumeDetach`), then removes the finalizer and the
//!   object is gone. The kube fault `DetachNeverCompletes { node }` makes that call hang: the
//!   attachments of the node stay, marked deleted, while the fault holds.
//!
//! Attachments a client created (any name the CSI attacher would not give) are left alone, as
//! the controller only detaches what it attached. Not modelled: the kubelet's
//! `node.status.volumesInUse` (unmount before detach, the 6-minute `maxWaitForUnmountDuration`),
//! pods waiting for their volume to attach before they start, in-tree volumes migrated to CSI,
//! inline CSI volumes.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::{Active, KubeSide, node_name, phase};
use crate::sim::kube::resources::{
    PERSISTENTVOLUMECLAIMS, PERSISTENTVOLUMES, PODS, VOLUMEATTACHMENTS,
};
use crate::sim::kube::store::{k8s_time, name_of, ns_of};

/// `getAttachmentName`: `csi-` and the hex SHA-256 of the volume handle, the driver and the node.
pub(crate) fn attachment_name(handle: &str, driver: &str, node: &str) -> String {
    let digest = Sha256::digest(format!("{handle}{driver}{node}").as_bytes());
    format!("csi-{}", hex::encode(digest))
}

/// The finalizer a CSI driver's external-attacher puts on its VolumeAttachments.
fn attacher_finalizer(driver: &str) -> String {
    format!("external-attacher/{}", driver.replace('/', "-"))
}

/// A PersistentVolume backed by a CSI driver.
struct CsiVolume {
    driver: String,
    handle: String,
    /// `ReadWriteOnce` or `ReadWriteOncePod` among its access modes: one node at a time.
    single_node: bool,
}

fn csi_volume(pv: &Value) -> Option<CsiVolume> {
    let csi = pv.pointer("/spec/csi")?;
    let driver = csi.get("driver")?.as_str()?.to_string();
    let handle = csi.get("volumeHandle")?.as_str()?.to_string();
    let single_node = pv
        .pointer("/spec/accessModes")
        .and_then(Value::as_array)
        .is_some_and(|m| {
            m.iter()
                .any(|a| a == "ReadWriteOnce" || a == "ReadWriteOncePod")
        });
    Some(CsiVolume {
        driver,
        handle,
        single_node,
    })
}

/// A VolumeAttachment the CSI attacher would have made: its node and volume.
struct Managed {
    name: String,
    node: String,
    pv: String,
    deleting: bool,
}

impl KubeSide {
    /// One pass of the attach/detach controller (a no-op without CSI volumes or attachments
    /// of its own).
    pub(super) fn volumes(&mut self, now: Instant, wall: jiff::Timestamp) {
        let pvs: HashMap<String, CsiVolume> = self
            .store
            .list(&PERSISTENTVOLUMES, None)
            .filter_map(|pv| Some((name_of(pv).to_string(), csi_volume(pv)?)))
            .collect();
        let managed: Vec<Managed> = self
            .store
            .list(&VOLUMEATTACHMENTS, None)
            .filter_map(|va| {
                let pv = va.pointer("/spec/source/persistentVolumeName")?.as_str()?;
                let node = va.pointer("/spec/nodeName")?.as_str()?;
                let vol = pvs.get(pv)?;
                (name_of(va) == attachment_name(&vol.handle, &vol.driver, node)).then(|| Managed {
                    name: name_of(va).to_string(),
                    node: node.to_string(),
                    pv: pv.to_string(),
                    deleting: va.pointer("/metadata/deletionTimestamp").is_some(),
                })
            })
            .collect();
        if pvs.is_empty() && managed.is_empty() {
            self.detaching.clear();
            return;
        }
        // the desired state of world: attachment name → (node, PersistentVolume)
        let mut desired: BTreeMap<String, (String, String)> = BTreeMap::new();
        if !pvs.is_empty() {
            let claims: HashMap<(String, String), String> = self
                .store
                .list(&PERSISTENTVOLUMECLAIMS, None)
                .filter_map(|c| {
                    let pv = c.pointer("/spec/volumeName")?.as_str()?;
                    pvs.contains_key(pv).then(|| {
                        (
                            (ns_of(c).to_string(), name_of(c).to_string()),
                            pv.to_string(),
                        )
                    })
                })
                .collect();
            if !claims.is_empty() {
                for pod in self.store.list(&PODS, None) {
                    let node = node_name(pod);
                    if node.is_empty() || matches!(phase(pod), "Succeeded" | "Failed") {
                        continue;
                    }
                    for vol in pod
                        .pointer("/spec/volumes")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        let Some(claim) = vol
                            .pointer("/persistentVolumeClaim/claimName")
                            .and_then(Value::as_str)
                        else {
                            continue;
                        };
                        let key = (ns_of(pod).to_string(), claim.to_string());
                        if let Some(pv) = claims.get(&key)
                            && let Some(v) = pvs.get(pv)
                        {
                            desired.insert(
                                attachment_name(&v.handle, &v.driver, node),
                                (node.to_string(), pv.clone()),
                            );
                        }
                    }
                }
            }
        }
        // detach what no pod wants any more (and finish detaches under way)
        for m in &managed {
            if desired.contains_key(&m.name) && !m.deleting {
                continue;
            }
            if !m.deleting {
                if let Some(mut va) = self.store.get(&VOLUMEATTACHMENTS, "", &m.name).cloned() {
                    va["metadata"]["deletionTimestamp"] = json!(k8s_time(wall));
                    va["metadata"]["deletionGracePeriodSeconds"] = json!(0);
                    self.store.put(&VOLUMEATTACHMENTS, va, wall);
                }
                self.detaching
                    .insert(m.name.clone(), now + self.detach_delay);
            }
            let at = *self
                .detaching
                .entry(m.name.clone())
                .or_insert(now + self.detach_delay);
            let stuck = self
                .faults
                .iter()
                .any(|f| matches!(f, Active::DetachNeverCompletes(n) if *n == m.node));
            if at <= now && !stuck {
                self.store.delete(&VOLUMEATTACHMENTS, "", &m.name);
                self.detaching.remove(&m.name);
            }
        }
        // attach what is wanted and not attached (one node at a time for a single-node volume)
        for (name, (node, pv)) in &desired {
            if self.store.get(&VOLUMEATTACHMENTS, "", name).is_some() {
                continue;
            }
            let Some(v) = pvs.get(pv) else { continue };
            let elsewhere = managed.iter().any(|m| {
                &m.pv == pv
                    && &m.node != node
                    && self.store.get(&VOLUMEATTACHMENTS, "", &m.name).is_some()
            });
            if v.single_node && elsewhere {
                continue;
            }
            let va = json!({
                "metadata": {
                    "name": name,
                    "finalizers": [attacher_finalizer(&v.driver)],
                },
                "spec": {
                    "attacher": v.driver,
                    "nodeName": node,
                    "source": {"persistentVolumeName": pv},
                },
                "status": {"attached": true},
            });
            let _ = self.store.create(&VOLUMEATTACHMENTS, va, wall);
        }
        self.detaching
            .retain(|name, _| managed.iter().any(|m| &m.name == name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_attachment_name_is_the_csi_attachers() {
        // sha256("pvc-1" + "rbd.csi.ceph.com" + "w-1"), as `getAttachmentName` formats it
        let expect = format!(
            "csi-{}",
            hex::encode(Sha256::digest(b"pvc-1rbd.csi.ceph.comw-1"))
        );
        assert_eq!(attachment_name("pvc-1", "rbd.csi.ceph.com", "w-1"), expect);
        assert_eq!(expect.len(), 4 + 64);
        assert_eq!(
            attacher_finalizer("example.com/csi"),
            "external-attacher/example.com-csi"
        );
    }
}
