//! Health gates (issue #23) as a plan carries them: the resolved gates, soak and failure
//! policy of a cluster and of each pool. The executor gates on these (what was approved),
//! never on the live desired state. Pure data.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Where gates are evaluated. URLs and credential names are not secrets: the plan shows both,
/// and the probe at the edge maps a credential name to the server's own files (never a path
/// from the desired state); their contents are never recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthSources {
    /// The Prometheus to query, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<Endpoint>,
    /// The Alertmanager to ask, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alertmanager: Option<Endpoint>,
}

/// A health source: its URL, and the name of the credential the server resolves for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// The base URL.
    pub url: String,
    /// The name of the server's credential sent to this source (`None`: no token, the
    /// system's roots). Plans stored before issue #32 named files instead; those fields are
    /// ignored when such a plan is read, so its gates are asked without credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
}

impl Endpoint {
    /// `https://x:9090 (credential prom)` or `http://x:9090 (no credential)`, as plans show it.
    pub fn summary(&self) -> String {
        match &self.credential {
            Some(c) => format!("{} (credential {c})", self.url),
            None => format!("{} (no credential)", self.url),
        }
    }
}

/// The effective health policy of a cluster or a pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthPolicy {
    /// Where health data comes from.
    pub sources: HealthSources,
    /// The gates.
    pub gates: Vec<Gate>,
    /// After each wave (and pool, and the job): every gate passes continuously this long.
    #[serde(with = "crate::duration::serde_lenient")]
    pub soak: Duration,
    /// How often gates are evaluated.
    #[serde(with = "crate::duration::serde_lenient")]
    pub interval: Duration,
    /// Consecutive failed evaluations before a gate fails.
    pub failure_limit: u32,
    /// Inconclusive evaluations since the gate last passed before it halts the job
    /// (`gate_inconclusive`). Not written when it is the default, so plans made before it
    /// existed keep their ids; plans that omit it read as the default.
    #[serde(
        default = "default_inconclusive_limit",
        skip_serializing_if = "is_default_inconclusive_limit"
    )]
    pub inconclusive_limit: u32,
    /// What a failed gate does.
    pub on_failure: OnFailure,
}

/// The default of `inconclusiveLimit` (what plans without the field mean).
pub fn default_inconclusive_limit() -> u32 {
    crate::desired::health::DEFAULT_INCONCLUSIVE_LIMIT
}

/// Whether `n` is the default `inconclusiveLimit` (then it is not serialized).
pub fn is_default_inconclusive_limit(n: &u32) -> bool {
    *n == default_inconclusive_limit()
}

impl HealthSources {
    /// The sources a validated `health` block names (gated or not).
    pub fn of(s: &crate::desired::health::HealthSettings) -> HealthSources {
        let endpoint = |e: &crate::desired::health::HealthEndpoint| Endpoint {
            url: e.url.clone(),
            credential: e.credential.clone(),
        };
        HealthSources {
            prometheus: s.prometheus.as_ref().map(endpoint),
            alertmanager: s.alertmanager.as_ref().map(endpoint),
        }
    }

    /// Whether no source is set.
    pub fn is_empty(&self) -> bool {
        self.prometheus.is_none() && self.alertmanager.is_none()
    }
}

impl HealthPolicy {
    /// The policy a plan carries for validated settings; `None` when nothing is gated.
    pub fn of(s: &crate::desired::health::HealthSettings) -> Option<HealthPolicy> {
        if !s.is_gated() {
            return None;
        }
        Some(HealthPolicy {
            sources: HealthSources::of(s),
            gates: gates_of(s),
            soak: s.soak,
            interval: s.interval,
            failure_limit: s.failure_limit,
            inconclusive_limit: s.inconclusive_limit,
            on_failure: on_failure_of(s),
        })
    }
}

/// The on-failure policy of validated settings.
pub fn on_failure_of(s: &crate::desired::health::HealthSettings) -> OnFailure {
    match s.on_failure {
        crate::desired::health::OnFailure::Halt => OnFailure::Halt,
        crate::desired::health::OnFailure::Rollback => OnFailure::Rollback,
    }
}

/// The gates of validated settings, as a plan carries them.
pub fn gates_of(s: &crate::desired::health::HealthSettings) -> Vec<Gate> {
    use crate::desired::health as d;
    s.gates
        .iter()
        .map(|g| Gate {
            name: g.name.clone(),
            dry_run: g.dry_run,
            consecutive_error_limit: g.consecutive_error_limit,
            on_inconclusive: match g.on_inconclusive {
                d::OnInconclusive::Halt => OnInconclusive::Halt,
                d::OnInconclusive::Pause => OnInconclusive::Pause,
            },
            check: match &g.check {
                d::HealthCheck::Query { query } => GateCheck::Query {
                    query: query.clone(),
                },
                d::HealthCheck::Alerts {
                    matchers,
                    ignore,
                    skip_operator_silences,
                } => GateCheck::Alerts {
                    matchers: matchers.clone(),
                    ignore: ignore.clone(),
                    skip_operator_silences: *skip_operator_silences,
                },
                d::HealthCheck::Workloads { namespaces, kinds } => GateCheck::Workloads {
                    namespaces: namespaces.clone(),
                    kinds: kinds
                        .iter()
                        .map(|k| match k {
                            d::WorkloadKind::Deployment => WorkloadKind::Deployment,
                            d::WorkloadKind::StatefulSet => WorkloadKind::StatefulSet,
                            d::WorkloadKind::DaemonSet => WorkloadKind::DaemonSet,
                        })
                        .collect(),
                },
            },
        })
        .collect()
}

/// One named gate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Gate {
    /// The gate's name, as written.
    pub name: String,
    /// What it checks.
    pub check: GateCheck,
    /// `dryRun: true`: evaluated, journaled, shown and notified, but it never blocks or halts
    /// a job (a gate tried in shadow). Not written when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// Consecutive evaluations that could not ask the source at all (refused, timed out, an
    /// HTTP or TLS error) before the gate halts the job with `gate_inconclusive` (issue #51
    /// item 4; Argo Rollouts' `consecutiveErrorLimit`, default 4). Kept apart from
    /// `inconclusiveLimit`, which counts answers without data. Not written when it is the
    /// default, so plans made before it keep their ids.
    #[serde(
        default = "default_consecutive_error_limit",
        skip_serializing_if = "is_default_consecutive_error_limit"
    )]
    pub consecutive_error_limit: u32,
    /// What the gate's reaching `inconclusiveLimit` does: halt the job (default) or pause it
    /// until a person runs `medea rollout resume`. Not written when `halt`.
    #[serde(default, skip_serializing_if = "OnInconclusive::is_halt")]
    pub on_inconclusive: OnInconclusive,
}

/// The default of a gate's `consecutiveErrorLimit` (the desired state's).
pub const DEFAULT_CONSECUTIVE_ERROR_LIMIT: u32 =
    crate::desired::health::DEFAULT_CONSECUTIVE_ERROR_LIMIT;

/// The default of `consecutiveErrorLimit` (what plans without the field mean).
pub fn default_consecutive_error_limit() -> u32 {
    DEFAULT_CONSECUTIVE_ERROR_LIMIT
}

/// Whether `n` is the default `consecutiveErrorLimit` (then it is not serialized).
pub fn is_default_consecutive_error_limit(n: &u32) -> bool {
    *n == DEFAULT_CONSECUTIVE_ERROR_LIMIT
}

/// What a gate that reached its `inconclusiveLimit` does (issue #51 item 4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnInconclusive {
    /// Halt the job (`gate_inconclusive`): continuing needs a new plan.
    #[default]
    Halt,
    /// Pause the job at the gate; `medea rollout resume` checks the gate afresh.
    Pause,
}

impl OnInconclusive {
    /// Whether it is the default, `halt`.
    pub fn is_halt(&self) -> bool {
        *self == OnInconclusive::Halt
    }
}

/// What a gate checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum GateCheck {
    /// A PromQL instant query (`/api/v1/query`).
    Query {
        /// The PromQL expression.
        query: String,
    },
    /// Alertmanager `/api/v2/alerts` (active, not inhibited; silenced ones only when medea's
    /// own silence mutes them, or any silence with `skip_operator_silences`).
    Alerts {
        /// Alert matchers: an alert matching them fails the gate.
        matchers: Vec<String>,
        /// Matchers of alerts that never fail it.
        ignore: Vec<String>,
        /// Alerts muted by an operator's silence are skipped too (`skipOperatorSilences`).
        /// Not written when false, so plans made before it keep their ids.
        #[serde(
            default,
            rename = "skipOperatorSilences",
            skip_serializing_if = "std::ops::Not::not"
        )]
        skip_operator_silences: bool,
    },
    /// Deployments/StatefulSets/DaemonSets updated and available.
    Workloads {
        /// The namespaces watched (empty: all).
        namespaces: Vec<String>,
        /// The workload kinds watched.
        kinds: Vec<WorkloadKind>,
    },
}

impl Gate {
    /// `name: query `…``, as plans show a gate.
    /// No `..`: a field added to [`Gate`] does not compile until it is shown here (the plan's
    /// `health.gates` setting is this text, so a field left out would change unseen).
    pub fn summary(&self) -> String {
        let Gate {
            name,
            check,
            dry_run,
            consecutive_error_limit,
            on_inconclusive,
        } = self;
        let mut extra = String::new();
        if !is_default_consecutive_error_limit(consecutive_error_limit) {
            extra.push_str(&format!(
                ", halts after {consecutive_error_limit} consecutive errors"
            ));
        }
        if *on_inconclusive == OnInconclusive::Pause {
            extra.push_str(", pauses when inconclusive");
        }
        format!(
            "{}: {}{extra}{}",
            name,
            check.summary(),
            if *dry_run {
                " (dry run: never blocks)"
            } else {
                ""
            }
        )
    }
}

impl Gate {
    /// Whether this is an `alerts` gate with `skipOperatorSilences: true`.
    pub fn skips_operator_silences(&self) -> bool {
        matches!(
            self.check,
            GateCheck::Alerts {
                skip_operator_silences: true,
                ..
            }
        )
    }
}

impl GateCheck {
    /// What the gate checks, in one line: `query `up == 1``, `alerts severity="critical",
    /// ignoring …`, `workloads Deployment in default`.
    pub fn summary(&self) -> String {
        match self {
            GateCheck::Query { query } => format!("query `{query}`"),
            GateCheck::Alerts {
                matchers,
                ignore,
                skip_operator_silences,
            } => {
                let m = if matchers.is_empty() {
                    "any alert".to_string()
                } else {
                    matchers.join(", ")
                };
                let silences = if *skip_operator_silences {
                    ", skipping operators' silences"
                } else {
                    ""
                };
                if ignore.is_empty() {
                    format!("alerts {m}{silences}")
                } else {
                    format!("alerts {m}, ignoring {}{silences}", ignore.join(" or "))
                }
            }
            GateCheck::Workloads { namespaces, kinds } => {
                let k: Vec<String> = kinds.iter().map(|k| format!("{k:?}")).collect();
                format!("workloads {} in {}", k.join(", "), namespaces.join(", "))
            }
        }
    }
}

/// A kind of workload a `workloads` gate watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum WorkloadKind {
    /// `apps/v1` Deployment.
    Deployment,
    /// `apps/v1` StatefulSet.
    StatefulSet,
    /// `apps/v1` DaemonSet.
    DaemonSet,
}

/// What a failed gate does to the wave that broke it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum OnFailure {
    /// Halt before touching another node.
    #[default]
    Halt,
    /// Roll the failing wave's nodes back (Talos `MachineService.Rollback`), then halt.
    /// Talos steps only: Kubernetes steps never roll back.
    Rollback,
}

/// The silences a Talos step makes in the cluster's Alertmanager while each node is drained
/// and rebooted (issue #35 item 1), as approved. Part of the plan (and its id): signers see
/// what will be silenced, for how long at most, and where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SilencePolicy {
    /// The Alertmanager the silences are created in (the cluster's `health.alertmanager`).
    pub alertmanager: Endpoint,
    /// Matchers of the alerts a node's step is expected to cause (Alertmanager syntax).
    pub matchers: Vec<String>,
    /// The alert label naming the node.
    pub node_label: String,
    /// How long a silence lasts past its last renewal.
    #[serde(with = "crate::duration::serde_lenient")]
    pub lease: Duration,
    /// A silence is never renewed past this long after its creation.
    #[serde(with = "crate::duration::serde_lenient")]
    pub max_duration: Duration,
    /// What a node does when Alertmanager refuses its silence before the cordon.
    pub on_error: SilenceOnError,
}

/// What a node does when its silence cannot be created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SilenceOnError {
    /// Halt before the cordon (`silence_refused`).
    #[default]
    Halt,
    /// Go on unsilenced.
    Proceed,
}

/// One matcher of a silence, as Alertmanager's `POST /api/v2/silences` takes it
/// (`matchers[]`: `name`, `value`, `isRegex`, `isEqual`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SilenceMatcher {
    /// The label.
    pub name: String,
    /// The value, or the regex (Alertmanager anchors it).
    pub value: String,
    /// `=~` / `!~`.
    pub is_regex: bool,
    /// `=` / `=~` (false: `!=` / `!~`).
    pub is_equal: bool,
}

/// `s` with RE2's metacharacters escaped (a node name's `.`; `-` is left as is, which
/// Alertmanager's Go regexps and ours read alike outside a class).
fn escape_regex(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl SilencePolicy {
    /// The policy a plan carries for a validated `health` block; `None` without a silence
    /// (or without an Alertmanager, which validation refuses).
    pub fn of(s: &crate::desired::health::HealthSettings) -> Option<SilencePolicy> {
        let silence = s.silence.as_ref()?;
        let am = s.alertmanager.as_ref()?;
        Some(SilencePolicy {
            alertmanager: Endpoint {
                url: am.url.clone(),
                credential: am.credential.clone(),
            },
            matchers: silence.matchers.clone(),
            node_label: silence.node_label.clone(),
            lease: silence.lease,
            max_duration: silence.max_duration,
            on_error: match silence.on_error {
                crate::desired::health::SilenceOnError::Halt => SilenceOnError::Halt,
                crate::desired::health::SilenceOnError::Proceed => SilenceOnError::Proceed,
            },
        })
    }

    /// The matchers of node `node`'s silence: the policy's, then the node's own —
    /// `instance=~"<node>(:[0-9]+)?"` for `instance` (a target's `host:port`), else
    /// `<label>="<node>"`. Matchers that do not parse (a plan validated by another medea) are
    /// skipped and named in the error.
    pub fn matchers_for(&self, node: &str) -> Result<Vec<SilenceMatcher>, String> {
        use crate::desired::health::{MatchOp, Matcher};
        let mut out = Vec::with_capacity(self.matchers.len() + 1);
        for m in &self.matchers {
            let parsed = Matcher::parse(m)
                .map_err(|e| format!("silence matcher `{m}`: {}", crate::error_chain(&e)))?;
            out.push(SilenceMatcher {
                name: parsed.name,
                value: parsed.value,
                is_regex: matches!(parsed.op, MatchOp::Regex | MatchOp::NotRegex),
                is_equal: matches!(parsed.op, MatchOp::Equal | MatchOp::Regex),
            });
        }
        out.push(if self.node_label == "instance" {
            SilenceMatcher {
                name: self.node_label.clone(),
                value: format!("{}(:[0-9]+)?", escape_regex(node)),
                is_regex: true,
                is_equal: true,
            }
        } else {
            SilenceMatcher {
                name: self.node_label.clone(),
                value: node.to_string(),
                is_regex: false,
                is_equal: true,
            }
        });
        Ok(out)
    }

    /// One line, as plans show it.
    pub fn summary(&self) -> String {
        format!(
            "{} for the node by `{}` (lease {}, at most {}, if refused: {})",
            self.matchers.join(", "),
            self.node_label,
            crate::desired::model::format_duration(self.lease),
            crate::desired::model::format_duration(self.max_duration),
            match self.on_error {
                SilenceOnError::Halt => "halt",
                SilenceOnError::Proceed => "proceed unsilenced",
            }
        )
    }
}
