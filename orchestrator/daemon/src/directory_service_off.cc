// The Directory RPC in a build without the etcd client: refused, saying why.
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "directory.grpc.pb.h"
#include "directory_service.h"

namespace cxlkv::orchestrator {

namespace {

namespace dpb = ::cxlkv::orchestrator::directory::v1;

class NoDirectory final : public dpb::Directory::Service {
 public:
  explicit NoDirectory(const Config& c) : name_(c.name) {}
  grpc::Status Where(grpc::ServerContext*, const dpb::WhereRequest*, dpb::WhereReply*) override {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("domain '", name_,
                     "': the prefix directory lives in etcd, and this cxlkv-orchestrator was "
                     "built without the etcd client: ask an orchestrator that runs with [etcd]"));
  }

 private:
  std::string name_;
};

}  // namespace

std::unique_ptr<grpc::Service> MakeDirectoryService(const Config& c,
                                                    std::function<std::string()> /*own_secret*/) {
  return std::make_unique<NoDirectory>(c);
}

}  // namespace cxlkv::orchestrator
