use super::*;

fn config(url: &str) -> EtcdConfig {
    match url.parse().unwrap() {
        crate::store::location::StoreLocation::Etcd(u) => EtcdConfig::new(u),
        other => panic!("{other:?}"),
    }
}

#[test]
fn plaintext_to_a_remote_etcd_is_refused_unless_insecure() {
    for url in [
        "etcd://127.0.0.1:2379",
        "etcd://localhost:2379",
        "etcd://[::1]:2379",
        "etcd://127.0.0.2:2379,localhost:2380",
    ] {
        assert!(check_transport(&config(url)).is_ok(), "{url}");
    }
    let mut remote = config("etcd://127.0.0.1:2379,10.0.0.5:2379/medea");
    let err = check_transport(&remote).unwrap_err();
    assert!(
        matches!(&err, EtcdError::Plaintext { endpoint } if endpoint == "10.0.0.5:2379"),
        "{err}"
    );
    remote.insecure = true;
    assert!(check_transport(&remote).is_ok());
    remote.insecure = false;
    remote.tls = Some(EtcdTls {
        ca: "/nonexistent/ca.crt".into(),
        cert: None,
        key: None,
    });
    assert!(check_transport(&remote).is_ok());
}

#[test]
fn credentials_never_show_the_password() {
    let c = EtcdCredentials {
        user: "medea".into(),
        password: crate::secret::Secret::new("hunter2".into()),
    };
    let shown = format!("{c:?}");
    assert!(
        shown.contains("medea") && !shown.contains("hunter2"),
        "{shown}"
    );
}

#[test]
fn prefix_ranges() {
    assert_eq!(prefix_end(b"/medea/jobs/"), b"/medea/jobs0");
    assert_eq!(prefix_end(b"a\xff"), b"b");
}

#[test]
fn the_margin_leaves_room_for_renewals() {
    for secs in [1u64, 2, 5, 10, 60] {
        let ttl = Duration::from_secs(secs);
        let m = margin(ttl);
        assert!(m <= ttl / 2, "{secs}s: {m:?}");
        // a keep-alive every ttl/3 renews well before ttl - margin
        assert!(ttl / 3 < ttl - m, "{secs}s: {m:?}");
    }
}
