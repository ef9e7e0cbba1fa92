//! GPU telemetry ([rules](../docs/rules.md#gpu-telemetry)): what an agent
//! reads of a GPU, the point it sends for each part of a batch per
//! sampling interval, and how a batch's points add up to what the batch
//! shows. Pure: the agent's readers (NVML, `nvidia-smi`) are in
//! `agent/gpus.rs`, the storing in the store.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::api::{FieldViolation, GpuChart, GpuChartPoint, GpuUtilization};

/// A GPU whose utilization is below this (percent) does no work.
pub const IDLE_BELOW_PERCENT: f64 = 5.0;

/// Points one upload may carry for one batch; an agent that could not
/// send keeps the latest this many.
pub const MAX_POINTS: usize = 64;

/// Width of the utilization buckets a batch's summary keeps (percent).
const BUCKET: f64 = 5.0;
const BUCKETS: usize = 21;

/// One reading of one GPU of a node. A field the GPU does not report
/// (`[N/A]`) is None.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuReading {
    /// Its address, as discovery names it (`0`, `1`…).
    pub index: String,
    pub utilization_percent: Option<f64>,
    pub memory_used_mb: Option<u64>,
}

/// What one part's GPUs did over one sampling interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuPoint {
    pub time: DateTime<Utc>,
    /// The seconds this point stands for (the sampling interval).
    pub seconds: f64,
    /// The part's GPUs that were read.
    pub gpus: u32,
    /// Their mean utilization, percent.
    pub utilization_percent: f64,
    /// The busiest one's, percent.
    pub max_utilization_percent: f64,
    /// The fullest one's memory in use, MiB.
    pub max_memory_used_mb: u64,
}

impl GpuPoint {
    /// The GPU-seconds it stands for: what it weighs in every sum.
    pub fn gpu_seconds(&self) -> f64 {
        f64::from(self.gpus) * self.seconds
    }

    /// Every GPU of the part was idle.
    pub fn idle(&self) -> bool {
        self.max_utilization_percent < IDLE_BELOW_PERCENT
    }

    /// Why this point cannot be taken, naming the field and the value.
    pub fn check(&self) -> Result<(), FieldViolation> {
        let invalid = |field: &str, description: String| FieldViolation {
            field: field.to_string(),
            description,
        };
        let percent = |name: &str, v: f64| {
            if (0.0..=100.0).contains(&v) {
                Ok(())
            } else {
                Err(invalid(
                    name,
                    format!("is {v}; a percentage from 0 to 100 is accepted"),
                ))
            }
        };
        percent("utilizationPercent", self.utilization_percent)?;
        percent("maxUtilizationPercent", self.max_utilization_percent)?;
        if self.max_utilization_percent < self.utilization_percent {
            return Err(invalid(
                "maxUtilizationPercent",
                format!(
                    "{} is below utilizationPercent {}",
                    self.max_utilization_percent, self.utilization_percent
                ),
            ));
        }
        if !(self.seconds > 0.0 && self.seconds <= 3600.0) {
            return Err(invalid(
                "seconds",
                format!("is {}; from above 0 to 3600 is accepted", self.seconds),
            ));
        }
        if self.gpus == 0 || self.gpus > 64 {
            return Err(invalid(
                "gpus",
                format!("is {}; 1 to 64 is accepted", self.gpus),
            ));
        }
        Ok(())
    }
}

/// The point of a part that holds `gpus` (addresses) from one reading of
/// the node's GPUs: None when none of its GPUs reported a utilization.
pub fn point(
    time: DateTime<Utc>,
    seconds: f64,
    gpus: &[String],
    readings: &[GpuReading],
) -> Option<GpuPoint> {
    // One reading per GPU: a GPU listed twice counts once (the first).
    let mut seen = std::collections::HashSet::new();
    let mine: Vec<&GpuReading> = readings
        .iter()
        .filter(|r| gpus.contains(&r.index) && r.utilization_percent.is_some())
        .filter(|r| seen.insert(r.index.as_str()))
        .collect();
    if mine.is_empty() {
        return None;
    }
    let utilization: Vec<f64> = mine
        .iter()
        .filter_map(|r| r.utilization_percent)
        .map(|u| u.clamp(0.0, 100.0))
        .collect();
    let max = utilization.iter().copied().fold(0.0, f64::max);
    Some(GpuPoint {
        time,
        seconds,
        gpus: mine.len() as u32,
        // Rounding can put the mean of equal values a hair above them
        // ((0.1 + 0.1 + 0.1) / 3): the server refuses a mean above the max.
        utilization_percent: (utilization.iter().sum::<f64>() / utilization.len() as f64).min(max),
        max_utilization_percent: max,
        max_memory_used_mb: mine
            .iter()
            .filter_map(|r| r.memory_used_mb)
            .max()
            .unwrap_or(0),
    })
}

/// A batch's GPU usage so far, summed up as its points arrive (stored with
/// its run; a requeued batch starts afresh). Weighted by GPU-seconds: a
/// point of 4 GPUs over 5 s counts 20.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuUsage {
    /// Points taken.
    pub points: u64,
    /// GPU-seconds sampled.
    pub gpu_seconds: f64,
    /// Σ utilization × GPU-seconds.
    pub weighted_percent: f64,
    /// GPU-seconds per utilization bucket of 5 % (the last: 100 %).
    pub buckets: Vec<f64>,
    pub peak_memory_mb: u64,
    /// GPU-seconds of points in which every GPU of the part was idle.
    pub idle_gpu_seconds: f64,
    /// When the first point began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_time: Option<DateTime<Utc>>,
    /// The latest point in which some GPU was at or above the idle
    /// policy's `below_percent` (in force when the point was taken).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_busy_time: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_time: Option<DateTime<Utc>>,
    /// The latest point taken from each node: a point no later is a
    /// retried upload's, taken once.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub latest: std::collections::BTreeMap<String, DateTime<Utc>>,
    /// Whether the idle policy warned about it already (once a run).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub warned: bool,
}

impl GpuUsage {
    /// Takes `node`'s point unless one as late was taken from it; answers
    /// whether it did. `busy_from`: the utilization (percent) from which a
    /// GPU counts as working for the idle policy.
    pub fn add_from(&mut self, node: &str, p: &GpuPoint, busy_from: f64) -> bool {
        if self.latest.get(node).is_some_and(|t| *t >= p.time) {
            return false;
        }
        self.latest.insert(node.to_string(), p.time);
        self.add(p, busy_from);
        true
    }

    pub fn add(&mut self, p: &GpuPoint, busy_from: f64) {
        let weight = p.gpu_seconds();
        self.points += 1;
        self.gpu_seconds += weight;
        self.weighted_percent += p.utilization_percent * weight;
        if self.buckets.len() != BUCKETS {
            self.buckets = vec![0.0; BUCKETS];
        }
        let bucket = ((p.utilization_percent / BUCKET).floor() as usize).min(BUCKETS - 1);
        self.buckets[bucket] += weight;
        self.peak_memory_mb = self.peak_memory_mb.max(p.max_memory_used_mb);
        // A point at the start of chrono's time (an upload may say any
        // time it can write) begins there: no panic on the subtraction.
        let start = p
            .time
            .checked_sub_signed(chrono::Duration::milliseconds((p.seconds * 1000.0) as i64))
            .unwrap_or(DateTime::<Utc>::MIN_UTC);
        self.first_time = Some(self.first_time.map_or(start, |t| t.min(start)));
        if p.idle() {
            self.idle_gpu_seconds += weight;
        }
        if p.max_utilization_percent >= busy_from {
            self.last_busy_time = self.last_busy_time.max(Some(p.time));
        }
        self.last_time = self.last_time.max(Some(p.time));
    }

    /// Since when no GPU of the batch has worked (None while one does, as
    /// of its latest point).
    pub fn idle_since(&self) -> Option<DateTime<Utc>> {
        match (self.last_busy_time, self.last_time) {
            (Some(busy), Some(last)) if busy >= last => None,
            (Some(busy), _) => Some(busy),
            (None, _) => self.first_time,
        }
    }

    /// The time up to which every one of `nodes` has sent its points: the
    /// latest of the slowest. None while one of them has sent none (or
    /// when none is named).
    pub fn reported_until(&self, nodes: &[String]) -> Option<DateTime<Utc>> {
        let mut until: Option<DateTime<Utc>> = None;
        for node in nodes {
            let t = *self.latest.get(node)?;
            until = Some(until.map_or(t, |u| u.min(t)));
        }
        until
    }

    /// The mean utilization, percent.
    pub fn mean_percent(&self) -> Option<f64> {
        (self.gpu_seconds > 0.0).then(|| self.weighted_percent / self.gpu_seconds)
    }

    /// The utilization below which 95 % of the GPU-seconds were, to the
    /// bucket's upper edge (5 % wide).
    pub fn p95_percent(&self) -> Option<f64> {
        if self.gpu_seconds <= 0.0 {
            return None;
        }
        let target = 0.95 * self.gpu_seconds;
        let mut seen = 0.0;
        for (i, w) in self.buckets.iter().enumerate() {
            seen += w;
            if seen >= target - 1e-9 {
                return Some(((i + 1) as f64 * BUCKET).min(100.0));
            }
        }
        Some(100.0)
    }

    /// What the batch shows, for a cluster of `cluster_gpus` GPUs.
    pub fn view(&self, cluster_gpus: u64) -> Option<GpuUtilization> {
        let mean = self.mean_percent()?;
        Some(GpuUtilization {
            mean_percent: round1(mean),
            p95_percent: self.p95_percent().map(round1).unwrap_or(mean),
            peak_memory_mb: self.peak_memory_mb,
            idle_seconds: round1(self.idle_gpu_seconds / cluster_gpus.max(1) as f64),
            sampled_gpu_seconds: round1(self.gpu_seconds),
            last_sample_time: self.last_time,
        })
    }
}

/// Slots a batch's chart keeps: past them, neighbours merge two by two
/// (the step doubles), so a run of any length keeps at most this many.
pub const SERIES_SLOTS: usize = 120;
/// The first step of a chart, seconds: two samples at the agent's
/// default interval.
const FIRST_STEP_SECONDS: i64 = 10;

/// A batch's points over time, bounded ([`SERIES_SLOTS`]), for the chart
/// its page shows. Stored beside its run (a requeued batch starts afresh).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuSeries {
    /// Where the first slot begins (None before the first point).
    pub origin: Option<DateTime<Utc>>,
    pub step_seconds: i64,
    pub slots: Vec<GpuSlot>,
}

/// What the points that fell in one slot add up to. Stored as an array
/// `[gpuSeconds, weightedPercent, maxPercent, peakMemoryMb]`: a series is
/// read and written whole at every upload, so its size is its cost.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "(f64, f64, f64, u64)", into = "(f64, f64, f64, u64)")]
pub struct GpuSlot {
    pub gpu_seconds: f64,
    /// Σ utilization × GPU-seconds.
    pub weighted_percent: f64,
    pub max_percent: f64,
    pub peak_memory_mb: u64,
}

impl From<(f64, f64, f64, u64)> for GpuSlot {
    fn from(
        (gpu_seconds, weighted_percent, max_percent, peak_memory_mb): (f64, f64, f64, u64),
    ) -> Self {
        GpuSlot {
            gpu_seconds,
            weighted_percent,
            max_percent,
            peak_memory_mb,
        }
    }
}

impl From<GpuSlot> for (f64, f64, f64, u64) {
    fn from(s: GpuSlot) -> Self {
        (
            s.gpu_seconds,
            s.weighted_percent,
            s.max_percent,
            s.peak_memory_mb,
        )
    }
}

impl GpuSlot {
    fn merge(&mut self, other: &GpuSlot) {
        self.gpu_seconds += other.gpu_seconds;
        self.weighted_percent += other.weighted_percent;
        self.max_percent = self.max_percent.max(other.max_percent);
        self.peak_memory_mb = self.peak_memory_mb.max(other.peak_memory_mb);
    }
}

impl GpuSeries {
    /// Adds a point (one already taken by [`GpuUsage::add_from`]) to the
    /// slot its time falls in. A point before the first slot or past the
    /// last widens the series, coarsening it as often as it must to stay
    /// within [`SERIES_SLOTS`]; so a point at any time takes bounded room.
    pub fn add(&mut self, p: &GpuPoint) {
        if self.step_seconds <= 0 {
            self.step_seconds = FIRST_STEP_SECONDS;
            self.slots.clear();
        }
        let mut origin = *self.origin.get_or_insert_with(|| {
            let t = p.time.timestamp();
            let start = t - t.rem_euclid(FIRST_STEP_SECONDS);
            DateTime::from_timestamp(start, 0).unwrap_or(p.time)
        });
        let weight = p.gpu_seconds();
        let slot = GpuSlot {
            gpu_seconds: weight,
            weighted_percent: p.utilization_percent * weight,
            max_percent: p.max_utilization_percent,
            peak_memory_mb: p.max_memory_used_mb,
        };
        loop {
            // Milliseconds: chrono's range of times keeps them in an i64.
            let from_origin = (p.time - origin).num_milliseconds();
            let index = from_origin.div_euclid(self.step_seconds.saturating_mul(1000));
            if index < 0 {
                let before = index.unsigned_abs() as usize;
                if before.saturating_add(self.slots.len()) <= SERIES_SLOTS {
                    // A point so early that no time precedes the slot is
                    // left out of the chart (the summary has it).
                    let Some(earlier) = chrono::Duration::try_seconds(
                        self.step_seconds.saturating_mul(before as i64),
                    )
                    .and_then(|moved| origin.checked_sub_signed(moved)) else {
                        return;
                    };
                    self.slots
                        .splice(0..0, std::iter::repeat_n(GpuSlot::default(), before));
                    origin = earlier;
                    self.origin = Some(origin);
                    continue;
                }
            } else if (index as usize) < SERIES_SLOTS {
                let index = index as usize;
                if self.slots.len() <= index {
                    self.slots.resize(index + 1, GpuSlot::default());
                }
                self.slots[index].merge(&slot);
                return;
            }
            self.coarsen();
        }
    }

    /// Doubles the step: each two neighbouring slots become one.
    fn coarsen(&mut self) {
        self.step_seconds = self.step_seconds.saturating_mul(2);
        self.slots = self
            .slots
            .chunks(2)
            .map(|pair| {
                let mut merged = pair[0].clone();
                if let Some(second) = pair.get(1) {
                    merged.merge(second);
                }
                merged
            })
            .collect();
    }

    /// What the chart shows: the slots with points in them.
    pub fn chart(&self) -> GpuChart {
        let Some(origin) = self.origin else {
            return GpuChart::default();
        };
        let points = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.gpu_seconds > 0.0)
            .filter_map(|(i, s)| {
                let time =
                    chrono::Duration::try_seconds(self.step_seconds.saturating_mul(i as i64))
                        .and_then(|d| origin.checked_add_signed(d))?;
                Some(GpuChartPoint {
                    time,
                    mean_percent: round1(s.weighted_percent / s.gpu_seconds),
                    max_percent: round1(s.max_percent),
                    peak_memory_mb: s.peak_memory_mb,
                })
            })
            .collect();
        GpuChart {
            step_seconds: self.step_seconds.max(0) as u64,
            points,
        }
    }
}

/// What the idle policy does with a batch whose GPUs idle
/// (`[gpu_idle]` in the config; live on reload).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IdleAction {
    Off,
    /// A warning in its history, once a run.
    Warn,
    /// The warning, and it is cancelled (end reason IDLE_GPUS).
    Cancel,
}

/// The idle policy: a RUNNING batch whose every GPU stayed under
/// `below_percent` for `after`, counted from `warm_up` after its driver
/// started, is warned about or cancelled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdlePolicy {
    pub action: IdleAction,
    pub below_percent: f64,
    #[serde(with = "humantime_serde")]
    pub after: std::time::Duration,
    #[serde(with = "humantime_serde")]
    pub warm_up: std::time::Duration,
}

impl Default for IdlePolicy {
    fn default() -> IdlePolicy {
        IdlePolicy {
            action: IdleAction::Warn,
            below_percent: IDLE_BELOW_PERCENT,
            after: std::time::Duration::from_secs(30 * 60),
            warm_up: std::time::Duration::from_secs(10 * 60),
        }
    }
}

/// What the idle policy decides about one batch now.
#[derive(Debug, Clone, PartialEq)]
pub enum IdleVerdict {
    Warn(String),
    Cancel(String),
}

/// The idle policy's verdict on a batch whose driver started at `started`
/// with `usage` so far, at `now`: None while its GPUs work, during its
/// warm-up, before `after`, or once warned (a warning only). `nodes`: the
/// nodes that hold GPUs of the batch now; the idle time counts only up to
/// where every one of them has reported.
pub fn idle_verdict(
    policy: &IdlePolicy,
    usage: &GpuUsage,
    nodes: &[String],
    started: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Option<IdleVerdict> {
    if policy.action == IdleAction::Off {
        return None;
    }
    let warm = started + chrono::Duration::from_std(policy.warm_up).ok()?;
    let since = usage.idle_since()?.max(warm);
    // Not the latest point of any node: a node whose uploads lag may yet
    // send busy points for the time its idle neighbours already covered.
    // A busy point past `until` makes the span negative: no verdict.
    let until = usage.reported_until(nodes)?.min(now);
    let idle_for = (until - since).to_std().ok()?;
    if idle_for < policy.after {
        return None;
    }
    let words = format!(
        "every GPU of it has been under {}% utilization for {} (since {}, after a warm-up of {})",
        policy.below_percent,
        humantime::format_duration(std::time::Duration::from_secs(idle_for.as_secs())),
        since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        humantime::format_duration(policy.warm_up)
    );
    match policy.action {
        IdleAction::Cancel => Some(IdleVerdict::Cancel(format!(
            "Cancelled by the GPU idle policy: {words}. It may run on the CPU (see runtimeInfo.rapidsAccelerator) or wait on something else."
        ))),
        IdleAction::Warn if !usage.warned => Some(IdleVerdict::Warn(format!(
            "GPU idle warning: {words}. It may run on the CPU (see runtimeInfo.rapidsAccelerator) or wait on something else."
        ))),
        _ => None,
    }
}

fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests;
