//! The engine's [`Error`] on the HTTP wire. Every error leaves as a
//! `google.rpc.Status` body; a server error's details are logged by
//! [`Error::for_caller`], once, and not sent.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::api::{ErrorBody, Status};
use crate::engine::Error;

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let Error {
            code,
            message,
            reason,
            metadata,
            violations,
        } = self.for_caller();
        let retry_after = metadata
            .get(crate::engine::RETRY_AFTER_SECONDS)
            .and_then(|s| HeaderValue::from_str(s).ok());
        let body = ErrorBody {
            error: Status::new(code, message, reason, metadata, &violations),
        };
        let mut response = (status, axum::Json(body)).into_response();
        if let Some(secs) = retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, secs);
        }
        response
    }
}
