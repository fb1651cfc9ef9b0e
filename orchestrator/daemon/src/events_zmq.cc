// EventSink on orchestrator/events: vLLM's KV-event wire format on a ZMQ PUB socket.
#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "cxlkv/orchestrator/kv_events.h"
#include "event_sink.h"

namespace cxlkv::orchestrator {

namespace {

// Events per message: a takeover of a full index goes out in several batches.
constexpr std::size_t kEventsPerBatch = 1024;

class ZmqSink final : public EventSink {
 public:
  ZmqSink(std::unique_ptr<events::KvEventPublisher> pub, events::EncodeOptions enc)
      : pub_(std::move(pub)), enc_(std::move(enc)) {}

  void Publish(bool cleared, const std::vector<coherence::PrefixKey>& stored,
               const std::vector<coherence::PrefixKey>& removed, SinkCounts* counts) override {
    std::vector<events::KvEvent> out;
    if (cleared) out.push_back(events::KvEvent{events::KvEvent::Kind::kAllCleared, {}});
    for (const coherence::PrefixKey& k : stored) {
      out.push_back(events::KvEvent{events::KvEvent::Kind::kStored, {k}});
    }
    if (!removed.empty()) out.push_back(events::KvEvent{events::KvEvent::Kind::kRemoved, removed});
    const double ts =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    for (std::size_t i = 0; i < out.size(); i += kEventsPerBatch) {
      const std::size_t end = std::min(out.size(), i + kEventsPerBatch);
      const std::vector<events::KvEvent> part(out.begin() + static_cast<std::ptrdiff_t>(i),
                                              out.begin() + static_cast<std::ptrdiff_t>(end));
      if (pub_->Send(events::EncodeBatch(ts, part, enc_)).ok()) {
        ++counts->batches;
        counts->events += part.size();
      } else {
        ++counts->drops;
      }
    }
  }

 private:
  std::unique_ptr<events::KvEventPublisher> pub_;
  events::EncodeOptions enc_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<EventSink>> MakeEventSink(const Config& c) {
  if (!c.events.enabled()) return std::unique_ptr<EventSink>();
  events::PublisherOptions po;
  po.endpoint = c.events.endpoint;
  const std::string domain = c.etcd.enabled() ? c.etcd.domain : c.name;
  po.topic = c.events.topic.empty() ? absl::StrCat("cxlkv/", domain) : c.events.topic;
  po.hwm = static_cast<int>(c.events.hwm);
  auto pub = events::KvEventPublisher::Create(po);
  if (!pub.ok()) return pub.status();
  events::EncodeOptions enc;
  enc.format = c.events.format == "map" ? events::EventFormat::kMap : events::EventFormat::kArray;
  enc.hash = c.events.block_hash == "uint64" ? events::HashForm::kUint64 : events::HashForm::kBytes;
  enc.block_size = c.events.block_size;
  enc.medium = c.events.medium;
  enc.data_parallel_rank = c.events.data_parallel_rank;
  return std::unique_ptr<EventSink>(new ZmqSink(*std::move(pub), std::move(enc)));
}

}  // namespace cxlkv::orchestrator
