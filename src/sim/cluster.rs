//! Both sides of the simulator wired together: the Talos machine API ([`SimTalos`]) and the
//! kube-apiserver ([`KubeSim`]) that derives its Nodes from the Talos side through
//! [`NodeSource`](crate::sim::node::NodeSource). One [`Scenario`] drives both: nodes, timing
//! (reboots and pulls on the Talos side, pod start/termination on the kube side), Talos faults,
//! workloads and kube faults. `medea sim`, `medea demo` and the integration tests start it.
//!
//! See `design/sim.md`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::sim::kube::{self, Forbidden, KubeFault, KubeSim, KubeSimConfig, KubeSimError, Outage};
use crate::sim::talos::scenario::{KubeFaultSpec, OutageSpec};
use crate::sim::talos::{Scenario, SimError, SimTalos};

/// The kubeconfig file name [`SimCluster::write_creds`] writes (next to `talosconfig`).
pub const KUBECONFIG_FILE: &str = crate::k8s::kubeconfig::KUBECONFIG_FILE;

/// Why the simulated cluster could not start or write its credentials.
#[derive(Debug, thiserror::Error)]
pub enum SimClusterError {
    #[error("failed to start the simulated Talos API")]
    Talos(#[source] SimError),
    #[error("failed to start the simulated kube-apiserver")]
    Kube(#[source] KubeSimError),
    #[error("scenario workload `{namespace}/{name}`: {problem}")]
    Workload {
        namespace: String,
        name: String,
        problem: String,
    },
    #[error("failed to write the simulator's talosconfig into `{dir}`")]
    WriteTalosconfig {
        dir: PathBuf,
        #[source]
        err: SimError,
    },
    #[error("failed to write the simulator's kubeconfig into `{dir}`")]
    WriteKubeconfig {
        dir: PathBuf,
        #[source]
        err: KubeSimError,
    },
}

/// Where the two listeners go and what the kube side adds to the scenario.
#[derive(Debug, Clone)]
pub struct SimClusterConfig {
    /// Talos API listener (port 0: any free port).
    pub talos_listen: SocketAddr,
    /// kube-apiserver listener (port 0: any free port).
    pub kube_listen: SocketAddr,
    /// How often the kube side re-reads the Talos side while watches are open.
    pub kube_refresh_interval: Duration,
    /// Objects created on the kube side in addition to the scenario's (the platform
    /// DaemonSets/CoreDNS and one Deployment + PDB per `workloads` entry).
    pub extra_objects: Vec<Value>,
    /// Whether the kube side runs the platform ([`kube::scenario::platform`]: kube-proxy,
    /// flannel, CoreDNS, metrics-server). Default on; a rehearsal's twin turns it off, as its
    /// `extra_objects` already hold the observed cluster's own system pods.
    pub platform: bool,
}

impl Default for SimClusterConfig {
    fn default() -> Self {
        SimClusterConfig {
            talos_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            kube_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            kube_refresh_interval: KubeSimConfig::default().refresh_interval,
            extra_objects: Vec::new(),
            platform: true,
        }
    }
}

/// The credentials [`SimCluster::write_creds`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimCreds {
    pub talosconfig: PathBuf,
    pub kubeconfig: PathBuf,
}

/// A running simulated cluster: both servers and their control handles. Dropping it stops the
/// kube-apiserver; call [`SimCluster::shutdown`] to stop both cleanly.
#[derive(Debug)]
pub struct SimCluster {
    /// The Talos side (control surface: faults, reboots, etcd health, counters).
    pub talos: SimTalos,
    /// The kube side (control surface: faults, pods, counters).
    pub kube: KubeSim,
    scenario: Scenario,
}

/// The kube-side objects a scenario asks for: the platform, then its workloads.
pub fn scenario_objects(scenario: &Scenario) -> Result<Vec<Value>, SimClusterError> {
    let mut objects = kube::scenario::platform();
    for w in &scenario.workloads {
        let bad = |problem: &str| SimClusterError::Workload {
            namespace: w.namespace.clone(),
            name: w.name.clone(),
            problem: problem.to_string(),
        };
        let replicas = i32::try_from(w.replicas).map_err(|_| bad("`replicas` is too large"))?;
        let min = w
            .pdb_min_available
            .map(i32::try_from)
            .transpose()
            .map_err(|_| bad("`pdbMinAvailable` is too large"))?;
        if min.is_some_and(|m| m > replicas) {
            return Err(bad(
                "`pdbMinAvailable` is larger than `replicas`: no pod could ever be evicted",
            ));
        }
        objects.extend(kube::scenario::workload(
            &w.namespace,
            &w.name,
            replicas,
            min,
        ));
    }
    Ok(objects)
}

/// The kube fault a scenario entry stands for.
pub fn kube_fault(spec: &KubeFaultSpec) -> KubeFault {
    match spec {
        KubeFaultSpec::PdbNeverAllows { namespace, pdb } => KubeFault::PdbNeverAllows {
            namespace: namespace.clone(),
            pdb: pdb.clone(),
        },
        KubeFaultSpec::ApiUnavailable(OutageSpec::Requests(n)) => {
            KubeFault::ApiUnavailable(Outage::Requests(*n))
        }
        KubeFaultSpec::ApiUnavailable(OutageSpec::For(d)) => {
            KubeFault::ApiUnavailable(Outage::For(*d))
        }
        KubeFaultSpec::NodeNeverReady { node } => KubeFault::NodeNeverReady { node: node.clone() },
        KubeFaultSpec::Forbidden { verb, resource } => {
            KubeFault::Forbidden(Forbidden::parse(verb, resource))
        }
        KubeFaultSpec::NodePressure { node, condition } => KubeFault::NodePressure {
            node: node.clone(),
            condition: condition.clone(),
        },
        KubeFaultSpec::JobPodExit {
            namespace,
            job_prefix,
            exit_code,
        } => KubeFault::JobPodExit {
            namespace: namespace.clone(),
            job_prefix: job_prefix.clone(),
            exit_code: *exit_code,
        },
        KubeFaultSpec::DetachNeverCompletes { node } => {
            KubeFault::DetachNeverCompletes { node: node.clone() }
        }
    }
}

impl SimCluster {
    /// Start the Talos side, then the kube-apiserver fed by it, with the scenario's workloads
    /// and faults (Talos faults are armed by [`SimTalos::start`], kube faults right after the
    /// kube side starts).
    pub async fn start(
        scenario: Scenario,
        config: SimClusterConfig,
    ) -> Result<SimCluster, SimClusterError> {
        let mut objects = scenario_objects(&scenario)?;
        if !config.platform {
            let platform = kube::scenario::platform();
            objects.retain(|o| !platform.contains(o));
        }
        objects.extend(config.extra_objects);
        let talos = SimTalos::start(scenario.clone(), config.talos_listen)
            .await
            .map_err(SimClusterError::Talos)?;
        let kube_config = KubeSimConfig {
            bind: config.kube_listen,
            pod_start_delay: scenario.timing.pod_start,
            pod_termination_delay: scenario.timing.pod_termination,
            refresh_interval: config.kube_refresh_interval,
            objects,
            crd_establish_delay: KubeSimConfig::default().crd_establish_delay,
            volume_detach_delay: scenario.timing.volume_detach,
        };
        let kube = match kube::start(kube_config, Arc::new(talos.clone())).await {
            Ok(k) => k,
            Err(e) => {
                talos.shutdown().await;
                return Err(SimClusterError::Kube(e));
            }
        };
        for f in &scenario.kube_faults {
            kube.inject(kube_fault(f));
        }
        Ok(SimCluster {
            talos,
            kube,
            scenario,
        })
    }

    /// The scenario it runs.
    pub fn scenario(&self) -> &Scenario {
        &self.scenario
    }

    /// The cluster name (the scenario's `clusterName`; also the kubeconfig's cluster).
    pub fn cluster_name(&self) -> &str {
        &self.scenario.cluster_name
    }

    /// Write `dir/talosconfig` and `dir/kubeconfig` (0600 files; `dir` created 0700 if
    /// missing and refused, with nothing written, if others can read it). Both hold admin
    /// credentials.
    pub fn write_creds(&self, dir: &Path) -> Result<SimCreds, SimClusterError> {
        let talosconfig =
            self.talos
                .write_talosconfig(dir)
                .map_err(|err| SimClusterError::WriteTalosconfig {
                    dir: dir.to_path_buf(),
                    err,
                })?;
        let kubeconfig = dir.join(KUBECONFIG_FILE);
        if let Err(err) = self.kube.write_kubeconfig(&kubeconfig, self.cluster_name()) {
            // Leave nothing half-written.
            let _ = std::fs::remove_file(&talosconfig);
            return Err(SimClusterError::WriteKubeconfig {
                dir: dir.to_path_buf(),
                err,
            });
        }
        Ok(SimCreds {
            talosconfig,
            kubeconfig,
        })
    }

    /// Stop both servers.
    pub async fn shutdown(self) {
        self.talos.shutdown().await;
        self.kube.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_scenario_gives_the_documented_kube_objects() {
        let objects = scenario_objects(&Scenario::default_cluster()).unwrap();
        let names: Vec<String> = objects
            .iter()
            .map(|o| {
                format!(
                    "{}/{}/{}",
                    o["kind"].as_str().unwrap(),
                    o["metadata"]["namespace"].as_str().unwrap(),
                    o["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                "DaemonSet/kube-system/kube-proxy",
                "DaemonSet/kube-system/kube-flannel",
                "Deployment/kube-system/coredns",
                "Deployment/kube-system/metrics-server",
                "Deployment/default/web",
                "PodDisruptionBudget/default/web-pdb",
            ]
        );
        assert_eq!(objects, kube::scenario::default_scenario());
    }

    #[test]
    fn a_pdb_larger_than_its_workload_is_refused() {
        let mut s = Scenario::default_cluster();
        s.workloads[0].pdb_min_available = Some(4);
        let err = scenario_objects(&s).unwrap_err();
        assert!(
            matches!(&err, SimClusterError::Workload { name, .. } if name == "web"),
            "{err}"
        );
    }

    #[test]
    fn scenario_kube_faults_map_to_kube_faults() {
        assert_eq!(
            kube_fault(&KubeFaultSpec::Forbidden {
                verb: "create".into(),
                resource: "pods/eviction".into()
            }),
            KubeFault::Forbidden(Forbidden {
                verb: "create".into(),
                group: String::new(),
                resource: "pods".into(),
                subresource: "eviction".into(),
            })
        );
        assert_eq!(
            kube_fault(&KubeFaultSpec::Forbidden {
                verb: "list".into(),
                resource: "poddisruptionbudgets.policy".into()
            }),
            KubeFault::Forbidden(Forbidden {
                verb: "list".into(),
                group: "policy".into(),
                resource: "poddisruptionbudgets".into(),
                subresource: String::new(),
            })
        );
        assert_eq!(
            kube_fault(&KubeFaultSpec::ApiUnavailable(OutageSpec::For(
                Duration::from_secs(5)
            ))),
            KubeFault::ApiUnavailable(Outage::For(Duration::from_secs(5)))
        );
    }
}
