//! The store: durability, atomicity, locking, versioning.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::Arc;

use medea::store::fjall::{FORMAT_VERSION, FjallStore};
use medea::store::{Check, Record, Store, StoreError, StoreExt, Table, Txn};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Note {
    text: String,
}

impl Record for Note {
    const TABLE: Table = Table::Desired;
    const KIND: &'static str = "test-note";
    const SCHEMA: u32 = 2;
    fn upgrade(schema: u32, data: serde_json::Value) -> Result<serde_json::Value, String> {
        // schema 1 called the field `body`
        match schema {
            1 => Ok(serde_json::json!({ "text": data["body"] })),
            other => Err(format!("unknown schema {other}")),
        }
    }
}

#[test]
fn records_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    {
        let s = FjallStore::open(&path).unwrap();
        s.commit(
            Txn::new()
                .put_record("a", &Note { text: "one".into() })
                .put_record("b", &Note { text: "two".into() }),
        )
        .unwrap();
    }
    let s = FjallStore::open(&path).unwrap();
    assert_eq!(
        s.get_record::<Note>("a").unwrap(),
        Some(Note { text: "one".into() })
    );
    let all = s.scan_records::<Note>("").unwrap();
    assert_eq!(
        all.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
}

#[test]
fn store_directory_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/store");
    let _s = FjallStore::open(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
}

#[test]
fn failed_check_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = FjallStore::open(dir.path()).unwrap();
    s.commit(Txn::new().put(Table::Plans, "current", b"p1".to_vec()))
        .unwrap();
    let err = s
        .commit(
            Txn::new()
                .check(Check::Equals(
                    Table::Plans,
                    "current".into(),
                    b"p0".to_vec(),
                ))
                .put(Table::Plans, "current", b"p2".to_vec())
                .put(Table::Jobs, "j1", b"job".to_vec()),
        )
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Conflict { table: "plans", .. }),
        "{err}"
    );
    assert_eq!(
        s.get(Table::Plans, "current").unwrap(),
        Some(b"p1".to_vec())
    );
    assert_eq!(s.get(Table::Jobs, "j1").unwrap(), None);
    // Absent check
    let err = s
        .commit(Txn::new().check(Check::Absent(Table::Plans, "current".into())))
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }));
    s.commit(
        Txn::new()
            .check(Check::Equals(
                Table::Plans,
                "current".into(),
                b"p1".to_vec(),
            ))
            .check(Check::Absent(Table::Jobs, "j1".into()))
            .put(Table::Plans, "current", b"p2".to_vec())
            .put(Table::Jobs, "j1", b"job".to_vec()),
    )
    .unwrap();
    assert_eq!(s.get(Table::Jobs, "j1").unwrap(), Some(b"job".to_vec()));
}

#[test]
fn a_second_open_is_refused_while_the_first_is_live() {
    let dir = tempfile::tempdir().unwrap();
    let first = FjallStore::open(dir.path()).unwrap();
    let err = FjallStore::open(dir.path()).unwrap_err();
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
    assert!(err.to_string().contains("in use by another medea process"));
    drop(first);
    FjallStore::open(dir.path()).unwrap();
}

#[test]
fn a_second_process_cannot_open_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let _held = FjallStore::open(dir.path()).unwrap();
    let out = crate::cli::medea()
        .args(["__store-torture", "--store"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use by another medea process"), "{err}");
}

#[test]
fn newer_store_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = FjallStore::open(dir.path()).unwrap();
        s.commit(Txn::new().put(
            Table::Meta,
            "store-format",
            (FORMAT_VERSION + 1).to_string().into_bytes(),
        ))
        .unwrap();
    }
    let err = FjallStore::open(dir.path()).unwrap_err();
    assert!(
        matches!(err, StoreError::NewerFormat { found, .. } if found == FORMAT_VERSION + 1),
        "{err}"
    );
    assert!(err.to_string().contains("written by a newer medea"));
}

#[test]
fn records_are_versioned() {
    let dir = tempfile::tempdir().unwrap();
    let s = FjallStore::open(dir.path()).unwrap();
    s.commit(
        Txn::new()
            .put(
                Table::Desired,
                "old",
                br#"{"kind":"test-note","schema":1,"data":{"body":"hi"}}"#.to_vec(),
            )
            .put(
                Table::Desired,
                "new",
                br#"{"kind":"test-note","schema":3,"data":{"text":"hi"}}"#.to_vec(),
            )
            .put(
                Table::Desired,
                "other",
                br#"{"kind":"plan","schema":1,"data":{}}"#.to_vec(),
            ),
    )
    .unwrap();
    assert_eq!(
        s.get_record::<Note>("old").unwrap(),
        Some(Note { text: "hi".into() })
    );
    let err = s.get_record::<Note>("new").unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::NewerRecord {
                found: 3,
                supported: 2,
                ..
            }
        ),
        "{err}"
    );
    let err = s.get_record::<Note>("other").unwrap_err();
    assert!(matches!(err, StoreError::Decode { .. }), "{err}");
}

#[test]
fn concurrent_readers_see_whole_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(FjallStore::open(dir.path()).unwrap());
    let writer = {
        let s = s.clone();
        std::thread::spawn(move || {
            for g in 0..200u32 {
                let mut t = Txn::new().buffered();
                for i in 0..8 {
                    t = t.put(
                        Table::Inventory,
                        format!("m/{i}"),
                        g.to_string().into_bytes(),
                    );
                }
                s.commit(t).unwrap();
            }
        })
    };
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut torn = 0;
                for _ in 0..300 {
                    let rows = s.scan(Table::Inventory, "m/").unwrap();
                    let gens: std::collections::BTreeSet<_> =
                        rows.iter().map(|(_, v)| v.clone()).collect();
                    if gens.len() > 1 {
                        torn += 1;
                    }
                }
                torn
            })
        })
        .collect();
    writer.join().unwrap();
    for r in readers {
        assert_eq!(
            r.join().unwrap(),
            0,
            "a scan saw a half-applied transaction"
        );
    }
    let rows = s.scan(Table::Inventory, "m/").unwrap();
    assert!(rows.iter().all(|(_, v)| v == b"199"));
}

/// Kill a child mid-batch many times: every batch is all-or-nothing and every reported
/// (durably committed) batch survives.
#[test]
fn killed_mid_batch_transactions_are_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    // Kill after a varying number of reported commits, so the kill lands at different points.
    for (round, after) in [1u64, 3, 2, 5, 1, 4].into_iter().enumerate() {
        let mut child = crate::cli::medea()
            .args([
                "__store-torture",
                "--keys",
                "64",
                "--pad",
                "2048",
                "--store",
            ])
            .arg(&path)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut last = 0u64;
        let mut seen = 0;
        while seen < after {
            let line = lines.next().expect("child exited early").unwrap();
            last = line.strip_prefix("committed ").unwrap().parse().unwrap();
            seen += 1;
        }
        child.kill().unwrap(); // SIGKILL, while it is writing the next batch
        child.wait().unwrap();

        let s = FjallStore::open(&path).unwrap();
        let gen_key: u64 = String::from_utf8(s.get(Table::Meta, "torture/gen").unwrap().unwrap())
            .unwrap()
            .parse()
            .unwrap();
        let rows = s.scan(Table::Journal, "k/").unwrap();
        assert_eq!(
            rows.len(),
            64,
            "round {round}: a batch was partially applied"
        );
        for (k, v) in &rows {
            let g: u64 = String::from_utf8_lossy(v)
                .split(':')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(g, gen_key, "round {round}: key {k} is from another batch");
        }
        assert!(
            gen_key >= last,
            "round {round}: committed batch {last} was lost (found {gen_key})"
        );
    }
}
