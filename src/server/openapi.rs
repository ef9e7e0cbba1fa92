//! The OpenAPI document of the whole API, generated from the code: the
//! wire types derive their schemas (`utoipa::ToSchema`) and every handler
//! carries its path, parameters and answers (`#[utoipa::path]`), from
//! which the router also takes its path (`routes.rs`). What every
//! operation of the API shares — the system parameters and the error
//! answer — is added here once, by [`CommonResponses`], not written on each
//! handler. Served at `GET /openapi.json`.

use utoipa::openapi::path::{Operation, Parameter, ParameterBuilder, ParameterIn, PathItem};
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::{ContentBuilder, Ref, Required, ResponseBuilder};
use utoipa::{OpenApi, ToSchema};

use super::extract::SYSTEM_PARAMETERS;

/// `google.rpc.Status` as every error travels.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct ErrorSchema {
    error: ErrorStatus,
}

#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct ErrorStatus {
    /// The HTTP status code.
    code: u16,
    message: String,
    /// The canonical code name, e.g. INVALID_ARGUMENT.
    status: String,
    /// One ErrorInfo (reason, metadata) and, for fields, a BadRequest.
    #[schema(value_type = Vec<Object>)]
    details: Vec<serde_json::Value>,
}

/// What the document says besides its operations: its title, the schemas
/// no operation names (the agent protocol's messages) and the bearer
/// scheme. The operations come from the routes as they are registered
/// (`routes.rs` serves the whole).
#[derive(OpenApi)]
#[openapi(
    info(
        title = "flexq",
        description = "A capacity-aware flex start queue for GPU Spark batches (Dataproc Batches v1 compatible)."
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
pub(super) struct ApiDoc;

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

/// The operations of the API proper: what is under `/v1/`. The health
/// checks are not called by API clients and answer neither system
/// parameters nor a `google.rpc.Status` (readiness's 503 says so itself).
fn is_api(path: &str) -> bool {
    path.starts_with("/v1/")
}

/// The description of the error answer every API operation has, unless
/// its handler says more of its own.
const ERROR_DESCRIPTION: &str = "google.rpc.Status error";

/// Adds to every API operation, once here rather than on each handler:
/// the system parameters (`$alt`, `$fields`, `$prettyPrint`, which every
/// route accepts and [`super::extract::ApiQuery`] sets aside) and the
/// `4XX` answer with the `google.rpc.Status` body ([`ErrorSchema`]),
/// unless the handler describes its own. Applied once the routes are
/// registered (not among [`ApiDoc`]'s modifiers, which run before there
/// are operations).
pub(super) struct CommonResponses;

impl utoipa::Modify for CommonResponses {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for (path, item) in openapi.paths.paths.iter_mut() {
            if !is_api(path) {
                continue;
            }
            for operation in operations(item) {
                let parameters = operation.parameters.get_or_insert_with(Vec::new);
                for p in system_parameters() {
                    if !parameters.iter().any(|q| q.name == p.name) {
                        parameters.push(p);
                    }
                }
                operation
                    .responses
                    .responses
                    .entry("4XX".to_string())
                    .or_insert_with(|| error_response().into());
            }
        }
    }
}

/// Every operation of a path, whatever its method.
fn operations(item: &mut PathItem) -> impl Iterator<Item = &mut Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
        &mut item.options,
        &mut item.head,
        &mut item.patch,
        &mut item.trace,
    ]
    .into_iter()
    .flatten()
}

fn system_parameters() -> Vec<Parameter> {
    SYSTEM_PARAMETERS
        .iter()
        .filter(|p| p.starts_with('$'))
        .map(|&name| {
            let (ty, description) = match name {
                "$alt" => (
                    Type::String,
                    "`json;enum-encoding=int`: enums as numbers (Google's client libraries send it); otherwise as names",
                ),
                "$prettyPrint" => (Type::Boolean, "Accepted; answers are always compact"),
                _ => (Type::String, "Accepted; answers always carry every field"),
            };
            ParameterBuilder::new()
                .name(name)
                .parameter_in(ParameterIn::Query)
                .required(Required::False)
                .description(Some(description))
                .schema(Some(ObjectBuilder::new().schema_type(ty)))
                .build()
        })
        .collect()
}

fn error_response() -> utoipa::openapi::Response {
    ResponseBuilder::new()
        .description(ERROR_DESCRIPTION)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorSchema")))
                .build(),
        )
        .build()
}
