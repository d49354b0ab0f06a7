//! The simulated engine's gRPC service (`--grpc`), black-box: a client made from the protocol's
//! definitions against a real fleet on loopback.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sluice_proto::common::kv_cache_event::Data;
use sluice_proto::common::{KvEventBatch, SubscribeKvEventsRequest};
use sluice_proto::sglang_scheduler::generate_complete::MatchedStop;
use sluice_proto::sglang_scheduler::generate_response::Response as Reply;
use sluice_proto::sglang_scheduler::sglang_scheduler_client::SglangSchedulerClient;
use sluice_proto::sglang_scheduler::*;
use sluice_sim::testkit::{instant, timed};
use sluice_sim::vocab::Vocab;
use sluice_sim::{EngineConfig, Fault, Flavor, FleetConfig, GrpcConfig, PdRole, SimFleet};
use tonic::transport::Channel;
use tonic::Code;

async fn grpc_fleet(mut cfg: EngineConfig) -> (SimFleet, SglangSchedulerClient<Channel>) {
    cfg.grpc = Some(cfg.grpc.unwrap_or_default());
    let fleet = SimFleet::start(FleetConfig::local(1, cfg)).await.unwrap();
    let url = fleet.urls()[0].replace("grpc://", "http://");
    let client = SglangSchedulerClient::connect(url).await.unwrap();
    (fleet, client)
}

fn request(id: &str, ids: Vec<u32>, max_new_tokens: Option<u32>, stream: bool) -> GenerateRequest {
    GenerateRequest {
        request_id: id.into(),
        tokenized: Some(TokenizedInput {
            original_text: String::new(),
            input_ids: ids,
        }),
        sampling_params: Some(SamplingParams {
            max_new_tokens,
            n: 1,
            ..Default::default()
        }),
        stream,
        ..Default::default()
    }
}

/// Every message of a generation, or the status it ended with.
async fn collect(
    client: &mut SglangSchedulerClient<Channel>,
    request: GenerateRequest,
) -> Result<Vec<Reply>, tonic::Status> {
    let mut stream = client.generate(request).await?.into_inner();
    let mut out = Vec::new();
    while let Some(message) = stream.message().await? {
        out.push(
            message
                .response
                .expect("every message carries a chunk or a completion"),
        );
    }
    Ok(out)
}

#[tokio::test]
async fn a_streamed_generation_sends_its_tokens_then_completes_on_the_end_of_turn() {
    let (_fleet, mut client) = grpc_fleet(instant(Flavor::Sglang)).await;
    let vocab = Vocab::new();
    let replies = collect(&mut client, request("r1", vec![5, 6, 7], Some(4096), true))
        .await
        .unwrap();
    let (chunks, completes): (Vec<_>, Vec<_>) =
        replies.iter().partition(|r| matches!(r, Reply::Chunk(_)));
    assert_eq!(completes.len(), 1, "one completion: {replies:?}");
    assert!(matches!(replies.last(), Some(Reply::Complete(_))));
    let ids: Vec<u32> = chunks
        .iter()
        .flat_map(|r| match r {
            Reply::Chunk(c) => c.token_ids.clone(),
            Reply::Complete(_) => vec![],
        })
        .collect();
    let Some(Reply::Complete(complete)) = completes.first() else {
        unreachable!()
    };
    assert_eq!(complete.prompt_tokens, 3);
    assert_eq!(complete.completion_tokens as usize, ids.len());
    assert_eq!(complete.finish_reason, "stop");
    assert_eq!(
        complete.matched_stop,
        Some(MatchedStop::MatchedTokenId(vocab.eos()))
    );
    assert_eq!(
        ids.last(),
        Some(&vocab.eos()),
        "a stop ends on the end of turn"
    );
    for (i, id) in ids[..ids.len() - 1].iter().enumerate() {
        assert_eq!(*id, vocab.answer_token(0, i as u32), "token {i}");
    }
    if let Some(Reply::Chunk(last)) = chunks.last() {
        assert_eq!(last.completion_tokens as usize, ids.len(), "running counts");
    }
}

#[tokio::test]
async fn a_whole_generation_is_one_completion_per_choice_and_max_new_tokens_cuts_it() {
    let (_fleet, mut client) = grpc_fleet(instant(Flavor::Sglang)).await;
    let mut asked = request("r2", vec![1; 10], Some(1), false);
    asked.sampling_params.as_mut().unwrap().n = 2;
    let replies = collect(&mut client, asked).await.unwrap();
    assert_eq!(replies.len(), 2, "{replies:?}");
    let mut indexes = Vec::new();
    for reply in replies {
        let Reply::Complete(c) = reply else {
            panic!("a whole answer sends no chunks")
        };
        assert_eq!(
            (c.finish_reason.as_str(), c.completion_tokens),
            ("length", 1)
        );
        assert_eq!(c.output_ids.len(), 1);
        indexes.push(c.index);
    }
    indexes.sort_unstable();
    assert_eq!(indexes, [0, 1]);
}

#[tokio::test]
async fn refusals_are_the_statuses_sglangs_servicer_maps_them_to() {
    let mut cfg = timed(Flavor::Sglang, 1.0);
    cfg.max_model_len = 64;
    cfg.max_num_seqs = 1;
    cfg.max_queued_requests = Some(0);
    let (_fleet, mut client) = grpc_fleet(cfg).await;
    let empty = collect(&mut client, request("e", vec![], None, true)).await;
    assert_eq!(empty.unwrap_err().code(), Code::InvalidArgument);
    let long = collect(&mut client, request("l", vec![1; 64], None, true)).await;
    let long = long.unwrap_err();
    assert_eq!(long.code(), Code::InvalidArgument);
    assert!(
        long.message().contains("context length (64 tokens)"),
        "{long:?}"
    );
    let full = collect(&mut client, request("q", vec![1; 8], None, true)).await;
    let full = full.unwrap_err();
    assert_eq!(
        full.code(),
        Code::Unavailable,
        "a full queue is SGLang's 503"
    );
    assert_eq!(full.message(), "The request queue is full.");
}

#[tokio::test]
async fn abort_ends_a_live_generation_and_an_unknown_id_is_not_found() {
    let (fleet, mut client) = grpc_fleet(timed(Flavor::Sglang, 1.0)).await;
    let unknown = client
        .abort(AbortRequest {
            request_id: "nobody".into(),
            reason: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!unknown.success);
    assert_eq!(unknown.message, "Request nobody not found");

    let mut asked = request("long", vec![1; 8], Some(100_000), true);
    asked.sampling_params.as_mut().unwrap().ignore_eos = true;
    let mut stream = client.generate(asked).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert!(matches!(first.response, Some(Reply::Chunk(_))));
    let aborted = client
        .abort(AbortRequest {
            request_id: "long".into(),
            reason: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(aborted.success, "{aborted:?}");
    let mut last = None;
    while let Some(message) = stream.message().await.unwrap() {
        last = message.response;
    }
    let Some(Reply::Complete(complete)) = last else {
        panic!("an aborted generation completes: {last:?}")
    };
    assert_eq!(complete.finish_reason, "abort");
    let engine = fleet.engine(0).unwrap();
    let state = engine.until(|s| s.running == 0 && s.waiting == 0).await;
    assert_eq!(state.aborted, 1, "the engine dropped the request");
}

#[tokio::test]
async fn dropping_the_call_aborts_the_request_in_the_engine() {
    let (fleet, mut client) = grpc_fleet(timed(Flavor::Sglang, 1.0)).await;
    let mut asked = request("left", vec![1; 8], Some(100_000), true);
    asked.sampling_params.as_mut().unwrap().ignore_eos = true;
    let mut stream = client.generate(asked).await.unwrap().into_inner();
    stream.message().await.unwrap().unwrap();
    drop(stream);
    let state = fleet.engine(0).unwrap().until(|s| s.aborted == 1).await;
    assert_eq!(state.running, 0);
}

#[tokio::test]
async fn health_passes_while_the_engine_produces_and_fails_when_it_is_frozen() {
    // 20 engine-seconds of probe at 100x pass in 0.2 s.
    let (fleet, mut client) = grpc_fleet(timed(Flavor::Sglang, 100.0)).await;
    let healthy = client
        .health_check(HealthCheckRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(healthy.healthy, "{healthy:?}");
    fleet.engine(0).unwrap().fault(Fault::Pause).await.unwrap();
    let frozen = client
        .health_check(HealthCheckRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(!frozen.healthy);
    assert_eq!(frozen.message, "Health check timeout after 20s");
}

#[tokio::test]
async fn a_one_way_link_answers_nothing_while_it_stands() {
    let (fleet, mut client) = grpc_fleet(instant(Flavor::Sglang)).await;
    fleet.engine(0).unwrap().fault(Fault::OneWay).await.unwrap();
    // A client-side bound: a grpc-timeout header would have the server answer the deadline.
    let probe = client.health_check(HealthCheckRequest {});
    let unanswered = tokio::time::timeout(Duration::from_millis(300), probe).await;
    assert!(
        unanswered.is_err(),
        "answered through a one-way link: {unanswered:?}"
    );
    let received = fleet.engine(0).unwrap().state().requests_received;
    let waiting = tokio::spawn({
        let mut client = client.clone();
        async move { collect(&mut client, request("held", vec![1; 4], Some(3), true)).await }
    });
    fleet
        .engine(0)
        .unwrap()
        .until(|s| s.requests_received > received)
        .await;
    fleet.engine(0).unwrap().fault(Fault::Clear).await.unwrap();
    let replies = waiting.await.unwrap().unwrap();
    assert!(
        matches!(replies.last(), Some(Reply::Complete(_))),
        "what the link held arrives once it carries again: {replies:?}"
    );
}

#[tokio::test]
async fn get_loads_and_model_info_describe_the_engine() {
    let (_fleet, mut client) = grpc_fleet(instant(Flavor::Sglang)).await;
    let loads = client
        .get_loads(GetLoadsRequest {
            dp_rank: None,
            include: vec!["all".into()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(loads.dp_rank_count, 1);
    assert_eq!(loads.loads.len(), 1);
    assert!(loads.loads[0].queues.is_some(), "asked for every section");
    assert!(loads.loads[0].max_total_num_tokens > 0);
    let wrong = client
        .get_loads(GetLoadsRequest {
            dp_rank: Some(3),
            include: vec![],
        })
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), Code::InvalidArgument);
    let info = client
        .get_model_info(GetModelInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let vocab = Vocab::new();
    assert_eq!(info.served_model_name, "test-model");
    assert_eq!(info.vocab_size as u32, vocab.size());
    assert_eq!(info.eos_token_ids, [vocab.eos() as i32]);
}

async fn next_batch(stream: &mut tonic::Streaming<KvEventBatch>) -> KvEventBatch {
    stream
        .message()
        .await
        .unwrap()
        .expect("the stream stays open")
}

#[tokio::test]
async fn the_event_stream_carries_the_cache_events_with_a_load_record_then_heartbeats() {
    let mut cfg = instant(Flavor::Sglang);
    cfg.block_size = 4;
    let (_fleet, mut client) = grpc_fleet(cfg).await;
    let mut events = client
        .subscribe_kv_events(SubscribeKvEventsRequest::default())
        .await
        .unwrap()
        .into_inner();
    collect(&mut client, request("a", (0..12).collect(), Some(2), true))
        .await
        .unwrap();
    let first = next_batch(&mut events).await;
    assert_eq!((first.sequence_number, first.dp_rank), (1, Some(0)));
    let stored = first
        .events
        .iter()
        .filter(|e| matches!(e.data, Some(Data::Stored(_))))
        .count();
    assert_eq!(stored, 3, "three full blocks of four prompt tokens");
    let record = first.load.expect("a load record on every batch");
    assert_eq!((record.sample, record.load_only), (1, false));
    assert!(
        record.max_total_num_tokens.is_some(),
        "the first record is whole"
    );
    // The engine is idle now: the next message is a heartbeat repeating the sequence.
    let beat = next_batch(&mut events).await;
    assert_eq!(beat.sequence_number, 1);
    assert!(beat.events.is_empty());
    let record = beat.load.unwrap();
    assert!(record.load_only);
    assert_eq!(record.sample, 2);
}

#[tokio::test]
async fn a_stopped_event_stream_sends_nothing_until_the_fault_clears() {
    let mut cfg = instant(Flavor::Sglang);
    cfg.block_size = 4;
    cfg.grpc = Some(GrpcConfig {
        load_records: false,
        ..GrpcConfig::default()
    });
    let (fleet, mut client) = grpc_fleet(cfg).await;
    let mut events = client
        .subscribe_kv_events(SubscribeKvEventsRequest::default())
        .await
        .unwrap()
        .into_inner();
    fleet
        .engine(0)
        .unwrap()
        .fault(Fault::EventsStop)
        .await
        .unwrap();
    collect(&mut client, request("a", (0..8).collect(), Some(2), true))
        .await
        .unwrap();
    fleet.engine(0).unwrap().fault(Fault::Clear).await.unwrap();
    collect(
        &mut client,
        request("b", (100..108).collect(), Some(2), true),
    )
    .await
    .unwrap();
    let batch = next_batch(&mut events).await;
    assert_eq!(
        batch.sequence_number, 2,
        "batch 1 was dropped while the stream was stopped"
    );
    assert!(batch.load.is_none(), "an older servicer attaches no record");
}

#[tokio::test]
async fn without_kv_events_the_stream_is_unimplemented_and_a_cursor_is_refused() {
    let mut cfg = instant(Flavor::Sglang);
    cfg.grpc = Some(GrpcConfig {
        kv_events: false,
        ..GrpcConfig::default()
    });
    let (_fleet, mut client) = grpc_fleet(cfg).await;
    let off = client
        .subscribe_kv_events(SubscribeKvEventsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(off.code(), Code::Unimplemented);

    let (_fleet, mut client) = grpc_fleet(instant(Flavor::Sglang)).await;
    let cursor = client
        .subscribe_kv_events(SubscribeKvEventsRequest {
            start_sequence_number: 5,
            load_records_before_first_batch: false,
        })
        .await
        .unwrap_err();
    assert_eq!(cursor.code(), Code::OutOfRange);
}

#[test]
fn grpc_needs_sglangs_flavor() {
    let mut cfg = instant(Flavor::Vllm);
    cfg.grpc = Some(GrpcConfig::default());
    assert_eq!(
        cfg.validate(),
        Err(sluice_sim::config::ConfigError::GrpcFlavor)
    );
}

/// A gRPC prefill engine (engine 0) and a gRPC decode engine (engine 1), and a client of each.
async fn grpc_pair() -> (
    SimFleet,
    SglangSchedulerClient<Channel>,
    SglangSchedulerClient<Channel>,
) {
    let mut prefill = instant(Flavor::Sglang);
    prefill.grpc = Some(GrpcConfig::default());
    prefill.pd_role = Some(PdRole::Prefill);
    let mut decode = prefill.clone();
    decode.pd_role = Some(PdRole::Decode);
    let fleet = SimFleet::start(FleetConfig::local(1, prefill).also(1, decode))
        .await
        .unwrap();
    let connect = |i: usize| {
        let url = fleet.urls()[i].replace("grpc://", "http://");
        SglangSchedulerClient::connect(url)
    };
    let (p, d) = (connect(0).await.unwrap(), connect(1).await.unwrap());
    (fleet, p, d)
}

/// A request of `tokens` answer tokens whose halves meet in `room` at the prefill engine (a
/// prompt of 1,000 tokens, its own for each room).
fn disaggregated(fleet: &SimFleet, room: i32, tokens: u32, stream: bool) -> GenerateRequest {
    let bootstrap = fleet.engine(0).unwrap().bootstrap_addr().unwrap();
    let prompt = vec![room as u32 + 3; 1000];
    let mut asked = request("pd", prompt, Some(tokens), stream);
    asked.sampling_params.as_mut().unwrap().ignore_eos = true;
    asked.disaggregated_params = Some(DisaggregatedParams {
        bootstrap_host: bootstrap.ip().to_string(),
        bootstrap_port: i32::from(bootstrap.port()),
        bootstrap_room: room,
    });
    asked
}

fn completes(replies: &[Reply]) -> Vec<&GenerateComplete> {
    replies
        .iter()
        .filter_map(|r| match r {
            Reply::Complete(c) => Some(c),
            Reply::Chunk(_) => None,
        })
        .collect()
}

#[tokio::test]
async fn over_grpc_the_halves_meet_in_the_room_their_disaggregated_params_name() {
    let (fleet, mut prefill, mut decode) = grpc_pair().await;
    for (room, stream) in [(0, false), (7, true)] {
        let asked = disaggregated(&fleet, room, 20, stream);
        let (p, d) = tokio::join!(
            collect(&mut prefill, asked.clone()),
            collect(&mut decode, asked)
        );
        let (p, d) = (p.unwrap(), d.unwrap());
        let (p, d) = (completes(&p), completes(&d));
        assert_eq!(
            (p[0].finish_reason.as_str(), p[0].completion_tokens),
            ("length", 1),
            "the prefill answers its first token once the KV is across"
        );
        assert_eq!(
            (d[0].finish_reason.as_str(), d[0].completion_tokens),
            ("length", 20)
        );
    }
    let (p, d) = (
        fleet.engine(0).unwrap().state(),
        fleet.engine(1).unwrap().state(),
    );
    assert_eq!((p.transfer_failures, d.transfer_failures), (0, 0));
    assert_eq!(
        p.prompt_tokens_computed, 2000,
        "the prefill computes both prompts"
    );
    assert_eq!(
        d.prompt_tokens_computed, 2,
        "the decode engine only their last tokens"
    );

    let info = decode
        .get_server_info(GetServerInfoRequest {})
        .await
        .unwrap();
    let args = info.into_inner().server_args.unwrap().fields;
    assert_eq!(
        args["disaggregation_mode"].kind,
        Some(prost_types::value::Kind::StringValue("decode".into()))
    );
    let info = prefill
        .get_server_info(GetServerInfoRequest {})
        .await
        .unwrap();
    let args = info.into_inner().server_args.unwrap().fields;
    let port = fleet.engine(0).unwrap().bootstrap_addr().unwrap().port();
    assert_eq!(
        args["disaggregation_bootstrap_port"].kind,
        Some(prost_types::value::Kind::NumberValue(f64::from(port)))
    );

    let mut bare = request("bare", vec![3; 10], Some(4), false);
    for client in [&mut prefill, &mut decode] {
        bare.request_id.push('x');
        let refused = collect(client, bare.clone()).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert!(refused.message().contains("disaggregated_params"));
    }
}

#[tokio::test]
async fn abort_ends_a_decode_half_still_waiting_for_its_prefill() {
    let (fleet, _prefill, mut decode) = grpc_pair().await;
    // No prefill half comes: the decode half waits in its claim.
    let asked = disaggregated(&fleet, 3, 20, false);
    let waiting = tokio::spawn({
        let mut decode = decode.clone();
        async move { collect(&mut decode, asked).await }
    });
    let aborted = loop {
        let answer = decode
            .abort(AbortRequest {
                request_id: "pd".into(),
                reason: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        if answer.success {
            break answer;
        }
        tokio::task::yield_now().await;
    };
    assert_eq!(aborted.message, "Request pd aborted");
    let replies = waiting.await.unwrap().unwrap();
    assert_eq!(completes(&replies)[0].finish_reason, "abort");
}

#[tokio::test]
async fn a_generation_names_its_adapter_in_lora_id_and_get_loads_shows_the_slots() {
    let mut cfg = instant(Flavor::Sglang);
    cfg.lora = Some(sluice_sim::lora::LoraSettings {
        max_loras: Some(4),
        max_cpu_loras: None,
        modules: vec![sluice_sim::lora::AdapterModule {
            name: "sql".into(),
            path: "/adapters/sql".into(),
        }],
        load_from_cpu: Duration::ZERO,
        load_from_disk: Duration::ZERO,
        runtime_updates: true,
    });
    let (_fleet, mut client) = grpc_fleet(cfg).await;
    let mut named = request("l1", vec![5, 6, 7], Some(3), false);
    named.lora_id = "sql".into();
    assert!(collect(&mut client, named).await.is_ok());
    let mut unknown = request("l2", vec![5, 6, 7], Some(3), false);
    unknown.lora_id = "med".into();
    let refused = collect(&mut client, unknown).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused.message().contains("not loaded: med"),
        "{}",
        refused.message()
    );
    let loads = client
        .get_loads(GetLoadsRequest {
            dp_rank: None,
            include: vec!["lora".into()],
        })
        .await
        .unwrap()
        .into_inner();
    let lora = loads.loads[0].lora.as_ref().expect("the lora section");
    assert_eq!((lora.slots_used, lora.slots_total), (0, 4));
}
