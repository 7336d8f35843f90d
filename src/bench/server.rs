//! `medea bench server`: a real `medea serve` child process holding a generated fleet.
//!
//! Measures, on one server: its idle RSS and CPU use (from `/proc/<pid>`), `get machines`
//! over loopback TLS (the CLI command end to end, and the RPC alone on a fresh and on a warm
//! connection), and file change → new plan stored (the time from writing a desired-state file
//! to the server's `new plan` log line, which it writes right after the plan's store commit).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::BenchError;
use super::stats::Samples;
use crate::inventory::Inventory;
use crate::store::fjall::FjallStore;

#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub debounce: Duration,
    /// File changes to time.
    pub changes: usize,
    /// `get machines` calls to time (each way).
    pub gets: usize,
    /// How long the server is watched while nothing changes.
    pub idle: Duration,
    /// A command (split on whitespace) that `medea serve` runs under, such as a profiler
    /// (`heaptrack -o FILE`). Its RSS and CPU figures are then the wrapper's, not the server's.
    pub wrap: Vec<String>,
}

#[derive(Debug, Clone, Default)]
pub struct ServerReport {
    pub machines: usize,
    pub debounce_ms: f64,
    /// Time from starting the process to the API answering (initial load and plan done).
    pub startup_ms: f64,
    /// Write → `desired state loaded` log line.
    pub change_to_loaded: Samples,
    /// Write → `new plan` log line (the plan is committed to the store just before).
    pub change_to_plan: Samples,
    /// `medea get machines -o json` as a child process, end to end.
    pub get_cli: Samples,
    /// Connect (TCP + TLS) and ListMachines, in process.
    pub get_fresh: Samples,
    /// ListMachines on an established connection.
    pub get_warm: Samples,
    pub get_rows: usize,
    pub get_bytes: usize,
    pub idle: IdleReport,
    /// RSS after the change and get rounds, when idle again.
    pub rss_after_kib: u64,
}

#[derive(Debug, Clone, Default)]
pub struct IdleReport {
    pub rss_kib: u64,
    pub hwm_kib: u64,
    pub threads: usize,
    pub seconds: f64,
    /// utime + stime over the idle period, in clock ticks (`getconf CLK_TCK`, usually 100/s).
    pub cpu_ticks: u64,
    pub clk_tck: u64,
    /// Voluntary context switches of all threads over the idle period (wake-ups).
    pub wakeups: u64,
}

struct ServeChild {
    child: Child,
    lines: mpsc::Receiver<(Instant, String)>,
    addr: String,
}

impl Drop for ServeChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The message (and `addr` field) of a JSON log line.
fn message(line: &str) -> Option<(String, Option<String>)> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let fields = v.get("fields")?;
    let msg = fields.get("message")?.as_str()?.to_string();
    let addr = fields
        .get("addr")
        .and_then(|a| a.as_str())
        .map(str::to_string);
    Some((msg, addr))
}

fn wait_for(
    lines: &mpsc::Receiver<(Instant, String)>,
    prefix: &str,
    timeout: Duration,
) -> Result<(Instant, String), BenchError> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok((at, line)) => {
                if let Some((msg, _)) = message(&line)
                    && msg.starts_with(prefix)
                {
                    return Ok((at, line));
                }
            }
            Err(_) => {
                return Err(BenchError::Server {
                    what: format!("no `{prefix}` log line within {timeout:?}"),
                });
            }
        }
    }
}

#[allow(
    clippy::expect_used,
    reason = "the child was spawned with `Stdio::piped()` stderr just above"
)]
fn start(
    exe: &Path,
    desired: &Path,
    state: &Path,
    debounce: Duration,
    wrap: &[String],
) -> Result<(ServeChild, f64), BenchError> {
    let started = Instant::now();
    let mut cmd = match wrap.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    let mut child = cmd
        .args(["serve", "--log-format", "json", "--listen", "127.0.0.1:0"])
        .arg("--desired")
        .arg(desired)
        .arg("--state-dir")
        .arg(state)
        .arg("--debounce")
        .arg(format!("{}ms", debounce.as_millis()))
        .arg("--refresh-interval")
        .arg("1h")
        .env("RUST_LOG", "info")
        .env_remove("MEDEA_TOKEN")
        .env_remove("MEDEA_STORE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|err| BenchError::Spawn {
            what: "medea serve".into(),
            err,
        })?;
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if tx.send((Instant::now(), line)).is_err() {
                return;
            }
        }
    });
    let mut serve = ServeChild {
        child,
        lines: rx,
        addr: String::new(),
    };
    let (at, line) = wait_for(&serve.lines, "API listening", Duration::from_secs(300))?;
    serve.addr = message(&line)
        .and_then(|(_, a)| a)
        .ok_or_else(|| BenchError::Server {
            what: "the `API listening` line has no addr".into(),
        })?;
    Ok((serve, (at - started).as_secs_f64() * 1e3))
}

fn status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// utime + stime of the whole process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // The command name may contain spaces; fields after it start at ") ".
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime is field 14, stime 15.
    let get = |i: usize| {
        f.get(i - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    get(14) + get(15)
}

fn wakeups(pid: u32) -> (u64, usize) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return (0, 0);
    };
    let mut total = 0;
    let mut threads = 0;
    for t in tasks.flatten() {
        threads += 1;
        if let Ok(s) = std::fs::read_to_string(t.path().join("status")) {
            total += s
                .lines()
                .find(|l| l.starts_with("voluntary_ctxt_switches"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    (total, threads)
}

fn clk_tck() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100)
}

fn measure_idle(pid: u32, period: Duration) -> IdleReport {
    let (w0, _) = wakeups(pid);
    let c0 = cpu_ticks(pid);
    let t0 = Instant::now();
    std::thread::sleep(period);
    let c1 = cpu_ticks(pid);
    let (w1, threads) = wakeups(pid);
    IdleReport {
        rss_kib: status_kib(pid, "VmRSS:"),
        hwm_kib: status_kib(pid, "VmHWM:"),
        threads,
        seconds: t0.elapsed().as_secs_f64(),
        cpu_ticks: c1.saturating_sub(c0),
        clk_tck: clk_tck(),
        wakeups: w1.saturating_sub(w0),
    }
}

/// A change to `file` that makes a new revision every time: the first `drainTimeout: Nm`.
fn change(file: &Path, round: usize) -> Result<(), BenchError> {
    let text = std::fs::read_to_string(file).map_err(|err| BenchError::Io {
        path: file.to_path_buf(),
        err,
    })?;
    let Some(at) = text.find("drainTimeout: ") else {
        return Err(BenchError::Invalid {
            what: format!("{} has no drainTimeout to change", file.display()),
        });
    };
    let start = at + "drainTimeout: ".len();
    let end = start + text[start..].find('\n').unwrap_or(text.len() - start);
    let new = format!("{}{}m{}", &text[..start], 11 + round, &text[end..]);
    std::fs::write(file, new).map_err(|err| BenchError::Io {
        path: file.to_path_buf(),
        err,
    })
}

/// Run the server benchmarks on the repo at `desired` (written by `fleet::write_repo`) with
/// `inventory` seeded into a fresh store below `work`.
pub fn run(
    exe: &Path,
    desired: &Path,
    inventory: &Inventory,
    work: &Path,
    o: &ServerOptions,
) -> Result<ServerReport, BenchError> {
    let state = work.join("state");
    crate::server::secrets::private_dir(&state).map_err(|err| BenchError::Io {
        path: state.clone(),
        err,
    })?;
    {
        let store =
            FjallStore::open(&state.join("store")).map_err(|e| BenchError::Store(Box::new(e)))?;
        inventory
            .save(&store)
            .map_err(|e| BenchError::Store(Box::new(e)))?;
    }
    let (serve, startup_ms) = start(exe, desired, &state, o.debounce, &o.wrap)?;
    let pid = serve.child.id();
    let mut r = ServerReport {
        machines: inventory.clusters.values().map(|c| c.machines.len()).sum(),
        debounce_ms: o.debounce.as_secs_f64() * 1e3,
        startup_ms,
        ..ServerReport::default()
    };
    // Let the first pass's allocations and log output settle, then watch it do nothing.
    std::thread::sleep(Duration::from_secs(1));
    r.idle = measure_idle(pid, o.idle);

    let token = std::fs::read_to_string(state.join("token"))
        .map_err(|err| BenchError::Io {
            path: state.join("token"),
            err,
        })?
        .trim()
        .to_string();
    let ca = state.join("tls/ca.crt");
    get_machines(exe, &serve.addr, &token, &ca, o.gets, &mut r)?;

    let file = desired.join(
        first_cluster_file(desired).ok_or_else(|| BenchError::Invalid {
            what: format!("no cluster.yaml below {}", desired.display()),
        })?,
    );
    // Drain what the server logged so far.
    while serve.lines.try_recv().is_ok() {}
    for round in 0..o.changes {
        let t0 = Instant::now();
        change(&file, round)?;
        let timeout = Duration::from_secs(120);
        let (loaded, _) = wait_for(&serve.lines, "desired state loaded", timeout)?;
        let (planned, _) = wait_for(&serve.lines, "new plan", timeout)?;
        r.change_to_loaded.push(loaded - t0);
        r.change_to_plan.push(planned - t0);
        // Quiet time, so the next change is debounced on its own.
        std::thread::sleep(o.debounce * 2 + Duration::from_millis(100));
        while serve.lines.try_recv().is_ok() {}
    }
    std::thread::sleep(Duration::from_secs(1));
    r.rss_after_kib = status_kib(pid, "VmRSS:");
    Ok(r)
}

fn first_cluster_file(desired: &Path) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(desired)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("cluster.yaml").is_file())
        .collect();
    dirs.sort();
    dirs.first().map(|d| d.join("cluster.yaml"))
}

fn get_machines(
    exe: &Path,
    addr: &str,
    token: &str,
    ca: &Path,
    rounds: usize,
    r: &mut ServerReport,
) -> Result<(), BenchError> {
    use crate::api::pb;
    let cfg = crate::api::client::ClientConfig {
        addr: addr.to_string(),
        token: Some(crate::secret::Secret::new(token.to_string())),
        ca: Some(ca.to_path_buf()),
        insecure: false,
    };
    let rt = super::runtime(tokio::runtime::Builder::new_current_thread())?;
    let rpc_err = |what: String| BenchError::Server { what };
    rt.block_on(async {
        let mut warm = crate::api::client::connect(&cfg)
            .await
            .map_err(|e| rpc_err(crate::error_chain(&e)))?;
        for _ in 0..rounds + 1 {
            let t = Instant::now();
            let mut c = crate::api::client::connect(&cfg)
                .await
                .map_err(|e| rpc_err(crate::error_chain(&e)))?;
            let resp = c
                .list_machines(pb::ListMachinesRequest::default())
                .await
                .map_err(|s| rpc_err(s.to_string()))?
                .into_inner();
            r.get_fresh.push(t.elapsed());
            r.get_rows = resp.len();
            let t = Instant::now();
            let resp = warm
                .list_machines(pb::ListMachinesRequest::default())
                .await
                .map_err(|s| rpc_err(s.to_string()))?
                .into_inner();
            r.get_warm.push(t.elapsed());
            std::hint::black_box(resp);
        }
        Ok::<(), BenchError>(())
    })?;
    for i in 0..rounds + 1 {
        let t = Instant::now();
        let out = Command::new(exe)
            .args(["get", "machines", "-o", "json", "--addr", addr, "--ca"])
            .arg(ca)
            .env("MEDEA_TOKEN", token)
            .stdin(Stdio::null())
            .output()
            .map_err(|err| BenchError::Spawn {
                what: "medea get machines".into(),
                err,
            })?;
        let took = t.elapsed();
        if !out.status.success() {
            return Err(BenchError::Server {
                what: format!(
                    "medea get machines failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        r.get_bytes = out.stdout.len();
        if i > 0 {
            r.get_cli.push(took);
        }
    }
    // The first fresh and warm calls warmed the server; drop them from the samples.
    r.get_fresh = drop_first(&r.get_fresh);
    r.get_warm = drop_first(&r.get_warm);
    Ok(())
}

fn drop_first(s: &Samples) -> Samples {
    let mut out = Samples::new();
    for i in 1..s.len() {
        out.push_value(s.value(i));
    }
    out
}
