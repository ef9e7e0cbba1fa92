//! Admins' holds of queues and cordons of nodes, as the core keeps them:
//! replacing them all (each replica applies what the store holds) and
//! reading one or all. The pass checks them in `consider` (holds) and
//! through the capacity's unschedulable set (cordons); the types are in
//! `model.rs`.

use std::collections::HashMap;

use super::capacity::NodeId;
use super::core::Scheduler;
use super::model::{Cordon, Hold, RegionHolds};

impl Scheduler {
    /// Replaces every hold: (region, project or None for the whole
    /// region, the hold). Regions whose holds changed are looked at again.
    pub fn set_holds(&mut self, holds: Vec<(String, Option<String>, Hold)>) {
        let mut next: HashMap<String, RegionHolds> = HashMap::new();
        for (region, project, hold) in holds {
            let r = next.entry(region).or_default();
            match project {
                None => r.all = Some(hold),
                Some(p) => {
                    r.projects.insert(p, hold);
                }
            }
        }
        let old = std::mem::replace(&mut self.holds, next);
        self.dirty.extend(old.into_keys());
        self.dirty.extend(self.holds.keys().cloned());
    }

    /// Replaces every cordon. Every region is looked at again (an
    /// uncordoned node may admit work).
    pub fn set_cordons(&mut self, cordons: Vec<(NodeId, Cordon)>) {
        self.cordons = cordons.into_iter().collect();
        self.refresh_unschedulable();
        self.dirty.extend(self.queue.region_names().cloned());
    }

    pub fn cordon_of(&self, node: &NodeId) -> Option<&Cordon> {
        self.cordons.get(node)
    }

    /// The hold on `project`'s queue in `region`: the region's own first.
    /// The bool says whether it holds the whole region.
    pub fn hold_of(&self, region: &str, project: &str) -> Option<(&Hold, bool)> {
        let r = self.holds.get(region)?;
        r.all
            .as_ref()
            .map(|h| (h, true))
            .or_else(|| r.projects.get(project).map(|h| (h, false)))
    }

    /// Every hold: (region, project or None, hold), in order.
    pub fn holds(&self) -> Vec<(String, Option<String>, Hold)> {
        let mut out: Vec<_> = self
            .holds
            .iter()
            .flat_map(|(region, r)| {
                r.all
                    .iter()
                    .map(|h| (region.clone(), None, h.clone()))
                    .chain(
                        r.projects
                            .iter()
                            .map(|(p, h)| (region.clone(), Some(p.clone()), h.clone())),
                    )
            })
            .collect();
        out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        out
    }
}
