//! The server's Job-hook policy (issue #49 item 6): what a Job hook's pod may ask for. Pure.
//!
//! A Job hook runs with medea's cluster credentials, and its pod spec comes from whoever can
//! commit to the desired-state repository. So the server, never the repository, bounds it:
//! `medea serve` flags ([`HookPolicy`]), safe by default. Refused unless the server allows
//! it: a privileged container or a capability beyond the Pod Security Standards' baseline
//! set (kubernetes `pod-security-admission/policy/check_privileged.go`,
//! `check_capabilities_baseline.go`), the host's PID, network or IPC namespace
//! (`check_hostNamespaces.go`), a `hostPath` volume (`check_hostPathVolumes.go`), a
//! namespace outside the server's list (none by default: Job hooks are off until the server
//! names where they may run), and an image not pinned by digest (`@sha256:`: a tag can be
//! moved after the plan was signed, a digest cannot, so what was signed is what runs).
//!
//! The policy is checked twice: when the server loads a revision ([`HookPolicy::check`]: a
//! located error diagnostic, so the revision is never planned), and by the executor right
//! before it creates the Job ([`HookPolicy::refusals`]: the hook fails, the job halts
//! `hook_failed`), for plans made elsewhere or before the policy changed.

use std::collections::BTreeSet;
use std::fmt;

use super::diagnostic::{Diagnostic, codes};
use super::hook_view::{ContainerView, JobView};
use super::hooks::{Hook, HookAction, HookOrigins, HookPoint, Hooks};
use super::model::{Desired, Origin};

/// The flag that lets Job hooks run in a namespace (repeatable).
pub const FLAG_NAMESPACE: &str = "--hook-namespace";
/// The flag that allows privileged containers and capabilities beyond the baseline set.
pub const FLAG_PRIVILEGED: &str = "--hook-allow-privileged";
/// The flag that allows `hostPID`, `hostNetwork` and `hostIPC`.
pub const FLAG_HOST_NAMESPACES: &str = "--hook-allow-host-namespaces";
/// The flag that allows `hostPath` volumes.
pub const FLAG_HOST_PATH: &str = "--hook-allow-host-path";
/// The flag that allows images without a digest.
pub const FLAG_UNPINNED: &str = "--hook-allow-unpinned-images";

/// Capabilities a container may add without [`FLAG_PRIVILEGED`]: the Pod Security
/// Standards' baseline set (`check_capabilities_baseline.go`, `capabilities_allowed_1_0`).
pub const BASELINE_CAPABILITIES: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// What the server lets a Job hook's pod do. The default refuses everything it can:
/// no namespace, nothing privileged, no host namespace or path, digests only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HookPolicy {
    /// Namespaces Job hooks may run in ([`FLAG_NAMESPACE`]); empty: none.
    pub namespaces: BTreeSet<String>,
    /// Privileged containers and added capabilities beyond the baseline ([`FLAG_PRIVILEGED`]).
    pub allow_privileged: bool,
    /// `hostPID`, `hostNetwork`, `hostIPC` ([`FLAG_HOST_NAMESPACES`]).
    pub allow_host_namespaces: bool,
    /// `hostPath` volumes ([`FLAG_HOST_PATH`]).
    pub allow_host_path: bool,
    /// Images without a `@sha256:` digest ([`FLAG_UNPINNED`]).
    pub allow_unpinned_images: bool,
}

/// One thing the policy refuses in a Job hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The pod spec's field (`containers[0].securityContext.privileged`), or `job.namespace`.
    pub field: String,
    /// What it asks for, for a person.
    pub what: String,
    /// The `medea serve` flag that would allow it.
    pub allow: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (`{}`)", self.what, self.field)
    }
}

fn is_pinned(image: &str) -> bool {
    crate::image::ImageRef::parse(image)
        .ok()
        .and_then(|r| r.digest().map(|d| d.starts_with("sha256:")))
        == Some(true)
}

impl HookPolicy {
    /// Everything allowed in every namespace listed (tests and the rehearsal's twin).
    pub fn permissive(namespaces: impl IntoIterator<Item = impl Into<String>>) -> HookPolicy {
        HookPolicy {
            namespaces: namespaces.into_iter().map(Into::into).collect(),
            allow_privileged: true,
            allow_host_namespaces: true,
            allow_host_path: true,
            allow_unpinned_images: true,
        }
    }

    /// What the policy refuses in `hook` (nothing for an HTTP hook).
    pub fn refusals(&self, hook: &Hook) -> Vec<Refusal> {
        match &hook.action {
            HookAction::Http { .. } => Vec::new(),
            HookAction::Job {
                namespace,
                pod_spec,
                ..
            } => self.refusals_of(&JobView::of(namespace, pod_spec)),
        }
    }

    /// What the policy refuses in the Job `view` describes.
    pub fn refusals_of(&self, view: &JobView) -> Vec<Refusal> {
        let mut out = Vec::new();
        if !self.namespaces.contains(&view.namespace) {
            out.push(Refusal {
                field: "job.namespace".into(),
                what: format!(
                    "namespace `{}` is not one this server runs Job hooks in ({})",
                    view.namespace,
                    if self.namespaces.is_empty() {
                        "it allows none".to_string()
                    } else {
                        format!(
                            "it allows {}",
                            self.namespaces
                                .iter()
                                .map(|n| format!("`{n}`"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    }
                ),
                allow: format!("{FLAG_NAMESPACE} {}", view.namespace),
            });
        }
        for c in &view.containers {
            self.container(c, &mut out);
        }
        if !self.allow_host_namespaces {
            for ns in view.host_namespaces() {
                out.push(Refusal {
                    field: ns.to_string(),
                    what: format!("the pod joins the node's namespace (`{ns}: true`)"),
                    allow: FLAG_HOST_NAMESPACES.into(),
                });
            }
        }
        if !self.allow_host_path {
            for h in &view.host_paths {
                out.push(Refusal {
                    field: format!("volumes[{}].hostPath", h.volume),
                    what: format!("volume `{}` mounts the node's `{}`", h.volume, h.path),
                    allow: FLAG_HOST_PATH.into(),
                });
            }
        }
        out
    }

    fn container(&self, c: &ContainerView, out: &mut Vec<Refusal>) {
        let at = format!("{}[{}]", c.kind.field(), c.index);
        if !self.allow_privileged {
            if c.privileged {
                out.push(Refusal {
                    field: format!("{at}.securityContext.privileged"),
                    what: format!("container `{}` is privileged", c.name),
                    allow: FLAG_PRIVILEGED.into(),
                });
            }
            let extra: Vec<&str> = c
                .add_capabilities
                .iter()
                .map(String::as_str)
                .filter(|cap| !BASELINE_CAPABILITIES.contains(cap))
                .collect();
            if !extra.is_empty() {
                out.push(Refusal {
                    field: format!("{at}.securityContext.capabilities.add"),
                    what: format!(
                        "container `{}` adds {} beyond the baseline set",
                        c.name,
                        extra.join(", ")
                    ),
                    allow: FLAG_PRIVILEGED.into(),
                });
            }
        }
        if !self.allow_unpinned_images && !is_pinned(&c.image) {
            out.push(Refusal {
                field: format!("{at}.image"),
                what: format!(
                    "container `{}` image `{}` is not pinned by digest (`@sha256:`)",
                    c.name, c.image
                ),
                allow: FLAG_UNPINNED.into(),
            });
        }
    }

    /// Error diagnostics for every Job hook of `desired` the policy refuses, each located at
    /// the hook's `podSpec` (or its resource when no origin was kept) and naming the field,
    /// the hook and the server flag that would allow it.
    pub fn check(&self, desired: &Desired) -> Vec<Diagnostic> {
        let mut out = Vec::new();
        for cluster in desired.clusters.values() {
            let what = format!("Cluster `{}`", cluster.name.value);
            self.check_hooks(
                &mut out,
                &what,
                &cluster.hooks,
                &cluster.hook_origins,
                &cluster.name.origin,
            );
            for pool in cluster.pools.values() {
                let what = format!("NodePool `{}`", pool.name.value);
                self.check_hooks(
                    &mut out,
                    &what,
                    &pool.hooks,
                    &pool.hook_origins,
                    &pool.name.origin,
                );
            }
        }
        out
    }

    fn check_hooks(
        &self,
        out: &mut Vec<Diagnostic>,
        resource: &str,
        hooks: &Hooks,
        origins: &HookOrigins,
        fallback: &Origin,
    ) {
        for point in HookPoint::ALL {
            for hook in hooks.at(point) {
                let origin = origins.get(&(point, hook.name.clone())).unwrap_or(fallback);
                for r in self.refusals(hook) {
                    out.push(
                        Diagnostic::error(
                            codes::HOOK_POLICY,
                            origin.clone(),
                            format!(
                                "{resource} `hooks.{point}` hook `{}`: {r}, which this server's hook policy refuses",
                                hook.name
                            ),
                        )
                        .with_help(format!(
                            "change the hook, or have the server allow it: `medea serve {}` (a server setting, never the repository's; README, \"Job hook policy\")",
                            r.allow
                        )),
                    );
                }
            }
        }
    }

    /// One line for the server's log: what the policy allows.
    pub fn summary(&self) -> String {
        let ns = if self.namespaces.is_empty() {
            "none".to_string()
        } else {
            self.namespaces
                .iter()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        };
        let yes = |b: bool| if b { "allowed" } else { "refused" };
        format!(
            "Job hook namespaces: {ns}; privileged {}; host namespaces {}; hostPath {}; unpinned images {}",
            yes(self.allow_privileged),
            yes(self.allow_host_namespaces),
            yes(self.allow_host_path),
            yes(self.allow_unpinned_images)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const PINNED: &str = "docker.io/rook/ceph:v1.17.5@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn job(namespace: &str, pod: serde_json::Value) -> Hook {
        Hook {
            name: "h".into(),
            timeout: std::time::Duration::from_secs(60),
            idempotent: false,
            action: HookAction::Job {
                namespace: namespace.into(),
                pod_spec: pod,
                ttl_seconds_after_finished: crate::desired::hooks::DEFAULT_HOOK_JOB_TTL_SECS,
            },
        }
    }

    fn allowing(ns: &str) -> HookPolicy {
        HookPolicy {
            namespaces: [ns.to_string()].into(),
            ..HookPolicy::default()
        }
    }

    fn fields(p: &HookPolicy, h: &Hook) -> Vec<String> {
        p.refusals(h).into_iter().map(|r| r.field).collect()
    }

    #[test]
    fn a_pinned_plain_job_in_an_allowed_namespace_passes_and_nothing_else_does_by_default() {
        let h = job(
            "rook-ceph",
            json!({"containers": [{"name": "c", "image": PINNED}]}),
        );
        assert!(allowing("rook-ceph").refusals(&h).is_empty());
        // the default allows no namespace
        let r = HookPolicy::default().refusals(&h);
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r[0].field, "job.namespace");
        assert_eq!(r[0].allow, "--hook-namespace rook-ceph");
        assert!(r[0].what.contains("it allows none"), "{}", r[0].what);
        // and HTTP hooks are not Job hooks
        let http = Hook {
            action: HookAction::Http {
                url: "https://x/".into(),
                credential: None,
            },
            ..h
        };
        assert!(HookPolicy::default().refusals(&http).is_empty());
    }

    /// Each dangerous field is refused by default with the flag that allows it, and allowed
    /// when the server allows it.
    #[test]
    fn each_refusal_is_lifted_by_its_own_flag() {
        type Allow = fn(&mut HookPolicy);
        let cases: [(serde_json::Value, &str, &str, Allow); 7] = [
            (
                json!({"containers": [{"name": "c", "image": PINNED, "securityContext": {"privileged": true}}]}),
                "containers[0].securityContext.privileged",
                FLAG_PRIVILEGED,
                |p| p.allow_privileged = true,
            ),
            (
                json!({"initContainers": [{"name": "i", "image": PINNED, "securityContext": {"capabilities": {"add": ["CHOWN", "SYS_ADMIN"]}}}],
                       "containers": [{"name": "c", "image": PINNED}]}),
                "initContainers[0].securityContext.capabilities.add",
                FLAG_PRIVILEGED,
                |p| p.allow_privileged = true,
            ),
            (
                json!({"hostPID": true, "containers": [{"name": "c", "image": PINNED}]}),
                "hostPID",
                FLAG_HOST_NAMESPACES,
                |p| p.allow_host_namespaces = true,
            ),
            (
                json!({"hostNetwork": true, "containers": [{"name": "c", "image": PINNED}]}),
                "hostNetwork",
                FLAG_HOST_NAMESPACES,
                |p| p.allow_host_namespaces = true,
            ),
            (
                json!({"containers": [{"name": "c", "image": PINNED}],
                       "volumes": [{"name": "root", "hostPath": {"path": "/"}}]}),
                "volumes[root].hostPath",
                FLAG_HOST_PATH,
                |p| p.allow_host_path = true,
            ),
            (
                json!({"containers": [{"name": "c", "image": "docker.io/rook/ceph:v1.17.5"}]}),
                "containers[0].image",
                FLAG_UNPINNED,
                |p| p.allow_unpinned_images = true,
            ),
            (
                json!({"initContainers": [{"name": "i", "image": "busybox"}],
                       "containers": [{"name": "c", "image": PINNED}]}),
                "initContainers[0].image",
                FLAG_UNPINNED,
                |p| p.allow_unpinned_images = true,
            ),
        ];
        for (pod, field, flag, allow) in cases {
            let h = job("rook-ceph", pod);
            let mut p = allowing("rook-ceph");
            let refused = p.refusals(&h);
            assert_eq!(
                refused.iter().map(|r| r.field.as_str()).collect::<Vec<_>>(),
                [field],
                "{field}"
            );
            assert_eq!(refused[0].allow, flag);
            allow(&mut p);
            assert!(fields(&p, &h).is_empty(), "{field} allowed by {flag}");
        }
        // the baseline capabilities need no flag
        let h = job(
            "rook-ceph",
            json!({"containers": [{"name": "c", "image": PINNED,
                   "securityContext": {"capabilities": {"add": ["CHOWN", "NET_BIND_SERVICE"]}}}]}),
        );
        assert!(fields(&allowing("rook-ceph"), &h).is_empty());
        // a tag is not a pin, nor is a digest of another algorithm
        assert!(!is_pinned("busybox:1.36"));
        assert!(is_pinned(PINNED));
        assert!(!is_pinned("not an image@sha256:00"));
    }
}
