//! The bookkeeping of placement alternatives
//! (docs/rules.md#placement-alternatives): when each alternative of a queued
//! batch may be tried, which alternatives a region's batches may try now, and
//! which regions a pass must scan because capacity changed where their
//! batches' alternatives run ([`Alternatives`], kept by the queue). Where an alternative is
//! tried in a pass is `assess.rs`; why a queued batch's alternatives have not
//! taken it, `pending.rs`.

use std::collections::{BTreeSet, HashMap};

use chrono::{DateTime, Duration, Utc};

use super::model::{BatchKey, PendingBatch, ShapeKey, shape_key};
use crate::spec::alternatives::Alternative;

/// When `alternative` of a batch queued at `queued_at` may be tried.
pub(super) fn ripe_at(queued_at: DateTime<Utc>, alternative: &Alternative) -> DateTime<Utc> {
    queued_at + Duration::seconds(alternative.after_s as i64)
}

fn option_of(alternative: &Alternative) -> (String, ShapeKey) {
    (alternative.region.clone(), shape_key(&alternative.cluster))
}

/// The alternatives of the queued batches: those that wait for their delay, and
/// those that may be tried now, counted per home region.
#[derive(Debug, Default)]
pub(super) struct Alternatives {
    /// When each alternative of a queued batch may be tried: (its queue time +
    /// the alternative's delay, the batch, the alternative). [`Alternatives::ripen`] moves
    /// those due into `options`.
    ripening: BTreeSet<(DateTime<Utc>, BatchKey, u32)>,
    /// Per home region: the alternatives its queued batches may try now, as
    /// (the alternative's region, its shape), counted. A pass goes on past the
    /// point where every own shape failed while any of these has not.
    options: HashMap<String, HashMap<(String, ShapeKey), usize>>,
    /// The same options that run in another region than their batch's,
    /// by that region: per home region, how many. A pass scans the homes
    /// of a region whose capacity changed.
    homes: HashMap<String, HashMap<String, usize>>,
}

impl Alternatives {
    /// A batch entered the queue: its alternatives wait for their delays.
    pub(super) fn schedule(&mut self, batch: &PendingBatch) {
        for alternative in &batch.alternatives {
            self.ripening.insert((
                ripe_at(batch.queued_at, alternative),
                batch.key,
                alternative.index,
            ));
        }
    }

    /// A batch left the queue: its alternatives no longer wait, nor count.
    pub(super) fn drop_batch(&mut self, batch: &PendingBatch) {
        for alternative in &batch.alternatives {
            let waiting = self.ripening.remove(&(
                ripe_at(batch.queued_at, alternative),
                batch.key,
                alternative.index,
            ));
            if waiting {
                continue;
            }
            if alternative.region != batch.region {
                if let Some(homes) = self.homes.get_mut(&alternative.region) {
                    if let Some(n) = homes.get_mut(&batch.region) {
                        *n -= 1;
                        if *n == 0 {
                            homes.remove(&batch.region);
                        }
                    }
                    if homes.is_empty() {
                        self.homes.remove(&alternative.region);
                    }
                }
            }
            if let Some(options) = self.options.get_mut(&batch.region) {
                let option = option_of(alternative);
                if let Some(n) = options.get_mut(&option) {
                    *n -= 1;
                    if *n == 0 {
                        options.remove(&option);
                    }
                }
                if options.is_empty() {
                    self.options.remove(&batch.region);
                }
            }
        }
    }

    /// Alternatives whose delay has passed at `now` may be tried: they count in
    /// their batch's region (found by `queued`), which the pass scans;
    /// answers those regions.
    pub(super) fn ripen<'a>(
        &mut self,
        now: DateTime<Utc>,
        queued: impl Fn(BatchKey) -> Option<&'a PendingBatch>,
    ) -> Vec<String> {
        let mut regions = Vec::new();
        while let Some(&(at, key, index)) = self.ripening.first() {
            if at > now {
                break;
            }
            self.ripening.pop_first();
            let Some(batch) = queued(key) else {
                continue;
            };
            let Some(alternative) = batch.alternatives.iter().find(|r| r.index == index) else {
                continue;
            };
            let option = option_of(alternative);
            let region = batch.region.clone();
            if alternative.region != region {
                *self
                    .homes
                    .entry(alternative.region.clone())
                    .or_default()
                    .entry(region.clone())
                    .or_default() += 1;
            }
            *self
                .options
                .entry(region.clone())
                .or_default()
                .entry(option)
                .or_default() += 1;
            regions.push(region);
        }
        regions
    }

    /// When the next alternative may be tried.
    pub(super) fn next_ripe(&self) -> Option<DateTime<Utc>> {
        self.ripening.first().map(|(t, _, _)| *t)
    }

    /// The alternative options the batches of `home` may try now, counted.
    pub(super) fn options(&self, home: &str) -> Option<&HashMap<(String, ShapeKey), usize>> {
        self.options.get(home)
    }

    /// The home regions of the options that run in `region`, counted.
    pub(super) fn homes_of(&self, region: &str) -> Option<&HashMap<String, usize>> {
        self.homes.get(region)
    }

    /// Whether no alternative may be tried now (none ripe, or all gone).
    #[cfg(test)]
    pub(super) fn none_ripe(&self) -> bool {
        self.options.is_empty() && self.homes.is_empty()
    }
}
