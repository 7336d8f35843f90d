//! Query gates: one Prometheus instant query (`POST /api/v1/query`, form-encoded) and the
//! judgement of its result (pure, [`judge`]).
//!
//! Semantics (design/rollout.md, "Health gates"): the gate's top-level expression is a
//! comparison or a set operation ([`QueryShape`], checked when the desired state is loaded).
//! A filter (comparison without `bool`, `and`/`or`/`unless`) passes iff the result has at
//! least one sample — PromQL filters keep the left-hand value, so a healthy
//! `ceph_health_status == 0` returns a 0-valued sample, and an empty result is its "no": it
//! fails. A `bool` comparison passes iff it has at least one sample and every sample is 1; a
//! sample of another value fails it. Inconclusive (issue #35, "we could not tell"): a `bool`
//! comparison with no sample (a `bool` comparison answers for every series it compares, so an
//! empty result means the series are absent: a value was needed and there was none), a NaN
//! sample when no other sample fails, and a scalar, string, range-vector or malformed result.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::http::{self, HttpError};
use super::{MAX_SAMPLES, ProbeError};
use crate::desired::health::QueryShape;
use crate::plan::health::Endpoint;
use crate::rollout::ports::{GateSample, GateVerdict};

/// The `/api/v1/query` envelope.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope {
    status: String,
    #[serde(default)]
    data: Option<QueryData>,
    #[serde(default)]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

/// The `data` of a successful query.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueryData {
    pub result_type: String,
    pub result: serde_json::Value,
}

#[derive(Debug, Deserialize)]
struct VectorSample {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    value: (f64, String),
}

/// Run one instant query; `timeout` bounds the request and is passed to Prometheus.
pub async fn query(
    endpoint: &Endpoint,
    credentials: &http::Credentials,
    promql: &str,
    timeout: Duration,
) -> Result<QueryData, ProbeError> {
    let secs = timeout.as_secs().max(1);
    let form = format!("query={}&timeout={secs}s", http::encode(promql));
    let answer = http::send(endpoint, credentials, "/api/v1/query", Some(form), timeout)
        .await
        .map_err(|err| ProbeError::Http { err: Box::new(err) })?;
    let url = format!("{}/api/v1/query", endpoint.url);
    let envelope: Result<Envelope, _> = serde_json::from_slice(&answer.body);
    match envelope {
        Ok(e) if answer.status == 200 && e.status == "success" => {
            e.data.ok_or_else(|| ProbeError::Shape {
                url,
                what: "a success without `data`".into(),
            })
        }
        Ok(e) if e.status == "error" => Err(ProbeError::Prometheus {
            status: answer.status,
            error_type: e.error_type.unwrap_or_default(),
            error: e.error.unwrap_or_default(),
        }),
        Ok(_) | Err(_) if answer.status != 200 => Err(ProbeError::Status {
            url,
            status: answer.status,
            body: http::excerpt(&answer.body),
        }),
        Ok(e) => Err(ProbeError::Shape {
            url,
            what: format!("status `{}`", e.status),
        }),
        Err(err) => Err(ProbeError::Json { url, err }),
    }
}

fn parse_value(s: &str) -> f64 {
    match s {
        "NaN" => f64::NAN,
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        other => other.parse().unwrap_or(f64::NAN),
    }
}

fn label_text(labels: &BTreeMap<String, String>) -> String {
    let name = labels.get("__name__").cloned().unwrap_or_default();
    let rest: Vec<String> = labels
        .iter()
        .filter(|(k, _)| k.as_str() != "__name__")
        .map(|(k, v)| format!("{k}=\"{v}\""))
        .collect();
    format!("{name}{{{}}}", rest.join(", "))
}

/// Judge a query's result: the verdict, the samples (at most [`MAX_SAMPLES`]) and a one-line
/// detail. Pure.
pub fn judge(shape: QueryShape, data: &QueryData) -> (GateVerdict, Vec<GateSample>, String) {
    if data.result_type != "vector" {
        return (
            GateVerdict::Inconclusive,
            Vec::new(),
            format!(
                "the query returned a {}, not an instant vector: a gate needs a condition such as `x == 0`",
                data.result_type
            ),
        );
    }
    let parsed: Result<Vec<VectorSample>, _> = serde_json::from_value(data.result.clone());
    let samples = match parsed {
        Ok(s) => s,
        Err(e) => {
            return (
                GateVerdict::Inconclusive,
                Vec::new(),
                format!("the vector result is malformed: {e}"),
            );
        }
    };
    let total = samples.len();
    let values: Vec<f64> = samples.iter().map(|s| parse_value(&s.value.1)).collect();
    let bad: Vec<usize> = (0..total)
        .filter(|i| {
            let v = values[*i];
            v.is_nan() || (shape == QueryShape::Bool && v != 1.0)
        })
        .collect();
    // The failing samples first, so they are the evidence kept.
    let order: Vec<usize> = bad
        .iter()
        .copied()
        .chain((0..total).filter(|i| !bad.contains(i)))
        .take(MAX_SAMPLES)
        .collect();
    let kept: Vec<GateSample> = order
        .iter()
        .map(|i| GateSample {
            labels: samples[*i].metric.clone(),
            value: samples[*i].value.1.clone(),
        })
        .collect();
    let more = if total > MAX_SAMPLES {
        format!(" (first {MAX_SAMPLES} kept)")
    } else {
        String::new()
    };
    if total == 0 {
        return match shape {
            QueryShape::Filter => (
                GateVerdict::Fail,
                kept,
                "the query returned no sample: the condition does not hold (or its series are absent)"
                    .to_string(),
            ),
            QueryShape::Bool => (
                GateVerdict::Inconclusive,
                kept,
                "the query returned no sample: the series it compares are absent, so there is no value to judge"
                    .to_string(),
            ),
        };
    }
    // a real value that fails decides; NaN alone is no value
    let decided = bad.iter().find(|i| !values[**i].is_nan()).or(bad.first());
    if let Some(first) = decided {
        let verdict = if values[*first].is_nan() {
            GateVerdict::Inconclusive
        } else {
            GateVerdict::Fail
        };
        let s = &samples[*first];
        let why = if values[*first].is_nan() {
            "is NaN"
        } else {
            "is not 1"
        };
        return (
            verdict,
            kept,
            format!(
                "{} of {total} samples fail: {} {why} (value {}){more}",
                bad.len(),
                label_text(&s.metric),
                s.value.1
            ),
        );
    }
    let how = match shape {
        QueryShape::Filter => "the condition holds",
        QueryShape::Bool => "every sample is 1",
    };
    (
        GateVerdict::Pass,
        kept,
        format!(
            "{how} ({}){more}",
            if total == 1 {
                "1 sample".to_string()
            } else {
                format!("{total} samples")
            }
        ),
    )
}

impl From<HttpError> for ProbeError {
    fn from(err: HttpError) -> Self {
        ProbeError::Http { err: Box::new(err) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vector(samples: &[(&str, &str)]) -> QueryData {
        QueryData {
            result_type: "vector".into(),
            result: json!(
                samples
                    .iter()
                    .map(|(inst, v)| json!({"metric": {"__name__": "x", "instance": inst}, "value": [1796313176.2, v]}))
                    .collect::<Vec<_>>()
            ),
        }
    }

    #[test]
    fn filters_pass_on_any_sample_even_zero_valued() {
        let (v, s, d) = judge(QueryShape::Filter, &vector(&[("a", "0")]));
        assert_eq!(v, GateVerdict::Pass, "{d}");
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].value, "0");
        let (v, _, d) = judge(QueryShape::Filter, &vector(&[]));
        assert_eq!(v, GateVerdict::Fail, "an empty filter is its `no`");
        assert!(d.contains("no sample"), "{d}");
        let (v, s, d) = judge(QueryShape::Filter, &vector(&[("a", "3"), ("b", "NaN")]));
        assert_eq!(v, GateVerdict::Inconclusive, "NaN is no value: {d}");
        assert!(d.contains(r#"x{instance="b"} is NaN"#), "{d}");
        assert_eq!(s[0].labels["instance"], "b", "failing samples first");
    }

    #[test]
    fn bool_comparisons_pass_only_when_every_sample_is_one() {
        let (v, _, d) = judge(QueryShape::Bool, &vector(&[("a", "1"), ("b", "1")]));
        assert_eq!(v, GateVerdict::Pass, "{d}");
        assert!(d.contains("every sample is 1 (2 samples)"), "{d}");
        let (v, s, d) = judge(QueryShape::Bool, &vector(&[("a", "1"), ("b", "0")]));
        assert_eq!(v, GateVerdict::Fail);
        assert!(d.starts_with("1 of 2 samples fail"), "{d}");
        assert_eq!(s[0].value, "0");
        let (v, _, d) = judge(QueryShape::Bool, &vector(&[]));
        assert_eq!(v, GateVerdict::Inconclusive, "no series: no value to judge");
        assert!(d.contains("absent"), "{d}");
        // a real bad value decides over a NaN beside it
        let (v, _, d) = judge(QueryShape::Bool, &vector(&[("a", "NaN"), ("b", "0")]));
        assert_eq!(v, GateVerdict::Fail, "{d}");
        assert!(d.contains(r#"x{instance="b"} is not 1"#), "{d}");
        let (v, _, d) = judge(QueryShape::Bool, &vector(&[("a", "NaN"), ("b", "1")]));
        assert_eq!(v, GateVerdict::Inconclusive, "{d}");
    }

    #[test]
    fn other_result_types_are_inconclusive_and_samples_are_bounded() {
        for t in ["scalar", "string", "matrix"] {
            let d = QueryData {
                result_type: t.into(),
                result: json!([1.0, "1"]),
            };
            let (v, _, detail) = judge(QueryShape::Filter, &d);
            assert_eq!(v, GateVerdict::Inconclusive);
            assert!(detail.contains(t), "{detail}");
        }
        let many: Vec<(String, &str)> = (0..50).map(|i| (format!("i{i}"), "1")).collect();
        let refs: Vec<(&str, &str)> = many.iter().map(|(a, b)| (a.as_str(), *b)).collect();
        let (v, s, d) = judge(QueryShape::Bool, &vector(&refs));
        assert_eq!(v, GateVerdict::Pass);
        assert_eq!(s.len(), MAX_SAMPLES);
        assert!(d.contains("50 samples") && d.contains("kept"), "{d}");
    }
}
