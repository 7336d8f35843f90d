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
        } = &h.action
        else {
            panic!("{h:?}")
        };
        assert_eq!(namespace, "rook-ceph");
        let text = pod_spec.to_string();
        assert!(text.contains(&format!("ceph osd {verb} noout")), "{text}");
        assert!(text.contains("rook/ceph"), "{text}");
    }
}
