//! The simulated model's files (tokenizer, chat template) for gRPC workers' tests.

use std::path::PathBuf;
use std::sync::Arc;

use sluice_gateway::config::Config;
use sluice_gateway::tokens::{ModelFiles, Tokens};
use sluice_sim::vocab::Vocab;
use sluice_sim::{EngineConfig, FleetConfig, SimFleet};

use super::Setup;

/// The simulated model's files in a directory of their own, removed when dropped.
pub struct ModelDir(pub PathBuf);

impl ModelDir {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("sluice-grpc-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Vocab::new().write_model_dir(&dir, "test-model").unwrap();
        Self(dir)
    }

    /// The gateway's tokens, loaded from the directory as `--model-path` loads them.
    pub fn tokens(&self) -> Arc<Tokens> {
        let files = ModelFiles {
            model_path: Some(self.0.clone()),
            ..ModelFiles::default()
        };
        Arc::new(Tokens::load(&files).unwrap())
    }
}

impl Drop for ModelDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `engines` gRPC engines of `engine`'s settings, and a gateway with the model's files.
pub async fn grpc_setup(engines: usize, engine: EngineConfig, model: &ModelDir) -> Setup {
    grpc_setup_with(engines, engine, model, |_| {}).await
}

/// `grpc_setup`, the gateway's configuration tuned.
pub async fn grpc_setup_with(
    engines: usize,
    mut engine: EngineConfig,
    model: &ModelDir,
    tune: impl FnOnce(&mut Config),
) -> Setup {
    engine.grpc = Some(engine.grpc.unwrap_or_default());
    let sims = SimFleet::start(FleetConfig::local(engines, engine))
        .await
        .unwrap();
    assert!(sims.urls().iter().all(|u| u.starts_with("grpc://")));
    let mut config = Config::local(&sims.urls());
    config.upstream.tokens = sluice_gateway::tokens::SharedTokens::new(Some(model.tokens()));
    tune(&mut config);
    super::serve(sims, config).await
}
