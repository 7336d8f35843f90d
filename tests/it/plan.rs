//! `medea plan` end to end: exit codes, the stored plan and its pointer, approval writes,
//! staleness, rehearsals, and the rendered plan for `examples/` (snapshots).

use crate::fixtures::copy_dir;
use std::path::{Path, PathBuf};
use std::process::Output;

use medea::desired::{self, Source, diagnostic::codes};
use medea::inventory::{Inventory, file as inventory_file};
use medea::ops::replan as stored;
use medea::plan::{self, LastApplied};
use medea::store::fjall::FjallStore;
use medea::store::{Store, Txn};
use medea::version::{KubeVersion, TalosVersion};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fixture() -> PathBuf {
    root().join("tests/fixtures/inventory/examples.yaml")
}

fn fixture_inventory() -> Inventory {
    let text = std::fs::read_to_string(fixture()).unwrap();
    inventory_file::parse("examples.yaml", &text).unwrap()
}

fn medea(args: &[&str]) -> Output {
    crate::cli::medea()
        .args(args)
        .env_remove("MEDEA_STORE")
        .env_remove("MEDEA_DESIRED")
        .env("NO_COLOR", "1")
        .output()
        .unwrap()
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exited")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

fn edit(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "{} has no `{from}`", path.display());
    std::fs::write(path, text.replace(from, to)).unwrap();
}

/// The examples as they were before the edit the snapshot plans: every version at what the
/// fixture inventory runs, and home's workers with the default drain timeout.
fn examples_before(dir: &Path) {
    copy_dir(&root().join("examples"), dir);
    edit(
        &dir.join("home/cluster.yaml"),
        "version: v1.35.8",
        "version: v1.34.1",
    );
    edit(
        &dir.join("home/pools.yaml"),
        "version: v1.14.6",
        "version: v1.12.4",
    );
    edit(
        &dir.join("home/pools.yaml"),
        "drainTimeout: 5m",
        "drainTimeout: 10m",
    );
    edit(
        &dir.join("prod/cluster.yaml"),
        "version: v1.35.8",
        "version: v1.34.2",
    );
    edit(
        &dir.join("prod/pools.yaml"),
        "version: v1.14.6",
        "version: v1.11.5",
    );
}

fn seed(store_dir: &Path, inv: &Inventory) {
    let s = FjallStore::open(store_dir).unwrap();
    inv.save(&s).unwrap();
}

/// What the approval side does: apply the current plan's settings in one transaction.
fn approve_current(store_dir: &Path) -> plan::Plan {
    let s = FjallStore::open(store_dir).unwrap();
    let cur = stored::current(&s).unwrap().expect("a current plan");
    let p = stored::load_plan(&s, &cur.id).unwrap().expect("stored");
    s.commit(plan::stored::with_approval_writes(Txn::new(), &p))
        .unwrap();
    p
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The predicted end of a job with maintenance windows depends on when the plan is computed
/// (the next window from now): replaced by `<time>` (text and JSON).
fn redact_calendar(s: &str) -> String {
    let text = regex::Regex::new(r"expected end \S+ \(pessimistic \S+\)")
        .unwrap()
        .replace_all(s, "expected end <time> (pessimistic <time>)");
    regex::Regex::new(r#""(finish|finishPessimistic)": "[^"]+""#)
        .unwrap()
        .replace_all(&text, "\"$1\": \"<time>\"")
        .into_owned()
}

#[test]
fn plan_of_the_examples_after_an_edit_matches_the_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let (before, store) = (tmp.path().join("before"), tmp.path().join("store"));
    examples_before(&before);
    seed(&store, &fixture_inventory());

    // The first plan adopts every resource (nothing to roll: versions match the inventory).
    let first = medea(&[
        "plan",
        "--desired",
        path_str(&before),
        "--store",
        path_str(&store),
    ]);
    assert_eq!(code(&first), 2, "{}", stderr(&first));
    let out = stdout(&first);
    assert!(out.contains("+ pool workers: new resource"), "{out}");
    assert!(!out.contains("~ pool"), "no rollout yet: {out}");
    assert!(stderr(&first).contains("stored as the current plan"));
    let first_plan = approve_current(&store);
    assert_eq!(first_plan.applies.put.len(), 7);

    // Then the real examples: Talos and Kubernetes bumps, and one drain timeout.
    let args = [
        "plan",
        "--desired",
        "examples/",
        "--store",
        path_str(&store),
    ];
    let second = medea(&args);
    assert_eq!(code(&second), 2, "{}", stderr(&second));
    let text = redact_calendar(&stdout(&second));
    expectorate::assert_contents("tests/it/snapshots/plan-examples.txt", &text);
    assert!(
        text.contains("~ pool workers rollout.drainTimeout: 10m → 5m"),
        "{text}"
    );
    assert!(text.contains(&format!("Replaces: plan {}", first_plan.id.short())));

    // The same inputs again: the same plan, byte for byte, already current.
    let again = medea(&args);
    assert_eq!(code(&again), 2);
    assert_eq!(redact_calendar(&stdout(&again)), text);
    assert!(
        stderr(&again).contains("is already the current plan"),
        "{}",
        stderr(&again)
    );

    let json = medea(&[&args[..], &["-o", "json"]].concat());
    assert_eq!(code(&json), 2);
    let json_text = redact_calendar(&stdout(&json));
    expectorate::assert_contents("tests/it/snapshots/plan-examples.json", &json_text);
    let v: serde_json::Value = serde_json::from_str(&json_text).unwrap();
    assert_eq!(v["format"], "medea.plan/v1");
    assert_eq!(v["parent"], first_plan.id.to_hex());
    assert_eq!(v["summary"]["settingsChanges"], 1);
    assert_eq!(v["clusters"][1]["steps"][0]["type"], "talos");
    assert_eq!(v["clusters"][1]["steps"][0]["to"], "v1.12.12");

    // The documented example is the real output.
    for doc in [
        "design/plan.md",
        "design/plan-readme-snippet.md",
        "README.md",
    ] {
        let d = std::fs::read_to_string(root().join(doc)).unwrap();
        assert!(
            d.contains(text.trim_end()),
            "{doc} must contain tests/it/snapshots/plan-examples.txt verbatim"
        );
    }
}

#[test]
fn exit_codes_are_0_no_changes_2_changes_1_error() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    // Everything already at the examples' targets.
    let mut inv = fixture_inventory();
    for c in inv.clusters.values_mut() {
        let c = std::sync::Arc::make_mut(c);
        c.kubernetes_version = Some(KubeVersion::parse("v1.35.8").unwrap());
        for m in c.machines.values_mut() {
            m.talos_version = Some(TalosVersion::parse("v1.14.6").unwrap());
            m.kubelet_version = Some(KubeVersion::parse("v1.35.8").unwrap());
            m.ready = true;
        }
    }
    seed(&store, &inv);
    let args = ["plan", "examples/", "--store", path_str(&store)];
    let first = medea(&args);
    assert_eq!(code(&first), 2, "settings to adopt: {}", stderr(&first));
    approve_current(&store);
    let none = medea(&args);
    assert_eq!(code(&none), 0, "{}{}", stdout(&none), stderr(&none));
    assert!(stdout(&none).contains("no changes. The observed clusters match the desired state."));

    // Invalid desired state: its diagnostics, exit 1.
    let broken = tmp.path().join("broken");
    copy_dir(&root().join("examples"), &broken);
    edit(
        &broken.join("home/cluster.yaml"),
        "version: v1.35.8",
        "version: 1.35",
    );
    let o = medea(&["plan", path_str(&broken), "--store", path_str(&store)]);
    assert_eq!(code(&o), 1);
    assert!(stderr(&o).contains(codes::VERSION), "{}", stderr(&o));

    // A plan error: rendered with its snippet, exit 1, nothing stored.
    let before = {
        let s = FjallStore::open(&store).unwrap();
        stored::current(&s).unwrap()
    };
    let down = tmp.path().join("down");
    copy_dir(&root().join("examples"), &down);
    edit(
        &down.join("home/pools.yaml"),
        "version: v1.14.6",
        "version: v1.12.4",
    );
    let o = medea(&["plan", path_str(&down), "--store", path_str(&store)]);
    assert_eq!(code(&o), 1);
    let err = stderr(&o);
    assert!(err.contains("medea::plan::downgrade"), "{err}");
    assert!(
        err.contains("downgrade refused: node pool `controlplane`"),
        "{err}"
    );
    assert!(
        err.contains("home/pools.yaml:17"),
        "points at the YAML key: {err}"
    );
    assert!(err.contains("2 errors: no plan was computed"), "{err}");
    let s = FjallStore::open(&store).unwrap();
    assert_eq!(stored::current(&s).unwrap(), before, "nothing stored");
    drop(s);

    // No store and no inventory: exit 1 with the fix.
    let o = medea(&["plan", "examples/"]);
    assert_eq!(code(&o), 1);
    assert!(stderr(&o).contains("no store given"), "{}", stderr(&o));
}

#[test]
fn a_locked_store_says_to_stop_the_server() {
    let tmp = tempfile::tempdir().unwrap();
    let held = FjallStore::open(tmp.path()).unwrap();
    let o = medea(&["plan", "examples/", "--store", path_str(tmp.path())]);
    assert_eq!(code(&o), 1);
    let err = stderr(&o);
    assert!(err.contains("is locked by another medea process"), "{err}");
    assert!(err.contains("stop `medea serve`"), "{err}");
    drop(held);
}

#[test]
fn observed_files_rehearse_without_storing() {
    let tmp = tempfile::tempdir().unwrap();
    // No store at all: computed and printed, never stored.
    let o = medea(&["plan", "examples/", "--observed", path_str(&fixture())]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("not stored (no --store)"));
    assert!(
        stdout(&o).contains("~ pool controlplane: talos v1.11.5 → v1.14.6 (3 machines, 3 hops)")
    );

    // JSON inventory input, against a store with another basis: not stored either.
    let store = tmp.path().join("store");
    let mut inv = fixture_inventory();
    seed(&store, &inv);
    std::sync::Arc::make_mut(inv.clusters.get_mut("home").unwrap()).generation += 1;
    let json = tmp.path().join("inv.json");
    std::fs::write(
        &json,
        serde_json::to_string(&inventory_file::to_file(&inv)).unwrap(),
    )
    .unwrap();
    let o = medea(&[
        "plan",
        "examples/",
        "--store",
        path_str(&store),
        "--observed",
        path_str(&json),
    ]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("could never be approved"),
        "{}",
        stderr(&o)
    );
    let s = FjallStore::open(&store).unwrap();
    assert_eq!(stored::current(&s).unwrap(), None);
    drop(s);

    // A broken inventory file: exit 1 with the reason.
    let bad = tmp.path().join("bad.yaml");
    std::fs::write(&bad, "clusters:\n  - name: home\n    kubernetes: v1.34.1\n").unwrap();
    let o = medea(&["plan", "examples/", "--observed", path_str(&bad)]);
    assert_eq!(code(&o), 1);
    assert!(
        stderr(&o).contains("is not a valid inventory"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("kubernetes"), "{}", stderr(&o));
}

#[test]
fn stored_plans_chain_and_go_stale() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    seed(&store, &fixture_inventory());
    let o = medea(&["plan", "examples/", "--store", path_str(&store)]);
    assert_eq!(code(&o), 2);
    let s = FjallStore::open(&store).unwrap();
    let cur = stored::current(&s).unwrap().unwrap();
    let p = stored::load_plan(&s, &cur.id).unwrap().unwrap();
    assert_eq!(p.parent, None);
    assert_eq!(stored::all_plans(&s).unwrap().len(), 1);
    let loaded = desired::load(&Source::Dir(root().join("examples"))).unwrap();
    let d = loaded.valid().unwrap();
    assert!(!p.is_stale(&stored::current_basis(&s, d).unwrap()));
    // The basis in the store is the one compute sees.
    let recomputed = plan::compute(
        d,
        &Inventory::load(&s).unwrap(),
        &stored::load_applied(&s).unwrap(),
        None,
    )
    .unwrap();
    assert_eq!(recomputed.id, p.id);

    // An observed change (a node rebooted): the stored plan is stale.
    let mut inv = Inventory::load(&s).unwrap();
    let home = inv.clusters.get_mut("home").unwrap();
    let mut machines = home.machines.clone();
    machines.get_mut("w-1").unwrap().boot_id = Some("rebooted".into());
    *home = std::sync::Arc::new(home.observe(home.kubernetes_version.clone(), machines));
    inv.save(&s).unwrap();
    assert!(p.is_stale(&stored::current_basis(&s, d).unwrap()));
    drop(s);

    // Planning again makes a new current plan whose parent is the old one.
    let o = medea(&["plan", "examples/", "--store", path_str(&store)]);
    assert_eq!(code(&o), 2);
    let s = FjallStore::open(&store).unwrap();
    let cur2 = stored::current(&s).unwrap().unwrap();
    assert_ne!(cur2.id, cur.id);
    assert_eq!(
        stored::load_plan(&s, &cur2.id).unwrap().unwrap().parent,
        Some(cur.id)
    );
    assert_eq!(stored::all_plans(&s).unwrap().len(), 2);

    // A concurrent planner that read the old pointer cannot overwrite the new one.
    let err = s
        .commit(plan::stored::save_txn(&p, Some(&cur)))
        .unwrap_err();
    assert!(
        matches!(err, medea::store::StoreError::Conflict { .. }),
        "{err}"
    );
}

#[test]
fn git_mode_plans_the_committed_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path();
    copy_dir(&root().join("examples"), repo);
    let git = |args: &[&str]| {
        let out = crate::fixtures::tool("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
            .args([
                "-c",
                "commit.gpgsign=false",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args)
            .current_dir(repo)
            .output()
            .expect("git is installed");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    git(&["init", "-q"]);
    git(&["add", "-A"]);
    git(&["commit", "-qm", "examples"]);
    // An uncommitted downgrade is ignored in git mode.
    edit(
        &repo.join("home/pools.yaml"),
        "version: v1.14.6",
        "version: v1.10.2",
    );
    let o = medea(&[
        "plan",
        "--desired",
        path_str(repo),
        "--git-ref",
        "HEAD",
        "--observed",
        path_str(&fixture()),
        "-o",
        "json",
    ]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(v["basis"]["desired"]["commit"].as_str().unwrap().len() == 40);
    let o = medea(&[
        "plan",
        "--desired",
        path_str(repo),
        "--observed",
        path_str(&fixture()),
    ]);
    assert_eq!(code(&o), 1, "the work tree has the downgrade");
}

#[test]
fn catalog_overrides_are_validated() {
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(&root().join("examples"), tmp.path());
    edit(
        &tmp.path().join("prod/cluster.yaml"),
        "    allowDowngrade: false  # refuse plans that move a version backwards\n",
        "    allowDowngrade: false\n    talosReleases: [v1.13.10, v1.13.10, 1.14]\n    kubernetesSupport:\n      - { talos: v1.15, minKubernetes: v1.38, maxKubernetes: v1.33 }\n      - { talos: \"1.16\", minKubernetes: v1.34, maxKubernetes: v1.39 }\n",
    );
    let loaded = desired::load(&Source::Dir(tmp.path().to_path_buf())).unwrap();
    let got: Vec<(&str, String)> = loaded
        .diagnostics
        .iter()
        .map(|d| (d.code, d.message.clone()))
        .collect();
    assert_eq!(
        got,
        [
            (
                codes::DUPLICATE,
                "Talos release `v1.13.10` is listed twice".to_string()
            ),
            (
                codes::VERSION,
                "version `1.14` must start with `v` (for example `v1.13.9`)".to_string()
            ),
            (
                codes::INVALID_VALUE,
                "minKubernetes v1.38 is newer than maxKubernetes v1.33".to_string()
            ),
            (
                codes::VERSION,
                "`1.16` is not a minor line: write `vMAJOR.MINOR`, e.g. `v1.15`".to_string()
            ),
        ]
    );
}

/// Every `medea …` command that a rendered plan suggests is one the CLI accepts (a plan once
/// told users to follow a running job with `medea rollout watch`, which does not exist).
#[test]
fn every_command_a_plan_suggests_parses() {
    use clap::Parser;
    let loaded = desired::load(&Source::Dir(root().join("examples"))).unwrap();
    let d = loaded.valid().unwrap();
    let inv = fixture_inventory();
    let running: std::collections::BTreeMap<String, String> =
        [("home".to_string(), "0123456789ab-home".to_string())].into();
    let idle = plan::compute(d, &inv, &LastApplied::default(), None).unwrap();
    let applied = LastApplied::default();
    let busy_inputs = plan::PlanInputs {
        running: &running,
        ..plan::PlanInputs::new(d, &inv, &applied)
    };
    let busy = plan::compute_memo(&busy_inputs, &mut plan::compute::PlanMemo::one_off()).unwrap();
    let mut commands = Vec::new();
    for p in [&idle, &busy] {
        let text = plan::render::text(p, Default::default());
        for quoted in text.split('`').skip(1).step_by(2) {
            if quoted.starts_with("medea ") {
                commands.push(quoted.to_string());
            }
        }
    }
    assert!(
        commands.iter().any(|c| c.starts_with("medea rollout ")),
        "the rolling-out note suggests a command: {commands:?}"
    );
    for c in &commands {
        let argv: Vec<&str> = c.split_whitespace().collect();
        if let Err(e) = medea::cli::Cli::try_parse_from(&argv) {
            panic!("the plan suggests `{c}`, which the CLI refuses: {e}");
        }
    }
}

/// Offline `medea plan` plans through the daemon's one path (`plan::stored::replan`): a
/// cluster with a running job (its `Jobs/active/<cluster>` marker) gets nothing planned, and
/// the stored plan is the one the daemon would store. It used to plan without the markers.
#[test]
fn offline_plan_sees_running_jobs_like_the_daemon() {
    use medea::rollout::journal::ActiveJob;
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    seed(&store, &fixture_inventory());
    let job = medea::rollout::JobId::parse("0123456789ab-home").unwrap();
    {
        let s = FjallStore::open(&store).unwrap();
        s.commit(Txn::new().put_record("active/home", &ActiveJob { job }))
            .unwrap();
    }
    let o = medea(&["plan", "examples/", "--store", path_str(&store)]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("rollout job 0123456789ab-home is running"),
        "{out}"
    );
    assert!(out.contains("cluster home (rollout running)"), "{out}");
    let s = FjallStore::open(&store).unwrap();
    let cur = stored::current(&s).unwrap().unwrap();
    let p = stored::load_plan(&s, &cur.id).unwrap().unwrap();
    assert_eq!(
        p.basis.running.get("home").map(String::as_str),
        Some("0123456789ab-home")
    );
    let loaded = desired::load(&Source::Dir(root().join("examples"))).unwrap();
    let again = stored::replan(&s, loaded.valid().unwrap()).unwrap();
    assert!(
        !again.stored,
        "the daemon's path finds the same plan current"
    );
    assert_eq!(again.plan.id, p.id);
}
