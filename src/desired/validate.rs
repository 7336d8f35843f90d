//! Raw documents → the typed desired state, reporting every problem at once. Pure.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde_saphyr::Spanned;

use super::diagnostic::{Diagnostic, codes};
use super::format::{self, API_VERSION, DrainSpec, Role, RolloutSpec};
use super::model::*;
use super::parse::{Broken, DocText};
use super::window::MaintenanceWindow;
use crate::version::{KubeVersion, TalosVersion};

struct Ctx {
    diags: Vec<Diagnostic>,
}

impl Ctx {
    fn err(&mut self, d: Diagnostic) {
        self.diags.push(d);
    }
}

fn sourced<T>(doc: &DocText<'_>, s: &Spanned<String>, value: T) -> Sourced<T> {
    Sourced {
        value,
        origin: doc.origin(&s.referenced),
    }
}

/// DNS-1123 label: what Kubernetes and Talos accept as names.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// DNS-1123 subdomain: Kubernetes node names.
fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

fn check_name(ctx: &mut Ctx, doc: &DocText<'_>, name: &Spanned<String>, what: &str) -> bool {
    if is_dns_label(&name.value) {
        return true;
    }
    ctx.err(
        Diagnostic::error(
            codes::NAME,
            doc.origin(&name.referenced),
            format!("{what} name `{}` is not a valid name", name.value),
        )
        .with_help("use lowercase letters, digits and `-` (at most 63 characters, no leading or trailing `-`)"),
    );
    false
}

fn check_header(ctx: &mut Ctx, doc: &DocText<'_>, api_version: &Spanned<String>) {
    if api_version.value != API_VERSION {
        ctx.err(
            Diagnostic::error(
                codes::API_VERSION,
                doc.origin(&api_version.referenced),
                format!("unsupported apiVersion `{}`", api_version.value),
            )
            .with_help(format!("this medea reads `apiVersion: {API_VERSION}`")),
        );
    }
}

fn duration_field(
    ctx: &mut Ctx,
    doc: &DocText<'_>,
    field: &Option<Spanned<String>>,
) -> Option<Duration> {
    let f = field.as_ref()?;
    match crate::duration::Duration::parse_positive(&f.value) {
        Ok(d) => Some(d.get()),
        Err(e) => {
            ctx.err(Diagnostic::error(
                codes::DURATION,
                doc.origin(&f.referenced),
                e.to_string(),
            ));
            None
        }
    }
}

/// Apply a drain spec on top of `out` (the timeout lands in `out.drain_timeout`).
fn apply_drain(
    ctx: &mut Ctx,
    doc: &DocText<'_>,
    out: &mut RolloutSettings,
    rollout: Option<&RolloutSpec>,
    spec: Option<&DrainSpec>,
) {
    let Some(spec) = spec else { return };
    if let Some(b) = &spec.delete_empty_dir_data {
        out.drain.delete_empty_dir_data = b.value;
    }
    if let Some(b) = &spec.evict_unmanaged_pods {
        out.drain.evict_unmanaged_pods = b.value;
    }
    if let Some(sel) = &spec.skip_pods {
        let mut labels = BTreeMap::new();
        for (k, v) in &sel.value.match_labels {
            if k.is_empty() {
                ctx.err(Diagnostic::error(
                    codes::INVALID_VALUE,
                    doc.origin(&v.referenced),
                    "`drain.skipPods.matchLabels` has an empty label key",
                ));
                continue;
            }
            labels.insert(k.clone(), v.value.clone());
        }
        if labels.is_empty() {
            ctx.err(
                Diagnostic::error(
                    codes::INVALID_VALUE,
                    doc.origin(&sel.referenced),
                    "`drain.skipPods` selects no labels: it would skip every pod",
                )
                .with_help("give `drain.skipPods.matchLabels`, or remove `skipPods`"),
            );
        }
        out.drain.skip_pods = labels;
    }
    if let Some(t) = &spec.timeout {
        if let Some(old) = rollout.and_then(|r| r.drain_timeout.as_ref()) {
            ctx.err(
                Diagnostic::error(
                    codes::DURATION,
                    doc.origin(&t.referenced),
                    format!(
                        "both `drain.timeout` ({}) and `rollout.drainTimeout` ({}) are set",
                        t.value, old.value
                    ),
                )
                .with_help("`drain.timeout` replaces `rollout.drainTimeout`: remove `rollout.drainTimeout`"),
            );
        }
        if let Some(d) = duration_field(ctx, doc, &spec.timeout) {
            out.drain_timeout = d;
        }
    }
    apply_volume_detach(ctx, doc, out, spec);
}

/// `drain.waitForVolumeDetach` and `drain.volumeDetachTimeout` on top of `out`: a timeout
/// given while the wait is off is refused (it would say something that does not happen).
fn apply_volume_detach(
    ctx: &mut Ctx,
    doc: &DocText<'_>,
    out: &mut RolloutSettings,
    spec: &DrainSpec,
) {
    let timeout = duration_field(ctx, doc, &spec.volume_detach_timeout);
    match &spec.wait_for_volume_detach {
        Some(b) if !b.value => {
            if let Some(t) = &spec.volume_detach_timeout {
                ctx.err(
                    Diagnostic::error(
                        codes::INVALID_VALUE,
                        doc.origin(&t.referenced),
                        "`drain.volumeDetachTimeout` is set but `drain.waitForVolumeDetach` is false",
                    )
                    .with_help("remove `volumeDetachTimeout`, or set `waitForVolumeDetach: true`"),
                );
            }
            out.drain.volume_detach_timeout_secs = None;
        }
        Some(_) => {
            // turned on here (a pool over a cluster that turned it off): its own timeout, else
            // the default
            let t = timeout.unwrap_or(crate::desired::model::DEFAULT_VOLUME_DETACH_TIMEOUT);
            out.drain.volume_detach_timeout_secs = Some(t.as_secs());
        }
        None => {
            if let (Some(t), Some(f)) = (timeout, &spec.volume_detach_timeout) {
                if out.drain.volume_detach_timeout_secs.is_none() {
                    ctx.err(
                        Diagnostic::error(
                            codes::INVALID_VALUE,
                            doc.origin(&f.referenced),
                            "`drain.volumeDetachTimeout` is set but the cluster turned the wait off (`drain.waitForVolumeDetach: false`)",
                        )
                        .with_help("set `waitForVolumeDetach: true` next to it"),
                    );
                } else {
                    out.drain.volume_detach_timeout_secs = Some(t.as_secs());
                }
            }
        }
    }
}

/// Apply a rollout spec on top of `base`. Returns the result and the explicit maxUnavailable.
fn apply_rollout(
    ctx: &mut Ctx,
    doc: &DocText<'_>,
    base: &RolloutSettings,
    spec: Option<&RolloutSpec>,
    drain: Option<&DrainSpec>,
) -> RolloutSettings {
    let mut out = base.clone();
    apply_drain(ctx, doc, &mut out, spec, drain);
    let Some(spec) = spec else { return out };
    if let Some(b) = &spec.taint_next_wave {
        out.taint_next_wave = b.value;
    }
    if let Some(n) = &spec.upgrade_attempts {
        if n.value == 0 || n.value > MAX_UPGRADE_ATTEMPTS {
            ctx.err(
                Diagnostic::error(
                    codes::INVALID_VALUE,
                    doc.origin(&n.referenced),
                    format!(
                        "upgradeAttempts must be between 1 and {MAX_UPGRADE_ATTEMPTS}, not {}",
                        n.value
                    ),
                )
                .with_help("each attempt is one Upgrade call on the node; a failing installer rarely heals by itself"),
            );
        } else {
            out.upgrade_attempts = n.value;
        }
    }
    if let Some(st) = &spec.stage {
        out.stage = match st.value {
            format::StageSpec::Ahead => Stage::Ahead,
            format::StageSpec::InWindow => Stage::InWindow,
        };
    }
    if let Some(n) = &spec.stage_parallelism {
        if n.value == 0 || n.value > MAX_STAGE_PARALLELISM {
            ctx.err(
                Diagnostic::error(
                    codes::INVALID_VALUE,
                    doc.origin(&n.referenced),
                    format!(
                        "stageParallelism must be between 1 and {MAX_STAGE_PARALLELISM}, not {}",
                        n.value
                    ),
                )
                .with_help("it is how many nodes install ahead at once; each install loads the node's disk and network"),
            );
        } else {
            out.stage_parallelism = n.value;
        }
    }
    if let Some(m) = &spec.max_unavailable {
        if m.value == 0 {
            ctx.err(
                Diagnostic::error(
                    codes::INVALID_VALUE,
                    doc.origin(&m.referenced),
                    "maxUnavailable must be at least 1",
                )
                .with_help("a rollout with nothing allowed away could never start"),
            );
        } else {
            out.max_unavailable = m.value;
        }
    }
    if let Some(d) = duration_field(ctx, doc, &spec.drain_timeout) {
        out.drain_timeout = d;
    }
    if let Some(d) = duration_field(ctx, doc, &spec.health_timeout) {
        out.health_timeout = d;
    }
    out
}

/// Identity of one parsed document: the parse of its file (a number the loader gives each
/// parse, never reused) and the document's index in that file. Equal ids mean equal path,
/// bytes and document, so everything validation derived from the document alone is the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DocId {
    /// The loader's number for the parse of the document's file.
    pub file: u64,
    /// 0-based index of the document in its file.
    pub index: u32,
}

/// A document read strictly, borrowed from the loader's cache.
#[derive(Debug, Clone, Copy)]
pub enum DocRef<'a> {
    /// A `kind: Cluster` document.
    Cluster(&'a format::ClusterDoc),
    /// A `kind: NodePool` document.
    NodePool(&'a format::NodePoolDoc),
}

/// A document read strictly (owned): what the loader holds while a load runs. Boxed: a
/// `ClusterDoc` is about 2 KiB inline, and an empty slot for one is kept for every document.
#[derive(Debug)]
pub enum Full {
    /// A `kind: Cluster` document.
    Cluster(Box<format::ClusterDoc>),
    /// A `kind: NodePool` document.
    NodePool(Box<format::NodePoolDoc>),
}

/// What the whole-revision rules read of every document at every load: its names and, for a
/// NodePool, its cluster and machines as written. Small, kept for every file between loads
/// (the full document is not: it is read again from the file's text when a rule needs it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Summary {
    /// A `kind: Cluster` document.
    Cluster {
        /// `metadata.name`.
        name: String,
    },
    /// A `kind: NodePool` document.
    NodePool {
        /// `metadata.name`.
        name: String,
        /// `spec.cluster`.
        cluster: String,
        /// `spec.machines`, as written.
        machines: Vec<String>,
    },
}

impl Summary {
    /// The summary of a fully read document.
    pub fn of(full: &Full) -> Summary {
        match full {
            Full::Cluster(c) => Summary::Cluster {
                name: c.metadata.name.value.clone(),
            },
            Full::NodePool(p) => Summary::NodePool {
                name: p.metadata.name.value.clone(),
                cluster: p.spec.cluster.value.clone(),
                machines: p.spec.machines.iter().map(|m| m.value.clone()).collect(),
            },
        }
    }
}

/// Read a document that was read strictly before (same text, so the same result).
#[allow(
    clippy::expect_used,
    reason = "the text was read strictly by the same pure function before: reading it again cannot fail"
)]
pub fn reread(doc: &DocText<'_>) -> Full {
    match super::parse::read_past_unknown_fields(doc.clone())
        .0
        .expect("a document read before reads again")
    {
        super::parse::RawDoc::Cluster(c, _) => Full::Cluster(Box::new(c)),
        super::parse::RawDoc::NodePool(p, _) => Full::NodePool(Box::new(p)),
    }
}

/// One document handed to [`validate`]: its identity, its text and position, its summary,
/// and its full reading (kept from this load's parse, or read again from `doc` the first
/// time a rule needs it).
#[derive(Debug, Clone)]
pub struct Input<'a> {
    /// The document's identity.
    pub id: DocId,
    /// Its text and position in its file.
    pub doc: DocText<'a>,
    /// Its names, cluster and machines.
    pub summary: &'a Summary,
    /// Its full strict reading, filled the first time a rule needs it.
    pub full: &'a std::sync::OnceLock<Full>,
}

impl<'a> Input<'a> {
    fn kind(&self) -> DocRef<'a> {
        match self.full.get_or_init(|| reread(&self.doc)) {
            Full::Cluster(c) => DocRef::Cluster(c),
            Full::NodePool(p) => DocRef::NodePool(p),
        }
    }
}

/// What one cluster's part of the model depends on besides the documents' own contents:
/// compared with the previous load's to decide whether the group is validated again.
#[derive(Debug, PartialEq, Eq)]
struct GroupKey {
    /// The Cluster document that defines the cluster (the first valid one).
    cluster: DocId,
    /// The cluster's NodePool documents, in load order.
    pools: Vec<DocId>,
    /// Every pool name declared for the cluster (valid, invalid or unreadable).
    declared: Vec<String>,
    /// Machines of the group listed first by another pool: (pool's place in `pools`,
    /// machine's index in its `spec.machines`, the owning pool's document and index).
    conflicts: Vec<(u32, u32, DocId, u32)>,
}

/// One cluster's validated part: the cluster with its pools and the diagnostics of its pools
/// and `after:` order.
#[derive(Debug)]
struct Group {
    key: GroupKey,
    cluster: Arc<Cluster>,
    diags: Vec<Diagnostic>,
}

/// What [`validate`] keeps from one load to the next: each Cluster document's own result and
/// each cluster's validated group, keyed by what they depend on. A cold load is the same
/// code with an empty memo; a memo entry is reused only when its inputs are identical, so
/// the result never depends on the memo (property test
/// `desired::incremental::tests::incremental_load_equals_cold_load`).
#[derive(Debug, Default)]
pub struct Memo {
    /// Cluster document → whether it is a valid cluster, and its own diagnostics. (The
    /// cluster itself is kept once, in its group.)
    clusters: HashMap<DocId, (bool, Vec<Diagnostic>)>,
    /// Cluster name → its group.
    groups: HashMap<String, Group>,
    /// Groups validated again by the last call (the rest were reused).
    pub last_revalidated: usize,
}

/// Build the desired state from every document of a revision (in load order: files by path,
/// documents in file order), reusing from `memo` every part whose inputs are unchanged.
///
/// `broken` names documents that failed to parse (already reported); references to them are
/// not reported again.
///
/// Cross-file rules and what they read: a NodePool's cluster (the first valid Cluster
/// document of that name), the names declared per cluster (`after:`), the first listing of
/// each machine over every pool of a valid cluster (`machine in two pools`), and
/// `promotion.after` over all clusters. Cluster documents are validated alone; each
/// cluster's pools together (a group), again only when the group's [`GroupKey`] moved;
/// duplicates, missing clusters and promotion run over the whole revision (cheap: names
/// only, borrowed).
pub fn validate(
    inputs: &[Input<'_>],
    broken: &[Broken],
    revision: Revision,
    memo: &mut Memo,
) -> (Desired, Vec<Diagnostic>) {
    let mut ctx = Ctx { diags: Vec::new() };
    let mut declared_clusters: BTreeSet<&str> = BTreeSet::new();
    // cluster → every pool name declared for it, valid or not
    let mut declared_pools: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for b in broken {
        match b {
            Broken::Cluster { name } => {
                declared_clusters.insert(name);
            }
            Broken::NodePool { name, cluster } => {
                declared_pools.entry(cluster).or_default().insert(name);
            }
        }
    }
    for d in inputs {
        match d.summary {
            Summary::Cluster { name } => {
                declared_clusters.insert(name);
            }
            Summary::NodePool { name, cluster, .. } => {
                declared_pools.entry(cluster).or_default().insert(name);
            }
        }
    }

    // Cluster documents, each validated alone (memoized by document), then the first valid
    // one of each name defines the cluster.
    let mut cluster_memo: HashMap<DocId, (bool, Vec<Diagnostic>)> =
        HashMap::with_capacity(memo.clusters.len());
    // name → the defining document and its input index
    let mut winners: BTreeMap<&str, (DocId, usize)> = BTreeMap::new();
    // Clusters validated by this call (documents new to the memo), by input index.
    let mut built: HashMap<usize, Cluster> = HashMap::new();
    for (i, d) in inputs.iter().enumerate() {
        let Summary::Cluster { name } = d.summary else {
            continue;
        };
        let entry = memo.clusters.remove(&d.id).unwrap_or_else(|| {
            let DocRef::Cluster(c) = d.kind() else {
                return (false, Vec::new());
            };
            let mut own = Ctx { diags: Vec::new() };
            let cluster = cluster_from(&mut own, c, &d.doc);
            let valid = cluster.is_some();
            if let Some(cluster) = cluster {
                built.insert(i, cluster);
            }
            (valid, own.diags)
        });
        ctx.diags.extend(entry.1.iter().cloned());
        if entry.0 {
            let name = name.as_str();
            if let Some((_, first)) = winners.get(name) {
                let (DocRef::Cluster(first_doc), DocRef::Cluster(c)) =
                    (inputs[*first].kind(), d.kind())
                else {
                    continue;
                };
                let first = inputs[*first]
                    .doc
                    .origin(&first_doc.metadata.name.referenced);
                ctx.err(
                    Diagnostic::error(
                        codes::DUPLICATE,
                        d.doc.origin(&c.metadata.name.referenced),
                        format!("cluster `{name}` is defined twice"),
                    )
                    .with_help(format!("first defined at {}:{}", first.file, first.line)),
                );
            } else {
                winners.insert(name, (d.id, i));
            }
        }
        cluster_memo.insert(d.id, entry);
    }

    // NodePool documents: grouped by their (valid) cluster; the others only checked alone.
    let mut groups_in: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    // (cluster, machine) → (input index of the pool that lists it first, index in its
    // `machines`). A machine is named per cluster: two clusters made from one template both
    // have a `cp-1`, and those are two machines.
    let mut owner: HashMap<(&str, &str), (usize, u32)> = HashMap::new();
    for (i, d) in inputs.iter().enumerate() {
        let Summary::NodePool {
            cluster, machines, ..
        } = d.summary
        else {
            continue;
        };
        let cluster_name = cluster.as_str();
        if winners.contains_key(cluster_name) {
            groups_in.entry(cluster_name).or_default().push(i);
            for (pos, m) in machines.iter().enumerate() {
                if is_dns_subdomain(m) {
                    owner
                        .entry((cluster_name, m.as_str()))
                        .or_insert((i, pos as u32));
                }
            }
            continue;
        }
        let DocRef::NodePool(p) = d.kind() else {
            continue;
        };
        check_header(&mut ctx, &d.doc, &p.api_version);
        check_name(&mut ctx, &d.doc, &p.metadata.name, "node pool");
        if declared_clusters.contains(cluster_name) {
            // The cluster exists but is invalid; its own diagnostics say why.
            continue;
        }
        let known: Vec<&str> = declared_clusters.iter().copied().collect();
        let help = if known.is_empty() {
            "no Cluster is defined in the desired state; add a `kind: Cluster` document".to_string()
        } else {
            format!("defined clusters: {}", known.join(", "))
        };
        ctx.err(
            Diagnostic::error(
                codes::MISSING_CLUSTER,
                d.doc.origin(&p.spec.cluster.referenced),
                format!(
                    "node pool `{}` refers to cluster `{cluster_name}`, which is not defined",
                    p.metadata.name.value
                ),
            )
            .with_help(help),
        );
    }

    // At most MAX_POOLS_PER_CLUSTER pools a cluster (issue #49); the pools past it, in path
    // order, are not validated.
    for (&name, pools) in groups_in.iter_mut() {
        let max = super::source::limits::MAX_POOLS_PER_CLUSTER;
        if pools.len() <= max {
            continue;
        }
        let d = &inputs[pools[max]];
        if let DocRef::NodePool(p) = d.kind() {
            ctx.err(
                Diagnostic::error(
                    codes::LIMIT,
                    d.doc.origin(&p.metadata.name.referenced),
                    format!(
                        "cluster `{name}` has {} node pools, more than {max} (limit MAX_POOLS_PER_CLUSTER); this is the first one past it, and none from here on was validated",
                        pools.len()
                    ),
                )
                .with_help("a pool holds any number of machines: merge pools that share a role, version and rollout settings"),
            );
        }
        pools.truncate(max);
    }
    let mut groups: HashMap<String, Group> = HashMap::with_capacity(winners.len());
    let mut clusters: BTreeMap<String, Arc<Cluster>> = BTreeMap::new();
    let mut revalidated = 0;
    let no_pools = Vec::new();
    let no_names = BTreeSet::new();
    for (&name, &(id, at)) in &winners {
        let pool_inputs = groups_in.get(name).unwrap_or(&no_pools);
        let declared = declared_pools.get(name).unwrap_or(&no_names);
        let mut conflicts = Vec::new();
        for (k, &i) in pool_inputs.iter().enumerate() {
            let Summary::NodePool { machines, .. } = inputs[i].summary else {
                continue;
            };
            for (pos, m) in machines.iter().enumerate() {
                if let Some(&(j, jpos)) = owner.get(&(name, m.as_str()))
                    && j != i
                {
                    conflicts.push((k as u32, pos as u32, inputs[j].id, jpos));
                }
            }
        }
        let previous = memo.groups.remove(name);
        let unchanged = |key: &GroupKey| {
            key.cluster == id
                && key.pools.len() == pool_inputs.len()
                && key
                    .pools
                    .iter()
                    .zip(pool_inputs)
                    .all(|(a, &i)| *a == inputs[i].id)
                && key
                    .declared
                    .iter()
                    .map(String::as_str)
                    .eq(declared.iter().copied())
                && key.conflicts == conflicts
        };
        let group = match previous {
            Some(g) if unchanged(&g.key) => g,
            previous => {
                revalidated += 1;
                // The cluster without pools: validated by this call, else the previous
                // group's (same document), else validated again (diagnostics already kept).
                let mut cluster = match (built.remove(&at), previous) {
                    (Some(c), _) => c,
                    (None, Some(p)) if p.key.cluster == id => {
                        let mut c = Arc::unwrap_or_clone(p.cluster);
                        c.pools.clear();
                        c
                    }
                    _ => {
                        let DocRef::Cluster(c) = inputs[at].kind() else {
                            continue;
                        };
                        let mut discard = Ctx { diags: Vec::new() };
                        let Some(c) = cluster_from(&mut discard, c, &inputs[at].doc) else {
                            continue;
                        };
                        c
                    }
                };
                let mut own = Ctx { diags: Vec::new() };
                for &i in pool_inputs {
                    pool_into(&mut own, &mut cluster, inputs, i, &owner);
                }
                check_order(&mut own, &cluster, declared);
                check_stage_parallelism(&mut own, &cluster, inputs, at, pool_inputs);
                Group {
                    key: GroupKey {
                        cluster: id,
                        pools: pool_inputs.iter().map(|&i| inputs[i].id).collect(),
                        declared: declared.iter().map(|s| s.to_string()).collect(),
                        conflicts,
                    },
                    cluster: Arc::new(cluster),
                    diags: own.diags,
                }
            }
        };
        ctx.diags.extend(group.diags.iter().cloned());
        clusters.insert(name.to_string(), group.cluster.clone());
        groups.insert(name.to_string(), group);
    }
    check_promotion(&mut ctx, &clusters, &declared_clusters);
    ctx.diags.sort_by(|a, b| {
        a.origin
            .cmp(&b.origin)
            .then_with(|| a.message.cmp(&b.message))
    });
    memo.clusters = cluster_memo;
    memo.groups = groups;
    memo.last_revalidated = revalidated;
    (Desired { revision, clusters }, ctx.diags)
}

/// Validate the NodePool document `inputs[i]` into `cluster` (its valid cluster). `owner`
/// maps every (cluster, machine) to the pool that lists it first.
#[allow(
    clippy::expect_used,
    reason = "DEFAULT_INSTALLER is a constant valid repository (the installer_images test parses it)"
)]
fn pool_into(
    ctx: &mut Ctx,
    cluster: &mut Cluster,
    inputs: &[Input<'_>],
    i: usize,
    owner: &HashMap<(&str, &str), (usize, u32)>,
) {
    let doc = &inputs[i].doc;
    let DocRef::NodePool(raw) = inputs[i].kind() else {
        return;
    };
    check_header(ctx, doc, &raw.api_version);
    let name_ok = check_name(ctx, doc, &raw.metadata.name, "node pool");
    let spec = &raw.spec;
    let cluster_name = &spec.cluster.value;
    let role = spec.role.value;
    let talos_version = match TalosVersion::parse(&spec.talos.version.value) {
        Ok(v) => Some(sourced(doc, &spec.talos.version, v)),
        Err(e) => {
            ctx.err(Diagnostic::error(
                codes::VERSION,
                doc.origin(&spec.talos.version.referenced),
                e.to_string(),
            ));
            None
        }
    };
    let image = match &spec.talos.installer_image {
        None => Some(Sourced {
            value: InstallerImage::parse(DEFAULT_INSTALLER).expect("default installer parses"),
            origin: doc.origin(&spec.talos.version.referenced),
        }),
        Some(img) => match InstallerImage::parse(&img.value) {
            Ok(i) => Some(sourced(doc, img, i)),
            Err(e) => {
                ctx.err(Diagnostic::error(
                    codes::IMAGE,
                    doc.origin(&img.referenced),
                    e.to_string(),
                ));
                None
            }
        },
    };
    // Control plane: at most one machine away, always.
    let mut base = cluster.rollout.clone();
    if role == Role::Controlplane {
        base.max_unavailable = 1;
        if let Some(m) = spec
            .rollout
            .as_ref()
            .and_then(|r| r.max_unavailable.as_ref())
            && m.value > 1
        {
            ctx.err(
                Diagnostic::error(
                    codes::CONTROL_PLANE_UNAVAILABLE,
                    doc.origin(&m.referenced),
                    format!("control-plane pool `{}` sets maxUnavailable: {}", raw.metadata.name.value, m.value),
                )
                .with_label("control-plane pools roll one machine at a time")
                .with_help("remove the override or set it to 1: taking two control-plane nodes away risks etcd quorum"),
            );
        }
    }
    let rollout = apply_rollout(ctx, doc, &base, spec.rollout.as_ref(), spec.drain.as_ref());

    let mut machines = Vec::new();
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    for (pos, m) in spec.machines.iter().enumerate() {
        if !is_dns_subdomain(&m.value) {
            ctx.err(
                Diagnostic::error(
                    codes::NAME,
                    doc.origin(&m.referenced),
                    format!("machine `{}` is not a valid node name", m.value),
                )
                .with_help("machines are listed by Kubernetes node name (lowercase, DNS-1123)"),
            );
            continue;
        }
        if !seen.insert(m.value.as_str()) {
            ctx.err(Diagnostic::error(
                codes::DUPLICATE,
                doc.origin(&m.referenced),
                format!("machine `{}` is listed twice in this pool", m.value),
            ));
            continue;
        }
        if let Some(&(j, jpos)) = owner.get(&(cluster_name.as_str(), m.value.as_str()))
            && (j, jpos) != (i, pos as u32)
            && let DocRef::NodePool(first_pool) = inputs[j].kind()
        {
            let first = inputs[j]
                .doc
                .origin(&first_pool.spec.machines[jpos as usize].referenced);
            ctx.err(
                Diagnostic::error(
                    codes::MACHINE_TWICE,
                    doc.origin(&m.referenced),
                    format!(
                        "machine `{}` is already in node pool `{}` of cluster `{}`",
                        m.value, first_pool.metadata.name.value, first_pool.spec.cluster.value
                    ),
                )
                .with_help(format!(
                    "a machine belongs to exactly one pool; first listed at {}:{}",
                    first.file, first.line
                )),
            );
            continue;
        }
        machines.push(sourced(doc, m, m.value.clone()));
    }
    let selector: BTreeMap<String, String> = spec
        .selector
        .as_ref()
        .map(|s| {
            s.match_labels
                .iter()
                .map(|(k, v)| (k.clone(), v.value.clone()))
                .collect()
        })
        .unwrap_or_default();
    if spec.machines.is_empty() && selector.is_empty() {
        ctx.err(
            Diagnostic::error(
                codes::EMPTY_POOL,
                doc.origin(&raw.metadata.name.referenced),
                format!(
                    "node pool `{}` selects no machines",
                    raw.metadata.name.value
                ),
            )
            .with_help("list node names under `spec.machines` or give `spec.selector.matchLabels`"),
        );
    }
    let health = super::health::pool_health(
        &mut ctx.diags,
        doc,
        &cluster.health,
        spec.health.as_ref(),
        spec.on_failure.as_ref(),
    );
    let (hooks, hook_origins) = super::hooks::pool_hooks(&mut ctx.diags, doc, spec.hooks.as_ref());
    let after: Vec<Sourced<String>> = spec
        .after
        .iter()
        .map(|a| sourced(doc, a, a.value.clone()))
        .collect();
    let name = sourced(doc, &raw.metadata.name, raw.metadata.name.value.clone());
    if let Some(first) = cluster.pools.get(&name.value) {
        let first = &first.name.origin;
        ctx.err(
            Diagnostic::error(
                codes::DUPLICATE,
                name.origin.clone(),
                format!(
                    "node pool `{}` is defined twice in cluster `{cluster_name}`",
                    name.value
                ),
            )
            .with_help(format!("first defined at {}:{}", first.file, first.line)),
        );
        return;
    }
    let (Some(talos_version), Some(installer_image), true) = (talos_version, image, name_ok) else {
        return;
    };
    let pool = NodePool {
        cluster: sourced(doc, &spec.cluster, cluster_name.clone()),
        name,
        role,
        machines,
        selector,
        talos_version,
        installer_image,
        installer_named: spec.talos.installer_image.is_some(),
        rollout,
        health,
        after,
        hooks,
        hook_origins,
        document: doc.text.to_string(),
    };
    cluster
        .pools
        .insert(pool.name.value.clone(), Arc::new(pool));
}
fn cluster_from(ctx: &mut Ctx, c: &format::ClusterDoc, doc: &DocText<'_>) -> Option<Cluster> {
    check_header(ctx, doc, &c.api_version);
    let name_ok = check_name(ctx, doc, &c.metadata.name, "cluster");
    let spec = &c.spec;
    let version = match KubeVersion::parse(&spec.kubernetes.version.value) {
        Ok(v) => Some(sourced(doc, &spec.kubernetes.version, v)),
        Err(e) => {
            ctx.err(Diagnostic::error(
                codes::VERSION,
                doc.origin(&spec.kubernetes.version.referenced),
                e.to_string(),
            ));
            None
        }
    };
    let rollout = apply_rollout(
        ctx,
        doc,
        &RolloutSettings::default(),
        spec.rollout.as_ref(),
        spec.drain.as_ref(),
    );
    let mut approvals = ApprovalSettings::default();
    if let Some(a) = &spec.approvals {
        for field in [&a.required, &a.control_plane].into_iter().flatten() {
            if field.value == 0 {
                ctx.err(
                    Diagnostic::error(
                        codes::APPROVALS,
                        doc.origin(&field.referenced),
                        "an approval count must be at least 1",
                    )
                    .with_help("medea never runs a plan nobody signed"),
                );
            }
        }
        if let Some(r) = &a.required {
            approvals.required = r.value.max(1);
            // The control-plane bar is never lower than the ordinary one.
            approvals.control_plane = approvals.control_plane.max(approvals.required);
        }
        if let Some(cp) = &a.control_plane {
            if cp.value < approvals.required {
                ctx.err(
                    Diagnostic::error(
                        codes::APPROVALS,
                        doc.origin(&cp.referenced),
                        format!("approvals.controlPlane ({}) is lower than approvals.required ({})", cp.value, approvals.required),
                    )
                    .with_help("plans that touch control-plane nodes or Kubernetes need at least as many signers as any other plan"),
                );
            } else {
                approvals.control_plane = cp.value;
            }
        }
    }
    let mut windows = Vec::new();
    for w in &spec.maintenance_windows {
        let Some(duration) = duration_field(ctx, doc, &Some(clone_spanned(&w.duration))) else {
            continue;
        };
        let zone = w.time_zone.as_ref().map_or("UTC", |z| z.value.as_str());
        match MaintenanceWindow::new(&w.start.value, duration, zone) {
            Ok(win) => windows.push(win),
            Err(e) => {
                let at = match &e {
                    super::window::WindowError::Cron { .. } => &w.start,
                    super::window::WindowError::TimeZone { .. } => {
                        w.time_zone.as_ref().unwrap_or(&w.start)
                    }
                    super::window::WindowError::Duration => &w.duration,
                };
                ctx.err(Diagnostic::error(
                    codes::WINDOW,
                    doc.origin(&at.referenced),
                    e.to_string(),
                ));
            }
        }
    }
    let exclusions = exclusions(ctx, doc, spec.maintenance.as_ref());
    let upgrade_policy = spec
        .upgrade_policy
        .as_ref()
        .map(|u| upgrade_policy(ctx, doc, u))
        .unwrap_or_default();
    let health = super::health::cluster_health(&mut ctx.diags, doc, spec.health.as_ref());
    let preflight = preflight_settings(ctx, doc, spec.preflight.as_ref());
    let promotion = promotion(ctx, doc, spec.promotion.as_ref());
    let backup = super::backup::backup_settings(&mut ctx.diags, doc, spec.backup.as_ref());
    let (hooks, hook_origins) =
        super::hooks::cluster_hooks(&mut ctx.diags, doc, spec.hooks.as_ref());
    let (Some(kubernetes_version), true) = (version, name_ok) else {
        return None;
    };
    Some(Cluster {
        name: sourced(doc, &c.metadata.name, c.metadata.name.value.clone()),
        kubernetes_version,
        rollout,
        approvals,
        windows,
        exclusions,
        upgrade_policy,
        health,
        preflight,
        promotion,
        backup,
        hooks,
        hook_origins,
        pools: BTreeMap::new(),
        document: doc.text.to_string(),
    })
}

/// `spec.maintenance.exclusions`: unique names, RFC 3339 or local times (read in the entry's
/// `timeZone`), `from` before `to`, a known scope. Every problem is reported; an entry with
/// any is left out.
fn exclusions(
    ctx: &mut Ctx,
    doc: &DocText<'_>,
    spec: Option<&format::MaintenanceSpec>,
) -> Vec<super::exclusion::Exclusion> {
    use super::exclusion::{Exclusion, ExclusionScope, parse_time, time_zone};
    let mut out = Vec::new();
    let mut names = BTreeSet::new();
    for e in spec.map(|m| m.exclusions.as_slice()).unwrap_or_default() {
        let ok = std::cell::Cell::new(true);
        let fail = |ctx: &mut Ctx, at: &Spanned<String>, msg: String, help: &str| {
            ok.set(false);
            ctx.err(
                Diagnostic::error(codes::EXCLUSION, doc.origin(&at.referenced), msg)
                    .with_help(help.to_string()),
            );
        };
        if !is_dns_label(&e.name.value) {
            fail(
                ctx,
                &e.name,
                format!("exclusion name `{}` is not a valid name", e.name.value),
                "use lowercase letters, digits and `-` (at most 63 characters, no leading or trailing `-`)",
            );
        } else if !names.insert(e.name.value.as_str()) {
            fail(
                ctx,
                &e.name,
                format!(
                    "exclusion `{}` is defined twice in this cluster",
                    e.name.value
                ),
                "give each exclusion its own name: plans and waits name them",
            );
        }
        let zone_name = e.time_zone.as_ref().map_or("UTC", |z| z.value.as_str());
        let zone = match time_zone(zone_name) {
            Ok(z) => Some(z),
            Err(err) => {
                let at = e.time_zone.as_ref().unwrap_or(&e.name);
                fail(
                    ctx,
                    at,
                    err.to_string(),
                    "the zone local `from`/`to` times are read in",
                );
                None
            }
        };
        let time = |ctx: &mut Ctx, at: &Spanned<String>| {
            let zone = zone.as_ref()?;
            match parse_time(&at.value, zone) {
                Ok(t) => Some(t),
                Err(err) => {
                    fail(
                        ctx,
                        at,
                        err.to_string(),
                        "an exclusion holds changes from `from` (inclusive) to `to` (exclusive)",
                    );
                    None
                }
            }
        };
        let from = time(ctx, &e.from);
        let to = time(ctx, &e.to);
        let scope = match &e.scope {
            None => Some(ExclusionScope::NoUpgrades),
            Some(s) => match ExclusionScope::parse(&s.value) {
                Some(sc) => Some(sc),
                None => {
                    fail(
                        ctx,
                        s,
                        format!("unknown exclusion scope `{}`", s.value),
                        "use `noUpgrades` (no change starts) or `noMinorUpgrades` (patches still start)",
                    );
                    None
                }
            },
        };
        let (Some(from), Some(to)) = (from, to) else {
            continue;
        };
        // The order is checked whatever the scope: every problem at once.
        match Exclusion::new(
            e.name.value.clone(),
            from,
            to,
            scope.unwrap_or(ExclusionScope::NoUpgrades),
        ) {
            Ok(x) if ok.get() && scope.is_some() => out.push(x),
            Ok(_) => {}
            Err(err) => fail(
                ctx,
                &e.to,
                err.to_string(),
                "`to` must be later than `from`",
            ),
        }
    }
    out
}

/// The catalog override: extra Talos releases and Kubernetes support windows.
fn upgrade_policy(
    ctx: &mut Ctx,
    doc: &DocText<'_>,
    spec: &format::UpgradePolicySpec,
) -> UpgradePolicy {
    let mut releases = BTreeSet::new();
    for r in &spec.talos_releases {
        match TalosVersion::parse(&r.value) {
            Ok(v) => {
                if !releases.insert(v) {
                    ctx.err(Diagnostic::error(
                        codes::DUPLICATE,
                        doc.origin(&r.referenced),
                        format!("Talos release `{}` is listed twice", r.value),
                    ));
                }
            }
            Err(e) => ctx.err(Diagnostic::error(
                codes::VERSION,
                doc.origin(&r.referenced),
                e.to_string(),
            )),
        }
    }
    let mut support: BTreeMap<MinorLine, SupportOverride> = BTreeMap::new();
    for w in &spec.kubernetes_support {
        let mut line = |s: &Spanned<String>| match parse_minor_line(&s.value) {
            Ok(l) => Some(l),
            Err(e) => {
                ctx.err(Diagnostic::error(
                    codes::VERSION,
                    doc.origin(&s.referenced),
                    e.to_string(),
                ));
                None
            }
        };
        let (Some(talos), Some(min), Some(max)) = (
            line(&w.talos),
            line(&w.min_kubernetes),
            line(&w.max_kubernetes),
        ) else {
            continue;
        };
        if min > max {
            ctx.err(
                Diagnostic::error(
                    codes::INVALID_VALUE,
                    doc.origin(&w.min_kubernetes.referenced),
                    format!(
                        "minKubernetes {} is newer than maxKubernetes {}",
                        w.min_kubernetes.value, w.max_kubernetes.value
                    ),
                )
                .with_help("both ends are inclusive minor lines, oldest first"),
            );
            continue;
        }
        if support.contains_key(&talos) {
            ctx.err(Diagnostic::error(
                codes::DUPLICATE,
                doc.origin(&w.talos.referenced),
                format!(
                    "Kubernetes support of Talos {} is given twice",
                    w.talos.value
                ),
            ));
            continue;
        }
        support.insert(
            talos,
            SupportOverride {
                talos,
                min_kubernetes: min,
                max_kubernetes: max,
            },
        );
    }
    let mut removed_apis: BTreeMap<(String, String, String), crate::api_lifecycle::ApiLifecycle> =
        BTreeMap::new();
    for r in &spec.removed_apis {
        let mut line = |s: &Spanned<String>| match parse_minor_line(&s.value) {
            Ok(l) => Some(l),
            Err(e) => {
                ctx.err(Diagnostic::error(
                    codes::VERSION,
                    doc.origin(&s.referenced),
                    e.to_string(),
                ));
                None
            }
        };
        let (Some(deprecated), Some(removed)) = (line(&r.deprecated_in), line(&r.removed_in))
        else {
            continue;
        };
        if deprecated > removed {
            ctx.err(
                Diagnostic::error(
                    codes::INVALID_VALUE,
                    doc.origin(&r.deprecated_in.referenced),
                    format!(
                        "deprecatedIn {} is newer than removedIn {}",
                        r.deprecated_in.value, r.removed_in.value
                    ),
                )
                .with_help("an API is deprecated before (or when) it is removed"),
            );
            continue;
        }
        let group = r.group.as_ref().map_or(String::new(), |g| g.value.clone());
        let key = (
            group.clone(),
            r.version.value.clone(),
            r.resource.value.clone(),
        );
        if removed_apis.contains_key(&key) {
            ctx.err(Diagnostic::error(
                codes::DUPLICATE,
                doc.origin(&r.resource.referenced),
                format!("removed API {}/{} {} is listed twice", key.0, key.1, key.2),
            ));
            continue;
        }
        removed_apis.insert(
            key,
            crate::api_lifecycle::ApiLifecycle {
                group,
                version: r.version.value.clone(),
                resource: r.resource.value.clone(),
                kind: r.kind.value.clone(),
                deprecated,
                removed,
                replacement: r.replacement.as_ref().map(|s| s.value.clone()),
            },
        );
    }
    UpgradePolicy {
        allow_downgrade: spec.allow_downgrade,
        talos_releases: releases.into_iter().collect(),
        kubernetes_support: support.into_values().collect(),
        removed_apis: removed_apis.into_values().collect(),
    }
}

/// `spec.preflight`: acknowledged ids, each once.
fn preflight_settings(
    ctx: &mut Ctx,
    doc: &DocText<'_>,
    spec: Option<&format::PreflightSpec>,
) -> PreflightSettings {
    let mut out = PreflightSettings::default();
    for a in spec.map(|p| p.acknowledge.as_slice()).unwrap_or_default() {
        if a.value.trim().is_empty() {
            ctx.err(
                Diagnostic::error(
                    codes::ACKNOWLEDGE,
                    doc.origin(&a.referenced),
                    "an acknowledged finding id is empty",
                )
                .with_help("copy the finding's id from the plan's `preflight:` section"),
            );
            continue;
        }
        if out.acknowledges(&a.value) {
            ctx.err(Diagnostic::error(
                codes::DUPLICATE,
                doc.origin(&a.referenced),
                format!("finding `{}` is acknowledged twice", a.value),
            ));
            continue;
        }
        out.acknowledge.push(sourced(doc, a, a.value.clone()));
    }
    out
}

/// `spec.promotion` as written (the upstream cluster is checked once every cluster is known).
fn promotion(
    ctx: &mut Ctx,
    doc: &DocText<'_>,
    spec: Option<&format::PromotionSpec>,
) -> Option<Promotion> {
    let p = spec?;
    let soak = duration_field(ctx, doc, &Some(clone_spanned(&p.soak)))?;
    Some(Promotion {
        after: sourced(doc, &p.after, p.after.value.clone()),
        soak,
    })
}

/// Promotion references name another declared cluster and never form a cycle.
fn check_promotion(
    ctx: &mut Ctx,
    clusters: &BTreeMap<String, Arc<Cluster>>,
    declared: &BTreeSet<&str>,
) {
    for (name, c) in clusters {
        let Some(p) = &c.promotion else { continue };
        if &p.after.value == name {
            ctx.err(
                Diagnostic::error(
                    codes::PROMOTION,
                    p.after.origin.clone(),
                    format!("cluster `{name}` cannot be promoted after itself"),
                )
                .with_help("name the cluster that must run a version first"),
            );
            continue;
        }
        if !clusters.contains_key(&p.after.value) {
            if declared.contains(p.after.value.as_str()) {
                continue; // invalid cluster, reported already
            }
            let known: Vec<&str> = clusters.keys().map(String::as_str).collect();
            ctx.err(
                Diagnostic::error(
                    codes::PROMOTION,
                    p.after.origin.clone(),
                    format!(
                        "cluster `{name}` is promoted after `{}`, which is not defined",
                        p.after.value
                    ),
                )
                .with_help(format!("defined clusters: {}", known.join(", "))),
            );
            continue;
        }
        // Walk upstream; coming back to `name` is a cycle (reported at each member's `after`).
        let mut seen = vec![name.as_str()];
        let mut at = p.after.value.as_str();
        while let Some(up) = clusters.get(at).and_then(|c| c.promotion.as_ref()) {
            seen.push(at);
            if up.after.value == *name {
                seen.push(name);
                ctx.err(
                    Diagnostic::error(
                        codes::PROMOTION,
                        p.after.origin.clone(),
                        format!("`promotion.after` has a cycle: {}", seen.join(" → ")),
                    )
                    .with_help("one cluster of the chain must not wait for another"),
                );
                break;
            }
            if seen.contains(&up.after.value.as_str()) {
                break; // a cycle not through `name`: reported at its own members
            }
            at = up.after.value.as_str();
        }
    }
}

fn clone_spanned(s: &Spanned<String>) -> Spanned<String> {
    Spanned::new(s.value.clone(), s.referenced, s.defined)
}

/// `after:` references exist, are acyclic, and never put control plane after workers.
/// `rollout.stageParallelism` only bounds installs ahead (`stage: ahead`): written where
/// nothing stages, it has no effect, and a warning says so where it is written. A pool's is
/// without effect when the pool does not stage; the cluster's when no pool of it stages with
/// the cluster's value (a pool that stages and sets its own does not use it).
fn check_stage_parallelism(
    ctx: &mut Ctx,
    cluster: &Cluster,
    inputs: &[Input<'_>],
    at: usize,
    pool_inputs: &[usize],
) {
    let help = "set `rollout.stage: ahead` here (or on the cluster), or remove `stageParallelism`";
    fn set_here(spec: Option<&RolloutSpec>) -> Option<&Spanned<u32>> {
        spec.and_then(|r| r.stage_parallelism.as_ref())
            .filter(|n| (1..=MAX_STAGE_PARALLELISM).contains(&n.value))
    }
    let mut cluster_value_used = false;
    for &i in pool_inputs {
        let DocRef::NodePool(p) = inputs[i].kind() else {
            continue;
        };
        // a pool that did not validate has its own diagnostics
        let Some(pool) = cluster.pools.get(&p.metadata.name.value) else {
            continue;
        };
        let own = set_here(p.spec.rollout.as_ref());
        let stages = pool.rollout.stage == Stage::Ahead;
        let cp = pool.role == Role::Controlplane;
        if stages && !cp && own.is_none() {
            cluster_value_used = true;
        }
        if let Some(n) = own
            && stages
            && cp
        {
            ctx.err(
                Diagnostic::warning(
                    codes::NO_EFFECT,
                    inputs[i].doc.origin(&n.referenced),
                    format!(
                        "`stageParallelism` has no effect: control-plane pool `{}` installs ahead one node at a time, after the etcd snapshot",
                        p.metadata.name.value
                    ),
                )
                .with_help("remove `stageParallelism` from the control-plane pool"),
            );
        }
        if let Some(n) = own
            && !stages
        {
            ctx.err(
                Diagnostic::warning(
                    codes::NO_EFFECT,
                    inputs[i].doc.origin(&n.referenced),
                    format!(
                        "`stageParallelism` has no effect: pool `{}` does not stage (its `rollout.stage` is `inWindow`), so nothing installs ahead",
                        p.metadata.name.value
                    ),
                )
                .with_help(help),
            );
        }
    }
    let DocRef::Cluster(c) = inputs[at].kind() else {
        return;
    };
    if let Some(n) = set_here(c.spec.rollout.as_ref())
        && cluster.rollout.stage != Stage::Ahead
        && !cluster_value_used
    {
        ctx.err(
            Diagnostic::warning(
                codes::NO_EFFECT,
                inputs[at].doc.origin(&n.referenced),
                format!(
                    "`stageParallelism` has no effect: cluster `{}` does not stage (its `rollout.stage` is `inWindow`) and no pool of it stages with this value",
                    c.metadata.name.value
                ),
            )
            .with_help(help),
        );
    }
}

fn check_order(ctx: &mut Ctx, cluster: &Cluster, declared: &BTreeSet<&str>) {
    for pool in cluster.pools.values() {
        for a in &pool.after {
            if a.value == pool.name.value {
                ctx.err(Diagnostic::error(
                    codes::ORDER,
                    a.origin.clone(),
                    format!("node pool `{}` cannot come after itself", a.value),
                ));
                continue;
            }
            match cluster.pools.get(&a.value) {
                None if declared.contains(a.value.as_str()) => {} // invalid pool, reported already
                None => {
                    let known: Vec<&str> = cluster.pools.keys().map(String::as_str).collect();
                    ctx.err(
                        Diagnostic::error(
                            codes::MISSING_POOL,
                            a.origin.clone(),
                            format!("node pool `{}` comes after `{}`, which is not a pool of cluster `{}`", pool.name.value, a.value, cluster.name.value),
                        )
                        .with_help(format!("pools of `{}`: {}", cluster.name.value, known.join(", "))),
                    );
                }
                Some(dep) if pool.role == Role::Controlplane && dep.role == Role::Worker => {
                    ctx.err(
                        Diagnostic::error(
                            codes::ORDER,
                            a.origin.clone(),
                            format!("control-plane pool `{}` cannot come after worker pool `{}`", pool.name.value, a.value),
                        )
                        .with_help("medea upgrades control-plane pools before workers, so workers never run a newer Talos than the control plane"),
                    );
                }
                Some(_) => {}
            }
        }
    }
    // Cycle detection (depth-first, reported once per cycle at the edge that closes it).
    let mut state: BTreeMap<&str, u8> = BTreeMap::new(); // 1 = on stack, 2 = done
    fn visit<'a>(
        ctx: &mut Ctx,
        cluster: &'a Cluster,
        name: &'a str,
        state: &mut BTreeMap<&'a str, u8>,
        stack: &mut Vec<&'a str>,
    ) {
        state.insert(name, 1);
        stack.push(name);
        if let Some(pool) = cluster.pools.get(name) {
            for a in &pool.after {
                if a.value == name || !cluster.pools.contains_key(&a.value) {
                    continue;
                }
                match state.get(a.value.as_str()) {
                    Some(1) => {
                        let start = stack.iter().position(|s| *s == a.value).unwrap_or(0);
                        let mut cycle: Vec<&str> = stack[start..].to_vec();
                        cycle.push(&a.value);
                        ctx.err(
                            Diagnostic::error(
                                codes::ORDER,
                                a.origin.clone(),
                                format!("`after:` ordering has a cycle: {}", cycle.join(" → ")),
                            )
                            .with_help("remove one of the `after:` entries"),
                        );
                    }
                    Some(_) => {}
                    None => visit(ctx, cluster, &a.value, state, stack),
                }
            }
        }
        stack.pop();
        state.insert(name, 2);
    }
    for name in cluster.pools.keys() {
        if !state.contains_key(name.as_str()) {
            visit(ctx, cluster, name, &mut state, &mut Vec::new());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(is_dns_label("prod-1"));
        assert!(!is_dns_label("Prod"));
        assert!(!is_dns_label("-x"));
        assert!(is_dns_subdomain("cp-1.example.com"));
        assert!(!is_dns_subdomain("cp_1"));
    }
}
