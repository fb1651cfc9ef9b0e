#include "directory_service.h"

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cxlkv/orchestrator/directory_reader.h"
#include "cxlkv/orchestrator/token.h"
#include "directory.grpc.pb.h"
#include "etcd_options.h"

namespace cxlkv::orchestrator {

namespace {

namespace dpb = ::cxlkv::orchestrator::directory::v1;

class DirectoryService final : public dpb::Directory::Service {
 public:
  DirectoryService(const Config& c, std::function<std::string()> own_secret)
      : c_(c), own_secret_(std::move(own_secret)) {}

  grpc::Status Where(grpc::ServerContext* ctx, const dpb::WhereRequest* req,
                     dpb::WhereReply* rep) override {
    if (grpc::Status st = Check(ctx); !st.ok()) return st;
    if (!c_.etcd.enabled()) return NoEtcd();
    directory::DirectoryReader* r = nullptr;
    // The domain's own key appears once its first owner created it: a reader opened before
    // (a standby of a new domain) is opened again with it.
    const std::string own = own_secret_();
    {
      absl::MutexLock l(&mu_);
      if (reader_ == nullptr || own != reader_own_) {
        directory::ReaderOptions o;
        o.client = EtcdClientOptions(c_.etcd);
        o.cluster = c_.etcd.cluster;
        // This domain's own publish secret and the other domains' (keys.directory_files):
        // keyed summaries under any other secret answer key_held = false.
        if (!own.empty()) o.publish_secrets.push_back(own);
        for (const std::string& s : c_.keys.directory_secrets) o.publish_secrets.push_back(s);
        auto opened = directory::DirectoryReader::Open(o);
        if (!opened.ok()) {
          return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              absl::StrCat("the prefix directory in etcd cannot be read: ",
                                           opened.status().message()));
        }
        reader_ = *std::move(opened);
        reader_own_ = own;
      }
      r = reader_.get();
    }
    const coherence::PrefixKey key{req->key_lo(), req->key_hi()};
    for (const directory::DomainAnswer& a : r->Where(key)) {
      dpb::DomainAnswer* d = rep->add_domains();
      d->set_domain(a.domain);
      d->set_may_hold(a.may_hold);
      d->set_anchor(a.anchor);
      d->set_published(a.published);
      d->set_fp_rate(a.fp_rate);
      d->set_epoch(a.epoch);
      d->set_age_ms(a.age_ms);
      d->set_filter_bytes(a.filter_bytes);
      d->set_keyed(a.keyed);
      d->set_key_held(a.key_held);
    }
    rep->set_revision(r->revision());
    return grpc::Status::OK;
  }

 private:
  grpc::Status NoEtcd() const {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("domain '", c_.name,
                     "': the prefix directory lives in etcd, and this orchestrator runs without "
                     "it (no [etcd] section): ask an "
                     "orchestrator that runs with [etcd], or read etcd directly (cxlkvctl where "
                     "--etcd HOST:PORT)"));
  }

  // As the main service's check (daemon.cc): TCP peers carry the token; Unix-socket peers
  // were admitted at accept.
  grpc::Status Check(grpc::ServerContext* ctx) const {
    const std::string peer = ctx->peer();
    if (absl::StartsWith(peer, "ipv4:") || absl::StartsWith(peer, "ipv6:")) {
      const auto& md = ctx->client_metadata();
      const auto it = md.find("authorization");
      if (it == md.end() ||
          !TokenMatches(absl::string_view(it->second.data(), it->second.size()), c_.token)) {
        return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                            absl::StrCat("peer ", peer, ": missing or wrong token"));
      }
      return grpc::Status::OK;
    }
    if (!absl::StartsWith(peer, "fd:")) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          absl::StrCat("peer ", peer, ": not a connection this daemon accepted"));
    }
    return grpc::Status::OK;
  }

  const Config& c_;
  const std::function<std::string()> own_secret_;
  absl::Mutex mu_;
  std::unique_ptr<directory::DirectoryReader> reader_ ABSL_GUARDED_BY(mu_);
  std::string reader_own_ ABSL_GUARDED_BY(mu_);  // the own secret reader_ was opened with
};

}  // namespace

std::unique_ptr<grpc::Service> MakeDirectoryService(const Config& c,
                                                    std::function<std::string()> own_secret) {
  return std::make_unique<DirectoryService>(c, std::move(own_secret));
}

}  // namespace cxlkv::orchestrator
