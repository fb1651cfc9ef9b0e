#include "announce.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cxlkv/base/stop.h"
#include "cxlkv/coherence/domain_layout.h"
#include "cxlkv/orchestrator/directory.h"
#include "cxlkv/orchestrator/published_key.h"
#include "domain_core.h"
#include "event_sink.h"
#include "ha.h"

namespace cxlkv::orchestrator {

namespace co = ::cxlkv::coherence;

namespace {

std::int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
std::int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct Announcer::Impl {
  DomainCore& core;
  HaSession* ha;
  const Config& c;
  base::StopSignal stop;  // Stop() ends the loop's waits at once
  std::thread thread;
  mutable absl::Mutex mu;
  AnnounceStats stats ABSL_GUARDED_BY(mu);
  std::unique_ptr<EventSink> sink;  // null: no events
  // The domain's publish secret (DomainCore::PublishSecret: keys.publish_file's, or the
  // domain's own): every key that leaves (events, the directory summary) is K'
  // (published_key.h). Null: keys leave unkeyed (keys.unkeyed), or no term opened yet.
  std::optional<PublishedKeyer> keyer;
  std::string keyer_secret;  // what `keyer` was made from

  // The thread's own state.
  bool in_term = false;
  std::int64_t term_epoch = -1;
  const void* term_owner = nullptr;
  std::uint64_t last_sig = ~0ull;
  std::vector<co::PrefixKey> current;  // what leaves: K' when keyed, else the chain keys
  // Keyed: K' of each key of the last look, so a look keys only what is new (one HMAC each).
  absl::flat_hash_map<co::PrefixKey, co::PrefixKey, co::PrefixKeyHash> keyed_of;
  absl::flat_hash_set<co::PrefixKey, co::PrefixKeyHash> known;
  bool dir_dirty = false;
  std::int64_t last_put_ms = 0;
  std::int64_t last_error_log_ms = -1000000;

  Impl(DomainCore& dc, const Config& config, HaSession* h) : core(dc), ha(h), c(config) {}

  bool DirectoryOn() const { return ha != nullptr && c.directory.enabled; }
  bool EventsOn() const { return sink != nullptr; }

  void Loop() {
    const std::int64_t period = EventsOn() ? c.events.interval_ms : 50;
    // A PUB socket drops what it sends before a subscriber's subscription reached it; a
    // connecting PUB (events.endpoint tcp://HOST:PORT) has none for its first milliseconds.
    // The first term's opening batch waits this long, so a subscriber already listening sees
    // it.
    if (EventsOn() && stop.SleepFor(std::chrono::milliseconds(500))) return;
    while (!stop.stopped()) {
      Tick();
      stop.SleepFor(std::chrono::milliseconds(period));
    }
  }

  void Tick() {
    // Without events the index is only needed when a directory write could be due: skip the
    // look (and its scan under the orchestrator's lock) until then.
    if (!EventsOn() && in_term && SteadyMs() - last_put_ms < c.directory.min_interval_ms) return;
    bool serving = false, changed = false;
    std::int64_t epoch = 0, revision = 0;
    std::uint32_t capacity = 0;
    // Under the core's lock, while this orchestrator serves with an owner.
    serving = core.LookAtOwner(
        [&](const co::PrefixOwner& owner, std::int64_t owner_epoch, std::int64_t owner_revision) {
          epoch = owner_epoch;
          revision = owner_revision;
          const auto& st = owner.stats();
          const std::uint64_t sig = st.published * 0x9E3779B97F4A7C15ull ^ st.retired ^
                                    (static_cast<std::uint64_t>(epoch) << 40) ^
                                    reinterpret_cast<std::uintptr_t>(&owner);
          const bool new_term = !in_term || epoch != term_epoch || &owner != term_owner;
          if (new_term || sig != last_sig) {
            last_sig = sig;
            changed = true;
            current.clear();
            capacity = owner.header().index_entries;
            for (std::uint32_t i = 0; i < capacity; ++i) {
              if (owner.entry_state(i) != co::EntryState::kPublished) continue;
              const co::IndexEntry e = owner.entry(i);
              current.push_back(co::PrefixKey{e.key[0], e.key[1]});
            }
          }
          if (new_term) {
            in_term = false;  // opened below
            term_epoch = epoch;
            term_owner = &owner;
          }
        });
    if (!serving) {
      in_term = false;  // a later term starts with AllBlocksCleared again
      known.clear();
      return;
    }
    if (!in_term && !KeyForTerm()) {
      // Keyed, and no key to key with: nothing leaves (never the chain keys themselves); the
      // next look starts over, so `current` is keyed before it is sent.
      last_sig = ~0ull;
      return;
    }
    if (changed && keyer.has_value()) KeyCurrent();
    const bool opening = !in_term;
    in_term = true;
    if (changed || opening) {
      dir_dirty = true;
      Events(opening);
    }
    if (DirectoryOn()) Directory(epoch, revision, capacity);
  }

  // At a term's opening: the keyer of the secret the domain's keys leave under now. False when
  // they must leave keyed and there is no secret to key them with.
  bool KeyForTerm() {
    if (c.keys.unkeyed) {
      keyer.reset();
      return true;
    }
    const std::string secret = core.PublishSecret();
    if (secret.empty()) {
      LogError("domain '" + c.name +
               "' has no publish key yet (its owner creates it when it opens the domain): "
               "nothing is announced until it has one");
      return false;
    }
    if (!keyer.has_value() || secret != keyer_secret) {
      auto k = PublishedKeyer::Create(secret);
      if (!k.ok()) {
        LogError(absl::StrCat("domain '", c.name, "': its publish key: ", k.status().message()));
        return false;
      }
      keyer = *std::move(k);
      keyer_secret = secret;
      keyed_of.clear();
    }
    return true;
  }

  // At most one line every 5 s: a condition that lasts is not logged on every look.
  void LogError(const std::string& what) {
    const std::int64_t now = SteadyMs();
    if (now - last_error_log_ms < 5000) return;
    last_error_log_ms = now;
    std::fprintf(stderr, "cxlkv-orchestrator: %s\n", what.c_str());
  }

  // Replaces the chain keys in `current` with K', outside the orchestrator's lock.
  void KeyCurrent() {
    absl::flat_hash_map<co::PrefixKey, co::PrefixKey, co::PrefixKeyHash> next;
    next.reserve(current.size());
    for (co::PrefixKey& k : current) {
      const auto it = keyed_of.find(k);
      const co::PrefixKey keyed = it != keyed_of.end() ? it->second : keyer->Apply(k);
      next.emplace(k, keyed);
      k = keyed;
    }
    keyed_of = std::move(next);
  }

  void Events(bool opening) {
    if (!EventsOn()) return;
    if (opening) known.clear();
    absl::flat_hash_set<co::PrefixKey, co::PrefixKeyHash> now(current.begin(), current.end());
    std::vector<co::PrefixKey> stored, removed;
    for (const co::PrefixKey& k : current) {
      if (!known.contains(k)) stored.push_back(k);
    }
    for (const co::PrefixKey& k : known) {
      if (!now.contains(k)) removed.push_back(k);
    }
    known = std::move(now);
    if (!opening && stored.empty() && removed.empty()) return;
    SinkCounts n;
    sink->Publish(opening, stored, removed, &n);
    absl::MutexLock l(&mu);
    stats.event_batches += n.batches;
    stats.events += n.events;
    stats.event_drops += n.drops;
  }

  // `revision`: etcd's id of the term (guards the write); `epoch`: the domain's.
  void Directory(std::int64_t epoch, std::int64_t revision, std::uint32_t capacity) {
    const std::int64_t now = SteadyMs();
    const bool due = (dir_dirty && now - last_put_ms >= c.directory.min_interval_ms) ||
                     now - last_put_ms >= c.directory.refresh_ms;
    if (!due || epoch == 0) return;
    directory::Summary s;
    s.domain = c.etcd.domain;
    s.epoch = epoch;
    s.published = current.size();
    s.anchor_every = c.directory.anchor_every;
    s.built_unix_ms = UnixMs();
    if (keyer.has_value()) {
      s.keyed = true;
      s.key_id = keyer->id();
    }
    const std::uint64_t expected =
        (c.directory.expected_keys != 0 ? c.directory.expected_keys : capacity) /
        std::max<std::uint32_t>(c.directory.anchor_every, 1);
    const directory::FilterSize size = c.directory.bytes != 0
                                           ? directory::SizeForBytes(c.directory.bytes, expected)
                                           : directory::SizeFor(expected, c.directory.fp_rate);
    s.filter = directory::BloomFilter(size);
    for (const co::PrefixKey& k : current) {
      if (directory::IsAnchor(k, c.directory.anchor_every)) {
        s.filter.Add(k);
        ++s.anchors;
      }
    }
    const absl::Status st = ha->PutDirectory(directory::EncodeSummary(s), revision);
    absl::MutexLock l(&mu);
    if (st.ok()) {
      ++stats.directory_writes;
      dir_dirty = false;
      last_put_ms = now;
      return;
    }
    ++stats.directory_failures;
    last_put_ms = now - c.directory.refresh_ms + c.directory.min_interval_ms;  // retry soon
    LogError(std::string(st.message()));
  }
};

absl::StatusOr<std::unique_ptr<Announcer>> Announcer::Start(DomainCore& core, const Config& c,
                                                            HaSession* ha) {
  auto impl = std::make_unique<Impl>(core, c, ha);
  auto sink = MakeEventSink(c);
  if (!sink.ok()) return sink.status();
  impl->sink = *std::move(sink);
  if (!impl->DirectoryOn() && !impl->EventsOn()) return std::unique_ptr<Announcer>();
  const KeysConfig& keys = c.keys;
  if (!keys.publish_secret.empty()) {
    // Checked now, so that a bad file stops the start instead of every term's announcements.
    if (auto keyer = PublishedKeyer::Create(keys.publish_secret); !keyer.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key 'keys.publish_file' ('", keys.publish_file, "'): ", keyer.status().message()));
    }
  } else if (keys.unkeyed) {
    std::fprintf(stderr,
                 "cxlkv-orchestrator: chain keys leave domain '%s' unkeyed (keys.unkeyed, %s): "
                 "whoever reads them can test a guessed prompt (docs/kv_events.md, \"What a "
                 "subscriber can learn\")\n",
                 c.name.c_str(), impl->EventsOn() ? "KV events" : "the directory summary in etcd");
  }
  Impl* p = impl.get();
  p->thread = std::thread([p] { p->Loop(); });
  return std::unique_ptr<Announcer>(new Announcer(std::move(impl)));
}

Announcer::Announcer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Announcer::~Announcer() { Stop(); }

void Announcer::Stop() {
  if (impl_ == nullptr) return;
  impl_->stop.Stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

AnnounceStats Announcer::stats() const {
  absl::MutexLock l(&impl_->mu);
  return impl_->stats;
}

}  // namespace cxlkv::orchestrator
