//! Taking one backup ([`take`]): the intent, the stream through the age encryptor into the
//! destination with etcd's sha256 trailer checked on the way, the record.

use super::*;

/// Take one backup of a cluster: journal the intent (and the slot), stream the snapshot of the
/// first control-plane member that serves one through the age encryptor into `dest`, then
/// record it. The first member's failure is tried on the next; a snapshot that does not check
/// out is never recorded and its file is removed. `fence`: the leader's term every write is
/// conditional on (`None` for a single-process store in tests and `medea backup now` offline).
pub async fn take<T: TalosPort>(
    store: &dyn Store,
    fence: Option<&Fence>,
    talos: &T,
    dest: std::sync::Arc<dyn Destination>,
    req: BackupRequest<'_>,
) -> Result<BackupRecord, BackupError> {
    let cluster = req.cluster;
    let file = file_name(cluster, req.now);
    let mark_key = schedule_key(cluster);
    let mark = store
        .get(Table::Backups, &mark_key)
        .map_err(store_err(cluster))?;
    let previous_slot = match &mark {
        Some(bytes) => Some(
            crate::store::record::decode::<ScheduleMark>(&mark_key, bytes)
                .map_err(store_err(cluster))?
                .last_slot,
        ),
        None => None,
    };
    let intent = BackupIntent {
        cluster: cluster.to_string(),
        file: file.clone(),
        destination: dest.name().to_string(),
        started_at: req.now,
        slot: req.slot,
        previous_slot,
    };
    // A second backup of the same cluster in the same second (a manual one beside a scheduled
    // one) would write the same file: the second is refused here, before anything is written.
    let mut txn = Txn::new()
        .check(crate::store::Check::Absent(
            Table::Backups,
            intent_key(cluster, &file),
        ))
        .check(crate::store::Check::Absent(
            Table::Backups,
            record_key(cluster, &file),
        ))
        .put_record(intent_key(cluster, &file), &intent);
    if let Some(slot) = req.slot {
        // Compare-and-swap on the mark: of two passes that read the same last slot, one takes
        // the new slot and the other is refused.
        txn = txn
            .check(match mark {
                Some(bytes) => crate::store::Check::Equals(Table::Backups, mark_key.clone(), bytes),
                None => crate::store::Check::Absent(Table::Backups, mark_key.clone()),
            })
            .put_record(mark_key, &ScheduleMark { last_slot: slot });
    } else {
        // A manual backup: when it began, for the rate limit ([`take_now`]), compare-and-swap
        // as the schedule's mark, so of two that read the same mark only one is begun.
        let key = manual_key(cluster);
        let manual = store
            .get(Table::Backups, &key)
            .map_err(store_err(cluster))?;
        txn = txn
            .check(match manual {
                Some(bytes) => crate::store::Check::Equals(Table::Backups, key.clone(), bytes),
                None => crate::store::Check::Absent(Table::Backups, key.clone()),
            })
            .put_record(
                key,
                &ManualMark {
                    last_started: req.now,
                },
            );
    }
    store
        .commit(fenced(txn, fence))
        .map_err(store_err(cluster))?;

    if req.control_plane.is_empty() {
        forget_intent(store, fence, cluster, &file)?;
        return Err(BackupError::NoControlPlane {
            cluster: cluster.to_string(),
        });
    }
    let mut last_err = None;
    for member in req.control_plane {
        match stream_one(talos, dest.clone(), cluster, member, &file, req.settings).await {
            Ok(written) => {
                let record = BackupRecord {
                    cluster: cluster.to_string(),
                    file: file.clone(),
                    taken_at: req.now,
                    slot: req.slot,
                    trigger: if req.slot.is_some() {
                        Trigger::Scheduled
                    } else {
                        Trigger::Manual
                    },
                    member: member.node.clone(),
                    snapshot_size: written.snapshot_size,
                    snapshot_sha256: written.snapshot_sha256,
                    revision: written.revision,
                    size: written.size,
                    sha256: written.sha256,
                    destination: dest.name().to_string(),
                    recipients: req
                        .settings
                        .recipients
                        .iter()
                        .map(|r| r.as_str().to_string())
                        .collect(),
                };
                let txn = Txn::new()
                    .put_record(record_key(cluster, &file), &record)
                    .delete(Table::Backups, intent_key(cluster, &file));
                store
                    .commit(fenced(txn, fence))
                    .map_err(store_err(cluster))?;
                return Ok(record);
            }
            // Another member would meet the same destination: stop here.
            Err(e @ (BackupError::Destination { .. } | BackupError::Encrypt { .. })) => {
                forget_intent(store, fence, cluster, &file)?;
                return Err(e);
            }
            Err(e) => {
                tracing::warn!(cluster, member = %member.node, error = %crate::error_chain(&e), "backup: snapshot failed");
                last_err = Some(e);
            }
        }
    }
    forget_intent(store, fence, cluster, &file)?;
    Err(last_err.unwrap_or(BackupError::NoControlPlane {
        cluster: cluster.to_string(),
    }))
}

fn forget_intent(
    store: &dyn Store,
    fence: Option<&Fence>,
    cluster: &str,
    file: &str,
) -> Result<(), BackupError> {
    store
        .commit(fenced(
            Txn::new().delete(Table::Backups, intent_key(cluster, file)),
            fence,
        ))
        .map_err(store_err(cluster))
}

struct Written {
    snapshot_size: u64,
    snapshot_sha256: String,
    revision: Option<i64>,
    size: u64,
    sha256: String,
}

/// Stream one member's snapshot, encrypted, into `file`; commit the file only if the stream
/// checked out and the encryption finished. On any failure nothing stays in the destination.
async fn stream_one<T: TalosPort>(
    talos: &T,
    dest: std::sync::Arc<dyn Destination>,
    cluster: &str,
    member: &NodeTarget,
    file: &str,
    settings: &BackupSettings,
) -> Result<Written, BackupError> {
    let cluster_err = |err: std::io::Error| BackupError::Destination {
        cluster: cluster.to_string(),
        destination: dest.name().to_string(),
        err,
    };
    let recipients: Vec<age::x25519::Recipient> =
        settings.recipients.iter().map(|r| r.to_age()).collect();
    let encryptor =
        age::Encryptor::with_recipients(recipients.iter().map(|r| r as &dyn age::Recipient))
            .map_err(|err| BackupError::Encrypt {
                cluster: cluster.to_string(),
                err: Box::new(err),
            })?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(CHANNEL_CHUNKS);
    let writer_dest = dest.clone();
    let writer_file = file.to_string();
    // The consumer: blocking file I/O and encryption on a blocking thread. It returns the
    // still-uncommitted writer, so the caller commits only once the stream checked out.
    let consumer = tokio::task::spawn_blocking(move || -> std::io::Result<_> {
        let object = writer_dest.create(&writer_file)?;
        let hashing = Hashing {
            inner: object,
            hash: Sha256::new(),
            size: 0,
        };
        let mut enc = match encryptor.wrap_output(hashing) {
            Ok(e) => e,
            Err(e) => {
                let _ = writer_dest.delete(&writer_file);
                return Err(e);
            }
        };
        // The revision is read from the plaintext as it passes, before encryption.
        let mut revision = crate::backup::revision::RevisionReader::default();
        while let Some(chunk) = rx.blocking_recv() {
            revision.update(&chunk);
            if let Err(e) = enc.write_all(&chunk) {
                // Dropping the encryptor drops the writer; remove the part file.
                let _ = writer_dest.delete(&writer_file);
                return Err(e);
            }
        }
        let hashing = match enc.finish() {
            Ok(h) => h,
            Err(e) => {
                let _ = writer_dest.delete(&writer_file);
                return Err(e);
            }
        };
        Ok((hashing, revision))
    });
    let streamed = talos.etcd_snapshot_stream(member, tx).await;
    let written = consumer
        .await
        .map_err(|e| cluster_err(std::io::Error::other(e)));
    let snapshot_err = |err| BackupError::Snapshot {
        cluster: cluster.to_string(),
        member: member.node.clone(),
        err: Box::new(err),
    };
    let failure = match (streamed, written) {
        (Ok(s), Ok(Ok((mut h, revision)))) => {
            let flushed = h.flush();
            let (size, sha256) = (h.size, hex::encode(h.hash.finalize()));
            let object = h.inner;
            let done = tokio::task::spawn_blocking(move || {
                flushed?;
                object.commit()
            })
            .await
            .map_err(|e| cluster_err(std::io::Error::other(e)))
            .and_then(|r| r.map_err(cluster_err));
            match done {
                Ok(()) => {
                    let revision = match revision.finish() {
                        Ok(rev) => Some(rev),
                        Err(e) => {
                            tracing::warn!(cluster, member = %member.node, error = %e, "backup: the snapshot's etcd revision cannot be read; recorded without it");
                            None
                        }
                    };
                    return Ok(Written {
                        snapshot_size: s.size,
                        snapshot_sha256: s.sha256,
                        revision,
                        size,
                        sha256,
                    });
                }
                Err(e) => e,
            }
        }
        // The destination failed (the stream then fails too: its consumer is gone): report the
        // destination, not the member.
        (_, Ok(Err(e))) => cluster_err(e),
        (Err(err), _) => snapshot_err(err),
        (Ok(_), Err(e)) => e,
    };
    // Whatever failed, nothing of this backup stays in the destination.
    let _ = tokio::task::spawn_blocking({
        let (dest, file) = (dest.clone(), file.to_string());
        move || dest.delete(&file)
    })
    .await;
    Err(failure)
}
