//! An executor's part of a batch: once the batch's master is known, a
//! Spark worker that offers exactly the allocated cores, memory and GPUs,
//! reported and torn down when it ends or the assignment goes away.

use std::path::Path;
use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::process::Group;
use super::work::{Ctx, log_file, remove_part_dir, spark_class, tail_of, write_script};
use crate::launch;
use crate::protocol::{Action, Assignment, ReportEvent};

/// Runs an executor's part: a Spark worker that offers exactly the
/// allocated cores, memory and GPUs, once the batch's master is known.
pub(super) async fn run_executor(
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
    let outcome = work(&ctx, &a, &master, &dir, &mut rx, &cancel).await;
    if let (Err(message), true) = (&outcome, a.extra) {
        // Losing an extra never fails the batch: it goes back, and Spark
        // reruns its tasks on the rest (docs/rules.md#elastic-batches).
        tracing::warn!(batch = %a.batch, extra = a.index, %message, "extra executor's worker ended; giving it back");
        let event = ReportEvent::ExtraIdle { index: a.index };
        if let Err(e) = ctx
            .client
            .report_surely(&ctx.epoch, &a.uuid, event, &cancel)
            .await
        {
            tracing::warn!(batch = %a.batch, error = %e, "the extra's end could not be reported");
        }
    } else if let Err(message) = outcome {
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
    ctx: &Arc<Ctx>,
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
    if a.extra {
        // Given back or taken back, it decommissions (SIGPWR) first.
        opts.push("-Dspark.decommission.enabled=true".into());
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
    tracing::info!(batch = %a.batch, executor = a.index, gpus = ?a.gpus, extra = a.extra, "spark worker started");
    // An extra whose worker has had no executor for a while goes back.
    let watching = cancel.child_token();
    let _stop_watching = watching.clone().drop_guard();
    if a.extra {
        let watch = super::elastic::watch_idle(ctx.clone(), a.clone(), log.clone(), watching);
        tokio::spawn(watch);
    }
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
    // A preempted batch's grace is the server's; else the agent's own.
    let grace = rx
        .borrow()
        .stop_grace_seconds
        .map_or(ctx.config.stop_grace, std::time::Duration::from_secs);
    if a.extra {
        // Given back or taken back: Spark's graceful decommission first
        // (its executor's blocks move to the others), within the grace.
        worker.decommission();
        let mut executors = super::elastic::WorkerLog::new(&log);
        let until = tokio::time::Instant::now() + grace;
        while executors.executors() > 0 && tokio::time::Instant::now() < until {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        tracing::info!(batch = %a.batch, extra = a.index, "extra executor decommissioned");
    }
    worker.stop(grace).await;
    Ok(())
}
