//! `medea approvals`: marker outcomes against the stored current plan, offline.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use medea::inventory::cluster_key;
use medea::store::fjall::FjallStore;
use medea::store::{Store, Txn};

fn sign(key: &Path, message: &str, namespace: &str) -> Vec<u8> {
    let mut child = crate::fixtures::tool("ssh-keygen")
        .args(["-Y", "sign", "-q", "-n", namespace, "-f"])
        .arg(key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("ssh-keygen is installed");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(message.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    out.stdout
}

fn keygen(dir: &Path, name: &str) -> (PathBuf, String) {
    let key = dir.join(name);
    assert!(
        crate::fixtures::tool("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
            .arg(&key)
            .status()
            .unwrap()
            .success()
    );
    (
        key.clone(),
        std::fs::read_to_string(key.with_extension("pub"))
            .unwrap()
            .trim()
            .to_string(),
    )
}

#[test]
fn lists_each_marker_outcome_and_exits_by_quorum() {
    let tmp = tempfile::tempdir().unwrap();
    let desired = tmp.path().join("desired");
    for sub in ["home"] {
        std::fs::create_dir_all(desired.join(sub)).unwrap();
        for f in ["cluster.yaml", "pools.yaml"] {
            std::fs::copy(
                PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("examples")
                    .join(sub)
                    .join(f),
                desired.join(sub).join(f),
            )
            .unwrap();
        }
    }
    let store_dir = tmp.path().join("store");
    {
        let s = FjallStore::open(&store_dir).unwrap();
        let c = crate::server::home_inventory();
        s.commit(Txn::new().put_record(cluster_key(&c.name), &c))
            .unwrap();
    }
    let out = crate::cli::medea()
        .args(["plan", "-o", "json", "--desired"])
        .arg(&desired)
        .arg("--store")
        .arg(&store_dir)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (id, short) = (
        v["id"].as_str().unwrap().to_string(),
        v["shortId"].as_str().unwrap().to_string(),
    );

    let (alice, alice_pub) = keygen(tmp.path(), "alice");
    let (bob, bob_pub) = keygen(tmp.path(), "bob");
    let (eve, _) = keygen(tmp.path(), "eve");
    let signers = tmp.path().join("allowed_signers");
    std::fs::write(
        &signers,
        format!("alice@example.com {alice_pub}\nbob@example.com {bob_pub}\n"),
    )
    .unwrap();
    std::fs::create_dir_all(desired.join("approvals")).unwrap();
    std::fs::write(
        desired.join(format!("approvals/{short}-alice.sig")),
        sign(&alice, &format!("{id}\n"), "medea-approve"),
    )
    .unwrap();
    std::fs::write(
        desired.join("approvals/eve.sig"),
        sign(&eve, &format!("{id}\n"), "medea-approve"),
    )
    .unwrap();
    std::fs::write(
        desired.join("approvals/git.sig"),
        sign(&bob, &format!("{id}\n"), "git"),
    )
    .unwrap();
    let run = || {
        crate::cli::medea()
            .args(["approvals", "--desired"])
            .arg(&desired)
            .arg("--store")
            .arg(&store_dir)
            .arg("--allowed-signers")
            .arg(&signers)
            .output()
            .unwrap()
    };
    let out = run();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!(
            "marker approvals/{short}-alice.sig: approved plan {short} by alice@example.com"
        )),
        "{text}"
    );
    assert!(
        text.contains("marker approvals/eve.sig: ") && text.contains("unknown key"),
        "{text}"
    );
    assert!(
        text.contains("marker approvals/git.sig: ") && text.contains("namespace"),
        "{text}"
    );
    assert!(text.contains("1 of 2 approvals"), "{text}");
    // bob signs properly: quorum.
    std::fs::write(
        desired.join(format!("approvals/{short}-bob.sig")),
        sign(&bob, &format!("{id}\n"), "medea-approve"),
    )
    .unwrap();
    let out = run();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("quorum reached"), "{text}");
}
