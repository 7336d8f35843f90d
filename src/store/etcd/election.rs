//! Leader election over etcd: campaigning with a lease on the leader key, following the
//! holder, leading with keep-alives and a local deadline, and resigning (see the module docs
//! of [`super`] for the protocol).

use super::*;
use crate::Locked as _;

impl EtcdStore {
    /// Campaign for leadership as `replica` with a lease of `ttl` (rounded up to whole
    /// seconds; etcd may raise very short TTLs to its minimum). Returns at once; the handle
    /// reports the outcome and every later change, and keeps the client running even if this
    /// store is dropped. [`Leadership::resign`] ends the campaign and releases the key at once;
    /// dropping every clone of the handle ends it too, and the key then expires with the lease.
    pub fn campaign(&self, replica: impl Into<String>, ttl: Duration) -> Leadership {
        let runs_on: std::sync::Arc<dyn Send + Sync> = self.rt.clone();
        let (leadership, campaigner) = Leadership::campaign(replica, Some(runs_on));
        let election = Election {
            client: self.client.clone(),
            key: self.leader_key(),
            ttl_secs: ttl.as_secs_f64().ceil().max(1.0) as i64,
            timeout: self.timeout,
            unrevoked: std::sync::Mutex::new(Vec::new()),
        };
        self.handle.spawn(election.run(campaigner));
        leadership
    }
}

/// One replica's campaign, run on the store's runtime.
struct Election {
    client: EtcdClient,
    key: String,
    ttl_secs: i64,
    timeout: Duration,
    /// Leases of ended terms that etcd could not be told about yet: revoked before the next
    /// round, so that a replica back in contact does not wait out its own stale key.
    unrevoked: std::sync::Mutex<Vec<i64>>,
}

enum Round {
    /// Look again (the key was released, or we lost it).
    Again,
    /// Resigned or every handle dropped: the campaign is over.
    Stopped,
}

/// How long before the confirmed lease expiry a leader stops acting: room for clock-rate
/// differences and for the time between a last check and a call leaving the process.
pub(super) fn margin(ttl: Duration) -> Duration {
    (ttl / 5).max(Duration::from_millis(300)).min(ttl / 2)
}

fn stop_signal(c: &Campaigner) -> impl Future<Output = ()> + Send + 'static {
    c.stop_signal()
}

impl Election {
    async fn run(self, c: Campaigner) {
        let mut failures: u32 = 0;
        while !c.stopping() {
            match self.round(&c).await {
                Ok(Round::Stopped) => break,
                Ok(Round::Again) => failures = 0,
                Err(e) => {
                    c.follow(None);
                    failures = failures.saturating_add(1);
                    tracing::warn!(
                        replica = c.replica(),
                        error = %crate::error_chain(&e),
                        "leader election: etcd request failed; retrying"
                    );
                    let delay = Duration::from_millis(100)
                        .saturating_mul(1 << failures.min(5))
                        .min(Duration::from_secs(2));
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = stop_signal(&c) => break,
                    }
                }
            }
        }
        // Dropping the campaigner publishes "follower" and completes `resign`.
    }

    async fn round(&self, c: &Campaigner) -> Result<Round, EtcdError> {
        let pending: Vec<i64> = std::mem::take(&mut *self.unrevoked.locked());
        for id in pending {
            self.revoke(id).await;
        }
        let r = self.range_leader(self.timeout).await?;
        if let Some(holder) = r.kvs.first() {
            let holder = String::from_utf8_lossy(&holder.value).into_owned();
            if holder == c.replica() {
                tracing::warn!(
                    replica = c.replica(),
                    "the leader key holds this replica's id from an earlier process; waiting for its lease to expire"
                );
            }
            c.follow(Some(holder));
            let from = r.header.as_ref().map_or(0, |h| h.revision) + 1;
            return self.follow(c, from).await;
        }
        self.campaign(c).await
    }

    /// Watch the held key until it is released.
    async fn follow(&self, c: &Campaigner, from: i64) -> Result<Round, EtcdError> {
        use rpc::pb::mvccpb::event::EventType;
        // The request stream stays open (the sender alive) for as long as we watch.
        let (requests, rx) = tokio::sync::mpsc::channel(1);
        let create = api::WatchRequest {
            request_union: Some(api::watch_request::RequestUnion::CreateRequest(
                api::WatchCreateRequest {
                    key: self.key.clone().into_bytes(),
                    start_revision: from,
                    ..Default::default()
                },
            )),
        };
        requests
            .send(create)
            .await
            .map_err(|_| EtcdError::StreamEnded)?;
        let mut watch = self.client.watch();
        let mut stream = open_stream(
            self.timeout,
            watch.watch(tokio_stream::wrappers::ReceiverStream::new(rx)),
        )
        .await?;
        loop {
            let msg = tokio::select! {
                m = stream.message() => m.map_err(EtcdError::Status)?,
                _ = stop_signal(c) => return Ok(Round::Stopped),
            };
            let Some(resp) = msg else {
                return Err(EtcdError::StreamEnded);
            };
            if resp.canceled {
                // Compacted past our revision, or the server dropped the watch: look again.
                return Ok(Round::Again);
            }
            for ev in resp.events {
                if ev.r#type == EventType::Delete as i32 {
                    return Ok(Round::Again);
                }
                if let Some(kv) = ev.kv {
                    c.follow(Some(String::from_utf8_lossy(&kv.value).into_owned()));
                }
            }
        }
    }

    async fn campaign(&self, c: &Campaigner) -> Result<Round, EtcdError> {
        let asked = Instant::now();
        let ttl_secs = self.ttl_secs;
        let grant = unary(&self.client, self.timeout, |c| async move {
            c.lease()
                .lease_grant(api::LeaseGrantRequest {
                    ttl: ttl_secs,
                    id: 0,
                })
                .await
        })
        .await?;
        let lease_id = grant.id;
        let ttl = Duration::from_secs(grant.ttl.max(1) as u64);
        let key = self.key.clone().into_bytes();
        let txn = api::TxnRequest {
            compare: vec![rpc::create_revision_is(key.clone(), 0)],
            success: vec![rpc::op_put(
                key.clone(),
                c.replica().as_bytes().to_vec(),
                lease_id,
            )],
            failure: vec![rpc::op_get(key)],
        };
        let r = match unary(&self.client, self.timeout, |c| {
            let req = txn.clone();
            async move { c.kv().txn(req).await }
        })
        .await
        {
            Ok(r) => r,
            Err(e) => {
                self.revoke(lease_id).await;
                return Err(e);
            }
        };
        if !r.succeeded {
            self.revoke(lease_id).await;
            let holder = r.responses.into_iter().find_map(|op| match op.response {
                Some(api::response_op::Response::ResponseRange(g)) => g
                    .kvs
                    .first()
                    .map(|kv| String::from_utf8_lossy(&kv.value).into_owned()),
                _ => None,
            });
            c.follow(holder);
            return Ok(Round::Again);
        }
        let term = r.header.as_ref().map_or(0, |h| h.revision);
        let fence = Fence::new(c.replica(), term);
        let deadline = asked + ttl - margin(ttl);
        c.lead(fence.clone(), deadline);
        tracing::info!(
            replica = c.replica(),
            term,
            ttl_secs = ttl.as_secs(),
            "this replica leads"
        );
        let outcome = self.lead(c, lease_id, &fence, ttl, deadline).await;
        c.follow(None);
        match outcome {
            Ok(Lead::Stopped) => {
                self.revoke(lease_id).await;
                Ok(Round::Stopped)
            }
            Ok(Lead::Lost(why)) => {
                tracing::warn!(
                    replica = c.replica(),
                    term,
                    reason = why,
                    "this replica no longer leads"
                );
                self.revoke(lease_id).await;
                Ok(Round::Again)
            }
            Err(e) => {
                self.revoke(lease_id).await;
                Err(e)
            }
        }
    }

    /// Keep the lease alive until the term ends.
    async fn lead(
        &self,
        c: &Campaigner,
        lease_id: i64,
        fence: &Fence,
        ttl: Duration,
        mut deadline: Instant,
    ) -> Result<Lead, EtcdError> {
        let (mut keeper, mut stream) = match self.keep_alive(self.timeout, lease_id).await {
            Ok((k, s)) => (Some(k), Some(s)),
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "cannot open the lease keep-alive stream; retrying on the next tick");
                (None, None)
            }
        };
        let mut sent: VecDeque<Instant> = VecDeque::new();
        let mut tick = tokio::time::interval(ttl / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await; // the first tick is immediate
        loop {
            enum Ev {
                Stop,
                Tick,
                Renewed(Result<Option<api::LeaseKeepAliveResponse>, tonic::Status>),
                Deadline,
            }
            let ev = tokio::select! {
                _ = stop_signal(c) => Ev::Stop,
                _ = tick.tick() => Ev::Tick,
                m = async {
                    match stream.as_mut() {
                        Some(s) => s.message().await,
                        None => std::future::pending().await,
                    }
                } => Ev::Renewed(m),
                _ = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)) => Ev::Deadline,
            };
            match ev {
                Ev::Stop => return Ok(Lead::Stopped),
                Ev::Deadline => {
                    return Ok(Lead::Lost(
                        "no lease renewal was confirmed before the deadline",
                    ));
                }
                Ev::Renewed(Ok(Some(resp))) => {
                    let Some(at) = sent.pop_front() else { continue };
                    if resp.ttl <= 0 {
                        return Ok(Lead::Lost("etcd reports the lease expired"));
                    }
                    if Instant::now() >= deadline {
                        // Too late: the term is over locally, whatever etcd says now.
                        return Ok(Lead::Lost(
                            "no lease renewal was confirmed before the deadline",
                        ));
                    }
                    let ttl = Duration::from_secs(resp.ttl as u64);
                    deadline = at + ttl - margin(ttl);
                    c.extend(deadline);
                }
                Ev::Renewed(Ok(None) | Err(_)) => {
                    keeper = None;
                    stream = None;
                    sent.clear();
                }
                Ev::Tick => {
                    // Is the key still ours? (An operator may have deleted it.)
                    match self.range_leader(self.timeout.min(ttl / 3)).await {
                        Ok(r) => {
                            let ours = r.kvs.first().is_some_and(|kv| {
                                kv.create_revision == fence.term()
                                    && kv.value == fence.replica().as_bytes()
                            });
                            if !ours {
                                return Ok(Lead::Lost("the leader key no longer holds this term"));
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %crate::error_chain(&e), "cannot read the leader key; the lease deadline decides")
                        }
                    }
                    // Opening the stream is itself a renewal we cannot date precisely: the
                    // next tick's keep-alive extends the deadline.
                    if keeper.is_none()
                        && let Ok((k, s)) =
                            self.keep_alive(self.timeout.min(ttl / 3), lease_id).await
                    {
                        keeper = Some(k);
                        stream = Some(s);
                    }
                    if let Some(k) = keeper.as_mut() {
                        let at = Instant::now();
                        if k.send(api::LeaseKeepAliveRequest { id: lease_id })
                            .await
                            .is_ok()
                        {
                            sent.push_back(at);
                        } else {
                            keeper = None;
                            stream = None;
                            sent.clear();
                        }
                    }
                }
            }
        }
    }

    /// Release the lease (and with it the key) without waiting long. If etcd cannot be
    /// reached, try again before the next round (meanwhile the lease may expire by itself).
    async fn revoke(&self, lease_id: i64) {
        let limit = self.timeout.min(Duration::from_secs(2));
        let revoked = unary(&self.client, limit, |c| async move {
            c.lease()
                .lease_revoke(api::LeaseRevokeRequest { id: lease_id })
                .await
        })
        .await;
        match revoked {
            Ok(_) => {}
            // Already expired and gone.
            Err(EtcdError::Status(s)) if s.code() == tonic::Code::NotFound => {}
            Err(_) => self.unrevoked.locked().push(lease_id),
        }
    }
}

impl Election {
    /// Read the leader key.
    async fn range_leader(&self, timeout: Duration) -> Result<api::RangeResponse, EtcdError> {
        let key = self.key.clone().into_bytes();
        unary(&self.client, timeout, |c| {
            let req = rpc::get(key.clone());
            async move { c.kv().range(req).await }
        })
        .await
    }

    /// Open the lease keep-alive stream: the sender of renewals and the stream of answers.
    async fn keep_alive(
        &self,
        timeout: Duration,
        lease_id: i64,
    ) -> Result<
        (
            tokio::sync::mpsc::Sender<api::LeaseKeepAliveRequest>,
            tonic::Streaming<api::LeaseKeepAliveResponse>,
        ),
        EtcdError,
    > {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        // etcd answers (and so sends the stream's headers) only after a first renewal.
        tx.send(api::LeaseKeepAliveRequest { id: lease_id })
            .await
            .map_err(|_| EtcdError::StreamEnded)?;
        let mut lease = self.client.lease();
        let stream = open_stream(
            timeout,
            lease.lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx)),
        )
        .await?;
        Ok((tx, stream))
    }
}

enum Lead {
    Stopped,
    Lost(&'static str),
}
