// cxlkv/tier/calibrate.h — start-up measurement of the tier figures the placement rule uses.
//
// CalibrateMemory(): copy bandwidth out of and into a mapping (memcpy of large blocks,
// rotating over the range) and load-to-use latency (a pointer chase over a random cycle of
// cache lines). CalibrateNvme(): read latency at queue depth 1 (4 KiB O_DIRECT preads),
// bandwidth at depth (large O_DIRECT preads from `depth` threads) and IOPS at depth (4 KiB),
// on a scratch file it creates, unlinks at once and fills with random bytes. Calibrate()
// runs both within a time budget (2 s by default). Results save to and load from JSON
// (format in docs/placement.md) and ApplyCalibration() folds them into PlacementParams.
//
// The memory measurement overwrites the range it measures: Calibrate() refuses a region that
// holds an arena. Figures from a VM include the hypervisor's caching of the disk.
// Thread-safety: the functions share no state; each measurement should run alone on the
// machine for meaningful figures.
#ifndef CXLKV_TIER_CALIBRATE_H_
#define CXLKV_TIER_CALIBRATE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cxlkv/pool/region.h"
#include "cxlkv/tier/placement.h"

namespace cxlkv::tier {

struct MemoryCalibration {
  std::string source;             // the region's spec, or "anonymous"
  std::string tier;               // "cxl-expanded", "cxl-pooled" or "dram" (applied to none)
  double read_bytes_per_s = 0;    // memcpy out of the range
  double write_bytes_per_s = 0;   // memcpy into the range
  double latency_s = 0;           // one dependent load (pointer chase)
  std::uint64_t bytes = 0;        // bytes of the range used
  std::uint64_t block_bytes = 0;  // memcpy size
  bool operator==(const MemoryCalibration&) const = default;
};

struct NvmeCalibration {
  std::string dir;
  std::uint64_t file_bytes = 0;  // scratch file size actually written
  double latency_qd1_s = 0;      // mean 4 KiB read at queue depth 1
  double latency_qd1_p50_s = 0;
  double read_bytes_per_s = 0;  // io_bytes reads, `depth` in flight
  double iops = 0;              // 4 KiB reads per second, `depth` in flight
  std::uint32_t depth = 0;
  std::uint32_t io_bytes = 0;
  bool operator==(const NvmeCalibration&) const = default;
};

struct Calibration {
  std::optional<MemoryCalibration> memory;
  std::optional<NvmeCalibration> nvme;
  std::string measured_at;  // RFC 3339, UTC
  double duration_s = 0;
  bool operator==(const Calibration&) const = default;
};

struct CalibrateOptions {
  double budget_s = 2.0;                      // whole run, memory and NVMe together
  std::uint64_t memory_bytes = 128ull << 20;  // of the region (or anonymous memory) to use
  std::uint64_t copy_block_bytes = 2ull << 20;
  std::uint64_t nvme_file_bytes = 128ull << 20;
  std::uint32_t nvme_depth = 16;
  std::uint32_t nvme_io_bytes = 1u << 20;  // a multiple of 4096
};

// Measures [addr, addr + bytes), overwriting it, within about budget_s. `bytes` must hold
// at least 2 copy blocks. kInvalidArgument otherwise.
absl::StatusOr<MemoryCalibration> CalibrateMemory(std::byte* addr, std::uint64_t bytes,
                                                  double budget_s, const CalibrateOptions& options);

// Measures reads from a scratch file in `dir` within about budget_s. Errors name the
// directory: kNotFound, kPermissionDenied, kFailedPrecondition when the file system refuses
// O_DIRECT (tmpfs), kResourceExhausted when it is full.
absl::StatusOr<NvmeCalibration> CalibrateNvme(const std::string& dir, double budget_s,
                                              const CalibrateOptions& options);

// Both measurements: memory on `region` (nullptr: anonymous memory, tier "dram"; a region
// that holds an arena is refused with kFailedPrecondition), NVMe on `nvme_dir` (empty: not
// measured). The tier of a region follows its spec: shared=1 → cxl-pooled, memfd → dram,
// otherwise cxl-expanded.
absl::StatusOr<Calibration> Calibrate(const pool::Region* region, const std::string& nvme_dir,
                                      const CalibrateOptions& options = {});

std::string CalibrationToJson(const Calibration& c, int indent = 2);
// kInvalidArgument "<source>: <field>: <what>" for bad JSON, a foreign format or version, a
// missing field or a figure that is not positive and finite.
absl::StatusOr<Calibration> CalibrationFromJson(absl::string_view json, absl::string_view source);
absl::Status SaveCalibration(const Calibration& c, const std::string& path);
absl::StatusOr<Calibration> LoadCalibration(const std::string& path);

// Replaces the figures the calibration measured: memory latency and read bandwidth for its
// CXL tier (a "dram" measurement changes nothing), NVMe latency (mean at QD1), read
// bandwidth and IOPS. Returns one line per change, e.g. "nvme.read_bytes_per_s: 1.4e10 ->
// 1.9e9 (calibration)".
std::vector<std::string> ApplyCalibration(const Calibration& c, PlacementParams* params);

}  // namespace cxlkv::tier

#endif  // CXLKV_TIER_CALIBRATE_H_
