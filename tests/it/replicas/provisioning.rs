//! Provisioned pools across a failover (docs/rules.md#provisioned-capacity),
//! on PostgreSQL: the leader SIGKILLed while a set's nodes boot (the
//! FAKE cloud of `examples/provisioner/fake-cloud.py`, agents on loopback
//! with FAKE GPUs). The next leader adopts the set: its resume program is
//! not run again, and the batch is allocated within a second of its last
//! node's registration.

use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Utc};
use flexq::config::Config;
use serde_json::Value;

use super::{Pair, leader_and_follower, leads_within};
use crate::provisioning::{Agents, gang, manifests, provisioned_pool};
use crate::support::{poll, provisioned};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_adopts_the_set_in_flight_and_no_program_runs_twice() {
    let cloud = tempfile::tempdir().expect("tempdir");
    let state = cloud.path().join("cloud");
    let state_in = state.clone();
    let _agents = Agents(state.clone());
    let Pair {
        leader: mut r0,
        follower: r1,
        guards: (database, _dir),
    } = leader_and_follower(move |dir: &Path| {
        let mut c = Config::load_without_env(None).expect("default config");
        provisioned_pool(
            &mut c,
            &state_in,
            &["--boot-delay", "4"],
            Duration::from_secs(60),
        );
        let path = dir.join("flexq.toml");
        std::fs::write(&path, toml::to_string(&c).expect("TOML")).expect("config");
        path
    })
    .await;
    // The agents register with the follower, which leads next.
    std::fs::write(state.join("server"), &r1.endpoint).expect("server file");
    assert_eq!(r1.create("gang", &gang(8)).await, 200);
    let asked = poll(
        Duration::from_secs(15),
        || async { manifests(&state, "resumed") },
        |m| !m.is_empty(),
    )
    .await
    .expect("the leader started the resume program");
    let slots: Vec<String> = asked[0]["slots"]
        .as_array()
        .expect("slots")
        .iter()
        .filter_map(|s| s.as_str().map(String::from))
        .collect();
    assert_eq!(slots.len(), 4, "{asked:#?}");
    // Mid-provisioning, once the cloud started every node (the program's
    // own end is not waited for): the nodes boot for 4 s more.
    let started = poll(
        Duration::from_secs(10),
        || async {
            slots
                .iter()
                .filter(|slot| state.join(format!("{slot}.pid")).exists())
                .count()
        },
        |n| *n == slots.len(),
    )
    .await;
    assert!(started.is_ok(), "the cloud started {started:?} nodes");
    r0.kill9();
    leads_within(&r1, Duration::from_secs(15)).await;
    let url = format!(
        "{}/v1/projects/demo/locations/us-central1/batches/gang",
        r1.endpoint
    );
    // Agents that found no leader retry every 10 s at most: within the
    // set's minute on a loaded machine, not within a fixed 30 s.
    let b = poll(
        Duration::from_secs(50),
        || async {
            match reqwest::get(&url).await {
                Ok(r) => r.json::<Value>().await.unwrap_or(Value::Null),
                Err(_) => Value::Null,
            }
        },
        provisioned,
    )
    .await
    .unwrap_or_else(|b| {
        let logs: Vec<String> = slots
            .iter()
            .map(|slot| {
                let log =
                    std::fs::read_to_string(state.join(slot).join("agent.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(8).collect();
                format!(
                    "{slot}:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect();
        panic!(
            "not allocated by the new leader: {b:#}\n{}",
            logs.join("\n")
        )
    });
    let mut on: Vec<&str> = b["flexq"]["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|n| n["node"].as_str())
        .collect();
    on.sort();
    on.dedup();
    assert_eq!(on, slots.iter().map(String::as_str).collect::<Vec<_>>());
    // The resume program ran once, for each slot once.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let all = manifests(&state, "resumed");
    assert_eq!(all.len(), 1, "the resume program ran again: {all:#?}");
    // The allocation followed the last registration within a second.
    let db = sqlx::PgPool::connect(&database.url).await.expect("connect");
    let mut last = 0i64;
    for slot in &slots {
        let at: i64 = sqlx::query_scalar("select registered_at from nodes where node_id = $1")
            .bind(slot)
            .fetch_one(&db)
            .await
            .expect("registered");
        last = last.max(at);
    }
    db.close().await;
    let registered = DateTime::<Utc>::from_timestamp_micros(last).expect("a time");
    let allocated: DateTime<Utc> = b["flexq"]["allocateTime"]
        .as_str()
        .expect("allocateTime")
        .parse()
        .expect("RFC 3339");
    let after = allocated - registered;
    assert!(
        after >= chrono::Duration::zero() && after < chrono::Duration::seconds(1),
        "allocated {after} after the last registration ({registered} → {allocated})"
    );
}
