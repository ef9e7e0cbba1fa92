//! The engine's [`Error`] on the HTTP wire. Every error leaves as a
//! `google.rpc.Status` body; a server error's details are logged by
//! [`Error::for_caller`], once, and not sent.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::api::{ErrorBody, Status};
use crate::engine::Error;

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        // A body over the limit is the one answer whose HTTP status is not
        // its code's: 413, which HTTP clients and proxies know.
        let status = if self.reason == crate::engine::Reason::BodyTooLarge {
            StatusCode::PAYLOAD_TOO_LARGE
        } else {
            StatusCode::from_u16(self.code.http_status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
        };
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
        let mut error = Status::new(code, message, reason.name(), metadata, &violations);
        error.code = status.as_u16();
        let body = ErrorBody { error };
        let mut response = (status, axum::Json(body)).into_response();
        if let Some(secs) = retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, secs);
        }
        response
    }
}
