//! `medea __ha-probe`: a hidden command the HA tests run as real replica processes.
//!
//! It campaigns on an etcd store and, while it leads, runs a miniature of the rollout
//! executor's discipline: journal an intent through the fenced path, re-check leadership, then
//! act on an "external system" (a file it appends to, standing in for a Talos call). On winning
//! leadership it first resumes: it observes the external system and completes the last intent
//! if it was never acted on. Every event is a line on stdout, which the tests read:
//!
//! ```text
//! following <replica>|-        leading term=<T>        intent <n> term=<T>
//! acted <n> term=<T>           resume <n>              refused action <n>: <why>
//! fenced: <why>                stopping after intent <n>   finished    ready
//! ```

#[cfg(feature = "etcd")]
use miette::{IntoDiagnostic as _, WrapErr as _};
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::ha::HaArgs;
use crate::store::location::StoreLocation;

#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// The etcd store (etcd://host:port[/prefix]).
    #[arg(long)]
    pub store: StoreLocation,
    #[command(flatten)]
    pub ha: HaArgs,
    /// The "external system": each action appends `<n> <replica> <term>` to this file.
    #[arg(long)]
    pub actions: PathBuf,
    /// Resign and exit once the counter reaches this (0: run until killed).
    #[arg(long, default_value_t = 0)]
    pub steps: u64,
    /// SIGSTOP this process right after journaling intent <n>, before re-checking leadership
    /// and acting (the tests resume it with SIGCONT after a failover).
    #[arg(long)]
    pub stop_after_intent: Option<u64>,
    /// On first leading, print `ready` and wait for a line on stdin before the first step
    /// (so a test can line up followers first).
    #[arg(long)]
    pub wait_for_go: bool,
    /// Pause between steps.
    #[arg(long, default_value = "20ms", value_parser = crate::duration::parse_std)]
    pub interval: Duration,
}

#[cfg(not(feature = "etcd"))]
pub fn probe(_args: ProbeArgs) -> miette::Result<u8> {
    Err(miette::miette!(
        help = "rebuild with `--features etcd`",
        "__ha-probe needs the etcd store backend"
    ))
}

#[cfg(feature = "etcd")]
pub fn probe(args: ProbeArgs) -> miette::Result<u8> {
    // The store's own WARN lines (a failed election round, a lost keep-alive stream) go to
    // stderr, so a test that waits in vain for a line can show why.
    super::init_logging(super::LogFormat::Text);
    imp::probe(args)
}

#[cfg(feature = "etcd")]
mod imp {
    use std::io::Write;

    use super::*;
    use crate::store::{Check, Fence, Leadership, Role, Store, StoreError, Table, Txn};

    const COUNTER: &str = "probe/counter";

    fn say(line: impl std::fmt::Display) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }

    enum Done {
        Finished,
    }

    struct Probe<'a> {
        store: &'a dyn Store,
        leadership: &'a Leadership,
        args: &'a ProbeArgs,
        fence: Fence,
    }

    impl Probe<'_> {
        fn acted(&self, n: u64) -> bool {
            std::fs::read_to_string(&self.args.actions)
                .unwrap_or_default()
                .lines()
                .any(|l| l.split(' ').next() == Some(n.to_string().as_str()))
        }

        /// The fenced "external call": re-check leadership, then act.
        fn act(&self, n: u64) -> Result<(), StoreError> {
            if let Err(e) = self.leadership.ensure(&self.fence) {
                say(format_args!("refused action {n}: {e}"));
                return Err(e);
            }
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.args.actions)
                .map_err(|e| StoreError::Backend {
                    op: "probe action",
                    err: Box::new(e),
                })?;
            writeln!(f, "{n} {} {}", self.fence.replica(), self.fence.term()).map_err(|e| {
                StoreError::Backend {
                    op: "probe action",
                    err: Box::new(e),
                }
            })?;
            say(format_args!("acted {n} term={}", self.fence.term()));
            Ok(())
        }

        fn counter(&self) -> Result<Option<Vec<u8>>, StoreError> {
            self.store.get(Table::Journal, COUNTER)
        }

        fn run(&self) -> Result<Done, StoreError> {
            let mut resumed = false;
            loop {
                let raw = self.counter()?;
                let n: u64 = raw
                    .as_deref()
                    .and_then(|b| std::str::from_utf8(b).ok())
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                if !resumed {
                    // The resume path: intent → observe → act only if it never happened.
                    resumed = true;
                    if n > 0 && !self.acted(n) {
                        say(format_args!("resume {n}"));
                        self.act(n)?;
                    }
                }
                if self.args.steps > 0 && n >= self.args.steps {
                    return Ok(Done::Finished);
                }
                let next = n + 1;
                let mut txn = Txn::new().fenced(&self.fence);
                txn = match raw {
                    Some(bytes) => txn.check(Check::Equals(Table::Journal, COUNTER.into(), bytes)),
                    None => txn.check(Check::Absent(Table::Journal, COUNTER.into())),
                };
                txn = txn
                    .put(Table::Journal, COUNTER, next.to_string().into_bytes())
                    .put(
                        Table::Journal,
                        format!("probe/intent/{next:08}"),
                        format!("{} {}", self.fence.replica(), self.fence.term()).into_bytes(),
                    );
                self.store.commit(txn)?;
                say(format_args!("intent {next} term={}", self.fence.term()));
                if self.args.stop_after_intent == Some(next) {
                    say(format_args!("stopping after intent {next}"));
                    let _ = std::process::Command::new("kill")
                        .args(["-STOP", &std::process::id().to_string()])
                        .status();
                }
                self.act(next)?;
                std::thread::sleep(self.args.interval);
            }
        }
    }

    pub fn probe(args: ProbeArgs) -> miette::Result<u8> {
        let opened = super::super::ha::open_store(&args.store, &args.ha)?;
        if matches!(args.store, StoreLocation::Dir(_)) {
            return Err(miette::miette!("__ha-probe needs an etcd:// store"));
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .into_diagnostic()
            .wrap_err("cannot start the runtime")?;
        let leadership = opened.leadership;
        let mut last_seen: Option<Option<String>> = None;
        let mut go_pending = args.wait_for_go;
        loop {
            let role = leadership.role();
            let fence = match &role {
                Role::Leader { fence } => fence.clone(),
                Role::Follower { leader } => {
                    if last_seen.as_ref() != Some(leader) {
                        say(format_args!(
                            "following {}",
                            leader.as_deref().unwrap_or("-")
                        ));
                        last_seen = Some(leader.clone());
                    }
                    // from the role just printed: a change in between is not missed
                    rt.block_on(leadership.changed_from(&role));
                    continue;
                }
            };
            last_seen = None;
            say(format_args!("leading term={}", fence.term()));
            if std::mem::take(&mut go_pending) {
                say("ready");
                let mut line = String::new();
                let _ = std::io::stdin().read_line(&mut line);
            }
            let p = Probe {
                store: opened.store.as_ref(),
                leadership: &leadership,
                args: &args,
                fence: fence.clone(),
            };
            match p.run() {
                Ok(Done::Finished) => {
                    rt.block_on(leadership.resign());
                    say("finished");
                    return Ok(0);
                }
                Err(e) if e.is_leadership_lost() => {
                    say(format_args!("fenced: {e}"));
                    // The store said no; wait until the election agrees before looking again.
                    rt.block_on(leadership.lost(&fence));
                }
                Err(e @ StoreError::Conflict { .. }) => {
                    say(format_args!("conflict: {e}"));
                }
                Err(e) => return Err(miette::Report::from_err(e)),
            }
        }
    }
}
