use super::*;

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(*k, v.parse().unwrap());
    }
    h
}

#[test]
fn the_sdk_honors_what_the_server_asks_within_a_minute() {
    let h = headers(&[("retry-after", "10")]);
    assert_eq!(sdk_wait(503, &h, 1), Some(Duration::from_secs(10)));
    let ms = headers(&[("retry-after-ms", "250"), ("retry-after", "10")]);
    assert_eq!(
        sdk_wait(529, &ms, 1),
        Some(Duration::from_millis(250)),
        "ms first"
    );
    let long = headers(&[("retry-after", "120")]);
    let own = sdk_wait(503, &long, 1).unwrap();
    assert!(
        own <= Duration::from_millis(500) && own >= Duration::from_millis(375),
        "{own:?}"
    );
}

#[test]
fn the_sdk_backs_off_on_its_own_and_retries_only_what_it_should() {
    let none = HeaderMap::new();
    let second = sdk_wait(500, &none, 2).unwrap();
    assert!(second <= Duration::from_secs(1) && second >= Duration::from_millis(750));
    assert_eq!(sdk_wait(400, &none, 1), None);
    assert_eq!(sdk_wait(404, &none, 1), None);
    assert!(
        sdk_wait(0, &none, 1).is_some(),
        "connection errors are retried"
    );
    assert!(sdk_wait(429, &none, 1).is_some());
    assert_eq!(
        sdk_wait(503, &headers(&[("x-should-retry", "false")]), 1),
        None
    );
    assert!(sdk_wait(400, &headers(&[("x-should-retry", "true")]), 1).is_some());
}

#[test]
fn bodies_carry_the_shape() {
    let prompt = crate::prompts::Prompt {
        parts: vec![crate::prompts::Part {
            role: crate::prompts::Role::User,
            seed: 9,
            tokens: 256,
        }],
        conversation: 1,
    };
    let job = Job {
        model: None,
        due: Duration::ZERO,
        tier: 0,
        prompt_tokens: 256,
        output_tokens: 32,
        prompt: prompt.clone(),
        tenant: 3,
        priority: 1,
        headers: Vec::new(),
    };
    let body: serde_json::Value =
        serde_json::from_str(&job.body(Api::Completions, "m", true)).unwrap();
    assert_eq!(body["prompt"].as_str().unwrap().len(), 1024);
    assert_eq!(body["prompt"].as_str().unwrap(), prompt.text());
    assert_eq!(body["max_tokens"], 32);
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"]["include_usage"], true);
    assert_eq!(body["user"], "tenant-3");
    let chat: serde_json::Value =
        serde_json::from_str(&job.body(Api::Chat { max_tokens: 64 }, "m", true)).unwrap();
    assert_eq!(
        chat["messages"],
        serde_json::json!([{"role": "user", "content": prompt.text()}])
    );
    assert_eq!(chat["max_tokens"], 64);
}
