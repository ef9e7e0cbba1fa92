//! Workload traces: one batch per line, as CSV (with a header) or JSON
//! lines. Each line becomes a Dataproc `Batch` and goes through the same
//! rules as a create ([`crate::spec::validate`]); docs/simulate.md lists
//! the columns.

use std::collections::BTreeMap;
use std::io::BufRead;

use serde::Deserialize;
use serde_json::json;

use crate::api::Batch;

/// One line of a trace, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// Seconds from the start of the trace.
    pub submit_s: f64,
    pub project: String,
    pub region: String,
    /// How long the batch runs once its cluster is allocated (cut at its
    /// ttl, as the agent would).
    pub run_s: f64,
    /// `allocationTimeout`, like `"3600s"`. Empty: the config's default.
    #[serde(default)]
    pub allocation_timeout: Option<String>,
    /// GPU type of the driver and executors (`l4`, `a100-40`, `a100-80`).
    /// Default `l4`.
    #[serde(default)]
    pub accelerator: Option<String>,
    /// `spark.executor.instances`. Default 2.
    #[serde(default)]
    pub executors: Option<u32>,
    /// `spark.executor.cores`. Default the GPU type's.
    #[serde(default)]
    pub executor_cores: Option<u32>,
    /// The `flexq-priority` label.
    #[serde(default)]
    pub priority: Option<i32>,
    /// `runtimeConfig.version`. Default `3.0` (queue mode).
    #[serde(default)]
    pub runtime: Option<String>,
    /// `environmentConfig.executionConfig.ttl`, like `"4h"`.
    #[serde(default)]
    pub ttl: Option<String>,
    /// Spark's dynamic allocation on, up to this many executors
    /// (`spark.dynamicAllocation.maxExecutors`): the batch is elastic.
    #[serde(default)]
    pub max_executors: Option<u32>,
    /// The executors Spark wants once its peak is over (with
    /// `max_executors`, also its `minExecutors`). Default: `executors`.
    #[serde(default)]
    pub min_executors: Option<u32>,
    /// The share of its run (above 0, at most 1) during which Spark wants
    /// all its executors (`max_executors`, else `executors`); after it,
    /// `min_executors`. Default 1.
    #[serde(default)]
    pub peak_share: Option<f64>,
    /// JSON lines only: more `runtimeConfig.properties`, applied last.
    #[serde(default)]
    pub properties: Option<BTreeMap<String, String>>,
}

/// A trace line read and turned into a batch.
#[derive(Debug, Clone)]
pub struct TraceBatch {
    /// 1-based line of the file (the header is line 1 of a CSV).
    pub line: usize,
    pub submit_s: f64,
    pub project: String,
    pub region: String,
    pub run_s: f64,
    pub batch: Batch,
    /// What Spark wants over the run.
    pub demand: Demand,
}

/// What Spark of a trace batch wants over its run: all its executors for
/// the first `peak_share` of it, then `after_peak` executors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Demand {
    pub peak_share: f64,
    pub after_peak: Option<u32>,
}

impl Default for Demand {
    /// All its executors for the whole run.
    fn default() -> Demand {
        Demand {
            peak_share: 1.0,
            after_peak: None,
        }
    }
}

/// A trace that cannot be read: the line and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("trace line {line}: {message}")]
pub struct TraceError {
    pub line: usize,
    pub message: String,
}

/// The accepted form, for error messages.
const FORM: &str = "a CSV with the header submit_s,project,region,run_s[,allocation_timeout,accelerator,executors,executor_cores,priority,runtime,ttl,max_executors,min_executors,peak_share] or JSON lines with those keys (and properties)";

/// Reads a trace: JSON lines when the first non-blank character is `{`,
/// CSV otherwise.
pub fn read(reader: impl BufRead) -> Result<Vec<TraceBatch>, TraceError> {
    let text = std::io::read_to_string(reader).map_err(|e| TraceError {
        line: 0,
        message: format!("cannot be read: {e}"),
    })?;
    if text.trim_start().starts_with('{') {
        read_json_lines(&text)
    } else {
        read_csv(&text)
    }
}

fn read_json_lines(text: &str) -> Result<Vec<TraceBatch>, TraceError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        if raw.trim().is_empty() || raw.trim_start().starts_with('#') {
            continue;
        }
        let record: Record = serde_json::from_str(raw).map_err(|e| TraceError {
            line,
            message: format!("{e}; expected {FORM}"),
        })?;
        out.push(to_batch(record, line)?);
    }
    Ok(out)
}

fn read_csv(text: &str) -> Result<Vec<TraceBatch>, TraceError> {
    // Comment and blank lines are dropped here rather than by the csv
    // reader, whose positions would then not be the file's lines: `lines`
    // maps a line of what the reader sees back to the file's.
    let mut lines = vec![0];
    let mut kept = String::with_capacity(text.len());
    for (i, raw) in text.lines().enumerate() {
        if raw.trim().is_empty() || raw.trim_start().starts_with('#') {
            continue;
        }
        lines.push(i + 1);
        kept.push_str(raw);
        kept.push('\n');
    }
    let file_line = |seen: u64| {
        usize::try_from(seen)
            .ok()
            .and_then(|s| lines.get(s).copied())
            .unwrap_or(0)
    };
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(kept.as_bytes());
    let failed = |e: &csv::Error, line: usize| TraceError {
        line,
        message: format!("{}; expected {FORM}", csv_message(e)),
    };
    let headers = reader
        .headers()
        .map_err(|e| failed(&e, file_line(1)))?
        .clone();
    let mut out = Vec::new();
    for row in reader.records() {
        let row = row.map_err(|e| failed(&e, file_line(e.position().map_or(0, |p| p.line()))))?;
        let line = file_line(row.position().map_or(0, |p| p.line()));
        let record: Record = row
            .deserialize(Some(&headers))
            .map_err(|e| failed(&e, line))?;
        out.push(to_batch(record, line)?);
    }
    Ok(out)
}

/// The csv crate's message without its own position (we give the line).
fn csv_message(e: &csv::Error) -> String {
    match e.kind() {
        csv::ErrorKind::Deserialize { err, .. } => match err.field() {
            Some(f) => format!("field {}: {}", f + 1, err.kind()),
            None => err.kind().to_string(),
        },
        csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => format!("{len} fields where the header has {expected_len}"),
        _ => e.to_string(),
    }
}

/// The longest time a trace may span, and a batch run: ten years, in
/// seconds.
pub(crate) const MAX_SECONDS: f64 = 10.0 * 365.0 * 86400.0;

fn to_batch(r: Record, line: usize) -> Result<TraceBatch, TraceError> {
    let bad = |message: String| TraceError { line, message };
    if !(0.0..=MAX_SECONDS).contains(&r.submit_s) {
        return Err(bad(format!(
            "submit_s {} is not a time: seconds from the start of the trace, from 0 to {MAX_SECONDS} (ten years)",
            r.submit_s
        )));
    }
    if !(0.0..=MAX_SECONDS).contains(&r.run_s) {
        return Err(bad(format!(
            "run_s {} is not a run time: seconds, from 0 to {MAX_SECONDS} (ten years)",
            r.run_s
        )));
    }
    let accelerator = r.accelerator.unwrap_or_else(|| "l4".into());
    let mut properties: BTreeMap<String, String> = BTreeMap::new();
    for part in ["driver", "executor"] {
        properties.insert(
            format!("spark.dataproc.{part}.resource.accelerator.type"),
            accelerator.clone(),
        );
        if let Some(t) = &r.allocation_timeout {
            properties.insert(
                format!("spark.dataproc.{part}.provisioning.allocationTimeout"),
                t.clone(),
            );
        }
    }
    properties.insert(
        "spark.dataproc.executor.compute.tier".into(),
        "premium".into(),
    );
    properties.insert("spark.dataproc.executor.disk.tier".into(), "premium".into());
    properties.insert(
        "spark.executor.instances".into(),
        r.executors.unwrap_or(2).to_string(),
    );
    if let Some(c) = r.executor_cores {
        properties.insert("spark.executor.cores".into(), c.to_string());
    }
    if let Some(max) = r.max_executors {
        properties.insert("spark.dynamicAllocation.enabled".into(), "true".into());
        properties.insert(
            "spark.dynamicAllocation.maxExecutors".into(),
            max.to_string(),
        );
        if let Some(min) = r.min_executors {
            properties.insert(
                "spark.dynamicAllocation.minExecutors".into(),
                min.to_string(),
            );
        }
    }
    let peak_share = r.peak_share.unwrap_or(1.0);
    if !(peak_share > 0.0 && peak_share <= 1.0) {
        return Err(bad(format!(
            "peak_share {peak_share} is not a share of the run: above 0, at most 1, like 0.3"
        )));
    }
    let demand = Demand {
        peak_share,
        after_peak: r.min_executors,
    };
    properties.extend(r.properties.unwrap_or_default());
    let mut batch = json!({
        "pysparkBatch": {"mainPythonFileUri": "gs://simulated/job.py"},
        "runtimeConfig": {
            "version": r.runtime.unwrap_or_else(|| "3.0".into()),
            "properties": properties,
        },
    });
    if let Some(p) = r.priority {
        batch["labels"] = json!({"flexq-priority": p.to_string()});
    }
    if let Some(ttl) = r.ttl {
        batch["environmentConfig"] = json!({"executionConfig": {"ttl": ttl}});
    }
    let batch: Batch =
        serde_json::from_value(batch).map_err(|e| bad(format!("is not a batch: {e}")))?;
    Ok(TraceBatch {
        line,
        submit_s: r.submit_s,
        project: r.project,
        region: r.region,
        run_s: r.run_s,
        batch,
        demand,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_and_json_lines_read_alike() {
        let csv = "submit_s,project,region,run_s,allocation_timeout,executors,priority\n\
                   0,a,europe-west4,600,1800s,4,\n\
                   # a comment\n\
                   12.5,b,europe-west4,60,,,3\n";
        let jsonl = "{\"submit_s\":0,\"project\":\"a\",\"region\":\"europe-west4\",\"run_s\":600,\"allocation_timeout\":\"1800s\",\"executors\":4}\n\
                     {\"submit_s\":12.5,\"project\":\"b\",\"region\":\"europe-west4\",\"run_s\":60,\"priority\":3}\n";
        let a = read(csv.as_bytes()).expect("csv");
        let b = read(jsonl.as_bytes()).expect("jsonl");
        assert_eq!(a.len(), 2);
        assert_eq!(b.len(), 2);
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.batch, y.batch);
            assert_eq!((x.submit_s, x.run_s), (y.submit_s, y.run_s));
        }
        assert_eq!(a[1].batch.labels["flexq-priority"], "3");
    }

    proptest::proptest! {
        /// Whatever a line holds, reading and simulating it answers a
        /// report or an error naming a line, never a panic.
        #[test]
        fn no_line_makes_the_simulator_panic(
            submit in proptest::prop_oneof![0.0..1e6f64, proptest::num::f64::ANY],
            run in proptest::prop_oneof![0.0..1e5f64, proptest::num::f64::ANY],
            executors in proptest::option::of(0u32..2000),
            timeout in proptest::option::of("[0-9]{0,6}s?|[a-z]{1,5}"),
            accelerator in proptest::option::of("l4|a100-40|a100-80|h100|"),
            ttl in proptest::option::of("[0-9]{0,7}[smhd]?"),
            noise in proptest::option::of("[ -~]{0,40}"),
        ) {
            let mut record = serde_json::json!({
                "submit_s": submit, "project": "p", "region": "europe-west4", "run_s": run,
            });
            if let Some(e) = executors { record["executors"] = e.into(); }
            if let Some(t) = timeout { record["allocation_timeout"] = t.into(); }
            if let Some(a) = accelerator { record["accelerator"] = a.into(); }
            if let Some(t) = ttl { record["ttl"] = t.into(); }
            let text = format!("{record}\n{}\n", noise.unwrap_or_default());
            if let Ok(trace) = read(text.as_bytes()) {
                let config = crate::config::Config::load_without_env(None).expect("config");
                let _ = crate::simulate::run(&config, &trace, 1);
            }
        }
    }

    #[test]
    fn a_bad_line_is_named_with_the_accepted_form() {
        let csv = "submit_s,project,region,run_s\n0,a,r,60\n# a comment\n\nsoon,a,r,60\n";
        let e = read(csv.as_bytes()).expect_err("bad submit_s");
        assert_eq!(e.line, 5, "{e}");
        assert!(
            e.to_string().contains("submit_s,project,region,run_s"),
            "{e}"
        );
        let e = read("{\"submit_s\":0,\"project\":\"a\"}\n".as_bytes()).expect_err("missing");
        assert_eq!(e.line, 1);
        assert!(e.to_string().contains("region"), "{e}");
        let e =
            read("submit_s,project,region,run_s\n-1,a,r,60\n".as_bytes()).expect_err("negative");
        assert!(e.to_string().contains("submit_s -1"), "{e}");
        let e = read("submit_s,project,region,run_s\n0,a,r,60\n0,a,r\n".as_bytes())
            .expect_err("short row");
        assert_eq!(e.line, 3, "{e}");
        assert!(
            e.to_string().contains("3 fields where the header has 4"),
            "{e}"
        );
        let e = read("submit_s,project,region,run_s,colour\n0,a,r,60,red\n".as_bytes())
            .expect_err("unknown column");
        assert!(e.to_string().contains("colour"), "{e}");
    }
}
