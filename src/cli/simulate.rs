//! `flexq simulate`: replay a workload trace through the scheduler core on
//! virtual time ([`crate::simulate`]), under one config or two side by side.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::Args;

use crate::config::Config;
use crate::simulate::{self, SimReport};

#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// The workload: CSV with a header, or JSON lines (docs/simulate.md).
    #[arg(long)]
    pub trace: PathBuf,
    /// The config to try (layered over the embedded default, like
    /// `flexq serve --config`).
    #[arg(long, env = "FLEXQ_CONFIG")]
    pub config: Option<PathBuf>,
    /// A second config: both run on the same trace, shown side by side.
    #[arg(long)]
    pub compare: Option<PathBuf>,
    /// Shuffles batches submitted at the same instant (0: trace order).
    /// The same seed gives the same report.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// `table` for people, `json` for scripts.
    #[arg(long, value_enum, default_value = "table")]
    pub format: SimFormat,
    /// How long a provisioned pool's new node takes to register: `3m`, or
    /// `2m..6m` (each node's drawn uniformly, by --seed).
    #[arg(long, default_value = "3m", value_parser = parse_boot_time)]
    pub boot_time: (std::time::Duration, std::time::Duration),
    /// The chance that a set of new nodes fails whole (a stock-out), from
    /// 0 to 1.
    #[arg(long, default_value_t = 0.0, value_parser = parse_stockout)]
    pub stockout: f64,
}

/// `3m`, or `2m..6m`: the shortest and longest boot time.
fn parse_boot_time(text: &str) -> Result<(std::time::Duration, std::time::Duration), String> {
    let one = |t: &str| {
        humantime::parse_duration(t.trim()).map_err(|e| {
            format!("--boot-time {text:?}: {e}; give a duration like 3m, or a range like 2m..6m")
        })
    };
    let (min, max) = match text.split_once("..") {
        Some((a, b)) => (one(a)?, one(b)?),
        None => (one(text)?, one(text)?),
    };
    if min > max {
        return Err(format!(
            "--boot-time {text:?}: the shortest is above the longest"
        ));
    }
    Ok((min, max))
}

/// A probability, 0 to 1.
fn parse_stockout(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(format!(
            "--stockout {text:?}: give the chance a set fails, from 0 to 1, like 0.05"
        )),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SimFormat {
    Table,
    Json,
}

/// Exit 2 for input that cannot be used (a config key, a trace line), 1
/// for anything else.
pub fn run(args: SimulateArgs) -> ExitCode {
    match simulate_all(&args) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("flexq simulate: {message}");
            ExitCode::from(2)
        }
    }
}

fn simulate_all(args: &SimulateArgs) -> Result<String, String> {
    let file = std::fs::File::open(&args.trace)
        .map_err(|e| format!("cannot open the trace {}: {e}", args.trace.display()))?;
    let trace = simulate::read(std::io::BufReader::new(file))
        .map_err(|e| format!("{}: {e}", args.trace.display()))?;
    let cloud = simulate::CloudModel {
        boot_min: args.boot_time.0,
        boot_max: args.boot_time.1,
        stockout: args.stockout,
        ..simulate::CloudModel::default()
    };
    let a = one(&trace, args.config.as_deref(), args.seed, &cloud)?;
    let Some(compare) = &args.compare else {
        return Ok(match args.format {
            SimFormat::Table => a.table(),
            SimFormat::Json => json(&a)?,
        });
    };
    let b = one(&trace, Some(compare), args.seed, &cloud)?;
    Ok(match args.format {
        SimFormat::Table => {
            let name = |p: Option<&Path>| {
                p.map_or("the embedded default".to_string(), |p| {
                    p.display().to_string()
                })
            };
            simulate::compare_table(&a, &b, &name(args.config.as_deref()), &name(Some(compare)))
        }
        SimFormat::Json => json(&serde_json::json!({"a": a, "b": b}))?,
    })
}

fn one(
    trace: &[simulate::TraceBatch],
    config: Option<&Path>,
    seed: u64,
    cloud: &simulate::CloudModel,
) -> Result<SimReport, String> {
    let name = config.map_or("the embedded default".into(), |p| p.display().to_string());
    let config = Config::load(config).map_err(|e| format!("invalid configuration {name}: {e}"))?;
    let started = Instant::now();
    let report = simulate::run_with(&config, trace, seed, cloud).map_err(|e| e.to_string())?;
    let took = started.elapsed().as_secs_f64();
    eprintln!(
        "simulated {} batches over {:.1} hours under {name} in {took:.2}s ({:.0} batches/s)",
        trace.len(),
        report.span_s / 3600.0,
        trace.len() as f64 / took.max(1e-9)
    );
    Ok(report)
}

fn json(v: &impl serde::Serialize) -> Result<String, String> {
    serde_json::to_string_pretty(v)
        .map(|s| s + "\n")
        .map_err(|e| e.to_string())
}
