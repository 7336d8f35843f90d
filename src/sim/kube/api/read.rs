//! The read verbs: list (with label/field selectors, paging and tables), watch (replayed
//! start plus newline-delimited `WatchEvent` stream), and `SelfSubjectAccessReview` answers.

use super::*;

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

fn continue_key(obj: &Value) -> String {
    format!("{}/{}", ns_of(obj), name_of(obj))
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
    let mut items: Vec<Value> = c
        .store
        .list(rt, ns)
        .filter(|o| labels.matches_object(o) && fields.matches(o))
        .filter(|o| after.as_ref().is_none_or(|a| continue_key(o) > *a))
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
