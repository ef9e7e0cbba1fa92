//! Usage: what one batch's cluster used and holds (its `runtimeInfo`
//! usage fields), and the report — GPU-seconds and local-SSD GB-seconds
//! held per project and accelerator type in a region over a window, read
//! from the stored allocations (each part's allocation and release time),
//! with the window's batches' waits and expiries.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};

use super::{Engine, Error};
use crate::api::{UsageReport, UsageRow, quote};
use crate::spec::Accelerator;
use crate::stats::percentile;
use crate::store::{BatchRecord, CreatedBatch, Provisioning, UsedPart};

/// The window when none is given: the last 7 days.
const DEFAULT_WINDOW_DAYS: i64 = 7;

impl Engine {
    /// The report for `project`'s region (`-`: every project; the caller's
    /// access is checked by the front end's admission) between `start`
    /// and `end` (RFC 3339; default the 7 days before now).
    pub async fn usage_report(
        &self,
        project: &str,
        region: &str,
        start: Option<&str>,
        end: Option<&str>,
    ) -> Result<UsageReport, Error> {
        let now = Utc::now();
        let time = |field: &str, text: &str| {
            DateTime::parse_from_rfc3339(text)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|_| {
                    Error::invalid_field(
                        field,
                        format!(
                            "{} is not a time; accepted: RFC 3339, e.g. 2026-12-01T00:00:00Z",
                            quote(text)
                        ),
                    )
                })
        };
        let end = match end {
            Some(t) => time("endTime", t)?,
            None => now,
        };
        let start = match start {
            Some(t) => time("startTime", t)?,
            None => end - Duration::days(DEFAULT_WINDOW_DAYS),
        };
        if start >= end {
            return Err(Error::invalid_field(
                "startTime",
                format!("{start} is not before endTime {end}; accepted: a start before the end"),
            ));
        }
        let every = project == "-";
        let (held, created) = self
            .shared
            .store
            .usage(region, (!every).then_some(project), start, end)
            .await?;
        let weights = self.config().fair_share();
        Ok(report(
            region,
            (&held, &created),
            |a| weights.gpu_weight(a),
            (start, end),
            now,
        ))
    }
}

/// What a batch's cluster has used (from its allocation until `now`, or
/// until its release, which is when it ended) and, while it holds it, what
/// it holds: GPUs by type and local SSD, in the Dataproc API's usage
/// fields (docs/api.md, "Usage").
pub(super) fn of_batch(
    r: &BatchRecord,
    now: chrono::DateTime<Utc>,
) -> (
    Option<crate::api::UsageMetrics>,
    Option<crate::api::UsageSnapshot>,
) {
    let Some(allocated) = r.allocate_time else {
        return (None, None);
    };
    let holding = r.provisioning == Provisioning::Provisioned;
    let until = match r.provisioning {
        Provisioning::Provisioned => now,
        Provisioning::Released => r.state_time,
        _ => return (None, None),
    };
    let millis = (until - allocated).num_milliseconds().max(0) as u64;
    // On an alternative, the cluster held is the alternative's (its GPU type and count).
    let (held, _) = crate::spec::placed(&r.cluster, &r.alternatives, r.alternative);
    let gpus = held.gpus_by_type();
    let gpu_count: u64 = gpus.iter().map(|(_, n)| n).sum();
    let accelerator_type = (!gpus.is_empty()).then(|| {
        gpus.iter()
            .map(|(a, _)| a.name())
            .collect::<Vec<_>>()
            .join(",")
    });
    let ssd = held.local_ssd_gb();
    let approximate = crate::api::UsageMetrics {
        milli_accelerator_seconds: Some((gpu_count * millis).to_string()),
        accelerator_type: accelerator_type.clone(),
        shuffle_storage_gb_seconds: Some((ssd * millis / 1000).to_string()),
    };
    let current = holding.then(|| crate::api::UsageSnapshot {
        milli_accelerator: Some((gpu_count * 1000).to_string()),
        accelerator_type,
        shuffle_storage_gb: Some(ssd.to_string()),
        snapshot_time: Some(now),
    });
    (Some(approximate), current)
}

/// What the report's rows add up from (pure: tested alone).
/// `gpu_weight` is what a GPU-hour of each type counts (weighted hours).
pub(crate) fn report(
    region: &str,
    (held, created): (&[UsedPart], &[CreatedBatch]),
    gpu_weight: impl Fn(Option<Accelerator>) -> f64,
    (start, end): (DateTime<Utc>, DateTime<Utc>),
    now: DateTime<Utc>,
) -> UsageReport {
    #[derive(Default)]
    struct Sums {
        gpu_millis: u64,
        weighted_gpu_millis: f64,
        lost_gpu_millis: u64,
        reclaimed_gpu_millis: u64,
        extra_gpu_millis: u64,
        ssd_gb_millis: u64,
        batches: u64,
        allocated: u64,
        expired: u64,
        waits: Vec<f64>,
    }
    let mut by: BTreeMap<(String, String), Sums> = BTreeMap::new();
    for part in held {
        let from = part.allocated_at.max(start);
        let to = part.released_at.unwrap_or(now).min(end).min(now.max(start));
        let millis = (to - from).num_milliseconds().max(0) as u64;
        let label = part.accelerator.map_or("cpu", |a| a.name());
        let sums = by
            .entry((part.project.clone(), label.to_string()))
            .or_default();
        sums.gpu_millis += part.gpus * millis;
        if part.preempted {
            sums.lost_gpu_millis += part.gpus * millis;
        }
        if part.reclaimed {
            sums.reclaimed_gpu_millis += part.gpus * millis;
        }
        if part.extra {
            sums.extra_gpu_millis += part.gpus * millis;
        }
        sums.weighted_gpu_millis += (part.gpus * millis) as f64 * gpu_weight(part.accelerator);
        sums.ssd_gb_millis += part.local_ssd_gb * millis;
    }
    for batch in created {
        let label = crate::scheduler::accelerator_label(&batch.cluster);
        let sums = by
            .entry((batch.project.clone(), label.to_string()))
            .or_default();
        sums.batches += 1;
        if batch.provisioning == Provisioning::Expired {
            sums.expired += 1;
        }
        if let Some(at) = batch.allocate_time {
            sums.allocated += 1;
            sums.waits
                .push((at - batch.create_time).num_milliseconds().max(0) as f64 / 1000.0);
        }
    }
    let row = |project: &str, accelerator: &str, s: &mut Sums| {
        s.waits.sort_by(f64::total_cmp);
        let ended = s.allocated + s.expired;
        UsageRow {
            project: project.to_string(),
            accelerator_type: accelerator.to_string(),
            milli_accelerator_seconds: s.gpu_millis.to_string(),
            gpu_hours: s.gpu_millis as f64 / 3_600_000.0,
            weighted_gpu_hours: s.weighted_gpu_millis / 3_600_000.0,
            lost_gpu_hours: s.lost_gpu_millis as f64 / 3_600_000.0,
            reclaimed_gpu_hours: s.reclaimed_gpu_millis as f64 / 3_600_000.0,
            extra_gpu_hours: s.extra_gpu_millis as f64 / 3_600_000.0,
            local_ssd_gb_hours: s.ssd_gb_millis as f64 / 3_600_000.0,
            batches: s.batches,
            allocated: s.allocated,
            expired: s.expired,
            expired_percent: if ended == 0 {
                0.0
            } else {
                100.0 * s.expired as f64 / ended as f64
            },
            wait_p50_seconds: percentile(&s.waits, 0.5),
            wait_p95_seconds: percentile(&s.waits, 0.95),
        }
    };
    let mut all = Sums::default();
    let mut rows = Vec::with_capacity(by.len());
    for ((project, accelerator), mut s) in by {
        all.gpu_millis += s.gpu_millis;
        all.weighted_gpu_millis += s.weighted_gpu_millis;
        all.lost_gpu_millis += s.lost_gpu_millis;
        all.reclaimed_gpu_millis += s.reclaimed_gpu_millis;
        all.extra_gpu_millis += s.extra_gpu_millis;
        all.ssd_gb_millis += s.ssd_gb_millis;
        all.batches += s.batches;
        all.allocated += s.allocated;
        all.expired += s.expired;
        all.waits.extend_from_slice(&s.waits);
        rows.push(row(&project, &accelerator, &mut s));
    }
    UsageReport {
        region: region.to_string(),
        start_time: start,
        end_time: end,
        rows,
        total: row("*", "*", &mut all),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).expect("a time")
    }

    fn part(project: &str, gpus: u64, from: i64, to: Option<i64>) -> UsedPart {
        typed(project, Accelerator::L4, gpus, from, to)
    }

    fn typed(project: &str, a: Accelerator, gpus: u64, from: i64, to: Option<i64>) -> UsedPart {
        UsedPart {
            project: project.into(),
            accelerator: Some(a),
            gpus,
            local_ssd_gb: 375,
            allocated_at: at(from),
            released_at: to.map(at),
            preempted: false,
            reclaimed: false,
            extra: false,
        }
    }

    #[test]
    fn usage_counts_only_the_window_and_sums_to_the_total() {
        let held = [
            // Inside: 2 GPUs × 100 s.
            part("a", 2, 100, Some(200)),
            // Starts before the window: counted from its start, 50 s.
            part("a", 1, -50, Some(50)),
            // Still held at `now` (300): 4 GPUs × 100 s.
            part("b", 4, 200, None),
        ];
        let r = report("r", (&held, &[]), |_| 1.0, (at(0), at(1000)), at(300));
        let ms = |row: &UsageRow| row.milli_accelerator_seconds.parse::<u64>().expect("int");
        assert_eq!(r.rows.len(), 2);
        assert_eq!(ms(&r.rows[0]), 2 * 100_000 + 50_000);
        assert_eq!(ms(&r.rows[1]), 4 * 100_000);
        assert_eq!(ms(&r.total), ms(&r.rows[0]) + ms(&r.rows[1]));
        assert!((r.total.gpu_hours - 650_000.0 / 3_600_000.0).abs() < 1e-9);
        // A part released before the window counts nothing.
        let r = report(
            "r",
            (&[part("a", 8, -100, Some(-10))], &[]),
            |_| 1.0,
            (at(0), at(10)),
            at(20),
        );
        assert_eq!(r.total.milli_accelerator_seconds, "0");
    }

    #[test]
    fn extras_hours_are_counted_apart_from_the_core() {
        // A core gang of 2 GPUs for an hour, and an extra of 1 GPU granted
        // half an hour in and still held at the window's end.
        let mut extra = part("a", 1, 1800, None);
        extra.extra = true;
        let held = [part("a", 2, 0, Some(3600)), extra];
        let r = report("r", (&held, &[]), |_| 1.0, (at(0), at(3600)), at(3600));
        assert_eq!((r.total.gpu_hours, r.total.extra_gpu_hours), (2.5, 0.5));
        assert_eq!(r.rows[0].extra_gpu_hours, 0.5);
    }

    #[test]
    fn weighted_hours_count_each_type_at_its_weight() {
        let held = [
            // An hour of 2 L4s (weight 1) and an hour of 2 A100s (weight 3).
            part("a", 2, 0, Some(3600)),
            typed("a", Accelerator::A100_40, 2, 0, Some(3600)),
        ];
        let weight = |a: Option<Accelerator>| {
            if a == Some(Accelerator::A100_40) {
                3.0
            } else {
                1.0
            }
        };
        let r = report("r", (&held, &[]), weight, (at(0), at(3600)), at(3600));
        let by_type: Vec<(&str, f64, f64)> = r
            .rows
            .iter()
            .map(|row| {
                (
                    row.accelerator_type.as_str(),
                    row.gpu_hours,
                    row.weighted_gpu_hours,
                )
            })
            .collect();
        assert_eq!(by_type, [("a100-40", 2.0, 6.0), ("l4", 2.0, 2.0)]);
        assert_eq!(r.total.lost_gpu_hours, 0.0);
        // A preempted part's hours are work lost too.
        let mut lost = part("a", 1, 0, Some(1800));
        lost.preempted = true;
        let one = report("r", (&[lost], &[]), weight, (at(0), at(3600)), at(3600));
        assert_eq!((one.total.gpu_hours, one.total.lost_gpu_hours), (0.5, 0.5));
        assert_eq!(one.total.reclaimed_gpu_hours, 0.0);
        // A reclaimed loan's hours are work lost to reclaim, apart.
        let mut reclaimed = part("a", 2, 0, Some(1800));
        reclaimed.reclaimed = true;
        let one = report(
            "r",
            (&[reclaimed], &[]),
            weight,
            (at(0), at(3600)),
            at(3600),
        );
        assert_eq!(
            (
                one.total.gpu_hours,
                one.total.lost_gpu_hours,
                one.total.reclaimed_gpu_hours
            ),
            (1.0, 0.0, 1.0)
        );
        assert_eq!((r.total.gpu_hours, r.total.weighted_gpu_hours), (4.0, 8.0));
    }

    #[test]
    fn waits_are_nearest_rank_percentiles() {
        let waits: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&waits, 0.5), Some(10.0));
        assert_eq!(percentile(&waits, 0.95), Some(19.0));
        assert_eq!(percentile(&[], 0.5), None);
        assert_eq!(percentile(&[3.0], 0.95), Some(3.0));
    }
}
