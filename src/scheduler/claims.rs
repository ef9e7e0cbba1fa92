//! What preemption keeps between passes ([`Claims`]): per preemptor its
//! claim (the victims it waits for and the capacity banked for it), per
//! victim still stopping its preemptor, and when a region is looked at
//! again because a cluster there grows old enough to give way. What is
//! set aside in the capacity and the quota ledger is the scheduler's
//! (`preempt.rs`); this type only keeps who waits for whom.

use std::collections::{BTreeSet, HashMap};

use chrono::{DateTime, Utc};

use super::model::{Allocation, BatchKey, Claim};

#[derive(Debug, Default)]
pub(super) struct Claims {
    /// Per preemptor: what it waits for and what is set aside for it.
    claims: HashMap<BatchKey, Claim>,
    /// Per victim still stopping: its preemptor.
    stopping: HashMap<BatchKey, BatchKey>,
    /// When a region is looked at again because a cluster there becomes
    /// old enough to give way to a blocked batch.
    retries: BTreeSet<(DateTime<Utc>, String)>,
}

impl Claims {
    /// `preemptor` now waits for `claim`'s victims, each stopping for it.
    pub(super) fn open(&mut self, preemptor: BatchKey, claim: Claim) {
        for v in &claim.waiting {
            self.stopping.insert(*v, preemptor);
        }
        self.claims.insert(preemptor, claim);
    }

    /// A stopping victim's cluster is gone: banked for its preemptor,
    /// whose region answers; None when it stopped for nobody, or its
    /// preemptor no longer waits (the caller gives the cluster back).
    pub(super) fn bank(&mut self, victim: &Allocation) -> Option<String> {
        let preemptor = self.stopping.remove(&victim.key)?;
        let claim = self.claims.get_mut(&preemptor)?;
        claim.waiting.remove(&victim.key);
        claim.banked.extend(victim.placements.iter().cloned());
        Some(claim.region.clone())
    }

    /// Takes `preemptor`'s claim out (its victims, if any still run,
    /// stop anyway: they were told to).
    pub(super) fn take(&mut self, preemptor: BatchKey) -> Option<Claim> {
        self.claims.remove(&preemptor)
    }

    /// Takes `preemptor`'s claim out and its victims are no longer
    /// stopping (a preemption that was not carried out).
    pub(super) fn withdraw(&mut self, preemptor: BatchKey) -> Option<Claim> {
        let claim = self.claims.remove(&preemptor)?;
        for v in &claim.waiting {
            self.stopping.remove(v);
        }
        Some(claim)
    }

    /// The preemptors of `region` whose victims are all gone.
    pub(super) fn ready_in(&self, region: &str) -> Vec<BatchKey> {
        self.claims
            .iter()
            .filter(|(_, c)| c.region == region && c.waiting.is_empty())
            .map(|(k, _)| *k)
            .collect()
    }

    /// After a restart: `victim` was stopping for `preemptor`. Answers
    /// false when `preemptor` has no claim yet (the caller opens one).
    pub(super) fn restore_stopping(&mut self, victim: BatchKey, preemptor: BatchKey) -> bool {
        self.stopping.insert(victim, preemptor);
        match self.claims.get_mut(&preemptor) {
            Some(claim) => {
                claim.waiting.insert(victim);
                true
            }
            None => false,
        }
    }

    pub(super) fn get(&self, preemptor: BatchKey) -> Option<&Claim> {
        self.claims.get(&preemptor)
    }

    /// Whether `key` waits for its victims to stop.
    pub(super) fn is_claiming(&self, key: BatchKey) -> bool {
        self.claims.contains_key(&key)
    }

    /// The preemptor `victim` is stopping for, if any.
    pub(super) fn stopping_for(&self, victim: BatchKey) -> Option<BatchKey> {
        self.stopping.get(&victim).copied()
    }

    /// Every claim, by preemptor.
    #[cfg(test)]
    pub(super) fn iter(&self) -> impl Iterator<Item = (&BatchKey, &Claim)> {
        self.claims.iter()
    }

    /// Looks at `region` again at `at`.
    pub(super) fn retry_at(&mut self, at: DateTime<Utc>, region: &str) {
        self.retries.insert((at, region.to_string()));
    }

    /// The regions to look at again by `now`, taken out.
    pub(super) fn due_retries(&mut self, now: DateTime<Utc>) -> Vec<String> {
        let mut due = Vec::new();
        while self.retries.first().is_some_and(|(at, _)| *at <= now) {
            if let Some((_, region)) = self.retries.pop_first() {
                due.push(region);
            }
        }
        due
    }

    /// When a region is next looked at again.
    pub(super) fn next_retry(&self) -> Option<DateTime<Utc>> {
        self.retries.first().map(|(t, _)| *t)
    }
}
