//! The web console, `/console/`: one page, its scripts (`app.js` and the
//! modules it imports: one per page and what they share), style and icon,
//! embedded in the binary (no CDN, nothing fetched from elsewhere). The
//! page only reads and acts through the REST API and its event stream,
//! with the caller's own bearer token, so it can do exactly what the
//! caller could do with curl; serving its files needs no token.
//!
//! Every address the page uses is relative to where it was served, so it
//! works behind a reverse proxy that serves flexq under a path prefix
//! (`https://example.com/flexq/console/` talks to `/flexq/v1/...`).

use std::sync::LazyLock;

use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};

use super::Error;
use crate::engine::Reason;

/// The files: name, content type, bytes.
const FILES: [(&str, &str, &[u8]); 12] = [
    (
        "index.html",
        "text/html; charset=utf-8",
        include_bytes!("console/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("console/app.js"),
    ),
    (
        "dom.js",
        "text/javascript; charset=utf-8",
        include_bytes!("console/dom.js"),
    ),
    (
        "session.js",
        "text/javascript; charset=utf-8",
        include_bytes!("console/session.js"),
    ),
    (
        "page.js",
        "text/javascript; charset=utf-8",
        include_bytes!("console/page.js"),
    ),
    (
        "capacity.js",
        "text/javascript; charset=utf-8",
        include_bytes!("console/capacity.js"),
    ),
    (
        "queue.js",
        "text/javascript; charset=utf-8",
        include_bytes!("console/queue.js"),
    ),
    (
        "batch.js",
        "text/javascript; charset=utf-8",
        include_bytes!("console/batch.js"),
    ),
    (
        "quotas.js",
        "text/javascript; charset=utf-8",
        include_bytes!("console/quotas.js"),
    ),
    (
        "usage.js",
        "text/javascript; charset=utf-8",
        include_bytes!("console/usage.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_bytes!("console/app.css"),
    ),
    (
        "favicon.svg",
        "image/svg+xml",
        include_bytes!("console/favicon.svg"),
    ),
];

/// Each file's entity tag: its content's hash, so a browser revalidates
/// (`cache-control: no-cache`) and a new build's files are never stale.
static ETAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    FILES
        .iter()
        .map(|(_, _, bytes)| {
            let digest = Sha256::digest(bytes);
            format!("\"{}\"", URL_SAFE_NO_PAD.encode(&digest[..12]))
        })
        .collect()
});

/// Only this origin's own files and API; no inline script or style, no
/// framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `GET /console`: to `console/`, relative, so a path prefix stays.
pub(super) async fn redirect() -> Response {
    (
        StatusCode::PERMANENT_REDIRECT,
        [(header::LOCATION, HeaderValue::from_static("console/"))],
    )
        .into_response()
}

/// `GET /console/`: the page.
pub(super) async fn index(headers: HeaderMap) -> Response {
    serve("index.html", &headers)
}

/// `GET /console/{file}`: the page's scripts, style and icon.
pub(super) async fn file(Path(name): Path<String>, headers: HeaderMap) -> Response {
    serve(&name, &headers)
}

fn serve(name: &str, headers: &HeaderMap) -> Response {
    let Some(i) = FILES.iter().position(|(n, _, _)| *n == name) else {
        return Error::new(
            Reason::UnknownRoute,
            format!(
                "the console has no file {}; it has: {}",
                crate::api::quote(name),
                FILES.map(|(n, _, _)| n).join(", ")
            ),
        )
        .into_response();
    };
    let (_, content_type, bytes) = FILES[i];
    let etag = &ETAGS[i];
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let common = [
        (header::CACHE_CONTROL, "no-cache"),
        (header::ETAG, etag.as_str()),
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
    ];
    if fresh {
        return (StatusCode::NOT_MODIFIED, common).into_response();
    }
    (
        StatusCode::OK,
        common,
        [(header::CONTENT_TYPE, content_type)],
        bytes,
    )
        .into_response()
}
