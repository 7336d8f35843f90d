//! The file format: what operators write, exactly as serde reads it.
//!
//! These types mirror the YAML one to one (camelCase keys, unknown fields rejected) and carry
//! source positions ([`Spanned`]) on every value a later rule may complain about. They are also
//! the source of the JSON Schemas in `schemas/`. Validation turns them into the typed model in
//! [`super::model`]; nothing outside `desired` sees these types.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_saphyr::Spanned;

/// The only `apiVersion` medea reads in desired-state documents.
pub const API_VERSION: &str = "medea/v1alpha1";

/// The two-field header read first, to pick the concrete kind without losing positions.
#[derive(Debug, Clone, Deserialize)]
pub struct Header {
    /// The document's `apiVersion`, if present.
    #[serde(rename = "apiVersion")]
    pub api_version: Option<Spanned<String>>,
    /// The document's `kind` (`Cluster` or `NodePool`), if present.
    pub kind: Option<Spanned<String>>,
}

/// A lenient read of a document's identity, used when its strict read failed so that other
/// documents referring to it do not report follow-on errors.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Identity {
    /// The document's `kind`, if readable.
    pub kind: Option<String>,
    /// The document's `metadata`, if readable.
    pub metadata: Option<IdentityMeta>,
    /// The document's `spec`, if readable.
    pub spec: Option<IdentitySpec>,
}

/// The `metadata` part of a lenient identity read.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct IdentityMeta {
    /// `metadata.name`, if readable.
    pub name: Option<String>,
}

/// The `spec` part of a lenient identity read.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct IdentitySpec {
    /// `spec.cluster` of a NodePool, if readable.
    pub cluster: Option<String>,
}

/// Object metadata, as in Kubernetes.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Metadata {
    /// Name of the object: a DNS label (lowercase letters, digits and `-`, at most 63).
    #[schemars(with = "String")]
    pub name: Spanned<String>,
    /// Free-form labels; medea does not interpret them.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Free-form annotations; medea does not interpret them.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// A Kubernetes cluster running on Talos Linux, and how medea may roll it.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(title = "Cluster")]
pub struct ClusterDoc {
    /// Always `medea/v1alpha1`.
    #[schemars(with = "String")]
    pub api_version: Spanned<String>,
    /// Always `Cluster`.
    #[schemars(with = "String")]
    pub kind: Spanned<String>,
    /// The cluster's name and free-form labels.
    pub metadata: Metadata,
    /// What the cluster should run and how medea may roll it.
    pub spec: ClusterSpec,
}

/// The `spec` of a Cluster: target Kubernetes version, rollout defaults, approvals, windows.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterSpec {
    /// The Kubernetes version the cluster should run (required).
    pub kubernetes: KubernetesSpec,
    /// Rollout defaults for every pool of this cluster.
    #[serde(default)]
    pub rollout: Option<RolloutSpec>,
    /// Drain defaults for every pool of this cluster.
    #[serde(default)]
    pub drain: Option<DrainSpec>,
    /// How many distinct signers a plan needs before it may run.
    #[serde(default)]
    pub approvals: Option<ApprovalsSpec>,
    /// When rollouts may start a node. Without windows, any time.
    #[serde(default)]
    pub maintenance_windows: Vec<WindowSpec>,
    /// Maintenance exclusions: spans of time in which version changes of a scope do not
    /// start, even inside a window.
    #[serde(default)]
    pub maintenance: Option<MaintenanceSpec>,
    /// Upgrade-path policy.
    #[serde(default)]
    pub upgrade_policy: Option<UpgradePolicySpec>,
    /// Health gates every wave of every pool must pass (Prometheus queries, Alertmanager
    /// alerts, workload readiness), with their sources, soak and failure limit.
    #[serde(default)]
    pub health: Option<HealthSpec>,
    /// Preflight findings this cluster accepts (`medea plan` shows each finding's id).
    #[serde(default)]
    pub preflight: Option<PreflightSpec>,
    /// Roll a Talos or Kubernetes version here only after another cluster has run it,
    /// after a successful rollout job, for at least `soak`.
    #[serde(default)]
    pub promotion: Option<PromotionSpec>,
    /// Scheduled etcd backups, encrypted to `recipients` (issue #37). Absent: no backups.
    #[serde(default)]
    pub backup: Option<BackupSpec>,
    /// Blocking hooks before and after the whole job (issue #35): an HTTP call or a
    /// Kubernetes Job each; a failing hook halts the job.
    #[serde(default)]
    pub hooks: Option<ClusterHooksSpec>,
}

/// The job-wide hooks of a Cluster.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterHooksSpec {
    /// Run before the job touches anything (after the cluster's gates before the job).
    #[serde(default)]
    pub before_job: Vec<HookSpec>,
    /// Run after the job's last step, before its soak.
    #[serde(default)]
    pub after_job: Vec<HookSpec>,
}

/// The node and wave hooks of a NodePool.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PoolHooksSpec {
    /// Run before each wave's first node starts (after the wave's gates).
    #[serde(default)]
    pub before_wave: Vec<HookSpec>,
    /// Run before each node is cordoned (after its checks and image pull).
    #[serde(default)]
    pub before_node: Vec<HookSpec>,
    /// Run after each node is back and uncordoned. A failure halts the job and leaves the
    /// node uncordoned.
    #[serde(default)]
    pub after_node: Vec<HookSpec>,
    /// Run after every node of a wave is done, before the wave's soak.
    #[serde(default)]
    pub after_wave: Vec<HookSpec>,
}

/// One blocking hook: exactly one of `http` or `job`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(extend("oneOf" = [
    { "required": ["http"] },
    { "required": ["job"] }
]))]
pub struct HookSpec {
    /// Hook name, unique among the hooks of its point (lowercase letters, digits and `-`).
    #[schemars(with = "String")]
    pub name: Spanned<String>,
    /// How long the hook may take, retries included (`5m`, at most `24h`); past it the job
    /// halts (`hook_failed`).
    #[schemars(with = "DurationString")]
    pub timeout: Spanned<String>,
    /// Whether running the hook twice is harmless (default `false`). Only an idempotent hook
    /// is run again when medea stopped while it ran; otherwise the job halts
    /// (`hook_interrupted`) and a person decides.
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    pub idempotent: Option<Spanned<bool>>,
    /// `POST` a JSON event (job id, cluster, pool, node, point, attempt) to a URL; a 2xx answer
    /// lets the rollout go on, anything else is retried with backoff until `timeout`.
    #[serde(default)]
    #[schemars(with = "Option<HttpHookSpec>")]
    pub http: Option<Spanned<HttpHookSpec>>,
    /// Run a Kubernetes Job in the target cluster and wait for it to complete.
    #[serde(default)]
    #[schemars(with = "Option<JobHookSpec>")]
    pub job: Option<Spanned<JobHookSpec>>,
}

/// An HTTP hook's target. Its credential is named, never a path: the server reads it from
/// files it owns, `<creds-dir>/<cluster>/hooks/<credential>/{token,ca.pem}`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpHookSpec {
    /// `http://` or `https://` URL the event is posted to (no credentials, query or fragment).
    #[schemars(with = "String")]
    pub url: Spanned<String>,
    /// Name of a credential the server holds for this hook (a DNS label): a bearer token
    /// (`token`) and/or the CA certificates of the receiver (`ca.pem`), in
    /// `<creds-dir>/<cluster>/hooks/<credential>/`. Only with an `https://` URL.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub credential: Option<Spanned<String>>,
}

/// A Kubernetes Job hook: medea creates a `batch/v1` Job from this pod spec (adding
/// `restartPolicy: Never`, the environment `MEDEA_NODE`, `MEDEA_JOB_ID`, `MEDEA_HOOK_POINT`
/// and labels naming the job and the hook), waits for it to complete within the hook's
/// timeout, and journals the tail of its pod's log and its exit code.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JobHookSpec {
    /// The namespace the Job is created in (default `default`).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub namespace: Option<Spanned<String>>,
    /// The Job's pod spec (`containers` with `name` and `image`, `serviceAccountName`,
    /// `volumes`, ...), as in a Kubernetes Job's `spec.template.spec`.
    #[schemars(with = "serde_json::Map<String, serde_json::Value>")]
    pub pod_spec: Spanned<serde_json::Value>,
    /// Seconds after the Job finished before Kubernetes deletes it and its pod (the Job's
    /// `ttlSecondsAfterFinished`; default 86400, a day; at least 60, so medea reads the
    /// result first).
    #[serde(default)]
    #[schemars(with = "Option<u64>", range(min = 60))]
    pub ttl_seconds_after_finished: Option<Spanned<u64>>,
}

/// Scheduled etcd backups of a Cluster: when, how many are kept, where, encrypted to whom.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackupSpec {
    /// When a backup is taken: a 5-field cron expression (`0 3 * * *` = daily at 03:00).
    #[schemars(with = "String")]
    pub schedule: Spanned<String>,
    /// IANA time zone of `schedule` (`Europe/Berlin`; default `UTC`), as for
    /// `maintenanceWindows`.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub time_zone: Option<Spanned<String>>,
    /// Which backups are kept (default: the newest 7, no age limit).
    #[serde(default)]
    pub retention: Option<RetentionSpec>,
    /// The name of a destination the medea server owns (default `local`:
    /// `<state-dir>/backups/<cluster>/`; another name: the S3-compatible storage set up in
    /// `<creds-dir>/<cluster>/backup-destinations/<name>/` on the server). A name, never a path.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub destination: Option<Spanned<String>>,
    /// age public keys (`age1…`, as `age-keygen` prints them) every backup is encrypted to.
    /// At least one; the private keys stay off the medea host.
    #[schemars(with = "Vec<String>")]
    pub recipients: Vec<Spanned<String>>,
}

/// How many backups are kept, and for how long.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RetentionSpec {
    /// The newest `keep` backups are kept (1 to 1000; default 7).
    #[serde(default)]
    #[schemars(with = "Option<u32>")]
    pub keep: Option<Spanned<u32>>,
    /// Older backups are deleted (`720h` = 30 days); default: no age limit. The newest
    /// verified backup is never deleted.
    #[serde(default)]
    #[schemars(with = "Option<DurationString>")]
    pub max_age: Option<Spanned<String>>,
}

/// What the plan's preflight checks may find without blocking approval.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PreflightSpec {
    /// Ids of blocking findings accepted for this cluster (e.g.
    /// `removed-api/flowcontrol.apiserver.k8s.io/v1beta3/flowschemas`). Acknowledged findings
    /// still show in the plan, marked as such.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub acknowledge: Vec<Spanned<String>>,
}

/// Promotion between clusters (rollout sequencing): versions go here after `after` proved them.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PromotionSpec {
    /// The upstream Cluster (by name) that must have run a version first.
    #[schemars(with = "String")]
    pub after: Spanned<String>,
    /// How long the upstream cluster must have run the version since its successful rollout
    /// job ended (`24h`).
    #[schemars(with = "DurationString")]
    pub soak: Spanned<String>,
}

/// A Kubernetes API version that goes away, for the removed-API preflight check (CRDs, or
/// built-in APIs this medea does not know yet).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RemovedApiSpec {
    /// API group (`""` or omitted for the core group).
    #[serde(default)]
    #[schemars(with = "String")]
    pub group: Option<Spanned<String>>,
    /// The version that goes away (`v1beta1`).
    #[schemars(with = "String")]
    pub version: Spanned<String>,
    /// Resource, plural and lower case (`widgets`).
    #[schemars(with = "String")]
    pub resource: Spanned<String>,
    /// Kind (`Widget`).
    #[schemars(with = "String")]
    pub kind: Spanned<String>,
    /// First Kubernetes minor that deprecates it (`v1.29`).
    #[schemars(with = "MinorString")]
    pub deprecated_in: Spanned<String>,
    /// First Kubernetes minor that no longer serves it (`v1.32`).
    #[schemars(with = "MinorString")]
    pub removed_in: Spanned<String>,
    /// What to use instead, `group/version Kind` (`example.com/v1 Widget`).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub replacement: Option<Spanned<String>>,
}

/// The `kubernetes:` block of a Cluster.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubernetesSpec {
    /// Target Kubernetes version, e.g. `v1.34.1`.
    #[schemars(with = "crate::version::KubeVersion")]
    pub version: Spanned<String>,
}

/// Rollout parameters. On a Cluster they are defaults; on a NodePool, overrides.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RolloutSpec {
    /// How many machines of a pool may be away at once (control-plane pools: always 1).
    #[serde(default)]
    #[schemars(with = "Option<u32>", range(min = 1))]
    pub max_unavailable: Option<Spanned<u32>>,
    /// How long a drain may wait on PodDisruptionBudgets before the rollout halts (`10m`).
    #[serde(default)]
    #[schemars(with = "Option<DurationString>")]
    pub drain_timeout: Option<Spanned<String>>,
    /// How long a node may take to come back healthy after its reboot (`15m`).
    #[serde(default)]
    #[schemars(with = "Option<DurationString>")]
    pub health_timeout: Option<Spanned<String>>,
    /// How many times medea calls Upgrade on one node before the job halts, when the node
    /// answers that the upgrade ran and failed (installer exit, image validation) or the call's
    /// outcome stays unknown and the node shows no trace of it (default 2, at most 5).
    #[serde(default)]
    #[schemars(with = "Option<u32>", range(min = 1, max = 5))]
    pub upgrade_attempts: Option<Spanned<u32>>,
    /// Before each wave starts, taint the next wave's nodes `PreferNoSchedule`
    /// (`medea.dev/upgrade-pending=<job id>`) so that pods evicted now avoid the nodes drained
    /// next; each taint is removed once its node is done, or when the job ends (default `true`).
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    pub taint_next_wave: Option<Spanned<bool>>,
    /// When the new Talos is installed: `inWindow` (default) pulls, installs and reboots each
    /// node inside the maintenance windows; `ahead` pulls and installs it without a reboot
    /// (Talos 1.13 and later) on every node of the pool as soon as the job reaches the pool,
    /// windows or not, and only cordons, drains and reboots inside them. ANY reboot of a
    /// staged node, planned or not, boots the new version.
    #[serde(default)]
    #[schemars(with = "Option<StageSpec>")]
    pub stage: Option<Spanned<StageSpec>>,
    /// How many nodes of the pool install ahead at once with `stage: ahead` (default 2, at
    /// most 10; control-plane pools install one at a time whatever this says).
    #[serde(default)]
    #[schemars(with = "Option<u32>", range(min = 1, max = 10))]
    pub stage_parallelism: Option<Spanned<u32>>,
}

/// When a pool's nodes install the new Talos (`rollout.stage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum StageSpec {
    /// Install without reboot ahead of the windows; reboot inside them.
    Ahead,
    /// Pull, install and reboot inside the windows (the default).
    InWindow,
}

/// How nodes are drained before their upgrade. On a Cluster these are defaults; on a NodePool,
/// overrides. Evictions always go through the Eviction API: a PodDisruptionBudget is never
/// bypassed, whatever is set here.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DrainSpec {
    /// Evict pods that use `emptyDir` volumes; their emptyDir data is lost (default `true`, as
    /// `talosctl upgrade` and kubectl's `--delete-emptydir-data` do).
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    pub delete_empty_dir_data: Option<Spanned<bool>>,
    /// Evict pods that no controller recreates (bare pods); they are gone for good (default
    /// `false`: the drain is refused, naming them).
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    pub evict_unmanaged_pods: Option<Spanned<bool>>,
    /// Pods left on the node (never evicted, not waited for), e.g. local-storage agents.
    #[serde(default)]
    #[schemars(with = "Option<SelectorSpec>")]
    pub skip_pods: Option<Spanned<SelectorSpec>>,
    /// How long a drain may wait on PodDisruptionBudgets before the rollout halts (`10m`).
    /// Replaces `rollout.drainTimeout`; set one of them.
    #[serde(default)]
    #[schemars(with = "Option<DurationString>")]
    pub timeout: Option<Spanned<String>>,
    /// After the drain and before the reboot, wait until no `VolumeAttachment` names the node,
    /// so a CSI volume is free for the node its pod moves to (default `true`; as tuppr's
    /// `waitForVolumeDetach`, but a timeout halts the rollout instead of rebooting anyway).
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    pub wait_for_volume_detach: Option<Spanned<bool>>,
    /// How long that wait may take before the rollout halts, naming the attachments (`5m`).
    #[serde(default)]
    #[schemars(with = "Option<DurationString>")]
    pub volume_detach_timeout: Option<Spanned<String>>,
}

/// A duration such as `90s`, `10m` or `1h30m`.
#[derive(JsonSchema)]
#[schemars(
    transparent,
    extend("pattern" = "^([0-9]+h)?([0-9]+m)?([0-9]+s)?([0-9]+ms)?$", "examples" = ["10m", "90s", "1h30m"])
)]
#[allow(dead_code)]
pub struct DurationString(String);

/// How many distinct signers must approve a plan before medea executes it.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ApprovalsSpec {
    /// Distinct signers a plan needs (default 1).
    #[serde(default)]
    #[schemars(with = "Option<u32>", range(min = 1))]
    pub required: Option<Spanned<u32>>,
    /// Distinct signers a plan needs when it touches control-plane nodes or Kubernetes
    /// (default 2, and never less than `required`).
    #[serde(default)]
    #[schemars(with = "Option<u32>", range(min = 1))]
    pub control_plane: Option<Spanned<u32>>,
}

/// A recurring window in which rollouts may start nodes.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WindowSpec {
    /// Window start, a 5-field cron expression (`0 2 * * 6` = Saturdays 02:00).
    #[schemars(with = "String")]
    pub start: Spanned<String>,
    /// Window length (`4h`).
    #[schemars(with = "DurationString")]
    pub duration: Spanned<String>,
    /// IANA time zone of `start` (`Europe/Berlin`; default `UTC`).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub time_zone: Option<Spanned<String>>,
}

/// `spec.maintenance`: exclusions on top of the maintenance windows.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MaintenanceSpec {
    /// Spans of time in which no node starts a change the exclusion's scope covers (a running
    /// node step finishes). GKE's scopes: `noUpgrades`, `noMinorUpgrades`.
    #[serde(default)]
    pub exclusions: Vec<ExclusionSpec>,
}

/// One maintenance exclusion (`spec.maintenance.exclusions[]`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExclusionSpec {
    /// A name unique in the cluster (`year-end-freeze`); plans and waits name it.
    #[schemars(with = "String")]
    pub name: Spanned<String>,
    /// When it begins: RFC 3339 (`2026-12-20T00:00:00Z`) or a local date-time
    /// (`2026-12-20T00:00`) read in `timeZone`.
    #[schemars(with = "String")]
    pub from: Spanned<String>,
    /// When it ends (exclusive), written like `from`; must be after `from`.
    #[schemars(with = "String")]
    pub to: Spanned<String>,
    /// What it holds: `noUpgrades` (every change; the default) or `noMinorUpgrades` (changes
    /// of minor line; patches still start).
    #[serde(default)]
    #[schemars(with = "Option<crate::desired::exclusion::ExclusionScope>")]
    pub scope: Option<Spanned<String>>,
    /// IANA time zone of local `from`/`to` values (`Europe/Berlin`; default `UTC`).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub time_zone: Option<Spanned<String>>,
}

/// Which version moves a plan may contain (downgrades, versions unknown to the catalog).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UpgradePolicySpec {
    /// Allow plans that move Talos back to an older release (default false). Kubernetes is
    /// never moved backwards.
    #[serde(default)]
    pub allow_downgrade: bool,
    /// Talos releases medea's built-in compatibility catalog does not know yet (a patch
    /// published after this medea was built). The newest stable patch of each minor is the
    /// stop on multi-minor upgrade paths.
    #[serde(default)]
    #[schemars(with = "Vec<crate::version::TalosVersion>")]
    pub talos_releases: Vec<Spanned<String>>,
    /// Kubernetes versions a Talos minor supports, overriding (or extending) the built-in
    /// table; copy them from the Talos support matrix.
    #[serde(default)]
    pub kubernetes_support: Vec<KubernetesSupportSpec>,
    /// API versions added to (or overriding) the built-in removal table the removed-API
    /// preflight check reads; a row with the same group, version and resource replaces the
    /// built-in one.
    #[serde(default)]
    pub removed_apis: Vec<RemovedApiSpec>,
}

/// The Kubernetes minors one Talos minor supports (both ends inclusive).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubernetesSupportSpec {
    /// A Talos minor line, e.g. `v1.15`.
    #[schemars(with = "MinorString")]
    pub talos: Spanned<String>,
    /// Oldest supported Kubernetes minor, e.g. `v1.33`.
    #[schemars(with = "MinorString")]
    pub min_kubernetes: Spanned<String>,
    /// Newest supported Kubernetes minor, e.g. `v1.38`.
    #[schemars(with = "MinorString")]
    pub max_kubernetes: Spanned<String>,
}

/// A minor line such as `v1.15`.
#[derive(JsonSchema)]
#[schemars(
    transparent,
    extend("pattern" = "^v(0|[1-9][0-9]*)\\.(0|[1-9][0-9]*)$", "examples" = ["v1.15"])
)]
#[allow(dead_code)]
pub struct MinorString(String);

/// A set of machines of one cluster that share a role, a Talos version and rollout settings.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(title = "NodePool")]
pub struct NodePoolDoc {
    /// Always `medea/v1alpha1`.
    #[schemars(with = "String")]
    pub api_version: Spanned<String>,
    /// Always `NodePool`.
    #[schemars(with = "String")]
    pub kind: Spanned<String>,
    /// The pool's name and free-form labels.
    pub metadata: Metadata,
    /// Which machines form the pool and what they should run.
    pub spec: NodePoolSpec,
}

/// The `spec` of a NodePool: its cluster, role, machines, Talos version and overrides.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodePoolSpec {
    /// Name of the Cluster this pool belongs to.
    #[schemars(with = "String")]
    pub cluster: Spanned<String>,
    /// `controlplane` or `worker`.
    #[schemars(with = "Role")]
    pub role: Spanned<Role>,
    /// Machines by Kubernetes node name.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub machines: Vec<Spanned<String>>,
    /// Machines by node label; combined with `machines` (union).
    #[serde(default)]
    pub selector: Option<SelectorSpec>,
    /// The Talos version and installer image the pool's machines should run (required).
    pub talos: TalosSpec,
    /// Overrides of the cluster's rollout defaults.
    #[serde(default)]
    pub rollout: Option<RolloutSpec>,
    /// Overrides of the cluster's drain defaults.
    #[serde(default)]
    pub drain: Option<DrainSpec>,
    /// Pools of the same cluster that must finish their rollouts before this one starts.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub after: Vec<Spanned<String>>,
    /// Overrides of the cluster's health gates: each field set here replaces the cluster's.
    #[serde(default)]
    pub health: Option<PoolHealthSpec>,
    /// What a failed health gate does to the wave that broke it: `halt` (default) stops the
    /// job before another node is touched; `rollback` first rolls the wave's nodes back to
    /// their previous Talos version (one at a time), then halts. Kubernetes steps never roll back.
    #[serde(default)]
    #[schemars(with = "Option<OnFailureSpec>")]
    pub on_failure: Option<Spanned<OnFailureSpec>>,
    /// Blocking hooks around each node and each wave of the pool (issue #35): an HTTP call or
    /// a Kubernetes Job each; a failing hook halts the job.
    #[serde(default)]
    pub hooks: Option<PoolHooksSpec>,
}

/// What a failed health gate does to the wave that broke it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnFailureSpec {
    /// Halt before touching another node.
    Halt,
    /// Roll the failing wave's nodes back (Talos `Rollback`), then halt.
    Rollback,
}

/// The fields a Cluster's `health:` sets and a NodePool's `health:` overrides (`gates`,
/// `soak`, `interval`, `failureLimit`, `inconclusiveLimit`), declared once: [`HealthSpec`] and [`PoolHealthSpec`]
/// are these plus what only a cluster has (its sources). Each struct writes its own doc lines
/// for them (they become the JSON Schemas' descriptions, which say different things for a
/// cluster and an override); the types, defaults and schema constraints are the macro's.
macro_rules! health_spec {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $($(#[$fmeta:meta])* pub $field:ident: $ty:ty,)*
        }
        gates: $(#[$gates:meta])*;
        soak: $(#[$soak:meta])*;
        interval: $(#[$interval:meta])*;
        failure_limit: $(#[$limit:meta])*;
        inconclusive_limit: $(#[$ilimit:meta])*;
    ) => {
        $(#[$meta])*
        pub struct $name {
            $($(#[$fmeta])* pub $field: $ty,)*
            $(#[$gates])*
            #[serde(default)]
            #[schemars(with = "Option<Vec<GateSpec>>")]
            pub gates: Option<Spanned<Vec<GateSpec>>>,
            $(#[$soak])*
            #[serde(default)]
            #[schemars(with = "Option<DurationString>")]
            pub soak: Option<Spanned<String>>,
            $(#[$interval])*
            #[serde(default)]
            #[schemars(with = "Option<DurationString>")]
            pub interval: Option<Spanned<String>>,
            $(#[$limit])*
            #[serde(default)]
            #[schemars(with = "Option<u32>", range(min = 1))]
            pub failure_limit: Option<Spanned<u32>>,
            $(#[$ilimit])*
            #[serde(default)]
            #[schemars(with = "Option<u32>", range(min = 1))]
            pub inconclusive_limit: Option<Spanned<u32>>,
        }

        impl $name {
            /// The fields a cluster sets and a pool overrides, for validation.
            pub fn gate_fields(&self) -> GateFields<'_> {
                GateFields {
                    gates: &self.gates,
                    soak: &self.soak,
                    interval: &self.interval,
                    failure_limit: &self.failure_limit,
                    inconclusive_limit: &self.inconclusive_limit,
                }
            }
        }
    };
}

/// The fields of a `health:` block a Cluster sets and a NodePool overrides, borrowed with
/// their spans for diagnostics.
#[derive(Debug, Clone, Copy)]
pub struct GateFields<'s> {
    /// `gates`, as written (none: inherited or default).
    pub gates: &'s Option<Spanned<Vec<GateSpec>>>,
    /// `soak`, as written (none: inherited or default).
    pub soak: &'s Option<Spanned<String>>,
    /// `interval`, as written (none: inherited or default).
    pub interval: &'s Option<Spanned<String>>,
    /// `failureLimit`, as written (none: inherited or default).
    pub failure_limit: &'s Option<Spanned<u32>>,
    /// `inconclusiveLimit`, as written (none: inherited or default).
    pub inconclusive_limit: &'s Option<Spanned<u32>>,
}

health_spec! {
    /// Health gates of a cluster: where they are evaluated and what must hold.
    #[derive(Debug, Clone, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct HealthSpec {
        /// The Prometheus server `query` gates ask (`/api/v1/query`).
        #[serde(default)]
        pub prometheus: Option<EndpointSpec>,
        /// The Alertmanager `alerts` gates ask (`/api/v2/alerts`).
        #[serde(default)]
        pub alertmanager: Option<EndpointSpec>,
        /// Silence, in `alertmanager`, the alerts a node's own Talos step is expected to cause
        /// (issue #35): a short silence (a lease) created before the node is cordoned,
        /// renewed while its step runs and expired once it is back and uncordoned.
        #[serde(default)]
        #[schemars(with = "Option<SilenceSpec>")]
        pub silence: Option<Spanned<SilenceSpec>>,
    }
    gates:
        /// The gates; every one must pass.
        ;
    soak:
        /// After each wave, each pool and the job: every gate must pass continuously this long
        /// (default `0s`: one passing evaluation).
        ;
    interval:
        /// How often gates are evaluated (default `30s`).
        ;
    failure_limit:
        /// Consecutive failed evaluations before a gate fails (default 1). A failed evaluation
        /// is one whose check ran and said no.
        ;
    inconclusive_limit:
        /// Inconclusive evaluations of a gate since it last passed before the job halts with
        /// `gate_inconclusive` (default 1, as `failureLimit`). An evaluation is inconclusive
        /// when the source is unreachable, answers an error or times out, or the query returns
        /// no value where one is needed; it is never a pass.
        ;
}

health_spec! {
    /// A NodePool's overrides of the cluster's health gates. The sources (`prometheus`,
    /// `alertmanager`) are the cluster's.
    #[derive(Debug, Clone, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct PoolHealthSpec {}
    gates:
        /// The pool's gates, replacing the cluster's (`[]`: no gates for this pool).
        ;
    soak:
        /// Replaces the cluster's `soak`.
        ;
    interval:
        /// Replaces the cluster's `interval`.
        ;
    failure_limit:
        /// Replaces the cluster's `failureLimit`.
        ;
    inconclusive_limit:
        /// Replaces the cluster's `inconclusiveLimit`.
        ;
}

/// The silences medea creates in the cluster's Alertmanager while a node is drained and
/// rebooted. Each silences the alerts matching every one of `matchers` *and* naming the node
/// by `nodeLabel`; it is a lease: it lapses by itself `lease` after medea last renewed it, and
/// is never renewed past `maxDuration` from its start.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SilenceSpec {
    /// Alertmanager matchers, ANDed, each `name="value"`, `name!="value"`, `name=~"regex"` or
    /// `name!~"regex"`, selecting the alerts a node's reboot is expected to fire (at least
    /// one; e.g. `alertname=~"KubeNodeNotReady|KubeNodeUnreachable|TargetDown"`).
    #[schemars(with = "Vec<String>")]
    pub matchers: Vec<Spanned<String>>,
    /// The alert label that names the node: `instance` matches the node's name with or
    /// without a `:port` (`w-1`, `w-1:9100`); any other label (`node`, `nodename`,
    /// `kubernetes_node`) must equal the Kubernetes node's name.
    #[schemars(with = "String")]
    pub node_label: Spanned<String>,
    /// How long a silence lasts past its last renewal (default `5m`, at least `1m`): what a
    /// crashed medea leaves behind at most.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub lease: Option<Spanned<String>>,
    /// A node's silence is never renewed past this long after it was created (default
    /// `1h`): a stuck rollout pages again.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub max_duration: Option<Spanned<String>>,
    /// What a node does when Alertmanager refuses its silence before the cordon: `halt`
    /// (default: nothing is cordoned, the job halts with `silence_refused`) or `proceed`
    /// (the node goes on unsilenced, and its alerts page).
    #[serde(default)]
    #[schemars(with = "Option<SilenceOnErrorSpec>")]
    pub on_error: Option<Spanned<SilenceOnErrorSpec>>,
}

/// What a node does when its silence cannot be created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SilenceOnErrorSpec {
    /// Halt before the cordon.
    Halt,
    /// Go on without a silence.
    Proceed,
}

/// An HTTP(S) endpoint medea asks. Its credential is named, never a path: the server reads it
/// from files it owns, `<creds-dir>/<cluster>/health/<credential>/{token,ca.pem}`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EndpointSpec {
    /// `http://` or `https://` base URL, e.g. `https://prometheus.monitoring:9090` (no
    /// credentials, query or fragment; a path prefix is kept).
    #[schemars(with = "String")]
    pub url: Spanned<String>,
    /// Name of a credential the server holds for this source (a DNS label): a bearer token
    /// (`token`) and/or the CA certificates that sign the source's certificate (`ca.pem`), in
    /// `<creds-dir>/<cluster>/health/<credential>/` on the machine medea runs on. Only with an
    /// `https://` URL. Without one, no token is sent and the system's roots are used.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub credential: Option<Spanned<String>>,
    /// Removed (issue #32): a path chosen by the repository. Read only to say what to write
    /// instead.
    #[serde(default)]
    #[schemars(skip)]
    pub ca_file: Option<Spanned<String>>,
    /// Removed (issue #32): a path chosen by the repository. Read only to say what to write
    /// instead.
    #[serde(default)]
    #[schemars(skip)]
    pub bearer_token_file: Option<Spanned<String>>,
}

/// One named gate with exactly one check: `query`, `alerts` or `workloads`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(extend("oneOf" = [
    { "required": ["query"] },
    { "required": ["alerts"] },
    { "required": ["workloads"] }
]))]
pub struct GateSpec {
    /// Gate name, unique in its list (lowercase letters, digits and `-`).
    #[schemars(with = "String")]
    pub name: Spanned<String>,
    /// A PromQL condition for an instant query: a comparison (`ceph_health_status == 0`,
    /// `x < bool 1`) or a set operation (`and`, `or`, `unless`). A filter comparison passes
    /// when it returns at least one sample; a `bool` comparison when it returns at least one
    /// sample and every sample is 1.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub query: Option<Spanned<String>>,
    /// Alertmanager alerts that must not fire.
    #[serde(default)]
    #[schemars(with = "Option<AlertsGateSpec>")]
    pub alerts: Option<Spanned<AlertsGateSpec>>,
    /// Workloads that must be fully updated and available.
    #[serde(default)]
    #[schemars(with = "Option<WorkloadsGateSpec>")]
    pub workloads: Option<Spanned<WorkloadsGateSpec>>,
    /// Try the gate in shadow (default `false`): it is evaluated, journaled, shown and
    /// notified (webhooks, metrics) like any other, but never blocks or halts the rollout.
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    pub dry_run: Option<Spanned<bool>>,
    /// Consecutive evaluations that cannot ask the source at all (refused, timed out, an
    /// HTTP or TLS error) before the gate halts the job (default 4, as Argo Rollouts'
    /// `consecutiveErrorLimit`). An answer without data counts against `inconclusiveLimit`
    /// instead.
    #[serde(default)]
    #[schemars(with = "Option<u32>", range(min = 1))]
    pub consecutive_error_limit: Option<Spanned<u32>>,
    /// What the gate does once it reached `inconclusiveLimit`: `halt` (default) the job, or
    /// `pause` it until `medea rollout resume` (the gate is then checked afresh).
    #[serde(default)]
    pub on_inconclusive: Option<OnInconclusiveSpec>,
}

/// What an inconclusive gate does (`onInconclusive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnInconclusiveSpec {
    /// Halt the job.
    Halt,
    /// Pause the job until `medea rollout resume`.
    Pause,
}

/// Passes when Alertmanager has no active, uninhibited alert matching every one of
/// `matchers`, apart from those matching any of `ignore`, those muted by medea's own silences
/// and those about a node medea is rebooting right now. An operator's silence hides nothing
/// unless `skipOperatorSilences` is true.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AlertsGateSpec {
    /// Alertmanager matchers, ANDed, each `name="value"`, `name!="value"`, `name=~"regex"`
    /// or `name!~"regex"` (empty: every alert).
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub matchers: Vec<Spanned<String>>,
    /// Alerts matching any one of these matchers are not counted.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub ignore: Vec<Spanned<String>>,
    /// Also skip alerts muted by a silence that is not medea's own (default `false`: an
    /// operator's silence, however broad, never hides a matching alert from the gate).
    #[serde(default)]
    pub skip_operator_silences: bool,
}

/// Passes when every selected workload has its desired replicas updated and available.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorkloadsGateSpec {
    /// Namespaces whose workloads are checked.
    #[schemars(with = "Vec<String>")]
    pub namespaces: Vec<Spanned<String>>,
    /// Kinds checked (default all three).
    #[serde(default)]
    #[schemars(with = "Option<Vec<WorkloadKindSpec>>")]
    pub kinds: Option<Vec<Spanned<WorkloadKindSpec>>>,
}

/// A kind of Kubernetes workload a `workloads` gate checks for readiness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, JsonSchema)]
pub enum WorkloadKindSpec {
    /// `apps/v1` Deployments: all desired replicas updated and available.
    Deployment,
    /// `apps/v1` StatefulSets: all desired replicas updated and ready.
    StatefulSet,
    /// `apps/v1` DaemonSets: every scheduled pod updated and available.
    DaemonSet,
}

/// What a node pool's machines are in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Control-plane nodes (etcd, kube-apiserver); rolled one at a time and with stricter approval.
    Controlplane,
    /// Worker nodes.
    Worker,
}

/// Machines chosen by their Kubernetes node labels.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SelectorSpec {
    /// Every label must match exactly.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, String>")]
    pub match_labels: BTreeMap<String, Spanned<String>>,
}

/// The `talos:` block of a NodePool.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TalosSpec {
    /// Target Talos version, e.g. `v1.13.9`.
    #[schemars(with = "crate::version::TalosVersion")]
    pub version: Spanned<String>,
    /// Installer image repository without a tag; the tag is the version. Keep the Image
    /// Factory schematic of the running image (`factory.talos.dev/installer/<schematic>`).
    /// Default `ghcr.io/siderolabs/installer`.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub installer_image: Option<Spanned<String>>,
}
