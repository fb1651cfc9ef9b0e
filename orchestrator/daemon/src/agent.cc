// The write-back agent: a forked child that releases its orchestrator's term when the
// orchestrator cannot (agent.h).
#include "agent.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cxlkv/base/errno.h"
#include "cxlkv/coherence/domain_layout.h"
#include "cxlkv/coherence/mem.h"
#include "cxlkv/pool/region.h"
#include "fence.h"

namespace cxlkv::orchestrator {

namespace co = ::cxlkv::coherence;

namespace {

std::int64_t BootMs() {
  timespec ts{};
  ::clock_gettime(CLOCK_BOOTTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// The child writes its log lines with write(2) and formats numbers by hand: it was forked
// from a process that may have threads by the time it logs, so no allocator and no stdio.
struct Line {
  char buf[512];
  std::size_t n = 0;
  Line& S(const char* s) {
    while (*s != '\0' && n < sizeof(buf) - 1) buf[n++] = *s++;
    return *this;
  }
  Line& N(std::int64_t v) {
    char d[24];
    int k = 0;
    const bool neg = v < 0;
    std::uint64_t u =
        neg ? static_cast<std::uint64_t>(-(v + 1)) + 1 : static_cast<std::uint64_t>(v);
    do {
      d[k++] = static_cast<char>('0' + u % 10);
      u /= 10;
    } while (u != 0);
    if (neg) S("-");
    while (k > 0 && n < sizeof(buf) - 1) buf[n++] = d[--k];
    return *this;
  }
  void Emit() {
    buf[n++] = '\n';
    (void)!::write(2, buf, n);
  }
};

// Whether `pid` is stopped (SIGSTOP, a tracer, the freezer): state T or t in /proc/pid/stat.
bool Stopped(pid_t pid) {
  char path[64];
  Line p;
  p.S("/proc/").N(pid).S("/stat");
  std::memcpy(path, p.buf, p.n);
  path[p.n] = '\0';
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char stat[512];
  const ssize_t got = ::read(fd, stat, sizeof(stat) - 1);
  ::close(fd);
  if (got <= 0) return false;
  stat[got] = '\0';
  // "pid (comm) S ...": comm may hold anything, so the state follows the last ')'.
  const char* close_paren = std::strrchr(stat, ')');
  if (close_paren == nullptr || close_paren[1] != ' ') return false;
  return close_paren[2] == 'T' || close_paren[2] == 't';
}

[[noreturn]] void RunAgent(WriteBackAgent::Page* page, std::byte* domain, std::uint64_t len,
                           pid_t parent, std::int64_t kill_after_ms) {
  co::DirectMem mem(domain, len);
  bool killed = false;
  while (page->stop.load() == 0) {
    const std::int64_t claimed = page->claimed.load();
    const bool holds = claimed != 0 && claimed != page->released.load();
    if (::getppid() != parent) {
      // The orchestrator is gone (this process was handed to another parent when it exited).
      if (holds) {
        co::OwnerReleaseLine r{};
        r.epoch = static_cast<std::uint64_t>(claimed);
        r.cluster_id = page->cluster_id.load();
        r.at_ms = BootMs();
        r.by = co::kReleasedByAgent;
        r.node = page->node.load();
        ReleaseTerm(mem, len, r);
        Line()
            .S("cxlkv-orchestrator: write-back agent: orchestrator pid ")
            .N(parent)
            .S(killed ? " ended by its agent" : " exited")
            .S(" while it held epoch ")
            .N(claimed)
            .S("; the domain was written back from this machine and epoch ")
            .N(claimed)
            .S(" released")
            .Emit();
      }
      ::_exit(0);
    }
    const std::int64_t deadline = page->deadline_boot_ms.load();
    if (holds && deadline != 0 && !killed) {
      const std::int64_t now = BootMs();
      if ((now > deadline && Stopped(parent)) || now > deadline + kill_after_ms) {
        Line()
            .S("cxlkv-orchestrator: write-back agent: orchestrator pid ")
            .N(parent)
            .S(" holds epoch ")
            .N(claimed)
            .S(now > deadline + kill_after_ms ? " far past" : " stopped past")
            .S(" its write deadline (")
            .N(now - deadline)
            .S(" ms): ending it so that it cannot resume inside a store")
            .Emit();
        ::kill(parent, SIGKILL);
        killed = true;
      }
    }
    timespec pause{0, 5'000'000};
    ::nanosleep(&pause, nullptr);
  }
  ::_exit(0);
}

}  // namespace

absl::StatusOr<std::unique_ptr<WriteBackAgent>> WriteBackAgent::Start(std::byte* domain,
                                                                      std::uint64_t len,
                                                                      std::int64_t kill_after_ms) {
  void* p =
      ::mmap(nullptr, sizeof(Page), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("write-back agent: mmap of its shared page: ", base::ErrnoText(errno)));
  }
  std::unique_ptr<WriteBackAgent> a(new WriteBackAgent());
  a->page_ = new (p) Page();
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::munmap(p, sizeof(Page));
    a->page_ = nullptr;
    return absl::ResourceExhaustedError(
        absl::StrCat("write-back agent: fork: ", base::ErrnoText(errno)));
  }
  if (pid == 0) RunAgent(a->page_, domain, len, parent, kill_after_ms);
  a->pid_ = pid;
  return a;
}

WriteBackAgent::~WriteBackAgent() {
  if (page_ == nullptr) return;
  page_->stop.store(1);
  if (pid_ > 0) {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
  ::munmap(page_, sizeof(Page));
}

void WriteBackAgent::Claimed(std::int64_t epoch, std::uint64_t cluster_id, std::uint32_t node) {
  page_->cluster_id.store(cluster_id);
  page_->node.store(node);
  page_->deadline_boot_ms.store(0);
  page_->claimed.store(epoch);
}

void WriteBackAgent::Deadline(std::int64_t boot_ms) { page_->deadline_boot_ms.store(boot_ms); }

void WriteBackAgent::Released(std::int64_t epoch) {
  page_->released.store(epoch);
  page_->deadline_boot_ms.store(0);
}

}  // namespace cxlkv::orchestrator
