use super::*;

fn parse(route: Route, body: &str) -> Result<GenerationRequest, RequestError> {
    GenerationRequest::parse(route, body.as_bytes())
}

#[test]
fn token_ids_are_counted_exactly_and_text_by_four_bytes() {
    let ids = parse(Route::Completions, r#"{"model":"m","prompt":[1,2,3,4,5]}"#).unwrap();
    assert_eq!(ids.prompts[0].tokens, 5);
    let text = parse(Route::Completions, r#"{"model":"m","prompt":"abcdefghi"}"#).unwrap();
    assert_eq!(text.prompts[0].tokens, 3);
    let batch = parse(Route::Completions, r#"{"model":"m","prompt":[[1,2],[3]]}"#).unwrap();
    assert_eq!(
        batch.prompts.iter().map(|p| p.tokens).collect::<Vec<_>>(),
        vec![2, 1]
    );
}

#[test]
fn chat_prompts_count_content_and_template() {
    let req = parse(
        Route::Chat,
        r#"{"model":"m","messages":[{"role":"user","content":"12345678"}],"stream":true,
            "stream_options":{"include_usage":true},"max_completion_tokens":7}"#,
    )
    .unwrap();
    // "user" + 8 bytes = 12 bytes = 3 tokens, + 4 per message + 3 to prime the reply.
    assert_eq!(req.prompts[0].tokens, 10);
    assert!(req.stream && req.include_usage);
    assert_eq!(req.max_tokens, Some(7));
}

#[test]
fn bad_bodies_say_what_is_wrong() {
    assert!(matches!(
        parse(Route::Chat, "{"),
        Err(RequestError::Malformed(_))
    ));
    assert!(matches!(
        parse(Route::Chat, r#"{"messages":[]}"#),
        Err(RequestError::Malformed(_))
    ));
    assert_eq!(
        parse(Route::Chat, r#"{"model":"m","messages":[]}"#),
        Err(RequestError::Invalid {
            field: "messages",
            rule: "a non-empty list"
        })
    );
    assert_eq!(
        parse(Route::Completions, r#"{"model":"m"}"#),
        Err(RequestError::Invalid {
            field: "prompt",
            rule: "present"
        })
    );
}

#[test]
fn answer_lengths_are_reproducible_and_capped_by_max_tokens() {
    let req = parse(
        Route::Completions,
        r#"{"model":"m","prompt":"hello","n":3}"#,
    )
    .unwrap();
    let a = req.choices(7, 200.0, 8192);
    assert_eq!(a.len(), 3);
    let lengths = |v: &[SeqSpec]| v.iter().map(|s| s.output_tokens).collect::<Vec<_>>();
    assert_eq!(lengths(&a), lengths(&req.choices(7, 200.0, 8192)));
    assert_ne!(
        lengths(&a),
        lengths(&req.choices(8, 200.0, 8192)),
        "the seed matters"
    );

    let capped = parse(
        Route::Completions,
        r#"{"model":"m","prompt":"hello","max_tokens":1}"#,
    )
    .unwrap()
    .choices(7, 200.0, 8192);
    assert_eq!(
        (capped[0].output_tokens, capped[0].finish),
        (1, FinishReason::Length)
    );

    let exact = parse(
        Route::Completions,
        r#"{"model":"m","prompt":"hello","max_tokens":33,"ignore_eos":true}"#,
    )
    .unwrap()
    .choices(7, 200.0, 8192);
    assert_eq!(exact[0].output_tokens, 33);
}

#[test]
fn a_reasoning_model_thinks_first_unless_told_not_to_and_within_max_tokens() {
    let chat = |extra: &str| {
        parse(
            Route::Chat,
            &format!(r#"{{"model":"m","messages":[{{"role":"user","content":"why?"}}]{extra}}}"#),
        )
        .unwrap()
    };
    let thought = |req: &GenerationRequest| req.choices_thinking(7, 50.0, Some(400), 8192);
    let (specs, thinking) = thought(&chat(""));
    assert!(
        thinking[0] > 0 && specs[0].output_tokens > thinking[0],
        "thinks, then answers"
    );
    let (_, none) = chat("").choices_thinking(7, 50.0, None, 8192);
    assert_eq!(none, [0], "not a reasoning model");
    let off = thought(&chat(
        r#","chat_template_kwargs":{"enable_thinking":false}"#,
    ));
    assert_eq!(off.1, [0], "switched off");
    assert!(off.0[0].output_tokens < specs[0].output_tokens);
    let (_, capped) = thought(&chat(r#","thinking_token_budget":5"#));
    assert_eq!(capped, [thinking[0].min(5)]);
    let (tight, cut) = thought(&chat(r#","max_tokens":3"#));
    assert_eq!(tight[0].output_tokens, 3, "thinking counts in max_tokens");
    assert_eq!(cut, [3.min(thinking[0])]);
    let (_, completion) = parse(Route::Completions, r#"{"model":"m","prompt":"why?"}"#)
        .unwrap()
        .choices_thinking(7, 50.0, Some(400), 8192);
    assert_eq!(completion, [0], "completions do not think");
}
