//! The bootstrap manifests a simulated control plane renders: what Talos' `ManifestController`
//! writes to COSI `controlplane/Manifests.kubernetes.talos.dev` and `upgrade-k8s` syncs last.
//!
//! Upstream (siderolabs/talos, the same set in v1.12.9, v1.13.9 and main @ ad88231):
//! `internal/app/machined/pkg/controllers/k8s/manifest.go` (`ManifestController.render`: the
//! resource ids and which objects each carries) and the object builders in
//! `internal/app/machined/pkg/controllers/k8s/internal/k8stemplates/` (`csr.go`,
//! `coredns.go`, `kube-proxy.go`, `flannel.go`, `kubeconfig.go`, `kubelet.go`, `talos.go`),
//! whose rendered output is pinned in that directory's `testdata/*.yaml`. The defaults of a
//! generated machine config hold: CoreDNS, flannel and kube-proxy enabled, the Talos API
//! service account CRD (`13-talos-service-account-crd`, `kubernetesTalosAPIAccess`) off, IPv4
//! service CIDR `10.96.0.0/12`, cluster domain `cluster.local`.
//!
//! Images follow the running Talos minor's defaults (`pkg/machinery/constants/constants.go`
//! `DefaultCoreDNSVersion`, `FlannelVersion`, `pkg/images/list.go`); kube-proxy runs the
//! version of the node's kube-apiserver image, as after `upgrade-k8s` patched
//! `cluster.proxy.image` (the simulator does not model that field on its own).
//!
//! Left out: container fields the simulated kubelet does not read (probes, resources,
//! security contexts, volume mounts) are kept where they are part of the object's identity or
//! selection (labels, selectors, tolerations, affinity, service account), and dropped
//! otherwise.

use serde_json::{Value, json};

use crate::version::TalosVersion;

/// CoreDNS image tag a Talos minor defaults to (`constants.DefaultCoreDNSVersion`: v1.12.9
/// `v1.14.2`, v1.13.9 and v1.14.0-rc.1 `v1.14.6`).
fn coredns_version(talos: &TalosVersion) -> &'static str {
    if talos.minor_line() < (1, 13) {
        "v1.14.2"
    } else {
        "v1.14.6"
    }
}

/// Flannel image tag a Talos minor ships (`constants.FlannelVersion`: v1.12.9 `v0.27.4`,
/// v1.13.9 `0.28.8`, v1.14.0-rc.1 `0.28.9`).
fn flannel_version(talos: &TalosVersion) -> &'static str {
    match talos.minor_line() {
        l if l < (1, 13) => "v0.27.4",
        (1, 13) => "0.28.8",
        _ => "0.28.9",
    }
}

fn rbac_defaults() -> Value {
    json!({"kubernetes.io/bootstrapping": "rbac-defaults"})
}

fn cluster_role_binding(name: &str, role: &str, subjects: Value) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": subjects,
    })
}

fn group(name: &str) -> Value {
    json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": name})
}

fn service_account(name: &str) -> Value {
    json!({"kind": "ServiceAccount", "name": name, "namespace": "kube-system"})
}

fn linux_affinity(arch: bool) -> Value {
    let mut exprs = vec![json!({"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]})];
    if arch {
        exprs.push(
            json!({"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]}),
        );
    }
    json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": exprs}]
    }}})
}

fn tolerate_all() -> Value {
    json!([
        {"effect": "NoSchedule", "operator": "Exists"},
        {"effect": "NoExecute", "operator": "Exists"}
    ])
}

/// The manifests of a control plane on Talos `talos` whose kube-apiserver runs `kube_version`
/// (`v1.34.1`), as `(resource id, objects)` in id order.
pub(crate) fn render(talos: &TalosVersion, kube_version: &str) -> Vec<(&'static str, Vec<Value>)> {
    vec![
        // kubelet.go `KubeletBootstrapTokenSecret` (the token is the cluster's; the
        // simulator's is fixed)
        (
            "00-kubelet-bootstrapping-token",
            vec![json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "bootstrap-token-s1m0la", "namespace": "kube-system"},
                "type": "bootstrap.kubernetes.io/token",
                "stringData": {
                    "auth-extra-groups": "system:bootstrappers:nodes",
                    "token-id": "s1m0la",
                    "token-secret": "simulatedtoken00",
                    "usage-bootstrap-authentication": "true"
                }
            })],
        ),
        // csr.go
        (
            "01-csr-approver-role-binding",
            vec![cluster_role_binding(
                "system-bootstrap-approve-node-client-csr",
                "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
                json!([group("system:bootstrappers:nodes")]),
            )],
        ),
        (
            "01-csr-node-bootstrap",
            vec![cluster_role_binding(
                "system-bootstrap-node-bootstrapper",
                "system:node-bootstrapper",
                json!([group("system:bootstrappers:nodes"), group("system:nodes")]),
            )],
        ),
        (
            "01-csr-renewal-role-binding",
            vec![cluster_role_binding(
                "system-bootstrap-node-renewal",
                "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
                json!([group("system:nodes")]),
            )],
        ),
        // flannel.go
        ("05-flannel", flannel(talos)),
        // kube-proxy.go (no `KubeProxyConfigMapTemplate`: no proxy config document)
        (
            "10-kube-proxy",
            vec![
                json!({
                    "apiVersion": "apps/v1",
                    "kind": "DaemonSet",
                    "metadata": {
                        "name": "kube-proxy",
                        "namespace": "kube-system",
                        "labels": {"k8s-app": "kube-proxy", "tier": "node"}
                    },
                    "spec": {
                        "selector": {"matchLabels": {"k8s-app": "kube-proxy", "tier": "node"}},
                        "template": {
                            "metadata": {"labels": {"k8s-app": "kube-proxy", "tier": "node"}},
                            "spec": {
                                "affinity": linux_affinity(true),
                                "containers": [{
                                    "name": "kube-proxy",
                                    "image": format!("registry.k8s.io/kube-proxy:{kube_version}"),
                                    "command": ["/usr/local/bin/kube-proxy", "--proxy-mode=iptables"]
                                }],
                                "hostNetwork": true,
                                "priorityClassName": "system-cluster-critical",
                                "serviceAccountName": "kube-proxy",
                                "tolerations": tolerate_all()
                            }
                        },
                        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
                    }
                }),
                json!({
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {"name": "kube-proxy", "namespace": "kube-system"}
                }),
                cluster_role_binding(
                    "kube-proxy",
                    "system:node-proxier",
                    json!([service_account("kube-proxy")]),
                ),
            ],
        ),
        // coredns.go
        ("11-core-dns", coredns(talos)),
        (
            "11-core-dns-svc",
            vec![json!({
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {
                    "name": "kube-dns",
                    "namespace": "kube-system",
                    "annotations": {"prometheus.io/port": "9153", "prometheus.io/scrape": "true"},
                    "labels": {
                        "k8s-app": "kube-dns",
                        "kubernetes.io/cluster-service": "true",
                        "kubernetes.io/name": "CoreDNS"
                    }
                },
                "spec": {
                    "clusterIP": "10.96.0.10",
                    "clusterIPs": ["10.96.0.10"],
                    "ipFamilies": ["IPv4"],
                    "ipFamilyPolicy": "SingleStack",
                    "ports": [
                        {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                        {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                        {"name": "metrics", "port": 9153, "protocol": "TCP", "targetPort": 9153}
                    ],
                    "selector": {"k8s-app": "kube-dns"}
                }
            })],
        ),
        // kubeconfig.go `KubeconfigInClusterTemplate`; the server is KubePrism (on by default,
        // port 7445: `control_plane.go` `NewControlPlaneBootstrapManifestsController`)
        (
            "11-kube-config-in-cluster",
            vec![json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "kubeconfig-in-cluster", "namespace": "kube-system"},
                "data": {"kubeconfig": "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt\n    server: https://127.0.0.1:7445\n  name: local\ncontexts:\n- context:\n    cluster: local\n    user: service-account\n  name: local\ncurrent-context: local\nkind: Config\nusers:\n- name: service-account\n  user:\n    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token\n"}
            })],
        ),
        // talos.go `TalosNodesRBACClusterRoleBinding`, `TalosNodesRBACClusterRole`
        (
            "11-talos-node-rbac-template",
            vec![
                json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {
                        "name": "system:talos-nodes",
                        "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
                        "labels": rbac_defaults()
                    },
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:talos-nodes"},
                    "subjects": [group("system:nodes")]
                }),
                json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRole",
                    "metadata": {"name": "system:talos-nodes", "labels": rbac_defaults()},
                    "rules": [{
                        "apiGroups": ["discovery.k8s.io"],
                        "resources": ["endpointslices"],
                        "verbs": ["get", "list", "watch"]
                    }]
                }),
            ],
        ),
    ]
}

fn coredns(talos: &TalosVersion) -> Vec<Value> {
    let corefile = ".:53 {\n    errors\n    health {\n        lameduck 5s\n    }\n    ready\n    log . {\n        class error\n    }\n    prometheus :9153\n\n    kubernetes cluster.local in-addr.arpa ip6.arpa {\n        pods insecure\n        fallthrough in-addr.arpa ip6.arpa\n        ttl 30\n    }\n    forward . /etc/resolv.conf {\n       max_concurrent 1000\n    }\n    cache 30 {\n       disable success cluster.local\n       disable denial cluster.local\n    }\n    loop\n    reload\n    loadbalance\n}\n";
    vec![
        json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "coredns", "namespace": "kube-system"}
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "system:coredns", "labels": rbac_defaults()},
            "rules": [
                {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}
            ]
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {
                "name": "system:coredns",
                "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
                "labels": rbac_defaults()
            },
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
            "subjects": [service_account("coredns")]
        }),
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "coredns", "namespace": "kube-system"},
            "data": {"Corefile": corefile}
        }),
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "coredns",
                "namespace": "kube-system",
                "labels": {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}
            },
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"k8s-app": "kube-dns"}},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                "template": {
                    "metadata": {"labels": {"k8s-app": "kube-dns"}},
                    "spec": {
                        "affinity": linux_affinity(true),
                        "containers": [{
                            "name": "coredns",
                            "image": format!("registry.k8s.io/coredns/coredns:{}", coredns_version(talos)),
                            "args": ["-conf", "/etc/coredns/Corefile"]
                        }],
                        "dnsPolicy": "Default",
                        "nodeSelector": {"kubernetes.io/os": "linux"},
                        "priorityClassName": "system-cluster-critical",
                        "serviceAccountName": "coredns",
                        "tolerations": [
                            {"effect": "NoSchedule", "key": "node-role.kubernetes.io/control-plane", "operator": "Exists"},
                            {"effect": "NoSchedule", "key": "node.cloudprovider.kubernetes.io/uninitialized", "operator": "Exists"}
                        ],
                        "volumes": [{"name": "config-volume", "configMap": {"name": "coredns", "items": [{"key": "Corefile", "path": "Corefile"}]}}]
                    }
                }
            }
        }),
    ]
}

fn flannel(talos: &TalosVersion) -> Vec<Value> {
    let image = format!("ghcr.io/siderolabs/flannel:{}", flannel_version(talos));
    let labels = json!({"k8s-app": "flannel", "tier": "node"});
    vec![
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "flannel", "labels": {"k8s-app": "flannel"}},
            "rules": [
                {"apiGroups": [""], "resources": ["pods", "nodes", "namespaces"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}
            ]
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "flannel", "labels": {"k8s-app": "flannel"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "flannel"},
            "subjects": [service_account("flannel")]
        }),
        json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "flannel", "namespace": "kube-system", "labels": {"k8s-app": "flannel"}}
        }),
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "kube-flannel-cfg", "namespace": "kube-system", "labels": labels},
            "data": {
                "cni-conf.json": "{\n  \"name\": \"cbr0\",\n  \"cniVersion\": \"1.0.0\",\n  \"plugins\": [\n    {\n      \"type\": \"flannel\",\n      \"delegate\": {\n        \"hairpinMode\": true,\n        \"isDefaultGateway\": true\n      }\n    },\n    {\n      \"type\": \"portmap\",\n      \"capabilities\": {\n        \"portMappings\": true\n      }\n    }\n  ]\n}",
                "net-conf.json": "{\n  \"Network\": \"10.244.0.0/16\",\n  \"EnableNFTables\": true,\n  \"Backend\": {\n    \"Port\": 4789,\n    \"Type\": \"vxlan\"\n  }\n}"
            }
        }),
        json!({
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "kube-flannel", "namespace": "kube-system", "labels": labels},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "affinity": linux_affinity(false),
                        "containers": [{
                            "name": "kube-flannel",
                            "image": image,
                            "command": ["/opt/bin/flanneld"],
                            "args": ["--ip-masq", "--kube-subnet-mgr"]
                        }],
                        "hostNetwork": true,
                        "priorityClassName": "system-node-critical",
                        "serviceAccountName": "flannel",
                        "tolerations": tolerate_all()
                    }
                }
            }
        }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_set_carries_talos_default_rbac_with_colons_in_names() {
        let m = render(&TalosVersion::parse("v1.13.9").unwrap(), "v1.35.0");
        let ids: Vec<&str> = m.iter().map(|(id, _)| *id).collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        assert_eq!(ids, sorted, "ids in order");
        let names: Vec<String> = m
            .iter()
            .flat_map(|(_, objs)| objs)
            .map(|o| {
                format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap(),
                    o["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect();
        for want in [
            "ClusterRole/system:coredns",
            "ClusterRoleBinding/system:coredns",
            "ClusterRole/system:talos-nodes",
            "ClusterRoleBinding/system:talos-nodes",
            "DaemonSet/kube-proxy",
            "Deployment/coredns",
            "DaemonSet/kube-flannel",
            "Secret/bootstrap-token-s1m0la",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
        }
        let proxy = &m.iter().find(|(id, _)| *id == "10-kube-proxy").unwrap().1[0];
        assert_eq!(
            proxy["spec"]["template"]["spec"]["containers"][0]["image"],
            "registry.k8s.io/kube-proxy:v1.35.0"
        );
    }
}
