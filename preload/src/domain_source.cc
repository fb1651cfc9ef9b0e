// DomainSource: libcxlkv.so's pooled-capacity calls, loaded at run time.
#include "domain_source.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace cxlkv::preload {

// The few C API entry points the heap needs (cxlkv.h; declared here so the shim needs only
// the library at run time, not at link time).
struct DomainSource::Fns {
  int (*join)(const char*, std::uint32_t, void**);
  void (*leave)(void*);
  int (*grow_extent)(void*, void (*)(void*, std::uint32_t), void*, std::uint32_t*,
                     std::uint64_t*, char*, std::size_t);
  int (*shrink_extent)(void*, std::uint32_t);
  const char* (*last_error)();
};

namespace {

// libcxlkv.so.0 in the directory the shim was loaded from, if there is one.
std::string BesideTheShim() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&BesideTheShim), &info) == 0 || info.dli_fname == nullptr) {
    return "";
  }
  std::string path = info.dli_fname;
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return "";
  path = path.substr(0, slash + 1) + "libcxlkv.so.0";
  return ::access(path.c_str(), R_OK) == 0 ? path : "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<DomainSource>> DomainSource::Load(const std::string& library,
                                                                 const std::string& socket,
                                                                 std::uint32_t host_id) {
  std::unique_ptr<DomainSource> s(new DomainSource());
  s->socket_ = socket;
  s->host_id_ = host_id;
  s->library_ = library;
  if (s->library_.empty()) s->library_ = BesideTheShim();
  if (s->library_.empty()) s->library_ = "libcxlkv.so.0";
  s->handle_ = ::dlopen(s->library_.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (s->handle_ == nullptr) {
    const char* why = ::dlerror();
    return absl::NotFoundError(absl::StrCat(
        "CXLKV_POOL=orchestrator:", socket, ": cannot load ", s->library_, " (",
        why != nullptr ? why : "?",
        "); install libcxlkv or point CXLKV_LIBRARY at libcxlkv.so.0"));
  }
  auto fns = std::make_unique<Fns>();
  struct Sym {
    const char* name;
    void** slot;
  };
  const Sym syms[] = {{"cxlkv_domain_join", reinterpret_cast<void**>(&fns->join)},
                      {"cxlkv_domain_leave", reinterpret_cast<void**>(&fns->leave)},
                      {"cxlkv_domain_grow_extent", reinterpret_cast<void**>(&fns->grow_extent)},
                      {"cxlkv_domain_shrink_extent", reinterpret_cast<void**>(&fns->shrink_extent)},
                      {"cxlkv_last_error", reinterpret_cast<void**>(&fns->last_error)}};
  for (const Sym& sym : syms) {
    *sym.slot = ::dlsym(s->handle_, sym.name);
    if (*sym.slot == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          s->library_, " has no ", sym.name, "; it is older than this shim — use the libcxlkv "
          "built with it (CXLKV_LIBRARY)"));
    }
  }
  s->fns_ = std::move(fns);
  return s;
}

DomainSource::~DomainSource() { Leave(); }  // the library stays loaded (threads of its own)

absl::Status DomainSource::JoinLocked() {
  const std::string spec = absl::StrCat("orchestrator:", socket_);
  void* d = nullptr;
  if (int rc = fns_->join(spec.c_str(), host_id_, &d); rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot join the domain at ", spec, " as host ",
                                               host_id_, ": ", fns_->last_error()));
  }
  domain_ = d;
  return absl::OkStatus();
}

absl::StatusOr<ExtentSource::Extent> DomainSource::Grow(void (*revoke)(void*, std::uint32_t),
                                                        void* ctx) {
  pthread_mutex_lock(&mu_);
  absl::Status st;
  if (left_) {
    st = absl::FailedPreconditionError("the process left the domain (exiting)");
  } else if (domain_ == nullptr) {
    st = JoinLocked();
  }
  Extent e;
  if (st.ok()) {
    char spec[1024];
    std::uint64_t length = 0;
    if (int rc = fns_->grow_extent(domain_, revoke, ctx, &e.index, &length, spec, sizeof(spec));
        rc != 0) {
      st = absl::ResourceExhaustedError(absl::StrCat("orchestrator:", socket_, " (host ",
                                                     host_id_, "): no extent: ",
                                                     fns_->last_error()));
    } else {
      e.length = length;
      e.spec = spec;
    }
  }
  pthread_mutex_unlock(&mu_);
  if (!st.ok()) return st;
  return e;
}

void DomainSource::Shrink(std::uint32_t extent) {
  pthread_mutex_lock(&mu_);
  if (domain_ != nullptr) (void)fns_->shrink_extent(domain_, extent);
  pthread_mutex_unlock(&mu_);
}

void DomainSource::Leave() {
  pthread_mutex_lock(&mu_);
  left_ = true;
  void* d = domain_;
  domain_ = nullptr;
  pthread_mutex_unlock(&mu_);
  if (d != nullptr) fns_->leave(d);
}

std::string DomainSource::Describe() const {
  return absl::StrCat("orchestrator:", socket_, " (host ", host_id_, ")");
}

}  // namespace cxlkv::preload
