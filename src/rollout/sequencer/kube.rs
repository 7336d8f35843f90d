//! The Kubernetes step (the upgrade-k8s sequence): image helpers, the task loop and the
//! control-plane health gate before each component.

use super::*;

pub(super) fn kube_of(j: &Job, si: usize) -> &KubeStep {
    match &j.steps[si].kind {
        StepKind::Kubernetes(k) => k,
        StepKind::Talos(_) => unreachable!("step {si} is a Kubernetes step"),
    }
}

pub(super) fn kube_mut(j: &mut Job, si: usize) -> &mut KubeStep {
    match &mut j.steps[si].kind {
        StepKind::Kubernetes(k) => k,
        StepKind::Talos(_) => unreachable!("step {si} is a Kubernetes step"),
    }
}

/// `repo:tag` without a digest: (repository, tag).
pub fn split_image(image: &str) -> (&str, Option<&str>) {
    crate::image::name_and_tag(image)
}

/// The Kubernetes version of a component image and the kubelet flavour suffix (`-fat`).
pub fn image_version(image: &str) -> Option<(KubeVersion, &str)> {
    crate::image::kube_version_of_tag(split_image(image).1?)
}

/// The image of `component` for version `to`: same repository (and kubelet flavour) as
/// `current`, or the upstream default when the node names none.
pub fn target_image(component: Component, current: Option<&str>, to: &KubeVersion) -> String {
    match current {
        Some(cur) => {
            let (repo, _) = split_image(cur);
            let suffix = image_version(cur).map(|(_, s)| s).unwrap_or("");
            format!("{repo}:{to}{suffix}")
        }
        None => format!("{}:{to}", component.default_repository()),
    }
}

pub(super) fn kube_step(
    j: &mut Job,
    si: usize,
    eyes: &Eyes,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Flow {
    if kube_of(j, si).since.is_none() {
        kube_mut(j, si).since = Some(now);
    }
    if kube_of(j, si).tasks == KubeTasks::Unchecked {
        match kube_prechecks(j, si, eyes, now) {
            Ok((tasks, note, legacy)) => {
                notes.push(note);
                let k = kube_mut(j, si);
                k.tasks = KubeTasks::Planned(tasks);
                k.manifests_legacy = legacy;
            }
            Err(flow) => return flow,
        }
    }
    if j.snapshot.is_none() {
        let ks = kube_of(j, si);
        let via = j
            .control_plane
            .first()
            .or(ks.control_plane.first())
            .cloned();
        let Some(via) = via else {
            return halt_flow(
                HaltCode::NoSnapshotNode,
                "no control-plane node is known to take the etcd snapshot from".into(),
                None,
                Some(CommandOp::Snapshot),
            );
        };
        return Flow::Run(Box::new(snapshot_command(j, si, via)));
    }
    loop {
        let ks = kube_of(j, si);
        let tasks = ks.tasks.list();
        let Some(ti) = tasks.iter().position(|t| t.state != TaskState::Done) else {
            return Flow::Done;
        };
        let t = &tasks[ti];
        let name = t.node.node.clone();
        let nd = Some(name.as_str());
        match (t.op, t.state) {
            (KubeOp::Pull, _) => {
                let c = t.component.unwrap_or(Component::Kubelet);
                return Flow::Run(Box::new(Command {
                    key: key(j, si, nd, CommandOp::Pull, t.attempt),
                    action: Action::Pull {
                        node: t.node.clone(),
                        image: t.image.clone(),
                        namespace: c.namespace(),
                    },
                }));
            }
            (KubeOp::Manifests, _) => {
                return Flow::Run(Box::new(Command {
                    key: key(j, si, None, CommandOp::ApplyManifests, t.attempt),
                    action: Action::ApplyManifests {
                        via: t.node.clone(),
                        legacy: ks.manifests_legacy,
                    },
                }));
            }
            (KubeOp::Patch, TaskState::Pending) => {
                if let Err(flow) = window_gate(j, now) {
                    return flow;
                }
                let r = &kube_of(j, si).rollout;
                if let Err(flow) = exclusion_gate(j, Change::kubernetes(&r.from, &r.to), now) {
                    return flow;
                }
                let Some(c) = t.component else {
                    return no_component(&name);
                };
                if Component::STATIC_PODS.contains(&c)
                    && let Err(flow) = control_plane_gate(j, si, ti, eyes, now, notes)
                {
                    return flow;
                }
                let t = &kube_of(j, si).tasks.list()[ti];
                return Flow::Run(Box::new(Command {
                    key: key(j, si, nd, CommandOp::SetImage, t.attempt),
                    action: Action::SetImage {
                        node: t.node.clone(),
                        component: c,
                        image: t.image.clone(),
                    },
                }));
            }
            (KubeOp::Patch, TaskState::Applied) => {
                if let Err(flow) = verify_patch(j, si, ti, eyes, now, notes) {
                    return flow;
                }
            }
            (KubeOp::Patch, TaskState::Done) => unreachable!("skipped above"),
        }
    }
}

/// The halt of an image patch task that names no component (a job record medea did not write).
fn no_component(name: &str) -> Flow {
    halt_flow(
        HaltCode::Inconsistent,
        format!("the image patch task for node `{name}` names no component"),
        Some(name),
        Some(CommandOp::SetImage),
    )
}

/// An image patch made (`Applied`): the component runs the new image, at the config version
/// Talos rendered it from now (`checkPodStatus`), and is Ready; then the task is done. Until
/// the step's health timeout (from when verification started) a component on its way is
/// polled; then, or on a definitive failure, the job halts.
fn verify_patch(
    j: &mut Job,
    si: usize,
    ti: usize,
    eyes: &Eyes,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Result<(), Flow> {
    let ks = kube_of(j, si);
    let t = &ks.tasks.list()[ti];
    let Some(c) = t.component else {
        return Err(no_component(&t.node.node));
    };
    let since = t.since;
    if since.is_none() {
        // verification of a component found at the target starts now
        kube_mut(j, si).tasks.list_mut()[ti].since = Some(now);
    }
    let ks = kube_of(j, si);
    let t = &ks.tasks.list()[ti];
    let check = PatchCheck {
        c,
        name: &t.node.node,
        to: &ks.rollout.to,
        timeout: ks.rollout.health_timeout,
        deadline: add(since.unwrap_or(now), ks.rollout.health_timeout),
        now,
    };
    let verified_at = match c {
        Component::Kubelet => check.kubelet(eyes).map(|()| None)?,
        Component::Proxy => None,
        _ => {
            let v = check.static_pod(t, eyes, notes)?;
            check.node_control_plane(eyes)?;
            v
        }
    };
    let (name, image) = (t.node.node.clone(), t.image.clone());
    let tm = &mut kube_mut(j, si).tasks.list_mut()[ti];
    tm.state = TaskState::Done;
    tm.since = Some(now);
    match &verified_at {
        Some(v) => notes.push(format!("{c} on `{name}` runs {image} (config version {v})")),
        None => notes.push(format!("{c} on `{name}` runs {image}")),
    }
    tm.config_version = verified_at;
    Ok(())
}

/// The verification of component `c` on node `name` after its image patch.
struct PatchCheck<'t> {
    c: Component,
    name: &'t str,
    to: &'t KubeVersion,
    timeout: Duration,
    /// The health timeout, from when verification started.
    deadline: Timestamp,
    now: Timestamp,
}

impl PatchCheck<'_> {
    /// Not there yet: polled until the deadline ([`late`]), then the halt.
    fn late(&self, what: String) -> Flow {
        let (c, name) = (self.c, self.name);
        late(
            self.now,
            self.deadline,
            || Flow::Poll(PollWhy::Waiting, format!("{c} on `{name}`: {what}")),
            || {
                halt_flow(
                    HaltCode::ComponentNotReady,
                    format!("{c} on `{name}` {what} within {}s", self.timeout.as_secs()),
                    Some(name),
                    Some(CommandOp::SetImage),
                )
            },
        )
    }

    /// An observation of `what` the check reads: the API away is late, a failure halts.
    fn read<'a, T>(&self, s: Seen<'a, T>, observing: &str, what: &str) -> Result<&'a T, Flow> {
        observed(
            s,
            observing,
            |m| self.late(format!("Kubernetes API unreachable ({m})")),
            |m| read_failed(what, m, Some(self.name), Some(CommandOp::SetImage)),
        )
    }

    /// The kubelet reports the target version and its node is Ready.
    fn kubelet(&self, eyes: &Eyes) -> Result<(), Flow> {
        let (name, to) = (self.name, self.to);
        let k = self.read(
            eyes.kube(name),
            &format!("`{name}`"),
            &format!("Kubernetes node `{name}`"),
        )?;
        if k.kubelet_version.as_ref() != Some(to) {
            return Err(self.late(format!(
                "does not report {to} yet (reports {})",
                k.kubelet_version
                    .as_ref()
                    .map(|v| v.to_string())
                    .unwrap_or_else(|| "none".into())
            )));
        }
        if !k.ready {
            return Err(self.late("is not Ready".into()));
        }
        Ok(())
    }

    /// The static pod runs task `t`'s image, at the config version the node's Talos rendered
    /// it from now (as `checkPodStatus` waits for it), and is Ready. The config version it was
    /// verified at, when both sides name one.
    fn static_pod(
        &self,
        t: &KubeTask,
        eyes: &Eyes,
        notes: &mut Vec<String>,
    ) -> Result<Option<String>, Flow> {
        let (c, name) = (self.c, self.name);
        let what = format!("{c} on `{name}`");
        let Some(p) = self.read(eyes.static_pod(name, c), &what, &what)? else {
            return Err(self.late("has no static pod".into()));
        };
        if p.image != t.image {
            return Err(self.late(format!("still runs {}", p.image)));
        }
        let cv = format!("the config version of {c} on `{name}`");
        let wanted = observed(
            eyes.config_version(&t.node, c),
            &cv,
            |m| self.late(format!("config version cannot be read from Talos ({m})")),
            |m| read_failed(&cv, m, Some(name), Some(CommandOp::SetImage)),
        )?;
        if let (Some(w), Some(seen)) = (wanted, &p.config_version)
            && w != seen
        {
            return Err(self.late(format!(
                "is not at config version {w} (its mirror pod shows {seen})"
            )));
        }
        if !p.ready {
            return Err(self.late("is not Ready".into()));
        }
        Ok(match (wanted, &p.config_version) {
            (Some(w), Some(_)) => Some(w.clone()),
            (_, None) => {
                notes.push(format!(
                    "{c} on `{name}`: its mirror pod has no {ANNOTATION_CONFIG_VERSION} annotation; verified by image and Ready only"
                ));
                None
            }
            (None, Some(_)) => {
                notes.push(format!(
                    "{c} on `{name}`: Talos publishes no config resource for it; verified by image and Ready only"
                ));
                None
            }
        })
    }
}

impl PatchCheck<'_> {
    /// Every other control-plane static pod of the node is Ready too: a patch can restart more
    /// than the component patched (on Talos < 1.14.0 a change of the scheduler's config also
    /// restarts the node's kube-apiserver, talos#14152), and the next task may be on another
    /// node (or a kubelet, which the control-plane gate does not guard), so the step moves on
    /// only when the whole node's control plane is back. Polled until the deadline, then the
    /// halt names what is not Ready; a pod that cannot be read counts as not Ready.
    fn node_control_plane(&self, eyes: &Eyes) -> Result<(), Flow> {
        let (c, name) = (self.c, self.name);
        let mut check = HealthCheck::default();
        for sp in Component::STATIC_PODS.into_iter().filter(|sp| *sp != c) {
            match check.read(eyes.static_pod(name, sp), |m| {
                format!("{sp} cannot be read ({m})")
            }) {
                Some(Some(p)) if p.ready => {}
                Some(Some(p)) => check.bad.push(format!("{sp} ({}) is not Ready", p.image)),
                Some(None) => check.bad.push(format!("{sp} has no static pod")),
                None => {}
            }
        }
        if check.missing {
            return Err(Flow::Poll(
                PollWhy::Waiting,
                format!("observing the control plane of `{name}`"),
            ));
        }
        if check.bad.is_empty() {
            return Ok(());
        }
        Err(self.late(format!(
            "is Ready, but not the rest of its node's control plane: {}",
            check.bad.join("; ")
        )))
    }
}

/// Before a control-plane component is patched, every control-plane static pod is Ready and
/// every control-plane kubelet service is healthy; otherwise poll until the step's health
/// timeout (counted from when the gate first found something wrong), then halt naming what is
/// unhealthy. An unreachable source is a failed check, never a pass.
pub(super) fn control_plane_gate(
    j: &mut Job,
    si: usize,
    ti: usize,
    eyes: &Eyes,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Result<(), Flow> {
    let ks = kube_of(j, si);
    let t = &ks.tasks.list()[ti];
    let (name, c) = (t.node.node.clone(), t.component);
    let timeout = ks.rollout.health_timeout;
    let mut check = HealthCheck::default();
    for n in &ks.control_plane {
        let node = &n.node;
        if let Some(tn) = check.read(eyes.talos(n), |m| {
            format!("node `{node}` unreachable ({m})")
        }) && tn.unhealthy_services.iter().any(|s| s == "kubelet")
        {
            check
                .bad
                .push(format!("the kubelet service on `{node}` is not healthy"));
        }
        for sp in Component::STATIC_PODS {
            let pod = check.read(eyes.static_pod(node, sp), |m| {
                format!("{sp} on `{node}` cannot be read ({m})")
            });
            match pod {
                Some(Some(p)) if p.ready => {}
                Some(Some(p)) => {
                    check
                        .bad
                        .push(format!("{sp} on `{node}` ({}) is not Ready", p.image));
                }
                Some(None) => check
                    .bad
                    .push(format!("{sp} on `{node}` has no static pod")),
                None => {}
            }
        }
    }
    if check.missing {
        return Err(Flow::Poll(
            PollWhy::Waiting,
            "observing the control plane's health".into(),
        ));
    }
    let bad = check.bad;
    if bad.is_empty() {
        return Ok(());
    }
    let what = c.map(|c| c.name()).unwrap_or("component");
    let since = match t.since {
        Some(s) => s,
        None => {
            kube_mut(j, si).tasks.list_mut()[ti].since = Some(now);
            notes.push(format!(
                "control plane unhealthy before {what} on `{name}`: {}",
                bad.join("; ")
            ));
            now
        }
    };
    Err(late(
        now,
        add(since, timeout),
        || {
            Flow::Poll(
                PollWhy::Waiting,
                format!("control plane unhealthy: {}", bad.join("; ")),
            )
        },
        || {
            halt_flow(
                HaltCode::ControlPlaneUnhealthy,
                format!(
                    "control plane unhealthy before patching {what} on `{name}` (waited {}s): {}",
                    timeout.as_secs(),
                    bad.join("; ")
                ),
                Some(&name),
                Some(CommandOp::SetImage),
            )
        },
    ))
}
