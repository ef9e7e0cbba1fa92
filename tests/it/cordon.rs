//! Cordon and drain: a cordoned node takes no new allocation and shows its
//! free GPUs apart; a drain waits for the running part and then shows the
//! node drained; never-fit still judges against declared capacity; the
//! cordon survives a restart; uncordon puts the node back into service.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{ServerProcess, flex_batch, flex_with, flexq_bin};

async fn node(s: &ServerProcess, id: &str) -> Value {
    let nodes = s.get("/v1/nodes").await;
    nodes["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("no node {id}: {nodes:#}"))
}

fn provisioning(b: &Value) -> &str {
    b["flexq"]["provisioningState"].as_str().unwrap_or_default()
}

/// us-central1-a's L4 row of the capacity view.
async fn l4_row(s: &ServerProcess) -> Value {
    let v = s.get("/v1/regions").await;
    v["capacity"]
        .as_array()
        .expect("capacity")
        .iter()
        .find(|r| r["zone"] == "us-central1-a" && r["accelerator"] == "l4")
        .cloned()
        .expect("us-central1-a l4")
}

/// The CLI as an admin runs it, on this server.
fn cli(s: &ServerProcess, args: &[&str]) -> (bool, String) {
    let out = Command::new(flexq_bin())
        .args(["nodes"])
        .args(args)
        .args(["--endpoint", &s.endpoint])
        .output()
        .expect("flexq nodes");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_waits_for_the_running_part_and_cordoned_nodes_take_nothing_new() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The default config: two virtual nodes of 4 L4 GPUs in us-central1-a.
    let mut s = ServerProcess::start(dir.path()).await;
    assert_eq!(s.create("running", &flex_batch()).await, 200);
    let running = s
        .until("demo", "running", |b| provisioning(b) == "PROVISIONED")
        .await;
    let busy = running["flexq"]["nodes"][0]["node"]
        .as_str()
        .expect("a node")
        .to_string();
    let idle = if busy.ends_with("/0") {
        busy.replace("/0", "/1")
    } else {
        busy.replace("/1", "/0")
    };

    // Drain the busy node with the CLI; cordon the idle one by the API
    // (a virtual node's id holds slashes: one encoded path segment).
    let (ok, out) = cli(&s, &["drain", &busy]);
    assert!(ok && out.contains("DRAINING"), "{out}");
    let (status, view) = s
        .post(&format!("/v1/nodes/{}:cordon", idle.replace('/', "%2F")))
        .await;
    assert_eq!(status, 200, "{view:#}");
    assert_eq!(view["state"], "CORDONED");
    assert_eq!(view["cordonedBy"], "anonymous");
    let drained = node(&s, &busy).await;
    assert_eq!(drained["state"], "DRAINING", "{drained:#}");
    assert_eq!(drained["runningParts"], 3);

    // Nothing new lands on either; their free GPUs show apart.
    assert_eq!(s.create("waiting", &flex_batch()).await, 200);
    let waiting = s
        .until("demo", "waiting", |b| {
            b["flexq"]["notAdmittedReasons"]
                .as_array()
                .is_some_and(|r| !r.is_empty())
        })
        .await;
    assert_eq!(provisioning(&waiting), "QUEUED", "{waiting:#}");
    let row = l4_row(&s).await;
    assert_eq!(row["freeGpus"], 0, "{row:#}");
    assert_eq!(row["cordonedGpus"], 5, "{row:#}");
    assert_eq!(row["allocatedGpus"], 3, "{row:#}");
    // Never-fit still counts the declared capacity: 8 GPUs are accepted.
    let big = flex_with("spark.executor.instances", "7");
    assert_eq!(s.create("big-one", &big).await, 200);

    // The running part ends: the drained node says so.
    let op = running["operation"]
        .as_str()
        .expect("operation")
        .to_string();
    assert_eq!(s.post(&format!("/v1/{op}:cancel")).await.0, 200);
    let t = Instant::now();
    while node(&s, &busy).await["state"] != "DRAINED" {
        assert!(t.elapsed() < Duration::from_secs(10), "never drained");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(provisioning(&s.batch("waiting").await), "QUEUED");

    // Cordons are stored: the same after a SIGKILL and restart.
    s.kill9();
    let s = ServerProcess::start(dir.path()).await;
    assert_eq!(node(&s, &busy).await["state"], "DRAINED");
    assert_eq!(node(&s, &idle).await["state"], "CORDONED");
    assert_eq!(provisioning(&s.batch("waiting").await), "QUEUED");

    // Back into service: the waiting batch is allocated there.
    let (ok, out) = cli(&s, &["uncordon", &idle]);
    assert!(ok && out.contains("SCHEDULABLE"), "{out}");
    let waiting = s
        .until("demo", "waiting", |b| provisioning(b) == "PROVISIONED")
        .await;
    assert_eq!(waiting["flexq"]["nodes"][0]["node"], idle.as_str());

    // An unknown node is named.
    let (status, body) = s.post("/v1/nodes/no-such-node:cordon").await;
    assert_eq!(status, 404, "{body:#}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("no-such-node")),
        "{body:#}"
    );
    let (ok, out) = cli(&s, &["drain", "no-such-node"]);
    assert!(!ok && out.contains("no-such-node"), "{out}");
}
