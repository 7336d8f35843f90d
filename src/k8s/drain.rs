//! The drain engine: which pods to evict, skip or refuse, and the evict/retry/wait loop with
//! backoff bounded by the drain timeout. It talks to the cluster only through [`DrainOps`],
//! so the retry and timeout logic is tested with paused time against an in-memory fake.
//!
//! [`DrainOps`] has no delete operation: evictions are the only way a pod leaves.

use std::future::Future;

use backon::BackoffBuilder;
use tokio::time::Instant;

use super::{DrainOptions, DrainReport, K8sError, PodRef, SkipReason};

/// A pod on the node being drained, as the drain policy needs to see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DrainPod {
    pub pod: PodRef,
    pub uid: String,
    /// Has the `kubernetes.io/config.mirror` annotation.
    pub mirror: bool,
    /// Its controller is a DaemonSet.
    pub daemonset: bool,
    /// It has a controller owner reference.
    pub controlled: bool,
    /// It mounts an emptyDir volume.
    pub empty_dir: bool,
    /// Succeeded or Failed.
    pub finished: bool,
    /// Already has a deletionTimestamp.
    pub terminating: bool,
    /// `metadata.labels`.
    pub labels: std::collections::BTreeMap<String, String>,
    /// The claims of its `persistentVolumeClaim` volumes.
    pub claims: Vec<String>,
}

/// The answer to one eviction request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Eviction {
    /// 201: the pod is being deleted.
    Accepted,
    /// 404: the pod is already gone.
    Gone,
    /// 429: a PodDisruptionBudget (or throttling) refused; the message says which.
    Refused { message: String },
}

/// What the drain engine needs from the cluster.
pub(crate) trait DrainOps: Sync {
    fn list(&self, node: &str) -> impl Future<Output = Result<Vec<DrainPod>, K8sError>> + Send;
    fn evict(&self, pod: &PodRef) -> impl Future<Output = Result<Eviction, K8sError>> + Send;
    /// The `namespace/name` of the PDB that guards `pod`, if it can be determined.
    fn blocking_pdb(
        &self,
        pod: &PodRef,
        refusal: &str,
    ) -> impl Future<Output = Option<String>> + Send;
    /// Whether the pod (this incarnation, by uid) is gone.
    fn gone(&self, pod: &DrainPod) -> impl Future<Output = Result<bool, K8sError>> + Send;
    /// The PersistentVolume the claim `namespace/claim` is bound to (`spec.volumeName`);
    /// `None` when the claim is gone or not bound.
    fn claim_volume(
        &self,
        namespace: &str,
        claim: &str,
    ) -> impl Future<Output = Result<Option<String>, K8sError>> + Send;
}

/// The PersistentVolumes of `pods`' claims, sorted and each once, as tuppr's
/// `EvictableVolumePVs` resolves them before it drains: a claim that is gone or unbound has
/// none. Transient errors are retried until `deadline`. `None` when the kubeconfig may not
/// read claims (403): the drain goes on, and every attachment on the node counts.
async fn volumes_of(
    ops: &impl DrainOps,
    pods: &[&DrainPod],
    deadline: Instant,
    backoff: &mut Backoff,
) -> Result<Option<Vec<String>>, K8sError> {
    let mut volumes = std::collections::BTreeSet::new();
    for p in pods {
        for claim in &p.claims {
            let pv = loop {
                match ops.claim_volume(&p.pod.namespace, claim).await {
                    Ok(pv) => break pv,
                    Err(e) if e.is_transient() && Instant::now() < deadline => {
                        tracing::warn!(pod = %p.pod, claim, error = %e, "reading a claim for the drain failed; retrying");
                        nap(backoff.next(), deadline).await;
                    }
                    Err(K8sError::Api { err, .. }) if super::client::is_status(&err, 403) => {
                        tracing::warn!(pod = %p.pod, claim, "may not read PersistentVolumeClaims: every volume attached to the node will count");
                        return Ok(None);
                    }
                    Err(e) => return Err(e),
                }
            };
            volumes.extend(pv);
        }
    }
    Ok(Some(volumes.into_iter().collect()))
}

/// Extract `X` from the apiserver's "The disruption budget X needs N healthy pods…" cause.
pub(crate) fn pdb_from_message(message: &str) -> Option<String> {
    let rest = message.split("The disruption budget ").nth(1)?;
    let name = rest.split_whitespace().next()?;
    (!name.is_empty()).then(|| name.to_string())
}

struct Backoff {
    delays: backon::ExponentialBackoff,
    max: std::time::Duration,
}

impl Backoff {
    fn new(options: &DrainOptions) -> Backoff {
        let delays = backon::ExponentialBuilder::default()
            .with_min_delay(options.min_backoff)
            .with_max_delay(options.max_backoff.max(options.min_backoff))
            .with_factor(2.0)
            .without_max_times()
            .build();
        Backoff {
            delays,
            max: options.max_backoff,
        }
    }

    fn next(&mut self) -> std::time::Duration {
        self.delays.next().unwrap_or(self.max)
    }
}

/// Sleep for `delay`, but never past `deadline`.
async fn nap(delay: std::time::Duration, deadline: Instant) {
    tokio::time::sleep_until((Instant::now() + delay).min(deadline)).await;
}

/// Whether `drain.skipPods` keeps `p` on the node.
fn selected(p: &DrainPod, options: &DrainOptions) -> bool {
    !options.policy.skip_pods.is_empty()
        && options
            .policy
            .skip_pods
            .iter()
            .all(|(k, v)| p.labels.get(k) == Some(v))
}

/// The PersistentVolumes of the pods a drain of `node` would evict now (running pods: a
/// finished one holds no attachment), as tuppr's `EvictableVolumePVs` reads them before it
/// drains (home-operations/tuppr `internal/controller/drain/drain.go`): the volumes whose
/// detach the rollout waits for. `None` when the kubeconfig may not read claims.
pub(crate) async fn evicted_volumes(
    ops: &impl DrainOps,
    node: &str,
    options: &DrainOptions,
) -> Result<Option<Vec<String>>, K8sError> {
    let deadline = Instant::now() + options.timeout;
    let mut backoff = Backoff::new(options);
    let pods = loop {
        match ops.list(node).await {
            Ok(pods) => break pods,
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                tracing::warn!(node, error = %e, "listing pods for their volumes failed; retrying");
                nap(backoff.next(), deadline).await;
            }
            Err(e) => return Err(e),
        }
    };
    let evicting: Vec<&DrainPod> = pods
        .iter()
        .filter(|p| {
            !p.mirror && !p.daemonset && !selected(p, options) && !p.terminating && !p.finished
        })
        .collect();
    volumes_of(ops, &evicting, deadline, &mut backoff).await
}

/// Drain `node` (already cordoned by the caller).
pub(crate) async fn run(
    ops: &impl DrainOps,
    node: &str,
    options: &DrainOptions,
) -> Result<DrainReport, K8sError> {
    let started = Instant::now();
    let deadline = started + options.timeout;
    let mut backoff = Backoff::new(options);

    // 1. List, retrying transient failures until the deadline.
    let pods = loop {
        match ops.list(node).await {
            Ok(pods) => break pods,
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                tracing::warn!(node, error = %e, "listing pods for drain failed; retrying");
                nap(backoff.next(), deadline).await;
            }
            Err(e) => return Err(e),
        }
    };

    // 2. Classify; refuse up front (before any eviction) per policy.
    let mut skipped = Vec::new();
    let mut to_evict = Vec::new();
    let mut waiting = Vec::new();
    let mut local = Vec::new();
    let mut unmanaged = Vec::new();
    for p in pods {
        if p.mirror {
            skipped.push((p.pod, SkipReason::Mirror));
        } else if p.daemonset {
            skipped.push((p.pod, SkipReason::DaemonSet));
        } else if selected(&p, options) {
            skipped.push((p.pod, SkipReason::Selected));
        } else if p.terminating {
            waiting.push(p);
        } else {
            if !p.finished && p.empty_dir && !options.policy.delete_empty_dir_data {
                local.push(p.pod.clone());
            }
            if !p.finished && !p.controlled && !options.policy.evict_unmanaged_pods {
                unmanaged.push(p.pod.clone());
            }
            to_evict.push(p);
        }
    }
    if !local.is_empty() {
        return Err(K8sError::DrainLocalStorage {
            node: node.to_string(),
            pods: local,
        });
    }
    if !unmanaged.is_empty() {
        return Err(K8sError::DrainUnmanaged {
            node: node.to_string(),
            pods: unmanaged,
        });
    }

    // 3. Evict in rounds; refused evictions (429) are retried after a backoff until the
    //    deadline, any other error fails at once. Never delete, never force.
    let mut evicted: Vec<DrainPod> = Vec::new();
    let mut refusals = 0u32;
    let mut pending = to_evict;
    loop {
        let mut still = Vec::new();
        let mut first_refusal: Option<(PodRef, String)> = None;
        for p in pending {
            match ops.evict(&p.pod).await {
                Ok(Eviction::Accepted | Eviction::Gone) => {
                    tracing::info!(node, pod = %p.pod, "evicted");
                    evicted.push(p);
                }
                Ok(Eviction::Refused { message }) => {
                    refusals += 1;
                    tracing::info!(node, pod = %p.pod, %message, "eviction refused; will retry");
                    if first_refusal.is_none() {
                        first_refusal = Some((p.pod.clone(), message));
                    }
                    still.push(p);
                }
                // kubectl `pkg/drain/drain.go` `evictPods`: only a 429 (above) is retried; any
                // other error (a 500 for a pod under two PodDisruptionBudgets, a 5xx, a lost
                // connection) fails the drain at once with the apiserver's message
                Err(e) => {
                    return Err(K8sError::EvictionFailed {
                        node: node.to_string(),
                        pod: p.pod,
                        evicted: u32::try_from(evicted.len()).unwrap_or(u32::MAX),
                        source: Box::new(e),
                    });
                }
            }
        }
        if still.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            let (pod, message) =
                first_refusal.unwrap_or_else(|| (still[0].pod.clone(), String::new()));
            let pdb = ops.blocking_pdb(&pod, &message).await;
            return Err(K8sError::DrainBlocked {
                node: node.to_string(),
                pod,
                pdb,
                blocked: u32::try_from(still.len()).unwrap_or(u32::MAX),
                evicted: u32::try_from(evicted.len()).unwrap_or(u32::MAX),
                waited: started.elapsed(),
            });
        }
        nap(backoff.next(), deadline).await;
        pending = still;
    }

    // 4. Wait until every evicted (or already terminating) pod is gone.
    let mut gone_refs: Vec<PodRef> = waiting
        .iter()
        .chain(&evicted)
        .map(|p| p.pod.clone())
        .collect();
    waiting.extend(evicted.iter().cloned());
    loop {
        let mut left = Vec::new();
        for p in waiting {
            match ops.gone(&p).await {
                Ok(true) => {}
                Ok(false) => left.push(p),
                Err(e) if e.is_transient() => left.push(p),
                Err(e) => return Err(e),
            }
        }
        if left.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            return Err(K8sError::DrainTimeout {
                node: node.to_string(),
                pods: left.into_iter().map(|p| p.pod).collect(),
                waited: started.elapsed(),
            });
        }
        nap(options.poll_interval, deadline).await;
        waiting = left;
    }

    gone_refs.sort();
    skipped.sort();
    Ok(DrainReport {
        node: node.to_string(),
        evicted: gone_refs,
        skipped,
        pdb_refusals: refusals,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;
    use crate::desired::model::DrainPolicy;

    fn pr(name: &str) -> PodRef {
        PodRef {
            namespace: "default".into(),
            name: name.into(),
        }
    }

    fn pod(name: &str) -> DrainPod {
        DrainPod {
            pod: pr(name),
            uid: format!("uid-{name}"),
            mirror: false,
            daemonset: false,
            controlled: true,
            empty_dir: false,
            finished: false,
            terminating: false,
            labels: BTreeMap::new(),
            claims: Vec::new(),
        }
    }

    /// An in-memory cluster: evictions of guarded pods are refused until `unblock_at`;
    /// evicted pods disappear `linger` later; the first `flaky` calls fail with 503.
    struct Fake {
        pods: Vec<DrainPod>,
        guarded: Vec<&'static str>,
        unblock_at: Option<Instant>,
        linger: Duration,
        flaky: Mutex<u32>,
        evicted_at: Mutex<BTreeMap<String, Instant>>,
        evict_calls: Mutex<u32>,
        /// Every eviction answers this status (code, reason, message, cause reason).
        evict_error: Option<(u16, &'static str, &'static str, &'static str)>,
        /// `namespace/claim` → the PersistentVolume it is bound to.
        claims: BTreeMap<String, String>,
        /// Reading a claim answers 403.
        claims_forbidden: bool,
    }

    impl Fake {
        fn new(pods: Vec<DrainPod>) -> Fake {
            Fake {
                pods,
                guarded: Vec::new(),
                unblock_at: None,
                linger: Duration::ZERO,
                flaky: Mutex::new(0),
                evicted_at: Mutex::new(BTreeMap::new()),
                evict_calls: Mutex::new(0),
                evict_error: None,
                claims: BTreeMap::new(),
                claims_forbidden: false,
            }
        }

        fn flake(&self) -> Result<(), K8sError> {
            let mut f = self.flaky.lock().unwrap();
            if *f > 0 {
                *f -= 1;
                return Err(K8sError::Api {
                    op: "test",
                    target: "x".into(),
                    err: Box::new(::kube::Error::Api(Box::new(
                        ::kube::core::Status::failure("unavailable", "ServiceUnavailable")
                            .with_code(503),
                    ))),
                });
            }
            Ok(())
        }
    }

    impl DrainOps for Fake {
        async fn list(&self, _node: &str) -> Result<Vec<DrainPod>, K8sError> {
            self.flake()?;
            Ok(self.pods.clone())
        }

        async fn evict(&self, pod: &PodRef) -> Result<Eviction, K8sError> {
            *self.evict_calls.lock().unwrap() += 1;
            self.flake()?;
            if let Some((code, reason, message, cause)) = self.evict_error {
                let mut status = ::kube::core::Status::failure(message, reason).with_code(code);
                status.details = Some(::kube::core::response::StatusDetails {
                    name: pod.name.clone(),
                    group: String::new(),
                    kind: "pods".into(),
                    uid: String::new(),
                    causes: vec![::kube::core::response::StatusCause {
                        reason: cause.into(),
                        message: message.into(),
                        field: String::new(),
                    }],
                    retry_after_seconds: 0,
                });
                return Err(K8sError::Api {
                    op: "evict pod",
                    target: pod.to_string(),
                    err: Box::new(::kube::Error::Api(Box::new(status))),
                });
            }
            let blocked = self.guarded.contains(&pod.name.as_str())
                && self.unblock_at.is_none_or(|t| Instant::now() < t);
            if blocked {
                return Ok(Eviction::Refused {
                    message:
                        "The disruption budget web-pdb needs 2 healthy pods and has 2 currently"
                            .into(),
                });
            }
            self.evicted_at
                .lock()
                .unwrap()
                .insert(pod.name.clone(), Instant::now());
            Ok(Eviction::Accepted)
        }

        async fn blocking_pdb(&self, _pod: &PodRef, refusal: &str) -> Option<String> {
            pdb_from_message(refusal).map(|n| format!("default/{n}"))
        }

        async fn claim_volume(
            &self,
            namespace: &str,
            claim: &str,
        ) -> Result<Option<String>, K8sError> {
            if self.claims_forbidden {
                return Err(K8sError::Api {
                    op: "get persistentvolumeclaim",
                    target: claim.into(),
                    err: Box::new(::kube::Error::Api(Box::new(
                        ::kube::core::Status::failure("forbidden", "Forbidden").with_code(403),
                    ))),
                });
            }
            Ok(self.claims.get(&format!("{namespace}/{claim}")).cloned())
        }

        async fn gone(&self, pod: &DrainPod) -> Result<bool, K8sError> {
            Ok(self
                .evicted_at
                .lock()
                .unwrap()
                .get(&pod.pod.name)
                .is_some_and(|t| Instant::now() >= *t + self.linger))
        }
    }

    fn options(timeout: u64) -> DrainOptions {
        DrainOptions {
            timeout: Duration::from_secs(timeout),
            ..DrainOptions::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn refused_evictions_are_retried_with_backoff_until_the_pdb_allows() {
        let start = Instant::now();
        let mut fake = Fake::new(vec![pod("web-1"), pod("web-2")]);
        fake.guarded = vec!["web-2"];
        fake.unblock_at = Some(start + Duration::from_secs(12));
        let report = run(&fake, "w1", &options(60)).await.unwrap();
        assert_eq!(report.evicted, vec![pr("web-1"), pr("web-2")]);
        // Backoff 1, 2, 4, 8 s: attempts at 0, 1, 3, 7, 15 → refused 4 times, through at 15 s.
        assert_eq!(report.pdb_refusals, 4);
        assert_eq!(start.elapsed(), Duration::from_secs(15));
    }

    /// Issue #48 item 7, as tuppr `EvictableVolumePVs`: the volumes bound to the claims of the
    /// pods a drain evicts, each once, not those of the pods that stay (a DaemonSet's, the
    /// ones `skipPods` keeps), of finished pods or of unbound claims.
    #[tokio::test(start_paused = true)]
    async fn the_volumes_of_the_pods_a_drain_evicts_are_their_claims_volumes() {
        let with = |name: &str, claims: &[&str]| DrainPod {
            claims: claims.iter().map(|c| c.to_string()).collect(),
            ..pod(name)
        };
        let agent = DrainPod {
            daemonset: true,
            ..with("agent", &["agent-cache"])
        };
        let done = DrainPod {
            finished: true,
            ..with("job-1", &["scratch"])
        };
        let mut fake = Fake::new(vec![
            with("db-0", &["data-db-0", "unbound"]),
            with("db-1", &["data-db-1"]),
            with("reader", &["data-db-0"]),
            agent,
            done,
        ]);
        for (claim, pv) in [
            ("data-db-0", "pvc-0"),
            ("data-db-1", "pvc-1"),
            ("agent-cache", "pvc-agent"),
            ("scratch", "pvc-scratch"),
        ] {
            fake.claims.insert(format!("default/{claim}"), pv.into());
        }
        assert_eq!(
            evicted_volumes(&fake, "w1", &options(60)).await.unwrap(),
            Some(vec!["pvc-0".to_string(), "pvc-1".to_string()])
        );
        // pods `drain.skipPods` keeps are not evicted: their volumes do not count
        let mut skip = options(60);
        skip.policy.skip_pods = [("app".to_string(), "db".to_string())].into();
        let mut kept = with("db-1", &["data-db-1"]);
        kept.labels.insert("app".into(), "db".into());
        let kept_fake = Fake {
            claims: fake.claims.clone(),
            ..Fake::new(vec![with("db-0", &["data-db-0"]), kept])
        };
        assert_eq!(
            evicted_volumes(&kept_fake, "w1", &skip).await.unwrap(),
            Some(vec!["pvc-0".to_string()])
        );
        // a kubeconfig that may not read claims: unknown, and the drain goes on as before
        fake.claims_forbidden = true;
        assert_eq!(
            evicted_volumes(&fake, "w1", &options(60)).await.unwrap(),
            None
        );
        let report = run(&fake, "w1", &options(60)).await.unwrap();
        assert_eq!(report.evicted.len(), 4, "the finished pod goes too");
    }

    #[tokio::test(start_paused = true)]
    async fn a_pdb_that_never_allows_fails_at_the_timeout_naming_the_pdb() {
        let start = Instant::now();
        let mut fake = Fake::new(vec![pod("web-1"), pod("web-2")]);
        fake.guarded = vec!["web-2"];
        let err = run(&fake, "w1", &options(30)).await.unwrap_err();
        // The last attempt happens exactly at the deadline, not after it.
        assert_eq!(start.elapsed(), Duration::from_secs(30));
        match &err {
            K8sError::DrainBlocked {
                node,
                pod,
                pdb,
                blocked,
                evicted,
                ..
            } => {
                assert_eq!(node, "w1");
                assert_eq!(*pod, pr("web-2"));
                assert_eq!(pdb.as_deref(), Some("default/web-pdb"));
                assert_eq!((*blocked, *evicted), (1, 1));
            }
            other => panic!("expected DrainBlocked, got {other:?}"),
        }
        assert!(
            err.to_string()
                .contains("PodDisruptionBudget `default/web-pdb`"),
            "{err}"
        );
        assert!(err.to_string().contains("nothing was deleted"), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn mirror_and_daemonset_pods_are_skipped() {
        let mut mirror = pod("kube-apiserver-cp-1");
        mirror.mirror = true;
        mirror.controlled = false;
        let mut ds = pod("kube-proxy-abcde");
        ds.daemonset = true;
        let fake = Fake::new(vec![mirror, ds, pod("web-1")]);
        let report = run(&fake, "cp-1", &options(10)).await.unwrap();
        assert_eq!(report.evicted, vec![pr("web-1")]);
        assert_eq!(
            report.skipped,
            vec![
                (pr("kube-apiserver-cp-1"), SkipReason::Mirror),
                (pr("kube-proxy-abcde"), SkipReason::DaemonSet)
            ]
        );
        assert_eq!(*fake.evict_calls.lock().unwrap(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn pods_matched_by_skip_pods_stay_and_are_not_refused() {
        // a local-storage agent: bare, with emptyDir, and labelled for skipPods
        let mut agent = pod("local-path-agent");
        agent.controlled = false;
        agent.empty_dir = true;
        agent
            .labels
            .insert("app.kubernetes.io/name".into(), "local-path".into());
        agent.labels.insert("tier".into(), "storage".into());
        let mut other = pod("other-bare");
        other.controlled = false;
        other.labels.insert("tier".into(), "storage".into());
        let skip: BTreeMap<String, String> = [
            (
                "app.kubernetes.io/name".to_string(),
                "local-path".to_string(),
            ),
            ("tier".to_string(), "storage".to_string()),
        ]
        .into();
        let opts = DrainOptions {
            policy: DrainPolicy {
                skip_pods: skip,
                ..DrainPolicy::legacy()
            },
            ..options(10)
        };
        let fake = Fake::new(vec![agent.clone(), pod("web-1")]);
        let report = run(&fake, "w1", &opts).await.unwrap();
        assert_eq!(report.evicted, vec![pr("web-1")]);
        assert_eq!(
            report.skipped,
            vec![(pr("local-path-agent"), SkipReason::Selected)]
        );
        // every label must match: a pod with only one of them is still refused
        let fake = Fake::new(vec![agent, other]);
        let err = run(&fake, "w1", &opts).await.unwrap_err();
        assert!(
            matches!(&err, K8sError::DrainUnmanaged { pods, .. } if *pods == vec![pr("other-bare")]),
            "{err:?}"
        );
        assert!(
            err.to_string().contains("drain.evictUnmanagedPods"),
            "the refusal names the field that allows it: {err}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn local_storage_is_refused_by_default_and_evicted_on_opt_in() {
        let mut cache = pod("cache-1");
        cache.empty_dir = true;
        let fake = Fake::new(vec![pod("web-1"), cache]);
        let err = run(&fake, "w1", &options(10)).await.unwrap_err();
        assert!(
            matches!(&err, K8sError::DrainLocalStorage { pods, .. } if *pods == vec![pr("cache-1")]),
            "{err:?}"
        );
        assert!(err.to_string().contains("`default/cache-1`"), "{err}");
        assert_eq!(
            *fake.evict_calls.lock().unwrap(),
            0,
            "refusal happens before any eviction"
        );

        let opt_in = DrainOptions {
            policy: DrainPolicy {
                delete_empty_dir_data: true,
                ..DrainPolicy::legacy()
            },
            ..options(10)
        };
        let report = run(&fake, "w1", &opt_in).await.unwrap();
        assert_eq!(report.evicted, vec![pr("cache-1"), pr("web-1")]);
    }

    #[tokio::test(start_paused = true)]
    async fn unmanaged_pods_are_refused_unless_allowed_and_finished_pods_always_go() {
        let mut bare = pod("bare");
        bare.controlled = false;
        let mut done = pod("job-done");
        done.controlled = false;
        done.finished = true;
        done.empty_dir = true;
        let fake = Fake::new(vec![bare, done.clone()]);
        let err = run(&fake, "w1", &options(10)).await.unwrap_err();
        assert!(
            matches!(&err, K8sError::DrainUnmanaged { pods, .. } if *pods == vec![pr("bare")]),
            "{err:?}"
        );
        let fake = Fake::new(vec![done]);
        let report = run(&fake, "w1", &options(10)).await.unwrap();
        assert_eq!(report.evicted, vec![pr("job-done")]);
    }

    #[tokio::test(start_paused = true)]
    async fn drain_waits_for_evicted_pods_to_go_and_times_out_if_they_linger() {
        let start = Instant::now();
        let mut fake = Fake::new(vec![pod("web-1")]);
        fake.linger = Duration::from_secs(5);
        run(&fake, "w1", &options(60)).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(5));

        let start = Instant::now();
        let mut fake = Fake::new(vec![pod("web-1")]);
        fake.linger = Duration::from_secs(500);
        let err = run(&fake, "w1", &options(20)).await.unwrap_err();
        assert!(
            matches!(&err, K8sError::DrainTimeout { pods, .. } if *pods == vec![pr("web-1")]),
            "{err:?}"
        );
        assert_eq!(start.elapsed(), Duration::from_secs(20));
    }

    #[tokio::test(start_paused = true)]
    async fn transient_api_errors_are_retried_within_the_timeout() {
        let fake = Fake::new(vec![pod("web-1")]);
        *fake.flaky.lock().unwrap() = 3;
        let report = run(&fake, "w1", &options(60)).await.unwrap();
        assert_eq!(report.evicted, vec![pr("web-1")]);
        assert_eq!(report.pdb_refusals, 0);
    }

    /// kubectl retries only a 429: the apiserver's permanent
    /// 500 for a pod under two PodDisruptionBudgets (k8s `pkg/registry/core/pod/storage/
    /// eviction.go`) fails the drain at once with its message, not at the drain timeout.
    #[tokio::test(start_paused = true)]
    async fn an_eviction_error_other_than_429_fails_at_once_with_the_apiservers_message() {
        let mut fake = Fake::new(vec![pod("web-1")]);
        fake.evict_error = Some((
            500,
            "InternalError",
            "Internal error occurred: This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            "",
        ));
        let start = Instant::now();
        let err = run(&fake, "w1", &options(600)).await.unwrap_err();
        assert_eq!(start.elapsed(), Duration::ZERO, "no retry, no wait");
        assert_eq!(*fake.evict_calls.lock().unwrap(), 1);
        assert!(
            matches!(&err, K8sError::EvictionFailed { pod, .. } if *pod == pr("web-1")),
            "{err:?}"
        );
        assert!(!err.is_transient(), "the executor must not retry it either");
        let chain = crate::error_chain(&err);
        assert!(
            chain.contains("This pod has more than one PodDisruptionBudget"),
            "{chain}"
        );
        // a 503 is no different
        let mut fake = Fake::new(vec![pod("web-1")]);
        fake.evict_error = Some((503, "ServiceUnavailable", "unavailable", ""));
        assert!(run(&fake, "w1", &options(600)).await.is_err());
        assert_eq!(*fake.evict_calls.lock().unwrap(), 1);
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn already_terminating_pods_are_waited_for_not_evicted() {
        let mut leaving = pod("web-old");
        leaving.terminating = true;
        let fake = Fake::new(vec![leaving]);
        fake.evicted_at
            .lock()
            .unwrap()
            .insert("web-old".into(), Instant::now());
        let report = run(&fake, "w1", &options(10)).await.unwrap();
        assert_eq!(*fake.evict_calls.lock().unwrap(), 0);
        assert_eq!(report.evicted, vec![pr("web-old")]);
    }

    #[test]
    fn the_pdb_name_is_read_from_the_apiserver_cause() {
        assert_eq!(
            pdb_from_message(
                "The disruption budget web-pdb needs 2 healthy pods and has 2 currently"
            )
            .as_deref(),
            Some("web-pdb")
        );
        assert_eq!(pdb_from_message("Too many requests"), None);
    }
}
