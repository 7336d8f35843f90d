//! `medea doctor`: argument handling and output (the checklist for people, or `-o json`). The
//! checks themselves and the report are [`crate::ops::doctor`]'s.
//!
//! Exit status 1 when any check fails; warnings do not fail. `-o json` prints the same report.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use miette::{IntoDiagnostic as _, WrapErr as _};

use super::exit;
pub use crate::ops::doctor::{
    Check, ClusterReport, DoctorError, Report, Status, diagnose, diagnose_cluster,
};
use crate::ops::doctor::{ContactUnapproved, SourcesToCheck};
use crate::ops::refresh::RefreshSettings;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  medea doctor --creds-dir /var/lib/medea/creds\n  medea doctor --creds-dir /var/lib/medea/creds --store /var/lib/medea/store \\\n    --desired ./clusters\n  medea doctor --cluster home --creds-dir ./state/creds -o json\n\nExit status: 0 every check passed (warnings allowed), 1 something to fix."
)]
pub struct DoctorArgs {
    /// Check only this cluster (default: every <creds-dir>/<cluster>/ with both files).
    #[arg(long)]
    pub cluster: Option<String>,
    /// Credentials directory: <DIR>/<cluster>/{talosconfig,kubeconfig} (what `medea seed` writes).
    #[arg(long, value_name = "DIR")]
    pub creds_dir: PathBuf,
    /// Desired-state directory: list the Prometheus and Alertmanager sources its Clusters'
    /// `health` blocks name that the last-applied state (--store) does not: they are not
    /// contacted (see --contact-unapproved); with --observed, also show the preflight findings
    /// of its plan (the same findings `medea plan --observed` shows).
    #[arg(long, value_name = "DIR")]
    pub desired: Option<PathBuf>,
    /// The store of `medea serve` (stopped: it holds the store's lock): every health source of
    /// its last-applied state answers a trivial question (`vector(1)`, `/api/v2/status`), asked
    /// with the credential it names from <creds-dir>/<cluster>/health/<credential>/.
    #[arg(long, value_name = "DIR")]
    pub store: Option<PathBuf>,
    /// Also ask the sources only the unapproved desired state names (--desired), without any
    /// of medea's credentials.
    #[arg(long, requires = "desired")]
    pub contact_unapproved: bool,
    /// Inventory file (YAML or JSON, with `preflight:` blocks) the findings are computed from.
    #[arg(long, value_name = "FILE", requires = "desired")]
    pub observed: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    pub output: Output,
}

/// The preflight lines of the plan of `desired` against the inventory file `observed`.
fn preflight_lines(
    desired: &std::path::Path,
    observed: &std::path::Path,
) -> miette::Result<Vec<(String, Check)>> {
    let loaded = super::desired::load(&crate::desired::Source::Dir(desired.to_path_buf()))?;
    if loaded.has_errors() {
        return Err(miette::miette!(
            help = "run `medea validate` on it",
            "the desired state at `{}` is not valid",
            desired.display()
        ));
    }
    let text = std::fs::read_to_string(observed)
        .into_diagnostic()
        .wrap_err_with(|| format!("cannot read the inventory file `{}`", observed.display()))?;
    let inventory = crate::inventory::file::parse(&observed.display().to_string(), &text)
        .map_err(miette::Report::from_err)?;
    let plan = match crate::ops::replan::rehearse(None, &loaded.desired, &inventory) {
        Ok(
            crate::ops::replan::Rehearsed::NoStore(p) | crate::ops::replan::Rehearsed::Differs(p),
        ) => p,
        Ok(crate::ops::replan::Rehearsed::Replanned(r)) => r.plan,
        Err(e) => {
            return Err(miette::Report::from_err(e)
                .wrap_err("the desired state cannot be planned against the inventory file"));
        }
    };
    Ok(crate::ops::doctor::preflight_checks(&plan))
}

/// The checklist for people.
pub fn render_text(report: &Report) -> String {
    let mut out = String::new();
    let mut todo = Vec::new();
    for c in &report.clusters {
        out.push_str(&format!("cluster {} ({})\n", c.cluster, c.creds_dir));
        let width = c.checks.iter().map(|k| k.check.len()).max().unwrap_or(0);
        for k in &c.checks {
            let mark = match k.status {
                Status::Pass => "ok  ",
                Status::Warn => "warn",
                Status::Fail => "FAIL",
                Status::Skip => "skip",
            };
            out.push_str(&format!(
                "  {mark}  {:<width$}  {}: {}\n",
                k.check, k.target, k.detail
            ));
            if let (Some(fix), Status::Fail | Status::Warn) = (&k.fix, k.status) {
                todo.push(format!(
                    "  [ ] {}{} {}: {fix}",
                    if k.status == Status::Warn {
                        "(warning) "
                    } else {
                        ""
                    },
                    c.cluster,
                    k.target
                ));
            }
        }
    }
    let count = |s: Status| {
        report
            .clusters
            .iter()
            .flat_map(|c| &c.checks)
            .filter(|k| k.status == s)
            .count()
    };
    out.push_str(&format!(
        "{} passed, {} warnings, {} failed, {} skipped\n",
        count(Status::Pass),
        count(Status::Warn),
        count(Status::Fail),
        count(Status::Skip)
    ));
    if !todo.is_empty() {
        out.push_str("to fix:\n");
        for t in todo {
            out.push_str(&t);
            out.push('\n');
        }
    }
    out
}

pub fn run(args: DoctorArgs) -> miette::Result<u8> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .into_diagnostic()
        .wrap_err("failed to start the async runtime")?;
    let settings = RefreshSettings {
        talos: crate::talos::ClientSettings {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            ..RefreshSettings::default().talos
        },
        ..RefreshSettings::default()
    };
    // Approved sources come from the last-applied state only; the desired state's are listed.
    let applied = match &args.store {
        Some(path) => {
            let store = super::plan::open_store(path)?;
            crate::ops::replan::load_applied(&store).map_err(|e| {
                miette::Report::from_err(e).wrap_err("cannot read the last-applied state")
            })?
        }
        None => crate::plan::LastApplied::default(),
    };
    let mut health: std::collections::BTreeMap<String, SourcesToCheck> = applied
        .cluster_names()
        .into_iter()
        .filter_map(|name| {
            let approved = applied.cluster_settings(&name)?.health.sources.clone();
            (!approved.is_empty()).then_some((
                name,
                SourcesToCheck {
                    approved,
                    desired: None,
                },
            ))
        })
        .collect();
    if let Some(dir) = &args.desired {
        let loaded = crate::desired::load(&crate::desired::Source::Dir(dir.clone()))
            .map_err(miette::Report::from_err)?;
        let Some(desired) = loaded.valid() else {
            return Err(miette::miette!(
                "the desired state in `{}` has errors; `medea validate {}` shows them",
                dir.display(),
                dir.display()
            ));
        };
        for (name, c) in &desired.clusters {
            let sources = crate::plan::health::HealthSources::of(&c.health);
            let entry = health.entry(name.clone()).or_default();
            entry.desired = Some(sources);
        }
        health.retain(|_, s| {
            !s.approved.is_empty() || s.desired.as_ref().is_some_and(|d| !d.is_empty())
        });
    }
    let report = rt
        .block_on(crate::ops::doctor::diagnose_with_health(
            &args.creds_dir,
            args.cluster.as_deref(),
            &settings,
            &health,
            ContactUnapproved(args.contact_unapproved),
        ))
        .map_err(miette::Report::from_err)?;
    let report = match (&args.desired, &args.observed) {
        (Some(d), Some(o)) => report.with_checks(preflight_lines(d, o)?),
        _ => report,
    };
    match args.output {
        Output::Text => out!("{}", render_text(&report)),
        Output::Json => out!("{}", super::output::json(&report)),
    }
    Ok(if report.ok { exit::OK } else { exit::ERROR })
}
