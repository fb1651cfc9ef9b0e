// bench/peers/etcd_client.h — the etcd side of lease_benchmark: etcd v3's own lease API over
// gRPC (stubs generated at build time from the .proto files Debian ships in
// golang-etcd-server-dev), the way clientv3 takes a lease: LeaseGrant (unary), keep-alives on
// one long-lived LeaseKeepAlive stream per client, LeaseRevoke (unary).
//
// One EtcdLeaseClient per thread: each has its own channel (its own HTTP/2 connection: the
// subchannel pool is local) and its own keep-alive stream. Every unary call has a 5 s
// deadline. Built without gRPC (see bench/peers/CMakeLists.txt), Connect() returns
// kFailedPrecondition naming what is missing.
#ifndef CXLKV_BENCH_PEERS_ETCD_CLIENT_H_
#define CXLKV_BENCH_PEERS_ETCD_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cxlkv::bench {

class EtcdLeaseClient {
 public:
  // A channel to 127.0.0.1:port, connected (waits up to 5 s).
  static absl::StatusOr<std::unique_ptr<EtcdLeaseClient>> Connect(int port);
  ~EtcdLeaseClient();
  EtcdLeaseClient(const EtcdLeaseClient&) = delete;
  EtcdLeaseClient& operator=(const EtcdLeaseClient&) = delete;

  // Maintenance.Status: the server's version once it serves requests (the readiness probe).
  absl::StatusOr<std::string> ServerVersion();
  // LeaseGrant(TTL ttl_s), the server choosing the ID. Returns the lease ID.
  absl::StatusOr<std::int64_t> Grant(std::int64_t ttl_s);
  // One request/response on this client's keep-alive stream (opened on first use).
  // kNotFound when the server reports the lease gone (TTL <= 0).
  absl::Status KeepAliveOnce(std::int64_t id);
  absl::Status Revoke(std::int64_t id);

  // "gRPC <version>, protobuf <version>", or why the client is absent.
  static std::string Version();

 private:
  struct Impl;
  explicit EtcdLeaseClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cxlkv::bench

#endif  // CXLKV_BENCH_PEERS_ETCD_CLIENT_H_
