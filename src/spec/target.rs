//! What a placement alternative changes of a batch's own placement
//! ([`Target`]) and a rung as a ladder names it ([`RungSpec`]): the words
//! of the ladder syntax, below both the request that holds its rungs and
//! the ladders that resolve them.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::shape::Accelerator;

/// What a rung changes of the batch's own placement.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Target {
    /// Another GPU type, in the batch's region.
    Accelerator(Accelerator),
    /// The same batch in another region.
    Region(String),
    /// On-demand (standard) quota instead of preemptible: provisioning
    /// mode `default` for the rung.
    OnDemand,
}

impl fmt::Display for Target {
    /// The form the ladder syntax uses: `a100-40`, `region europe-west4`,
    /// `on-demand`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Accelerator(a) => write!(f, "{a}"),
            Target::Region(r) => write!(f, "region {r}"),
            Target::OnDemand => f.write_str("on-demand"),
        }
    }
}

/// A rung as a ladder names it: a target and its delay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RungSpec {
    pub target: Target,
    /// Seconds the batch must have waited before the rung is tried.
    pub after_s: u64,
}

impl fmt::Display for RungSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} after {}",
            self.target,
            humantime::format_duration(Duration::from_secs(self.after_s))
        )
    }
}
