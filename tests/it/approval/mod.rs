//! Signed approvals against the real OpenSSH tools: `ssh-keygen -Y sign/verify`, `ssh-agent`,
//! `ssh-add`. Signatures made by ssh-keygen must verify in medea, and medea's must pass
//! `ssh-keygen -Y verify`; every rejection has its own outcome and message.
//!
//! This file holds the shared set-up (keys, ssh-keygen and ssh-agent wrappers); each subject is
//! a module: [`signatures`] (both ways, every key type), [`verdicts`] (rejections, revocation,
//! quorum, allowed_signers) and [`approve`] (`medea approve`).

mod approve;
mod signatures;
mod verdicts;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use jiff::Timestamp;
use medea::approval::sign::{self, Agent, KeyFile, SignError};
use medea::approval::{
    AllowedSigners, ApprovalError, ApprovalRecord, ApprovalSource, NotCounted, Outcome,
    VerifyContext, allowed_signers, ensure_startable, evaluate, verify,
};
use medea::plan::PlanId;
use sha2::{Digest, Sha256};
use ssh_key::HashAlg;

use crate::cli::medea;

/// The real ssh-keygen, or a clear failure naming the package (never a silent skip).
fn ssh_keygen() -> Command {
    crate::fixtures::tool("ssh-keygen")
}

fn plan(name: &str) -> PlanId {
    PlanId::from_digest(Sha256::digest(name.as_bytes()).into())
}

fn now() -> Timestamp {
    "2025-06-01T00:00:00Z".parse().unwrap()
}
const NOW_FOR_SSH_KEYGEN: &str = "verify-time=20250601Z";

struct Key {
    private: PathBuf,
    public: String,
}

impl Key {
    fn public_path(&self) -> PathBuf {
        self.private.with_extension("pub")
    }
    /// `SHA256:...` as `ssh-keygen -l` prints it.
    fn fingerprint(&self) -> String {
        let out = ssh_keygen()
            .arg("-lf")
            .arg(self.public_path())
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout)
            .unwrap()
            .split_whitespace()
            .nth(1)
            .unwrap()
            .to_string()
    }
}

/// `ssh-keygen -t TYPE [-b BITS] -N ''` into `dir/name`.
fn keygen(dir: &Path, name: &str, kind: &[&str]) -> Key {
    let private = dir.join(name);
    let out = ssh_keygen()
        .args(["-q", "-N", "", "-C", name, "-f"])
        .arg(&private)
        .args(kind)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ssh-keygen: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let public = std::fs::read_to_string(private.with_extension("pub"))
        .unwrap()
        .trim()
        .to_string();
    Key { private, public }
}

const KEY_TYPES: &[(&str, &[&str])] = &[
    ("ed25519", &["-t", "ed25519"]),
    ("ecdsa256", &["-t", "ecdsa", "-b", "256"]),
    ("ecdsa384", &["-t", "ecdsa", "-b", "384"]),
    ("ecdsa521", &["-t", "ecdsa", "-b", "521"]),
    ("rsa", &["-t", "rsa", "-b", "2048"]),
];

/// `ssh-keygen -Y sign -n NS -f KEY [-O hashalg=H]` over `msg` on stdin; the armored signature.
fn keygen_sign(key: &Key, ns: &str, hash: &str, msg: &[u8]) -> String {
    let mut child = ssh_keygen()
        .args([
            "-Y",
            "sign",
            "-n",
            ns,
            "-O",
            &format!("hashalg={hash}"),
            "-f",
        ])
        .arg(&key.private)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(msg).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "ssh-keygen -Y sign: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `ssh-keygen -Y verify -f ALLOWED -I PRINCIPAL -n medea-approve -s SIG < MSG`: (ok, stdout+stderr).
fn keygen_verify(
    dir: &Path,
    allowed: &str,
    principal: &str,
    sig: &str,
    msg: &[u8],
) -> (bool, String) {
    let allowed_path = dir.join("allowed_signers.verify");
    std::fs::write(&allowed_path, allowed).unwrap();
    let sig_path = dir.join("verify.sig");
    std::fs::write(&sig_path, sig).unwrap();
    let mut child = ssh_keygen()
        .args([
            "-Y",
            "verify",
            "-n",
            "medea-approve",
            "-O",
            NOW_FOR_SSH_KEYGEN,
            "-I",
            principal,
            "-f",
        ])
        .arg(&allowed_path)
        .arg("-s")
        .arg(&sig_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // ssh-keygen may refuse (a bad signature, an unknown principal) and exit before it reads
    // the message: a broken pipe then is its answer, not a test failure.
    match child.stdin.take().unwrap().write_all(msg) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => panic!("writing the message to ssh-keygen: {e}"),
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn signers(text: &str) -> AllowedSigners {
    let (s, d) = allowed_signers::parse(text);
    assert!(d.is_empty(), "{d:?}");
    s
}

fn check(
    armored: &str,
    s: &AllowedSigners,
    current: &PlanId,
    known: &[PlanId],
    consumed: &[PlanId],
) -> Outcome {
    let ctx = VerifyContext {
        signers: s,
        current,
        known,
        consumed,
        now: now(),
    };
    verify(armored, ApprovalSource::Api, &ctx)
}

/// An `ssh-agent -D` child with its socket; killed when dropped.
struct SshAgent {
    child: Child,
    socket: PathBuf,
}

impl SshAgent {
    fn start(dir: &Path) -> SshAgent {
        let socket = dir.join("agent.sock");
        let mut child = crate::fixtures::tool("ssh-agent")
            .arg("-D")
            .arg("-a")
            .arg(&socket)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("ssh-agent (openssh-client) must be installed");
        // The agent prints `SSH_AUTH_SOCK=...` once its socket is listening: no sleeping.
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert!(first.starts_with("SSH_AUTH_SOCK="), "{first}");
        SshAgent { child, socket }
    }
    fn add(&self, key: &Key) {
        let out = Command::new("/usr/bin/ssh-add")
            .arg(&key.private)
            .env("SSH_AUTH_SOCK", &self.socket)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ssh-add: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for SshAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
