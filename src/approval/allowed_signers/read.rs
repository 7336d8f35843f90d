//! The one reader of an allowed_signers file: the module's only I/O (its documented edge in
//! `tests/it/architecture.rs`), so that every command reads the trust root the same way.

use std::path::{Path, PathBuf};

use super::{AllowedSigners, MAX_FILE_BYTES, SignersDiagnostic, parse_file};

/// Why an allowed_signers file cannot be the trust root.
#[derive(Debug, thiserror::Error)]
pub enum SignersFileError {
    /// The path could not be resolved (it or a link it follows is missing or unreadable).
    #[error("cannot read the allowed signers file `{}`", path.display())]
    Resolve {
        /// The file as configured.
        path: PathBuf,
        /// What resolving it failed with.
        #[source]
        err: std::io::Error,
    },
    /// The file could not be read within its bounds (not a regular file, too large, I/O).
    #[error("cannot read the allowed signers file `{}`", path.display())]
    Read {
        /// The file as configured.
        path: PathBuf,
        /// What the bounded read failed with.
        #[source]
        err: crate::private_file::BoundedReadError,
    },
    /// The file is not UTF-8 text.
    #[error("the allowed signers file `{}` is not UTF-8 text (at byte {at})", path.display())]
    NotUtf8 {
        /// The file as configured.
        path: PathBuf,
        /// The byte offset of the first invalid UTF-8 sequence.
        at: usize,
    },
    /// At least one line is invalid: the file is refused whole.
    #[error(
        "the allowed signers file `{}` has errors (a trust root is used whole or not at all):\n{}",
        path.display(),
        diagnostics.iter().map(|d| format!("  {}", d.located(path))).collect::<Vec<_>>().join("\n")
    )]
    Invalid {
        /// The file as configured.
        path: PathBuf,
        /// Every bad line, with its line and column.
        diagnostics: Vec<SignersDiagnostic>,
    },
}

/// Read the allowed_signers file at `path` and parse it with [`parse_file`]'s policy (any bad
/// line refuses the file). The operator's own links are followed (a configuration-managed
/// `/etc` often is one), then the file they lead to is read as
/// [`crate::private_file::read_bounded`] reads what configuration names: a regular file (a
/// directory, FIFO or device is refused before a byte is read), at most [`MAX_FILE_BYTES`].
pub fn read(path: &Path) -> Result<AllowedSigners, SignersFileError> {
    let real = path
        .canonicalize()
        .map_err(|err| SignersFileError::Resolve {
            path: path.to_path_buf(),
            err,
        })?;
    let bytes =
        crate::private_file::read_bounded(&real, MAX_FILE_BYTES, crate::private_file::Privacy::Any)
            .map_err(|err| SignersFileError::Read {
                path: path.to_path_buf(),
                err,
            })?;
    let text = String::from_utf8(bytes).map_err(|e| SignersFileError::NotUtf8 {
        path: path.to_path_buf(),
        at: e.utf8_error().valid_up_to(),
    })?;
    parse_file(path, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGXhJ2dFcxkUTiyW8xcwlW8u0Q2vvCfEpm+vfKBnR0CC";

    /// Issue 34: the one reader follows the operator's links, and refuses what is not a
    /// regular file or is larger than the cap before reading it whole; every bad line is
    /// listed as `path:line:col: message`.
    #[test]
    fn reads_a_linked_file_and_refuses_directories_huge_files_and_bad_lines() {
        let tmp = tempfile::tempdir().unwrap();
        let good = tmp.path().join("allowed_signers");
        std::fs::write(&good, format!("alice@x {KEY}\n")).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        assert_eq!(read(&link).unwrap().entries().len(), 1);

        let e = read(tmp.path()).unwrap_err();
        assert!(
            matches!(
                &e,
                SignersFileError::Read {
                    err: crate::private_file::BoundedReadError::NotRegular { .. },
                    ..
                }
            ),
            "{e:?}"
        );
        let huge = tmp.path().join("huge");
        std::fs::write(&huge, vec![b'#'; MAX_FILE_BYTES as usize + 1]).unwrap();
        let e = read(&huge).unwrap_err();
        assert!(
            matches!(
                &e,
                SignersFileError::Read {
                    err: crate::private_file::BoundedReadError::TooLarge { .. },
                    ..
                }
            ),
            "{e:?}"
        );
        let bad = tmp.path().join("bad");
        std::fs::write(
            &bad,
            format!("alice@x {KEY}\nbob@x cert-authority {KEY}\ngarbage\n"),
        )
        .unwrap();
        let e = read(&bad).unwrap_err();
        let text = e.to_string();
        let p = bad.display();
        assert!(
            text.contains(&format!("\n  {p}:2:7: `cert-authority` is not supported")),
            "{text}"
        );
        assert!(text.contains(&format!("\n  {p}:3:")), "{text}");
        assert!(
            matches!(&e, SignersFileError::Invalid { diagnostics, .. } if diagnostics.len() == 2)
        );
    }
}
