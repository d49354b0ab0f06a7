//! The gateway's HTTP application, assembled in one place from a `Config`: the metrics registry,
//! the control loops and the fleet they feed, the request path's stages, and the parts that serve
//! them — the OpenAI routes (`front`), the admin API, the probes and `/metrics`. Each part takes
//! only the state it needs, and none imports this module back.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use axum::Router;
use prometheus_client::registry::Registry;
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::access_log::{AccessLog, AccessLogError, AccessLogWriter};
use crate::admin::{self, Admin};
use crate::admit::{Admit, AdmitStage};
use crate::config::Config;
use crate::context::{Accounts, InFlight};
use crate::control::{AdapterLoads, Control};
use crate::fleet::{Borrowed, Fleet, FleetCollector};
use crate::forward::Forwarder;
use crate::front::{self, ApiRoute, Front};
use crate::http::{self, CorsOrigins, Keys};
use crate::metrics::Metrics;
use crate::probes::{self, Probes};
use crate::route::RouteStage;
use crate::shared::Shared;
use crate::status::{self, Status};
use crate::upstream::{Upstream, UpstreamCollector};
use sluice_core::overload::Projection;

/// Everything the listeners serve.
pub(crate) struct App {
    /// `--cors-allowed-origins`, applied to every route when set.
    pub(crate) cors: Option<CorsLayer>,
    pub(crate) front: Arc<Front>,
    pub(crate) admin: Arc<Admin>,
    pub(crate) probes: Arc<Probes>,
    /// The registry `/metrics` encodes (the families in `Metrics` and the fleet collector).
    pub(crate) registry: Arc<Registry>,
    /// The status page (`/ui`); `None` with `--disable-ui`.
    pub(crate) status: Option<Arc<Status>>,
}

/// Why the app could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum AssembleError {
    #[error(transparent)]
    AccessLog(#[from] AccessLogError),
    #[error(transparent)]
    Shared(#[from] crate::shared::SharedError),
    #[error(transparent)]
    Trace(#[from] crate::trace::TraceError),
}

/// An assembled gateway before it listens: the app, and what starting and stopping it needs.
pub(crate) struct Assembled {
    pub(crate) app: App,
    pub(crate) fleet: Arc<Fleet>,
    /// Set when shutdown begins: readiness turns 503, new requests are refused.
    pub(crate) draining: Arc<AtomicBool>,
    /// OpenAI requests in flight, which shutdown waits for.
    pub(crate) in_flight: Arc<InFlight>,
    pub(crate) access_log_writer: Option<AccessLogWriter>,
    /// The trace exporter's task (`--enable-trace`).
    pub(crate) trace_exporting: Option<crate::trace::Exporting>,
    /// The state shared with the other replicas (`--redis-url`), whose task the gateway runs.
    pub(crate) shared: Option<Arc<Shared>>,
}

impl App {
    /// Everything `config` describes, wired together; no worker registered, nothing listening.
    pub(crate) async fn assemble(config: &Config) -> Result<Assembled, AssembleError> {
        let (mut registry, metrics) = registered(config);
        let upstream = Upstream::new(&config.upstream);
        let (control, fleet) = control_and_fleet(config, &upstream, &metrics);
        registry.register_collector(Box::new(FleetCollector(fleet.clone())));
        registry.register_collector(Box::new(UpstreamCollector(upstream.clone())));
        let Records {
            access_log,
            access_log_writer,
            tracing,
            trace_exporting,
        } = Records::start(config, &metrics).await?;
        let in_flight = Arc::new(InFlight::default());
        let draining = Arc::new(AtomicBool::new(false));
        let keys = keys_of(config);
        let (shared, admit) = admission(config, &mut registry)?;
        let probes = Probes::new(fleet.clone(), draining.clone());
        registry.register_collector(Box::new(probes::ReadinessCollector(probes.clone())));
        let degrade = config
            .degradation
            .clone()
            .map(|c| crate::admit::degrade::Degrader::new(c, &mut registry));
        let admin = admin(config, (&fleet, control), &keys, &admit, degrade.clone());
        let registry = Arc::new(registry);
        let status = status_page(config, &admin, &registry);
        let stages = Stages {
            admit: AdmitStage {
                admit: admit.clone(),
                fleet: fleet.clone(),
                aliases: config.admission.aliases.clone(),
                degrade,
            },
            route: route_stage(config, &admit, &metrics),
            forward: forward_stage(config, upstream, &fleet, &metrics),
            accounts: Accounts {
                metrics,
                access_log,
                tracing,
                in_flight: in_flight.clone(),
            },
        };
        let app = App {
            cors: config.access.cors.as_ref().map(cors_layer),
            front: Arc::new(front(config, &fleet, stages, keys, &draining)),
            admin,
            probes: probes.clone(),
            registry,
            status,
        };
        Ok(Assembled {
            app,
            fleet,
            draining,
            in_flight,
            access_log_writer,
            trace_exporting,
            shared,
        })
    }

    /// Every route of the main listener.
    pub(crate) fn router(&self) -> Router {
        let router = Router::new()
            .merge(front::routes(self.front.clone()))
            .merge(admin::routes(self.admin.clone()))
            .merge(probes::routes(self.probes.clone()))
            .merge(probes::metrics_routes(self.registry.clone()))
            .merge(self.status.clone().map(status::routes).unwrap_or_default())
            .fallback(http::unknown_route)
            .method_not_allowed_fallback(http::method_not_allowed);
        match &self.cors {
            Some(cors) => router.layer(cors.clone()),
            None => router,
        }
    }

    /// What the main listener serves: the router, with the model-routed routes taken before it
    /// (`front::shortcut`) unless a CORS layer wraps the router, which they must pass too.
    pub(crate) fn routes(&self) -> http::Routes {
        let shortcut = self
            .cors
            .is_none()
            .then(|| front::shortcut(self.front.clone()));
        http::Routes::new(self.router(), shortcut)
    }

    /// `/metrics` alone, for `--prometheus-port`.
    pub(crate) fn metrics_router(&self) -> Router {
        probes::metrics_routes(self.registry.clone())
    }
}

/// What a browser may do from the allowed origins: any method and request header, and read the
/// request id and the gateway's error code.
fn cors_layer(origins: &CorsOrigins) -> CorsLayer {
    let allow = match origins {
        CorsOrigins::Any => AllowOrigin::any(),
        CorsOrigins::List(list) => AllowOrigin::list(list.iter().cloned()),
    };
    CorsLayer::new()
        .allow_origin(allow)
        .allow_methods(tower_http::cors::Any)
        .allow_headers(tower_http::cors::Any)
        .expose_headers([crate::http::REQUEST_ID, crate::error::ERROR_CODE_HEADER])
}

/// The forward stage, loading LoRA adapters onto the workers whose specs allow it.
fn forward_stage(
    config: &Config,
    upstream: Upstream,
    fleet: &Arc<Fleet>,
    metrics: &Arc<Metrics>,
) -> Forwarder {
    let loads = AdapterLoads::new(
        upstream.clone(),
        Arc::downgrade(fleet),
        config.control.adapter_load_timeout,
    );
    Forwarder::new(upstream, config.forward.clone(), metrics.clone())
        .with_adapter_loads(Arc::new(loads))
}

/// The control loops and the fleet they feed; the liveness checker runs from here on.
fn control_and_fleet(
    config: &Config,
    upstream: &Upstream,
    metrics: &Arc<Metrics>,
) -> (Arc<Control>, Arc<Fleet>) {
    let control = Control::new(config.control.clone(), upstream.clone());
    let fleet = Fleet::new(
        (
            config.fleet.clone(),
            Borrowed {
                policy: config.route.policy.name(),
                http2_default: config.upstream.http2,
                silence_lapse: config.control.liveness.unwrap_or_default().unresponsive,
            },
        ),
        metrics.clone(),
        control.clone(),
    );
    control.watch(&fleet);
    (control, fleet)
}

/// The admin routes' state: the fleet and its control loops, the keys, admission and the ladder.
fn admin(
    config: &Config,
    (fleet, control): (&Arc<Fleet>, Arc<Control>),
    keys: &Keys,
    admit: &Arc<Admit>,
    degrade: Option<Arc<crate::admit::degrade::Degrader>>,
) -> Arc<Admin> {
    Arc::new(Admin {
        fleet: fleet.clone(),
        control,
        keys: keys.clone(),
        body_read_timeout: config.front.intake.body_read_timeout,
        admit: admit.clone(),
        degrade,
    })
}

/// Admission, and the state it shares with the other replicas when `--redis-url` asks.
fn admission(
    config: &Config,
    registry: &mut Registry,
) -> Result<(Option<Arc<Shared>>, Arc<Admit>), AssembleError> {
    let shared = match &config.shared {
        Some(c) => Some(Shared::new(c, registry)?),
        None => None,
    };
    let admit = Arc::new(Admit::new(&config.admission, registry, shared.as_deref()));
    Ok((shared, admit))
}

/// The metrics registry, with the gateway's families (`--prometheus-duration-buckets`, the
/// objectives) and every OpenAI route's series from the start.
fn registered(config: &Config) -> (Registry, Arc<Metrics>) {
    let mut registry = Registry::with_prefix("sluice");
    let buckets = config
        .telemetry
        .duration_buckets
        .as_deref()
        .unwrap_or(&crate::metrics::LATENCY_BUCKETS);
    let metrics = Metrics::register_with(&mut registry, buckets, config.telemetry.slos);
    metrics.preset_routes(&ApiRoute::ALL.map(ApiRoute::path));
    (registry, metrics)
}

/// Where requests are recorded besides the metrics: the access log and traces, when on, with
/// the tasks that write them.
struct Records {
    access_log: Option<AccessLog>,
    access_log_writer: Option<AccessLogWriter>,
    tracing: Option<crate::trace::Tracing>,
    trace_exporting: Option<crate::trace::Exporting>,
}

impl Records {
    /// Opens `--access-log` and starts `--enable-trace`'s exporter, as `config` asks.
    async fn start(config: &Config, metrics: &Arc<Metrics>) -> Result<Self, AssembleError> {
        let (access_log, access_log_writer) = match &config.telemetry.access_log {
            Some(path) => AccessLog::open(path, metrics.clone())
                .await
                .map(|(log, writer)| (Some(log), Some(writer)))?,
            None => (None, None),
        };
        let (tracing, trace_exporting) = match &config.telemetry.trace {
            Some(trace) => crate::trace::Tracing::start(trace, metrics.clone())
                .map(|(tracing, exporting)| (Some(tracing), Some(exporting)))?,
            None => (None, None),
        };
        Ok(Records {
            access_log,
            access_log_writer,
            tracing,
            trace_exporting,
        })
    }
}

/// The status page (`/ui`), unless `--disable-ui`.
fn status_page(
    config: &Config,
    admin: &Arc<Admin>,
    registry: &Arc<Registry>,
) -> Option<Arc<Status>> {
    config.ui.map(|ui| {
        Status::new(
            admin.clone(),
            registry.clone(),
            config.telemetry.slos,
            ui,
            config.listener.tls.is_some(),
        )
    })
}

/// The request path's stages after the front one, as `assemble` makes them.
struct Stages {
    admit: AdmitStage,
    route: RouteStage,
    forward: Forwarder,
    accounts: Accounts,
}

/// The front stage over `stages`, with the request-facing settings.
fn front(
    config: &Config,
    fleet: &Arc<Fleet>,
    stages: Stages,
    keys: Keys,
    draining: &Arc<AtomicBool>,
) -> Front {
    Front {
        fleet: fleet.clone(),
        admit: stages.admit,
        route: stages.route,
        forward: stages.forward,
        accounts: stages.accounts,
        keys,
        intake: config.front.intake,
        body_budget: tokio::sync::Semaphore::new(config.front.intake.max_buffered),
        answers: config.front.answers,
        request_id_headers: config.front.request_id_headers.clone(),
        draining: draining.clone(),
    }
}

/// The route stage: the policies, shedding, the routing key, the model's tokens; room judged
/// warily behind a gateway queue, which releases many at once.
fn route_stage(config: &Config, admit: &Arc<Admit>, metrics: &Arc<Metrics>) -> RouteStage {
    let projection = if admit.queue().is_some() {
        Projection::Wary
    } else {
        Projection::Hopeful
    };
    RouteStage::new(&config.route, metrics.clone())
        .with_projection(projection)
        .with_tokens(config.upstream.tokens.clone())
}

/// Every key the gateway checks: clients', the admin's, the control plane's, the tenants'.
fn keys_of(config: &Config) -> Keys {
    Keys {
        tenants: config
            .admission
            .tenants
            .iter()
            .enumerate()
            .flat_map(|(i, t)| t.api_keys.iter().map(move |k| (k.clone(), i)))
            .collect(),
        ..config.access.keys.clone()
    }
}
