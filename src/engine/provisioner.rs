//! Provisioned capacity's programs (docs/rules.md#provisioned-capacity).
//! After each pass the scheduling replica looks at the core: a set of new
//! nodes it has not started is started — its pool's resume program, once
//! per set whoever leads (marked in the store first), with the set's
//! manifest on stdin; a program that fails fails the set. A node being
//! suspended whose program is not running gets its pool's suspend
//! program; when that ends, the nodes leave (or, when it failed, stay).
//! A new leader adopts what its predecessor left: sets never started are
//! started, suspensions are run again.

use std::collections::{BTreeMap, HashSet};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use tokio::io::AsyncWriteExt;

use super::Engine;
use crate::config::ProvisionerConfig;
use crate::scheduler::{BatchKey, NodeId, NodeSet, Scheduler};

/// (region, zone, pool).
type PoolKey = (String, String, String);

/// What this replica started, so that a pass does not start it again.
#[derive(Debug, Default)]
pub(crate) struct Runs {
    sets: Mutex<HashSet<BatchKey>>,
    suspends: Mutex<HashSet<NodeId>>,
}

/// The most of a program's output kept for the log.
const OUTPUT_KEPT: usize = 4096;

/// How a program run ended.
enum Ended {
    Ok(String),
    Failed(String),
}

impl Engine {
    /// Starts the programs the core calls for and this replica has not
    /// started: called under the core's lock, after a pass was committed.
    pub(super) fn start_programs(&self, core: &Scheduler, fence: Option<i64>) {
        let runs = &self.shared.runs;
        let open: Vec<NodeSet> = core.open_sets().cloned().collect();
        {
            let mut started = runs.sets.lock().unwrap_or_else(|e| e.into_inner());
            let keys: HashSet<BatchKey> = open.iter().map(|s| s.key).collect();
            started.retain(|k| keys.contains(k));
            for set in open {
                if started.insert(set.key) {
                    let engine = self.clone();
                    tokio::spawn(async move { engine.resume(set, fence).await });
                }
            }
        }
        let mut groups: BTreeMap<(PoolKey, String), Vec<NodeId>> = BTreeMap::new();
        {
            let mut started = runs.suspends.lock().unwrap_or_else(|e| e.into_inner());
            for (id, pool, why) in core.suspending() {
                if started.insert(id.clone()) {
                    groups
                        .entry((pool.clone(), why.to_string()))
                        .or_default()
                        .push(id.clone());
                }
            }
        }
        for ((pool, why), nodes) in groups {
            let engine = self.clone();
            tokio::spawn(async move { engine.suspend(pool, why, nodes, fence).await });
        }
    }

    /// The provisioner of a pool, as the config in force says.
    fn provisioner_of(&self, region: &str, zone: &str, pool: &str) -> Option<ProvisionerConfig> {
        self.config()
            .regions
            .get(region)?
            .zones
            .get(zone)?
            .node_pools
            .get(pool)?
            .provisioner
            .clone()
    }

    /// Runs `set`'s resume program, unless it was started before (by this
    /// replica or another): its failure fails the set.
    async fn resume(&self, set: NodeSet, fence: Option<i64>) {
        let Some(prov) = self.provisioner_of(&set.region, &set.zone, &set.pool) else {
            self.fail_set(set.key, "the pool no longer has a provisioner".into())
                .await;
            return;
        };
        match self
            .bounded(self.shared.store.mark_resumed(set.key.0, Utc::now(), fence))
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                tracing::info!(batch.id = %set.batch_id, zone = %set.zone, pool = %set.pool, "resume program started before (by an earlier leader): not started again");
                return;
            }
            Err(e) => {
                // Not marked: not started. Its slots register or time out.
                tracing::warn!(batch.id = %set.batch_id, error = %e, "cannot mark the resume program started; not starting it");
                return;
            }
        }
        let manifest = json!({
            "batch": set.batch_id,
            "project": set.project,
            "region": set.region,
            "zone": set.zone,
            "pool": set.pool,
            "slots": set.slots.iter().map(|s| s.0.as_str()).collect::<Vec<_>>(),
            "shape": {
                "accelerator": set.shape.accelerator.to_string(),
                "gpus": set.shape.gpu_addresses.len(),
                "cores": set.shape.cores,
                "memoryMb": set.shape.memory_mb,
                "localSsdGb": set.shape.local_ssd_gb,
            },
            "registerBy": set.register_by.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        });
        tracing::info!(batch.id = %set.batch_id, zone = %set.zone, pool = %set.pool, slots = set.slots.len(), "resume program started");
        crate::metrics::record_provisioning((&set.region, &set.zone, &set.pool), "started");
        let timeout = (set.register_by - Utc::now())
            .to_std()
            .unwrap_or_default()
            .min(prov.resume_timeout);
        match run(&prov.resume_program, &manifest, timeout).await {
            Ended::Ok(output) => {
                tracing::info!(batch.id = %set.batch_id, zone = %set.zone, output = %output, "resume program ended");
            }
            Ended::Failed(why) => {
                tracing::warn!(batch.id = %set.batch_id, zone = %set.zone, why = %why, "resume program failed");
                self.fail_set(set.key, format!("its resume program failed: {why}"))
                    .await;
            }
        }
    }

    async fn fail_set(&self, key: BatchKey, why: String) {
        self.lock().await.resume_failed(key, why);
        self.wake();
    }

    /// Runs the suspend program of `pool` for `nodes`; they leave when it
    /// succeeds, and are nodes like any other when it fails.
    async fn suspend(&self, pool: PoolKey, why: String, nodes: Vec<NodeId>, fence: Option<i64>) {
        let (region, zone, name) = &pool;
        let ended = match self.provisioner_of(region, zone, name) {
            None => Ended::Failed("the pool no longer has a provisioner".into()),
            Some(prov) => {
                let manifest = json!({
                    "region": region,
                    "zone": zone,
                    "pool": name,
                    "nodes": nodes.iter().map(|n| n.0.as_str()).collect::<Vec<_>>(),
                    "reason": why,
                });
                tracing::info!(zone = %zone, pool = %name, nodes = ?nodes, reason = %why, "suspend program started");
                run(&prov.suspend_program, &manifest, prov.suspend_timeout).await
            }
        };
        let deleted = matches!(ended, Ended::Ok(_));
        match &ended {
            Ended::Ok(output) => {
                tracing::info!(zone = %zone, pool = %name, nodes = ?nodes, output = %output, "nodes suspended")
            }
            Ended::Failed(e) => {
                tracing::error!(zone = %zone, pool = %name, nodes = ?nodes, why = %e, "suspend program failed: the nodes stay")
            }
        }
        crate::metrics::record_suspension((region, zone, name), &why, deleted, nodes.len());
        if let Err(e) = self
            .bounded(self.shared.store.suspend_ended(&nodes, deleted, fence))
            .await
        {
            // The store still says suspending: the next leader runs it
            // again.
            tracing::warn!(nodes = ?nodes, error = %e, "cannot record the suspend program's end");
        }
        {
            let mut core = self.lock().await;
            if deleted {
                core.nodes_suspended(&nodes);
            } else {
                core.suspend_failed(&nodes);
            }
        }
        {
            let mut started = self
                .shared
                .runs
                .suspends
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            for n in &nodes {
                started.remove(n);
            }
        }
        self.wake();
        self.work_changed();
    }
}

/// Runs `argv` with `manifest` on its stdin, for at most `timeout`
/// (killed then). Its output is kept for the log, bounded.
async fn run(argv: &[String], manifest: &serde_json::Value, timeout: Duration) -> Ended {
    let Some((program, args)) = argv.split_first() else {
        return Ended::Failed("no program configured".into());
    };
    let child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return Ended::Failed(format!("{program} cannot be started: {e}")),
    };
    if let Some(mut stdin) = child.stdin.take() {
        let body = manifest.to_string();
        // A program that does not read its manifest is its own business.
        let _ = stdin.write_all(body.as_bytes()).await;
        let _ = stdin.shutdown().await;
    }
    match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Err(_) => Ended::Failed(format!(
            "{program} did not end within {}; killed",
            humantime::format_duration(timeout)
        )),
        Ok(Err(e)) => Ended::Failed(format!("{program} could not be waited for: {e}")),
        Ok(Ok(out)) => {
            let text = bounded(&out.stdout, &out.stderr);
            if out.status.success() {
                Ended::Ok(text)
            } else {
                Ended::Failed(format!("{program} exited with {}: {text}", out.status))
            }
        }
    }
}

/// The end of a program's stdout and stderr, at most [`OUTPUT_KEPT`]
/// bytes, as text.
fn bounded(stdout: &[u8], stderr: &[u8]) -> String {
    let mut all = String::from_utf8_lossy(stdout).into_owned();
    let err = String::from_utf8_lossy(stderr);
    if !err.trim().is_empty() {
        all.push_str(" | stderr: ");
        all.push_str(&err);
    }
    let all = all.trim();
    if all.len() <= OUTPUT_KEPT {
        return all.to_string();
    }
    let mut start = all.len() - OUTPUT_KEPT;
    while !all.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &all[start..])
}
