//! Opening the store from a command: one helper, so every command that finds the store
//! directory held by another medea process (a running `medea serve`) says so in the same
//! words, with what to do.

use std::path::Path;

use crate::store::StoreError;
use crate::store::fjall::FjallStore;

/// Open the store directory `path` for a command. When another medea process holds it, the
/// error is the store's own ("the store at `…` is locked by another medea process") with the
/// help "stop `medea serve` (it holds the store while it runs) and {then}"; any other error
/// keeps its source chain.
pub fn open_dir(path: &Path, then: &str) -> miette::Result<FjallStore> {
    FjallStore::open(path).map_err(|e| match e {
        StoreError::Locked { .. } => miette::miette!(
            help = format!("stop `medea serve` (it holds the store while it runs) and {then}"),
            "{e}"
        ),
        other => miette::Report::from_err(other),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_store_is_refused_in_one_message_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let _held = FjallStore::open(dir.path()).unwrap();
        let Err(err) = open_dir(dir.path(), "plan again") else {
            panic!("a store another process holds was opened");
        };
        assert_eq!(
            err.to_string(),
            format!(
                "the store at `{}` is locked by another medea process",
                dir.path().display()
            )
        );
        let help = err.help().map(|h| h.to_string()).unwrap_or_default();
        assert_eq!(
            help,
            "stop `medea serve` (it holds the store while it runs) and plan again"
        );
    }
}
