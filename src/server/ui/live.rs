//! The live stream of a rollout page: server-sent events fed by the executor's event stream
//! (the one `medea rollout status -w` watches).
//!
//! Every journal entry is sent as an `entry` event whose id is its journal sequence number, so a
//! browser that reconnects (it sends `Last-Event-ID`) is sent exactly the entries it missed,
//! read back from the store. After the entries comes a `grid` event (the page's live section,
//! rendered as on the page) and, for each executor event that carries a note the journal does
//! not (waits, drain refusals), a `note` event. The stream ends with `end` once the job has
//! finished, and at once when the session that opened it ends (logout or expiry). Nothing runs between events: the handler sleeps on the broadcast receiver, which
//! exists only while the page is open.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use tokio::sync::broadcast::error::RecvError;

use super::Ui;
use super::charts::Timings;
use super::pages::{journal_tail, live_section, timeline_entry};
use crate::ops::jobs::load_job;
use crate::rollout::executor::{EventState, RolloutEvent};
use crate::rollout::journal::{JournalEntry, entry_key};
use crate::rollout::sequencer::JobId;
use crate::store::StoreExt as _;

/// At most this many missed entries are replayed on a reconnect (the page's timeline shows
/// no more either).
const REPLAY_MAX: u64 = 500;

#[derive(serde::Deserialize)]
pub struct After {
    /// The last journal sequence number the page already shows (the first connection; a
    /// reconnect's `Last-Event-ID` wins).
    #[serde(default)]
    after: Option<u64>,
}

struct Watch {
    ui: Ui,
    job: JobId,
    rx: tokio::sync::broadcast::Receiver<RolloutEvent>,
    /// The last journal sequence number sent.
    last: u64,
    first: bool,
    done: bool,
    /// The journal folded so far, for the pictures' wave timings (read whole on the first
    /// batch, then each new entry is folded as it is sent).
    timings: Option<Timings>,
}

pub async fn events(
    State(ui): State<Ui>,
    Path(job): Path<String>,
    Query(q): Query<After>,
    headers: HeaderMap,
) -> Response {
    let Some(session) = ui.sessions.get(&headers) else {
        return (StatusCode::UNAUTHORIZED, "log in first").into_response();
    };
    let Some(job) = JobId::parse(&job) else {
        return (StatusCode::NOT_FOUND, "no such job").into_response();
    };
    match load_job(ui.shared.store.as_ref(), &job) {
        Ok(Some(_)) => {}
        Ok(None) => return (StatusCode::NOT_FOUND, "no such job").into_response(),
        Err(e) => {
            tracing::error!(error = %crate::error_chain(&e), "dashboard: cannot read a job");
            return (StatusCode::INTERNAL_SERVER_ERROR, "cannot read the job").into_response();
        }
    }
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    // Subscribe before reading the store: an entry written in between is in both, never in
    // neither (entries are de-duplicated by sequence number).
    let rx = ui.shared.events.subscribe();
    let w = Watch {
        ui,
        job,
        rx,
        last: resume.or(q.after).unwrap_or(0),
        first: true,
        done: false,
        timings: None,
    };
    // The stream ends with the session (logout, expiry): a stream must not outlive the
    // credential that opened it.
    let stream = futures::stream::unfold(w, next_batch)
        .flat_map(futures::stream::iter)
        .take_until(Box::pin(session.ended()))
        .map(Ok::<Event, Infallible>);
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(20)))
        .into_response()
}

/// The next batch of events: at once on the first call, then after the job's next executor
/// event; `None` ends the stream (the job finished, or the executor is gone).
async fn next_batch(mut w: Watch) -> Option<(Vec<Event>, Watch)> {
    if w.done {
        return None;
    }
    let mut notes = Vec::new();
    if !w.first {
        // Sleep until something happens to this job.
        loop {
            match w.rx.recv().await {
                Ok(e) if e.job == w.job => {
                    if let Some(n) = note(&e) {
                        notes.push(n);
                    }
                    break;
                }
                Ok(_) => {}
                // Missed events: the store has the truth; re-read it.
                Err(RecvError::Lagged(_)) => break,
                Err(RecvError::Closed) => return None,
            }
        }
        // Take whatever else is already queued, so a burst becomes one update.
        while let Ok(e) = w.rx.try_recv() {
            if e.job == w.job
                && let Some(n) = note(&e)
            {
                notes.push(n);
            }
        }
    }
    w.first = false;
    let store = w.ui.shared.store.clone();
    let (job, entries) = match read(store.as_ref(), &w.job, w.last) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "dashboard: cannot read a job for its live view");
            return Some((
                vec![
                    Event::default()
                        .event("note")
                        .data("cannot read the job; see the server log"),
                ],
                w,
            ));
        }
    };
    // The timings need every entry: the whole journal on the first batch, or again when
    // entries were skipped (more than the replay cap between two wake-ups).
    let gap = match (&w.timings, entries.first()) {
        (Some(t), Some(e)) => t.last.is_some_and(|last| e.seq > last + 1),
        (None, _) => true,
        (Some(_), None) => false,
    };
    if gap && let Some(j) = &job {
        match journal_tail(store.as_ref(), j) {
            Ok((_, t)) => w.timings = Some(t),
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "dashboard: cannot read a job's journal for its live view");
            }
        }
    }
    let timings = w.timings.get_or_insert_with(Timings::default);
    for e in &entries {
        timings.fold(e);
    }
    let mut out = Vec::new();
    for e in &entries {
        out.push(
            Event::default()
                .event("entry")
                .id(e.seq.to_string())
                .data(timeline_entry(e).into_string()),
        );
        w.last = e.seq;
    }
    if let Some(job) = &job {
        out.push(
            Event::default().event("grid").data(
                live_section(
                    job,
                    timings,
                    &w.ui.shared.waits,
                    super::pages::continued_by(&w.ui, job).as_ref(),
                    jiff::Timestamp::now(),
                )
                .into_string(),
            ),
        );
    }
    for n in notes {
        out.push(Event::default().event("note").data(n));
    }
    if job.as_ref().is_none_or(|j| j.state.is_terminal()) {
        out.push(Event::default().event("end").data("finished"));
        w.done = true;
    }
    Some((out, w))
}

/// The job and its journal entries after `after` (at most [`REPLAY_MAX`], the newest).
fn read(
    store: &dyn crate::store::Store,
    job: &JobId,
    after: u64,
) -> Result<(Option<crate::rollout::sequencer::Job>, Vec<JournalEntry>), crate::store::StoreError> {
    let current = load_job(store, job)?;
    let Some(j) = &current else {
        return Ok((None, Vec::new()));
    };
    let newest = j.journal_seq.max(after);
    let from = (after + 1).max(newest.saturating_sub(REPLAY_MAX - 1));
    let mut entries = Vec::new();
    // Read by key from the first missing sequence number: a reconnect costs what it missed,
    // not the whole journal. Entries may run past the job's checkpoint (`journal_seq` of a
    // checkpoint is older than the newest entry), so read until the first gap.
    let mut seq = from;
    while let Some(e) = store.get_record::<JournalEntry>(&entry_key(job, seq))? {
        entries.push(e);
        seq += 1;
    }
    Ok((current, entries))
}

/// The human line of an executor event the journal does not say (waits and transient notes).
fn note(e: &RolloutEvent) -> Option<String> {
    let who = e.node.as_deref().unwrap_or(&e.cluster);
    match &e.state {
        EventState::Waiting { reason, .. } => Some(format!("{who}: waiting: {reason}")),
        EventState::Progress { note } => Some(format!("{who}: {note}")),
        EventState::Unknown { error } => {
            Some(format!("{who}: outcome unknown, re-observing: {error}"))
        }
        EventState::Paused { gate } => Some(format!("{who}: paused on a closed gate ({gate:?})")),
        _ => None,
    }
}
