//! The connection to Redis, the scripts run there, and whether it is reachable.
//!
//! Every call is bounded by `--redis-timeout-ms`; one that fails or runs out marks the store
//! down (logged once, `sluice_redis_fallback_total` counted) and drops the connection, and the
//! store's task connects again once a second until a `PING` answers. Budgets and caps read `up`
//! to choose between their shared and their local form.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use redis::aio::MultiplexedConnection;
use redis::Script;
use tokio::sync::watch;
use tracing::{info, warn};

use super::SharedConfig;

/// Why a call did not get an answer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("not connected")]
    Down,
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
}

/// Takes from a shared bucket (refilled by Redis's clock), first charging or refunding
/// `charge`; gives what it holds up to `want`, never more. KEYS: the bucket. ARGV: capacity,
/// refill per second, want, charge. Returns the amount given and the level left (as text: Lua
/// numbers reach a client as integers).
const CLAIM: &str = r"
local cap = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local charge = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local v = redis.call('HMGET', KEYS[1], 'level', 'at')
local level = tonumber(v[1]) or cap
local at = tonumber(v[2]) or now
level = math.min(cap, level + math.max(0, now - at) * rate)
level = math.min(cap, level - charge)
local give = 0
if level >= 1 then give = math.min(want, math.floor(level)) end
level = level - give
redis.call('HSET', KEYS[1], 'level', tostring(level), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(cap / rate * 1000) + 60000)
return {give, tostring(level)}
";

/// Sets this replica's grant under a shared cap: what it wants, as far as the cap leaves room
/// beside the grants of live replicas (those of replicas whose lease ran out are dropped), and
/// never less than `floor` (its requests already running). KEYS: the grants (hash), the live
/// replicas (sorted set of lease expiry times). ARGV: replica, cap, want, floor, lease in ms.
/// Returns the grant.
const GRANT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local grants = redis.call('HGETALL', KEYS[1])
local others = 0
for i = 1, #grants, 2 do
  local r = grants[i]
  local lease = tonumber(redis.call('ZSCORE', KEYS[2], r) or '0')
  if lease <= now then
    redis.call('HDEL', KEYS[1], r)
  elseif r ~= ARGV[1] then
    others = others + tonumber(grants[i + 1])
  end
end
local room = tonumber(ARGV[2]) - others
local grant = math.max(tonumber(ARGV[4]), math.min(tonumber(ARGV[3]), room))
if grant > 0 then
  redis.call('HSET', KEYS[1], ARGV[1], grant)
else
  redis.call('HDEL', KEYS[1], ARGV[1])
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[5]) * 4)
return grant
";

/// Publishes this replica's requests on each worker — with no first byte yet, and in flight —
/// and sums the other live replicas'. KEYS: the replicas (sorted set of lease expiry times),
/// then one hash per worker (replica -> "pending:in_flight"). ARGV: replica, lease in ms, then
/// two counts per worker. Returns two sums per worker, flattened.
const SHARE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local sums = {}
for k = 2, #KEYS do
  local pending = tonumber(ARGV[2 * k - 1])
  local in_flight = tonumber(ARGV[2 * k])
  if pending + in_flight > 0 then
    redis.call('HSET', KEYS[k], ARGV[1], pending .. ':' .. in_flight)
    redis.call('PEXPIRE', KEYS[k], tonumber(ARGV[2]) * 4)
  else
    redis.call('HDEL', KEYS[k], ARGV[1])
  end
  local other_pending, other_in_flight = 0, 0
  local counts = redis.call('HGETALL', KEYS[k])
  for i = 1, #counts, 2 do
    local r = counts[i]
    if r ~= ARGV[1] then
      local lease = tonumber(redis.call('ZSCORE', KEYS[1], r) or '0')
      if lease > now then
        local p, f = string.match(counts[i + 1], '(%d+):(%d+)')
        other_pending = other_pending + tonumber(p)
        other_in_flight = other_in_flight + tonumber(f)
      else
        redis.call('HDEL', KEYS[k], r)
      end
    end
  end
  sums[2 * k - 3] = other_pending
  sums[2 * k - 2] = other_in_flight
end
return sums
";

/// Renews this replica's lease — its place in the count, and what makes its grants count — and
/// counts the live replicas. KEYS: the replicas (sorted set of lease expiry times). ARGV:
/// replica, lease in ms.
const HEARTBEAT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 2)
return redis.call('ZCARD', KEYS[1])
";

/// The Redis side of the shared state.
pub struct Store {
    client: redis::Client,
    connection: ArcSwapOption<MultiplexedConnection>,
    /// This replica's name in Redis (random per process).
    pub(crate) replica: String,
    /// Prepended to every key.
    prefix: String,
    timeout: Duration,
    /// How long its grants and its place in the count outlive the last renewal.
    lease: Duration,
    pub(crate) fail_open: bool,
    up: AtomicBool,
    /// Live replicas as Redis last counted them (1 until it has).
    replicas: AtomicU32,
    scripts: Scripts,
    fallbacks: Counter,
    up_gauge: Gauge,
    /// `up` and the switches to local limits so far, for whoever awaits a change.
    state: watch::Sender<SharedState>,
}

/// Whether the shared limits are in use, and how often the gateway fell back from them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SharedState {
    pub up: bool,
    pub fallbacks: u64,
    /// Live replicas as Redis last counted them.
    pub replicas: u32,
}

struct Scripts {
    claim: Script,
    grant: Script,
    heartbeat: Script,
    share: Script,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("replica", &self.replica)
            .field("up", &self.up())
            .finish_non_exhaustive()
    }
}

impl Store {
    /// A store for `client`, not connected yet (the task connects it); its metrics registered.
    pub fn new(client: redis::Client, config: &SharedConfig, registry: &mut Registry) -> Self {
        let fallbacks = Counter::default();
        registry.register(
            "redis_fallback",
            "Switches to local limits because Redis could not be reached in time",
            fallbacks.clone(),
        );
        let up_gauge = Gauge::default();
        registry.register(
            "redis_up",
            "1 while the shared state in Redis is in use, 0 while limits are local",
            up_gauge.clone(),
        );
        Self {
            client,
            connection: ArcSwapOption::empty(),
            replica: format!("{:016x}", rand::random::<u64>()),
            prefix: "sluice:".into(),
            timeout: config.timeout,
            lease: config.lease,
            fail_open: config.fail_open,
            up: AtomicBool::new(false),
            replicas: AtomicU32::new(1),
            scripts: Scripts {
                claim: Script::new(CLAIM),
                grant: Script::new(GRANT),
                heartbeat: Script::new(HEARTBEAT),
                share: Script::new(SHARE),
            },
            fallbacks,
            up_gauge,
            state: watch::channel(SharedState {
                replicas: 1,
                ..SharedState::default()
            })
            .0,
        }
    }

    /// Changes whenever Redis goes away or comes back.
    pub fn changes(&self) -> watch::Receiver<SharedState> {
        self.state.subscribe()
    }

    pub(crate) fn up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// How long this replica's lease outlives its last renewal.
    pub(crate) fn lease(&self) -> Duration {
        self.lease
    }

    pub(crate) fn replicas(&self) -> u32 {
        self.replicas.load(Ordering::Relaxed).max(1)
    }

    pub(crate) fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// Runs `call` on the connection, bounded; a failure marks the store down.
    async fn bounded<T>(
        &self,
        call: impl AsyncFnOnce(MultiplexedConnection) -> redis::RedisResult<T>,
    ) -> Result<T, StoreError> {
        let Some(connection) = self.connection.load_full() else {
            return Err(StoreError::Down);
        };
        let result = match tokio::time::timeout(self.timeout, call((*connection).clone())).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) => StoreError::Redis(e),
            Err(_) => StoreError::Timeout(self.timeout),
        };
        self.went_down(&result);
        Err(result)
    }

    fn went_down(&self, why: &StoreError) {
        self.connection.store(None);
        if self.up.swap(false, Ordering::AcqRel) {
            self.fallbacks.inc();
            self.up_gauge.set(0);
            self.state.send_modify(|s| {
                s.up = false;
                s.fallbacks += 1;
            });
            if self.fail_open {
                warn!(error = %why, "Redis unreachable: limits are local (each replica a share of the global) until it answers again");
            } else {
                warn!(error = %why, "Redis unreachable: requests that need it are refused until it answers again (--redis-fail-open=false)");
            }
        }
    }

    /// `CLAIM` on bucket `key`: (given, level left).
    pub(crate) async fn claim(
        &self,
        key: &str,
        capacity: u64,
        rate: f64,
        want: u64,
        charge: i64,
    ) -> Result<(u64, f64), StoreError> {
        let (given, level): (u64, String) = self
            .bounded(async |mut c| {
                self.scripts
                    .claim
                    .key(key)
                    .arg(capacity)
                    .arg(rate)
                    .arg(want)
                    .arg(charge)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        Ok((given, level.parse().unwrap_or(0.0)))
    }

    /// `GRANT` on cap `key`: the grant now held.
    pub(crate) async fn grant(
        &self,
        key: &str,
        cap: u64,
        want: u64,
        floor: u64,
    ) -> Result<u64, StoreError> {
        let replicas = self.key("replicas");
        self.bounded(async |mut c| {
            self.scripts
                .grant
                .key(key)
                .key(&replicas)
                .arg(&self.replica)
                .arg(cap)
                .arg(want)
                .arg(floor)
                .arg(self.lease.as_millis() as u64)
                .invoke_async(&mut c)
                .await
        })
        .await
    }

    /// Publishes `mine` (worker id, this replica's requests there with no first byte, and in
    /// flight) and returns the other replicas' counts on each, in the same order.
    pub(crate) async fn share(
        &self,
        mine: &[(&str, u64, u64)],
    ) -> Result<Vec<(u64, u64)>, StoreError> {
        let replicas = self.key("replicas");
        let sums: Vec<u64> = self
            .bounded(async |mut c| {
                let mut call = self.scripts.share.key(&replicas);
                for (worker, _, _) in mine {
                    call.key(self.key(&format!("traffic:{worker}")));
                }
                call.arg(&self.replica).arg(self.lease.as_millis() as u64);
                for (_, pending, in_flight) in mine {
                    call.arg(*pending).arg(*in_flight);
                }
                call.invoke_async(&mut c).await
            })
            .await?;
        Ok(sums
            .chunks(2)
            .map(|c| (c[0], c.get(1).copied().unwrap_or(0)))
            .collect())
    }

    /// Renews this replica's lease and learns how many are live.
    pub(crate) async fn heartbeat(&self) -> Result<u32, StoreError> {
        let key = self.key("replicas");
        let live: u32 = self
            .bounded(async |mut c| {
                self.scripts
                    .heartbeat
                    .key(&key)
                    .arg(&self.replica)
                    .arg(self.lease.as_millis() as u64)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        let live = live.max(1);
        if self.replicas.swap(live, Ordering::Relaxed) != live {
            self.state.send_modify(|s| s.replicas = live);
        }
        Ok(live)
    }

    /// Connects and checks Redis answers; `true` when it does (the store is not marked up
    /// yet: the caller reconciles first, then calls `came_back`).
    pub(crate) async fn connect(&self) -> bool {
        let attempt = async {
            let mut connection = self.client.get_multiplexed_async_connection().await?;
            redis::cmd("PING")
                .query_async::<String>(&mut connection)
                .await?;
            Ok::<_, redis::RedisError>(connection)
        };
        match tokio::time::timeout(self.timeout.max(Duration::from_secs(1)), attempt).await {
            Ok(Ok(connection)) => {
                self.connection.store(Some(Arc::new(connection)));
                true
            }
            _ => false,
        }
    }

    /// Redis answers again and what was spent apart is reconciled: shared limits resume.
    pub(crate) fn came_back(&self, first: bool) {
        if !self.up.swap(true, Ordering::AcqRel) {
            self.up_gauge.set(1);
            self.state.send_modify(|s| s.up = true);
            if first {
                info!(replica = %self.replica, "shared state in Redis in use");
            } else {
                info!(replica = %self.replica, "Redis answers again: shared limits resume, what was spent apart reconciled");
            }
        }
    }

    /// Redis did not answer at startup: counted as a switch to local limits.
    pub(crate) fn fell_back_at_start(&self) {
        self.fallbacks.inc();
        self.state.send_modify(|s| s.fallbacks += 1);
    }

    /// Whether the store has a connection (it may not be marked up yet).
    pub(crate) fn connected(&self) -> bool {
        self.connection.load().is_some()
    }
}
