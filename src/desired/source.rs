//! Reading a revision: a directory tree or a git commit. The one I/O edge of `desired`.
//!
//! Directory mode reads `*.yaml`/`*.yml` below the root (hidden entries and `approvals/` are
//! skipped) and `approvals/**/*.sig` as approval markers. Git mode reads the same paths from the
//! committed tree at a ref with gix; the work tree, the index and uncommitted edits are ignored.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::model::Revision;
use super::parse::MAX_FILE_BYTES;

/// Where the desired state comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Dir(PathBuf),
    Git { path: PathBuf, reference: String },
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Dir(p) => write!(f, "{}", p.display()),
            Source::Git { path, reference } => write!(f, "{} at {reference}", path.display()),
        }
    }
}

/// One file of a revision, path relative to the desired root with `/` separators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    pub path: String,
    pub bytes: Vec<u8>,
}

/// A candidate approval marker (`approvals/**/*.sig`), verified by `approval`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkerFile {
    pub path: String,
    pub contents: Vec<u8>,
}

/// Everything read from one revision, before parsing.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub files: Vec<SourceFile>,
    pub markers: Vec<MarkerFile>,
    pub commit: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("desired-state directory `{path}` does not exist or is not a directory")]
    NotADir { path: PathBuf },
    #[error("failed to read `{path}`")]
    Read {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("`{path}` is not inside a git repository")]
    NotARepo {
        path: PathBuf,
        #[source]
        err: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("git ref `{reference}` not found in `{path}`")]
    RefNotFound {
        path: PathBuf,
        reference: String,
        #[source]
        err: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("failed to read the git tree of `{reference}` in `{path}`")]
    Git {
        path: PathBuf,
        reference: String,
        #[source]
        err: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// A path with an empty, hidden (`.x`) or parent (`..`) segment is never read.
fn ordinary(rel: &str) -> bool {
    rel.split('/')
        .all(|seg| !seg.is_empty() && !seg.starts_with('.'))
}

pub fn is_resource_path(rel: &str) -> bool {
    let hidden = !ordinary(rel);
    !hidden && !rel.starts_with("approvals/") && (rel.ends_with(".yaml") || rel.ends_with(".yml"))
}

/// Approval marker candidates: `approvals/**/*.sig` (verified by `approval`).
pub fn is_marker_path(rel: &str) -> bool {
    let hidden = !ordinary(rel);
    !hidden && rel.starts_with("approvals/") && rel.ends_with(".sig")
}

/// The content revision: sha256 over the sorted resource files (never the markers).
pub fn content_hash(files: &[SourceFile]) -> String {
    let mut sorted: Vec<&SourceFile> = files.iter().collect();
    sorted.sort_by(|a, b| a.path.cmp(&b.path));
    let mut h = Sha256::new();
    h.update(b"medea-desired-v1\0");
    for f in sorted {
        h.update((f.path.len() as u64).to_le_bytes());
        h.update(f.path.as_bytes());
        h.update((f.bytes.len() as u64).to_le_bytes());
        h.update(&f.bytes);
    }
    hex::encode(h.finalize())
}

pub fn revision_of(snapshot: &Snapshot) -> Revision {
    Revision {
        content: content_hash(&snapshot.files),
        commit: snapshot.commit.clone(),
    }
}

/// Read a revision.
pub fn read(source: &Source) -> Result<Snapshot, SourceError> {
    match source {
        Source::Dir(root) => read_dir(root),
        Source::Git { path, reference } => read_git(path, reference),
    }
}

fn read_dir(root: &Path) -> Result<Snapshot, SourceError> {
    if !root.is_dir() {
        return Err(SourceError::NotADir {
            path: root.to_path_buf(),
        });
    }
    let mut files = Vec::new();
    let mut markers = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|err| SourceError::Read {
            path: dir.clone(),
            err,
        })?;
        for entry in entries {
            let entry = entry.map_err(|err| SourceError::Read {
                path: dir.clone(),
                err,
            })?;
            let path = entry.path();
            let name = entry.file_name();
            if name.to_string_lossy().starts_with('.') {
                continue;
            }
            // Directories are followed only when they are real directories (no symlink loops).
            let ft = entry.file_type().map_err(|err| SourceError::Read {
                path: path.clone(),
                err,
            })?;
            if ft.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = rel_path(root, &path);
            let wanted = is_resource_path(&rel) || is_marker_path(&rel);
            if !wanted || !path.is_file() {
                continue;
            }
            let bytes = read_limited(&path)?;
            if is_marker_path(&rel) {
                markers.push(MarkerFile {
                    path: rel,
                    contents: bytes,
                });
            } else {
                files.push(SourceFile { path: rel, bytes });
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    markers.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(Snapshot {
        files,
        markers,
        commit: None,
    })
}

fn read_limited(path: &Path) -> Result<Vec<u8>, SourceError> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|err| SourceError::Read {
        path: path.to_path_buf(),
        err,
    })?;
    let mut buf = Vec::new();
    // One byte over the limit is enough to report the file as too large.
    f.take(MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|err| SourceError::Read {
            path: path.to_path_buf(),
            err,
        })?;
    Ok(buf)
}

fn rel_path(root: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(root).unwrap_or(path);
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

fn read_git(path: &Path, reference: &str) -> Result<Snapshot, SourceError> {
    let git_err = |err: Box<dyn std::error::Error + Send + Sync>| SourceError::Git {
        path: path.to_path_buf(),
        reference: reference.to_string(),
        err,
    };
    let repo = gix::discover(path).map_err(|err| SourceError::NotARepo {
        path: path.to_path_buf(),
        err: Box::new(err),
    })?;
    // The desired root may be a subdirectory of the repository.
    let prefix = match repo.workdir() {
        Some(wd) => {
            let wd = wd.canonicalize().map_err(|err| SourceError::Read {
                path: wd.to_path_buf(),
                err,
            })?;
            let here = path.canonicalize().map_err(|err| SourceError::Read {
                path: path.to_path_buf(),
                err,
            })?;
            let rel = rel_path(&wd, &here);
            if rel.is_empty() {
                String::new()
            } else {
                format!("{rel}/")
            }
        }
        None => String::new(),
    };
    let id = repo
        .rev_parse_single(reference)
        .map_err(|err| SourceError::RefNotFound {
            path: path.to_path_buf(),
            reference: reference.to_string(),
            err: Box::new(err),
        })?;
    let commit = id
        .object()
        .map_err(|e| git_err(Box::new(e)))?
        .peel_to_commit()
        .map_err(|e| git_err(Box::new(e)))?;
    let sha = commit.id.to_string();
    let tree = commit.tree().map_err(|e| git_err(Box::new(e)))?;
    let mut recorder = gix::traverse::tree::Recorder::default();
    tree.traverse()
        .breadthfirst(&mut recorder)
        .map_err(|e| git_err(Box::new(e)))?;
    let mut files = Vec::new();
    let mut markers = Vec::new();
    for entry in recorder.records {
        if !entry.mode.is_blob() {
            continue;
        }
        let full = entry.filepath.to_string();
        let Some(rel) = full.strip_prefix(&prefix) else {
            continue;
        };
        let (resource, marker) = (is_resource_path(rel), is_marker_path(rel));
        if !resource && !marker {
            continue;
        }
        let obj = repo
            .find_object(entry.oid)
            .map_err(|e| git_err(Box::new(e)))?;
        let mut bytes = obj.data.clone();
        bytes.truncate(MAX_FILE_BYTES + 1);
        if marker {
            markers.push(MarkerFile {
                path: rel.to_string(),
                contents: bytes,
            });
        } else {
            files.push(SourceFile {
                path: rel.to_string(),
                bytes,
            });
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    markers.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(Snapshot {
        files,
        markers,
        commit: Some(sha),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_paths_are_read() {
        for yes in ["approvals/abc-alice@x.sig", "approvals/team/2025/a.sig"] {
            assert!(is_marker_path(yes), "{yes}");
            assert!(!is_resource_path(yes), "{yes}");
        }
        for no in [
            "approvals/a.txt",
            "approvals/.sig",
            "approvals/x/.sig",
            "approvals/../a.sig",
            "other/approvals/a.sig",
            "approvals//a.sig",
            "approvals.sig",
        ] {
            assert!(!is_marker_path(no), "{no}");
        }
        assert!(is_resource_path("home/cluster.yaml"));
        assert!(is_resource_path("a.yml"));
        for no in [
            ".github/x.yaml",
            "approvals/x.yaml",
            "home/.hidden.yaml",
            "notes.txt",
            "a//b.yaml",
        ] {
            assert!(!is_resource_path(no), "{no}");
        }
    }
}
