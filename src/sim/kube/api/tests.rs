use super::*;

#[test]
fn routes_follow_the_kubernetes_path_layout() {
    assert!(
        matches!(route("/api/v1/nodes", (1, 33), &[]), Ok(Route::Collection { rt, ns: None }) if rt.plural == "nodes")
    );
    assert!(
        matches!(route("/api/v1/nodes/w1", (1, 33), &[]), Ok(Route::Object { name, .. }) if name == "w1")
    );
    assert!(
        matches!(route("/api/v1/namespaces/default/pods", (1, 33), &[]), Ok(Route::Collection { ns: Some(ns), .. }) if ns == "default")
    );
    assert!(matches!(
        route("/api/v1/namespaces/default/pods/web-1/eviction", (1, 33), &[]),
        Ok(Route::Subresource { sub, .. }) if sub == "eviction"
    ));
    assert!(
        matches!(route("/api/v1/namespaces/kube-system", (1, 33), &[]), Ok(Route::Object { rt, .. }) if rt.plural == "namespaces")
    );
    assert!(
        matches!(route("/apis/apps/v1/namespaces/x/daemonsets/y", (1, 33), &[]), Ok(Route::Object { rt, .. }) if rt.plural == "daemonsets")
    );
    assert!(
        matches!(route("/apis/policy/v1", (1, 33), &[]), Ok(Route::ResourceList(g, v)) if g == "policy" && v == "v1")
    );
    // A namespaced resource has no cluster-scoped object path.
    assert!(route("/api/v1/pods/web-1", (1, 33), &[]).is_err());
    // a group the simulator does not serve (batch/v1 is served since issue #35)
    assert!(route("/apis/networking.k8s.io/v1/ingresses", (1, 33), &[]).is_err());
    assert!(matches!(
        route("/apis/batch/v1/namespaces/default/jobs/j", (1, 33), &[]),
        Ok(Route::Object { rt, .. }) if rt.kind == "Job"
    ));
    assert!(matches!(
        route("/api/v1/namespaces/default/pods/p/log", (1, 33), &[]),
        Ok(Route::Subresource { sub, .. }) if sub == "log"
    ));
    // flowcontrol's deprecated beta is served on 1.31, gone on 1.32
    assert!(matches!(
        route("/apis/flowcontrol.apiserver.k8s.io/v1beta3/flowschemas", (1, 31), &[]),
        Ok(Route::Collection { rt, .. }) if rt.version == "v1beta3"
    ));
    assert!(
        route(
            "/apis/flowcontrol.apiserver.k8s.io/v1beta3/flowschemas",
            (1, 32),
            &[]
        )
        .is_err()
    );
    assert!(matches!(
        route("/metrics", (1, 33), &[]),
        Ok(Route::Metrics)
    ));
}

#[test]
fn only_a_first_choice_table_accept_gets_a_table() {
    let mut h = HeaderMap::new();
    h.insert(
        header::ACCEPT,
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
            .parse()
            .unwrap(),
    );
    assert!(wants_table(&h));
    let mut h = HeaderMap::new();
    h.insert(header::ACCEPT, "application/json".parse().unwrap());
    assert!(!wants_table(&h));
}

#[test]
fn selector_transitions_turn_into_added_and_deleted() {
    use super::super::resources::PODS;
    let ev = super::super::store::Event {
        rv: 1,
        res: PODS.key(),
        kind: EventType::Modified,
        object: json!({"spec": {"nodeName": "w2"}}),
        old: Some(json!({"spec": {"nodeName": "w1"}})),
    };
    let on_w1 = |o: &Value| o.pointer("/spec/nodeName") == Some(&json!("w1"));
    let on_w2 = |o: &Value| o.pointer("/spec/nodeName") == Some(&json!("w2"));
    assert_eq!(event_line(&ev, &on_w1).unwrap()["type"], "DELETED");
    assert_eq!(event_line(&ev, &on_w2).unwrap()["type"], "ADDED");
}
