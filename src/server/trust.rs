//! The trust root in force: the server's allowed_signers file.
//!
//! At startup it must be there, readable and free of errors, and outside the desired-state
//! directory (whoever can commit must not be able to add a signer), or `medea serve` stops
//! ([`TrustRoot::open`]). After start it is re-read before every verification: a good file
//! replaces the signers; a missing, unreadable or bad one keeps the **last good file**, logs an
//! ERROR, sets `medea_allowed_signers_reload_failed` to 1 and shows in `medea get server`
//! ([`TrustRoot::current`], [`TrustRoot::problem`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crate::Locked as _;
use crate::approval::{self, AllowedSigners};
use crate::desired::Source;

#[derive(Debug, thiserror::Error)]
pub enum TrustRootError {
    /// Not readable or not a good file: the words of the one reader
    /// ([`approval::allowed_signers::read`]), the same as `medea approve` and `medea approvals`
    /// show for the same file.
    #[error(transparent)]
    Signers(#[from] approval::allowed_signers::SignersFileError),
    #[error(
        "the allowed signers file `{path}` is inside the desired-state directory `{desired}`: whoever can commit could add themselves as a signer; keep it in the server's own configuration (e.g. /etc/medea/allowed_signers)"
    )]
    InsideDesired { path: PathBuf, desired: PathBuf },
    #[error(
        "the credentials directory `{path}` (--creds-dir) is inside the desired-state directory `{desired}`: whoever can commit could plant or name the credentials medea sends to health sources; keep it in the server's own state (e.g. /var/lib/medea/creds)"
    )]
    CredsInsideDesired { path: PathBuf, desired: PathBuf },
}

/// At startup (issue #32): the credentials directory, whose files health sources' credential
/// names resolve to, must not be inside a directory a committer controls.
pub fn check_creds_dir(creds_dir: &Path, source: &Source) -> Result<(), TrustRootError> {
    // The directory may not exist yet (seeded later): judge its nearest existing ancestor.
    let mut probe = creds_dir.to_path_buf();
    let real = loop {
        if let Ok(real) = probe.canonicalize() {
            break Some(real);
        }
        if !probe.pop() {
            break None;
        }
    };
    let Some(real) = real else {
        return Ok(());
    };
    for dir in committer_dirs(source) {
        if real.starts_with(&dir) {
            return Err(TrustRootError::CredsInsideDesired {
                path: creds_dir.to_path_buf(),
                desired: dir,
            });
        }
    }
    Ok(())
}

/// The directories whose contents a committer controls: the desired root and the git work
/// tree that encloses it (in git mode, and in directory mode too: a checkout served as a
/// plain directory is still a repository a committer writes; issue #32).
fn committer_dirs(source: &Source) -> Vec<PathBuf> {
    let path = match source {
        Source::Dir(p) => p,
        Source::Git { path, .. } => path,
    };
    let mut dirs = Vec::new();
    let Ok(mut p) = path.canonicalize() else {
        return dirs;
    };
    dirs.push(p.clone());
    loop {
        if p.join(".git").exists() {
            if dirs.last() != Some(&p) {
                dirs.push(p);
            }
            break;
        }
        if !p.pop() {
            break;
        }
    }
    dirs
}

/// The committer-controlled directory `path` is inside, if any.
fn inside(path: &Path, dirs: &[PathBuf]) -> Option<PathBuf> {
    let real = path.canonicalize().ok()?;
    dirs.iter().find(|d| real.starts_with(d)).cloned()
}

struct State {
    signers: Arc<AllowedSigners>,
    /// Bumped whenever a reload puts different signers in force: verification outcomes cached
    /// under an older generation are not used again (`ops::approvals`).
    generation: u64,
    problem: Option<String>,
}

pub struct TrustRoot {
    path: Option<PathBuf>,
    /// The directories a committer controls, from the source at start: the file is checked
    /// against them at start and on every reload.
    committer: Vec<PathBuf>,
    state: RwLock<State>,
}

impl TrustRoot {
    /// No file: nobody can approve.
    pub fn none() -> TrustRoot {
        TrustRoot {
            path: None,
            committer: Vec::new(),
            state: RwLock::new(State {
                signers: Arc::new(approval::allowed_signers::parse("").0),
                generation: 0,
                problem: None,
            }),
        }
    }

    /// At startup: the file must be readable, free of errors and outside the desired-state
    /// directory; otherwise the server does not start.
    pub fn open(path: Option<PathBuf>, source: &Source) -> Result<TrustRoot, TrustRootError> {
        let Some(path) = path else {
            tracing::warn!("no --allowed-signers: nobody can approve plans");
            return Ok(TrustRoot::none());
        };
        let signers = approval::allowed_signers::read(&path)?;
        let committer = committer_dirs(source);
        if let Some(dir) = inside(&path, &committer) {
            return Err(TrustRootError::InsideDesired {
                path: path.clone(),
                desired: dir,
            });
        }
        tracing::info!(path = %path.display(), signers = signers.entries().len(), "allowed signers loaded");
        crate::metrics::global()
            .allowed_signers_reload_failed
            .set(0);
        Ok(TrustRoot {
            path: Some(path),
            committer,
            state: RwLock::new(State {
                signers: Arc::new(signers),
                generation: 0,
                problem: None,
            }),
        })
    }

    /// Re-read the file and return the signers in force: the new file when it is good, else the
    /// last good one (the failure is logged at ERROR, counted in the metric and kept for
    /// [`Self::problem`]).
    pub fn current(&self) -> Arc<AllowedSigners> {
        self.current_generation().0
    }

    /// [`Self::current`] with its generation: a number that changes exactly when a reload put
    /// different signers in force (re-reading an unchanged file keeps it).
    pub fn current_generation(&self) -> (Arc<AllowedSigners>, u64) {
        let Some(path) = &self.path else {
            let state = self.state.read_locked();
            return (state.signers.clone(), state.generation);
        };
        let mut state = self.state.locked();
        // Moved (or linked) into a committer's tree since start: refused like at start.
        let checked = match inside(path, &self.committer) {
            Some(dir) => Err(TrustRootError::InsideDesired {
                path: path.clone(),
                desired: dir,
            }),
            None => approval::allowed_signers::read(path).map_err(TrustRootError::from),
        };
        match checked {
            Ok(signers) => {
                if state.problem.take().is_some() {
                    tracing::info!(path = %path.display(), signers = signers.entries().len(), "allowed signers readable again; the new file is in force");
                }
                crate::metrics::global()
                    .allowed_signers_reload_failed
                    .set(0);
                if *state.signers != signers {
                    state.signers = Arc::new(signers);
                    state.generation += 1;
                }
            }
            Err(e) => {
                let text = crate::error_chain(&e);
                if state.problem.as_deref() != Some(text.as_str()) {
                    tracing::error!(error = %text, "allowed signers cannot be reloaded; the last good file stays in force");
                }
                crate::metrics::global()
                    .allowed_signers_reload_failed
                    .set(1);
                state.problem = Some(text);
            }
        }
        (state.signers.clone(), state.generation)
    }

    /// The signers in force, without re-reading the file.
    pub fn in_force(&self) -> Arc<AllowedSigners> {
        self.state.read_locked().signers.clone()
    }

    /// [`Self::in_force`] with its generation (see [`Self::current_generation`]).
    pub fn in_force_generation(&self) -> (Arc<AllowedSigners>, u64) {
        let state = self.state.read_locked();
        (state.signers.clone(), state.generation)
    }

    /// Why the file on disk is not the one in force, if it is not.
    pub fn problem(&self) -> Option<String> {
        self.state.read_locked().problem.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 32: in directory mode, a file inside the enclosing git work tree (outside the
    /// desired subdirectory) is refused at start, and a reload that finds the file there keeps
    /// the last good signers.
    #[test]
    fn directory_mode_refuses_signers_inside_the_enclosing_work_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("repo");
        let desired = repo.join("clusters");
        std::fs::create_dir_all(repo.join(".git")).unwrap();
        std::fs::create_dir_all(&desired).unwrap();
        let source = Source::Dir(desired.clone());
        let in_tree = repo.join("allowed_signers");
        std::fs::write(&in_tree, format!("alice@x {KEY}\n")).unwrap();
        let e = TrustRoot::open(Some(in_tree.clone()), &source).err();
        assert!(
            matches!(&e, Some(TrustRootError::InsideDesired { desired, .. }) if *desired == repo.canonicalize().unwrap()),
            "{e:?}"
        );
        // Outside at start, then replaced by a link into the work tree: the reload refuses it.
        let outside = tmp.path().join("etc/allowed_signers");
        std::fs::create_dir_all(outside.parent().unwrap()).unwrap();
        std::fs::write(&outside, format!("alice@x {KEY}\n")).unwrap();
        let root = TrustRoot::open(Some(outside.clone()), &source).unwrap();
        assert_eq!(root.current().entries().len(), 1);
        std::fs::write(&in_tree, format!("alice@x {KEY}\nmallory@x {KEY}\n")).unwrap();
        std::fs::remove_file(&outside).unwrap();
        std::os::unix::fs::symlink(&in_tree, &outside).unwrap();
        assert_eq!(
            root.current().entries().len(),
            1,
            "the last good file stays"
        );
        assert!(
            root.problem()
                .is_some_and(|p| p.contains("is inside the desired-state directory")),
            "{:?}",
            root.problem()
        );
    }

    /// Issue 32: credentials inside the desired tree (or its git work tree) are refused at
    /// start, existing or not yet created; the server's own directory is fine.
    #[test]
    fn a_credentials_directory_inside_the_desired_tree_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let desired = tmp.path().join("desired");
        std::fs::create_dir_all(&desired).unwrap();
        let source = Source::Dir(desired.clone());
        for inside in [desired.join("creds"), desired.join("a/b/creds")] {
            let e = check_creds_dir(&inside, &source).unwrap_err();
            assert!(
                matches!(&e, TrustRootError::CredsInsideDesired { path, .. } if *path == inside),
                "{e:?}"
            );
        }
        assert!(check_creds_dir(&tmp.path().join("state/creds"), &source).is_ok());
    }

    const KEY: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGXhJ2dFcxkUTiyW8xcwlW8u0Q2vvCfEpm+vfKBnR0CC";

    #[test]
    fn startup_refuses_a_missing_bad_or_committed_file_and_reload_keeps_the_last_good() {
        let tmp = tempfile::tempdir().unwrap();
        let desired = tmp.path().join("desired");
        std::fs::create_dir_all(&desired).unwrap();
        let source = Source::Dir(desired.clone());
        let path = tmp.path().join("allowed_signers");
        assert!(matches!(
            TrustRoot::open(Some(path.clone()), &source),
            Err(TrustRootError::Signers(
                approval::allowed_signers::SignersFileError::Resolve { .. }
            ))
        ));
        std::fs::write(&path, "alice@x ssh-ed25519 not-base64!\n").unwrap();
        assert!(matches!(
            TrustRoot::open(Some(path.clone()), &source),
            Err(TrustRootError::Signers(
                approval::allowed_signers::SignersFileError::Invalid { .. }
            ))
        ));
        let inside = desired.join("allowed_signers");
        std::fs::write(&inside, format!("alice@x {KEY}\n")).unwrap();
        assert!(matches!(
            TrustRoot::open(Some(inside), &source),
            Err(TrustRootError::InsideDesired { .. })
        ));

        std::fs::write(&path, format!("alice@x {KEY}\n")).unwrap();
        let root = TrustRoot::open(Some(path.clone()), &source).unwrap();
        assert_eq!(root.current().entries().len(), 1);
        assert_eq!(root.problem(), None);
        // A broken edit after start: the last good file stays in force, the problem shows.
        std::fs::write(&path, "garbage\n").unwrap();
        assert_eq!(root.current().entries().len(), 1);
        assert!(root.problem().is_some_and(|p| p.contains("has errors")));
        assert_eq!(
            crate::metrics::global().allowed_signers_reload_failed.get(),
            1
        );
        std::fs::remove_file(&path).unwrap();
        assert_eq!(root.current().entries().len(), 1);
        assert!(root.problem().is_some_and(|p| p.contains("cannot read")));
        // Fixed: the new file is in force.
        std::fs::write(&path, format!("alice@x {KEY}\nbob@x {KEY}\n")).unwrap();
        assert_eq!(root.current().entries().len(), 2);
        assert_eq!(root.problem(), None);
        assert_eq!(
            crate::metrics::global().allowed_signers_reload_failed.get(),
            0
        );
    }
}
