// Fuzzes the placement rule's two input files: the reuse tracker's stats file (binary,
// `cxlkvctl explain --stats`) and the calibration JSON (`cxlkvctl calibrate`). The first
// byte picks the parser. A stats file that loads is a consistent table; a calibration that
// parses round-trips through its JSON and, applied to the defaults, still yields a rule.
// CXLKV_FUZZ_WRITE_SEED=PATH writes a valid stats file (selector byte 0) to PATH and exits.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "cxlkv/tier/calibrate.h"
#include "cxlkv/tier/placement.h"
#include "cxlkv/tier/reuse_tracker.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* path = std::getenv("CXLKV_FUZZ_WRITE_SEED");
  if (path == nullptr) return 0;
  auto t = cxlkv::tier::ReuseTracker::Create({64, 0.25});
  if (!t.ok()) std::abort();
  for (std::uint64_t k = 1; k <= 6; ++k) {
    for (std::uint64_t use = 0; use < k; ++use) t->Record({k, k * 7}, use * 1000000000ull * k, k << 20, 16);
  }
  const std::string tmp = std::string(path) + ".tmp";
  if (!t->Save(tmp, 10000000000ull).ok()) std::abort();
  std::ifstream in(tmp, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream out(path, std::ios::binary);
  out.put('\0');
  out << bytes;
  out.close();  // std::exit runs no destructors
  ::unlink(tmp.c_str());
  std::exit(0);
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0) {
    auto loaded = cxlkv::tier::ReuseTracker::Parse(body, "fuzz");
    if (loaded.ok()) {
      const auto& t = loaded->tracker;
      if (t.size() > t.capacity() || t.Entries().size() != t.size()) std::abort();
    }
    return 0;
  }
  auto c = cxlkv::tier::CalibrationFromJson(body, "fuzz");
  if (!c.ok()) return 0;
  auto again = cxlkv::tier::CalibrationFromJson(cxlkv::tier::CalibrationToJson(*c), "again");
  if (!again.ok()) std::abort();
  cxlkv::tier::PlacementParams p;
  (void)cxlkv::tier::ApplyCalibration(*c, &p);
  if (!p.Validate().ok()) std::abort();
  if (!cxlkv::tier::PlacementRule::Create(p).ok()) std::abort();
  return 0;
}
