//! The event stream (`GET .../batches:watch`, docs/api.md#the-event-stream):
//! what happens to the batches of a project's region (admins: project `-`,
//! every project), or of one batch, as it happens.
//!
//! Events come from the store's durable log ([`crate::store::EventRow`]),
//! so a watcher that reconnects with the id of the last event it saw
//! (`Last-Event-ID`) gets everything after it, from any replica. A watch
//! is a task that pages through the log after its cursor and sends each
//! batch that changed as it is now (the events of one page are collapsed
//! per batch: a client that resumes from any id it saw still ends with
//! every batch's latest state), then waits for the log to move: one task
//! ([`Engine::event_tail`]) reads the log's new events once for every
//! watcher and says which events they were ([`Moved`]); a watch reads the
//! log again only when one of them is in its scope. Queue
//! positions change without an event of their own: every
//! [`POSITION_EVERY`] the watch sends the positions of the queued batches
//! it has seen that moved (at most [`POSITIONS_KEPT`]).
//!
//! Memory per watch is bounded: a channel of [`BUFFERED`] events, and the
//! positions kept. A watcher that does not read for `limits.watch_stall`
//! is dropped; more than `limits.max_watchers` at once are refused.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::mpsc;

use super::Reason;
use super::{Engine, Error};
use crate::api::{Batch, BatchName, State};
use crate::scheduler::BatchKey;
use crate::store::{Cursor, EventKind, EventRow, EventScope};

/// Events a watch holds for its watcher.
const BUFFERED: usize = 64;
/// Events read from the log at once.
const PAGE: usize = 256;
/// How often queue positions are looked at.
pub(super) const POSITION_EVERY: Duration = Duration::from_secs(2);
/// Queued batches whose position a watch follows.
pub(super) const POSITIONS_KEPT: usize = 100;
/// How often the log's new events are read for every watcher.
const TAIL_EVERY: Duration = Duration::from_millis(100);
/// New events read at once by the tail.
const TAIL_PAGE: usize = 2048;

/// What the log's tail read last: its events after `from` up to `to`.
#[derive(Debug, Default)]
pub(crate) struct Moved {
    from: Cursor,
    to: Cursor,
    events: Vec<EventRow>,
}

/// What a watch asks for.
#[derive(Debug, Clone)]
pub struct WatchRequest {
    /// A project, or `-` for every project of the region (admins).
    pub project: String,
    /// A region, or with project `-` (and no batch) `-` for every region.
    pub region: String,
    /// Only this batch.
    pub batch_id: Option<String>,
    /// Resume after this event (the `id` of the last one seen).
    pub last_event_id: Option<String>,
}

/// One event of a watch.
#[derive(Debug, Clone)]
pub enum WatchEvent {
    /// The watch started without `Last-Event-ID`: events follow from this
    /// cursor (a client reads what it needs first, then applies events).
    Ready { cursor: Cursor },
    /// A batch changed (its state, an allocation, its output): as it is
    /// now, with what changed.
    Batch {
        cursor: Cursor,
        changes: Vec<&'static str>,
        batch: Box<Batch>,
    },
    Deleted {
        cursor: Cursor,
        name: String,
        at: DateTime<Utc>,
    },
    /// A queued batch's place in the queue moved.
    Position {
        name: String,
        queue_position: usize,
        estimated_start_time: Option<DateTime<Utc>>,
    },
}

/// A running watch: its events, until the receiver is dropped or the
/// watch ends.
pub struct Watch {
    pub events: mpsc::Receiver<WatchEvent>,
}

/// Counts a watcher while it lives.
struct Watcher(Engine);

impl Drop for Watcher {
    fn drop(&mut self) {
        let left = self.0.shared.watchers.fetch_sub(1, Ordering::SeqCst) - 1;
        crate::metrics::set_watchers(left);
    }
}

impl Engine {
    /// Starts a watch (the caller's right to read the project's batches
    /// was checked by admission).
    pub async fn watch(&self, req: WatchRequest) -> Result<Watch, Error> {
        let every_region = req.region == "-";
        if every_region && (req.project != "-" || req.batch_id.is_some()) {
            return Err(Error::invalid_field(
                "region",
                "\"-\" (every region) is for project \"-\" (every project, admins) without batchId; accepted: a region flexq serves",
            ));
        }
        if !every_region && !self.config().regions.contains_key(&req.region) {
            return Err(Error::invalid_field(
                "region",
                crate::spec::not_served(&req.region, self.config().regions.keys()),
            ));
        }
        let scope =
            match &req.batch_id {
                Some(id) => {
                    let name = BatchName::new(&req.project, &req.region, id);
                    let record =
                        self.shared.store.get(&name).await.map_err(|e| {
                            super::batches::not_found_as(e, "batch", &name.to_string())
                        })?;
                    EventScope::Batch(record.seq)
                }
                None if every_region => EventScope::All,
                None if req.project == "-" => EventScope::Region(req.region.clone()),
                None => EventScope::Project {
                    project: req.project.clone(),
                    region: req.region.clone(),
                },
            };
        let head = self.shared.store.event_head().await?;
        let start = match &req.last_event_id {
            None => None,
            Some(text) => {
                let parsed = Cursor::parse(text).filter(|c| *c <= head);
                let known = match parsed {
                    Some(c) => self.shared.store.is_event(c).await?,
                    None => false,
                };
                if !known {
                    return Err(Error::invalid_field(
                        "Last-Event-ID",
                        format!(
                            "{} is not an event id of this flexq: the id of an event it sent, like {head}",
                            crate::api::quote(text)
                        ),
                    ));
                }
                parsed
            }
        };
        let max = self.config().limits.max_watchers;
        let now = self.shared.watchers.fetch_add(1, Ordering::SeqCst) + 1;
        let guard = Watcher(self.clone());
        if now > max {
            drop(guard);
            crate::metrics::record_watcher_dropped("refused");
            return Err(Error::new(Reason::TooManyWatchers,
                format!("this replica serves {max} watchers at once (limits.max_watchers); try again later"),
            )
            .with_meta("limit", "limits.max_watchers"));
        }
        crate::metrics::set_watchers(now);
        let (tx, events) = mpsc::channel(BUFFERED);
        let engine = self.clone();
        tokio::spawn(async move {
            let _counted = guard;
            let stall = engine.config().limits.watch_stall;
            let cursor = match start {
                Some(c) => c,
                None => {
                    if !send(&tx, WatchEvent::Ready { cursor: head }, stall).await {
                        return;
                    }
                    head
                }
            };
            engine.run_watch(scope, cursor, tx, stall).await;
        });
        Ok(Watch { events })
    }

    async fn run_watch(
        &self,
        scope: EventScope,
        mut cursor: Cursor,
        tx: mpsc::Sender<WatchEvent>,
        stall: Duration,
    ) {
        let mut moves = self.shared.event_moves.subscribe();
        let mut positions: BTreeMap<i64, (BatchName, Option<usize>)> = BTreeMap::new();
        let mut tick = tokio::time::interval(POSITION_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let shutdown = self.shared.shutdown.clone();
        let mut read = true;
        let mut failed = false;
        loop {
            if read {
                failed = false;
                match self.shared.store.events_after(&scope, cursor, PAGE).await {
                    Ok(page) if !page.is_empty() => {
                        let full = page.len() == PAGE;
                        cursor = page.last().map_or(cursor, |e| e.cursor);
                        for event in self.events_of(page, &mut positions).await {
                            if !send(&tx, event, stall).await {
                                return;
                            }
                        }
                        if full {
                            continue;
                        }
                    }
                    Ok(_) => {}
                    // The database is away (a failover): the watch goes on
                    // and reads again at the next move or tick.
                    Err(e) => {
                        tracing::warn!(error = %e, "a watch cannot read the event log");
                        failed = true;
                    }
                }
            }
            read = false;
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tx.closed() => return,
                changed = moves.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let moved = moves.borrow_and_update().clone();
                    if moved.from > cursor || moved.events.iter().any(|e| e.cursor > cursor && scope.holds(e)) {
                        // Something of this watch's, or it cannot tell
                        // (it is behind what the tail read): read.
                        read = true;
                    } else if moved.to > cursor {
                        // Nothing of its own up to there.
                        cursor = moved.to;
                    }
                }
                _ = tick.tick() => {
                    // A read that failed is tried again.
                    read = failed;
                    for event in self.moved_positions(&mut positions).await {
                        if !send(&tx, event, stall).await {
                            return;
                        }
                    }
                }
            }
        }
    }

    /// A page of the log as watch events: one per batch, as it is now, at
    /// the cursor of its last event in the page, in cursor order.
    async fn events_of(
        &self,
        page: Vec<EventRow>,
        positions: &mut BTreeMap<i64, (BatchName, Option<usize>)>,
    ) -> Vec<WatchEvent> {
        // Per batch: what changed, and its last event in the page.
        let mut per_batch: HashMap<i64, (Vec<&'static str>, EventRow)> = HashMap::new();
        for e in page {
            let what = match e.kind {
                EventKind::State => "state",
                EventKind::Output => "output",
                EventKind::Deleted => "deleted",
            };
            let entry = per_batch
                .entry(e.seq)
                .or_insert_with(|| (Vec::new(), e.clone()));
            if !entry.0.contains(&what) {
                entry.0.push(what);
            }
            entry.1 = e;
        }
        let mut batches: Vec<_> = per_batch.into_values().collect();
        batches.sort_by_key(|(_, last)| last.cursor);
        let mut out = Vec::with_capacity(batches.len());
        for (changes, last) in batches {
            let cursor = last.cursor;
            let name = BatchName::new(&last.project, &last.region, &last.batch_id);
            let batch = if last.kind == EventKind::Deleted {
                None
            } else {
                self.get(&name).await.ok()
            };
            match batch {
                Some(batch) => {
                    let queued = batch.state == Some(State::Pending)
                        && batch
                            .flexq
                            .as_ref()
                            .is_some_and(|f| f.queue_position.is_some());
                    if queued {
                        let position = batch.flexq.as_ref().and_then(|f| f.queue_position);
                        if positions.len() < POSITIONS_KEPT || positions.contains_key(&last.seq) {
                            positions.insert(last.seq, (name, position));
                        }
                    } else {
                        positions.remove(&last.seq);
                    }
                    out.push(WatchEvent::Batch {
                        cursor,
                        changes,
                        batch: Box::new(batch),
                    });
                }
                None => {
                    positions.remove(&last.seq);
                    out.push(WatchEvent::Deleted {
                        cursor,
                        name: name.to_string(),
                        at: last.at,
                    });
                }
            }
        }
        out
    }

    /// The followed queued batches whose position moved since it was last
    /// sent; those no longer queued are forgotten.
    async fn moved_positions(
        &self,
        positions: &mut BTreeMap<i64, (BatchName, Option<usize>)>,
    ) -> Vec<WatchEvent> {
        if positions.is_empty() {
            return Vec::new();
        }
        let now = Utc::now();
        let core = self.lock().await;
        let mut out = Vec::new();
        positions.retain(|seq, (name, sent)| {
            let Some(info) = core.pending_info(BatchKey(*seq), now) else {
                return false;
            };
            if *sent != Some(info.queue_position) {
                *sent = Some(info.queue_position);
                out.push(WatchEvent::Position {
                    name: name.to_string(),
                    queue_position: info.queue_position,
                    estimated_start_time: info.estimated_start_time,
                });
            }
            true
        });
        out
    }

    /// Reads the log's new events once for every watcher, every
    /// [`TAIL_EVERY`] while there are watchers, and tells them which.
    pub(super) fn event_tail(&self) {
        let engine = self.clone();
        tokio::spawn(async move {
            let shutdown = engine.shared.shutdown.clone();
            let mut every = tokio::time::interval(TAIL_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last: Option<Cursor> = None;
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = every.tick() => {}
                }
                if engine.shared.watchers.load(Ordering::SeqCst) == 0 {
                    last = None;
                    continue;
                }
                let store = &engine.shared.store;
                let from = match last {
                    Some(c) => c,
                    None => match store.event_head().await {
                        Ok(head) => head,
                        Err(e) => {
                            tracing::debug!(error = %e, "cannot read the event log's head");
                            continue;
                        }
                    },
                };
                if last.is_none() {
                    // Starting here: a watcher behind this point reads
                    // for itself (it sees `from` beyond its cursor).
                    let _ = engine.shared.event_moves.send(Arc::new(Moved {
                        from,
                        to: from,
                        events: Vec::new(),
                    }));
                    last = Some(from);
                }
                match store.events_after(&EventScope::All, from, TAIL_PAGE).await {
                    Ok(events) => {
                        let to = events.last().map_or(from, |e| e.cursor);
                        last = Some(to);
                        if !events.is_empty() {
                            let _ = engine.shared.event_moves.send(Arc::new(Moved {
                                from,
                                to,
                                events,
                            }));
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "cannot read the event log"),
                }
            }
        });
    }
}

/// Sends `event`, or gives up when the watcher has not taken anything for
/// `stall` (it is dropped) or is gone. False: the watch ends.
async fn send(tx: &mpsc::Sender<WatchEvent>, event: WatchEvent, stall: Duration) -> bool {
    let kind = match &event {
        WatchEvent::Ready { .. } => "ready",
        WatchEvent::Batch { .. } => "batch",
        WatchEvent::Deleted { .. } => "deleted",
        WatchEvent::Position { .. } => "position",
    };
    match tokio::time::timeout(stall, tx.send(event)).await {
        Ok(Ok(())) => {
            crate::metrics::record_watch_event(kind);
            true
        }
        Ok(Err(_)) => false,
        Err(_) => {
            tracing::info!(
                stall_s = stall.as_secs(),
                "watcher dropped: it stopped reading"
            );
            crate::metrics::record_watcher_dropped("stalled");
            false
        }
    }
}
