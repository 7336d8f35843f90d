//! `medea plan` as a whole process against libyaml parsing the same files.
//!
//! The reference is PyYAML's `CSafeLoader` (libyaml's C parser and scanner, building plain
//! Python objects): it reads every desired-state file the plan reads (all documents) and the
//! inventory JSON (JSON is YAML, so libyaml parses it too). Rounds alternate the two processes so
//! each ratio compares runs taken side by side. Two ratios are reported: against the whole
//! Python process (start-up included, like `medea plan`'s) and against the parse alone, timed
//! inside Python (the stricter one).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use super::BenchError;
use super::stats::Samples;

/// The reference parser: every YAML file under argv[1] (sorted, all documents) and the JSON file
/// argv[2], each parsed with libyaml through PyYAML. Prints the parse time in nanoseconds and
/// the number of documents.
const LIBYAML_SCRIPT: &str = r#"
import os, sys, time, yaml
loader = yaml.CSafeLoader
root, inventory = sys.argv[1], sys.argv[2]
paths = []
for d, _, names in os.walk(root):
    paths += [os.path.join(d, n) for n in names if n.endswith(('.yaml', '.yml'))]
paths.sort()
start = time.perf_counter_ns()
docs = 0
for p in paths:
    with open(p, 'rb') as f:
        docs += sum(1 for _ in yaml.load_all(f, Loader=loader))
with open(inventory, 'rb') as f:
    yaml.load(f, Loader=loader)
    docs += 1
print(time.perf_counter_ns() - start, docs)
"#;

#[derive(Debug, Clone)]
pub struct ProcessOptions {
    /// The medea binary whose `plan` command is measured.
    pub medea: PathBuf,
    /// The Python interpreter that has PyYAML built with libyaml.
    pub python: PathBuf,
    pub rounds: usize,
}

#[derive(Debug)]
pub struct ProcessReport {
    /// `medea plan --desired D --observed I`, wall time of the whole process (ms).
    pub plan: Samples,
    /// The Python process parsing the same files, wall time (ms).
    pub python: Samples,
    /// The parse alone, timed inside Python (ms).
    pub parse: Samples,
    /// Per-round `plan / python` and `plan / parse`.
    pub ratio_process: Samples,
    pub ratio_parse: Samples,
    /// Documents libyaml parsed (desired-state documents + the inventory).
    pub documents: usize,
    /// Peak RSS of one `medea plan` run, from GNU time (`/usr/bin/time -f %M`) when installed.
    pub plan_peak_rss_kib: Option<u64>,
}

fn spawn_err(what: &str) -> impl FnOnce(std::io::Error) -> BenchError + '_ {
    move |err| BenchError::Spawn {
        what: what.to_string(),
        err,
    }
}

fn plan_command(medea: &Path, desired: &Path, inventory: &Path) -> Command {
    let mut c = Command::new(medea);
    c.arg("plan")
        .arg("--desired")
        .arg(desired)
        .arg("--observed")
        .arg(inventory)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

/// One `medea plan` run: its wall time in ms. Exit 0 (no changes) and 2 (changes planned) are
/// both a plan; anything else is a failure with its stderr.
fn run_plan(o: &ProcessOptions, desired: &Path, inventory: &Path) -> Result<f64, BenchError> {
    let start = Instant::now();
    let out = plan_command(&o.medea, desired, inventory)
        .output()
        .map_err(spawn_err("medea plan"))?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    match out.status.code() {
        Some(0 | 2) => Ok(ms),
        _ => Err(BenchError::Process {
            what: format!(
                "`medea plan` exited with {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        }),
    }
}

/// One Python run: (whole process ms, parse ms, documents).
fn run_python(
    o: &ProcessOptions,
    desired: &Path,
    inventory: &Path,
) -> Result<(f64, f64, usize), BenchError> {
    let start = Instant::now();
    let out = Command::new(&o.python)
        .arg("-c")
        .arg(LIBYAML_SCRIPT)
        .arg(desired)
        .arg(inventory)
        .stdin(Stdio::null())
        .output()
        .map_err(spawn_err("the libyaml reference (python3)"))?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let text = String::from_utf8_lossy(&out.stdout);
    let parsed = text.split_whitespace().collect::<Vec<_>>();
    match (out.status.success(), parsed.as_slice()) {
        (true, [ns, docs]) => match (ns.parse::<f64>(), docs.parse::<usize>()) {
            (Ok(ns), Ok(docs)) => Ok((ms, ns / 1e6, docs)),
            _ => Err(python_failed(&out)),
        },
        _ => Err(python_failed(&out)),
    }
}

fn python_failed(out: &std::process::Output) -> BenchError {
    BenchError::Invalid {
        what: format!(
            "the libyaml reference failed ({}): {} — it needs Python 3 with PyYAML built against \
             libyaml (Debian: `apt-get install python3-yaml`; check with \
             `python3 -c 'import yaml; yaml.CSafeLoader'`), or pass --python",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    }
}

/// Peak RSS of one `medea plan` run under GNU time, if `/usr/bin/time` is GNU time.
fn plan_peak_rss(o: &ProcessOptions, desired: &Path, inventory: &Path) -> Option<u64> {
    let time = Path::new("/usr/bin/time");
    if !time.exists() {
        return None;
    }
    let inner = plan_command(&o.medea, desired, inventory);
    let out = Command::new(time)
        .args(["-f", "%M"])
        .arg(inner.get_program())
        .args(inner.get_args())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .output()
        .ok()?;
    // GNU time writes its line last on stderr, after whatever the command wrote.
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .last()?
        .trim()
        .parse()
        .ok()
}

/// Alternate `medea plan` and the libyaml reference over `desired` + `inventory`, after one
/// warm-up of each (so both read from the page cache).
pub fn run(
    o: &ProcessOptions,
    desired: &Path,
    inventory: &Path,
) -> Result<ProcessReport, BenchError> {
    run_plan(o, desired, inventory)?;
    let (_, _, documents) = run_python(o, desired, inventory)?;
    let (mut plan, mut python, mut parse) = (Samples::new(), Samples::new(), Samples::new());
    for _ in 0..o.rounds.max(1) {
        plan.push_value(run_plan(o, desired, inventory)?);
        let (process, parsed, _) = run_python(o, desired, inventory)?;
        python.push_value(process);
        parse.push_value(parsed);
    }
    Ok(ProcessReport {
        ratio_process: plan.ratio_to(&python),
        ratio_parse: plan.ratio_to(&parse),
        plan,
        python,
        parse,
        documents,
        plan_peak_rss_kib: plan_peak_rss(o, desired, inventory),
    })
}
