//! The `Store` trait over etcd: reads by key and by prefix (paged), and each commit as one etcd
//! transaction whose failure branch probes the checked keys to name the check that failed.

use super::*;

/// What a failed transaction's probe read for one key: `(value, create_revision)`.
type Probed = BTreeMap<Vec<u8>, Option<(Vec<u8>, i64)>>;

impl Store for EtcdStore {
    fn get(&self, table: Table, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let client = self.client.clone();
        let key = self.key(table, key);
        let timeout = self.timeout;
        self.run("get", async move {
            let r = unary(&client, timeout, |c| {
                let req = rpc::get(key.clone());
                async move { c.kv().range(req).await }
            })
            .await?;
            Ok(r.kvs.into_iter().next().map(|kv| kv.value))
        })
    }

    fn scan(&self, table: Table, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.range_prefix("scan", table, prefix, false)
    }

    fn scan_keys(&self, table: Table, prefix: &str) -> Result<Vec<String>, StoreError> {
        Ok(self
            .range_prefix("scan keys", table, prefix, true)?
            .into_iter()
            .map(|(k, _)| k)
            .collect())
    }

    fn commit(&self, txn: Txn) -> Result<(), StoreError> {
        let leader_key = self.leader_key().into_bytes();
        let mut compares = Vec::new();
        let mut probe_keys: Vec<Vec<u8>> = Vec::new();
        let mut probe = |k: &Vec<u8>| {
            if !probe_keys.contains(k) {
                probe_keys.push(k.clone());
            }
        };
        for check in &txn.checks {
            match check {
                Check::Absent(t, k) => {
                    let key = self.key(*t, k);
                    compares.push(rpc::create_revision_is(key.clone(), 0));
                    probe(&key);
                }
                Check::Equals(t, k, v) => {
                    let key = self.key(*t, k);
                    compares.push(rpc::value_is(key.clone(), v.clone()));
                    probe(&key);
                }
                Check::Leader(fence) => {
                    compares.push(rpc::create_revision_is(leader_key.clone(), fence.term()));
                    compares.push(rpc::value_is(
                        leader_key.clone(),
                        fence.replica().as_bytes().to_vec(),
                    ));
                    probe(&leader_key);
                }
            }
        }
        // Last op per key wins, as in a sequential application of the ops.
        let mut last: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
        for op in txn.ops {
            match op {
                Op::Put(t, k, v) => last.insert(self.key(t, &k), Some(v)),
                Op::Delete(t, k) => last.insert(self.key(t, &k), None),
            };
        }
        let success: Vec<api::RequestOp> = last
            .into_iter()
            .map(|(k, v)| match v {
                Some(v) => rpc::op_put(k, v, 0),
                None => rpc::op_delete(k),
            })
            .collect();
        let failure: Vec<api::RequestOp> = probe_keys.iter().cloned().map(rpc::op_get).collect();
        let request = api::TxnRequest {
            compare: compares,
            success,
            failure,
        };
        let client = self.client.clone();
        let timeout = self.timeout;
        let keys = probe_keys.clone();
        let outcome: Option<Probed> = self.run("commit", async move {
            let r = unary(&client, timeout, |c| {
                let req = request.clone();
                async move { c.kv().txn(req).await }
            })
            .await?;
            if r.succeeded {
                return Ok(None);
            }
            if r.responses.len() != keys.len() {
                return Err(EtcdError::ShortTxnResponse);
            }
            let mut probed = Probed::new();
            for (k, resp) in keys.into_iter().zip(r.responses) {
                let Some(api::response_op::Response::ResponseRange(g)) = resp.response else {
                    return Err(EtcdError::ShortTxnResponse);
                };
                let found = g
                    .kvs
                    .into_iter()
                    .next()
                    .map(|kv| (kv.value, kv.create_revision));
                probed.insert(k, found);
            }
            Ok(Some(probed))
        })?;
        let Some(probed) = outcome else {
            return Ok(());
        };
        // Name the failed check: leadership first (it means "stop"), then the data checks in
        // the caller's order.
        let at = |k: &Vec<u8>| probed.get(k).cloned().flatten();
        for check in &txn.checks {
            if let Check::Leader(fence) = check {
                let holds = at(&leader_key)
                    .is_some_and(|(v, rev)| rev == fence.term() && v == fence.replica().as_bytes());
                if !holds {
                    return Err(StoreError::Fenced {
                        replica: fence.replica().to_string(),
                        term: fence.term(),
                    });
                }
            }
        }
        let mut first_data = None;
        for check in &txn.checks {
            let (table, key, holds) = match check {
                Check::Absent(t, k) => (*t, k, at(&self.key(*t, k)).is_none()),
                Check::Equals(t, k, v) => (
                    *t,
                    k,
                    at(&self.key(*t, k)).is_some_and(|(have, _)| have == *v),
                ),
                Check::Leader(_) => continue,
            };
            first_data.get_or_insert((table, key));
            if !holds {
                return Err(StoreError::Conflict {
                    table: table.name(),
                    key: key.clone(),
                });
            }
        }
        // Every check holds when re-read: it failed at the txn's revision and was changed back
        // since, which still is a concurrent change.
        let (table, key) =
            first_data.map_or(("leader", String::new()), |(t, k)| (t.name(), k.clone()));
        Err(StoreError::Conflict { table, key })
    }
}

impl EtcdStore {
    /// Every key under `prefix` of `table`, paged from one revision; with `keys_only` etcd
    /// sends no values (each value comes back empty).
    fn range_prefix(
        &self,
        op: &'static str,
        table: Table,
        prefix: &str,
        keys_only: bool,
    ) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let client = self.client.clone();
        let table_prefix = self.table_prefix(table);
        let start = format!("{table_prefix}{prefix}").into_bytes();
        let end = prefix_end(&start);
        let strip = table_prefix.len();
        let timeout = self.timeout;
        self.run(op, async move {
            let pages = async {
                let mut out = Vec::new();
                let mut from = start;
                let mut revision = 0;
                loop {
                    // Every page from the first page's revision: one consistent snapshot.
                    let req = api::RangeRequest {
                        key: from.clone(),
                        range_end: end.clone(),
                        limit: PAGE,
                        revision,
                        keys_only,
                        ..Default::default()
                    };
                    let r = unary(&client, timeout, |c| {
                        let req = req.clone();
                        async move { c.kv().range(req).await }
                    })
                    .await?;
                    if revision == 0 {
                        revision = r.header.as_ref().map_or(0, |h| h.revision);
                    }
                    for kv in &r.kvs {
                        let key = std::str::from_utf8(&kv.key[strip..]).map_err(|_| {
                            EtcdError::NotUtf8 {
                                key: String::from_utf8_lossy(&kv.key).into_owned(),
                            }
                        })?;
                        out.push((key.to_string(), kv.value.clone()));
                    }
                    match r.kvs.last() {
                        Some(last) if r.more => {
                            from = last.key.clone();
                            from.push(0);
                        }
                        _ => return Ok(out),
                    }
                }
            };
            match tokio::time::timeout(timeout, pages).await {
                Ok(r) => r,
                Err(_) => Err(EtcdError::Timeout { timeout }),
            }
        })
    }
}
