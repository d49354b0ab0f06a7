//! The rest of the surface vLLM, SGLang and SMG users call: routed by model and passed through
//! byte for byte; model cards one by one; SMG's name for the load view.
#![allow(clippy::unwrap_used)]

mod common;

use axum::routing;
use axum::Router;
use bytes::Bytes;
use common::*;

/// An engine that answers every passed-through path with what it received.
async fn echo_engine() -> String {
    let echo = |path: &'static str| {
        routing::post(move |body: Bytes| async move {
            axum::Json(serde_json::json!({"path": path, "body": String::from_utf8_lossy(&body)}))
        })
    };
    let mut app = Router::new().route(
        "/v1/models",
        routing::get(|| async {
            axum::Json(
                serde_json::json!({"data":[{"id":"fake","owned_by":"vllm","max_model_len":77}]}),
            )
        }),
    );
    for path in [
        "/v1/responses",
        "/v1/rerank",
        "/v1/score",
        "/tokenize",
        "/detokenize",
        "/generate",
        "/v1/audio/transcriptions",
        "/v1/audio/speech",
    ] {
        app = app.route(path, echo(path));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

async fn over_echo() -> (Gateway, HttpClient) {
    let gateway = Gateway::start(Config::local(&[echo_engine().await]))
        .await
        .unwrap();
    let c = client();
    until_workers(&gateway, &c, "ready", all_ready).await;
    (gateway, c)
}

#[tokio::test]
async fn the_other_engine_routes_are_routed_by_model_and_passed_through() {
    let (gateway, c) = over_echo().await;
    let cases = [
        (
            "/v1/responses",
            r#"{"model":"fake","input":"hi","x":[1, 2]}"#,
        ),
        (
            "/v1/rerank",
            r#"{"model":"fake","query":"q","documents":["a","b"]}"#,
        ),
        ("/v1/score", r#"{"model":"fake","text_1":"a","text_2":"b"}"#),
        ("/tokenize", r#"{"model":"fake","prompt":"hello"}"#),
        ("/detokenize", r#"{"model":"fake","tokens":[1,2,3]}"#),
        (
            "/generate",
            r#"{"text":"hi","sampling_params":{"max_new_tokens":4}}"#,
        ),
    ];
    for (path, body) in cases {
        let a = post(&c, &format!("{}{path}", gateway.url()), body).await;
        assert_eq!(a.status, 200, "{path}: {}", a.text());
        let echo = a.json();
        assert_eq!(echo["path"], path);
        assert_eq!(
            echo["body"], body,
            "{path}: byte for byte, no model added to /generate"
        );
    }
    let a = post(
        &c,
        &format!("{}/v1/responses", gateway.url()),
        r#"{"input":"hi"}"#,
    )
    .await;
    assert_eq!(
        a.json()["body"],
        r#"{"model":"fake","input":"hi"}"#,
        "the only model served, named for the worker"
    );
    let a = post(
        &c,
        &format!("{}/v1/rerank", gateway.url()),
        r#"{"model":"nope","query":"q","documents":[]}"#,
    )
    .await;
    assert_eq!(a.status, 404);
    assert_eq!(code(&a).as_deref(), Some("model_not_found"));
}

#[tokio::test]
async fn one_model_card_and_the_smg_name_of_the_load_view() {
    let (gateway, c) = over_echo().await;
    let card = get(&c, &format!("{}/v1/models/fake", gateway.url())).await;
    assert_eq!(card.status, 200);
    assert_eq!(card.json()["max_model_len"], 77, "the worker's own card");
    let missing = get(&c, &format!("{}/v1/models/nope", gateway.url())).await;
    assert_eq!(missing.status, 404);
    assert_eq!(code(&missing).as_deref(), Some("model_not_found"));
    let loads = get(&c, &format!("{}/get_loads", gateway.url())).await;
    assert_eq!(loads.status, 200);
    assert_eq!(loads.json()["aggregate"]["workers"], 1);
}

/// A transcription upload: a file part and, when given, a `model` part.
fn upload(model: Option<&str>) -> String {
    let mut form = String::from(
        "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\
         Content-Type: audio/wav\r\n\r\nRIFF-not-really-audio\r\n",
    );
    if let Some(model) = model {
        form.push_str(&format!(
            "--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n{model}\r\n"
        ));
    }
    form.push_str("--XyZ--\r\n");
    form
}

#[tokio::test]
async fn audio_uploads_are_routed_by_their_form_model_and_passed_through() {
    let (gateway, c) = over_echo().await;
    let url = format!("{}/v1/audio/transcriptions", gateway.url());
    let form = [("content-type", "multipart/form-data; boundary=XyZ")];
    for model in [Some("fake"), None] {
        let body = upload(model);
        let a = send(&c, "POST", &url, Some(&body), &form).await;
        assert_eq!(a.status, 200, "{model:?}: {}", a.text());
        assert_eq!(a.json()["body"], body.as_str(), "byte for byte");
    }
    let a = send(&c, "POST", &url, Some(&upload(Some("nope"))), &form).await;
    assert_eq!(a.status, 404);
    assert_eq!(code(&a).as_deref(), Some("model_not_found"));
    let json = [("content-type", "application/json")];
    let a = send(&c, "POST", &url, Some("{}"), &json).await;
    assert_eq!(a.status, 415, "an upload is a form");
    let broken = send(&c, "POST", &url, Some("--XyZ\r\nno end"), &form).await;
    assert_eq!(broken.status, 400);
    assert_eq!(code(&broken).as_deref(), Some("invalid_form"));

    let speech = post(
        &c,
        &format!("{}/v1/audio/speech", gateway.url()),
        r#"{"model":"fake","input":"hello","voice":"alloy"}"#,
    )
    .await;
    assert_eq!(speech.status, 200, "{}", speech.text());
}
