//! One part of one batch on this node: the driver's part runs the batch's
//! Spark master and `spark-submit`; an executor's part runs a Spark worker
//! limited to the allocated cores, memory and GPUs. Each part reports what
//! happened and tears its processes down, also after failures.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::client::{AgentClient, CallError};
use super::process::Group;
use super::settings::AgentSettings;
use crate::launch::{self, Rapids, SparkJob};
use crate::protocol::{Action, Assignment, ReportEvent};

/// What every part of this agent's session shares.
pub struct Ctx {
    pub config: AgentSettings,
    pub client: AgentClient,
    /// The epoch of this registration: every report carries it.
    pub epoch: String,
    pub spark_home: PathBuf,
}

/// Output kept in memory for the failure summary.
const TAIL_BYTES: usize = 64 * 1024;

/// A Spark daemon of batch `uuid`. Every process of a batch carries
/// FLEXQ_BATCH_UUID in its environment (operators can find them by it).
fn spark_class(ctx: &Ctx, uuid: &str, class: &str, args: &[String]) -> Command {
    let mut cmd = Command::new(ctx.spark_home.join("bin/spark-class"));
    cmd.arg(class).args(args);
    cmd.env("FLEXQ_BATCH_UUID", uuid)
        .env("SPARK_HOME", &ctx.spark_home)
        .env("SPARK_LOCAL_IP", &ctx.config.advertise_host)
        .env("PYSPARK_PYTHON", &ctx.config.python)
        .env("PYTHONUNBUFFERED", "1");
    cmd
}

/// Removes a part's directory, and the batch's once no part is left.
fn remove_part_dir(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
    if let Some(batch_dir) = dir.parent() {
        let _ = std::fs::remove_dir(batch_dir);
    }
}

fn log_file(path: &Path) -> std::io::Result<(Stdio, Stdio)> {
    let f = std::fs::File::create(path)?;
    Ok((Stdio::from(f.try_clone()?), Stdio::from(f)))
}

fn tail_of(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    let start = bytes.len().saturating_sub(TAIL_BYTES);
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}

fn write_script(path: &Path, gpus: &[String]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, launch::discovery_script(gpus))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
}

/// How a driver part ended.
enum End {
    Exited(std::process::ExitStatus),
    TtlPassed(u64),
    Cancelled,
    /// The assignment went away or the agent is stopping: no report.
    Gone,
}

/// Runs the driver's part of a batch and reports how it ended.
pub async fn run_driver(
    ctx: Arc<Ctx>,
    mut rx: watch::Receiver<Assignment>,
    cancel: CancellationToken,
) {
    let a = rx.borrow().clone();
    let dir = ctx.config.work_dir.join(&a.uuid).join("driver");
    let outcome = match &a.job {
        Some(job) => drive(&ctx, &a, job, &dir, &mut rx, &cancel).await,
        None => Err("the driver's assignment carries no job".to_string()),
    };
    let (event, master) = match outcome {
        Ok(Some((event, master))) => (Some(event), Some(master)),
        Ok(None) => (None, None),
        Err(message) => (
            Some(ReportEvent::PartFailed {
                message: format!(
                    "The driver could not start on node {}: {message}",
                    ctx.config.node_id
                ),
                // Its Spark master or driver process never started: the
                // node's failure, not the batch's code.
                infrastructure: true,
            }),
            None,
        ),
    };
    if let Some(event) = event {
        if let Err(e) = ctx
            .client
            .report_surely(&ctx.epoch, &a.uuid, event, &cancel)
            .await
        {
            tracing::warn!(batch = %a.batch, error = %e, "the batch's end could not be reported");
        }
    }
    // The master goes after the end is reported: its workers, which would
    // notice it leave, are stopped by their agents once the batch ended.
    if let Some(master) = master {
        master.stop(ctx.config.stop_grace).await;
    }
    remove_part_dir(&dir);
}

/// Starts the batch's Spark master; answers its URL once it listens.
async fn start_master(
    ctx: &Ctx,
    uuid: &str,
    dir: &Path,
    cancel: &CancellationToken,
) -> Result<Option<(Group, String)>, String> {
    let mut cmd = spark_class(
        ctx,
        uuid,
        "org.apache.spark.deploy.master.Master",
        &[
            "--host".into(),
            ctx.config.advertise_host.clone(),
            "--port".into(),
            "0".into(),
            "--webui-port".into(),
            "0".into(),
        ],
    );
    let log = dir.join("master.log");
    let file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    cmd.stdout(Stdio::from(file)).stderr(Stdio::piped());
    let mut master = Group::spawn("spark master", cmd, &ctx.config.work_dir)
        .map_err(|e| format!("cannot start the Spark master: {e}"))?;
    tracing::info!(batch_uuid = uuid, "spark master spawned");
    let stderr = master
        .child()
        .stderr
        .take()
        .ok_or("the master's stderr is not piped")?;
    let (url_tx, url_rx) = oneshot::channel();
    let log_path = dir.join("master.err.log");
    tokio::spawn(async move {
        let mut url_tx = Some(url_tx);
        let mut reader = BufReader::new(stderr);
        let mut file = tokio::fs::File::create(&log_path).await.ok();
        let mut raw = Vec::new();
        // Bytes, not UTF-8 lines: a stray byte must not end the reading.
        while matches!(reader.read_until(b'\n', &mut raw).await, Ok(n) if n > 0) {
            if let Some(f) = file.as_mut() {
                let _ = f.write_all(&raw).await;
            }
            let line = String::from_utf8_lossy(&raw).into_owned();
            raw.clear();
            if let Some(i) = line.find("Starting Spark master at spark://") {
                let url = line[i + "Starting Spark master at ".len()..]
                    .trim()
                    .to_string();
                if let Some(tx) = url_tx.take() {
                    let _ = tx.send(url);
                }
            }
        }
    });
    tokio::select! {
        url = url_rx => match url {
            Ok(url) => Ok(Some((master, url))),
            Err(_) => {
                // Its stderr closed without the URL: it is exiting, or
                // something is wrong with it; either way it goes.
                let status = master.stop(ctx.config.stop_grace).await;
                Err(format!(
                    "the Spark master exited ({}) before listening: {}",
                    status.map(|s| s.to_string()).unwrap_or_else(|| "stopped".into()),
                    launch::failure_summary(&tail_of(&dir.join("master.err.log")))
                ))
            }
        },
        _ = tokio::time::sleep(Duration::from_secs(120)) => {
            master.stop(ctx.config.stop_grace).await;
            Err("the Spark master did not listen within 120s".into())
        }
        _ = cancel.cancelled() => {
            master.stop(ctx.config.stop_grace).await;
            Ok(None)
        }
    }
}

async fn drive(
    ctx: &Ctx,
    a: &Assignment,
    job: &SparkJob,
    dir: &Path,
    rx: &mut watch::Receiver<Assignment>,
    cancel: &CancellationToken,
) -> Result<Option<(ReportEvent, Group)>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let Some((master, url)) = start_master(ctx, &a.uuid, dir, cancel).await? else {
        return Ok(None);
    };
    tracing::info!(batch = %a.batch, batch_uuid = %a.uuid, master = %url, "spark master started");
    let reported = ctx
        .client
        .report_surely(
            &ctx.epoch,
            &a.uuid,
            ReportEvent::MasterReady {
                master_url: url.clone(),
            },
            cancel,
        )
        .await;
    if let Err(e) = reported {
        tracing::warn!(batch = %a.batch, error = %e, "master not accepted; stopping");
        master.stop(ctx.config.stop_grace).await;
        return Ok(None);
    }

    let rapids = if ctx.config.rapids_jar.is_file() {
        Rapids::Jar(ctx.config.rapids_jar.display().to_string())
    } else {
        Rapids::Missing {
            reason: format!(
                "no RAPIDS jar at {} on node {}",
                ctx.config.rapids_jar.display(),
                ctx.config.node_id
            ),
        }
    };
    let mut conf = launch::spark_conf(job, &rapids);
    conf.entry("spark.driver.host".into())
        .or_insert_with(|| ctx.config.advertise_host.clone());
    if !a.gpus.is_empty() {
        let script = dir.join("driver-gpus.sh");
        write_script(&script, &a.gpus).map_err(|e| format!("{}: {e}", script.display()))?;
        conf.entry("spark.driver.resource.gpu.discoveryScript".into())
            .or_insert_with(|| script.display().to_string());
    }
    let jars: Vec<String> = match &rapids {
        Rapids::Jar(path) => vec![path.clone()],
        Rapids::Missing { .. } => vec![],
    };
    let args = launch::submit_args(job, &url, &conf, &jars);
    let mut cmd = Command::new(ctx.spark_home.join("bin/spark-submit"));
    cmd.args(&args)
        .current_dir(dir)
        .env("FLEXQ_BATCH_UUID", &a.uuid)
        .env("SPARK_HOME", &ctx.spark_home)
        .env("SPARK_LOCAL_IP", &ctx.config.advertise_host)
        .env("PYSPARK_PYTHON", &ctx.config.python)
        .env("PYSPARK_DRIVER_PYTHON", &ctx.config.python)
        .env("PYTHONUNBUFFERED", "1")
        .envs(launch::driver_env(job))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut driver = match Group::spawn("spark driver", cmd, &ctx.config.work_dir) {
        Ok(d) => d,
        Err(e) => {
            master.stop(ctx.config.stop_grace).await;
            return Err(format!("cannot run spark-submit: {e}"));
        }
    };
    tracing::info!(batch = %a.batch, batch_uuid = %a.uuid, rapids = %rapids.describe(), "driver started");
    let pump = {
        let stdout = driver.child().stdout.take();
        let stderr = driver.child().stderr.take();
        let (client, epoch, uuid) = (ctx.client.clone(), ctx.epoch.clone(), a.uuid.clone());
        let log = dir.join("driver.log");
        tokio::spawn(async move { pump_output(client, epoch, uuid, stdout, stderr, log).await })
    };
    if let Err(e) = ctx
        .client
        .report_surely(
            &ctx.epoch,
            &a.uuid,
            ReportEvent::DriverStarted {
                rapids: rapids.describe(),
            },
            cancel,
        )
        .await
    {
        tracing::warn!(batch = %a.batch, error = %e, "driver start not accepted; stopping");
        driver.stop(ctx.config.stop_grace).await;
        master.stop(ctx.config.stop_grace).await;
        pump.abort();
        return Ok(None);
    }

    let ttl = a.ttl_seconds;
    let ttl_sleep = async {
        match ttl {
            Some(s) => tokio::time::sleep(Duration::from_secs(s)).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(ttl_sleep);
    let end = loop {
        tokio::select! {
            status = driver.wait() => break match status {
                Ok(s) => End::Exited(s),
                Err(e) => return Err(format!("lost the driver process: {e}")),
            },
            _ = &mut ttl_sleep => break End::TtlPassed(ttl.unwrap_or_default()),
            changed = rx.changed() => {
                if changed.is_err() {
                    break End::Gone;
                }
                if rx.borrow().action == Action::Stop {
                    break End::Cancelled;
                }
            }
            _ = cancel.cancelled() => break End::Gone,
        }
    };
    let grace = ctx.config.stop_grace;
    let exit = match end {
        End::Exited(status) => {
            driver.reap();
            Some(status)
        }
        End::Gone => {
            driver.stop(grace).await;
            master.stop(grace).await;
            pump.abort();
            return Ok(None);
        }
        End::TtlPassed(_) | End::Cancelled => {
            driver.stop(grace).await;
            None
        }
    };
    // Everything the driver printed is uploaded before the end is reported.
    let tail = match tokio::time::timeout(Duration::from_secs(30), pump).await {
        Ok(Ok(tail)) => tail,
        // The upload is stuck (the server is slow or gone): the local log
        // still has the tail for the failure summary.
        _ => tail_of(&dir.join("driver.log")).into_bytes(),
    };
    let tail = String::from_utf8_lossy(&tail);
    let event = match (end, exit) {
        (End::Exited(_), Some(status)) if status.success() => ReportEvent::Finished {
            succeeded: true,
            message: "The driver finished successfully (exit status 0).".into(),
            exit_code: Some(0),
        },
        (End::Exited(_), Some(status)) => {
            let code = status.code();
            let how = match code {
                Some(c) => format!("exit status {c}"),
                None => status.to_string(),
            };
            ReportEvent::Finished {
                succeeded: false,
                message: format!(
                    "The driver failed ({how}): {}",
                    launch::failure_summary(&tail)
                ),
                exit_code: code,
            }
        }
        (End::TtlPassed(s), _) => ReportEvent::Finished {
            succeeded: false,
            message: format!(
                "The batch ran past its ttl of {s}s and was stopped; its cluster was released."
            ),
            exit_code: None,
        },
        _ => ReportEvent::Finished {
            succeeded: false,
            message: "Stopped on cancellation.".into(),
            exit_code: None,
        },
    };
    Ok(Some((event, master)))
}

async fn read_into<R: AsyncRead + Unpin>(mut r: R, tx: mpsc::Sender<Vec<u8>>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if tx.send(buf[..n].to_vec()).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Streams the driver's stdout and stderr to its log file and to the
/// server as they come; returns the tail (for the failure summary) once
/// both close.
async fn pump_output(
    client: AgentClient,
    epoch: String,
    uuid: String,
    stdout: Option<tokio::process::ChildStdout>,
    stderr: Option<tokio::process::ChildStderr>,
    log: PathBuf,
) -> Vec<u8> {
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(64);
    if let Some(out) = stdout {
        tokio::spawn(read_into(out, tx.clone()));
    }
    if let Some(err) = stderr {
        tokio::spawn(read_into(err, tx.clone()));
    }
    drop(tx);
    let mut file = tokio::fs::File::create(&log).await.ok();
    let mut tail: Vec<u8> = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut offset = 0u64;
    while let Some(first) = rx.recv().await {
        let mut chunk = first;
        while let Ok(more) = rx.try_recv() {
            chunk.extend_from_slice(&more);
        }
        if offset == 0 && pending.is_empty() {
            tracing::info!(batch_uuid = %uuid, "driver first output");
        }
        if let Some(f) = file.as_mut() {
            let _ = f.write_all(&chunk).await;
        }
        tail.extend_from_slice(&chunk);
        if tail.len() > 2 * TAIL_BYTES {
            tail.drain(..tail.len() - TAIL_BYTES);
        }
        pending.extend_from_slice(&chunk);
        send_output(&client, &epoch, &uuid, &mut offset, &mut pending, false).await;
    }
    for _ in 0..5 {
        if pending.is_empty() {
            break;
        }
        send_output(&client, &epoch, &uuid, &mut offset, &mut pending, true).await;
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    if let Some(f) = file.as_mut() {
        let _ = f.flush().await;
    }
    let start = tail.len().saturating_sub(TAIL_BYTES);
    tail.split_off(start)
}

/// Largest upload: well under the server's body limit.
const UPLOAD_BYTES: usize = 256 * 1024;

/// Uploads what of `pending` is complete UTF-8 (all of it when `last`), in
/// slices of at most [`UPLOAD_BYTES`]; keeps the rest for the next try when
/// the server is unreachable.
async fn send_output(
    client: &AgentClient,
    epoch: &str,
    uuid: &str,
    offset: &mut u64,
    pending: &mut Vec<u8>,
    last: bool,
) {
    while !pending.is_empty() {
        let limit = pending.len().min(UPLOAD_BYTES);
        let whole = limit == pending.len();
        let take = match std::str::from_utf8(&pending[..limit]) {
            Ok(_) => limit,
            // Cut before a character split across reads (or by the slice),
            // unless nothing more will come.
            Err(e) if e.error_len().is_none() && !(last && whole) => e.valid_up_to(),
            Err(_) => limit,
        };
        if take == 0 {
            return;
        }
        let text = String::from_utf8_lossy(&pending[..take]).into_owned();
        match client.output(epoch, uuid, *offset, text).await {
            Ok(next) => {
                *offset = next;
                pending.drain(..take);
            }
            Err(CallError::Unavailable(e)) => {
                tracing::warn!(error = %e, "driver output upload failed; will retry");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "driver output refused; dropping it");
                pending.clear();
            }
        }
    }
}

/// Runs an executor's part: a Spark worker that offers exactly the
/// allocated cores, memory and GPUs, once the batch's master is known.
pub async fn run_executor(
    ctx: Arc<Ctx>,
    mut rx: watch::Receiver<Assignment>,
    cancel: CancellationToken,
) {
    let a = rx.borrow().clone();
    let master = loop {
        let current = rx.borrow().clone();
        if current.action == Action::Stop {
            return;
        }
        if let Some(url) = current.master_url {
            break url;
        }
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return },
            _ = cancel.cancelled() => return,
        }
    };
    let dir = ctx
        .config
        .work_dir
        .join(&a.uuid)
        .join(format!("executor-{}", a.index));
    if let Err(message) = work(&ctx, &a, &master, &dir, &mut rx, &cancel).await {
        tracing::warn!(batch = %a.batch, executor = a.index, %message, "executor part failed");
        // An executor that stopped may have run the batch's code: not
        // counted as the infrastructure's.
        let event = ReportEvent::PartFailed {
            message,
            infrastructure: false,
        };
        if let Err(e) = ctx
            .client
            .report_surely(&ctx.epoch, &a.uuid, event, &cancel)
            .await
        {
            tracing::warn!(batch = %a.batch, error = %e, "the failure could not be reported");
        }
    }
    remove_part_dir(&dir);
}

async fn work(
    ctx: &Ctx,
    a: &Assignment,
    master: &str,
    dir: &Path,
    rx: &mut watch::Receiver<Assignment>,
    cancel: &CancellationToken,
) -> Result<(), String> {
    let node = &ctx.config.node_id;
    let local = dir.join("local");
    std::fs::create_dir_all(&local).map_err(|e| format!("{}: {e}", local.display()))?;
    let mut opts = Vec::new();
    if !a.gpus.is_empty() {
        let script = dir.join("gpus.sh");
        write_script(&script, &a.gpus).map_err(|e| format!("{}: {e}", script.display()))?;
        opts.push(format!(
            "-Dspark.worker.resource.gpu.amount={}",
            a.gpus.len()
        ));
        opts.push(format!(
            "-Dspark.worker.resource.gpu.discoveryScript={}",
            script.display()
        ));
    }
    let mut cmd = spark_class(
        ctx,
        &a.uuid,
        "org.apache.spark.deploy.worker.Worker",
        &[
            "--host".into(),
            ctx.config.advertise_host.clone(),
            "--cores".into(),
            a.cores.to_string(),
            "--memory".into(),
            format!("{}M", a.memory_mb),
            "--work-dir".into(),
            dir.join("work").display().to_string(),
            "--webui-port".into(),
            "0".into(),
            master.to_string(),
        ],
    );
    let log = dir.join("worker.log");
    let (out, err) = log_file(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    cmd.env("SPARK_WORKER_OPTS", opts.join(" "))
        .env("SPARK_LOCAL_DIRS", &local)
        .env("FLEXQ_NODE", node)
        .env("FLEXQ_EXECUTOR_INDEX", a.index.to_string())
        .stdout(out)
        .stderr(err);
    let mut worker = Group::spawn("spark worker", cmd, &ctx.config.work_dir).map_err(|e| {
        format!(
            "cannot start the Spark worker of executor {} on node {node}: {e}",
            a.index
        )
    })?;
    tracing::info!(batch = %a.batch, executor = a.index, gpus = ?a.gpus, "spark worker started");
    loop {
        tokio::select! {
            status = worker.wait() => {
                worker.reap();
                let status = status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
                return Err(format!(
                    "The Spark worker of executor {} on node {node} exited ({status}): {}",
                    a.index,
                    launch::failure_summary(&tail_of(&log))
                ));
            }
            changed = rx.changed() => {
                if changed.is_err() || rx.borrow().action == Action::Stop {
                    break;
                }
            }
            _ = cancel.cancelled() => break,
        }
    }
    worker.stop(ctx.config.stop_grace).await;
    Ok(())
}
