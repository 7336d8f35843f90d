//! The store: durability, atomicity, locking, versioning.
//!
//! The backend-independent cases are plain functions over a store opener, run against both
//! backends by `both_backends!` (`store::on_fjall::…` and `store::on_etcd::…`, the latter against
//! a real etcd server). fjall-only properties (process lock, directory mode, kill mid-batch,
//! newer directory format) and etcd-only ones (same bytes as fjall, one etcd transaction per
//! commit, TLS, unreachable endpoints) are tested separately below.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::Arc;

use medea::store::fjall::{FORMAT_VERSION, FjallStore};
use medea::store::{Check, Fence, Record, Store, StoreError, StoreExt, Table, Txn};
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

/// Opens the store under test; calling it again reopens the same store (after the previous
/// handle was dropped).
type Open<'a> = &'a dyn Fn() -> Box<dyn Store>;

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod on_fjall {
            $(
                #[test]
                fn $name() {
                    let dir = tempfile::tempdir().unwrap();
                    let path = dir.path().join("store");
                    let open = || -> Box<dyn medea::store::Store> {
                        Box::new(medea::store::fjall::FjallStore::open(&path).unwrap())
                    };
                    super::$name(&open);
                }
            )*
        }
        #[cfg(feature = "etcd")]
        mod on_etcd {
            $(
                #[test]
                fn $name() {
                    let Some(etcd) = crate::etcd_harness::Etcd::shared() else { return };
                    let prefix = crate::etcd_harness::unique_prefix(stringify!($name));
                    let open = || -> Box<dyn medea::store::Store> { Box::new(etcd.store(&prefix)) };
                    super::$name(&open);
                }
            )*
        }
    };
}

both_backends!(
    records_survive_reopen,
    failed_check_changes_nothing,
    a_stale_fence_changes_nothing,
    records_are_versioned,
    concurrent_readers_see_whole_transactions,
    tables_and_prefixes_are_isolated,
    deletes_and_the_last_op_per_key_wins,
    large_scans_are_complete_and_ordered,
);

fn records_survive_reopen(open: Open) {
    {
        let s = open();
        s.commit(
            Txn::new()
                .put_record("a", &Note { text: "one".into() })
                .put_record("b", &Note { text: "two".into() }),
        )
        .unwrap();
    }
    let s = open();
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

fn failed_check_changes_nothing(open: Open) {
    let s = open();
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
        matches!(&err, StoreError::Conflict { table: "plans", key } if key == "current"),
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
    // Equals on a missing key fails, even for an empty value.
    let err = s
        .commit(
            Txn::new()
                .check(Check::Equals(Table::Jobs, "missing".into(), Vec::new()))
                .put(Table::Jobs, "j1", b"job".to_vec()),
        )
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Conflict { table: "jobs", key } if key == "missing"),
        "{err}"
    );
    // The second of two checks fails: the error names it.
    let err = s
        .commit(
            Txn::new()
                .check(Check::Absent(Table::Jobs, "j1".into()))
                .check(Check::Absent(Table::Plans, "current".into()))
                .put(Table::Jobs, "j1", b"job".to_vec()),
        )
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Conflict { table: "plans", .. }),
        "{err}"
    );
    assert_eq!(s.get(Table::Jobs, "j1").unwrap(), None);
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

/// A fence of a term that is not the store's current one writes nothing, and says so.
fn a_stale_fence_changes_nothing(open: Open) {
    let s = open();
    let stale = Fence::new("ghost", 987_654_321);
    let err = s
        .commit(
            Txn::new()
                .fenced(&stale)
                .put(Table::Jobs, "j1", b"job".to_vec()),
        )
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Fenced { replica, term: 987_654_321 } if replica == "ghost"),
        "{err}"
    );
    assert!(err.is_leadership_lost());
    assert_eq!(s.get(Table::Jobs, "j1").unwrap(), None);
    // Leadership failures are reported before data conflicts: they mean "stop".
    let err = s
        .commit(
            Txn::new()
                .check(Check::Equals(Table::Jobs, "nope".into(), b"x".to_vec()))
                .fenced(&stale)
                .put(Table::Jobs, "j1", b"job".to_vec()),
        )
        .unwrap_err();
    assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
}

fn records_are_versioned(open: Open) {
    let s = open();
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

fn concurrent_readers_see_whole_transactions(open: Open) {
    let s: Arc<dyn Store> = Arc::from(open());
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
    assert_eq!(rows.len(), 8);
    assert!(rows.iter().all(|(_, v)| v == b"199"));
}

fn tables_and_prefixes_are_isolated(open: Open) {
    let s = open();
    s.commit(
        Txn::new()
            .put(Table::Desired, "a/1", b"d1".to_vec())
            .put(Table::Desired, "ab", b"d2".to_vec())
            .put(Table::Desired, "b", b"d3".to_vec())
            .put(Table::Inventory, "a/2", b"i1".to_vec()),
    )
    .unwrap();
    let keys =
        |t, p| -> Vec<String> { s.scan(t, p).unwrap().into_iter().map(|(k, _)| k).collect() };
    assert_eq!(keys(Table::Desired, "a/"), ["a/1"]);
    assert_eq!(keys(Table::Desired, "a"), ["a/1", "ab"]);
    assert_eq!(keys(Table::Desired, ""), ["a/1", "ab", "b"]);
    assert_eq!(keys(Table::Inventory, ""), ["a/2"]);
    assert_eq!(keys(Table::Jobs, ""), Vec::<String>::new());
    assert_eq!(s.get(Table::Inventory, "a/1").unwrap(), None);
    assert_eq!(s.get(Table::Desired, "a/1").unwrap(), Some(b"d1".to_vec()));
}

fn deletes_and_the_last_op_per_key_wins(open: Open) {
    let s = open();
    s.commit(
        Txn::new()
            .put(Table::Jobs, "a", b"0".to_vec())
            .put(Table::Jobs, "b", b"0".to_vec()),
    )
    .unwrap();
    s.commit(
        Txn::new()
            .put(Table::Jobs, "a", b"1".to_vec())
            .delete(Table::Jobs, "a")
            .put(Table::Jobs, "a", b"2".to_vec())
            .put(Table::Jobs, "b", b"1".to_vec())
            .delete(Table::Jobs, "b")
            .delete(Table::Jobs, "never-existed"),
    )
    .unwrap();
    assert_eq!(s.get(Table::Jobs, "a").unwrap(), Some(b"2".to_vec()));
    assert_eq!(s.get(Table::Jobs, "b").unwrap(), None);
    // A deleted key is absent again for checks.
    s.commit(
        Txn::new()
            .check(Check::Absent(Table::Jobs, "b".into()))
            .put(Table::Jobs, "b", b"again".to_vec()),
    )
    .unwrap();
    assert_eq!(s.get(Table::Jobs, "b").unwrap(), Some(b"again".to_vec()));
}

/// More keys than one etcd range page, with values big enough to matter.
fn large_scans_are_complete_and_ordered(open: Open) {
    let s = open();
    let value = |i: usize| format!("{i:05}:{}", "v".repeat(2000)).into_bytes();
    for batch in 0..7 {
        let mut t = Txn::new();
        for i in batch * 100..(batch + 1) * 100 {
            t = t.put(Table::Journal, format!("job/{i:05}"), value(i));
        }
        s.commit(t).unwrap();
    }
    let rows = s.scan(Table::Journal, "job/").unwrap();
    assert_eq!(rows.len(), 700);
    for (i, (k, v)) in rows.iter().enumerate() {
        assert_eq!(k, &format!("job/{i:05}"));
        assert_eq!(v, &value(i), "value of {k}");
    }
}

// ---- fjall only ----

#[test]
fn fjall_accepts_its_solo_fence_only() {
    let dir = tempfile::tempdir().unwrap();
    let s = FjallStore::open(dir.path()).unwrap();
    let solo = medea::store::Leadership::solo("here");
    let fenced = medea::store::FencedStore::new(Arc::new(s), solo.clone());
    fenced
        .commit(Txn::new().put(Table::Jobs, "j", b"1".to_vec()))
        .unwrap();
    assert_eq!(fenced.get(Table::Jobs, "j").unwrap(), Some(b"1".to_vec()));
    let err = fenced
        .commit(
            Txn::new()
                .fenced(&Fence::new("here", 5))
                .put(Table::Jobs, "j", b"2".to_vec()),
        )
        .unwrap_err();
    assert!(matches!(err, StoreError::Fenced { term: 5, .. }), "{err}");
    assert_eq!(fenced.get(Table::Jobs, "j").unwrap(), Some(b"1".to_vec()));
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
fn a_second_open_is_refused_while_the_first_is_live() {
    let dir = tempfile::tempdir().unwrap();
    let first = FjallStore::open(dir.path()).unwrap();
    let err = FjallStore::open(dir.path()).unwrap_err();
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
    assert!(err.to_string().contains("locked by another medea process"));
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
    assert!(err.contains("locked by another medea process"), "{err}");
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

/// Under CI the suite must run the etcd backend too: a build without the feature would
/// silently drop every etcd and HA test.
#[cfg(not(feature = "etcd"))]
#[test]
fn ci_builds_the_etcd_backend() {
    assert!(
        std::env::var_os("CI").is_none_or(|v| v.is_empty()),
        "CI must run `cargo test --locked --all-features`: without the `etcd` feature the etcd \
         store and HA failover tests are not compiled"
    );
}

// ---- etcd only ----

#[cfg(feature = "etcd")]
mod etcd_only {
    use std::time::{Duration, Instant};

    use medea::store::etcd::{EtcdConfig, EtcdStore, EtcdTls};
    use medea::store::record::encode;
    use medea::store::{Store, StoreError, StoreExt, Table, Txn};

    use super::Note;
    use crate::etcd_harness::{Etcd, TlsFiles, unique_prefix};

    /// etcd holds exactly the bytes fjall holds, under `<prefix>/<table>/<key>`, and a
    /// multi-key commit is one etcd revision.
    #[test]
    fn values_are_the_fjall_bytes_and_a_commit_is_one_revision() {
        let Some(etcd) = Etcd::shared() else { return };
        let prefix = unique_prefix("bytes");
        let s = etcd.store(&prefix);
        let note = Note {
            text: "same bytes".into(),
        };
        s.commit(
            Txn::new()
                .put_record("a", &note)
                .put(Table::Jobs, "j/1", b"x".to_vec())
                .put(Table::Journal, "j/1/0001", b"y".to_vec()),
        )
        .unwrap();

        let dir = tempfile::tempdir().unwrap();
        let f = medea::store::fjall::FjallStore::open(dir.path()).unwrap();
        f.commit(Txn::new().put_record("a", &note)).unwrap();
        let fjall_bytes = f.get(Table::Desired, "a").unwrap().unwrap();
        assert_eq!(fjall_bytes, encode(&note));

        let raw = etcd.raw();
        let got = raw.get(format!("{prefix}/desired/a")).unwrap();
        assert_eq!(got.value, fjall_bytes.as_slice());
        let revs: Vec<i64> = [
            format!("{prefix}/desired/a"),
            format!("{prefix}/jobs/j/1"),
            format!("{prefix}/journal/j/1/0001"),
        ]
        .into_iter()
        .map(|k| raw.get(k).unwrap().mod_revision)
        .collect();
        assert!(revs.windows(2).all(|w| w[0] == w[1]), "{revs:?}");
        // The layout marker.
        let marker = raw.get(format!("{prefix}/meta/store-format")).unwrap();
        assert_eq!(
            marker.value,
            medea::store::etcd::FORMAT_VERSION.to_string().as_bytes()
        );
    }

    #[test]
    fn a_newer_layout_is_refused() {
        let Some(etcd) = Etcd::shared() else { return };
        let prefix = unique_prefix("newer");
        drop(etcd.store(&prefix));
        etcd.raw().put(format!("{prefix}/meta/store-format"), "99");
        let err = EtcdStore::connect(&EtcdConfig::new(etcd.location(&prefix))).unwrap_err();
        assert!(
            matches!(err, StoreError::NewerFormat { found: 99, .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains("written by a newer medea"),
            "{err}"
        );
        assert!(err.to_string().contains(&prefix), "{err}");
    }

    /// Nothing listens: the error names the URL and comes within the timeouts.
    #[test]
    fn an_unreachable_etcd_is_a_clear_error() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("etcd://127.0.0.1:{port}/medea");
        let loc = match url.parse().unwrap() {
            medea::store::location::StoreLocation::Etcd(u) => u,
            other => panic!("{other:?}"),
        };
        let mut config = EtcdConfig::new(loc);
        config.connect_timeout = Duration::from_secs(1);
        config.request_timeout = Duration::from_secs(1);
        let t0 = Instant::now();
        let err = EtcdStore::connect(&config).unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        assert!(matches!(err, StoreError::Open { .. }), "{err}");
        assert!(err.to_string().contains(&url), "{err}");
    }

    /// etcd with `--client-cert-auth`: medea connects with the CA and a client certificate,
    /// and is refused without the certificate or with the wrong CA.
    #[test]
    fn mutual_tls_to_etcd() {
        let tls = TlsFiles::generate();
        let Some(etcd) = Etcd::start_tls(&tls) else {
            return;
        };
        let prefix = unique_prefix("tls");
        let mut config = EtcdConfig::new(etcd.location(&prefix));
        config.connect_timeout = Duration::from_secs(2);
        config.request_timeout = Duration::from_secs(2);
        config.tls = Some(EtcdTls {
            ca: tls.ca.clone(),
            cert: Some(tls.client_cert.clone()),
            key: Some(tls.client_key.clone()),
        });
        let s = EtcdStore::connect(&config).unwrap_or_else(|e| {
            panic!("{}\n{}", medea::error_chain(&e), etcd.log());
        });
        s.commit(Txn::new().put_record("n", &Note { text: "tls".into() }))
            .unwrap();
        assert_eq!(
            s.get_record::<Note>("n").unwrap(),
            Some(Note { text: "tls".into() })
        );

        let mut no_cert = config.clone();
        no_cert.tls = Some(EtcdTls {
            ca: tls.ca.clone(),
            cert: None,
            key: None,
        });
        let err = EtcdStore::connect(&no_cert).unwrap_err();
        assert!(matches!(err, StoreError::Open { .. }), "{err}");

        let other = TlsFiles::generate();
        let mut wrong_ca = config.clone();
        wrong_ca.tls = Some(EtcdTls {
            ca: other.ca.clone(),
            cert: Some(tls.client_cert.clone()),
            key: Some(tls.client_key.clone()),
        });
        let err = EtcdStore::connect(&wrong_ca).unwrap_err();
        assert!(matches!(err, StoreError::Open { .. }), "{err}");

        let mut missing = config.clone();
        missing.tls = Some(EtcdTls {
            ca: tls.dir.path().join("nope.crt"),
            cert: None,
            key: None,
        });
        let err = EtcdStore::connect(&missing).unwrap_err();
        let chain = medea::error_chain(&err);
        assert!(
            chain.contains("etcd CA certificate") && chain.contains("nope.crt"),
            "{chain}"
        );
    }

    /// etcd with authentication enabled: medea authenticates with a user and password (etcd's
    /// `Auth.Authenticate`, the token in the `token` metadata) and reads, writes and leads; no
    /// credentials or a wrong password is a clear error that never shows the password.
    #[test]
    fn etcd_with_authentication() {
        use medea::store::etcd::EtcdCredentials;
        let Some(etcd) = Etcd::start() else { return };
        etcd.raw().enable_auth("root-pw-7c1e");
        let prefix = unique_prefix("auth");
        let creds = |pw: &str| {
            Some(EtcdCredentials {
                user: "root".into(),
                password: medea::secret::Secret::new(pw.into()),
            })
        };
        let mut config = EtcdConfig::new(etcd.location(&prefix));
        config.connect_timeout = Duration::from_secs(2);
        config.request_timeout = Duration::from_secs(2);

        let err = EtcdStore::connect(&config).unwrap_err();
        let chain = medea::error_chain(&err);
        assert!(matches!(err, StoreError::Open { .. }), "{chain}");
        assert!(
            chain.contains("user name is empty") || chain.contains("permission denied"),
            "{chain}"
        );

        let mut wrong = config.clone();
        wrong.credentials = creds("not-the-password");
        let err = EtcdStore::connect(&wrong).unwrap_err();
        let chain = medea::error_chain(&err);
        assert!(
            chain.contains("refused the credentials of user `root`"),
            "{chain}"
        );
        assert!(!chain.contains("not-the-password"), "{chain}");

        config.credentials = creds("root-pw-7c1e");
        let s = EtcdStore::connect(&config).unwrap_or_else(|e| {
            panic!("{}\n{}", medea::error_chain(&e), etcd.log());
        });
        s.commit(Txn::new().put_record(
            "n",
            &Note {
                text: "auth".into(),
            },
        ))
        .unwrap();
        assert_eq!(
            s.get_record::<Note>("n").unwrap(),
            Some(Note {
                text: "auth".into()
            })
        );
        // Leases, the leader transaction and the keep-alive stream carry the token too.
        let lead = s.campaign("a", Duration::from_secs(2));
        let rt = tokio::runtime::Runtime::new().unwrap();
        let fence = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(20), lead.leading())
                .await
                .expect("leads within 20s")
        });
        assert_eq!(fence.replica(), "a");
        assert_eq!(
            s.current_leader().unwrap().map(|(r, _)| r).as_deref(),
            Some("a")
        );
    }

    /// A transaction over etcd's op limit fails as a whole and writes nothing.
    #[test]
    fn an_oversized_transaction_writes_nothing() {
        let Some(etcd) = Etcd::shared() else { return };
        let s = etcd.store(&unique_prefix("oversized"));
        let mut t = Txn::new();
        for i in 0..200 {
            t = t.put(Table::Journal, format!("k/{i:03}"), b"v".to_vec());
        }
        let err = s.commit(t).unwrap_err();
        assert!(
            matches!(err, StoreError::Backend { op: "commit", .. }),
            "{err}"
        );
        assert!(
            medea::error_chain(&err).contains("too many operations"),
            "{}",
            medea::error_chain(&err)
        );
        assert!(s.scan(Table::Journal, "k/").unwrap().is_empty());
    }
}
