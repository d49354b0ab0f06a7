//! `sluice bench run`: one run against any OpenAI-compatible endpoint — open-loop arrivals on a
//! schedule, or closed-loop clients that each send their next request when the last one ended —
//! request shapes from a named mix, a priority tier and a tenant per request, clients that
//! retry or not and give up or not (`client::Behaviour`) — summed up into goodput (see
//! `goodput`).

use std::sync::Arc;
use std::time::Duration;

use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::{Rng, SeedableRng};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::arrivals::{arrivals, ArrivalError, Process, Schedule};
use crate::client::{self, Behaviour, ClientKind, HttpClient, Job, Patience};
use crate::goodput::{summarize, Outcome, Report, Slo, Tier};
use crate::prompts::PromptSource;

pub use crate::prompts::Mix;

/// The default tiers: interactive work with latency objectives and batch work with a deadline.
pub fn default_tiers() -> Vec<Tier> {
    vec![
        Tier {
            name: "interactive".into(),
            share: 0.7,
            tenant: None,
            slo: Slo::gateways(sluice_core::admission::Tier::Interactive),
        },
        Tier {
            name: "batch".into(),
            share: 0.3,
            tenant: None,
            slo: Slo {
                deadline: Some(Duration::from_secs(120)),
                ..Slo::default()
            },
        },
    ]
}

/// A run.
#[derive(Debug, Clone)]
pub struct RunPlan {
    /// The completions URL, e.g. `http://127.0.0.1:30000/v1/completions`.
    pub url: String,
    pub model: String,
    pub schedule: Schedule,
    pub process: Process,
    pub seed: u64,
    pub max_requests: usize,
    /// Arrivals stop after this; requests still running are waited for (up to the timeout).
    pub duration: Duration,
    pub mix: Mix,
    pub tiers: Vec<Tier>,
    pub tenants: u32,
    /// API keys, one per tenant in turn (tenant `i` sends `keys[i % len]`); none: no key.
    pub tenant_keys: Vec<String>,
    pub client: ClientKind,
    /// When clients give up or leave on their own.
    pub patience: Patience,
    /// Streams (SSE) or whole answers.
    pub stream: bool,
    /// Closed loop: this many clients, each sending its next request as soon as its last one
    /// ended (answered, refused or given up on), for `duration`; the schedule is not used.
    pub closed_loop: Option<u32>,
    /// A request with no answer by then counts as `client_timeout`.
    pub request_timeout: Duration,
    /// When the run's clock starts, which every `due` counts from (default: 20 ms after
    /// `execute` is called); a harness that acts on the same clock gives it.
    pub starts_at: Option<Instant>,
    /// Completions of exact lengths, or chats at the model's length.
    pub api: crate::client::Api,
    /// Each request names one of these LoRA adapters as its model instead of `model`.
    pub adapters: Option<AdapterMix>,
}

/// LoRA adapters requests ask for, the popular ones most (Zipf, ranked in order).
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterMix {
    pub names: Vec<Arc<str>>,
    /// The Zipf exponent: 1.0, the k-th adapter asked for 1/k as often as the first.
    pub exponent: f64,
}

impl AdapterMix {
    /// `count` adapters named `lora-00`, `lora-01`, ...
    pub fn numbered(count: usize, exponent: f64) -> Self {
        Self {
            names: (0..count).map(|i| format!("lora-{i:02}").into()).collect(),
            exponent,
        }
    }

    fn pick(&self, rng: &mut rand::rngs::StdRng) -> Option<Arc<str>> {
        use rand_distr::Distribution;
        let zipf = rand_distr::Zipf::new(self.names.len() as f64, self.exponent).ok()?;
        let rank = zipf.sample(rng) as usize;
        self.names.get(rank.saturating_sub(1)).cloned()
    }
}

/// The jobs of a run, drawn from its seed: when each is due, its tier, shape and tenant.
pub fn jobs(plan: &RunPlan) -> Result<Vec<Job>, ArrivalError> {
    let due = arrivals(
        &plan.schedule,
        plan.process,
        plan.seed,
        plan.max_requests,
        plan.duration,
    )?;
    let mut source = JobSource::new(plan);
    Ok(due.into_iter().map(|due| source.next_job(due)).collect())
}

/// Draws one job after another from a plan's seed: its tier, shape and tenant (open-loop runs
/// stamp each with its arrival, closed-loop clients with when they send it).
pub struct JobSource {
    plan: RunPlan,
    rng: rand::rngs::StdRng,
    prompts: PromptSource,
    total_share: f64,
}

impl JobSource {
    pub fn new(plan: &RunPlan) -> Self {
        Self {
            plan: plan.clone(),
            rng: rand::rngs::StdRng::seed_from_u64(plan.seed ^ 0x5eed),
            prompts: PromptSource::new(plan.mix, plan.seed),
            total_share: plan.tiers.iter().map(|t| t.share.max(0.0)).sum(),
        }
    }

    /// The next job, due at `due` from the start of the run.
    pub fn next_job(&mut self, due: Duration) -> Job {
        let drawn = self.prompts.next_prompt();
        let mut pick = self.rng.random::<f64>() * self.total_share;
        let tier = self
            .plan
            .tiers
            .iter()
            .position(|t| {
                pick -= t.share.max(0.0);
                pick < 0.0
            })
            .unwrap_or(0);
        let mut job = Job {
            due,
            tier,
            prompt_tokens: drawn.prompt.tokens(),
            output_tokens: drawn.output_tokens,
            prompt: drawn.prompt,
            tenant: self.rng.random_range(0..self.plan.tenants.max(1)),
            priority: tier as i64,
            headers: Vec::new(),
            model: None,
        };
        job.model = self
            .plan
            .adapters
            .as_ref()
            .and_then(|a| a.pick(&mut self.rng));
        job.headers = identity_headers(&self.plan, &job);
        job
    }
}

/// The headers that say who asks and how urgently: the tenant's key, and a tier named as sluice
/// names them (`interactive`, `agent`, `batch`) in both sluice's and SMG's priority headers; and
/// the conversation the request belongs to, `x-session-id` (sluice's default routing key).
pub fn identity_headers(plan: &RunPlan, job: &Job) -> Vec<(String, String)> {
    let mut headers = vec![(
        "x-session-id".to_string(),
        format!("{:016x}", job.prompt.conversation),
    )];
    if !plan.tenant_keys.is_empty() {
        let key = &plan.tenant_keys[job.tenant as usize % plan.tenant_keys.len()];
        headers.push(("authorization".into(), format!("Bearer {key}")));
    }
    if let Some(tenant) = plan.tiers.get(job.tier).and_then(|t| t.tenant.as_ref()) {
        headers.push(("x-smg-tenant-id".into(), tenant.clone()));
    }
    let smg = match plan.tiers.get(job.tier).map(|t| t.name.as_str()) {
        Some("interactive") => Some("interactive"),
        Some("agent") => Some("default"),
        Some("batch") => Some("bulk"),
        _ => None,
    };
    if let Some(smg) = smg {
        headers.push((
            "x-sluice-priority".into(),
            plan.tiers[job.tier].name.clone(),
        ));
        headers.push(("x-smg-priority".into(), smg.into()));
    }
    headers
}

impl RunPlan {
    fn start(&self) -> Instant {
        self.starts_at
            .unwrap_or_else(|| Instant::now() + Duration::from_millis(20))
    }
}

/// Runs the plan and sums it up.
pub async fn execute(plan: &RunPlan) -> Result<(Vec<Outcome>, Report), ArrivalError> {
    let outcomes = match plan.closed_loop {
        Some(clients) => closed_loop(plan, clients).await,
        None => open_loop(plan).await?,
    };
    let mut report = summarize(&outcomes.0, &plan.tiers, plan.duration);
    report.prefix_sharing = outcomes.1;
    Ok((outcomes.0, report))
}

/// What every request of a run shares.
#[derive(Clone)]
struct Sender {
    http: HttpClient,
    url: Arc<str>,
    model: Arc<str>,
    api: crate::client::Api,
    behaviour: Behaviour,
    /// A request with no answer by then counts as `client_timeout`.
    timeout: Duration,
}

impl Sender {
    fn of(plan: &RunPlan) -> Self {
        Self {
            http: Client::builder(TokioExecutor::new())
                .pool_max_idle_per_host(usize::MAX)
                .build_http(),
            url: plan.url.clone().into(),
            model: plan.model.clone().into(),
            api: plan.api,
            behaviour: Behaviour {
                retries: plan.client,
                patience: plan.patience,
                stream: plan.stream,
            },
            timeout: plan.request_timeout,
        }
    }

    /// Sends `job` when it is due (from `start`) and returns what came of it.
    async fn send(&self, job: Job, start: Instant) -> Outcome {
        let due = start + job.due;
        let model = job.model.clone().unwrap_or_else(|| self.model.clone());
        let sent = client::run(
            &self.http,
            &self.url,
            (self.api, &model),
            &job,
            self.behaviour,
            start,
        );
        match tokio::time::timeout_at(due + self.timeout, sent).await {
            Ok(outcome) => outcome,
            Err(_) => Outcome {
                due: job.due,
                tier: job.tier,
                status: 0,
                code: Some(client::CLIENT_TIMEOUT.into()),
                completed: false,
                ttft: None,
                e2e: self.timeout,
                output_tokens: 0,
                attempts: 1,
                rejected_after: None,
                sent_late: Duration::ZERO,
            },
        }
    }
}

/// Every job sent when due, whatever happened to the others; and the share of prompt tokens
/// the jobs repeat.
async fn open_loop(plan: &RunPlan) -> Result<(Vec<Outcome>, f64), ArrivalError> {
    let jobs = jobs(plan)?;
    let prefix_sharing = crate::prompts::sharing(jobs.iter().map(|j| &j.prompt));
    let sender = Sender::of(plan);
    let start = plan.start();
    let mut running = JoinSet::new();
    for job in jobs {
        let sender = sender.clone();
        running.spawn(async move { sender.send(job, start).await });
    }
    let mut outcomes = Vec::new();
    while let Some(done) = running.join_next().await {
        if let Ok(outcome) = done {
            outcomes.push(outcome);
        }
    }
    Ok((outcomes, prefix_sharing))
}

/// `clients` clients, each sending its next job as soon as the last one ended, until the plan's
/// duration is up (at most `max_requests` in all); the jobs are drawn in the order they are
/// sent, so a run's requests follow from its seed.
async fn closed_loop(plan: &RunPlan, clients: u32) -> (Vec<Outcome>, f64) {
    let sender = Sender::of(plan);
    let start = plan.start();
    let source = Arc::new(parking_lot::Mutex::new((JobSource::new(plan), 0usize)));
    let prompts = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut running = JoinSet::new();
    for _ in 0..clients.max(1) {
        let (sender, source, prompts) = (sender.clone(), source.clone(), prompts.clone());
        let (duration, most) = (plan.duration, plan.max_requests);
        running.spawn(async move {
            let mut outcomes = Vec::new();
            loop {
                let now = Instant::now().max(start) - start;
                if now >= duration {
                    break outcomes;
                }
                let job = {
                    let mut source = source.lock();
                    if source.1 >= most {
                        break outcomes;
                    }
                    source.1 += 1;
                    source.0.next_job(now)
                };
                prompts.lock().push(job.prompt.clone());
                outcomes.push(sender.send(job, start).await);
            }
        });
    }
    let mut outcomes = Vec::new();
    while let Some(done) = running.join_next().await {
        outcomes.extend(done.unwrap_or_default());
    }
    let sharing = crate::prompts::sharing(prompts.lock().iter());
    (outcomes, sharing)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sim::testkit;
    use sluice_sim::Flavor;

    fn plan(url: String) -> RunPlan {
        RunPlan {
            adapters: None,
            url,
            model: "test-model".into(),
            schedule: Schedule::constant(100.0),
            process: Process::Poisson,
            seed: 5,
            max_requests: 40,
            duration: Duration::from_secs(2),
            mix: Mix::Chat,
            tiers: default_tiers(),
            tenants: 3,
            tenant_keys: Vec::new(),
            client: ClientKind::None,
            patience: Patience::default(),
            stream: true,
            closed_loop: None,
            request_timeout: Duration::from_secs(30),
            starts_at: None,
            api: crate::client::Api::Completions,
        }
    }

    #[test]
    fn jobs_follow_the_mix_and_the_tier_shares() {
        let mut p = plan(String::new());
        p.max_requests = 2000;
        p.schedule = Schedule::constant(1000.0);
        p.duration = Duration::from_secs(10);
        p.mix = Mixed;
        let jobs = jobs(&p).unwrap();
        assert_eq!(jobs.len(), 2000);
        let batch = jobs.iter().filter(|j| j.tier == 1).count() as f64 / 2000.0;
        assert!((batch - 0.3).abs() < 0.05, "{batch}");
        let long = jobs.iter().filter(|j| j.prompt_tokens >= 3072).count() as f64 / 2000.0;
        assert!((long - 0.5).abs() < 0.05, "{long}");
        assert!(jobs.iter().all(|j| j.tenant < 3));
        assert_eq!(jobs, super::jobs(&p).unwrap(), "reproducible");
    }

    use Mix::Mixed;

    #[test]
    fn each_request_names_its_tenants_key_and_its_tier() {
        let mut p = plan(String::new());
        p.tenant_keys = vec!["ka".into(), "kb".into()];
        let jobs = jobs(&p).unwrap();
        for job in &jobs {
            let headers = identity_headers(&p, job);
            let session = format!("{:016x}", job.prompt.conversation);
            assert_eq!(headers[0], ("x-session-id".to_string(), session));
            let key = format!("Bearer {}", p.tenant_keys[job.tenant as usize % 2]);
            assert_eq!(headers[1], ("authorization".to_string(), key));
            let (sluice, smg) = match job.tier {
                0 => ("interactive", "interactive"),
                _ => ("batch", "bulk"),
            };
            assert_eq!(
                headers[2],
                ("x-sluice-priority".to_string(), sluice.to_string())
            );
            assert_eq!(headers[3], ("x-smg-priority".to_string(), smg.to_string()));
        }
        p.tenant_keys.clear();
        assert_eq!(
            identity_headers(&p, &jobs[0]).len(),
            3,
            "no key without keys"
        );
    }

    #[tokio::test]
    async fn a_run_against_instant_engines_is_all_goodput() {
        let sims = testkit::fleet(testkit::instant(Flavor::Vllm)).await;
        let url = format!("{}/v1/completions", sims.urls()[0]);
        let (outcomes, report) = execute(&plan(url)).await.unwrap();
        assert_eq!(outcomes.len(), 40);
        assert!(
            outcomes.iter().all(|o| o.status == 200 && o.completed),
            "{outcomes:?}"
        );
        assert!(outcomes
            .iter()
            .all(|o| o.output_tokens >= 1 && o.ttft.is_some()));
        assert_eq!(
            report.goodput_rps, 20.0,
            "40 within their objectives over 2 s"
        );
        assert_eq!(report.rejection_rate, 0.0);
        assert_eq!(report.retry_amplification, 1.0);
    }

    /// The engine's prefix-cache counters, read from its `/metrics`.
    async fn prefix_counters(base: &str) -> (f64, f64) {
        let text = testkit::get(&testkit::client(), &format!("{base}/metrics"))
            .await
            .text();
        let value = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        (
            value("vllm:prefix_cache_queries_total"),
            value("vllm:prefix_cache_hits_total"),
        )
    }

    #[tokio::test]
    async fn a_run_of_conversations_hits_the_engines_prefix_cache_as_much_as_it_shares() {
        let sims = testkit::fleet(testkit::instant(Flavor::Vllm)).await;
        let base = sims.urls()[0].clone();
        let mut p = plan(format!("{base}/v1/completions"));
        p.mix = Mix::Sessions;
        p.max_requests = 200;
        // Evenly spaced and far apart next to an instant engine's answer: a turn never arrives
        // before the one it continues has been prefilled (Poisson gaps at 200/s did, on a loaded
        // machine, and found its prefix not yet cached).
        p.schedule = Schedule::constant(50.0);
        p.process = Process::Gamma { burstiness: 1000.0 };
        p.duration = Duration::from_secs(5);
        let (outcomes, report) = execute(&p).await.unwrap();
        assert!(outcomes.iter().all(|o| o.status == 200 && o.completed));
        let (queries, hits) = prefix_counters(&base).await;
        let total: u32 = jobs(&p).unwrap().iter().map(|j| j.prompt_tokens).sum();
        assert_eq!(queries, f64::from(total), "every prompt token is a query");
        let hit_rate = hits / queries;
        assert!(report.prefix_sharing > 0.5, "{}", report.prefix_sharing);
        // One engine with room for all of it hits what the load shares, bar the engine's rule
        // that a prompt computes at least its last token.
        assert!(
            hit_rate <= report.prefix_sharing && hit_rate > report.prefix_sharing - 0.02,
            "hit rate {hit_rate}, sharing {}",
            report.prefix_sharing
        );
    }
}
