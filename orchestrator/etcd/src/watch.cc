// A watch stream: a reader thread moves etcd's watch responses into a queue for Next().
#include <grpcpp/grpcpp.h>

#include <deque>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "channels.h"

namespace cxlkv::orchestrator::etcd {

namespace {

class WatchStream final : public Watch {
 public:
  explicit WatchStream(const Client::Channels::Member& m) : endpoint_(m.endpoint), stub_(*m.watch) {
    ctx_.set_wait_for_ready(true);  // see CallMembers (client.cc)
    m.Authorize(&ctx_);
  }

  ~WatchStream() override {
    // Ends the stream; the reader's Read returns false and the thread ends.
    ctx_.TryCancel();
    if (reader_.joinable()) reader_.join();
  }

  // Starts the reader, which sends the create request (a write can block while the
  // connection is being made), and waits for etcd's confirmation.
  absl::Status Start(const pb::WatchCreateRequest& create, std::chrono::milliseconds wait) {
    reader_ = std::thread([this, create] { ReadLoop(create); });
    absl::MutexLock l(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return created_ || !error_.ok(); };
    mu_.AwaitWithTimeout(absl::Condition(&ready), absl::FromChrono(wait));
    if (!error_.ok()) return error_;
    if (!created_) {
      return absl::DeadlineExceededError(
          absl::StrCat("etcd ", endpoint_, ": Watch: not confirmed within ", wait.count(), " ms"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<Event>> Next(std::chrono::milliseconds timeout) override {
    absl::MutexLock l(&mu_);
    auto ready = [this]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || !error_.ok(); };
    mu_.AwaitWithTimeout(absl::Condition(&ready), absl::FromChrono(timeout));
    if (!queue_.empty()) {
      std::vector<Event> out(std::make_move_iterator(queue_.begin()),
                             std::make_move_iterator(queue_.end()));
      queue_.clear();
      return out;
    }
    if (!error_.ok()) return error_;
    return std::vector<Event>{};
  }

  std::int64_t last_revision() const override {
    absl::MutexLock l(&mu_);
    return last_revision_;
  }

 private:
  void ReadLoop(const pb::WatchCreateRequest& create) {
    // Made here, not in Start: starting the call can wait for a connection (a member that
    // accepts TCP but does not answer), and the destructor's TryCancel ends that wait.
    stream_ = stub_.Watch(&ctx_);
    pb::WatchRequest req;
    *req.mutable_create_request() = create;
    pb::WatchResponse rep;
    const bool sent = stream_->Write(req);
    while (sent && stream_->Read(&rep)) {
      absl::MutexLock l(&mu_);
      if (rep.created()) created_ = true;
      if (rep.canceled()) {
        if (rep.compact_revision() > 0) {
          error_ = absl::OutOfRangeError(
              absl::StrCat("etcd ", endpoint_, ": Watch: revision compacted away (oldest kept: ",
                           rep.compact_revision(), "); read afresh and watch from there"));
        } else {
          error_ = absl::CancelledError(
              absl::StrCat("etcd ", endpoint_, ": Watch cancelled: ", rep.cancel_reason()));
        }
        break;
      }
      for (const auto& e : rep.events()) {
        Event ev;
        ev.type = e.type() == ::mvccpb::Event::DELETE ? Event::Type::kDelete : Event::Type::kPut;
        ev.kv = FromPb(e.kv());
        if (e.has_prev_kv()) ev.prev_kv = FromPb(e.prev_kv());
        queue_.push_back(std::move(ev));
      }
      last_revision_ = std::max(last_revision_, rep.header().revision());
    }
    const grpc::Status st = stream_->Finish();
    absl::MutexLock l(&mu_);
    if (error_.ok()) {
      error_ = absl::UnavailableError(
          absl::StrCat("etcd ", endpoint_, ": Watch stream ended: ",
                       st.ok() ? std::string("closed by the server") : st.error_message()));
    }
  }

  const std::string endpoint_;
  pb::Watch::Stub& stub_;
  grpc::ClientContext ctx_;
  // The reader thread's only.
  std::unique_ptr<grpc::ClientReaderWriter<pb::WatchRequest, pb::WatchResponse>> stream_;
  std::thread reader_;
  mutable absl::Mutex mu_;
  bool created_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::deque<Event> queue_ ABSL_GUARDED_BY(mu_);
  std::int64_t last_revision_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Watch>> OpenWatch(const Client::Channels::Member& member,
                                                 const pb::WatchCreateRequest& create,
                                                 std::chrono::milliseconds wait) {
  auto w = std::make_unique<WatchStream>(member);
  if (auto st = w->Start(create, wait); !st.ok()) return st;
  return w;
}

}  // namespace cxlkv::orchestrator::etcd
