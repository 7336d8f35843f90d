//! The web dashboard in a real browser: Debian's headless Chromium (`chromium`), driven through
//! WebDriver (`chromium-driver`) with fantoccini, against `medea serve --ui-listen` on the
//! simulator, every piece a real process as in `e2e.rs`. Every page is looked at 1280 px wide:
//! it must not scroll sideways, and a screenshot of it goes to `$MEDEA_UI_SCREENSHOTS`, else
//! `target/tmp/ui-screenshots/` (the path is printed) so a reviewer can look.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use futures::FutureExt as _;

use crate::fixtures::serve::Serve;
use crate::fixtures::{Kill, free_port, wait};

/// The simulator, a seeded store and `medea serve --rollouts --ui-listen`, as processes
/// (`fixtures::serve`), rollouts enabled for `home`.
struct Stack {
    s: Serve,
    ui: String,
}

impl Stack {
    /// `reboot`: how long a simulated node takes to reboot (slow keeps a job running).
    fn start(reboot: &'static str) -> Stack {
        let s = crate::fixtures::serve::serve()
            .reboot(reboot)
            .ui()
            .token("ui-test-token-0123456789abcdef")
            .server_wait(Duration::from_secs(60))
            .enable_rollouts()
            .start();
        Stack {
            ui: s.ui.clone().expect("started with --ui-listen"),
            s,
        }
    }

    fn dir(&self) -> &Path {
        &self.s.dir
    }

    fn token(&self) -> &str {
        &self.s.token
    }

    fn cli(&self) -> Command {
        self.s.cli()
    }

    /// The id of the current plan. The fixture seeds only once the simulated pods are ready,
    /// so the plan the server shows first is the one that holds: no refresh finds a
    /// PodDisruptionBudget that allowed nothing at seeding and replans under the approvers.
    fn plan_id(&self) -> String {
        let mut id = None;
        wait("the plan", Duration::from_secs(60), || {
            id = self.s.plan_json()["id"].as_str().map(str::to_string);
            id.is_some()
        });
        id.expect("a plan id")
    }

    /// A marker for plan `id` signed by a key no allowed_signers line lists (`mallory`).
    fn reject_marker(&self, id: &str) {
        let key = self.dir().join("mallory");
        assert!(
            crate::fixtures::tool("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", "mallory", "-f"])
                .arg(&key)
                .status()
                .unwrap()
                .success()
        );
        let dir = self.s.desired.join("approvals");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join(format!("{}-mallory.sig", &id[..12])),
            crate::fixtures::sign(&key, id),
        )
        .unwrap();
    }

    /// `medea approve <id> --key <who>`, as an approver types it.
    fn approve(&self, id: &str, who: &str) {
        let out = self
            .cli()
            .args(["approve", id, "--key"])
            .arg(self.s.key(who))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The job started by the approved plan.
    fn job(&self) -> String {
        let mut job = String::new();
        wait("the job to be created", Duration::from_secs(30), || {
            job = self.s.jobs()[0]["jobId"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            !job.is_empty()
        });
        job
    }

    fn job_state(&self) -> String {
        self.s.jobs()[0]["state"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    fn log(&self) -> String {
        self.s.serve_log()
    }

    /// base64(sha256(SubjectPublicKeyInfo)) of the served certificate, for Chromium's
    /// `--ignore-certificate-errors-spki-list`: this one key is trusted, nothing else.
    fn spki_pin(&self) -> String {
        use base64::Engine as _;
        use sha2::Digest as _;
        let pem = std::fs::read(self.s.state.join("tls/server.crt")).unwrap();
        let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
        let cert = pem.parse_x509().unwrap();
        base64::engine::general_purpose::STANDARD
            .encode(sha2::Sha256::digest(cert.tbs_certificate.subject_pki.raw))
    }
}

/// chromedriver on a loopback port, in its own process group (it and the Chromium it starts
/// are killed together when the test ends, however it ends).
struct Driver {
    child: Kill,
    port: u16,
}

impl Driver {
    fn start(dir: &Path) -> Driver {
        use std::os::unix::process::CommandExt as _;
        let port = free_port();
        let child = Kill(
            crate::fixtures::tool("chromedriver")
                .arg(format!("--port={port}"))
                .arg(format!(
                    "--log-path={}",
                    dir.join("chromedriver.log").display()
                ))
                .stdout(Stdio::null())
                .process_group(0)
                .spawn()
                .unwrap(),
        );
        wait("chromedriver", Duration::from_secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        Driver { child, port }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The group this test created: chromedriver and every browser process under it.
        let pgid = self.child.0.id() as i32;
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{pgid}")])
            .status();
    }
}

async fn browser(stack: &Stack, driver: &Driver) -> Client {
    crate::fixtures::require_tool("chromium");
    let profile = stack.dir().join("chromium-profile");
    let caps: serde_json::Map<String, serde_json::Value> =
        serde_json::from_value(serde_json::json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": crate::fixtures::require_tool("chromium"),
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--window-size=1280,1000",
                    format!("--user-data-dir={}", profile.display()),
                    format!("--ignore-certificate-errors-spki-list={}", stack.spki_pin()),
                ],
            },
        }))
        .unwrap();
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("a WebDriver session with headless Chromium")
}

/// Where screenshots go: `$MEDEA_UI_SCREENSHOTS`, else the tests' temporary directory.
fn shots_dir() -> PathBuf {
    let dir = std::env::var_os("MEDEA_UI_SCREENSHOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui-screenshots"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// What scrolls sideways: the page itself (`document.documentElement.scrollWidth` past its
/// `clientWidth`) or any element with a horizontal scrollbar of its own (a `pre` or a table
/// wider than the page); empty when nothing does.
async fn sideways(c: &Client) -> Vec<String> {
    let v = c
        .execute(
            r#"const out = [];
            const d = document.documentElement;
            if (d.scrollWidth > d.clientWidth) out.push(`page ${d.scrollWidth} > ${d.clientWidth}`);
            for (const e of document.querySelectorAll("body *")) {
              const x = getComputedStyle(e).overflowX;
              if ((x === "auto" || x === "scroll") && e.scrollWidth > e.clientWidth + 1)
                out.push(`${e.tagName.toLowerCase()}.${e.className} ${e.scrollWidth} > ${e.clientWidth}`);
            }
            return out;"#,
            vec![],
        )
        .await
        .unwrap();
    serde_json::from_value(v).unwrap()
}

/// Screenshot the page as it is; at the desktop width (1280 px) it must not scroll sideways.
async fn shot(c: &Client, name: &str) {
    let (width, _) = c.get_window_size().await.unwrap();
    if width >= 1280 {
        let wide = sideways(c).await;
        assert!(
            wide.is_empty(),
            "{name}: scrolls sideways at {width} px: {wide:?}"
        );
    }
    let png = c.screenshot().await.unwrap();
    let path = shots_dir().join(format!("{name}.png"));
    std::fs::write(&path, png).unwrap();
    let html = c.source().await.unwrap().len();
    println!("screenshot: {} (page HTML {html} bytes)", path.display());
}

async fn path_of(c: &Client) -> String {
    c.current_url().await.unwrap().path().to_string()
}

async fn text_of(c: &Client, css: &str) -> String {
    c.find(Locator::Css(css))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

async fn log_in(c: &Client, stack: &Stack, token: &str) {
    c.goto(&format!("{}/login", stack.ui)).await.unwrap();
    c.find(Locator::Css("#token"))
        .await
        .unwrap()
        .send_keys(token)
        .await
        .unwrap();
    c.find(Locator::Css("form.login button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    // The answer: the overview, or the login form again with the reason.
    until(
        c,
        "the login to be answered",
        Duration::from_secs(20),
        async |c| {
            path_of(c).await != "/login"
                || !c
                    .find_all(Locator::Css("p.error"))
                    .await
                    .unwrap()
                    .is_empty()
        },
    )
    .await;
}

/// Poll the page (never reload it) until `f` holds.
async fn until(c: &Client, what: &str, limit: Duration, mut f: impl AsyncFnMut(&Client) -> bool) {
    let deadline = Instant::now() + limit;
    while !f(c).await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Click the element `css` and wait until the page it leads to is at `path`: a click starts
/// the navigation, and WebDriver need not wait for it (or for a POST's redirect) to finish.
async fn click_to(c: &Client, css: &str, path: &str) {
    c.find(Locator::Css(css))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until(c, path, Duration::from_secs(30), async |c| {
        path_of(c).await == path
    })
    .await;
}

/// The state of every node tile of the grids, as the page shows them now (read in one script:
/// the live updates replace the grid's elements at any moment).
async fn activities(c: &Client) -> Vec<String> {
    let v = c
        .execute(
            "return Array.from(document.querySelectorAll('#live svg.grid g.node')).map(e => e.getAttribute('data-state'))",
            vec![],
        )
        .await
        .unwrap();
    serde_json::from_value(v).unwrap()
}

/// The text of the first element matching `css` ("" when there is none), read in one script.
async fn live_text(c: &Client, css: &str) -> String {
    let v = c
        .execute(
            "const e = document.querySelector(arguments[0]); return e ? e.textContent : ''",
            vec![serde_json::json!(css)],
        )
        .await
        .unwrap();
    v.as_str().unwrap_or_default().to_string()
}

/// Run `body` with a browser; the WebDriver session is closed whatever happens.
async fn with_browser(stack: &Stack, body: impl AsyncFnOnce(&Client)) {
    let driver = Driver::start(stack.dir());
    let c = browser(stack, &driver).await;
    let result = std::panic::AssertUnwindSafe(body(&c)).catch_unwind().await;
    let _ = c.close().await;
    drop(driver);
    if let Err(p) = result {
        let log = stack.log();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        eprintln!("--- serve.log, newest first\n{}", tail.join("\n"));
        std::panic::resume_unwind(p);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_log_in_see_the_plan_approve_from_the_cli_and_watch_the_grid_finish() {
    crate::fixtures::require_tool("chromedriver");
    let stack = Stack::start("1s");
    let id = stack.plan_id();
    with_browser(&stack, async |c: &Client| {
        // Not logged in: every page leads to the login form.
        c.goto(&format!("{}/plan", stack.ui)).await.unwrap();
        assert_eq!(path_of(c).await, "/login");
        shot(c, "login").await;
        log_in(c, &stack, stack.token()).await;
        assert_eq!(path_of(c).await, "/");
        assert_eq!(text_of(c, "h1").await, "Overview");
        assert!(
            text_of(c, "section.cluster h2")
                .await
                .contains("cluster home")
        );
        // No credential in the browser's reach: the cookie is HttpOnly, storage is empty, the
        // page does not carry the token.
        let js = c
            .execute(
                "return [document.cookie, localStorage.length, sessionStorage.length]",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(js, serde_json::json!(["", 0, 0]));
        assert!(!c.source().await.unwrap().contains(stack.token()));
        shot(c, "overview").await;

        // The plan page shows the id the CLI shows, and the approvals as they come.
        c.goto(&format!("{}/plan", stack.ui)).await.unwrap();
        assert_eq!(text_of(c, "#plan-id").await, id);
        assert!(text_of(c, "#approvals").await.starts_with("0 of 2"));
        // Why 2, and a marker that does not count, with its reason (issue #39 item 1).
        assert!(
            text_of(c, "#approvals-reason")
                .await
                .contains("approvals.controlPlane"),
        );
        stack.reject_marker(&id);
        until(
            c,
            "the rejected marker on the plan page",
            Duration::from_secs(30),
            async |c| {
                c.refresh().await.unwrap();
                match c.find(Locator::Css("#rejected")).await {
                    Ok(e) => e
                        .text()
                        .await
                        .is_ok_and(|t| t.contains("not in the allowed signers file")),
                    Err(_) => false,
                }
            },
        )
        .await;
        assert!(text_of(c, "#rejected").await.contains("-mallory.sig"));
        shot(c, "plan-rejected").await;
        stack.approve(&id, "alice");
        c.refresh().await.unwrap();
        assert!(text_of(c, "#approvals").await.starts_with("1 of 2"));
        assert!(c.source().await.unwrap().contains("alice@example.com"));
        // Issue #52 item 8: one duration prediction, with its basis, instead of a figure per
        // pool, the job's and the calendar's in the plan's text.
        let duration = text_of(c, "#plan-duration").await;
        assert!(
            duration.contains("cluster home: median ")
                && duration.contains("from documented defaults"),
            "{duration}"
        );
        let plan_text = text_of(c, "pre.plan").await;
        assert!(!plan_text.contains("predicted duration"), "{plan_text}");
        shot(c, "plan").await;

        // Issue #52 item 8: a rehearsal's report appears without a reload.
        c.execute("window.beforeRehearse = 1; return null", vec![])
            .await
            .unwrap();
        c.find(Locator::Css("#rehearse"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        // the POST answers with the plan page again: a new document
        until(c, "the plan page after Rehearse", Duration::from_secs(30), async |c| {
            let v = c
                .execute("return window.beforeRehearse === undefined && !!document.getElementById('rehearsal-section')", vec![])
                .await
                .unwrap();
            v == serde_json::json!(true)
        })
        .await;
        c.execute("window.noReload = 7; return null", vec![])
            .await
            .unwrap();
        assert!(
            !live_text(c, "#rehearsing").await.is_empty(),
            "the page says the rehearsal runs"
        );
        until(
            c,
            "the rehearsal's report on the plan page",
            Duration::from_secs(240),
            async |c| {
                !live_text(c, "#rehearsal-section section.rehearsal")
                    .await
                    .is_empty()
            },
        )
        .await;
        let marker = c.execute("return window.noReload", vec![]).await.unwrap();
        assert_eq!(
            marker,
            serde_json::json!(7),
            "the plan page was never reloaded"
        );
        assert!(live_text(c, "#rehearsing").await.is_empty());
        shot(c, "plan-rehearsed").await;

        // The second approval starts the job; its page follows it to the end by itself.
        stack.approve(&id, "bob");
        let job = stack.job();
        c.goto(&format!("{}/rollouts/{job}", stack.ui))
            .await
            .unwrap();
        c.execute("window.noReload = 42; return null", vec![])
            .await
            .unwrap();
        let first = activities(c).await;
        assert!(!first.is_empty(), "the grid shows the nodes");
        let entries_at_start = c
            .find_all(Locator::Css("#timeline li"))
            .await
            .unwrap()
            .len();
        let mut seen: std::collections::BTreeSet<String> = first.iter().cloned().collect();
        until(
            c,
            "the grid to show the job done",
            Duration::from_secs(240),
            async |c| {
                let now = activities(c).await;
                seen.extend(now.iter().cloned());
                let state = live_text(c, "#job-state").await;
                assert_ne!(state, "halted", "the job halted");
                state == "succeeded" && now.iter().all(|a| a == "back")
            },
        )
        .await;
        let marker = c.execute("return window.noReload", vec![]).await.unwrap();
        assert_eq!(marker, serde_json::json!(42), "the page was never reloaded");
        assert!(
            seen.iter().any(|a| a != "back" && a != "waiting"),
            "the grid moved while watched: {seen:?}"
        );
        // The pictures: a progress bar and a grid per Talos step, the waves on a timeline,
        // every wave finished with its duration.
        let count =
            |css: &'static str| async move { c.find_all(Locator::Css(css)).await.unwrap().len() };
        let steps = count("#live section.step").await;
        assert!(steps >= 2, "a section per step");
        assert_eq!(count("#live svg.progress").await, steps);
        assert!(count("#live svg.grid").await >= 1);
        let waves = count("#live svg.timeline g.wave").await;
        assert!(waves >= 2, "a row per wave");
        assert_eq!(
            count(r#"#live svg.timeline g.wave[data-state="back"]"#).await,
            waves,
            "every wave finished"
        );
        let bars = live_text(c, "#live svg.timeline").await;
        // each hop's rows named apart (issue #52 item 8)
        assert!(bars.contains("controlplane → v1.13.10 wave 1"), "{bars}");
        assert!(bars.contains("controlplane → v1.14.6 wave 1"), "{bars}");
        let entries_now = c
            .find_all(Locator::Css("#timeline li"))
            .await
            .unwrap()
            .len();
        assert!(entries_now > entries_at_start, "the timeline grew live");
        assert_eq!(stack.job_state(), "succeeded");
        shot(c, "rollout").await;
        c.execute(
            "document.querySelector('svg.timeline').scrollIntoView(); return null",
            vec![],
        )
        .await
        .unwrap();
        shot(c, "rollout-waves").await;
        // Readable on a phone: nothing wider than the screen but the tables' own scroll.
        c.set_window_size(390, 844).await.unwrap();
        let overflow = c
            .execute(
                "return document.documentElement.scrollWidth <= window.innerWidth",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(
            overflow,
            serde_json::json!(true),
            "no sideways scrolling on a phone"
        );
        shot(c, "rollout-phone").await;
        c.set_window_size(1280, 1000).await.unwrap();

        // Rollouts: the job, succeeded, fully done.
        click_to(c, r#"header a[href="/rollouts"]"#, "/rollouts").await;
        let row = text_of(c, &format!(r#"#rollouts tr[data-job="{job}"]"#)).await;
        assert!(row.contains("succeeded"), "{row}");
        shot(c, "rollouts").await;

        // History: the job's outcome, and the machines table filtered without JavaScript.
        c.goto(&format!("{}/history", stack.ui)).await.unwrap();
        assert!(c.source().await.unwrap().contains(&job));
        c.goto(&format!(
            "{}/history?cluster=home&pool=workers&ready=yes",
            stack.ui
        ))
        .await
        .unwrap();
        let rows = c
            .find_all(Locator::Css("#machines tbody tr"))
            .await
            .unwrap();
        assert_eq!(rows.len(), 3, "the three workers");
        shot(c, "history").await;

        // Log out: the session is gone.
        click_to(c, "header form button", "/login").await;
        c.goto(&format!("{}/", stack.ui)).await.unwrap();
        assert_eq!(path_of(c).await, "/login");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_a_wrong_token_gets_nothing_and_a_rollout_is_halted_from_the_page() {
    crate::fixtures::require_tool("chromedriver");
    // Nodes take minutes to reboot: the job is still running when the halt comes.
    let stack = Stack::start("600s");
    let id = stack.plan_id();
    stack.approve(&id, "alice");
    stack.approve(&id, "bob");
    let job = stack.job();
    with_browser(&stack, async |c: &Client| {
        // A wrong token: the login form again, no session, no page, no event stream.
        log_in(c, &stack, "not-the-token").await;
        assert_eq!(path_of(c).await, "/login");
        assert!(text_of(c, "p.error").await.contains("Wrong token"));
        shot(c, "login-wrong-token").await;
        for page in ["/", "/plan", "/history", &format!("/rollouts/{job}")] {
            c.goto(&format!("{}{page}", stack.ui)).await.unwrap();
            assert_eq!(path_of(c).await, "/login", "{page}");
            assert!(!c.source().await.unwrap().contains(&job), "{page}");
        }
        let status = c
            .execute_async(
                "const done = arguments[arguments.length - 1]; fetch(arguments[0]).then(r => done(r.status), e => done(String(e)));",
                vec![serde_json::json!(format!("/rollouts/{job}/events"))],
            )
            .await
            .unwrap();
        assert_eq!(status, serde_json::json!(401), "the event stream needs a session");

        // The right token, the running job, Halt, the confirmation, halted.
        log_in(c, &stack, stack.token()).await;
        c.goto(&format!("{}/rollouts/{job}", stack.ui)).await.unwrap();
        until(c, "a node to be under way", Duration::from_secs(120), async |c| {
            activities(c).await.iter().any(|a| a != "pending")
        })
        .await;
        assert_eq!(live_text(c, "#job-state").await, "running");
        // The overview shows the running job and where it is; a node down for its reboot
        // reads as a reboot, not as a transport error (issue #52 item 3).
        c.goto(&format!("{}/", stack.ui)).await.unwrap();
        let card_css = format!(r#"#jobs div.job.running[data-job="{job}"]"#);
        let mut card = String::new();
        until(c, "a node's reboot on the overview", Duration::from_secs(240), async |c| {
            c.refresh().await.unwrap();
            card = live_text(c, &card_css).await;
            card.contains("rebooting (Talos API not answering yet, expected)")
        })
        .await;
        assert!(!card.contains("Unavailable") && !card.contains("connection refused"), "{card}");
        assert!(card.contains("step 1/") && card.contains("nodes back"), "{card}");
        assert!(card.contains("node upgrades"), "one count, named (issue #52 item 2): {card}");
        shot(c, "overview-running").await;
        c.goto(&format!("{}/rollouts/{job}", stack.ui)).await.unwrap();
        shot(c, "rollout-running").await;
        click_to(c, "a.button.danger", &format!("/rollouts/{job}/halt")).await;
        assert_eq!(stack.job_state(), "running", "opening the confirmation halts nothing");
        c.find(Locator::Css("#reason"))
            .await
            .unwrap()
            .send_keys("browser test: stop")
            .await
            .unwrap();
        shot(c, "halt-confirm").await;
        // The POST answers with a redirect back to the rollout page.
        click_to(c, "#confirm-halt", &format!("/rollouts/{job}")).await;
        until(c, "the job to show halted", Duration::from_secs(60), async |c| {
            live_text(c, "#job-state").await == "halted"
        })
        .await;
        assert!(live_text(c, "#halt-reason").await.contains("browser test: stop"));
        assert_eq!(stack.job_state(), "halted");
        // The step and the node that were in flight say they stopped, not that they run.
        let grid = live_text(c, "#live").await;
        assert!(!grid.contains("running"), "a halted job shows nothing running:\n{grid}");
        assert!(grid.contains("stopped at"), "the in-flight node says where it stopped:\n{grid}");
        let halted = c
            .find_all(Locator::Css(r#"#live svg.grid g.node[data-state="halted"]"#))
            .await
            .unwrap();
        assert!(!halted.is_empty(), "the node in flight is drawn halted");
        // Issue #52 item 8: the steps it never reached are not "pending"; the waves chart
        // names each hop's target; the page says nothing continued it yet.
        let badges = c
            .execute(
                "return Array.from(document.querySelectorAll('#live section.step h3 span.badge')).map(e => e.textContent)",
                vec![],
            )
            .await
            .unwrap();
        let badges: Vec<String> = serde_json::from_value(badges).unwrap();
        assert!(!badges.iter().any(|b| b == "pending"), "{badges:?}");
        assert!(badges.iter().any(|b| b == "not reached"), "{badges:?}");
        let wave = live_text(c, "#live svg.timeline g.wave text").await;
        assert!(wave.contains(" → v") && wave.contains(" wave 1"), "{wave}");
        assert!(
            live_text(c, "#continued-by").await.contains("no job yet"),
            "{}",
            live_text(c, "#continued-by").await
        );
        shot(c, "rollout-halted").await;

        // The overview says so at a glance, with the reason; so does the Rollouts page.
        c.goto(&format!("{}/", stack.ui)).await.unwrap();
        let card = text_of(c, &format!(r#"#jobs div.job.halted[data-job="{job}"]"#)).await;
        assert!(card.contains("browser test: stop"), "{card}");
        shot(c, "overview-halted").await;
        c.goto(&format!("{}/rollouts", stack.ui)).await.unwrap();
        let row = text_of(c, &format!(r#"#rollouts tr[data-job="{job}"]"#)).await;
        assert!(row.contains("halted") && row.contains("browser test: stop"), "{row}");
        shot(c, "rollouts-halted").await;
    })
    .await;
}

/// GET `url` over HTTPS trusting only `ca`; (status, location, CSP).
async fn https_get(ca: &Path, url: &str) -> (u16, String, String) {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .build();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, http_body_util::Empty<hyper::body::Bytes>>(https);
    let r = client.get(url.parse().unwrap()).await.unwrap();
    let h = |n: &str| {
        r.headers()
            .get(n)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    };
    (
        r.status().as_u16(),
        h("location"),
        h("content-security-policy"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn medea_demo_ui_prints_the_url_serves_over_https_and_stops_on_ctrl_c() {
    use std::io::BufRead as _;
    let mut demo = Kill(
        crate::cli::medea()
            .args(["demo", "--ui"])
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut lines = std::io::BufReader::new(demo.0.stdout.take().unwrap()).lines();
    let mut url = None;
    let mut ca = None;
    for l in lines.by_ref() {
        let l = l.unwrap();
        if let Some(rest) = l.strip_prefix("▶ web dashboard: ") {
            let (u, rest) = rest.split_once(' ').unwrap();
            url = Some(u.to_string());
            let trust = rest.split("(trust ").nth(1).unwrap();
            ca = Some(PathBuf::from(trust.split(' ').next().unwrap()));
        }
        if l.contains("stays up") {
            break;
        }
    }
    let url = url.expect("the demo prints the dashboard's URL");
    let ca = ca.expect("and the CA to trust");
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let (status, _, csp) = https_get(&ca, &format!("{url}login")).await;
    assert_eq!(status, 200);
    assert!(csp.contains("default-src 'none'"), "{csp}");
    let (status, location, _) = https_get(&ca, &url).await;
    assert_eq!((status, location.as_str()), (303, "/login"));
    // Ctrl-C ends it cleanly.
    let pid = demo.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = demo.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the demo did not stop on Ctrl-C");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "{status:?}");
}
