//! File watching: debounced notify events become "re-read the desired state" hints.
//!
//! Events are only hints; the whole revision is re-read and re-validated on each. Directory
//! mode ignores `.git/**` and editor temp files; git mode watches the checkout's `.git`
//! directory too, so a new commit (or a moved ref) triggers a reload even though the committed
//! tree, not the work tree, is what gets read. Nothing polls: with no events, nothing runs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify_debouncer_full::notify::{RecommendedWatcher, RecursiveMode};
use notify_debouncer_full::{DebounceEventResult, Debouncer, RecommendedCache, new_debouncer};
use tokio::sync::mpsc;

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("cannot watch `{path}` for changes")]
    Watch {
        path: PathBuf,
        #[source]
        err: notify_debouncer_full::notify::Error,
    },
}

/// Keeps the watcher alive; dropping it stops watching.
pub struct Watcher {
    _debouncer: Debouncer<RecommendedWatcher, RecommendedCache>,
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

/// Watch `root` (and, in git mode, its repository's `.git`) and send a hint per debounced batch.
pub fn watch(
    root: &Path,
    git_dir: Option<&Path>,
    debounce: Duration,
) -> Result<(Watcher, mpsc::Receiver<()>), WatchError> {
    let (tx, rx) = mpsc::channel(16);
    let root_owned = root.to_path_buf();
    let git = git_dir.is_some();
    let git_root = git_dir.and_then(|g| g.parent().map(Path::to_path_buf));
    let mut debouncer = new_debouncer(debounce, None, move |res: DebounceEventResult| {
        let relevant = match res {
            Ok(events) => events.iter().any(|e| {
                e.paths.iter().any(|p| {
                    interesting(p, &root_owned, git)
                        || git_root.as_ref().is_some_and(|g| interesting(p, g, true))
                })
            }),
            // Errors (e.g. queue overflow) mean we may have missed something: re-read.
            Err(_) => true,
        };
        if relevant {
            // A full channel already holds a pending hint; dropping this one loses nothing.
            let _ = tx.try_send(());
        }
    })
    .map_err(|err| WatchError::Watch {
        path: root.to_path_buf(),
        err,
    })?;
    debouncer
        .watch(root, RecursiveMode::Recursive)
        .map_err(|err| WatchError::Watch {
            path: root.to_path_buf(),
            err,
        })?;
    if let Some(g) = git_dir
        && !g.starts_with(root)
    {
        debouncer
            .watch(g, RecursiveMode::Recursive)
            .map_err(|err| WatchError::Watch {
                path: g.to_path_buf(),
                err,
            })?;
    }
    Ok((
        Watcher {
            _debouncer: debouncer,
        },
        rx,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

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
