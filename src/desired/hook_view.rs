//! What a Job hook runs and what it may reach (issue #49 item 6), read from the pod spec a
//! plan carries, for everything that lists a hook: the plan's text (`medea plan`, the API,
//! the dashboard), its JSON (`jobHooks`) and the settings diff. Pure.
//!
//! A Job hook runs with medea's cluster credentials: medea creates the Job, so whatever the
//! pod spec asks for (a privileged container, the host's namespaces, a `hostPath: /`, a
//! node, a service account, Secrets) is what the cluster gets. Signers must see all of it,
//! not only the first container's image. The fields read are those the Pod Security
//! Standards check (kubernetes `staging/src/k8s.io/pod-security-admission/policy/`:
//! `visitor.go` visits `initContainers`, `containers` and `ephemeralContainers`;
//! `check_privileged.go`, `check_capabilities_baseline.go`, `check_hostNamespaces.go`,
//! `check_hostPathVolumes.go`, `check_runAsUser.go`, `check_runAsNonRoot.go`,
//! `check_allowPrivilegeEscalation.go`), and the ones that decide where the pod runs and
//! what it can read: node placement, the service account and its token, Secret env and
//! volumes.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

/// Which list of the pod spec a container is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ContainerKind {
    /// `initContainers`: run to completion, one after the other, before the others.
    Init,
    /// `containers`.
    Container,
    /// `ephemeralContainers` (the API server refuses them on create; listed if written).
    Ephemeral,
}

impl ContainerKind {
    /// The pod spec's field (`initContainers`).
    pub fn field(self) -> &'static str {
        match self {
            ContainerKind::Init => "initContainers",
            ContainerKind::Container => "containers",
            ContainerKind::Ephemeral => "ephemeralContainers",
        }
    }

    fn word(self) -> &'static str {
        match self {
            ContainerKind::Init => "init",
            ContainerKind::Container => "container",
            ContainerKind::Ephemeral => "ephemeral",
        }
    }
}

/// An environment variable read from a Secret (`valueFrom.secretKeyRef`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretEnv {
    /// The variable.
    pub name: String,
    /// The Secret.
    pub secret: String,
    /// Its key.
    pub key: String,
}

/// One container of a Job hook's pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerView {
    /// Which list it is in.
    pub kind: ContainerKind,
    /// Its position in that list (0-based).
    pub index: usize,
    /// `name`.
    pub name: String,
    /// `image`, as written.
    pub image: String,
    /// `command` (replaces the image's entrypoint); empty: the image's.
    pub command: Vec<String>,
    /// `args`; empty: the image's.
    pub args: Vec<String>,
    /// `securityContext.privileged: true`.
    pub privileged: bool,
    /// `securityContext.allowPrivilegeEscalation`, when written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_privilege_escalation: Option<bool>,
    /// `securityContext.runAsUser`, when written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_as_user: Option<i64>,
    /// `securityContext.runAsNonRoot`, when written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_as_non_root: Option<bool>,
    /// `securityContext.capabilities.add`.
    pub add_capabilities: Vec<String>,
    /// Variables read from Secrets (`env[].valueFrom.secretKeyRef`).
    pub secret_env: Vec<SecretEnv>,
    /// Secrets whose every key becomes a variable (`envFrom[].secretRef`).
    pub env_from_secrets: Vec<String>,
    /// `volumeMounts` of the pod's Secret, projected and hostPath volumes: `volume at path`.
    pub sensitive_mounts: Vec<String>,
}

/// A `hostPath` volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HostPathVolume {
    /// The volume's name.
    pub volume: String,
    /// The directory or file of the node.
    pub path: String,
}

/// A volume that holds a Secret (`secret`, or a `projected` source `secret`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretVolume {
    /// The volume's name.
    pub volume: String,
    /// The Secret.
    pub secret: String,
}

/// A projected service-account token (`projected.sources[].serviceAccountToken`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenVolume {
    /// The volume's name.
    pub volume: String,
    /// `audience`, when written (default: the API server's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// `expirationSeconds`, when written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expiration_seconds: Option<i64>,
}

/// Everything a Job hook runs and may reach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JobView {
    /// The namespace the Job is created in.
    pub namespace: String,
    /// Every container: `initContainers` first (they run first), then `containers`, then
    /// `ephemeralContainers`.
    pub containers: Vec<ContainerView>,
    /// `serviceAccountName` (or the deprecated `serviceAccount`); `default` when unnamed:
    /// the pod runs as the namespace's `default` service account.
    pub service_account: String,
    /// `automountServiceAccountToken: false` (otherwise the token is mounted unless the
    /// service account opts out).
    pub automount_disabled: bool,
    /// `hostPID: true`.
    #[serde(rename = "hostPID")]
    pub host_pid: bool,
    /// `hostNetwork: true`.
    pub host_network: bool,
    /// `hostIPC: true`.
    #[serde(rename = "hostIPC")]
    pub host_ipc: bool,
    /// The pod's `securityContext.runAsUser`, when written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_as_user: Option<i64>,
    /// The pod's `securityContext.runAsNonRoot`, when written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_as_non_root: Option<bool>,
    /// `hostPath` volumes.
    pub host_paths: Vec<HostPathVolume>,
    /// Volumes holding Secrets.
    pub secret_volumes: Vec<SecretVolume>,
    /// Projected service-account tokens.
    pub token_volumes: Vec<TokenVolume>,
    /// `nodeName`: the node the pod is bound to, bypassing the scheduler.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// `nodeSelector`.
    pub node_selector: BTreeMap<String, String>,
    /// The kinds of `affinity` written (`nodeAffinity`, `podAffinity`, `podAntiAffinity`).
    pub affinity: Vec<String>,
    /// `tolerations`, one each (`key=value:Effect`, `key:Effect`, `every taint`).
    pub tolerations: Vec<String>,
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn strings(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|s| match s {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn list<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn flag(v: &Value, key: &str) -> bool {
    v.get(key).and_then(Value::as_bool) == Some(true)
}

/// A security context's `runAsUser`, `runAsNonRoot`.
fn run_as(sc: Option<&Value>) -> (Option<i64>, Option<bool>) {
    (
        sc.and_then(|s| s.get("runAsUser")).and_then(Value::as_i64),
        sc.and_then(|s| s.get("runAsNonRoot"))
            .and_then(Value::as_bool),
    )
}

fn container(
    kind: ContainerKind,
    index: usize,
    c: &Value,
    sensitive: &BTreeMap<&str, &'static str>,
) -> ContainerView {
    let sc = c.get("securityContext");
    let (run_as_user, run_as_non_root) = run_as(sc);
    let secret_env = list(c, "env")
        .iter()
        .filter_map(|e| {
            let r = e.get("valueFrom")?.get("secretKeyRef")?;
            Some(SecretEnv {
                name: str_of(e, "name").unwrap_or_default().to_string(),
                secret: str_of(r, "name").unwrap_or_default().to_string(),
                key: str_of(r, "key").unwrap_or_default().to_string(),
            })
        })
        .collect();
    let env_from_secrets = list(c, "envFrom")
        .iter()
        .filter_map(|e| str_of(e.get("secretRef")?, "name").map(str::to_string))
        .collect();
    let sensitive_mounts = list(c, "volumeMounts")
        .iter()
        .filter_map(|m| {
            let volume = str_of(m, "name")?;
            let what = sensitive.get(volume)?;
            Some(format!(
                "{what} volume {volume} at {}",
                str_of(m, "mountPath").unwrap_or("?")
            ))
        })
        .collect();
    ContainerView {
        kind,
        index,
        name: str_of(c, "name").unwrap_or_default().to_string(),
        image: str_of(c, "image").unwrap_or_default().to_string(),
        command: strings(c, "command"),
        args: strings(c, "args"),
        privileged: sc.is_some_and(|s| flag(s, "privileged")),
        allow_privilege_escalation: sc
            .and_then(|s| s.get("allowPrivilegeEscalation"))
            .and_then(Value::as_bool),
        run_as_user,
        run_as_non_root,
        add_capabilities: sc
            .and_then(|s| s.get("capabilities"))
            .map(|c| strings(c, "add"))
            .unwrap_or_default(),
        secret_env,
        env_from_secrets,
        sensitive_mounts,
    }
}

fn toleration(t: &Value) -> String {
    let key = str_of(t, "key").unwrap_or_default();
    let effect = str_of(t, "effect").unwrap_or_default();
    let exists = str_of(t, "operator") == Some("Exists");
    let mut s = match (key.is_empty(), exists) {
        (true, true) => "every taint".to_string(),
        (_, true) => key.to_string(),
        (_, false) => format!("{key}={}", str_of(t, "value").unwrap_or_default()),
    };
    if !effect.is_empty() {
        s.push(':');
        s.push_str(effect);
    } else if !(key.is_empty() && exists) {
        s.push_str(" (every effect)");
    }
    s
}

impl JobView {
    /// What the Job of `namespace` and `pod_spec` runs and may reach.
    pub fn of(namespace: &str, pod_spec: &Value) -> JobView {
        let mut host_paths = Vec::new();
        let mut secret_volumes = Vec::new();
        let mut token_volumes = Vec::new();
        // volume name → what it holds, for the containers' mounts
        let mut sensitive: BTreeMap<&str, &'static str> = BTreeMap::new();
        for v in list(pod_spec, "volumes") {
            let name = str_of(v, "name").unwrap_or_default();
            if let Some(h) = v.get("hostPath") {
                sensitive.insert(name, "hostPath");
                host_paths.push(HostPathVolume {
                    volume: name.to_string(),
                    path: str_of(h, "path").unwrap_or_default().to_string(),
                });
            }
            if let Some(s) = v.get("secret") {
                sensitive.insert(name, "Secret");
                secret_volumes.push(SecretVolume {
                    volume: name.to_string(),
                    secret: str_of(s, "secretName").unwrap_or_default().to_string(),
                });
            }
            if let Some(p) = v.get("projected") {
                sensitive.insert(name, "projected");
                for src in list(p, "sources") {
                    if let Some(s) = src.get("secret") {
                        secret_volumes.push(SecretVolume {
                            volume: name.to_string(),
                            secret: str_of(s, "name").unwrap_or_default().to_string(),
                        });
                    }
                    if let Some(t) = src.get("serviceAccountToken") {
                        token_volumes.push(TokenVolume {
                            volume: name.to_string(),
                            audience: str_of(t, "audience").map(str::to_string),
                            expiration_seconds: t.get("expirationSeconds").and_then(Value::as_i64),
                        });
                    }
                }
            }
        }
        let mut containers = Vec::new();
        for kind in [
            ContainerKind::Init,
            ContainerKind::Container,
            ContainerKind::Ephemeral,
        ] {
            for (i, c) in list(pod_spec, kind.field()).iter().enumerate() {
                containers.push(container(kind, i, c, &sensitive));
            }
        }
        let (run_as_user, run_as_non_root) = run_as(pod_spec.get("securityContext"));
        let affinity = pod_spec
            .get("affinity")
            .and_then(Value::as_object)
            .map(|a| a.keys().cloned().collect())
            .unwrap_or_default();
        JobView {
            namespace: namespace.to_string(),
            containers,
            service_account: str_of(pod_spec, "serviceAccountName")
                .or_else(|| str_of(pod_spec, "serviceAccount"))
                .filter(|s| !s.is_empty())
                .unwrap_or("default")
                .to_string(),
            automount_disabled: pod_spec
                .get("automountServiceAccountToken")
                .and_then(Value::as_bool)
                == Some(false),
            host_pid: flag(pod_spec, "hostPID"),
            host_network: flag(pod_spec, "hostNetwork"),
            host_ipc: flag(pod_spec, "hostIPC"),
            run_as_user,
            run_as_non_root,
            host_paths,
            secret_volumes,
            token_volumes,
            node_name: str_of(pod_spec, "nodeName")
                .filter(|s| !s.is_empty())
                .map(str::to_string),
            node_selector: pod_spec
                .get("nodeSelector")
                .and_then(Value::as_object)
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                        .collect()
                })
                .unwrap_or_default(),
            affinity,
            tolerations: list(pod_spec, "tolerations")
                .iter()
                .map(toleration)
                .collect(),
        }
    }

    /// The host namespaces the pod joins (`hostPID`, `hostNetwork`, `hostIPC`).
    pub fn host_namespaces(&self) -> Vec<&'static str> {
        [
            (self.host_pid, "hostPID"),
            (self.host_network, "hostNetwork"),
            (self.host_ipc, "hostIPC"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }

    /// One line per container, then one for the pod: what signers read under the hook.
    /// `init config-init: docker.io/rook/ceph@sha256:… command ["toolbox.sh"]; env X from
    /// Secret s key k` … `pod: service account default; hostPID; hostPath / (volume root)`.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self.containers.iter().map(container_line).collect();
        out.push(self.pod_line());
        out
    }

    fn pod_line(&self) -> String {
        let mut parts = vec![format!(
            "service account {}{}",
            self.service_account,
            if self.automount_disabled {
                " (automountServiceAccountToken: false)"
            } else {
                ""
            }
        )];
        parts.extend(self.host_namespaces().into_iter().map(str::to_string));
        if let Some(u) = self.run_as_user {
            parts.push(format!("runAsUser {u}"));
        }
        if let Some(n) = self.run_as_non_root {
            parts.push(format!("runAsNonRoot: {n}"));
        }
        for h in &self.host_paths {
            parts.push(format!("hostPath {} (volume {})", h.path, h.volume));
        }
        for s in &self.secret_volumes {
            parts.push(format!("Secret {} (volume {})", s.secret, s.volume));
        }
        for t in &self.token_volumes {
            let mut s = format!("service-account token (volume {}", t.volume);
            if let Some(a) = &t.audience {
                s.push_str(&format!(", audience {a}"));
            }
            if let Some(e) = t.expiration_seconds {
                s.push_str(&format!(", expires after {e}s"));
            }
            s.push(')');
            parts.push(s);
        }
        if let Some(n) = &self.node_name {
            parts.push(format!("nodeName {n}"));
        }
        if !self.node_selector.is_empty() {
            let sel: Vec<String> = self
                .node_selector
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            parts.push(format!("nodeSelector {}", sel.join(",")));
        }
        if !self.affinity.is_empty() {
            parts.push(format!("affinity {}", self.affinity.join(", ")));
        }
        if !self.tolerations.is_empty() {
            parts.push(format!("tolerates {}", self.tolerations.join(", ")));
        }
        format!("pod: {}", parts.join("; "))
    }
}

fn json_list(v: &[String]) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

fn container_line(c: &ContainerView) -> String {
    let mut head = format!("{} {}: {}", c.kind.word(), c.name, c.image);
    if !c.command.is_empty() {
        head.push_str(&format!(" command {}", json_list(&c.command)));
    }
    if !c.args.is_empty() {
        head.push_str(&format!(" args {}", json_list(&c.args)));
    }
    let mut parts = vec![head];
    if c.privileged {
        parts.push("privileged".into());
    }
    if let Some(a) = c.allow_privilege_escalation {
        parts.push(format!("allowPrivilegeEscalation: {a}"));
    }
    if let Some(u) = c.run_as_user {
        parts.push(format!("runAsUser {u}"));
    }
    if let Some(n) = c.run_as_non_root {
        parts.push(format!("runAsNonRoot: {n}"));
    }
    if !c.add_capabilities.is_empty() {
        parts.push(format!(
            "adds capabilities {}",
            c.add_capabilities.join(", ")
        ));
    }
    for e in &c.secret_env {
        parts.push(format!(
            "env {} from Secret {} key {}",
            e.name, e.secret, e.key
        ));
    }
    for s in &c.env_from_secrets {
        parts.push(format!("env from Secret {s}"));
    }
    parts.extend(c.sensitive_mounts.iter().map(|m| format!("mounts {m}")));
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every field a signer must see is rendered (issue #49 item 6: before, only the
    /// namespace and the `containers` images were).
    #[test]
    fn every_dangerous_field_is_rendered() {
        let pod = json!({
            "serviceAccountName": "cluster-admin-sa",
            "hostPID": true,
            "hostNetwork": true,
            "hostIPC": true,
            "nodeName": "cp-1",
            "nodeSelector": {"kubernetes.io/hostname": "cp-1"},
            "affinity": {"nodeAffinity": {}},
            "tolerations": [
                {"operator": "Exists"},
                {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"},
            ],
            "securityContext": {"runAsUser": 0, "runAsNonRoot": false},
            "initContainers": [{
                "name": "sneaky", "image": "evil.example/x:latest",
                "command": ["sh", "-c"], "args": ["nsenter -t 1 -m -- sh"],
                "securityContext": {"privileged": true, "allowPrivilegeEscalation": true,
                                    "capabilities": {"add": ["SYS_ADMIN", "NET_ADMIN"]}},
            }],
            "containers": [{
                "name": "main", "image": "busybox@sha256:0000000000000000000000000000000000000000000000000000000000000000",
                "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}],
                "envFrom": [{"secretRef": {"name": "all-of-it"}}],
                "volumeMounts": [{"name": "root", "mountPath": "/host"}, {"name": "tok", "mountPath": "/var/run/t"}],
            }],
            "volumes": [
                {"name": "root", "hostPath": {"path": "/"}},
                {"name": "keys", "secret": {"secretName": "talos-keys"}},
                {"name": "tok", "projected": {"sources": [
                    {"serviceAccountToken": {"audience": "vault", "expirationSeconds": 3600}},
                    {"secret": {"name": "more"}},
                ]}},
            ],
        });
        let view = JobView::of("kube-system", &pod);
        let lines = view.lines();
        let text = lines.join("\n");
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(
            lines[0],
            "init sneaky: evil.example/x:latest command [\"sh\",\"-c\"] args [\"nsenter -t 1 -m -- sh\"]; privileged; allowPrivilegeEscalation: true; adds capabilities SYS_ADMIN, NET_ADMIN"
        );
        assert_eq!(
            lines[1],
            "container main: busybox@sha256:0000000000000000000000000000000000000000000000000000000000000000; env TOKEN from Secret db key password; env from Secret all-of-it; mounts hostPath volume root at /host; mounts projected volume tok at /var/run/t"
        );
        assert_eq!(
            lines[2],
            "pod: service account cluster-admin-sa; hostPID; hostNetwork; hostIPC; runAsUser 0; runAsNonRoot: false; hostPath / (volume root); Secret talos-keys (volume keys); Secret more (volume tok); service-account token (volume tok, audience vault, expires after 3600s); nodeName cp-1; nodeSelector kubernetes.io/hostname=cp-1; affinity nodeAffinity; tolerates every taint, node-role.kubernetes.io/control-plane:NoSchedule"
        );
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(json["containers"][0]["kind"], "init");
        assert_eq!(json["containers"][0]["privileged"], true);
        assert_eq!(json["hostPaths"][0]["path"], "/");
        assert_eq!(json["serviceAccount"], "cluster-admin-sa");
        assert_eq!(json["nodeName"], "cp-1");
        assert_eq!(json["containers"][1]["secretEnv"][0]["secret"], "db");
    }

    #[test]
    fn a_plain_pod_says_it_runs_as_the_default_service_account() {
        let view = JobView::of(
            "rook-ceph",
            &json!({"automountServiceAccountToken": false,
                    "containers": [{"name": "c", "image": "busybox"}]}),
        );
        assert_eq!(
            view.lines(),
            [
                "container c: busybox",
                "pod: service account default (automountServiceAccountToken: false)"
            ]
        );
        assert!(view.host_namespaces().is_empty());
    }
}
