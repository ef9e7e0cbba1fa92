//! Live config: `POST /v1/config:reload` and SIGHUP on a real `flexq
//! serve`. A reload under load (creates, allocations and cancels running)
//! fails no request and loses nothing; an invalid file is refused naming
//! its key and the config in force stays; a pool shrunk under a running
//! cluster lets it finish and takes nothing new.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{ServerProcess, fake_gpu_script, flex_batch, flexq_bin, spawn_agent};

const BATCHES: &str = "/v1/projects/demo/locations/us-central1/batches";

async fn reload(s: &ServerProcess) -> (u16, Value) {
    s.post("/v1/config:reload").await
}

async fn config_status(s: &ServerProcess) -> Value {
    s.get("/readyz").await["config"].clone()
}

/// A config layer: the default allocation timeout, `nodes` virtual L4
/// nodes in us-central1-a, and a weight for one project.
fn layer(timeout_min: u32, nodes: u32, weight: u32) -> String {
    format!(
        "[provisioning]\ndefault_allocation_timeout = \"{timeout_min}m\"\n\
         [regions.us-central1.zones.us-central1-a.node_pools.l4]\nvirtual_nodes = {nodes}\n\
         [projects.team-w]\nweight = {weight}\n"
    )
}

/// A flex batch that does not set its allocation timeout (it gets the
/// config's default) and has two executors: 3 L4 GPUs.
pub(crate) fn default_timeout_batch() -> Value {
    let mut b = flex_batch();
    let props = b["runtimeConfig"]["properties"]
        .as_object_mut()
        .expect("properties");
    props.retain(|k, _| !k.ends_with("allocationTimeout"));
    props.insert("spark.executor.instances".into(), "2".into());
    b
}

/// The allocation timeout a batch got: its deadline less its create time.
pub(crate) fn timeout_of(b: &Value) -> i64 {
    let at = |k: &Value| {
        chrono::DateTime::parse_from_rfc3339(k.as_str().unwrap_or_default())
            .unwrap_or_else(|e| panic!("{k}: {e}: {b:#}"))
    };
    (at(&b["flexq"]["allocationDeadline"]) - at(&b["createTime"])).num_seconds()
}

async fn create_default(s: &ServerProcess, id: &str) -> Value {
    assert_eq!(s.create(id, &default_timeout_batch()).await, 200);
    s.batch(id).await
}

fn state(b: &Value) -> &str {
    b["state"].as_str().unwrap_or_default()
}

/// Allocated (on virtual nodes nothing runs it: it stays PENDING).
fn allocated(b: &Value) -> bool {
    b["flexq"]["provisioningState"] == "PROVISIONED"
}

async fn nodes(s: &ServerProcess) -> Vec<Value> {
    s.get("/v1/nodes").await["nodes"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("config file");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_under_load_fails_no_request_and_loses_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("flexq.toml");
    write(&file, &layer(30, 2, 1));
    let s = Arc::new(ServerProcess::start_with(dir.path(), Some(&file)).await);
    let first = config_status(&s).await["generation"]
        .as_i64()
        .expect("generation");
    let done = Arc::new(AtomicBool::new(false));
    // Creates from three clients at once.
    let mut creators = Vec::new();
    for w in 0..3 {
        let s = s.clone();
        creators.push(tokio::spawn(async move {
            let mut failed = Vec::new();
            for i in 0..60 {
                let st = s.create(&format!("load-{w}-{i}"), &flex_batch()).await;
                if st != 200 {
                    failed.push((format!("load-{w}-{i}"), st));
                }
            }
            failed
        }));
    }
    // Allocations keep happening: what runs is cancelled, the next starts.
    let cancelled = Arc::new(AtomicUsize::new(0));
    let canceller = {
        let (s, done, cancelled) = (s.clone(), done.clone(), cancelled.clone());
        tokio::spawn(async move {
            let mut odd = Vec::new();
            while !done.load(Ordering::SeqCst) {
                let page = s
                    .get(&format!(
                        "{BATCHES}?filter=state%20%3D%20PENDING&pageSize=1000"
                    ))
                    .await;
                let batches = page["batches"].as_array().cloned().unwrap_or_default();
                for b in batches.iter().filter(|b| allocated(b)) {
                    let op = b["operation"].as_str().unwrap_or_default().to_string();
                    let (st, body) = s.post(&format!("/v1/{op}:cancel")).await;
                    match st {
                        200 => {
                            cancelled.fetch_add(1, Ordering::SeqCst);
                        }
                        // Cancelled already by the previous round.
                        400 if body["error"]["status"] == "FAILED_PRECONDITION" => {}
                        _ => odd.push((st, body)),
                    }
                }
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            odd
        })
    };
    // Reloads meanwhile, each with a different config.
    let mut generations = vec![first];
    for i in 1..=12u32 {
        write(&file, &layer(30 + i, 2 + i % 2, i));
        let (st, body) = reload(&s).await;
        assert_eq!(st, 200, "reload {i}: {body:#}");
        let generation = body["generation"].as_i64().expect("generation");
        assert!(
            generation > *generations.last().expect("one"),
            "reload {i}: {body:#}"
        );
        generations.push(generation);
        tokio::time::sleep(Duration::from_millis(120)).await;
    }
    for c in creators {
        let failed = c.await.expect("creator");
        assert!(failed.is_empty(), "creates failed: {failed:?}");
    }
    done.store(true, Ordering::SeqCst);
    let odd = canceller.await.expect("canceller");
    assert!(odd.is_empty(), "cancels answered oddly: {odd:?}");
    assert!(
        cancelled.load(Ordering::SeqCst) >= 4,
        "allocations kept happening during the reloads: only {} cancelled",
        cancelled.load(Ordering::SeqCst)
    );
    // Nothing lost: every batch is there, in a state it may be in.
    let mut all = Vec::new();
    let mut token = String::new();
    loop {
        let page = s
            .get(&format!("{BATCHES}?pageSize=1000&pageToken={token}"))
            .await;
        all.extend(page["batches"].as_array().cloned().unwrap_or_default());
        match page["nextPageToken"].as_str() {
            Some(t) if !t.is_empty() => token = t.to_string(),
            _ => break,
        }
    }
    assert_eq!(all.len(), 180);
    for b in &all {
        assert!(
            ["PENDING", "RUNNING", "CANCELLING", "CANCELLED"].contains(&state(b)),
            "{b:#}"
        );
    }
    // The last file is in force: its default timeout, its nodes.
    let status = config_status(&s).await;
    assert_eq!(status["generation"], *generations.last().expect("one"));
    assert_eq!(status["lastReload"]["ok"], true, "{status:#}");
    assert_eq!(timeout_of(&create_default(&s, "after-load").await), 42 * 60);
}

#[tokio::test]
async fn an_invalid_file_is_refused_naming_the_key_and_the_config_in_force_stays() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("flexq.toml");
    write(&file, &layer(20, 0, 1));
    let s = ServerProcess::start_with(dir.path(), Some(&file)).await;
    let first = config_status(&s).await;
    for (text, key, says) in [
        (
            "[provisioning]\ndefault_allocation_timeout = \"3h\"\n",
            "provisioning.default_allocation_timeout",
            "above provisioning.max_allocation_timeout",
        ),
        (
            "[provisioning]\ndefault_alocation_timeout = \"10m\"\n",
            "default_alocation_timeout",
            "unknown field",
        ),
        (
            "[regions.us-central1.zones.us-central1-a.node_pools.l4]\nvirtual_nodes = 9\n",
            "regions.us-central1.zones.us-central1-a.node_pools.l4.virtual_nodes",
            "above max_nodes (8)",
        ),
        (
            "[regions.us-central1.zones.us-central1-a.node_pools.l4]\nvirtual_nodes = 0\n\
             [regions.us-central1.zones.us-central1-a.node_pools.l4.provisioner]\n\
             resume_program = [\"/nowhere/resume\"]\nsuspend_program = [\"sh\"]\nmin_nodes = 9\n",
            "regions.us-central1.zones.us-central1-a.node_pools.l4.provisioner.min_nodes",
            "9 is above max_nodes (8)",
        ),
        (
            "[regions.us-central1.zones.us-central1-a.node_pools.l4]\nvirtual_nodes = 0\n\
             [regions.us-central1.zones.us-central1-a.node_pools.l4.provisioner]\n\
             resume_program = [\"/nowhere/resume\"]\nsuspend_program = [\"sh\"]\n",
            "regions.us-central1.zones.us-central1-a.node_pools.l4.provisioner.resume_program",
            "/nowhere/resume: cannot be read",
        ),
        (
            "[regions.us-central1.zones.us-central1-a.node_pools.l4]\nvirtual_nodes = 0\n\
             [regions.us-central1.zones.us-central1-a.node_pools.l4.provisioner]\n\
             resume_program = [\"sh\"]\nsuspend_program = [\"sh\"]\nsuspend_after = \"-10m\"\n",
            "suspend_after",
            "-10m",
        ),
        ("[provisioning\n", "", "TOML"),
    ] {
        write(&file, text);
        let (st, body) = reload(&s).await;
        assert_eq!(st, 400, "{text}: {body:#}");
        assert_eq!(body["error"]["status"], "FAILED_PRECONDITION", "{body:#}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(key) && message.contains(says),
            "{text}: {message}"
        );
        assert!(
            message.contains(&format!(
                "generation {} stays in force",
                first["generation"]
            )),
            "{message}"
        );
        let status = config_status(&s).await;
        assert_eq!(status["generation"], first["generation"], "{status:#}");
        assert_eq!(status["lastReload"]["ok"], false, "{status:#}");
    }
    // The config in force is still the first file's.
    assert_eq!(timeout_of(&create_default(&s, "still-20m").await), 20 * 60);
    let metrics = s.scrape().await;
    assert!(
        metrics.contains("flexq_config_last_reload_successful 0"),
        "{metrics}"
    );
    assert!(metrics.contains("flexq_config_reloads_total{result=\"invalid\"} 7"));
    // A file with two wrong keys is refused naming both: the message
    // says each, and the ErrorInfo names the first as `key` and all of
    // them as `keys`, in the order the check found them.
    write(
        &file,
        "[provisioning]\ndefault_allocation_timeout = \"3h\"\n\
         [regions.us-central1.zones.us-central1-a.node_pools.l4]\nvirtual_nodes = 9\n",
    );
    let (st, body) = reload(&s).await;
    assert_eq!(st, 400, "{body:#}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    let timeout_key = "provisioning.default_allocation_timeout";
    let nodes_key = "regions.us-central1.zones.us-central1-a.node_pools.l4.virtual_nodes";
    assert!(
        message.contains(timeout_key) && message.contains(nodes_key),
        "{message}"
    );
    let info = body["error"]["details"]
        .as_array()
        .and_then(|d| {
            d.iter()
                .find(|d| d["@type"] == "type.googleapis.com/google.rpc.ErrorInfo")
        })
        .unwrap_or_else(|| panic!("an ErrorInfo: {body:#}"));
    assert_eq!(info["metadata"]["key"], timeout_key, "{info:#}");
    assert_eq!(
        info["metadata"]["keys"],
        format!("{timeout_key},{nodes_key}"),
        "{info:#}"
    );
    // Bad input to the endpoint itself is named.
    let (st, body) = s.post("/v1/config:reload?validateOnly=maybe").await;
    assert_eq!(st, 400, "{body:#}");
    assert!(body.to_string().contains("validate_only"), "{body:#}");

    // `flexq config diff` shows what a reload would change, changing
    // nothing; then SIGHUP puts it in force.
    write(
        &file,
        &format!("{}[server]\nrequest_timeout = \"40s\"\n", layer(25, 0, 1)),
    );
    let out = Command::new(flexq_bin())
        .args(["config", "diff", "--endpoint", &s.endpoint])
        .output()
        .expect("flexq config diff");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("provisioning.default_allocation_timeout") && text.contains("\"25m\""),
        "{text}"
    );
    assert!(
        text.contains("restart-only") && text.contains("server.request_timeout"),
        "{text}"
    );
    assert_eq!(config_status(&s).await["generation"], first["generation"]);
    let pid = nix::unistd::Pid::from_raw(s.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).expect("SIGHUP");
    let t = Instant::now();
    let status = loop {
        let status = config_status(&s).await;
        if status["lastReload"]["ok"] == true {
            break status;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{status:#}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    assert_eq!(
        status["generation"].as_i64(),
        first["generation"].as_i64().map(|g| g + 1),
        "{status:#}"
    );
    assert_eq!(timeout_of(&create_default(&s, "now-25m").await), 25 * 60);
    // The restart-only key is not in force: requests still time out at 30s
    // (nothing to see here but that the server still answers), and the
    // batch created before the reload kept its deadline.
    assert_eq!(timeout_of(&s.batch("still-20m").await), 20 * 60);
}

#[tokio::test]
async fn a_pool_shrunk_under_a_running_cluster_lets_it_finish_and_takes_nothing_new() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("flexq.toml");
    write(&file, &layer(30, 2, 1));
    let s = ServerProcess::start_with(dir.path(), Some(&file)).await;
    create_default(&s, "runs-on").await;
    let running = s.until("demo", "runs-on", allocated).await;
    let busy: Vec<String> = nodes(&s)
        .await
        .iter()
        .filter(|n| n["runningParts"].as_u64() > Some(0))
        .map(|n| n["id"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(!busy.is_empty(), "{running:#}");
    // No virtual node declared any more.
    write(&file, &layer(30, 0, 1));
    let (st, body) = reload(&s).await;
    assert_eq!(st, 200, "{body:#}");
    assert_eq!(body["retiredNodes"], serde_json::json!(busy), "{body:#}");
    assert_eq!(
        body["removedNodes"].as_array().map(Vec::len),
        Some(2 - busy.len()),
        "{body:#}"
    );
    let left = nodes(&s).await;
    assert_eq!(left.len(), busy.len(), "{left:#?}");
    assert!(left.iter().all(|n| n["state"] == "RETIRING"), "{left:#?}");
    // The running cluster runs on; a new batch finds no capacity.
    create_default(&s, "waits").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(allocated(&s.batch("runs-on").await));
    let waiting = s.batch("waits").await;
    assert!(!allocated(&waiting), "{waiting:#}");
    let regions = s.get("/v1/regions").await;
    let row = regions["capacity"]
        .as_array()
        .expect("capacity")
        .iter()
        .find(|r| r["zone"] == "us-central1-a" && r["accelerator"] == "l4")
        .cloned()
        .expect("l4 row");
    // Its free GPUs are not offered: counted apart, with cordoned ones.
    let free_on_busy = 4 * busy.len() as u64 - 3;
    assert_eq!(row["freeGpus"], 0, "{row:#}");
    assert_eq!(row["cordonedGpus"], free_on_busy, "{row:#}");
    // It ends: the node leaves with it.
    let op = running["operation"].as_str().expect("op").to_string();
    assert_eq!(s.post(&format!("/v1/{op}:cancel")).await.0, 200);
    s.until("demo", "runs-on", |b| state(b) == "CANCELLED")
        .await;
    let t = Instant::now();
    while !nodes(&s).await.is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{:#?}",
            nodes(&s).await
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(!allocated(&s.batch("waits").await));
    // Declared again: the waiting batch starts.
    write(&file, &layer(30, 1, 1));
    let (st, body) = reload(&s).await;
    assert_eq!(st, 200, "{body:#}");
    assert_eq!(
        body["addedNodes"].as_array().map(Vec::len),
        Some(1),
        "{body:#}"
    );
    s.until("demo", "waits", allocated).await;
}

/// Writes `text` into the FIFO at `path` once a reader opens it (in a
/// thread: opening a FIFO for writing waits for its reader).
fn feed(path: &Path, text: String) -> std::thread::JoinHandle<()> {
    let path = path.to_path_buf();
    std::thread::spawn(move || std::fs::write(path, text).expect("feed the FIFO"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_while_another_runs_is_refused_and_the_first_completes() {
    // The config file is a FIFO: a reload reading it waits until the test
    // writes, so the first reload is provably still running when the
    // second arrives.
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("flexq.toml");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let start = feed(&fifo, layer(20, 0, 1));
    let s = Arc::new(ServerProcess::start_with(dir.path(), Some(&fifo)).await);
    start.join().expect("fed");
    let before = config_status(&s).await["generation"].clone();
    let first = {
        let s = s.clone();
        tokio::spawn(async move { reload(&s).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    if first.is_finished() {
        let (st, body) = first.await.expect("first reload");
        panic!("the first reload should wait for its file, yet it answered {st}: {body:#}");
    }
    let (st, body) = reload(&s).await;
    assert_eq!(st, 409, "{body:#}");
    assert_eq!(body["error"]["status"], "ABORTED", "{body:#}");
    assert!(body.to_string().contains("RELOAD_RUNNING"), "{body:#}");
    // The server answers meanwhile, on the config in force.
    assert_eq!(timeout_of(&create_default(&s, "during").await), 20 * 60);
    feed(&fifo, layer(35, 0, 1)).join().expect("fed");
    let (st, body) = first.await.expect("first reload");
    assert_eq!(st, 200, "{body:#}");
    assert_ne!(body["generation"], before, "{body:#}");
    assert_eq!(timeout_of(&create_default(&s, "after").await), 35 * 60);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_follows_a_lease_a_reload_shortened() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("flexq.toml");
    let lease = |d: &str| format!("{}[agents]\nlease_duration = \"{d}\"\n", layer(30, 0, 1));
    write(&file, &lease("9s"));
    let s = ServerProcess::start_with(dir.path(), Some(&file)).await;
    let work = dir.path().join("agent");
    std::fs::create_dir_all(&work).expect("agent dir");
    let config = work.join("agent.toml");
    write(
        &config,
        &format!(
            "server = \"{endpoint}\"\nnode_id = \"gpu-lease\"\nregion = \"us-central1\"\n\
             zone = \"us-central1-a\"\npool = \"l4\"\ncores = 8\nmemory_mb = 65536\n\
             local_ssd_gb = 1500\ngpu_discovery_script = \"{script}\"\n\
             work_dir = \"{work}\"\n",
            endpoint = s.endpoint,
            script = fake_gpu_script(&work).display(),
            work = work.join("work").display(),
        ),
    );
    let mut agent = spawn_agent(&config, &work.join("agent.log"));
    let epoch = |list: Vec<Value>| {
        list.iter()
            .find(|n| n["id"] == "gpu-lease")
            .map(|n| n["epoch"].clone())
    };
    let t = Instant::now();
    let first = loop {
        if let Some(e) = epoch(nodes(&s).await) {
            break e;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the agent never registered; its log:\n{}",
            std::fs::read_to_string(work.join("agent.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The agent heartbeats every 3 s; with a 2 s lease it must heartbeat
    // every second from its next heartbeat on, or its node is lost (and
    // registers again with a new epoch).
    write(&file, &lease("2s"));
    let (st, body) = reload(&s).await;
    assert_eq!(st, 200, "{body:#}");
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(7) {
        let now = epoch(nodes(&s).await);
        assert_eq!(
            now.as_ref(),
            Some(&first),
            "the node was lost after {:?}",
            t.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = agent.kill();
    let _ = agent.wait();
    let log = std::fs::read_to_string(work.join("agent.log")).unwrap_or_default();
    assert!(
        log.contains("the server changed the heartbeat interval"),
        "{log}"
    );
}

/// Issue 24's stale copy: every live section a reload changes is what each
/// route that shows it answers next — never a copy taken at start.
#[tokio::test]
async fn every_route_shows_the_live_sections_a_reload_changed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("flexq.toml");
    write(&file, "");
    let s = ServerProcess::start_with(dir.path(), Some(&file)).await;
    let default_runtime = |r: &Value| {
        r["runtimes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| v["default"] == true)
            .map(|v| v["version"].as_str().unwrap_or_default().to_string())
            .collect::<Vec<_>>()
    };
    let l4_limit = |q: &Value| {
        q["quotas"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|q| q["metric"] == "PREEMPTIBLE_NVIDIA_L4_GPUS")
            .map(|q| q["limit"].clone())
    };
    let pool_nodes = |nodes: &[Value]| {
        nodes
            .iter()
            .filter(|n| n["zone"] == "us-central1-a" && n["pool"] == "l4")
            .count()
    };
    let quotas = "/v1/projects/demo/regions/us-central1/quotas";
    assert_eq!(default_runtime(&s.get("/v1/runtimes").await), ["2.2"]);
    assert_eq!(l4_limit(&s.get(quotas).await), Some(Value::from(24)));
    let before = pool_nodes(&nodes(&s).await);
    assert!(before < 5, "{before}");

    write(
        &file,
        "[batches]\ndefault_runtime = \"3.0\"\n\
         [provisioning]\ndefault_allocation_timeout = \"17m\"\n\
         [regions.us-central1.zones.us-central1-a.node_pools.l4]\nvirtual_nodes = 5\n\
         [[quotas]]\nproject = \"*\"\nregion = \"*\"\nmetric = \"PREEMPTIBLE_NVIDIA_L4_GPUS\"\nlimit = 40\n\
         [[quotas]]\nproject = \"*\"\nregion = \"*\"\nmetric = \"LOCAL_SSD_TOTAL_GB\"\nlimit = 30000\n",
    );
    let (st, answer) = reload(&s).await;
    assert_eq!(st, 200, "{answer}");

    assert_eq!(default_runtime(&s.get("/v1/runtimes").await), ["3.0"]);
    assert_eq!(l4_limit(&s.get(quotas).await), Some(Value::from(40)));
    assert_eq!(pool_nodes(&nodes(&s).await), 5);
    let regions = s.get("/v1/regions").await.to_string();
    assert!(regions.contains("us-central1-a"), "{regions}");
    assert_eq!(
        timeout_of(&create_default(&s, "after-reload").await),
        17 * 60
    );

    // Principals: a token added by a reload is the one that lets in.
    let mut text = std::fs::read_to_string(&file).expect("config");
    text.push_str(&format!(
        "[[principals]]\nname = \"ops@example.com\"\nrole = \"admin\"\ntoken_sha256 = \"{}\"\n",
        flexq::engine::token_hash("reloaded-token")
    ));
    write(&file, &text);
    let (st, answer) = reload(&s).await;
    assert_eq!(st, 200, "{answer}");
    let who = |token: Option<&'static str>| {
        let endpoint = s.endpoint.clone();
        async move {
            let mut r = reqwest::Client::new().get(format!("{endpoint}/v1/principal"));
            if let Some(t) = token {
                r = r.bearer_auth(t);
            }
            let r = r.send().await.expect("principal");
            (
                r.status().as_u16(),
                r.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    assert_eq!(who(None).await.0, 401);
    let (st, me) = who(Some("reloaded-token")).await;
    assert_eq!(
        (st, me["name"].as_str()),
        (200, Some("ops@example.com")),
        "{me}"
    );
}
