// Fuzzes what the orchestrator reads from outside: control-plane requests (protobuf wire
// bytes, decoded and applied to the membership/capacity state exactly as the RPC handlers
// apply them), its TOML configuration, and its state file. Nothing may crash, and the
// state's invariants must hold after every request: an extent is held by at most one live
// incarnation, no host exceeds its share, and the state file round-trips.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "cxlkv/orchestrator/config.h"
#include "cxlkv/orchestrator/state.h"
#include "google/protobuf/stubs/logging.h"
#include "orchestrator.pb.h"

namespace {

namespace pb = ::cxlkv::orchestrator::v1;
using cxlkv::orchestrator::Config;
using cxlkv::orchestrator::DomainState;
using cxlkv::orchestrator::ExtentInfo;

const Config& TestConfig() {
  static const Config c = [] {
    auto r = cxlkv::orchestrator::ParseConfig(R"(
[domain]
pool = "memfd:?size=1G"
prefix_domain = "memfd:?size=16M"
extent_size = "64M"
state_file = "/nonexistent/fuzz.state"
max_hosts = 4
[rpc]
socket = "/nonexistent/fuzz.sock"
[capacity]
default_share = 0.5
[capacity.shares]
1 = 0.25
)", "fuzz.toml");
    if (!r.ok()) std::abort();
    return *r;
  }();
  return c;
}

void CheckInvariants(const DomainState& s, bool requests_only = true) {
  const Config& c = s.config();
  for (std::uint32_t h = 0; requests_only && h < c.max_hosts; ++h) {
    const auto cap = static_cast<std::uint32_t>(
        std::floor(c.ShareOf(h) * static_cast<double>(s.extents().size()) + 1e-9));
    if (s.ExtentsOf(h) > cap) std::abort();
  }
  for (const ExtentInfo& e : s.extents()) {
    if (e.host == ExtentInfo::kNoHost) continue;
    if (e.host >= c.max_hosts) std::abort();
    if (requests_only && e.incarnation > s.hosts()[e.host].incarnation) std::abort();
  }
  DomainState again(c, 1ull << 30);
  if (!again.Deserialize(s.Serialize(), 0).ok()) std::abort();
  if (again.Serialize() != s.Serialize()) std::abort();
}

// Requests: [type byte][length byte][protobuf bytes] ... applied in order; a type byte also
// advances the clock.
void Requests(const std::uint8_t* data, std::size_t size) {
  DomainState s(TestConfig(), 1ull << 30);
  std::int64_t now = 0;
  std::size_t i = 0;
  while (i + 2 <= size) {
    const std::uint8_t type = data[i];
    const std::size_t len = std::min<std::size_t>(data[i + 1], size - i - 2);
    const std::uint8_t* msg = data + i + 2;
    i += 2 + len;
    now += type >> 3;
    switch (type & 7) {
      case 0: {
        pb::JoinRequest r;
        if (r.ParseFromArray(msg, static_cast<int>(len))) (void)s.Join(r.host_id(), r.hostname(), now);
        break;
      }
      case 1: {
        pb::HeartbeatRequest r;
        if (r.ParseFromArray(msg, static_cast<int>(len))) {
          (void)s.Heartbeat(r.host_id(), r.incarnation(), r.used_bytes(), now);
        }
        break;
      }
      case 2: {
        pb::GrowRequest r;
        if (r.ParseFromArray(msg, static_cast<int>(len)) && r.extents() <= 1024) {
          (void)s.Grow(r.host_id(), r.incarnation(), r.extents(), now);
        }
        break;
      }
      case 3: {
        pb::ShrinkRequest r;
        if (r.ParseFromArray(msg, static_cast<int>(len))) {
          (void)s.Shrink(r.host_id(), r.incarnation(),
                         std::vector<std::uint32_t>(r.extents().begin(), r.extents().end()), now);
        }
        break;
      }
      case 4: {
        pb::LeaveRequest r;
        if (r.ParseFromArray(msg, static_cast<int>(len))) (void)s.Leave(r.host_id(), r.incarnation(), now);
        break;
      }
      case 5: {
        pb::DrainRequest r;
        if (r.ParseFromArray(msg, static_cast<int>(len))) (void)s.Drain(r.host_id());
        break;
      }
      default:  // time jumps past every TTL and lease: fencing and expiry
        now += 1000000;
        s.Expire(now);
        break;
    }
    CheckInvariants(s);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 in string fields is logged: noise
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 3) {
    case 0:
      Requests(data + 1, size - 1);
      break;
    case 1: {
      auto c = cxlkv::orchestrator::ParseConfig(rest, "fuzz.toml");
      if (c.ok() && c->heartbeat_period_ms * 4 > c->host_ttl_ms) std::abort();
      break;
    }
    default: {
      DomainState s(TestConfig(), 1ull << 30);
      // A state file (checksummed) may hold what a later config no longer allows (a smaller
      // share): only its round trip is checked.
      if (s.Deserialize(rest, 0).ok()) CheckInvariants(s, /*requests_only=*/false);
      break;
    }
  }
  return 0;
}
