//! The config generations: each config a replica put in force whose live
//! part differs from the one before, numbered. Every replica applies the
//! latest (the engine's `reload` module); the number is what `/readyz`
//! and the metrics call the config's generation.

use chrono::{DateTime, Utc};

use super::leader::Change;
use super::rows::{from_micros, micros};
use super::{Store, StoreError};

/// A config put in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigGeneration {
    pub generation: i64,
    /// The SHA-256 of `live`.
    pub digest: String,
    /// The live sections, as JSON.
    pub live: String,
    pub loaded_at: DateTime<Utc>,
    /// The replica that loaded it.
    pub loaded_by: String,
    /// `start` or `reload`.
    pub how: String,
}

type Row = (i64, String, String, i64, String, String);

fn generation_of((generation, digest, live, at, by, how): Row) -> ConfigGeneration {
    ConfigGeneration {
        generation,
        digest,
        live,
        loaded_at: from_micros(at),
        loaded_by: by,
        how,
    }
}

const COLUMNS: &str = "generation, digest, live, loaded_at, loaded_by, how";

impl Store {
    /// The config in force: the latest generation, if any was published.
    pub async fn latest_config(&self) -> Result<Option<ConfigGeneration>, StoreError> {
        let row: Option<Row> = sqlx::query_as(&format!(
            "select {COLUMNS} from config_generations order by generation desc limit 1"
        ))
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(generation_of))
    }

    /// Puts a config in force: a new generation, announced to every
    /// replica, unless the latest has the same digest (then it answers
    /// that one, and `false`).
    pub async fn publish_config(
        &self,
        digest: &str,
        live: &str,
        at: DateTime<Utc>,
        by: &str,
        how: &str,
    ) -> Result<(ConfigGeneration, bool), StoreError> {
        let mut tx = self.begin_write().await?;
        let latest: Option<Row> = sqlx::query_as(&format!(
            "select {COLUMNS} from config_generations order by generation desc limit 1"
        ))
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(latest) = latest.map(generation_of) {
            if latest.digest == digest {
                return Ok((latest, false));
            }
        }
        let generation: i64 =
            sqlx::query_scalar("select coalesce(max(generation), 0) + 1 from config_generations")
                .fetch_one(&mut *tx)
                .await?;
        sqlx::query(&format!(
            "insert into config_generations ({COLUMNS}) values ($1, $2, $3, $4, $5, $6)"
        ))
        .bind(generation)
        .bind(digest)
        .bind(live)
        .bind(micros(at))
        .bind(by)
        .bind(how)
        .execute(&mut *tx)
        .await?;
        self.announce(&mut tx, &Change::Config { generation })
            .await?;
        self.commit(tx).await?;
        Ok((
            ConfigGeneration {
                generation,
                digest: digest.to_string(),
                live: live.to_string(),
                loaded_at: at,
                loaded_by: by.to_string(),
                how: how.to_string(),
            },
            true,
        ))
    }
}
