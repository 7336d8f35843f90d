//! Writing the kubeconfig that points kubectl and medea at the simulated apiserver: the CA
//! embedded as `certificate-authority-data`, a bearer token user, one context. The file holds
//! a secret, so it is written 0600 inside a 0700 directory, atomically (temp file + rename).

use std::path::Path;

use base64::Engine;

use super::KubeSimError;
use super::pki::BearerToken;

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
}

/// The kubeconfig text. It contains the token: never log it.
pub(crate) fn render(
    server_url: &str,
    ca_pem: &str,
    token: &BearerToken,
    cluster: &str,
) -> Result<String, KubeSimError> {
    if !valid_name(cluster) {
        return Err(KubeSimError::ClusterName {
            name: cluster.to_string(),
        });
    }
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let user = format!("admin@{cluster}");
    Ok(format!(
        "apiVersion: v1
kind: Config
clusters:
- name: {cluster}
  cluster:
    server: {server_url}
    certificate-authority-data: {ca}
users:
- name: {user}
  user:
    token: {token}
contexts:
- name: {user}
  context:
    cluster: {cluster}
    user: {user}
    namespace: default
current-context: {user}
preferences: {{}}
",
        token = token.expose()
    ))
}

/// Write a kubeconfig for the simulated apiserver at `path` (mode 0600; missing parent
/// directories are created 0700).
pub fn write_kubeconfig(
    path: &Path,
    server_url: &str,
    ca_pem: &str,
    token: &BearerToken,
    cluster: &str,
) -> Result<(), KubeSimError> {
    let text = render(server_url, ca_pem, token, cluster)?;
    crate::private_file::write_private(
        path,
        text.as_bytes(),
        crate::private_file::ExistingDir::Keep,
    )
    .map_err(|e| KubeSimError::WriteKubeconfig {
        path: path.to_path_buf(),
        err: e.into_io(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn rendered_kubeconfig_parses_with_kube_and_refuses_odd_cluster_names() {
        let token = BearerToken::generate().unwrap();
        let text = render(
            "https://127.0.0.1:6443",
            "-----BEGIN CERTIFICATE-----\n",
            &token,
            "demo",
        )
        .unwrap();
        let kc = kube::config::Kubeconfig::from_yaml(&text).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("admin@demo"));
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        assert!(cluster.certificate_authority_data.is_some());
        assert!(matches!(
            render("https://x", "", &token, "a b: c"),
            Err(KubeSimError::ClusterName { .. })
        ));
    }

    #[test]
    fn kubeconfig_is_written_0600_in_a_0700_dir() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("creds/demo/kubeconfig");
        let token = BearerToken::generate().unwrap();
        write_kubeconfig(&path, "https://127.0.0.1:1", "ca", &token, "demo").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        assert_eq!(mode(&root.path().join("creds")), 0o700);
        // Overwriting keeps the mode.
        write_kubeconfig(&path, "https://127.0.0.1:2", "ca", &token, "demo").unwrap();
        assert_eq!(mode(&path), 0o600);
        assert!(
            std::fs::read_to_string(&path)
                .unwrap()
                .contains("127.0.0.1:2")
        );
    }
}
