//! Node registration, heartbeats and leases through the HTTP API.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{TestServer, assert_status, flex_with};

fn node(id: &str, gpus: u32) -> Value {
    json!({
        "nodeId": id, "region": "us-central1", "zone": "us-central1-b", "pool": "l4",
        "gpuAddresses": (0..gpus).map(|i| i.to_string()).collect::<Vec<_>>(),
        "cores": 96, "memoryMb": 393216, "localSsdGb": 3000
    })
}

async fn post(s: &TestServer, path: &str, body: &Value) -> (u16, Value) {
    let r = s
        .http
        .post(s.url(path))
        .json(body)
        .send()
        .await
        .expect("post");
    let st = r.status().as_u16();
    (st, r.json().await.expect("json"))
}

/// A server whose only capacity is what agents register (us-central1-b
/// declares 4 nodes of 8 L4s), with a 1s lease.
async fn server() -> TestServer {
    TestServer::start_with(|c| {
        c.agents.lease_duration = Duration::from_secs(1);
        for region in c.regions.values_mut() {
            for zone in region.zones.values_mut() {
                for pool in zone.node_pools.values_mut() {
                    pool.virtual_nodes = 0;
                }
            }
        }
    })
    .await
}

#[tokio::test]
async fn a_registered_node_is_capacity_and_its_lost_lease_fails_its_batches() {
    let s = server().await;
    let (st, reg) = post(&s, "/v1/nodes:register", &node("gpu-host-1", 8)).await;
    assert_eq!(st, 200, "{reg:#}");
    let epoch = reg["epoch"]
        .as_str()
        .expect("epoch as int64 string")
        .to_string();
    assert_eq!(reg["leaseDuration"], "1s");
    let (_, nodes) = s.get("/v1/nodes").await;
    let n = &nodes["nodes"].as_array().expect("nodes")[0];
    assert_eq!(
        (
            n["id"].as_str(),
            n["virtual"].as_bool(),
            n["freeGpus"].as_u64()
        ),
        (Some("gpu-host-1"), Some(false), Some(8))
    );

    // A batch lands on it while the agent heartbeats.
    let (st, _) = s
        .create(
            "batchId=on-agent",
            &flex_with("spark.executor.instances", "4"),
        )
        .await;
    assert_eq!(st, 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (st, hb) = post(
            &s,
            "/v1/nodes/gpu-host-1:heartbeat",
            &json!({"epoch": epoch}),
        )
        .await;
        assert_eq!(st, 200, "{hb:#}");
        let (_, b) = s
            .get("/v1/projects/demo/locations/us-central1/batches/on-agent")
            .await;
        if b["flexq"]["provisioningState"] == "PROVISIONED" {
            assert!(
                b["flexq"]["nodes"]
                    .as_array()
                    .expect("nodes")
                    .iter()
                    .all(|p| p["node"] == "gpu-host-1" && p["isVirtual"] == false)
            );
            break;
        }
        assert!(Instant::now() < deadline, "{b:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Heartbeats keep it across several lease lengths.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            post(
                &s,
                "/v1/nodes/gpu-host-1:heartbeat",
                &json!({"epoch": epoch})
            )
            .await
            .0,
            200
        );
    }

    // The agent goes silent: after the lease, the batch fails saying why
    // and the node's capacity leaves.
    let silent = Instant::now();
    let b = loop {
        let (_, b) = s
            .get("/v1/projects/demo/locations/us-central1/batches/on-agent")
            .await;
        if b["state"] == "FAILED" {
            break b;
        }
        assert!(silent.elapsed() < Duration::from_secs(10), "{b:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        silent.elapsed() < Duration::from_secs(3),
        "lost within about a lease: {:?}",
        silent.elapsed()
    );
    let msg = b["stateMessage"].as_str().expect("message");
    assert!(
        msg.starts_with(
            "Node gpu-host-1 was lost: its agent stopped heartbeating and its lease expired at"
        ),
        "{msg}"
    );
    let (_, nodes) = s.get("/v1/nodes").await;
    assert!(nodes["nodes"].as_array().expect("nodes").is_empty());
    let (_, q) = s.get("/v1/projects/demo/regions/us-central1/quotas").await;
    assert!(
        q["quotas"]
            .as_array()
            .expect("q")
            .iter()
            .all(|m| m["usage"] == 0),
        "quota given back: {q:#}"
    );

    // A late report from the lost agent is refused.
    let (st, err) = post(
        &s,
        "/v1/nodes/gpu-host-1:heartbeat",
        &json!({"epoch": epoch}),
    )
    .await;
    assert_status(st, &err, 400, "FAILED_PRECONDITION");

    // It registers again: a new epoch; the old one is fenced.
    let (_, again) = post(&s, "/v1/nodes:register", &node("gpu-host-1", 8)).await;
    let new_epoch = again["epoch"].as_str().expect("epoch");
    assert_ne!(new_epoch, epoch);
    let (st, err) = post(
        &s,
        "/v1/nodes/gpu-host-1:heartbeat",
        &json!({"epoch": epoch}),
    )
    .await;
    assert_status(st, &err, 409, "ABORTED");
    assert_eq!(
        post(
            &s,
            "/v1/nodes/gpu-host-1:heartbeat",
            &json!({"epoch": new_epoch})
        )
        .await
        .0,
        200
    );
}

#[tokio::test]
async fn bad_registrations_are_refused_by_name() {
    let s = server().await;
    let mut unknown = node("gpu-x", 8);
    unknown["pool"] = json!("h100");
    let (st, err) = post(&s, "/v1/nodes:register", &unknown).await;
    assert_status(st, &err, 400, "FAILED_PRECONDITION");

    let (st, err) = post(&s, "/v1/nodes:register", &node("gpu-blind", 0)).await;
    assert_status(st, &err, 400, "FAILED_PRECONDITION");
    assert!(
        err["error"]["message"]
            .as_str()
            .expect("m")
            .contains("cannot be seen is not offered")
    );

    let (st, err) = post(&s, "/v1/nodes:register", &node("gpu-big", 9)).await;
    assert_status(st, &err, 400, "INVALID_ARGUMENT");
    let mut dup = node("gpu-dup", 2);
    dup["gpuAddresses"] = json!(["0", "0"]);
    let (st, err) = post(&s, "/v1/nodes:register", &dup).await;
    assert_status(st, &err, 400, "INVALID_ARGUMENT");
    let (st, err) = post(&s, "/v1/nodes:register", &node("Bad Name", 8)).await;
    assert_status(st, &err, 400, "INVALID_ARGUMENT");

    for i in 0..4 {
        assert_eq!(
            post(&s, "/v1/nodes:register", &node(&format!("gpu-{i}"), 8))
                .await
                .0,
            200
        );
    }
    let (st, err) = post(&s, "/v1/nodes:register", &node("gpu-5", 8)).await;
    assert_status(st, &err, 429, "RESOURCE_EXHAUSTED");
    assert_eq!(
        post(&s, "/v1/nodes:register", &node("gpu-0", 8)).await.0,
        200,
        "re-registration is not a new node"
    );

    let (st, err) = post(&s, "/v1/nodes/gpu-0:heartbeat", &json!({"epoch": "soon"})).await;
    assert_status(st, &err, 400, "INVALID_ARGUMENT");
    let (st, err) = post(&s, "/v1/nodes/nobody:heartbeat", &json!({"epoch": 1})).await;
    assert_status(st, &err, 400, "FAILED_PRECONDITION");
    let (st, err) = post(&s, "/v1/nodes/gpu-0:explode", &json!({"epoch": 1})).await;
    assert_status(st, &err, 404, "NOT_FOUND");
}
