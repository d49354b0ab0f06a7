//! The status page: `/ui`, served by every gateway, with a live feed of what it sees.
//!
//! | route | what |
//! | --- | --- |
//! | `GET /ui` (and its `app.js`, `style.css`) | the page, embedded in the binary: no CDN, works offline |
//! | `GET /ui/session` | 204 when this browser may read the feed, else 401 |
//! | `POST /ui/login` | `{"key": "..."}`: an admin key (or a read-only control-plane key) kept in an HttpOnly cookie |
//! | `POST /ui/logout` | forgets it |
//! | `GET /ui/events` | server-sent events: `history` (the charts' last points) once, then an `update` per tick |
//!
//! The feed is guarded as the admin API's reads are (it shows worker addresses): open when no
//! admin key is set or with `--admin-reads-open`, else the admin key, as a bearer header or —
//! since a browser's `EventSource` cannot send one — the cookie the page's login sets.
//!
//! One sampler (`run`) makes every update: each tick it reads the fleet and the gateway's own
//! metrics (`sampler`), and publishes one JSON text that every watcher's stream sends as is.
//!
//! ## Layout
//!
//! - `sampler` — readings of the metrics, and the rates and quantiles between them.
//! - `view` — what an update carries: worker cards, queue, tenants, degradation, objectives.

mod sampler;
mod view;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use futures_util::StreamExt;
use prometheus_client::registry::Registry;
use sluice_core::slo::Slos;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::admin::Admin;
use crate::config::UiConfig;
use crate::http::RequestError;
use crate::http::{discard, read_body, BodyLimits};
use sampler::{Reading, Series};

/// Between updates while nobody watches: the charts still gather a history.
const IDLE_INTERVAL: Duration = Duration::from_secs(1);

/// The cookie the login sets: the key, hex-encoded (a key may hold any byte a header can).
const COOKIE: &str = "sluice_ui";

/// Largest login body read.
const LOGIN_MAX_BYTES: usize = 4096;

const PAGE: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/app.js");
const STYLE: &str = include_str!("assets/style.css");

/// The page's state: what it reads, and the feed it publishes.
pub(crate) struct Status {
    admin: Arc<Admin>,
    registry: Arc<Registry>,
    slos: Slos,
    config: UiConfig,
    /// The HTTPS listener's cookie is `Secure`.
    secure: bool,
    /// The latest update, as the `data` of an event.
    feed: watch::Sender<Bytes>,
    /// Written by the sampler only; read by a watcher once, as it connects.
    series: parking_lot::Mutex<Series>,
}

impl Status {
    pub fn new(
        admin: Arc<Admin>,
        registry: Arc<Registry>,
        slos: Slos,
        config: UiConfig,
        secure: bool,
    ) -> Arc<Self> {
        Arc::new(Self {
            admin,
            registry,
            slos,
            config,
            secure,
            feed: watch::channel(Bytes::new()).0,
            series: parking_lot::Mutex::new(Series::default()),
        })
    }

    /// Makes an update every tick until `stop`: a few a second while someone watches.
    pub(crate) async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        loop {
            self.tick();
            let wait = if self.feed.receiver_count() > 0 {
                self.config.interval
            } else {
                IDLE_INTERVAL
            };
            tokio::select! {
                _ = stop.wait_for(|stopped| *stopped) => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    fn tick(&self) {
        let reading = Reading::of_registry(&self.registry);
        let point = self.series.lock().push(Instant::now(), reading);
        let update = view::Update::of(&self.admin, &self.slos, point);
        if let Ok(json) = serde_json::to_vec(&update) {
            self.feed.send_replace(Bytes::from(json));
        }
    }

    /// Whether these headers may read the feed.
    fn authorized(&self, headers: &HeaderMap) -> bool {
        let keys = &self.admin.keys;
        if self.admin.keys.reads_open || !keys.admin_configured() {
            return true;
        }
        keys.check_admin_read(headers).is_ok()
            || cookie(headers).is_some_and(|key| keys.is_admin_reader(&key))
    }
}

/// The key in the page's cookie, if it sent one.
fn cookie(headers: &HeaderMap) -> Option<Vec<u8>> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
        .and_then(unhex)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The page's routes.
pub(crate) fn routes(status: Arc<Status>) -> Router {
    Router::new()
        .route(
            "/ui",
            get(|| async { asset("text/html; charset=utf-8", PAGE) }),
        )
        .route(
            "/ui/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/ui/style.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
        .route("/ui/session", get(session))
        .route("/ui/login", post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/events", get(events))
        .with_state(status)
}

/// An embedded file; the page may load only its own files.
fn asset(content_type: &'static str, text: &'static str) -> Response<Body> {
    let mut response = Response::new(Body::from(text));
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'self'; img-src 'self' data:"),
    );
    response
}

async fn session(State(status): State<Arc<Status>>, headers: HeaderMap) -> Response<Body> {
    if status.authorized(&headers) {
        StatusCode::NO_CONTENT.into_response()
    } else {
        RequestError::InvalidAdminKey.into_response()
    }
}

#[derive(serde::Deserialize)]
struct Login {
    key: Option<String>,
}

async fn login(State(status): State<Arc<Status>>, request: Request) -> Response<Body> {
    let (parts, mut body) = request.into_parts();
    let limits = BodyLimits {
        max_bytes: LOGIN_MAX_BYTES,
        within: status.admin.body_read_timeout,
        budget: None,
    };
    let bytes = match read_body(&mut body, &parts.headers, limits).await {
        Ok(read) => read.bytes,
        Err(e) => {
            discard(body).await;
            return e.into_response();
        }
    };
    let key = match serde_json::from_slice::<Login>(&bytes) {
        Ok(Login { key: Some(key) }) => key,
        Ok(Login { key: None }) => {
            return RequestError::MissingParameter { param: "key" }.into_response()
        }
        Err(e) => {
            return RequestError::InvalidJson {
                detail: e.to_string(),
            }
            .into_response()
        }
    };
    if !status.admin.keys.is_admin_reader(key.as_bytes()) {
        return RequestError::InvalidAdminKey.into_response();
    }
    set_cookie(&status, &hex(key.as_bytes()), None)
}

async fn logout(State(status): State<Arc<Status>>) -> Response<Body> {
    set_cookie(&status, "", Some(0))
}

/// 204 with the page's cookie: HttpOnly (no script reads the key), SameSite=Strict (no other
/// site's page sends it), scoped to `/ui`.
fn set_cookie(status: &Status, value: &str, max_age: Option<u64>) -> Response<Body> {
    let mut cookie = format!("{COOKIE}={value}; Path=/ui; HttpOnly; SameSite=Strict");
    if let Some(secs) = max_age {
        cookie.push_str(&format!("; Max-Age={secs}"));
    }
    if status.secure {
        cookie.push_str("; Secure");
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    if let Ok(value) = HeaderValue::try_from(cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

async fn events(State(status): State<Arc<Status>>, headers: HeaderMap) -> Response<Body> {
    if !status.authorized(&headers) {
        return RequestError::InvalidAdminKey.into_response();
    }
    let history = {
        let series = status.series.lock();
        serde_json::to_string(&series.points).unwrap_or_else(|_| "[]".into())
    };
    let mut rx = status.feed.subscribe();
    let first = std::iter::once(Event::default().event("history").data(history));
    let latest = rx.borrow_and_update().clone();
    let now = (!latest.is_empty()).then(|| update_event(&latest));
    let updates = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.changed().await.ok()?;
        let event = update_event(&rx.borrow_and_update());
        Some((event, rx))
    });
    let stream = futures_util::stream::iter(first.chain(now))
        .chain(updates)
        .map(Ok::<_, Infallible>);
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

fn update_event(json: &Bytes) -> Event {
    Event::default()
        .event("update")
        .data(String::from_utf8_lossy(json))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cookie_holds_any_key_and_is_found_among_others() {
        let key = "s3cr;t =\u{e9}";
        let mut headers = HeaderMap::new();
        let value = format!("theme=dark; {COOKIE}={}; other=1", hex(key.as_bytes()));
        headers.insert(header::COOKIE, HeaderValue::try_from(value).unwrap());
        assert_eq!(cookie(&headers), Some(key.as_bytes().to_vec()));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
        assert_eq!(cookie(&HeaderMap::new()), None);
    }
}
