//! Health probes (issue #23): the edge that evaluates a plan's health gates against real
//! sources — a Prometheus instant query ([`prometheus`]), Alertmanager's active alerts
//! ([`alertmanager`]) and the cluster's workloads through its kube client ([`workloads`]) —
//! implementing [`HealthProbe`] as [`Probes`].
//!
//! **Owns:** the HTTP exchange with the sources ([`http`]: hyper + rustls, bounded time and
//! size, the source's credential read per request from the server's own files,
//! [`http::Credentials`]), the judgement of each answer (pure
//! functions `judge` in each submodule), `medea doctor`'s reachability checks
//! ([`Probes::check_sources`]), and the Alertmanager silences a rollout keeps over a node
//! while it is away (issue #35; [`alertmanager::silence`], [`alertmanager::expire`]: a lost
//! create is found again by its marker, never made twice), and blocking HTTP hooks through the
//! same client ([`hook`]: a `POST` retried until the hook's timeout, the credential from
//! `<creds-dir>/<cluster>/hooks/<name>/`).
//! **May depend on:** the `health` row of design/architecture.md's code map (the one list,
//! checked by `tests/it/architecture.rs`): the matcher and query grammars, the Kubernetes
//! client, the gates, the port it implements.
//!
//! Architecture Invariant: an evaluation never returns an error and never passes by default:
//! a source that cannot be asked, answers an error, times out, or answers something
//! unexpected gives [`GateVerdict::Inconclusive`] (issue #35: "we could not tell") with the
//! cause chain in `detail` and `error` set (counted against the gate's
//! `consecutiveErrorLimit`, issue #51; an answer without data counts against
//! `inconclusiveLimit`); [`GateVerdict::Fail`] is kept
//! for a check that ran and said no.
//!
//! Architecture Invariant: bearer tokens and the contents of CA/token files are never
//! logged, recorded in an evaluation, or formatted into an error; errors name the file.
//!
//! Architecture Invariant (issue #32): no path comes from the desired state. A source names a
//! credential; the probe reads `<creds-dir>/<cluster>/health/<name>/{token,ca.pem}` (no
//! symbolic link, regular files, at most 64 KiB, the token 0600) and never sends a token over
//! plain `http://`. Probes without a credentials directory send no credential at all.

pub mod alertmanager;
pub mod hook;
pub mod http;
pub mod prometheus;
pub mod workloads;

use std::sync::Arc;
use std::time::Duration;

use crate::desired::health::{Matcher, QueryShape};
use crate::k8s::KubeClient;
use crate::plan::health::{Endpoint, Gate, GateCheck, HealthSources};
use crate::rollout::ports::{
    GateContext, GateEvaluation, GateVerdict, HealthProbe, PortError, SilenceRequest, Silenced,
};

/// Most samples (series, alerts, workloads) an evaluation keeps as evidence.
pub const MAX_SAMPLES: usize = 20;

/// Default bound of one request to a source (connect, TLS, answer).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a gate could not be evaluated. Shown flattened in [`GateEvaluation::detail`].
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("the cluster has no {what} configured (`health.{field}` on the Cluster)")]
    NoSource {
        what: &'static str,
        field: &'static str,
    },
    #[error(
        "no Kubernetes client for this cluster: a workloads gate needs the cluster's kubeconfig"
    )]
    NoKube,
    #[error("the gate's {what} does not parse (the desired state was validated by another medea?)")]
    Invalid {
        what: &'static str,
        #[source]
        err: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("listing workloads took longer than {limit}")]
    WorkloadsTimeout { limit: String },
    #[error("cannot ask the source")]
    Http {
        #[source]
        err: Box<http::HttpError>,
    },
    #[error("{url} answered HTTP {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error("Prometheus answered HTTP {status} with error ({error_type}): {error}")]
    Prometheus {
        status: u16,
        error_type: String,
        error: String,
    },
    #[error("the answer of {url} is not the JSON the API documents")]
    Json {
        url: String,
        #[source]
        err: serde_json::Error,
    },
    #[error("the answer of {url} is unexpected: {what}")]
    Shape { url: String, what: String },
    #[error("cannot list workloads")]
    Kube {
        #[source]
        err: Box<crate::k8s::K8sError>,
    },
}

/// The health probes of one cluster: its sources (from the approved plan) and, for
/// workloads gates, its kube client.
pub struct Probes {
    sources: HealthSources,
    credentials: http::Credentials,
    /// Where the credentials HTTP hooks name are read (`<creds-dir>/<cluster>/hooks`).
    hook_credentials: http::Credentials,
    kube: Option<Arc<KubeClient>>,
    timeout: Duration,
}

impl std::fmt::Debug for Probes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probes")
            .field("sources", &self.sources)
            .field("credentials", &self.credentials)
            .field("hook_credentials", &self.hook_credentials)
            .field(
                "kube",
                &self.kube.as_ref().map(|k| k.cluster_url().to_string()),
            )
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Probes {
    /// Probes over `sources` without a kube client (workloads gates fail until
    /// [`Self::with_kube`]).
    pub fn new(sources: HealthSources) -> Probes {
        Probes {
            sources,
            credentials: http::Credentials::None,
            hook_credentials: http::Credentials::None,
            kube: None,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Resolve the credentials sources name from `credentials` (the server's
    /// `<creds-dir>/<cluster>/health`). Without it, a source naming a credential fails and no
    /// token is ever sent.
    pub fn with_credentials(mut self, credentials: http::Credentials) -> Probes {
        self.credentials = credentials;
        self
    }

    /// Resolve the credentials HTTP hooks name from `credentials` (the server's
    /// `<creds-dir>/<cluster>/hooks`; issue #35). Without it, a hook naming a credential fails
    /// and no token is ever sent.
    pub fn with_hook_credentials(mut self, credentials: http::Credentials) -> Probes {
        self.hook_credentials = credentials;
        self
    }

    /// Use this cluster's kube client for workloads gates.
    pub fn with_kube(mut self, kube: Arc<KubeClient>) -> Probes {
        self.kube = Some(kube);
        self
    }

    /// Bound each request by `timeout` instead of [`DEFAULT_TIMEOUT`].
    pub fn with_timeout(mut self, timeout: Duration) -> Probes {
        self.timeout = timeout;
        self
    }

    pub fn sources(&self) -> &HealthSources {
        &self.sources
    }

    fn source<'a>(
        e: &'a Option<Endpoint>,
        what: &'static str,
        field: &'static str,
    ) -> Result<&'a Endpoint, ProbeError> {
        e.as_ref().ok_or(ProbeError::NoSource { what, field })
    }

    async fn run(
        &self,
        gate: &Gate,
        ctx: &GateContext,
    ) -> Result<(GateVerdict, Vec<crate::rollout::ports::GateSample>, String), ProbeError> {
        // The gate's own sources (the approved plan's) win; the probe's are the fallback.
        let sources = if ctx.sources.is_empty() {
            &self.sources
        } else {
            &ctx.sources
        };
        match &gate.check {
            GateCheck::Query { query } => {
                let shape = QueryShape::of(query).map_err(|err| ProbeError::Invalid {
                    what: "query",
                    err: Box::new(err),
                })?;
                let endpoint = Self::source(&sources.prometheus, "Prometheus", "prometheus")?;
                let data =
                    prometheus::query(endpoint, &self.credentials, query, self.timeout).await?;
                Ok(prometheus::judge(shape, &data))
            }
            GateCheck::Alerts {
                matchers,
                ignore,
                skip_operator_silences,
            } => {
                let parse = |list: &[String]| -> Result<Vec<Matcher>, ProbeError> {
                    list.iter()
                        .map(|m| {
                            Matcher::parse(m).map_err(|err| ProbeError::Invalid {
                                what: "matcher",
                                err: Box::new(err),
                            })
                        })
                        .collect()
                };
                let (matchers, ignore) = (parse(matchers)?, parse(ignore)?);
                let endpoint = Self::source(&sources.alertmanager, "Alertmanager", "alertmanager")?;
                let alerts =
                    alertmanager::alerts(endpoint, &self.credentials, &matchers, self.timeout)
                        .await?;
                let silences = alertmanager::SilenceRule {
                    own: &ctx.own_silences,
                    skip_operator: *skip_operator_silences,
                };
                Ok(alertmanager::judge(
                    &alerts,
                    &matchers,
                    &ignore,
                    silences,
                    &ctx.rebooting,
                ))
            }
            GateCheck::Workloads { namespaces, kinds } => {
                let kube = self.kube.as_ref().ok_or(ProbeError::NoKube)?;
                let listed = match tokio::time::timeout(
                    self.timeout * 3,
                    workloads::list(kube, namespaces, kinds),
                )
                .await
                {
                    Ok(r) => r?,
                    Err(_) => {
                        return Err(ProbeError::WorkloadsTimeout {
                            limit: crate::desired::model::format_duration(self.timeout * 3),
                        });
                    }
                };
                Ok(workloads::judge(&listed))
            }
        }
    }

    /// `medea doctor`: ask every configured source a trivial question — Prometheus
    /// `vector(1)` (one sample, value 1), Alertmanager `GET /api/v2/status`. One result per
    /// source: `(name, url, Ok(summary) | Err(why))`.
    pub async fn check_sources(&self) -> Vec<(&'static str, String, Result<String, ProbeError>)> {
        let mut out = Vec::new();
        if let Some(p) = &self.sources.prometheus {
            let r = prometheus::query(p, &self.credentials, "vector(1)", self.timeout)
                .await
                .and_then(|data| {
                    let (v, _, detail) = prometheus::judge(QueryShape::Bool, &data);
                    if v == GateVerdict::Pass {
                        Ok("answers `vector(1)`".to_string())
                    } else {
                        Err(ProbeError::Shape {
                            url: format!("{}/api/v1/query", p.url),
                            what: format!("`vector(1)` did not return 1: {detail}"),
                        })
                    }
                });
            out.push(("prometheus", p.url.clone(), r));
        }
        if let Some(a) = &self.sources.alertmanager {
            let r = async {
                let answer =
                    http::send(a, &self.credentials, "/api/v2/status", None, self.timeout).await?;
                let url = format!("{}/api/v2/status", a.url);
                if answer.status != 200 {
                    return Err(ProbeError::Status {
                        url,
                        status: answer.status,
                        body: http::excerpt(&answer.body),
                    });
                }
                let v: serde_json::Value =
                    serde_json::from_slice(&answer.body).map_err(|err| ProbeError::Json {
                        url: url.clone(),
                        err,
                    })?;
                match v.pointer("/versionInfo/version").and_then(|x| x.as_str()) {
                    Some(version) => Ok(format!("Alertmanager {version} answers")),
                    None => Err(ProbeError::Shape {
                        url,
                        what: "no `versionInfo.version`".into(),
                    }),
                }
            }
            .await;
            out.push(("alertmanager", a.url.clone(), r));
        }
        out
    }
}

fn port_error(op: &'static str, target: &str, e: alertmanager::SilenceError) -> PortError {
    if e.transient {
        PortError::transient(op, target, e.err)
    } else {
        PortError::failed(op, target, e.err)
    }
}

impl HealthProbe for Probes {
    async fn run_http_hook(
        &self,
        req: &crate::rollout::ports::HookRequest,
    ) -> crate::rollout::ports::HookReport {
        hook::call(&self.hook_credentials, req, self.timeout).await
    }

    async fn silence(&self, req: &SilenceRequest) -> Result<Silenced, PortError> {
        let r = alertmanager::silence(&self.credentials, req, jiff::Timestamp::now(), self.timeout)
            .await
            .map_err(|e| port_error("silence", &req.alertmanager.url, e))?;
        tracing::info!(alertmanager = %req.alertmanager.url, silence = %r.id, created = r.created, ends_at = %req.ends_at, "silence set");
        Ok(r)
    }

    async fn expire_silence(&self, alertmanager: &Endpoint, id: &str) -> Result<(), PortError> {
        alertmanager::expire(alertmanager, &self.credentials, id, self.timeout)
            .await
            .map_err(|e| port_error("expire silence", &alertmanager.url, e))
    }

    async fn evaluate(&self, gate: &Gate, ctx: &GateContext) -> GateEvaluation {
        // the check did not run: we could not tell (never a pass), and it is an error of the
        // source, counted against `consecutiveErrorLimit` (issue #51 item 4)
        let ((verdict, samples, detail), error) = match self.run(gate, ctx).await {
            Ok(r) => (r, false),
            Err(e) => (
                (
                    GateVerdict::Inconclusive,
                    Vec::new(),
                    crate::error_chain(&e),
                ),
                true,
            ),
        };
        match verdict {
            GateVerdict::Pass => {}
            GateVerdict::Fail => {
                tracing::info!(cluster = %ctx.cluster, gate = %gate.name, dry_run = gate.dry_run, %detail, "health gate failed");
            }
            GateVerdict::Inconclusive => {
                tracing::info!(cluster = %ctx.cluster, gate = %gate.name, dry_run = gate.dry_run, %detail, "health gate inconclusive");
            }
        }
        GateEvaluation {
            gate: gate.name.clone(),
            verdict,
            samples,
            detail,
            dry_run: gate.dry_run,
            error,
        }
    }
}
