//! The server's background tasks, in one place (issue #50 item 5): every loop the daemon runs
//! (inventory refresh, reconcile, backups, leadership, executor) is registered here by name and
//! records each of its activations: when the last one started and finished, what it failed
//! with, and when the next one is due. `medea get server` and the dashboard list them.
//!
//! Modelled on omicron's background tasks (oxidecomputer/omicron, `nexus/src/app/background/`:
//! a `BackgroundTask` has an `activate` that does one round of work, and a `Driver` owns the
//! tasks by name, activates each on its period or when woken, and keeps each one's last
//! activation — start, finish, outcome — for the API). medea's loops keep their own waits
//! (a kick, a leadership change, the change counter, a schedule), since each one's wake rules
//! are pinned by tests; what they share is this registry and the bracket around an
//! activation ([`TaskHandle::activate`]), so what each did last is recorded the same way.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use jiff::Timestamp;

/// What the registry knows about one task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskStatus {
    /// The task's name (`refresh`, `reconcile`, `backups`, `leadership`, `executor`).
    pub name: &'static str,
    /// What the task does, one line.
    pub description: &'static str,
    /// Activations started since the server started.
    pub activations: u64,
    /// Whether an activation is under way.
    pub running: bool,
    /// When the last activation started and finished (`None`: not yet).
    pub last_started: Option<Timestamp>,
    pub last_finished: Option<Timestamp>,
    /// The last finished activation's error (`None` when it succeeded).
    pub last_error: Option<String>,
    /// When the task will activate next without being woken (`None`: only when woken).
    pub next_run: Option<Timestamp>,
}

impl TaskStatus {
    /// The record on the wire (`ListBackgroundTasks`; times RFC 3339, empty for none).
    pub fn to_pb(&self) -> crate::api::pb::BackgroundTask {
        let at = |t: Option<Timestamp>| t.map(|t| t.to_string()).unwrap_or_default();
        crate::api::pb::BackgroundTask {
            name: self.name.to_string(),
            description: self.description.to_string(),
            activations: self.activations,
            running: self.running,
            last_started: at(self.last_started),
            last_finished: at(self.last_finished),
            last_error: self.last_error.clone().unwrap_or_default(),
            next_run: at(self.next_run),
        }
    }
}

/// The registry of the server's background tasks (omicron's `Driver`, without the scheduling).
#[derive(Debug, Default)]
pub struct Tasks {
    tasks: Mutex<BTreeMap<&'static str, TaskStatus>>,
}

impl Tasks {
    /// Register the task `name` (again: its record starts over) and return its handle.
    pub fn register(self: &Arc<Self>, name: &'static str, description: &'static str) -> TaskHandle {
        self.lock().insert(
            name,
            TaskStatus {
                name,
                description,
                activations: 0,
                running: false,
                last_started: None,
                last_finished: None,
                last_error: None,
                next_run: None,
            },
        );
        TaskHandle {
            tasks: self.clone(),
            name,
        }
    }

    /// Every registered task, by name.
    pub fn list(&self) -> Vec<TaskStatus> {
        self.lock().values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, TaskStatus>> {
        // A panic while the map was held leaves plain values, each still whole.
        self.tasks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn update(&self, name: &'static str, f: impl FnOnce(&mut TaskStatus)) {
        if let Some(t) = self.lock().get_mut(name) {
            f(t);
        }
    }
}

/// One registered task: what its loop calls around each activation.
#[derive(Debug, Clone)]
pub struct TaskHandle {
    tasks: Arc<Tasks>,
    name: &'static str,
}

impl TaskHandle {
    /// Run one activation of the task: `work` is awaited between the recorded start and
    /// finish; its error (rendered with its source chain) becomes the task's last error, a
    /// success clears it. Returns what `work` returned.
    pub async fn activate<T, E: std::error::Error>(
        &self,
        work: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        self.started();
        let out = work.await;
        self.finished(
            out.as_ref()
                .err()
                .map(|e| crate::error_chain(e as &dyn std::error::Error)),
        );
        out
    }

    /// An activation starts now.
    pub fn started(&self) {
        let now = Timestamp::now();
        self.tasks.update(self.name, |t| {
            t.activations += 1;
            t.running = true;
            t.last_started = Some(now);
        });
    }

    /// The activation finished now, with `error` (`None`: it succeeded).
    pub fn finished(&self, error: Option<String>) {
        let now = Timestamp::now();
        self.tasks.update(self.name, |t| {
            t.running = false;
            t.last_finished = Some(now);
            t.last_error = error;
        });
    }

    /// The next activation is due at `at` unless the task is woken first (`None`: only when
    /// woken).
    pub fn next_run(&self, at: Option<Timestamp>) {
        self.tasks.update(self.name, |t| t.next_run = at);
    }

    /// The next activation is due `after` from now.
    pub fn next_run_in(&self, after: std::time::Duration) {
        let at = jiff::SignedDuration::try_from(after)
            .ok()
            .and_then(|d| Timestamp::now().checked_add(d).ok());
        self.next_run(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[tokio::test]
    async fn an_activation_records_its_start_finish_and_error() {
        let tasks = Arc::new(Tasks::default());
        let h = tasks.register("refresh", "refresh the inventory");
        let before = tasks.list();
        assert_eq!(before.len(), 1);
        assert_eq!(before[0].activations, 0);
        assert!(before[0].last_started.is_none());
        let r: Result<(), Outer> = h
            .activate(async { Err(Outer(std::io::Error::other("root cause"))) })
            .await;
        assert!(r.is_err());
        let t = &tasks.list()[0];
        assert_eq!(t.activations, 1);
        assert!(!t.running);
        assert!(t.last_started.is_some() && t.last_finished >= t.last_started);
        assert_eq!(t.last_error.as_deref(), Some("outer: root cause"));
        let ok: Result<u8, Outer> = h.activate(async { Ok(7) }).await;
        assert!(matches!(ok, Ok(7)));
        let t = &tasks.list()[0];
        assert_eq!(t.activations, 2);
        assert_eq!(t.last_error, None);
        h.next_run_in(std::time::Duration::from_secs(60));
        assert!(tasks.list()[0].next_run > t.last_finished);
    }

    /// Issue #50: a background task whose activation fails shows that error through the API
    /// (`ListBackgroundTasks`, what `medea get server -o wide` and the dashboard list), with
    /// its last run and its next one. Here the inventory refresh, whose credentials directory
    /// is a file.
    #[tokio::test]
    async fn a_task_whose_activation_fails_shows_its_last_error_through_the_api() {
        use crate::api::pb::{self, medea_server::Medea as _};
        use std::time::Duration;
        let dir = tempfile::tempdir().unwrap();
        let not_a_dir = dir.path().join("creds");
        std::fs::write(&not_a_dir, "a file, not the credentials directory").unwrap();
        let mut shared = crate::server::Shared::new(
            std::sync::Arc::new(crate::store::mem::MemStore::new()),
            crate::desired::Source::Dir(dir.path().into()),
            false,
            "test".into(),
        );
        shared.creds_dir = not_a_dir;
        let shared = std::sync::Arc::new(shared);
        let hour = Duration::from_secs(3600);
        let task = tokio::spawn(crate::server::refresh_loop(shared.clone(), hour, hour));
        let api = crate::server::api::MedeaApi {
            shared: shared.clone(),
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let refresh = loop {
            let tasks = api
                .list_background_tasks(tonic::Request::new(pb::ListBackgroundTasksRequest {}))
                .await
                .unwrap()
                .into_inner()
                .tasks;
            if let Some(t) = tasks
                .into_iter()
                .find(|t| t.name == "refresh" && !t.next_run.is_empty())
            {
                break t;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the refresh task never finished an activation"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        task.abort();
        assert!(
            refresh
                .last_error
                .contains("cannot read the credentials directory"),
            "{refresh:?}"
        );
        assert_eq!(refresh.activations, 1, "{refresh:?}");
        assert!(!refresh.running, "{refresh:?}");
        assert!(
            !refresh.last_started.is_empty() && !refresh.last_finished.is_empty(),
            "{refresh:?}"
        );
        let next: jiff::Timestamp = refresh.next_run.parse().unwrap();
        let finished: jiff::Timestamp = refresh.last_finished.parse().unwrap();
        assert!(next > finished, "{refresh:?}");
    }
}
