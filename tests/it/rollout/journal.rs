//! The journal format: commit sizes, what is fsynced, reading a job back from its checkpoint.

use super::*;

/// Records the size of every committed transaction and whether it rewrote the job record;
/// and the durability of each journal entry kind.
struct Sizes {
    inner: MemStore,
    commits: Mutex<Vec<(usize, bool)>>,
    durability: Mutex<Vec<(String, bool, medea::store::Durability)>>,
}

impl Store for Sizes {
    fn get(&self, table: Table, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(table, key)
    }
    fn scan(&self, table: Table, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.inner.scan(table, prefix)
    }
    fn commit(&self, txn: Txn) -> Result<(), StoreError> {
        let bytes = txn
            .ops
            .iter()
            .map(|op| match op {
                TxnOp::Put(_, k, v) => k.len() + v.len(),
                TxnOp::Delete(_, k) => k.len(),
            })
            .sum();
        let job = txn
            .ops
            .iter()
            .any(|op| matches!(op, TxnOp::Put(Table::Jobs, k, _) if k.starts_with("job/")));
        let entry = journal_entry(&txn);
        let durability = txn.durability;
        self.inner.commit(txn)?;
        self.commits.lock().unwrap().push((bytes, job));
        if let Some(e) = entry {
            let terminal = !matches!(
                e.delta.as_ref().map(|d| &d.state),
                None | Some(JobState::Running)
            );
            self.durability.lock().unwrap().push((
                e.entry.name().to_string(),
                terminal,
                durability,
            ));
        }
        Ok(())
    }
}

/// Run a one-pool rollout of `workers` workers (4 at a time) on a [`Sizes`] store.
async fn sized_run(workers: usize) -> (Vec<(usize, bool)>, World, Arc<Sizes>, Job) {
    let sizes = Arc::new(Sizes {
        inner: MemStore::new(),
        commits: Mutex::new(Vec::new()),
        durability: Mutex::new(Vec::new()),
    });
    let names: Vec<String> = (1..=workers).map(|i| format!("w-{i}")).collect();
    let w = world_in(
        FakeCluster::new(&specs(0, workers, FROM, KUBE)),
        sizes.clone(),
        |f| {
            let waves: Vec<Vec<&str>> = names
                .chunks(4)
                .map(|c| c.iter().map(|s| s.as_str()).collect())
                .collect();
            let waves: Vec<&[&str]> = waves.iter().map(|w| w.as_slice()).collect();
            vec![talos_step(f, "workers", &waves, TO, 4)]
        },
        &[],
    );
    sizes.commits.lock().unwrap().clear();
    let created = w.job();
    assert_eq!(
        w.executor().run(&w.job).await.unwrap(),
        RunOutcome::Succeeded
    );
    let commits = sizes.commits.lock().unwrap().clone();
    (commits, w, sizes, created)
}

#[tokio::test(start_paused = true)]
async fn journal_commits_do_not_grow_with_the_job() {
    let (small, ..) = sized_run(4).await;
    let (large, w, ..) = sized_run(120).await;
    // between checkpoints a commit carries the journal entry and its delta only: the same size
    // whether the job has 4 nodes or 120 (node names differ in length by at most 2 bytes)
    let largest =
        |c: &[(usize, bool)]| c.iter().filter(|(_, j)| !j).map(|(b, _)| *b).max().unwrap();
    assert!(
        largest(&large) <= largest(&small) + 64,
        "120 nodes: {} bytes, 4 nodes: {} bytes",
        largest(&large),
        largest(&small)
    );
    // the whole job is rewritten only at checkpoints and at the end
    let rewrites: Vec<usize> = large
        .iter()
        .enumerate()
        .filter(|(_, (_, j))| *j)
        .map(|(i, _)| i + 1)
        .collect();
    let every = medea::rollout::journal::CHECKPOINT_EVERY as usize;
    assert_eq!(
        rewrites.last(),
        Some(&large.len()),
        "the final commit checkpoints"
    );
    assert_eq!(
        rewrites.len(),
        large.len() / every + usize::from(large.len() % every != 0)
    );
    assert!(
        rewrites.iter().rev().skip(1).all(|i| i % every == 0),
        "{rewrites:?}"
    );
    // and the job reads back complete: checkpoint plus the journal after it
    let job = w.job();
    assert!(matches!(job.state, JobState::Succeeded { .. }));
    assert_eq!(job.journal_seq as usize, large.len());
    assert_rolled(&w.state(), TO, 1);
}

#[tokio::test(start_paused = true)]
async fn intents_and_the_end_of_a_job_are_fsynced_results_ride_on_the_next_intent() {
    use medea::store::Durability;
    let (_, _, sizes, _) = sized_run(8).await;
    let d = sizes.durability.lock().unwrap().clone();
    assert!(d.iter().any(|(n, ..)| n == "result"));
    for (i, (name, terminal, durability)) in d.iter().enumerate() {
        let want = if name == "intent" || name == "created" || *terminal {
            Durability::Durable
        } else {
            Durability::Buffered
        };
        assert_eq!(
            *durability, want,
            "commit {i}: {name} (terminal: {terminal})"
        );
        // a buffered entry is always followed by a durable one before the job ends: the next
        // call's intent or the job's end
        if *durability == Durability::Buffered {
            assert!(d[i + 1..].iter().any(|(.., x)| *x == Durability::Durable));
        }
    }
    assert!(d.last().unwrap().1, "the last entry ends the job");
    assert_eq!(d.last().unwrap().2, Durability::Durable);
}

#[tokio::test(start_paused = true)]
async fn a_job_reads_back_from_its_checkpoint_and_the_journal_after_it() {
    let (commits, w, sizes, created) = sized_run(40).await;
    let every = medea::rollout::journal::CHECKPOINT_EVERY;
    assert!(commits.len() as u64 > 2 * every);
    let done = w.job();
    let entries = w.journal();
    assert_eq!(entries.len() as u64, done.journal_seq + 1);
    assert!(
        entries[0].delta.is_none(),
        "the creation carries the whole job"
    );
    assert!(
        entries[1..].iter().all(|e| e.delta.is_some()),
        "every later entry its delta"
    );
    // the journal alone, from the creation, rebuilds the finished job
    let mut replay = created.clone();
    for e in &entries[1..] {
        e.delta.as_ref().unwrap().apply(&mut replay).unwrap();
        replay.journal_seq = e.seq;
    }
    assert_eq!(replay, done);
    // put back the older checkpoint (the last multiple of CHECKPOINT_EVERY before the end):
    // reading the job replays the entries after it and finds the finished job
    let at = (done.journal_seq - 1) / every * every;
    let mut old = created.clone();
    for e in &entries[1..=at as usize] {
        e.delta.as_ref().unwrap().apply(&mut old).unwrap();
        old.journal_seq = e.seq;
    }
    assert!(!old.state.is_terminal());
    sizes
        .inner
        .commit(Txn::new().put_record(job_key(&w.job), &old))
        .unwrap();
    assert_eq!(
        w.job(),
        done,
        "the entries after the checkpoint bring it up to date"
    );
    // an entry after the checkpoint without its delta is refused, never skipped
    let mut broken = entries[at as usize + 1].clone();
    broken.delta = None;
    sizes
        .inner
        .commit(Txn::new().put_record(
            medea::rollout::journal::entry_key(&w.job, broken.seq),
            &broken,
        ))
        .unwrap();
    let err = medea::ops::jobs::load_job(sizes.as_ref(), &w.job).unwrap_err();
    assert!(matches!(err, StoreError::Decode { .. }), "{err}");
}
