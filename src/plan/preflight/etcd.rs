//! etcd health before a rollout: alarms and unhealthy or unreachable members block a plan that
//! touches the control plane or Kubernetes (a warning otherwise); a single member or a learner
//! is a warning.

use super::{Finding, Scope, Severity, checks};
use crate::inventory::preflight::PreflightObservations;

pub(super) fn check(p: &PreflightObservations, scope: &Scope) -> Vec<Finding> {
    let severe = if scope.control_plane_or_kubernetes {
        Severity::Blocking
    } else {
        Severity::Warning
    };
    let why = if scope.control_plane_or_kubernetes {
        "this plan touches the control plane or Kubernetes"
    } else {
        "this plan touches workers only"
    };
    let mut out = Vec::new();
    let Some(etcd) = &p.etcd else {
        out.push(Finding::new(
            "etcd/unobserved",
            checks::ETCD,
            severe,
            format!("no control-plane node answered about etcd: its health is unknown ({why})"),
            vec!["EtcdMemberList, EtcdStatus and EtcdAlarmList got no answer from any control-plane node".into()],
            "check the Talos API of the control-plane nodes with `medea doctor --creds-dir <dir>` and refresh",
        ));
        return out;
    };
    for a in &etcd.alarms {
        out.push(Finding::new(
            format!("etcd/alarm/{}/{}", a.alarm, a.member),
            checks::ETCD,
            severe,
            format!("etcd alarm {} is active on member {} ({why})", a.alarm, a.member),
            vec![format!("EtcdAlarmList: member {} alarm {}", a.member, a.alarm)],
            match a.alarm.as_str() {
                "NOSPACE" => "free space (compact and defragment etcd), then disarm the alarm (`etcdctl alarm disarm`)",
                "CORRUPT" => "find the corrupt member, replace it from a healthy snapshot, then disarm the alarm",
                _ => "resolve the alarm's cause, then disarm it (`etcdctl alarm disarm`)",
            },
        ));
    }
    for m in etcd.members.iter().filter(|m| !m.healthy) {
        out.push(Finding::new(
            format!("etcd/unhealthy/{}", m.name),
            checks::ETCD,
            severe,
            format!("etcd member {} ({}) is unhealthy ({why})", m.name, m.id),
            vec![format!(
                "EtcdStatus of {} failed or reported errors",
                m.name
            )],
            "bring the member back to health (`talosctl etcd status`) before rolling the cluster",
        ));
    }
    for (node, err) in &etcd.unreachable {
        out.push(Finding::new(
            format!("etcd/unreachable/{node}"),
            checks::ETCD,
            severe,
            format!("control-plane node {node} could not be asked about etcd ({why})"),
            vec![format!("{node}: {err}")],
            "make the node's Talos API reachable and refresh",
        ));
    }
    if etcd.members.len() == 1 {
        out.push(Finding::new(
            "etcd/single-member",
            checks::ETCD,
            Severity::Warning,
            format!(
                "etcd has a single member ({}): while its node reboots the Kubernetes API is down",
                etcd.members[0].name
            ),
            vec!["EtcdMemberList: 1 member".into()],
            "expect API downtime during the control-plane step, or add control-plane nodes first",
        ));
    }
    for m in etcd.members.iter().filter(|m| m.learner) {
        out.push(Finding::new(
            format!("etcd/learner/{}", m.name),
            checks::ETCD,
            Severity::Warning,
            format!("etcd member {} ({}) is a learner, not a voting member yet", m.name, m.id),
            vec![format!("EtcdMemberList: {} is_learner=true", m.name)],
            "wait for the learner to be promoted (a member still joining) before rolling the control plane",
        ));
    }
    out
}
