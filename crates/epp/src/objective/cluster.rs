//! The pool's InferenceObjectives (`inference.networking.x-k8s.io/v1alpha2`), followed in its
//! namespace: each one whose `poolRef` names the pool gives its name the priority in its spec
//! (0 when unset, as the Inference Extension reads an unset priority).
//!
//! The types are the parts of the API this reads and the deploy manifests write, from the API
//! reference (`apix/v1alpha2/inferenceobjective_types.go` in
//! kubernetes-sigs/gateway-api-inference-extension, v1.x); unknown fields are skipped, as the
//! cluster may be newer, and the manifests' test reads them back whole.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use futures_util::StreamExt;
use kube::core::{ApiResource, GroupVersionKind, NotUsed, Object};
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::Api;
use serde::{Deserialize, Serialize};
use sluice_gateway::control::discovery::pool::POOL_GROUP;
use sluice_gateway::control::discovery::{KubeError, Mirror};
use tokio::sync::watch;
use tracing::{info, warn};

use super::Objectives;
use crate::pool::Watched;

/// The InferenceObjective API group (its version: v1alpha2).
pub const OBJECTIVE_GROUP: &str = "inference.networking.x-k8s.io";

/// An InferenceObjective.
pub type InferenceObjective = Object<InferenceObjectiveSpec, NotUsed>;

/// Where InferenceObjectives are served.
pub fn objective_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(OBJECTIVE_GROUP, "v1alpha2", "InferenceObjective"),
        "inferenceobjectives",
    )
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InferenceObjectiveSpec {
    /// Higher is more urgent; negative is sheddable. Unset reads as 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// The pool, in the objective's namespace.
    pub pool_ref: PoolObjectReference,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PoolObjectReference {
    /// `inference.networking.k8s.io` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// `InferencePool` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub name: String,
}

impl PoolObjectReference {
    /// Whether this names the v1 InferencePool `pool`.
    pub fn names(&self, pool: &str) -> bool {
        self.name == pool
            && self
                .group
                .as_deref()
                .is_none_or(|g| g.is_empty() || g == POOL_GROUP)
            && self.kind.as_deref().is_none_or(|k| k == "InferencePool")
    }
}

/// The priorities the objectives naming `pool` give.
pub fn priorities<'a>(
    objectives: impl IntoIterator<Item = &'a InferenceObjective>,
    pool: &str,
) -> HashMap<String, i32> {
    objectives
        .into_iter()
        .filter(|o| o.spec.pool_ref.names(pool))
        .filter_map(|o| Some((o.metadata.name.clone()?, o.spec.priority.unwrap_or(0))))
        .collect()
}

/// Follows the objectives and writes their priorities where requests read them.
pub struct Follower {
    objectives: Api<InferenceObjective>,
    pool: String,
    into: Arc<ArcSwap<HashMap<String, i32>>>,
    changed: Arc<watch::Sender<u64>>,
}

impl Objectives {
    /// A follower of `pool`'s objectives writing into these; credentials are read now.
    pub async fn follow(&self, pool: &Watched) -> Result<Follower, KubeError> {
        let client = pool.cluster.client().await?;
        Ok(Follower {
            objectives: Api::namespaced_with(client, &pool.namespace, &objective_resource()),
            pool: pool.name.clone(),
            into: self.cluster.clone(),
            changed: self.changed.clone(),
        })
    }
}

impl Follower {
    /// Runs until `stop`: after each change, from the first complete list on, the priorities are
    /// replaced whole. A watch that fails keeps the last ones (and retries with backoff).
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut events = watcher::watcher(self.objectives, watcher::Config::default())
            .default_backoff()
            .boxed();
        let mut seen = Mirror::new();
        let mut failing: Option<String> = None;
        loop {
            let event = tokio::select! {
                event = events.next() => event,
                _ = stop.wait_for(|stop| *stop) => return,
            };
            let Some(event) = event else { return };
            match event {
                Ok(event) => seen.apply(event),
                Err(e) => {
                    let e = e.to_string();
                    if failing.as_ref() != Some(&e) {
                        warn!(error = %e, pool = %self.pool, "cannot follow the pool's InferenceObjectives: their last priorities stay");
                        failing = Some(e);
                    }
                    continue;
                }
            }
            if failing.take().is_some() {
                info!(pool = %self.pool, "following the pool's InferenceObjectives again");
            }
            if seen.listed {
                let now = priorities(seen.known.values(), &self.pool);
                if **self.into.load() != now {
                    info!(pool = %self.pool, objectives = ?now, "InferenceObjective priorities");
                    self.into.store(Arc::new(now));
                    self.changed.send_modify(|n| *n += 1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::admission::Tier;

    fn objective(
        name: &str,
        priority: Option<i32>,
        pool_ref: PoolObjectReference,
    ) -> InferenceObjective {
        let mut o = InferenceObjective::new(
            name,
            &objective_resource(),
            InferenceObjectiveSpec { priority, pool_ref },
        );
        o.metadata.namespace = Some("llm".into());
        o
    }

    fn to(pool: &str) -> PoolObjectReference {
        PoolObjectReference {
            name: pool.into(),
            ..PoolObjectReference::default()
        }
    }

    #[test]
    fn only_objectives_naming_the_v1_pool_count_and_unset_is_zero() {
        let other_group = PoolObjectReference {
            group: Some("inference.networking.x-k8s.io".into()),
            ..to("llama")
        };
        let explicit = PoolObjectReference {
            group: Some(POOL_GROUP.into()),
            kind: Some("InferencePool".into()),
            ..to("llama")
        };
        let all = [
            objective("chat", Some(10), to("llama")),
            objective("default", None, explicit),
            objective("offline", Some(-5), to("llama")),
            objective("elsewhere", Some(10), to("mistral")),
            objective("old-pool", Some(10), other_group),
        ];
        let got = priorities(&all, "llama");
        let want: HashMap<String, i32> = [
            ("chat".into(), 10),
            ("default".into(), 0),
            ("offline".into(), -5),
        ]
        .into();
        assert_eq!(got, want);
    }

    #[test]
    fn the_clusters_priority_wins_over_a_flag_of_the_same_name() {
        let objectives = Objectives::parse(["chat=-1", "batch=-1"]).unwrap();
        assert_eq!(objectives.tier("chat"), Tier::Batch);
        objectives
            .cluster
            .store(Arc::new([("chat".to_string(), 10)].into()));
        assert_eq!(objectives.tier("chat"), Tier::Interactive);
        assert_eq!(objectives.tier("batch"), Tier::Batch, "the flag fills in");
    }
}
