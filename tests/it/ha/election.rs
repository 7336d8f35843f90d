//! In process: `EtcdStore::campaign` directly (one leader, fences, resigning, a leader cut off
//! or whose key is deleted).

use super::*;

#[test]
fn of_two_campaigners_exactly_one_leads_and_the_other_names_it() {
    let Some(etcd) = Etcd::shared() else { return };
    let prefix = unique_prefix("two");
    let (sa, sb) = (etcd.store(&prefix), etcd.store(&prefix));
    let a = sa.campaign("a", TTL);
    let b = sb.campaign("b", TTL);
    let rt = rt();
    rt.block_on(async {
        let winner = within(PATIENCE, "a leader", async {
            tokio::select! {
                f = a.leading() => f,
                f = b.leading() => f,
            }
        })
        .await;
        let (leader, follower) = if winner.replica() == "a" {
            (&a, &b)
        } else {
            (&b, &a)
        };
        within(PATIENCE, "the follower to learn the leader", async {
            while follower.leader_replica().as_deref() != Some(winner.replica()) {
                follower.changed().await;
            }
        })
        .await;
        assert!(leader.is_leader());
        assert!(!follower.is_leader());
        assert_eq!(
            sa.current_leader().unwrap(),
            Some((winner.replica().to_string(), winner.term()))
        );
        // The follower's fenced writes are refused before reaching etcd.
        let err = follower.check().unwrap_err();
        assert!(
            matches!(&err, StoreError::NotLeader { leader: Some(l), .. } if l == winner.replica()),
            "{err}"
        );
    });
}

#[test]
fn a_deposed_leaders_fence_is_refused_and_a_follower_cannot_write() {
    let Some(etcd) = Etcd::shared() else { return };
    let prefix = unique_prefix("deposed");
    let sa: std::sync::Arc<dyn Store> = std::sync::Arc::new(etcd.store(&prefix));
    let sb = etcd.store(&prefix);
    let rt = rt();
    let a = etcd.store(&prefix).campaign("a", TTL);
    let old = rt.block_on(within(PATIENCE, "a to lead", a.leading()));
    sa.commit(
        Txn::new()
            .fenced(&old)
            .put(Table::Jobs, "j", b"by a".to_vec()),
    )
    .unwrap();
    rt.block_on(within(PATIENCE, "a to resign", a.resign()));
    let b = sb.campaign("b", TTL);
    let new = rt.block_on(within(PATIENCE, "b to lead", b.leading()));
    assert_ne!(old.term(), new.term());

    // a wakes up with its old fence: etcd refuses, nothing changes.
    let err = sa
        .commit(
            Txn::new()
                .fenced(&old)
                .put(Table::Jobs, "j", b"by a, late".to_vec()),
        )
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Fenced { replica, term } if replica == "a" && *term == old.term()),
        "{err}"
    );
    // A forged fence with b's term but a's name is refused too (the value is compared).
    let err = sa
        .commit(Txn::new().fenced(&Fence::new("a", new.term())).put(
            Table::Jobs,
            "j",
            b"forged".to_vec(),
        ))
        .unwrap_err();
    assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
    assert_eq!(sa.get(Table::Jobs, "j").unwrap(), Some(b"by a".to_vec()));

    // Through FencedStore: a (resigned, following) writes nothing; b's writes land.
    let fa = FencedStore::new(sa.clone(), a.clone());
    let err = fa
        .commit(Txn::new().put(Table::Jobs, "j", b"x".to_vec()))
        .unwrap_err();
    assert!(matches!(err, StoreError::NotLeader { .. }), "{err}");
    let fb = FencedStore::new(sa.clone(), b.clone());
    fb.commit(Txn::new().put(Table::Jobs, "j", b"by b".to_vec()))
        .unwrap();
    assert_eq!(sa.get(Table::Jobs, "j").unwrap(), Some(b"by b".to_vec()));
}

#[test]
fn resigning_hands_over_without_waiting_for_the_lease() {
    let Some(etcd) = Etcd::shared() else { return };
    let prefix = unique_prefix("resign");
    let long = Duration::from_secs(30);
    let a = etcd.store(&prefix).campaign("a", long);
    let rt = rt();
    rt.block_on(within(PATIENCE, "a to lead", a.leading()));
    let b = etcd.store(&prefix).campaign("b", long);
    rt.block_on(async {
        within(PATIENCE, "b to follow a", async {
            while b.leader_replica().as_deref() != Some("a") {
                b.changed().await;
            }
        })
        .await;
        let t0 = Instant::now();
        a.resign().await;
        within(Duration::from_secs(10), "b to take over", b.leading()).await;
        assert!(t0.elapsed() < long / 3, "{:?}", t0.elapsed());
        assert!(matches!(a.role(), Role::Follower { .. }));
    });
}

/// etcd frozen (as if partitioned away): the leader stops leading by its own deadline, before
/// the lease could have expired on the server, and no later than the TTL.
#[test]
fn a_leader_cut_off_from_etcd_stops_leading_within_the_ttl() {
    let Some(etcd) = Etcd::start() else { return };
    let prefix = unique_prefix("cutoff");
    let store = etcd.store(&prefix);
    let a = store.campaign("a", TTL);
    let rt = rt();
    let fence = rt.block_on(within(PATIENCE, "a to lead", a.leading()));
    etcd.freeze();
    let t0 = Instant::now();
    rt.block_on(within(
        TTL + Duration::from_secs(2),
        "a to step down",
        a.lost(&fence),
    ));
    let took = t0.elapsed();
    assert!(
        took <= TTL,
        "stepped down after {took:?}, lease TTL {TTL:?}"
    );
    assert!(!a.is_leader());
    assert!(matches!(a.ensure(&fence), Err(StoreError::Fenced { .. })));
    etcd.thaw();
    // Back in contact, it (the only candidate) leads again, in a new term.
    let again = rt.block_on(within(PATIENCE, "a to lead again", a.leading()));
    assert_ne!(again.term(), fence.term());
}

/// An operator deletes the leader key: the leader notices on its next renewal tick.
#[test]
fn a_leader_whose_key_is_deleted_steps_down() {
    let Some(etcd) = Etcd::shared() else { return };
    let prefix = unique_prefix("deleted");
    let a = etcd.store(&prefix).campaign("a", TTL);
    let rt = rt();
    let fence = rt.block_on(within(PATIENCE, "a to lead", a.leading()));
    etcd.raw().delete(format!("{prefix}/leader"));
    rt.block_on(async {
        within(TTL, "a to notice", a.lost(&fence)).await;
        let again = within(PATIENCE, "a new term", a.leading()).await;
        assert_ne!(again.term(), fence.term());
    });
}
