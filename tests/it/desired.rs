//! Loading and validating desired state: examples, diagnostics, schemas, git mode.

use crate::fixtures::{copy_dir, git};
use std::path::{Path, PathBuf};

use medea::desired::{self, Source, diagnostic::codes};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn write(dir: &Path, rel: &str, text: &str) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn copy_examples() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(&root().join("examples"), tmp.path());
    tmp
}

fn codes_of(dir: &Path) -> Vec<(String, usize, &'static str)> {
    let loaded = desired::load(&Source::Dir(dir.to_path_buf())).unwrap();
    loaded
        .diagnostics
        .iter()
        .map(|d| (d.origin.file.clone(), d.origin.line, d.code))
        .collect()
}

const CLUSTER: &str = "apiVersion: medea/v1alpha1\nkind: Cluster\nmetadata:\n  name: c1\nspec:\n  kubernetes:\n    version: v1.35.0\n";

fn pool(name: &str, cluster: &str, role: &str, machines: &str, extra: &str) -> String {
    format!(
        "apiVersion: medea/v1alpha1\nkind: NodePool\nmetadata:\n  name: {name}\nspec:\n  cluster: {cluster}\n  role: {role}\n  machines: [{machines}]\n  talos:\n    version: v1.13.9\n{extra}"
    )
}

#[test]
fn examples_are_valid() {
    let loaded = desired::load(&Source::Dir(root().join("examples"))).unwrap();
    assert!(loaded.diagnostics.is_empty(), "{:#?}", loaded.diagnostics);
    let d = &loaded.desired;
    assert_eq!(d.clusters.keys().collect::<Vec<_>>(), ["home", "prod"]);
    let home = &d.clusters["home"];
    assert_eq!(home.pools["controlplane"].machines.len(), 3);
    assert_eq!(home.pools["workers"].machines.len(), 3);
    let prod = &d.clusters["prod"];
    assert_eq!(prod.pools["canary"].machines.len(), 1);
    assert_eq!(prod.pools["workers"].machines.len(), 6);
    assert_eq!(prod.pools["workers"].after[0].value, "canary");
    assert_eq!(
        prod.pools["controlplane"].rollout.max_unavailable, 1,
        "control plane is always 1"
    );
    assert_eq!(
        prod.pools["workers"].rollout.max_unavailable, 2,
        "inherits the cluster default"
    );
    assert_eq!(prod.approvals.control_plane, 2);
    assert_eq!(prod.windows.len(), 1);
    assert!(prod.pools["workers"].installer_image.schematic().is_some());

    let out = crate::cli::medea()
        .args(["validate", "examples/"])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("valid: 2 clusters, 5 node pools"));
}

#[test]
fn every_example_has_a_schema_modeline_matching_its_kinds() {
    let mut checked = 0;
    let mut stack = vec![root().join("examples")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "yaml" && x != "yml") {
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            let first = text.lines().next().unwrap();
            let target = first
                .strip_prefix("# yaml-language-server: $schema=")
                .unwrap_or_else(|| panic!("{} does not start with a schema modeline", p.display()));
            let schema_path = p.parent().unwrap().join(target);
            assert!(
                schema_path.is_file(),
                "{}: modeline points at missing {}",
                p.display(),
                schema_path.display()
            );
            let file = schema_path.file_name().unwrap().to_str().unwrap();
            for line in text.lines().filter(|l| l.starts_with("kind: ")) {
                let kind = line.trim_start_matches("kind: ").trim();
                assert_eq!(
                    desired::schema::file_for_kind(kind),
                    Some(file),
                    "{}: kind {kind}",
                    p.display()
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 4, "only {checked} example files found");
}

#[test]
fn committed_schemas_match_the_code() {
    for (name, text) in desired::schema::all() {
        let path = root().join("schemas").join(name);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == text,
            "schemas/{name} is out of date: run `medea schema --out schemas/`"
        );
    }
}

#[test]
fn broken_example_reports_every_error_with_positions_and_exits_1() {
    let tmp = copy_examples();
    let d = tmp.path();
    let edit = |rel: &str, from: &str, to: &str| {
        let p = d.join(rel);
        let s = std::fs::read_to_string(&p).unwrap();
        assert!(s.contains(from), "{rel} lacks {from:?}");
        std::fs::write(&p, s.replacen(from, to, 1)).unwrap();
    };
    edit(
        "home/cluster.yaml",
        "    drainTimeout: 10m",
        "    drainTimeout: 10m\n    surge: 2",
    );
    edit(
        "prod/pools.yaml",
        "    version: v1.14.6",
        "    version: v1.14",
    );
    edit(
        "home/pools.yaml",
        "  name: workers\nspec:\n  cluster: home",
        "  name: workers\nspec:\n  cluster: homelab",
    );
    let out = crate::cli::medea()
        .args(["validate", "."])
        .current_dir(d)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown field `surge`"), "{stderr}");
    assert!(stderr.contains("home/cluster.yaml:21:5"), "{stderr}");
    assert!(
        stderr.contains("version `v1.14` must have three numeric"),
        "{stderr}"
    );
    assert!(stderr.contains("prod/pools.yaml:14:14"), "{stderr}");
    assert!(
        stderr.contains("refers to cluster `homelab`, which is not defined"),
        "{stderr}"
    );
    assert!(stderr.contains("home/pools.yaml:29:12"), "{stderr}");
    assert!(stderr.contains("3 errors, 0 warnings"), "{stderr}");
    expectorate::assert_contents("tests/it/snapshots/validate-broken.txt", &stderr);
}

#[test]
fn semantic_rules_each_have_their_diagnostic() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write(
        d,
        "cluster.yaml",
        &format!(
            "{CLUSTER}---\n{}",
            CLUSTER.replace(
                "version: v1.35.0",
                "version: v1.35.0\n  rollout:\n    drainTimeout: ten"
            )
        ),
    );
    write(
        d,
        "pools.yaml",
        &[
            pool(
                "cp",
                "c1",
                "controlplane",
                "a, b",
                "  rollout:\n    maxUnavailable: 2\n",
            ),
            pool("w", "c1", "worker", "b, c, c", "  after: [ghost]\n"),
            pool("x", "c1", "worker", "d", "  after: [y]\n"),
            pool("y", "c1", "worker", "e", "  after: [x]\n"),
            pool("empty", "c1", "worker", "", ""),
            pool("img", "c1", "worker", "f", "").replace(
                "version: v1.13.9",
                "version: v1.13.9\n    installerImage: ghcr.io/siderolabs/installer:v1.13.9",
            ),
        ]
        .join("---\n"),
    );
    let got = codes_of(d);
    let want = [
        ("cluster.yaml", 12, codes::DUPLICATE),
        ("cluster.yaml", 17, codes::DURATION),
        ("pools.yaml", 12, codes::CONTROL_PLANE_UNAVAILABLE),
        ("pools.yaml", 21, codes::MACHINE_TWICE), // `b` is in pool cp
        ("pools.yaml", 21, codes::DUPLICATE),     // `c` twice
        ("pools.yaml", 24, codes::MISSING_POOL),
        ("pools.yaml", 48, codes::ORDER), // x → y → x, reported once
        ("pools.yaml", 53, codes::EMPTY_POOL),
        ("pools.yaml", 71, codes::IMAGE),
    ];
    for w in want {
        assert!(
            got.iter().any(|g| (g.0.as_str(), g.1, g.2) == w),
            "missing {w:?} in {got:#?}"
        );
    }
    assert_eq!(got.len(), want.len(), "{got:#?}");
}

#[test]
fn control_plane_after_worker_and_bad_approvals_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write(
        d,
        "c.yaml",
        &format!(
            "{CLUSTER}  approvals:\n    required: 2\n    controlPlane: 1\n  maintenanceWindows:\n    - start: \"0 2 * *\"\n      duration: 4h\n    - start: \"0 2 * * 6\"\n      duration: 4h\n      timeZone: Mars/Olympus\n"
        ),
    );
    write(
        d,
        "p.yaml",
        &[
            pool("w", "c1", "worker", "a", ""),
            pool("cp", "c1", "controlplane", "b", "  after: [w]\n"),
        ]
        .join("---\n"),
    );
    let loaded = desired::load(&Source::Dir(d.to_path_buf())).unwrap();
    let msgs: Vec<String> = loaded.diagnostics.iter().map(|d| d.to_string()).collect();
    assert!(
        msgs.iter()
            .any(|m| m.contains("approvals.controlPlane (1) is lower than approvals.required (2)")),
        "{msgs:#?}"
    );
    assert!(
        msgs.iter()
            .any(|m| m.contains("not a 5-field cron expression")),
        "{msgs:#?}"
    );
    assert!(
        msgs.iter()
            .any(|m| m.contains("unknown time zone `Mars/Olympus`")),
        "{msgs:#?}"
    );
    assert!(
        msgs.iter()
            .any(|m| m.contains("control-plane pool `cp` cannot come after worker pool `w`")),
        "{msgs:#?}"
    );
    assert!(loaded.valid().is_none());
}

#[test]
fn approval_markers_do_not_change_the_revision() {
    let tmp = copy_examples();
    let before = desired::load(&Source::Dir(tmp.path().to_path_buf())).unwrap();
    write(
        tmp.path(),
        "approvals/abc-alice.sig",
        "-----BEGIN SSH SIGNATURE-----\n-----END SSH SIGNATURE-----\n",
    );
    write(tmp.path(), "approvals/notes.yaml", "not: [a resource");
    let after = desired::load(&Source::Dir(tmp.path().to_path_buf())).unwrap();
    assert_eq!(before.desired.revision, after.desired.revision);
    assert!(
        after.diagnostics.is_empty(),
        "approvals/ is not read as resources"
    );
    assert_eq!(after.markers.len(), 1);
    assert_eq!(after.markers[0].path, "approvals/abc-alice.sig");
    // Any resource edit changes it.
    write(tmp.path(), "home/extra.yml", "# just a comment\n");
    let edited = desired::load(&Source::Dir(tmp.path().to_path_buf())).unwrap();
    assert_ne!(before.desired.revision, edited.desired.revision);
}

#[test]
fn git_mode_reads_the_committed_tree_only() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path();
    git(repo, &["init", "-q"]);
    copy_dir(&root().join("examples"), &repo.join("clusters"));
    write(repo, "README.md", "not desired state\n");
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-qm", "initial"]);
    let sha = String::from_utf8(
        crate::fixtures::tool("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(repo)
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    // Uncommitted breakage and an uncommitted marker are ignored in git mode.
    write(repo, "clusters/home/cluster.yaml", "garbage: [\n");
    write(repo, "clusters/approvals/x-bob.sig", "sig");
    let src = Source::Git {
        path: repo.join("clusters"),
        reference: "main".into(),
    };
    let loaded = desired::load(&src).unwrap();
    assert!(loaded.diagnostics.is_empty(), "{:#?}", loaded.diagnostics);
    assert_eq!(loaded.desired.clusters.len(), 2);
    assert_eq!(loaded.desired.revision.commit.as_deref(), Some(sha.trim()));
    assert!(loaded.markers.is_empty());
    // The same files read from a directory give the same content revision.
    let dir = desired::load(&Source::Dir(root().join("examples"))).unwrap();
    assert_eq!(
        dir.desired.revision.content,
        loaded.desired.revision.content
    );

    let out = crate::cli::medea()
        .args(["validate", "--git"])
        .arg(repo.join("clusters"))
        .args(["--ref", "main"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&sha.trim()[..12]));

    let out = crate::cli::medea()
        .args(["validate", "--git"])
        .arg(repo)
        .args(["--ref", "nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("git ref `nope` not found"));
    // Without --git, the directory (with the broken edit) is read as it is.
    let out = crate::cli::medea()
        .args(["validate"])
        .arg(repo.join("clusters"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn unreadable_inputs_are_clear_errors() {
    let out = crate::cli::medea()
        .args(["validate", "/nonexistent/medea"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist or is not a directory"));
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("bin.yaml"), [0xff, 0xfe, b'\n']).unwrap();
    write(tmp.path(), "list.yaml", "- a\n- b\n");
    write(
        tmp.path(),
        "dup.yaml",
        &format!("{CLUSTER}metadata:\n  name: again\n"),
    );
    let loaded = desired::load(&Source::Dir(tmp.path().to_path_buf())).unwrap();
    let msgs: Vec<String> = loaded.diagnostics.iter().map(|d| d.to_string()).collect();
    assert!(
        msgs.iter()
            .any(|m| m
                .starts_with("bin.yaml:1:1: error[medea::desired::file]: file is not valid UTF-8")),
        "{msgs:#?}"
    );
    assert!(
        msgs.iter()
            .any(|m| m.starts_with("list.yaml:1:1: error[medea::desired::syntax]")),
        "{msgs:#?}"
    );
    assert!(
        msgs.iter()
            .any(|m| m.contains("duplicate mapping key") && m.starts_with("dup.yaml:8:1")),
        "{msgs:#?}"
    );
}

/// Issue 19: a symlink in the desired tree (file or directory) is a diagnostic, never followed,
/// and no diagnostic or CLI output shows a byte of a file outside the desired directory.
#[test]
fn symlinks_are_diagnosed_and_never_followed() {
    use std::os::unix::fs::symlink;
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("outside");
    write(&outside, "token", "SECRET-TOKEN-1f2e: [\n");
    write(&outside, "leak.yaml", "SECRET-IN-DIR: [\n");
    let d = tmp.path().join("desired");
    write(&d, "c1.yaml", CLUSTER);
    symlink("../outside/token", d.join("x.yaml")).unwrap();
    symlink("../outside", d.join("linkdir")).unwrap();
    symlink("/proc/self/environ", d.join("env.yaml")).unwrap();
    std::fs::create_dir_all(d.join("approvals")).unwrap();
    symlink("../../outside/token", d.join("approvals/a.sig")).unwrap();

    let loaded = desired::load(&Source::Dir(d.clone())).unwrap();
    let symlinks: Vec<&str> = loaded
        .diagnostics
        .iter()
        .filter(|x| x.code == codes::SYMLINK)
        .map(|x| x.origin.file.as_str())
        .collect();
    assert_eq!(
        symlinks,
        ["approvals/a.sig", "env.yaml", "linkdir", "x.yaml"],
        "{:#?}",
        loaded.diagnostics
    );
    assert!(loaded.has_errors());
    assert!(loaded.markers.is_empty());
    assert!(!loaded.sources.contains_key("x.yaml"));
    for x in &loaded.diagnostics {
        assert!(!format!("{x} {x:?}").contains("SECRET"), "{x:?}");
    }
    let out = crate::cli::medea()
        .arg("validate")
        .arg(&d)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains("is a symbolic link"), "{all}");
    assert!(!all.contains("SECRET"), "{all}");
    assert!(!all.contains("PATH="), "{all}");
}

/// Git mode: a committed symlink (mode 120000) is a diagnostic too.
#[test]
fn git_mode_refuses_committed_symlinks() {
    use std::os::unix::fs::symlink;
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path();
    git(repo, &["init", "-q"]);
    write(repo, "secret.yaml", "SECRET: [\n");
    write(repo, "clusters/c1.yaml", CLUSTER);
    symlink("../secret.yaml", repo.join("clusters/x.yaml")).unwrap();
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-qm", "link"]);
    let loaded = desired::load(&Source::Git {
        path: repo.join("clusters"),
        reference: "main".into(),
    })
    .unwrap();
    let d: Vec<(&str, &str)> = loaded
        .diagnostics
        .iter()
        .map(|x| (x.origin.file.as_str(), x.code))
        .collect();
    assert_eq!(d, [("x.yaml", codes::SYMLINK)], "{:#?}", loaded.diagnostics);
}

fn limit_messages(loaded: &desired::Loaded) -> Vec<String> {
    loaded
        .diagnostics
        .iter()
        .filter(|d| d.code == codes::LIMIT)
        .map(|d| d.to_string())
        .collect()
}

/// Issue 19: bounded reading in git mode: a large committed blob is refused from its header
/// size, and many files stop at the file limit; each names its limit.
#[test]
fn git_mode_reading_is_bounded() {
    use medea::desired::source::limits;
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path();
    git(repo, &["init", "-q"]);
    write(repo, "clusters/c1.yaml", CLUSTER);
    let big = format!("# {}\n", "x".repeat(limits::MAX_FILE_BYTES));
    write(repo, "clusters/big.yaml", &big);
    for i in 0..limits::MAX_FILES {
        write(repo, &format!("clusters/many/f{i:05}.yaml"), "# empty\n");
    }
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-qm", "large"]);
    let loaded = desired::load(&Source::Git {
        path: repo.join("clusters"),
        reference: "main".into(),
    })
    .unwrap();
    let msgs = limit_messages(&loaded);
    assert!(
        msgs.iter()
            .any(|m| m.starts_with("big.yaml:1:1") && m.contains("limit MAX_FILE_BYTES")),
        "{msgs:#?}"
    );
    assert!(
        msgs.iter().any(|m| m.contains("limit MAX_FILES")),
        "{msgs:#?}"
    );
    assert!(loaded.has_errors());
    assert!(loaded.sources.len() <= limits::MAX_FILES);
}

/// Directory mode: documents per file, total bytes and file count.
#[test]
fn directory_mode_reading_is_bounded() {
    use medea::desired::source::limits;
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write(d, "c1.yaml", CLUSTER);
    write(
        d,
        "docs.yaml",
        &"---\na: 1\n".repeat(limits::MAX_DOCUMENTS_PER_FILE + 1),
    );
    let loaded = desired::load(&Source::Dir(d.to_path_buf())).unwrap();
    let msgs = limit_messages(&loaded);
    assert!(
        msgs.iter()
            .any(|m| m.starts_with("docs.yaml:1:1") && m.contains("limit MAX_DOCUMENTS_PER_FILE")),
        "{msgs:#?}"
    );
    // Total bytes: files just under the per-file limit until the total is exceeded.
    let t2 = tempfile::tempdir().unwrap();
    let chunk = format!("# {}\n", "x".repeat(limits::MAX_FILE_BYTES - 8));
    let n = (limits::MAX_TOTAL_BYTES as usize / chunk.len()) + 1;
    for i in 0..n {
        write(t2.path(), &format!("f{i:03}.yaml"), &chunk);
    }
    let loaded = desired::load(&Source::Dir(t2.path().to_path_buf())).unwrap();
    let msgs = limit_messages(&loaded);
    assert!(
        msgs.iter().any(|m| m.contains("limit MAX_TOTAL_BYTES")),
        "{msgs:#?}"
    );
    let read: usize = loaded.sources.values().map(|t| t.len()).sum();
    assert!(read as u64 <= limits::MAX_TOTAL_BYTES);
    // File count.
    let t3 = tempfile::tempdir().unwrap();
    for i in 0..=limits::MAX_FILES {
        write(t3.path(), &format!("f{i:05}.yaml"), "# empty\n");
    }
    let loaded = desired::load(&Source::Dir(t3.path().to_path_buf())).unwrap();
    assert!(
        limit_messages(&loaded)
            .iter()
            .any(|m| m.contains("limit MAX_FILES")),
        "{:#?}",
        loaded.diagnostics
    );
}

/// `git` with `stdin` written to it; its stdout, trimmed.
/// `n` worker pools of cluster `c1` (`p00000` …, one machine each) in files of 500.
fn many_pools(dir: &Path, n: usize) {
    for f in 0..n.div_ceil(500) {
        let docs: Vec<String> = (f * 500..n.min((f + 1) * 500))
            .map(|i| pool(&format!("p{i:05}"), "c1", "worker", &format!("m{i}"), ""))
            .collect();
        write(dir, &format!("pools-{f:02}.yaml"), &docs.join("---\n"));
    }
}

/// Issue #49: a committer cannot stall planning with pools. 1,000 pools in a cluster are
/// valid; the 1,001st is an error located at its name, naming the limit, and the revision
/// yields no plan.
#[test]
fn pools_per_cluster_are_capped() {
    use medea::desired::source::limits;
    let max = limits::MAX_POOLS_PER_CLUSTER;
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "c1.yaml", CLUSTER);
    many_pools(tmp.path(), max);
    let loaded = desired::load(&Source::Dir(tmp.path().to_path_buf())).unwrap();
    assert!(
        loaded.diagnostics.is_empty(),
        "{:#?}",
        &loaded.diagnostics[..1]
    );
    assert_eq!(loaded.desired.clusters["c1"].pools.len(), max);
    many_pools(tmp.path(), max + 1);
    let loaded = desired::load(&Source::Dir(tmp.path().to_path_buf())).unwrap();
    let msgs = limit_messages(&loaded);
    // pools-02.yaml holds the 1,001st pool alone: `name:` is on its line 4.
    assert!(
        msgs.iter().any(|m| m.starts_with("pools-02.yaml:4:")
            && m.contains("cluster `c1` has 1001 node pools")
            && m.contains("limit MAX_POOLS_PER_CLUSTER")),
        "{msgs:#?}"
    );
    assert!(loaded.has_errors() && loaded.valid().is_none());
}

/// Issue #49: documents per revision. 21 files of 1,000 documents: the first document past
/// 20,000 (the first of the 21st file) is an error naming the limit; nothing after it is
/// validated.
#[test]
fn documents_per_revision_are_capped() {
    use medea::desired::source::limits;
    let tmp = tempfile::tempdir().unwrap();
    let per_file = limits::MAX_DOCUMENTS_PER_FILE;
    let files = limits::MAX_DOCUMENTS / per_file + 1;
    for f in 0..files {
        write(
            tmp.path(),
            &format!("f{f:03}.yaml"),
            &"---\na: 1\n".repeat(per_file),
        );
    }
    let loaded = desired::load(&Source::Dir(tmp.path().to_path_buf())).unwrap();
    let msgs = limit_messages(&loaded);
    let last = format!("f{:03}.yaml:", files - 1);
    assert!(
        msgs.iter().any(|m| m.starts_with(&last)
            && m.contains("has 21000 YAML documents")
            && m.contains("limit MAX_DOCUMENTS")),
        "{msgs:#?}"
    );
    // No document of the last file was validated.
    assert!(
        !loaded
            .diagnostics
            .iter()
            .any(|d| d.origin.file.starts_with(&last[..last.len() - 1]) && d.code != codes::LIMIT),
        "a document past the limit was validated"
    );
}

fn git_stdin(dir: &Path, args: &[&str], stdin: &[u8]) -> String {
    use std::io::Write;
    let mut child = crate::fixtures::tool("git")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .current_dir(dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "git {args:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Commit, on `main`, the tree of HEAD with `extra` ls-tree lines added to its root.
fn commit_root_with(repo: &Path, extra: &str) {
    let mut lines = git_stdin(repo, &["ls-tree", "HEAD"], b"");
    lines.push('\n');
    lines.push_str(extra);
    let tree = git_stdin(repo, &["mktree"], lines.as_bytes());
    let commit = git_stdin(
        repo,
        &["commit-tree", &tree, "-p", "HEAD", "-m", "crafted"],
        b"",
    );
    git(repo, &["update-ref", "refs/heads/main", &commit]);
}

/// Issue 32: git mode checks a tree object's size from its header before inflating it: a
/// root tree of more than MAX_TREE_BYTES (one entry with a 9 MiB name, a few KiB packed) is a
/// limit diagnostic, not 9 MiB inflated. Before, the tree was inflated and walked.
#[test]
fn git_mode_checks_a_tree_objects_size_before_inflating_it() {
    use medea::desired::source::limits;
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path();
    git(repo, &["init", "-q"]);
    write(repo, "clusters/c1.yaml", CLUSTER);
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-qm", "c1"]);
    let blob = git_stdin(repo, &["hash-object", "-w", "--stdin"], b"x\n");
    let name = "n".repeat(limits::MAX_TREE_BYTES as usize + 1024);
    commit_root_with(repo, &format!("100644 blob {blob}\t{name}\n"));
    let loaded = desired::load(&Source::Git {
        path: repo.join("clusters"),
        reference: "main".into(),
    })
    .unwrap();
    let msgs = limit_messages(&loaded);
    assert!(
        msgs.iter().any(|m| m.contains("limit MAX_TREE_BYTES")),
        "{msgs:#?}"
    );
    assert!(loaded.has_errors());
}

/// Issue 32: git mode counts every entry of every tree it reads against MAX_ENTRIES — hidden
/// ones and those beside the way to the desired root too. Before, only entries inside the
/// root that were not hidden counted, so a root tree of 100,001 hidden entries was walked in
/// full without a diagnostic.
#[test]
fn git_mode_counts_every_visited_tree_entry() {
    use medea::desired::source::limits;
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path();
    git(repo, &["init", "-q"]);
    write(repo, "clusters/c1.yaml", CLUSTER);
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-qm", "c1"]);
    let blob = git_stdin(repo, &["hash-object", "-w", "--stdin"], b"x\n");
    let extra: String = (0..=limits::MAX_ENTRIES)
        .map(|i| format!("100644 blob {blob}\t.h{i:06}\n"))
        .collect();
    commit_root_with(repo, &extra);
    let loaded = desired::load(&Source::Git {
        path: repo.join("clusters"),
        reference: "main".into(),
    })
    .unwrap();
    let msgs = limit_messages(&loaded);
    assert!(
        msgs.iter().any(|m| m.contains("limit MAX_ENTRIES")),
        "{msgs:#?}"
    );
    assert!(loaded.has_errors());
}
