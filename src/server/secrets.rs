//! Private files: 0600 files inside 0700 directories. (Key material in memory is
//! `crate::secret::Secret`, reachable by that one path.)

use std::path::Path;

use crate::private_file::ExistingDir;

/// Create `dir` (and parents) 0700 (an existing directory is left as it is: never re-moded).
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    crate::private_file::private_dir(dir, ExistingDir::Keep)
        .map_err(crate::private_file::PrivateFileError::into_io)
}

/// Write `bytes` to `path` as a 0600 file (atomically: temp file + fsync + rename + directory
/// fsync) inside a 0700 parent directory: [`crate::private_file::write_private`].
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    crate::private_file::write_private(path, bytes, ExistingDir::Keep)
        .map_err(crate::private_file::PrivateFileError::into_io)
}

/// Whether a secrets file is private (no group/other bits).
pub fn is_private(path: &Path) -> std::io::Result<bool> {
    crate::private_file::is_private(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_files_are_0600_in_0700_dirs() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("a/b/token");
        write_private(&p, b"x").unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            std::fs::metadata(p.parent().unwrap())
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o700
        );
        assert!(is_private(&p).unwrap());
        write_private(&p, b"y").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"y");
    }
}
