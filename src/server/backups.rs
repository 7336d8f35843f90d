//! The daemon's backup schedule (issue #37): while this replica leads, run
//! [`crate::backup::pass`] with the leader's fence whenever a slot of any cluster's applied
//! `spec.backup.schedule` is due, then report each backup and failure as a metric and a webhook.
//!
//! Only the leader acts: a follower only waits for leadership. Every journal write of a pass is
//! fenced on the term it started in, so a deposed leader's pass is refused by the store before
//! it asks Talos for another snapshot; the new leader first recovers the journal (an orphan a
//! crash left is removed), and a slot already taken is never taken again. Backups are read-only
//! for the cluster (`EtcdSnapshot`), so they run whether or not `--rollouts` is on.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use super::Shared;
use crate::backup;
use crate::ops::cluster_ports::TalosAdapter;

/// One backup operation of this process at a time: a pass's recovery must not take a manual
/// backup's file, still being written, for an orphan.
static RUNNING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The longest wait between two passes (settings applied meanwhile also wake the task).
const MAX_WAIT: Duration = Duration::from_secs(60);

/// Run the schedule until the task is aborted.
pub async fn backup_loop(shared: Arc<Shared>) {
    let mut recovered = BTreeSet::new();
    let mut term = None;
    // Applied settings change with a reconcile pass, which bumps the change counter: look
    // again then rather than at the next minute.
    let mut changes = shared.subscribe_changes();
    let mut snapshots_pruned: Option<std::time::Instant> = None;
    let task = shared.tasks.register(
        "backups",
        "takes the scheduled etcd backups and applies retention (leader); prunes this replica's pre-upgrade snapshots",
    );
    loop {
        if snapshots_pruned.is_none_or(|t| t.elapsed() >= SNAPSHOT_PRUNE_EVERY) {
            prune_pre_upgrade_snapshots(&shared);
            snapshots_pruned = Some(std::time::Instant::now());
        }
        let role = shared.leadership.role();
        let mut wait = MAX_WAIT;
        if let Some(fence) = shared.leadership.fence() {
            if term.as_ref() != Some(&fence) {
                // A new term: recover every cluster's journal again before its next backup.
                recovered.clear();
                term = Some(fence.clone());
            }
            let now = jiff::Timestamp::now();
            let creds = shared.creds_dir.clone();
            let started = std::time::Instant::now();
            let running = RUNNING.lock().await;
            let result = task
                .activate(backup::pass(
                    shared.store.as_ref(),
                    Some(&fence),
                    &dirs(&shared),
                    |cluster| TalosAdapter::from_creds(&creds, cluster),
                    now,
                    &mut recovered,
                ))
                .await;
            drop(running);
            match result {
                Ok(report) => {
                    report_pass(&shared, &report, started.elapsed());
                    if let Some(next) = report.next {
                        wait = until(next).min(MAX_WAIT);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %crate::error_chain(&e), "backup pass failed; trying again shortly");
                }
            }
        } else {
            term = None;
        }
        task.next_run_in(wait);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shared.leadership.changed_from(&role) => {}
            changed = changes.changed() => if changed.is_err() { return },
        }
    }
}

/// How often this replica prunes its pre-upgrade etcd snapshots.
const SNAPSHOT_PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// Prune this replica's pre-upgrade etcd snapshots (`<state-dir>/snapshots/`, every replica has
/// its own): [`crate::backup::snapshot_retention::prune`]. A failure is logged and tried again at
/// the next round.
fn prune_pre_upgrade_snapshots(shared: &Shared) {
    let dir = shared.state_dir.join("snapshots");
    match crate::backup::snapshot_retention::prune(
        shared.store.as_ref(),
        &dir,
        std::time::SystemTime::now(),
    ) {
        Ok(removed) => {
            for f in removed {
                tracing::info!(file = %f.display(), "pre-upgrade etcd snapshot pruned (retention)");
            }
        }
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "pruning pre-upgrade etcd snapshots failed");
        }
    }
}

/// The server's places for backup destinations: `local` under the state directory, the others
/// set up under the credentials directory.
fn dirs(shared: &Shared) -> backup::Dirs {
    backup::Dirs {
        state_dir: shared.state_dir.clone(),
        creds_dir: Some(shared.creds_dir.clone()),
    }
}

fn until(t: jiff::Timestamp) -> Duration {
    Duration::try_from(t.duration_since(jiff::Timestamp::now()))
        .map(|d| d + Duration::from_millis(50))
        .unwrap_or(Duration::from_millis(50))
}

fn report_pass(shared: &Shared, report: &backup::PassReport, took: Duration) {
    let at = jiff::Timestamp::now().to_string();
    for s in &report.status {
        crate::metrics::backup_status(
            &s.cluster,
            s.interval_secs,
            s.newest.map(|(t, size)| (t.as_second(), size)),
        );
    }
    for rec in &report.taken {
        crate::metrics::backup_taken(&rec.cluster, rec.taken_at.as_second(), rec.size, took);
        shared.notifier.send(crate::webhook::Notification {
            event: crate::webhook::EventKind::BackupTaken,
            text: format!(
                "medea: etcd backup {} of cluster {} taken from {} ({} bytes, encrypted)",
                rec.file, rec.cluster, rec.member, rec.size
            ),
            cluster: Some(rec.cluster.clone()),
            plan: None,
            job: None,
            node: Some(rec.member.clone()),
            reason: None,
            halt_code: None,
            at: at.clone(),
        });
    }
    for (cluster, err) in &report.failed {
        crate::metrics::backup_failed(cluster);
        let reason = crate::error_chain(err);
        shared.notifier.send(crate::webhook::Notification {
            event: crate::webhook::EventKind::BackupFailed,
            text: format!("medea: etcd backup of cluster {cluster} failed: {reason}"),
            cluster: Some(cluster.clone()),
            plan: None,
            job: None,
            node: None,
            reason: Some(reason),
            halt_code: None,
            at: at.clone(),
        });
    }
}

/// The API's view of a backup record.
pub fn backup_view(r: &backup::BackupRecord) -> crate::api::pb::Backup {
    crate::api::pb::Backup {
        cluster: r.cluster.clone(),
        file: r.file.clone(),
        taken_at: r.taken_at.to_string(),
        slot: r.slot.map(|s| s.to_string()).unwrap_or_default(),
        trigger: match r.trigger {
            backup::Trigger::Scheduled => "scheduled".into(),
            backup::Trigger::Manual => "manual".into(),
        },
        member: r.member.clone(),
        snapshot_size: r.snapshot_size,
        snapshot_sha256: r.snapshot_sha256.clone(),
        revision: r.revision,
        size: r.size,
        sha256: r.sha256.clone(),
        destination: r.destination.clone(),
        recipients: r.recipients.clone(),
    }
}

/// `BackupNow`: a backup of `cluster` by hand, on the leader only, reported like a scheduled one;
/// at most one per cluster every [`backup::MANUAL_MIN_INTERVAL`] (`RESOURCE_EXHAUSTED` with the
/// time of the next otherwise), and it never pushes a scheduled backup out ([`backup::prune`]).
pub async fn backup_now(
    shared: &Shared,
    cluster: &str,
) -> Result<backup::BackupRecord, tonic::Status> {
    let Some(fence) = shared.leadership.fence() else {
        return Err(tonic::Status::failed_precondition(format!(
            "this replica does not lead; ask the leader ({})",
            shared
                .leadership
                .leader_replica()
                .unwrap_or_else(|| "none right now".into())
        )));
    };
    let talos = TalosAdapter::from_creds(&shared.creds_dir, cluster)
        .map_err(|e| tonic::Status::failed_precondition(crate::error_chain(&e)))?;
    let running = RUNNING.lock().await;
    let started = std::time::Instant::now();
    let result = backup::take_now(
        shared.store.as_ref(),
        Some(&fence),
        &dirs(shared),
        &talos,
        cluster,
        jiff::Timestamp::now(),
    )
    .await;
    drop(running);
    match result {
        Ok(rec) => {
            let report = backup::PassReport {
                taken: vec![rec.clone()],
                ..Default::default()
            };
            report_pass(shared, &report, started.elapsed());
            Ok(rec)
        }
        Err(backup::NowError::Backup(e)) => {
            tracing::warn!(cluster, error = %crate::error_chain(&e), "backup now: failed");
            let status = match &e {
                backup::BackupError::Store { err, .. } if err.is_leadership_lost() => {
                    tonic::Status::failed_precondition(crate::error_chain(&e))
                }
                _ => tonic::Status::unavailable(crate::error_chain(&e)),
            };
            let report = backup::PassReport {
                failed: vec![(cluster.to_string(), e)],
                ..Default::default()
            };
            report_pass(shared, &report, started.elapsed());
            Err(status)
        }
        Err(e @ backup::NowError::TooSoon { .. }) => {
            Err(tonic::Status::resource_exhausted(crate::error_chain(&e)))
        }
        Err(e) => Err(tonic::Status::failed_precondition(crate::error_chain(&e))),
    }
}
