// bench/peers/redis_client.h — the Redis side of lease_benchmark: a synchronous hiredis
// connection to a server on 127.0.0.1, and the "lease" a Redis-based KV-cache index takes on
// an entry: GET the key (the lookup), EXPIRE it (the lease, renewed by TTL).
//
// One RedisClient per thread (a hiredis context is not thread-safe). Built without hiredis
// (libhiredis-dev missing at configure time), Connect() returns kFailedPrecondition saying so.
#ifndef CXLKV_BENCH_PEERS_REDIS_CLIENT_H_
#define CXLKV_BENCH_PEERS_REDIS_CLIENT_H_

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cxlkv::bench {

class RedisClient {
 public:
  // TCP to 127.0.0.1:port (hiredis sets TCP_NODELAY), 5 s connect and I/O timeouts.
  static absl::StatusOr<std::unique_ptr<RedisClient>> Connect(int port);
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  absl::Status Ping();
  absl::Status Set(absl::string_view key, absl::string_view value);
  // GET key, wait for the reply, then EXPIRE key ttl_s, wait again: two round trips.
  // Returns the value's size. kNotFound when the key is absent or EXPIRE does not return 1.
  absl::StatusOr<std::size_t> GetExpire(absl::string_view key, int ttl_s);
  // The same two commands written together, then both replies read: one round trip.
  absl::StatusOr<std::size_t> GetExpirePipelined(absl::string_view key, int ttl_s);

  // "hiredis <major>.<minor>.<patch>", or why it is absent.
  static const char* Version();

 private:
  struct Impl;
  explicit RedisClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cxlkv::bench

#endif  // CXLKV_BENCH_PEERS_REDIS_CLIENT_H_
