//! Matching a structured `LabelSelector` (as in a PodDisruptionBudget) against labels.
//!
//! Kubernetes semantics (policy/v1): a missing selector selects nothing, an empty one (`{}`)
//! selects everything; `matchLabels` and `matchExpressions` are ANDed.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Whether `selector` selects an object with `labels`.
pub fn selects(selector: Option<&LabelSelector>, labels: &BTreeMap<String, String>) -> bool {
    let Some(selector) = selector else {
        return false;
    };
    if let Some(match_labels) = &selector.match_labels {
        for (k, v) in match_labels {
            if labels.get(k) != Some(v) {
                return false;
            }
        }
    }
    for expr in selector.match_expressions.iter().flatten() {
        let value = labels.get(&expr.key);
        let values = expr.values.as_deref().unwrap_or_default();
        let ok = match expr.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            // An unknown operator is invalid; the apiserver would have refused the object.
            _ => false,
        };
        if !ok {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn missing_selector_selects_nothing_and_empty_selects_everything() {
        let l = labels(&[("app", "web")]);
        assert!(!selects(None, &l));
        assert!(selects(Some(&LabelSelector::default()), &l));
    }

    #[test]
    fn match_labels_and_expressions_are_anded() {
        let sel = LabelSelector {
            match_labels: Some([("app".to_string(), "web".to_string())].into()),
            match_expressions: Some(vec![
                LabelSelectorRequirement {
                    key: "tier".into(),
                    operator: "In".into(),
                    values: Some(vec!["front".into(), "edge".into()]),
                },
                LabelSelectorRequirement {
                    key: "canary".into(),
                    operator: "DoesNotExist".into(),
                    values: None,
                },
            ]),
        };
        assert!(selects(
            Some(&sel),
            &labels(&[("app", "web"), ("tier", "edge")])
        ));
        assert!(!selects(
            Some(&sel),
            &labels(&[("app", "web"), ("tier", "back")])
        ));
        assert!(!selects(
            Some(&sel),
            &labels(&[("app", "web"), ("tier", "front"), ("canary", "1")])
        ));
        assert!(!selects(
            Some(&sel),
            &labels(&[("app", "db"), ("tier", "front")])
        ));
    }
}
