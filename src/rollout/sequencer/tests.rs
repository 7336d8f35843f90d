use super::*;
use crate::rollout::ports::EtcdMember;

fn kv(s: &str) -> KubeVersion {
    KubeVersion::parse(s).unwrap()
}
fn tv(s: &str) -> crate::version::TalosVersion {
    crate::version::TalosVersion::parse(s).unwrap()
}

#[test]
fn images_are_retagged_keeping_repository_and_flavour() {
    assert_eq!(
        split_image("registry.local:5000/k8s/kube-apiserver:v1.33.4"),
        ("registry.local:5000/k8s/kube-apiserver", Some("v1.33.4"))
    );
    assert_eq!(
        split_image("registry.local:5000/x"),
        ("registry.local:5000/x", None)
    );
    assert_eq!(
        split_image("ghcr.io/a/b:v1@sha256:abc"),
        ("ghcr.io/a/b", Some("v1"))
    );
    assert_eq!(
        image_version("ghcr.io/siderolabs/kubelet:v1.33.4-fat"),
        Some((kv("v1.33.4"), "-fat"))
    );
    assert_eq!(image_version("ghcr.io/siderolabs/kubelet:latest"), None);
    let to = kv("v1.34.1");
    assert_eq!(
        target_image(
            Component::Kubelet,
            Some("ghcr.io/siderolabs/kubelet:v1.33.4-slim"),
            &to
        ),
        "ghcr.io/siderolabs/kubelet:v1.34.1-slim"
    );
    assert_eq!(
        target_image(
            Component::ApiServer,
            Some("mirror:5000/kube-apiserver:v1.33.4"),
            &to
        ),
        "mirror:5000/kube-apiserver:v1.34.1"
    );
    assert_eq!(
        target_image(Component::Scheduler, None, &to),
        "registry.k8s.io/kube-scheduler:v1.34.1"
    );
}

/// The pre-check's support rule is the plan's (the catalog's), overrides included.
#[test]
fn talos_support_window() {
    let rollout = |to: &str, supported: Option<Vec<(u64, u64)>>| KubeRollout {
        from: kv("v1.30.0"),
        to: kv(to),
        control_plane: Vec::new(),
        workers: Vec::new(),
        health_timeout: Duration::from_secs(60),
        supported_talos: supported,
    };
    // Recorded by an older medea: the built-in catalog.
    assert!(rollout("v1.31.0", None).talos_supports_target(&tv("v1.13.9")));
    assert!(rollout("v1.36.4", None).talos_supports_target(&tv("v1.13.9")));
    assert!(!rollout("v1.37.0", None).talos_supports_target(&tv("v1.13.9")));
    assert!(!rollout("v1.30.9", None).talos_supports_target(&tv("v1.13.9")));
    // Talos 1.15 (in development) is catalogued: Kubernetes 1.33 to 1.38.
    assert!(rollout("v1.38.0", None).talos_supports_target(&tv("v1.15.0")));
    assert!(!rollout("v1.32.5", None).talos_supports_target(&tv("v1.15.0")));
    // A Talos minor the catalog does not know supports nothing (the planner refuses it too).
    assert!(!rollout("v1.39.0", None).talos_supports_target(&tv("v1.16.0")));
    assert!(!rollout("v1.38.0", None).talos_supports_target(&tv("v2.0.0")));
    // Recorded by the planner: exactly its list, which `upgradePolicy.kubernetesSupport`
    // may have extended beyond the built-in windows.
    let extended = rollout("v1.37.0", Some(vec![(1, 13), (1, 14)]));
    assert!(extended.talos_supports_target(&tv("v1.13.9")));
    assert!(extended.talos_supports_target(&tv("v1.14.0")));
    assert!(!extended.talos_supports_target(&tv("v1.12.11")));
}

#[test]
fn etcd_must_be_healthy_and_keep_quorum_without_one_member() {
    let m = |name: &str, healthy| EtcdMember {
        name: name.into(),
        learner: false,
        healthy,
        errors: vec![],
    };
    let h = |members| EtcdHealth {
        members,
        alarms: vec![],
        leader: None,
    };
    assert!(etcd_verdict(&h(vec![m("a", true), m("b", true), m("c", true)])).is_ok());
    assert!(
        etcd_verdict(&h(vec![m("a", true)])).is_ok(),
        "single node: accepted"
    );
    let e = etcd_verdict(&h(vec![m("a", true), m("b", true)])).unwrap_err();
    assert!(e.contains("2 members"), "{e}");
    let e = etcd_verdict(&h(vec![m("a", true), m("b", false), m("c", true)])).unwrap_err();
    assert!(e.contains("`b` is unhealthy"), "{e}");
    let mut learner = h(vec![m("a", true), m("b", true), m("c", true)]);
    learner.members[2].learner = true;
    assert!(etcd_verdict(&learner).unwrap_err().contains("learner"));
    let mut alarm = h(vec![m("a", true), m("b", true), m("c", true)]);
    alarm.alarms.push("a: NOSPACE".into());
    assert!(etcd_verdict(&alarm).unwrap_err().contains("NOSPACE"));
    assert!(etcd_verdict(&h(vec![])).is_err());
}

/// Issue #48: a control-plane node that is cordoned or draining counts as down in the quorum
/// gate, which is written once (`etcd_verdict_with`).
#[test]
fn a_cordoned_control_plane_counts_as_down_in_the_quorum_gate() {
    let m = |name: &str| EtcdMember {
        name: name.into(),
        learner: false,
        healthy: true,
        errors: vec![],
    };
    let h = |names: &[&str]| EtcdHealth {
        members: names.iter().map(|n| m(n)).collect(),
        alarms: vec![],
        leader: None,
    };
    let three = h(&["a", "b", "c"]);
    assert!(etcd_verdict_with(&three, &[]).is_ok());
    let e = etcd_verdict_with(&three, &["c".into()]).unwrap_err();
    assert!(
        e.contains("`c` is cordoned or draining (counted as down)") && e.contains("1 of 3"),
        "{e}"
    );
    // five members keep quorum with one away already, not with two
    let five = h(&["a", "b", "c", "d", "e"]);
    assert!(etcd_verdict_with(&five, &["e".into()]).is_ok());
    assert!(etcd_verdict_with(&five, &["d".into(), "e".into()]).is_err());
    // a name that is no member (a worker) counts nobody
    assert!(etcd_verdict_with(&three, &["w-1".into()]).is_ok());
    // a single member: nothing keeps its quorum, as before
    assert!(etcd_verdict_with(&h(&["a"]), &[]).is_ok());
}

#[test]
fn job_ids_are_plain() {
    assert!(JobId::parse("abc123-prod").is_some());
    assert!(JobId::parse("a/b").is_none());
    assert!(JobId::parse("").is_none());
    assert!(JobId::parse("a b").is_none());
    let id = JobId::for_plan(&PlanId::from_digest([0xab; 32]), "prod");
    assert_eq!(id.as_str(), "abababababab-prod");
}

#[test]
fn drains_journaled_before_the_policy_existed_keep_what_they_did() {
    // a `Drain` intent written by an older medea has no policy: it refused emptyDir and
    // bare pods, and so does its re-issue after an upgrade of medea
    let old: Action =
        serde_json::from_str(r#"{"op":"drain","node":"w-1","timeout_secs":600}"#).unwrap();
    assert!(
        matches!(&old, Action::Drain { policy, .. } if *policy == DrainPolicy::legacy()),
        "{old:?}"
    );
    let new = Action::Drain {
        node: "w-1".into(),
        timeout_secs: 600,
        policy: DrainPolicy {
            delete_empty_dir_data: true,
            evict_unmanaged_pods: false,
            skip_pods: [("app".to_string(), "local-path".to_string())].into(),
            volume_detach_timeout_secs: Some(300),
        },
    };
    let back: Action = serde_json::from_str(&serde_json::to_string(&new).unwrap()).unwrap();
    assert_eq!(back, new);
}

#[test]
fn command_keys_name_job_step_node_op_attempt() {
    let k = CommandKey {
        job: JobId::parse("j").unwrap(),
        step: 2,
        node: Some("cp-1".into()),
        op: CommandOp::Upgrade,
        attempt: 1,
    };
    assert_eq!(k.to_string(), "j/2/cp-1/upgrade/1");
}

#[test]
fn a_halt_keeps_its_text_in_reason_and_its_code_beside_it() {
    let state = JobState::Halted {
        reason: HaltReason::new(
            HaltCode::NodeReverted,
            "node reverted: `w-1` came back on v1",
        ),
        step: Some(0),
        node: Some("w-1".into()),
        op: None,
        at: "2026-12-03T12:00:00Z".parse().unwrap(),
    };
    let v = serde_json::to_value(&state).unwrap();
    assert_eq!(v["state"], "halted");
    assert_eq!(v["reason"], "node reverted: `w-1` came back on v1");
    assert_eq!(v["code"], "node_reverted");
    assert_eq!(serde_json::from_value::<JobState>(v).unwrap(), state);
    // a record written before halt codes existed
    let old: JobState = serde_json::from_str(
        r#"{"state":"halted","reason":"halted by bob","step":null,"node":null,"op":null,"at":"2026-12-03T12:00:00Z"}"#,
    )
    .unwrap();
    assert!(
        matches!(&old, JobState::Halted { reason, .. } if reason.code() == HaltCode::Unrecorded && reason.to_string() == "halted by bob"),
        "{old:?}"
    );
    assert_eq!(HaltCode::UpgradeRefused.as_str(), "upgrade_refused");
    assert_eq!(
        serde_json::to_value(HaltCode::UpgradeRefused).unwrap(),
        "upgrade_refused"
    );
}

/// A journaled image-patch task that names no component (a record this medea never writes)
/// halts the job as inconsistent instead of panicking the executor.
#[test]
fn a_patch_task_without_a_component_halts_the_job_as_inconsistent() {
    let now: Timestamp = "2026-12-03T12:00:00Z".parse().unwrap();
    let cp = NodeTarget {
        node: "cp-1".into(),
        address: "10.0.0.1".into(),
    };
    let mut ks = KubeStep::new(
        KubeRollout {
            from: kv("v1.34.1"),
            to: kv("v1.35.0"),
            control_plane: vec!["cp-1".into()],
            workers: vec![],
            health_timeout: Duration::from_secs(600),
            supported_talos: None,
        },
        vec![cp.clone()],
        vec![],
    );
    ks.since = Some(now);
    ks.tasks = KubeTasks::Planned(vec![KubeTask {
        op: KubeOp::Patch,
        node: cp.clone(),
        component: None,
        image: "registry.k8s.io/kube-apiserver:v1.35.0".into(),
        state: TaskState::Pending,
        since: None,
        attempt: 0,
        config_version: None,
    }]);
    let plan = PlanId::from_digest([7; 32]);
    let job = Job {
        id: JobId::for_plan(&plan, "home"),
        plan,
        cluster: "home".into(),
        created_at: now,
        windows: vec![],
        exclusions: vec![],
        predicted: None,
        control_plane: vec![cp],
        steps: vec![JobStep {
            state: StepState::Running,
            kind: StepKind::Kubernetes(ks),
        }],
        state: JobState::Running,
        generation: 1,
        snapshot: Some(SnapshotInfo {
            path: "/var/lib/medea/snapshots/j.db".into(),
            size: 1,
            sha256: "00".into(),
            encrypted: None,
        }),
        snapshot_attempts: 1,
        snapshot_recipients: Vec::new(),
        in_flight: None,
        journal_seq: 0,
        health: None,
        gates: Default::default(),
        applies: Vec::new(),
        hooks: None,
        hook_runs: Default::default(),
        clock: Default::default(),
    };
    let t = step(&job, &Observations::default(), now);
    assert!(matches!(t.next, Next::Finished), "{:?}", t.next);
    assert!(
        matches!(
            &t.job.state,
            JobState::Halted { reason, node: Some(n), op: Some(CommandOp::SetImage), .. }
                if reason.code() == HaltCode::Inconsistent
                    && n == "cp-1"
                    && reason.to_string().contains("names no component")
        ),
        "{:?}",
        t.job.state
    );
}

/// Issue #48 item 7: the volumes of a node's drains add up from its cordon on (a drain that a
/// PodDisruptionBudget held evicted some pods already); one drain without them (its outcome
/// lost, or a port that does not report them) makes every attachment count.
#[test]
fn drain_volumes_add_up_and_a_lost_drain_makes_every_attachment_count() {
    let mut v = DrainVolumes::Known {
        volumes: Vec::new(),
    };
    assert!(!v.covers(Some("pv-a")));
    v.add(Some(&["pv-b".to_string(), "pv-a".to_string()]));
    v.add(Some(&["pv-a".to_string(), "pv-c".to_string()]));
    assert_eq!(
        v,
        DrainVolumes::Known {
            volumes: vec!["pv-a".into(), "pv-b".into(), "pv-c".into()]
        }
    );
    assert!(v.covers(Some("pv-c")) && !v.covers(Some("pv-d")) && !v.covers(None));
    v.add(None);
    assert_eq!(v, DrainVolumes::Unknown);
    assert!(v.covers(Some("pv-d")) && v.covers(None));
    v.add(Some(&["pv-e".to_string()]));
    assert_eq!(v, DrainVolumes::Unknown, "unknown stays unknown");
    // a journal written before drains reported volumes still reads
    let old: DrainOutcome = serde_json::from_str(r#"{"result":"drained"}"#).unwrap();
    assert_eq!(old, DrainOutcome::Drained { volumes: None });
}
