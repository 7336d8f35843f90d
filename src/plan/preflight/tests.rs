//! Preflight checks: each check's findings and severities, the removal-table lookups, the
//! promotion arithmetic, acknowledgements and what the plan id covers.

use std::time::Duration;

use jiff::Timestamp;

use super::*;
use crate::inventory::preflight::*;
use crate::inventory::{Inventory, Machine};
use crate::plan::compute::PlanMemo;
use crate::plan::tests::{
    cluster_doc, cp, cp_pool, load, observed, one, three_cps, w, worker_pool, workers,
};
use crate::plan::{LastApplied, Plan, PlanInputs, compute_memo};

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn ctx(now: &str) -> Context {
    Context {
        now: Some(ts(now)),
        ..Default::default()
    }
}

/// Gathered observations with one apiserver that answered.
fn gathered() -> PreflightObservations {
    PreflightObservations {
        gathered: true,
        apiserver_metrics: vec![MetricsSource {
            endpoint: "https://10.0.0.4:6443".into(),
            error: None,
            started: None,
        }],
        etcd: Some(EtcdObservation {
            members: ["cp-1", "cp-2", "cp-3"]
                .iter()
                .enumerate()
                .map(|(i, n)| EtcdMemberObservation {
                    id: format!("{i:016x}"),
                    name: n.to_string(),
                    learner: false,
                    healthy: true,
                })
                .collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn with(mut inv: Inventory, p: PreflightObservations) -> Inventory {
    std::sync::Arc::make_mut(inv.clusters.get_mut("c1").unwrap()).preflight = p;
    inv
}

fn plan(d: &crate::desired::Desired, inv: &Inventory, c: &Context) -> Plan {
    let applied = LastApplied::default();
    let inputs = PlanInputs {
        preflight: c,
        ..PlanInputs::new(d, inv, &applied)
    };
    compute_memo(&inputs, &mut PlanMemo::one_off()).unwrap_or_else(|e| panic!("{e:#?}"))
}

fn c1(p: &Plan) -> &crate::plan::ClusterPlan {
    p.clusters
        .iter()
        .find(|c| c.cluster == "c1")
        .expect("cluster c1")
}

fn ids(p: &Plan) -> Vec<(String, Severity)> {
    c1(p)
        .preflight
        .iter()
        .map(|f| (f.id.clone(), f.severity))
        .collect()
}

fn finding<'p>(p: &'p Plan, id: &str) -> &'p Finding {
    c1(p)
        .preflight
        .iter()
        .find(|f| f.id == id)
        .unwrap_or_else(|| panic!("no finding {id}: {:#?}", c1(p).preflight))
}

fn flowschema_gauge() -> DeprecatedApiRequest {
    DeprecatedApiRequest {
        group: "flowcontrol.apiserver.k8s.io".into(),
        version: "v1beta3".into(),
        resource: "flowschemas".into(),
        subresource: String::new(),
        removed_release: "1.32".into(),
        source: "https://10.0.0.4:6443".into(),
    }
}

const NOW: &str = "2026-12-03T12:00:00Z";

// ---------------------------------------------------------------- removed APIs

#[test]
fn usage_of_an_api_the_target_minor_removes_blocks() {
    let d = one("v1.32.0", "", &[cp_pool("v1.13.9")]);
    let mut p = gathered();
    p.deprecated_api_requests.push(flowschema_gauge());
    let inv = with(observed("v1.31.4", 1, three_cps("v1.13.9")), p);
    let pl = plan(&d, &inv, &ctx(NOW));
    let f = finding(
        &pl,
        "removed-api/flowcontrol.apiserver.k8s.io/v1beta3/flowschemas",
    );
    assert_eq!(f.severity, Severity::Blocking);
    assert_eq!(f.check, "removed-api");
    assert!(f.blocks());
    assert!(
        f.message
            .contains("flowcontrol.apiserver.k8s.io/v1beta3 FlowSchema (flowschemas)"),
        "{}",
        f.message
    );
    assert!(
        f.message.contains("v1.32 no longer serves it"),
        "{}",
        f.message
    );
    assert!(
        f.message
            .contains("use flowcontrol.apiserver.k8s.io/v1 FlowSchema"),
        "{}",
        f.message
    );
    assert!(
        f.evidence
            .iter()
            .any(|e| e.contains("apiserver https://10.0.0.4:6443")),
        "{:?}",
        f.evidence
    );
    assert!(
        !f.evidence.iter().any(|e| e.contains("partial")),
        "{:?}",
        f.evidence
    );
    let why = refusal(&pl).expect("blocked");
    assert!(
        why.contains("[removed-api/flowcontrol.apiserver.k8s.io/v1beta3/flowschemas]"),
        "{why}"
    );
    assert!(why.contains("spec.preflight.acknowledge"), "{why}");
}

#[test]
fn usage_of_an_api_deprecated_but_still_served_by_the_target_warns() {
    // v1beta3 is deprecated in 1.29 and removed in 1.32: upgrading to 1.31 only warns.
    let d = one("v1.31.0", "", &[cp_pool("v1.12.11")]);
    let mut p = gathered();
    p.deprecated_api_requests.push(flowschema_gauge());
    let inv = with(observed("v1.30.4", 1, three_cps("v1.12.11")), p);
    let pl = plan(&d, &inv, &ctx(NOW));
    assert_eq!(
        ids(&pl),
        [(
            "deprecated-api/flowcontrol.apiserver.k8s.io/v1beta3/flowschemas".to_string(),
            Severity::Warning
        )]
    );
    assert!(refusal(&pl).is_none());
}

fn scheduling_alpha(count: u64) -> AlphaObjects {
    AlphaObjects {
        resource: "workloads.v1alpha2.scheduling.k8s.io".into(),
        count,
        examples: vec!["batch/train-1".into(), "batch/train-2".into()],
    }
}

#[test]
fn objects_of_an_alpha_resource_the_target_removes_block_like_upgrade_k8s() {
    let d = one("v1.37.1", "", &[cp_pool("v1.14.6")]);
    let mut p = gathered();
    p.removed_alpha_objects.push(scheduling_alpha(3));
    let inv = with(observed("v1.36.3", 1, three_cps("v1.14.6")), p.clone());
    let pl = plan(&d, &inv, &ctx(NOW));
    let f = finding(&pl, "removed-api/scheduling.k8s.io/v1alpha2/workloads");
    assert_eq!(f.severity, Severity::Blocking);
    assert!(f.blocks());
    assert!(
        f.message.starts_with(
            "3 objects of the alpha resource scheduling.k8s.io/v1alpha2 Workload (workloads) exist and v1.37 no longer serves it (kubernetes/kubernetes#138572)"
        ),
        "{}",
        f.message
    );
    assert_eq!(
        f.evidence,
        [
            "Workload batch/train-1 (scheduling.k8s.io/v1alpha2)",
            "Workload batch/train-2 (scheduling.k8s.io/v1alpha2)",
            "3 objects in all (a list of workloads.v1alpha2.scheduling.k8s.io)"
        ]
    );
    assert!(
        f.help
            .contains("kubectl delete workloads.v1alpha2.scheduling.k8s.io --all --all-namespaces"),
        "{}",
        f.help
    );
    // an upgrade that stays below the removal does not care (upgrade-k8s checks per step)
    let d = one("v1.36.3", "", &[cp_pool("v1.14.6")]);
    let inv = with(observed("v1.35.2", 1, three_cps("v1.14.6")), p);
    let pl = plan(&d, &inv, &ctx(NOW));
    assert!(
        !ids(&pl).iter().any(|(id, _)| id.contains("workloads")),
        "{:?}",
        ids(&pl)
    );
}

#[test]
fn an_apiserver_up_for_less_than_a_day_makes_the_gauge_weak_evidence() {
    let d = one("v1.37.1", "", &[cp_pool("v1.14.6")]);
    let now = ts(NOW).as_second();
    let mut p = gathered();
    p.apiserver_metrics[0].started = Some(now - 3600);
    p.apiserver_metrics.push(MetricsSource {
        endpoint: "https://10.0.0.5:6443".into(),
        error: None,
        started: Some(now - 40 * 24 * 3600),
    });
    let inv = with(observed("v1.36.3", 1, three_cps("v1.14.6")), p.clone());
    let pl = plan(&d, &inv, &ctx(NOW));
    let f = finding(&pl, "removed-api/short-gauge-window");
    assert_eq!(f.severity, Severity::Warning);
    assert!(f.message.contains("24h"), "{}", f.message);
    assert_eq!(f.evidence.len(), 1, "{:?}", f.evidence);
    assert!(
        f.evidence[0].starts_with("apiserver https://10.0.0.4:6443 has been up for 1h"),
        "{:?}",
        f.evidence
    );
    // a day later both count
    let later = ts("2026-12-04T12:00:01Z").to_string();
    let pl = plan(&d, &inv, &ctx(&later));
    assert!(
        !ids(&pl)
            .iter()
            .any(|(id, _)| id == "removed-api/short-gauge-window"),
        "{:?}",
        ids(&pl)
    );
    // no Kubernetes minor upgrade: the gauge is not consulted
    let d = one("v1.36.3", "", &[cp_pool("v1.14.6")]);
    let inv = with(observed("v1.36.3", 1, three_cps("v1.14.6")), p);
    let pl = plan(&d, &inv, &ctx(NOW));
    assert!(
        !ids(&pl)
            .iter()
            .any(|(id, _)| id == "removed-api/short-gauge-window"),
        "{:?}",
        ids(&pl)
    );
}

#[test]
fn no_kubernetes_minor_upgrade_means_no_api_check() {
    // Talos only: the apiserver keeps its minor.
    let d = one("v1.34.1", "", &[cp_pool("v1.13.9")]);
    let mut p = gathered();
    p.deprecated_api_requests.push(flowschema_gauge());
    let inv = with(observed("v1.34.1", 1, three_cps("v1.12.11")), p);
    let pl = plan(&d, &inv, &ctx(NOW));
    assert!(
        pl.clusters[0].preflight.is_empty(),
        "{:#?}",
        pl.clusters[0].preflight
    );
}

#[test]
fn managed_fields_name_the_object_and_manager_and_skip_the_apiservers_own_entries() {
    let d = one("v1.32.0", "", &[cp_pool("v1.13.9")]);
    let mut p = gathered();
    let mf = |manager: &str, name: &str| ManagedFieldsUse {
        api_version: "flowcontrol.apiserver.k8s.io/v1beta3".into(),
        resource: "prioritylevelconfigurations".into(),
        kind: "PriorityLevelConfiguration".into(),
        namespace: String::new(),
        name: name.into(),
        manager: manager.into(),
        operation: "Update".into(),
    };
    p.managed_fields.push(mf(
        "api-priority-and-fairness-config-producer-v1",
        "global-default",
    ));
    let inv = with(observed("v1.31.4", 1, three_cps("v1.13.9")), p.clone());
    assert!(plan(&d, &inv, &ctx(NOW)).clusters[0].preflight.is_empty());
    p.managed_fields
        .push(mf("kubectl-client-side-apply", "team-a"));
    let inv = with(observed("v1.31.4", 1, three_cps("v1.13.9")), p);
    let pl = plan(&d, &inv, &ctx(NOW));
    let f = finding(
        &pl,
        "removed-api/flowcontrol.apiserver.k8s.io/v1beta3/prioritylevelconfigurations",
    );
    assert_eq!(f.severity, Severity::Blocking);
    assert_eq!(
        f.evidence,
        [
            "PriorityLevelConfiguration team-a: managedFields entry of manager `kubectl-client-side-apply` (Update) written with flowcontrol.apiserver.k8s.io/v1beta3"
        ]
    );
}

#[test]
fn an_unanswered_metrics_endpoint_makes_the_view_partial_and_none_answering_blocks() {
    let d = one("v1.32.0", "", &[cp_pool("v1.13.9")]);
    let mut p = gathered();
    p.deprecated_api_requests.push(flowschema_gauge());
    p.apiserver_metrics.push(MetricsSource {
        endpoint: "https://10.0.0.5:6443".into(),
        error: Some("HTTP 403".into()),
        started: None,
    });
    let inv = with(observed("v1.31.4", 1, three_cps("v1.13.9")), p.clone());
    let pl = plan(&d, &inv, &ctx(NOW));
    let f = finding(
        &pl,
        "removed-api/flowcontrol.apiserver.k8s.io/v1beta3/flowschemas",
    );
    assert!(
        f.evidence.contains(
            &"partial view: apiserver https://10.0.0.5:6443 did not answer /metrics: HTTP 403"
                .to_string()
        ),
        "{:?}",
        f.evidence
    );
    assert_eq!(
        finding(&pl, "removed-api/partial-view").severity,
        Severity::Warning
    );
    // Nobody answered: usage cannot be ruled out.
    p.deprecated_api_requests.clear();
    p.apiserver_metrics = vec![MetricsSource {
        endpoint: "https://10.0.0.5:6443".into(),
        error: Some("connection refused".into()),
        started: None,
    }];
    let inv = with(observed("v1.31.4", 1, three_cps("v1.13.9")), p);
    let pl = plan(&d, &inv, &ctx(NOW));
    assert_eq!(
        ids(&pl),
        [("removed-api/unobserved".to_string(), Severity::Blocking)]
    );
}

#[test]
fn the_upgrade_policy_extends_the_removal_table_for_crds() {
    let extra = "  upgradePolicy:\n    removedApis:\n      - group: example.com\n        version: v1beta1\n        resource: widgets\n        kind: Widget\n        deprecatedIn: v1.30\n        removedIn: v1.32\n        replacement: example.com/v1 Widget\n";
    let d = one("v1.32.0", extra, &[cp_pool("v1.13.9")]);
    let table = d.clusters["c1"].upgrade_policy.api_table();
    let row = crate::api_lifecycle::lookup(&table, "example.com", "v1beta1", "widgets").unwrap();
    assert_eq!((row.deprecated, row.removed), ((1, 30), (1, 32)));
    assert!(table.len() > crate::api_lifecycle::builtin().len());
    let mut p = gathered();
    p.managed_fields.push(ManagedFieldsUse {
        api_version: "example.com/v1beta1".into(),
        resource: "widgets".into(),
        kind: "Widget".into(),
        namespace: "apps".into(),
        name: "w1".into(),
        manager: "helm".into(),
        operation: "Update".into(),
    });
    let inv = with(observed("v1.31.4", 1, three_cps("v1.13.9")), p);
    let pl = plan(&d, &inv, &ctx(NOW));
    let f = finding(&pl, "removed-api/example.com/v1beta1/widgets");
    assert_eq!(f.severity, Severity::Blocking);
    assert!(
        f.message.contains("use example.com/v1 Widget"),
        "{}",
        f.message
    );
    assert!(f.evidence[0].starts_with("Widget apps/w1: managedFields entry of manager `helm`"));
}

#[test]
fn an_upgrade_policy_row_replaces_the_builtin_one() {
    let policy = crate::desired::model::UpgradePolicy {
        removed_apis: vec![crate::api_lifecycle::ApiLifecycle {
            group: "flowcontrol.apiserver.k8s.io".into(),
            version: "v1beta3".into(),
            resource: "flowschemas".into(),
            kind: "FlowSchema".into(),
            deprecated: (1, 29),
            removed: (1, 33),
            replacement: None,
        }],
        ..Default::default()
    };
    let t = policy.api_table();
    assert_eq!(t.len(), crate::api_lifecycle::builtin().len());
    let row =
        crate::api_lifecycle::lookup(&t, "flowcontrol.apiserver.k8s.io", "v1beta3", "flowschemas")
            .unwrap();
    assert_eq!(row.removed, (1, 33));
}

// ---------------------------------------------------------------- PDBs

fn pdb(name: &str, allowed: i64, pods: &[(&str, &str)]) -> ObservedPdb {
    ObservedPdb {
        namespace: "db".into(),
        name: name.into(),
        disruptions_allowed: allowed,
        pods: pods
            .iter()
            .map(|(p, n)| PdbPod {
                name: p.to_string(),
                node: n.to_string(),
            })
            .collect(),
    }
}

#[test]
fn a_pdb_allowing_nothing_on_drained_nodes_warns_naming_pods_and_nodes() {
    let d = one("v1.34.1", "", &[worker_pool(2, 1)]);
    let mut p = gathered();
    p.pod_disruption_budgets = vec![
        pdb("pg", 0, &[("pg-0", "w-1"), ("pg-1", "elsewhere")]),
        pdb("roomy", 1, &[("r-0", "w-1")]),
        pdb("far", 0, &[("f-0", "elsewhere")]),
    ];
    let inv = with(observed("v1.34.1", 1, workers(2, "v1.12.4")), p);
    let pl = plan(&d, &inv, &ctx(NOW));
    assert_eq!(ids(&pl), [("pdb/db/pg".to_string(), Severity::Warning)]);
    let f = finding(&pl, "pdb/db/pg");
    assert_eq!(
        f.message,
        "PodDisruptionBudget db/pg allows 0 disruptions and covers pods on nodes this plan drains (w-1): drain will wait up to drainTimeout (10m), then halt"
    );
    assert_eq!(
        f.evidence,
        ["pod db/pg-0 on node w-1", "status.disruptionsAllowed = 0"]
    );
}

// ---------------------------------------------------------------- etcd

#[test]
fn etcd_alarms_block_control_plane_plans_and_warn_worker_plans() {
    let mut p = gathered();
    p.etcd.as_mut().unwrap().alarms.push(EtcdAlarmObservation {
        member: "0000000000000001".into(),
        alarm: "NOSPACE".into(),
    });
    let cps = one("v1.34.1", "", &[cp_pool("v1.13.9")]);
    let inv = with(observed("v1.34.1", 1, three_cps("v1.12.11")), p.clone());
    let pl = plan(&cps, &inv, &ctx(NOW));
    assert_eq!(
        ids(&pl),
        [(
            "etcd/alarm/NOSPACE/0000000000000001".to_string(),
            Severity::Blocking
        )]
    );
    let ws = one("v1.34.1", "", &[worker_pool(2, 1)]);
    let mut machines = workers(2, "v1.12.4");
    machines.extend(three_cps("v1.13.9"));
    let inv = with(observed("v1.34.1", 1, machines), p);
    let pl = plan(&ws, &inv, &ctx(NOW));
    assert_eq!(
        ids(&pl),
        [(
            "etcd/alarm/NOSPACE/0000000000000001".to_string(),
            Severity::Warning
        )]
    );
}

#[test]
fn unhealthy_unreachable_single_and_learner_members() {
    let d = one("v1.34.1", "", &[cp_pool("v1.13.9")]);
    let mut p = gathered();
    let e = p.etcd.as_mut().unwrap();
    e.members[1].healthy = false;
    e.members[2].learner = true;
    e.unreachable
        .insert("cp-3".into(), "connection refused".into());
    let inv = with(observed("v1.34.1", 1, three_cps("v1.12.11")), p.clone());
    let pl = plan(&d, &inv, &ctx(NOW));
    assert_eq!(
        ids(&pl),
        [
            ("etcd/unhealthy/cp-2".to_string(), Severity::Blocking),
            ("etcd/unreachable/cp-3".to_string(), Severity::Blocking),
            ("etcd/learner/cp-3".to_string(), Severity::Warning),
        ]
    );
    let mut single = gathered();
    single.etcd.as_mut().unwrap().members.truncate(1);
    let inv = with(observed("v1.34.1", 1, vec![cp("cp-1", "v1.12.11")]), single);
    let d1 = load(&[
        ("c1.yaml", cluster_doc("c1", "v1.34.1", "")),
        (
            "pools.yaml",
            crate::plan::tests::pool_doc("cp", "controlplane", "cp-1", "v1.13.9", ""),
        ),
    ]);
    let pl = plan(&d1, &inv, &ctx(NOW));
    assert_eq!(
        ids(&pl),
        [("etcd/single-member".to_string(), Severity::Warning)]
    );
    // No control-plane node answered: unknown is never a pass.
    let mut none = gathered();
    none.etcd = None;
    let inv = with(observed("v1.34.1", 1, three_cps("v1.12.11")), none);
    assert_eq!(
        ids(&plan(&d, &inv, &ctx(NOW))),
        [("etcd/unobserved".to_string(), Severity::Blocking)]
    );
}

// ---------------------------------------------------------------- nodes

#[test]
fn nodes_of_the_plan_not_ready_cordoned_or_under_pressure_warn() {
    let d = one("v1.34.1", "", &[worker_pool(3, 3)]);
    let mut p = gathered();
    p.node_pressure
        .insert("w-2".into(), vec!["DiskPressure".into()]);
    p.node_pressure
        .insert("not-in-plan".into(), vec!["MemoryPressure".into()]);
    let mut ms: Vec<Machine> = workers(3, "v1.12.4");
    ms[0].cordoned = true;
    ms[2].ready = false;
    ms.extend(three_cps("v1.13.9"));
    let inv = with(observed("v1.34.1", 1, ms), p);
    let pl = plan(&d, &inv, &ctx(NOW));
    assert_eq!(
        ids(&pl),
        [
            ("node/cordoned/w-1".to_string(), Severity::Warning),
            ("node/not-ready/w-3".to_string(), Severity::Warning),
            (
                "node/pressure/w-2/DiskPressure".to_string(),
                Severity::Warning
            ),
        ]
    );
    assert_eq!(
        finding(&pl, "node/cordoned/w-1").message,
        "node w-1 is already cordoned: cordoned by someone else; medea will leave it cordoned"
    );
    let _ = w("x", "v1.12.4");
}

/// Issue #51 item 7: a node cordoned by someone else is left cordoned after its wave, so it
/// takes a slot of every wave after it. With `maxUnavailable: 1` the next wave could never
/// start (the job would wait healthTimeout and halt `pool_unavailable` 15 minutes in): a
/// blocking finding, naming the node and the fixes. With a slot to spare, a line says how many.
#[test]
fn a_wave_whose_slots_an_operator_cordon_takes_blocks_before_approval() {
    let d = one("v1.34.1", "", &[worker_pool(2, 1)]);
    let mut ms: Vec<Machine> = workers(2, "v1.12.4");
    ms[1].cordoned = true;
    ms.extend(three_cps("v1.13.9"));
    let inv = with(observed("v1.34.1", 1, ms), gathered());
    let pl = plan(&d, &inv, &ctx(NOW));
    let f = finding(&pl, "budget/workers/v1.13.9");
    assert_eq!(f.severity, Severity::Blocking);
    assert_eq!(f.check, "budget");
    assert!(f.blocks());
    assert!(
        f.message.contains("cannot start wave 2")
            && f.message.contains("w-2 cordoned by someone else")
            && f.message.contains("halt pool_unavailable"),
        "{}",
        f.message
    );
    assert!(
        f.help.contains("kubectl uncordon") && f.help.contains("maxUnavailable"),
        "{}",
        f.help
    );
    assert!(
        c1(&pl)
            .notes
            .iter()
            .any(|n| n.to_string().contains(
                "pool workers (Talos v1.13.9): wave 2 counts 1 node already unavailable"
            ) && n.to_string().ends_with("0 of 1 slot left")),
        "{:#?}",
        c1(&pl).notes
    );
    assert!(
        crate::plan::render::text(&pl, Default::default())
            .contains("It cannot be approved: 1 blocking preflight finding"),
        "{}",
        crate::plan::render::text(&pl, Default::default())
    );

    // a slot to spare: no finding, the line says what is left
    let d = one("v1.34.1", "", &[worker_pool(3, 2)]);
    let mut ms: Vec<Machine> = workers(3, "v1.12.4");
    ms[0].cordoned = true;
    ms.extend(three_cps("v1.13.9"));
    let inv = with(observed("v1.34.1", 1, ms), gathered());
    let pl = plan(&d, &inv, &ctx(NOW));
    assert!(
        !c1(&pl).preflight.iter().any(|f| f.check == "budget"),
        "{:#?}",
        c1(&pl).preflight
    );
    assert!(
        c1(&pl)
            .notes
            .iter()
            .any(|n| n.to_string().ends_with("1 of 2 slots left")),
        "{:#?}",
        c1(&pl).notes
    );
}

// ---------------------------------------------------------------- credentials

fn cred(not_after: &str) -> PreflightObservations {
    let mut p = gathered();
    p.credentials.push(CredentialExpiry {
        credential: "talosconfig client certificate".into(),
        not_after: not_after.into(),
    });
    p
}

#[test]
fn credentials_expired_block_expiring_within_the_window_warn() {
    let d = one("v1.34.1", "", &[cp_pool("v1.13.9")]);
    let obs = |p| with(observed("v1.34.1", 1, three_cps("v1.12.11")), p);
    let pl = plan(&d, &obs(cred("2026-12-03T11:59:59Z")), &ctx(NOW));
    assert_eq!(
        ids(&pl),
        [(
            "credentials/talosconfig-client-certificate/expired".to_string(),
            Severity::Blocking
        )]
    );
    let pl = plan(&d, &obs(cred("2026-12-06T00:00:00Z")), &ctx(NOW));
    let f = finding(&pl, "credentials/talosconfig-client-certificate/expiring");
    assert_eq!(f.severity, Severity::Warning);
    assert_eq!(
        f.message,
        "the talosconfig client certificate expires at 2026-12-06T00:00:00Z, within the rollout's window (168h): the rollout could outlive it"
    );
    // Seven days and a second away: fine.
    let pl = plan(&d, &obs(cred("2026-12-10T12:00:01Z")), &ctx(NOW));
    assert!(
        pl.clusters[0].preflight.is_empty(),
        "{:#?}",
        pl.clusters[0].preflight
    );
    // Without a clock the expiry cannot be weighed (offline computations).
    let pl = plan(&d, &obs(cred("2026-12-03T11:59:59Z")), &Context::default());
    assert!(pl.clusters[0].preflight.is_empty());
}

// ---------------------------------------------------------------- plan id

#[test]
fn the_plan_id_covers_findings_and_a_later_now_keeps_it() {
    let d = one("v1.34.1", "", &[cp_pool("v1.13.9")]);
    let obs = |p| with(observed("v1.34.1", 1, three_cps("v1.12.11")), p);
    let a = plan(&d, &obs(cred("2026-12-06T00:00:00Z")), &ctx(NOW));
    // An hour later, no threshold crossed: the same plan.
    let b = plan(
        &d,
        &obs(cred("2026-12-06T00:00:00Z")),
        &ctx("2026-12-03T13:00:00Z"),
    );
    assert_eq!(a.id, b.id);
    assert_eq!(a.id, a.canonical_id());
    // The credential expired meanwhile: a different finding, a different plan.
    let c = plan(
        &d,
        &obs(cred("2026-12-06T00:00:00Z")),
        &ctx("2026-12-06T00:00:00Z"),
    );
    assert_ne!(a.id, c.id);
    // A changed observation that changes a finding changes the id (same generation even).
    let mut p = cred("2026-12-06T00:00:00Z");
    p.node_pressure
        .insert("cp-1".into(), vec!["PIDPressure".into()]);
    let e = plan(&d, &obs(p), &ctx(NOW));
    assert_ne!(a.id, e.id);
}

#[test]
fn nothing_gathered_says_so_and_a_plan_without_steps_has_no_findings() {
    let d = one("v1.34.1", "", &[cp_pool("v1.13.9")]);
    let pl = plan(
        &d,
        &observed("v1.34.1", 1, three_cps("v1.12.11")),
        &ctx(NOW),
    );
    assert_eq!(
        ids(&pl),
        [("observations/not-gathered".to_string(), Severity::Warning)]
    );
    let mut p = gathered();
    p.etcd = None;
    let inv = with(observed("v1.34.1", 1, three_cps("v1.13.9")), p);
    assert!(plan(&d, &inv, &ctx(NOW)).clusters[0].preflight.is_empty());
}

// ---------------------------------------------------------------- acknowledgements

#[test]
fn acknowledged_findings_stay_marked_and_stale_acknowledgements_are_noted() {
    let extra = "  preflight:\n    acknowledge:\n      - etcd/unobserved\n      - removed-api/gone/v1/things\n";
    let d = one("v1.34.1", extra, &[cp_pool("v1.13.9")]);
    let mut p = gathered();
    p.etcd = None;
    let inv = with(observed("v1.34.1", 1, three_cps("v1.12.11")), p);
    let pl = plan(&d, &inv, &ctx(NOW));
    let f = finding(&pl, "etcd/unobserved");
    assert!(f.acknowledged);
    assert!(!f.blocks());
    assert!(refusal(&pl).is_none());
    assert!(
        pl.clusters[0]
            .notes
            .iter()
            .any(|n| n.to_string().contains("`removed-api/gone/v1/things`")
                && n.to_string().contains("stale acknowledgement")),
        "{:#?}",
        pl.clusters[0].notes
    );
    let text = crate::plan::render::text(&pl, Default::default());
    assert!(
        text.contains("  preflight:\n    blocking [etcd/unobserved] (acknowledged): "),
        "{text}"
    );
    assert!(text.contains("Approve with: medea approve"), "{text}");
}

#[test]
fn a_blocking_finding_takes_the_approve_command_out_of_the_rendering() {
    let d = one("v1.34.1", "", &[cp_pool("v1.13.9")]);
    let mut p = gathered();
    p.etcd = None;
    let inv = with(observed("v1.34.1", 1, three_cps("v1.12.11")), p);
    let pl = plan(&d, &inv, &ctx(NOW));
    let text = crate::plan::render::text(&pl, Default::default());
    assert!(
        text.contains("    blocking [etcd/unobserved]: no control-plane node answered about etcd"),
        "{text}"
    );
    assert!(
        text.contains("It cannot be approved: 1 blocking preflight finding"),
        "{text}"
    );
    assert!(!text.contains("Approve with"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&crate::plan::render::json(&pl)).unwrap();
    let f = &json["clusters"][0]["preflight"][0];
    assert_eq!(f["id"], "etcd/unobserved");
    assert_eq!(f["check"], "etcd");
    assert_eq!(f["severity"], "blocking");
    assert_eq!(f["acknowledged"], false);
    assert!(f["evidence"].is_array() && f["help"].is_string() && f["message"].is_string());
    assert!(json["approveCommand"].is_null());
}

// ---------------------------------------------------------------- promotion

fn talos(s: &str) -> crate::version::TalosVersion {
    crate::version::TalosVersion::parse(s).unwrap()
}

fn promoted() -> crate::desired::Desired {
    load(&[
        ("c0.yaml", cluster_doc("c0", "v1.34.1", "")),
        (
            "c1.yaml",
            cluster_doc(
                "c1",
                "v1.34.1",
                "  promotion:\n    after: c0\n    soak: 24h\n",
            ),
        ),
        ("pools.yaml", cp_pool("v1.13.9")),
    ])
}

fn promotion_ctx(now: &str, ran: &[(&str, &str)]) -> Context {
    let mut ev = PromotionEvidence::new("c0");
    for (v, at) in ran {
        ev.record(ts(at), &[talos(v)], &[]);
    }
    Context {
        now: Some(ts(now)),
        promotion: [("c0".to_string(), ev)].into(),
    }
}

#[test]
fn promotion_arithmetic() {
    let soak = Duration::from_secs(24 * 3600);
    assert_eq!(
        earliest_proceed(ts("2026-12-02T10:00:00Z"), soak),
        Some(ts("2026-12-03T10:00:00Z"))
    );
    let mut ev = PromotionEvidence::new("c0");
    ev.record(ts("2026-12-02T10:00:00Z"), &[talos("v1.13.9")], &[]);
    ev.record(ts("2026-12-01T10:00:00Z"), &[talos("v1.13.9")], &[]);
    ev.record(ts("2026-12-04T10:00:00Z"), &[talos("v1.13.9")], &[]);
    assert_eq!(
        ev.talos[&talos("v1.13.9")],
        ts("2026-12-01T10:00:00Z"),
        "the first proof counts"
    );
}

#[test]
fn promotion_blocks_until_the_upstream_soaked_the_exact_version() {
    let d = promoted();
    let inv = with(observed("v1.34.1", 1, three_cps("v1.12.11")), gathered());
    let id = "promotion/talos/v1.13.9";
    // Upstream never ran it.
    let pl = plan(&d, &inv, &promotion_ctx("2026-12-03T10:00:00Z", &[]));
    let f = finding(&pl, id);
    assert_eq!(f.severity, Severity::Blocking);
    // Nothing ends this one by itself: no time to plan again.
    assert_eq!(f.until, None);
    assert_eq!(crate::plan::preflight::next_expiry(&pl), None);
    assert!(
        f.message.contains("has not run on upstream cluster `c0`"),
        "{}",
        f.message
    );
    // Upstream ran a newer patch only: not this build.
    let pl = plan(
        &d,
        &inv,
        &promotion_ctx(
            "2026-12-03T10:00:00Z",
            &[("v1.13.10", "2026-11-01T00:00:00Z")],
        ),
    );
    assert_eq!(finding(&pl, id).severity, Severity::Blocking);
    // Ran it, one second short of the soak: blocking, with the absolute time it may proceed.
    let ran = [("v1.13.9", "2026-12-02T10:00:00Z")];
    let early = plan(&d, &inv, &promotion_ctx("2026-12-03T09:59:59Z", &ran));
    assert_eq!(
        finding(&early, id).message,
        "Talos v1.13.9 is still soaking on upstream cluster `c0`: it may proceed from 2026-12-03T10:00:00Z"
    );
    // It ends by itself at that time: the plan says when to be computed again (issue #36).
    assert_eq!(finding(&early, id).until, Some(ts("2026-12-03T10:00:00Z")));
    assert_eq!(
        crate::plan::preflight::next_expiry(&early),
        Some(ts("2026-12-03T10:00:00Z"))
    );
    // Earlier still: the same finding, the same plan.
    let earlier = plan(&d, &inv, &promotion_ctx("2026-12-03T01:00:00Z", &ran));
    assert_eq!(early.id, earlier.id);
    // Exactly at the soak and after: no finding.
    for now in ["2026-12-03T10:00:00Z", "2026-12-05T00:00:00Z"] {
        let pl = plan(&d, &inv, &promotion_ctx(now, &ran));
        assert!(
            pl.clusters.iter().all(|c| c.preflight.is_empty()),
            "{now}: {:#?}",
            pl.clusters
        );
        assert_ne!(pl.id, early.id);
    }
}

// ---------------------------------------------------------------- desired state

fn diagnostics(files: &[(&str, String)]) -> Vec<crate::desired::Diagnostic> {
    let snap = crate::desired::source::Snapshot {
        files: files
            .iter()
            .map(|(p, text)| crate::desired::source::SourceFile {
                path: p.to_string(),
                bytes: text.as_bytes().to_vec().into(),
            })
            .collect(),
        markers: Vec::new(),
        commit: None,
        refused: Vec::new(),
    };
    crate::desired::parse_snapshot(snap).diagnostics
}

#[test]
fn promotion_and_acknowledgements_are_validated_with_positions() {
    let promo = |after: &str| format!("  promotion:\n    after: {after}\n    soak: 24h\n");
    // Itself.
    let d = diagnostics(&[("a.yaml", cluster_doc("a", "v1.34.1", &promo("a")))]);
    assert_eq!(d.len(), 1, "{d:#?}");
    assert_eq!(d[0].code, "medea::desired::promotion");
    assert_eq!(d[0].message, "cluster `a` cannot be promoted after itself");
    assert_eq!((d[0].origin.file.as_str(), d[0].origin.line), ("a.yaml", 9));
    // Not defined.
    let d = diagnostics(&[("a.yaml", cluster_doc("a", "v1.34.1", &promo("nope")))]);
    assert_eq!(
        d[0].message,
        "cluster `a` is promoted after `nope`, which is not defined"
    );
    // A cycle.
    let d = diagnostics(&[
        ("a.yaml", cluster_doc("a", "v1.34.1", &promo("b"))),
        ("b.yaml", cluster_doc("b", "v1.34.1", &promo("a"))),
    ]);
    assert!(
        d.iter()
            .any(|x| x.message == "`promotion.after` has a cycle: a → b → a"),
        "{d:#?}"
    );
    // A bad soak, a duplicate and an empty acknowledgement, a bad removed API.
    let extra = "  promotion:\n    after: b\n    soak: a day\n  preflight:\n    acknowledge: [x, x, \"\"]\n  upgradePolicy:\n    removedApis:\n      - {version: v1beta1, resource: widgets, kind: Widget, deprecatedIn: v1.33, removedIn: v1.32}\n";
    let d = diagnostics(&[
        ("a.yaml", cluster_doc("a", "v1.34.1", extra)),
        ("b.yaml", cluster_doc("b", "v1.34.1", "")),
    ]);
    let msgs: Vec<&str> = d.iter().map(|x| x.message.as_str()).collect();
    assert!(
        msgs.iter()
            .any(|m| m.starts_with("invalid duration `a day`")),
        "{msgs:#?}"
    );
    assert!(
        msgs.contains(&"finding `x` is acknowledged twice"),
        "{msgs:#?}"
    );
    assert!(
        msgs.contains(&"an acknowledged finding id is empty"),
        "{msgs:#?}"
    );
    assert!(
        msgs.contains(&"deprecatedIn v1.33 is newer than removedIn v1.32"),
        "{msgs:#?}"
    );
    assert_eq!(d.len(), 4, "{d:#?}");
    // And a valid chain is fine.
    let d = diagnostics(&[
        ("a.yaml", cluster_doc("a", "v1.34.1", &promo("b"))),
        ("b.yaml", cluster_doc("b", "v1.34.1", "")),
    ]);
    assert!(d.is_empty(), "{d:#?}");
}

#[test]
fn what_the_refresh_could_not_read_is_a_warning_naming_it() {
    let d = one("v1.32.0", "", &[cp_pool("v1.13.9")]);
    let mut p = gathered();
    p.gather_errors.insert(
        "podDisruptionBudgets".into(),
        "listing poddisruptionbudgets: 403 Forbidden".into(),
    );
    let inv = with(observed("v1.31.4", 1, three_cps("v1.13.9")), p);
    let pl = plan(&d, &inv, &ctx(NOW));
    let f = finding(&pl, "observations/podDisruptionBudgets");
    assert_eq!(f.severity, Severity::Warning);
    assert!(f.message.contains("podDisruptionBudgets"), "{}", f.message);
    assert_eq!(f.evidence, ["listing poddisruptionbudgets: 403 Forbidden"]);
    // Without the error, no such finding.
    let inv = with(observed("v1.31.4", 1, three_cps("v1.13.9")), gathered());
    let pl = plan(&d, &inv, &ctx(NOW));
    assert!(
        !ids(&pl)
            .iter()
            .any(|(id, _)| id.starts_with("observations/")),
        "{:?}",
        ids(&pl)
    );
}

fn excluded(scope: &str) -> crate::desired::Desired {
    let block = format!(
        "  maintenance:\n    exclusions:\n      - name: freeze\n        from: \"2026-12-01T00:00:00Z\"\n        to: \"2026-12-10T00:00:00Z\"\n        scope: {scope}\n"
    );
    load(&[
        ("c1.yaml", cluster_doc("c1", "v1.34.1", &block)),
        ("pools.yaml", cp_pool("v1.13.9")),
    ])
}

fn exclusion_findings(p: &Plan) -> Vec<&Finding> {
    c1(p)
        .preflight
        .iter()
        .filter(|f| f.check == checks::EXCLUSION)
        .collect()
}

/// Issue #36 item 2: an exclusion in force that holds a change of the plan blocks it until the
/// exclusion ends (`until`: the daemon plans again then); one about to begin warns until its
/// start; `noMinorUpgrades` lets a patch plan through, `noUpgrades` does not.
#[test]
fn an_exclusion_in_force_blocks_until_it_ends_and_its_scope_decides_what_it_holds() {
    let minor = with(observed("v1.34.1", 1, three_cps("v1.12.11")), gathered());
    let d = excluded("noMinorUpgrades");
    let pl = plan(&d, &minor, &ctx("2026-12-03T00:00:00Z"));
    let f = finding(&pl, "exclusion/freeze");
    assert_eq!(f.severity, Severity::Blocking);
    assert_eq!(f.until, Some(ts("2026-12-10T00:00:00Z")));
    assert_eq!(
        crate::plan::preflight::next_expiry(&pl),
        Some(ts("2026-12-10T00:00:00Z"))
    );
    assert!(f.evidence[1].contains("(minor)"), "{:?}", f.evidence);
    // The plan notes what the exclusion holds, whatever the time.
    assert!(
        c1(&pl).notes.iter().any(
            |n| n.to_string().starts_with("maintenance exclusion `freeze`")
                && n.to_string().contains("(minor)")
        ),
        "{:?}",
        c1(&pl).notes
    );
    // At its end: nothing blocks.
    let after = plan(&d, &minor, &ctx("2026-12-10T00:00:00Z"));
    assert!(exclusion_findings(&after).is_empty());
    // An hour before it begins, inside the rollout's longest run: a warning until it begins.
    let before = plan(&d, &minor, &ctx("2026-11-30T23:00:00Z"));
    let w = finding(&before, "exclusion/freeze");
    assert_eq!(w.severity, Severity::Warning);
    assert_eq!(w.until, Some(ts("2026-12-01T00:00:00Z")));
    // A week before: nothing.
    let early = plan(&d, &minor, &ctx("2026-11-23T00:00:00Z"));
    assert!(exclusion_findings(&early).is_empty());

    // A patch plan: noMinorUpgrades lets it through, noUpgrades holds it.
    let patch = with(observed("v1.34.1", 1, three_cps("v1.13.2")), gathered());
    let pl = plan(&d, &patch, &ctx("2026-12-03T00:00:00Z"));
    assert!(
        exclusion_findings(&pl).is_empty(),
        "{:?}",
        c1(&pl).preflight
    );
    let held = plan(
        &excluded("noUpgrades"),
        &patch,
        &ctx("2026-12-03T00:00:00Z"),
    );
    assert_eq!(
        finding(&held, "exclusion/freeze").severity,
        Severity::Blocking
    );
}
