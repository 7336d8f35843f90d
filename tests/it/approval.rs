//! Signed approvals against the real OpenSSH tools: `ssh-keygen -Y sign/verify`, `ssh-agent`,
//! `ssh-add`. Signatures made by ssh-keygen must verify in medea, and medea's must pass
//! `ssh-keygen -Y verify`; every rejection has its own outcome and message.

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

#[test]
fn ssh_keygen_signatures_are_approvals_for_every_key_type_and_hash() {
    let dir = tempfile::tempdir().unwrap();
    let p = plan("a");
    for (name, kind) in KEY_TYPES {
        let key = keygen(dir.path(), name, kind);
        let principal = format!("{name}@example.com");
        let s = signers(&format!(
            "{principal} namespaces=\"medea-approve\" {}\n",
            key.public
        ));
        for hash in ["sha256", "sha512"] {
            let armored = keygen_sign(&key, "medea-approve", hash, &p.signed_message());
            let o = check(&armored, &s, &p, &[], &[]);
            let a = o.approved().unwrap_or_else(|| panic!("{name}/{hash}: {o}"));
            assert_eq!(a.principal, principal);
            assert_eq!(a.plan, p);
            assert_eq!(a.fingerprint, key.fingerprint(), "{name}");
            let expected = format!("approved plan {} by {principal} (", p.short());
            assert!(o.to_string().starts_with(&expected), "{o}");
        }
    }
}

#[test]
fn the_documented_echo_pipeline_signs_exactly_the_plan_message() {
    let dir = tempfile::tempdir().unwrap();
    let key = keygen(dir.path(), "alice", &["-t", "ed25519"]);
    let p = plan("echo");
    let cmd = medea::approval::ssh_keygen_command(&p)
        .replace("~/.ssh/id_ed25519", key.private.to_str().unwrap());
    let (pipeline, redirect) = cmd.split_once(" > ").unwrap();
    assert!(redirect.starts_with(&format!("approvals/{}-", p.short())));
    let out = Command::new("sh").arg("-c").arg(pipeline).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = signers(&format!("alice@example.com {}\n", key.public));
    let o = check(&String::from_utf8(out.stdout).unwrap(), &s, &p, &[], &[]);
    assert!(matches!(o, Outcome::Approved(_)), "{o}");
}

#[test]
fn medea_key_file_signatures_pass_ssh_keygen_verify() {
    let dir = tempfile::tempdir().unwrap();
    let p = plan("b");
    for (name, kind) in KEY_TYPES {
        let key = keygen(dir.path(), name, kind);
        let KeyFile::Private(secret) = sign::load_key_file(&key.private).unwrap() else {
            panic!("{name}: private key file read as a public key");
        };
        let allowed = format!("alice@example.com {}\n", key.public);
        for hash in [HashAlg::Sha256, HashAlg::Sha512] {
            let signed =
                sign::sign_with_key(&secret, &p, hash).unwrap_or_else(|e| panic!("{name}: {e:?}"));
            assert_eq!(signed.fingerprint, key.fingerprint());
            let (ok, text) = keygen_verify(
                dir.path(),
                &allowed,
                "alice@example.com",
                &signed.armored,
                &p.signed_message(),
            );
            assert!(ok, "{name}/{hash:?}: {text}");
            assert!(
                text.contains("Good \"medea-approve\" signature for alice@example.com"),
                "{text}"
            );
            // and ssh-keygen refuses it for another plan
            let (ok, _) = keygen_verify(
                dir.path(),
                &allowed,
                "alice@example.com",
                &signed.armored,
                &plan("c").signed_message(),
            );
            assert!(!ok, "{name}: verified over the wrong plan");
        }
        // a public key file means "the agent's key"
        assert!(matches!(
            sign::load_key_file(&key.public_path()).unwrap(),
            KeyFile::Public(_)
        ));
    }
}

#[test]
fn medea_agent_signatures_pass_ssh_keygen_verify() {
    let dir = tempfile::tempdir().unwrap();
    let agent = SshAgent::start(dir.path());
    let p = plan("agent");
    let mut keys = Vec::new();
    for (name, kind) in [KEY_TYPES[0], KEY_TYPES[1], KEY_TYPES[2], KEY_TYPES[4]] {
        let key = keygen(dir.path(), name, kind);
        agent.add(&key);
        keys.push((name, key));
    }
    let mut conn = Agent::connect(&agent.socket).unwrap();
    assert_eq!(conn.identities().unwrap().len(), 4);
    for (name, key) in &keys {
        let pk = ssh_key::PublicKey::from_openssh(&key.public).unwrap();
        let chosen = conn.choose(Some(&pk)).unwrap();
        let signed = conn.sign(&chosen, &p, HashAlg::Sha512).unwrap();
        let allowed = format!("bob@example.com {}\n", key.public);
        let (ok, text) = keygen_verify(
            dir.path(),
            &allowed,
            "bob@example.com",
            &signed.armored,
            &p.signed_message(),
        );
        assert!(ok, "{name}: {text}");
        if *name == "rsa" {
            let sig: ssh_key::SshSig = signed.armored.parse().unwrap();
            assert_eq!(
                sig.algorithm().as_str(),
                "rsa-sha2-512",
                "never SHA-1 ssh-rsa"
            );
        }
        let s = signers(&allowed);
        assert!(matches!(
            check(&signed.armored, &s, &p, &[], &[]),
            Outcome::Approved(_)
        ));
    }
    // several keys and no choice: a clear error naming them
    let e = conn.choose(None).unwrap_err();
    assert!(matches!(e, SignError::AgentAmbiguous { .. }));
    assert!(e.to_string().contains("--key PATH.pub"), "{e}");
    // a key the agent does not hold
    let stranger = keygen(dir.path(), "stranger", &["-t", "ed25519"]);
    let e = conn
        .choose(Some(
            &ssh_key::PublicKey::from_openssh(&stranger.public).unwrap(),
        ))
        .unwrap_err();
    assert!(matches!(e, SignError::AgentKeyMissing { .. }), "{e}");
    drop(conn);
    drop(agent);
}

#[test]
fn every_rejection_has_its_own_outcome_and_message() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let alice = keygen(d, "alice", &["-t", "ed25519"]);
    let bob = keygen(d, "bob", &["-t", "ed25519"]);
    let carol = keygen(d, "carol", &["-t", "ecdsa", "-b", "256"]);
    let dave = keygen(d, "dave", &["-t", "ed25519"]);
    let mallory = keygen(d, "mallory", &["-t", "ed25519"]);
    let allowed = format!(
        "alice@example.com {}\n\
         bob@example.com valid-before=\"20250101Z\" {}\n\
         carol@example.com valid-after=\"20990101Z\" {}\n\
         dave@example.com namespaces=\"git,file\" {}\n",
        alice.public, bob.public, carol.public, dave.public
    );
    let s = signers(&allowed);
    let (a, b) = (plan("A"), plan("B"));
    let ma = a.signed_message();
    let mut tampered = ma.clone();
    tampered[0] = if tampered[0] == b'0' { b'1' } else { b'0' };

    let good = keygen_sign(&alice, "medea-approve", "sha512", &ma);
    let mut altered_sig = good.clone();
    // flip one base64 character in the body (line 2)
    let body_at = altered_sig.find('\n').unwrap() + 40;
    let flipped = if altered_sig.as_bytes()[body_at] == b'A' {
        "B"
    } else {
        "A"
    };
    altered_sig.replace_range(body_at..body_at + 1, flipped);

    let cases: Vec<(&str, String, &str, &str)> = vec![
        (
            "tampered message",
            keygen_sign(&alice, "medea-approve", "sha512", &tampered),
            "other-plan",
            "alice",
        ),
        (
            "wrong namespace",
            keygen_sign(&alice, "git", "sha512", &ma),
            "wrong-namespace",
            "alice",
        ),
        (
            "unknown key",
            keygen_sign(&mallory, "medea-approve", "sha512", &ma),
            "unknown-key",
            "mallory",
        ),
        (
            "expired",
            keygen_sign(&bob, "medea-approve", "sha512", &ma),
            "expired",
            "bob",
        ),
        (
            "not yet valid",
            keygen_sign(&carol, "medea-approve", "sha256", &ma),
            "not-yet-valid",
            "carol",
        ),
        (
            "namespace excluded",
            keygen_sign(&dave, "medea-approve", "sha512", &ma),
            "namespace-not-allowed",
            "dave",
        ),
        ("not a signature", "hello".to_string(), "malformed", "alice"),
    ];
    let mut messages = BTreeSet::new();
    for (what, armored, code, who) in &cases {
        let o = check(armored, &s, &a, &[], &[]);
        assert_eq!(o.code(), *code, "{what}: {o}");
        messages.insert(o.to_string());
        // ssh-keygen agrees that none of these is a valid medea-approve signature of plan A
        let (ok, text) = keygen_verify(d, &allowed, &format!("{who}@example.com"), armored, &ma);
        assert!(!ok, "ssh-keygen accepted the {what} case: {text}");
    }
    assert_eq!(messages.len(), cases.len(), "{messages:#?}");
    let o = check(&altered_sig, &s, &a, &[], &[]);
    assert!(o.approved().is_none(), "altered signature accepted: {o}");

    let m = |c: &str| {
        check(
            &cases.iter().find(|x| x.2 == c).unwrap().1,
            &s,
            &a,
            &[],
            &[],
        )
        .to_string()
    };
    // the good signature itself passes both
    assert!(matches!(
        check(&good, &s, &a, &[], &[]),
        Outcome::Approved(_)
    ));
    assert!(keygen_verify(d, &allowed, "alice@example.com", &good, &ma).0);
    assert!(m("other-plan").contains(&format!("does not sign the current plan {}", a.short())));
    assert!(m("wrong-namespace").contains("namespace `git`, not `medea-approve`"));
    assert!(m("unknown-key").contains(&mallory.fingerprint()));
    assert!(m("expired").contains("bob@example.com expired at 2025-01-01T00:00:00Z"));
    assert!(
        m("not-yet-valid").contains("carol@example.com is not valid before 2099-01-01T00:00:00Z")
    );
    assert!(m("namespace-not-allowed").contains("`git,file`"));

    // stale: A's approval once B is current; A never counts for B
    let o = check(&good, &s, &b, &[a], &[]);
    assert!(
        matches!(o, Outcome::StalePlan { signed, current, .. } if signed == a && current == b),
        "{o}"
    );
    assert!(o.to_string().contains("stale"));
    let o = check(&good, &s, &b, &[], &[]);
    assert_eq!(o.code(), "other-plan");
    // replayed: A executed, then A current again
    let o = check(&good, &s, &a, &[], &[a]);
    assert_eq!(o.code(), "replayed");
    assert!(o.to_string().contains("already executed"));
    let approved = check(&good, &s, &a, &[], &[]).approved().unwrap().clone();
    let status = evaluate(&a, 1, vec![approved]);
    assert!(status.reached());
    assert!(matches!(
        ensure_startable(&a, &a, true, &status),
        Err(ApprovalError::Consumed { .. })
    ));
    assert!(ensure_startable(&a, &a, false, &status).is_ok());
    assert!(matches!(
        ensure_startable(&a, &b, false, &status),
        Err(ApprovalError::StalePlan { .. })
    ));
}

#[test]
fn revoked_signer_no_longer_counts_even_for_recorded_approvals() {
    let dir = tempfile::tempdir().unwrap();
    let alice = keygen(dir.path(), "alice", &["-t", "ed25519"]);
    let bob = keygen(dir.path(), "bob", &["-t", "ed25519"]);
    let p = plan("revoke");
    let before = signers(&format!(
        "alice@example.com {}\nbob@example.com {}\n",
        alice.public, bob.public
    ));
    let armored = keygen_sign(&alice, "medea-approve", "sha512", &p.signed_message());
    let a = check(&armored, &before, &p, &[], &[])
        .approved()
        .unwrap()
        .clone();
    let record = ApprovalRecord::new(&a, &armored, now());
    let json = serde_json::to_string(&record).unwrap();
    let record: ApprovalRecord = serde_json::from_str(&json).unwrap();

    // alice's line removed
    let after = signers(&format!("bob@example.com {}\n", bob.public));
    let ctx = VerifyContext {
        signers: &after,
        current: &p,
        known: &[],
        consumed: &[],
        now: now(),
    };
    let o = record.reverify(&ctx);
    assert!(
        matches!(&o, Outcome::UnknownKey { fingerprint } if *fingerprint == alice.fingerprint()),
        "{o}"
    );
    assert!(o.to_string().contains("never added, or removed"));
    let (ok, _) = keygen_verify(
        dir.path(),
        &format!("bob@example.com {}\n", bob.public),
        "alice@example.com",
        &armored,
        &p.signed_message(),
    );
    assert!(!ok, "ssh-keygen still trusts the removed signer");
}

#[test]
fn quorum_counts_people_not_keys_or_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let laptop = keygen(d, "alice-laptop", &["-t", "ed25519"]);
    let yubi = keygen(d, "alice-desk", &["-t", "ecdsa", "-b", "256"]);
    let bob = keygen(d, "bob", &["-t", "ed25519"]);
    let s = signers(&format!(
        "alice@example.com {}\nalice@example.com {}\nbob@example.com {}\n",
        laptop.public, yubi.public, bob.public
    ));
    let (a, b) = (plan("A"), plan("B"));
    let sig = |k: &Key, p: &PlanId| keygen_sign(k, "medea-approve", "sha512", &p.signed_message());
    let verified = |armored: &str, path: &str, current: &PlanId| {
        let ctx = VerifyContext {
            signers: &s,
            current,
            known: &[],
            consumed: &[],
            now: now(),
        };
        let o = verify(armored, ApprovalSource::Marker { path: path.into() }, &ctx);
        o.approved().unwrap_or_else(|| panic!("{o}")).clone()
    };
    let laptop_sig = sig(&laptop, &a);
    let alice1 = verified(&laptop_sig, "approvals/a-alice1.sig", &a);
    let alice2 = verified(&sig(&yubi, &a), "approvals/a-alice2.sig", &a);
    let alice_copy = verified(&laptop_sig, "approvals/copy.sig", &a);
    let status = evaluate(&a, 2, vec![alice1.clone(), alice2, alice_copy]);
    assert!(!status.reached(), "{status}");
    assert_eq!(status.count(), 1);
    assert_eq!(status.not_counted.len(), 2);
    assert!(
        status
            .not_counted
            .iter()
            .all(|(_, why)| matches!(why, NotCounted::SamePrincipal { .. }))
    );
    assert!(
        status.not_counted[0]
            .1
            .to_string()
            .starts_with("duplicate principal: alice@example.com")
    );
    assert!(matches!(
        ensure_startable(&a, &a, false, &status),
        Err(ApprovalError::QuorumNotReached {
            have: 1,
            required: 2,
            ..
        })
    ));

    // bob approves plan B: it does not count for A
    let bob_b = verified(&sig(&bob, &b), "approvals/b-bob.sig", &b);
    let status = evaluate(&a, 2, vec![alice1.clone(), bob_b]);
    assert!(!status.reached());
    assert!(matches!(
        status.not_counted[0].1,
        NotCounted::OtherPlan { .. }
    ));

    let bob_a = verified(&sig(&bob, &a), "approvals/a-bob.sig", &a);
    let status = evaluate(&a, 2, vec![alice1, bob_a]);
    assert!(status.reached(), "{status}");
    assert_eq!(
        status.principals(),
        vec!["alice@example.com", "bob@example.com"]
    );
}

#[test]
fn allowed_signers_decisions_match_ssh_keygen() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let key = keygen(d, "k", &["-t", "ed25519"]);
    let p = plan("parity");
    let armored = keygen_sign(&key, "medea-approve", "sha512", &p.signed_message());
    // (options, medea approves?, ssh-keygen accepts?)
    let cases = [
        ("", true, true),
        ("namespaces=\"medea-approve\"", true, true),
        ("namespaces=\"medea-*\"", true, true),
        ("namespaces=\"git\"", false, false),
        ("namespaces=\"*,!medea-approve\"", false, false),
        (
            "valid-after=\"20250101Z\",valid-before=\"20251231Z\"",
            true,
            true,
        ),
        ("VALID-AFTER=\"20250601Z\"", true, true),
        ("valid-before=\"20250531235959Z\"", false, false),
        ("valid-after=\"202506010001Z\"", false, false),
    ];
    for (opts, medea_ok, keygen_ok) in cases {
        let allowed = format!("alice@example.com {opts} {}\n", key.public);
        let o = check(&armored, &signers(&allowed), &p, &[], &[]);
        assert_eq!(o.approved().is_some(), medea_ok, "{opts}: {o}");
        let (ok, text) = keygen_verify(
            d,
            &allowed,
            "alice@example.com",
            &armored,
            &p.signed_message(),
        );
        assert_eq!(ok, keygen_ok, "{opts}: {text}");
    }
    // deliberate difference: ssh-keygen accepts a pattern principal for `-I alice@example.com`;
    // medea needs a literal person to count
    let allowed = format!("*@example.com {}\n", key.public);
    let (ok, _) = keygen_verify(
        d,
        &allowed,
        "alice@example.com",
        &armored,
        &p.signed_message(),
    );
    assert!(ok);
    assert_eq!(
        check(&armored, &signers(&allowed), &p, &[], &[]).code(),
        "pattern-principal"
    );
    // ssh-keygen rejects what medea diagnoses
    for bad in [
        "namespaces=medea-approve",
        "bogus=\"x\"",
        "valid-after=\"2025\"",
    ] {
        let allowed = format!("alice@example.com {bad} {}\n", key.public);
        let (_, diags) = allowed_signers::parse(&allowed);
        assert_eq!(diags.len(), 1, "{bad}");
        assert_eq!(diags[0].line, 1);
        let (ok, _) = keygen_verify(
            d,
            &allowed,
            "alice@example.com",
            &armored,
            &p.signed_message(),
        );
        assert!(!ok, "ssh-keygen accepted `{bad}`");
    }
}

/// stderr with miette's wrapping undone (box-drawing margins removed, whitespace collapsed).
fn flat(stderr: &[u8]) -> String {
    String::from_utf8_lossy(stderr)
        .replace(['│', '×'], " ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

fn approve_cmd(args: &[&str]) -> std::process::Output {
    medea()
        .arg("approve")
        .args(args)
        .env_remove("SSH_AUTH_SOCK")
        .output()
        .unwrap()
}

#[test]
fn medea_approve_writes_a_marker_that_ssh_keygen_and_medea_accept() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let key = keygen(d, "alice", &["-t", "ed25519"]);
    let allowed = format!("alice@example.com,alice@corp.example {}\n", key.public);
    let allowed_path = d.join("allowed_signers");
    std::fs::write(&allowed_path, &allowed).unwrap();
    let repo = d.join("repo");
    std::fs::create_dir(&repo).unwrap();
    let p = plan("cli");
    let full = p.to_hex();

    let out = approve_cmd(&[
        &full,
        "--key",
        key.private.to_str().unwrap(),
        "--allowed-signers",
        allowed_path.to_str().unwrap(),
        "--write-marker",
        "--desired",
        repo.to_str().unwrap(),
    ]);
    let stderr = flat(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let marker = repo.join(format!("approvals/{}-alice@example.com.sig", p.short()));
    assert!(
        stderr.contains(&format!("approvals/{}-alice@example.com.sig", p.short())),
        "{stderr}"
    );
    let armored = std::fs::read_to_string(&marker).unwrap();
    let (ok, text) = keygen_verify(
        d,
        &allowed,
        "alice@example.com",
        &armored,
        &p.signed_message(),
    );
    assert!(ok, "{text}");
    assert!(matches!(
        check(&armored, &signers(&allowed), &p, &[], &[]),
        Outcome::Approved(_)
    ));
    // the same approval again is fine (idempotent), a different one is refused
    let again = approve_cmd(&[
        &full,
        "--key",
        key.private.to_str().unwrap(),
        "--principal",
        "alice@example.com",
        "--write-marker",
        "--desired",
        repo.to_str().unwrap(),
    ]);
    // ed25519 signatures are deterministic, so this is the same file
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let other_hash = approve_cmd(&[
        &full,
        "--key",
        key.private.to_str().unwrap(),
        "--principal",
        "alice@example.com",
        "--write-marker",
        "--desired",
        repo.to_str().unwrap(),
        "--hash",
        "sha256",
    ]);
    assert!(!other_hash.status.success());
    assert!(flat(&other_hash.stderr).contains("already exists"));
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap(),
        armored,
        "marker unchanged"
    );
}

#[test]
fn medea_approve_signs_through_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let agent = SshAgent::start(d);
    let key = keygen(d, "bob", &["-t", "ecdsa", "-b", "384"]);
    agent.add(&key);
    let p = plan("cli-agent");
    let out = medea()
        .args(["approve", &p.to_hex(), "--output", "-"])
        .env("SSH_AUTH_SOCK", &agent.socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let armored = String::from_utf8(out.stdout).unwrap();
    let allowed = format!("bob@example.com {}\n", key.public);
    let (ok, text) = keygen_verify(
        d,
        &allowed,
        "bob@example.com",
        &armored,
        &p.signed_message(),
    );
    assert!(ok, "{text}");
    // --key KEY.pub selects the agent's key
    let out = medea()
        .args(["approve", &p.to_hex(), "--output", "-", "--key"])
        .arg(key.public_path())
        .env("SSH_AUTH_SOCK", &agent.socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(agent);
}

#[test]
fn medea_approve_refuses_clearly_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let key = keygen(d, "alice", &["-t", "ed25519"]);
    let stranger = keygen(d, "stranger", &["-t", "ed25519"]);
    let allowed_path = d.join("allowed_signers");
    std::fs::write(&allowed_path, format!("alice@example.com {}\n", key.public)).unwrap();
    let repo = d.join("repo");
    std::fs::create_dir(&repo).unwrap();
    let p = plan("refuse");
    let full = p.to_hex();
    let short = p.short();
    let k = key.private.to_str().unwrap();
    let repo_s = repo.to_str().unwrap();
    let signers_s = allowed_path.to_str().unwrap();

    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![&short, "--key", k, "--output", "-"],
            "is a short plan id",
        ),
        (vec!["XYZ", "--key", k, "--output", "-"], "invalid plan id"),
        // No marker, no output: submit to the server, which is not there.
        (vec![&full, "--key", k], "localhost:7600"),
        (
            vec![&full, "--key", k, "--write-marker", "--desired", repo_s],
            "needs your principal",
        ),
        (vec![&full, "--output", "-"], "SSH_AUTH_SOCK"),
        (
            vec![
                &full,
                "--key",
                stranger.private.to_str().unwrap(),
                "--allowed-signers",
                signers_s,
                "--write-marker",
                "--desired",
                repo_s,
            ],
            "unknown key",
        ),
        (
            vec![
                &full,
                "--key",
                k,
                "--allowed-signers",
                signers_s,
                "--principal",
                "mallory@example.com",
                "--write-marker",
                "--desired",
                repo_s,
            ],
            "not listed for key",
        ),
    ];
    for (args, expected) in cases {
        let out = approve_cmd(&args);
        let stderr = flat(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(
            stderr.contains(expected),
            "{args:?}: expected `{expected}` in:\n{stderr}"
        );
    }
    assert!(
        !repo.join("approvals").exists(),
        "a refused approval wrote a marker"
    );

    // passphrase-protected key
    let locked = d.join("locked");
    let out = ssh_keygen()
        .args(["-q", "-t", "ed25519", "-N", "secret passphrase", "-f"])
        .arg(&locked)
        .output()
        .unwrap();
    assert!(out.status.success());
    let out = approve_cmd(&[&full, "--key", locked.to_str().unwrap(), "--output", "-"]);
    let stderr = flat(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("passphrase-protected") && stderr.contains("ssh-add"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());

    // a broken allowed signers file is reported with its line
    std::fs::write(
        &allowed_path,
        format!("alice@example.com cert-authority {}\n", key.public),
    )
    .unwrap();
    let out = approve_cmd(&[
        &full,
        "--key",
        k,
        "--allowed-signers",
        signers_s,
        "--output",
        "-",
    ]);
    let stderr = flat(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("allowed_signers:1:19: `cert-authority` is not supported")
            && stderr.contains("cert-authority"),
        "{stderr}"
    );
}

#[test]
fn p521_keys_with_a_short_scalar_load_and_sign() {
    // About half of OpenSSH's P-521 keys store a scalar shorter than 66 bytes, which ssh-key
    // 0.6.7 refuses to read; medea re-pads it (sign::load_key_file). Find such a key.
    let dir = tempfile::tempdir().unwrap();
    let p = plan("p521");
    let mut found = None;
    for i in 0..40 {
        let key = keygen(
            dir.path(),
            &format!("p521-{i}"),
            &["-t", "ecdsa", "-b", "521"],
        );
        let text = std::fs::read_to_string(&key.private).unwrap();
        if ssh_key::PrivateKey::from_openssh(&text).is_err() {
            found = Some(key);
            break;
        }
    }
    let key = found.expect("no P-521 key in 40 that ssh-key rejects: has ssh-key fixed its scalar decoding? then drop sign::pad_ecdsa_scalar");
    let KeyFile::Private(secret) = sign::load_key_file(&key.private).unwrap() else {
        panic!("read as a public key");
    };
    assert_eq!(
        secret
            .public_key()
            .to_openssh()
            .unwrap()
            .split_whitespace()
            .nth(1),
        key.public.split_whitespace().nth(1)
    );
    let signed = sign::sign_with_key(&secret, &p, HashAlg::Sha512).unwrap();
    let allowed = format!("alice@example.com {}\n", key.public);
    let (ok, text) = keygen_verify(
        dir.path(),
        &allowed,
        "alice@example.com",
        &signed.armored,
        &p.signed_message(),
    );
    assert!(ok, "{text}");
}
