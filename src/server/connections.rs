//! The listeners' accept loop, in place of `axum::serve`, which sets no
//! timer and no cap: a request head that never ends, a silent or idle
//! connection, or thousands of them, would each hold a task, memory and a
//! file descriptor for ever, until accept fails for want of descriptors
//! and even `/healthz` goes unanswered.
//!
//! Every connection runs in a task of its own (its TLS handshake too, so a
//! slow one never holds up the loop), under a cap taken before it is
//! served. hyper's timer bounds an HTTP/1.1 head
//! (`server.header_read_timeout`); a watchdog of our own closes a
//! connection whose first request does not come within that time (the
//! protocol sniffing of HTTP/1.1 against HTTP/2, an HTTP/2 preface and no
//! more) or that has no request in flight for `server.idle_timeout` (HTTP/2
//! has no timer of its own for either). A connection over the cap is
//! served by a small overflow router with short timeouts, which answers
//! health checks and refuses the rest; beyond that it is closed at once.
//! The cap is kept below the descriptor limit, so the process keeps
//! descriptors for its database, the metrics listener and the overflow.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use crate::config::ServerConfig;

/// Connections over the cap that are still answered at once (health
/// checks, refusals); they come out of `server.reserved_fds`.
const OVERFLOW_CONNECTIONS: usize = 16;

/// How long a connection over the cap may take to send its one request
/// (at most `server.header_read_timeout`): they must not hold the
/// overflow's few places.
const OVERFLOW_TIMEOUT: Duration = Duration::from_secs(1);

/// Connections the metrics listener serves at once (Prometheus needs one
/// or two); they come out of `server.reserved_fds`.
pub(crate) const METRICS_CONNECTIONS: usize = 8;

/// How long the loop waits after a failed accept before trying again: the
/// connection waits in the backlog meanwhile.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// How a listener serves its connections.
pub(crate) struct Limits {
    /// The listener's name in metrics and logs: `api` or `metrics`.
    pub listener: &'static str,
    /// Most connections served at once.
    pub max: usize,
    /// What connections over `max` are served (at most
    /// [`OVERFLOW_CONNECTIONS`] at once); `None`: they are closed.
    pub overflow: Option<Router>,
    pub tls: Option<TlsAcceptor>,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
}

impl Limits {
    /// The API listener's, from `[server]`, with `max` connections.
    pub(crate) fn api(
        server: &ServerConfig,
        max: usize,
        overflow: Router,
        tls: Option<TlsAcceptor>,
    ) -> Limits {
        Limits {
            listener: "api",
            max,
            overflow: Some(overflow),
            tls,
            header_read_timeout: server.header_read_timeout,
            idle_timeout: server.idle_timeout,
        }
    }

    /// The metrics listener's: a few connections, the same timeouts.
    pub(crate) fn metrics(server: &ServerConfig) -> Limits {
        Limits {
            listener: "metrics",
            max: METRICS_CONNECTIONS,
            overflow: None,
            tls: None,
            header_read_timeout: server.header_read_timeout,
            idle_timeout: server.idle_timeout,
        }
    }
}

/// How many connections the API may hold: `server.max_connections`,
/// lowered so that `server.reserved_fds` descriptors stay free under the
/// process's limit (`ulimit -n`).
pub(crate) fn connection_cap(server: &ServerConfig) -> anyhow::Result<usize> {
    use nix::sys::resource::{Resource, getrlimit};
    let (soft, _) = getrlimit(Resource::RLIMIT_NOFILE)
        .map_err(|e| anyhow::anyhow!("cannot read the descriptor limit: {e}"))?;
    let room = soft.saturating_sub(server.reserved_fds);
    if room == 0 {
        anyhow::bail!(
            "the descriptor limit ({soft}, ulimit -n) leaves no room for connections beside server.reserved_fds ({}): raise the limit or lower server.reserved_fds",
            server.reserved_fds
        );
    }
    let cap = server
        .max_connections
        .min(usize::try_from(room).unwrap_or(usize::MAX));
    if cap < server.max_connections {
        tracing::warn!(
            fd_limit = soft,
            reserved_fds = server.reserved_fds,
            max_connections = server.max_connections,
            connections = cap,
            "the descriptor limit lowers server.max_connections; raise ulimit -n (LimitNOFILE=) to serve more"
        );
    }
    Ok(cap)
}

/// Accepts on `listener` until `shutdown` fires, then lets every open
/// connection finish what it is doing (HTTP/2: GOAWAY) and returns when
/// the last has closed.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: CancellationToken,
) {
    let name = limits.listener;
    crate::metrics::set_connection_limit(name, limits.max);
    let served = Arc::new(Semaphore::new(limits.max));
    let overflow = Arc::new(Semaphore::new(OVERFLOW_CONNECTIONS));
    let normal = Arc::new(Connections::new(&limits, router, false));
    let over = limits
        .overflow
        .clone()
        .map(|router| Arc::new(Connections::new(&limits, router, true)));
    let tasks = TaskTracker::new();
    loop {
        let (tcp, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    crate::metrics::record_accept_error(name);
                    tracing::warn!(listener = name, error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        // Small request/response exchanges: do not let Nagle hold a
        // response back waiting for an ACK.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let (connections, permit) = match served.clone().try_acquire_owned() {
            Ok(permit) => (normal.clone(), permit),
            Err(_) => match (&over, overflow.clone().try_acquire_owned()) {
                (Some(over), Ok(permit)) => {
                    crate::metrics::record_connection_refused(name, "overflow");
                    (over.clone(), permit)
                }
                _ => {
                    crate::metrics::record_connection_refused(name, "closed");
                    tracing::debug!(listener = name, %peer, "over the connection cap: closed");
                    continue;
                }
            },
        };
        tasks.spawn(connections.serve(tcp, permit, shutdown.clone()));
    }
    drop(listener);
    tasks.close();
    tasks.wait().await;
}

/// How the connections of one kind (within the cap, or over it) are
/// served.
struct Connections {
    listener: &'static str,
    router: Router,
    builder: auto::Builder<TokioExecutor>,
    tls: Option<TlsAcceptor>,
    /// For the TLS handshake and the first request.
    first: Duration,
    idle: Duration,
}

impl Connections {
    fn new(limits: &Limits, router: Router, overflow: bool) -> Connections {
        let (first, idle) = if overflow {
            let short = limits.header_read_timeout.min(OVERFLOW_TIMEOUT);
            (short, short)
        } else {
            (limits.header_read_timeout, limits.idle_timeout)
        };
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(first)
            // One request and done, over the cap.
            .keep_alive(!overflow);
        builder.http2().timer(TokioTimer::new());
        Connections {
            listener: limits.listener,
            router,
            builder,
            tls: limits.tls.clone(),
            first,
            idle,
        }
    }

    async fn serve(
        self: Arc<Self>,
        tcp: TcpStream,
        _permit: OwnedSemaphorePermit,
        shutdown: CancellationToken,
    ) {
        let _open = crate::metrics::connection_opened(self.listener);
        let Some(acceptor) = &self.tls else {
            return self.serve_io(tcp, &shutdown).await;
        };
        let handshake = tokio::time::timeout(self.first, acceptor.accept(tcp));
        let tls = tokio::select! {
            _ = shutdown.cancelled() => return,
            done = handshake => match done {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    crate::metrics::record_connection_timeout(self.listener, "handshake");
                    tracing::debug!("TLS handshake timed out");
                    return;
                }
            },
        };
        self.serve_io(tls, &shutdown).await
    }

    async fn serve_io<I>(&self, io: I, shutdown: &CancellationToken)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (busy, watched) = watch::channel(Busy::default());
        let busy = Arc::new(busy);
        let router = self.router.clone();
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let in_flight = InFlight::start(busy.clone());
            let call = router.clone().oneshot(request);
            async move {
                let response = call.await?;
                Ok::<_, Infallible>(response.map(|body| {
                    Body::new(Tracked {
                        body,
                        _in_flight: in_flight,
                    })
                }))
            }
        });
        let connection = self.builder.serve_connection(TokioIo::new(io), service);
        let mut connection = std::pin::pin!(connection);
        let mut watchdog = std::pin::pin!(idle(watched.clone(), self.first, self.idle));
        let mut draining = false;
        loop {
            tokio::select! {
                done = connection.as_mut() => {
                    if let Err(e) = done {
                        let timed_out = e
                            .downcast_ref::<hyper::Error>()
                            .is_some_and(hyper::Error::is_timeout);
                        if timed_out {
                            // hyper's head timer; on a connection that has
                            // served requests and has none in flight, it
                            // ran while the connection waited, idle.
                            let now = *watched.borrow();
                            let which = if now.started > 0 && now.in_flight == 0 { "idle" } else { "header" };
                            crate::metrics::record_connection_timeout(self.listener, which);
                        } else {
                            tracing::debug!(listener = self.listener, error = %e, "connection ended with an error");
                        }
                    }
                    return;
                }
                which = watchdog.as_mut() => {
                    // Nothing in flight: dropping the connection closes it.
                    crate::metrics::record_connection_timeout(self.listener, which);
                    return;
                }
                _ = shutdown.cancelled(), if !draining => {
                    connection.as_mut().graceful_shutdown();
                    draining = true;
                }
            }
        }
    }
}

/// What a connection is doing: requests started, and those not yet
/// answered in full.
#[derive(Clone, Copy, Default)]
struct Busy {
    started: u64,
    in_flight: usize,
}

/// One request in flight, from its head to the end of its response body
/// (an event stream's too).
struct InFlight(Arc<watch::Sender<Busy>>);

impl InFlight {
    fn start(busy: Arc<watch::Sender<Busy>>) -> InFlight {
        busy.send_modify(|b| {
            b.started += 1;
            b.in_flight += 1;
        });
        InFlight(busy)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.send_modify(|b| b.in_flight -= 1);
    }
}

/// Resolves when the connection has had no request in flight for `idle`
/// (`first` before its first request), with the timeout's name.
async fn idle(mut busy: watch::Receiver<Busy>, first: Duration, idle: Duration) -> &'static str {
    loop {
        let now = *busy.borrow_and_update();
        if now.in_flight > 0 {
            if busy.changed().await.is_err() {
                // The service is gone, so is the connection.
                return std::future::pending().await;
            }
            continue;
        }
        let (limit, which) = if now.started == 0 {
            (first, "header")
        } else {
            (idle, "idle")
        };
        match tokio::time::timeout(limit, busy.changed()).await {
            Err(_) => return which,
            Ok(Ok(())) => {}
            Ok(Err(_)) => return std::future::pending().await,
        }
    }
}

/// A response body that keeps its request counted in flight until it is
/// sent or dropped.
struct Tracked {
    body: Body,
    _in_flight: InFlight,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn idle_counts_from_the_last_request_and_never_during_one() {
        let (tx, rx) = watch::channel(Busy::default());
        let tx = Arc::new(tx);
        let first = Duration::from_millis(100);
        let limit = Duration::from_millis(300);
        let started = std::time::Instant::now();
        assert_eq!(idle(rx.clone(), first, limit).await, "header");
        assert!(started.elapsed() >= first);

        let watchdog = tokio::spawn(idle(rx, first, limit));
        let request = InFlight::start(tx.clone());
        tokio::time::sleep(limit * 3).await;
        assert!(!watchdog.is_finished(), "a request in flight is not idle");
        drop(request);
        let done = std::time::Instant::now();
        assert_eq!(watchdog.await.expect("watchdog"), "idle");
        assert!(done.elapsed() >= limit, "{:?}", done.elapsed());
    }
}
