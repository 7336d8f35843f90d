//! `medea validate` and `medea schema`.

use std::path::PathBuf;

use clap::Args;
use miette::{IntoDiagnostic, WrapErr};

use super::exit;
use crate::desired::{self, Loaded, Source};

/// Where the desired state is read from: a directory, or a git checkout at a ref.
#[derive(Debug, Clone, Args)]
pub struct DesiredArgs {
    /// The desired-state directory (or the git checkout, with --git-ref).
    #[arg(long = "desired", value_name = "DIR", env = "MEDEA_DESIRED")]
    pub desired: Option<PathBuf>,
    /// Read the committed tree at this git ref (branch, tag or sha) instead of the files on
    /// disk; uncommitted edits are ignored.
    #[arg(
        long = "git-ref",
        alias = "ref",
        value_name = "REF",
        env = "MEDEA_GIT_REF"
    )]
    pub git_ref: Option<String>,
}

impl DesiredArgs {
    pub fn source(
        &self,
        positional: Option<PathBuf>,
        git_dir: Option<PathBuf>,
    ) -> miette::Result<Source> {
        let dir = git_dir
            .clone()
            .or(positional)
            .or_else(|| self.desired.clone())
            .ok_or_else(|| {
                miette::miette!(
                    help = "pass a directory, e.g. `medea validate examples/`",
                    "no desired-state directory given"
                )
            })?;
        match (&self.git_ref, git_dir) {
            (Some(r), _) => Ok(Source::Git {
                path: dir,
                reference: r.clone(),
            }),
            (None, Some(_)) => Ok(Source::Git {
                path: dir,
                reference: "HEAD".into(),
            }),
            (None, None) => Ok(Source::Dir(dir)),
        }
    }
}

pub fn display_root(source: &Source) -> String {
    match source {
        Source::Dir(p) | Source::Git { path: p, .. } => p.display().to_string(),
    }
}

/// Load a revision; I/O errors become reports that name the fix.
pub fn load(source: &Source) -> miette::Result<Loaded> {
    crate::ops::load_desired(source)
        .map_err(|e| miette::Report::new_boxed(Box::new(e_to_diag(e))))
        .wrap_err_with(|| format!("cannot read the desired state from {source}"))
}

fn e_to_diag(e: desired::SourceError) -> miette::MietteDiagnostic {
    let help = match &e {
        desired::SourceError::NotADir { .. } => {
            "check the path; it must be a directory of *.yaml files"
        }
        desired::SourceError::NotARepo { .. } => {
            "run `git init` there, or drop --git-ref to read the directory as it is"
        }
        desired::SourceError::RefNotFound { .. } => {
            "check `git branch -a` / `git tag`; the ref must exist in this checkout"
        }
        _ => "check permissions and that the path is readable",
    };
    let mut chain = e.to_string();
    let mut src: Option<&dyn std::error::Error> = std::error::Error::source(&e);
    while let Some(s) = src {
        chain.push_str(": ");
        chain.push_str(&s.to_string());
        src = s.source();
    }
    miette::MietteDiagnostic::new(chain).with_help(help)
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The desired-state directory.
    pub dir: Option<PathBuf>,
    /// A git checkout to read the committed tree of (at --ref, default HEAD).
    #[arg(long = "git", value_name = "DIR")]
    pub git: Option<PathBuf>,
    #[command(flatten)]
    pub desired: DesiredArgs,
}

pub fn validate(args: ValidateArgs) -> miette::Result<u8> {
    let source = args.desired.source(args.dir, args.git)?;
    let loaded = load(&source)?;
    let errors = super::report::print_diagnostics(&loaded, &display_root(&source));
    if errors > 0 {
        return Ok(exit::ERROR);
    }
    let pools: usize = loaded
        .desired
        .clusters
        .values()
        .map(|c| c.pools.len())
        .sum();
    outln!(
        "valid: {} cluster{}, {} node pool{} ({})",
        loaded.desired.clusters.len(),
        if loaded.desired.clusters.len() == 1 {
            ""
        } else {
            "s"
        },
        pools,
        if pools == 1 { "" } else { "s" },
        loaded.desired.revision
    );
    Ok(exit::OK)
}

#[derive(Debug, Args)]
pub struct SchemaArgs {
    /// Write the schemas into this directory instead of printing them.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

pub fn schema(args: SchemaArgs) -> miette::Result<u8> {
    let schemas = desired::schema::all();
    match args.out {
        Some(dir) => {
            std::fs::create_dir_all(&dir)
                .into_diagnostic()
                .wrap_err_with(|| format!("cannot create {}", dir.display()))?;
            for (name, text) in schemas {
                let path = dir.join(name);
                std::fs::write(&path, text)
                    .into_diagnostic()
                    .wrap_err_with(|| format!("cannot write {}", path.display()))?;
                outln!("wrote {}", path.display());
            }
        }
        None => {
            for (name, text) in schemas {
                outln!("# {name}\n{text}");
            }
        }
    }
    Ok(exit::OK)
}
