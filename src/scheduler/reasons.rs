//! Why a batch is not admitted, as types: what stands in its way now
//! ([`Blocker`]), each reason's kind and words ([`Reason`],
//! [`NotAdmitted`]), what a queued batch shows ([`PendingInfo`]) and what
//! a validate-only create would meet ([`Verdict`]). Worked out in
//! `pending.rs`; read by the API, the metrics and the expiry messages.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::model::BatchKey;
use super::quota::Shortfall;

/// Why a batch is not admitted (yet).
#[derive(Debug, Clone, PartialEq)]
pub enum Blocker {
    Quota(Shortfall),
    /// `placed` of `total` parts fit in the best zone.
    Capacity {
        total: usize,
        placed: usize,
        closest_zone: Option<String>,
        shape: String,
    },
    /// Fits, but would delay the reservation of an earlier, larger batch.
    Reservation {
        holder: BatchKey,
        until: Option<DateTime<Utc>>,
    },
    /// An admin held the queue.
    Held {
        since: DateTime<Utc>,
        by: String,
        /// The whole region's queue, not only the project's.
        region_wide: bool,
    },
    /// Other projects' batches come first in fair-share order.
    FairShare {
        /// Queued batches of the projects ahead.
        batches: usize,
        /// The projects ahead, lowest usage ÷ weight first (at most three),
        /// with their usage ÷ weight.
        ahead: Vec<(String, f64)>,
        /// How many projects are ahead in all.
        projects: usize,
        /// The batch's own project's usage ÷ weight.
        yours: f64,
    },
}

impl std::fmt::Display for Blocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Blocker::Quota(s) => write!(f, "{s}"),
            Blocker::Capacity {
                total,
                placed,
                closest_zone,
                shape,
            } => match closest_zone {
                Some(z) => write!(
                    f,
                    "needs all {total} parts of {shape} in one zone; the best zone, {z}, has room for {placed}"
                ),
                None => write!(
                    f,
                    "needs all {total} parts of {shape} in one zone; the region has no nodes for them"
                ),
            },
            Blocker::Reservation { until, .. } => match until {
                Some(t) => write!(
                    f,
                    "capacity is reserved for an earlier batch of the queue until about {}",
                    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ),
                None => write!(f, "capacity is reserved for an earlier batch of the queue"),
            },
            Blocker::Held {
                since,
                by,
                region_wide,
            } => write!(
                f,
                "{} held by an admin ({by}) since {}: nothing in it is allocated until it is resumed; the allocation timeout keeps counting",
                if *region_wide {
                    "the region's queue is"
                } else {
                    "this project's queue is"
                },
                since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
            Blocker::FairShare {
                batches,
                ahead,
                projects,
                yours,
            } => {
                let theirs = ahead
                    .iter()
                    .map(|(p, s)| format!("{p} {s:.2}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                let more = if *projects > ahead.len() {
                    format!(" and {} more", projects - ahead.len())
                } else {
                    String::new()
                };
                write!(
                    f,
                    "behind {batches} batch{} of {projects} project{} in fair-share order: usage ÷ weight (decayed GPUs) is {theirs}{more}; yours {yours:.2}",
                    if *batches == 1 { "" } else { "es" },
                    if *projects == 1 { "" } else { "s" },
                )
            }
        }
    }
}

impl Blocker {
    /// What kind of reason it is.
    pub fn kind(&self) -> NotAdmitted {
        match self {
            Blocker::Quota(_) => NotAdmitted::Quota,
            Blocker::Capacity { .. } => NotAdmitted::Capacity,
            Blocker::Reservation { .. } => NotAdmitted::Reservation,
            Blocker::Held { .. } => NotAdmitted::Held,
            Blocker::FairShare { .. } => NotAdmitted::FairShare,
        }
    }

    pub(super) fn reason(&self) -> Reason {
        Reason::new(self.kind(), self.to_string())
    }
}

/// Why a batch is not admitted (yet), as a kind: the machine-readable
/// side of each reason (`flexq.notAdmitted[].reason`), and the label of
/// the queued-batches metric for the first three.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum NotAdmitted {
    /// Its project lacks the quota in the region.
    Quota,
    /// No zone has room for the whole cluster now.
    Capacity,
    /// It fits, but would delay an earlier batch's reservation.
    Reservation,
    /// An admin held its queue.
    Held,
    /// Other projects' batches come first in fair-share order.
    FairShare,
    /// Earlier batches of the region's queue go first (validate-only).
    QueuedAhead,
    /// What preemption does, or would do, for it.
    Preemption,
    /// Why one of its placement alternatives has not taken it.
    Alternative,
    /// New nodes are being created for it (docs/rules.md#provisioned-capacity).
    Provisioning,
    /// Its estimated start lies after its allocation deadline.
    LikelyToExpire,
}

impl NotAdmitted {
    /// Its name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            NotAdmitted::Quota => "QUOTA",
            NotAdmitted::Capacity => "CAPACITY",
            NotAdmitted::Reservation => "RESERVATION",
            NotAdmitted::Held => "HELD",
            NotAdmitted::FairShare => "FAIR_SHARE",
            NotAdmitted::QueuedAhead => "QUEUED_AHEAD",
            NotAdmitted::Preemption => "PREEMPTION",
            NotAdmitted::Alternative => "ALTERNATIVE",
            NotAdmitted::Provisioning => "PROVISIONING",
            NotAdmitted::LikelyToExpire => "LIKELY_TO_EXPIRE",
        }
    }

    /// Its label in metrics (`flexq_pending_batches{reason}`).
    pub const fn label(self) -> &'static str {
        match self {
            NotAdmitted::Quota => "quota",
            NotAdmitted::Capacity => "capacity",
            NotAdmitted::Reservation => "reservation",
            NotAdmitted::Held => "held",
            NotAdmitted::FairShare => "fair_share",
            NotAdmitted::QueuedAhead => "queued_ahead",
            NotAdmitted::Preemption => "preemption",
            NotAdmitted::Alternative => "alternative",
            NotAdmitted::Provisioning => "provisioning",
            NotAdmitted::LikelyToExpire => "likely_to_expire",
        }
    }
}

/// One reason a batch is not admitted: its kind, and what it says with
/// numbers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reason {
    pub kind: NotAdmitted,
    pub message: String,
}

impl Reason {
    pub fn new(kind: NotAdmitted, message: impl Into<String>) -> Reason {
        Reason {
            kind,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The messages of `reasons`, in order (`notAdmittedReasons`).
pub fn messages(reasons: &[Reason]) -> Vec<String> {
    reasons.iter().map(|r| r.message.clone()).collect()
}

/// What the API shows of a waiting batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingInfo {
    pub queue_position: usize,
    pub reasons: Vec<Reason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_start_time: Option<DateTime<Utc>>,
}

/// The verdict of a validate-only create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    AllocateNow {
        zone: String,
    },
    WouldQueue {
        reasons: Vec<Reason>,
    },
    /// Default mode without room now: the batch would fail at once, for
    /// `cause` (a stock-out, or quota).
    WouldFail {
        reason: String,
        cause: crate::api::EndReason,
    },
    NeverFits {
        reason: String,
    },
}
