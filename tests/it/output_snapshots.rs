//! Snapshots of what users read: every command's output, byte for byte, through the real
//! binary against a fixed store, a fixed inventory or an in-process server.
//!
//! Update after an intended change with
//! `EXPECTORATE=overwrite cargo test --all-features --test it output_snapshots` and review the
//! diff (`git diff tests/it/snapshots/`) like code. The snapshots of `medea plan` for the
//! examples live in `plan.rs`, the broken-directory diagnostics in `desired.rs` and the
//! non-TTY rollout lines in `cli.rs`.
//!
//! Only what genuinely differs between runs is replaced, by [`Normalise`]: temporary
//! directories and the checkout's path, loopback ports, the git commit the binary was built
//! from, and the fingerprints of keys generated per run. A placeholder never stands in a
//! table column (it would change the column's width).
//! Everything else, ids included, is deterministic: plan ids hash the desired files and the
//! observed generations, never a path; job ids and times come from a fixed plan and clock.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use medea::inventory::{MachineRole, ObservedCluster};
use medea::rollout::fake::{FakeCluster, Fault};
use medea::store::Store;
use medea::store::fjall::FjallStore;

use crate::rollout::{FROM, KUBE, mixed_steps, specs, world_in};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The substitutions applied to an output before it is compared: each `(actual, placeholder)`
/// names one run-specific value. Nothing is removed, only renamed.
#[derive(Default)]
pub(crate) struct Normalise(Vec<(String, String)>);

impl Normalise {
    /// The checkout itself is `<repo>` (the server names its desired directory).
    pub(crate) fn new() -> Normalise {
        Normalise::default().path(&root(), "<repo>")
    }
    /// A temporary directory (its canonical spelling too) is `placeholder`.
    pub(crate) fn path(mut self, p: &Path, placeholder: &str) -> Normalise {
        if let Ok(c) = p.canonicalize() {
            self.0
                .push((c.to_string_lossy().into_owned(), placeholder.into()));
        }
        self.0
            .push((p.to_string_lossy().into_owned(), placeholder.into()));
        self
    }
    fn text(mut self, actual: &str, placeholder: &str) -> Normalise {
        self.0.push((actual.into(), placeholder.into()));
        self
    }
    fn apply(&self, text: &str) -> String {
        let mut out = text.to_string();
        // Longest first, so a path is replaced before any prefix of it.
        let mut subs: Vec<&(String, String)> = self.0.iter().collect();
        subs.sort_by_key(|(a, _)| std::cmp::Reverse(a.len()));
        for (actual, placeholder) in subs {
            out = out.replace(actual.as_str(), placeholder);
        }
        out
    }
}

/// A command run as a user sees it: the command line, the exit status, stdout and stderr.
pub(crate) fn transcript(shown: &str, out: &Output, n: &Normalise) -> String {
    n.apply(&format!(
        "$ {shown}\nexit status: {}\n--- stdout\n{}--- stderr\n{}",
        out.status
            .code()
            .map_or_else(|| "killed".to_string(), |c| c.to_string()),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    ))
}

pub(crate) fn medea() -> Command {
    let mut c = crate::cli::medea();
    c.env("NO_COLOR", "1")
        .env_remove("MEDEA_STORE")
        .env_remove("MEDEA_DESIRED")
        .env_remove("RUST_LOG");
    c
}

pub(crate) fn run(mut c: Command) -> Output {
    c.output().expect("the medea binary runs")
}

#[test]
fn validate_of_a_clean_directory() {
    let out = run({
        let mut c = medea();
        c.args(["validate", "examples/"]).current_dir(root());
        c
    });
    assert_eq!(out.status.code(), Some(0));
    expectorate::assert_contents(
        "tests/it/snapshots/validate-clean.txt",
        &transcript("medea validate examples/", &out, &Normalise::new()),
    );
}

/// Issue #52 item 5: an unknown field no longer hides the other errors of its document
/// (`spec: {colour: blue, kubernetes: {version: banana}}` reported only `colour`).
#[test]
fn validate_reports_an_unknown_field_and_the_other_errors_of_its_document() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    crate::fixtures::copy_dir(&root().join("examples"), d);
    let p = d.join("home/cluster.yaml");
    let s = std::fs::read_to_string(&p).unwrap();
    let from = "spec:\n  kubernetes:\n";
    assert!(s.contains(from), "home/cluster.yaml lacks {from:?}");
    let s = s
        .replacen(from, "spec:\n  colour: blue\n  kubernetes:\n", 1)
        .replacen("version: v1.35.8", "version: banana", 1);
    std::fs::write(&p, s).unwrap();
    let out = run({
        let mut c = medea();
        c.args(["validate", "."]).current_dir(d);
        c
    });
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown field `colour`"), "{stderr}");
    assert!(
        stderr.contains("`banana`"),
        "the version error is reported too: {stderr}"
    );
    expectorate::assert_contents(
        "tests/it/snapshots/validate-unknown-and-more.txt",
        &transcript("medea validate .", &out, &Normalise::new().path(d, "<dir>")),
    );
}

/// Semantic errors and warnings of one directory (the parse errors are in
/// `validate-broken.txt`).
#[test]
fn validate_of_a_directory_with_semantic_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    crate::fixtures::copy_dir(&root().join("examples"), d);
    let edit = |rel: &str, from: &str, to: &str| {
        let p = d.join(rel);
        let s = std::fs::read_to_string(&p).unwrap();
        assert!(s.contains(from), "{rel} lacks {from:?}");
        std::fs::write(&p, s.replacen(from, to, 1)).unwrap();
    };
    // A machine in two pools; a duplicate pool name; a drain timeout that is not a duration.
    edit(
        "home/pools.yaml",
        "machines: [w-1, w-2, w-3]",
        "machines: [w-1, w-2, w-3, cp-1]",
    );
    edit("prod/pools.yaml", "name: canary", "name: controlplane");
    edit(
        "prod/cluster.yaml",
        "healthTimeout: 15m",
        "healthTimeout: soon",
    );
    let out = run({
        let mut c = medea();
        c.args(["validate", "."]).current_dir(d);
        c
    });
    assert_eq!(out.status.code(), Some(1));
    expectorate::assert_contents(
        "tests/it/snapshots/validate-semantic-errors.txt",
        &transcript("medea validate .", &out, &Normalise::new().path(d, "<dir>")),
    );
}

/// The inventory of `examples/home` with every kind of plan note: a machine in no pool, a
/// NotReady one, one whose kubelet is unknown; a pool that selects nothing; and a pool whose
/// `drain.skipPods` the legacy upgrade of its Talos < 1.13 machines ignores.
fn notes_fixture(d: &Path) {
    std::fs::create_dir_all(d.join("desired/home")).unwrap();
    for f in ["cluster.yaml", "pools.yaml"] {
        std::fs::copy(
            root().join("examples/home").join(f),
            d.join("desired/home").join(f),
        )
        .unwrap();
    }
    let pools = d.join("desired/home/pools.yaml");
    let mut text = std::fs::read_to_string(&pools).unwrap();
    let workers_rollout = "  rollout:\n    drainTimeout: 5m\n";
    assert!(text.ends_with(workers_rollout), "{text}");
    text.push_str(
        "  drain:\n    skipPods:\n      matchLabels:\n        app.kubernetes.io/name: local-path-provisioner\n",
    );
    text.push_str(
        "---\napiVersion: medea/v1alpha1\nkind: NodePool\nmetadata:\n  name: gpu\nspec:\n  cluster: home\n  role: worker\n  selector:\n    matchLabels:\n      node.medea.dev/pool: gpu\n  talos:\n    version: v1.13.9\n",
    );
    std::fs::write(&pools, text).unwrap();
    let m = |node: &str, host: u8, role: &str, extra: &str| {
        format!(
            "      - {{ node: {node}, id: home-{node}, address: 10.0.1.{host}, role: {role}, talosVersion: v1.12.4, installerImage: \"ghcr.io/siderolabs/installer:v1.12.4\"{extra} }}\n"
        )
    };
    let k = ", kubeletVersion: v1.34.1";
    let inventory = format!(
        "clusters:\n  - name: home\n    kubernetesVersion: v1.34.1\n    generation: 4\n    machines:\n{}{}{}{}{}{}{}",
        m("cp-1", 11, "controlplane", k),
        m("cp-2", 12, "controlplane", k),
        m("cp-3", 13, "controlplane", k),
        m("w-1", 21, "worker", k),
        m("w-2", 22, "worker", &format!("{k}, ready: false")),
        m("w-3", 23, "worker", ""),
        m("spare-1", 31, "worker", k),
    );
    std::fs::write(d.join("inventory.yaml"), inventory).unwrap();
}

#[test]
fn plan_notes_text_and_json() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    notes_fixture(d);
    let n = Normalise::new().path(d, "<dir>");
    for (format, file) in [
        ("text", "tests/it/snapshots/plan-notes.txt"),
        ("json", "tests/it/snapshots/plan-notes.json"),
    ] {
        let out = run({
            let mut c = medea();
            c.args([
                "plan",
                "-o",
                format,
                "--observed",
                "inventory.yaml",
                "desired",
            ])
            .current_dir(d);
            c
        });
        assert_eq!(
            out.status.code(),
            Some(2),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("spare-1"), "{stdout}");
        expectorate::assert_contents(
            file,
            &transcript(
                &format!("medea plan -o {format} --observed inventory.yaml desired"),
                &out,
                &n,
            ),
        );
    }
}

/// Issue #49 item 6: a plan listing Job hooks shows, under each, everything its pod runs and
/// may reach (init containers and containers with command and args, privileges, capabilities,
/// Secret env and mounts; the pod's service account, host namespaces, hostPath, Secret and
/// token volumes, node placement), in the text and in the JSON's `jobHooks[]`. Offline
/// `medea plan` applies no server policy, so the dangerous fields reach the plan here.
#[test]
fn plan_with_job_hooks_text_and_json() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    std::fs::create_dir_all(d.join("desired/home")).unwrap();
    for f in ["cluster.yaml", "pools.yaml"] {
        std::fs::copy(
            root().join("examples/home").join(f),
            d.join("desired/home").join(f),
        )
        .unwrap();
    }
    let pools = d.join("desired/home/pools.yaml");
    let mut text = std::fs::read_to_string(&pools).unwrap();
    text.push_str(concat!(
        "  hooks:\n",
        "    beforeNode:\n",
        "      - name: probe\n",
        "        timeout: 5m\n",
        "        job:\n",
        "          namespace: kube-system\n",
        "          podSpec:\n",
        "            serviceAccountName: admin\n",
        "            hostPID: true\n",
        "            hostNetwork: true\n",
        "            hostIPC: true\n",
        "            nodeName: cp-1\n",
        "            nodeSelector: { kubernetes.io/os: linux }\n",
        "            affinity: { nodeAffinity: {} }\n",
        "            tolerations: [{ operator: Exists }]\n",
        "            securityContext: { runAsUser: 0 }\n",
        "            initContainers:\n",
        "              - name: setup\n",
        "                image: evil.example/setup:latest\n",
        "                command: [sh, -c]\n",
        "                args: [\"nsenter -t 1 -m -- true\"]\n",
        "                securityContext: { privileged: true, allowPrivilegeEscalation: true, capabilities: { add: [SYS_ADMIN] } }\n",
        "            containers:\n",
        "              - name: main\n",
        "                image: busybox:1.36\n",
        "                env: [{ name: PASSWORD, valueFrom: { secretKeyRef: { name: db, key: password } } }]\n",
        "                envFrom: [{ secretRef: { name: talos-secrets } }]\n",
        "                volumeMounts: [{ name: root, mountPath: /host }, { name: token, mountPath: /var/run/token }]\n",
        "            volumes:\n",
        "              - { name: root, hostPath: { path: / } }\n",
        "              - { name: keys, secret: { secretName: etcd-keys } }\n",
        "              - { name: token, projected: { sources: [{ serviceAccountToken: { audience: vault, expirationSeconds: 600 } }] } }\n",
    ));
    std::fs::write(&pools, text).unwrap();
    // the control plane on its target; the workers one hop away, so their hooks run
    let m = |node: &str, host: u8, role: &str, talos: &str| {
        format!(
            "      - {{ node: {node}, id: home-{node}, address: 10.0.1.{host}, role: {role}, talosVersion: {talos}, kubeletVersion: v1.35.8, installerImage: \"ghcr.io/siderolabs/installer:{talos}\" }}\n"
        )
    };
    let inventory = format!(
        "clusters:\n  - name: home\n    kubernetesVersion: v1.35.8\n    generation: 4\n    machines:\n{}{}{}{}{}{}",
        m("cp-1", 11, "controlplane", "v1.14.6"),
        m("cp-2", 12, "controlplane", "v1.14.6"),
        m("cp-3", 13, "controlplane", "v1.14.6"),
        m("w-1", 21, "worker", "v1.13.10"),
        m("w-2", 22, "worker", "v1.13.10"),
        m("w-3", 23, "worker", "v1.13.10"),
    );
    std::fs::write(d.join("inventory.yaml"), inventory).unwrap();
    let n = Normalise::new().path(d, "<dir>");
    for (format, file) in [
        ("text", "tests/it/snapshots/plan-hooks.txt"),
        ("json", "tests/it/snapshots/plan-hooks.json"),
    ] {
        let out = run({
            let mut c = medea();
            c.args([
                "plan",
                "-o",
                format,
                "--observed",
                "inventory.yaml",
                "desired",
            ])
            .current_dir(d);
            c
        });
        assert_eq!(
            out.status.code(),
            Some(2),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let parts: &[&str] = if format == "text" {
            &[
                "init setup: evil.example/setup:latest",
                "privileged",
                "hostPID",
                "hostPath",
                "service account admin",
                "nodeName",
                "talos-secrets",
            ]
        } else {
            &[
                "\"jobHooks\"",
                "\"privileged\": true",
                "\"hostPID\": true",
                "\"serviceAccount\": \"admin\"",
                "\"nodeName\": \"cp-1\"",
                "\"envFromSecrets\"",
            ]
        };
        for part in parts {
            assert!(stdout.contains(part), "{part} in {stdout}");
        }
        expectorate::assert_contents(
            file,
            &transcript(
                &format!("medea plan -o {format} --observed inventory.yaml desired"),
                &out,
                &n,
            ),
        );
    }
}

/// `medea get …` against a server over the examples and a fixed inventory of `home`.
#[test]
fn get_clusters_nodepools_machines_and_server_text_and_json() {
    let mut home = crate::server::home_inventory();
    // One of each column state: cordoned, NotReady, unreachable.
    let m = home.machines.get_mut("w-1").unwrap();
    m.cordoned = true;
    home.machines.get_mut("w-2").unwrap().ready = false;
    home.machines.get_mut("w-3").unwrap().reachable = false;
    let s = crate::server::start(root().join("examples"), vec![home]);
    let info = run({
        let mut c = s.cli();
        c.args(["get", "server", "-o", "json"]);
        c
    });
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    let sha = info["gitSha"].as_str().unwrap_or_default();
    assert!(!sha.is_empty(), "{info}");
    let n = Normalise::new()
        .text(&s.addr.to_string(), "<addr>")
        .path(s.state.path(), "<state>")
        .text(&format!("\"{sha}\""), "\"<git sha>\"");
    let mut all = String::new();
    for args in [
        &["get", "clusters"][..],
        &["get", "clusters", "-o", "json"],
        &["get", "nodepools"],
        &["get", "nodepools", "--cluster", "home", "-o", "json"],
        &["get", "machines"],
        &["get", "machines", "--cluster", "home", "-o", "json"],
        &["get", "server"],
        &["get", "server", "-o", "json"],
    ] {
        let mut c = s.cli();
        c.env("NO_COLOR", "1").args(args);
        let out = run(c);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        all.push_str(&transcript(&format!("medea {}", args.join(" ")), &out, &n));
        all.push('\n');
    }
    expectorate::assert_contents("tests/it/snapshots/get.txt", &all);
}

/// kubectl's habits on `medea get` and `rollout status`: one object by name (singular
/// aliases), filters, `-o wide`; an unknown cluster, pool, machine or job is an error (exit 1)
/// naming what is known, never an empty table with exit 0.
#[test]
fn get_by_name_filters_wide_and_unknown_names_are_errors() {
    let s = crate::server::start(
        root().join("examples"),
        vec![crate::server::home_inventory()],
    );
    let n = Normalise::new()
        .text(&s.addr.to_string(), "<addr>")
        .path(s.state.path(), "<state>");
    let mut all = String::new();
    for (args, code) in [
        (&["get", "machine", "cp-1"][..], 0),
        (&["get", "machines", "--pool", "workers", "-o", "wide"], 0),
        (&["get", "cluster", "home"], 0),
        (&["get", "nodepool", "workers", "--cluster", "home"], 0),
        (&["get", "machines", "--cluster", "nope"], 1),
        (&["get", "nodepools", "--cluster", "nope"], 1),
        (&["get", "machine", "nope"], 1),
        (&["get", "machines", "--pool", "nope"], 1),
        (&["get", "cluster", "nope"], 1),
        (&["rollout", "list", "--cluster", "nope"], 1),
        (&["rollout", "status", "--cluster", "nope"], 1),
        (&["rollout", "status"], 1),
        (&["rollout", "status", "0123456789ab-home"], 1),
    ] {
        let mut c = s.cli();
        c.env("NO_COLOR", "1").args(args);
        let out = run(c);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        all.push_str(&transcript(&format!("medea {}", args.join(" ")), &out, &n));
        all.push('\n');
    }
    expectorate::assert_contents("tests/it/snapshots/get-names.txt", &all);
}

/// How far the one job of the fake `prod` cluster got.
enum JobRun {
    /// Created, not yet started.
    NotStarted,
    /// Run to its end: succeeded, or halted by the fault.
    ToTheEnd(Option<Fault>),
}

/// A state directory whose store holds one job of the fake `prod` cluster.
fn job_state_dir(how: JobRun) -> tempfile::TempDir {
    let state = tempfile::tempdir().unwrap();
    {
        let store: std::sync::Arc<dyn Store> =
            std::sync::Arc::new(FjallStore::open(&state.path().join("store")).unwrap());
        let mut fake = FakeCluster::new(&specs(3, 3, FROM, KUBE));
        let fault = match how {
            JobRun::NotStarted => None,
            JobRun::ToTheEnd(ref f) => Some(f.clone()),
        };
        if let Some(Some(f)) = fault.clone() {
            fake = fake.with_fault(f);
        }
        let w = world_in(fake, store, mixed_steps, &[]);
        if let Some(fault) = fault {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .unwrap();
            let out = rt.block_on(w.executor().run(&w.job)).unwrap();
            if fault.is_some() {
                assert!(
                    matches!(out, medea::rollout::RunOutcome::Halted { .. }),
                    "{out:?}"
                );
            } else {
                assert!(
                    matches!(out, medea::rollout::RunOutcome::Succeeded),
                    "{out:?}"
                );
            }
        }
    }
    state
}

#[test]
fn rollout_status_of_a_running_a_succeeded_and_a_halted_job_text_and_json() {
    let mut all = String::new();
    // A finished job's end is the run's (issue #36 added it to the status).
    let ended = regex::Regex::new(r#""endedAt": "[^"]+""#).unwrap();
    // and so is the job's clock at its end (issue #51), counted up to it
    let active = regex::Regex::new(r#""activeSeconds": [1-9][0-9]*"#).unwrap();
    for (what, how) in [
        ("a job created and not yet started", JobRun::NotStarted),
        ("a job that succeeded", JobRun::ToTheEnd(None)),
        (
            "a job halted by a failed upgrade of w-1",
            JobRun::ToTheEnd(Some(Fault::UpgradeExitCode {
                node: "w-1".into(),
                code: 1,
            })),
        ),
    ] {
        let not_started = matches!(how, JobRun::NotStarted);
        let state = job_state_dir(how);
        let s = crate::server::start_in(state, root().join("examples"), vec![], None, false);
        let n = Normalise::new()
            .text(&s.addr.to_string(), "<addr>")
            .path(s.state.path(), "<state>");
        all.push_str(&format!("# {what}\n"));
        for args in [
            &["rollout", "status", "--cluster", "prod"][..],
            &[
                "rollout",
                "status",
                "--cluster",
                "prod",
                "--pool",
                "workers",
            ],
            &["rollout", "status", "--cluster", "prod", "-o", "json"],
            &["rollout", "list"],
            // The job by its id, with no --cluster.
            &["rollout", "status", &job_id(&s)],
            // Following a finished job replays its journal, then says how it ended.
            &["rollout", "status", &job_id(&s), "-w"],
        ] {
            if args.last() == Some(&"-w") && not_started {
                continue;
            }
            let mut c = s.cli();
            c.env("NO_COLOR", "1").env("TZ", "UTC").args(args);
            let out = run(c);
            let text = transcript(&format!("medea {}", args.join(" ")), &out, &n);
            // Journal times are the run's; the replayed lines are what is compared.
            let times = regex::Regex::new(r"(?m)^\d\d:\d\d:\d\d ").unwrap();
            let text = times.replace_all(&text, "<hh:mm:ss> ");
            let text = ended.replace_all(&text, r#""endedAt": "<time>""#);
            all.push_str(&active.replace_all(&text, r#""activeSeconds": <seconds>"#));
            all.push('\n');
        }
    }
    expectorate::assert_contents("tests/it/snapshots/rollout-status.txt", &all);
}

/// The id of the newest job the server lists.
fn job_id(s: &crate::server::TestServer) -> String {
    let out = run({
        let mut c = s.cli();
        c.args(["rollout", "list", "-o", "json"]);
        c
    });
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v[0]["jobId"].as_str().unwrap().to_string()
}

/// The `SHA256:…` fingerprint of the public key next to `key`, as `ssh-keygen -l` prints it.
fn fingerprint(key: &Path) -> String {
    let out = crate::fixtures::tool("ssh-keygen")
        .arg("-lf")
        .arg(key.with_extension("pub"))
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let fp = text
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_string();
    assert!(fp.starts_with("SHA256:"), "{text}");
    fp
}

/// `medea approvals` on the examples' `home` cluster: no marker yet; one valid marker and one
/// in the wrong namespace; then quorum.
#[test]
fn approvals_without_and_with_markers() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let desired = d.join("desired");
    std::fs::create_dir_all(desired.join("home")).unwrap();
    for f in ["cluster.yaml", "pools.yaml"] {
        std::fs::copy(
            root().join("examples/home").join(f),
            desired.join("home").join(f),
        )
        .unwrap();
    }
    let store_dir = d.join("store");
    {
        let s = FjallStore::open(&store_dir).unwrap();
        let c: ObservedCluster = crate::server::home_inventory();
        assert!(c.machines.values().any(|m| m.role == MachineRole::Worker));
        s.commit(medea::store::Txn::new().put_record(medea::inventory::cluster_key(&c.name), &c))
            .unwrap();
    }
    let plan = run({
        let mut c = medea();
        c.args(["plan", "-o", "json", "--desired"])
            .arg(&desired)
            .arg("--store")
            .arg(&store_dir);
        c
    });
    assert_eq!(plan.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
    let id = v["id"].as_str().unwrap().to_string();
    let short = v["shortId"].as_str().unwrap().to_string();

    // Keys are generated per run: their fingerprints are the one variable part.
    let mut n = Normalise::new().path(d, "<dir>");
    let mut signers = String::new();
    let mut keys = Vec::new();
    for who in ["alice", "bob"] {
        let (key, public) = crate::approvals_cli::keygen(d, who);
        signers.push_str(&format!("{who}@example.com {public}\n"));
        n = n.text(&fingerprint(&key), &format!("<{who}'s key fingerprint>"));
        keys.push(key);
    }
    std::fs::write(d.join("allowed_signers"), signers).unwrap();
    let approvals = || {
        let mut c = medea();
        c.args(["approvals", "--desired", "desired", "--store", "store"])
            .args(["--allowed-signers", "allowed_signers"])
            .current_dir(d);
        run(c)
    };
    let shown = "medea approvals --desired desired --store store --allowed-signers allowed_signers";
    let mut all = transcript(shown, &approvals(), &n);
    std::fs::create_dir_all(desired.join("approvals")).unwrap();
    std::fs::write(
        desired.join(format!("approvals/{short}-alice.sig")),
        crate::approvals_cli::sign(&keys[0], &format!("{id}\n"), "medea-approve"),
    )
    .unwrap();
    std::fs::write(
        desired.join("approvals/bob-git.sig"),
        crate::approvals_cli::sign(&keys[1], &format!("{id}\n"), "git"),
    )
    .unwrap();
    let out = approvals();
    assert_eq!(out.status.code(), Some(1), "one of two approvals");
    all.push('\n');
    all.push_str(&transcript(shown, &out, &n));
    std::fs::write(
        desired.join(format!("approvals/{short}-bob.sig")),
        crate::approvals_cli::sign(&keys[1], &format!("{id}\n"), "medea-approve"),
    )
    .unwrap();
    let out = approvals();
    assert_eq!(out.status.code(), Some(0), "quorum reached");
    all.push('\n');
    all.push_str(&transcript(shown, &out, &n));
    expectorate::assert_contents("tests/it/snapshots/approvals.txt", &all);
}

/// `medea demo` without `--approve` (no TTY): the simulator, the seeded store and the plan
/// the server computed, in the order a user reads them. The lines of a followed rollout are
/// pinned by `rollout_progress_no_tty.txt` (cli.rs), from fixed events: a live rollout's
/// interleaving of "waiting" lines depends on timing.
#[test]
fn demo_without_approve_prints_the_plan() {
    let out = run({
        let mut c = medea();
        c.arg("demo");
        c
    });
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The server's loopback address is the one run-specific value.
    let addr = stdout
        .lines()
        .find_map(|l| l.strip_prefix("▶ medea serve is listening on "))
        .and_then(|l| l.split_whitespace().next())
        .expect("the listening line")
        .to_string();
    expectorate::assert_contents(
        "tests/it/snapshots/demo-plan.txt",
        &transcript("medea demo", &out, &Normalise::new().text(&addr, "<addr>")),
    );
}

/// #39 item 2: a syntax error of each class, shown where the parser found it (file, line and
/// column, the caret on the byte), and every broken file of a directory in one run.
#[test]
fn validate_shows_each_class_of_syntax_error_where_it_is() {
    let head = "apiVersion: medea/v1alpha1\nkind: Cluster\n";
    let cases = [
        (
            "unclosed-quote",
            "metadata:\n  name: \"home\nspec:\n  kubernetes:\n    version: v1.35.0\n",
        ),
        (
            "unclosed-flow-collection",
            "metadata: {name: home\nspec:\n  kubernetes:\n    version: v1.35.0\n",
        ),
        (
            "tab-indentation",
            "metadata:\n\tname: home\nspec:\n  kubernetes:\n    version: v1.35.0\n",
        ),
        (
            "bad-indentation",
            "metadata:\n  name: home\n spec:\n  kubernetes:\n    version: v1.35.0\n",
        ),
        (
            "duplicate-key",
            "metadata:\n  name: home\nspec:\n  kubernetes:\n    version: v1.35.0\n  kubernetes:\n    version: v1.34.0\n",
        ),
    ];
    let tmp = tempfile::tempdir().unwrap();
    let mut all = String::new();
    for (class, body) in cases {
        let dir = tmp.path().join(class);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cluster.yaml"), format!("{head}{body}")).unwrap();
        let out = run({
            let mut c = medea();
            c.args(["validate", class]).current_dir(tmp.path());
            c
        });
        assert_eq!(out.status.code(), Some(1), "{class}");
        all.push_str(&transcript(
            &format!("medea validate {class}"),
            &out,
            &Normalise::new(),
        ));
        all.push('\n');
    }
    // All of them at once: one run reports every broken file.
    let out = run({
        let mut c = medea();
        c.args(["validate", "."]).current_dir(tmp.path());
        c
    });
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stderr);
    for (class, _) in cases {
        assert!(
            text.contains(&format!("{class}/cluster.yaml:")),
            "{class} missing from one run: {text}"
        );
    }
    assert!(text.contains("5 errors"), "{text}");
    expectorate::assert_contents("tests/it/snapshots/validate-syntax.txt", &all);
}
