//! The agent's side of elastic batches (docs/rules.md#elastic-batches),
//! on the standalone launcher: the driver's node reads Spark's executor
//! target from the driver's CSV metrics and reports it; an extra's node
//! follows its Spark worker's log to tell when the worker, registered
//! with the batch's master, has had no executor for `extra_idle`, and
//! reports it idle.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::client::CallError;
use super::work::Ctx;
use crate::launch::TARGET_EXECUTORS_CSV;
use crate::protocol::{Assignment, ReportEvent};

/// How often the driver's metrics and an extra's worker log are read.
const READ_EVERY: Duration = Duration::from_secs(1);
/// A demand unchanged is said again this often (a new leader, or one
/// that restarted, hears it).
const SAY_AGAIN: Duration = Duration::from_secs(15);

/// Spark's executor target, as the driver's CSV sink last wrote it into
/// `dir`: the last row of its file. None before Spark wrote one.
pub(super) fn target_executors(dir: &Path) -> Option<u32> {
    let file = std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(TARGET_EXECUTORS_CSV))
        })?;
    let text = std::fs::read_to_string(file).ok()?;
    let last = text.lines().rev().find(|l| !l.trim().is_empty())?;
    let value = last.rsplit(',').next()?.trim();
    // A gauge is written as an integer; read a decimal too.
    value
        .parse::<u32>()
        .ok()
        .or_else(|| value.parse::<f64>().ok().map(|v| v.max(0.0) as u32))
}

/// While the driver of elastic batch `a` runs (until `stop`): reports
/// Spark's executor target when it changes, and again every
/// [`SAY_AGAIN`].
pub(super) async fn report_demand(
    ctx: Arc<Ctx>,
    a: Assignment,
    metrics: PathBuf,
    stop: CancellationToken,
) {
    let mut said: Option<(u32, tokio::time::Instant)> = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(READ_EVERY) => {}
        }
        let Some(target) = target_executors(&metrics) else {
            continue;
        };
        let due = said.is_none_or(|(v, at)| v != target || at.elapsed() >= SAY_AGAIN);
        if !due {
            continue;
        }
        let event = ReportEvent::ExecutorDemand {
            target_executors: target,
        };
        match ctx.client.report(&ctx.epoch, &a.uuid, event).await {
            Ok(()) => {
                if said.is_none_or(|(v, _)| v != target) {
                    tracing::info!(batch = %a.batch, target, "executor demand reported");
                }
                said = Some((target, tokio::time::Instant::now()));
            }
            Err(e) => {
                tracing::debug!(batch = %a.batch, error = %e, "executor demand not reported; trying again")
            }
        }
    }
}

/// How many times `extra_idle` a worker that has not registered with its
/// master may wait before its extra goes back. Spark's worker retries its
/// registration for about a quarter of an hour before it exits; an extra
/// holds its GPUs no longer than this.
const UNREGISTERED_FACTOR: u32 = 4;

/// A Spark worker's log, followed: whether it registered with its master
/// ("Successfully registered with master") and how many executors it
/// runs now, from its "Asked to launch executor" and "finished with
/// state" lines (Spark 4's standalone Worker).
pub(super) struct WorkerLog {
    path: PathBuf,
    offset: u64,
    partial: String,
    running: i64,
    registered: bool,
}

impl WorkerLog {
    pub(super) fn new(path: &Path) -> WorkerLog {
        WorkerLog {
            path: path.to_path_buf(),
            offset: 0,
            partial: String::new(),
            running: 0,
            registered: false,
        }
    }

    /// Reads what the worker wrote since; answers the executors it runs.
    pub(super) fn executors(&mut self) -> u32 {
        let mut more = Vec::new();
        if let Ok(mut f) = std::fs::File::open(&self.path) {
            if f.seek(SeekFrom::Start(self.offset)).is_ok() {
                if let Ok(n) = f.read_to_end(&mut more) {
                    self.offset += n as u64;
                }
            }
        }
        self.partial.push_str(&String::from_utf8_lossy(&more));
        while let Some(end) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=end).collect();
            if line.contains("Worker: Successfully registered with master ") {
                self.registered = true;
            } else if line.contains("Worker: Asked to launch executor ") {
                self.running += 1;
            } else if line.contains("Worker: Executor ") && line.contains(" finished with state ") {
                self.running -= 1;
            }
        }
        self.running.max(0) as u32
    }

    /// Whether the worker has registered with its master (as of the last
    /// [`WorkerLog::executors`]).
    pub(super) fn registered(&self) -> bool {
        self.registered
    }
}

/// While extra `a`'s worker runs (until `stop`): once its log shows no
/// executor for the agent's `extra_idle` since the worker registered with
/// its master, reports the extra idle (the server gives it back and the
/// assignment goes away). The clock starts at the registration, not at
/// the worker's start: on a loaded node a JVM can take longer than
/// `extra_idle` to join, and the master hands it an executor only then.
/// A worker that never registers goes back after [`UNREGISTERED_FACTOR`]
/// times `extra_idle`. Said once; again only if an executor came and
/// went since.
pub(super) async fn watch_idle(
    ctx: Arc<Ctx>,
    a: Assignment,
    log: PathBuf,
    stop: CancellationToken,
) {
    let mut worker = WorkerLog::new(&log);
    let mut idle_since = Some(tokio::time::Instant::now());
    let mut registered = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(READ_EVERY) => {}
        }
        if worker.executors() > 0 {
            idle_since = None;
            continue;
        }
        if worker.registered() && !registered {
            registered = true;
            idle_since = Some(tokio::time::Instant::now());
        }
        let since = *idle_since.get_or_insert_with(tokio::time::Instant::now);
        let limit = if registered {
            ctx.config.extra_idle
        } else {
            ctx.config.extra_idle * UNREGISTERED_FACTOR
        };
        if since.elapsed() < limit {
            continue;
        }
        let event = ReportEvent::ExtraIdle { index: a.index };
        match ctx.client.report(&ctx.epoch, &a.uuid, event).await {
            Ok(()) => {
                tracing::info!(batch = %a.batch, extra = a.index, "extra executor idle; given back");
                return;
            }
            // Gone already (reclaimed, or the batch ended).
            Err(CallError::Refused(e)) => {
                tracing::debug!(batch = %a.batch, extra = a.index, error = %e, "idle extra not taken");
                return;
            }
            Err(e) => {
                tracing::debug!(batch = %a.batch, extra = a.index, error = %e, "idle extra not reported; trying again");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_is_the_last_row_of_sparks_csv() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(target_executors(dir.path()), None, "nothing written yet");
        let file = dir
            .path()
            .join(format!("app-20261206160026-0000{TARGET_EXECUTORS_CSV}"));
        std::fs::write(&file, "t,value\n1796572844,3\n1796572845,5\n").expect("write");
        // Another gauge's file beside it is not read.
        std::fs::write(
            dir.path()
                .join("app-1.driver.ExecutorAllocationManager.executors.numberAllExecutors.csv"),
            "t,value\n1,9\n",
        )
        .expect("write");
        assert_eq!(target_executors(dir.path()), Some(5));
        std::fs::write(&file, "t,value\n").expect("write");
        assert_eq!(target_executors(dir.path()), None, "a header alone");
    }

    #[test]
    fn a_worker_log_counts_the_executors_launched_and_finished() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("worker.log");
        let mut log = WorkerLog::new(&path);
        assert_eq!(log.executors(), 0, "no log yet");
        assert!(!log.registered(), "no log yet");
        // Lines as Spark 4.3's Worker writes them.
        std::fs::write(
            &path,
            "26/12/06 16:01:02 INFO Worker: Connecting to master 127.0.0.1:7077...\n\
             26/12/06 16:01:02 INFO Worker: Successfully registered with master spark://127.0.0.1:7077\n\
             26/12/06 16:01:03 INFO Worker: Asked to launch executor app-1/1 for app.py\n\
             26/12/06 16:01:04 INFO ExecutorRunner: Launch command: \"java\"\n26/12/06 16:01:05 INFO Worker: Asked to la",
        )
        .expect("write");
        assert_eq!(log.executors(), 1, "a line not yet ended is not read");
        assert!(log.registered());
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open");
        std::io::Write::write_all(
            &mut f,
            b"unch executor app-1/2 for app.py\n\
              26/12/06 16:01:28 INFO Worker: Executor app-1/1 finished with state KILLED message Runner thread interrupted exitStatus 143\n",
        )
        .expect("append");
        assert_eq!(log.executors(), 1);
        std::io::Write::write_all(
            &mut f,
            b"26/12/06 16:01:40 INFO Worker: Executor app-1/2 finished with state EXITED message Command exited with code 0 exitStatus 0\n",
        )
        .expect("append");
        assert_eq!(log.executors(), 0);
    }
}
