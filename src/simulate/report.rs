//! What a simulation shows: per project and in total, waits, expiries and
//! GPU-hours against weight; per zone, GPU utilisation. As a table for
//! people, JSON for scripts, and two configs side by side.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::config::{Config, QueueOrder};
use crate::scheduler::{Allocation, Scheduler};
use crate::stats::percentile;

/// The outcome of one simulation.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SimReport {
    /// `fair-share` or `strict`.
    pub order: String,
    pub usage_half_life_s: u64,
    /// From the first submission to the last event, in seconds.
    pub span_s: f64,
    pub projects: BTreeMap<String, ProjectStats>,
    pub total: ProjectStats,
    pub zones: BTreeMap<String, ZoneStats>,
    /// Allocations by the alternative they took: 0 the batch's own placement, 1
    /// and up its placement alternatives.
    #[serde(rename = "rungs")]
    pub alternatives: BTreeMap<u32, u64>,
    /// Where the trace says what Spark wants over a run (elastic batches,
    /// or a peak): extras and GPUs held idle.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub elastic: Option<ElasticStats>,
    /// The nodes of the trace's regions: node-hours up and idle, and the
    /// sets of new nodes provisioned pools made.
    pub fleet: FleetStats,
    #[serde(skip)]
    waits: HashMap<String, Vec<f64>>,
    #[serde(skip)]
    weights: HashMap<String, f64>,
}

/// The nodes of the trace's regions over the trace: how many node-hours
/// they were up, how many of those held nothing, and the sets of new
/// nodes provisioned pools made (docs/rules.md#provisioned-capacity).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FleetStats {
    pub node_hours: f64,
    pub idle_node_hours: f64,
    /// Sets of new nodes decided, and of those, failed (a stock-out, a
    /// slot late).
    pub sets: u64,
    pub sets_failed: u64,
}

impl FleetStats {
    /// "1234.0 node-hours, 800.5 idle (64.9%); 12 sets of new nodes, 1
    /// failed".
    pub fn line(&self) -> String {
        let mut out = format!(
            "{:.1} node-hours, {:.1} idle ({:.1}%)",
            self.node_hours,
            self.idle_node_hours,
            ratio(self.idle_node_hours * 100.0, self.node_hours)
        );
        if self.sets > 0 {
            let _ = write!(
                out,
                "; {} sets of new nodes, {} failed",
                self.sets, self.sets_failed
            );
        }
        out
    }
}

/// Elastic clusters and GPUs held past Spark's wants, over the trace.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ElasticStats {
    /// Elastic clusters allocated.
    pub clusters: u64,
    /// Extras granted, and the GPU-hours they held (in the projects'
    /// GPU-hours too).
    pub extras_granted: u64,
    pub extra_gpu_hours: f64,
    /// Extras taken back for a queued batch blocked by capacity.
    pub extras_reclaimed: u64,
    /// GPU-hours of executors held after their batch's peak that Spark no
    /// longer wanted.
    pub idle_gpu_hours: f64,
}

impl ElasticStats {
    /// "12 elastic clusters, 40 extras granted (31.2 GPU-hours), 3 taken
    /// back for a queued batch, 5.0 GPU-hours held idle after their peak".
    fn line(&self) -> String {
        format!(
            "{} elastic clusters, {} extras granted ({:.1} GPU-hours), {} taken back for a queued batch, {:.1} GPU-hours held idle after their peak",
            self.clusters,
            self.extras_granted,
            self.extra_gpu_hours,
            self.extras_reclaimed,
            self.idle_gpu_hours
        )
    }
}

/// One project (or the total).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProjectStats {
    pub weight: f64,
    pub submitted: u64,
    pub allocated: u64,
    /// Of `allocated`, those on a placement alternative.
    pub on_alternatives: u64,
    pub expired: u64,
    /// Refused at create: they could never fit (quota limit or declared
    /// capacity).
    pub refused: u64,
    /// Default mode, no room at once.
    pub rejected: u64,
    /// Times its clusters were preempted, and the GPU-hours of work they
    /// had done (lost: a preempted batch runs again from the start).
    pub preempted: u64,
    pub lost_gpu_hours: f64,
    /// Of `on_alternatives`, those on a loan of others' capacity.
    pub on_loan: u64,
    /// Times its loans were reclaimed by their owners, and the GPU-hours
    /// of work they had done (lost as a preemption's is).
    pub reclaimed: u64,
    pub reclaimed_gpu_hours: f64,
    pub wait_p50_s: Option<f64>,
    pub wait_p95_s: Option<f64>,
    pub wait_p99_s: Option<f64>,
    /// Expired ÷ submitted, in percent.
    pub expired_pct: f64,
    pub gpu_hours: f64,
    /// This project's part of every project's GPU-hours.
    pub gpu_share: f64,
    /// Its weight's part of the weights of the projects in the trace.
    pub weight_share: f64,
}

/// One zone.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ZoneStats {
    pub gpus: u64,
    pub gpu_hours: f64,
    /// GPU-hours used ÷ GPU-hours offered over the span.
    pub utilisation: f64,
}

impl SimReport {
    pub(super) fn new(config: &Config) -> SimReport {
        SimReport {
            order: match config.scheduling.order {
                QueueOrder::FairShare => "fair-share",
                QueueOrder::Strict => "strict",
            }
            .into(),
            usage_half_life_s: config.scheduling.usage_half_life.as_secs(),
            weights: config.fair_share().weights.into_iter().collect(),
            ..SimReport::default()
        }
    }

    pub(super) fn project(&mut self, project: &str) -> &mut ProjectStats {
        if !self.projects.contains_key(project) {
            let weight = self.weights.get(project).copied().unwrap_or(1.0);
            self.projects.insert(
                project.to_string(),
                ProjectStats {
                    weight,
                    ..ProjectStats::default()
                },
            );
        }
        self.projects.get_mut(project).expect("inserted above")
    }

    pub(super) fn zone(&mut self, zone: &str) -> &mut ZoneStats {
        self.zones.entry(zone.to_string()).or_default()
    }

    pub(super) fn allocated(&mut self, a: &Allocation) {
        let p = self.project(&a.project);
        p.allocated += 1;
        p.on_alternatives += u64::from(a.alternative.is_some());
        p.on_loan += u64::from(a.loan().is_some());
        *self.alternatives.entry(a.alternative_index()).or_default() += 1;
        let waited = (a.allocated_at - a.queued_at).num_milliseconds() as f64 / 1000.0;
        self.waits
            .entry(a.project.clone())
            .or_default()
            .push(waited);
    }

    /// `a` was preempted and stopped at `at`: its work is lost.
    pub(super) fn preempted(&mut self, a: &Allocation, at: DateTime<Utc>) {
        let p = self.project(&a.project);
        p.preempted += 1;
        p.lost_gpu_hours += a.gpu_seconds(at) / 3600.0;
    }

    /// `a`'s loan was reclaimed and it stopped at `at`: its work is lost.
    pub(super) fn reclaimed(&mut self, a: &Allocation, at: DateTime<Utc>) {
        let p = self.project(&a.project);
        p.reclaimed += 1;
        p.reclaimed_gpu_hours += a.gpu_seconds(at) / 3600.0;
    }

    pub(super) fn ended(&mut self, a: &Allocation, at: DateTime<Utc>) {
        let hours = a.gpu_seconds(at) / 3600.0;
        self.project(&a.project).gpu_hours += hours;
        self.zone(&a.zone).gpu_hours += hours;
    }

    /// Percentiles, shares and utilisation, once everything has ended.
    pub(super) fn finish(&mut self, first_s: f64, last_s: f64, core: &Scheduler) {
        debug_assert!(core.running_keys().is_empty(), "every cluster ended");
        self.span_s = (last_s - first_s).max(0.0);
        let gpu_hours: f64 = self.projects.values().map(|p| p.gpu_hours).sum();
        let weights: f64 = self.projects.values().map(|p| p.weight).sum();
        let mut all_waits = Vec::new();
        let mut total = ProjectStats {
            weight: weights,
            ..ProjectStats::default()
        };
        for (name, p) in &mut self.projects {
            let mut waits = self.waits.remove(name).unwrap_or_default();
            waits.sort_by(f64::total_cmp);
            fill_waits(p, &waits);
            all_waits.extend(waits);
            p.expired_pct = pct(p.expired, p.submitted);
            p.gpu_share = ratio(p.gpu_hours, gpu_hours);
            p.weight_share = ratio(p.weight, weights);
            total.submitted += p.submitted;
            total.allocated += p.allocated;
            total.on_alternatives += p.on_alternatives;
            total.expired += p.expired;
            total.refused += p.refused;
            total.rejected += p.rejected;
            total.preempted += p.preempted;
            total.lost_gpu_hours += p.lost_gpu_hours;
            total.on_loan += p.on_loan;
            total.reclaimed += p.reclaimed;
            total.reclaimed_gpu_hours += p.reclaimed_gpu_hours;
            total.gpu_hours += p.gpu_hours;
        }
        all_waits.sort_by(f64::total_cmp);
        fill_waits(&mut total, &all_waits);
        total.expired_pct = pct(total.expired, total.submitted);
        total.gpu_share = 1.0;
        total.weight_share = 1.0;
        self.total = total;
        let span_h = self.span_s / 3600.0;
        for z in self.zones.values_mut() {
            z.utilisation = ratio(z.gpu_hours, z.gpus as f64 * span_h);
        }
    }

    /// The report as a table.
    pub fn table(&self) -> String {
        let mut out = format!(
            "order {}, usage half-life {}, {:.1} simulated hours\n\n",
            self.order,
            humantime::format_duration(std::time::Duration::from_secs(self.usage_half_life_s)),
            self.span_s / 3600.0
        );
        let _ = writeln!(
            out,
            "{:<20} {:>6} {:>8} {:>9} {:>7} {:>7} {:>9} {:>9} {:>9} {:>7} {:>7} {:>9} {:>9} {:>9} {:>8} {:>10} {:>7} {:>7}",
            "PROJECT",
            "WEIGHT",
            "BATCHES",
            "ALLOCATED",
            "ON_ALT",
            "ON_LOAN",
            "RECLAIMED",
            "PREEMPTED",
            "LOST_GPUH",
            "EXPIRED",
            "REFUSED",
            "WAIT_P50",
            "WAIT_P95",
            "WAIT_P99",
            "EXPIRED%",
            "GPU_HOURS",
            "SHARE%",
            "WEIGHT%"
        );
        let rows = self
            .projects
            .iter()
            .map(|(n, p)| (n.as_str(), p))
            .chain(std::iter::once(("TOTAL", &self.total)));
        for (name, p) in rows {
            let _ = writeln!(
                out,
                "{:<20} {:>6} {:>8} {:>9} {:>7} {:>7} {:>9} {:>9} {:>9.1} {:>7} {:>7} {:>9} {:>9} {:>9} {:>8.1} {:>10.1} {:>7.1} {:>7.1}",
                name,
                trim(p.weight),
                p.submitted,
                p.allocated,
                p.on_alternatives,
                p.on_loan,
                p.reclaimed,
                p.preempted,
                p.lost_gpu_hours + p.reclaimed_gpu_hours,
                p.expired,
                p.refused + p.rejected,
                wait(p.wait_p50_s),
                wait(p.wait_p95_s),
                wait(p.wait_p99_s),
                p.expired_pct,
                p.gpu_hours,
                p.gpu_share * 100.0,
                p.weight_share * 100.0
            );
        }
        let _ = writeln!(
            out,
            "\n{:<24} {:>6} {:>10} {:>12}",
            "ZONE", "GPUS", "GPU_HOURS", "UTILISATION%"
        );
        for (zone, z) in &self.zones {
            let _ = writeln!(
                out,
                "{:<24} {:>6} {:>10.1} {:>12.1}",
                zone,
                z.gpus,
                z.gpu_hours,
                z.utilisation * 100.0
            );
        }
        let _ = writeln!(
            out,
            "\nallocations by rung: {}",
            alternatives_line(&self.alternatives)
        );
        let _ = writeln!(out, "nodes: {}", self.fleet.line());
        if let Some(e) = &self.elastic {
            let _ = writeln!(out, "elastic: {}", e.line());
        }
        out
    }
}

/// "own 950, alternative 1: 40, alternative 2: 3".
fn alternatives_line(alternatives: &BTreeMap<u32, u64>) -> String {
    if alternatives.is_empty() {
        return "none".into();
    }
    alternatives
        .iter()
        .map(|(r, n)| match r {
            0 => format!("own {n}"),
            r => format!("alternative {r}: {n}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Two reports side by side: per project, each measure under A and B.
pub fn compare_table(a: &SimReport, b: &SimReport, a_name: &str, b_name: &str) -> String {
    let mut out = format!(
        "A: {a_name} (order {}, half-life {}s)\nB: {b_name} (order {}, half-life {}s)\n\n",
        a.order, a.usage_half_life_s, b.order, b.usage_half_life_s
    );
    let _ = writeln!(
        out,
        "{:<20} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>7} {:>7} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6}",
        "PROJECT",
        "P50_A",
        "P50_B",
        "P95_A",
        "P95_B",
        "P99_A",
        "P99_B",
        "EXP%_A",
        "EXP%_B",
        "SHR%_A",
        "SHR%_B",
        "ALT_A",
        "ALT_B",
        "PRE_A",
        "PRE_B",
        "REC_A",
        "REC_B"
    );
    let mut names: Vec<&String> = a.projects.keys().chain(b.projects.keys()).collect();
    names.sort();
    names.dedup();
    let none = ProjectStats::default();
    let rows = names
        .into_iter()
        .map(|n| {
            (
                n.as_str(),
                a.projects.get(n).unwrap_or(&none),
                b.projects.get(n).unwrap_or(&none),
            )
        })
        .chain(std::iter::once(("TOTAL", &a.total, &b.total)));
    for (name, x, y) in rows {
        let _ = writeln!(
            out,
            "{:<20} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8.1} {:>8.1} {:>7.1} {:>7.1} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6}",
            name,
            wait(x.wait_p50_s),
            wait(y.wait_p50_s),
            wait(x.wait_p95_s),
            wait(y.wait_p95_s),
            wait(x.wait_p99_s),
            wait(y.wait_p99_s),
            x.expired_pct,
            y.expired_pct,
            x.gpu_share * 100.0,
            y.gpu_share * 100.0,
            x.on_alternatives,
            y.on_alternatives,
            x.preempted,
            y.preempted,
            x.reclaimed,
            y.reclaimed
        );
    }
    let _ = writeln!(out, "\n{:<24} {:>8} {:>8}", "ZONE", "UTIL%_A", "UTIL%_B");
    let mut zones: Vec<&String> = a.zones.keys().chain(b.zones.keys()).collect();
    zones.sort();
    zones.dedup();
    for z in zones {
        let util = |r: &SimReport| r.zones.get(z).map_or(0.0, |s| s.utilisation * 100.0);
        let _ = writeln!(out, "{:<24} {:>8.1} {:>8.1}", z, util(a), util(b));
    }
    let _ = writeln!(
        out,
        "\nallocations by rung: A {}; B {}",
        alternatives_line(&a.alternatives),
        alternatives_line(&b.alternatives)
    );
    let _ = writeln!(out, "nodes: A {}; B {}", a.fleet.line(), b.fleet.line());
    if a.elastic.is_some() || b.elastic.is_some() {
        let line = |r: &SimReport| {
            r.elastic
                .as_ref()
                .map_or("none".to_string(), ElasticStats::line)
        };
        let _ = writeln!(out, "elastic: A {}; B {}", line(a), line(b));
    }
    out
}

fn fill_waits(p: &mut ProjectStats, sorted: &[f64]) {
    p.wait_p50_s = percentile(sorted, 0.50);
    p.wait_p95_s = percentile(sorted, 0.95);
    p.wait_p99_s = percentile(sorted, 0.99);
}

fn pct(n: u64, of: u64) -> f64 {
    ratio(n as f64 * 100.0, of as f64)
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// A wait for the table: `-` when nothing was allocated, else humantime
/// rounded to the second.
fn wait(s: Option<f64>) -> String {
    match s {
        None => "-".into(),
        Some(s) => humantime::format_duration(std::time::Duration::from_secs(s.round() as u64))
            .to_string()
            .replace(' ', ""),
    }
}

/// 1, 2.5: a weight without trailing zeros.
fn trim(w: f64) -> String {
    let s = format!("{w:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}
