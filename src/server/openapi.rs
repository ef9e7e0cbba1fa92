//! The OpenAPI document of the whole API, generated from the code: the
//! wire types derive their schemas (`utoipa::ToSchema`) and every handler
//! carries its path, parameters and answers (`#[utoipa::path]`). Served at
//! `GET /openapi.json`.

use axum::Json;
use utoipa::{OpenApi, ToSchema};

/// `google.rpc.Status` as every error travels.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ErrorSchema {
    error: ErrorStatus,
}

#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ErrorStatus {
    /// The HTTP status code.
    code: u16,
    message: String,
    /// The canonical code name, e.g. INVALID_ARGUMENT.
    status: String,
    /// One ErrorInfo (reason, metadata) and, for fields, a BadRequest.
    #[schema(value_type = Vec<Object>)]
    details: Vec<serde_json::Value>,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "flexq",
        description = "A capacity-aware flex start queue for GPU Spark batches (Dataproc Batches v1 compatible)."
    ),
    paths(
        super::batches::create,
        super::batches::list,
        super::batches::get,
        super::batches::delete,
        super::batches::get_operation,
        super::batches::post_operation,
        super::agents::read_output,
        super::agents::register,
        super::agents::node_method,
        super::capacity::regions,
        super::capacity::nodes,
        super::capacity::get_quotas,
        super::capacity::patch_quota,
        super::capacity::usage,
        super::queues::get_queue,
        super::queues::queue_entries,
        super::queues::hold_queue,
        super::queues::resume_queue,
        super::queues::held_queues,
        super::reload::reload_config,
        super::batches::watch,
        super::runtimes,
        super::auth::principal,
        super::healthz,
        super::readyz,
    ),
    components(schemas(
        ErrorSchema,
        crate::protocol::Poll,
        crate::protocol::Assignments,
        crate::protocol::Report,
        crate::protocol::ReportEvent,
        crate::protocol::OutputUpload,
    )),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
pub struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// `GET /openapi.json`
pub(super) async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
