//! The read verbs: list (with label/field selectors, paging and tables), watch (replayed
//! start plus newline-delimited `WatchEvent` stream), and `SelfSubjectAccessReview` answers.

use super::*;
use crate::sim::kube::store::Store;

/// Answer a `SelfSubjectAccessReview`: allowed unless a [`super::super::KubeFault::Forbidden`] fault
/// takes the permission away. Non-resource requests are always allowed.
pub(super) fn access_review(c: &KubeSide, mut review: Value) -> Value {
    let attrs = review
        .pointer("/spec/resourceAttributes")
        .cloned()
        .unwrap_or(Value::Null);
    let field = |k: &str| attrs.get(k).and_then(Value::as_str).unwrap_or("");
    let allowed = attrs.is_null()
        || !c.forbids(
            field("verb"),
            field("group"),
            field("resource"),
            field("subresource"),
        );
    review["apiVersion"] = json!("authorization.k8s.io/v1");
    review["kind"] = json!("SelfSubjectAccessReview");
    review["metadata"] = json!({ "creationTimestamp": null });
    review["status"] = if allowed {
        json!({
            "allowed": true,
            "reason": format!(
                "RBAC: allowed by ClusterRoleBinding \"medea-sim-admin\" of ClusterRole \"cluster-admin\" to User \"{}\"",
                super::super::status::SIM_USER
            ),
        })
    } else {
        json!({ "allowed": false })
    };
    review
}

/// `GET …/pods/<name>/log`: what the simulated container printed, as text. The simulator's
/// containers print who they are, their command and the value of each environment variable
/// the pod spec sets with a literal `value` (what a hook Job passes, `NODE=…`), and, once
/// ended, their exit. `container` picks one of several containers (required then, as the
/// kubelet's log handler asks: "a container name must be specified"); `tailLines` keeps the
/// last lines; `follow` answers what there is and ends the stream (the simulator does not
/// keep it open while a container runs). A container that has not started answers 400
/// "is waiting to start" (kubernetes `pkg/kubelet/kubelet_pods.go` `validateContainerLogStatus`).
pub(super) fn pod_log(
    c: &KubeSide,
    ns: &str,
    name: &str,
    q: &HashMap<String, String>,
) -> Result<Response> {
    let pod = c
        .store
        .get(&PODS, ns, name)
        .ok_or_else(|| ApiError::not_found(&PODS, name))?;
    let containers: Vec<&Value> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(|c| c.iter().collect())
        .unwrap_or_default();
    let names: Vec<&str> = containers
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    let container = match q.get("container").filter(|c| !c.is_empty()) {
        Some(wanted) => containers
            .iter()
            .find(|c| c["name"] == json!(wanted))
            .copied()
            .ok_or_else(|| {
                ApiError::bad_request(format!("container {wanted} is not valid for pod {name}"))
            })?,
        None => match containers.as_slice() {
            [one] => one,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "a container name must be specified for pod {name}, choose one of: [{}]",
                    names.join(" ")
                )));
            }
        },
    };
    let cname = container["name"].as_str().unwrap_or("");
    let status = pod
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|s| s["name"] == json!(cname)));
    let state = status.and_then(|s| s.get("state"));
    let running = state.and_then(|s| s.get("running"));
    let terminated = state.and_then(|s| s.get("terminated"));
    if running.is_none() && terminated.is_none() {
        let why = state
            .and_then(|s| s.pointer("/waiting/reason"))
            .and_then(Value::as_str)
            .unwrap_or("ContainerCreating");
        return Err(ApiError::bad_request(format!(
            "container \"{cname}\" in pod \"{name}\" is waiting to start: {why}"
        )));
    }
    let words = |key: &str| -> Vec<String> {
        container
            .get(key)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut lines = vec![format!(
        "sim: container {cname} ({}) of pod {ns}/{name} started on node {}",
        container["image"].as_str().unwrap_or(""),
        pod.pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or("")
    )];
    let command: Vec<String> = words("command").into_iter().chain(words("args")).collect();
    if !command.is_empty() {
        lines.push(format!("sim: running {}", command.join(" ")));
    }
    for env in container
        .get("env")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let (Some(k), Some(v)) = (env["name"].as_str(), env["value"].as_str()) {
            lines.push(format!("{k}={v}"));
        }
    }
    if let Some(t) = terminated {
        lines.push(format!(
            "sim: exited with code {}",
            t["exitCode"].as_i64().unwrap_or(0)
        ));
    }
    if let Some(n) = q.get("tailLines").and_then(|n| n.parse::<usize>().ok()) {
        let skip = lines.len().saturating_sub(n);
        lines.drain(..skip);
    }
    let mut text = lines.join("\n");
    if !lines.is_empty() {
        text.push('\n');
    }
    Ok((StatusCode::OK, [(header::CONTENT_TYPE, "text/plain")], text).into_response())
}

fn continue_key(obj: &Value) -> String {
    format!("{}/{}", ns_of(obj), name_of(obj))
}

/// The objects of `rt` (in `ns`) that both selectors match, in store order (namespace, name).
/// A pod list pinned to one node by `spec.nodeName=X` reads that node's pods from the store's
/// index (what the real apiserver's watch cache does with its `spec.nodeName` indexer); every
/// requirement is still checked on each candidate, so the answer is the full scan's.
pub(in crate::sim::kube) fn select<'a>(
    store: &'a Store,
    rt: &'static ResourceType,
    ns: Option<&'a str>,
    labels: &'a LabelSelector,
    fields: &'a FieldSelector,
) -> Box<dyn Iterator<Item = &'a Value> + 'a> {
    let candidates: Box<dyn Iterator<Item = &'a Value> + 'a> =
        match fields.node_name().filter(|_| rt.key() == PODS.key()) {
            Some(node) => Box::new(store.pods_on_node(node, ns)),
            None => Box::new(store.list(rt, ns)),
        };
    Box::new(candidates.filter(move |o| labels.matches_object(o) && fields.matches(o)))
}

/// [`select`] by scanning every object of the type and matching labels on a copy of them (the
/// reference the index and the in-place label match must equal).
#[cfg(test)]
pub(in crate::sim::kube) fn select_scan<'a>(
    store: &'a Store,
    rt: &'static ResourceType,
    ns: Option<&'a str>,
    labels: &'a LabelSelector,
    fields: &'a FieldSelector,
) -> impl Iterator<Item = &'a Value> + 'a {
    store.list(rt, ns).filter(move |o| {
        labels.matches(&crate::sim::kube::selector::labels_of(o)) && fields.matches(o)
    })
}

pub(super) fn list(
    c: &KubeSide,
    rt: &'static ResourceType,
    ns: Option<&str>,
    headers: &HeaderMap,
    q: &HashMap<String, String>,
    wall: jiff::Timestamp,
) -> Result<Response> {
    let labels = LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(e.0))?;
    let fields = FieldSelector::parse(rt, q.get("fieldSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(e.0))?;
    let after = match q.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(token)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| ApiError::bad_request("invalid continue token"))?,
        ),
        None => None,
    };
    let limit: usize = q
        .get("limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let mut items: Vec<Value> = select(&c.store, rt, ns, &labels, &fields)
        // the token names the last object returned (`namespace/name`; a namespace holds no
        // `/`): resume after it in the store's (namespace, name) order. Comparing the joined
        // strings instead skipped a namespace that sorts after another it starts with
        // (`app` then `app-staging`: `app-staging/x` < `app/y` as strings).
        .filter(|o| {
            after.as_ref().is_none_or(|a| {
                let (a_ns, a_name) = a.split_once('/').unwrap_or(("", a.as_str()));
                (ns_of(o), name_of(o)) > (a_ns, a_name)
            })
        })
        .cloned()
        .collect();
    let mut continue_token = None;
    let mut remaining = 0;
    if items.len() > limit {
        remaining = items.len() - limit;
        items.truncate(limit);
        continue_token = items
            .last()
            .map(|o| base64::engine::general_purpose::STANDARD.encode(continue_key(o)));
    }
    let rv = c.store.resource_version().to_string();
    if wants_table(headers) {
        let include = q.get("includeObject").map_or("Metadata", String::as_str);
        return Ok(json_response(
            StatusCode::OK,
            &table::table(rt, &items, &rv, continue_token.as_deref(), include, wall),
        ));
    }
    let mut metadata = json!({ "resourceVersion": rv });
    if let Some(token) = continue_token {
        metadata["continue"] = json!(token);
        metadata["remainingItemCount"] = json!(remaining);
    }
    if wants_metadata_only(headers) {
        // k8s.io/apiserver `pkg/endpoints/handlers/response.go`: objects reduced to their
        // metadata (what `kubectl get` and medea use for metadata-only lists)
        let items: Vec<Value> = items
            .iter()
            .map(|o| {
                json!({
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": o.get("metadata").cloned().unwrap_or(json!({})),
                })
            })
            .collect();
        return Ok(json_response(
            StatusCode::OK,
            &json!({
                "kind": "PartialObjectMetadataList",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": metadata,
                "items": items,
            }),
        ));
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "kind": rt.list_kind(),
            "apiVersion": rt.api_version(),
            "metadata": metadata,
            "items": items,
        }),
    ))
}

/// A watch: replay (or synthesize) the start, then stream events as newline-delimited
/// `WatchEvent` JSON until `timeoutSeconds` or the client goes away.
#[allow(
    clippy::expect_used,
    reason = "a poisoned cluster lock means a simulator thread panicked mid-update; serving its half-updated state would be worse than stopping"
)]
pub(super) fn watch(
    shared: &Arc<Shared>,
    rt: &'static ResourceType,
    ns: Option<String>,
    q: &HashMap<String, String>,
) -> Result<Response> {
    let labels = LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(e.0))?;
    let fields = FieldSelector::parse(rt, q.get("fieldSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(e.0))?;
    let matches = move |o: &Value| {
        ns.as_deref().is_none_or(|n| n == ns_of(o)) && labels.matches_object(o) && fields.matches(o)
    };
    let send_initial = true_param(q, "sendInitialEvents");
    let bookmarks = true_param(q, "allowWatchBookmarks");
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs);
    let rv = q.get("resourceVersion").cloned().unwrap_or_default();
    let mut initial: Vec<Value> = Vec::new();
    let (mut rx, current_rv) = {
        let c = shared.cluster.lock().expect("cluster lock");
        let current_rv = c.store.resource_version();
        if rv.is_empty() || rv == "0" || send_initial {
            for o in c.store.list(rt, None).filter(|o| matches(o)) {
                initial.push(json!({"type": "ADDED", "object": o}));
            }
            (c.store.subscribe(), current_rv)
        } else {
            let since: u64 = rv
                .parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion `{rv}`")))?;
            match c.store.watch_from(since) {
                Some((rx, replay)) => {
                    for ev in replay.iter().filter(|e| e.res == rt.key()) {
                        if let Some(line) = event_line(ev, &matches) {
                            initial.push(line);
                        }
                    }
                    (rx, current_rv)
                }
                None => {
                    let gone =
                        ApiError::gone(format!("too old resource version: {since} ({current_rv})"));
                    initial.push(json!({"type": "ERROR", "object": gone.to_status()}));
                    let body = initial.iter().map(|l| format!("{l}\n")).collect::<String>();
                    return Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response());
                }
            }
        }
    };
    if send_initial && bookmarks {
        initial.push(json!({
            "type": "BOOKMARK",
            "object": {
                "kind": rt.kind,
                "apiVersion": rt.api_version(),
                "metadata": {
                    "resourceVersion": current_rv.to_string(),
                    "annotations": {"k8s.io/initial-events-end": "true"},
                },
            },
        }));
    }
    let (tx, body_rx) = tokio::sync::mpsc::channel::<std::result::Result<Bytes, Infallible>>(64);
    let key = rt.key();
    tokio::spawn(async move {
        for line in initial {
            if tx.send(Ok(Bytes::from(format!("{line}\n")))).await.is_err() {
                return;
            }
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let ev = tokio::select! {
                ev = rx.recv() => ev,
                _ = tx.closed() => return,
                _ = async {
                    match deadline {
                        Some(d) => tokio::time::sleep_until(d).await,
                        None => std::future::pending().await,
                    }
                } => return,
            };
            match ev {
                Ok(ev) if ev.res == key => {
                    if let Some(line) = event_line(&ev, &matches)
                        && tx.send(Ok(Bytes::from(format!("{line}\n")))).await.is_err()
                    {
                        return;
                    }
                }
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    let gone = ApiError::gone("the watch fell behind; relist");
                    let _ = tx
                        .send(Ok(Bytes::from(format!(
                            "{}\n",
                            json!({"type": "ERROR", "object": gone.to_status()})
                        ))))
                        .await;
                    return;
                }
                Err(_) => return,
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(body_rx);
    Ok((
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(stream),
    )
        .into_response())
}

/// The watch line for an event under a selector, with selector transitions (an object that
/// stops matching is DELETED for this watch; one that starts matching is ADDED).
pub(super) fn event_line(
    ev: &super::super::store::Event,
    matches: &impl Fn(&Value) -> bool,
) -> Option<Value> {
    let now = matches(&ev.object);
    let kind = match ev.kind {
        EventType::Added | EventType::Deleted => now.then_some(ev.kind),
        EventType::Modified => {
            let before = ev.old.as_ref().map_or(now, matches);
            match (before, now) {
                (true, true) => Some(EventType::Modified),
                (false, true) => Some(EventType::Added),
                (true, false) => Some(EventType::Deleted),
                (false, false) => None,
            }
        }
    }?;
    Some(json!({"type": kind.as_str(), "object": ev.object}))
}

/// Whether the client asked for a `PartialObjectMetadataList` first (`Accept:
/// application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1`).
fn wants_metadata_only(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| {
            v.split(',')
                .next()
                .is_some_and(|first| first.contains("as=PartialObjectMetadataList"))
        })
}

#[cfg(test)]
mod index_tests {
    //! The pods-by-node index against the full scan, after random pod creates, updates
    //! (binds, rebinds, unbinds, label and phase changes) and deletes.

    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::{select, select_scan};
    use crate::sim::kube::resources::{CONFIGMAPS, PODS};
    use crate::sim::kube::selector::{FieldSelector, LabelSelector};
    use crate::sim::kube::store::Store;

    #[derive(Debug, Clone)]
    enum Op {
        /// Create, or replace when the pod exists (`Store::put`).
        Put {
            ns: usize,
            name: usize,
            node: usize,
            app: usize,
            running: bool,
        },
        Delete {
            ns: usize,
            name: usize,
        },
    }

    const NAMESPACES: [&str; 2] = ["default", "kube-system"];
    /// `spec.nodeName` as written: absent, empty, null, a number, or a node.
    fn node_field(i: usize) -> Option<Value> {
        match i {
            0 => None,
            1 => Some(json!("")),
            2 => Some(Value::Null),
            3 => Some(json!(7)),
            n => Some(json!(format!("w{}", n - 3))),
        }
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0..2usize, 0..6usize, 0..7usize, 0..2usize, any::<bool>()).prop_map(
                |(ns, name, node, app, running)| Op::Put { ns, name, node, app, running }
            ),
            1 => (0..2usize, 0..6usize).prop_map(|(ns, name)| Op::Delete { ns, name }),
        ]
    }

    fn now() -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_700_000_000).expect("a valid timestamp")
    }

    fn apply(store: &mut Store, op: &Op) {
        match op {
            Op::Put {
                ns,
                name,
                node,
                app,
                running,
            } => {
                let mut spec = json!({"containers": [{"name": "c", "image": "i"}]});
                if let Some(n) = node_field(*node) {
                    spec["nodeName"] = n;
                }
                let app = ["a", "b"][*app];
                let pod = json!({
                    "metadata": {
                        "name": format!("p{name}"),
                        "namespace": NAMESPACES[*ns],
                        "labels": {"app": app},
                    },
                    "spec": spec,
                    "status": {"phase": if *running { "Running" } else { "Pending" }},
                });
                store.put(&PODS, pod, now());
            }
            Op::Delete { ns, name } => {
                store.delete(&PODS, NAMESPACES[*ns], &format!("p{name}"));
            }
        }
    }

    const FIELDS: [&str; 9] = [
        "",
        "spec.nodeName=w1",
        "spec.nodeName==w2",
        "spec.nodeName=",
        "spec.nodeName=7",
        "spec.nodeName=w3,status.phase=Running",
        "spec.nodeName!=w1",
        "spec.nodeName=w1,spec.nodeName=w2",
        "status.phase!=Running,spec.nodeName=w2",
    ];
    const LABELS: [&str; 3] = ["", "app=a", "app in (a,b),app!=b"];

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn an_index_served_list_equals_the_full_scan(ops in proptest::collection::vec(op(), 1..40)) {
            let mut store = Store::new(3);
            // an object of another type with the same names, which a pod list never returns
            store
                .create(
                    &CONFIGMAPS,
                    json!({"metadata": {"name": "p0", "namespace": "default"}, "spec": {"nodeName": "w1"}}),
                    now(),
                )
                .expect("a fresh store");
            for op in &ops {
                apply(&mut store, op);
                for f in FIELDS {
                    let fields = FieldSelector::parse(&PODS, f).expect("a valid field selector");
                    for l in LABELS {
                        let labels = LabelSelector::parse(l).expect("a valid label selector");
                        for ns in [None, Some("default"), Some("kube-system"), Some("other")] {
                            let indexed: Vec<&Value> =
                                select(&store, &PODS, ns, &labels, &fields).collect();
                            let scanned: Vec<&Value> =
                                select_scan(&store, &PODS, ns, &labels, &fields).collect();
                            prop_assert_eq!(indexed, scanned, "fields {:?} labels {:?} ns {:?}", f, l, ns);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_node_list_reads_only_that_nodes_pods() {
        let mut store = Store::new(1);
        for (i, node) in ["w1", "w2", "w1", ""].iter().enumerate() {
            apply(
                &mut store,
                &Op::Put {
                    ns: i % 2,
                    name: i,
                    node: match *node {
                        "" => 0,
                        n => n[1..].parse::<usize>().expect("wN") + 3,
                    },
                    app: 0,
                    running: true,
                },
            );
        }
        let names = |store: &Store, node: &str| -> Vec<String> {
            store
                .pods_on_node(node, None)
                .map(|p| p["metadata"]["name"].as_str().unwrap_or("").to_string())
                .collect()
        };
        assert_eq!(names(&store, "w1"), ["p0", "p2"]);
        assert_eq!(names(&store, "w2"), ["p1"]);
        assert_eq!(names(&store, ""), ["p3"]);
        assert!(names(&store, "w9").is_empty());
        // a rebind moves the pod between nodes; a delete drops it
        apply(
            &mut store,
            &Op::Put {
                ns: 0,
                name: 0,
                node: 5,
                app: 0,
                running: true,
            },
        );
        assert_eq!(names(&store, "w1"), ["p2"]);
        assert_eq!(names(&store, "w2"), ["p0", "p1"]);
        apply(&mut store, &Op::Delete { ns: 1, name: 1 });
        assert_eq!(names(&store, "w2"), ["p0"]);
    }
}
