//! Planning: what would change, as an immutable plan bound to its basis.
//!
//! **Owns:** plan ids, the plan model (the contract with approval and rollout), plan
//! computation ([`compute()`]), a plan's lifecycle state ([`PlanState`], [`lifecycle`]), the
//! approval bar a plan needs ([`bar`]: the anti-self-lowering rule; `approval` counts
//! against it), the upgrade-path and version-skew rules with their
//! compatibility catalog ([`catalog`]), the last-applied desired state ([`applied`]), plan
//! rendering ([`render`]), and the plan's store records with the transactions that save and
//! apply a plan ([`stored`]; values only — reading and committing is
//! the application layer's, in `ops`).
//! **May depend on:** the `plan` row of design/architecture.md's code map (the one list,
//! checked by `tests/it/architecture.rs`); of the store only its record and transaction types
//! (no store is ever read or written here).
//! Architecture Invariant: planning is a pure function of its inputs (no I/O, no clock); the
//! same inputs give the same plan id and a byte-identical rendering.
//! Architecture Invariant: a plan's id covers its basis (desired revision, observed generation
//! of every cluster involved, last-applied digest) and everything it would do, so a plan whose
//! basis changed is stale and can never be approved.

pub mod applied;
pub mod bar;
pub mod catalog;
pub mod compute;
pub mod estimate;
pub mod health;
pub mod id;
pub mod lifecycle;
pub mod model;
pub mod note;
pub mod preflight;
pub mod render;
pub mod setting;
pub mod stored;

pub use applied::{AppliedResource, LastApplied, ResourceKey};
pub use compute::{
    PlanInputs, basis_from_generations, basis_of, basis_with, compute, compute_memo,
};
pub use id::{PlanId, PlanIdRef};
pub use lifecycle::PlanState;
pub use model::{
    Applies, Basis, ClusterPlan, ClusterStatus, KubeRollout, MachineTarget, Plan, ResourceDiff,
    SettingsChange, StageAhead, Step, TalosRollout,
};

#[cfg(test)]
pub(crate) mod tests;
