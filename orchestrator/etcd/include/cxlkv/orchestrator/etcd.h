// cxlkv/orchestrator/etcd.h — a small etcd v3 client (the gRPC API of etcd 3.4), for the
// orchestrator's leader election and its durable control state (docs/ha.md).
//
// What it covers: KV Range / Put / DeleteRange / Txn with compares, leases (grant,
// keep-alive, revoke, time-to-live), watches, and a member's Status. Nothing here exposes
// protobuf: keys and values are byte strings, results plain structs.
//
// Endpoints: the client holds one gRPC channel per endpoint ("host:port") and sends each call
// to the current one. A call that fails with UNAVAILABLE or DEADLINE_EXCEEDED moves the
// client on to the next endpoint. Reads and idempotent calls (Get, KeepAliveOnce,
// RevokeLease, LeaseTimeToLive) are retried on the next endpoints within the call's deadline;
// writes (Put, Delete, Txn, GrantLease) are tried once, because a write whose reply was lost
// may have been applied: they fail with kDeadlineExceeded / kUnavailable and the caller
// decides (a guarded Txn re-run tells).
//
// Errors: absl::Status with gRPC's code (the codes are the same numbers), the endpoint and
// etcd's message, e.g. "etcd 127.0.0.1:2379: Txn: etcdserver: request timed out".
//
// Thread-safety: a Client may be used from any number of threads at once. A Watch is read by
// one thread at a time.
#ifndef CXLKV_ORCHESTRATOR_ETCD_H_
#define CXLKV_ORCHESTRATOR_ETCD_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace cxlkv::orchestrator::etcd {

// Every reply's header: which cluster and member answered, at which store revision.
struct Header {
  std::uint64_t cluster_id = 0;
  std::uint64_t member_id = 0;
  std::int64_t revision = 0;
  std::uint64_t raft_term = 0;
};

struct KeyValue {
  std::string key, value;
  std::int64_t create_revision = 0;  // the revision that created the key (0: absent)
  std::int64_t mod_revision = 0;     // the revision of its last change
  std::int64_t version = 0;          // changes since it was created
  std::int64_t lease = 0;            // the lease it is attached to (0: none)
};

struct RangeResult {
  Header header;
  std::vector<KeyValue> kvs;
  bool more = false;
  std::int64_t count = 0;
};

// A condition of a Txn on one key. A key that does not exist compares as version, create and
// mod revision 0, lease 0 and an empty value.
struct Compare {
  enum class Target { kVersion, kCreateRevision, kModRevision, kValue, kLease };
  enum class Result { kEqual, kGreater, kLess, kNotEqual };
  std::string key;
  Target target = Target::kVersion;
  Result result = Result::kEqual;
  std::int64_t number = 0;  // every target but kValue
  std::string value;        // kValue

  static Compare CreateRevision(std::string key, Result r, std::int64_t rev) {
    return Compare{std::move(key), Target::kCreateRevision, r, rev, {}};
  }
  static Compare ModRevision(std::string key, Result r, std::int64_t rev) {
    return Compare{std::move(key), Target::kModRevision, r, rev, {}};
  }
  static Compare Version(std::string key, Result r, std::int64_t v) {
    return Compare{std::move(key), Target::kVersion, r, v, {}};
  }
  static Compare Value(std::string key, Result r, std::string value) {
    return Compare{std::move(key), Target::kValue, r, 0, std::move(value)};
  }
  static Compare Lease(std::string key, Result r, std::int64_t lease) {
    return Compare{std::move(key), Target::kLease, r, lease, {}};
  }
};

// One operation of a Txn branch.
struct Op {
  enum class Kind { kGet, kPut, kDelete };
  Kind kind = Kind::kGet;
  std::string key;
  std::string range_end;   // kGet / kDelete: "" is the key alone; see PrefixEnd
  std::string value;       // kPut
  std::int64_t lease = 0;  // kPut: attach to this lease (0: none)

  static Op Get(std::string key, std::string range_end = {}) {
    return Op{Kind::kGet, std::move(key), std::move(range_end), {}, 0};
  }
  static Op Put(std::string key, std::string value, std::int64_t lease = 0) {
    return Op{Kind::kPut, std::move(key), {}, std::move(value), lease};
  }
  static Op Delete(std::string key, std::string range_end = {}) {
    return Op{Kind::kDelete, std::move(key), std::move(range_end), {}, 0};
  }
};

struct OpResult {
  Op::Kind kind = Op::Kind::kGet;
  Header header;
  std::vector<KeyValue> kvs;  // kGet
  std::int64_t deleted = 0;   // kDelete
};

struct TxnResult {
  Header header;  // header.revision: the store's revision after the txn (its own if it wrote)
  bool succeeded = false;         // every compare held: the success branch ran
  std::vector<OpResult> results;  // of the branch that ran, in order
};

struct Lease {
  std::int64_t id = 0;
  std::int64_t ttl_s = 0;  // as granted (etcd may raise a TTL below its minimum)
};

struct Event {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;       // a delete carries the key and its mod_revision only
  KeyValue prev_kv;  // when the watch asked for it (key empty if etcd had none)
};

struct MemberStatus {
  Header header;
  std::string version;
  std::uint64_t leader = 0;  // the member id of the raft leader (0: none known)
  std::uint64_t raft_term = 0;
  std::uint64_t raft_index = 0;
};

// The end of the range of every key starting with `prefix` (range_end of a prefix scan).
std::string PrefixEnd(const std::string& prefix);

struct ClientOptions {
  std::vector<std::string> endpoints;  // "host:port", at least one
  // A whole call, retries on other endpoints included.
  std::uint32_t call_timeout_ms = 2000;
  // One attempt on one endpoint: an endpoint that hangs (a stopped member) is left after this.
  std::uint32_t attempt_timeout_ms = 700;
  // etcd authentication (`etcdctl auth enable`): with a user, the client gets a token from
  // Auth.Authenticate and sends it with every call ("token" metadata), authenticating again
  // when etcd says it is no longer valid. "" : no authentication.
  std::string user, password;
  // TLS to the members: the CA's certificates (PEM) that sign theirs; with cert_pem and
  // key_pem also a client certificate (etcd's --client-cert-auth). "" : plaintext.
  std::string ca_pem, cert_pem, key_pem;
};

class Watch;

class Client {
 public:
  // Makes the channels; connects lazily (no I/O here). kInvalidArgument for no endpoints or
  // one that is not host:port.
  static absl::StatusOr<std::unique_ptr<Client>> Create(const ClientOptions& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // The keys in [key, range_end) (range_end "": the key alone). Linearizable.
  absl::StatusOr<RangeResult> Get(const std::string& key, const std::string& range_end = {});
  absl::StatusOr<Header> Put(const std::string& key, const std::string& value,
                             std::int64_t lease = 0);
  // Returns how many keys were deleted.
  absl::StatusOr<std::int64_t> Delete(const std::string& key, const std::string& range_end = {});
  // If every compare holds, runs `success`, else `failure`; atomically, at one revision.
  absl::StatusOr<TxnResult> Txn(const std::vector<Compare>& compares,
                                const std::vector<Op>& success, const std::vector<Op>& failure);

  absl::StatusOr<Lease> GrantLease(std::int64_t ttl_s);
  // One keep-alive round trip: the lease's TTL from now, as etcd restarted it; kNotFound when
  // the lease is gone (expired or revoked). `timeout_ms` (0: call_timeout_ms) bounds the
  // whole call, retries included.
  absl::StatusOr<std::int64_t> KeepAliveOnce(std::int64_t lease, std::uint32_t timeout_ms = 0);
  // Ends the lease now; its keys are deleted. A lease already gone is not an error.
  absl::Status RevokeLease(std::int64_t lease);
  // Seconds left (kNotFound when the lease is gone).
  absl::StatusOr<std::int64_t> LeaseTimeToLive(std::int64_t lease);

  // Watches [key, range_end) from `start_revision` (0: from now). The stream is opened
  // against the current endpoint; when it breaks, Next() says so and the caller re-creates
  // it from its last seen revision + 1.
  absl::StatusOr<std::unique_ptr<Watch>> NewWatch(const std::string& key,
                                                  const std::string& range_end = {},
                                                  std::int64_t start_revision = 0,
                                                  bool prev_kv = false);

  // The status of member `endpoint_index` (no failover: it asks that member).
  absl::StatusOr<MemberStatus> Status(std::size_t endpoint_index);

  const std::vector<std::string>& endpoints() const { return options_.endpoints; }
  // The endpoint the next call goes to first.
  std::size_t current_endpoint() const { return current_.load(); }

  struct Channels;  // the gRPC side (client.cc)

 private:
  explicit Client(const ClientOptions& options);

  ClientOptions options_;
  std::unique_ptr<Channels> ch_;
  std::atomic<std::size_t> current_{0};
};

// A watch stream. Events arrive on a reader thread and wait in a queue for Next().
class Watch {
 public:
  virtual ~Watch() = default;
  // The next events, in revision order, waiting up to `timeout` (an empty vector: none came).
  // Errors end the watch: kOutOfRange when start_revision was compacted away (the message
  // names the compact revision: read the state afresh and watch from there), kUnavailable
  // when the stream broke (the member died, the connection dropped), kCancelled when etcd
  // cancelled it.
  virtual absl::StatusOr<std::vector<Event>> Next(std::chrono::milliseconds timeout) = 0;
  // The revision of the newest event or progress seen (the header's), 0 before any.
  virtual std::int64_t last_revision() const = 0;
};

}  // namespace cxlkv::orchestrator::etcd

#endif  // CXLKV_ORCHESTRATOR_ETCD_H_
