// cxlkv/pool/spec.h — source specs: the one string that names a memory source everywhere
// (CLI, config, environment).
//
//   devdax:/dev/daxX.Y[?shared=1]            a device-DAX character device (CXL or pmem)
//   kmem:node=N[?size=BYTES]                 a (CPU-less) NUMA node onlined as system RAM
//   file:PATH[?size=BYTES][&reserve=0|1]     a file, e.g. in /dev/shm (emulated pool)
//   memfd:[NAME]?size=BYTES                  an anonymous memfd (private to this process tree)
//
// Sizes are bytes with an optional binary suffix K, M, G or T (KiB..TiB), e.g. 8G, as
// base::ParseSize reads them. Parameters follow '?', separated by '&'. `shared=1` declares the
// source switch-pooled (shared by the hosts of a CXL domain) when topology cannot tell.
// Parsing is pure and thread-safe.
#ifndef CXLKV_POOL_SPEC_H_
#define CXLKV_POOL_SPEC_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cxlkv::pool {

enum class SourceKind : std::uint8_t { kDevdax, kKmem, kFile, kMemfd };

absl::string_view SourceKindName(SourceKind kind) noexcept;

struct SourceSpec {
  SourceKind kind = SourceKind::kMemfd;
  std::string path;              // devdax: device path; file: file path; memfd: name
  int numa_node = -1;            // kmem only
  std::uint64_t size_bytes = 0;  // 0: take the size of the existing device/file
  bool reserve = true;           // file: fallocate the whole size when creating
  bool shared = false;           // declared switch-pooled
  // A window of a devdax device or file: map only [offset, offset + length) — one extent of
  // a pooled region lent by the orchestrator. length 0: the whole source.
  std::uint64_t offset = 0;
  std::uint64_t length = 0;

  // The canonical spec string; ParseSourceSpec(ToString()) yields an equal spec.
  std::string ToString() const;
  bool operator==(const SourceSpec&) const = default;
};

// Parses a spec string. Errors are kInvalidArgument and quote the spec, the offending part
// and the accepted forms.
absl::StatusOr<SourceSpec> ParseSourceSpec(absl::string_view spec);

}  // namespace cxlkv::pool

#endif  // CXLKV_POOL_SPEC_H_
