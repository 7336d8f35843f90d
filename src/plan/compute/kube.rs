//! Stage 5: the Kubernetes step: at most one minor forward, placed at the latest position
//! among the Talos steps at which every node supports the running Kubernetes.

use std::collections::{BTreeMap, BTreeSet};

use crate::plan::catalog::Window;

use super::*;

/// Why the Kubernetes step cannot go at some position.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Violation {
    /// When the Kubernetes step runs, these nodes run a Talos that does not support the target.
    KubeStep {
        talos: TalosVersion,
        nodes: Vec<String>,
        /// The Kubernetes target of the step and the window `talos` supports.
        kube: KubeVersion,
        window: Window,
    },
    /// A Talos hop's target does not support the Kubernetes running at that point.
    Hop {
        step: usize,
        kube: KubeVersion,
        /// The window the hop's target Talos supports.
        window: Window,
    },
    /// A Talos minor without a support window in the catalog.
    UnknownMinor {
        minor: (u64, u64),
        /// The Talos step that needs it, or `None` for the Kubernetes step.
        step: Option<usize>,
    },
    /// Nodes whose Talos version is unknown when the Kubernetes step needs it.
    UnknownNodes { nodes: Vec<String> },
}

impl<'a> ClusterCtx<'a> {
    /// `(running Kubernetes, its rollout if the version changes)`, or `None` on error.
    pub(super) fn kubernetes(&mut self) -> Option<(KubeVersion, Option<KubeRollout>)> {
        let key = &self.cluster.kubernetes_version;
        let target = &key.value;
        let Some(now) = self.obs.kubernetes_version.clone() else {
            self.diags.push(
                Diagnostic::error(
                    codes::UNOBSERVED,
                    key.origin.clone(),
                    format!(
                        "the Kubernetes version of cluster `{}` is unknown (its kube-apiserver did not answer at the last refresh)",
                        self.name()
                    ),
                )
                .with_help("medea cannot plan what it cannot see: refresh the inventory once the API server answers"),
            );
            return None;
        };
        let mut ok = true;
        if target < &now {
            self.diags.push(
                Diagnostic::error(
                    codes::KUBERNETES_DOWNGRADE,
                    key.origin.clone(),
                    format!("Kubernetes downgrade refused: cluster `{}` runs {now}, newer than {target}", self.name()),
                )
                .with_label("older than the running version")
                .with_help(format!(
                    "medea never moves Kubernetes backwards (the API server would be older than the kubelets and the stored objects); set the version to {now} or newer"
                )),
            );
            ok = false;
        } else if !target.within_one_minor_of(&now) {
            let next = now.next_minor();
            let next = format!("v{}.{}", next.major(), next.minor());
            self.diags.push(
                Diagnostic::error(
                    codes::KUBERNETES_SKEW,
                    key.origin.clone(),
                    format!(
                        "Kubernetes moves at most one minor per rollout: {now} → {target} skips {}",
                        skipped(&now, target)
                    ),
                )
                .with_label("more than one minor ahead")
                .with_help(format!(
                    "set the version to the newest {next}.x patch first, approve and roll that, then move on"
                )),
            );
            ok = false;
        }
        // kubelet ≤ kube-apiserver when the plan ends, and within the 3-minor skew policy.
        let end = if ok && target != &now { target } else { &now };
        let changing = ok && target != &now;
        for m in self.obs.machines.values() {
            let Some(kubelet) = &m.kubelet_version else {
                continue;
            };
            if kubelet > end {
                self.diags.push(
                    Diagnostic::error(
                        codes::KUBELET_SKEW,
                        key.origin.clone(),
                        format!(
                            "machine `{}` runs kubelet {kubelet}, newer than the kube-apiserver {end} this plan ends with",
                            m.node
                        ),
                    )
                    .with_help(format!(
                        "kubelet must never be newer than kube-apiserver: set the version to {kubelet} or newer"
                    )),
                );
                ok = false;
            } else if changing
                && kubelet.major() == end.major()
                && kubelet.minor() + 3 < end.minor()
            {
                self.diags.push(
                    Diagnostic::error(
                        codes::KUBELET_SKEW,
                        key.origin.clone(),
                        format!(
                            "machine `{}` runs kubelet {kubelet}, more than three minors older than Kubernetes {end}",
                            m.node
                        ),
                    )
                    .with_help("the Kubernetes skew policy allows kubelets at most three minors behind the API server; bring that node's kubelet up first"),
                );
                ok = false;
            }
        }
        if !ok {
            return None;
        }
        if !changing {
            return Some((now, None));
        }
        let unreachable: Vec<&str> = self
            .obs
            .machines
            .values()
            .filter(|m| !m.reachable)
            .map(|m| m.node.as_str())
            .collect();
        if !unreachable.is_empty() {
            self.diags.push(
                Diagnostic::error(
                    codes::UNOBSERVED,
                    key.origin.clone(),
                    format!(
                        "a Kubernetes rollout updates every node, but {} did not answer at the last refresh",
                        unreachable.join(", ")
                    ),
                )
                .with_help("medea cannot plan what it cannot see: bring the nodes back and refresh the inventory"),
            );
            return None;
        }
        let by_role = |r: MachineRole| -> Vec<String> {
            self.obs
                .machines
                .values()
                .filter(|m| m.role == r)
                .map(|m| m.node.clone())
                .collect()
        };
        Some((
            now.clone(),
            Some(KubeRollout {
                from: now,
                to: target.clone(),
                control_plane: by_role(MachineRole::Controlplane),
                workers: by_role(MachineRole::Worker),
                health_timeout: self.cluster.rollout.health_timeout,
                supported_talos: Some(self.catalog.talos_minors_supporting(target)),
            }),
        ))
    }

    /// Insert the Kubernetes step at the latest position where every node stays inside its
    /// support window; check the Talos hops against the running Kubernetes either way.
    pub(super) fn place_kubernetes(
        &mut self,
        talos: Vec<TalosRollout>,
        k_now: &KubeVersion,
        kstep: Option<KubeRollout>,
    ) -> Option<Vec<Step>> {
        // The first position tried (Kubernetes last, or no Kubernetes step) is the one whose
        // violations are reported when no position works.
        let (first, rest): (Option<usize>, Vec<Option<usize>>) = match &kstep {
            None => (None, Vec::new()),
            Some(_) => (
                Some(talos.len()),
                (0..talos.len()).rev().map(Some).collect(),
            ),
        };
        let target = kstep.as_ref().map(|k| &k.to);
        let violations = self.violations(&talos, k_now, target, first);
        let found = if violations.is_empty() {
            Some(first)
        } else {
            rest.into_iter()
                .find(|&pos| self.violations(&talos, k_now, target, pos).is_empty())
        };
        if let Some(pos) = found {
            let mut steps: Vec<Step> = talos.into_iter().map(Step::Talos).collect();
            if let (Some(p), Some(k)) = (pos, kstep) {
                steps.insert(p, Step::Kubernetes(k));
            }
            return Some(steps);
        }
        let tried_all = kstep.is_some() && !talos.is_empty();
        for v in violations {
            let d = self.violation_diag(&talos, k_now, target, v, tried_all);
            self.diags.push(d);
        }
        None
    }

    /// Simulate the steps with the Kubernetes step at `pos` (`None`: no Kubernetes step).
    fn violations<'s>(
        &'s self,
        talos: &'s [TalosRollout],
        k_now: &KubeVersion,
        target: Option<&KubeVersion>,
        pos: Option<usize>,
    ) -> Vec<Violation> {
        let mut state: BTreeMap<&'s str, Option<TalosVersion>> = self
            .obs
            .machines
            .values()
            .map(|m| (m.node.as_str(), m.talos_version.clone()))
            .collect();
        let mut k = k_now.clone();
        let mut out = BTreeSet::new();
        for i in 0..=talos.len() {
            if pos == Some(i)
                && let Some(kt) = target
            {
                let mut unsupported: BTreeMap<TalosVersion, (Window, Vec<String>)> =
                    BTreeMap::new();
                let mut unknown = Vec::new();
                for (node, v) in &state {
                    let Some(v) = v else {
                        unknown.push(node.to_string());
                        continue;
                    };
                    match self.catalog.window(v.minor_line()) {
                        None => {
                            out.insert(Violation::UnknownMinor {
                                minor: v.minor_line(),
                                step: None,
                            });
                        }
                        Some(w) if !w.contains(kt) => unsupported
                            .entry(v.clone())
                            .or_insert_with(|| (w, Vec::new()))
                            .1
                            .push(node.to_string()),
                        Some(_) => {}
                    }
                }
                if !unknown.is_empty() {
                    out.insert(Violation::UnknownNodes { nodes: unknown });
                }
                for (talos, (window, nodes)) in unsupported {
                    out.insert(Violation::KubeStep {
                        talos,
                        nodes,
                        kube: kt.clone(),
                        window,
                    });
                }
                k = kt.clone();
            }
            let Some(step) = talos.get(i) else { break };
            match self.catalog.window(step.to.minor_line()) {
                None => {
                    out.insert(Violation::UnknownMinor {
                        minor: step.to.minor_line(),
                        step: Some(i),
                    });
                }
                Some(w) if !w.contains(&k) => {
                    out.insert(Violation::Hop {
                        step: i,
                        kube: k.clone(),
                        window: w,
                    });
                }
                Some(_) => {}
            }
            for m in step.waves.iter().flatten() {
                state.insert(m.node.as_str(), Some(step.to.clone()));
            }
        }
        out.into_iter().collect()
    }

    fn violation_diag(
        &self,
        talos: &[TalosRollout],
        k_now: &KubeVersion,
        target: Option<&KubeVersion>,
        v: Violation,
        tried_all: bool,
    ) -> Diagnostic {
        let kube_key = &self.cluster.kubernetes_version;
        let moved = if tried_all {
            " (medea tried the Kubernetes rollout before, between and after the Talos steps; none keeps every node inside its support window)"
        } else {
            ""
        };
        match v {
            Violation::KubeStep {
                talos: tv,
                nodes,
                kube: kt,
                window: w,
            } => {
                Diagnostic::error(
                    codes::KUBERNETES_UNSUPPORTED,
                    kube_key.origin.clone(),
                    format!(
                        "Kubernetes {kt} is not supported by Talos {tv}, which {} would run when the Kubernetes rollout starts",
                        machines_text(&nodes)
                    ),
                )
                .with_label("target Kubernetes version")
                .with_help(format!(
                    "Talos {}.{} supports {w}; upgrade those machines to a Talos release that supports Kubernetes {}.{}, or choose a Kubernetes version in that range{moved}",
                    tv.major(),
                    tv.minor(),
                    kt.major(),
                    kt.minor()
                ))
            }
            Violation::Hop {
                step,
                kube,
                window: w,
            } => {
                let s = &talos[step];
                let pool = &self.cluster.pools[&s.pool];
                let hint = if &kube == k_now {
                    "roll Kubernetes into that range first (its own plan), or stop the pool at an earlier Talos minor"
                } else {
                    "choose a Kubernetes version this Talos supports, or stop the pool at an earlier Talos minor"
                };
                Diagnostic::error(
                    codes::KUBERNETES_UNSUPPORTED,
                    pool.talos_version.origin.clone(),
                    format!(
                        "Talos {} (hop {}/{} of node pool `{}`) does not support Kubernetes {kube}, which cluster `{}` runs at that point",
                        s.to, s.hop, s.hops, s.pool, self.name()
                    ),
                )
                .with_help(format!(
                    "Talos {}.{} supports {w}; {hint}{moved}",
                    s.to.major(),
                    s.to.minor()
                ))
            }
            Violation::UnknownMinor { minor, step } => {
                let origin = match step {
                    Some(i) => self.cluster.pools[&talos[i].pool].talos_version.origin.clone(),
                    None => kube_key.origin.clone(),
                };
                Diagnostic::error(
                    codes::CATALOG,
                    origin,
                    format!(
                        "Talos {}.{} is not in medea's compatibility catalog ({}), so the Kubernetes versions it supports are unknown",
                        minor.0,
                        minor.1,
                        self.catalog.version()
                    ),
                )
                .with_help(format!(
                    "add `upgradePolicy.kubernetesSupport: [{{talos: v{}.{}, minKubernetes: v1.X, maxKubernetes: v1.Y}}]` to cluster `{}`, with the range from the Talos support matrix",
                    minor.0,
                    minor.1,
                    self.name()
                ))
            }
            Violation::UnknownNodes { nodes } => Diagnostic::error(
                codes::UNOBSERVED,
                kube_key.origin.clone(),
                format!(
                    "the Talos version of {} is unknown, so medea cannot check that {} Kubernetes {}",
                    machines_text(&nodes),
                    if nodes.len() == 1 { "it supports" } else { "they support" },
                    target.map(|t| t.to_string()).unwrap_or_default()
                ),
            )
            .with_help("medea cannot plan what it cannot see: bring the nodes back and refresh the inventory"),
        }
    }
}

fn skipped(now: &KubeVersion, target: &KubeVersion) -> String {
    if target.major() != now.major() {
        return format!("a major version ({} → {})", now.major(), target.major());
    }
    let minors: Vec<String> = (now.minor() + 1..target.minor())
        .map(|m| format!("{}.{m}", now.major()))
        .collect();
    minors.join(", ")
}
