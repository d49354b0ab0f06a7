//! deploy/gateway-api/ as Kubernetes and sluice read it: every manifest parses into typed
//! definitions of its API — k8s-openapi's for the core kinds, the InferencePool and
//! InferenceObjective types the picker watches with, and an HTTPRoute written here from the
//! Gateway API reference — and back with no key lost, so a misspelt field fails; the picker's
//! container arguments are settings `sluice epp` accepts, and the pieces name each other
//! consistently (the pool and its picker's Service and port, the route and the pool, the
//! objectives and the pool, the probes and the health port, the Role and what the picker reads).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/manifests.rs"]
mod manifests;

use clap::{CommandFactory, Parser};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use manifests::{documents, find, lost_in};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sluice_epp::objective::cluster::InferenceObjective;
use sluice_gateway::control::discovery::pool::{InferencePool, POOL_GROUP};

/// An HTTPRoute (`gateway.networking.k8s.io/v1`), the fields of the Gateway API reference's
/// HTTPRoute that a route to an InferencePool uses; anything else is refused.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct HttpRoute {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: HttpRouteSpec,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct HttpRouteSpec {
    parent_refs: Vec<ParentReference>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    hostnames: Vec<String>,
    rules: Vec<HttpRouteRule>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ParentReference {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    namespace: Option<String>,
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    section_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    port: Option<u16>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct HttpRouteRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    matches: Vec<HttpRouteMatch>,
    backend_refs: Vec<HttpBackendRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timeouts: Option<HttpRouteTimeouts>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct HttpRouteMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    path: Option<HttpPathMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    method: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpPathMatch {
    /// `Exact`, `PathPrefix` or `RegularExpression`.
    #[serde(rename = "type")]
    kind: String,
    value: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct HttpBackendRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kind: Option<String>,
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    weight: Option<i32>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct HttpRouteTimeouts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    request: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    backend_request: Option<String>,
}

/// The documents' key lost or changed reading `doc` as the type of its kind.
fn lost(file: &str, doc: &Value) -> Vec<String> {
    let kind = doc["kind"].as_str().unwrap_or_default();
    match kind {
        "Deployment" => lost_in::<Deployment>(doc),
        "Service" => lost_in::<Service>(doc),
        "ServiceAccount" => lost_in::<ServiceAccount>(doc),
        "Role" => lost_in::<Role>(doc),
        "RoleBinding" => lost_in::<RoleBinding>(doc),
        "InferencePool" => lost_in::<InferencePool>(doc),
        "InferenceObjective" => lost_in::<InferenceObjective>(doc),
        "HTTPRoute" => lost_in::<HttpRoute>(doc),
        other => panic!("{file}: a {other:?}, which this test does not know: add it"),
    }
    .unwrap_or_else(|e| panic!("{file}: not a valid {kind}: {e}"))
}

#[test]
fn every_manifest_survives_its_apis_types_whole() {
    let docs = documents("gateway-api");
    let mut kinds: Vec<&str> = Vec::new();
    for (file, doc) in &docs {
        let lost = lost(file, doc);
        assert!(lost.is_empty(), "{file}: {lost:#?}");
        kinds.push(doc["kind"].as_str().unwrap());
    }
    for needed in [
        "InferencePool",
        "InferenceObjective",
        "HTTPRoute",
        "Deployment",
        "Service",
        "ServiceAccount",
        "Role",
        "RoleBinding",
    ] {
        assert!(kinds.contains(&needed), "no {needed} in {kinds:?}");
    }
}

#[test]
fn a_misspelt_field_is_caught() {
    let docs = documents("gateway-api");
    let pool = find(&docs, "InferencePool", "llama");
    let mut misspelt = pool.clone();
    let ports = misspelt["spec"]
        .as_object_mut()
        .unwrap()
        .remove("targetPorts")
        .unwrap();
    misspelt["spec"]["targetPort"] = ports;
    let caught = lost_in::<InferencePool>(&misspelt);
    assert!(
        caught.as_ref().is_err() || caught.as_ref().is_ok_and(|l| !l.is_empty()),
        "{caught:?}"
    );
    let route = find(&docs, "HTTPRoute", "llm-route");
    let mut misspelt = route.clone();
    misspelt["spec"]["rules"][0]["backendRef"] = Value::Null;
    assert!(lost_in::<HttpRoute>(&misspelt).is_err());
}

#[derive(Parser)]
struct Epp {
    #[command(flatten)]
    settings: sluice_gateway::Settings,
    #[command(flatten)]
    epp: sluice_epp::EppSettings,
}

#[test]
fn the_pickers_arguments_are_valid_settings_and_the_pieces_name_each_other() {
    let docs = documents("gateway-api");
    let picker: Deployment =
        serde_json::from_value(find(&docs, "Deployment", "sluice-epp").clone()).unwrap();
    let pod = picker.spec.template.spec.unwrap();
    let container = &pod.containers[0];
    let mut args = container.args.clone().unwrap();
    assert_eq!(args.remove(0), "epp");
    let args = args
        .into_iter()
        .map(|a| a.replace("$(POD_NAMESPACE)", "llm"));
    let matches = Epp::command()
        .try_get_matches_from(std::iter::once("epp".to_string()).chain(args))
        .unwrap_or_else(|e| panic!("the container's arguments: {e}"));
    let (settings, epp): (sluice_gateway::Settings, sluice_epp::EppSettings) =
        sluice_gateway::config::load_with(&matches).unwrap();
    let config = epp
        .config(&settings)
        .unwrap_or_else(|e| panic!("the container's settings: {e}"));
    let watched = sluice_epp::pool::watched(&config).expect("the picker follows a pool");
    assert_eq!(
        watched.namespace, "llm",
        "the pool in the picker's namespace"
    );
    assert!(config.shared.is_some(), "replicas share through Redis");

    // The pool names the picker's Service and its ext_proc port, and selects the engines.
    let pool: InferencePool =
        serde_json::from_value(find(&docs, "InferencePool", &watched.name).clone()).unwrap();
    let picker_ref = pool.spec.endpoint_picker_ref.as_ref().unwrap();
    let service: Service =
        serde_json::from_value(find(&docs, "Service", &picker_ref.name).clone()).unwrap();
    let service_ports = service.spec.unwrap().ports.unwrap();
    let grpc = service_ports
        .iter()
        .find(|p| Some(p.port) == picker_ref.port.as_ref().map(|p| p.number))
        .expect("the Service has the port the pool names");
    let container_ports = container.ports.clone().unwrap();
    let target = |name: &str| {
        container_ports
            .iter()
            .find(|p| p.name.as_deref() == Some(name))
            .unwrap()
            .container_port
    };
    let by_name = match &grpc.target_port {
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(name)) => name,
        other => panic!("a named target port: {other:?}"),
    };
    assert_eq!(target(by_name), i32::from(epp.grpc_port), "--grpc-port");

    // The kubelet probes the gRPC health service, on its port, by the services it serves.
    for (probe, service) in [
        (&container.liveness_probe, "liveness"),
        (&container.readiness_probe, "readiness"),
    ] {
        let grpc = probe.as_ref().unwrap().grpc.as_ref().unwrap();
        assert_eq!(grpc.port, i32::from(epp.grpc_health_port));
        assert_eq!(grpc.service.as_deref(), Some(service));
    }

    // The route goes to the pool; the objectives name it.
    let route: HttpRoute =
        serde_json::from_value(find(&docs, "HTTPRoute", "llm-route").clone()).unwrap();
    let backend = &route.spec.rules[0].backend_refs[0];
    assert_eq!(
        (
            backend.group.as_deref(),
            backend.kind.as_deref(),
            backend.name.as_str()
        ),
        (
            Some(POOL_GROUP),
            Some("InferencePool"),
            watched.name.as_str()
        )
    );
    let objectives: Vec<InferenceObjective> = docs
        .iter()
        .filter(|(_, d)| d["kind"] == "InferenceObjective")
        .map(|(_, d)| serde_json::from_value(d.clone()).unwrap())
        .collect();
    assert!(!objectives.is_empty());
    for objective in &objectives {
        assert!(
            objective.spec.pool_ref.names(&watched.name),
            "{:?}",
            objective.metadata.name
        );
    }

    // The picker runs as the ServiceAccount the Role is bound to, and may read what it follows.
    assert_eq!(pod.service_account_name.as_deref(), Some("sluice-epp"));
    let binding: RoleBinding =
        serde_json::from_value(find(&docs, "RoleBinding", "sluice-epp").clone()).unwrap();
    assert_eq!(binding.subjects.unwrap()[0].name, "sluice-epp");
    let role: Role =
        serde_json::from_value(find(&docs, "Role", &binding.role_ref.name).clone()).unwrap();
    let rules = role.rules.unwrap();
    for (group, resource) in [
        ("", "pods"),
        (POOL_GROUP, "inferencepools"),
        ("inference.networking.x-k8s.io", "inferenceobjectives"),
    ] {
        let rule = rules
            .iter()
            .find(|r| {
                r.api_groups.as_deref() == Some(&[group.to_string()][..])
                    && r.resources.as_deref() == Some(&[resource.to_string()][..])
            })
            .unwrap_or_else(|| panic!("no rule for {resource}"));
        for verb in ["get", "list", "watch"] {
            assert!(rule.verbs.contains(&verb.to_string()), "{verb} {resource}");
        }
    }
}
