// cxlkv/orchestrator/kv_events.h — KV events for existing routers (docs/kv_events.md): the
// blocks a domain's shared prefix index gains and loses, in vLLM's KV-event wire format, on a
// ZMQ PUB socket, so routers that already consume vLLM's events (llm-d's indexer, Dynamo's
// relay, ...) see which prefixes a CXL domain holds.
//
// The wire format, as vLLM's vllm/distributed/kv_events.py defines it (cited in the doc):
//   a message is three ZMQ frames: topic, an 8-byte big-endian sequence number, payload;
//   the payload is a msgpack EventBatch: [ts (float seconds), [event...], data_parallel_rank];
//   each event is tagged by its type name, either as a positional array (what vLLM wrote
//   before its PR #42892, and what every consumer decodes) —
//     ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
//      lora_name]
//     ["BlockRemoved", block_hashes, medium]
//     ["AllBlocksCleared"]
//   or (EventFormat::kMap) as a map with the tag under "type" and the same fields by name,
//   as vLLM writes since then. Fields after these (extra_keys, group_idx, ...) have defaults
//   there and are left out, as vLLM's encoder omits defaults.
// What cxlkv fills in: block_hashes is one block's chain key (the index records neither a
// block's parent nor its tokens, so parent_block_hash is nil, token_ids empty, and each event
// names one block); medium ("SHARED" unless configured: a tier routers file as shared),
// block_size, lora fields and the rank come from the configuration. vLLM's format has no
// field for the domain: it is in the topic.
//
// Thread-safety: the encoder functions are pure; a KvEventPublisher is used by one thread.
#ifndef CXLKV_ORCHESTRATOR_KV_EVENTS_H_
#define CXLKV_ORCHESTRATOR_KV_EVENTS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cxlkv/coherence/key.h"

namespace cxlkv::orchestrator::events {

enum class EventFormat { kArray, kMap };
// How a 128-bit chain key goes on the wire: 16 bytes, high word first (the hex cxlkvctl
// prints), or the low 64 bits as an unsigned integer (for consumers that take only integers).
enum class HashForm { kBytes, kUint64 };

struct KvEvent {
  enum class Kind { kStored, kRemoved, kAllCleared };
  Kind kind = Kind::kStored;
  std::vector<coherence::PrefixKey> blocks;  // kStored: one block; kRemoved: any number
};

struct EncodeOptions {
  EventFormat format = EventFormat::kArray;
  HashForm hash = HashForm::kBytes;
  std::string medium = "SHARED";  // docs/kv_events.md, "medium"
  std::uint32_t block_size = 16;  // tokens per block, as the engines publishing here use
  std::optional<std::int64_t> data_parallel_rank = 0;  // nullopt: nil
};

// The msgpack EventBatch for `events` at `ts_s` (seconds since the epoch).
std::string EncodeBatch(double ts_s, const std::vector<KvEvent>& events, const EncodeOptions& o);

struct PublisherOptions {
  std::string endpoint;  // "tcp://*:5557" binds; "tcp://host:port" connects; ipc:// binds
  std::string topic;     // the first frame of every message
  int hwm = 100000;      // ZMQ send high-water mark (messages beyond it are dropped)
};

class KvEventPublisher {
 public:
  // kInvalidArgument naming the endpoint when ZMQ refuses it (bad form, address in use).
  static absl::StatusOr<std::unique_ptr<KvEventPublisher>> Create(const PublisherOptions& o);
  ~KvEventPublisher();
  // Sends [topic, seq, payload] without blocking; seq counts from 0. kResourceExhausted when
  // ZMQ would block (no subscriber keeps up): the batch is dropped and seq still advances, so
  // a subscriber sees the gap.
  absl::Status Send(const std::string& payload);
  std::uint64_t next_seq() const { return seq_; }

 private:
  struct Zmq;
  KvEventPublisher(std::unique_ptr<Zmq> z, std::string topic);
  std::unique_ptr<Zmq> z_;
  std::string topic_;
  std::uint64_t seq_ = 0;
};

}  // namespace cxlkv::orchestrator::events

#endif  // CXLKV_ORCHESTRATOR_KV_EVENTS_H_
