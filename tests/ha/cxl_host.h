// A host of the domain in the test's process, publishing and looking blocks up through CXL
// alone (the HA tests' check that hosts keep finding blocks while orchestrators fail).
#ifndef CXLKV_TESTS_HA_CXL_HOST_H_
#define CXLKV_TESTS_HA_CXL_HOST_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>

#include "absl/status/status.h"
#include "cxlkv/coherence/mem.h"
#include "cxlkv/coherence/prefix.h"
#include "eventually.h"
#include "gtest/gtest.h"
#include "ha/namespaces.h"

namespace cxlkv::testing {

// A reference to block `index` of the arena whose id starts with `arena0`, generation 1.
inline co::BlockRef TestRef(std::uint8_t arena0, std::uint32_t index) {
  co::BlockRef ref{};
  ref.arena[0] = arena0;
  ref.index = index;
  ref.generation = 1;
  return ref;
}

// A host of the domain (host id 2) in this process, on the shared domain file: it publishes
// and looks blocks up through CXL alone, as a serving host does, in one namespace. ok() is
// false (and the reason a test failure) when the file cannot be mapped or the host not joined.
class CxlHost {
 public:
  static constexpr std::size_t kDomainBytes = 4 << 20;  // SharedDomain's prefix domain

  explicit CxlHost(const std::string& domain_file) {
    fd_ = ::open(domain_file.c_str(), O_RDWR);
    EXPECT_GE(fd_, 0) << domain_file;
    if (fd_ < 0) return;
    void* map = ::mmap(nullptr, kDomainBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    EXPECT_NE(map, MAP_FAILED) << domain_file;
    if (map == MAP_FAILED) return;
    map_ = map;
    mem_ = std::make_unique<co::DirectMem>(static_cast<std::byte*>(map_), kDomainBytes);
    auto h = co::PrefixHost::Join(*mem_, clock_, 2);
    EXPECT_TRUE(h.ok()) << h.status();
    if (h.ok()) host_ = *std::move(h);
  }
  ~CxlHost() {
    host_.reset();
    if (map_ != nullptr) ::munmap(map_, kDomainBytes);
    if (fd_ >= 0) ::close(fd_);
  }
  CxlHost(const CxlHost&) = delete;
  CxlHost& operator=(const CxlHost&) = delete;

  bool ok() const { return host_ != nullptr; }
  co::PrefixHost* operator->() const { return host_.get(); }

  // The key of `tokens` chained on no parent.
  co::PrefixKey Key(std::initializer_list<std::uint32_t> tokens) const {
    return co::ChainKey(ns_, co::PrefixKey{},
                        std::span<const std::uint32_t>(tokens.begin(), tokens.size()));
  }
  absl::Status Publish(const co::PrefixKey& key, const co::BlockRef& ref) {
    return host_->Publish(ns_, key, co::PrefixKey{}, ref);
  }
  std::optional<co::Hit> Lookup(const co::PrefixKey& key) { return host_->Lookup(ns_, key); }
  // A prefix lease on the block `key` names, released at once: OK, or why it was refused.
  absl::Status AcquireAndRelease(const co::PrefixKey& key) {
    auto lease = host_->LookupAndAcquire(ns_, key);
    if (!lease.ok()) return lease.status();
    host_->Release(*lease);
    return absl::OkStatus();
  }
  // Publishes and waits (3 s) until the owner applied it: the host finds the block. False
  // also when the host did not join.
  bool PublishAndWait(const co::PrefixKey& key, const co::BlockRef& ref) {
    return ok() && Publish(key, ref).ok() &&
           Eventually([&] { return Lookup(key).has_value(); }, milliseconds(3000));
  }

 private:
  const co::Namespace ns_ = co::MakeNamespace("t", "m", "l");
  int fd_ = -1;
  void* map_ = nullptr;
  co::SteadyClock clock_;
  std::unique_ptr<co::DirectMem> mem_;
  std::unique_ptr<co::PrefixHost> host_;
};

}  // namespace cxlkv::testing

#endif  // CXLKV_TESTS_HA_CXL_HOST_H_
