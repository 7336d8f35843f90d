//! Wire contract: the vendored protos, the COSI messages and the gRPC paths.

use super::*;

#[test]
fn vendored_protos_are_unmodified() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto/talos");
    let sums = std::fs::read_to_string(root.join("UPSTREAM.sha256")).unwrap();
    let mut n = 0;
    for line in sums.lines().filter(|l| !l.trim().is_empty()) {
        let (want, file) = line.split_once("  ").unwrap();
        let got = hex::encode(sha2::Sha256::digest(
            std::fs::read(root.join(file)).unwrap(),
        ));
        assert_eq!(got, want, "{file} differs from upstream");
        n += 1;
    }
    assert_eq!(n, 12);
}

/// The COSI messages are re-declared by hand: pin their field numbers to the wire table.
#[test]
fn cosi_messages_match_the_wire_table() {
    use medea::talos::proto::cosi::resource as cosi;
    use prost::Message as _;
    let get = cosi::GetRequest {
        namespace: "a".into(),
        r#type: "b".into(),
        id: "c".into(),
        options: Some(cosi::GetOptions {}),
    };
    // 1 namespace, 2 type, 3 id (length-delimited), 4 options (empty message).
    assert_eq!(
        get.encode_to_vec(),
        [0x0a, 1, b'a', 0x12, 1, b'b', 0x1a, 1, b'c', 0x22, 0]
    );
    let md = cosi::Metadata {
        version: "7".into(),
        phase: "running".into(),
        labels: [("k".to_string(), "v".to_string())].into(),
        ..Default::default()
    };
    let bytes = md.encode_to_vec();
    // 4 version, 6 phase, 10 labels (map entry: 1 key, 2 value).
    assert_eq!(&bytes[..3], [0x22, 1, b'7']);
    assert_eq!(&bytes[3..5], [0x32, 7]);
    assert_eq!(&bytes[12..], [0x52, 6, 0x0a, 1, b'k', 0x12, 1, b'v']);
    let spec = cosi::Spec {
        proto_spec: vec![1],
        yaml_spec: "y".into(),
    };
    assert_eq!(spec.encode_to_vec(), [0x0a, 1, 1, 0x12, 1, b'y']);
    let ev = cosi::Event {
        resource: None,
        event_type: cosi::EventType::Destroyed as i32,
        old: None,
        error: Some(String::new()),
        bookmark: None,
    };
    // 2 event_type = DESTROYED (2), 4 optional error (present even when empty).
    assert_eq!(ev.encode_to_vec(), [0x10, 2, 0x22, 0]);
    let term = cosi::LabelTerm {
        key: "k".into(),
        op: cosi::label_term::Operation::LteNumeric as i32,
        value: vec![],
        invert: true,
    };
    assert_eq!(term.encode_to_vec(), [0x0a, 1, b'k', 0x10, 7, 0x28, 1]);
    let watch = cosi::WatchRequest {
        api_version: 1,
        id: Some("x".into()),
        ..Default::default()
    };
    assert_eq!(watch.encode_to_vec(), [0x1a, 1, b'x', 0x28, 1]);
    let opts = cosi::WatchOptions {
        bootstrap_bookmark: true,
        tail_events: 3,
        ..Default::default()
    };
    assert_eq!(opts.encode_to_vec(), [0x10, 3, 0x38, 1]);
}

#[test]
fn grpc_paths_are_talos_paths() {
    for (m, path) in [
        (Method::Upgrade, "/machine.LifecycleService/Upgrade"),
        (Method::LegacyUpgrade, "/machine.MachineService/Upgrade"),
        (Method::CosiGet, "/cosi.resource.State/Get"),
        (Method::HealthCheck, "/cluster.ClusterService/HealthCheck"),
    ] {
        assert_eq!(m.grpc_path(), path);
    }
    use medea::talos::proto::{cluster, cosi, machine};
    assert_eq!(
        machine::machine_service_server::SERVICE_NAME,
        "machine.MachineService"
    );
    assert_eq!(
        machine::lifecycle_service_server::SERVICE_NAME,
        "machine.LifecycleService"
    );
    assert_eq!(
        machine::image_service_server::SERVICE_NAME,
        "machine.ImageService"
    );
    assert_eq!(
        cluster::cluster_service_server::SERVICE_NAME,
        "cluster.ClusterService"
    );
    assert_eq!(
        cosi::resource::state_server::SERVICE_NAME,
        "cosi.resource.State"
    );
}
