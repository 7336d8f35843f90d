//! Client contexts, like kubeconfig's and talosconfig's: named sets of the address, CA file and
//! token file of a `medea serve`, so client commands need no flags or environment.
//!
//! The file is `$MEDEA_CONFIG`, else `$XDG_CONFIG_HOME/medea/config.yaml`, else
//! `~/.config/medea/config.yaml`. It names files and holds no secret itself; it is still
//! written 0600 in a 0700 directory (it says where the tokens are), read with a size cap, and a
//! symbolic link is refused. Flags and environment variables always win over the context.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use miette::{IntoDiagnostic as _, WrapErr as _};
use serde::{Deserialize, Serialize};

use super::exit;
use super::output;

/// The largest config file read.
const MAX_CONFIG_BYTES: u64 = 256 * 1024;

/// The client configuration file: its contexts and which is current.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientConfigFile {
    /// The context used when `--context` / `MEDEA_CONTEXT` names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_context: Option<String>,
    #[serde(default)]
    pub contexts: Vec<Context>,
}

/// One server: where it listens, the CA that signed its certificate, the file with its token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Context {
    pub name: String,
    pub addr: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
}

/// Where the client configuration file is (see the module docs): `MEDEA_CONFIG`, else
/// `$XDG_CONFIG_HOME/medea/config.yaml`, else `$HOME/.config/medea/config.yaml`. `None` when
/// none is set to an absolute path (issue #49 item 7: with `HOME` unset it used to be
/// `./.config/medea/config.yaml`, a context, with its address and token file, read from
/// whatever the working directory was).
pub fn config_path(env: &dyn Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    if let Some(p) = env("MEDEA_CONFIG").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let absolute = |name: &str| env(name).map(PathBuf::from).filter(|p| p.is_absolute());
    let base =
        absolute("XDG_CONFIG_HOME").or_else(|| absolute("HOME").map(|h| h.join(".config")))?;
    Some(base.join("medea/config.yaml"))
}

/// The client configuration file, or an empty one when there is no place for it
/// ([`config_path`] is `None`).
pub fn load_config(
    env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
) -> miette::Result<ClientConfigFile> {
    match config_path(env) {
        Some(p) => ClientConfigFile::load(&p),
        None => Ok(ClientConfigFile::default()),
    }
}

impl ClientConfigFile {
    /// The file at `path`; a missing file is an empty configuration.
    pub fn load(path: &Path) -> miette::Result<ClientConfigFile> {
        use crate::private_file::{BoundedReadError, Privacy, read_bounded};
        let bytes = match read_bounded(path, MAX_CONFIG_BYTES, Privacy::Any) {
            Ok(b) => b,
            Err(BoundedReadError::Open { err, .. })
                if err.kind() == std::io::ErrorKind::NotFound =>
            {
                return Ok(ClientConfigFile::default());
            }
            Err(e) => {
                return Err(e)
                    .into_diagnostic()
                    .wrap_err("cannot read the client configuration");
            }
        };
        let text = String::from_utf8(bytes)
            .into_diagnostic()
            .wrap_err_with(|| format!("{} is not UTF-8", path.display()))?;
        serde_saphyr::from_str(&text)
            .into_diagnostic()
            .wrap_err_with(|| format!("cannot parse the client configuration {}", path.display()))
    }

    /// Write the file 0600 in a 0700 directory, atomically.
    pub fn save(&self, path: &Path) -> miette::Result<()> {
        let text = output::yaml(self);
        crate::server::secrets::write_private(path, text.as_bytes())
            .into_diagnostic()
            .wrap_err_with(|| format!("cannot write {}", path.display()))
    }

    /// The context `--context`/`MEDEA_CONTEXT` names, else the current one, else none. A name
    /// that is not in the file is an error.
    pub fn chosen(&self, named: Option<&str>) -> miette::Result<Option<&Context>> {
        let Some(name) = named.or(self.current_context.as_deref()) else {
            return Ok(None);
        };
        match self.contexts.iter().find(|c| c.name == name) {
            Some(c) => Ok(Some(c)),
            None => Err(miette::miette!(
                help =
                    "`medea config get-contexts` lists them; `medea config set-context` adds one",
                "no client context named `{name}`"
            )),
        }
    }
}

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  medea config set-context prod --addr medea.example.com:7600 \\\n    --ca ~/.config/medea/prod-ca.crt --token-file ~/.config/medea/prod.token\n  medea config use-context prod\n  medea config get-contexts\n\nThe file: $MEDEA_CONFIG, else $XDG_CONFIG_HOME/medea/config.yaml, else ~/.config/medea/config.yaml. Flags and MEDEA_* variables win over the context."
)]
pub struct ConfigArgs {
    #[command(subcommand)]
    pub action: ConfigAction,
}

#[derive(Debug, Subcommand)]
pub enum ConfigAction {
    /// Add or replace a context (a server's address, CA file and token file).
    SetContext {
        /// The context's name.
        name: String,
        /// Address of that `medea serve` (host:port).
        #[arg(long)]
        addr: String,
        /// CA certificate that signed the server's certificate.
        #[arg(long)]
        ca: Option<PathBuf>,
        /// File holding the server's API token (the file is named here, never copied).
        #[arg(long)]
        token_file: Option<PathBuf>,
    },
    /// Make a context the current one.
    UseContext {
        /// The context's name.
        name: String,
    },
    /// Print the current context's name.
    CurrentContext,
    /// List the contexts (`*` marks the current one).
    GetContexts,
    /// Remove a context.
    DeleteContext {
        /// The context's name.
        name: String,
    },
}

pub fn run(args: ConfigArgs) -> miette::Result<u8> {
    let path = config_path(&|n| std::env::var_os(n)).ok_or_else(|| {
        miette::miette!(
            help = "set HOME, XDG_CONFIG_HOME or MEDEA_CONFIG to an absolute path",
            "no place for the client configuration: HOME is not set (medea does not read or write it in the working directory)"
        )
    })?;
    let mut file = ClientConfigFile::load(&path)?;
    match args.action {
        ConfigAction::SetContext {
            name,
            addr,
            ca,
            token_file,
        } => {
            let absolute = |p: PathBuf| std::path::absolute(&p).unwrap_or(p);
            let context = Context {
                name: name.clone(),
                addr,
                ca: ca.map(absolute),
                token_file: token_file.map(absolute),
            };
            match file.contexts.iter_mut().find(|c| c.name == name) {
                Some(c) => *c = context,
                None => file.contexts.push(context),
            }
            if file.current_context.is_none() {
                file.current_context = Some(name.clone());
            }
            file.save(&path)?;
            outln!("context {name} set in {}", path.display());
        }
        ConfigAction::UseContext { name } => {
            file.chosen(Some(&name))?;
            file.current_context = Some(name.clone());
            file.save(&path)?;
            outln!("switched to context {name}");
        }
        ConfigAction::CurrentContext => match &file.current_context {
            Some(c) => outln!("{c}"),
            None => {
                return Err(miette::miette!(
                    help = "`medea config use-context NAME` chooses one",
                    "no current context is set in {}",
                    path.display()
                ));
            }
        },
        ConfigAction::GetContexts => {
            let rows: Vec<Vec<String>> = file
                .contexts
                .iter()
                .map(|c| {
                    let current = file.current_context.as_deref() == Some(c.name.as_str());
                    let show = |p: &Option<PathBuf>| {
                        p.as_ref()
                            .map_or("-".to_string(), |p| p.display().to_string())
                    };
                    vec![
                        if current { "*" } else { "" }.to_string(),
                        c.name.clone(),
                        c.addr.clone(),
                        show(&c.ca),
                        show(&c.token_file),
                    ]
                })
                .collect();
            out!(
                "{}",
                output::table(&["CURRENT", "NAME", "ADDR", "CA", "TOKEN-FILE"], &rows)
            );
        }
        ConfigAction::DeleteContext { name } => {
            file.chosen(Some(&name))?;
            file.contexts.retain(|c| c.name != name);
            if file.current_context.as_deref() == Some(name.as_str()) {
                file.current_context = None;
            }
            file.save(&path)?;
            outln!("context {name} deleted");
        }
    }
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_found_like_other_xdg_configs() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |n: &str| {
                vars.iter()
                    .find(|(k, _)| *k == n)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            }
        };
        assert_eq!(
            config_path(&env(&[("MEDEA_CONFIG", "/x/c.yaml"), ("HOME", "/h")])),
            Some(PathBuf::from("/x/c.yaml"))
        );
        assert_eq!(
            config_path(&env(&[("XDG_CONFIG_HOME", "/cfg"), ("HOME", "/h")])),
            Some(PathBuf::from("/cfg/medea/config.yaml"))
        );
        assert_eq!(
            config_path(&env(&[("HOME", "/h")])),
            Some(PathBuf::from("/h/.config/medea/config.yaml"))
        );
        // Never the working directory (issue #49 item 7).
        assert_eq!(config_path(&env(&[])), None);
        assert_eq!(config_path(&env(&[("HOME", "")])), None);
        assert_eq!(config_path(&env(&[("HOME", "rel")])), None);
    }

    #[test]
    fn a_context_that_is_not_in_the_file_is_an_error() {
        let file = ClientConfigFile {
            current_context: Some("gone".into()),
            contexts: vec![Context {
                name: "prod".into(),
                addr: "m:7600".into(),
                ca: None,
                token_file: None,
            }],
        };
        assert_eq!(file.chosen(Some("prod")).unwrap().unwrap().addr, "m:7600");
        let err = file.chosen(None).unwrap_err();
        assert!(
            err.to_string().contains("no client context named `gone`"),
            "{err}"
        );
        assert!(ClientConfigFile::default().chosen(None).unwrap().is_none());
    }
}
