//! The registered nodes: an agent's registration (each a new epoch, which
//! fences what the node's earlier registration did) and the nodes not lost.
//! Losing a node is the scheduler's decision, committed with the rest of a
//! pass (`schedule.rs`).

use chrono::{DateTime, Utc};

use super::rows::micros;
use super::{Change, Store, StoreError};
use crate::scheduler::NodeSpec;

impl Store {
    /// Registers (or re-registers) an agent's node; answers its new epoch.
    pub async fn register_node(
        &self,
        spec: &NodeSpec,
        now: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        let json = serde_json::to_string(spec)
            .map_err(|e| StoreError::Unavailable(format!("cannot encode node: {e}")))?;
        let mut tx = self.begin_write().await?;
        // A node being suspended (docs/rules.md#provisioned-capacity) does
        // not come back by registering: its program is deleting it.
        let suspending: Option<i64> =
            sqlx::query_scalar("select state from node_slots where node_id = $1 and state = 2")
                .bind(&spec.id.0)
                .fetch_optional(&mut *tx)
                .await?;
        if suspending.is_some() {
            return Err(StoreError::FailedPrecondition(format!(
                "node {} is being suspended by its pool's provisioner: it may register again once its suspend program ended",
                spec.id
            )));
        }
        let epoch: i64 = sqlx::query_scalar(
            "insert into nodes (node_id, region, zone, pool, spec, epoch, state, registered_at) \
             values ($1, $2, $3, $4, $5, 1, 0, $6) on conflict (node_id) do update set \
             region = excluded.region, zone = excluded.zone, pool = excluded.pool, spec = excluded.spec, \
             epoch = nodes.epoch + 1, state = 0, registered_at = excluded.registered_at \
             returning epoch",
        )
        .bind(&spec.id.0)
        .bind(&spec.region)
        .bind(&spec.zone)
        .bind(&spec.pool)
        .bind(json)
        .bind(micros(now))
        .fetch_one(&mut *tx)
        .await?;
        self.announce(
            &mut tx,
            &Change::Node {
                id: spec.id.0.clone(),
            },
        )
        .await?;
        self.commit(tx).await?;
        Ok(epoch.max(0) as u64)
    }

    /// Every registered node not lost, with its epoch.
    pub async fn active_nodes(&self) -> Result<Vec<(NodeSpec, u64)>, StoreError> {
        let rows: Vec<(String, i64)> =
            sqlx::query_as("select spec, epoch from nodes where state = 0 order by node_id")
                .fetch_all(&self.pool)
                .await?;
        rows.into_iter()
            .map(|(spec, epoch)| {
                let spec: NodeSpec = serde_json::from_str(&spec).map_err(|e| {
                    StoreError::Unavailable(format!("stored node cannot be read: {e}"))
                })?;
                Ok((spec, epoch.max(0) as u64))
            })
            .collect()
    }

    /// A registered node not lost, with its epoch.
    pub async fn active_node(&self, id: &str) -> Result<Option<(NodeSpec, u64)>, StoreError> {
        let row: Option<(String, i64)> =
            sqlx::query_as("select spec, epoch from nodes where node_id = $1 and state = 0")
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
        row.map(|(spec, epoch)| {
            let spec: NodeSpec = serde_json::from_str(&spec)
                .map_err(|e| StoreError::Unavailable(format!("stored node cannot be read: {e}")))?;
            Ok((spec, epoch.max(0) as u64))
        })
        .transpose()
    }
}
