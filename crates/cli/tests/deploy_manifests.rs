//! deploy/kubernetes/ as Kubernetes and sluice read it: every manifest parses into
//! k8s-openapi's typed objects and serialises back with no key lost (their deserialisers skip
//! unknown keys, so a misspelt field would otherwise vanish without a word), and the gateway's
//! container arguments and config file are settings `sluice serve` accepts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/manifests.rs"]
mod manifests;

use clap::{CommandFactory, Parser};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use manifests::{documents, find, lost_in};

#[test]
fn every_manifest_survives_k8s_openapis_types_whole() {
    let docs = documents("kubernetes");
    let mut kinds = Vec::new();
    for (file, doc) in &docs {
        let kind = doc["kind"]
            .as_str()
            .unwrap_or_else(|| panic!("{file}: no kind"));
        let lost = match kind {
            "Deployment" => lost_in::<Deployment>(doc),
            "Service" => lost_in::<Service>(doc),
            "ConfigMap" => lost_in::<ConfigMap>(doc),
            "ServiceAccount" => lost_in::<ServiceAccount>(doc),
            "Role" => lost_in::<Role>(doc),
            "RoleBinding" => lost_in::<RoleBinding>(doc),
            other => panic!("{file}: a {other}, which this test does not know: add it"),
        }
        .unwrap_or_else(|e| panic!("{file}: not a valid {kind}: {e}"));
        assert!(lost.is_empty(), "{file} ({kind}): {lost:#?}");
        kinds.push(kind);
    }
    for needed in ["Deployment", "Service", "ConfigMap", "Role", "RoleBinding"] {
        assert!(kinds.contains(&needed), "no {needed} in {kinds:?}");
    }
}

#[derive(Parser)]
struct Serve {
    #[command(flatten)]
    settings: sluice_gateway::Settings,
}

#[test]
fn the_gateways_arguments_and_config_file_are_valid_settings() {
    let docs = documents("kubernetes");
    let config: ConfigMap =
        serde_json::from_value(find(&docs, "ConfigMap", "sluice-config").clone()).unwrap();
    let toml = &config.data.as_ref().unwrap()["sluice.toml"];
    let file = std::env::temp_dir().join(format!("sluice-deploy-{}.toml", std::process::id()));
    std::fs::write(&file, toml).unwrap();

    let gateway: Deployment =
        serde_json::from_value(find(&docs, "Deployment", "sluice").clone()).unwrap();
    let pod = gateway.spec.template.spec.unwrap();
    let container = &pod.containers[0];
    let mut args: Vec<String> = container.args.clone().unwrap();
    assert_eq!(args.remove(0), "serve");
    let args: Vec<String> = args
        .into_iter()
        .map(|a| match a.strip_prefix("--config=") {
            Some(_) => format!("--config={}", file.display()),
            None => a.replace("$(POD_NAMESPACE)", "default"),
        })
        .collect();
    let matches = Serve::command()
        .try_get_matches_from(std::iter::once("serve".to_string()).chain(args))
        .unwrap_or_else(|e| panic!("the container's arguments: {e}"));
    let settings = sluice_gateway::config::load(&matches).unwrap();
    let valid = settings.validate();
    let _ = std::fs::remove_file(&file);
    let valid = valid.unwrap_or_else(|e| panic!("the container's settings: {e}"));
    assert_eq!(valid.admission.tenants.len(), 2, "the ConfigMap's tenants");
    assert!(valid.shared.is_some(), "replicas share through Redis");
    let kubernetes = valid
        .discovery
        .kubernetes
        .as_ref()
        .expect("workers found as pods");
    let sluice_gateway::control::discovery::Members::Selected { selectors, .. } =
        &kubernetes.members
    else {
        panic!("pods by selector: {:?}", kubernetes.members);
    };
    assert_eq!(selectors[0].labels, "app=vllm");
    assert_eq!(kubernetes.namespace.as_deref(), Some("default"));
    assert_eq!(pod.service_account_name.as_deref(), Some("sluice"));
    let role: Role =
        serde_json::from_value(find(&docs, "Role", "sluice-discovery").clone()).unwrap();
    let rule = &role.rules.as_ref().unwrap()[0];
    assert_eq!(rule.resources.as_deref(), Some(&["pods".to_string()][..]));
    for verb in ["get", "list", "watch"] {
        assert!(
            rule.verbs.contains(&verb.to_string()),
            "the Role lets it {verb} pods"
        );
    }

    // The probes the kubelet uses are the gateway's probe port and paths.
    let port = container.ports.as_ref().unwrap();
    let probes = port
        .iter()
        .find(|p| p.name.as_deref() == Some("probes"))
        .unwrap();
    assert_eq!(
        valid.listener.health.map(|a| a.port()),
        Some(probes.container_port as u16)
    );
    let path = |probe: &Option<k8s_openapi::api::core::v1::Probe>| {
        probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap()
            .path
            .clone()
    };
    assert_eq!(
        path(&container.liveness_probe).as_deref(),
        Some("/liveness")
    );
    assert_eq!(
        path(&container.readiness_probe).as_deref(),
        Some("/readiness")
    );
}
