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
    // issue #52: the edit succeeded, so 0, though its plan has changes (not `plan`'s 2)
    assert_eq!(
        out.status.code(),
        Some(0),
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

/// Run a git command in `dir`, asserting it succeeds.
fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A git repository holding the examples, committed on `main`.
fn repo() -> tempfile::TempDir {
    let tmp = examples_copy();
    git(tmp.path(), &["init", "-q", "-b", "main"]);
    git(tmp.path(), &["add", "."]);
    git(tmp.path(), &["commit", "-qm", "clusters"]);
    tmp
}

/// The last line `medea upgrade` printed, run as the user would paste it into a shell.
fn run_printed_command(text: &str) {
    let cmd = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("git -C "))
        .unwrap_or_else(|| panic!("no git command printed: {text}"));
    let out = std::process::Command::new("sh")
        .args(["-c", cmd])
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.com")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// In git mode medea plans commits only: `medea upgrade` says so and prints the exact commands
/// that commit the edit, which work as printed; with a server that follows a ref, the same
/// without waiting for a plan that would never come.
#[test]
fn in_git_mode_upgrade_prints_the_commit_command_that_works() {
    let tmp = repo();
    let out = crate::cli::medea()
        .args([
            "upgrade",
            "--cluster",
            "home",
            "--talos",
            "v1.13.10",
            "--git-ref",
            "main",
            "--desired",
        ])
        .arg(tmp.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("medea plans commits only"), "{text}");
    run_printed_command(&text);
    let log = git(tmp.path(), &["log", "--format=%s", "-1"]);
    assert_eq!(log.trim(), "upgrade home to Talos v1.13.10");
    assert!(
        git(tmp.path(), &["status", "--porcelain"]).is_empty(),
        "all committed"
    );

    // A server in git mode; the user edits its checkout without --git-ref.
    let s = crate::server::start_git(tmp.path().to_path_buf(), "main");
    let mut c = s.cli();
    c.args([
        "upgrade",
        "--cluster",
        "home",
        "--talos",
        "v1.13.9",
        "--desired",
    ])
    .arg(tmp.path());
    let out = c.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("the server plans commits of `main` only"),
        "{text}"
    );
    // … and the server previews the uncommitted edit (issue #39 item 10): computed against its
    // observations, never stored (its current plan stays what it was).
    assert!(
        text.contains("Preview (computed by the server, not stored, not approvable) of plan"),
        "{text}"
    );
    assert!(text.contains("v1.13.9"), "{text}");
    assert!(text.contains("it cannot be approved"), "{text}");
    let current = |c: &mut std::process::Command| -> serde_json::Value {
        serde_json::from_slice(&c.args(["plan", "-o", "json"]).output().unwrap().stdout)
            .unwrap_or_default()
    };
    let preview_id = text
        .split("of plan ")
        .nth(1)
        .and_then(|t| t.split(':').next())
        .unwrap()
        .to_string();
    assert_ne!(current(&mut s.cli())["shortId"], preview_id.as_str());
    run_printed_command(&text);
    assert!(
        git(tmp.path(), &["status", "--porcelain"]).is_empty(),
        "all committed"
    );
}

/// A server that reads another directory never plans the edit: said at once, with the fix.
#[test]
fn upgrade_says_when_the_server_reads_another_directory() {
    let tmp = examples_copy();
    let s = crate::server::start(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples"),
        vec![crate::server::home_inventory()],
    );
    let mut c = s.cli();
    c.args([
        "upgrade",
        "--cluster",
        "home",
        "--talos",
        "v1.13.10",
        "--desired",
    ])
    .arg(tmp.path());
    let out = c.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("reads its desired state from"), "{text}");
    assert!(text.contains("not "), "{text}");
    assert!(text.contains("Preview (computed by the server"), "{text}");
}

/// `--store PATH` while `medea serve` holds that store (issue #39 item 10): the preview is
/// computed by the server through the API instead of failing on the lock; nothing is stored.
#[test]
fn upgrade_with_a_store_the_server_holds_previews_through_the_server() {
    let tmp = examples_copy();
    let s = crate::server::start(
        tmp.path().to_path_buf(),
        vec![crate::server::home_inventory()],
    );
    let before: serde_json::Value = serde_json::from_slice(
        &s.cli()
            .args(["plan", "-o", "json"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap_or_default();
    let edited = examples_copy();
    let mut c = s.cli();
    c.args([
        "upgrade",
        "--cluster",
        "home",
        "--talos",
        "v1.13.10",
        "--store",
    ])
    .arg(s.state.path().join("store"))
    .arg("--desired")
    .arg(edited.path());
    let out = c.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text}{err}");
    assert!(err.contains("in use by the running server"), "{err}");
    assert!(
        text.contains("Preview (computed by the server, not stored, not approvable)"),
        "{text}"
    );
    assert!(text.contains("v1.13.10"), "{text}");
    // The server's own plan is untouched (it plans its own directory, not the edited copy).
    let after: serde_json::Value = serde_json::from_slice(
        &s.cli()
            .args(["plan", "-o", "json"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap_or_default();
    assert_eq!(before["id"], after["id"]);
}
