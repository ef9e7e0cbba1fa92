//! Fair-share order through the API: a light project's batch overtakes a
//! heavy project's older backlog, the reasons say so with the numbers, and
//! the order survives a SIGKILL and restart (usage is read back from the
//! stored allocations).

use std::time::Duration;

use serde_json::Value;

use crate::support::{ServerProcess, flex_batch, virtual_l4_config};

/// One virtual node of 4 L4 GPUs in us-central1-a: one 3-GPU batch (a
/// driver and 2 executors) at a time. A 30 s half-life, so what a batch
/// held a few seconds ago still counts clearly.
pub(crate) fn config(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("fair.toml");
    virtual_l4_config(&path, 1);
    let mut text = std::fs::read_to_string(&path).expect("config");
    text.push_str("[scheduling]\norder = \"fair-share\"\nusage_half_life = \"30s\"\n");
    std::fs::write(&path, text).expect("config");
    path
}

fn batch_path(project: &str, id: &str) -> String {
    format!("/v1/projects/{project}/locations/us-central1/batches/{id}")
}

async fn create(s: &str, project: &str, id: &str) {
    let r = reqwest::Client::new()
        .post(format!(
            "{s}/v1/projects/{project}/locations/us-central1/batches?batchId={id}"
        ))
        .json(&flex_batch())
        .send()
        .await
        .expect("create");
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
}

async fn get(s: &str, project: &str, id: &str) -> Value {
    reqwest::get(format!("{s}{}", batch_path(project, id)))
        .await
        .expect("get")
        .json()
        .await
        .expect("json")
}

async fn until(
    s: &str,
    project: &str,
    id: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    crate::support::poll(Duration::from_secs(20), || get(s, project, id), done)
        .await
        .unwrap_or_else(|b| panic!("{project}/{id} never {what}: {b:#}"))
}

async fn provisioned(s: &str, project: &str, id: &str) -> Value {
    until(s, project, id, "PROVISIONED", |b| {
        b["flexq"]["provisioningState"] == "PROVISIONED"
    })
    .await
}

async fn cancel(s: &str, project: &str, id: &str) {
    let b = get(s, project, id).await;
    let op = b["operation"].as_str().expect("operation").to_string();
    let r = reqwest::Client::new()
        .post(format!("{s}/v1/{op}:cancel"))
        .send()
        .await
        .expect("cancel");
    assert_eq!(r.status(), 200);
}

fn reasons(b: &Value) -> String {
    b["flexq"]["notAdmittedReasons"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(" | ")
        })
        .unwrap_or_default()
}

/// The order of the two queued batches, as positions and reasons say.
pub(crate) async fn light_goes_first(s: &str) {
    // On PostgreSQL the scheduler learns of a create through the change
    // stream: wait until both are queued in it.
    let queued = |b: &Value| b["flexq"]["queuePosition"].is_number();
    let light = until(s, "light", "light-1", "queued", queued).await;
    let heavy = until(s, "heavy", "heavy-2", "queued", queued).await;
    assert_eq!(light["flexq"]["queuePosition"], 1, "{light:#}");
    assert_eq!(heavy["flexq"]["queuePosition"], 2, "{heavy:#}");
    let why = reasons(&heavy);
    assert!(
        why.contains("behind 1 batch of 1 project in fair-share order")
            && why.contains("light 0.00; yours 0."),
        "{why}"
    );
    assert!(!reasons(&light).contains("fair-share"), "{light:#}");
    // The estimates follow the order: other-1 runs to its ttl (the
    // default 4h), then light-1, then heavy-2.
    let eta = |b: &Value| {
        b["flexq"]["estimatedStartTime"]
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .unwrap_or_else(|| panic!("an estimated start: {b:#}"))
    };
    assert!(
        eta(&heavy) - eta(&light) >= chrono::Duration::hours(4) - chrono::Duration::seconds(5),
        "light {} heavy {}",
        eta(&light),
        eta(&heavy)
    );
}

/// heavy uses the node for a few seconds while its second batch waits;
/// "other" takes the node next; then light queues after heavy-2 — and goes
/// ahead of it: heavy's past use counts, light has none (by name alone,
/// heavy would come first).
pub(crate) async fn heavy_then_light(s: &str) {
    create(s, "heavy", "heavy-1").await;
    provisioned(s, "heavy", "heavy-1").await;
    create(s, "heavy", "heavy-2").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // heavy-2 is older, but "other" has used nothing.
    create(s, "other", "other-1").await;
    let queued = until(s, "other", "other-1", "queued", |b| {
        b["flexq"]["queuePosition"].is_number()
    })
    .await;
    assert_eq!(queued["flexq"]["queuePosition"], 1, "{queued:#}");
    cancel(s, "heavy", "heavy-1").await;
    provisioned(s, "other", "other-1").await;
    let heavy = get(s, "heavy", "heavy-2").await;
    assert_eq!(heavy["flexq"]["provisioningState"], "QUEUED", "{heavy:#}");
    create(s, "light", "light-1").await;
    light_goes_first(s).await;
}

/// When the node frees, light's batch gets it; then heavy-2 is first.
pub(crate) async fn light_gets_the_node(s: &str) {
    cancel(s, "other", "other-1").await;
    provisioned(s, "light", "light-1").await;
    let heavy = get(s, "heavy", "heavy-2").await;
    assert_eq!(heavy["flexq"]["provisioningState"], "QUEUED", "{heavy:#}");
    assert_eq!(heavy["flexq"]["queuePosition"], 1, "{heavy:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_light_project_overtakes_a_heavy_backlog_and_the_order_survives_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(dir.path());
    let mut s = ServerProcess::start_with(dir.path(), Some(&config)).await;
    heavy_then_light(&s.endpoint).await;
    // The same after a SIGKILL and restart: heavy's usage is read back
    // from the stored allocations.
    s.kill9();
    let s = ServerProcess::start_with(dir.path(), Some(&config)).await;
    light_goes_first(&s.endpoint).await;
    light_gets_the_node(&s.endpoint).await;
}
