//! The simulated etcd's leadership (issue #48): one member leads; it keeps the leadership
//! until it goes down or hands it over, and the others then elect one of them.
//!
//! Upstream, as modelled:
//! - raft leadership is sticky: a member that leads stays leader until it stops answering
//!   (the others' election timeout fires) or transfers it; a member that comes back does not
//!   take it back (etcd-io/raft `raft.go`, elections on `electionTimeout`; etcd-io/etcd
//!   `server/etcdserver/server.go` `MoveLeader`). Which member wins an election is a race of
//!   randomized timeouts; the simulator picks the first eligible member by member id, so runs
//!   are repeatable.
//! - `MachineService.EtcdForfeitLeadership` (siderolabs/talos
//!   `internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go`
//!   `EtcdForfeitLeadership`, `internal/pkg/etcd/etcd.go` `ForfeitLeadership`): control planes
//!   only (`CheckControlplane`: `Unimplemented` "etcd forfeit leadership is only available on
//!   control plane nodes"); a lone member is refused ("cannot forfeit leadership, only one
//!   member"); a member that does not lead answers at once with an empty `member`; the leader
//!   moves its leadership (`Maintenance.MoveLeader`) to the first *other* member of the member
//!   list — etcd lists members sorted by id (`server/etcdserver/api/membership/cluster.go`
//!   `Members`) — whatever that member's health, and answers its name. A transferee that does
//!   not answer times the transfer out (`ErrTimeoutLeaderTransfer`, "etcdserver: request
//!   timed out, leader transfer took too long"), the leadership staying where it was. Talos
//!   returns the error wrapped ("failed to forfeit leadership: …"), a gRPC `Unknown`.

use tonic::Status;

use super::{Power, SimNode, TalosSide};

/// Who leads the simulated etcd, and what happened to the leadership.
#[derive(Debug, Clone, Default)]
pub struct EtcdLeadership {
    /// The member id of the leader as last settled (`None`: no member could lead).
    pub leader: Option<u64>,
    /// Leader changes since the start (elections and transfers): etcd's raft term moves by
    /// at least one at each.
    pub elections: u64,
    /// Every `EtcdForfeitLeadership` a member answered, in order.
    pub forfeits: Vec<Forfeit>,
}

/// One forfeit a member answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forfeit {
    /// The node asked.
    pub node: String,
    /// It led, and handed the leadership to this node; `None`: it did not lead (or the
    /// transfer failed, see `error`).
    pub to: Option<String>,
    /// The transfer failed with this message.
    pub error: Option<String>,
}

const TRANSFER_TIMED_OUT: &str = "etcdserver: request timed out, leader transfer took too long";

fn eligible(n: &SimNode) -> bool {
    n.control_plane() && n.power == Power::Up && n.etcd_healthy
}

impl TalosSide {
    /// The control planes by member id (etcd's member list order).
    fn members_by_id(&self) -> Vec<usize> {
        let mut m: Vec<usize> = (0..self.nodes().len())
            .filter(|&i| self.nodes()[i].control_plane())
            .collect();
        m.sort_by_key(|&i| self.nodes()[i].member_id);
        m
    }

    /// The member id every member reports as its leader (`EtcdStatus.leader`), 0 while no
    /// member can lead: the settled leader while it answers, else the member the others
    /// would elect.
    pub fn etcd_leader(&self) -> u64 {
        if let Some(id) = self.etcd.leader
            && self
                .nodes()
                .iter()
                .any(|n| n.member_id == id && eligible(n))
        {
            return id;
        }
        self.members_by_id()
            .into_iter()
            .map(|i| &self.nodes()[i])
            .find(|n| eligible(n))
            .map_or(0, |n| n.member_id)
    }

    /// The name of the node whose member leads (tests, `medea sim` status).
    pub fn etcd_leader_name(&self) -> Option<String> {
        let id = self.etcd_leader();
        self.nodes()
            .iter()
            .find(|n| n.member_id == id && id != 0)
            .map(|n| n.spec.name.clone())
    }

    /// Record who leads now (an election happened if the leader could no longer lead).
    pub fn settle_etcd_leader(&mut self) {
        let now = Some(self.etcd_leader()).filter(|id| *id != 0);
        if now != self.etcd.leader {
            if now.is_some() {
                self.etcd.elections += 1;
            }
            self.etcd.leader = now;
        }
    }

    /// Node `idx` is going down: if its member leads, the others elect one of them.
    pub fn etcd_member_down(&mut self, idx: usize) {
        self.settle_etcd_leader();
        let me = self.nodes()[idx].member_id;
        if self.etcd.leader != Some(me) {
            return;
        }
        let next = self
            .members_by_id()
            .into_iter()
            .filter(|&i| i != idx)
            .map(|i| &self.nodes()[i])
            .find(|n| eligible(n))
            .map(|n| n.member_id);
        self.etcd.leader = next;
        if next.is_some() {
            self.etcd.elections += 1;
        }
    }

    /// `MachineService.EtcdForfeitLeadership` on node `idx` (a control plane: the caller
    /// checks): the new leader's name, empty when the member did not lead.
    pub fn forfeit_leadership(&mut self, idx: usize) -> Result<String, Status> {
        let members = self.members_by_id();
        if members.len() == 1 {
            return Err(Status::unknown(
                "failed to forfeit leadership: cannot forfeit leadership, only one member",
            ));
        }
        self.settle_etcd_leader();
        let name = self.nodes()[idx].spec.name.clone();
        let Some(leader) = self.etcd.leader else {
            // the etcd client requires a leader (`clientv3.WithRequireLeader`)
            return Err(Status::unavailable(
                "failed to forfeit leadership: failed to list etcd members: etcdserver: no leader",
            ));
        };
        if leader != self.nodes()[idx].member_id {
            self.etcd.forfeits.push(Forfeit {
                node: name,
                to: None,
                error: None,
            });
            return Ok(String::new());
        }
        let Some(&to) = members.iter().find(|&&i| i != idx) else {
            return Ok(String::new());
        };
        let target = &self.nodes()[to];
        if !eligible(target) {
            self.etcd.forfeits.push(Forfeit {
                node: name,
                to: None,
                error: Some(TRANSFER_TIMED_OUT.into()),
            });
            return Err(Status::unknown(format!(
                "failed to forfeit leadership: {TRANSFER_TIMED_OUT}"
            )));
        }
        let (id, to_name) = (target.member_id, target.spec.name.clone());
        self.etcd.leader = Some(id);
        self.etcd.elections += 1;
        self.etcd.forfeits.push(Forfeit {
            node: name,
            to: Some(to_name.clone()),
            error: None,
        });
        Ok(to_name)
    }
}
