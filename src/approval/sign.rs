//! The signing adapter: produce an approval signature with a private key file or an ssh-agent,
//! and write marker files. The one part of `approval` that does I/O (files, a Unix socket).
//!
//! The ssh-agent client speaks the agent protocol (draft-miller-ssh-agent) directly:
//! `SSH_AGENTC_REQUEST_IDENTITIES` (11) → `SSH_AGENT_IDENTITIES_ANSWER` (12) and
//! `SSH_AGENTC_SIGN_REQUEST` (13) → `SSH_AGENT_SIGN_RESPONSE` (14) / `SSH_AGENT_FAILURE` (5), each
//! message a `uint32` length and a type byte. The data signed is the SSHSIG signed-data blob
//! (PROTOCOL.sshsig: `"SSHSIG"`, namespace, reserved, hash algorithm, H(message)), built by
//! `ssh_key::SshSig::signed_data`; RSA keys are asked for `rsa-sha2-512` (flag 4). That is two
//! messages over a socket, so medea does it itself rather than adding an async agent crate
//! (`ssh-agent-lib`) and its dependencies.
//!
//! Every signature produced here is verified against its own public key before it is returned.

use std::fmt;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ssh_key::private::KeypairData;
use ssh_key::{Algorithm, HashAlg, LineEnding, PrivateKey, PublicKey, Signature, SshSig};

use super::NAMESPACE;
use crate::plan::PlanId;

/// Why signing an approval failed.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// The key file could not be read.
    #[error("failed to read key file `{path}`")]
    ReadKey {
        /// The `--key` file.
        path: PathBuf,
        /// What reading it failed with.
        #[source]
        err: io::Error,
    },
    /// The file is not an OpenSSH key.
    #[error(
        "`{path}` is not an OpenSSH private or public key; medea reads keys in the format `ssh-keygen` writes (`-----BEGIN OPENSSH PRIVATE KEY-----`, or `ssh-ed25519 AAAA...` for a public key)"
    )]
    NotAKey {
        /// The `--key` file.
        path: PathBuf,
    },
    /// The private key is passphrase-protected.
    #[error(
        "key `{path}` is passphrase-protected; medea does not ask for passphrases: add it to your agent (`ssh-add {path}`) and approve without `--key`, or with `--key {path}.pub`"
    )]
    EncryptedKey {
        /// The `--key` file.
        path: PathBuf,
    },
    /// Signing with a private key failed.
    #[error("signing with key {fingerprint} failed")]
    Sign {
        /// `SHA256:...` of the key.
        fingerprint: String,
        /// What signing failed with.
        #[source]
        err: ssh_key::Error,
    },
    /// `SSH_AUTH_SOCK` is not set.
    #[error(
        "no ssh-agent: `SSH_AUTH_SOCK` is not set; start one (`eval $(ssh-agent)`, `ssh-add KEY`) or pass `--key FILE`"
    )]
    NoAgent,
    /// The agent's socket could not be used.
    #[error("failed to talk to the ssh-agent at `{socket}`")]
    AgentIo {
        /// The agent's socket.
        socket: PathBuf,
        /// What talking to it failed with.
        #[source]
        err: io::Error,
    },
    /// The agent answered outside the protocol.
    #[error("the ssh-agent at `{socket}` sent an unexpected reply: {detail}")]
    AgentProtocol {
        /// The agent's socket.
        socket: PathBuf,
        /// What was unexpected.
        detail: String,
    },
    /// The agent refused to sign.
    #[error(
        "the ssh-agent refused to sign with key {fingerprint} (locked agent, or confirmation declined?)"
    )]
    AgentRefused {
        /// `SHA256:...` of the key.
        fingerprint: String,
    },
    /// The agent holds no key medea can use.
    #[error("the ssh-agent at `{socket}` holds no usable keys; add one with `ssh-add KEY`")]
    AgentEmpty {
        /// The agent's socket.
        socket: PathBuf,
    },
    /// The key named by `--key KEY.pub` is not in the agent.
    #[error(
        "key {fingerprint} is not in the ssh-agent; add it with `ssh-add` (the private key next to the .pub file)"
    )]
    AgentKeyMissing {
        /// `SHA256:...` of the key asked for.
        fingerprint: String,
    },
    /// The agent holds several keys and none was chosen.
    #[error("the ssh-agent holds several keys ({fingerprints}); choose one with `--key PATH.pub`")]
    AgentAmbiguous {
        /// The candidates, comma-separated.
        fingerprints: String,
    },
    /// The signature made does not verify (checked before it is used).
    #[error("the signature made with key {fingerprint} does not verify; refusing to use it")]
    SelfCheck {
        /// `SHA256:...` of the key.
        fingerprint: String,
    },
    /// The marker file could not be written.
    #[error("failed to write approval marker `{path}`")]
    WriteMarker {
        /// The marker's path.
        path: PathBuf,
        /// What writing it failed with.
        #[source]
        err: io::Error,
    },
    /// A marker with another signature is already there.
    #[error(
        "approval marker `{path}` already exists with a different signature; remove it first if you mean to replace it"
    )]
    MarkerExists {
        /// The marker's path.
        path: PathBuf,
    },
}

/// A private key. Debug shows only the fingerprint; there is no Display or Serialize.
pub struct SecretKey(PrivateKey);

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SecretKey(<redacted> {})",
            self.0.fingerprint(HashAlg::Sha256)
        )
    }
}

impl SecretKey {
    /// A fresh Ed25519 key (`medea demo`'s ephemeral approvers).
    pub fn generate_ed25519() -> Result<SecretKey, ssh_key::Error> {
        PrivateKey::random(&mut ssh_key::rand_core::OsRng, ssh_key::Algorithm::Ed25519)
            .map(SecretKey)
    }
    /// Its public half.
    pub fn public_key(&self) -> &PublicKey {
        self.0.public_key()
    }
}

/// What `--key FILE` holds: a private key to sign with, or a public key naming an agent key.
#[derive(Debug)]
pub enum KeyFile {
    /// An unencrypted private key: medea signs with it.
    Private(Box<SecretKey>),
    /// A public key: the ssh-agent signs with its private half.
    Public(PublicKey),
}

/// Read `--key FILE`: an unencrypted OpenSSH private key, or a public key (`.pub`) whose private
/// half is in the ssh-agent (what `ssh-keygen -Y sign -f key.pub` does).
pub fn load_key_file(path: &Path) -> Result<KeyFile, SignError> {
    let text = std::fs::read_to_string(path).map_err(|err| SignError::ReadKey {
        path: path.to_path_buf(),
        err,
    })?;
    if let Ok(pk) = PublicKey::from_openssh(text.trim()) {
        return Ok(KeyFile::Public(pk));
    }
    let key = PrivateKey::from_openssh(text.trim())
        .or_else(|e| match pad_ecdsa_scalar(text.trim()) {
            Some(fixed) => PrivateKey::from_openssh(&fixed),
            None => Err(e),
        })
        .map_err(|_| SignError::NotAKey {
            path: path.to_path_buf(),
        })?;
    if key.is_encrypted() {
        return Err(SignError::EncryptedKey {
            path: path.to_path_buf(),
        });
    }
    Ok(KeyFile::Private(Box::new(SecretKey(key))))
}

/// Re-encode the private scalar of an unencrypted OpenSSH ECDSA key at the curve's full width.
///
/// OpenSSH writes the scalar as an mpint, which drops leading zero bytes; ssh-key 0.6.7 insists
/// on exactly the curve size (32/48/66 bytes, or one more with a zero prefix) and refuses the key
/// otherwise. That is about half of all P-521 keys (whose top byte is often 0) and 1 in 256
/// P-256/P-384 keys. Returns `None` for anything this does not apply to (other key types,
/// encrypted keys, several keys in one file, malformed input), leaving the error to ssh-key.
fn pad_ecdsa_scalar(pem: &str) -> Option<String> {
    use base64::Engine;
    const BEGIN: &str = "-----BEGIN OPENSSH PRIVATE KEY-----";
    const END: &str = "-----END OPENSSH PRIVATE KEY-----";
    const MAGIC: &[u8] = b"openssh-key-v1\0";
    let body = pem.strip_prefix(BEGIN)?.trim().strip_suffix(END)?;
    let b64: String = body.split_whitespace().collect();
    let blob = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    let mut c = Cursor(blob.strip_prefix(MAGIC)?);
    let (cipher, kdf, kdf_opts) = (c.string()?, c.string()?, c.string()?);
    if cipher != b"none" || kdf != b"none" || c.u32()? != 1 {
        return None;
    }
    let public = c.string()?;
    let private = c.string()?;
    if !c.0.is_empty() {
        return None;
    }
    let mut p = Cursor(private);
    let (check1, check2) = (p.u32()?, p.u32()?);
    let key_type = p.string()?;
    let size = match key_type {
        b"ecdsa-sha2-nistp256" => 32,
        b"ecdsa-sha2-nistp384" => 48,
        b"ecdsa-sha2-nistp521" => 66,
        _ => return None,
    };
    let (curve, point, scalar, comment) = (p.string()?, p.string()?, p.string()?, p.string()?);
    let first = scalar.iter().position(|b| *b != 0).unwrap_or(scalar.len());
    let digits = &scalar[first..];
    if digits.len() > size {
        return None;
    }
    let mut padded = vec![0u8; size - digits.len()];
    padded.extend_from_slice(digits);
    if padded[0] >= 0x80 {
        padded.insert(0, 0);
    }
    let mut section = Vec::new();
    section.extend_from_slice(&check1.to_be_bytes());
    section.extend_from_slice(&check2.to_be_bytes());
    for field in [key_type, curve, point, &padded, comment] {
        put_string(&mut section, field);
    }
    let mut pad = 1u8;
    while section.len() % 8 != 0 {
        section.push(pad);
        pad += 1;
    }
    let mut out = MAGIC.to_vec();
    for field in [cipher, kdf, kdf_opts] {
        put_string(&mut out, field);
    }
    out.extend_from_slice(&1u32.to_be_bytes());
    put_string(&mut out, public);
    put_string(&mut out, &section);
    let encoded = base64::engine::general_purpose::STANDARD.encode(&out);
    let mut text = format!("{BEGIN}\n");
    for chunk in encoded.as_bytes().chunks(70) {
        text.push_str(std::str::from_utf8(chunk).ok()?);
        text.push('\n');
    }
    text.push_str(END);
    text.push('\n');
    Some(text)
}

/// An approval signature, ready to write as a marker or submit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedApproval {
    /// The plan it approves.
    pub plan: PlanId,
    /// Armored SSHSIG (`-----BEGIN SSH SIGNATURE-----`, LF line endings, trailing newline).
    pub armored: String,
    /// The signing key's public half.
    pub public_key: PublicKey,
    /// `SHA256:...`
    pub fingerprint: String,
}

fn finish(plan: &PlanId, public_key: PublicKey, sig: SshSig) -> Result<SignedApproval, SignError> {
    let fingerprint = public_key.fingerprint(HashAlg::Sha256).to_string();
    if public_key
        .verify(NAMESPACE, &plan.signed_message(), &sig)
        .is_err()
    {
        return Err(SignError::SelfCheck { fingerprint });
    }
    let mut armored = sig.to_pem(LineEnding::LF).map_err(|err| SignError::Sign {
        fingerprint: fingerprint.clone(),
        err,
    })?;
    if !armored.ends_with('\n') {
        armored.push('\n');
    }
    Ok(SignedApproval {
        plan: *plan,
        armored,
        public_key,
        fingerprint,
    })
}

/// Sign `plan` (its `signed_message()`, under `medea-approve`) with a private key.
pub fn sign_with_key(
    key: &SecretKey,
    plan: &PlanId,
    hash: HashAlg,
) -> Result<SignedApproval, SignError> {
    let public = key.public_key().clone();
    let sign_err = |err| SignError::Sign {
        fingerprint: public.fingerprint(HashAlg::Sha256).to_string(),
        err,
    };
    let sig = match key.0.key_data() {
        KeypairData::Rsa(rsa_key) => {
            let data =
                SshSig::signed_data(NAMESPACE, hash, &plan.signed_message()).map_err(sign_err)?;
            let signature = sign_rsa_sha512(rsa_key, &data).map_err(sign_err)?;
            SshSig::new(public.key_data().clone(), NAMESPACE, hash, signature).map_err(sign_err)?
        }
        _ => key
            .0
            .sign(NAMESPACE, hash, &plan.signed_message())
            .map_err(sign_err)?,
    };
    finish(plan, public, sig)
}

/// `rsa-sha2-512` (PKCS#1 v1.5, SHA-512) over `data`.
///
/// ssh-key 0.6.7 builds the RSA private key from the primes `[p, p]` instead of `[p, q]`, so its
/// own RSA signing fails with `Error::Crypto` for every real key (RustCrypto/SSH#436, fixed only
/// in 0.7 pre-releases). Build the key from the right components here.
fn sign_rsa_sha512(
    key: &ssh_key::private::RsaKeypair,
    data: &[u8],
) -> Result<Signature, ssh_key::Error> {
    use rsa::signature::{SignatureEncoding, Signer};
    let int = |m: &ssh_key::Mpint| -> Result<rsa::BigUint, ssh_key::Error> {
        let bytes = m.as_positive_bytes().ok_or(ssh_key::Error::Crypto)?;
        Ok(rsa::BigUint::from_bytes_be(bytes))
    };
    let private = rsa::RsaPrivateKey::from_components(
        int(&key.public.n)?,
        int(&key.public.e)?,
        int(&key.private.d)?,
        vec![int(&key.private.p)?, int(&key.private.q)?],
    )
    .map_err(|_| ssh_key::Error::Crypto)?;
    let signer = rsa::pkcs1v15::SigningKey::<sha2::Sha512>::new(private);
    let sig = signer.try_sign(data).map_err(|_| ssh_key::Error::Crypto)?;
    Signature::new(
        Algorithm::Rsa {
            hash: Some(HashAlg::Sha512),
        },
        sig.to_vec(),
    )
}

const SSH_AGENT_FAILURE: u8 = 5;
const SSH_AGENTC_REQUEST_IDENTITIES: u8 = 11;
const SSH_AGENT_IDENTITIES_ANSWER: u8 = 12;
const SSH_AGENTC_SIGN_REQUEST: u8 = 13;
const SSH_AGENT_SIGN_RESPONSE: u8 = 14;
const SSH_AGENT_RSA_SHA2_512: u32 = 4;
/// Agent replies larger than this are refused (OpenSSH's own limit is 256 KiB).
const MAX_AGENT_MESSAGE: usize = 256 * 1024;

/// A connection to an ssh-agent.
pub struct Agent {
    socket: PathBuf,
    stream: UnixStream,
}

impl fmt::Debug for Agent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Agent")
            .field("socket", &self.socket)
            .finish()
    }
}

fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s);
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn u32(&mut self) -> Option<u32> {
        let (h, t) = self.0.split_first_chunk::<4>()?;
        self.0 = t;
        Some(u32::from_be_bytes(*h))
    }
    fn string(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        if n > self.0.len() {
            return None;
        }
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        Some(h)
    }
}

impl Agent {
    /// Connect to the agent at `socket` (usually `SSH_AUTH_SOCK`).
    pub fn connect(socket: &Path) -> Result<Agent, SignError> {
        let io_err = |err| SignError::AgentIo {
            socket: socket.to_path_buf(),
            err,
        };
        let stream = UnixStream::connect(socket).map_err(io_err)?;
        // An agent may ask its user to confirm (`ssh-add -c`): allow time for that, not forever.
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .map_err(io_err)?;
        stream
            .set_write_timeout(Some(Duration::from_secs(10)))
            .map_err(io_err)?;
        Ok(Agent {
            socket: socket.to_path_buf(),
            stream,
        })
    }

    fn protocol(&self, detail: impl Into<String>) -> SignError {
        SignError::AgentProtocol {
            socket: self.socket.clone(),
            detail: detail.into(),
        }
    }

    fn request(&mut self, body: &[u8]) -> Result<Vec<u8>, SignError> {
        let socket = self.socket.clone();
        let io_err = |err| SignError::AgentIo {
            socket: socket.clone(),
            err,
        };
        let mut msg = Vec::with_capacity(body.len() + 4);
        put_string(&mut msg, body);
        self.stream.write_all(&msg).map_err(io_err)?;
        let mut len = [0u8; 4];
        self.stream.read_exact(&mut len).map_err(io_err)?;
        let len = u32::from_be_bytes(len) as usize;
        if len == 0 || len > MAX_AGENT_MESSAGE {
            return Err(self.protocol(format!("reply of {len} bytes")));
        }
        let mut reply = vec![0u8; len];
        self.stream.read_exact(&mut reply).map_err(io_err)?;
        Ok(reply)
    }

    /// The plain public keys the agent holds (certificates and unknown key types are skipped).
    pub fn identities(&mut self) -> Result<Vec<PublicKey>, SignError> {
        let reply = self.request(&[SSH_AGENTC_REQUEST_IDENTITIES])?;
        let (kind, rest) = reply
            .split_first()
            .ok_or_else(|| self.protocol("empty reply"))?;
        if *kind != SSH_AGENT_IDENTITIES_ANSWER {
            return Err(self.protocol(format!(
                "message type {kind} instead of an identities answer"
            )));
        }
        let mut c = Cursor(rest);
        let n = c
            .u32()
            .ok_or_else(|| self.protocol("truncated identities answer"))?;
        let mut keys = Vec::new();
        for _ in 0..n {
            let blob = c
                .string()
                .ok_or_else(|| self.protocol("truncated identities answer"))?;
            let comment = c
                .string()
                .ok_or_else(|| self.protocol("truncated identities answer"))?;
            if let Ok(mut pk) = PublicKey::from_bytes(blob) {
                pk.set_comment(String::from_utf8_lossy(comment));
                keys.push(pk);
            }
        }
        Ok(keys)
    }

    /// Sign `plan` with the agent's key `key`.
    pub fn sign(
        &mut self,
        key: &PublicKey,
        plan: &PlanId,
        hash: HashAlg,
    ) -> Result<SignedApproval, SignError> {
        let fingerprint = key.fingerprint(HashAlg::Sha256).to_string();
        let sign_err = |err| SignError::Sign {
            fingerprint: fingerprint.clone(),
            err,
        };
        let data =
            SshSig::signed_data(NAMESPACE, hash, &plan.signed_message()).map_err(sign_err)?;
        let blob = key.to_bytes().map_err(sign_err)?;
        let flags = if matches!(key.algorithm(), Algorithm::Rsa { .. }) {
            SSH_AGENT_RSA_SHA2_512
        } else {
            0
        };
        let mut req = vec![SSH_AGENTC_SIGN_REQUEST];
        put_string(&mut req, &blob);
        put_string(&mut req, &data);
        req.extend_from_slice(&flags.to_be_bytes());
        let reply = self.request(&req)?;
        match reply.split_first() {
            Some((&SSH_AGENT_SIGN_RESPONSE, rest)) => {
                let mut c = Cursor(rest);
                let sig_blob = c
                    .string()
                    .ok_or_else(|| self.protocol("truncated sign response"))?;
                let signature = Signature::try_from(sig_blob).map_err(|_| {
                    self.protocol("the sign response does not hold an SSH signature")
                })?;
                let sig = SshSig::new(key.key_data().clone(), NAMESPACE, hash, signature)
                    .map_err(sign_err)?;
                finish(plan, key.clone(), sig)
            }
            Some((&SSH_AGENT_FAILURE, _)) => Err(SignError::AgentRefused { fingerprint }),
            Some((kind, _)) => {
                Err(self.protocol(format!("message type {kind} instead of a sign response")))
            }
            None => Err(self.protocol("empty reply")),
        }
    }

    /// Pick the agent key to sign with: `want` if given (it must be in the agent), otherwise the
    /// only key the agent holds.
    #[allow(
        clippy::expect_used,
        reason = "the match arm is `1 =>`: the list has exactly one key"
    )]
    pub fn choose(&mut self, want: Option<&PublicKey>) -> Result<PublicKey, SignError> {
        let keys = self.identities()?;
        if let Some(w) = want {
            return keys
                .into_iter()
                .find(|k| k.key_data() == w.key_data())
                .ok_or_else(|| SignError::AgentKeyMissing {
                    fingerprint: w.fingerprint(HashAlg::Sha256).to_string(),
                });
        }
        match keys.len() {
            0 => Err(SignError::AgentEmpty {
                socket: self.socket.clone(),
            }),
            1 => Ok(keys.into_iter().next().expect("one key")),
            _ => Err(SignError::AgentAmbiguous {
                fingerprints: keys
                    .iter()
                    .map(|k| k.fingerprint(HashAlg::Sha256).to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }
}

/// Characters kept in the principal part of a marker file name; everything else becomes `_`.
fn file_safe(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '@' | '.' | '_' | '+' | '-')
}

/// The principal as it appears in a marker file name (no `/`, spaces or control characters;
/// never empty, never starting with `.`).
pub fn sanitize_principal(principal: &str) -> String {
    let mut s: String = principal
        .chars()
        .map(|c| if file_safe(c) { c } else { '_' })
        .collect();
    if s.is_empty() {
        s.push('_');
    }
    if s.starts_with('.') {
        s.replace_range(0..1, "_");
    }
    s
}

/// `approvals/<short-id>-<principal>.sig`, relative to the desired-state root.
pub fn marker_file_name(plan: &PlanId, principal: &str) -> String {
    format!(
        "approvals/{}-{}.sig",
        plan.short(),
        sanitize_principal(principal)
    )
}

/// Write `signed` as the marker for `principal` under `desired_root` (creating `approvals/`).
/// Writing the same signature twice is fine; replacing a different one is refused.
/// Returns the path written.
pub fn write_marker(
    desired_root: &Path,
    signed: &SignedApproval,
    principal: &str,
) -> Result<PathBuf, SignError> {
    let path = desired_root.join(marker_file_name(&signed.plan, principal));
    let write_err = |err| SignError::WriteMarker {
        path: path.clone(),
        err,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(write_err)?;
    }
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
    {
        Ok(mut f) => {
            f.write_all(signed.armored.as_bytes()).map_err(write_err)?;
            f.sync_all().map_err(write_err)?;
            Ok(path)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let existing = std::fs::read_to_string(&path).map_err(write_err)?;
            if existing == signed.armored {
                Ok(path)
            } else {
                Err(SignError::MarkerExists { path })
            }
        }
        Err(e) => Err(write_err(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_names_are_safe() {
        let p = PlanId::from_digest([0xab; 32]);
        assert_eq!(
            marker_file_name(&p, "alice@example.com"),
            "approvals/abababababab-alice@example.com.sig"
        );
        assert_eq!(
            marker_file_name(&p, "../etc/x y"),
            "approvals/abababababab-_._etc_x_y.sig"
        );
        assert_eq!(marker_file_name(&p, ""), "approvals/abababababab-_.sig");
        assert_eq!(sanitize_principal("bob\n\u{e9}"), "bob__");
    }

    #[test]
    fn secret_key_debug_is_redacted() {
        let k = SecretKey(
            PrivateKey::new(
                ssh_key::private::KeypairData::Ed25519(
                    ssh_key::private::Ed25519Keypair::from_seed(&[3; 32]),
                ),
                "",
            )
            .unwrap(),
        );
        let d = format!("{k:?}");
        assert!(d.starts_with("SecretKey(<redacted> SHA256:"), "{d}");
        let pem = k.0.to_openssh(LineEnding::LF).unwrap();
        let body: String = pem.lines().nth(1).unwrap().chars().take(20).collect();
        assert!(!d.contains(&body));
    }

    #[test]
    fn key_signs_and_verifies() {
        let k = SecretKey(
            PrivateKey::new(
                ssh_key::private::KeypairData::Ed25519(
                    ssh_key::private::Ed25519Keypair::from_seed(&[4; 32]),
                ),
                "",
            )
            .unwrap(),
        );
        let plan = PlanId::from_digest([1; 32]);
        let s = sign_with_key(&k, &plan, HashAlg::Sha256).unwrap();
        assert!(s.armored.starts_with("-----BEGIN SSH SIGNATURE-----\n"));
        assert!(s.armored.ends_with("-----END SSH SIGNATURE-----\n"));
        let sig: SshSig = s.armored.parse().unwrap();
        assert_eq!(sig.hash_alg(), HashAlg::Sha256);
        assert!(
            s.public_key
                .verify(NAMESPACE, &plan.signed_message(), &sig)
                .is_ok()
        );
        assert!(
            s.public_key
                .verify(
                    NAMESPACE,
                    &PlanId::from_digest([2; 32]).signed_message(),
                    &sig
                )
                .is_err()
        );
    }

    /// A one-connection fake agent answering each request with the next canned reply body.
    fn fake_agent(
        replies: Vec<Vec<u8>>,
    ) -> (tempfile::TempDir, PathBuf, std::thread::JoinHandle<()>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let handle = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            for reply in replies {
                let mut len = [0u8; 4];
                if conn.read_exact(&mut len).is_err() {
                    return;
                }
                let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
                conn.read_exact(&mut body).unwrap();
                let mut msg = Vec::new();
                put_string(&mut msg, &reply);
                conn.write_all(&msg).unwrap();
            }
        });
        (dir, path, handle)
    }

    #[test]
    fn agent_replies_are_checked() {
        let key = PrivateKey::new(
            ssh_key::private::KeypairData::Ed25519(ssh_key::private::Ed25519Keypair::from_seed(
                &[5; 32],
            )),
            "",
        )
        .unwrap();
        let public = key.public_key().clone();
        let mut answer = vec![SSH_AGENT_IDENTITIES_ANSWER];
        answer.extend_from_slice(&1u32.to_be_bytes());
        put_string(&mut answer, &public.to_bytes().unwrap());
        put_string(&mut answer, b"comment");
        let truncated = vec![SSH_AGENT_IDENTITIES_ANSWER, 0, 0, 0, 2, 0, 0];
        let (_dir, path, handle) =
            fake_agent(vec![answer, vec![SSH_AGENT_FAILURE], truncated, vec![99]]);
        let mut agent = Agent::connect(&path).unwrap();
        let chosen = agent.choose(None).unwrap();
        assert_eq!(chosen.key_data(), public.key_data());
        assert_eq!(chosen.comment(), "comment");
        let plan = PlanId::from_digest([1; 32]);
        assert!(matches!(
            agent.sign(&chosen, &plan, HashAlg::Sha512),
            Err(SignError::AgentRefused { .. })
        ));
        let e = agent.identities().unwrap_err();
        assert!(
            matches!(&e, SignError::AgentProtocol { detail, .. } if detail.contains("truncated")),
            "{e}"
        );
        let e = agent.sign(&chosen, &plan, HashAlg::Sha512).unwrap_err();
        assert!(
            matches!(&e, SignError::AgentProtocol { detail, .. } if detail.contains("type 99")),
            "{e}"
        );
        drop(agent);
        handle.join().unwrap();
    }
}
