//! Prometheus metrics, declared in one place. Names follow Prometheus
//! conventions (`flexq_` prefix, base units, `_total`); labels are of
//! bounded cardinality (never a batch id).

use std::sync::LazyLock;
use std::time::Duration;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::api::State;

struct Metrics {
    registry: Registry,
    pass_seconds: HistogramVec,
    decisions: IntCounterVec,
    transitions: IntCounterVec,
    commit_seconds: HistogramVec,
    commit_batches: HistogramVec,
    http_requests: IntCounterVec,
    http_seconds: HistogramVec,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let registry = Registry::new();
    let transitions = IntCounterVec::new(
        Opts::new(
            "flexq_batch_transitions_total",
            "Batch state transitions, by the state entered.",
        ),
        &["state"],
    )
    .expect("valid metric");
    let commit_seconds = HistogramVec::new(
        HistogramOpts::new(
            "flexq_store_commit_seconds",
            "Time to commit one group of creates, fsync included.",
        )
        .buckets(prometheus::exponential_buckets(0.0001, 2.0, 16).expect("valid buckets")),
        &["kind"],
    )
    .expect("valid metric");
    let commit_batches = HistogramVec::new(
        HistogramOpts::new(
            "flexq_store_commit_batches",
            "Creates committed per transaction (group commit size).",
        )
        .buckets(prometheus::exponential_buckets(1.0, 2.0, 12).expect("valid buckets")),
        &["kind"],
    )
    .expect("valid metric");
    let http_requests = IntCounterVec::new(
        Opts::new(
            "flexq_http_requests_total",
            "HTTP requests, by route and status code.",
        ),
        &["method", "route", "code"],
    )
    .expect("valid metric");
    let http_seconds = HistogramVec::new(
        HistogramOpts::new(
            "flexq_http_request_duration_seconds",
            "HTTP request latency.",
        )
        .buckets(prometheus::exponential_buckets(0.0005, 2.0, 14).expect("valid buckets")),
        &["method", "route"],
    )
    .expect("valid metric");
    let pass_seconds = HistogramVec::new(
        HistogramOpts::new(
            "flexq_scheduler_pass_seconds",
            "Time of one scheduler pass, decisions and their commit included.",
        )
        .buckets(prometheus::exponential_buckets(0.00005, 2.0, 16).expect("valid buckets")),
        &["outcome"],
    )
    .expect("valid metric");
    let decisions = IntCounterVec::new(
        Opts::new(
            "flexq_scheduler_decisions_total",
            "Scheduler decisions, by kind and region.",
        ),
        &["decision", "region"],
    )
    .expect("valid metric");
    let build = IntGaugeVec::new(
        Opts::new("flexq_build_info", "Build information; the value is 1."),
        &["version"],
    )
    .expect("valid metric");
    build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
    for c in [
        Box::new(transitions.clone()) as Box<dyn prometheus::core::Collector>,
        Box::new(commit_seconds.clone()),
        Box::new(commit_batches.clone()),
        Box::new(http_requests.clone()),
        Box::new(http_seconds.clone()),
        Box::new(build),
        Box::new(pass_seconds.clone()),
        Box::new(decisions.clone()),
    ] {
        registry.register(c).expect("metric registered once");
    }
    Metrics {
        registry,
        pass_seconds,
        decisions,
        transitions,
        commit_seconds,
        commit_batches,
        http_requests,
        http_seconds,
    }
});

/// A batch entered `state`.
pub fn record_transition(state: State) {
    METRICS.transitions.with_label_values(&[state.name()]).inc();
}

/// One group of creates committed.
pub fn record_commit(elapsed: Duration, batches: usize) {
    METRICS
        .commit_seconds
        .with_label_values(&["create"])
        .observe(elapsed.as_secs_f64());
    METRICS
        .commit_batches
        .with_label_values(&["create"])
        .observe(batches as f64);
}

/// One scheduler pass with `decisions` decisions.
pub fn record_pass(elapsed: Duration, decisions: usize) {
    let outcome = if decisions == 0 { "idle" } else { "decided" };
    METRICS
        .pass_seconds
        .with_label_values(&[outcome])
        .observe(elapsed.as_secs_f64());
}

/// A whole cluster allocated in `region`.
pub fn record_allocation(region: &str) {
    METRICS
        .decisions
        .with_label_values(&["allocate", region])
        .inc();
}

/// A batch expired in its queue.
pub fn record_expired() {
    METRICS
        .decisions
        .with_label_values(&["expire", "all"])
        .inc();
}

/// One HTTP request answered.
pub fn record_http(method: &str, route: &str, code: u16, elapsed: Duration) {
    METRICS
        .http_requests
        .with_label_values(&[method, route, &code.to_string()])
        .inc();
    METRICS
        .http_seconds
        .with_label_values(&[method, route])
        .observe(elapsed.as_secs_f64());
}

/// The text exposition of every metric.
pub fn render() -> String {
    let mut buf = Vec::new();
    let encoder = TextEncoder::new();
    if let Err(e) = encoder.encode(&METRICS.registry.gather(), &mut buf) {
        tracing::error!(error = %e, "cannot encode metrics");
    }
    String::from_utf8(buf).unwrap_or_default()
}
