//! Routing metadata: `node` only, never `nodes`.

use super::*;

/// A raw tonic client with the simulator's admin credentials, to send what medea never sends.
async fn raw_machine(sim: &SimTalos) -> MachineServiceClient<tonic::transport::Channel> {
    use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
    let tls = ClientTlsConfig::new()
        .domain_name("127.0.0.1")
        .ca_certificate(Certificate::from_pem(sim.pki().ca_pem()))
        .identity(Identity::from_pem(
            &sim.pki().admin.cert_pem,
            sim.pki().admin.key_pem_standard.expose(),
        ));
    let ch = Channel::from_shared(format!("https://{}", sim.endpoint()))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    MachineServiceClient::new(ch)
}

#[tokio::test]
async fn the_client_never_sends_nodes_metadata() {
    let e = env("v1.13.9").await;
    let cp = node("cp-1");
    let w = node("w-1");
    // Every operation of the client, once.
    e.client.version(&cp).await.unwrap();
    e.client.services(&cp).await.unwrap();
    e.client.etcd_members(&cp).await.unwrap();
    e.client.etcd_status(&cp).await.unwrap();
    e.client
        .etcd_snapshot(&cp, &e.dir.path().join("snap"))
        .await
        .unwrap();
    e.client.machine_config(&cp).await.unwrap();
    e.client.static_pod_statuses(&cp).await.unwrap();
    e.client.kubelet_spec(&cp).await.unwrap();
    e.client.machine_status(&cp).await.unwrap();
    e.client.boot_id(&cp).await.unwrap();
    e.client
        .health_check(&cp, &HealthCheckSpec::waiting(Duration::ZERO))
        .await
        .unwrap();
    let mc = e.client.machine_config(&w).await.unwrap();
    e.client
        .apply_configuration(&w, &mc, ApplyOptions::no_reboot())
        .await
        .unwrap();
    e.client.upgrade(&w, &installer("v1.14.0")).await.unwrap();
    e.client.reboot(&w).await.unwrap();
    assert_eq!(e.sim.nodes_metadata_rejections(), 0);

    // The detector works: a request with `nodes` is refused and counted.
    let mut raw = raw_machine(&e.sim).await;
    let mut req = tonic::Request::new(());
    req.metadata_mut()
        .insert("nodes", "127.5.0.2".parse().unwrap());
    let err = raw.version(req).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("one-2-many"), "{}", err.message());
    assert_eq!(e.sim.nodes_metadata_rejections(), 1);
}

#[tokio::test]
async fn node_metadata_must_be_single_valued() {
    let e = env("v1.13.9").await;
    let mut raw = raw_machine(&e.sim).await;
    let mut req = tonic::Request::new(());
    req.metadata_mut().append("node", "cp-1".parse().unwrap());
    req.metadata_mut().append("node", "cp-2".parse().unwrap());
    let err = raw.version(req).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    // Without `node` the endpoint's own node answers.
    raw.version(tonic::Request::new(())).await.unwrap();
    assert_eq!(e.sim.counters("cp-1").unwrap().calls(Method::Version), 1);
}
