//! SMG 1.13's flags that sluice does not take, each with what to do instead.
//!
//! An SMG launch line must either work unchanged or fail at startup saying what to use — never
//! run with a flag silently meaning something else. Every flag of `smg launch --help` (1.13.0)
//! is classified in docs/migrating-from-smg.md; the ones refused there are the table below,
//! which `sluice serve` consults when the command line names a flag it does not know
//! (crates/cli/tests/smg_launch.rs keeps the two in step).

const DISC: &str =
    "sluice reads no KV-transfer metadata from pods (prefill and decode workers are named with --prefill and --decode); drop the flag";
const DP: &str =
    "sluice does not schedule data-parallel ranks (it reads their loads to judge a worker); drop the flag";
const GRPC: &str =
    "sluice speaks HTTP to workers, and SGLang's gRPC service to grpc:// ones, not ZMQ: give their HTTP or gRPC URLs with --worker-urls; drop the flag";
const JOBQ: &str = "sluice registers workers directly, without a job queue; drop the flag";
const JWT: &str =
    "JWT/OIDC authentication is not supported: use --admin-api-key or --control-plane-api-keys";
const KV: &str =
    "tunes SMG's engine-event KV index; sluice's cache_aware reads the engines' KV events without such settings (--kv-events-port or a worker spec's kv_events_endpoint; a gRPC worker's own stream) and indexes the prompts it routed otherwise (--max-tree-size); drop the flag";
const LL: &str =
    "sluice's least_load and power_of_two rank workers by the requests it has on them and their reported queues, with no such knob; drop the flag";
const MCP: &str = "sluice runs no MCP tools; drop the flag";
const MESH: &str =
    "sluice replicas share their limits through Redis, not a mesh: run them behind an L4 balancer with the same --redis-url; drop the flag";
const MM: &str =
    "sluice does not fetch or preprocess media: image and audio inputs reach the engine as the client sent them; drop the flag";
const PARSER: &str =
    "sluice relays the engine's reasoning and tool-call output as it is: set the parser on the engine (e.g. vLLM's --reasoning-parser, --tool-call-parser); drop the flag";
const EPD: &str =
    "sluice serves prefill/decode pairs (--pd-disaggregation) but not encode disaggregation: serve the encoder with the model";
const PDQ: &str =
    "sluice bounds a disaggregated request's wait by the decode worker's running window (--pd-admission-wait-secs), not by a prefill queue; drop the flag";
const PHASH: &str =
    "belongs to the prefix_hash policy, which sluice does not have: --policy cache_aware routes by prompt prefix";
const RL: &str = "sluice has no RL control plane; drop the flag";
const STICKY: &str =
    "belongs to SMG's manual policy and sticky sessions: --policy consistent_hash with --routing-key-headers keeps a session on one worker";
const STORE: &str =
    "sluice stores no conversations or responses (/v1/responses passes through to the engine); drop the flag";
const TOK: &str =
    "sluice tokenizes for grpc:// workers from the model's files on disk (--model-path, --tokenizer-path, --chat-template), without SMG's tokenizer caches, autoload or parser choice; drop the flag";
const WARM: &str = "sluice has no warm-up slice for new workers; drop the flag";
const WASM: &str = "sluice runs no WebAssembly plugins; drop the flag";

/// SMG's refused flags (every spelling) and what to do instead.
pub const REFUSED: &[(&str, &str)] = &[
    ("--job-queue-capacity", JOBQ),
    ("--job-queue-concurrency", JOBQ),
    (
        "--disable-load-monitoring",
        "sluice's liveness checks (--worker-wedge-secs, --worker-unresponsive-secs) read every worker's load, so it always polls; drop the flag, or lengthen --load-monitor-interval",
    ),
    ("--multimodal-tensor-transport", MM),
    ("--multimodal-shm-min-bytes", MM),
    ("--multimodal-max-inflight-bytes", MM),
    ("--mm-per-request-image-limit", MM),
    ("--mm-processing", MM),
    ("--mm-pixel-cache-mb", MM),
    ("--mm-pixel-rdma", MM),
    ("--mm-allowed-media-domains", MM),
    ("--mm-allow-private-media-hosts", MM),
    ("--rdma-listen-ip", MM),
    ("--rdma-slot-ttl-s", MM),
    ("--log-mm-timing", MM),
    ("--encode-policy", EPD),
    ("--prefix-token-count", PHASH),
    ("--prefix-hash-load-factor", PHASH),
    ("--prefix-hash-balance-abs-threshold", PHASH),
    ("--least-load-kv-pressure-weight", LL),
    ("--least-load-default-throughput", LL),
    ("--least-load-mean-prefill-tokens", LL),
    (
        "--least-load-max-waiting-requests",
        "sluice's cap on a worker's waiting queue holds for every policy: --worker-overload-waiting-requests",
    ),
    ("--power-of-two-load-metric", LL),
    (
        "--balance-token-usage-threshold",
        "sluice does not compare KV usage across workers in cache_aware; a worker past --worker-overload-token-usage is left out of routing; drop the flag",
    ),
    (
        "--overload-token-usage-threshold",
        "use --worker-overload-token-usage: a worker at or above it is left out of routing under every policy",
    ),
    ("--kv-index", KV),
    ("--worker-warmup-secs", WARM),
    ("--worker-warmup-share", WARM),
    ("--worker-warmup-blocks", WARM),
    ("--worker-warmup-thin-ratio", WARM),
    ("--worker-warmup-divert-every", WARM),
    ("--selection-policy", KV),
    ("--selection-accounting-ttl-ms", KV),
    ("--overlap-decay", KV),
    ("--selection-temperature", KV),
    ("--bucket-adjust-interval-secs", PDQ),
    (
        "--eviction-interval-secs",
        "sluice's prefix index forgets the least recently used prompts as it reaches --max-tree-size, with no timer; drop the flag",
    ),
    ("--block-size", KV),
    ("--cache-boundaries", KV),
    ("--cache-index", KV),
    ("--cache-ttl-secs", KV),
    ("--max-idle-secs", STICKY),
    ("--sticky-key-idle-secs", STICKY),
    ("--assignment-mode", STICKY),
    (
        "--max-buffered-request-bytes",
        "sluice reads every request body whole (to route and retry it); bound one body with --max-payload-size and all bodies at once with --max-buffered-body-bytes",
    ),
    (
        "--stream-body-stall-timeout-secs",
        "sluice reads a request body whole before sending it on: --body-read-timeout-secs bounds how long a client may take to send it",
    ),
    (
        "--sse-keepalive-secs",
        "sluice sends no keep-alive frames on a silent stream: keep the idle timeout of any proxy in front above the longest prefill; drop the flag",
    ),
    ("--dp-aware", DP),
    ("--routing-key-override", STICKY),
    ("--sticky-sessions", STICKY),
    ("--dp-minimum-tokens-scheduler", DP),
    ("--epd-disaggregation", EPD),
    ("--encode", EPD),
    ("--prefill-max-inflight-requests-per-worker", PDQ),
    ("--prefill-queue-size", PDQ),
    ("--prefill-queue-timeout-secs", PDQ),
    ("--kv-connector-annotation", DISC),
    ("--kv-engine-id-annotation", DISC),
    ("--encode-selector", EPD),
    ("--router-selector", MESH),
    (
        "--jemalloc-prof-dir",
        "sluice is not built with jemalloc heap profiling; drop the flag",
    ),
    ("--storage-context-headers", STORE),
    (
        "--idle-connection-timeout-secs",
        "sluice closes an idle keep-alive connection after --header-read-timeout-secs (as nginx's keepalive_timeout does): set that instead",
    ),
    ("--max-background-responses", STORE),
    ("--disable-tokenizer-autoload", TOK),
    ("--parser", TOK),
    ("--tokenizer-cache-enable-l0", TOK),
    ("--tokenizer-cache-l0-max-entries", TOK),
    ("--tokenizer-cache-enable-l1", TOK),
    ("--tokenizer-cache-l0-max-memory", TOK),
    ("--tokenizer-cache-l1-max-memory", TOK),
    ("--reasoning-parser", PARSER),
    ("--tool-call-parser", PARSER),
    ("--mcp-config-path", MCP),
    (
        "--backend",
        "sluice tells vLLM from SGLang by each worker's own answers, and speaks HTTP to both; drop the flag",
    ),
    ("--zmq-engine-count", GRPC),
    ("--enable-wasm", WASM),
    ("--storage-hook-wasm-path", WASM),
    ("--history-backend", STORE),
    ("--history-memory-max-responses", STORE),
    ("--history-memory-max-items", STORE),
    ("--history-memory-retention-secs", STORE),
    ("--schema-config", STORE),
    ("--oracle-wallet-path", STORE),
    ("--oracle-tns-alias", STORE),
    ("--oracle-connect-descriptor", STORE),
    ("--oracle-username", STORE),
    ("--oracle-password", STORE),
    ("--oracle-external-auth", STORE),
    ("--oracle-pool-min", STORE),
    ("--oracle-pool-max", STORE),
    ("--oracle-pool-timeout-secs", STORE),
    ("--postgres-db-url", STORE),
    ("--postgres-pool-max", STORE),
    ("--postgres-op-timeout-secs", STORE),
    ("--redis-url", STORE),
    ("--redis-pool-max", STORE),
    ("--redis-retention-days", STORE),
    ("--redis-op-timeout-secs", STORE),
    (
        "--control-plane-audit-enabled",
        "sluice keeps no audit log; drop the flag",
    ),
    ("--jwt-issuer", JWT),
    ("--jwt-audience", JWT),
    ("--jwt-jwks-uri", JWT),
    ("--jwt-role-mapping", JWT),
    ("--enable-rl", RL),
    ("--rl-control-timeout-secs", RL),
    ("--rl-fanout-concurrency", RL),
    (
        "--priority-scheduler-enabled",
        "sluice's tiers need no switch: a request asks with x-sluice-priority (or SMG's x-smg-priority, mapped) and a tenant's `priority` in [[tenants]] bounds it; drop the flag",
    ),
    (
        "--priority-scheduler-default-max-class",
        "sluice's tiers need no switch: a request asks with x-sluice-priority (or SMG's x-smg-priority, mapped) and a tenant's `priority` in [[tenants]] bounds it; drop the flag",
    ),
    (
        "--priority-scheduler-config",
        "sluice's tiers need no switch: a request asks with x-sluice-priority (or SMG's x-smg-priority, mapped) and a tenant's `priority` in [[tenants]] bounds it; drop the flag",
    ),
    (
        "--priority-scheduler-tenant-metric-top-n",
        "sluice's tiers need no switch: a request asks with x-sluice-priority (or SMG's x-smg-priority, mapped) and a tenant's `priority` in [[tenants]] bounds it; drop the flag",
    ),
    (
        "--tenant-rate-limit-enabled",
        "set tokens_per_minute and requests_per_minute on the tenant's [[tenants]] table of --config; drop the flag",
    ),
    (
        "--tenant-rate-limit-config",
        "set tokens_per_minute and requests_per_minute on the tenant's [[tenants]] table of --config; drop the flag",
    ),
    ("--enable-mesh", MESH),
    ("--mesh-server-name", MESH),
    ("--mesh-host", MESH),
    ("--mesh-advertise-host", MESH),
    ("--mesh-port", MESH),
    ("--mesh-peer-urls", MESH),
    ("--mesh-tls-ca-cert", MESH),
    ("--mesh-tls-cert", MESH),
    ("--mesh-tls-key", MESH),
];

/// What to use instead of `arg`, an argument `sluice serve` does not know, when it is one of
/// SMG's flags (`--flag` or `--flag=value`).
pub fn instead_of(arg: &str) -> Option<&'static str> {
    let flag = arg.split_once('=').map_or(arg, |(flag, _)| flag);
    REFUSED
        .iter()
        .find(|(refused, _)| *refused == flag)
        .map(|(_, instead)| *instead)
}
