//! Blocking hooks in the desired state (issue #35 item 2): validation with located
//! diagnostics, and the example in `examples/hooks/`. The plan's side (rendering, settings
//! changes, the bar) is pinned by `plan::tests::hooks_are_in_the_plan_and_a_change_to_them_needs_the_highest_bar_in_force`;
//! the rollout's by `rollout_hooks`.

use std::path::{Path, PathBuf};

use medea::desired::hooks::{HookAction, HookPoint};
use medea::desired::{self, Source, diagnostic::codes};

fn write(dir: &Path, rel: &str, text: &str) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

const CLUSTER: &str = "apiVersion: medea/v1alpha1
kind: Cluster
metadata:
  name: c1
spec:
  kubernetes:
    version: v1.35.0
";

fn pool(name: &str, machines: &str, extra: &str) -> String {
    format!(
        "apiVersion: medea/v1alpha1\nkind: NodePool\nmetadata:\n  name: {name}\nspec:\n  cluster: c1\n  role: worker\n  machines: [{machines}]\n  talos:\n    version: v1.13.9\n{extra}"
    )
}

fn load(dir: &Path) -> desired::Loaded {
    desired::load(&Source::Dir(dir.to_path_buf())).unwrap()
}

#[test]
fn hook_errors_are_located() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let cluster = format!(
        "{CLUSTER}{}",
        r#"  hooks:
    beforeJob:
      - name: Bad_Name
        timeout: 1m
        http: { url: "https://hooks.example/x" }
      - name: twice
        timeout: 1m
        http: { url: "https://hooks.example/x" }
      - name: twice
        timeout: 1m
        http: { url: "https://hooks.example/x" }
      - name: both
        timeout: 1m
        http: { url: "https://hooks.example/x" }
        job: { podSpec: { containers: [{ name: a, image: busybox }] } }
      - name: none
        timeout: 1m
      - name: slow
        timeout: 25h
        http: { url: "https://hooks.example/x" }
      - name: soon
        timeout: 10 minutes
        http: { url: "https://hooks.example/x" }
    afterJob:
      - name: path
        timeout: 1m
        http: { url: "hooks.example/x", credential: /etc/medea/token }
      - name: clear
        timeout: 1m
        http: { url: "http://hooks.example/x", credential: ops }
      - name: empty
        timeout: 1m
        job: { namespace: Rook_Ceph, podSpec: { restartPolicy: Always, containers: [] } }
      - name: env
        timeout: 1m
        job:
          podSpec:
            containers:
              - name: c
                env: [{ name: MEDEA_NODE, value: x }]
"#
    );
    write(d, "c.yaml", &cluster);
    write(
        d,
        "p.yaml",
        &pool(
            "p1",
            "w-1",
            "  hooks:\n    beforeNode:\n      - name: noout\n        timeout: 1m\n        retries: 3\n        http: { url: \"https://x\" }\n",
        ),
    );
    let loaded = load(d);
    let got: Vec<(String, usize, &str, &str)> = loaded
        .diagnostics
        .iter()
        .map(|x| {
            (
                x.origin.file.clone(),
                x.origin.line,
                x.code,
                x.message.as_str(),
            )
        })
        .collect();
    let has = |file: &str, line: usize, code: &str, needle: &str| {
        assert!(
            got.iter()
                .any(|(f, l, c, m)| f == file && *l == line && *c == code && m.contains(needle)),
            "no {code} at {file}:{line} containing {needle:?} in {got:#?}"
        );
    };
    has(
        "c.yaml",
        10,
        codes::HOOKS,
        "`Bad_Name` is not a valid hook name",
    );
    has("c.yaml", 16, codes::HOOKS, "hook `twice` is defined twice");
    has(
        "c.yaml",
        22,
        codes::HOOKS,
        "hook `both` has both `http` and `job`",
    );
    has("c.yaml", 23, codes::HOOKS, "hook `none` has no kind");
    has(
        "c.yaml",
        26,
        codes::HOOKS,
        "hook `slow`: `timeout` `25h` is longer than 24h",
    );
    has("c.yaml", 29, codes::DURATION, "hook `soon`: `timeout`");
    has(
        "c.yaml",
        34,
        codes::HOOKS,
        "`http.url` `hooks.example/x` is not an http:// or https:// URL",
    );
    has(
        "c.yaml",
        34,
        codes::HOOKS,
        "`http.credential` `/etc/medea/token` is not a credential name",
    );
    has(
        "c.yaml",
        37,
        codes::HOOKS,
        "the token would cross the network in clear",
    );
    has(
        "c.yaml",
        40,
        codes::HOOKS,
        "`job.namespace` `Rook_Ceph` is not a namespace name",
    );
    has(
        "c.yaml",
        40,
        codes::HOOKS,
        "sets `restartPolicy: \"Always\"`",
    );
    has("c.yaml", 40, codes::HOOKS, "has an empty `containers` list");
    has("c.yaml", 45, codes::HOOKS, "container 1 has no `image`");
    has(
        "c.yaml",
        45,
        codes::HOOKS,
        "container 1 sets `MEDEA_NODE`, which medea sets",
    );
    has("p.yaml", 15, codes::UNKNOWN_FIELD, "retries");
    assert!(loaded.valid().is_none());
    // every diagnostic helps
    for d in loaded.diagnostics.iter().filter(|d| d.code == codes::HOOKS) {
        assert!(d.help.is_some(), "{d:?}");
    }
}

#[test]
fn the_hooks_example_validates() {
    // kept as `.yaml.example` so that `examples/` (the demo's state) is unchanged
    let example =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/hooks/ceph-noout.yaml.example");
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "ceph-noout.yaml",
        &std::fs::read_to_string(example).unwrap(),
    );
    let loaded = load(tmp.path());
    let errors: Vec<String> = loaded.errors().map(|d| d.to_string()).collect();
    assert!(errors.is_empty(), "{errors:#?}");
    let desired = loaded.valid().unwrap();
    let cluster = desired.clusters.values().next().unwrap();
    let pool = cluster
        .pools
        .values()
        .find(|p| !p.hooks.is_empty())
        .expect("a pool with hooks");
    let before = pool.hooks.at(HookPoint::BeforeNode);
    let after = pool.hooks.at(HookPoint::AfterNode);
    assert_eq!(before.len(), 1);
    assert_eq!(after.len(), 1);
    for (h, verb) in [(&before[0], "set"), (&after[0], "unset")] {
        let HookAction::Job {
            namespace,
            pod_spec,
            ttl_seconds_after_finished,
        } = &h.action
        else {
            panic!("{h:?}")
        };
        assert_eq!(namespace, "rook-ceph");
        // issue #51 item 5: finished hook Jobs are deleted after a day unless the hook says
        assert_eq!(
            *ttl_seconds_after_finished,
            medea::desired::hooks::DEFAULT_HOOK_JOB_TTL_SECS
        );
        let text = pod_spec.to_string();
        assert!(text.contains(&format!("ceph osd {verb} noout")), "{text}");
        assert!(text.contains("rook/ceph"), "{text}");
    }
}

/// Issue #49 item 6: the server's Job-hook policy, as `medea serve` applies it to a revision it
/// loads (`server::policy_check`): each refusal (privileged, hostPID, hostNetwork, hostPath, a
/// namespace outside the list, a tag-only image, an init container's too) is an error located at
/// the hook's `podSpec` that names the field and the flag allowing it, so the revision is never
/// planned; the flag of each lifts exactly its refusal. Before, nothing was refused.
#[test]
fn the_server_hook_policy_refuses_each_dangerous_field_at_the_hook_unless_allowed() {
    use medea::desired::hook_policy::HookPolicy;
    const PINNED: &str = "docker.io/library/busybox:1.36@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    type Allow = fn(&mut HookPolicy);
    let cases: [(&str, &str, &str, &str, Allow); 7] = [
        (
            "privileged",
            "securityContext: { privileged: true }",
            "containers[0].securityContext.privileged",
            "--hook-allow-privileged",
            |p| p.allow_privileged = true,
        ),
        (
            "hostpid",
            "",
            "hostPID",
            "--hook-allow-host-namespaces",
            |p| p.allow_host_namespaces = true,
        ),
        (
            "hostnetwork",
            "",
            "hostNetwork",
            "--hook-allow-host-namespaces",
            |p| p.allow_host_namespaces = true,
        ),
        (
            "hostpath",
            "",
            "volumes[root].hostPath",
            "--hook-allow-host-path",
            |p| p.allow_host_path = true,
        ),
        (
            "namespace",
            "",
            "job.namespace",
            "--hook-namespace kube-system",
            |p| {
                p.namespaces.insert("kube-system".into());
            },
        ),
        (
            "tag",
            "",
            "containers[0].image",
            "--hook-allow-unpinned-images",
            |p| p.allow_unpinned_images = true,
        ),
        (
            "init-tag",
            "",
            "initContainers[0].image",
            "--hook-allow-unpinned-images",
            |p| p.allow_unpinned_images = true,
        ),
    ];
    for (case, security, field, flag, allow) in cases {
        let namespace = if case == "namespace" {
            "kube-system"
        } else {
            "ops"
        };
        let image = if case == "tag" {
            "busybox:1.36"
        } else {
            PINNED
        };
        let pod_extra = match case {
            "hostpid" => "            hostPID: true\n".to_string(),
            "hostnetwork" => "            hostNetwork: true\n".to_string(),
            "hostpath" => {
                "            volumes: [{ name: root, hostPath: { path: / } }]\n".to_string()
            }
            "init-tag" => {
                "            initContainers: [{ name: init, image: busybox }]\n".to_string()
            }
            _ => String::new(),
        };
        let hooks = format!(
            "  hooks:\n    beforeNode:\n      - name: probe\n        timeout: 5m\n        job:\n          namespace: {namespace}\n          podSpec:\n{pod_extra}            containers:\n              - name: main\n                image: \"{image}\"\n                {}\n",
            if security.is_empty() {
                "command: [true]".to_string()
            } else {
                security.to_string()
            }
        );
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), "c.yaml", CLUSTER);
        write(tmp.path(), "p.yaml", &pool("w", "w-1", &hooks));
        let loaded = load(tmp.path());
        assert!(
            loaded.valid().is_some(),
            "{case}: the files alone are valid"
        );
        // the podSpec's line: the first line after `podSpec:`
        let pod_line = pool("w", "w-1", &hooks)
            .lines()
            .position(|l| l.trim() == "podSpec:")
            .unwrap()
            + 2;
        let mut policy = HookPolicy {
            namespaces: ["ops".to_string()].into(),
            ..HookPolicy::default()
        };
        let mut refused = loaded.clone();
        medea::server::policy_check(&policy, &mut refused);
        let errors: Vec<&desired::Diagnostic> = refused.errors().collect();
        assert_eq!(errors.len(), 1, "{case}: {errors:#?}");
        let d = errors[0];
        assert_eq!(d.code, codes::HOOK_POLICY, "{case}");
        assert_eq!(
            (d.origin.file.as_str(), d.origin.line),
            ("p.yaml", pod_line),
            "{case}: {d}"
        );
        for part in [
            "NodePool `w` `hooks.beforeNode` hook `probe`",
            field,
            "this server's hook policy refuses",
        ] {
            assert!(d.message.contains(part), "{case}: {part} in {}", d.message);
        }
        let help = d.help.as_deref().unwrap_or_default();
        assert!(
            help.contains(&format!("medea serve {flag}")),
            "{case}: {help}"
        );
        assert!(refused.valid().is_none(), "{case}: never planned");
        // the server that allows it plans it
        allow(&mut policy);
        let mut allowed = loaded.clone();
        medea::server::policy_check(&policy, &mut allowed);
        assert!(
            allowed.errors().next().is_none(),
            "{case}: {:#?}",
            allowed.errors().collect::<Vec<_>>()
        );
    }
}

/// The example passes the policy of a server started with `--hook-namespace rook-ceph` (its
/// images are pinned by digest, issue #49) and nothing else; the default policy refuses it
/// for its namespace only.
#[test]
fn the_hooks_example_passes_a_policy_naming_its_namespace() {
    use medea::desired::hook_policy::HookPolicy;
    let example =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/hooks/ceph-noout.yaml.example");
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "ceph-noout.yaml",
        &std::fs::read_to_string(example).unwrap(),
    );
    let loaded = load(tmp.path());
    let mut strict = loaded.clone();
    medea::server::policy_check(&HookPolicy::default(), &mut strict);
    let errors: Vec<String> = strict.errors().map(|d| d.message.clone()).collect();
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert!(
        errors.iter().all(|e| e.contains("namespace `rook-ceph`")),
        "{errors:#?}"
    );
    let mut ok = loaded.clone();
    let policy = HookPolicy {
        namespaces: ["rook-ceph".to_string()].into(),
        ..HookPolicy::default()
    };
    medea::server::policy_check(&policy, &mut ok);
    let errors: Vec<String> = ok.errors().map(|d| d.to_string()).collect();
    assert!(errors.is_empty(), "{errors:#?}");
}

/// End to end (issue #49 item 6): `medea serve` takes its Job-hook policy from its own
/// configuration (here `MEDEA_HOOK_NAMESPACES`, the environment of `--hook-namespace`), refuses
/// a revision whose hook is privileged with a located error that `medea plan` shows from the
/// server, and plans it once the hook asks for nothing the server refuses; the plan then lists
/// what the hook runs (its container, command and service account).
#[test]
fn medea_serve_refuses_a_privileged_job_hook_with_a_located_error_and_plans_a_plain_one() {
    use std::time::Duration;
    const PINNED: &str = "docker.io/library/busybox:1.36@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let hook = |security: &str| {
        format!(
            "  rollout:\n    drainTimeout: 5m\n  hooks:\n    beforeNode:\n      - name: probe\n        timeout: 5m\n        job:\n          namespace: ops\n          podSpec:\n            containers:\n              - name: main\n                image: \"{PINNED}\"\n                command: [\"sh\", \"-c\", \"echo $MEDEA_NODE\"]\n{security}"
        )
    };
    let privileged = hook("                securityContext: { privileged: true }\n");
    let s = crate::fixtures::serve::serve()
        .env("MEDEA_HOOK_NAMESPACES", "ops")
        .desired_edit(
            "home/pools.yaml",
            "  rollout:\n    drainTimeout: 5m",
            &privileged,
        )
        .start();
    let out = s.cli().arg("plan").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "diagnostics: exit 1; {stderr}");
    for part in [
        "medea::desired::hook-policy",
        "home/pools.yaml",
        "NodePool `workers` `hooks.beforeNode` hook `probe`",
        "container `main` is privileged",
        "--hook-allow-privileged",
    ] {
        assert!(stderr.contains(part), "{part} in {stderr}");
    }
    // the namespace is allowed by the server's configuration: only the privilege is refused
    assert!(!stderr.contains("job.namespace"), "{stderr}");
    // the same hook without the privilege: the server plans it and lists what it runs
    let path = s.desired.join("home/pools.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replacen(&privileged, &hook(""), 1)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let plan = loop {
        let out = s.cli().arg("plan").output().unwrap();
        let plan = String::from_utf8_lossy(&out.stdout).into_owned();
        // (a plan with changes exits 2; the diagnostics' exit is 1)
        if out.status.code() == Some(2) && plan.contains("hook beforeNode: probe") {
            break plan;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no plan with the hook: {plan}{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            s.serve_log()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    for line in [
        "hook beforeNode: probe (job in namespace ops; timeout 5m)",
        &format!("container main: {PINNED} command [\"sh\",\"-c\",\"echo $MEDEA_NODE\"]"),
        "pod: service account default",
    ] {
        assert!(plan.contains(line), "{line} in {plan}");
    }
}

/// Issue #51 item 5: a Job hook's `ttlSecondsAfterFinished` reaches the hook (and the plan's
/// hook line, so a change is a settings change); under a minute is refused where it is written.
#[test]
fn a_job_hooks_ttl_after_finished_is_checked_and_shown() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let hooks = |ttl: u64| {
        format!(
            "{CLUSTER}  hooks:\n    beforeJob:\n      - name: noout\n        timeout: 5m\n        job:\n          namespace: rook-ceph\n          ttlSecondsAfterFinished: {ttl}\n          podSpec: {{ containers: [ {{ name: ceph, image: rook/ceph }} ] }}\n"
        )
    };
    write(d, "c.yaml", &hooks(600));
    write(d, "p.yaml", &pool("p1", "w-1", ""));
    let loaded = load(d);
    assert!(!loaded.has_errors(), "{:#?}", loaded.diagnostics);
    let c = &loaded.valid().unwrap().clusters["c1"];
    let h = &c.hooks.at(HookPoint::BeforeJob)[0];
    assert!(
        matches!(
            &h.action,
            HookAction::Job {
                ttl_seconds_after_finished: 600,
                ..
            }
        ),
        "{h:?}"
    );
    assert!(
        h.summary().contains("deleted 10m after it finished"),
        "{}",
        h.summary()
    );
    write(d, "c.yaml", &hooks(5));
    let loaded = load(d);
    assert!(
        loaded.diagnostics.iter().any(|x| x.origin.file == "c.yaml"
            && x.origin.line == 14
            && x.code == codes::HOOKS
            && x.message
                .contains("`job.ttlSecondsAfterFinished` is 5, less than 60")),
        "{:#?}",
        loaded.diagnostics
    );
    assert!(loaded.valid().is_none());
}
