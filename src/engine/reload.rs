//! Live config (docs/operations.md#reloading-the-config).
//!
//! SIGHUP or `POST /v1/config:reload` reads the config again, from where
//! `flexq serve` read it at start ([`ConfigSource`]). The whole new config
//! is checked first: a bad one is refused naming its key, and the config in
//! force stays. Then it is put in force at once, under the core's lock: the
//! batch rules, the rate limits, the principals, and the core's layout —
//! pools, virtual nodes, quota rules, queue order and weights — changed in
//! place ([`crate::scheduler::Scheduler::reconfigure`]), so queued batches
//! keep their place and deadlines and running clusters run on. The
//! restart-only sections (`server`, `database`, `log`) keep their values
//! until the next start; the answer names what differs there.
//!
//! Every config a replica loads, at start or on a reload, is published in
//! the store as a numbered generation when its live part differs from the
//! latest ([`crate::store::Store::publish_config`]), and announced. Every
//! replica applies the latest generation's live sections over its own
//! restart-only ones, so all replicas run one config; one whose own file
//! differs from it says so (`/readyz`, `flexq_config_file_differs`, a
//! warning).

use std::path::PathBuf;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::Reason;
use super::{Engine, Error, Live, limits::RateLimits, passes};
use crate::config::{Config, ConfigError, KeyChange, QueueOrder};
use crate::store::{ConfigGeneration, Store, StoreError};

/// Where the config was read from, to read it again.
#[derive(Debug, Clone)]
pub enum ConfigSource {
    /// The embedded default, then `file`, then (with `env`) the `FLEXQ_*`
    /// variables: how `flexq serve` loads it.
    Layers { file: Option<PathBuf>, env: bool },
    /// Given whole by the caller (tests, benchmarks): there is nothing to
    /// read again.
    Given,
}

impl ConfigSource {
    /// Reads the config again, off the runtime's threads (files are read
    /// blocking). None when there is nothing to read.
    async fn load(&self) -> Option<Result<Config, ConfigError>> {
        let source = self.clone();
        tokio::task::spawn_blocking(move || source.load_now())
            .await
            .unwrap_or_else(|e| Some(Err(ConfigError::unreadable("the config file", e))))
    }

    fn load_now(&self) -> Option<Result<Config, ConfigError>> {
        match self {
            ConfigSource::Layers { file, env: true } => Some(Config::load(file.as_deref())),
            ConfigSource::Layers { file, env: false } => {
                Some(Config::load_without_env(file.as_deref()))
            }
            ConfigSource::Given => None,
        }
    }
}

/// How the config stands on this replica.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigStatus {
    /// The generation in force: every replica applies the latest.
    pub generation: i64,
    /// The SHA-256 of its live sections.
    pub digest: String,
    pub loaded_at: DateTime<Utc>,
    /// The replica that loaded it, and how (`start` or `reload`).
    pub loaded_by: String,
    pub how: String,
    /// The last reload tried on this replica.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_reload: Option<LastReload>,
    /// Why this replica's own file is not the config in force, when it
    /// is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_differs: Option<String>,
}

/// A reload tried on this replica, and how it ended.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LastReload {
    pub at: DateTime<Utc>,
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What a reload changed (with `validate_only`: would change).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reloaded {
    pub validate_only: bool,
    /// The generation in force after the reload (the same as before when
    /// nothing live changed).
    pub generation: i64,
    pub previous_generation: i64,
    /// Live keys, now in force.
    pub changes: Vec<KeyChange>,
    /// Restart-only keys whose new value waits for the next start.
    pub pending_restart: Vec<KeyChange>,
    /// Nodes the new layout retired (they take no new work), restored,
    /// added (virtual) or removed (virtual, holding nothing).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub retired_nodes: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub restored_nodes: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub added_nodes: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub removed_nodes: Vec<String>,
}

/// Reloads on this replica: one at a time, how the last went, and
/// whether this replica's own file is the config in force (which
/// generation is in force is [`Live::stored`]'s).
pub(crate) struct Reloads {
    source: ConfigSource,
    /// Held by the reload an operator asked for: a second one is refused.
    running: tokio::sync::Mutex<()>,
    /// Held by whatever puts a generation in force here, a reload or the
    /// adoption of another replica's: one at a time, and an adoption (in
    /// the background) waits rather than making an operator's reload
    /// look like a second one.
    applying: tokio::sync::Mutex<()>,
    state: std::sync::Mutex<ReloadState>,
}

#[derive(Default)]
struct ReloadState {
    last_reload: Option<LastReload>,
    file_differs: Option<String>,
}

impl Reloads {
    pub(crate) fn new(source: ConfigSource) -> Reloads {
        Reloads {
            source,
            running: tokio::sync::Mutex::new(()),
            applying: tokio::sync::Mutex::new(()),
            state: std::sync::Mutex::new(ReloadState::default()),
        }
    }

    fn update(&self, change: impl FnOnce(&mut ReloadState)) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        change(&mut state);
    }
}

/// Publishes the config this replica loaded at start: it is the one in
/// force from now on, for every replica. Answers its generation.
pub(crate) async fn publish(
    store: &Store,
    config: &Config,
    replica: &str,
) -> Result<ConfigGeneration, StoreError> {
    let live = config.live_value().to_string();
    let (generation, new) = store
        .publish_config(&config.digest(), &live, Utc::now(), replica, "start")
        .await?;
    if new {
        tracing::info!(
            generation = generation.generation,
            digest = %generation.digest,
            "config published as a new generation"
        );
    }
    crate::metrics::set_config_generation(generation.generation);
    Ok(generation)
}

impl Engine {
    /// How the config stands on this replica.
    pub fn config_status(&self) -> ConfigStatus {
        let stored = self.live().stored.clone();
        let state = self
            .shared
            .reloads
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        ConfigStatus {
            generation: stored.generation,
            digest: stored.digest,
            loaded_at: stored.loaded_at,
            loaded_by: stored.loaded_by,
            how: stored.how,
            last_reload: state.last_reload.clone(),
            file_differs: state.file_differs.clone(),
        }
    }

    /// Reads the config again and puts it in force (`validateOnly`
    /// `true`: says what would change, and changes nothing). `how` says who
    /// asked, for the logs (`SIGHUP`, or the admin's name).
    pub async fn reload_config(
        &self,
        validate_only: Option<&str>,
        how: &str,
    ) -> Result<Reloaded, Error> {
        let validate_only = super::batches::parse_validate_only(validate_only)?;
        let reloads = &self.shared.reloads;
        let Ok(_one) = reloads.running.try_lock() else {
            return Err(Error::new(
                Reason::ReloadRunning,
                "a config reload is already running on this replica; try again when it has ended",
            ));
        };
        let _applying = reloads.applying.lock().await;
        let Some(read) = reloads.source.load().await else {
            return Err(Error::new(
                Reason::NoConfigSource,
                "this server was given its config whole, not read from a file: there is nothing to read again",
            ));
        };
        let in_force = self.config();
        let next = read.and_then(|file| Ok((in_force.with_live(&file.live_value())?, file)));
        let (next, file) = match next {
            Ok(both) => both,
            Err(e) => return Err(self.reload_refused(&e, validate_only, how)),
        };
        let (changes, _) = in_force.changes(&next);
        let (_, pending_restart) = in_force.changes(&file);
        let previous = self.live().stored.generation;
        let mut answer = Reloaded {
            validate_only,
            generation: previous,
            previous_generation: previous,
            changes,
            pending_restart,
            retired_nodes: Vec::new(),
            restored_nodes: Vec::new(),
            added_nodes: Vec::new(),
            removed_nodes: Vec::new(),
        };
        if validate_only {
            return Ok(answer);
        }
        let generation = self.publish_reloaded(&next, how).await?;
        // This replica's file is the config in force now (if it was
        // already, no new generation was made and nothing else changed).
        let settled = self.apply_config(next, generation, None).await;
        answer.generation = self.live().stored.generation;
        answer.retired_nodes = ids(settled.retired);
        answer.restored_nodes = ids(settled.restored);
        answer.added_nodes = ids(settled.added);
        answer.removed_nodes = ids(settled.removed);
        crate::metrics::record_config_reload("ok");
        self.record_reload(None);
        tracing::info!(
            requested_by = how,
            generation = answer.generation,
            previous = answer.previous_generation,
            changed = ?answer.changes.iter().map(|c| c.key.as_str()).collect::<Vec<_>>(),
            pending_restart = ?answer.pending_restart.iter().map(|c| c.key.as_str()).collect::<Vec<_>>(),
            "config reloaded"
        );
        Ok(answer)
    }

    /// The error a reload answers for a config that is not valid; unless
    /// only validating, also logged, counted and recorded as the last
    /// reload.
    fn reload_refused(&self, e: &ConfigError, validate_only: bool, how: &str) -> Error {
        let message = format!(
            "the config was not reloaded, generation {} stays in force: {e}",
            self.live().stored.generation
        );
        if !validate_only {
            tracing::error!(requested_by = how, error = %e, "config reload refused");
            crate::metrics::record_config_reload("invalid");
            self.record_reload(Some(message.clone()));
        }
        let mut error = Error::new(Reason::ConfigInvalid, message);
        let keys = e.keys();
        if let Some(first) = keys.first() {
            error = error.with_meta("key", *first);
        }
        if keys.len() > 1 {
            error = error.with_meta("keys", keys.join(","));
        }
        error
    }

    /// Publishes a reloaded config in the store (a new generation when its
    /// live part differs from the latest). A failure is logged, counted and
    /// recorded as the last reload.
    async fn publish_reloaded(&self, next: &Config, how: &str) -> Result<ConfigGeneration, Error> {
        let published = self
            .shared
            .store
            .publish_config(
                &next.digest(),
                &next.live_value().to_string(),
                Utc::now(),
                self.replica_id(),
                "reload",
            )
            .await;
        match published {
            Ok((generation, _)) => Ok(generation),
            Err(e) => {
                tracing::error!(requested_by = how, error = %e, "config reload failed: cannot publish it");
                crate::metrics::record_config_reload("failed");
                self.record_reload(Some(format!("the config could not be stored: {e}")));
                Err(e.into())
            }
        }
    }

    fn record_reload(&self, error: Option<String>) {
        self.shared.reloads.update(|s| {
            s.last_reload = Some(LastReload {
                at: Utc::now(),
                ok: error.is_none(),
                error,
            })
        });
    }

    /// Puts `next` in force as `stored`'s generation, in place: the core's
    /// layout under its lock, then the rules, limits and principals at
    /// once; and says why this replica's own file differs from it, if it
    /// does (None: it is this replica's file). The core's layout is not
    /// changed again when a generation as new is already in force.
    async fn apply_config(
        &self,
        next: Config,
        stored: ConfigGeneration,
        file_differs: Option<String>,
    ) -> crate::scheduler::Settled {
        crate::metrics::set_config_file_differs(file_differs.is_some());
        self.shared
            .reloads
            .update(|s| s.file_differs = file_differs);
        let generation = stored.generation;
        let mut core = self.lock().await;
        let old = self.live();
        if generation <= old.stored.generation {
            return Default::default();
        }
        let settled = core.reconfigure(next.layout());
        crate::metrics::declare_provisioned_pools(&next);
        let reread = next.scheduling.order == QueueOrder::FairShare
            && (old.config.scheduling.order != QueueOrder::FairShare
                || old.config.scheduling.usage_half_life != next.scheduling.usage_half_life
                || old.config.scheduling.gpu_weights != next.scheduling.gpu_weights);
        if reread {
            // Past usage was recorded under the old half-life or GPU
            // weights (or not at all, in strict order): read it again.
            core.clear_past_usage();
            if let Err(e) = self
                .bounded(passes::read_past_usage(&mut core, &self.shared.store))
                .await
            {
                tracing::warn!(error = %e, "cannot read past usage again; the core will be rebuilt");
                self.shared
                    .stale
                    .store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let limits = if old.config.limits == next.limits {
            old.limits.clone()
        } else {
            Arc::new(RateLimits::new(&next.limits))
        };
        self.shared.live.store(Arc::new(Live {
            policy: next.policy(),
            limits,
            config: Arc::new(next),
            stored,
        }));
        drop(core);
        crate::metrics::set_config_generation(generation);
        for (what, nodes) in [
            ("retired", &settled.retired),
            ("restored", &settled.restored),
            ("added", &settled.added),
            ("removed", &settled.removed),
        ] {
            for node in nodes {
                tracing::info!(node = %node, generation, "node {what} by the config");
            }
        }
        self.wake();
        self.work_changed();
        settled
    }

    /// Another replica published a config generation (or this one missed
    /// announcements): apply the latest, over this replica's restart-only
    /// sections, and say whether this replica's own file differs from it.
    pub(crate) async fn adopt_config(&self) -> Result<(), StoreError> {
        // After a reload running here: it applies its own generation (and
        // answers what that changed) before this looks for a newer one.
        let _one = self.shared.reloads.applying.lock().await;
        let Some(latest) = self.shared.store.latest_config().await? else {
            return Ok(());
        };
        if latest.generation <= self.live().stored.generation {
            return Ok(());
        }
        let next = serde_json::from_str(&latest.live)
            .map_err(|e| ConfigError::unreadable("the stored config generation", e))
            .and_then(|live| self.config().with_live(&live));
        let next = match next {
            Ok(next) => next,
            Err(e) => {
                tracing::error!(generation = latest.generation, error = %e, "cannot apply the config generation another replica published; keeping this one's");
                self.shared.reloads.update(|s| {
                    s.file_differs = Some(format!(
                        "generation {} cannot be applied here: {e}",
                        latest.generation
                    ))
                });
                crate::metrics::set_config_file_differs(true);
                return Ok(());
            }
        };
        let differs = match self.shared.reloads.source.load().await {
            None => None,
            Some(Ok(file)) if file.digest() == latest.digest => None,
            Some(Ok(_)) => Some(format!(
                "this replica's config file differs from generation {}, loaded by {}: keep the files equal (flexq config diff shows how)",
                latest.generation, latest.loaded_by
            )),
            Some(Err(e)) => Some(format!("this replica's config file cannot be read: {e}")),
        };
        if let Some(why) = &differs {
            tracing::warn!(generation = latest.generation, "{why}");
        }
        let (generation, by) = (latest.generation, latest.loaded_by.clone());
        self.apply_config(next, latest, differs).await;
        tracing::info!(generation, by = %by, "config generation applied");
        Ok(())
    }
}

fn ids(nodes: Vec<crate::scheduler::NodeId>) -> Vec<String> {
    nodes.into_iter().map(|n| n.0).collect()
}
