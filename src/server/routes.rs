//! The REST routes, each stated once. A route's path and methods are its
//! handler's `#[utoipa::path]`, from which `utoipa_axum::routes!` both
//! mounts the handler and writes its operation into the OpenAPI document;
//! its access rule ([`Rule`]) is given where it is registered, into the
//! table the access middleware reads ([`super::auth::enforce`]). So the
//! router, the document and the access table cannot disagree on which
//! routes there are.

use std::sync::Arc;

use axum::Router;
use axum::response::IntoResponse;
use axum::routing::{MethodRouter, get};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouter};
use utoipa_axum::routes;

use super::auth::{Rule, Rules};
use super::{App, agents, auth, batches, capacity, console, openapi, queues, reload};

/// The routes, declared: the router (without its fallbacks and layers),
/// the document it serves and every route's rule.
pub(super) struct Routes {
    pub(super) router: Router<App>,
    /// What `GET /openapi.json` serves; read here by the tests.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) document: Arc<utoipa::openapi::OpenApi>,
    pub(super) rules: Rules,
}

/// Every REST route with its access rule.
pub(super) fn declare() -> Routes {
    use Rule::*;
    Api::new()
        .at(Project, routes!(batches::list, batches::create))
        .at(Project, routes!(batches::watch))
        .at(Project, routes!(batches::get, batches::delete))
        .at(Project, routes!(agents::read_output))
        .at(Project, routes!(batches::gpu_chart))
        .at(Project, routes!(batches::executor_chart))
        .at(
            Project,
            routes!(batches::get_operation, batches::post_operation),
        )
        .at(Anyone, routes!(super::runtimes))
        .at(Anyone, routes!(capacity::regions))
        .at(Anyone, routes!(auth::principal))
        .at(Admin, routes!(capacity::nodes))
        .at(Agent, routes!(agents::register))
        .at(NodeMethod, routes!(agents::node_method))
        .at(
            ProjectAdminWrites,
            routes!(capacity::get_quotas, capacity::patch_quota),
        )
        .at(Project, routes!(capacity::usage))
        .at(Project, routes!(queues::get_queue))
        .at(Project, routes!(queues::queue_entries))
        .at(Admin, routes!(queues::hold_queue))
        .at(Admin, routes!(queues::resume_queue))
        .at(Admin, routes!(queues::held_queues))
        .at(Admin, routes!(reload::reload_config))
        .at(Nobody, routes!(super::healthz))
        .at(Nobody, routes!(super::readyz))
        // The console's files are no API operation: served, not documented.
        .undocumented(Nobody, "/console", get(console::redirect))
        .undocumented(Nobody, "/console/", get(console::index))
        .undocumented(Nobody, "/console/{file}", get(console::file))
        .finish()
}

/// The builder: registers each route in the router and the document
/// (`OpenApiRouter`) and its rule in the table, in one call.
struct Api {
    router: OpenApiRouter<App>,
    rules: Rules,
}

impl Api {
    fn new() -> Api {
        Api {
            router: OpenApiRouter::with_openapi(openapi::ApiDoc::openapi()),
            rules: Rules::default(),
        }
    }

    /// The handlers of one path (`routes!` of handlers that share their
    /// `#[utoipa::path]`'s path), which need `rule`.
    fn at(mut self, rule: Rule, routes: UtoipaMethodRouter<App>) -> Api {
        let paths: Vec<&String> = routes.1.paths.keys().collect();
        // `OpenApiRouter::routes` would mount every handler of a
        // `routes!` at every one of its paths: one path per call.
        assert_eq!(
            paths.len(),
            1,
            "one path per routes!(...), with its rule: {paths:?}"
        );
        for path in paths {
            self.rules.insert(path, rule);
        }
        self.router = self.router.routes(routes);
        self
    }

    /// A route served but not in the document.
    fn undocumented(mut self, rule: Rule, path: &str, route: MethodRouter<App>) -> Api {
        self.rules.insert(path, rule);
        self.router = self.router.route(path, route);
        self
    }

    /// The router and its document, with what every operation shares
    /// ([`openapi::CommonResponses`]) and `GET /openapi.json`, which serves it.
    fn finish(mut self) -> Routes {
        let (router, mut document) = self.router.split_for_parts();
        openapi::CommonResponses.modify(&mut document);
        let document = Arc::new(document);
        let served = document.clone();
        self.rules.insert("/openapi.json", Rule::Nobody);
        let router = router.route(
            "/openapi.json",
            get(move || {
                let document = served.clone();
                async move { axum::Json(document.as_ref()).into_response() }
            }),
        );
        Routes {
            router,
            document,
            rules: self.rules,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every route of the router has its rule: each operation of the
    /// document (the routes registered through `routes!`), and the routes
    /// served outside it. A route registered without one would be served
    /// to admins only (the table fails closed); this finds it first.
    #[test]
    fn every_route_has_a_rule() {
        let routes = declare();
        let documented: Vec<&String> = routes.document.paths.paths.keys().collect();
        assert!(documented.len() > 20, "{documented:?}");
        let undocumented = ["/console", "/console/", "/console/{file}", "/openapi.json"];
        let missing: Vec<&str> = documented
            .iter()
            .map(|p| p.as_str())
            .chain(undocumented)
            .filter(|p| routes.rules.get(p).is_none())
            .collect();
        assert!(
            missing.is_empty(),
            "routes without an access rule: {missing:?}"
        );
    }

    /// The document says, on every API operation and only once, the
    /// system parameters and the error answer, which no handler writes.
    #[test]
    fn every_operation_has_the_system_parameters_and_the_error_answer() {
        let document = serde_json::to_value(declare().document.as_ref()).expect("the document");
        let paths = document["paths"].as_object().expect("paths");
        let mut operations = 0;
        for (path, item) in paths {
            for (method, operation) in item.as_object().expect("a path item") {
                let names: Vec<&str> = operation["parameters"]
                    .as_array()
                    .map(|ps| ps.iter().filter_map(|p| p["name"].as_str()).collect())
                    .unwrap_or_default();
                let error =
                    &operation["responses"]["4XX"]["content"]["application/json"]["schema"]["$ref"];
                if !path.starts_with("/v1/") {
                    assert!(!names.iter().any(|n| n.starts_with('$')), "{method} {path}");
                    continue;
                }
                operations += 1;
                for system in ["$alt", "$fields", "$prettyPrint"] {
                    let times = names.iter().filter(|n| **n == system).count();
                    assert_eq!(times, 1, "{method} {path}: {system} {times} times");
                }
                assert_eq!(error, "#/components/schemas/ErrorSchema", "{method} {path}");
            }
        }
        assert!(operations > 20, "{operations}");
    }
}
