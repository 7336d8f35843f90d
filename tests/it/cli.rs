use std::process::Command;

/// The binary, never reading the client configuration of whoever runs the tests (a test that
/// wants one sets `MEDEA_CONFIG` itself).
pub fn medea() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_medea"));
    c.env("MEDEA_CONFIG", "/nonexistent/medea-tests/config.yaml")
        .env_remove("MEDEA_CONTEXT");
    c
}

#[test]
fn completions_are_generated_for_bash() {
    let out = medea().args(["completions", "bash"]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("_medea()"), "{text}");
}

/// The CLI shows an error's cause as its own link of the chain (miette's `source` chain), not
/// flattened into the outer message with `": {e}"`.
#[test]
fn errors_show_their_cause_chain() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"").unwrap();
    let out = medea()
        .args(["man", "--out"])
        .arg(file.join("sub"))
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    let outer = lines
        .iter()
        .position(|l| l.contains("cannot create") && l.contains("a-file/sub"))
        .unwrap_or_else(|| panic!("no outer message: {err}"));
    assert!(
        !lines[outer].contains("Not a directory"),
        "the cause is flattened into the message: {err}"
    );
    assert!(
        lines[outer + 1..]
            .iter()
            .any(|l| l.contains("Not a directory")),
        "the cause is not shown: {err}"
    );
}

/// A failed connection keeps the transport error as the cause link under the CLI's own words,
/// with the hint, instead of flattening the chain into one line.
#[test]
fn connection_errors_show_their_cause_chain() {
    let out = medea()
        .args(["get", "clusters", "--insecure", "--addr", "127.0.0.1:1"])
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    let outer = lines
        .iter()
        .position(|l| l.contains("cannot reach medea at 127.0.0.1:1"))
        .unwrap_or_else(|| panic!("no outer message: {err}"));
    assert!(
        !lines[outer].contains("refused"),
        "the cause is flattened into the message: {err}"
    );
    assert!(
        lines[outer + 1..].iter().any(|l| l.contains("refused")),
        "the cause is not shown: {err}"
    );
    assert!(err.contains("medea serve"), "the hint is lost: {err}");
}

#[test]
fn man_pages_are_generated_for_every_command() {
    let tmp = tempfile::tempdir().unwrap();
    let out = medea()
        .args(["man", "--out"])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let main = std::fs::read_to_string(tmp.path().join("medea.1")).unwrap();
    assert!(main.contains(".TH medea 1"), "{main}");
    assert!(tmp.path().join("medea-validate.1").exists());
    assert!(tmp.path().join("medea-serve.1").exists());
}

#[test]
fn version_names_the_git_sha_and_profile() {
    let out = medea().arg("--version").output().unwrap();
    let v = String::from_utf8(out.stdout).unwrap();
    assert!(
        v.starts_with(&format!("medea {} (git ", env!("CARGO_PKG_VERSION"))),
        "{v}"
    );
    assert!(v.contains(", debug)") || v.contains(", release)"), "{v}");
}

#[test]
fn every_command_help_has_examples() {
    let out = medea().arg("--help").output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    let commands: Vec<String> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter(|l| !l.starts_with("   ")) // wrapped description lines
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect();
    assert!(commands.len() >= 5, "{help}");
    let mut missing = Vec::new();
    for c in &commands {
        let out = medea().args([c.as_str(), "--help"]).output().unwrap();
        if !String::from_utf8_lossy(&out.stdout).contains("Examples:") {
            missing.push(c.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "commands whose --help has no examples: {missing:?}"
    );
}

/// The README's main command, end to end: simulator, seeded store, server, two approvals,
/// the whole rollout (Talos on every node, then Kubernetes), every machine on target.
#[test]
fn medea_demo_approve_runs_the_rollout_to_completion() {
    let out = medea()
        .args(["demo", "--approve"])
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert_demo_finished(&out);
}

/// What `medea demo --approve` printed says the rollout finished: two signatures, the job
/// succeeded, one readable line per event, and every machine on target, Ready and uncordoned.
pub fn assert_demo_finished(out: &std::process::Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("signed plan"), "{stdout}");
    assert!(stdout.contains("(2 of 2)"), "{stdout}");
    assert!(stdout.contains(": succeeded"), "{stdout}");
    // Without a TTY the rollout view is one readable line per event: a time to the second,
    // the node (or cluster), what happened; pulls name their image; no line twice in a row.
    let timed: Vec<&str> = stdout
        .lines()
        .filter(|l| {
            let b = l.as_bytes();
            b.len() > 9 && b[2] == b':' && b[5] == b':' && b[8] == b' '
        })
        .collect();
    assert!(timed.len() >= 6, "{stdout}");
    for l in &timed {
        assert!(!l.contains(" - ") && !l.contains("intended"), "{l}");
    }
    assert!(
        timed
            .iter()
            .any(|l| l.contains("pulling ") && l.contains("installer")),
        "{stdout}"
    );
    assert!(
        timed
            .iter()
            .any(|l| l.contains("upgraded to v1.14.6, Ready (")),
        "{stdout}"
    );
    for w in timed.windows(2) {
        assert_ne!(w[0][9..], w[1][9..], "a repeated line:\n{stdout}");
    }
    let table: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("NODE  ROLE"))
        .skip(1)
        .take(6)
        .collect();
    assert_eq!(table.len(), 6, "{stdout}");
    for row in table {
        assert!(
            row.contains("v1.14.6") && row.contains("v1.35.8"),
            "not on target: {row}"
        );
        assert!(
            row.ends_with("yes    no"),
            "not ready or still cordoned: {row}"
        );
    }
}

/// The non-TTY rollout view: one readable line per meaningful event, pulls naming their
/// image, no placeholder columns, no repeated lines, times to the second (UTC here; local time
/// in use).
#[test]
fn rollout_progress_without_a_tty_reads_as_one_line_per_event() {
    use medea::api::pb;
    use medea::cli::rollout::EventLines;
    let node = |n: &str, state: &str| pb::NodeProgress {
        node: n.into(),
        pool: if n.starts_with("cp") {
            "controlplane"
        } else {
            "workers"
        }
        .into(),
        step: "1".into(),
        state: state.into(),
    };
    let job = |done: u32| pb::Rollout {
        job_id: "1a2b3c4d5e6f-home".into(),
        plan_id: "1a2b3c4d5e6f".into(),
        cluster: "home".into(),
        state: "running".into(),
        halt_reason: String::new(),
        halt_code: String::new(),
        nodes_total: 6,
        nodes_done: done,
        current_step: "step 1: talos controlplane v1.12.11 → v1.13.9".into(),
        created_at: "2026-12-03T12:00:00Z".into(),
        nodes: vec![
            node("cp-1", "running"),
            node("cp-2", "pending"),
            node("w-1", "pending"),
        ],
        ..Default::default()
    };
    let ev = |sec: u32, node: &str, op: &str, state: &str, message: &str, image: &str| {
        pb::RolloutEvent {
            job_id: "1a2b3c4d5e6f-home".into(),
            cluster: "home".into(),
            pool: "controlplane".into(),
            node: node.into(),
            step: op.into(),
            state: state.into(),
            message: message.into(),
            at: format!("2026-12-03T12:03:{sec:02}.391Z"),
            step_number: 1,
            steps_total: 3,
            image: image.into(),
            halt_code: String::new(),
            detail: String::new(),
        }
    };
    let installer = "ghcr.io/siderolabs/installer:v1.13.9";
    let events = [
        (ev(0, "", "", "progress", "step 0 started", ""), 0),
        (
            ev(0, "cp-1", "etcd-snapshot", "intended", "attempt 1", ""),
            0,
        ),
        (ev(1, "cp-1", "etcd-snapshot", "done", "", ""), 0),
        (ev(1, "cp-1", "pull", "intended", "attempt 1", installer), 0),
        // The same intent seen again (a resumed observation): not printed twice.
        (ev(1, "cp-1", "pull", "intended", "attempt 1", installer), 0),
        (ev(2, "cp-1", "pull", "done", "", installer), 0),
        (ev(2, "cp-1", "cordon", "intended", "attempt 1", ""), 0),
        (ev(2, "cp-1", "drain", "intended", "attempt 1", ""), 0),
        (
            ev(3, "cp-1", "upgrade", "intended", "attempt 1", installer),
            0,
        ),
        (
            ev(
                4,
                "cp-1",
                "upgrade",
                "unknown",
                "connection reset",
                installer,
            ),
            0,
        ),
        (
            ev(5, "cp-1", "upgrade", "intended", "attempt 2", installer),
            0,
        ),
        (ev(9, "", "", "waiting", "cp-1 is rebooting", ""), 0),
        (ev(9, "", "", "waiting", "cp-1 is rebooting", ""), 0),
        (
            ev(
                12,
                "",
                "",
                "progress",
                "cp-1: back on v1.13.9, healthy and Ready",
                "",
            ),
            0,
        ),
        (ev(12, "cp-1", "uncordon", "intended", "attempt 1", ""), 1),
        (ev(12, "", "", "progress", "step 0 done", ""), 1),
        (ev(13, "", "", "progress", "job succeeded", ""), 6),
        (ev(13, "", "", "succeeded", "", ""), 6),
    ];
    let mut lines = EventLines::new(jiff::tz::TimeZone::UTC);
    let mut out = String::new();
    for (e, done) in &events {
        if let Some(l) = lines.line(e, &job(*done)) {
            out.push_str(&l);
            out.push('\n');
        }
    }
    expectorate::assert_contents("tests/it/snapshots/rollout_progress_no_tty.txt", &out);
    for l in out.lines() {
        assert!(!l.contains(" - "), "a placeholder column: {l}");
        assert!(!l.contains("intended"), "{l}");
    }
    let all: Vec<&str> = out.lines().collect();
    let mut dedup = all.clone();
    dedup.dedup();
    assert_eq!(all, dedup, "a repeated line");
    assert!(out.contains(&format!("cp-1  pulling {installer}")), "{out}");
    assert!(
        out.contains("12:03:12 cp-1  upgraded to v1.13.9, Ready (1/6 node upgrades, step 1/3)"),
        "{out}"
    );
}

/// Every duration flag takes the one grammar of `src/duration.rs` and says so when refused.
#[test]
fn duration_flags_share_one_grammar() {
    for (args, bad) in [
        (&["serve", "--refresh-interval"][..], "1d"),
        (&["serve", "--leader-ttl"][..], "10 s"),
        (&["talos", "health", "--wait-timeout"][..], "later"),
    ] {
        let out = medea().args(args).arg(bad).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("invalid duration `{bad}`")) && err.contains("`1h30m`"),
            "{args:?}: {err}"
        );
    }
}

/// `medea schema | head -1` and `medea completions bash | head -1`: a reader that goes away
/// ends the command quietly with SIGPIPE's status, never a panic with a backtrace hint.
#[test]
fn a_closed_pipe_ends_a_command_quietly() {
    for args in [
        vec!["schema"],
        vec!["completions", "bash"],
        vec!["validate", "examples/"],
    ] {
        // The read end is closed before the command starts, so its first write fails.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = medea()
            .args(&args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!err.contains("RUST_BACKTRACE"), "{args:?}: {err}");
        assert_eq!(out.status.code(), Some(141), "{args:?}: {err}");
    }
}
