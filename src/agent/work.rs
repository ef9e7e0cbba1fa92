//! One part of one batch on this node: the driver's part runs the batch's
//! Spark master and `spark-submit` (`driver.rs`, its output sent on by
//! `output.rs`); an executor's part runs a Spark worker limited to the
//! allocated cores, memory and GPUs (`executor.rs`). Each part reports what
//! happened and tears its processes down, also after failures.
//!
//! Here: what the parts share, the session's [`Ctx`], and the helpers both
//! use to start Spark daemons and keep their logs.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;

use super::client::AgentClient;
use super::settings::AgentSettings;
use crate::launch;

/// What every part of this agent's session shares.
pub(super) struct Ctx {
    pub config: AgentSettings,
    pub client: AgentClient,
    /// The epoch of this registration: every report carries it.
    pub epoch: String,
    pub spark_home: PathBuf,
}

/// Output kept in memory for the failure summary.
pub(super) const TAIL_BYTES: usize = 64 * 1024;

/// A Spark daemon of batch `uuid`. Every process of a batch carries
/// FLEXQ_BATCH_UUID in its environment (operators can find them by it).
pub(super) fn spark_class(ctx: &Ctx, uuid: &str, class: &str, args: &[String]) -> Command {
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
pub(super) fn remove_part_dir(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
    if let Some(batch_dir) = dir.parent() {
        let _ = std::fs::remove_dir(batch_dir);
    }
}

pub(super) fn log_file(path: &Path) -> std::io::Result<(Stdio, Stdio)> {
    let f = std::fs::File::create(path)?;
    Ok((Stdio::from(f.try_clone()?), Stdio::from(f)))
}

pub(super) fn tail_of(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    let start = bytes.len().saturating_sub(TAIL_BYTES);
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}

pub(super) fn write_script(path: &Path, gpus: &[String]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, launch::discovery_script(gpus))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
}
