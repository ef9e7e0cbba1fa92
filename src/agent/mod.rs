//! `flexq agent`: the executor agent on each GPU node.
//!
//! It finds the node's GPUs, registers the node (region, zone, pool, shape)
//! and keeps its lease by heartbeat. It long-polls the server for its
//! assignments — the parts of allocated batches this node holds — and
//! turns each into Spark processes ([`work`], [`driver`], [`executor`]): a per-batch standalone
//! Spark cluster whose master and driver run on the driver's node and
//! whose workers each see exactly the GPUs allocated to them. When the
//! lease is lost the agent stops everything (the server failed those
//! batches already) and registers again with a new epoch.

mod client;
pub mod discovery;
mod driver;
mod elastic;
mod executor;
pub mod gpus;
mod kubernetes;
mod output;
mod process;
pub(crate) mod settings;
mod work;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use settings::{AgentSettings, GpuTelemetrySource, Launcher};

use crate::protocol::{Action, Assignment, RegisterNode, ReportEvent};
use client::{AgentClient, CallError};
use work::Ctx;

/// A part of a batch this agent runs.
struct Part {
    assignment: watch::Sender<Assignment>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
    /// Cancelled once the part's task is over (its processes are gone).
    done: CancellationToken,
}

/// A part being torn down: its GPUs are not free until `done`.
struct Stopping {
    gpus: Vec<String>,
    done: CancellationToken,
    task: JoinHandle<()>,
}

type PartKey = (String, String, u32, u32);

/// Finds Spark: the configured home, $SPARK_HOME, or the pyspark package of
/// the configured Python.
async fn spark_home(config: &AgentSettings) -> anyhow::Result<PathBuf> {
    let home = if !config.spark_home.is_empty() {
        PathBuf::from(&config.spark_home)
    } else if let Some(h) = std::env::var_os("SPARK_HOME") {
        PathBuf::from(h)
    } else {
        let out = tokio::process::Command::new(&config.python)
            .args([
                "-c",
                "import os, pyspark; print(os.path.dirname(pyspark.__file__))",
            ])
            .output()
            .await
            .map_err(|e| anyhow::anyhow!("cannot run {}: {e}", config.python))?;
        if !out.status.success() {
            anyhow::bail!(
                "no Spark found: spark_home is not set, SPARK_HOME is not set, and {} has no pyspark package (pip install pyspark)",
                config.python
            );
        }
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    };
    if !home.join("bin/spark-class").is_file() {
        anyhow::bail!(
            "{} is not a Spark installation (no bin/spark-class)",
            home.display()
        );
    }
    Ok(home)
}

fn parse_seconds(text: &str) -> Option<Duration> {
    text.strip_suffix('s')?
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0 && *s < 86400.0)
        .map(Duration::from_secs_f64)
}

/// Runs the agent until `shutdown` fires.
pub async fn run(config: AgentSettings, shutdown: CancellationToken) -> anyhow::Result<()> {
    // Spark runs on this node only with the standalone launcher.
    let spark_home = match config.launcher {
        Launcher::Standalone => spark_home(&config).await?,
        Launcher::Kubernetes => PathBuf::new(),
    };
    let gpus = discovery::discover(&config.nvidia_smi, &config.gpu_discovery_script)
        .await
        .map_err(|e| {
            anyhow::anyhow!("the node's GPUs cannot be seen, so it is not offered: {e}")
        })?;
    std::fs::create_dir_all(&config.work_dir)?;
    let leftovers = process::stop_leftovers(&config.work_dir);
    tracing::info!(node = %config.node_id, gpus = ?gpus, spark_home = %spark_home.display(), leftovers, "agent starting");
    let token = if config.token_file.as_os_str().is_empty() {
        None
    } else {
        let t = std::fs::read_to_string(&config.token_file)
            .map_err(|e| anyhow::anyhow!("token_file {}: {e}", config.token_file.display()))?;
        Some(t.trim().to_string())
    };
    let ca = if config.ca_file.as_os_str().is_empty() {
        None
    } else {
        let pem = std::fs::read(&config.ca_file)
            .map_err(|e| anyhow::anyhow!("ca_file {}: {e}", config.ca_file.display()))?;
        Some(
            reqwest::Certificate::from_pem(&pem)
                .map_err(|e| anyhow::anyhow!("ca_file {}: {e}", config.ca_file.display()))?,
        )
    };
    let client = AgentClient::new(&config.server, &config.node_id, token, ca);
    // GPU telemetry: read once here which reader this node has (none is
    // said once and changes nothing else).
    let gpu_reader: Option<gpus::SharedReader> = gpus::open_reader(
        config.gpu_telemetry,
        &config.nvidia_smi,
        &config.nvml_library,
    )
    .map(|r| Arc::new(std::sync::Mutex::new(r)));
    let request = RegisterNode {
        node_id: config.node_id.clone(),
        region: config.region.clone(),
        zone: config.zone.clone(),
        pool: config.pool.clone(),
        gpu_addresses: gpus,
        cores: config.cores,
        memory_mb: config.memory_mb,
        local_ssd_gb: config.local_ssd_gb,
        // What this agent runs survives only with this agent: leftovers of
        // an earlier one were stopped above.
        running: Vec::new(),
    };
    while !shutdown.is_cancelled() {
        let Some(lease) = register(&client, &request, &shutdown).await? else {
            break;
        };
        tracing::info!(node = %config.node_id, epoch = %lease.epoch, "registered");
        let interval = parse_seconds(&lease.heartbeat_interval).unwrap_or(Duration::from_secs(5));
        let ctx = Arc::new(Ctx {
            config: config.clone(),
            client: client.clone(),
            epoch: lease.epoch,
            spark_home: spark_home.clone(),
        });
        let session = shutdown.child_token();
        let heartbeat = tokio::spawn(heartbeat(ctx.clone(), interval, session.clone()));
        let (held_tx, held) = watch::channel(gpus::Held::new());
        // Points go up about as often as heartbeats.
        let every = config.gpu_sample_interval;
        let upload_every = (interval.as_secs_f64() / every.as_secs_f64())
            .round()
            .max(1.0) as u32;
        let sampler = gpu_reader.clone().map(|reader| {
            tokio::spawn(gpus::sample(
                ctx.clone(),
                reader,
                held,
                every,
                upload_every,
                session.clone(),
            ))
        });
        serve_session(&ctx, &session, &held_tx).await;
        heartbeat.abort();
        if let Some(s) = sampler {
            s.abort();
        }
        if !shutdown.is_cancelled() {
            tracing::warn!(node = %config.node_id, "lease lost: the node's work was stopped; registering again");
        }
    }
    tracing::info!("agent stopped");
    Ok(())
}

/// Registers, retrying while the server is unreachable. None: shutdown.
async fn register(
    client: &AgentClient,
    request: &RegisterNode,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<crate::protocol::Lease>> {
    let mut delay = Duration::from_millis(200);
    loop {
        match client.register(request).await {
            Ok(lease) => return Ok(Some(lease)),
            Err(CallError::Refused(e)) => anyhow::bail!("registration refused: {e}"),
            Err(e) => tracing::warn!(error = %e, "cannot register yet; retrying"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(10));
    }
}

/// Heartbeats every `interval`, and then as each answer says: an operator
/// may change the lease by a config reload.
async fn heartbeat(ctx: Arc<Ctx>, mut interval: Duration, session: CancellationToken) {
    let mut wait = interval;
    loop {
        tokio::select! {
            _ = session.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        match ctx.client.heartbeat(&ctx.epoch).await {
            Ok(lease) => {
                if let Some(every) = parse_seconds(&lease.heartbeat_interval) {
                    if every != interval {
                        tracing::info!(
                            every_s = every.as_secs(),
                            "the server changed the heartbeat interval"
                        );
                        interval = every;
                    }
                }
                wait = interval;
            }
            Err(CallError::LeaseLost(e)) => {
                tracing::warn!(error = %e, "heartbeat refused");
                session.cancel();
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "heartbeat failed; trying again sooner");
                wait = interval / 3;
            }
        }
    }
}

/// Polls for assignments and keeps the running parts in step with them
/// until the session ends; then stops every part.
async fn serve_session(
    ctx: &Arc<Ctx>,
    session: &CancellationToken,
    held: &watch::Sender<gpus::Held>,
) {
    let mut parts: HashMap<PartKey, Part> = HashMap::new();
    let mut stopping: Vec<Stopping> = Vec::new();
    let mut version = String::new();
    let mut backoff = Duration::from_millis(200);
    loop {
        let polled = tokio::select! {
            _ = session.cancelled() => break,
            r = ctx.client.poll(&ctx.epoch, &version, ctx.config.poll_wait) => r,
        };
        match polled {
            Ok(answer) => {
                backoff = Duration::from_millis(200);
                version = answer.version;
                reconcile(ctx, session, &mut parts, &mut stopping, answer.assignments);
                // What the GPU sampler reads for: each batch's GPUs here.
                let mut now_held = gpus::Held::new();
                for p in parts.values() {
                    let a = p.assignment.borrow();
                    now_held
                        .entry(a.uuid.clone())
                        .or_default()
                        .extend(a.gpus.iter().cloned());
                }
                held.send_replace(now_held);
            }
            Err(CallError::LeaseLost(e)) => {
                tracing::warn!(error = %e, "poll refused");
                session.cancel();
                break;
            }
            Err(e) => {
                tracing::warn!(error = %e, "poll failed; retrying");
                tokio::select! {
                    _ = session.cancelled() => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }
    // The session is over (lease lost or shutdown): every part's token is a
    // child of the session's, so each is stopping; wait for them.
    let running: Vec<(String, String)> = parts
        .values()
        .map(|p| {
            let a = p.assignment.borrow();
            (a.uuid.clone(), a.batch.clone())
        })
        .collect();
    for part in parts.into_values() {
        let _ = part.task.await;
    }
    for s in stopping {
        let _ = s.task.await;
    }
    // On a shutdown (not a lost lease) the node is still ours: say at once
    // that its work stopped rather than leave it to the lease.
    for (uuid, batch) in running {
        let message = format!(
            "The agent of node {} was stopped while the batch ran; its Spark processes were stopped.",
            ctx.config.node_id
        );
        match ctx
            .client
            .report(
                &ctx.epoch,
                &uuid,
                ReportEvent::PartFailed {
                    message,
                    infrastructure: true,
                },
            )
            .await
        {
            Ok(()) => tracing::warn!(%batch, "batch failed: the agent stopped"),
            Err(e) => tracing::debug!(%batch, error = %e, "not reported"),
        }
    }
}

/// Brings the running parts in step with the polled assignments: tears
/// down the parts no longer assigned, updates the ones still assigned,
/// reports the stops of parts that do not run here and starts the new ones.
fn reconcile(
    ctx: &Arc<Ctx>,
    session: &CancellationToken,
    parts: &mut HashMap<PartKey, Part>,
    stopping: &mut Vec<Stopping>,
    assignments: Vec<Assignment>,
) {
    let wanted: std::collections::HashSet<PartKey> =
        assignments.iter().map(Assignment::key).collect();
    tear_down_gone(parts, stopping, &wanted);
    stopping.retain(|s| !s.task.is_finished());
    for a in assignments {
        let key = a.key();
        if let Some(part) = parts.get(&key) {
            part.assignment.send_if_modified(|current| {
                if *current != a {
                    *current = a.clone();
                    true
                } else {
                    false
                }
            });
            continue;
        }
        if a.action == Action::Stop {
            report_stopped(ctx, &a);
            continue;
        }
        let part = start_part(ctx, session, stopping, a);
        parts.insert(key, part);
    }
}

/// Parts whose batch ended or was released: tear them down, keeping each
/// in `stopping` until its processes are gone.
fn tear_down_gone(
    parts: &mut HashMap<PartKey, Part>,
    stopping: &mut Vec<Stopping>,
    wanted: &std::collections::HashSet<PartKey>,
) {
    let gone: Vec<PartKey> = parts
        .keys()
        .filter(|k| !wanted.contains(*k))
        .cloned()
        .collect();
    for key in gone {
        if let Some(part) = parts.remove(&key) {
            tracing::info!(batch_uuid = %key.0, role = %key.1, index = key.2, attempt = key.3, "assignment gone; tearing the part down");
            part.cancel.cancel();
            stopping.push(Stopping {
                gpus: part.assignment.borrow().gpus.clone(),
                done: part.done,
                task: part.task,
            });
        }
    }
}

/// A part being cancelled of which nothing runs here (this agent
/// restarted): its driver's part says it stopped.
fn report_stopped(ctx: &Arc<Ctx>, a: &Assignment) {
    if a.is_driver() {
        let (ctx, uuid) = (ctx.clone(), a.uuid.clone());
        tokio::spawn(async move {
            let event = ReportEvent::Finished {
                succeeded: false,
                message: "Stopped on cancellation.".into(),
                exit_code: None,
            };
            let _ = ctx.client.report(&ctx.epoch, &uuid, event).await;
        });
    }
}

/// Starts the part of a new assignment on a task of its own, once the
/// parts still stopping that held any of its GPUs are gone.
fn start_part(
    ctx: &Arc<Ctx>,
    session: &CancellationToken,
    stopping: &[Stopping],
    a: Assignment,
) -> Part {
    tracing::info!(batch = %a.batch, batch_uuid = %a.uuid, role = %a.role, index = a.index, attempt = a.attempt, gpus = ?a.gpus, "assignment received");
    let (tx, rx) = watch::channel(a.clone());
    let cancel = session.child_token();
    // GPUs handed over from a part still stopping (its batch just
    // ended) are used only once its processes are gone.
    let handover: Vec<CancellationToken> = stopping
        .iter()
        .filter(|s| s.gpus.iter().any(|g| a.gpus.contains(g)))
        .map(|s| s.done.clone())
        .collect();
    let done = CancellationToken::new();
    let finished = done.clone().drop_guard();
    let run = part_work(ctx, a.is_driver(), rx, &cancel);
    let waiting = cancel.clone();
    let task = tokio::spawn(async move {
        let _finished = finished;
        for h in handover {
            tokio::select! {
                _ = h.cancelled() => {}
                _ = waiting.cancelled() => return,
            }
        }
        run.await;
    });
    Part {
        assignment: tx,
        cancel,
        task,
        done,
    }
}

/// What a part runs, by launcher and role, until `cancel`.
fn part_work(
    ctx: &Arc<Ctx>,
    is_driver: bool,
    rx: watch::Receiver<Assignment>,
    cancel: &CancellationToken,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    match (ctx.config.launcher, is_driver) {
        (Launcher::Standalone, true) => {
            Box::pin(driver::run_driver(ctx.clone(), rx, cancel.clone()))
        }
        (Launcher::Standalone, false) => {
            Box::pin(executor::run_executor(ctx.clone(), rx, cancel.clone()))
        }
        (Launcher::Kubernetes, true) => {
            Box::pin(kubernetes::run_driver(ctx.clone(), rx, cancel.clone()))
        }
        // The operator's executor pods run here, pinned by affinity;
        // the agent holds the part until the batch ends.
        (Launcher::Kubernetes, false) => {
            let cancel = cancel.clone();
            Box::pin(async move { cancel.cancelled().await })
        }
    }
}
