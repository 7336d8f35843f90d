//! Plans that know time (issue #36): a finding that ends at a known time ends with it.

use std::time::Duration;

use medea::inventory::{MachineRole, ObservedCluster, cluster_key};
use medea::store::fjall::FjallStore;
use medea::store::{Store, Txn};
use medea::version::KubeVersion;

use crate::fixtures::wait;

fn cluster(name: &str, extra: &str) -> String {
    format!(
        "apiVersion: medea/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\nspec:\n  kubernetes:\n    version: v1.34.1\n  approvals:\n    required: 1\n    controlPlane: 1\n{extra}"
    )
}

fn pool(cluster: &str) -> String {
    format!(
        "apiVersion: medea/v1alpha1\nkind: NodePool\nmetadata:\n  name: controlplane\nspec:\n  cluster: {cluster}\n  role: controlplane\n  machines: [cp-1, cp-2, cp-3]\n  talos:\n    version: v1.12.12\n"
    )
}

fn observed(name: &str, talos: &str) -> ObservedCluster {
    let machines = ["cp-1", "cp-2", "cp-3"]
        .iter()
        .map(|n| {
            (
                n.to_string(),
                crate::server::machine(n, MachineRole::Controlplane, talos),
            )
        })
        .collect();
    ObservedCluster::new(name)
        .observe(Some(KubeVersion::parse("v1.34.1").unwrap()), machines)
        .with_rollouts_enabled(true)
}

/// Issue #36 item 5: `c1` rolls a Talos version only after `c0` ran it for a soak. `c0`'s
/// job brought it and the soak ends a few seconds after the server starts: the plan is
/// blocked ("still soaking … may proceed from T"), and at T it is computed again by itself —
/// no edit, no refresh, no approval — and is no longer blocked. (Measured before: 90 s after
/// the soak ended the plan still said "may proceed from <90 s ago>".)
#[test]
fn a_promotion_soak_that_ends_unblocks_the_plan_at_that_time() {
    let soak = 8;
    let desired = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    // c0's job, computed and created from c0 alone at v1.12.4, succeeded just now.
    {
        std::fs::write(desired.path().join("c0.yaml"), cluster("c0", "")).unwrap();
        std::fs::write(desired.path().join("pools-c0.yaml"), pool("c0")).unwrap();
        let loaded =
            medea::desired::load(&medea::desired::Source::Dir(desired.path().to_path_buf()))
                .unwrap();
        assert!(!loaded.has_errors(), "{:?}", loaded.diagnostics);
        let store = FjallStore::open(&state.path().join("store")).unwrap();
        let c0 = observed("c0", "v1.12.4");
        store
            .commit(Txn::new().put_record(cluster_key("c0"), &c0))
            .unwrap();
        let plan = medea::ops::replan::replan(&store, &loaded.desired)
            .unwrap()
            .plan;
        let none: &[medea::desired::window::MaintenanceWindow] = &[];
        let inputs = medea::rollout::JobInputs {
            global_rollouts: true,
            clusters: [("c0".to_string(), &c0)].into(),
            windows: [("c0".to_string(), none)].into(),
            exclusions: Default::default(),
            backup_recipients: Default::default(),
        };
        let now = jiff::Timestamp::now();
        let mut job = medea::rollout::create_jobs_txn(&plan, &inputs, now)
            .unwrap()
            .jobs
            .remove(0);
        job.state = medea::rollout::JobState::Succeeded { at: now };
        store
            .commit(Txn::new().put_record(medea::rollout::journal::job_key(&job.id), &job))
            .unwrap();
    }
    std::fs::write(
        desired.path().join("c1.yaml"),
        cluster(
            "c1",
            &format!("  promotion:\n    after: c0\n    soak: {soak}s\n"),
        ),
    )
    .unwrap();
    std::fs::write(desired.path().join("pools-c1.yaml"), pool("c1")).unwrap();
    let s = crate::server::start_in(
        state,
        desired.path().to_path_buf(),
        vec![observed("c0", "v1.12.12"), observed("c1", "v1.12.4")],
        None,
        false,
    );
    let plan = || -> serde_json::Value {
        serde_json::from_slice(
            &s.cli()
                .args(["plan", "-o", "json"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap_or_default()
    };
    // Blocked while c0's run of v1.12.12 soaks, with the time it ends.
    let mut first = serde_json::Value::Null;
    wait("the blocked plan", Duration::from_secs(30), || {
        first = plan();
        first["state"] == "blocked"
    });
    let text = first.to_string();
    assert!(
        text.contains("is still soaking on upstream cluster `c0`"),
        "{text}"
    );
    // Then, with nothing else happening, planned again once the soak is over.
    wait(
        "the plan after the soak",
        Duration::from_secs(soak + 60),
        || {
            let p = plan();
            p["state"] == "pending" && p["id"] != first["id"]
        },
    );
}
