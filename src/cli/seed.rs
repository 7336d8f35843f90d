//! `medea seed`: discover a running cluster, create its observed record in the store, copy its
//! credentials into the credentials directory, and print desired-state YAML that matches it.
//!
//! Offline for a store directory: the server must be stopped (the store's lock proves it). An
//! `etcd://` store is shared by the replicas, so seeding it needs no stop: the record is
//! created with a compare-and-swap transaction, as on fjall. The record starts with
//! `rolloutsEnabled: false`; only `medea cluster enable-rollouts` turns it on. An existing record
//! is refused unless `--force`, which refreshes the observation (the generation moves only if
//! something changed), replaces the credentials, and keeps `rolloutsEnabled` as it is.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Args;
use miette::{IntoDiagnostic as _, WrapErr as _};

use super::exit;
use crate::desired::model::{DEFAULT_INSTALLER, InstallerImage};
use crate::inventory::{Machine, MachineRole, ObservedCluster, cluster_key};
use crate::k8s::{ClientOptions, K8sError, KubeClient};
use crate::ops::refresh::{self, ClusterCreds, RefreshError, RefreshSettings};
use crate::server::secrets::{private_dir, write_private};
use crate::store::{Check, Store, StoreError, Table, Txn, record};
use crate::talos::{TalosClient, TalosError};
use crate::version::{KubeVersion, TalosVersion};

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  medea seed --cluster home --talosconfig ~/.talos/config \\\n    --kubeconfig ~/.kube/config --store /var/lib/medea/store \\\n    --creds-dir /var/lib/medea/creds > clusters/home.yaml\n  medea seed --cluster home --talosconfig ./sim/talosconfig \\\n    --kubeconfig ./sim/kubeconfig \\\n    --store ./state/store --creds-dir ./state/creds --force\n  medea seed --cluster home --talosconfig ./sim/talosconfig \\\n    --kubeconfig ./sim/kubeconfig \\\n    --store etcd://10.0.0.5:2379/medea --creds-dir /var/lib/medea/creds\n\nThe desired-state YAML goes to stdout, everything else to stderr. Stop `medea serve` first (a store directory is locked while it runs; an etcd:// store is not)."
)]
pub struct SeedArgs {
    /// The cluster's name in medea (a DNS label; the `metadata.name` of its Cluster).
    #[arg(long)]
    pub cluster: String,
    /// The cluster's talosconfig (its current context is used and copied).
    #[arg(long, value_name = "FILE")]
    pub talosconfig: PathBuf,
    /// The cluster's kubeconfig (its current context is used; certificates and keys must be
    /// embedded: `kubectl config view --raw --flatten --minify`).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: PathBuf,
    /// The store: a directory (`medea serve` must be stopped, it holds the store's lock), or
    /// the replicas' etcd cluster, etcd://host:2379[,host2:2379…][/prefix] (servers may run).
    #[arg(long, value_name = "PATH|URL", env = "MEDEA_STORE")]
    pub store: crate::store::location::StoreLocation,
    #[command(flatten)]
    pub etcd: super::ha::EtcdArgs,
    /// Credentials directory: the files are copied to <DIR>/<cluster>/{talosconfig,kubeconfig}
    /// (0600 files in 0700 directories), where `medea serve --creds-dir` finds them.
    #[arg(long, value_name = "DIR")]
    pub creds_dir: PathBuf,
    /// Re-seed a cluster that already has a record: refresh its observation and replace its
    /// credentials (rolloutsEnabled is kept).
    #[arg(long)]
    pub force: bool,
    /// Signatures any plan of this cluster needs (written in the YAML, and in force from the
    /// start when the cluster has no applied settings yet).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub approvals_required: u32,
    /// Signatures a plan that touches control-plane nodes or Kubernetes needs (at least
    /// --approvals-required). One person running a cluster alone: 1.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub approvals_control_plane: u32,
}

/// Why seeding failed. Nothing is written unless the whole seed succeeds.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum SeedError {
    #[error(
        "cluster name `{name}` is not a DNS label (1-63 lowercase letters, digits and `-`, not starting or ending with `-`)"
    )]
    BadName { name: String },
    #[error("cannot open the store")]
    Store(#[source] StoreError),
    #[error(
        "cluster `{cluster}` is already seeded (generation {generation}); re-run with --force to refresh its observation and replace its credentials (rolloutsEnabled stays {rollouts})"
    )]
    #[diagnostic(help(
        "`--force` keeps rolloutsEnabled and moves the generation only if something changed"
    ))]
    Exists {
        cluster: String,
        generation: u64,
        rollouts: bool,
    },
    #[error("cannot use the talosconfig `{path}`")]
    Talosconfig {
        path: PathBuf,
        #[source]
        err: Box<TalosError>,
    },
    #[error("cannot use the kubeconfig `{path}`")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        err: Box<K8sError>,
    },
    #[error(
        "kubeconfig `{path}` refers to other files ({fields}); medea copies only the kubeconfig, so embed them: `kubectl config view --raw --flatten --minify > kubeconfig`"
    )]
    KubeconfigFiles { path: PathBuf, fields: String },
    #[error("cannot read `{path}`")]
    Read {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("cannot discover cluster `{cluster}`")]
    Discover {
        cluster: String,
        #[source]
        err: Box<RefreshError>,
    },
    #[error("cannot write the credentials file `{path}`")]
    WriteCreds {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("cannot write the record of cluster `{cluster}`")]
    Commit {
        cluster: String,
        #[source]
        err: StoreError,
    },
}

/// What to seed.
#[derive(Debug, Clone)]
pub struct SeedRequest {
    pub cluster: String,
    pub talosconfig: PathBuf,
    pub kubeconfig: PathBuf,
    pub creds_dir: PathBuf,
    pub force: bool,
    pub settings: RefreshSettings,
    /// The approval bar written in the YAML (and recorded as applied).
    pub approvals: crate::desired::model::ApprovalSettings,
    /// Record the printed YAML as the cluster's last-applied state where none is recorded
    /// (`medea seed` does; the demo, whose desired state is its own example files, does not).
    pub record_as_applied: bool,
}

/// What seeding did.
#[derive(Debug, Clone)]
pub struct Seeded {
    /// The record as written.
    pub cluster: ObservedCluster,
    /// Whether a record existed before (`--force`).
    pub reseeded: bool,
    /// Where the credentials were copied.
    pub creds: ClusterCreds,
    /// Desired-state YAML matching what was found.
    pub desired_yaml: String,
    /// Things the operator should look at (unreachable nodes, unknown versions...).
    pub warnings: Vec<String>,
}

use crate::desired::validate::is_dns_label;

/// The kubeconfig fields that point at other files (which a copy would leave behind).
fn kubeconfig_file_refs(path: &Path) -> Result<Vec<&'static str>, SeedError> {
    let kc = crate::k8s::kubeconfig::read(path).map_err(|err| SeedError::Kubeconfig {
        path: path.to_path_buf(),
        err: Box::new(err),
    })?;
    let mut fields = Vec::new();
    if kc
        .clusters
        .iter()
        .filter_map(|c| c.cluster.as_ref())
        .any(|c| c.certificate_authority.is_some())
    {
        fields.push("certificate-authority");
    }
    let users: Vec<_> = kc
        .auth_infos
        .iter()
        .filter_map(|a| a.auth_info.as_ref())
        .collect();
    if users.iter().any(|u| u.client_certificate.is_some()) {
        fields.push("client-certificate");
    }
    if users.iter().any(|u| u.client_key.is_some()) {
        fields.push("client-key");
    }
    if users.iter().any(|u| u.token_file.is_some()) {
        fields.push("tokenFile");
    }
    Ok(fields)
}

/// Seed a cluster into `store` (see the module docs). Order: check the name and the existing
/// record, read and check both files, discover the cluster, write the credentials, commit the
/// record (compare-and-swap); credentials written for a record that then fails to commit are
/// removed again when they did not exist before.
pub async fn seed(store: &dyn Store, req: &SeedRequest) -> Result<Seeded, SeedError> {
    let name = req.cluster.as_str();
    if !is_dns_label(name) {
        return Err(SeedError::BadName {
            name: name.to_string(),
        });
    }
    let key = cluster_key(name);
    let existing = store
        .get(Table::Inventory, &key)
        .map_err(SeedError::Store)?;
    let previous = match &existing {
        Some(raw) => Some(record::decode::<ObservedCluster>(&key, raw).map_err(SeedError::Store)?),
        None => None,
    };
    if let Some(p) = &previous
        && !req.force
    {
        return Err(SeedError::Exists {
            cluster: name.to_string(),
            generation: p.generation,
            rollouts: p.rollouts_enabled,
        });
    }
    let read = |path: &Path| {
        std::fs::read(path).map_err(|err| SeedError::Read {
            path: path.to_path_buf(),
            err,
        })
    };
    let talos_bytes = read(&req.talosconfig)?;
    let kube_bytes = read(&req.kubeconfig)?;
    let refs = kubeconfig_file_refs(&req.kubeconfig)?;
    if !refs.is_empty() {
        return Err(SeedError::KubeconfigFiles {
            path: req.kubeconfig.clone(),
            fields: refs.join(", "),
        });
    }
    let (talos, _) = TalosClient::from_talosconfig(&req.talosconfig, None, req.settings.talos)
        .map_err(|err| SeedError::Talosconfig {
            path: req.talosconfig.clone(),
            err: Box::new(err),
        })?;
    let kube: KubeClient =
        KubeClient::from_kubeconfig(&req.kubeconfig, ClientOptions::clone(&req.settings.kube))
            .await
            .map_err(|err| SeedError::Kubeconfig {
                path: req.kubeconfig.clone(),
                err: Box::new(err),
            })?;
    let files = crate::ops::preflight::CredentialFiles {
        talosconfig: &req.talosconfig,
        kubeconfig: &req.kubeconfig,
    };
    let observation = refresh::observe_with_credentials(&talos, &kube, name, Some(files))
        .await
        .map_err(|err| SeedError::Discover {
            cluster: name.to_string(),
            err: Box::new(err),
        })?;
    let base = previous
        .clone()
        .unwrap_or_else(|| ObservedCluster::new(name));
    let cluster = base.observe_with(
        observation.kubernetes_version,
        observation.machines,
        observation.preflight,
    );

    let creds = ClusterCreds::new(&req.creds_dir, name);
    let write_err = |path: &Path| {
        let path = path.to_path_buf();
        move |err| SeedError::WriteCreds { path, err }
    };
    private_dir(&req.creds_dir).map_err(write_err(&req.creds_dir))?;
    let new_files: Vec<PathBuf> = [&creds.talosconfig, &creds.kubeconfig]
        .into_iter()
        .filter(|p| !p.exists())
        .cloned()
        .collect();
    let remove_new = || {
        for p in &new_files {
            let _ = std::fs::remove_file(p);
        }
    };
    for (path, bytes) in [
        (&creds.talosconfig, &talos_bytes),
        (&creds.kubeconfig, &kube_bytes),
    ] {
        if let Err(err) = write_private(path, bytes) {
            remove_new();
            return Err(write_err(path)(err));
        }
    }
    let check = match existing {
        Some(raw) => Check::Equals(Table::Inventory, key.clone(), raw),
        None => Check::Absent(Table::Inventory, key.clone()),
    };
    let (desired_yaml, mut warnings) = desired_yaml(&cluster, &req.approvals);
    let mut txn = Txn::new().check(check).put_record(key, &cluster);
    let applied = if req.record_as_applied {
        seeded_as_applied(store, name, &desired_yaml)?
    } else {
        Vec::new()
    };
    for r in applied {
        // Only where nothing was applied yet (and still nothing is at commit): a re-seed never
        // replaces settings an approved plan put in force, such as the approval bar.
        let k = r.key.store_key();
        txn = txn
            .check(Check::Absent(Table::Desired, k.clone()))
            .put_record(k, &r);
    }
    if let Err(err) = store.commit(txn) {
        remove_new();
        return Err(SeedError::Commit {
            cluster: name.to_string(),
            err,
        });
    }
    for m in cluster.machines.values().filter(|m| !m.reachable) {
        warnings.insert(
            0,
            format!(
                "machine `{}` ({}) did not answer the Talos API: its Talos version is unknown, and plans that touch its pool are refused until it does",
                m.node, m.address
            ),
        );
    }
    Ok(Seeded {
        reseeded: previous.is_some(),
        cluster,
        creds,
        desired_yaml,
        warnings,
    })
}

/// The Cluster and pools of the YAML seed prints, as last-applied records, for each resource
/// the store has no last-applied record of yet: committing seed's output as it is then plans
/// no change at all, and the first version bump diffs one line. The records name
/// `<cluster>.yaml` as their file (seed's output goes to stdout; the name is only shown).
fn seeded_as_applied(
    store: &dyn Store,
    cluster: &str,
    yaml: &str,
) -> Result<Vec<crate::plan::applied::AppliedResource>, SeedError> {
    use crate::desired::source::{Snapshot, SourceFile};
    use crate::plan::applied::AppliedResource;
    let loaded = crate::desired::parse_snapshot(Snapshot {
        files: vec![SourceFile {
            path: format!("{cluster}.yaml"),
            bytes: yaml.as_bytes().into(),
        }],
        markers: Vec::new(),
        commit: None,
        refused: Vec::new(),
    });
    let Some(c) = loaded.desired.clusters.get(cluster) else {
        // seed's own YAML always parses (a unit test says so); nothing is recorded otherwise.
        return Ok(Vec::new());
    };
    let mut out = vec![AppliedResource::of_cluster(c)];
    out.extend(c.pools.values().map(|p| AppliedResource::of_pool(p)));
    let mut fresh = Vec::new();
    for r in out {
        if store
            .get(Table::Desired, &r.key.store_key())
            .map_err(SeedError::Store)?
            .is_none()
        {
            fresh.push(r);
        }
    }
    Ok(fresh)
}

/// The installer image repository (no tag, no digest) of an observed installer image.
fn installer_repository(image: &str) -> Option<String> {
    let no_digest = image.split('@').next().unwrap_or(image);
    let last = no_digest.rsplit('/').next().unwrap_or(no_digest);
    let repo = match last.rfind(':') {
        Some(i) => &no_digest[..no_digest.len() - last.len() + i],
        None => no_digest,
    };
    InstallerImage::parse(repo).ok().map(|r| r.to_string())
}

/// The `installerImage` seed writes for a machine installed from `image`: its repository,
/// except `ghcr.io/siderolabs/installer`, which is published up to Talos 1.13 only: a pool that
/// names it could never go to 1.14. Seed writes none instead, so the pool gets that default below
/// 1.14 and each machine's own Image Factory installer from 1.14 (`plan::compute`).
fn seeded_installer(image: &str) -> Option<String> {
    installer_repository(image).filter(|r| r != DEFAULT_INSTALLER)
}

/// One pool the seeded YAML declares.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SeedPool {
    name: String,
    role: MachineRole,
    talos: TalosVersion,
    installer: Option<String>,
    machines: Vec<String>,
}

/// Pools by role: one `controlplane` and one `workers` pool when every machine of the role
/// runs the same Talos version and installer; otherwise one pool per (version, installer),
/// the largest first, named `workers`, `workers-2`, ... Machines whose version is unknown join
/// the role's first pool.
fn pools(c: &ObservedCluster, warnings: &mut Vec<String>) -> Vec<SeedPool> {
    let mut out = Vec::new();
    for (role, base) in [
        (MachineRole::Controlplane, "controlplane"),
        (MachineRole::Worker, "workers"),
    ] {
        let machines: Vec<&Machine> = c.machines.values().filter(|m| m.role == role).collect();
        let mut groups: BTreeMap<(TalosVersion, Option<String>), Vec<String>> = BTreeMap::new();
        let mut unknown = Vec::new();
        for m in &machines {
            match &m.talos_version {
                Some(v) => groups
                    .entry((
                        v.clone(),
                        m.installer_image.as_deref().and_then(seeded_installer),
                    ))
                    .or_default()
                    .push(m.node.clone()),
                None => unknown.push(m.node.clone()),
            }
        }
        let mut groups: Vec<_> = groups.into_iter().collect();
        // Largest group first; ties: newest version first.
        groups.sort_by(|(ka, a), (kb, b)| b.len().cmp(&a.len()).then(kb.0.cmp(&ka.0)));
        if groups.is_empty() {
            if !unknown.is_empty() {
                warnings.push(format!(
                    "no {base} machine answered the Talos API ({}): no pool is written for them",
                    unknown.join(", ")
                ));
            }
            continue;
        }
        if groups.len() > 1 {
            warnings.push(format!(
                "{base} machines run different Talos versions or installers: written as {} pools",
                groups.len()
            ));
        }
        for (i, ((talos, installer), mut members)) in groups.into_iter().enumerate() {
            if i == 0 {
                members.append(&mut unknown);
                members.sort();
            }
            out.push(SeedPool {
                name: if i == 0 {
                    base.to_string()
                } else {
                    format!("{base}-{}", i + 1)
                },
                role,
                talos,
                installer,
                machines: members,
            });
        }
    }
    out
}

/// The approval bar seed writes, explained.
fn approvals_block(a: &crate::desired::model::ApprovalSettings) -> String {
    format!(
        "  # Signatures (`medea approve`) a plan needs before it acts: `required` for
  # any change, `controlPlane` when it touches control-plane nodes or Kubernetes.
  # Changing them needs the higher of the two in force. One person running a
  # cluster alone seeds it with `--approvals-control-plane 1`.
  approvals:
    required: {}
    controlPlane: {}
",
        a.required, a.control_plane
    )
}

/// Desired-state YAML (a Cluster and its pools) that matches the observed cluster: committed
/// as-is, its plan has no rollout steps. Pure. Returns the YAML and warnings.
pub fn desired_yaml(
    c: &ObservedCluster,
    approvals: &crate::desired::model::ApprovalSettings,
) -> (String, Vec<String>) {
    let mut warnings = Vec::new();
    let kubernetes: Option<KubeVersion> = c.kubernetes_version.clone().or_else(|| {
        let lowest = c
            .machines
            .values()
            .filter_map(|m| m.kubelet_version.clone())
            .min();
        if let Some(v) = &lowest {
            warnings.push(format!(
                "no kube-apiserver version was observed; the Cluster uses the lowest kubelet version ({v})"
            ));
        }
        lowest
    });
    let mut y = String::new();
    y.push_str(&format!(
        "# Generated by `medea seed` from cluster `{}` as observed (generation {}).\n# Committed as-is it plans no change (seed recorded it as applied); change a version to plan one.\n",
        c.name, c.generation
    ));
    y.push_str("apiVersion: medea/v1alpha1\nkind: Cluster\nmetadata:\n");
    y.push_str(&format!("  name: {}\nspec:\n  kubernetes:\n", c.name));
    match &kubernetes {
        Some(v) => y.push_str(&format!("    version: {v}\n")),
        None => {
            warnings.push(
                "no Kubernetes version was observed: set `spec.kubernetes.version` by hand".into(),
            );
            y.push_str("    version: \"\" # unknown: set the version the cluster runs\n");
        }
    }
    // The defaults, written out so that nobody wonders why a plan needs two signatures.
    y.push_str(&approvals_block(approvals));
    for p in pools(c, &mut warnings) {
        y.push_str("---\napiVersion: medea/v1alpha1\nkind: NodePool\nmetadata:\n");
        y.push_str(&format!(
            "  name: {}\nspec:\n  cluster: {}\n",
            p.name, c.name
        ));
        let role = match p.role {
            MachineRole::Controlplane => "controlplane",
            MachineRole::Worker => "worker",
        };
        y.push_str(&format!("  role: {role}\n"));
        y.push_str(&format!("  machines: [{}]\n", p.machines.join(", ")));
        y.push_str(&format!("  talos:\n    version: {}\n", p.talos));
        match &p.installer {
            Some(installer) => y.push_str(&format!("    installerImage: {installer}\n")),
            None => y.push_str(&format!(
                "    # no installer named: {DEFAULT_INSTALLER} up to Talos 1.13, then each\n    # machine's own Image Factory installer (ghcr publishes no 1.14 installer)\n"
            )),
        }
    }
    (y, warnings)
}

pub fn run(args: SeedArgs) -> miette::Result<u8> {
    if args.approvals_control_plane < args.approvals_required {
        return Err(miette::miette!(
            help = "plans that touch control-plane nodes or Kubernetes need at least as many signers as any other plan",
            "--approvals-control-plane ({}) is lower than --approvals-required ({})",
            args.approvals_control_plane,
            args.approvals_required
        ));
    }
    let store: std::sync::Arc<dyn Store> = match &args.store {
        crate::store::location::StoreLocation::Dir(path) => {
            super::ha::open_etcd_client(&args.store, &args.etcd)?;
            std::sync::Arc::new(super::store::open_dir(path, "seed again")?)
        }
        crate::store::location::StoreLocation::Etcd(_) => {
            super::ha::open_etcd_client(&args.store, &args.etcd)?
                .ok_or_else(|| miette::miette!("`{}` is not an etcd store", args.store))?
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .into_diagnostic()
        .wrap_err("failed to start the async runtime")?;
    let req = SeedRequest {
        cluster: args.cluster,
        talosconfig: args.talosconfig,
        kubeconfig: args.kubeconfig,
        creds_dir: args.creds_dir,
        force: args.force,
        settings: RefreshSettings::default(),
        approvals: crate::desired::model::ApprovalSettings {
            required: args.approvals_required,
            control_plane: args.approvals_control_plane,
        },
        record_as_applied: true,
    };
    let seeded = rt
        .block_on(seed(store.as_ref(), &req))
        // The report keeps the cause chain (one line per cause) and `Exists`'s help.
        .map_err(miette::Report::new)?;
    let c = &seeded.cluster;
    let cps = c
        .machines
        .values()
        .filter(|m| m.role == MachineRole::Controlplane)
        .count();
    let unreachable = c.machines.values().filter(|m| !m.reachable).count();
    eprintln!(
        "{} cluster `{}`: {} machines ({} control planes, {} workers{}), Kubernetes {}, generation {}",
        if seeded.reseeded {
            "re-seeded"
        } else {
            "seeded"
        },
        c.name,
        c.machines.len(),
        cps,
        c.machines.len() - cps,
        if unreachable > 0 {
            format!(", {unreachable} unreachable")
        } else {
            String::new()
        },
        c.kubernetes_version
            .as_ref()
            .map_or_else(|| "unknown".to_string(), |v| v.to_string()),
        c.generation
    );
    eprintln!(
        "credentials: {} and {} (0600)",
        seeded.creds.talosconfig.display(),
        seeded.creds.kubeconfig.display()
    );
    if c.rollouts_enabled {
        eprintln!("rollouts: enabled (kept)");
    } else {
        eprintln!(
            "rollouts: disabled; enable them with `medea cluster enable-rollouts {}`",
            c.name
        );
    }
    for w in &seeded.warnings {
        eprintln!("warning: {w}");
    }
    out!("{}", seeded.desired_yaml);
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(
        node: &str,
        role: MachineRole,
        talos: Option<&str>,
        installer: Option<&str>,
    ) -> Machine {
        Machine {
            node: node.into(),
            id: node.into(),
            address: "10.0.0.1".into(),
            role,
            talos_version: talos.map(|t| TalosVersion::parse(t).unwrap()),
            installer_image: installer.map(str::to_string),
            schematic: None,
            platform: None,
            secure_boot: None,
            factory_host: None,
            extensions: BTreeMap::new(),
            kubelet_version: Some(KubeVersion::parse("v1.34.1").unwrap()),
            ready: true,
            cordoned: false,
            reachable: talos.is_some(),
            boot_id: None,
            labels: BTreeMap::new(),
        }
    }

    fn cluster(machines: Vec<Machine>) -> ObservedCluster {
        ObservedCluster::new("home").observe(
            Some(KubeVersion::parse("v1.34.1").unwrap()),
            machines.into_iter().map(|m| (m.node.clone(), m)).collect(),
        )
    }

    #[test]
    fn installer_repositories_drop_tags_and_digests() {
        assert_eq!(
            installer_repository("ghcr.io/siderolabs/installer:v1.12.11").as_deref(),
            Some("ghcr.io/siderolabs/installer")
        );
        assert_eq!(
            installer_repository("registry.local:5000/installer:v1.12.11").as_deref(),
            Some("registry.local:5000/installer")
        );
        assert_eq!(
            installer_repository("registry.local:5000/installer").as_deref(),
            Some("registry.local:5000/installer")
        );
        assert_eq!(
            installer_repository("ghcr.io/siderolabs/installer@sha256:abc").as_deref(),
            Some("ghcr.io/siderolabs/installer")
        );
        assert_eq!(installer_repository("NOT VALID"), None);
    }

    #[test]
    fn mixed_pools_are_split_and_unknown_machines_join_the_first() {
        use MachineRole::*;
        let factory = "factory.talos.dev/installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";
        let c = cluster(vec![
            machine("cp-1", Controlplane, Some("v1.12.11"), None),
            machine("w-1", Worker, Some("v1.12.11"), None),
            machine("w-2", Worker, Some("v1.12.11"), None),
            machine(
                "w-3",
                Worker,
                Some("v1.13.9"),
                Some(&format!("{factory}:v1.13.9")),
            ),
            machine("w-4", Worker, None, None),
        ]);
        let mut warnings = Vec::new();
        let p = pools(&c, &mut warnings);
        let summary: Vec<(String, String, Option<String>, Vec<String>)> = p
            .iter()
            .map(|p| {
                (
                    p.name.clone(),
                    p.talos.to_string(),
                    p.installer.clone(),
                    p.machines.clone(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                (
                    "controlplane".into(),
                    "v1.12.11".into(),
                    None,
                    vec!["cp-1".to_string()]
                ),
                (
                    "workers".into(),
                    "v1.12.11".into(),
                    None,
                    vec!["w-1".to_string(), "w-2".into(), "w-4".into()]
                ),
                (
                    "workers-2".into(),
                    "v1.13.9".into(),
                    Some(factory.to_string()),
                    vec!["w-3".to_string()]
                ),
            ]
        );
        assert!(
            warnings.iter().any(|w| w.contains("2 pools")),
            "{warnings:?}"
        );
        let (yaml, _) = desired_yaml(&c, &Default::default());
        assert!(
            yaml.contains(&format!("    installerImage: {factory}\n")),
            "{yaml}"
        );
        assert!(yaml.contains("  machines: [w-1, w-2, w-4]\n"), "{yaml}");
    }

    #[test]
    fn a_cluster_installed_from_ghcr_is_seeded_without_an_installer() {
        use MachineRole::*;
        // talosctl <= 1.13 wrote ghcr.io/siderolabs/installer into every machine config
        let ghcr = "ghcr.io/siderolabs/installer:v1.13.10";
        let c = cluster(vec![
            machine("cp-1", Controlplane, Some("v1.13.10"), Some(ghcr)),
            machine("w-1", Worker, Some("v1.13.10"), Some(ghcr)),
            machine("w-2", Worker, Some("v1.13.10"), None),
        ]);
        let (yaml, warnings) = desired_yaml(&c, &Default::default());
        assert!(!yaml.contains("installerImage"), "{yaml}");
        assert!(
            yaml.contains(
                "    # no installer named: ghcr.io/siderolabs/installer up to Talos 1.13"
            ),
            "{yaml}"
        );
        // one pool per role: the machine without an observed installer is not split off
        assert!(yaml.contains("  machines: [w-1, w-2]\n"), "{yaml}");
        assert!(warnings.is_empty(), "{warnings:?}");
        // a private mirror is kept as written
        let c = cluster(vec![machine(
            "cp-1",
            Controlplane,
            Some("v1.13.10"),
            Some("registry.local:5000/siderolabs/installer:v1.13.10"),
        )]);
        let (yaml, _) = desired_yaml(&c, &Default::default());
        assert!(
            yaml.contains("    installerImage: registry.local:5000/siderolabs/installer\n"),
            "{yaml}"
        );
    }

    #[test]
    fn cluster_names_must_be_dns_labels() {
        for bad in ["", "Home", "-a", "a-", "a/b", "..", "a.b"] {
            assert!(!is_dns_label(bad), "{bad}");
        }
        assert!(is_dns_label("home-2"));
    }
}
