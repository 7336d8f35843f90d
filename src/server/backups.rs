//! The daemon's backup schedule (issue #37): while this replica leads, run
//! [`crate::ops::backup::pass`] with the leader's fence whenever a slot of any cluster's applied
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
use crate::ops::backup;
use crate::ops::cluster_ports::TalosAdapter;

/// The longest wait between two passes: settings applied meanwhile are picked up by then.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// Run the schedule until the task is aborted.
pub async fn backup_loop(shared: Arc<Shared>) {
    let mut recovered = BTreeSet::new();
    let mut term = None;
    loop {
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
            let result = backup::pass(
                shared.store.as_ref(),
                Some(&fence),
                &shared.state_dir,
                |cluster| TalosAdapter::from_creds(&creds, cluster),
                now,
                &mut recovered,
            )
            .await;
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
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shared.leadership.changed_from(&role) => {}
        }
    }
}

fn until(t: jiff::Timestamp) -> Duration {
    Duration::try_from(t.duration_since(jiff::Timestamp::now()))
        .map(|d| d + Duration::from_millis(50))
        .unwrap_or(Duration::from_millis(50))
}

fn report_pass(shared: &Shared, report: &backup::PassReport, took: Duration) {
    let at = jiff::Timestamp::now().to_string();
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
