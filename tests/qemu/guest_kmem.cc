// cxlkv-guest-kmem NODE: the kmem path inside a QEMU CXL guest, after the CXL dax device was
// onlined as system RAM (daxctl reconfigure-device --mode=system-ram) and became the
// CPU-less NUMA node NODE.
//   1. memkind MEMKIND_DAX_KMEM allocates on that node (memkind finds it through libdaxctl).
//   2. An arena on kmem:node=NODE has its pages on that node.
// Page placement is checked with move_pages(2) in query mode.
#include <memkind.h>
#include <numaif.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cxlkv/allocator/block_allocator.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"

namespace {

int NodeOf(void* p) {
  void* pages[1] = {p};
  int status[1] = {-1};
  if (move_pages(0, 1, pages, nullptr, status, 0) != 0) return -2;
  return status[0];
}

[[noreturn]] void Fail(const std::string& what) {
  std::printf("FAIL: %s\n", what.c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s NODE\n", argv[0]);
    return 2;
  }
  const int node = std::atoi(argv[1]);

  if (int rc = memkind_check_available(MEMKIND_DAX_KMEM); rc != 0) {
    char msg[MEMKIND_ERROR_MESSAGE_SIZE];
    memkind_error_message(rc, msg, sizeof(msg));
    Fail(std::string("MEMKIND_DAX_KMEM unavailable: ") + msg);
  }
  constexpr std::size_t kBytes = 4 << 20;
  auto* p = static_cast<char*>(memkind_malloc(MEMKIND_DAX_KMEM, kBytes));
  if (p == nullptr) Fail("memkind_malloc(MEMKIND_DAX_KMEM) returned NULL");
  std::memset(p, 0x5A, kBytes);
  for (std::size_t off = 0; off < kBytes; off += 1 << 20) {
    const int got = NodeOf(p + off);
    if (got != node)
      Fail("memkind page at +" + std::to_string(off) + " is on node " + std::to_string(got));
  }
  memkind_free(MEMKIND_DAX_KMEM, p);
  std::printf("memkind MEMKIND_DAX_KMEM: 4 MiB on node %d\n", node);

  const std::string spec = "kmem:node=" + std::to_string(node) + "?size=16M";
  auto region = cxlkv::pool::OpenRegion(spec);
  if (!region.ok()) Fail(spec + ": " + std::string(region.status().message()));
  cxlkv::pool::FormatOptions o;
  o.layout = cxlkv::pool::KvLayout{1, 1, 64, 2, 16, cxlkv::pool::KvLayoutKind::kContiguous};
  auto arena = cxlkv::pool::Arena::Format(std::move(*region), o);
  if (!arena.ok()) Fail("format " + spec + ": " + std::string(arena.status().message()));
  auto a = cxlkv::allocator::BlockAllocator::Create(std::move(*arena));
  if (!a.ok()) Fail("allocator");
  for (int i = 0; i < 64; ++i) {
    const auto h = (*a)->Alloc(0);
    if (!h.valid()) Fail("alloc from the kmem arena");
    std::memset((*a)->Addr(h), i, 4096);
    const int got = NodeOf((*a)->Addr(h));
    if (got != node) Fail("arena block on node " + std::to_string(got));
  }
  const int header_node = NodeOf((*a)->arena().region().addr());
  if (header_node != node) Fail("arena header on node " + std::to_string(header_node));
  std::printf("kmem: OK (memkind and a %s arena on node %d)\n", spec.c_str(), node);
  return 0;
}
