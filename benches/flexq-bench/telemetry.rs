//! `flexq-bench telemetry`: GPU telemetry uploads
//! (`POST /v1/nodes/{node}:telemetry`, docs/rules.md#gpu-telemetry) beside
//! heartbeats, the cheapest call an agent makes, in turns against one
//! `flexq serve` on SQLite.
//!
//! `--nodes` agents' nodes (4 L4 GPUs each; this benchmark plays their
//! agents, no Spark) run one 3-GPU batch per node; `--clients` closed-loop
//! clients send, for `--duration` per turn, either heartbeats of their
//! nodes or uploads of one point per batch part the node holds (what an
//! agent sends about once a heartbeat). Each upload is a write
//! transaction: the batch's summary and its bounded chart.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{Value, json};

use crate::schedule::{err, histogram, ms};
use crate::submit::start_server_with;
use flexq::cli::CliError;

pub(crate) struct TelemetryOptions {
    pub nodes: usize,
    pub clients: usize,
    pub duration: Duration,
    pub rounds: usize,
}

/// One node as its agent knows it: its epoch and the batches it holds
/// parts of.
struct Node {
    id: String,
    epoch: String,
    batches: Vec<String>,
}

async fn post(client: &reqwest::Client, url: &str, body: &Value) -> Result<Value, CliError> {
    let resp = client.post(url).json(body).send().await.map_err(err)?;
    let status = resp.status();
    let body: Value = resp.json().await.map_err(err)?;
    if !status.is_success() {
        return Err(err(format!("{url}: {status} {body}")));
    }
    Ok(body)
}

pub(crate) async fn run(opts: TelemetryOptions) -> Result<(), CliError> {
    let nodes = opts.nodes.max(1);
    let extra = format!(
        "[agents]\nlease_duration = \"10m\"\n\
         [regions.europe-west4.zones.europe-west4-a.node_pools.l4]\naccelerator = \"l4\"\n\
         gpus_per_node = 4\ncores = 48\nmemory_mb = 196608\nlocal_ssd_gb = 1500\n\
         max_nodes = {nodes}\nvirtual_nodes = 0\n"
    );
    let (_server, endpoint) = start_server_with(&extra, &[]).await?;
    let client = reqwest::Client::new();
    let mut all = Vec::with_capacity(nodes);
    for i in 0..nodes {
        let id = format!("bench-node-{i}");
        let lease = post(
            &client,
            &format!("{endpoint}/v1/nodes:register"),
            &json!({"nodeId": id, "region": "europe-west4", "zone": "europe-west4-a", "pool": "l4",
                    "gpuAddresses": ["0", "1", "2", "3"], "cores": 48, "memoryMb": 196608,
                    "localSsdGb": 1500}),
        )
        .await?;
        let epoch = lease["epoch"].as_str().unwrap_or_default().to_string();
        all.push(Node {
            id,
            epoch,
            batches: Vec::new(),
        });
    }
    // One 3-GPU batch per node, 8 per project (its L4 quota is 24).
    let mut body = crate::submit::body();
    body["labels"] = json!({"bench": "telemetry"});
    for i in 0..nodes {
        let project = format!("tele-{}", i / 8);
        post(
            &client,
            &format!("{endpoint}/v1/projects/{project}/locations/europe-west4/batches"),
            &body,
        )
        .await?;
    }
    // Each node learns its parts through its poll, as an agent does.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut held = 0;
    while held < nodes * 3 {
        if Instant::now() > deadline {
            return Err(err(format!(
                "only {held} of {} parts were assigned",
                nodes * 3
            )));
        }
        held = 0;
        for n in &mut all {
            let answer = post(
                &client,
                &format!("{endpoint}/v1/nodes/{}:poll", n.id),
                &json!({"epoch": n.epoch, "version": "", "waitFor": "0s"}),
            )
            .await?;
            let parts = answer["assignments"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            held += parts.len();
            n.batches = parts
                .iter()
                .filter_map(|p| p["uuid"].as_str().map(str::to_string))
                .collect();
            n.batches.sort();
            n.batches.dedup();
        }
        if held < nodes * 3 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let all = Arc::new(all);
    println!(
        "flexq-bench telemetry — {} ({nodes} nodes, {} batch parts, {} clients, {:?} a turn, SQLite)\n",
        chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ"),
        nodes * 3,
        opts.clients,
        opts.duration
    );
    // Latencies (µs) of each kind, over every turn.
    let mut results = [("heartbeat", histogram()), ("telemetry", histogram())];
    // Points must be later than the last taken from the node: a clock
    // that only moves on.
    let tick = Arc::new(std::sync::atomic::AtomicI64::new(0));
    for round in 0..opts.rounds.max(1) {
        // Turns: heartbeat telemetry, then telemetry heartbeat.
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for kind in order {
            let latencies = turn(
                &client,
                &endpoint,
                &all,
                kind == 1,
                opts.clients,
                opts.duration,
                &tick,
            )
            .await?;
            results[kind].1.add(&latencies).map_err(err)?;
        }
    }
    let total_s = opts.duration.as_secs_f64() * opts.rounds.max(1) as f64;
    let rate = |h: &Histogram<u64>| h.len() as f64 / total_s;
    for (name, h) in &results {
        println!(
            "  {name:<10} {:>8.0} calls/s  p50 {:.2} ms  p99 {:.2} ms",
            rate(h),
            ms(h, 0.5),
            ms(h, 0.99)
        );
    }
    let [(_, beat), (_, upload)] = &results;
    println!(
        "  telemetry ÷ heartbeat: p50 {:.2}, calls/s {:.2}",
        ms(upload, 0.5) / ms(beat, 0.5).max(1e-9),
        rate(upload) / rate(beat).max(1e-9)
    );
    Ok(())
}

/// One turn: `clients` closed loops over the nodes for `duration`.
/// Answers its calls' latencies (µs).
async fn turn(
    client: &reqwest::Client,
    endpoint: &str,
    nodes: &Arc<Vec<Node>>,
    telemetry: bool,
    clients: usize,
    duration: Duration,
    tick: &Arc<std::sync::atomic::AtomicI64>,
) -> Result<Histogram<u64>, CliError> {
    let until = Instant::now() + duration;
    let mut tasks = Vec::new();
    for c in 0..clients.max(1) {
        let client = client.clone();
        let endpoint = endpoint.to_string();
        let nodes = nodes.clone();
        let tick = tick.clone();
        // Each node is one client's: its points stay in time order.
        let mine: Vec<usize> = (0..nodes.len())
            .filter(|k| k % clients.max(1) == c)
            .collect();
        if mine.is_empty() {
            continue;
        }
        tasks.push(tokio::spawn(async move {
            let mut latencies = histogram();
            let mut i = 0;
            while Instant::now() < until {
                let n = &nodes[mine[i % mine.len()]];
                i += 1;
                let started = Instant::now();
                if telemetry {
                    let t = tick.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let time = chrono::DateTime::from_timestamp(1_800_000_000 + t, 0)
                        .unwrap_or_default()
                        .to_rfc3339();
                    let batches: Vec<Value> = n
                        .batches
                        .iter()
                        .map(|uuid| {
                            json!({"uuid": uuid, "points": [{
                            "time": time, "seconds": 5.0, "gpus": 1,
                            "utilizationPercent": 60.0, "maxUtilizationPercent": 70.0,
                            "maxMemoryUsedMb": 10_000}]})
                        })
                        .collect();
                    let answer = post(
                        &client,
                        &format!("{endpoint}/v1/nodes/{}:telemetry", n.id),
                        &json!({"epoch": n.epoch, "batches": batches}),
                    )
                    .await?;
                    if answer["taken"].as_u64() != Some(batches.len() as u64) {
                        return Err(err(format!("an upload was not taken whole: {answer}")));
                    }
                } else {
                    post(
                        &client,
                        &format!("{endpoint}/v1/nodes/{}:heartbeat", n.id),
                        &json!({"epoch": n.epoch}),
                    )
                    .await?;
                }
                latencies
                    .record(started.elapsed().as_micros() as u64)
                    .map_err(err)?;
            }
            Ok::<_, CliError>(latencies)
        }));
    }
    let mut all = histogram();
    for t in tasks {
        all.add(t.await.map_err(err)??).map_err(err)?;
    }
    Ok(all)
}
