//! The one HTTP error type. Every error leaves as a `google.rpc.Status`
//! body; 5xx details are logged here, once, and not sent.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::api::{Code, ErrorBody, FieldViolation, Status};
use crate::spec::Rejection;
use crate::store::StoreError;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: Code,
    pub message: String,
    /// ErrorInfo reason, UPPER_SNAKE_CASE.
    pub reason: &'static str,
    pub metadata: BTreeMap<String, String>,
    pub violations: Vec<FieldViolation>,
}

impl ApiError {
    pub fn new(code: Code, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            message: message.into(),
            reason,
            metadata: BTreeMap::new(),
            violations: Vec::new(),
        }
    }

    /// One invalid field: the message names it, the BadRequest detail
    /// carries it.
    pub fn invalid_field(field: &str, description: impl Into<String>) -> ApiError {
        let description = description.into();
        ApiError::new(
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

    pub fn not_found(what: &str, name: &str) -> ApiError {
        ApiError::new(
            Code::NotFound,
            "NOT_FOUND",
            format!("{what} {name} not found"),
        )
        .with_meta("resource", name)
    }

    pub fn internal(detail: impl std::fmt::Display) -> ApiError {
        ApiError::new(Code::Internal, "INTERNAL", detail.to_string())
    }

    pub fn with_meta(mut self, key: &str, value: impl Into<String>) -> ApiError {
        self.metadata.insert(key.to_string(), value.into());
        self
    }

    pub fn with_violations(mut self, violations: Vec<FieldViolation>) -> ApiError {
        self.violations = violations;
        self
    }
}

impl From<Rejection> for ApiError {
    fn from(r: Rejection) -> ApiError {
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
        ApiError::new(r.code, reason, r.message())
            .with_meta("fields", fields)
            .with_violations(r.violations)
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        match e {
            StoreError::NotFound => ApiError::new(Code::NotFound, "NOT_FOUND", "not found"),
            StoreError::AlreadyExists(m) => ApiError::new(Code::AlreadyExists, "ALREADY_EXISTS", m),
            StoreError::FailedPrecondition(m) => {
                ApiError::new(Code::FailedPrecondition, "WRONG_STATE", m)
            }
            StoreError::Unavailable(m) | StoreError::Fenced(m) | StoreError::Conflict(m) => {
                ApiError::new(Code::Unavailable, "STORE_UNAVAILABLE", m)
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let (message, metadata) = if status.is_server_error() {
            tracing::error!(code = self.code.name(), detail = %self.message, "request failed");
            (
                format!("{} (the details are in the server log)", self.code.name()),
                BTreeMap::new(),
            )
        } else {
            (self.message, self.metadata)
        };
        let body = ErrorBody {
            error: Status::new(self.code, message, self.reason, metadata, &self.violations),
        };
        (status, axum::Json(body)).into_response()
    }
}
