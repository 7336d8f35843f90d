//! The simulator's etcd snapshot is a database the real etcd opens (`sim::etcd` over
//! `sim::bbolt`): read by `etcdctl snapshot status`, restored by `etcdctl snapshot restore`, and
//! served by an etcd started on it, holding exactly the objects the simulated kube-apiserver
//! stored, at their revisions. The real etcd is the only judge of the format here.

use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use medea::rollout::ports::TalosPort as _;
use medea::sim::kube::KubeSimConfig;
use medea::sim::node::Keyspace;
use medea::sim::talos::{Effect, Method, Trigger};
use serde_json::{Value, json};

use crate::rollout_sim::{Sim, adapters, fault, node};

/// `etcdctl <args> -w json` (against `endpoint` when given), parsed.
pub(crate) fn etcdctl_json(etcdctl: &Path, endpoint: Option<&str>, args: &[&str]) -> Value {
    let mut cmd = std::process::Command::new(etcdctl);
    cmd.env("ETCDCTL_API", "3");
    if let Some(e) = endpoint {
        cmd.args(["--endpoints", &format!("http://{e}")]);
    }
    let out = cmd.args(args).args(["-w", "json"]).output().unwrap();
    assert!(
        out.status.success(),
        "etcdctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// One key as etcd serves it: `(key, create_revision, mod_revision, version, value)`.
pub(crate) type Kv = (String, i64, i64, i64, Vec<u8>);

/// Every key of a running etcd and the revision its answer carries.
pub(crate) fn all_keys(etcdctl: &Path, endpoint: &str) -> (i64, Vec<Kv>) {
    let v = etcdctl_json(etcdctl, Some(endpoint), &["get", "", "--from-key"]);
    let revision = v["header"]["revision"].as_i64().unwrap();
    let kvs = v["kvs"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|kv| {
            let b64 = |f: &str| BASE64.decode(kv[f].as_str().unwrap_or("")).unwrap();
            (
                String::from_utf8(b64("key")).unwrap(),
                kv["create_revision"].as_i64().unwrap(),
                kv["mod_revision"].as_i64().unwrap(),
                kv["version"].as_i64().unwrap(),
                b64("value"),
            )
        })
        .collect();
    (revision, kvs)
}

/// The revision of the newest key: what `etcdutl snapshot status` reports for a snapshot of it.
pub(crate) fn newest(ks: &Keyspace) -> i64 {
    ks.keys.iter().map(|k| k.mod_revision).max().unwrap_or(0)
}

/// A snapshot of `member` together with the keyspace it holds: snapshots until the kube side
/// did not change while one was taken (its controllers run on their own).
async fn snapshot_of(sim: &Sim, member: &str, dest: &Path) -> Keyspace {
    let (talos, _kube) = adapters(sim).await;
    for _ in 0..100 {
        let before = sim.kube.keyspace();
        talos.etcd_snapshot(&node(sim, member), dest).await.unwrap();
        if sim.kube.keyspace() == before {
            return before;
        }
    }
    panic!("the simulated kube-apiserver never stood still for a snapshot")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_etcd_snapshot_is_a_database_the_real_etcd_restores_and_serves() {
    let Some(etcdctl) = crate::fixtures::tool_or_skip("etcdctl") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 3, 1, KubeSimConfig::default()).await;
    // Enough objects that etcd's `key` bucket is a tree of branch pages over many leaves, and
    // one object larger than a page (a leaf with overflow pages).
    for i in 0..300 {
        sim.kube
            .create(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": format!("cm-{i:03}"), "namespace": "default"},
                "data": {"v": "x".repeat(2000)},
            }))
            .unwrap();
    }
    sim.kube
        .create(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "large", "namespace": "kube-system"},
            "data": {"v": "y".repeat(20_000)},
        }))
        .unwrap();
    let snap = dir.path().join("cp-1.snapshot");
    let ks = snapshot_of(&sim, "cp-1", &snap).await;
    assert!(ks.keys.len() > 300, "{}", ks.keys.len());
    let plain = std::fs::read(&snap).unwrap();
    assert!(plain.len() > 300 * 2000 && plain.len() % 512 == 32);

    // etcd's own reader: the revision of the newest key, which medea's reader also finds.
    let status = etcdctl_json(
        &etcdctl,
        None,
        &["snapshot", "status", snap.to_str().unwrap()],
    );
    assert_eq!(status["revision"].as_i64(), Some(newest(&ks)), "{status}");
    assert_eq!(medea::backup::revision::revision(&plain), Ok(newest(&ks)));

    // Restored and served: exactly the stored objects, with their revisions.
    let Some(etcd) = crate::etcd_harness::Etcd::restored(&snap) else {
        return;
    };
    let (revision, kvs) = all_keys(&etcdctl, &etcd.endpoint);
    assert_eq!(revision, ks.revision, "etcd's revision is the apiserver's");
    let mut want: Vec<Kv> = ks
        .keys
        .iter()
        .map(|k| {
            (
                k.key.clone(),
                k.create_revision,
                k.mod_revision,
                k.version,
                k.value.clone(),
            )
        })
        .collect();
    want.sort();
    assert_eq!(kvs.len(), want.len());
    assert!(
        kvs == want,
        "the restored keys differ from the stored objects"
    );
    // The kube-apiserver's layout: Nodes under `minions`, namespaced objects under their
    // namespace, stored without a resourceVersion (the key's mod_revision is it).
    let cp1 = kvs
        .iter()
        .find(|k| k.0 == "/registry/minions/cp-1")
        .expect("the node cp-1");
    let obj: Value = serde_json::from_slice(&cp1.4).unwrap();
    assert_eq!(obj["kind"], "Node");
    assert_eq!(obj["metadata"]["name"], "cp-1");
    assert!(obj["metadata"].get("resourceVersion").is_none(), "{obj}");
    assert!(
        kvs.iter()
            .any(|k| k.0 == "/registry/configmaps/default/cm-042")
    );
    assert!(
        kvs.iter()
            .any(|k| k.0 == "/registry/configmaps/kube-system/large")
    );
    // The restored database takes writes (bbolt grows its tree and frees pages).
    let put = etcdctl_json(
        &etcdctl,
        Some(&etcd.endpoint),
        &["put", "/after/restore", "v"],
    );
    assert_eq!(put["header"]["revision"].as_i64(), Some(ks.revision + 1));
    drop(etcd);

    // A member whose database is mostly free pages (a busier cluster's size) restores the same.
    sim.talos
        .set_fault(fault(
            "cp-2",
            Trigger::call(Method::EtcdSnapshot),
            Effect::LargeSnapshot {
                db_bytes: 3 * 1024 * 1024,
            },
        ))
        .unwrap();
    let large = dir.path().join("cp-2.snapshot");
    let ks2 = snapshot_of(&sim, "cp-2", &large).await;
    assert_eq!(
        std::fs::metadata(&large).unwrap().len(),
        3 * 1024 * 1024 + 32
    );
    let status = etcdctl_json(
        &etcdctl,
        None,
        &["snapshot", "status", large.to_str().unwrap()],
    );
    assert_eq!(status["revision"].as_i64(), Some(newest(&ks2)), "{status}");
    let etcd = crate::etcd_harness::Etcd::restored(&large).unwrap();
    let (revision, kvs) = all_keys(&etcdctl, &etcd.endpoint);
    assert_eq!((revision, kvs.len()), (ks2.revision, ks2.keys.len()));
}
