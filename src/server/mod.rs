//! The daemon: watches the desired state, keeps the inventory fresh, serves the API and runs
//! approved rollouts.
//!
//! **Owns:** the reconcile loop, the gRPC API service ([`api`]; the generated code is
//! [`crate::api::pb`]) and its job/event conversions ([`rollouts`]), authentication and TLS,
//! wiring of adapters.
//! **May depend on:** the `server` row of design/architecture.md's code map (the one list,
//! checked by `tests/it/architecture.rs`); the Talos and Kubernetes clients only through the
//! application layer and the rollout adapters. Inside: the API service uses the rollouts
//! module, never the other way.
//! Architecture Invariant: invalid desired state never changes anything: a revision with
//! errors only replaces the diagnostics that `medea plan` shows.
//! Architecture Invariant: every RPC requires the bearer token; no RPC returns credentials.

pub mod api;
pub mod auth;
pub mod backups;
pub mod listen;
pub mod notify;
pub mod reconcile;
pub mod rehearsals;
/// The inventory refresh moved to the application layer ([`crate::ops::refresh`]); this
/// path keeps working.
pub use crate::ops::refresh;
pub mod rollouts;
pub mod secrets;
pub mod tls;
pub mod trust;
pub mod ui;
pub mod watch;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::Locked as _;
use crate::desired::{Loaded, Source};
use crate::secret::Secret;
use crate::store::{Leadership, Role, Store};

/// Everything `medea serve` was started with.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub source: Source,
    pub state_dir: PathBuf,
    pub creds_dir: PathBuf,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub token: Secret<String>,
    pub rollouts: bool,
    pub allowed_signers: Option<PathBuf>,
    pub debounce: Duration,
    pub refresh_interval: Duration,
    /// The least time between two workload censuses of a cluster (default 10 min;
    /// [`crate::ops::refresh::RefreshSettings::census_interval`]).
    pub census_interval: Duration,
    pub replica: String,
    /// Where `/metrics` is served, if anywhere.
    pub metrics_listen: Option<SocketAddr>,
    /// Webhook URLs notified of plan and rollout events.
    pub webhooks: Vec<String>,
    /// How often a running job re-observes its nodes (default 5s; the demo uses less).
    pub executor_poll: Option<std::time::Duration>,
    /// Where the web dashboard is served (HTTPS, the API's certificate), if anywhere.
    pub ui_listen: Option<SocketAddr>,
    /// The dashboard's connection caps and timeouts.
    pub ui_limits: ui::Limits,
    /// What Job hooks may ask for (`--hook-*` flags; issue #49): checked when a revision is
    /// loaded and again before each Job is created.
    pub hook_policy: crate::desired::hook_policy::HookPolicy,
    /// The gRPC API's connection caps and timeouts (issue #49).
    pub api_limits: listen::Limits,
    /// `/metrics`'s connection caps and timeouts (issue #49).
    pub metrics_limits: listen::Limits,
}

impl ServerConfig {
    /// The three listeners' limits, each within an eighth of the soft file-descriptor limit
    /// `nofile` (so a flood leaves descriptors for the store, the refresh and the reload);
    /// a lowered cap is logged.
    fn fit_limits(&mut self, nofile: Option<u64>) {
        let (ui, metrics) = (self.ui_listen.is_some(), self.metrics_listen.is_some());
        for (name, used, l) in [
            ("API", true, &mut self.api_limits),
            ("dashboard", ui, &mut self.ui_limits),
            ("metrics", metrics, &mut self.metrics_limits),
        ] {
            let fit = l.within_descriptors(nofile);
            if used && fit.max_connections < l.max_connections {
                tracing::warn!(
                    listener = name,
                    descriptors = nofile.unwrap_or_default(),
                    max_connections = fit.max_connections,
                    max_per_peer = fit.max_per_peer,
                    "connection caps lowered to an eighth of the file-descriptor limit; raise it (LimitNOFILE, ulimit -n) for more"
                );
            }
            *l = fit;
        }
    }
}

/// State shared by the API and the background loops.
pub struct Shared {
    pub store: Arc<dyn Store>,
    pub source: Source,
    pub rollouts_gate: bool,
    pub replica: String,
    /// Whether this replica leads. Only the leader runs the planner's writes, the inventory
    /// refresh and the executor, and each of their writes is fenced on its term
    /// (`Txn::fenced(&fence)` or `FencedStore`; see design/ha.md).
    pub leadership: Leadership,
    desired: RwLock<Option<Arc<Loaded>>>,
    /// The desired-state loader of [`reload`]: each file's parse, reused while its bytes are
    /// unchanged (design/performance.md, "Incremental reload and planning").
    loader: std::sync::Mutex<crate::desired::Loader>,
    /// The reconcile pass's planning cache: the inventory kept decoded and each cluster's plan
    /// section, reused while its inputs are unchanged.
    pub replan_cache: std::sync::Mutex<crate::ops::replan::ReplanCache>,
    /// The reconcile pass's approval checks: each candidate's signature stage, kept per
    /// (candidate digest, current plan, signers generation) (`ops::approvals`).
    pub approval_cache: std::sync::Mutex<crate::ops::approvals::ApprovalCache>,
    /// The rejected approval candidates already logged at WARN (source, key, code), so an
    /// unchanged marker is not logged again on every pass, nor on every new plan (issue #52: a
    /// leftover marker warns once).
    pub warned_rejections: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// A counter bumped on every change worth re-planning or re-executing for; loops wait on
    /// it (a missed wake-up is impossible: `watch` keeps the latest value).
    changes: tokio::sync::watch::Sender<u64>,
    /// The people who may approve (the server's file, never the repository's), with the last
    /// good version kept when a reload fails.
    pub trust: trust::TrustRoot,
    pub notifier: crate::webhook::Notifier,
    /// What the last reconcile pass concluded about the current plan.
    last_pass: RwLock<reconcile::PassResult>,
    /// Step events of every executor, for the watch API.
    pub events: tokio::sync::broadcast::Sender<crate::rollout::executor::RolloutEvent>,
    /// What each running job of this replica's executors waits for (`rollout status`).
    pub waits: rollouts::Waits,
    pub creds_dir: PathBuf,
    pub state_dir: PathBuf,
    /// Ask the inventory refresh to run now (after rollout steps); remembered if it is busy.
    pub refresh_kick: Arc<tokio::sync::Notify>,
    /// Replans held back after a job ends until a refresh that started after the end is done.
    pub after_job: AfterJob,
    /// `get machines` rows per cluster record, reused while the record's bytes and the desired
    /// revision are unchanged.
    pub machine_rows: api::MachineRows,
    /// When the inventory refresh last succeeded on this replica (the dashboard shows it).
    last_refresh: RwLock<Option<jiff::Timestamp>>,
    /// The plans this replica is rehearsing now (`RehearsePlan`, the dashboard's Rehearse).
    pub rehearsing: Arc<rehearsals::Running>,
    /// The server's Job-hook policy ([`ServerConfig::hook_policy`]); [`reload`] adds its
    /// refusals to a revision's diagnostics, so a revision it refuses is never planned.
    pub hook_policy: crate::desired::hook_policy::HookPolicy,
    /// How much planning a token holder's requests may take (issue #49).
    pub request_limits: RequestLimits,
}

/// How much planning a token holder's requests may take (issue #49): a preview or a
/// rehearsal plans or simulates a whole revision, so neither may pile up nor run forever.
#[derive(Debug)]
pub struct RequestLimits {
    /// `PreviewPlan`s computed at once; one more is refused (`RESOURCE_EXHAUSTED`). A preview
    /// past its deadline keeps its permit until its computation ends.
    pub previews: Arc<tokio::sync::Semaphore>,
    /// How long a `PreviewPlan` may take before it is answered `DEADLINE_EXCEEDED`.
    pub preview_deadline: Duration,
    /// Rehearsals running at once on this replica; one more is refused.
    pub max_rehearsals: usize,
    /// How long a rehearsal may run; past it, it is stopped and stores no report.
    pub rehearsal_deadline: Duration,
}

impl RequestLimits {
    /// Previews at once.
    pub const PREVIEWS: usize = 2;
    /// A preview's deadline: 30 times what the largest revision the limits allow takes to
    /// plan in a release build (design/performance.md).
    pub const PREVIEW_DEADLINE: Duration = Duration::from_secs(30);
    /// Rehearsals at once.
    pub const REHEARSALS: usize = 2;
    /// A rehearsal's deadline.
    pub const REHEARSAL_DEADLINE: Duration = Duration::from_secs(30 * 60);
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            previews: Arc::new(tokio::sync::Semaphore::new(Self::PREVIEWS)),
            preview_deadline: Self::PREVIEW_DEADLINE,
            max_rehearsals: Self::REHEARSALS,
            rehearsal_deadline: Self::REHEARSAL_DEADLINE,
        }
    }
}

impl Shared {
    pub fn new(
        store: Arc<dyn Store>,
        source: Source,
        rollouts_gate: bool,
        replica: String,
    ) -> Shared {
        Shared {
            store,
            source,
            rollouts_gate,
            leadership: Leadership::solo(replica.clone()),
            replica,
            desired: RwLock::new(None),
            loader: std::sync::Mutex::new(crate::ops::desired_loader()),
            replan_cache: Default::default(),
            approval_cache: Default::default(),
            warned_rejections: Default::default(),
            changes: tokio::sync::watch::channel(0).0,
            trust: trust::TrustRoot::none(),
            notifier: crate::webhook::Notifier::disabled(),
            last_pass: RwLock::new(reconcile::PassResult::default()),
            events: tokio::sync::broadcast::channel(4096).0,
            waits: Default::default(),
            creds_dir: PathBuf::from("creds"),
            state_dir: PathBuf::from("."),
            refresh_kick: Arc::new(tokio::sync::Notify::new()),
            after_job: AfterJob::default(),
            machine_rows: Default::default(),
            last_refresh: RwLock::new(None),
            rehearsing: Default::default(),
            hook_policy: Default::default(),
            request_limits: Default::default(),
        }
    }
    /// Something changed: wake the reconcile and executor loops.
    pub fn bump(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }
    pub fn subscribe_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }
    pub fn last_pass(&self) -> reconcile::PassResult {
        self.last_pass.read_locked().clone()
    }
    pub fn set_last_pass(&self, s: reconcile::PassResult) {
        *self.last_pass.locked() = s;
    }
    /// Whether the last pass already said that `plan` waits for exactly these gates (so the
    /// reconcile pass logs a waiting plan once, not on every pass).
    pub fn last_pass_waited_for(&self, plan: &crate::plan::PlanId, waiting: &[String]) -> bool {
        let last = self.last_pass.read_locked();
        last.plan.as_ref().is_some_and(|p| &p.id == plan) && last.waiting == waiting
    }
    /// The last loaded desired revision (valid or not).
    pub fn desired(&self) -> Option<Arc<Loaded>> {
        self.desired.read_locked().clone()
    }
    pub fn last_refresh(&self) -> Option<jiff::Timestamp> {
        *self.last_refresh.read_locked()
    }
    pub fn set_last_refresh(&self, at: jiff::Timestamp) {
        *self.last_refresh.locked() = Some(at);
    }
    pub fn set_desired(&self, loaded: Loaded) {
        *self.desired.locked() = Some(Arc::new(loaded));
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot set up TLS for the API")]
    Tls(#[from] tls::TlsError),
    #[error("cannot create the state directory `{path}`")]
    StateDir {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("cannot listen on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        err: std::io::Error,
    },
    #[error("the API server failed")]
    Transport(#[source] tonic::transport::Error),
    #[error("the API's certificate or key is not usable")]
    ApiTls(#[source] listen::ConfigError),
    #[error(transparent)]
    Watch(#[from] watch::WatchError),
    #[error("the trust root is not usable; medea serve does not start")]
    TrustRoot(#[from] trust::TrustRootError),
    #[error("cannot start the web dashboard")]
    Ui(#[from] ui::UiError),
}

/// Re-read the desired state and publish it. Invalid revisions change nothing but the
/// diagnostics; the previous valid revision stays in force for planning.
pub fn reload(shared: &Shared) {
    let started = std::time::Instant::now();
    let loaded = shared.loader.locked().load(&shared.source);
    match loaded {
        Ok(mut loaded) => {
            policy_check(&shared.hook_policy, &mut loaded);
            let errors = loaded.errors().count();
            crate::metrics::global()
                .reload_seconds
                .observe(started.elapsed().as_secs_f64());
            if errors > 0 {
                crate::metrics::global().validation_failures.inc();
                for d in loaded.errors() {
                    tracing::warn!(diagnostic = %d, "desired state is invalid; nothing changes");
                }
            } else {
                tracing::info!(revision = %loaded.desired.revision, "desired state loaded");
            }
            shared.set_desired(loaded);
            shared.bump();
        }
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "cannot read the desired state; nothing changes")
        }
    }
}

/// Add what the server's Job-hook policy refuses in `loaded` to its diagnostics (errors, each
/// at the hook's `podSpec`): a revision the policy refuses is never planned, as any invalid
/// revision (issue #49).
pub fn policy_check(policy: &crate::desired::hook_policy::HookPolicy, loaded: &mut Loaded) {
    let refused = policy.check(&loaded.desired);
    loaded.diagnostics.extend(refused);
}

/// The git directory to watch in git mode.
fn git_dir_of(source: &Source) -> Option<PathBuf> {
    match source {
        Source::Git { path, .. } => {
            let mut p = path.canonicalize().ok()?;
            loop {
                if p.join(".git").exists() {
                    return Some(p.join(".git"));
                }
                if !p.pop() {
                    return None;
                }
            }
        }
        Source::Dir(_) => None,
    }
}

/// Run the daemon until `shutdown` resolves. Returns the address it listened on through
/// `bound` as soon as the listener is up.
pub async fn run(
    config: ServerConfig,
    store: Arc<dyn Store>,
    bound: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let leadership = Leadership::solo(config.replica.clone());
    run_with_leadership(config, store, leadership, bound, shutdown).await
}

/// The replan a job's end calls for, held back until an inventory refresh that **started
/// after** the end has completed (issue #39). Replanning at once used the observation taken
/// while the job's last node was still rebooting: a plan proposing to upgrade the node just
/// upgraded, with its "plan ready" webhook, replaced a moment later. A job ending while a
/// refresh is under way is released only by the next refresh (the job's end kicks one).
#[derive(Debug, Default)]
pub struct AfterJob {
    ended: std::sync::atomic::AtomicU64,
    released: std::sync::atomic::AtomicU64,
}

impl AfterJob {
    /// A job ended: the next plan waits for a fresh observation.
    pub fn job_ended(&self) {
        self.ended.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    /// Before a refresh pass: the job ends it observes after (its ticket).
    pub fn pass_starts(&self) -> u64 {
        self.ended.load(std::sync::atomic::Ordering::SeqCst)
    }
    /// After the refresh pass that started with `ticket`: whether a replan held back for an
    /// ended job is due now (once per ticket).
    pub fn pass_done(&self, ticket: u64) -> bool {
        self.released
            .fetch_max(ticket, std::sync::atomic::Ordering::SeqCst)
            < ticket
    }
}

/// Refresh the inventory on start, every `interval`, and when kicked; only the leader writes.
/// A changed cluster bumps the change counter (its plans are stale; re-plan), and so does the
/// first pass that started after a job ended ([`AfterJob`]).
async fn refresh_loop(
    shared: Arc<Shared>,
    interval: std::time::Duration,
    census_interval: std::time::Duration,
) {
    let settings = refresh::RefreshSettings {
        census_interval,
        ..refresh::RefreshSettings::default()
    };
    loop {
        if shared.leadership.is_leader() {
            let ticket = shared.after_job.pass_starts();
            let changed = match refresh::refresh_all(
                shared.store.as_ref(),
                &shared.creds_dir,
                &settings,
            )
            .await
            {
                Ok(report) => {
                    let now = jiff::Timestamp::now();
                    shared.set_last_refresh(now);
                    crate::metrics::refresh_pass(true, now);
                    report.changed()
                }
                Err(e) => {
                    crate::metrics::refresh_pass(false, jiff::Timestamp::now());
                    // The plan then uses what is known: better than a plan held back forever.
                    tracing::warn!(error = %crate::error_chain(&e), "inventory refresh failed; retrying at the next interval");
                    false
                }
            };
            if shared.after_job.pass_done(ticket) || changed {
                shared.bump();
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shared.refresh_kick.notified() => {}
        }
    }
}

/// Give the pages of freed heap memory back to the kernel (glibc's `malloc_trim(0)`: every
/// arena, free pages anywhere in them, not only the top). A reconcile pass over a large fleet
/// frees tens of MiB in the middle of the heap (the previous plan, the pass's temporaries),
/// which glibc otherwise keeps resident: with 10,000 machines the idle server's anonymous
/// memory went from 150 to 114 MB (design/performance.md, branch `heap`). A no-op with other
/// allocators and C libraries.
#[allow(
    unsafe_code,
    reason = "glibc's malloc_trim has no safe binding; the SAFETY comment says why the call is sound"
)]
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let start = std::time::Instant::now();
        // SAFETY: `malloc_trim` takes a plain integer, touches only glibc's own allocator
        // state under its arena locks (thread-safe, callable at any time from any thread)
        // and frees nothing that is allocated; this crate's allocator is glibc's malloc
        // (no `#[global_allocator]`), so it manages exactly the memory Rust freed.
        let released = unsafe { libc::malloc_trim(0) };
        tracing::debug!(
            released = released != 0,
            ms = start.elapsed().as_secs_f64() * 1e3,
            "free heap memory returned to the kernel"
        );
    }
}

/// Reconcile after every change; never busy: it sleeps until the change counter moves.
async fn reconcile_loop(shared: Arc<Shared>) {
    let mut changes = shared.subscribe_changes();
    loop {
        let s = shared.clone();
        let began = std::time::Instant::now();
        let result = tokio::task::spawn_blocking(move || {
            reconcile::reconcile(&s, &[], jiff::Timestamp::now())
        })
        .await;
        match result {
            Ok(Ok(state)) => {
                state.record_metrics(began.elapsed());
                // Applied settings or new jobs change the basis: replan at once.
                let started = !state.started.is_empty() || state.applied;
                shared.set_last_pass(state);
                if started {
                    shared.bump();
                }
                // The previous plan state and the pass's temporaries are freed now.
                drop(tokio::task::spawn_blocking(release_free_memory));
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %crate::error_chain(&e), "reconcile failed; retrying on the next change")
            }
            Err(e) => tracing::error!(error = %e, "reconcile task panicked"),
        }
        // A finding that ends at a known time (a promotion soak) ends the plan with it: plan
        // again then, though nothing else changes (issue #36).
        let expiry = shared
            .last_pass()
            .plan
            .as_ref()
            .and_then(crate::plan::preflight::next_expiry);
        match expiry.map(until) {
            Some(wait) => {
                tokio::select! {
                    changed = changes.changed() => if changed.is_err() { return },
                    _ = tokio::time::sleep(wait) => {
                        tracing::debug!("a preflight finding of the current plan ended by itself; planning again");
                    }
                }
            }
            None => {
                if changes.changed().await.is_err() {
                    return;
                }
            }
        }
    }
}

/// How long from now until `t`, and a little more, so the plan computed then is past it. A
/// time already past waits a second: the pass then sees the finding gone, and a plan that
/// cannot be computed again (invalid desired state) is not retried in a tight loop.
fn until(t: jiff::Timestamp) -> std::time::Duration {
    match std::time::Duration::try_from(t.duration_since(jiff::Timestamp::now())) {
        Ok(left) => left + std::time::Duration::from_millis(50),
        Err(_) => std::time::Duration::from_secs(1),
    }
}

/// Log leadership changes and wake the loops, so that a new leader resumes at once.
async fn follow_leadership(shared: Arc<Shared>) {
    loop {
        let role = shared.leadership.role();
        match &role {
            Role::Leader { fence } => {
                crate::metrics::global().leader.set(1);
                tracing::info!(replica = %shared.replica, term = fence.term(), "leading")
            }
            Role::Follower { leader } => {
                crate::metrics::global().leader.set(0);
                tracing::info!(
                    replica = %shared.replica,
                    leader = %leader.as_deref().unwrap_or("-"),
                    "following"
                )
            }
        }
        shared.bump();
        // from the role just logged: a change in between is not missed
        shared.leadership.changed_from(&role).await;
    }
}

/// [`run`] for a replica whose `leadership` comes from an election (the etcd store).
pub async fn run_with_leadership(
    mut config: ServerConfig,
    store: Arc<dyn Store>,
    leadership: Leadership,
    bound: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    config.fit_limits(listen::descriptor_limit());
    // The trust root first: a server that cannot tell who may approve does not start.
    let trust = trust::TrustRoot::open(config.allowed_signers.clone(), &config.source)?;
    trust::check_creds_dir(&config.creds_dir, &config.source)?;
    secrets::private_dir(&config.state_dir).map_err(|err| ServeError::StateDir {
        path: config.state_dir.clone(),
        err,
    })?;
    let identity = tls::server_identity(
        config.tls_cert.as_deref(),
        config.tls_key.as_deref(),
        &config.state_dir.join("tls"),
        config.listen,
    )?;
    match (&identity.ca_path, &config.tls_cert) {
        (Some(ca), _) if identity.generated => {
            tracing::info!(ca = %ca.display(), "API TLS: generated a CA and a server certificate; clients trust it with --ca or MEDEA_CA");
        }
        (None, Some(cert)) if identity.generated => {
            tracing::info!(cert = %cert.display(), key = %config.tls_key.as_deref().map(|k| k.display().to_string()).unwrap_or_default(), "API TLS: generated a self-signed certificate and key at the given paths; clients trust it with --ca <cert> or MEDEA_CA");
        }
        (Some(ca), _) => {
            tracing::info!(ca = %ca.display(), "API TLS: clients trust the generated CA with --ca or MEDEA_CA");
        }
        _ => {}
    }
    let mut shared = Shared::new(
        store,
        config.source.clone(),
        config.rollouts,
        config.replica.clone(),
    );
    shared.leadership = leadership.clone();
    shared.trust = trust;
    shared.notifier = crate::webhook::Notifier::start(config.webhooks.clone());
    shared.creds_dir = config.creds_dir.clone();
    shared.state_dir = config.state_dir.clone();
    shared.hook_policy = config.hook_policy.clone();
    tracing::info!(policy = %config.hook_policy.summary(), "Job hook policy");
    let shared = Arc::new(shared);
    reload(&shared);
    // The first pass runs before the API answers, so the plan is there for the first caller.
    match reconcile::reconcile(&shared, &[], jiff::Timestamp::now()) {
        Ok(state) => shared.set_last_pass(state),
        Err(e) => tracing::warn!(error = %crate::error_chain(&e), "initial reconcile failed"),
    }
    // The first load and plan of a large fleet leave tens of MiB freed inside the heap.
    release_free_memory();
    let reconciler = tokio::spawn(reconcile_loop(shared.clone()));
    let refresher = tokio::spawn(refresh_loop(
        shared.clone(),
        config.refresh_interval,
        config.census_interval,
    ));
    let backups = tokio::spawn(backups::backup_loop(shared.clone()));
    let executor = if config.rollouts {
        let mut cfg =
            crate::rollout::executor::ExecutorConfig::new(true, config.state_dir.join("snapshots"));
        if let Some(p) = config.executor_poll {
            cfg.poll = p;
            cfg.backoff_min = p;
        }
        cfg.crash = crate::rollout::executor::CrashPoints::from_env();
        cfg.hook_policy = config.hook_policy.clone();
        let factory = Arc::new(rollouts::CredsPorts {
            creds_dir: config.creds_dir.clone(),
        });
        Some(tokio::spawn(rollouts::executor_loop(
            shared.clone(),
            factory,
            cfg,
        )))
    } else {
        None
    };
    if !config.rollouts {
        tracing::info!(
            "--rollouts is off: the executor is disabled and the server is read-only for clusters"
        );
    }

    let watch_root = match &config.source {
        Source::Dir(p) | Source::Git { path: p, .. } => p.clone(),
    };
    let git_dir = git_dir_of(&config.source);
    let (watcher, mut hints) = watch::watch(&watch_root, git_dir.as_deref(), config.debounce)?;
    let reloader = {
        let shared = shared.clone();
        tokio::spawn(async move {
            let _watcher = watcher;
            while hints.recv().await.is_some() {
                let s = shared.clone();
                let _ = tokio::task::spawn_blocking(move || reload(&s)).await;
            }
        })
    };

    let metrics = match config.metrics_listen {
        Some(m) => {
            let l = tokio::net::TcpListener::bind(m)
                .await
                .map_err(|err| ServeError::Listen { addr: m, err })?;
            tracing::info!(addr = %l.local_addr().unwrap_or(m), "metrics on /metrics");
            Some(tokio::spawn(serve_metrics(
                l,
                config.metrics_limits.clone(),
            )))
        }
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|err| ServeError::Listen {
            addr: config.listen,
            err,
        })?;
    let addr = listener.local_addr().map_err(|err| ServeError::Listen {
        addr: config.listen,
        err,
    })?;
    tracing::info!(%addr, "API listening (TLS, bearer token)");
    let dashboard = match config.ui_listen {
        Some(a) => {
            let (at, task) = ui::start(
                a,
                &identity,
                ui::Ui::new(shared.clone(), config.token.clone()),
                config.ui_limits.clone(),
            )
            .await?;
            tracing::info!(url = %format!("https://{at}/"), "web dashboard listening (TLS, the API's certificate; log in with the API token)");
            Some(task)
        }
        None => None,
    };
    if let Some(tx) = bound {
        let _ = tx.send(addr);
    }
    if let Err(e) = notify::sd_notify("READY=1") {
        tracing::warn!(error = %e, "cannot notify systemd of readiness");
    }
    let leadership_task = tokio::spawn(follow_leadership(shared.clone()));
    let api = api::MedeaApi {
        shared: shared.clone(),
    };
    let svc = api::pb::medea_server::MedeaServer::with_interceptor(
        api,
        auth::TokenAuth::new(config.token.clone()),
    );
    // TLS is done by the accept loop (`listen`), which holds the connections under the caps
    // and timeouts; tonic gets handshaken streams that already sent their first bytes.
    let acceptor = tokio_rustls::TlsAcceptor::from(
        listen::tls_config(&identity, &[b"h2"]).map_err(ServeError::ApiTls)?,
    );
    let limits = config.api_limits.clone();
    let incoming = listen::accept("API", listener, limits.clone(), move |tcp| {
        acceptor.accept(tcp)
    });
    let incoming = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::ReceiverStream::new(incoming),
        Ok::<_, std::io::Error>,
    );
    let result = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(limits.keep_alive))
        .http2_keepalive_timeout(Some(limits.keep_alive))
        .add_service(svc)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(ServeError::Transport);
    reloader.abort();
    reconciler.abort();
    refresher.abort();
    backups.abort();
    if let Some(e) = executor {
        e.abort();
    }
    if let Some(m) = metrics {
        m.abort();
    }
    if let Some(d) = dashboard {
        d.abort();
    }
    leadership_task.abort();
    // Hand over at once instead of letting the lease run out.
    leadership.resign().await;
    result
}

/// `/metrics` over plain HTTP (1.1, or 2 with prior knowledge) under `limits`.
async fn serve_metrics(listener: tokio::net::TcpListener, limits: listen::Limits) {
    let mut incoming = listen::accept(
        "metrics",
        listener,
        limits.clone(),
        |tcp| async move { Ok(tcp) },
    );
    let app = crate::metrics::router();
    let mut connections = tokio::task::JoinSet::new();
    while let Some(conn) = incoming.recv().await {
        connections.spawn(listen::serve_http(
            conn,
            app.clone(),
            limits.clone(),
            listen::Http::Auto,
        ));
        while connections.try_join_next().is_some() {}
    }
}

#[cfg(test)]
mod tests {
    /// Issue #39's phantom plan: a job that ends while a refresh is under way is not released
    /// by that refresh (it may have observed the last node mid-reboot), only by the next one;
    /// each end releases one replan, and passes with no job ended release nothing.
    #[test]
    fn a_replan_after_a_job_waits_for_a_refresh_that_started_after_the_end() {
        let a = super::AfterJob::default();
        let idle = a.pass_starts();
        assert!(!a.pass_done(idle), "no job ended: nothing to release");
        // A refresh starts, the job ends meanwhile, the refresh completes: held back.
        let during = a.pass_starts();
        a.job_ended();
        assert!(!a.pass_done(during));
        // The refresh the end kicked starts after it: released, once.
        let next = a.pass_starts();
        assert!(a.pass_done(next));
        let again = a.pass_starts();
        assert!(!a.pass_done(again));
        // Two jobs (two clusters) ending before one pass: one replan covers both.
        a.job_ended();
        a.job_ended();
        let both = a.pass_starts();
        assert!(a.pass_done(both));
        assert!(!a.pass_done(a.pass_starts()));
    }

    /// Every connection the listeners accept (the API's, the dashboard's, `/metrics`) has
    /// Nagle's algorithm off: without it, the last segment of a response (a `get machines`
    /// of 10,000 rows is ~1.5 MB) waits for the client's delayed ACK, about 40 ms on Linux.
    #[tokio::test]
    async fn api_connections_are_accepted_with_nodelay() {
        use tokio::io::AsyncWriteExt as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = super::listen::accept(
            "API",
            listener,
            super::listen::Limits::default(),
            |tcp| async move { Ok(tcp) },
        );
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        client.write_all(b"PRI").await.unwrap();
        let accepted = incoming.recv().await.unwrap();
        assert!(accepted.get_ref().nodelay().unwrap());
    }
}
