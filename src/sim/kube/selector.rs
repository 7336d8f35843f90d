//! The string selectors of list and watch requests: `labelSelector=app=web,tier in (a,b)` and
//! `fieldSelector=spec.nodeName=w1`, with the apiserver's grammar and its per-resource
//! whitelist of selectable fields; and the structured `LabelSelector` of a
//! PodDisruptionBudget, converted as apimachinery's `LabelSelectorAsSelector` does
//! ([`selects`]). The simulator's own: medea's client matches selectors in `k8s::selector`,
//! and a mistake there must not be copied into the simulator that tests it.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde_json::Value;

use super::resources::ResourceType;

/// A selector the server could not parse, with the apiserver's wording.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SelectorError(pub String);

#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LabelSelector(Vec<LabelReq>);

/// Split on commas that are not inside parentheses.
fn split_top(input: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in input.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&input[start..]);
    parts
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn valid_value(value: &str) -> bool {
    value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn parse_set(key: &str, rest: &str, raw: &str) -> Result<Vec<String>, SelectorError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| {
            SelectorError(format!(
                "unable to parse requirement: `{raw}`: expected a set like `{key} in (a,b)`"
            ))
        })?;
    let values: Vec<String> = inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect();
    if values.is_empty() || !values.iter().all(|v| valid_value(v)) {
        return Err(SelectorError(format!(
            "unable to parse requirement: `{raw}`: invalid set of values"
        )));
    }
    Ok(values)
}

impl LabelSelector {
    pub fn parse(input: &str) -> Result<LabelSelector, SelectorError> {
        let mut reqs = Vec::new();
        if input.trim().is_empty() {
            return Ok(LabelSelector(reqs));
        }
        for raw in split_top(input) {
            let part = raw.trim();
            let bad = || SelectorError(format!("unable to parse requirement: `{part}`"));
            let req = if let Some(key) = part.strip_prefix('!') {
                LabelReq::NotExists(key.trim().to_string())
            } else if let Some((k, v)) = part.split_once("!=") {
                LabelReq::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                LabelReq::NotIn(k.trim().into(), parse_set(k.trim(), rest, part)?)
            } else if let Some((k, rest)) = part.split_once(" in ") {
                LabelReq::In(k.trim().into(), parse_set(k.trim(), rest, part)?)
            } else {
                LabelReq::Exists(part.to_string())
            };
            let (key, value) = match &req {
                LabelReq::Eq(k, v) | LabelReq::NotEq(k, v) => (k, Some(v)),
                LabelReq::In(k, _)
                | LabelReq::NotIn(k, _)
                | LabelReq::Exists(k)
                | LabelReq::NotExists(k) => (k, None),
            };
            if !valid_key(key) || value.is_some_and(|v| !valid_value(v)) {
                return Err(bad());
            }
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    /// A structured selector (`metav1.LabelSelector`, as a PodDisruptionBudget carries it) as
    /// apimachinery's `LabelSelectorAsSelector` (`pkg/apis/meta/v1/helpers.go`) converts it:
    /// a missing selector is `labels.Nothing()` (`None` here); an empty one selects
    /// everything; `matchLabels` become `=` requirements and `matchExpressions` `in`,
    /// `notin`, exists and `!`, ANDed. A requirement `labels.NewRequirement` refuses (an
    /// unknown operator, `In`/`NotIn` without values, `Exists`/`DoesNotExist` with values, an
    /// invalid key or value) makes the conversion fail: `None`, which every caller (the
    /// disruption controller, the eviction subresource) treats as selecting nothing.
    pub fn from_structured(
        selector: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    ) -> Option<LabelSelector> {
        let selector = selector?;
        let mut reqs = Vec::new();
        for (k, v) in selector.match_labels.iter().flatten() {
            if !valid_key(k) || !valid_value(v) {
                return None;
            }
            reqs.push(LabelReq::Eq(k.clone(), v.clone()));
        }
        for expr in selector.match_expressions.iter().flatten() {
            let values = expr.values.clone().unwrap_or_default();
            if !valid_key(&expr.key) || !values.iter().all(|v| valid_value(v)) {
                return None;
            }
            let key = expr.key.clone();
            reqs.push(match expr.operator.as_str() {
                "In" if !values.is_empty() => LabelReq::In(key, values),
                "NotIn" if !values.is_empty() => LabelReq::NotIn(key, values),
                "Exists" if values.is_empty() => LabelReq::Exists(key),
                "DoesNotExist" if values.is_empty() => LabelReq::NotExists(key),
                _ => return None,
            });
        }
        Some(LabelSelector(reqs))
    }

    /// Match against a label map (the reference [`Self::matches_object`] must equal).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|req| match req {
            LabelReq::Eq(k, v) => labels.get(k) == Some(v),
            LabelReq::NotEq(k, v) => labels.get(k) != Some(v),
            LabelReq::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            LabelReq::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            LabelReq::Exists(k) => labels.contains_key(k),
            LabelReq::NotExists(k) => !labels.contains_key(k),
        })
    }

    /// Match against the `metadata.labels` of a stored object: the same answer as
    /// `self.matches(&labels_of(obj))` (labels whose value is not a string are absent), read
    /// in place instead of copying every label of every listed object.
    pub fn matches_object(&self, obj: &Value) -> bool {
        if self.0.is_empty() {
            return true;
        }
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|m| m.get(k)).and_then(Value::as_str);
        self.0.iter().all(|req| match req {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|v| vs.iter().any(|x| x == v)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|v| !vs.iter().any(|x| x == v)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

/// Whether the structured `selector` selects an object with `labels`: converted as
/// [`LabelSelector::from_structured`] (a missing or invalid selector selects nothing, an
/// empty one everything), then matched.
pub(crate) fn selects(
    selector: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> bool {
    LabelSelector::from_structured(selector).is_some_and(|s| s.matches(labels))
}

/// `metadata.labels` of a JSON object.
pub(crate) fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// A field's value as a field selector compares it: strings as they are, booleans and numbers
/// as their JSON text, absent or `null` as `""`.
pub(crate) fn field_text(v: Option<&Value>) -> Cow<'_, str> {
    match v {
        None | Some(Value::Null) => Cow::Borrowed(""),
        Some(Value::String(s)) => Cow::Borrowed(s),
        Some(Value::Bool(true)) => Cow::Borrowed("true"),
        Some(Value::Bool(false)) => Cow::Borrowed("false"),
        Some(other) => Cow::Owned(other.to_string()),
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldReq {
    path: String,
    /// `path` as a JSON pointer (`/spec/nodeName`).
    pointer: String,
    value: String,
    negate: bool,
}

/// A parsed field selector (`spec.nodeName=w1,status.phase!=Succeeded`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldSelector(Vec<FieldReq>);

/// Fields the real apiserver lets clients select on, per resource.
fn selectable(rt: &ResourceType, path: &str) -> bool {
    if matches!(path, "metadata.name" | "metadata.namespace") {
        return true;
    }
    match rt.plural {
        "pods" => matches!(
            path,
            "spec.nodeName"
                | "spec.restartPolicy"
                | "spec.schedulerName"
                | "spec.serviceAccountName"
                | "spec.hostNetwork"
                | "status.phase"
                | "status.podIP"
                | "status.nominatedNodeName"
        ),
        "nodes" => path == "spec.unschedulable",
        "secrets" => path == "type",
        _ => false,
    }
}

impl FieldSelector {
    pub fn parse(rt: &ResourceType, input: &str) -> Result<FieldSelector, SelectorError> {
        let mut reqs = Vec::new();
        if input.trim().is_empty() {
            return Ok(FieldSelector(reqs));
        }
        for part in input.split(',') {
            let part = part.trim();
            let (path, value, negate) = if let Some((p, v)) = part.split_once("!=") {
                (p, v, true)
            } else if let Some((p, v)) = part.split_once("==") {
                (p, v, false)
            } else if let Some((p, v)) = part.split_once('=') {
                (p, v, false)
            } else {
                return Err(SelectorError(format!(
                    "invalid selector: '{part}'; can't understand '{part}'"
                )));
            };
            if !selectable(rt, path) {
                return Err(SelectorError(format!("field label not supported: {path}")));
            }
            reqs.push(FieldReq {
                path: path.to_string(),
                pointer: format!("/{}", path.replace('.', "/")),
                value: value.to_string(),
                negate,
            });
        }
        Ok(FieldSelector(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|req| {
            let actual = field_text(obj.pointer(&req.pointer));
            // An unset boolean reads as "false", as in the apiserver's field sets.
            let actual = if actual.is_empty() && req.path == "spec.unschedulable" {
                Cow::Borrowed("false")
            } else {
                actual
            };
            (actual == req.value) != req.negate
        })
    }

    /// The node a `spec.nodeName=X` requirement pins the selected pods to (`""`: unbound
    /// pods): every object the selector matches has that `spec.nodeName`, so a list can start
    /// from the store's pods-by-node index.
    pub fn node_name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|r| r.path == "spec.nodeName" && !r.negate)
            .map(|r| r.value.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::super::resources::{NODES, PODS};
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// apimachinery `LabelSelectorAsSelector`: nil selects nothing, `{}` everything,
    /// `matchLabels` and `matchExpressions` ANDed, and a requirement `NewRequirement` refuses
    /// makes the whole selector select nothing.
    #[test]
    fn structured_selectors_convert_as_label_selector_as_selector() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
            LabelSelector as Structured, LabelSelectorRequirement as Req,
        };
        let req = |key: &str, op: &str, values: Option<&[&str]>| Req {
            key: key.into(),
            operator: op.into(),
            values: values.map(|v| v.iter().map(|s| s.to_string()).collect()),
        };
        let web = labels(&[("app", "web"), ("tier", "edge")]);
        assert!(!selects(None, &web));
        assert!(selects(Some(&Structured::default()), &web));
        assert!(selects(Some(&Structured::default()), &labels(&[])));
        let sel = Structured {
            match_labels: Some([("app".to_string(), "web".to_string())].into()),
            match_expressions: Some(vec![
                req("tier", "In", Some(&["front", "edge"])),
                req("canary", "DoesNotExist", None),
                req("zone", "NotIn", Some(&["b"])),
            ]),
        };
        assert!(selects(Some(&sel), &web));
        assert!(!selects(
            Some(&sel),
            &labels(&[("app", "web"), ("tier", "back")])
        ));
        assert!(!selects(
            Some(&sel),
            &labels(&[("app", "web"), ("tier", "edge"), ("canary", "1")])
        ));
        assert!(!selects(
            Some(&sel),
            &labels(&[("app", "web"), ("tier", "edge"), ("zone", "b")])
        ));
        assert!(!selects(Some(&sel), &labels(&[("tier", "edge")])));
        let exists = Structured {
            match_expressions: Some(vec![req("app", "Exists", Some(&[]))]),
            ..Default::default()
        };
        assert!(selects(Some(&exists), &web));
        assert!(!selects(Some(&exists), &labels(&[("tier", "edge")])));
        // Refused by NewRequirement or the operator switch: nothing is selected.
        for bad in [
            req("app", "Gt", Some(&["1"])),
            req("app", "In", Some(&[])),
            req("app", "NotIn", None),
            req("app", "Exists", Some(&["web"])),
            req("app", "DoesNotExist", Some(&["web"])),
            req("", "Exists", None),
            req("app", "In", Some(&["not valid"])),
        ] {
            let sel = Structured {
                match_expressions: Some(vec![bad.clone()]),
                ..Default::default()
            };
            assert!(
                LabelSelector::from_structured(Some(&sel)).is_none(),
                "{bad:?}"
            );
            assert!(!selects(Some(&sel), &web), "{bad:?}");
            assert!(!selects(Some(&sel), &labels(&[])), "{bad:?}");
        }
        let bad_value = Structured {
            match_labels: Some([("app".to_string(), "a b".to_string())].into()),
            ..Default::default()
        };
        assert!(!selects(Some(&bad_value), &labels(&[("app", "a b")])));
    }

    #[test]
    fn label_selector_grammar() {
        let sel =
            LabelSelector::parse("app=web,tier in (front, edge),!canary,env!=prod,zone").unwrap();
        assert!(sel.matches(&labels(&[("app", "web"), ("tier", "edge"), ("zone", "a")])));
        assert!(!sel.matches(&labels(&[("app", "web"), ("tier", "back"), ("zone", "a")])));
        assert!(!sel.matches(&labels(&[("app", "web"), ("tier", "edge")])));
        assert!(!sel.matches(&labels(&[
            ("app", "web"),
            ("tier", "edge"),
            ("zone", "a"),
            ("env", "prod")
        ])));
        let role = LabelSelector::parse("node-role.kubernetes.io/control-plane").unwrap();
        assert!(role.matches(&labels(&[("node-role.kubernetes.io/control-plane", "")])));
        assert!(LabelSelector::parse("").unwrap().matches(&labels(&[])));
        assert!(LabelSelector::parse("a in b").is_err());
        assert!(LabelSelector::parse("a=b c").is_err());
    }

    #[test]
    fn field_selector_uses_the_apiserver_whitelist() {
        let sel = FieldSelector::parse(&PODS, "spec.nodeName=w1").unwrap();
        assert!(sel.matches(&json!({"spec": {"nodeName": "w1"}})));
        assert!(!sel.matches(&json!({"spec": {"nodeName": "w2"}})));
        let neg = FieldSelector::parse(&PODS, "status.phase!=Succeeded").unwrap();
        assert!(neg.matches(&json!({"status": {"phase": "Running"}})));
        let err = FieldSelector::parse(&PODS, "spec.priority=1").unwrap_err();
        assert_eq!(err.0, "field label not supported: spec.priority");
        let node = FieldSelector::parse(&NODES, "spec.unschedulable=false").unwrap();
        assert!(node.matches(&json!({"spec": {}})));
        assert!(!node.matches(&json!({"spec": {"unschedulable": true}})));
    }
}
