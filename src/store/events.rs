//! The event log the watch stream serves: a row per state-history entry,
//! per stored chunk of driver output and per deleted batch, written by
//! triggers in the transaction that writes them (the migrations
//! `*_events.sql`), so no write path can forget one.
//!
//! A reader pages through it after a [`Cursor`]. On SQLite writers are
//! serialized and ids grow in commit order. On PostgreSQL replicas commit
//! creates in parallel, so an id can become visible after a greater one:
//! readers take only events of transactions older than every transaction
//! still running (`tx` below the snapshot's xmin) and page by `(tx, id)`,
//! an order in which nothing can appear behind a cursor once it is read.

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::rows::from_micros;
use super::sql::Sql;
use super::{Backend, Store, StoreError};

/// A position in the event log, and the id of an event in the watch
/// stream (`{tx}-{id}`; `tx` is 0 on SQLite).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Cursor {
    pub tx: u64,
    pub id: i64,
}

impl Cursor {
    /// Reads `{tx}-{id}`; None when it is not one.
    pub fn parse(text: &str) -> Option<Cursor> {
        let (tx, id) = text.split_once('-')?;
        let id: i64 = id.parse().ok()?;
        (id >= 0).then_some(Cursor {
            tx: tx.parse().ok()?,
            id,
        })
    }
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.tx, self.id)
    }
}

/// What happened to a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A state-history entry: a change of state, an allocation, a requeue.
    State,
    /// Driver output was stored.
    Output,
    Deleted,
}

/// One event of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRow {
    pub cursor: Cursor,
    pub kind: EventKind,
    pub seq: i64,
    pub batch_id: String,
    pub project: String,
    pub region: String,
    pub at: DateTime<Utc>,
}

/// Which events a reader wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventScope {
    /// One project's batches in a region.
    Project { project: String, region: String },
    /// Every project's batches in a region.
    Region(String),
    /// One batch.
    Batch(i64),
    /// Everything (the engine's one reader of the log's new events).
    All,
}

impl EventScope {
    /// Whether `event` is in this scope.
    pub fn holds(&self, event: &EventRow) -> bool {
        match self {
            EventScope::Project { project, region } => {
                event.project == *project && event.region == *region
            }
            EventScope::Region(region) => event.region == *region,
            EventScope::Batch(seq) => event.seq == *seq,
            EventScope::All => true,
        }
    }
}

impl Store {
    /// The newest event a reader may take now (the start when there is
    /// none).
    pub async fn event_head(&self) -> Result<Cursor, StoreError> {
        let sql = match self.backend {
            Backend::Sqlite => "select '0', id from events order by id desc limit 1",
            Backend::Postgres => {
                "select tx::text, id from events where tx < pg_snapshot_xmin(pg_current_snapshot()) \
                 order by tx desc, id desc limit 1"
            }
        };
        let head: Option<(String, i64)> = sqlx::query_as(sql).fetch_optional(&self.pool).await?;
        Ok(head.map_or_else(Cursor::default, |(tx, id)| Cursor {
            tx: tx.parse().unwrap_or_default(),
            id,
        }))
    }

    /// Whether `cursor` is an event of this log (or its start).
    pub async fn is_event(&self, cursor: Cursor) -> Result<bool, StoreError> {
        if cursor == Cursor::default() {
            return Ok(true);
        }
        let sql = match self.backend {
            Backend::Sqlite => "select count(*) from events where id = $1 and $2 = '0'",
            Backend::Postgres => "select count(*) from events where id = $1 and tx = $2::xid8",
        };
        let n: i64 = sqlx::query_scalar(sql)
            .bind(cursor.id)
            .bind(cursor.tx.to_string())
            .fetch_one(&self.pool)
            .await?;
        Ok(n > 0)
    }

    /// Up to `limit` events of `scope` after `after`, in log order.
    pub async fn events_after(
        &self,
        scope: &EventScope,
        after: Cursor,
        limit: usize,
    ) -> Result<Vec<EventRow>, StoreError> {
        let tx_text = match self.backend {
            Backend::Sqlite => "'0'",
            Backend::Postgres => "tx::text",
        };
        let mut q = Sql::new(
            self.backend,
            format!(
                "select {tx_text} as tx, id, kind, batch_seq, batch_id, project, region, at \
                 from events where "
            ),
        );
        match self.backend {
            Backend::Sqlite => {
                q.push("id > ").bind(after.id);
            }
            Backend::Postgres => {
                q.push("(tx, id) > (")
                    .bind(after.tx.to_string())
                    .push("::xid8, ")
                    .bind(after.id)
                    .push(") and tx < pg_snapshot_xmin(pg_current_snapshot())");
            }
        }
        match scope {
            EventScope::Project { project, region } => {
                q.push(" and project = ")
                    .bind(project.as_str())
                    .push(" and region = ")
                    .bind(region.as_str());
            }
            EventScope::Region(region) => {
                q.push(" and region = ").bind(region.as_str());
            }
            EventScope::Batch(seq) => {
                q.push(" and batch_seq = ").bind(*seq);
            }
            EventScope::All => {}
        }
        q.push(match self.backend {
            Backend::Sqlite => " order by id limit ",
            Backend::Postgres => " order by tx, id limit ",
        })
        .bind(limit as i64);
        let rows = q.fetch_all(&self.pool).await?;
        rows.iter()
            .map(|row| {
                let tx: String = row.try_get("tx")?;
                Ok(EventRow {
                    cursor: Cursor {
                        tx: tx.parse().unwrap_or_default(),
                        id: row.try_get("id")?,
                    },
                    kind: match row.try_get::<i64, _>("kind")? {
                        2 => EventKind::Output,
                        3 => EventKind::Deleted,
                        _ => EventKind::State,
                    },
                    seq: row.try_get("batch_seq")?,
                    batch_id: row.try_get("batch_id")?,
                    project: row.try_get("project")?,
                    region: row.try_get("region")?,
                    at: from_micros(row.try_get("at")?),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Cursor;

    #[test]
    fn a_cursor_reads_back_what_it_writes_and_nothing_else() {
        let c = Cursor { tx: 812, id: 99 };
        assert_eq!(Cursor::parse(&c.to_string()), Some(c));
        for bad in ["", "12", "a-1", "1-b", "1--2", "-1", "1-", "1-2-3"] {
            assert_eq!(Cursor::parse(bad), None, "{bad}");
        }
        assert!(Cursor { tx: 1, id: 0 } > Cursor { tx: 0, id: 50 });
    }
}
