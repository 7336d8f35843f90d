use std::process::Command;

pub fn medea() -> Command {
    Command::new(env!("CARGO_BIN_EXE_medea"))
}

#[test]
fn completions_are_generated_for_bash() {
    let out = medea().args(["completions", "bash"]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("_medea()"), "{text}");
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
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("signed plan"), "{stdout}");
    assert!(stdout.contains("(2 of 2)"), "{stdout}");
    assert!(stdout.contains(": succeeded"), "{stdout}");
    let table: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("NODE  ROLE"))
        .skip(1)
        .take(6)
        .collect();
    assert_eq!(table.len(), 6, "{stdout}");
    for row in table {
        assert!(
            row.contains("v1.13.9") && row.contains("v1.35.0"),
            "not on target: {row}"
        );
        assert!(
            row.ends_with("yes    no"),
            "not ready or still cordoned: {row}"
        );
    }
}
