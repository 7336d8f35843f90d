//! `medea upgrade`: in-place edits that keep every other byte.

use std::path::{Path, PathBuf};

fn examples_copy() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples");
    for sub in ["home", "prod"] {
        std::fs::create_dir_all(tmp.path().join(sub)).unwrap();
        for f in ["cluster.yaml", "pools.yaml"] {
            std::fs::copy(src.join(sub).join(f), tmp.path().join(sub).join(f)).unwrap();
        }
    }
    tmp
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap()
}

#[test]
fn edits_only_the_version_scalars_of_one_pool() {
    let tmp = examples_copy();
    let before = read(&tmp.path().join("prod/pools.yaml"));
    let out = crate::cli::medea()
        .args([
            "upgrade",
            "--cluster",
            "prod",
            "--pool",
            "canary",
            "--talos",
            "v1.15.0",
            "--desired",
        ])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.starts_with("prod/pools.yaml:28:14: v1.14.6 → v1.15.0\n"),
        "{said}"
    );
    assert_eq!(
        said.lines().filter(|l| l.contains(" → ")).count(),
        1,
        "one edit: {said}"
    );
    let after = read(&tmp.path().join("prod/pools.yaml"));
    let expected = {
        let mut lines: Vec<&str> = before.split_inclusive('\n').collect();
        assert_eq!(lines[27], "    version: v1.14.6\n");
        lines[27] = "    version: v1.15.0\n";
        lines.concat()
    };
    assert_eq!(after, expected, "every other byte is kept");
    let loaded =
        medea::desired::load(&medea::desired::Source::Dir(tmp.path().to_path_buf())).unwrap();
    assert_eq!(
        loaded.desired.clusters["prod"].pools["canary"]
            .talos_version
            .value
            .to_string(),
        "v1.15.0"
    );
    assert_eq!(
        loaded.desired.clusters["prod"].pools["workers"]
            .talos_version
            .value
            .to_string(),
        "v1.14.6"
    );
}

#[test]
fn kubernetes_version_and_refusals() {
    let tmp = examples_copy();
    let out = crate::cli::medea()
        .args([
            "upgrade",
            "--cluster",
            "home",
            "--k8s",
            "v1.36.0",
            "--desired",
        ])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(read(&tmp.path().join("home/cluster.yaml")).contains("    version: v1.36.0\n"));
    let snapshot = (
        read(&tmp.path().join("home/cluster.yaml")),
        read(&tmp.path().join("home/pools.yaml")),
    );
    for (args, msg) in [
        (
            vec!["--cluster", "home", "--talos", "1.13"],
            "must start with `v`",
        ),
        (
            vec!["--cluster", "nope", "--talos", "v1.13.9"],
            "cluster `nope` is not in the desired state",
        ),
        (
            vec!["--cluster", "home", "--pool", "gpu", "--talos", "v1.13.9"],
            "pool `gpu` is not in cluster `home`",
        ),
    ] {
        let out = crate::cli::medea()
            .arg("upgrade")
            .args(&args)
            .arg("--desired")
            .arg(tmp.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(msg),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(
        snapshot,
        (
            read(&tmp.path().join("home/cluster.yaml")),
            read(&tmp.path().join("home/pools.yaml"))
        ),
        "refusals change nothing"
    );
}

#[test]
fn prints_the_resulting_plan_offline_with_store() {
    use medea::store::{Store, Txn};
    let tmp = examples_copy();
    let store_dir = tempfile::tempdir().unwrap();
    {
        let s = medea::store::fjall::FjallStore::open(store_dir.path()).unwrap();
        let c = crate::server::home_inventory();
        s.commit(Txn::new().put_record(medea::inventory::cluster_key(&c.name), &c))
            .unwrap();
    }
    let out = crate::cli::medea()
        .args([
            "upgrade",
            "--cluster",
            "home",
            "--pool",
            "workers",
            "--talos",
            "v1.12.4",
            "--desired",
        ])
        .arg(tmp.path())
        .arg("--store")
        .arg(store_dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("home/pools.yaml:33:14: v1.14.6 → v1.12.4"),
        "{text}"
    );
    assert!(
        text.contains("~ pool controlplane: talos v1.12.4 → v1.14.6"),
        "{text}"
    );
    assert!(
        !text.contains("~ pool workers: talos"),
        "workers are already there: {text}"
    );
}
