//! Credentials that stop working before the rollout could end.
//!
//! The window is the longer of seven days and the plan's own upper bound (every Talos wave's
//! drain and health timeouts plus every Kubernetes node's health timeout): a plan is often
//! approved days after it is computed, and a rollout waits for maintenance windows. A
//! credential expiring inside the window is a warning; one already expired is blocking. The
//! message names the absolute expiry, never the time left, so replanning later keeps the
//! plan id until a threshold is crossed.

use std::time::Duration;

use jiff::Timestamp;

use super::{Finding, Scope, Severity, checks, dur};
use crate::inventory::preflight::PreflightObservations;

/// The shortest window credentials must outlive.
pub const MIN_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);

fn slug(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

pub(super) fn check(
    p: &PreflightObservations,
    scope: &Scope,
    now: Option<Timestamp>,
) -> Vec<Finding> {
    let window = scope.run.max(MIN_WINDOW);
    let mut out = Vec::new();
    for c in &p.credentials {
        let id = format!("credentials/{}", slug(&c.credential));
        let Ok(not_after) = c.not_after.parse::<Timestamp>() else {
            out.push(Finding::new(
                id,
                checks::CREDENTIALS,
                Severity::Warning,
                format!("the expiry of the {} could not be read", c.credential),
                vec![format!(
                    "notAfter {:?} is not an RFC 3339 time",
                    c.not_after
                )],
                "check the credential with `medea doctor --creds-dir <dir>`",
            ));
            continue;
        };
        let Some(now) = now else { continue };
        let evidence = vec![format!("{}: notAfter {not_after}", c.credential)];
        if not_after <= now {
            out.push(Finding::new(
                format!("{id}/expired"),
                checks::CREDENTIALS,
                Severity::Blocking,
                format!("the {} expired at {not_after}: medea cannot act on the cluster with it", c.credential),
                evidence,
                "issue a fresh credential (`talosctl config new`, a new kubeconfig), put it in medea's credentials directory and refresh",
            ));
        } else if u64::try_from(not_after.as_second() - now.as_second())
            .is_ok_and(|left| left < window.as_secs())
        {
            out.push(Finding::new(
                format!("{id}/expiring"),
                checks::CREDENTIALS,
                Severity::Warning,
                format!(
                    "the {} expires at {not_after}, within the rollout's window ({}): the rollout could outlive it",
                    c.credential,
                    dur(window)
                ),
                evidence,
                "renew the credential before approving, and refresh",
            ));
        }
    }
    out
}
