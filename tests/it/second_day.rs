//! Issue #52 item 4: README's "Your own simulated cluster in five commands", run command by
//! command as written there. The block is read from README.md, so the README cannot drift from
//! what works: each line runs in `bash` in an empty directory, a line that ends in `&` stays in
//! the background (and is waited for as its step says: the simulator's `ready` line and pods,
//! the server answering), an `export` holds for the lines after it, and `<plan-id>` is the id
//! the line before printed. What the test sets around it, as a reader's machine has it: `medea`
//! on the PATH, a HOME with an ed25519 key, and a free port for the API (`MEDEA_LISTEN`,
//! `MEDEA_ADDR`) so the test runs beside others.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::fixtures::{Kill, free_port, tool, wait};

const SECTION: &str = "## Your own simulated cluster in five commands";

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap()
}

/// The commands of the section's `sh` block, one per line.
fn commands(readme: &str) -> Vec<String> {
    let at = readme
        .find(SECTION)
        .unwrap_or_else(|| panic!("README.md has no section `{SECTION}`"));
    let rest = &readme[at..];
    let start = rest.find("```sh\n").expect("a ```sh block in the section") + 6;
    let end = rest[start..].find("```").expect("the block ends") + start;
    rest[start..end]
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// The environment of a reader's shell: `medea` on the PATH, `home` as HOME, the API on
/// `addr`, nothing of the test's own medea settings.
fn shell(dir: &Path, home: &Path, addr: &str, exports: &[String], line: &str) -> Command {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_medea"));
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut c = Command::new("bash");
    let mut script = exports.join("\n");
    script.push('\n');
    script.push_str(line);
    c.arg("-c")
        .arg(script)
        .current_dir(dir)
        .env("PATH", path)
        .env("HOME", home)
        .env("NO_COLOR", "1")
        .env("MEDEA_LISTEN", addr)
        .env("MEDEA_ADDR", addr);
    for v in [
        "MEDEA_TOKEN",
        "MEDEA_TOKEN_FILE",
        "MEDEA_CA",
        "MEDEA_STATE_DIR",
        "MEDEA_CONFIG",
        "MEDEA_CONTEXT",
        "MEDEA_STORE",
        "MEDEA_DESIRED",
        "XDG_CONFIG_HOME",
        "RUST_LOG",
    ] {
        c.env_remove(v);
    }
    c
}

/// A background line, in its own process group so that it and what it started stop together.
struct Background(Kill);

impl Drop for Background {
    fn drop(&mut self) {
        let pgid = self.0.0.id() as i32;
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{pgid}")])
            .status();
    }
}

fn run_to_end(mut c: Command, line: &str, limit: Duration) -> String {
    use std::os::unix::process::CommandExt as _;
    let mut child = Kill(
        c.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let stderr = child.0.stderr.take().unwrap();
    let out = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap_or_default());
    let err = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let pgid = child.0.id() as i32;
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{pgid}")])
                .status();
            panic!("`{line}` did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    assert!(
        status.success(),
        "`{line}` failed ({status}):\n{out}\n{err}"
    );
    format!("{out}{err}")
}

#[test]
fn the_readme_second_day_runs_command_for_command_as_written() {
    crate::fixtures::require_tool("kubectl");
    let text = readme();
    let lines = commands(&text);
    assert!(lines.len() >= 5, "{lines:#?}");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("work");
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    assert!(
        tool("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "you", "-f"])
            .arg(home.join(".ssh/id_ed25519"))
            .status()
            .unwrap()
            .success()
    );
    let addr = format!("127.0.0.1:{}", free_port());
    let mut exports: Vec<String> = Vec::new();
    let mut background: Vec<Background> = Vec::new();
    let mut plan_id: Option<String> = None;
    let mut said = String::new();
    for line in &lines {
        let mut run = line.clone();
        if run.contains("<plan-id>") {
            let id = plan_id.clone().unwrap_or_else(|| {
                // `medea upgrade` waits a few seconds for the server's plan; on a loaded
                // machine the reader asks `medea plan`, as step 4 says
                let mut id = String::new();
                wait("the server's plan", Duration::from_secs(60), || {
                    let out = shell(&dir, &home, &addr, &exports, "medea plan -o json")
                        .output()
                        .unwrap();
                    let v: serde_json::Value =
                        serde_json::from_slice(&out.stdout).unwrap_or_default();
                    id = v["shortId"].as_str().unwrap_or_default().to_string();
                    v["hasChanges"] == true
                });
                id
            });
            run = run.replace("<plan-id>", &id);
        }
        if let Some(bg) = run.strip_suffix('&') {
            use std::os::unix::process::CommandExt as _;
            let log = dir.join(format!("background-{}.log", background.len()));
            let child = shell(&dir, &home, &addr, &exports, bg.trim_end())
                .stdout(std::fs::File::create(&log).unwrap())
                .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
                .process_group(0)
                .spawn()
                .unwrap();
            background.push(Background(Kill(child)));
            if bg.contains("medea sim") {
                wait(
                    "the simulator's ready line",
                    Duration::from_secs(60),
                    || {
                        std::fs::read_to_string(&log)
                            .unwrap_or_default()
                            .lines()
                            .any(|l| l.starts_with("ready"))
                    },
                );
                crate::fixtures::serve::wait_for_pods_ready(&dir);
            }
            if bg.contains("medea serve") {
                // the reader's next line exports MEDEA_STATE_DIR; until then, ask with it set
                let state = bg
                    .split("--state-dir ")
                    .nth(1)
                    .and_then(|r| r.split_whitespace().next())
                    .expect("the server's --state-dir");
                let ask = format!("MEDEA_STATE_DIR={state} medea get server");
                let mut last;
                let started = Instant::now();
                while !{
                    let out = shell(&dir, &home, &addr, &exports, &ask).output().unwrap();
                    last = String::from_utf8_lossy(&out.stderr).into_owned();
                    out.status.success()
                } {
                    assert!(
                        started.elapsed() < Duration::from_secs(60),
                        "the server did not answer: {last}\n{}",
                        std::fs::read_to_string(log.with_extension("err")).unwrap_or_default()
                    );
                    std::thread::sleep(Duration::from_millis(250));
                }
            }
            continue;
        }
        let out = run_to_end(
            shell(&dir, &home, &addr, &exports, &run),
            &run,
            Duration::from_secs(600),
        );
        if let Some(id) = out
            .lines()
            .find_map(|l| l.split("Approve with: medea approve ").nth(1))
        {
            plan_id = Some(id.trim().to_string());
        }
        for part in run.split("&&") {
            if let Some(e) = part.trim().strip_prefix("export ") {
                exports.push(format!("export {e}"));
            }
        }
        said.push_str(&out);
    }
    // The last line followed the job to its end: it succeeded.
    assert!(
        said.contains("rollout succeeded") || said.contains(": succeeded"),
        "{said}"
    );
    assert!(
        plan_id.is_some(),
        "`medea upgrade` showed the plan to approve:\n{said}"
    );
    let out = shell(&dir, &home, &addr, &exports, "medea rollout list -o json")
        .output()
        .unwrap();
    let jobs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(jobs[0]["state"], "succeeded", "{jobs}");
    drop(background);
}

/// The allowed_signers example of README.md and `examples/approvals/README.md` is one line the
/// server reads: principal, `namespaces="medea-approve"`, key.
#[test]
fn the_allowed_signers_examples_parse() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in ["README.md", "examples/approvals/README.md"] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let line = text
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with("alice@example.com namespaces=\"medea-approve\" ssh-ed25519 "))
            .unwrap_or_else(|| panic!("{file} has no allowed_signers example line"));
        let (signers, problems) = medea::approval::allowed_signers::parse(line);
        assert!(problems.is_empty(), "{file}: {problems:?}");
        assert_eq!(signers.entries().len(), 1, "{file}");
        assert_eq!(
            signers.entries()[0].principals(),
            "alice@example.com",
            "{file}"
        );
    }
}
