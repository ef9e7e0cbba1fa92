//! Group commit of creates.
//!
//! One task owns creation. It takes every create waiting in its channel (up
//! to `group_commit_max`), decides each against the database and the rest
//! of the group (a taken batch id, a replayed `requestId`), writes all new
//! rows with multi-row inserts in one write transaction, commits once, and
//! only then answers every waiter. The commit is the fsync (SQLite with
//! `synchronous=FULL`, PostgreSQL's WAL flush), so a success answer means
//! the batch is on disk.
//!
//! If the group transaction fails as a whole (a constraint the in-group
//! checks did not foresee, say), each create is retried in a transaction of
//! its own, so one bad create cannot fail its neighbours.
//!
//! On PostgreSQL another replica may be creating the same batch id or
//! requestId (a client retrying there after this one stopped answering):
//! its uncommitted row would make this group's insert wait on the unique
//! index, and every create behind it with it. So a group first takes, each
//! without waiting, a transaction lock per batch id and requestId
//! ([`lock_keys`]); a create whose key another transaction holds leaves
//! the group and waits on a task of its own, never holding up the rest.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use chrono::{DateTime, Utc};
use sqlx::{AnyConnection, Row};
use tokio::sync::{mpsc, oneshot};

use super::rows::{BATCH_COLUMNS, micros, read_batches};
use super::sql::Sql;
use super::{BatchRecord, Created, NewBatch, Store, StoreError};
use crate::api::{State, StateHistory};

pub(super) struct CreateCmd {
    pub batch: NewBatch,
    pub reply: oneshot::Sender<Result<Created, StoreError>>,
}

/// Rows per multi-row insert: 15 columns × 1000 stays far below SQLite's
/// bound-parameter limit.
const INSERT_CHUNK: usize = 1000;

pub(super) async fn run(store: Store, mut rx: mpsc::Receiver<CreateCmd>, max: usize) {
    let mut buf = Vec::with_capacity(max);
    while rx.recv_many(&mut buf, max).await > 0 {
        let group = std::mem::take(&mut buf);
        commit_group(&store, group).await;
    }
    tracing::debug!("create writer stopped");
}

type Reply = oneshot::Sender<Result<Created, StoreError>>;

async fn commit_group(store: &Store, group: Vec<CreateCmd>) {
    let started = Instant::now();
    let (batches, replies): (Vec<NewBatch>, Vec<_>) =
        group.into_iter().map(|c| (c.batch, c.reply)).unzip();
    // Stored times have microsecond precision; answer with exactly what a
    // later read returns.
    let now = now_micros();
    let mut busy = Vec::new();
    match try_group(store, &batches, now, false).await {
        Ok(outcomes) => {
            if let Some(observe) = &store.observe_group {
                observe(started.elapsed(), batches.len());
            }
            for ((batch, reply), outcome) in batches.into_iter().zip(replies).zip(outcomes) {
                match outcome {
                    // A waiter that went away (client hung up) is fine: the
                    // batch is committed and a retry with its requestId
                    // finds it.
                    Some(outcome) => {
                        let _ = reply.send(outcome);
                    }
                    None => busy.push((batch, reply)),
                }
            }
        }
        Err(e) => {
            if batches.len() > 1 {
                tracing::warn!(error = %e, group = batches.len(), "group commit failed; retrying creates one by one");
            }
            for (batch, reply) in batches.into_iter().zip(replies) {
                match create_alone(store, &batch, false).await {
                    Some(outcome) => answer(&batch, reply, outcome),
                    None => busy.push((batch, reply)),
                }
            }
        }
    }
    wait_apart(store, busy);
}

fn answer(batch: &NewBatch, reply: Reply, outcome: Result<Created, StoreError>) {
    if let Err(e) = &outcome {
        tracing::error!(error = %e, batch.id = %batch.name.batch_id, "create failed");
    }
    let _ = reply.send(outcome);
}

/// Creates whose batch id or requestId another transaction holds: each
/// waits for it on a task of its own (bounded by the session's
/// `lock_timeout`), apart from the groups that follow.
fn wait_apart(store: &Store, busy: Vec<(NewBatch, Reply)>) {
    if busy.is_empty() {
        return;
    }
    tracing::info!(
        creates = busy.len(),
        "a create's batch id or requestId is being created by another transaction: it waits apart"
    );
    let store = store.clone();
    tokio::spawn(async move {
        for (batch, reply) in busy {
            let outcome = create_alone(&store, &batch, true).await.unwrap_or_else(|| {
                Err(StoreError::Unavailable(
                    "a create lock was not taken".into(),
                ))
            });
            answer(&batch, reply, outcome);
        }
    });
}

/// One create in a transaction of its own. A unique index that refused it
/// means another replica committed the same batch id or requestId in the
/// meantime (PostgreSQL creates do not take the write lock): deciding
/// again sees that batch and answers ALREADY_EXISTS, or the same batch.
/// `None` when, not to `wait`, its key is held by another transaction.
async fn create_alone(
    store: &Store,
    batch: &NewBatch,
    wait: bool,
) -> Option<Result<Created, StoreError>> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        match try_group(store, std::slice::from_ref(batch), now_micros(), wait).await {
            Ok(mut one) => {
                return one
                    .pop()
                    .unwrap_or(Some(Err(StoreError::Unavailable("no outcome".into()))));
            }
            Err(StoreError::Conflict(_)) if attempts < 3 => {}
            Err(e) => return Some(Err(e)),
        }
    }
}

fn now_micros() -> DateTime<Utc> {
    DateTime::from_timestamp_micros(Utc::now().timestamp_micros()).unwrap_or_else(Utc::now)
}

/// What the group decided for one create.
enum Disposition {
    Insert,
    /// The requestId belongs to a stored batch.
    ReplayStored(Box<BatchRecord>),
    /// The requestId belongs to an earlier create of this group.
    ReplayInGroup(usize),
    Taken,
    /// Its batch id or requestId is held by another transaction.
    Busy,
}

type Key = (String, String, String);

/// Each create's outcome, `None` for those left to wait apart.
/// [`try_group_once`], bounded on PostgreSQL: a connection that a
/// partition lost without a word never answers, and the one writer must
/// not wait on it with every create behind it. The server's own bounds
/// (the session's `lock_timeout`) end a live session's wait first. What
/// it says of the disk is noted ([`Store::note_write`]).
async fn try_group(
    store: &Store,
    batches: &[NewBatch],
    now: DateTime<Utc>,
    wait: bool,
) -> Result<Vec<Option<Result<Created, StoreError>>>, StoreError> {
    let result = if store.backend != super::Backend::Postgres {
        try_group_once(store, batches, now, wait).await
    } else {
        let bound = store.limits.write_bound();
        tokio::time::timeout(bound, try_group_once(store, batches, now, wait))
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::Unavailable(format!(
                    "the database did not answer a group commit of {} create(s) within {} ms",
                    batches.len(),
                    bound.as_millis()
                )))
            })
    };
    // Creates grow the database: on PostgreSQL a full disk refuses their
    // inserts (before any commit), and their success says there is space.
    store.note_write(&result, true);
    result
}

/// One try of a group: takes the create locks (PostgreSQL), reads the
/// taken batch ids and stored requestIds, decides each create, inserts
/// the new rows, announces them and commits.
async fn try_group_once(
    store: &Store,
    batches: &[NewBatch],
    now: DateTime<Utc>,
    wait: bool,
) -> Result<Vec<Option<Result<Created, StoreError>>>, StoreError> {
    let mut tx = store.begin_create().await?;
    // Before any read: a key locked here is not being created by anyone
    // else, and what those reads see of it is final.
    let busy = match store.backend {
        super::Backend::Postgres => lock_keys(&mut tx, batches, wait).await?,
        super::Backend::Sqlite => HashSet::new(),
    };
    // Taken ids first: on PostgreSQL another replica may commit the same
    // create between the two reads, and a requestId seen stored must win
    // over its batch id seen taken (the answer is then the same batch).
    let taken_ids = taken_batch_ids(store.backend, &mut tx, batches).await?;
    let stored_requests = stored_request_ids(store, &mut tx, batches).await?;

    let decisions = decide(batches, &busy, &taken_ids, &stored_requests);
    let new = in_index_order(batches, &decisions);
    let seqs = insert_batches(store.backend, &mut tx, &new, now).await?;
    if let (Some(&first_seq), Some(&last_seq)) = (seqs.values().min(), seqs.values().max()) {
        store
            .announce(
                &mut tx,
                &super::Change::Created {
                    first_seq,
                    last_seq,
                },
            )
            .await?;
    }
    store.commit(tx).await?;

    Ok(outcomes(batches, decisions, &seqs, now))
}

/// What the group decides for each create, in order: busy when another
/// transaction holds its key; a replay when its requestId is stored or
/// was used earlier in the group; taken when its batch id is stored or
/// was used earlier in the group; else an insert.
fn decide(
    batches: &[NewBatch],
    busy: &HashSet<usize>,
    taken_ids: &HashSet<Key>,
    stored_requests: &HashMap<Key, BatchRecord>,
) -> Vec<Disposition> {
    let mut ids_in_group: HashSet<Key> = HashSet::new();
    let mut requests_in_group: HashMap<Key, usize> = HashMap::new();
    batches
        .iter()
        .enumerate()
        .map(|(i, b)| {
            if busy.contains(&i) {
                return Disposition::Busy;
            }
            let n = &b.name;
            if let Some(req) = &b.request_id {
                let key = (n.project.clone(), n.region.clone(), req.clone());
                if let Some(stored) = stored_requests.get(&key) {
                    return Disposition::ReplayStored(Box::new(stored.clone()));
                }
                if let Some(&first) = requests_in_group.get(&key) {
                    return Disposition::ReplayInGroup(first);
                }
            }
            let id = (n.project.clone(), n.region.clone(), n.batch_id.clone());
            if taken_ids.contains(&id) || !ids_in_group.insert(id) {
                return Disposition::Taken;
            }
            if let Some(req) = &b.request_id {
                requests_in_group.insert((n.project.clone(), n.region.clone(), req.clone()), i);
            }
            Disposition::Insert
        })
        .collect()
}

/// The creates decided to be inserted, in the order of the batch id index.
fn in_index_order<'a>(batches: &'a [NewBatch], decisions: &[Disposition]) -> Vec<&'a NewBatch> {
    let mut new: Vec<&NewBatch> = batches
        .iter()
        .zip(decisions)
        .filter(|(_, d)| matches!(d, Disposition::Insert))
        .map(|(b, _)| b)
        .collect();
    // In index order: two replicas' groups that share a batch id then meet
    // on it first, one waiting for the other, instead of deadlocking.
    new.sort_by(|a, b| {
        (&a.name.batch_id, &a.name.project, &a.name.region).cmp(&(
            &b.name.batch_id,
            &b.name.project,
            &b.name.region,
        ))
    });
    new
}

/// Each create's outcome once the group committed, from what was decided
/// for it and the sequence numbers of the inserted rows; `None` for the
/// busy ones.
fn outcomes(
    batches: &[NewBatch],
    decisions: Vec<Disposition>,
    seqs: &HashMap<String, i64>,
    now: DateTime<Utc>,
) -> Vec<Option<Result<Created, StoreError>>> {
    let mut records: HashMap<usize, BatchRecord> = HashMap::new();
    let mut outcomes = Vec::with_capacity(batches.len());
    for (i, (b, d)) in batches.iter().zip(decisions).enumerate() {
        outcomes.push(Some(match d {
            Disposition::Busy => {
                outcomes.push(None);
                continue;
            }
            Disposition::Insert => {
                let seq = seqs.get(&b.uuid.to_string()).copied().unwrap_or_default();
                let record = new_record(b, seq, now);
                records.insert(i, record.clone());
                Ok(Created::New(record))
            }
            Disposition::ReplayStored(r) => Ok(Created::Replayed(*r)),
            Disposition::ReplayInGroup(first) => records
                .get(&first)
                .cloned()
                .map(Created::Replayed)
                .ok_or(StoreError::Unavailable(
                    "replayed create lost its first".into(),
                )),
            Disposition::Taken => Err(StoreError::AlreadyExists(format!(
                "batch {} already exists",
                b.name
            ))),
        }));
    }
    outcomes
}

/// The key space of the create locks (`pg_advisory_xact_lock(int4,
/// int4)`), apart from the write lock's (one bigint). "flxq".
const CREATE_LOCKS: i32 = 0x666c_7871;

/// Locks, for the transaction, each create's batch id and requestId
/// (PostgreSQL; by hash, so a collision only costs a wait). Not to `wait`:
/// only the free ones, answering the creates whose key another
/// transaction holds; to `wait`: each in one order (no deadlock), bounded
/// by the session's `lock_timeout`.
async fn lock_keys(
    tx: &mut AnyConnection,
    batches: &[NewBatch],
    wait: bool,
) -> Result<HashSet<usize>, StoreError> {
    let keys: Vec<(i64, String)> = batches
        .iter()
        .enumerate()
        .flat_map(|(i, b)| {
            let n = &b.name;
            std::iter::once((
                i as i64,
                format!("b/{}/{}/{}", n.project, n.region, n.batch_id),
            ))
            .chain(
                b.request_id
                    .as_ref()
                    .map(|r| (i as i64, format!("r/{}/{}/{r}", n.project, n.region))),
            )
        })
        .collect();
    if wait {
        let mut texts: Vec<&str> = keys.iter().map(|(_, k)| k.as_str()).collect();
        texts.sort_unstable();
        texts.dedup();
        for key in texts {
            sqlx::query("select 1 from pg_advisory_xact_lock($1, hashtext($2))")
                .bind(CREATE_LOCKS)
                .bind(key)
                .execute(&mut *tx)
                .await?;
        }
        return Ok(HashSet::new());
    }
    let mut q = Sql::new(super::Backend::Postgres, "select distinct v.i from (");
    q.values(&keys, |row, (i, k)| {
        row.bind(*i).bind(k.as_str());
    });
    q.push(") as v(i, k) where not pg_try_advisory_xact_lock(")
        .bind(CREATE_LOCKS)
        .push(", hashtext(v.k))");
    let rows = q.fetch_all(&mut *tx).await?;
    rows.iter()
        .map(|r| Ok(r.try_get::<i64, _>(0)? as usize))
        .collect()
}

fn new_record(b: &NewBatch, seq: i64, now: DateTime<Utc>) -> BatchRecord {
    BatchRecord {
        seq,
        name: b.name.clone(),
        uuid: b.uuid.to_string(),
        operation_id: b.operation_id.to_string(),
        request_id: b.request_id.clone(),
        create_time: now,
        state: State::Pending,
        state_message: b.state_message.clone(),
        state_time: now,
        creator: b.creator.clone(),
        spec: b.spec.clone(),
        cluster: b.cluster.clone(),
        alternatives: b.alternatives.clone(),
        deadline: b.cluster.deadline(now),
        provisioning: super::Provisioning::Queued,
        priority: b.priority,
        zone: None,
        allocate_time: None,
        master_url: None,
        attempt: 1,
        end_reason: None,
        alternative: 0,
        preempted_by: None,
        requeue_reason: None,
        stop_grace_s: None,
        preemptions: 0,
        run: super::RunInfo::default(),
        history: vec![StateHistory {
            state: State::Pending,
            state_message: b.state_message.clone(),
            state_start_time: now,
        }],
    }
}

async fn stored_request_ids(
    store: &Store,
    tx: &mut AnyConnection,
    batches: &[NewBatch],
) -> Result<HashMap<Key, BatchRecord>, StoreError> {
    let wanted: Vec<&str> = batches
        .iter()
        .filter_map(|b| b.request_id.as_deref())
        .collect();
    if wanted.is_empty() {
        return Ok(HashMap::new());
    }
    let mut q = Sql::new(
        store.backend,
        format!("select {BATCH_COLUMNS} from batches where request_id in ("),
    );
    q.list(wanted).push(")");
    let rows = q.fetch_all(&mut *tx).await?;
    // On the transaction's own connection: waiting for another from the
    // pool would leave the transaction idle (and its session may not
    // idle long: SessionLimits).
    let records = read_batches(&mut *tx, store.backend, rows).await?;
    Ok(records
        .into_iter()
        .filter_map(|r| {
            let req = r.request_id.clone()?;
            Some(((r.name.project.clone(), r.name.region.clone(), req), r))
        })
        .collect())
}

async fn taken_batch_ids(
    backend: super::Backend,
    tx: &mut AnyConnection,
    batches: &[NewBatch],
) -> Result<HashSet<Key>, StoreError> {
    let mut q = Sql::new(
        backend,
        "select project, region, batch_id from batches where batch_id in (",
    );
    q.list(batches.iter().map(|b| b.name.batch_id.as_str()))
        .push(")");
    let rows = q.fetch_all(&mut *tx).await?;
    rows.iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
        .collect()
}

/// Inserts the new batches and their first history entry; returns each
/// batch's `seq` by uuid.
async fn insert_batches(
    backend: super::Backend,
    tx: &mut AnyConnection,
    new: &[&NewBatch],
    now: DateTime<Utc>,
) -> Result<HashMap<String, i64>, StoreError> {
    let mut seqs = HashMap::with_capacity(new.len());
    let now_us = micros(now);
    for chunk in new.chunks(INSERT_CHUNK) {
        let encoded = chunk
            .iter()
            .map(|b| {
                Ok((
                    serde_json::to_string(&b.spec)?,
                    super::rows::encode_cluster(&b.cluster, &b.alternatives)?,
                ))
            })
            .collect::<Result<Vec<_>, serde_json::Error>>()
            .map_err(|e| StoreError::Unavailable(format!("cannot encode batch: {e}")))?;
        let mut q = Sql::new(
            backend,
            "insert into batches (project, region, batch_id, uuid, operation_id, request_id, \
             create_time, state, state_message, state_time, creator, spec, cluster, deadline, priority) ",
        );
        q.values(chunk.iter().zip(&encoded), |row, (b, (spec, cluster))| {
            row.bind(b.name.project.as_str())
                .bind(b.name.region.as_str())
                .bind(b.name.batch_id.as_str())
                .bind(b.uuid.to_string())
                .bind(b.operation_id.to_string())
                .bind(b.request_id.as_deref())
                .bind(now_us)
                .bind(State::Pending.number())
                .bind(b.state_message.as_str())
                .bind(now_us)
                .bind(b.creator.as_str())
                .bind(spec.as_str())
                .bind(cluster.as_str())
                .bind(b.cluster.deadline(now).map(micros))
                .bind(b.priority);
        });
        q.push(" returning seq, uuid");
        let rows = q.fetch_all(&mut *tx).await?;
        let mut chunk_seqs = Vec::with_capacity(rows.len());
        for row in rows {
            let seq: i64 = row.try_get(0)?;
            seqs.insert(row.try_get::<String, _>(1)?, seq);
            chunk_seqs.push(seq);
        }
        let mut h = Sql::new(
            backend,
            "insert into state_history (batch_seq, idx, state, message, start_time) ",
        );
        h.values(chunk.iter(), |row, b| {
            let seq = seqs.get(&b.uuid.to_string()).copied().unwrap_or_default();
            row.bind(seq)
                .bind(0i64)
                .bind(State::Pending.number())
                .bind(b.state_message.as_str())
                .bind(now_us);
        });
        h.execute(&mut *tx).await?;
    }
    Ok(seqs)
}
