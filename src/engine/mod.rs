//! The engine: every use case of flexq, once, for every front end.
//!
//! It owns the scheduler core ([`crate::scheduler`]) behind an async mutex
//! that nothing outside this module can take, the store, and the
//! replication role. Each use case — creating, reading, listing,
//! cancelling and deleting batches ([`batches`]); registering nodes,
//! heartbeats, polls and reports ([`nodes`]), the driver's output
//! ([`output`]); regions, node views, cordons and quotas ([`capacity`]); queues, their holds and pages
//! ([`queues`]); readiness and the metrics snapshot ([`health`]); the
//! config's reload and generations ([`reload`]); who may call
//! ([`principal`]) and how often ([`limits`]); the usage report
//! ([`usage`]) — validates, bounds its database calls made under the
//! core's lock ([`DB_UNDER_LOCK`]), takes the single, leader or follower
//! branch, logs and counts, and answers one error type ([`Error`]) that
//! the front ends (REST in `server`, gRPC in `grpc`) map to their wire.
//!
//! The scheduler loop ([`passes`]) sleeps until an event or the next
//! deadline, runs a pass, commits its decisions, and only then lets anyone
//! see them: the lock is held across pass *and* commit, so no reader sees
//! a decision that is not yet durable, nor half of one.
//!
//! On SQLite flexq is one process and always decides. On PostgreSQL every
//! replica keeps a core, but only the holder of the leader lease
//! ([`replica`]) runs passes; the others keep theirs as a mirror of the
//! database for their views.

mod batches;
mod capacity;
mod elastic;
mod election;
mod error;
mod gpus;
mod health;
mod limits;
mod long_poll;
mod nodes;
mod output;
mod paging;
mod passes;
mod present;
mod principal;
mod provisioner;
mod queues;
mod reload;
mod replica;
mod stream;
mod usage;

pub use batches::{CreateAnswer, CreateRequest, ListRequest};
pub use capacity::{NodeView, ProjectQuotas, QuotaChange};
pub use error::{Error, RETRY_AFTER_SECONDS, Reason};
pub use gpus::{TelemetryTaken, check_telemetry};
pub use health::Readiness;
pub use nodes::{NodeRegistration, parse_epoch, parse_epoch_str};
pub use output::OutputRead;
pub use principal::{Access, Principal, token_hash};
pub use queues::{QueueEntries, QueueEntry, QueueView};
pub use reload::{ConfigSource, ConfigStatus, Reloaded};
pub use stream::{Watch, WatchEvent, WatchRequest};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64};
use std::time::Instant;

use arc_swap::ArcSwap;
use tokio::sync::{Mutex, MutexGuard, Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::scheduler::{BatchKey, PendingBatch, Scheduler};
use crate::store::{Backend, Store, StoreError, StoreOptions};

/// The longest a database call made under the core's lock may take.
pub const DB_UNDER_LOCK: std::time::Duration = std::time::Duration::from_secs(10);

impl Engine {
    /// A database call made under the core's lock, bounded by
    /// [`DB_UNDER_LOCK`]: a connection can hang without an error (a
    /// half-open socket), and the lock must not be held for good. A dropped
    /// transaction is rolled back, but a commit may have gone out just
    /// before the timeout: the core is then marked stale, and rebuilt from
    /// the store before the next pass, rather than keep capacity that the
    /// database already released.
    pub(crate) async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(DB_UNDER_LOCK, call).await {
            Ok(answer) => answer,
            Err(_) => {
                tracing::error!(
                    "a database call under the scheduler's lock did not answer; the core will be rebuilt"
                );
                self.shared
                    .stale
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                self.wake();
                Err(StoreError::Unavailable(
                    "the database did not answer".into(),
                ))
            }
        }
    }
}

/// What this process does about scheduling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicaRole {
    /// The only process (SQLite): it always decides.
    Single,
    /// Holds the leader lease in `term`: it decides, fenced by the term.
    Leader { term: i64 },
    /// Another replica leads; this one serves the API.
    Follower,
}

impl ReplicaRole {
    pub fn name(&self) -> &'static str {
        match self {
            ReplicaRole::Single => "single",
            ReplicaRole::Leader { .. } => "leader",
            ReplicaRole::Follower => "follower",
        }
    }

    pub fn decides(&self) -> bool {
        !matches!(self, ReplicaRole::Follower)
    }

    /// The fencing term of its commits.
    fn fence(&self) -> Option<i64> {
        match self {
            ReplicaRole::Leader { term } => Some(*term),
            _ => None,
        }
    }
}

pub(crate) struct Shared {
    core: Mutex<Scheduler>,
    wake: Notify,
    /// Bumped whenever what some node must run may have changed (an
    /// allocation, a release, a cancel, a report): agents' long polls wait
    /// on it.
    changes: watch::Sender<u64>,
    /// Bumped when driver output is stored (readers of the output wait on
    /// it; agents' polls do not).
    output: watch::Sender<u64>,
    pub(crate) store: Store,
    /// The config in force, swapped whole by a reload ([`config`]).
    pub(crate) live: ArcSwap<Live>,
    /// Reloads of the config: one at a time, and how the last went.
    pub(crate) reloads: reload::Reloads,
    /// Taken under the core's lock, given up without it.
    role: watch::Sender<ReplicaRole>,
    /// This replica's name in the leader lease.
    pub(crate) replica_id: String,
    /// Asks a follower's core to be rebuilt from the database.
    pub(crate) mirror: Notify,
    /// The core holds decisions the database does not: rebuild it before
    /// the next pass.
    pub(crate) stale: AtomicBool,
    /// The term the leader election loop holds (0: none). A rebuild for a
    /// term that is no longer held does not make this replica lead.
    pub(crate) held_term: AtomicI64,
    /// The term whose takeover (the rebuild under the core's lock) has
    /// not ended yet (0: none): readiness says leader through it.
    pub(crate) taking_term: AtomicI64,
    /// Fired when the server shuts down: long waits answer at once.
    pub(crate) shutdown: CancellationToken,
    /// Fired when this replica no longer takes part in leader election
    /// (at once on SQLite): after shutdown, its lease is given up.
    pub(crate) election_done: CancellationToken,
    /// Event-stream watchers served now, and what the event log's tail
    /// read last, which they wait on ([`stream`]).
    watchers: std::sync::atomic::AtomicUsize,
    /// Long polls waiting now, by kind (`flexq_long_polls`).
    long_polls: long_poll::LongPolls,
    event_moves: watch::Sender<std::sync::Arc<stream::Moved>>,
    /// The provisioners' programs this replica started.
    runs: provisioner::Runs,
}

/// The config in force and what is derived from it, swapped whole: a use
/// case loads it once and sees one config throughout.
pub(crate) struct Live {
    pub config: Arc<Config>,
    /// What the batch rules read of the config, converted once.
    pub policy: crate::spec::Policy,
    /// Per-project API rate limits (kept across a reload that leaves
    /// `[limits]` as it was).
    pub limits: Arc<limits::RateLimits>,
    /// The config's generation (a number every replica shares), and who
    /// loaded it when.
    pub stored: crate::store::ConfigGeneration,
}

/// A handle on the running scheduler; cheap to clone.
#[derive(Clone)]
pub struct Engine {
    pub(crate) shared: Arc<Shared>,
}

impl Engine {
    /// Opens the store of `config` (running migrations), and starts the
    /// engine, which stops when `shutdown` fires.
    pub async fn open(
        config: Config,
        source: ConfigSource,
        shutdown: CancellationToken,
    ) -> Result<Engine, StoreError> {
        crate::metrics::init(&config);
        let store = Store::open(&StoreOptions {
            url: config.database_url(),
            max_connections: config.database.max_connections,
            group_commit_max: config.database.group_commit_max,
            limits: crate::store::SessionLimits {
                lease: config.database.leader_lease,
                renew: config.database.leader_renew,
            },
            observe_group: Some(Arc::new(|took, n| {
                crate::metrics::record_commit("create", took, n)
            })),
        })
        .await?;
        // Read back, not trusted: a URL's options or a server's settings
        // may have turned off what makes a commit durable.
        let durability = store.durability().await?;
        let settings = durability
            .settings
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join(" ");
        if durability.is_durable() {
            tracing::info!(%settings, "store commits are durable");
        } else {
            tracing::warn!(%settings, weaknesses = ?durability.weaknesses, "store commits may be lost on a power loss or an OS crash");
        }
        Engine::start(Arc::new(config), source, store, shutdown).await
    }

    /// The config in force (a reload may replace it: hold on to this one
    /// for one consistent view).
    pub fn config(&self) -> Arc<Config> {
        self.shared.live.load().config.clone()
    }

    /// The config in force and what is derived from it.
    pub(crate) fn live(&self) -> Arc<Live> {
        self.shared.live.load_full()
    }

    /// The store, for tools and benchmarks that read it directly (front
    /// ends call use cases instead).
    pub fn store(&self) -> &Store {
        &self.shared.store
    }

    /// The batches holding a cluster now, oldest first.
    pub async fn running_keys(&self) -> Vec<BatchKey> {
        self.lock().await.running_keys()
    }

    /// Benchmarks only (feature `bench-hooks`): adds nodes to the core as
    /// if their agents had registered, without the store (how `cargo bench
    /// --features bench-hooks --bench flexq-bench -- schedule` measures a
    /// flood of capacity under a deep queue), and wakes the loop.
    #[cfg(feature = "bench-hooks")]
    pub async fn add_nodes_for_bench(
        &self,
        nodes: Vec<crate::scheduler::NodeSpec>,
        expires: chrono::DateTime<chrono::Utc>,
    ) {
        let mut core = self.lock().await;
        for node in nodes {
            core.register_node(node, 1, expires);
        }
        drop(core);
        self.wake();
    }

    /// Closes the store (after the front ends drained).
    pub async fn close(&self) {
        self.shared.store.close().await;
    }

    /// Rebuilds the scheduler from the config and the store, and starts
    /// its loop. Deadlines keep counting from the original queue times:
    /// batches whose deadline passed while flexq was down are failed by
    /// the first pass, before any admission.
    pub async fn start(
        config: Arc<Config>,
        source: ConfigSource,
        store: Store,
        shutdown: CancellationToken,
    ) -> Result<Engine, StoreError> {
        let replicated = store.backend() == Backend::Postgres;
        let role = if replicated {
            ReplicaRole::Follower
        } else {
            ReplicaRole::Single
        };
        let replica_id = config
            .database
            .replica_id
            .clone()
            .unwrap_or_else(replica::default_replica_id);
        // The config this replica loaded is the one in force for every
        // replica from now on (`reload::publish`).
        let stored = reload::publish(&store, &config, &replica_id).await?;
        let started = Instant::now();
        let core = passes::rebuild(&config, &store, role.decides().then_some(None), None).await?;
        tracing::info!(
            pending = core.pending_count(),
            allocated = core.running_keys().len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "scheduler state rebuilt from the store"
        );
        crate::metrics::set_role(&replica_id, role.name(), 0);
        let live = Live {
            limits: Arc::new(limits::RateLimits::new(&config.limits)),
            policy: config.policy(),
            config,
            stored,
        };
        let engine = Engine {
            shared: Arc::new(Shared {
                core: Mutex::new(core),
                wake: Notify::new(),
                changes: watch::channel(0).0,
                output: watch::channel(0).0,
                store,
                live: ArcSwap::from_pointee(live),
                reloads: reload::Reloads::new(source),
                role: watch::channel(role).0,
                replica_id,
                mirror: Notify::new(),
                election_done: CancellationToken::new(),
                stale: AtomicBool::new(false),
                held_term: AtomicI64::new(0),
                taking_term: AtomicI64::new(0),
                shutdown: shutdown.clone(),
                watchers: std::sync::atomic::AtomicUsize::new(0),
                long_polls: long_poll::LongPolls::default(),
                event_moves: watch::channel(std::sync::Arc::default()).0,
                runs: provisioner::Runs::default(),
            }),
        };
        engine.event_tail();
        if replicated {
            replica::start(engine.clone(), shutdown.clone());
        } else {
            engine.shared.election_done.cancel();
        }
        let idle = engine.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(std::time::Duration::from_secs(60));
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = every.tick() => idle.live().limits.shrink(),
                }
            }
        });
        let runner = engine.clone();
        tokio::spawn(async move { runner.run(shutdown).await });
        engine.wake();
        Ok(engine)
    }

    /// Waits until, after shutdown, this replica has left leader election
    /// (having given its lease up if it led).
    pub async fn election_done(&self) {
        self.shared.election_done.cancelled().await;
    }

    /// What this process does about scheduling now.
    pub fn role(&self) -> ReplicaRole {
        self.shared.role.borrow().clone()
    }

    pub fn replica_id(&self) -> &str {
        &self.shared.replica_id
    }

    /// Whether the database is shared by several replicas (PostgreSQL):
    /// changes then reach every core through the database's
    /// announcements, not through calls in this process.
    pub fn replicated(&self) -> bool {
        self.shared.store.backend() == Backend::Postgres
    }

    /// Changes the role. Taking the lead happens under the core's lock
    /// (see [`super::replica`]); stepping down need not.
    pub(crate) fn set_role(&self, role: ReplicaRole) {
        let term = role.fence().unwrap_or(0);
        crate::metrics::set_role(&self.shared.replica_id, role.name(), term);
        self.shared.role.send_replace(role);
        self.wake();
    }

    /// Asks a follower's core to be rebuilt from the database soon.
    pub(crate) fn refresh_mirror(&self) {
        self.shared.mirror.notify_one();
    }

    /// Asks for a pass soon. Wake-ups coalesce: many events, one pass.
    pub fn wake(&self) {
        crate::metrics::record_wake();
        self.shared.wake.notify_one();
    }

    /// Says that some node's work may have changed.
    pub fn work_changed(&self) {
        self.shared.changes.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Waits on [`Self::work_changed`].
    pub fn watch_work(&self) -> watch::Receiver<u64> {
        self.shared.changes.subscribe()
    }

    /// Says that some batch's driver output grew.
    pub fn output_written(&self) {
        self.shared.output.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Waits on [`Self::output_written`].
    pub fn watch_output(&self) -> watch::Receiver<u64> {
        self.shared.output.subscribe()
    }

    /// Locks the core. Private to the engine: front ends call use cases.
    async fn lock(&self) -> MutexGuard<'_, Scheduler> {
        self.shared.core.lock().await
    }

    /// A batch was stored: queue it and wake the loop. With several
    /// replicas the create's announcement queues it in the leader.
    pub async fn submitted(&self, batch: PendingBatch) {
        if !self.replicated() {
            self.lock().await.submit(batch);
        }
        self.wake();
    }

    /// A batch left the queue or gave back its cluster at `at` (the time
    /// the store wrote it; its GPU-seconds counted up to it:
    /// [`Self::count_released`]).
    pub async fn forget(&self, key: BatchKey, at: chrono::DateTime<chrono::Utc>) {
        let released = self.lock().await.forget(key, at);
        self.count_released(released.as_ref(), at);
        self.wake();
    }

    /// Counts a cluster given back on the replica that schedules — the
    /// only process on SQLite, the leader with replicas — whose core sees
    /// every release once, its own decisions' and those it hears from other
    /// replicas; followers count nothing, so the sum over replicas counts
    /// each cluster once. (A pass runs only there: its lost clusters are
    /// counted with [`record_release`].)
    pub(crate) fn count_released(
        &self,
        released: Option<&crate::scheduler::Allocation>,
        at: chrono::DateTime<chrono::Utc>,
    ) {
        if let (true, Some(a)) = (self.role().decides(), released) {
            record_release(a, at);
        }
    }
}

/// The GPU-seconds of a cluster given back at `at` (the release's time,
/// as the store wrote it: the batch's own usage says the same)
/// (`flexq_project_gpu_seconds_total`).
pub(crate) fn record_release(a: &crate::scheduler::Allocation, at: chrono::DateTime<chrono::Utc>) {
    crate::metrics::record_gpu_seconds(&a.project, &a.region, a.accelerator, a.gpu_seconds(at));
}
