//! The database an etcd member of the simulated control plane holds, as `EtcdSnapshot`
//! streams it: a bbolt file ([`super::bbolt`]) laid out as etcd's backend, holding the keys the
//! simulated kube-apiserver stored ([`Keyspace`], from the kube side through
//! [`KeyspaceSource`](super::node::KeyspaceSource)).
//!
//! etcd's schema (etcd-io/etcd `server/storage/schema/bucket.go`, `cindex.go`, `confstate.go`,
//! `version.go`, `membership.go`, `auth.go`; `server/storage/mvcc/revision.go`, `kvstore.go`):
//!
//! - `key`: one entry per revision of a key. The bucket key is the revision, 8-byte big-endian
//!   main revision, `_`, 8-byte big-endian sub revision (the change's place in its
//!   transaction); the value is the `mvccpb.KeyValue` protobuf (`key`, `create_revision`,
//!   `mod_revision`, `version`, `value`, `lease`; `api/mvccpb/kv.proto`);
//! - `meta`: `consistent_index` and `term` (8-byte big-endian: the raft entry last applied),
//!   `confState` (raft's `ConfState` as JSON: the voters), `storageVersion` (since 3.6: `3.6.0`,
//!   `3.7.0` on Talos >= 1.14, [`etcd_of`]), and `finishedCompactRev` / `scheduledCompactRev` (revision bytes) after a compaction;
//! - `cluster`: `clusterVersion`; `members`: each member's id in hex → its JSON (`id`,
//!   `peerURLs`, `name`, `clientURLs`); `auth`: `authRevision` (8-byte big-endian, 1 on a new
//!   cluster: auth never enabled); `lease`, `alarm`, `members_removed`, `authUsers`, `authRoles`:
//!   empty.
//!
//! The simulator's keyspace is the state after a compaction at the current revision (what the
//! kube-apiserver's compactor leaves, `--etcd-compaction-interval`, 5 minutes by default): every
//! live key once, at its newest revision, no tombstones, `finishedCompactRev` = the revision.
//! `etcdutl snapshot status` (and medea's `backup::revision`) report the revision of the
//! last entry of `key`: the newest live key's.

use serde::Serialize;

use super::bbolt::{self, BboltError, Bucket};
use super::node::Keyspace;

/// The storage version of an etcd 3.6 member (what `EtcdStatus` and a snapshot's `meta`
/// bucket report on Talos < 1.14).
pub const STORAGE_VERSION: &str = "3.6.0";

/// The etcd a Talos line runs by default (`DefaultEtcdVersion`, `pkg/machinery/constants`):
/// 3.7 from Talos 1.14 (etcd v3.7.2 in 1.14.4), 3.6 before (v3.6.9 in 1.13, v3.6.14 in
/// 1.12.12): its storage version (`major.minor.0`, etcd `server/storage/schema/version.go`)
/// and the server version `EtcdStatus` reports as the protocol version.
pub fn etcd_of(talos: &crate::version::TalosVersion) -> (&'static str, &'static str) {
    match talos.minor_line() {
        (1, m) if m >= 14 => ("3.7.0", "3.7.2"),
        (1, 13) => (STORAGE_VERSION, "3.6.9"),
        _ => (STORAGE_VERSION, "3.6.14"),
    }
}

/// One member of the simulated etcd cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    pub name: String,
    /// The node's address (peer URL `https://<address>:2380`, client URL `…:2379`).
    pub address: String,
}

/// What one member's database holds.
#[derive(Debug, Clone, Copy)]
pub struct MemberDb<'a> {
    pub keyspace: &'a Keyspace,
    pub members: &'a [Member],
    /// The raft index this member applied last (`consistent_index`).
    pub consistent_index: u64,
    pub term: u64,
    /// The member's storage version (`meta/storageVersion`, [`etcd_of`]).
    pub storage_version: &'a str,
    /// The cluster's version (`cluster/clusterVersion`): the lowest of its members'.
    pub cluster_version: &'a str,
}

/// `mvccpb.KeyValue` (etcd `api/mvccpb/kv.proto`).
#[derive(Clone, PartialEq, prost::Message)]
struct KeyValue {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(int64, tag = "2")]
    create_revision: i64,
    #[prost(int64, tag = "3")]
    mod_revision: i64,
    #[prost(int64, tag = "4")]
    version: i64,
    #[prost(bytes = "vec", tag = "5")]
    value: Vec<u8>,
    #[prost(int64, tag = "6")]
    lease: i64,
}

/// etcd's `membership.Member` as `MustSaveMemberToBackend` marshals it (field order kept).
#[derive(Serialize)]
struct MemberJson<'a> {
    id: u64,
    #[serde(rename = "peerURLs")]
    peer_urls: [String; 1],
    name: &'a str,
    #[serde(rename = "clientURLs")]
    client_urls: [String; 1],
}

/// raft's `ConfState` as etcd stores it (`json.Marshal` of the gogo-protobuf struct).
#[derive(Serialize)]
struct ConfState {
    voters: Vec<u64>,
    auto_leave: bool,
}

/// A revision as etcd's `key` bucket and compaction marks spell it.
pub fn revision_bytes(main: i64, sub: i64) -> Vec<u8> {
    let mut b = Vec::with_capacity(17);
    b.extend_from_slice(&main.to_be_bytes());
    b.push(b'_');
    b.extend_from_slice(&sub.to_be_bytes());
    b
}

fn be(v: u64) -> Vec<u8> {
    v.to_be_bytes().to_vec()
}

fn named(name: &str, mut entries: Vec<(Vec<u8>, Vec<u8>)>) -> Bucket {
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    Bucket {
        name: name.as_bytes().to_vec(),
        entries,
    }
}

/// The `key` bucket: keys ordered by revision; changes sharing a main revision (one
/// transaction) get increasing sub revisions.
fn key_bucket(keyspace: &Keyspace) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut keys: Vec<_> = keyspace.keys.iter().collect();
    keys.sort_by(|a, b| (a.mod_revision, a.key.as_str()).cmp(&(b.mod_revision, b.key.as_str())));
    let mut out = Vec::with_capacity(keys.len());
    let mut last = (i64::MIN, 0i64);
    for k in keys {
        let sub = if k.mod_revision == last.0 {
            last.1 + 1
        } else {
            0
        };
        last = (k.mod_revision, sub);
        let kv = KeyValue {
            key: k.key.as_bytes().to_vec(),
            create_revision: k.create_revision,
            mod_revision: k.mod_revision,
            version: k.version,
            value: k.value.clone(),
            lease: 0,
        };
        out.push((
            revision_bytes(k.mod_revision, sub),
            prost::Message::encode_to_vec(&kv),
        ));
    }
    out
}

/// The member's bbolt database at transaction `consistent_index`, at least `min_len` bytes.
pub fn database(db: &MemberDb<'_>, min_len: usize) -> Result<Vec<u8>, BboltError> {
    let mut meta = vec![
        (b"consistent_index".to_vec(), be(db.consistent_index)),
        (b"term".to_vec(), be(db.term)),
        (
            b"storageVersion".to_vec(),
            db.storage_version.as_bytes().to_vec(),
        ),
    ];
    let mut voters: Vec<u64> = db.members.iter().map(|m| m.id).collect();
    voters.sort_unstable();
    meta.push((
        b"confState".to_vec(),
        serde_json::to_vec(&ConfState {
            voters,
            auto_leave: false,
        })
        .unwrap_or_default(),
    ));
    if db.keyspace.revision > 0 {
        let compacted = revision_bytes(db.keyspace.revision, 0);
        meta.push((b"finishedCompactRev".to_vec(), compacted.clone()));
        meta.push((b"scheduledCompactRev".to_vec(), compacted));
    }
    let members = db
        .members
        .iter()
        .map(|m| {
            let json = MemberJson {
                id: m.id,
                peer_urls: [format!("https://{}:2380", m.address)],
                name: &m.name,
                client_urls: [format!("https://{}:2379", m.address)],
            };
            (
                format!("{:x}", m.id).into_bytes(),
                serde_json::to_vec(&json).unwrap_or_default(),
            )
        })
        .collect();
    let buckets = [
        Bucket {
            name: b"key".to_vec(),
            entries: key_bucket(db.keyspace),
        },
        named("meta", meta),
        named("lease", vec![]),
        named("alarm", vec![]),
        named(
            "cluster",
            vec![(
                b"clusterVersion".to_vec(),
                db.cluster_version.as_bytes().to_vec(),
            )],
        ),
        named("members", members),
        named("members_removed", vec![]),
        named("auth", vec![(b"authRevision".to_vec(), be(1))]),
        named("authUsers", vec![]),
        named("authRoles", vec![]),
    ];
    bbolt::write(&buckets, db.consistent_index, min_len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::node::EtcdKey;

    fn key(k: &str, create: i64, rev: i64) -> EtcdKey {
        EtcdKey {
            key: k.into(),
            value: b"{}".to_vec(),
            create_revision: create,
            mod_revision: rev,
            version: 1 + rev - create,
        }
    }

    #[test]
    fn revisions_order_the_key_bucket_and_share_a_main_revision_by_sub() {
        let ks = Keyspace {
            revision: 12,
            keys: vec![
                key("/registry/b", 3, 11),
                key("/registry/a", 5, 5),
                key("/registry/c", 11, 11),
            ],
        };
        let b = key_bucket(&ks);
        let revs: Vec<Vec<u8>> = b.iter().map(|(k, _)| k.clone()).collect();
        assert_eq!(
            revs,
            vec![
                revision_bytes(5, 0),
                revision_bytes(11, 0),
                revision_bytes(11, 1)
            ]
        );
        let kv: KeyValue = prost::Message::decode(&b[1].1[..]).unwrap();
        assert_eq!(
            (
                kv.key.as_slice(),
                kv.create_revision,
                kv.mod_revision,
                kv.version
            ),
            (&b"/registry/b"[..], 3, 11, 9)
        );
        assert_eq!(
            revision_bytes(0x0102, 3),
            [0, 0, 0, 0, 0, 0, 1, 2, b'_', 0, 0, 0, 0, 0, 0, 0, 3]
        );
    }
}

#[cfg(test)]
mod version_tests {
    use super::etcd_of;
    use crate::version::TalosVersion;

    #[test]
    fn talos_1_14_runs_etcd_3_7_and_older_lines_3_6() {
        let t = |s: &str| etcd_of(&TalosVersion::parse(s).unwrap());
        assert_eq!(t("v1.14.6"), ("3.7.0", "3.7.2"));
        assert_eq!(t("v1.13.9"), ("3.6.0", "3.6.9"));
        assert_eq!(t("v1.12.12").0, "3.6.0");
    }
}
