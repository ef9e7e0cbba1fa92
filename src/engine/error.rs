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

/// Why a use case failed, for programs (ErrorInfo `reason`): each has
/// one canonical code, which follows from it ([`Reason::code`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The batch (or another resource) exists already.
    AlreadyExists,
    /// The request body is over `server.max_body_bytes` (REST: 413).
    BodyTooLarge,
    /// A reload found the config invalid; the one in force stays.
    ConfigInvalid,
    /// A body was expected and none came.
    EmptyBody,
    /// The caller's registration (its node epoch) is no longer current.
    Fenced,
    /// A fault of the server's.
    Internal,
    /// A batch the rules refuse (BadRequest lists every field).
    InvalidBatch,
    /// One field of the request is invalid.
    InvalidField,
    /// The URL path does not parse.
    InvalidPath,
    /// The query string does not parse.
    InvalidQuery,
    /// The agent's node lease is unknown: it must register again.
    LeaseLost,
    /// The body is not the JSON the method takes.
    MalformedBody,
    /// The route exists, not with this HTTP method.
    MethodNotAllowed,
    /// The batch could never be allocated (quota limit or declared capacity).
    NeverFits,
    /// The named resource does not exist.
    NotFound,
    /// The database is not reachable (readiness).
    NotReady,
    /// A reload was asked of a server started without a config file.
    NoConfigSource,
    /// An agent registered a GPU pool's node that sees no GPU.
    NoGpusVisible,
    /// No such method on this resource.
    NoSuchMethod,
    /// An operation call that only the batch itself answers.
    OperationIsTheBatch,
    /// The caller may not do this.
    PermissionDenied,
    /// The pool already has `max_nodes` registered nodes.
    PoolFull,
    /// A batch the rules refuse in the state things are in now.
    PreconditionFailed,
    /// Over the caller's rate limit; retry after the metadata's seconds.
    RateLimitExceeded,
    /// Another reload is under way.
    ReloadRunning,
    /// The request ran past its time.
    RequestTimeout,
    /// The database's disk is full: writes are refused, reads go on.
    StoreFull,
    /// The database does not answer.
    StoreUnavailable,
    /// Over `server.max_connections`: the server's state, yet told whole (not hidden as a server error), to be retried.
    TooManyConnections,
    /// The project has `limits.max_pending_per_project` batches queued.
    TooManyPending,
    /// As many event-stream watchers as the server serves.
    TooManyWatchers,
    /// No valid credentials.
    Unauthenticated,
    /// An agent registered a node of a pool the config does not declare.
    UnknownPool,
    /// No such route.
    UnknownRoute,
    /// The body could not be read.
    UnreadableBody,
    /// The body is not JSON.
    UnsupportedContentType,
    /// The batch is not in a state that allows this.
    WrongState,
}

impl Reason {
    /// Its name on the wire, UPPER_SNAKE_CASE.
    pub fn name(self) -> &'static str {
        match self {
            Reason::AlreadyExists => "ALREADY_EXISTS",
            Reason::BodyTooLarge => "BODY_TOO_LARGE",
            Reason::ConfigInvalid => "CONFIG_INVALID",
            Reason::EmptyBody => "EMPTY_BODY",
            Reason::Fenced => "FENCED",
            Reason::Internal => "INTERNAL",
            Reason::InvalidBatch => "INVALID_BATCH",
            Reason::InvalidField => "INVALID_FIELD",
            Reason::InvalidPath => "INVALID_PATH",
            Reason::InvalidQuery => "INVALID_QUERY",
            Reason::LeaseLost => "LEASE_LOST",
            Reason::MalformedBody => "MALFORMED_BODY",
            Reason::MethodNotAllowed => "METHOD_NOT_ALLOWED",
            Reason::NeverFits => "NEVER_FITS",
            Reason::NotFound => "NOT_FOUND",
            Reason::NotReady => "NOT_READY",
            Reason::NoConfigSource => "NO_CONFIG_SOURCE",
            Reason::NoGpusVisible => "NO_GPUS_VISIBLE",
            Reason::NoSuchMethod => "NO_SUCH_METHOD",
            Reason::OperationIsTheBatch => "OPERATION_IS_THE_BATCH",
            Reason::PermissionDenied => "PERMISSION_DENIED",
            Reason::PoolFull => "POOL_FULL",
            Reason::PreconditionFailed => "PRECONDITION_FAILED",
            Reason::RateLimitExceeded => "RATE_LIMIT_EXCEEDED",
            Reason::ReloadRunning => "RELOAD_RUNNING",
            Reason::RequestTimeout => "REQUEST_TIMEOUT",
            Reason::StoreFull => "STORE_FULL",
            Reason::StoreUnavailable => "STORE_UNAVAILABLE",
            Reason::TooManyConnections => "TOO_MANY_CONNECTIONS",
            Reason::TooManyPending => "TOO_MANY_PENDING",
            Reason::TooManyWatchers => "TOO_MANY_WATCHERS",
            Reason::Unauthenticated => "UNAUTHENTICATED",
            Reason::UnknownPool => "UNKNOWN_POOL",
            Reason::UnknownRoute => "UNKNOWN_ROUTE",
            Reason::UnreadableBody => "UNREADABLE_BODY",
            Reason::UnsupportedContentType => "UNSUPPORTED_CONTENT_TYPE",
            Reason::WrongState => "WRONG_STATE",
        }
    }

    /// Its canonical code.
    pub fn code(self) -> Code {
        match self {
            Reason::AlreadyExists => Code::AlreadyExists,
            Reason::BodyTooLarge => Code::ResourceExhausted,
            Reason::ConfigInvalid => Code::FailedPrecondition,
            Reason::EmptyBody => Code::InvalidArgument,
            Reason::Fenced => Code::Aborted,
            Reason::Internal => Code::Internal,
            Reason::InvalidBatch => Code::InvalidArgument,
            Reason::InvalidField => Code::InvalidArgument,
            Reason::InvalidPath => Code::InvalidArgument,
            Reason::InvalidQuery => Code::InvalidArgument,
            Reason::LeaseLost => Code::FailedPrecondition,
            Reason::MalformedBody => Code::InvalidArgument,
            Reason::MethodNotAllowed => Code::NotFound,
            Reason::NeverFits => Code::ResourceExhausted,
            Reason::NotFound => Code::NotFound,
            Reason::NotReady => Code::Unavailable,
            Reason::NoConfigSource => Code::FailedPrecondition,
            Reason::NoGpusVisible => Code::FailedPrecondition,
            Reason::NoSuchMethod => Code::NotFound,
            Reason::OperationIsTheBatch => Code::Unimplemented,
            Reason::PermissionDenied => Code::PermissionDenied,
            Reason::PoolFull => Code::ResourceExhausted,
            Reason::PreconditionFailed => Code::FailedPrecondition,
            Reason::RateLimitExceeded => Code::ResourceExhausted,
            Reason::ReloadRunning => Code::Aborted,
            Reason::RequestTimeout => Code::DeadlineExceeded,
            Reason::StoreFull => Code::ResourceExhausted,
            Reason::StoreUnavailable => Code::Unavailable,
            Reason::TooManyConnections => Code::Unavailable,
            Reason::TooManyPending => Code::ResourceExhausted,
            Reason::TooManyWatchers => Code::ResourceExhausted,
            Reason::Unauthenticated => Code::Unauthenticated,
            Reason::UnknownPool => Code::FailedPrecondition,
            Reason::UnknownRoute => Code::NotFound,
            Reason::UnreadableBody => Code::InvalidArgument,
            Reason::UnsupportedContentType => Code::InvalidArgument,
            Reason::WrongState => Code::FailedPrecondition,
        }
    }
}

/// Why a use case failed; the message is for people, the reason and
/// metadata for programs.
#[derive(Debug, Clone)]
pub struct Error {
    pub code: Code,
    pub message: String,
    /// ErrorInfo reason (its name on the wire, UPPER_SNAKE_CASE).
    pub reason: Reason,
    pub metadata: BTreeMap<String, String>,
    pub violations: Vec<FieldViolation>,
}

impl Error {
    pub fn new(reason: Reason, message: impl Into<String>) -> Error {
        Error {
            code: reason.code(),
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
        Error::new(Reason::InvalidField, format!("{field}: {description}"))
            .with_meta("field", field)
            .with_violations(vec![FieldViolation {
                field: field.to_string(),
                description,
            }])
    }

    pub fn not_found(what: &str, name: &str) -> Error {
        Error::new(Reason::NotFound, format!("{what} {name} not found")).with_meta("resource", name)
    }

    /// Whether the failure is the server's, not the caller's: every 5xx but
    /// UNIMPLEMENTED (a method or form the caller asked for that flexq does
    /// not serve, which the caller must hear about) and
    /// [`Reason::TooManyConnections`].
    pub fn is_server_error(&self) -> bool {
        self.code.http_status() >= 500
            && self.code != Code::Unimplemented
            && self.reason != Reason::TooManyConnections
    }

    /// What a caller may see, on any wire: a server error's message and
    /// metadata are logged here, once, and replaced by its code's name;
    /// the caller's own errors pass unchanged.
    pub fn for_caller(self) -> Error {
        if !self.is_server_error() {
            return self;
        }
        tracing::error!(code = self.code.name(), reason = self.reason.name(), detail = %self.message, "request failed");
        Error {
            message: format!("{} (the details are in the server log)", self.code.name()),
            metadata: BTreeMap::new(),
            ..self
        }
    }

    /// A request that ran past its time (`server.request_timeout`, or a
    /// shorter deadline the caller gave); `what` says which.
    pub fn timed_out(what: impl Into<String>) -> Error {
        Error::new(Reason::RequestTimeout, what)
    }

    pub fn internal(detail: impl std::fmt::Display) -> Error {
        Error::new(Reason::Internal, detail.to_string())
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
            Reason::PreconditionFailed
        } else {
            Reason::InvalidBatch
        };
        let fields = r
            .violations
            .iter()
            .map(|v| v.field.as_str())
            .collect::<Vec<_>>()
            .join(",");
        Error::new(reason, r.message())
            .with_meta("fields", fields)
            .with_violations(r.violations)
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Error {
        match e {
            StoreError::NotFound => Error::new(Reason::NotFound, "not found"),
            StoreError::AlreadyExists(m) => Error::new(Reason::AlreadyExists, m),
            StoreError::FailedPrecondition(m) => Error::new(Reason::WrongState, m),
            // The caller's to hear (not a 5xx whose detail is hidden): gRPC's
            // RESOURCE_EXHAUSTED is the code for a full file system, and a
            // client retries it after a while.
            StoreError::Full(_) => {
                crate::metrics::record_store_full_refusal();
                Error::new(Reason::StoreFull,
                    "the database's disk is full: flexq cannot write until space is freed (nothing it acknowledged is lost, and reads still work); retry later",
                )
                .with_meta(RETRY_AFTER_SECONDS, "5")
            }
            StoreError::Unavailable(m) | StoreError::Fenced(m) | StoreError::Conflict(m) => {
                Error::new(Reason::StoreUnavailable, m)
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
