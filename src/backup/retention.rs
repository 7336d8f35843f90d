//! Retention of recorded backups ([`prune`]): scheduled and manual backups counted apart, each
//! deletion journaled.

use super::*;

/// Apply `retention` to the recorded backups of `cluster`. Scheduled and manual backups are
/// counted apart (issue #49 item 4): a backup goes when it is not among the `keep` newest *of
/// its trigger*, or is older than `maxAge` at `now`; the newest scheduled backup and the newest
/// manual one never go (every recorded backup was checked before it was recorded, so each is
/// the newest verified one of its kind). So `medea backup now`, which any token holder may call,
/// only ever pushes out older manual backups, never a scheduled one: at most `2 × keep` backups
/// are kept. Each deletion is journaled: a [`DeletionIntent`] before the file is removed, the
/// record and the intent deleted after ([`recover`] finishes one a crash interrupted).
/// Returns the files removed, oldest first.
///
/// Rollout jobs keep their pre-upgrade snapshots elsewhere (`<state-dir>/snapshots/`), never
/// in a backup destination, so pruning cannot remove a snapshot a job references.
pub fn prune(
    store: &dyn Store,
    fence: Option<&Fence>,
    cluster: &str,
    retention: &crate::desired::backup::Retention,
    dest: &dyn Destination,
    now: Timestamp,
) -> Result<Vec<String>, BackupError> {
    let all = list(store, cluster)?;
    let mut doomed = Vec::new();
    for trigger in [Trigger::Scheduled, Trigger::Manual] {
        let of_kind: Vec<&BackupRecord> = all.iter().filter(|r| r.trigger == trigger).collect();
        doomed.extend(to_prune(&of_kind, retention, now, trigger));
    }
    doomed.sort_by(|(a, _), (b, _)| a.taken_at.cmp(&b.taken_at).then(a.file.cmp(&b.file)));
    let mut removed = Vec::new();
    for (r, reason) in doomed {
        if r.destination != dest.name() {
            continue;
        }
        let intent = DeletionIntent {
            cluster: cluster.to_string(),
            file: r.file.clone(),
            destination: r.destination.clone(),
            reason,
        };
        store
            .commit(fenced(
                Txn::new().put_record(deletion_key(cluster, &r.file), &intent),
                fence,
            ))
            .map_err(store_err(cluster))?;
        dest.delete(&r.file)
            .map_err(|err| BackupError::Destination {
                cluster: cluster.to_string(),
                destination: dest.name().to_string(),
                err,
            })?;
        store
            .commit(fenced(
                Txn::new()
                    .delete(Table::Backups, record_key(cluster, &r.file))
                    .delete(Table::Backups, deletion_key(cluster, &r.file)),
                fence,
            ))
            .map_err(store_err(cluster))?;
        tracing::info!(cluster, file = %r.file, reason = %intent.reason, "backup: pruned");
        removed.push(r.file.clone());
    }
    Ok(removed)
}

/// The backups of one trigger (`records`, oldest first) that retention removes, with the
/// reason: beyond the `keep` newest of that trigger or older than `maxAge`; never the newest.
fn to_prune<'a>(
    records: &[&'a BackupRecord],
    retention: &crate::desired::backup::Retention,
    now: Timestamp,
    trigger: Trigger,
) -> Vec<(&'a BackupRecord, String)> {
    let keep = usize::try_from(retention.keep.max(1)).unwrap_or(usize::MAX);
    let kind = match trigger {
        Trigger::Scheduled => "scheduled",
        Trigger::Manual => "manual",
    };
    let newest = records.len().saturating_sub(1);
    let mut out = Vec::new();
    for (i, r) in records.iter().enumerate() {
        if i == newest {
            continue;
        }
        let beyond_keep = records.len() - i > keep;
        let too_old = retention.max_age.is_some_and(|max| {
            std::time::Duration::try_from(now.duration_since(r.taken_at)).is_ok_and(|age| age > max)
        });
        if beyond_keep {
            out.push((*r, format!("not among the {keep} newest {kind} backups")));
        } else if too_old {
            out.push((*r, "older than retention.maxAge".to_string()));
        }
    }
    out
}
