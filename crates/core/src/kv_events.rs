//! The KV events vLLM and SGLang publish over ZMQ, decoded from their MessagePack payload.
//!
//! Both engines define the events as msgspec structs and encode them with msgspec's MessagePack
//! encoder; the releases differ in the shape, so the decoder takes either:
//! - SGLang (`python/sglang/srt/disaggregation/kv_events.py`, sgl-project/sglang@006d053) and
//!   older vLLM declare the batch and its events `array_like`: a batch is `[ts, events]`
//!   (vLLM adds `data_parallel_rank`), an event `[tag, field, ...]` in declaration order, the
//!   trailing fields left at their defaults omitted.
//! - vLLM today (`vllm/distributed/kv_events.py`, vllm-project/vllm@0181ea3) declares neither
//!   array-like: a batch is a map (`ts`, `events`, `data_parallel_rank` when set), an event a
//!   map whose `type` names it.
//!
//! The events are `BlockStored` (`block_hashes`, `parent_block_hash`, `token_ids`,
//! `block_size`, `lora_id`, then in vLLM `medium`, `lora_name`, `extra_keys`, `group_idx`, ...),
//! `BlockRemoved` (`block_hashes`, then in vLLM `medium`, `group_idx`) and `AllBlocksCleared`.
//! A block hash is an integer, or in vLLM by default the hash's bytes
//! (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES` unset): bytes are folded to 64 bits with the
//! gateway's stable hash, as an identity only (nothing is computed from an engine's hash).

use rmpv::Value;

use crate::hash::stable_hash;

/// One published batch.
#[derive(Debug, Clone, PartialEq)]
pub struct EventBatch {
    /// When the engine published it (its clock, seconds).
    pub ts: f64,
    pub events: Vec<KvEvent>,
    /// The data-parallel rank whose cache it describes (vLLM; SGLang ranks publish on ports of
    /// their own).
    pub dp_rank: Option<u32>,
}

/// One event of a batch.
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Vec<u32>,
        block_size: usize,
        /// Where the blocks live (`GPU`, or an offload tier such as `CPU`); `None`: the GPU.
        medium: Option<String>,
        /// The KV cache group (hybrid models keep several); `None`: the only one.
        group: Option<u32>,
        /// The LoRA adapter whose cache the blocks are in; `None`: the base model's, or an
        /// engine that does not say (SGLang publishes `lora_id` None whatever the adapter).
        adapter: Option<AdapterTag>,
    },
    Removed {
        hashes: Vec<u64>,
        medium: Option<String>,
        group: Option<u32>,
    },
    AllCleared,
    /// An event of a kind this decoder does not know, named by its tag: skipped, as an engine
    /// newer than the gateway may add kinds.
    Other(String),
}

/// How a stored event names its blocks' adapter: vLLM's `lora_name` where the release sends it,
/// else its `lora_id` (the engine's own number for the adapter, which the gateway cannot map to
/// a name: such blocks are kept apart from every request's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdapterTag {
    Name(String),
    Id(i64),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("not MessagePack: {0}")]
    NotMessagePack(String),
    #[error("a batch must be an array or a map with ts and events")]
    NotABatch,
    #[error("event {index}: {what}")]
    BadEvent { index: usize, what: String },
}

/// Decodes one payload (the third frame of a ZMQ message, or a replayed one).
pub fn decode_batch(payload: &[u8]) -> Result<EventBatch, DecodeError> {
    let value = rmpv::decode::read_value(&mut &payload[..])
        .map_err(|e| DecodeError::NotMessagePack(e.to_string()))?;
    let (ts, events, dp_rank) = match &value {
        Value::Array(items) => (items.first(), items.get(1), items.get(2)),
        Value::Map(_) => (
            field(&value, "ts"),
            field(&value, "events"),
            field(&value, "data_parallel_rank"),
        ),
        _ => return Err(DecodeError::NotABatch),
    };
    let ts = ts.and_then(Value::as_f64).ok_or(DecodeError::NotABatch)?;
    let events = events
        .and_then(Value::as_array)
        .ok_or(DecodeError::NotABatch)?;
    let events = events
        .iter()
        .enumerate()
        .map(|(index, e)| {
            event(e).map_err(|what| DecodeError::BadEvent {
                index,
                what: what.to_string(),
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(EventBatch {
        ts,
        events,
        dp_rank: dp_rank.and_then(Value::as_u64).map(|r| r as u32),
    })
}

/// A map's value under `key`.
fn field<'a>(map: &'a Value, key: &str) -> Option<&'a Value> {
    map.as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
}

/// An event's fields by name, whichever its shape: an array's are in declaration order after
/// the tag.
struct Fields<'a> {
    value: &'a Value,
    order: &'static [&'static str],
}

impl<'a> Fields<'a> {
    fn get(&self, name: &str) -> Option<&'a Value> {
        let found = match self.value {
            Value::Array(items) => {
                let at = self.order.iter().position(|f| *f == name)?;
                items.get(at + 1)
            }
            map => field(map, name),
        };
        found.filter(|v| !v.is_nil())
    }
}

const STORED: &[&str] = &[
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
];
const REMOVED: &[&str] = &["block_hashes", "medium", "group_idx"];

fn event(value: &Value) -> Result<KvEvent, &'static str> {
    let tag = match value {
        Value::Array(items) => items.first().and_then(Value::as_str),
        map => field(map, "type").and_then(Value::as_str),
    }
    .ok_or("no tag naming the event")?;
    let fields = |order| Fields { value, order };
    Ok(match tag {
        "BlockStored" => {
            let f = fields(STORED);
            KvEvent::Stored {
                hashes: hashes(f.get("block_hashes"))?,
                parent: f.get("parent_block_hash").map(hash).transpose()?,
                tokens: f
                    .get("token_ids")
                    .and_then(Value::as_array)
                    .ok_or("token_ids is not a list")?
                    .iter()
                    .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                    .collect::<Option<_>>()
                    .ok_or("a token id is not a 32-bit count")?,
                block_size: f
                    .get("block_size")
                    .and_then(Value::as_u64)
                    .ok_or("block_size is not a count")? as usize,
                medium: f.get("medium").and_then(Value::as_str).map(String::from),
                group: f.get("group_idx").and_then(Value::as_u64).map(|g| g as u32),
                adapter: adapter_tag(f.get("lora_name"), f.get("lora_id")),
            }
        }
        "BlockRemoved" => {
            let f = fields(REMOVED);
            KvEvent::Removed {
                hashes: hashes(f.get("block_hashes"))?,
                medium: f.get("medium").and_then(Value::as_str).map(String::from),
                group: f.get("group_idx").and_then(Value::as_u64).map(|g| g as u32),
            }
        }
        "AllBlocksCleared" => KvEvent::AllCleared,
        other => KvEvent::Other(other.to_string()),
    })
}

/// The adapter a stored event names, by name before number.
fn adapter_tag(name: Option<&Value>, id: Option<&Value>) -> Option<AdapterTag> {
    name.and_then(Value::as_str)
        .map(|n| AdapterTag::Name(n.to_string()))
        .or_else(|| id.and_then(Value::as_i64).map(AdapterTag::Id))
}

fn hashes(value: Option<&Value>) -> Result<Vec<u64>, &'static str> {
    value
        .and_then(Value::as_array)
        .ok_or("block_hashes is not a list")?
        .iter()
        .map(hash)
        .collect()
}

/// An engine's block hash as a 64-bit identity: an integer as it is (a negative one by its
/// bits), bytes folded by the stable hash.
fn hash(value: &Value) -> Result<u64, &'static str> {
    match value {
        Value::Integer(i) => i
            .as_u64()
            .or_else(|| i.as_i64().map(|i| i as u64))
            .ok_or("a block hash out of range"),
        Value::Binary(bytes) => Ok(stable_hash(bytes)),
        _ => Err("a block hash that is neither an integer nor bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(value: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, value).unwrap();
        out
    }

    fn s(text: &str) -> Value {
        Value::from(text)
    }

    fn ints(values: &[i64]) -> Value {
        Value::Array(values.iter().map(|&v| Value::from(v)).collect())
    }

    fn map(pairs: Vec<(&str, Value)>) -> Value {
        Value::Map(pairs.into_iter().map(|(k, v)| (s(k), v)).collect())
    }

    /// SGLang's shape: array-like batch and events, trailing defaults omitted.
    #[test]
    fn sglangs_arrays_decode() {
        let batch = Value::Array(vec![
            Value::F64(12.5),
            Value::Array(vec![
                Value::Array(vec![
                    s("BlockStored"),
                    ints(&[11, 12]),
                    Value::Nil,
                    ints(&[1, 2, 3, 4, 5, 6]),
                    Value::from(3),
                    Value::Nil,
                ]),
                Value::Array(vec![s("BlockRemoved"), ints(&[-5])]),
                Value::Array(vec![s("AllBlocksCleared")]),
            ]),
        ]);
        let decoded = decode_batch(&encode(&batch)).unwrap();
        assert_eq!(decoded.ts, 12.5);
        assert_eq!(decoded.dp_rank, None);
        assert_eq!(
            decoded.events,
            vec![
                KvEvent::Stored {
                    hashes: vec![11, 12],
                    parent: None,
                    tokens: vec![1, 2, 3, 4, 5, 6],
                    block_size: 3,
                    medium: None,
                    group: None,
                    adapter: None,
                },
                KvEvent::Removed {
                    hashes: vec![(-5i64) as u64],
                    medium: None,
                    group: None,
                },
                KvEvent::AllCleared,
            ]
        );
    }

    /// vLLM's shape today: a map batch, tagged map events, hashes as bytes.
    #[test]
    fn vllms_maps_decode_with_byte_hashes() {
        let hash = Value::Binary(vec![7; 32]);
        let batch = map(vec![
            ("ts", Value::F64(1.0)),
            (
                "events",
                Value::Array(vec![
                    map(vec![
                        ("type", s("BlockStored")),
                        ("block_hashes", Value::Array(vec![hash.clone()])),
                        ("parent_block_hash", Value::Binary(vec![1; 32])),
                        ("token_ids", ints(&[9, 9])),
                        ("block_size", Value::from(2)),
                        ("lora_id", Value::from(3)),
                        ("medium", s("GPU")),
                        ("lora_name", s("sql")),
                        ("group_idx", Value::from(0)),
                    ]),
                    map(vec![
                        ("type", s("BlockRemoved")),
                        ("block_hashes", Value::Array(vec![hash])),
                        ("medium", s("CPU")),
                    ]),
                    map(vec![("type", s("BlockTransferred"))]),
                ]),
            ),
            ("data_parallel_rank", Value::from(1)),
        ]);
        let decoded = decode_batch(&encode(&batch)).unwrap();
        assert_eq!(decoded.dp_rank, Some(1));
        let folded = stable_hash(&[7; 32]);
        assert_eq!(
            decoded.events,
            vec![
                KvEvent::Stored {
                    hashes: vec![folded],
                    parent: Some(stable_hash(&[1; 32])),
                    tokens: vec![9, 9],
                    block_size: 2,
                    medium: Some("GPU".into()),
                    group: Some(0),
                    adapter: Some(AdapterTag::Name("sql".into())),
                },
                KvEvent::Removed {
                    hashes: vec![folded],
                    medium: Some("CPU".into()),
                    group: None,
                },
                KvEvent::Other("BlockTransferred".into()),
            ]
        );
    }

    #[test]
    fn what_is_not_a_batch_is_refused_with_why() {
        assert!(matches!(
            decode_batch(&[0x92, 0xcb]),
            Err(DecodeError::NotMessagePack(_))
        ));
        assert_eq!(
            decode_batch(&encode(&s("hello"))),
            Err(DecodeError::NotABatch)
        );
        let bad = Value::Array(vec![
            Value::F64(0.0),
            Value::Array(vec![Value::Array(vec![
                s("BlockStored"),
                ints(&[1]),
                Value::Nil,
                ints(&[-1]),
                Value::from(1),
            ])]),
        ]);
        assert_eq!(
            decode_batch(&encode(&bad)),
            Err(DecodeError::BadEvent {
                index: 0,
                what: "a token id is not a 32-bit count".into()
            })
        );
    }

    /// Older vLLM's array-like events carry the adapter's number only.
    #[test]
    fn an_adapter_is_read_by_name_before_number() {
        let batch = Value::Array(vec![
            Value::F64(0.0),
            Value::Array(vec![Value::Array(vec![
                s("BlockStored"),
                ints(&[1]),
                Value::Nil,
                ints(&[1, 2]),
                Value::from(2),
                Value::from(7),
            ])]),
        ]);
        let decoded = decode_batch(&encode(&batch)).unwrap();
        let KvEvent::Stored { adapter, .. } = &decoded.events[0] else {
            panic!("a stored event");
        };
        assert_eq!(adapter, &Some(AdapterTag::Id(7)));
    }
}
