// What an elected leader on another machine leaves in a domain file: a fence line, written
// straight into the file's first page (the HA tests' stand-in for a takeover the test process
// does not run itself).
#ifndef CXLKV_TESTS_HA_FENCE_FILE_H_
#define CXLKV_TESTS_HA_FENCE_FILE_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "cxlkv/coherence/mem.h"
#include "fence.h"  // orchestrator/daemon/src: WriteFenceLine
#include "gtest/gtest.h"

namespace cxlkv::testing {

inline void WriteFenceLineInFile(const std::string& path, std::uint64_t epoch,
                                 std::uint64_t cluster_id) {
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED) << path;
  coherence::DirectMem mem(static_cast<std::byte*>(p), 4096);
  coherence::OwnerFenceLine l{};
  l.epoch = epoch;
  l.cluster_id = cluster_id;
  orchestrator::WriteFenceLine(mem, l);
  ::munmap(p, 4096);
  ::close(fd);
}

}  // namespace cxlkv::testing

#endif  // CXLKV_TESTS_HA_FENCE_FILE_H_
