// The per-kind seam behind OpenRegionAt (region.cc). Each kind of source (devdax, kmem, file,
// memfd) opens its file descriptor and says how large and how aligned the source is, in its
// own file (region_<kind>.cc); region.cc does the rest the same way for every kind: the page
// check, the window of a pooled extent, the address check and the MAP_SHARED mapping.
// A backend is a table of plain functions, chosen once by SourceKind (BackendFor).
#ifndef CXLKV_POOL_SRC_REGION_SOURCE_H_
#define CXLKV_POOL_SRC_REGION_SOURCE_H_

#include <unistd.h>

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "cxlkv/base/file.h"
#include "cxlkv/pool/spec.h"

namespace cxlkv::pool {

inline constexpr std::uint64_t kPageBytes = 4096;

// What a backend's open returns: the descriptor to map, the bytes of the whole source (not
// yet checked against the page: region.cc reports a size that is not a multiple of it), and
// the alignment block placement must respect (the page unless the device asks for more).
struct OpenedSource {
  base::UniqueFd fd;  // closed on every error path; release() hands it on
  std::uint64_t size_bytes = 0;
  std::uint64_t alignment = kPageBytes;
  // A file this open created ("" : none): removed when the OpenedSource goes before the open
  // succeeded (OpenRegionAt clears it on success), so a failed open leaves nothing behind.
  std::string created;
  OpenedSource() = default;
  OpenedSource(const OpenedSource&) = delete;
  OpenedSource& operator=(const OpenedSource&) = delete;
  ~OpenedSource() {
    if (!created.empty()) ::unlink(created.c_str());
  }
};

struct SourceBackend {
  // The source's name in messages and in Region::name(), e.g. "/dev/dax0.0", "memfd:cxlkv".
  std::string (*name)(const SourceSpec& spec);
  // Opens the source named `name`; errors name it and the fix. spec.size_bytes is a multiple
  // of the page here (0: the source's own size).
  absl::Status (*open)(const SourceSpec& spec, const std::string& name, OpenedSource* out);
  // Runs once [addr, addr + bytes) is mapped, before the first touch; nullptr: nothing to do.
  absl::Status (*mapped)(const SourceSpec& spec, const std::string& name, void* addr,
                         std::uint64_t bytes);
  // Whether the source may be mapped at an address the caller chose (OpenRegionAt's `at`).
  bool fixed_address = true;
};

extern const SourceBackend kDevdaxBackend;  // region_devdax.cc
extern const SourceBackend kKmemBackend;    // region_kmem.cc
extern const SourceBackend kFileBackend;    // region_file.cc
extern const SourceBackend kMemfdBackend;   // region_memfd.cc

}  // namespace cxlkv::pool

#endif  // CXLKV_POOL_SRC_REGION_SOURCE_H_
