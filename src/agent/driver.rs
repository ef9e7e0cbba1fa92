//! The driver's part of a batch: starts the batch's Spark master, waits
//! for its executors, runs `spark-submit`, and reports how the batch
//! ended (finished, failed, past its ttl, cancelled), tearing its
//! processes down also after failures.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::output::pump_output;
use super::process::Group;
use super::work::{Ctx, remove_part_dir, spark_class, tail_of, write_script};
use crate::launch::{self, Rapids, SparkJob};
use crate::protocol::{Action, Assignment, ReportEvent};

/// How a driver part ended.
enum End {
    Exited(std::process::ExitStatus),
    TtlPassed(u64),
    Cancelled,
    /// The assignment went away or the agent is stopping: no report.
    Gone,
}

/// Runs the driver's part of a batch and reports how it ended.
pub(super) async fn run_driver(
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
    ctx: &Arc<Ctx>,
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

    let rapids = find_rapids(ctx);
    let metrics = dir.join("metrics");
    std::fs::create_dir_all(&metrics).map_err(|e| format!("{}: {e}", metrics.display()))?;
    let cmd = submit_command(ctx, a, job, dir, &url, &rapids)?;
    let mut driver = match Group::spawn("spark driver", cmd, &ctx.config.work_dir) {
        Ok(d) => d,
        Err(e) => {
            master.stop(ctx.config.stop_grace).await;
            return Err(format!("cannot run spark-submit: {e}"));
        }
    };
    tracing::info!(batch = %a.batch, batch_uuid = %a.uuid, rapids = %rapids.describe(), "driver started");
    let pump = start_pump(ctx, a, dir, &mut driver);
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

    // An elastic batch: Spark's executor target goes to the server while
    // the driver runs (docs/rules.md#elastic-batches).
    let demand = cancel.child_token();
    let _stop_demand = demand.clone().drop_guard();
    if job.cluster.dynamic_allocation && job.cluster.max_extras > 0 {
        let report = super::elastic::report_demand(ctx.clone(), a.clone(), metrics, demand);
        tokio::spawn(report);
    }
    let end = wait_for_end(&mut driver, a.ttl_seconds, rx, cancel).await?;
    // A preempted batch's grace is the server's; else the agent's own.
    let grace = rx
        .borrow()
        .stop_grace_seconds
        .map_or(ctx.config.stop_grace, std::time::Duration::from_secs);
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
    let (tail, mut fallback) = collect_output(pump, dir).await;
    let tail = String::from_utf8_lossy(&tail);
    // What ran on the CPU instead of the GPUs: said before the end.
    let asked_gpus = job.cluster.total_gpus() > 0;
    fallback.without_rapids = asked_gpus && matches!(rapids, Rapids::Missing { .. });
    report_fallback(ctx, a, &fallback).await;
    let on_cpu = on_cpu_note(&fallback);
    Ok(Some((end_event(end, exit, &tail, &on_cpu), master)))
}

/// Picks the node's RAPIDS jar, or says why the batch runs without it.
fn find_rapids(ctx: &Ctx) -> Rapids {
    if ctx.config.rapids_jar.is_file() {
        Rapids::Jar(ctx.config.rapids_jar.display().to_string())
    } else {
        Rapids::Missing {
            reason: format!(
                "no RAPIDS jar at {} on node {}",
                ctx.config.rapids_jar.display(),
                ctx.config.node_id
            ),
        }
    }
}

/// Builds the `spark-submit` command for the job against the batch's
/// master, writing the driver's GPU discovery script when it has GPUs.
fn submit_command(
    ctx: &Ctx,
    a: &Assignment,
    job: &SparkJob,
    dir: &Path,
    url: &str,
    rapids: &Rapids,
) -> Result<Command, String> {
    let mut conf = launch::spark_conf(job, rapids);
    let metrics = dir.join("metrics").display().to_string();
    launch::grow_beyond_core(&mut conf, &job.cluster, &metrics);
    conf.entry("spark.driver.host".into())
        .or_insert_with(|| ctx.config.advertise_host.clone());
    if !a.gpus.is_empty() {
        let script = dir.join("driver-gpus.sh");
        write_script(&script, &a.gpus).map_err(|e| format!("{}: {e}", script.display()))?;
        conf.entry("spark.driver.resource.gpu.discoveryScript".into())
            .or_insert_with(|| script.display().to_string());
    }
    let jars: Vec<String> = match rapids {
        Rapids::Jar(path) => vec![path.clone()],
        Rapids::Missing { .. } => vec![],
    };
    let args = launch::submit_args(job, url, &conf, &jars);
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
    Ok(cmd)
}

/// Starts uploading the driver's output and writing it to `driver.log`;
/// the task answers the output's tail and the CPU fallback it saw.
fn start_pump(
    ctx: &Ctx,
    a: &Assignment,
    dir: &Path,
    driver: &mut Group,
) -> tokio::task::JoinHandle<(Vec<u8>, crate::api::CpuFallback)> {
    let stdout = driver.child().stdout.take();
    let stderr = driver.child().stderr.take();
    let (client, epoch, uuid) = (ctx.client.clone(), ctx.epoch.clone(), a.uuid.clone());
    let log = dir.join("driver.log");
    tokio::spawn(async move { pump_output(client, epoch, uuid, stdout, stderr, log).await })
}

/// Waits until the driver exits, its ttl passes, the batch is stopped,
/// or the assignment goes away.
async fn wait_for_end(
    driver: &mut Group,
    ttl: Option<u64>,
    rx: &mut watch::Receiver<Assignment>,
    cancel: &CancellationToken,
) -> Result<End, String> {
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
    Ok(end)
}

/// Waits for everything the driver printed to be uploaded before the end
/// is reported; answers the output's tail and the CPU fallback seen.
async fn collect_output(
    pump: tokio::task::JoinHandle<(Vec<u8>, crate::api::CpuFallback)>,
    dir: &Path,
) -> (Vec<u8>, crate::api::CpuFallback) {
    match tokio::time::timeout(Duration::from_secs(30), pump).await {
        Ok(Ok(done)) => done,
        // The upload is stuck (the server is slow or gone): the local log
        // still has the tail for the failure summary.
        _ => (
            tail_of(&dir.join("driver.log")).into_bytes(),
            Default::default(),
        ),
    }
}

/// Reports what ran on the CPU instead of the GPUs, if anything did.
async fn report_fallback(ctx: &Ctx, a: &Assignment, fallback: &crate::api::CpuFallback) {
    let fell_back = fallback.operators > 0 || fallback.without_rapids;
    if fell_back {
        let event = ReportEvent::CpuFallback {
            fallback: fallback.clone(),
        };
        if let Err(e) = ctx.client.report(&ctx.epoch, &a.uuid, event).await {
            tracing::warn!(batch = %a.batch, error = %e, "CPU fallback not reported");
        }
    }
}

/// The sentence the end's message gets about what ran on the CPU.
fn on_cpu_note(fallback: &crate::api::CpuFallback) -> String {
    if fallback.without_rapids {
        " It asked for GPUs and ran without the RAPIDS Accelerator: all of it ran on the CPU."
            .to_string()
    } else if fallback.operators > 0 {
        format!(
            " RAPIDS: {} operator{} could not run on the GPU (first: {}).",
            fallback.operators,
            if fallback.operators == 1 { "" } else { "s" },
            fallback.reasons.first().map(String::as_str).unwrap_or("?")
        )
    } else {
        String::new()
    }
}

/// The report of how the batch ended, from how the driver ended, its exit
/// status, the tail of its output and the note on what ran on the CPU.
fn end_event(
    end: End,
    exit: Option<std::process::ExitStatus>,
    tail: &str,
    on_cpu: &str,
) -> ReportEvent {
    match (end, exit) {
        (End::Exited(_), Some(status)) if status.success() => ReportEvent::Finished {
            succeeded: true,
            message: format!("The driver finished successfully (exit status 0).{on_cpu}"),
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
                    launch::failure_summary(tail)
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
    }
}
