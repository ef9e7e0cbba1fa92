//! `flexq simulate` as an operator runs it: the example trace under the
//! example configs, side by side and as JSON; bad input named by line or
//! key with exit code 2; and the example trace is what its generator
//! writes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::support::flexq_bin;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn simulate(args: &[&str]) -> Output {
    Command::new(flexq_bin())
        .arg("simulate")
        .args(args)
        .env_remove("FLEXQ_CONFIG")
        .output()
        .expect("flexq simulate")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn the_example_week_runs_alone_side_by_side_and_as_json() {
    let week = repo("examples/traces/week.csv");
    let week = week.to_str().expect("utf-8 path");
    let out = simulate(&["--trace", week, "--format", "json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["order"], "fair-share");
    let projects = report["projects"].as_object().expect("projects");
    assert_eq!(
        projects.keys().collect::<Vec<_>>(),
        ["etl", "research", "training"]
    );
    let submitted: u64 = projects
        .values()
        .map(|p| p["submitted"].as_u64().expect("count"))
        .sum();
    let lines = std::fs::read_to_string(week)
        .expect("trace")
        .lines()
        .count() as u64;
    assert_eq!(submitted, lines - 1, "every line but the header");
    assert_eq!(report["total"]["submitted"], submitted);
    let shares: f64 = projects
        .values()
        .map(|p| p["gpuShare"].as_f64().expect("share"))
        .sum();
    assert!((shares - 1.0).abs() < 1e-9, "{shares}");
    assert!(
        text(&out.stderr).contains("batches/s"),
        "{}",
        text(&out.stderr)
    );

    let strict = repo("examples/traces/strict.toml");
    let fair = repo("examples/traces/fair.toml");
    let out = simulate(&[
        "--trace",
        week,
        "--config",
        strict.to_str().expect("path"),
        "--compare",
        fair.to_str().expect("path"),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(
        table.contains("order strict") && table.contains("order fair-share"),
        "{table}"
    );
    for row in ["etl", "research", "training", "TOTAL", "europe-west4-a"] {
        assert!(table.lines().any(|l| l.starts_with(row)), "{row}: {table}");
    }
}

#[test]
fn bad_input_is_named_with_exit_code_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("bad.csv");
    std::fs::write(
        &trace,
        "submit_s,project,region,run_s\n0,a,europe-west4,60\nlater,a,europe-west4,60\n",
    )
    .expect("write");
    let out = simulate(&["--trace", trace.to_str().expect("path")]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("trace line 3") && err.contains("submit_s"),
        "{err}"
    );

    std::fs::write(
        &trace,
        "submit_s,project,region,run_s\n0,a,europe-west4,60\n",
    )
    .expect("write");
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "[projects.a]\nweight = -1\n").expect("write");
    let out = simulate(&[
        "--trace",
        trace.to_str().expect("path"),
        "--compare",
        config.to_str().expect("path"),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("projects.a.weight"), "{err}");

    let out = simulate(&["--trace", "/nonexistent/trace.csv"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("/nonexistent/trace.csv"));
}

#[test]
fn the_example_trace_is_what_its_generator_writes() {
    let out = Command::new("python3")
        .arg(repo("examples/traces/generate.py"))
        .args(["--seed", "1", "--days", "7"])
        .output()
        .expect("python3");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stored = std::fs::read_to_string(repo("examples/traces/week.csv")).expect("trace");
    assert!(
        text(&out.stdout) == stored,
        "examples/traces/week.csv differs from generate.py --seed 1 --days 7: regenerate it"
    );
}
