//! The agent's side of the agent protocol, over HTTP.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::protocol::{Assignments, Lease, OutputUpload, Poll, RegisterNode, Report, ReportEvent};

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum CallError {
    /// The node's lease is gone or another registration replaced this one:
    /// the agent must stop its work and register again.
    #[error("lease lost: {0}")]
    LeaseLost(String),
    /// The server refused the call for good (4xx).
    #[error("refused: {0}")]
    Refused(String),
    /// Network trouble or a 5xx: worth retrying.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

#[derive(Clone)]
pub(super) struct AgentClient {
    http: reqwest::Client,
    base: String,
    node: String,
    token: Option<String>,
}

impl AgentClient {
    pub(super) fn new(
        base: &str,
        node: &str,
        token: Option<String>,
        ca: Option<reqwest::Certificate>,
    ) -> AgentClient {
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true);
        if let Some(ca) = ca {
            builder = builder.add_root_certificate(ca);
        }
        AgentClient {
            http: builder.build().unwrap_or_default(),
            base: base.trim_end_matches('/').to_string(),
            node: node.to_string(),
            token,
        }
    }

    async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        timeout: Duration,
    ) -> Result<T, CallError> {
        let mut request = self.http.post(format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request
            .json(body)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| CallError::Unavailable(e.to_string()))?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| CallError::Unavailable(e.to_string()))?;
        if status.is_success() {
            return serde_json::from_str(&text)
                .map_err(|e| CallError::Unavailable(format!("unreadable answer: {e}")));
        }
        let error: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        let reason = error["error"]["details"][0]["reason"]
            .as_str()
            .unwrap_or("");
        let message = error["error"]["message"]
            .as_str()
            .unwrap_or(&text)
            .to_string();
        Err(match reason {
            "LEASE_LOST" | "FENCED" => CallError::LeaseLost(message),
            // The pool may have room later (a node leaves): keep trying.
            "POOL_FULL" => CallError::Unavailable(message),
            "UNAUTHENTICATED" | "PERMISSION_DENIED" => {
                CallError::Refused(format!("{status}: {message} (check token_file)"))
            }
            _ if status.is_server_error() => CallError::Unavailable(message),
            _ => CallError::Refused(format!("{status}: {message}")),
        })
    }

    fn method(&self, name: &str) -> String {
        format!("/v1/nodes/{}:{name}", self.node)
    }

    pub(super) async fn register(&self, req: &RegisterNode) -> Result<Lease, CallError> {
        self.post("/v1/nodes:register", req, Duration::from_secs(30))
            .await
    }

    pub(super) async fn heartbeat(&self, epoch: &str) -> Result<Lease, CallError> {
        self.post(
            &self.method("heartbeat"),
            &serde_json::json!({"epoch": epoch}),
            Duration::from_secs(10),
        )
        .await
    }

    pub(super) async fn poll(
        &self,
        epoch: &str,
        version: &str,
        wait: Duration,
    ) -> Result<Assignments, CallError> {
        let req = Poll {
            epoch: epoch.to_string(),
            version: version.to_string(),
            wait_for: Some(format!("{}s", wait.as_secs())),
        };
        self.post(&self.method("poll"), &req, wait + Duration::from_secs(10))
            .await
    }

    pub(super) async fn report(
        &self,
        epoch: &str,
        uuid: &str,
        event: ReportEvent,
    ) -> Result<(), CallError> {
        let req = Report {
            epoch: epoch.to_string(),
            uuid: uuid.to_string(),
            event,
        };
        self.post::<_, serde_json::Value>(&self.method("report"), &req, Duration::from_secs(30))
            .await
            .map(|_| ())
    }

    /// A report that must arrive: retried while the server is unreachable,
    /// for up to ten minutes, or until `stop` fires (the part was torn
    /// down or the agent is stopping).
    pub(super) async fn report_surely(
        &self,
        epoch: &str,
        uuid: &str,
        event: ReportEvent,
        stop: &tokio_util::sync::CancellationToken,
    ) -> Result<(), CallError> {
        let mut delay = Duration::from_millis(200);
        let give_up = tokio::time::Instant::now() + Duration::from_secs(600);
        loop {
            match self.report(epoch, uuid, event.clone()).await {
                Err(CallError::Unavailable(e)) if tokio::time::Instant::now() < give_up => {
                    tracing::warn!(error = %e, "report failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = stop.cancelled() => return Err(CallError::Unavailable(format!("given up: {e}"))),
                    }
                    delay = (delay * 2).min(Duration::from_secs(10));
                }
                other => return other,
            }
        }
    }

    pub(super) async fn telemetry(
        &self,
        epoch: &str,
        batches: Vec<crate::protocol::BatchGpuPoints>,
    ) -> Result<(), CallError> {
        let req = crate::protocol::GpuTelemetry {
            epoch: epoch.to_string(),
            batches,
        };
        self.post::<_, serde_json::Value>(&self.method("telemetry"), &req, Duration::from_secs(10))
            .await
            .map(|_| ())
    }

    pub(super) async fn output(
        &self,
        epoch: &str,
        uuid: &str,
        offset: u64,
        data: String,
    ) -> Result<u64, CallError> {
        let req = OutputUpload {
            epoch: epoch.to_string(),
            uuid: uuid.to_string(),
            offset: offset.to_string(),
            data,
        };
        let answer: serde_json::Value = self
            .post(&self.method("output"), &req, Duration::from_secs(10))
            .await?;
        answer["nextOffset"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| CallError::Unavailable("answer without nextOffset".into()))
    }
}
