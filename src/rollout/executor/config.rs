//! The executor's settings and seams: its clock, the fence on its commits, the crash
//! harness's hooks and [`ExecutorConfig`].

use super::*;

/// Wall-clock time for the executor (the machine gets it as an argument).
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> Timestamp;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// Wall time that advances with tokio's clock: `base` plus the tokio time elapsed since
/// creation. Under `tokio::time::pause()` it moves exactly as far as the executor sleeps.
#[derive(Debug, Clone)]
pub struct TokioClock {
    base: Timestamp,
    start: tokio::time::Instant,
}

impl TokioClock {
    /// A clock that reads `base` now and moves with tokio's (paused) time.
    pub fn starting_at(base: Timestamp) -> TokioClock {
        TokioClock {
            base,
            start: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        self.base
            .checked_add(self.start.elapsed())
            .unwrap_or(Timestamp::MAX)
    }
}

/// Extra preconditions on every executor transaction (the HA leader lease).
pub trait CommitFence: Send + Sync {
    /// The preconditions added to every transaction.
    fn checks(&self) -> Vec<Check>;
    /// Called right before each mutating call, with the checks its intent was journaled
    /// under: do they still hold here and now? A replica whose term ended (lease expired,
    /// even while the process was stopped) must not act on an intent of that term, since a
    /// new leader may already have resumed it. Nothing that can wait runs between this and
    /// the call.
    fn ensure(&self, _intent_checks: &[Check]) -> Result<(), StoreError> {
        Ok(())
    }
}

/// No fencing: a single medea owns the store (fjall's lock file guarantees it).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoFence;

impl CommitFence for NoFence {
    fn checks(&self) -> Vec<Check> {
        Vec::new()
    }
}

/// Test hook for the crash harness: abort the process right before or right after the N-th
/// store commit of this executor (1-based), or of the first commit of a named journal entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CrashPoints {
    /// Abort right before the N-th commit.
    pub before: Option<u64>,
    /// Abort right after the N-th commit.
    pub after: Option<u64>,
    /// The first commit of this entry ([`entry_point`], e.g. `intent:upgrade:cp-2`).
    pub before_entry: Option<String>,
    /// The first commit of this entry: abort right after it.
    pub after_entry: Option<String>,
    /// Freeze the process (SIGSTOP to itself) right after the first commit of this entry, as a
    /// VM stall would: the HA tests resume it with SIGCONT after a failover.
    pub stop_after_entry: Option<String>,
}

impl CrashPoints {
    /// `MEDEA_CRASH_AT=N` (or `MEDEA_CRASH_AFTER=N`): abort right after commit N;
    /// `MEDEA_CRASH_BEFORE=N`: abort right before commit N (after the call it records). Instead
    /// of N, an entry name: `intent:<op>:<node>`, `result:<op>:<node>`, `gates:<point>` (a gate
    /// evaluation, `<point>` as in `GatePoint::name`, e.g. `gates:after-wave:1:1`) (`<op>` as in
    /// `CommandOp::name`, e.g. `upgrade`, `reboot`, `drain`). `MEDEA_STOP_AT=<entry>`: SIGSTOP itself
    /// right after that entry's commit.
    pub fn from_env() -> CrashPoints {
        let raw = |k: &str| {
            std::env::var(k)
                .ok()
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let at = raw("MEDEA_CRASH_AT").or_else(|| raw("MEDEA_CRASH_AFTER"));
        let before = raw("MEDEA_CRASH_BEFORE");
        let number = |v: &Option<String>| v.as_deref().and_then(|v| v.parse().ok());
        let entry = |v: &Option<String>| v.clone().filter(|v| v.parse::<u64>().is_err());
        CrashPoints {
            before: number(&before),
            after: number(&at),
            before_entry: entry(&before),
            after_entry: entry(&at),
            stop_after_entry: raw("MEDEA_STOP_AT"),
        }
    }
}

/// The name of a journal entry for [`CrashPoints`]: `intent:<op>:<node>`,
/// `result:<op>:<node>` (`-` for a command without a node), or the entry kind.
pub fn entry_point(entry: &Entry) -> String {
    match entry {
        Entry::Intent { key, .. } | Entry::Result { key, .. } => format!(
            "{}:{}:{}",
            entry.name(),
            key.op.name(),
            key.node.as_deref().unwrap_or("-")
        ),
        Entry::Gates { point, .. } => format!("{}:{}", entry.name(), point.name()),
        other => other.name().to_string(),
    }
}

/// How the executor runs: the global switch, where snapshots go, its timing, crash points.
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// The server's global `--rollouts` switch.
    pub rollouts: bool,
    /// Where etcd snapshots are saved (`<dir>/<job>.db`), created 0700.
    pub snapshot_dir: PathBuf,
    /// Interval between observations while something is in progress.
    pub poll: Duration,
    /// Backoff after transient failures: from `backoff_min`, doubling, capped at `backoff_max`.
    pub backoff_min: Duration,
    /// The cap of the backoff.
    pub backoff_max: Duration,
    /// Longest single sleep, so halt requests are noticed while waiting for a window.
    pub max_sleep: Duration,
    /// The crash harness's abort points (none outside tests).
    pub crash: CrashPoints,
    /// What a Job hook's pod may ask for (the server's `--hook-*` flags, issue #49), checked
    /// again right before the Job is created: a plan made elsewhere, or before the policy
    /// changed, never runs what the server refuses. The default refuses every Job hook.
    pub hook_policy: crate::desired::hook_policy::HookPolicy,
}

impl ExecutorConfig {
    /// The defaults, with the global switch `rollouts` and snapshots under `snapshot_dir`.
    pub fn new(rollouts: bool, snapshot_dir: PathBuf) -> ExecutorConfig {
        ExecutorConfig {
            rollouts,
            snapshot_dir,
            poll: Duration::from_secs(5),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            max_sleep: Duration::from_secs(30),
            crash: CrashPoints::default(),
            hook_policy: Default::default(),
        }
    }
}
