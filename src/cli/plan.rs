//! `medea plan`: compute, store and print a plan, offline (no server), through the daemon's
//! own planning path ([`crate::ops::replan`]); or print the running server's plan.

use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use miette::{IntoDiagnostic, WrapErr};

use super::desired::{DesiredArgs, display_root};
use super::exit;
use crate::ops::replan::{self as ops_replan, Rehearsed, ReplanError, Replanned};
use crate::plan::render;
use crate::store::Store;
use crate::store::fjall::FjallStore;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The desired-state directory (the same as --desired).
    pub dir: Option<PathBuf>,
    #[command(flatten)]
    pub desired: DesiredArgs,
    /// The store directory. It must not be in use: stop `medea serve` first (it holds the
    /// store's lock). The plan and the current-plan pointer are written there.
    #[arg(long, value_name = "PATH", env = "MEDEA_STORE")]
    pub store: Option<PathBuf>,
    /// Plan against this inventory file (YAML or JSON) instead of the store's inventory: a
    /// rehearsal. The plan is stored only if its basis matches the store's.
    #[arg(long, value_name = "FILE")]
    pub observed: Option<PathBuf>,
    /// Output format: text for people, json for programs (schema in design/plan.md).
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    pub output: Output,
    /// After planning, rehearse each cluster's part of the plan on a simulated twin of the
    /// cluster (its nodes and the workload census the refresh stored) and print what it found
    /// after the plan; with --store, the report is stored beside the plan. Advice: never part
    /// of the plan id (design/rehearsal.md).
    #[arg(long)]
    pub rehearse: bool,
    /// How much faster than real time the twin runs (with --rehearse).
    #[arg(long, value_name = "FACTOR", default_value_t = 60, requires = "rehearse",
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub rehearse_compression: u32,
    /// Without --store (or --observed), the plan comes from this server.
    #[command(flatten)]
    pub client: super::client::ClientArgs,
}

/// Open the fjall store at `path` for `medea plan` (and `medea doctor`).
pub(crate) fn open_store(path: &Path) -> miette::Result<FjallStore> {
    super::store::open_dir(path, "plan again, or ask the server for its plan")
}

fn color_stdout() -> bool {
    use std::io::IsTerminal;
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// `medea plan` without `--store`: the running server's current plan and diagnostics.
fn from_server(args: &PlanArgs) -> miette::Result<u8> {
    use crate::api::pb;
    let rt = tokio::runtime::Runtime::new()
        .into_diagnostic()
        .wrap_err("cannot start the runtime")?;
    rt.block_on(async {
        let mut c = args.client.connect().await?;
        let r = c
            .get_plan(pb::GetPlanRequest { id: String::new() })
            .await
            .map_err(|s| super::client::rpc_error(&args.client.addr(), s))?
            .into_inner();
        let errors = r
            .diagnostics
            .iter()
            .filter(|d| d.severity == "error")
            .count();
        for d in &r.diagnostics {
            eprintln!("{}", d.rendered);
        }
        if errors > 0 {
            eprintln!(
                "{errors} error{}: the server keeps the last valid plan; nothing changes",
                if errors == 1 { "" } else { "s" }
            );
            return Ok(exit::ERROR);
        }
        let Some(p) = r.plan else {
            outln!("the server has no plan yet");
            return Ok(exit::OK);
        };
        let p = if args.rehearse {
            rehearse_on_server(&mut c, args, p).await?
        } else {
            p
        };
        match args.output {
            Output::Text => out!("{}", text_with_rehearsals(&p)),
            Output::Json if args.rehearse => out!("{}", server_rehearsed_json(&p)),
            Output::Json => out!("{}", p.json),
        }
        for j in r.halted.iter().filter(|j| j.plan_id != p.id) {
            eprintln!(
                "job {} of cluster {} halted ({}): {}; {}",
                j.job_id,
                j.cluster,
                j.halt_code,
                j.halt_reason,
                if p.has_changes {
                    "this plan continues from what it left (nodes already on their target are not in it)"
                } else {
                    "nothing of it is left to do"
                }
            );
        }
        eprintln!("{}", approvals_line(&p));
        Ok(if p.has_changes {
            exit::CHANGES
        } else {
            exit::OK
        })
    })
}

/// The closing line of `medea plan` against the server: the plan's state and approvals, and
/// the candidates that did not count: "listed in the plan" only when the plan's text lists them
/// (a pending plan's does); otherwise they are listed here (issue #52: a plan with no changes
/// said "1 not counted (listed in the plan)" and listed nothing).
fn approvals_line(p: &crate::api::pb::Plan) -> String {
    let approvals: Vec<String> = p.approvals.iter().map(|a| a.principal.clone()).collect();
    let mut line = format!(
        "plan {} is {}{}; approvals {}/{}{}",
        p.short_id,
        p.state,
        if p.stale { " (stale)" } else { "" },
        p.approvals.len(),
        p.approvals_required,
        if approvals.is_empty() {
            String::new()
        } else {
            format!(" ({})", approvals.join(", "))
        },
    );
    let n = p.rejected.len();
    if n == 0 {
        return line;
    }
    if p.rendered.contains(&format!("Not counted ({n}):")) {
        line.push_str(&format!("; {n} not counted (listed in the plan)"));
        return line;
    }
    line.push_str(&format!("; {n} not counted:"));
    for r in &p.rejected {
        let who = match (r.principal.as_str(), r.fingerprint.as_str()) {
            ("", "") => "key not checked".to_string(),
            ("", fp) => format!("key {fp}"),
            (who, "") => who.to_string(),
            (who, fp) => format!("{who}, key {fp}"),
        };
        line.push_str(&format!("\n  {} ({who}): {}", r.source, r.reason));
    }
    line
}

/// How often `medea plan --rehearse` asks the server whether its rehearsal still runs.
const REHEARSAL_POLL: std::time::Duration = std::time::Duration::from_millis(500);

/// `medea plan --rehearse` against the server: ask it to rehearse its current plan
/// (`RehearsePlan`, on the leader, in the background), wait until its plan view no longer
/// says a rehearsal of it runs, and return that view (with each stored report). The run
/// itself is bounded on the server (it stops when the twin's journal stops moving).
async fn rehearse_on_server(
    c: &mut crate::api::client::Client,
    args: &PlanArgs,
    p: crate::api::pb::Plan,
) -> miette::Result<crate::api::pb::Plan> {
    use crate::api::pb;
    if !p.has_changes {
        eprintln!("rehearsal: the plan changes no cluster; nothing to rehearse");
        return Ok(p);
    }
    let started = c
        .rehearse_plan(pb::RehearsePlanRequest {
            plan_id: p.id.clone(),
            compression: args.rehearse_compression,
        })
        .await
        .map_err(|s| super::client::rpc_error(&args.client.addr(), s))?
        .into_inner();
    eprintln!(
        "rehearsing plan {} on the server ({}{}); waiting for the reports",
        p.short_id,
        started.outcome,
        if started.clusters.is_empty() {
            String::new()
        } else {
            format!(": {}", started.clusters.join(", "))
        }
    );
    loop {
        tokio::time::sleep(REHEARSAL_POLL).await;
        let view = c
            .get_plan(pb::GetPlanRequest { id: p.id.clone() })
            .await
            .map_err(|s| super::client::rpc_error(&args.client.addr(), s))?
            .into_inner()
            .plan
            .ok_or_else(|| miette::miette!("the server no longer has plan {}", p.short_id))?;
        if !view.rehearsing {
            return Ok(view);
        }
    }
}

/// `medea plan --rehearse -o json` against the server: the shape the offline command prints,
/// `{"plan": …, "rehearsals": [{"report": …, "stored": true}, …]}` (the server stores every
/// report beside its plan).
fn server_rehearsed_json(p: &crate::api::pb::Plan) -> String {
    let rehearsals: Vec<String> = p
        .rehearsals
        .iter()
        .map(|r| {
            format!(
                "{{\n\"report\": {},\n\"stored\": true\n}}",
                r.json.trim_end()
            )
        })
        .collect();
    format!(
        "{{\n\"plan\": {},\n\"rehearsals\": [{}]\n}}\n",
        p.json.trim_end(),
        rehearsals.join(",\n")
    )
}

/// The server's plan as text, then each cluster's stored rehearsal (advice, never part of the
/// plan id; issue #36 item 4), a blank line before each.
fn text_with_rehearsals(p: &crate::api::pb::Plan) -> String {
    let mut text = p.rendered.clone();
    for r in &p.rehearsals {
        text.push('\n');
        text.push_str(&r.rendered);
    }
    text
}

pub fn plan(args: PlanArgs) -> miette::Result<u8> {
    if args.dir.is_none()
        && args.desired.desired.is_none()
        && args.store.is_none()
        && args.observed.is_none()
    {
        // with --rehearse, the server rehearses its current plan (`RehearsePlan`)
        return from_server(&args);
    }
    let source = args.desired.source(args.dir.clone(), None)?;
    let loaded = super::desired::load(&source)?;
    let root = display_root(&source);
    if super::report::print_diagnostics(&loaded, &root) > 0 {
        return Ok(exit::ERROR);
    }
    let store = args.store.as_deref().map(open_store).transpose()?;
    let dyn_store: Option<&dyn Store> = store.as_ref().map(|s| s as &dyn Store);
    let desired = &loaded.desired;
    let refused = |diags: &[crate::desired::Diagnostic]| {
        for d in diags {
            eprintln!("{:?}", super::report::report(d, &loaded, &root));
        }
        eprintln!(
            "{} error{}: no plan was computed",
            diags.len(),
            if diags.len() == 1 { "" } else { "s" }
        );
        exit::ERROR
    };
    // Against the store's own inventory: the daemon's planning path, running jobs included.
    let stored_status = |r: Replanned| {
        let status = if r.stored {
            format!("stored as the current plan ({})", r.plan.id.short())
        } else {
            format!("plan {} is already the current plan", r.plan.id.short())
        };
        (r.plan, status, r.inventory)
    };
    let planned = match (&args.observed, dyn_store) {
        (None, Some(s)) => ops_replan::replan(s, desired).map(stored_status),
        (Some(file), store) => {
            let text = std::fs::read_to_string(file)
                .into_diagnostic()
                .wrap_err_with(|| format!("cannot read the inventory file `{}`", file.display()))?;
            let inventory = crate::inventory::file::parse(&file.display().to_string(), &text)
                .map_err(|e| miette::Report::new(InventoryFileReport(e)))?;
            // A rehearsal plans like the daemon would (the store's applied settings and
            // running jobs), against the inventory given; stored only if that inventory is
            // the store's.
            ops_replan::rehearse(store, desired, &inventory).map(|r| match r {
                Rehearsed::NoStore(p) => (p, "not stored (no --store): a rehearsal".to_string(), inventory.clone()),
                Rehearsed::Differs(p) => (p, "not stored: the observed inventory given differs from the store's, so this plan could never be approved (a rehearsal)".to_string(), inventory.clone()),
                Rehearsed::Replanned(r) => stored_status(r),
            })
        }
        (None, None) => {
            return Err(miette::miette!(
                help = "pass the store directory, e.g. `--store /var/lib/medea`, or rehearse with `--observed inventory.yaml`; without --desired, `medea plan` asks the running server",
                "no store given"
            ));
        }
    };
    let outcome = match planned {
        Ok(p) => Ok(p),
        Err(ReplanError::Refused(diags)) => Err(refused(&diags)),
        Err(e) => return Err(miette::Report::from_err(e).wrap_err("cannot store the plan")),
    };
    let (plan, status, inventory) = match outcome {
        Ok(planned) => planned,
        Err(code) => return Ok(code),
    };
    let rehearsals = if args.rehearse {
        Some(rehearse(
            dyn_store,
            &plan,
            &inventory,
            desired,
            args.rehearse_compression,
        )?)
    } else {
        None
    };
    match (args.output, &rehearsals) {
        (Output::Text, _) => out!(
            "{}",
            render::text(
                &plan,
                render::Options {
                    color: color_stdout()
                }
            )
        ),
        (Output::Json, None) => out!("{}", render::json(&plan)),
        (Output::Json, Some(r)) => out!("{}", rehearsed_json(&plan, r)?),
    }
    if let (Output::Text, Some(r)) = (args.output, &rehearsals) {
        for one in r {
            outln!();
            out!("{}", crate::rehearsal::render::text(&one.report));
            outln!("  {}", one.stored_line());
        }
        if r.is_empty() {
            outln!();
            outln!("rehearsal: the plan changes no cluster; nothing to rehearse");
        }
    }
    eprintln!("{status}");
    Ok(if plan.has_changes() {
        exit::CHANGES
    } else {
        exit::OK
    })
}

/// One cluster's rehearsal and whether it was stored beside the plan.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct RehearsalOut {
    report: crate::rehearsal::report::Rehearsal,
    /// Stored under `rehearsal/<plan>/<cluster>` beside the plan.
    stored: bool,
    /// Why it was not stored, when it was not.
    #[serde(skip_serializing_if = "Option::is_none")]
    not_stored: Option<String>,
}

impl RehearsalOut {
    fn stored_line(&self) -> String {
        match &self.not_stored {
            None => format!(
                "report stored beside the plan (rehearsal/{}/{})",
                self.report.plan, self.report.cluster
            ),
            Some(why) => format!("report not stored: {why}"),
        }
    }
}

/// Rehearse every cluster of `plan` with changes (`ops::rehearse`) and store each report
/// beside the plan when the plan is stored.
fn rehearse(
    store: Option<&dyn Store>,
    plan: &crate::plan::Plan,
    inventory: &crate::inventory::Inventory,
    desired: &crate::desired::Desired,
    compression: u32,
) -> miette::Result<Vec<RehearsalOut>> {
    use crate::ops::rehearse as ops_rehearse;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .into_diagnostic()
        .wrap_err("cannot start the runtime")?;
    let settings = ops_rehearse::Settings {
        compression,
        ..ops_rehearse::Settings::default()
    };
    let reports = rt
        .block_on(ops_rehearse::rehearse_plan(
            store, plan, inventory, desired, &settings,
        ))
        .map_err(|e| miette::Report::from_err(e).wrap_err("cannot rehearse the plan"))?;
    let stored = match store {
        Some(s) => ops_rehearse::plan_is_stored(s, &plan.id)
            .map_err(|e| miette::Report::from_err(e).wrap_err("cannot read the store"))?,
        None => false,
    };
    let mut out = Vec::with_capacity(reports.len());
    for report in reports {
        let not_stored = match store {
            Some(s) if stored => {
                ops_rehearse::store_report(s, &report).map_err(|e| {
                    miette::Report::from_err(e).wrap_err("cannot store the rehearsal")
                })?;
                None
            }
            Some(_) => Some(
                "the plan is not stored (it was planned against another inventory)".to_string(),
            ),
            None => Some("no --store".to_string()),
        };
        out.push(RehearsalOut {
            stored: not_stored.is_none(),
            report,
            not_stored,
        });
    }
    Ok(out)
}

/// `-o json --rehearse`: one document, `{"plan": <the plan's JSON, unchanged>, "rehearsals":
/// [{"report": …, "stored": …}]}` (design/rehearsal.md, "Output").
fn rehearsed_json(plan: &crate::plan::Plan, r: &[RehearsalOut]) -> miette::Result<String> {
    let rehearsals = serde_json::to_string_pretty(r)
        .into_diagnostic()
        .wrap_err("cannot encode the rehearsals")?;
    let plan_json = render::json(plan);
    Ok(format!(
        "{{\n\"plan\": {},\n\"rehearsals\": {rehearsals}\n}}\n",
        plan_json.trim_end()
    ))
}

/// An inventory file that does not parse, shown with its cause chain and where the format is
/// documented.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error(transparent)]
#[diagnostic(help("see `design/plan.md` for the inventory file format"))]
struct InventoryFileReport(crate::inventory::file::InventoryFileError);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::pb;
    use crate::rehearsal::report::{Blocker, BlockerKind, Outcome, Rehearsal};

    #[test]
    fn the_servers_plan_prints_each_stored_rehearsal_after_the_plan() {
        let plan = pb::Plan {
            rendered: "Plan abc: 1 to upgrade\n  ~ w-2 v1.12.4 → v1.13.0\n".into(),
            ..Default::default()
        };
        assert_eq!(text_with_rehearsals(&plan), plan.rendered, "no report");
        let report = Rehearsal {
            plan: "ab".repeat(32),
            cluster: "home".into(),
            ran_at: "2026-12-06T10:00:00Z".into(),
            census_gathered_at: String::new(),
            compression: 60,
            timings: "defaults".into(),
            waves: Vec::new(),
            outcome: Outcome::Halted {
                code: "drain_blocked".into(),
                node: Some("w-2".into()),
                reason: "drain of w-2 timed out".into(),
                after_secs: 600,
            },
            blockers: vec![Blocker {
                kind: BlockerKind::Pdb,
                node: Some("w-2".into()),
                detail: "PodDisruptionBudget shop/db allows no disruption".into(),
            }],
            limits: Vec::new(),
        };
        let with = pb::Plan {
            rehearsals: vec![crate::server::api::rehearsal_pb(&report)],
            ..plan.clone()
        };
        let text = text_with_rehearsals(&with);
        let (head, tail) = text.split_at(plan.rendered.len());
        assert_eq!(head, plan.rendered, "the plan first, unchanged");
        assert_eq!(
            tail,
            format!("\n{}", crate::rehearsal::render::text(&report)),
            "then the report as `medea plan --rehearse` prints it"
        );
        assert!(
            tail.contains("- pdb at node w-2: PodDisruptionBudget shop/db allows no disruption"),
            "{tail}"
        );
    }
    /// Issue #52 item 6: a plan whose text does not list the candidates that did not count (a
    /// plan with no changes) has them listed under its closing line, never "listed in the plan".
    #[test]
    fn candidates_that_did_not_count_are_listed_where_the_plan_does_not() {
        let rejected = crate::api::pb::RejectedApproval {
            source: "marker:approvals/0123456789ab-alice.sig".into(),
            fingerprint: "SHA256:abc".into(),
            principal: "alice".into(),
            code: "other-plan".into(),
            reason: "signed for plan 0123456789ab, not the current plan".into(),
        };
        let mut p = crate::api::pb::Plan {
            short_id: "fedcba987654".into(),
            state: "no-changes".into(),
            approvals_required: 1,
            rendered: "Plan fedcba987654: no changes.\n".into(),
            rejected: vec![rejected],
            ..Default::default()
        };
        let line = approvals_line(&p);
        assert!(!line.contains("listed in the plan"), "{line}");
        assert!(
            line.ends_with(
                "; 1 not counted:\n  marker:approvals/0123456789ab-alice.sig (alice, key SHA256:abc): signed for plan 0123456789ab, not the current plan"
            ),
            "{line}"
        );
        p.rendered.push_str("Not counted (1):\n  …\n");
        assert!(approvals_line(&p).ends_with("; 1 not counted (listed in the plan)"));
    }
}
