#include "peers/redis_client.h"

#include <memory>

#include "absl/strings/str_cat.h"

#if CXLKV_BENCH_HAVE_HIREDIS
#include <hiredis/hiredis.h>
#include <sys/time.h>
#endif

namespace cxlkv::bench {

#if CXLKV_BENCH_HAVE_HIREDIS

namespace {

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

}  // namespace

struct RedisClient::Impl {
  redisContext* c = nullptr;
  ~Impl() {
    if (c != nullptr) redisFree(c);
  }
  absl::Status Error(absl::string_view what) const {
    return absl::UnavailableError(absl::StrCat("redis ", what, ": ", c->errstr));
  }
  absl::StatusOr<Reply> Read(absl::string_view what) {
    void* r = nullptr;
    if (redisGetReply(c, &r) != REDIS_OK || r == nullptr) return Error(what);
    return Reply(static_cast<redisReply*>(r));
  }
  absl::StatusOr<std::size_t> CheckGet(const Reply& r) const {
    if (r->type == REDIS_REPLY_STRING) return r->len;
    if (r->type == REDIS_REPLY_NIL) return absl::NotFoundError("redis GET: no such key");
    return absl::InternalError(absl::StrCat("redis GET: reply type ", r->type));
  }
  absl::Status CheckExpire(const Reply& r) const {
    if (r->type == REDIS_REPLY_INTEGER && r->integer == 1) return absl::OkStatus();
    return absl::NotFoundError(
        absl::StrCat("redis EXPIRE: reply type ", r->type, " value ", r->integer));
  }
};

RedisClient::RedisClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RedisClient::~RedisClient() = default;

absl::StatusOr<std::unique_ptr<RedisClient>> RedisClient::Connect(int port) {
  const timeval timeout{5, 0};
  auto impl = std::make_unique<Impl>();
  impl->c = redisConnectWithTimeout("127.0.0.1", port, timeout);
  if (impl->c == nullptr) return absl::ResourceExhaustedError("redis: cannot allocate a context");
  if (impl->c->err != 0) return impl->Error(absl::StrCat("connect 127.0.0.1:", port));
  if (redisSetTimeout(impl->c, timeout) != REDIS_OK) return impl->Error("set timeout");
  return std::unique_ptr<RedisClient>(new RedisClient(std::move(impl)));
}

absl::Status RedisClient::Ping() {
  Reply r(static_cast<redisReply*>(redisCommand(impl_->c, "PING")));
  if (r == nullptr) return impl_->Error("PING");
  if (r->type != REDIS_REPLY_STATUS) {
    return absl::UnavailableError(absl::StrCat("redis PING: reply type ", r->type));
  }
  return absl::OkStatus();
}

absl::Status RedisClient::Set(absl::string_view key, absl::string_view value) {
  Reply r(static_cast<redisReply*>(
      redisCommand(impl_->c, "SET %b %b", key.data(), key.size(), value.data(), value.size())));
  if (r == nullptr) return impl_->Error("SET");
  if (r->type != REDIS_REPLY_STATUS) {
    return absl::InternalError(absl::StrCat("redis SET: reply type ", r->type));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::size_t> RedisClient::GetExpire(absl::string_view key, int ttl_s) {
  Reply get(static_cast<redisReply*>(redisCommand(impl_->c, "GET %b", key.data(), key.size())));
  if (get == nullptr) return impl_->Error("GET");
  auto bytes = impl_->CheckGet(get);
  if (!bytes.ok()) return bytes;
  Reply expire(static_cast<redisReply*>(
      redisCommand(impl_->c, "EXPIRE %b %d", key.data(), key.size(), ttl_s)));
  if (expire == nullptr) return impl_->Error("EXPIRE");
  if (absl::Status s = impl_->CheckExpire(expire); !s.ok()) return s;
  return bytes;
}

absl::StatusOr<std::size_t> RedisClient::GetExpirePipelined(absl::string_view key, int ttl_s) {
  // Appending only buffers; the first redisGetReply writes both commands in one send.
  if (redisAppendCommand(impl_->c, "GET %b", key.data(), key.size()) != REDIS_OK ||
      redisAppendCommand(impl_->c, "EXPIRE %b %d", key.data(), key.size(), ttl_s) != REDIS_OK) {
    return impl_->Error("append");
  }
  auto get = impl_->Read("GET");
  if (!get.ok()) return get.status();
  auto expire = impl_->Read("EXPIRE");
  if (!expire.ok()) return expire.status();
  auto bytes = impl_->CheckGet(*get);
  if (!bytes.ok()) return bytes;
  if (absl::Status s = impl_->CheckExpire(*expire); !s.ok()) return s;
  return bytes;
}

const char* RedisClient::Version() {
  static const std::string v =
      absl::StrCat("hiredis ", HIREDIS_MAJOR, ".", HIREDIS_MINOR, ".", HIREDIS_PATCH);
  return v.c_str();
}

#else  // !CXLKV_BENCH_HAVE_HIREDIS

struct RedisClient::Impl {};
constexpr char kNoHiredis[] =
    "lease_benchmark was built without hiredis (apt-get install libhiredis-dev, reconfigure)";

RedisClient::RedisClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RedisClient::~RedisClient() = default;
absl::StatusOr<std::unique_ptr<RedisClient>> RedisClient::Connect(int) {
  return absl::FailedPreconditionError(kNoHiredis);
}
absl::Status RedisClient::Ping() { return absl::FailedPreconditionError(kNoHiredis); }
absl::Status RedisClient::Set(absl::string_view, absl::string_view) {
  return absl::FailedPreconditionError(kNoHiredis);
}
absl::StatusOr<std::size_t> RedisClient::GetExpire(absl::string_view, int) {
  return absl::FailedPreconditionError(kNoHiredis);
}
absl::StatusOr<std::size_t> RedisClient::GetExpirePipelined(absl::string_view, int) {
  return absl::FailedPreconditionError(kNoHiredis);
}
const char* RedisClient::Version() { return kNoHiredis; }

#endif  // CXLKV_BENCH_HAVE_HIREDIS

}  // namespace cxlkv::bench
