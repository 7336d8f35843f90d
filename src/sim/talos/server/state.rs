//! `cosi.resource.State`: Get and List of the COSI resources medea reads (machine config,
//! machine status, static pod status, kubelet spec, …) in their upstream namespaces and types.

use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use super::{Api, stream_of, ts};
use crate::sim::talos::fault::Method;
use crate::sim::talos::model::TalosSide;
use crate::talos::pbstruct;
use crate::talos::proto::cosi::resource::{self as cosi, state_server::State};
use crate::talos::proto::resource::config::MachineConfigSpec;
use crate::talos::proto::talos::resource::definitions::{enums, k8s, runtime, v1alpha1};

/// Where a COSI resource lives and who owns it.
struct ResMeta<'a> {
    namespace: &'a str,
    rtype: &'a str,
    id: &'a str,
    version: u64,
    owner: &'a str,
}

fn cosi_resource(
    m: ResMeta<'_>,
    started: i64,
    proto_spec: Vec<u8>,
    yaml_spec: String,
) -> cosi::Resource {
    cosi::Resource {
        metadata: Some(cosi::Metadata {
            namespace: m.namespace.to_string(),
            r#type: m.rtype.to_string(),
            id: m.id.to_string(),
            version: m.version.to_string(),
            owner: m.owner.to_string(),
            phase: "running".to_string(),
            created: Some(ts(started)),
            updated: Some(ts(started)),
            finalizers: vec![],
            labels: Default::default(),
            annotations: Default::default(),
        }),
        spec: Some(cosi::Spec {
            proto_spec,
            yaml_spec,
        }),
    }
}

fn yaml<T: serde::Serialize>(v: &T) -> String {
    serde_saphyr::to_string(v).unwrap_or_default()
}

/// All resources of `(namespace, type)` on node `idx`; `None` if the type is not served.
fn resources(
    c: &TalosSide,
    idx: usize,
    namespace: &str,
    rtype: &str,
) -> Option<Vec<cosi::Resource>> {
    use prost::Message as _;
    let n = &c.nodes()[idx];
    let started = c.started_unix;
    let facts = n.facts();
    let out = match (namespace, rtype) {
        ("config", "MachineConfigs.config.talos.dev") => {
            let mut v = vec![];
            for (id, bytes) in [
                ("v1alpha1", n.config.clone()),
                ("persistent", n.staged.clone().unwrap_or_else(|| n.config.clone())),
            ] {
                let spec = MachineConfigSpec {
                    yaml_marshalled: bytes.clone(),
                };
                v.push(cosi_resource(
                    ResMeta {
                        namespace: "config",
                        rtype,
                        id,
                        version: n.config_version,
                        owner: "",
                    },
                    started,
                    spec.encode_to_vec(),
                    yaml(&String::from_utf8_lossy(&bytes).into_owned()),
                ));
            }
            v
        }
        ("runtime", "MachineStatuses.runtime.talos.dev") => {
            let ready = c.machine_ready(idx);
            let (stage, unmet, text) = if ready {
                (
                    enums::RuntimeMachineStage::MachineStageRunning,
                    vec![],
                    "stage: running\nstatus:\n    ready: true\n    unmetConditions: []\n".to_string(),
                )
            } else {
                (
                    enums::RuntimeMachineStage::MachineStageBooting,
                    vec![runtime::UnmetCondition {
                        name: "staticPods".to_string(),
                        reason: "static pods are not ready yet".to_string(),
                    }],
                    "stage: booting\nstatus:\n    ready: false\n    unmetConditions:\n        - name: staticPods\n          reason: static pods are not ready yet\n".to_string(),
                )
            };
            let spec = runtime::MachineStatusSpec {
                stage: stage as i32,
                status: Some(runtime::MachineStatusStatus {
                    ready,
                    unmet_conditions: unmet,
                }),
            };
            vec![cosi_resource(
                    ResMeta {
                        namespace: "runtime",
                        rtype,
                        id: "machine",
                        version: n.counters.boots + 1,
                        owner: "runtime.MachineStatusController",
                    },
                    started,
                spec.encode_to_vec(),
                text,
            )]
        }
        ("k8s", "KubeletSpecs.kubernetes.talos.dev") => {
            let image = facts.as_ref().map(|f| f.kubelet_image.clone()).unwrap_or_default();
            let args = vec![
                format!("--hostname-override={}", n.spec.name),
                format!("--node-ip={}", n.spec.address),
                "--config=/etc/kubernetes/kubelet.yaml".to_string(),
            ];
            let spec = k8s::KubeletSpecSpec {
                image: image.clone(),
                args: args.clone(),
                extra_mounts: vec![],
                expected_nodename: n.spec.name.clone(),
                config: None,
                credential_provider_config: None,
            };
            vec![cosi_resource(
                    ResMeta {
                        namespace: "k8s",
                        rtype,
                        id: "kubelet",
                        version: n.config_version,
                        owner: "k8s.KubeletSpecController",
                    },
                    started,
                spec.encode_to_vec(),
                yaml(&serde_json::json!({"image": image, "args": args, "expectedNodename": n.spec.name})),
            )]
        }
        // The per-component config resources a control plane renders its static pods from;
        // `upgrade-k8s` waits for the mirror pod's `talos.dev/config-version` to equal their
        // version (siderolabs/talos `pkg/cluster/kubernetes/talos_managed.go`).
        (
            "controlplane",
            "APIServerConfigs.kubernetes.talos.dev"
            | "ControllerManagerConfigs.kubernetes.talos.dev"
            | "SchedulerConfigs.kubernetes.talos.dev",
        ) => {
            let component = match rtype {
                "APIServerConfigs.kubernetes.talos.dev" => "kube-apiserver",
                "ControllerManagerConfigs.kubernetes.talos.dev" => "kube-controller-manager",
                _ => "kube-scheduler",
            };
            let image = facts
                .as_ref()
                .and_then(|f| f.static_pod_images.get(component).cloned());
            match image {
                Some(image) if n.control_plane() => {
                    let proto = match component {
                        "kube-apiserver" => k8s::ApiServerConfigSpec {
                            image: image.clone(),
                            ..Default::default()
                        }
                        .encode_to_vec(),
                        "kube-controller-manager" => k8s::ControllerManagerConfigSpec {
                            enabled: true,
                            image: image.clone(),
                            ..Default::default()
                        }
                        .encode_to_vec(),
                        _ => k8s::SchedulerConfigSpec {
                            enabled: true,
                            image: image.clone(),
                            ..Default::default()
                        }
                        .encode_to_vec(),
                    };
                    // Talos >= 1.14 also has `final-<component>`, the raw config merged with
                    // defaults by a transform controller, on a version counter of its own
                    // (`control_plane_final.go`; `SimNode::final_config_version`)
                    let final_id = format!("final-{component}");
                    let mut out = vec![];
                    if n.renders_from_final() {
                        out.push(cosi_resource(
                            ResMeta {
                                namespace: "controlplane",
                                rtype,
                                id: &final_id,
                                version: n.final_config_version(component),
                                owner: final_owner(component),
                            },
                            started,
                            proto.clone(),
                            yaml(&serde_json::json!({ "image": image })),
                        ));
                    }
                    out.push(cosi_resource(
                        ResMeta {
                            namespace: "controlplane",
                            rtype,
                            id: component,
                            version: n.component_config_version(component),
                            owner: raw_owner(component),
                        },
                        started,
                        proto,
                        yaml(&serde_json::json!({ "image": image })),
                    ));
                    out
                }
                _ => vec![],
            }
        }
        ("k8s", "StaticPodStatuses.kubernetes.talos.dev") => facts
            .map(|f| f.static_pod_images)
            .unwrap_or_default()
            .into_iter()
            .map(|(component, image)| {
                let status = serde_json::json!({
                    "phase": "Running",
                    "conditions": [
                        {"type": "Initialized", "status": "True"},
                        {"type": "Ready", "status": "True"},
                        {"type": "ContainersReady", "status": "True"},
                        {"type": "PodScheduled", "status": "True"}
                    ],
                    "hostIP": n.spec.address,
                    "podIP": n.spec.address,
                    "containerStatuses": [{"name": component, "image": image, "ready": true, "restartCount": 0}]
                });
                let spec = k8s::StaticPodStatusSpec {
                    pod_status: status.as_object().map(pbstruct::to_struct),
                };
                cosi_resource(
                    ResMeta {
                        namespace: "k8s",
                        rtype,
                        id: &format!("kube-system/{component}-{}", n.spec.name),
                        version: n.config_version,
                        owner: "k8s.StaticPodStatusController",
                    },
                    started,
                    spec.encode_to_vec(),
                    yaml(&serde_json::json!({ "podStatus": status })),
                )
            })
            .collect(),
        ("k8s", "Nodenames.kubernetes.talos.dev") => {
            let spec = k8s::NodenameSpec {
                nodename: n.spec.name.clone(),
                hostname_version: "1".to_string(),
                skip_node_registration: false,
            };
            vec![cosi_resource(
                    ResMeta {
                        namespace: "k8s",
                        rtype,
                        id: "nodename",
                        version: 1,
                        owner: "k8s.NodenameController",
                    },
                    started,
                spec.encode_to_vec(),
                format!(
                    "nodename: {}\nhostnameVersion: \"1\"\nskipNodeRegistration: false\n",
                    n.spec.name
                ),
            )]
        }
        // The bootstrap manifests a control plane renders (what upgrade-k8s applies last):
        // Talos' real set for the running version (`sim::talos::manifests`), kube-proxy at the
        // version of the node's kube-apiserver image.
        ("controlplane", "Manifests.kubernetes.talos.dev") => {
            let Some(f) = facts.as_ref().filter(|f| f.machine_type != "worker") else {
                return Some(vec![]);
            };
            let version = f
                .static_pod_images
                .get("kube-apiserver")
                .and_then(|i| i.rsplit(':').next())
                .unwrap_or("v0.0.0")
                .to_string();
            let manifests = crate::sim::talos::manifests::render(&n.running, &version);
            manifests
                .into_iter()
                .map(|(id, objs)| {
                    // one resource may carry several objects (`spec.items`)
                    let spec = k8s::ManifestSpec {
                        items: objs
                            .iter()
                            .map(|o| k8s::SingleManifest {
                                object: o.as_object().map(pbstruct::to_struct),
                            })
                            .collect(),
                    };
                    let obj = serde_json::Value::Array(objs);
                    cosi_resource(
                        ResMeta {
                            namespace: "controlplane",
                            rtype,
                            id,
                            version: n.config_version,
                            owner: "k8s.ManifestController",
                        },
                        started,
                        spec.encode_to_vec(),
                        yaml(&obj),
                    )
                })
                .collect()
        }
        // whether the node booted with SecureBoot (talos
        // `pkg/machinery/resources/runtime/security_status.go`, written by
        // `controllers/runtime/security_state.go`)
        ("runtime", "SecurityStates.talos.dev") => {
            let spec = runtime::SecurityStateSpec {
                secure_boot: n.spec.secure_boot,
                booted_with_uki: n.bootloader.sd_boot(),
                ..Default::default()
            };
            vec![cosi_resource(
                ResMeta {
                    namespace: "runtime",
                    rtype,
                    id: "securitystate",
                    version: 1,
                    owner: "runtime.SecurityStateController",
                },
                started,
                spec.encode_to_vec(),
                format!(
                    "secureBoot: {}\nbootedWithUKI: {}\n",
                    n.spec.secure_boot,
                    n.bootloader.sd_boot()
                ),
            )]
        }
        // Talos >= 1.14 surfaces the schematic extension of a factory-built node with the
        // factory's name and URL (`controllers/runtime/image_factory_schematic.go`, from the
        // extension's author `Image Factory (https://<host>)`); none without a schematic
        ("runtime", "ImageFactorySchematics.runtime.talos.dev") => {
            if n.running.minor_line() < (1, 14) {
                return None;
            }
            let Some(schematic) = n.spec.schematic.clone() else {
                return Some(vec![]);
            };
            let url = format!("https://{}", n.spec.factory_host());
            let spec = runtime::ImageFactorySchematicSpec {
                schematic_id: schematic.clone(),
                flavor: "Image Factory".to_string(),
                apiurl: url.clone(),
            };
            vec![cosi_resource(
                ResMeta {
                    namespace: "runtime",
                    rtype,
                    id: "image-factory-schematic",
                    version: 1,
                    owner: "runtime.ImageFactorySchematicController",
                },
                started,
                spec.encode_to_vec(),
                format!("schematicId: {schematic}\nflavor: Image Factory\napiUrl: {url}\n"),
            )]
        }
        ("runtime", "Services.v1alpha1.talos.dev") => c
            .services(idx)
            .into_iter()
            .map(|(id, healthy)| {
                let spec = v1alpha1::ServiceSpec {
                    running: true,
                    healthy,
                    unknown: false,
                };
                cosi_resource(
                    ResMeta {
                        namespace: "runtime",
                        rtype,
                        id: &id,
                        version: 1,
                        owner: "",
                    },
                    started,
                    spec.encode_to_vec(),
                    format!("running: true\nhealthy: {healthy}\nunknown: false\n"),
                )
            })
            .collect(),
        _ => return None,
    };
    Some(out)
}

/// The controller that writes a component's raw config resource (talos
/// `internal/app/machined/pkg/controllers/k8s/control_plane.go`).
fn raw_owner(component: &str) -> &'static str {
    match component {
        "kube-apiserver" => "k8s.ControlPlaneAPIServerController",
        "kube-controller-manager" => "k8s.ControlPlaneControllerManagerController",
        _ => "k8s.ControlPlaneSchedulerController",
    }
}

/// The transform controller that writes a component's `final-*` config resource (talos
/// `internal/app/machined/pkg/controllers/k8s/control_plane_final.go`).
fn final_owner(component: &str) -> &'static str {
    match component {
        "kube-apiserver" => "k8s.ControlPlaneAPIServerFinalController",
        "kube-controller-manager" => "k8s.ControlPlaneControllerManagerFinalController",
        _ => "k8s.ControlPlaneSchedulerFinalController",
    }
}

fn not_registered(namespace: &str, rtype: &str) -> Status {
    Status::not_found(format!(
        "resource type {rtype:?} is not registered in namespace {namespace:?}"
    ))
}

#[tonic::async_trait]
impl State for Api {
    async fn get(
        &self,
        req: Request<cosi::GetRequest>,
    ) -> Result<Response<cosi::GetResponse>, Status> {
        let idx = self.admit(&req, Method::CosiGet)?;
        let r = req.into_inner();
        let c = self.shared.lock();
        let all = resources(&c, idx, &r.namespace, &r.r#type)
            .ok_or_else(|| not_registered(&r.namespace, &r.r#type))?;
        let found = all
            .into_iter()
            .find(|res| res.metadata.as_ref().is_some_and(|m| m.id == r.id))
            .ok_or_else(|| {
                Status::not_found(format!(
                    "resource {}({}/{}) doesn't exist",
                    r.r#type, r.namespace, r.id
                ))
            })?;
        Ok(Response::new(cosi::GetResponse {
            resource: Some(found),
        }))
    }

    async fn list(
        &self,
        req: Request<cosi::ListRequest>,
    ) -> Result<Response<BoxStream<cosi::ListResponse>>, Status> {
        let idx = self.admit(&req, Method::CosiList)?;
        let r = req.into_inner();
        let c = self.shared.lock();
        let all = resources(&c, idx, &r.namespace, &r.r#type)
            .ok_or_else(|| not_registered(&r.namespace, &r.r#type))?;
        Ok(stream_of(
            all.into_iter()
                .map(|res| {
                    Ok(cosi::ListResponse {
                        resource: Some(res),
                    })
                })
                .collect(),
        ))
    }
}
