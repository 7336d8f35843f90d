//! `medea approve <id>`: sign an approval of a plan and write it as a marker file or a file.
//!
//! Offline (`--write-marker --desired DIR` writes `approvals/<short-id>-<principal>.sig` for
//! committing, `--output FILE` writes the armored signature anywhere, `-` for stdout) it takes
//! only a full 64-hex plan id. Without those flags it signs the server's plan and submits it:
//! the id may then be a prefix, and the plan the server resolves it to must start with that
//! prefix and be the current plan ([`plan_to_sign`]); the full id is printed before signing.

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use miette::Diagnostic;
use ssh_key::HashAlg;

use crate::approval::sign::{self, Agent, KeyFile, SignError, SignedApproval};
use crate::approval::{ApprovalSource, NAMESPACE, Outcome, VerifyContext, allowed_signers, verify};
use crate::plan::id::PlanIdError;
use crate::plan::{PlanId, PlanIdRef, PlanState};

#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
  medea approve 3f2a...c9 --key ~/.ssh/id_ed25519 \\\n    \
  --principal alice@example.com --write-marker --desired ./clusters\n  \
  # the ssh-agent's key, signer from allowed_signers:\n  \
  medea approve 3f2a...c9 --allowed-signers /etc/medea/allowed_signers \\\n    \
  --write-marker --desired .\n  \
  # the agent's key for this public key; print the signature:\n  \
  medea approve 3f2a...c9 --key ~/.ssh/id_ed25519.pub --output -\n\n\
The same approval with plain OpenSSH:\n  \
  echo <full-id> | \\\n    \
  ssh-keygen -Y sign -n medea-approve -f ~/.ssh/id_ed25519 \\\n    \
  > approvals/<short-id>-<you>.sig")]
pub struct ApproveArgs {
    /// The full 64-hex plan id printed by `medea plan` (a short id needs a store to resolve).
    #[arg(add = super::complete::pending_plans())]
    pub id: String,
    /// Private key to sign with (unencrypted OpenSSH format), or a public key (`.pub`) whose
    /// private half is in the ssh-agent. Without it, the ssh-agent's only key signs.
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Your principal, as listed in the allowed signers (names the marker file). Found in
    /// `--allowed-signers` when not given.
    #[arg(long, value_name = "PRINCIPAL")]
    pub principal: Option<String>,
    /// An allowed_signers file to check the new signature against before writing it.
    #[arg(long, value_name = "FILE")]
    pub allowed_signers: Option<PathBuf>,
    /// Write `approvals/<short-id>-<principal>.sig` into the desired-state directory `--desired`.
    #[arg(long, requires = "desired")]
    pub write_marker: bool,
    /// The desired-state directory (the repository checkout) for `--write-marker`.
    #[arg(long, value_name = "DIR")]
    pub desired: Option<PathBuf>,
    /// Write the armored signature to FILE instead (`-` for stdout).
    #[arg(long, value_name = "FILE", conflicts_with = "write_marker")]
    pub output: Option<PathBuf>,
    /// Hash over the message (both are accepted; ssh-keygen uses sha512).
    #[arg(long, value_enum, default_value_t = Hash::Sha512)]
    pub hash: Hash,
    /// Without --write-marker or --output, the signature is submitted to this server.
    #[command(flatten)]
    pub client: super::client::ClientArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Hash {
    Sha256,
    Sha512,
}

#[derive(Debug, thiserror::Error, Diagnostic)]
pub enum ApproveError {
    #[error("invalid plan id")]
    #[diagnostic(code(medea::approve::plan_id))]
    PlanId(#[source] PlanIdError),
    #[error("`{input}` is a short plan id: only the server can resolve it")]
    #[diagnostic(
        code(medea::approve::short_id),
        help(
            "pass the full 64-hex id that `medea plan` prints, or drop --write-marker/--output to sign and submit the server's plan"
        )
    )]
    ShortId { input: String },
    /// The one reader's words (`approval::allowed_signers::read`), as `medea serve` and
    /// `medea approvals` show them for the same file.
    #[error(transparent)]
    #[diagnostic(
        code(medea::approve::allowed_signers),
        help("fix the lines listed; see `man ssh-keygen`, ALLOWED SIGNERS")
    )]
    Signers(#[from] allowed_signers::SignersFileError),
    #[error("the new signature would not count as an approval: {outcome}")]
    #[diagnostic(
        code(medea::approve::not_trusted),
        help("check the key and its line in the allowed signers file")
    )]
    NotTrusted { outcome: String },
    #[error(
        "principal `{given}` is not listed for key {fingerprint}; the allowed signers list it as `{listed}`"
    )]
    #[diagnostic(code(medea::approve::principal))]
    PrincipalMismatch {
        given: String,
        fingerprint: String,
        listed: String,
    },
    #[error("the marker file name needs your principal")]
    #[diagnostic(
        code(medea::approve::principal),
        help("pass --principal you@example.com, or --allowed-signers FILE to look it up")
    )]
    NoPrincipal,
    #[error("{message}")]
    #[diagnostic(code(medea::approve::server))]
    Server { message: String },
    #[error(
        "the server answered plan {returned} for `{typed}`, which does not start with it; nothing was signed"
    )]
    #[diagnostic(
        code(medea::approve::not_named),
        help(
            "check `--addr`/`MEDEA_ADDR` points at your medea server, then approve the full id `medea plan` prints"
        )
    )]
    NotNamed { typed: String, returned: String },
    #[error("failed to write `{path}`")]
    #[diagnostic(code(medea::approve::write))]
    Write {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error(transparent)]
    #[diagnostic(code(medea::approve::sign))]
    Sign(#[from] SignError),
}

pub fn run(args: ApproveArgs) -> miette::Result<u8> {
    approve(args).map_err(miette::Report::new)
}

#[allow(
    clippy::expect_used,
    reason = "clap enforces `--write-marker requires --desired`"
)]
fn approve(args: ApproveArgs) -> Result<u8, ApproveError> {
    if !args.write_marker && args.output.is_none() {
        return submit(args);
    }
    let plan = parse_full_id(&args.id)?;
    let signers = match &args.allowed_signers {
        Some(path) => Some(allowed_signers::read(path)?),
        None => None,
    };
    let hash = match args.hash {
        Hash::Sha256 => HashAlg::Sha256,
        Hash::Sha512 => HashAlg::Sha512,
    };
    let signed = sign_plan(&args, &plan, hash)?;

    let principal = match &signers {
        Some(signers) => {
            let ctx = VerifyContext {
                signers,
                current: &plan,
                known: &[],
                consumed: &[],
                now: jiff::Timestamp::now(),
            };
            let approval = match verify(&signed.armored, ApprovalSource::Api, &ctx) {
                Outcome::Approved(a) => a,
                other => {
                    return Err(ApproveError::NotTrusted {
                        outcome: other.to_string(),
                    });
                }
            };
            match &args.principal {
                Some(p) if !approval.principals.contains(p) => {
                    return Err(ApproveError::PrincipalMismatch {
                        given: p.clone(),
                        fingerprint: approval.fingerprint,
                        listed: approval.principals.join(","),
                    });
                }
                Some(p) => Some(p.clone()),
                None => Some(approval.principal),
            }
        }
        None => args.principal.clone(),
    };

    let mut err = std::io::stderr();
    if args.write_marker {
        let principal = principal.ok_or(ApproveError::NoPrincipal)?;
        let desired = args
            .desired
            .as_deref()
            .expect("clap: --write-marker requires --desired");
        let path = sign::write_marker(desired, &signed, &principal)?;
        let rel = sign::marker_file_name(&plan, &principal);
        let _ = writeln!(
            err,
            "signed plan {} as {principal} with key {}\nwrote {}\ncommit it: git -C {} add {rel} && git -C {} commit -m 'approve plan {}'",
            plan.short(),
            signed.fingerprint,
            path.display(),
            desired.display(),
            desired.display(),
            plan.short()
        );
    } else if let Some(out) = &args.output {
        if out.as_os_str() == "-" {
            let mut stdout = std::io::stdout();
            stdout
                .write_all(signed.armored.as_bytes())
                .map_err(|err| ApproveError::Write {
                    path: out.clone(),
                    err,
                })?;
        } else {
            std::fs::write(out, signed.armored.as_bytes()).map_err(|err| ApproveError::Write {
                path: out.clone(),
                err,
            })?;
        }
        let _ = writeln!(
            err,
            "signed plan {} with key {} (namespace {NAMESPACE})",
            plan.short(),
            signed.fingerprint
        );
    }
    Ok(crate::cli::exit::OK)
}

/// Sign the server's plan and submit the signature over the API.
fn submit(args: ApproveArgs) -> Result<u8, ApproveError> {
    use crate::api::pb;
    let rt = tokio::runtime::Runtime::new().map_err(|e| ApproveError::Server {
        message: format!("cannot start the runtime: {e}"),
    })?;
    let addr = args.client.addr();
    let server = |e: miette::Report| ApproveError::Server {
        message: format!("{e:?}"),
    };
    // What the user named: a full id or a prefix of one, never empty ("the current plan").
    let typed = PlanIdRef::parse(&args.id).map_err(ApproveError::PlanId)?;
    rt.block_on(async {
        let mut client = args.client.connect().await.map_err(server)?;
        let rpc = |s: tonic::Status| server(super::client::rpc_error(&addr, s));
        // An id that matches no plan is answered with the current plan's id (issue #52).
        let wanted = match client
            .get_plan(pb::GetPlanRequest {
                id: typed.as_str().to_string(),
            })
            .await
        {
            Ok(r) => r.into_inner().plan,
            Err(s) if s.code() == tonic::Code::NotFound => None,
            Err(s) => return Err(rpc(s)),
        };
        let current = client
            .get_plan(pb::GetPlanRequest { id: String::new() })
            .await
            .map_err(rpc)?
            .into_inner();
        let plan = plan_to_sign(&typed, wanted.as_ref(), current.plan.as_ref())?;
        // Say exactly what is signed before signing it.
        eprintln!("signing plan {}", plan.to_hex());
        let hash = match args.hash {
            Hash::Sha256 => HashAlg::Sha256,
            Hash::Sha512 => HashAlg::Sha512,
        };
        let signed = sign_plan(&args, &plan, hash)?;
        let r = client
            .submit_approval(pb::SubmitApprovalRequest {
                plan_id: plan.to_hex(),
                signature: signed.armored.clone(),
            })
            .await
            .map_err(rpc)?
            .into_inner();
        outln!(
            "{} ({} of {} approvals)",
            r.outcome,
            r.approvals,
            r.approvals_required
        );
        for j in &r.started_jobs {
            outln!("started rollout job {j}: follow it with `medea rollout status -w {j}`");
        }
        for g in &r.closed_gates {
            outln!("waiting: {g}");
        }
        if r.started_jobs.is_empty()
            && r.closed_gates.is_empty()
            && r.approvals < r.approvals_required
        {
            outln!(
                "waiting for {} more approval(s) from other people",
                r.approvals_required - r.approvals
            );
        }
        Ok(crate::cli::exit::OK)
    })
}

/// The plan `medea approve <typed>` may sign, from the server's answers: the plan it resolved
/// `typed` to must start with what the user typed, be the current plan, be fresh and never
/// executed. Anything else refuses, so a signature only ever covers the plan the user named.
fn plan_to_sign(
    typed: &PlanIdRef,
    wanted: Option<&crate::api::pb::Plan>,
    current: Option<&crate::api::pb::Plan>,
) -> Result<PlanId, ApproveError> {
    let (Some(wanted), Some(current)) = (wanted, current) else {
        return Err(ApproveError::Server {
            message: match current {
                Some(c) => format!(
                    "no plan `{}` on the server; the current plan is {}: review it with `medea plan` and approve that id (medea approve {})",
                    typed.as_str(),
                    c.id,
                    c.short_id
                ),
                None => format!(
                    "no plan `{}` on the server, and the server has no current plan yet (`medea plan` shows when it has)",
                    typed.as_str()
                ),
            },
        });
    };
    let plan = PlanId::parse_full(&wanted.id).map_err(ApproveError::PlanId)?;
    if !typed.matches(&plan) {
        return Err(ApproveError::NotNamed {
            typed: typed.as_str().to_string(),
            returned: plan.to_hex(),
        });
    }
    if wanted.id == current.id && wanted.stale {
        // The current plan, but the desired state or an observation moved since it was
        // computed: the server is computing its successor (issue #49: "plan X is stale: the
        // current plan is X" named the same plan twice).
        return Err(ApproveError::Server {
            message: format!(
                "plan {} is being replaced: the desired state or an observation changed since it was computed, and the server is computing a new plan; wait for `medea plan` to show it and approve that id (if the same plan stays, `medea plan` says why the new revision cannot be planned)",
                wanted.short_id
            ),
        });
    }
    if wanted.id != current.id {
        return Err(ApproveError::Server {
            message: format!(
                "plan {} is stale: the current plan is {}; review it with `medea plan` and approve that id",
                wanted.short_id, current.id
            ),
        });
    }
    match PlanState::from_wire(&wanted.state) {
        Some(PlanState::Blocked) => Err(ApproveError::Server {
            message: blocked_message(&wanted.short_id, &wanted.json),
        }),
        Some(PlanState::Consumed) => Err(ApproveError::Server {
            message: format!(
                "plan {} was already executed; an approval cannot start a plan twice",
                wanted.short_id
            ),
        }),
        _ => Ok(plan),
    }
}

/// Why a blocked plan cannot be signed: its blocking findings (from the plan's JSON form,
/// `clusters[].preflight[]`), by id, and how to acknowledge them.
fn blocked_message(short: &str, json: &str) -> String {
    let doc: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    let mut lines = Vec::new();
    for c in doc["clusters"].as_array().into_iter().flatten() {
        for f in c["preflight"].as_array().into_iter().flatten() {
            if f["severity"] == "blocking" && f["acknowledged"] != true {
                lines.push(format!(
                    "\n  cluster {}: [{}] {}",
                    c["cluster"].as_str().unwrap_or("?"),
                    f["id"].as_str().unwrap_or("?"),
                    f["message"].as_str().unwrap_or("")
                ));
            }
        }
    }
    format!(
        "plan {short} has blocking preflight findings and cannot be approved:{}\nfix the cause and replan, or accept a finding by listing its id under `spec.preflight.acknowledge` of the Cluster (a new desired revision, so a new plan to approve)",
        lines.concat()
    )
}

fn parse_full_id(input: &str) -> Result<PlanId, ApproveError> {
    let r = PlanIdRef::parse(input).map_err(ApproveError::PlanId)?;
    r.full().ok_or_else(|| ApproveError::ShortId {
        input: input.to_string(),
    })
}

fn sign_plan(
    args: &ApproveArgs,
    plan: &PlanId,
    hash: HashAlg,
) -> Result<SignedApproval, ApproveError> {
    let want = match &args.key {
        Some(path) => match sign::load_key_file(path)? {
            KeyFile::Private(key) => return Ok(sign::sign_with_key(&key, plan, hash)?),
            KeyFile::Public(pk) => Some(pk),
        },
        None => None,
    };
    let socket = std::env::var_os("SSH_AUTH_SOCK").ok_or(SignError::NoAgent)?;
    let mut agent = Agent::connect(std::path::Path::new(&socket))?;
    let key = agent.choose(want.as_ref())?;
    Ok(agent.sign(&key, plan, hash)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::pb;

    fn pb_plan(id: &PlanId) -> pb::Plan {
        pb::Plan {
            id: id.to_hex(),
            short_id: id.short(),
            state: "pending".into(),
            ..Default::default()
        }
    }

    #[test]
    fn signs_only_the_plan_the_user_named() {
        let a = PlanId::from_digest([0xaa; 32]);
        let b = PlanId::from_digest([0xbb; 32]);
        let typed = PlanIdRef::parse(&a.short()).unwrap();
        assert_eq!(
            plan_to_sign(&typed, Some(&pb_plan(&a)), Some(&pb_plan(&a))).unwrap(),
            a
        );
        // The server answers another plan for the prefix (a wrong or lying server): refused.
        let e = plan_to_sign(&typed, Some(&pb_plan(&b)), Some(&pb_plan(&b))).unwrap_err();
        assert!(
            matches!(&e, ApproveError::NotNamed { returned, .. } if *returned == b.to_hex()),
            "{e:?}"
        );
        // The named plan is not the current one: refused.
        let e = plan_to_sign(&typed, Some(&pb_plan(&a)), Some(&pb_plan(&b))).unwrap_err();
        assert!(e.to_string().contains("is stale"), "{e}");
        // Consumed: refused.
        let mut consumed = pb_plan(&a);
        consumed.state = "consumed".into();
        let e = plan_to_sign(&typed, Some(&consumed), Some(&consumed)).unwrap_err();
        assert!(e.to_string().contains("already executed"), "{e}");
        // Nothing typed is never "the current plan".
        assert!(matches!(
            PlanIdRef::parse(""),
            Err(PlanIdError::Length { .. })
        ));
    }
    /// Issue #52 item 6: an id that matches no plan is answered with the current plan's id.
    #[test]
    fn an_id_that_matches_no_plan_names_the_current_plan() {
        let a = PlanId::from_digest([0xaa; 32]);
        let typed = PlanIdRef::parse("0123456789ab").unwrap();
        let e = plan_to_sign(&typed, None, Some(&pb_plan(&a))).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("no plan `0123456789ab`"), "{text}");
        assert!(
            text.contains(&format!("the current plan is {}", a.to_hex())),
            "{text}"
        );
        assert!(
            text.contains(&format!("medea approve {}", a.short())),
            "{text}"
        );
        let e = plan_to_sign(&typed, None, None).unwrap_err();
        assert!(e.to_string().contains("no current plan yet"), "{e}");
    }

    /// Issue #49: the current plan whose basis moved (a reconcile pass is computing its
    /// successor) is refused as being replaced, not as "stale: the current plan is" itself.
    #[test]
    fn the_current_plan_being_replaced_is_not_called_stale_against_itself() {
        let a = PlanId::from_digest([0xaa; 32]);
        let typed = PlanIdRef::parse(&a.short()).unwrap();
        let mut moved = pb_plan(&a);
        moved.stale = true;
        let e = plan_to_sign(&typed, Some(&moved), Some(&moved)).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("is being replaced") && text.contains("computing a new plan"),
            "{text}"
        );
        assert!(!text.contains("the current plan is"), "{text}");
    }
}
