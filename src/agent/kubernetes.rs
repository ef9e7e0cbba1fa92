//! The Kubernetes launcher: the driver's agent turns its batch into a Spark
//! Operator `SparkApplication` ([`crate::launch::k8s`]), applies it through
//! the Kubernetes API (server-side apply), follows its status and maps it
//! back to the batch; cancel and ttl delete it. Executor nodes run nothing
//! themselves: the operator's pods are pinned to them by node affinity.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::settings::KubernetesConfig;
use super::work::Ctx;
use crate::api::State;
use crate::launch::k8s::{K8sTarget, PartNode, application_name, batch_state, spark_application};
use crate::protocol::{Action, Assignment, ReportEvent};

/// A client of the Kubernetes API for `SparkApplication`s.
pub(super) struct Kube {
    http: reqwest::Client,
    base: String,
    /// Read at each request: mounted service-account tokens rotate.
    token_file: std::path::PathBuf,
    namespace: String,
}

impl Kube {
    pub(super) fn new(config: &KubernetesConfig) -> Result<Kube, String> {
        let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(30));
        if let Ok(pem) = std::fs::read(&config.ca_file) {
            let cert = reqwest::Certificate::from_pem(&pem)
                .map_err(|e| format!("{}: {e}", config.ca_file.display()))?;
            builder = builder.add_root_certificate(cert);
        }
        Ok(Kube {
            http: builder.build().map_err(|e| e.to_string())?,
            base: config.api_server.trim_end_matches('/').to_string(),
            token_file: config.token_file.clone(),
            namespace: config.namespace.clone(),
        })
    }

    fn url(&self, name: &str) -> String {
        format!(
            "{}/apis/sparkoperator.k8s.io/v1beta2/namespaces/{}/sparkapplications/{name}",
            self.base, self.namespace
        )
    }

    fn auth(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let token = std::fs::read_to_string(&self.token_file)
            .ok()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        match token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    async fn check(r: reqwest::Response) -> Result<Value, String> {
        let status = r.status();
        let body: Value = r.json().await.unwrap_or_default();
        if status.is_success() {
            Ok(body)
        } else {
            Err(format!(
                "{status}: {}",
                body["message"].as_str().unwrap_or("(no message)")
            ))
        }
    }

    /// Server-side apply: creates or updates the application.
    pub(super) async fn apply(&self, manifest: &Value) -> Result<(), String> {
        let name = manifest["metadata"]["name"].as_str().unwrap_or_default();
        let body = serde_json::to_vec(manifest).map_err(|e| e.to_string())?;
        let r = self
            .auth(
                self.http
                    .patch(format!("{}?fieldManager=flexq&force=true", self.url(name))),
            )
            .header("content-type", "application/apply-patch+yaml")
            .body(body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        Self::check(r).await.map(|_| ())
    }

    /// The application's `status`, or None when it is gone.
    pub(super) async fn status(&self, name: &str) -> Result<Option<Value>, String> {
        let r = self
            .auth(self.http.get(self.url(name)))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if r.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        Self::check(r).await.map(|v| Some(v["status"].clone()))
    }

    pub(super) async fn delete(&self, name: &str) -> Result<(), String> {
        let r = self
            .auth(self.http.delete(self.url(name)))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if r.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(());
        }
        Self::check(r).await.map(|_| ())
    }
}

/// Runs the driver's part of a batch as a `SparkApplication`.
pub(super) async fn run_driver(
    ctx: Arc<Ctx>,
    mut rx: watch::Receiver<Assignment>,
    cancel: CancellationToken,
) {
    let a = rx.borrow().clone();
    let event = match drive(&ctx, &a, &mut rx, &cancel).await {
        Ok(event) => event,
        Err(message) => {
            // Whatever failed after the apply, the application must not
            // outlive the batch.
            if let (Some(job), Ok(kube)) = (&a.job, Kube::new(&ctx.config.kubernetes)) {
                let name = application_name(job);
                for attempt in 0..5 {
                    match kube.delete(&name).await {
                        Ok(()) => break,
                        Err(e) => {
                            tracing::warn!(application = %name, attempt, error = %e, "cannot delete the application; retrying");
                            tokio::time::sleep(Duration::from_secs(1 << attempt)).await;
                        }
                    }
                }
            }
            Some(ReportEvent::PartFailed {
                message: format!("The Spark application could not run: {message}"),
                // The application's failure may be its own code's.
                infrastructure: false,
            })
        }
    };
    if let Some(event) = event {
        if let Err(e) = ctx
            .client
            .report_surely(&ctx.epoch, &a.uuid, event, &cancel)
            .await
        {
            tracing::warn!(batch = %a.batch, error = %e, "the batch's end could not be reported");
        }
    }
}

/// Applies the batch's `SparkApplication` and follows it until it ends;
/// answers the batch's end to report (None: nothing to report).
async fn drive(
    ctx: &Ctx,
    a: &Assignment,
    rx: &mut watch::Receiver<Assignment>,
    cancel: &CancellationToken,
) -> Result<Option<ReportEvent>, String> {
    let config = &ctx.config.kubernetes;
    let job = a
        .job
        .as_ref()
        .ok_or("the driver's assignment carries no job")?;
    let kube = Kube::new(config)?;
    let target = target_of(config);
    let manifest = spark_application(job, &parts_of(a), &target);
    let name = application_name(job);
    kube.apply(&manifest)
        .await
        .map_err(|e| format!("the Kubernetes API refused SparkApplication {name}: {e}"))?;
    tracing::info!(batch = %a.batch, batch_uuid = %a.uuid, application = %name, namespace = %config.namespace, "SparkApplication applied");
    let rapids = match &target.rapids_jar {
        Some(jar) => format!("enabled ({jar} in image {})", job_image(&manifest)),
        None => "not available: the image has no RAPIDS jar configured; the batch ran on Spark without the RAPIDS Accelerator".into(),
    };
    follow(ctx, a, &kube, &name, &rapids, rx, cancel).await
}

/// Where and how the agent's config has applications created.
fn target_of(config: &KubernetesConfig) -> K8sTarget {
    K8sTarget {
        namespace: config.namespace.clone(),
        image: config.image.clone(),
        service_account: config.service_account.clone(),
        rapids_jar: (!config.rapids_jar.is_empty()).then(|| config.rapids_jar.clone()),
        spark_version: config.spark_version.clone(),
    }
}

/// The assignment's parts: each one's node and whether it is the driver.
fn parts_of(a: &Assignment) -> Vec<PartNode> {
    a.cluster
        .iter()
        .map(|p| PartNode {
            node: p.node.clone(),
            driver: p.role == "driver",
        })
        .collect()
}

/// Follows the application `name` every status interval: reports the
/// driver started once it runs, and answers its end (completed, failed,
/// past its ttl, cancelled) once it is over, deleting it; None when the
/// assignment went away or the agent is stopping.
async fn follow(
    ctx: &Ctx,
    a: &Assignment,
    kube: &Kube,
    name: &str,
    rapids: &str,
    rx: &mut watch::Receiver<Assignment>,
    cancel: &CancellationToken,
) -> Result<Option<ReportEvent>, String> {
    let config = &ctx.config.kubernetes;
    let ttl = a.ttl_seconds.map(Duration::from_secs);
    let started = tokio::time::Instant::now();
    let mut running = false;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(config.status_interval) => {}
            changed = rx.changed() => {
                if changed.is_err() {
                    let _ = kube.delete(name).await;
                    return Ok(None);
                }
                if rx.borrow().action == Action::Stop {
                    kube.delete(name).await?;
                    return Ok(Some(ReportEvent::Finished {
                        succeeded: false,
                        message: "Stopped on cancellation: the SparkApplication was deleted.".into(),
                        exit_code: None,
                    }));
                }
                continue;
            }
            _ = cancel.cancelled() => {
                let _ = kube.delete(name).await;
                return Ok(None);
            }
        }
        if ttl.is_some_and(|t| started.elapsed() >= t) {
            kube.delete(name).await?;
            return Ok(Some(ReportEvent::Finished {
                succeeded: false,
                message: format!(
                    "The batch ran past its ttl of {}s and was stopped; its cluster was released.",
                    ttl.unwrap_or_default().as_secs()
                ),
                exit_code: None,
            }));
        }
        let status = match kube.status(name).await {
            Ok(Some(s)) => s,
            Ok(None) => {
                return Err(format!(
                    "SparkApplication {name} was deleted by someone else"
                ));
            }
            Err(e) => {
                tracing::warn!(application = %name, error = %e, "cannot read the application's status; retrying");
                continue;
            }
        };
        match batch_state(&status) {
            Some((State::Running, _)) if !running => {
                running = true;
                ctx.client
                    .report_surely(
                        &ctx.epoch,
                        &a.uuid,
                        ReportEvent::DriverStarted {
                            rapids: rapids.to_string(),
                        },
                        cancel,
                    )
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Some((State::Succeeded, _)) => {
                let _ = kube.delete(name).await;
                return Ok(Some(ReportEvent::Finished {
                    succeeded: true,
                    message: format!("SparkApplication {name} completed."),
                    exit_code: Some(0),
                }));
            }
            Some((State::Failed, message)) => {
                let _ = kube.delete(name).await;
                return Ok(Some(ReportEvent::Finished {
                    succeeded: false,
                    message: format!("SparkApplication {name} failed: {message}"),
                    exit_code: None,
                }));
            }
            _ => {}
        }
    }
}

fn job_image(manifest: &Value) -> String {
    manifest["spec"]["image"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}
