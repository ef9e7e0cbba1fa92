//! The HTTP layer: the REST API of docs/api.md, `/healthz`, `/readyz`,
//! `/metrics`, the runtime catalog, request logging and metrics, request
//! timeouts and graceful shutdown; the listener, which serves HTTP/1.1 and
//! HTTP/2 (h2 by ALPN over TLS, h2c in plaintext) and carries the gRPC
//! services of [`crate::grpc`] beside REST, its connections bounded by
//! [`connections`].

mod agents;
pub(crate) mod auth;
mod batches;
mod capacity;
mod connections;
mod console;
mod error;
mod extract;
pub(crate) mod openapi;
mod queues;
mod reload;
mod routes;
mod tls;

use std::time::Instant;

use axum::error_handling::HandleErrorLayer;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State as AppState};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{BoxError, Json, Router};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;

use crate::engine::Principal;
use crate::engine::Reason;

use crate::config::Config;
use crate::engine::{ConfigSource, Engine, Error, RETRY_AFTER_SECONDS, ReplicaRole};

/// Everything a handler needs; cheap to clone.
///
/// No copy of the config: every read goes to the config in force
/// ([`Engine::config`]), so nothing a reload changed is shown stale.
#[derive(Clone)]
pub struct App {
    /// Every use case; handlers decode, call one, encode.
    pub engine: Engine,
}

impl App {
    /// Opens the store of `config` (running migrations) and starts the
    /// engine, which stops when `shutdown` fires.
    pub async fn open(
        config: Config,
        source: ConfigSource,
        shutdown: CancellationToken,
    ) -> anyhow::Result<App> {
        let engine = Engine::open(config, source, shutdown).await?;
        Ok(App { engine })
    }
}

/// The whole API on one listener: REST (HTTP/1.1 and HTTP/2) and the gRPC
/// services ([`crate::grpc`], HTTP/2), which keep their own error mapping,
/// authentication and metrics. gRPC health answers NOT_SERVING once
/// `shutdown` fires.
pub fn router(app: App, shutdown: CancellationToken) -> anyhow::Result<Router> {
    let grpc = crate::grpc::routes(app.engine.clone(), shutdown)?;
    Ok(rest(app).merge(grpc))
}

/// The REST API of docs/api.md: the routes of [`routes::declare`], each
/// behind its access rule.
fn rest(app: App) -> Router {
    // `server` is read at start only (a restart-only section).
    let server = app.engine.config().server.clone();
    let (timeout, body_limit) = (server.request_timeout, server.max_body_bytes);
    let routes = routes::declare();
    let guard = auth::Guard {
        app: app.clone(),
        rules: std::sync::Arc::new(routes.rules),
    };
    routes
        .router
        .fallback(unknown_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(guard, auth::enforce))
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(|e: BoxError| async move {
                    if e.is::<tower::timeout::error::Elapsed>() {
                        Error::timed_out("the request took longer than server.request_timeout")
                    } else {
                        Error::internal(e)
                    }
                }))
                .timeout(timeout),
        )
        .layer(middleware::from_fn(observe))
        .with_state(app)
}

/// What a connection over `server.max_connections` is served: the health
/// checks, so that probes still answer, and a refusal for everything else.
fn overflow(app: App) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(too_many_connections)
        .with_state(app)
}

/// 503 TOO_MANY_CONNECTIONS with `Retry-After` (gRPC: UNAVAILABLE with a
/// RetryInfo).
async fn too_many_connections(req: Request) -> Response {
    let e = Error::new(Reason::TooManyConnections,
        "the server holds as many connections as it serves (server.max_connections): only /healthz and /readyz are answered on this one; retry shortly",
    )
    .with_meta(RETRY_AFTER_SECONDS, "1");
    if crate::grpc::is_grpc(req.headers()) {
        return crate::grpc::refusal(e);
    }
    e.into_response()
}

/// Logs every request once and counts it, by route template (never by raw
/// path, which would carry ids).
async fn observe(req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().clone();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let path = req.uri().path().to_string();
    let response = next.run(req).await;
    let status = response.status().as_u16();
    let elapsed = started.elapsed();
    crate::metrics::record_http(method.as_str(), &route, status, elapsed);
    if status >= 500 {
        tracing::warn!(http.method = %method, http.path = %path, http.status = status, latency_us = elapsed.as_micros() as u64, "request");
    } else {
        tracing::debug!(http.method = %method, http.path = %path, http.status = status, latency_us = elapsed.as_micros() as u64, "request");
    }
    response
}

async fn unknown_route(req: Request) -> Response {
    if crate::grpc::is_grpc(req.headers()) {
        return crate::grpc::unimplemented(req.uri().path());
    }
    Error::new(
        Reason::UnknownRoute,
        format!(
            "no such resource: {} {}",
            req.method(),
            crate::api::quote(req.uri().path())
        ),
    )
    .with_meta("path", req.uri().path())
    .into_response()
}

async fn method_not_allowed(req: Request) -> Error {
    Error::new(
        Reason::MethodNotAllowed,
        format!(
            "method {} is not supported on {}",
            req.method(),
            crate::api::quote(req.uri().path())
        ),
    )
    .with_meta("method", req.method().as_str())
}

#[utoipa::path(get, path = "/healthz", tag = "health", responses((status = 200, description = "The process is up")))]
async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

/// Ready when the database answers; says which replica this is, its role
/// (`single` on SQLite, `leader` or `follower` on PostgreSQL) and, with
/// several replicas, who holds the leader lease.
#[utoipa::path(get, path = "/readyz", tag = "health", responses((status = 200, description = "The database answers: this replica's role and the leader"), (status = 503, description = "Not ready")))]
async fn readyz(AppState(app): AppState<App>) -> Response {
    match app.engine.readiness().await {
        Ok(ready) => {
            let mut answer = serde_json::json!({
                "status": "ready",
                "replica": ready.replica,
                "role": ready.role.name(),
                "database": ready.database.name(),
                "config": ready.config,
                // Reads are served either way: a full disk is said here, in
                // `flexq_store_full` and its alert, not by taking the
                // replica out of service.
                "store": if ready.store_full { "full: writes are refused until the database's disk has space" } else { "ok" },
            });
            if let ReplicaRole::Leader { term } = ready.role {
                answer["term"] = term.into();
            }
            if let Some(leader) = ready.leader {
                answer["leader"] = leader.into();
            }
            Json(answer).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// `/metrics`, on its own listener: event metrics and the gauges of a
/// scheduler snapshot taken now.
async fn metrics(AppState(app): AppState<App>) -> Response {
    let snapshot = app.engine.snapshot().await;
    (
        StatusCode::OK,
        [("content-type", "text/plain; version=0.0.4")],
        crate::metrics::render(
            Some(&snapshot),
            &app.engine.long_polls(),
            Some(app.engine.store_full()),
        ),
    )
        .into_response()
}

/// Serves `/metrics`, and the health checks `/healthz` and `/readyz`, on
/// `listener` until `shutdown` fires. The probes belong here: a flood of
/// the API port (over `server.max_connections`) takes the API's overflow
/// places, and a probe there can be closed unanswered; this listener is
/// its own.
pub async fn run_metrics(
    listener: TcpListener,
    app: App,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "metrics listening");
    let limits = connections::Limits::metrics(&app.engine.config().server);
    let router = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(unknown_route)
        .with_state(app);
    connections::serve(listener, router, limits, shutdown).await;
    Ok(())
}

/// The runtime catalog: what each version carries.
#[utoipa::path(get, path = "/v1/runtimes", tag = "catalog", responses((status = 200, description = "Each runtime's Spark, RAPIDS and XGBoost versions")))]
async fn runtimes(AppState(app): AppState<App>) -> Json<serde_json::Value> {
    let config = app.engine.config();
    let list: Vec<_> = config
        .runtimes
        .iter()
        .map(|(version, r)| {
            serde_json::json!({
                "version": version,
                "sparkVersion": r.spark,
                "rapidsVersion": r.rapids,
                "xgboostVersion": r.xgboost,
                "default": *version == config.batches.default_runtime,
            })
        })
        .collect();
    Json(serde_json::json!({ "runtimes": list }))
}

/// Serves `app` on `listener` until `shutdown` fires, then drains in-flight
/// requests for at most `server.shutdown_timeout` and closes the store.
pub async fn run(
    listener: TcpListener,
    app: App,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    // `server` is read at start only (a restart-only section).
    let server = app.engine.config().server.clone();
    let drain = server.shutdown_timeout;
    let engine = app.engine.clone();
    let addr = listener.local_addr()?;
    let tls = match (&server.tls_cert, &server.tls_key) {
        (Some(cert), Some(key)) => Some(tls::acceptor(cert, key)?),
        _ => None,
    };
    let cap = connections::connection_cap(&server)?;
    if tls.is_some() {
        tracing::info!(%addr, console = %format!("https://{addr}/console/"), connections = cap, "flexq listening (HTTPS)");
    } else {
        tracing::info!(%addr, console = %format!("http://{addr}/console/"), connections = cap, "flexq listening");
    }
    let limits = connections::Limits::api(&server, cap, overflow(app.clone()), tls);
    let router = router(app, shutdown.clone())?;
    let server = tokio::spawn(connections::serve(
        listener,
        router,
        limits,
        shutdown.clone(),
    ));
    shutdown.cancelled().await;
    // A leader hands over first: another replica need not wait for the
    // lease to lapse while this one drains.
    if tokio::time::timeout(std::time::Duration::from_secs(2), engine.election_done())
        .await
        .is_err()
    {
        tracing::warn!("leader election did not stop in 2s; the lease lapses by itself");
    }
    tracing::info!(
        drain_s = drain.as_secs(),
        "shutting down: draining in-flight requests"
    );
    match tokio::time::timeout(drain, server).await {
        Ok(result) => result?,
        Err(_) => tracing::warn!("drain timeout passed; closing with requests in flight"),
    }
    engine.close().await;
    tracing::info!("flexq stopped");
    Ok(())
}

/// Cancels `token` on SIGINT or SIGTERM.
pub fn cancel_on_signals(token: CancellationToken) {
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let term = std::future::pending::<()>();
        tokio::select! {
            _ = ctrl_c => tracing::info!("SIGINT received"),
            _ = term => tracing::info!("SIGTERM received"),
        }
        token.cancel();
    });
}

/// Reloads the config on every SIGHUP (as `POST /v1/config:reload` does;
/// the reload logs and counts how it went).
#[cfg(unix)]
fn reload_on_sighup(
    mut hangups: tokio::signal::unix::Signal,
    engine: Engine,
    token: CancellationToken,
) {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = token.cancelled() => return,
                got = hangups.recv() => if got.is_none() { return },
            }
            tracing::info!("SIGHUP received: reloading the config");
            let _ = engine.reload_config(None, "SIGHUP").await;
        }
    });
}

/// Serves with `config` (read from `source`) until SIGINT/SIGTERM;
/// reloads it on SIGHUP.
pub async fn serve(config: Config, source: ConfigSource) -> anyhow::Result<()> {
    // Taken first: SIGHUP's default is to end the process.
    #[cfg(unix)]
    let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let bind = config.server.bind;
    let listener = TcpListener::bind(bind)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {bind} (server.bind): {e}"))?;
    let metrics_bind = config.server.metrics_bind;
    let metrics_listener = TcpListener::bind(metrics_bind).await.map_err(|e| {
        anyhow::anyhow!("cannot listen on {metrics_bind} (server.metrics_bind): {e}")
    })?;
    let token = CancellationToken::new();
    cancel_on_signals(token.clone());
    if config.principals.is_empty() {
        tracing::warn!(bind = %bind, "no principals are configured: serving only on loopback, and every caller there is an anonymous admin");
    } else {
        tracing::info!(
            principals = config.principals.len(),
            "bearer tokens required"
        );
    }
    let app = App::open(config, source, token.clone()).await?;
    #[cfg(unix)]
    reload_on_sighup(hangups, app.engine.clone(), token.clone());
    tokio::spawn(run_metrics(metrics_listener, app.clone(), token.clone()));
    run(listener, app, token).await
}
