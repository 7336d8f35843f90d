//! A real etcd server for the tests: Debian's `etcd-server` (`/usr/bin/etcd`), started on
//! 127.0.0.1 with free ports and a temporary data dir.
//!
//! etcd runs under a tiny `sh` guard that kills it as soon as its stdin (a pipe held by this
//! process) closes, so no etcd outlives the test binary, even when the binary is killed. When
//! etcd is not installed, a test returns early with a "skipped" line, except under `CI=true`,
//! where it fails naming the package to install.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use medea::store::etcd::rpc::{EtcdClient, api, pb::mvccpb::KeyValue};

/// The etcd binary, or `None` (after saying so) outside CI; panics in CI.
pub fn etcd_binary() -> Option<PathBuf> {
    crate::fixtures::tool_or_skip("etcd")
}

/// Certificates for a TLS etcd: a CA, the server's certificate and a client certificate.
pub struct TlsFiles {
    pub dir: tempfile::TempDir,
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl TlsFiles {
    pub fn generate() -> TlsFiles {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};
        let dir = tempfile::tempdir().unwrap();
        let alg = &rcgen::PKCS_ECDSA_P256_SHA256;
        let ca_key = KeyPair::generate_for(alg).unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.distinguished_name
            .push(DnType::CommonName, "etcd test CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);

        let mut server = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        server.distinguished_name.push(DnType::CommonName, "etcd");
        server
            .subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        let server_key = KeyPair::generate_for(alg).unwrap();
        let server_cert = server.signed_by(&server_key, &issuer).unwrap();

        let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
        client.distinguished_name.push(DnType::CommonName, "medea");
        let client_key = KeyPair::generate_for(alg).unwrap();
        let client_cert = client.signed_by(&client_key, &issuer).unwrap();

        let w = |name: &str, data: String| {
            let p = dir.path().join(name);
            std::fs::write(&p, data).unwrap();
            p
        };
        TlsFiles {
            ca: w("ca.crt", ca_cert.pem()),
            server_cert: w("server.crt", server_cert.pem()),
            server_key: w("server.key", server_key.serialize_pem()),
            client_cert: w("client.crt", client_cert.pem()),
            client_key: w("client.key", client_key.serialize_pem()),
            dir,
        }
    }
}

pub struct Etcd {
    guard: Mutex<Option<Child>>,
    stdin: Mutex<Option<ChildStdin>>,
    /// etcd's own pid (the guard's child), for SIGSTOP/SIGCONT.
    pid: u32,
    /// `127.0.0.1:<port>`
    pub endpoint: String,
    log: Arc<Mutex<Vec<String>>>,
    _data: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Etcd {
    /// A fresh etcd of this test's own (for tests that stop or kill etcd).
    pub fn start() -> Option<Etcd> {
        let bin = etcd_binary()?;
        Some(Etcd::start_with(&bin, None))
    }

    /// A fresh etcd that serves clients over TLS and requires client certificates.
    pub fn start_tls(tls: &TlsFiles) -> Option<Etcd> {
        let bin = etcd_binary()?;
        Some(Etcd::start_with(&bin, Some(tls)))
    }

    /// A fresh etcd on the data of `snapshot` (an etcd snapshot file), restored first with
    /// `etcdctl snapshot restore` as an operator would; `None` (after saying so) when etcd or
    /// etcdctl is missing outside CI. Panics with etcdctl's message when the restore fails.
    pub fn restored(snapshot: &Path) -> Option<Etcd> {
        let bin = etcd_binary()?;
        let etcdctl = crate::fixtures::tool_or_skip("etcdctl")?;
        let mut last_log = Vec::new();
        for _ in 0..5 {
            match Etcd::try_start_on(&bin, None, Some((&etcdctl, snapshot))) {
                Ok(e) => return Some(e),
                Err(log) => last_log = log,
            }
        }
        panic!(
            "etcd did not start on the restored data:\n{}",
            last_log.join("\n")
        );
    }

    /// One etcd shared by every test of this process; tests keep apart by key prefix
    /// ([`unique_prefix`]).
    pub fn shared() -> Option<&'static Etcd> {
        static SHARED: OnceLock<Option<Etcd>> = OnceLock::new();
        SHARED.get_or_init(Etcd::start).as_ref()
    }

    fn start_with(bin: &Path, tls: Option<&TlsFiles>) -> Etcd {
        let mut last_log = Vec::new();
        // A port taken between probing and binding makes etcd exit: try again with others.
        for _ in 0..5 {
            match Etcd::try_start(bin, tls) {
                Ok(e) => return e,
                Err(log) => last_log = log,
            }
        }
        panic!("etcd did not start:\n{}", last_log.join("\n"));
    }

    fn try_start(bin: &Path, tls: Option<&TlsFiles>) -> Result<Etcd, Vec<String>> {
        Etcd::try_start_on(bin, tls, None)
    }

    /// Start etcd on a new data dir, or on one restored from `restore`'s snapshot with its
    /// etcdctl.
    fn try_start_on(
        bin: &Path,
        tls: Option<&TlsFiles>,
        restore: Option<(&Path, &Path)>,
    ) -> Result<Etcd, Vec<String>> {
        let data = tempfile::tempdir().unwrap();
        let (client, peer) = (free_port(), free_port());
        let scheme = if tls.is_some() { "https" } else { "http" };
        let client_url = format!("{scheme}://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        if let Some((etcdctl, snapshot)) = restore {
            let out = Command::new(etcdctl)
                .env("ETCDCTL_API", "3")
                .args(["snapshot", "restore"])
                .arg(snapshot)
                .arg("--data-dir")
                .arg(data.path().join("etcd"))
                .args(["--name", "t", "--initial-cluster"])
                .arg(format!("t={peer_url}"))
                .arg("--initial-advertise-peer-urls")
                .arg(&peer_url)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "etcdctl snapshot restore: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let mut args: Vec<String> = ["--name", "t", "--logger", "zap", "--log-outputs", "stderr"]
            .map(String::from)
            .to_vec();
        args.extend([
            "--data-dir".into(),
            data.path().join("etcd").display().to_string(),
            "--listen-client-urls".into(),
            client_url.clone(),
            "--advertise-client-urls".into(),
            client_url,
            "--listen-peer-urls".into(),
            peer_url.clone(),
            "--initial-advertise-peer-urls".into(),
            peer_url.clone(),
            "--initial-cluster".into(),
            format!("t={peer_url}"),
        ]);
        if let Some(t) = tls {
            for (flag, path) in [
                ("--cert-file", &t.server_cert),
                ("--key-file", &t.server_key),
                ("--trusted-ca-file", &t.ca),
            ] {
                args.push(flag.into());
                args.push(path.display().to_string());
            }
            args.push("--client-cert-auth".into());
        }
        // The guard: start etcd, print its pid, and kill it when stdin reaches EOF.
        let script = "\"$0\" \"$@\" & pid=$!; echo \"$pid\"; read _unused; kill \"$pid\" 2>/dev/null; wait \"$pid\"";
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg(bin)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sh for etcd");
        let stdin = child.stdin.take().unwrap();
        let mut pid_line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut pid_line)
            .unwrap();
        let pid: u32 = pid_line.trim().parse().expect("etcd pid from the guard");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        {
            let log = log.clone();
            let stderr = child.stderr.take().unwrap();
            std::thread::spawn(move || {
                let mut ready = Some(ready_tx);
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    let is_ready = line.contains("serving client traffic")
                        || line.contains("ready to serve client requests");
                    log.lock().unwrap().push(line);
                    if is_ready && let Some(tx) = ready.take() {
                        let _ = tx.send(true);
                    }
                }
                if let Some(tx) = ready.take() {
                    let _ = tx.send(false);
                }
            });
        }
        let started = ready_rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or(false);
        let etcd = Etcd {
            guard: Mutex::new(Some(child)),
            stdin: Mutex::new(Some(stdin)),
            pid,
            endpoint: format!("127.0.0.1:{client}"),
            log,
            _data: data,
        };
        if started {
            Ok(etcd)
        } else {
            let log = etcd.log.lock().unwrap().clone();
            drop(etcd);
            Err(log)
        }
    }

    /// `etcd://127.0.0.1:<port><prefix>`
    pub fn url(&self, prefix: &str) -> String {
        format!("etcd://{}{}", self.endpoint, prefix)
    }

    pub fn location(&self, prefix: &str) -> medea::store::location::EtcdUrl {
        match self.url(prefix).parse().unwrap() {
            medea::store::location::StoreLocation::Etcd(u) => u,
            other => panic!("not an etcd url: {other:?}"),
        }
    }

    /// A raw etcd client (medea's generated etcd v3 client) to read and write keys behind the
    /// store's back.
    pub fn raw(&self) -> Raw {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let endpoints = [format!("http://{}", self.endpoint)];
        let client = rt
            .block_on(EtcdClient::connect(
                &endpoints,
                None,
                Duration::from_secs(5),
                None,
            ))
            .unwrap();
        Raw { rt, client }
    }

    /// A store client under `prefix`.
    pub fn store(&self, prefix: &str) -> medea::store::etcd::EtcdStore {
        let config = medea::store::etcd::EtcdConfig::new(self.location(prefix));
        medea::store::etcd::EtcdStore::connect(&config).unwrap()
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} etcd");
    }

    /// Freeze etcd (SIGSTOP): clients time out as if it were partitioned away.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        // A frozen etcd cannot handle SIGTERM; thaw it first (harmless when running).
        let _ = Command::new("kill")
            .args(["-CONT", &self.pid.to_string()])
            .status();
        if let Some(mut stdin) = self.stdin.lock().unwrap().take() {
            let _ = stdin.flush();
        } // closing stdin makes the guard kill etcd
        if let Some(mut g) = self.guard.lock().unwrap().take() {
            let _ = g.wait();
        }
    }
}

/// A key prefix no other test of this process uses.
pub fn unique_prefix(name: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!("/t/{name}-{}", N.fetch_add(1, Ordering::Relaxed))
}

/// A raw etcd client and the runtime it runs on.
pub struct Raw {
    pub rt: tokio::runtime::Runtime,
    pub client: EtcdClient,
}

impl Raw {
    pub fn get(&self, key: impl Into<Vec<u8>>) -> Option<KeyValue> {
        let req = medea::store::etcd::rpc::get(key);
        let r = self.rt.block_on(self.client.kv().range(req)).unwrap();
        r.into_inner().kvs.into_iter().next()
    }

    pub fn put(&self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) {
        let req = api::PutRequest {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        };
        self.rt.block_on(self.client.kv().put(req)).unwrap();
    }

    pub fn delete(&self, key: impl Into<Vec<u8>>) {
        let req = api::DeleteRangeRequest {
            key: key.into(),
            ..Default::default()
        };
        self.rt
            .block_on(self.client.kv().delete_range(req))
            .unwrap();
    }
}

impl Raw {
    /// Turn on etcd's authentication (as `etcdctl user add root; etcdctl auth enable` does):
    /// a `root` user with the `root` role and `password`.
    pub fn enable_auth(&self, password: &str) {
        let mut auth = self.client.auth();
        self.rt.block_on(async {
            auth.user_add(api::AuthUserAddRequest {
                name: "root".into(),
                password: password.into(),
                ..Default::default()
            })
            .await
            .unwrap();
            auth.role_add(api::AuthRoleAddRequest {
                name: "root".into(),
            })
            .await
            .unwrap();
            auth.user_grant_role(api::AuthUserGrantRoleRequest {
                user: "root".into(),
                role: "root".into(),
            })
            .await
            .unwrap();
            auth.auth_enable(api::AuthEnableRequest {}).await.unwrap();
        });
    }
}
