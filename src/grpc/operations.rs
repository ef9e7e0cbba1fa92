//! `google.longrunning.Operations` for batch operations
//! (`projects/P/regions/R/operations/ID`). An operation is the view of
//! its batch: get, list, cancel and wait read or change the batch; an
//! operation cannot be deleted apart from its batch.

use std::time::Duration;

use googleapis_tonic_google_longrunning::google::longrunning as lro;
use tonic::{Request, Response, Status};

use super::convert::{encode_operation, name, parent};
use super::pb::longrunning::operations_server;
use super::{Front, Scope};
use crate::api::{Code, OperationName};
use crate::engine::{Error, ListRequest};

/// How long a WaitOperation without a timeout waits at most (the call's
/// deadline may cut it shorter).
const DEFAULT_WAIT: Duration = Duration::from_secs(60);

pub struct Operations {
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

fn scope_of(name: &str) -> Result<(String, String), Error> {
    operation_name(name).map(|n| (n.project, n.region))
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
                |r| Scope::read(collection(&r.name)?),
                |_, r| async move {
                    let (project, region) = collection(&r.name)?;
                    let (operations, next_page_token) = engine
                        .list_operations(ListRequest {
                            project,
                            region,
                            page_size: (r.page_size != 0).then(|| r.page_size.to_string()),
                            page_token: (!r.page_token.is_empty()).then_some(r.page_token),
                            filter: (!r.filter.is_empty()).then_some(r.filter),
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
                |r| Scope::read(scope_of(&r.name)?),
                |_, r| async move {
                    let op = engine.get_operation(&operation_name(&r.name)?).await?;
                    encode_operation(&op)
                },
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
                |r| Scope::write(scope_of(&r.name)?),
                |_, r| async move {
                    // Named only if it exists: NOT_FOUND comes first.
                    let name = operation_name(&r.name)?;
                    engine.get_operation(&name).await?;
                    Err(Error::new(
                        Code::Unimplemented,
                        "OPERATION_IS_THE_BATCH",
                        format!(
                            "{name} is the operation of a batch and goes with it: delete the batch (DeleteBatch) once it ended"
                        ),
                    ))
                },
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
                |r| Scope::write(scope_of(&r.name)?),
                |_, r| async move { engine.cancel(&operation_name(&r.name)?).await },
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
                |r| Scope::read(scope_of(&r.name)?),
                |call, r| async move {
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
                    let op = engine
                        .wait_operation(&operation_name(&r.name)?, until)
                        .await?;
                    encode_operation(&op)
                },
            )
            .await
    }
}
