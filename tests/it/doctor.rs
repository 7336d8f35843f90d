//! `medea doctor` against the simulated cluster: a clean bill of health, then each failure it
//! must report (file modes, unhealthy etcd, apiserver down, RBAC, certificate role, a node away).

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use medea::cli::doctor::{Check, ClusterReport, Status, diagnose_cluster};
use medea::sim::kube::{Forbidden, KubeFault, Outage};
use medea::sim::talos::{Effect, FaultPlan, Trigger};
use medea::talos::{NodeTarget, TalosApi as _};

use crate::sim_cluster::{Env, env, fast_refresh, flat, medea, quick_default};

/// The sim's credentials laid out as `medea seed` lays them out.
fn creds_dir(e: &Env) -> PathBuf {
    let dir = e.dir.path().join("creds");
    e.sim.write_creds(&dir.join("home")).unwrap();
    dir
}

async fn diagnose(dir: &Path) -> ClusterReport {
    diagnose_cluster(dir, "home", &fast_refresh()).await
}

fn failed(r: &ClusterReport) -> Vec<&Check> {
    r.checks
        .iter()
        .filter(|c| c.status == Status::Fail)
        .collect()
}

fn find<'a>(r: &'a ClusterReport, check: &str, target: &str) -> &'a Check {
    r.checks
        .iter()
        .find(|c| c.check == check && c.target.contains(target))
        .unwrap_or_else(|| panic!("no {check} check for {target}: {:#?}", r.checks))
}

#[tokio::test]
async fn doctor_passes_on_a_healthy_cluster() {
    let e = env(quick_default()).await;
    let dir = creds_dir(&e);
    let out = medea(&["doctor", "--creds-dir", dir.to_str().unwrap()]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", flat(&out.stderr));
    assert!(text.starts_with("cluster home ("), "{text}");
    assert!(text.contains(", 0 failed, 0 skipped"), "{text}");
    assert!(!text.contains("to fix:"), "{text}");

    let out = medea(&[
        "doctor",
        "--cluster",
        "home",
        "--creds-dir",
        dir.to_str().unwrap(),
        "-o",
        "json",
    ])
    .await;
    assert!(out.status.success());
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["ok"], true);
    let checks = json["clusters"][0]["checks"].as_array().unwrap();
    let kinds: std::collections::BTreeSet<&str> = checks
        .iter()
        .map(|c| c["check"].as_str().unwrap())
        .collect();
    for kind in [
        "creds",
        "talos-cert",
        "kube-apiserver",
        "clock",
        "rbac",
        "kube-nodes",
        "talos-api",
        "etcd",
        "etcd-members",
    ] {
        assert!(kinds.contains(kind), "{kind} missing: {kinds:?}");
    }
    assert!(checks.iter().all(|c| c["status"] == "pass"), "{checks:#?}");
    assert_eq!(
        checks.iter().filter(|c| c["check"] == "talos-api").count(),
        6,
        "one per node"
    );
    assert_eq!(checks.iter().filter(|c| c["check"] == "etcd").count(), 3);
    let members = checks
        .iter()
        .find(|c| c["check"] == "etcd-members")
        .unwrap();
    assert_eq!(members["detail"], "3 members: cp-1, cp-2, cp-3");
    e.sim.shutdown().await;
}

#[tokio::test]
async fn doctor_fails_on_loose_file_modes_with_the_chmod_to_run() {
    let e = env(quick_default()).await;
    let dir = creds_dir(&e);
    let kubeconfig = dir.join("home/kubeconfig");
    std::fs::set_permissions(&kubeconfig, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).unwrap();
    let out = medea(&["doctor", "--creds-dir", dir.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "FAIL  creds           {}: mode 0644",
            kubeconfig.display()
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "[ ] home {0}: chmod 600 {0}",
            kubeconfig.display()
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("chmod 700 {}", dir.display())),
        "{text}"
    );
    assert!(text.contains(", 2 failed,"), "{text}");
    e.sim.shutdown().await;
}

#[tokio::test]
async fn doctor_reports_unhealthy_etcd_and_a_node_that_is_away() {
    let e = env(quick_default()).await;
    let dir = creds_dir(&e);
    e.sim.talos.set_etcd_healthy("cp-2", false).unwrap();
    e.sim
        .talos
        .set_fault(FaultPlan {
            node: "w-3".into(),
            on: Trigger::Boot { nth: 1 },
            effect: Effect::NeverReturn,
        })
        .unwrap();
    e.talos()
        .reboot(&NodeTarget::parse("w-3").unwrap())
        .await
        .unwrap();
    let r = diagnose(&dir).await;
    let etcd = find(&r, "etcd", "cp-2");
    assert_eq!(etcd.status, Status::Fail, "{etcd:?}");
    assert!(
        etcd.detail.contains("etcdserver: request timed out"),
        "{etcd:?}"
    );
    assert!(
        etcd.fix
            .as_deref()
            .unwrap()
            .contains("talosctl -n 127.5.0.3 service etcd")
    );
    assert_eq!(find(&r, "etcd", "cp-1").status, Status::Pass);
    let w3 = find(&r, "talos-api", "w-3");
    assert_eq!(w3.status, Status::Fail, "{w3:?}");
    assert!(w3.detail.contains("Unavailable"), "{w3:?}");
    assert_eq!(find(&r, "talos-api", "w-2").status, Status::Pass);
    let names: Vec<(&str, &str)> = failed(&r)
        .iter()
        .map(|c| (c.check, c.target.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("etcd", "cp-2 (127.5.0.3)"),
            ("talos-api", "w-3 (127.5.0.7)")
        ],
        "{r:#?}"
    );
    e.sim.shutdown().await;
}

#[tokio::test]
async fn doctor_reports_an_unavailable_apiserver_and_still_checks_talos() {
    let e = env(quick_default()).await;
    let dir = creds_dir(&e);
    e.sim
        .kube
        .inject(KubeFault::ApiUnavailable(Outage::For(Duration::from_secs(
            600,
        ))));
    let r = diagnose(&dir).await;
    let api = find(&r, "kube-apiserver", "https://");
    assert_eq!(api.status, Status::Fail, "{api:?}");
    assert!(
        api.detail.contains("503")
            || api.detail.contains("ServiceUnavailable")
            || api.detail.contains("unable to handle"),
        "{api:?}"
    );
    assert!(
        api.fix.as_deref().unwrap().contains("get --raw /version"),
        "{api:?}"
    );
    assert_eq!(find(&r, "clock", "https://").status, Status::Skip);
    assert_eq!(find(&r, "rbac", "https://").status, Status::Skip);
    // Without the Node list, the talosconfig's nodes are checked: cp-1, with its etcd.
    assert_eq!(find(&r, "talos-api", "127.5.0.2").status, Status::Pass);
    assert_eq!(find(&r, "etcd", "127.5.0.2").status, Status::Pass);
    assert_eq!(failed(&r).len(), 1, "{r:#?}");

    let out = medea(&["doctor", "--creds-dir", dir.to_str().unwrap(), "-o", "json"]).await;
    assert_eq!(out.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["ok"], false);
    e.sim.shutdown().await;
}

#[tokio::test]
async fn doctor_reports_missing_rbac_permissions() {
    let e = env(quick_default()).await;
    let dir = creds_dir(&e);
    e.sim.kube.inject(KubeFault::Forbidden(Forbidden::parse(
        "create",
        "pods/eviction",
    )));
    e.sim
        .kube
        .inject(KubeFault::Forbidden(Forbidden::parse("patch", "nodes")));
    let r = diagnose(&dir).await;
    let rbac = find(&r, "rbac", "https://");
    assert_eq!(rbac.status, Status::Fail, "{rbac:?}");
    assert!(
        rbac.detail
            .starts_with("denied: patch nodes, create pods/eviction"),
        "{rbac:?}"
    );
    assert_eq!(failed(&r).len(), 1, "{r:#?}");
    e.sim.shutdown().await;
}

#[tokio::test]
async fn doctor_refuses_a_talosconfig_without_os_admin() {
    let e = env(quick_default()).await;
    let dir = creds_dir(&e);
    // Swap the admin certificate for an os:reader one from the same CA.
    let reader = e.sim.talos.pki().issue_client(&["os:reader"]).unwrap();
    let path = dir.join("home/talosconfig");
    let mut cfg: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let ctx = &mut cfg["contexts"]["medea-sim"];
    ctx["crt"] = b64(&reader.cert_pem).into();
    ctx["key"] = b64(reader.key_pem.expose()).into();
    std::fs::write(&path, serde_json::to_string(&cfg).unwrap()).unwrap();
    let r = diagnose(&dir).await;
    let cert = find(&r, "talos-cert", "talosconfig");
    assert_eq!(cert.status, Status::Fail, "{cert:?}");
    assert!(
        cert.detail.contains("role os:reader") && cert.detail.contains("needs `os:admin`"),
        "{cert:?}"
    );
    // The simulator does not enforce Talos roles, so the API itself still answers.
    assert_eq!(find(&r, "talos-api", "cp-1").status, Status::Pass);
    e.sim.shutdown().await;
}

#[tokio::test]
async fn doctor_without_credentials_says_to_seed() {
    let dir = tempfile::tempdir().unwrap();
    let out = medea(&["doctor", "--creds-dir", dir.path().to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = flat(&out.stderr);
    assert!(
        stderr.contains("no cluster credentials under")
            && stderr.contains("run `medea seed` first"),
        "{stderr}"
    );
}

#[tokio::test]
async fn doctor_warns_about_flags_the_next_kubernetes_minor_removes() {
    use medea::talos::{ApplyOptions, MachineConfig};
    let e = env(quick_default()).await;
    let dir = creds_dir(&e);
    // the default cluster runs Kubernetes 1.34; 1.35 removed the kubelet's
    // `--pod-infra-container-image` (go-kubernetes upgrade/checks.go)
    let talos = e.talos();
    let w2 = NodeTarget::parse("w-2").unwrap();
    let yaml = String::from_utf8(
        talos
            .machine_config(&w2)
            .await
            .unwrap()
            .yaml()
            .expose()
            .clone(),
    )
    .unwrap();
    let anchor = "    disableManifestsDirectory: true\n";
    assert!(yaml.contains(anchor));
    let patched = yaml.replacen(
        anchor,
        &format!(
            "{anchor}    extraArgs:\n      pod-infra-container-image: registry.k8s.io/pause:3.10\n"
        ),
        1,
    );
    talos
        .apply_configuration(
            &w2,
            &MachineConfig::from_yaml(patched.into_bytes()),
            ApplyOptions::no_reboot(),
        )
        .await
        .unwrap();
    let r = diagnose(&dir).await;
    let w = find(&r, "kube-upgrade", "w-2");
    assert_eq!(w.status, Status::Warn, "{w:?}");
    assert!(
        w.detail
            .contains("kubelet on `w-2 (127.5.0.6)`: flag `--pod-infra-container-image` (machine.kubelet.extraArgs)"),
        "{w:?}"
    );
    assert!(w.fix.as_deref().unwrap().contains("1.35"), "{w:?}");
    assert!(
        !r.checks
            .iter()
            .any(|c| c.check == "kube-upgrade" && !c.target.contains("w-2")),
        "only w-2 sets a removed flag: {:#?}",
        r.checks
    );
    e.sim.shutdown().await;
}

/// Issue 19: a malformed talosconfig is reported by position, never quoting the file (its
/// client key is in it).
#[tokio::test]
async fn doctor_reports_a_malformed_talosconfig_without_quoting_it() {
    let e = env(quick_default()).await;
    let dir = creds_dir(&e);
    let path = dir.join("home/talosconfig");
    let text = std::fs::read_to_string(&path).unwrap();
    let cfg: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let key = cfg["contexts"]["medea-sim"]["key"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(text.contains(&key));
    // An unclosed flow sequence right before the key: the parser's own message quotes it.
    std::fs::write(&path, text.replacen(&key, &format!("[{key}"), 1)).unwrap();
    let out = medea(&["doctor", "--creds-dir", dir.to_str().unwrap()]).await;
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains("is not valid YAML in the talosconfig format"),
        "{all}"
    );
    assert!(!all.contains(&key[..24]), "{all}");
    e.sim.shutdown().await;
}

/// Replace what differs between runs (the temporary directory, loopback ports, the sim's
/// certificate dates, the measured clock skew) so the rest of doctor's output can be pinned
/// byte for byte.
fn stable(text: &str, dir: &Path) -> String {
    let text = text.replace(dir.to_str().unwrap(), "<creds>");
    let text = mask(&text, "127.0.0.1:", "<port>", |rest| {
        rest.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len())
    });
    let text = mask(&text, "expires ", "<date> (in <n> days)", |rest| {
        rest.find(" days)").map_or(0, |i| i + " days)".len())
    });
    mask(&text, "within ", "<skew>", |rest| {
        rest.find(|c: char| !c.is_ascii_digit() && c != 's')
            .unwrap_or(rest.len())
    })
}

/// Replace what follows each `marker` (as long as `len` says) with `with`.
fn mask(text: &str, marker: &str, with: &str, len: impl Fn(&str) -> usize) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(marker) {
        let (head, tail) = rest.split_at(at + marker.len());
        out.push_str(head);
        out.push_str(with);
        rest = &tail[len(tail)..];
    }
    out.push_str(rest);
    out
}

#[tokio::test]
async fn doctor_output_is_pinned() {
    let e = env(quick_default()).await;
    let dir = creds_dir(&e);
    let out = medea(&["doctor", "--creds-dir", dir.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", flat(&out.stderr));
    let healthy = stable(&String::from_utf8_lossy(&out.stdout), &dir);

    std::fs::set_permissions(
        dir.join("home").join("talosconfig"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let out = medea(&["doctor", "--creds-dir", dir.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(1), "{}", flat(&out.stderr));
    let loose = stable(&String::from_utf8_lossy(&out.stdout), &dir);
    expectorate::assert_contents(
        "tests/it/snapshots/doctor_text.txt",
        &format!("$ medea doctor\n{healthy}\n$ medea doctor  # talosconfig 0644\n{loose}"),
    );
    let out = medea(&["doctor", "--creds-dir", dir.to_str().unwrap(), "-o", "json"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", flat(&out.stderr));
    expectorate::assert_contents(
        "tests/it/snapshots/doctor_json.json",
        &stable(&String::from_utf8_lossy(&out.stdout), &dir),
    );
    e.sim.shutdown().await;
}
