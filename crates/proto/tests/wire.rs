//! The generated code speaks the protocol: a client and a server made from the definitions talk
//! over loopback, and the fields whose numbers matter most encode where smg-grpc-proto 0.4.28
//! puts them.

#![allow(clippy::unwrap_used)]

use futures_util::stream::{self, BoxStream, StreamExt};
use prost::Message;
use sluice_proto::common::{self, EngineLoad, KvEventBatch};
use sluice_proto::sglang_scheduler::generate_response::Response;
use sluice_proto::sglang_scheduler::sglang_scheduler_client::SglangSchedulerClient;
use sluice_proto::sglang_scheduler::sglang_scheduler_server::{
    SglangScheduler, SglangSchedulerServer,
};
use sluice_proto::sglang_scheduler::*;
use tonic::{Request, Response as Answer, Status};

/// An engine that streams the prompt's tokens back, one chunk each, then completes.
struct Echo;

#[tonic::async_trait]
impl SglangScheduler for Echo {
    type GenerateStream = BoxStream<'static, Result<GenerateResponse, Status>>;
    type GetTokenizerStream = BoxStream<'static, Result<common::GetTokenizerChunk, Status>>;
    type SubscribeKvEventsStream = BoxStream<'static, Result<KvEventBatch, Status>>;

    async fn generate(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Answer<Self::GenerateStream>, Status> {
        let request = request.into_inner();
        let ids = request.tokenized.unwrap_or_default().input_ids;
        let id = request.request_id;
        let count = ids.len() as u32;
        let chunks = ids.into_iter().enumerate().map({
            let id = id.clone();
            move |(i, token)| {
                Ok(GenerateResponse {
                    request_id: id.clone(),
                    response: Some(Response::Chunk(GenerateStreamChunk {
                        token_ids: vec![token],
                        completion_tokens: i as u32 + 1,
                        ..Default::default()
                    })),
                })
            }
        });
        let complete = Ok(GenerateResponse {
            request_id: id,
            response: Some(Response::Complete(GenerateComplete {
                finish_reason: "stop".into(),
                completion_tokens: count,
                ..Default::default()
            })),
        });
        Ok(Answer::new(
            stream::iter(chunks.chain(std::iter::once(complete))).boxed(),
        ))
    }

    async fn health_check(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> Result<Answer<HealthCheckResponse>, Status> {
        Ok(Answer::new(HealthCheckResponse {
            healthy: true,
            message: "ok".into(),
        }))
    }

    async fn abort(&self, _: Request<AbortRequest>) -> Result<Answer<AbortResponse>, Status> {
        Err(Status::unimplemented("abort"))
    }

    async fn get_model_info(
        &self,
        _: Request<GetModelInfoRequest>,
    ) -> Result<Answer<GetModelInfoResponse>, Status> {
        Err(Status::unimplemented("get_model_info"))
    }

    async fn get_server_info(
        &self,
        _: Request<GetServerInfoRequest>,
    ) -> Result<Answer<GetServerInfoResponse>, Status> {
        Err(Status::unimplemented("get_server_info"))
    }

    async fn get_loads(
        &self,
        _: Request<GetLoadsRequest>,
    ) -> Result<Answer<GetLoadsResponse>, Status> {
        Err(Status::unimplemented("get_loads"))
    }

    async fn get_tokenizer(
        &self,
        _: Request<common::GetTokenizerRequest>,
    ) -> Result<Answer<Self::GetTokenizerStream>, Status> {
        Err(Status::unimplemented("get_tokenizer"))
    }

    async fn subscribe_kv_events(
        &self,
        _: Request<common::SubscribeKvEventsRequest>,
    ) -> Result<Answer<Self::SubscribeKvEventsStream>, Status> {
        Err(Status::unimplemented("subscribe_kv_events"))
    }
}

#[tokio::test]
async fn a_client_and_a_server_from_the_definitions_generate_over_loopback() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopping) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(SglangSchedulerServer::new(Echo))
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener),
                async {
                    stopping.await.ok();
                },
            ),
    );
    let mut client = SglangSchedulerClient::connect(format!("http://{addr}"))
        .await
        .unwrap();

    let health = client
        .health_check(HealthCheckRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(health.healthy);

    let mut answers = client
        .generate(GenerateRequest {
            request_id: "r1".into(),
            tokenized: Some(TokenizedInput {
                original_text: String::new(),
                input_ids: vec![7, 8, 9],
            }),
            stream: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut tokens = Vec::new();
    let mut finish = None;
    while let Some(answer) = answers.message().await.unwrap() {
        assert_eq!(answer.request_id, "r1");
        match answer.response.unwrap() {
            Response::Chunk(chunk) => tokens.extend(chunk.token_ids),
            Response::Complete(done) => finish = Some((done.finish_reason, done.completion_tokens)),
        }
    }
    assert_eq!(tokens, [7, 8, 9]);
    assert_eq!(finish, Some(("stop".to_string(), 3)));

    let refused = client.abort(AbortRequest::default()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unimplemented);

    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

#[test]
fn the_fields_sluice_relies_on_encode_at_their_numbers() {
    // request_id = 1 (bytes), data_parallel_rank = 16 (varint, present even at 0),
    // stream = 17 (varint).
    let request = GenerateRequest {
        request_id: "r".into(),
        data_parallel_rank: Some(0),
        stream: true,
        ..Default::default()
    };
    assert_eq!(
        request.encode_to_vec(),
        [0x0a, 0x01, b'r', 0x80, 0x01, 0x00, 0x88, 0x01, 0x01]
    );

    // waiting_requests = 2, max_running_requests = 6, load_only = 9, engine_silence_ms = 19,
    // prefill_pending_tokens = 21.
    let load = EngineLoad {
        waiting_requests: 3,
        max_running_requests: 64,
        load_only: true,
        engine_silence_ms: Some(5),
        prefill_pending_tokens: Some(1),
        ..Default::default()
    };
    assert_eq!(
        load.encode_to_vec(),
        [0x10, 0x03, 0x30, 0x40, 0x48, 0x01, 0x98, 0x01, 0x05, 0xa8, 0x01, 0x01]
    );

    // The load rides the batch at field 8; dp_rank at 4 is told apart from no rank.
    let batch = KvEventBatch {
        sequence_number: 2,
        dp_rank: Some(0),
        load: Some(EngineLoad::default()),
        ..Default::default()
    };
    assert_eq!(batch.encode_to_vec(), [0x08, 0x02, 0x20, 0x00, 0x42, 0x00]);

    // GetLoads' sections at 12-16, read into the same messages the pushed record carries:
    // memory's token_capacity at 4, queues' waiting at 1.
    let rank = SchedulerLoad {
        memory: Some(common::EngineMemory {
            token_capacity: 5,
            ..Default::default()
        }),
        queues: Some(common::EngineQueues {
            waiting: 2,
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(
        rank.encode_to_vec(),
        [0x62, 0x02, 0x20, 0x05, 0x82, 0x01, 0x02, 0x08, 0x02]
    );
}
