//! `medea approvals`: marker outcomes against the stored current plan, offline.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use medea::inventory::cluster_key;
use medea::store::fjall::FjallStore;
use medea::store::{Store, Txn};

pub(crate) fn sign(key: &Path, message: &str, namespace: &str) -> Vec<u8> {
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

/// `medea approvals` offline: every marker's outcome for the desired dir, store and signers.
fn approvals(desired: &Path, store: &Path, signers: &Path) -> std::process::Output {
    crate::cli::medea()
        .args(["approvals", "--desired"])
        .arg(desired)
        .arg("--store")
        .arg(store)
        .arg("--allowed-signers")
        .arg(signers)
        .output()
        .unwrap()
}

pub(crate) fn keygen(dir: &Path, name: &str) -> (PathBuf, String) {
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

/// The `home` example planned offline into a fjall store under `tmp`: (desired dir, store
/// dir, full plan id, short id).
fn planned(tmp: &Path) -> (PathBuf, PathBuf, String, String) {
    let desired = tmp.join("desired");
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
    let store_dir = tmp.join("store");
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
    (
        desired,
        store_dir,
        v["id"].as_str().unwrap().to_string(),
        v["shortId"].as_str().unwrap().to_string(),
    )
}

#[test]
fn lists_each_marker_outcome_and_exits_by_quorum() {
    let tmp = tempfile::tempdir().unwrap();
    let (desired, store_dir, id, short) = planned(tmp.path());
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
    let run = || approvals(&desired, &store_dir, &signers);
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

/// Issue 19: with `approvals: {required: 1, controlPlane: 2}` applied, a commit that only lowers
/// `controlPlane` to 1 is a settings-only plan that still needs two distinct people (real
/// `ssh-keygen` signers); so does lowering `required`, deleting the block and deleting the
/// cluster.
#[test]
fn lowering_any_approval_setting_needs_the_highest_bar_in_force() {
    use medea::desired::{Source, load};
    use medea::plan::AppliedResource;

    let tmp = tempfile::tempdir().unwrap();
    let cluster = |name: &str, approvals: &str| {
        format!(
            "apiVersion: medea/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\nspec:\n  kubernetes:\n    version: v1.34.1\n{approvals}"
        )
    };
    let pools = "apiVersion: medea/v1alpha1\nkind: NodePool\nmetadata:\n  name: cp\nspec:\n  cluster: home\n  role: controlplane\n  machines: [cp-1, cp-2, cp-3]\n  talos:\n    version: v1.12.4\n---\napiVersion: medea/v1alpha1\nkind: NodePool\nmetadata:\n  name: w\nspec:\n  cluster: home\n  role: worker\n  machines: [w-1, w-2, w-3]\n  talos:\n    version: v1.12.4\n";
    let write_desired = |dir: &Path, approvals: &str| {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("cluster.yaml"), cluster("home", approvals)).unwrap();
        std::fs::write(dir.join("pools.yaml"), pools).unwrap();
    };
    let (alice, alice_pub) = keygen(tmp.path(), "alice");
    let (bob, bob_pub) = keygen(tmp.path(), "bob");
    let signers = tmp.path().join("allowed_signers");
    std::fs::write(
        &signers,
        format!("alice@example.com {alice_pub}\nbob@example.com {bob_pub}\n"),
    )
    .unwrap();

    let in_force = "  approvals:\n    required: 1\n    controlPlane: 2\n";
    let strict = "  approvals:\n    required: 2\n    controlPlane: 3\n";
    let cases: [(&str, &str, &str, u32); 4] = [
        (
            "lower-controlplane",
            in_force,
            "  approvals:\n    required: 1\n    controlPlane: 1\n",
            2,
        ),
        (
            "lower-required",
            strict,
            "  approvals:\n    required: 1\n    controlPlane: 3\n",
            3,
        ),
        ("delete-block", strict, "", 3),
        ("delete-cluster", in_force, "DELETE", 2),
    ];
    for (name, applied, next, want) in cases {
        let case = tmp.path().join(name);
        let desired = case.join("desired");
        write_desired(&desired, applied);
        let store_dir = case.join("store");
        {
            let s = FjallStore::open(&store_dir).unwrap();
            let c = crate::server::home_inventory();
            let loaded = load(&Source::Dir(desired.clone())).unwrap();
            let d = loaded.valid().expect("valid desired state");
            let mut txn = Txn::new().put_record(cluster_key(&c.name), &c);
            for cl in d.clusters.values() {
                let r = AppliedResource::of_cluster(cl);
                txn = txn.put_record(r.key.store_key(), &r);
                for p in cl.pools.values() {
                    let r = AppliedResource::of_pool(p);
                    txn = txn.put_record(r.key.store_key(), &r);
                }
            }
            s.commit(txn).unwrap();
        }
        // The commit that changes the bar.
        if next == "DELETE" {
            // The cluster goes; another one (never applied, not observed) stays in the tree.
            std::fs::write(desired.join("cluster.yaml"), cluster("other", "")).unwrap();
            std::fs::remove_file(desired.join("pools.yaml")).unwrap();
        } else {
            write_desired(&desired, next);
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
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["approvalsRequired"], want, "{name}: {v:#}");
        let steps = v["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["steps"].as_array().map_or(0, Vec::len))
            .sum::<usize>();
        assert_eq!(steps, 0, "{name}: settings-only");
        let text = crate::cli::medea()
            .args(["plan", "--desired"])
            .arg(&desired)
            .arg("--store")
            .arg(&store_dir)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(
            text.contains(&format!("It needs {want} approvals")),
            "{name}: {text}"
        );
        let (id, short) = (
            v["id"].as_str().unwrap().to_string(),
            v["shortId"].as_str().unwrap().to_string(),
        );
        std::fs::create_dir_all(desired.join("approvals")).unwrap();
        std::fs::write(
            desired.join(format!("approvals/{short}-alice.sig")),
            sign(&alice, &format!("{id}\n"), "medea-approve"),
        )
        .unwrap();
        let run = || approvals(&desired, &store_dir, &signers);
        let out = run();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{name}: one person alone: {stdout}"
        );
        assert!(
            stdout.contains(&format!("1 of {want} approvals")),
            "{name}: {stdout}"
        );
        if want == 2 {
            std::fs::write(
                desired.join(format!("approvals/{short}-bob.sig")),
                sign(&bob, &format!("{id}\n"), "medea-approve"),
            )
            .unwrap();
            let out = run();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert_eq!(out.status.code(), Some(0), "{name}: {stdout}");
            assert!(stdout.contains("quorum reached"), "{name}: {stdout}");
        }
    }
}

/// Issue 34: one reader of `allowed_signers`. A file with one bad line is refused by
/// `medea approvals`, `medea approve --allowed-signers` and `medea serve` alike, in the same
/// words (`path:line:col: message`). Before, `medea approvals` only warned and went on
/// counting the good lines, a file the server refused to start with.
#[test]
fn every_command_refuses_a_signers_file_with_one_bad_line_in_the_same_words() {
    let tmp = tempfile::tempdir().unwrap();
    let (desired, store_dir, id, short) = planned(tmp.path());
    let (alice, alice_pub) = keygen(tmp.path(), "alice");
    let (_, bob_pub) = keygen(tmp.path(), "bob");
    let signers = tmp.path().join("allowed_signers");
    std::fs::write(
        &signers,
        format!("alice@example.com {alice_pub}\nbob@example.com cert-authority {bob_pub}\n"),
    )
    .unwrap();
    // alice's marker: with the good line alone it would count.
    std::fs::create_dir_all(desired.join("approvals")).unwrap();
    std::fs::write(
        desired.join(format!("approvals/{short}-alice.sig")),
        sign(&alice, &format!("{id}\n"), "medea-approve"),
    )
    .unwrap();
    let want = crate::sim_cluster::flat(
        format!(
            "the allowed signers file `{p}` has errors (a trust root is used whole or not at all): \
             {p}:2:17: `cert-authority` is not supported by medea: list each signer's own public \
             key instead of a certificate authority",
            p = signers.display()
        )
        .as_bytes(),
    );

    let offline = approvals(&desired, &store_dir, &signers);
    let approve = crate::cli::medea()
        .args(["approve", &id, "--key"])
        .arg(&alice)
        .arg("--allowed-signers")
        .arg(&signers)
        .args(["--output", "-"])
        .env_remove("SSH_AUTH_SOCK")
        .output()
        .unwrap();
    let serve = crate::cli::medea()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--token",
            "t0ken-for-tests",
            "--desired",
        ])
        .arg(&desired)
        .arg("--state-dir")
        .arg(tmp.path().join("state"))
        .arg("--allowed-signers")
        .arg(&signers)
        .output()
        .unwrap();
    for (what, out) in [
        ("medea approvals", &offline),
        ("medea approve", &approve),
        ("medea serve", &serve),
    ] {
        let err = crate::sim_cluster::flat(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{what}: {err}");
        assert!(err.contains(&want), "{what}:\n{err}\nwant:\n{want}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("approved"),
            "{what} counted a signer of the refused file"
        );
    }
}
