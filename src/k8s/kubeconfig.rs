//! Loading a cluster's kubeconfig from medea's credentials directory.
//!
//! Convention: a cluster's credentials directory holds its kubeconfig as `kubeconfig`
//! (next to its `talosconfig`). Relative certificate/key/token-file paths inside it are
//! resolved against the file's directory, as kubectl does.
//!
//! Secrets: errors never contain the file's text. A YAML error is reported with its line
//! and column only, because the underlying parser quotes the offending input, which may be
//! a token or a key.

use std::path::{Path, PathBuf};

use ::kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};

use super::K8sError;

/// The kubeconfig's file name inside a cluster's credentials directory.
pub const KUBECONFIG_FILE: &str = "kubeconfig";

/// The kubeconfig path for a credentials directory.
pub fn path_in(creds_dir: &Path) -> PathBuf {
    creds_dir.join(KUBECONFIG_FILE)
}

/// Read and parse a kubeconfig file.
pub fn read(path: &Path) -> Result<Kubeconfig, K8sError> {
    Kubeconfig::read_from(path).map_err(|err| classify(path, err))
}

/// Parse kubeconfig text (`path` names it in errors; relative file references inside stay
/// relative: [`read`] resolves them against the file's directory).
pub fn parse(text: &str, path: &Path) -> Result<Kubeconfig, K8sError> {
    Kubeconfig::from_yaml(text).map_err(|err| classify(path, err))
}

fn classify(path: &Path, err: KubeconfigError) -> K8sError {
    match err {
        KubeconfigError::ReadConfig(err, _) => K8sError::KubeconfigRead {
            path: path.to_path_buf(),
            err,
        },
        KubeconfigError::Parse(parse) => {
            let loc = parse.location();
            K8sError::KubeconfigParse {
                path: path.to_path_buf(),
                line: loc.map(|l| l.line()),
                column: loc.map(|l| l.column()),
            }
        }
        err => K8sError::KubeconfigInvalid {
            path: path.to_path_buf(),
            err: Box::new(err),
        },
    }
}

/// Load a kubeconfig file into a kube-rs client configuration (its current context).
pub async fn load(path: &Path) -> Result<::kube::Config, K8sError> {
    let kubeconfig = read(path)?;
    ::kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|err| K8sError::KubeconfigInvalid {
            path: path.to_path_buf(),
            err: Box::new(err),
        })
}

/// Load `<creds_dir>/kubeconfig`.
pub async fn load_from_creds_dir(creds_dir: &Path) -> Result<::kube::Config, K8sError> {
    load(&path_in(creds_dir)).await
}

/// The PEM client certificate of the kubeconfig's current user (`client-certificate-data`, or
/// the `client-certificate` file relative to the kubeconfig), if it authenticates with one.
pub fn client_certificate_pem(path: &Path) -> Result<Option<String>, K8sError> {
    use base64::Engine as _;
    let kc = read(path)?;
    let user = kc
        .current_context
        .as_deref()
        .and_then(|name| kc.contexts.iter().find(|c| c.name == name))
        .and_then(|c| c.context.as_ref())
        .and_then(|c| c.user.clone());
    let Some(auth) = user
        .and_then(|u| kc.auth_infos.iter().find(|a| a.name == u))
        .and_then(|a| a.auth_info.as_ref())
    else {
        return Ok(None);
    };
    if let Some(data) = &auth.client_certificate_data {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|_| K8sError::KubeconfigParse {
                path: path.to_path_buf(),
                line: None,
                column: None,
            })?;
        return Ok(Some(String::from_utf8_lossy(&bytes).into_owned()));
    }
    if let Some(file) = &auth.client_certificate {
        let file = path
            .parent()
            .map_or_else(|| PathBuf::from(file), |dir| dir.join(file));
        let text = std::fs::read_to_string(&file).map_err(|err| K8sError::KubeconfigRead {
            path: file.clone(),
            err,
        })?;
        return Ok(Some(text));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "s3cr3t-t0ken-value";

    fn write(dir: &Path, text: &str) -> PathBuf {
        let p = dir.join(KUBECONFIG_FILE);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[tokio::test]
    async fn a_valid_kubeconfig_loads_its_current_context() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            &format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: {TOKEN}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n    namespace: apps\ncurrent-context: x\n"
            ),
        );
        let config = load_from_creds_dir(dir.path()).await.unwrap();
        assert_eq!(config.cluster_url.to_string(), "https://127.0.0.1:6443/");
        assert_eq!(config.default_namespace, "apps");
        assert!(
            !format!("{config:?}").contains(TOKEN),
            "Debug leaks the token"
        );
    }

    #[tokio::test]
    async fn errors_say_what_and_where_without_quoting_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = load(&dir.path().join("nope")).await.unwrap_err();
        assert!(
            matches!(missing, K8sError::KubeconfigRead { .. }),
            "{missing:?}"
        );

        write(
            dir.path(),
            &format!("users:\n- name: u\n  user:\n    token: [{TOKEN}\n"),
        );
        let bad = load_from_creds_dir(dir.path()).await.unwrap_err();
        assert!(
            matches!(bad, K8sError::KubeconfigParse { line: Some(_), .. }),
            "{bad:?}"
        );
        let text = format!("{bad} {bad:?}");
        assert!(!text.contains(TOKEN), "{text}");

        write(
            dir.path(),
            "apiVersion: v1\nkind: Config\ncurrent-context: missing\n",
        );
        let invalid = load_from_creds_dir(dir.path()).await.unwrap_err();
        assert!(
            matches!(invalid, K8sError::KubeconfigInvalid { .. }),
            "{invalid:?}"
        );
    }
}
