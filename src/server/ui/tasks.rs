//! The dashboard's list of the server's background tasks (issue #50): each task's last run,
//! next run and last error, from the same registry as the API's `ListBackgroundTasks`.

use maud::{Markup, html};

use crate::server::tasks::TaskStatus;

/// The "background tasks" section of the overview.
pub(super) fn section(tasks: &[TaskStatus], ts: impl Fn(jiff::Timestamp) -> String) -> Markup {
    let at = |t: Option<jiff::Timestamp>, none: &'static str| t.map_or(none.to_string(), &ts);
    html! {
        section #tasks.tasks {
            h2 { "background tasks" }
            table {
                thead { tr { th { "task" } th { "activations" } th { "last started" } th { "last finished" } th { "next run" } th { "last error" } } }
                tbody {
                    @for t in tasks {
                        tr data-task=(t.name) title=(t.description) {
                            td { (t.name) @if t.running { " " span.badge.running { "running" } } }
                            td { (t.activations) }
                            td { (at(t.last_started, "not yet")) }
                            td { (at(t.last_finished, "not yet")) }
                            td { (at(t.next_run, "when woken")) }
                            @match &t.last_error {
                                Some(e) => td.error { (e) },
                                None => td { "-" },
                            }
                        }
                    }
                }
            }
        }
    }
}
