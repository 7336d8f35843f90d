//! Blocking hooks (issue #35 item 2): the validated model of the `hooks:` blocks of a Cluster
//! (`beforeJob`, `afterJob`) and a NodePool (`beforeWave`, `beforeNode`, `afterNode`,
//! `afterWave`), and their validation. Pure.
//!
//! The same types are what a plan carries (`TalosRollout::hooks`, `ClusterPlan::hooks`, part
//! of the plan's id, as `DrainPolicy` is): signers see every action a hook takes and where.
//! The sequencer (`rollout::sequencer::hooks`) decides when each runs and journals it; the
//! executor hands an HTTP hook to the health probe's HTTP client and a Job hook to the
//! Kubernetes port.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use super::diagnostic::{Diagnostic, codes};
use super::format::{ClusterHooksSpec, HookSpec, PoolHooksSpec};
use super::parse::DocText;

/// Where in a rollout a hook runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum HookPoint {
    /// Before the job touches anything (after the cluster's `beforeJob` gates).
    BeforeJob,
    /// Before a wave's first node starts (after the wave's gates).
    BeforeWave,
    /// Before a node is cordoned (after its checks and its pull).
    BeforeNode,
    /// After a node is back and uncordoned (its silence, if any, already expired).
    AfterNode,
    /// After every node of a wave is done, before the wave's soak.
    AfterWave,
    /// After the last step, before the job's soak.
    AfterJob,
}

impl HookPoint {
    /// Every point, in the order a job meets them.
    pub const ALL: [HookPoint; 6] = [
        HookPoint::BeforeJob,
        HookPoint::BeforeWave,
        HookPoint::BeforeNode,
        HookPoint::AfterNode,
        HookPoint::AfterWave,
        HookPoint::AfterJob,
    ];

    /// The name the YAML, the journal and the HTTP event use (`beforeNode`).
    pub fn as_str(self) -> &'static str {
        match self {
            HookPoint::BeforeJob => "beforeJob",
            HookPoint::BeforeWave => "beforeWave",
            HookPoint::BeforeNode => "beforeNode",
            HookPoint::AfterNode => "afterNode",
            HookPoint::AfterWave => "afterWave",
            HookPoint::AfterJob => "afterJob",
        }
    }
}

impl fmt::Display for HookPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One hook, as approved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    /// Unique among the hooks of its point (a DNS label); names it in the journal and halts.
    pub name: String,
    /// How long it may take, retries included; past it, the job halts (`hook_failed`).
    #[serde(with = "crate::duration::serde_lenient")]
    pub timeout: Duration,
    /// Whether running it twice is harmless: only then is a hook whose result was lost (medea
    /// stopped while it ran) run again; otherwise the job halts `hook_interrupted`.
    #[serde(default)]
    pub idempotent: bool,
    /// What it does.
    pub action: HookAction,
}

/// The default `ttlSecondsAfterFinished` of a Job hook: a day, long enough for a person to
/// read a failed hook's pod and for medea to read its result after a restart.
pub const DEFAULT_HOOK_JOB_TTL_SECS: u64 = 86_400;
/// The shortest `ttlSecondsAfterFinished` accepted: medea reads the pod's log and exit code
/// after the Job finished, so the Job must outlive that read.
pub const MIN_HOOK_JOB_TTL_SECS: u64 = 60;

fn default_hook_job_ttl() -> u64 {
    DEFAULT_HOOK_JOB_TTL_SECS
}

fn is_default_hook_job_ttl(n: &u64) -> bool {
    *n == DEFAULT_HOOK_JOB_TTL_SECS
}

/// What a hook does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    rename_all = "camelCase",
    rename_all_fields = "camelCase",
    tag = "kind"
)]
pub enum HookAction {
    /// `POST` of a JSON event to `url`; a 2xx answer is success, anything else is retried
    /// with backoff until the timeout.
    Http {
        /// The URL the event is posted to.
        url: String,
        /// The name of the server's credential (`<creds-dir>/<cluster>/hooks/<name>/`), never
        /// a path. `None`: no token, the system's roots.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        credential: Option<String>,
    },
    /// A `batch/v1` Job created in the target cluster; success is its `Complete` condition.
    Job {
        /// The namespace the Job is created in.
        namespace: String,
        /// The Job's pod spec as written (`containers`, `serviceAccountName`, `volumes`...);
        /// medea sets `restartPolicy: Never`, adds the `MEDEA_*` environment to every
        /// container and labels naming the job and the hook.
        pod_spec: serde_json::Value,
        /// Seconds after the Job finished before Kubernetes' TTL controller deletes it (with
        /// its pod), so one Job per node, point and hook does not pile up (issue #51 item 5).
        /// Not written when it is the default ([`DEFAULT_HOOK_JOB_TTL_SECS`]).
        #[serde(
            default = "default_hook_job_ttl",
            skip_serializing_if = "is_default_hook_job_ttl"
        )]
        ttl_seconds_after_finished: u64,
    },
}

impl Hook {
    /// `noout (job in namespace kube-system; timeout 5m)` / `notify (http POST
    /// https://x/hook, credential ops; timeout 1m)`: the head of a hook as plans show it; a
    /// Job hook's [`Hook::detail`] follows it.
    pub fn summary(&self) -> String {
        let what = match &self.action {
            HookAction::Http { url, credential } => match credential {
                Some(c) => format!("http POST {url}, credential {c}"),
                None => format!("http POST {url}, no credential"),
            },
            HookAction::Job {
                namespace,
                ttl_seconds_after_finished,
                ..
            } if !is_default_hook_job_ttl(ttl_seconds_after_finished) => format!(
                "job in namespace {namespace}, deleted {} after it finished",
                crate::desired::model::format_duration(Duration::from_secs(
                    *ttl_seconds_after_finished
                ))
            ),
            HookAction::Job { namespace, .. } => format!("job in namespace {namespace}"),
        };
        format!(
            "{} ({what}; timeout {}{})",
            self.name,
            crate::desired::model::format_duration(self.timeout),
            if self.idempotent { "; idempotent" } else { "" }
        )
    }

    /// What a Job hook runs and may reach, one line per container and one for the pod
    /// ([`super::hook_view::JobView::lines`]); nothing for an HTTP hook.
    pub fn detail(&self) -> Vec<String> {
        match &self.action {
            HookAction::Http { .. } => Vec::new(),
            HookAction::Job {
                namespace,
                pod_spec,
                ..
            } => super::hook_view::JobView::of(namespace, pod_spec).lines(),
        }
    }

    /// [`Hook::summary`] and [`Hook::detail`] on one line (the settings diff's value).
    pub fn one_line(&self) -> String {
        let detail = self.detail();
        if detail.is_empty() {
            self.summary()
        } else {
            format!("{}: {}", self.summary(), detail.join(" | "))
        }
    }
}

/// One hook as a plan lists it: `beforeNode: noout (job ...)`, then its detail lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookLines {
    /// `beforeNode: noout (job in namespace rook-ceph; timeout 5m)`.
    pub head: String,
    /// [`Hook::detail`].
    pub detail: Vec<String>,
}

/// Where each hook's `job.podSpec` (or, for an HTTP hook, its name) was written, by point and
/// name: the server's hook policy locates its refusals there ([`super::hook_policy`]).
pub type HookOrigins = std::collections::BTreeMap<(HookPoint, String), super::model::Origin>;

/// The hooks of a pool (node and wave points) or of a cluster (job points), by point. Absent
/// from plans without hooks, so their ids are unchanged.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hooks {
    /// Before the job.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub before_job: Vec<Hook>,
    /// Before each wave.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub before_wave: Vec<Hook>,
    /// Before each node's cordon.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub before_node: Vec<Hook>,
    /// After each node is back and uncordoned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_node: Vec<Hook>,
    /// After each wave.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_wave: Vec<Hook>,
    /// After the job.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_job: Vec<Hook>,
}

impl Hooks {
    /// The hooks of `point`, in the order they run.
    pub fn at(&self, point: HookPoint) -> &[Hook] {
        match point {
            HookPoint::BeforeJob => &self.before_job,
            HookPoint::BeforeWave => &self.before_wave,
            HookPoint::BeforeNode => &self.before_node,
            HookPoint::AfterNode => &self.after_node,
            HookPoint::AfterWave => &self.after_wave,
            HookPoint::AfterJob => &self.after_job,
        }
    }

    /// The hooks of `point`, for writing.
    pub fn at_mut(&mut self, point: HookPoint) -> &mut Vec<Hook> {
        match point {
            HookPoint::BeforeJob => &mut self.before_job,
            HookPoint::BeforeWave => &mut self.before_wave,
            HookPoint::BeforeNode => &mut self.before_node,
            HookPoint::AfterNode => &mut self.after_node,
            HookPoint::AfterWave => &mut self.after_wave,
            HookPoint::AfterJob => &mut self.after_job,
        }
    }

    /// Whether no point has a hook.
    pub fn is_empty(&self) -> bool {
        HookPoint::ALL.iter().all(|p| self.at(*p).is_empty())
    }

    /// `Some(self)` unless empty (plans carry no empty hook sets).
    pub fn non_empty(self) -> Option<Hooks> {
        (!self.is_empty()).then_some(self)
    }

    /// Every hook, point by point in the order they run: a head line each
    /// (`beforeNode: noout (job ...)`) and, for a Job hook, what it runs and may reach.
    pub fn lines(&self) -> Vec<HookLines> {
        HookPoint::ALL
            .iter()
            .flat_map(|p| {
                self.at(*p).iter().map(move |h| HookLines {
                    head: format!("{p}: {}", h.summary()),
                    detail: h.detail(),
                })
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------------------
// Validation

/// Longest `timeout` a hook may have.
pub const MAX_HOOK_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// Environment variables medea sets in a Job hook's containers (a template may not set them).
pub const JOB_ENV: [&str; 3] = ["MEDEA_NODE", "MEDEA_JOB_ID", "MEDEA_HOOK_POINT"];

fn err(
    diags: &mut Vec<Diagnostic>,
    doc: &DocText<'_>,
    loc: &serde_saphyr::Location,
    msg: String,
    help: &str,
) {
    diags.push(Diagnostic::error(codes::HOOKS, doc.origin(loc), msg).with_help(help.to_string()));
}

/// A Cluster's `hooks:` (`beforeJob`, `afterJob`). Every problem is reported; a hook with
/// any is left out (the revision is refused anyway).
pub fn cluster_hooks(
    diags: &mut Vec<Diagnostic>,
    doc: &DocText<'_>,
    spec: Option<&ClusterHooksSpec>,
) -> (Hooks, HookOrigins) {
    let mut out = Hooks::default();
    let mut at = HookOrigins::new();
    if let Some(s) = spec {
        out.before_job = point(diags, doc, &mut at, HookPoint::BeforeJob, &s.before_job);
        out.after_job = point(diags, doc, &mut at, HookPoint::AfterJob, &s.after_job);
    }
    (out, at)
}

/// A NodePool's `hooks:` (`beforeWave`, `beforeNode`, `afterNode`, `afterWave`).
pub fn pool_hooks(
    diags: &mut Vec<Diagnostic>,
    doc: &DocText<'_>,
    spec: Option<&PoolHooksSpec>,
) -> (Hooks, HookOrigins) {
    let mut out = Hooks::default();
    let mut at = HookOrigins::new();
    if let Some(s) = spec {
        out.before_wave = point(diags, doc, &mut at, HookPoint::BeforeWave, &s.before_wave);
        out.before_node = point(diags, doc, &mut at, HookPoint::BeforeNode, &s.before_node);
        out.after_node = point(diags, doc, &mut at, HookPoint::AfterNode, &s.after_node);
        out.after_wave = point(diags, doc, &mut at, HookPoint::AfterWave, &s.after_wave);
    }
    (out, at)
}

fn point(
    diags: &mut Vec<Diagnostic>,
    doc: &DocText<'_>,
    origins: &mut HookOrigins,
    point: HookPoint,
    specs: &[HookSpec],
) -> Vec<Hook> {
    let mut names = BTreeSet::new();
    let mut out = Vec::new();
    for h in specs {
        let before = diags.len();
        let name = h.name.value.trim();
        let at = format!("`hooks.{point}` hook `{name}`");
        if !super::validate::is_dns_label(name) {
            err(
                diags,
                doc,
                &h.name.referenced,
                format!("`hooks.{point}`: `{name}` is not a valid hook name"),
                "use lowercase letters, digits and `-` (at most 63 characters)",
            );
        } else if !names.insert(name.to_string()) {
            err(
                diags,
                doc,
                &h.name.referenced,
                format!("{at} is defined twice"),
                "hook names are unique among the hooks of a point: they name the hook in the journal and in halts",
            );
        }
        let timeout = match crate::duration::Duration::parse_positive(&h.timeout.value) {
            Ok(d) if Duration::from(d) <= MAX_HOOK_TIMEOUT => Some(Duration::from(d)),
            Ok(_) => {
                err(
                    diags,
                    doc,
                    &h.timeout.referenced,
                    format!(
                        "{at}: `timeout` `{}` is longer than 24h",
                        h.timeout.value.trim()
                    ),
                    "a hook blocks the rollout while it runs; give it at most `24h`",
                );
                None
            }
            Err(e) => {
                diags.push(Diagnostic::error(
                    codes::DURATION,
                    doc.origin(&h.timeout.referenced),
                    format!("{at}: `timeout`: {e}"),
                ));
                None
            }
        };
        let action = match (&h.http, &h.job) {
            (None, None) => {
                err(
                    diags,
                    doc,
                    &h.name.referenced,
                    format!("{at} has no kind"),
                    "give exactly one of `http` (a POST of the event to a URL) or `job` (a Kubernetes Job)",
                );
                None
            }
            (Some(_), Some(job)) => {
                err(
                    diags,
                    doc,
                    &job.referenced,
                    format!("{at} has both `http` and `job`"),
                    "a hook has exactly one kind: split it into two hooks",
                );
                None
            }
            (Some(http), None) => http_action(diags, doc, &at, http),
            (None, Some(job)) => job_action(diags, doc, &at, job),
        };
        if let (Some(timeout), Some(action), true) = (timeout, action, diags.len() == before) {
            let loc = match &h.job {
                Some(job) => &job.value.pod_spec.referenced,
                None => &h.name.referenced,
            };
            origins.insert((point, name.to_string()), doc.origin(loc));
            out.push(Hook {
                name: name.to_string(),
                timeout,
                idempotent: h.idempotent.as_ref().is_some_and(|i| i.value),
                action,
            });
        }
    }
    out
}

fn http_action(
    diags: &mut Vec<Diagnostic>,
    doc: &DocText<'_>,
    at: &str,
    spec: &Spanned<super::format::HttpHookSpec>,
) -> Option<HookAction> {
    let s = &spec.value;
    let url = match super::health::check_url(s.url.value.trim()) {
        Ok(u) => Some(u),
        Err(why) => {
            err(
                diags,
                doc,
                &s.url.referenced,
                format!("{at}: `http.url` `{}` {why}", s.url.value),
                "write an http:// or https:// URL such as `https://hooks.example/medea`",
            );
            None
        }
    };
    let mut ok = true;
    if let Some(c) = &s.credential {
        if !super::validate::is_dns_label(&c.value) {
            ok = false;
            err(
                diags,
                doc,
                &c.referenced,
                format!(
                    "{at}: `http.credential` `{}` is not a credential name",
                    c.value
                ),
                "a credential is named, never a path: lowercase letters, digits and `-` (at most 63 characters); the server reads `<creds-dir>/<cluster>/hooks/<name>/{token,ca.pem}`",
            );
        } else if url.as_deref().is_some_and(|u| u.starts_with("http://")) {
            ok = false;
            err(
                diags,
                doc,
                &c.referenced,
                format!(
                    "{at}: `http.credential` is set but the URL is plain http://: the token would cross the network in clear"
                ),
                "use an https:// URL, or remove `credential`",
            );
        }
    }
    let url = url?;
    ok.then(|| HookAction::Http {
        url,
        credential: s.credential.as_ref().map(|c| c.value.clone()),
    })
}

fn job_action(
    diags: &mut Vec<Diagnostic>,
    doc: &DocText<'_>,
    at: &str,
    spec: &Spanned<super::format::JobHookSpec>,
) -> Option<HookAction> {
    let s = &spec.value;
    let mut ok = true;
    let namespace = match &s.namespace {
        None => "default".to_string(),
        Some(n) => {
            if !super::validate::is_dns_label(n.value.trim()) {
                ok = false;
                err(
                    diags,
                    doc,
                    &n.referenced,
                    format!(
                        "{at}: `job.namespace` `{}` is not a namespace name",
                        n.value
                    ),
                    "a namespace is a DNS label: lowercase letters, digits and `-` (at most 63 characters)",
                );
            }
            n.value.trim().to_string()
        }
    };
    let ttl = match &s.ttl_seconds_after_finished {
        None => DEFAULT_HOOK_JOB_TTL_SECS,
        Some(t) if t.value < MIN_HOOK_JOB_TTL_SECS => {
            ok = false;
            err(
                diags,
                doc,
                &t.referenced,
                format!(
                    "{at}: `job.ttlSecondsAfterFinished` is {}, less than {MIN_HOOK_JOB_TTL_SECS}",
                    t.value
                ),
                "medea reads the hook's result after its Job finished: keep the Job at least a minute (default 86400, a day)",
            );
            t.value
        }
        Some(t) => t.value,
    };
    let loc = &s.pod_spec.referenced;
    let mut bad = |why: String, help: &str| {
        ok = false;
        err(diags, doc, loc, format!("{at}: `job.podSpec` {why}"), help);
    };
    let pod = &s.pod_spec.value;
    match pod.as_object() {
        None => bad(
            "is not a mapping".into(),
            "write a Kubernetes pod spec: `containers: [{name: ..., image: ...}]`",
        ),
        Some(map) => {
            match map.get("restartPolicy") {
                None => {}
                Some(serde_json::Value::String(p)) if p == "Never" => {}
                Some(other) => bad(
                    format!("sets `restartPolicy: {other}`"),
                    "a hook's pod runs once: medea sets `restartPolicy: Never`; remove the field",
                ),
            }
            match map.get("containers").and_then(|c| c.as_array()) {
                None => bad(
                    "has no `containers` list".into(),
                    "list the containers to run, each with `name` and `image`",
                ),
                Some(cs) if cs.is_empty() => bad(
                    "has an empty `containers` list".into(),
                    "list the containers to run, each with `name` and `image`",
                ),
                Some(cs) => {
                    for (i, c) in cs.iter().enumerate() {
                        let name = c.get("name").and_then(|n| n.as_str());
                        if !name.is_some_and(super::validate::is_dns_label) {
                            bad(
                                format!("container {} has no valid `name`", i + 1),
                                "name each container with a DNS label, e.g. `ceph`",
                            );
                        }
                        let image = c.get("image").and_then(|n| n.as_str()).unwrap_or("");
                        if image.trim().is_empty() {
                            bad(
                                format!("container {} has no `image`", i + 1),
                                "give each container the image it runs, e.g. `docker.io/rook/ceph:v1.15.5`",
                            );
                        }
                        let env = c
                            .get("env")
                            .and_then(|e| e.as_array())
                            .map(Vec::as_slice)
                            .unwrap_or_default();
                        for e in env {
                            if let Some(n) = e.get("name").and_then(|n| n.as_str())
                                && JOB_ENV.contains(&n)
                            {
                                bad(
                                    format!("container {} sets `{n}`, which medea sets", i + 1),
                                    "medea gives every container MEDEA_NODE, MEDEA_JOB_ID and MEDEA_HOOK_POINT; remove it",
                                );
                            }
                        }
                    }
                }
            }
        }
    }
    ok.then(|| HookAction::Job {
        namespace,
        pod_spec: pod.clone(),
        ttl_seconds_after_finished: ttl,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(name: &str) -> Hook {
        Hook {
            name: name.into(),
            timeout: Duration::from_secs(60),
            idempotent: true,
            action: HookAction::Http {
                url: "https://hooks.example/medea".into(),
                credential: Some("ops".into()),
            },
        }
    }

    #[test]
    fn hooks_round_trip_and_empty_sets_are_not_written() {
        let mut h = Hooks::default();
        assert!(h.is_empty());
        assert_eq!(serde_json::to_string(&h).unwrap(), "{}");
        assert_eq!(h.clone().non_empty(), None);
        h.at_mut(HookPoint::BeforeNode).push(http("notify"));
        h.after_node.push(Hook {
            name: "unset-noout".into(),
            timeout: Duration::from_secs(300),
            idempotent: false,
            action: HookAction::Job {
                namespace: "rook-ceph".into(),
                pod_spec: serde_json::json!({"containers": [{"name": "ceph", "image": "rook/ceph:v1.15"}]}),
                ttl_seconds_after_finished: DEFAULT_HOOK_JOB_TTL_SECS,
            },
        });
        let json = serde_json::to_value(&h).unwrap();
        assert_eq!(json["beforeNode"][0]["timeout"], "1m");
        assert_eq!(json["beforeNode"][0]["action"]["kind"], "http");
        assert_eq!(json["afterNode"][0]["action"]["kind"], "job");
        assert!(json.get("beforeJob").is_none());
        let back: Hooks = serde_json::from_value(json).unwrap();
        assert_eq!(back, h);
        assert_eq!(
            h.lines(),
            vec![
                HookLines {
                    head: "beforeNode: notify (http POST https://hooks.example/medea, credential ops; timeout 1m; idempotent)".to_string(),
                    detail: vec![],
                },
                HookLines {
                    head: "afterNode: unset-noout (job in namespace rook-ceph; timeout 5m)"
                        .to_string(),
                    detail: vec![
                        "container ceph: rook/ceph:v1.15".to_string(),
                        "pod: service account default".to_string(),
                    ],
                },
            ]
        );
        assert_eq!(
            h.after_node[0].one_line(),
            "unset-noout (job in namespace rook-ceph; timeout 5m): container ceph: rook/ceph:v1.15 | pod: service account default"
        );
    }
}
