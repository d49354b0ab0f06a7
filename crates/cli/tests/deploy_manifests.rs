//! deploy/kubernetes/ as Kubernetes and sluice read it: every manifest parses into
//! k8s-openapi's typed objects and serialises back with no key lost (their deserialisers skip
//! unknown keys, so a misspelt field would otherwise vanish without a word), and the gateway's
//! container arguments and config file are settings `sluice serve` accepts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use clap::{CommandFactory, Parser};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes")
}

/// Every document of every manifest, with the file it came from.
fn documents() -> Vec<(String, Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in {:?}", deploy_dir());
    files
        .into_iter()
        .flat_map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            serde_saphyr::from_multiple::<Value>(&text)
                .unwrap_or_else(|e| panic!("{name}: not YAML: {e}"))
                .into_iter()
                .map(move |doc| (name.clone(), doc))
        })
        .collect()
}

/// The document read as `T` and written back.
fn round_trip<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<Value, String> {
    let typed: T = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(typed).map_err(|e| e.to_string())
}

/// Where `original` and `back` differ, as paths (`spec.template.spec.containers[0].args`).
fn differences(original: &Value, back: &Value, at: &str, out: &mut Vec<String>) {
    match (original, back) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                let here = if at.is_empty() {
                    key.clone()
                } else {
                    format!("{at}.{key}")
                };
                match b.get(key) {
                    Some(other) => differences(value, other, &here, out),
                    None => out.push(format!("{here} (lost)")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                differences(x, y, &format!("{at}[{i}]"), out);
            }
        }
        (a, b) if a != b => out.push(format!("{at}: {a} became {b}")),
        _ => {}
    }
}

#[test]
fn every_manifest_survives_k8s_openapis_types_whole() {
    let docs = documents();
    let mut kinds = Vec::new();
    for (file, doc) in &docs {
        let kind = doc["kind"]
            .as_str()
            .unwrap_or_else(|| panic!("{file}: no kind"));
        let back = match kind {
            "Deployment" => round_trip::<Deployment>(doc),
            "Service" => round_trip::<Service>(doc),
            "ConfigMap" => round_trip::<ConfigMap>(doc),
            "ServiceAccount" => round_trip::<ServiceAccount>(doc),
            "Role" => round_trip::<Role>(doc),
            "RoleBinding" => round_trip::<RoleBinding>(doc),
            other => panic!("{file}: a {other}, which this test does not know: add it"),
        }
        .unwrap_or_else(|e| panic!("{file}: not a valid {kind}: {e}"));
        let mut lost = Vec::new();
        differences(doc, &back, "", &mut lost);
        assert!(lost.is_empty(), "{file} ({kind}): {lost:#?}");
        kinds.push(kind);
    }
    for needed in ["Deployment", "Service", "ConfigMap", "Role", "RoleBinding"] {
        assert!(kinds.contains(&needed), "no {needed} in {kinds:?}");
    }
}

/// The manifest document of `kind` named `name`.
fn find<'a>(docs: &'a [(String, Value)], kind: &str, name: &str) -> &'a Value {
    &docs
        .iter()
        .find(|(_, d)| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
        .1
}

#[derive(Parser)]
struct Serve {
    #[command(flatten)]
    settings: sluice_gateway::Settings,
}

#[test]
fn the_gateways_arguments_and_config_file_are_valid_settings() {
    let docs = documents();
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
        valid.health_listen.map(|a| a.port()),
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
