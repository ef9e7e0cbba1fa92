//! Spark processes in process groups of their own: stopping one stops its
//! whole tree (a worker's executors, a driver's Python), SIGTERM first and
//! SIGKILL after the grace period. Each group is recorded in the work
//! directory so an agent that restarts after a crash stops what the old
//! one left behind.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// A running process and its group.
pub(super) struct Group {
    pub name: String,
    child: Child,
    pgid: Option<i32>,
    record: Option<PathBuf>,
}

fn records(work_dir: &Path) -> PathBuf {
    work_dir.join("process-groups")
}

impl Group {
    /// Starts `cmd` as the leader of a new process group. Output goes where
    /// `cmd`'s stdio says (the caller sets it).
    pub(super) fn spawn(name: &str, mut cmd: Command, work_dir: &Path) -> std::io::Result<Group> {
        cmd.process_group(0).stdin(Stdio::null()).kill_on_drop(true);
        let child = cmd.spawn()?;
        let pgid = child.id().map(|p| p as i32);
        let record = pgid.and_then(|pgid| {
            let dir = records(work_dir);
            std::fs::create_dir_all(&dir).ok()?;
            let path = dir.join(pgid.to_string());
            std::fs::write(&path, name).ok()?;
            Some(path)
        });
        Ok(Group {
            name: name.to_string(),
            child,
            pgid,
            record,
        })
    }

    pub(super) fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Waits for the leader to exit.
    pub(super) async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.child.wait().await
    }

    fn signal(&self, sig: Signal) {
        if let Some(pgid) = self.pgid {
            // ESRCH: the group is gone already.
            let _ = killpg(Pid::from_raw(pgid), sig);
        }
    }

    /// Asks the group's Spark processes to decommission (SIGPWR, Spark's
    /// `spark.worker.decommission.signal`): executors move their blocks
    /// away and exit; the leader stays until stopped.
    pub(super) fn decommission(&self) {
        self.signal(Signal::SIGPWR);
    }

    /// Stops the whole group: SIGTERM, then SIGKILL after `grace`. Returns
    /// once the leader has exited.
    pub(super) async fn stop(mut self, grace: Duration) -> Option<ExitStatus> {
        self.signal(Signal::SIGTERM);
        let status = match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => status.ok(),
            Err(_) => {
                tracing::warn!(process = %self.name, "did not stop within the grace period; killing it");
                None
            }
        };
        // Children of the leader may outlive it: always finish with SIGKILL.
        self.signal(Signal::SIGKILL);
        let status = match status {
            Some(s) => Some(s),
            None => self.child.wait().await.ok(),
        };
        self.drop_record();
        status
    }

    /// The leader exited by itself: make sure nothing of its group is left.
    pub(super) fn reap(mut self) {
        self.signal(Signal::SIGKILL);
        self.drop_record();
    }

    fn drop_record(&mut self) {
        if let Some(path) = self.record.take() {
            let _ = std::fs::remove_file(path);
        }
        self.pgid = None;
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.signal(Signal::SIGKILL);
        if let Some(path) = self.record.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Stops the process groups an earlier agent recorded and did not stop
/// (it crashed or was killed). Only groups whose leader is still a Spark
/// process are signalled, so a recycled pid is left alone.
pub(super) fn stop_leftovers(work_dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(records(work_dir)) else {
        return 0;
    };
    let mut stopped = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let pgid: Option<i32> = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse().ok());
        if let Some(pgid) = pgid {
            let cmdline = std::fs::read(format!("/proc/{pgid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains("spark") {
                tracing::warn!(pgid, "stopping Spark processes left by an earlier agent");
                let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
                stopped += 1;
            }
        }
        let _ = std::fs::remove_file(&path);
    }
    stopped
}
