//! The gateway's HTTP application, assembled in one place from the parts that serve it: the
//! OpenAI routes (`front`), the admin API, the probes and `/metrics`. Each part takes only the
//! state it needs, and none imports this module back.

use std::sync::Arc;

use axum::Router;
use prometheus_client::registry::Registry;

use crate::admin::{self, Admin};
use crate::front::{self, Front};
use crate::http;
use crate::probes::{self, Probes};

/// Everything the listeners serve.
pub struct App {
    pub front: Arc<Front>,
    pub admin: Arc<Admin>,
    pub probes: Arc<Probes>,
    /// The registry `/metrics` encodes (the families in `Metrics` and the fleet collector).
    pub registry: Arc<Registry>,
}

impl App {
    /// Every route of the main listener.
    pub fn router(&self) -> Router {
        Router::new()
            .merge(front::routes(self.front.clone()))
            .merge(admin::routes(self.admin.clone()))
            .merge(probes::routes(self.probes.clone()))
            .merge(probes::metrics_routes(self.registry.clone()))
            .fallback(http::unknown_route)
            .method_not_allowed_fallback(http::method_not_allowed)
    }

    /// `/metrics` alone, for `--prometheus-port`.
    pub fn metrics_router(&self) -> Router {
        probes::metrics_routes(self.registry.clone())
    }
}
