//! `medea upgrade`: the talosctl habit, kept GitOps-true — edit the version in the desired-state
//! YAML in place, then show the plan. Nothing acts without an approval.

use miette::{IntoDiagnostic as _, WrapErr as _};
use std::path::{Path, PathBuf};

use clap::Args;

use super::desired::DesiredArgs;
use super::exit;
use crate::desired::{self, Source, edit};
use crate::version::{KubeVersion, TalosVersion};

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  medea upgrade --desired ./clusters --cluster prod --talos v1.13.9\n  medea upgrade --desired ./clusters --cluster prod --pool canary \\\n    --talos v1.13.9\n  medea upgrade --desired ./clusters --cluster home --k8s v1.35.0\n\nExit status: 0 when the edit was made (or the file already said so), whatever the plan it shows; 1 when it edits nothing (invalid input or desired state, an unknown cluster or pool) or the edited desired state cannot be planned (the edit stays on disk: read the errors). Unlike `medea plan`, a plan with changes is not status 2: the edit is what succeeded."
)]
pub struct UpgradeArgs {
    #[command(flatten)]
    pub desired: DesiredArgs,
    /// The cluster whose desired state to change.
    #[arg(long)]
    pub cluster: String,
    /// Only this pool (default: every pool of the cluster). Only with --talos.
    #[arg(long, requires = "talos")]
    pub pool: Option<String>,
    /// New Talos version for the pool(s).
    #[arg(long, conflicts_with = "k8s", required_unless_present = "k8s")]
    pub talos: Option<String>,
    /// New Kubernetes version for the cluster.
    #[arg(long)]
    pub k8s: Option<String>,
    /// Print the resulting plan computed offline against this store (not stored: a preview).
    /// Without it, the plan comes from the running server once it has picked the edit up.
    #[arg(long, value_name = "PATH")]
    pub store: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub client: super::client::ClientArgs,
}

/// One edit: file, old value, new value.
#[derive(Debug)]
struct Edit {
    file: String,
    origin: desired::Origin,
    old: String,
    new: String,
}

pub fn upgrade(args: UpgradeArgs) -> miette::Result<u8> {
    let source = args.desired.source(None, None)?;
    let root = match &source {
        Source::Dir(p) | Source::Git { path: p, .. } => p.clone(),
    };
    // Edits go to the files on disk; in git mode read the work tree, then remind to commit.
    let loaded = super::desired::load(&Source::Dir(root.clone()))?;
    if loaded.has_errors() {
        super::report::print_diagnostics(&loaded, &root.display().to_string());
        return Err(miette::miette!(
            help = "fix these first: medea upgrade edits only valid desired state",
            "the desired state in {} is invalid",
            root.display()
        ));
    }
    let d = &loaded.desired;
    let cluster = d.clusters.get(&args.cluster).ok_or_else(|| {
        miette::miette!(
            help = format!(
                "clusters: {}",
                d.clusters.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
            "cluster `{}` is not in the desired state",
            args.cluster
        )
    })?;
    let mut edits = Vec::new();
    if let Some(v) = &args.k8s {
        let v = KubeVersion::parse(v).into_diagnostic()?;
        let cur = &cluster.kubernetes_version;
        if cur.value != v {
            edits.push(Edit {
                file: cur.origin.file.clone(),
                origin: cur.origin.clone(),
                old: cur.value.to_string(),
                new: v.to_string(),
            });
        }
    }
    if let Some(v) = &args.talos {
        let v = TalosVersion::parse(v).into_diagnostic()?;
        let pools: Vec<_> = match &args.pool {
            Some(p) => vec![cluster.pools.get(p).ok_or_else(|| {
                miette::miette!(
                    help = format!(
                        "pools of {}: {}",
                        args.cluster,
                        cluster.pools.keys().cloned().collect::<Vec<_>>().join(", ")
                    ),
                    "pool `{p}` is not in cluster `{}`",
                    args.cluster
                )
            })?],
            None => cluster.pools.values().collect(),
        };
        for p in pools {
            let cur = &p.talos_version;
            if cur.value != v {
                edits.push(Edit {
                    file: cur.origin.file.clone(),
                    origin: cur.origin.clone(),
                    old: cur.value.to_string(),
                    new: v.to_string(),
                });
            }
        }
    }
    if edits.is_empty() {
        outln!("nothing to edit: the desired state already says that");
        return Ok(exit::OK);
    }
    // Apply edits file by file, from the end of the file backwards so offsets stay valid.
    edits.sort_by(|a, b| {
        a.file
            .cmp(&b.file)
            .then(b.origin.offset.cmp(&a.origin.offset))
    });
    let mut files: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
    for e in &edits {
        let text = files
            .entry(e.file.clone())
            .or_insert_with(|| loaded.sources[&e.file].to_string());
        *text = edit::replace_scalar(text, &e.origin, &e.old, &e.new).into_diagnostic()?;
    }
    for (file, text) in &files {
        let path: PathBuf = root.join(file);
        std::fs::write(&path, text)
            .into_diagnostic()
            .wrap_err_with(|| format!("cannot write {}", path.display()))?;
    }
    for e in edits.iter().rev() {
        outln!(
            "{}:{}:{}: {} → {}",
            e.file,
            e.origin.line,
            e.origin.column,
            e.old,
            e.new
        );
    }
    let after = super::desired::load(&Source::Dir(root.clone()))?;
    if after.has_errors() {
        super::report::print_diagnostics(&after, &root.display().to_string());
        return Ok(exit::ERROR);
    }
    let changed: Vec<&str> = files.keys().map(String::as_str).collect();
    if matches!(source, Source::Git { .. }) {
        outln!("{}", commit_hint(&root, &changed, &args, None));
        return Ok(preview_or_note(&args, &after, &root));
    }
    print_plan(&args, &after, &root, &changed)
}

/// The work tree of the git repository `path` is in, if any.
fn enclosing_work_tree(path: &Path) -> Option<PathBuf> {
    let p = path.canonicalize().ok()?;
    p.ancestors()
        .find(|a| a.join(".git").exists())
        .map(Path::to_path_buf)
}

/// What to run next when the edit only counts once committed: the exact commands.
fn commit_hint(root: &Path, changed: &[&str], args: &UpgradeArgs, git_ref: Option<&str>) -> String {
    let what = match (&args.talos, &args.k8s) {
        (Some(v), _) => format!("Talos {v}"),
        (None, Some(v)) => format!("Kubernetes {v}"),
        (None, None) => "versions".to_string(),
    };
    let files = changed
        .iter()
        .map(|f| shell_quote(&root.join(f).display().to_string()))
        .collect::<Vec<_>>()
        .join(" ");
    let work_tree = enclosing_work_tree(root).unwrap_or_else(|| root.to_path_buf());
    let wt = shell_quote(&work_tree.display().to_string());
    let server = match git_ref {
        Some(r) => format!("the server plans commits of `{r}` only"),
        None => "in git mode medea plans commits only".to_string(),
    };
    format!(
        "edited the work tree; {server}: commit it (and push it where the server fetches)\n  git -C {wt} add {files} && git -C {wt} commit -m {}",
        shell_quote(&format!("upgrade {} to {what}", args.cluster))
    )
}

/// [`preview_from_server`] after a commit hint: the hint is the answer (exit 0), the preview a
/// help, so a server that cannot answer is a note on stderr, not a failure.
fn preview_or_note(args: &UpgradeArgs, after: &crate::desired::Loaded, root: &Path) -> u8 {
    if let Err(e) = preview_from_server(args, after, root) {
        eprintln!("(no preview of the plan: {e})");
    }
    exit::OK
}

/// Ask the running server for the plan the edited tree would make (`PreviewPlan`: computed
/// against its observations and applied state, never stored, never approvable) and print it.
fn preview_from_server(
    args: &UpgradeArgs,
    after: &crate::desired::Loaded,
    root: &Path,
) -> miette::Result<u8> {
    use crate::api::pb;
    let files: Vec<pb::DesiredFile> = after
        .sources
        .iter()
        .map(|(path, text)| pb::DesiredFile {
            path: path.clone(),
            content: text.as_bytes().to_vec(),
        })
        .collect();
    let rt = tokio::runtime::Runtime::new()
        .into_diagnostic()
        .wrap_err("cannot start the runtime")?;
    let r = rt.block_on(async {
        let mut c = args.client.connect().await?;
        c.preview_plan(pb::PreviewPlanRequest { files })
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| super::client::rpc_error(&args.client.addr(), s))
    })?;
    if !r.diagnostics.is_empty() {
        for d in &r.diagnostics {
            eprintln!("{}", d.rendered);
        }
        eprintln!(
            "the server cannot plan the edited desired state in {}",
            root.display()
        );
        return Ok(exit::ERROR);
    }
    outln!();
    outln!(
        "Preview (computed by the server, not stored, not approvable) of plan {}:",
        r.short_id
    );
    out!("{}", r.rendered);
    Ok(exit::OK)
}

/// `s` as one POSIX shell word.
fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+=:@,".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The plan of the edited desired state: offline against `--store`, or the server's. A server
/// that follows a git ref, or reads another directory, never plans this edit: the user is told
/// what to do at once instead of waiting for it.
fn print_plan(
    args: &UpgradeArgs,
    after: &crate::desired::Loaded,
    root: &Path,
    changed: &[&str],
) -> miette::Result<u8> {
    if let Some(path) = &args.store {
        let store = match crate::store::fjall::FjallStore::open(path) {
            Ok(s) => s,
            // The running server holds the store: it computes the preview instead.
            Err(crate::store::StoreError::Locked { .. }) => {
                eprintln!(
                    "the store at {} is in use by the running server: asking it for the preview",
                    path.display()
                );
                return preview_from_server(args, after, root);
            }
            Err(e) => return Err(e).into_diagnostic(),
        };
        let inventory = crate::inventory::Inventory::load(&store).into_diagnostic()?;
        let applied = crate::ops::replan::load_applied(&store).into_diagnostic()?;
        return match crate::plan::compute(&after.desired, &inventory, &applied, None) {
            Ok(p) => {
                outln!();
                out!(
                    "{}",
                    crate::plan::render::text(&p, crate::plan::render::Options { color: false })
                );
                Ok(exit::OK)
            }
            Err(diags) => {
                for d in &diags {
                    eprintln!("{:?}", super::report::report(d, after, ""));
                }
                Ok(exit::ERROR)
            }
        };
    }
    // Ask the server, once it has loaded this revision (its watcher is debounced).
    let want = after.desired.revision.content.clone();
    let rt = tokio::runtime::Runtime::new()
        .into_diagnostic()
        .wrap_err("cannot start the runtime")?;
    enum Server {
        Plan(Box<crate::api::pb::Plan>),
        GitMode(String),
        ReadsElsewhere(String),
        NoAnswer,
    }
    let shown = rt.block_on(async {
        let Ok(mut c) = args.client.connect().await else {
            return Server::NoAnswer;
        };
        if let Ok(info) = c
            .server_info(crate::api::pb::ServerInfoRequest {})
            .await
            .map(|r| r.into_inner())
        {
            if !info.desired_git_ref.is_empty() {
                return Server::GitMode(info.desired_git_ref);
            }
            let same = |a: &str| {
                let a = Path::new(a);
                a == root
                    || a.canonicalize()
                        .ok()
                        .is_some_and(|a| root.canonicalize().ok().is_some_and(|r| a == r))
            };
            if !info.desired_path.is_empty() && !same(&info.desired_path) {
                return Server::ReadsElsewhere(info.desired_path);
            }
        }
        for _ in 0..50 {
            if let Ok(r) = c
                .get_plan(crate::api::pb::GetPlanRequest { id: String::new() })
                .await
                && let Some(p) = r.into_inner().plan
                && p.desired_revision == want
            {
                return Server::Plan(Box::new(p));
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        Server::NoAnswer
    });
    match shown {
        Server::GitMode(r) => {
            outln!("{}", commit_hint(root, changed, args, Some(&r)));
            Ok(preview_or_note(args, after, root))
        }
        Server::ReadsElsewhere(p) => {
            outln!(
                "the server at {} reads its desired state from {p}, not {}: copy the edit there",
                args.client.addr(),
                root.display()
            );
            Ok(preview_or_note(args, after, root))
        }
        Server::Plan(p) => {
            outln!();
            out!("{}", p.rendered);
            Ok(exit::OK)
        }
        Server::NoAnswer => {
            outln!(
                "review the resulting plan with `medea plan` (or `medea upgrade … --store PATH` to preview it offline)"
            );
            Ok(exit::OK)
        }
    }
}
