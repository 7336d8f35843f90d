//! Stage 1: pool membership (explicit `machines` plus selector matches), with the
//! membership errors (missing, claimed twice, wrong role).

use std::collections::BTreeMap;

use super::*;

impl<'a> ClusterCtx<'a> {
    /// Pool → members, reporting unknown machines, double claims and role mismatches.
    pub(super) fn members(&mut self) -> BTreeMap<String, Vec<Member<'a>>> {
        let cluster = self.cluster;
        let obs = self.obs;
        // node → (pool, listed origin)
        let mut owner: BTreeMap<&str, (&str, Option<&Origin>)> = BTreeMap::new();
        let mut out: BTreeMap<String, Vec<Member<'a>>> = BTreeMap::new();
        for pool in cluster.pools.values() {
            for m in &pool.machines {
                let Some(machine) = obs.machines.get(&m.value) else {
                    let known: Vec<&str> = obs.machines.keys().map(String::as_str).collect();
                    self.diags.push(
                        Diagnostic::error(
                            codes::UNKNOWN_MACHINE,
                            m.origin.clone(),
                            format!(
                                "machine `{}` of node pool `{}` is not in the observed inventory of cluster `{}`",
                                m.value,
                                pool.name.value,
                                self.name()
                            ),
                        )
                        .with_label("not observed")
                        .with_help(if known.is_empty() {
                            "no machine of this cluster has been observed; check the node name or refresh the inventory".to_string()
                        } else {
                            format!(
                                "check the Kubernetes node name (`kubectl get nodes`); observed machines: {}",
                                known.join(", ")
                            )
                        }),
                    );
                    continue;
                };
                owner.insert(&machine.node, (&pool.name.value, Some(&m.origin)));
                out.entry(pool.name.value.clone())
                    .or_default()
                    .push(Member {
                        machine,
                        listed: Some(&m.origin),
                    });
            }
        }
        for pool in cluster.pools.values() {
            if pool.selector.is_empty() {
                continue;
            }
            for machine in obs.machines.values() {
                let matches = pool
                    .selector
                    .iter()
                    .all(|(k, v)| machine.labels.get(k).is_some_and(|l| l == v));
                if !matches {
                    continue;
                }
                match owner.get(machine.node.as_str()) {
                    Some((p, _)) if *p == pool.name.value => {}
                    Some((p, listed)) => {
                        let how = if listed.is_some() {
                            format!("is listed in node pool `{p}` and also matches")
                        } else {
                            format!("matches the selector of node pool `{p}` and also")
                        };
                        self.diags.push(
                            Diagnostic::error(
                                codes::MACHINE_TWICE,
                                pool.name.origin.clone(),
                                format!(
                                    "machine `{}` {how} the selector of node pool `{}`",
                                    machine.node, pool.name.value
                                ),
                            )
                            .with_label("selector matches a machine of another pool")
                            .with_help(
                                "a machine belongs to exactly one pool: narrow the selector or change the node's labels",
                            ),
                        );
                    }
                    None => {
                        owner.insert(&machine.node, (&pool.name.value, None));
                        out.entry(pool.name.value.clone())
                            .or_default()
                            .push(Member {
                                machine,
                                listed: None,
                            });
                    }
                }
            }
        }
        for (pool_name, ms) in &mut out {
            let pool = &cluster.pools[pool_name];
            ms.sort_by(|a, b| a.machine.node.cmp(&b.machine.node));
            for m in ms.iter() {
                let want = role_of(pool.role);
                if m.machine.role != want {
                    let origin = m.origin(pool);
                    self.diags.push(
                        Diagnostic::error(
                            codes::ROLE_MISMATCH,
                            origin,
                            format!(
                                "machine `{}` is a {} node, but node pool `{}` has role {}",
                                m.machine.node,
                                role_text(m.machine.role),
                                pool.name.value,
                                role_text(want)
                            ),
                        )
                        .with_help(format!(
                            "move `{}` to a {} pool",
                            m.machine.node,
                            role_text(m.machine.role)
                        )),
                    );
                }
            }
        }
        out
    }
}
