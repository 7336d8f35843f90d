//! Server-side apply, simplified but honest: each field manager owns the leaf fields of the
//! configuration it last applied. Applying sets those fields, removes fields the manager
//! owned before and no longer sets (unless another manager owns them), and refuses with a
//! conflict when another manager owns a field with a different value, unless `force` is set,
//! which transfers ownership.
//!
//! Limit (documented in design/k8s.md): lists are atomic (owned and replaced as a whole);
//! the real apiserver merges lists that have merge keys (containers by `name`, ...).
//! Merge patches (`application/merge-patch+json`, and strategic merge patches, which are
//! treated the same way after dropping `$`-directives) are RFC 7386.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

/// A field path, `["spec", "replicas"]`.
pub(crate) type Path = Vec<String>;

/// Metadata fields that identify the object and are never owned.
const IDENTITY: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
];

/// The leaf paths a configuration sets (maps recurse; anything else is a leaf).
pub(crate) fn leaf_paths(config: &Value) -> Vec<Path> {
    fn walk(v: &Value, prefix: &mut Path, out: &mut Vec<Path>) {
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, child) in m {
                    if prefix.len() == 1
                        && prefix[0] == "metadata"
                        && IDENTITY.contains(&k.as_str())
                    {
                        continue;
                    }
                    if prefix.is_empty() && matches!(k.as_str(), "apiVersion" | "kind" | "status") {
                        continue;
                    }
                    prefix.push(k.clone());
                    walk(child, prefix, out);
                    prefix.pop();
                }
            }
            _ => {
                if !prefix.is_empty() {
                    out.push(prefix.clone());
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(config, &mut Vec::new(), &mut out);
    out
}

pub(crate) fn get_path<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |cur, k| cur.get(k))
}

/// Remove the field at `path`, then any maps left empty by that (never the root).
pub(crate) fn remove_path(v: &mut Value, path: &[String]) {
    fn go(v: &mut Value, path: &[String]) {
        let Some((first, rest)) = path.split_first() else {
            return;
        };
        let Some(m) = v.as_object_mut() else { return };
        if rest.is_empty() {
            m.remove(first);
            return;
        }
        if let Some(child) = m.get_mut(first) {
            go(child, rest);
            if child.as_object().is_some_and(Map::is_empty) {
                m.remove(first);
            }
        }
    }
    go(v, path);
}

/// Deep-merge `applied` into `live`: maps merge, everything else is replaced.
pub(crate) fn merge_into(live: &mut Value, applied: &Value) {
    match (live, applied) {
        (Value::Object(l), Value::Object(a)) => {
            for (k, av) in a {
                match l.get_mut(k) {
                    Some(lv) if lv.is_object() && av.is_object() => merge_into(lv, av),
                    _ => {
                        l.insert(k.clone(), av.clone());
                    }
                }
            }
        }
        (live, applied) => *live = applied.clone(),
    }
}

/// RFC 7386 JSON merge patch (`null` deletes). Keys starting with `$` (strategic merge
/// patch directives) are dropped.
#[allow(
    clippy::expect_used,
    reason = "the value was replaced by an empty object just above when it was not one"
)]
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().expect("made an object above");
    for (k, v) in p {
        if k.starts_with('$') {
            continue;
        }
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

#[allow(
    clippy::expect_used,
    reason = "each level was replaced by an empty object just above when it was not one"
)]
fn set_path(v: &mut Value, path: &[String], value: Value) {
    let Some((last, init)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for k in init {
        if !cur.is_object() {
            *cur = json!({});
        }
        cur = cur
            .as_object_mut()
            .expect("made an object above")
            .entry(k.clone())
            .or_insert_with(|| json!({}));
    }
    if !cur.is_object() {
        *cur = json!({});
    }
    cur.as_object_mut()
        .expect("made an object above")
        .insert(last.clone(), value);
}

/// Record an `Update` (create, replace, merge patch) by `manager` in `owners`, as the
/// apiserver's field manager does for non-apply writes (k8s.io/apiserver
/// `pkg/endpoints/handlers/fieldmanager`, structured-merge-diff `Updater.Update`): the manager
/// comes to own every leaf field whose value the write set or changed, and those fields leave
/// every other manager; fields the write removed leave every manager.
pub(crate) fn record_update(
    before: Option<&Value>,
    after: &Value,
    owners: &mut BTreeMap<String, Value>,
    manager: &str,
) {
    let after_paths = leaf_paths(after);
    let changed: Vec<&Path> = after_paths
        .iter()
        .filter(|p| before.and_then(|b| get_path(b, p)) != get_path(after, p))
        .collect();
    let removed: Vec<Path> = before
        .map(leaf_paths)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| get_path(after, p).is_none())
        .collect();
    for (m, cfg) in owners.iter_mut() {
        for p in removed
            .iter()
            .chain(changed.iter().copied().filter(|_| m.as_str() != manager))
        {
            remove_path(cfg, p);
        }
    }
    let mine = owners
        .entry(manager.to_string())
        .or_insert_with(|| json!({}));
    for p in changed {
        if let Some(v) = get_path(after, p) {
            set_path(mine, p, v.clone());
        }
    }
    owners.retain(|_, cfg| !leaf_paths(cfg).is_empty());
}

/// `fieldsV1` for the leaf paths of a configuration (`{"f:spec":{"f:replicas":{}}}`).
#[allow(
    clippy::expect_used,
    reason = "fieldsV1 nodes are built as objects in this function"
)]
pub(crate) fn fields_v1(config: &Value) -> Value {
    let mut root = json!({});
    for path in leaf_paths(config) {
        let mut cur = &mut root;
        for k in path {
            cur = cur
                .as_object_mut()
                .expect("fieldsV1 nodes are objects")
                .entry(format!("f:{k}"))
                .or_insert_with(|| json!({}));
        }
    }
    root
}

/// A field owned by another manager with a different value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Conflict {
    pub manager: String,
    /// `.spec.replicas`
    pub field: String,
}

fn overlaps(a: &[String], b: &[String]) -> bool {
    let n = a.len().min(b.len());
    a[..n] == b[..n]
}

/// Apply `config` as `manager` to `live` (None = create). `owners` maps every manager to
/// the configuration it owns. On success returns the new live object (without server
/// metadata) and updates `owners`.
pub(crate) fn apply(
    live: Option<&Value>,
    config: &Value,
    owners: &mut BTreeMap<String, Value>,
    manager: &str,
    force: bool,
) -> Result<Value, Vec<Conflict>> {
    let mut config = config.clone();
    if let Some(m) = config.as_object_mut() {
        m.remove("status");
        if let Some(meta) = m.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
            meta.remove("resourceVersion");
        }
    }
    let new_paths = leaf_paths(&config);
    let mut conflicts = Vec::new();
    let mut transfers: Vec<(String, Path)> = Vec::new();
    if let Some(live) = live {
        for (other, owned) in owners.iter() {
            if other == manager {
                continue;
            }
            for owned_path in leaf_paths(owned) {
                for new_path in &new_paths {
                    if !overlaps(&owned_path, new_path) {
                        continue;
                    }
                    let differs = get_path(live, new_path) != get_path(&config, new_path);
                    if differs {
                        if force {
                            transfers.push((other.clone(), owned_path.clone()));
                        } else {
                            conflicts.push(Conflict {
                                manager: other.clone(),
                                field: format!(".{}", new_path.join(".")),
                            });
                        }
                    }
                }
            }
        }
    }
    if !conflicts.is_empty() {
        conflicts.sort_by(|a, b| (&a.manager, &a.field).cmp(&(&b.manager, &b.field)));
        conflicts.dedup();
        return Err(conflicts);
    }
    for (other, path) in transfers {
        if let Some(cfg) = owners.get_mut(&other) {
            remove_path(cfg, &path);
        }
    }
    let mut next = live.cloned().unwrap_or_else(|| json!({}));
    if let Some(previous) = owners.get(manager) {
        for path in leaf_paths(previous) {
            let still_set = new_paths.iter().any(|p| overlaps(p, &path));
            let owned_by_other = owners
                .iter()
                .filter(|(m, _)| m.as_str() != manager)
                .any(|(_, cfg)| leaf_paths(cfg).iter().any(|p| overlaps(p, &path)));
            if !still_set && !owned_by_other {
                remove_path(&mut next, &path);
            }
        }
    }
    merge_into(&mut next, &config);
    owners.insert(manager.to_string(), config);
    owners.retain(|_, cfg| !leaf_paths(cfg).is_empty());
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "default"}, "data": data})
    }

    #[test]
    fn apply_creates_then_removes_fields_the_manager_dropped() {
        let mut owners = BTreeMap::new();
        let live = apply(
            None,
            &cm(json!({"a": "1", "b": "2"})),
            &mut owners,
            "medea",
            false,
        )
        .unwrap();
        assert_eq!(live["data"], json!({"a": "1", "b": "2"}));
        let live = apply(
            Some(&live),
            &cm(json!({"a": "1"})),
            &mut owners,
            "medea",
            false,
        )
        .unwrap();
        assert_eq!(live["data"], json!({"a": "1"}));
    }

    #[test]
    fn a_field_owned_by_another_manager_conflicts_unless_forced() {
        let mut owners = BTreeMap::new();
        let live = apply(None, &cm(json!({"a": "1"})), &mut owners, "talos", false).unwrap();
        let err = apply(
            Some(&live),
            &cm(json!({"a": "2"})),
            &mut owners,
            "medea",
            false,
        )
        .unwrap_err();
        assert_eq!(
            err,
            vec![Conflict {
                manager: "talos".into(),
                field: ".data.a".into()
            }]
        );
        // Same value: shared ownership, no conflict.
        apply(
            Some(&live),
            &cm(json!({"a": "1"})),
            &mut owners,
            "medea",
            false,
        )
        .unwrap();
        let forced = apply(
            Some(&live),
            &cm(json!({"a": "2"})),
            &mut owners,
            "medea",
            true,
        )
        .unwrap();
        assert_eq!(forced["data"]["a"], "2");
        assert!(!owners.contains_key("talos"), "{owners:?}");
    }

    #[test]
    fn an_update_owns_what_it_changed_and_an_apply_conflicts_with_it_unless_forced() {
        let mut owners = BTreeMap::new();
        let created = cm(json!({"a": "1", "b": "2"}));
        record_update(None, &created, &mut owners, "kubectl-create");
        assert_eq!(
            owners["kubectl-create"]["data"],
            json!({"a": "1", "b": "2"})
        );
        let err = apply(
            Some(&created),
            &cm(json!({"a": "9"})),
            &mut owners,
            "talos",
            false,
        )
        .unwrap_err();
        assert_eq!(err[0].manager, "kubectl-create");
        assert_eq!(err[0].field, ".data.a");
        let live = apply(
            Some(&created),
            &cm(json!({"a": "9"})),
            &mut owners,
            "talos",
            true,
        )
        .unwrap();
        assert_eq!(live["data"], json!({"a": "9", "b": "2"}));
        assert_eq!(owners["kubectl-create"]["data"], json!({"b": "2"}));
        // a later update of `b` by another writer moves `b` only
        let mut edited = live.clone();
        edited["data"]["b"] = json!("3");
        record_update(Some(&live), &edited, &mut owners, "kubectl-edit");
        assert!(!owners.contains_key("kubectl-create"), "{owners:?}");
        assert_eq!(owners["kubectl-edit"]["data"], json!({"b": "3"}));
        assert_eq!(owners["talos"]["data"], json!({"a": "9"}));
    }

    #[test]
    fn merge_patch_follows_rfc7386_and_drops_directives() {
        let mut node = json!({"spec": {"unschedulable": true, "podCIDR": "10.0.0.0/24"}});
        merge_patch(
            &mut node,
            &json!({"spec": {"unschedulable": null, "$retainKeys": ["x"]}}),
        );
        assert_eq!(node, json!({"spec": {"podCIDR": "10.0.0.0/24"}}));
    }

    #[test]
    fn fields_v1_lists_the_leaves() {
        let f = fields_v1(&cm(json!({"a": "1"})));
        assert_eq!(f, json!({"f:data": {"f:a": {}}}));
    }
}
