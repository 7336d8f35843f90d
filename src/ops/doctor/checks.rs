//! The checks that need no cluster: file modes of the credentials, the client certificates
//! (expiry, the talosconfig's role) and the clock skew against a server's `Date`.

use std::path::Path;

use super::{CERT_WARN_DAYS, CLOCK_FAIL_SECS, CLOCK_WARN_SECS, Check, REQUIRED_TALOS_ROLE};

/// What medea reads out of a client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFacts {
    pub not_after: jiff::Timestamp,
    /// Subject Organization values (Talos roles, Kubernetes groups).
    pub organizations: Vec<String>,
}

/// Why a certificate could not be read. The parser's own error is not kept: the check's
/// message says which layer failed, and the certificate bytes must not reach a log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertError {
    #[error("the certificate is not PEM")]
    NotPem,
    #[error("the certificate is not valid X.509")]
    NotX509,
    #[error("the certificate's expiry is out of range")]
    Expiry,
}

/// Parse the first certificate of a PEM bundle.
pub fn cert_facts(pem: &str) -> Result<CertFacts, CertError> {
    let (_, pem) =
        x509_parser::pem::parse_x509_pem(pem.as_bytes()).map_err(|_| CertError::NotPem)?;
    let cert = pem.parse_x509().map_err(|_| CertError::NotX509)?;
    let not_after = jiff::Timestamp::from_second(cert.validity().not_after.timestamp())
        .map_err(|_| CertError::Expiry)?;
    let organizations = cert
        .subject()
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Ok(CertFacts {
        not_after,
        organizations,
    })
}

pub(super) fn expiry_text(not_after: jiff::Timestamp, now: jiff::Timestamp) -> (i64, String) {
    let days = (not_after - now).get_seconds().div_euclid(86_400);
    let date = not_after.strftime("%Y-%m-%d").to_string();
    (days, date)
}

/// The talosconfig client certificate: expiry and role. Pure (`now` is an argument).
pub fn talos_cert_check(target: &str, crt_pem: &str, now: jiff::Timestamp) -> Check {
    const CHECK: &str = "talos-cert";
    let regenerate = "generate an admin talosconfig: `talosctl config new --roles os:admin talosconfig` against the cluster (or from its secrets), then `medea seed --force`";
    let facts = match cert_facts(crt_pem) {
        Ok(f) => f,
        Err(e) => return Check::fail(CHECK, target, e.to_string(), regenerate),
    };
    let (days, date) = expiry_text(facts.not_after, now);
    let roles = if facts.organizations.is_empty() {
        "no role".to_string()
    } else {
        format!("role {}", facts.organizations.join(", "))
    };
    if facts.not_after <= now {
        return Check::fail(
            CHECK,
            target,
            format!("{roles}, expired on {date}"),
            regenerate,
        );
    }
    if !facts.organizations.iter().any(|o| o == REQUIRED_TALOS_ROLE) {
        return Check::fail(
            CHECK,
            target,
            format!(
                "{roles}, expires {date}: medea needs `{REQUIRED_TALOS_ROLE}` (upgrades, reboots, machine config)"
            ),
            regenerate,
        );
    }
    if days < CERT_WARN_DAYS {
        return Check::warn(
            CHECK,
            target,
            format!("{roles}, expires {date} (in {days} days)"),
            regenerate,
        );
    }
    Check::pass(
        CHECK,
        target,
        format!("{roles}, expires {date} (in {days} days)"),
    )
}

/// The kube-apiserver's clock against ours. Pure.
pub fn clock_check(target: &str, server: Option<jiff::Timestamp>, local: jiff::Timestamp) -> Check {
    const CHECK: &str = "clock";
    let Some(server) = server else {
        return Check::skip(
            CHECK,
            target,
            "the kube-apiserver sent no usable Date header",
        );
    };
    let skew = (server - local).get_seconds();
    let detail = format!(
        "local clock {} the kube-apiserver's by {}s (limit {CLOCK_FAIL_SECS}s)",
        if skew > 0 { "behind" } else { "ahead of" },
        skew.abs()
    );
    let fix = "synchronize this host's clock (chrony or systemd-timesyncd) and check the nodes' time servers (`talosctl get timestatus`)";
    if skew.abs() > CLOCK_FAIL_SECS {
        Check::fail(CHECK, target, detail, fix)
    } else if skew.abs() > CLOCK_WARN_SECS {
        Check::warn(CHECK, target, detail, fix)
    } else {
        Check::pass(CHECK, target, format!("within {}s", skew.abs().max(0)))
    }
}

pub(super) fn mode_check(path: &Path, want_dir: bool) -> Check {
    use std::os::unix::fs::PermissionsExt as _;
    const CHECK: &str = "creds";
    let target = path.display().to_string();
    let (want, chmod) = if want_dir {
        ("0700", "700")
    } else {
        ("0600", "600")
    };
    match std::fs::metadata(path) {
        Err(e) => Check::fail(
            CHECK,
            target,
            format!("cannot be read: {e}"),
            "run `medea seed` for this cluster (it writes the credentials)",
        ),
        Ok(m) if m.is_dir() != want_dir => Check::fail(
            CHECK,
            target,
            if want_dir {
                "is not a directory"
            } else {
                "is not a file"
            },
            "run `medea seed` for this cluster (it writes the credentials)",
        ),
        Ok(m) => {
            let mode = m.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                Check::fail(
                    CHECK,
                    &target,
                    format!("mode {mode:04o}: other users can read the credentials"),
                    format!("chmod {chmod} {target}"),
                )
            } else {
                Check::pass(CHECK, target, format!("mode {mode:04o} (want {want})"))
            }
        }
    }
}

pub(super) fn kube_cert_check(kubeconfig: &Path, now: jiff::Timestamp) -> Option<Check> {
    use base64::Engine as _;
    const CHECK: &str = "kube-cert";
    let kc = crate::k8s::kubeconfig::read(kubeconfig).ok()?;
    let context = kc.current_context.as_deref()?;
    let user = kc
        .contexts
        .iter()
        .find(|c| c.name == context)?
        .context
        .as_ref()?
        .user
        .clone()?;
    let auth = kc
        .auth_infos
        .iter()
        .find(|a| a.name == user)?
        .auth_info
        .as_ref()?;
    let data = auth.client_certificate_data.as_deref()?;
    let target = kubeconfig.display().to_string();
    let fix = "get a fresh kubeconfig (`talosctl kubeconfig`), then `medea seed --force`";
    let pem = match base64::engine::general_purpose::STANDARD.decode(data.trim()) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(_) => {
            return Some(Check::fail(
                CHECK,
                target,
                "client-certificate-data is not base64",
                fix,
            ));
        }
    };
    Some(match cert_facts(&pem) {
        Err(e) => Check::fail(CHECK, target, e.to_string(), fix),
        Ok(f) => {
            let (days, date) = expiry_text(f.not_after, now);
            if f.not_after <= now {
                Check::fail(CHECK, target, format!("expired on {date}"), fix)
            } else if days < CERT_WARN_DAYS {
                Check::warn(
                    CHECK,
                    target,
                    format!("expires {date} (in {days} days)"),
                    fix,
                )
            } else {
                Check::pass(CHECK, target, format!("expires {date} (in {days} days)"))
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::super::Status;
    use super::*;

    fn cert(orgs: &[&str], not_after: jiff::civil::Date) -> String {
        let mut p = rcgen::CertificateParams::new(vec![]).unwrap();
        for o in orgs {
            p.distinguished_name
                .push(rcgen::DnType::OrganizationName, *o);
        }
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(
            not_after.year().into(),
            not_after.month() as u8,
            not_after.day() as u8,
        );
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        p.self_signed(&key).unwrap().pem()
    }

    fn now() -> jiff::Timestamp {
        "2026-08-21T12:00:00Z".parse().unwrap()
    }

    #[test]
    fn talos_certificates_need_os_admin_and_time_left() {
        let ok = talos_cert_check(
            "t",
            &cert(&["os:admin"], jiff::civil::date(2027, 8, 21)),
            now(),
        );
        assert_eq!(ok.status, Status::Pass, "{ok:?}");
        assert!(
            ok.detail.contains("role os:admin, expires 2027-08-21"),
            "{ok:?}"
        );

        let reader = talos_cert_check(
            "t",
            &cert(&["os:reader"], jiff::civil::date(2027, 8, 21)),
            now(),
        );
        assert_eq!(reader.status, Status::Fail);
        assert!(
            reader.detail.contains("role os:reader") && reader.detail.contains("needs `os:admin`"),
            "{reader:?}"
        );

        let soon = talos_cert_check(
            "t",
            &cert(&["os:admin"], jiff::civil::date(2026, 9, 1)),
            now(),
        );
        assert_eq!(soon.status, Status::Warn, "{soon:?}");
        assert!(soon.detail.contains("in 10 days"), "{soon:?}");

        let expired = talos_cert_check(
            "t",
            &cert(&["os:admin"], jiff::civil::date(2026, 8, 1)),
            now(),
        );
        assert_eq!(expired.status, Status::Fail);
        assert!(
            expired.detail.contains("expired on 2026-08-01"),
            "{expired:?}"
        );

        let garbage = talos_cert_check("t", "not a cert", now());
        assert_eq!(garbage.status, Status::Fail);
        assert!(garbage.fix.unwrap().contains("talosctl config new"));
    }

    #[test]
    fn clock_skew_warns_then_fails() {
        let at = |s: i64| {
            now()
                .checked_add(jiff::SignedDuration::from_secs(s))
                .unwrap()
        };
        assert_eq!(clock_check("k", Some(at(2)), now()).status, Status::Pass);
        let w = clock_check("k", Some(at(-10)), now());
        assert_eq!(w.status, Status::Warn);
        assert!(
            w.detail.contains("ahead of the kube-apiserver's by 10s"),
            "{w:?}"
        );
        let f = clock_check("k", Some(at(120)), now());
        assert_eq!(f.status, Status::Fail);
        assert!(
            f.detail.contains("behind the kube-apiserver's by 120s"),
            "{f:?}"
        );
        assert_eq!(clock_check("k", None, now()).status, Status::Skip);
    }

    #[test]
    fn loose_modes_fail_with_the_chmod_to_run() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("talosconfig");
        std::fs::write(&f, "x").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let c = mode_check(&f, false);
        assert_eq!(c.status, Status::Fail);
        assert_eq!(
            c.fix.as_deref(),
            Some(format!("chmod 600 {}", f.display()).as_str())
        );
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(mode_check(&f, false).status, Status::Pass);
        assert_eq!(
            mode_check(&f, true).status,
            Status::Fail,
            "a file is not a dir"
        );
        assert_eq!(
            mode_check(&dir.path().join("nope"), false).status,
            Status::Fail
        );
    }
}
