//! `google.rpc.Status` error bodies:
//! `{"error": {"code", "message", "status", "details": [ErrorInfo, BadRequest?]}}`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The canonical error codes flexq answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Code {
    Cancelled,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    Unauthenticated,
}

impl Code {
    /// The HTTP status of the REST mapping.
    pub fn http_status(self) -> u16 {
        match self {
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
            Code::Unauthenticated => 401,
            Code::PermissionDenied => 403,
            Code::NotFound => 404,
            Code::AlreadyExists | Code::Aborted => 409,
            Code::ResourceExhausted => 429,
            Code::Cancelled => 499,
            Code::Internal => 500,
            Code::Unimplemented => 501,
            Code::Unavailable => 503,
            Code::DeadlineExceeded => 504,
        }
    }

    /// The gRPC code number (used inside Operations).
    pub fn grpc_number(self) -> i32 {
        match self {
            Code::Cancelled => 1,
            Code::InvalidArgument => 3,
            Code::DeadlineExceeded => 4,
            Code::NotFound => 5,
            Code::AlreadyExists => 6,
            Code::PermissionDenied => 7,
            Code::ResourceExhausted => 8,
            Code::FailedPrecondition => 9,
            Code::Aborted => 10,
            Code::OutOfRange => 11,
            Code::Unimplemented => 12,
            Code::Internal => 13,
            Code::Unavailable => 14,
            Code::Unauthenticated => 16,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Code::Cancelled => "CANCELLED",
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Code::NotFound => "NOT_FOUND",
            Code::AlreadyExists => "ALREADY_EXISTS",
            Code::PermissionDenied => "PERMISSION_DENIED",
            Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Code::FailedPrecondition => "FAILED_PRECONDITION",
            Code::Aborted => "ABORTED",
            Code::OutOfRange => "OUT_OF_RANGE",
            Code::Unimplemented => "UNIMPLEMENTED",
            Code::Internal => "INTERNAL",
            Code::Unavailable => "UNAVAILABLE",
            Code::Unauthenticated => "UNAUTHENTICATED",
        }
    }
}

/// One invalid field: the proto path of the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldViolation {
    pub field: String,
    pub description: String,
}

/// The body of every error answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: Status,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    pub code: u16,
    pub message: String,
    pub status: Code,
    #[serde(default)]
    pub details: Vec<serde_json::Value>,
}

impl Status {
    /// Builds the body: exactly one ErrorInfo (reason + metadata) and, when
    /// there are field violations, one BadRequest.
    pub fn new(
        code: Code,
        message: impl Into<String>,
        reason: &str,
        metadata: BTreeMap<String, String>,
        violations: &[FieldViolation],
    ) -> Status {
        let mut details = vec![serde_json::json!({
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": reason,
            "domain": "flexq",
            "metadata": metadata,
        })];
        if !violations.is_empty() {
            details.push(serde_json::json!({
                "@type": "type.googleapis.com/google.rpc.BadRequest",
                "fieldViolations": violations,
            }));
        }
        Status {
            code: code.http_status(),
            message: message.into(),
            status: code,
            details,
        }
    }

    /// The field violations of the BadRequest detail, if any.
    pub fn field_violations(&self) -> Vec<FieldViolation> {
        self.details
            .iter()
            .filter_map(|d| d.get("fieldViolations"))
            .filter_map(|v| serde_json::from_value::<Vec<FieldViolation>>(v.clone()).ok())
            .flatten()
            .collect()
    }
}
