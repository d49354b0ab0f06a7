//! `--pool-name`: the InferencePool a picker serves, as the Inference Extension deploys one
//! picker per pool. Its pods are the gateway's workers (the gateway's Kubernetes discovery
//! follows the pool: `Members::Pool`), and the InferenceObjectives that name it give requests
//! their priorities (`objective::cluster`).

use sluice_gateway::config::ConfigError;
use sluice_gateway::control::discovery::pool::POOL_GROUP;
use sluice_gateway::control::discovery::{Cluster, KubeConfig, Members, PoolRef};
use sluice_gateway::{Config, Settings};

use crate::EppSettings;

/// Why the pool cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("--pool-group: only {POOL_GROUP} (InferencePool v1) is read, not '{0}'")]
    Group(String),
    #[error(
        "--pool-name and --service-discovery both say which pods are workers: give one of them"
    )]
    AlsoSelected,
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// The pool a picker follows in the cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct Watched {
    pub cluster: Cluster,
    pub namespace: String,
    pub name: String,
}

impl EppSettings {
    /// The gateway's config from its settings, the pool (when named) its source of workers.
    pub fn config(&self, settings: &Settings) -> Result<Config, PoolError> {
        let mut config = settings.validate()?;
        let Some(name) = &self.pool_name else {
            return Ok(config);
        };
        if self.pool_group != POOL_GROUP {
            return Err(PoolError::Group(self.pool_group.clone()));
        }
        if config.discovery.kubernetes.is_some() {
            return Err(PoolError::AlsoSelected);
        }
        config.discovery.kubernetes = Some(KubeConfig {
            members: Members::Pool(PoolRef { name: name.clone() }),
            namespace: Some(self.pool_namespace.clone()),
            model_from: None,
            cluster: Cluster::Infer,
        });
        // As with any discovery (seed 004): a removed pod is registered again once healthy.
        if settings.health.remove_unhealthy_workers.is_none() {
            config.control.health.remove_unhealthy = true;
        }
        Ok(config)
    }
}

/// The pool `config`'s discovery follows, if it follows one.
pub fn watched(config: &Config) -> Option<Watched> {
    let kube = config.discovery.kubernetes.as_ref()?;
    let Members::Pool(pool) = &kube.members else {
        return None;
    };
    Some(Watched {
        cluster: kube.cluster.clone(),
        namespace: kube.namespace.clone().unwrap_or_default(),
        name: pool.name.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(args: &[&str]) -> Result<Config, PoolError> {
        let (settings, epp) = crate::tests::load(args);
        epp.config(&settings)
    }

    #[test]
    fn a_named_pool_is_the_source_of_workers() {
        let config =
            config(&["sluice", "--pool-name", "llama", "--pool-namespace", "llm"]).unwrap();
        let pool = watched(&config).unwrap();
        assert_eq!(
            (pool.name.as_str(), pool.namespace.as_str()),
            ("llama", "llm")
        );
        assert!(
            config.control.health.remove_unhealthy,
            "auto-recovery follows discovery"
        );
        let kept = self::config(&[
            "sluice",
            "--pool-name",
            "llama",
            "--no-remove-unhealthy-workers",
        ])
        .unwrap();
        assert!(!kept.control.health.remove_unhealthy, "unless turned off");

        let plain = self::config(&["sluice", "--worker-urls", "http://10.0.0.1:8000"]).unwrap();
        assert_eq!(watched(&plain), None);
        assert!(!plain.control.health.remove_unhealthy);
    }

    #[test]
    fn a_pool_of_another_group_or_beside_a_selector_is_refused() {
        let other = config(&[
            "sluice",
            "--pool-name",
            "llama",
            "--pool-group",
            "inference.networking.x-k8s.io",
        ]);
        assert!(matches!(other, Err(PoolError::Group(g)) if g == "inference.networking.x-k8s.io"));
        let both = config(&[
            "sluice",
            "--pool-name",
            "llama",
            "--service-discovery",
            "--selector",
            "app=vllm",
        ]);
        assert!(matches!(both, Err(PoolError::AlsoSelected)), "{both:?}");
    }
}
