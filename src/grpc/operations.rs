//! `google.longrunning.Operations` for batch operations
//! (`projects/P/regions/R/operations/ID`). An operation is the view of
//! its batch: get, list, cancel and wait read or change the batch; an
//! operation cannot be deleted apart from its batch.

use std::time::Duration;

use googleapis_tonic_google_longrunning::google::longrunning as lro;
use tonic::{Request, Response, Status};

use super::convert::{encode_operation, name, non_empty, page_size, parent};
use super::pb::longrunning::operations_server;
use super::{Front, Scope};
use crate::api::OperationName;
use crate::engine::{Error, ListRequest};

/// How long a WaitOperation without a timeout waits at most (the call's
/// deadline may cut it shorter).
const DEFAULT_WAIT: Duration = Duration::from_secs(60);

pub(super) struct Operations {
    front: Front,
}

impl Operations {
    pub(super) fn new(front: Front) -> Operations {
        Operations { front }
    }
}

fn operation_name(text: &str) -> Result<OperationName, Error> {
    name(
        "name",
        text,
        OperationName::parse,
        "projects/PROJECT/regions/REGION/operations/ID",
    )
}

fn collection(name: &str) -> Result<(String, String), Error> {
    parent(
        "name",
        name.strip_suffix("/operations").unwrap_or("-"),
        "regions",
    )
    .map_err(|_| {
        Error::invalid_field(
            "name",
            format!(
                "{} is not an operations collection; accepted: projects/PROJECT/regions/REGION/operations",
                crate::api::quote(name)
            ),
        )
    })
}

#[tonic::async_trait]
impl operations_server::Operations for Operations {
    async fn list_operations(
        &self,
        request: Request<lro::ListOperationsRequest>,
    ) -> Result<Response<lro::ListOperationsResponse>, Status> {
        let engine = self.front.engine.clone();
        self.front
            .call(
                "ListOperations",
                request,
                |r| collection(&r.name).map(|(p, g)| (Scope::read(&p, &g), (p, g))),
                |_, (project, region), r| async move {
                    let (operations, next_page_token) = engine
                        .list_operations(ListRequest {
                            project,
                            region,
                            page_size: page_size(r.page_size),
                            page_token: non_empty(r.page_token),
                            filter: non_empty(r.filter),
                            order_by: None,
                        })
                        .await?;
                    Ok(lro::ListOperationsResponse {
                        operations: operations
                            .iter()
                            .map(encode_operation)
                            .collect::<Result<_, _>>()?,
                        next_page_token,
                        ..Default::default()
                    })
                },
            )
            .await
    }

    async fn get_operation(
        &self,
        request: Request<lro::GetOperationRequest>,
    ) -> Result<Response<lro::Operation>, Status> {
        let engine = self.front.engine.clone();
        self.front
            .call(
                "GetOperation",
                request,
                |r| operation_name(&r.name).map(|n| (Scope::read(&n.project, &n.region), n)),
                |_, name, _| async move { encode_operation(&engine.get_operation(&name).await?) },
            )
            .await
    }

    async fn delete_operation(
        &self,
        request: Request<lro::DeleteOperationRequest>,
    ) -> Result<Response<()>, Status> {
        let engine = self.front.engine.clone();
        self.front
            .call(
                "DeleteOperation",
                request,
                |r| operation_name(&r.name).map(|n| (Scope::write(&n.project, &n.region), n)),
                |_, name, _| async move { engine.delete_operation(&name).await },
            )
            .await
    }

    async fn cancel_operation(
        &self,
        request: Request<lro::CancelOperationRequest>,
    ) -> Result<Response<()>, Status> {
        let engine = self.front.engine.clone();
        self.front
            .call(
                "CancelOperation",
                request,
                |r| operation_name(&r.name).map(|n| (Scope::write(&n.project, &n.region), n)),
                |_, name, _| async move { engine.cancel(&name).await },
            )
            .await
    }

    async fn wait_operation(
        &self,
        request: Request<lro::WaitOperationRequest>,
    ) -> Result<Response<lro::Operation>, Status> {
        let engine = self.front.engine.clone();
        self.front
            .call(
                "WaitOperation",
                request,
                |r| operation_name(&r.name).map(|n| (Scope::read(&n.project, &n.region), n)),
                |call, name, r| async move {
                    let asked = match r.timeout {
                        None => DEFAULT_WAIT,
                        Some(d) => Duration::try_from(d).map_err(|_| {
                            Error::invalid_field(
                                "timeout",
                                format!(
                                    "{{seconds: {}, nanos: {}}} is negative; accepted: a duration of 0s or more",
                                    d.seconds, d.nanos
                                ),
                            )
                        })?,
                    };
                    // Answer the latest state before the call's own deadline.
                    let until = tokio::time::Instant::now()
                        + asked.min(call.time_left().saturating_sub(Duration::from_millis(200)));
                    encode_operation(&engine.wait_operation(&name, until).await?)
                },
            )
            .await
    }
}
