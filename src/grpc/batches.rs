//! `google.cloud.dataproc.v1.BatchController`: each RPC calls the engine
//! use case of its REST twin.

use googleapis_tonic_google_cloud_dataproc_v1::google::cloud::dataproc::v1 as dp;
use googleapis_tonic_google_longrunning::google::longrunning as lro;
use tonic::{Request, Response, Status};

use super::convert::{BATCH, encode, encode_operation, name, non_empty, page_size, parent};
use super::pb::dataproc::batch_controller_server::BatchController;
use super::{Front, Scope};
use crate::api::{Batch, BatchName};
use crate::engine::{CreateAnswer, CreateRequest, Error, ListRequest};

const LIST_RESPONSE: &str = "google.cloud.dataproc.v1.ListBatchesResponse";

pub(super) struct Batches {
    front: Front,
}

impl Batches {
    pub(super) fn new(front: Front) -> Batches {
        Batches { front }
    }
}

fn batch_name(text: &str) -> Result<BatchName, Error> {
    name(
        "name",
        text,
        BatchName::parse,
        "projects/PROJECT/locations/REGION/batches/ID",
    )
}

/// A parent, `projects/P/locations/R`: its project and region.
fn region_of(parent_name: &str) -> Result<(String, String), Error> {
    parent("parent", parent_name, "locations")
}

/// How many parts of an allocated cluster a state message names.
const SHOWN_PARTS: usize = 8;

/// flexq's extension, in the field every Dataproc client shows: a queued
/// batch's `stateMessage` also gives its queue position, what it waits for
/// and its estimated start; an allocated one's, its zone, when, and where
/// its parts are with their GPU addresses (the first [`SHOWN_PARTS`]).
fn with_extension(mut batch: Batch) -> Batch {
    let Some(info) = batch.flexq.take() else {
        return batch;
    };
    let mut extra = Vec::new();
    if let Some(position) = info.queue_position {
        extra.push(format!("Queue position {position}."));
    }
    if !info.not_admitted_reasons.is_empty() {
        extra.push(format!(
            "Waiting for: {}.",
            info.not_admitted_reasons.join("; ")
        ));
    }
    if let Some(eta) = info.estimated_start_time {
        extra.push(format!(
            "Estimated start {}.",
            eta.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ));
    }
    if let (Some(zone), Some(at)) = (&info.zone, info.allocate_time) {
        let mut parts: Vec<String> = info
            .nodes
            .iter()
            .take(SHOWN_PARTS)
            .map(|p| {
                let who = match p.index {
                    Some(i) => format!("{} {i}", p.role),
                    None => p.role.clone(),
                };
                match p.gpus.as_slice() {
                    [] => format!("{who} on {} (no GPU)", p.node),
                    gpus => format!("{who} on {} (GPUs {})", p.node, gpus.join(", ")),
                }
            })
            .collect();
        if info.nodes.len() > SHOWN_PARTS {
            parts.push(format!("{} more", info.nodes.len() - SHOWN_PARTS));
        }
        let parts = if parts.is_empty() {
            String::new()
        } else {
            format!(": {}", parts.join("; "))
        };
        extra.push(format!(
            "Cluster allocated in {zone} at {}{parts}.",
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ));
    }
    if !extra.is_empty() {
        let message = batch.state_message.take().unwrap_or_default();
        batch.state_message = Some(format!("{message} {}", extra.join(" ")).trim().to_string());
    }
    batch
}

#[tonic::async_trait]
impl BatchController for Batches {
    async fn create_batch(
        &self,
        request: Request<dp::CreateBatchRequest>,
    ) -> Result<Response<lro::Operation>, Status> {
        let engine = self.front.engine.clone();
        self.front
            .call(
                "CreateBatch",
                request,
                |r| region_of(&r.parent).map(|(p, g)| (Scope::write(&p, &g), (p, g))),
                |call, (project, region), r| async move {
                    let Some(batch) = &r.batch else {
                        return Err(Error::invalid_field(
                            "batch",
                            "required: the batch to create",
                        ));
                    };
                    let request = CreateRequest {
                        project,
                        region,
                        batch: super::batch_in::request_batch(batch)?,
                        batch_id: non_empty(r.batch_id),
                        request_id: non_empty(r.request_id),
                        validate_only: None,
                    };
                    match engine.create(&call.principal, request).await? {
                        CreateAnswer::Operation(op) => encode_operation(&op),
                        CreateAnswer::Verdict(_) => Err(Error::internal(
                            "a create without validate_only answered a verdict",
                        )),
                    }
                },
            )
            .await
    }

    async fn get_batch(
        &self,
        request: Request<dp::GetBatchRequest>,
    ) -> Result<Response<dp::Batch>, Status> {
        let engine = self.front.engine.clone();
        self.front
            .call(
                "GetBatch",
                request,
                |r| batch_name(&r.name).map(|n| (Scope::read(&n.project, &n.region), n)),
                |_, name, _| async move { encode(BATCH, &with_extension(engine.get(&name).await?)) },
            )
            .await
    }

    async fn list_batches(
        &self,
        request: Request<dp::ListBatchesRequest>,
    ) -> Result<Response<dp::ListBatchesResponse>, Status> {
        let engine = self.front.engine.clone();
        self.front
            .call(
                "ListBatches",
                request,
                |r| region_of(&r.parent).map(|(p, g)| (Scope::read(&p, &g), (p, g))),
                |_, (project, region), r| async move {
                    let mut page = engine
                        .list(ListRequest {
                            project,
                            region,
                            page_size: page_size(r.page_size),
                            page_token: non_empty(r.page_token),
                            filter: non_empty(r.filter),
                            order_by: non_empty(r.order_by),
                        })
                        .await?;
                    page.batches = page.batches.into_iter().map(with_extension).collect();
                    encode(LIST_RESPONSE, &page)
                },
            )
            .await
    }

    async fn delete_batch(
        &self,
        request: Request<dp::DeleteBatchRequest>,
    ) -> Result<Response<()>, Status> {
        let engine = self.front.engine.clone();
        self.front
            .call(
                "DeleteBatch",
                request,
                |r| batch_name(&r.name).map(|n| (Scope::write(&n.project, &n.region), n)),
                |_, name, _| async move { engine.delete(&name).await },
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::FlexqInfo;

    #[test]
    fn a_queued_batch_says_where_it_is_in_its_state_message() {
        let batch = Batch {
            state_message: Some("Queued: waiting up to 3600s.".into()),
            flexq: Some(FlexqInfo {
                queue_position: Some(3),
                not_admitted_reasons: vec![
                    "needs 16 PREEMPTIBLE_NVIDIA_L4_GPUS, project has 4 free of 24".into(),
                ],
                ..FlexqInfo::default()
            }),
            ..Batch::default()
        };
        let message = with_extension(batch).state_message.unwrap_or_default();
        assert_eq!(
            message,
            "Queued: waiting up to 3600s. Queue position 3. Waiting for: needs 16 PREEMPTIBLE_NVIDIA_L4_GPUS, project has 4 free of 24."
        );
        let plain = with_extension(Batch {
            state_message: Some("Done.".into()),
            ..Batch::default()
        });
        assert_eq!(plain.state_message.as_deref(), Some("Done."));

        let part = |role: &str, index, node: &str, gpus: &[&str]| crate::api::AllocatedPart {
            node: node.into(),
            role: role.into(),
            index,
            gpus: gpus.iter().map(|g| g.to_string()).collect(),
            ..Default::default()
        };
        let mut nodes = vec![part("driver", None, "gpu-1", &["0"])];
        nodes.extend((0..9).map(|i| part("executor", Some(i), "gpu-2", &["1", "2"])));
        let allocated = with_extension(Batch {
            state_message: Some("Allocated.".into()),
            flexq: Some(FlexqInfo {
                zone: Some("us-central1-a".into()),
                allocate_time: "2026-12-01T10:00:00Z".parse().ok(),
                nodes,
                ..FlexqInfo::default()
            }),
            ..Batch::default()
        });
        assert_eq!(
            allocated.state_message.as_deref(),
            Some(
                "Allocated. Cluster allocated in us-central1-a at 2026-12-01T10:00:00Z: driver on gpu-1 (GPUs 0); executor 0 on gpu-2 (GPUs 1, 2); executor 1 on gpu-2 (GPUs 1, 2); executor 2 on gpu-2 (GPUs 1, 2); executor 3 on gpu-2 (GPUs 1, 2); executor 4 on gpu-2 (GPUs 1, 2); executor 5 on gpu-2 (GPUs 1, 2); executor 6 on gpu-2 (GPUs 1, 2); 2 more."
            )
        );
    }
}
