//! `medea backup verify --restore` (issue #37; issue #49 item 5): the decrypted snapshot is
//! restored with etcd's own tool and opened by a throwaway `etcd`, on the operator's machine,
//! serving nothing to anyone else there.
//!
//! - Everything happens in a 0700 temporary directory ([`crate::private_file::private_tempdir`]):
//!   the decrypted snapshot (0600), the restored data directory, and the throwaway etcd's
//!   sockets.
//! - The throwaway etcd listens on **unix sockets inside that directory** (client and peer),
//!   never on a TCP port: a local user cannot reach it (the directory is 0700), so the restored
//!   keys (every Secret of the cluster) are served to nobody but this process. etcd takes
//!   `unix://host:port` URLs and creates the socket file `host:port` relative to its working
//!   directory (etcd `client/pkg/transport/listener.go`, `NewListener`; `types.NewURLs` requires
//!   the `host:port` form), so every tool runs with the private directory as its working
//!   directory.
//! - The restore uses `etcdutl snapshot restore` when `etcdutl` is on PATH (etcd 3.5 moved it
//!   there; 3.6 removed `etcdctl snapshot restore`), else `etcdctl snapshot restore` (etcd 3.4).
//! - The snapshot's storage version (the `meta` bucket's `storageVersion`, written since etcd
//!   3.6) is read from the file and reported beside the local etcd's version: etcd 3.6 and later
//!   refuse a data directory whose storage version is newer than theirs (Talos 1.14 runs etcd
//!   3.7).

use std::path::{Path, PathBuf};

use miette::{IntoDiagnostic as _, WrapErr as _};

/// How long the throwaway etcd may take to answer.
const RESTORE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);
/// The throwaway etcd's client socket, relative to the private directory (`host:port` form).
const CLIENT_URL: &str = "unix://client:1";
/// Its peer socket (a single-member cluster still listens for peers).
const PEER_URL: &str = "unix://peer:1";

/// The etcd tools `--restore` runs.
#[derive(Debug, Clone)]
pub struct RestoreTools {
    /// The server, started on the restored data.
    pub etcd: PathBuf,
    /// The client that counts the keys (and restores, without `etcdutl`).
    pub etcdctl: PathBuf,
    /// etcd ≥ 3.5's offline tool: restores when present.
    pub etcdutl: Option<PathBuf>,
}

impl RestoreTools {
    /// The tools on PATH: `etcdutl` if there is one, `etcd` and `etcdctl` by name.
    pub fn from_path() -> RestoreTools {
        RestoreTools {
            etcd: PathBuf::from("etcd"),
            etcdctl: PathBuf::from("etcdctl"),
            etcdutl: on_path("etcdutl"),
        }
    }
}

/// `bin` in a directory of PATH, as an executable regular file.
fn on_path(bin: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(bin)).find(|p| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// What a throwaway etcd restored from a backup holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// Keys under the prefix asked for.
    pub keys: u64,
    /// The restored etcd's revision (the header of its answer).
    pub revision: i64,
    /// The tool that restored it: `etcdutl` or `etcdctl`.
    pub restored_with: &'static str,
    /// The snapshot's storage version (`3.6.0`); `None`: written by an etcd before 3.6.
    pub storage_version: Option<String>,
    /// The local etcd's version (`etcd --version`), when it says.
    pub local_etcd: Option<String>,
}

/// Decrypt backup `file` with `id` and restore it with the tools on PATH
/// ([`RestoreTools::from_path`]); see [`restore_and_count_with`].
pub fn restore_and_count(
    file: &Path,
    id: &age::x25519::Identity,
    prefix: &str,
) -> miette::Result<Restored> {
    restore_and_count_with(file, id, prefix, &RestoreTools::from_path())
}

/// Decrypt backup `file` with `id` into a 0700 temporary directory, restore it with `etcdutl
/// snapshot restore` (or `etcdctl snapshot restore` without `etcdutl`; either checks etcd's sha256
/// trailer itself), start a throwaway `etcd` on unix sockets in that directory on the restored
/// data, and count the keys under `prefix` (`""`: every key) and read its revision in one range
/// request. Everything is removed afterwards; nothing listens on a TCP port.
pub fn restore_and_count_with(
    file: &Path,
    id: &age::x25519::Identity,
    prefix: &str,
    tools: &RestoreTools,
) -> miette::Result<Restored> {
    let tmp = crate::private_file::private_tempdir("medea-restore-")
        .into_diagnostic()
        .wrap_err("cannot create a private temporary directory")?;
    let work = tmp.path();
    let snap = work.join("snapshot.db");
    decrypt_into(file, id, &snap)?;
    let storage_version = std::fs::File::open(&snap)
        .and_then(|f| crate::backup::revision::storage_version_of(std::io::BufReader::new(f)))
        .into_diagnostic()
        .wrap_err("cannot read the decrypted snapshot")?;
    let local_etcd = etcd_version(&tools.etcd, work);
    let restored_with = restore(tools, work, &snap)?;
    let (keys, revision) = serve_and_count(tools, work, prefix).map_err(|e| {
        match (&storage_version, &local_etcd) {
            (Some(s), Some(l)) => e.wrap_err(format!(
                "the snapshot's storage version is {s}, the local etcd is {l}: etcd 3.6 and later refuse a data directory from a newer etcd"
            )),
            _ => e,
        }
    })?;
    Ok(Restored {
        keys,
        revision,
        restored_with,
        storage_version,
        local_etcd,
    })
}

/// Decrypt `file` into `snap` (0600).
fn decrypt_into(file: &Path, id: &age::x25519::Identity, snap: &Path) -> miette::Result<()> {
    use std::io::Write as _;
    let enc = std::fs::File::open(file)
        .into_diagnostic()
        .wrap_err_with(|| format!("cannot open `{}`", file.display()))?;
    let decryptor = age::Decryptor::new(std::io::BufReader::new(enc))
        .map_err(|e| miette::Report::from_err(e).wrap_err("not an age file"))?;
    let mut plain = decryptor
        .decrypt(std::iter::once(id as &dyn age::Identity))
        .map_err(|e| miette::Report::from_err(e).wrap_err("cannot decrypt the backup"))?;
    let mut out = crate::private_file::open_private(snap)
        .into_diagnostic()
        .wrap_err("cannot write the decrypted snapshot")?;
    std::io::copy(&mut plain, &mut out)
        .into_diagnostic()
        .wrap_err("cannot decrypt the backup")?;
    out.flush().into_diagnostic()
}

/// Run `cmd` in `work`; its stdout, or an error with its stderr.
fn run(cmd: &mut std::process::Command, work: &Path, what: &str) -> miette::Result<String> {
    let out = cmd
        .current_dir(work)
        .env("ETCDCTL_API", "3")
        .output()
        .into_diagnostic()
        .wrap_err_with(|| {
            format!("cannot run {what} (is it installed? Debian: etcd-client, etcd-server)")
        })?;
    if !out.status.success() {
        return Err(miette::miette!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `etcd --version`'s version (`3.4.23`).
fn etcd_version(etcd: &Path, work: &Path) -> Option<String> {
    let out = run(
        std::process::Command::new(etcd).arg("--version"),
        work,
        "etcd --version",
    )
    .ok()?;
    out.lines()
        .find_map(|l| l.strip_prefix("etcd Version:"))
        .map(|v| v.trim().to_string())
}

/// Restore `snap` into `work/data` with `etcdutl`, else `etcdctl`; the tool's name.
fn restore(tools: &RestoreTools, work: &Path, snap: &Path) -> miette::Result<&'static str> {
    let (bin, name) = match &tools.etcdutl {
        Some(u) => (u.as_path(), "etcdutl"),
        None => (tools.etcdctl.as_path(), "etcdctl"),
    };
    run(
        std::process::Command::new(bin)
            .args(["snapshot", "restore"])
            .arg(snap)
            .arg("--data-dir")
            .arg(work.join("data"))
            .args([
                "--name",
                "verify",
                "--initial-cluster",
                &format!("verify={PEER_URL}"),
                "--initial-advertise-peer-urls",
                PEER_URL,
            ]),
        work,
        &format!("{name} snapshot restore"),
    )?;
    Ok(name)
}

/// Start etcd on the restored data, on unix sockets in `work`; wait for it; count the keys
/// under `prefix` and read the revision; stop it.
fn serve_and_count(tools: &RestoreTools, work: &Path, prefix: &str) -> miette::Result<(u64, i64)> {
    let mut etcd = std::process::Command::new(&tools.etcd)
        .current_dir(work)
        .args(["--name", "verify", "--data-dir"])
        .arg(work.join("data"))
        .args([
            "--listen-client-urls",
            CLIENT_URL,
            "--advertise-client-urls",
            CLIENT_URL,
            "--listen-peer-urls",
            PEER_URL,
            "--initial-advertise-peer-urls",
            PEER_URL,
            "--initial-cluster",
            &format!("verify={PEER_URL}"),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .into_diagnostic()
        .wrap_err("cannot start etcd (is it installed? Debian: etcd-server)")?;
    // Wait until it answers (a fresh etcd on a loaded machine takes a moment), then count once.
    let deadline = std::time::Instant::now() + RESTORE_PATIENCE;
    let health = loop {
        match run(
            std::process::Command::new(&tools.etcdctl).args([
                "--endpoints",
                CLIENT_URL,
                "--command-timeout=2s",
                "endpoint",
                "health",
            ]),
            work,
            "etcdctl endpoint health",
        ) {
            Ok(_) => break Ok(()),
            Err(e)
                if std::time::Instant::now() > deadline
                    || etcd.try_wait().ok().flatten().is_some() =>
            {
                break Err(e.wrap_err("the throwaway etcd did not come up on the restored data"));
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(100)),
        }
    };
    // `count` of a range is the total even with `--limit 1` (etcd's RangeResponse), and
    // `--count-only` is not in every etcdctl.
    let counted = health.and_then(|()| {
        let mut cmd = std::process::Command::new(&tools.etcdctl);
        cmd.args(["--endpoints", CLIENT_URL, "--command-timeout=10s", "get"]);
        if prefix.is_empty() {
            cmd.args(["", "--from-key"]);
        } else {
            cmd.args([prefix, "--prefix"]);
        }
        cmd.args(["--keys-only", "--limit=1", "-w", "json"]);
        count_of(&run(&mut cmd, work, "etcdctl get")?)
    });
    let _ = etcd.kill();
    let _ = etcd.wait();
    counted
}

/// The `count` (absent when zero) and the header's `revision` of `etcdctl get -w json`.
fn count_of(json: &str) -> miette::Result<(u64, i64)> {
    let v: serde_json::Value = serde_json::from_str(json)
        .into_diagnostic()
        .wrap_err("etcdctl answered something that is not JSON")?;
    Ok((
        v.get("count")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0),
        v.pointer("/header/revision")
            .and_then(serde_json::Value::as_i64)
            .unwrap_or(0),
    ))
}
