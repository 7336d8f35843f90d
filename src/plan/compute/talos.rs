//! Stages 2–3: Talos version paths per member, the pool's hops, and cutting each hop's
//! machines into waves.

use std::collections::{BTreeMap, BTreeSet};

use super::installer::{
    InstallerFindings, effective, factory_installer, factory_only, running_schematic,
};
use super::*;

impl<'a> ClusterCtx<'a> {
    /// The Talos steps of one pool (one per hop), or none when the pool has errors.
    pub(super) fn pool_steps(
        &mut self,
        pool: &'a NodePool,
        members: &[Member<'a>],
    ) -> Vec<TalosRollout> {
        let target = &pool.talos_version.value;
        let want_schematic = pool.installer_image.schematic();
        let allow_downgrade = self.cluster.upgrade_policy.allow_downgrade;
        // Each member with the Talos it runs now and the versions it passes through.
        let mut paths: Vec<(&'a Machine, TalosVersion, Vec<TalosVersion>)> = Vec::new();
        let mut downgrades = Vec::new();
        let mut installers = InstallerFindings::default();
        let mut no_release: BTreeMap<(u64, u64), Vec<String>> = BTreeMap::new();
        let mut errors = false;
        for m in members {
            let machine = m.machine;
            let Some(running) = &machine.talos_version else {
                let origin = m.origin(pool);
                self.diags.push(
                    Diagnostic::error(
                        codes::UNOBSERVED,
                        origin,
                        format!(
                            "the running Talos version of machine `{}` is unknown (its Talos API did not answer at the last refresh)",
                            machine.node
                        ),
                    )
                    .with_help(format!(
                        "medea cannot plan what it cannot see: bring the node back and refresh the inventory, or take it out of node pool `{}`",
                        pool.name.value
                    )),
                );
                errors = true;
                continue;
            };
            let reinstall = want_schematic.is_some()
                && effective(running_schematic(machine)) != effective(want_schematic);
            let mut path = match self.catalog.talos_path(running, target, allow_downgrade) {
                Ok(p) => p,
                Err(PathError::Downgrade) => {
                    downgrades.push((machine.node.clone(), running.clone()));
                    errors = true;
                    continue;
                }
                Err(PathError::Major) => {
                    self.diags.push(
                        Diagnostic::error(
                            codes::TALOS_PATH,
                            pool.talos_version.origin.clone(),
                            format!(
                                "machine `{}` runs Talos {running}; medea does not plan upgrades across major versions (to {target})",
                                machine.node
                            ),
                        )
                        .with_help("follow the Talos release notes for the major upgrade by hand"),
                    );
                    errors = true;
                    continue;
                }
                Err(PathError::NoRelease { minor }) => {
                    no_release
                        .entry(minor)
                        .or_default()
                        .push(format!("`{}` ({running})", machine.node));
                    errors = true;
                    continue;
                }
            };
            if path.is_empty() && reinstall {
                path.push(target.clone());
            }
            if !self.installer_checks(pool, m, &path, &mut installers) {
                errors = true;
                continue;
            }
            if !path.is_empty() && !machine.reachable {
                let origin = m.origin(pool);
                self.diags.push(
                    Diagnostic::error(
                        codes::UNOBSERVED,
                        origin,
                        format!(
                            "machine `{}` needs Talos {target} but its Talos API did not answer at the last refresh",
                            machine.node
                        ),
                    )
                    .with_help("medea cannot plan what it cannot see: bring the node back and refresh the inventory"),
                );
                errors = true;
                continue;
            }
            paths.push((machine, running.clone(), path));
        }
        if !downgrades.is_empty() {
            let list: Vec<String> = downgrades
                .iter()
                .map(|(n, v)| format!("`{n}` ({v})"))
                .collect();
            self.diags.push(
                Diagnostic::error(
                    codes::DOWNGRADE,
                    pool.talos_version.origin.clone(),
                    format!(
                        "downgrade refused: node pool `{}` asks for Talos {target}, older than what {} run{}",
                        pool.name.value,
                        list.join(", "),
                        if downgrades.len() == 1 { "s" } else { "" }
                    ),
                )
                .with_label("older than the running version")
                .with_help(format!(
                    "set `upgradePolicy.allowDowngrade: true` on cluster `{}` if you mean it, or set the version to the running one",
                    self.name()
                )),
            );
        }
        for (minor, machines) in no_release {
            self.diags.push(
                Diagnostic::error(
                    codes::TALOS_PATH,
                    pool.talos_version.origin.clone(),
                    format!(
                        "no stable Talos {}.{} release is known to stop at on the way from what {} run{} to {target}",
                        minor.0,
                        minor.1,
                        machines.join(", "),
                        if machines.len() == 1 { "s" } else { "" }
                    ),
                )
                .with_help(format!(
                    "Talos upgrades go one minor at a time; add the release to `upgradePolicy.talosReleases` of cluster `{}` (catalog {})",
                    self.name(),
                    self.catalog.version()
                )),
            );
        }
        self.installer_findings(pool, installers);
        if errors {
            return Vec::new();
        }
        // Hop targets: farthest minor first, the target last.
        let mut targets: Vec<TalosVersion> = paths
            .iter()
            .flat_map(|(_, _, p)| p.iter().cloned())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let dist = |v: &TalosVersion| v.minor().abs_diff(target.minor());
        targets.sort_by(|a, b| {
            (a == target)
                .cmp(&(b == target))
                .then(dist(b).cmp(&dist(a)))
                .then(a.cmp(b))
        });
        let hops: Vec<Hop<'a>> = targets
            .iter()
            .map(|to| Hop {
                to: to.clone(),
                machines: paths
                    .iter()
                    .filter_map(|(m, running, p)| {
                        let i = p.iter().position(|v| v == to)?;
                        let from = if i == 0 {
                            running.clone()
                        } else {
                            p[i - 1].clone()
                        };
                        Some((*m, from))
                    })
                    .collect(),
            })
            .collect();
        let total = hops.len() as u32;
        let mut steps = Vec::new();
        for (i, hop) in hops.into_iter().enumerate() {
            let Some(mut waves) = self.waves(pool, members, &hop) else {
                return Vec::new();
            };
            let mut image = pool.installer_image.value.reference(&hop.to);
            if !pool.installer_named && factory_only(&hop.to) {
                // each machine's own factory installer; the first machine's is the step's
                let of = |node: &str| factory_installer(&self.obs.machines[node], &hop.to);
                if let Some(first) = waves.iter().flatten().next() {
                    image = of(&first.node);
                }
                for m in waves.iter_mut().flatten() {
                    let own = of(&m.node);
                    m.image = (own != image).then_some(own);
                }
            }
            steps.push(TalosRollout {
                health: crate::plan::health::HealthPolicy::of(&pool.health),
                silence: crate::plan::health::SilencePolicy::of(&pool.health).map(Box::new),
                hooks: pool.hooks.clone().non_empty().map(Box::new),
                pool: pool.name.value.clone(),
                role: role_of(pool.role),
                hop: i as u32 + 1,
                hops: total,
                to: hop.to.clone(),
                image,
                max_unavailable: pool.rollout.max_unavailable,
                drain_timeout: pool.rollout.drain_timeout,
                health_timeout: pool.rollout.health_timeout,
                upgrade_attempts: pool.rollout.upgrade_attempts,
                drain: pool.rollout.drain.clone(),
                taint_next_wave: pool.rollout.taint_next_wave,
                waves,
                stage: (pool.rollout.stage == crate::desired::model::Stage::Ahead).then_some(
                    crate::plan::StageAhead {
                        parallelism: pool.rollout.stage_parallelism,
                    },
                ),
            });
        }
        steps
    }

    /// Cut a hop's machines into waves.
    ///
    /// `cap` is 1 for control-plane pools and `maxUnavailable` otherwise. Machines that are
    /// unavailable now (cordoned, NotReady or unreachable) and take the hop go first: they are
    /// away already. Unavailable machines that do not take the hop are assumed to stay away
    /// for the whole hop, so every wave holds at most `cap - away` machines; for control-plane
    /// pools "away" counts every control-plane node of the cluster (etcd quorum is
    /// cluster-wide). If nothing fits, the plan is refused and names the machines.
    fn waves(
        &mut self,
        pool: &NodePool,
        members: &[Member<'a>],
        hop: &Hop<'a>,
    ) -> Option<Vec<Vec<MachineTarget>>> {
        let cp = pool.role == Role::Controlplane;
        let cap = if cp {
            1
        } else {
            pool.rollout.max_unavailable.max(1)
        } as usize;
        let in_hop: BTreeSet<&str> = hop.machines.iter().map(|(m, _)| m.node.as_str()).collect();
        let scope: Vec<&Machine> = if cp {
            self.obs
                .machines
                .values()
                .filter(|m| m.role == MachineRole::Controlplane)
                .collect()
        } else {
            members.iter().map(|m| m.machine).collect()
        };
        let away_out: Vec<&Machine> = scope
            .iter()
            .copied()
            .filter(|m| m.unavailable() && !in_hop.contains(m.node.as_str()))
            .collect();
        let mut ordered: Vec<&(&Machine, TalosVersion)> = hop.machines.iter().collect();
        ordered.sort_by(|a, b| {
            (!a.0.unavailable())
                .cmp(&!b.0.unavailable())
                .then_with(|| a.0.node.cmp(&b.0.node))
        });
        let away_in = ordered.iter().filter(|(m, _)| m.unavailable()).count();
        if away_out.len() >= cap || away_out.len() + away_in > cap {
            let mut names: Vec<String> = away_out
                .iter()
                .copied()
                .chain(ordered.iter().map(|(m, _)| *m).filter(|m| m.unavailable()))
                .map(|m| format!("`{}` ({})", m.node, why_unavailable(m)))
                .collect();
            names.sort();
            let scope_text = if cp {
                format!("cluster `{}` has control-plane", self.name())
            } else {
                format!("node pool `{}` has", pool.name.value)
            };
            self.diags.push(
                Diagnostic::error(
                    codes::UNAVAILABLE,
                    pool.talos_version.origin.clone(),
                    format!(
                        "{scope_text} {} machine{} unavailable already ({}), and at most {cap} may be away at once: Talos {} cannot start",
                        names.len(),
                        if names.len() == 1 { "" } else { "s" },
                        names.join(", "),
                        hop.to
                    ),
                )
                .with_help(if cp {
                    "bring the control-plane nodes back (Ready, uncordoned, reachable) and refresh the inventory".to_string()
                } else {
                    "bring the machines back (Ready, uncordoned, reachable) and refresh, or raise `rollout.maxUnavailable`".to_string()
                }),
            );
            return None;
        }
        let size = cap - away_out.len();
        Some(
            ordered
                .chunks(size)
                .map(|chunk| {
                    chunk
                        .iter()
                        .map(|(m, from)| MachineTarget {
                            node: m.node.clone(),
                            id: m.id.clone(),
                            address: m.address.clone(),
                            from: from.clone(),
                            image: None,
                        })
                        .collect()
                })
                .collect(),
        )
    }
}
