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
    let deadline = add(ks.since.unwrap_or(now), ks.rollout.health_timeout);
    let cps: BTreeSet<&str> = ks.control_plane.iter().map(|n| n.node.as_str()).collect();
    // ask for everything first, so one round observes it all
    let mut pending: Option<Flow> = None;
    let mut talos = BTreeMap::new();
    let mut kube = BTreeMap::new();
    let mut images = BTreeMap::new();
    let mut args = BTreeMap::new();
    for n in ks.all_nodes() {
        let nd = Some(n.node.as_str());
        let r1 = need(
            eyes.talos(n),
            &format!("node `{}`", n.node),
            deadline,
            now,
            nd,
        );
        let r2 = need(
            eyes.kube(&n.node),
            &format!("Kubernetes node `{}`", n.node),
            deadline,
            now,
            nd,
        );
        let r3 = need(
            eyes.images(n),
            &format!("machine config of `{}`", n.node),
            deadline,
            now,
            nd,
        );
        let r4 = need(
            eyes.args(n),
            &format!("component flags in the machine config of `{}`", n.node),
            deadline,
            now,
            nd,
        );
        for r in [
            r1.map(|t| {
                talos.insert(n.node.clone(), t);
            }),
            r2.map(|k| {
                kube.insert(n.node.clone(), k);
            }),
            r3.map(|i| {
                images.insert(n.node.clone(), i);
            }),
            r4.map(|a| {
                args.insert(n.node.clone(), a);
            }),
        ] {
            if let Err(f) = r {
                match (&pending, &f) {
                    (_, Flow::Halt { .. }) => return Err(f),
                    (None, _) => pending = Some(f),
                    _ => {}
                }
            }
        }
    }
    if let Some(f) = pending {
        return Err(f);
    }
    // Talos support window
    for n in ks.all_nodes() {
        let t = talos[&n.node];
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
    // lowest running version: control-plane component images and every kubelet
    let mut running: Vec<(KubeVersion, String)> = Vec::new();
    for n in ks.all_nodes() {
        if let Some(v) = &kube[&n.node].kubelet_version {
            running.push((v.clone(), format!("kubelet on `{}`", n.node)));
        }
        if cps.contains(n.node.as_str()) {
            for c in Component::STATIC_PODS {
                if let Some((v, _)) = images[&n.node].get(&c).and_then(|i| image_version(i)) {
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
    if lowest > to {
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
    // flags, feature gates and admission plugins the target removed (go-kubernetes
    // `upgrade/checks.go`, run by upgrade-k8s before it pre-pulls or patches anything)
    let mut found: Vec<RemovedSetting> = Vec::new();
    for n in ks.all_nodes() {
        let mut a: ComponentArgs = args[&n.node].clone();
        if !cps.contains(n.node.as_str()) {
            // workers run no control-plane components
            a.retain(|c, _| *c == Component::Kubelet);
        }
        found.extend(removed_settings(&n.node, &a, &to));
    }
    if !found.is_empty() {
        let list: Vec<String> = found.iter().map(|f| f.to_string()).collect();
        return Err(halt_flow(
            HaltCode::PrecheckFailed,
            format!(
                "pre-check failed: Kubernetes {to} removed settings the machine configuration still sets; remove them first: {}",
                list.join("; ")
            ),
            found.first().map(|f| f.node.as_str()),
            None,
        ));
    }
    // the task list, in upgrade-k8s order
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
        let cur = images[&n.node].get(&c).map(String::as_str);
        let t = target_image(c, cur, &to);
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
    // the manifests sync: server-side apply when every node runs Talos >= 1.13
    // (`SupportsSSAManifestSync` of the lowest version, talos_managed.go)
    let legacy = talos
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
