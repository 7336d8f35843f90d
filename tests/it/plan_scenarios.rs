//! Planner scenarios as scripted transcripts, after omicron's reconfigurator-cli: each
//! `tests/it/scenarios/NAME.cmds` is a script run in a fresh directory, and its transcript must
//! match `tests/it/snapshots/scenarios/NAME.txt` (expectorate; after an intended change,
//! `EXPECTORATE=overwrite cargo test --all-features --test it plan_scenarios` and review the
//! diff). A scenario reads like what an operator types; a new one is a script, an expected
//! transcript and a line in [`SCENARIOS`].
//!
//! A script is one command a line:
//!
//! - `# …`: a comment, copied to the transcript (say what the next command shows);
//! - `write PATH`, then the file's lines, then a line `end`: writes PATH (under the directory);
//! - `replace PATH OLD NEW`: replaces every `OLD` in PATH with `NEW` (each one word);
//! - `medea ARGS…`: runs medea in the directory (arguments split at spaces, no quoting); the
//!   transcript shows the command, its exit status, stdout and stderr.

use std::path::Path;

use crate::output_snapshots::{Normalise, medea, run, transcript};

/// Every script in `tests/it/scenarios/`, by name; each has a test below.
const SCENARIOS: [&str; 4] = ["exclusions", "multi-hop", "settings-only", "skew-refusal"];

/// Runs the script `name` and returns its transcript.
fn play(name: &str) -> String {
    let script = std::fs::read_to_string(format!("tests/it/scenarios/{name}.cmds")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let n = Normalise::new().path(dir, "<dir>");
    let mut out = String::new();
    let mut lines = script.lines().enumerate();
    while let Some((i, line)) = lines.next() {
        let at = format!("{name}.cmds:{}", i + 1);
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            [] => out.push('\n'),
            [first, ..] if first.starts_with('#') => {
                out.push_str(line);
                out.push('\n');
            }
            ["write", path] => {
                let mut text = String::new();
                loop {
                    let (_, l) = lines
                        .next()
                        .unwrap_or_else(|| panic!("{at}: `write {path}` has no `end`"));
                    if l == "end" {
                        break;
                    }
                    text.push_str(l);
                    text.push('\n');
                }
                let file = dir.join(path);
                std::fs::create_dir_all(file.parent().unwrap()).unwrap();
                std::fs::write(&file, text).unwrap();
                out.push_str(&format!("> write {path}\n"));
            }
            ["replace", path, old, new] => {
                let file = dir.join(path);
                let text = std::fs::read_to_string(&file)
                    .unwrap_or_else(|e| panic!("{at}: cannot read {path}: {e}"));
                assert!(text.contains(old), "{at}: no `{old}` in {path}");
                std::fs::write(&file, text.replace(old, new)).unwrap();
                out.push_str(&format!("> {line}\n"));
            }
            ["medea", args @ ..] => {
                let mut c = medea();
                c.args(args).current_dir(dir);
                let o = run(c);
                out.push_str(&transcript(&words.join(" "), &o, &n));
            }
            _ => panic!("{at}: not a script command: {line}"),
        }
    }
    out
}

fn scenario(name: &str) {
    assert!(SCENARIOS.contains(&name), "{name} is listed in SCENARIOS");
    expectorate::assert_contents(
        format!("tests/it/snapshots/scenarios/{name}.txt"),
        &play(name),
    );
}

/// A pool three Talos minors behind goes hop by hop (the newest patch of each minor on the
/// way); a nearer target takes fewer hops.
#[test]
fn multi_hop() {
    scenario("multi-hop");
}

/// Kubernetes moves one minor at a time and only to a minor the Talos each node will run
/// supports; both refusals point at the version in the YAML, and the plan that follows the
/// advice upgrades Talos before Kubernetes.
#[test]
fn skew_refusal() {
    scenario("skew-refusal");
}

/// Versions the cluster already runs: the plan has no rollout, only settings that take effect
/// when it is applied.
#[test]
fn settings_only() {
    scenario("settings-only");
}

/// Maintenance exclusions (issue #36): the plan lists what each one holds (`noMinorUpgrades`
/// lets a patch through, holds a minor hop), one in force blocks approval until its end, and
/// bad exclusions are refused with located errors.
#[test]
fn exclusions() {
    scenario("exclusions");
}

/// The scripts on disk and [`SCENARIOS`] are the same set (a script without a test never runs).
#[test]
fn every_script_has_a_test() {
    let mut on_disk: Vec<String> = std::fs::read_dir(Path::new("tests/it/scenarios"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .map(|f| {
            f.strip_suffix(".cmds")
                .unwrap_or_else(|| panic!("tests/it/scenarios/{f} is not a .cmds script"))
                .to_string()
        })
        .collect();
    on_disk.sort();
    assert_eq!(on_disk, SCENARIOS);
}
