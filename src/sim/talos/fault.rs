//! Faults as data: `FaultPlan { node, on, effect }`, set from Rust or a scenario file.
//!
//! A plan is armed when set. Its trigger counts matching occasions from then on (calls of one
//! method, or boots) and fires from the `nth` one; it fires `times()` times in all
//! (`Unavailable { calls }` fires `calls` times, every other effect once), then it is spent.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A simulated RPC, as counted and as faults name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Method {
    /// `MachineService.Version`
    Version,
    /// `MachineService.ServiceList`
    ServiceList,
    /// `MachineService.EtcdMemberList`
    EtcdMemberList,
    /// `MachineService.EtcdStatus`
    EtcdStatus,
    /// `MachineService.EtcdSnapshot`
    EtcdSnapshot,
    /// `MachineService.EtcdAlarmList`
    EtcdAlarmList,
    /// `MachineService.EtcdForfeitLeadership`
    EtcdForfeitLeadership,
    /// `ImageService.Pull` and the deprecated `MachineService.ImagePull`
    ImagePull,
    /// `LifecycleService.Upgrade`
    Upgrade,
    /// The deprecated `MachineService.Upgrade`
    LegacyUpgrade,
    /// `MachineService.Reboot`
    Reboot,
    /// `MachineService.Rollback`
    Rollback,
    /// `MachineService.Read`
    Read,
    /// `MachineService.ApplyConfiguration`
    ApplyConfiguration,
    /// `cosi.resource.State.Get`
    CosiGet,
    /// `cosi.resource.State.List`
    CosiList,
    /// `ClusterService.HealthCheck`
    HealthCheck,
    /// `MachineService.MetaWrite`
    MetaWrite,
    /// `MachineService.MetaDelete`
    MetaDelete,
}

impl Method {
    /// Methods that change the node.
    pub fn is_mutating(self) -> bool {
        matches!(
            self,
            Method::Upgrade
                | Method::LegacyUpgrade
                | Method::Reboot
                | Method::Rollback
                | Method::ApplyConfiguration
                | Method::EtcdForfeitLeadership
                | Method::MetaWrite
                | Method::MetaDelete
        )
    }

    /// The full gRPC method path.
    pub fn grpc_path(self) -> &'static str {
        match self {
            Method::Version => "/machine.MachineService/Version",
            Method::ServiceList => "/machine.MachineService/ServiceList",
            Method::EtcdMemberList => "/machine.MachineService/EtcdMemberList",
            Method::EtcdStatus => "/machine.MachineService/EtcdStatus",
            Method::EtcdSnapshot => "/machine.MachineService/EtcdSnapshot",
            Method::EtcdAlarmList => "/machine.MachineService/EtcdAlarmList",
            Method::EtcdForfeitLeadership => "/machine.MachineService/EtcdForfeitLeadership",
            Method::ImagePull => "/machine.ImageService/Pull",
            Method::Upgrade => "/machine.LifecycleService/Upgrade",
            Method::LegacyUpgrade => "/machine.MachineService/Upgrade",
            Method::Reboot => "/machine.MachineService/Reboot",
            Method::Rollback => "/machine.MachineService/Rollback",
            Method::Read => "/machine.MachineService/Read",
            Method::ApplyConfiguration => "/machine.MachineService/ApplyConfiguration",
            Method::CosiGet => "/cosi.resource.State/Get",
            Method::CosiList => "/cosi.resource.State/List",
            Method::HealthCheck => "/cluster.ClusterService/HealthCheck",
            Method::MetaWrite => "/machine.MachineService/MetaWrite",
            Method::MetaDelete => "/machine.MachineService/MetaDelete",
        }
    }
}

/// Which calls a call trigger matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", untagged)]
pub enum MethodSel {
    One(Method),
    /// Every method (`any`).
    Any(AnyMethod),
}

/// The literal `any`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum AnyMethod {
    Any,
}

impl MethodSel {
    pub fn matches(self, m: Method) -> bool {
        match self {
            MethodSel::One(x) => x == m,
            MethodSel::Any(_) => true,
        }
    }
}

impl From<Method> for MethodSel {
    fn from(m: Method) -> Self {
        MethodSel::One(m)
    }
}

fn one() -> u32 {
    1
}

/// When a fault fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Trigger {
    /// Calls of `method` (or `any`) to the node, from the `nth` (1-based) on.
    Call {
        method: MethodSel,
        #[serde(default = "one")]
        nth: u32,
    },
    /// The node's boots (after a Reboot or a legacy Upgrade), from the `nth` on.
    Boot {
        #[serde(default = "one")]
        nth: u32,
    },
}

impl Trigger {
    /// Every call of `method`, from the next one.
    pub fn call(method: Method) -> Trigger {
        Trigger::Call {
            method: method.into(),
            nth: 1,
        }
    }
    /// Calls of `method` from the `nth` on.
    pub fn nth_call(method: Method, nth: u32) -> Trigger {
        Trigger::Call {
            method: method.into(),
            nth,
        }
    }
    /// Every call, whatever the method.
    pub fn any_call() -> Trigger {
        Trigger::Call {
            method: MethodSel::Any(AnyMethod::Any),
            nth: 1,
        }
    }
    /// The next boot.
    pub fn boot() -> Trigger {
        Trigger::Boot { nth: 1 }
    }
}

/// What happens when a fault fires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Effect {
    /// The call is answered `UNAVAILABLE` before reaching the node (as apid answers when it
    /// cannot reach a node), for `calls` matching calls.
    Unavailable { calls: u32 },
    /// `LifecycleService.Upgrade`: the installer prints `message` and exits with `code`.
    /// Legacy `MachineService.Upgrade`: the call fails with `INTERNAL: message`.
    UpgradeExit { code: i32, message: String },
    /// `EtcdSnapshot`: the stream breaks (`INTERNAL`) after `afterBytes` bytes.
    SnapshotBreak {
        #[serde(rename = "afterBytes")]
        after_bytes: u64,
    },
    /// `EtcdSnapshot`: the member's database is `dbBytes` long (default 64 KiB; at most
    /// 256 MiB), as a busier cluster's is: a snapshot larger than an upload part.
    LargeSnapshot {
        #[serde(rename = "dbBytes")]
        db_bytes: u64,
    },
    /// Image pulls answer only after `delay` (`"30s"`, `"250ms"`).
    SlowPull {
        #[serde(with = "duration_text")]
        delay: Duration,
    },
    /// `ImageService.Pull` / `MachineService.ImagePull`: the pull fails with `UNKNOWN: failed to
    /// pull image "<ref>": <message>` (containerd's resolver or fetch error relayed by machined).
    PullFail { message: String },
    /// `ApplyConfiguration`: the control-plane static pod `component` (`kube-apiserver`,
    /// `kube-controller-manager`, `kube-scheduler`) whose image the applied config changes
    /// crash-loops with that new image: its mirror pod never becomes Ready
    /// (`CrashLoopBackOff`). Fires only on an apply that changes that component's image.
    CrashLoop { component: String },
    /// `ApplyConfiguration`: the control-plane static pod `component` whose image the applied
    /// config changes is restarted with its new image and becomes Ready, but its mirror pod
    /// keeps the `talos.dev/config-version` annotation of the config it ran before (a kubelet
    /// that did not pick up the re-rendered manifest). Fires only on an apply that changes that
    /// component's image.
    StaleConfigVersion { component: String },
    /// The node goes down for the boot and never comes back.
    NeverReturn,
    /// The node boots back on the version it ran before (Talos' bootloader fallback when the
    /// new version fails to boot): the upgrade silently did not take.
    BootOldVersion,
}

impl Effect {
    /// How many times the effect fires before the plan is spent.
    pub fn times(&self) -> u32 {
        match self {
            Effect::Unavailable { calls } => *calls,
            _ => 1,
        }
    }
}

/// The static pods a [`Effect::CrashLoop`] can name.
pub const CRASH_COMPONENTS: [&str; 3] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

/// One fault for one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FaultPlan {
    /// Node name (or address).
    pub node: String,
    pub on: Trigger,
    pub effect: Effect,
}

/// Why a fault plan was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FaultError {
    #[error("fault for node `{node}`: no such node (nodes: {known})")]
    UnknownNode { node: String, known: String },
    #[error("fault for node `{node}`: effect `{effect}` needs {needs}")]
    Mismatch {
        node: String,
        effect: &'static str,
        needs: &'static str,
    },
    #[error("fault for node `{node}`: `nth` and `calls` count from 1")]
    Zero { node: String },
}

impl FaultPlan {
    /// Check that the effect can fire on the trigger (e.g. `neverReturn` only on a boot).
    pub fn validate(&self) -> Result<(), FaultError> {
        let mismatch = |effect, needs| FaultError::Mismatch {
            node: self.node.clone(),
            effect,
            needs,
        };
        let zero = FaultError::Zero {
            node: self.node.clone(),
        };
        match self.on {
            Trigger::Call { nth: 0, .. } | Trigger::Boot { nth: 0 } => return Err(zero),
            _ => {}
        }
        if self.effect.times() == 0 {
            return Err(zero);
        }
        let call_of = |ms: &[Method]| match self.on {
            Trigger::Call {
                method: MethodSel::One(m),
                ..
            } => ms.contains(&m),
            _ => false,
        };
        match &self.effect {
            Effect::Unavailable { .. } => {
                if !matches!(self.on, Trigger::Call { .. }) {
                    return Err(mismatch("unavailable", "a call trigger"));
                }
            }
            Effect::UpgradeExit { .. } => {
                if !call_of(&[Method::Upgrade, Method::LegacyUpgrade]) {
                    return Err(mismatch(
                        "upgradeExit",
                        "a call trigger on `upgrade` or `legacyUpgrade`",
                    ));
                }
            }
            Effect::SnapshotBreak { .. } => {
                if !call_of(&[Method::EtcdSnapshot]) {
                    return Err(mismatch(
                        "snapshotBreak",
                        "a call trigger on `etcdSnapshot`",
                    ));
                }
            }
            Effect::LargeSnapshot { db_bytes } => {
                if !call_of(&[Method::EtcdSnapshot]) {
                    return Err(mismatch(
                        "largeSnapshot",
                        "a call trigger on `etcdSnapshot`",
                    ));
                }
                if *db_bytes == 0 || *db_bytes > 256 * 1024 * 1024 {
                    return Err(mismatch("largeSnapshot", "`dbBytes` in 1..=268435456"));
                }
            }
            Effect::SlowPull { .. } => {
                if !call_of(&[Method::ImagePull]) {
                    return Err(mismatch("slowPull", "a call trigger on `imagePull`"));
                }
            }
            Effect::PullFail { .. } => {
                if !call_of(&[Method::ImagePull]) {
                    return Err(mismatch("pullFail", "a call trigger on `imagePull`"));
                }
            }
            Effect::CrashLoop { component } => {
                if !call_of(&[Method::ApplyConfiguration]) {
                    return Err(mismatch(
                        "crashLoop",
                        "a call trigger on `applyConfiguration`",
                    ));
                }
                if !CRASH_COMPONENTS.contains(&component.as_str()) {
                    return Err(mismatch(
                        "crashLoop",
                        "a component among kube-apiserver, kube-controller-manager, kube-scheduler",
                    ));
                }
            }
            Effect::StaleConfigVersion { component } => {
                if !call_of(&[Method::ApplyConfiguration]) {
                    return Err(mismatch(
                        "staleConfigVersion",
                        "a call trigger on `applyConfiguration`",
                    ));
                }
                if !CRASH_COMPONENTS.contains(&component.as_str()) {
                    return Err(mismatch(
                        "staleConfigVersion",
                        "a component among kube-apiserver, kube-controller-manager, kube-scheduler",
                    ));
                }
            }
            Effect::NeverReturn | Effect::BootOldVersion => {
                if !matches!(self.on, Trigger::Boot { .. }) {
                    return Err(mismatch("neverReturn/bootOldVersion", "a boot trigger"));
                }
            }
        }
        Ok(())
    }
}

/// A fault that has been set, with its progress.
#[derive(Debug, Clone)]
pub(crate) struct ArmedFault {
    pub plan: FaultPlan,
    /// Matching occasions seen so far.
    pub seen: u32,
    /// Firings left.
    pub left: u32,
}

/// What a call or boot is, for matching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Occasion {
    Call(Method),
    Boot,
}

impl ArmedFault {
    pub fn new(plan: FaultPlan) -> ArmedFault {
        let left = plan.effect.times();
        ArmedFault {
            plan,
            seen: 0,
            left,
        }
    }

    fn matches(&self, o: Occasion) -> bool {
        match (self.plan.on, o) {
            (Trigger::Call { method, .. }, Occasion::Call(m)) => method.matches(m),
            (Trigger::Boot { .. }, Occasion::Boot) => true,
            _ => false,
        }
    }

    fn nth(&self) -> u32 {
        match self.plan.on {
            Trigger::Call { nth, .. } | Trigger::Boot { nth } => nth,
        }
    }

    /// Count the occasion; return the effect if the fault fires on it.
    pub fn observe(&mut self, o: Occasion, wants: impl Fn(&Effect) -> bool) -> Option<Effect> {
        if self.left == 0 || !self.matches(o) || !wants(&self.plan.effect) {
            return None;
        }
        self.seen += 1;
        if self.seen < self.nth() {
            return None;
        }
        self.left -= 1;
        Some(self.plan.effect.clone())
    }
}

/// Per-node side-effect counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NodeCounters {
    /// Calls that reached the node, by method.
    pub calls: BTreeMap<Method, u64>,
    /// Calls refused before reaching the node (node down or away, injected `UNAVAILABLE`).
    pub refused: BTreeMap<Method, u64>,
    /// Boots completed.
    pub boots: u64,
}

impl NodeCounters {
    /// Calls of `m` that reached the node.
    pub fn calls(&self, m: Method) -> u64 {
        self.calls.get(&m).copied().unwrap_or(0)
    }
    /// Calls of `m` refused before reaching the node.
    pub fn refused(&self, m: Method) -> u64 {
        self.refused.get(&m).copied().unwrap_or(0)
    }
    /// Upgrade calls (both RPCs) that reached the node.
    pub fn upgrades(&self) -> u64 {
        self.calls(Method::Upgrade) + self.calls(Method::LegacyUpgrade)
    }
    /// All mutating calls that reached the node.
    pub fn mutating(&self) -> u64 {
        self.calls
            .iter()
            .filter(|(m, _)| m.is_mutating())
            .map(|(_, n)| n)
            .sum()
    }
}

/// `"250ms"`, `"2s"` ⇄ `Duration`: [`crate::duration`]'s grammar, read leniently (scenario files
/// written for jiff's friendly format, `1m 30s`, keep loading).
pub(crate) use crate::duration::serde_lenient as duration_text;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nth_call_fires_once_from_the_nth() {
        let mut f = ArmedFault::new(FaultPlan {
            node: "cp-1".into(),
            on: Trigger::nth_call(Method::Upgrade, 2),
            effect: Effect::UpgradeExit {
                code: 1,
                message: "disk full".into(),
            },
        });
        let any = |_: &Effect| true;
        assert_eq!(f.observe(Occasion::Call(Method::Reboot), any), None);
        assert_eq!(f.observe(Occasion::Call(Method::Upgrade), any), None);
        assert!(f.observe(Occasion::Call(Method::Upgrade), any).is_some());
        assert_eq!(
            f.observe(Occasion::Call(Method::Upgrade), any),
            None,
            "spent"
        );
    }

    #[test]
    fn unavailable_fires_for_n_calls() {
        let mut f = ArmedFault::new(FaultPlan {
            node: "cp-1".into(),
            on: Trigger::any_call(),
            effect: Effect::Unavailable { calls: 2 },
        });
        let any = |_: &Effect| true;
        assert!(f.observe(Occasion::Call(Method::Version), any).is_some());
        assert!(f.observe(Occasion::Call(Method::Reboot), any).is_some());
        assert_eq!(f.observe(Occasion::Call(Method::Version), any), None);
        assert_eq!(f.observe(Occasion::Boot, any), None);
    }

    #[test]
    fn validation_pairs_effects_with_triggers() {
        let plan = |on, effect| FaultPlan {
            node: "w-1".into(),
            on,
            effect,
        };
        assert!(
            plan(Trigger::boot(), Effect::NeverReturn)
                .validate()
                .is_ok()
        );
        let err = plan(Trigger::call(Method::Reboot), Effect::NeverReturn)
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("boot trigger"), "{err}");
        assert!(
            plan(
                Trigger::call(Method::Version),
                Effect::SnapshotBreak { after_bytes: 1 }
            )
            .validate()
            .is_err()
        );
        assert!(
            plan(Trigger::any_call(), Effect::Unavailable { calls: 0 })
                .validate()
                .is_err()
        );
    }

    #[test]
    fn faults_parse_from_yaml() {
        let yaml = r#"
- node: cp-2
  on: { call: { method: upgrade, nth: 1 } }
  effect: { upgradeExit: { code: 1, message: "disk full" } }
- node: w-1
  on: { boot: {} }
  effect: bootOldVersion
- node: cp-1
  on: { call: { method: any } }
  effect: { unavailable: { calls: 3 } }
- node: cp-3
  on: { call: { method: imagePull } }
  effect: { slowPull: { delay: 1m 30s } }
- node: cp-1
  on: { call: { method: applyConfiguration } }
  effect: { crashLoop: { component: kube-apiserver } }
- node: cp-2
  on: { call: { method: imagePull, nth: 2 } }
  effect: { pullFail: { message: "not found" } }
- node: cp-1
  on: { call: { method: applyConfiguration } }
  effect: { staleConfigVersion: { component: kube-apiserver } }
"#;
        let plans: Vec<FaultPlan> = serde_saphyr::from_str(yaml).unwrap();
        assert_eq!(plans[0].on, Trigger::nth_call(Method::Upgrade, 1));
        assert_eq!(plans[1].effect, Effect::BootOldVersion);
        assert_eq!(plans[1].on, Trigger::boot());
        assert_eq!(plans[2].on, Trigger::any_call());
        assert_eq!(
            plans[3].effect,
            Effect::SlowPull {
                delay: Duration::from_secs(90)
            }
        );
        assert_eq!(
            plans[4].effect,
            Effect::CrashLoop {
                component: "kube-apiserver".into()
            }
        );
        assert_eq!(plans[5].on, Trigger::nth_call(Method::ImagePull, 2));
        assert_eq!(
            plans[6].effect,
            Effect::StaleConfigVersion {
                component: "kube-apiserver".into()
            }
        );
        let bad = FaultPlan {
            node: "cp-1".into(),
            on: Trigger::call(Method::ApplyConfiguration),
            effect: Effect::StaleConfigVersion {
                component: "kube-proxy".into(),
            },
        };
        assert!(bad.validate().is_err());
        for p in &plans {
            p.validate().unwrap();
        }
        let bad = FaultPlan {
            node: "cp-1".into(),
            on: Trigger::call(Method::ApplyConfiguration),
            effect: Effect::CrashLoop {
                component: "kubelet".into(),
            },
        };
        assert!(bad.validate().is_err());
        let bad = FaultPlan {
            node: "cp-1".into(),
            on: Trigger::call(Method::Version),
            effect: Effect::PullFail {
                message: "x".into(),
            },
        };
        assert!(bad.validate().is_err());
    }
}
