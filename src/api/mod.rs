//! Wire types shared by the server, the CLI and the tests: the Batch
//! resource, Operations, the state enum and the `google.rpc.Status` error
//! body. Nothing here does I/O.

mod batch;
mod names;
mod status;
mod usage;
mod verdict;

pub use batch::*;
pub use names::*;
pub use status::*;
pub use usage::*;
pub use verdict::*;

use serde::{Deserialize, Serialize};

/// The public state enum of a batch (docs/rules.md#states), numbered as in the proto.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum State {
    StateUnspecified = 0,
    Pending = 1,
    Running = 2,
    Cancelling = 3,
    Cancelled = 4,
    Succeeded = 5,
    Failed = 6,
}

impl State {
    pub const ALL: [State; 7] = [
        State::StateUnspecified,
        State::Pending,
        State::Running,
        State::Cancelling,
        State::Cancelled,
        State::Succeeded,
        State::Failed,
    ];

    pub fn number(self) -> i32 {
        self as i32
    }

    pub fn from_number(n: i64) -> Option<State> {
        State::ALL.into_iter().find(|s| i64::from(s.number()) == n)
    }

    pub fn name(self) -> &'static str {
        match self {
            State::StateUnspecified => "STATE_UNSPECIFIED",
            State::Pending => "PENDING",
            State::Running => "RUNNING",
            State::Cancelling => "CANCELLING",
            State::Cancelled => "CANCELLED",
            State::Succeeded => "SUCCEEDED",
            State::Failed => "FAILED",
        }
    }

    pub fn from_name(name: &str) -> Option<State> {
        State::ALL.into_iter().find(|s| s.name() == name)
    }

    /// SUCCEEDED, CANCELLED and FAILED never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, State::Succeeded | State::Cancelled | State::Failed)
    }
}

/// Why a batch ended without succeeding: stored with the batch, and the
/// one thing its API error code, its metrics label and the console's badge
/// are derived from (its message is free text, for people).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EndReason {
    /// Its allocation timeout passed in the queue (queue mode).
    Expired = 1,
    /// No zone had capacity for it at once (default mode).
    StockOut = 2,
    /// Its project's quota had no room for it at once (default mode).
    Quota = 3,
    /// The infrastructure failed under it (a lost node, an agent that
    /// restarted without its work) and it had no requeue left.
    Infrastructure = 4,
    /// Its own work failed: the driver, or a part that could not run.
    WorkFailed = 5,
    /// A user cancelled it.
    Cancelled = 6,
    /// The GPU idle policy cancelled it: its GPUs did no work
    /// (docs/rules.md#gpu-telemetry).
    IdleGpus = 7,
}

impl EndReason {
    pub const ALL: [EndReason; 7] = [
        EndReason::Expired,
        EndReason::StockOut,
        EndReason::Quota,
        EndReason::Infrastructure,
        EndReason::WorkFailed,
        EndReason::Cancelled,
        EndReason::IdleGpus,
    ];

    /// Its number in the store.
    pub fn number(self) -> i64 {
        self as i64
    }

    pub fn from_number(n: i64) -> Option<EndReason> {
        EndReason::ALL.into_iter().find(|r| r.number() == n)
    }

    /// Its name on the wire (`flexq.endReason`) and on the console.
    pub fn name(self) -> &'static str {
        match self {
            EndReason::Expired => "EXPIRED",
            EndReason::StockOut => "STOCK_OUT",
            EndReason::Quota => "QUOTA",
            EndReason::Infrastructure => "INFRASTRUCTURE",
            EndReason::WorkFailed => "WORK_FAILED",
            EndReason::Cancelled => "CANCELLED",
            EndReason::IdleGpus => "IDLE_GPUS",
        }
    }

    /// The code of the batch's operation error (google.rpc.Code).
    pub fn code(self) -> Code {
        match self {
            EndReason::Expired => Code::DeadlineExceeded,
            EndReason::StockOut | EndReason::Quota => Code::ResourceExhausted,
            EndReason::Infrastructure | EndReason::WorkFailed => Code::FailedPrecondition,
            EndReason::Cancelled | EndReason::IdleGpus => Code::Cancelled,
        }
    }

    /// Its label in metrics (`reason`).
    pub fn label(self) -> &'static str {
        match self {
            EndReason::Expired => "expired",
            EndReason::StockOut => "stockout",
            EndReason::Quota => "quota",
            EndReason::Infrastructure => "infrastructure",
            EndReason::WorkFailed => "work_failed",
            EndReason::Cancelled => "cancelled",
            EndReason::IdleGpus => "idle_gpus",
        }
    }
}

/// Why a batch went back to the queue, once it has: stored with it
/// (`flexq.requeueReason`), and named first in its operation's warnings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequeueReason {
    /// A node under it was lost or its agent restarted without its work.
    Infrastructure = 1,
    /// Its cluster was preempted for another batch (docs/rules.md#preemption).
    Preempted = 2,
    /// It ran on a loan of others' capacity, and they took it back
    /// (docs/rules.md#loans-and-reclaim).
    Reclaimed = 3,
}

impl RequeueReason {
    pub const ALL: [RequeueReason; 3] = [
        RequeueReason::Infrastructure,
        RequeueReason::Preempted,
        RequeueReason::Reclaimed,
    ];

    /// Its number in the store.
    pub fn number(self) -> i64 {
        self as i64
    }

    pub fn from_number(n: i64) -> Option<RequeueReason> {
        RequeueReason::ALL.into_iter().find(|r| r.number() == n)
    }

    /// Its name on the wire (`flexq.requeueReason`, the operation's warning).
    pub fn name(self) -> &'static str {
        match self {
            RequeueReason::Infrastructure => "INFRASTRUCTURE",
            RequeueReason::Preempted => "PREEMPTED",
            RequeueReason::Reclaimed => "RECLAIMED",
        }
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
