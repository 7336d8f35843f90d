//! The web dashboard (`medea serve --ui-listen ADDR`): plans, approvals and rollouts in a
//! browser, over HTTPS with the API's certificate.
//!
//! **Owns:** the dashboard's routes, HTML pages and their SVG pictures of a rollout (`charts`),
//! embedded assets, browser sessions and the server-sent event stream of a rollout page.
//! **May depend on:** the rest of `server` (the API's views, the shared state, the token check),
//! `rollout` (jobs and their journal), `plan`, `desired`, `store`, `rehearsal` (how a stored
//! rehearsal report is shown).
//!
//! Architecture Invariant: read-only except for two actions, each a POST with the session's
//! CSRF token: **Halt rollout**, behind a confirmation page, and **Rehearse** on the plan page,
//! which runs the current plan on a simulated twin (loopback only) and stores its report beside
//! the plan: it changes neither a cluster nor the plan.
//! Architecture Invariant: every page and the event stream refuse a request without a live
//! session (pages redirect to the login page, the event stream answers 401); the only
//! unauthenticated routes are the login form and the two embedded assets.
//! Architecture Invariant: no credential reaches a page or the browser's storage: the bearer
//! token is exchanged once for a random session id in an HttpOnly cookie; pages show names,
//! versions, principals and key fingerprints only.
//! Architecture Invariant: nothing runs for the dashboard while nobody watches: a rollout
//! page's event stream subscribes to the executor's events only while it is open.

mod charts;
mod live;
mod pages;
mod session;
mod tasks;

use axum::Router;
use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use std::net::SocketAddr;
use std::sync::Arc;

use super::Shared;
use super::auth::TokenAuth;
use super::tls::ServerIdentity;
use crate::secret::Secret;
pub use session::{SESSION_COOKIE, SESSION_TTL};

/// The Content-Security-Policy of every response: nothing inline, nothing from elsewhere, no
/// framing.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'";

const STYLE: &str = include_str!("assets/style.css");
const SCRIPT: &str = include_str!("assets/app.js");

/// Total bytes the dashboard's assets add to a page load (the stylesheet and the script).
pub const ASSET_BYTES: usize = STYLE.len() + SCRIPT.len();
// Small on purpose (design/server.md states the sizes): the build fails if they grow past 8 KiB.
const _: () = assert!(
    ASSET_BYTES < 8 * 1024,
    "the dashboard's assets outgrew 8 KiB"
);

#[derive(Debug, thiserror::Error)]
pub enum UiError {
    #[error("cannot listen on {addr} for the dashboard")]
    Listen {
        addr: SocketAddr,
        #[source]
        err: std::io::Error,
    },
    #[error("the API's certificate or key is not usable for the dashboard")]
    Tls(#[source] super::listen::ConfigError),
    #[error(
        "the API's certificate has an Ed25519 key, which no browser accepts; remove the generated files under <state-dir>/tls (medea then generates ECDSA P-256 ones; API clients must trust the new ca.crt), or pass --tls-cert/--tls-key"
    )]
    Ed25519,
}

/// What every handler sees.
#[derive(Clone)]
pub struct Ui {
    shared: Arc<Shared>,
    auth: TokenAuth,
    sessions: Arc<session::Sessions>,
}

impl Ui {
    pub fn new(shared: Arc<Shared>, token: Secret<String>) -> Ui {
        Ui {
            shared,
            auth: TokenAuth::new(token),
            sessions: Arc::new(session::Sessions::default()),
        }
    }

    fn api(&self) -> super::api::MedeaApi {
        super::api::MedeaApi {
            shared: self.shared.clone(),
        }
    }
}

/// The dashboard's routes (without TLS; [`serve`] adds it).
pub fn router(ui: Ui) -> Router {
    Router::new()
        .route("/", get(pages::overview))
        .route("/plan", get(pages::plan))
        .route("/plan/rehearse", post(rehearse))
        .route("/history", get(pages::history))
        .route("/rollouts", get(pages::rollouts))
        .route("/rollouts/{job}", get(pages::rollout))
        .route("/rollouts/{job}/events", get(live::events))
        .route("/rollouts/{job}/halt", get(pages::halt_confirm).post(halt))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/assets/style.css", get(style))
        .route("/assets/app.js", get(script))
        .fallback(not_found)
        .layer(axum::middleware::from_fn(security_headers))
        .with_state(ui)
}

/// Bind `addr` and serve the dashboard over TLS with the API's identity until the returned
/// task is aborted. Returns the bound address and the task.
pub async fn start(
    addr: SocketAddr,
    identity: &ServerIdentity,
    ui: Ui,
    limits: Limits,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), UiError> {
    let tls = tls_config(identity)?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|err| UiError::Listen { addr, err })?;
    let bound = listener
        .local_addr()
        .map_err(|err| UiError::Listen { addr, err })?;
    let task = tokio::spawn(serve(listener, tls, router(ui), limits));
    Ok((bound, task))
}

fn tls_config(identity: &ServerIdentity) -> Result<Arc<rustls::ServerConfig>, UiError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    // medea generated Ed25519 certificates before the dashboard existed; a browser would fail
    // the handshake with no useful message, so say it here.
    if let Some(Ok(leaf)) = CertificateDer::pem_slice_iter(identity.cert_pem.as_bytes()).next()
        && let Ok((_, cert)) = x509_parser::parse_x509_certificate(&leaf)
        && cert.public_key().algorithm.algorithm.to_id_string() == "1.3.101.112"
    {
        return Err(UiError::Ed25519);
    }
    super::listen::tls_config(identity, &[b"h2", b"http/1.1"]).map_err(UiError::Tls)
}

/// The dashboard's connection caps and timeouts (issue #32): the listeners' limits
/// ([`super::listen::Limits`], the same defaults as the API's).
pub use super::listen::Limits;

async fn serve(
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    limits: Limits,
) {
    use super::listen::{Http, accept, serve_http};
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let mut incoming = accept("dashboard", listener, limits.clone(), move |tcp| {
        acceptor.accept(tcp)
    });
    let mut connections = tokio::task::JoinSet::new();
    while let Some(conn) = incoming.recv().await {
        // The protocol is the one ALPN chose: no sniffing of the first bytes.
        let http = if conn.get_ref().get_ref().1.alpn_protocol() == Some(b"h2".as_slice()) {
            Http::H2
        } else {
            Http::H1
        };
        connections.spawn(serve_http(conn, app.clone(), limits.clone(), http));
        while connections.try_join_next().is_some() {}
    }
}

/// Security headers on every response, whatever the route or status.
async fn security_headers(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    for (name, value) in [
        ("content-security-policy", CSP),
        ("x-frame-options", "DENY"),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
        ("cache-control", "no-store"),
        ("cross-origin-opener-policy", "same-origin"),
        ("strict-transport-security", "max-age=31536000"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    res
}

async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
        .into_response()
}

async fn not_found(State(ui): State<Ui>, headers: HeaderMap) -> Response {
    match ui.sessions.get(&headers) {
        Some(s) => pages::message(
            StatusCode::NOT_FOUND,
            "Not found",
            "There is no such page.",
            Some(&s),
        ),
        None => to_login(),
    }
}

/// Where an unauthenticated page request goes.
pub(crate) fn to_login() -> Response {
    Redirect::to("/login").into_response()
}

/// A POST that a browser says came from another site is refused before anything else
/// (defence in depth beside SameSite=Strict and the CSRF token).
fn cross_site(headers: &HeaderMap) -> bool {
    let site = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok());
    matches!(site, Some(s) if s != "same-origin" && s != "none")
}

async fn login_page(State(ui): State<Ui>, headers: HeaderMap) -> Response {
    if ui.sessions.get(&headers).is_some() {
        return Redirect::to("/").into_response();
    }
    pages::login(StatusCode::OK, None)
}

#[derive(serde::Deserialize)]
struct LoginForm {
    #[serde(default)]
    token: String,
}

async fn login(State(ui): State<Ui>, headers: HeaderMap, Form(f): Form<LoginForm>) -> Response {
    if cross_site(&headers) {
        return pages::login(StatusCode::FORBIDDEN, Some("Cross-site login refused."));
    }
    // The API's own check: exactly this token, compared in constant time; never logged.
    let presented = Secret::new(format!("Bearer {}", f.token.trim()));
    if ui.auth.check(Some(presented.expose())).is_err() {
        tracing::warn!("dashboard login with a wrong token refused");
        return pages::login(
            StatusCode::UNAUTHORIZED,
            Some("Wrong token. Use the API bearer token of this server (its --token-file)."),
        );
    }
    let id = ui.sessions.create(std::time::Instant::now());
    tracing::info!("dashboard login");
    (
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, session::cookie(&id)),
            (header::LOCATION, HeaderValue::from_static("/")),
        ],
    )
        .into_response()
}

#[derive(serde::Deserialize)]
struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

async fn logout(State(ui): State<Ui>, headers: HeaderMap, Form(f): Form<CsrfForm>) -> Response {
    let Some(s) = ui.sessions.get(&headers) else {
        return to_login();
    };
    if cross_site(&headers) || !s.csrf_matches(&f.csrf) {
        return pages::message(
            StatusCode::FORBIDDEN,
            "Refused",
            "The form's CSRF token does not match this session. Reload the page and try again.",
            Some(&s),
        );
    }
    ui.sessions.remove(&headers);
    (
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, session::clear_cookie()),
            (header::LOCATION, HeaderValue::from_static("/login")),
        ],
    )
        .into_response()
}

#[derive(serde::Deserialize)]
struct HaltForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    reason: String,
}

/// The only action on a cluster: halt a running job, as `medea rollout halt` does.
async fn halt(
    State(ui): State<Ui>,
    Path(job): Path<String>,
    headers: HeaderMap,
    Form(f): Form<HaltForm>,
) -> Response {
    let Some(s) = ui.sessions.get(&headers) else {
        return to_login();
    };
    if cross_site(&headers) || !s.csrf_matches(&f.csrf) {
        tracing::warn!(job = %job, "dashboard halt refused: CSRF token mismatch");
        return pages::message(
            StatusCode::FORBIDDEN,
            "Halt refused",
            "The form's CSRF token does not match this session; nothing was halted. Open the rollout page again and use its Halt button.",
            Some(&s),
        );
    }
    let Some(id) = crate::rollout::sequencer::JobId::parse(&job) else {
        return pages::message(
            StatusCode::BAD_REQUEST,
            "No such job",
            &format!("`{job}` is not a job id."),
            Some(&s),
        );
    };
    let reason = f.reason.trim();
    let reason = if reason.is_empty() {
        "halted from the web dashboard".to_string()
    } else {
        reason.chars().take(500).collect()
    };
    match crate::rollout::executor::request_halt(
        ui.shared.store.as_ref(),
        &id,
        "dashboard",
        Some(&reason),
        jiff::Timestamp::now(),
    ) {
        Ok(()) => {
            tracing::info!(job = %id, "halt requested from the dashboard");
            ui.shared.bump();
            Redirect::to(&format!("/rollouts/{id}")).into_response()
        }
        Err(e @ crate::rollout::RolloutError::UnknownJob { .. }) => pages::message(
            StatusCode::NOT_FOUND,
            "No such job",
            &e.to_string(),
            Some(&s),
        ),
        Err(e @ crate::rollout::RolloutError::AlreadyFinished { .. }) => pages::message(
            StatusCode::CONFLICT,
            "Already finished",
            &e.to_string(),
            Some(&s),
        ),
        Err(e) => {
            tracing::error!(job = %id, error = %crate::error_chain(&e), "dashboard halt failed");
            pages::message(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Halt failed",
                "The halt request could not be recorded; see the server log. Use `medea rollout halt` as a fallback.",
                Some(&s),
            )
        }
    }
}

#[derive(serde::Deserialize)]
struct RehearseForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    plan: String,
}

/// Start a rehearsal of the current plan on a twin, as `RehearsePlan` does; back to the plan
/// page, which says it runs and shows each report when it is stored.
async fn rehearse(
    State(ui): State<Ui>,
    headers: HeaderMap,
    Form(f): Form<RehearseForm>,
) -> Response {
    let Some(s) = ui.sessions.get(&headers) else {
        return to_login();
    };
    if cross_site(&headers) || !s.csrf_matches(&f.csrf) {
        tracing::warn!("dashboard rehearsal refused: CSRF token mismatch");
        return pages::message(
            StatusCode::FORBIDDEN,
            "Rehearsal refused",
            "The form's CSRF token does not match this session; nothing was started. Open the plan page again and use its Rehearse button.",
            Some(&s),
        );
    }
    use super::rehearsals::{StartError as E, start};
    match start(&ui.shared, f.plan.trim(), 0) {
        Ok(_) => {
            tracing::info!("rehearsal requested from the dashboard");
            Redirect::to("/plan#rehearsals").into_response()
        }
        Err(e @ E::Store(_)) => {
            tracing::error!(error = %crate::error_chain(&e), "dashboard rehearsal failed");
            pages::message(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Rehearsal failed",
                "The plan could not be read; see the server log.",
                Some(&s),
            )
        }
        Err(e @ E::UnknownPlan(_)) => pages::message(
            StatusCode::NOT_FOUND,
            "No such plan",
            &e.to_string(),
            Some(&s),
        ),
        Err(e @ (E::BadId { .. } | E::Ambiguous(_) | E::Compression(_))) => pages::message(
            StatusCode::BAD_REQUEST,
            "Not a plan id",
            &e.to_string(),
            Some(&s),
        ),
        Err(e) => pages::message(
            StatusCode::CONFLICT,
            "Not rehearsed",
            &e.to_string(),
            Some(&s),
        ),
    }
}

#[cfg(test)]
mod tests;
