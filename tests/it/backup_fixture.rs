//! What the backup tests share (`backup::`, `backup_s3::`): timestamps and checksums, the
//! operator's decryption, cluster `prod`'s settings and applied desired state, the server's API
//! over a store, and the operator's restore of a backup into a real etcd.

use std::path::Path;
use std::sync::Arc;

use medea::backup::{self, BackupError};
use medea::desired::backup::{BackupSchedule, BackupSettings, Recipient, Retention};
use medea::rollout::fake::MemStore;
use medea::store::{Op, Store, StoreError, Table, Txn};

use crate::rollout_sim::Sim;

pub(crate) fn ts(s: &str) -> jiff::Timestamp {
    s.parse().unwrap()
}

pub(crate) fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// Decrypt a backup as its recipient `id` would.
pub(crate) fn decrypt(bytes: &[u8], id: &age::x25519::Identity) -> Vec<u8> {
    use std::io::Read as _;
    let d = age::Decryptor::new(bytes).unwrap();
    let mut r = d
        .decrypt(std::iter::once(id as &dyn age::Identity))
        .unwrap();
    let mut out = Vec::new();
    r.read_to_end(&mut out).unwrap();
    out
}

/// Settings for `recipients`, daily at 03:00 UTC, to `destination`.
pub(crate) fn settings(recipients: &[&age::x25519::Identity], destination: &str) -> BackupSettings {
    BackupSettings {
        schedule: BackupSchedule::new("0 3 * * *", "UTC").unwrap(),
        retention: Retention::default(),
        destination: destination.into(),
        recipients: recipients
            .iter()
            .map(|i| Recipient::parse(&i.to_public().to_string()).unwrap())
            .collect(),
    }
}

/// Put `spec.backup` (the YAML under `backup:`) as the applied settings of cluster `prod`, and
/// the simulator's machines as its inventory: what an approved plan and a refresh leave.
pub(crate) fn apply(store: &dyn Store, sim: &Sim, backup_yaml: &str) {
    let doc = format!(
        "apiVersion: medea/v1alpha1\nkind: Cluster\nmetadata:\n  name: prod\nspec:\n  kubernetes:\n    version: v1.34.1\n  backup:\n{backup_yaml}"
    );
    let loaded = medea::desired::parse_snapshot(medea::desired::Snapshot {
        files: vec![medea::desired::source::SourceFile {
            path: "prod.yaml".into(),
            bytes: doc.as_bytes().to_vec().into(),
        }],
        markers: Vec::new(),
        commit: None,
        refused: Vec::new(),
    });
    assert!(!loaded.has_errors(), "{:#?}", loaded.diagnostics);
    let c = &loaded.desired.clusters["prod"];
    let r = medea::plan::applied::AppliedResource::of_cluster(c);
    let obs = sim.observed();
    store
        .commit(
            Txn::new()
                .put_record(r.key.store_key(), &r)
                .put_record(medea::inventory::cluster_key("prod"), &obs),
        )
        .unwrap();
}

/// `recipients:` entries for `ids` (under `backup:`).
pub(crate) fn key_yaml(ids: &[&age::x25519::Identity]) -> String {
    ids.iter()
        .map(|i| format!("      - {}\n", i.to_public()))
        .collect()
}

/// The server's API over `store`, reaching the simulator with its credentials, its state under
/// `dir/state`, webhooks to `hook`.
pub(crate) fn api(
    store: Arc<dyn Store>,
    sim: &Sim,
    dir: &Path,
    hook: Option<String>,
) -> medea::server::api::MedeaApi {
    let mut shared = medea::server::Shared::new(
        store,
        medea::desired::Source::Dir(dir.join("desired")),
        false,
        "replica-a".into(),
    );
    shared.creds_dir = sim.creds.clone();
    shared.state_dir = dir.join("state");
    if let Some(url) = hook {
        shared.notifier = medea::webhook::Notifier::start(vec![url]);
    }
    medea::server::api::MedeaApi {
        shared: Arc::new(shared),
    }
}

/// What the operator finds restoring a decrypted backup `plain` with the upstream tools
/// (`etcdctl snapshot status`, `etcdctl snapshot restore`, an etcd started on it), checked
/// against its recorded `revision`: the snapshot's revision is the recorded one, the restored
/// etcd holds the simulated cluster's objects (its Nodes among them), its newest key is at that
/// revision and its own revision is not older. The number of keys; `None` when etcd is not
/// installed.
pub(crate) fn restores_at_the_recorded_revision(
    dir: &Path,
    plain: &[u8],
    revision: i64,
) -> Option<usize> {
    let etcdctl = crate::fixtures::tool_or_skip("etcdctl")?;
    let work = tempfile::tempdir_in(dir).unwrap();
    let snap = work.path().join("restored.snapshot");
    std::fs::write(&snap, plain).unwrap();
    let status =
        crate::sim_etcd::etcdctl_json(&etcdctl, None, &["snapshot", "status", snap.to_str()?]);
    assert_eq!(status["revision"].as_i64(), Some(revision), "{status}");
    let etcd = crate::etcd_harness::Etcd::restored(&snap)?;
    let (at, kvs) = crate::sim_etcd::all_keys(&etcdctl, &etcd.endpoint);
    assert!(
        kvs.iter().any(|k| k.0.starts_with("/registry/minions/")),
        "the cluster's Nodes: {:?}",
        kvs.iter().map(|k| &k.0).collect::<Vec<_>>()
    );
    let newest = kvs.iter().map(|k| k.2).max();
    assert_eq!(
        newest,
        Some(revision),
        "the newest key is at the recorded revision"
    );
    assert!(at >= revision, "etcd at {at}, recorded {revision}");
    Some(kvs.len())
}

/// One schedule pass of the leader (`backup::pass`) over the simulator's cluster `prod`,
/// writing to `dirs`.
pub(crate) async fn run_pass(
    store: &dyn Store,
    fence: Option<&medea::store::Fence>,
    sim: &Sim,
    dirs: &backup::Dirs,
    now: &str,
    recovered: &mut std::collections::BTreeSet<String>,
) -> Result<backup::PassReport, BackupError> {
    let creds = sim.creds.clone();
    backup::pass(
        store,
        fence,
        dirs,
        |cluster| medea::talos::adapter::TalosAdapter::from_creds(&creds, cluster),
        ts(now),
        recovered,
    )
    .await
}

/// Whether `txn` writes a backup's record (`backup/…` in the backups table).
pub(crate) fn records_a_backup(txn: &Txn) -> bool {
    txn.ops
        .iter()
        .any(|op| matches!(op, Op::Put(Table::Backups, k, _) if k.starts_with("backup/")))
}

/// A store that refuses the transaction recording a backup with `refusal`'s error; everything
/// else goes to the inner store.
pub(crate) struct RefusesRecord {
    pub(crate) inner: Arc<MemStore>,
    refusal: fn() -> StoreError,
}

impl Store for RefusesRecord {
    fn get(&self, table: Table, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(table, key)
    }
    fn scan(&self, table: Table, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.inner.scan(table, prefix)
    }
    fn commit(&self, txn: Txn) -> Result<(), StoreError> {
        if records_a_backup(&txn) {
            return Err((self.refusal)());
        }
        self.inner.commit(txn)
    }
}

/// A store that fails the transaction recording a backup, as a crash right after the file was
/// written would: the intent is durable, the record is not.
pub(crate) fn crash_before_record() -> RefusesRecord {
    RefusesRecord {
        inner: Arc::new(MemStore::new()),
        refusal: || StoreError::Backend {
            op: "commit",
            err: "the process died here".into(),
        },
    }
}

/// The store as a deposed leader sees it: its term ended while it streamed, so the fenced
/// transaction recording the backup is refused (what etcd answers to a stale fence).
pub(crate) fn deposed_at_record(shared: Arc<MemStore>) -> RefusesRecord {
    RefusesRecord {
        inner: shared,
        refusal: || StoreError::Fenced {
            replica: "replica-a".into(),
            term: 7,
        },
    }
}

/// Replica a's view of the store: when a's pass records its backup, its term ends first —
/// a resigns and b wins the election — so the real etcd refuses a's fenced record write.
pub(crate) struct FailoverAtRecord {
    inner: Arc<medea::store::etcd::EtcdStore>,
    a: medea::store::Leadership,
    b_store: Arc<medea::store::etcd::EtcdStore>,
    b: std::sync::Mutex<Option<(medea::store::Leadership, medea::store::Fence)>>,
}

impl Store for FailoverAtRecord {
    fn get(&self, table: Table, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(table, key)
    }
    fn scan(&self, table: Table, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.inner.scan(table, prefix)
    }
    fn commit(&self, txn: Txn) -> Result<(), StoreError> {
        if records_a_backup(&txn) && self.b.lock().unwrap().is_none() {
            let won = std::thread::scope(|s| {
                s.spawn(|| {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    rt.block_on(async {
                        self.a.resign().await;
                        let b = self
                            .b_store
                            .campaign("b", std::time::Duration::from_secs(3));
                        let fence =
                            tokio::time::timeout(std::time::Duration::from_secs(60), b.leading())
                                .await
                                .expect("b leads within a minute");
                        (b, fence)
                    })
                })
                .join()
                .unwrap()
            });
            *self.b.lock().unwrap() = Some(won);
        }
        self.inner.commit(txn)
    }
}

impl FailoverAtRecord {
    /// Replica a's view: `inner` is a's store client, `a` its leadership; `b_store` the store
    /// client replica b campaigns with.
    pub(crate) fn new(
        inner: Arc<medea::store::etcd::EtcdStore>,
        a: medea::store::Leadership,
        b_store: Arc<medea::store::etcd::EtcdStore>,
    ) -> FailoverAtRecord {
        FailoverAtRecord {
            inner,
            a,
            b_store,
            b: std::sync::Mutex::new(None),
        }
    }

    /// Replica b's leadership and fence, once it won the election.
    pub(crate) fn b_won(&self) -> (medea::store::Leadership, medea::store::Fence) {
        self.b.lock().unwrap().take().expect("b won the election")
    }
}
