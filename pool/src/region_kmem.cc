// kmem: memory of a NUMA node (CXL memory onlined as system RAM). The source is an anonymous
// shmem object whose pages are bound to the node (mbind MPOL_BIND) before the first touch, so
// it is shared with fork()ed children only, and it cannot be mapped at a chosen address.
#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "cxlkv/base/errno.h"
#include "cxlkv/pool/region.h"
#include "region_source.h"

namespace cxlkv::pool {
namespace {

std::string KmemName(const SourceSpec& spec) { return absl::StrCat("kmem:node=", spec.numa_node); }

absl::Status OpenKmem(const SourceSpec& spec, const std::string& name, OpenedSource* out) {
  if (numa_available() < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": NUMA is not available on this kernel"));
  }
  long long free_bytes = 0;
  if (spec.numa_node > numa_max_node() || numa_node_size64(spec.numa_node, &free_bytes) <= 0) {
    return absl::NotFoundError(absl::StrCat(
        name, ": NUMA node ", spec.numa_node,
        " has no memory or does not exist; `cxlkvctl topology` lists the memory nodes"));
  }
  out->size_bytes = spec.size_bytes;
  if (out->size_bytes == 0) {
    // Half the node's free memory, in whole 2 MiB pages.
    out->size_bytes = (static_cast<std::uint64_t>(free_bytes) / 2) & ~((2ull << 20) - 1);
  }
  out->fd.reset(::memfd_create("cxlkv-kmem", MFD_CLOEXEC));
  if (out->fd.get() < 0) return base::ErrnoStatus(errno, name, "memfd_create");
  // The size is a multiple of the page here (the spec's was checked, the default is whole
  // 2 MiB pages).
  if (::ftruncate(out->fd.get(), static_cast<off_t>(out->size_bytes)) != 0) {
    return base::ErrnoStatus(errno, name, "ftruncate");
  }
  return absl::OkStatus();
}

// Bind before first touch: shmem keeps the policy with the object, so every page, whoever
// faults it, comes from the node.
absl::Status BindKmem(const SourceSpec& spec, const std::string& name, void* addr,
                      std::uint64_t bytes) {
  struct bitmask* nodes = numa_allocate_nodemask();
  numa_bitmask_setbit(nodes, static_cast<unsigned>(spec.numa_node));
  const long rc = mbind(addr, bytes, MPOL_BIND, nodes->maskp, nodes->size + 1, 0);
  const int err = errno;
  numa_free_nodemask(nodes);
  if (rc != 0) return base::ErrnoStatus(err, name, "mbind");
  return absl::OkStatus();
}

}  // namespace

const SourceBackend kKmemBackend = {&KmemName, &OpenKmem, &BindKmem, false};

}  // namespace cxlkv::pool
