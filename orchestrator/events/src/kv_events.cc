#include "cxlkv/orchestrator/kv_events.h"

#define MSGPACK_NO_BOOST 1
#include <msgpack.hpp>
#include <zmq.hpp>

#include "absl/strings/str_cat.h"

namespace cxlkv::orchestrator::events {

namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void Str(Packer& p, const std::string& s) {
  p.pack_str(static_cast<std::uint32_t>(s.size()));
  p.pack_str_body(s.data(), static_cast<std::uint32_t>(s.size()));
}

void Hash(Packer& p, const coherence::PrefixKey& k, HashForm form) {
  if (form == HashForm::kUint64) {
    p.pack_uint64(k.lo);
    return;
  }
  char b[16];
  for (int i = 0; i < 8; ++i) {
    b[i] = static_cast<char>(k.hi >> (56 - 8 * i));
    b[8 + i] = static_cast<char>(k.lo >> (56 - 8 * i));
  }
  p.pack_bin(16);
  p.pack_bin_body(b, 16);
}

void Hashes(Packer& p, const std::vector<coherence::PrefixKey>& keys, HashForm form) {
  p.pack_array(static_cast<std::uint32_t>(keys.size()));
  for (const auto& k : keys) Hash(p, k, form);
}

// One field: its name first in the map form, nothing extra in the array form.
void Field(Packer& p, const EncodeOptions& o, const char* name) {
  if (o.format == EventFormat::kMap) Str(p, name);
}

void Event(Packer& p, const KvEvent& e, const EncodeOptions& o) {
  const bool map = o.format == EventFormat::kMap;
  switch (e.kind) {
    case KvEvent::Kind::kStored:
      // BlockStored: block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
      // lora_name (the fields without defaults, in vLLM's order).
      if (map) {
        p.pack_map(8);
        Str(p, "type");
      } else {
        p.pack_array(8);
      }
      Str(p, "BlockStored");
      Field(p, o, "block_hashes");
      Hashes(p, e.blocks, o.hash);
      Field(p, o, "parent_block_hash");
      p.pack_nil();
      Field(p, o, "token_ids");
      p.pack_array(0);
      Field(p, o, "block_size");
      p.pack_uint32(o.block_size);
      Field(p, o, "lora_id");
      p.pack_nil();
      Field(p, o, "medium");
      Str(p, o.medium);
      Field(p, o, "lora_name");
      p.pack_nil();
      return;
    case KvEvent::Kind::kRemoved:
      // BlockRemoved: block_hashes, medium.
      if (map) {
        p.pack_map(3);
        Str(p, "type");
      } else {
        p.pack_array(3);
      }
      Str(p, "BlockRemoved");
      Field(p, o, "block_hashes");
      Hashes(p, e.blocks, o.hash);
      Field(p, o, "medium");
      Str(p, o.medium);
      return;
    case KvEvent::Kind::kAllCleared:
      if (map) {
        p.pack_map(1);
        Str(p, "type");
      } else {
        p.pack_array(1);
      }
      Str(p, "AllBlocksCleared");
      return;
  }
}

}  // namespace

std::string EncodeBatch(double ts_s, const std::vector<KvEvent>& events, const EncodeOptions& o) {
  msgpack::sbuffer buf;
  Packer p(buf);
  // EventBatch stays positional in every vLLM version: [ts, events, data_parallel_rank].
  p.pack_array(3);
  p.pack_double(ts_s);
  p.pack_array(static_cast<std::uint32_t>(events.size()));
  for (const KvEvent& e : events) Event(p, e, o);
  if (o.data_parallel_rank.has_value()) {
    p.pack_int64(*o.data_parallel_rank);
  } else {
    p.pack_nil();
  }
  return std::string(buf.data(), buf.size());
}

struct KvEventPublisher::Zmq {
  zmq::context_t ctx{1};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
};

absl::StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Create(
    const PublisherOptions& o) {
  auto z = std::make_unique<Zmq>();
  const std::string& ep = o.endpoint;
  try {
    z->pub.set(zmq::sockopt::sndhwm, o.hwm);
    z->pub.set(zmq::sockopt::linger, 0);
    // As vLLM's publisher decides: a wildcard address or ipc:/inproc: binds, else connects.
    const bool bind = ep.find('*') != std::string::npos || ep.find("::") != std::string::npos ||
                      ep.rfind("ipc://", 0) == 0 || ep.rfind("inproc://", 0) == 0;
    if (bind) {
      z->pub.bind(ep);
    } else {
      z->pub.connect(ep);
    }
  } catch (const zmq::error_t& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("events.endpoint '", ep, "': ", e.what(),
                     " (tcp://*:PORT binds, tcp://HOST:PORT connects, ipc://PATH binds)"));
  }
  return std::unique_ptr<KvEventPublisher>(new KvEventPublisher(std::move(z), o.topic));
}

KvEventPublisher::KvEventPublisher(std::unique_ptr<Zmq> z, std::string topic)
    : z_(std::move(z)), topic_(std::move(topic)) {}

KvEventPublisher::~KvEventPublisher() = default;

absl::Status KvEventPublisher::Send(const std::string& payload) {
  char seq[8];
  for (int i = 0; i < 8; ++i) seq[i] = static_cast<char>(seq_ >> (56 - 8 * i));
  ++seq_;
  try {
    auto flags = zmq::send_flags::dontwait;
    if (!z_->pub.send(zmq::buffer(topic_), flags | zmq::send_flags::sndmore) ||
        !z_->pub.send(zmq::buffer(seq, 8), flags | zmq::send_flags::sndmore) ||
        !z_->pub.send(zmq::buffer(payload), flags)) {
      return absl::ResourceExhaustedError("KV events: the ZMQ send queue is full; batch dropped");
    }
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(absl::StrCat("KV events: ZMQ send: ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace cxlkv::orchestrator::events
