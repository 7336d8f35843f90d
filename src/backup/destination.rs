//! Where backups go: the [`Destination`] port, the embedded local directory ([`LocalDir`],
//! 0700, files 0600) and [`destination`], which opens a cluster's named destination (local or
//! [`super::s3`]).

use super::*;

/// Where backups of one cluster go: a small port at the edge, so other destinations (object
/// storage) plug in beside the local directory. Blocking calls: run them off the async
/// runtime's workers.
pub trait Destination: Send + Sync {
    /// The destination's name, as the desired state names it.
    fn name(&self) -> &str;
    /// Begin writing `file`; it becomes visible (to [`Destination::list`]) only on
    /// [`ObjectWriter::commit`].
    fn create(&self, file: &str) -> std::io::Result<Box<dyn ObjectWriter>>;
    /// The complete files, sorted.
    fn list(&self) -> std::io::Result<Vec<String>>;
    /// Whether `file` exists, complete or begun.
    fn exists(&self, file: &str) -> std::io::Result<bool>;
    /// Read `file`.
    fn open(&self, file: &str) -> std::io::Result<Box<dyn std::io::Read + Send>>;
    /// Remove `file` and anything begun under its name; `Ok` when nothing was there.
    fn delete(&self, file: &str) -> std::io::Result<()>;
}

/// A file being written to a [`Destination`].
pub trait ObjectWriter: Write + Send {
    /// Make the file durable and visible under its name.
    fn commit(self: Box<Self>) -> std::io::Result<()>;
    /// Throw away what was written.
    fn abort(self: Box<Self>);
}

/// The embedded destination: a directory medea owns, `<state-dir>/backups/<cluster>/` (0700,
/// files 0600).
pub struct LocalDir {
    root: PathBuf,
}

impl LocalDir {
    /// The local destination of `cluster` under `state_dir`.
    pub fn new(state_dir: &Path, cluster: &str) -> LocalDir {
        LocalDir {
            root: state_dir.join("backups").join(cluster),
        }
    }
    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }
    pub(super) fn checked(&self, file: &str) -> std::io::Result<PathBuf> {
        if file.is_empty() || file.starts_with('.') || file.contains('/') || file.contains('\0') {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("`{file}` is not a backup file name"),
            ));
        }
        Ok(self.root.join(file))
    }
    fn part(&self, file: &str) -> PathBuf {
        self.root.join(format!(".{file}.part"))
    }
}

struct LocalWriter {
    file: std::io::BufWriter<std::fs::File>,
    part: PathBuf,
    dest: PathBuf,
    dir: PathBuf,
}

impl Write for LocalWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

impl ObjectWriter for LocalWriter {
    fn commit(self: Box<Self>) -> std::io::Result<()> {
        let LocalWriter {
            file,
            part,
            dest,
            dir,
        } = *self;
        let file = file.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        drop(file);
        if std::fs::symlink_metadata(&dest).is_ok() {
            let _ = std::fs::remove_file(&part);
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("`{}` already exists", dest.display()),
            ));
        }
        std::fs::rename(&part, &dest)?;
        crate::private_file::sync_dir(&dir)
    }
    fn abort(self: Box<Self>) {
        let part = self.part.clone();
        drop(self);
        let _ = std::fs::remove_file(part);
    }
}

impl Destination for LocalDir {
    fn name(&self) -> &str {
        LOCAL
    }
    fn create(&self, file: &str) -> std::io::Result<Box<dyn ObjectWriter>> {
        let dest = self.checked(file)?;
        crate::private_file::private_dir(&self.root, crate::private_file::ExistingDir::Keep)
            .map_err(crate::private_file::PrivateFileError::into_io)?;
        let part = self.part(file);
        let f = crate::private_file::open_private(&part)?;
        Ok(Box::new(LocalWriter {
            file: std::io::BufWriter::with_capacity(256 * 1024, f),
            part,
            dest,
            dir: self.root.clone(),
        }))
    }
    fn list(&self) -> std::io::Result<Vec<String>> {
        let mut out = Vec::new();
        let entries = match std::fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e),
        };
        for e in entries {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with('.') && e.file_type()?.is_file() {
                out.push(name);
            }
        }
        out.sort();
        Ok(out)
    }
    fn exists(&self, file: &str) -> std::io::Result<bool> {
        let dest = self.checked(file)?;
        Ok(std::fs::symlink_metadata(dest).is_ok()
            || std::fs::symlink_metadata(self.part(file)).is_ok())
    }
    fn open(&self, file: &str) -> std::io::Result<Box<dyn std::io::Read + Send>> {
        let dest = self.checked(file)?;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(dest)?;
        Ok(Box::new(f))
    }
    fn delete(&self, file: &str) -> std::io::Result<()> {
        let dest = self.checked(file)?;
        let mut removed = false;
        for p in [dest, self.part(file)] {
            match std::fs::remove_file(&p) {
                Ok(()) => removed = true,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        if removed {
            crate::private_file::sync_dir(&self.root)?;
        }
        Ok(())
    }
}

/// Where this server keeps what its destinations need: the local destination's files, and the
/// settings and credentials of its other destinations.
#[derive(Debug, Clone)]
pub struct Dirs {
    /// `--state-dir`: the `local` destination is `<state-dir>/backups/<cluster>/`.
    pub state_dir: PathBuf,
    /// `--creds-dir`: destination `<name>` of a cluster is set up by
    /// `<creds-dir>/<cluster>/backup-destinations/<name>/` (see [`crate::backup::s3`]).
    /// `None`: only `local`.
    pub creds_dir: Option<PathBuf>,
}

impl Dirs {
    /// Only the `local` destination, under `state_dir`.
    pub fn local(state_dir: &Path) -> Dirs {
        Dirs {
            state_dir: state_dir.to_path_buf(),
            creds_dir: None,
        }
    }
}

/// The destination `name` of `cluster`, as this server maps names: `local` is
/// `<state-dir>/backups/<cluster>/`; another name is the S3-compatible destination set up in
/// `<creds-dir>/<cluster>/backup-destinations/<name>/` (files the server owns, never the
/// repository).
pub fn destination(
    dirs: &Dirs,
    cluster: &str,
    name: &str,
) -> Result<Box<dyn Destination>, BackupError> {
    if name == LOCAL {
        return Ok(Box::new(LocalDir::new(&dirs.state_dir, cluster)));
    }
    let unknown = || BackupError::UnknownDestination {
        cluster: cluster.to_string(),
        destination: name.to_string(),
    };
    let Some(creds) = &dirs.creds_dir else {
        return Err(unknown());
    };
    if !crate::desired::validate::is_dns_label(name)
        || !crate::desired::validate::is_dns_label(cluster)
    {
        return Err(unknown());
    }
    let dir = crate::backup::s3::destination_dir(creds, cluster, name);
    let config_err = |err| BackupError::DestinationConfig {
        cluster: cluster.to_string(),
        destination: name.to_string(),
        err: Box::new(err),
    };
    match crate::backup::s3::S3Config::load(&dir).map_err(config_err)? {
        None => Err(unknown()),
        Some((config, credentials)) => Ok(Box::new(
            crate::backup::s3::S3::new(name, cluster, config, credentials).map_err(config_err)?,
        )),
    }
}
