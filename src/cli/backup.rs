//! `medea backup list|show|now|verify`: the scheduled etcd backups of a running server
//! (issue #37). `verify` runs on the operator's machine: it reads a copy of the backup file and,
//! given the operator's age identity, decrypts it there (the key never goes to the server).

use std::path::PathBuf;

use clap::{Args, Subcommand};
use miette::{IntoDiagnostic as _, WrapErr as _};

use super::client::{ClientArgs, rpc_error};
use super::exit;
use super::output::{self, Format};
use crate::api::pb;
use crate::backup::{BackupRecord, Trigger};

pub use super::backup_restore::{
    RestoreTools, Restored, restore_and_count, restore_and_count_with,
};

/// Largest identity file read.
const MAX_IDENTITY: u64 = 64 * 1024;

#[derive(Debug, Args)]
pub struct BackupArgs {
    #[command(subcommand)]
    pub action: BackupAction,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Subcommand)]
pub enum BackupAction {
    /// The recorded backups, oldest first.
    #[command(
        after_help = "Examples:\n  medea backup list\n  medea backup list --cluster prod -o json"
    )]
    List {
        /// Only the backups of this cluster.
        #[arg(long, add = super::complete::clusters())]
        cluster: Option<String>,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// One backup's record: member, sizes, checksums, recipients.
    #[command(after_help = "Examples:\n  medea backup show prod-20261205T030000Z.db.age")]
    Show {
        /// The backup's file name (`medea backup list` lists them).
        file: String,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Take a backup of a cluster now (its applied `spec.backup` settings).
    #[command(
        after_help = "Examples:\n  medea backup now\n  medea backup now --cluster prod\n\n--cluster may be left out when the server knows one cluster."
    )]
    Now {
        /// The cluster to back up (default: the only cluster, when the server knows one).
        #[arg(long, add = super::complete::clusters())]
        cluster: Option<String>,
    },
    /// Check a copy of a backup file against its record.
    ///
    /// Size and sha256 of the file; with --identity, it is also decrypted here and the etcd
    /// snapshot inside checked (etcd's sha256 trailer, size and sha256 as recorded).
    #[command(
        after_help = "Examples:\n  medea backup verify ./prod-20261205T030000Z.db.age\n  medea backup verify ./prod-20261205T030000Z.db.age --identity key.txt\n  medea backup verify ./prod-20261205T030000Z.db.age -i key.txt --restore\n\nThe record is found by the file's name. The identity (an age key file, 0600)\nis read here and never sent to the server."
    )]
    Verify {
        /// The backup file (a copy on this machine).
        file: PathBuf,
        /// An age identity file (`age-keygen -o key.txt`), one of the recipients.
        #[arg(long, short = 'i')]
        identity: Option<PathBuf>,
        /// Also restore the snapshot into a throwaway etcd (needs `etcd` and `etcdctl` on PATH,
        /// `etcdutl` used for the restore when present, and --identity) and count its keys. It
        /// listens only on unix sockets inside a 0700 temporary directory.
        #[arg(long, requires = "identity")]
        restore: bool,
    },
}

fn runtime() -> miette::Result<tokio::runtime::Runtime> {
    tokio::runtime::Runtime::new()
        .into_diagnostic()
        .wrap_err("cannot start the runtime")
}

fn table(backups: &[pb::Backup]) -> String {
    output::table(
        &[
            "CLUSTER",
            "FILE",
            "TAKEN",
            "TRIGGER",
            "MEMBER",
            "SIZE",
            "REVISION",
            "DESTINATION",
        ],
        &backups
            .iter()
            .map(|b| {
                vec![
                    b.cluster.clone(),
                    b.file.clone(),
                    output::when(&b.taken_at),
                    b.trigger.clone(),
                    b.member.clone(),
                    b.size.to_string(),
                    b.revision
                        .map_or_else(|| "-".to_string(), |r| r.to_string()),
                    b.destination.clone(),
                ]
            })
            .collect::<Vec<_>>(),
    )
}

fn show(b: &pb::Backup) -> String {
    let mut s = String::new();
    let mut line = |k: &str, v: &str| {
        s.push_str(&format!("{k:<16} {v}\n"));
    };
    line("cluster", &b.cluster);
    line("file", &b.file);
    line("taken", &output::when(&b.taken_at));
    line("trigger", &b.trigger);
    if !b.slot.is_empty() {
        line("slot", &output::when(&b.slot));
    }
    line("member", &b.member);
    line("destination", &b.destination);
    line("size", &b.size.to_string());
    line("sha256", &b.sha256);
    line("snapshot size", &b.snapshot_size.to_string());
    line("snapshot sha256", &b.snapshot_sha256);
    line(
        "etcd revision",
        &b.revision
            .map_or_else(|| "unknown".to_string(), |r| r.to_string()),
    );
    for r in &b.recipients {
        line("recipient", r);
    }
    s
}

fn record_of(b: &pb::Backup) -> miette::Result<BackupRecord> {
    let ts = |s: &str| -> miette::Result<jiff::Timestamp> {
        s.parse()
            .into_diagnostic()
            .wrap_err_with(|| format!("the server sent a malformed time `{s}`"))
    };
    Ok(BackupRecord {
        cluster: b.cluster.clone(),
        file: b.file.clone(),
        taken_at: ts(&b.taken_at)?,
        slot: if b.slot.is_empty() {
            None
        } else {
            Some(ts(&b.slot)?)
        },
        trigger: if b.trigger == "manual" {
            Trigger::Manual
        } else {
            Trigger::Scheduled
        },
        member: b.member.clone(),
        snapshot_size: b.snapshot_size,
        snapshot_sha256: b.snapshot_sha256.clone(),
        revision: b.revision,
        size: b.size,
        sha256: b.sha256.clone(),
        destination: b.destination.clone(),
        recipients: b.recipients.clone(),
    })
}

/// The operator's age identity from `path` (bounded read, 0600 required: it is a secret).
fn identity(path: &std::path::Path) -> miette::Result<age::x25519::Identity> {
    use std::str::FromStr as _;
    let bytes = crate::private_file::read_bounded(
        path,
        MAX_IDENTITY,
        crate::private_file::Privacy::Private,
    )
    .map_err(|e| miette::Report::from_err(e).wrap_err("cannot read the age identity"))?;
    let text = String::from_utf8_lossy(&bytes);
    text.lines()
        .map(str::trim)
        .find(|l| l.starts_with("AGE-SECRET-KEY-"))
        .and_then(|l| age::x25519::Identity::from_str(l).ok())
        .ok_or_else(|| {
            miette::miette!(
                help = "`age-keygen -o key.txt` writes one; passphrase-protected and plugin identities are not read",
                "`{}` holds no age X25519 identity (a line `AGE-SECRET-KEY-1…`)",
                path.display()
            )
        })
}

pub fn run(args: BackupArgs) -> miette::Result<u8> {
    let addr = args.client.addr();
    runtime()?.block_on(async move {
        let mut c = args.client.connect().await?;
        let rpc = |s| rpc_error(&addr, s);
        match args.action {
            BackupAction::List { cluster, output: fmt } => {
                let r = c
                    .list_backups(pb::ListBackupsRequest {
                        cluster: cluster.unwrap_or_default(),
                    })
                    .await
                    .map_err(rpc)?
                    .into_inner();
                let text = match fmt {
                    Format::Json => output::json(&r.backups),
                    Format::Yaml => output::yaml(&r.backups),
                    Format::Table | Format::Wide => table(&r.backups),
                };
                out!("{text}");
                Ok(exit::OK)
            }
            BackupAction::Show { file, output: fmt } => {
                let b = find(&mut c, &addr, &file).await?;
                let text = match fmt {
                    Format::Json => output::json(&b),
                    Format::Yaml => output::yaml(&b),
                    Format::Table | Format::Wide => show(&b),
                };
                out!("{text}");
                Ok(exit::OK)
            }
            BackupAction::Now { cluster } => {
                let cluster = match cluster {
                    Some(c) => c,
                    None => {
                        let clusters = c
                            .list_clusters(pb::ListClustersRequest {})
                            .await
                            .map_err(rpc)?
                            .into_inner()
                            .clusters;
                        super::rollout::only_cluster(clusters.iter().map(|c| c.name.as_str()))?
                    }
                };
                let r = c
                    .backup_now(pb::BackupNowRequest { cluster })
                    .await
                    .map_err(rpc)?
                    .into_inner();
                let b = r
                    .backup
                    .ok_or_else(|| miette::miette!("the server answered without the backup"))?;
                out!("{}", show(&b));
                Ok(exit::OK)
            }
            BackupAction::Verify {
                file,
                identity: id,
                restore,
            } => {
                let name = file
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .ok_or_else(|| miette::miette!("`{}` names no file", file.display()))?;
                let b = find(&mut c, &addr, &name).await?;
                let record = record_of(&b)?;
                let identity_path = id.clone();
                let id = id.as_deref().map(identity).transpose()?;
                let f = std::fs::File::open(&file)
                    .into_diagnostic()
                    .wrap_err_with(|| format!("cannot open `{}`", file.display()))?;
                let verified = tokio::task::spawn_blocking(move || {
                    crate::backup::verify(f, &record, id.as_ref())
                })
                .await
                .into_diagnostic()?
                .map_err(|e| miette::Report::from_err(e).wrap_err(format!("{name} did not verify")))?;
                outln!(
                    "{name}: size {} and sha256 {} match the record",
                    verified.size, verified.sha256
                );
                match verified.snapshot {
                    Some((size, sha)) => outln!(
                        "decrypted: a complete etcd snapshot (sha256 trailer checked), size {size}, sha256 {sha}, as recorded"
                    ),
                    None => outln!("not decrypted (pass --identity to check the snapshot inside)"),
                }
                if restore && let Some(id_path) = identity_path {
                    let id = identity(&id_path)?;
                    let restored =
                        tokio::task::spawn_blocking(move || restore_and_count(&file, &id, ""))
                            .await
                            .into_diagnostic()??;
                    match b.revision {
                        // The restored etcd's revision is the snapshot's newest key's, or the
                        // compaction's when that is later: never older than the recorded one.
                        Some(recorded) if restored.revision < recorded => {
                            return Err(miette::miette!(
                                help = "the file is not the snapshot that was recorded; take a new backup",
                                "{name} did not verify: the restored etcd is at revision {}, before the recorded revision {recorded}",
                                restored.revision
                            ));
                        }
                        Some(recorded) => outln!(
                            "restored into a throwaway etcd: it opens, holds {} keys and is at revision {} (the snapshot's newest key: {recorded}, as recorded)",
                            restored.keys,
                            restored.revision
                        ),
                        None => outln!(
                            "restored into a throwaway etcd: it opens, holds {} keys and is at revision {}",
                            restored.keys,
                            restored.revision
                        ),
                    }
                    outln!("{}", restore_note(&restored));
                }
                Ok(exit::OK)
            }
        }
    })
}

/// How it was restored: the tool, the snapshot's storage version against the local etcd's (etcd
/// 3.6 and later refuse a data directory from a newer etcd), and that nothing listened on TCP.
fn restore_note(r: &Restored) -> String {
    let storage = match &r.storage_version {
        Some(v) => format!("storage version {v}"),
        None => "no storage version (written by an etcd before 3.6)".to_string(),
    };
    let local = r.local_etcd.as_deref().unwrap_or("unknown");
    format!(
        "restored with {} snapshot restore; the snapshot has {storage}, the local etcd is {local}; the throwaway etcd listened only on unix sockets in a 0700 directory",
        r.restored_with
    )
}

/// The record of backup `file`, searched in every cluster.
async fn find(
    c: &mut crate::api::client::Client,
    addr: &str,
    file: &str,
) -> miette::Result<pb::Backup> {
    let r = c
        .list_backups(pb::ListBackupsRequest {
            cluster: String::new(),
        })
        .await
        .map_err(|s| rpc_error(addr, s))?
        .into_inner();
    r.backups
        .into_iter()
        .find(|b| b.file == file)
        .ok_or_else(|| {
            miette::miette!(
                help = "`medea backup list` lists the recorded backups",
                "no recorded backup `{file}`"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backup(revision: Option<i64>) -> pb::Backup {
        pb::Backup {
            cluster: "prod".into(),
            file: "prod-20261205T030000Z.db.age".into(),
            taken_at: "2026-12-05T03:00:00Z".into(),
            trigger: "scheduled".into(),
            member: "cp-1".into(),
            size: 1300,
            destination: "local".into(),
            revision,
            ..Default::default()
        }
    }

    #[test]
    fn list_and_show_name_the_etcd_revision_or_that_it_is_unknown() {
        let t = table(&[backup(Some(4242)), backup(None)]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].contains("REVISION"), "{t}");
        assert!(lines[1].contains(" 4242 "), "{t}");
        assert!(lines[2].contains(" - "), "{t}");
        assert!(show(&backup(Some(4242))).contains("etcd revision    4242\n"));
        assert!(show(&backup(None)).contains("etcd revision    unknown\n"));
        assert_eq!(
            record_of(&backup(Some(7))).map(|r| r.revision).ok(),
            Some(Some(7))
        );
    }
}
