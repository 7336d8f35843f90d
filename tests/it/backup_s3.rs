//! Backups to an S3-compatible destination (issue #37, item 4) against a real S3 server,
//! `s3s-fs` (crates.io, `cargo install s3s-fs --features binary`; installed by `tests/run`),
//! started on loopback by each test, with the Talos side on the simulator.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use medea::backup::s3::{S3, S3Config, S3Credentials};
use medea::backup::{self, BackupError, BackupRequest, Destination};
use medea::desired::backup::BackupSettings;
use medea::rollout::fake::MemStore;
use medea::sim::kube::KubeSimConfig;
use medea::sim::talos::{Effect, Method, Trigger};
use medea::store::{Op, Store, StoreError, Table, Txn};
use rusty_s3::S3Action as _;

use crate::backup_fixture::{
    api, crash_before_record, decrypt, restores_at_the_recorded_revision, run_pass, settings,
    sha256, ts,
};
use crate::rollout_sim::{Sim, adapters, node};

const ACCESS: &str = "medea-test-access";
const SECRET: &str = "medea-test-secret-0123456789";
const BUCKET: &str = "backups";
/// S3's smallest part.
const PART: usize = 5 * 1024 * 1024;

/// A real `s3s-fs` on a loopback port, over a directory; killed on drop.
struct S3Server {
    child: Child,
    port: u16,
    root: PathBuf,
}

impl S3Server {
    /// Started with the test's access key and bucket [`BUCKET`] created through the S3 API;
    /// `None` (skipped) when `s3s-fs` is not installed outside CI.
    fn start(dir: &Path) -> Option<S3Server> {
        let bin = crate::fixtures::tool_or_skip("s3s-fs")?;
        let root = dir.join("s3-root");
        std::fs::create_dir_all(&root).unwrap();
        let port = crate::fixtures::free_port();
        let child = Command::new(bin)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", ACCESS, "--secret-key", SECRET])
            .arg(&root)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut server = S3Server { child, port, root };
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                server.child.try_wait().unwrap().is_none(),
                "s3s-fs exited at start"
            );
            assert!(Instant::now() < deadline, "s3s-fs did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        server.create_bucket();
        Some(server)
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `CreateBucket`, signed as any S3 client would.
    fn create_bucket(&mut self) {
        let bucket = rusty_s3::Bucket::new(
            self.endpoint().parse().unwrap(),
            rusty_s3::UrlStyle::Path,
            BUCKET,
            "us-east-1",
        )
        .unwrap();
        let creds = rusty_s3::Credentials::new(ACCESS, SECRET);
        let url = bucket.create_bucket(&creds).sign(Duration::from_secs(60));
        let resp = ureq::put(url.as_str()).send_empty().unwrap();
        assert!(resp.status().is_success(), "{:?}", resp.status());
    }

    /// The objects under `prefix` as the server stores them (its files), key → bytes.
    fn objects(&self, prefix: &str) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        let base = self.root.join(BUCKET);
        walk(&base, &base, &mut out);
        out.retain(|(k, _)| k.starts_with(prefix));
        out.sort();
        out
    }
}

fn walk(base: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd {
        let e = e.unwrap();
        let p = e.path();
        if e.file_type().unwrap().is_dir() {
            walk(base, &p, out);
        } else {
            let key = p.strip_prefix(base).unwrap().to_string_lossy().into_owned();
            // s3s-fs keeps its own bookkeeping (metadata, uploads) in hidden files.
            if !key.split('/').any(|c| c.starts_with('.')) {
                out.push((key, std::fs::read(&p).unwrap()));
            }
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP proxy in front of the server that logs each request line (method and path, the
/// signature's query cut off) and refuses the first `refuse` connections: the first with S3's
/// `503 SlowDown`, the next ones by closing them.
struct Proxy {
    port: u16,
    requests: Arc<Mutex<Vec<Vec<String>>>>,
    refused: Arc<Mutex<u32>>,
}

impl Proxy {
    fn start(upstream: u16, refuse: u32) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
        let refused: Arc<Mutex<u32>> = Arc::default();
        let (log, count) = (requests.clone(), refused.clone());
        let request_line = regex::bytes::Regex::new(
            r"(GET|PUT|POST|HEAD|DELETE) (/[^ ?]*)(\?[^ ]*)? HTTP/1\.1\r\n",
        )
        .unwrap();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                {
                    let mut n = count.lock().unwrap();
                    if *n < refuse {
                        *n += 1;
                        if *n == 1 {
                            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                            let mut r = BufReader::new(&conn);
                            let mut line = String::new();
                            while r.read_line(&mut line).is_ok_and(|k| k > 2) {
                                line.clear();
                            }
                            let body = "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";
                            let _ = write!(
                                conn,
                                "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/xml\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                                body.len()
                            );
                        }
                        let _ = conn.shutdown(std::net::Shutdown::Both);
                        continue;
                    }
                }
                let Ok(up) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let idx = {
                    let mut l = log.lock().unwrap();
                    l.push(Vec::new());
                    l.len() - 1
                };
                let (mut c2, mut u2) = (conn.try_clone().unwrap(), up.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut u2, &mut c2);
                    let _ = c2.shutdown(std::net::Shutdown::Both);
                });
                let log = log.clone();
                let pattern = request_line.clone();
                std::thread::spawn(move || {
                    let (mut conn, mut up) = (conn, up);
                    let line = pattern;
                    let mut seen = Vec::new();
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match conn.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        seen.extend_from_slice(&buf[..n]);
                        let lines = line
                            .captures_iter(&seen)
                            .map(|c| {
                                let query = c
                                    .get(3)
                                    .map(|q| {
                                        String::from_utf8_lossy(q.as_bytes())
                                            .split('&')
                                            .filter(|p| {
                                                !p.starts_with("?X-Amz") && !p.starts_with("X-Amz")
                                            })
                                            .map(|p| {
                                                p.split('=')
                                                    .next()
                                                    .unwrap_or_default()
                                                    .trim_start_matches('?')
                                                    .to_string()
                                            })
                                            .collect::<Vec<_>>()
                                            .join("&")
                                    })
                                    .unwrap_or_default();
                                format!(
                                    "{} {}?{query}",
                                    String::from_utf8_lossy(&c[1]),
                                    String::from_utf8_lossy(&c[2])
                                )
                            })
                            .collect();
                        // Logged before it is forwarded: the answer cannot come first.
                        log.lock().unwrap()[idx] = lines;
                        if up.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = up.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        Proxy {
            port,
            requests,
            refused,
        }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().concat()
    }
}

fn config(endpoint: &str, attempts: u32) -> (S3Config, S3Credentials) {
    (
        S3Config {
            endpoint: endpoint.parse().unwrap(),
            bucket: BUCKET.into(),
            prefix: "medea/".into(),
            region: "us-east-1".into(),
            path_style: true,
            part_size: 16 * 1024 * 1024,
            attempts,
            first_backoff: Duration::from_millis(50),
            ca_pem: None,
        },
        S3Credentials {
            access_key_id: ACCESS.into(),
            secret_access_key: SECRET.into(),
            session_token: None,
        },
    )
}

/// The server-side files of destination `name` of cluster `prod` under `creds`.
fn write_destination(creds: &Path, name: &str, endpoint: &str, attempts: u32) {
    let dir = medea::backup::s3::destination_dir(creds, "prod", name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("destination.yaml"),
        format!(
            "kind: s3\nendpoint: {endpoint}\nbucket: {BUCKET}\nprefix: medea/\npathStyle: true\nattempts: {attempts}\n"
        ),
    )
    .unwrap();
    let cred = dir.join("credentials");
    std::fs::write(
        &cred,
        format!("accessKeyId: {ACCESS}\nsecretAccessKey: {SECRET}\n"),
    )
    .unwrap();
    std::fs::set_permissions(&cred, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// Applied settings for `prod` with backups to `offsite` for `alice` (as a signed plan leaves
/// them), `extra` more lines under `backup:`.
fn apply(store: &dyn Store, sim: &Sim, alice: &age::x25519::Identity, extra: &str) {
    crate::backup_fixture::apply(
        store,
        sim,
        &format!(
            "    schedule: '0 3 * * *'\n    destination: offsite\n{extra}    recipients:\n{}",
            crate::backup_fixture::key_yaml(&[alice])
        ),
    );
}

/// A webhook receiver answering 200: the JSON bodies it got.
pub(crate) fn receiver() -> (String, Arc<Mutex<Vec<serde_json::Value>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let got: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
    let log = got.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let mut r = BufReader::new(conn);
            let mut len = 0usize;
            let mut line = String::new();
            while r.read_line(&mut line).is_ok_and(|k| k > 2) {
                if let Some((k, v)) = line.split_once(':')
                    && k.eq_ignore_ascii_case("content-length")
                {
                    len = v.trim().parse().unwrap_or(0);
                }
                line.clear();
            }
            let mut body = vec![0; len];
            if r.read_exact(&mut body).is_ok() {
                log.lock()
                    .unwrap()
                    .push(serde_json::from_slice(&body).unwrap_or_default());
            }
            let _ = r
                .into_inner()
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });
    (url, got)
}

// ------------------------------------------------------------------ the tests

/// `medea backup now` (the API) with `destination: offsite`, which the server maps to its own
/// files under the credentials directory: the encrypted snapshot lands in the bucket under
/// `<prefix><cluster>/`, is recorded with the destination and its checksum, and reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_s3_now_lands_in_the_bucket_encrypted_recorded_and_verified() {
    use medea::api::pb;
    use medea::api::pb::medea_server::Medea as _;
    let dir = tempfile::tempdir().unwrap();
    let Some(s3) = S3Server::start(dir.path()) else {
        return;
    };
    let sim = Sim::start(dir.path(), 3, 0, KubeSimConfig::default()).await;
    let alice = age::x25519::Identity::generate();
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    apply(store.as_ref(), &sim, &alice, "");
    write_destination(&sim.creds, "offsite", &s3.endpoint(), 3);
    let api = api(store.clone(), &sim, dir.path(), None);
    let b = api
        .backup_now(tonic::Request::new(pb::BackupNowRequest {
            cluster: "prod".into(),
        }))
        .await
        .unwrap()
        .into_inner()
        .backup
        .unwrap();
    let rec = backup::list(store.as_ref(), "prod").unwrap().remove(0);
    assert_eq!(rec.file, b.file);
    assert_eq!(rec.destination, "offsite");
    // In the bucket: only the encrypted object, under the prefix and the cluster.
    let objects = s3.objects("");
    assert_eq!(
        objects.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
        vec![format!("medea/prod/{}", rec.file)]
    );
    let enc = &objects[0].1;
    assert!(enc.starts_with(b"age-encryption.org/v1\n"));
    assert_eq!(enc.len() as u64, rec.size);
    assert_eq!(sha256(enc), rec.sha256);
    let plain = decrypt(enc, &alice);
    assert_eq!(sha256(&plain), rec.snapshot_sha256);
    // Restored with etcd's own tools, as design/backup.md's "Restoring from S3" goes: the
    // recorded revision, the cluster's keys.
    let revision = rec.revision.expect("the recorded etcd revision");
    restores_at_the_recorded_revision(dir.path(), &plain, revision);
    // Nothing on the local disk.
    assert!(!dir.path().join("state/backups/prod").exists());
    // The destination lists and reads it back through the same port the local one has, and
    // `backup verify`'s check passes on what it reads.
    let dirs = backup::Dirs {
        state_dir: dir.path().join("state"),
        creds_dir: Some(sim.creds.clone()),
    };
    let dest = backup::destination(&dirs, "prod", "offsite").unwrap();
    assert_eq!(dest.list().unwrap(), vec![rec.file.clone()]);
    assert!(dest.exists(&rec.file).unwrap());
    let v = backup::verify(dest.open(&rec.file).unwrap(), &rec, Some(&alice)).unwrap();
    assert_eq!(v.size, rec.size);
    assert!(store.scan(Table::Backups, "intent/").unwrap().is_empty());
}

/// The server's destination files are checked: credentials others may read are refused, and
/// so is a name the server has no files for, each with a message saying what to do.
#[test]
fn backup_s3_destination_files_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("creds");
    let dirs = backup::Dirs {
        state_dir: dir.path().join("state"),
        creds_dir: Some(creds.clone()),
    };
    let err = backup::destination(&dirs, "prod", "offsite").err().unwrap();
    let chain = medea::error_chain(&err);
    assert!(
        chain.contains("backup-destinations/<name>/destination.yaml"),
        "{chain}"
    );
    write_destination(&creds, "offsite", "http://127.0.0.1:9", 1);
    assert!(backup::destination(&dirs, "prod", "offsite").is_ok());
    let cred = medea::backup::s3::destination_dir(&creds, "prod", "offsite").join("credentials");
    std::fs::set_permissions(&cred, std::fs::Permissions::from_mode(0o644)).unwrap();
    let chain = medea::error_chain(&backup::destination(&dirs, "prod", "offsite").err().unwrap());
    assert!(chain.contains("credentials"), "{chain}");
    std::fs::set_permissions(&cred, std::fs::Permissions::from_mode(0o600)).unwrap();
    let yaml =
        medea::backup::s3::destination_dir(&creds, "prod", "offsite").join("destination.yaml");
    std::fs::write(
        &yaml,
        "kind: s3\nendpoint: https://user:pw@s3.example.net/x\nbucket: b\n",
    )
    .unwrap();
    let chain = medea::error_chain(&backup::destination(&dirs, "prod", "offsite").err().unwrap());
    assert!(chain.contains("no path, query or user"), "{chain}");
    std::fs::write(
        &yaml,
        "kind: s3\nendpoint: https://s3.example.net\nbucket: b\npartSizeMiB: 1\n",
    )
    .unwrap();
    let chain = medea::error_chain(&backup::destination(&dirs, "prod", "offsite").err().unwrap());
    assert!(chain.contains("partSizeMiB: 1"), "{chain}");
    // Without a credentials directory only `local` exists.
    assert!(matches!(
        backup::destination(&backup::Dirs::local(dir.path()), "prod", "offsite"),
        Err(BackupError::UnknownDestination { .. })
    ));
}

async fn take_to(
    sim: &Sim,
    store: &dyn Store,
    dest: Arc<dyn Destination>,
    s: &BackupSettings,
    now: &str,
) -> Result<backup::BackupRecord, BackupError> {
    let (talos, _kube) = adapters(sim).await;
    backup::take(
        store,
        None,
        &talos,
        dest,
        BackupRequest {
            cluster: "prod",
            settings: s,
            control_plane: &[node(sim, "cp-1")],
            now: ts(now),
            slot: None,
        },
    )
    .await
}

/// A snapshot larger than a part goes up as a multipart upload (create, parts, complete),
/// then is verified (HEAD, read back), and the object is the whole encrypted file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_s3_multipart_upload_when_the_snapshot_is_larger_than_a_part() {
    let dir = tempfile::tempdir().unwrap();
    let Some(s3) = S3Server::start(dir.path()) else {
        return;
    };
    let proxy = Proxy::start(s3.port, 0);
    let sim = Sim::start(dir.path(), 1, 0, KubeSimConfig::default()).await;
    // A member whose database is 11 MiB: with S3's smallest part (5 MiB, which s3s-fs enforces
    // as AWS does: `EntityTooSmall`), three parts.
    sim.talos
        .set_fault(crate::rollout_sim::fault(
            "cp-1",
            Trigger::call(Method::EtcdSnapshot),
            Effect::LargeSnapshot {
                db_bytes: 11 * 1024 * 1024,
            },
        ))
        .unwrap();
    let alice = age::x25519::Identity::generate();
    let store = MemStore::new();
    let (mut cfg, creds) = config(&format!("http://127.0.0.1:{}", proxy.port), 3);
    cfg.part_size = PART;
    let dest: Arc<dyn Destination> = Arc::new(S3::new("offsite", "prod", cfg, creds).unwrap());
    let s = settings(&[&alice], "offsite");
    let rec = take_to(&sim, &store, dest, &s, "2026-12-05T10:00:00Z")
        .await
        .unwrap();
    assert!(
        rec.snapshot_size > 11 * 1024 * 1024,
        "{}",
        rec.snapshot_size
    );
    let key = format!("/{BUCKET}/medea/prod/{}", rec.file);
    let reqs = proxy.requests();
    let count = |want: &str| reqs.iter().filter(|r| *r == want).count();
    assert_eq!(count(&format!("POST {key}?uploads")), 1, "{reqs:#?}");
    assert_eq!(
        count(&format!("PUT {key}?partNumber&uploadId")),
        3,
        "{reqs:#?}"
    );
    assert_eq!(count(&format!("POST {key}?uploadId")), 1, "{reqs:#?}");
    assert_eq!(count(&format!("PUT {key}?")), 0, "no single PutObject");
    // Verified after the upload: HEAD, then read back.
    let complete = reqs
        .iter()
        .position(|r| *r == format!("POST {key}?uploadId"))
        .unwrap();
    assert!(
        reqs[complete..].contains(&format!("HEAD {key}?")),
        "{reqs:#?}"
    );
    assert!(
        reqs[complete..].contains(&format!("GET {key}?")),
        "{reqs:#?}"
    );
    let objects = s3.objects("medea/prod/");
    assert_eq!(objects.len(), 1);
    assert_eq!(sha256(&objects[0].1), rec.sha256);
    assert_eq!(sha256(&decrypt(&objects[0].1, &alice)), rec.snapshot_sha256);
}

/// A server that answers `503 SlowDown`, then drops a connection, then recovers: the request
/// is retried with backoff and the backup is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_s3_a_server_that_refuses_then_recovers_is_retried() {
    let dir = tempfile::tempdir().unwrap();
    let Some(s3) = S3Server::start(dir.path()) else {
        return;
    };
    let proxy = Proxy::start(s3.port, 2);
    let sim = Sim::start(dir.path(), 1, 0, KubeSimConfig::default()).await;
    let alice = age::x25519::Identity::generate();
    let store = MemStore::new();
    let (cfg, creds) = config(&format!("http://127.0.0.1:{}", proxy.port), 4);
    let dest: Arc<dyn Destination> = Arc::new(S3::new("offsite", "prod", cfg, creds).unwrap());
    let s = settings(&[&alice], "offsite");
    let rec = take_to(&sim, &store, dest, &s, "2026-12-05T10:00:00Z")
        .await
        .unwrap();
    assert_eq!(*proxy.refused.lock().unwrap(), 2, "both refusals were met");
    assert_eq!(backup::list(&store, "prod").unwrap(), vec![rec.clone()]);
    let objects = s3.objects("medea/prod/");
    assert_eq!(sha256(&objects[0].1), rec.sha256);

    // With one attempt, the same refusal fails the backup and nothing is recorded.
    let proxy = Proxy::start(s3.port, 1);
    let (cfg, creds) = config(&format!("http://127.0.0.1:{}", proxy.port), 1);
    let dest: Arc<dyn Destination> = Arc::new(S3::new("offsite", "prod", cfg, creds).unwrap());
    let err = take_to(&sim, &store, dest, &s, "2026-12-05T11:00:00Z")
        .await
        .unwrap_err();
    let chain = medea::error_chain(&err);
    // The first request is the HEAD that checks the name is free: a 503 without a body.
    assert!(chain.contains("HTTP 503 after 1 attempt(s)"), "{chain}");
    assert_eq!(backup::list(&store, "prod").unwrap().len(), 1);
}

/// An unreachable server: `backup now` fails, nothing is recorded or left in the journal, and
/// the failure is a metric and a `backup.failed` webhook.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_s3_unreachable_server_fails_records_nothing_and_alerts() {
    use medea::api::pb;
    use medea::api::pb::medea_server::Medea as _;
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 3, 0, KubeSimConfig::default()).await;
    let alice = age::x25519::Identity::generate();
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    apply(store.as_ref(), &sim, &alice, "");
    // Nothing listens there.
    let port = crate::fixtures::free_port();
    write_destination(
        &sim.creds,
        "offsite",
        &format!("http://127.0.0.1:{port}"),
        2,
    );
    let (hook, got) = receiver();
    let api = api(store.clone(), &sim, dir.path(), Some(hook));
    let failures = || {
        medea::metrics::render()
            .lines()
            .find(|l| l.starts_with("medea_backup_failures_total{cluster=\"prod\"}"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let before = failures();
    let err = api
        .backup_now(tonic::Request::new(pb::BackupNowRequest {
            cluster: "prod".into(),
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(
        err.message().contains("no answer after 2 attempt(s)"),
        "{}",
        err.message()
    );
    assert!(
        err.message().contains("destination `offsite`"),
        "{}",
        err.message()
    );
    assert!(backup::list(store.as_ref(), "prod").unwrap().is_empty());
    assert!(store.scan(Table::Backups, "intent/").unwrap().is_empty());
    assert!(failures() >= before + 1.0);
    crate::fixtures::wait("the backup.failed webhook", Duration::from_secs(60), || {
        got.lock()
            .unwrap()
            .iter()
            .any(|b| b["event"] == "backup.failed" && b["cluster"] == "prod")
    });
}

/// Records every transaction committed, to check the journal's order.
struct Journaled {
    inner: MemStore,
    ops: Mutex<Vec<String>>,
}

impl Store for Journaled {
    fn get(&self, table: Table, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(table, key)
    }
    fn scan(&self, table: Table, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.inner.scan(table, prefix)
    }
    fn commit(&self, txn: Txn) -> Result<(), StoreError> {
        for op in &txn.ops {
            match op {
                Op::Put(Table::Backups, k, _) => self.ops.lock().unwrap().push(format!("put {k}")),
                Op::Delete(Table::Backups, k) => {
                    self.ops.lock().unwrap().push(format!("delete {k}"))
                }
                _ => {}
            }
        }
        self.inner.commit(txn)
    }
}

/// Retention on an S3 destination: the schedule over three days with `keep: 2` deletes the
/// oldest object from the bucket, journaled (intent, then record and intent gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_s3_retention_deletes_from_the_bucket_and_journals_it() {
    let dir = tempfile::tempdir().unwrap();
    let Some(s3) = S3Server::start(dir.path()) else {
        return;
    };
    let sim = Sim::start(dir.path(), 1, 0, KubeSimConfig::default()).await;
    let alice = age::x25519::Identity::generate();
    let store = Journaled {
        inner: MemStore::new(),
        ops: Mutex::default(),
    };
    apply(&store, &sim, &alice, "    retention: { keep: 2 }\n");
    write_destination(&sim.creds, "offsite", &s3.endpoint(), 3);
    let dirs = backup::Dirs {
        state_dir: dir.path().join("state"),
        creds_dir: Some(sim.creds.clone()),
    };
    let mut recovered = Default::default();
    let creds = sim.creds.clone();
    for day in 1..=3 {
        let r = backup::pass(
            &store,
            None,
            &dirs,
            |cluster| medea::talos::adapter::TalosAdapter::from_creds(&creds, cluster),
            ts(&format!("2026-12-0{day}T10:00:00Z")),
            &mut recovered,
        )
        .await
        .unwrap();
        assert_eq!(r.taken.len(), 1, "day {day}: {r:?}");
        assert!(r.failed.is_empty(), "{r:?}");
    }
    let want = vec![
        "medea/prod/prod-20261202T100000Z.db.age".to_string(),
        "medea/prod/prod-20261203T100000Z.db.age".to_string(),
    ];
    let keys: Vec<String> = s3.objects("").into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, want, "the oldest was deleted from the bucket");
    let files: Vec<String> = backup::list(&store, "prod")
        .unwrap()
        .into_iter()
        .map(|b| b.file)
        .collect();
    assert_eq!(
        files,
        vec![
            "prod-20261202T100000Z.db.age",
            "prod-20261203T100000Z.db.age"
        ]
    );
    let ops = store.ops.lock().unwrap().clone();
    let gone = "prod/prod-20261201T100000Z.db.age";
    let intent = ops
        .iter()
        .position(|o| *o == format!("put deleting/{gone}"))
        .unwrap_or_else(|| panic!("a deletion intent: {ops:#?}"));
    let done = ops
        .iter()
        .position(|o| *o == format!("delete backup/{gone}"))
        .unwrap();
    assert!(intent < done, "{ops:#?}");
    assert!(ops[done..].contains(&format!("delete deleting/{gone}")));
    assert!(store.scan(Table::Backups, "deleting/").unwrap().is_empty());
}

/// A crash after the object was uploaded (and verified) but before the record: no backup is
/// counted, and the leader's recovery deletes the orphan object from the bucket, reports it,
/// and leaves an object it has no record of alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_s3_crash_between_upload_and_record_leaves_no_backup_and_the_orphan_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let Some(s3) = S3Server::start(dir.path()) else {
        return;
    };
    let sim = Sim::start(dir.path(), 1, 0, KubeSimConfig::default()).await;
    let alice = age::x25519::Identity::generate();
    let store = crash_before_record();
    let (cfg, creds) = config(&s3.endpoint(), 3);
    let dest: Arc<dyn Destination> = Arc::new(S3::new("offsite", "prod", cfg, creds).unwrap());
    let s = settings(&[&alice], "offsite");
    let err = take_to(&sim, &store, dest.clone(), &s, "2026-12-05T10:00:00Z")
        .await
        .unwrap_err();
    assert!(matches!(err, BackupError::Store { .. }), "{err:?}");
    let file = "prod-20261205T100000Z.db.age";
    assert_eq!(
        s3.objects("")
            .into_iter()
            .map(|(k, _)| k)
            .collect::<Vec<_>>(),
        vec![format!("medea/prod/{file}")],
        "uploaded"
    );
    let inner: &MemStore = &store.inner;
    assert!(
        backup::list(inner, "prod").unwrap().is_empty(),
        "not counted"
    );
    // An object medea never wrote, beside it.
    {
        let mut w = dest.create("operator-copy.db.age").unwrap();
        w.write_all(b"not ours").unwrap();
        w.commit().unwrap();
    }
    let rec = backup::recover(inner, None, "prod", dest.as_ref()).unwrap();
    assert_eq!(rec.orphans_removed, vec![file]);
    assert_eq!(rec.foreign, vec!["operator-copy.db.age"]);
    assert_eq!(
        s3.objects("")
            .into_iter()
            .map(|(k, _)| k)
            .collect::<Vec<_>>(),
        vec!["medea/prod/operator-copy.db.age".to_string()],
        "the orphan is gone from the bucket, the foreign object left alone"
    );
    assert!(inner.scan(Table::Backups, "intent/").unwrap().is_empty());
    let again = backup::recover(inner, None, "prod", dest.as_ref()).unwrap();
    assert!(again.orphans_removed.is_empty());
}

/// A failover in the middle of a scheduled backup to S3: replica a uploads (and verifies) the
/// object, then loses its term before recording it; replica b, leading now, recovers first (a's
/// object is an orphan: deleted from the bucket and reported, the slot given back) and takes
/// the slot once. Exactly one backup is recorded, and the bucket holds exactly its object:
/// nothing uncounted is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_s3_failover_mid_scheduled_backup_records_exactly_one_and_leaves_no_uncounted_object()
 {
    let dir = tempfile::tempdir().unwrap();
    let Some(s3) = S3Server::start(dir.path()) else {
        return;
    };
    let sim = Sim::start(dir.path(), 3, 0, KubeSimConfig::default()).await;
    let alice = age::x25519::Identity::generate();
    let shared = Arc::new(MemStore::new());
    apply(shared.as_ref(), &sim, &alice, "");
    write_destination(&sim.creds, "offsite", &s3.endpoint(), 3);
    // Both replicas read the same bucket through their own credentials directory (the same
    // files here).
    let dirs = backup::Dirs {
        state_dir: dir.path().join("state"),
        creds_dir: Some(sim.creds.clone()),
    };
    let keys =
        |prefix: &str| -> Vec<String> { s3.objects(prefix).into_iter().map(|(k, _)| k).collect() };
    let a = crate::backup_fixture::deposed_at_record(shared.clone());
    let mut recovered_a = Default::default();
    let err = run_pass(
        &a,
        None,
        &sim,
        &dirs,
        "2026-12-05T10:00:00Z",
        &mut recovered_a,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, BackupError::Store { err, .. } if err.is_leadership_lost()),
        "{err:?}"
    );
    assert_eq!(sim.snapshots(), 1);
    assert_eq!(
        keys(""),
        vec!["medea/prod/prod-20261205T100000Z.db.age".to_string()],
        "a's object, uploaded and verified, never recorded"
    );
    assert!(backup::list(shared.as_ref(), "prod").unwrap().is_empty());

    let mut recovered_b = Default::default();
    let r = run_pass(
        shared.as_ref(),
        None,
        &sim,
        &dirs,
        "2026-12-05T10:00:05Z",
        &mut recovered_b,
    )
    .await
    .unwrap();
    assert_eq!(
        r.recovered[0].1.orphans_removed,
        vec!["prod-20261205T100000Z.db.age"],
        "the orphan is reported"
    );
    assert!(r.recovered[0].1.foreign.is_empty(), "{r:?}");
    assert_eq!(r.taken.len(), 1, "{r:?}");
    assert_eq!(r.taken[0].slot, Some(ts("2026-12-05T03:00:00Z")));
    let r = run_pass(
        shared.as_ref(),
        None,
        &sim,
        &dirs,
        "2026-12-05T10:30:00Z",
        &mut recovered_b,
    )
    .await
    .unwrap();
    assert!(r.taken.is_empty(), "{r:?}");
    let all = backup::list(shared.as_ref(), "prod").unwrap();
    assert_eq!(all.len(), 1, "exactly one backup recorded: {all:?}");
    assert_eq!(all[0].destination, "offsite");
    let objects = s3.objects("");
    assert_eq!(
        keys(""),
        vec![format!("medea/prod/{}", all[0].file)],
        "the bucket holds the recorded backup and nothing uncounted"
    );
    assert_eq!(sha256(&objects[0].1), all[0].sha256);
    assert!(shared.scan(Table::Backups, "intent/").unwrap().is_empty());
    assert!(
        !dir.path().join("state/backups/prod").exists(),
        "nothing on the local disk"
    );
    assert_eq!(sim.snapshots(), 2);
}

/// The same failover on a real etcd store with real leader election, to S3: replica a's
/// fenced record is refused by etcd after b won; a, late, does nothing more; b recovers (a's
/// object deleted from the bucket and reported) and takes the slot once. One backup, one object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_s3_failover_on_a_real_etcd_records_exactly_one_and_leaves_no_uncounted_object() {
    let Some(etcd) = crate::etcd_harness::Etcd::shared() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let Some(s3) = S3Server::start(dir.path()) else {
        return;
    };
    let prefix = crate::etcd_harness::unique_prefix("backup-s3-failover");
    let sim = Sim::start(dir.path(), 3, 0, KubeSimConfig::default()).await;
    let alice = age::x25519::Identity::generate();
    let sa = Arc::new(etcd.store(&prefix));
    let sb = Arc::new(etcd.store(&prefix));
    apply(sa.as_ref(), &sim, &alice, "");
    write_destination(&sim.creds, "offsite", &s3.endpoint(), 3);
    let dirs = backup::Dirs {
        state_dir: dir.path().join("state"),
        creds_dir: Some(sim.creds.clone()),
    };
    let keys =
        |prefix: &str| -> Vec<String> { s3.objects(prefix).into_iter().map(|(k, _)| k).collect() };
    let a = sa.campaign("a", Duration::from_secs(3));
    let fa = tokio::time::timeout(Duration::from_secs(60), a.leading())
        .await
        .expect("a leads");
    let view = crate::backup_fixture::FailoverAtRecord::new(sa.clone(), a, sb.clone());
    let mut recovered_a = Default::default();
    let err = run_pass(
        &view,
        Some(&fa),
        &sim,
        &dirs,
        "2026-12-05T10:00:00Z",
        &mut recovered_a,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, BackupError::Store { err, .. } if err.is_leadership_lost()),
        "etcd refused a's record: {err:?}"
    );
    assert_eq!(
        keys(""),
        vec!["medea/prod/prod-20261205T100000Z.db.age".to_string()],
        "a's object, never recorded"
    );
    let (_b, fb) = view.b_won();
    let r = run_pass(
        sa.as_ref(),
        Some(&fa),
        &sim,
        &dirs,
        "2026-12-05T10:00:01Z",
        &mut recovered_a,
    )
    .await
    .unwrap();
    assert!(r.taken.is_empty(), "{r:?}");
    assert_eq!(
        sim.snapshots(),
        1,
        "the deposed leader asks for no snapshot"
    );
    let mut recovered_b = Default::default();
    let r = run_pass(
        sb.as_ref(),
        Some(&fb),
        &sim,
        &dirs,
        "2026-12-05T10:00:02Z",
        &mut recovered_b,
    )
    .await
    .unwrap();
    assert_eq!(
        r.recovered[0].1.orphans_removed,
        vec!["prod-20261205T100000Z.db.age"]
    );
    assert_eq!(r.taken.len(), 1, "{r:?}");
    let r = run_pass(
        sb.as_ref(),
        Some(&fb),
        &sim,
        &dirs,
        "2026-12-05T10:30:00Z",
        &mut recovered_b,
    )
    .await
    .unwrap();
    assert!(r.taken.is_empty(), "{r:?}");
    let all = backup::list(sb.as_ref(), "prod").unwrap();
    assert_eq!(all.len(), 1, "exactly one backup recorded: {all:?}");
    assert_eq!(all[0].slot, Some(ts("2026-12-05T03:00:00Z")));
    let objects = s3.objects("");
    assert_eq!(
        keys(""),
        vec![format!("medea/prod/{}", all[0].file)],
        "the bucket holds the recorded backup and nothing uncounted"
    );
    assert_eq!(sha256(&objects[0].1), all[0].sha256);
    assert_eq!(sim.snapshots(), 2);
}

/// A scheduled pass whose destination cannot be reached fails that cluster's backup (reported,
/// so the metric and the webhook follow), not the whole pass: recovery, which must come first,
/// is tried again on the next pass, and no snapshot is asked for meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_s3_unreachable_destination_fails_its_cluster_not_the_pass() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 0, KubeSimConfig::default()).await;
    let alice = age::x25519::Identity::generate();
    let store = MemStore::new();
    apply(&store, &sim, &alice, "");
    let port = crate::fixtures::free_port();
    write_destination(
        &sim.creds,
        "offsite",
        &format!("http://127.0.0.1:{port}"),
        1,
    );
    let dirs = backup::Dirs {
        state_dir: dir.path().join("state"),
        creds_dir: Some(sim.creds.clone()),
    };
    let mut recovered = Default::default();
    let creds = sim.creds.clone();
    let r = backup::pass(
        &store,
        None,
        &dirs,
        |cluster| medea::talos::adapter::TalosAdapter::from_creds(&creds, cluster),
        ts("2026-12-05T10:00:00Z"),
        &mut recovered,
    )
    .await
    .unwrap();
    assert!(r.taken.is_empty());
    assert_eq!(r.failed.len(), 1, "{r:?}");
    let (cluster, err) = &r.failed[0];
    assert_eq!(cluster, "prod");
    assert!(
        matches!(err, BackupError::Destination { destination, .. } if destination == "offsite"),
        "{err:?}"
    );
    assert!(
        medea::error_chain(err).contains("ListObjectsV2"),
        "{}",
        medea::error_chain(err)
    );
    assert!(recovered.is_empty(), "recovery is tried again next pass");
    assert_eq!(sim.snapshots(), 0, "no snapshot before recovery succeeded");
    assert!(backup::list(&store, "prod").unwrap().is_empty());
}
