//! Connecting the CLI to a running `medea serve`: flags → env → defaults, resolved into an
//! [`crate::api::client::ClientConfig`]; the connection itself is [`crate::api::client`].

use std::path::PathBuf;

use clap::Args;

use crate::api::client::{ClientConfig, ConnectError};

pub const DEFAULT_ADDR: &str = "localhost:7600";

#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// Address of `medea serve` (default: the client context's, else localhost:7600).
    #[arg(long, env = "MEDEA_ADDR", global = true)]
    pub addr: Option<String>,
    /// API bearer token [env: MEDEA_TOKEN]. Prefer --token-file. A flag beats the
    /// environment; an empty token is refused.
    #[arg(long, global = true, conflicts_with = "token_file")]
    pub token: Option<String>,
    /// File holding the API bearer token [env: MEDEA_TOKEN_FILE].
    #[arg(long, global = true)]
    pub token_file: Option<PathBuf>,
    /// CA certificate that signed the server's certificate (medea serve writes
    /// `<state-dir>/tls/ca.crt` when it generates one).
    #[arg(long, env = "MEDEA_CA", global = true)]
    pub ca: Option<PathBuf>,
    /// Skip server certificate verification. Only allowed for loopback addresses.
    #[arg(long, global = true)]
    pub insecure: bool,
    /// The client context to use (`medea config get-contexts`) instead of the current one.
    #[arg(long, env = "MEDEA_CONTEXT", global = true)]
    pub context: Option<String>,
}

pub use crate::api::client::{BearerToken, Client};

/// Where an API token comes from when no flag names one.
pub const TOKEN_ENV: &str = "MEDEA_TOKEN";
pub const TOKEN_FILE_ENV: &str = "MEDEA_TOKEN_FILE";

/// Where the API token was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `--token` or `MEDEA_TOKEN`.
    Value(String),
    /// `--token-file` or `MEDEA_TOKEN_FILE`.
    File(PathBuf),
}

/// The API token's source: an explicit `--token`/`--token-file` beats `MEDEA_TOKEN` and
/// `MEDEA_TOKEN_FILE` from the environment (so a shell with the client's `MEDEA_TOKEN`
/// exported can still run `medea serve --token-file F`); then `MEDEA_TOKEN`, then
/// `MEDEA_TOKEN_FILE`. `None`: nothing given. An empty token (`--token ''`, `MEDEA_TOKEN=`)
/// is an error, never "no token".
pub fn token_source(
    flag: Option<String>,
    flag_file: Option<PathBuf>,
    env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
) -> miette::Result<Option<TokenSource>> {
    let empty = |what: &str| {
        miette::miette!(
            help = "pass the server's token, or leave it unset to use --token-file / the default token file",
            "{what} is empty: an empty API token is refused"
        )
    };
    if let Some(t) = flag {
        if t.trim().is_empty() {
            return Err(empty("--token"));
        }
        return Ok(Some(TokenSource::Value(t)));
    }
    if let Some(f) = flag_file {
        return Ok(Some(TokenSource::File(f)));
    }
    if let Some(t) = env(TOKEN_ENV) {
        let t = t
            .into_string()
            .map_err(|_| miette::miette!("{TOKEN_ENV} is not valid UTF-8"))?;
        if t.trim().is_empty() {
            return Err(empty(TOKEN_ENV));
        }
        return Ok(Some(TokenSource::Value(t)));
    }
    match env(TOKEN_FILE_ENV) {
        Some(f) if f.is_empty() => Err(empty(TOKEN_FILE_ENV)),
        Some(f) => Ok(Some(TokenSource::File(PathBuf::from(f)))),
        None => Ok(None),
    }
}

/// Read a token file: trimmed, never empty. A file that group or others may read works but
/// is warned about on stderr (with the fix), like ssh does for keys.
pub fn read_token_file(path: &std::path::Path) -> miette::Result<crate::secret::Secret<String>> {
    match std::fs::read_to_string(path) {
        Ok(t) if !t.trim().is_empty() => {
            if let Some(w) = loose_permissions(path) {
                eprintln!("{w}");
            }
            Ok(crate::secret::Secret::new(t.trim().to_string()))
        }
        Ok(_) => Err(miette::miette!(
            "token file `{}` is empty: an empty API token is refused",
            path.display()
        )),
        Err(e) => Err(miette::miette!(
            help = "check --token-file / MEDEA_TOKEN_FILE",
            "cannot read token file `{}`: {e}",
            path.display()
        )),
    }
}

/// The warning for a secret file that group or others may read, with the fix; `None` when its
/// mode is private (or cannot be read).
pub fn loose_permissions(path: &std::path::Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then(|| {
        format!(
            "warning: token file {} is readable by group or others (mode {mode:04o}): run chmod 600 {}",
            path.display(),
            path.display()
        )
    })
}

/// The client's token, from [`token_source`].
pub fn resolve_token(
    flag: Option<String>,
    flag_file: Option<PathBuf>,
    env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
) -> miette::Result<Option<crate::secret::Secret<String>>> {
    match token_source(flag, flag_file, env)? {
        Some(TokenSource::Value(t)) => Ok(Some(crate::secret::Secret::new(t))),
        Some(TokenSource::File(p)) => read_token_file(&p).map(Some),
        None => Ok(None),
    }
}

impl ClientArgs {
    /// The address to reach: `--addr`/`MEDEA_ADDR`, else the client context's, else
    /// localhost:7600. (A context file that cannot be read is reported by [`Self::config`].)
    pub fn addr(&self) -> String {
        if let Some(a) = &self.addr {
            return a.clone();
        }
        let env = |n: &str| std::env::var_os(n);
        super::context::load_config(&env)
            .ok()
            .and_then(|f| f.chosen(self.context.as_deref()).ok().flatten().cloned())
            .map_or_else(|| DEFAULT_ADDR.to_string(), |c| c.addr)
    }

    /// The resolved connection settings: the token from [`resolve_token`] (an empty one is
    /// refused before anything is sent); see [`Self::resolve`].
    pub fn config(&self) -> miette::Result<ClientConfig> {
        self.resolve(&|name| std::env::var_os(name))
    }

    /// Flags and `MEDEA_*` variables first; what they leave open comes from the client context
    /// (`--context`, else the current one); with no context, a loopback address uses the token
    /// and CA that a local `medea serve` keeps in its state directory (`MEDEA_STATE_DIR`, else
    /// the default one), when they exist. The local files are never sent elsewhere: they are
    /// only used for a loopback address, and never with `--insecure` (an unverified server).
    pub fn resolve(
        &self,
        env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
    ) -> miette::Result<ClientConfig> {
        let flag_token = resolve_token(self.token.clone(), self.token_file.clone(), env)?;
        let complete =
            self.addr.is_some() && flag_token.is_some() && (self.ca.is_some() || self.insecure);
        let file = if complete && self.context.is_none() {
            super::context::ClientConfigFile::default()
        } else {
            super::context::load_config(env)?
        };
        let context = file.chosen(self.context.as_deref())?;
        let addr = self
            .addr
            .clone()
            .or_else(|| context.map(|c| c.addr.clone()))
            .unwrap_or_else(|| DEFAULT_ADDR.to_string());
        // `--insecure` never sends the local server's token (issue #49 item 7): without a
        // verified certificate, whatever answers on the loopback port (another local user's
        // listener) would receive it. Nor is a state directory guessed from the working
        // directory when HOME is unset.
        let local = (context.is_none()
            && !self.insecure
            && crate::api::client::is_loopback(crate::api::client::host_of(&addr)))
        .then(|| {
            env("MEDEA_STATE_DIR")
                .filter(|d| !d.is_empty())
                .map(PathBuf::from)
                .or_else(super::server::default_state_dir)
        })
        .flatten();
        let token = match flag_token {
            Some(t) => Some(t),
            None => match context.and_then(|c| c.token_file.as_ref()) {
                Some(f) => Some(read_token_file(f)?),
                None => match local.as_ref().map(|d| d.join("token")) {
                    Some(f) if f.exists() => Some(read_token_file(&f)?),
                    _ => None,
                },
            },
        };
        let ca = self
            .ca
            .clone()
            .or_else(|| context.and_then(|c| c.ca.clone()))
            .or_else(|| {
                local
                    .as_ref()
                    .map(|d| d.join("tls/ca.crt"))
                    .filter(|f| f.exists())
            });
        Ok(ClientConfig {
            addr,
            token,
            ca,
            insecure: self.insecure,
        })
    }

    pub async fn connect(&self) -> miette::Result<Client> {
        let cfg = self.config()?;
        crate::api::client::connect(&cfg)
            .await
            .map_err(|e| match e {
                ConnectError::NoCa { .. } => self.no_ca(&cfg.addr, &|n| std::env::var_os(n)),
                e => connect_report(&cfg.addr, e),
            })
    }

    /// No CA to verify the server with: every place looked at (the state directory's
    /// `tls/ca.crt` as an absolute path) and the fixes (issue #52).
    pub fn no_ca(
        &self,
        addr: &str,
        env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
    ) -> miette::Report {
        let mut looked = vec!["--ca / MEDEA_CA: not set".to_string()];
        let file = super::context::config_path(env);
        let shown = file.as_ref().map_or_else(
            || "no client configuration file: HOME and XDG_CONFIG_HOME are not set".to_string(),
            |f| f.display().to_string(),
        );
        let chosen = super::context::load_config(env)
            .ok()
            .and_then(|f| f.chosen(self.context.as_deref()).ok().flatten().cloned());
        looked.push(match chosen {
            Some(c) => format!("client context `{}` ({shown}): has no --ca", c.name),
            None => format!("client context: none in use ({shown})"),
        });
        let host = crate::api::client::host_of(addr);
        if chosen_is_none_and_loopback(self, env, host) {
            let (dir, how) = match env("MEDEA_STATE_DIR").filter(|d| !d.is_empty()) {
                Some(d) => (Some(PathBuf::from(d)), "MEDEA_STATE_DIR"),
                None => (
                    super::server::default_state_dir(),
                    "the default state directory; MEDEA_STATE_DIR is not set",
                ),
            };
            match dir {
                Some(dir) => {
                    let ca = dir.join("tls/ca.crt");
                    let ca = std::path::absolute(&ca).unwrap_or(ca);
                    looked.push(format!("{} ({how}): does not exist", ca.display()));
                }
                None => looked.push(
                    "the local state directory: none (MEDEA_STATE_DIR, STATE_DIRECTORY and HOME are not set)"
                        .to_string(),
                ),
            }
        } else {
            looked.push(format!(
                "the local state directory: not used for `{host}` (only for a loopback address without a client context)"
            ));
        }
        miette::miette!(
            help = "point MEDEA_STATE_DIR at the server's --state-dir (a local `medea serve` writes tls/ca.crt and token there), pass --ca FILE, or save the server once: medea config set-context NAME --addr ADDR --ca FILE --token-file FILE",
            "no CA certificate to verify the server at {addr} with; looked at:\n  {}",
            looked.join("\n  ")
        )
    }
}

/// Whether the local state directory is consulted: a loopback address and no client context.
fn chosen_is_none_and_loopback(
    args: &ClientArgs,
    env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
    host: &str,
) -> bool {
    let context = super::context::load_config(env)
        .ok()
        .and_then(|f| f.chosen(args.context.as_deref()).ok().flatten().cloned());
    context.is_none() && crate::api::client::is_loopback(host)
}

/// The CLI's words (flag names, the fix) for a failed connection.
fn connect_report(addr: &str, e: ConnectError) -> miette::Report {
    match e {
        ConnectError::Token => miette::miette!("the token contains characters that cannot be sent"),
        ConnectError::Address { err, .. } => Hinted::report(
            format!("invalid --addr `{addr}`"),
            Some("use host:port, e.g. localhost:7600"),
            err,
        ),
        ConnectError::InsecureNotLoopback { host } => miette::miette!(
            help = "pass --ca with the server's CA certificate instead",
            "--insecure is only allowed for loopback addresses, not `{host}`"
        ),
        ConnectError::NoCa { .. } => miette::miette!(
            help = "pass --ca <state-dir>/tls/ca.crt (or set MEDEA_CA); for a local server, --insecure also works",
            "no CA certificate to verify the server at {addr} with"
        ),
        ConnectError::ReadCa { path, err } => Hinted::report(
            format!("cannot read CA certificate `{}`", path.display()),
            Some("check --ca / MEDEA_CA"),
            err,
        ),
        ConnectError::Tls(err) => Hinted::report("TLS setup failed".to_string(), None, err),
        ConnectError::Connect { err, .. } => connect_error(addr, err),
    }
}

/// A CLI message with the error that caused it kept as its source (shown as its own link of
/// the chain) and an optional hint.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
struct Hinted {
    message: String,
    help: Option<&'static str>,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl Hinted {
    fn report(
        message: String,
        help: Option<&'static str>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> miette::Report {
        miette::Report::new(Hinted {
            message,
            help,
            source: source.into(),
        })
    }
}

impl miette::Diagnostic for Hinted {
    fn help<'a>(&'a self) -> Option<Box<dyn std::fmt::Display + 'a>> {
        self.help
            .map(|h| Box::new(h) as Box<dyn std::fmt::Display + 'a>)
    }
}

fn connect_error(addr: &str, e: tonic::transport::Error) -> miette::Report {
    // The hint is chosen from the whole chain; the report keeps the chain as its source.
    let chain = crate::error_chain(&e);
    let help = if chain.contains("UnknownIssuer")
        || chain.contains("certificate")
        || chain.contains("InvalidCertificate")
    {
        "the server's TLS certificate is not trusted: pass --ca with the CA that signed it (medea serve writes <state-dir>/tls/ca.crt)"
    } else if chain.contains("refused") {
        "is `medea serve` running there? (default address localhost:7600, or set MEDEA_ADDR)"
    } else {
        "check the address, network and TLS settings"
    };
    Hinted::report(format!("cannot reach medea at {addr}"), Some(help), e)
}

/// Turn an RPC failure into an error that names the fix.
pub fn rpc_error(addr: &str, s: tonic::Status) -> miette::Report {
    match s.code() {
        tonic::Code::Unauthenticated => miette::miette!(
            help = "pass --token-file with the server's token file (a local `medea serve` writes <state-dir>/token), point MEDEA_STATE_DIR at the server's --state-dir, or save it once: medea config set-context NAME --addr ADDR --ca FILE --token-file FILE",
            "medea at {addr} refused the request: {}",
            s.message()
        ),
        tonic::Code::Unavailable => {
            let chain = crate::error_chain(&s);
            let help = if chain.contains("certificate") || chain.contains("UnknownIssuer") {
                "the server's TLS certificate is not trusted: pass --ca with the CA that signed it"
            } else {
                "is `medea serve` running there? (default localhost:7600, or set MEDEA_ADDR)"
            };
            miette::miette!(help = help, "cannot reach medea at {addr}: {chain}")
        }
        _ => miette::miette!("medea at {addr}: {}", s.message()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> + use<> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| {
            vars.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn flags_beat_the_environment() {
        let e = env(&[
            ("MEDEA_TOKEN", "from-env"),
            ("MEDEA_TOKEN_FILE", "/env/file"),
        ]);
        assert_eq!(
            token_source(None, Some("/flag/file".into()), &e).unwrap(),
            Some(TokenSource::File("/flag/file".into()))
        );
        assert_eq!(
            token_source(Some("flag".into()), None, &e).unwrap(),
            Some(TokenSource::Value("flag".into()))
        );
        assert_eq!(
            token_source(None, None, &e).unwrap(),
            Some(TokenSource::Value("from-env".into()))
        );
        assert_eq!(
            token_source(None, None, &env(&[("MEDEA_TOKEN_FILE", "/env/file")])).unwrap(),
            Some(TokenSource::File("/env/file".into()))
        );
        assert_eq!(token_source(None, None, &env(&[])).unwrap(), None);
    }

    #[test]
    fn an_empty_token_is_refused() {
        let err = token_source(Some(String::new()), None, &env(&[])).unwrap_err();
        assert!(err.to_string().contains("--token is empty"), "{err}");
        let err = token_source(None, None, &env(&[("MEDEA_TOKEN", "")])).unwrap_err();
        assert!(err.to_string().contains("MEDEA_TOKEN is empty"), "{err}");
        let err = token_source(Some("  ".into()), None, &env(&[])).unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("t");
        std::fs::write(&f, "\n").unwrap();
        let err = resolve_token(None, Some(f), &env(&[])).unwrap_err();
        assert!(err.to_string().contains("is empty"), "{err}");
    }
}
