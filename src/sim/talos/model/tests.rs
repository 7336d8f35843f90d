use super::*;
use crate::sim::talos::fault::{FaultPlan, Trigger};
use crate::version::KubeVersion;

fn cluster() -> TalosSide {
    let s = Scenario::uniform(
        2,
        1,
        TalosVersion::parse("v1.13.2").unwrap(),
        KubeVersion::parse("v1.34.1").unwrap(),
    );
    TalosSide::new(&s, "", 0)
}

fn md(node: Option<&str>) -> MetadataMap {
    let mut m = MetadataMap::new();
    if let Some(n) = node {
        m.insert("node", n.parse().unwrap());
    }
    m
}

#[test]
fn routes_by_name_or_address_and_defaults_to_the_endpoint_node() {
    let mut c = cluster();
    assert_eq!(c.admit(&md(Some("cp-2")), Method::Version).unwrap(), 1);
    assert_eq!(c.admit(&md(Some("10.5.0.4")), Method::Version).unwrap(), 2);
    assert_eq!(c.admit(&md(None), Method::Version).unwrap(), 0);
    let err = c.admit(&md(Some("nope")), Method::Version).unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert_eq!(c.nodes[1].counters.calls(Method::Version), 1);
}

#[test]
fn refuses_fan_out_and_multi_valued_node() {
    let mut c = cluster();
    let mut m = MetadataMap::new();
    m.insert("nodes", "cp-1".parse().unwrap());
    let err = c.admit(&m, Method::CosiGet).unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("/cosi.resource.State/Get"),
        "{}",
        err.message()
    );
    assert_eq!(c.nodes_metadata_rejections, 1);
    let mut m = MetadataMap::new();
    m.append("node", "cp-1".parse().unwrap());
    m.append("node", "cp-2".parse().unwrap());
    assert_eq!(
        c.admit(&m, Method::Version).unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
}

#[test]
fn reboot_boots_the_installed_entry_with_a_new_boot_id() {
    let mut c = cluster();
    let before = c.nodes[0].boot_id.clone();
    c.nodes[0].installed = Some(TalosVersion::parse("v1.14.0").unwrap());
    let t = c.begin_reboot(0);
    assert_eq!(c.nodes[0].power, Power::Rebooting);
    assert!(c.admit(&md(Some("cp-1")), Method::Version).is_err());
    assert_eq!(c.nodes[0].counters.refused(Method::Version), 1);
    c.finish_boot(t);
    assert_eq!(c.nodes[0].power, Power::Up);
    assert_eq!(c.nodes[0].running.to_string(), "v1.14.0");
    assert_ne!(c.nodes[0].boot_id, before);
    c.finish_boot(t);
    assert_eq!(c.nodes[0].counters.boots, 1, "finishing twice is a no-op");
}

#[test]
fn boot_faults_revert_or_lose_the_node() {
    let mut c = cluster();
    c.faults.push(ArmedFault::new(FaultPlan {
        node: "cp-1".into(),
        on: Trigger::boot(),
        effect: Effect::BootOldVersion,
    }));
    c.faults.push(ArmedFault::new(FaultPlan {
        node: "w-1".into(),
        on: Trigger::boot(),
        effect: Effect::NeverReturn,
    }));
    c.nodes[0].installed = Some(TalosVersion::parse("v1.14.0").unwrap());
    let t = c.begin_reboot(0);
    c.finish_boot(t);
    assert_eq!(c.nodes[0].running.to_string(), "v1.13.2");
    assert_eq!(c.nodes[0].installed, None, "the failed entry is dropped");
    let t = c.begin_reboot(2);
    c.finish_boot(t);
    assert_eq!(c.nodes[2].power, Power::Gone);
    assert!(!c.facts().iter().find(|f| f.name == "w-1").unwrap().up);
}

#[test]
fn facts_follow_the_machine_config() {
    let c = cluster();
    let f = c.facts();
    assert_eq!(f[0].name, "cp-1");
    assert_eq!(f[0].kubelet_version, "v1.34.1");
    assert_eq!(f[0].talos_version, "v1.13.2");
    assert_eq!(f[0].static_pod_images.len(), 3);
    assert!(f[2].static_pod_images.is_empty());
}

#[test]
fn health_checks_stop_at_the_first_failure() {
    let mut c = cluster();
    assert!(c.health_checks(&[], &[]).iter().all(|(_, r)| r.is_ok()));
    c.nodes[1].etcd_healthy = false;
    let r = c.health_checks(&[], &[]);
    assert_eq!(r.len(), 1);
    assert!(r[0].1.as_ref().unwrap_err().contains("etcd"));
}
