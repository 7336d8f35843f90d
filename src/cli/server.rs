//! `medea serve` and the client commands that talk to it (`get`, `cluster`).

use miette::{IntoDiagnostic as _, WrapErr as _};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::client::{ClientArgs, rpc_error};
use super::desired::DesiredArgs;
use super::exit;
use super::output::{self, Format};
use crate::api::pb;
use crate::secret::Secret;
use crate::server::{self, ServerConfig};

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  medea serve --desired ./clusters --token-file /etc/medea/token\n  medea serve --desired ./repo --git-ref main --rollouts \\\n    --allowed-signers /etc/medea/allowed_signers"
)]
pub struct ServeArgs {
    #[command(flatten)]
    pub desired: DesiredArgs,
    /// Address the API listens on.
    #[arg(long, default_value = "127.0.0.1:7600", env = "MEDEA_LISTEN")]
    pub listen: SocketAddr,
    /// State directory (store, generated TLS files, token). Default: $STATE_DIRECTORY
    /// (systemd) or ~/.local/state/medea.
    #[arg(long, env = "MEDEA_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// The store: a directory (default: <state-dir>/store), or an etcd cluster for HA
    /// replicas, etcd://host:2379[,host2:2379…][/prefix] (needs a build with `--features etcd`).
    #[arg(long, env = "MEDEA_STORE")]
    pub store: Option<crate::store::location::StoreLocation>,
    #[command(flatten)]
    pub ha: super::ha::HaArgs,
    /// Cluster credentials, as <creds-dir>/<cluster>/{talosconfig,kubeconfig}
    /// (default: <state-dir>/creds).
    #[arg(long, env = "MEDEA_CREDS_DIR")]
    pub creds_dir: Option<PathBuf>,
    /// PEM certificate for the API (default: generate a CA and certificate on first run).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert (0600).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// API bearer token [env: MEDEA_TOKEN]. Prefer --token-file. A flag beats the
    /// environment; an empty token is refused.
    #[arg(long, conflicts_with = "token_file")]
    pub token: Option<String>,
    /// File holding the API bearer token [env: MEDEA_TOKEN_FILE] (default: <state-dir>/token,
    /// generated on first run).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// The global executor gate. Without it the server never acts on a cluster.
    #[arg(long, env = "MEDEA_ROLLOUTS")]
    pub rollouts: bool,
    /// allowed_signers file (OpenSSH format) of the people who may approve plans.
    #[arg(long, env = "MEDEA_ALLOWED_SIGNERS")]
    pub allowed_signers: Option<PathBuf>,
    /// Quiet period after a file change before re-reading the desired state.
    #[arg(long, default_value = "500ms", value_parser = crate::duration::parse_std)]
    pub debounce: Duration,
    /// Serve Prometheus metrics (OpenMetrics) on this address, at /metrics.
    #[arg(long, env = "MEDEA_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Serve the web dashboard on this address (HTTPS with the API's certificate; log in
    /// with the API token). Off unless given.
    #[arg(long, value_name = "ADDR", env = "MEDEA_UI_LISTEN")]
    pub ui_listen: Option<SocketAddr>,
    /// POST a JSON notification (with a Slack-compatible `text`) to this URL on plan ready,
    /// approval received, rollout started / node done / halted / succeeded. Repeatable.
    #[arg(long, value_name = "URL", env = "MEDEA_WEBHOOK", value_delimiter = ',')]
    pub webhook: Vec<String>,
    /// Log format: human-readable text, or one JSON object per line.
    #[arg(long, value_enum, default_value_t = super::LogFormat::Text, env = "MEDEA_LOG_FORMAT")]
    pub log_format: super::LogFormat,
    /// How often a running job re-observes its nodes while it waits (reboots, drains).
    #[arg(long, default_value = "5s", value_parser = crate::duration::parse_std)]
    pub job_poll: Duration,
    /// How often the inventory is refreshed from Talos and Kubernetes.
    #[arg(long, default_value = "60s", value_parser = crate::duration::parse_std)]
    pub refresh_interval: Duration,
    /// The least time between two workload censuses of a cluster (every pod, PDB, DaemonSet
    /// and VolumeAttachment, for `medea plan --rehearse`), gathered by the refresh.
    #[arg(long, default_value = "10m", value_parser = crate::duration::parse_std)]
    pub census_interval: Duration,
    /// What Job hooks may ask for (issue #49): safe by default.
    #[command(flatten)]
    pub hook_policy: super::hook_policy::HookPolicyArgs,
}

/// The default state directory: systemd's `STATE_DIRECTORY`, else `$HOME/.local/state/medea`.
/// `None` when neither is set to an absolute path (issue #49 item 7: with `HOME` unset it used
/// to be `./.local/state/medea`, a directory under whatever the working directory was).
pub fn default_state_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("STATE_DIRECTORY") {
        // systemd may pass several, colon-separated.
        let first = d
            .to_string_lossy()
            .split(':')
            .next()
            .unwrap_or_default()
            .to_string();
        let first = PathBuf::from(first);
        if first.is_absolute() {
            return Some(first);
        }
    }
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|h| h.is_absolute())
        .map(|h| h.join(".local/state/medea"))
}

/// The directory `path` would be once created, resolved through its nearest existing ancestor
/// (so `state/../x` and symbolic links compare as what they are).
fn resolved(path: &std::path::Path) -> PathBuf {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut rest = Vec::new();
    let mut cur = abs.as_path();
    loop {
        if let Ok(real) = cur.canonicalize() {
            return rest.iter().rev().fold(real, |p, c| p.join(c));
        }
        match (cur.parent(), cur.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                cur = parent;
            }
            _ => return abs,
        }
    }
}

/// Refuse a state (or credentials) directory inside the desired-state work tree, before
/// anything is written (issue #49 item 7): medea writes its API token, TLS key, store and
/// backups there, and a work tree is what gets committed and pushed (`git add -A`). For a git
/// source the whole work tree counts (the repository's top level), not only the desired path.
fn refuse_inside_desired(
    source: &crate::desired::Source,
    dir: &std::path::Path,
    flag: &str,
) -> miette::Result<()> {
    let root = match source {
        crate::desired::Source::Dir(p) => resolved(p),
        crate::desired::Source::Git { path, .. } => {
            let p = resolved(path);
            p.ancestors()
                .find(|a| a.join(".git").exists())
                .map_or(p.clone(), std::path::Path::to_path_buf)
        }
    };
    let d = resolved(dir);
    if d.starts_with(&root) {
        return Err(miette::miette!(
            help = "keep medea's state outside the repository, e.g. /var/lib/medea (the default is $HOME/.local/state/medea)",
            "{flag} `{}` is inside the desired-state work tree `{}`: medea keeps its API token, TLS key, store and backups there, which a commit would publish",
            dir.display(),
            root.display()
        ));
    }
    Ok(())
}

/// The server's API token: `--token`/`MEDEA_TOKEN` as given; otherwise the token file
/// (`--token-file`/`MEDEA_TOKEN_FILE`, default `<state-dir>/token`), generated (0600) when it
/// does not exist yet, like the TLS files. A token file group or others may read is warned
/// about.
fn load_token(
    chosen: Option<super::client::TokenSource>,
    state_dir: &std::path::Path,
) -> miette::Result<Secret<String>> {
    use super::client::{TokenSource, read_token_file};
    let path = match chosen {
        Some(TokenSource::Value(t)) => return Ok(Secret::new(t)),
        Some(TokenSource::File(p)) => p,
        None => state_dir.join("token"),
    };
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let t = crate::server::auth::generate_token();
            crate::server::secrets::write_private(&path, t.expose().as_bytes())
                .into_diagnostic()
                .wrap_err_with(|| format!("cannot write the token file `{}`", path.display()))?;
            eprintln!("generated an API token in {} (0600)", path.display());
            Ok(t)
        }
        _ => read_token_file(&path),
    }
}

pub fn serve(args: ServeArgs) -> miette::Result<u8> {
    let source = args.desired.source(None, None)?;
    // Before anything is created: an empty token is refused at startup.
    let chosen_token =
        super::client::token_source(args.token.clone(), args.token_file.clone(), &|name| {
            std::env::var_os(name)
        })?;
    let state_dir = args
        .state_dir
        .clone()
        .or_else(default_state_dir)
        .ok_or_else(|| {
            miette::miette!(
                help = "pass --state-dir (e.g. /var/lib/medea), or set HOME",
                "no state directory: HOME is not set (medea does not default to the working directory)"
            )
        })?;
    refuse_inside_desired(&source, &state_dir, "--state-dir")?;
    if let Some(creds) = &args.creds_dir {
        refuse_inside_desired(&source, creds, "--creds-dir")?;
    }
    crate::server::secrets::private_dir(&state_dir)
        .into_diagnostic()
        .wrap_err_with(|| format!("cannot create state directory `{}`", state_dir.display()))?;
    let token = load_token(chosen_token, &state_dir)?;
    let location = args
        .store
        .clone()
        .unwrap_or_else(|| crate::store::location::StoreLocation::Dir(state_dir.join("store")));
    let opened = super::ha::open_store(&location, &args.ha)?;
    let config = ServerConfig {
        listen: args.listen,
        source,
        creds_dir: args
            .creds_dir
            .clone()
            .unwrap_or_else(|| state_dir.join("creds")),
        state_dir,
        tls_cert: args.tls_cert.clone(),
        tls_key: args.tls_key.clone(),
        token,
        rollouts: args.rollouts,
        allowed_signers: args.allowed_signers.clone(),
        debounce: args.debounce,
        refresh_interval: args.refresh_interval,
        census_interval: args.census_interval,
        metrics_listen: args.metrics_listen,
        webhooks: args.webhook.clone(),
        executor_poll: Some(args.job_poll),
        client_tick: None,
        ui_listen: args.ui_listen,
        ui_limits: Default::default(),
        api_limits: Default::default(),
        metrics_limits: crate::server::listen::Limits::metrics(),
        replica: opened.leadership.replica().to_string(),
        hook_policy: args.hook_policy.policy(),
    };
    super::init_logging(args.log_format);
    let rt = tokio::runtime::Runtime::new()
        .into_diagnostic()
        .wrap_err("cannot start the runtime")?;
    rt.block_on(async move {
        tracing::info!(store = %opened.location, replica = %config.replica, "store open");
        server::run_with_leadership(
            config,
            opened.store,
            opened.leadership,
            None,
            shutdown_signal(),
        )
        .await
        .map_err(miette::Report::from_err)
    })?;
    Ok(exit::OK)
}

/// Ctrl-C or SIGTERM.
#[allow(
    clippy::expect_used,
    reason = "installing a SIGTERM handler fails only without tokio's signal driver, which the runtimes medea builds always enable"
)]
pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
}

#[derive(Debug, Args)]
pub struct GetArgs {
    #[command(subcommand)]
    pub what: GetWhat,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Subcommand)]
pub enum GetWhat {
    /// Clusters: observed and desired Kubernetes versions, gates, health.
    #[command(visible_alias = "cluster")]
    Clusters {
        /// Only this cluster; an unknown name is an error.
        #[arg(add = super::complete::clusters())]
        name: Option<String>,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Node pools: desired and running Talos versions.
    #[command(visible_aliases = ["nodepool", "pools", "pool"])]
    Nodepools {
        /// Only this node pool; an unknown name is an error.
        #[arg(add = super::complete::pools())]
        name: Option<String>,
        /// Only the node pools of this cluster.
        #[arg(long, add = super::complete::clusters())]
        cluster: Option<String>,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// This server: its replica id, which replica leads (HA), version and gates.
    #[command(visible_alias = "leader")]
    Server {
        /// Output format.
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Machines: running versions, readiness, cordon state (-o wide adds the machine id).
    #[command(visible_alias = "machine")]
    Machines {
        /// Only this machine (its node name); an unknown name is an error.
        #[arg(add = super::complete::machines())]
        name: Option<String>,
        /// Only the machines of this cluster.
        #[arg(long, add = super::complete::clusters())]
        cluster: Option<String>,
        /// Only the machines of this node pool.
        #[arg(long, add = super::complete::pools())]
        pool: Option<String>,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
}

/// `Err` when a NAME was asked for and nothing matched (kubectl's "not found").
fn found<T>(items: Vec<T>, kind: &str, name: Option<&str>) -> miette::Result<Vec<T>> {
    match name {
        Some(n) if items.is_empty() => Err(miette::miette!(
            help = format!("`medea get {kind}s` lists them"),
            "no {kind} named `{n}`"
        )),
        _ => Ok(items),
    }
}

pub fn get(args: GetArgs) -> miette::Result<u8> {
    let rt = tokio::runtime::Runtime::new()
        .into_diagnostic()
        .wrap_err("cannot start the runtime")?;
    rt.block_on(async move {
        let mut c = args.client.connect().await?;
        let addr = args.client.addr();
        let text = match args.what {
            GetWhat::Clusters { name, output } => {
                let r = c
                    .list_clusters(pb::ListClustersRequest {})
                    .await
                    .map_err(|s| rpc_error(&addr, s))?
                    .into_inner();
                let clusters = found(
                    r.clusters
                        .into_iter()
                        .filter(|x| name.as_ref().is_none_or(|n| &x.name == n))
                        .collect(),
                    "cluster",
                    name.as_deref(),
                )?;
                render(
                    output,
                    &clusters,
                    &[
                        "NAME",
                        "KUBERNETES",
                        "DESIRED",
                        "ROLLOUTS",
                        "MACHINES",
                        "READY",
                        "GENERATION",
                    ],
                    |x| {
                        vec![
                            x.name.clone(),
                            or_dash(&x.kubernetes_version),
                            or_dash(&x.desired_kubernetes_version),
                            if x.rollouts_enabled {
                                "enabled".into()
                            } else {
                                "disabled".into()
                            },
                            x.machines.to_string(),
                            x.machines_ready.to_string(),
                            if x.observed {
                                x.generation.to_string()
                            } else {
                                "not observed".into()
                            },
                        ]
                    },
                )
            }
            GetWhat::Nodepools {
                name,
                cluster,
                output,
            } => {
                let r = c
                    .list_node_pools(pb::ListNodePoolsRequest {
                        cluster: cluster.unwrap_or_default(),
                    })
                    .await
                    .map_err(|s| rpc_error(&addr, s))?
                    .into_inner();
                let pools = found(
                    r.pools
                        .into_iter()
                        .filter(|p| name.as_ref().is_none_or(|n| &p.name == n))
                        .collect(),
                    "nodepool",
                    name.as_deref(),
                )?;
                render(
                    output,
                    &pools,
                    &[
                        "CLUSTER",
                        "POOL",
                        "ROLE",
                        "MACHINES",
                        "RUNNING",
                        "DESIRED",
                        "MAX-UNAVAILABLE",
                    ],
                    |p| {
                        vec![
                            p.cluster.clone(),
                            p.name.clone(),
                            p.role.clone(),
                            p.machines.to_string(),
                            if p.running_talos_versions.is_empty() {
                                "-".into()
                            } else {
                                p.running_talos_versions.join(",")
                            },
                            p.desired_talos_version.clone(),
                            p.max_unavailable.to_string(),
                        ]
                    },
                )
            }
            GetWhat::Server { output } => {
                let r = c
                    .server_info(pb::ServerInfoRequest {})
                    .await
                    .map_err(|s| rpc_error(&addr, s))?
                    .into_inner();
                if !r.allowed_signers_problem.is_empty()
                    && matches!(output, Format::Table | Format::Wide)
                {
                    eprintln!(
                        "ERROR allowed signers: {} (the last good file stays in force)",
                        r.allowed_signers_problem
                    );
                }
                // `-o wide` adds the background tasks and their last activation (issue #50).
                let tasks = match output {
                    Format::Wide => Some(
                        c.list_background_tasks(pb::ListBackgroundTasksRequest {})
                            .await
                            .map_err(|s| rpc_error(&addr, s))?
                            .into_inner()
                            .tasks,
                    ),
                    _ => None,
                };
                let shown = match output {
                    Format::Table | Format::Wide => output::table(
                        &[
                            "REPLICA",
                            "LEADER",
                            "LEADING-REPLICA",
                            "VERSION",
                            "ROLLOUTS-GATE",
                            "DESIRED-REVISION",
                        ],
                        &[vec![
                            r.replica.clone(),
                            output::yes_no(r.leader),
                            or_dash(&r.leader_replica),
                            r.version.clone(),
                            if r.rollouts_gate { "on" } else { "off" }.to_string(),
                            or_dash(&r.desired_revision),
                        ]],
                    ),
                    Format::Json => output::json(&r),
                    Format::Yaml => output::yaml(&r),
                };
                match tasks {
                    Some(tasks) => format!("{shown}\n{}", tasks_table(&tasks)),
                    None => shown,
                }
            }
            GetWhat::Machines {
                name,
                cluster,
                pool,
                output,
            } => {
                let r = c
                    .list_machines(pb::ListMachinesRequest {
                        cluster: cluster.unwrap_or_default(),
                    })
                    .await
                    .map_err(|s| rpc_error(&addr, s))?
                    .into_inner()
                    .into_machines();
                if let Some(p) = &pool
                    && !r.iter().any(|m| &m.pool == p)
                {
                    return Err(miette::miette!(
                        help = "`medea get nodepools` lists them",
                        "no machine is in a node pool named `{p}`"
                    ));
                }
                let machines = found(
                    r.into_iter()
                        .filter(|m| pool.as_ref().is_none_or(|p| &m.pool == p))
                        .filter(|m| name.as_ref().is_none_or(|n| &m.node == n))
                        .collect(),
                    "machine",
                    name.as_deref(),
                )?;
                let wide = output == Format::Wide;
                let mut header = vec![
                    "CLUSTER", "POOL", "NODE", "ROLE", "TALOS", "KUBELET", "READY", "CORDONED",
                    "ADDRESS",
                ];
                if wide {
                    header.push("ID");
                }
                render(output, &machines, &header, |m| {
                    let mut row = vec![
                        m.cluster.clone(),
                        or_dash(&m.pool),
                        m.node.clone(),
                        m.role.clone(),
                        or_dash(&m.talos_version),
                        or_dash(&m.kubelet_version),
                        if !m.reachable {
                            "unreachable".into()
                        } else {
                            output::yes_no(m.ready)
                        },
                        output::yes_no(m.cordoned),
                        m.address.clone(),
                    ];
                    if wide {
                        row.push(or_dash(&m.id));
                    }
                    row
                })
            }
        };
        out!("{text}");
        Ok::<_, miette::Report>(())
    })?;
    Ok(exit::OK)
}

/// The background tasks of `medea get server -o wide`: last run, next run, last error.
fn tasks_table(tasks: &[pb::BackgroundTask]) -> String {
    output::table(
        &[
            "TASK",
            "ACTIVATIONS",
            "RUNNING",
            "LAST-STARTED",
            "LAST-FINISHED",
            "NEXT-RUN",
            "LAST-ERROR",
        ],
        &tasks
            .iter()
            .map(|t| {
                vec![
                    t.name.clone(),
                    t.activations.to_string(),
                    output::yes_no(t.running),
                    or_dash(&t.last_started),
                    or_dash(&t.last_finished),
                    if t.next_run.is_empty() {
                        "when woken".into()
                    } else {
                        t.next_run.clone()
                    },
                    or_dash(&t.last_error),
                ]
            })
            .collect::<Vec<_>>(),
    )
}

fn or_dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_string()
    }
}

fn render<T: serde::Serialize>(
    format: Format,
    items: &[T],
    header: &[&str],
    row: impl Fn(&T) -> Vec<String>,
) -> String {
    match format {
        Format::Table | Format::Wide => {
            output::table(header, &items.iter().map(row).collect::<Vec<_>>())
        }
        Format::Json => output::json(&items),
        Format::Yaml => output::yaml(&items),
    }
}

#[derive(Debug, Args)]
pub struct ClusterArgs {
    #[command(subcommand)]
    pub action: ClusterAction,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Subcommand)]
pub enum ClusterAction {
    /// Allow approved plans of this cluster to run (the per-cluster gate).
    EnableRollouts {
        /// The cluster.
        #[arg(add = super::complete::clusters())]
        cluster: String,
    },
    /// Stop new rollout steps from starting on this cluster.
    DisableRollouts {
        /// The cluster.
        #[arg(add = super::complete::clusters())]
        cluster: String,
    },
}

pub fn cluster(args: ClusterArgs) -> miette::Result<u8> {
    let (cluster, enabled) = match args.action {
        ClusterAction::EnableRollouts { cluster } => (cluster, true),
        ClusterAction::DisableRollouts { cluster } => (cluster, false),
    };
    let rt = tokio::runtime::Runtime::new()
        .into_diagnostic()
        .wrap_err("cannot start the runtime")?;
    rt.block_on(async move {
        let mut c = args.client.connect().await?;
        let r = c
            .set_rollouts_enabled(pb::SetRolloutsEnabledRequest {
                cluster: cluster.clone(),
                enabled,
            })
            .await
            .map_err(|s| rpc_error(&args.client.addr(), s))?
            .into_inner();
        let state = r.cluster.map(|c| c.rollouts_enabled).unwrap_or(enabled);
        outln!(
            "cluster {cluster}: rollouts {}",
            if state { "enabled" } else { "disabled" }
        );
        Ok::<_, miette::Report>(())
    })?;
    Ok(exit::OK)
}
