//! Planning: what would change, as an immutable plan bound to its basis.
//!
//! **Owns:** plan ids, plan computation, plan rendering, upgrade-path and version-skew rules.
//! **May depend on:** `desired`, `inventory`, `version`.
//! Architecture Invariant: planning is a pure function of its inputs (no I/O, no clock).

pub mod id;
pub mod model;

pub use id::{PlanId, PlanIdRef};
pub use model::{
    Basis, ClusterPlan, KubeRollout, MachineTarget, Plan, SettingsChange, Step, TalosRollout,
};
