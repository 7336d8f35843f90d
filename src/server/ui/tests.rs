//! HTTP-level tests of the dashboard (no browser): sessions, cookie flags, CSRF, headers, the
//! event stream's authentication and its resume from `Last-Event-ID`. The browser tests are in
//! `tests/it/ui_browser.rs`.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, Response, StatusCode, header};
use http_body_util::BodyExt as _;
use tower::ServiceExt as _;

use super::*;
use crate::rollout::journal::{Entry, JournalEntry, entry_key, job_key};
use crate::rollout::sequencer::{Job, JobId, JobState};
use crate::store::{Store, Txn};

const TOKEN: &str = "the-api-token-0123456789";

fn ui_with(store: Arc<dyn Store>) -> Ui {
    let examples = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples");
    let shared = Shared::new(
        store,
        crate::desired::Source::Dir(examples),
        false,
        "r1".into(),
    );
    Ui::new(Arc::new(shared), Secret::new(TOKEN.into()))
}

fn ui() -> Ui {
    ui_with(Arc::new(crate::rollout::fake::MemStore::new()))
}

async fn send(ui: &Ui, req: Request<Body>) -> Response<Body> {
    router(ui.clone()).oneshot(req).await.unwrap()
}

/// `POST /logout` with the session's cookie and the CSRF token of `page`.
async fn logout(ui: &Ui, cookie: &str, page: &str) -> Response<Body> {
    let form = format!("csrf={}", csrf_of(page));
    send(ui, post("/logout", Some(cookie), &form)).await
}

fn get(path: &str, cookie: Option<&str>) -> Request<Body> {
    let mut b = Request::get(path);
    if let Some(c) = cookie {
        b = b.header(header::COOKIE, c);
    }
    b.body(Body::empty()).unwrap()
}

fn post(path: &str, cookie: Option<&str>, form: &str) -> Request<Body> {
    let mut b =
        Request::post(path).header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    if let Some(c) = cookie {
        b = b.header(header::COOKIE, c);
    }
    b.body(Body::from(form.to_string())).unwrap()
}

async fn text(r: Response<Body>) -> String {
    String::from_utf8(r.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
}

fn assert_security_headers(r: &Response<Body>) {
    let h = r.headers();
    assert_eq!(h["content-security-policy"], CSP);
    assert_eq!(h["x-frame-options"], "DENY");
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert_eq!(h["referrer-policy"], "no-referrer");
    assert_eq!(h["cache-control"], "no-store");
}

/// Log in; returns the `Cookie` header value to send back.
async fn login(ui: &Ui) -> String {
    let r = send(ui, post("/login", None, &format!("token={TOKEN}"))).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()[header::LOCATION], "/");
    let set = r.headers()[header::SET_COOKIE]
        .to_str()
        .unwrap()
        .to_string();
    set.split(';').next().unwrap().to_string()
}

/// The CSRF token a page's form carries.
fn csrf_of(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .expect("a form with a CSRF token")
        + 19;
    page[at..at + 64].to_string()
}

#[tokio::test]
async fn without_a_session_pages_redirect_to_login_and_the_event_stream_is_401() {
    let ui = ui();
    for path in [
        "/",
        "/plan",
        "/history",
        "/rollouts/abc-home",
        "/rollouts/abc-home/halt",
        "/nope",
    ] {
        let r = send(&ui, get(path, None)).await;
        assert_eq!(r.status(), StatusCode::SEE_OTHER, "{path}");
        assert_eq!(r.headers()[header::LOCATION], "/login", "{path}");
        assert_security_headers(&r);
    }
    let r = send(&ui, get("/rollouts/abc-home/events", None)).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_security_headers(&r);
    // a forged cookie is no session
    let forged = format!("{SESSION_COOKIE}={}", "ab".repeat(32));
    let r = send(&ui, get("/rollouts/abc-home/events", Some(&forged))).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = send(&ui, get("/", Some(&forged))).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    // the login page and the assets need none
    let r = send(&ui, get("/login", None)).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_security_headers(&r);
    let css = send(&ui, get("/assets/style.css", None)).await;
    assert_eq!(
        css.headers()[header::CONTENT_TYPE],
        "text/css; charset=utf-8"
    );
    let js = send(&ui, get("/assets/app.js", None)).await;
    assert_eq!(
        js.headers()[header::CONTENT_TYPE],
        "text/javascript; charset=utf-8"
    );
    assert_eq!(text(css).await.len() + text(js).await.len(), ASSET_BYTES);
}

#[tokio::test]
async fn a_wrong_token_gets_no_session() {
    let ui = ui();
    for bad in [
        "",
        "the-api-token-012345678",
        "Bearer the-api-token-0123456789",
        "x",
    ] {
        let r = send(&ui, post("/login", None, &format!("token={bad}"))).await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{bad:?}");
        assert!(r.headers().get(header::SET_COOKIE).is_none(), "{bad:?}");
        let page = text(r).await;
        assert!(page.contains("Wrong token"), "{page}");
    }
    assert_eq!(ui.sessions.len(), 0);
}

#[tokio::test]
async fn login_sets_a_strict_http_only_secure_expiring_cookie_and_logout_ends_it() {
    let ui = ui();
    let r = send(&ui, post("/login", None, &format!("token={TOKEN}"))).await;
    let set = r.headers()[header::SET_COOKIE]
        .to_str()
        .unwrap()
        .to_string();
    for flag in [
        "HttpOnly",
        "Secure",
        "SameSite=Strict",
        "Max-Age=28800",
        "Path=/",
    ] {
        assert!(set.contains(flag), "{set}");
    }
    assert!(
        !set.contains(TOKEN),
        "the cookie is a session id, not the token"
    );
    let cookie = set.split(';').next().unwrap().to_string();
    let r = send(&ui, get("/", Some(&cookie))).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_security_headers(&r);
    let page = text(r).await;
    assert!(page.contains("Overview"), "{page}");
    // logout needs the CSRF token
    let r = send(&ui, post("/logout", Some(&cookie), "csrf=nope")).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = logout(&ui, &cookie, &page).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert!(
        r.headers()[header::SET_COOKIE]
            .to_str()
            .unwrap()
            .contains("Max-Age=0")
    );
    let r = send(&ui, get("/", Some(&cookie))).await;
    assert_eq!(
        r.status(),
        StatusCode::SEE_OTHER,
        "the session is gone on the server"
    );
}

#[tokio::test]
async fn no_page_contains_the_token_and_none_has_inline_script_or_style() {
    let ui = ui();
    let cookie = login(&ui).await;
    for path in [
        "/",
        "/plan",
        "/history",
        "/history?ready=no&cluster=home",
        "/login",
        "/rollouts",
    ] {
        let r = send(&ui, get(path, Some(&cookie))).await;
        assert!(
            r.status().is_success() || r.status() == StatusCode::SEE_OTHER,
            "{path}"
        );
        let page = text(r).await;
        assert!(!page.contains(TOKEN), "{path}");
        assert!(!page.contains("<script>"), "{path}: no inline script");
        assert!(!page.contains("<style"), "{path}: no inline style");
        assert!(!page.contains(" style="), "{path}: no style attribute");
        assert!(
            !has_handler_attribute(&page),
            "{path}: no event handler attribute"
        );
        assert!(
            !page.contains("http://") && !page.contains("https://"),
            "{path}: nothing from elsewhere"
        );
    }
}

#[tokio::test]
async fn halt_needs_the_sessions_csrf_token_and_a_same_site_request() {
    let store: Arc<dyn Store> = Arc::new(crate::rollout::fake::MemStore::new());
    let ui = ui_with(store.clone());
    let id = put_job(store.as_ref(), 2, JobState::Running);
    let cookie = login(&ui).await;
    let page = text(send(&ui, get(&format!("/rollouts/{id}/halt"), Some(&cookie))).await).await;
    assert!(page.contains("Halt rollout"), "{page}");
    let csrf = csrf_of(&page);
    let halted = || {
        use crate::store::StoreExt;
        store
            .get_record::<crate::rollout::journal::HaltRequest>(&crate::rollout::journal::halt_key(
                &id,
            ))
            .unwrap()
            .is_some()
    };
    // no token, a wrong one, another session's: refused, nothing written
    let other = login(&ui).await;
    let other_csrf = csrf_of(&text(send(&ui, get("/", Some(&other))).await).await);
    for form in [
        "reason=x".to_string(),
        "csrf=&reason=x".into(),
        format!("csrf={other_csrf}"),
    ] {
        let r = send(
            &ui,
            post(&format!("/rollouts/{id}/halt"), Some(&cookie), &form),
        )
        .await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{form}");
        assert!(!halted(), "{form}");
    }
    // without a session: to the login page, nothing written
    let r = send(
        &ui,
        post(
            &format!("/rollouts/{id}/halt"),
            None,
            &format!("csrf={csrf}"),
        ),
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert!(!halted());
    // a cross-site POST, even with the right token: refused
    let mut req = post(
        &format!("/rollouts/{id}/halt"),
        Some(&cookie),
        &format!("csrf={csrf}"),
    );
    req.headers_mut()
        .insert("sec-fetch-site", "cross-site".parse().unwrap());
    assert_eq!(send(&ui, req).await.status(), StatusCode::FORBIDDEN);
    assert!(!halted());
    // the real thing
    let r = send(
        &ui,
        post(
            &format!("/rollouts/{id}/halt"),
            Some(&cookie),
            &format!("csrf={csrf}&reason=on+call+said+so"),
        ),
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        r.headers()[header::LOCATION],
        format!("/rollouts/{id}").as_str()
    );
    assert!(halted());
    // a GET never halts: the confirmation page is a GET, the action a POST
    let r = send(
        &ui,
        get(&format!("/rollouts/{id}/halt?csrf={csrf}"), Some(&cookie)),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
}

/// Issue #36: the job page compares the elapsed time with the plan's prediction; a job that
/// ran past the pessimistic bound says so.
#[tokio::test]
async fn the_job_page_compares_elapsed_with_the_prediction() {
    let store: Arc<dyn Store> = Arc::new(crate::rollout::fake::MemStore::new());
    let ui = ui_with(store.clone());
    let at = jiff::Timestamp::from_second(1_800_000_000 + 1200).unwrap();
    let id = put_job(store.as_ref(), 2, JobState::Succeeded { at });
    let cookie = login(&ui).await;
    let page = text(send(&ui, get(&format!("/rollouts/{id}"), Some(&cookie))).await).await;
    assert!(
        page.contains("duration: elapsed 20m00s, predicted median 10m00s, pessimistic 15m00s: past the pessimistic bound"),
        "{page}"
    );
}

/// A job whose checkpoint already includes journal entries `0..=last` (no deltas to replay).
fn put_job(store: &dyn Store, last: u64, state: JobState) -> JobId {
    let plan = crate::plan::PlanId::parse_full(&"ab".repeat(32)).unwrap();
    let id = JobId::for_plan(&plan, "home");
    let at = jiff::Timestamp::from_second(1_800_000_000).unwrap();
    let job = Job {
        id: id.clone(),
        plan,
        cluster: "home".into(),
        created_at: at,
        windows: vec![],
        exclusions: vec![],
        predicted: Some(crate::plan::estimate::Bounds {
            median_secs: 600,
            pessimistic_secs: 900,
        }),
        control_plane: vec![],
        steps: vec![],
        state,
        generation: last,
        snapshot: None,
        snapshot_attempts: 0,
        snapshot_recipients: Vec::new(),
        in_flight: None,
        journal_seq: last,
        health: None,
        gates: Default::default(),
        applies: Vec::new(),
        hooks: None,
        hook_runs: Default::default(),
        // started at its creation (issue #51: the clock starts with the first command)
        clock: crate::rollout::sequencer::JobClock {
            started_at: Some(at),
            ..Default::default()
        },
    };
    let mut txn = Txn::new().put_record(job_key(&id), &job);
    for seq in 0..=last {
        txn = txn.put_record(entry_key(&id, seq), &entry(&id, seq));
    }
    store.commit(txn).unwrap();
    id
}

fn entry(id: &JobId, seq: u64) -> JournalEntry {
    JournalEntry {
        job: id.clone(),
        seq,
        at: jiff::Timestamp::from_second(1_800_000_000 + seq as i64).unwrap(),
        generation: seq,
        entry: if seq == 0 {
            Entry::Created {
                plan: crate::plan::PlanId::parse_full(&"ab".repeat(32)).unwrap(),
            }
        } else {
            Entry::Progress
        },
        notes: vec![format!("note {seq}")],
        delta: None,
    }
}

/// The next SSE events of a body, as (event, id, data) until `stop` matches one.
async fn read_events(
    body: &mut Body,
    stop: impl Fn(&str) -> bool,
) -> Vec<(String, Option<String>, String)> {
    let mut buf = String::new();
    let mut out = Vec::new();
    loop {
        let frame = tokio::time::timeout(std::time::Duration::from_secs(10), body.frame())
            .await
            .expect("an event in time")
            .expect("the stream goes on")
            .unwrap();
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buf.push_str(std::str::from_utf8(&data).unwrap());
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let (mut ev, mut id, mut data) = (String::new(), None, Vec::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event: ") {
                    ev = v.to_string();
                } else if let Some(v) = line.strip_prefix("id: ") {
                    id = Some(v.to_string());
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push(v);
                }
            }
            if ev.is_empty() {
                continue; // keep-alive comment
            }
            let done = stop(&ev);
            out.push((ev, id, data.join("\n")));
            if done {
                return out;
            }
        }
    }
}

#[tokio::test]
async fn the_event_stream_resumes_after_last_event_id_and_follows_the_executor() {
    let store: Arc<dyn Store> = Arc::new(crate::rollout::fake::MemStore::new());
    let ui = ui_with(store.clone());
    let id = put_job(store.as_ref(), 5, JobState::Running);
    let cookie = login(&ui).await;
    // the page says where its timeline ends
    let page = text(send(&ui, get(&format!("/rollouts/{id}"), Some(&cookie))).await).await;
    assert!(
        page.contains(&format!("/rollouts/{id}/events?after=5")),
        "{page}"
    );
    assert!(page.contains("note 5"), "{page}");
    // a reconnect that saw entry 3 gets 4 and 5, then the grid
    let mut req = get(&format!("/rollouts/{id}/events?after=1"), Some(&cookie));
    req.headers_mut()
        .insert("last-event-id", "3".parse().unwrap());
    let r = send(&ui, req).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()[header::CONTENT_TYPE], "text/event-stream");
    let mut body = r.into_body();
    let first = read_events(&mut body, |e| e == "grid").await;
    let ids: Vec<_> = first
        .iter()
        .map(|(e, id, _)| (e.as_str(), id.clone()))
        .collect();
    assert_eq!(
        ids,
        [
            ("entry", Some("4".into())),
            ("entry", Some("5".into())),
            ("grid", None)
        ]
    );
    assert!(first[0].2.contains("note 4"), "{first:?}");
    assert!(first[2].2.contains("running"), "{first:?}");
    // the executor moves on: entry 6, then an event on the broadcast wakes the stream
    let mut job: Job = {
        use crate::store::StoreExt;
        store.get_record(&job_key(&id)).unwrap().unwrap()
    };
    job.journal_seq = 6;
    job.state = JobState::Succeeded {
        at: jiff::Timestamp::from_second(1_800_000_100).unwrap(),
    };
    store
        .commit(
            Txn::new()
                .put_record(job_key(&id), &job)
                .put_record(entry_key(&id, 6), &entry(&id, 6)),
        )
        .unwrap();
    ui.shared
        .events
        .send(crate::rollout::executor::RolloutEvent {
            job: id.clone(),
            cluster: "home".into(),
            step: None,
            pool: None,
            node: None,
            op: None,
            state: crate::rollout::executor::EventState::Succeeded,
            steps: 0,
            image: None,
        })
        .unwrap();
    let next = read_events(&mut body, |e| e == "end").await;
    let ids: Vec<_> = next
        .iter()
        .map(|(e, id, _)| (e.as_str(), id.clone()))
        .collect();
    assert_eq!(
        ids,
        [("entry", Some("6".into())), ("grid", None), ("end", None)]
    );
    assert!(next[1].2.contains("succeeded"), "{next:?}");
    // the stream is over, and with it the subscription
    assert!(body.frame().await.is_none());
    assert_eq!(
        ui.shared.events.receiver_count(),
        0,
        "nobody watches: nothing subscribed"
    );
}

/// ` onclick=`-like attributes.
fn has_handler_attribute(page: &str) -> bool {
    page.match_indices(" on").any(|(i, _)| {
        let rest = &page[i + 3..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphabetic())
            .collect();
        !name.is_empty() && rest[name.len()..].starts_with('=')
    })
}

/// Browsers take no Ed25519 certificate: the generated identity is ECDSA and serves the
/// dashboard; an Ed25519 one (generated by an older medea) is refused with the fix named.
#[test]
fn the_generated_identity_serves_browsers_and_an_ed25519_one_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let listen = "127.0.0.1:7600".parse().unwrap();
    let generated =
        crate::server::tls::server_identity(None, None, &tmp.path().join("tls"), listen).unwrap();
    assert!(tls_config(&generated).is_ok());
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let old = ServerIdentity {
        cert_pem: cert.pem(),
        key_pem: Secret::new(key.serialize_pem()),
        ca_path: None,
        generated: false,
    };
    let e = tls_config(&old).unwrap_err();
    assert!(matches!(e, UiError::Ed25519), "{e:?}");
    assert!(e.to_string().contains("--tls-cert"), "{e}");
}

/// A stream opened by a session ends when the session does: logging out cuts it, and the
/// executor subscription goes with it (issue #32).
#[tokio::test]
async fn the_event_stream_ends_when_its_session_logs_out() {
    let store: Arc<dyn Store> = Arc::new(crate::rollout::fake::MemStore::new());
    let ui = ui_with(store.clone());
    let id = put_job(store.as_ref(), 2, JobState::Running);
    let cookie = login(&ui).await;
    let r = send(
        &ui,
        get(&format!("/rollouts/{id}/events?after=2"), Some(&cookie)),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let mut body = r.into_body();
    // the stream is live: its first batch came and it waits on the executor
    let first = read_events(&mut body, |e| e == "grid").await;
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(ui.shared.events.receiver_count(), 1);
    let page = text(send(&ui, get("/", Some(&cookie))).await).await;
    let r = logout(&ui, &cookie, &page).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    // the job still runs, yet the stream is over
    let end = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            match body.frame().await {
                None => return,
                Some(Ok(_)) => continue, // a frame already queued
                Some(Err(e)) => panic!("the stream failed instead of ending: {e}"),
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the event stream outlived its session");
    // hyper drops a finished body; so does the test
    drop(body);
    assert_eq!(
        ui.shared.events.receiver_count(),
        0,
        "the executor subscription ended with the stream"
    );
}

/// A halted Talos job (pool `workers`, waves `[w-1, w-2]` and `[w-3]`: wave 1 done in 1m30s,
/// w-3 draining when the halt came), stored with its journal.
fn put_halted_talos_job(store: &dyn Store) -> JobId {
    use super::charts::tests::{Journal, at, set, talos_job};
    use crate::rollout::sequencer::{HaltCode, HaltReason, NodePhase, StepState};
    let mut j = Journal::new(talos_job());
    j.at(100, |job| {
        job.steps[0].state = StepState::Running;
        set(job, 0, NodePhase::Checking, 100);
        set(job, 1, NodePhase::Checking, 100);
    });
    j.at(160, |job| set(job, 0, NodePhase::Done, 160));
    j.at(190, |job| set(job, 1, NodePhase::Done, 190));
    j.at(200, |job| set(job, 2, NodePhase::Cordoned, 200));
    j.at(230, |job| {
        job.state = JobState::Halted {
            reason: HaltReason::new(HaltCode::OperatorRequest, "on call said <so>"),
            step: Some(0),
            node: Some("w-3".into()),
            op: None,
            at: at(230),
        }
    });
    let mut txn = Txn::new().put_record(job_key(&j.job.id), &j.job);
    for e in &j.entries {
        txn = txn.put_record(entry_key(&j.job.id, e.seq), e);
    }
    store.commit(txn).unwrap();
    j.job.id
}

#[tokio::test]
async fn the_overview_shows_a_halted_job_with_its_reason_and_the_rollouts_page_lists_it() {
    let store: Arc<dyn Store> = Arc::new(crate::rollout::fake::MemStore::new());
    let ui = ui_with(store.clone());
    let cookie = login(&ui).await;
    // nothing yet: the overview says so and links the list
    let page = text(send(&ui, get("/", Some(&cookie))).await).await;
    assert!(page.contains("No rollout is running or halted"), "{page}");
    assert!(
        page.contains(r#"href="/rollouts""#),
        "the nav has Rollouts: {page}"
    );
    let id = put_halted_talos_job(store.as_ref());
    let page = text(send(&ui, get("/", Some(&cookie))).await).await;
    let at = page.find(r#"id="jobs""#);
    let card = &page[at.unwrap_or_else(|| panic!("the jobs section: {page}"))..];
    let card = &card[..card.find("</section>").unwrap()];
    assert!(
        card.contains(&format!(r#"href="/rollouts/{id}""#)),
        "{card}"
    );
    assert!(card.contains("halted"), "{card}");
    assert!(
        card.contains("on call said &lt;so&gt;"),
        "the reason, escaped: {card}"
    );
    assert!(card.contains("needs new approvals"), "{card}");
    // 2 of 3 nodes done
    assert!(card.contains("2/3"), "{card}");
    let list = send(&ui, get("/rollouts", Some(&cookie))).await;
    assert_eq!(list.status(), StatusCode::OK);
    let list = text(list).await;
    let row = &list[list
        .find(&format!(r#"<tr data-job="{id}""#))
        .expect("a row for the job")..];
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(row.contains("on call said &lt;so&gt;"), "{row}");
    assert!(row.contains(r#"class="mini""#), "{row}");
    assert!(row.contains("3m50s"), "halted 230 s after creation: {row}");
}

#[tokio::test]
async fn the_rollout_page_draws_the_nodes_the_progress_and_the_waves_and_the_stream_redraws_them() {
    let store: Arc<dyn Store> = Arc::new(crate::rollout::fake::MemStore::new());
    let ui = ui_with(store.clone());
    let id = put_halted_talos_job(store.as_ref());
    let cookie = login(&ui).await;
    let page = text(send(&ui, get(&format!("/rollouts/{id}"), Some(&cookie))).await).await;
    for want in [
        r#"<svg class="progress""#,
        r#"<svg class="grid""#,
        r#"<svg class="timeline""#,
        r#"data-node="w-1" data-state="back""#,
        r#"data-node="w-3" data-state="halted""#,
        "stopped at drain",
        // the progress bar: two of three back, the third halted
        r#"<rect class="s-back" data-state="back" x="0" y="3" width="466" height="16">"#,
        r#"<rect class="s-halted" data-state="halted" x="466" y="3" width="233" height="16">"#,
        "2/3 nodes back",
        "workers → v1.13.9 wave 1: 1m30s",
        "<title>workers → v1.13.9 wave 2: 30s until the halt</title>",
    ] {
        assert!(page.contains(want), "{want}:\n{page}");
    }
    // no task table: the nodes are a picture
    assert!(!page.contains("<table class=\"grid\""), "{page}");
    // the live stream's grid has the same pictures, timed from the whole journal although
    // it sends none of its entries
    let last = 5;
    let r = send(
        &ui,
        get(
            &format!("/rollouts/{id}/events?after={last}"),
            Some(&cookie),
        ),
    )
    .await;
    let mut body = r.into_body();
    let events = read_events(&mut body, |e| e == "end").await;
    let grid = events
        .iter()
        .find(|(e, _, _)| e == "grid")
        .map(|(_, _, d)| d.clone())
        .expect("a grid event");
    assert!(events.iter().all(|(e, _, _)| e != "entry"), "{events:?}");
    assert!(grid.contains("workers → v1.13.9 wave 1: 1m30s"), "{grid}");
    assert!(
        grid.contains(r#"data-node="w-3" data-state="halted""#),
        "{grid}"
    );
}

/// Issue #52 item 8: a halted job's page names the job that continued it (the newer job of its
/// cluster whose plan was made after this halt), and before there is one says so.
#[tokio::test]
async fn a_halted_jobs_page_links_the_job_that_continued_it() {
    use super::charts::tests::{at, talos_job};
    use crate::rollout::sequencer::JobId;
    let store: Arc<dyn Store> = Arc::new(crate::rollout::fake::MemStore::new());
    let ui = ui_with(store.clone());
    let id = put_halted_talos_job(store.as_ref());
    let cookie = login(&ui).await;
    let page = text(send(&ui, get(&format!("/rollouts/{id}"), Some(&cookie))).await).await;
    assert!(
        page.contains(r#"<p class="hint" id="continued-by">Continued by: no job yet"#),
        "{page}"
    );
    // the plan made after the halt (its basis names the halted job) and the job it started
    let base = planned(&ui);
    let mut next = crate::ops::replan::load_plan(store.as_ref(), &base)
        .unwrap()
        .unwrap();
    next.id = crate::plan::PlanId::from_digest([9; 32]);
    next.basis.halted.insert("home".into(), id.to_string());
    let mut job = talos_job();
    job.plan = next.id;
    job.id = JobId::for_plan(&next.id, "home");
    job.created_at = at(1_000);
    // a newer job whose plan is not one made after this halt is not the continuation
    let mut other = talos_job();
    other.plan = crate::plan::PlanId::from_digest([8; 32]);
    other.id = JobId::for_plan(&other.plan, "home");
    other.created_at = at(500);
    store
        .commit(
            Txn::new()
                .put_record(crate::plan::stored::plan_key(&next.id), &next)
                .put_record(job_key(&job.id), &job)
                .put_record(job_key(&other.id), &other),
        )
        .unwrap();
    let page = text(send(&ui, get(&format!("/rollouts/{id}"), Some(&cookie))).await).await;
    assert!(
        page.contains(&format!(
            r#"<p class="hint" id="continued-by">Continued by: <a href="/rollouts/{}">{}</a>"#,
            job.id, job.id
        )),
        "{page}"
    );
    assert!(
        !page.contains(&format!(r#"href="/rollouts/{}""#, other.id)),
        "{page}"
    );
}

/// Issue 36: a halted job's page lists its staged-but-not-rebooted nodes and what their next
/// boot does; a job with none has no such list.
#[tokio::test]
async fn a_halted_jobs_page_lists_the_nodes_staged_but_not_rebooted_and_their_next_boot() {
    use crate::rollout::sequencer::{Staging, StepKind};
    let store: Arc<dyn Store> = Arc::new(crate::rollout::fake::MemStore::new());
    let ui = ui_with(store.clone());
    let id = put_halted_talos_job(store.as_ref());
    let cookie = login(&ui).await;
    let page = text(send(&ui, get(&format!("/rollouts/{id}"), Some(&cookie))).await).await;
    assert!(
        !page.contains("staged-not-rebooted"),
        "nothing is staged: {page}"
    );
    // w-3 (cordoned when the halt came) was installed ahead and verified
    let mut job = crate::ops::jobs::load_job(store.as_ref(), &id)
        .unwrap()
        .unwrap();
    let StepKind::Talos(t) = &mut job.steps[0].kind else {
        panic!("a Talos step")
    };
    let to = t.rollout.to.clone();
    let w3 = t.nodes.iter_mut().find(|n| n.target.node == "w-3").unwrap();
    Arc::make_mut(w3).staging = Some(Staging::Staged {
        boot_id: "b-1".into(),
        at: "2026-12-03T01:00:00Z".parse().unwrap(),
    });
    store
        .commit(Txn::new().put_record(job_key(&id), &job))
        .unwrap();
    let page = text(send(&ui, get(&format!("/rollouts/{id}"), Some(&cookie))).await).await;
    let at = page
        .find(r#"id="staged-not-rebooted""#)
        .unwrap_or_else(|| panic!("the staged list: {page}"));
    let section = &page[at..];
    let section = &section[..section.find("</section>").unwrap()];
    assert!(
        section.contains("Any reboot of these nodes, planned or not, boots the new version."),
        "{section}"
    );
    assert!(
        section.contains(&format!(
            "<b>w-3</b>: installed ahead; its next boot boots {to}"
        )),
        "{section}"
    );
    assert!(
        !section.contains("w-1") && !section.contains("w-2"),
        "{section}"
    );
}

/// Issue 37: each cluster's card names its newest recorded etcd backup.
#[tokio::test]
async fn the_overview_names_each_clusters_newest_backup() {
    use crate::backup::{BackupRecord, Trigger, record_key};
    let store: Arc<dyn Store> = Arc::new(crate::rollout::fake::MemStore::new());
    let observed = crate::inventory::ObservedCluster::new("prod");
    store
        .commit(Txn::new().put_record(crate::inventory::cluster_key("prod"), &observed))
        .unwrap();
    let ui = ui_with(store.clone());
    let cookie = login(&ui).await;
    let page = text(send(&ui, get("/", Some(&cookie))).await).await;
    assert!(page.contains("newest backup"), "{page}");
    assert!(page.contains("none (spec.backup turns"), "{page}");
    let record = |file: &str, at: &str| BackupRecord {
        cluster: "prod".into(),
        file: file.into(),
        taken_at: at.parse().unwrap(),
        slot: None,
        trigger: Trigger::Manual,
        member: "cp-<1>".into(),
        snapshot_size: 1056,
        snapshot_sha256: "ab".into(),
        revision: Some(17),
        size: 1300,
        sha256: "cd".into(),
        destination: "local".into(),
        recipients: vec![],
    };
    let (old, new) = (
        record("prod-20261204T030000Z.db.age", "2026-12-04T03:00:00Z"),
        record("prod-20261205T030000Z.db.age", "2026-12-05T03:00:00Z"),
    );
    store
        .commit(
            Txn::new()
                .put_record(record_key("prod", &old.file), &old)
                .put_record(record_key("prod", &new.file), &new),
        )
        .unwrap();
    let page = text(send(&ui, get("/", Some(&cookie))).await).await;
    assert!(
        page.contains("<code>prod-20261205T030000Z.db.age</code> · taken 2026-12-05 03:00:00 UTC"),
        "{page}"
    );
    assert!(
        !page.contains("prod-20261204T030000Z"),
        "only the newest: {page}"
    );
    assert!(page.contains("from cp-&lt;1&gt;"), "escaped: {page}");
    assert!(page.contains(" · etcd revision 17"), "{page}");
}

/// The examples planned against an observed `home` (three control-plane nodes, three
/// workers): the current plan's id.
fn planned(ui: &Ui) -> crate::plan::PlanId {
    use crate::inventory::{Machine, MachineRole, ObservedCluster, cluster_key};
    use crate::version::{KubeVersion, TalosVersion};
    let machine = |node: &str, role| Machine {
        node: node.into(),
        id: format!("id-{node}"),
        address: "127.0.0.1".into(),
        role,
        talos_version: Some(TalosVersion::parse("v1.12.4").unwrap()),
        installer_image: None,
        schematic: None,
        platform: None,
        secure_boot: None,
        factory_host: None,
        extensions: Default::default(),
        kubelet_version: Some(KubeVersion::parse("v1.34.1").unwrap()),
        ready: true,
        cordoned: false,
        reachable: true,
        boot_id: Some("boot-1".into()),
        labels: Default::default(),
    };
    let mut machines = std::collections::BTreeMap::new();
    for n in ["cp-1", "cp-2", "cp-3"] {
        machines.insert(n.to_string(), machine(n, MachineRole::Controlplane));
    }
    for n in ["w-1", "w-2", "w-3"] {
        machines.insert(n.to_string(), machine(n, MachineRole::Worker));
    }
    let home = ObservedCluster::new("home")
        .observe(Some(KubeVersion::parse("v1.34.1").unwrap()), machines);
    let store = ui.shared.store.as_ref();
    store
        .commit(Txn::new().put_record(cluster_key("home"), &home))
        .unwrap();
    ui.shared
        .set_desired(crate::desired::load(&ui.shared.source).unwrap());
    crate::server::reconcile::reconcile(&ui.shared, &[], jiff::Timestamp::now()).unwrap();
    crate::ops::replan::current(store).unwrap().unwrap().id
}

/// Issue 36 item 4: the plan page shows a stored rehearsal's outcome, its PDB blocker with the
/// node, the timeline and the limits, says it is advice, and escapes what the report says.
#[tokio::test]
async fn the_plan_page_shows_a_stored_rehearsals_pdb_blocker_and_node_escaped() {
    use crate::rehearsal::report::{Blocker, BlockerKind, Outcome, Rehearsal, RehearsedWave};
    let ui = ui();
    let plan = planned(&ui);
    let cookie = login(&ui).await;
    let page = text(send(&ui, get("/plan", Some(&cookie))).await).await;
    assert!(page.contains(&plan.to_hex()), "{page}");
    assert!(
        page.contains(r#"<button id="rehearse" type="submit">Rehearse</button>"#),
        "{page}"
    );
    assert!(
        !page.contains("<section class=\"rehearsal\""),
        "no report yet: {page}"
    );

    let report = Rehearsal {
        plan: plan.to_hex(),
        cluster: "home".into(),
        ran_at: "2026-12-06T10:00:00Z".into(),
        census_gathered_at: "2026-12-06T09:58:00Z".into(),
        compression: 60,
        timings: "history of 2 jobs".into(),
        waves: vec![RehearsedWave {
            step: "talos workers".into(),
            wave: 2,
            nodes: vec!["w-3".into()],
            start_secs: 190,
            duration_secs: None,
        }],
        outcome: Outcome::Halted {
            code: "drain_blocked".into(),
            node: Some("w-3".into()),
            reason: "drain of w-3 timed out".into(),
            after_secs: 790,
        },
        blockers: vec![Blocker {
            kind: BlockerKind::Pdb,
            node: Some("w-3".into()),
            detail: "PodDisruptionBudget shop/<script>db</script> allows no disruption".into(),
        }],
        limits: vec!["census truncated at 5000 pods & more".into()],
    };
    crate::ops::rehearse::store_report(ui.shared.store.as_ref(), &report).unwrap();
    let r = send(&ui, get("/plan", Some(&cookie))).await;
    assert_eq!(r.status(), StatusCode::OK);
    let page = text(r).await;
    let at = page
        .find("Rehearsal on a twin")
        .expect("the rehearsal section");
    let section = &page[at..];
    for want in [
        "advice, not part of the plan id",
        r#"<section class="rehearsal" data-cluster="home">"#,
        r#"<span class="badge halted">halted</span>"#,
        "halted at w-3 after 13m10s (drain_blocked): drain of w-3 timed out",
        // times to the second, as the pages print them (issue #52)
        "2026-12-06 10:00:00 UTC",
        "gathered 2026-12-06 09:58:00 UTC",
        "compressed 60×; timings: history of 2 jobs",
        // the blocker with its node, escaped
        "<tr><td class=\"bad\">pdb</td><td>w-3</td><td>PodDisruptionBudget shop/&lt;script&gt;db&lt;/script&gt; allows no disruption</td></tr>",
        // the timeline
        "<td>talos workers</td><td>2</td><td>w-3</td><td>+3m10s</td><td>did not finish</td>",
        "census truncated at 5000 pods &amp; more",
    ] {
        assert!(section.contains(want), "{want}\n{section}");
    }
    assert!(!page.contains("<script>db"), "the report's text is escaped");
    assert!(!page.contains("<script>"), "no inline script");
}

/// Issue 36 item 4: the Rehearse button is a POST with the session's CSRF token, refused
/// without a session, with a missing, wrong or other session's token, and cross-site; with
/// the right one it starts the rehearsal, the page says it runs, and its report shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rehearse_needs_the_sessions_csrf_token_and_then_shows_the_report() {
    let ui = ui();
    let plan = planned(&ui);
    let cookie = login(&ui).await;
    let page = text(send(&ui, get("/plan", Some(&cookie))).await).await;
    let csrf = csrf_of(&page);
    let form = |csrf: &str| format!("csrf={csrf}&plan={}", plan.to_hex());

    // no session: the login page, nothing started
    let r = send(&ui, post("/plan/rehearse", None, &form(&csrf))).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()[header::LOCATION], "/login");
    let other = login(&ui).await;
    let other_csrf = csrf_of(&text(send(&ui, get("/", Some(&other))).await).await);
    for bad in [String::new(), "nope".to_string(), other_csrf] {
        let r = send(&ui, post("/plan/rehearse", Some(&cookie), &form(&bad))).await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{bad:?}");
        assert!(text(r).await.contains("nothing was started"));
    }
    let mut cross = post("/plan/rehearse", Some(&cookie), &form(&csrf));
    cross
        .headers_mut()
        .insert("sec-fetch-site", "cross-site".parse().unwrap());
    assert_eq!(send(&ui, cross).await.status(), StatusCode::FORBIDDEN);
    assert!(!ui.shared.rehearsing.contains(&plan));
    assert_eq!(
        crate::ops::rehearse::load_report(ui.shared.store.as_ref(), &plan, "home").unwrap(),
        None
    );

    let r = send(&ui, post("/plan/rehearse", Some(&cookie), &form(&csrf))).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()[header::LOCATION], "/plan#rehearsals");
    // Until its report is stored the page says it runs and offers no second button; each poll
    // is the rehearsal's progress, bounded.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    let page = loop {
        let page = text(send(&ui, get("/plan", Some(&cookie))).await).await;
        let running = page.contains("id=\"rehearsing\"");
        if !running && page.contains(r#"<section class="rehearsal" data-cluster="home">"#) {
            break page;
        }
        assert!(running, "neither running nor reported: {page}");
        assert!(!page.contains("id=\"rehearse\""), "{page}");
        assert!(
            std::time::Instant::now() < deadline,
            "the rehearsal's report never appeared: {page}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let stored = crate::ops::rehearse::load_report(ui.shared.store.as_ref(), &plan, "home")
        .unwrap()
        .expect("the report is stored beside the plan");
    assert_eq!(stored.plan, plan.to_hex());
    let ran: jiff::Timestamp = stored.ran_at.parse().unwrap();
    assert!(
        page.contains(&ran.strftime("%Y-%m-%d %H:%M:%S UTC").to_string()),
        "{page}"
    );
    assert!(page.contains("Rehearse again"), "{page}");
    assert_eq!(
        crate::ops::replan::current(ui.shared.store.as_ref())
            .unwrap()
            .map(|c| c.id),
        Some(plan),
        "the plan is unchanged"
    );
}

/// Issue #49 item 6: the dashboard's plan page lists, under a Job hook, what it runs and may
/// reach (its init container with the privilege, the pod's host namespace and path, its
/// service account), escaped as the rest of the plan.
#[tokio::test]
async fn the_plan_page_lists_what_a_job_hook_runs_and_may_reach() {
    let tmp = tempfile::tempdir().unwrap();
    let examples = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/home");
    std::fs::create_dir_all(tmp.path().join("home")).unwrap();
    for f in ["cluster.yaml", "pools.yaml"] {
        std::fs::copy(examples.join(f), tmp.path().join("home").join(f)).unwrap();
    }
    let pools = tmp.path().join("home/pools.yaml");
    let mut yaml = std::fs::read_to_string(&pools).unwrap();
    yaml.push_str(concat!(
        "  hooks:\n    beforeNode:\n      - name: probe\n        timeout: 5m\n        job:\n",
        "          namespace: kube-system\n          podSpec:\n            serviceAccountName: admin\n",
        "            hostPID: true\n            volumes: [{ name: root, hostPath: { path: / } }]\n",
        "            initContainers:\n              - { name: setup, image: \"evil.example/x:1<b>\", securityContext: { privileged: true } }\n",
        "            containers:\n              - { name: main, image: busybox }\n",
    ));
    std::fs::write(&pools, yaml).unwrap();
    let shared = Shared::new(
        Arc::new(crate::rollout::fake::MemStore::new()),
        crate::desired::Source::Dir(tmp.path().to_path_buf()),
        false,
        "r1".into(),
    );
    let ui = Ui::new(Arc::new(shared), Secret::new(TOKEN.into()));
    planned(&ui);
    let cookie = login(&ui).await;
    let page = text(send(&ui, get("/plan", Some(&cookie))).await).await;
    for part in [
        "hook beforeNode: probe (job in namespace kube-system; timeout 5m)",
        "init setup: evil.example/x:1&lt;b&gt;; privileged",
        "container main: busybox",
        "pod: service account admin; hostPID; hostPath / (volume root)",
    ] {
        assert!(page.contains(part), "{part} in {page}");
    }
    assert!(!page.contains("1<b>"), "escaped: {page}");
}
