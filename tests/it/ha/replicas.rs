//! Replica processes: `medea __ha-probe` replicas killed (or frozen) at chosen points; every
//! step acts once.

use super::*;

enum KillPoint {
    /// Right after winning, before any intent.
    JustElected,
    /// After this many steps were journaled and acted on.
    AfterActing(u64),
    /// After journaling this intent, before re-checking leadership and acting on it.
    BetweenIntentAndAction(u64),
}

fn failover(point: KillPoint, label: &str) {
    let Some(etcd) = Etcd::shared() else { return };
    let prefix = unique_prefix(label);
    let dir = tempfile::tempdir().unwrap();
    let acts: PathBuf = dir.path().join("actions");
    // Enough steps at a slow enough pace that the kill lands mid-run.
    const STEPS: u64 = 20;
    let steps = STEPS.to_string();
    let stop = match point {
        KillPoint::BetweenIntentAndAction(n) => Some(n.to_string()),
        _ => None,
    };
    let mut a_args = vec!["--steps", &steps, "--wait-for-go", "--interval", "100ms"];
    if let Some(n) = &stop {
        a_args.extend(["--stop-after-intent", n.as_str()]);
    }
    let mut a = Replica::probe(etcd, &prefix, "a", &acts, &a_args);
    a.wait_for("leading", PATIENCE, |l| l.starts_with("leading"));
    a.wait_for("ready", PATIENCE, |l| l == "ready");
    let mut b = Replica::probe(etcd, &prefix, "b", &acts, &["--steps", &steps]);
    b.wait_for("following a", PATIENCE, |l| l == "following a");

    let killed_at = match point {
        KillPoint::JustElected => a.kill9(),
        KillPoint::AfterActing(n) => {
            a.go();
            a.wait_for(&format!("acted {n}"), PATIENCE, |l| {
                number_after(l, "acted ") == Some(n)
            });
            a.kill9()
        }
        KillPoint::BetweenIntentAndAction(n) => {
            a.go();
            a.wait_for("stopping after the intent", PATIENCE, |l| {
                l.starts_with("stopping after intent")
            });
            let at = a.kill9();
            assert!(
                !actions(&acts).iter().any(|(k, _)| *k == n),
                "the stopped leader acted on {n}"
            );
            at
        }
    };
    a.drain();
    assert!(
        !a.seen.iter().any(|l| l == "finished"),
        "a finished before it was killed: {:?}",
        a.seen
    );
    let (took_over, _) = b.wait_for("leading", TTL + TAKEOVER_SLACK, |l| {
        l.starts_with("leading")
    });
    let took = took_over.saturating_duration_since(killed_at);
    eprintln!("{label}: takeover {took:?} after the kill (lease TTL {TTL:?})");
    assert!(took <= TTL + TAKEOVER_SLACK, "takeover after {took:?}");
    if let KillPoint::BetweenIntentAndAction(n) = point {
        b.wait_for("the resume", PATIENCE, |l| l == format!("resume {n}"));
    }
    b.wait_for("finished", PATIENCE, |l| l == "finished");
    assert!(b.child.wait().unwrap().success());
    assert_each_step_acted_once(&acts, STEPS);
    if let KillPoint::BetweenIntentAndAction(n) = point {
        let acts = actions(&acts);
        assert!(acts.contains(&(n, "b".to_string())), "{acts:?}");
    }
}

#[test]
fn a_leader_killed_just_after_winning_is_replaced_within_the_ttl() {
    failover(KillPoint::JustElected, "kill-elected");
}

#[test]
fn a_leader_killed_mid_run_is_replaced_and_every_step_acts_once() {
    failover(KillPoint::AfterActing(3), "kill-mid");
}

#[test]
fn a_leader_killed_between_intent_and_action_is_resumed_by_the_new_leader() {
    failover(KillPoint::BetweenIntentAndAction(4), "kill-intent");
}

/// The old leader is frozen (SIGSTOP) between journaling an intent and acting on it; the
/// follower takes over, resumes that intent and goes on. Resumed (SIGCONT), the old leader
/// performs no write and no action: its re-check refuses, and so would etcd.
#[test]
fn a_frozen_leader_resumed_after_failover_neither_writes_nor_acts() {
    let Some(etcd) = Etcd::shared() else { return };
    let prefix = unique_prefix("sigstop");
    let dir = tempfile::tempdir().unwrap();
    let acts = dir.path().join("actions");
    let mut a = Replica::probe(
        etcd,
        &prefix,
        "a",
        &acts,
        &["--stop-after-intent", "3", "--wait-for-go"],
    );
    a.wait_for("ready", PATIENCE, |l| l == "ready");
    let mut b = Replica::probe(etcd, &prefix, "b", &acts, &[]);
    b.wait_for("following a", PATIENCE, |l| l == "following a");
    a.go();
    let (stopped_at, _) = a.wait_for("stopping after intent 3", PATIENCE, |l| {
        l == "stopping after intent 3"
    });
    let (took_over, _) = b.wait_for("leading", TTL + TAKEOVER_SLACK, |l| {
        l.starts_with("leading")
    });
    let took = took_over.saturating_duration_since(stopped_at);
    eprintln!("sigstop: takeover {took:?} after the stop (lease TTL {TTL:?})");
    assert!(took <= TTL + TAKEOVER_SLACK, "takeover after {took:?}");
    b.wait_for("resume 3", PATIENCE, |l| l == "resume 3");
    b.wait_for("acted 5", PATIENCE, |l| {
        number_after(l, "acted ") == Some(5)
    });

    a.signal("-CONT");
    a.wait_for("the refused action", PATIENCE, |l| {
        l.starts_with("refused action 3:")
    });
    a.wait_for("following b", PATIENCE, |l| l == "following b");
    // b goes on undisturbed.
    b.wait_for("acted 8", PATIENCE, |l| {
        number_after(l, "acted ") == Some(8)
    });
    b.kill9();
    a.kill9();
    a.drain();
    let after_stop: Vec<&String> = a
        .seen
        .iter()
        .skip_while(|l| *l != "stopping after intent 3")
        .collect();
    assert!(
        !after_stop
            .iter()
            .any(|l| l.starts_with("intent ") || l.starts_with("acted ")),
        "the resumed old leader wrote or acted: {after_stop:?}"
    );
    let acted = actions(&acts);
    assert!(acted.contains(&(3, "b".to_string())), "{acted:?}");
    assert!(
        acted
            .iter()
            .filter(|(_, who)| who == "a")
            .all(|(k, _)| *k < 3),
        "{acted:?}"
    );
    let last = acted.iter().map(|(k, _)| *k).max().unwrap();
    // b was killed at an arbitrary point: its last intent may lack its action.
    let store = etcd.store(&prefix);
    let counter: u64 =
        String::from_utf8(store.get(Table::Journal, "probe/counter").unwrap().unwrap())
            .unwrap()
            .parse()
            .unwrap();
    assert!(
        counter == last || counter == last + 1,
        "counter {counter}, last action {last}"
    );
    assert_each_step_acted_once(&acts, last);
    // Intent 3 was journaled by a; every later one by b.
    for (k, v) in store.scan(Table::Journal, "probe/intent/").unwrap() {
        let n: u64 = k.rsplit('/').next().unwrap().parse().unwrap();
        let who = String::from_utf8(v).unwrap();
        if n <= 3 {
            assert!(who.starts_with("a "), "{k}: {who}");
        } else {
            assert!(who.starts_with("b "), "{k}: {who}");
        }
    }
}
