//! Quorum: how many distinct people must approve a plan, and whether they have.
//!
//! Counting rule: approvals count per **person**, not per signature, file or key. Two approvals
//! are the same person when they share a principal (including the aliases listed on one
//! allowed_signers line) or a key, directly or through other approvals: one person with two
//! keys, two marker files, or a marker and an API submission counts once.
//!
//! Anti-self-lowering rule: the quorum a plan needs is the one **in force before it** (from the
//! store: the settings last executed; the defaults for a cluster never applied). A plan that
//! changes a cluster's approvals setting in any way (or deletes or renames the cluster) needs
//! the highest bar in force, `max(required, controlPlane)`, and the new bar if that is higher
//! ([`required_quorum`]). Whoever can commit YAML cannot lower the bar and approve the lowering
//! themselves, and whoever clears the ordinary bar cannot lower the control-plane one. A plan
//! always needs at least one approval. The rule itself lives with the planner, which puts the
//! bar into every plan ([`crate::plan::bar`], re-exported here); this module counts approvals
//! against it.

use std::collections::BTreeMap;
use std::fmt;

use super::verify::VerifiedApproval;
use crate::plan::PlanId;
pub use crate::plan::bar::{
    BarChange, ClusterQuorum, PlanScope, QuorumPolicy, required_for_plan, required_quorum,
};

/// Why a verified approval does not add to the count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotCounted {
    /// It approves another plan: an approval of plan A never counts for plan B.
    OtherPlan {
        /// The plan it approves.
        plan: PlanId,
        /// The plan being counted.
        current: PlanId,
    },
    /// The same principal already counts.
    SamePrincipal {
        /// The principal that already counts.
        principal: String,
    },
    /// The same key already counts, for `counted`.
    SameKey {
        /// `SHA256:...` of the key.
        fingerprint: String,
        /// The principal the key already counts for.
        counted: String,
    },
    /// Linked to `counted` through aliases or keys of other approvals.
    SamePerson {
        /// The principal that already counts for that person.
        counted: String,
    },
}

impl fmt::Display for NotCounted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotCounted::OtherPlan { plan, current } => write!(
                f,
                "approves plan {}, not the current plan {}; it does not count",
                plan.short(),
                current.short()
            ),
            NotCounted::SamePrincipal { principal } => write!(
                f,
                "duplicate principal: {principal} already counts toward the quorum (one person counts once)"
            ),
            NotCounted::SameKey {
                fingerprint,
                counted,
            } => write!(
                f,
                "duplicate key: {fingerprint} already counts toward the quorum for {counted}"
            ),
            NotCounted::SamePerson { counted } => write!(
                f,
                "same person as {counted} (linked through shared principals or keys); counts once"
            ),
        }
    }
}

/// Where a plan stands: the approvals that count (one per person) and those that do not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumStatus {
    /// The plan counted.
    pub plan: PlanId,
    /// Approvals from distinct people the bar requires.
    pub required: u32,
    /// The approvals that count, one per person.
    pub counted: Vec<VerifiedApproval>,
    /// The verified approvals that do not count, and why.
    pub not_counted: Vec<(VerifiedApproval, NotCounted)>,
}

impl QuorumStatus {
    /// Whether enough distinct people approved.
    pub fn reached(&self) -> bool {
        self.count() >= self.required
    }
    /// How many approvals count.
    pub fn count(&self) -> u32 {
        u32::try_from(self.counted.len()).unwrap_or(u32::MAX)
    }
    /// How many more distinct people must approve.
    pub fn missing(&self) -> u32 {
        self.required.saturating_sub(self.count())
    }
    /// The counted principals, sorted.
    pub fn principals(&self) -> Vec<&str> {
        let mut p: Vec<&str> = self.counted.iter().map(|a| a.principal.as_str()).collect();
        p.sort_unstable();
        p
    }
}

impl fmt::Display for QuorumStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let who = self.principals().join(", ");
        write!(
            f,
            "plan {}: {} of {} approvals",
            self.plan.short(),
            self.count(),
            self.required
        )?;
        if !who.is_empty() {
            write!(f, " ({who})")?;
        }
        if self.reached() {
            f.write_str("; quorum reached")
        } else {
            write!(f, "; {} more needed from distinct people", self.missing())
        }
    }
}

/// Count `approvals` for `plan` against `required` (raised to 1 if 0). Deterministic: approvals are considered in (source, principal,
/// fingerprint) order and the first of each person is the one counted.
pub fn evaluate(
    plan: &PlanId,
    required: u32,
    approvals: impl IntoIterator<Item = VerifiedApproval>,
) -> QuorumStatus {
    let mut for_plan = Vec::new();
    let mut not_counted = Vec::new();
    for a in approvals {
        if a.plan == *plan {
            for_plan.push(a);
        } else {
            let p = a.plan;
            not_counted.push((
                a,
                NotCounted::OtherPlan {
                    plan: p,
                    current: *plan,
                },
            ));
        }
    }
    for_plan.sort_by(|a, b| {
        (&a.source, &a.principal, &a.fingerprint).cmp(&(&b.source, &b.principal, &b.fingerprint))
    });

    // Union-find over identity nodes (principal names and key fingerprints).
    let mut nodes: BTreeMap<String, usize> = BTreeMap::new();
    let mut parent: Vec<usize> = Vec::new();
    let mut node = |name: String, parent: &mut Vec<usize>| -> usize {
        *nodes.entry(name).or_insert_with(|| {
            parent.push(parent.len());
            parent.len() - 1
        })
    };
    fn find(parent: &mut [usize], mut x: usize) -> usize {
        while parent[x] != x {
            parent[x] = parent[parent[x]];
            x = parent[x];
        }
        x
    }
    let mut approval_nodes = Vec::new();
    for a in &for_plan {
        let k = node(format!("key:{}", a.fingerprint), &mut parent);
        for p in a.principals.iter().chain(std::iter::once(&a.principal)) {
            let n = node(format!("principal:{p}"), &mut parent);
            let (rk, rn) = (find(&mut parent, k), find(&mut parent, n));
            parent[rn] = rk;
        }
        approval_nodes.push(k);
    }

    let mut representative: BTreeMap<usize, usize> = BTreeMap::new();
    let mut counted = Vec::new();
    let mut counted_idx: Vec<usize> = Vec::new();
    for (i, a) in for_plan.iter().enumerate() {
        let root = find(&mut parent, approval_nodes[i]);
        match representative.get(&root) {
            None => {
                representative.insert(root, i);
                counted_idx.push(i);
            }
            Some(&r) => {
                let rep = &for_plan[r];
                let shared = a.principals.iter().find(|p| rep.principals.contains(p));
                let why = if let Some(p) = shared {
                    NotCounted::SamePrincipal {
                        principal: p.clone(),
                    }
                } else if a.fingerprint == rep.fingerprint {
                    NotCounted::SameKey {
                        fingerprint: a.fingerprint.clone(),
                        counted: rep.principal.clone(),
                    }
                } else {
                    NotCounted::SamePerson {
                        counted: rep.principal.clone(),
                    }
                };
                not_counted.push((a.clone(), why));
            }
        }
    }
    for i in counted_idx {
        counted.push(for_plan[i].clone());
    }
    QuorumStatus {
        plan: *plan,
        required: required.max(1),
        counted,
        not_counted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::approval::source::ApprovalSource;

    fn plan(b: u8) -> PlanId {
        PlanId::from_digest([b; 32])
    }
    fn approval(p: u8, principals: &[&str], key: &str, source: ApprovalSource) -> VerifiedApproval {
        VerifiedApproval {
            plan: plan(p),
            principal: principals[0].to_string(),
            principals: principals.iter().map(|s| s.to_string()).collect(),
            fingerprint: format!("SHA256:{key}"),
            key_type: "ED25519".into(),
            signers_line: 1,
            source,
        }
    }
    fn marker(n: &str) -> ApprovalSource {
        ApprovalSource::Marker { path: n.into() }
    }

    #[test]
    fn distinct_principals_reach_quorum() {
        let s = evaluate(
            &plan(1),
            2,
            vec![
                approval(1, &["alice@x"], "k1", marker("approvals/a.sig")),
                approval(1, &["bob@x"], "k2", ApprovalSource::Api),
            ],
        );
        assert!(s.reached());
        assert_eq!(s.principals(), vec!["alice@x", "bob@x"]);
        assert!(s.not_counted.is_empty());
        assert_eq!(
            s.to_string(),
            "plan 010101010101: 2 of 2 approvals (alice@x, bob@x); quorum reached"
        );
    }

    #[test]
    fn one_person_counts_once() {
        // two keys, same principal
        let s = evaluate(
            &plan(1),
            2,
            vec![
                approval(1, &["alice@x"], "k1", marker("approvals/a1.sig")),
                approval(1, &["alice@x"], "k2", marker("approvals/a2.sig")),
            ],
        );
        assert!(!s.reached());
        assert_eq!(s.missing(), 1);
        assert!(
            matches!(&s.not_counted[0].1, NotCounted::SamePrincipal { principal } if principal == "alice@x")
        );
        assert!(
            s.not_counted[0]
                .1
                .to_string()
                .starts_with("duplicate principal: alice@x")
        );
        assert_eq!(
            s.to_string(),
            "plan 010101010101: 1 of 2 approvals (alice@x); 1 more needed from distinct people"
        );
        // the same key claimed for two principals (a key is one person)
        let s = evaluate(
            &plan(1),
            2,
            vec![
                approval(1, &["alice@x"], "k1", marker("approvals/a.sig")),
                approval(1, &["bob@x"], "k1", ApprovalSource::Api),
            ],
        );
        assert!(!s.reached());
        assert!(matches!(&s.not_counted[0].1, NotCounted::SameKey { .. }));
        // aliases: alice@x,alice@y on one line; alice@y with another key elsewhere
        let s = evaluate(
            &plan(1),
            2,
            vec![
                approval(1, &["alice@x", "alice@y"], "k1", marker("approvals/a.sig")),
                approval(1, &["alice@y"], "k2", ApprovalSource::Api),
            ],
        );
        assert!(!s.reached());
        // linked through a third approval
        let s = evaluate(
            &plan(1),
            3,
            vec![
                approval(1, &["a@x"], "k1", marker("1")),
                approval(1, &["b@x"], "k2", marker("2")),
                approval(1, &["c@x"], "k1", marker("3")),
            ],
        );
        assert_eq!(s.count(), 2);
    }

    #[test]
    fn approval_of_another_plan_never_counts() {
        let s = evaluate(
            &plan(2),
            1,
            vec![approval(1, &["alice@x"], "k1", ApprovalSource::Api)],
        );
        assert!(!s.reached());
        assert!(matches!(s.not_counted[0].1, NotCounted::OtherPlan { .. }));
        assert!(
            s.not_counted[0]
                .1
                .to_string()
                .contains("not the current plan 020202020202")
        );
    }
}
