//! Extractors whose rejections are `google.rpc.Status` errors, never axum's
//! default plain-text bodies, and the response encoder that honours
//! `$alt=json;enum-encoding=int`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api::State;
use crate::engine::Error;
use crate::engine::Reason;

/// A JSON request body, checked for content type, size and unknown fields.
pub(super) struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self, Error> {
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_ascii_lowercase);
        let is_json = content_type.as_deref().is_some_and(|ct| {
            let mime = ct.split(';').next().unwrap_or_default().trim();
            mime == "application/json"
                || (mime.starts_with("application/") && mime.ends_with("+json"))
        });
        if !is_json {
            return Err(Error::new(
                Reason::UnsupportedContentType,
                format!(
                    "Content-Type {} is not accepted; send the body as application/json",
                    content_type
                        .as_deref()
                        .map(crate::api::quote)
                        .unwrap_or_else(|| "(none)".into())
                ),
            )
            .with_meta("contentType", content_type.unwrap_or_default()));
        }
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(body_rejection)?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(Error::new(
                Reason::EmptyBody,
                "the request body is empty; a JSON object is expected",
            ));
        }
        // serde would read a struct from an array too; a proto3 message is
        // always a JSON object.
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(Error::new(
                Reason::MalformedBody,
                "the request body must be a JSON object",
            )
            .with_meta("field", "body"));
        }
        let de = &mut serde_json::Deserializer::from_slice(&bytes);
        match serde_path_to_error::deserialize(de) {
            Ok(value) => Ok(JsonBody(value)),
            Err(err) => {
                let path = err.path().to_string();
                let inner = err.inner();
                let field = if path == "." {
                    "body".to_string()
                } else {
                    path
                };
                let description = format!("{inner}");
                Err(Error::new(
                    Reason::MalformedBody,
                    format!("invalid JSON body at {field}: {description}"),
                )
                .with_meta("field", field.clone())
                .with_meta("line", inner.line().to_string())
                .with_meta("column", inner.column().to_string())
                .with_violations(vec![crate::api::FieldViolation { field, description }]))
            }
        }
    }
}

/// The reason of a body over `server.max_body_bytes`: RESOURCE_EXHAUSTED
/// (as gRPC answers a message over its limit), HTTP 413.
fn body_rejection(r: BytesRejection) -> Error {
    if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
        // Whether its length was declared or it came chunked: 413.
        Error::new(
            Reason::BodyTooLarge,
            "the request body is larger than the server accepts (server.max_body_bytes)",
        )
    } else {
        Error::new(Reason::UnreadableBody, r.body_text())
    }
}

/// Path parameters.
pub(super) struct ApiPath<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Error> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(v)| ApiPath(v))
            .map_err(|e| Error::new(Reason::InvalidPath, e.body_text()))
    }
}

/// The system parameters of Google's APIs, which every route accepts
/// whatever its own parameters: `$alt` (read by [`Format`]), `$fields`
/// and `$prettyPrint` (accepted and ignored: answers carry every field,
/// compact), the last two also without their `$`, as Google's APIs take
/// them. Said here once; a handler's own query type never names them, and
/// the document gets them from `openapi.rs`'s `CommonResponses`.
pub(super) const SYSTEM_PARAMETERS: &[&str] =
    &["$alt", "$fields", "fields", "$prettyPrint", "prettyPrint"];

/// Query parameters, less the [`SYSTEM_PARAMETERS`]; unknown ones are
/// refused (a misspelt `pageSize` must not silently give the default).
pub(super) struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Error> {
        let own = own_query(parts.uri.query().unwrap_or_default());
        // The handler's own parameters are read by axum's `Query` from
        // their pieces as sent, so what it refuses and how it says so is
        // as it was before the system parameters were set aside.
        let uri: Uri = format!("/?{own}")
            .parse()
            .map_err(|e| invalid_query(format!("{e}")))?;
        Query::<T>::try_from_uri(&uri)
            .map(|Query(v)| ApiQuery(v))
            .map_err(|e| {
                let text = e.body_text();
                let detail = text
                    .strip_prefix("Failed to deserialize query string: ")
                    .unwrap_or(&text)
                    .to_string();
                invalid_query(detail)
            })
    }
}

fn invalid_query(detail: String) -> Error {
    Error::new(
        Reason::InvalidQuery,
        format!("invalid query parameters: {detail}"),
    )
    .with_meta("detail", detail)
}

/// `query` without its system parameters: the pieces (`name=value`,
/// split at `&` as a form is) whose decoded name is not one, kept as sent.
fn own_query(query: &str) -> String {
    query
        .split('&')
        .filter(|piece| {
            let name = serde_urlencoded::from_str::<Vec<(String, String)>>(piece)
                .ok()
                .and_then(|pairs| pairs.into_iter().next())
                .map(|(name, _)| name);
            !name.is_some_and(|n| SYSTEM_PARAMETERS.contains(&n.as_str()))
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// How to encode enums in the answer: names (proto3 JSON default) or
/// numbers (`$alt=json;enum-encoding=int`, sent by Google's client
/// libraries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Format {
    EnumNames,
    EnumInts,
}

impl Format {
    pub(super) fn from_query(query: Option<&str>) -> Format {
        let Some(query) = query else {
            return Format::EnumNames;
        };
        let wants_ints = serde_urlencoded::from_str::<Vec<(String, String)>>(query)
            .unwrap_or_default()
            .iter()
            .any(|(k, v)| k == "$alt" && v.split(';').any(|p| p.trim() == "enum-encoding=int"));
        if wants_ints {
            Format::EnumInts
        } else {
            Format::EnumNames
        }
    }

    /// Encodes `value` as the answer body.
    pub(super) fn respond<T: Serialize>(self, status: StatusCode, value: &T) -> Response {
        if self == Format::EnumNames {
            return (status, axum::Json(value)).into_response();
        }
        let mut json = match serde_json::to_value(value) {
            Ok(v) => v,
            Err(e) => {
                return Error::internal(format!("cannot encode answer: {e}")).into_response();
            }
        };
        enums_to_ints(&mut json);
        (status, axum::Json(json)).into_response()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Format {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Error> {
        Ok(Format::from_query(parts.uri.query()))
    }
}

/// Rewrites enum fields to their numbers, leaving user maps (labels,
/// properties, …) untouched.
fn enums_to_ints(v: &mut serde_json::Value) {
    const USER_MAPS: &[&str] = &["labels", "properties", "queryVariables", "endpoints"];
    match v {
        serde_json::Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                if USER_MAPS.contains(&key.as_str()) {
                    continue;
                }
                match (key.as_str(), value.as_str()) {
                    ("state", Some(name)) => {
                        if let Some(s) = State::from_name(name) {
                            *value = s.number().into();
                        }
                    }
                    ("operationType", Some("BATCH")) => *value = 1.into(),
                    _ => enums_to_ints(value),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(enums_to_ints),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enum_int_encoding_spares_user_maps() {
        let mut v = serde_json::json!({
            "state": "PENDING",
            "labels": {"state": "PENDING"},
            "stateHistory": [{"state": "RUNNING"}],
            "metadata": {"operationType": "BATCH"}
        });
        enums_to_ints(&mut v);
        assert_eq!(
            v,
            serde_json::json!({
                "state": 1,
                "labels": {"state": "PENDING"},
                "stateHistory": [{"state": 2}],
                "metadata": {"operationType": 1}
            })
        );
    }

    #[test]
    fn system_parameters_are_set_aside_and_the_rest_kept_as_sent() {
        assert_eq!(
            own_query("%24alt=json%3Benum-encoding%3Dint&pageSize=5&$fields=x&prettyPrint=false"),
            "pageSize=5"
        );
        assert_eq!(own_query("fields=a&$prettyPrint=1"), "");
        // Not a system parameter: left for the handler's type to refuse.
        assert_eq!(
            own_query("$alt=json&$foo=1&alt=json&pageToken=a%26b"),
            "$foo=1&alt=json&pageToken=a%26b"
        );
    }

    #[test]
    fn the_official_clients_query_is_recognised() {
        assert_eq!(
            Format::from_query(Some("%24alt=json%3Benum-encoding%3Dint")),
            Format::EnumInts
        );
        assert_eq!(
            Format::from_query(Some("$alt=json;enum-encoding=int")),
            Format::EnumInts
        );
        assert_eq!(Format::from_query(Some("$alt=json")), Format::EnumNames);
        assert_eq!(Format::from_query(None), Format::EnumNames);
    }
}
