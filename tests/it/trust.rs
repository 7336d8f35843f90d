//! Issue #32, "Trust holes, round 2": a committer alone can make medea send none of its
//! secrets anywhere. Each attack of the issue, refused:
//!
//! - a path to a secret (`bearerTokenFile`, `caFile`) in the desired state is a located error
//!   saying what to write instead (`health::health_errors_are_located`, and here);
//! - a credential is a name the server maps to its own files, read with no symbolic link, as a
//!   regular file, at most 64 KiB, and never sent over plain http
//!   ([`credentials_come_from_the_servers_files_and_tokens_only_go_over_https`]);
//! - `medea doctor` contacts only the sources of the last-applied state
//!   ([`doctor_contacts_only_the_sources_the_last_applied_state_names`]);
//! - end to end, the committer's listener named with the daemon's token file receives nothing
//!   from `doctor` or from an approved rollout
//!   ([`a_committers_listener_gets_no_secret_from_doctor_or_an_approved_rollout`]).
//!
//! The planner's side (sources rendered, settings changes, the bar) is pinned by the unit
//! tests in `src/plan/tests/` (`approvals.rs`) (`moving_a_health_source_is_shown_and_needs_the_highest_bar_in_force`,
//! `every_setting_that_acts_is_a_settings_change`).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use medea::desired::{Source, load};
use medea::health::Probes;
use medea::health::http::Credentials;
use medea::plan::health::{Endpoint, Gate, GateCheck, HealthSources};
use medea::private_file::{ExistingDir, write_private};
use medea::rollout::ports::{GateContext, GateVerdict, HealthProbe as _};

use crate::fixtures::wait;

/// What the listener answers: a Prometheus instant vector with one sample, so every filter
/// gate passes (as the attacker's listener in the issue did).
const PASSING: &str = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"job":"x"},"value":[1700000000,"1"]}]}}"#;

/// The requests a listener received, each as text (headers and body).
type Received = Arc<Mutex<Vec<String>>>;

/// Whether `buf` holds a whole HTTP/1.1 request: its headers and `content-length` bytes of body.
fn request_complete(buf: &[u8]) -> bool {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    buf.len() >= end + 4 + len
}

/// Read one HTTP/1.1 request (headers and a `content-length` body), answer [`PASSING`].
fn exchange(stream: &mut (impl std::io::Read + std::io::Write)) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        if request_complete(&buf) {
            break;
        }
    }
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{PASSING}",
        PASSING.len()
    );
    let _ = stream.write_all(answer.as_bytes());
    let _ = stream.flush();
    String::from_utf8_lossy(&buf).into_owned()
}

/// A committer's plain-TCP listener on loopback: it records every request and answers as a
/// Prometheus whose gates pass. Its thread lives as long as the test process.
struct Listener {
    addr: SocketAddr,
    received: Received,
}

impl Listener {
    fn start() -> Listener {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let received: Received = Arc::default();
        let shared = received.clone();
        std::thread::spawn(move || {
            for stream in l.incoming() {
                let Ok(mut stream) = stream else { continue };
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let req = exchange(&mut stream);
                shared.lock().unwrap().push(req);
            }
        });
        Listener { addr, received }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn received(&self) -> Vec<String> {
        self.received.lock().unwrap().clone()
    }
}

/// An HTTPS listener with its own CA (returned as PEM), recording requests like [`Listener`].
async fn tls_listener() -> (SocketAddr, String, Received) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    let ca_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.distinguished_name.push(DnType::CommonName, "test CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &rcgen::Issuer::new(ca, ca_key))
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf.der().clone()],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received: Received = Arc::default();
    let shared = received.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, shared) = (acceptor.clone(), shared.clone());
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let n = match tls.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    buf.extend_from_slice(&chunk[..n]);
                    if request_complete(&buf) {
                        break;
                    }
                }
                shared
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf).into_owned());
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{PASSING}",
                    PASSING.len()
                );
                let _ = tls.write_all(answer.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (addr, ca_pem, received)
}

fn ctx() -> GateContext {
    GateContext {
        cluster: "home".into(),
        rebooting: Vec::new(),
        own_silences: Vec::new(),
        sources: HealthSources::default(),
    }
}

fn up_gate() -> Gate {
    Gate {
        name: "up".into(),
        dry_run: false,
        consecutive_error_limit: medea::plan::health::DEFAULT_CONSECUTIVE_ERROR_LIMIT,
        on_inconclusive: Default::default(),
        check: GateCheck::Query {
            query: "up == 1".into(),
        },
    }
}

fn prometheus(url: String, credential: Option<&str>) -> HealthSources {
    HealthSources {
        prometheus: Some(Endpoint {
            url,
            credential: credential.map(str::to_string),
        }),
        alertmanager: None,
    }
}

/// A credential is a name: the server's `<dir>/<name>/{token,ca.pem}`. Over https with its
/// CA the token is sent; over plain http it never is; probes without a credentials directory
/// (doctor's unapproved sources) send none; a name that is a path, a linked or oversized
/// token, and `/dev/zero` are refused before anything is sent.
#[tokio::test]
async fn credentials_come_from_the_servers_files_and_tokens_only_go_over_https() {
    let (addr, ca_pem, received) = tls_listener().await;
    let creds = tempfile::tempdir().unwrap();
    let dir = creds.path();
    write_private(
        &dir.join("prom/token"),
        b"s3cret-token\n",
        ExistingDir::Keep,
    )
    .unwrap();
    write_private(
        &dir.join("prom/ca.pem"),
        ca_pem.as_bytes(),
        ExistingDir::Keep,
    )
    .unwrap();
    let url = format!("https://{addr}");
    let probes = |credential: Option<&str>, credentials: Credentials| {
        Probes::new(prometheus(url.clone(), credential))
            .with_credentials(credentials)
            .with_timeout(Duration::from_secs(5))
    };

    // The approved way: the token and the CA from the server's files, over https.
    let e = probes(Some("prom"), Credentials::Dir(dir.to_path_buf()))
        .evaluate(&up_gate(), &ctx())
        .await;
    assert_eq!(e.verdict, GateVerdict::Pass, "{}", e.detail);
    let got = received.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0]
            .to_ascii_lowercase()
            .contains("authorization: bearer s3cret-token\r\n"),
        "{got:?}"
    );
    assert!(!format!("{e:?}").contains("s3cret"));

    // Without a credentials directory nothing is read and nothing is sent.
    let e = probes(Some("prom"), Credentials::None)
        .evaluate(&up_gate(), &ctx())
        .await;
    assert_eq!(e.verdict, GateVerdict::Inconclusive);
    assert!(
        e.detail.contains(
            "the source names credential `prom`, but medea has no credentials for it here"
        ),
        "{}",
        e.detail
    );
    // A name that is a path (a plan stored by hand) never leaves the directory.
    let e = probes(Some("../prom"), Credentials::Dir(dir.to_path_buf()))
        .evaluate(&up_gate(), &ctx())
        .await;
    assert_eq!(e.verdict, GateVerdict::Inconclusive);
    assert!(
        e.detail.contains("is not a credential name"),
        "{}",
        e.detail
    );
    // A credential that does not exist.
    let e = probes(Some("nope"), Credentials::Dir(dir.to_path_buf()))
        .evaluate(&up_gate(), &ctx())
        .await;
    assert!(
        e.detail
            .contains("credential `nope` has neither `token` nor `ca.pem`"),
        "{}",
        e.detail
    );
    // A token that is a symbolic link (to the daemon's API token, say) is refused.
    std::fs::create_dir(dir.join("linked")).unwrap();
    std::os::unix::fs::symlink(dir.join("prom/token"), dir.join("linked/token")).unwrap();
    let e = probes(Some("linked"), Credentials::Dir(dir.to_path_buf()))
        .evaluate(&up_gate(), &ctx())
        .await;
    assert!(e.detail.contains("is a symbolic link"), "{}", e.detail);
    // A token others may read is refused.
    write_private(&dir.join("loose/token"), b"t", ExistingDir::Keep).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(
        dir.join("loose/token"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let e = probes(Some("loose"), Credentials::Dir(dir.to_path_buf()))
        .evaluate(&up_gate(), &ctx())
        .await;
    assert!(e.detail.contains("make it 0600"), "{}", e.detail);
    // A token larger than 64 KiB is refused unread.
    write_private(
        &dir.join("big/token"),
        &vec![b'x'; 65 * 1024],
        ExistingDir::Keep,
    )
    .unwrap();
    let e = probes(Some("big"), Credentials::Dir(dir.to_path_buf()))
        .evaluate(&up_gate(), &ctx())
        .await;
    assert!(
        e.detail.contains("is larger than 65536 bytes"),
        "{}",
        e.detail
    );
    assert_eq!(received.lock().unwrap().len(), 1, "nothing more was sent");

    // Over plain http the token is never sent.
    let plain = Listener::start();
    let e = Probes::new(prometheus(plain.url(), Some("prom")))
        .with_credentials(Credentials::Dir(dir.to_path_buf()))
        .evaluate(&up_gate(), &ctx())
        .await;
    assert_eq!(e.verdict, GateVerdict::Inconclusive);
    assert!(
        e.detail.contains("medea never sends a token in clear"),
        "{}",
        e.detail
    );
    assert!(plain.received().is_empty(), "{:?}", plain.received());
}

/// The desired state names a credential, never a path: the paths of the issue's attack are
/// located errors that say what to write, a credential that looks like a path is refused,
/// and a credential over plain http is an error, not a warning.
#[test]
fn a_path_to_a_secret_in_the_desired_state_is_refused_with_what_to_write_instead() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let cluster = |health: &str| {
        format!(
            "apiVersion: medea/v1alpha1\nkind: Cluster\nmetadata:\n  name: home\nspec:\n  kubernetes:\n    version: v1.35.0\n  health:\n{health}    gates:\n      - name: up\n        query: 'up == 1'\n"
        )
    };
    let diags = |health: &str| {
        std::fs::write(d.join("cluster.yaml"), cluster(health)).unwrap();
        let loaded = load(&Source::Dir(d.to_path_buf())).unwrap();
        loaded
            .diagnostics
            .iter()
            .map(|x| {
                (
                    x.origin.line,
                    x.is_error(),
                    x.message.clone(),
                    x.help.clone().unwrap_or_default(),
                )
            })
            .collect::<Vec<_>>()
    };
    let got = diags(
        "    prometheus: { url: \"http://127.0.0.1:9\", bearerTokenFile: /var/lib/medea/token }\n",
    );
    assert!(
        got.iter().any(|(line, err, m, help)| *line == 9
            && *err
            && m.contains("`health.prometheus.bearerTokenFile` is no longer accepted")
            && help.contains("write `credential: <name>` instead")),
        "{got:#?}"
    );
    let got = diags("    prometheus: { url: \"https://p:9090\", credential: ../../token }\n");
    assert!(
        got.iter()
            .any(|(line, err, m, _)| *line == 9 && *err && m.contains("is not a credential name")),
        "{got:#?}"
    );
    let got = diags("    prometheus: { url: \"http://p:9090\", credential: prom }\n");
    assert!(
        got.iter().any(|(_, err, m, _)| *err
            && m.contains("`health.prometheus.credential` is set but the URL is plain http://")),
        "{got:#?}"
    );
    let got = diags("    prometheus: { url: \"https://p:9090\", credential: prom }\n");
    assert!(got.is_empty(), "{got:#?}");
}

/// Write a desired state with one cluster `home` whose Prometheus is `url`.
fn desired_with_source(dir: &Path, url: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("cluster.yaml"),
        format!(
            "apiVersion: medea/v1alpha1\nkind: Cluster\nmetadata:\n  name: home\nspec:\n  kubernetes:\n    version: v1.35.0\n  health:\n    prometheus: {{ url: \"{url}\" }}\n    gates:\n      - name: up\n        query: 'up == 1'\n"
        ),
    )
    .unwrap();
}

/// `medea doctor --desired` sent the token to whatever the checkout named, with no approval.
/// Now it asks only the sources of the last-applied state (`--store`); a source only the
/// desired state names is listed, not contacted, unless `--contact-unapproved`, and then
/// without credentials.
#[test]
fn doctor_contacts_only_the_sources_the_last_applied_state_names() {
    use medea::plan::AppliedResource;
    use medea::store::fjall::FjallStore;
    use medea::store::{Store as _, Txn};
    let approved = Listener::start();
    let committer = Listener::start();
    let tmp = tempfile::tempdir().unwrap();
    let (applied_dir, desired_dir, store_dir, creds) = (
        tmp.path().join("applied"),
        tmp.path().join("desired"),
        tmp.path().join("store"),
        tmp.path().join("creds"),
    );
    // The last-applied state names the approved source.
    desired_with_source(&applied_dir, &approved.url());
    {
        let loaded = load(&Source::Dir(applied_dir.clone())).unwrap();
        let d = loaded.valid().expect("valid");
        let r = AppliedResource::of_cluster(&d.clusters["home"]);
        let s = FjallStore::open(&store_dir).unwrap();
        s.commit(Txn::new().put_record(r.key.store_key(), &r))
            .unwrap();
    }
    // The committer's desired state names their listener.
    desired_with_source(&desired_dir, &committer.url());
    let doctor = |extra: &[&str]| {
        let out = crate::cli::medea()
            .args(["doctor", "--cluster", "home", "--creds-dir"])
            .arg(&creds)
            .arg("--desired")
            .arg(&desired_dir)
            .args(extra)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // The doctor line of the source at `url`.
    let line = |text: &str, url: &str| -> String {
        text.lines()
            .find(|l| l.contains(" prometheus ") && l.contains(url))
            .unwrap_or_else(|| panic!("no prometheus line for {url}:\n{text}"))
            .trim()
            .to_string()
    };
    // Without a store: nothing is approved, nothing is contacted.
    let text = doctor(&[]);
    let l = line(&text, &committer.url());
    assert!(l.starts_with("skip  prometheus"), "{l}");
    assert!(
        l.ends_with(&format!(
            "{} (no credential): not contacted: only the unapproved desired state names this source (approve a plan that names it, or pass --contact-unapproved to ask it without medea's credentials)",
            committer.url()
        )),
        "{l}"
    );
    assert!(committer.received().is_empty());
    assert!(approved.received().is_empty());
    // With the store: the approved source is asked, the committer's is not.
    let text = doctor(&["--store", store_dir.to_str().unwrap()]);
    let l = line(&text, &approved.url());
    assert!(l.starts_with("ok    prometheus"), "{l}");
    assert!(l.ends_with(": answers `vector(1)`"), "{l}");
    assert!(
        line(&text, &committer.url()).contains("not contacted"),
        "{text}"
    );
    assert_eq!(approved.received().len(), 1);
    assert!(
        committer.received().is_empty(),
        "{:?}",
        committer.received()
    );
    // Asked on purpose: without any credential of medea's.
    let text = doctor(&[
        "--store",
        store_dir.to_str().unwrap(),
        "--contact-unapproved",
    ]);
    assert!(
        line(&text, &committer.url()).ends_with("(unapproved source, asked without credentials)"),
        "{text}"
    );
    let got = committer.received();
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        !got[0].to_ascii_lowercase().contains("authorization"),
        "{got:?}"
    );
}

/// The issue's attack end to end: a commit points the cluster's Prometheus at the
/// committer's listener with the daemon's token file and bumps the workers. The desired state
/// is refused (located error, what to write instead), `doctor` contacts nothing; the
/// committer's best remaining commit (the listener as a source, no path) shows the source in
/// the plan and needs the highest bar, `doctor` still contacts nothing, and after approval
/// the rollout's gate requests carry no credential of medea's.
#[test]
fn a_committers_listener_gets_no_secret_from_doctor_or_an_approved_rollout() {
    const TOKEN: &str = "trust32-daemon-token-0123456789";
    let s = crate::fixtures::serve::serve()
        .token(TOKEN)
        .enable_rollouts()
        .start();
    let (d, desired) = (s.dir.as_path(), s.desired.as_path());
    // The daemon's token, as a file the attacker can name.
    let token_file = s.state.join("token");
    write_private(&token_file, TOKEN.as_bytes(), ExistingDir::Keep).unwrap();
    let listener = Listener::start();
    wait("the first plan", Duration::from_secs(20), || {
        s.plan_json()["state"] == "pending"
    });
    let first = s.plan_json()["id"].as_str().unwrap_or_default().to_string();

    let cluster_file = desired.join("home/cluster.yaml");
    let pools_file = desired.join("home/pools.yaml");
    let cluster = std::fs::read_to_string(&cluster_file).unwrap();
    let pools = std::fs::read_to_string(&pools_file).unwrap();
    assert!(pools.contains("version: v1.14.6"), "{pools}");
    let gate = "    gates:\n      - name: up\n        query: 'up == 1'\n";
    let attack = format!(
        "{cluster}  health:\n    prometheus: {{ url: \"{}\", bearerTokenFile: {} }}\n{gate}",
        listener.url(),
        token_file.display()
    );
    std::fs::write(&cluster_file, &attack).unwrap();
    wait(
        "the attack to be diagnosed",
        Duration::from_secs(20),
        || s.cli().args(["plan"]).output().unwrap().status.code() == Some(1),
    );
    let out = s.cli().args(["plan"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`health.prometheus.bearerTokenFile` is no longer accepted"),
        "{err}"
    );
    assert!(err.contains("credential: <name>"), "{err}");
    let creds = s.state.join("creds");
    let out = crate::cli::medea()
        .args(["doctor", "--creds-dir"])
        .arg(&creds)
        .arg("--desired")
        .arg(desired)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("has errors"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(listener.received().is_empty(), "{:?}", listener.received());

    // What a committer can still write: the listener as a source, without any path.
    std::fs::write(
        &cluster_file,
        format!(
            "{cluster}  health:\n    prometheus: {{ url: \"{}\" }}\n{gate}",
            listener.url()
        ),
    )
    .unwrap();
    wait("the committer's plan", Duration::from_secs(20), || {
        let p = s.plan_json();
        p["state"] == "pending" && p["id"] != first.as_str()
    });
    let plan = s.plan_json();
    let out = s.cli().args(["plan"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "source prometheus: {} (no credential)",
            listener.url()
        )),
        "{text}"
    );
    assert!(
        text.contains("changes where health data and credentials go"),
        "{text}"
    );
    assert_eq!(plan["approvalsRequired"], 2, "{plan}");
    let out = crate::cli::medea()
        .args(["doctor", "--creds-dir"])
        .arg(&creds)
        .arg("--desired")
        .arg(desired)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("not contacted"), "{text}");
    assert!(listener.received().is_empty(), "{:?}", listener.received());

    // Approved by both signers: the gates ask the listener, with no credential of medea's.
    let short = plan["shortId"].as_str().unwrap().to_string();
    for who in ["alice", "bob"] {
        let out = s
            .cli()
            .args(["approve", &short, "--key"])
            .arg(d.join(who))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    wait(
        "the rollout's first gate evaluation",
        Duration::from_secs(60),
        || !listener.received().is_empty(),
    );
    for req in listener.received() {
        let lower = req.to_ascii_lowercase();
        assert!(!lower.contains("authorization"), "{req}");
        assert!(!req.contains(TOKEN), "{req}");
        assert!(req.starts_with("POST /api/v1/query "), "{req}");
    }
    assert!(!s.serve_log().contains(TOKEN));
}

/// Reading a credential is bounded: `/dev/zero` behind a credential's name (only a link can
/// put it there) is refused before a byte is read, within the evaluation's timeout.
#[tokio::test]
async fn dev_zero_as_a_credential_is_refused_quickly() {
    let creds = tempfile::tempdir().unwrap();
    std::fs::create_dir(creds.path().join("zero")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", creds.path().join("zero/token")).unwrap();
    let started = std::time::Instant::now();
    let e = Probes::new(prometheus("https://127.0.0.1:9".into(), Some("zero")))
        .with_credentials(Credentials::Dir(creds.path().to_path_buf()))
        .evaluate(&up_gate(), &ctx())
        .await;
    assert_eq!(e.verdict, GateVerdict::Inconclusive);
    assert!(e.detail.contains("is a symbolic link"), "{}", e.detail);
    assert!(started.elapsed() < Duration::from_secs(1));
    // And directly, without a link: a character device is not a regular file.
    let e = medea::private_file::read_bounded(
        Path::new("/dev/zero"),
        medea::health::http::MAX_CREDENTIAL_FILE,
        medea::private_file::Privacy::Any,
    )
    .unwrap_err();
    assert!(e.to_string().contains("is not a regular file"), "{e}");
}

/// Approval recorded every document as applied even when the job halted before acting, so
/// the next plan showed no diff at all. Now a cluster with steps gets its last-applied records
/// from its job's success: a job halted by its first gate writes none of them, a job that
/// succeeds writes them in the transaction that records its success.
#[tokio::test(start_paused = true)]
async fn only_a_successful_job_records_what_it_applied() {
    use medea::plan::stored::{approval_writes, job_applies};
    use medea::plan::{AppliedResource, LastApplied};
    use medea::rollout::RunOutcome;
    use medea::rollout::fake::{FakeCluster, FakeGate, FakeProbe, MemStore};
    use medea::store::Store;

    use crate::rollout::{
        CLUSTER, FROM, KUBE, TO, World, install, observed, plan, specs, talos_step,
    };
    use crate::rollout_health::policy;

    // The records a plan for this cluster would carry, from a real desired state.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("c.yaml"),
        format!(
            "apiVersion: medea/v1alpha1\nkind: Cluster\nmetadata:\n  name: {CLUSTER}\nspec:\n  kubernetes:\n    version: {KUBE}\n---\napiVersion: medea/v1alpha1\nkind: NodePool\nmetadata:\n  name: workers\nspec:\n  cluster: {CLUSTER}\n  role: worker\n  machines: [w-1]\n  talos:\n    version: {TO}\n"
        ),
    )
    .unwrap();
    let loaded = load(&Source::Dir(tmp.path().to_path_buf())).unwrap();
    let c = &loaded.valid().expect("valid").clusters[CLUSTER];
    let records = vec![
        AppliedResource::of_cluster(c),
        AppliedResource::of_pool(&c.pools["workers"]),
    ];

    for gate_fails in [true, false] {
        let fake = FakeCluster::new(&specs(0, 1, FROM, KUBE));
        let store: Arc<dyn Store> = Arc::new(MemStore::new());
        let obs = observed(&fake);
        let mut p = plan(
            &obs,
            vec![talos_step(&fake, "workers", &[&["w-1"]], TO, 1)],
            7,
        );
        std::sync::Arc::make_mut(&mut p.clusters[0]).health = Some(policy(
            &["app"],
            0,
            10,
            1,
            medea::plan::health::OnFailure::Halt,
        ));
        p.applies.put = records.clone();
        // Approval writes nothing for a cluster with steps; its job carries the records.
        assert!(approval_writes(&p).is_empty(), "{:?}", approval_writes(&p));
        assert_eq!(job_applies(&p, CLUSTER), records);
        let job = install(store.as_ref(), &p, &obs, &[]).unwrap();
        let w = World {
            fake,
            store,
            job,
            dir: tempfile::tempdir().unwrap(),
        };
        w.fake.edit(|s| {
            s.gates.insert(
                "app".to_string(),
                FakeGate {
                    fail: gate_fails,
                    ..FakeGate::default()
                },
            );
        });
        let out = w
            .executor()
            .with_probe(FakeProbe(w.fake.clone()))
            .run(&w.job)
            .await
            .unwrap();
        let applied: LastApplied = medea::ops::replan::load_applied(w.store.as_ref()).unwrap();
        if gate_fails {
            assert!(matches!(out, RunOutcome::Halted { .. }), "{out:?}");
            assert!(
                applied.resources.is_empty(),
                "a job halted before acting applied nothing: {:?}",
                applied.resources.keys()
            );
        } else {
            assert!(matches!(out, RunOutcome::Succeeded), "{out:?}");
            assert_eq!(
                applied.resources.values().cloned().collect::<Vec<_>>(),
                records,
                "the job's success records what it applied"
            );
        }
    }
}
