//! What the core keeps of elastic clusters (docs/rules.md#elastic-batches):
//! the regions' policies, the running elastic clusters by region, what
//! each region's last walk left waiting for capacity, and the extras
//! taken back in a pass. The rules that read and change it are
//! `elastic.rs`.

use std::collections::{BTreeSet, HashMap, HashSet};

use super::model::{BatchKey, ElasticPolicy, ExtraChange};
use crate::spec::Accelerator;

/// What a region's last walk left waiting for capacity: extras of a GPU
/// type in a region are granted only where nothing waits for it.
#[derive(Debug, Clone, Default)]
pub(super) struct Waiting {
    /// The walked region's own GPU types some queued batch waited for.
    here: HashSet<Option<Accelerator>>,
    /// (another region, GPU type) an alternative waited for.
    elsewhere: HashSet<(String, Option<Accelerator>)>,
}

impl Waiting {
    pub(super) fn here(&mut self, accelerator: Option<Accelerator>) {
        self.here.insert(accelerator);
    }

    pub(super) fn elsewhere(&mut self, region: &str, accelerator: Option<Accelerator>) {
        if !self.elsewhere.contains(&(region.to_string(), accelerator)) {
            self.elsewhere.insert((region.to_string(), accelerator));
        }
    }
}

/// The running elastic clusters, by region, and what each region's last
/// walk left waiting.
#[derive(Debug, Default)]
pub(super) struct Elastic {
    pub(super) policies: HashMap<String, ElasticPolicy>,
    /// Running clusters that may grow, by the region they hold.
    pub(super) running: HashMap<String, BTreeSet<BatchKey>>,
    /// Extras taken back, or lost with their node, in a pass, for
    /// [`Scheduler::grow`] to answer.
    pub(super) changes: Vec<ExtraChange>,
    /// Per walked region: what its last walk left waiting
    /// ([`Scheduler::pass`] keeps it).
    pub(super) waiting: HashMap<String, Waiting>,
}

impl Elastic {
    /// Whether a queued batch's last walk waited for capacity of
    /// `accelerator` in `region`.
    pub(super) fn is_waited_for(&self, region: &str, accelerator: Option<Accelerator>) -> bool {
        self.waiting.iter().any(|(walked, w)| {
            (walked == region && w.here.contains(&accelerator))
                || w.elsewhere.contains(&(region.to_string(), accelerator))
        })
    }
}
