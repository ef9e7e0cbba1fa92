//! The one error of every use case: a `google.rpc.Status` in domain terms
//! (a canonical code, an ErrorInfo reason and metadata, BadRequest field
//! violations). Front ends map it to their wire; none adds its own kinds.

use std::collections::BTreeMap;

use crate::api::{Code, FieldViolation};
use crate::spec::Rejection;
use crate::store::StoreError;

/// The ErrorInfo metadata key of a refusal to retry later (a rate limit,
/// a full disk): whole seconds until a retry can pass (REST sends it as
/// `Retry-After` too, gRPC as a RetryInfo).
pub const RETRY_AFTER_SECONDS: &str = "retryAfterSeconds";

/// The reason of the refusal a connection over `server.max_connections`
/// gets (503 UNAVAILABLE, with `Retry-After`): the server's state, yet the
/// caller must hear it whole to retry, and nothing in it is secret, so it
/// is not a server error that [`Error::for_caller`] hides.
pub const TOO_MANY_CONNECTIONS: &str = "TOO_MANY_CONNECTIONS";

/// Why a use case failed; the message is for people, the reason and
/// metadata for programs.
#[derive(Debug, Clone)]
pub struct Error {
    pub code: Code,
    pub message: String,
    /// ErrorInfo reason, UPPER_SNAKE_CASE.
    pub reason: &'static str,
    pub metadata: BTreeMap<String, String>,
    pub violations: Vec<FieldViolation>,
}

impl Error {
    pub fn new(code: Code, reason: &'static str, message: impl Into<String>) -> Error {
        Error {
            code,
            message: message.into(),
            reason,
            metadata: BTreeMap::new(),
            violations: Vec::new(),
        }
    }

    /// One invalid field: the message names it, the BadRequest detail
    /// carries it.
    pub fn invalid_field(field: &str, description: impl Into<String>) -> Error {
        let description = description.into();
        Error::new(
            Code::InvalidArgument,
            "INVALID_FIELD",
            format!("{field}: {description}"),
        )
        .with_meta("field", field)
        .with_violations(vec![FieldViolation {
            field: field.to_string(),
            description,
        }])
    }

    pub fn not_found(what: &str, name: &str) -> Error {
        Error::new(
            Code::NotFound,
            "NOT_FOUND",
            format!("{what} {name} not found"),
        )
        .with_meta("resource", name)
    }

    /// Whether the failure is the server's, not the caller's: every 5xx but
    /// UNIMPLEMENTED (a method or form the caller asked for that flexq does
    /// not serve, which the caller must hear about) and
    /// [`TOO_MANY_CONNECTIONS`].
    pub fn is_server_error(&self) -> bool {
        self.code.http_status() >= 500
            && self.code != Code::Unimplemented
            && self.reason != TOO_MANY_CONNECTIONS
    }

    /// What a caller may see, on any wire: a server error's message and
    /// metadata are logged here, once, and replaced by its code's name;
    /// the caller's own errors pass unchanged.
    pub fn for_caller(self) -> Error {
        if !self.is_server_error() {
            return self;
        }
        tracing::error!(code = self.code.name(), reason = self.reason, detail = %self.message, "request failed");
        Error {
            message: format!("{} (the details are in the server log)", self.code.name()),
            metadata: BTreeMap::new(),
            ..self
        }
    }

    /// A request that ran past its time (`server.request_timeout`, or a
    /// shorter deadline the caller gave); `what` says which.
    pub fn timed_out(what: impl Into<String>) -> Error {
        Error::new(Code::DeadlineExceeded, "REQUEST_TIMEOUT", what)
    }

    pub fn internal(detail: impl std::fmt::Display) -> Error {
        Error::new(Code::Internal, "INTERNAL", detail.to_string())
    }

    pub fn with_meta(mut self, key: &str, value: impl Into<String>) -> Error {
        self.metadata.insert(key.to_string(), value.into());
        self
    }

    pub fn with_violations(mut self, violations: Vec<FieldViolation>) -> Error {
        self.violations = violations;
        self
    }
}

impl From<Rejection> for Error {
    fn from(r: Rejection) -> Error {
        let reason = if r.code == Code::FailedPrecondition {
            "PRECONDITION_FAILED"
        } else {
            "INVALID_BATCH"
        };
        let fields = r
            .violations
            .iter()
            .map(|v| v.field.as_str())
            .collect::<Vec<_>>()
            .join(",");
        Error::new(r.code, reason, r.message())
            .with_meta("fields", fields)
            .with_violations(r.violations)
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Error {
        match e {
            StoreError::NotFound => Error::new(Code::NotFound, "NOT_FOUND", "not found"),
            StoreError::AlreadyExists(m) => Error::new(Code::AlreadyExists, "ALREADY_EXISTS", m),
            StoreError::FailedPrecondition(m) => {
                Error::new(Code::FailedPrecondition, "WRONG_STATE", m)
            }
            // The caller's to hear (not a 5xx whose detail is hidden): gRPC's
            // RESOURCE_EXHAUSTED is the code for a full file system, and a
            // client retries it after a while.
            StoreError::Full(_) => {
                crate::metrics::record_store_full_refusal();
                Error::new(
                    Code::ResourceExhausted,
                    "STORE_FULL",
                    "the database's disk is full: flexq cannot write until space is freed (nothing it acknowledged is lost, and reads still work); retry later",
                )
                .with_meta(RETRY_AFTER_SECONDS, "5")
            }
            StoreError::Unavailable(m) | StoreError::Fenced(m) | StoreError::Conflict(m) => {
                Error::new(Code::Unavailable, "STORE_UNAVAILABLE", m)
            }
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.name(), self.message)
    }
}

impl std::error::Error for Error {}
