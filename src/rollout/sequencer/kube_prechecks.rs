//! The Kubernetes step's pre-checks (Talos support, version skew, removed settings) and the
//! task list it runs.

use super::*;

/// Pre-checks of a Kubernetes rollout and the task list it runs.
pub(super) fn kube_prechecks(
    j: &Job,
    si: usize,
    eyes: &Eyes,
    now: Timestamp,
) -> Result<(Vec<KubeTask>, String, bool), Flow> {
    let ks = kube_of(j, si);
    let to = ks.rollout.to.clone();
    let seen = NodesSeen::observe(ks, eyes, now)?;
    talos_supports_target(ks, &seen, &to)?;
    let (lowest, lowest_what) = lowest_running(ks, &seen, &to)?;
    no_removed_settings(ks, &seen, &to)?;
    let tasks = task_list(ks, &seen, &to);
    // the manifests sync: server-side apply when every node runs Talos >= 1.13
    // (`SupportsSSAManifestSync` of the lowest version, talos_managed.go)
    let legacy = seen
        .talos
        .values()
        .any(|t| UpgradeMethod::for_version(&t.version) == UpgradeMethod::Legacy);
    Ok((
        tasks,
        format!(
            "Kubernetes pre-checks passed: lowest running {lowest} ({lowest_what}), target {to}"
        ),
        legacy,
    ))
}

/// What the pre-checks read of every node of the step, by node name.
struct NodesSeen<'a> {
    talos: BTreeMap<String, &'a TalosNode>,
    kube: BTreeMap<String, &'a KubeNode>,
    images: BTreeMap<String, &'a ComponentImages>,
    args: BTreeMap<String, &'a ComponentArgs>,
    /// The control-plane nodes' names.
    cps: BTreeSet<String>,
}

impl<'a> NodesSeen<'a> {
    /// Every node's Talos node, Kubernetes node, images and component flags, asked for all
    /// at once so that one round observes them all ([`AskAll`]; each must be there: [`need`]
    /// within the step's health timeout).
    fn observe(ks: &KubeStep, eyes: &Eyes<'a>, now: Timestamp) -> Result<NodesSeen<'a>, Flow> {
        let deadline = add(ks.since.unwrap_or(now), ks.rollout.health_timeout);
        let mut seen = NodesSeen {
            talos: BTreeMap::new(),
            kube: BTreeMap::new(),
            images: BTreeMap::new(),
            args: BTreeMap::new(),
            cps: ks.control_plane.iter().map(|n| n.node.clone()).collect(),
        };
        let mut round = AskAll::default();
        for n in ks.all_nodes() {
            let (name, nd) = (&n.node, Some(n.node.as_str()));
            let talos = need(eyes.talos(n), &format!("node `{name}`"), deadline, now, nd);
            let kube = need(
                eyes.kube(name),
                &format!("Kubernetes node `{name}`"),
                deadline,
                now,
                nd,
            );
            let images = need(
                eyes.images(n),
                &format!("machine config of `{name}`"),
                deadline,
                now,
                nd,
            );
            let args = need(
                eyes.args(n),
                &format!("component flags in the machine config of `{name}`"),
                deadline,
                now,
                nd,
            );
            if let Some(t) = round.take(talos)? {
                seen.talos.insert(name.clone(), t);
            }
            if let Some(k) = round.take(kube)? {
                seen.kube.insert(name.clone(), k);
            }
            if let Some(i) = round.take(images)? {
                seen.images.insert(name.clone(), i);
            }
            if let Some(a) = round.take(args)? {
                seen.args.insert(name.clone(), a);
            }
        }
        round.done()?;
        Ok(seen)
    }

    fn is_cp(&self, node: &str) -> bool {
        self.cps.contains(node)
    }
}

/// The Talos support window: every node's Talos supports the target Kubernetes.
fn talos_supports_target(ks: &KubeStep, seen: &NodesSeen, to: &KubeVersion) -> Result<(), Flow> {
    for n in ks.all_nodes() {
        let t = seen.talos[&n.node];
        if !ks.rollout.talos_supports_target(&t.version) {
            return Err(halt_flow(
                HaltCode::PrecheckFailed,
                format!(
                    "pre-check failed: node `{}` runs Talos {}, which does not support Kubernetes {to}; upgrade Talos first",
                    n.node, t.version
                ),
                Some(&n.node),
                None,
            ));
        }
    }
    Ok(())
}

/// The lowest running version (control-plane component images and every kubelet) and what
/// runs it; the target is neither older nor more than one minor ahead.
fn lowest_running(
    ks: &KubeStep,
    seen: &NodesSeen,
    to: &KubeVersion,
) -> Result<(KubeVersion, String), Flow> {
    let mut running: Vec<(KubeVersion, String)> = Vec::new();
    for n in ks.all_nodes() {
        if let Some(v) = &seen.kube[&n.node].kubelet_version {
            running.push((v.clone(), format!("kubelet on `{}`", n.node)));
        }
        if seen.is_cp(&n.node) {
            for c in Component::STATIC_PODS {
                if let Some((v, _)) = seen.images[&n.node].get(&c).and_then(|i| image_version(i)) {
                    running.push((v, format!("{c} on `{}`", n.node)));
                }
            }
        }
    }
    let Some((lowest, lowest_what)) = running.into_iter().min_by(|a, b| a.0.cmp(&b.0)) else {
        return Err(halt_flow(
            HaltCode::PrecheckFailed,
            "pre-check failed: no running Kubernetes version could be determined".into(),
            None,
            None,
        ));
    };
    if &lowest > to {
        return Err(halt_flow(
            HaltCode::PrecheckFailed,
            format!("pre-check failed: {lowest_what} runs {lowest}, newer than the target {to}"),
            None,
            None,
        ));
    }
    if !to.within_one_minor_of(&lowest) {
        return Err(halt_flow(
            HaltCode::PrecheckFailed,
            format!(
                "pre-check failed: {lowest_what} runs {lowest}; {to} is more than one minor away (upgrade one minor at a time)"
            ),
            None,
            None,
        ));
    }
    Ok((lowest, lowest_what))
}

/// No flag, feature gate or admission plugin the target removed is still set (go-kubernetes
/// `upgrade/checks.go`, run by upgrade-k8s before it pre-pulls or patches anything).
fn no_removed_settings(ks: &KubeStep, seen: &NodesSeen, to: &KubeVersion) -> Result<(), Flow> {
    let mut found: Vec<RemovedSetting> = Vec::new();
    for n in ks.all_nodes() {
        let mut a: ComponentArgs = seen.args[&n.node].clone();
        if !seen.is_cp(&n.node) {
            // workers run no control-plane components
            a.retain(|c, _| *c == Component::Kubelet);
        }
        found.extend(removed_settings(&n.node, &a, to));
    }
    if found.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = found.iter().map(|f| f.to_string()).collect();
    Err(Flow::Halt {
        reason: HaltReason::new(
            HaltCode::PrecheckFailed,
            format!(
                "pre-check failed: Kubernetes {to} removed settings the machine configuration still sets; remove them first: {}",
                list.join("; ")
            ),
        )
        .with_cause(HaltCause::RemovedSettings),
        node: found.first().map(|f| f.node.clone()),
        op: None,
    })
}

/// The task list, in upgrade-k8s order: pulls (control-plane components, then every
/// kubelet), the patches component by component, kube-proxy, the kubelets, the manifests.
fn task_list(ks: &KubeStep, seen: &NodesSeen, to: &KubeVersion) -> Vec<KubeTask> {
    let mut tasks = Vec::new();
    // A component already at the target is never trusted: its task starts `Applied`, so the
    // static pod (Ready, with the target image and the node's current config version for it) or the kubelet (version, Ready) is verified
    // before the next node is touched, as `upgrade-k8s` waits in `checkPodStatus` even when the
    // patch was skipped (talos `pkg/cluster/kubernetes/talos_managed.go`). kube-proxy has
    // nothing to wait for (its DaemonSet changes with the manifests).
    let task = |op, node: &NodeTarget, component, image: String, done: bool| KubeTask {
        op,
        node: node.clone(),
        component,
        image,
        state: match (done, op, component) {
            (false, _, _) => TaskState::Pending,
            (true, KubeOp::Patch, Some(c)) if c != Component::Proxy => TaskState::Applied,
            (true, _, _) => TaskState::Done,
        },
        since: None,
        attempt: 0,
        config_version: None,
    };
    let target = |n: &NodeTarget, c: Component| {
        let cur = seen.images[&n.node].get(&c).map(String::as_str);
        let t = target_image(c, cur, to);
        let done = cur == Some(t.as_str());
        (t, done)
    };
    for n in &ks.control_plane {
        for c in Component::STATIC_PODS {
            let (img, done) = target(n, c);
            if !done {
                tasks.push(task(KubeOp::Pull, n, Some(c), img, false));
            }
        }
    }
    for n in ks.all_nodes() {
        let (img, done) = target(n, Component::Kubelet);
        if !done {
            tasks.push(task(KubeOp::Pull, n, Some(Component::Kubelet), img, false));
        }
    }
    for c in Component::STATIC_PODS {
        for n in &ks.control_plane {
            let (img, done) = target(n, c);
            tasks.push(task(KubeOp::Patch, n, Some(c), img, done));
        }
    }
    for n in &ks.control_plane {
        let (img, done) = target(n, Component::Proxy);
        tasks.push(task(KubeOp::Patch, n, Some(Component::Proxy), img, done));
    }
    for n in ks.all_nodes() {
        let (img, done) = target(n, Component::Kubelet);
        tasks.push(task(KubeOp::Patch, n, Some(Component::Kubelet), img, done));
    }
    if let Some(first) = ks.control_plane.first() {
        tasks.push(task(KubeOp::Manifests, first, None, String::new(), false));
    }
    tasks
}
