// cxlkv/preload/settings.h — the preload shim's configuration: environment and config file.
//
// Keys (environment name / config-file key):
//   CXLKV_POOL      pool        source spec of the CXL pool, e.g. file:/dev/shm/kv?size=8G,
//                               memfd:?size=1G, devdax:/dev/dax0.0, kmem:node=2, or
//                               orchestrator:/run/cxlkv/D.sock: the heap lives in extents the
//                               domain's cxlkv-orchestrator lends (docs/preload.md). Unset:
//                               the shim passes everything through.
//   CXLKV_HOST_ID   host_id     with an orchestrator: pool, this process's host id in the
//                               domain (required; one per process).
//   CXLKV_LIBRARY   library     with an orchestrator: pool, the libcxlkv.so to load for the
//                               control plane (default: libcxlkv.so.0 beside the shim, then
//                               the loader's search path).
//   CXLKV_MIN_BYTES min_bytes   malloc-family and anonymous-mmap requests of at least this
//                               many bytes go to CXL (K/M/G suffixes; default 1M; 0 = all).
//                               cudaHostAlloc/cudaMallocHost always go to CXL.
//   CXLKV_LOG       log         LEVEL[,DEST]: LEVEL one of off, error, warn (default), info,
//                               debug; DEST stderr (default) or a file path (appended).
//   CXLKV_STATS     stats       file written at exit with counts and bytes per class, CXL vs
//                               pass-through (JSON). "%p" in the path becomes the pid.
//   CXLKV_SHM       shm         a glob of absolute paths (fnmatch, '*' stops at '/'), e.g.
//                               /dev/shm/vllm_offload_*: a MAP_SHARED mapping of a file whose
//                               path matches is backed by the pool (kmem: the file's pages are
//                               bound to the node; devdax/file: an extent of the pool is mapped
//                               instead of the file; docs/preload.md, "Shared-memory files").
//                               Needs a kmem:, devdax: or file: pool.
//   CXLKV_REGISTER_CHUNK register_chunk
//                               the most one cudaHostRegister call pins: a larger request is
//                               split into calls of this size (K/M/G/T; a multiple of 4 KiB,
//                               below 512G; default 64G: NVIDIA's r580+ drivers refuse one call
//                               of 512 GiB or more).
//   CXLKV_CONFIG    —           a file of `key = value` lines (# comments) with the keys
//                               above; the environment overrides it.
// An unknown key (a CXLKV_* variable or a file key not listed above) or a bad value is an
// error: LoadSettings collects the messages (the shim prints them once on stderr) and
// returns settings with no pool, so the process runs as if the shim were not loaded.
//
// Parsing is pure (no global state) and allocates; the shim calls it only during start-up
// with its reentrancy guard set.
#ifndef CXLKV_PRELOAD_SETTINGS_H_
#define CXLKV_PRELOAD_SETTINGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace cxlkv::preload {

enum class LogLevel : std::uint8_t { kOff = 0, kError, kWarn, kInfo, kDebug };
const char* LogLevelName(LogLevel level) noexcept;

inline constexpr std::uint64_t kDefaultMinBytes = 1u << 20;
// cudaHostRegister is split above this (whole ranges in chunks, docs/gpu.md; gpu::PlanChunks).
inline constexpr std::uint64_t kDefaultRegisterChunkBytes = 64ull << 30;
// NVIDIA's r580 drivers refuse a single registration of this size or more.
inline constexpr std::uint64_t kDriverRegisterLimitBytes = 512ull << 30;

// CXLKV_POOL=orchestrator:<socket>: the heap lives in extents a domain's orchestrator lends.
inline constexpr absl::string_view kOrchestratorPrefix = "orchestrator:";

struct Settings {
  std::string pool;  // empty: pass everything through
  std::uint32_t host_id = 0;  // with an orchestrator: pool
  bool host_id_set = false;
  std::string library;  // libcxlkv.so to load for an orchestrator: pool (empty: the default)
  std::uint64_t min_bytes = kDefaultMinBytes;
  LogLevel log_level = LogLevel::kWarn;
  std::string log_path;    // empty: stderr
  std::string stats_path;  // empty: no stats file
  std::string shm_glob;    // empty: shared-memory files are left alone
  std::uint64_t register_chunk_bytes = kDefaultRegisterChunkBytes;
  std::string config_path;
};

// Applies one config-file key (pool, host_id, library, min_bytes, log, stats, shm,
// register_chunk). kInvalidArgument names the key,
// the bad value and the accepted forms; an unknown key lists the known ones.
absl::Status ApplySetting(absl::string_view key, absl::string_view value, Settings* s);

// Parses config-file text into *s. Every bad line is reported (with `source`:line).
std::vector<std::string> ParseConfigText(absl::string_view text, absl::string_view source,
                                         Settings* s);

// Reads the settings from an environment block (NULL-terminated "NAME=value" strings, as
// `environ`), including the CXLKV_CONFIG file. Errors go to *errors; when there are any,
// the returned settings have an empty pool (pass-through).
Settings LoadSettings(const char* const* envp, std::vector<std::string>* errors);

// Replaces "%p" in a path template with the pid.
std::string ExpandPid(absl::string_view path, int pid);

}  // namespace cxlkv::preload

#endif  // CXLKV_PRELOAD_SETTINGS_H_
