//! Issue #49, "Trust holes, round 3", the backup items: a token holder cannot erase the restore
//! points (item 4), and `medea backup verify --restore` serves nothing to other local users
//! (item 5).

use std::os::unix::fs::PermissionsExt as _;
use std::sync::Arc;

use medea::backup::{self, Trigger};
use medea::rollout::fake::MemStore;
use medea::sim::kube::KubeSimConfig;
use medea::store::Store;

use crate::backup_fixture::{apply, key_yaml, run_pass, ts};
use crate::rollout_sim::Sim;

fn files(store: &dyn Store, trigger: Trigger) -> Vec<String> {
    backup::list(store, "prod")
        .unwrap()
        .into_iter()
        .filter(|b| b.trigger == trigger)
        .map(|b| b.file)
        .collect()
}

/// Item 4: `backup now` used to run retention over every record, so `keep` manual backups
/// deleted every scheduled one. Manual backups are counted apart: with `keep: 2`, two
/// scheduled backups survive any number of manual ones, the manual ones keep their own two
/// newest, and with a `maxAge` that every backup exceeds the newest scheduled backup stays
/// (beside the newest manual one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_now_never_pushes_out_a_scheduled_backup() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 0, KubeSimConfig::default()).await;
    let alice = age::x25519::Identity::generate();
    let state = dir.path().join("state");
    let dirs = backup::Dirs::local(&state);
    let store = MemStore::new();
    apply(
        &store,
        &sim,
        &format!(
            "    schedule: '0 3 * * *'\n    retention: {{ keep: 2 }}\n    recipients:\n{}",
            key_yaml(&[&alice])
        ),
    );
    let mut recovered = Default::default();
    for day in 1..=2 {
        let r = run_pass(
            &store,
            None,
            &sim,
            &dirs,
            &format!("2026-12-0{day}T10:00:00Z"),
            &mut recovered,
        )
        .await
        .unwrap();
        assert_eq!(r.taken.len(), 1, "day {day}: {r:?}");
    }
    let scheduled = files(&store, Trigger::Scheduled);
    assert_eq!(scheduled.len(), 2);
    let talos = medea::talos::adapter::TalosAdapter::from_creds(&sim.creds, "prod").unwrap();
    // Four manual backups, each well after the one before (the rate limit is not the subject).
    for hour in 11..=14 {
        let rec = backup::take_now(
            &store,
            None,
            &dirs,
            &talos,
            "prod",
            ts(&format!("2026-12-02T{hour}:00:00Z")),
        )
        .await
        .unwrap();
        assert_eq!(rec.trigger, Trigger::Manual);
    }
    assert_eq!(
        files(&store, Trigger::Scheduled),
        scheduled,
        "no scheduled backup was pushed out by manual ones"
    );
    assert_eq!(
        files(&store, Trigger::Manual),
        vec![
            "prod-20261202T130000Z.db.age".to_string(),
            "prod-20261202T140000Z.db.age".to_string()
        ],
        "manual backups keep their own 2 newest"
    );
    let mut on_disk: Vec<String> = std::fs::read_dir(state.join("backups/prod"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut want: Vec<String> = backup::list(&store, "prod")
        .unwrap()
        .into_iter()
        .map(|b| b.file)
        .collect();
    want.sort();
    assert_eq!(on_disk, want, "the files are the records");

    // Every backup older than maxAge: the newest scheduled one stays, whatever manual
    // backups were taken after it.
    let dest = backup::LocalDir::new(&state, "prod");
    let retention = medea::desired::backup::Retention {
        keep: 1,
        max_age: Some(std::time::Duration::from_secs(1)),
    };
    backup::prune(
        &store,
        None,
        "prod",
        &retention,
        &dest,
        ts("2027-06-01T00:00:00Z"),
    )
    .unwrap();
    assert_eq!(
        files(&store, Trigger::Scheduled),
        vec![scheduled[1].clone()],
        "the newest scheduled backup is always kept"
    );
    assert_eq!(
        files(&store, Trigger::Manual),
        vec!["prod-20261202T140000Z.db.age".to_string()]
    );
}

/// Item 4: `BackupNow` is rate-limited per cluster: a second call right after the first is
/// refused with `RESOURCE_EXHAUSTED`, saying when the next may begin, and asks Talos for no
/// snapshot; another cluster is not limited by it. The mark is in the store, so a new server
/// over the same store (a restart, a failover) refuses it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_now_is_rate_limited_per_cluster() {
    use medea::api::pb;
    use medea::api::pb::medea_server::Medea as _;
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 0, KubeSimConfig::default()).await;
    let alice = age::x25519::Identity::generate();
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    apply(
        store.as_ref(),
        &sim,
        &format!(
            "    schedule: '0 3 * * *'\n    recipients:\n{}",
            key_yaml(&[&alice])
        ),
    );
    let api = crate::backup_fixture::api(store.clone(), &sim, dir.path(), None);
    async fn now(
        api: &medea::server::api::MedeaApi,
    ) -> Result<tonic::Response<pb::BackupNowResponse>, tonic::Status> {
        api.backup_now(tonic::Request::new(pb::BackupNowRequest {
            cluster: "prod".into(),
        }))
        .await
    }
    // The first one (a same-second clash with nothing is impossible here: it is the first).
    let first = now(&api).await.unwrap().into_inner().backup.unwrap();
    assert_eq!(first.trigger, "manual");
    let taken = sim.snapshots();
    // The next second, so the file name differs and only the limit can refuse it.
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_millis(1100) {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let err = now(&api).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("one every 5 minutes") && err.message().contains("try again after"),
        "{}",
        err.message()
    );
    assert_eq!(sim.snapshots(), taken, "no snapshot was asked for");
    assert_eq!(backup::list(store.as_ref(), "prod").unwrap().len(), 1);
    // A new server over the same store (restart, failover): still refused.
    let again = crate::backup_fixture::api(store.clone(), &sim, dir.path(), None);
    let err = now(&again).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    // The schedule is not limited by it: its first slot is still due and is taken.
    let mut recovered = Default::default();
    let r = run_pass(
        store.as_ref(),
        None,
        &sim,
        &backup::Dirs::local(&dir.path().join("state")),
        &jiff::Timestamp::now().to_string(),
        &mut recovered,
    )
    .await
    .unwrap();
    assert_eq!(r.taken.len(), 1, "{r:?}");
}

/// Item 5: the private directory `verify --restore` (and the CLI's rehearsal) decrypts into is
/// 0700 whatever the umask, as `private_file::private_tempdir` makes it.
#[test]
fn restore_and_rehearsal_temporary_directories_are_0700() {
    let d = medea::private_file::private_tempdir("medea-test-").unwrap();
    let mode = std::fs::metadata(d.path()).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
}

/// A wrapper script for `real` that logs its name, the mode of its working directory and its
/// arguments to `log`, then runs it.
fn wrapper(
    bin_dir: &std::path::Path,
    name: &str,
    real: &std::path::Path,
    log: &std::path::Path,
) -> std::path::PathBuf {
    let p = bin_dir.join(name);
    std::fs::write(
        &p,
        format!(
            "#!/bin/sh\necho \"{name} cwd=$(stat -c %a .) $*\" >> '{}'\nexec '{}' \"$@\"\n",
            log.display(),
            real.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// Item 5: `medea backup verify --restore` decrypts into a 0700 directory, restores with
/// `etcdutl` when there is one (etcd 3.6 removed `etcdctl snapshot restore`) and with `etcdctl`
/// otherwise (etcd 3.4), and the throwaway etcd listens only on unix sockets inside that
/// directory, never on a TCP port (it used to serve the restored keys, every Secret of the
/// cluster, unauthenticated on 127.0.0.1). The snapshot's storage version is reported: the
/// simulator's snapshots carry `3.6.0`, as etcd 3.6 writes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_verify_restore_serves_nothing_on_tcp_and_restores_with_etcdutl_or_etcdctl() {
    use medea::cli::backup::{RestoreTools, restore_and_count_with};
    let (Some(etcd), Some(etcdctl)) = (
        crate::fixtures::tool_or_skip("etcd"),
        crate::fixtures::tool_or_skip("etcdctl"),
    ) else {
        return;
    };
    let etcdutl = crate::fixtures::tool_or_skip("etcdutl");
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), 1, 0, KubeSimConfig::default()).await;
    let (talos, _kube) = crate::rollout_sim::adapters(&sim).await;
    let snap = dir.path().join("plain.db");
    use medea::rollout::ports::TalosPort as _;
    talos
        .etcd_snapshot(&crate::rollout_sim::node(&sim, "cp-1"), &snap)
        .await
        .unwrap();
    let alice = age::x25519::Identity::generate();
    let file = dir.path().join("prod-20261205T030000Z.db.age");
    {
        use std::io::Write as _;
        let plain = std::fs::read(&snap).unwrap();
        let r = alice.to_public();
        let enc =
            age::Encryptor::with_recipients(std::iter::once(&r as &dyn age::Recipient)).unwrap();
        let mut out = Vec::new();
        let mut w = enc.wrap_output(&mut out).unwrap();
        w.write_all(&plain).unwrap();
        w.finish().unwrap();
        std::fs::write(&file, out).unwrap();
    }
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let log = dir.path().join("tools.log");
    let mut tools = RestoreTools {
        etcd: wrapper(&bin, "etcd", &etcd, &log),
        etcdctl: wrapper(&bin, "etcdctl", &etcdctl, &log),
        etcdutl: None,
    };
    let mut runs = vec![("etcdctl", tools.clone())];
    if let Some(u) = &etcdutl {
        tools.etcdutl = Some(wrapper(&bin, "etcdutl", u, &log));
        runs.push(("etcdutl", tools.clone()));
    }
    for (want, tools) in runs {
        std::fs::write(&log, "").unwrap();
        let restored = tokio::task::spawn_blocking({
            let (file, alice) = (file.clone(), alice.clone());
            move || restore_and_count_with(&file, &alice, "/registry/minions/", &tools)
        })
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{want}: {e:?}"));
        assert_eq!(restored.keys, 1, "{want}: the one Node: {restored:?}");
        assert_eq!(restored.restored_with, want);
        assert_eq!(restored.storage_version.as_deref(), Some("3.6.0"));
        let calls = std::fs::read_to_string(&log).unwrap();
        let restore_line = calls
            .lines()
            .find(|l| l.contains("snapshot restore"))
            .unwrap_or_else(|| panic!("{calls}"));
        assert!(
            restore_line.starts_with(&format!("{want} cwd=700 ")),
            "{calls}"
        );
        let serve = calls
            .lines()
            .find(|l| l.starts_with("etcd cwd=") && l.contains("--listen-client-urls"))
            .unwrap_or_else(|| panic!("{calls}"));
        assert!(serve.starts_with("etcd cwd=700 "), "{serve}");
        assert!(!serve.contains("http"), "no TCP listener: {serve}");
        assert!(
            serve.contains("--listen-client-urls unix://")
                && serve.contains("--listen-peer-urls unix://"),
            "{serve}"
        );
        for l in calls
            .lines()
            .filter(|l| l.starts_with("etcdctl") && l.contains("--endpoints"))
        {
            assert!(l.contains("--endpoints unix://"), "{l}");
        }
    }
}
