//! The notes a cluster's plan carries for people (issue #50 item 3): typed values, each a
//! kind with its data, whose text one function makes ([`Note`]'s `Display`). Nothing
//! classifies a note by its text: a renderer or a caller that needs to know what a note says
//! matches its kind.
//!
//! Wire shape (stored plans, `medea plan -o json`, the API): a typed note is an object
//! `{"kind": "<kind>", <its data, camelCase>, "text": "<the text>"}`; `text` is written for
//! readers and ignored when read back (the data is the note). A note of a plan stored before
//! notes were typed is a bare string: it reads back as [`Note::Legacy`] and is written back
//! as the same string, so an old plan keeps its bytes and its id.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A machine the plan counts as unavailable, and why (`unreachable, NotReady, cordoned`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Away {
    /// The node's name.
    pub node: String,
    /// Why it is unavailable.
    pub why: String,
}

/// One note of a cluster's plan. Its text is its `Display`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "kind",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum Note {
    /// A rollout job of the cluster is running: nothing is planned for it.
    RollingOut {
        /// The running job.
        job: String,
        /// The cluster.
        cluster: String,
    },
    /// The cluster is gone from the desired state.
    Removed {},
    /// The cluster has not been observed yet.
    NotObserved {},
    /// Machines of the cluster in no pool.
    Unmanaged {
        /// Their nodes.
        machines: Vec<String>,
    },
    /// A pool that selects no observed machine.
    PoolSelectsNothing {
        /// The pool.
        pool: String,
    },
    /// Machines unavailable now, counted against maxUnavailable.
    Unavailable {
        /// The machines and why.
        machines: Vec<Away>,
    },
    /// Machines whose kubelet version is unknown.
    KubeletUnknown {
        /// Their nodes.
        machines: Vec<String>,
    },
    /// A pool hop whose `drain.skipPods` does not hold for machines on Talos < 1.13.
    SkipPodsLegacy {
        /// The pool.
        pool: String,
        /// The hop, 1-based, and the pool's hops.
        hop: u32,
        /// The pool's hops.
        hops: u32,
        /// The hop's Talos version.
        to: String,
        /// The skip selector, `key=value` each.
        selector: Vec<String>,
        /// The machines on Talos < 1.13.
        machines: Vec<String>,
        /// The pool keeps emptyDir data (`drain.deleteEmptyDirData: false`), which does not
        /// hold for them either.
        empty_dir_lost: bool,
        /// The pool waits for volumes to detach, which does not cover them.
        volume_wait_skipped: bool,
    },
    /// Machines that go to the next minor from an older patch than its newest.
    NotToppedUp {
        /// The pool.
        pool: String,
        /// The machines.
        machines: Vec<String>,
        /// The version they run.
        from: String,
        /// The newest patch of its minor.
        newest: String,
        /// Where the hop goes.
        to: String,
    },
    /// A maintenance exclusion and the plan's changes it holds.
    Exclusion {
        /// The exclusion, as `Exclusion::summary` says it.
        exclusion: String,
        /// The changes it holds (none: it holds none of them).
        holds: Vec<String>,
    },
    /// Settings that need the control-plane bar, without control-plane steps.
    ControlPlaneSettings {
        /// The settings.
        settings: Vec<String>,
    },
    /// The plan changes the approvals setting.
    ApprovalsChange {
        /// The bar in force: `approvals.required`.
        required: u32,
        /// The bar in force: `approvals.controlPlane`.
        control_plane: u32,
        /// What the plan needs.
        needs: u32,
    },
    /// The plan changes where health data and credentials go.
    SourcesChange {
        /// The settings.
        settings: Vec<String>,
        /// The bar in force: `approvals.required`.
        required: u32,
        /// The bar in force: `approvals.controlPlane`.
        control_plane: u32,
        /// What the plan needs.
        needs: u32,
    },
    /// The plan changes other settings that need the highest bar.
    HighestSettings {
        /// The settings.
        settings: Vec<String>,
        /// The bar in force: `approvals.required`.
        required: u32,
        /// The bar in force: `approvals.controlPlane`.
        control_plane: u32,
        /// What the plan needs.
        needs: u32,
    },
    /// The plan changes blocking hooks.
    HooksChange {
        /// The hooks.
        settings: Vec<String>,
        /// The bar in force: `approvals.required`.
        required: u32,
        /// The bar in force: `approvals.controlPlane`.
        control_plane: u32,
        /// What the plan needs.
        needs: u32,
    },
    /// The plan removes every health gate of a resource.
    GatesRemoved {
        /// The resource (`cluster home`, `pool home/workers`).
        resource: String,
    },
    /// The plan removes a cluster's promotion.
    PromotionRemoved {
        /// The cluster it waited for.
        after: String,
    },
    /// A wave of a pool's hop counts nodes already unavailable (preflight).
    BudgetUnavailable {
        /// The pool.
        pool: String,
        /// The hop's Talos version.
        to: String,
        /// The wave, 1-based.
        wave: u32,
        /// The nodes already unavailable, and why.
        machines: Vec<Away>,
        /// The slots left.
        slots: u32,
        /// The pool's slots (maxUnavailable).
        capacity: u32,
    },
    /// An acknowledgement that matches no current finding.
    StaleAcknowledgement {
        /// The finding id it lists.
        id: String,
        /// Where it is written.
        file: String,
        /// Its line.
        line: usize,
    },
    /// A note of a plan stored before notes were typed: its text only (read, and written
    /// back as the same string; never made).
    #[serde(skip)]
    Legacy(String),
}

/// The start of [`Note::ApprovalsChange`]'s text.
pub const APPROVALS_CHANGE_NOTE: &str = "this plan changes the approvals setting";
/// The start of [`Note::SourcesChange`]'s text.
pub const SOURCES_CHANGE_NOTE: &str = "this plan changes where health data and credentials go";
/// The start of [`Note::HooksChange`]'s text.
pub const HOOKS_CHANGE_NOTE: &str = "this plan changes blocking hooks";
/// The start of [`Note::HighestSettings`]'s text.
pub const HIGHEST_SETTINGS_NOTE: &str =
    "this plan changes what alert silences cover or when backups run and what they keep";
/// The start of [`Note::ControlPlaneSettings`]'s text.
pub const CP_SETTINGS_NOTE: &str = "settings of a control-plane pool act on control-plane nodes, and the cluster's Kubernetes settings on the control plane: the control-plane approval bar applies";

fn plural(n: usize, one: &'static str, many: &'static str) -> &'static str {
    if n == 1 { one } else { many }
}

/// `machine `a`` / `machines `a`, `b``.
pub(crate) fn machines_text(nodes: &[String]) -> String {
    let quoted: Vec<String> = nodes.iter().map(|n| format!("`{n}`")).collect();
    format!(
        "machine{} {}",
        plural(nodes.len(), "", "s"),
        quoted.join(", ")
    )
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::RollingOut { job, cluster } => write!(
                f,
                "rollout job {job} is running: nothing is planned for this cluster until it ends (follow it with `medea rollout status --cluster {cluster} -w`); the next plan shows what is left"
            ),
            Note::Removed {} => f.write_str(
                "gone from the desired state: medea stops managing it on approval (nothing on the cluster changes)",
            ),
            Note::NotObserved {} => f.write_str(
                "not observed yet: run `medea seed` to observe it; nothing is planned for it",
            ),
            Note::Unmanaged { machines } => write!(
                f,
                "not in any pool (medea never upgrades their Talos): {}",
                machines.join(", ")
            ),
            Note::PoolSelectsNothing { pool } => {
                write!(f, "node pool `{pool}` selects no observed machine")
            }
            Note::Unavailable { machines } => {
                let away: Vec<String> = machines
                    .iter()
                    .map(|a| format!("{} ({})", a.node, a.why))
                    .collect();
                write!(
                    f,
                    "unavailable now, counted against maxUnavailable: {}",
                    away.join(", ")
                )
            }
            Note::KubeletUnknown { machines } => write!(
                f,
                "kubelet version unknown (not checked against the API server): {}",
                machines.join(", ")
            ),
            Note::SkipPodsLegacy { .. } => skip_pods_legacy(self, f),
            Note::NotToppedUp {
                pool,
                machines,
                from,
                newest,
                to,
            } => write!(
                f,
                "node pool `{pool}`: {} run{} {from}, not the newest patch of its minor ({newest}), and go{} straight to {to}: the Talos docs recommend the newest patch of the running minor first; to follow them, plan {newest} for the pool before this",
                machines_text(machines),
                plural(machines.len(), "s", ""),
                plural(machines.len(), "es", ""),
            ),
            Note::Exclusion { exclusion, holds } if holds.is_empty() => write!(
                f,
                "maintenance exclusion {exclusion}: holds none of this plan's changes"
            ),
            Note::Exclusion { exclusion, holds } => write!(
                f,
                "maintenance exclusion {exclusion}: no node starts these changes inside it: {}",
                holds.join(", ")
            ),
            Note::ControlPlaneSettings { settings } => {
                write!(f, "{CP_SETTINGS_NOTE} ({})", settings.join(", "))
            }
            Note::ApprovalsChange {
                required,
                control_plane,
                needs,
            } => write!(
                f,
                "{APPROVALS_CHANGE_NOTE}: it needs the highest bar in force, max(required {required}, controlPlane {control_plane}), or the new bar if higher ({needs}); the new setting applies to later plans"
            ),
            Note::SourcesChange {
                settings,
                required,
                control_plane,
                needs,
            } => write!(
                f,
                "{SOURCES_CHANGE_NOTE} ({}): it needs the highest bar in force, max(required {required}, controlPlane {control_plane}) ({needs})",
                settings.join(", ")
            ),
            Note::HighestSettings {
                settings,
                required,
                control_plane,
                needs,
            } => write!(
                f,
                "{HIGHEST_SETTINGS_NOTE} ({}): it needs the highest bar in force, max(required {required}, controlPlane {control_plane}) ({needs})",
                settings.join(", ")
            ),
            Note::HooksChange {
                settings,
                required,
                control_plane,
                needs,
            } => write!(
                f,
                "{HOOKS_CHANGE_NOTE} ({}): hooks run actions of their own (a Job in the cluster, a call carrying the server's credential), so it needs the highest bar in force, max(required {required}, controlPlane {control_plane}) ({needs})",
                settings.join(", ")
            ),
            Note::GatesRemoved { resource } => write!(
                f,
                "this plan removes every health gate of the {resource}: its rollouts will no longer wait for any gate"
            ),
            Note::PromotionRemoved { after } => write!(
                f,
                "this plan removes the promotion after cluster {after}: versions no longer wait for it to run them first"
            ),
            Note::BudgetUnavailable {
                pool,
                to,
                wave,
                machines,
                slots,
                capacity,
            } => {
                let names: Vec<String> = machines
                    .iter()
                    .map(|a| format!("{} {}", a.node, a.why))
                    .collect();
                write!(
                    f,
                    "pool {pool} (Talos {to}): wave {wave} counts {} node{} already unavailable ({}); {slots} of {capacity} slot{} left",
                    machines.len(),
                    plural(machines.len(), "", "s"),
                    names.join(", "),
                    plural(*capacity as usize, "", "s"),
                )
            }
            Note::StaleAcknowledgement { id, file, line } => write!(
                f,
                "spec.preflight.acknowledge lists `{id}` ({file}:{line}), which matches no current finding: a stale acknowledgement; remove it"
            ),
            Note::Legacy(text) => f.write_str(text),
        }
    }
}

/// [`Note::SkipPodsLegacy`]'s text (a function of its own: it is long).
fn skip_pods_legacy(note: &Note, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let Note::SkipPodsLegacy {
        pool,
        hop,
        hops,
        to,
        selector,
        machines,
        empty_dir_lost,
        volume_wait_skipped,
    } = note
    else {
        return Ok(());
    };
    // what else of the pool's drain policy the node's own drain ignores for those pods
    let mut also = String::new();
    if *empty_dir_lost {
        also.push_str(
            "; drain.deleteEmptyDirData: false does not hold for them either (their emptyDir data is lost)",
        );
    }
    if *volume_wait_skipped {
        also.push_str(
            "; drain.waitForVolumeDetach does not cover them: the node reboots right after its own drain",
        );
    }
    write!(
        f,
        "node pool `{pool}`, hop {hop}/{hops} to {to}: drain.skipPods ({}) does not hold for {}, which run{} Talos < 1.13: the legacy MachineService.Upgrade drains the node itself before installing and evicts every pod a controller owns (DaemonSets aside), the skipped ones included{also}",
        selector.join(","),
        machines_text(machines),
        plural(machines.len(), "s", ""),
    )
}

/// How a note is written: a legacy note as its string, a typed one as its kind, data and text.
#[derive(Serialize)]
struct Written<'a> {
    #[serde(flatten)]
    note: &'a Note,
    text: String,
}

/// How a note is read: a bare string (a plan stored before notes were typed) or a typed one
/// (its `text` ignored).
#[derive(Deserialize)]
#[serde(untagged)]
enum Read {
    Legacy(String),
    Typed(Note),
}

/// `#[serde(with = "crate::plan::note::list")]` for a `Vec<Note>` in the wire shape above.
pub mod list {
    use super::*;

    /// Write the notes.
    pub fn serialize<S: Serializer>(notes: &[Note], s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(notes.len()))?;
        for n in notes {
            match n {
                Note::Legacy(text) => seq.serialize_element(text)?,
                typed => seq.serialize_element(&Written {
                    note: typed,
                    text: typed.to_string(),
                })?,
            }
        }
        seq.end()
    }

    /// Read the notes, old (strings) or typed.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Note>, D::Error> {
        let read = Vec::<Read>::deserialize(d)?;
        Ok(read
            .into_iter()
            .map(|r| match r {
                Read::Legacy(text) => Note::Legacy(text),
                Read::Typed(n) => n,
            })
            .collect())
    }
}

#[cfg(test)]
#[path = "note_tests.rs"]
mod tests;
