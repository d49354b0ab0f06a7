//! Every setting of `sluice serve`, once: the same struct is the command line (clap) and the
//! TOML file (serde), so a flag and its file key can never drift apart. A file key is the flag's
//! name in snake_case (`--worker-urls` is `worker_urls`).

use std::path::PathBuf;

use clap::Args;
use serde::{Deserialize, Serialize};

use super::adaptive::AdaptiveSettings;
use super::admission::AdmissionSettings;
use super::degradation::DegradationSettings;
use super::discovery::DiscoverySettings;
use super::intake::IntakeSettings;
use super::kv_events::KvEventsSettings;
use super::listen::ListenSettings;
use super::pd::PdSettings;
use super::replicas::ReplicaSettings;
use super::resilience::ResilienceSettings;
use super::status::StatusSettings;
use super::tls_files::TlsSettings;
use super::tokens::TokenizerSettings;

/// How to run the gateway.
#[derive(Debug, Clone, Args, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Read settings from this TOML file; flags given on the command line win over it.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    #[arg(help_heading = "Configuration")]
    pub(crate) config: Option<PathBuf>,

    /// Print the effective settings as TOML and exit.
    #[arg(long)]
    #[serde(skip)]
    #[arg(help_heading = "Configuration")]
    pub print_config: bool,

    /// Take SMG 1.13's default for every setting where sluice's differs and that is not given on
    /// the command line, in the environment or in the config file: no gateway queue (SMG queues
    /// only past --max-concurrent-requests, 100 deep), SMG's retry schedule, limits and listen
    /// addresses (docs/migrating-from-smg.md lists each).
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Configuration")]
    pub(crate) smg_defaults: bool,

    /// Where and how the gateway listens.
    #[command(flatten)]
    #[serde(flatten)]
    pub listen: ListenSettings,

    /// Workers to register at startup (OpenAI-compatible base URLs, e.g. http://10.0.0.5:8000).
    #[arg(long, num_args = 1.., value_name = "URL")]
    #[serde(default)]
    #[arg(help_heading = "Workers")]
    pub worker_urls: Vec<String>,

    /// API key sent as a bearer token to workers that have none of their own (the `--worker-urls`
    /// ones, and any registered without `api_key`). Unset: a single --api-key is sent, as in SMG.
    #[arg(
        long,
        value_name = "KEY",
        env = "SLUICE_WORKER_API_KEY",
        hide_env_values = true
    )]
    #[serde(default)]
    #[arg(help_heading = "Workers")]
    pub worker_api_key: Option<String>,

    /// Load-balancing policy: round_robin, random, least_load, power_of_two, cache_aware,
    /// consistent_hash.
    #[arg(long, default_value = "cache_aware")]
    #[arg(help_heading = "Routing policy")]
    pub(crate) policy: String,

    /// cache_aware: share of the prompt's prefix a worker must hold to be preferred.
    #[arg(long, visible_alias = "cache-match-threshold", default_value_t = 0.3)]
    #[arg(help_heading = "Routing policy")]
    pub(crate) cache_threshold: f64,

    /// cache_aware's spill gate, as in SMG 1.13: the worker holding the prompt's prefix gives
    /// way to the least loaded one when its load exceeds the pool's mean by this many requests
    /// (capped at two standard deviations of an in-flight count at that mean, at least 4)...
    #[arg(long, visible_alias = "spill-abs-threshold", default_value_t = 64)]
    #[arg(help_heading = "Routing policy")]
    pub(crate) balance_abs_threshold: u64,

    /// ...and exceeds the mean times this.
    #[arg(long, visible_alias = "spill-rel-threshold", default_value_t = 1.5)]
    #[arg(help_heading = "Routing policy")]
    pub(crate) balance_rel_threshold: f64,

    /// cache_aware: how much prompt text the prefix index remembers per model, in characters as
    /// in SMG; held as 64-byte blocks (about 100 bytes of memory each), the least recently used
    /// forgotten first. 2^24 (SMG's default is 2^26, which would let the index reach ~100 MB).
    #[arg(long, default_value_t = 1 << 24)]
    #[arg(help_heading = "Routing policy")]
    pub(crate) max_tree_size: usize,

    /// consistent_hash and cache_aware: request headers whose value is the routing key, the first
    /// present one winning (the body's `user` field is used when none is). Several after one
    /// flag (SMG's way), comma-separated or repeated; `--routing-key-header` is the same flag.
    #[arg(
        long = "routing-key-headers",
        alias = "routing-key-header",
        value_delimiter = ',',
        num_args = 1..,
        default_values_t = ["x-session-id".to_string()]
    )]
    #[arg(help_heading = "Routing policy")]
    pub routing_key_headers: Vec<String>,

    /// Accepted for SMG command lines (its multi-model mode): sluice always routes each request
    /// by its model.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Routing policy")]
    pub(crate) enable_igw: bool,

    /// An extra client-facing model name for a served model, `ALIAS=MODEL` (repeatable; SMG's
    /// flag). A request naming the alias is served by MODEL's workers, which are sent MODEL;
    /// `/v1/models` lists the alias too. Matching is case-sensitive.
    #[arg(long = "model-alias", value_name = "ALIAS=MODEL")]
    #[arg(help_heading = "Routing policy")]
    #[serde(default)]
    pub(crate) model_aliases: Vec<String>,

    /// Request headers a client's own request id is taken from, the first present and sane one
    /// winning (SMG's flag; several after one flag, comma-separated or repeated); the id goes to
    /// the worker and back to the client as `x-request-id`.
    #[arg(
        long,
        value_delimiter = ',',
        num_args = 1..,
        default_values_t = ["x-request-id".to_string()]
    )]
    #[arg(help_heading = "Requests")]
    pub request_id_headers: Vec<String>,

    /// Data-plane API keys clients must send as `Authorization: Bearer <key>` (repeatable). None:
    /// the OpenAI routes are open. As in SMG, a single one is also the key sent to workers that
    /// have none of their own, unless --worker-api-key is given.
    #[arg(
        long = "api-key",
        value_name = "KEY",
        env = "SLUICE_API_KEYS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    #[serde(default)]
    #[arg(help_heading = "Authentication")]
    pub api_keys: Vec<String>,

    /// Key for the admin API: its changes (`POST/PUT/PATCH/DELETE /workers`, `POST
    /// /busy_threshold`) and, unless --admin-reads-open, its reads (`GET /workers`, `/loads`,
    /// `/busy_threshold`), which show worker addresses and probe errors. None: changes are refused
    /// with 403 and reads are open. `/metrics` and the probes are always open.
    #[arg(
        long,
        value_name = "KEY",
        env = "SLUICE_ADMIN_API_KEY",
        hide_env_values = true
    )]
    #[serde(default)]
    #[arg(help_heading = "Authentication")]
    pub(crate) admin_api_key: Option<String>,

    /// Serve the admin API's reads (`GET /workers`, `/loads`, `/busy_threshold`) without the admin
    /// key, as before it was set.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Authentication")]
    pub(crate) admin_reads_open: bool,

    /// More admin API keys, as SMG writes them: `id:name:role:key`, role `admin` (changes and
    /// reads, like --admin-api-key) or `user` (reads only). Repeatable.
    #[arg(long, num_args = 1.., value_name = "ID:NAME:ROLE:KEY", hide_env_values = true)]
    #[arg(help_heading = "Authentication")]
    #[serde(default)]
    pub(crate) control_plane_api_keys: Vec<String>,

    /// Origins a browser may call the gateway from (e.g. http://localhost:3000), or `*` alone for
    /// any origin (SMG's flag). Unset: no cross-origin allowance.
    #[arg(long, num_args = 1.., value_delimiter = ',', value_name = "ORIGIN")]
    #[arg(help_heading = "Authentication")]
    #[serde(default)]
    pub(crate) cors_allowed_origins: Vec<String>,

    /// What a request may send and ask for, and how long its body may take.
    #[command(flatten)]
    #[serde(flatten)]
    pub intake: IntakeSettings,

    /// Time to connect to a worker.
    #[arg(long, default_value_t = 5.0)]
    #[arg(help_heading = "Workers")]
    pub(crate) connect_timeout_secs: f64,

    /// Longest a request may take end to end, streaming included.
    #[arg(long, default_value_t = 1800.0)]
    #[arg(help_heading = "Workers")]
    pub(crate) request_timeout_secs: f64,

    /// Speak HTTP/2 (prior knowledge) to workers; a worker spec's `http2` overrides it.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Workers")]
    pub(crate) upstream_http2: bool,

    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) resilience: ResilienceSettings,

    /// How often a worker that could not be reached at registration is tried again
    /// (`--worker-startup-check-interval`, SMG's name, is the same flag).
    #[arg(long, alias = "worker-startup-check-interval", default_value_t = 5.0)]
    #[arg(help_heading = "Workers")]
    pub worker_startup_check_interval_secs: f64,

    /// A worker registration has not reached within this long is Failed (and removed under
    /// --remove-unhealthy-workers); it is still asked, and can join later. SMG's flag and default
    /// (large models take long to load); 0: wait forever.
    #[arg(long, default_value_t = 1800.0)]
    #[arg(help_heading = "Workers")]
    pub worker_startup_timeout_secs: f64,

    /// Seconds before a new worker is first asked what it serves (SMG's flag): for engines known
    /// to take a while to start, so the first attempts do not log them as unreachable.
    #[arg(long, default_value_t = 0.0)]
    #[arg(help_heading = "Workers")]
    pub(crate) worker_startup_delay: f64,

    /// Seconds an unused pooled connection to a worker is kept (SMG's flag and default). Keep it
    /// under the engine's own keep-alive timeout (5 s in vLLM and SGLang), or a request can be
    /// sent on a connection the engine is closing.
    #[arg(long, default_value_t = 3.0)]
    #[arg(help_heading = "Workers")]
    pub(crate) upstream_pool_idle_timeout_secs: f64,

    /// Seconds a Ready worker being removed takes no new requests before it goes (0: at once).
    #[arg(long, default_value_t = 5.0)]
    #[arg(help_heading = "Workers")]
    pub(crate) drain_settle_secs: f64,

    /// Seconds between two health probes of a worker (each worker on its own schedule).
    #[arg(long, default_value_t = 60.0)]
    #[arg(help_heading = "Health checks")]
    pub(crate) health_check_interval_secs: f64,

    /// A probe that has no 2xx answer within this many seconds failed.
    #[arg(long, default_value_t = 5.0)]
    #[arg(help_heading = "Health checks")]
    pub(crate) health_check_timeout_secs: f64,

    /// Consecutive failed probes that take a Ready worker out of rotation (NotReady); 3x more
    /// make it Failed, and 10x probes without becoming Ready fail a Pending worker.
    #[arg(long, default_value_t = 3)]
    #[arg(help_heading = "Health checks")]
    pub(crate) health_failure_threshold: u32,

    /// Consecutive passed probes that bring a worker (back) to Ready.
    #[arg(long, default_value_t = 2)]
    #[arg(help_heading = "Health checks")]
    pub(crate) health_success_threshold: u32,

    /// Path probed on each worker (GET, 2xx is healthy).
    #[arg(long, default_value = "/health")]
    #[arg(help_heading = "Health checks")]
    pub(crate) health_check_endpoint: String,

    /// Do not probe workers (a worker's `health.disable_health_check` overrides it).
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Health checks")]
    pub(crate) disable_health_check: bool,

    /// Remove workers that reach Failed. Off, they stay registered and probed, and rejoin in
    /// place once they answer again. Alone, the flag means true [default: on with service
    /// discovery, which registers a removed worker again once its health endpoint answers; off
    /// without, so a static fleet does not shrink for good].
    #[arg(
        long,
        visible_alias = "worker-auto-recovery",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_name = "BOOL",
        overrides_with = "no_remove_unhealthy_workers"
    )]
    #[serde(default)]
    #[arg(help_heading = "Health checks")]
    pub remove_unhealthy_workers: Option<bool>,

    /// Keep failed workers registered and probed (the default without service discovery).
    #[arg(
        long,
        visible_alias = "no-worker-auto-recovery",
        overrides_with = "remove_unhealthy_workers"
    )]
    #[serde(skip)]
    #[arg(help_heading = "Health checks")]
    pub(crate) no_remove_unhealthy_workers: bool,

    /// Seconds between two load polls of a pool's workers (vLLM /metrics, SGLang /v1/loads);
    /// a worker spec's `load_monitor_interval_secs` may ask for less (never under 1 s). 1 by
    /// default (SMG: 10): the liveness checks tell a wedged engine from a busy one by its
    /// reports, so a veto lands a poll after the bound; a vLLM scrape costs its API process
    /// about 2.4 ms of CPU (docs/overload.md). A poll gets twice the interval to answer, at
    /// least 1 s and at most 5 s.
    #[arg(long, default_value_t = 1.0)]
    #[arg(help_heading = "Load monitoring and overload")]
    pub(crate) load_monitor_interval: f64,

    /// Waiting requests (summed over a worker's ranks) at or above which it is overloaded: left
    /// out of routing while another worker is under its ceilings. At least 1.
    #[arg(long, default_value_t = 8)]
    #[arg(help_heading = "Load monitoring and overload")]
    pub worker_overload_waiting_requests: u64,

    /// KV cache usage (mean over a worker's ranks, 0..1) at or above which it is overloaded.
    #[arg(long, default_value_t = 0.8)]
    #[arg(help_heading = "Load monitoring and overload")]
    pub(crate) worker_overload_token_usage: f64,

    /// Accepted for SMG command lines: overload protection is on by default.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Load monitoring and overload")]
    pub(crate) worker_overload_protection: bool,

    /// Turn both overload ceilings off (a worker spec's `overload` block still applies).
    #[arg(long, conflicts_with = "worker_overload_protection")]
    #[serde(default)]
    #[arg(help_heading = "Load monitoring and overload")]
    pub(crate) disable_worker_overload_protection: bool,

    /// When every worker a request could use is overloaded, refuse it at once (with
    /// --overload-status-code and Retry-After) instead of steering it to the least loaded. With
    /// the gateway queue, it waits only when room is measured freeing on those workers fast
    /// enough to serve it within its tier's wait (docs/overload.md).
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Load monitoring and overload")]
    pub worker_overload_shed: bool,

    /// Status of a shed request: 503, or 529 for Dynamo-style clients.
    #[arg(long, default_value_t = 503)]
    #[arg(help_heading = "Load monitoring and overload")]
    pub overload_status_code: u16,

    /// Share of each worker's capacity kept for interactive (tier 0) requests while a model has
    /// them: a less urgent request goes to a worker only while, by its last load report, the
    /// worker could start more than this share of what it holds (its running window, or what its
    /// KV cache holds under --worker-overload-token-usage, in requests of the size running); else
    /// it waits in the gateway queue (where --worker-overload-shed does not shed it: the fleet has
    /// room); without the queue, a worker with room only within the reserve is still taken before
    /// a full one. Kept for 60 s after an interactive request for the model had its first token;
    /// a model without interactive traffic keeps nothing back. 0 turns it off (docs/overload.md).
    #[arg(long, default_value_t = 0.1)]
    #[arg(help_heading = "Load monitoring and overload")]
    pub(crate) interactive_reserve: f64,

    /// Busy rank check: KV blocks in use above this fraction of the rank's blocks. Off unless set.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Load monitoring and overload")]
    pub(crate) active_decode_blocks_threshold: Option<f64>,

    /// Busy rank check: more prompt tokens than this waiting for prefill. Off unless set.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Load monitoring and overload")]
    pub(crate) active_prefill_tokens_threshold: Option<u64>,

    /// Busy rank check: prompt tokens waiting for prefill above this multiple of the rank's
    /// max_num_batched_tokens. Off unless set.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Load monitoring and overload")]
    pub(crate) active_prefill_tokens_threshold_frac: Option<f64>,

    /// Seconds without any contact after which a connection failure on a worker's channels
    /// excludes it from routing as unreachable (0: the first failure does); any contact
    /// re-admits it.
    #[arg(long, default_value_t = 2.0)]
    #[arg(help_heading = "Liveness")]
    pub(crate) worker_stall_secs: f64,

    /// Seconds without a token from a worker with streams in flight and evidence it should be
    /// producing (a waiting queue, a growing or 4-deep pile) after which it is excluded from
    /// routing as wedged until it makes progress (0 disables).
    #[arg(long, default_value_t = 3.0)]
    #[arg(help_heading = "Liveness")]
    pub(crate) worker_wedge_secs: f64,

    /// Seconds without anything at all from a worker this gateway holds requests on after
    /// which it is excluded from routing as unreachable until heard from (0 disables). Keep it
    /// above --load-monitor-interval.
    #[arg(long, default_value_t = 15.0)]
    #[arg(help_heading = "Liveness")]
    pub(crate) worker_stale_secs: f64,

    /// A worker that owes this gateway answers and has sent no byte for this long, counted
    /// across requests (a client leaving, a deadline or a retry elsewhere ends the request, not
    /// the silence), is vetoed as `unresponsive` unless its reports show its engine stepping
    /// (where they carry such a signal, a poll must have shown it standing still or gone
    /// unanswered). Its requests still waiting are retried elsewhere, within the retry budget;
    /// it is readmitted on a byte, a step in its reports, or a trial. 0 turns the rule off.
    #[arg(long, default_value_t = 3.0)]
    #[arg(help_heading = "Liveness")]
    pub(crate) worker_unresponsive_secs: f64,

    /// No liveness trials: a worker out for a veto that awaits progress (wedged, unresponsive)
    /// is readmitted only by a byte on a request still in flight on it or a step in its
    /// reports. By default one one-token generation (max_tokens 1 on its own model, at most one
    /// in flight, one every --worker-stall-secs, at least a second) asks whether it is back.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Liveness")]
    pub(crate) disable_liveness_trials: bool,

    /// No liveness vetoes at all (unreachable, stale, wedged, unresponsive): a worker that is
    /// gone or stuck stays in rotation until health checks or the circuit breaker take it out,
    /// if they are on. For a naive baseline in benchmarks, not for production.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Liveness")]
    pub(crate) disable_liveness_checks: bool,

    /// Write one JSON line per request to this file (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    #[serde(default)]
    #[arg(help_heading = "Metrics and logs")]
    pub(crate) access_log: Option<PathBuf>,

    /// Export a trace of each sampled request to an OpenTelemetry collector over OTLP (SMG's
    /// flag): the request, its admission and queue wait, each attempt on a worker, the first byte
    /// and the end. Workers get `traceparent`. Spans the collector cannot take in time are
    /// dropped and counted (`sluice_trace_spans_dropped_total`); requests never wait for it.
    #[arg(long)]
    #[arg(help_heading = "Traces")]
    #[serde(default)]
    pub(crate) enable_trace: bool,

    /// The collector, `HOST:PORT` (SMG's flag). Unset: localhost:4317 with gRPC, localhost:4318
    /// with HTTP.
    #[arg(long, value_name = "HOST:PORT")]
    #[arg(help_heading = "Traces")]
    #[serde(default)]
    pub(crate) otlp_traces_endpoint: Option<String>,

    /// OTLP over `grpc`, or `http` (HTTP/protobuf, to /v1/traces).
    #[arg(long, value_enum, default_value = "grpc")]
    #[arg(help_heading = "Traces")]
    pub(crate) otlp_traces_protocol: crate::trace::Protocol,

    /// The share of traces started here that are recorded, 0 to 1. A request whose client sent a
    /// `traceparent` follows the client's sampled flag instead.
    #[arg(long, default_value_t = 1.0, value_name = "RATIO")]
    #[arg(help_heading = "Traces")]
    pub(crate) trace_sample_ratio: f64,

    /// Bucket bounds, in seconds and increasing, of the request-duration and time-to-first-byte
    /// histograms (SMG's flag). Default: 0.005 to 300.
    #[arg(long, num_args = 1.., value_delimiter = ',', value_name = "SECONDS")]
    #[arg(help_heading = "Metrics and logs")]
    #[serde(default)]
    pub(crate) prometheus_duration_buckets: Vec<f64>,

    /// Log level: `trace`, `debug`, `info`, `warn` (or SMG's `warning`), `error` (or `critical`),
    /// `off`; or a filter in tracing's env-filter syntax, e.g. `info,sluice_gateway=debug`. An
    /// unknown level is refused at startup.
    #[arg(long, default_value = "info", env = "SLUICE_LOG")]
    #[arg(help_heading = "Metrics and logs")]
    pub(crate) log_level: String,

    /// Also write the logs to `sluice.log` in this directory, created when missing (SMG's flag).
    #[arg(long, value_name = "DIR")]
    #[arg(help_heading = "Metrics and logs")]
    #[serde(default)]
    pub log_dir: Option<PathBuf>,

    /// Log one JSON object per line (for log shippers) instead of text.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Metrics and logs")]
    pub log_json: bool,

    #[command(flatten)]
    #[serde(flatten)]
    pub admission: AdmissionSettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub adaptive: AdaptiveSettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub degradation: DegradationSettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub discovery: DiscoverySettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) replicas: ReplicaSettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) pd: PdSettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub status: StatusSettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) tokenizer: TokenizerSettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) kv_events: KvEventsSettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub tls: TlsSettings,
}
