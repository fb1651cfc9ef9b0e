#include "domain_lock.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cxlkv/base/errno.h"
#include "cxlkv/pool/region.h"
#include "cxlkv/pool/spec.h"

namespace cxlkv::orchestrator {
namespace {

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// "value" of the line "name=value" in the lock file's text; "" when absent.
std::string Field(const std::string& text, absl::string_view name) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.size() > name.size() && line.substr(0, name.size()) == name &&
        line[name.size()] == '=') {
      return std::string(line.substr(name.size() + 1));
    }
  }
  return "";
}

// The processes holding an OFD lock on the inode `st` (from /proc/PID/fdinfo, which lists
// each descriptor's locks; /proc/locks gives no pid for OFD locks): "pid N (command line)",
// joined; "" when /proc does not tell (another user's process, or no /proc).
std::string OfdHolders(const struct stat& st) {
  char id[64];
  std::snprintf(id, sizeof(id), " %02x:%02x:%llu ", major(st.st_dev), minor(st.st_dev),
                static_cast<unsigned long long>(st.st_ino));
  std::string out;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return out;
  while (dirent* p = ::readdir(proc)) {
    const std::string pid = p->d_name;
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (pid == std::to_string(::getpid())) continue;
    const std::string fdinfo = absl::StrCat("/proc/", pid, "/fdinfo");
    DIR* fds = ::opendir(fdinfo.c_str());
    if (fds == nullptr) continue;
    bool holds = false;
    while (dirent* f = ::readdir(fds)) {
      if (f->d_name[0] == '.') continue;
      const std::string info = ReadText(absl::StrCat(fdinfo, "/", f->d_name));
      for (absl::string_view line : absl::StrSplit(info, '\n')) {
        if (line.find("OFDLCK") != absl::string_view::npos &&
            line.find(id) != absl::string_view::npos) {
          holds = true;
        }
      }
      if (holds) break;
    }
    ::closedir(fds);
    if (!holds) continue;
    std::string cmd = ReadText(absl::StrCat("/proc/", pid, "/cmdline"));
    for (char& c : cmd) {
      if (c == '\0') c = ' ';
    }
    while (!cmd.empty() && cmd.back() == ' ') cmd.pop_back();
    absl::StrAppend(&out, out.empty() ? "" : ", ", "pid ", pid, cmd.empty() ? "" : " (", cmd,
                    cmd.empty() ? "" : ")");
  }
  ::closedir(proc);
  return out;
}

}  // namespace

DomainLock::~DomainLock() {
  for (int fd : fds_) ::close(fd);
}

absl::StatusOr<std::unique_ptr<DomainLock>> DomainLock::Acquire(const Config& c) {
  std::unique_ptr<DomainLock> l(new DomainLock());
  l->path_ = c.state_file + ".lock";
  const int fd = ::open(l->path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    return absl::Status(
        err == ENOENT ? absl::StatusCode::kNotFound : absl::StatusCode::kPermissionDenied,
        absl::StrCat("domain.state_file ", c.state_file, ": cannot open its lock file ", l->path_,
                     ": ", base::ErrnoText(err),
                     err == ENOENT ? " (create the directory, or fix domain.state_file)"
                                   : " (run as the user that owns the state file's directory)"));
  }
  l->fds_.push_back(fd);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat("domain.state_file ", c.state_file,
                                                 ": cannot lock ", l->path_, ": ",
                                                 base::ErrnoText(err)));
    }
    const std::string text = ReadText(l->path_);
    const std::string pid = Field(text, "pid"), socket = Field(text, "socket");
    return absl::FailedPreconditionError(absl::StrCat(
        "domain '", c.name, "' is already served by another cxlkv-orchestrator",
        pid.empty() ? std::string(" (it has not recorded its pid yet)")
                    : absl::StrCat(": pid ", pid, ", rpc.socket ", socket),
        "; it holds the lock on ", l->path_,
        " (domain.state_file's). Nothing was started or changed. Use that one (cxlkvctl status "
        "--socket ",
        socket.empty() ? c.socket : socket, "), or stop it first (systemctl stop, or kill ",
        pid.empty() ? "its pid" : pid, ") if this start is meant to replace it"));
  }
  const std::string me =
      absl::StrCat("pid=", ::getpid(), "\nsocket=", c.socket, "\ndomain=", c.name, "\n");
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    return absl::UnavailableError(absl::StrCat("domain.state_file ", c.state_file,
                                               ": cannot write its lock file ", l->path_, ": ",
                                               base::ErrnoText(errno)));
  }
  return l;
}

absl::Status DomainLock::LockRegion(absl::string_view key, const std::string& spec_text,
                                    bool shared) {
  auto spec = pool::ParseSourceSpec(spec_text);
  if (!spec.ok()) return spec.status();
  if (spec->kind != pool::SourceKind::kFile && spec->kind != pool::SourceKind::kDevdax) {
    return absl::OkStatus();  // memfd, kmem: private to this process (tree)
  }
  const int fd = ::open(spec->path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    return absl::Status(base::ErrnoStatus(errno, spec->path, "open").code(),
                        absl::StrCat(key, " '", spec_text,
                                     "': cannot open it to lock it: ", base::ErrnoText(errno)));
  }
  fds_.push_back(fd);
  struct flock fl {};
  fl.l_type = shared ? F_RDLCK : F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = static_cast<off_t>(spec->offset);
  fl.l_len = static_cast<off_t>(spec->length);  // 0: to the end, however large it grows
  const struct flock want = fl;
  if (::fcntl(fd, F_OFD_SETLK, &fl) == 0) return absl::OkStatus();
  const int err = errno;
  if (err != EAGAIN && err != EACCES) {
    return absl::UnavailableError(
        absl::StrCat(key, " '", spec_text, "': cannot lock it (", base::ErrnoText(err), ")"));
  }
  struct stat st {};
  std::string holders;
  if (::fstat(fd, &st) == 0) holders = OfdHolders(st);
  const std::string who = holders.empty() ? std::string() : absl::StrCat(" (", holders, ")");
  if (shared) {
    // Only an exclusive lock refuses a shared one: a single orchestrator holds the memory.
    return absl::FailedPreconditionError(absl::StrCat(
        key, " '", spec_text,
        "' is owned by a single cxlkv-orchestrator (no [etcd]) on this machine", who,
        ": a domain has one owner, either that one alone or orchestrators elected through etcd. "
        "Nothing was started or changed. To move the domain to etcd, stop that one first (it "
        "marks the domain released) and give the first candidate its state file (docs/ha.md "
        "\"The first leader\"); if it is meant to keep the domain, do not start candidates for "
        "it"));
  }
  // Which kind holds it: shared locks are the candidates of an HA domain.
  struct flock held = want;
  held.l_pid = 0;
  if (::fcntl(fd, F_OFD_GETLK, &held) == 0 && held.l_type == F_RDLCK) {
    return absl::FailedPreconditionError(absl::StrCat(
        key, " '", spec_text,
        "' is in use by orchestrators elected through etcd on this machine (their config has "
        "an [etcd] section)",
        who,
        ": a single orchestrator beside them would be a second owner of the domain. Nothing "
        "was started or changed. Give this orchestrator the same [etcd] section (docs/ha.md) "
        "instead of running it as the domain's only one, or stop them first"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      key, " '", spec_text, "' is in use by another running orchestrator",
      holders.empty() ? std::string() : absl::StrCat(" (", holders, ")"),
      ": two orchestrators would own the same memory. Nothing was started or changed. If that "
      "one serves another domain, give this domain its own ",
      key, "; if it serves this one, use it or stop it first"));
}

}  // namespace cxlkv::orchestrator
