use std::collections::BTreeMap;

use super::*;
use crate::desired::Source;
use crate::inventory::{Inventory, Machine, cluster_key};
use crate::store::Store;
use crate::version::{KubeVersion, TalosVersion};
use pb::medea_server::Medea;

fn machine(node: &str, role: MachineRole, talos: &str) -> Machine {
    Machine {
        node: node.into(),
        id: format!("id-{node}"),
        address: "127.0.0.1".into(),
        role,
        talos_version: Some(TalosVersion::parse(talos).unwrap()),
        installer_image: None,
        schematic: None,
        platform: None,
        secure_boot: None,
        factory_host: None,
        extensions: BTreeMap::new(),
        kubelet_version: Some(KubeVersion::parse("v1.34.1").unwrap()),
        ready: true,
        cordoned: false,
        reachable: true,
        boot_id: Some("boot-1".into()),
        labels: BTreeMap::new(),
    }
}

fn cluster(name: &str, talos: &str) -> ObservedCluster {
    let mut machines = BTreeMap::new();
    machines.insert(
        "cp-1".to_string(),
        machine("cp-1", MachineRole::Controlplane, talos),
    );
    machines.insert(
        "w-1".to_string(),
        machine("w-1", MachineRole::Worker, talos),
    );
    ObservedCluster::new(name).observe(None, machines)
}

async fn rows(api: &MedeaApi, filter: &str) -> Vec<(String, String, String, String)> {
    let warm = api
        .list_machines(Request::new(pb::ListMachinesRequest {
            cluster: filter.into(),
        }))
        .await
        .unwrap()
        .into_inner();
    // The cached, pre-encoded answer is byte for byte what a server that never answered
    // before sends (its own first call builds every row from the store), and a client
    // decodes it to the same rows.
    let cold_shared = Shared::new(
        api.shared.store.clone(),
        api.shared.source.clone(),
        false,
        "cold".into(),
    );
    if let Some(d) = api.shared.desired() {
        cold_shared.set_desired((*d).clone());
    }
    let cold = MedeaApi {
        shared: Arc::new(cold_shared),
    }
    .list_machines(Request::new(pb::ListMachinesRequest {
        cluster: filter.into(),
    }))
    .await
    .unwrap()
    .into_inner();
    use prost::Message as _;
    let wire = warm.encode_to_vec();
    assert_eq!(wire, cold.encode_to_vec());
    let decoded = pb::ListMachinesResponse::decode(wire.as_slice()).unwrap();
    assert_eq!(
        decoded.machines().collect::<Vec<_>>(),
        warm.machines().collect::<Vec<_>>()
    );
    warm.into_machines()
        .into_iter()
        .map(|m| (m.cluster, m.node, m.pool, m.talos_version))
        .collect()
}

fn row(c: &str, n: &str, p: &str, v: &str) -> (String, String, String, String) {
    (c.into(), n.into(), p.into(), v.into())
}

/// A store whose next `n` commits that record an approval fail with a conflict (changing
/// nothing), as when the plan moves underneath the transaction; it counts the scans made, by
/// table and prefix.
struct ConflictingStore {
    inner: crate::store::mem::MemStore,
    conflicts: std::sync::atomic::AtomicU32,
    scans: std::sync::Mutex<BTreeMap<(&'static str, String), usize>>,
}

impl ConflictingStore {
    fn new(conflicts: u32) -> ConflictingStore {
        ConflictingStore {
            inner: crate::store::mem::MemStore::new(),
            conflicts: conflicts.into(),
            scans: Default::default(),
        }
    }
    fn scans(&self, table: crate::store::Table, prefix: &str) -> usize {
        let key = (table.name(), prefix.to_string());
        self.scans.lock().unwrap().get(&key).copied().unwrap_or(0)
    }
    fn reset_scans(&self) {
        self.scans.lock().unwrap().clear();
    }
}

impl Store for ConflictingStore {
    fn get(
        &self,
        table: crate::store::Table,
        key: &str,
    ) -> Result<Option<Vec<u8>>, crate::store::StoreError> {
        self.inner.get(table, key)
    }
    fn scan(
        &self,
        table: crate::store::Table,
        prefix: &str,
    ) -> Result<Vec<(String, Vec<u8>)>, crate::store::StoreError> {
        *self
            .scans
            .lock()
            .unwrap()
            .entry((table.name(), prefix.to_string()))
            .or_default() += 1;
        self.inner.scan(table, prefix)
    }
    fn commit(&self, txn: Txn) -> Result<(), crate::store::StoreError> {
        use std::sync::atomic::Ordering;
        let approval = txn.ops.iter().any(|o| {
            matches!(
                o,
                crate::store::Op::Put(crate::store::Table::Approvals, _, _)
            )
        });
        if approval
            && self
                .conflicts
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            return Err(crate::store::StoreError::Conflict {
                table: "plans",
                key: "current".into(),
            });
        }
        self.inner.commit(txn)
    }
}

/// Issue #34: a reconcile pass reads the last-applied state, the running-job markers and the
/// jobs once, whether it stores a new plan or finds the current one unchanged; judging the
/// plan's basis and starting it reuse those reads.
#[tokio::test]
async fn a_reconcile_pass_reads_the_applied_state_and_the_jobs_once() {
    use crate::store::Table;
    let counting = Arc::new(ConflictingStore::new(0));
    let store: Arc<dyn Store> = counting.clone();
    let a = approving(store.clone(), &["alice@x", "bob@x"]);
    let shared = &a.api.shared;
    let once = |what: &str| {
        for (table, prefix) in [
            (Table::Desired, "cluster/"),
            (Table::Desired, "pool/"),
            (Table::Jobs, "active/"),
            (Table::Jobs, "job/"),
        ] {
            assert_eq!(
                counting.scans(table, prefix),
                1,
                "{what}: scans of {} `{prefix}`",
                table.name()
            );
        }
    };
    // The current plan, unchanged.
    counting.reset_scans();
    let state = crate::server::reconcile::reconcile(shared, &[], jiff::Timestamp::now()).unwrap();
    assert_eq!(state.plan.as_ref().map(|p| p.id), Some(a.plan));
    once("an unchanged plan");
    // A new observation: a new plan is computed and stored.
    let mut newer = home();
    newer.generation += 1;
    store
        .commit(Txn::new().put_record(cluster_key("home"), &newer))
        .unwrap();
    counting.reset_scans();
    let state = crate::server::reconcile::reconcile(shared, &[], jiff::Timestamp::now()).unwrap();
    assert_ne!(state.plan.as_ref().map(|p| p.id), Some(a.plan));
    once("a new plan");
}

fn home() -> ObservedCluster {
    let mut machines = BTreeMap::new();
    for n in ["cp-1", "cp-2", "cp-3"] {
        machines.insert(
            n.to_string(),
            machine(n, MachineRole::Controlplane, "v1.12.4"),
        );
    }
    for n in ["w-1", "w-2", "w-3"] {
        machines.insert(n.to_string(), machine(n, MachineRole::Worker, "v1.12.4"));
    }
    ObservedCluster::new("home").observe(Some(KubeVersion::parse("v1.34.1").unwrap()), machines)
}

struct Approving {
    api: MedeaApi,
    plan: crate::plan::PlanId,
    keys: Vec<crate::approval::sign::SecretKey>,
    _dir: tempfile::TempDir,
}

/// The examples planned against `home`, with `principals[i]` holding key `i`.
fn approving(store: Arc<dyn Store>, principals: &[&str]) -> Approving {
    approving_with(store, principals, home())
}

/// [`approving`] with `home` observed as given.
fn approving_with(store: Arc<dyn Store>, principals: &[&str], home: ObservedCluster) -> Approving {
    approving_tweaked(store, principals, home, |_| {})
}

/// [`approving_with`], with `tweak` applied to the server's shared state before it starts.
fn approving_tweaked(
    store: Arc<dyn Store>,
    principals: &[&str],
    home: ObservedCluster,
    tweak: impl FnOnce(&mut Shared),
) -> Approving {
    let examples = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples");
    let source = Source::Dir(examples);
    let dir = tempfile::tempdir().unwrap();
    let keys: Vec<_> = principals
        .iter()
        .map(|_| crate::approval::sign::SecretKey::generate_ed25519().unwrap())
        .collect();
    let text: String = principals
        .iter()
        .zip(&keys)
        .map(|(p, k)| format!("{p} {}\n", k.public_key().to_openssh().unwrap()))
        .collect();
    let path = dir.path().join("allowed_signers");
    std::fs::write(&path, text).unwrap();
    store
        .commit(Txn::new().put_record(cluster_key("home"), &home))
        .unwrap();
    let mut shared = Shared::new(store.clone(), source.clone(), false, "r1".into());
    shared.trust = crate::server::trust::TrustRoot::open(Some(path), &source).unwrap();
    shared.set_desired(crate::desired::load(&source).unwrap());
    tweak(&mut shared);
    let shared = Arc::new(shared);
    crate::server::reconcile::reconcile(&shared, &[], jiff::Timestamp::now()).unwrap();
    let plan = crate::ops::replan::current(store.as_ref())
        .unwrap()
        .unwrap()
        .id;
    Approving {
        api: MedeaApi { shared },
        plan,
        keys,
        _dir: dir,
    }
}

impl Approving {
    async fn submit(&self, key: usize) -> Result<pb::SubmitApprovalResponse, Status> {
        let signed = crate::approval::sign::sign_with_key(
            &self.keys[key],
            &self.plan,
            ssh_key::HashAlg::Sha512,
        )
        .unwrap();
        self.api
            .submit_approval(Request::new(pb::SubmitApprovalRequest {
                plan_id: self.plan.to_hex(),
                signature: signed.armored,
            }))
            .await
            .map(Response::into_inner)
    }
    fn records(&self) -> usize {
        self.api
            .shared
            .store
            .scan(
                crate::store::Table::Approvals,
                &format!("{}/", self.plan.to_hex()),
            )
            .unwrap()
            .len()
    }
    async fn plan(&self) -> pb::Plan {
        self.api
            .get_plan(Request::new(pb::GetPlanRequest { id: String::new() }))
            .await
            .unwrap()
            .into_inner()
            .plan
            .unwrap()
    }
}

/// Issue 19: an API approval that meets a store conflict is verified again and recorded,
/// never answered "approved" and lost.
#[tokio::test]
async fn an_api_approval_that_meets_a_store_conflict_is_retried_not_lost() {
    let store = Arc::new(ConflictingStore::new(2));
    let a = approving(store, &["alice@x"]);
    let r = a.submit(0).await.unwrap();
    assert!(r.outcome.starts_with("approved plan"), "{r:?}");
    assert_eq!(a.records(), 1, "the approval is recorded");
    assert_eq!((r.approvals, r.approvals_required), (1, 2));
}

/// Issue 19: SubmitApproval answers only for a verified signature: when no plan can be
/// verified against (the desired state turned invalid), it is an error, not "recorded".
#[tokio::test]
async fn submit_approval_answers_only_after_verification() {
    let a = approving(Arc::new(crate::store::mem::MemStore::new()), &["alice@x"]);
    let broken = crate::desired::parse_snapshot(crate::desired::Snapshot {
        files: vec![crate::desired::source::SourceFile {
            path: "x.yaml".into(),
            bytes: b"garbage: [\n".to_vec().into(),
        }],
        markers: Vec::new(),
        commit: None,
        refused: Vec::new(),
    });
    assert!(broken.has_errors());
    a.api.shared.set_desired(broken);
    let e = a.submit(0).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("not verified"), "{e:?}");
    assert_eq!(a.records(), 0);
}

/// Issue 19: a plan's approvals are distinct verified people: one person with two keys
/// (two lines for one principal) counts once, and the plan is not "approved" at 2 of 2.
#[tokio::test]
async fn plan_approvals_count_distinct_verified_people() {
    let a = approving(
        Arc::new(crate::store::mem::MemStore::new()),
        &["alice@x", "alice@x", "bob@x"],
    );
    a.submit(0).await.unwrap();
    let r = a.submit(1).await.unwrap();
    assert_eq!((r.approvals, r.approvals_required), (1, 2), "{r:?}");
    assert_eq!(a.records(), 2, "both keys' records are kept");
    let p = a.plan().await;
    assert_eq!(p.approvals.len(), 1, "{:?}", p.approvals);
    assert_eq!(p.state, "pending");
    let r = a.submit(2).await.unwrap();
    assert_eq!((r.approvals, r.approvals_required), (2, 2), "{r:?}");
    let p = a.plan().await;
    assert_eq!(p.approvals.len(), 2, "{:?}", p.approvals);
    assert_eq!(p.state, "approved");
}

/// Issue 22: a plan with a blocking preflight finding nobody acknowledged cannot be approved:
/// the server refuses the signature (naming the finding and how to acknowledge it), records
/// nothing, and the plan's state says it is blocked.
#[tokio::test]
async fn a_plan_with_a_blocking_finding_refuses_approvals() {
    use crate::inventory::preflight::*;
    let mut h = home();
    h.preflight = PreflightObservations {
        gathered: true,
        apiserver_metrics: vec![],
        etcd: Some(EtcdObservation {
            members: vec![EtcdMemberObservation {
                id: "1".into(),
                name: "cp-1".into(),
                learner: false,
                healthy: true,
            }],
            alarms: vec![EtcdAlarmObservation {
                member: "1".into(),
                alarm: "CORRUPT".into(),
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let a = approving_with(
        Arc::new(crate::store::mem::MemStore::new()),
        &["alice@x", "bob@x"],
        h,
    );
    let p = a.plan().await;
    assert_eq!(p.state, "blocked");
    assert!(
        p.rendered.contains("blocking [etcd/alarm/CORRUPT/1]"),
        "{}",
        p.rendered
    );
    let e = a.submit(0).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("[etcd/alarm/CORRUPT/1]"), "{e:?}");
    assert!(e.message().contains("spec.preflight.acknowledge"), "{e:?}");
    assert_eq!(a.records(), 0, "nothing is recorded for a blocked plan");
    let e = a.submit(1).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert_eq!(a.plan().await.approvals.len(), 0);
}

#[tokio::test]
async fn get_machines_follows_every_record_and_desired_change_despite_its_cache() {
    let examples = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples");
    let source = Source::Dir(examples);
    let store: Arc<dyn Store> = Arc::new(crate::store::mem::MemStore::new());
    let shared = Arc::new(Shared::new(
        store.clone(),
        source.clone(),
        false,
        "r1".into(),
    ));
    let api = MedeaApi {
        shared: shared.clone(),
    };
    let inv = Inventory {
        clusters: [
            ("home".to_string(), Arc::new(cluster("home", "v1.12.4"))),
            ("lab".to_string(), Arc::new(cluster("lab", "v1.12.4"))),
        ]
        .into(),
    };
    store.commit(inv.save_txn()).unwrap();
    // no desired state yet: no pools
    assert_eq!(
        rows(&api, "").await,
        [
            row("home", "cp-1", "", "v1.12.4"),
            row("home", "w-1", "", "v1.12.4"),
            row("lab", "cp-1", "", "v1.12.4"),
            row("lab", "w-1", "", "v1.12.4"),
        ]
    );
    // the desired state arrives: the pools come from it
    shared.set_desired(crate::desired::load(&source).unwrap());
    assert_eq!(
        rows(&api, "home").await[0],
        row("home", "cp-1", "controlplane", "v1.12.4")
    );
    // a record changes: its rows follow, the other cluster's stay
    store
        .commit(Txn::new().put_record(cluster_key("lab"), &cluster("lab", "v1.13.9")))
        .unwrap();
    let all = rows(&api, "").await;
    assert_eq!(all.len(), 4);
    assert_eq!(all[0], row("home", "cp-1", "controlplane", "v1.12.4"));
    assert_eq!(all[2].3, "v1.13.9");
    assert_eq!(all[3].3, "v1.13.9");
    // a record goes away: so do its rows
    store
        .commit(Txn::new().delete(crate::store::Table::Inventory, cluster_key("lab")))
        .unwrap();
    assert_eq!(rows(&api, "").await.len(), 2);
    // and the cluster is unknown now: asking for it is an error, as kubectl's "not found"
    let gone = api
        .list_machines(Request::new(pb::ListMachinesRequest {
            cluster: "lab".into(),
        }))
        .await
        .unwrap_err();
    assert_eq!(gone.code(), tonic::Code::NotFound, "{gone:?}");
    assert_eq!(shared.machine_rows.lock().unwrap().len(), 1);
    // the cached rows are shared with the answer, not copied: two calls hand out one allocation
    let a = api.machines_encoded("").unwrap();
    let b = api.machines_encoded("").unwrap();
    assert_eq!(a.len(), 1);
    assert!(Arc::ptr_eq(&a[0], &b[0]));
    // the gate alone changes a record's bytes: the rows are rebuilt (and still equal cold)
    let mut gated = cluster("home", "v1.12.4");
    gated.rollouts_enabled = !gated.rollouts_enabled;
    store
        .commit(Txn::new().put_record(cluster_key("home"), &gated))
        .unwrap();
    assert_eq!(rows(&api, "").await.len(), 2);
    assert!(!Arc::ptr_eq(&api.machines_encoded("").unwrap()[0], &a[0]));
    // the desired state goes away: the pools go with it
    *shared.desired.write().unwrap() = None;
    assert_eq!(
        rows(&api, "home").await[0],
        row("home", "cp-1", "", "v1.12.4")
    );
}

/// Issue 32: what a reconcile pass verifies. Each marker is checked against the current plan
/// and the plan its file name names, never every stored plan; the next pass with nothing
/// changed verifies no signature (the cache); a reload that puts other signers in force
/// verifies everything again, and re-reading an unchanged file does not.
#[tokio::test]
async fn a_reconcile_pass_verifies_markers_once_and_again_after_a_signers_reload() {
    let store: Arc<dyn Store> = Arc::new(crate::store::mem::MemStore::new());
    let a = approving(store.clone(), &["alice@x", "bob@x"]);
    let shared = &a.api.shared;
    // 40 stored plans besides the current one (a store from before plans were collected).
    let stored: Vec<crate::plan::PlanId> = (0..40u8)
        .map(|i| crate::plan::PlanId::from_digest([i; 32]))
        .collect();
    let mut txn = Txn::new();
    for p in &stored {
        txn = txn.put(
            crate::store::Table::Plans,
            crate::plan::stored::plan_key(p),
            b"{}".to_vec(),
        );
    }
    store.commit(txn).unwrap();
    let sign = |key: usize, p: &crate::plan::PlanId| {
        crate::approval::sign::sign_with_key(&a.keys[key], p, ssh_key::HashAlg::Sha512)
            .unwrap()
            .armored
    };
    let unknown = crate::plan::PlanId::from_digest([0xee; 32]);
    let mut markers = Vec::new();
    // 10 copies named after stored plans, signing none of them: current + named = 2 checks.
    for (i, p) in stored.iter().take(10).enumerate() {
        markers.push((
            format!("approvals/{}-c{i}.sig", p.short()),
            sign(1, &unknown),
        ));
    }
    // 10 copies that name no plan: current only = 1 check.
    for i in 0..10 {
        markers.push((format!("approvals/copy-{i}.sig"), sign(1, &unknown)));
    }
    // alice's approval of the current plan: 1 check (it verifies over the first plan offered).
    markers.push((
        format!("approvals/{}-alice.sig", a.plan.short()),
        sign(0, &a.plan),
    ));
    let expected = 10 * 2 + 10 + 1;
    let examples = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut snapshot = crate::desired::source::read(&Source::Dir(examples)).unwrap();
    snapshot.markers = markers
        .into_iter()
        .map(|(path, armored)| crate::desired::source::MarkerFile {
            path,
            contents: armored.into_bytes(),
        })
        .collect();
    shared.set_desired(crate::desired::parse_snapshot(snapshot));
    let pass = || {
        let state =
            crate::server::reconcile::reconcile(shared, &[], jiff::Timestamp::now()).unwrap();
        assert_eq!(
            state.plan.as_ref().map(|p| p.id),
            Some(a.plan),
            "the plan stays"
        );
        let approved = state
            .outcomes
            .iter()
            .filter(|(_, o)| o.starts_with("approved"))
            .count();
        assert!(approved >= 1, "{:?}", state.outcomes);
        shared.approval_cache.lock().unwrap().last
    };
    let first = pass();
    assert_eq!(first.signature_checks, expected, "{first:?}");
    // alice's marker is recorded now: the next passes see it twice (record and marker).
    let second = pass();
    assert_eq!(second.signature_checks, 0, "{second:?}");
    assert_eq!(second.cached, second.candidates, "{second:?}");
    // The same file written again: the same signers, the same generation, nothing verified.
    let signers_path = a._dir.path().join("allowed_signers");
    let text = std::fs::read_to_string(&signers_path).unwrap();
    std::fs::write(&signers_path, &text).unwrap();
    assert_eq!(pass().signature_checks, 0);
    // carol added: another generation, every candidate verified again (the record and the
    // marker of alice's approval are the same candidate: verified once).
    let carol = crate::approval::sign::SecretKey::generate_ed25519().unwrap();
    std::fs::write(
        &signers_path,
        format!(
            "{text}carol@x {}\n",
            carol.public_key().to_openssh().unwrap()
        ),
    )
    .unwrap();
    let reloaded = pass();
    assert_eq!(reloaded.signature_checks, expected, "{reloaded:?}");
    assert_eq!(reloaded.cached, 1, "{reloaded:?}");
    assert_eq!(pass().signature_checks, 0);
}

/// Issue 34: one approval use case. For the same markers, API submissions and signers, the
/// reconcile pass, `medea approvals` (`ops::approvals::offline_status`) and the API's plan view
/// count the same people and reach the same verdict. Before, `medea approvals` counted the
/// markers alone (bob's API approval did not exist for it) and the view used its own context.
#[tokio::test]
async fn reconcile_the_offline_command_and_the_plan_view_give_one_verdict() {
    let store: Arc<dyn Store> = Arc::new(crate::store::mem::MemStore::new());
    let a = approving(store.clone(), &["alice@x", "bob@x", "carol@x"]);
    let shared = &a.api.shared;
    let sign = |key: usize, p: &crate::plan::PlanId| {
        crate::approval::sign::sign_with_key(&a.keys[key], p, ssh_key::HashAlg::Sha512)
            .unwrap()
            .armored
    };
    let examples = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut snapshot = crate::desired::source::read(&Source::Dir(examples)).unwrap();
    // alice approves by marker; carol's marker is a copy over another plan.
    let other = crate::plan::PlanId::from_digest([0xee; 32]);
    snapshot.markers = vec![
        crate::desired::source::MarkerFile {
            path: format!("approvals/{}-alice.sig", a.plan.short()),
            contents: sign(0, &a.plan).into_bytes(),
        },
        crate::desired::source::MarkerFile {
            path: format!("approvals/{}-carol.sig", a.plan.short()),
            contents: sign(2, &other).into_bytes(),
        },
    ];
    shared.set_desired(crate::desired::parse_snapshot(snapshot));
    // bob approves over the API (recorded by the pass that verifies it).
    a.submit(1).await.unwrap();

    let people = |q: &crate::approval::QuorumStatus| {
        let mut p: Vec<String> = q.counted.iter().map(|a| a.principal.clone()).collect();
        p.sort();
        (p, q.reached())
    };
    let verdicts = || async {
        let now = jiff::Timestamp::now();
        let reconciled = crate::server::reconcile::reconcile(shared, &[], now)
            .unwrap()
            .quorum
            .unwrap();
        let plan = crate::ops::replan::load_plan(store.as_ref(), &a.plan)
            .unwrap()
            .unwrap();
        let loaded = shared.desired().unwrap();
        let offline = crate::ops::approvals::offline_status(
            store.as_ref(),
            &plan,
            &loaded,
            &shared.trust.in_force(),
            now,
        )
        .unwrap()
        .quorum;
        let view = a.plan().await;
        let mut view_people: Vec<String> =
            view.approvals.iter().map(|x| x.principal.clone()).collect();
        view_people.sort();
        (
            people(&reconciled),
            people(&offline),
            (view_people, view.state == "approved"),
        )
    };
    let (r, o, v) = verdicts().await;
    let both = (vec!["alice@x".to_string(), "bob@x".to_string()], true);
    assert_eq!(r, both, "reconcile");
    assert_eq!(o, both, "medea approvals");
    assert_eq!(v, both, "the plan view");

    // bob leaves the signers file: all three stop counting him at once.
    let signers_path = a._dir.path().join("allowed_signers");
    let text: String = std::fs::read_to_string(&signers_path)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("bob@x"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&signers_path, text).unwrap();
    let (r, o, v) = verdicts().await;
    let alice = (vec!["alice@x".to_string()], false);
    assert_eq!(r, alice, "reconcile");
    assert_eq!(o, alice, "medea approvals");
    assert_eq!(v, alice, "the plan view");
}

/// A rehearsal of `plan` for `cluster` that halted on a PodDisruptionBudget at `w-2`.
fn pdb_rehearsal(plan: &crate::plan::PlanId, cluster: &str) -> crate::rehearsal::report::Rehearsal {
    use crate::rehearsal::report::{Blocker, BlockerKind, Outcome, Rehearsal, RehearsedWave};
    Rehearsal {
        plan: plan.to_hex(),
        cluster: cluster.into(),
        ran_at: "2026-12-06T10:00:00Z".into(),
        census_gathered_at: "2026-12-06T09:58:00Z".into(),
        compression: 60,
        timings: "defaults".into(),
        waves: vec![RehearsedWave {
            step: "talos workers".into(),
            wave: 1,
            nodes: vec!["w-1".into(), "w-2".into()],
            start_secs: 300,
            duration_secs: None,
        }],
        outcome: Outcome::Halted {
            code: "drain_blocked".into(),
            node: Some("w-2".into()),
            reason: "drain of w-2 timed out".into(),
            after_secs: 1200,
        },
        blockers: vec![Blocker {
            kind: BlockerKind::Pdb,
            node: Some("w-2".into()),
            detail: "PodDisruptionBudget shop/db allows no disruption".into(),
        }],
        limits: vec!["census truncated at 5000 pods".into()],
    }
}

/// Issue 36 item 4: the plan view carries each cluster's stored rehearsal, marked as advice;
/// a plan without one has none, a report of another plan is not shown, and storing one
/// changes neither the plan nor its id.
#[tokio::test]
async fn the_plan_view_carries_a_stored_rehearsal_and_a_plan_without_one_has_none() {
    let store: Arc<dyn Store> = Arc::new(crate::store::mem::MemStore::new());
    let a = approving(store.clone(), &["alice@x"]);
    let before = a.plan().await;
    assert!(before.rehearsals.is_empty(), "{:?}", before.rehearsals);

    // A report of another plan (an older one) is not this plan's.
    let other = crate::plan::PlanId::from_digest([0xee; 32]);
    crate::ops::rehearse::store_report(store.as_ref(), &pdb_rehearsal(&other, "home")).unwrap();
    assert!(a.plan().await.rehearsals.is_empty());

    let report = pdb_rehearsal(&a.plan, "home");
    crate::ops::rehearse::store_report(store.as_ref(), &report).unwrap();
    let view = a.plan().await;
    assert_eq!(view.id, a.plan.to_hex(), "the plan id is unchanged");
    assert_eq!(
        crate::ops::replan::current(store.as_ref())
            .unwrap()
            .map(|c| c.id),
        Some(a.plan),
        "the current plan is unchanged"
    );
    assert_eq!(
        (&view.rendered, &view.json),
        (&before.rendered, &before.json),
        "the plan itself reads as before"
    );
    assert_eq!(view.rehearsals.len(), 1, "{:?}", view.rehearsals);
    let r = &view.rehearsals[0];
    assert_eq!(
        (r.cluster.as_str(), r.plan_id.as_str()),
        ("home", report.plan.as_str())
    );
    assert_eq!(r.advice, "advice, not part of the plan id");
    assert_eq!(
        (
            r.ran_at.as_str(),
            r.census_gathered_at.as_str(),
            r.compression,
            r.timings.as_str()
        ),
        (
            "2026-12-06T10:00:00Z",
            "2026-12-06T09:58:00Z",
            60,
            "defaults"
        )
    );
    let o = r.outcome.as_ref().unwrap();
    assert_eq!(
        (
            o.kind.as_str(),
            o.code.as_str(),
            o.node.as_str(),
            o.after_seconds
        ),
        ("halted", "drain_blocked", "w-2", 1200)
    );
    assert_eq!(
        o.summary,
        "halted at w-2 after 20m00s (drain_blocked): drain of w-2 timed out"
    );
    assert_eq!(r.blockers.len(), 1);
    assert_eq!(
        (r.blockers[0].kind.as_str(), r.blockers[0].node.as_str()),
        ("pdb", "w-2")
    );
    assert_eq!(r.waves.len(), 1);
    assert_eq!(
        (
            r.waves[0].wave,
            r.waves[0].start_seconds,
            r.waves[0].duration_seconds
        ),
        (1, 300, None)
    );
    assert_eq!(r.waves[0].nodes, ["w-1", "w-2"]);
    assert_eq!(r.limits, ["census truncated at 5000 pods"]);
    assert_eq!(r.rendered, crate::rehearsal::render::text(&report));
    assert!(
        r.rendered
            .contains("- pdb at node w-2: PodDisruptionBudget shop/db allows no disruption"),
        "{}",
        r.rendered
    );
    let json: crate::rehearsal::report::Rehearsal = serde_json::from_str(&r.json).unwrap();
    assert_eq!(json, report);

    // The same plan by id carries it too; the list of plans stays light.
    let by_id = a
        .api
        .get_plan(Request::new(pb::GetPlanRequest { id: a.plan.short() }))
        .await
        .unwrap()
        .into_inner()
        .plan
        .unwrap();
    assert_eq!(by_id.rehearsals, view.rehearsals);
    let listed = a
        .api
        .list_plans(Request::new(pb::ListPlansRequest { limit: 0 }))
        .await
        .unwrap()
        .into_inner();
    assert!(listed.plans.iter().all(|p| p.rehearsals.is_empty()));
}

/// Issue 36 item 4: `RehearsePlan` answers at once with "started" and runs in the
/// background; while it runs a second request starts nothing ("already running") and the
/// plan view says it runs; its report then appears in the plan view. Only the leader
/// rehearses, only the current plan, and an unknown id is not found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rehearse_plan_starts_once_in_the_background_and_its_report_reaches_the_plan_view() {
    let store: Arc<dyn Store> = Arc::new(crate::store::mem::MemStore::new());
    let a = approving(store.clone(), &["alice@x"]);
    let rehearse = |id: String| {
        let api = &a.api;
        async move {
            api.rehearse_plan(Request::new(pb::RehearsePlanRequest {
                plan_id: id,
                // a quick twin: ten real minutes per second
                compression: 600,
            }))
            .await
            .map(Response::into_inner)
        }
    };

    // A follower refuses; so does a plan that is not the current one.
    let mut follower = Shared::new(
        store.clone(),
        a.api.shared.source.clone(),
        false,
        "r2".into(),
    );
    let (leadership, _campaign) = crate::store::Leadership::campaign("r2", None);
    follower.leadership = leadership;
    let e = MedeaApi {
        shared: Arc::new(follower),
    }
    .rehearse_plan(Request::new(pb::RehearsePlanRequest::default()))
    .await
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("does not lead"), "{e:?}");
    let e = rehearse("ee".repeat(32)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    let e = rehearse("zz".into()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    let e = a
        .api
        .rehearse_plan(Request::new(pb::RehearsePlanRequest {
            plan_id: String::new(),
            compression: 100_001,
        }))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("compression 100001"), "{e:?}");
    assert!(!a.api.shared.rehearsing.contains(&a.plan));

    let started = rehearse(a.plan.short()).await.unwrap();
    assert_eq!(started.outcome, "started");
    assert_eq!(started.plan_id, a.plan.to_hex());
    assert_eq!(started.clusters, ["home"]);
    // While it runs (a twin takes a while to start), a second request starts nothing.
    let again = rehearse(String::new()).await.unwrap();
    assert_eq!(
        (again.outcome.as_str(), again.plan_id.as_str()),
        ("already running", started.plan_id.as_str())
    );
    assert!(a.plan().await.rehearsing);
    // Each poll is the rehearsal's progress, bounded.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    let view = loop {
        let view = a.plan().await;
        if !view.rehearsing {
            break view;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the rehearsal did not end"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(view.rehearsals.len(), 1, "{:?}", view.rehearsals);
    let r = &view.rehearsals[0];
    assert_eq!(
        (r.cluster.as_str(), r.plan_id.as_str()),
        ("home", started.plan_id.as_str())
    );
    assert_eq!(r.advice, "advice, not part of the plan id");
    assert!(r.outcome.is_some());
    assert_eq!(view.id, a.plan.to_hex(), "the plan is unchanged");
    // It ended: the next request starts again.
    assert_eq!(rehearse(String::new()).await.unwrap().outcome, "started");
}

/// A current plan whose basis moved (a new observation the planner has not seen yet) is not
/// rehearsed: the twin would be built from observations the plan was not computed from.
#[tokio::test]
async fn a_stale_plan_is_not_rehearsed() {
    let store: Arc<dyn Store> = Arc::new(crate::store::mem::MemStore::new());
    let a = approving(store.clone(), &["alice@x"]);
    let key = cluster_key("home");
    let observed: ObservedCluster = store.get_record(&key).unwrap().unwrap();
    let mut machines = observed.machines.clone();
    machines.insert(
        "w-4".to_string(),
        machine("w-4", MachineRole::Worker, "v1.12.4"),
    );
    let moved = observed.observe(observed.kubernetes_version.clone(), machines);
    assert_ne!(moved.generation, observed.generation);
    store
        .commit(Txn::new().put_record(key.as_str(), &moved))
        .unwrap();
    let e = a
        .api
        .rehearse_plan(Request::new(pb::RehearsePlanRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("is stale"), "{e:?}");
    assert!(!a.api.shared.rehearsing.contains(&a.plan));
}

/// The examples' files as a `PreviewPlan` request.
fn preview_request() -> pb::PreviewPlanRequest {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples");
    let files = ["home/cluster.yaml", "home/pools.yaml"]
        .iter()
        .map(|p| pb::DesiredFile {
            path: p.to_string(),
            content: std::fs::read(root.join(p)).unwrap(),
        })
        .collect();
    pb::PreviewPlanRequest { files }
}

/// Issue #49: `PreviewPlan` computes at most `previews` at once (one more is refused with
/// RESOURCE_EXHAUSTED, nothing computed) and answers DEADLINE_EXCEEDED past its deadline;
/// with a permit and time it answers the plan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previews_are_bounded_in_number_and_time() {
    let store: Arc<dyn Store> = Arc::new(crate::store::mem::MemStore::new());
    let a = approving(store, &["alice@x"]);
    let ok = a
        .api
        .preview_plan(Request::new(preview_request()))
        .await
        .unwrap()
        .into_inner();
    assert!(ok.has_changes && !ok.short_id.is_empty(), "{ok:?}");
    // every permit taken: refused at once
    let limits = &a.api.shared.request_limits;
    let held = limits
        .previews
        .clone()
        .try_acquire_many_owned(crate::server::RequestLimits::PREVIEWS as u32)
        .unwrap();
    let e = a
        .api
        .preview_plan(Request::new(preview_request()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    drop(held);
    // past the deadline: 1 ms for a revision of 1,000 pools, which takes far longer to read
    // and plan (the deadline is checked only while the computation runs)
    let store: Arc<dyn Store> = Arc::new(crate::store::mem::MemStore::new());
    let hurried = approving_tweaked(store, &["alice@x"], home(), |s| {
        s.request_limits.preview_deadline = std::time::Duration::from_millis(1);
    });
    let mut large = preview_request();
    for f in 0..2 {
        let docs: Vec<String> = (f * 500..(f + 1) * 500)
            .map(|i| {
                format!(
                    "apiVersion: medea/v1alpha1\nkind: NodePool\nmetadata:\n  name: empty-{i:04}\nspec:\n  cluster: home\n  role: worker\n  selector:\n    matchLabels:\n      none: \"true\"\n  talos:\n    version: v1.14.6\n"
                )
            })
            .collect();
        large.files.push(pb::DesiredFile {
            path: format!("home/empty-{f}.yaml"),
            content: docs.join("---\n").into_bytes(),
        });
    }
    let e = hurried
        .api
        .preview_plan(Request::new(large))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{e:?}");
}

/// Issue #49: a rehearsal past its deadline is stopped and stores no report (the plan view
/// shows none and says it no longer runs), and rehearsals past the cap are refused with
/// RESOURCE_EXHAUSTED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rehearsals_are_bounded_in_number_and_time() {
    let store: Arc<dyn Store> = Arc::new(crate::store::mem::MemStore::new());
    let a = approving_tweaked(store, &["alice@x"], home(), |s| {
        s.request_limits.rehearsal_deadline = std::time::Duration::from_millis(1);
    });
    let started = a
        .api
        .rehearse_plan(Request::new(pb::RehearsePlanRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(started.outcome, "started");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let view = loop {
        let view = a.plan().await;
        if !view.rehearsing {
            break view;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the rehearsal was not stopped at its deadline"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert!(view.rehearsals.is_empty(), "{:?}", view.rehearsals);
    // no room for one more
    let store: Arc<dyn Store> = Arc::new(crate::store::mem::MemStore::new());
    let full = approving_tweaked(store, &["alice@x"], home(), |s| {
        s.request_limits.max_rehearsals = 0;
    });
    let e = full
        .api
        .rehearse_plan(Request::new(pb::RehearsePlanRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("rehearsals are running"), "{e:?}");
}
