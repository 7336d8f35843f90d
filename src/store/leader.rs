//! Leadership and fencing: which replica may write for the planner and the executor, and the
//! proof it carries on each write.
//!
//! A [`Leadership`] is one replica's live view of the election. While it leads it holds a
//! [`Fence`]: the replica id and the *term*, a number that identifies this tenure and changes on
//! every election (in etcd, the `create_revision` of the leader key). A write made with
//! [`Check::Leader`] commits only while that term is still the store's current one, so a leader
//! that was paused, partitioned or deposed cannot write once another term began — whatever it
//! believes locally.
//!
//! Locally, a leader also knows a deadline: the lease expiry it has confirmed with the store
//! (minus a safety margin). [`Leadership::ensure`] fails once it has passed, so a process that
//! was stopped (SIGSTOP, a long GC-like stall, a suspended VM) refuses to act the moment it
//! resumes, before it even hears that another replica took over.
//!
//! The fjall backend has one permanent leader ([`Leadership::solo`]): its process lock already
//! guarantees a single writer. The etcd backend campaigns (see `store::etcd`).

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;

use super::{Check, Store, StoreError, Table, Txn};

/// The term of the single, permanent leader of an embedded (fjall) store.
pub const SOLO_TERM: i64 = 0;

/// Proof of one leadership term: which replica, and which tenure.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fence {
    replica: String,
    term: i64,
}

impl Fence {
    /// Backends create fences when a replica wins an election; tests may build stale ones.
    pub fn new(replica: impl Into<String>, term: i64) -> Fence {
        Fence {
            replica: replica.into(),
            term,
        }
    }
    pub fn replica(&self) -> &str {
        &self.replica
    }
    /// Identifies the tenure; a new election always yields a different term.
    pub fn term(&self) -> i64 {
        self.term
    }
}

impl std::fmt::Display for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (term {})", self.replica, self.term)
    }
}

/// What this replica currently is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// This replica leads; its writes carry `fence`.
    Leader { fence: Fence },
    /// Another replica leads (`Some`), or nobody does right now (`None`: an election is under
    /// way, or the store is unreachable).
    Follower { leader: Option<String> },
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct State {
    role: Role,
    /// Until when a `Leader` role may be acted on; `None` for a permanent leader.
    valid_until: Option<Instant>,
}

impl State {
    fn effective(&self, now: Instant) -> Role {
        match (&self.role, self.valid_until) {
            (Role::Leader { .. }, Some(until)) if now >= until => Role::Follower { leader: None },
            (role, _) => role.clone(),
        }
    }
}

struct Control {
    /// Kept so that a solo leadership's channel never closes.
    _solo: Option<watch::Sender<State>>,
    /// Dropping it (with the last handle) or sending `true` stops the campaign.
    stop: Option<watch::Sender<bool>>,
    done: Option<watch::Receiver<bool>>,
    /// Whatever the campaign runs on (the etcd client's runtime), kept alive by the handles.
    _runs_on: Option<Arc<dyn Send + Sync>>,
}

/// One replica's view of the election; cheap to clone, shared by the API, the planner and the
/// executor. Dropping the last clone ends the campaign (and resigns).
#[derive(Clone)]
pub struct Leadership {
    replica: Arc<str>,
    rx: watch::Receiver<State>,
    ctl: Arc<Control>,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("replica", &self.replica)
            .field("role", &self.role())
            .finish()
    }
}

impl Leadership {
    /// The permanent leader of a single-process (fjall) store, term [`SOLO_TERM`].
    pub fn solo(replica: impl Into<String>) -> Leadership {
        let replica: Arc<str> = replica.into().into();
        let (tx, rx) = watch::channel(State {
            role: Role::Leader {
                fence: Fence::new(replica.to_string(), SOLO_TERM),
            },
            valid_until: None,
        });
        Leadership {
            replica,
            rx,
            ctl: Arc::new(Control {
                _solo: Some(tx),
                stop: None,
                done: None,
                _runs_on: None,
            }),
        }
    }

    /// A follower handle and the backend side that publishes election results into it.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) fn campaign(
        replica: impl Into<String>,
        runs_on: Option<Arc<dyn Send + Sync>>,
    ) -> (Leadership, Campaigner) {
        let replica: Arc<str> = replica.into().into();
        let (tx, rx) = watch::channel(State {
            role: Role::Follower { leader: None },
            valid_until: None,
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        let (done_tx, done_rx) = watch::channel(false);
        (
            Leadership {
                replica: replica.clone(),
                rx,
                ctl: Arc::new(Control {
                    _solo: None,
                    stop: Some(stop_tx),
                    done: Some(done_rx),
                    _runs_on: runs_on,
                }),
            },
            Campaigner {
                replica,
                tx,
                stop: stop_rx,
                done: done_tx,
            },
        )
    }

    /// This replica's id.
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// The role now, with an expired lease counted as "not leading".
    pub fn role(&self) -> Role {
        self.rx.borrow().effective(Instant::now())
    }

    pub fn is_leader(&self) -> bool {
        matches!(self.role(), Role::Leader { .. })
    }

    /// The current term's fence, if this replica leads.
    pub fn fence(&self) -> Option<Fence> {
        match self.role() {
            Role::Leader { fence } => Some(fence),
            Role::Follower { .. } => None,
        }
    }

    /// Which replica leads, as far as this one knows.
    pub fn leader_replica(&self) -> Option<String> {
        match self.role() {
            Role::Leader { .. } => Some(self.replica.to_string()),
            Role::Follower { leader } => leader,
        }
    }

    /// The precondition that makes a write valid only in this replica's current term;
    /// `Err(NotLeader)` when it does not lead.
    pub fn check(&self) -> Result<Check, StoreError> {
        match self.role() {
            Role::Leader { fence } => Ok(Check::Leader(fence)),
            Role::Follower { leader } => Err(StoreError::NotLeader {
                replica: self.replica.to_string(),
                leader,
            }),
        }
    }

    /// Is `fence`'s term still this replica's current, unexpired term? Call it right before a
    /// mutating Talos/Kubernetes call, after the fenced intent write, with nothing that can
    /// wait in between.
    pub fn ensure(&self, fence: &Fence) -> Result<(), StoreError> {
        match self.role() {
            Role::Leader { fence: current } if current == *fence => Ok(()),
            _ => Err(StoreError::Fenced {
                replica: fence.replica.clone(),
                term: fence.term,
            }),
        }
    }

    /// Resolves at the next change of [`Leadership::role`] (including a lease running out)
    /// after this call. A caller that read [`Leadership::role`] before and waits for it to
    /// change uses [`Leadership::changed_from`]: a change between the two would be missed here.
    /// Never resolves once the campaign has ended for good.
    pub async fn changed(&self) {
        self.changed_from(&self.role()).await;
    }

    /// Resolves as soon as [`Leadership::role`] differs from `seen` (at once if it already
    /// does), including a lease running out. Never resolves once the campaign has ended for
    /// good with the role still `seen`.
    pub async fn changed_from(&self, seen: &Role) {
        let mut rx = self.rx.clone();
        loop {
            let until = {
                let state = rx.borrow_and_update();
                if state.effective(Instant::now()) != *seen {
                    return;
                }
                state.valid_until
            };
            let expiry = async {
                match until {
                    Some(u) => tokio::time::sleep_until(tokio::time::Instant::from_std(u)).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = rx.changed() => {
                    if r.is_err() && rx.borrow().effective(Instant::now()) == *seen {
                        std::future::pending::<()>().await;
                    }
                }
                _ = expiry => {}
            }
        }
    }

    /// Resolves with the fence as soon as this replica leads.
    pub async fn leading(&self) -> Fence {
        loop {
            let role = self.role();
            if let Role::Leader { fence } = &role {
                return fence.clone();
            }
            self.changed_from(&role).await;
        }
    }

    /// Resolves when `fence`'s term is over for this replica (deposed, expired or resigned).
    pub async fn lost(&self, fence: &Fence) {
        loop {
            let role = self.role();
            if !matches!(&role, Role::Leader { fence: f } if f == fence) {
                return;
            }
            self.changed_from(&role).await;
        }
    }

    /// Step down and stop campaigning: the leader key is released at once, so another replica
    /// takes over without waiting for the lease to expire. A solo leadership cannot resign.
    pub async fn resign(&self) {
        if let Some(stop) = &self.ctl.stop {
            let _ = stop.send(true);
        }
        if let Some(done) = &self.ctl.done {
            let mut done = done.clone();
            let _ = done.wait_for(|d| *d).await;
        }
    }
}

/// The backend side of a campaign: publishes what the election decided.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
pub(crate) struct Campaigner {
    replica: Arc<str>,
    tx: watch::Sender<State>,
    stop: watch::Receiver<bool>,
    done: watch::Sender<bool>,
}

#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
impl Campaigner {
    pub(crate) fn replica(&self) -> &str {
        &self.replica
    }
    pub(crate) fn lead(&self, fence: Fence, valid_until: Instant) {
        self.tx.send_replace(State {
            role: Role::Leader { fence },
            valid_until: Some(valid_until),
        });
    }
    /// A renewed lease: move the deadline without waking anyone (the role is unchanged).
    /// A term whose deadline already passed stays over: once `ensure` failed for a fence it
    /// never succeeds again, whatever a late renewal says.
    pub(crate) fn extend(&self, valid_until: Instant) {
        let now = Instant::now();
        self.tx.send_if_modified(|s| {
            if matches!(s.role, Role::Leader { .. }) && s.valid_until.is_some_and(|u| now < u) {
                s.valid_until = Some(valid_until);
            }
            false
        });
    }
    pub(crate) fn follow(&self, leader: Option<String>) {
        let next = State {
            role: Role::Follower { leader },
            valid_until: None,
        };
        self.tx.send_if_modified(|s| {
            if *s == next {
                false
            } else {
                *s = next;
                true
            }
        });
    }
    pub(crate) fn stopping(&self) -> bool {
        *self.stop.borrow() || self.stop.has_changed().is_err()
    }
    /// Resolves when the campaign must end (resign, or every handle dropped).
    pub(crate) fn stop_signal(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut stop = self.stop.clone();
        async move {
            let _ = stop.wait_for(|s| *s).await;
        }
    }
}

impl Drop for Campaigner {
    fn drop(&mut self) {
        self.follow(None);
        let _ = self.done.send(true);
    }
}

/// A store whose every commit is fenced on the current leadership term: use it for all the
/// writes of the leader's loops, so that none of them can land after the term ended. Reads pass
/// through. A follower's commit fails with [`StoreError::NotLeader`] and writes nothing.
pub struct FencedStore {
    inner: Arc<dyn Store>,
    leadership: Leadership,
}

impl FencedStore {
    pub fn new(inner: Arc<dyn Store>, leadership: Leadership) -> FencedStore {
        FencedStore { inner, leadership }
    }
    pub fn leadership(&self) -> &Leadership {
        &self.leadership
    }
}

impl Store for FencedStore {
    fn get(&self, table: Table, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(table, key)
    }
    fn scan(&self, table: Table, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.inner.scan(table, prefix)
    }
    fn scan_keys(&self, table: Table, prefix: &str) -> Result<Vec<String>, StoreError> {
        self.inner.scan_keys(table, prefix)
    }
    fn commit(&self, txn: Txn) -> Result<(), StoreError> {
        let check = self.leadership.check()?;
        self.inner.commit(txn.check(check))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn solo_leads_forever_in_term_zero() {
        let l = Leadership::solo("a");
        assert_eq!(l.fence(), Some(Fence::new("a", SOLO_TERM)));
        assert_eq!(l.leader_replica().as_deref(), Some("a"));
        assert!(matches!(l.check(), Ok(Check::Leader(f)) if f.term() == SOLO_TERM));
        assert!(l.ensure(&Fence::new("a", SOLO_TERM)).is_ok());
        let err = l.ensure(&Fence::new("a", 7)).unwrap_err();
        assert!(matches!(err, StoreError::Fenced { term: 7, .. }), "{err}");
    }

    #[tokio::test]
    async fn a_campaign_publishes_roles_and_an_expired_lease_is_not_leadership() {
        let (l, c) = Leadership::campaign("a", None);
        assert!(!l.is_leader());
        let err = l.check().unwrap_err();
        assert!(
            matches!(&err, StoreError::NotLeader { replica, leader: None } if replica == "a"),
            "{err}"
        );
        assert!(err.is_leadership_lost());

        c.follow(Some("b".into()));
        assert_eq!(l.leader_replica().as_deref(), Some("b"));

        let fence = Fence::new("a", 42);
        c.lead(fence.clone(), Instant::now() + Duration::from_secs(60));
        assert_eq!(l.leading().await, fence);
        assert!(l.ensure(&fence).is_ok());
        // A stale fence (an older term of the same replica) is refused.
        assert!(l.ensure(&Fence::new("a", 41)).is_err());

        // A deadline in the past: still "Leader" in the channel, but not to act on.
        c.extend(Instant::now() - Duration::from_millis(1));
        assert!(!l.is_leader());
        assert!(matches!(l.role(), Role::Follower { leader: None }));
        assert!(matches!(
            l.ensure(&fence),
            Err(StoreError::Fenced { term: 42, .. })
        ));
        l.lost(&fence).await; // resolves at once
        // A late renewal does not bring the term back.
        c.extend(Instant::now() + Duration::from_secs(60));
        assert!(!l.is_leader());
        assert!(l.ensure(&fence).is_err());
    }

    /// A change between reading the role and starting to wait is not lost: the follower that
    /// printed "following -" learns the leader (the `ha::replicas` flake: `b` never printed
    /// "following a" when `a` won between `role()` and `changed()`).
    #[tokio::test]
    async fn a_change_before_the_wait_starts_is_not_missed() {
        let (l, c) = Leadership::campaign("b", None);
        let seen = l.role();
        assert_eq!(seen, Role::Follower { leader: None }, "no leader known yet");
        c.follow(Some("a".to_string()));
        tokio::time::timeout(Duration::from_secs(10), l.changed_from(&seen))
            .await
            .expect("changed_from resolves at once: the role already differs from what was seen");
        let fence = Fence::new("b", 4);
        let seen = l.role();
        c.lead(fence.clone(), Instant::now() + Duration::from_secs(60));
        tokio::time::timeout(Duration::from_secs(10), l.changed_from(&seen))
            .await
            .expect("and again when it becomes the leader");
        assert_eq!(l.fence(), Some(fence));
    }

    #[tokio::test]
    async fn changed_wakes_when_the_lease_runs_out() {
        let (l, c) = Leadership::campaign("a", None);
        let fence = Fence::new("a", 3);
        c.lead(fence.clone(), Instant::now() + Duration::from_millis(50));
        assert!(l.is_leader());
        // No event is published: only the deadline passes.
        tokio::time::timeout(Duration::from_secs(10), l.lost(&fence))
            .await
            .expect("lost() resolves when the deadline passes");
        assert!(!l.is_leader());
    }

    #[tokio::test]
    async fn resign_stops_the_campaign_and_dropping_the_campaigner_means_follower() {
        let (l, c) = Leadership::campaign("a", None);
        c.lead(Fence::new("a", 1), Instant::now() + Duration::from_secs(60));
        let task = tokio::spawn(async move {
            c.stop_signal().await;
            assert!(c.stopping());
            drop(c);
        });
        l.resign().await;
        task.await.unwrap();
        assert!(matches!(l.role(), Role::Follower { leader: None }));
    }
}
