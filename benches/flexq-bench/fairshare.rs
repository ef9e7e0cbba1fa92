//! `flexq-bench fairshare`: what fair-share order costs the core, beside
//! the strict order, and how fast the simulator replays a week.
//!
//! 1. The core alone, 50 regions × 3 zones, `pending` queued batches of
//!    mixed shapes spread over `projects` projects: one admission pass
//!    after a release, under strict and fair-share order in turns
//!    (S F F S …, the same releases for both), and the ratio.
//! 2. `flexq simulate` on `batches` batches over a simulated week (the
//!    same mixed shapes, `projects` projects, 50 regions): batches/s.

use std::time::Instant;

use chrono::Utc;
use hdrhistogram::Histogram;

use flexq::cli::CliError;
use flexq::config::{Config, QueueOrder};

use flexq::simulate::TraceBatch;
use flexq::spec::Request;

use crate::schedule::{
    bench_config, cluster_of, err, histogram, ms, queued_core, region_of, shaped_batch,
};

#[derive(Debug, Clone)]
pub(crate) struct FairShareOptions {
    pub pending: usize,
    pub releases: usize,
    pub projects: usize,
    pub rounds: usize,
    pub batches: usize,
}

pub(crate) async fn run(opts: FairShareOptions) -> Result<(), CliError> {
    println!(
        "flexq-bench fairshare — {} ({} pending over {} projects, {} releases × {} rounds per order)",
        Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        opts.pending,
        opts.projects,
        opts.releases,
        opts.rounds
    );
    let dir = tempfile::tempdir().map_err(err)?;
    let mut strict = histogram();
    let mut fair = histogram();
    for round in 0..opts.rounds {
        // Turns: S F, then F S, so drift on the machine hits both alike.
        let turns = if round % 2 == 0 {
            [QueueOrder::Strict, QueueOrder::FairShare]
        } else {
            [QueueOrder::FairShare, QueueOrder::Strict]
        };
        for order in turns {
            let mut config = bench_config(7, dir.path())?;
            config.scheduling.order = order;
            let h = match order {
                QueueOrder::Strict => &mut strict,
                QueueOrder::FairShare => &mut fair,
            };
            passes(&config, &opts, h)?;
        }
    }
    println!("\n[core] pass after one release, {} pending", opts.pending);
    for (name, h) in [("strict", &strict), ("fair-share", &fair)] {
        println!(
            "  {name:<10} p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms  ({} passes)",
            ms(h, 0.5),
            ms(h, 0.99),
            h.max() as f64 / 1000.0,
            h.len()
        );
    }
    println!(
        "  fair-share ÷ strict: p50 {:.2}  p99 {:.2}",
        ms(&fair, 0.5) / ms(&strict, 0.5).max(1e-9),
        ms(&fair, 0.99) / ms(&strict, 0.99).max(1e-9)
    );
    simulate(&opts, dir.path())
}

/// One core with the queue filled, then `releases` release-and-pass steps.
fn passes(
    config: &Config,
    opts: &FairShareOptions,
    h: &mut Histogram<u64>,
) -> Result<(), CliError> {
    let policy = config.policy();
    let clusters: Vec<Request> = (0..opts.pending)
        .map(|i| cluster_of(&policy, i, 7200))
        .collect::<Result<_, _>>()?;
    let now = Utc::now();
    let projects = opts.projects;
    let mut core = queued_core(
        config,
        clusters,
        |i| format!("team-{:02}", i % projects),
        now,
    );
    core.pass(now);
    let mut later = now;
    for k in 0..opts.releases {
        later += chrono::Duration::seconds(1);
        if !crate::schedule::release(&mut core, k, later) {
            break;
        }
        let t = Instant::now();
        core.pass(later);
        let _ = h.record(t.elapsed().as_micros().max(1) as u64);
    }
    Ok(())
}

/// The simulator on a week of `batches` batches.
fn simulate(opts: &FairShareOptions, dir: &std::path::Path) -> Result<(), CliError> {
    let config = bench_config(7, dir)?;
    let week = 7.0 * 86400.0;
    let trace: Vec<TraceBatch> = (0..opts.batches)
        .map(|i| TraceBatch {
            line: i + 2,
            submit_s: week * i as f64 / opts.batches as f64,
            project: format!("team-{:02}", i % opts.projects),
            region: region_of(i),
            // 20 minutes to 3 hours, cut at the batch's ttl.
            run_s: 1200.0 + ((i * 7919) % 9600) as f64,
            batch: shaped_batch(i, 3600),
            demand: Default::default(),
        })
        .collect();
    let t = Instant::now();
    let report = flexq::simulate::run(&config, &trace, 0).map_err(err)?;
    let took = t.elapsed().as_secs_f64();
    println!(
        "\n[simulate] {} batches, {} projects, {:.0} simulated hours: {took:.2} s, {:.0} batches/s ({} allocated, {} expired)",
        opts.batches,
        opts.projects,
        report.span_s / 3600.0,
        opts.batches as f64 / took,
        report.total.allocated,
        report.total.expired
    );
    Ok(())
}
