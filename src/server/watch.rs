//! File watching: debounced notify events become "re-read the desired state" hints.
//!
//! Events are only hints; the whole revision is loaded and re-validated on each (the loader
//! skips reading files whose stamp proves them unchanged, `desired::Loader`). Directory
//! mode ignores `.git/**` and editor temp files; git mode watches the checkout's `.git`
//! directory too, so a new commit (or a moved ref) triggers a reload even though the committed
//! tree, not the work tree, is what gets read. Nothing polls: with no events, nothing runs.
//!
//! Debouncing is event-driven (a tokio timer that restarts on every event), not
//! notify-debouncer-full's loop, which wakes every quarter of the debounce even when idle and
//! delivers a burst up to a quarter of the debounce late (measured in design/performance.md).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify_debouncer_full::notify::{
    self, Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher as _,
};
use tokio::sync::{Notify, mpsc};

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("cannot watch `{path}` for changes")]
    Watch {
        path: PathBuf,
        #[source]
        err: notify::Error,
    },
}

/// Keeps the watcher alive; dropping it stops watching.
pub struct Watcher {
    _watcher: RecommendedWatcher,
    debounce: tokio::task::JoinHandle<()>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.debounce.abort();
    }
}

fn interesting(path: &Path, root: &Path, git: bool) -> bool {
    let rel = path.strip_prefix(root).unwrap_or(path);
    let mut comps = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned());
    let first = comps.next().unwrap_or_default();
    if first == ".git" {
        // In git mode, ref and HEAD moves matter; object writes alone do not.
        let rest: Vec<String> = comps.collect();
        return git
            && rest
                .first()
                .is_some_and(|s| s == "HEAD" || s == "refs" || s == "packed-refs");
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    !(name.ends_with('~')
        || name.ends_with(".swp")
        || name.ends_with(".swx")
        || name.starts_with(".#")
        || name == "4913")
}

/// Wait for the first change, then for `quiet` without any; repeat. Event-driven: with no
/// events this task sleeps (no timer, no polling), and a hint goes out exactly `quiet` after
/// the last event of a burst.
async fn debounce(events: Arc<Notify>, quiet: Duration, tx: mpsc::Sender<()>) {
    loop {
        events.notified().await;
        while tokio::time::timeout(quiet, events.notified()).await.is_ok() {}
        // A full channel already holds a pending hint; dropping this one loses nothing.
        if tx.is_closed() {
            return;
        }
        let _ = tx.try_send(());
    }
}

/// Watch `root` (and, in git mode, its repository's `.git`) and send a hint per debounced
/// batch. Must be called inside a tokio runtime (the debounce timer runs on it).
pub fn watch(
    root: &Path,
    git_dir: Option<&Path>,
    quiet: Duration,
) -> Result<(Watcher, mpsc::Receiver<()>), WatchError> {
    let (tx, rx) = mpsc::channel(16);
    let root_owned = root.to_path_buf();
    let git = git_dir.is_some();
    let git_root = git_dir.and_then(|g| g.parent().map(Path::to_path_buf));
    let events = Arc::new(Notify::new());
    let notify_events = events.clone();
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<Event>| {
        let relevant = match res {
            // Reading the files (opens, non-write closes) must not trigger another read.
            Ok(e) => {
                !matches!(e.kind, EventKind::Access(_))
                    && e.paths.iter().any(|p| {
                        interesting(p, &root_owned, git)
                            || git_root.as_ref().is_some_and(|g| interesting(p, g, true))
                    })
            }
            // Errors (e.g. queue overflow) mean we may have missed something: re-read.
            Err(_) => true,
        };
        if relevant {
            notify_events.notify_one();
        }
    })
    .map_err(|err| WatchError::Watch {
        path: root.to_path_buf(),
        err,
    })?;
    watcher
        .watch(root, RecursiveMode::Recursive)
        .map_err(|err| WatchError::Watch {
            path: root.to_path_buf(),
            err,
        })?;
    if let Some(g) = git_dir
        && !g.starts_with(root)
    {
        watcher
            .watch(g, RecursiveMode::Recursive)
            .map_err(|err| WatchError::Watch {
                path: g.to_path_buf(),
                err,
            })?;
    }
    let debounce = tokio::spawn(debounce(events, quiet, tx));
    Ok((
        Watcher {
            _watcher: watcher,
            debounce,
        },
        rx,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_gives_one_hint_exactly_a_quiet_period_after_its_last_event() {
        let events = Arc::new(Notify::new());
        let (tx, mut rx) = mpsc::channel(16);
        let task = tokio::spawn(debounce(events.clone(), Duration::from_millis(500), tx));
        let start = tokio::time::Instant::now();
        for _ in 0..5 {
            events.notify_one();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Last event at 400 ms: the hint comes at 900 ms, and only one.
        rx.recv().await.unwrap();
        let at = start.elapsed();
        assert!(
            at >= Duration::from_millis(900) && at < Duration::from_millis(910),
            "{at:?}"
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(rx.try_recv().is_err(), "one hint per burst");
        events.notify_one();
        rx.recv().await.unwrap();
        task.abort();
    }

    #[test]
    fn filters_noise() {
        let root = Path::new("/r");
        assert!(interesting(Path::new("/r/home/cluster.yaml"), root, false));
        assert!(!interesting(Path::new("/r/.git/objects/ab/cd"), root, true));
        assert!(!interesting(
            Path::new("/r/.git/refs/heads/main"),
            root,
            false
        ));
        assert!(interesting(
            Path::new("/r/.git/refs/heads/main"),
            root,
            true
        ));
        assert!(interesting(Path::new("/r/.git/HEAD"), root, true));
        assert!(!interesting(
            Path::new("/r/home/.cluster.yaml.swp"),
            root,
            false
        ));
        assert!(!interesting(
            Path::new("/r/home/cluster.yaml~"),
            root,
            false
        ));
    }
}
