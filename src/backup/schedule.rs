//! The schedule: one [`pass`] over every cluster's applied backup settings (a backup when a
//! slot is due, then retention), and [`take_now`], the manual backup.

use super::*;

/// What one [`pass`] did, per cluster.
#[derive(Debug, Default)]
pub struct PassReport {
    /// Backups taken and recorded.
    pub taken: Vec<BackupRecord>,
    /// Clusters whose due backup failed, with the error.
    pub failed: Vec<(String, BackupError)>,
    /// What recovery found, per cluster it ran for.
    pub recovered: Vec<(String, Recovery)>,
    /// Files pruned, per cluster.
    pub pruned: Vec<(String, Vec<String>)>,
    /// The earliest next slot of any cluster (when to look again).
    pub next: Option<Timestamp>,
    /// Every cluster with backups on, after the pass: what the metrics show.
    pub status: Vec<ClusterStatus>,
}

/// A cluster's backups as the metrics and the alert rule see them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterStatus {
    /// The cluster.
    pub cluster: String,
    /// The schedule's current period: from its latest slot to the next (seconds).
    pub interval_secs: Option<u64>,
    /// The newest recorded backup: when it was taken and its size.
    pub newest: Option<(Timestamp, u64)>,
}

/// One pass of the backup schedule over every cluster whose **applied** settings turn backups
/// on: recover a cluster's journal once per leadership term (`recovered` remembers which), then
/// take the backup that is due at `now`, if any, and apply retention. The caller runs it only
/// while it leads and passes its fence, so a deposed leader's writes are refused by the store.
/// `talos_for` builds a cluster's Talos port (the server: from its credentials directory).
pub async fn pass<T, F>(
    store: &dyn Store,
    fence: Option<&Fence>,
    dirs: &Dirs,
    talos_for: F,
    now: Timestamp,
    recovered: &mut std::collections::BTreeSet<String>,
) -> Result<PassReport, BackupError>
where
    T: TalosPort,
    F: Fn(&str) -> Result<T, crate::ops::cluster_ports::AdapterError>,
{
    let mut report = PassReport::default();
    let mut enabled = Vec::new();
    let applied = crate::ops::replan::load_applied(store).map_err(store_err("*"))?;
    for name in applied.cluster_names() {
        let Some(summary) = applied
            .cluster_settings(&name)
            .and_then(|c| c.backup.as_ref())
        else {
            continue;
        };
        let settings = match summary.settings() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(cluster = %name, error = %crate::error_chain(&e), "backup: the applied settings are refused; no backup");
                continue;
            }
        };
        enabled.push((name.clone(), settings.schedule.clone()));
        let dest: std::sync::Arc<dyn Destination> = match destination(
            dirs,
            &name,
            &settings.destination,
        ) {
            Ok(d) => std::sync::Arc::from(d),
            Err(e) => {
                tracing::warn!(cluster = %name, error = %crate::error_chain(&e), "backup: the destination cannot be used; no backup");
                report.failed.push((name.clone(), e));
                continue;
            }
        };
        if !recovered.contains(&name) {
            // A destination that cannot be read (an unreachable S3 server) fails this
            // cluster's pass, not every cluster's: recovery runs again on the next pass.
            let r = match off_the_workers(|| recover(store, fence, &name, dest.as_ref())) {
                Ok(r) => r,
                Err(e @ BackupError::Store { .. }) => return Err(e),
                Err(e) => {
                    tracing::warn!(cluster = %name, error = %crate::error_chain(&e), "backup: recovering the journal failed; no backup until it succeeds");
                    report.failed.push((name.clone(), e));
                    continue;
                }
            };
            for f in &r.orphans_removed {
                tracing::warn!(cluster = %name, file = %f, "backup: removed an orphan a crash left between write and record (never counted as a backup)");
            }
            for f in &r.foreign {
                tracing::warn!(cluster = %name, file = %f, "backup: a file medea has no record of is in the destination; left alone");
            }
            recovered.insert(name.clone());
            report.recovered.push((name.clone(), r));
        }
        let slot = match due(store, &name, &settings, now)? {
            Due::Now { slot } => slot,
            Due::Later { next } => {
                report.next = earliest(report.next, next);
                continue;
            }
        };
        report.next = earliest(report.next, settings.schedule.next_after(now));
        let control_plane = control_plane_of(store, &name)?;
        let talos = match talos_for(&name) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(cluster = %name, error = %crate::error_chain(&e), "backup: no Talos credentials");
                report.failed.push((
                    name.clone(),
                    BackupError::Ports {
                        cluster: name.clone(),
                        err: Box::new(e),
                    },
                ));
                continue;
            }
        };
        let req = BackupRequest {
            cluster: &name,
            settings: &settings,
            control_plane: &control_plane,
            now,
            slot: Some(slot),
        };
        match take(store, fence, &talos, dest.clone(), req).await {
            Ok(rec) => {
                tracing::info!(cluster = %name, file = %rec.file, member = %rec.member, size = rec.size, "backup: taken");
                report.taken.push(rec);
                match off_the_workers(|| {
                    prune(store, fence, &name, &settings.retention, dest.as_ref(), now)
                }) {
                    Ok(pruned) => report.pruned.push((name.clone(), pruned)),
                    Err(e @ BackupError::Store { .. }) => return Err(e),
                    Err(e) => {
                        tracing::warn!(cluster = %name, error = %crate::error_chain(&e), "backup: retention failed; the next pass tries again");
                        report.failed.push((name.clone(), e));
                    }
                }
            }
            Err(e @ BackupError::Store { .. }) => return Err(e),
            Err(e) => {
                tracing::warn!(cluster = %name, error = %crate::error_chain(&e), "backup: failed; the next slot tries again");
                report.failed.push((name.clone(), e));
            }
        }
    }
    for (cluster, schedule) in enabled {
        let latest = schedule.latest_at_or_before(now).unwrap_or(now);
        let interval_secs = schedule
            .next_after(latest)
            .and_then(|next| u64::try_from(next.duration_since(latest).as_secs()).ok());
        let newest = list(store, &cluster)?.last().map(|r| (r.taken_at, r.size));
        report.status.push(ClusterStatus {
            cluster,
            interval_secs,
            newest,
        });
    }
    Ok(report)
}

/// Why `medea backup now` cannot take a backup of a cluster.
#[derive(Debug, thiserror::Error)]
pub enum NowError {
    /// The cluster's applied settings have no `spec.backup`.
    #[error("backups are off for cluster `{cluster}`: its applied settings have no `spec.backup`")]
    Off {
        /// The cluster.
        cluster: String,
    },
    /// The applied settings no longer check out.
    #[error("the applied backup settings of cluster `{cluster}` are refused")]
    Settings {
        /// The cluster.
        cluster: String,
        /// Why.
        #[source]
        err: crate::desired::backup::SummaryError,
    },
    /// A manual backup of the cluster was begun less than [`MANUAL_MIN_INTERVAL`] ago.
    #[error(
        "a manual backup of cluster `{cluster}` was begun at {last}; manual backups are limited to one every {} minutes per cluster (each reads the whole etcd database from a control-plane member): try again after {next}",
        MANUAL_MIN_INTERVAL.as_secs() / 60
    )]
    TooSoon {
        /// The cluster.
        cluster: String,
        /// When the last one began.
        last: Timestamp,
        /// When the next one may begin.
        next: Timestamp,
    },
    /// Taking it failed.
    #[error(transparent)]
    Backup(#[from] BackupError),
}

/// Take a backup of `cluster` now (`medea backup now`): its applied settings, no schedule slot
/// (the schedule is not moved), then retention (which counts manual backups apart from
/// scheduled ones, [`prune`]). Refused ([`NowError::TooSoon`]) within [`MANUAL_MIN_INTERVAL`]
/// of the last manual backup begun, failed ones included; the mark is in the store, so a
/// restart or a failover does not reset it.
pub async fn take_now<T: TalosPort>(
    store: &dyn Store,
    fence: Option<&Fence>,
    dirs: &Dirs,
    talos: &T,
    cluster: &str,
    now: Timestamp,
) -> Result<BackupRecord, NowError> {
    let applied = crate::ops::replan::load_applied(store).map_err(store_err(cluster))?;
    let summary = applied
        .cluster_settings(cluster)
        .and_then(|c| c.backup.as_ref())
        .ok_or_else(|| NowError::Off {
            cluster: cluster.to_string(),
        })?;
    let settings = summary.settings().map_err(|err| NowError::Settings {
        cluster: cluster.to_string(),
        err,
    })?;
    if let Some(mark) = store
        .get_record::<ManualMark>(&manual_key(cluster))
        .map_err(store_err(cluster))?
    {
        let next = mark
            .last_started
            .checked_add(MANUAL_MIN_INTERVAL)
            .unwrap_or(mark.last_started);
        if now < next {
            return Err(NowError::TooSoon {
                cluster: cluster.to_string(),
                last: mark.last_started,
                next,
            });
        }
    }
    let dest: std::sync::Arc<dyn Destination> =
        std::sync::Arc::from(destination(dirs, cluster, &settings.destination)?);
    let control_plane = control_plane_of(store, cluster)?;
    let req = BackupRequest {
        cluster,
        settings: &settings,
        control_plane: &control_plane,
        now,
        slot: None,
    };
    let rec = take(store, fence, talos, dest.clone(), req).await?;
    off_the_workers(|| {
        prune(
            store,
            fence,
            cluster,
            &settings.retention,
            dest.as_ref(),
            now,
        )
    })?;
    Ok(rec)
}
