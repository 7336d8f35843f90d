//! `medea sim`: run the simulator (Talos machine API + kube-apiserver) standalone until Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use miette::{IntoDiagnostic as _, WrapErr as _};

use super::exit;
use crate::sim::cluster::{SimCluster, SimClusterConfig};
use crate::sim::talos::scenario::DEFAULT_SCENARIO;
use crate::sim::talos::{Role, Scenario};

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  medea sim --out ./sim\n  medea sim --scenario faults.yaml --out ./sim --listen 127.0.0.1:50000 \\\n    --kube-listen 127.0.0.1:6443\n  medea sim --print-default-scenario > scenario.yaml\n\nThen: medea talos version --talosconfig ./sim/talosconfig\n      kubectl --kubeconfig ./sim/kubeconfig get nodes\n      medea seed --cluster home --talosconfig ./sim/talosconfig \\\n        --kubeconfig ./sim/kubeconfig --store ./state/store \\\n        --creds-dir ./state/creds"
)]
pub struct SimArgs {
    /// Scenario file (YAML). Without it, the default cluster runs: `home`, 3 control planes
    /// (cp-1..3) and 3 workers (w-1..3) on Talos v1.12.11 / Kubernetes v1.34.1, workload
    /// `default/web` x3 guarded by a PDB (see --print-default-scenario).
    #[arg(long, value_name = "FILE")]
    pub scenario: Option<PathBuf>,
    /// Directory for the generated talosconfig and kubeconfig (created 0700; must not be
    /// readable by others).
    #[arg(
        long,
        value_name = "DIR",
        required_unless_present = "print_default_scenario"
    )]
    pub out: Option<PathBuf>,
    /// Address of the Talos API listener (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Address of the kube-apiserver listener (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub kube_listen: SocketAddr,
    /// Print the default scenario YAML and exit.
    #[arg(long, conflicts_with_all = ["scenario", "out"])]
    pub print_default_scenario: bool,
}

pub fn run(args: SimArgs) -> miette::Result<u8> {
    if args.print_default_scenario {
        out!("{DEFAULT_SCENARIO}");
        return Ok(exit::OK);
    }
    let scenario = match &args.scenario {
        Some(p) => Scenario::load(p).into_diagnostic()?,
        None => Scenario::default_cluster(),
    };
    // Check the workloads before binding anything.
    crate::sim::cluster::scenario_objects(&scenario).into_diagnostic()?;
    let Some(out) = args.out else {
        return Err(miette::miette!("--out DIR is required"));
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .into_diagnostic()
        .wrap_err("failed to start the async runtime")?;
    rt.block_on(async move {
        let config = SimClusterConfig {
            talos_listen: args.listen,
            kube_listen: args.kube_listen,
            ..SimClusterConfig::default()
        };
        let sim = SimCluster::start(scenario.clone(), config)
            .await
            .into_diagnostic()?;
        let creds = match sim.write_creds(&out) {
            Ok(c) => c,
            Err(e) => {
                sim.shutdown().await;
                return Err(e).into_diagnostic();
            }
        };
        let cps = scenario
            .nodes
            .iter()
            .filter(|n| n.role == Role::Controlplane)
            .count();
        outln!(
            "medea sim: cluster `{}`, {} nodes ({} control planes, {} workers)",
            scenario.cluster_name,
            scenario.nodes.len(),
            cps,
            scenario.nodes.len() - cps
        );
        outln!(
            "talos api: {} (mTLS, route with --node)",
            sim.talos.endpoint()
        );
        for n in &scenario.nodes {
            let role = match n.role {
                Role::Controlplane => "controlplane",
                Role::Worker => "worker",
            };
            outln!(
                "  node {:<8} {:<12} {:<12} talos {} kubernetes {}",
                n.name,
                n.address,
                role,
                n.talos,
                n.kubernetes
            );
        }
        outln!("kube-apiserver: {} (bearer token)", sim.kube.url());
        for w in &scenario.workloads {
            match w.pdb_min_available {
                Some(min) => outln!(
                    "  workload {}/{} x{} (PodDisruptionBudget {}-pdb minAvailable {min})",
                    w.namespace,
                    w.name,
                    w.replicas,
                    w.name
                ),
                None => outln!("  workload {}/{} x{}", w.namespace, w.name, w.replicas),
            }
        }
        outln!("talosconfig: {}", creds.talosconfig.display());
        outln!("kubeconfig: {}", creds.kubeconfig.display());
        outln!("ready; press Ctrl-C to stop");
        let stopped = tokio::signal::ctrl_c().await;
        sim.shutdown().await;
        stopped
            .into_diagnostic()
            .wrap_err("failed to wait for Ctrl-C")?;
        Ok(exit::OK)
    })
}
