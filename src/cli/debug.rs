//! Hidden commands used by the test suite to exercise crash safety in a real child process.

use miette::IntoDiagnostic as _;
use std::io::Write;
use std::path::PathBuf;

use clap::Args;

use crate::store::{Store, Table, Txn};

#[derive(Debug, Args)]
pub struct TortureArgs {
    #[arg(long)]
    pub store: PathBuf,
    /// Keys written by every batch.
    #[arg(long, default_value_t = 64)]
    pub keys: usize,
    /// Bytes of padding per value (makes each batch span many pages).
    #[arg(long, default_value_t = 4096)]
    pub pad: usize,
}

/// Write batches forever: batch `g` sets every key `k/<i>` to `g:<padding>`; after each
/// durable commit, print `committed <g>`. A parent kills this process at arbitrary points and
/// checks that every key holds the same generation, at least the last one printed.
pub fn store_torture(args: TortureArgs) -> miette::Result<u8> {
    let store = super::store::open_dir(&args.store, "run it again")?;
    let start: u64 = match store.get(Table::Meta, "torture/gen").into_diagnostic()? {
        Some(b) => String::from_utf8_lossy(&b).parse().unwrap_or(0),
        None => 0,
    };
    let pad = "x".repeat(args.pad);
    let mut out = std::io::stdout().lock();
    for g in start + 1.. {
        let mut txn = Txn::new().put(Table::Meta, "torture/gen", g.to_string().into_bytes());
        for i in 0..args.keys {
            txn = txn.put(
                Table::Journal,
                format!("k/{i:04}"),
                format!("{g}:{pad}").into_bytes(),
            );
        }
        store.commit(txn).into_diagnostic()?;
        writeln!(out, "committed {g}").ok();
        out.flush().ok();
    }
    Ok(0)
}
