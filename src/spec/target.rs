//! What a placement alternative changes of a batch's own placement
//! ([`Target`]) and an alternative as written ([`AlternativeSpec`]): the words
//! of the alternatives syntax, below both the request that holds its alternatives and
//! the operator's rules that resolve them.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::shape::Accelerator;

/// What an alternative changes of the batch's own placement.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Target {
    /// Another GPU type, in the batch's region.
    Accelerator(Accelerator),
    /// The same batch in another region.
    Region(String),
    /// On-demand (standard) quota instead of preemptible: provisioning
    /// mode `default` for the alternative.
    OnDemand,
}

impl fmt::Display for Target {
    /// The form the alternatives syntax uses: `a100-40`, `region europe-west4`,
    /// `on-demand`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Accelerator(a) => write!(f, "{a}"),
            Target::Region(r) => write!(f, "region {r}"),
            Target::OnDemand => f.write_str("on-demand"),
        }
    }
}

/// An alternative as written: a target and its delay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlternativeSpec {
    pub target: Target,
    /// Seconds the batch must have waited before the alternative is tried.
    pub after_s: u64,
}

impl fmt::Display for AlternativeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} after {}",
            self.target,
            humantime::format_duration(Duration::from_secs(self.after_s))
        )
    }
}
