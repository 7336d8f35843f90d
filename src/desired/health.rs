//! Health gates in the desired state (issue #23): the validated model, its validation, and
//! the two small grammars it checks at load time — Alertmanager label matchers ([`Matcher`])
//! and the shape of a query gate's PromQL ([`QueryShape`]). Pure.
//!
//! The probes (`crate::health`) use [`Matcher`] and [`QueryShape`] too, so a gate means at
//! evaluation exactly what validation accepted.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Serialize;
use serde_saphyr::Spanned;

use super::diagnostic::{Diagnostic, codes};
use super::format::{
    AlertsGateSpec, EndpointSpec, GateFields, GateSpec, HealthSpec, OnFailureSpec, PoolHealthSpec,
    SilenceOnErrorSpec, SilenceSpec, WorkloadKindSpec, WorkloadsGateSpec,
};
use super::parse::DocText;

/// Default of `health.interval`.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);
/// Default of `health.failureLimit`.
pub const DEFAULT_FAILURE_LIMIT: u32 = 1;
/// Default of `health.inconclusiveLimit` (issue #35): the same as `failureLimit`'s, so that a
/// gate that cannot be evaluated halts exactly as it did when an unreachable source counted
/// as a failure. Upgrading medea never makes a rollout more tolerant of not knowing; a flaky
/// source is ridden out by raising it.
pub const DEFAULT_INCONCLUSIVE_LIMIT: u32 = DEFAULT_FAILURE_LIMIT;

/// Default of a gate's `consecutiveErrorLimit` (issue #51 item 4): 4, as Argo Rollouts'
/// AnalysisRun (`DefaultConsecutiveErrorLimit` in argo-rollouts `utils/defaults/defaults.go`).
pub const DEFAULT_CONSECUTIVE_ERROR_LIMIT: u32 = 4;

/// A cluster's or pool's effective health settings. No gates: nothing is gated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthSettings {
    /// Prometheus source of `query` gates (none: such gates are refused).
    pub prometheus: Option<HealthEndpoint>,
    /// Alertmanager source of `alerts` gates (none: such gates are refused).
    pub alertmanager: Option<HealthEndpoint>,
    /// The checks that must all pass; empty: nothing is gated.
    pub gates: Vec<HealthGate>,
    /// How long the gates must keep passing after the step (default 0).
    #[serde(with = "duration_text")]
    pub soak: Duration,
    /// How often the gates are evaluated (default 30s).
    #[serde(with = "duration_text")]
    pub interval: Duration,
    /// Consecutive failed evaluations that fail the gate (default 1).
    pub failure_limit: u32,
    /// Inconclusive evaluations (since the gate last passed) that halt the job with
    /// `gate_inconclusive` (default 1).
    pub inconclusive_limit: u32,
    /// What a failed gate does to the wave that broke it (default: halt).
    pub on_failure: OnFailure,
    /// The silences of a node's expected alerts (the Cluster's `health.silence`; pools
    /// inherit it). `None`: medea silences nothing.
    pub silence: Option<SilenceSettings>,
}

/// Default of `health.silence.lease`.
pub const DEFAULT_SILENCE_LEASE: Duration = Duration::from_secs(5 * 60);
/// Shortest `health.silence.lease`: a renewal must fit in half of it.
pub const MIN_SILENCE_LEASE: Duration = Duration::from_secs(60);
/// Longest `health.silence.lease` (issue #50): a silence left behind by a dead server lapses
/// within half an hour; 30m is six times the default and leaves renewals room.
pub const MAX_SILENCE_LEASE: Duration = Duration::from_secs(30 * 60);
/// Longest `health.silence.maxDuration` (issue #50): a working day's rollout of one node;
/// longer hides a node that never came back for a night.
pub const MAX_SILENCE_DURATION: Duration = Duration::from_secs(12 * 60 * 60);
/// Default of `health.silence.maxDuration`.
pub const DEFAULT_SILENCE_MAX: Duration = Duration::from_secs(60 * 60);

/// A validated `health.silence` (issue #35 item 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SilenceSettings {
    /// The matchers of the alerts a node's step is expected to cause (as written, trimmed).
    pub matchers: Vec<String>,
    /// The label naming the node (`instance`, `node`, ...).
    pub node_label: String,
    /// How long a silence lasts past its last renewal.
    #[serde(with = "duration_text")]
    pub lease: Duration,
    /// A silence is never renewed past this long after its creation.
    #[serde(with = "duration_text")]
    pub max_duration: Duration,
    /// What a node does when its silence is refused.
    pub on_error: SilenceOnError,
}

/// What a node does when Alertmanager refuses its silence before the cordon.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SilenceOnError {
    /// Halt the job before the node is cordoned (default).
    #[default]
    Halt,
    /// Go on without a silence: the node's alerts page.
    Proceed,
}

impl Default for HealthSettings {
    fn default() -> Self {
        HealthSettings {
            prometheus: None,
            alertmanager: None,
            gates: Vec::new(),
            soak: Duration::ZERO,
            interval: DEFAULT_INTERVAL,
            failure_limit: DEFAULT_FAILURE_LIMIT,
            inconclusive_limit: DEFAULT_INCONCLUSIVE_LIMIT,
            on_failure: OnFailure::Halt,
            silence: None,
        }
    }
}

impl HealthSettings {
    /// Whether anything is gated.
    pub fn is_gated(&self) -> bool {
        !self.gates.is_empty()
    }
}

/// Where a source is asked, and with which of the server's credentials.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthEndpoint {
    /// Base URL without a trailing `/`.
    pub url: String,
    /// The name of a credential the server holds (`<creds-dir>/<cluster>/health/<name>/`);
    /// never a path.
    pub credential: Option<String>,
}

/// One named health check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthGate {
    /// The gate's name, unique in its block; shown in plans and halt reasons.
    pub name: String,
    /// What the gate checks.
    pub check: HealthCheck,
    /// Evaluated and reported, never blocking (`dryRun: true`).
    pub dry_run: bool,
    /// Consecutive evaluations that could not ask the source before the gate halts the job
    /// (`consecutiveErrorLimit`, default 4 as Argo Rollouts).
    pub consecutive_error_limit: u32,
    /// What reaching `inconclusiveLimit` does (`onInconclusive`, default halt).
    pub on_inconclusive: OnInconclusive,
}

/// What a gate that reached its `inconclusiveLimit` does (`onInconclusive`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnInconclusive {
    /// Halt the job (`gate_inconclusive`).
    #[default]
    Halt,
    /// Pause the job until `medea rollout resume`.
    Pause,
}

/// What a health gate checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum HealthCheck {
    /// A PromQL condition on the Prometheus source.
    Query {
        /// The PromQL expression; passes iff it returns samples (and every `bool` sample is 1).
        query: String,
    },
    /// No firing alert on the Alertmanager source matches.
    Alerts {
        /// Alertmanager label matchers selecting the alerts that fail the gate (all must match).
        matchers: Vec<String>,
        /// Matchers of alerts that never fail the gate, even when selected.
        ignore: Vec<String>,
        /// Alerts muted by a silence other than medea's own are skipped too.
        #[serde(rename = "skipOperatorSilences")]
        skip_operator_silences: bool,
    },
    /// Workloads in the cluster are ready.
    Workloads {
        /// Namespaces checked; empty: all.
        namespaces: Vec<String>,
        /// Workload kinds checked.
        kinds: Vec<WorkloadKind>,
    },
}

/// A kind of Kubernetes workload a `workloads` gate checks for readiness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum WorkloadKind {
    /// `apps/v1` Deployments.
    Deployment,
    /// `apps/v1` StatefulSets.
    StatefulSet,
    /// `apps/v1` DaemonSets.
    DaemonSet,
}

/// What a failed health gate does to the rollout (`onFailure`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum OnFailure {
    /// Halt the job before touching another node (default).
    #[default]
    Halt,
    /// Roll the failing wave's nodes back to their previous Talos version, then halt.
    Rollback,
}

mod duration_text {
    use std::time::Duration;
    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::super::model::format_duration(*d))
    }
}

// ---------------------------------------------------------------------------------------
// Alertmanager matchers

/// A label matcher's operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MatchOp {
    /// `=`: the label equals the value.
    Equal,
    /// `!=`: the label differs from the value.
    NotEqual,
    /// `=~`: the label matches the anchored regex.
    Regex,
    /// `!~`: the label does not match the anchored regex.
    NotRegex,
}

impl MatchOp {
    /// The operator as written in a matcher, e.g. `=~`.
    pub fn as_str(self) -> &'static str {
        match self {
            MatchOp::Equal => "=",
            MatchOp::NotEqual => "!=",
            MatchOp::Regex => "=~",
            MatchOp::NotRegex => "!~",
        }
    }
}

/// One Alertmanager label matcher, `name="value"` (operators `=`, `!=`, `=~`, `!~`), with
/// Alertmanager's semantics: a regex is anchored at both ends, and a label that is absent
/// matches as the empty string.
#[derive(Debug, Clone)]
pub struct Matcher {
    /// The label name.
    pub name: String,
    /// How the label is compared.
    pub op: MatchOp,
    /// The value (unquoted) or regex compared against.
    pub value: String,
    regex: Option<regex::Regex>,
}

/// Why a matcher does not parse.
#[derive(Debug, thiserror::Error)]
pub enum MatcherError {
    #[error(
        "`{input}` is not a label matcher: write `name=\"value\"` (operators `=`, `!=`, `=~`, `!~`)"
    )]
    /// The text is not `name<op>"value"`.
    Syntax {
        /// The matcher as written.
        input: String,
    },
    /// The value is not double-quoted.
    #[error("matcher `{input}`: the value must be double-quoted, e.g. `{name}{op}\"{value}\"`")]
    Unquoted {
        /// The matcher as written.
        input: String,
        /// The label name found.
        name: String,
        /// The operator found.
        op: &'static str,
        /// The value found, to suggest the quoted form.
        value: String,
    },
    /// The quoted value has a bad escape or no closing quote.
    #[error("matcher `{input}`: the quoted value is malformed (escape `\"` and `\\` with `\\`)")]
    Quoting {
        /// The matcher as written.
        input: String,
    },
    /// The `=~`/`!~` value is not a valid regular expression.
    #[error("matcher `{input}`: the regular expression does not compile")]
    Regex {
        /// The matcher as written.
        input: String,
        /// The regex compiler's error.
        #[source]
        err: Box<regex::Error>,
    },
}

impl Matcher {
    /// Whether the matcher alone matches every alert (issue #50): `=~".*"`, `=~".+"` (or any
    /// regex that takes every probe value), `!=""`, `!~""` on any label. `alertname` is on
    /// every alert, so a "label is set" matcher matches every alert as well.
    pub fn matches_everything(&self) -> bool {
        const PROBES: [&str; 5] = ["a", "Zz9", "KubeNodeNotReady", "node-exporter:9100", "x y"];
        match self.op {
            MatchOp::Regex => self
                .regex
                .as_ref()
                .is_some_and(|r| PROBES.iter().all(|p| r.is_match(p))),
            MatchOp::NotEqual => self.value.is_empty(),
            MatchOp::NotRegex => self
                .regex
                .as_ref()
                .is_some_and(|r| PROBES.iter().all(|p| !r.is_match(p))),
            MatchOp::Equal => false,
        }
    }

    /// Parse one matcher. The value must be double-quoted (valid for both the classic and
    /// the UTF-8 matcher parser of Alertmanager).
    pub fn parse(input: &str) -> Result<Matcher, MatcherError> {
        let syntax = || MatcherError::Syntax {
            input: input.to_string(),
        };
        let s = input.trim();
        let name_len = s
            .char_indices()
            .find(|(i, c)| {
                !(c.is_ascii_alphabetic()
                    || *c == '_'
                    || *c == ':'
                    || (*i > 0 && c.is_ascii_digit()))
            })
            .map_or(s.len(), |(i, _)| i);
        if name_len == 0 {
            return Err(syntax());
        }
        let name = &s[..name_len];
        let rest = s[name_len..].trim_start();
        let (op, rest) = if let Some(r) = rest.strip_prefix("=~") {
            (MatchOp::Regex, r)
        } else if let Some(r) = rest.strip_prefix("!~") {
            (MatchOp::NotRegex, r)
        } else if let Some(r) = rest.strip_prefix("!=") {
            (MatchOp::NotEqual, r)
        } else if let Some(r) = rest.strip_prefix('=') {
            (MatchOp::Equal, r)
        } else {
            return Err(syntax());
        };
        let raw = rest.trim();
        let Some(inner) = raw.strip_prefix('"') else {
            return Err(MatcherError::Unquoted {
                input: input.to_string(),
                name: name.to_string(),
                op: op.as_str(),
                value: raw.to_string(),
            });
        };
        let value = unquote(inner).ok_or_else(|| MatcherError::Quoting {
            input: input.to_string(),
        })?;
        let regex = match op {
            MatchOp::Regex | MatchOp::NotRegex => {
                Some(regex::Regex::new(&format!("^(?:{value})$")).map_err(|err| {
                    MatcherError::Regex {
                        input: input.to_string(),
                        err: Box::new(err),
                    }
                })?)
            }
            _ => None,
        };
        Ok(Matcher {
            name: name.to_string(),
            op,
            value,
            regex,
        })
    }

    /// Whether a label set matches (an absent label is the empty string).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let v = labels.get(&self.name).map_or("", String::as_str);
        match (self.op, &self.regex) {
            (MatchOp::Equal, _) => v == self.value,
            (MatchOp::NotEqual, _) => v != self.value,
            (MatchOp::Regex, Some(r)) => r.is_match(v),
            (MatchOp::NotRegex, Some(r)) => !r.is_match(v),
            // parse() always compiles the regex of a regex operator.
            (MatchOp::Regex | MatchOp::NotRegex, None) => false,
        }
    }

    /// The matcher as Alertmanager's `filter` parameter takes it: `name<op>"value"`.
    pub fn to_filter(&self) -> String {
        let mut out = String::with_capacity(self.name.len() + self.value.len() + 4);
        out.push_str(&self.name);
        out.push_str(self.op.as_str());
        out.push('"');
        for c in self.value.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
        out
    }
}

/// The body of a double-quoted value after its opening quote: up to the closing quote,
/// which must end the input. Escapes `\"`, `\\`, `\n`.
fn unquote(inner: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next()? {
                '"' => out.push('"'),
                '\\' => out.push('\\'),
                'n' => out.push('\n'),
                _ => return None,
            },
            '"' => return chars.as_str().trim().is_empty().then_some(out),
            c => out.push(c),
        }
    }
    None
}

// ---------------------------------------------------------------------------------------
// Query gates

/// What a query gate's top-level expression (after parentheses) is, which decides how its
/// result is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueryShape {
    /// A comparison without `bool`, or a set operation (`and`, `or`, `unless`): a filter.
    /// Passes iff the result has at least one sample.
    Filter,
    /// A comparison with `bool`: passes iff the result has at least one sample and every
    /// sample is 1.
    Bool,
}

/// Why a query cannot be a gate.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// PromQL syntax error.
    #[error("the query does not parse: {message}")]
    Parse {
        /// The PromQL parser's message.
        message: String,
    },
    /// The top-level expression can never fail (e.g. a bare number).
    #[error("the query is not a condition: its top-level expression is {what}")]
    NotACondition {
        /// What the top-level expression is, e.g. `a number literal`.
        what: &'static str,
    },
    /// The expression does not return an instant vector (e.g. a range vector or a string).
    #[error("the query returns a {kind}, not an instant vector")]
    NotAVector {
        /// The type it returns, e.g. `range vector`.
        kind: &'static str,
    },
}

impl QueryShape {
    /// Parse a gate's PromQL and classify its top-level expression.
    pub fn of(query: &str) -> Result<QueryShape, QueryError> {
        use promql_parser::parser::Expr;
        use promql_parser::parser::value::ValueType;
        let expr =
            promql_parser::parser::parse(query).map_err(|message| QueryError::Parse { message })?;
        let mut top = &expr;
        while let Expr::Paren(p) = top {
            top = &p.expr;
        }
        let shape = match top {
            Expr::Binary(b) if b.op.is_comparison_operator() => {
                if b.return_bool() {
                    QueryShape::Bool
                } else {
                    QueryShape::Filter
                }
            }
            Expr::Binary(b) if b.op.is_set_operator() => QueryShape::Filter,
            Expr::Binary(_) => {
                return Err(QueryError::NotACondition { what: "arithmetic" });
            }
            Expr::Aggregate(_) => {
                return Err(QueryError::NotACondition {
                    what: "an aggregation",
                });
            }
            Expr::Unary(_) => return Err(QueryError::NotACondition { what: "a negation" }),
            Expr::Call(_) => {
                return Err(QueryError::NotACondition {
                    what: "a function call",
                });
            }
            Expr::VectorSelector(_) => {
                return Err(QueryError::NotACondition {
                    what: "a series selector",
                });
            }
            Expr::NumberLiteral(_) | Expr::StringLiteral(_) => {
                return Err(QueryError::NotACondition { what: "a literal" });
            }
            Expr::MatrixSelector(_) | Expr::Subquery(_) => {
                return Err(QueryError::NotACondition {
                    what: "a range vector",
                });
            }
            Expr::Paren(_) | Expr::Extension(_) => {
                return Err(QueryError::NotACondition {
                    what: "not a condition",
                });
            }
        };
        match top.value_type() {
            ValueType::Vector => Ok(shape),
            ValueType::Scalar => Err(QueryError::NotAVector { kind: "scalar" }),
            ValueType::Matrix => Err(QueryError::NotAVector {
                kind: "range vector",
            }),
            ValueType::String => Err(QueryError::NotAVector { kind: "string" }),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Validation

fn origin(doc: &DocText<'_>, loc: &serde_saphyr::Location) -> super::model::Origin {
    doc.origin(loc)
}

fn err(
    diags: &mut Vec<Diagnostic>,
    doc: &DocText<'_>,
    loc: &serde_saphyr::Location,
    msg: String,
    help: &str,
) {
    let d = Diagnostic::error(codes::HEALTH, origin(doc, loc), msg);
    diags.push(if help.is_empty() {
        d
    } else {
        d.with_help(help)
    });
}

fn duration(
    diags: &mut Vec<Diagnostic>,
    doc: &DocText<'_>,
    f: &Option<Spanned<String>>,
    allow_zero: bool,
) -> Option<Duration> {
    let f = f.as_ref()?;
    let parsed = if allow_zero {
        crate::duration::Duration::parse(&f.value)
    } else {
        crate::duration::Duration::parse_positive(&f.value)
    };
    match parsed {
        Ok(d) => Some(d.into()),
        Err(e) => {
            diags.push(Diagnostic::error(
                codes::DURATION,
                doc.origin(&f.referenced),
                e.to_string(),
            ));
            None
        }
    }
}

fn endpoint(
    diags: &mut Vec<Diagnostic>,
    doc: &DocText<'_>,
    what: &str,
    spec: &EndpointSpec,
) -> Option<HealthEndpoint> {
    let url = match check_url(&spec.url.value) {
        Ok(u) => Some(u),
        Err(why) => {
            err(
                diags,
                doc,
                &spec.url.referenced,
                format!("`health.{what}.url` `{}` {why}", spec.url.value),
                "write an http:// or https:// URL such as `https://prometheus.monitoring:9090`",
            );
            None
        }
    };
    let mut ok = true;
    for (field, f, instead) in [
        ("caFile", &spec.ca_file, "`ca.pem`"),
        ("bearerTokenFile", &spec.bearer_token_file, "`token`"),
    ] {
        if let Some(f) = f {
            ok = false;
            err(
                diags,
                doc,
                &f.referenced,
                format!(
                    "`health.{what}.{field}` is no longer accepted: the repository may not choose which file medea reads or sends"
                ),
                &format!(
                    "write `credential: <name>` instead and put the file, as {instead}, in `<creds-dir>/<cluster>/health/<name>/` on the machine medea runs on (0600; see README, Security)"
                ),
            );
        }
    }
    if let Some(c) = &spec.credential
        && !super::validate::is_dns_label(&c.value)
    {
        ok = false;
        err(
            diags,
            doc,
            &c.referenced,
            format!(
                "`health.{what}.credential` `{}` is not a credential name",
                c.value
            ),
            "a credential is named, never a path: lowercase letters, digits and `-` (at most 63 characters), e.g. `prometheus`",
        );
    }
    let url = url?;
    if url.starts_with("http://")
        && let Some(c) = &spec.credential
    {
        ok = false;
        err(
            diags,
            doc,
            &c.referenced,
            format!(
                "`health.{what}.credential` is set but the URL is plain http://: the token would cross the network in clear"
            ),
            "use an https:// URL, or remove `credential`",
        );
    }
    ok.then(|| HealthEndpoint {
        url,
        credential: spec.credential.as_ref().map(|c| c.value.clone()),
    })
}

/// A base URL: `http` or `https`, a host, no credentials, query or fragment. Returns it
/// without a trailing `/`.
pub(super) fn check_url(input: &str) -> Result<String, &'static str> {
    let rest = if let Some(r) = input.strip_prefix("https://") {
        r
    } else if let Some(r) = input.strip_prefix("http://") {
        r
    } else {
        return Err("is not an http:// or https:// URL");
    };
    if input.contains(['?', '#']) {
        return Err("has a query or fragment");
    }
    if input.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("contains whitespace");
    }
    let authority = rest.split('/').next().unwrap_or("");
    if authority.contains('@') {
        return Err("carries credentials (name the server's credential with `credential`)");
    }
    if authority.is_empty() || authority.starts_with(':') {
        return Err("has no host");
    }
    let uri: Result<hyper_free_uri::Uri, _> = input.parse();
    if uri.is_err() {
        return Err("is not a valid URL");
    }
    if let Some((_, port)) = authority.rsplit_once(':')
        && !authority.ends_with(']')
        && port.parse::<u16>().is_err()
    {
        return Err("has an invalid port");
    }
    Ok(input.trim_end_matches('/').to_string())
}

/// `http::Uri` (the URI type hyper uses; the `http` crate does no I/O).
mod hyper_free_uri {
    pub use http::Uri;
}

fn is_gate_name(s: &str) -> bool {
    super::validate::is_dns_label(s)
}

fn gates(
    diags: &mut Vec<Diagnostic>,
    doc: &DocText<'_>,
    spec: &Spanned<Vec<GateSpec>>,
    sources: (bool, bool),
) -> Vec<HealthGate> {
    let mut out = Vec::new();
    let mut names: BTreeSet<String> = BTreeSet::new();
    for g in &spec.value {
        let name = &g.name.value;
        let mut ok = true;
        if !is_gate_name(name) {
            ok = false;
            err(
                diags,
                doc,
                &g.name.referenced,
                format!("gate name `{name}` is not a valid name"),
                "use lowercase letters, digits and `-` (at most 63 characters)",
            );
        } else if !names.insert(name.clone()) {
            ok = false;
            err(
                diags,
                doc,
                &g.name.referenced,
                format!("gate `{name}` is defined twice"),
                "gate names are unique in their list: they name the evidence in the journal",
            );
        }
        let kinds = [
            g.query.as_ref().map(|q| ("query", q.referenced)),
            g.alerts.as_ref().map(|a| ("alerts", a.referenced)),
            g.workloads.as_ref().map(|w| ("workloads", w.referenced)),
        ];
        let set: Vec<(&str, serde_saphyr::Location)> = kinds.into_iter().flatten().collect();
        let check = match set.as_slice() {
            [] => {
                err(
                    diags,
                    doc,
                    &g.name.referenced,
                    format!("gate `{name}` has no check"),
                    "give exactly one of `query`, `alerts` or `workloads`",
                );
                None
            }
            [_] => gate_check(diags, doc, name, g, sources),
            [_, (second, at), ..] => {
                let all: Vec<&str> = set.iter().map(|(k, _)| *k).collect();
                err(
                    diags,
                    doc,
                    at,
                    format!(
                        "gate `{name}` has {} checks ({}); `{second}` is one too many",
                        all.len(),
                        all.join(", ")
                    ),
                    "a gate has exactly one check: split it into one gate per check",
                );
                None
            }
        };
        let consecutive_error_limit = match &g.consecutive_error_limit {
            None => DEFAULT_CONSECUTIVE_ERROR_LIMIT,
            Some(n) if n.value == 0 => {
                ok = false;
                err(
                    diags,
                    doc,
                    &n.referenced,
                    format!("gate `{name}`: `consecutiveErrorLimit` must be at least 1"),
                    "leave it out for the default (4 consecutive errors halt the job)",
                );
                0
            }
            Some(n) => n.value,
        };
        let on_inconclusive = match g.on_inconclusive {
            None | Some(crate::desired::format::OnInconclusiveSpec::Halt) => OnInconclusive::Halt,
            Some(crate::desired::format::OnInconclusiveSpec::Pause) => OnInconclusive::Pause,
        };
        if let (Some(check), true) = (check, ok) {
            out.push(HealthGate {
                name: name.clone(),
                check,
                dry_run: g.dry_run.as_ref().is_some_and(|d| d.value),
                consecutive_error_limit,
                on_inconclusive,
            });
        }
    }
    out
}

fn gate_check(
    diags: &mut Vec<Diagnostic>,
    doc: &DocText<'_>,
    name: &str,
    g: &GateSpec,
    (prometheus, alertmanager): (bool, bool),
) -> Option<HealthCheck> {
    if let Some(q) = &g.query {
        let mut ok = true;
        if !prometheus {
            ok = false;
            err(
                diags,
                doc,
                &q.referenced,
                format!("query gate `{name}` needs a Prometheus, and the cluster has none"),
                "set `health.prometheus.url` on the Cluster",
            );
        }
        match QueryShape::of(&q.value) {
            Ok(_) => {}
            Err(e @ QueryError::Parse { .. }) => {
                ok = false;
                err(
                    diags,
                    doc,
                    &q.referenced,
                    format!("query gate `{name}`: {e}"),
                    "the query is PromQL as Prometheus's /api/v1/query takes it",
                );
            }
            Err(e) => {
                ok = false;
                err(
                    diags,
                    doc,
                    &q.referenced,
                    format!("query gate `{name}`: {e}"),
                    "write a condition, e.g. `ceph_health_status == 0` (passes when it returns a sample) or `up{job=\"ceph\"} == bool 1` (passes when every sample is 1)",
                );
            }
        }
        return ok.then(|| HealthCheck::Query {
            query: q.value.clone(),
        });
    }
    if let Some(a) = &g.alerts {
        let AlertsGateSpec {
            matchers,
            ignore,
            skip_operator_silences,
        } = &a.value;
        let mut ok = true;
        if !alertmanager {
            ok = false;
            err(
                diags,
                doc,
                &a.referenced,
                format!("alerts gate `{name}` needs an Alertmanager, and the cluster has none"),
                "set `health.alertmanager.url` on the Cluster",
            );
        }
        for m in matchers.iter().chain(ignore) {
            if let Err(e) = Matcher::parse(&m.value) {
                ok = false;
                let mut msg = e.to_string();
                let mut src: Option<&dyn std::error::Error> = std::error::Error::source(&e);
                while let Some(s) = src {
                    msg.push_str(": ");
                    msg.push_str(&s.to_string());
                    src = s.source();
                }
                err(
                    diags,
                    doc,
                    &m.referenced,
                    format!("alerts gate `{name}`: {msg}"),
                    "matchers are Alertmanager's: `severity=\"critical\"`, `alertname!~\"Watchdog|InfoInhibitor\"`",
                );
            }
        }
        return ok.then(|| HealthCheck::Alerts {
            matchers: matchers
                .iter()
                .map(|m| m.value.trim().to_string())
                .collect(),
            ignore: ignore.iter().map(|m| m.value.trim().to_string()).collect(),
            skip_operator_silences: *skip_operator_silences,
        });
    }
    if let Some(w) = &g.workloads {
        let WorkloadsGateSpec { namespaces, kinds } = &w.value;
        let mut ok = true;
        if namespaces.is_empty() {
            ok = false;
            err(
                diags,
                doc,
                &w.referenced,
                format!("workloads gate `{name}` names no namespace"),
                "list the namespaces whose Deployments, StatefulSets and DaemonSets must be available",
            );
        }
        let mut ns = BTreeSet::new();
        for n in namespaces {
            if !super::validate::is_dns_label(&n.value) {
                ok = false;
                err(
                    diags,
                    doc,
                    &n.referenced,
                    format!("`{}` is not a valid namespace name", n.value),
                    "",
                );
            } else if !ns.insert(n.value.clone()) {
                ok = false;
                err(
                    diags,
                    doc,
                    &n.referenced,
                    format!("namespace `{}` is listed twice", n.value),
                    "",
                );
            }
        }
        let mut ks = BTreeSet::new();
        match kinds {
            None => {
                ks.extend([
                    WorkloadKind::Deployment,
                    WorkloadKind::StatefulSet,
                    WorkloadKind::DaemonSet,
                ]);
            }
            Some(list) if list.is_empty() => {
                ok = false;
                err(
                    diags,
                    doc,
                    &w.referenced,
                    format!("workloads gate `{name}` checks no kind"),
                    "remove `kinds` to check all three, or list some of Deployment, StatefulSet, DaemonSet",
                );
            }
            Some(list) => {
                for k in list {
                    let kind = match k.value {
                        WorkloadKindSpec::Deployment => WorkloadKind::Deployment,
                        WorkloadKindSpec::StatefulSet => WorkloadKind::StatefulSet,
                        WorkloadKindSpec::DaemonSet => WorkloadKind::DaemonSet,
                    };
                    if !ks.insert(kind) {
                        ok = false;
                        err(
                            diags,
                            doc,
                            &k.referenced,
                            format!("kind `{kind:?}` is listed twice"),
                            "",
                        );
                    }
                }
            }
        }
        return ok.then(|| HealthCheck::Workloads {
            namespaces: namespaces.iter().map(|n| n.value.clone()).collect(),
            kinds: ks.into_iter().collect(),
        });
    }
    None
}

fn failure_limit(
    diags: &mut Vec<Diagnostic>,
    doc: &DocText<'_>,
    f: &Option<Spanned<u32>>,
) -> Option<u32> {
    let f = f.as_ref()?;
    if f.value == 0 {
        err(
            diags,
            doc,
            &f.referenced,
            "`health.failureLimit` must be at least 1".to_string(),
            "it counts consecutive failed evaluations before the gate fails; 1 fails on the first",
        );
        return None;
    }
    Some(f.value)
}

fn inconclusive_limit(
    diags: &mut Vec<Diagnostic>,
    doc: &DocText<'_>,
    f: &Option<Spanned<u32>>,
) -> Option<u32> {
    let f = f.as_ref()?;
    if f.value == 0 {
        err(
            diags,
            doc,
            &f.referenced,
            "`health.inconclusiveLimit` must be at least 1".to_string(),
            "it counts the evaluations that could not tell (source unreachable, query error, no sample) before the job halts; 1 halts on the first",
        );
        return None;
    }
    Some(f.value)
}

/// Apply the fields a block sets on top of `base`; checks soak against gates and interval.
fn apply(
    diags: &mut Vec<Diagnostic>,
    doc: &DocText<'_>,
    base: &HealthSettings,
    c: GateFields<'_>,
) -> HealthSettings {
    let mut out = base.clone();
    let sources = (out.prometheus.is_some(), out.alertmanager.is_some());
    if let Some(g) = c.gates {
        out.gates = gates(diags, doc, g, sources);
    }
    if let Some(d) = duration(diags, doc, c.soak, true) {
        out.soak = d;
    }
    if let Some(d) = duration(diags, doc, c.interval, false) {
        out.interval = d;
    }
    if let Some(n) = failure_limit(diags, doc, c.failure_limit) {
        out.failure_limit = n;
    }
    if let Some(n) = inconclusive_limit(diags, doc, c.inconclusive_limit) {
        out.inconclusive_limit = n;
    }
    // Whether gates were written (valid or not: invalid ones are reported already).
    let has_gates = match c.gates {
        Some(g) => !g.value.is_empty(),
        None => base.is_gated(),
    };
    if let Some(soak) = c.soak
        && !out.soak.is_zero()
        && !has_gates
    {
        err(
            diags,
            doc,
            &soak.referenced,
            format!("`health.soak` is {} but there are no gates", soak.value),
            "the soak is how long every gate must keep passing: add gates, or remove `soak`",
        );
    }
    if !out.soak.is_zero() && out.interval > out.soak && has_gates {
        let at = c.interval.as_ref().or(c.soak.as_ref());
        if let Some(at) = at {
            err(
                diags,
                doc,
                &at.referenced,
                format!(
                    "`health.interval` ({}) is longer than `health.soak` ({}): the soak would end before its second evaluation",
                    super::model::format_duration(out.interval),
                    super::model::format_duration(out.soak)
                ),
                "make the interval shorter than the soak",
            );
        }
    }
    out
}

/// A Cluster's `health:` block. `None` → no gates (the defaults).
pub fn cluster_health(
    diags: &mut Vec<Diagnostic>,
    doc: &DocText<'_>,
    spec: Option<&HealthSpec>,
) -> HealthSettings {
    let Some(spec) = spec else {
        return HealthSettings::default();
    };
    let base = HealthSettings {
        prometheus: spec
            .prometheus
            .as_ref()
            .and_then(|p| endpoint(diags, doc, "prometheus", p)),
        alertmanager: spec
            .alertmanager
            .as_ref()
            .and_then(|a| endpoint(diags, doc, "alertmanager", a)),
        ..HealthSettings::default()
    };
    // A source that failed validation still counts as configured: its gates are not
    // reported again for lacking one.
    let mut probe = base.clone();
    if spec.prometheus.is_some() && probe.prometheus.is_none() {
        probe.prometheus = Some(placeholder());
    }
    if spec.alertmanager.is_some() && probe.alertmanager.is_none() {
        probe.alertmanager = Some(placeholder());
    }
    let mut out = apply(diags, doc, &probe, spec.gate_fields());
    out.prometheus = base.prometheus;
    out.alertmanager = base.alertmanager;
    out.silence = spec
        .silence
        .as_ref()
        .and_then(|s| silence(diags, doc, s, probe.alertmanager.is_some()));
    out
}

/// Whether `s` is a Prometheus label name (`[a-zA-Z_][a-zA-Z0-9_]*`).
fn is_label_name(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// A Cluster's `health.silence`.
fn silence(
    diags: &mut Vec<Diagnostic>,
    doc: &DocText<'_>,
    spec: &Spanned<SilenceSpec>,
    alertmanager: bool,
) -> Option<SilenceSettings> {
    let s = &spec.value;
    let mut ok = true;
    if !alertmanager {
        ok = false;
        err(
            diags,
            doc,
            &spec.referenced,
            "`health.silence` needs an Alertmanager, and the cluster has none".to_string(),
            "set `health.alertmanager.url` on the Cluster: the silences are created there",
        );
    }
    let label = s.node_label.value.trim();
    if !is_label_name(label) {
        ok = false;
        err(
            diags,
            doc,
            &s.node_label.referenced,
            format!("`health.silence.nodeLabel` `{label}` is not a label name"),
            "name the alert label that holds the node, e.g. `instance` or `node`",
        );
    }
    if s.matchers.is_empty() {
        ok = false;
        err(
            diags,
            doc,
            &spec.referenced,
            "`health.silence.matchers` is empty: the silence would cover every alert about the node"
                .to_string(),
            "list the alerts a reboot is expected to fire, e.g. `alertname=~\"KubeNodeNotReady|TargetDown\"`",
        );
    }
    for m in &s.matchers {
        match Matcher::parse(&m.value) {
            Ok(parsed) if parsed.name == label => {
                ok = false;
                err(
                    diags,
                    doc,
                    &m.referenced,
                    format!("`health.silence.matchers` matches on `{label}`, the node label"),
                    "medea adds the node's matcher itself; remove this one",
                );
            }
            Ok(parsed) if s.matchers.len() == 1 && parsed.matches_everything() => {
                ok = false;
                err(
                    diags,
                    doc,
                    &m.referenced,
                    format!(
                        "`health.silence.matchers` `{}` alone matches every alert about the node",
                        m.value.trim()
                    ),
                    "name the alerts a reboot is expected to fire, e.g. `alertname=~\"KubeNodeNotReady|TargetDown\"`",
                );
            }
            Ok(_) => {}
            Err(e) => {
                ok = false;
                err(
                    diags,
                    doc,
                    &m.referenced,
                    format!("`health.silence.matchers`: {}", crate::error_chain(&e)),
                    "matchers are Alertmanager's: `alertname=\"KubeNodeNotReady\"`, `severity=~\"warning|critical\"`",
                );
            }
        }
    }
    let lease = duration(diags, doc, &s.lease, false);
    let max = duration(diags, doc, &s.max_duration, false);
    if s.lease.is_some() && lease.is_none() || s.max_duration.is_some() && max.is_none() {
        ok = false;
    }
    let lease = lease.unwrap_or(DEFAULT_SILENCE_LEASE);
    let max = max.unwrap_or(DEFAULT_SILENCE_MAX);
    if lease < MIN_SILENCE_LEASE {
        ok = false;
        let at = s.lease.as_ref().map_or(spec.referenced, |l| l.referenced);
        err(
            diags,
            doc,
            &at,
            format!(
                "`health.silence.lease` is {}, shorter than {}",
                super::model::format_duration(lease),
                super::model::format_duration(MIN_SILENCE_LEASE)
            ),
            "medea renews a silence when half its lease is left; give it at least a minute",
        );
    }
    if lease > MAX_SILENCE_LEASE {
        ok = false;
        let at = s.lease.as_ref().map_or(spec.referenced, |l| l.referenced);
        err(
            diags,
            doc,
            &at,
            format!(
                "`health.silence.lease` is {}, longer than {}",
                super::model::format_duration(lease),
                super::model::format_duration(MAX_SILENCE_LEASE)
            ),
            "a lease outlives the server that renews it; medea renews it while the node works, so 30m at most",
        );
    }
    if max > MAX_SILENCE_DURATION {
        ok = false;
        let at = s
            .max_duration
            .as_ref()
            .map_or(spec.referenced, |l| l.referenced);
        err(
            diags,
            doc,
            &at,
            format!(
                "`health.silence.maxDuration` is {}, longer than {}",
                super::model::format_duration(max),
                super::model::format_duration(MAX_SILENCE_DURATION)
            ),
            "a node whose step takes longer should page: 12h at most",
        );
    }
    if max < lease {
        ok = false;
        let at = s
            .max_duration
            .as_ref()
            .or(s.lease.as_ref())
            .map_or(spec.referenced, |l| l.referenced);
        err(
            diags,
            doc,
            &at,
            format!(
                "`health.silence.maxDuration` ({}) is shorter than its lease ({})",
                super::model::format_duration(max),
                super::model::format_duration(lease)
            ),
            "maxDuration caps how long a node's silence is renewed; make it at least the lease",
        );
    }
    ok.then(|| SilenceSettings {
        matchers: s
            .matchers
            .iter()
            .map(|m| m.value.trim().to_string())
            .collect(),
        node_label: label.to_string(),
        lease,
        max_duration: max,
        on_error: match s.on_error.as_ref().map(|o| o.value) {
            None | Some(SilenceOnErrorSpec::Halt) => SilenceOnError::Halt,
            Some(SilenceOnErrorSpec::Proceed) => SilenceOnError::Proceed,
        },
    })
}

fn placeholder() -> HealthEndpoint {
    HealthEndpoint {
        url: String::new(),
        credential: None,
    }
}

/// A NodePool's effective settings: its `health:` overrides and `onFailure` on top of the
/// cluster's.
pub fn pool_health(
    diags: &mut Vec<Diagnostic>,
    doc: &DocText<'_>,
    cluster: &HealthSettings,
    spec: Option<&PoolHealthSpec>,
    on_failure: Option<&Spanned<OnFailureSpec>>,
) -> HealthSettings {
    let mut out = match spec {
        None => cluster.clone(),
        Some(spec) => apply(diags, doc, cluster, spec.gate_fields()),
    };
    out.on_failure = match on_failure.map(|o| o.value) {
        None | Some(OnFailureSpec::Halt) => OnFailure::Halt,
        Some(OnFailureSpec::Rollback) => OnFailure::Rollback,
    };
    if let Some(o) = on_failure
        && o.value == OnFailureSpec::Rollback
        && !out.is_gated()
    {
        diags.push(
            Diagnostic::warning(
                codes::HEALTH,
                doc.origin(&o.referenced),
                "`onFailure: rollback` has no effect: this pool has no health gates",
            )
            .with_help("rollback undoes a wave whose health gates fail; give the pool (or its cluster) `health.gates`"),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn matchers_parse_and_match_like_alertmanager() {
        let m = Matcher::parse(r#"severity="critical""#).unwrap();
        assert!(m.matches(&labels(&[("severity", "critical")])));
        assert!(!m.matches(&labels(&[("severity", "warning")])));
        assert!(!m.matches(&labels(&[])));
        let r = Matcher::parse(r#"alertname=~"Kube.*""#).unwrap();
        assert!(r.matches(&labels(&[("alertname", "KubeNodeUnreachable")])));
        // Anchored: a substring does not match.
        assert!(!r.matches(&labels(&[("alertname", "NotKube")])));
        let n = Matcher::parse(r#" team != "db" "#).unwrap();
        assert!(n.matches(&labels(&[])), "absent label is empty");
        assert!(!n.matches(&labels(&[("team", "db")])));
        let nr = Matcher::parse(r#"node!~"cp-.*""#).unwrap();
        assert!(nr.matches(&labels(&[("node", "w-1")])));
        assert!(!nr.matches(&labels(&[("node", "cp-1")])));
        let q = Matcher::parse(r#"summary="a \"b\" \\ c""#).unwrap();
        assert_eq!(q.value, r#"a "b" \ c"#);
        assert_eq!(q.to_filter(), r#"summary="a \"b\" \\ c""#);
        assert_eq!(m.to_filter(), r#"severity="critical""#);
    }

    #[test]
    fn bad_matchers_say_why() {
        assert!(matches!(
            Matcher::parse("severity"),
            Err(MatcherError::Syntax { .. })
        ));
        assert!(matches!(
            Matcher::parse("=\"x\""),
            Err(MatcherError::Syntax { .. })
        ));
        let e = Matcher::parse("severity=critical").unwrap_err();
        assert!(matches!(e, MatcherError::Unquoted { .. }));
        assert!(e.to_string().contains(r#"severity="critical""#), "{e}");
        assert!(matches!(
            Matcher::parse(r#"a="x"y"#),
            Err(MatcherError::Quoting { .. })
        ));
        assert!(matches!(
            Matcher::parse(r#"a="x"#),
            Err(MatcherError::Quoting { .. })
        ));
        assert!(matches!(
            Matcher::parse(r#"a=~"(x""#),
            Err(MatcherError::Regex { .. })
        ));
    }

    #[test]
    fn query_shapes() {
        assert_eq!(
            QueryShape::of("ceph_health_status == 0").unwrap(),
            QueryShape::Filter
        );
        assert_eq!(
            QueryShape::of(
                r#"sum(rate(nginx_ingress_controller_requests{status=~"5.."}[2m])) < 1"#
            )
            .unwrap(),
            QueryShape::Filter
        );
        assert_eq!(
            QueryShape::of("((up == bool 1))").unwrap(),
            QueryShape::Bool
        );
        assert_eq!(
            QueryShape::of("up and on(job) ceph_up").unwrap(),
            QueryShape::Filter
        );
        assert_eq!(
            QueryShape::of("absent(foo) unless bar").unwrap(),
            QueryShape::Filter
        );
        for (q, what) in [
            ("up", "a series selector"),
            ("sum(up)", "an aggregation"),
            ("up + 1", "arithmetic"),
            ("absent(up)", "a function call"),
            ("-up", "a negation"),
            ("1", "a literal"),
        ] {
            let e = QueryShape::of(q).unwrap_err();
            assert!(
                matches!(e, QueryError::NotACondition { what: w } if w == what),
                "{q}: {e}"
            );
        }
        assert!(matches!(
            QueryShape::of("1 < bool 2"),
            Err(QueryError::NotAVector { kind: "scalar" })
        ));
        assert!(matches!(
            QueryShape::of("sum(rate(x[2m]) <"),
            Err(QueryError::Parse { .. })
        ));
    }

    #[test]
    fn urls() {
        assert_eq!(
            check_url("https://prometheus.monitoring:9090/").unwrap(),
            "https://prometheus.monitoring:9090"
        );
        assert_eq!(
            check_url("http://127.0.0.1:9093/am").unwrap(),
            "http://127.0.0.1:9093/am"
        );
        assert!(check_url("http://[::1]:9090").is_ok());
        for bad in [
            "prometheus:9090",
            "ftp://x",
            "http://",
            "http://:9090",
            "http://u:p@host",
            "http://host?x=1",
            "http://host:99999",
            "http://ho st",
        ] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
    }
}
