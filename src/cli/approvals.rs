//! `medea approvals`: every marker's outcome against the current plan, offline.

use miette::IntoDiagnostic as _;
use std::path::PathBuf;

use clap::Args;

use super::desired::{DesiredArgs, display_root};
use super::exit;
use crate::approval;
use crate::ops::replan as stored;

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  medea approvals --desired ./clusters --store /var/lib/medea/store \\\n    --allowed-signers /etc/medea/allowed_signers\n  medea approvals --desired . --git-ref main --store /var/lib/medea/store \\\n    --allowed-signers allowed_signers\n\nExit status: 0 when the current plan has reached quorum, 1 otherwise."
)]
pub struct ApprovalsArgs {
    #[command(flatten)]
    pub desired: DesiredArgs,
    /// The store (stop `medea serve` first: it holds the store's lock).
    #[arg(long, env = "MEDEA_STORE")]
    pub store: PathBuf,
    /// The trust root: the server's allowed_signers file, never one from the repository.
    #[arg(long, env = "MEDEA_ALLOWED_SIGNERS")]
    pub allowed_signers: PathBuf,
}

pub fn run(args: ApprovalsArgs) -> miette::Result<u8> {
    let source = args.desired.source(None, None)?;
    let loaded = super::desired::load(&source)?;
    if super::report::print_diagnostics(&loaded, &display_root(&source)) > 0 {
        return Ok(exit::ERROR);
    }
    let store = super::store::open_dir(
        &args.store,
        "count again, or ask it: `medea plan` shows the approvals it recorded",
    )?;
    // The daemon's reader and policy: a file `medea serve` refuses is refused here too.
    let signers =
        approval::allowed_signers::read(&args.allowed_signers).map_err(miette::Report::from_err)?;
    let desired = loaded
        .valid()
        .ok_or_else(|| miette::miette!("the desired state has errors (listed above)"))?;
    let Some(current) = stored::current(&store).into_diagnostic()? else {
        outln!("no current plan: run `medea plan` first");
        return Ok(exit::ERROR);
    };
    let plan = stored::load_plan(&store, &current.id)
        .into_diagnostic()?
        .ok_or_else(|| miette::miette!("the current plan record is missing"))?;
    let basis = stored::current_basis(&store, desired).into_diagnostic()?;
    if plan.is_stale(&basis) {
        outln!(
            "the stored plan {} is stale (the desired state or an observation changed): run `medea plan` and approve the new id",
            plan.id.short()
        );
        return Ok(exit::ERROR);
    }
    // The daemon's approval status (`ops::approvals::status`): the recorded approvals and the
    // markers, each against the current plan and the plans its file name names.
    let status = crate::ops::approvals::offline_status(
        &store,
        &plan,
        &loaded,
        &signers,
        jiff::Timestamp::now(),
    )
    .into_diagnostic()?;
    outln!(
        "plan {} needs {} approval(s) from distinct people",
        plan.id.short(),
        plan.approvals_required
    );
    if loaded.markers.is_empty() {
        outln!("  no approval markers under approvals/");
    }
    use crate::ops::approvals::Origin;
    for j in &status.judged {
        match j.origin {
            Origin::Marker => outln!("  {}: {}", j.source, j.outcome),
            // A recorded approval shows when no marker of this revision is its source (an
            // API submission, or a marker since removed): it counts all the same.
            Origin::Recorded
                if !status
                    .judged
                    .iter()
                    .any(|m| m.origin == Origin::Marker && m.source == j.source) =>
            {
                outln!("  {} (recorded): {}", j.source, j.outcome)
            }
            _ => {}
        }
    }
    if let Some(why) = &status.refusal {
        outln!("  nothing counts: {why}");
    }
    let status = status.quorum;
    outln!("{status}");
    Ok(if status.reached() {
        exit::OK
    } else {
        exit::ERROR
    })
}
