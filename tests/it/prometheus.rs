//! The deploy/ files against a real Prometheus scraping a real flexq:
//! `promtool check rules` and `check metrics`, then every expression of the
//! dashboard and of the alert rules evaluated through Prometheus's query
//! API after the metrics scenario — each must parse and return series.
//!
//! Prometheus comes from the distribution's package: `scripts/test`
//! installs it under target/tools (or set FLEXQ_PROMETHEUS_DIR).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::metrics::{
    gpu_scenario, loan_scenario, preempting, preemption_scenario, provisioning_scenario, scenario,
    server, server_lending,
};

/// The region of the dashboard test's scenario: no other test uses it, so
/// its series in the process-wide counters are this test's alone.
const REGION: &str = "qtest-east1";

fn tool(name: &str) -> PathBuf {
    let dirs = [
        std::env::var("FLEXQ_PROMETHEUS_DIR")
            .ok()
            .map(PathBuf::from),
        Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tools/prometheus/usr/bin")),
        Some(PathBuf::from("/usr/bin")),
    ];
    dirs.into_iter()
        .flatten()
        .map(|d| d.join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{name} not found: run scripts/test, which installs Prometheus from the distribution's package into target/tools"))
}

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(path)
}

/// `a > 0.9` → `a > bool 0.9`: the comparison as 0/1 per series, so an
/// alert that does not fire still shows that its expression has data.
fn as_bool(expr: &str) -> String {
    let bytes = expr.as_bytes();
    let mut depth = 0i32;
    let mut last = None;
    for (i, b) in bytes.iter().enumerate() {
        match b {
            b'(' | b'{' | b'[' => depth += 1,
            b')' | b'}' | b']' => depth -= 1,
            b'>' | b'<' if depth == 0 => last = Some(i + 1),
            b'=' if depth == 0 && i > 0 && bytes[i - 1] == b'=' => last = Some(i + 1),
            _ => {}
        }
    }
    let at = last.unwrap_or_else(|| panic!("no top-level comparison in alert expression {expr}"));
    format!("{} bool{}", &expr[..at], &expr[at..])
}

struct Prometheus {
    child: std::process::Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_prometheus(target: &str) -> Prometheus {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: flexq\n    static_configs:\n      - targets: [\"{target}\"]\n",
            deploy("prometheus/rules.yml").display()
        ),
    )
    .expect("config");
    let child = Command::new(tool("prometheus"))
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start prometheus");
    Prometheus {
        child,
        url: format!("http://127.0.0.1:{port}"),
        _dir: dir,
    }
}

async fn try_query(p: &Prometheus, expr: &str) -> Option<Value> {
    reqwest::Client::new()
        .get(format!("{}/api/v1/query", p.url))
        .query(&[("query", expr)])
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()
}

async fn query(p: &Prometheus, expr: &str) -> Value {
    try_query(p, expr).await.expect("Prometheus answers")
}

fn series(answer: &Value) -> usize {
    answer["data"]["result"].as_array().map_or(0, Vec::len)
}

/// The series of a query's answer.
fn results(answer: &Value) -> impl Iterator<Item = &Value> {
    answer["data"]["result"].as_array().into_iter().flatten()
}

/// Whether some series of the answer carries `label`.
fn has_label(answer: &Value, label: &str) -> bool {
    results(answer).any(|r| r["metric"].get(label).is_some())
}

/// Whether some series of the answer is of `region`.
fn has_region(answer: &Value, region: &str) -> bool {
    results(answer).any(|r| r["metric"]["region"] == region)
}

#[tokio::test]
async fn the_rules_and_the_exposition_pass_promtool() {
    let out = Command::new(tool("promtool"))
        .args(["check", "rules"])
        .arg(deploy("prometheus/rules.yml"))
        .output()
        .expect("promtool");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let s = server("ptest-east1").await;
    scenario(&s, "ptest-east1").await;
    let text = s.scrape().await;
    let mut child = Command::new(tool("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("write");
    }
    let out = child.wait_with_output().expect("promtool");
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn every_dashboard_and_alert_expression_has_data_in_a_real_prometheus() {
    // Preemption on, and one preemption: its panels and alert have data.
    let cloud = tempfile::tempdir().expect("tempdir");
    let s = server_lending(REGION, preempting(), cloud.path()).await;
    scenario(&s, REGION).await;
    preemption_scenario(&s, REGION).await;
    // A loan reclaimed, and one held: the loans panels have data.
    loan_scenario(&s, REGION).await;
    // An agent's node joins and uploads GPU points: the telemetry panels
    // and alert have data.
    gpu_scenario(&s, REGION).await;
    // A set of new nodes fails (a stock-out), the next is allocated: the
    // provisioning panels and alert have data.
    provisioning_scenario(&s, REGION, cloud.path()).await;
    let prom = start_prometheus(&s.metrics_addr.to_string());
    // Wait for several scrapes of flexq (rates need two samples).
    let t = Instant::now();
    loop {
        // Prometheus may still be starting: no answer yet is fine here.
        let up = try_query(&prom, "count_over_time(up{job=\"flexq\"}[1m])")
            .await
            .unwrap_or_default();
        let samples = up["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        if samples >= 4.0 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "Prometheus did not scrape flexq: {up}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(deploy("grafana/dashboards/flexq.json")).expect("dashboard"),
    )
    .expect("json");
    let mut exprs: Vec<String> = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            exprs.push(target["expr"].as_str().expect("expr").to_string());
        }
    }
    for var in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        // label_values(metric, label): the metric must have series.
        let q = var["query"]["query"].as_str().expect("query");
        let metric = q
            .trim_start_matches("label_values(")
            .split(',')
            .next()
            .expect("metric")
            .trim();
        exprs.push(metric.to_string());
    }
    let rules: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(deploy("prometheus/rules.yml")).expect("rules"),
    )
    .expect("yaml");
    let mut alerts = 0;
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            exprs.push(as_bool(rule["expr"].as_str().expect("expr")));
            alerts += 1;
        }
    }
    const ALERTS: usize = 13;
    assert_eq!(alerts, ALERTS);
    assert!(exprs.len() > 25, "{}", exprs.len());

    let mut failures = Vec::new();
    for expr in &exprs {
        // The dashboard as if this test's region (and its one GPU type)
        // were picked, not "All": the process's counters hold every
        // parallel test's regions, and with `.*` their series would give
        // a panel data that this scenario failed to make.
        let concrete = expr
            .replace("$region", REGION)
            .replace("$accelerator", "l4")
            .replace("$__rate_interval", "1m");
        let answer = query(&prom, &concrete).await;
        if answer["status"] != "success" {
            failures.push(format!("{concrete}: {}", answer["error"]));
        } else if series(&answer) == 0 {
            failures.push(format!("{concrete}: no series"));
        } else if has_label(&answer, "region") && !has_region(&answer, REGION) {
            // An alert sums by region over every region: this test's own
            // must be among them, not only other tests'.
            failures.push(format!("{concrete}: no series of {REGION}: {answer}"));
        }
    }
    assert!(
        failures.is_empty(),
        "expressions without data:\n{}",
        failures.join("\n")
    );

    // Prometheus loaded and evaluates every rule without error.
    let t = Instant::now();
    loop {
        let rules: Value = reqwest::get(format!("{}/api/v1/rules", prom.url))
            .await
            .expect("rules")
            .json()
            .await
            .expect("json");
        let all: Vec<&Value> = rules["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .collect();
        if all.len() == ALERTS && all.iter().all(|r| r["health"] == "ok") {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "rules not healthy: {rules:#}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[test]
fn alert_expressions_are_turned_into_bool_comparisons() {
    assert_eq!(as_bool("max by (r) (x) > 0.9"), "max by (r) (x) > bool 0.9");
    assert_eq!(as_bool("a / (b > 0) > 0.9"), "a / (b > 0) > bool 0.9");
    assert_eq!(as_bool("up{job=\"x\"} < 1"), "up{job=\"x\"} < bool 1");
}
