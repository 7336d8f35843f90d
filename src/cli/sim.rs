//! `medea sim`: run the simulator standalone until Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use miette::{IntoDiagnostic as _, WrapErr as _};

use super::exit;
use crate::sim::talos::scenario::DEFAULT_SCENARIO;
use crate::sim::talos::{Role, Scenario, SimTalos};

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  medea sim --out ./sim\n  medea sim --scenario faults.yaml --out ./sim --listen 127.0.0.1:50000\n  medea sim --print-default-scenario > scenario.yaml\n\nThen: medea talos version --talosconfig ./sim/talosconfig"
)]
pub struct SimArgs {
    /// Scenario file (YAML). Without it, the default cluster runs: 3 control planes and 3 workers
    /// on Talos v1.12.4 / Kubernetes v1.34.1 (see --print-default-scenario).
    #[arg(long, value_name = "FILE")]
    pub scenario: Option<PathBuf>,
    /// Directory for the generated talosconfig (created 0700; must not be readable by others).
    #[arg(
        long,
        value_name = "DIR",
        required_unless_present = "print_default_scenario"
    )]
    pub out: Option<PathBuf>,
    /// Address of the Talos API listener (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Print the default scenario YAML and exit.
    #[arg(long, conflicts_with_all = ["scenario", "out"])]
    pub print_default_scenario: bool,
}

pub fn run(args: SimArgs) -> miette::Result<u8> {
    if args.print_default_scenario {
        print!("{DEFAULT_SCENARIO}");
        return Ok(exit::OK);
    }
    let scenario = match &args.scenario {
        Some(p) => Scenario::load(p).into_diagnostic()?,
        None => Scenario::default_cluster(),
    };
    let Some(out) = args.out else {
        return Err(miette::miette!("--out DIR is required"));
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .into_diagnostic()
        .wrap_err("failed to start the async runtime")?;
    rt.block_on(async move {
        let sim = SimTalos::start(scenario.clone(), args.listen)
            .await
            .into_diagnostic()?;
        let talosconfig = match sim.write_talosconfig(&out) {
            Ok(p) => p,
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
        println!(
            "medea sim: cluster `{}`, {} nodes ({} control planes, {} workers)",
            scenario.cluster_name,
            scenario.nodes.len(),
            cps,
            scenario.nodes.len() - cps
        );
        println!("talos api: {} (mTLS, route with --node)", sim.endpoint());
        for n in &scenario.nodes {
            let role = match n.role {
                Role::Controlplane => "controlplane",
                Role::Worker => "worker",
            };
            println!(
                "  node {:<8} {:<12} {:<12} talos {} kubernetes {}",
                n.name, n.address, role, n.talos, n.kubernetes
            );
        }
        println!("talosconfig: {}", talosconfig.display());
        // Integration point for the kube side: the simulated kube-apiserver is started here from
        // `sim` (a `NodeSource`) and `scenario.workloads`, writes `kubeconfig` into `out` with
        // `sim::pki::write_secret_file`, and prints `kubeconfig: <path>`. Not part of this change.
        println!("ready; press Ctrl-C to stop");
        let stopped = tokio::signal::ctrl_c().await;
        sim.shutdown().await;
        stopped
            .into_diagnostic()
            .wrap_err("failed to wait for Ctrl-C")?;
        Ok(exit::OK)
    })
}
