//! Properties: determinism and wave invariants over generated clusters.

use super::*;

// ---------------------------------------------------------------- properties

const VERSIONS: &[&str] = &["v1.11.5", "v1.12.4", "v1.12.11", "v1.13.2", "v1.13.9"];

#[derive(Debug, Clone)]
struct Node {
    version: usize,
    ready: bool,
    cordoned: bool,
}

fn arb_nodes() -> impl Strategy<Value = Vec<Node>> {
    prop::collection::vec(
        (
            0..VERSIONS.len(),
            prop::bool::weighted(0.85),
            prop::bool::weighted(0.1),
        )
            .prop_map(|(version, ready, cordoned)| Node {
                version,
                ready,
                cordoned,
            }),
        1..10,
    )
}

fn scenario(cps: &[Node], ws: &[Node], max: u32, target: usize, gen_: u64) -> (Desired, Inventory) {
    let cp_names: Vec<String> = (1..=cps.len()).map(|i| format!("cp-{i}")).collect();
    let w_names: Vec<String> = (1..=ws.len()).map(|i| format!("w-{i}")).collect();
    let d = one(
        "v1.34.1",
        &format!("  rollout:\n    maxUnavailable: {max}\n"),
        &[
            pool_doc(
                "cp",
                "controlplane",
                &cp_names.join(", "),
                VERSIONS[target],
                "",
            ),
            pool_doc("w", "worker", &w_names.join(", "), VERSIONS[target], ""),
        ],
    );
    let mut ms = Vec::new();
    for (name, n, role) in cp_names
        .iter()
        .zip(cps)
        .map(|(a, b)| (a, b, MachineRole::Controlplane))
        .chain(
            w_names
                .iter()
                .zip(ws)
                .map(|(a, b)| (a, b, MachineRole::Worker)),
        )
    {
        let mut m = machine(name, role, VERSIONS[n.version], "v1.34.1");
        m.ready = n.ready;
        m.cordoned = n.cordoned;
        ms.push(m);
    }
    (d, observed("v1.34.1", gen_, ms))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn plans_are_deterministic_and_waves_keep_their_invariants(
        cps in arb_nodes(),
        ws in arb_nodes(),
        max in 1u32..4,
        target in 2usize..VERSIONS.len(),
        gen_ in 1u64..1000,
    ) {
        let (d, i) = scenario(&cps, &ws, max, target, gen_);
        let a = compute(&d, &i, &LastApplied::default(), None);
        let b = compute(&d, &i, &LastApplied::default(), None);
        prop_assert_eq!(&a, &b);
        let Ok(plan) = a else { return Ok(()) };
        let b = b.unwrap();
        prop_assert_eq!(plan.id, b.id);
        prop_assert_eq!(render::text(&plan, Default::default()), render::text(&b, Default::default()));
        prop_assert_eq!(render::json(&plan), render::json(&b));

        // Any change of the observed generation gives another id and makes this plan stale.
        let mut i2 = i.clone();
        std::sync::Arc::make_mut(i2.clusters.get_mut("c1").unwrap()).generation += 1;
        let c = compute(&d, &i2, &LastApplied::default(), None).unwrap();
        prop_assert_ne!(c.id, plan.id);
        prop_assert!(plan.is_stale(&c.basis));

        let obs = &i.clusters["c1"];
        let target_v = t(VERSIONS[target]);
        for step in &plan.clusters[0].steps {
            let Step::Talos(s) = step else { continue };
            let cap = if s.role == MachineRole::Controlplane { 1 } else { max as usize };
            let in_hop: Vec<&str> = s.waves.iter().flatten().map(|m| m.node.as_str()).collect();
            let mut dedup = in_hop.clone();
            dedup.sort();
            dedup.dedup();
            prop_assert_eq!(dedup.len(), in_hop.len(), "a machine appears once per hop");
            let scope: Vec<&Machine> = obs.machines.values().filter(|m| m.role == s.role).collect();
            let away_out = scope.iter().filter(|m| m.unavailable() && !in_hop.contains(&m.node.as_str())).count();
            for (n, wave) in s.waves.iter().enumerate() {
                prop_assert!(!wave.is_empty());
                prop_assert!(wave.len() + away_out <= cap, "wave {} of {} too big", n, s.pool);
                if s.role == MachineRole::Controlplane {
                    prop_assert_eq!(wave.len(), 1);
                }
                if n > 0 {
                    prop_assert!(wave.iter().all(|m| !obs.machines[&m.node].unavailable()),
                        "already-unavailable machines go in the first wave");
                }
            }
        }
        // Every machine not on the target takes the last hop of its pool exactly once.
        for m in obs.machines.values() {
            let last = plan.clusters[0].steps.iter().rev().find_map(|s| match s {
                Step::Talos(s) if s.role == m.role => Some(s),
                _ => None,
            });
            let count = last.map_or(0, |s| s.waves.iter().flatten().filter(|x| x.node == m.node).count());
            let needs = m.talos_version.as_ref() != Some(&target_v);
            prop_assert_eq!(count, usize::from(needs), "{}", m.node);
        }
    }
}
