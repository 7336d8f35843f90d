//! Plan identity, staleness and the rendered summary.

use super::*;

// ---------------------------------------------------------------- identity and staleness

#[test]
fn same_inputs_same_id_any_basis_change_makes_it_stale() {
    let d = one("v1.35.0", "", &[cp_pool("v1.13.9")]);
    let i = observed("v1.34.1", 4, three_cps("v1.12.4"));
    let a = plan_ok(&d, &i);
    let b = plan_ok(&d, &i);
    assert_eq!(a.id, b.id);
    assert_eq!(
        render::text(&a, Default::default()),
        render::text(&b, Default::default())
    );
    assert_eq!(render::json(&a), render::json(&b));
    assert_eq!(a.basis, basis_of(&d, &i, &LastApplied::default()));
    assert!(!a.is_stale(&a.basis));

    // The parent is not part of the id.
    let with_parent = compute(&d, &i, &LastApplied::default(), Some(a.id)).unwrap();
    assert_eq!(with_parent.id, a.id);

    // Observed generation.
    let mut i2 = i.clone();
    std::sync::Arc::make_mut(i2.clusters.get_mut("c1").unwrap()).generation += 1;
    let c = plan_ok(&d, &i2);
    assert_ne!(c.id, a.id);
    assert!(a.is_stale(&c.basis));
    // Desired revision (a comment changes nothing but the revision).
    let d2 = load(&[
        ("c1.yaml", cluster_doc("c1", "v1.35.0", "# a comment\n")),
        ("pools.yaml", cp_pool("v1.13.9")),
    ]);
    let e = plan_ok(&d2, &i);
    assert_ne!(e.id, a.id);
    assert!(a.is_stale(&e.basis));
    // Last-applied state.
    let f = compute(&d, &i, &applied_of(&d), None).unwrap();
    assert_ne!(f.id, a.id);
    assert!(a.is_stale(&f.basis));
}

#[test]
fn the_summary_line_names_the_id_and_the_approve_command() {
    let d = one("v1.34.1", "", &[worker_pool(6, 2)]);
    let p = plan_ok(&d, &observed("v1.34.1", 1, workers(6, "v1.12.4")));
    let short = p.id.short();
    assert_eq!(
        render::summary_line(&p),
        format!(
            "Plan {short}: 1 rollout (6 machines), 2 settings changes. Approve with: medea approve {short}"
        )
    );
    assert!(
        render::sign_command(&p)
            .starts_with(&format!("echo {} | ssh-keygen -Y sign", p.id.to_hex()))
    );
    let colored = render::text(&p, render::Options { color: true });
    assert!(colored.contains("\x1b[33m~ pool workers"), "{colored}");
    assert!(!render::text(&p, Default::default()).contains('\x1b'));
}

/// Issue #34: a plan's state is a `PlanState`; past `pending` the closing line says what
/// became of the plan (`PlanState::sentence`) and neither the text nor the JSON offers the
/// approve or sign command. A blocked plan keeps its "cannot be approved" line and says so.
#[test]
fn past_pending_a_rendered_plan_says_its_state_and_offers_no_approval() {
    use crate::plan::PlanState;
    use crate::plan::preflight::{Finding, Severity};
    let d = one("v1.34.1", "", &[worker_pool(6, 2)]);
    let p = plan_ok(&d, &observed("v1.34.1", 1, workers(6, "v1.12.4")));
    let short = p.id.short();
    let head = format!("Plan {short}: 1 rollout (6 machines), 2 settings changes");
    let o = render::Options::default();
    for state in PlanState::ALL {
        let text = render::text_in_state(&p, o, state);
        let json: serde_json::Value =
            serde_json::from_str(&render::json_in_state(&p, state)).unwrap();
        assert_eq!(json["state"], state.as_str());
        match state.sentence() {
            None => {
                assert!(
                    text.contains(&format!("{head}. Approve with: medea approve {short}\n")),
                    "{state}: {text}"
                );
                assert!(text.contains("To sign without the API:"), "{state}: {text}");
                assert_eq!(json["approveCommand"], format!("medea approve {short}"));
                assert!(json["signCommand"].is_string(), "{state}: {json}");
            }
            Some(sentence) => {
                // a running plan names the command that follows its cluster's job (issue #51)
                let sentence = if state == PlanState::Running {
                    format!(
                        "{sentence}: follow it with `medea rollout status -w --cluster {}`",
                        p.clusters[0].cluster
                    )
                } else {
                    sentence.to_string()
                };
                assert!(
                    text.contains(&format!("{head}. This plan is {sentence}.\n")),
                    "{state}: {text}"
                );
                assert!(!text.contains("Approve with:"), "{state}: {text}");
                assert!(
                    !text.contains("To sign without the API:"),
                    "{state}: {text}"
                );
                assert!(json["approveCommand"].is_null(), "{state}: {json}");
                assert!(json["signCommand"].is_null(), "{state}: {json}");
            }
        }
    }
    assert!(!render::json(&p).contains("\"state\""));

    let mut blocked = p.clone();
    std::sync::Arc::make_mut(&mut blocked.clusters[0])
        .preflight
        .push(Finding {
            id: "etcd/alarm/CORRUPT/1".into(),
            check: "etcd".into(),
            severity: Severity::Blocking,
            message: "etcd member 1 has alarm CORRUPT".into(),
            evidence: vec![],
            help: String::new(),
            acknowledged: false,
            until: None,
        });
    let cannot = format!(
        "{head}. It cannot be approved: 1 blocking preflight finding (see `preflight:` above); fix it and replan, or acknowledge it under `spec.preflight.acknowledge`"
    );
    assert_eq!(render::summary_line(&blocked), cannot);
    let text = render::text_in_state(&blocked, o, PlanState::Blocked);
    assert!(
        text.contains(&format!(
            "{cannot}. This plan is {}.\n",
            PlanState::Blocked.sentence().unwrap()
        )),
        "{text}"
    );
    let text = render::text_in_state(&blocked, o, PlanState::Pending);
    assert!(text.contains(&format!("{cannot}\n")), "{text}");
    assert!(!text.contains("To sign without the API:"), "{text}");
}
