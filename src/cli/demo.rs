//! `medea demo`: the whole product on the built-in simulator, in one command.
//!
//! Starts the simulator (cluster `home`: 3 control-plane + 3 workers on an older Talos and
//! Kubernetes), seeds a temporary embedded store from it, copies the bundled examples into a
//! temporary desired-state directory, starts `medea serve` in-process and shows the plan. With
//! `--approve` it signs the plan with two ephemeral keys (trusted through a temporary
//! allowed_signers), enables rollouts and runs the rollout to completion with the live view.
//! Everything lives in a temporary directory that is removed at the end (unless `--keep`).

use miette::{IntoDiagnostic as _, WrapErr as _};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use super::exit;
use crate::api::pb;

const EXAMPLES: &[(&str, &str)] = &[
    (
        "home/cluster.yaml",
        include_str!("../../examples/home/cluster.yaml"),
    ),
    (
        "home/pools.yaml",
        include_str!("../../examples/home/pools.yaml"),
    ),
    (
        "prod/cluster.yaml",
        include_str!("../../examples/prod/cluster.yaml"),
    ),
    (
        "prod/pools.yaml",
        include_str!("../../examples/prod/pools.yaml"),
    ),
];

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  medea demo               # simulator + server, show the plan\n  medea demo --approve     # ...then approve it and run the rollout to the end\n  medea demo --approve --keep   # keep the temporary directory to look around\n  medea demo --ui --approve     # ...and watch it in a browser"
)]
pub struct DemoArgs {
    /// Sign the plan with two ephemeral keys, enable rollouts and run it to completion.
    #[arg(long)]
    pub approve: bool,
    /// Keep the temporary directory (store, desired state, creds) and print where it is.
    #[arg(long)]
    pub keep: bool,
    /// Serve the web dashboard too, print its URL and the token to log in with, and keep
    /// serving after the demo until Ctrl-C.
    #[arg(long)]
    pub ui: bool,
    /// Without a TTY, the rollout view prints one readable line per event (local time); json
    /// prints one JSON object per event instead.
    #[arg(long, value_enum, default_value_t = super::LogFormat::Text)]
    pub log_format: super::LogFormat,
}

pub fn run(args: DemoArgs) -> miette::Result<u8> {
    let rt = tokio::runtime::Runtime::new()
        .into_diagnostic()
        .wrap_err("cannot start the runtime")?;
    let tmp = crate::private_file::private_tempdir("medea-demo-")
        .into_diagnostic()
        .wrap_err("demo: cannot create a temporary directory")?;
    let code = rt.block_on(demo(&args, tmp.path()));
    if args.keep {
        let kept = tmp.keep();
        outln!("kept {}", kept.display());
    }
    code
}

async fn demo(args: &DemoArgs, dir: &Path) -> miette::Result<u8> {
    use crate::sim::cluster::{SimCluster, SimClusterConfig};
    let started = std::time::Instant::now();
    // A quicker clock than `medea sim`'s default, so the whole rollout takes well under a minute.
    let scenario_text = crate::sim::talos::scenario::DEFAULT_SCENARIO
        .replace("reboot: 2s", "reboot: 1s")
        .replace("imagePull: 500ms", "imagePull: 100ms")
        .replace("podStart: 3s", "podStart: 500ms")
        .replace("podTermination: 1s", "podTermination: 200ms");
    let scenario =
        crate::sim::talos::scenario::Scenario::parse(&scenario_text, Path::new("<demo scenario>"))
            .into_diagnostic()
            .wrap_err("demo scenario")?;
    outln!(
        "▶ starting the simulator: cluster home, 3 control-plane + 3 workers on Talos v1.12.11 / Kubernetes v1.34.1"
    );
    let sim = SimCluster::start(scenario, SimClusterConfig::default())
        .await
        .into_diagnostic()
        .wrap_err("demo: simulator")?;
    let result = with_sim(args, dir, &sim, started).await;
    sim.shutdown().await;
    result
}

async fn with_sim(
    args: &DemoArgs,
    dir: &Path,
    sim: &crate::sim::cluster::SimCluster,
    started: std::time::Instant,
) -> miette::Result<u8> {
    let sim_out = dir.join("sim");
    let creds = sim
        .write_creds(&sim_out)
        .into_diagnostic()
        .wrap_err("demo: simulator creds")?;
    // Let the simulated workloads come up first (pods start after `podStart`): seeding a
    // cluster whose pods are still starting records PodDisruptionBudgets that allow nothing
    // yet, and the next refresh would make the plan stale right after it is shown.
    let settle = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while sim.kube.pods().iter().any(|p| !p.ready && !p.terminating)
        && tokio::time::Instant::now() < settle
    {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // The store, seeded from the simulator (like `medea seed`).
    let store = super::store::open_dir(&dir.join("state/store"), "run the demo again")
        .wrap_err("demo: store")?;
    let creds_dir = dir.join("state/creds");
    let seeded = super::seed::seed(
        &store,
        &super::seed::SeedRequest {
            cluster: "home".into(),
            talosconfig: creds.talosconfig.clone(),
            kubeconfig: creds.kubeconfig.clone(),
            creds_dir: creds_dir.clone(),
            force: false,
            settings: crate::ops::refresh::RefreshSettings::default(),
            approvals: crate::desired::model::ApprovalSettings::default(),
            // The demo plans its own example files, not seed's output.
            record_as_applied: false,
        },
    )
    .await
    .into_diagnostic()
    .wrap_err("demo: seed")?;
    outln!(
        "▶ seeded cluster home: {} machines observed",
        seeded.cluster.machines.len()
    );
    if args.approve {
        // The per-cluster gate (what `medea cluster enable-rollouts home` does).
        use crate::store::{Store, StoreExt, Txn};
        let key = crate::inventory::cluster_key("home");
        let c: crate::inventory::ObservedCluster = store
            .get_record(&key)
            .into_diagnostic()
            .wrap_err("demo: store")?
            .ok_or_else(|| miette::miette!("demo: seeded cluster missing"))?;
        store
            .commit(Txn::new().put_record(key.as_str(), &c.with_rollouts_enabled(true)))
            .into_diagnostic()
            .wrap_err("demo: store")?;
    }
    // The desired state: the bundled examples.
    let desired = dir.join("desired");
    for (rel, text) in EXAMPLES {
        let p = desired.join(rel);
        std::fs::create_dir_all(crate::private_file::parent_dir(&p))
            .into_diagnostic()
            .wrap_err("demo: desired state")?;
        std::fs::write(&p, text)
            .into_diagnostic()
            .wrap_err("demo: desired state")?;
    }
    // Two ephemeral approvers (a plan that touches the control plane needs two by default).
    let keys = [
        (
            "alice@demo",
            crate::approval::sign::SecretKey::generate_ed25519(),
        ),
        (
            "bob@demo",
            crate::approval::sign::SecretKey::generate_ed25519(),
        ),
    ];
    let mut signers = String::new();
    let mut approvers = Vec::new();
    for (who, k) in keys {
        let k = k.into_diagnostic().wrap_err("demo: keys")?;
        let public = k
            .public_key()
            .to_openssh()
            .into_diagnostic()
            .wrap_err("demo: keys")?;
        signers.push_str(&format!("{who} namespaces=\"medea-approve\" {public}\n"));
        approvers.push((who, k));
    }
    let allowed = dir.join("state/allowed_signers");
    crate::server::secrets::write_private(&allowed, signers.as_bytes())
        .into_diagnostic()
        .wrap_err("demo: allowed signers")?;

    let token = crate::server::auth::generate_token();
    let config = crate::server::ServerConfig {
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        source: crate::desired::Source::Dir(desired.clone()),
        state_dir: dir.join("state"),
        creds_dir,
        tls_cert: None,
        tls_key: None,
        token: token.clone(),
        rollouts: args.approve,
        allowed_signers: Some(allowed),
        debounce: Duration::from_millis(200),
        refresh_interval: Duration::from_secs(30),
        census_interval: crate::ops::refresh::DEFAULT_CENSUS_INTERVAL,
        replica: "demo".into(),
        metrics_listen: None,
        webhooks: vec![],
        executor_poll: Some(Duration::from_millis(200)),
        // the clients' retries on the same compressed clock: with the daemon's (0.25 s
        // doubling to 4 s) a node back from its 1 s reboot was seen up to 2 s late, twelve
        // times over (design/performance.md, "The demo")
        client_tick: Some(Duration::from_millis(100)),
        ui_listen: if args.ui {
            Some(free_loopback_port()?)
        } else {
            None
        },
        ui_limits: Default::default(),
        // the demo's examples have no hooks: the safe default
        hook_policy: Default::default(),
        api_limits: Default::default(),
        metrics_limits: crate::server::listen::Limits::metrics(),
    };
    let config_ui = config.ui_listen;
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let store: Arc<dyn crate::store::Store> = Arc::new(store);
    let server = tokio::spawn(crate::server::run(
        config,
        store,
        Some(bound_tx),
        async move {
            let _ = stop_rx.await;
        },
    ));
    let addr = bound_rx
        .await
        .map_err(|_| miette::miette!("demo: the server did not start"))?;
    outln!(
        "▶ medea serve is listening on {addr} (TLS, token){}",
        if args.approve { ", --rollouts on" } else { "" }
    );
    if let Some(ui) = config_ui {
        outln!(
            "▶ web dashboard: https://{ui}/  (trust {} or accept the certificate; log in with the token {})",
            dir.join("state/tls/ca.crt").display(),
            token.expose()
        );
        if args.approve && std::io::IsTerminal::is_terminal(&std::io::stdin()) {
            outln!("  press Enter to approve the plan and start the rollout");
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
        }
    }
    let client_args = super::client::ClientArgs {
        addr: Some(addr.to_string()),
        token: Some(token.expose().clone()),
        token_file: None,
        ca: Some(dir.join("state/tls/ca.crt")),
        insecure: false,
        context: None,
    };
    let result = drive(args, &client_args, &approvers, started).await;
    if let Some(ui) = config_ui {
        outln!("▶ the dashboard stays up at https://{ui}/ until Ctrl-C");
        let _ = tokio::signal::ctrl_c().await;
    }
    let _ = stop_tx.send(());
    let _ = server.await;
    result
}

/// A free loopback port for the demo's dashboard: bound here, released, and bound again by the
/// server a moment later (the URL must be known before the server starts).
fn free_loopback_port() -> miette::Result<std::net::SocketAddr> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .into_diagnostic()
        .wrap_err("demo: no free loopback port for the dashboard")
}

async fn drive(
    args: &DemoArgs,
    client_args: &super::client::ClientArgs,
    approvers: &[(&str, crate::approval::sign::SecretKey)],
    started: std::time::Instant,
) -> miette::Result<u8> {
    let addr = client_args.addr();
    let rpc = |s| super::client::rpc_error(&addr, s);
    let mut c = client_args.connect().await?;
    let r = c
        .get_plan(pb::GetPlanRequest { id: String::new() })
        .await
        .map_err(rpc)?
        .into_inner();
    let Some(plan) = r.plan else {
        for d in &r.diagnostics {
            eprintln!("{}", d.rendered);
        }
        return Err(miette::miette!("demo: the server computed no plan"));
    };
    outln!("\n{}", plan.rendered);
    if !args.approve {
        outln!(
            "This is what medea would do. Nothing acts until the plan is approved; run `medea demo --approve` to approve it and watch the rollout."
        );
        return Ok(exit::OK);
    }
    let id = crate::plan::PlanId::parse_full(&plan.id).into_diagnostic()?;
    let mut jobs = Vec::new();
    for (who, key) in approvers {
        let signed = crate::approval::sign::sign_with_key(key, &id, ssh_key::HashAlg::Sha512)
            .into_diagnostic()
            .wrap_err("demo: signing")?;
        let r = c
            .submit_approval(pb::SubmitApprovalRequest {
                plan_id: plan.id.clone(),
                signature: signed.armored,
            })
            .await
            .map_err(rpc)?
            .into_inner();
        outln!(
            "▶ {who} signed plan {}: {} ({} of {})",
            plan.short_id,
            r.outcome,
            r.approvals,
            r.approvals_required
        );
        for g in &r.closed_gates {
            outln!("  waiting: {g}");
        }
        jobs.extend(r.started_jobs);
    }
    let Some(job) = jobs.first().cloned() else {
        return Err(miette::miette!("demo: the approved plan started no job"));
    };
    outln!("▶ rollout job {job} started\n");
    // Wait for the job to show up, then follow it live.
    let rollout = loop {
        let r = c
            .list_rollouts(pb::ListRolloutsRequest {
                cluster: "home".into(),
            })
            .await
            .map_err(rpc)?
            .into_inner();
        if let Some(j) = r.rollouts.into_iter().find(|j| j.job_id == job) {
            break j;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let code = super::rollout::follow(&mut c, &addr, rollout, None, args.log_format).await?;
    // Let the refresh observe the new versions, then show them.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let machines = loop {
        let m = c
            .list_machines(pb::ListMachinesRequest {
                cluster: "home".into(),
            })
            .await
            .map_err(rpc)?
            .into_inner()
            .into_machines();
        let done = m
            .iter()
            .all(|m| m.talos_version == "v1.14.6" && m.kubelet_version == "v1.35.8");
        if done || tokio::time::Instant::now() > deadline {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    outln!();
    out!(
        "{}",
        super::output::table(
            &["NODE", "ROLE", "TALOS", "KUBELET", "READY", "CORDONED"],
            &machines
                .iter()
                .map(|m| vec![
                    m.node.clone(),
                    m.role.clone(),
                    m.talos_version.clone(),
                    m.kubelet_version.clone(),
                    super::output::yes_no(m.ready),
                    super::output::yes_no(m.cordoned)
                ])
                .collect::<Vec<_>>()
        )
    );
    outln!(
        "\n▶ demo finished in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(code)
}
