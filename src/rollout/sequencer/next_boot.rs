//! Boot entries as upstream keeps them (issue #48 item 2): an install is made only on a node
//! whose next boot is the version it runs.
//!
//! Upstream's installer, in upgrade mode, keeps one entry besides the one it writes and
//! removes (sd-boot) or overwrites (GRUB) the rest. Which one it keeps is the entry it takes
//! for *current*: sd-boot before talos PR #14003 takes `LoaderEntryDefault`, after it the booted
//! entry except after a kexec reboot, where it takes the default again; GRUB flips the
//! configured default label (siderolabs/talos
//! `internal/app/machined/pkg/runtime/v1alpha1/bootloader/sdboot/sdboot.go`,
//! `…/bootloader/grub/boot_label.go`). On a node whose default already names another
//! installation (staged by medea, by `talosctl upgrade --stage`/`--no-reboot`, by a halted
//! job) a second install deletes or overwrites the entry the node runs, and with it the
//! fallback a failed boot or a rollback returns to. So, before every install:
//!
//! - next boot = what it runs → install;
//! - next boot = the target → it is staged already: no install, the reboot is next;
//! - next boot = another version → halt: an install would delete the running entry;
//! - next boot unknown (GRUB) → install, unless an install of this job may have run on the
//!   node in this boot (a call it answered, or one it said was still running): then refuse.
//!
//! And after a node answered "another installation/upgrade is already in progress", it is kept
//! *installing* (`NodeProgress::installing`, the boot id) until its next boot changes: an open
//! install outcome is waited for, never issued again in that boot.

use super::*;
use crate::version::TalosVersion;

/// What an install of `to` on node `name` (seen as `t`, progress `n`) may do.
pub(super) enum BeforeInstall {
    /// Its next boot is what it runs: the install may be made.
    Install,
    /// Its next boot is the target already: no install, the reboot is next.
    Staged,
    /// No install: the halt (its reason).
    Refuse(HaltCode, String),
}

/// The rule of the module doc for node `name` (seen as `t`, progress `n`), which runs `from`
/// and is to be installed with `to`.
pub(super) fn before_install(
    name: &str,
    n: &NodeProgress,
    t: &TalosNode,
    from: &TalosVersion,
    to: &TalosVersion,
) -> BeforeInstall {
    match &t.next_boot {
        NextBoot::Same => BeforeInstall::Install,
        NextBoot::Version(v) if v == to => BeforeInstall::Staged,
        NextBoot::Version(v) => BeforeInstall::Refuse(
            HaltCode::UnexpectedVersion,
            format!(
                "node `{name}` boots {v} next, not the {from} it runs: an install of {to} now would \
                 delete its running entry (the bootloader keeps only the default entry besides the \
                 new one); roll its boot entry back (`talosctl rollback`) or reboot it, then plan again"
            ),
        ),
        NextBoot::Unknown if possibly_installed(n, t) => BeforeInstall::Refuse(
            HaltCode::OutcomeUnknown,
            format!(
                "node `{name}` does not report its next boot (GRUB) and an install of this job may \
                 have run on it since it booted: another install could overwrite the entry it runs \
                 (GRUB flips its default label at every install); check the node and plan again"
            ),
        ),
        NextBoot::Unknown => BeforeInstall::Install,
    }
}

/// Whether an install call of this job may have written a boot entry on the node in the boot
/// it runs now: the node answered one with a failure (the installer may fail after the
/// bootloader's part), or said one was still running. (A lost reply on such a node never gets
/// here: its resolution halts, `resolve.rs`.)
fn possibly_installed(n: &NodeProgress, t: &TalosNode) -> bool {
    let this_boot = n.boot_id_before.as_deref() == Some(t.boot_id.as_str());
    (this_boot && n.upgrade_failures > 0) || n.installing.as_deref() == Some(t.boot_id.as_str())
}

/// Whether the node said an install was running, and is still in that boot with its next boot
/// unchanged (the running version): an open install outcome is waited for, not issued again.
pub(super) fn installing_now(n: &NodeProgress, t: &TalosNode) -> bool {
    n.installing.as_deref() == Some(t.boot_id.as_str()) && t.next_boot == NextBoot::Same
}

/// Node `node` of step `step` answered an install with "already in progress" in boot
/// `boot_id`: kept *installing* until its next boot changes.
pub(super) fn mark_installing(
    j: &mut Job,
    step: usize,
    node: Option<&str>,
    boot_id: &str,
    notes: &mut Vec<String>,
) {
    let Some(StepKind::Talos(ts)) = j.steps.get_mut(step).map(|s| &mut s.kind) else {
        return;
    };
    if let Some(n) = ts
        .nodes
        .iter_mut()
        .find(|n| Some(n.target.node.as_str()) == node)
    {
        let n = Arc::make_mut(n);
        if n.installing.as_deref() != Some(boot_id) {
            notes.push(format!(
                "{}: an install is running on it; it is not installed again until its next boot changes",
                n.target.node
            ));
            n.installing = Some(boot_id.to_string());
        }
    }
}

/// The node of step `step` named `node`, if any.
pub(super) fn progress_of<'a>(j: &'a Job, step: usize, node: &str) -> Option<&'a NodeProgress> {
    match j.steps.get(step).map(|s| &s.kind) {
        Some(StepKind::Talos(ts)) => ts
            .nodes
            .iter()
            .find(|n| n.target.node == node)
            .map(|n| n.as_ref()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::ports::MachineStage;

    fn tv(s: &str) -> TalosVersion {
        TalosVersion::parse(s).unwrap()
    }

    fn seen(next_boot: NextBoot) -> TalosNode {
        TalosNode {
            version: tv("v1.13.2"),
            boot_id: "b0".into(),
            stage: MachineStage::Running,
            ready: true,
            next_boot,
            unhealthy_services: vec![],
        }
    }

    fn progress() -> NodeProgress {
        let target = MachineTarget {
            node: "w-1".into(),
            id: "m-1".into(),
            address: "10.0.0.1".into(),
            from: tv("v1.13.2"),
            image: None,
        };
        let mut n = NodeProgress::new(Arc::new(target), 0);
        n.boot_id_before = Some("b0".into());
        n
    }

    /// No next-boot state lets an install run over an entry other than the running one: the
    /// property behind "no scenario can make medea install over a staged entry".
    #[test]
    fn an_install_is_made_only_when_the_next_boot_is_the_running_version_or_unknown_and_untouched()
    {
        let (from, to) = (tv("v1.13.2"), tv("v1.13.9"));
        let boots = [
            NextBoot::Same,
            NextBoot::Version(to.clone()),
            NextBoot::Version(tv("v1.13.5")),
            NextBoot::Version(from.clone()),
            NextBoot::Unknown,
        ];
        for b in boots {
            // (another command's reissue counts in `attempt`: not an install)
            for (attempt, failures, installing) in
                [(0, 0, false), (1, 0, false), (1, 1, false), (0, 0, true)]
            {
                let mut n = progress();
                n.attempt = attempt;
                n.upgrade_failures = failures;
                n.installing = installing.then(|| "b0".to_string());
                let t = seen(b.clone());
                let verdict = before_install("w-1", &n, &t, &from, &to);
                let touched = failures > 0 || installing;
                match (&b, verdict) {
                    (NextBoot::Same, BeforeInstall::Install) => {}
                    (NextBoot::Version(v), BeforeInstall::Staged) if *v == to => {}
                    (NextBoot::Version(_), BeforeInstall::Refuse(code, why)) => {
                        assert_eq!(code, HaltCode::UnexpectedVersion);
                        assert!(why.contains("delete its running entry"), "{why}");
                    }
                    (NextBoot::Unknown, BeforeInstall::Install) if !touched => {}
                    (NextBoot::Unknown, BeforeInstall::Refuse(code, _)) if touched => {
                        assert_eq!(code, HaltCode::OutcomeUnknown);
                    }
                    (b, _) => {
                        panic!("wrong verdict for {b:?} ({attempt}, {failures}, {installing})")
                    }
                }
            }
        }
    }

    #[test]
    fn a_node_stays_installing_until_its_next_boot_or_its_boot_changes() {
        let mut n = progress();
        n.installing = Some("b0".into());
        assert!(installing_now(&n, &seen(NextBoot::Same)));
        assert!(!installing_now(&n, &seen(NextBoot::Version(tv("v1.13.9")))));
        let mut rebooted = seen(NextBoot::Same);
        rebooted.boot_id = "b1".into();
        assert!(!installing_now(&n, &rebooted));
    }
}
