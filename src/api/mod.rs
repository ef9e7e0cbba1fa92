//! Wire types shared by the server, the CLI and the tests: the Batch
//! resource, Operations, the state enum and the `google.rpc.Status` error
//! body. Nothing here does I/O.

mod batch;
mod names;
mod status;
mod usage;

pub use batch::*;
pub use names::*;
pub use status::*;
pub use usage::*;

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

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
